"""Kernel adapters, one table: each declares its capabilities and sits beside the reference.

`REGISTRY` names every adapter without importing it, so listing the kernels (the `--kernel`
choices and their help) imports neither torch nor any kernel library. Adding a kernel, or a
plug-in from another package, is one entry: name -> (module, class, one-line help).
`load_kernel(name)` imports the adapter on demand. The adapter classes themselves
(`FlashMLA`, `TritonDecode`, ...) and `KERNELS` (name -> class) are still importable from here;
they load on first access.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from mlamem.kernels.base import SparseDecodeKernel


class KernelEntry(NamedTuple):
    """Where an adapter lives and what it is, in one line."""

    module: str  # importable module path of the adapter
    cls: str  # the SparseDecodeKernel subclass in it
    help: str  # one line for `--kernel` help and listings
    operations: tuple[str, ...] = ("sparse-decode",)  # what it runs (see kernels.base.OPERATIONS)


ALL_OPERATIONS = ("sparse-decode", "dense-decode", "sparse-prefill")  # = base.OPERATIONS

DEFAULT_KERNEL = "flashmla"  # what --kernel defaults to
REFERENCE_KERNEL = "reference"  # the yardstick other kernels' outputs are held to
COMPARED_KERNELS = ("flashmla", "flashmla-vllm")  # `mlamem compare`'s default pair: two builds

REGISTRY: dict[str, KernelEntry] = {
    "flashmla": KernelEntry("mlamem.kernels.flashmla", "FlashMLA", "FlashMLA, sgl-flash-mla",
                            ALL_OPERATIONS),
    "flashmla-vllm": KernelEntry("mlamem.kernels.flashmla_vllm", "FlashMLAVLLM",
                                 "vLLM's FlashMLA build, takes out_", ALL_OPERATIONS),
    "triton": KernelEntry("mlamem.kernels.triton_decode", "TritonDecode",
                          "mlamem's own, takes out, lse and accumulators, so it can run "
                          "workspace-full"),
    "reference": KernelEntry("mlamem.kernels.reference", "Reference", "plain torch",
                             ALL_OPERATIONS),
    "flashinfer": KernelEntry("mlamem.kernels.flashinfer_mla", "FlashInferMLA",
                              "FlashInfer's MLA decode (fa3, bf16 cache), takes out and lse",
                              ("dense-decode",)),
}

# Names importable from this package, resolved on first access (PEP 562).
_LAZY = {
    "BufferSpec": "mlamem.kernels.base", "Capabilities": "mlamem.kernels.base",
    "SparseDecodeKernel": "mlamem.kernels.base", "simulate_decode": "mlamem.kernels.base",
    **{entry.cls: entry.module for entry in REGISTRY.values()},
}


def kernel_names() -> list[str]:
    """Every registered kernel name, in registry order; imports nothing."""
    return list(REGISTRY)


def kernel_help(name: str) -> str:
    """The one-line help of a registered kernel; imports nothing."""
    return REGISTRY[name].help


def kernel_operations(name: str) -> tuple[str, ...]:
    """The operations a registered kernel runs; imports nothing."""
    return REGISTRY[name].operations


def load_kernel(name: str) -> type[SparseDecodeKernel]:
    """The adapter class registered as `name`, imported now."""
    try:
        entry = REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown kernel {name!r}; expected one of {', '.join(REGISTRY)}") from None
    return getattr(importlib.import_module(entry.module), entry.cls)


def __getattr__(name: str):
    if name == "KERNELS":  # name -> class: imports every adapter
        value = {kernel: load_kernel(kernel) for kernel in REGISTRY}
    elif name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # once loaded, a plain attribute
    return value


__all__ = ["COMPARED_KERNELS", "DEFAULT_KERNEL", "KERNELS", "REFERENCE_KERNEL", "REGISTRY",
           "BufferSpec", "Capabilities", "FlashInferMLA", "FlashMLA", "FlashMLAVLLM", "KernelEntry",
           "Reference",
           "SparseDecodeKernel", "TritonDecode", "kernel_help", "kernel_names",
           "kernel_operations", "load_kernel", "simulate_decode"]
