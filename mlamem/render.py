"""Rendering results: rich table, PR-style Markdown, JSON and CSV. No logic lives here."""

from __future__ import annotations

import dataclasses
import io
import json

import pandas as pd
from rich import box
from rich.console import Console
from rich.table import Table

from mlamem.context_reuse import VARIANT_LABELS
from mlamem.environment import Environment
from mlamem.gate import Change, GateResult, Tolerance
from mlamem.profile import ProfileResult, ProfileRow
from mlamem.repro import ReproResult
from mlamem.units import format_bytes, gib
from mlamem.validate import Comparison


def _label(result: ProfileResult) -> str:
    env = result.environment
    if result.measured:
        return f"measured on {env.gpu} (SM{env.compute_capability}), {result.kernel['label']}"
    return (f"PREDICTED, not measured ({result.not_measured_reason}); "
            f"allocator model + {result.kernel['label']} allocation spec, "
            f"{result.kernel['sm_count']} SMs")


def predicted_tag(measured: bool) -> str:
    """' (PREDICTED)' after the heading of every table of predicted figures; '' when measured."""
    return "" if measured else " (PREDICTED)"


def _gib(value: int | None) -> str:
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
                      f"to {s['padded_heads']}, topk {s['topk']}); per-call peaks in GiB",
                caption="\n".join([_label(result), *result.notes]), caption_justify="left",
                box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1, 0, 0))
    for name in ("T", "path", "peak\nalloc", "peak\nresv", "NVML", "saved", "wall\nms",
                 "allocs\nin call", "staged", "equal"):
        out.add_column(name, justify="left" if name in ("path", "staged") else "right",
                       no_wrap=name != "staged")
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
                "" if row.allocations_in_call is None else str(row.allocations_in_call),
                ",".join(row.staged) or "-", _equal(row.outputs_equal),
            )
    return out


def render_table(result: ProfileResult) -> str:
    return _console_text(table(result))


def markdown(result: ProfileResult) -> str:
    """The source PR's "Per-call peak allocation" table: T, before, after, saved, equal."""
    s = result.scenario
    lines = [
        f"### Per-call peak allocation: {s['name']}{predicted_tag(result.measured)}",
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
        lines += ["| T | " + " | ".join(f"{p} path" for p in paths) + " | outputs equal |",
                  "|---|" + "---|" * (len(paths) + 1)]
        for tokens, row in by_tokens.items():
            lines.append(f"| {tokens} | " + " | ".join(_md_cell(row[p]) for p in paths)
                         + f" | {_equal(row[paths[0]].outputs_equal)} |")
    lines += [""] + [f"- {note}" for note in result.notes]
    lines.append(f"- Command: `{result.command}`")
    return "\n".join(lines) + "\n"


def _md_cell(row: ProfileRow) -> str:
    if row.oom:
        return _oom_text(row)
    if row.failure:
        return f"failed: {row.failure}"
    return f"{gib(row.peak_allocated_bytes):.3f} GiB"


def _in_call(row: ProfileRow) -> str:
    """'7 / 12.273 GiB': allocations made inside the call and their bytes."""
    if row.allocations_in_call is None:
        return ""
    return f"{row.allocations_in_call} / {format_bytes(row.bytes_allocated_in_call)}"


def _adds_up(row: ProfileRow) -> str:
    if row.breakdown_peak_bytes == row.peak_allocated_bytes:
        return f"buffers live at the peak add up to the measured peak ({row.peak_allocated_bytes} B)"
    return (f"buffers live at the peak sum to {row.breakdown_peak_bytes} B, the peak is "
            f"{row.peak_allocated_bytes} B: {row.peak_allocated_bytes - row.breakdown_peak_bytes:+} B "
            "not attributed")


def _removed(buffer: dict) -> str:
    return {True: "removed", False: "kept", None: ""}[buffer["removed_by_workspace"]]


def breakdown_table(result: ProfileResult) -> Table:
    """Per (T, path): each buffer allocated inside the call, by whom, live at the peak or not."""
    summaries = [f"T={row.tokens} {row.path}: " + (
        row.failure or f"{_in_call(row)} allocated in the call; {_adds_up(row)}")
        for row in result.rows]
    out = Table(title=f"mlamem profile --breakdown: {result.scenario['name']}",
                caption="\n".join([_label(result), *summaries, *result.notes]),
                caption_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1, 0, 0))
    for name in ("T, path", "buffer", "by", "size", "live at\npeak", "workspace\npath"):
        out.add_column(name, justify="right" if name == "size" else "left", no_wrap=True)
    for row in result.rows:
        for i, b in enumerate(row.buffers):
            out.add_row(f"{row.tokens} {row.path}" if i == 0 else "", b["name"],
                        b["allocated_by"], format_bytes(b["requested_bytes"]),
                        "yes" if b["live_at_peak"] else "no", _removed(b))
        out.add_section()
    return out


