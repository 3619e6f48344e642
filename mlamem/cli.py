"""The `mlamem` command line: parse, call the library, render. No logic lives here."""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import os
import shlex
import sys
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

# Imported at start-up: none of these loads torch, pandas or matplotlib, so `--help`,
# `scenarios` and `plan` stay fast. What needs torch is imported in the command that uses it,
# after `load_torch()` (benchmarks/cli_start.py measures this).
from mlamem import environment, operations, render, shards
from mlamem import gate as gating
from mlamem import plan as plans
from mlamem import scenario as scenarios
from mlamem.engines import engine_names
from mlamem.errors import Interrupted, UserError
from mlamem.files import check_distinct, check_output_path, pick_format, read_json, write_atomic
from mlamem.interrupt import Guard
from mlamem.kernels import COMPARED_KERNELS, DEFAULT_KERNEL, REFERENCE_KERNEL, REGISTRY, load_kernel
from mlamem.paths import available_paths, check_paths
from mlamem.profile import DEFAULT_TOKENS, DROP_CASE, check_request, run_profile, runnable_tokens
from mlamem.units import parse_bytes
from mlamem.validate import DEFAULT_TOKENS as VALIDATE_TOKENS
from mlamem.validate import check_sweep, run_validation

if TYPE_CHECKING:
    from mlamem.kernels import SparseDecodeKernel

try:  # typer >= 0.28 vendors click; older typer uses the click package
    from typer._click import exceptions as click_errors
except ImportError:
    from click import exceptions as click_errors

app = typer.Typer(
    help="GPU memory profiler and OOM reproducer for LLM attention kernels (the MLA kernels "
         "engines ship: FlashMLA's sparse fp8 decode, dense decode and sparse prefill, in "
         "sgl-flash-mla and vLLM's build, and more; `mlamem kernels` lists them). Start with "
         "`mlamem profile --tokens 32768`.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
    rich_markup_mode=None,  # click's plain help: option names are never cut at 80 columns
)
stderr = Console(stderr=True)


class Switch(StrEnum):
    on = "on"
    off = "off"


class Format(StrEnum):
    table = "table"
    markdown = "markdown"
    json = "json"
    csv = "csv"


def parse_tokens(text: str, option: str = "--tokens", symbol: str = "T") -> list[int]:
    """'1024,8192' -> [1024, 8192]; every T a positive integer."""
    example = {"--requests": "16,64,256", "--capture-sizes": "512,256,8,1"}.get(
        option, "1024,8192,32768")  # shipped scenarios take these
    values = []
    for item in text.split(","):
        item = item.strip()
        if not item.isdigit() or int(item) <= 0:
            raise UserError(f"{option}: {item!r} is not a positive integer; "
                            f"write e.g. {option} {example}")
        if int(item) in values:
            raise UserError(f"{option}: {symbol}={int(item)} is listed twice; list each "
                            f"{symbol} once")
        values.append(int(item))
    return values


def parse_sweep(op: str, tokens: str | None, requests: str | None) -> list[int] | None:
    """The swept values of `op` from its flag (--requests for dense decode, else --tokens);
    None when not given (each scenario's defaults)."""
    spec = operations.operation(op)
    text, other = (requests, ("--tokens", tokens)) if spec.flag == "--requests" else (
        tokens, ("--requests", requests))
    if other[1] is not None:
        raise UserError(f"{other[0]}: {op} sweeps {spec.quantity}; give {spec.flag} instead")
    return None if text is None else parse_tokens(text, spec.flag, spec.symbol)


def parse_paths(text: str | None, kernel: SparseDecodeKernel, op: str = "sparse-decode",
                kv_format: str | None = None) -> list[str]:
    """'alloc,workspace' -> ['alloc', 'workspace']; None or empty: every path `kernel` supports."""
    paths = [p.strip() for p in (text or "").split(",") if p.strip()]
    twice = next((p for i, p in enumerate(paths) if p in paths[:i]), None)
    if twice is not None:
        raise UserError(f"--paths: {twice} is listed twice; list each path once")
    capabilities = kernel.capabilities(op, kv_format)
    try:
        check_paths(paths, capabilities, kernel.label)
    except UserError as exc:
        raise UserError(f"--paths: {exc}") from None
    return paths or available_paths(capabilities)


def check_kernel_name(name: str | None) -> str | None:
    """--kernel: a registered name, checked against the registry when the command runs, so a
    plug-in kernel registered after this module was imported is a choice too."""
    if name is not None and name not in REGISTRY:
        close = difflib.get_close_matches(name.lower(), list(REGISTRY), n=1)
        hint = f": did you mean {close[0]!r}" if close else ""
        raise typer.BadParameter(f"{name!r} is not one of {', '.join(map(repr, REGISTRY))} "
                                 f"(`mlamem kernels` lists them){hint}")
    return name


KernelName = str  # a REGISTRY name, checked by check_kernel_name


def load_torch() -> None:
    """Import torch (seconds on a small CPU), showing `mlamem: loading torch…` on stderr
    meanwhile when stderr is a terminal. The line is erased once torch is in, so what follows
    (a bad input's one line, the progress bar) stands alone. Piped, nothing is printed: a line
    cannot be taken back there, and input checks that need the kernel may still fail."""
    if "torch" in sys.modules:
        return
    if not stderr.is_terminal:
        import torch  # noqa: F401
        return
    sys.stderr.write("mlamem: loading torch…")
    sys.stderr.flush()
    try:
        import torch  # noqa: F401
    finally:
        sys.stderr.write("\r\x1b[2K")
        sys.stderr.flush()


def make_kernel(name: str) -> SparseDecodeKernel:
    """The registered kernel adapter `name`, instantiated (this loads torch)."""
    load_torch()
    return load_kernel(name)()


ScenarioOption = Annotated[str, typer.Option(
    "--scenario", "-s", help="A shipped scenario name (see `mlamem scenarios`) or a path to "
                             "your own TOML file.")]
_KERNEL_HELP = [f"{name} ({entry.help})" for name, entry in REGISTRY.items()]
_KERNEL_METAVAR = f"<{'|'.join(REGISTRY)}>"  # the kernels registered at start-up
KernelOption = Annotated[KernelName, typer.Option(
    callback=check_kernel_name, metavar=_KERNEL_METAVAR,
    help=f"The kernel: {', '.join(_KERNEL_HELP[:-1])} or {_KERNEL_HELP[-1]}. `mlamem "
         "kernels` lists what each runs and takes, and whether it runs here.")]
PathsOption = Annotated[str | None, typer.Option(
    help="Comma-separated paths: 'alloc' (q padded with new_zeros, kernel allocates out), "
         "'workspace' (q and out staged in buffers reserved up front), 'workspace-full' (q, out, "
         "lse and accumulators staged: nothing allocated in the call; a kernel that takes all "
         "four, see `mlamem kernels`). "
         "Default: every path the kernel supports.")]


OpName = StrEnum("OpName", {name: name for name in operations.OPERATION_TABLE})
OpOption = Annotated[OpName, typer.Option(
    "--op", help="The kernel operation: sparse-decode (sweeps T, --tokens), dense-decode "
                 "(sweeps b requests, --requests, at --context-len) or sparse-prefill (sweeps "
                 "s_q, --tokens, against --kv-len). `mlamem kernels` lists who runs what.")]
RequestsOption = Annotated[str | None, typer.Option(
    help="dense-decode: comma-separated b values, requests per decode step (one query each). "
         "Default: " + ",".join(map(str, operations.OPERATION_TABLE["dense-decode"]
                                    .default_sweep)) + ".", show_default=False)]
ContextOption = Annotated[int | None, typer.Option(
    "--context-len", min=1, help="dense-decode: context tokens of each request. Default: the "
                                 "scenario's decode_context_len.", show_default=False)]
