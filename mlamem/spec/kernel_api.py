"""The kernel contract (spec): the one interface every MLA kernel adapter implements.

A kernel runs some of the registered operations (`mlamem.operations`, each with its problem,
kernel layout and inputs): `run(problem, q, inputs, *, out, lse, accum_workspace)`,
`allocations(problem, sm_count)`, `capabilities(op, kv_format)`, `version()`,
`unavailable_reason()` (see `KernelContract`). lse is always the natural log. Kernels whose
capabilities say so take `out=` (and `lse=` and `accum_workspace=`, a flat float32 tensor of at
least `accum_numel(problem, sm_count)` elements; a kernel given one allocates none of its
temporaries). Plug-ins of contract 1 (`SparseDecodeKernel`: decode/allocations(q_shape)) run
through `LegacyKernel`; the registry checks `contract` (`adapted`).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, NamedTuple

from mlamem.operations import (  # noqa: F401  (the contract speaks in these; adapters import them here)
    DENSE_DECODE,
    KV_FORMATS,
    SPARSE_DECODE,
    SPARSE_PREFILL,
    OpInputs,
    Problem,
    from_kernel_layout,
    operation,
    operation_names,
    to_kernel_layout,
    to_kernel_layout_shape,
)

if TYPE_CHECKING:  # importing the declarations needs no torch (the CLI's checks use them)
    import torch


CONTRACT_VERSION = 2  # run/allocations(problem); 1: decode/allocations(q_shape) (see LegacyKernel)


class KernelEntry(NamedTuple):
    """Where an adapter lives and what it is, in one line."""

    module: str  # importable module path of the adapter
    cls: str  # the KernelContract subclass in it (or a contract-1 SparseDecodeKernel)
    help: str  # one line for `--kernel` help and listings
    operations: tuple[str, ...] = ("sparse-decode",)  # what it runs (see operation_names)
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


class KernelContract(ABC):
    """Adapter for one MLA kernel implementation: the one interface every caller uses.

    `run(problem, q, inputs, *, out, lse, accum_workspace)` runs one call of any operation it
    runs; `allocations(problem, sm_count)` says what that call allocates inside itself;
    `capabilities(op, kv_format)` what the caller may pass in, and at which head counts;
    `version()` and `unavailable_reason()` what is installed here. An adapter implements these
    for the operations it runs (`operations`), and nothing for the others."""

    contract = CONTRACT_VERSION  # the interface this class implements (the registry checks it)
    name: str  # the --kernel name
    label: str  # how reports name it, e.g. "FlashMLA"
    runs_on_meta = False  # True if run itself runs on the meta device (no spec needed)
    operations: tuple[str, ...] = (SPARSE_DECODE,)  # what it runs, in operation_names() order

    @abstractmethod
    def unavailable_reason(self) -> str | None:
        """None when the kernel can run here, else why not (one line, naming the fix)."""

    def version(self) -> str | None:
        """The installed build's version; None when unknown or absent."""
        return None

    def target_reason(self, gpu: str, compute_capability: str) -> str | None:
        """None when the kernel's allocations are modelled on a target GPU `gpu` of
        `compute_capability` (e.g. "9.0"), else why not (one line, naming the fix). By default
        every architecture is: an adapter whose kernels exist for some only says so."""
        return None

    @abstractmethod
    def capabilities(self, op: str = SPARSE_DECODE, kv_format: str | None = None) -> Capabilities:
        """What the caller may pass in for `op` over `kv_format` (None: any it reads); read from
        the kernel itself where possible. An operation it does not run is a ValueError."""

    @abstractmethod
    def run(self, problem: Problem, q, inputs: OpInputs, *, out=None, lse=None,
            accum_workspace=None):
        """Run one call of problem.op (q, out and lse in its kernel layout); returns (out, lse).
        lse= and accum_workspace= come only where the capabilities say the kernel takes them."""

    @abstractmethod
    def allocations(self, problem: Problem, sm_count: int) -> list[BufferSpec]:
        """The buffers one call of `problem` allocates inside itself, in allocation order."""

    def accum_numel(self, problem: Problem, sm_count: int) -> int:
        """For a kernel that takes accum_workspace=: float32 elements of a workspace covering
        every call of up to problem.rows rows (reserved once, as an engine would); else 0."""
        return 0

    def make_inputs(self, problem: Problem, heads: int, device, seed: int = 0):
        """Valid synthetic inputs for `problem`: the operation's own (`Operation.make_inputs`);
        an adapter whose inputs need preparing (FlashInfer's planned wrapper) adds to them."""
        return operation(problem.op).make_inputs(problem, heads, device, seed)


