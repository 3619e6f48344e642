"""`mlamem profile`: per-call peak memory of one kernel call, per swept value and path."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from mlamem import operations, render
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
from mlamem.commands import shards
from mlamem.commands.profile import run_profile
from mlamem.commands.sweep import Request, plan
from mlamem.kernels import DEFAULT_KERNEL
from mlamem.runtime import snapshot
from mlamem.spec.errors import UserError
from mlamem.spec.files import check_distinct, check_output_path, pick_format

BenchOption = Annotated[bool, typer.Option(
    help="Also time each measured call: triton's do_bench median, in ms, beside the memory.")]
ProfileFormat = Annotated[o.Format | None, o.format_option(
    "mlamem.profile/1", "table (terminal), markdown (the PR table), json",
    ".txt, .md, .json, .csv", " or csv")]
RequireGpuOption = Annotated[bool, typer.Option(
    help="Fail instead of printing predicted figures when nothing can be measured.")]
BreakdownOption = Annotated[bool, typer.Option(
    help="Show where the bytes go: every buffer allocated inside each call (padded_q, out, "
         "lse, o_accum, ...), who allocated it, and whether it lives at the peak.")]
FramesOption = Annotated[bool, typer.Option(
    help="Record each allocation's Python frame (file:line function, the innermost outside "
         "torch, mlamem and the kernel libraries): the breakdown shows it, and names by it "
         "what no allocation spec names. Costs time per allocation; --snapshot records it "
         "too.")]
SnapshotOption = Annotated[Path | None, typer.Option(
    "--snapshot", parser=o.no_stdout("a snapshot is a binary pickle: give a file "
                                     "path, e.g. --snapshot calls.pickle"),
    help="Also write a PyTorch memory snapshot of the measured calls (a "
         "pickle that opens in https://pytorch.org/memory_viz).")]


@app.command()
def profile(
    tokens: Annotated[str | None, o.tokens_option(o.DECODE_SWEEP)] = None,
    scenario: o.OpScenarioOption = None,
    model: o.ModelOption = None,
    gpu: o.GpuOption = None,
    paths: o.PathsOption = None,
    kernel: o.KernelOption = DEFAULT_KERNEL,
    op: o.OpOption = operations.SPARSE_DECODE,
    requests: o.RequestsOption = None,
    context_len: o.ContextOption = None,
    kv_len: o.KvLenOption = None,
    bench: BenchOption = False,
    output_format: ProfileFormat = None,
    output: o.OutputOption = None,
    require_gpu: RequireGpuOption = False,
    max_num_batched_tokens: Annotated[int | None, o.max_tokens_option("the workspace")] = None,
    predict: o.PredictOption = False,
    breakdown: BreakdownOption = False,
    frames: FramesOption = False,
    snapshot_file: SnapshotOption = None,
    report_dir: Annotated[Path | None, o.report_option("its plots (PNG)")] = None,
    shard: o.ShardOption = None,
) -> None:
    """Per-call peak memory of an MLA kernel call: allocating path vs workspace path.

    The sparse fp8 decode by default; --op dense-decode or sparse-prefill for the others. On a
    GPU where the kernel runs (FlashMLA: Hopper/Blackwell), each (T, path) is measured: torch
    allocator peaks (allocated, reserved), NVML device memory, wall time (--bench: do_bench
    median), and whether every path gives bit-identical out and lse. Without one, the same
    wrapper code runs on the meta device against a model of the caching allocator, and every
    figure is labelled PREDICTED.
    """
    values = o.parse_sweep(op, tokens, requests)
    kv_tokens = o.kv_length(op, context_len, kv_len)
    chosen_shard = o.parse_shard_option(shard)
    _check_options(chosen_shard, report_dir, predict, require_gpu)
    output_format = _check_outputs(output_format, output, snapshot_file, report_dir, breakdown)
    name = scenario or operations.operation(op).default_scenario
    # a bad file, config or GPU name, or a T past int32, is refused before torch loads
    [part] = plan(Request(
        "profile", kernel, scenarios=[(name, lambda: o.load_scenario(name, o.Changes(model, gpu)))],
        ops=[op], values={op: values or list(operations.operation(op).default_sweep)},
        paths=o.split_paths(paths), kv_tokens=kv_tokens,
        max_num_batched_tokens=max_num_batched_tokens, fix=o.RAISE_LIMIT), load=o.make_kernel)
    if require_gpu and not predict and (reason := part.kernel.unavailable_reason()):
        raise UserError(f"--require-gpu: cannot measure ({reason})")
    result, calls = _run(part, chosen_shard, kv_tokens=kv_tokens, bench=bench,
                         require_gpu=require_gpu, predict=predict, snapshot=snapshot_file,
                         frames=frames)
    _emit(result, calls, output_format, output, snapshot_file=snapshot_file,
          report_dir=report_dir, breakdown=breakdown, bench=bench)


def _emit(result, calls: list, output_format: o.Format, output: Path | None, *,
          snapshot_file: Path | None, report_dir: Path | None, breakdown: bool,
          bench: bool) -> None:
    """The result in its format, the snapshot and the report, with their notes."""
    note_predicted(result)
    if bench and not result.measured:
        print("mlamem: note: --bench timed nothing: predicted calls do not run", file=sys.stderr)
    if snapshot_file is not None:
        _write_snapshot(snapshot_file, calls)
    write_report(result, report_dir)
    formats = render.BREAKDOWN_FORMATS if breakdown else render.FORMATS
    terminal = None
    if output_format is o.Format.table:
        terminal = render.breakdown_table(result) if breakdown else render.table(result)
    emit(formats[output_format.value](result), output, terminal_table=terminal)


def _check_options(chosen_shard, report_dir: Path | None, predict: bool,
                   require_gpu: bool) -> None:
    """Options that contradict each other."""
    if chosen_shard is not None and report_dir is not None:
        raise UserError("--report renders a whole sweep, --shard a part of it: drop --report, "
                        "then `mlamem report` the shards' JSON files together")
    if predict and require_gpu:
        raise UserError("--predict and --require-gpu contradict each other (one predicts, the "
                        "other refuses to); give one")


def _write_snapshot(snapshot_file: Path, calls: list) -> None:
    snapshot.write(snapshot_file, calls)
    print(f"mlamem: wrote snapshot {snapshot_file} (open it in https://pytorch.org/memory_viz)",
          file=sys.stderr)


def _check_outputs(output_format: o.Format | None, output: Path | None,
                   snapshot_file: Path | None, report_dir: Path | None,
                   breakdown: bool) -> o.Format:
    """The format and every output path, tried before any work."""
    formats = o.ReproFormat if breakdown else o.Format  # --breakdown writes no CSV
    chosen = o.Format(pick_format(output, output_format and output_format.value, list(formats),
                                  what="profile --breakdown" if breakdown else "profile"))
    if snapshot_file is not None:
        pick_format(snapshot_file, None, ["pickle"], "snapshot", what="--snapshot")
    check_distinct({"--output": output, "--snapshot": snapshot_file})
    for path, field in ((output, "output"), (snapshot_file, "snapshot")):
        if path is not None:
            check_output_path(path, field)
    check_report_dir(report_dir)
    return chosen


def _run(part, chosen_shard, *, kv_tokens, bench, require_gpu, predict, snapshot,
         frames):
    """Profile the part (the shard's values of it), with progress; (result, measured calls)."""
    calls = []
    symbol = operations.operation(part.op).symbol
    name = part.scenario.name
    run_tokens = part.values if chosen_shard is None else chosen_shard.pick(part.values)
    if chosen_shard is not None and not run_tokens:
        print(shards.empty_note(chosen_shard, len(part.values)), file=sys.stderr)
    with progress(f"profiling {name}", len(run_tokens) * len(part.paths)) as advance:
        result = run_profile(
            part.scenario, part.values, part.paths, command=command_line(), kernel=part.kernel,
            require_gpu=require_gpu, predict=predict,
            record_stacks=frames or snapshot is not None,
            on_case=lambda case: advance(f"{name}: {symbol}={case.tokens} {case.path} "
                                         f"{case.failure or 'ok'}"),
            on_calls=calls.extend if snapshot is not None else None, op=part.op,
            kv_tokens=kv_tokens, bench=bench, shard=chosen_shard)
    return result, calls

