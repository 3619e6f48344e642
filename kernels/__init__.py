"""Kernel adapters, one module each; each declares its capabilities and sits beside the reference.

The registry (`SHIPPED`, `REGISTRY`, `load_kernel`, ...) is `mlamem.kernel_registry` and the
contract `mlamem.kernel_api`, both in the spec layer below the adapters; plug-ins and callers
import them from here as before. The adapter classes themselves (`FlashMLA`, `TritonDecode`,
...) and `KERNELS` (shipped name -> class) load on first access (PEP 562).
"""

from __future__ import annotations

import importlib

from mlamem.kernel_registry import (
    COMPARED_KERNELS,
    DEFAULT_KERNEL,
    REFERENCE_KERNEL,
    REGISTRY,
    SHIPPED,
    KernelEntry,
    Registry,
    kernel_help,
    kernel_names,
    kernel_operations,
    load_kernel,
)

# Names importable from this package, resolved on first access (PEP 562).
_LAZY = {
    "BufferSpec": "mlamem.kernel_api", "Capabilities": "mlamem.kernel_api",
    "KernelContract": "mlamem.kernel_api", "SparseDecodeKernel": "mlamem.kernel_api",
    "simulate_run": "mlamem.kernel_api",
    **{entry.cls: entry.module for entry in SHIPPED.values()},
}


def __getattr__(name: str):
    if name == "KERNELS":  # shipped name -> class: imports every shipped adapter
        value = {kernel: load_kernel(kernel) for kernel in SHIPPED}
    elif name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # once loaded, a plain attribute
    return value


__all__ = ["COMPARED_KERNELS", "DEFAULT_KERNEL", "KERNELS", "REFERENCE_KERNEL",
           "REGISTRY", "SHIPPED", "BufferSpec", "Capabilities", "FlashInferMLA", "FlashMLA",
           "FlashMLAVLLM", "KernelEntry", "Reference", "KernelContract", "Registry", "SparseDecodeKernel",
           "TritonDecode", "TritonNativeDecode",
           "kernel_help", "kernel_names", "kernel_operations", "load_kernel", "simulate_run"]
