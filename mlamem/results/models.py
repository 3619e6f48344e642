"""The result models: one `ResultFile` per JSON schema mlamem writes, and the objects they share.

Each model states what a file of its schema holds; `mlamem.results.read` checks a file against
it after its migrate steps. Files written before a field was recorded keep schema version 1: the
step for version 1 (`_legacy_*`) fills in what they lack, in one place, so no reader needs a
default for a missing key.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from mlamem.results.base import Migrate, Model, Open, ResultFile

SPARSE_DECODE = "sparse-decode"  # the operation of every file from before operations
LEGACY_KERNEL_FIELDS = {"flash_mla": "flashmla", "triton": "triton"}  # environment, before `kernels`
ENGINE_OF_MODE = {"decode": "vllm", "context-reuse": "trtllm-context-reuse"}  # repro, before `engine`

Bytes = int  # a byte count
MaybeBytes = int | None  # a byte count, null where the call failed or nothing was measured


# Objects shared by the schemas


class Environment(Model):
    """The machine and software a result was produced on; GPU fields are null without one."""

    gpu: str | None = Field(description="the GPU's name, e.g. `NVIDIA H200` (null: no GPU)")
    compute_capability: str | None = Field(description="e.g. `9.0`")
    sm_count: int | None = Field(description="the GPU's streaming multiprocessors")
    gpu_memory_bytes: MaybeBytes = Field(description="the GPU's total memory")
    driver: str | None = Field(description="the NVIDIA driver version")
    cuda: str | None = Field(description="the CUDA version torch was built with")
    torch: str = Field(description="torch's version")
    mlamem: str = Field(description="mlamem's version")
    python: str = Field(description="Python's version")
    allocator_conf: str | None = Field(
        description="PYTORCH_CUDA_ALLOC_CONF (null: unset; the allocator model assumes the default)")
    kernels: dict[str, str | None] = Field(
        description="every registered kernel -> its adapter's version (null: its library is absent)")


class Scenario(Open):
    """The scenario a result ran (`mlamem scenarios` lists them); further keys by kind."""

    name: str = Field(description="the scenario's name, or its TOML file's stem")
    model: str | None = Field(None, description="the model, e.g. `GLM-5`")
    source: str | None = Field(None, description="where the scenario's figures come from")
    heads_per_rank: int | None = Field(None, description="query heads per rank")
    padded_heads: int | None = Field(None, description="heads the kernel is called with (padded)")
    topk: int | None = Field(None, description="KV tokens each query attends to (sparse)")
    d_qk: int | None = Field(None, description="the query/key head dimension")
    d_v: int | None = Field(None, description="the value head dimension")
    max_num_batched_tokens: int | None = Field(None, description="tokens per step: sizes the workspace")
    kv_cache_dtype: str | None = Field(None, description="`fp8_ds_mla` or `fp8`")


class Kernel(Open):
    """The kernel adapter that ran (`mlamem kernels`); further keys: its capabilities."""

    name: str = Field(description="the registry name, e.g. `flashmla`")
    label: str = Field(description="how tables name it")
    version: str | None = Field(None, description="the kernel library's version (null: absent)")
    sm_count: int | None = Field(None, description="the SM count the allocation rules used")
    head_counts: list[int] | None = Field(None, description="head counts the kernel runs natively")


class Buffer(Model):
    """One allocation inside a call, named from the path's and kernel's allocation spec."""

    name: str = Field(description="`padded_q`, `out`, `o_accum`, ..., or `unattributed`")
    allocated_by: str = Field(description="`wrapper`, `kernel`, `engine`, `context path` or `unknown`")
    requested_bytes: Bytes = Field(description="the bytes asked for")
    block_bytes: Bytes = Field(description="the bytes the allocator counts (rounded up to 512)")
    segment_bytes: Bytes = Field(description="new device memory reserved for it (0: a cached block)")
    live_at_peak: bool = Field(description="still allocated at the call's allocated peak")
    removed_by_workspace: bool | None = Field(
        None, description="alloc path: whether the workspace path removes it (null otherwise)")


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
    tokens: int = Field(description="the swept value: T (s_q of the decode call), b or s_q")
    path: str = Field(description="`alloc`, `workspace` or `workspace-full`")
    measured: bool = Field(description="false when predicted")
    peak_allocated_bytes: MaybeBytes = Field(description="max_memory_allocated delta over the call")
    peak_reserved_bytes: MaybeBytes = Field(
        description="max_memory_reserved delta over the call, from a cold cache")
    nvml_peak_bytes: MaybeBytes = Field(description="NVML device-used delta (predicted: reserved)")
    wall_time_ms: float | None = Field(description="host wall time of the call, synchronized")
    outputs_equal: bool | None = Field(description="out and lse bit-identical across this T's paths")
    staged: list[str] = Field(description="the buffers taken from the workspace")
    allocations_in_call: int | None = Field(description="allocations inside the call (0: graph-safe)")
    bytes_allocated_in_call: MaybeBytes = Field(description="their requested bytes")
    buffers: list[Buffer] = Field(description="the breakdown of the call's allocations")
    breakdown_peak_bytes: MaybeBytes = Field(description="the sum of the buffers live at the peak")
    missing_buffers: list[str] = Field(description="expected buffers never allocated")
    oom: bool = Field(description="the call ran out of memory")
    oom_requested_bytes: MaybeBytes = Field(description="the request that failed")
    failure: str | None = Field(description="the failed call's error line")
    op: str = Field(description="the row's operation")
    requests: int | None = Field(description="dense decode: b, the requests of the step")
    kv_tokens: int | None = Field(description="KV tokens each query sees")
    median_ms: float | None = Field(description="do_bench median of the path's call (`--bench`)")


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

    schema_: Literal["mlamem.profile/1"] = Field(alias="schema")
    command: str = Field(description="the command line that made it")
    measured: bool = Field(description="false: every figure is PREDICTED by the allocator model")
    not_measured_reason: str | None = Field(description="why nothing was measured")
    scenario: Scenario
    kernel: Kernel
    environment: Environment
    rows: list[ProfileRow]
    notes: list[str] = Field(description="what could not be staged, and why, and other caveats")
    created: str | None = Field(description="when it was made: UTC, ISO 8601")
    op: str = Field(description="the operation: `sparse-decode`, `dense-decode` or `sparse-prefill`")
    shard: str | None = Field(description="`I/N` when the file is shard I of N of a sweep")


# mlamem.repro-oom/1


class Budget(Open):
    """The memory budget the engine was emulated with."""

    gpu_memory_bytes: Bytes = Field(description="the target GPU's memory (`--gpu-memory`)")
    utilization: float = Field(description="the engine's GPU memory utilization")
    max_num_batched_tokens: int | None = Field(None, description="tokens per step")
    requested_bytes: Bytes = Field(description="utilization x total")


class ReproCase(Open):
    """One case of the engine (vLLM: a path; TRT-LLM context reuse: a reserve variant); its
    other keys are the engine's case fields (`engine.case_type`)."""

    measured: bool = Field(description="false when predicted")
    verdict: str = Field(description="`fits`, `oom`, `no-kv-room`, `error` or `crashed`")
    phase: str = Field(description="how far it got: `init`, `profile`, ..., `step`, `done`")
    buffers: list[Buffer] = Field([], description="the step's allocations")


