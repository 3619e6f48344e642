"""mlamem: GPU memory profiler and OOM reproducer for LLM attention kernels.

The package is `mlamem`, `mlamem.render`, `mlamem.kernels` and `mlamem.scenarios`, and nothing
else. In the repository `kernels/` and `scenarios/` sit at the top, beside `mlamem/`, and
pyproject.toml's package-dir installs them as `mlamem.kernels` and `mlamem.scenarios`; a checkout
is therefore used through an install (`pip install -e .`, or `pip install .`).

The Python API (`mlamem.track`, `mlamem.profile_call`, see `mlamem.api`) loads on first access
(PEP 562), so `import mlamem` imports no torch.
"""

from pathlib import Path as _Path
from typing import TYPE_CHECKING

from mlamem.version import __version__ as __version__

_API = ("track", "profile_call", "Tracker", "NoCudaError")  # mlamem.api's public names

if TYPE_CHECKING:  # for type checkers; at run time __getattr__ imports them
    from mlamem.api import NoCudaError as NoCudaError
    from mlamem.api import Tracker as Tracker
    from mlamem.api import profile_call as profile_call
    from mlamem.api import track as track


def __getattr__(name: str):
    """mlamem.api's public names, imported (with torch) on first access."""
    if name not in _API:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from mlamem import api

    value = getattr(api, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])


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
