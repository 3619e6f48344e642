"""The result models: one `ResultFile` per JSON schema mlamem writes, and the objects they share.

Each model states what a file of its schema holds; `mlamem.results.read` checks a file against
it after its migrate steps. Files written before a field was recorded keep schema version 1: the
step for version 1 (`_legacy_*`) fills in what they lack, in one place, so no reader needs a
default for a missing key.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, model_validator

from mlamem.results.base import Migrate, Model, Open, ResultFile, no_second_copy
from mlamem.results.legacy import KERNEL_BEFORE_FLAG, LEGACY_KERNEL_FIELDS
from mlamem.units import MAX_BYTES

SPARSE_DECODE = "sparse-decode"  # the operation of every file from before operations
ENGINE_OF_MODE = {"decode": "vllm", "context-reuse": "trtllm-context-reuse"}  # repro, before `engine`

Bytes = Annotated[int, Field(ge=0, le=MAX_BYTES)]  # a byte count, within what any device has
MaybeBytes = Bytes | None  # a byte count, null where the call failed or nothing was measured


# Objects shared by the schemas


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


# mlamem.profile/1


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

    schema_: Literal["mlamem.profile/1"] = Field(alias="schema", description="`mlamem.profile/1`")
    command: str = Field(description="the command line that made it")
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


# mlamem.repro-oom/1


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

    schema_: Literal["mlamem.repro-oom/1"] = Field(alias="schema", description="`mlamem.repro-oom/1`")
    command: str = Field(description="the command line that made it")
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

    @model_validator(mode="after")
    def _one_copy_of_each_case(self) -> ReproFile:
        # a case is named by its engine's key: a path (vLLM, SGLang) or a reserve variant
        no_second_copy(self.cases, ("path", "variant"), "cases")
        return self


# mlamem.graphs/1


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
    device_growth_bytes: MaybeBytes = Field(
        description=(
            "device-wide growth by `mem_get_info`, as vLLM samples it; predicted: the model's "
            "reserved plus the host setup's non-torch memory (mlamem/non_torch.toml)"))
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
    first_bytes: Bytes = Field(description="the first two captures' growth by that measure")
    second_bytes: Bytes = Field(description="the first two captures' growth by that measure")
    per_graph_bytes: Bytes = Field(description="max(second, 1 MiB): vLLM's charge per further graph")
    graphs: int = Field(description="N, the captures in the list")
    estimate_bytes: Bytes = Field(description="vLLM's estimate: first + per_graph × (N − 1)")
    actual_bytes: Bytes = Field(
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
    device_bytes: MaybeBytes = Field(
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

    schema_: Literal["mlamem.graphs/1"] = Field(alias="schema", description="`mlamem.graphs/1`")
    command: str = Field(description="the command line that made it")
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


# mlamem.validate/1


class Comparison(Model):
    """One figure, predicted and measured, in bytes."""

    scenario: str = Field(description="the case: scenario name, T, path")
    tokens: int = Field(description="the case: scenario name, T, path")
    path: str = Field(description="the case: scenario name, T, path")
    item: str = Field(description="a buffer's name, or `total`")
    metric: str = Field(description="`allocated` or `reserved`")
    predicted: MaybeBytes = Field(
        description=(
            "the figure on the allocator model and on the GPU, in bytes (null where one side has no "
            "such buffer)"))
    measured: MaybeBytes = Field(
        description=(
            "the figure on the allocator model and on the GPU, in bytes (null where one side has no "
            "such buffer)"))
    difference: int | None = Field(description="measured − predicted, in bytes (null when either is null)")
    op: str = Field(description="the kernel operation (`tokens` is then T, requests or s_q)")
    predicted_frame: str | None = Field(
        None, description=(
            "the buffer's frame on the allocator model, `file:line function` (null for a total, "
            "where that side has no such buffer, and in older files)"))
    measured_frame: str | None = Field(
        None, description="the buffer's frame in the GPU's allocator trace, the same way")


def _legacy_validate(data: dict) -> dict:
    """Validate files from before operations (sparse decode), `environment`, `created`, `shard`."""
    data = _with_environment(_filled(data, {"environment": None, "created": None, "shard": None}))
    return {**data, "comparisons": _each(data.get("comparisons"), {"op": SPARSE_DECODE})}


class ValidateFile(ResultFile):
    """`mlamem validate --format json`: one comparison per (scenario, value, path, item, metric)."""

    MIGRATIONS: ClassVar[dict[int, Migrate]] = {1: _legacy_validate}

    schema_: Literal["mlamem.validate/1"] = Field(alias="schema", description="`mlamem.validate/1`")
    command: str = Field(description="the command line that made it")
    agrees: bool = Field(description="every figure equal, predicted and measured")
    comparisons: list[Comparison]
    environment: Environment | None
    created: str | None = Field(description="when it was made: UTC, ISO 8601 (absent in older files)")
    shard: str | None = Field(
        description=(
            "`\"I/N\"` when the file is shard I of N of a sweep (`--shard`; null when unsharded, absent "
            "in older files)"))

    @model_validator(mode="after")
    def _one_copy_of_each_total(self) -> ValidateFile:
        # a buffer's name may repeat (two allocations of one name); a case's total may not
        no_second_copy(self.comparisons, ("scenario", "op", "tokens", "path", "metric"),
                       "comparisons", only=lambda c: c.item == "total")
        return self


# mlamem.compare/1


class ReferenceDifference(Model):
    """One kernel's output against the torch reference (float32 math, bf16 out)."""

    out_max_abs: float = Field(description="largest |out - reference out|")
    out_rel_l2: float = Field(description="||out - reference|| / ||reference||")
    lse_max_abs: float = Field(description="largest |lse - reference lse| (natural log), over finite entries")


