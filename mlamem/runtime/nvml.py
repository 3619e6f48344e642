"""The one door to NVML: lazy init, failures become None, and a peak sampler."""

from __future__ import annotations

import functools
import os
import threading


@functools.cache
def _pynvml():
    """pynvml, imported at the first query (not at start-up); None where it is not installed
    (nvidia-ml-py is a dependency, but stay usable without it)."""
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


@functools.cache
def _initialised() -> bool:
    pynvml = _pynvml()
    if pynvml is None:
        return False
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    return True


def nvml_query(func_name: str, *args, default=None):
    """Call pynvml.<func_name>(*args); on any NVML failure, return `default`. pynvml's
    unversioned wrappers raise NVMLLibraryMismatchError, no NVMLError, where the driver's
    library lacks the function they call: a failure too."""
    if not _initialised():
        return default
    pynvml = _pynvml()
    mismatch = getattr(pynvml, "NVMLLibraryMismatchError", pynvml.NVMLError)
    try:
        return getattr(pynvml, func_name)(*args)
    except (pynvml.NVMLError, mismatch):
        return default


def uuid_name(torch_uuid: str | None) -> str | None:
    """A torch device UUID in NVML's spelling ("GPU-...")."""
    if torch_uuid is None:
        return None
    return torch_uuid if torch_uuid.startswith(("GPU-", "MIG-")) else f"GPU-{torch_uuid}"


def device_handle(uuid: str | None):
    """The NVML handle of the GPU with this UUID (torch's or NVML's spelling), or None."""
    name = uuid_name(uuid)
    return None if name is None else nvml_query("nvmlDeviceGetHandleByUUID", name)


def used_by_uuid() -> dict[str, int]:
    """Used memory of every GPU, keyed by NVML UUID; read it before touching CUDA."""
    result = {}
    for index in range(nvml_query("nvmlDeviceGetCount", default=0)):
        handle = nvml_query("nvmlDeviceGetHandleByIndex", index)
        uuid = handle and nvml_query("nvmlDeviceGetUUID", handle)
        used = used_bytes(handle)
        if uuid is not None and used is not None:
            result[uuid.decode() if isinstance(uuid, bytes) else uuid] = used
    return result


def used_bytes(handle) -> int | None:
    """Device memory in use, all processes, in bytes."""
    if handle is None:
        return None
    info = nvml_query("nvmlDeviceGetMemoryInfo", handle)
    return None if info is None else int(info.used)


# pynvml's compute-process queries, newest first: a driver without the newest answers an older one
PROCESS_QUERIES = ("nvmlDeviceGetComputeRunningProcesses_v3",
                   "nvmlDeviceGetComputeRunningProcesses_v2",
                   "nvmlDeviceGetComputeRunningProcesses")
# what process_visibility says: the per-process figures are this process's, or why they are absent
THIS_PROCESS = "this process"
NOT_LISTED = "not listed: pid namespace"  # a container: NVML lists host pids
NOT_REPORTED = "listed without its memory"  # the driver gives no usedGpuMemory (WDDM, some MIG)
NO_PROCESS_LIST = "no NVML process list"


def running_processes(handle) -> list | None:
    """The compute processes NVML lists on a device (each with `pid` and `usedGpuMemory`),
    through the newest query this pynvml offers and the driver answers; None where none does."""
    if handle is None or not _initialised():
        return None
    offered = [name for name in PROCESS_QUERIES if hasattr(_pynvml(), name)]
    for name in offered:
        processes = nvml_query(name, handle)
        if processes is not None:
            return processes
    return None


def _own_entry(handle, pid: int | None) -> tuple[object | None, str]:
    """This process's entry in the device's process list, and the visibility it gives."""
    processes = running_processes(handle)
    if processes is None:
        return None, NO_PROCESS_LIST
    pid = os.getpid() if pid is None else pid
    entry = next((p for p in processes if p.pid == pid), None)
    if entry is None:
        return None, NOT_LISTED
    return entry, THIS_PROCESS if entry.usedGpuMemory is not None else NOT_REPORTED


def process_reading(handle, pid: int | None = None) -> tuple[int | None, str]:
    """This process's (`pid`, default ours) device memory in bytes as NVML lists it, and its
    visibility, from one process-list query: (bytes, THIS_PROCESS), or (None, the reason)."""
    entry, visibility = _own_entry(handle, pid)
    return (int(entry.usedGpuMemory) if visibility == THIS_PROCESS else None), visibility


def process_used_bytes(handle, pid: int | None = None) -> int | None:
    """Device memory this process (`pid`, default ours) uses, in bytes, as NVML lists it;
    None where it is not listed with its memory (`process_visibility` says why)."""
    return process_reading(handle, pid)[0]


def process_visibility(handle, pid: int | None = None) -> str:
    """Whether NVML gives this process's own memory: THIS_PROCESS, or the reason it does not
    (NOT_LISTED, NOT_REPORTED, NO_PROCESS_LIST), for outputs to name the fallback."""
    return process_reading(handle, pid)[1]


def driver_version() -> str | None:
    version = nvml_query("nvmlSystemGetDriverVersion")
    return version.decode() if isinstance(version, bytes) else version


class PeakSampler:
    """Samples a device's used memory, all processes and this process's, on a background
    thread and keeps the maxima.

    Use as a context manager around the region of interest; the peaks also include one
    reading taken on exit, so a short region is never missed entirely. This process's figure is
    read on entry and on exit only (NVML's process list is a heavier query than the device's
    used memory, and the ticks run beside the measured call): within a call the caching
    allocator returns no memory to the device, so its peak is the exit's reading. Where NVML
    does not list this process with its memory on entry, only the device-wide figure is read.
    """

    def __init__(self, handle, interval_s: float = 0.0005):
        self.handle = handle
        self.interval_s = interval_s
        self.peak_bytes: int | None = None  # device-wide, all processes
        self.start_bytes: int | None = None  # the reading taken on entry
        self.process_peak_bytes: int | None = None  # this process's (process_used_bytes)
        self.process_start_bytes: int | None = None
        self._per_process = True  # until the entry's reading finds this process unlisted
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self, own_too: bool = True) -> None:
        """One reading: the device-wide figure, then (`own_too`) this process's."""
        used = used_bytes(self.handle)
        if used is not None:
            self.peak_bytes = used if self.peak_bytes is None else max(self.peak_bytes, used)
        own = process_used_bytes(self.handle) if self._per_process and own_too else None
        if own is not None:
            self.process_peak_bytes = (own if self.process_peak_bytes is None
                                       else max(self.process_peak_bytes, own))

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):  # wakes at once when stopped
            self._sample(own_too=False)

    def __enter__(self) -> PeakSampler:
        if self.handle is not None:
            self._sample()
            self.start_bytes = self.peak_bytes
            self.process_start_bytes = self.process_peak_bytes
            self._per_process = self.process_start_bytes is not None
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.handle is not None:
            self._stop.set()
            self._thread.join()
            self._sample()
