"""Plug-in kernels, where they were imported from: `mlamem.spec.kernel_plugins` (spec layer)."""

from mlamem.spec.kernel_plugins import (  # noqa: F401
    GROUP,
    Discovery,
    PluginError,
    discover,
    load_plugin_adapter,
    one_line,
    package_of,
)
