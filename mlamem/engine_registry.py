"""The engine registry (spec): every engine by name, none of them imported.

Inference engines are emulated one rank at a time to reproduce runtime OOMs. `engines/base.py`
holds the one skeleton every engine runs in (cap, init, profile, graph estimate, KV sizing,
capture, step), the case every engine fills and the budget; each engine is one module with an
`Engine` subclass named `ENGINE`. An engine may own a table of the scenario named after it
(`[vllm]`): its `section` names the class that reads it, in a module without torch, so loading a
scenario stays light. `REGISTRY` names both without importing them, so validating a scenario's
`engines` and the CLI's help stay light. Adding an engine is one module and one line here
(`mlamem.engines` re-exports all of this). `python -m mlamem.engines REQUEST RESULT` runs one
case in its own process (`engines/worker.py`).
"""

from __future__ import annotations

import importlib
from typing import NamedTuple


class EngineEntry(NamedTuple):
    """Where an engine lives: its module (which defines ENGINE), and its scenario section's
    class as "module:Class" (None: the engine reads no table of its own)."""

    module: str
    section: str | None = None


REGISTRY: dict[str, EngineEntry] = {
    "vllm": EngineEntry("mlamem.engines.vllm", section="mlamem.engines.vllm_rules:VLLMSection"),
    "trtllm-context-reuse": EngineEntry("mlamem.engines.trtllm_context_reuse"),
    "sglang": EngineEntry("mlamem.engines.sglang", section="mlamem.engines.sglang_rules:SGLangSection"),
}
DEFAULT_ENGINES = ("vllm",)  # what a scenario without `engines` serves

# repro-oom files before `engine` said which shape their cases have in `mode`
ENGINE_OF_MODE = {"decode": "vllm", "context-reuse": "trtllm-context-reuse"}


def engine_names() -> list[str]:
    """Every registered engine name, in registry order; imports nothing."""
    return list(REGISTRY)


def _entry(name: str) -> EngineEntry:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown engine {name!r}; expected one of {', '.join(REGISTRY)}") from None


def load_engine(name: str) -> type:
    """The engine registered as `name` (an `mlamem.engines.base.Engine` subclass), imported now,
    by module name: the registry sits below the engines."""
    return importlib.import_module(_entry(name).module).ENGINE


def section_type(name: str) -> type | None:
    """The class of engine `name`'s own scenario table (a frozen dataclass whose fields are the
    table's keys), imported now; None when the engine reads no table of its own."""
    section = _entry(name).section
    if section is None:
        return None
    module, _, attribute = section.partition(":")
    return getattr(importlib.import_module(module), attribute)


def request_engine(request: dict) -> str:
    """The engine a case request names; a request from before `engine` names its case by
    `variant` (context reuse) or `path` (vLLM)."""
    return request.get("engine") or ("trtllm-context-reuse" if "variant" in request else "vllm")


__all__ = ["DEFAULT_ENGINES", "ENGINE_OF_MODE", "REGISTRY", "EngineEntry", "engine_names",
           "load_engine", "request_engine", "section_type"]
