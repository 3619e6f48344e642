"""`mlamem validate`: measure and predict every case, and compare every byte."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from mlamem import operations, render
from mlamem.cli import options as o
from mlamem.cli.app import app
from mlamem.cli.output import command_line, emit, progress
from mlamem.commands import shards
from mlamem.commands.gate import shard_parts
from mlamem.commands.sweep import Request, plan
from mlamem.commands.validate import DEFAULT_TOKENS as VALIDATE_TOKENS
from mlamem.commands.validate import run_graph_validation, run_validation
from mlamem.kernels import DEFAULT_KERNEL, kernel_operations
from mlamem.runtime import environment
from mlamem.spec.errors import UserError
from mlamem.spec.files import check_output_path, pick_format


@app.command()
def validate(
    scenario: o.ScenariosOption = "all",
    model: o.ModelOption = None,
    gpu: o.GpuOption = None,
    tokens: Annotated[str | None, o.tokens_option(
        f"{','.join(map(str, VALIDATE_TOKENS))} for sparse-decode, each scenario the ones its "
        "max_num_batched_tokens allows")] = None,
    paths: o.PathsOption = None,
    kernel: o.KernelOption = DEFAULT_KERNEL,
    op: Annotated[str | None, o.op_option(
        "Validate this operation only. Default: every operation the kernel runs that each "
        "scenario drives.")] = None,
    requests: o.RequestsOption = None,
    context_len: o.ContextOption = None,
    kv_len: o.KvLenOption = None,
    graphs: Annotated[bool, typer.Option(
        "--graphs", help="Validate CUDA-graph captures instead (as `mlamem graphs` makes them): "
                         "per capture the peak inside and the pool's growth, every buffer, and "
                         "the pool after the whole list, for the sparse decode.")] = False,
    capture_sizes: Annotated[str | None, o.capture_sizes_option(
        "each scenario's own list (`mlamem graphs --help`)", " (with --graphs)")] = None,
    output_format: Annotated[o.ReproFormat | None, o.format_option("mlamem.validate/1")] = None,
    output: o.PlainOutputOption = None,
    shard: o.ShardOption = None,
) -> None:
    """Prove the no-GPU prediction: measure and predict every case, compare every byte.

    For each (scenario, operation, T, path) the call runs on the GPU and on the allocator
    model; every buffer and the totals are compared, allocated and reserved. With --graphs,
    each capture of the CUDA-graph capture list instead. Exits 1 if any figure differs,
    printing the difference in bytes. Needs a GPU where the kernel runs.
    """
    chosen_shard = o.parse_shard_option(shard)
    loaded = o.load_scenarios(scenario, o.Changes(model, gpu))  # refused before torch loads
    if graphs or capture_sizes is not None:
        _validate_graphs(kernel, (loaded, scenario == "all"), paths, capture_sizes, graphs,
                         given={"--tokens": tokens, "--op": op, "--requests": requests,
                                "--context-len": context_len, "--kv-len": kv_len,
                                "--shard": shard},
                         output=output, output_format=output_format)
        return
    values, kv_tokens = _values(op, kernel, tokens, requests, context_len, kv_len)
    output_format = _output_format(output, output_format)
    parts = _plan((loaded, scenario != "all"), op, kernel, values, paths, kv_tokens)
    if chosen_shard is not None:
        units = sum(len(p.values) for p in parts)
        parts = shard_parts(parts, chosen_shard)
        if not any(p.values for p in parts):
            print(shards.empty_note(chosen_shard, units), file=sys.stderr)
    comparisons = _run(parts, kv_tokens)
    _emit_validation(comparisons, command_line(), output, output_format,
                     shard=None if chosen_shard is None else str(chosen_shard))


def _values(op: str | None, kernel: str, tokens: str | None, requests: str | None,
            context_len: int | None, kv_len: int | None) -> tuple[dict, int | None]:
    """The values asked for, per operation (none: each operation's defaults), and the KV
    length; --requests, --context-len and --kv-len need --op."""
    if op is not None:
        swept = o.parse_sweep(op, tokens, requests)
        return {} if swept is None else {op: swept}, o.kv_length(op, context_len, kv_len)
    for flag, value in (("--requests", requests), ("--context-len", context_len),
                        ("--kv-len", kv_len)):
        if value is not None:
            raise UserError(f"{flag} needs --op (it applies to one operation)")
    if tokens is None:
        return {}, None
    swept = o.parse_tokens(tokens)
    return {name: swept for name in kernel_operations(kernel)}, None


def _output_format(output: Path | None, output_format: o.ReproFormat | None) -> o.ReproFormat:
    chosen = o.ReproFormat(pick_format(output, output_format and output_format.value,
                                       list(o.ReproFormat), what="validate"))
    if output is not None:
        check_output_path(output)
    return chosen


def _plan(scenarios: tuple, op: str | None, kernel: str, values: dict, paths: str | None,
          kv_tokens: int | None):
    """The (scenario, operation) parts: the values asked for, run whole, else each
    operation's defaults that each scenario can run. `scenarios`: ((as given, loaded) pairs,
    whether they were named rather than `all`)."""
    chosen, named = scenarios
    return plan(Request(
        "validate", kernel, scenarios=chosen if named else (),
        candidate_scenarios=() if named else chosen, ops=[op] if op else (), values=values,
        defaults={name: list(operations.operation(name).validate_sweep)
                  for name in operations.operation_names()},
        paths=o.split_paths(paths), kv_tokens=kv_tokens, fix=o.DROP_CASE), load=o.make_kernel)


def _run(parts, kv_tokens: int | None) -> list:
    """Validate every part, with progress."""
    comparisons = []
    with progress("validating", sum(len(p.values) * len(p.paths) for p in parts)) as advance:
        for part in parts:
            symbol = operations.operation(part.op).symbol
            comparisons += run_validation(
                [(part.scenario, part.op, part.values)], part.paths, kernel=part.kernel,
                kv_tokens=kv_tokens, on_case=lambda name, t, p, op=part.op, symbol=symbol:
                advance(f"{name} {op}: {symbol}={t} {p}"))
    return comparisons


def _emit_validation(comparisons, command: str, output: Path | None,
                     output_format: o.ReproFormat, shard: str | None = None) -> None:
    """Write validate's result; exit 1 if any figure differs."""
    if output_format is o.ReproFormat.json:  # a saved result records where and when it was made
        text = render.validation_json(comparisons, command, created=environment.now_utc(),
                                      environment=environment.capture(), shard=shard)
    else:
        text = render.VALIDATION_FORMATS[output_format.value](comparisons, command)
    terminal = (render.validation_view(comparisons, command)
                if output_format is o.ReproFormat.table else None)
    emit(text, output, terminal_table=terminal)
    if not all(c.agrees for c in comparisons):
        raise typer.Exit(1)