def breakdown_markdown(result: ProfileResult) -> str:
    """The per-buffer view as Markdown, one table per (T, path)."""
    tag = predicted_tag(result.measured)
    lines = [f"### Where the bytes go: {result.scenario['name']}{tag}", "", f"{_label(result)}.", ""]
    for row in result.rows:
        lines.append(f"#### T={row.tokens}, {row.path} path{tag}")
        lines.append("")
        if row.failure:
            lines += [f"Failed: {row.failure}", ""]
            continue
        lines += ["| buffer | allocated by | bytes | size | live at peak | workspace path |",
                  "|---|---|---|---|---|---|"]
        for b in row.buffers:
            lines.append(f"| {b['name']} | {b['allocated_by']} | {b['requested_bytes']} | "
                         f"{format_bytes(b['requested_bytes'])} | "
                         f"{'yes' if b['live_at_peak'] else 'no'} | {_removed(b)} |")
        lines += ["", f"Allocations inside the call: {_in_call(row)}; {_adds_up(row)}."]
        if row.missing_buffers:
            lines.append(f"Expected but not allocated: {', '.join(row.missing_buffers)}.")
        lines.append("")
    lines += [f"- {note}" for note in result.notes] + [f"- Command: `{result.command}`"]
    return "\n".join(lines) + "\n"


def to_json(result: ProfileResult) -> str:
    return json.dumps(result.to_dict(), indent=2) + "\n"


def to_csv(result: ProfileResult) -> str:
    frame = pd.DataFrame([r.__dict__ for r in result.rows])
    frame["staged"] = frame["staged"].map(";".join)
    return frame.to_csv(index=False)


def _console_text(renderable, width: int = 120) -> str:
    console = Console(file=io.StringIO(), width=width, record=True)
    console.print(renderable)
    return console.export_text()


FORMATS = {"table": render_table, "markdown": markdown, "json": to_json, "csv": to_csv}
BREAKDOWN_FORMATS = {"table": lambda r: _console_text(breakdown_table(r)),
                     "markdown": breakdown_markdown, "json": to_json}


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
    lines = [_console_text(table_, width=170)]
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


def _repro_label(result: ReproResult) -> str:
    env = result.environment
    if result.measured:
        return (f"measured on {env.gpu} (SM{env.compute_capability}), {result.kernel['label']}, "
                "each case in its own process")
    return (f"PREDICTED, not measured ({result.not_measured_reason}); allocator model + "
            f"{result.kernel['label']} allocation spec, {result.kernel['sm_count']} SMs")


def _budget_lines(result: ReproResult) -> list[str]:
    b, s = result.budget, result.scenario
    first = result.cases[0] if result.cases else {}
    lines = [f"target: {format_bytes(b['gpu_memory_bytes'])} ({s['target_gpu']} memory) at "
             f"utilization {b['utilization']} = {format_bytes(b['requested_bytes'])} for the "
             f"engine; max_num_batched_tokens {b['max_num_batched_tokens']}",
             f"weights {format_bytes(first.get('weights_bytes', 0))} per rank"
             + (f" ({s['weights_note']})" if s.get("weights_note") else "")]
    if first.get("non_torch_bytes") is not None:
        lines.append(f"non-torch memory (CUDA context, libraries): "
                     f"{format_bytes(first['non_torch_bytes'])}")
    return lines


def case_label(case: dict) -> str:
    """'alloc path' for a decode case, the reserve variant's label for a context-reuse one."""
    return f"{case['path']} path" if case.get("path") else VARIANT_LABELS[case["variant"]]


