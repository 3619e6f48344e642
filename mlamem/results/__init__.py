"""The result files mlamem writes and reads, as pydantic models (spec layer).

This package's root imports no pydantic: `read` and `model_for` load `mlamem.results.models`
only when a file is read or written, so `mlamem --help`, `mlamem scenarios` and the pytest
plugin never pay for it. `python -m mlamem.results --write-schemas` regenerates the JSON Schema
files in docs/schemas/ from the models; `--check` fails when a committed one differs.
"""

from __future__ import annotations

from typing import Any

from mlamem.results.legacy import LEGACY_KERNEL_FIELDS

__all__ = ["CSV", "LEGACY_KERNEL_FIELDS", "MODELS", "model_for", "parse", "read"]

# Schema name -> the model's class name in mlamem.results.models.
MODELS = {
    "mlamem.profile/1": "ProfileFile",
    "mlamem.repro-oom/1": "ReproFile",
    "mlamem.graphs/1": "GraphsFile",
    "mlamem.validate/1": "ValidateFile",
    "mlamem.compare/1": "CompareFile",
    "mlamem.baseline/1": "BaselineFile",
    "mlamem.plan/1": "PlanFile",
    "mlamem.bench/2": "BenchFile",
    "mlamem.kernels/1": "KernelsFile",
    "mlamem.explain/1": "ExplainFile",
    "mlamem.diff/1": "DiffFile",
}


# The CSV files: per schema, (what one line is, the model whose fields are the columns, the
# columns; None: all of its fields, in order).
CSV = {
    "mlamem.profile/1": ("(swept value, path)", "ProfileRow", None),
    "mlamem.graphs/1": ("capture of one path", "Capture", (
        "path", "tokens", "peak_allocated_bytes", "peak_reserved_bytes", "pool_growth_bytes",
        "held_bytes", "device_growth_bytes", "replay_equal", "failure")),
}


def model_for(schema: str) -> Any:
    """The model class of `schema` (a KeyError if mlamem has none)."""
    from mlamem.results import models

    return getattr(models, MODELS[schema])


def read(data: dict, schema: str) -> dict:
    """`data`, a file's JSON object, migrated to the current version of `schema` and checked
    against its model: the migrated plain data (the values exactly as read). A ValueError with
    one line, `FIELD: what is wrong`, when it does not match."""
    from mlamem.results.base import check

    return check(model_for(schema), data)


def parse(data: dict, schema: str) -> Any:
    """`data`, a file's JSON object, migrated and checked as `read` does: its model (e.g. a
    `ProfileFile` for `mlamem.profile/1`)."""
    return model_for(schema).parse(data)
