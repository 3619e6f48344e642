"""Formatting shared by every view: GiB cells, yes/no, the PREDICTED tag, rich to text (the
escapes of text from input files are `escape`'s)."""

from __future__ import annotations

import copy
import io
from collections import Counter

from rich import box
from rich.console import Console, Group
from rich.constrain import Constrain
from rich.table import Table
from rich.text import Text

from mlamem.spec.units import format_bytes, gib

WIDTH = 80  # every terminal table fits this many columns


def predicted_tag(measured: bool) -> str:
    """' (PREDICTED)' after the heading of every table of predicted figures; '' when measured."""
    return "" if measured else " (PREDICTED)"


def gib_text(value: int | None) -> str:
    return "n/a" if value is None else f"{gib(value):.3f}"


def equal_text(value: bool | None) -> str:
    return {True: "yes", False: "NO", None: "n/a"}[value]


def count_text(count: int | None) -> str:
    """A token count for a narrow cell: exact below 10 million, else 3 digits and M, G or T
    (10^6, 10^9, 10^12): 581281, '4.29G'. None is '-'."""
    if count is None:
        return "-"
    if abs(count) < 10**7:
        return str(count)
    for suffix, size in (("M", 10**6), ("G", 10**9), ("T", 10**12)):
        value = abs(count) / size
        decimals = 2 if value < 10 else 1 if value < 100 else 0
        if round(value, decimals) < 1000 or suffix == "T":
            return f"{'-' if count < 0 else ''}{value:.{decimals}f}{suffix}"
    raise AssertionError("unreachable")


def signed_bytes(difference: int | None) -> str:
    """A byte difference for a narrow cell: '0', '+512 B', '-2.000 MiB'; None is 'n/a'."""
    if difference is None:
        return "n/a"
    if difference == 0:
        return "0"
    return ("+" if difference > 0 else "") + format_bytes(difference)


def engine_flag(field: str) -> str:
    """An engine's knob as its launch flag: chunked_prefill_size -> --chunked-prefill-size."""
    return "--" + field.replace("_", "-")


def limits_text(step_knob: str, fraction_knob: str | None, *, step_tokens: int,
                fraction: float | None, max_tokens: int | None, max_fraction: float | None,
                rederived: int | None) -> str:
    """A case's largest safe knobs as flags, each with the knob it holds with: the step's
    tokens with the fraction pinned, alone (the engine re-derives its fraction from them, where
    `rederived` is searched), and the fraction at the step's tokens."""
    step, frac = engine_flag(step_knob), engine_flag(fraction_knob or "")
    parts = []
    if max_tokens is not None:
        pinned = f" with {frac} {fraction} pinned" if fraction_knob and fraction is not None else ""
        parts.append(f"{step} {max_tokens}{pinned}")
    if rederived is not None:
        parts.append(f"{step} {rederived} alone (without {frac} the engine re-derives it from "
                     "the chunk)")
    if max_fraction is not None:
        parts.append(f"{frac} {max_fraction:.3f} at {step} {step_tokens}")
    return "largest safe " + "; ".join(parts) if parts else ""


def csv_cell(value) -> str:
    """One CSV cell as a plain value: empty for null, `true`/`false`, text as it is, a number,
    a list joined by `;` (`padded_q;out`), a buffer as `name=requested_bytes`, an object's
    items as `key=value` joined by `;`."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ";".join(csv_cell(item) for item in value)
    if isinstance(value, dict):
        if "name" in value and "requested_bytes" in value:
            return f"{value['name']}={value['requested_bytes']}"
        return ";".join(f"{key}={csv_cell(item)}" for key, item in value.items())
    return str(value)


def compact_table(title: str) -> Table:
    """A table with one space between columns, a rule under the header and no outer edge,
    so that it fits WIDTH columns."""
    return Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=0)


def with_notes(table: Table, notes: list[str]) -> Group:
    """The table, then its notes, one paragraph each, wrapped at WIDTH columns at most."""
    text = Text("\n".join(notes), overflow="fold")
    return Group(table, Constrain(text, width=WIDTH))


def _drawn(renderable, width: int) -> str:
    console = Console(file=io.StringIO(), width=width, record=True, markup=False)
    console.print(renderable)
    return "".join(line.rstrip() + "\n" for line in console.export_text().splitlines())


def _words(cell) -> list[str]:
    return str(cell).split()


def fits(table: Table, width: int) -> bool:
    """Whether rich draws `table` in `width` columns with every word of every cell (headers
    too) whole. Narrower than that, rich cuts or folds cells: 0.384 would show as 0."""
    bare = copy.copy(table)
    bare.title = bare.caption = None  # a title wraps between words; only the cells can be cut
    shown = (lambda column: (column.header, *column.cells)) if table.show_header else (
        lambda column: column.cells)  # a hidden header is not drawn, so it cannot be cut
    needed = Counter(word for column in table.columns for cell in shown(column)
                     for word in _words(cell))
    return not needed - Counter(_drawn(bare, width).split())


def records(table: Table) -> Text:
    """`table` as one record per line, 'header: value; ...' (empty cells left out; a column
    without a header gives its value alone), under its title: what a width too narrow for the
    table shows instead."""
    headers = [" ".join(_words(column.header)) if table.show_header else ""
               for column in table.columns]
    rows = zip(*([" ".join(_words(cell)) for cell in column.cells] for column in table.columns),
               strict=True)
    lines = [str(table.title)] if table.title else []
    lines += ["; ".join(f"{header}: {value}" if header else value
                        for header, value in zip(headers, row, strict=True) if value)
              for row in rows]
    return Text("\n".join(lines), overflow="fold")


def fitted(renderable, width: int):
    """`renderable` for `width` columns: each table that does not fit them whole becomes its
    records; a digit is never cut."""
    if isinstance(renderable, Table):
        return renderable if fits(renderable, width) else records(renderable)
    if isinstance(renderable, Group):
        return Group(*(fitted(part, width) for part in renderable.renderables))
    return renderable


def natural_width(table: Table) -> int:
    """The columns `table` takes with no cell wrapped, WIDTH at least: for text that no
    terminal wraps (a test's failure report), where a frame's path would make it records."""
    console = Console(file=io.StringIO(), width=10_000, markup=False)
    return max(WIDTH, console.measure(table).maximum)


def print_fitted(renderable, width: int) -> None:
    """`renderable` on stdout in `width` columns, its tables fitted."""
    Console(width=width, markup=False).print(fitted(renderable, width))


def console_text(renderable, width: int = WIDTH) -> str:
    """The renderable as plain text in `width` columns, its tables fitted."""
    return _drawn(fitted(renderable, width), width)
