"""nvml.py's per-process figures against a fake pynvml, injected where nvml.py imports it."""

import os
import sys
import time
import types

import pytest

from mlamem import nvml

GIB = 1024**3
OWN = 3 * GIB  # this process's memory in the fake's lists


class FakeNVMLError(Exception):
    pass


def fake_pynvml(processes, *, queries=nvml.PROCESS_QUERIES, failing=(), used=lambda: OWN):
    """A pynvml module offering `queries` (each listing `processes`; those in `failing` raise
    NVMLError, as a driver without the function does) and a device used memory of `used()`."""
    module = types.ModuleType("pynvml")
    module.NVMLError = FakeNVMLError
    module.nvmlInit = lambda: None
    module.calls = []
    module.nvmlDeviceGetMemoryInfo = lambda handle: types.SimpleNamespace(used=used())

    def query(name):
        def run(handle):
            module.calls.append(name)
            if name in failing:
                raise FakeNVMLError(name)
            return [types.SimpleNamespace(pid=pid, usedGpuMemory=bytes_) for pid, bytes_ in processes]
        return run
    for name in queries:
        setattr(module, name, query(name))
    return module


@pytest.fixture
def install(monkeypatch):
    """Install a fake pynvml for nvml.py's lazy import; the caches are cleared around it."""
    def put(module):
        monkeypatch.setitem(sys.modules, "pynvml", module)
        nvml._pynvml.cache_clear()
        nvml._initialised.cache_clear()
        return module
    yield put
    nvml._pynvml.cache_clear()
    nvml._initialised.cache_clear()


def test_this_process_listed_gives_its_memory(install):
    install(fake_pynvml([(1, 5 * GIB), (os.getpid(), OWN)]))
    assert nvml.process_used_bytes("handle") == OWN
    assert nvml.process_visibility("handle") == nvml.THIS_PROCESS


def test_a_list_without_our_pid_says_pid_namespace(install):
    """A container: NVML lists the host's pids, none of them ours."""
    install(fake_pynvml([(os.getpid() + 1, OWN), (os.getpid() + 2, GIB)]))
    assert nvml.process_used_bytes("handle") is None
    assert nvml.process_visibility("handle") == nvml.NOT_LISTED
    assert nvml.process_used_bytes("handle", pid=os.getpid() + 2) == GIB


def test_listed_without_memory_is_not_a_figure(install):
    install(fake_pynvml([(os.getpid(), None)]))
    assert nvml.process_used_bytes("handle") is None
    assert nvml.process_visibility("handle") == nvml.NOT_REPORTED


def test_a_driver_without_v3_answers_through_v2(install):
    fake = install(fake_pynvml([(os.getpid(), OWN)],
                               failing=("nvmlDeviceGetComputeRunningProcesses_v3",)))
    assert nvml.process_used_bytes("handle") == OWN
    assert fake.calls == list(nvml.PROCESS_QUERIES[:2])


def test_an_older_pynvml_offers_only_the_plain_query(install):
    fake = install(fake_pynvml([(os.getpid(), OWN)],
                               queries=("nvmlDeviceGetComputeRunningProcesses",)))
    assert nvml.process_used_bytes("handle") == OWN
    assert fake.calls == ["nvmlDeviceGetComputeRunningProcesses"]


class FakeMismatchError(Exception):
    """pynvml's NVMLLibraryMismatchError, which is no NVMLError."""


def test_no_query_answering_is_no_process_list(install):
    """v3 and v2 missing from the driver's library, and the unversioned wrapper raising
    pynvml's version mismatch (no NVMLError), as it does then."""
    fake = install(fake_pynvml([(os.getpid(), OWN)], failing=nvml.PROCESS_QUERIES[:2]))
    fake.NVMLLibraryMismatchError = FakeMismatchError

    def mismatch(handle):
        raise FakeMismatchError("Unversioned function called")
    fake.nvmlDeviceGetComputeRunningProcesses = mismatch
    assert nvml.process_used_bytes("handle") is None
    assert nvml.process_visibility("handle") == nvml.NO_PROCESS_LIST
    assert nvml.process_visibility(None) == nvml.NO_PROCESS_LIST


def test_sampler_keeps_a_neighbour_out_of_the_process_peak(install):
    """A neighbour's 2 GiB shows from the second reading on: the device-wide peak has it, this
    process's does not."""
    readings = iter(range(1_000_000))
    install(fake_pynvml([(os.getpid(), OWN)],
                        used=lambda: OWN + (2 * GIB if next(readings) else 0)))
    with nvml.PeakSampler("handle") as sampler:
        pass
    assert (sampler.start_bytes, sampler.peak_bytes) == (OWN, OWN + 2 * GIB)
    assert (sampler.process_start_bytes, sampler.process_peak_bytes) == (OWN, OWN)


def test_sampler_stops_asking_for_an_unlisted_process(install):
    fake = install(fake_pynvml([(os.getpid() + 1, OWN)]))
    with nvml.PeakSampler("handle", interval_s=0.001) as sampler:
        time.sleep(0.02)  # some twenty ticks
    assert sampler.peak_bytes == OWN
    assert sampler.process_peak_bytes is None and sampler.process_start_bytes is None
    assert fake.calls == ["nvmlDeviceGetComputeRunningProcesses_v3"]  # the entry's only


def test_other_processes_are_the_device_wide_reading_less_ours(install):
    """CudaMemory's other_processes_bytes: NVML's device-wide used memory minus this process's
    entry; None where NVML does not list this process (read through nvml alone: no CUDA)."""
    from mlamem.memory import CudaMemory
    memory = object.__new__(CudaMemory)  # its NVML readings only: __init__ needs a GPU
    memory.nvml_handle = "handle"
    install(fake_pynvml([(os.getpid(), OWN)], used=lambda: OWN + 2 * GIB))
    assert (memory.process_visibility, memory.other_processes_bytes()) == (nvml.THIS_PROCESS, 2 * GIB)
    install(fake_pynvml([(os.getpid() + 1, OWN)], used=lambda: OWN + 2 * GIB))
    assert (memory.process_visibility, memory.other_processes_bytes()) == (nvml.NOT_LISTED, None)
