"""The shipped scenarios by name, without the scenario model (pydantic): what the CLI's defaults
and listings need before any file is read, and the refusal of a name or path that names none."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from mlamem.spec.errors import UserError
from mlamem.spec.files import check_name_length

DEFAULT_SCENARIO = "glm5-fp8-tp8"


def shipped_names() -> list[str]:
    """Names of the scenarios that ship with mlamem."""
    root = resources.files("mlamem.scenarios")
    return sorted(p.name[: -len(".toml")] for p in root.iterdir() if p.name.endswith(".toml"))


def is_path(name_or_path: str) -> bool:
    """Whether --scenario's value is a TOML file's path, not a shipped scenario's name."""
    return name_or_path.endswith(".toml") or "/" in name_or_path


def check_exists(name_or_path: str) -> None:
    """A UserError where `name_or_path` is a path to no file, or a name no shipped scenario has."""
    if is_path(name_or_path):
        check_name_length(Path(name_or_path), "scenario")
        if not Path(name_or_path).exists():
            raise UserError(f"scenario file {name_or_path} not found; pass an existing .toml path "
                            f"or one of: {', '.join(shipped_names())}")
    elif name_or_path not in shipped_names():
        raise UserError(f"unknown scenario {name_or_path!r}; expected one of: "
                        f"{', '.join(shipped_names())} (or a path to a .toml file)")
