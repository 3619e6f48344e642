"""The one door to NVML: lazy init, failures become None, and a peak sampler."""

from __future__ import annotations

import functools
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
    """Call pynvml.<func_name>(*args); on any NVML failure, return `default`."""
    if not _initialised():
        return default
    pynvml = _pynvml()
    try:
        return getattr(pynvml, func_name)(*args)
    except pynvml.NVMLError:
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


def driver_version() -> str | None:
    version = nvml_query("nvmlSystemGetDriverVersion")
    return version.decode() if isinstance(version, bytes) else version


class PeakSampler:
    """Samples a device's used memory on a background thread and keeps the maximum.

    Use as a context manager around the region of interest; `peak_bytes` also includes one
    reading taken on exit, so a short region is never missed entirely.
    """

    def __init__(self, handle, interval_s: float = 0.0005):
        self.handle = handle
        self.interval_s = interval_s
        self.peak_bytes: int | None = None
        self.start_bytes: int | None = None  # the reading taken on entry
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        used = used_bytes(self.handle)
        if used is not None:
            self.peak_bytes = used if self.peak_bytes is None else max(self.peak_bytes, used)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):  # wakes at once when stopped
            self._sample()

    def __enter__(self) -> PeakSampler:
        if self.handle is not None:
            self._sample()
            self.start_bytes = self.peak_bytes
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.handle is not None:
            self._stop.set()
            self._thread.join()
            self._sample()
