"""What a rank allocates beyond attention, as data: the model's other layers (the MoE layer, the
DSA indexer), the sampler and the drafter, in the profile pass and the step.

Each buffer is sized by the rule of the engine's source it cites (version, file, function). A
stage is the set of buffers live together at one point of the pass (one layer's MoE, the
sampler's run); the rank allocates a stage's buffers, then frees them before the next, so its
peak is the largest stage on top of what stays (engines/decode_rank.py). A buffer whose kernel
cannot load here (DeepGEMM's, which needs a newer torch than the machines run) is still
allocated, at the size the source gives, and says so (`sized_from_source`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# bytes per element of the dtypes the engines' buffers use, by torch's name
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "int32": 4, "int64": 8,
               "float8_e4m3fn": 1, "uint8": 1, "int8": 1, "bool": 1}


@dataclass(frozen=True)
class RankBuffer:
    """One tensor the engine allocates, sized by its source's rule."""

    name: str  # e.g. "moe.intermediate_cache1"
    shape: tuple[int, ...]
    dtype: str  # a key of DTYPE_BYTES (torch's name)
    source: str  # "vLLM 0.33.0 model_executor/layers/fused_moe/...py, function"
    sized_from_source: bool = False  # its kernel cannot load here: the size is the source's

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"unknown dtype {self.dtype!r}")
        if any(d < 0 for d in self.shape):
            raise ValueError(f"{self.name}: negative dimension in {self.shape}")

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class Stage:
    """Buffers live together at one point of the pass, freed before the next stage."""

    name: str  # "moe", "indexer", "sampler", "drafter"
    buffers: tuple[RankBuffer, ...]

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buffers)
