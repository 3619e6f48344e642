"""`mlamem report`: saved results into one Markdown report, with plots."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from mlamem.cli.app import app, stderr
from mlamem.cli.options import stdout_or_path
from mlamem.spec.files import (
    check_distinct,
    check_given_once,
    check_output_path,
    pick_format,
    read_json,
)


@app.command()
def report(
    results: Annotated[list[Path], typer.Argument(
        help="Result files saved by profile, validate, repro-oom or compare with --format json "
             "--output (schemas mlamem.profile/1, mlamem.validate/1, mlamem.repro-oom/1, "
             "mlamem.compare/1).",
        show_default=False)],
    output: Annotated[Path | None, typer.Option(
        parser=stdout_or_path, help="Write the Markdown here and its plots (PNG) next to it, "
        "named after it. Without it (or with -) the Markdown goes to stdout, without plots.")
    ] = None,
) -> None:
    """Combine saved results into one PR-ready Markdown report, with plots.

    The report has the environment each result came from (GPU, driver, torch, kernel versions,
    mlamem, when, and the command that made it), the per-call peak table (T, before, after,
    saved, outputs equal), the per-buffer breakdown at each T, the OOM verdicts with their
    headroom, the validation, and kernel comparisons. Predicted figures are labelled PREDICTED
    on every table and plot. The same inputs give the same bytes, Markdown and PNGs alike.
    """
    check_given_once(results, "result file")
    if output is not None:
        pick_format(output, None, ["markdown"], what="report")
        check_distinct({**{str(path): path for path in results}, "--output": output})
        check_output_path(output)
    documents = [(str(path), read_json(path)) for path in results]  # a bad file first
    from mlamem.render import report as reporting  # the result models (pydantic) and matplotlib; no torch

    saved = reporting.load_all(documents, output)
    built = reporting.build(saved, figure_prefix=None if output is None else output.stem)
    if output is None:
        sys.stdout.write(built.markdown)
        return
    for path in reporting.write(built, output):
        stderr().print(f"mlamem: wrote {path}", highlight=False)