def verdict_text(case: dict) -> str:
    """One line: what happened to this path."""
    verdict = case["verdict"]
    if verdict == "fits":
        return (f"fits: step peak {format_bytes(case['step_peak_bytes'])} under a "
                f"{format_bytes(case['torch_limit_bytes'])} cap, headroom "
                f"{format_bytes(case['headroom_bytes'])}")
    if verdict == "oom":
        size = case.get("oom_requested_bytes")
        what = case.get("oom_buffer") or "an unattributed allocation"
        text = f"OOM in {case['phase']}: {what}"
        if size is not None:
            text += f" ({format_bytes(size)}, by {case.get('oom_allocated_by') or 'unknown'})"
        if case.get("free_bytes_at_oom") is not None:
            text += f" with {format_bytes(case['free_bytes_at_oom'])} free under the cap"
        return text
    if verdict == "no-kv-room":
        return "does not start: " + case["failure"]
    return f"{verdict}: {case.get('failure')}"


def _kv(case: dict) -> str:
    if case.get("kv_cache_bytes") is None:
        return "n/a"
    return f"{gib(case['kv_cache_bytes']):.3f} GiB ({case['kv_cache_tokens']} tokens)"


def _safe(case: dict) -> str:
    tokens = case.get("max_safe_tokens")
    return "n/a" if tokens is None else ("none" if tokens == 0 else str(tokens))


def _gain(case: dict) -> str:
    gain = case.get("out_staging_gain_bytes")
    return "-" if gain is None else f"+{gib(gain):.3f}"


def _context_cells(c: dict) -> list[str]:
    """Reserve, admission, KV pool and step of one context-reuse variant."""
    cap = c.get("admission_cap_tokens")
    return ["-" if c.get("reserve_bytes") is None else format_bytes(c["reserve_bytes"]),
            "none" if cap is None else str(cap),
            "n/a" if c.get("kv_pool_tokens") is None else str(c["kv_pool_tokens"]),
            f"{len(c.get('admitted', []))} / {len(c.get('trimmed', []))}",
            "n/a" if c.get("attended_tokens") is None else str(c["attended_tokens"])]


_CONTEXT_COLUMNS = ("reserve", "admission cap", "KV pool tokens", "admitted / trimmed",
                    "attended KV")


def _context_table(result: ReproResult) -> Table:
    out = Table(title=f"mlamem repro-oom: {result.scenario['name']}, context-MLA reuse",
                caption="\n".join([_repro_label(result), *_budget_lines(result),
                                   *[f"{case_label(c)}: {verdict_text(c)}"
                                     for c in result.cases], *result.notes]),
                caption_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                padding=(0, 1, 0, 0))
    for name in ("variant", "verdict", *_CONTEXT_COLUMNS):
        out.add_column(name, justify="left" if name in ("variant", "verdict") else "right")
    for c in result.cases:
        out.add_row(c["variant"], c["verdict"].upper() if c["verdict"] == "oom" else c["verdict"],
                    *_context_cells(c))
    return out


def _context_markdown(result: ReproResult) -> str:
    lines = [f"### Context-MLA reuse OOM: {result.scenario['name']}{predicted_tag(result.measured)}",
             "",
             f"{_repro_label(result)}.", ""]
    lines += [f"- {line}" for line in _budget_lines(result)] + [""]
    lines += ["| variant | verdict | " + " | ".join(_CONTEXT_COLUMNS) + " |",
              "|---|---|" + "---|" * len(_CONTEXT_COLUMNS)]
    for c in result.cases:
        lines.append(f"| {case_label(c)} | {verdict_text(c)} | "
                     + " | ".join(_context_cells(c)) + " |")
    lines += [""] + [f"- {note}" for note in result.notes]
    lines.append(f"- Command: `{result.command}`")
    return "\n".join(lines) + "\n"


def repro_table(result: ReproResult) -> Table:
    """One row per path: the verdict, the KV cache the engine chose, the largest safe T."""
    if result.mode == "context-reuse":
        return _context_table(result)
    caption = [_repro_label(result), *_budget_lines(result)]
    caption += [f"{c['path']}: {verdict_text(c)}" for c in result.cases
                if c["verdict"] not in ("fits", "oom")]
    caption += [f"largest safe T ({c['path']}): {c.get('max_safe_method')}"
                for c in result.cases]
    caption += result.notes
    out = Table(title=f"mlamem repro-oom: {result.scenario['name']}; GiB",
                caption="\n".join(caption), caption_justify="left", box=box.SIMPLE_HEAD,
                pad_edge=False, padding=(0, 1, 0, 0))
    for name in ("path", "verdict", "failed\nalloc", "free at\nOOM", "KV\ncache", "head-\nroom",
                 "+if out\nstaged", "max\nsafe T"):
        out.add_column(name, justify="left" if name in ("path", "verdict") else "right",
                       no_wrap=True)
    for c in result.cases:
        out.add_row(c["path"], c["verdict"].upper() if c["verdict"] == "oom" else c["verdict"],
                    "" if c.get("oom_requested_bytes") is None
                    else f"{c.get('oom_buffer') or '?'} {_gib(c['oom_requested_bytes'])}",
                    _gib(c.get("free_bytes_at_oom")) if c["verdict"] == "oom" else "",
                    "n/a" if c.get("kv_cache_bytes") is None else _gib(c["kv_cache_bytes"]),
                    _gib(c.get("headroom_bytes")) if c["verdict"] == "fits" else "",
                    _gain(c), _safe(c))
    return out


