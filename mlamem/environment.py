"""Where a result came from: GPU, driver, software versions."""

from __future__ import annotations

import importlib.metadata
import os
import platform
from dataclasses import dataclass
from datetime import UTC, datetime

import mlamem
from mlamem import nvml


@dataclass(frozen=True)
class Environment:
    """The machine and software a result was produced on; GPU fields are None without one."""

    gpu: str | None  # e.g. "NVIDIA H200"
    compute_capability: str | None  # e.g. "9.0"
    sm_count: int | None
    gpu_memory_bytes: int | None
    driver: str | None
    cuda: str | None  # the CUDA version torch was built with
    torch: str
    flash_mla: str | None
    mlamem: str
    python: str
    allocator_conf: str | None  # PYTORCH_CUDA_ALLOC_CONF; the model assumes the default
    triton: str | None = None  # installed triton (the Triton kernel's compiler); None if absent


def capture(flash_mla_version: str | None) -> Environment:
    """Read the environment of this process's current CUDA device (if any)."""
    import torch  # here, not at the top: loading a saved result needs no torch

    gpu = capability = sm_count = memory = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        gpu, sm_count, memory = props.name, props.multi_processor_count, props.total_memory
        capability = f"{props.major}.{props.minor}"
    return Environment(
        gpu=gpu, compute_capability=capability, sm_count=sm_count, gpu_memory_bytes=memory,
        driver=nvml.driver_version() if gpu else None, cuda=torch.version.cuda,
        torch=torch.__version__, flash_mla=flash_mla_version, mlamem=mlamem.__version__,
        python=platform.python_version(),
        allocator_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        triton=_installed_version("triton"),
    )


def _installed_version(distribution: str) -> str | None:
    """A package's installed version, read without importing it."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def now_utc() -> str:
    """This moment as a result's `created` field: UTC, ISO 8601 to the second."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
