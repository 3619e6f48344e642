"""Predict each public startup log of reports/field/startup-logs.toml from its command alone and
write the comparison table, reports/field/startup-logs.md.

For each record, with the command's own scenario (`mlamem scenarios --serve COMMAND --gpu GPU`,
the model's shipped config, its weights counted):
- the KV cache's bytes per token on one rank, mlamem's vLLM rule
  (spec.engines.vllm.kv_bytes_per_token_per_layer x layers), against the logged GiB / tokens
  (the GiB figure is rounded to 0.01, so the logged figure is a range);
- the KV tokens `mlamem repro-oom --serve COMMAND --gpu GPU --predict` gives (alloc path), and
  the pool `mlamem plan --serve ...` gives without a reserve, against the logged tokens;
- the indexer cache's row width (bytes per token per layer), where a log shows the cache's shape.

Usage: python scripts/field_startup_logs.py  (writes reports/field/startup-logs.md)
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

from mlamem.spec.engines import vllm as rules
from mlamem.spec.engines.dsa_cache import indexer_key_bytes
from mlamem.spec.serve_command import from_command

FIELD = Path(__file__).resolve().parents[1] / "reports" / "field"
GiB = 1024**3


def mlamem(*args: str) -> dict:
    """One mlamem command's JSON result (its notes go to stderr)."""
    done = subprocess.run([sys.executable, "-m", "mlamem", *args, "--format", "json"],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def percent(predicted: float, logged: float) -> str:
    return f"{100 * (predicted - logged) / logged:+.2f}%"


def per_token_cells(record: dict, scenario) -> list[str]:
    """Bytes per token: mlamem's, and the logged range (GiB rounded to 0.01)."""
    ours = scenario.model.num_layers * rules.kv_bytes_per_token_per_layer(scenario)
    if "logged_tokens" not in record:
        return [str(ours), "-", "-"]
    low = (record["logged_gib"] - 0.005) * GiB / record["logged_tokens"]
    high = (record["logged_gib"] + 0.005) * GiB / record["logged_tokens"]
    inside = "within" if low <= ours <= high else percent(ours, (low + high) / 2)
    return [str(ours), f"{low:,.0f}-{high:,.0f}", inside]


def tokens_cells(record: dict, command: str, gpu: str) -> list[str]:
    """repro-oom's predicted KV tokens (alloc path) and plan's pool, against the log's."""
    if "logged_tokens" not in record:
        return ["-", "-", "-"]
    repro = mlamem("repro-oom", "--serve", command, "--gpu", gpu, "--predict", "--paths", "alloc")
    plan = mlamem("plan", "--serve", command, "--gpu", gpu)
    tokens = repro["cases"][0]["kv_cache_tokens"]
    pool = plan["plans"][0]["pool_tokens_without_reserve"]
    return [f"{tokens:,}", f"{pool:,}", percent(tokens, record["logged_tokens"])]


def row(record: dict) -> str:
    built = from_command(record["command"], gpu_name=record["gpu"])
    indexer = (f"{indexer_key_bytes(built.scenario.section('vllm').index_head_dim or 128)} / "
               f"{record['logged_indexer_row_bytes']}" if "logged_indexer_row_bytes" in record
               else "-")
    logged = (f"{record['logged_tokens']:,} tokens, {record['logged_gib']} GiB"
              if "logged_tokens" in record else record["quote"].split("INFO: ")[-1])
    cells = [record["name"], f"{record['engine']} {record['version']}", record["model"],
             f"`{record['command']}`" + ("" if record.get("command_complete", True)
                                          else " (partial)"),
             logged, *per_token_cells(record, built.scenario), indexer,
             *tokens_cells(record, record["command"], record["gpu"]),
             record.get("rest", ""), f"[source]({record['address'].split()[0]})"]
    return "| " + " | ".join(cells) + " |"


HEADER = ("| record | engine | model | command | logged | B/token (mlamem) | B/token (log) | "
          "B/token | indexer B/token/layer (mlamem / log) | KV tokens (repro-oom --predict) | "
          "pool tokens (plan) | KV tokens vs log | what accounts for the rest | address |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def main() -> None:
    records = tomllib.loads((FIELD / "startup-logs.toml").read_text())["log"]
    lines = ["# Public startup logs against mlamem's prediction", "",
             "Written by `python scripts/field_startup_logs.py` from startup-logs.toml; each "
             "prediction from the record's command alone (`mlamem repro-oom --serve COMMAND --gpu "
             "GPU --predict`, `mlamem plan --serve ...`), at mlamem's default vLLM 0.33.0.", "",
             HEADER, *map(row, records), ""]
    (FIELD / "startup-logs.md").write_text("\n".join(lines))
    print(f"{FIELD / 'startup-logs.md'}: {len(records)} records")


if __name__ == "__main__":
    main()
