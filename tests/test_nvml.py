"""nvml.py's per-process figures against a fake pynvml, injected where nvml.py imports it, and
the non-torch memory repro-oom charges from them."""

import os
import sys
import time
import types

import pytest

from mlamem.runtime import nvml

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


def test_other_processes_are_the_device_wide_reading_less_ours(install, monkeypatch):
    """CudaMemory's other_processes_bytes: NVML's device-wide used memory minus this process's
    entry; None where NVML does not list this process."""
    memory = _cuda_memory(monkeypatch)
    install(fake_pynvml([(os.getpid(), OWN)], used=lambda: OWN + 2 * GIB))
    assert (memory.process_visibility, memory.other_processes_bytes()) == (nvml.THIS_PROCESS, 2 * GIB)
    install(fake_pynvml([(os.getpid() + 1, OWN)], used=lambda: OWN + 2 * GIB))
    assert (memory.process_visibility, memory.other_processes_bytes()) == (nvml.NOT_LISTED, None)


# repro-oom's charge through the fake door: CudaMemory's NVML readings, torch's reserved memory
# given (this machine has no CUDA allocator to read it from)
RESERVED = 2 * GIB
OTHERS = 5 * GIB  # a neighbour's use before the case's process touched CUDA
OUTSIDE = 1 << 20  # what NVML counts as used outside any process


def _cuda_memory(monkeypatch):
    """A CudaMemory without __init__ (which needs a GPU), reading NVML through the fake door,
    with RESERVED bytes reserved by torch and OTHERS used by the others at start."""
    from mlamem.runtime.memory import CudaMemory, MemoryStats
    memory = object.__new__(CudaMemory)
    memory.nvml_handle, memory.used_by_others = "handle", OTHERS
    monkeypatch.setattr(memory, "stats", lambda device=True: MemoryStats(
        allocated=RESERVED, reserved=RESERVED, peak_allocated=RESERVED, peak_reserved=RESERVED,
        device_used=None, num_ooms=0), raising=False)
    return memory


def _recorded(memory):
    """A vLLM case's KV sizing, recorded from `memory`."""
    from mlamem.engines.vllm import VLLMCase
    case = VLLMCase(path="workspace", max_num_batched_tokens=1024, measured=True)
    case.record_non_torch(memory)
    return case


def test_a_listed_process_is_charged_its_own_figure(install, monkeypatch):
    """NVML lists this process: the cap and the KV sizing charge its own memory less reserved;
    the device-wide reading (less the others' use at start) is recorded beside it, labelled."""
    from mlamem.commands.repro import non_torch_notes
    from mlamem.engines.base import non_torch_now
    install(fake_pynvml([(os.getpid() + 1, OTHERS), (os.getpid(), OWN)],
                        used=lambda: OTHERS + OWN + OUTSIDE))
    memory = _cuda_memory(monkeypatch)
    assert non_torch_now(memory) == OWN - RESERVED
    case = _recorded(memory)
    assert (case.non_torch_bytes, case.non_torch_process_bytes, case.non_torch_device_bytes,
            case.other_processes_bytes, case.nvml_visibility) == (
        OWN - RESERVED, OWN - RESERVED, OWN - RESERVED + OUTSIDE, OTHERS + OUTSIDE,
        nvml.THIS_PROCESS)
    [note] = non_torch_notes([case.to_dict()], "path")
    assert note == ("workspace: non-torch memory charged from this process's own NVML figure "
                    "(1.000 GiB), which no other process moves; device-wide, as the engine "
                    "reads it: 1.001 GiB (less the others' use at start), other processes using "
                    "5.001 GiB then")


def test_an_unlisted_process_is_charged_device_wide_and_every_output_says_so(install,
                                                                              monkeypatch):
    """A container: NVML lists the host's pids only. The charge falls back to the device-wide
    reading; the case's nvml_visibility, a note and the budget line name the fallback, in the
    table, the Markdown and the JSON."""
    import json
    from pathlib import Path

    from mlamem import render
    from mlamem.commands.repro import non_torch_notes, read_result
    from mlamem.render.common import console_text
    install(fake_pynvml([(os.getpid() + 1, OTHERS), (os.getpid() + 2, OWN)],
                        used=lambda: OTHERS + OWN + OUTSIDE))
    memory = _cuda_memory(monkeypatch)
    assert memory.non_torch_bytes() == OWN - RESERVED + OUTSIDE
    case = _recorded(memory).to_dict()
    assert (case["non_torch_bytes"], case["non_torch_process_bytes"], case["nvml_visibility"]) == (
        OWN - RESERVED + OUTSIDE, None, nvml.NOT_LISTED)
    [note] = non_torch_notes([case], "path")
    assert note == ("workspace: non-torch memory charged device-wide (1.001 GiB: NVML's used "
                    "memory less the others' use at start), as NVML gives no figure of this "
                    "process's own (not listed: pid namespace); another process's use after "
                    "the start moves it, and the cap, KV cache and limits with it")
    saved = json.loads((Path(__file__).parent / "fixtures" / "results"
                        / "repro-oom-glm5-h200.json").read_text())
    read = {k: case[k] for k in ("non_torch_bytes", "non_torch_process_bytes",
                                 "non_torch_device_bytes", "other_processes_bytes",
                                 "nvml_visibility")}
    cases = [{**c, **read} for c in saved["cases"]]
    result = read_result({**saved, "cases": cases, "notes": [*saved["notes"], note]})
    budget_line = ("non-torch memory (CUDA context, libraries): 1.001 GiB, read device-wide: "
                   "NVML gives no figure of this process's own (not listed: pid namespace)")
    for text in (console_text(render.repro_table(result)), render.repro_markdown(result)):
        flat = " ".join(text.split())
        assert budget_line in flat and note in flat
    as_json = json.loads(render.REPRO_FORMATS["json"](result))
    assert note in as_json["notes"]
    assert {c["nvml_visibility"] for c in as_json["cases"]} == {nvml.NOT_LISTED}


def test_a_neighbour_growing_between_readings_moves_no_charge(install, monkeypatch):
    """A neighbour takes 2 GiB between the cap and the KV sizing: the charge, this process's own
    figure, is the same at both; the device-wide reading and the others' use move by 2 GiB."""
    from mlamem.engines.base import non_torch_now
    neighbour = [0]
    install(fake_pynvml([(os.getpid() + 1, OTHERS), (os.getpid(), OWN)],
                        used=lambda: OTHERS + neighbour[0] + OWN))
    memory = _cuda_memory(monkeypatch)
    at_cap = non_torch_now(memory), memory.non_torch_reading()
    neighbour[0] = 2 * GIB
    case = _recorded(memory)
    assert at_cap[0] == case.non_torch_bytes == OWN - RESERVED
    assert case.non_torch_device_bytes - at_cap[1].device_bytes == 2 * GIB
    assert case.other_processes_bytes - at_cap[1].other_processes_bytes == 2 * GIB
