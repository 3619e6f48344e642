"""`mlamem kernels`: every registered kernel, what each operation takes, and whether it runs here.

Everything comes from the registry (`mlamem.kernels.REGISTRY`: shipped kernels and plug-ins)
and the adapters themselves; no kernel is named here. Importing this module imports no adapter
(nor torch): `list_kernels` loads them when called. An adapter that fails (to import, to
construct, or to answer for one operation while it is being extended), and a broken plug-in,
is listed with the one-line reason instead; a plug-in refused its name is one line at the
end.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the listing's models load with the adapters, in list_kernels
    from mlamem.results.kernels import KernelListing, KernelOperationListing

WIDTH = 100  # columns of `render_kernels` output
ASSUMED_NOTE = ("* capabilities assumed: the kernel's schema cannot be read here, so its "
                "adapter's declared facts are shown")


def takes_text(capabilities) -> str:
    """'out', 'out, lse, accum' or 'nothing': what the caller may pass in."""
    taken = [name for name, flag in (("out", capabilities.takes_out),
                                     ("lse", capabilities.takes_lse),
                                     ("accum", capabilities.takes_accum_workspace)) if flag]
    return ", ".join(taken) or "nothing"


def heads_text(head_counts: Sequence[int]) -> str:
    """'64,128'; a run of three or more doubling (or consecutive) counts as '8-128'."""
    counts = sorted(set(head_counts))
    steps = {b / a for a, b in zip(counts, counts[1:], strict=False) if a}
    diffs = {b - a for a, b in zip(counts, counts[1:], strict=False)}
    if len(counts) >= 3 and (steps == {2} or diffs == {1}):
        return f"{counts[0]}-{counts[-1]}"
    return ",".join(map(str, counts))


def _operation(adapter, op: str) -> KernelOperationListing:
    from mlamem.kernels.plugins import one_line
    from mlamem.results.kernels import KernelOperationListing

    try:
        capabilities = adapter.capabilities(op)
        formats = capabilities.kv_formats
        takes = ({fmt: takes_text(adapter.capabilities(op, fmt)) for fmt in formats}
                 if len(formats) > 1 else {})
        if len(set(takes.values())) > 1:  # e.g. vLLM's dense decode: out over bf16, not fp8
            text = ", ".join(f"{fmt}: {t}" for fmt, t in takes.items())
        else:
            text = takes_text(capabilities)
        return KernelOperationListing(op=op, takes=text,
                                      head_counts=list(capabilities.head_counts),
                                      assumed=bool(getattr(capabilities, "assumed", False)),
                                      error=None)
    except Exception as exc:  # an adapter still being extended, or one that breaks here
        return KernelOperationListing(op=op, takes=None, head_counts=[], assumed=False,
                                      error=one_line(exc))


def _listing(name: str) -> KernelListing:
    from mlamem.kernels import REGISTRY, load_kernel
    from mlamem.kernels.plugins import PluginError, one_line
    from mlamem.results.kernels import KernelListing, KernelOperationListing

    entry = REGISTRY[name]
    label = name
    try:
        cls = load_kernel(name)
        label = getattr(cls, "label", name)
        adapter = cls()
    except PluginError as exc:  # a plug-in broken, or whose adapter is not its entry's
        return KernelListing(name=name, label=label, help=entry.help, operations=[],
                             version=None, available=False, reason=exc.problem)
    except Exception as exc:  # an adapter that does not import or construct here
        problem = f"the adapter does not load ({one_line(exc)})"
        return KernelListing(name=name, label=label, help=entry.help,
                             operations=[KernelOperationListing(
                                 op=op, takes=None, head_counts=[], assumed=False, error=problem)
                                 for op in entry.operations],
                             version=None, available=False, reason=problem)
    try:
        version = adapter.version()
    except Exception:  # no version to show; the reason below says what is wrong, if anything
        version = None
    try:
        reason = adapter.unavailable_reason()
    except Exception as exc:
        reason = f"cannot tell whether it runs here ({one_line(exc)})"
    return KernelListing(name=name, label=label, help=entry.help,
                         operations=[_operation(adapter, op) for op in entry.operations],
                         version=version, available=reason is None, reason=reason)


def list_kernels() -> list[KernelListing]:
    """Every registered kernel, in registry order, its adapter imported and asked now."""
    from mlamem.kernels import kernel_names

    return [_listing(name) for name in kernel_names()]


def _operation_text(o: KernelOperationListing) -> str:
    if o.error is not None:
        return f"{o.op}(?)"
    heads = f"; h {heads_text(o.head_counts)}" if o.head_counts else ""
    return f"{o.op}({o.takes}{heads}){'*' if o.assumed else ''}"


_NBSP = "\0"  # holds an operation's text together when wrapping


def render_kernels(listings: list[KernelListing], width: int = WIDTH,
                   warnings: Sequence[str] | None = None) -> str:
    """One entry per kernel: name, each operation (what it takes; head counts; * when assumed;
    `(?)` when the adapter could not say, its one-line reason at the end), the version, and
    whether it runs here or why not, e.g.
    `triton  sparse-decode(out, lse, accum; h 64,128)  3.6.0  available`. An entry longer than
    `width` columns wraps under the operations, never inside one. Then the plug-in `warnings`,
    one line each (None: the registry's: plug-ins refused their name, unreadable metadata)."""
    if warnings is None:
        from mlamem.kernels import REGISTRY

        warnings = REGISTRY.warnings()
    if not listings:
        return "no kernels registered\n"
    indent = max(len(k.name) for k in listings) + 2
    narrow = width - indent < 30  # the name on its own line, the entry under it
    lines = []
    for k in listings:
        operations = " ".join(_operation_text(o).replace(" ", _NBSP).replace(f",{_NBSP}", ", ")
                              .replace(f";{_NBSP}", "; ") for o in k.operations)
        status = "available" if k.available else f"unavailable: {k.reason}"
        errors = dict.fromkeys(o.error for o in k.operations if o.error and o.error != k.reason)
        text = "  ".join(part for part in (operations, k.version, status,
                                           *(f"(?): {e}" for e in errors)) if part)
        lines += [k.name] if narrow else []
        lines += [line.replace(_NBSP, " ") for line in textwrap.wrap(
            text, width=width, initial_indent="  " if narrow else k.name.ljust(indent),
            subsequent_indent=" " * (2 if narrow else indent), break_on_hyphens=False,
            break_long_words=False)]  # a word wider than the line overflows it, never cut
    if any(o.assumed for k in listings for o in k.operations):
        lines += ["", *textwrap.wrap(ASSUMED_NOTE, width=width, break_long_words=False)]
    if warnings:
        lines += ["", *warnings]
    return "\n".join(lines) + "\n"


KERNELS_SCHEMA = "mlamem.kernels/1"


def kernels_json(listings: list[KernelListing], warnings: Sequence[str] | None = None) -> str:
    """What `render_kernels` shows, as its file (`mlamem.results.kernels.KernelsFile`,
    docs/commands.md#mlamem-kernels)."""
    import json

    from mlamem.results.kernels import KernelsFile

    if warnings is None:
        from mlamem.kernels import REGISTRY

        warnings = REGISTRY.warnings()
    listed = KernelsFile(schema=KERNELS_SCHEMA, kernels=listings, warnings=list(warnings))
    return json.dumps(listed.file_dict(), indent=2) + "\n"