class NonTorchModule(Model):
    """A module loaded lazily on a first launch, and its device memory."""

    name: str
    bytes: Bytes
    loaded_by: list[str] = Field(description="aten op names (`aten.new_zeros`) or `<kernel>.decode`")


class NonTorch(Model):
    """The host setup the non-torch memory model was measured on (mlamem/non_torch.toml)."""

    gpu: str = Field(description="the host GPU, e.g. `NVIDIA H200`")
    gpu_memory_bytes: Bytes = Field(description="its total memory: the limit the emulation keeps to")
    torch: str
    cuda: str
    kernel: str = Field(description="the kernel library the process had loaded")
    kernel_version: str | None
    process_bytes: Bytes = Field(description="device memory the process holds before its CUDA context")
    context_bytes: Bytes = Field(description="the CUDA context, CUDA libraries and the kernel library")
    command: str = Field(description="the command that measured these figures")
    measured_on: str
    modules: list[NonTorchModule]
    unallocatable_bytes: Bytes = Field(
        description="near a full device, what cudaMalloc cannot hand out beyond NVML's reading")
    assumed: str | None = Field(description="why this record stands in for the host (null: it matches)")


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

    schema_: Literal["mlamem.repro-oom/1"] = Field(alias="schema")
    command: str = Field(description="the command line that made it")
    measured: bool = Field(description="false: every verdict is PREDICTED")
    not_measured_reason: str | None = Field(description="why nothing was measured")
    engine: str = Field(description="the engine emulated, e.g. `vllm` or `trtllm-context-reuse`")
    scenario: Scenario
    kernel: Kernel
    budget: Budget
    environment: Environment
    cases: list[ReproCase]
    notes: list[str] = Field(description="lines on the budget, the non-torch model and other caveats")
    non_torch: NonTorch | None = Field(description="the host setup non-torch memory was taken from")
    created: str | None = Field(description="when it was made: UTC, ISO 8601")


