"""`mlamem.profile/1`: the model of its files, and the objects only it holds."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from mlamem.results.base import Migrate, Model, ResultFile, no_second_copy
from mlamem.results.shared import (
    SPARSE_DECODE,
    Buffer,
    CommandLine,
    Environment,
    Kernel,
    MaybeBytes,
    Scenario,
    _each,
    _filled,
    _with_environment,
)


class ProfileRow(Model):
    """One (T, path). Bytes are per-call deltas over the state before the call."""

    scenario: str = Field(description="the scenario's name")
    tokens: int = Field(description="T, the decode call's s_q: query tokens in the step")
    path: str = Field(description="`alloc`, `workspace` or `workspace-full`")
    measured: bool = Field(description="false when predicted")
    peak_allocated_bytes: MaybeBytes = Field(
        description="`max_memory_allocated` delta over the call (null if the call failed)")
    peak_reserved_bytes: MaybeBytes = Field(
        description=(
            "`max_memory_reserved` delta over the call, from a cold cache (it can be below the "
            "allocated delta: [why](profile.md#why-peak-reserved-can-be-below-peak-allocated))"))
    nvml_peak_bytes: MaybeBytes = Field(description="NVML device-used delta (predicted: the reserved delta)")
    wall_time_ms: float | None = Field(
        description="host wall time of the call, synchronized (null when predicted)")
    outputs_equal: bool | None = Field(
        description="out and lse bit-identical across this T's paths (null if not compared)")
    staged: list[str] = Field(description="the buffers taken from the workspace, e.g. `[\"padded_q\"]`")
    allocations_in_call: int | None = Field(
        description=(
            "allocations made inside the call (0: nothing allocated, safe to capture in a CUDA graph)"))
    bytes_allocated_in_call: MaybeBytes = Field(description="their requested bytes")
    buffers: list[Buffer] = Field(description="the breakdown of the call's allocations")
    breakdown_peak_bytes: MaybeBytes = Field(
        description=(
            "the sum of the buffers live at the peak (equal to `peak_allocated_bytes` when the "
            "breakdown adds up)"))
    missing_buffers: list[str] = Field(description="expected buffers that were never allocated")
    oom: bool = Field(description="the call ran out of memory")
    oom_requested_bytes: MaybeBytes = Field(description="the request that failed")
    failure: str | None = Field(description="the failed call's error line (null otherwise)")
    op: str = Field(description="the row's operation (as `op`)")
    requests: int | None = Field(
        description=(
            "dense decode: b, the requests of the step (`--requests`; `tokens` is b too, one query "
            "each); null otherwise"))
    kv_tokens: int | None = Field(
        description=(
            "KV tokens each query sees: the dense decode's context length (`--context-len`), the "
            "prefill's s_kv (`--kv-len`), the sparse decode's pool"))
    median_ms: float | None = Field(
        description="`triton.testing.do_bench` median of the path's call, in ms (`--bench`; null otherwise)")
    nvml_process_peak_bytes: MaybeBytes = Field(
        None, description=(
            "this process's own NVML peak during the call, absolute, from NVML's process list "
            "(null when predicted, or where NVML does not list this process: a note says why); "
            "`nvml_peak_bytes` beside it is device-wide ([two NVML figures](profile.md#two-nvml-figures))"))


def _legacy_profile(data: dict) -> dict:
    """Profile files from before `op`, `created`, `shard` and the rows' op/requests/kv_tokens/
    median_ms: sparse decode, none of them recorded."""
    data = _with_environment(_filled(data, {"notes": [], "created": None, "op": SPARSE_DECODE,
                                            "shard": None}))
    row = {"op": data["op"], "requests": None, "kv_tokens": None, "median_ms": None}
    return {**data, "rows": _each(data.get("rows"), row)}


class ProfileFile(ResultFile):
    """`mlamem profile --format json`: one row per (swept value, path)."""

    MIGRATIONS: ClassVar[dict[int, Migrate]] = {1: _legacy_profile}
    KEY_ORDER: ClassVar[tuple[str, ...]] = (
        "command", "measured", "not_measured_reason", "scenario", "kernel", "environment", "rows",
        "notes", "schema")

    schema_: Literal["mlamem.profile/1"] = Field(alias="schema", description="`mlamem.profile/1`")
    command: CommandLine = Field(description="the command line that made it")
    measured: bool = Field(description="false: every figure is PREDICTED by the allocator model")
    not_measured_reason: str | None = Field(description="why nothing was measured (null when measured)")
    scenario: Scenario
    kernel: Kernel
    environment: Environment
    rows: list[ProfileRow]
    notes: list[str] = Field(description="lines on what could not be staged, and why, and other caveats")

    @model_validator(mode="after")
    def _one_copy_of_each_row(self) -> ProfileFile:
        no_second_copy(self.rows, ("scenario", "op", "tokens", "kv_tokens", "path"), "rows")
        return self
    created: str | None = Field(
        description="when it was made: UTC, ISO 8601 (absent in files from before it was recorded)")
    op: str = Field(
        description=(
            "the kernel operation: `sparse-decode` (absent in older files, which are all sparse "
            "decode), `dense-decode` or `sparse-prefill`"))
    shard: str | None = Field(
        description=(
            "`\"I/N\"` when the file is shard I of N of a sweep (`--shard`; null when unsharded, absent "
            "in older files): its rows are that shard's units only ([Sharded "
            "sweeps](ci.md#sharded-sweeps---shard-in-and-mlamem-merge))"))


