"""The server log's ledger, carried by `mlamem.repro-oom/1` (`log`): what the user's log
printed beside mlamem's figures for the same rank, the OOM it holds explained, and the serve
command that fits. Absent from files made without `--log`."""

from __future__ import annotations

from pydantic import Field

from mlamem.results.base import Model
from mlamem.results.shared import Bytes

NOT_MODELLED = "held by the rank, not modelled by mlamem"


class LogFigure(Model):
    """One memory figure the log prints, with the line it came from."""

    name: str = Field(description="what it is: `weights`, `non_torch`, `activation_peak`, "
                                  "`kv_cache`, `kv_cache_tokens`, `cuda_graphs`, ... "
                                  "(mlamem/spec/server_log.py FIGURES)")
    value: int | float = Field(description="bytes for a size; tokens, blocks or a ratio otherwise")
    line_number: int = Field(description="the line's number in the log, from 1")
    line: str = Field(description="the line, stripped (cut at 400 characters)")


class LogOom(Model):
    """A CUDA out-of-memory message in the log (the same message from several ranks once)."""

    requested_bytes: Bytes = Field(description="the allocation that failed")
    device: int | None = Field(description="the GPU's index the message names")
    total_bytes: Bytes | None = Field(description="the device's total capacity")
    free_bytes: Bytes | None = Field(description="the device's free memory then")
    process_bytes: Bytes | None = Field(description="this process's memory in use, where printed")
    allocated_bytes: Bytes | None = Field(description="allocated by PyTorch, where printed")
    reserved_unallocated_bytes: Bytes | None = Field(
        description="reserved by PyTorch but unallocated, where printed")
    line_number: int = Field(description="the message's line in the log, from 1")
    line: str = Field(description="the message's line")
    frames: list[str] = Field(description="the traceback's frames before it, innermost last")
    repeats: int = Field(description="how often the same message appears (one per rank)")


class LedgerRow(Model):
    """One component of the rank: the log's figure beside mlamem's, and the difference."""

    component: str = Field(description="weights, non-torch, activation peak, CUDA graphs, KV "
                                       f"cache, a step buffer by name, or `{NOT_MODELLED}`")
    log_bytes: Bytes | None = Field(description="the log's figure (null: the log does not print it)")
    log_line: int | None = Field(description="the line number of the log's figure")
    mlamem_bytes: Bytes | None = Field(description="mlamem's figure for this rank")
    difference_bytes: int | None = Field(description="log - mlamem, where both are known")
    source: str = Field(description="`log` (the log's figure beside mlamem's), `mlamem only` "
                                    "(the log does not print it: mlamem's figure), `OOM line N` "
                                    "(the row nothing else explains, from that message) or "
                                    "`startup line N` (from the device's use at the engine's "
                                    "startup reading, where the log has no OOM)")


class LogPath(Model):
    """One case (a path) with the log: the ledger, the OOM explained and what fits."""

    case: str = Field(description="the case's key: a decode path")
    rows: list[LedgerRow]
    failing_buffer: str | None = Field(
        description="the step's buffer of the OOM's size at the step's tokens (null: none of "
                    "that size)")
    failing_buffer_bytes: Bytes | None = Field(description="that buffer's size")
    step_tokens: int = Field(description="the step's tokens (max_num_batched_tokens)")
    held_bytes: int | None = Field(
        description="what the rank held beyond mlamem's model at the OOM: mlamem's free memory "
                    "at that request less the log's, on the case `held_path` names (the same on "
                    "every case); without an OOM, the device's use at the engine's startup "
                    "reading (vLLM's free memory on startup, SGLang's before the weights) less "
                    "mlamem's rank's then")
    verdict_with_log: str | None = Field(
        description="the case's verdict at the user's settings with that memory held")
    kv_cache_tokens_with_log: int | None = Field(
        None, description="the case's KV cache, in tokens, with that memory held: SGLang sizes "
                          "its pool from the free memory it reads, so the pool shrinks; vLLM's "
                          "budget leaves memory held before its init snapshot outside it")
    max_safe_tokens: int | None = Field(
        description="the largest safe step tokens for the rank as the log shows it")
    max_safe_fraction: float | None = Field(
        description="the largest safe memory fraction (vLLM's utilization, SGLang's "
                    "mem_fraction_static) at the user's step tokens, for that rank")
    fraction_knob: str | None = Field(description="which fraction max_safe_fraction is")
    command_that_fits: str | None = Field(
        description="the user's serve command with max_safe_tokens put in, ready to paste "
                    "(null without a serve command or a safe value)")


class ServerLogLedger(Model):
    """The user's server log, read (`--log`), and each case beside it."""

    source: str = Field(description="the log's file name, or `-` (standard input)")
    engine: str | None = Field(description="the engine its lines name: vllm, sglang, trtllm")
    version: str | None = Field(description="the engine's version, where the log prints it")
    lines: int = Field(description="lines read")
    figures: list[LogFigure]
    ooms: list[LogOom]
    paths: list[LogPath]
    notes: list[str] = Field(description="how the figures were matched and derived")
    held_path: str | None = Field(
        None, description="the case (decode path) the user's server ran, on which the memory "
                          "held beyond mlamem's model was derived (null: no OOM message, or a "
                          "file written before it was recorded)")
    held_path_reason: str | None = Field(
        None, description="why that case: `--log-path`, or the engine release's rule it cites")
    stand_in: str | None = Field(
        None, description="where no --log was given: the public startup log of a TP rank that "
                          "stands in for the user's (its engine, version, layout, GPU and "
                          "source); null: the user's own log")
    stand_in_address: str | None = Field(
        None, description="that public log's address (null: the user's own log)")
