"""`--snapshot`: a PyTorch memory snapshot of the measured calls, predicted or measured."""

import json
import pickle
from pathlib import Path

import pytest
import torch
import torch.cuda._memory_viz as memory_viz

from mlamem.cli import main
from mlamem.runtime import snapshot
from mlamem.spec.errors import UserError


def test_snapshot_opens_with_torch_memory_viz(tmp_path):
    """--snapshot writes a pickle that PyTorch's own _memory_viz reads and plots: one device's
    trace holding every call's allocations, in the sweep's order, each of a buffer the profile
    names (alloc path: padded q, then the kernel's; workspace: the kernel's alone)."""
    target, rows = tmp_path / "calls.pickle", tmp_path / "rows.json"
    assert main(["profile", "--tokens", "1024", "--predict", "--snapshot", str(target),
                 "--format", "json", "--output", str(rows)]) == 0
    data = pickle.loads(target.read_bytes())
    assert "Summary of segments" in memory_viz.segsum(data)
    assert "<html" in memory_viz.trace_plot(data).lower()
    [trace] = data["device_traces"]
    buffers = [b["requested_bytes"] for row in json.loads(rows.read_text())["rows"]
               for b in row["buffers"]]
    assert [event["size"] for event in trace if event["action"] == "alloc"] == buffers
    assert len(buffers) == 7 + 6



# Reading a snapshot from elsewhere: untrusted input.

FIXTURE = Path(__file__).parent / "fixtures" / "glm5-t1024-h200.snapshot.pickle"
FIXTURES = FIXTURE.parent


class _RunsCommand:
    """A pickle that would run a shell command when loaded by pickle.loads."""

    def __reduce__(self):
        import os

        return (os.system, ("echo pwned > /tmp/mlamem-pwned",))


class _BuildsObject:
    """A pickle of an ordinary object: names its class."""


def test_read_takes_the_h200_snapshot_and_a_predicted_one(tmp_path):
    """The H200 fixture reads as plain data, and so does a predicted run's snapshot."""
    measured = snapshot.read(FIXTURE)
    assert len(measured["device_traces"][0]) == 38
    target = tmp_path / "p.pickle"
    assert main(["profile", "--tokens", "1024", "--predict", "--snapshot", str(target)]) == 0
    assert snapshot.read(target)["device_traces"][0][0]["action"] == "segment_alloc"


@pytest.mark.parametrize(("payload", "words"), [
    (pickle.dumps(_RunsCommand()), "names posix.system"),
    (pickle.dumps({"segments": [], "x": _BuildsObject()}), "_BuildsObject"),
    (pickle.dumps({"segments": [], "t": torch.zeros(2)}), "names torch"),
    (b"\x80\x04garbage", "not a pickle"),
    (bytes(range(256)) * 4, "not a"),
    (json.dumps({"segments": []}).encode(), "not a pickle"),
    (pickle.dumps([1, 2, 3]), "expected an object"),
    (pickle.dumps({"device_traces": [[]]}), "segments: missing"),
    (pickle.dumps({"segments": [{"address": "x", "total_size": 1, "blocks": []}]}),
     "segments[0].address: expected an integer"),
    (pickle.dumps({"segments": [], "device_traces": [[{"action": "alloc", "addr": 1}]]}),
     "device_traces[0][0].size: missing"),
])
def test_read_refuses_what_is_not_a_snapshot_in_one_line(tmp_path, payload, words):
    """A hostile or foreign file is a UserError naming the file and what is wrong, and nothing
    in it runs."""
    path = tmp_path / "s.pickle"
    path.write_bytes(payload)
    Path("/tmp/mlamem-pwned").unlink(missing_ok=True)
    with pytest.raises(UserError) as error:
        snapshot.read(path)
    assert str(path) in str(error.value) and words in str(error.value)
    assert "\n" not in str(error.value) and error.value.field is None
    assert not Path("/tmp/mlamem-pwned").exists()


def test_read_refuses_a_file_over_the_bound(tmp_path, monkeypatch):
    """A snapshot larger than MAX_SNAPSHOT_BYTES is refused before it is read."""
    monkeypatch.setattr(snapshot, "MAX_SNAPSHOT_BYTES", 1000)
    with pytest.raises(UserError, match="7255 bytes, more than a memory snapshot"):
        snapshot.read(FIXTURE)


@pytest.mark.parametrize("fixture", sorted(FIXTURES.glob("*.snapshot.pickle")),
                         ids=lambda p: p.name)
def test_the_recorded_snapshots_are_within_the_node_bound(fixture):
    """Every snapshot recorded on the H200 reads: the bound on reuse leaves real ones alone."""
    data = fixture.read_bytes()
    assert snapshot.within_nodes(pickle.loads(data), snapshot.MAX_NODES_PER_BYTE * len(data))
    assert snapshot.read(fixture)["segments"]


def test_nodes_count_each_reach_and_cycles():
    """A shared object counts each time it is reached (a dict's key and value one each), so a
    tree just over the cap is refused and one at it is not; a cycle is refused at any cap."""
    leaf = {"size": 1}  # 3 nodes
    tree = [leaf] * 4  # 1 + 4 x 3
    assert snapshot.within_nodes(tree, 13) and not snapshot.within_nodes(tree, 12)
    assert snapshot.within_nodes([[tree] * 10] * 10, 1 + 10 * (1 + 10 * 13))
    loop: list = [1]
    loop.append(loop)
    assert not snapshot.within_nodes({"segments": loop}, 10**9)
    deep: list = []
    for _ in range(100_000):  # deeper than Python's recursion limit
        deep = [deep]
    assert snapshot.within_nodes(deep, 100_001) and not snapshot.within_nodes(deep, 100_000)


def test_a_snapshots_nodes_are_counted_alike_on_the_fast_path():
    """The count that bounds a read snapshot (its events on a fast path) is the tree's, to the
    node: for the recorded snapshots and a synthetic one of 20,000 events, one with a shared
    frame list, one with a frame holding a list and one with an event holding itself."""
    from mlamem.testing import synthetic_snapshot

    odd = synthetic_snapshot(200)
    events = odd["device_traces"][0]
    events[5]["frames"] = events[9]["frames"] = events[7]["frames"]
    events[11]["frames"][0] = {**events[11]["frames"][0], "extra": [1, (2, 3)]}
    shots = [pickle.loads(f.read_bytes()) for f in sorted(FIXTURES.glob("*.snapshot.pickle"))]
    for data in [*shots, synthetic_snapshot(20_000), odd]:
        count = snapshot.nodes(data, 10**9)
        assert snapshot.snapshot_within_nodes(data, count)
        assert not snapshot.snapshot_within_nodes(data, count - 1)
    events[3]["me"] = events[3]
    assert not snapshot.snapshot_within_nodes(odd, 10**9)
