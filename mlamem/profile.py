"""`mlamem profile`: per-call peaks of each path over a sweep of T, measured or predicted."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mlamem import environment, nvml
from mlamem.errors import UserError
from mlamem.kernel_api import DENSE_DECODE, SPARSE_DECODE
from mlamem.operations import kv_format, operation, problem_for, workspace_rows
from mlamem.paths import plan

if TYPE_CHECKING:  # the result types import cheaply; run_profile loads torch
    from mlamem.kernel_api import KernelContract
    from mlamem.measure import CallMeasurement
    from mlamem.scenario import Scenario
    from mlamem.shards import Shard

SCHEMA = "mlamem.profile/1"
DEFAULT_TOKENS = (1024, 8192, 16384, 32768)


@dataclass(frozen=True)
class ProfileRow:
    """One (T, path). Bytes are per-call deltas over the state before the call."""

    scenario: str
    tokens: int  # T: query tokens in the step (s_q of the decode call)
    path: str  # one of paths.PATH_NAMES
    measured: bool  # False: predicted by the allocator model
    peak_allocated_bytes: int | None  # torch max_memory_allocated delta
    peak_reserved_bytes: int | None  # torch max_memory_reserved delta (cold cache)
    nvml_peak_bytes: int | None  # NVML device-used delta (predicted: = reserved)
    wall_time_ms: float | None  # host wall time of the call incl. sync (measured only)
    outputs_equal: bool | None  # out and lse bit-identical across this T's paths
    staged: list[str]  # buffers this path takes from the workspace
    allocations_in_call: int | None  # allocations made inside the measured call (0 = graph-safe)
    bytes_allocated_in_call: int | None  # their total requested bytes
    buffers: list[dict]  # the breakdown: name, allocated_by, requested_bytes, block_bytes,
    #                      live_at_peak, removed_by_workspace (alloc rows, when compared)
    breakdown_peak_bytes: int | None  # sum of buffers live at the peak (= peak if it adds up)
    missing_buffers: list[str]  # expected buffers never allocated
    oom: bool  # the call ran out of memory
    oom_requested_bytes: int | None  # the allocation that failed
    failure: str | None  # one line when the call failed
    op: str  # the kernel operation
    requests: int | None = None  # dense decode: b, the swept quantity (= tokens)
    kv_tokens: int | None = None  # KV tokens per query: dense decode's context, prefill's s_kv
    median_ms: float | None = None  # triton do_bench median of the path's call (measured only)
    # this process's NVML peak during the call, absolute (measured, where NVML lists this
    # process; nvml_peak_bytes beside it is the device-wide delta, all processes)
    nvml_process_peak_bytes: int | None = None


@dataclass(frozen=True)
class ProfileResult:
    """A whole sweep: the JSON schema `mlamem.profile/1`."""

    command: str
    measured: bool
    not_measured_reason: str | None  # why the figures are predicted
    scenario: dict
    kernel: dict
    environment: environment.Environment
    rows: list[ProfileRow]
    notes: list[str] = field(default_factory=list)  # what could not be staged, and why
    schema: str = SCHEMA
    # required, keyword-only to keep the file's key order; older files get them when migrated
    created: str | None = field(kw_only=True)  # when it was made: UTC, ISO 8601 (None: not recorded)
    op: str = field(kw_only=True)  # the kernel operation profiled
    shard: str | None = None  # "I/N" when this is one shard of the sweep (mlamem.shards)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ProfileResult:
        """Read back `to_dict()`, a saved mlamem.profile/1 file, checked by its model
        (`mlamem.results`); ValueError (one line naming the field) if malformed."""
        from mlamem import results

        data = results.read(data, SCHEMA)
        return cls(**{**data, "environment": environment.Environment.from_dict(data["environment"]),
                      "rows": [ProfileRow(**row) for row in data["rows"]]})


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
                bench: bool = False, shard: Shard | None = None) -> ProfileResult:
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
    from mlamem.measure import local_sm_count, measure_call
    from mlamem.memory import CudaMemory, SimulatedMemory

    kernel = kernel or load_kernel(DEFAULT_KERNEL)()  # the request checked (sweep.plan)
    reason = "--predict was given" if predict else kernel.unavailable_reason()
    if reason and require_gpu:
        raise UserError(f"cannot measure ({reason})", field="require_gpu")
    capabilities = kernel.capabilities(op, kv_format(scenario, op))
    padded_heads = capabilities.padded_heads(scenario.heads_per_rank)
    sm_count = local_sm_count() if reason is None else scenario.gpu.sm_count
    rows, notes, calls = [], [], []
    q_dtype = problem_for(scenario, op, 1, padded_heads, kv_tokens).q_dtype
    for path in paths:
        notes += [n for n in plan(path, scenario.heads_per_rank, capabilities, kernel.label,
                                  q_dtype).notes
                  if n not in notes]
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
        equal = _outputs_equal(cases)
        removed = _removed_by_workspace(cases)
        for case in cases:
            breakdown = case.breakdown
            buffers = [] if breakdown is None else [
                {**b.to_dict(),
                 "removed_by_workspace": None if case.path != "alloc" or removed is None
                 else b.name in removed}
                for b in breakdown.buffers]
            rows.append(ProfileRow(
                scenario=scenario.name, tokens=t, path=case.path, measured=case.measured,
                peak_allocated_bytes=case.peak_allocated_bytes,
                peak_reserved_bytes=case.peak_reserved_bytes,
                nvml_peak_bytes=case.nvml_peak_bytes, wall_time_ms=case.wall_time_ms,
                outputs_equal=equal, staged=list(case.staged),
                allocations_in_call=breakdown and breakdown.allocations,
                bytes_allocated_in_call=breakdown and breakdown.allocated_bytes,
                buffers=buffers, breakdown_peak_bytes=breakdown and breakdown.peak_bytes,
                missing_buffers=[] if breakdown is None else breakdown.missing, oom=case.oom,
                oom_requested_bytes=case.oom_requested_bytes, failure=case.failure,
                op=op, requests=t if op == DENSE_DECODE else None, kv_tokens=case.kv_tokens,
                median_ms=case.median_ms, nvml_process_peak_bytes=case.nvml_process_peak_bytes,
            ))
            case.out = case.lse = None  # the comparison is done; keep host memory small
        calls += cases
    if on_calls:
        on_calls(calls)
    return ProfileResult(
        command=command, measured=reason is None, not_measured_reason=reason,
        scenario=scenario_summary(scenario, padded_heads, op),
        kernel={"name": kernel.name, "label": kernel.label, "sm_count": sm_count,
                "version": kernel.version(), **dataclasses.asdict(capabilities)},
        environment=environment.capture(), rows=rows, notes=notes,
        created=environment.now_utc(), op=op, shard=None if shard is None else str(shard),
    )


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
