"""`mlamem repro-oom`: one engine rank's runtime OOM, per path, and what removes it."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from mlamem import render
from mlamem.cli import options as o
from mlamem.cli.app import app
from mlamem.cli.output import command_line, emit, note_predicted, progress
from mlamem.commands.sweep import Request, plan
from mlamem.kernels import DEFAULT_KERNEL
from mlamem.runtime.paths import PATH_NAMES
from mlamem.spec.engine_registry import SHIPPED, declared_engine, engine_spec
from mlamem.spec.engines import rank_startup
from mlamem.spec.errors import UserError
from mlamem.spec.files import check_output_path, pick_format
from mlamem.spec.scenario_names import DEFAULT_SCENARIO
from mlamem.spec.units import check_fraction, parse_bytes

GpuMemoryOption = Annotated[str | None, o.gpu_memory_option(
    "The target GPU's memory to emulate, e.g. 80GiB or 81079MiB; at most the local GPU's.")]
UtilizationOption = Annotated[float | None, o.utilization_option(
    "The engine's --gpu-memory-utilization, in (0, 1].")]
StepTokensOption = Annotated[int | None, o.max_tokens_option(
    "the workspace, the profile pass and the full step (SGLang: its --chunked-prefill-size)",
    "the scenario's; SGLang: the [sglang] table's, else SGLang's for the GPU")]
MemFractionStaticOption = Annotated[float | None, typer.Option(
    help="--engine sglang: SGLang's --mem-fraction-static, in (0, 1) (default: the [sglang] "
         "table's, else SGLang's reserve rule for the target GPU).", show_default=False)]
ReproEngineOption = Annotated[str | None, typer.Option(
    help=f"The engine to emulate ({', '.join(SHIPPED)}): one the scenario declares "
         "in `engines` (default: its first).", metavar="NAME", show_default=False)]
CudaGraphsOption = Annotated[o.Switch | None, typer.Option(
    "--cuda-graphs", help="on: the engine's CUDA-graph phases too. vLLM: the graph estimate "
                          "before KV sizing (its two largest FULL decode graphs, "
                          "extrapolated), then every capture after the KV cache, then the "
                          "step. SGLang: its decode graphs after the pool, largest first, "
                          "then the step. Default: the scenario's [vllm].cuda_graphs where "
                          "it records it (a scenario from a serve command does), else off.",
    show_default=False)]
ReproCaptureSizesOption = Annotated[str | None, o.capture_sizes_option(
    "the scenario's FULL decode graphs (`mlamem graphs --help`); SGLang takes its batch sizes "
    "from [sglang].cuda_graph_bs", " (with --cuda-graphs on, vLLM)")]
ExpectOomOption = Annotated[list[str] | None, typer.Option(
    "--expect-oom", help="Exit 1 unless this case (a path; trtllm-context-reuse: a reserve "
                         "variant none, fp8, full) runs out of memory (repeatable).")]
ExpectFitOption = Annotated[list[str] | None, typer.Option(
    "--expect-fit", help="Exit 1 unless this case (path or variant) fits (repeatable).")]


@app.command("repro-oom")
def repro_oom(
    scenario: o.OneScenarioOption = None,
    serve: o.ServeOption = None,
    model: o.ModelOption = None,
    gpu: o.GpuOption = None,
    weights_per_rank: o.WeightsOption = None,
    engine_version: o.EngineVersionOption = None,
    gpu_memory: GpuMemoryOption = None,
    utilization: UtilizationOption = None,
    max_num_batched_tokens: StepTokensOption = None,
    mem_fraction_static: MemFractionStaticOption = None,
    paths: o.PathsOption = None,
    kernel: o.KernelOption = DEFAULT_KERNEL,
    output_format: Annotated[o.ReproFormat | None, o.format_option("mlamem.repro-oom/1")] = None,
    output: o.PlainOutputOption = None,
    predict: Annotated[bool, o.predict_option()] = False,
    engine: ReproEngineOption = None,
    cuda_graphs: CudaGraphsOption = None,
    capture_sizes: ReproCaptureSizesOption = None,
    expect_oom: ExpectOomOption = None,
    expect_fit: ExpectFitOption = None,
    log: o.LogOption = None,
    log_path: o.LogPathOption = None,
) -> None:
    """Reproduce a runtime OOM of one engine rank, per path, and show what removes it.

    Emulates the engine in its order on the local GPU. vLLM (--engine vllm): cap memory at the
    target GPU's, count non-torch memory, reserve the workspace (workspace path), place the
    weights, run a profile pass that skips attention, size the KV cache as
    `utilization x total - (init + profile peak + non-torch)`, then run one full step. Each
    case runs in its own process. Prints each path's verdict (fits with its headroom, or the
    allocation that failed and the free bytes), and the largest max_num_batched_tokens that
    fits. Without a GPU the verdicts are PREDICTED.

    SGLang (--engine sglang, on GLM-5 and DeepSeek-V3.2): no profile pass; the KV pool from
    --mem-fraction-static (default: SGLang's reserve rule for the GPU), then one chunked prefill
    step of --max-num-batched-tokens (SGLang's --chunked-prefill-size) through flashmla_kv; with
    the largest safe chunk and fraction.

    TensorRT-LLM with block reuse (--engine trtllm-context-reuse, kimi-k2-context-reuse's default)
    reproduces the context-MLA reuse OOM instead, three ways: no reserve, the fp8-only reserve (TRT-LLM
    PR #16399) and plan's everything-charged reserve with its admission cap. --log: the server's log
    beside the rank. Exits 0 whatever the verdict, unless --expect-oom/--expect-fit says otherwise."""
    output_format = _output_format(output, output_format)
    sizes = _check_flags(expect_oom, expect_fit, output, capture_sizes, cuda_graphs,
                         utilization, mem_fraction_static)
    server_log = o.server_log(log, log_path)  # refused in one line before any work
    loaded = _load(scenario, serve, o.Changes(model, gpu, weights_per_rank, engine_version),
                   gpu_memory, engine, (paths, expect_oom, expect_fit, utilization, mem_fraction_static))
    chosen, part = _plan(loaded, kernel, paths, max_num_batched_tokens)
    emulated = _engine(part, engine, expect_oom, expect_fit, cuda_graphs is o.Switch.on)
    budget = _budget(emulated, part.scenario, gpu_memory, utilization, sizes,
                     _graphs_on(cuda_graphs, part.scenario, emulated, sizes),
                     max_num_batched_tokens, mem_fraction_static)
    result = _run(chosen, part, budget, part.kernel, predict, emulated, server_log, serve)
    _show(result, output_format, output)
    _check_expected(result, emulated, expect_oom, expect_fit)


def _run(chosen, part, budget, kernel, predict: bool, emulated, server_log, serve: str | None):
    """The target checked, each case emulated, its limits searched; with --log, the log's
    ledger beside them."""
    from mlamem.commands.repro import check_target, run_repro  # torch: after every refusal

    check_target(budget, kernel, predict)
    with progress(f"repro-oom {part.scenario.name}", None) as advance:
        result = run_repro(chosen, budget, part.paths, command=command_line(), kernel=kernel,
                           predict=predict, engine=emulated.name, on_progress=advance)
        return _with_log(result, server_log, emulated, part, kernel, budget, serve, advance)


def _with_log(result, server_log, emulated, part, kernel, budget, serve: str | None, advance,
              keys: list[str] | None = None):
    """The result with the server log's ledger (`--log`), each case predicted beside it; with
    no result, the ledger of `keys`. Without --log, a TP rank of vLLM or SGLang gets the ledger
    of a public startup log of the nearest layout (rank_startup.stand_in): what its device holds
    beyond mlamem's one-process rank."""
    stand_in = None
    if server_log is None:
        stand_in = (rank_startup.stand_in(emulated.name, part.scenario.parallel.tensor_parallel)
                    if emulated.name in rank_startup.ENGINES else None)
        if stand_in is None:
            return result
        server_log = stand_in.record.log()
    from mlamem.commands.log_ledger import Rank, log_ledger  # torch
    from mlamem.commands.repro import host_setup, target_gpu  # torch

    advance("reading the server log beside the rank" if stand_in is None
            else "holding a public TP rank's startup memory beside the rank")
    host = host_setup(kernel.name, predict=True, target_bytes=budget.gpu_memory_bytes,
                      target_gpu=target_gpu(part.scenario, budget))  # the target's record
    rank = Rank(emulated, part.scenario, kernel, budget, host, part.scenario.gpu.sm_count)
    if result is None:
        return log_ledger(server_log, rank, keys, serve, stand_in)
    keys = [c[emulated.case_type.key_field] for c in result.cases]
    return result.model_copy(update={"log": log_ledger(server_log, rank, keys, serve, stand_in)})


def ledger_for(loaded, serve: str | None, server_log, engine: str | None = None):
    """`plan --log`: the server log's ledger beside the rank `repro-oom --predict` emulates for
    the scenario (its engine, else the first it declares), at the scenario's own settings."""
    decode = o.make_kernel(DEFAULT_KERNEL)
    _, part = _plan((loaded.name, loaded), decode, None, None)
    emulated = _engine(part, engine, None, None, False)
    graphs_on = _graphs_on(None, part.scenario, emulated, None)
    budget = _budget(emulated, part.scenario, None, None, None, graphs_on, None, None)
    keys = emulated.case_keys(part.paths)
    result = _with_log(None, server_log, emulated, part, decode, budget, serve, lambda _: None,
                       keys)
    return result


def _output_format(output, output_format: o.ReproFormat | None) -> o.ReproFormat:
    """--format as given, else the one --output's suffix names, else a table."""
    return o.ReproFormat(pick_format(output, output_format and output_format.value,
                                     list(o.ReproFormat), what="repro-oom"))


def _check_flags(expect_oom, expect_fit, output, capture_sizes: str | None, cuda_graphs,
                 utilization: float | None, mem_fraction_static: float | None):
    """The flags checked before any file is read or torch loads: the capture sizes given."""
    both = sorted(set(expect_oom or []) & set(expect_fit or []))
    if both:
        raise UserError(f"--expect-oom and --expect-fit both name {both[0]}; a case cannot both "
                        "run out of memory and fit: give it to one")
    if output is not None:
        check_output_path(output)
    sizes = o.parse_sizes(capture_sizes)
    if sizes is not None and cuda_graphs is o.Switch.off:
        raise UserError("--capture-sizes applies to --cuda-graphs on; add it")
    for value, field, one in ((utilization, "utilization", True),
                              (mem_fraction_static, "mem_fraction_static", False)):
        if value is not None:
            check_fraction(value, field, one_allowed=one)
    return sizes


def _load(scenario: str | None, serve: str | None, changes: o.Changes,
          gpu_memory: str | None, engine: str | None, engine_flags: tuple) -> tuple:
    """The scenario (as given, loaded), its weights checked against the memory, the engine
    against those it declares and `engine_flags` against the engine (_check_engine_flags),
    before torch loads."""
    if gpu_memory is not None and o.parse_size(gpu_memory, "gpu_memory_bytes") <= 0:
        raise UserError("must be positive; pass a size such as 80GiB", field="gpu_memory_bytes")
    loaded = o.load_one(scenario, serve, changes)
    if serve is not None and "sparse-decode" not in loaded.operations:
        raise UserError(f"repro-oom replays the engine's sparse decode step, and the command's "
                        f"model ({loaded.model.name}) is dense MLA (no DSA indexer), which vLLM "
                        "decodes with FlashMLA's dense decode: profile that call with "
                        "`mlamem profile --op dense-decode -s FILE`, FILE the TOML `mlamem "
                        "scenarios --serve` prints", field="serve")
    o.check_weights_fit(loaded, gpu_memory, from_file=serve is None and changes.model is None
                        and changes.weights_per_rank is None)
    _check_engine_flags(declared_engine(loaded, engine), *engine_flags)
    return scenario or (DEFAULT_SCENARIO if serve is None else loaded.name), loaded


def _check_engine_flags(name: str, paths: str | None, expect_oom, expect_fit,
                        utilization: float | None, mem_fraction_static: float | None) -> None:
    """Before torch, from engine `name`'s spec: its fraction flag, and the cases --expect-oom
    and --expect-fit name where the cases are paths (_engine checks them on the kernel's)."""
    spec = engine_spec(name)
    if utilization is not None and not spec.reads_utilization:
        raise UserError(f"--utilization: the {name} engine's fraction is "
                        "--mem-fraction-static; pass that instead")
    if mem_fraction_static is not None and spec.searched_fraction != "mem_fraction_static":
        raise UserError(f"--mem-fraction-static is SGLang's (--engine sglang); the {name} engine "
                        "has no such option: drop it (vLLM's fraction is --utilization)")
    if spec.key_field != "path":
        return
    cases = o.split_paths(paths) or list(PATH_NAMES)
    for option, wanted in (("--expect-oom", expect_oom), ("--expect-fit", expect_fit)):
        for case in wanted or []:
            if case not in cases:
                raise UserError(f"{option} {case}: not among the {spec.view.cases_named} "
                                f"{','.join(cases)}")


def _plan(scenario: tuple, kernel, paths: str | None, max_num_batched_tokens: int | None):
    """The sparse decode step the engine replays, checked: kernel, scenario (as given, loaded),
    paths, shape and max_num_batched_tokens: (the scenario, the part, whose scenario has that
    max_num_batched_tokens)."""
    chosen = scenario[1]
    [part] = plan(Request(
        "repro-oom", kernel, scenarios=[scenario], paths=o.split_paths(paths),
        max_num_batched_tokens=max_num_batched_tokens, fix=o.RAISE_LIMIT), load=o.make_kernel)
    return chosen, part


def _engine(part, engine: str | None, expect_oom, expect_fit, graphs_on: bool):
    """The engine emulated, checking the cases --expect-oom and --expect-fit name."""
    from mlamem.commands.repro import scenario_engine  # torch

    emulated = scenario_engine(part.scenario, engine)
    cases = emulated.case_keys(part.paths)
    for option, wanted in (("--expect-oom", expect_oom), ("--expect-fit", expect_fit)):
        for name in wanted or []:
            if name not in cases:
                raise UserError(f"{option} {name}: not among the {emulated.view.cases_named} "
                                f"{','.join(cases)}")
    if graphs_on and not emulated.captures_graphs:
        raise UserError(f"--cuda-graphs on: the {emulated.name} emulation has no CUDA-graph "
                        "phases; use --engine vllm")
    return emulated


def _graphs_on(switch: o.Switch | None, chosen, emulated, sizes) -> bool:
    """--cuda-graphs as given, else the scenario's [vllm].cuda_graphs under vLLM where the
    scenario records it (one stderr note says so), else off; --capture-sizes needs it on."""
    graphs_on = _graphs_switch(switch, chosen, emulated)
    if sizes is not None and not graphs_on:
        raise UserError("--capture-sizes applies to --cuda-graphs on; add it")
    return graphs_on


def _graphs_switch(switch: o.Switch | None, chosen, emulated) -> bool:
    if switch is not None:
        return switch is o.Switch.on
    recorded = getattr(chosen.sections.get("vllm"), "cuda_graphs", None)
    if recorded is None or not emulated.captures_graphs or emulated.name != "vllm":
        return False
    state = "on" if recorded else "off"
    print(f"mlamem: note: CUDA graphs {state}: the scenario's [vllm].cuda_graphs, as its serve "
          "command sets them; --cuda-graphs on or off overrides it", file=sys.stderr)
    return recorded


def _budget(emulated, chosen, gpu_memory: str | None, utilization: float | None, sizes,
            graphs_on: bool, tokens: int | None, mem_fraction_static: float | None):
    """The engine's budget: GPU memory, utilization, max_num_batched_tokens (given, else the
    engine's default), the engine's options."""
    try:
        memory_bytes = chosen.gpu.memory_bytes if gpu_memory is None else parse_bytes(gpu_memory)
    except ValueError as exc:
        raise UserError(f"--gpu-memory: {exc}") from None
    budget = emulated.make_budget(
        gpu_memory_bytes=memory_bytes,
        utilization=chosen.gpu.gpu_memory_utilization if utilization is None else utilization,
        max_num_batched_tokens=tokens or emulated.default_step_tokens(chosen, memory_bytes),
        mem_fraction_static=mem_fraction_static,
        cuda_graphs=graphs_on, capture_sizes=None if sizes is None else tuple(sizes))
    if graphs_on:
        emulated.check_graphs(chosen, budget)
    return budget


def _show(result, output_format: o.ReproFormat, output) -> None:
    """The result in the format asked for, on stdout or into --output."""
    note_predicted(result, "verdicts")
    terminal = render.repro_table(result) if output_format is o.ReproFormat.table else None
    emit(render.REPRO_FORMATS[output_format.value](result), output, terminal_table=terminal)
    if terminal is not None and output is None and result.log is not None:
        sys.stdout.write(render.commands_text(result.log))  # unwrapped: ready to paste


def _check_expected(result, emulated, expect_oom, expect_fit) -> None:
    """Exit 1 where a verdict is not the one --expect-oom or --expect-fit asked for."""
    verdicts = {c[emulated.case_type.key_field]: c["verdict"] for c in result.cases}
    unmet = [f"{p} was expected to OOM but {verdicts[p]}" for p in expect_oom or []
             if verdicts[p] != "oom"]
    unmet += [f"{p} was expected to fit but {verdicts[p]}" for p in expect_fit or []
              if verdicts[p] != "fits"]
    if unmet:
        print(f"mlamem: {'; '.join(unmet)}", file=sys.stderr)
        raise typer.Exit(1)
