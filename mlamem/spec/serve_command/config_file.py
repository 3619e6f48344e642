"""The YAML file a serve command's `--config` names, read the one way all three engines' parsers
read it: through `mlamem.spec.files.read_text` (a missing, unreadable or non-UTF-8 file is one line),
with pyyaml's safe loader, imported only here and only when a command names a file. What the
file holds is each engine's to judge (vllm.py, sglang.py, trtllm.py)."""

from __future__ import annotations

from pathlib import Path

from mlamem.spec.errors import UserError
from mlamem.spec.files import read_text

# A config file sets options: none of the engines has 1024 flags (vLLM 0.33.0 344 names, SGLang
# 0.5.23 531), and argparse's option loop takes time growing with the square of the options it
# reads, so more top-level keys than this are refused as read. Aliases may share a table, but
# what they expand to stays under MAX_NODES (a few hundred bytes of aliases can expand to
# gigabytes once a command's words are made of them).
MAX_KEYS = 1024
MAX_NODES = 100_000


def load(path: Path):
    """The file's YAML document (None for an empty one); anything YAML cannot read, a date it
    cannot build (2001-02-30), nesting too deep for it, aliases expanding past MAX_NODES or more
    than MAX_KEYS top-level keys, one line naming the file."""
    import yaml  # only where a config file is read

    text = read_text(path, "YAML config file", "serve")
    try:
        return _bounded_load(path, yaml.SafeLoader, text)
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise UserError(f"{path}: not YAML ({first})", field="serve") from None


def _bounded_load(path: Path, loader_class, text: str):
    """The document composed, its size checked (`_check_size`), then built."""
    loader = loader_class(text)  # reads the stream: a character YAML refuses is a YAMLError
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_size(path, node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _check_size(path: Path, root) -> None:
    """Refuse a document whose nodes, each alias counted as what it names, pass MAX_NODES (a
    node inside itself counts without end), or whose top-level table has over MAX_KEYS keys."""
    if root.id == "mapping" and len(root.value) > MAX_KEYS:
        raise UserError(f"{path}: {len(root.value)} keys, more options than any engine has "
                        f"flags (at most {MAX_KEYS} read); give the options the command sets",
                        field="serve")
    sizes: dict[int, int] = {}  # id(node) -> its nodes, aliases expanded; -1 while counting
    if _expanded(root, sizes) > MAX_NODES:
        raise UserError(f"{path}: more than {MAX_NODES} values, aliases expanded; write the "
                        "options out (a config file sets a few hundred at most)", field="serve")


def _expanded(node, sizes: dict[int, int]) -> int:
    """The node's size with aliases expanded (one per scalar, one per collection), counted once
    per node; past MAX_NODES + 1 the count stops."""
    known = sizes.get(id(node))
    if known is not None:
        return MAX_NODES + 1 if known < 0 else known  # < 0: a node inside itself
    if not isinstance(node.value, list):
        return 1
    sizes[id(node)] = -1
    children = (n for pair in node.value for n in pair) if node.id == "mapping" else node.value
    total = 1
    for child in children:
        total += _expanded(child, sizes)
        if total > MAX_NODES:
            break
    sizes[id(node)] = min(total, MAX_NODES + 1)
    return sizes[id(node)]


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
