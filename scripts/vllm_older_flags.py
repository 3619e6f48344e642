"""Write the flags older vLLM versions' `vllm serve` takes and 0.33.0's does not
(mlamem/spec/engines/vllm-older-flags.json), from each version's wheel, read as text as
scripts/vllm_serve_flags.py reads 0.33.0's (vLLM is not imported): engine/arg_utils.py's
EngineArgs.add_cli_args and the frontend's make_arg_parser and FrontendArgs
(entrypoints/openai/cli_args.py to 0.28.0, entrypoints/launchers/cli_args.py in 0.29.0-0.32.0,
entrypoints/common/cli_args.py after).

mlamem's vLLM parser takes each such flag with its kind and names it as not modelled, with the
versions that have it, so a command written for an older vLLM is read instead of refused.

Usage: python scripts/vllm_older_flags.py /tmp/vllm-0.10.2-*.whl /tmp/vllm-0.11.0-*.whl ...
"""

from __future__ import annotations

import ast
import json
import re
import sys
import zipfile
from pathlib import Path

from older_flags import older_flags
from vllm_serve_flags import OUT as CURRENT
from vllm_serve_flags import calls, fields, kind_of

OUT = CURRENT.with_name("vllm-older-flags.json")
FRONTENDS = ("vllm/entrypoints/common/cli_args.py", "vllm/entrypoints/launchers/cli_args.py",
             "vllm/entrypoints/openai/cli_args.py")


def version_of(wheel: str) -> str:
    """The version in a wheel's file name (vllm-0.11.0-cp38-...whl)."""
    return re.match(r"vllm-([^-]+)-", Path(wheel).name).group(1)


def flags_of(wheel: str) -> dict[str, dict]:
    """Every flag of one version's `vllm serve` parser: its kind and aliases."""
    with zipfile.ZipFile(wheel) as zf:
        engine = ast.parse(zf.read("vllm/engine/arg_utils.py").decode())
        names = set(zf.namelist())
        frontend = ast.parse(zf.read(next(f for f in FRONTENDS if f in names)).decode())
    table = calls(engine, fields(engine, ("EngineArgs",)))
    table |= calls(frontend, {})
    for name, annotation in fields(frontend, ("BaseFrontendArgs", "FrontendArgs")).items():
        table.setdefault("--" + name.replace("_", "-"), {"aliases": [], "kind": kind_of(annotation)})
    return table


def main(wheels: list[str]) -> None:
    in_order = sorted(wheels, key=lambda w: tuple(int(p) for p in version_of(w).split(".")))
    older = older_flags(in_order, json.loads(CURRENT.read_text())["flags"], flags_of, version_of)
    versions = ", ".join(version_of(w) for w in wheels)
    data = {"_source": f"flags of vLLM {versions}'s `vllm serve` that 0.33.0's lacks, read from "
                       "their wheels by scripts/vllm_older_flags.py (engine/arg_utils.py "
                       "EngineArgs.add_cli_args; the frontend's make_arg_parser, FrontendArgs)",
            "flags": older}
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    print(f"{OUT}: {len(older)} flags")


if __name__ == "__main__":
    main(sys.argv[1:])
