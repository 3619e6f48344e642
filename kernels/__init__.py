"""Kernel adapters, one module each; each declares its capabilities and sits beside the reference.

The registry (`SHIPPED`, `REGISTRY`, `load_kernel`, ...) is `mlamem.spec.kernel_registry` and the
contract `mlamem.spec.kernel_api`, both in the spec layer below the adapters; plug-ins and callers
import them from here as before. The adapter classes themselves (`FlashMLA`, `TritonDecode`,
...) and `KERNELS` (shipped name -> class) load on first access (PEP 562), through the registry.
"""

from __future__ import annotations

from mlamem.spec.kernel_api import BufferSpec, Capabilities, KernelContract, SparseDecodeKernel, simulate_run
from mlamem.spec.kernel_registry import (
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

# The shipped adapter classes importable from this package, by class name: their kernel's name,
# loaded on first access (PEP 562) by the registry
_SHIPPED_CLASSES = {entry.cls: kernel for kernel, entry in SHIPPED.items()}


def __getattr__(name: str):
    if name == "KERNELS":  # shipped name -> class: imports every shipped adapter
        value = {kernel: load_kernel(kernel) for kernel in SHIPPED}
    elif name in _SHIPPED_CLASSES:
        value = load_kernel(_SHIPPED_CLASSES[name])
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # once loaded, a plain attribute
    return value


__all__ = ["COMPARED_KERNELS", "DEFAULT_KERNEL", "KERNELS", "REFERENCE_KERNEL",
           "REGISTRY", "SHIPPED", "BufferSpec", "Capabilities", "FlashInferMLA", "FlashMLA",
           "FlashMLAVLLM", "KernelEntry", "Reference", "KernelContract", "Registry", "SparseDecodeKernel",
           "TritonDecode", "TritonNativeDecode",
           "kernel_help", "kernel_names", "kernel_operations", "load_kernel", "simulate_run"]
