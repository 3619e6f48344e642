"""Adapter for FlashInfer's MLA dense decode: `flashinfer.mla.BatchMLAPagedAttentionWrapper`,
backend "fa3" (SM90), over a bf16 paged cache, one query per request.

An engine runs it in three steps, and so does this adapter:
- at init, the float workspace (128 MiB, uint8) that holds the split-KV partial outputs, given
  to the wrapper's constructor;
- once per step, `plan(...)` from the step's metadata (the metadata builder's work): qo_indptr
  arange(b+1), kv_indptr and kv_indices (the block table, flattened), kv_len_arr (the context
  lengths). The fa3 backend's plan allocates its int workspace there, 8 MiB on the GPU
  (`_BatchMLAGeneratedFaMechanics.__init__` in flashinfer/mla/_batch_mla/_backends/
  _fa_common.py; 8 MiB persistent, as seen on the H200), and a pinned host copy;
- the call, `run(q_nope, q_pe, ckv_cache, kpe_cache, out=, lse=, return_lse=True)`.
`make_inputs` does the first two, so the measured call is `run` alone, as in an engine's step.
On the meta device (predictions) it allocates the same device tensors in the same order: the
float workspace, the two indptr arrays and an 8 MiB stand-in for the int workspace.

What the call allocates (flashinfer-python 0.7.2.post1 on an H200, torch 2.11.0+cu130, 64
heads, page 64): with out and lse given, nothing (peak delta 0, the given buffers returned);
without, out (b, h, 512) bf16 then lse (b, h) fp32, as `_run_generated_fa` writes it
(`torch.empty_like(q_nope)`, then `torch.empty(q_nope.shape[:2])`): 16,842,752 B at b=256.
The spec writes them in mlamem's dense decode layout, (b, 1, h, 512) and (b, h, 1): the same
bytes. Its LSE is base 2 (the legacy flat-CSR plan's dynamic LSE); `run` turns it into the
natural log in place (`mul_(ln 2)`, no allocation). (The kernel could do it itself with
`return_lse_base_on_e=True`; not used, as it was not run on the H200.)

q and the cache are passed as views of mlamem's tensors: q_nope = q[:, 0, :, :512], q_pe =
q[:, 0, :, 512:], ckv = kv[:, :, 0, :512], kpe = kv[:, :, 0, 512:]. The fa3 run reads the
strides of all four (`BatchMLAPagedAttentionSM90Run`, data/csrc/batch_mla_sm90_run.cu), and
the wrapper's own packed-input path hands the kernel exactly such slices
(`_split_packed_last_dim`), but the H200 run passed contiguous tensors: the GPU tests settle
it. out is written through its strides; lse must be contiguous (b, h).

Head counts: fa3 packs (request, head) rows into 64-row query tiles, num_heads a runtime
divisor (mla_hopper.cuh, scheduler.cuh), and a non-causal plan checks no head count
(`_validate_generated_fa_plan` checks head dims, dtypes and SM90 only); so every count runs
natively. 1 to 128 are declared (128: the most an MLA model has per rank); the H200 ran 64.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import math
from dataclasses import dataclass, fields
from typing import Any

import torch

from mlamem.kernels.base import (
    DENSE_DECODE,
    BufferSpec,
    Capabilities,
    KernelContract,
    OpInputs,
    Problem,
)

DISTRIBUTION = "flashinfer-python"
INSTALL_HINT = ("pip install flashinfer-python==0.7.2.post1 (its MLA kernels JIT-compile with "
                "nvcc and ninja on first use)")
BACKEND = "fa3"
FLOAT_WORKSPACE_BYTES = 128 << 20  # reserved at engine init, given to the wrapper
INT_WORKSPACE_BYTES = 8 << 20  # the fa3 backend's plan allocates it on the GPU
KV_FORMATS = ("bf16",)
HEAD_COUNTS = tuple(range(1, 129))
LN2 = math.log(2.0)
SOURCE = ("flashinfer-python 0.7.2.post1 source: BatchMLAPagedAttentionWrapper.run takes out= "
          "and lse=; its split-KV partials live in the float workspace given at construction")
HEADS_SOURCE = ("flashinfer 0.7.2.post1 source: fa3 packs (request, head) rows into 64-row "
                "tiles, num_heads a runtime divisor, so any count runs; 64 run on an H200")


@dataclass
class FlashInferInputs(OpInputs):
    """The dense decode's inputs plus what the engine prepared before the step's call."""

    wrapper: Any = None  # the planned BatchMLAPagedAttentionWrapper (None on the meta device)
    plan_buffers: tuple = ()  # float workspace, qo_indptr, kv_indptr (+ int workspace on meta)


@functools.cache
def _import_flashinfer():
    """The flashinfer.mla module, or the ImportError text."""
    try:
        import flashinfer.mla as module
    except Exception as exc:  # an ImportError, or a library (or JIT setup) that won't load
        return None, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return module, None


def _installed() -> bool:
    try:
        return importlib.util.find_spec("flashinfer") is not None
    except (ImportError, ValueError):
        return False


class FlashInferMLA(KernelContract):
    """FlashInfer's MLA decode (fa3): takes out and lse; its accumulators are its workspace's."""

    name = "flashinfer"
    label = "FlashInfer MLA"
    operations = (DENSE_DECODE,)

    def __init__(self, device: torch.device | None = None):
        self.device = device or torch.device("cuda")

    def unavailable_reason(self) -> str | None:
        if not _installed():
            return f"flashinfer is not installed; {INSTALL_HINT}"
        if not torch.cuda.is_available():
            return "no CUDA device"
        major, minor = torch.cuda.get_device_capability(self.device)
        if major != 9:  # fa3: "fa3 MLA requires SM90 and CUDA >= 12.3" (_fa_common.py)
            return f"FlashInfer's fa3 MLA decode needs SM90; this GPU is SM{major}{minor}"
        module, error = _import_flashinfer()
        if module is None:
            return f"flashinfer does not load ({error}); reinstall it: {INSTALL_HINT}"
        return None

    def version(self) -> str | None:
        try:
            return importlib.metadata.version(DISTRIBUTION)
        except importlib.metadata.PackageNotFoundError:
            return None

    def capabilities(self, op: str = DENSE_DECODE, kv_format: str | None = None) -> Capabilities:
        """Declared from the source (no schema to read); asking for another cache than bf16
        gets the same answer, whose kv_formats says what it reads."""
        if op not in self.operations:
            raise ValueError(f"{self.label} does not run {op}")
        return Capabilities(takes_out=True, takes_lse=True, takes_accum_workspace=False,
                            head_counts=HEAD_COUNTS, source=SOURCE, kv_formats=KV_FORMATS,
                            heads_source=HEADS_SOURCE)

    def _check(self, problem: Problem) -> None:
        if problem.op not in self.operations:
            raise NotImplementedError(f"{self.label} does not run {problem.op}")
        if problem.kv_format not in KV_FORMATS:
            raise NotImplementedError(f"this {self.label} adapter reads a bf16 cache only, not "
                                      f"{problem.kv_format}: pick a bf16 scenario")

    def make_inputs(self, problem: Problem, heads: int, device, seed: int = 0):
        """mlamem's synthetic inputs, then what the engine does before the call: the float
        workspace (init) and the plan (the step's metadata)."""
        self._check(problem)
        q, made = super().make_inputs(problem, heads, device, seed)
        inputs = FlashInferInputs(**{f.name: getattr(made, f.name) for f in fields(made)})
        requests, blocks = inputs.block_table.shape
        float_workspace = torch.empty((FLOAT_WORKSPACE_BYTES,), dtype=torch.uint8, device=device)
        qo_indptr = torch.arange(requests + 1, dtype=torch.int32, device=device)
        kv_indptr = torch.arange(0, (requests + 1) * blocks, blocks, dtype=torch.int32,
                                 device=device)
        if torch.device(device).type == "meta":  # the plan's device allocation, no plan
            int_workspace = torch.empty((INT_WORKSPACE_BYTES,), dtype=torch.uint8, device=device)
            inputs.plan_buffers = (float_workspace, qo_indptr, kv_indptr, int_workspace)
            return q, inputs
        module, error = _import_flashinfer()
        if module is None:
            raise RuntimeError(f"flashinfer does not load ({error}); {INSTALL_HINT}")
        wrapper = module.BatchMLAPagedAttentionWrapper(float_workspace, backend=BACKEND)
        wrapper.plan(qo_indptr=qo_indptr, kv_indptr=kv_indptr,
                     kv_indices=inputs.block_table.reshape(-1), kv_len_arr=inputs.seqlens,
                     num_heads=problem.heads, head_dim_ckv=problem.d_v,
                     head_dim_kpe=problem.d_qk - problem.d_v, page_size=problem.block_size,
                     causal=False, sm_scale=problem.sm_scale, q_data_type=torch.bfloat16,
                     kv_data_type=torch.bfloat16)
        inputs.wrapper = wrapper
        inputs.plan_buffers = (float_workspace, qo_indptr, kv_indptr)
        return q, inputs

    def run(self, problem: Problem, q, inputs: OpInputs, *, out=None, lse=None, **staged):
        """q (b, 1, h, 576), out (b, 1, h, 512) and lse (b, h, 1) or None -> (out, lse), lse
        the natural log; `inputs` from this adapter's `make_inputs` (the planned wrapper)."""
        if staged:
            raise TypeError(f"{self.label} takes no {', '.join(staged)}")
        self._check(problem)
        wrapper = getattr(inputs, "wrapper", None)
        if wrapper is None:
            raise ValueError(f"{self.label} runs on the planned wrapper of its own make_inputs")
        d_v = problem.d_v
        rows, cache = q[:, 0], inputs.kv[:, :, 0]  # (b, h, 576), (pages, page_size, 576)
        result_out, result_lse = wrapper.run(
            q_nope=rows[..., :d_v], q_pe=rows[..., d_v:], ckv_cache=cache[..., :d_v],
            kpe_cache=cache[..., d_v:], out=None if out is None else out[:, 0],
            lse=None if lse is None else lse[:, :, 0], return_lse=True)
        result_lse.mul_(LN2)  # base 2 -> natural log, in place
        return (result_out.unsqueeze(1) if out is None else out,
                result_lse.unsqueeze(-1) if lse is None else lse)

    def allocations(self, problem: Problem, sm_count: int) -> list[BufferSpec]:
        """out, then lse, as `run` allocates them when not given (module docstring); the
        split-KV partials are in the float workspace, the scheduler's in the int workspace."""
        self._check(problem)
        b, h = problem.rows, problem.heads
        return [BufferSpec("out", (b, 1, h, problem.d_v), torch.bfloat16, "returned"),
                BufferSpec("lse", (b, h, 1), torch.float32, "returned")]
