"""The context-phase workspace reserve carved out of a KV budget, and the admission cap it sets
(the TRT-LLM context-reuse PR's rule): per-token costs, the reserve and the split of requests.

Arithmetic on the scenario only, below the engines and the commands: `mlamem plan` and the
trtllm-context-reuse engine both read it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mlamem.spec.scenario import Scenario


def kv_bytes_per_token(scenario: Scenario) -> int:
    """k: KV-cache bytes per token over all layers (576 per layer for fp8 MLA, 656 fp8_ds_mla)."""
    return scenario.model.num_layers * scenario.kv_cache_bytes_per_token_per_layer


def staging_bytes_per_token(scenario: Scenario) -> int:
    """w: fp8 context-MLA K/V staging per attended token, 1 B per value."""
    m = scenario.model
    return scenario.heads_per_rank * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim)


def gather_bytes_per_token(scenario: Scenario) -> int:
    """BF16 full-gather per attended token on the reuse path: full_kv plus full_k."""
    m = scenario.model
    full_kv = m.qk_nope_head_dim + m.v_head_dim
    full_k = m.qk_nope_head_dim + m.qk_rope_head_dim
    return scenario.heads_per_rank * (full_kv + full_k) * 2


def kv_len_cap(max_batch_size: int, max_num_tokens: int, max_seq_len: int) -> int:
    """L_cap: the never-stall worst case of summed attended KV in one step."""
    return min(max_batch_size, max_num_tokens) * max_seq_len


def reserve_gate(block_reuse: bool, chunked_prefill: bool) -> tuple[bool, str]:
    """Whether the reserve applies, and why (the PR's gate)."""
    if not block_reuse:
        return False, ("off: without block reuse the attended KV is bounded by max_num_tokens, "
                       "which the profile run already covers")
    if chunked_prefill:
        return False, ("off: with chunked prefill each attention launch is bounded by its own "
                       "chunk buffer")
    return True, ("on: block reuse without chunked prefill lets the attended KV grow past "
                  "max_num_tokens")


@dataclass(frozen=True)
class Reserve:
    """A workspace reserve carved out of the KV budget, and what it leaves the pool."""

    bytes_per_token: int  # per attended token it charges (w, or w + BF16 gather)
    reserve_bytes: int
    clamped: bool  # True when budget x w / (k + w) bound it below w x L_cap
    admission_cap_tokens: int | None  # summed attended KV the scheduler admits; None = no cap
    pool_tokens: int
    capacity_change_percent: float  # pool against the pool without any reserve


def reserve(budget_bytes: int, k: int, per_token: int, l_cap: int, applies: bool,
            pool_without: int) -> Reserve:
    """The PR's reserve for one per-token charge; nothing when the gate is off."""
    if not applies or per_token == 0:
        return Reserve(per_token, 0, False, None, pool_without, 0.0)
    worst_case = per_token * l_cap
    clamp = budget_bytes * per_token // (k + per_token)
    amount = min(worst_case, clamp)
    pool = (budget_bytes - amount) // k
    return Reserve(per_token, amount, clamp < worst_case, amount // per_token, pool,
                   100.0 * (pool - pool_without) / pool_without)


def admit(attended_kv_tokens: Sequence[int], cap_tokens: int | None) -> tuple[list[int], list[int]]:
    """Split context requests into admitted and trimmed, in order, by summed attended KV.

    Always admits the first request (forward progress); no cap admits everything.
    """
    if cap_tokens is None:
        return list(range(len(attended_kv_tokens))), []
    admitted, total = [], 0
    for i, tokens in enumerate(attended_kv_tokens):
        if admitted and total + tokens > cap_tokens:
            return admitted, list(range(i, len(attended_kv_tokens)))
        admitted.append(i)
        total += tokens
    return admitted, []
