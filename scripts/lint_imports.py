"""`lint-imports` (import-linter's contracts, pyproject.toml [tool.importlinter]) on the checkout,
whichever way it is installed:

    python3 scripts/lint_imports.py [lint-imports options]

pyproject.toml's package-dir puts `kernels/` and `scenarios/` inside mlamem. A plain install
copies them there; the README's editable install maps them with an import hook, which grimp
cannot walk (lint-imports in the checkout says "mlamem.kernels does not exist"). So the checkout
is laid out as an install lays it out, in a temporary folder, and lint-imports reads the package
from there. Exits with lint-imports' status (2 where it is not installed).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent


def lay_out(into: Path) -> Path:
    """The checkout's packages copied into `into` as pyproject.toml's package-dir places them
    (mlamem/, then kernels/ as mlamem/kernels, scenarios/ as mlamem/scenarios); returns `into`."""
    setuptools = tomllib.loads((CHECKOUT / "pyproject.toml").read_text())["tool"]["setuptools"]
    for package, folder in sorted(setuptools["package-dir"].items()):  # mlamem first
        shutil.copytree(CHECKOUT / folder, into.joinpath(*package.split(".")),
                        ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)
    return into


def main() -> int:
    here = Path(sys.executable).parent  # the venv's own, where this Python's packages are
    lint = shutil.which("lint-imports", path=str(here)) or shutil.which("lint-imports")
    if lint is None:
        print("lint_imports.py: lint-imports is not installed; pip install -e '.[test]'",
              file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="mlamem-lint-imports-") as folder:
        root = lay_out(Path(folder))
        # PYTHONPATH comes before the editable install's hook, so the copy is what is read
        env = {**os.environ, "PYTHONPATH": str(root)}
        done = subprocess.run([lint, *sys.argv[1:], str(CHECKOUT / "pyproject.toml")], cwd=root,
                              env=env, check=False)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
