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
from mlamem.kernels.base import (
    DENSE_DECODE,
    KV_FORMATS,
    OPERATIONS,
    SPARSE_DECODE,
    SPARSE_PREFILL,
    Problem,
)

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


def default_kv_tokens(scenario: Scenario, op: str) -> int:
    """KV tokens of one call: the sparse decode pool, each dense request's context, or the
    prefill's gathered KV."""
    from mlamem.inputs import kv_pool_tokens

    if op == DENSE_DECODE:
        return scenario.serving.decode_context_len
    if op == SPARSE_PREFILL:
        return PREFILL_KV_TOPK_MULTIPLE * scenario.decode_topk
    return kv_pool_tokens(scenario)


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
