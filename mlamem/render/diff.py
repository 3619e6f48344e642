"""`mlamem diff`: two results compared, as a table, Markdown for a pull request, or JSON (its
model, mlamem.diff/1)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from mlamem.render.common import compact_table, console_text, signed_bytes, with_notes
from mlamem.render.escape import escaped, markdown_code
from mlamem.spec.units import format_bytes

if TYPE_CHECKING:
    from mlamem.results.diff import DiffFile, DiffUnit


def _bytes(value: int | None) -> str:
    return "-" if value is None else format_bytes(value)


def _verdict(doc: DiffFile) -> str:
    growth = doc.peak_growth_bytes
    grew = "no case paired" if growth is None else f"largest peak change {signed_bytes(growth)}"
    if doc.fail_on_growth_bytes is None:
        return grew
    limit = format_bytes(doc.fail_on_growth_bytes)
    return f"{'FAILED' if doc.failed else 'passed'}: {grew}, allowed +{limit}"


def _environment_lines(doc: DiffFile) -> list[str]:
    return [f"{d.name}: A {d.a}, B {d.b}" + (" (the gate would refuse this)"
                                                     if d.blocking else "")
            for d in doc.environment]


def _case(unit: DiffUnit) -> str:
    """The case's label; paired across labels, their shared words once: `... T=1024 alloc →
    workspace`."""
    a, b = unit.a_label, unit.b_label
    if a == b or None in (a, b):
        return unit.unit
    words_a, words_b = a.split(" "), b.split(" ")
    shared = 0
    while shared < min(len(words_a), len(words_b)) - 1 and words_a[shared] == words_b[shared]:
        shared += 1
    return " ".join([*words_a[:shared], " ".join(words_a[shared:]), "→",
                     " ".join(words_b[shared:])])


def diff_markdown(doc: DiffFile) -> str:
    lines = [f"### mlamem diff ({doc.kind}): {_verdict(doc)}", "",
             f"A: {markdown_code(doc.a)}, B: {markdown_code(doc.b)}", ""]
    environment = _environment_lines(doc)
    if environment:
        lines += ["Environments differ:", ""] + [f"- {markdown_code(e)}" for e in environment]
        lines.append("")
    lines += ["| case | A peak | B peak | change |", "|---|---:|---:|---:|"]
    for u in doc.units:
        case = _case(u)
        lines.append(f"| {markdown_code(case)} | {_bytes(u.a_peak_bytes)} | "
                     f"{_bytes(u.b_peak_bytes)} | {signed_bytes(u.peak_change_bytes)} |")
    moved = [(u, b) for u in doc.units for b in u.buffers if b.change_bytes]
    snapshots = doc.kind == "snapshot"  # an allocation of no call found goes by its frame
    what = "buffer or frame" if snapshots else "buffer"
    lines += ["", "Buffers or frames that moved:" if snapshots else "Buffers that moved:", ""]
    if moved:
        lines += [f"| case | {what} | A | B | change |", "|---|---|---:|---:|---:|"]
        lines += [f"| {markdown_code(_case(u))} | {markdown_code(b.name)} | "
                  f"{_bytes(b.a_bytes)} | {_bytes(b.b_bytes)} | "
                  f"{signed_bytes(b.change_bytes)} ({b.change_bytes:+d} B) |"
                  for u, b in moved]
    else:
        lines.append(f"none: every {what} has the same bytes in A and B")
    return "\n".join(lines) + "\n"


def diff_text(doc: DiffFile) -> str:
    table = compact_table(f"mlamem diff ({doc.kind}): {_verdict(doc)}")
    for name in ("case / buffer", "A", "B", "change"):
        table.add_column(name, justify="left" if name == "case / buffer" else "right")
    for u in doc.units:
        table.add_row(escaped(_case(u)), _bytes(u.a_peak_bytes), _bytes(u.b_peak_bytes),
                      signed_bytes(u.peak_change_bytes))
        for b in u.buffers:
            if b.change_bytes:
                table.add_row(f"  {escaped(b.name)}", _bytes(b.a_bytes), _bytes(b.b_bytes),
                              signed_bytes(b.change_bytes))
    notes = [escaped(n) for n in (f"A: {doc.a}", f"B: {doc.b}", *_environment_lines(doc))]
    return console_text(with_notes(table, notes))


def diff_json(doc: DiffFile) -> str:
    return json.dumps(doc.file_dict(), indent=2) + "\n"


DIFF_FORMATS = {"table": diff_text, "markdown": diff_markdown, "json": diff_json}
