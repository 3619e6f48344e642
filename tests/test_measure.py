"""The protocol for one call, on the meta device: an OOM is a row, any kernel runs it."""

import pytest
import torch

from mlamem import scenario
from mlamem.kernels import FlashMLA, Reference
from mlamem.measure import measure_call
from mlamem.memory import SimulatedMemory

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
    from mlamem.attribution import ExpectedBuffer
    from mlamem.measure import measure_one

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
    from mlamem.measure import measure_one

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
