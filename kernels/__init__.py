"""Kernel adapters, one table: each declares its capabilities and sits beside the reference."""

from mlamem.kernels.base import BufferSpec, Capabilities, SparseDecodeKernel, simulate_decode
from mlamem.kernels.flashmla import FlashMLA
from mlamem.kernels.reference import Reference

KERNELS: dict[str, type[SparseDecodeKernel]] = {"flashmla": FlashMLA, "reference": Reference}

__all__ = ["KERNELS", "BufferSpec", "Capabilities", "FlashMLA", "Reference",
           "SparseDecodeKernel", "simulate_decode"]