def repro_markdown(result: ReproResult) -> str:
    """The reproduction as a PR section: budget, one row per path, how the limit was found."""
    if result.mode == "context-reuse":
        return _context_markdown(result)
    lines = [f"### Runtime OOM reproduction: {result.scenario['name']}{predicted_tag(result.measured)}",
             "",
             f"{_repro_label(result)}.", ""]
    lines += [f"- {line}" for line in _budget_lines(result)] + [""]
    lines += ["| path | verdict | KV cache | headroom | + if out staged | largest safe "
              "max_num_batched_tokens |", "|---|---|---|---|---|---|"]
    for c in result.cases:
        headroom = f"{_gib(c.get('headroom_bytes'))} GiB" if c["verdict"] == "fits" else "-"
        gain = _gain(c) + (" GiB" if c.get("out_staging_gain_bytes") is not None else "")
        lines.append(f"| {c['path']} | {verdict_text(c)} | {_kv(c)} | {headroom} | {gain} | "
                     f"{_safe(c)} |")
    lines += [""] + [f"- {c['path']}: largest safe max_num_batched_tokens by "
                     f"{c.get('max_safe_method')}" for c in result.cases]
    lines += [f"- {note}" for note in result.notes] + [f"- Command: `{result.command}`"]
    return "\n".join(lines) + "\n"


def repro_json(result: ReproResult) -> str:
    return json.dumps(result.to_dict(), indent=2) + "\n"


REPRO_FORMATS = {"table": lambda r: _console_text(repro_table(r)), "markdown": repro_markdown,
                 "json": repro_json}


# mlamem gate

_METRIC_LABELS = {"peak_allocated": "peak allocated", "peak_reserved": "peak reserved",
                  "allocated_in_call": "allocated in call", "buffer": "buffer bytes",
                  "failure": "call"}
_VERDICT_ORDER = {"regressed": 0, "improved": 1, "within tolerance": 2}


def _change_text(c: Change) -> str:
    """'+75497472 B (+72.000 MiB, +25.0%)'; 'new' or 'gone' for a buffer that (dis)appeared."""
    if c.metric == "failure":
        return c.detail
    diff = c.difference_bytes
    if not c.baseline_bytes:
        relative = "new"
    elif not c.current_bytes:
        relative = "gone"
    else:
        relative = f"{100 * diff / c.baseline_bytes:+.2f}%"
    return f"{diff:+d} B ({'+' if diff > 0 else ''}{format_bytes(diff)}, {relative})"


def _tolerance_text(tolerance: Tolerance) -> str:
    """'0 B', '1.000 MiB', '0.5%', or '1.000 MiB or 0.5%'."""
    parts = ([format_bytes(tolerance.bytes)] if tolerance.bytes or not tolerance.fraction else []) + (
        [f"{tolerance.fraction * 100:g}%"] if tolerance.fraction else [])
    return " or ".join(parts)


def _bytes_cell(value: int | None) -> str:
    return "-" if value is None else format_bytes(value)


