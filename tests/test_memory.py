"""The simulated memory backend: meta tensors fed into the allocator model."""

import torch

from mlamem.memory import SimulatedMemory


def test_meta_views_allocate_nothing():
    """Views and in-place ops on meta tensors add no allocation; a view keeps its base alive."""
    memory = SimulatedMemory()
    with memory:
        base = torch.empty((1024, 1024), device="meta")
        view = base[:10].unsqueeze(0)
        view.zero_()
        assert memory.model.allocated_bytes == 4 << 20
        del base
        assert memory.model.allocated_bytes == 4 << 20
        del view
        assert memory.model.allocated_bytes == 0
