"""`mlamem validate`: the prediction against the hardware, buffer by buffer, to the byte.

This is what makes the no-GPU mode trustworthy: every (scenario, T, path) is run twice, on the
GPU and on the allocator model, and every figure must agree exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from mlamem.commands.sweep import DROP_CASE, check_allocation_spec, check_request, check_runs_here
from mlamem.operations import operation, workspace_rows
from mlamem.spec.kernel_api import SPARSE_DECODE

if TYPE_CHECKING:  # the checks import cheaply; run_validation loads torch, the results pydantic
    from mlamem.results.validate import Comparison
    from mlamem.runtime.measure import CallMeasurement
    from mlamem.spec.kernel_api import KernelContract
    from mlamem.spec.scenario import Scenario

SCHEMA = "mlamem.validate/1"
DEFAULT_TOKENS = operation(SPARSE_DECODE).validate_sweep  # what validate runs of the sparse decode
GRAPHS = "graphs"  # the op of CUDA-graph comparisons: tokens is the capture size, 0 all of them


def comparison(scenario: str, tokens: int, path: str, item: str, metric: str,
               predicted: int | None, measured: int | None, op: str,
               frames: tuple[str | None, str | None] = (None, None)) -> Comparison:
    """One figure, predicted and measured, and their difference (None where either is)."""
    from mlamem.results.validate import Comparison

    difference = None if predicted is None or measured is None else measured - predicted
    return Comparison(scenario=scenario, tokens=tokens, path=path, item=item, metric=metric,
                      predicted=predicted, measured=measured, difference=difference, op=op,
                      predicted_frame=frames[0], measured_frame=frames[1])


def compare(scenario: str, measured: CallMeasurement,
            predicted: CallMeasurement) -> list[Comparison]:
    """Every buffer (in allocation order, by name, with its frame on either side) and the
    totals, allocated and reserved."""
    def row(item, metric, p, m, frames=(None, None)):
        return comparison(scenario, measured.tokens, measured.path, item, metric, p, m,
                          measured.op, frames)

    rows = [row("total", "allocated", predicted.peak_allocated_bytes, measured.peak_allocated_bytes),
            row("total", "reserved", predicted.peak_reserved_bytes, measured.peak_reserved_bytes)]
    pred = predicted.breakdown.buffers if predicted.breakdown else []
    meas = measured.breakdown.buffers if measured.breakdown else []
    for i in range(max(len(pred), len(meas))):
        p = pred[i] if i < len(pred) else None
        m = meas[i] if i < len(meas) else None
        if p and m and p.name != m.name:
            name = f"{p.name} (predicted) / {m.name} (measured)"
        else:
            name = (m or p).name
        frames = (p and p.frame, m and m.frame)
        rows.append(row(name, "allocated", p and p.block_bytes, m and m.block_bytes, frames))
        rows.append(row(name, "reserved", p and p.segment_bytes, m and m.segment_bytes, frames))
    return rows


def compare_graphs(scenario: str, measured, predicted) -> list[Comparison]:
    """Graphs (mlamem.commands.graphs GraphPath, measured and predicted) figure by figure: per capture
    its peak inside (allocated) and the pool's growth (reserved), and every buffer as
    `compare` does; for the whole list (tokens 0) what stays allocated and the pool."""
    def row(tokens, item, metric, p, m):
        return comparison(scenario, tokens, measured.path, item, metric, p, m, GRAPHS)

    rows = []
    predicted_by_size = {c.tokens: c for c in predicted.captures}
    for m in measured.captures:
        p = predicted_by_size.get(m.tokens)
        rows += [row(m.tokens, "total", "allocated", p and p.peak_allocated_bytes,
                     m.peak_allocated_bytes),
                 row(m.tokens, "total", "reserved", p and p.pool_growth_bytes,
                     m.pool_growth_bytes)]
        pred, meas = (p.buffers if p else []), m.buffers
        for i in range(max(len(pred), len(meas))):
            pb = pred[i] if i < len(pred) else None
            mb = meas[i] if i < len(meas) else None
            name = (mb or pb).name
            if pb and mb and pb.name != mb.name:
                name = f"{pb.name} (predicted) / {mb.name} (measured)"
            rows += [row(m.tokens, name, "allocated", pb and pb.block_bytes,
                         mb and mb.block_bytes),
                     row(m.tokens, name, "reserved", pb and pb.segment_bytes,
                         mb and mb.segment_bytes)]
    rows += [row(0, "total", "allocated", predicted.held_bytes, measured.held_bytes),
             row(0, "total", "reserved", predicted.pool_bytes, measured.pool_bytes)]
    return rows


def run_graph_validation(scenarios: Sequence[Scenario], paths: Sequence[str],
                         kernel: KernelContract, sizes: Sequence[int] | None = None,
                         on_path: Callable[[str, str], None] | None = None) -> list[Comparison]:
    """Capture each scenario's list (or `sizes`) on every path, on the GPU and on the model,
    and compare (`compare_graphs`); needs the kernel to run here."""
    from mlamem.commands.graphs import measure_path, sizes_to_capture
    from mlamem.runtime.measure import local_sm_count
    from mlamem.runtime.memory import CudaMemory, SimulatedMemory

    check_sweep([], paths, kernel)
    sm_count = local_sm_count()
    rows = []
    for scenario in scenarios:
        chosen = sizes_to_capture(scenario, sizes)
        for path in paths:
            measured, predicted = (measure_path(memory, scenario, kernel, path, chosen,
                                                sm_count=sm_count)
                                   for memory in (CudaMemory(), SimulatedMemory()))
            rows += compare_graphs(scenario.name, measured, predicted)
            if on_path is not None:
                on_path(scenario.name, path)
    return rows


def sweep_cases(sweep) -> list[tuple[Scenario, str, Sequence[int]]]:
    """(scenario, op, values) triples; a (scenario, tokens) pair is the sparse decode's."""
    return [item if len(item) == 3 else (item[0], SPARSE_DECODE, item[1]) for item in sweep]


