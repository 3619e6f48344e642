"""Adapters for FlashMLA's MLA kernels: sgl-flash-mla (PyPI), and the shared machinery of every
FlashMLA build (`FlashMLABuild`; vLLM's build is `kernels/flashmla_vllm.py`).

Operations, per build, as FlashMLA names them:
- sparse-decode: `sparse_decode_fwd` over the 656-byte fp8_ds_mla cache.
- dense-decode: `dense_decode_fwd` over a bf16 paged cache; over an fp8 cache (576 B per token,
  e4m3, per-tensor scales) `fwd_kvcache_mla_fp8`, whose split-KV scheduler metadata comes from
  `get_mla_decoding_metadata_dense_fp8` first. Seen on the H200 (scripts/kernel_trace.py): the
  fp8 kernel takes fp8 q only (bf16 q fails its dtype check), with `descale_q` and `descale_k`
  of shape (1,) both required ("descale is required when input dtype is fp8"). So the caller
  quantizes q: the engine's wrapper writes it into an fp8 buffer (`paths`: the alloc path's
  `quantized_q`, or the workspace's q), and it has no `out`.
- sparse-prefill: `sparse_prefill_fwd` over a gathered bf16 kv; returns out, max_logits, lse.
On SM90 sgl-flash-mla runs the "legacy" kernels (`torch.ops.flash_mla_legacy`).

What one call allocates was recorded with `torch.cuda.memory._record_memory_history` on an
H200 (`python3 scripts/kernel_trace.py OUT.json`, sgl-flash-mla 1.0.0 and vllm 0.33.0, torch
2.11.0+cu130, 2026-12-02), identical in both builds:
- sparse decode (b=1, s_q=8192, h_q=64): out, lse, scheduler metadata (32 B), num_splits (8 B),
  lse_accum, o_accum; the accumulators freed before return.
- dense decode bf16 (b=64 x 4096 and 256 x 8192, h_q=64): out (b,1,h,512) bf16, lse (b,h,1),
  scheduler metadata (132, 8) int32, num_splits (b+1) int32, lse_accum (b+132, h) fp32,
  o_accum (b+132, h, 512) fp32; the accumulators freed before return, the metadata returned.
- dense decode fp8: the metadata op allocates (132, 8) and (b+1) int32; then the call out, lse,
  lse_accum, o_accum, as bf16.
- sparse prefill (s_q 1024 and 8192, h_q 8 and 64): out (s_q,h,512) bf16, max_logits and lse
  (s_q,h) fp32; nothing else.
With `out_` (vLLM's build) out is not allocated and everything else is the same.
"""

from __future__ import annotations

import functools

import torch

from mlamem.kernels.base import (
    DENSE_DECODE,
    KV_FORMATS,
    SPARSE_DECODE,
    SPARSE_PREFILL,
    BufferSpec,
    Capabilities,
    KernelContract,
    OpInputs,
    Problem,
    operation_names,
)
from mlamem.kernels.fp8_ds_mla import BYTES_PER_TOKEN

INSTALL_HINT = "pip install --no-deps sgl-flash-mla==1.0.0"
CURRENT_KERNEL_FORMATS = (528,)  # bytes per token the SM100 current kernels read (V4.1 fp8)
HEAD_COUNTS = (64, 128)  # the sparse decode's, in every build
ALL_HEADS = (8, 16, 32, 64, 128)
PROBED = "probed on an H200 (SM90) by scripts/kernel_trace.py"