class CompareRow(Model):
    """One (value, path): the two kernels' outputs side by side."""

    tokens: int = Field(description="the swept value: T, requests (dense decode) or s_q")
    path: str = Field(description="the wrapper path both kernels ran")
    out_equal: bool = Field(description="out and lse bit-identical between the two kernels")
    lse_equal: bool = Field(description="out and lse bit-identical between the two kernels")
    out_max_diff: float = Field(description="the largest absolute difference (0 when equal)")
    lse_max_diff: float = Field(description="the largest absolute difference (0 when equal)")
    errors: dict[str, ReferenceDifference | None] = Field(description="kernel name -> vs the reference")


def _legacy_compare(data: dict) -> dict:
    """Compare files from before `notes`."""
    return _with_environment(_filled(data, {"notes": []}))


class CompareFile(ResultFile):
    """`mlamem compare --format json`: the same inputs through two kernels."""

    MIGRATIONS: ClassVar[dict[int, Migrate]] = {1: _legacy_compare}

    schema_: Literal["mlamem.compare/1"] = Field(alias="schema", description="`mlamem.compare/1`")
    command: str = Field(description="the command line that made it")
    op: str = Field(description="the operation compared: `sparse-decode`, `dense-decode` or `sparse-prefill`")
    scenario: str = Field(description="the scenario's name")
    kernels: list[Kernel]
    kv_tokens: int = Field(
        description=(
            "KV tokens each query sees (dense decode: the context; prefill: s_kv; sparse decode: the "
            "pool)"))
    rows: list[CompareRow]
    environment: Environment
    created: str = Field(description="when it was made: UTC, ISO 8601")
    notes: list[str] = Field(description="caveats, e.g. no reference run")


# mlamem.baseline/1


class Sweep(Model):
    """The sweep a baseline was made from, so a bare rerun repeats it."""

    scenarios: list[str] = Field(
        description="the scenarios as given (names or TOML paths): what a bare `mlamem gate` reruns")
    ops: list[str] = Field(
        description=(
            "the operations swept (`sparse-decode`, `dense-decode`, `sparse-prefill`), each scenario "
            "the ones it declares; absent in older baselines, which are `sparse-decode`"))
    tokens: list[int] = Field(
        description=(
            "the T (sparse decode) and s_q (sparse prefill) values asked for, each scenario running "
            "those its workspace holds (empty when neither operation is swept), and the paths"))
    requests: list[int] | None = Field(
        None, description=(
            "the b values of the dense decode (empty when it is not swept; absent in older baselines)"))
    paths: list[str] = Field(
        description=(
            "the T (sparse decode) and s_q (sparse prefill) values asked for, each scenario running "
            "those its workspace holds (empty when neither operation is swept), and the paths"))
    kernel: str = Field(
        description="the `--kernel` name (absent in older baselines, which are `flashmla`)")


