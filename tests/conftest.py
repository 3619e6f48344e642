"""Shared fixtures: the deliberately regressed wrapper of tests/fixtures."""

import importlib.util
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def regressed_alloc_path():
    """The alloc path keeping an extra padded copy of q; patch it into `mlamem.paths.PATHS`."""
    spec = importlib.util.spec_from_file_location("regressed_paths",
                                                  FIXTURES / "regressed_paths.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.alloc_path_keeping_a_padded_copy