KvLenOption = Annotated[int | None, typer.Option(
    "--kv-len", min=1, help="sparse-prefill: s_kv, the gathered KV tokens the queries index. "
                            "Default: 4 x topk.", show_default=False)]


ShardOption = Annotated[str | None, typer.Option(
    "--shard", metavar="I/N", help="Run shard I of N of the sweep, e.g. 2/4: its units (scenario, "
    "operation, swept value; every path of a value together) dealt round-robin. `mlamem merge` "
    "and `mlamem report` join the shards' JSON into the unsharded result.", show_default=False)]


def parse_shard_option(text: str | None) -> shards.Shard | None:
    """--shard I/N, or None when not given."""
    return None if text is None else shards.parse_shard(text)


def kv_length(op: str, context_len: int | None, kv_len: int | None) -> int | None:
    """The KV length flag that applies to `op`, refusing the one that does not."""
    for flag, value, wanted in (("--context-len", context_len, "dense-decode"),
                                ("--kv-len", kv_len, "sparse-prefill")):
        if value is not None and op != wanted:
            raise UserError(f"{flag} applies to --op {wanted} only; drop it for {op}")
    return context_len or kv_len


@app.command()
def profile(
    tokens: Annotated[str | None, typer.Option(
        help="Comma-separated T values: query tokens per step, the s_q of one decode call "
             "(sparse-prefill: s_q prefill tokens). Default: "
             f"{','.join(map(str, DEFAULT_TOKENS))}.", show_default=False)] = None,
    scenario: Annotated[str | None, typer.Option(
        "--scenario", "-s", help="A shipped scenario name (see `mlamem scenarios`) or a path to "
                                 f"your own TOML file. Default: {scenarios.DEFAULT_SCENARIO} "
                                 "(--op dense-decode: kimi-k2-dense-tp4-dp).",
        show_default=False)] = None,
    paths: PathsOption = None,
    kernel: KernelOption = DEFAULT_KERNEL,
    op: OpOption = OpName["sparse-decode"],
    requests: RequestsOption = None,
    context_len: ContextOption = None,
    kv_len: KvLenOption = None,
    bench: Annotated[bool, typer.Option(
        help="Also time each measured call: triton's do_bench median, in ms, beside the memory.")
    ] = False,
    output_format: Annotated[Format | None, typer.Option(
        "--format", help="table (terminal), markdown (the PR table), json (schema "
                         "mlamem.profile/1) or csv. Default: what --output's extension names "
                         "(.txt, .md, .json, .csv), else table.", show_default=False)] = None,
    output: Annotated[Path | None, typer.Option(
        help="Write to this file instead of stdout (written whole or not at all).")] = None,
    require_gpu: Annotated[bool, typer.Option(
        help="Fail instead of printing predicted figures when nothing can be measured.")
    ] = False,
    max_num_batched_tokens: Annotated[int | None, typer.Option(
        min=1, help="Override the scenario's max_num_batched_tokens (sizes the workspace).")
    ] = None,
    predict: Annotated[bool, typer.Option(
        help="Predict even where a GPU could measure: what a CPU-only machine prints.")
    ] = False,
    breakdown: Annotated[bool, typer.Option(
        help="Show where the bytes go: every buffer allocated inside each call (padded_q, out, "
             "lse, o_accum, ...), who allocated it, and whether it lives at the peak.")
    ] = False,
    snapshot_file: Annotated[Path | None, typer.Option(
        "--snapshot", help="Also write a PyTorch memory snapshot of the measured calls (a "
                           "pickle that opens in https://pytorch.org/memory_viz).")] = None,
    report_dir: Annotated[Path | None, typer.Option(
        "--report", help="Also write a report into this folder (created if needed): the "
                         "result JSON, report.md and its plots (PNG), as `mlamem report` makes.")
    ] = None,
    shard: ShardOption = None,
) -> None:
    """Per-call peak memory of an MLA kernel call: allocating path vs workspace path.

    The sparse fp8 decode by default; --op dense-decode or sparse-prefill for the others. On a
    GPU where the kernel runs (FlashMLA: Hopper/Blackwell), each (T, path) is measured: torch
    allocator peaks (allocated, reserved), NVML device memory, wall time (--bench: do_bench
    median), and whether every path gives bit-identical out and lse. Without one, the same
    wrapper code runs on the meta device against a model of the caching allocator, and every
    figure is labelled PREDICTED.
    """
    op = op.value
    sweep_list = parse_sweep(op, tokens, requests)
    kv_tokens = kv_length(op, context_len, kv_len)
    chosen_shard = parse_shard_option(shard)
    if chosen_shard is not None and report_dir is not None:
        raise UserError("--report renders a whole sweep, --shard a part of it: drop --report, "
                        "then `mlamem report` the shards' JSON files together")
    decode = make_kernel(kernel)
    chosen = scenarios.load(scenario or operations.operation(op).default_scenario)
    operations.check_supported(chosen, op, decode.name, decode.operations)
    kv_format = operations.kv_format(chosen, op)
    token_list = sweep_list or list(operations.operation(op).default_sweep)
    path_list = parse_paths(paths, decode, op, kv_format)
    operations.check_kv_tokens(chosen, op, token_list, kv_tokens)
    if max_num_batched_tokens is not None and op == operations.DENSE_DECODE:
        raise UserError("--max-num-batched-tokens sizes the token workspace of sparse-decode and "
                        "sparse-prefill; dense-decode's holds the scenario's [serving]."
                        "max_batch_size requests: drop it")
    if predict and require_gpu:
        raise UserError("--predict and --require-gpu contradict each other (one predicts, the "
                        "other refuses to); give one")
    formats = render.BREAKDOWN_FORMATS if breakdown else render.FORMATS
    output_format = Format(pick_format(output, output_format and output_format.value,
                                       list(formats),
                                       what="profile --breakdown" if breakdown else "profile"))
    if snapshot_file is not None:
        pick_format(snapshot_file, None, ["pickle"], "--snapshot", what="--snapshot")
    check_distinct({"--output": output, "--snapshot": snapshot_file})
    for path, option in ((output, "--output"), (snapshot_file, "--snapshot")):
        if path is not None:
            check_output_path(path, option)
    if report_dir is not None:
        from mlamem import report as reporting  # the repro emulation and plots: only for --report

        reporting.check_report_dir(report_dir)
    padded_heads = scenarios.check_decode(
        chosen, decode.capabilities(op, kv_format).head_counts, decode.label)
    operations.check_workspace(chosen, op, padded_heads)
    scenarios.check_decode_tokens(
        chosen, padded_heads, token_list, max_tokens=max_num_batched_tokens,
        max_tokens_option=None if max_num_batched_tokens is None else "--max-num-batched-tokens",
        option=operations.operation(op).flag)
    if max_num_batched_tokens is not None:
        chosen = dataclasses.replace(chosen, serving=dataclasses.replace(
            chosen.serving, max_num_batched_tokens=max_num_batched_tokens))
    check_request(chosen, token_list, path_list, decode, op=op)
    reason = None if predict else decode.unavailable_reason()
    if require_gpu and reason is not None:
        raise UserError(f"--require-gpu: cannot measure ({reason})")
    command = "mlamem " + shlex.join(sys.argv[1:])
    calls = []
    symbol = operations.operation(op).symbol
    run_tokens = token_list if chosen_shard is None else chosen_shard.pick(token_list)
    if chosen_shard is not None and not run_tokens:
        print(shards.empty_note(chosen_shard, len(token_list)), file=sys.stderr)
    with _progress(f"profiling {chosen.name}", len(run_tokens) * len(path_list)) as advance:
        result = run_profile(
            chosen, token_list, path_list, command=command, kernel=decode,
            require_gpu=require_gpu, predict=predict, record_stacks=snapshot_file is not None,
            on_case=lambda case: advance(f"{chosen.name}: {symbol}={case.tokens} {case.path} "
                                         f"{case.failure or 'ok'}"),
            on_calls=calls.extend if snapshot_file is not None else None, op=op,
            kv_tokens=kv_tokens, bench=bench, shard=chosen_shard)
    if not result.measured:
        print(f"mlamem: not measured ({result.not_measured_reason}); "
              "figures are PREDICTED by the allocator model", file=sys.stderr)
    if snapshot_file is not None:
        from mlamem import snapshot

        snapshot.write(snapshot_file, calls)
        print(f"mlamem: wrote snapshot {snapshot_file} (open it in https://pytorch.org/memory_viz)",
              file=sys.stderr)
    if report_dir is not None:
        from mlamem import report as reporting

        for path in reporting.write_result_report(result, report_dir):
            stderr.print(f"mlamem: wrote {path}", highlight=False)
    terminal = None
    if output_format is Format.table:
        terminal = render.breakdown_table(result) if breakdown else render.table(result)
    _emit(formats[output_format.value](result), output, terminal_table=terminal)


