"""`mlamem validate`: predicted against measured, per case and per buffer."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from rich.console import Group

from mlamem.commands.validate import SCHEMA
from mlamem.render.common import compact_table, console_text, signed_bytes, with_notes
from mlamem.render.escape import escaped, markdown_code, markdown_row
from mlamem.spec.units import format_bytes

if TYPE_CHECKING:
    from mlamem.results.shared import Environment
    from mlamem.results.validate import Comparison


def validation_rows(comparisons: list[Comparison]) -> list[dict]:
    """One summary per (scenario, T, path): totals and the worst buffer difference."""
    cases: dict[tuple, list[Comparison]] = {}
    for c in comparisons:
        name = c.scenario if c.op == "sparse-decode" else f"{c.scenario} {c.op}"
        cases.setdefault((name, c.tokens, c.path), []).append(c)
    rows = []
    for (scenario, tokens, path), items in cases.items():
        total = {c.metric: c for c in items if c.item == "total"}
        buffers = [c for c in items if c.item != "total"]
        worst = max((abs(c.difference) if c.difference is not None else float("inf")
                     for c in buffers), default=0)
        rows.append({"scenario": scenario, "tokens": tokens, "path": path,
                     "allocated": total["allocated"], "reserved": total["reserved"],
                     "buffers": len(buffers) // 2, "worst_buffer_difference": worst,
                     "agrees": all(c.agrees for c in items)})
    return rows


def _diff(c: Comparison) -> str:
    return "n/a" if c.difference is None else f"{c.difference:+d}"


def validation_view(comparisons: list[Comparison], command: str) -> Group:
    """One row per (scenario, T, path), within 80 columns: measured peaks with units, and
    measured - predicted; every figure that differs is then listed in bytes."""
    table_ = compact_table("mlamem validate: predicted vs measured")
    for name in ("scenario, T, path", "peak\nalloc", "Δ", "peak\nresv", "Δ", "buffers",
                 "worst\nbuffer Δ", "verdict"):
        table_.add_column(name, justify="left" if name in ("scenario, T, path", "verdict")
                          else "right", no_wrap=name not in ("Δ", "worst\nbuffer Δ"))
    scenario = None
    for r in validation_rows(comparisons):
        if r["scenario"] != scenario:
            if scenario is not None:
                table_.add_section()
            scenario = r["scenario"]
            table_.add_row(escaped(scenario))
        a, res = r["allocated"], r["reserved"]
        worst = r["worst_buffer_difference"]
        table_.add_row(f"{r['tokens']:>6} {escaped(r['path'])}", _bytes(a.measured),
                       signed_bytes(a.difference), _bytes(res.measured),
                       signed_bytes(res.difference), str(r["buffers"]),
                       "n/a" if worst == float("inf") else signed_bytes(worst).lstrip("+"),
                       "equal" if r["agrees"] else "DIFFERS")
    notes = ["peak alloc, peak resv: measured per-call peaks; Δ: measured - predicted (0: "
             "equal to the byte); buffers: buffers compared, each allocated and reserved; worst "
             "buffer Δ: the largest difference of any buffer",
             *[f"DIFFERS: {c.scenario} T={c.tokens} {c.path} {c.item} {c.metric}: predicted "
               f"{c.predicted} B, measured {c.measured} B ({_diff(c)} B){_at(c)}"
               for c in comparisons if not c.agrees],
             f"Command: {command}"]
    return with_notes(table_, [escaped(note) for note in notes])


def _at(c: Comparison) -> str:
    """Where a differing buffer was allocated: its measured frame, else its predicted one."""
    frame = c.measured_frame or c.predicted_frame
    return "" if frame is None or frame == c.item else f", at {frame}"


def validation_table(comparisons: list[Comparison], command: str) -> str:
    return console_text(validation_view(comparisons, command))


def _bytes(value: int | None) -> str:
    return "n/a" if value is None else format_bytes(value)


def validation_markdown(comparisons: list[Comparison], command: str) -> str:
    lines = ["### mlamem validate: predicted vs measured (bytes)", "",
             "| scenario | T | path | allocated: predicted | measured | diff | reserved: predicted "
             "| measured | diff | buffers | worst buffer diff | verdict |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in validation_rows(comparisons):
        a, res = r["allocated"], r["reserved"]
        lines.append(markdown_row([r["scenario"], r["tokens"], r["path"], a.predicted, a.measured,
                                   _diff(a), res.predicted, res.measured, _diff(res), r["buffers"],
                                   r["worst_buffer_difference"],
                                   "equal" if r["agrees"] else "DIFFERS"]))
    lines += ["", f"Command: {markdown_code(command)}"]
    return "\n".join(lines) + "\n"


def validation_json(comparisons: list[Comparison], command: str, *,
                    environment: Environment | dict, created: str,
                    shard: str | None = None) -> str:
    """The file mlamem.validate/1 (`ValidateFile`): where and when it was made, and `shard`
    ("I/N", or null when unsharded)."""
    from mlamem.results.validate import ValidateFile

    saved = ValidateFile(schema=SCHEMA, command=command,
                         agrees=all(c.agrees for c in comparisons), comparisons=comparisons,
                         environment=environment, created=created, shard=shard)
    return json.dumps(saved.file_dict(), indent=2) + "\n"


VALIDATION_FORMATS = {"table": validation_table, "markdown": validation_markdown,
                      "json": validation_json}


