"""Non-torch memory as data: the host setups, and how the allocator model charges them."""

import dataclasses

import pytest
import torch

from mlamem.runtime.allocator import AllocatorOutOfMemory
from mlamem.runtime.memory import SimulatedMemory
from mlamem.runtime.non_torch import GRAPH_CAPTURE, LazyModule, calibrated, find_setup, load_setups

MiB = 1 << 20


def _setup(**changes):
    base = dataclasses.replace(load_setups()[0], process_bytes=0, context_bytes=500 * MiB,
                               gpu_memory_bytes=4096 * MiB,
                               unallocatable_bytes=0,
                               modules=(LazyModule("m", 62 * MiB, ("aten.normal_", "k.decode")),
                                        LazyModule("fill", 28 * MiB, ("aten.normal_",))))
    return dataclasses.replace(base, **changes)


def test_every_shipped_setup_names_its_command_and_date():
    """Each figure in non_torch.toml says what measured it and when."""
    for setup in load_setups():
        assert setup.command.startswith(("python3 scripts/non_torch_probe.py", "mlamem repro-oom"))
        assert setup.measured_on.count("-") == 2
        assert setup.context_bytes > 0 and all(m.bytes > 0 for m in setup.modules)


def test_first_launch_is_charged_once_and_takes_physical_memory():
    """A launch's first run adds its modules once; the physical device then has less."""
    memory = SimulatedMemory(non_torch=_setup())
    with memory:
        assert memory.non_torch_bytes() == 500 * MiB
        q = torch.empty((1024, 1024), device="meta")
        q.normal_()
        q.normal_()
        memory.launch("k.decode")  # its module came with normal_'s: nothing more
        assert memory.non_torch_bytes() == 590 * MiB
        del q
        memory.empty_cache()
        # 4096 - 590 MiB are left on the device: 3506 MiB fit, 3508 do not (2 MiB rounding)
        fits = torch.empty(3506 * MiB, dtype=torch.uint8, device="meta")
        del fits
        memory.empty_cache()
        with pytest.raises(AllocatorOutOfMemory):
            torch.empty(3508 * MiB, dtype=torch.uint8, device="meta")


def test_the_cap_binds_when_it_is_lower_than_the_device():
    """An 80 GB target on a larger host: the cap, not the physical memory, limits torch."""
    memory = SimulatedMemory(non_torch=_setup())
    with memory:
        assert memory.set_limit(1024 * MiB) == 1024 * MiB
        with pytest.raises(AllocatorOutOfMemory):
            torch.empty(1026 * MiB, dtype=torch.uint8, device="meta")


def test_without_a_setup_nothing_is_charged():
    """The profile's model has no host: no non-torch memory, no physical limit."""
    memory = SimulatedMemory()
    with memory:
        torch.empty(10, device="meta").normal_()
        assert memory.non_torch_bytes() is None


def test_no_gpu_takes_the_kernels_first_setup_and_says_so():
    """On a CPU the prediction emulates the recorded host, labelled as assumed."""
    setup = find_setup("flashmla")
    assert setup.gpu == "NVIDIA H200" and "predicted as the NVIDIA H200" in setup.assumed
    other = find_setup("triton")
    assert "triton not measured" in other.assumed


def test_a_prediction_does_not_read_the_local_gpu(monkeypatch):
    """On an H100 (80 GB), a measured run models this host and its physical memory; a prediction
    models the recorded host, as on a CPU, so an H200 target is not capped at the local 79 GiB
    (seen on an H100 on 2026-12-05: predicted DeepSeek-V3.2 found no room for its KV cache)."""
    from types import SimpleNamespace

    from mlamem.commands.repro import host_setup

    h100 = SimpleNamespace(name="NVIDIA H100 80GB HBM3", total_memory=85017493504)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: h100)
    local = host_setup("flashmla")
    assert (local.gpu, local.gpu_memory_bytes) == (h100.name, h100.total_memory)
    assert "no record for flashmla on NVIDIA H100 80GB HBM3" in local.assumed
    assert host_setup("flashmla", predict=True) == find_setup("flashmla")
    assert find_setup("flashmla").gpu_memory_bytes == 150109880320


