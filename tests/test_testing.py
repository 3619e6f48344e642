"""mlamem.testing: light to import, and its helpers give what they promise."""

import os
import subprocess
import sys

import pytest
import torch

from mlamem.spec import scenario
from mlamem.testing import random_decode_inputs, relative_l2, scenario_file, seed_for


def test_importing_it_imports_neither_pytest_nor_torch_nor_a_kernel(tmp_path):
    """A plug-in can import mlamem.testing anywhere: the heavy imports wait until used."""
    code = ("import sys, mlamem.testing; print(sorted(m for m in sys.modules if m in "
            "('pytest', 'torch') or m.startswith('mlamem.kernels')))")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"


def test_seeds_are_fixed_by_name():
    """The same name gives the same seed on every run (a fresh process, another hash seed);
    names differ, seeds differ."""
    code = "from mlamem.testing import seed_for; print(seed_for('tests/test_x.py::test_a'))"
    done = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=60,
                          check=True, env={**os.environ, "PYTHONHASHSEED": "12345"})
    assert int(done.stdout) == seed_for("tests/test_x.py::test_a")
    assert seed_for("tests/test_x.py::test_a") != seed_for("tests/test_x.py::test_b")
    assert seed_for("a") == 3904355907  # zlib.crc32(b"a")


def test_random_decode_inputs_are_valid_and_repeatable():
    """Shapes and dtypes of a decode call; indices in the pool, the first of each query valid."""
    q, kv, indices = random_decode_inputs(5, 64, 128, seed=7, invalid_fraction=0.9)
    assert q.shape == (1, 5, 64, 576) and q.dtype == torch.bfloat16
    assert kv.shape == (8, 64, 1, 656) and kv.dtype == torch.uint8  # 4 x 128 tokens
    assert indices.shape == (1, 5, 128) and indices.dtype == torch.int32
    assert indices.max() < 512 and (indices[..., 0] >= 0).all() and (indices < 0).any()
    again = random_decode_inputs(5, 64, 128, seed=7, invalid_fraction=0.9)
    assert all(torch.equal(a, b) for a, b in zip((q, kv, indices), again, strict=True))


def test_relative_l2():
    """||a - b|| / ||b||: 0 for equal tensors, 0.5 for half the reference's norm away."""
    b = torch.tensor([3.0, 4.0])
    assert relative_l2(b, b) == 0
    assert relative_l2(torch.tensor([3.0, 6.5]), b) == pytest.approx(0.5)


def test_scenario_file_applies_each_edit_once(tmp_path):
    """A shipped scenario with text edits loads; an edit that matches nothing is an error."""
    path = scenario_file(tmp_path, edits={'name = "glm5-fp8-tp8"': 'name = "mine"'})
    assert scenario.load(str(path)).name == "mine"
    with pytest.raises(ValueError, match="occurs 0 times"):
        scenario_file(tmp_path, edits={"no such text": ""})
