"""`mlamem diff`: two results of one kind, or two snapshots, case by case and buffer by buffer."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mlamem import render
from mlamem.cli import options as o
from mlamem.cli.app import app
from mlamem.cli.output import command_line, emit
from mlamem.spec.errors import UserError
from mlamem.spec.files import check_distinct, check_name_length, check_output_path, pick_format
from mlamem.spec.units import parse_bytes


@app.command()
def diff(
    file_a: Annotated[Path, typer.Argument(
        metavar="A", help="The result before: profile, repro-oom or graphs JSON (--format json "
        "--output), or a memory snapshot (.pickle).", show_default=False)],
    file_b: Annotated[Path, typer.Argument(
        metavar="B", help="The result after, of the same kind.", show_default=False)],
    fail_on_growth: Annotated[str | None, typer.Option(
        help="Exit 1 when a case's peak grows by more than this (e.g. 0B, 1MiB): for CI.",
        show_default=False)] = None,
    output_format: Annotated[o.ReproFormat | None, o.format_option(
        "mlamem.diff/1", "table (terminal), markdown (for a pull request) or json")] = None,
    output: o.OutputOption = None,
) -> int:
    """Compare two results: per case the peak in A and in B and its change, and per named buffer
    the bytes in each (between snapshots: an MLA call's buffers by name, others by frame).
    Environments that differ are named as the gate names them. Exits 1 with --fail-on-growth
    when a peak grew by more."""
    chosen = pick_format(output, output_format and output_format.value,
                         list(o.ReproFormat), what="diff")
    limit = None
    if fail_on_growth is not None:
        try:
            limit = parse_bytes(fail_on_growth)
        except ValueError as exc:
            raise UserError(str(exc), field="fail_on_growth") from None
    if output is not None:
        for name, path in (("A", file_a), ("B", file_b)):  # A may be B: a diff of no change
            check_distinct({name: path, "--output": output})
        check_output_path(output)
    for path in (file_a, file_b):
        check_name_length(path)
    snapshots = [p.suffix.lower() in (".pickle", ".pkl") for p in (file_a, file_b)]
    if snapshots[0] != snapshots[1] and file_a.is_file() and file_b.is_file():  # before torch
        what = ("a snapshot", "a result file") if snapshots[0] else ("a result file", "a snapshot")
        raise UserError(f"{file_a} is {what[0]} and {file_b} {what[1]}; compare two of one kind")
    if any(snapshots):
        o.load_torch()
    from mlamem.commands.diff import diff as compared

    doc = compared(file_a, file_b, command=command_line(), fail_on_growth=limit)
    emit(render.DIFF_FORMATS[chosen](doc), output)
    return 1 if doc.failed else 0