@app.command()
def validate(
    scenario: Annotated[str, typer.Option(
        "--scenario", "-s", help="Comma-separated scenario names or TOML paths, or 'all' for "
                                 "every shipped scenario.")] = "all",
    tokens: Annotated[str | None, typer.Option(
        help="Comma-separated T values (sparse-prefill: s_q). Default: "
             f"{','.join(map(str, VALIDATE_TOKENS))} for sparse-decode, each scenario the ones "
             "its max_num_batched_tokens allows.")] = None,
    paths: PathsOption = None,
    kernel: KernelOption = DEFAULT_KERNEL,
    op: Annotated[OpName | None, typer.Option(
        "--op", help="Validate this operation only. Default: every operation the kernel runs "
                     "that each scenario drives.", show_default=False)] = None,
    requests: RequestsOption = None,
    context_len: ContextOption = None,
    kv_len: KvLenOption = None,
    graphs: Annotated[bool, typer.Option(
        "--graphs", help="Validate CUDA-graph captures instead (as `mlamem graphs` makes them): "
                         "per capture the peak inside and the pool's growth, every buffer, and "
                         "the pool after the whole list, for the sparse decode.")] = False,
    capture_sizes: Annotated[str | None, typer.Option(
        help="With --graphs: comma-separated capture sizes. Default: each scenario's own list "
             "(`mlamem graphs --help`).", show_default=False)] = None,
    output_format: Annotated[ReproFormat | None, typer.Option(
        "--format", help="table, markdown or json (schema mlamem.validate/1). Default: what "
                         "--output's extension names (.txt, .md, .json), else table.",
        show_default=False)] = None,
    output: Annotated[Path | None, typer.Option(help="Write to this file instead of stdout.")
    ] = None,
    shard: ShardOption = None,
) -> None:
    """Prove the no-GPU prediction: measure and predict every case, compare every byte.

    For each (scenario, operation, T, path) the call runs on the GPU and on the allocator
    model; every buffer and the totals are compared, allocated and reserved. With --graphs,
    each capture of the CUDA-graph capture list instead. Exits 1 if any figure differs,
    printing the difference in bytes. Needs a GPU where the kernel runs.
    """
    chosen_shard = parse_shard_option(shard)
    decode = make_kernel(kernel)
    if graphs or capture_sizes is not None:
        _validate_graphs(decode, scenario, paths, capture_sizes, graphs,
                         given={"--tokens": tokens, "--op": op, "--requests": requests,
                                "--context-len": context_len, "--kv-len": kv_len,
                                "--shard": shard},
                         output=output, output_format=output_format)
        return
    ops = [op.value] if op is not None else list(decode.operations)
    for name in ops:
        if name not in decode.operations:
            raise UserError(f"kernel {decode.name} does not run {name}; it runs "
                            f"{', '.join(decode.operations)}: pick one with --op, or another "
                            "--kernel")
    if op is not None:
        sweep_given = parse_sweep(op.value, tokens, requests)
        kv_tokens = kv_length(op.value, context_len, kv_len)
    else:
        for flag, value in (("--requests", requests), ("--context-len", context_len),
                            ("--kv-len", kv_len)):
            if value is not None:
                raise UserError(f"{flag} needs --op (it applies to one operation)")
        sweep_given = None if tokens is None else parse_tokens(tokens)
        kv_tokens = None
    output_format = ReproFormat(pick_format(output, output_format and output_format.value,
                                            list(render.VALIDATION_FORMATS), what="validate"))
    if output is not None:
        check_output_path(output)
    names = scenarios.shipped_names() if scenario == "all" else scenario.split(",")
    chosen = [scenarios.load(name.strip()) for name in names]
    sweep, path_lists = [], {}
    for s in chosen:
        s_ops = [o for o in ops if o in operations.scenario_operations(s)
                 and operations.reads_cache(decode, s, o)]
        if not s_ops and scenario != "all":
            operations.check_supported(s, ops[0], decode.name, decode.operations)
        for o in s_ops:
            fmt = operations.kv_format(s, o)
            path_list = parse_paths(paths, decode, o, fmt)
            padded_heads = scenarios.check_decode(s, decode.capabilities(o, fmt).head_counts,
                                                  decode.label)
            defaults = VALIDATE_TOKENS if o == "sparse-decode" else (
                operations.operation(o).default_sweep)
            values = (sweep_given if sweep_given is not None
                      else runnable_tokens(s, list(defaults), path_list, o))
            operations.check_kv_tokens(s, o, values, kv_tokens)
            operations.check_workspace(s, o, padded_heads)
            scenarios.check_decode_tokens(s, padded_heads, values if sweep_given else [],
                                          option=operations.operation(o).flag)
            sweep.append((s, o, values))
            path_lists[(s.name, o)] = path_list
    if not sweep:
        raise UserError(f"no chosen scenario drives {', '.join(ops)}; pick another --scenario "
                        "or --op")
    command = "mlamem " + shlex.join(sys.argv[1:])
    for s, o, values in sweep:
        check_sweep([(s, o, values)], path_lists[(s.name, o)], decode)
    if chosen_shard is not None:
        units = sum(len(values) for _, _, values in sweep)
        sweep = [(s, o, values) for (s, o), values in
                 chosen_shard.pick_sweep([((s, o), values) for s, o, values in sweep])]
        if not any(values for _, _, values in sweep):
            print(shards.empty_note(chosen_shard, units), file=sys.stderr)
    total = sum(len(v) * len(path_lists[(s.name, o)]) for s, o, v in sweep)
    comparisons = []
    with _progress("validating", total) as advance:
        for s, o, values in sweep:
            symbol = operations.operation(o).symbol
            comparisons += run_validation(
                [(s, o, values)], path_lists[(s.name, o)], kernel=decode, kv_tokens=kv_tokens,
                on_case=lambda name, t, p, o=o, symbol=symbol: advance(
                    f"{name} {o}: {symbol}={t} {p}"))
    _emit_validation(comparisons, command, output, output_format,
                     shard=None if chosen_shard is None else str(chosen_shard))


def _emit_validation(comparisons, command: str, output: Path | None,
                     output_format: ReproFormat, shard: str | None = None) -> None:
    """Write validate's result; exit 1 if any figure differs."""
    if output_format is ReproFormat.json:  # a saved result records where and when it was made
        text = render.validation_json(comparisons, command, created=environment.now_utc(),
                                      environment=environment.capture(), shard=shard)
    else:
        text = render.VALIDATION_FORMATS[output_format.value](comparisons, command)
    _emit(text, output)
    if not all(c.agrees for c in comparisons):
        raise typer.Exit(1)


