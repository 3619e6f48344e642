"""mlamem: GPU memory profiler and OOM reproducer for LLM attention kernels.

The package is `mlamem`, `mlamem.render`, `mlamem.kernels` and `mlamem.scenarios`, and nothing
else. In the repository `kernels/` and `scenarios/` sit at the top, beside `mlamem/`, and
pyproject.toml's package-dir installs them as `mlamem.kernels` and `mlamem.scenarios`; a checkout
is therefore used through an install (`pip install -e .`, or `pip install .`).
"""

from pathlib import Path as _Path

__version__ = "0.1.0"


def _refuse_a_bare_checkout() -> None:
    """Fail at once, with the fix, where `mlamem` comes from a checkout's `mlamem/` folder that no
    install maps `kernels/` into: `python -m` in the repository root puts that folder first on
    sys.path, ahead of a non-editable install."""
    import importlib.util

    checkout = _Path(__file__).resolve().parent.parent
    if ((checkout / "kernels" / "__init__.py").is_file() and (checkout / "pyproject.toml").is_file()
            and importlib.util.find_spec("mlamem.kernels") is None):
        raise ImportError(
            f"mlamem was imported from the checkout at {checkout}, whose mlamem/ folder holds "
            "neither kernels/ nor scenarios/: install the checkout in place (pip install -e .), "
            "or run an installed mlamem from outside the checkout (or with python -P)")


_refuse_a_bare_checkout()
