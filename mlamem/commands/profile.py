"""`mlamem profile`: per-call peaks of each path over a sweep of T, measured or predicted."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from mlamem.operations import kv_format, operation, padded_heads_for, problem_for, workspace_rows
from mlamem.runtime import environment, nvml
from mlamem.runtime.paths import plan
from mlamem.spec.errors import UserError
from mlamem.spec.kernel_api import DENSE_DECODE, SPARSE_DECODE

if TYPE_CHECKING:  # the result types import cheaply; run_profile loads torch, the results pydantic
    from mlamem.commands.shards import Shard
    from mlamem.results.profile import ProfileFile, ProfileRow
    from mlamem.runtime.measure import CallMeasurement
    from mlamem.spec.kernel_api import Capabilities, KernelContract
    from mlamem.spec.scenario import Scenario

SCHEMA = "mlamem.profile/1"
DEFAULT_TOKENS = (1024, 8192, 16384, 32768)


def scenario_summary(scenario: Scenario, padded_heads: int, op: str = SPARSE_DECODE) -> dict:
    return {
        "name": scenario.name, "model": scenario.model.name, "source": scenario.source,
        "heads_per_rank": scenario.heads_per_rank, "padded_heads": padded_heads,
        "topk": scenario.decode_topk if operation(op).sparse else None,
        "d_qk": scenario.d_qk, "d_v": scenario.d_v,
        "max_num_batched_tokens": scenario.serving.max_num_batched_tokens,
        "kv_cache_dtype": scenario.serving.kv_cache_dtype,
    }


def run_profile(scenario: Scenario, tokens: Sequence[int], paths: Sequence[str], *,
                command: str, kernel: KernelContract | None = None,
                require_gpu: bool = False, predict: bool = False, record_stacks: bool = False,
                on_case: Callable[[CallMeasurement], None] | None = None,
                on_calls: Callable[[list[CallMeasurement]], None] | None = None,
                op: str = SPARSE_DECODE, kv_tokens: int | None = None,
                bench: bool = False, shard: Shard | None = None) -> ProfileFile:
    """Measure every (T, path) of `op` on the GPU, or predict it where the kernel cannot run.
    `tokens` are the operation's swept values (T, requests or s_q); `kv_tokens` overrides its
    KV length; `bench` also times each measured call (do_bench median); `shard` runs only its
    values (`Shard.pick`) and is recorded in the result.

    `record_stacks`: Python stacks in the traces (snapshots), and each buffer's frame in the
    breakdown (`profile --frames`), the allocations no spec names named by it; off by default,
    the sweep's cost. `on_case` sees each call as it finishes (progress); `on_calls` sees all
    of them at the end, traces included (snapshots).
    """
    from mlamem.kernels import DEFAULT_KERNEL, load_kernel
    from mlamem.results.profile import ProfileFile
    from mlamem.runtime.measure import local_sm_count, measure_call
    from mlamem.runtime.memory import CudaMemory, SimulatedMemory

    kernel = kernel or load_kernel(DEFAULT_KERNEL)()  # the request checked (sweep.plan)
    reason = "--predict was given" if predict else kernel.unavailable_reason()
    if reason and require_gpu:
        raise UserError(f"cannot measure ({reason})", field="require_gpu")
    capabilities = kernel.capabilities(op, kv_format(scenario, op))
    padded_heads = padded_heads_for(kernel, scenario, op)
    sm_count = local_sm_count() if reason is None else scenario.gpu.sm_count
    rows, calls = [], []
    q_dtype = problem_for(scenario, op, 1, padded_heads, kv_tokens).q_dtype
    notes = _plan_notes(scenario, paths, capabilities, kernel.label, q_dtype)
    for t in tokens if shard is None else shard.pick(tokens):
        cases = []
        for path in paths:
            memory = (CudaMemory(record_stacks=record_stacks) if reason is None
                      else SimulatedMemory(record_stacks=record_stacks))
            case = measure_call(memory, scenario, kernel, t, path, sm_count=sm_count,
                                max_tokens=workspace_rows(scenario, op), op=op,
                                kv_tokens=kv_tokens, bench=bench)
            cases.append(case)
            if memory.measured and (line := nvml_note(memory.process_visibility)) not in notes:
                notes.append(line)
            if on_case:
                on_case(case)
        rows += _rows(scenario.name, cases)
        calls += cases
    if on_calls:
        on_calls(calls)
    return ProfileFile(
        schema=SCHEMA, command=command, measured=reason is None, not_measured_reason=reason,
        scenario=scenario_summary(scenario, padded_heads, op),
        kernel=kernel_summary(kernel, capabilities, sm_count),
        environment=environment.capture(), rows=rows, notes=notes,
        created=environment.now_utc(), op=op, shard=None if shard is None else str(shard))


def _plan_notes(scenario: Scenario, paths: Sequence[str], capabilities: Capabilities,
                label: str, q_dtype) -> list[str]:
    """What each path's plan could not stage, and why, each line once."""
    notes: list[str] = []
    for path in paths:
        notes += [n for n in plan(path, scenario.heads_per_rank, capabilities, label,
                                  q_dtype).notes if n not in notes]
    return notes


