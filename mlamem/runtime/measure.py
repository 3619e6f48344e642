"""Measuring one call: the protocol shared by the GPU and the prediction.

`measure_one` measures (on the simulated memory, predicts) one call and returns one
`CallRecord`: the peaks, the allocations in the call by buffer, the trace and a
`failure: Failure | None`. The profile sweep (`measure_call`), the API's tracker and
`profile_call`, graph captures, engine steps and compare all measure through it.

For one (T, path): make the inputs, reserve the workspace (workspace paths), warm up once at the
same shape, release the cached segments, then measure one call:
    peak allocated = max_memory_allocated after a reset - bytes allocated before
    peak reserved  = max_memory_reserved  after a reset - bytes reserved before
    NVML           = peak device used memory during the call - used before
A cold cache makes the reserved figure what the call needs from the device, as on the first
step of that size in an engine.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from mlamem.operations import Problem, call_capabilities, padded_heads_for, problem_for
from mlamem.runtime.allocator import round_size
from mlamem.runtime.attribution import Breakdown, BufferUse, ExpectedBuffer, attribute, expected_buffers
from mlamem.runtime.memory import (
    CallWatch,
    CudaMemory,
    MemoryStats,
    SimulatedMemory,
    is_out_of_memory,
    requested_bytes_from_message,
)
from mlamem.runtime.paths import PATHS, KernelCall, plan, reserve_workspace, wrapper_allocations
from mlamem.spec.kernel_api import SPARSE_DECODE, KernelContract, simulate_run
from mlamem.spec.scenario import Scenario

OUT_OF_MEMORY = "out of memory"


class RecordField:
    """An attribute of a record that embeds a CallRecord (`call`): the record's field of the same
    name, read and written through; None while no call ran and, unless `when_failed`, when
    the call failed (profile shows a failed call's figures as None)."""

    def __init__(self, when_failed: bool = False):
        self.when_failed = when_failed

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        call = obj.call
        if call is None or (call.failure is not None and not self.when_failed):
            return None
        return getattr(call, self.name)

    def __set__(self, obj, value) -> None:
        if obj.call is None:
            obj.call = CallRecord(measured=obj.measured)
        setattr(obj.call, self.name, value)


@dataclass
class CallMeasurement:
    """One (T, path) of a profile sweep: its case, and the record of its measured (or
    predicted) call (`call`), whose figures it shows as they always read."""

    tokens: int  # query rows of the call: T, requests (dense decode) or s_q (prefill)
    path: str
    measured: bool
    op: str = SPARSE_DECODE
    kv_tokens: int | None = None  # KV tokens each query sees (dense: context; prefill: s_kv)
    median_ms: float | None = None  # do_bench median of the path's call (when asked, measured)
    staged: tuple[str, ...] = ()  # buffers the path took from the workspace
    call: CallRecord | None = None  # the measured call (None until it ran)
    out: torch.Tensor | None = None  # real heads of out, on the CPU (measured calls)
    lse: torch.Tensor | None = None  # real heads of lse, on the CPU (measured calls)

    peak_allocated_bytes = RecordField()
    peak_reserved_bytes = RecordField()
    nvml_peak_bytes = RecordField()
    nvml_process_peak_bytes = RecordField()
    wall_time_ms = RecordField()
    breakdown = RecordField()  # the call's allocations by buffer
    trace = RecordField()  # allocator trace entries of the call (torch's layout)
    segments = RecordField()  # allocator segments after the call

    failure = property(lambda self: self.call and self.call.failure_line)
    oom_requested_bytes = property(lambda self: self.call and self.call.oom_requested_bytes)

    @property
    def oom(self) -> bool:
        return self.failure == OUT_OF_MEMORY


def local_sm_count() -> int:
    """Streaming multiprocessors of this process's CUDA device."""
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


def launch_name(kernel: KernelContract, op: str) -> str:
    """The launch that loads a kernel's modules (mlamem/non_torch.toml's names)."""
    return f"{kernel.name}.decode" if op == SPARSE_DECODE else f"{kernel.name}.{op}"


def runner(kernel: KernelContract, memory, sm_count: int, problem, inputs):
    """`kernel.run` for one problem on a GPU; on the meta device, its allocation spec."""
    if memory.measured:  # an emulated smaller target charges its modules (CudaMemory.launch)
        def run_measured(q, **kwargs):
            memory.launch(launch_name(kernel, problem.op))
            return kernel.run(problem, q, inputs=inputs, **kwargs)

        return run_measured
    if kernel.runs_on_meta:
        return functools.partial(kernel.run, problem, inputs=inputs)

    def run(q, **kwargs):
        memory.launch(launch_name(kernel, problem.op))  # first launch loads its modules
        return simulate_run(kernel, sm_count, problem, q, inputs, **kwargs)

    return run


def measure_call(memory: CudaMemory | SimulatedMemory, scenario: Scenario,
                 kernel: KernelContract, tokens: int, path: str, *, sm_count: int,
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


@dataclass(frozen=True)
class CallPlan:
    """One path's call of one problem, the one assembly every caller runs (profile, compare,
    graph captures, the engines' decode step): planned before anything is allocated, then
    ready to run on a memory backend (`prepare`, or `reserve_workspace` and `call`)."""

    scenario: Scenario
    kernel: KernelContract
    path: str
    sm_count: int
    problem: Problem  # the operation's problem (shapes, kv_tokens)
    padded_heads: int
    takes_out: bool
    staged: tuple[str, ...]  # buffers the path takes from the workspace
    expected: list[ExpectedBuffer]  # the buffers the call allocates, to name them

    def at(self, tokens: int) -> CallPlan:
        """The same call at `tokens` rows (a graph capture's size)."""
        return plan_call(self.scenario, self.kernel, self.problem.op, tokens, self.path,
                         sm_count=self.sm_count, kv_tokens=self.problem.kv_tokens)

    def reserve_workspace(self, memory, max_tokens: int):
        """The workspace the backend reserves for the path at init (`max_tokens` rows), or
        None (alloc)."""
        problem, scenario = self.problem, self.scenario
        return reserve_workspace(self.path, self.kernel, max_tokens=max_tokens,
                                 padded_heads=self.padded_heads, d_qk=scenario.d_qk,
                                 d_v=scenario.d_v, topk=problem.topk, sm_count=self.sm_count,
                                 device=memory.device, q_dtype=problem.q_dtype, op=problem.op)

    def call(self, memory, inputs, workspace) -> Callable[[object], tuple]:
        """The path's call on `memory`'s device over `inputs` and `workspace`: q -> (out,
        lse); on the meta device the kernel's allocation spec stands in for the kernel."""
        problem = self.problem
        run = KernelCall(run=runner(self.kernel, memory, self.sm_count, problem, inputs),
                         op=problem.op, padded_heads=self.padded_heads, takes_out=self.takes_out,
                         q_dtype=problem.q_dtype)
        path_call = PATHS[self.path]
        return lambda q: path_call(q, run, workspace)

    def prepare(self, memory, *, max_tokens: int, seed: int = 0) -> Callable[[], tuple]:
        """The call ready to run on `memory`'s device, returning out and lse: its inputs and
        its workspace (`max_tokens` rows) allocated, in that order."""
        q, inputs = self.kernel.make_inputs(self.problem, self.scenario.heads_per_rank,
                                            memory.device, seed)
        workspace = self.reserve_workspace(memory, max_tokens)
        return functools.partial(self.call(memory, inputs, workspace), q)


def plan_call(scenario: Scenario, kernel: KernelContract, op: str, tokens: int, path: str,
              *, sm_count: int, kv_tokens: int | None = None) -> CallPlan:
    """The call of `path` for `op` at `tokens` rows (T, requests or s_q)."""
    capabilities = call_capabilities(kernel, scenario, op)
    padded_heads = padded_heads_for(kernel, scenario, op)
    problem = problem_for(scenario, op, tokens, padded_heads, kv_tokens)
    staged = plan(path, scenario.heads_per_rank, capabilities, kernel.label,
                  problem.q_dtype).staged
    expected = expected_buffers(
        wrapper_allocations(path, tokens, scenario.heads_per_rank, padded_heads, scenario.d_qk,
                            problem.q_dtype),
        kernel.allocations(problem, sm_count), staged)
    return CallPlan(scenario, kernel, path, sm_count, problem, padded_heads,
                    capabilities.takes_out, staged, expected)


def _measure(memory, scenario, kernel, result, *, sm_count, max_tokens, seed, kv_tokens,
             bench) -> None:
    planned = plan_call(scenario, kernel, result.op, result.tokens, result.path,
                        sm_count=sm_count, kv_tokens=kv_tokens)
    result.staged, result.kv_tokens = planned.staged, planned.problem.kv_tokens
    ooms_before = memory.stats(device=False).num_ooms
    try:
        step = planned.prepare(memory, max_tokens=max_tokens, seed=seed)
    except Exception as exc:
        result.call = failed_before_call(memory, classify_failure(exc, memory, ooms_before))
        return
    warmup = measure_one(memory, step, planned.expected)
    if warmup.failure is not None:
        result.call = warmup
        return
    del warmup  # its outputs go before the cache is emptied
    memory.empty_cache()
    result.call = run = measure_one(memory, step, planned.expected)
    if run.failure is not None or not memory.measured:
        return
    out, lse = run.value
    run.value = None
    result.out, result.lse = out.cpu(), lse.cpu()
    del out, lse
    if bench:
        result.median_ms = median_ms(step)


@dataclass(frozen=True)
class Failure:
    """Why a call failed, classified once (`classify_failure`) for every call measured by
    `measure_one` and for the setups around them."""

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
    if not is_out_of_memory(exc, ooms_before, memory.stats(device=False).num_ooms):
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
class CallRecord:
    """One measured (or predicted) call, the one record every caller embeds: byte counts are
    deltas over the state just before it, None until taken (or when it failed first)."""

    measured: bool
    before: MemoryStats | None = None  # after the peak reset, just before the call
    after: MemoryStats | None = None  # after the call and a synchronize (no NVML reading)
    peak_allocated_bytes: int | None = None  # max_memory_allocated - allocated before
    peak_reserved_bytes: int | None = None  # max_memory_reserved - reserved before
    nvml_peak_bytes: int | None = None  # NVML device-used peak - used before (predicted: reserved)
    device_peak_bytes: int | None = None  # NVML's device-used peak itself, all processes
    # this process's NVML peak itself (measured, where NVML lists this process; else None)
    nvml_process_peak_bytes: int | None = None
    wall_time_ms: float | None = None  # the call and one synchronize (measured only)
    breakdown: Breakdown | None = None  # the allocations in the call, by buffer
    trace: list[dict] | None = None  # allocator trace entries of the call (torch's layout)
    segments: list[dict] | None = None  # allocator segments after the call
    failure: Failure | None = None  # why it failed; None when it ran
    value: object = None  # what the call returned

    @property
    def buffers(self) -> list[BufferUse]:
        return [] if self.breakdown is None else list(self.breakdown.buffers)

    @property
    def oom(self) -> bool:
        return self.failure is not None and self.failure.oom

    @property
    def failure_line(self) -> str | None:
        """The failure in one line, as profile and the API show it: OUT_OF_MEMORY, or the
        error; None when the call ran."""
        if self.failure is None:
            return None
        return OUT_OF_MEMORY if self.failure.oom else self.failure.text

    @property
    def oom_requested_bytes(self) -> int | None:
        """An out-of-memory's failed request, when known."""
        return self.failure.requested_bytes if self.oom else None


def failed_before_call(memory, failure: Failure) -> CallRecord:
    """The record of a call that never ran: its setup failed."""
    return CallRecord(measured=memory.measured, failure=failure)


class Measuring:
    """`measure_one`'s protocol in two halves, for a `with` block (`api.track`): `start`
    resets the peaks and starts the watch; `finish` takes the figures of what ran between."""

    def __init__(self, memory: CudaMemory | SimulatedMemory,
                 expected: list[ExpectedBuffer] | None = None):
        self.memory, self.expected = memory, expected or []
        self.record = CallRecord(measured=memory.measured)
        self._watch_context = None
        self._watch: CallWatch | None = None
        self._start = 0.0

    def start(self) -> None:
        memory = self.memory
        memory.reset_peaks()
        self.record.before = before = memory.stats(device=False)
        self._watch_context = memory.watch()
        self._watch = self._watch_context.__enter__()
        if self._watch.nvml_start_bytes is not None:  # the sampler's first reading: NVML once
            before.device_used = self._watch.nvml_start_bytes
        self._start = time.perf_counter()  # the timed window: the call and one synchronize

    def finish(self, exc: BaseException | None = None) -> CallRecord:
        """The figures, after the call returned (`exc` None) or raised `exc`; an interrupt
        (not an Exception) leaves them out."""
        memory, record, watch = self.memory, self.record, self._watch
        try:
            try:
                memory.synchronize()
            except Exception as failed:  # a kernel's error can surface here
                exc = exc or failed
            wall_s = time.perf_counter() - self._start
        finally:  # the watch sees the failure, as a `with` around the call would
            self._watch_context.__exit__(type(exc) if exc else None, exc,
                                         exc.__traceback__ if exc else None)
        if exc is not None and not isinstance(exc, Exception):
            return record
        record.trace, record.segments = watch.events, watch.segments
        record.breakdown = attribute(watch.events, self.expected)
        before = record.before
        if exc is not None:
            record.failure = classify_failure(exc, memory, before.num_ooms, watch, self.expected,
                                              before.reserved)
            return record
        record.after = after = memory.stats(device=False)
        record.peak_allocated_bytes = after.peak_allocated - before.allocated
        record.peak_reserved_bytes = after.peak_reserved - before.reserved
        record.device_peak_bytes = watch.nvml_peak_bytes
        if watch.nvml_peak_bytes is not None and before.device_used is not None:
            record.nvml_peak_bytes = watch.nvml_peak_bytes - before.device_used
        record.nvml_process_peak_bytes = watch.nvml_process_peak_bytes
        if memory.measured:
            record.wall_time_ms = wall_s * 1e3
        return record


def measure_one(memory: CudaMemory | SimulatedMemory, call: Callable[[], object],
                expected: list[ExpectedBuffer] | None = None, *,
                raise_errors: bool = False) -> CallRecord:
    """Measure (or, on the simulated memory, predict) one `call()`: the peaks reset, under the
    allocator trace and the NVML sampler, synchronized. The record holds the peaks, the
    allocations in the call named from `expected`, and a failure, classified, never raised,
    unless `raise_errors` and it is no out-of-memory (then the error propagates)."""
    measuring = Measuring(memory, expected)
    measuring.start()
    try:
        value = call()
    except BaseException as exc:
        record = measuring.finish(exc)
        if record.failure is None or (raise_errors and not record.failure.oom):
            raise
        return record
    record = measuring.finish()
    if raise_errors and record.failure is not None and not record.failure.oom:
        raise RuntimeError(record.failure.text)  # it surfaced in the closing synchronize
    record.value = value
    return record


def without_record(obj) -> dict:
    """A dataclass that embeds a CallRecord (its `call` field) as a dict without it: the
    serialised shape it had before it embedded the record."""
    return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)
            if f.name != "call"}


def _plain(value):
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return without_record(value)
    if isinstance(value, list | tuple):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return copy.deepcopy(value)
