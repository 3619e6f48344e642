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


def test_a_larger_gpu_emulating_a_target_keeps_to_the_models_room(monkeypatch):
    """A measured run on a larger GPU (an H200) with an H100 target caps the allocator where the
    model with the target as the physical device limits it: the target's memory less this
    process's non-torch reading, the target's driver bytes and unallocatable bytes, and, at each
    first launch, the modules its record charges (the step's fill: 90 MiB)."""
    from mlamem.runtime.memory import CudaMemory, NonTorchReading
    from mlamem.runtime.non_torch import target_setup

    target = target_setup("flashmla", 85017493504)  # the H100's record
    own = target.context_bytes + 2 * 2**20  # read at KV sizing: the context and randint's module
    fractions = []
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction",
                        lambda fraction, device: fractions.append(fraction))
    memory = object.__new__(CudaMemory)
    memory.device, memory.total_bytes, memory._limited = torch.device("cuda"), 150109880320, False
    memory.loaded, memory._cap, memory._device_non_torch, memory._loaded_since = [], None, 0, 0
    monkeypatch.setattr(memory, "non_torch_reading", lambda: NonTorchReading(
        "this process", own, own + 12 * 2**20, 0), raising=False)
    memory.emulate_target(target)
    model = SimulatedMemory(non_torch=target)
    engine_cap = 85017493504 - own
    for launch in ("aten.randint", None, "aten.new_zeros", "flashmla.decode"):
        if launch is None:  # KV sizing: the cap from the reading, which holds randint's module
            memory.set_limit(engine_cap)
            model.set_limit(engine_cap)
            assert memory._cap == engine_cap
        else:
            memory.launch(launch)
            model.launch(launch)
        if fractions:
            assert abs(fractions[-1] * memory.total_bytes - model.model.limit_bytes) < 1, launch
    assert len(fractions) == 2  # at KV sizing, then at the fill: the decode loads nothing new
    assert model.model.limit_bytes == engine_cap - target.process_bytes - 90 * 2**20 - 4 * 2**20
