"""validate's comparison: exact to the byte, one difference per figure that moved."""

from mlamem.commands.validate import compare
from mlamem.kernels import FlashMLA
from mlamem.runtime.measure import measure_call
from mlamem.runtime.memory import SimulatedMemory
from mlamem.spec import scenario


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


def test_compared_buffers_carry_their_frames_and_a_difference_names_it():
    """With stacks on both sides, as validate records them, each buffer's comparison carries
    its frame on either side: here the line of this test that ran each (the innermost frame
    outside mlamem); a differing buffer's line in the table says where it was allocated."""
    import dataclasses
    import sys

    from mlamem.render.validate import validation_table

    glm = scenario.load("glm5-fp8-tp8")
    kwargs = {"sm_count": 132, "max_tokens": 32768}
    line = sys._getframe().f_lineno + 1
    a = measure_call(SimulatedMemory(record_stacks=True), glm, FlashMLA(), 1024, "alloc", **kwargs)
    b = measure_call(SimulatedMemory(record_stacks=True), glm, FlashMLA(), 1024, "alloc", **kwargs)
    here = "tests/test_validate.py:{} test_compared_buffers_carry_their_frames_and_a_difference_names_it"
    rows = compare("glm5", a, b)  # a: the measured side
    buffers = [c for c in rows if c.item != "total"]
    assert len(buffers) == 14  # padded_q and the kernel's six, allocated and reserved
    assert {(c.predicted_frame, c.measured_frame) for c in buffers} == {
        (here.format(line + 1), here.format(line))}
    assert all(c.predicted_frame is None for c in rows if c.item == "total")
    assert all(c.agrees for c in rows)

    a.call.breakdown = dataclasses.replace(a.breakdown, buffers=[
        dataclasses.replace(u, block_bytes=u.block_bytes + 512) if u.name == "padded_q" else u
        for u in a.breakdown.buffers])
    text = " ".join(validation_table(compare("glm5", a, b), "test").split())
    assert ("DIFFERS: glm5 T=1024 alloc padded_q allocated: predicted 75497472 B, measured "
            f"75497984 B (+512 B), at {here.format(line)}") in text
