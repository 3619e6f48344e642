"""`mlamem validate`: predicted against measured, per case and per buffer."""

from __future__ import annotations

import dataclasses
import json

from rich.table import Table

from mlamem.environment import Environment
from mlamem.render.common import console_text
from mlamem.validate import Comparison


def validation_rows(comparisons: list[Comparison]) -> list[dict]:
    """One summary per (scenario, T, path): totals and the worst buffer difference."""
    cases: dict[tuple, list[Comparison]] = {}
    for c in comparisons:
        cases.setdefault((c.scenario, c.tokens, c.path), []).append(c)
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


def validation_table(comparisons: list[Comparison], command: str) -> str:
    table_ = Table(title="mlamem validate: predicted vs measured, bytes",
                   caption=f"Command: {command}", caption_justify="left")
    for name in ("scenario", "T", "path", "alloc predicted", "alloc measured", "diff",
                 "reserved predicted", "reserved measured", "diff", "buffers", "worst buffer diff",
                 "verdict"):
        table_.add_column(name, justify="left" if name in ("scenario", "path", "verdict")
                          else "right")
    for r in validation_rows(comparisons):
        a, res = r["allocated"], r["reserved"]
        table_.add_row(r["scenario"], str(r["tokens"]), r["path"], str(a.predicted),
                       str(a.measured), _diff(a), str(res.predicted), str(res.measured),
                       _diff(res), str(r["buffers"]), str(r["worst_buffer_difference"]),
                       "equal" if r["agrees"] else "DIFFERS")
    lines = [console_text(table_, width=170)]
    lines += [f"DIFFERS: {c.scenario} T={c.tokens} {c.path} {c.item} {c.metric}: predicted "
              f"{c.predicted}, measured {c.measured} ({_diff(c)} B)"
              for c in comparisons if not c.agrees]
    return "\n".join(lines)


def validation_markdown(comparisons: list[Comparison], command: str) -> str:
    lines = ["### mlamem validate: predicted vs measured (bytes)", "",
             "| scenario | T | path | allocated: predicted | measured | diff | reserved: predicted "
             "| measured | diff | buffers | worst buffer diff | verdict |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in validation_rows(comparisons):
        a, res = r["allocated"], r["reserved"]
        lines.append(f"| {r['scenario']} | {r['tokens']} | {r['path']} | {a.predicted} | "
                     f"{a.measured} | {_diff(a)} | {res.predicted} | {res.measured} | "
                     f"{_diff(res)} | {r['buffers']} | {r['worst_buffer_difference']} | "
                     f"{'equal' if r['agrees'] else 'DIFFERS'} |")
    lines += ["", f"Command: `{command}`"]
    return "\n".join(lines) + "\n"


def validation_json(comparisons: list[Comparison], command: str, *,
                    environment: Environment | None = None, created: str | None = None) -> str:
    """The schema mlamem.validate/1; `environment` and `created` are recorded when given."""
    items = [{**c.__dict__, "difference": c.difference} for c in comparisons]
    data = {"schema": "mlamem.validate/1", "command": command,
            "agrees": all(c.agrees for c in comparisons), "comparisons": items}
    if environment is not None:
        data["environment"] = dataclasses.asdict(environment)
    if created is not None:
        data["created"] = created
    return json.dumps(data, indent=2) + "\n"


VALIDATION_FORMATS = {"table": validation_table, "markdown": validation_markdown,
                      "json": validation_json}


