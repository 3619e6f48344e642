"""validate's comparison: exact to the byte, one difference per figure that moved."""

from mlamem import scenario
from mlamem.kernels import FlashMLA
from mlamem.measure import measure_call
from mlamem.memory import SimulatedMemory
from mlamem.validate import compare


def test_validate_compare_reports_byte_differences():
    """compare() is exact: equal calls agree; one changed byte count is a difference."""
    glm = scenario.load("glm5-fp8-tp8")
    kwargs = {"sm_count": 132, "max_tokens": 32768}
    a = measure_call(SimulatedMemory(), glm, FlashMLA(), 1024, "alloc", **kwargs)
    b = measure_call(SimulatedMemory(), glm, FlashMLA(), 1024, "alloc", **kwargs)
    assert all(c.agrees for c in compare("glm5", a, b))
    a.peak_reserved_bytes += 2 << 20  # the "measured" side
    differing = [c for c in compare("glm5", a, b) if not c.agrees]
    assert [(c.item, c.metric, c.difference) for c in differing] == [("total", "reserved", 2 << 20)]
