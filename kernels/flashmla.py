"""Adapter for FlashMLA's sparse fp8 decode (`flash_mla.flash_mla_with_kvcache`, PyPI sgl-flash-mla).

On SM90 it runs the "legacy" kernels (`use_legacy=True`); on SM100 the current ones, which read
only the V4.1 KV formats, so a 656-byte fp8_ds_mla cache goes to the legacy half there too.
"""

from __future__ import annotations

import functools

import torch

from mlamem.kernels.base import BufferSpec, Capabilities, SparseDecodeKernel
from mlamem.kernels.fp8_ds_mla import BYTES_PER_TOKEN

INSTALL_HINT = "pip install --no-deps sgl-flash-mla==1.0.0"
CURRENT_KERNEL_FORMATS = (528,)  # bytes per token the SM100 current kernels read (V4.1 fp8)
HEAD_COUNTS = (64, 128)
# Schema facts of sgl-flash-mla 1.0.0, used where flash_mla cannot be imported (predictions).
ASSUMED_SCHEMA = "sgl-flash-mla 1.0.0 schema, assumed: flash_mla is not importable here"


@functools.cache
def _import_flash_mla():
    """The flash_mla module, or the ImportError text."""
    try:
        import flash_mla
    except Exception as exc:  # an ImportError, or an OSError from a library that won't load
        return None, f"{type(exc).__name__}: {exc}"
    return flash_mla, None


def _use_legacy(device: torch.device) -> bool:
    major, _ = torch.cuda.get_device_capability(device)
    return major == 9 or BYTES_PER_TOKEN not in CURRENT_KERNEL_FORMATS


class FlashMLA(SparseDecodeKernel):
    """FlashMLA sparse fp8 decode; allocates out, lse, scheduler metadata and split-KV accumulators."""

    name = "flashmla"
    label = "FlashMLA"

    def __init__(self, device: torch.device | None = None):
        self.device = device or torch.device("cuda")

    def unavailable_reason(self) -> str | None:
        module, error = _import_flash_mla()
        if module is None:
            if error.startswith("ModuleNotFoundError"):
                return f"flash_mla is not installed; {INSTALL_HINT}"
            return f"flash_mla does not load ({error}); reinstall it: {INSTALL_HINT}"
        if not torch.cuda.is_available():
            return "no CUDA device"
        major, minor = torch.cuda.get_device_capability(self.device)
        if major not in (9, 10):
            return f"FlashMLA sparse decode needs SM90 or SM100; this GPU is SM{major}{minor}"
        if _use_legacy(self.device) and not module.has_legacy():
            return "this flash_mla build has no legacy (SM90 / fp8_ds_mla) kernels"
        return None

    def version(self) -> str | None:
        module, _ = _import_flash_mla()
        return getattr(module, "__version__", None) if module else None

    def _schema_arguments(self) -> list[str] | None:
        if self.unavailable_reason() is not None:
            return None
        ops = torch.ops.flash_mla_legacy if _use_legacy(self.device) else torch.ops.flash_mla
        return [arg.name for arg in ops.sparse_decode_fwd.default._schema.arguments]

    @functools.cache  # noqa: B019 (one adapter per process)
    def capabilities(self) -> Capabilities:
        names = self._schema_arguments()
        if names is None:
            return Capabilities(takes_out=False, takes_lse=False, takes_accum_workspace=False,
                                head_counts=HEAD_COUNTS, source=ASSUMED_SCHEMA)
        half = "flash_mla_legacy" if _use_legacy(self.device) else "flash_mla"
        return Capabilities(
            takes_out="out" in names,
            takes_lse="lse" in names or "softmax_lse" in names,
            takes_accum_workspace="o_accum" in names,
            head_counts=HEAD_COUNTS,
            source=f"op schema torch.ops.{half}.sparse_decode_fwd, read at run time",
        )

    def decode(self, q, kv_cache, indices, *, sm_scale: float, d_v: int, out=None):
        module, _ = _import_flash_mla()
        if out is not None and not self.capabilities().takes_out:
            raise TypeError("this FlashMLA build takes no out= argument")
        sched_meta, _ = module.get_mla_metadata()  # fresh per call, as per engine step
        if out is None:
            return module.flash_mla_with_kvcache(
                q, kv_cache, None, None, d_v, sched_meta, softmax_scale=sm_scale,
                indices=indices, use_legacy=_use_legacy(q.device))
        ops = torch.ops.flash_mla_legacy if _use_legacy(q.device) else torch.ops.flash_mla
        result = ops.sparse_decode_fwd(q, kv_cache, indices, None, None, None, None, None, None,
                                       None, d_v, sm_scale, out=out)
        return result[0], result[1]

    def allocations(self, q_shape, d_v, sm_count):
        return flashmla_allocations(q_shape, d_v, sm_count)


def flashmla_allocations(q_shape: tuple[int, ...], d_v: int, sm_count: int) -> list[BufferSpec]:
    """What one FlashMLA call allocates, in order, as recorded on an H200 with
    `torch.cuda.memory._record_memory_history` (sgl-flash-mla 1.0.0, b=1, s_q=8192, h_q=64):
    out, lse, scheduler metadata (32 B), num_splits (8 B), lse_accum, o_accum.

    The split-KV accumulators hold b + num_sm_parts partial results, with
    num_sm_parts = max(sm_count // s_q // (h_q // 64), 1); they are freed before return.
    """
    b, s_q, h_q, _ = q_shape
    num_sm_parts = max(sm_count // s_q // (h_q // 64), 1)
    splits = b + num_sm_parts
    return [
        BufferSpec("out", (b, s_q, h_q, d_v), torch.bfloat16, "returned"),
        BufferSpec("lse", (b, h_q, s_q), torch.float32, "returned"),
        BufferSpec("scheduler_metadata", (num_sm_parts, 8), torch.int32, "temporary"),
        BufferSpec("num_splits", (b + 1,), torch.int32, "temporary"),
        BufferSpec("lse_accum", (splits, s_q, h_q), torch.float32, "temporary"),
        BufferSpec("o_accum", (splits, s_q, h_q, d_v), torch.float32, "temporary"),
    ]
