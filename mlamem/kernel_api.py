"""The kernel contract (spec): what every MLA kernel adapter declares and does, per operation.

Operations (`OPERATIONS`), each with its kernel-side layout (the wrapper's rows layout is
(rows, heads, d): `to_kernel_layout` / `from_kernel_layout` convert):
- "sparse-decode": q (1, T, h_q, 576) bf16 over an fp8_ds_mla cache (num_blocks, block, 1, 656)
  with indices (1, T, topk) int32 (-1 invalid); out (1, T, h_q, d_v) bf16, lse (1, h_q, T) fp32.
  Its historical entry point is `decode(q, kv_cache, indices, sm_scale=, d_v=, out=None)`.
- "dense-decode": one query per request, q (b, 1, h_q, 576) (bf16, or fp8 e4m3 over an fp8
  cache), a paged cache (num_blocks, block, 1, 576) bf16 or fp8 with a block table (b, blocks)
  and context lengths (b,); out (b, 1, h_q, d_v) bf16, lse (b, h_q, 1) fp32.
- "sparse-prefill": q (s_q, h_q, 576) bf16 over a gathered bf16 kv (s_kv, 1, 576) with indices
  (s_q, 1, topk); out (s_q, h_q, d_v) bf16, lse (s_q, h_q) fp32 (max_logits too, not compared).
lse is always the natural log. Kernels whose capabilities say so take `out=` (and, for the
sparse decode, `lse=` and `accum_workspace=`, a flat float32 tensor of at least
`accum_workspace_numel(...)` elements; a kernel given one allocates none of its temporaries).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

if TYPE_CHECKING:  # importing the declarations needs no torch (the CLI's checks use them)
    import torch


SPARSE_DECODE, DENSE_DECODE, SPARSE_PREFILL = "sparse-decode", "dense-decode", "sparse-prefill"
OPERATIONS = (SPARSE_DECODE, DENSE_DECODE, SPARSE_PREFILL)
# The cache each operation reads, by the scenario's kv_cache_dtype name.
KV_FORMATS = {SPARSE_DECODE: ("fp8_ds_mla",), DENSE_DECODE: ("bf16", "fp8"),
              SPARSE_PREFILL: ("bf16",)}
ALL_OPERATIONS = OPERATIONS  # the registry's name for them


class KernelEntry(NamedTuple):
    """Where an adapter lives and what it is, in one line."""

    module: str  # importable module path of the adapter
    cls: str  # the SparseDecodeKernel subclass in it
    help: str  # one line for `--kernel` help and listings
    operations: tuple[str, ...] = ("sparse-decode",)  # what it runs (see OPERATIONS)
    # Set by plug-in discovery, not by the plug-in:
    package: str | None = None  # a plug-in's distribution, "name version"; None when shipped
    problem: str | None = None  # why a plug-in cannot be used, one line; None when it can


@dataclass(frozen=True)
class Capabilities:
    """What a kernel lets its caller provide for one operation, so paths need not guess."""

    takes_out: bool  # accepts a caller-provided output tensor (out= / out_=)
    takes_lse: bool  # accepts a caller-provided lse tensor
    takes_accum_workspace: bool  # accepts caller-provided split-KV accumulators
    head_counts: tuple[int, ...]  # query head counts it runs natively; callers pad q up to one
    source: str  # where these facts come from, e.g. the op schema read at run time
    kv_formats: tuple[str, ...] = ("fp8_ds_mla",)  # caches it reads (KV_FORMATS names)
    heads_source: str = ""  # where head_counts come from (probed on which GPU, or assumed)
    assumed: bool = False  # True when the schema could not be read here and is assumed

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


@dataclass(frozen=True)
class Problem:
    """The shape of one kernel call, in the operation's terms."""

    op: str  # one of OPERATIONS
    rows: int  # query rows: T (sparse decode), requests b (dense decode), s_q (prefill)
    heads: int  # query heads the kernel runs (after padding)
    sm_scale: float
    kv_tokens: int  # sparse decode: KV pool tokens; dense decode: each request's context; prefill: s_kv
    kv_format: str = "fp8_ds_mla"  # one of KV_FORMATS[op]
    topk: int | None = None  # KV tokens each query attends (sparse operations)
    block_size: int = 64  # KV-cache page size in tokens
    d_qk: int = 576
    d_v: int = 512

    @property
    def q_shape(self) -> tuple[int, ...]:
        """q in the kernel's layout."""
        return to_kernel_layout_shape(self.op, (self.rows, self.heads, self.d_qk))

    @property
    def q_dtype(self) -> str:
        """The torch dtype name q must have: fp8 e4m3 for the dense decode over an fp8 cache."""
        return "float8_e4m3fn" if (self.op, self.kv_format) == (DENSE_DECODE, "fp8") else "bfloat16"


