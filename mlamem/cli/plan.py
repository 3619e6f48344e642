"""`mlamem plan`: KV-cache capacity for one rank, with the context-MLA reserve."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from mlamem import render
from mlamem.cli import options as o
from mlamem.cli.app import app
from mlamem.cli.output import command_line, emit, note_allocator_conf
from mlamem.commands import plan as plans
from mlamem.kernels import DEFAULT_KERNEL
from mlamem.spec.engine_registry import declared_engine
from mlamem.spec.errors import UserError
from mlamem.spec.files import check_output_path, pick_format
from mlamem.spec.units import parse_bytes

GpuMemoryOption = Annotated[str | None, o.gpu_memory_option("GPU memory, e.g. 141GB or 80GiB.")]
UtilizationOption = Annotated[float | None, o.utilization_option(
    "vLLM-style budget: utilization x total - weights.")]
FreeFractionOption = Annotated[float | None, typer.Option(
    help="TRT-LLM-style budget: free_gpu_memory_fraction x (total - weights).")]
MaxNumTokensOption = Annotated[int | None, typer.Option(
    help="Tokens per step (default: the scenario's max_num_batched_tokens).")]
MaxBatchSizeOption = Annotated[int | None, typer.Option(help="Requests per step.")]
MaxSeqLenOption = Annotated[int | None, typer.Option(help="Longest sequence (vLLM max_model_len).")]
BlockReuseOption = Annotated[bool | None, typer.Option(
    "--block-reuse/--no-block-reuse", help="Prefix (KV block) reuse.")]
ChunkedPrefillOption = Annotated[bool | None, typer.Option(
    "--chunked-prefill/--no-chunked-prefill", help="Chunked prefill.")]
PlanKernelOption = Annotated[o.KernelName, o.kernel_option(
    text="The sparse decode kernel of the vLLM side's per-call need (sparse scenarios), "
         "e.g. flashmla-vllm, vLLM's own build, which stages out.")]
PlanEngineOption = Annotated[str | None, typer.Option(
    help="Also each path's largest safe knobs under this engine, one the scenario declares "
         "(vllm: max_num_batched_tokens; sglang: chunked_prefill_size and "
         "mem_fraction_static), searched on the allocator model as `repro-oom --engine "
         "NAME --predict` searches them, CUDA graphs off.", metavar="NAME",
    show_default=False)]
SweepOption = Annotated[str | None, typer.Option(
    help="One variable over several values, as a table: e.g. "
         "max-seq-len=32768,131072,786432 (also max-batch-size, max-num-tokens, "
         "gpu-memory, utilization, free-fraction).")]


@app.command()
def plan(
    scenario: o.OneScenarioOption = None,
    serve: o.ServeOption = None,
    model: o.ModelOption = None,
    gpu: o.GpuOption = None,
    weights_per_rank: o.WeightsOption = None,
    engine_version: o.EngineVersionOption = None,
    gpu_memory: GpuMemoryOption = None,
    utilization: UtilizationOption = None,
    free_fraction: FreeFractionOption = None,
    max_num_tokens: MaxNumTokensOption = None,
    max_batch_size: MaxBatchSizeOption = None,
    max_seq_len: MaxSeqLenOption = None,
    block_reuse: BlockReuseOption = None,
    chunked_prefill: ChunkedPrefillOption = None,
    kernel: PlanKernelOption = DEFAULT_KERNEL,
    engine: PlanEngineOption = None,
    sweep: SweepOption = None,
    output_format: Annotated[o.ReproFormat | None, o.format_option("mlamem.plan/1")] = None,
    output: o.PlainOutputOption = None,
    log: o.LogOption = None,
    log_path: o.LogPathOption = None,
) -> None:
    """KV-cache capacity for one rank, with the fp8 context-MLA workspace reserve.

    Prints k (KV bytes per token), w (fp8 context-MLA staging per attended token), the BF16
    reuse-path gather the reserve leaves uncharged, L_cap, the reserve and admission cap, and
    the KV pool with and without it (TensorRT-LLM PR #16399), with the gate's decision. For
    sparse scenarios it adds the vLLM side: the mixed-batch per-call need at max_num_tokens and
    the bf16 prefill workspace, against the headroom the engine leaves. Pure arithmetic: no GPU.
    """
    output_format = o.ReproFormat(pick_format(output, output_format and output_format.value,
                                              list(o.ReproFormat), what="plan"))
    _check_flags(sweep, utilization, free_fraction, {
        "gpu-memory": gpu_memory, "utilization": utilization, "free-fraction": free_fraction,
        "max-num-tokens": max_num_tokens, "max-batch-size": max_batch_size,
        "max-seq-len": max_seq_len})
    if output is not None:
        check_output_path(output)
    server_log = o.server_log(log, log_path)  # refused in one line before any work
    changes = o.Changes(model, gpu, weights_per_rank, engine_version)
    chosen = o.load_one(scenario, serve, changes)
    o.check_weights_fit(chosen, gpu_memory, from_file=serve is None and changes.model is None
                        and weights_per_rank is None)
    overrides = dict(gpu_memory_bytes=_memory_bytes(gpu_memory), utilization=utilization,
                     free_fraction=free_fraction, max_num_tokens=max_num_tokens,
                     max_batch_size=max_batch_size, max_seq_len=max_seq_len,
                     block_reuse=block_reuse, chunked_prefill=chunked_prefill)
    plans.plan_requests(chosen, overrides, sweep)  # its checks, before torch loads
    if engine is not None:
        declared_engine(chosen, engine)
    if chosen.model.index_topk or engine is not None or log:  # the allocator model runs
        o.load_torch()
    result = _with_log(plans.run_plan(chosen, overrides, sweep, command=command_line(),
                                      kernel=kernel, engine=engine), chosen, serve, server_log, engine)
    if chosen.model.index_topk:
        note_allocator_conf()  # the vLLM side's per-call need comes from the allocator model
    _show(result, output_format, output)


def _show(result, output_format: o.ReproFormat, output) -> None:
    """The plan in the format asked for; with --log its ledger, then each command that fits
    on a line of its own (a table's lines are fitted to the terminal)."""
    terminal = None
    if output_format is o.ReproFormat.table:
        terminal = render.plan_table(result)
        if result.log is not None:
            from rich.console import Group

            terminal = Group(terminal, render.ledger_table(result.log))
    emit(render.PLAN_FORMATS[output_format.value](result), output, terminal_table=terminal)
    if terminal is not None and output is None and result.log is not None:
        sys.stdout.write(render.commands_text(result.log))


def _with_log(result, chosen, serve: str | None, server_log, engine: str | None):
    """The plan with the server log's ledger (`--log`) beside repro-oom's predicted rank;
    without --log, a DSA model's TP rank gets the ledger of the public startup log that stands
    in for its own (repro-oom's)."""
    if server_log is None and not (chosen.model.index_topk
                                   and chosen.parallel.tensor_parallel > 1):
        return result
    from mlamem.cli.repro_oom import ledger_for  # torch

    return result.model_copy(update={"log": ledger_for(chosen, serve, server_log, engine)})


def _check_flags(sweep: str | None, utilization: float | None, free_fraction: float | None,
                 given: dict) -> None:
    """Refuse, before torch loads, a bad --sweep, a --sweep of a value given too, and both
    budgets."""
    if sweep is not None:
        plans.parse_sweep(sweep)
    swept = (sweep or "").partition("=")[0].strip()
    if given.get(swept) is not None:
        raise UserError(f"--sweep varies {swept}, and --{swept} {given[swept]} sets it too; "
                        "drop one of them")
    if utilization is not None and free_fraction is not None:
        raise UserError("give one of --utilization (vLLM) and --free-fraction (TRT-LLM), "
                        "not both")


def _memory_bytes(gpu_memory: str | None) -> int | None:
    """--gpu-memory in bytes (None when not given)."""
    try:
        return None if gpu_memory is None else parse_bytes(gpu_memory)
    except ValueError as exc:
        raise UserError(f"--gpu-memory: {exc}") from None
