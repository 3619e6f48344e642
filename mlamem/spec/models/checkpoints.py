"""Published checkpoint sizes against mlamem's count: the records of checkpoints.json.

Each record names a Hub checkpoint, the shipped config that describes it (with its own
`quantization_config` where the checkpoint is a quantization of a shipped model), whether it holds
the MTP layers, a published figure (`published`: bytes, or the Hub's parameter count where `unit`
is "parameters"; `what` says what it is, `source` where it comes from) and mlamem's count
(`counted`). `python scripts/checkpoint_sizes.py` prints the table; `--write` recounts `counted`.
tests/test_quantized_weights.py holds each within 1%.
"""

from __future__ import annotations

import json
from dataclasses import replace
from importlib import resources

from mlamem.spec.models.hf_config import shipped_config
from mlamem.spec.models.quantization import parse_quantization
from mlamem.spec.models.weights import count_weights

FILE = "checkpoints.json"


def records() -> list[dict]:
    return json.loads(resources.files("mlamem.spec.models").joinpath(FILE).read_text())


def count(record: dict) -> int:
    """mlamem's count for the record's checkpoint, in the record's unit (bytes, or the Hub's
    parameters where `unit` says so): its shipped config, with the record's quantization_config
    where it gives one, the MTP layers where the checkpoint holds them."""
    config = shipped_config(record["config"])
    if "quantization_config" in record:
        config = replace(config, quantization=parse_quantization(record["quantization_config"]))
    weights = count_weights(config)
    measure = weights.elements if record.get("unit") == "parameters" else weights.bytes
    return measure() + (measure(mtp=True) if record["mtp"] else 0)


def recounted(items: list[dict]) -> list[dict]:
    return [{**record, "counted": count(record)} for record in items]


def table(items: list[dict]) -> str:
    """The records as a Markdown table: repo, quantization, published bytes, counted bytes, difference."""
    lines = ["| checkpoint | quantization | published | mlamem's count | difference |",
             "|---|---|---:|---:|---:|"]
    for r in items:
        published, counted, unit = r["published"], r["counted"], r.get("unit", "bytes")
        lines.append(f"| `{r['repo']}` | {r['quantization']} | {published:,} {unit} | {counted:,} | "
                     f"{counted - published:+,} ({(counted - published) / published:+.3%}) |")
    return "\n".join(lines)
