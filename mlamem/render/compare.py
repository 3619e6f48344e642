"""`mlamem compare`: two kernels on the same inputs, per (value, path), and each against the
torch reference."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from rich.console import Group

from mlamem.operations import operation
from mlamem.render.common import compact_table, console_text, with_notes
from mlamem.render.escape import escaped, markdown_row

if TYPE_CHECKING:
    from mlamem.results.compare import CompareFile, CompareRow


def _equal(row: CompareRow) -> str:
    if row.out_equal and row.lse_equal:
        return "bit-identical"
    parts = []
    if not row.out_equal:
        parts.append(f"out differs (max {row.out_max_diff:.3g})")
    if not row.lse_equal:
        parts.append(f"lse differs (max {row.lse_max_diff:.3g})")
    return "; ".join(parts)


def _error(row: CompareRow, name: str) -> str:
    error = row.errors.get(name)
    if error is None:
        return "-"
    return f"{error.out_rel_l2:.2e} / {error.lse_max_abs:.1e}"


def _title(result: CompareFile) -> str:
    a, b = (k.name for k in result.kernels)
    return f"mlamem compare {result.op}: {a} vs {b}, {result.scenario}"  # escaped where drawn


def _notes(result: CompareFile) -> list[str]:
    versions = ", ".join(f"{k.name} {k.version or '?'} (heads {k.head_counts})"
                         for k in result.kernels)
    return [f"same inputs (one seed) through each kernel; reference error = out relative L2 / "
            f"lse max abs against the plain-torch reference; KV tokens {result.kv_tokens}",
            versions, *result.notes, f"Command: {result.command}"]


def compare_view(result: CompareFile) -> Group:
    """The table and its notes, for a console of any width (`compare_table` draws it in 80)."""
    symbol = operation(result.op).symbol
    names = [k.name for k in result.kernels]
    out = compact_table(escaped(_title(result)))
    for column in (symbol, "path", "outputs", *(f"{escaped(n)}\nvs reference" for n in names)):
        out.add_column(column, justify="right" if column == symbol else "left")
    for row in result.rows:
        out.add_row(str(row.tokens), escaped(row.path), _equal(row),
                    *(_error(row, n) for n in names))
    return with_notes(out, [escaped(note) for note in _notes(result)])


def compare_table(result: CompareFile) -> str:
    return console_text(compare_view(result))


def compare_markdown(result: CompareFile) -> str:
    symbol = operation(result.op).symbol
    names = [k.name for k in result.kernels]
    lines = [f"### {escaped(_title(result), markdown=True)}", "",
             markdown_row([symbol, "path", "out and lse", *(
                 f"{n} vs reference (out rel-L2 / lse max abs)" for n in names)]),
             "|---|---|---|" + "---|" * len(names)]
    for row in result.rows:
        lines.append(markdown_row([row.tokens, row.path, _equal(row),
                                   *(_error(row, n) for n in names)]))
    lines += [""] + [f"- {escaped(note, markdown=True)}" for note in _notes(result)]
    return "\n".join(lines) + "\n"


def compare_json(result: CompareFile) -> str:
    return json.dumps(result.file_dict(), indent=2) + "\n"


COMPARE_FORMATS = {"table": compare_table, "markdown": compare_markdown, "json": compare_json}
