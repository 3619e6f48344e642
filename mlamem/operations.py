"""The kernel operations as the CLI and the files see them: what each sweeps, and its flags.

- sparse-decode: T, the query tokens of one call (`--tokens`, JSON key `tokens`), over the
  scenario's fp8_ds_mla pool; its workspace holds max_num_batched_tokens.
- dense-decode: b, the requests of one decode step, one query each (`--requests`, JSON key
  `requests`; `tokens` = b too), each over `--context-len` tokens of a paged cache; its
  workspace holds max_batch_size requests.
- sparse-prefill: s_q, the prefill tokens of one call (`--tokens`), against `--kv-len` gathered
  bf16 KV tokens; its workspace holds max_num_batched_tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from mlamem.errors import UserError
from mlamem.kernel_api import (
    DENSE_DECODE,
    KV_FORMATS,
    OPERATIONS,
    SPARSE_DECODE,
    SPARSE_PREFILL,
    Problem,
)
from mlamem.units import MAX_BYTES, MAX_TOKENS, format_huge

if TYPE_CHECKING:
    from mlamem.scenario import Scenario


@dataclass(frozen=True)
class Operation:
    """What one operation sweeps and how a user sets it."""

    name: str  # one of kernels.base.OPERATIONS
    symbol: str  # the swept quantity's symbol in tables: T, b or s_q
    quantity: str  # the swept quantity, in words
    key: str  # its key in JSON rows and baseline cases
    flag: str  # its CLI flag
    kv_key: str | None  # the KV length's key in rows (None: set by the scenario)
    kv_flag: str | None  # its CLI flag
    default_sweep: tuple[int, ...]
    default_scenario: str  # the shipped scenario `profile --op` runs without --scenario


OPERATION_TABLE = {
    SPARSE_DECODE: Operation(SPARSE_DECODE, "T", "T, query tokens of one call", "tokens", "--tokens",
                             None, None, (1024, 8192, 16384, 32768), "glm5-fp8-tp8"),
    DENSE_DECODE: Operation(DENSE_DECODE, "b", "b, requests of one decode step (one query each)",
                            "requests", "--requests", "context_len", "--context-len",
                            (16, 64, 128, 256), "kimi-k2-dense-tp4-dp"),
    SPARSE_PREFILL: Operation(SPARSE_PREFILL, "s_q", "s_q, prefill tokens of one call", "tokens",
                              "--tokens", "kv_len", "--kv-len", (1024, 8192, 16384, 32768),
                              "glm5-fp8-tp8"),
}
PREFILL_KV_TOPK_MULTIPLE = 4  # the default gathered KV of a prefill: 4 x topk tokens
KV_POOL_TOPK_MULTIPLE = 4  # the synthetic sparse-decode KV pool holds 4 x topk tokens


def operation(name: str) -> Operation:
    try:
        return OPERATION_TABLE[name]
    except KeyError:
        raise UserError(f"unknown operation {name!r}; expected one of: "
                        f"{', '.join(OPERATIONS)}") from None


def scenario_operations(scenario: Scenario) -> tuple[str, ...]:
    """The operations a scenario drives (older scenarios: sparse decode)."""
    return tuple(getattr(scenario, "operations", None) or (SPARSE_DECODE,))


def check_supported(scenario: Scenario, op: str, kernel_name: str,
                    kernel_operations: tuple[str, ...]) -> None:
    """One line (exit 2) for an operation the kernel or the scenario does not have."""
    operation(op)
    if op not in kernel_operations:
        raise UserError(f"kernel {kernel_name} does not run {op}; it runs "
                        f"{', '.join(kernel_operations)}: pick one with --op, or another --kernel")
    ops = scenario_operations(scenario)
    if op not in ops:
        raise UserError(f"scenario {scenario.name} does not drive {op} (it declares "
                        f"{', '.join(ops)}): pick one with --op, or another --scenario")


def workspace_rows(scenario: Scenario, op: str) -> int:
    """Rows the engine's workspace holds for `op`: requests for dense decode, else tokens."""
    if op == DENSE_DECODE:
        return scenario.serving.max_batch_size
    return scenario.serving.max_num_batched_tokens


