"""`mlamem profile`: the per-call table, the PR's Markdown table, the breakdown, JSON and CSV."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from rich.console import Group

from mlamem.operations import describe_call, operation
from mlamem.render.common import (
    compact_table,
    console_text,
    csv_cell,
    equal_text,
    gib_text,
    predicted_tag,
    with_notes,
)
from mlamem.render.escape import escaped, markdown_code
from mlamem.spec.units import format_bytes, gib

if TYPE_CHECKING:
    from mlamem.results.profile import ProfileFile, ProfileRow
    from mlamem.results.shared import Buffer


def _label(result: ProfileFile) -> str:
    env = result.environment
    if result.measured:
        return f"measured on {env.gpu} (SM{env.compute_capability}), {result.kernel.label}"
    return (f"PREDICTED, not measured ({result.not_measured_reason}); "
            f"allocator model + {result.kernel.label} allocation spec, "
            f"{result.kernel.sm_count} SMs")


def _symbol(result: ProfileFile) -> str:
    """The swept quantity's symbol: T, b (requests) or s_q."""
    return operation(result.op).symbol


def _op_tag(result: ProfileFile) -> str:
    return "" if result.op == "sparse-decode" else f" {result.op}"


def _ms(row: ProfileRow) -> str:
    """The do_bench median where timed, else the host wall time of the one call."""
    value = row.median_ms if row.median_ms is not None else row.wall_time_ms
    return "" if value is None else f"{value:.2f}"


def _by_tokens(rows: list[ProfileRow]) -> dict[int, dict[str, ProfileRow]]:
    table: dict[int, dict[str, ProfileRow]] = {}
    for row in rows:
        table.setdefault(row.tokens, {})[row.path] = row
    return table


def _oom_text(row: ProfileRow) -> str:
    size = "" if row.oom_requested_bytes is None else f" ({gib_text(row.oom_requested_bytes)} GiB)"
    return f"OOM{size}"


def table(result: ProfileFile) -> Group:
    """A rich table, one row per (T, path), within 80 columns (staged buffers wrap in their
    cell), then its notes."""
    s = result.scenario
    sym = _symbol(result)
    failures = [f"{sym}={row.tokens} {escaped(row.path)}: {escaped(row.failure)}" for row in result.rows
                if row.failure and not row.oom]
    kv = result.rows[0].kv_tokens if result.rows else None
    out = compact_table(f"mlamem profile{_op_tag(result)}: {escaped(s.name)}"
                        f"{predicted_tag(result.measured)}, {s.heads_per_rank} heads/rank "
                        f"padded to {s.padded_heads}, {describe_call(result.op, s.model_dump(), kv)}; "
                        "per-call peaks in GiB")
    timed = any(row.median_ms is not None for row in result.rows)
    for name in (sym, "path", "peak\nalloc", "peak\nresv", "NVML", "saved",
                 "median\nms" if timed else "wall\nms",
                 "allocs\nin call", "equal", "staged"):
        out.add_column(name, justify="left" if name in ("path", "staged") else "right",
                       no_wrap=name != "staged", overflow="fold")
    for tokens, paths in _by_tokens(result.rows).items():
        base = paths.get("alloc")
        for row in paths.values():
            failed = row.failure is not None
            saved = ("" if row is base or base is None or failed or base.failure
                     else gib_text(base.peak_allocated_bytes - row.peak_allocated_bytes))
            out.add_row(
                str(tokens), escaped(row.path),
                _oom_text(row) if row.oom else ("failed" if failed
                                                else gib_text(row.peak_allocated_bytes)),
                "" if failed else gib_text(row.peak_reserved_bytes),
                "" if failed else gib_text(row.nvml_peak_bytes), saved,
                _ms(row),
                "" if row.allocations_in_call is None else str(row.allocations_in_call),
                equal_text(row.outputs_equal), escaped(", ".join(row.staged)) or "-",
            )
    return with_notes(out, [_label(result), *failures, *map(escaped, result.notes),
                            *_process_peaks(result)])


def _process_peaks(result: ProfileFile) -> list[str]:
    """This process's NVML peaks, labelled, beside the device-wide column: one line."""
    sym = _symbol(result)
    cells = [f"{sym}={row.tokens} {row.path} {gib_text(row.nvml_process_peak_bytes)}"
             for row in result.rows if row.nvml_process_peak_bytes is not None]
    return [f"NVML, this process (peak, absolute, GiB): {', '.join(cells)}"] if cells else []


def render_table(result: ProfileFile) -> str:
    return console_text(table(result))