class CaseFigures(Model):
    """The gated figures of one (scenario, op, swept value, path); null where the call failed."""

    scenario: str = Field(description="the case; `tokens` is the swept value: T, b or s_q")
    op: str = Field(
        description=(
            "its operation (absent in older baselines: `sparse-decode`); a case is (scenario, op, "
            "tokens, path)"))
    tokens: int = Field(description="the case; `tokens` is the swept value: T, b or s_q")
    requests: int | None = Field(
        None, description="the dense decode's b, = `tokens` (null for the other operations)")
    kv_tokens: int | None = Field(
        None, description=(
            "KV tokens each query saw: the sparse decode's pool, the dense decode's context length, the "
            "prefill's s_kv (absent in older baselines)"))
    path: str = Field(description="the case; `tokens` is the swept value: T, b or s_q")
    peak_allocated_bytes: MaybeBytes = Field(description="the call's allocated and reserved peaks")
    peak_reserved_bytes: MaybeBytes = Field(description="the call's allocated and reserved peaks")
    bytes_allocated_in_call: MaybeBytes = Field(description="requested bytes allocated inside the call")
    buffers: dict[str, Bytes] = Field(description="buffer name -> requested bytes")
    failure: str | None = Field(description="the failed call's error line (null unless it failed)")


def _legacy_baseline(data: dict) -> dict:
    """Baselines from before operations and --kernel: every case is sparse decode, by flashmla."""
    data = _with_environment(data)
    sweep = data.get("sweep")
    if isinstance(sweep, dict):  # added after its keys, so a file writes back as it was read
        added = {"ops": [SPARSE_DECODE], "kernel": KERNEL_BEFORE_FLAG}
        data = {**data, "sweep": {**sweep, **{k: v for k, v in added.items() if k not in sweep}}}
    return {**data, "cases": _each(data.get("cases"), {"op": SPARSE_DECODE})}


class BaselineFile(ResultFile):
    """`mlamem gate --update`: a sweep's gated figures and where they were made."""

    MIGRATIONS: ClassVar[dict[int, Migrate]] = {1: _legacy_baseline}

    schema_: Literal["mlamem.baseline/1"] = Field(alias="schema", description="`mlamem.baseline/1`")
    command: str = Field(description="the command line that made it")
    measured: bool = Field(description="false when the figures are predicted")
    not_measured_reason: str | None = Field(description="why nothing was measured (null when measured)")
    environment: Environment
    sweep: Sweep
    cases: list[CaseFigures]

    @model_validator(mode="after")
    def _one_copy_of_each_case(self) -> BaselineFile:
        no_second_copy(self.cases, ("scenario", "op", "tokens", "path"), "cases")
        return self


# mlamem.plan/1


class Reserve(Model):
    """A workspace reserve carved out of the KV budget, and what it leaves the pool."""

    bytes_per_token: Bytes = Field(
        description=(
            "the charge per attended token: w (the PR's), or w + the BF16 gather (everything charged)"))
    reserve_bytes: Bytes = Field(
        description=(
            "the reserve: min(charge × L_cap, budget × charge / (k + charge)); 0 when the gate is off"))
    clamped: bool = Field(description="the budget bound, not charge × L_cap")
    admission_cap_tokens: int | None = Field(
        description="reserve / charge: the summed attended KV admitted (null: no cap)")
    pool_tokens: int = Field(description="the KV pool left beside the reserve, in tokens")
    capacity_change_percent: float = Field(description="that pool against the pool without a reserve")


