"""What every operation is (spec): `Operation`, the shape of one call (`Problem`) and its
inputs besides q (`OpInputs`). Each operation is one module of `mlamem.operations` holding one
`Operation`; `mlamem.operations` is the registry.

An operation's methods take the scenario (`mlamem.spec.scenario.Scenario`) as it is: the scenario
reads the operation names and cache formats from here, so nothing here imports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mlamem.spec.errors import UserError
from mlamem.spec.units import MAX_BYTES, MAX_TOKENS

TOKENS_BOUND = "max_num_batched_tokens"  # the token workspaces' bound
Scenario = Any  # mlamem.spec.scenario.Scenario, which imports the operations (so not imported here)


@dataclass(frozen=True)
class Problem:
    """The shape of one kernel call, in the operation's terms."""

    op: str  # a registered operation's name
    rows: int  # query rows: T (sparse decode), requests b (dense decode), s_q (prefill)
    heads: int  # query heads the kernel runs (after padding)
    sm_scale: float
    kv_tokens: int  # sparse decode: KV pool tokens; dense decode: each request's context; prefill: s_kv
    kv_format: str = "fp8_ds_mla"  # one of the operation's kv_formats
    topk: int | None = None  # KV tokens each query attends (sparse operations)
    block_size: int = 64  # KV-cache page size in tokens
    d_qk: int = 576
    d_v: int = 512

    @property
    def q_shape(self) -> tuple[int, ...]:
        """q in the kernel's layout."""
        return operation(self.op).kernel_shape((self.rows, self.heads, self.d_qk))

    @property
    def q_dtype(self) -> str:
        """The torch dtype name q must have (fp8 e4m3 for the dense decode over an fp8 cache)."""
        return operation(self.op).q_dtype(self.kv_format)


@dataclass
class OpInputs:
    """What a call reads besides q (tensors; None where the operation has no such input)."""

    kv: Any  # the cache (sparse decode, dense decode) or the gathered kv (prefill)
    indices: Any = None  # sparse operations
    block_table: Any = None  # dense decode: (b, blocks) int32
    seqlens: Any = None  # dense decode: (b,) int32
    descale_q: Any = None  # dense decode over fp8: (1,) float32
    descale_k: Any = None