def markdown(result: ProfileFile) -> str:
    """The source PR's "Per-call peak allocation" table: T, before, after, saved, equal (and,
    where the calls were timed, each path's do_bench median)."""
    s = result.scenario
    sym = _symbol(result)
    kv = result.rows[0].kv_tokens if result.rows else None
    lines = [
        f"### Per-call peak allocation{_op_tag(result)}: "
        f"{escaped(s.name, markdown=True)}"
        f"{predicted_tag(result.measured)}",
        "",
        f"{escaped(s.model, markdown=True)}, {s.heads_per_rank} heads/rank padded to "
        f"{s.padded_heads}, "
        f"{describe_call(result.op, s.model_dump(), kv)}. {_label(result)}.",
        "",
    ]
    by_tokens = _by_tokens(result.rows)
    paths = list(dict.fromkeys(r.path for r in result.rows))
    timed = any(row.median_ms is not None for row in result.rows)
    time_head = "".join(f" {p} ms |" for p in paths) if timed else ""
    time_rule = "---|" * len(paths) if timed else ""

    def times(row: dict) -> str:
        return "".join(f" {_ms(row[p]) or '-'} |" for p in paths) if timed else ""

    if not paths:  # an empty shard: more shards than the sweep has units
        lines += [f"No {sym} in shard {result.shard} of this sweep."]
    elif paths == ["alloc", "workspace"]:
        lines += [f"| {sym} | before (allocating path) | after (workspace path) | saved | "
                  f"outputs equal |{time_head}", "|---|---|---|---|---|" + time_rule]
        for tokens, row in by_tokens.items():
            before, after = row["alloc"], row["workspace"]
            saved = ("n/a" if before.failure or after.failure
                     else f"{gib(before.peak_allocated_bytes - after.peak_allocated_bytes):.3f} GiB")
            lines.append(f"| {tokens} | {_md_cell(before)} | {_md_cell(after)} | {saved} | "
                         f"{equal_text(row['alloc'].outputs_equal)} |{times(row)}")
    else:
        lines += [f"| {sym} | " + " | ".join(f"{p} path" for p in paths) + " | outputs equal |"
                  + time_head, "|---|" + "---|" * (len(paths) + 1) + time_rule]
        for tokens, row in by_tokens.items():
            lines.append(f"| {tokens} | " + " | ".join(_md_cell(row[p]) for p in paths)
                         + f" | {equal_text(row[paths[0]].outputs_equal)} |{times(row)}")
    lines += [""] + [f"- {escaped(note, markdown=True)}" for note in result.notes]
    lines.append(f"- Command: {markdown_code(result.command)}")
    return "\n".join(lines) + "\n"


def _md_cell(row: ProfileRow) -> str:
    if row.oom:
        return _oom_text(row)
    if row.failure:
        return f"failed: {escaped(row.failure, markdown=True)}"
    return f"{gib(row.peak_allocated_bytes):.3f} GiB"


def _in_call(row: ProfileRow) -> str:
    """'7 / 12.273 GiB': allocations made inside the call and their bytes."""
    if row.allocations_in_call is None:
        return ""
    return f"{row.allocations_in_call} / {format_bytes(row.bytes_allocated_in_call)}"


def _adds_up(row: ProfileRow, *, exact: bool) -> str:
    """Whether the buffers live at the peak add up to the (measured or predicted) peak; with
    `exact`, in bytes as well as in units."""
    kind = "measured" if row.measured else "predicted"

    def size(n: int) -> str:
        return f"{format_bytes(n)} ({n} B)" if exact else format_bytes(n)

    if row.breakdown_peak_bytes == row.peak_allocated_bytes:
        if exact:
            return (f"buffers live at the peak add up to the {kind} peak "
                    f"({row.peak_allocated_bytes} B)")
        return f"buffers live at the peak add up to the {kind} peak, {size(row.peak_allocated_bytes)}"
    missing = row.peak_allocated_bytes - row.breakdown_peak_bytes
    return (f"buffers live at the peak sum to {size(row.breakdown_peak_bytes)}, the {kind} peak is "
            f"{size(row.peak_allocated_bytes)}: {'+' if missing > 0 else ''}{size(missing)} "
            "not attributed")


def _removed(buffer: Buffer) -> str:
    return {True: "removed", False: "kept", None: ""}[buffer.removed_by_workspace]


def _framed(result: ProfileFile) -> bool:
    """Whether the breakdown carries frames (`profile --frames`): then they have a column."""
    return any(b.frame for row in result.rows for b in row.buffers)


