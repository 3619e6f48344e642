"""sparse-prefill: s_q, the prefill tokens of one call (`--tokens`), against `--kv-len` gathered
bf16 KV tokens (default 4 x topk); its workspace holds max_num_batched_tokens.

Kernel layout: q (s_q, h_q, 576) bf16 over a gathered bf16 kv (s_kv, 1, 576) with indices
(s_q, 1, topk); out (s_q, h_q, d_v) bf16, lse (s_q, h_q) fp32 (max_logits too, not compared).
"""

from __future__ import annotations

from mlamem.operations.base import Operation, OpInputs, Problem, Scenario, generator
from mlamem.operations.sparse_decode import KV_POOL_TOPK_MULTIPLE


class SparsePrefill(Operation):
    name = "sparse-prefill"
    symbol = "s_q"
    quantity = "s_q, prefill tokens of one call"
    key, flag = "tokens", "--tokens"
    kv_key, kv_flag = "kv_len", "--kv-len"
    default_sweep = (1024, 8192, 16384, 32768)
    default_scenario = "glm5-fp8-tp8"
    kv_formats = ("bf16",)

    def default_kv_tokens(self, scenario: Scenario) -> int:
        return KV_POOL_TOPK_MULTIPLE * scenario.decode_topk

    def make_inputs(self, problem: Problem, heads: int, device, seed: int = 0):
        import torch

        g = generator(device, seed)
        kv = torch.randn((problem.kv_tokens, 1, problem.d_qk), dtype=torch.bfloat16,
                         device=device, **g)
        indices = torch.randint(0, problem.kv_tokens, (problem.rows, 1, problem.topk),
                                dtype=torch.int32, device=device, **g)
        q = torch.randn((problem.rows, heads, problem.d_qk), dtype=torch.bfloat16, device=device,
                        **g)
        return q, OpInputs(kv=kv, indices=indices)

    def describe(self, scenario_summary: dict, kv_tokens: int | None) -> str:
        return (f"topk {scenario_summary['topk']}, s_q prefill tokens against s_kv = {kv_tokens} "
                "bf16 KV tokens")


OPERATION = SparsePrefill()