def decode_token_limit(scenario: Scenario, padded_heads: int) -> int:
    """The most rows one call, or a workspace, can take: its bf16 q and out at `padded_heads`
    heads within MAX_BYTES (256 TiB), and the count within int32."""
    return min(MAX_TOKENS, MAX_BYTES // (padded_heads * (scenario.d_qk + scenario.d_v) * 2))


def generator(device, seed: int) -> dict:
    """`generator=` for drawing on `device`; none on the meta device (no values there)."""
    import torch

    return {} if device.type == "meta" else {"generator": torch.Generator(device).manual_seed(seed)}


class Operation:
    """One kernel operation: what it sweeps, the cache it reads, its workspace, its call's
    problem and kernel layout, and its synthetic inputs. Subclasses set the class attributes
    and `make_inputs`; the rest has defaults that fit a sparse operation over the scenario's
    max_num_batched_tokens."""

    name: str  # the --op name
    symbol: str  # the swept quantity's symbol in tables: T, b or s_q
    quantity: str  # the swept quantity, in words
    key: str  # its key in JSON rows and baseline cases; the field its errors name
    flag: str  # its CLI flag (the faces' word for `key`)
    kv_key: str | None = None  # the KV length's key in rows (None: set by the scenario)
    kv_flag: str | None = None  # its CLI flag
    default_sweep: tuple[int, ...]
    default_scenario: str  # the shipped scenario `profile --op` runs without --scenario
    kv_formats: tuple[str, ...]  # the caches it reads, by kv_cache_dtype name; the first is its own
    sparse = True  # attends a top-k of the KV (the problem carries the scenario's topk)
    workspace_bound = TOKENS_BOUND  # the [serving] field that sizes its workspace's rows
    reads_scenario_cache = False  # reads the scenario's own KV cache: its formats must agree
    serving_fields: tuple[str, ...] = ()  # [serving] fields only it uses, which it requires

    def __repr__(self) -> str:
        return f"<operation {self.name}>"

    # -- sizes --
    @property
    def tokens_workspace(self) -> bool:
        """Its rows are tokens, and max_num_batched_tokens sizes its workspace."""
        return self.workspace_bound == TOKENS_BOUND

    def workspace_rows(self, scenario: Scenario) -> int:
        """Rows the engine's workspace holds for this operation."""
        return getattr(scenario.serving, self.workspace_bound)

    def default_kv_tokens(self, scenario: Scenario) -> int:
        """KV tokens of one call when the user sets none."""
        raise NotImplementedError

    @property
    def validate_sweep(self) -> tuple[int, ...]:
        """The values `validate` runs where none are asked (default: default_sweep)."""
        return self.default_sweep

    def kv_format(self, scenario: Scenario) -> str:
        """The cache one call reads at `scenario` (default: the operation's own)."""
        return self.kv_formats[0]

    def q_dtype(self, kv_format: str) -> str:
        """The torch dtype name of the kernel's q."""
        return "bfloat16"

    def problem(self, scenario: Scenario, rows: int, padded_heads: int,
                kv_tokens: int | None = None) -> Problem:
        """One call at `rows` for one rank of `scenario`."""
        return Problem(op=self.name, rows=rows, heads=padded_heads, sm_scale=scenario.softmax_scale,
                       kv_tokens=kv_tokens or self.default_kv_tokens(scenario),
                       kv_format=self.kv_format(scenario),
                       topk=scenario.decode_topk if self.sparse else None,
                       block_size=scenario.serving.block_size, d_qk=scenario.d_qk, d_v=scenario.d_v)

    # -- layouts: the wrapper sees (rows, heads, d) --
    def kernel_shape(self, rows_shape: tuple[int, ...]) -> tuple[int, ...]:
        """(rows, heads, d) -> the kernel's layout of q and out (default: the same)."""
        return tuple(rows_shape)

    def from_kernel_layout(self, out, lse):
        """The kernel's out and lse as (rows, heads, d_v) and (heads, rows) views (default: lse
        comes as (rows, heads))."""
        return out, lse.T

    # -- inputs --
    def make_inputs(self, problem: Problem, heads: int, device, seed: int = 0):
        """Valid synthetic inputs for one call: (q (rows, heads, d_qk) bf16 at the rank's own
        head count, OpInputs), drawn on the device itself in a fixed order, so the meta device
        sees the same allocations as a GPU."""
        raise NotImplementedError

    # -- checks: one line each (exit 2), naming the field --
    def check_kv_tokens(self, scenario: Scenario, values, kv_tokens: int | None = None) -> None:
        """A KV length longer than the scenario's longest sequence ([serving].max_model_len)."""
        longest = scenario.serving.max_model_len
        if kv_tokens is not None and self.kv_key is not None and kv_tokens > longest:
            raise UserError(f"{kv_tokens} exceeds {scenario.name}'s max_model_len={longest}, the "
                            f"longest sequence it serves; lower it", field=self.kv_key)

    def workspace_refusal(self, scenario: Scenario, rows: int, fix: str) -> str:
        """Why `rows` cannot run on a workspace path (more than workspace_rows), and `fix`."""
        return (f"T={rows} exceeds {scenario.name}'s {self.workspace_bound}="
                f"{self.workspace_rows(scenario)}, which sizes the workspace; {fix}")

    def serving_problem(self, scenario: Scenario) -> tuple[str, str] | None:
        """The [serving] field that keeps `scenario` from driving it, and why (the scenario's
        validation raises it, naming the field); None where it can."""
        return None

    def check_workspace(self, scenario: Scenario, padded_heads: int) -> None:
        """A workspace that cannot exist (the sparse operations' max_num_batched_tokens tokens
        are checked by scenario.check_decode_tokens)."""

    def describe(self, scenario_summary: dict, kv_tokens: int | None) -> str:
        """The call's shape in words, for table headers: what the swept symbol means."""
        return f"topk {scenario_summary['topk']}, {self.symbol} rows"


_REGISTERED: dict[str, Operation] = {}  # name -> operation, in registration order


def register(op: Operation) -> Operation:
    """Add an operation to the registry (the shipped ones: `mlamem.operations`)."""
    _REGISTERED[op.name] = op
    return op


def unregister(name: str) -> None:
    """Remove a registered operation (a test's, registered for its run)."""
    del _REGISTERED[name]


def operation_names() -> tuple[str, ...]:
    """Every registered operation, in order (the shipped ones, then any registered since)."""
    return tuple(_REGISTERED)


def operation(name: str) -> Operation:
    """The registered operation `name`; a UserError naming the known ones."""
    try:
        return _REGISTERED[name]
    except KeyError:
        raise UserError(f"unknown operation {name!r}; expected one of: "
                        f"{', '.join(_REGISTERED)}", field="op") from None
