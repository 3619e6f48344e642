"""`mlamem.graphs/1`: the model of its files, and the objects only it holds."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from mlamem.results.base import Migrate, Model, ResultFile, no_second_copy
from mlamem.results.shared import (
    Buffer,
    Bytes,
    CommandLine,
    DeviceBytes,
    Environment,
    Kernel,
    MaybeBytes,
    MaybeDeviceBytes,
    Scenario,
    _filled,
    _with_environment,
)


class Capture(Model):
    """One capture at `tokens`; bytes are deltas over the state just before it."""

    tokens: int = Field(description="T of this capture")
    peak_allocated_bytes: MaybeBytes = Field(
        description="the allocated peak inside the capture (null if it failed)")
    peak_reserved_bytes: MaybeBytes = Field(description="the reserved peak inside the capture")
    pool_growth_bytes: MaybeBytes = Field(
        description="the pool's new segments (reserved growth), after the capture's outputs were released")
    held_bytes: MaybeBytes = Field(
        description=(
            "still allocated after its outputs were released (the first capture: the graph's RNG state)"))
    device_growth_bytes: MaybeDeviceBytes = Field(
        description=(
            "device-wide growth by `mem_get_info`, as vLLM samples it (another process's frees "
            "between the reads can make it negative); predicted: the model's reserved plus the "
            "host setup's non-torch memory (mlamem/non_torch.toml)"))
    replay_equal: bool | None = Field(
        description=(
            "the replay's out and lse bit-identical to the eager warm-up call's (null when predicted)"))
    buffers: list[Buffer]
    failure: str | None = Field(
        description="the warm-up's or capture's error line (null otherwise); the path stops there")
    oom: bool = Field(description="it ran out of memory")
    oom_requested_bytes: MaybeBytes = Field(description="the request that failed")


class Estimate(Model):
    """vLLM's rule on two samples: first + max(second, 1 MiB) x (graphs - 1)."""

    source: str = Field(
        description=(
            "`allocator` (the rule on reserved growth; always) or `device` (on `mem_get_info` growth, "
            "as vLLM does; measured, or predicted with the host setup's non-torch memory)"))
    first_bytes: DeviceBytes = Field(description="the first two captures' growth by that measure")
    second_bytes: DeviceBytes = Field(description="the first two captures' growth by that measure")
    per_graph_bytes: Bytes = Field(description="max(second, 1 MiB): vLLM's charge per further graph")
    graphs: int = Field(description="N, the captures in the list")
    estimate_bytes: DeviceBytes = Field(description="vLLM's estimate: first + per_graph × (N − 1)")
    actual_bytes: DeviceBytes = Field(
        description="what the whole list took by the same measure (`pool_bytes` or `device_bytes`)")
    error_bytes: int = Field(description="estimate − actual")
    error_percent: float | None = Field(
        description="the error as a percentage of actual (null when actual is 0)")


class GraphPath(Model):
    """One path captured at every size of the list, into one pool."""

    path: str = Field(description="`alloc`, `workspace` or `workspace-full`")
    staged: list[str] = Field(description="the buffers taken from the workspace, e.g. `[\"padded_q\"]`")
    captures: list[Capture]
    pool_bytes: MaybeBytes = Field(
        description="reserved growth over the whole list: the pool (null if a capture failed)")
    held_bytes: MaybeBytes = Field(description="allocated after the whole list, outputs released")
    device_bytes: MaybeDeviceBytes = Field(
        description="device-wide growth over the whole list (measured, or modelled as for captures)")
    unexplained_device_bytes: int | None = Field(
        description=(
            "`device_bytes` − `pool_bytes`: graph instantiation, modules loaded on first launch"))
    estimates: list[Estimate]
    failure: str | None = Field(
        description=(
            "the first capture that failed, `T=...: error` (null otherwise); `estimates` is then empty"))


class Serving(Model):
    """vLLM's CUDA-graph settings the capture list came from."""

    max_num_seqs: int = Field(description="the engine's max_num_seqs")
    max_cudagraph_capture_size: int | None = Field(
        description="the largest capture size set in the scenario (null: vLLM's default rule)")
    cudagraph_mode: str = Field(description="vLLM's cudagraph_mode, e.g. `FULL_AND_PIECEWISE`")
    num_speculative_tokens: int = Field(
        description="speculative tokens per request: FULL decode sizes are multiples of 1 + this")


def _legacy_graphs(data: dict) -> dict:
    """Graphs files from before `created` and `notes`."""
    return _with_environment(_filled(data, {"notes": [], "created": None}))


class GraphsFile(ResultFile):
    """`mlamem graphs --format json`: per path, one call captured at every size of the list."""

    MIGRATIONS: ClassVar[dict[int, Migrate]] = {1: _legacy_graphs}
    KEY_ORDER: ClassVar[tuple[str, ...]] = (
        "command", "measured", "not_measured_reason", "scenario", "kernel", "op",
        "capture_sizes", "capture_sizes_source", "serving", "environment", "paths", "notes",
        "schema", "created")

    schema_: Literal["mlamem.graphs/1"] = Field(alias="schema", description="`mlamem.graphs/1`")
    command: CommandLine = Field(description="the command line that made it")
    measured: bool = Field(
        description="false: every figure is PREDICTED by the allocator model (its private pools)")
    not_measured_reason: str | None = Field(description="why nothing was measured (null when measured)")
    scenario: Scenario
    kernel: Kernel
    op: str = Field(description="the captured operation: `sparse-decode`")
    capture_sizes: list[int] = Field(description="the T of each capture, in capture order: largest first")
    capture_sizes_source: str = Field(
        description=(
            "where the list comes from: the scenario's serving config by vLLM's rule (in words), or "
            "`--capture-sizes`"))
    serving: Serving
    environment: Environment
    paths: list[GraphPath]
    notes: list[str] = Field(
        description="lines on how the captures share the pool, vLLM's rule, and other caveats")
    created: str | None = Field(description="when it was made: UTC, ISO 8601")

    @model_validator(mode="after")
    def _one_copy_of_each_capture(self) -> GraphsFile:
        no_second_copy(self.paths, ("path",), "paths")
        for i, path in enumerate(self.paths):
            no_second_copy(path.captures, ("tokens",), f"paths[{i}].captures")
        return self