class PlanRequest(Open):
    """What the plan was asked for (the scenario's values, overridden by the flags)."""

    gpu_memory_bytes: Bytes = Field(description="the GPU's memory")


class VllmPlan(Model):
    """Sparse scenarios: what vLLM's side of the plan needs, per call and for the prefill."""

    kernel: str = Field(
        description=(
            "the kernel whose sparse decode the per-call need is computed with (`--kernel`, default "
            "`flashmla`; absent in older files)"))
    max_num_batched_tokens: int = Field(description="the mixed batch the per-call need is computed at")
    headroom_bytes: Bytes = Field(
        description=(
            "what the engine leaves outside its budget: total − utilization × total (or total − weights "
            "− budget)"))
    per_call_need_bytes: dict[str, Bytes] = Field(description="path -> one decode call's peak need")
    per_call_fits: dict[str, bool] = Field(description="path -> whether it fits the headroom")
    prefill_workspace_bytes: Bytes = Field(
        description="vLLM's bf16 prefill workspace: 5 × max_model_len × 576 × 2 B")
    prefill_workspace_fits: bool = Field(description="whether it fits the headroom")


class PlanScenario(Model):
    name: str = Field(description="the scenario and its model")
    model: str = Field(description="the scenario and its model")
    heads_per_rank: int = Field(description="query heads per rank")
    num_layers: int = Field(description="the model's layers")
    kv_cache_dtype: str = Field(description="`fp8_ds_mla` or `fp8`")
    kv_bytes_per_token_per_layer: Bytes = Field(description="KV-cache bytes per token and layer (656 or 576)")
    weights_note: str = Field(description="why the weights have their value")


class EngineKnob(Model):
    """One engine's memory fraction for the pool."""

    engine: str = Field(description="the engine (`mlamem/engines/`)")
    name: str = Field(description=(
        "its flag: `gpu_memory_utilization`, `mem_fraction_static`, `free_gpu_memory_fraction`"))
    value: float = Field(
        description="the fraction that gives the pool (SGLang's in thousandths, rounded up)")
    multiplies: str = Field(description="what the engine's rule multiplies it by, in words")


class RankFigures(Model):
    """The rank as vLLM's emulation left it, bytes."""

    total_bytes: Bytes = Field(description="the GPU's total memory")
    non_torch_bytes: Bytes = Field(description="non-torch memory at KV sizing (the host setup's model)")
    init_bytes: Bytes = Field(description="what init placed: weights, workspace, the step's inputs")
    activation_bytes: Bytes = Field(description="the profile pass's peak over init")


class EngineKnobs(Model):
    """The same rank under each engine's knob: each fraction that gives vLLM's KV pool."""

    pool_bytes: Bytes = Field(description=(
        "vLLM's KV pool for the alloc path at the request's utilization (allocator model)"))
    rank: RankFigures | None = Field(
        None, description="the rank's figures each rule reads (absent with no pool)")
    knobs: list[EngineKnob] = Field(description="one per engine with a memory fraction")
    note: str | None = Field(None, description="why there is no pool, when there is none")


class EngineLimit(Model):
    """One case's largest safe knobs under the engine (predicted)."""

    case: str = Field(description="the case: its path (`alloc`, `workspace`)")
    verdict: str = Field(description="the case's verdict at the plan's knobs")
    backend: str | None = Field(
        None, description="the engine's attention backend the case stands for (SGLang), or a "
                          "what-if the engine does not run")
    max_safe_tokens: int | None = Field(
        description=("the largest safe step tokens (the engine's `step_knob`), with `fraction` "
                     "pinned; null if not searched"))
    fraction: float | None = Field(
        None, description="the `fraction_knob` value `max_safe_tokens` holds with (the case's)")
    max_safe_tokens_rederived: int | None = Field(
        None, description=("the largest safe step tokens given alone, the fraction re-derived "
                           "from them by the engine's rule (SGLang without "
                           "mem_fraction_static); null where the fraction is given"))
    max_safe_fraction: float | None = Field(
        description=("the largest safe value of `fraction_knob` at `step_tokens`, null where the "
                     "engine has none"))


