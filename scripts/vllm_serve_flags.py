"""Write vLLM's `vllm serve` flag table (mlamem/spec/engines/vllm-0.33.0-flags.json) from the
wheel's own sources, read as text with ast (vLLM is not imported):

- vllm/engine/arg_utils.py: every `add_argument` call of EngineArgs.add_cli_args (its names and
  aliases; an explicit action), the field's annotation in the EngineArgs dataclass deciding the
  kind as get_kwargs does (bool: --x/--no-x; bool | str | None: an optional value; list/tuple:
  one or more values; else one value);
- vllm/entrypoints/common/cli_args.py: make_arg_parser's own flags and the FrontendArgs fields.

Usage: python scripts/vllm_serve_flags.py /work/wheels/vllm-0.33.0-*.whl
"""

from __future__ import annotations

import ast
import json
import sys
import zipfile
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "mlamem" / "spec" / "engines" / "vllm-0.33.0-flags.json"


def fields(tree: ast.Module, classes: tuple[str, ...]) -> dict[str, str]:
    """Annotated fields of the named classes, as source text."""
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name in classes:
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    found[item.target.id] = ast.unparse(item.annotation)
    return found


def kind_of(annotation: str) -> str:
    """How get_kwargs (arg_utils.py) turns a field's type into argparse's kwargs."""
    parts = {p.strip() for p in annotation.split("|")}
    if parts == {"bool", "str", "None"}:
        return "optional"
    if "bool" in parts:
        return "bool"
    if annotation.startswith(("list[", "tuple[")) or " list[" in annotation:
        return "list"
    return "value"


def calls(tree: ast.Module, annotations: dict[str, str]) -> dict[str, dict]:
    """Each add_argument call's names, its kind and its field."""
    table = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):
            continue
        names = [a.value for a in node.args if isinstance(a, ast.Constant)
                 and isinstance(a.value, str) and a.value.startswith("-")]
        if not names:
            continue
        field = next((s.slice.value for k in node.keywords if k.arg is None
                      for s in ast.walk(k.value) if isinstance(s, ast.Subscript)
                      and isinstance(s.slice, ast.Constant)), None)
        action = next((ast.unparse(k.value) for k in node.keywords if k.arg == "action"), "")
        nargs = next((ast.unparse(k.value) for k in node.keywords if k.arg == "nargs"), "")
        if "store_true" in action:
            kind = "flag"
        elif "BooleanOptionalAction" in action:
            kind = "bool"
        elif nargs in ("'+'", "'*'"):
            kind = "list"
        elif field is not None and field in annotations:
            kind = kind_of(annotations[field])
        else:
            kind = "value"
        long = next(n for n in names if n.startswith("--")) if any(
            n.startswith("--") for n in names) else names[0]
        table[long] = {"aliases": [n for n in names if n != long], "kind": kind}
    return table


def main(wheel: str) -> None:
    with zipfile.ZipFile(wheel) as zf:
        engine = ast.parse(zf.read("vllm/engine/arg_utils.py").decode())
        frontend = ast.parse(zf.read("vllm/entrypoints/common/cli_args.py").decode())
    table = calls(engine, fields(engine, ("EngineArgs",)))
    table |= calls(frontend, {})
    for name, annotation in fields(frontend, ("BaseFrontendArgs", "FrontendArgs")).items():
        table.setdefault("--" + name.replace("_", "-"), {"aliases": [], "kind": kind_of(annotation)})
    data = {"_source": f"vLLM 0.33.0's `vllm serve` parser, read from {Path(wheel).name} by "
                       "scripts/vllm_serve_flags.py: engine/arg_utils.py EngineArgs.add_cli_args "
                       "and entrypoints/common/cli_args.py make_arg_parser, FrontendArgs",
            "flags": dict(sorted(table.items()))}
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    print(f"{OUT}: {len(table)} flags")


if __name__ == "__main__":
    main(sys.argv[1])