def kv_pool_tokens(scenario: Scenario) -> int:
    """Tokens in the synthetic KV pool: a whole number of blocks covering 4 x topk."""
    block = scenario.serving.block_size
    return -(-KV_POOL_TOPK_MULTIPLE * scenario.decode_topk // block) * block


def default_kv_tokens(scenario: Scenario, op: str) -> int:
    """KV tokens of one call: the sparse decode pool, each dense request's context, or the
    prefill's gathered KV."""
    if op == DENSE_DECODE:
        return scenario.serving.decode_context_len
    if op == SPARSE_PREFILL:
        return PREFILL_KV_TOPK_MULTIPLE * scenario.decode_topk
    return kv_pool_tokens(scenario)


def check_kv_tokens(scenario: Scenario, op: str, values, kv_tokens: int | None = None) -> None:
    """One line (exit 2) for a KV length, or dense-decode requests, whose cache cannot exist:
    --context-len and --kv-len are one sequence's KV, at most [serving].max_model_len; the paged
    cache of b dense-decode requests needs b x blocks int32 block ids within 256 TiB."""
    spec = operation(op)
    longest = scenario.serving.max_model_len
    if kv_tokens is not None and spec.kv_flag is not None and kv_tokens > longest:
        raise UserError(f"{spec.kv_flag} {kv_tokens} exceeds {scenario.name}'s max_model_len="
                        f"{longest}, the longest sequence it serves; lower {spec.kv_flag}")
    if op != DENSE_DECODE:
        return
    context = kv_tokens or default_kv_tokens(scenario, op)
    block = scenario.serving.block_size
    blocks = -(-context // block)  # pages per request
    per_request = blocks * block * scenario.d_qk * (2 if kv_format(scenario, op) == "bf16" else 1)
    largest = min(MAX_TOKENS // blocks, MAX_BYTES // per_request)
    for b in values:
        if b <= largest:
            continue
        why = (f"its paged cache would take {format_huge(b * per_request)}, over the "
               f"{format_huge(MAX_BYTES)} any tensor here may take"
               if b * per_request > MAX_BYTES else
               f"its paged cache would need {b * blocks} blocks, beyond int32 block ids")
        raise UserError(f"{spec.flag}: b={b} requests of {context} context tokens cannot run: "
                        f"{why}; the largest b {scenario.name} can take at that context is "
                        f"{largest}: lower {spec.flag} or --context-len")


def check_workspace(scenario: Scenario, op: str, padded_heads: int) -> None:
    """One line (exit 2) for a dense-decode workspace that cannot exist: it holds
    [serving].max_batch_size requests (the sparse operations' max_num_batched_tokens tokens are
    checked by scenario.check_decode_tokens)."""
    from mlamem.scenario import decode_token_limit

    rows = workspace_rows(scenario, op)
    limit = decode_token_limit(scenario, padded_heads)
    if op == DENSE_DECODE and rows > limit:
        size = rows * padded_heads * (scenario.d_qk + scenario.d_v) * 2
        raise UserError(f"{scenario.source or scenario.name}: [serving].max_batch_size {rows} "
                        f"cannot be reserved: q and out of that many requests ({padded_heads} "
                        f"heads, bf16) would take {format_huge(size)}, over the "
                        f"{format_huge(MAX_BYTES)} any tensor here may take; the largest "
                        f"{scenario.name} can take is {limit}")


def kv_format(scenario: Scenario, op: str) -> str:
    """The cache the call reads: dense decode the scenario's own; sparse decode an fp8_ds_mla
    pool whatever the scenario budgets its cache in; prefill a gathered bf16 kv."""
    if op != DENSE_DECODE:
        return KV_FORMATS[op][0]
    if scenario.serving.kv_cache_dtype not in KV_FORMATS[op]:
        raise UserError(f"{scenario.name}: {op} reads a {' or '.join(KV_FORMATS[op])} cache, "
                        f"not [serving].kv_cache_dtype {scenario.serving.kv_cache_dtype!r}")
    return scenario.serving.kv_cache_dtype


def problem_for(scenario: Scenario, op: str, rows: int, padded_heads: int,
                kv_tokens: int | None = None) -> Problem:
    """One call of `op` at `rows` (T, b or s_q) for one rank of `scenario`."""
    return Problem(op=op, rows=rows, heads=padded_heads, sm_scale=scenario.softmax_scale,
                   kv_tokens=kv_tokens or default_kv_tokens(scenario, op),
                   kv_format=kv_format(scenario, op),
                   topk=None if op == DENSE_DECODE else scenario.decode_topk,
                   block_size=scenario.serving.block_size, d_qk=scenario.d_qk, d_v=scenario.d_v)


def describe_call(op: str, scenario_summary: dict, kv_tokens: int | None) -> str:
    """The call's shape in words, for table headers: what the swept symbol means."""
    s = scenario_summary
    if op == DENSE_DECODE:
        return (f"b requests x {kv_tokens} context tokens each, {s['kv_cache_dtype']} paged "
                "cache, one query per request")
    if op == SPARSE_PREFILL:
        return f"topk {s['topk']}, s_q prefill tokens against s_kv = {kv_tokens} bf16 KV tokens"
    return f"topk {s['topk']}, s_q = T"


def reads_cache(kernel, scenario: Scenario, op: str) -> bool:
    """Whether `kernel` reads the cache `op` reads at `scenario` (FlashInfer's MLA: bf16 only)."""
    return kv_format(scenario, op) in kernel.capabilities(op).kv_formats


def check_cache(kernel, scenario: Scenario, op: str) -> None:
    """One line (exit 2) for a scenario whose cache the kernel does not read."""
    if not reads_cache(kernel, scenario, op):
        formats = " or ".join(kernel.capabilities(op).kv_formats)
        raise UserError(f"kernel {kernel.name} reads a {formats} cache for {op}, not "
                        f"{scenario.name}'s {kv_format(scenario, op)}: pick another --scenario "
                        "or --kernel")
