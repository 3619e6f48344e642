"""What every command writes: its result (a file or stdout), progress and notes on stderr."""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
from pathlib import Path

from mlamem.cli.app import columns, stderr
from mlamem.render.escape import escaped
from mlamem.spec.files import write_atomic
from mlamem.spec.redaction import redacted_argv


def command_line() -> str:
    """The command as typed, as results record it: its secrets hidden (a `--serve` command's
    --hf-token, HF_TOKEN=..., in any form the engine's parser takes)."""
    return "mlamem " + shlex.join(redacted_argv(sys.argv[1:]))


def emit(text: str, output: Path | None, terminal_table=None) -> None:
    """Write `text` to `output`, else the rich table (fitted to COLUMNS) or `text` to stdout."""
    if output is not None:
        write_atomic(output, text)
        stderr().print(f"mlamem: wrote {output}", highlight=False)
    elif terminal_table is not None:
        from mlamem.render.common import print_fitted

        print_fitted(terminal_table, terminal_width())
    else:
        sys.stdout.write(text)


MIN_WIDTH = 20  # below it no table or entry is drawn narrower: a terminal wraps the lines


def terminal_width(default: int = 80) -> int:
    """The columns stdout's tables get (`app.columns`: COLUMNS, else the terminal's, else
    `default`), MIN_WIDTH at least."""
    return max(MIN_WIDTH, columns(sys.stdout, default))


def note_predicted(result, what: str = "figures") -> None:
    """Say on stderr when a result's figures were predicted, not measured, and that the model
    does not follow PYTORCH_CUDA_ALLOC_CONF where it is set."""
    if result.measured:
        return
    print(f"mlamem: not measured ({result.not_measured_reason}); {what} are PREDICTED by "
          "the allocator model", file=sys.stderr)
    note_allocator_conf()


def note_allocator_conf() -> None:
    """Where PYTORCH_CUDA_ALLOC_CONF is set, say that the allocator model does not follow it."""
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
    if conf:
        print(f"mlamem: note: PYTORCH_CUDA_ALLOC_CONF={conf} is not followed: the allocator "
              "model predicts the default caching allocator", file=sys.stderr)


def check_report_dir(report_dir: Path | None) -> None:
    if report_dir is not None:
        from mlamem.render import report as reporting  # the repro emulation and plots: only for --report

        reporting.check_report_dir(report_dir)


def write_report(result, report_dir: Path | None) -> None:
    """--report: the result JSON, report.md and its plots, into `report_dir`."""
    if report_dir is not None:
        from mlamem.render import report as reporting

        for path in reporting.write_result_report(result, report_dir):
            stderr().print(f"mlamem: wrote {path}", highlight=False)


@contextlib.contextmanager
def progress(title: str, total: int | None):
    """Progress on stderr; yields advance(text), called once per case. On a terminal, a
    transient bar (a spinner if total is None); piped, one plain line per case. Names in the
    title and the descriptions come from files: escaped, and never read as rich markup."""
    title = escaped(title)
    if not stderr().is_terminal:
        done = 0

        def advance(description: str) -> None:
            nonlocal done
            done += 1
            count = f"{done}/{total}" if total is not None else f"{done}"
            print(f"mlamem: {title} [{count}] {escaped(description)}", file=sys.stderr, flush=True)

        yield advance
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=stderr(), transient=True) as bar:
        task = bar.add_task(title, total=total)
        yield lambda description: bar.update(task, advance=1, description=escaped(description))


def append_step_summary(text: str) -> None:
    """Append to the GitHub Actions job summary when $GITHUB_STEP_SUMMARY names a file."""
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if not summary:
        return
    try:
        with open(summary, "a") as handle:
            handle.write(text + "\n")
    except OSError as exc:
        print(f"mlamem: warning: cannot append to $GITHUB_STEP_SUMMARY {summary} "
              f"({exc.strerror})", file=sys.stderr)
