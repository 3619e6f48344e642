"""The kernel operations (spec), one module each, and their registry.

Each module holds one `Operation` (`mlamem.operations.base`): what it sweeps and how a user
sets it, the caches it reads, its workspace rows, its call's problem and kernel layout, its
synthetic inputs and its checks.
- sparse-decode (`sparse_decode.py`): T query tokens over an fp8_ds_mla pool;
- dense-decode (`dense_decode.py`): b requests, one query each, over a paged cache;
- sparse-prefill (`sparse_prefill.py`): s_q prefill tokens against a gathered bf16 KV.

A new operation is one module and one line in `_SHIPPED` (or `register(...)` at run time).
The functions below are the operations' methods by name, for callers that hold a name.
"""

from __future__ import annotations

from mlamem.operations import dense_decode, sparse_decode, sparse_prefill
from mlamem.operations.base import (
    Operation,
    OpInputs,
    Problem,
    Scenario,
    decode_token_limit,
    operation,
    operation_names,
    register,
    unregister,
)
from mlamem.operations.sparse_decode import KV_POOL_TOPK_MULTIPLE, kv_pool_tokens
from mlamem.spec.errors import UserError

_SHIPPED = (sparse_decode, dense_decode, sparse_prefill)  # one line per shipped operation
for _module in _SHIPPED:
    register(_module.OPERATION)

SPARSE_DECODE, DENSE_DECODE, SPARSE_PREFILL = (m.OPERATION.name for m in _SHIPPED)
KV_FORMATS = {m.OPERATION.name: m.OPERATION.kv_formats for m in _SHIPPED}  # the shipped ones'


def scenario_operations(scenario: Scenario) -> tuple[str, ...]:
    """The operations a scenario drives (older scenarios: sparse decode)."""
    return tuple(getattr(scenario, "operations", None) or (SPARSE_DECODE,))


def check_supported(scenario: Scenario, op: str, kernel_name: str,
                    kernel_operations: tuple[str, ...]) -> None:
    """One line (exit 2) for an operation the kernel or the scenario does not have."""
    operation(op)
    if op not in kernel_operations:
        raise UserError(f"kernel {kernel_name} does not run {op}; it runs "
                        f"{', '.join(kernel_operations)}: pick one of those, or another kernel",
                        field="op")
    ops = scenario_operations(scenario)
    if op not in ops:
        raise UserError(f"scenario {scenario.name} does not drive {op} (it declares "
                        f"{', '.join(ops)}): pick one of those, or another scenario", field="op")


def workspace_rows(scenario: Scenario, op: str) -> int:
    """Rows the engine's workspace holds for `op`: requests for dense decode, else tokens."""
    return operation(op).workspace_rows(scenario)


def default_kv_tokens(scenario: Scenario, op: str) -> int:
    """KV tokens of one call: the sparse decode pool, each dense request's context, or the
    prefill's gathered KV."""
    return operation(op).default_kv_tokens(scenario)


def check_kv_tokens(scenario: Scenario, op: str, values, kv_tokens: int | None = None) -> None:
    """One line (exit 2) for a KV length, or rows, whose cache cannot exist."""
    operation(op).check_kv_tokens(scenario, values, kv_tokens)


def check_workspace(scenario: Scenario, op: str, padded_heads: int) -> None:
    """One line (exit 2) for a workspace that cannot exist."""
    operation(op).check_workspace(scenario, padded_heads)


def kv_format(scenario: Scenario, op: str) -> str:
    """The cache the call reads: dense decode the scenario's own; sparse decode an fp8_ds_mla
    pool whatever the scenario budgets its cache in; prefill a gathered bf16 kv."""
    return operation(op).kv_format(scenario)


def problem_for(scenario: Scenario, op: str, rows: int, padded_heads: int,
                kv_tokens: int | None = None) -> Problem:
    """One call of `op` at `rows` (T, b or s_q) for one rank of `scenario`."""
    return operation(op).problem(scenario, rows, padded_heads, kv_tokens)


def describe_call(op: str, scenario_summary: dict, kv_tokens: int | None) -> str:
    """The call's shape in words, for table headers: what the swept symbol means."""
    return operation(op).describe(scenario_summary, kv_tokens)


def to_kernel_layout_shape(op: str, rows_shape: tuple[int, ...]) -> tuple[int, ...]:
    """(rows, heads, d) -> the operation's kernel layout."""
    return operation(op).kernel_shape(tuple(rows_shape))


def to_kernel_layout(op: str, x):
    """A (rows, heads, d) tensor as the kernel's q or out (a view)."""
    return x.view(to_kernel_layout_shape(op, tuple(x.shape)))


def from_kernel_layout(op: str, out, lse):
    """The kernel's out and lse as (rows, heads, d_v) and (heads, rows) views."""
    return operation(op).from_kernel_layout(out, lse)


def reads_cache(kernel, scenario: Scenario, op: str) -> bool:
    """Whether `kernel` reads the cache `op` reads at `scenario` (FlashInfer's MLA: bf16 only)."""
    return kv_format(scenario, op) in kernel.capabilities(op).kv_formats


def check_cache(kernel, scenario: Scenario, op: str) -> None:
    """One line (exit 2) for a scenario whose cache the kernel does not read."""
    if not reads_cache(kernel, scenario, op):
        formats = " or ".join(kernel.capabilities(op).kv_formats)
        raise UserError(f"kernel {kernel.name} reads a {formats} cache for {op}, not "
                        f"{scenario.name}'s {kv_format(scenario, op)}: pick another scenario "
                        "or kernel", field="scenario")


def call_capabilities(kernel, scenario: Scenario, op: str):
    """What `kernel` takes for one call of `op` at `scenario`: its capabilities over the cache
    `op` reads there."""
    return kernel.capabilities(op, kv_format(scenario, op))


def padded_heads_for(kernel, scenario: Scenario, op: str = SPARSE_DECODE) -> int:
    """The heads `kernel` pads `scenario`'s heads per rank up to for one call of `op`: the one
    place padded heads are computed (the call plan, profile, graphs, repro-oom, explain)."""
    return call_capabilities(kernel, scenario, op).padded_heads(scenario.heads_per_rank)


__all__ = ["DENSE_DECODE", "KV_FORMATS", "KV_POOL_TOPK_MULTIPLE", "SPARSE_DECODE", "SPARSE_PREFILL",
           "OpInputs", "Operation", "Problem", "call_capabilities", "check_cache", "check_kv_tokens",
           "check_supported", "check_workspace", "decode_token_limit", "default_kv_tokens",
           "describe_call", "from_kernel_layout", "kv_format", "kv_pool_tokens", "operation",
           "operation_names", "padded_heads_for", "problem_for", "reads_cache", "register",
           "scenario_operations", "to_kernel_layout", "to_kernel_layout_shape", "unregister",
           "workspace_rows"]
