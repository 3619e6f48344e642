"""mlamem: GPU memory profiler and OOM reproducer for LLM attention kernels."""

from pathlib import Path

__version__ = "0.1.0"

# In a source checkout, kernels/ and scenarios/ sit beside this package; the wheel installs them
# as mlamem.kernels and mlamem.scenarios. Adding the checkout root to the search path makes the
# same import names work from both.
_checkout = Path(__file__).resolve().parent.parent
if (_checkout / "kernels" / "__init__.py").is_file() and (_checkout / "pyproject.toml").is_file():
    __path__.append(str(_checkout))  # noqa: F821 (module attribute of a package)
