"""Write SGLang's `python -m sglang.launch_server` flag table
(mlamem/spec/engines/sglang-0.5.23-flags.json) from the wheel's own sources, read as text with
ast (SGLang is not imported):

- sglang/srt/server_args.py: the namespace classes `_INPUT_NAMESPACES` lists (each declared in
  sglang/srt/arg_groups/fields/), and ServerArgs.add_cli_args' own add_argument calls (dynamic
  choices, --config, the deprecated flags);
- sglang/srt/arg_groups/fields/*.py: each field annotated `A[T, "help"]` or `A[T, Arg(...)]`
  becomes a flag as arg_utils.add_cli_args_from_dataclass makes it: `--field-name` (or
  Arg.cli_name) with Arg.aliases, skipped with no_cli; an explicit action, else by the type
  (Literal: a value with its choices; list[...]: nargs "+" or Arg.nargs; bool: store_true;
  else one value, Arg.nargs kept).

prepare_server_args builds a plain argparse.ArgumentParser, so abbreviations are allowed.
Choices held in names (ATTENTION_BACKEND_CHOICES, ...) are not evaluated: those flags take any
value here. Checked on 2026-12-04 against the wheel's own parser (ServerArgs.add_cli_args
imported with its dependencies in a scratch folder): the same 531 options, aliases, kinds and
nargs, and the same parse of a command with abbreviations, `--x=y`, 32Ki and 25.6k.

Usage: python scripts/sglang_serve_flags.py /work/wheels/sglang-0.5.23-*.whl
"""

from __future__ import annotations

import ast
import json
import sys
import zipfile
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "mlamem" / "spec" / "engines" / "sglang-0.5.23-flags.json"
FIELDS = "sglang/srt/arg_groups/fields/"


def _constant(node: ast.AST):
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None


def _is_help(node: ast.AST) -> bool:
    """A bare help string: a constant, an f-string or a sum of strings."""
    return (isinstance(node, ast.Constant) and isinstance(node.value, str)) or isinstance(
        node, (ast.JoinedStr, ast.BinOp))


def _arg_meta(annotation: ast.AST) -> dict | None:
    """The Arg(...) keywords of `A[T, ...]` (a bare string: none), None without one."""
    if not (isinstance(annotation, ast.Subscript) and ast.unparse(annotation.value) in (
            "A", "Annotated") and isinstance(annotation.slice, ast.Tuple)):
        return None
    for item in annotation.slice.elts[1:]:
        if isinstance(item, ast.Call) and ast.unparse(item.func) == "Arg":
            return {k.arg: k.value for k in item.keywords}
        if _is_help(item):
            return {}
    return None


def _kind(inner: str, meta: dict) -> tuple[str, str | None, list | None]:
    """(kind, nargs, choices) as add_cli_args_from_dataclass decides them."""
    choices = _constant(meta["choices"]) if "choices" in meta else None
    nargs = _constant(meta["nargs"]) if "nargs" in meta else None
    if "action" in meta:
        action = ast.unparse(meta["action"])
        if "BooleanOptionalAction" in action:
            return "bool", None, None
        extra = meta.get("action_kwargs")
        nargs = next((_constant(v) for k, v in zip(extra.keys, extra.values, strict=True)
                      if _constant(k) == "nargs"), None) if isinstance(extra, ast.Dict) else None
        return "value", nargs, None  # LoRAPathAction: nargs "*"
    core = inner.removeprefix("Optional[").removesuffix("]") if inner.startswith(
        "Optional[") else inner.replace(" | None", "")
    if core.startswith("Literal["):
        return "value", None, choices or _constant(ast.parse(core, mode="eval").body.slice)
    if core.startswith(("List[", "list[")) and "type_parser" not in meta:
        return "value", nargs or "+", choices
    if core == "bool":
        return "flag", None, None
    return "value", nargs, choices


def field_flags(tree: ast.Module, classes: set[str]) -> dict[str, dict]:
    table = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ClassDef) and node.name in classes):
            continue
        for item in node.body:
            if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
                continue
            meta = _arg_meta(item.annotation)
            if meta is None or _constant(meta.get("no_cli", ast.Constant(False))):
                continue
            name = _constant(meta["cli_name"]) if "cli_name" in meta else None
            name = name or "--" + item.target.id.replace("_", "-")
            kind, nargs, choices = _kind(ast.unparse(item.annotation.slice.elts[0]), meta)
            table[name] = {"aliases": _constant(meta["aliases"]) if "aliases" in meta else [],
                           "kind": kind, "nargs": nargs, "choices": choices}
    return table


def manual_flags(tree: ast.Module) -> dict[str, dict]:
    """ServerArgs.add_cli_args' own add_argument calls."""
    table = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):
            continue
        names = [a.value for a in node.args if isinstance(a, ast.Constant)]
        keywords = {k.arg: k.value for k in node.keywords}
        action = ast.unparse(keywords["action"]) if "action" in keywords else ""
        flag = "StoreTrue" in action or action == "'store_true'"
        choices = _constant(keywords["choices"]) if "choices" in keywords else None
        table[names[0]] = {"aliases": names[1:], "kind": "flag" if flag else "value",
                           "nargs": None, "choices": choices if isinstance(choices, list) else None}
    return table


def namespaces(tree: ast.Module) -> set[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "_INPUT_NAMESPACES":
            return {ast.unparse(e) for e in node.value.elts}
    raise SystemExit("server_args.py: no _INPUT_NAMESPACES")


def document(wheel: str) -> dict:
    """The table's JSON document, read from the wheel."""
    with zipfile.ZipFile(wheel) as zf:
        server_args = ast.parse(zf.read("sglang/srt/server_args.py").decode())
        classes = namespaces(server_args)
        table: dict[str, dict] = {}
        for path in sorted(n for n in zf.namelist() if n.startswith(FIELDS) and n.endswith(".py")):
            table |= field_flags(ast.parse(zf.read(path).decode()), classes)
    table |= manual_flags(server_args)
    data = {"_source": f"SGLang 0.5.23's launch_server parser, read from {Path(wheel).name} by "
                       "scripts/sglang_serve_flags.py: srt/server_args.py ServerArgs.add_cli_args "
                       "(add_cli_args_from_dataclass over srt/arg_groups/fields/, then its own "
                       "add_argument calls)",
            "flags": dict(sorted(table.items()))}
    return data


def main(wheel: str) -> None:
    data = document(wheel)
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    print(f"{OUT}: {len(data['flags'])} flags")


if __name__ == "__main__":
    main(sys.argv[1])