def _validate_graphs(decode, scenario: str, paths: str | None, capture_sizes: str | None,
                     graphs: bool, *, given: dict, output: Path | None,
                     output_format: ReproFormat | None) -> None:
    """`validate --graphs`: see `validate`."""
    if not graphs:
        raise UserError("--capture-sizes applies to --graphs; add --graphs")
    for flag, value in given.items():
        if value is not None:
            raise UserError(f"{flag} does not apply to --graphs (captures sweep "
                            "--capture-sizes); drop it")
    from mlamem.graphs import full_decode_sizes
    from mlamem.validate import run_graph_validation

    sizes = None if capture_sizes is None else parse_tokens(capture_sizes, "--capture-sizes")
    output_format = ReproFormat(pick_format(output, output_format and output_format.value,
                                            list(render.VALIDATION_FORMATS), what="validate"))
    if output is not None:
        check_output_path(output)
    names = scenarios.shipped_names() if scenario == "all" else scenario.split(",")
    chosen = [scenarios.load(name.strip()) for name in names]
    if scenario == "all":
        chosen = [s for s in chosen if "sparse-decode" in operations.scenario_operations(s)
                  and (sizes or full_decode_sizes(s.serving))]
    for s in chosen:
        operations.check_supported(s, operations.SPARSE_DECODE, decode.name, decode.operations)
        padded_heads = scenarios.check_decode(s, decode.capabilities().head_counts, decode.label)
        scenarios.check_decode_tokens(s, padded_heads, sizes or [], option="--capture-sizes")
    path_list = parse_paths(paths, decode)
    check_sweep([], path_list, decode)
    command = "mlamem " + shlex.join(sys.argv[1:])
    with _progress("validating graphs", len(chosen) * len(path_list)) as advance:
        comparisons = run_graph_validation(
            chosen, path_list, decode, sizes,
            on_path=lambda name, path: advance(f"{name}: {path} captured"))
    _emit_validation(comparisons, command, output, output_format)


@app.command()
def compare(
    kernels: Annotated[str, typer.Option(
        help="Two comma-separated kernel names to run on the same inputs (`mlamem kernels` "
             "lists them).")] = ",".join(COMPARED_KERNELS),
    op: OpOption = OpName["sparse-decode"],
    tokens: Annotated[str | None, typer.Option(
        help="Comma-separated T values (sparse-prefill: s_q). Default: the operation's sweep.",
        show_default=False)] = None,
    requests: RequestsOption = None,
    context_len: ContextOption = None,
    kv_len: KvLenOption = None,
    scenario: Annotated[str | None, typer.Option(
        "--scenario", "-s", help="A shipped scenario name or a TOML path. Default: the "
                                 "operation's (glm5-fp8-tp8; dense-decode: kimi-k2-dense-tp4-dp).",
        show_default=False)] = None,
    paths: Annotated[str, typer.Option(
        help="Comma-separated wrapper paths both kernels run.")] = "alloc,workspace",
    reference: Annotated[bool, typer.Option(
        help="Also hold each kernel to the plain-torch reference (out relative L2, lse max "
             "abs).")] = True,
    output_format: Annotated[ReproFormat | None, typer.Option(
        "--format", help="table, markdown or json (schema mlamem.compare/1). Default: what "
                         "--output's extension names (.txt, .md, .json), else table.",
        show_default=False)] = None,
    output: Annotated[Path | None, typer.Option(help="Write to this file instead of stdout.")
    ] = None,
) -> None:
    """Run the same inputs through two kernels: are out and lse bit-identical per (T, path)?

    Where they differ, the largest difference, and each kernel's error against the torch
    reference. Needs a GPU where both kernels run. Example: `mlamem compare --op
    sparse-prefill` holds sgl-flash-mla and vLLM's FlashMLA build to the reference.
    """
    from mlamem.compare import check_kernels, run_compare

    names = [n.strip() for n in kernels.split(",") if n.strip()]
    if len(names) != 2 or names[0] == names[1]:
        raise UserError(f"--kernels: give two different kernels, e.g. {','.join(COMPARED_KERNELS)}; "
                        f"got {kernels!r}")
    for name in names:
        if name not in REGISTRY:
            raise UserError(f"--kernels: unknown kernel {name!r}; expected one of "
                            f"{', '.join(REGISTRY)}")
    op = op.value
    values = parse_sweep(op, tokens, requests)
    kv_tokens = kv_length(op, context_len, kv_len)
    output_format = ReproFormat(pick_format(output, output_format and output_format.value,
                                            list(render.COMPARE_FORMATS), what="compare"))
    if output is not None:
        check_output_path(output)
    pair = [make_kernel(name) for name in names]
    chosen = scenarios.load(scenario or operations.operation(op).default_scenario)
    for kernel in pair:
        operations.check_supported(chosen, op, kernel.name, kernel.operations)
    fmt = operations.kv_format(chosen, op)
    path_list = parse_paths(paths, pair[0], op, fmt)
    parse_paths(paths, pair[1], op, fmt)
    values = values or list(operations.operation(op).default_sweep)
    operations.check_kv_tokens(chosen, op, values, kv_tokens)
    flag = operations.operation(op).flag
    for kernel in pair:
        padded = scenarios.check_decode(chosen, kernel.capabilities(op, fmt).head_counts,
                                        kernel.label)
        scenarios.check_decode_tokens(chosen, padded, values, option=flag)
        operations.check_workspace(chosen, op, padded)
        check_request(chosen, values, path_list, kernel, op=op,
                      fix=f"lower {flag} or drop the workspace paths from --paths")
    check_kernels(pair, op)  # needs the GPU: after every input check, before any progress line
    reference_kernel = make_kernel(REFERENCE_KERNEL) if reference else None
    command = "mlamem " + shlex.join(sys.argv[1:])
    symbol = operations.operation(op).symbol
    with _progress(f"comparing {names[0]} and {names[1]}", len(values) * len(path_list)) as advance:
        result = run_compare(chosen, op, values, path_list, pair, command=command,
                             kv_tokens=kv_tokens, reference=reference_kernel,
                             on_case=lambda t, p: advance(f"{symbol}={t} {p}"))
    if result.failure is not None:  # memory.is_out_of_memory said so; the sweep stopped there
        raise UserError(f"compare ran out of GPU memory ({result.failure.text}); "
                        f"drop the largest {symbol} or add --no-reference")
    _emit(render.COMPARE_FORMATS[output_format.value](result), output)


class ReproFormat(StrEnum):
    table = "table"
    markdown = "markdown"
    json = "json"