# sgl-flash-mla 1.0.0's schemas as the H200 registered them, for where flash_mla cannot load.
SGL_SCHEMAS = {
    "sparse_decode_fwd": "flash_mla_legacy::sparse_decode_fwd(Tensor q, Tensor kv, Tensor indices, Tensor? topk_length, Tensor? attn_sink, Tensor(a!)? tile_scheduler_metadata, Tensor(b!)? num_splits, Tensor? extra_kv, Tensor? extra_indices, Tensor? extra_topk_length, int d_v, float sm_scale, str? kv_format=None) -> (Tensor, Tensor, Tensor(a)?, Tensor(b)?)",  # noqa: E501
    "dense_decode_fwd": "flash_mla_legacy::dense_decode_fwd(Tensor q, Tensor kcache, int head_size_v, Tensor seqlens_k, Tensor block_table, float softmax_scale, bool is_causal, Tensor(a!)? tile_scheduler_metadata, Tensor(b!)? num_splits) -> (Tensor, Tensor, Tensor(a)?, Tensor(b)?)",  # noqa: E501
    "fwd_kvcache_mla_fp8": "flash_mla_legacy::fwd_kvcache_mla_fp8(Tensor q, Tensor kcache, int head_size_v, Tensor seqlens_k, Tensor block_table, float softmax_scale, bool is_causal, Tensor tile_scheduler_metadata, Tensor num_splits, Tensor? descale_q, Tensor? descale_k) -> Tensor[]",  # noqa: E501
    "sparse_prefill_fwd": "flash_mla_legacy::sparse_prefill_fwd(Tensor q, Tensor kv, Tensor indices, float sm_scale, int d_v, Tensor? attn_sink=None, Tensor? topk_length=None, bool return_log2_stats=False, bool return_stats=True) -> Tensor?[]",  # noqa: E501
}
SGL_HEADS = {SPARSE_DECODE: HEAD_COUNTS, DENSE_DECODE: ALL_HEADS, SPARSE_PREFILL: HEAD_COUNTS}


def schema_op(op: str, kv_format: str | None) -> str:
    """FlashMLA's op for an operation (the dense decode's depends on the cache)."""
    if op == DENSE_DECODE:
        return "fwd_kvcache_mla_fp8" if kv_format == "fp8" else "dense_decode_fwd"
    return {SPARSE_DECODE: "sparse_decode_fwd", SPARSE_PREFILL: "sparse_prefill_fwd"}[op]


def schema_arguments(schema: str) -> list[str]:
    """Argument names of an op schema string."""
    return [arg.name for arg in torch._C.parse_schema(schema).arguments]


def capabilities_from_schema(schema: str, heads: tuple[int, ...], kv_formats: tuple[str, ...],
                             source: str, heads_source: str, assumed: bool) -> Capabilities:
    """What a FlashMLA op takes, read off its schema: out (`out` or `out_`), lse, accumulators."""
    names = set(schema_arguments(schema))
    return Capabilities(takes_out=bool(names & {"out", "out_"}),
                        takes_lse=bool(names & {"lse", "lse_", "softmax_lse"}),
                        takes_accum_workspace="o_accum" in names, head_counts=heads,
                        source=source, kv_formats=kv_formats, heads_source=heads_source,
                        assumed=assumed)