class EngineLimits(Model):
    """`plan --engine NAME`: the engine's largest safe knobs per case, on the allocator model,
    as `repro-oom --engine NAME --predict` searches them (CUDA graphs off)."""

    engine: str = Field(description="the engine (`mlamem/engines/`)")
    kernel: str = Field(description="the sparse decode kernel emulated")
    step_knob: str = Field(description=(
        "the engine's name for the step's tokens: `max_num_batched_tokens` (vLLM), "
        "`chunked_prefill_size` (SGLang)"))
    step_tokens: int = Field(description="the plan's step tokens, where the search starts")
    fraction_knob: str | None = Field(
        description="the memory fraction searched too (`mem_fraction_static`), or null")
    cases: list[EngineLimit]


class OnePlan(Model):
    """One rank's plan."""

    request: PlanRequest
    weights_bytes: Bytes = Field(description="the weights per rank")
    budget_bytes: Bytes = Field(
        description=(
            "what the KV cache and any reserve may use, by the rule above (no profile peak, no "
            "non-torch memory)"))
    k_bytes_per_token: Bytes = Field(description="k: KV bytes per token over all layers")
    w_bytes_per_token: Bytes = Field(description="w: fp8 context-MLA staging per attended token")
    gather_bytes_per_token: Bytes = Field(
        description="the BF16 full-gather (full_kv + full_k) per attended token")
    kv_len_cap_tokens: int = Field(description="L_cap = min(max_batch_size, max_num_tokens) × max_seq_len")
    gate_on: bool = Field(
        description="whether the reserve applies (block reuse on, chunked prefill off), and why")
    gate_reason: str = Field(
        description="whether the reserve applies (block reuse on, chunked prefill off), and why")
    pool_tokens_without_reserve: int = Field(description="the KV pool with no reserve, in tokens")
    fp8_reserve: Reserve
    full_reserve: Reserve
    vllm: VllmPlan | None = Field(description="null unless the scenario is sparse (has an indexer top-k)")
    engine_knobs: EngineKnobs | None = Field(
        None, description=(
            "sparse scenarios with a utilization: the fraction of each engine that gives vLLM's "
            "KV pool (absent in older files)"))
    engine_limits: EngineLimits | None = Field(
        None, description="with `--engine`: its largest safe knobs per case (absent otherwise)")


class PlanSweep(Model):
    name: str = Field(description="the swept variable as given, e.g. `max-seq-len`")
    values: list[int | float] = Field(
        description="its values, one plan each, in order (bytes for `gpu-memory`)")


class PlanFile(ResultFile):
    """`mlamem plan --format json`: one plan, or one per value of `--sweep`."""

    schema_: Literal["mlamem.plan/1"] = Field(alias="schema", description="`mlamem.plan/1`")
    command: str = Field(description="the command line that made it")
    scenario: PlanScenario
    sweep: PlanSweep | None = Field(description="null without `--sweep`")
    plans: list[OnePlan]


# mlamem.kernels/1 (mlamem kernels --format json)


class KernelOperationListing(Model):
    """What a kernel's adapter declares for one operation."""

    op: str = Field(description="the operation, e.g. `sparse-decode`")
    takes: str | None = Field(
        description="what the caller may pass in: `out`, `out, lse, accum`, `nothing`, or per "
                    "cache format (`bf16: out, fp8: nothing`); null when the adapter could not say")
    head_counts: list[int] = Field(description="the query head counts it runs natively")
    assumed: bool = Field(
        description="true where the kernel's schema cannot be read here, so the adapter's "
                    "declared facts are shown (the table's `*`)")
    error: str | None = Field(description="the adapter's one line when it could not answer")


class KernelListing(Model):
    """One registered kernel."""

    name: str = Field(description="the `--kernel` name")
    label: str = Field(description="how reports name it")
    help: str = Field(description="the registry's one line")
    operations: list[KernelOperationListing] = Field(description="in the registry's order")
    version: str | None = Field(description="the installed build's version; null when absent")
    available: bool = Field(description="it runs here")
    reason: str | None = Field(description="why not, naming the fix; null when available")