@app.command("repro-oom")
def repro_oom(
    scenario: ScenarioOption = scenarios.DEFAULT_SCENARIO,
    gpu_memory: Annotated[str | None, typer.Option(
        help="Target GPU memory to emulate, e.g. 80GiB or 81559MiB (default: the scenario's "
             "GPU). Must not exceed the local GPU.")] = None,
    utilization: Annotated[float | None, typer.Option(
        help="The engine's --gpu-memory-utilization, in (0, 1] (default: the scenario's).")
    ] = None,
    max_num_batched_tokens: Annotated[int | None, typer.Option(
        help="Tokens per step (default: the scenario's): sizes the workspace, the profile pass "
             "and the full step.")] = None,
    paths: PathsOption = None,
    kernel: KernelOption = DEFAULT_KERNEL,
    output_format: Annotated[ReproFormat | None, typer.Option(
        "--format", help="table, markdown or json (schema mlamem.repro-oom/1). Default: what "
                         "--output's extension names (.txt, .md, .json), else table.",
        show_default=False)] = None,
    output: Annotated[Path | None, typer.Option(help="Write to this file instead of stdout.")
    ] = None,
    predict: Annotated[bool, typer.Option(
        help="Predict on the allocator model even where a GPU could measure.")] = False,
    engine: Annotated[str | None, typer.Option(
        help=f"The engine to emulate ({', '.join(engine_names())}): one the scenario declares "
             "in `engines` (default: its first).", metavar="NAME", show_default=False)] = None,
    cuda_graphs: Annotated[Switch, typer.Option(
        "--cuda-graphs", help="on: vLLM's CUDA-graph phases too: the graph estimate before KV "
                              "sizing (its two largest FULL decode graphs, extrapolated), then "
                              "every capture after the KV cache, then the step.")
    ] = Switch.off,
    capture_sizes: Annotated[str | None, typer.Option(
        help="With --cuda-graphs on: comma-separated capture sizes. Default: the scenario's "
             "FULL decode graphs (`mlamem graphs --help`).", show_default=False)] = None,
    expect_oom: Annotated[list[str] | None, typer.Option(
        "--expect-oom", help="Exit 1 unless this case (a path; trtllm-context-reuse: a reserve "
                             "variant none, fp8, full) runs out of memory (repeatable).")] = None,
    expect_fit: Annotated[list[str] | None, typer.Option(
        "--expect-fit", help="Exit 1 unless this case (path or variant) fits (repeatable).")
    ] = None,
) -> None:
    """Reproduce a runtime OOM of one engine rank, per path, and show what removes it.

    Emulates the engine in its order on the local GPU. vLLM (--engine vllm): cap memory at the
    target GPU's, count non-torch memory, reserve the workspace (workspace path), place the
    weights, run a profile pass that skips attention, size the KV cache as
    `utilization x total - (init + profile peak + non-torch)`, then run one full step. Each
    case runs in its own process. Prints each path's verdict (fits with its headroom, or the
    allocation that failed and the free bytes), and the largest max_num_batched_tokens that
    fits. Without a GPU the verdicts are PREDICTED.

    TensorRT-LLM with block reuse (--engine trtllm-context-reuse, kimi-k2-context-reuse's
    default) reproduces the context-MLA reuse OOM instead, three ways: no reserve, the fp8-only
    reserve (TRT-LLM PR #16399) and plan's everything-charged reserve with its admission cap.
    Exits 0 whatever the verdict, unless --expect-oom/--expect-fit says otherwise.
    """
    decode = make_kernel(kernel)
    if "sparse-decode" not in decode.operations:
        raise UserError(f"repro-oom replays the engine's sparse decode step; kernel {decode.name} "
                        f"runs {', '.join(decode.operations)}: pick a --kernel that runs "
                        "sparse-decode (`mlamem kernels`)")
    from mlamem.repro import check_target, run_repro, scenario_engine  # torch: after make_kernel

    path_list = parse_paths(paths, decode)
    output_format = ReproFormat(pick_format(output, output_format and output_format.value,
                                            list(render.REPRO_FORMATS), what="repro-oom"))
    both = sorted(set(expect_oom or []) & set(expect_fit or []))
    if both:
        raise UserError(f"--expect-oom and --expect-fit both name {both[0]}; a case cannot both "
                        "run out of memory and fit: give it to one")
    if output is not None:
        check_output_path(output)
    chosen = scenarios.load(scenario)
    if "sparse-decode" not in operations.scenario_operations(chosen):
        raise UserError(f"repro-oom replays the engine's sparse decode step; {chosen.name} "
                        f"drives {', '.join(operations.scenario_operations(chosen))}: pick a "
                        "sparse-decode scenario (see `mlamem scenarios`)")
    emulated = scenario_engine(chosen, engine)
    cases = emulated.case_keys(path_list)
    for option, wanted in (("--expect-oom", expect_oom), ("--expect-fit", expect_fit)):
        for name in wanted or []:
            if name not in cases:
                raise UserError(f"{option} {name}: not among the {emulated.view.cases_named} "
                                f"{','.join(cases)}")
    try:
        memory_bytes = chosen.gpu.memory_bytes if gpu_memory is None else parse_bytes(gpu_memory)
    except ValueError as exc:
        raise UserError(f"--gpu-memory: {exc}") from None
    graphs_on = cuda_graphs is Switch.on
    sizes = None if capture_sizes is None else parse_tokens(capture_sizes, "--capture-sizes")
    if sizes is not None and not graphs_on:
        raise UserError("--capture-sizes applies to --cuda-graphs on; add it")
    if graphs_on and not emulated.captures_graphs:
        raise UserError(f"--cuda-graphs on: the {emulated.name} emulation has no CUDA-graph "
                        "phases; use --engine vllm")
    budget = emulated.make_budget(
        gpu_memory_bytes=memory_bytes,
        utilization=chosen.gpu.gpu_memory_utilization if utilization is None else utilization,
        max_num_batched_tokens=(chosen.serving.max_num_batched_tokens
                                if max_num_batched_tokens is None else max_num_batched_tokens),
        cuda_graphs=graphs_on, capture_sizes=None if sizes is None else tuple(sizes))
    if graphs_on:
        from mlamem.graphs import sizes_to_capture

        sizes_to_capture(dataclasses.replace(chosen, serving=dataclasses.replace(
            chosen.serving, max_num_batched_tokens=budget.max_num_batched_tokens)), sizes)
    padded_heads = scenarios.check_decode(chosen, decode.capabilities().head_counts, decode.label)
    scenarios.check_decode_tokens(
        chosen, padded_heads, [], max_tokens=budget.max_num_batched_tokens,
        max_tokens_option=None if max_num_batched_tokens is None else "--max-num-batched-tokens")
    check_target(budget, decode, predict)
    command = "mlamem " + shlex.join(sys.argv[1:])
    with _progress(f"repro-oom {chosen.name}", None) as advance:
        result = run_repro(chosen, budget, path_list, command=command, kernel=decode,
                           predict=predict, engine=emulated.name, on_progress=advance)
    if not result.measured:
        print(f"mlamem: not measured ({result.not_measured_reason}); verdicts are PREDICTED by "
              "the allocator model", file=sys.stderr)
    terminal = render.repro_table(result) if output_format is ReproFormat.table else None
    _emit(render.REPRO_FORMATS[output_format.value](result), output, terminal_table=terminal)
    verdicts = {c[emulated.case_type.key_field]: c["verdict"] for c in result.cases}
    unmet = [f"{p} was expected to OOM but {verdicts[p]}" for p in expect_oom or []
             if verdicts[p] != "oom"]
    unmet += [f"{p} was expected to fit but {verdicts[p]}" for p in expect_fit or []
              if verdicts[p] != "fits"]
    if unmet:
        print(f"mlamem: {'; '.join(unmet)}", file=sys.stderr)
        raise typer.Exit(1)


@app.command()
def report(
    results: Annotated[list[Path], typer.Argument(
        help="Result files saved by profile, validate, repro-oom or compare with --format json "
             "--output (schemas mlamem.profile/1, mlamem.validate/1, mlamem.repro-oom/1, "
             "mlamem.compare/1).",
        show_default=False)],
    output: Annotated[Path | None, typer.Option(
        help="Write the Markdown here and its plots (PNG) next to it, named after it. Without "
             "it the Markdown goes to stdout, without plots.")] = None,
) -> None:
    """Combine saved results into one PR-ready Markdown report, with plots.

    The report has the environment each result came from (GPU, driver, torch, kernel versions,
    mlamem, when, and the command that made it), the per-call peak table (T, before, after,
    saved, outputs equal), the per-buffer breakdown at each T, the OOM verdicts with their
    headroom, the validation, and kernel comparisons. Predicted figures are labelled PREDICTED
    on every table and plot. The same inputs give the same bytes, Markdown and PNGs alike.
    """
    load_torch()  # reading saved results loads the profiler and the repro emulation
    from mlamem import report as reporting

    if output is not None:
        pick_format(output, None, ["markdown"], what="report")
        check_distinct({**{str(path): path for path in results}, "--output": output})
        check_output_path(output)
    saved = reporting.load_all(results, output)
    built = reporting.build(saved, figure_prefix=None if output is None else output.stem)
    if output is None:
        sys.stdout.write(built.markdown)
        return
    for path in reporting.write(built, output):
        stderr.print(f"mlamem: wrote {path}", highlight=False)