class SparseDecodeKernel(ABC):
    """Kernel contract 1, as plug-ins written before contract 2 implement it: the sparse decode
    only, through `decode(q, kv_cache, indices, *, sm_scale, d_v, out=None)` and
    `allocations(q_shape, d_v, sm_count)` (and, taking accumulators, `accum_workspace_numel(b,
    max_tokens, h_q, topk, d_v, sm_count)`). The registry runs such a class through
    `LegacyKernel`; new adapters implement `KernelContract`."""

    contract = 1
    runs_on_meta = False
    operations: tuple[str, ...] = (SPARSE_DECODE,)

    @abstractmethod
    def unavailable_reason(self) -> str | None: ...

    def version(self) -> str | None:
        return None

    @abstractmethod
    def capabilities(self, op: str = SPARSE_DECODE) -> Capabilities: ...

    @abstractmethod
    def decode(self, q, kv_cache, indices, *, sm_scale: float, d_v: int, out=None): ...

    @abstractmethod
    def allocations(self, q_shape: tuple[int, ...], d_v: int, sm_count: int) -> list[BufferSpec]: ...

    def accum_workspace_numel(self, b: int, max_tokens: int, h_q: int, topk: int, d_v: int,
                              sm_count: int) -> int:
        return 0


class LegacyKernel(KernelContract):
    """A contract-1 adapter (`legacy`, a SparseDecodeKernel class) seen through contract 2."""

    legacy: type[SparseDecodeKernel]

    def __init__(self, *args, **kwargs) -> None:
        self.kernel = self.legacy(*args, **kwargs)

    def unavailable_reason(self) -> str | None:
        return self.kernel.unavailable_reason()

    def version(self) -> str | None:
        return self.kernel.version()

    def capabilities(self, op: str = SPARSE_DECODE, kv_format: str | None = None) -> Capabilities:
        self._check(op)
        return self.kernel.capabilities(op)

    def run(self, problem: Problem, q, inputs: OpInputs, *, out=None, **staged):
        self._check(problem.op)
        return self.kernel.decode(q, inputs.kv, inputs.indices, sm_scale=problem.sm_scale,
                                  d_v=problem.d_v, out=out, **staged)

    def allocations(self, problem: Problem, sm_count: int) -> list[BufferSpec]:
        self._check(problem.op)
        return self.kernel.allocations(problem.q_shape, problem.d_v, sm_count)

    def accum_numel(self, problem: Problem, sm_count: int) -> int:
        return self.kernel.accum_workspace_numel(1, problem.rows, problem.heads, problem.topk,
                                                 problem.d_v, sm_count)

    def _check(self, op: str) -> None:
        if op != SPARSE_DECODE:
            raise ValueError(f"{self.label} (kernel contract 1) runs only {SPARSE_DECODE}, not {op}")


def contract_mismatch(cls) -> str | None:
    """Why `cls` cannot be used as a kernel adapter (one line), or None."""
    version = getattr(cls, "contract", None)
    if not isinstance(cls, type) or not issubclass(cls, (KernelContract, SparseDecodeKernel)):
        return "is not a KernelContract subclass"
    if version not in (1, CONTRACT_VERSION):
        return (f"implements kernel contract {version!r}; this mlamem implements "
                f"{CONTRACT_VERSION} (and adapts 1)")
    return None


def adapted(cls) -> type[KernelContract]:
    """`cls` as a contract-2 adapter: itself, or a contract-1 class through LegacyKernel.
    A ValueError (one line) for a class of another contract."""
    mismatch = contract_mismatch(cls)
    if mismatch is not None:
        raise ValueError(f"{cls!r} {mismatch}")
    if cls.contract == CONTRACT_VERSION:
        return cls
    return type(cls.__name__, (LegacyKernel,), {
        "legacy": cls, "name": cls.name, "label": cls.label, "runs_on_meta": cls.runs_on_meta,
        "operations": (SPARSE_DECODE,), "__module__": cls.__module__, "__doc__": cls.__doc__})


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


def simulate_run(kernel: KernelContract, sm_count: int, problem: Problem, q, inputs,
                 *, out=None, **staged):
    """`kernel.run` as its allocation spec, on q's device (meta), in its order: what one call
    allocates, buffers passed in excepted (see `allocated_in_call`); returns (out, lse) like
    the kernel, where the kernel cannot run."""
    return _simulate(kernel.allocations(problem, sm_count), q.device, out=out, **staged)


def _simulate(specs: list[BufferSpec], device, **given):
    returned, temporaries = allocate_missing(specs, device, **given)
    temporaries.clear()  # freed before the call returns
    return returned["out"], returned["lse"]