class FlashMLABuild(KernelContract):
    """One FlashMLA build: its op namespaces, schemas and head counts; the calls are shared."""

    operations = operation_names()  # every shipped operation
    assumed_schemas: dict[str, str]  # op -> schema, where the library cannot be loaded
    assumed_source: str  # says which build's schemas are assumed
    head_table: dict[str, tuple[int, ...]]  # per operation, on SM90 (probed)

    def __init__(self, device: torch.device | None = None):
        self.device = device or torch.device("cuda")

    def namespace(self, op_name: str):
        """The torch.ops namespace holding `op_name` (the library is loaded)."""
        raise NotImplementedError

    def target_reason(self, gpu: str, compute_capability: str) -> str | None:
        """FlashMLA's kernels are SM90's (modelled, probed on the H200) and SM100's, whose split-KV
        partitions differ (FlashMLA 9241ae3 csrc/api/sparse_decode.h: SM90's get_meta takes
        max(num_sms / s_q / (h_q / 64), 1), SM100's max(num_sms / s_q, 1) at 64 and 128 heads),
        not measured here: refused, as any other architecture, which has no FlashMLA kernel."""
        major = compute_capability.split(".")[0]
        if major == "9":
            return None
        pick = ('pick an SM90 target (--gpu "H100 SXM 80GB", "H200 SXM 141GB") or another kernel '
                "(`mlamem kernels`)")
        if major == "10":
            return (f"{self.label}'s SM100 kernels ({gpu}, compute capability "
                    f"{compute_capability}) are not modelled: their split-KV accumulators take "
                    "max(num_sms / s_q, 1) partitions, not SM90's (FlashMLA csrc/api/"
                    f"sparse_decode.h), and were not measured here; {pick}")
        return (f"{self.label} has no kernel for the {gpu} (compute capability "
                f"{compute_capability}): FlashMLA runs on SM90 and SM100 only; {pick}")

    def _schema(self, op_name: str) -> tuple[str, bool]:
        """(schema, assumed) for an op: read at run time where the library loads."""
        if self.unavailable_reason() is None:
            try:
                return str(getattr(self.namespace(op_name), op_name).default._schema), False
            except (AttributeError, RuntimeError):
                pass
        return self.assumed_schemas[op_name], True

    def head_counts(self, op: str) -> tuple[tuple[int, ...], str]:
        """The heads `op` runs natively on this GPU, and where that comes from."""
        if torch.cuda.is_available() and torch.cuda.get_device_capability(self.device)[0] != 9:
            return HEAD_COUNTS, "assumed 64 and 128 off SM90 (FlashMLA's SM100 kernels)"
        return self.head_table[op], PROBED

    @functools.cache  # noqa: B019 (one adapter per process)
    def capabilities(self, op: str = SPARSE_DECODE, kv_format: str | None = None) -> Capabilities:
        if op not in self.operations:
            raise ValueError(f"{self.label} does not run {op}")
        name = schema_op(op, kv_format)
        schema, assumed = self._schema(name)
        heads, heads_source = self.head_counts(op)
        where = schema.split("(", 1)[0]
        source = (f"{self.assumed_source}, assumed: not loaded here" if assumed
                  else f"op schema torch.ops.{where.replace('::', '.')}, read at run time")
        formats = ((kv_format,) if kv_format else KV_FORMATS[op])
        return capabilities_from_schema(schema, heads, formats, source, heads_source, assumed)

    def run(self, problem: Problem, q, inputs: OpInputs, *, out=None, **staged):
        if staged:
            raise TypeError(f"{self.label} takes no {', '.join(staged)}")
        if out is not None and not self.capabilities(problem.op, problem.kv_format).takes_out:
            raise TypeError(f"this {self.label} {problem.op} takes no out")
        if problem.op == SPARSE_DECODE:
            return self._sparse_decode(q, inputs.kv, inputs.indices, sm_scale=problem.sm_scale,
                                       d_v=problem.d_v, out=out)
        if problem.op == DENSE_DECODE and problem.kv_format == "fp8":
            ns = self.namespace("fwd_kvcache_mla_fp8")
            meta, splits = ns.get_mla_decoding_metadata_dense_fp8(
                inputs.seqlens, q.shape[1] * q.shape[2], 1)
            out, lse = ns.fwd_kvcache_mla_fp8(q, inputs.kv, problem.d_v, inputs.seqlens,
                                              inputs.block_table, problem.sm_scale, False, meta,
                                              splits, inputs.descale_q, inputs.descale_k)
            return out, lse
        if problem.op == DENSE_DECODE:
            result = self.namespace("dense_decode_fwd").dense_decode_fwd(
                q, inputs.kv, problem.d_v, inputs.seqlens, inputs.block_table, problem.sm_scale,
                False, None, None, *self._out_argument(out))
            return result[0], result[1]
        result = self._prefill(q, inputs, problem, out)
        return result[0], result[2]

    def _out_argument(self, out) -> tuple:
        """The trailing out argument of the build's ops: none, or `out_`."""
        return ()

    def _prefill(self, q, inputs: OpInputs, problem: Problem, out):
        return self.namespace("sparse_prefill_fwd").sparse_prefill_fwd(
            q, inputs.kv, inputs.indices, problem.sm_scale, problem.d_v, None, None, False, True)

    def allocations(self, problem: Problem, sm_count: int) -> list[BufferSpec]:
        return flashmla_op_allocations(problem, sm_count)

    def _sparse_decode(self, q, kv_cache, indices, *, sm_scale: float, d_v: int, out=None):
        raise NotImplementedError


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


class FlashMLA(FlashMLABuild):
    """sgl-flash-mla: allocates out, lse, scheduler metadata and split-KV accumulators."""

    name = "flashmla"
    label = "FlashMLA"
    assumed_schemas = SGL_SCHEMAS
    assumed_source = "sgl-flash-mla 1.0.0 schema"
    head_table = SGL_HEADS

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
            return f"FlashMLA needs SM90 or SM100; this GPU is SM{major}{minor}"
        if _use_legacy(self.device) and not module.has_legacy():
            return "this flash_mla build has no legacy (SM90 / fp8_ds_mla) kernels"
        return None

    def version(self) -> str | None:
        module, _ = _import_flash_mla()
        return getattr(module, "__version__", None) if module else None

    def namespace(self, op_name: str):
        return torch.ops.flash_mla_legacy if _use_legacy(self.device) else torch.ops.flash_mla

    def _sparse_decode(self, q, kv_cache, indices, *, sm_scale: float, d_v: int, out=None):
        module, _ = _import_flash_mla()
        if out is not None:
            raise TypeError("this FlashMLA build takes no out= argument")
        sched_meta, _ = module.get_mla_metadata()  # fresh per call, as per engine step
        return module.flash_mla_with_kvcache(
            q, kv_cache, None, None, d_v, sched_meta, softmax_scale=sm_scale,
            indices=indices, use_legacy=_use_legacy(q.device))


