"""Kernel adapters, one table: each declares its capabilities and sits beside the reference."""

from mlamem.kernels.base import BufferSpec, Capabilities, SparseDecodeKernel, simulate_decode
from mlamem.kernels.flashmla import FlashMLA
from mlamem.kernels.reference import Reference
from mlamem.kernels.triton_decode import TritonDecode

KERNELS: dict[str, type[SparseDecodeKernel]] = {
    "flashmla": FlashMLA, "triton": TritonDecode, "reference": Reference}

__all__ = ["KERNELS", "BufferSpec", "Capabilities", "FlashMLA", "Reference",
           "SparseDecodeKernel", "TritonDecode", "simulate_decode"]