# mlamem.graphs/1


class Capture(Model):
    """One capture at `tokens`; bytes are deltas over the state just before it."""

    tokens: int = Field(description="the capture size")
    peak_allocated_bytes: MaybeBytes = Field(description="the peak inside the capture")
    peak_reserved_bytes: MaybeBytes
    pool_growth_bytes: MaybeBytes = Field(description="new segments, after its outputs were released")
    held_bytes: MaybeBytes = Field(description="still allocated after its outputs were released")
    device_growth_bytes: MaybeBytes = Field(description="mem_get_info's growth (measured only)")
    replay_equal: bool | None = Field(description="the replay's out and lse equal the eager call's")
    buffers: list[Buffer]
    failure: str | None = Field(description="one line, when the warm-up or the capture failed")
    oom: bool
    oom_requested_bytes: MaybeBytes


class Estimate(Model):
    """vLLM's rule on two samples: first + max(second, 1 MiB) x (graphs - 1)."""

    source: str = Field(description="`device` (mem_get_info, as vLLM) or `allocator` (reserved growth)")
    first_bytes: Bytes
    second_bytes: Bytes
    per_graph_bytes: Bytes = Field(description="max(second, 1 MiB)")
    graphs: int
    estimate_bytes: Bytes
    actual_bytes: Bytes = Field(description="what the whole list took, by the same measure")
    error_bytes: int = Field(description="estimate - actual")
    error_percent: float | None = Field(description="of actual")


class GraphPath(Model):
    """One path captured at every size of the list, into one pool."""

    path: str
    staged: list[str]
    captures: list[Capture]
    pool_bytes: MaybeBytes = Field(description="reserved growth over all captures: the pool")
    held_bytes: MaybeBytes = Field(description="allocated after all captures, outputs released")
    device_bytes: MaybeBytes = Field(description="mem_get_info growth over all captures")
    unexplained_device_bytes: int | None = Field(description="device - pool")
    estimates: list[Estimate]
    failure: str | None = Field(description="the first capture that failed, in one line")


class Serving(Model):
    """vLLM's CUDA-graph settings the capture list came from."""

    max_num_seqs: int
    max_cudagraph_capture_size: int | None
    cudagraph_mode: str
    num_speculative_tokens: int


def _legacy_graphs(data: dict) -> dict:
    """Graphs files from before `created` and `notes`."""
    return _with_environment(_filled(data, {"notes": [], "created": None}))


class GraphsFile(ResultFile):
    """`mlamem graphs --format json`: per path, one call captured at every size of the list."""

    MIGRATIONS: ClassVar[dict[int, Migrate]] = {1: _legacy_graphs}

    schema_: Literal["mlamem.graphs/1"] = Field(alias="schema")
    command: str
    measured: bool
    not_measured_reason: str | None
    scenario: Scenario
    kernel: Kernel
    op: str
    capture_sizes: list[int] = Field(description="largest first, as captured")
    capture_sizes_source: str
    serving: Serving
    environment: Environment
    paths: list[GraphPath]
    notes: list[str]
    created: str | None


# mlamem.validate/1


class Comparison(Model):
    """One figure, predicted and measured, in bytes."""

    scenario: str
    tokens: int = Field(description="the swept value (graphs: the capture size, 0 the whole list)")
    path: str
    item: str = Field(description="a buffer name, or `total`")
    metric: str = Field(description="`allocated` or `reserved`")
    predicted: MaybeBytes
    measured: MaybeBytes
    difference: int | None = Field(description="measured - predicted")
    op: str = Field(description="the operation, or `graphs`")


