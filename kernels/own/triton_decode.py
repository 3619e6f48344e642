"""mlamem's own sparse fp8 MLA decode in Triton, and its adapter: every buffer can come from the caller.

`sparse_mla_decode_triton(q, kv_cache, indices, sm_scale=..., d_v=512, out=, lse=,
accum_workspace=)` computes what FlashMLA's sparse decode computes, from the same fp8_ds_mla
cache and indices (-1 = invalid), into out (b, s_q, h_q, 512) bf16 and lse (b, h_q, s_q) fp32
(natural log; -inf and out = 0 for a query with no valid index, like the torch reference).

Buffers the caller does not pass are allocated as FlashMLA allocates them, in its order and
shapes (`flashmla_allocations`): out, lse, scheduler metadata, num_splits, lse_accum, o_accum,
the last four freed before return; so the alloc column of a profile compares with FlashMLA's.
With out=, lse= and accum_workspace= the call allocates nothing.

Native heads (`TritonNativeDecode`, `--kernel triton-native`): the same kernels at the rank's
own head count, 8, 16, 32, 64 or 128, so no padded q exists at all. A program takes all of a
rank's heads below 64 (padded to 16 rows in registers where fewer), 64 otherwise. Its allocation
spec is its own (`native_allocations`): out and lse at h_q heads, and the accumulators only when
the plan splits, sized to the splits it runs. `triton` keeps FlashMLA's head counts and
allocations, so its alloc column compares with FlashMLA's.

Split rule (`split_plan`): a call runs b * s_q * head_blocks(h_q) attention programs (h_q / 64,
or 1 below 64 heads). When that fills
the GPU's SMs, one program per (query, head block) walks the whole topk and writes out and lse
directly; no accumulators are touched. Otherwise the topk range is cut into splits whose partial
results go to the accumulators and a combine kernel merges them. The plan depends on shapes
only, never on which buffers were passed, so every path gives bit-identical results.

Which kernel runs (`triton_sparse_decode.runnable_config`): a call that fills the SMs runs the
Gluon warp-specialized kernel (`gluon_sparse_decode`, design gluon-bf16-scale: producer warps
gather and dequantize as FlashMLA does while two consumer warpgroups run the wgmmas) on an SM90
GPU whose triton has Gluon; elsewhere, and for
every call that splits, the Triton kernel runs (the scaled design at 64 heads and more, the
folded-f16 one below), with the reason in one line. The adapter's version() names the design,
e.g. "3.6.0 (gluon-bf16-scale)". Every design allocates the same buffers.

This module imports without triton (the planning is plain Python, tested on CPU); the kernels
are in `triton_sparse_decode`, imported when a call runs.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from mlamem.kernels.base import (
    SPARSE_DECODE,
    BufferSpec,
    Capabilities,
    KernelContract,
    OpInputs,
    Problem,
    allocate_missing,
)
from mlamem.kernels.flashmla import flashmla_allocations, num_sm_parts
from mlamem.kernels.fp8_ds_mla import BYTES_PER_TOKEN, NOPE_DIM, ROPE_DIM
from mlamem.kernels.own.tiles import DEFAULT_BLOCK_N, HEAD_BLOCK, MIN_DOT_ROWS, block_heads, head_blocks  # noqa: F401

D_QK = NOPE_DIM + ROPE_DIM  # 576
HEAD_COUNTS = (64, 128)  # as FlashMLA, so the two pad q alike
NATIVE_HEAD_COUNTS = (8, 16, 32, 64, 128)  # per-rank head counts the native kernel runs
NATIVE_BLOCK_N = 32  # below 64 heads: the native Triton fallback's (triton_sparse_decode)
DEFAULT_SM_COUNT = 132  # an H200's, for calls on the CPU (Triton's interpreter)
MIN_COMPUTE_CAPABILITY = (8, 9)  # fp8 e4m3 conversions
INSTALL_HINT = "pip install triton"


@functools.cache
def _import_triton():
    """(the triton module, None) or (None, the import error text)."""
    try:
        import triton
    except Exception as exc:  # ImportError, or a library that will not load
        return None, f"{type(exc).__name__}: {exc}"
    return triton, None


def triton_version() -> str | None:
    module, _ = _import_triton()
    return getattr(module, "__version__", None) if module else None


@dataclass(frozen=True)
class SplitPlan:
    """How one call cuts the topk range between attention programs."""

    num_splits: int  # splits per (batch, query, head block); 1: no accumulators, no combine
    tokens_per_split: int  # topk positions per split, a multiple of the loop's block_n

    @property
    def split(self) -> bool:
        return self.num_splits > 1


def max_splits(b: int, s_q: int, h_q: int, sm_count: int) -> int:
    """The most splits per query a call of this shape takes, whatever its topk: 1 when its
    programs fill the SMs, else ceil(sm_count / programs), at most 1 + num_sm_parts // b with
    FlashMLA's num_sm_parts, so that b * splits partial results fit in FlashMLA-shaped
    accumulators (b + num_sm_parts)."""
    programs = b * s_q * head_blocks(h_q)
    if programs >= sm_count:
        return 1
    return min(math.ceil(sm_count / programs), 1 + num_sm_parts(sm_count, s_q, h_q) // b)


def default_block_n(h_q: int) -> int:
    """KV tokens per loop step of the Triton config a call at h_q heads runs when it splits
    (the Gluon kernel never splits: such calls fall back to the Triton kernel)."""
    return DEFAULT_BLOCK_N if h_q >= HEAD_BLOCK else NATIVE_BLOCK_N


def split_plan(b: int, s_q: int, h_q: int, topk: int, sm_count: int,
               block_n: int | None = None) -> SplitPlan:
    """The split for a call (see the module docstring): max_splits, at most one per loop step
    of block_n tokens (default: the default config's at h_q heads)."""
    block_n = block_n or default_block_n(h_q)
    steps = max(math.ceil(topk / block_n), 1)
    wanted = min(max_splits(b, s_q, h_q, sm_count), steps)
    tokens_per_split = math.ceil(steps / wanted) * block_n
    return SplitPlan(math.ceil(topk / tokens_per_split), tokens_per_split)


def accum_workspace_numel(b: int, s_q: int, h_q: int, d_v: int, plan: SplitPlan) -> int:
    """fp32 elements of accumulator workspace one call needs: lse_accum then o_accum."""
    if not plan.split:
        return 0
    return b * plan.num_splits * s_q * h_q * (1 + d_v)


def max_accum_workspace_numel(b: int, h_q: int, d_v: int, topk: int, sm_count: int,
                              max_tokens: int) -> int:
    """fp32 elements that cover every call of up to max_tokens queries (reserve once at init).

    Only calls with b * s_q * h_q / 64 < sm_count split, so this is small (about
    2 * sm_count * h_q * (d_v + 1) floats, 35 MB at h_q = 64 on an H200) whatever max_tokens is.
    """
    return max((accum_workspace_numel(b, s_q, h_q, d_v, split_plan(b, s_q, h_q, topk, sm_count))
                for s_q in range(1, min(max_tokens, sm_count) + 1)), default=0)


def native_allocations(q_shape: tuple[int, ...], d_v: int, sm_count: int) -> list[BufferSpec]:
    """What one native-head call allocates, in order: out and lse at h_q heads; then, when the
    call's programs do not fill the SMs (so it may split), lse_accum and o_accum for
    b * max_splits partial results, freed before return. Nothing else: no padded q, and no
    accumulators for a call of T >= 132 queries on an H200."""
    b, s_q, h_q, _ = q_shape
    returned = [BufferSpec("out", (b, s_q, h_q, d_v), torch.bfloat16, "returned"),
                BufferSpec("lse", (b, h_q, s_q), torch.float32, "returned")]
    splits = max_splits(b, s_q, h_q, sm_count)
    if splits == 1:
        return returned
    entries = b * splits
    return returned + [
        BufferSpec("lse_accum", (entries, s_q, h_q), torch.float32, "temporary"),
        BufferSpec("o_accum", (entries, s_q, h_q, d_v), torch.float32, "temporary")]


def _check_inputs(q, kv_cache, indices, d_v, out, lse, native: bool) -> None:
    if q.dim() != 4 or q.shape[-1] != D_QK or q.dtype != torch.bfloat16 or q.stride(-1) != 1:
        raise ValueError(f"q must be (b, s_q, h_q, {D_QK}) bfloat16 with unit last stride, "
                         f"got {tuple(q.shape)} {q.dtype}")
    b, s_q, h_q, _ = q.shape
    if native and h_q not in NATIVE_HEAD_COUNTS and h_q % HEAD_BLOCK:
        raise ValueError(f"h_q must be one of {', '.join(map(str, NATIVE_HEAD_COUNTS[:-2]))} or a "
                         f"multiple of {HEAD_BLOCK}, got {h_q}")
    if not native and h_q % HEAD_BLOCK:
        raise ValueError(f"h_q must be a multiple of {HEAD_BLOCK}; pad q to "
                         f"{math.ceil(h_q / HEAD_BLOCK) * HEAD_BLOCK} heads")
    if d_v != NOPE_DIM:
        raise ValueError(f"d_v must be {NOPE_DIM} (the fp8_ds_mla latent), got {d_v}")
    if (kv_cache.dim() != 4 or kv_cache.shape[2:] != (1, BYTES_PER_TOKEN)
            or kv_cache.element_size() != 1 or kv_cache.stride(-1) != 1
            or kv_cache.stride(0) % 4 or kv_cache.stride(1) % 4):
        raise ValueError(f"kv_cache must be (num_blocks, block_size, 1, "
                         f"{BYTES_PER_TOKEN}) bytes, rows 4-byte aligned, got {tuple(kv_cache.shape)} "
                         f"{kv_cache.dtype}")
    if (indices.dim() != 3 or tuple(indices.shape[:2]) != (b, s_q)
            or indices.dtype != torch.int32 or indices.stride(-1) != 1):
        raise ValueError(f"indices must be ({b}, {s_q}, topk) int32 with unit last stride, "
                         f"got {tuple(indices.shape)} {indices.dtype}")
    if out is not None and (tuple(out.shape) != (b, s_q, h_q, d_v)
                            or out.dtype != torch.bfloat16 or out.stride(-1) != 1):
        raise ValueError(f"out must be ({b}, {s_q}, {h_q}, {d_v}) bfloat16 with unit last "
                         f"stride, got {tuple(out.shape)} {out.dtype}")
    if lse is not None and (tuple(lse.shape) != (b, h_q, s_q) or lse.dtype != torch.float32):
        raise ValueError(f"lse must be ({b}, {h_q}, {s_q}) float32, got {tuple(lse.shape)} "
                         f"{lse.dtype}")


def _accumulators_from(workspace: torch.Tensor, b, s_q, h_q, d_v, plan: SplitPlan):
    """lse_accum and o_accum as views of a caller's flat fp32 workspace (no allocation)."""
    needed = accum_workspace_numel(b, s_q, h_q, d_v, plan)
    if (workspace.dtype != torch.float32 or workspace.dim() != 1
            or not workspace.is_contiguous() or workspace.numel() < needed):
        raise ValueError(f"accum_workspace must be a contiguous 1-D float32 tensor of at least "
                         f"{needed} elements (see max_accum_workspace_numel), got "
                         f"{tuple(workspace.shape)} {workspace.dtype}")
    entries = b * plan.num_splits
    lse_numel = entries * s_q * h_q
    lse_accum = workspace[:lse_numel].view(entries, s_q, h_q)
    o_accum = workspace[lse_numel:needed].view(entries, s_q, h_q, d_v)
    return lse_accum, o_accum


def sparse_mla_decode_triton(q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor, *,
                             sm_scale: float, d_v: int = NOPE_DIM,
                             out: torch.Tensor | None = None, lse: torch.Tensor | None = None,
                             accum_workspace: torch.Tensor | None = None,
                             sm_count: int | None = None, config=None, native: bool = False):
    """out (b, s_q, h_q, 512) bf16 and lse (b, h_q, s_q) fp32 of the sparse fp8 decode.

    q (b, s_q, h_q, 576) bf16 with h_q a multiple of 64 (native: or 8, 16, 32); kv_cache
    (num_blocks, block_size, 1, 656) fp8_ds_mla bytes; indices (b, s_q, topk) int32, token i =
    block i // block_size, slot i % block_size, -1 = invalid. sm_count (default: q's device's,
    else 132) sets the split; config a `triton_sparse_decode.LaunchConfig`. Buffers not passed
    are allocated in FlashMLA's order and shapes (native: `native_allocations`); accumulators
    (from accum_workspace or allocated) are used only when the plan splits.
    """
    from mlamem.kernels.own import triton_sparse_decode as kernels

    _check_inputs(q, kv_cache, indices, d_v, out, lse, native)
    b, s_q, h_q, _ = q.shape
    if sm_count is None:
        sm_count = (torch.cuda.get_device_properties(q.device).multi_processor_count
                    if q.device.type == "cuda" else DEFAULT_SM_COUNT)
    topk = indices.shape[-1]
    config = config or kernels.DEFAULT_CONFIG
    config, _ = kernels.runnable_config(
        config, h_q, q.device, split_plan(b, s_q, h_q, topk, sm_count, config.block_n).split)
    plan = split_plan(b, s_q, h_q, topk, sm_count, config.block_n)

    specs = (native_allocations if native else flashmla_allocations)(tuple(q.shape), d_v, sm_count)
    returned, temporaries = allocate_missing(specs, q.device, out=out, lse=lse,
                                             accum_workspace=accum_workspace)
    out, lse = returned["out"], returned["lse"]

    lse_accum = o_accum = None
    if plan.split and accum_workspace is not None:
        lse_accum, o_accum = _accumulators_from(accum_workspace, b, s_q, h_q, d_v, plan)
    elif plan.split:
        entries = b * plan.num_splits  # <= b * max_splits <= b + num_sm_parts
        lse_accum = temporaries["lse_accum"][:entries]
        o_accum = temporaries["o_accum"][:entries]
    kernels.launch(q, kv_cache, indices, out, lse, lse_accum, o_accum, sm_scale=sm_scale,
                   num_splits=plan.num_splits, tokens_per_split=plan.tokens_per_split,
                   config=config)
    del lse_accum, o_accum
    temporaries.clear()  # freed before return, as FlashMLA frees its accumulators
    return out, lse


class TritonDecode(KernelContract):
    """mlamem's Triton sparse fp8 decode: takes out, lse and an accumulator workspace."""

    name = "triton"
    label = "Triton"
    native = False  # True: runs the rank's own head count (TritonNativeDecode)
    head_counts = HEAD_COUNTS

    def __init__(self, device: torch.device | None = None):
        self.device = device or torch.device("cuda")

    def unavailable_reason(self) -> str | None:
        module, error = _import_triton()
        if module is None:
            if error.startswith("ModuleNotFoundError"):
                return f"triton is not installed; {INSTALL_HINT}"
            return f"triton does not load ({error}); reinstall it: {INSTALL_HINT}"
        if not torch.cuda.is_available():
            return "no CUDA device"
        capability = torch.cuda.get_device_capability(self.device)
        if capability < MIN_COMPUTE_CAPABILITY:
            return (f"the Triton decode needs SM89 or newer (fp8 e4m3); this GPU is "
                    f"SM{capability[0]}{capability[1]}")
        from mlamem.kernels.own import triton_sparse_decode as kernels

        needed = kernels.shared_bytes(kernels.FALLBACK_CONFIG)  # 64 heads: the most a program takes
        offered = getattr(torch.cuda.get_device_properties(self.device),
                          "shared_memory_per_block_optin", None)
        if offered is not None and offered < needed:
            return (f"the Triton decode needs {needed // 1024} KiB of shared memory per program; "
                    f"this GPU offers {offered // 1024} KiB (H100, H200 and B200 offer 227 KiB); "
                    f"use kernel flashmla or reference")
        return None

    def version(self) -> str | None:
        """triton's version and, on a CUDA device, the design a call that fills the SMs runs at
        each head count (a kernel's identity: e.g. "3.6.0 (gluon-bf16-scale)"), or why the
        Triton fallback runs instead of the Gluon kernel. Calls that split the topk always run
        the Triton kernel."""
        version = triton_version()
        if version is None or not torch.cuda.is_available():
            return version
        from mlamem.kernels.own import triton_sparse_decode as kernels

        designs: dict[str, list[int]] = {}
        reasons = set()
        for heads in self.head_counts:
            config, reason = kernels.runnable_config(kernels.DEFAULT_CONFIG, heads,
                                                     self.device, splits=False)
            designs.setdefault(config.design, []).append(heads)
            reasons.add(reason)
        if len(designs) == 1:
            text = next(iter(designs))
        else:
            text = "; ".join(f"{design} at {', '.join(map(str, heads))} heads"
                             for design, heads in designs.items())
        reason = next((r for r in reasons if r), None)
        return f"{version} ({text}" + (f": {reason}" if reason else "") + ")"

    def capabilities(self, op: str = SPARSE_DECODE, kv_format: str | None = None) -> Capabilities:
        self._check(op)
        return Capabilities(takes_out=True, takes_lse=True, takes_accum_workspace=True,
                            head_counts=self.head_counts,
                            source="mlamem's Gluon and Triton kernels (kernels/own/triton_decode.py)")

    def run(self, problem: Problem, q, inputs: OpInputs, *, out=None, lse=None,
            accum_workspace=None):
        self._check(problem.op)
        return sparse_mla_decode_triton(q, inputs.kv, inputs.indices, sm_scale=problem.sm_scale,
                                        d_v=problem.d_v, out=out, lse=lse,
                                        accum_workspace=accum_workspace, native=self.native)

    def allocations(self, problem: Problem, sm_count: int) -> list[BufferSpec]:
        """FlashMLA's, by construction: the call allocates what FlashMLA's would, in order."""
        self._check(problem.op)
        return (native_allocations if self.native else flashmla_allocations)(
            problem.q_shape, problem.d_v, sm_count)

    def accum_numel(self, problem: Problem, sm_count: int) -> int:
        return max_accum_workspace_numel(1, problem.heads, problem.d_v, problem.topk, sm_count,
                                         problem.rows)

    def _check(self, op: str) -> None:
        if op != SPARSE_DECODE:
            raise ValueError(f"{self.label} does not run {op}")


class TritonNativeDecode(TritonDecode):
    """The same kernels at the rank's own head count (8, 16, 32, 64, 128): no padded q, and an
    allocation spec of its own (`native_allocations`)."""

    name = "triton-native"
    label = "Triton (native heads)"
    native = True
    head_counts = NATIVE_HEAD_COUNTS
