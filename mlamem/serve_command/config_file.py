"""The YAML file a serve command's `--config` names, read the one way all three engines' parsers
read it: through `mlamem.files.read_text` (a missing, unreadable or non-UTF-8 file is one line),
with pyyaml's safe loader, imported only here and only when a command names a file. What the
file holds is each engine's to judge (vllm.py, sglang.py, trtllm.py)."""

from __future__ import annotations

from pathlib import Path

from mlamem.errors import UserError
from mlamem.files import read_text


def load(path: Path):
    """The file's YAML document (None for an empty one); anything YAML cannot read, a date it
    cannot build (2001-02-30) or nesting too deep for it, one line naming the file."""
    import yaml  # only where a config file is read

    try:
        return yaml.safe_load(read_text(path, "YAML config file", "serve"))
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise UserError(f"{path}: not YAML ({first})", field="serve") from None


def key_error(path: Path, key, engine: str) -> UserError:
    """A key that is no name (a number, a list, null), as one line."""
    return UserError(f"{path}: the key {key!r} is not a name; a {engine} config file's keys "
                     "are option names", field="serve")


def as_json(path: Path, key: str, value: dict) -> str:
    """A table's JSON, as the engines pass a table to their flag; a value JSON has no form for
    (a date), one line."""
    import json

    try:
        return json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise UserError(f"{path}: {key}: {exc}; write the table with numbers, strings, booleans, "
                        "lists and tables", field="serve") from None
