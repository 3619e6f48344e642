"""`mlamem scenarios` and `mlamem kernels`: what ships, one entry each."""

from __future__ import annotations

import sys
from enum import StrEnum
from typing import Annotated

import typer

from mlamem.cli.app import app
from mlamem.cli.options import load_scenario, load_torch
from mlamem.cli.output import terminal_width
from mlamem.scenario_names import shipped_names


@app.command("scenarios")
def list_scenarios() -> None:
    """List the shipped scenarios, one line each."""
    for name in shipped_names():
        typer.echo(f"{name:24} {load_scenario(name).one_line()}")


class KernelsFormat(StrEnum):
    table = "table"
    json = "json"


@app.command("kernels")
def list_registered_kernels(
    output_format: Annotated[KernelsFormat, typer.Option(
        "--format", help="table (one entry per kernel, wrapped at COLUMNS) or json (schema "
                         "mlamem.kernels/1: docs/commands.md#mlamem-kernels).")
    ] = KernelsFormat.table,
) -> None:
    """List the registered kernels, one entry each: per operation what the caller may pass in
    (out, lse, accum) and the query head counts it runs, the installed version, and whether it
    runs here or why not (with the install hint). A * marks capabilities assumed because the
    kernel's library cannot be loaded here."""
    load_torch()  # the adapters import torch
    from mlamem.kernel_list import WIDTH, kernels_json, list_kernels, render_kernels

    if output_format is KernelsFormat.json:
        sys.stdout.write(kernels_json(list_kernels()))
    else:
        sys.stdout.write(render_kernels(list_kernels(), width=terminal_width(WIDTH)))
