"""Measuring one call: the protocol shared by the GPU and the prediction.

For one (T, path): make the inputs, reserve the workspace (workspace paths), warm up once at the
same shape, release the cached segments, then measure one call:
    peak allocated = max_memory_allocated after a reset - bytes allocated before
    peak reserved  = max_memory_reserved  after a reset - bytes reserved before
    NVML           = peak device used memory during the call - used before
A cold cache makes the reserved figure what the call needs from the device, as on the first
step of that size in an engine.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import torch

from mlamem.attribution import Breakdown, attribute, expected_buffers
from mlamem.kernels.base import SPARSE_DECODE, SparseDecodeKernel, simulate_decode, simulate_run
from mlamem.memory import (
    CudaMemory,
    SimulatedMemory,
    is_out_of_memory,
    requested_bytes_from_message,
)
from mlamem.operations import kv_format, problem_for
from mlamem.paths import PATHS, KernelCall, plan, reserve_workspace, wrapper_allocations
from mlamem.scenario import Scenario

OUT_OF_MEMORY = "out of memory"


@dataclass
class CallMeasurement:
    """One measured (or predicted) call; byte counts are deltas over the state before it."""

    tokens: int  # query rows of the call: T, requests (dense decode) or s_q (prefill)
    path: str
    measured: bool
    op: str = SPARSE_DECODE
    kv_tokens: int | None = None  # KV tokens each query sees (dense: context; prefill: s_kv)
    median_ms: float | None = None  # do_bench median of the path's call (when asked, measured)
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    nvml_peak_bytes: int | None = None
    wall_time_ms: float | None = None
    failure: str | None = None  # one line, when the call failed (OOM or otherwise)
    oom_requested_bytes: int | None = None  # the request that failed, when known
    staged: tuple[str, ...] = ()  # buffers the path took from the workspace
    breakdown: Breakdown | None = None  # the call's allocations by buffer
    trace: list[dict] | None = None  # allocator trace entries of the call (torch's layout)
    segments: list[dict] | None = None  # allocator segments after the call
    out: torch.Tensor | None = None  # real heads of out, on the CPU (measured calls)
    lse: torch.Tensor | None = None  # real heads of lse, on the CPU (measured calls)

    @property
    def oom(self) -> bool:
        return self.failure == OUT_OF_MEMORY


def local_sm_count() -> int:
    """Streaming multiprocessors of this process's CUDA device."""
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


def launch_name(kernel: SparseDecodeKernel, op: str) -> str:
    """The launch that loads a kernel's modules (mlamem/non_torch.toml's names)."""
    return f"{kernel.name}.decode" if op == SPARSE_DECODE else f"{kernel.name}.{op}"


def decoder(kernel: SparseDecodeKernel, memory, sm_count: int):
    """The kernel's decode on a GPU; on the meta device, its allocation spec stands in."""
    if memory.measured or kernel.runs_on_meta:
        return kernel.decode

    def decode(*args, **kwargs):
        memory.launch(launch_name(kernel, SPARSE_DECODE))  # first launch loads its modules
        return simulate_decode(kernel, sm_count, *args, **kwargs)

    return decode


def runner(kernel: SparseDecodeKernel, memory, sm_count: int, problem, inputs):
    """`kernel.run` for one problem on a GPU; on the meta device, its allocation spec."""
    if memory.measured or kernel.runs_on_meta:
        return functools.partial(kernel.run, problem, inputs=inputs)

    def run(q, **kwargs):
        memory.launch(launch_name(kernel, problem.op))
        return simulate_run(kernel, sm_count, problem, q, inputs, **kwargs)

    return run


