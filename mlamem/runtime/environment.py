"""Where a result came from: GPU, driver, software versions."""

from __future__ import annotations

import os
import platform
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from mlamem.results.legacy import LEGACY_KERNEL_FIELDS  # files from before `kernels`
from mlamem.runtime import nvml
from mlamem.spec.kernel_registry import kernel_names, load_kernel
from mlamem.version import __version__

if TYPE_CHECKING:
    from mlamem.results.shared import Environment


def kernel_versions(data: dict) -> dict[str, str | None]:
    """The kernel versions of a saved environment (a dict, as in a result or baseline file):
    its `kernels`, with the legacy per-kernel fields of older files mapped in (a legacy null
    stays null: the library was absent). ValueError if a legacy field contradicts `kernels`."""
    versions = dict(data.get("kernels") or {})
    for old, name in LEGACY_KERNEL_FIELDS.items():
        if old not in data:
            continue
        if name in versions and versions[name] != data[old]:
            raise ValueError(f"environment: {old} {data[old]!r} contradicts kernels.{name} "
                             f"{versions[name]!r}")
        versions[name] = data[old]
    return versions


def capture() -> Environment:
    """Read the environment of this process's current CUDA device (if any) and the version of
    every registered kernel."""
    import torch  # here, not at the top: loading a saved result needs no torch

    from mlamem.results.shared import Environment

    gpu = capability = sm_count = memory = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        gpu, sm_count, memory = props.name, props.multi_processor_count, props.total_memory
        capability = f"{props.major}.{props.minor}"
    return Environment(
        gpu=gpu, compute_capability=capability, sm_count=sm_count, gpu_memory_bytes=memory,
        driver=nvml.driver_version() if gpu else None, cuda=torch.version.cuda,
        torch=torch.__version__, mlamem=__version__, python=platform.python_version(),
        allocator_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        kernels=installed_kernel_versions(),
    )


def installed_kernel_versions() -> dict[str, str | None]:
    """Registered kernel name -> its adapter's version(), in registry order; None where the
    kernel's library is absent or the adapter cannot say (any exception)."""
    versions: dict[str, str | None] = {}
    for name in kernel_names():
        try:
            versions[name] = load_kernel(name)().version()
        except Exception:  # an adapter that does not import or construct here has no version
            versions[name] = None
    return versions


def now_utc() -> str:
    """This moment as a result's `created` field: UTC, ISO 8601 to the second."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
