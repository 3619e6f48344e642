"""Inference engines, one module each, emulated one rank at a time to reproduce runtime OOMs.

The registry (`REGISTRY`, `load_engine`, `DEFAULT_ENGINES`, ...) is `mlamem.engine_registry`, in
the spec layer below the engines (the scenario names its engines); it is re-exported here.
"""

from mlamem.engine_registry import (
    DEFAULT_ENGINES,
    ENGINE_OF_MODE,
    REGISTRY,
    EngineEntry,
    engine_names,
    load_engine,
    request_engine,
    section_type,
)

__all__ = ["DEFAULT_ENGINES", "ENGINE_OF_MODE", "REGISTRY", "EngineEntry", "engine_names",
           "load_engine", "request_engine", "section_type"]