def num_sm_parts(sm_count: int, s_q: int, h_q: int) -> int:
    """FlashMLA's split-KV partitions on SM90, max(sm_count // s_q // ceil(h_q / 64), 1): the
    SMs over the call's 64-head query tiles, at least 1. FlashMLA's sparse decode computes
    `max(num_sms / s_q / (h_q / 64), 1)` for its 64 and 128 heads (csrc/api/sparse_decode.h,
    `Decode_Sm90_Impl::get_meta`), its dense decode `max(num_sms / h_k / ceil_div(s_q * h_q /
    h_k, 64), 1)` with h_k = 1 (csrc/api/dense_decode.h), the same at the s_q = 1 it is called
    with here. Below 64 heads a call is one tile, as the Triton decode's programs are."""
    return max(sm_count // s_q // -(-h_q // 64), 1)


def flashmla_allocations(q_shape: tuple[int, ...], d_v: int, sm_count: int) -> list[BufferSpec]:
    """What one FlashMLA sparse decode call allocates, in order, as recorded on an H200 with
    `torch.cuda.memory._record_memory_history` (sgl-flash-mla 1.0.0, b=1, s_q=8192, h_q=64):
    out, lse, scheduler metadata (32 B), num_splits (8 B), lse_accum, o_accum.

    The split-KV accumulators hold b + num_sm_parts(sm_count, s_q, h_q) partial results; they
    are freed before return.
    """
    b, s_q, h_q, _ = q_shape
    parts = num_sm_parts(sm_count, s_q, h_q)
    splits = b + parts
    return [
        BufferSpec("out", (b, s_q, h_q, d_v), torch.bfloat16, "returned"),
        BufferSpec("lse", (b, h_q, s_q), torch.float32, "returned"),
        BufferSpec("scheduler_metadata", (parts, 8), torch.int32, "temporary"),
        BufferSpec("num_splits", (b + 1,), torch.int32, "temporary"),
        BufferSpec("lse_accum", (splits, s_q, h_q), torch.float32, "temporary"),
        BufferSpec("o_accum", (splits, s_q, h_q, d_v), torch.float32, "temporary"),
    ]


def flashmla_op_allocations(problem: Problem, sm_count: int) -> list[BufferSpec]:
    """What one call of any FlashMLA operation allocates, in order (module docstring)."""
    if problem.op == SPARSE_DECODE:
        return flashmla_allocations(problem.q_shape, problem.d_v, sm_count)
    if problem.op == SPARSE_PREFILL:
        s_q, h_q = problem.rows, problem.heads
        return [BufferSpec("out", (s_q, h_q, problem.d_v), torch.bfloat16, "returned"),
                BufferSpec("max_logits", (s_q, h_q), torch.float32, "returned"),
                BufferSpec("lse", (s_q, h_q), torch.float32, "returned")]
    b, h_q = problem.rows, problem.heads
    parts = num_sm_parts(sm_count, 1, h_q)
    metadata = [BufferSpec("scheduler_metadata", (parts, 8), torch.int32, "temporary"),
                BufferSpec("num_splits", (b + 1,), torch.int32, "temporary")]
    outputs = [BufferSpec("out", (b, 1, h_q, problem.d_v), torch.bfloat16, "returned"),
               BufferSpec("lse", (b, h_q, 1), torch.float32, "returned")]
    accumulators = [BufferSpec("lse_accum", (b + parts, h_q), torch.float32, "temporary"),
                    BufferSpec("o_accum", (b + parts, h_q, problem.d_v), torch.float32,
                               "temporary")]
    if problem.kv_format == "fp8":  # the metadata op runs first
        return metadata + outputs + accumulators
    return outputs + metadata + accumulators
