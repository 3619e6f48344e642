"""scripts/lint_imports.py: import-linter's contracts pass whichever way mlamem is installed (the
README's editable install maps kernels/ with an import hook grimp cannot walk), and a broken one
fails (CPU)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("importlinter", reason="import-linter comes with the test extra")
CHECKOUT = Path(__file__).resolve().parent.parent


def lint(checkout: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(checkout / "scripts" / "lint_imports.py"),
                           "--no-logo"], capture_output=True, text=True, timeout=300, check=False)


def test_the_contracts_pass_on_this_install():
    """Run under this venv's install, editable or not, every contract is kept."""
    done = lint(CHECKOUT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def test_a_broken_contract_fails(tmp_path):
    """A copy of the checkout whose core imports mlamem.kernels.own: exit 1, the contract named."""
    for folder in ("mlamem", "kernels", "scenarios", "scripts"):
        shutil.copytree(CHECKOUT / folder, tmp_path / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(CHECKOUT / "pyproject.toml", tmp_path)
    units = tmp_path / "mlamem" / "spec" / "units.py"
    units.write_text(units.read_text() + "\nimport mlamem.kernels.own.tiles  # noqa\n")
    done = lint(tmp_path)
    assert done.returncode == 1
    assert "The core imports nothing of mlamem.kernels.own BROKEN" in done.stdout
