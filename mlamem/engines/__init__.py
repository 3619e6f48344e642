"""Inference engines' ranks, one module each, emulated one rank at a time to reproduce runtime
OOMs; each engine's torch-free half is its spec module (`mlamem.spec.engines`).

The registry (`engine_names`, `engine_spec`, `load_engine`, `DEFAULT_ENGINES`, ...) is
`mlamem.spec.engine_registry`, in the spec layer below the engines (the scenario names its engines);
it is re-exported here.
"""

from mlamem.spec.engine_registry import (
    DEFAULT_ENGINES,
    ENGINE_OF_MODE,
    GROUP,
    REGISTERED,
    SHIPPED,
    engine_names,
    engine_spec,
    engine_tables,
    load_engine,
    rediscover,
    request_engine,
    section_type,
)

__all__ = ["DEFAULT_ENGINES", "ENGINE_OF_MODE", "GROUP", "REGISTERED", "SHIPPED", "engine_names",
           "engine_spec", "engine_tables", "load_engine", "rediscover", "request_engine",
           "section_type"]
