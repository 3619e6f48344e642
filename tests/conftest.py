"""Shared fixtures. GPU tests skip themselves where CUDA or flash_mla is missing."""

import pytest
import torch

from mlamem.kernels import FlashMLA

needs_flashmla = pytest.mark.skipif(
    FlashMLA().unavailable_reason() is not None,
    reason=f"needs a CUDA GPU with flash_mla: {FlashMLA().unavailable_reason()}",
)
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