@app.command()
def merge(
    shard_files: Annotated[list[Path], typer.Argument(
        help="The JSON files of one sweep's shards, all N of them (profile or validate "
             "--shard I/N --format json --output), in any order.", show_default=False)],
    output: Annotated[Path | None, typer.Option(
        help="Write the merged JSON here instead of stdout (written whole or not at all).")
    ] = None,
) -> None:
    """Join the shards of one sharded sweep into the result the unsharded sweep writes.

    Every figure is as the shards measured it, the units (scenario, operation, swept value) in
    the sweep's order. The fields that differ per run are normalised (README: Sharded sweeps):
    the command is the sweep's (--shard and --output dropped), created the latest shard's.
    Mixed schemas, a missing or repeated shard, or shards of different sweeps: one line, exit 2.
    """
    if output is not None:
        pick_format(output, None, ["json"], what="merge")
        check_distinct({**{str(path): path for path in shard_files}, "--output": output})
        check_output_path(output)
    documents = [(str(path), read_json(path)) for path in shard_files]
    _emit(shards.merged_json(documents), output)


@app.command()
def gate(
    baseline: Annotated[Path, typer.Option(
        help="The baseline file (JSON schema mlamem.baseline/1); --update writes it.")],
    scenario: Annotated[str | None, typer.Option(
        "--scenario", "-s", help="Comma-separated scenario names or TOML paths, or 'all' for every "
                                 "shipped scenario. Default: the baseline's (all for a new one).")
    ] = None,
    op: Annotated[OpName | None, typer.Option(
        "--op", help="Gate this operation only. Default: the baseline's operations; with "
                     "--update, every operation the kernel runs that each scenario declares.",
        show_default=False)] = None,
    tokens: Annotated[str | None, typer.Option(
        help="Comma-separated T values (sparse-decode) and s_q values (sparse-prefill). Default: "
             f"the baseline's ({','.join(map(str, DEFAULT_TOKENS))} for a new one), each "
             "scenario the ones its max_num_batched_tokens allows.", show_default=False)] = None,
    requests: Annotated[str | None, typer.Option(
        help="dense-decode: comma-separated b values, requests per decode step. Default: the "
             "baseline's (" + ",".join(map(str, operations.OPERATION_TABLE["dense-decode"]
                                             .default_sweep)) + " for a new one).",
        show_default=False)] = None,
    paths: Annotated[str | None, typer.Option(
        help="Comma-separated paths. Default: the baseline's (every path the kernel supports "
             "for a new one).")] = None,
    kernel: Annotated[KernelName | None, typer.Option(
        callback=check_kernel_name, metavar=_KERNEL_METAVAR,
        help=f"The kernel ({', '.join(REGISTRY)}). Default: the baseline's "
             f"({gating.DEFAULT_KERNEL} for a new one).", show_default=False)] = None,
    tolerance: Annotated[str | None, typer.Option(
        help="Growth that still passes: 0 (byte-exact), 1MiB, 0.5%, or per metric, e.g. "
             "peak_reserved=2MiB,buffer=0 (metrics: " + ", ".join(gating.METRICS) + "). "
             "Default: 0, byte-exact, for predicted and measured baselines alike (measured "
             "figures do not move between runs: reports/baselines/noise-h200.md).")
    ] = None,
    update: Annotated[bool, typer.Option(
        help="Write this run's figures as the new baseline (atomically), showing what changed.")
    ] = False,
    allow_env_change: Annotated[bool, typer.Option(
        help="Compare even across a different GPU architecture, kernel version, or measured "
             "against predicted.")] = False,
    predict: Annotated[bool, typer.Option(
        help="Predict even where a GPU could measure (to gate against a predicted baseline).")
    ] = False,
    shard: Annotated[str | None, typer.Option(
        "--shard", metavar="I/N", help="Gate shard I of N of the sweep, e.g. 2/4 (its units "
        "dealt as profile --shard deals them): compare only its cases and exit by them, so CI "
        "passes when every shard passes. Not with --update.", show_default=False)] = None,
) -> None:
    """Fail CI when per-call memory grows: compare a profile sweep with a baseline file.

    Every (scenario, operation, swept value, path) of the sweep is measured on a GPU (predicted
    without one) and its peak allocated, peak reserved, bytes allocated inside the call and
    per-buffer bytes are compared with the baseline. Without flags the baseline's own sweep
    (kernel, scenarios, operations, values, paths) runs again. Exits 1 if any grew beyond the
    tolerance, 0 otherwise (an improvement says to update the baseline), 2 on bad input or a
    baseline from a different environment. Prints a Markdown diff, also appended to
    $GITHUB_STEP_SUMMARY when set.
    """
    from mlamem.paths import PATH_NAMES

    for flag, given in (("--tolerance", tolerance is not None),
                        ("--allow-env-change", allow_env_change)):
        if update and given:
            raise UserError(f"{flag} has no effect with --update, which writes this run's "
                            "figures whatever they are; drop one of them")
    overrides = gating.parse_tolerances(tolerance) if tolerance is not None else {}
    chosen_shard = parse_shard_option(shard)
    if update and chosen_shard is not None:
        raise UserError("--update writes the whole sweep's baseline, --shard gates a part of it: "
                        "drop --shard to update")
    if op is not None:  # --tokens or --requests, whichever the operation sweeps
        swept = parse_sweep(op.value, tokens, requests)
        values_given = {} if swept is None else {operations.operation(op.value).flag: swept}
    else:
        values_given = {flag: parse_tokens(text, flag, symbol) for flag, text, symbol in (
            ("--tokens", tokens, "T"), ("--requests", requests, "b")) if text is not None}
    if update:  # a new baseline's folder is created, as in `--baseline ci/mlamem.json --update`
        pick_format(baseline, None, ["json"], "--baseline", what="--baseline")
        check_output_path(baseline, "--baseline", parents=True)
    previous, unreadable = None, None
    if not update or baseline.exists():
        try:
            previous = gating.load(baseline)
        except UserError as exc:
            if not update:
                raise
            unreadable = exc  # said once every input is checked
    # Defaults: the baseline's own sweep; for a new baseline, every shipped scenario, each
    # operation's default values and every path the kernel has.
    recorded = previous.sweep if previous else None
    decode = make_kernel(kernel if kernel is not None else gating.sweep_kernel(recorded or {}))
    if op is not None:
        ops = [op.value]
    elif update:  # every operation the kernel runs; each scenario keeps those it declares
        ops = list(decode.operations)
    else:
        ops = gating.sweep_ops(recorded)
    values = {o: values_given.get(spec.flag) or gating.sweep_values(recorded, o)
              for o, spec in operations.OPERATION_TABLE.items()}
    if paths is not None:  # split, and refuse an unknown or repeated path
        path_list = parse_paths(paths, decode, decode.operations[0])
    else:
        path_list = list(recorded["paths"] if recorded else PATH_NAMES)
    names = recorded["scenarios"] if recorded else scenarios.shipped_names()
    if scenario == "all":
        names = scenarios.shipped_names()
    elif scenario is not None:
        names = [n.strip() for n in scenario.split(",")]
    parts = gating.plan_sweep(
        [(name, scenarios.load(name)) for name in names], ops, values, path_list, decode,
        op_given=op is not None, named=scenario not in (None, "all"),
        values_given=list(values_given), paths_given=paths is not None, fix=DROP_CASE)
    if chosen_shard is not None:
        units = sum(len(p.values) for p in parts)
        parts = gating.shard_parts(parts, chosen_shard)
        if not any(p.values for p in parts):
            print(shards.empty_note(chosen_shard, units, "it compares nothing and passes"),
                  file=sys.stderr)
    if not update:
        gating.check_covered(previous, parts)
    if previous and not update and not allow_env_change:  # this machine against the baseline's
        reason = "--predict was given" if predict else decode.unavailable_reason()
        here = dataclasses.replace(
            previous, measured=reason is None, sweep={**previous.sweep, "kernel": decode.name},
            environment=dataclasses.asdict(environment.capture()))
        gating.check_comparable(gating.environment_differences(previous, here), baseline)
    if unreadable is not None:
        print(f"mlamem: replacing an unreadable baseline ({unreadable.worded('--baseline')})",
              file=sys.stderr)
    command = "mlamem " + shlex.join(sys.argv[1:])
    total = sum(len(p.values) * len(p.paths) for p in parts)
    with _progress("gate", total) as advance:
        current = gating.run_sweep(
            parts, gating.sweep_record(parts, values, decode.name), command=command,
            kernel=decode, predict=predict,
            on_case=lambda name, o, case: advance(
                f"{name} {o}: {operations.operation(o).symbol}={case.tokens} {case.path} "
                f"{case.failure or 'ok'}"))
    if previous and not update and not allow_env_change:
        gating.check_comparable(gating.environment_differences(previous, current), baseline)
    if not current.measured:
        print(f"mlamem: not measured ({current.not_measured_reason}); figures are PREDICTED by "
              "the allocator model", file=sys.stderr)
    tolerances = {**gating.default_tolerances(), **overrides}
    result = None if previous is None else gating.compare(previous, current, tolerances)
    if update:
        write_atomic(baseline, current.to_json(), "--baseline", parents=True)
    text = render.gate_markdown(result, baseline=str(baseline), measured=current.measured,
                                updated=update,
                                shard=None if chosen_shard is None else str(chosen_shard))
    sys.stdout.write(text)
    _append_step_summary(text)
    if result is not None and not update and not result.passed:
        raise typer.Exit(1)


