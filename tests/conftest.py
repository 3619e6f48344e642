"""Shared fixtures: a fixed seed per test, and the deliberately regressed wrapper of
tests/fixtures. Helpers and skip markers are in `mlamem.testing`."""

import importlib.util
from pathlib import Path

import pytest

from mlamem.testing import seed_for

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def seed(request) -> int:
    """A seed fixed by the test's node id (parameters included): every run draws the same inputs.
    Tests put it in their failure messages."""
    return seed_for(request.node.nodeid)


@pytest.fixture(scope="session")
def regressed_alloc_path():
    """The alloc path keeping an extra padded copy of q; patch it into `mlamem.runtime.paths.PATHS`."""
    spec = importlib.util.spec_from_file_location("regressed_paths",
                                                  FIXTURES / "regressed_paths.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.alloc_path_keeping_a_padded_copy
