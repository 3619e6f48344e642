"""The kernel registry (spec): every adapter by name, one table, none of them imported.

`SHIPPED` names every adapter mlamem ships without importing it; `REGISTRY` is those, then the
plug-ins other packages register through the entry-point group `mlamem.kernels`
(`mlamem.spec.kernel_plugins`), discovered on first access. Listing the kernels (the `--kernel`
choices and their help) imports neither torch nor any kernel library. Adding a kernel is one
entry: name -> (module, class, one-line help, operations). `load_kernel(name)` imports the
adapter on demand, by module name. `mlamem.kernels` re-exports all of this, beside the adapter
classes themselves.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, MutableMapping
from typing import TYPE_CHECKING

from mlamem.spec.kernel_api import KernelEntry, adapted, operation_names
from mlamem.spec.kernel_plugins import discover, load_plugin_adapter

if TYPE_CHECKING:
    from mlamem.spec.kernel_api import KernelContract


DEFAULT_KERNEL = "flashmla"  # what --kernel defaults to
REFERENCE_KERNEL = "reference"  # the yardstick other kernels' outputs are held to
COMPARED_KERNELS = ("flashmla", "flashmla-vllm")  # `mlamem compare`'s default pair: two builds

SHIPPED: dict[str, KernelEntry] = {  # an in-tree kernel is one entry here
    "flashmla": KernelEntry("mlamem.kernels.flashmla", "FlashMLA", "FlashMLA, sgl-flash-mla",
                            operation_names()),
    "flashmla-vllm": KernelEntry("mlamem.kernels.flashmla_vllm", "FlashMLAVLLM",
                                 "vLLM's FlashMLA build, takes out_", operation_names()),
    "triton": KernelEntry("mlamem.kernels.own.triton_decode", "TritonDecode",
                          "mlamem's own, takes out, lse and accumulators, so it can run "
                          "workspace-full"),
    "triton-native": KernelEntry("mlamem.kernels.own.triton_decode", "TritonNativeDecode",
                                 "mlamem's own at the rank's head count (8-128): no padded q, "
                                 "takes out, lse and accumulators"),
    "reference": KernelEntry("mlamem.kernels.reference", "Reference", "plain torch",
                             operation_names()),
    "flashinfer": KernelEntry("mlamem.kernels.flashinfer_mla", "FlashInferMLA",
                              "FlashInfer's MLA decode (fa3, bf16 cache), takes out and lse",
                              ("dense-decode",)),
}


class Registry(MutableMapping[str, KernelEntry]):
    """The shipped kernels, then the installed plug-ins: the entry-point scan runs once, on
    the first access that needs it (not when this module is imported, nor to look up a
    shipped name, so a command run with a shipped kernel never pays it). Writable, for tests
    and in-process registration."""

    def __init__(self, shipped: dict[str, KernelEntry]) -> None:
        self._shipped = shipped
        self._entries: dict[str, KernelEntry] | None = None
        self._warnings: list[str] = []

    def _loaded(self) -> dict[str, KernelEntry]:
        if self._entries is None:

            self._entries = dict(self._shipped)  # what a plug-in's module sees while it loads
            found = discover(taken=set(self._shipped))
            self._entries.update(found.entries)
            self._warnings = found.warnings
        return self._entries

    def warnings(self) -> list[str]:
        """One line per plug-in refused (its name was taken) or package whose entry points do
        not parse."""
        self._loaded()
        return list(self._warnings)

    def rediscover(self) -> None:
        """Scan the entry points again on next access (after packages or sys.path changed);
        entries written in-process are dropped."""
        self._entries, self._warnings = None, []

    def __getitem__(self, name: str) -> KernelEntry:
        if self._entries is None and name in self._shipped:  # no plug-in takes a shipped name:
            return self._shipped[name]  # the scan cannot change this answer, so it waits
        return self._loaded()[name]

    def __setitem__(self, name: str, entry: KernelEntry) -> None:
        self._loaded()[name] = entry

    def __delitem__(self, name: str) -> None:
        del self._loaded()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._loaded())

    def __len__(self) -> int:
        return len(self._loaded())

    def __repr__(self) -> str:
        return f"Registry({list(self)})"


REGISTRY = Registry(SHIPPED)

def kernel_names() -> list[str]:
    """Every registered kernel name, in registry order; imports no adapter."""
    return list(REGISTRY)


def kernel_help(name: str) -> str:
    """The one-line help of a registered kernel; imports no adapter."""
    return REGISTRY[name].help


def kernel_operations(name: str) -> tuple[str, ...]:
    """The operations a registered kernel runs; imports no adapter."""
    return REGISTRY[name].operations


def load_kernel(name: str) -> type[KernelContract]:
    """The adapter class registered as `name`, imported now, as a contract-2 class (a
    contract-1 one adapted, `kernel_api.adapted`). A plug-in that is broken, or whose adapter
    does not import, is not its entry's or implements another contract, is a PluginError (a
    UserError) naming its package."""
    try:
        entry = REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown kernel {name!r}; expected one of {', '.join(REGISTRY)}") from None
    if entry.package is None:
        return adapted(getattr(importlib.import_module(entry.module), entry.cls))

    return load_plugin_adapter(name, entry)


__all__ = ["COMPARED_KERNELS", "DEFAULT_KERNEL", "REFERENCE_KERNEL", "REGISTRY",
           "SHIPPED", "KernelEntry", "Registry", "kernel_help", "kernel_names", "kernel_operations",
           "load_kernel"]
