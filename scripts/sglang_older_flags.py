"""Write the flags older SGLang versions' `launch_server` takes and 0.5.23's does not
(mlamem/spec/engines/sglang-older-flags.json), from each version's wheel, read as text as
scripts/sglang_serve_flags.py reads 0.5.23's (SGLang is not imported): srt/server_args.py
ServerArgs.add_cli_args' add_argument calls, and from 0.5.15 the fields of
srt/arg_groups/fields/ where the wheel has them.

mlamem's SGLang parser takes each such flag and names it as not modelled, with the versions that
have it, so a command written for an older SGLang is read instead of refused.

Usage: python scripts/sglang_older_flags.py /tmp/sglang-0.4.10-*.whl /tmp/sglang-0.5.5-*.whl ...
"""

from __future__ import annotations

import ast
import json
import re
import sys
import zipfile
from pathlib import Path

from older_flags import older_flags
from sglang_serve_flags import FIELDS, field_flags, namespaces
from sglang_serve_flags import OUT as CURRENT

OUT = CURRENT.with_name("sglang-older-flags.json")


def version_of(wheel: str) -> str:
    """The version in a wheel's file name (sglang-0.5.5-py3-none-any.whl)."""
    return re.match(r"sglang-([^-]+)-", Path(wheel).name).group(1)


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version))


def _argument_flags(tree: ast.Module) -> dict[str, dict]:
    """Every add_argument call's names and kind: a flag (store_true and its kin), a list (nargs
    + or *) or a value."""
    table = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):
            continue
        names = [a.value for a in node.args if isinstance(a, ast.Constant)
                 and isinstance(a.value, str) and a.value.startswith("--")]
        if not names:
            continue
        keywords = {k.arg: ast.unparse(k.value) for k in node.keywords}
        action, nargs = keywords.get("action", ""), keywords.get("nargs", "")
        kind = ("flag" if "store_true" in action or "StoreTrue" in action or "store_false" in action
                else "list" if nargs.strip("'\"") in ("+", "*") else "value")
        table[names[0]] = {"aliases": names[1:], "kind": kind}
    return table


def flags_of(wheel: str) -> dict[str, dict]:
    """Every flag of one version's server parser: its kind and aliases."""
    with zipfile.ZipFile(wheel) as zf:
        server_args = ast.parse(zf.read("sglang/srt/server_args.py").decode())
        table = _argument_flags(server_args)
        paths = sorted(n for n in zf.namelist() if n.startswith(FIELDS) and n.endswith(".py"))
        if paths:
            classes = namespaces(server_args)
            for path in paths:
                for flag, spec in field_flags(ast.parse(zf.read(path).decode()), classes).items():
                    kind = "list" if spec["nargs"] in ("+", "*") else spec["kind"]
                    table.setdefault(flag, {"aliases": spec["aliases"],
                                            "kind": "flag" if kind == "bool" else kind})
    return table


def main(wheels: list[str]) -> None:
    in_order = sorted(wheels, key=lambda w: _key(version_of(w)))
    older = older_flags(in_order, json.loads(CURRENT.read_text())["flags"], flags_of, version_of)
    versions = ", ".join(version_of(w) for w in in_order)
    data = {"_source": f"flags of SGLang {versions}'s launch_server that 0.5.23's lacks, read "
                       "from their wheels by scripts/sglang_older_flags.py (srt/server_args.py "
                       "ServerArgs.add_cli_args; srt/arg_groups/fields/ where present)",
            "flags": older}
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    print(f"{OUT}: {len(older)} flags")


if __name__ == "__main__":
    main(sys.argv[1:])
