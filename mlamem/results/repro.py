"""`mlamem.repro-oom/1`: the model of its files, and the objects only it holds."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from mlamem.results.base import Migrate, Model, Open, ResultFile, no_second_copy
from mlamem.results.ledger import ServerLogLedger
from mlamem.results.shared import (
    ENGINE_OF_MODE,
    Buffer,
    Bytes,
    CommandLine,
    Environment,
    Kernel,
    Scenario,
    _filled,
    _with_environment,
)
from mlamem.spec.engine_registry import engine_names, engine_spec


class Budget(Open):
    """The memory budget the engine was emulated with."""

    gpu_memory_bytes: Bytes = Field(
        description="the target GPU's memory (`--gpu-memory`, default the scenario's GPU)")
    utilization: float = Field(
        description=(
            "the engine's `--gpu-memory-utilization` (context reuse: used as TRT-LLM's "
            "`free_gpu_memory_fraction`)"))
    max_num_batched_tokens: int | None = Field(
        None, description="tokens per step: sizes the workspace, the profile pass and the full step")
    requested_bytes: Bytes = Field(description="utilization × total")


class ReproCase(Open):
    """One case of the engine (vLLM: a path; TRT-LLM context reuse: a reserve variant); its
    other keys are the engine's case fields (`engine.case_type`)."""

    measured: bool = Field(description="false when predicted")
    verdict: str = Field(description="as for `vllm`: `fits`, `oom`, `no-kv-room`, `error`, `crashed`")
    phase: str = Field(description="how far it got, as for `vllm`")
    buffers: list[Buffer] = Field([], description="the step's allocations")


class NonTorchModule(Model):
    """A module loaded lazily on a first launch, and its device memory."""

    name: str = Field(description="a module loaded lazily on a first launch, and its device memory")
    bytes: Bytes = Field(description="a module loaded lazily on a first launch, and its device memory")
    loaded_by: list[str] = Field(
        description=(
            "the launches whose first run loads it: aten op names (`aten.new_zeros`), "
            "`<kernel>.decode`, or `torch.cuda.graph` (the process's first CUDA-graph capture)"))


class NonTorch(Model):
    """The host setup the non-torch memory model was measured on (mlamem/non_torch.toml)."""

    gpu: str = Field(
        description="the host GPU the non-torch memory model was measured on, e.g. `NVIDIA H200`")
    gpu_memory_bytes: Bytes = Field(
        description="that GPU's total memory: the physical limit the emulation keeps to")
    torch: str = Field(description="the torch and CUDA versions it was measured with")
    cuda: str = Field(description="the torch and CUDA versions it was measured with")
    kernel: str = Field(description="the kernel library the process had loaded, and its version")
    kernel_version: str | None = Field(
        description="the kernel library the process had loaded, and its version")
    process_bytes: Bytes = Field(description="device memory the process holds before its CUDA context")
    context_bytes: Bytes = Field(
        description="the CUDA context, CUDA libraries and the kernel library, before any op")
    command: str = Field(description="the command that measured these figures, and when")
    measured_on: str = Field(description="the command that measured these figures, and when")
    modules: list[NonTorchModule]
    unallocatable_bytes: Bytes = Field(
        description=(
            "near a full device, what cudaMalloc cannot hand out beyond NVML's non-torch reading "
            "(fitted)"))
    assumed: str | None = Field(description="why this record stands in for the host (null when it matches)")
    held_bytes: Bytes = Field(
        0, description="what other ranks or processes held on the device beyond the record's "
                       "(a server log's figure; 0 in a result: its cases hold none)")


def _legacy_repro(data: dict) -> dict:
    """Repro files from before `engine` name their case shape in `mode` (`decode`,
    `context-reuse`), the oldest nothing (decode); nor do they have `created` or `non_torch`."""
    data = _with_environment(_filled(data, {"notes": [], "created": None, "non_torch": None}))
    if "engine" not in data:
        mode = data.get("mode", "decode")
        data = {k: v for k, v in data.items() if k != "mode"}
        data["engine"] = ENGINE_OF_MODE.get(mode, mode)
    return data


class ReproFile(ResultFile):
    """`mlamem repro-oom --format json`: one case per case of the engine."""

    MIGRATIONS: ClassVar[dict[int, Migrate]] = {1: _legacy_repro}
    KEY_ORDER: ClassVar[tuple[str, ...]] = (
        "command", "measured", "not_measured_reason", "scenario", "kernel", "budget",
        "environment", "cases", "notes", "engine", "non_torch", "schema", "created", "log")

    schema_: Literal["mlamem.repro-oom/1"] = Field(alias="schema", description="`mlamem.repro-oom/1`")
    command: CommandLine = Field(description="the command line that made it")
    measured: bool = Field(
        description="false: every verdict is PREDICTED by the emulation on the allocator model")
    not_measured_reason: str | None = Field(description="why nothing was measured (null when measured)")
    engine: str = Field(
        description=(
            "the engine emulated (`mlamem/engines/`): `vllm` or `sglang` (one case per path) or "
            "`trtllm-context-reuse` (one per reserve variant). Older files have `mode` instead, read as "
            "`decode` = `vllm`, `context-reuse` = `trtllm-context-reuse`, absent = `vllm`"))
    scenario: Scenario
    kernel: Kernel
    budget: Budget
    environment: Environment
    cases: list[ReproCase]
    notes: list[str] = Field(description="lines on the budget, the non-torch memory model and other caveats")
    non_torch: NonTorch | None = Field(description="the host setup non-torch memory was taken from")
    created: str | None = Field(description="when it was made: UTC, ISO 8601 (absent in older files)")
    log: ServerLogLedger | None = Field(
        None, description="`--log`: the user's server log read, each case's ledger beside it, "
                          "the OOM explained and the command that fits (absent without it)")

    @model_validator(mode="after")
    def _one_copy_of_each_case(self) -> ReproFile:
        # a case is named by its engine's key (its spec's key_field): a path (vLLM, SGLang), a
        # reserve variant (TRT-LLM) or a plug-in engine's own
        key = ["path", "variant"]
        if self.engine in engine_names() and engine_spec(self.engine).key_field not in key:
            key.append(engine_spec(self.engine).key_field)
        no_second_copy(self.cases, tuple(key), "cases")
        return self


