"""The typer app every command module registers on, and the console for stderr (built on first
use: rich costs a refusal, one plain line, a third of its start-up)."""

from __future__ import annotations

import functools
import os
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from mlamem.version import version_text

if TYPE_CHECKING:
    from rich.console import Console

app = typer.Typer(
    help="GPU memory profiler and OOM reproducer for LLM attention kernels (the MLA kernels "
         "engines ship: FlashMLA's sparse fp8 decode, dense decode and sparse prefill, in "
         "sgl-flash-mla and vLLM's build, and more; `mlamem kernels` lists them). Start with "
         "`mlamem profile --tokens 32768`.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
    rich_markup_mode=None,  # click's plain help: option names are never cut at 80 columns
    context_settings={"help_option_names": ["-h", "--help"]},  # every command inherits it
)


def columns(stream, default: int) -> int:
    """The width for text written to `stream`: COLUMNS where it is a positive number, else the
    terminal's width if `stream` is one, else `default` (COLUMNS=0 or a word is as if unset)."""
    given = os.environ.get("COLUMNS", "")
    if given.isdigit() and int(given) > 0:
        return int(given)
    try:
        return os.get_terminal_size(stream.fileno()).columns or default
    except (OSError, ValueError, AttributeError):  # not a terminal, or no file descriptor
        return default


def _stderr_width() -> int | None:
    """None, rich's own choice (COLUMNS, else the terminal, else 80), except at COLUMNS=0, which
    rich would take as a width of 0, printing nothing."""
    given = os.environ.get("COLUMNS", "")
    return columns(sys.stderr, 80) if given.isdigit() and int(given) == 0 else None


@functools.cache
def stderr() -> Console:
    """The console for stderr's notes and progress bar, built on first use."""
    from rich.console import Console  # here, not at import: see the module's docstring

    console = Console(stderr=True, width=_stderr_width(), markup=False)  # paths, names: text
    console.soft_wrap = not console.is_terminal  # piped, a line stays one line (grep finds it)
    return console


def _show_version(asked: bool) -> None:
    if asked:

        typer.echo(version_text())
        raise typer.Exit(0)


@app.callback()
def _options(version: Annotated[bool, typer.Option(
        "--version", is_eager=True, callback=_show_version,
        help="Show mlamem's version, torch's and the kernel libraries' found (read from their "
             "metadata, importing none), and exit.")] = False) -> None:
    """The app's own options, before the command."""