def measure_call(memory: CudaMemory | SimulatedMemory, scenario: Scenario,
                 kernel: SparseDecodeKernel, tokens: int, path: str, *, sm_count: int,
                 max_tokens: int, seed: int = 0, op: str = SPARSE_DECODE,
                 kv_tokens: int | None = None, bench: bool = False) -> CallMeasurement:
    """Measure one call of `path` for `op` at `tokens` rows (T, requests or s_q) with
    `max_tokens` workspace rows; see the module docstring. `bench`: then time the call
    (triton's do_bench median), after the memory figures are taken."""
    result = CallMeasurement(tokens=tokens, path=path, measured=memory.measured, op=op)
    with memory:  # on exit, every tensor of the case is gone and the cache is emptied
        _measure(memory, scenario, kernel, result, sm_count=sm_count, max_tokens=max_tokens,
                 seed=seed, kv_tokens=kv_tokens, bench=bench)
    return result


def median_ms(step) -> float | None:
    """triton.testing.do_bench's median of `step`, in ms; None without triton."""
    try:
        from triton.testing import do_bench
    except ImportError:
        return None
    return do_bench(step, warmup=10, rep=50, return_mode="median")


def _measure(memory, scenario, kernel, result, *, sm_count, max_tokens, seed, kv_tokens,
             bench) -> None:
    tokens, path, op = result.tokens, result.path, result.op
    capabilities = kernel.capabilities(op, kv_format(scenario, op))
    padded_heads = capabilities.padded_heads(scenario.heads_per_rank)
    problem = problem_for(scenario, op, tokens, padded_heads, kv_tokens)
    result.staged = plan(path, scenario.heads_per_rank, capabilities, kernel.label,
                         problem.q_dtype).staged
    result.kv_tokens = problem.kv_tokens
    try:
        q, inputs = kernel.make_inputs(problem, scenario.heads_per_rank, memory.device, seed)
        workspace = reserve_workspace(path, kernel, max_tokens=max_tokens,
                                      padded_heads=padded_heads, d_qk=scenario.d_qk,
                                      d_v=scenario.d_v, topk=problem.topk,
                                      sm_count=sm_count, device=memory.device,
                                      q_dtype=problem.q_dtype)
    except Exception as exc:
        _failed(result, exc, None, memory, 0)
        return
    call = KernelCall(run=runner(kernel, memory, sm_count, problem, inputs), op=op,
                      padded_heads=padded_heads, takes_out=capabilities.takes_out,
                      q_dtype=problem.q_dtype)
    step = functools.partial(PATHS[path], q, call, workspace)
    for warmup in (True, False):
        if not warmup:
            memory.empty_cache()
            memory.reset_peaks()
        before, watch = memory.stats(), None
        try:
            with memory.watch() as watch:
                start = time.perf_counter()
                out, lse = step()
                memory.synchronize()
                wall = time.perf_counter() - start
        except Exception as exc:
            _failed(result, exc, watch, memory, before.num_ooms)
            return
        if warmup:
            del out, lse
    after = memory.stats()
    result.peak_allocated_bytes = after.peak_allocated - before.allocated
    result.peak_reserved_bytes = after.peak_reserved - before.reserved
    expected = expected_buffers(
        wrapper_allocations(path, tokens, scenario.heads_per_rank, padded_heads, scenario.d_qk,
                            problem.q_dtype),
        kernel.op_allocations(problem, sm_count), result.staged)
    result.breakdown = attribute(watch.events, expected)
    result.trace, result.segments = watch.events, watch.segments
    if watch.nvml_peak_bytes is not None and before.device_used is not None:
        result.nvml_peak_bytes = watch.nvml_peak_bytes - before.device_used
    if memory.measured:
        result.wall_time_ms = wall * 1e3
        result.out, result.lse = out.cpu(), lse.cpu()
        del out, lse
        if bench:
            result.median_ms = median_ms(step)


def _failed(result: CallMeasurement, exc: Exception, watch, memory, ooms_before: int) -> None:
    """Fill in a failure: an OOM with the size that failed, or another error as such."""
    if is_out_of_memory(exc, ooms_before, memory.stats().num_ooms):
        result.failure = OUT_OF_MEMORY
        result.oom_requested_bytes = (watch.oom_requested_bytes if watch else None) or (
            requested_bytes_from_message(str(exc)))
    else:
        first_line = str(exc).splitlines()[0] if str(exc) else ""
        result.failure = f"{type(exc).__name__}: {first_line}"
