"""The package: exactly what pyproject.toml declares is importable, from an install or a checkout."""

import importlib.util
import os
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

import mlamem


@pytest.mark.parametrize("name", ["mlamem.engines", "mlamem.render", "mlamem.kernels",
                                  "mlamem.kernels.own", "mlamem.scenarios"])
def test_declared_subpackages_import(name):
    """The subpackages pyproject.toml declares are found, kernels/ and scenarios/ included."""
    assert importlib.util.find_spec(name) is not None


@pytest.mark.parametrize("name", ["mlamem.mlamem", "mlamem.tests", "mlamem.scripts",
                                  "mlamem.benchmarks", "mlamem.reports"])
def test_nothing_else_of_the_checkout_is_part_of_the_package(name):
    """The checkout's other folders are not importable under mlamem."""
    assert importlib.util.find_spec(name) is None


def test_shipped_scenarios_are_package_data():
    """The scenario TOML files ship inside mlamem.scenarios."""
    names = {p.name for p in resources.files("mlamem.scenarios").iterdir()}
    assert {"glm5-fp8-tp8.toml", "kimi-k2-context-reuse.toml"} <= names


def test_a_bare_checkout_says_how_to_install_it(tmp_path):
    """Imported from a checkout's mlamem/ that no install maps kernels/ into (as `python -m` in
    the repo root does with a non-editable install), mlamem fails at once naming the fix."""
    (tmp_path / "mlamem").mkdir()
    for module in ("__init__.py", "version.py"):  # what `import mlamem` reads
        (tmp_path / "mlamem" / module).write_text((Path(mlamem.__file__).parent / module).read_text())
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "__init__.py").write_text("")
    (tmp_path / "pyproject.toml").write_text("")
    bare = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}  # no PYTHONPATH
    done = subprocess.run([sys.executable, "-S", "-c", "import mlamem"], cwd=tmp_path, env=bare,
                          capture_output=True, text=True, timeout=60)  # -S: no installs at all
    assert done.returncode == 1
    assert "pip install -e ." in done.stderr.strip().splitlines()[-1]
