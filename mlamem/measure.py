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
from collections.abc import Callable
from dataclasses import dataclass

import torch

from mlamem.allocator import round_size
from mlamem.attribution import Breakdown, ExpectedBuffer, attribute, expected_buffers
from mlamem.kernel_api import SPARSE_DECODE, simulate_decode, simulate_run
from mlamem.kernel_api import KernelContract as SparseDecodeKernel
from mlamem.memory import (
    CallWatch,
    CudaMemory,
    MemoryStats,
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
    ooms_before = memory.stats().num_ooms
    try:
        q, inputs = kernel.make_inputs(problem, scenario.heads_per_rank, memory.device, seed)
        workspace = reserve_workspace(path, kernel, max_tokens=max_tokens,
                                      padded_heads=padded_heads, d_qk=scenario.d_qk,
                                      d_v=scenario.d_v, topk=problem.topk,
                                      sm_count=sm_count, device=memory.device,
                                      q_dtype=problem.q_dtype)
    except Exception as exc:
        _record_failure(result, classify_failure(exc, memory, ooms_before))
        return
    call = KernelCall(run=runner(kernel, memory, sm_count, problem, inputs), op=op,
                      padded_heads=padded_heads, takes_out=capabilities.takes_out,
                      q_dtype=problem.q_dtype)
    step = functools.partial(PATHS[path], q, call, workspace)
    warmup = watched_call(memory, step)
    if warmup.failure is not None:
        _record_failure(result, warmup.failure)
        return
    del warmup  # its outputs go before the cache is emptied
    memory.empty_cache()
    run = watched_call(memory, step)
    if run.failure is not None:
        _record_failure(result, run.failure)
        return
    before, after, watch = run.before, run.after, run.watch
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
        result.wall_time_ms = run.wall_s * 1e3
        out, lse = run.value
        del run
        result.out, result.lse = out.cpu(), lse.cpu()
        del out, lse
        if bench:
            result.median_ms = median_ms(step)


def _record_failure(result: CallMeasurement, failure: Failure) -> None:
    """A failed call: OUT_OF_MEMORY with the size that failed, or the error line."""
    result.failure = OUT_OF_MEMORY if failure.oom else failure.text
    result.oom_requested_bytes = failure.requested_bytes if failure.oom else None


@dataclass(frozen=True)
class Failure:
    """Why a call failed, classified once (`classify_failure`) for profile, the engines' steps
    and anything else run through `watched_call`."""

    oom: bool  # an out-of-memory, however it surfaced (memory.is_out_of_memory)
    text: str  # "ExcType: first line of the message"
    requested_bytes: int | None = None  # oom: the request that failed, when known
    reserved_bytes: int | None = None  # oom in a watched call: torch's reserved bytes then
    buffer: str | None = None  # oom: the expected buffer of the failed request's size
    allocated_by: str | None = None  # who allocates that buffer: "kernel", "engine", ...


def classify_failure(exc: Exception, memory, ooms_before: int, watch: CallWatch | None = None,
                     expected: list[ExpectedBuffer] | None = None,
                     reserved_before: int = 0) -> Failure:
    """Classify `exc`: an OOM (by type, or by the allocator's num_ooms growing past
    `ooms_before`) gets the request that failed and, from the trace of `watch` (which started
    with `reserved_before` bytes reserved), the reserved bytes then and the buffer of that size
    among `expected` that the call had not yet allocated; anything else is an error line."""
    first_line = str(exc).splitlines()[0] if str(exc) else ""
    text = f"{type(exc).__name__}: {first_line}"
    if not is_out_of_memory(exc, ooms_before, memory.stats().num_ooms):
        return Failure(oom=False, text=text)
    requested, reserved = oom_event(watch.events, reserved_before) if watch else (None, None)
    requested = (requested or (watch.oom_requested_bytes if watch else None)
                 or getattr(exc, "requested_bytes", None) or requested_bytes_from_message(str(exc)))
    named = None
    if watch is not None and expected and requested is not None:
        missing = set(attribute(watch.events, expected).missing)
        named = next((e for e in expected if e.name in missing
                      and round_size(e.nbytes) == round_size(requested)), None)
    return Failure(oom=True, text=text, requested_bytes=requested, reserved_bytes=reserved,
                   buffer=named and named.name, allocated_by=named and named.allocated_by)


def oom_event(events: list[dict], reserved_before: int) -> tuple[int | None, int | None]:
    """(bytes requested, reserved bytes) at the first 'oom' in an allocator trace."""
    reserved = reserved_before
    for event in events:
        if event["action"] == "segment_alloc":
            reserved += event["size"]
        elif event["action"] == "segment_free":
            reserved -= event["size"]
        elif event["action"] == "oom":
            return event["size"], reserved
    return None, None


@dataclass
class WatchedCall:
    """One run of a body under the allocator trace (`watched_call`)."""

    before: MemoryStats  # after the peak reset, just before the body
    watch: CallWatch | None = None  # its trace, segments and NVML peak (None: the watch failed)
    after: MemoryStats | None = None  # after the body and a synchronize; None when it failed
    value: object = None  # what the body returned
    wall_s: float | None = None  # the body and the synchronize, in seconds
    failure: Failure | None = None  # why it failed; None when it ran


def watched_call(memory: CudaMemory | SimulatedMemory, body: Callable[[], object],
                 expected: list[ExpectedBuffer] | None = None) -> WatchedCall:
    """Run `body` once with the peaks reset, under `memory.watch()`, synchronized; a failure is
    classified (`classify_failure`, an OOM named from `expected`), never raised."""
    memory.reset_peaks()
    call = WatchedCall(before=memory.stats())
    try:
        with memory.watch() as call.watch:
            start = time.perf_counter()
            call.value = body()
            memory.synchronize()
            call.wall_s = time.perf_counter() - start
    except Exception as exc:
        call.value = None
        call.failure = classify_failure(exc, memory, call.before.num_ooms, call.watch, expected,
                                        call.before.reserved)
        return call
    call.after = memory.stats()
    return call
