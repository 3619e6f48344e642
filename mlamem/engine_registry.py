"""The engine registry (spec): every engine by name, none of them imported.

Inference engines are emulated one rank at a time to reproduce runtime OOMs. `engines/base.py`
holds the one skeleton every engine runs in (cap, init, profile, graph estimate, KV sizing,
capture, step), the case every engine fills and the budget; each engine is one module with an
`Engine` subclass named `ENGINE`. `REGISTRY` names them without importing them (they import
torch), so validating a scenario's `engines` and the CLI's help stay light. Adding an engine is
one module and one line here (`mlamem.engines` re-exports all of this). `python -m
mlamem.engines REQUEST RESULT` runs one case in its own process (`engines/worker.py`).
"""

from __future__ import annotations

import importlib

REGISTRY: dict[str, str] = {  # engine name -> its module, which defines ENGINE
    "vllm": "mlamem.engines.vllm",
    "trtllm-context-reuse": "mlamem.engines.trtllm_context_reuse",
}
DEFAULT_ENGINES = ("vllm",)  # what a scenario without `engines` serves

# repro-oom files before `engine` said which shape their cases have in `mode`
ENGINE_OF_MODE = {"decode": "vllm", "context-reuse": "trtllm-context-reuse"}


def engine_names() -> list[str]:
    """Every registered engine name, in registry order; imports nothing."""
    return list(REGISTRY)


def load_engine(name: str) -> type:
    """The engine registered as `name` (an `mlamem.engines.base.Engine` subclass), imported now,
    by module name: the registry sits below the engines."""
    try:
        module = REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown engine {name!r}; expected one of {', '.join(REGISTRY)}") from None
    return importlib.import_module(module).ENGINE


def request_engine(request: dict) -> str:
    """The engine a case request names; a request from before `engine` names its case by
    `variant` (context reuse) or `path` (vLLM)."""
    return request.get("engine") or ("trtllm-context-reuse" if "variant" in request else "vllm")


__all__ = ["DEFAULT_ENGINES", "ENGINE_OF_MODE", "REGISTRY", "engine_names", "load_engine",
           "request_engine"]
