"""`--snapshot`: a PyTorch memory snapshot of the measured calls, predicted or measured."""

import pickle

import torch.cuda._memory_viz as memory_viz

from mlamem import snapshot
from mlamem.cli import main


def test_snapshot_opens_with_torch_memory_viz(tmp_path):
    """--snapshot writes a pickle that PyTorch's own _memory_viz reads and plots."""
    target = tmp_path / "calls.pickle"
    assert main(["profile", "--tokens", "1024", "--predict", "--snapshot", str(target),
                 "--format", "json", "--output", str(tmp_path / "rows.json")]) == 0
    data = pickle.loads(target.read_bytes())
    assert "Summary of segments" in memory_viz.segsum(data)
    assert "<html" in memory_viz.trace_plot(data).lower()
    assert len(snapshot.build([])["device_traces"]) == 1

