"""`mlamem.plan/1`: the model of its files, and the objects only it holds."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from mlamem.results.base import Model, Open, ResultFile
from mlamem.results.ledger import ServerLogLedger
from mlamem.results.shared import Bytes, CommandLine


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
    command: CommandLine = Field(description="the command line that made it")
    scenario: PlanScenario
    sweep: PlanSweep | None = Field(description="null without `--sweep`")
    plans: list[OnePlan]
    log: ServerLogLedger | None = Field(
        None, description="`--log`: the user's server log beside the rank repro-oom --predict "
                          "emulates for the scenario (absent without it)")