def kernel_summary(kernel: KernelContract, capabilities: Capabilities, sm_count: int) -> dict:
    """A profile's `kernel`: the adapter, the SMs it planned for and what it declares."""
    declared = {k: list(v) if isinstance(v, tuple) else v
                for k, v in dataclasses.asdict(capabilities).items()}
    return {"name": kernel.name, "label": kernel.label, "sm_count": sm_count,
            "version": kernel.version(), **declared}


def _rows(scenario: str, cases: list[CallMeasurement]) -> list[ProfileRow]:
    """One value's rows, one per path, its outputs compared across paths; the outputs are
    dropped after (host memory)."""
    equal, removed = _outputs_equal(cases), _removed_by_workspace(cases)
    rows = [profile_row(case, scenario, equal, None if case.path != "alloc" else removed)
            for case in cases]
    for case in cases:
        case.out = case.lse = None
    return rows


def profile_row(case: CallMeasurement, scenario: str, outputs_equal: bool | None = None,
                removed: set[str] | None = None) -> ProfileRow:
    """A profile sweep's row of one measured (or predicted) call; `removed`: the buffers the
    workspace path does not allocate (an alloc row's, when both paths ran)."""
    from mlamem.results.profile import ProfileRow

    figures = call_figures(case)
    buffers = [{**b, "removed_by_workspace": None if removed is None else b["name"] in removed}
               for b in figures.pop("buffers")]
    return ProfileRow(
        scenario=scenario, tokens=case.tokens, path=case.path, outputs_equal=outputs_equal,
        staged=list(case.staged), buffers=buffers, op=case.op,
        requests=case.tokens if case.op == DENSE_DECODE else None, kv_tokens=case.kv_tokens,
        median_ms=case.median_ms, **figures)


def call_figures(call: CallMeasurement) -> dict:
    """The figures of a measured (or predicted) call as a profile row's fields (`ProfileRow`),
    from a sweep's record or any that shows the same attributes (the API's `Tracker`)."""
    breakdown = call.breakdown
    return {
        "measured": call.measured,
        "peak_allocated_bytes": call.peak_allocated_bytes,
        "peak_reserved_bytes": call.peak_reserved_bytes,
        "nvml_peak_bytes": call.nvml_peak_bytes,
        "nvml_process_peak_bytes": call.nvml_process_peak_bytes,
        "wall_time_ms": call.wall_time_ms,
        "allocations_in_call": None if breakdown is None else breakdown.allocations,
        "bytes_allocated_in_call": None if breakdown is None else breakdown.allocated_bytes,
        "buffers": [] if breakdown is None else [b.to_dict() for b in breakdown.buffers],
        "breakdown_peak_bytes": None if breakdown is None else breakdown.peak_bytes,
        "missing_buffers": [] if breakdown is None else list(breakdown.missing),
        "oom": call.oom,
        "oom_requested_bytes": call.oom_requested_bytes,
        "failure": call.failure,
    }


def nvml_note(visibility: str) -> str:
    """The note on a measured sweep's two NVML figures: the device-wide delta, and this
    process's peak or why it is absent (nvml.process_visibility)."""
    device = "the NVML column is the device-wide used memory's delta (all processes)"
    if visibility == nvml.THIS_PROCESS:
        return (f"NVML: {device}; nvml_process_peak_bytes is this process's own peak, "
                "absolute (NVML's process list)")
    return f"NVML: {device}; this process's own figure is absent ({visibility})"


def _removed_by_workspace(cases: list[CallMeasurement]) -> set[str] | None:
    """Buffer names the alloc path allocates and the workspace path does not."""
    by_path = {c.path: c.breakdown for c in cases}
    alloc, workspace = by_path.get("alloc"), by_path.get("workspace")
    if alloc is None or workspace is None:
        return None
    return {b.name for b in alloc.buffers} - {b.name for b in workspace.buffers}


def _outputs_equal(cases: list[CallMeasurement]) -> bool | None:
    """Whether every path gave bit-identical out and lse; None if not comparable."""
    if len(cases) < 2 or any(c.out is None for c in cases):
        return None
    import torch

    first = cases[0]
    return all(torch.equal(first.out, c.out) and torch.equal(first.lse, c.lse) for c in cases[1:])
