"""The objects the result schemas share (the environment, the scenario, the kernel, a buffer),
the byte types, and the helpers the schemas' migrate steps use."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field

from mlamem.results.base import Model, Open
from mlamem.results.legacy import LEGACY_KERNEL_FIELDS
from mlamem.spec.redaction import redacted_command_line
from mlamem.spec.units import MAX_BYTES

SPARSE_DECODE = "sparse-decode"  # the operation of every file from before operations
ENGINE_OF_MODE = {"decode": "vllm", "context-reuse": "trtllm-context-reuse"}  # repro, before `engine`

Bytes = Annotated[int, Field(ge=0, le=MAX_BYTES)]  # a byte count, within what any device has
MaybeBytes = Bytes | None  # a byte count, null where the call failed or nothing was measured
# a device-wide growth (two `mem_get_info` reads): another process's frees between them can make
# it negative
DeviceBytes = Annotated[int, Field(ge=-MAX_BYTES, le=MAX_BYTES)]
MaybeDeviceBytes = DeviceBytes | None
# the command line that made a result, its secrets hidden as it is read (a file of any age)
CommandLine = Annotated[str, AfterValidator(redacted_command_line)]


class Environment(Model):
    """The machine and software a result was produced on; GPU fields are null without one."""

    gpu: str | None = Field(description="the GPU's name as torch reports it, e.g. `NVIDIA H200`")
    compute_capability: str | None = Field(description="e.g. `9.0`")
    sm_count: int | None = Field(description="the GPU's streaming multiprocessors")
    gpu_memory_bytes: MaybeBytes = Field(description="the GPU's total memory as torch reports it")
    driver: str | None = Field(description="the NVIDIA driver's version")
    cuda: str | None = Field(description="the CUDA version torch was built with")
    torch: str = Field(description="`torch.__version__`")
    mlamem: str = Field(description="mlamem's version")
    python: str = Field(description="Python's version")
    allocator_conf: str | None = Field(
        description="`PYTORCH_CUDA_ALLOC_CONF` (null when unset; the allocator model assumes the default)")
    kernels: dict[str, str | None] = Field(
        description="every registered kernel -> its adapter's version (null: its library is absent)")


class Scenario(Open):
    """The scenario a result ran (`mlamem scenarios` lists them); further keys by kind."""

    name: str = Field(description="the scenario's name")
    model: str | None = Field(None, description="the model, e.g. `GLM-5 FP8`")
    source: str | None = Field(
        None, description=(
            "where it was loaded from: a shipped file's name (`glm5-fp8-tp8.toml`) or the TOML path "
            "given"))
    heads_per_rank: int | None = Field(None, description="query heads per tensor-parallel rank")
    padded_heads: int | None = Field(None, description="the heads after padding to the kernel's head count")
    topk: int | None = Field(None, description="keys each query attends (the sparse top-k)")
    d_qk: int | None = Field(None, description="q and k head dim (576: 512 latent + 64 RoPE)")
    d_v: int | None = Field(None, description="v head dim (512)")
    max_num_batched_tokens: int | None = Field(
        None, description="tokens per step, `--max-num-batched-tokens` applied: sizes the workspace")
    kv_cache_dtype: str | None = Field(
        None, description="`fp8_ds_mla` (656 B per token and layer) or `fp8` (576 B)")


class Kernel(Open):
    """The kernel adapter that ran (`mlamem kernels`), and what it declares it can take; a
    compare result's kernels carry name, label, version and head_counts only."""

    name: str = Field(description="the `--kernel` name (`mlamem kernels` lists them)")
    label: str = Field(description="its name for people, e.g. `FlashMLA`")
    version: str | None = Field(None, description=(
        "its build's version (`flashmla-vllm`: the vllm version and the library's sha256), null when "
        "unknown"))
    sm_count: int | None = Field(None, description=(
        "the SMs its split plan was made for: the local GPU's when measured, the scenario's GPU's when "
        "predicted"))
    takes_out: bool | None = Field(None, description="accepts a caller's output tensor (`out=`)")
    takes_lse: bool | None = Field(None, description="accepts a caller's lse tensor")
    takes_accum_workspace: bool | None = Field(
        None, description="accepts caller-provided split-KV accumulators")
    head_counts: list[int] | None = Field(
        None, description="the query head counts it runs; q is padded up to one of them")
    source: str | None = Field(
        None, description="where these facts come from, e.g. the op schema read at run time")
    kv_formats: list[str] | None = Field(
        None, description="the caches it reads for the operation: `fp8_ds_mla`, `bf16` or `fp8`")
    heads_source: str | None = Field(
        None, description="where `head_counts` come from (probed on which GPU, or assumed)")
    assumed: bool | None = Field(None, description=(
        "true when the kernel's library is not loaded here and its recorded schema stands in "
        "(predictions only)"))


class Buffer(Model):
    """One allocation inside a call, named from the path's and kernel's allocation spec."""

    name: str = Field(
        description=(
            "one allocation inside the call, named from the path's and kernel's allocation spec "
            "(`padded_q`, `out`, `o_accum`, ...); any other by its `frame` where stacks were "
            "recorded (`profile --frames`, the API), else `unattributed`"))
    allocated_by: str = Field(description="`wrapper`, `kernel` or `unknown`")
    requested_bytes: Bytes = Field(description="the bytes asked for")
    block_bytes: Bytes = Field(description="the bytes the allocator counts (rounded up to 512)")
    segment_bytes: Bytes = Field(description="new device memory reserved for it (0 if it fit a cached block)")
    live_at_peak: bool = Field(description="still allocated at the call's allocated peak")
    removed_by_workspace: bool | None = Field(
        None, description=(
            "on the alloc path, whether the workspace path removes it (null on other paths, or when no "
            "workspace path ran)"))
    frame: str | None = Field(
        None, description=(
            "the Python frame that asked for it, `file:line function`: the innermost outside torch, "
            "mlamem and the kernel libraries (null: no stacks recorded)"))


def _environment(data: dict) -> dict:
    """An environment from before `kernels`: its per-kernel fields moved into `kernels`."""
    if not isinstance(data, dict) or not any(k in data for k in LEGACY_KERNEL_FIELDS):
        return data
    kernels = dict(data.get("kernels") or {})
    for old, name in LEGACY_KERNEL_FIELDS.items():
        if old in data:
            if name in kernels and kernels[name] != data[old]:
                raise ValueError(f"environment: {old} {data[old]!r} contradicts kernels.{name} "
                                 f"{kernels[name]!r}")
            kernels[name] = data[old]
    return {**{k: v for k, v in data.items() if k not in LEGACY_KERNEL_FIELDS}, "kernels": kernels}


def _filled(data: object, defaults: dict) -> object:
    """`data` with `defaults` for the keys it lacks (anything not an object passes as it is)."""
    return {**defaults, **data} if isinstance(data, dict) else data


def _each(items: object, defaults: dict) -> object:
    return [_filled(item, defaults) for item in items] if isinstance(items, list) else items


def _with_environment(data: dict) -> dict:
    if "environment" in data:
        return {**data, "environment": _environment(data["environment"])}
    return data


