"""`mlamem graphs`: one attention call captured at every size of the capture list into one
shared pool, per path; the pool it grew beside vLLM's estimate of it."""

from __future__ import annotations

import json

from rich.console import Group
from rich.table import Table

from mlamem.render.common import (
    compact_table,
    console_text,
    csv_cell,
    equal_text,
    predicted_tag,
    signed_bytes,
    with_notes,
)
from mlamem.render.escape import escaped, markdown_code, markdown_row
from mlamem.results import CSV
from mlamem.results.graphs import Capture, Estimate, GraphPath, GraphsFile
from mlamem.spec.units import format_bytes

TABLE_WIDTH = 100  # three paths side by side need more than common.WIDTH
CSV_COLUMNS = CSV["mlamem.graphs/1"][2]  # documented in docs/schemas/csv.md


def _label(result: GraphsFile) -> str:
    env = result.environment
    if result.measured:
        return f"measured on {env.gpu} (SM{env.compute_capability}), {result.kernel['label']}"
    return (f"PREDICTED, not measured ({result.not_measured_reason}); allocator model + "
            f"{result.kernel['label']} allocation spec, {result.kernel['sm_count']} SMs"
            + (" + the target GPU's non-torch memory (notes: its record)" if has_device(result)
               else ""))


def _capture_list(result: GraphsFile) -> str:
    sizes = result.capture_sizes
    captures = (f"1 capture of T = {sizes[0]} tokens" if len(sizes) == 1 else
                f"{len(sizes)} captures of T = {sizes[0]} down to {sizes[-1]} tokens")
    return f"{captures} into one pool; list: {result.capture_sizes_source}"


def _staged(path: GraphPath) -> str:
    return f"{path.path} path stages " + (", ".join(path.staged) or "nothing")


def _bytes(value: int | None) -> str:
    return "n/a" if value is None else format_bytes(value)


def error_percent_text(estimate: Estimate | None) -> str:
    """'+25.0%': the estimate's error, of what the list took; 'n/a' without one."""
    if estimate is None or estimate.error_percent is None:
        return "n/a"
    return f"{estimate.error_percent:+.1f}%"


def has_device(result: GraphsFile) -> bool:
    """Whether the result has device-wide figures: measured (mem_get_info), or predicted with
    the host setup's memory outside the allocator."""
    return any(p.device_bytes is not None for p in result.paths)


def _by_tokens(path: GraphPath) -> dict[int, Capture]:
    return {capture.tokens: capture for capture in path.captures}


def _peak_cell(capture: Capture | None) -> str:
    """The peak inside the capture; OOM (with the failed request) or failed; '-' if not run."""
    if capture is None:
        return "-"
    if capture.oom:
        size = capture.oom_requested_bytes
        return "OOM" + ("" if size is None else f" ({format_bytes(size)})")
    if capture.failure is not None:
        return "failed"
    return _bytes(capture.peak_allocated_bytes)


def _growth_cell(capture: Capture | None, field: str) -> str:
    if capture is None or capture.failure is not None:
        return "-"
    return signed_bytes(getattr(capture, field))


def estimate_of(path: GraphPath, source: str) -> Estimate | None:
    """The path's vLLM estimate from `source` ("allocator" or "device"), if it was made."""
    return next((e for e in path.estimates if e.source == source), None)


def estimate_sources(result: GraphsFile) -> list[str]:
    """The estimates any path has: allocator, then device (measured, or modelled)."""
    return [s for s in ("allocator", "device")
            if any(estimate_of(p, s) is not None for p in result.paths)]


def _error_text(estimate: Estimate | None) -> str:
    """'+50.000 MiB (+25.0%)': estimate minus actual."""
    if estimate is None:
        return "n/a"
    return f"{signed_bytes(estimate.error_bytes)} ({error_percent_text(estimate)})"


