"""The server log's ledger (`--log`): per case, the log's figure beside mlamem's, the OOM
explained and the command that fits, as a table and as Markdown."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Group

from mlamem.render.common import compact_table, with_notes
from mlamem.render.escape import escaped, markdown_code, markdown_row
from mlamem.spec.units import format_bytes

if TYPE_CHECKING:
    from mlamem.results.ledger import LogPath, ServerLogLedger

HEADERS = ("component", "log", "mlamem", "log - mlamem", "figures from")


def _amount(value: int | None) -> str:
    return "-" if value is None else format_bytes(value)


def _cells(row) -> list[str]:
    log = _amount(row.log_bytes) + (f" (line {row.log_line})" if row.log_line else "")
    return [row.component, log, _amount(row.mlamem_bytes), _amount(row.difference_bytes),
            row.source]


def header_line(ledger: ServerLogLedger) -> str:
    """Which log was read: engine, version, lines, figures and OOM messages; or, without one,
    which public startup log stands in for it."""
    if ledger.stand_in is not None:
        return f"no server log (--log): a public startup log stands in, {ledger.stand_in}"
    engine = ledger.engine or "engine not named by its lines"
    version = f" {ledger.version}" if ledger.version else ""
    return (f"server log {ledger.source}: {engine}{version}, {ledger.lines} lines, "
            f"{len(ledger.figures)} memory figures, {len(ledger.ooms)} OOM messages")


def _derived_on(ledger: ServerLogLedger) -> str:
    if ledger.held_path is None:  # a file written before the path was recorded
        return " (mlamem's free memory at that request less the log's)"
    return f" (derived on the {ledger.held_path} path, the one the server ran)"


def held_line(ledger: ServerLogLedger) -> list[str]:
    """On which path the held memory was derived, and why: the one the user's server ran."""
    if ledger.held_path is None:
        return []
    return [f"held memory derived on the {ledger.held_path} path, the one the server ran "
            f"({ledger.held_path_reason}); every path is predicted with it"]


def oom_lines(path: LogPath, ledger: ServerLogLedger) -> list[str]:
    """The OOM explained for one case, or, without one, the verdict with the memory held at
    startup; and the largest safe values."""
    if not ledger.ooms:
        if path.held_bytes is None:
            return []
        kv = ("" if path.kv_cache_tokens_with_log is None
              else f" and the KV cache {path.kv_cache_tokens_with_log} tokens")
        return [f"{path.case}: the rank held {format_bytes(path.held_bytes)} beyond mlamem's model"
                f" at startup ({path.rows[-1].source}); with it, the verdict is "
                f"{path.verdict_with_log}{kv}", *_safe_lines(path)]
    oom = ledger.ooms[0]
    lines = [f"OOM (line {oom.line_number}): tried {format_bytes(oom.requested_bytes)} with "
             f"{_amount(oom.free_bytes)} free of {_amount(oom.total_bytes)}"]
    if path.held_bytes is None:
        return [*lines, f"{path.case}: no step buffer of {format_bytes(oom.requested_bytes)} at "
                        f"{path.step_tokens} tokens on this path"]
    buffer = (f"{path.failing_buffer} {format_bytes(path.failing_buffer_bytes)}"
              if path.failing_buffer else "no buffer of that size")
    lines.append(f"{path.case}: failing buffer {buffer} at {path.step_tokens} tokens; the rank "
                 f"held {format_bytes(path.held_bytes)} beyond mlamem's model{_derived_on(ledger)}"
                 f"; with it, the verdict is {path.verdict_with_log}")
    return lines + _safe_lines(path)


def _safe_lines(path: LogPath) -> list[str]:
    if path.max_safe_tokens is None:
        return []
    return [f"{path.case}: largest safe step tokens for this rank: {path.max_safe_tokens}"
            + (f"; largest safe {path.fraction_knob}: {path.max_safe_fraction}"
               if path.fraction_knob else "")]


def commands_text(ledger: ServerLogLedger) -> str:
    """Each case's command that fits, one unwrapped line each, ready to paste (a table's notes
    are wrapped, so these follow the table)."""
    return "".join(f"{path.case}: the command that fits:\n{path.command_that_fits}\n"
                   for path in ledger.paths if path.command_that_fits)


def ledger_table(ledger: ServerLogLedger) -> Group:
    """One table per case, each with its OOM lines under it."""
    parts = []
    for path in ledger.paths:
        table = compact_table(f"the ledger, {escaped(path.case)}: {escaped(ledger.source)}")
        for header in HEADERS:
            table.add_column(header, justify="left" if header in ("component", "figures from") else "right",
                             overflow="fold")
        for row in path.rows:
            table.add_row(*map(escaped, _cells(row)))
        parts.append(with_notes(table, [escaped(line) for line in oom_lines(path, ledger)]))
    notes = [header_line(ledger), *held_line(ledger), *ledger.notes]
    return Group(*parts, with_notes(compact_table(""), [escaped(n) for n in notes]))


def ledger_markdown(ledger: ServerLogLedger) -> str:
    """The ledger as a Markdown section: a table per case, the OOM explained, the command."""
    header = header_line(ledger) + (f" ({ledger.stand_in_address})" if ledger.stand_in_address
                                     else "")
    lines = ["#### The server log beside mlamem", "", f"- {escaped(header, markdown=True)}"]
    lines += [f"- {escaped(note, markdown=True)}" for note in [*held_line(ledger), *ledger.notes]]
    for path in ledger.paths:
        lines += ["", f"{escaped(path.case, markdown=True)}:", "", markdown_row(list(HEADERS)),
                  "|" + "---|" * len(HEADERS)]
        lines += [markdown_row(_cells(row)) for row in path.rows]
        explained = oom_lines(path, ledger)
        lines += [""] + [f"- {escaped(line, markdown=True)}" for line in explained]
        if path.command_that_fits:
            lines.append(f"- the command that fits: {markdown_code(path.command_that_fits)}")
    return "\n".join(lines) + "\n"
