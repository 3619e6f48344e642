"""The protocol for one call, on the meta device: an OOM is a row, any kernel runs it."""

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