def _room_left_mib(memory) -> int:
    """The largest allocation, in 2 MiB steps, that fits on `memory`'s physical device (the cap
    set to the whole device, as an engine sets it first)."""
    fitting = 0
    with memory:
        memory.set_limit(4096 * MiB)
        for size_mib in range(3500, 4096, 2):
            try:
                block = torch.empty(size_mib * MiB, dtype=torch.uint8, device="meta")
            except AllocatorOutOfMemory:
                break
            del block
            memory.empty_cache()
            fitting = size_mib
    return fitting


def test_the_model_charges_this_process_own_and_keeps_process_bytes_on_the_device():
    """The charge is the context and the modules (what a per-process NVML reading holds); the
    3 MiB outside the process (device-wide only) still take the physical device."""
    memory = SimulatedMemory(non_torch=_setup(process_bytes=3 * MiB))
    with memory:
        assert memory.non_torch_bytes() == 500 * MiB
    assert _room_left_mib(memory) == 4096 - 3 - 500 - 1  # 3593 MiB left: 3592 in 2 MiB steps


def test_calibration_to_this_process_own_figure_moves_the_charge_only():
    """A case that measured 3 MiB more of its own: the model charges 3 MiB more, and the part
    outside the process stays as recorded."""
    setup = _setup(process_bytes=3 * MiB)
    moved = calibrated(setup, 500 * MiB, 503 * MiB)
    assert (moved.context_bytes, moved.process_bytes) == (503 * MiB, 3 * MiB)
    assert moved.modules == setup.modules
    memory = SimulatedMemory(non_torch=moved)
    with memory:
        assert memory.non_torch_bytes() == 503 * MiB
    assert _room_left_mib(memory) == 4096 - 3 - 503  # 3590 MiB


def test_calibration_to_a_device_wide_figure_holds_what_lies_outside_the_process():
    """The device-wide fallback charges 506 MiB where the model charged 500: the charge is 506
    MiB and the device has 506 MiB less, the recorded 3 MiB outside the process not twice."""
    moved = calibrated(_setup(process_bytes=3 * MiB), 500 * MiB, 506 * MiB, device_wide=True)
    assert (moved.context_bytes, moved.process_bytes) == (506 * MiB, 0)
    memory = SimulatedMemory(non_torch=moved)
    with memory:
        assert memory.non_torch_bytes() == 506 * MiB
    assert _room_left_mib(memory) == 4096 - 506  # 3590 MiB


def test_a_shared_module_loads_with_whichever_launch_comes_first():
    """The decode alone loads only the shared module; a later fill adds only its own."""
    memory = SimulatedMemory(non_torch=_setup(modules=(
        LazyModule("shared", 62 * MiB, ("aten.fill_", "k.decode")),
        LazyModule("fill", 28 * MiB, ("aten.fill_",)))))
    with memory:
        memory.launch("k.decode")
        assert memory.non_torch_bytes() == 562 * MiB
        torch.empty(4, device="meta").fill_(1.0)
        assert memory.non_torch_bytes() == 590 * MiB


def test_first_graph_capture_is_charged_once_and_read_as_mem_get_info_would():
    """A process's first CUDA-graph capture takes the setup's GRAPH_CAPTURE memory outside the
    allocator: device_used_bytes (mem_get_info's reading) is the model's reserved plus the
    non-torch memory so far, in whole 2 MiB; a later capture or a second pool adds only its
    segments; without a setup it stays None."""
    setup = _setup(context_bytes=500 * MiB + 1,
                   modules=(LazyModule("graph", 70 * MiB, (GRAPH_CAPTURE,)),))
    memory = SimulatedMemory(non_torch=setup)
    with memory:
        assert memory.device_used_bytes() == 502 * MiB  # 500 MiB + 1 B, up to 2 MiB steps
        for _ in range(2):  # the second pool: the first capture's memory stays, charged once
            with memory.graphs() as graphs:
                for _ in range(2):
                    with graphs.capture():
                        block = torch.empty(3 * MiB, dtype=torch.uint8, device="meta")
                    del block
                reserved = memory.stats().reserved
                assert reserved == 22 * MiB  # a 20 MiB segment and the RNG state's 2 MiB
                assert memory.device_used_bytes() == 572 * MiB + reserved
            assert memory.device_used_bytes() == 572 * MiB
        assert [m.name for m in memory.loaded] == ["graph"]
    assert SimulatedMemory().device_used_bytes() is None
