"""`mlamem gate`: the Markdown diff against a baseline, and the baseline file's text."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from mlamem.commands.gate import Change, GateResult, Tolerance
from mlamem.operations import operation
from mlamem.render.escape import escaped, markdown_code, markdown_row
from mlamem.spec.kernel_api import operation_names
from mlamem.spec.units import format_bytes

if TYPE_CHECKING:
    from mlamem.results.baseline import BaselineFile

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


def baseline_json(baseline: BaselineFile) -> str:
    """The baseline file's text, as --update writes it."""
    return json.dumps(baseline.file_dict(), indent=2) + "\n"


def _title(result: GateResult | None, updated: bool) -> str:
    if updated:
        return "baseline updated"
    if not result.passed:
        return f"FAILED, {len(result.regressions)} figure(s) grew beyond the tolerance"
    if result.improvements:
        return f"passed, {len(result.improvements)} figure(s) improved"
    return "passed"


def gate_markdown(result: GateResult | None, *, baseline: str, measured: bool,
                  updated: bool = False, shard: str | None = None) -> str:
    """The gate's verdict and a table of every figure that moved, for stdout and the CI summary.

    `result` is None after --update when there was no previous baseline to compare with;
    `shard` ("I/N") when this run gated one shard of the sweep.
    """
    kind = "measured" if measured else "PREDICTED by the allocator model"
    lines = [f"### mlamem gate: {_title(result, updated)}", ""]
    if updated:
        lines.append(f"Wrote {markdown_code(baseline)}, figures {kind}." + (
            " Changes from the previous baseline:" if result and result.changes else ""))
    else:
        part = f", shard {shard} of the sweep" if shard else ""
        lines.append(f"This run ({kind}{part}) against {markdown_code(baseline)}.")
    if result is None:
        return "\n".join(lines) + "\n"
    tolerances = ", ".join(f"{m} {_tolerance_text(t)}" for m, t in result.tolerances.items())
    lines += ["", f"Compared {result.compared_figures} figures over {result.compared_cases} cases "
                  f"(scenario, operation, swept value, path); tolerances: {tolerances}."]
    lines += _change_tables(result.changes) if result.changes else [
        "", "Every figure equals the baseline."]
    notes = _notes(result, baseline=baseline, updated=updated, shard=shard)
    if notes:
        lines += ["", *(f"- {note}" for note in notes)]
    return "\n".join(lines) + "\n"


def _change_tables(changes: list[Change]) -> list[str]:
    """One table per operation, its swept value under its own symbol, regressions first."""
    lines = []
    for op in [o for o in operation_names() if any(c.op == o for c in changes)]:
        spec = operation(op)
        lines += ["", f"**{op}**: {spec.quantity}", "",
                  f"| verdict | scenario | {spec.symbol} | path | metric | buffer | baseline | "
                  "now | change |", "|---|---|---|---|---|---|---|---|---|"]
        for c in sorted((c for c in changes if c.op == op),
                        key=lambda c: _VERDICT_ORDER[c.verdict]):
            lines.append(markdown_row([
                c.verdict, c.scenario, c.tokens, c.path, _METRIC_LABELS[c.metric],
                c.buffer or "", _bytes_cell(c.baseline_bytes), _bytes_cell(c.current_bytes),
                _change_text(c)]))
    return lines


def _notes(result: GateResult, *, baseline: str, updated: bool, shard: str | None) -> list[str]:
    """What to do next, the environment fields that differ, and the cases not compared."""
    notes = []
    update = markdown_code(f"mlamem gate --baseline {baseline} --update")
    if result.improvements and not updated:
        notes.append(f"Memory went down beyond the tolerance: update the baseline with "
                     f"{update} and commit it.")
    if result.regressions and not updated:
        notes.append(f"If the growth is intended, update the baseline with {update} in the "
                     "same commit.")
    for d in result.environment:
        blocking = " (compared anyway: --allow-env-change)" if d.blocking and not updated else ""
        notes.append(f"Environment: {escaped(d.name, markdown=True)} was "
                     f"{escaped(d.baseline, markdown=True)}, is "
                     f"{escaped(d.current, markdown=True)}{blocking}.")
    if result.not_in_baseline:
        notes.append(f"{result.not_in_baseline} case(s) are new in this sweep.")
    if shard and not result.compared_cases:
        notes.append(f"Shard {shard} holds no case of this sweep (more shards than units): "
                     "nothing to compare.")
    if result.not_swept:
        where = f"this shard ({shard}; the other shards compare theirs)" if shard else "this sweep"
        notes.append(f"{result.not_swept} baseline case(s) were not in {where} and were not "
                     "compared.")
    return notes
