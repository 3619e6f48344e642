"""Attribution of recorded allocator events to named buffers, on an H200 trace and the model."""

import pickle
from pathlib import Path

from mlamem.commands.profile import run_profile
from mlamem.kernels.flashmla import flashmla_allocations
from mlamem.runtime.attribution import UNATTRIBUTED, ExpectedBuffer, attribute
from mlamem.spec import scenario

GiB = 1024**3
FIXTURE = Path(__file__).parent / "fixtures" / "glm5-t1024-h200.snapshot.pickle"


def test_recorded_h200_trace_is_attributed():
    """A snapshot recorded on the H200 (alloc then workspace call, T=1024) names every buffer."""
    data = pickle.loads(FIXTURE.read_bytes())
    events = data["device_traces"][0]
    kernel = flashmla_allocations((1, 1024, 64, 576), 512, 132)
    expected = ([ExpectedBuffer("padded_q", 1024 * 64 * 576 * 2, "wrapper")]
                + [ExpectedBuffer(s.name, s.nbytes, "kernel") for s in kernel]
                + [ExpectedBuffer(s.name, s.nbytes, "kernel") for s in kernel])
    breakdown = attribute(events, expected)
    names = [b.name for b in breakdown.buffers]
    assert names == ["padded_q", "out", "lse", "scheduler_metadata", "num_splits", "lse_accum",
                     "o_accum"] + [s.name for s in kernel]
    assert breakdown.missing == []
    assert any(frame for e in events for frame in e.get("frames", []))  # stacks were recorded


def test_unmatched_allocation_is_listed_not_dropped():
    """An allocation nobody expected is 'unattributed'; an expected one never seen is missing."""
    events = [{"action": "segment_alloc", "addr": 1, "size": 2 << 20},
              {"action": "alloc", "addr": 1, "size": 1000},
              {"action": "alloc", "addr": 2, "size": 4096},
              {"action": "free_completed", "addr": 1, "size": 1000}]
    breakdown = attribute(events, [ExpectedBuffer("lse", 4096, "kernel"),
                                   ExpectedBuffer("o_accum", 8192, "kernel")])
    assert [(b.name, b.block_bytes, b.segment_bytes) for b in breakdown.buffers] == [
        (UNATTRIBUTED, 1024, 2 << 20), ("lse", 4096, 0)]
    assert breakdown.missing == ["o_accum"]
    assert breakdown.peak_bytes == 1024 + 4096


def test_glm5_breakdown_at_32k_names_the_prs_buffers():
    """T=32768 alloc path: padded q 2.25 GiB, out 2 GiB, o_accum 8 GiB, lse 8 MiB, lse_accum 16 MiB."""
    result = run_profile(scenario.load("glm5-fp8-tp8"), [32768], ["alloc", "workspace"],
                         command="t", predict=True)
    alloc = result.rows[0]
    sizes = {b.name: b.requested_bytes for b in alloc.buffers}
    assert sizes == {"padded_q": 2.25 * GiB, "out": 2 * GiB, "o_accum": 8 * GiB,
                     "lse": 8 << 20, "lse_accum": 16 << 20, "scheduler_metadata": 32,
                     "num_splits": 8}
    removed = {b.name for b in alloc.buffers if b.removed_by_workspace}
    assert removed == {"padded_q"}
    assert alloc.breakdown_peak_bytes == alloc.peak_allocated_bytes
    assert (alloc.allocations_in_call, result.rows[1].allocations_in_call) == (7, 6)
