"""What every sparse fp8 MLA decode kernel adapter declares and does.

A kernel is called as `decode(q, kv_cache, indices, sm_scale=..., d_v=..., out=None)` with
    q:        (b, s_q, h_q, d_qk) bfloat16, h_q one of `capabilities().head_counts`
    kv_cache: (num_blocks, block_size, 1, 656) fp8_ds_mla bytes
    indices:  (b, s_q, topk) int32 KV-token indices, -1 = invalid
and returns out (b, s_q, h_q, d_v) bfloat16 and lse (b, h_q, s_q) float32 (natural log).
Kernels whose capabilities say so also take `lse=` (that shape) and `accum_workspace=` (a flat
float32 tensor of at least `accum_workspace_numel(...)` elements); a kernel given an accumulator
workspace allocates none of its temporaries.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # importing the declarations needs no torch (the CLI's checks use them)
    import torch


@dataclass(frozen=True)
class Capabilities:
    """What a kernel lets its caller provide, so paths need not guess."""

    takes_out: bool  # accepts a caller-provided output tensor (out=)
    takes_lse: bool  # accepts a caller-provided lse tensor
    takes_accum_workspace: bool  # accepts caller-provided split-KV accumulators
    head_counts: tuple[int, ...]  # query head counts it runs; callers pad q up to one
    source: str  # where these facts come from, e.g. the op schema read at run time

    def padded_heads(self, heads: int) -> int:
        """The smallest supported head count >= heads."""
        fitting = [h for h in self.head_counts if h >= heads]
        if not fitting:
            raise ValueError(f"{heads} heads per rank exceeds the kernel's maximum "
                             f"{max(self.head_counts)}")
        return min(fitting)


@dataclass(frozen=True)
class BufferSpec:
    """One buffer a kernel allocates inside a call."""

    name: str  # e.g. "o_accum"
    shape: tuple[int, ...]
    dtype: torch.dtype
    lifetime: Literal["returned", "temporary"]  # temporary: freed before the call returns

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


class SparseDecodeKernel(ABC):
    """Adapter for one sparse fp8 MLA decode implementation."""

    name: str  # the --kernel name
    label: str  # how reports name it, e.g. "FlashMLA"
    runs_on_meta = False  # True if decode itself runs on the meta device (no spec needed)

    @abstractmethod
    def unavailable_reason(self) -> str | None:
        """None when the kernel can run here, else why not (one line, naming the fix)."""

    @abstractmethod
    def capabilities(self) -> Capabilities:
        """What the caller may pass in; read from the kernel itself where possible."""

    @abstractmethod
    def decode(self, q, kv_cache, indices, *, sm_scale: float, d_v: int, out=None):
        """Run the decode; returns (out, lse)."""

    @abstractmethod
    def allocations(self, q_shape: tuple[int, ...], d_v: int,
                    sm_count: int) -> list[BufferSpec]:
        """The buffers one call allocates inside itself, in allocation order."""

    def accum_workspace_numel(self, b: int, max_tokens: int, h_q: int, topk: int, d_v: int,
                              sm_count: int) -> int:
        """float32 elements of an accum_workspace covering every call of up to max_tokens
        queries; 0 for a kernel that takes none."""
        return 0


ACCUM_WORKSPACE = "accum_workspace"  # staged name: the caller's split-KV accumulator workspace


def allocated_in_call(specs: list[BufferSpec], passed: Collection[str]) -> list[BufferSpec]:
    """The buffers a call still allocates when the caller passes the ones named in `passed`.

    A passed buffer ("out", "lse") is not allocated; a passed ACCUM_WORKSPACE replaces every
    temporary (scheduler tensors and accumulators).
    """
    return [s for s in specs if s.name not in passed
            and not (s.lifetime == "temporary" and ACCUM_WORKSPACE in passed)]


def allocate_missing(specs: list[BufferSpec], device: torch.device, *,
                     out: torch.Tensor | None = None, lse: torch.Tensor | None = None,
                     accum_workspace: torch.Tensor | None = None):
    """Allocate, in the specs' order, what a call allocates given the buffers passed in.

    Returns (returned, temporaries): name -> tensor, the passed out and lse included in the
    first. The caller drops the temporaries before it returns.
    """
    import torch

    given = {"out": out, "lse": lse, ACCUM_WORKSPACE: accum_workspace}
    passed = [name for name, tensor in given.items() if tensor is not None]
    returned = {name: given[name] for name in ("out", "lse") if given[name] is not None}
    temporaries = {}
    for spec in allocated_in_call(specs, passed):
        tensor = torch.empty(spec.shape, dtype=spec.dtype, device=device)
        (returned if spec.lifetime == "returned" else temporaries)[spec.name] = tensor
    return returned, temporaries


def simulate_decode(kernel: SparseDecodeKernel, sm_count: int, q: torch.Tensor, kv_cache,
                    indices, *, sm_scale: float, d_v: int, out: torch.Tensor | None = None,
                    lse: torch.Tensor | None = None,
                    accum_workspace: torch.Tensor | None = None):
    """Allocate what `kernel` allocates inside one call, on q's device (meta), in its order.

    Stands in for the kernel where it cannot run; returns (out, lse) like the kernel. Buffers
    passed in are not allocated (see `allocated_in_call`).
    """
    returned, temporaries = allocate_missing(
        kernel.allocations(tuple(q.shape), d_v, sm_count), q.device, out=out, lse=lse,
        accum_workspace=accum_workspace)
    temporaries.clear()  # freed before the call returns
    return returned["out"], returned["lse"]