def _rule_text(path: GraphPath, estimate: Estimate) -> str:
    """How vLLM's rule gave the estimate, against what the list took."""
    e = estimate
    return (f"vLLM's estimate, {path.path} path, {e.source}: {format_bytes(e.first_bytes)} + "
            f"{format_bytes(e.per_graph_bytes)} x {e.graphs - 1} = {format_bytes(e.estimate_bytes)}"
            f" for {format_bytes(e.actual_bytes)} taken: {_error_text(e)}")


def all_replays_equal(path: GraphPath) -> bool | None:
    """True when every capture replayed bit-identically, False if one did not, None when
    nothing was compared (predicted)."""
    marks = [c.replay_equal for c in path.captures]
    if any(mark is False for mark in marks):
        return False
    return True if marks and all(marks) else None


def _failures(result: GraphsFile) -> list[str]:
    return [f"{p.path} path stopped at {p.failure}" for p in result.paths if p.failure]


def _captures_table(result: GraphsFile) -> Table:
    out = compact_table(escaped(f"mlamem graphs: {result.scenario['name']}"
                                f"{predicted_tag(result.measured)}, {result.kernel['label']}"))
    out.add_column("T", justify="right", no_wrap=True)
    for path in result.paths:
        out.add_column(f"{escaped(path.path)}\npeak", justify="right", no_wrap=True)
        out.add_column("\npool +", justify="right", no_wrap=True)
        if result.measured:
            out.add_column("\nrep", justify="right", no_wrap=True)
    captures = [_by_tokens(path) for path in result.paths]
    for tokens in result.capture_sizes:
        cells = [str(tokens)]
        for by_tokens in captures:
            capture = by_tokens.get(tokens)
            cells += [_peak_cell(capture), _growth_cell(capture, "pool_growth_bytes")]
            if result.measured:
                cells.append("-" if capture is None else equal_text(capture.replay_equal))
        out.add_row(*cells)
    return out


def _totals_table(result: GraphsFile) -> Table:
    out = compact_table(f"Totals over the list{predicted_tag(result.measured)}")
    out.add_column("", justify="left", no_wrap=True)
    for path in result.paths:
        out.add_column(f"{escaped(path.path)} path", justify="right", no_wrap=True)
    paths = result.paths
    out.add_row("pool (reserved growth)", *(_bytes(p.pool_bytes) for p in paths))
    out.add_row("held after the list", *(_bytes(p.held_bytes) for p in paths))
    if has_device(result):
        out.add_row("device growth (mem_get_info)", *(_bytes(p.device_bytes) for p in paths))
        out.add_row("  not explained by the pool",
                    *(signed_bytes(p.unexplained_device_bytes) for p in paths))
    for source in estimate_sources(result):
        estimates = [estimate_of(p, source) for p in paths]
        out.add_row(f"vLLM's estimate ({source})",
                    *(_bytes(None if e is None else e.estimate_bytes) for e in estimates))
        out.add_row("  error (estimate - actual)", *(_error_text(e) for e in estimates))
    if result.measured:
        out.add_row("every replay bit-identical",
                    *(equal_text(all_replays_equal(p)) for p in paths))
    return out


def graphs_table(result: GraphsFile) -> Group:
    """The paths side by side, one row per capture size (largest first), then the totals and
    vLLM's estimate, then what was measured where and the notes."""
    rules = [_rule_text(p, e) for p in result.paths for e in p.estimates]
    legend = ("per path: peak, allocated at the peak inside the capture; pool +, the pool's "
              "growth (reserved) after it, its outputs released"
              + ("; rep, whether the replay's out and lse equal the eager call's bits"
                 if result.measured else ""))
    notes = [_label(result), _capture_list(result), legend,
             *(_staged(p) for p in result.paths),
             *_failures(result), *rules, *result.notes]
    return Group(_captures_table(result), "",
                 with_notes(_totals_table(result), [escaped(note) for note in notes]))


def render_graphs_table(result: GraphsFile) -> str:
    return console_text(graphs_table(result), width=TABLE_WIDTH)


