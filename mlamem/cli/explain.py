"""`mlamem explain`: a PyTorch memory snapshot's peak, what was live at it, and the MLA calls."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mlamem import render
from mlamem.cli import options as o
from mlamem.cli.app import app
from mlamem.cli.output import command_line, emit
from mlamem.commands.explain import explain as explained
from mlamem.commands.explain import load
from mlamem.spec.files import check_distinct, check_output_path, pick_format
from mlamem.spec.scenario_names import DEFAULT_SCENARIO, check_exists


@app.command()
def explain(
    snapshot_file: Annotated[Path, typer.Argument(
        metavar="SNAPSHOT", help="A PyTorch memory snapshot: the pickle "
        "torch.cuda.memory._dump_snapshot writes, or `mlamem profile --snapshot`. Read as "
        "untrusted: plain data only, within a size bound.", show_default=False)],
    scenario: Annotated[str | None, o.scenario_option(
        "each operation at its own default scenario's dimensions "
        f"({DEFAULT_SCENARIO}'s for the sparse ones), at every head count the kernel runs",
        text="The scenario of the calls (a shipped name or a TOML path): their dimensions, and "
             "their head count, which bytes alone do not fix; only the operations it drives are "
             "looked for.")] = None,
    output_format: Annotated[o.ReproFormat | None, o.format_option(
        "mlamem.explain/1", "table (terminal), markdown (for an issue or PR) or json")] = None,
    output: o.OutputOption = None,
) -> None:
    """Explain a memory snapshot: the peak and what was live at it, by frame and by segment;
    the MLA kernel calls in it (matched by their allocations against the kernels' own
    allocation specs, for every operation: sparse decode, dense decode, sparse prefill), the
    operation and rows (T, requests or s_q) and heads they imply, what the workspace path would
    save and the `mlamem profile` command that reproduces each."""
    chosen = pick_format(output, output_format and output_format.value,
                         list(o.ReproFormat), what="explain")
    if output is not None:
        check_distinct({"SNAPSHOT": snapshot_file, "--output": output})
        check_output_path(output)

    source = scenario or DEFAULT_SCENARIO
    check_exists(source)  # an unknown name, then a bad snapshot, before the scenario model loads
    loaded = load(snapshot_file)  # a bad file before torch
    at = o.load_scenario(source)
    o.load_torch()  # the kernels' allocation specs
    doc = explained(snapshot_file, at, source, scenario_given=scenario is not None,
                    command=command_line(), loaded=loaded)
    emit(render.EXPLAIN_FORMATS[chosen](doc), output)
