"""Plug-in kernels: other packages' entries in the entry-point group `mlamem.kernels`.

Each entry point names a `KernelEntry` in a light module of its package (one that imports
neither torch nor the kernel's library), e.g. in its pyproject.toml:

    [project.entry-points."mlamem.kernels"]
    mykernel = "my_package.mlamem_entry:ENTRY"

The entry point's name is the `--kernel` name. `discover` scans the installed packages' metadata
once and imports only those light modules. A plug-in that does not load, names something other
than a `KernelEntry`, or declares operations mlamem does not know is registered broken: its
`problem` says why in one line, naming the package to fix. A plug-in cannot take a shipped
kernel's name, nor one another plug-in took first: it is refused, with one line saying so, as
is a package whose entry points do not parse.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, NamedTuple

from mlamem.operations import operation_names
from mlamem.spec.errors import UserError
from mlamem.spec.kernel_api import KernelEntry, adapted, contract_mismatch

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

    from mlamem.spec.kernel_api import KernelContract, KernelEntry

GROUP = "mlamem.kernels"  # the entry-point group plug-ins register in


class PluginError(UserError):
    """A plug-in kernel that cannot be used; `problem` is the one line, naming its package."""

    def __init__(self, name: str, problem: str) -> None:
        super().__init__(f"kernel {name!r}: {problem}")
        self.problem = problem


class Discovery(NamedTuple):
    """What one scan of the entry-point group found."""

    entries: dict[str, KernelEntry]  # name -> entry (broken ones carry their problem)
    warnings: list[str]  # one line per package whose entry points do not parse, then per
    # plug-in kernel refused (its name was taken)


def one_line(exc: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def package_of(entry_point: EntryPoint) -> str:
    """'toy-mlamem 0.1.0': the distribution that declares `entry_point` (its first word, the
    name to fix or uninstall)."""
    dist = entry_point.dist
    if dist is None:  # an entry point made by hand: its top-level module names the package
        return f"{entry_point.module.split('.')[0]} (version unknown)"
    return f"{dist.name} {dist.version}"


def _checked(entry_point: EntryPoint, package: str) -> KernelEntry:
    """The plug-in's entry, its package recorded; a broken one with its problem instead."""
    fix = f"fix or uninstall {package.split()[0]}"
    broken = KernelEntry(module=entry_point.module, cls=entry_point.attr or "",
                         help=f"plug-in from {package}, broken", operations=(), package=package)
    try:
        entry = entry_point.load()
    except Exception as exc:  # the plug-in's module fails to import, or lacks the attribute
        return broken._replace(problem=f"plug-in {package}: {entry_point.value} does not load "
                                       f"({one_line(exc)}); {fix}")
    if not isinstance(entry, KernelEntry):
        what = (f"the class {entry.__name__}" if isinstance(entry, type)
                else f"a {type(entry).__name__}")
        return broken._replace(problem=f"plug-in {package}: {entry_point.value} is {what}, not a "
                                       f"mlamem.kernels.KernelEntry; {fix}")
    unknown = [op for op in entry.operations if op not in operation_names()]
    if unknown or not entry.operations:
        return broken._replace(problem=f"plug-in {package}: {entry_point.value} declares operations "
                                       f"{list(entry.operations)}, expected some of "
                                       f"{', '.join(operation_names())}; {fix}")
    return entry._replace(package=package, problem=None)


def load_plugin_adapter(name: str, entry: KernelEntry) -> type[KernelContract]:
    """The adapter class of plug-in kernel `name`, imported now; a PluginError where the
    plug-in is broken, its adapter does not import, is no kernel adapter, implements a kernel
    contract other than 2 or 1 (`kernel_api.contract_mismatch`), or is named other than its
    entry point. A contract-1 class comes back adapted (`kernel_api.LegacyKernel`)."""
    import importlib


    if entry.problem is not None:
        raise PluginError(name, entry.problem)
    where, fix = f"{entry.module}:{entry.cls}", f"fix or uninstall {entry.package.split()[0]}"
    try:
        cls = getattr(importlib.import_module(entry.module), entry.cls)
    except Exception as exc:  # the plug-in's adapter module fails here
        raise PluginError(name, f"plug-in {entry.package}: {where} does not load "
                                f"({one_line(exc)}); {fix}") from None
    mismatch = contract_mismatch(cls)
    if mismatch is not None:
        raise PluginError(name, f"plug-in {entry.package}: {where} {mismatch}; {fix}")
    if cls.name != name:
        raise PluginError(name, f"plug-in {entry.package}: {where}.name is {cls.name!r}, not "
                                f"its entry point's name {name!r}; {fix}")
    return adapted(cls)


def _group_entry_points() -> tuple[list[EntryPoint], list[str]]:
    """The group's entry points, and one line per installed package whose entry points do not
    parse (that package's are left out; the metadata is scanned package by package to find it)."""
    from importlib.metadata import distributions, entry_points

    try:
        return list(entry_points(group=GROUP)), []
    except Exception:  # some package's entry_points.txt is malformed
        pass
    found, unreadable, seen = [], [], set()
    for dist in distributions():
        name = dist.metadata["Name"] or "an unnamed package"
        normalized = re.sub(r"[-_.]+", "-", name).lower()  # PEP 503
        if normalized in seen:  # shadowed by one earlier on the path
            continue
        seen.add(normalized)
        try:
            found += dist.entry_points.select(group=GROUP)
        except Exception as exc:
            unreadable.append(f"package {name} {dist.version}: its entry points do not parse "
                              f"({one_line(exc)}); fix or uninstall {name}")
    return found, unreadable


def discover(taken: set[str]) -> Discovery:
    """Every plug-in kernel installed, in the order the metadata lists them; `taken` are the
    shipped names, which a plug-in cannot override."""
    entries: dict[str, KernelEntry] = {}
    group, warnings = _group_entry_points()
    for entry_point in group:
        name, package = entry_point.name, package_of(entry_point)
        if name in taken:
            warnings.append(f"plug-in {package}: kernel {name!r} refused, a shipped kernel has "
                            f"that name; rename its {GROUP} entry point")
        elif name in entries:
            warnings.append(f"plug-in {package}: kernel {name!r} refused, "
                            f"{entries[name].package} registers it first")
        else:
            entries[name] = _checked(entry_point, package)
    return Discovery(entries, warnings)
