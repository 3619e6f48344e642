"""dense-decode: b, the requests of one decode step, one query each (`--requests`, JSON key
`requests`; `tokens` = b too), each over `--context-len` tokens of a paged cache; its workspace
holds max_batch_size requests.

Kernel layout: q (b, 1, h_q, 576) (bf16, or fp8 e4m3 over an fp8 cache), a paged cache
(num_blocks, block, 1, 576) bf16 or fp8 with a block table (b, blocks) and context lengths
(b,); out (b, 1, h_q, d_v) bf16, lse (b, h_q, 1) fp32.
"""

from __future__ import annotations

from mlamem.operations.base import (
    Operation,
    OpInputs,
    Problem,
    Scenario,
    decode_token_limit,
    generator,
)
from mlamem.spec.errors import UserError
from mlamem.spec.units import MAX_BYTES, MAX_TOKENS, format_huge


def random_fp8_(cache, generator: dict):
    """Fill a uint8 tensor in place with finite fp8 e4m3 bit patterns of magnitude 1/4 to
    15/8, either sign (no temporaries: the cache is drawn at its full size); returns it."""
    cache.random_(0, 256, **generator)
    return cache.bitwise_and_(0x9F).bitwise_or_(0x28)  # exponent bits 0b01?1: 2^-2 or 2^0


class DenseDecode(Operation):
    name = "dense-decode"
    symbol = "b"
    quantity = "b, requests of one decode step (one query each)"
    key, flag = "requests", "--requests"
    kv_key, kv_flag = "context_len", "--context-len"
    default_sweep = (16, 64, 128, 256)
    default_scenario = "kimi-k2-dense-tp4-dp"
    kv_formats = ("bf16", "fp8")  # plain caches of d_qk = 576 values per token
    sparse = False
    workspace_bound = "max_batch_size"
    reads_scenario_cache = True
    serving_fields = ("max_batch_size", "decode_context_len")
    _MEANINGS = {"max_batch_size": "requests per decode step",
                 "decode_context_len": "context tokens of each request"}

    def serving_problem(self, scenario: Scenario) -> tuple[str, str] | None:
        """A plain cache, and the batch and context it runs."""
        s, m = scenario.serving, scenario.model
        if s.kv_cache_dtype not in self.kv_formats:
            return ("kv_cache_dtype", f"is {s.kv_cache_dtype!r}; {self.name} reads a plain cache "
                    f"of {m.kv_lora_rank + m.qk_rope_head_dim} values per token: set it to "
                    f"{' or '.join(repr(d) for d in self.kv_formats)}")
        for name in self.serving_fields:
            if getattr(s, name) is None:
                return (name, f"is required for {self.name} ({self._MEANINGS[name]}): set it, or "
                        f"drop {self.name} from operations")
        return None

    def workspace_refusal(self, scenario: Scenario, rows: int, fix: str) -> str:
        return (f"{rows} requests exceed {scenario.name}'s max_batch_size="
                f"{scenario.serving.max_batch_size}, which sizes the workspace; lower them or "
                "drop the workspace paths")

    def default_kv_tokens(self, scenario: Scenario) -> int:
        return scenario.serving.decode_context_len

    def kv_format(self, scenario: Scenario) -> str:
        """The scenario's own cache."""
        if scenario.serving.kv_cache_dtype not in self.kv_formats:
            raise UserError(f"{scenario.name}: {self.name} reads a {' or '.join(self.kv_formats)} "
                            f"cache, not [serving].kv_cache_dtype "
                            f"{scenario.serving.kv_cache_dtype!r}")
        return scenario.serving.kv_cache_dtype

    def q_dtype(self, kv_format: str) -> str:
        return "float8_e4m3fn" if kv_format == "fp8" else "bfloat16"

    def kernel_shape(self, rows_shape):
        return (rows_shape[0], 1, *rows_shape[1:])

    def from_kernel_layout(self, out, lse):
        return out[:, 0], lse[:, :, 0].T

    def make_inputs(self, problem: Problem, heads: int, device, seed: int = 0):
        import torch

        g = generator(device, seed)
        blocks = -(-problem.kv_tokens // problem.block_size)  # per request
        shape = (problem.rows * blocks, problem.block_size, 1, problem.d_qk)
        if problem.kv_format == "fp8":
            kv = random_fp8_(torch.empty(shape, dtype=torch.uint8, device=device), g).view(
                torch.float8_e4m3fn)
        else:
            kv = torch.randn(shape, dtype=torch.bfloat16, device=device, **g)
        table = torch.randperm(problem.rows * blocks, dtype=torch.int32, device=device, **g)
        inputs = OpInputs(kv=kv, block_table=table.view(problem.rows, blocks),
                          seqlens=torch.full((problem.rows,), problem.kv_tokens,
                                             dtype=torch.int32, device=device))
        if problem.kv_format == "fp8":  # per-tensor scales: 1, so the fp8 values are the data
            inputs.descale_q = torch.ones((1,), dtype=torch.float32, device=device)
            inputs.descale_k = torch.ones((1,), dtype=torch.float32, device=device)
        q = torch.randn((problem.rows, heads, problem.d_qk), dtype=torch.bfloat16, device=device,
                        **g)
        return q, inputs

    def check_kv_tokens(self, scenario: Scenario, values, kv_tokens: int | None = None) -> None:
        """Also b requests whose paged cache cannot exist: b x blocks int32 block ids, within
        256 TiB."""
        super().check_kv_tokens(scenario, values, kv_tokens)
        context = kv_tokens or self.default_kv_tokens(scenario)
        block = scenario.serving.block_size
        blocks = -(-context // block)  # pages per request
        per_request = blocks * block * scenario.d_qk * (2 if self.kv_format(scenario) == "bf16"
                                                        else 1)
        largest = min(MAX_TOKENS // blocks, MAX_BYTES // per_request)
        for i, b in enumerate(values):
            if b <= largest:
                continue
            why = (f"its paged cache would take {format_huge(b * per_request)}, over the "
                   f"{format_huge(MAX_BYTES)} any tensor here may take"
                   if b * per_request > MAX_BYTES else
                   f"its paged cache would need {b * blocks} blocks, beyond int32 block ids")
            raise UserError(f"b={b} requests of {context} context tokens cannot run: {why}; the "
                            f"largest b {scenario.name} can take at that context is {largest}: "
                            f"lower b, or the context length", field=f"{self.key}[{i}]")

    def check_workspace(self, scenario: Scenario, padded_heads: int) -> None:
        """[serving].max_batch_size requests whose q and out cannot exist."""
        rows = self.workspace_rows(scenario)
        limit = decode_token_limit(scenario, padded_heads)
        if rows > limit:
            size = rows * padded_heads * (scenario.d_qk + scenario.d_v) * 2
            raise UserError(f"{scenario.source or scenario.name}: [serving].max_batch_size {rows} "
                            f"cannot be reserved: q and out of that many requests ({padded_heads} "
                            f"heads, bf16) would take {format_huge(size)}, over the "
                            f"{format_huge(MAX_BYTES)} any tensor here may take; the largest "
                            f"{scenario.name} can take is {limit}")

    def describe(self, scenario_summary: dict, kv_tokens: int | None) -> str:
        return (f"b requests x {kv_tokens} context tokens each, {scenario_summary['kv_cache_dtype']} "
                "paged cache, one query per request")


OPERATION = DenseDecode()