def _validate_graphs(kernel: str, scenarios: tuple, paths: str | None,
                     capture_sizes: str | None, graphs: bool, *, given: dict,
                     output: Path | None, output_format: o.ReproFormat | None) -> None:
    """`validate --graphs`: see `validate`; `scenarios` is ((as given, loaded) pairs, whether
    --scenario was 'all')."""
    from mlamem.commands.graphs import full_decode_sizes  # pydantic's models: loaded when captures run

    if not graphs:
        raise UserError("--capture-sizes applies to --graphs; add --graphs")
    for flag, value in given.items():
        if value is not None:
            raise UserError(f"{flag} does not apply to --graphs (captures sweep "
                            "--capture-sizes); drop it")
    sizes = o.parse_sizes(capture_sizes)
    output_format = _output_format(output, output_format)
    chosen, every = scenarios
    if every:
        chosen = [(name, s) for name, s in chosen if operations.SPARSE_DECODE in
                  operations.scenario_operations(s) and (sizes or full_decode_sizes(s))]
    parts = plan(Request("validate-graphs", kernel, scenarios=chosen,
                         paths=o.split_paths(paths), capture_sizes=sizes or []),
                 load=o.make_kernel)
    with progress("validating graphs", len(parts) * len(parts[0].paths)) as advance:
        comparisons = run_graph_validation(
            [p.scenario for p in parts], parts[0].paths, parts[0].kernel, sizes,
            on_path=lambda name, path: advance(f"{name}: {path} captured"))
    _emit_validation(comparisons, command_line(), output, output_format)
