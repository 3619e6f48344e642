"""`mlamem graphs`: CUDA-graph pool memory of the sparse decode over a capture list."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from mlamem import render
from mlamem.cli import options as o
from mlamem.cli.app import app
from mlamem.cli.output import (
    check_report_dir,
    command_line,
    emit,
    note_predicted,
    progress,
    write_report,
)
from mlamem.commands.sweep import Request, plan
from mlamem.kernels import DEFAULT_KERNEL
from mlamem.spec.files import check_output_path, pick_format
from mlamem.spec.scenario_names import DEFAULT_SCENARIO


@app.command()
def graphs(
    scenario: o.ScenarioOption = DEFAULT_SCENARIO,
    model: o.ModelOption = None,
    gpu: o.GpuOption = None,
    kernel: o.KernelOption = DEFAULT_KERNEL,
    paths: o.PathsOption = None,
    capture_sizes: o.CaptureSizesOption = None,
    output_format: Annotated[o.Format | None, o.format_option(
        "mlamem.graphs/1", "table, markdown, json", ".txt, .md, .json, .csv", " or csv")] = None,
    output: o.OutputOption = None,
    report_dir: Annotated[Path | None, o.report_option("its plot")] = None,
    predict: o.PredictOption = False,
) -> None:
    """CUDA-graph pool memory of the sparse decode call over an engine's capture list.

    Captures the call at every capture size, largest first, into one shared private pool, as
    vLLM captures its FULL decode graphs, keeping only weak references to each capture's
    outputs. Per capture and path: the peak inside the capture, the pool's growth (allocator
    reserved; measured: also the device-wide growth vLLM reads with mem_get_info) and whether
    the replay equals the eager call bit for bit. Beside it, vLLM's estimate (first capture +
    max(second, 1 MiB) x (N - 1)) with its error. Without a GPU the figures are PREDICTED by
    the allocator model, private pools included.
    """
    sizes = o.parse_sizes(capture_sizes)
    output_format = o.Format(pick_format(output, output_format and output_format.value,
                                         list(o.Format), what="graphs"))
    if output is not None:
        check_output_path(output)
    check_report_dir(report_dir)
    # a bad file, config or GPU name is refused before torch loads
    loaded = o.load_scenario(scenario, o.Changes(model, gpu))
    [part] = plan(Request("graphs", kernel, scenarios=[(scenario, loaded)],
                          paths=o.split_paths(paths), capture_sizes=sizes or []),
                  load=o.make_kernel)  # the kernel (torch) after the checks that need none
    decode = part.kernel
    from mlamem.commands.graphs import run_graphs, sizes_to_capture

    count = len(sizes_to_capture(part.scenario, sizes))
    with progress(f"graphs {part.scenario.name}", count * len(part.paths)) as advance:
        result = run_graphs(
            part.scenario, part.paths, command=command_line(), kernel=decode, sizes=sizes,
            predict=predict, on_capture=lambda path, capture: advance(
                f"{path}: T={capture.tokens} {capture.failure or 'captured'}"))
    note_predicted(result)
    write_report(result, report_dir)
    terminal = render.graphs_table(result) if output_format is o.Format.table else None
    emit(render.GRAPHS_FORMATS[output_format.value](result), output, terminal_table=terminal)
