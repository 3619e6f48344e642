"""TensorRT-LLM's rank with block reuse: the context-MLA reuse OOM of PR #16399, one case per
reserve variant.

The estimator profiles fresh-prefill dummies, where a step's summed attended KV is about
max_num_tokens, and gives what is left to the KV pool. With block reuse, context requests attend
their cached prefixes, so the summed attended KV (and every buffer the context path builds per
attended token) grows far past what was profiled. The skeleton's phases:
- init: the weights;
- profile: the context buffers at max_num_tokens attended tokens, then freed;
- KV sizing: budget = free fraction x (cap - weights - profile peak); the variant's reserve
  (`context_reserve.reserve`) comes out of it and the rest is the KV pool, in whole blocks;
- step: max_batch_size context requests, each attending max_seq_len tokens, trimmed by the
  variant's admission cap (`context_reserve.admit`), build the context buffers for every attended token.
Variants: no reserve; the PR's fp8-only reserve (w); everything charged (w + BF16 gather).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from mlamem.engines.base import (
    Case,
    Engine,
    Knob,
    NoKVRoom,
    RankMemory,
    Step,
    allocate_specs,
)
from mlamem.kernels import BufferSpec
from mlamem.runtime.attribution import ExpectedBuffer
from mlamem.spec import context_reserve
from mlamem.spec.engines.trtllm import SPEC, VARIANTS
from mlamem.spec.errors import UserError
from mlamem.spec.scenario import Scenario


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
        BufferSpec("fp8_kv_staging", (t, context_reserve.staging_bytes_per_token(scenario)), torch.uint8,
                   "temporary"),
    ]


@dataclass(kw_only=True)
class ContextReuseCase(Case):
    """One reserve variant through the rank: the shared figures and the KV budget's."""

    key_field = "variant"

    variant: str  # one of VARIANTS
    budget_bytes: int | None = None  # free fraction x what profiling left
    reserve_bytes: int | None = None
    admission_cap_tokens: int | None = None
    kv_pool_bytes: int | None = None
    kv_pool_tokens: int | None = None
    requests_attended_tokens: list[int] = field(default_factory=list)
    admitted: list[int] = field(default_factory=list)  # request indices served this step
    trimmed: list[int] = field(default_factory=list)  # deferred by the admission cap
    attended_tokens: int | None = None  # summed attended KV of the admitted requests


class TRTLLMContextReuse(Engine):
    """TensorRT-LLM's context phase with block reuse; see the module docstring. The profile
    pass uses the scenario's max_num_batched_tokens (max_num_tokens); the budget's
    utilization is TRT-LLM's free_gpu_memory_fraction."""

    name, spec, view = SPEC.name, SPEC, SPEC.view
    case_type = ContextReuseCase
    kv_cache_name = "kv_pool"

    @classmethod
    def check(cls, scenario: Scenario) -> None:
        if not is_context_reuse(scenario):
            s = scenario.serving
            raise UserError(f"engine {cls.name} reproduces the context-MLA reuse OOM, which needs "
                            f"[serving] block_reuse = true and chunked_prefill = false; "
                            f"{scenario.name} has block_reuse = {str(s.block_reuse).lower()}, "
                            f"chunked_prefill = {str(s.chunked_prefill).lower()}")

    @classmethod
    def case_keys(cls, paths: list[str]) -> list[str]:
        return list(VARIANTS)

    @classmethod
    def knob_for_pool(cls, rank: RankMemory, pool_bytes: int) -> Knob:
        """budget = free_gpu_memory_fraction x (cap - init - profile peak), cap = total -
        non-torch; the pool is the budget when no reserve applies."""
        free = rank.total_bytes - rank.non_torch_bytes - rank.init_bytes - rank.activation_bytes
        return Knob(cls.name, "free_gpu_memory_fraction", pool_bytes / free,
                    "the memory free after the weights and the profile's peak")

    @classmethod
    def new_case(cls, key: str, budget: dict, *, measured: bool,
                 **fields) -> ContextReuseCase:
        return ContextReuseCase(variant=key, measured=measured, **fields)

    def init(self) -> None:
        self.allocating = "weights"
        self.resident.append(torch.empty(self.case.weights_bytes, dtype=torch.uint8,
                                         device=self.memory.device))

    def profile(self) -> None:
        self.allocating = "profile context buffers"
        allocate_specs(context_buffers(self.scenario, self.scenario.serving.max_num_batched_tokens),
                       self.memory.device)

    def size_kv_cache(self) -> int:
        scenario, case, s = self.scenario, self.case, self.scenario.serving
        free = case.torch_limit_bytes - self.memory.stats().allocated - case.profile_peak_bytes
        case.budget_bytes = int(self.budget.utilization * free)
        if case.budget_bytes <= 0:
            raise NoKVRoom("weights and profiling leave no KV budget")
        k = context_reserve.kv_bytes_per_token(scenario)
        per_token = {"none": 0, "fp8": context_reserve.staging_bytes_per_token(scenario),
                     "full": context_reserve.staging_bytes_per_token(scenario)
                     + context_reserve.gather_bytes_per_token(scenario)}[case.variant]
        l_cap = context_reserve.kv_len_cap(s.max_batch_size or s.max_num_batched_tokens,
                                 s.max_num_batched_tokens, s.max_model_len)
        reserve = context_reserve.reserve(case.budget_bytes, k, per_token, l_cap,
                                applies=case.variant != "none", pool_without=case.budget_bytes // k)
        case.reserve_bytes, case.admission_cap_tokens = (reserve.reserve_bytes,
                                                         reserve.admission_cap_tokens)
        case.kv_pool_tokens = reserve.pool_tokens // s.block_size * s.block_size
        case.kv_pool_bytes = case.kv_pool_tokens * k
        if case.kv_pool_bytes <= 0:
            raise NoKVRoom("no memory left for the KV pool")
        return case.kv_pool_bytes

    def step(self) -> Step:
        case, s, device = self.case, self.scenario.serving, self.memory.device
        case.requests_attended_tokens = [s.max_model_len] * (s.max_batch_size or 1)
        case.admitted, case.trimmed = context_reserve.admit(case.requests_attended_tokens,
                                                  case.admission_cap_tokens)
        case.attended_tokens = sum(case.requests_attended_tokens[i] for i in case.admitted)
        specs = context_buffers(self.scenario, case.attended_tokens)

        def body() -> None:
            allocate_specs(specs, device)

        return Step(body, [ExpectedBuffer(spec.name, spec.nbytes, "context path")
                           for spec in specs])


ENGINE = TRTLLMContextReuse