def _frame(buffer: Buffer) -> str:
    """The buffer's frame, where its name is not that frame already."""
    frame = buffer.frame or ""
    return "" if frame == buffer.name else frame


def breakdown_table(result: ProfileFile) -> Group:
    """Per (T, path): each buffer allocated inside the call, by whom, live at the peak or not,
    and with frames the frame that asked for it."""
    summaries = [f"{_symbol(result)}={row.tokens} {escaped(row.path)}: " + (
        escaped(row.failure or "") or f"{_in_call(row)} allocated in the call; {_adds_up(row, exact=False)}")
        for row in result.rows]
    out = compact_table(f"mlamem profile --breakdown: {escaped(result.scenario.name)}"
                        f"{predicted_tag(result.measured)}")
    framed = _framed(result)
    for name in (f"{_symbol(result)}, path", "buffer", "by", "size", "live at\npeak",
                 "workspace\npath", *(["frame"] if framed else [])):
        out.add_column(name, justify="right" if name == "size" else "left", no_wrap=True)
    for row in result.rows:
        for i, b in enumerate(row.buffers):
            out.add_row(f"{row.tokens} {escaped(row.path)}" if i == 0 else "",
                        escaped(b.name), escaped(b.allocated_by), format_bytes(b.requested_bytes),
                        "yes" if b.live_at_peak else "no", _removed(b),
                        *([escaped(_frame(b))] if framed else []))
        out.add_section()
    return with_notes(out, [_label(result), *summaries, *map(escaped, result.notes)])


def breakdown_markdown(result: ProfileFile) -> str:
    """The per-buffer view as Markdown, one table per (T, path)."""
    tag = predicted_tag(result.measured)
    name = escaped(result.scenario.name, markdown=True)
    lines = [f"### Where the bytes go: {name}{tag}", "", f"{_label(result)}.", ""]
    framed = _framed(result)
    for row in result.rows:
        path = escaped(row.path, markdown=True)
        lines.append(f"#### {_symbol(result)}={row.tokens}, {path} path{tag}")
        lines.append("")
        if row.failure:
            lines += [f"Failed: {escaped(row.failure, markdown=True)}", ""]
            continue
        lines += ["| buffer | allocated by | bytes | size | live at peak | workspace path |"
                  + (" frame |" if framed else ""),
                  "|---|---|---|---|---|---|" + ("---|" if framed else "")]
        for b in row.buffers:
            frame = f" {markdown_code(_frame(b))} |" if framed and _frame(b) else (
                " |" if framed else "")
            lines.append(f"| {_md_name(b)} | {escaped(b.allocated_by, markdown=True)} | "
                         f"{b.requested_bytes} | "
                         f"{format_bytes(b.requested_bytes)} | "
                         f"{'yes' if b.live_at_peak else 'no'} | {_removed(b)} |{frame}")
        lines += ["", f"Allocations inside the call: {_in_call(row)}; {_adds_up(row, exact=True)}."]
        if row.missing_buffers:
            lines.append("Expected but not allocated: "
                         f"{escaped(', '.join(row.missing_buffers), markdown=True)}.")
        lines.append("")
    lines += [f"- {escaped(note, markdown=True)}" for note in result.notes]
    lines.append(f"- Command: {markdown_code(result.command)}")
    return "\n".join(lines) + "\n"


def _md_name(buffer: Buffer) -> str:
    """A buffer's name in Markdown: a frame (`file:line function`) as code."""
    name = buffer.name
    return markdown_code(name) if name == buffer.frame else escaped(name, markdown=True)


def to_json(result: ProfileFile) -> str:
    return json.dumps(result.file_dict(), indent=2) + "\n"


def to_csv(result: ProfileFile) -> str:
    """One line per (T, path), the columns of `rows` in mlamem.profile/1 (docs/schemas/csv.md),
    each cell a plain value (`render.common.csv_cell`): empty for null, `true`, `alloc`,
    `padded_q;out`, buffers as `padded_q=75497472;out=67108864`."""
    import pandas as pd  # only CSV needs it

    cells = [{name: csv_cell(value) for name, value in row.model_dump().items()}
             for row in result.rows]
    return pd.DataFrame(cells).to_csv(index=False)


FORMATS = {"table": render_table, "markdown": markdown, "json": to_json, "csv": to_csv}
BREAKDOWN_FORMATS = {"table": lambda r: console_text(breakdown_table(r)),
                     "markdown": breakdown_markdown, "json": to_json}


