"""The simulated memory backend: meta tensors fed into the allocator model."""

import pytest
import torch

from mlamem.runtime.memory import SimulatedMemory


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


def test_a_tensor_death_runs_no_python(monkeypatch):
    """A dying meta tensor only queues its block; the model frees it when next used, in ordinary
    code. So Ctrl-C (or any error) during a free surfaces there, never as an "Exception ignored"
    traceback from a finalizer, and never leaves a half-freed model for finalizers to trip on."""
    memory = SimulatedMemory()
    unraisable = []
    monkeypatch.setattr("sys.unraisablehook", unraisable.append)
    with memory:
        tensor = torch.empty(1 << 20, device="meta")
        model = memory.model

        def interrupted_free(block):
            raise KeyboardInterrupt

        monkeypatch.setattr(model, "free", interrupted_free)
        del tensor
        assert unraisable == []
        with pytest.raises(KeyboardInterrupt):  # the free runs when the model is next used
            memory.stats()
        assert unraisable == []


def test_out_of_memory_is_recognised_in_one_place():
    """torch's OOM, and FlashMLA's stable-ABI RuntimeError, with or without num_ooms."""
    from mlamem.runtime.memory import is_out_of_memory

    abi = RuntimeError('torch_call_dispatcher(... "aten::new_empty" ...) failed')
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB"))
    assert is_out_of_memory(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_out_of_memory(abi)  # no counts: the text decides
    assert is_out_of_memory(abi, 0, 1) and not is_out_of_memory(abi, 1, 1)  # counts decide
    assert not is_out_of_memory(RuntimeError("CUDA error: an illegal memory access"))
    assert not is_out_of_memory(ValueError("out of memory"))
