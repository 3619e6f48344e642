"""`mlamem scenarios` and `mlamem kernels`: what ships, one entry each."""

from __future__ import annotations

import json
import sys
import textwrap
from enum import StrEnum
from typing import Annotated

import typer

from mlamem.cli.app import app
from mlamem.cli.options import (
    SERVE_GPU,
    Changes,
    EngineVersionOption,
    format_option,
    load_scenario,
    load_served,
    load_torch,
)
from mlamem.cli.output import terminal_width
from mlamem.commands.kernel_list import WIDTH, kernels_json, list_kernels, render_kernels
from mlamem.spec.errors import UserError
from mlamem.spec.gpus import GPUS
from mlamem.spec.scenario_names import shipped_names


class ListFormat(StrEnum):
    table = "table"
    json = "json"


@app.command("scenarios")
def list_scenarios(
    serve: Annotated[str | None, typer.Option(
        "--serve", help="The command that started the server, quoted: `vllm serve MODEL ...` "
        "(vLLM 0.33.0's flags), `trtllm-serve MODEL ...` or `python -m sglang.launch_server "
        "--model-path MODEL ...` (SGLang 0.5.23's flags; `sglang serve` too). Prints the "
        "scenario it makes as TOML; notes (unmodelled flags, CUDA graphs) go to stderr.")] = None,
    model: Annotated[str | None, typer.Option(
        "--model", help="With --serve: the model's Hugging Face config.json, or its folder. "
        "Default: the command's model, a local folder or a shipped model's hub name.")] = None,
    gpu: Annotated[str, typer.Option(
        "--gpu", help=f"With --serve: the GPU by name, one of {', '.join(GPUS)}.")] = SERVE_GPU,
    weights_per_rank: Annotated[str | None, typer.Option(
        "--weights-per-rank", help="With --serve: one rank's weights (e.g. 40GiB), a labelled "
        "override of the count from the model's config.")] = None,
    engine_version: EngineVersionOption = None,
    output_format: Annotated[ListFormat, format_option(
        None, "The listing's format (without --serve): table or json", None)] = ListFormat.table,
) -> None:
    """List the shipped scenarios, one line each; with --serve, print the scenario a serve
    command makes."""
    if serve is None:
        given = [flag for flag, value in (("--model", model), ("--weights-per-rank",
                 weights_per_rank), ("--gpu", None if gpu == SERVE_GPU else gpu),
                 ("--engine-version", engine_version)) if value]
        if given:
            raise UserError(f"{given[0]} applies to --serve; add it")
        _list_shipped(output_format)
        return
    if output_format is not ListFormat.table:
        raise UserError("--format applies to the listing; --serve prints TOML")
    from mlamem.spec.scenario import to_toml

    sys.stdout.write(to_toml(load_served(serve, Changes(model, gpu, weights_per_rank, engine_version))))


def _list_shipped(output_format: ListFormat) -> None:
    if output_format is ListFormat.json:
        rows = [{"name": name, "summary": load_scenario(name).one_line()} for name in shipped_names()]
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return
    width = terminal_width(default=1 << 16)  # piped without COLUMNS: one line each, for grep
    for name in shipped_names():
        typer.echo(_entry(name, load_scenario(name).one_line(), width))


def _entry(name: str, summary: str, width: int) -> str:
    """A scenario's line at `width` columns (COLUMNS): the summary wrapped at its commas' words
    beside the name, or under it where the name leaves too little room, there also between
    the words of a hyphenated name (sparse-decode+sparse-prefill); no word or number cut."""
    indent = 25 if width - 25 >= 30 else 2
    lines = textwrap.wrap(summary, max(width - indent, 1), break_long_words=False,
                          break_on_hyphens=indent == 2)
    if indent == 2:
        return "\n".join([name, *(" " * indent + line for line in lines)])
    return "\n".join([f"{name:24} {lines[0]}", *(" " * indent + line for line in lines[1:])])


class KernelsFormat(StrEnum):
    table = "table"
    json = "json"


@app.command("kernels")
def list_registered_kernels(
    output_format: Annotated[KernelsFormat, format_option(
        "mlamem.kernels/1: docs/commands.md#mlamem-kernels",
        "table (one entry per kernel, wrapped at COLUMNS) or json", None)] = KernelsFormat.table,
) -> None:
    """List the registered kernels, one entry each: per operation what the caller may pass in
    (out, lse, accum) and the query head counts it runs, the installed version, and whether it
    runs here or why not (with the install hint). A * marks capabilities assumed because the
    kernel's library cannot be loaded here."""
    load_torch()  # the adapters import torch

    if output_format is KernelsFormat.json:
        sys.stdout.write(kernels_json(list_kernels()))
    else:
        sys.stdout.write(render_kernels(list_kernels(), width=terminal_width(WIDTH)))
