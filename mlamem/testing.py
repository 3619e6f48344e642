"""Helpers for mlamem's tests (and yours): skip markers for GPU-only tests."""

import pytest

from mlamem.kernels import FlashMLA

_reason = FlashMLA().unavailable_reason()
needs_flashmla = pytest.mark.skipif(_reason is not None,
                                    reason=f"needs a CUDA GPU with flash_mla: {_reason}")
