"""The typer app every command module registers on, and the console for stderr."""

from __future__ import annotations

import typer
from rich.console import Console

app = typer.Typer(
    help="GPU memory profiler and OOM reproducer for LLM attention kernels (the MLA kernels "
         "engines ship: FlashMLA's sparse fp8 decode, dense decode and sparse prefill, in "
         "sgl-flash-mla and vLLM's build, and more; `mlamem kernels` lists them). Start with "
         "`mlamem profile --tokens 32768`.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
    rich_markup_mode=None,  # click's plain help: option names are never cut at 80 columns
)
stderr = Console(stderr=True)