def _append_step_summary(text: str) -> None:
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


@app.command()
def plan(
    scenario: ScenarioOption = scenarios.DEFAULT_SCENARIO,
    gpu_memory: Annotated[str | None, typer.Option(
        help="GPU memory, e.g. 141GB or 80GiB (default: the scenario's GPU).")] = None,
    utilization: Annotated[float | None, typer.Option(
        help="vLLM-style budget: utilization x total - weights (default: the scenario's).")
    ] = None,
    free_fraction: Annotated[float | None, typer.Option(
        help="TRT-LLM-style budget: free_gpu_memory_fraction x (total - weights).")] = None,
    max_num_tokens: Annotated[int | None, typer.Option(
        help="Tokens per step (default: the scenario's max_num_batched_tokens).")] = None,
    max_batch_size: Annotated[int | None, typer.Option(help="Requests per step.")] = None,
    max_seq_len: Annotated[int | None, typer.Option(
        help="Longest sequence (vLLM max_model_len).")] = None,
    block_reuse: Annotated[bool | None, typer.Option(
        "--block-reuse/--no-block-reuse", help="Prefix (KV block) reuse.")] = None,
    chunked_prefill: Annotated[bool | None, typer.Option(
        "--chunked-prefill/--no-chunked-prefill", help="Chunked prefill.")] = None,
    kernel: Annotated[KernelName, typer.Option(
        callback=check_kernel_name, metavar=_KERNEL_METAVAR,
        help="The sparse decode kernel of the vLLM side's per-call need (sparse scenarios), "
             "e.g. flashmla-vllm, vLLM's own build, which stages out.")] = DEFAULT_KERNEL,
    sweep: Annotated[str | None, typer.Option(
        help="One variable over several values, as a table: e.g. "
             "max-seq-len=32768,131072,786432 (also max-batch-size, max-num-tokens, "
             "gpu-memory, utilization, free-fraction).")] = None,
    output_format: Annotated[ReproFormat | None, typer.Option(
        "--format", help="table, markdown or json (schema mlamem.plan/1). Default: what "
                         "--output's extension names (.txt, .md, .json), else table.",
        show_default=False)] = None,
    output: Annotated[Path | None, typer.Option(help="Write to this file instead of stdout.")
    ] = None,
) -> None:
    """KV-cache capacity for one rank, with the fp8 context-MLA workspace reserve.

    Prints k (KV bytes per token), w (fp8 context-MLA staging per attended token), the BF16
    reuse-path gather the reserve leaves uncharged, L_cap, the reserve and admission cap, and
    the KV pool with and without it (TensorRT-LLM PR #16399), with the gate's decision. For
    sparse scenarios it adds the vLLM side: the mixed-batch per-call need at max_num_tokens and
    the bf16 prefill workspace, against the headroom the engine leaves. Pure arithmetic: no GPU.
    """
    output_format = ReproFormat(pick_format(output, output_format and output_format.value,
                                            list(render.PLAN_FORMATS), what="plan"))
    given = {"gpu-memory": gpu_memory, "utilization": utilization, "free-fraction": free_fraction,
             "max-num-tokens": max_num_tokens, "max-batch-size": max_batch_size,
             "max-seq-len": max_seq_len}
    swept = (sweep or "").partition("=")[0].strip()
    if given.get(swept) is not None:
        raise UserError(f"--sweep varies {swept}, and --{swept} {given[swept]} sets it too; "
                        "drop one of them")
    if output is not None:
        check_output_path(output)
    chosen = scenarios.load(scenario)
    try:
        memory_bytes = None if gpu_memory is None else parse_bytes(gpu_memory)
    except ValueError as exc:
        raise UserError(f"--gpu-memory: {exc}") from None
    overrides = dict(gpu_memory_bytes=memory_bytes, utilization=utilization,
                     free_fraction=free_fraction, max_num_tokens=max_num_tokens,
                     max_batch_size=max_batch_size, max_seq_len=max_seq_len,
                     block_reuse=block_reuse, chunked_prefill=chunked_prefill)
    if chosen.model.index_topk:  # sparse: the vLLM side runs the allocator model
        load_torch()
    result = plans.run_plan(chosen, overrides, sweep, command="mlamem " + shlex.join(sys.argv[1:]),
                            kernel=kernel)
    terminal = render.plan_table(result) if output_format is ReproFormat.table else None
    _emit(render.PLAN_FORMATS[output_format.value](result), output, terminal_table=terminal)