def _summary_markdown(result: GraphsFile) -> list[str]:
    sources = estimate_sources(result)
    device = has_device(result)
    head = ["path", "staged", "pool", "largest capture's peak", "held"]
    if device:
        head += ["device growth", "not explained by the pool"]
    for source in sources:
        head += [f"vLLM's estimate ({source})", "error"]
    head.append("every replay bit-identical")
    lines = [markdown_row(head), "|" + "---|" * len(head)]
    for path in result.paths:
        largest = path.captures[0] if path.captures else None
        cells = [path.path, ", ".join(path.staged) or "-", _bytes(path.pool_bytes),
                 _peak_cell(largest), _bytes(path.held_bytes)]
        if device:
            cells += [_bytes(path.device_bytes), signed_bytes(path.unexplained_device_bytes)]
        for source in sources:
            estimate = estimate_of(path, source)
            cells += [_bytes(None if estimate is None else estimate.estimate_bytes),
                      _error_text(estimate)]
        cells.append(equal_text(all_replays_equal(path)))
        lines.append(markdown_row(cells))
    return lines


def _captures_markdown(result: GraphsFile) -> list[str]:
    device, replays = has_device(result), result.measured
    head = ["T"]
    for path in result.paths:
        head += [f"{path.path} peak", f"{path.path} pool growth"]
        head += [f"{path.path} device growth"] * device + [f"{path.path} replay equal"] * replays
    lines = [markdown_row(head), "|" + "---|" * len(head)]
    captures = [_by_tokens(path) for path in result.paths]
    for tokens in result.capture_sizes:
        cells = [str(tokens)]
        for by_tokens in captures:
            capture = by_tokens.get(tokens)
            cells += [_peak_cell(capture), _growth_cell(capture, "pool_growth_bytes")]
            if device:
                cells.append(_growth_cell(capture, "device_growth_bytes"))
            if replays:
                cells.append("-" if capture is None else equal_text(capture.replay_equal))
        lines.append(markdown_row(cells))
    return lines


def graphs_markdown(result: GraphsFile) -> str:
    """A PR section: the summary per path (pool, vLLM's estimate and its error), then every
    capture, the notes and the command."""
    s, tag = result.scenario, predicted_tag(result.measured)
    about = (f"{s['model']}, {s['heads_per_rank']} heads/rank padded to {s['padded_heads']}, "
             f"{result.op} (topk {s['topk']}). {_label(result)}. {_capture_list(result)}.")
    lines = [f"### CUDA-graph pool over the capture list: {escaped(s['name'], markdown=True)}{tag}",
             "", escaped(about, markdown=True), "", *_summary_markdown(result), ""]
    lines += [f"- {escaped(line, markdown=True)}" for line in
              [*(_rule_text(p, e) for p in result.paths for e in p.estimates), *_failures(result)]]
    lines += ["", f"#### Per capture, largest first{tag}", "", *_captures_markdown(result), ""]
    lines += [f"- {escaped(note, markdown=True)}" for note in result.notes]
    lines.append(f"- Command: {markdown_code(result.command)}")
    return "\n".join(lines) + "\n"


def graphs_json(result: GraphsFile) -> str:
    return json.dumps(result.file_dict(), indent=2) + "\n"


def graphs_csv(result: GraphsFile) -> str:
    """One line per (path, capture), in capture order (docs/schemas/csv.md); every
    cell a plain value, as in profile's CSV: empty for null, `true`, `alloc`, 209715200."""
    import pandas as pd  # only CSV needs it

    cells = [{"path": csv_cell(path.path),
              **{name: csv_cell(getattr(capture, name)) for name in CSV_COLUMNS[1:]}}
             for path in result.paths for capture in path.captures]
    return pd.DataFrame(cells, columns=list(CSV_COLUMNS)).to_csv(index=False)


GRAPHS_FORMATS = {"table": render_graphs_table, "markdown": graphs_markdown, "json": graphs_json,
                  "csv": graphs_csv}
