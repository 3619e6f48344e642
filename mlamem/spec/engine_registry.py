"""The engine registry (spec): every engine by name, through its spec module.

Inference engines are emulated one rank at a time to reproduce runtime OOMs. An engine is two
modules: a spec module without torch (`mlamem.spec.engines.<name>`: its scenario table, rules,
serve-command parser and its results' view, gathered in an `EngineSpec`) and a rank module with
torch (`mlamem.engines.<name>`: an `engines.base.Engine` subclass, the phases and buffers),
which the spec names as an entry point's value. Engines register by name in the entry-point
group `mlamem.engines`, each entry pointing at its `EngineSpec`, e.g. in pyproject.toml:

    [project.entry-points."mlamem.engines"]
    myengine = "my_package.my_engine_spec:SPEC"

The shipped three are found without the metadata too (`SHIPPED`, imported here on first use);
another package's entry points are read on the first lookup that needs them, and a plug-in
cannot take a shipped name. Listing the names imports no spec; reading a scenario's tables
imports the specs, never torch; `load_engine` imports the rank. `python -m mlamem.engines
REQUEST RESULT` runs one case in its own process (`engines/worker.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mlamem.spec.engines import EngineSpec
from mlamem.spec.errors import UserError

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

GROUP = "mlamem.engines"  # the entry-point group engines register in
SHIPPED = ("vllm", "trtllm-context-reuse", "sglang")  # the engines mlamem ships, in order
DEFAULT_ENGINES = ("vllm",)  # what a scenario without `engines` serves

# repro-oom files before `engine` said which shape their cases have in `mode`
ENGINE_OF_MODE = {"decode": "vllm", "context-reuse": "trtllm-context-reuse"}

REGISTERED: dict[str, EngineSpec] = {}  # engines registered in-process (tests), by name
_plugins: dict[str, EntryPoint] | None = None  # the group's entry points, read once


def _shipped_specs() -> dict[str, EngineSpec]:
    from mlamem.spec.engines import sglang, trtllm, vllm

    return {spec.name: spec for spec in (vllm.SPEC, trtllm.SPEC, sglang.SPEC)}


def _plugin_entry_points() -> dict[str, EntryPoint]:
    """The group's entry points other than the shipped names (mlamem's own entries name those),
    read once; first come, first kept."""
    global _plugins
    if _plugins is None:
        from importlib.metadata import entry_points

        _plugins = {}
        for entry_point in entry_points(group=GROUP):
            if entry_point.name not in SHIPPED:
                _plugins.setdefault(entry_point.name, entry_point)
    return _plugins


def rediscover() -> None:
    """Read the entry points again on next lookup (after sys.path or the packages changed)."""
    global _plugins
    _plugins = None


def engine_names() -> list[str]:
    """Every registered engine name: the shipped ones, then the plug-ins; imports no spec."""
    return list(dict.fromkeys([*SHIPPED, *_plugin_entry_points(), *REGISTERED]))


def engine_spec(name: str) -> EngineSpec:
    """Engine `name`'s spec, its module imported now (registry loading: a shipped spec by a
    plain import, a plug-in's by its entry point)."""
    if name in REGISTERED:
        return REGISTERED[name]
    if name in SHIPPED:
        return _shipped_specs()[name]
    entry_point = _plugin_entry_points().get(name)
    if entry_point is None:
        raise ValueError(f"unknown engine {name!r}; expected one of {', '.join(engine_names())}")
    where = f"engine {name!r}: its {GROUP} entry point {entry_point.value}"
    spec = _loaded(entry_point, where)
    if not isinstance(spec, EngineSpec) or spec.name != name:
        raise UserError(f"{where} is no mlamem.spec.engines.EngineSpec named {name!r}")
    return spec


def _loaded(entry_point: EntryPoint, what: str):
    """An entry point's object; a UserError naming it where it does not load."""
    try:
        return entry_point.load()
    except Exception as exc:  # the plug-in's module fails to import, or lacks the attribute
        first = (str(exc).strip().splitlines() or [""])[0]
        raise UserError(f"{what} does not load ({type(exc).__name__}: {first})") from None


def declared_engine(scenario, engine: str | None = None) -> str:
    """The engine to emulate for `scenario`: `engine`, which the scenario must declare in
    `engines`, else its first; a UserError (field `engine`) otherwise. No torch: commands
    check it before the rank loads."""
    name = engine or scenario.engines[0]
    if name not in scenario.engines:
        raise UserError(f"{scenario.name} declares {', '.join(scenario.engines)}, not {name}; "
                        "pick one of those, or add it to the scenario's `engines`", field="engine")
    return name


def load_engine(name: str) -> type:
    """The rank class of engine `name` (an `mlamem.engines.base.Engine` subclass), imported now:
    its spec's `rank` loaded as an entry point (the registry sits below the engines)."""
    from importlib.metadata import EntryPoint

    spec = engine_spec(name)
    return _loaded(EntryPoint(name, spec.rank, GROUP), f"engine {name!r}: its rank {spec.rank}")


def section_type(name: str) -> type | None:
    """The class of engine `name`'s own scenario table (a frozen dataclass whose fields are the
    table's keys); None when the engine reads no table of its own."""
    return engine_spec(name).section


def engine_tables() -> dict[str, type]:
    """Every engine's own scenario table's class, by engine name (those that read one)."""
    specs = (engine_spec(name) for name in engine_names())
    return {spec.name: spec.section for spec in specs if spec.section is not None}


def request_engine(request: dict) -> str:
    """The engine a case request names; a request from before `engine` names its case by
    `variant` (context reuse) or `path` (vLLM)."""
    return request.get("engine") or ("trtllm-context-reuse" if "variant" in request else "vllm")


__all__ = ["DEFAULT_ENGINES", "ENGINE_OF_MODE", "GROUP", "REGISTERED", "SHIPPED", "engine_names",
           "engine_spec", "engine_tables", "load_engine", "rediscover", "request_engine",
           "section_type"]
