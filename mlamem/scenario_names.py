"""The shipped scenarios by name, without the scenario model (pydantic): what the CLI's defaults
and listings need before any file is read."""

from __future__ import annotations

from importlib import resources

DEFAULT_SCENARIO = "glm5-fp8-tp8"


def shipped_names() -> list[str]:
    """Names of the scenarios that ship with mlamem."""
    root = resources.files("mlamem.scenarios")
    return sorted(p.name[: -len(".toml")] for p in root.iterdir() if p.name.endswith(".toml"))