class KernelsFile(ResultFile):
    """`mlamem kernels --format json`: every registered kernel, as the table lists it."""

    schema_: Literal["mlamem.kernels/1"] = Field(alias="schema", description="`mlamem.kernels/1`")
    kernels: list[KernelListing] = Field(description="every registered kernel, in registry order")
    warnings: list[str] = Field(
        description="the plug-in warnings (a plug-in refused its name, unreadable metadata)")


# mlamem.bench/2 (benchmarks/triton_vs_flashmla.py --json)


class BenchEnvironment(Model):
    gpu: str = Field(description="the GPU and its SMs")
    sm_count: int = Field(description="the GPU and its SMs")
    torch: str = Field(description="the versions timed")
    triton: str | None = Field(description="the versions timed")
    flash_mla: str | None = Field(description="the versions timed")


class BenchRow(Model):
    """One call timed (part 1: 64 heads from each KV pool; part 2, `rank_rows`: a rank's heads)."""

    scenario: str | None = Field(
        None, description=(
            "the scenario whose per-rank heads these are: `glm5-fp8-tp8` (8) or `deepseek-v32-fp8-tp8` "
            "(16)"))
    kernel: str = Field(
        description=(
            "`FlashMLA`, or mlamem's kernel with its design and launch config, e.g. `mlamem "
            "gluon-bf16-scale block_n=64 warps=8 stages=1 (default)`"))
    tokens: int = Field(description="s_q")
    heads: int = Field(description="query heads of the call (64 in part 1)")
    pool: str = Field(
        description=(
            "the KV pool the indices point into: `l2` (4 x topk tokens, 5.4 MB) or `hbm` (4 GiB), and "
            "its tokens"))
    pool_tokens: int = Field(
        description=(
            "the KV pool the indices point into: `l2` (4 x topk tokens, 5.4 MB) or `hbm` (4 GiB), and "
            "its tokens"))
    ms: float = Field(description="median time per call (`triton.testing.do_bench`)")
    tflops: float = Field(
        description="attention FLOP/s, in TFLOP/s: 2 · s_q · heads · topk · (576 + 512) / time")
    gathered_tb_per_s: float = Field(description="gathered KV bytes per second, in TB/s")
    allocated_bytes: Bytes = Field(
        description=(
            "the allocator's peak during one call in allocating mode, above what was allocated before"))
    rel_l2_vs_flashmla: float | None = Field(
        None, description="out's relative L2 error against FlashMLA's (absent in FlashMLA's own row)")
    ratio_vs_flashmla: float | None = Field(
        None, description="TFLOP/s over FlashMLA's at the same s_q and pool")
    speedup_vs_flashmla_padded: float | None = Field(
        None, description=(
            "FlashMLA's padded call's time (pad included) over this call's: above 1, this call is "
            "faster"))


class LseRow(Model):
    """The largest absolute lse difference between each pair of one shape (`--lse`)."""

    tokens: int = Field(description="s_q of the compared call")
    heads: int = Field(description="its query heads")
    topk: int = Field(description="its sparse top-k")
    flashmla_vs_reference: float = Field(description="FlashMLA's lse against the fp32 computation")
    triton_vs_reference: float = Field(description="mlamem's kernel's lse against the fp32 computation")
    triton_vs_flashmla: float = Field(description="mlamem's kernel's lse against FlashMLA's")


class BenchFile(ResultFile):
    """`python3 benchmarks/triton_vs_flashmla.py --json FILE` (GPU only); version 1 files
    (reports/triton-h200) are the older shape: part 1 from the small pool only."""

    VERSION: ClassVar[int] = 2

    schema_: Literal["mlamem.bench/2"] = Field(alias="schema", description="`mlamem.bench/2`")
    topk: int = Field(description="the sparse top-k of every call")
    environment: BenchEnvironment
    rows: list[BenchRow]
    rank_rows: list[BenchRow]
    lse: list[LseRow]