@dataclass
class OpInputs:
    """What a call reads besides q (tensors; None where the operation has no such input)."""

    kv: Any  # the cache (sparse decode, dense decode) or the gathered kv (prefill)
    indices: Any = None  # sparse operations
    block_table: Any = None  # dense decode: (b, blocks) int32
    seqlens: Any = None  # dense decode: (b,) int32
    descale_q: Any = None  # dense decode over fp8: (1,) float32
    descale_k: Any = None


def to_kernel_layout_shape(op: str, rows_shape: tuple[int, ...]) -> tuple[int, ...]:
    """(rows, heads, d) -> the operation's kernel layout."""
    if op == SPARSE_DECODE:
        return (1, *rows_shape)
    if op == DENSE_DECODE:
        return (rows_shape[0], 1, *rows_shape[1:])
    return tuple(rows_shape)


def to_kernel_layout(op: str, x):
    """A (rows, heads, d) tensor as the kernel's q or out (a view)."""
    return x.view(to_kernel_layout_shape(op, tuple(x.shape)))


def from_kernel_layout(op: str, out, lse):
    """The kernel's out and lse as (rows, heads, d_v) and (heads, rows) views."""
    if op == SPARSE_DECODE:
        return out[0], lse[0]
    if op == DENSE_DECODE:
        return out[:, 0], lse[:, :, 0].T
    return out, lse.T


class KernelContract(ABC):
    """Adapter for one MLA kernel implementation (its operations: `operations`).

    Adapters subclass `mlamem.kernels.base.SparseDecodeKernel`, this contract with its default
    `make_inputs(problem, heads, device, seed)`, which draws them with mlamem's runtime."""

    name: str  # the --kernel name
    label: str  # how reports name it, e.g. "FlashMLA"
    runs_on_meta = False  # True if decode itself runs on the meta device (no spec needed)
    operations: tuple[str, ...] = (SPARSE_DECODE,)  # what it runs, in OPERATIONS order

    @abstractmethod
    def unavailable_reason(self) -> str | None:
        """None when the kernel can run here, else why not (one line, naming the fix)."""

    def version(self) -> str | None:
        """The installed build's version; None when unknown or absent."""
        return None

    @abstractmethod
    def capabilities(self, op: str = SPARSE_DECODE) -> Capabilities:
        """What the caller may pass in for `op`; read from the kernel itself where possible."""

    def run(self, problem: Problem, q, inputs: OpInputs, *, out=None, **staged):
        """Run one call of problem.op (q and out in its kernel layout); returns (out, lse)."""
        if problem.op != SPARSE_DECODE:
            raise NotImplementedError(f"{self.label} does not run {problem.op}")
        return self.decode(q, inputs.kv, inputs.indices, sm_scale=problem.sm_scale,
                           d_v=problem.d_v, out=out, **staged)

    def op_allocations(self, problem: Problem, sm_count: int) -> list[BufferSpec]:
        """The buffers one call of `problem` allocates inside itself, in allocation order."""
        if problem.op != SPARSE_DECODE:
            raise NotImplementedError(f"{self.label} does not run {problem.op}")
        return self.allocations(problem.q_shape, problem.d_v, sm_count)

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


def simulate_decode(kernel: KernelContract, sm_count: int, q: torch.Tensor, kv_cache,
                    indices, *, sm_scale: float, d_v: int, out: torch.Tensor | None = None,
                    lse: torch.Tensor | None = None,
                    accum_workspace: torch.Tensor | None = None):
    """Allocate what `kernel` allocates inside one sparse decode call, on q's device (meta),
    in its order. Stands in for the kernel where it cannot run; returns (out, lse) like the
    kernel. Buffers passed in are not allocated (see `allocated_in_call`)."""
    return _simulate(kernel.allocations(tuple(q.shape), d_v, sm_count), q.device, out=out,
                     lse=lse, accum_workspace=accum_workspace)


def simulate_run(kernel: KernelContract, sm_count: int, problem: Problem, q, inputs,
                 *, out=None, **staged):
    """`kernel.run` as its allocation spec: what one call of any operation allocates."""
    return _simulate(kernel.op_allocations(problem, sm_count), q.device, out=out, **staged)


def _simulate(specs: list[BufferSpec], device, **given):
    returned, temporaries = allocate_missing(specs, device, **given)
    temporaries.clear()  # freed before the call returns
    return returned["out"], returned["lse"]