def gate_markdown(result: GateResult | None, *, baseline: str, measured: bool,
                  updated: bool = False) -> str:
    """The gate's verdict and a table of every figure that moved, for stdout and the CI summary.

    `result` is None after --update when there was no previous baseline to compare with.
    """
    kind = "measured" if measured else "PREDICTED by the allocator model"
    if updated:
        title = "baseline updated"
    elif not result.passed:
        title = f"FAILED, {len(result.regressions)} figure(s) grew beyond the tolerance"
    elif result.improvements:
        title = f"passed, {len(result.improvements)} figure(s) improved"
    else:
        title = "passed"
    lines = [f"### mlamem gate: {title}", ""]
    if updated:
        lines.append(f"Wrote `{baseline}`, figures {kind}." + (
            " Changes from the previous baseline:" if result and result.changes else ""))
    else:
        lines.append(f"This run ({kind}) against `{baseline}`.")
    if result is None:
        return "\n".join(lines) + "\n"
    tolerances = ", ".join(f"{m} {_tolerance_text(t)}" for m, t in result.tolerances.items())
    lines += ["", f"Compared {result.compared_figures} figures over {result.compared_cases} cases "
                  f"(scenario, T, path); tolerances: {tolerances}."]
    if result.changes:
        lines += ["", "| verdict | scenario | T | path | metric | buffer | baseline | now | change |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for c in sorted(result.changes, key=lambda c: _VERDICT_ORDER[c.verdict]):
            lines.append(f"| {c.verdict} | {c.scenario} | {c.tokens} | {c.path} | "
                         f"{_METRIC_LABELS[c.metric]} | {c.buffer or ''} | "
                         f"{_bytes_cell(c.baseline_bytes)} | {_bytes_cell(c.current_bytes)} | "
                         f"{_change_text(c)} |")
    else:
        lines += ["", "Every figure equals the baseline."]
    notes = []
    if result.improvements and not updated:
        notes.append(f"Memory went down beyond the tolerance: update the baseline with "
                     f"`mlamem gate --baseline {baseline} --update` and commit it.")
    if result.regressions and not updated:
        notes.append("If the growth is intended, update the baseline with "
                     f"`mlamem gate --baseline {baseline} --update` in the same commit.")
    for d in result.environment:
        blocking = " (compared anyway: --allow-env-change)" if d.blocking and not updated else ""
        notes.append(f"Environment: {d.name} was {d.baseline}, is {d.current}{blocking}.")
    if result.not_in_baseline:
        notes.append(f"{result.not_in_baseline} case(s) are new in this sweep.")
    if result.not_swept:
        notes.append(f"{result.not_swept} baseline case(s) were not in this sweep and were not "
                     "compared.")
    if notes:
        lines += ["", *(f"- {note}" for note in notes)]
    return "\n".join(lines) + "\n"


# mlamem plan


def _reserve_text(r: dict) -> str:
    if r["admission_cap_tokens"] is None:
        return f"none; pool {r['pool_tokens']} tokens"
    clamped = ", clamped to budget·w/(k+w)" if r["clamped"] else ""
    return (f"{format_bytes(r['reserve_bytes'])}{clamped}; admission cap "
            f"{r['admission_cap_tokens']} tokens; pool {r['pool_tokens']} tokens "
            f"({r['capacity_change_percent']:+.1f}%)")


def plan_rows(plan: dict, scenario: dict) -> list[tuple[str, str]]:
    """(quantity, value) lines of one plan, in reading order."""
    request = plan["request"]
    budget_rule = (f"utilization {request['utilization']} x total - weights"
                   if request["utilization"] is not None else
                   f"free fraction {request['free_fraction']} x (total - weights)")
    rows = [
        ("k: KV bytes per token", f"{plan['k_bytes_per_token']} B ({scenario['num_layers']} "
                                  f"layers x {scenario['kv_bytes_per_token_per_layer']} B, "
                                  f"{scenario['kv_cache_dtype']})"),
        ("w: fp8 staging per attended token", f"{plan['w_bytes_per_token']} B "
                                              f"({scenario['heads_per_rank']} heads x "
                                              "(qk_nope + qk_rope + v_head) x 1 B)"),
        ("BF16 gather per attended token", f"{plan['gather_bytes_per_token']} B (full_kv + "
                                           "full_k, not charged by the PR's reserve)"),
        ("KV budget", f"{format_bytes(plan['budget_bytes'])} ({budget_rule}; weights "
                      f"{format_bytes(plan['weights_bytes'])})"),
        ("L_cap", f"{plan['kv_len_cap_tokens']} tokens (min(max_batch_size "
                  f"{request['max_batch_size']}, max_num_tokens {request['max_num_tokens']}) x "
                  f"max_seq_len {request['max_seq_len']})"),
        ("reserve gate", plan["gate_reason"]),
        ("pool without reserve", f"{plan['pool_tokens_without_reserve']} tokens"),
        ("fp8 reserve (the PR)", _reserve_text(plan["fp8_reserve"])),
        ("everything charged (w + BF16)", _reserve_text(plan["full_reserve"])),
    ]
    vllm = plan.get("vllm")
    if vllm:
        headroom = format_bytes(vllm["headroom_bytes"])
        for path, need in vllm["per_call_need_bytes"].items():
            fits = "fits" if vllm["per_call_fits"][path] else "DOES NOT FIT"
            rows.append((f"vLLM mixed-batch call, {path} path",
                         f"{format_bytes(need)} at {vllm['max_num_batched_tokens']} tokens "
                         f"(allocator model): {fits} the {headroom} headroom"))
        fits = "fits" if vllm["prefill_workspace_fits"] else "DOES NOT FIT"
        rows.append(("vLLM bf16 prefill workspace",
                     f"{format_bytes(vllm['prefill_workspace_bytes'])} (5 x max_model_len x 576 "
                     f"x 2 B): {fits} the {headroom} headroom"))
    return rows


def _sweep_columns(result: dict) -> list[str]:
    columns = ["L_cap", "pool w/o", "fp8 GiB", "fp8 cap", "fp8 Δ", "full GiB", "full cap",
               "full Δ"]
    if result["plans"][0].get("vllm"):
        columns.append("prefill ws")
    return columns


def _sweep_cells(plan: dict) -> list[str]:
    """One sweep row: reserves in GiB, caps in tokens, pool change in percent."""
    cells = [str(plan["kv_len_cap_tokens"]), str(plan["pool_tokens_without_reserve"])]
    for key in ("fp8_reserve", "full_reserve"):
        r = plan[key]
        cells += [f"{gib(r['reserve_bytes']):.3f}", str(r["admission_cap_tokens"] or "-"),
                  f"{r['capacity_change_percent']:+.1f}%"]
    if plan.get("vllm"):
        v = plan["vllm"]
        cells.append(f"{gib(v['prefill_workspace_bytes']):.2f}"
                     + ("" if v["prefill_workspace_fits"] else " NO"))
    return cells


def plan_table(result: dict) -> Table:
    s = result["scenario"]
    title = f"mlamem plan: {s['name']}, one rank"
    if result["sweep"] is None:
        out = Table(title=title, box=box.SIMPLE_HEAD, show_header=False, pad_edge=False,
                    caption=f"Command: {result['command']}", caption_justify="left")
        out.add_column("quantity", no_wrap=True)
        out.add_column("value")
        for name, value in plan_rows(result["plans"][0], s):
            out.add_row(name, value)
        return out
    out = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1, 0, 0),
                caption="\n".join([f"reserve gate {result['plans'][0]['gate_reason']}",
                                   "GiB: reserve size; cap: admission cap in tokens; Δ: KV pool "
                                   "against no reserve; prefill ws: vLLM bf16 prefill workspace, "
                                   "GiB (NO: over the headroom)",
                                   f"Command: {result['command']}"]), caption_justify="left")
    for name in (result["sweep"]["name"], *_sweep_columns(result)):
        out.add_column(name, justify="right", no_wrap=True)
    for value, plan in zip(result["sweep"]["values"], result["plans"], strict=True):
        out.add_row(str(value), *_sweep_cells(plan))
    return out


def plan_markdown(result: dict) -> str:
    s = result["scenario"]
    lines = [f"### KV-cache plan: {s['name']}, one rank", ""]
    if result["sweep"] is None:
        lines += ["| quantity | value |", "|---|---|"]
        lines += [f"| {name} | {value} |" for name, value in plan_rows(result["plans"][0], s)]
    else:
        columns = [result["sweep"]["name"], *_sweep_columns(result)]
        lines += ["| " + " | ".join(columns) + " |", "|---" * len(columns) + "|"]
        for value, plan in zip(result["sweep"]["values"], result["plans"], strict=True):
            lines.append("| " + " | ".join([str(value), *_sweep_cells(plan)]) + " |")
        lines += ["", f"- Reserve gate {result['plans'][0]['gate_reason']}.",
                  "- GiB: reserve size; cap: admission cap in tokens; Δ: KV pool against no "
                  "reserve; prefill ws: vLLM bf16 prefill workspace in GiB."]
    lines += ["", f"- Command: `{result['command']}`"]
    return "\n".join(lines) + "\n"


PLAN_FORMATS = {"table": lambda r: _console_text(plan_table(r)), "markdown": plan_markdown,
                "json": lambda r: json.dumps(r, indent=2) + "\n"}