FILES: tuple[type[ResultFile], ...] = (ProfileFile, ReproFile, GraphsFile, ValidateFile,
                                       CompareFile, BaselineFile, PlanFile, BenchFile)


# mlamem.explain/1


class FrameBytes(Model):
    """Bytes live at the snapshot's peak from one frame."""

    frame: str = Field(
        description=(
            "the innermost Python frame outside torch, mlamem and the kernel libraries, "
            "`file:line function` (else the innermost outside torch; `no frames` where the trace has none)"))
    bytes: Bytes = Field(description="the blocks live at the peak allocated there (rounded to 512)")
    allocations: int = Field(description="how many")


class SegmentBytes(Model):
    """Bytes live at the snapshot's peak in one segment."""

    address: int | None = Field(description="the segment's address (null: in no segment the snapshot names)")
    segment_bytes: MaybeBytes = Field(description="the segment's size")
    live_bytes: Bytes = Field(description="the blocks live in it at the peak")
    allocations: int = Field(description="how many")


class ImpliedShape(Model):
    """A T and padded head count at which the kernel allocates exactly the call's bytes."""

    op: str | None = Field(
        default=None,
        description="its operation, where the call's bytes fit more than one (else the call's `op`)")
    tokens: int = Field(
        description="the call's rows: T (sparse decode), requests b (dense decode), s_q (sparse prefill)")
    heads: int = Field(description="the padded heads q had in the kernel")
    requests: int | None = Field(default=None, description="dense decode: b, the requests (= `tokens`)")
    context_len: int | None = Field(
        default=None,
        description="dense decode: each request's context, the scenario's (its bytes do not depend on it)")
    kv_len: int | None = Field(
        default=None,
        description="sparse prefill: s_kv, the scenario's (its allocations do not depend on it)")

class CallBuffer(Model):
    """One allocation of a call found, named from the kernel's and path's spec."""

    name: str = Field(description="the buffer: `padded_q`, `out`, `lse`, ..., `o_accum`")
    requested_bytes: Bytes = Field(description="the bytes asked for")
    frame: str = Field(description="its frame, as `by_frame` names frames")
    live_at_peak: bool = Field(description="live at the snapshot's peak")


class Saving(Model):
    """What the workspace path saves on the call, from the predicted profile at its T."""

    op: str | None = Field(default=None, description="the operation profiled (null: sparse-decode)")
    tokens: int = Field(description="the rows profiled (T, b or s_q)")
    heads_per_rank: int = Field(description="the scenario's heads per rank")
    kernel: str = Field(description="the kernel profiled")
    alloc_peak_bytes: MaybeBytes = Field(description="the alloc path's predicted per-call peak")
    workspace_peak_bytes: MaybeBytes = Field(description="the workspace path's predicted per-call peak")
    saving_bytes: int = Field(description="alloc − workspace")
    removed_buffers: list[str] = Field(description="the buffers the workspace path does not allocate")
    saving_at_peak_bytes: Bytes = Field(
        description="of those, the bytes this call had live at the snapshot's peak (0 on the workspace path)")
    command: str = Field(description="the `mlamem profile` command that reproduces the call")


class FoundCall(Model):
    """One MLA kernel call found in the trace by its allocations."""

    first_event: int = Field(description="the trace event of its first allocation")
    op: str | None = Field(
        default=None, description="the operation whose allocations it matches (null: sparse-decode)")
    kernels: list[str] = Field(description="the kernels whose allocations it matches")
    path: str = Field(
        description="`alloc` (its padded q allocated just before), `workspace`, or `alloc or workspace` "
        "where both paths allocate the same buffers (no q to pad, no out= to stage)")
    implied: list[ImpliedShape] = Field(description="every (T, heads) its bytes fit")
    ambiguous: bool = Field(
        description="more than one (T, heads) fits: bytes fix only T × heads; `--scenario` fixes the heads")
    buffers: list[CallBuffer]
    live_at_peak_bytes: Bytes = Field(description="its blocks live at the snapshot's peak")
    saving: Saving | None = Field(
        description="null where no implied head count is the scenario's (give `--scenario`)")


