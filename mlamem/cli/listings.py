"""`mlamem scenarios` and `mlamem kernels`: what ships, one entry each."""

from __future__ import annotations

import sys

import typer

from mlamem.cli.app import app
from mlamem.cli.options import load_scenario, load_torch
from mlamem.scenario_names import shipped_names


@app.command("scenarios")
def list_scenarios() -> None:
    """List the shipped scenarios, one line each."""
    for name in shipped_names():
        typer.echo(f"{name:24} {load_scenario(name).one_line()}")


@app.command("kernels")
def list_registered_kernels() -> None:
    """List the registered kernels, one entry each: per operation what the caller may pass in
    (out, lse, accum) and the query head counts it runs, the installed version, and whether it
    runs here or why not (with the install hint). A * marks capabilities assumed because the
    kernel's library cannot be loaded here."""
    load_torch()  # the adapters import torch
    from mlamem.kernel_list import list_kernels, render_kernels

    sys.stdout.write(render_kernels(list_kernels()))
