"""Attribution on recorded allocator data, snapshots, and the validate comparison."""

import pickle
from pathlib import Path

import pytest
import torch.cuda._memory_viz as memory_viz

from mlamem import scenario, snapshot
from mlamem.attribution import UNATTRIBUTED, ExpectedBuffer, attribute
from mlamem.cli import main
from mlamem.kernels import FlashMLA
from mlamem.measure import measure_call
from mlamem.memory import SimulatedMemory
from mlamem.profile import run_profile
from mlamem.testing import one_line_error
from mlamem.validate import compare

GiB = 1024**3
FIXTURE = Path(__file__).parent / "fixtures" / "glm5-t1024-h200.snapshot.pickle"


def test_recorded_h200_trace_is_attributed():
    """A snapshot recorded on the H200 (alloc then workspace call, T=1024) names every buffer."""
    data = pickle.loads(FIXTURE.read_bytes())
    events = data["device_traces"][0]
    kernel = FlashMLA().allocations((1, 1024, 64, 576), 512, 132)
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
    sizes = {b["name"]: b["requested_bytes"] for b in alloc.buffers}
    assert sizes == {"padded_q": 2.25 * GiB, "out": 2 * GiB, "o_accum": 8 * GiB,
                     "lse": 8 << 20, "lse_accum": 16 << 20, "scheduler_metadata": 32,
                     "num_splits": 8}
    removed = {b["name"] for b in alloc.buffers if b["removed_by_workspace"]}
    assert removed == {"padded_q"}
    assert alloc.breakdown_peak_bytes == alloc.peak_allocated_bytes
    assert (alloc.allocations_in_call, result.rows[1].allocations_in_call) == (7, 6)


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


def test_snapshot_opens_with_torch_memory_viz(tmp_path):
    """--snapshot writes a pickle that PyTorch's own _memory_viz reads and plots."""
    target = tmp_path / "calls.pickle"
    assert main(["profile", "--tokens", "1024", "--predict", "--snapshot", str(target),
                 "--format", "json", "--output", str(tmp_path / "rows.json")]) == 0
    data = pickle.loads(target.read_bytes())
    assert "Summary of segments" in memory_viz.segsum(data)
    assert "<html" in memory_viz.trace_plot(data).lower()
    assert len(snapshot.build([])["device_traces"]) == 1


@pytest.mark.parametrize("target", ["/no/such/folder/s.pickle", "{tmp}"])
def test_bad_snapshot_path_is_one_line_exit_2(tmp_path, capsys, target):
    """A snapshot path in a missing folder, or a folder, exits 2 before any work; nothing written."""
    target = target.format(tmp=tmp_path)
    assert main(["profile", "--predict", "--snapshot", target]) == 2
    assert one_line_error(capsys).startswith("mlamem: error: --snapshot")
    assert list(tmp_path.iterdir()) == []