def _legacy_validate(data: dict) -> dict:
    """Validate files from before operations (sparse decode), `environment`, `created`, `shard`."""
    data = _with_environment(_filled(data, {"environment": None, "created": None, "shard": None}))
    return {**data, "comparisons": _each(data.get("comparisons"), {"op": SPARSE_DECODE})}


class ValidateFile(ResultFile):
    """`mlamem validate --format json`: one comparison per (scenario, value, path, item, metric)."""

    MIGRATIONS: ClassVar[dict[int, Migrate]] = {1: _legacy_validate}

    schema_: Literal["mlamem.validate/1"] = Field(alias="schema")
    command: str
    agrees: bool = Field(description="every figure equal")
    comparisons: list[Comparison]
    environment: Environment | None
    created: str | None
    shard: str | None


# mlamem.compare/1


class ReferenceDifference(Model):
    """One kernel's output against the torch reference (float32 math, bf16 out)."""

    out_max_abs: float
    out_rel_l2: float
    lse_max_abs: float


class CompareRow(Model):
    """One (value, path): the two kernels' outputs side by side."""

    tokens: int
    path: str
    out_equal: bool
    lse_equal: bool
    out_max_diff: float
    lse_max_diff: float
    errors: dict[str, ReferenceDifference | None] = Field(description="kernel name -> vs the reference")


def _legacy_compare(data: dict) -> dict:
    """Compare files from before `notes`."""
    return _with_environment(_filled(data, {"notes": []}))


class CompareFile(ResultFile):
    """`mlamem compare --format json`: the same inputs through two kernels."""

    MIGRATIONS: ClassVar[dict[int, Migrate]] = {1: _legacy_compare}

    schema_: Literal["mlamem.compare/1"] = Field(alias="schema")
    command: str
    op: str
    scenario: str
    kernels: list[Kernel]
    kv_tokens: int
    rows: list[CompareRow]
    environment: Environment
    created: str
    notes: list[str]


# mlamem.baseline/1


class Sweep(Model):
    """The sweep a baseline was made from, so a bare rerun repeats it."""

    scenarios: list[str] = Field(description="names or TOML paths, as given")
    ops: list[str] | None = Field(None, description="the operations (absent: sparse-decode)")
    tokens: list[int] = Field(description="T and s_q values")
    requests: list[int] | None = Field(None, description="dense decode's b values")
    paths: list[str]
    kernel: str | None = Field(None, description="the kernel (absent: the default one)")


class CaseFigures(Model):
    """The gated figures of one (scenario, op, swept value, path); null where the call failed."""

    scenario: str
    op: str
    tokens: int
    requests: int | None = None
    kv_tokens: int | None = None
    path: str
    peak_allocated_bytes: MaybeBytes
    peak_reserved_bytes: MaybeBytes
    bytes_allocated_in_call: MaybeBytes
    buffers: dict[str, int] = Field(description="buffer name -> requested bytes")
    failure: str | None


def _legacy_baseline(data: dict) -> dict:
    """Baselines from before operations: every case is sparse decode."""
    data = _with_environment(data)
    return {**data, "cases": _each(data.get("cases"), {"op": SPARSE_DECODE})}


class BaselineFile(ResultFile):
    """`mlamem gate --update`: a sweep's gated figures and where they were made."""

    MIGRATIONS: ClassVar[dict[int, Migrate]] = {1: _legacy_baseline}

    schema_: Literal["mlamem.baseline/1"] = Field(alias="schema")
    command: str
    measured: bool
    not_measured_reason: str | None
    environment: Environment
    sweep: Sweep
    cases: list[CaseFigures]


# mlamem.plan/1


class Reserve(Model):
    """A workspace reserve carved out of the KV budget, and what it leaves the pool."""

    bytes_per_token: Bytes
    reserve_bytes: Bytes
    clamped: bool
    admission_cap_tokens: int | None
    pool_tokens: int
    capacity_change_percent: float


class PlanRequest(Open):
    """What the plan was asked for (the scenario's values, overridden by the flags)."""

    gpu_memory_bytes: Bytes