@app.command()
def graphs(
    scenario: ScenarioOption = scenarios.DEFAULT_SCENARIO,
    kernel: KernelOption = DEFAULT_KERNEL,
    paths: PathsOption = None,
    capture_sizes: Annotated[str | None, typer.Option(
        help="Comma-separated capture sizes (tokens per graph), e.g. 512,256,8,1. Default: the "
             "FULL decode graphs vLLM 0.33.0 captures for the scenario's [serving] "
             "max_num_seqs, max_cudagraph_capture_size, cudagraph_mode and "
             "num_speculative_tokens (51 sizes, 512 down to 1, at the defaults).",
        show_default=False)] = None,
    output_format: Annotated[Format | None, typer.Option(
        "--format", help="table, markdown, json (schema mlamem.graphs/1) or csv. Default: what "
                         "--output's extension names (.txt, .md, .json, .csv), else table.",
        show_default=False)] = None,
    output: Annotated[Path | None, typer.Option(
        help="Write to this file instead of stdout (written whole or not at all).")] = None,
    report_dir: Annotated[Path | None, typer.Option(
        "--report", help="Also write a report into this folder (created if needed): the "
                         "result JSON, report.md and its plot, as `mlamem report` makes.")
    ] = None,
    predict: Annotated[bool, typer.Option(
        help="Predict even where a GPU could measure: what a CPU-only machine prints.")
    ] = False,
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
    decode = make_kernel(kernel)
    if operations.SPARSE_DECODE not in decode.operations:
        raise UserError(f"graphs captures the sparse decode; kernel {decode.name} runs "
                        f"{', '.join(decode.operations)}: pick a --kernel that runs sparse-decode "
                        "(`mlamem kernels`)")
    chosen = scenarios.load(scenario)
    if operations.SPARSE_DECODE not in operations.scenario_operations(chosen):
        raise UserError(f"graphs captures the sparse decode; {chosen.name} drives "
                        f"{', '.join(operations.scenario_operations(chosen))}: pick a "
                        "sparse-decode scenario (see `mlamem scenarios`)")
    path_list = parse_paths(paths, decode)
    sizes = None if capture_sizes is None else parse_tokens(capture_sizes, "--capture-sizes")
    output_format = Format(pick_format(output, output_format and output_format.value,
                                       list(render.GRAPHS_FORMATS), what="graphs"))
    if output is not None:
        check_output_path(output)
    if report_dir is not None:
        from mlamem import report as reporting

        reporting.check_report_dir(report_dir)
    padded_heads = scenarios.check_decode(chosen, decode.capabilities().head_counts, decode.label)
    scenarios.check_decode_tokens(chosen, padded_heads, sizes or [], option="--capture-sizes")
    from mlamem.graphs import run_graphs, sizes_to_capture

    count = len(sizes_to_capture(chosen, sizes))
    with _progress(f"graphs {chosen.name}", count * len(path_list)) as advance:
        result = run_graphs(
            chosen, path_list, command="mlamem " + shlex.join(sys.argv[1:]), kernel=decode,
            sizes=sizes, predict=predict,
            on_capture=lambda path, capture: advance(
                f"{path}: T={capture.tokens} {capture.failure or 'captured'}"))
    if not result.measured:
        print(f"mlamem: not measured ({result.not_measured_reason}); figures are PREDICTED by "
              "the allocator model", file=sys.stderr)
    if report_dir is not None:
        from mlamem import report as reporting

        for path in reporting.write_result_report(result, report_dir):
            stderr.print(f"mlamem: wrote {path}", highlight=False)
    terminal = render.graphs_table(result) if output_format is Format.table else None
    _emit(render.GRAPHS_FORMATS[output_format.value](result), output, terminal_table=terminal)


@contextlib.contextmanager
def _progress(title: str, total: int | None):
    """Progress on stderr; yields advance(text), called once per case. On a terminal, a
    transient bar (a spinner if total is None); piped, one plain line per case."""
    if not stderr.is_terminal:
        done = 0

        def advance(description: str) -> None:
            nonlocal done
            done += 1
            count = f"{done}/{total}" if total is not None else f"{done}"
            print(f"mlamem: {title} [{count}] {description}", file=sys.stderr, flush=True)

        yield advance
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=stderr, transient=True) as progress:
        task = progress.add_task(title, total=total)
        yield lambda description: progress.update(task, advance=1, description=description)


@app.command("scenarios")
def list_scenarios() -> None:
    """List the shipped scenarios, one line each."""
    for name in scenarios.shipped_names():
        typer.echo(f"{name:24} {scenarios.load(name).one_line()}")


@app.command("kernels")
def list_registered_kernels() -> None:
    """List the registered kernels, one entry each: per operation what the caller may pass in
    (out, lse, accum) and the query head counts it runs, the installed version, and whether it
    runs here or why not (with the install hint). A * marks capabilities assumed because the
    kernel's library cannot be loaded here."""
    load_torch()  # the adapters import torch
    from mlamem.kernel_list import list_kernels, render_kernels

    sys.stdout.write(render_kernels(list_kernels()))


def _emit(text: str, output: Path | None, terminal_table=None) -> None:
    if output is not None:
        write_atomic(output, text)
        stderr.print(f"mlamem: wrote {output}", highlight=False)
    elif terminal_table is not None:
        Console().print(terminal_table)
    else:
        sys.stdout.write(text)


def _check_repeats(group, args: list[str]) -> None:
    """A single-valued option given twice is a UserError (click would keep the last one
    silently); options declared repeatable (multiple=True, e.g. --expect-oom) may repeat.
    `group` is the app's click group."""
    command = group.commands.get(args[0]) if args else None
    if command is None or "--help" in args:
        return
    options = {name: param for param in command.params if param.param_type_name == "option"
               for name in (*param.opts, *param.secondary_opts)}
    seen: dict[str, str] = {}
    rest = iter(args[1:])
    for arg in rest:
        if arg == "--":
            return
        if arg.startswith("--"):
            name, attached = arg.partition("=")[0], "=" in arg
        else:  # a short option, its value maybe attached: -s NAME or -sNAME
            name, attached = arg[:2], len(arg) > 2
        param = options.get(name)
        if param is None:
            continue
        if not param.is_flag and not attached:
            next(rest, None)  # its value, whatever it looks like
        if param.multiple:
            continue
        if param.name in seen:
            first = seen[param.name]
            raise UserError(f"{name} is given twice; give it once" if first == name else
                            f"{first} and {name} are both given; give one")
        seen[param.name] = name


# A library error's field in the CLI's words, where the flag is not the field's name in kebab case.
_FLAGS = {"gpu_memory_bytes": "--gpu-memory", "report_dir": "--report"}


def flag_for(field: str | None) -> str:
    """The flag that sets `field` (`max_num_batched_tokens` -> --max-num-batched-tokens,
    `tokens[2]` -> --tokens)."""
    name = (field or "").partition("[")[0]
    return _FLAGS.get(name, "--" + name.replace("_", "-"))


def main(argv: list[str] | None = None) -> int:
    """Entry point: bad input is one line on stderr with exit 2, Ctrl-C one line with exit 130;
    never a traceback."""
    args = sys.argv[1:] if argv is None else list(argv)
    guard = Guard()
    try:
        with guard:
            code = _run(args)
    except BaseException:
        if not guard.interrupted:  # a bug: its traceback is the report
            raise
        code = None  # whatever an interrupt turned into on its way up (C code may clear it)
    if guard.interrupted:
        guard.say()
        return Interrupted.exit_code
    return code


def _run(args: list[str]) -> int:
    """Run the command; user errors become one line on stderr and exit 2."""
    try:
        group = typer.main.get_command(app)  # what app(...) builds, built once
        _check_repeats(group, args)
        code = group.main(args=args, prog_name="mlamem", standalone_mode=False)
    except UserError as exc:
        print(f"mlamem: error: {exc.worded(flag_for(exc.field))}", file=sys.stderr)
        return exc.exit_code
    except click_errors.UsageError as exc:
        if type(exc).__name__ == "NoArgsIsHelpError" and exc.ctx:  # bare `mlamem`
            print(exc.ctx.get_help())
            return 0
        command = exc.ctx.command_path if exc.ctx else "mlamem"
        message = exc.format_message().rstrip(".")
        print(f"mlamem: error: {message}; see `{command} --help`", file=sys.stderr)
        return 2
    except click_errors.ClickException as exc:
        print(f"mlamem: error: {exc.format_message()}", file=sys.stderr)
        return exc.exit_code
    except typer.Abort:
        return 130
    except typer.Exit as exc:
        return exc.exit_code
    return code if isinstance(code, int) else 0
