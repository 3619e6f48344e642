"""`--snapshot`: a PyTorch memory snapshot of the measured calls, predicted or measured."""

import json
import pickle

import torch.cuda._memory_viz as memory_viz

from mlamem.cli import main


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

