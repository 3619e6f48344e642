"""The context-MLA reuse OOM of TensorRT-LLM PR #16399, emulated for one rank.

The estimator profiles fresh-prefill dummies, where a step's summed attended KV is about
max_num_tokens, and gives what is left to the KV pool. With block reuse, context requests attend
their cached prefixes, so the summed attended KV (and every buffer the context path builds per
attended token) grows far past what was profiled. In order:
1. cap torch at the target GPU less non-torch memory; place the weights;
2. profile: the context buffers at max_num_tokens attended tokens, then free them;
3. budget = free fraction x (cap - weights - profile peak); carve out the variant's reserve
   (`plan.reserve`) and give the rest to the KV pool, in whole blocks;
4. a step of max_batch_size context requests, each attending max_seq_len tokens, trimmed by the
   variant's admission cap (`plan.admit`), builds the context buffers for every attended token.
Variants: no reserve; the PR's fp8-only reserve (w); everything charged (w + BF16 gather).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from mlamem import plan as plans
from mlamem.attribution import ExpectedBuffer
from mlamem.engine import (
    ERROR,
    NO_KV_ROOM,
    allocate_specs,
    non_torch_now,
    record_failure,
    run_step,
)
from mlamem.kernels import BufferSpec
from mlamem.scenario import Scenario

VARIANTS = ("none", "fp8", "full")  # no reserve, the PR's fp8-only reserve, everything charged
VARIANT_LABELS = {"none": "no reserve", "fp8": "fp8-only reserve (the PR)",
                  "full": "everything charged (plan's reserve)"}


def is_context_reuse(scenario: Scenario) -> bool:
    """Whether the scenario serves with block reuse and without chunked prefill."""
    return scenario.serving.block_reuse and not scenario.serving.chunked_prefill


def context_buffers(scenario: Scenario, attended_tokens: int) -> list[BufferSpec]:
    """What the reuse path builds per step, for `attended_tokens` summed attended KV."""
    m, heads, t = scenario.model, scenario.heads_per_rank, attended_tokens
    return [
        BufferSpec("gathered_latent", (t, scenario.d_qk), torch.bfloat16, "temporary"),
        BufferSpec("full_kv", (t, heads, m.qk_nope_head_dim + m.v_head_dim), torch.bfloat16,
                   "temporary"),
        BufferSpec("full_k", (t, heads, m.qk_nope_head_dim + m.qk_rope_head_dim), torch.bfloat16,
                   "temporary"),
        BufferSpec("fp8_kv_staging", (t, plans.staging_bytes_per_token(scenario)), torch.uint8,
                   "temporary"),
    ]


@dataclass
class ContextCase:
    """One reserve variant through one emulated rank. Bytes are absolute."""

    variant: str
    measured: bool
    verdict: str = ERROR  # as in mlamem.engine: fits, oom, no-kv-room, error, crashed
    phase: str = "init"
    torch_limit_bytes: int | None = None
    non_torch_bytes: int | None = None
    weights_bytes: int = 0
    profile_peak_bytes: int | None = None
    budget_bytes: int | None = None  # free fraction x what profiling left
    reserve_bytes: int | None = None
    admission_cap_tokens: int | None = None
    kv_pool_bytes: int | None = None
    kv_pool_tokens: int | None = None
    requests_attended_tokens: list[int] = field(default_factory=list)
    admitted: list[int] = field(default_factory=list)  # request indices served this step
    trimmed: list[int] = field(default_factory=list)  # deferred by the admission cap
    attended_tokens: int | None = None  # summed attended KV of the admitted requests
    step_peak_bytes: int | None = None
    headroom_bytes: int | None = None
    oom_requested_bytes: int | None = None
    oom_buffer: str | None = None
    oom_allocated_by: str | None = None
    free_bytes_at_oom: int | None = None
    failure: str | None = None
    buffers: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def emulate_context(memory, scenario: Scenario, variant: str, gpu_memory_bytes: int,
                    free_fraction: float) -> ContextCase:
    """Run one variant; see the module docstring."""
    case = ContextCase(variant=variant, measured=memory.measured,
                       weights_bytes=scenario.parallel.weights_bytes)
    with memory:
        _run(memory, scenario, case, gpu_memory_bytes, free_fraction)
    return case


def _run(memory, scenario, case, gpu_memory_bytes, free_fraction) -> None:
    s = scenario.serving
    resident: list[torch.Tensor] = []
    before = memory.stats()
    allocating = "weights"
    try:
        case.torch_limit_bytes = memory.set_limit(gpu_memory_bytes - non_torch_now(memory))
        resident.append(torch.empty(case.weights_bytes, dtype=torch.uint8, device=memory.device))

        case.phase, allocating = "profile", "profile context buffers"
        memory.reset_peaks()
        start = memory.stats().allocated
        allocate_specs(context_buffers(scenario, s.max_num_batched_tokens), memory.device)
        case.profile_peak_bytes = memory.stats().peak_allocated - start
        memory.empty_cache()

        case.phase, allocating = "kv-cache", "kv_pool"
        case.non_torch_bytes = non_torch_now(memory)
        case.torch_limit_bytes = memory.set_limit(gpu_memory_bytes - case.non_torch_bytes)
        free = case.torch_limit_bytes - memory.stats().allocated - case.profile_peak_bytes
        case.budget_bytes = int(free_fraction * free)
        if case.budget_bytes <= 0:
            case.verdict, case.failure = NO_KV_ROOM, "weights and profiling leave no KV budget"
            return
        k = plans.kv_bytes_per_token(scenario)
        per_token = {"none": 0, "fp8": plans.staging_bytes_per_token(scenario),
                     "full": plans.staging_bytes_per_token(scenario)
                     + plans.gather_bytes_per_token(scenario)}[case.variant]
        l_cap = plans.kv_len_cap(s.max_batch_size or s.max_num_batched_tokens,
                                 s.max_num_batched_tokens, s.max_model_len)
        pool_without = case.budget_bytes // k
        reserve = plans.reserve(case.budget_bytes, k, per_token, l_cap,
                                applies=case.variant != "none", pool_without=pool_without)
        case.reserve_bytes, case.admission_cap_tokens = (reserve.reserve_bytes,
                                                         reserve.admission_cap_tokens)
        block_tokens = s.block_size
        case.kv_pool_tokens = reserve.pool_tokens // block_tokens * block_tokens
        case.kv_pool_bytes = case.kv_pool_tokens * k
        if case.kv_pool_bytes <= 0:
            case.verdict, case.failure = NO_KV_ROOM, "no memory left for the KV pool"
            return
        resident.append(torch.empty(case.kv_pool_bytes, dtype=torch.uint8, device=memory.device))
    except Exception as exc:
        record_failure(case, exc, memory, before.num_ooms, allocating)
        return

    case.requests_attended_tokens = [s.max_model_len] * (s.max_batch_size or 1)
    case.admitted, case.trimmed = plans.admit(case.requests_attended_tokens,
                                              case.admission_cap_tokens)
    case.attended_tokens = sum(case.requests_attended_tokens[i] for i in case.admitted)
    specs = context_buffers(scenario, case.attended_tokens)
    expected = [ExpectedBuffer(spec.name, spec.nbytes, "context path") for spec in specs]
    run_step(memory, case, expected, lambda: allocate_specs(specs, memory.device))