class VllmPlan(Model):
    """Sparse scenarios: what vLLM's side of the plan needs, per call and for the prefill."""

    kernel: str
    max_num_batched_tokens: int
    headroom_bytes: Bytes = Field(description="what the utilization leaves outside the KV budget")
    per_call_need_bytes: dict[str, Bytes] = Field(description="path -> one decode call's peak need")
    per_call_fits: dict[str, bool] = Field(description="path -> whether it fits the headroom")
    prefill_workspace_bytes: Bytes
    prefill_workspace_fits: bool


class PlanScenario(Model):
    name: str
    model: str
    heads_per_rank: int
    num_layers: int
    kv_cache_dtype: str
    kv_bytes_per_token_per_layer: Bytes
    weights_note: str


class OnePlan(Model):
    """One rank's plan."""

    request: PlanRequest
    weights_bytes: Bytes
    budget_bytes: Bytes
    k_bytes_per_token: Bytes
    w_bytes_per_token: Bytes
    gather_bytes_per_token: Bytes
    kv_len_cap_tokens: int
    gate_on: bool
    gate_reason: str
    pool_tokens_without_reserve: int
    fp8_reserve: Reserve
    full_reserve: Reserve
    vllm: VllmPlan | None


class PlanSweep(Model):
    name: str
    values: list[int | float]


class PlanFile(ResultFile):
    """`mlamem plan --format json`: one plan, or one per value of `--sweep`."""

    schema_: Literal["mlamem.plan/1"] = Field(alias="schema")
    command: str
    scenario: PlanScenario
    sweep: PlanSweep | None
    plans: list[OnePlan]


# mlamem.bench/2 (benchmarks/triton_vs_flashmla.py --json)


class BenchEnvironment(Model):
    gpu: str = Field(description="the GPU")
    sm_count: int = Field(description="its SMs")
    torch: str
    triton: str | None
    flash_mla: str | None


class BenchRow(Model):
    """One call timed (part 1: 64 heads from each KV pool; part 2, `rank_rows`: a rank's heads)."""

    scenario: str | None = Field(None, description="part 2: the scenario whose per-rank heads these are")
    kernel: str = Field(description="`FlashMLA`, or mlamem's kernel with its design and launch config")
    tokens: int = Field(description="s_q")
    heads: int = Field(description="query heads of the call")
    pool: str = Field(description="the KV pool the indices point into: `l2` (4 x topk tokens) or `hbm`")
    pool_tokens: int
    ms: float = Field(description="median time per call (`triton.testing.do_bench`)")
    tflops: float = Field(description="2 * s_q * heads * topk * (576 + 512) / time, in TFLOP/s")
    gathered_tb_per_s: float = Field(description="gathered KV bytes per second, in TB/s")
    allocated_bytes: Bytes = Field(description="the allocator's peak during one call, above the start")
    rel_l2_vs_flashmla: float | None = Field(None, description="out's relative L2 error against FlashMLA's")
    ratio_vs_flashmla: float | None = Field(None, description="part 1: TFLOP/s over FlashMLA's")
    speedup_vs_flashmla_padded: float | None = Field(
        None, description="part 2: FlashMLA's padded call's time (pad included) over this call's")


class LseRow(Model):
    """The largest absolute lse difference between each pair of one shape (`--lse`)."""

    tokens: int
    heads: int
    topk: int
    flashmla_vs_reference: float
    triton_vs_reference: float
    triton_vs_flashmla: float


class BenchFile(ResultFile):
    """`python3 benchmarks/triton_vs_flashmla.py --json FILE` (GPU only); version 1 files
    (reports/triton-h200) are the older shape: part 1 from the small pool only."""

    VERSION: ClassVar[int] = 2

    schema_: Literal["mlamem.bench/2"] = Field(alias="schema")
    topk: int = Field(description="the sparse top-k of every call")
    environment: BenchEnvironment
    rows: list[BenchRow]
    rank_rows: list[BenchRow]
    lse: list[LseRow]


FILES: tuple[type[ResultFile], ...] = (ProfileFile, ReproFile, GraphsFile, ValidateFile,
                                       CompareFile, BaselineFile, PlanFile, BenchFile)
