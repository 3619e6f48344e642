"""`mlamem explain`: a snapshot explained, as a table, Markdown for an issue, or JSON. The
document is the command's JSON (mlamem.explain/1)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from rich.console import Group
from rich.text import Text

from mlamem.operations import operation
from mlamem.render.common import compact_table, console_text, with_notes
from mlamem.render.escape import escaped, markdown_code
from mlamem.spec.units import format_bytes

if TYPE_CHECKING:
    from mlamem.results.explain import ExplainFile, FoundCall, ImpliedShape


def _bytes(value: int | None) -> str:
    return "-" if value is None else format_bytes(value)


def _shape(call: FoundCall, shape: ImpliedShape) -> str:
    """One implied shape in the operation's symbols: `T=1024 at 64 heads`, `b=16 (context
    8192) at 64 heads`, `sparse-prefill s_q=1024 at 64 heads` where the call fits several."""
    op = operation(shape.op or call.op or "sparse-decode")
    text = f"{op.symbol}={shape.tokens}"
    if op.kv_key == "context_len" and shape.context_len is not None:
        text += f" (context {shape.context_len})"
    return (f"{op.name} " if shape.op else "") + f"{text} at {shape.heads} heads"


def _implied(call: FoundCall) -> str:
    shapes = " or ".join(_shape(call, s) for s in call.implied)
    return shapes + (" (ambiguous)" if call.ambiguous else "")


def _saving(call: FoundCall) -> str:
    saving = call.saving
    if saving is None:
        return "no implied head count is the scenario's; give --scenario"
    if call.path == "workspace":
        return "already the workspace path"
    removed = ", ".join(saving.removed_buffers) or "nothing"
    return (f"{format_bytes(saving.saving_bytes)} per call ({removed}), "
            f"{format_bytes(saving.saving_at_peak_bytes)} at the peak")


def _peak_line(doc: ExplainFile) -> str:
    where = (f"at trace event {doc.peak_event} of {doc.trace_events}"
             if doc.peak_source == "trace" else "from the segments (no trace)")
    return (f"peak allocated {format_bytes(doc.peak_bytes)} ({doc.peak_bytes} B) {where}; "
            f"segments held {format_bytes(doc.reserved_bytes)} at the end; device "
            f"{doc.device}")


def _call_notes(doc: ExplainFile) -> list[str]:
    notes = []
    for i, call in enumerate(doc.calls, 1):
        if call.saving is not None:
            notes.append(f"call {i} reproduces with: {escaped(call.saving.command)}")
    if any(c.ambiguous for c in doc.calls):
        notes.append("ambiguous: bytes fix only rows x heads; --scenario fixes the heads")
    return notes + [escaped(note) for note in doc.notes]


def explain_markdown(doc: ExplainFile) -> str:
    lines = [f"### mlamem explain: {markdown_code(doc.snapshot)}", "", _peak_line(doc) + ".",
             "", "Live at the peak, by frame:", "", "| frame | bytes | allocations |",
             "|---|---:|---:|"]
    lines += [f"| {markdown_code(r.frame)} | {format_bytes(r.bytes)} | {r.allocations} |"
              for r in doc.by_frame]
    lines += ["", "By segment:", "", "| segment | size | live | allocations |",
              "|---|---:|---:|---:|"]
    lines += [f"| {_address(r.address)} | {_bytes(r.segment_bytes)} | "
              f"{format_bytes(r.live_bytes)} | {r.allocations} |" for r in doc.by_segment]
    lines += ["", f"MLA calls found ({len(doc.calls)}, scenario "
              f"{markdown_code(doc.scenario)}):" if doc.calls else
              f"MLA calls: none found (scenario {markdown_code(doc.scenario)}).", ""]
    if doc.calls:
        lines += ["| # | event | op | kernel | path | implies | buffers | live at peak | "
                  "workspace path saves |", "|---:|---:|---|---|---|---|---|---:|---|"]
        for i, call in enumerate(doc.calls, 1):
            buffers = ", ".join(f"{escaped(b.name, markdown=True)} "
                                f"{format_bytes(b.requested_bytes)}"
                                for b in call.buffers)
            lines.append(f"| {i} | {call.first_event} | {call.op or 'sparse-decode'} | "
                         f"{' or '.join(call.kernels)} | "
                         f"{call.path} | {_implied(call)} | {buffers} | "
                         f"{format_bytes(call.live_at_peak_bytes)} | {_saving(call)} |")
    lines += [""] + [f"- call {i} reproduces with: {markdown_code(c.saving.command)}"
                     for i, c in enumerate(doc.calls, 1) if c.saving is not None]
    lines += [f"- {escaped(n, markdown=True)}" for n in _call_notes(doc) if not n.startswith("call ")]
    return "\n".join(lines).rstrip() + "\n"


def _address(address: int | None) -> str:
    return "none" if address is None else f"0x{address:x}"


def explain_table(doc: ExplainFile) -> Group:
    frames = compact_table("mlamem explain: live at the peak, by frame")
    for name in ("frame", "bytes", "allocs"):
        frames.add_column(name, justify="left" if name == "frame" else "right")
    for r in doc.by_frame:
        frames.add_row(escaped(r.frame), format_bytes(r.bytes), str(r.allocations))
    segments = compact_table("by segment")
    for name in ("segment", "size", "live", "allocs"):
        segments.add_column(name, justify="left" if name == "segment" else "right")
    for r in doc.by_segment:
        segments.add_row(_address(r.address), _bytes(r.segment_bytes),
                         format_bytes(r.live_bytes), str(r.allocations))
    if not doc.calls:
        return Group(_peak_line(doc), frames, segments, with_notes(
            Text(f"MLA calls: none found (scenario {escaped(doc.scenario)})"), _call_notes(doc)))
    calls = compact_table(f"MLA calls found ({escaped(doc.scenario)})")
    for name in ("#", "event", "op", "path", "implies", "at peak", "workspace saves"):
        calls.add_column(name, justify="right" if name in ("#", "event", "at peak") else "left")
    for i, call in enumerate(doc.calls, 1):
        calls.add_row(str(i), str(call.first_event), call.op or "sparse-decode",
                      call.path, _implied(call),
                      format_bytes(call.live_at_peak_bytes), _saving(call))
    return Group(_peak_line(doc), frames, segments,
                 with_notes(calls, _call_notes(doc)))


def explain_text(doc: ExplainFile) -> str:
    return console_text(explain_table(doc))


def explain_json(doc: ExplainFile) -> str:
    return json.dumps(doc.file_dict(), indent=2) + "\n"


EXPLAIN_FORMATS = {"table": explain_text, "markdown": explain_markdown, "json": explain_json}
