"""Rendering results: rich table, PR-style Markdown, JSON and CSV. No logic lives here."""

from __future__ import annotations

import io
import json

import pandas as pd
from rich.console import Console
from rich.table import Table

from mlamem.profile import ProfileResult, ProfileRow
from mlamem.units import gib


def _label(result: ProfileResult) -> str:
    env = result.environment
    if result.measured:
        return f"measured on {env.gpu} (SM{env.compute_capability}), {result.kernel['label']}"
    return (f"PREDICTED, not measured ({result.not_measured_reason}); "
            f"allocator model + {result.kernel['label']} allocation spec, "
            f"{result.kernel['sm_count']} SMs")


def _gib(value: int | None, oom: bool = False) -> str:
    if oom:
        return "OOM"
    return "n/a" if value is None else f"{gib(value):.3f}"


def _equal(value: bool | None) -> str:
    return {True: "yes", False: "NO", None: "n/a"}[value]


def _by_tokens(rows: list[ProfileRow]) -> dict[int, dict[str, ProfileRow]]:
    table: dict[int, dict[str, ProfileRow]] = {}
    for row in rows:
        table.setdefault(row.tokens, {})[row.path] = row
    return table


def _oom_text(row: ProfileRow) -> str:
    size = "" if row.oom_requested_bytes is None else f" ({_gib(row.oom_requested_bytes)} GiB)"
    return f"OOM{size}"


def table(result: ProfileResult) -> Table:
    """A rich table, one row per (T, path)."""
    s = result.scenario
    out = Table(title=f"mlamem profile: {s['name']} ({s['heads_per_rank']} heads/rank padded "
                      f"to {s['padded_heads']}, topk {s['topk']})",
                caption="\n".join([_label(result), *result.notes]), caption_justify="left")
    for name in ("T", "path", "alloc GiB", "reserved GiB", "NVML GiB", "saved GiB", "ms",
                 "staged", "equal"):
        out.add_column(name, justify="left" if name in ("path", "staged") else "right")
    for tokens, paths in _by_tokens(result.rows).items():
        base = paths.get("alloc")
        for row in paths.values():
            failed = row.failure is not None
            saved = ("" if row is base or base is None or failed or base.failure
                     else _gib(base.peak_allocated_bytes - row.peak_allocated_bytes))
            out.add_row(
                str(tokens), row.path,
                _oom_text(row) if row.oom else (row.failure or _gib(row.peak_allocated_bytes)),
                "" if failed else _gib(row.peak_reserved_bytes),
                "" if failed else _gib(row.nvml_peak_bytes), saved,
                "" if row.wall_time_ms is None else f"{row.wall_time_ms:.2f}",
                ",".join(row.staged) or "-", _equal(row.outputs_equal),
            )
    return out


def render_table(result: ProfileResult, width: int | None = None) -> str:
    console = Console(file=io.StringIO(), width=width or 120, record=True)
    console.print(table(result))
    return console.export_text()


def markdown(result: ProfileResult) -> str:
    """The source PR's "Per-call peak allocation" table: T, before, after, saved, equal."""
    s = result.scenario
    lines = [
        f"### Per-call peak allocation: {s['name']}",
        "",
        f"{s['model']}, {s['heads_per_rank']} heads/rank padded to {s['padded_heads']}, "
        f"topk {s['topk']}, s_q = T. {_label(result)}.",
        "",
    ]
    by_tokens = _by_tokens(result.rows)
    paths = list(dict.fromkeys(r.path for r in result.rows))
    if paths == ["alloc", "workspace"]:
        lines += ["| T | before (allocating path) | after (workspace path) | saved | outputs equal |",
                  "|---|---|---|---|---|"]
        for tokens, row in by_tokens.items():
            before, after = row["alloc"], row["workspace"]
            saved = ("n/a" if before.failure or after.failure
                     else f"{gib(before.peak_allocated_bytes - after.peak_allocated_bytes):.3f} GiB")
            lines.append(f"| {tokens} | {_md_cell(before)} | {_md_cell(after)} | {saved} | "
                         f"{_equal(row['alloc'].outputs_equal)} |")
    else:
        lines += ["| T | " + " | ".join(f"{p} path" for p in paths) + " |",
                  "|---|" + "---|" * len(paths)]
        for tokens, row in by_tokens.items():
            lines.append(f"| {tokens} | " + " | ".join(_md_cell(row[p]) for p in paths) + " |")
    lines += [""] + [f"- {note}" for note in result.notes]
    lines.append(f"- Command: `{result.command}`")
    return "\n".join(lines) + "\n"


def _md_cell(row: ProfileRow) -> str:
    if row.oom:
        return _oom_text(row)
    if row.failure:
        return f"failed: {row.failure}"
    return f"{gib(row.peak_allocated_bytes):.3f} GiB"


def to_json(result: ProfileResult) -> str:
    return json.dumps(result.to_dict(), indent=2) + "\n"


def to_csv(result: ProfileResult) -> str:
    frame = pd.DataFrame([r.__dict__ for r in result.rows])
    frame["staged"] = frame["staged"].map(";".join)
    return frame.to_csv(index=False)


FORMATS = {"table": render_table, "markdown": markdown, "json": to_json, "csv": to_csv}