class ExplainFile(ResultFile):
    """`mlamem explain --format json`: a PyTorch memory snapshot explained."""

    schema_: Literal["mlamem.explain/1"] = Field(alias="schema", description="`mlamem.explain/1`")
    command: str = Field(description="the command line that made it")
    snapshot: str = Field(description="the snapshot file read")
    created: str = Field(description="when it was made: UTC, ISO 8601")
    device: int = Field(description="the device whose trace is explained (the one with most events)")
    trace_events: int = Field(description="events in that device's trace")
    scenario: str = Field(description="the scenario giving the calls' dimensions")
    scenario_given: bool = Field(description="`--scenario` was given: its head count alone is tried")
    peak_bytes: Bytes = Field(description="the allocated peak (blocks rounded to 512)")
    peak_source: Literal["trace", "segments"] = Field(
        description="`trace`: replayed from the events; `segments`: what the segments held at the end")
    peak_event: int | None = Field(description="the trace event that reached the peak")
    reserved_bytes: Bytes = Field(description="the segments held when the snapshot was taken")
    by_frame: list[FrameBytes]
    by_segment: list[SegmentBytes]
    calls: list[FoundCall]
    notes: list[str] = Field(description="out-of-memory events and other caveats")


# mlamem.diff/1


class BufferChange(Model):
    """One named buffer (or, for snapshots, frame) in A and in B."""

    name: str = Field(
        description=(
            "the buffer's name (`padded_q`, `o_accum`, ...); between snapshots, an allocation of no "
            "MLA call found is named by its frame"))
    a_bytes: MaybeBytes = Field(
        description=(
            "its bytes in A (null: not in A): requested bytes in results; between snapshots, the "
            "blocks live at the peak (rounded to 512)"))
    b_bytes: MaybeBytes = Field(description="its bytes in B, the same figure (null: not in B)")
    change_bytes: int = Field(description="B − A, a missing side counting 0")


class DiffUnit(Model):
    """One case of A against its case in B: a profile's (scenario, T, path), a repro-oom case,
    a graphs capture, a snapshot's peak."""

    unit: str = Field(description="the case, as in A (or B where A lacks it)")
    a_label: str | None = Field(description="A's case (null: not in A)")
    b_label: str | None = Field(description="B's case (null: not in B)")
    a_peak_bytes: MaybeBytes = Field(
        description=(
            "A's peak: a profile's allocated peak, repro-oom's step peak, a capture's allocated "
            "peak, a snapshot's"))
    b_peak_bytes: MaybeBytes = Field(description="B's peak, the same figure")
    peak_change_bytes: int | None = Field(description="B − A (null where either is null)")
    buffers: list[BufferChange]


class EnvironmentChange(Model):
    """An environment field that differs, named as the gate names it."""

    name: str = Field(description="e.g. `kernel`, `measured`, `kernels.flashmla`, `torch`")
    a: str | int | None = Field(description="A's value")
    b: str | int | None = Field(description="B's value")
    blocking: bool = Field(description="the gate would refuse to compare across it")


class DiffFile(ResultFile):
    """`mlamem diff --format json`: two results of one kind, or two snapshots, compared."""

    schema_: Literal["mlamem.diff/1"] = Field(alias="schema", description="`mlamem.diff/1`")
    command: str = Field(description="the command line that made it")
    created: str = Field(description="when it was made: UTC, ISO 8601")
    kind: Literal["profile", "repro-oom", "graphs", "snapshot"] = Field(description="what A and B are")
    a: str = Field(description="file A")
    b: str = Field(description="file B")
    environment: list[EnvironmentChange]
    units: list[DiffUnit]
    peak_growth_bytes: int | None = Field(
        description="the largest peak change over the units (null: none paired)")
    fail_on_growth_bytes: MaybeBytes = Field(description="`--fail-on-growth` (null when not given)")
    failed: bool = Field(description="a peak grew by more than `fail_on_growth_bytes`")