def check_sweep(sweep, paths: Sequence[str], kernel: KernelContract) -> None:
    """Refuse, before any work, a case that cannot run or a machine that cannot measure.
    `sweep`: (scenario, op, values) or (scenario, tokens) items."""
    check_allocation_spec(kernel)
    for scenario, op, tokens in sweep_cases(sweep):
        check_request(scenario, tokens, paths, kernel, fix=DROP_CASE, op=op)
    check_runs_here(kernel)


def run_validation(sweep, paths: Sequence[str], kernel: KernelContract | None = None,
                   on_case: Callable[[str, int, str], None] | None = None,
                   kv_tokens: int | None = None) -> list[Comparison]:
    """Measure and predict every (scenario, op, values) of `sweep` (or (scenario, T) for the
    sparse decode) on every path with `kernel` (default: the registry's default kernel);
    needs it to run here. `kv_tokens` overrides each operation's KV length."""
    from mlamem.kernels import DEFAULT_KERNEL, load_kernel
    from mlamem.runtime.measure import local_sm_count, measure_call
    from mlamem.runtime.memory import CudaMemory, SimulatedMemory

    kernel = kernel or load_kernel(DEFAULT_KERNEL)()
    check_sweep(sweep, paths, kernel)
    sm_count = local_sm_count()
    rows = []
    for scenario, op, tokens in sweep_cases(sweep):
        for t in tokens:
            for path in paths:
                kwargs = {"sm_count": sm_count, "max_tokens": workspace_rows(scenario, op),
                          "op": op, "kv_tokens": kv_tokens}
                measured = measure_call(CudaMemory(record_stacks=True), scenario, kernel, t,
                                        path, **kwargs)
                predicted = measure_call(SimulatedMemory(record_stacks=True), scenario, kernel,
                                         t, path, **kwargs)
                rows += compare(scenario.name, measured, predicted)
                if on_case:
                    on_case(scenario.name, t, path)
    return rows
