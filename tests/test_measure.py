"""The protocol for one call, on the meta device: an OOM is a row, any kernel runs it."""

import pytest
import torch

from mlamem.kernels import FlashMLA, Reference
from mlamem.runtime.measure import measure_call
from mlamem.runtime.memory import SimulatedMemory
from mlamem.spec import scenario

GiB = 1024**3


def test_simulated_oom_is_a_row():
    """Under a memory limit the prediction reports an OOM row with the failing request."""
    glm = scenario.load("glm5-fp8-tp8")
    row = measure_call(SimulatedMemory(limit_bytes=2 * GiB), glm, FlashMLA(), 8192, "alloc",
                       sm_count=132, max_tokens=32768)
    assert row.oom and row.peak_allocated_bytes is None
    assert row.oom_requested_bytes == 2 * 8192 * 64 * 512 * 4  # o_accum


def test_reference_kernel_runs_the_same_protocol_on_meta():
    """The torch reference runs itself on the meta device; its temporaries are unattributed."""
    glm = scenario.load("glm5-fp8-tp8")
    row = measure_call(SimulatedMemory(), glm, Reference(), 256, "alloc", sm_count=132,
                       max_tokens=32768)
    assert row.failure is None
    names = {b.name for b in row.breakdown.buffers}
    assert "padded_q" in names and "unattributed" in names
    assert row.breakdown.peak_bytes == row.peak_allocated_bytes


def test_measure_one_is_one_record_with_the_failure():
    """One call, predicted: peaks, named buffers and failure None; an OOM is a Failure."""
    from mlamem.runtime.attribution import ExpectedBuffer
    from mlamem.runtime.measure import measure_one

    memory = SimulatedMemory(limit_bytes=GiB)
    with memory:
        expected = [ExpectedBuffer("a", 1 << 20, "user")]
        fits = measure_one(memory, lambda: torch.empty(1 << 20, dtype=torch.uint8,
                                                       device="meta"), expected)
        assert fits.failure is None and fits.peak_allocated_bytes == 1 << 20
        assert [b.name for b in fits.buffers] == ["a"] and fits.value.numel() == 1 << 20
        fits.value = None
        oom = measure_one(memory, lambda: torch.empty(2 * GiB, dtype=torch.uint8, device="meta"))
        assert oom.oom and oom.failure.requested_bytes == 2 * GiB
        assert oom.peak_allocated_bytes is None and oom.trace is not None


def test_measure_one_raises_other_errors_when_asked_and_interrupts_always():
    """raise_errors: an error that is no OOM propagates; an interrupt always does, and the
    watch is closed (the model's trace is off)."""
    from mlamem.runtime.measure import measure_one

    def bad():
        raise ValueError("bad shape")

    def interrupted():
        raise KeyboardInterrupt

    memory = SimulatedMemory()
    with memory:
        assert measure_one(memory, bad).failure.text == "ValueError: bad shape"
        with pytest.raises(ValueError, match="bad shape"):
            measure_one(memory, bad, raise_errors=True)
        with pytest.raises(KeyboardInterrupt):
            measure_one(memory, interrupted)
        assert memory.model.trace is None


def _shipped_calls():
    """(scenario, kernel, op) for every shipped kernel and scenario pair that has the call."""
    from mlamem.kernels import load_kernel
    from mlamem.operations import reads_cache, scenario_operations
    from mlamem.spec.kernel_registry import SHIPPED

    for name in scenario.shipped_names():
        at = scenario.load(name)
        for kernel_name in SHIPPED:
            kernel = load_kernel(kernel_name)()
            for op in scenario_operations(at):
                if op in kernel.operations and reads_cache(kernel, at, op):
                    yield at, kernel, op


def test_padded_heads_have_one_function():
    """A scenario's padded heads are computed in operations.padded_heads_for alone (no other
    module asks a kernel's capabilities to pad heads_per_rank), and the plan gives them."""
    import ast
    from pathlib import Path

    import mlamem
    from mlamem.operations import kv_format, padded_heads_for
    from mlamem.runtime.measure import plan_call

    root = Path(mlamem.__file__).parent
    padding = set()
    for source in root.rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "padded_heads"
                    and "heads_per_rank" in ast.unparse(node)):
                padding.add(source.relative_to(root).as_posix())
    assert padding == {"operations/__init__.py"}
    calls = list(_shipped_calls())
    assert {kernel.name for _, kernel, _ in calls} >= {"flashmla", "triton", "flashinfer"}
    for at, kernel, op in calls:
        padded = kernel.capabilities(op, kv_format(at, op)).padded_heads(at.heads_per_rank)
        assert padded_heads_for(kernel, at, op) == padded
        assert plan_call(at, kernel, op, 64, "alloc", sm_count=132).padded_heads == padded


@pytest.mark.parametrize("path", ["alloc", "workspace", "workspace-full"])
def test_the_plan_expects_what_the_simulated_call_allocates(path):
    """For every shipped kernel and scenario: the simulated call allocates the plan's expected
    buffers, each once, and nothing else (the torch reference's own temporaries aside)."""
    from mlamem.operations import call_capabilities, workspace_rows
    from mlamem.runtime.measure import plan_call
    from mlamem.runtime.paths import missing_for_full_staging

    for at, kernel, op in _shipped_calls():
        if path == "workspace-full" and missing_for_full_staging(call_capabilities(kernel, at, op)):
            continue
        planned = plan_call(at, kernel, op, 64, path, sm_count=132)
        row = measure_call(SimulatedMemory(), at, kernel, 64, path, sm_count=132,
                           max_tokens=workspace_rows(at, op), op=op)
        assert row.failure is None and row.staged == planned.staged
        assert row.breakdown.missing == []
        named = [b.name for b in row.breakdown.buffers if b.allocated_by != "unknown"]
        assert sorted(named) == sorted(e.name for e in planned.expected), (at.name, kernel.name)
        if not kernel.runs_on_meta:
            assert len(row.breakdown.buffers) == len(planned.expected)


def test_graph_captures_and_the_decode_step_run_the_plan():
    """A graph capture's call at each size is the plan at that size (its expected buffers);
    the engine's step expects its activations, then the plan's buffers."""
    from mlamem.engines.decode_rank import activation_specs
    from mlamem.operations import SPARSE_DECODE
    from mlamem.runtime.graph_capture import CallGraphs
    from mlamem.runtime.measure import plan_call

    glm, kernel, memory = scenario.load("glm5-fp8-tp8"), FlashMLA(), SimulatedMemory()
    with memory:
        graphs = CallGraphs.make(memory, glm, kernel, "workspace", 512, sm_count=132)
        for tokens in (512, 8):
            step, expected = graphs.step_and_expected(memory, tokens)
            planned = plan_call(glm, kernel, SPARSE_DECODE, tokens, "workspace", sm_count=132)
            assert expected == planned.expected
            out, lse = step()
            assert out.shape == (tokens, glm.heads_per_rank, glm.d_v)
        del step, out, lse, graphs
    assert [s.name for s in activation_specs(glm, 8)][-2:] == ["q", "attn_output"]
