"""Helpers for mlamem's tests (and yours): skip markers for GPU-only tests, error checks."""

import pytest

from mlamem.kernels import FlashMLA

_reason = FlashMLA().unavailable_reason()
needs_flashmla = pytest.mark.skipif(_reason is not None,
                                    reason=f"needs a CUDA GPU with flash_mla: {_reason}")
# for checks of what a machine without a GPU prints (predicted output)
no_gpu = pytest.mark.skipif(_reason is None, reason="a GPU here measures instead")


def one_line_error(capsys) -> str:
    """The single stderr line of a failed command, checked to be `mlamem: error: ...`."""
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mlamem: error:"), err
    return err[0]
