"""The one sweep planner: a request (scenarios, operations, swept values, paths, kernel and
engine options) is checked before any work and planned into (scenario, operation) parts.
profile, validate, compare, gate, graphs and repro-oom all plan through `plan`.

Errors name the request's field (`paths`, `max_num_batched_tokens`, `kernel`); each face words
it its own way (the CLI as the flag that sets it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mlamem import operations
from mlamem.errors import UserError

if TYPE_CHECKING:
    from mlamem.kernel_api import KernelContract
    from mlamem.scenario import Scenario


@dataclass(frozen=True)
class SweepPart:
    """One (scenario, operation) of a sweep: the values it runs and the paths it runs them on."""

    scenario: Scenario  # with the request's max_num_batched_tokens, where it gives one
    source: str  # the scenario as given: a name or a TOML path
    op: str
    values: list[int]  # those the scenario can run (runnable_tokens)
    paths: list[str]


@dataclass(frozen=True)
class Request:
    """What a command asks to sweep, before any check. The words a face gave (`fix`,
    `max_tokens_field`, `capture_field`) go into the errors of the checks below the planner
    (`check_request`, `scenario.check_decode_tokens`); the faces word the fields as flags."""

    scenarios: Sequence[tuple[str, Scenario]]  # (as given: a name or a TOML path, loaded)
    ops: Sequence[str]
    kernel: KernelContract
    # The values of each operation to run; none: the part runs the engine's own step only.
    values: Mapping[str, Sequence[int]] = dataclasses.field(default_factory=dict)
    given: Collection[str] = ()  # operations whose values were asked for: run whole
    strict: bool = False  # every operation's values run whole; else what each scenario holds
    keys_given: Collection[str] = ()  # swept quantities asked for (tokens, requests): some part takes each
    paths: Sequence[str] | None = None  # asked for: every part must have them
    candidate_paths: Sequence[str] | None = None  # else: those of these (all) the kernel has
    kv_tokens: int | None = None  # one sequence's KV (dense decode's context, prefill's s_kv)
    max_num_batched_tokens: int | None = None  # sizes the token workspace; in the parts' scenario
    max_tokens_field: str | None = None  # the field max_num_batched_tokens came from (None: scenario)
    capture_sizes: Sequence[int] | None = None  # CUDA-graph capture sizes, checked
    capture_field: str = "capture_sizes"  # the field they came from
    named: bool = True  # the scenarios were named one by one: each must take part
    op_given: bool = True  # the operations were asked for: the kernel must run them
    purpose: str | None = None  # why the command needs its one operation (graphs, repro-oom)
    fix: str | None = None  # what helps where a value does not fit a workspace (check_request)


def plan(request: Request) -> list[SweepPart]:
    """Check `request` before any work and split it into parts, in the order of its scenarios
    and operations; a part that can run nothing is left out. UserError (naming the field) for
    the first thing that cannot run."""
    _check_kernel(request)
    parts = []
    for source, scenario in request.scenarios:
        for op in _scenario_ops(request, scenario):
            part = _plan_part(request, source, scenario, op)
            if part.paths and (part.values or not _values_of(request, op)):
                parts.append(part)
    if not parts:
        raise UserError(f"no chosen scenario drives {', '.join(request.ops)} with kernel "
                        f"{request.kernel.name}; pick another scenario, operation or kernel")
    _check_keys_taken(request, parts)
    return parts


def _check_kernel(request: Request) -> None:
    """The operations asked for must be the kernel's."""
    if request.op_given or request.purpose:
        check_kernel_ops(request.kernel.name, request.kernel.operations, request.ops,
                         request.purpose)


def check_kernel_ops(kernel: str, runs: Sequence[str], ops: Sequence[str],
                     purpose: str | None = None) -> None:
    """`ops` must be among `runs`, what kernel `kernel` runs: its registry entry's operations
    where it is not loaded yet (a refusal before torch), else the adapter's."""
    for op in ops:
        if op in runs:
            continue
        if purpose:
            raise UserError(f"{purpose}; kernel {kernel} runs {', '.join(runs)}: pick a kernel "
                            f"that runs {op} (`mlamem kernels`)", field="kernel")
        raise UserError(f"kernel {kernel} does not run {op}; it runs {', '.join(runs)}: pick "
                        "one of them, or another kernel", field="op")


def bounds_tokens(op: str, paths: Sequence[str] | None) -> bool:
    """Whether max_num_batched_tokens bounds `op`'s values on `paths` (None: the default, every
    path): a token workspace is staged."""
    from mlamem.paths import STAGING_PATHS

    return op != operations.DENSE_DECODE and (paths is None or bool(set(paths) & set(STAGING_PATHS)))


def check_path_list(paths: Sequence[str] | None) -> None:
    """Paths asked for: each a known path, listed once (no kernel needed)."""
    from mlamem.paths import check_path_names

    twice = next((p for i, p in enumerate(paths or ()) if p in paths[:i]), None)
    if twice is not None:
        raise UserError(f"{twice} is listed twice; list each path once", field="paths")
    try:
        check_path_names(paths or ())
    except UserError as exc:
        raise UserError(str(exc), field="paths") from None


def _scenario_ops(request: Request, scenario: Scenario) -> list[str]:
    """The operations of the request that `scenario` drives and the kernel runs on its cache;
    a scenario named on purpose that has none is refused, saying why."""
    kernel, driven = request.kernel, operations.scenario_operations(scenario)
    if request.purpose and request.ops[0] not in driven:
        raise UserError(f"{request.purpose}; {scenario.name} drives {', '.join(driven)}: pick a "
                        f"{request.ops[0]} scenario (see `mlamem scenarios`)", field="scenario")
    ops = [o for o in request.ops if o in kernel.operations and o in driven
           and operations.reads_cache(kernel, scenario, o)]
    if ops or not request.named:
        return ops
    if request.op_given:
        operations.check_supported(scenario, request.ops[0], kernel.name, kernel.operations)
        operations.check_cache(kernel, scenario, request.ops[0])
    covered = [o for o in request.ops if o in kernel.operations]
    raise UserError(f"scenario {scenario.name} drives {', '.join(driven)}; kernel {kernel.name} "
                    f"runs {', '.join(covered) or 'none of ' + ', '.join(request.ops)} in this "
                    "sweep: pick another scenario, operation or kernel", field="scenario")


def _values_of(request: Request, op: str) -> list[int]:
    return list(request.values.get(op, ()))


def _plan_part(request: Request, source: str, scenario: Scenario, op: str) -> SweepPart:
    """Check one (scenario, operation): its cache, paths, KV length, decode shape, workspace
    and values, in that order."""
    from mlamem import scenario as scenarios
    from mlamem.profile import RAISE_LIMIT, check_request, runnable_tokens

    kernel, values = request.kernel, _values_of(request, op)
    capabilities = kernel.capabilities(op, operations.kv_format(scenario, op))
    paths = _part_paths(request, capabilities, op)
    whole = request.strict or op in request.given
    operations.check_kv_tokens(scenario, op, values, request.kv_tokens)
    mnbt = _max_num_batched_tokens(request, op)
    padded_heads = scenarios.check_decode(scenario, capabilities.head_counts, kernel.label)
    operations.check_workspace(scenario, op, padded_heads)
    scenarios.check_decode_tokens(
        scenario, padded_heads, values if whole else [], field=operations.operation(op).key,
        max_tokens=mnbt, max_tokens_field=request.max_tokens_field,
        workspace=bounds_tokens(op, paths))
    if request.capture_sizes is not None:
        scenarios.check_decode_tokens(scenario, padded_heads, request.capture_sizes,
                                      field=request.capture_field)
    if mnbt is not None:
        scenario = dataclasses.replace(scenario, serving=dataclasses.replace(
            scenario.serving, max_num_batched_tokens=mnbt))
    if whole and values:
        check_request(scenario, values, paths, kernel, fix=request.fix or RAISE_LIMIT, op=op)
    return SweepPart(scenario, source, op, runnable_tokens(scenario, values, paths, op), paths)


def _part_paths(request: Request, capabilities, op: str) -> list[str]:
    """The paths asked for, checked against the kernel; else those it has of the candidates."""
    from mlamem.paths import PATH_NAMES, available_paths, check_paths

    if request.paths is None:
        available = available_paths(capabilities)
        return [p for p in request.candidate_paths or PATH_NAMES if p in available]
    check_path_list(request.paths)
    try:
        check_paths(request.paths, capabilities, request.kernel.label, op)
    except UserError as exc:
        raise UserError(str(exc), field="paths") from None
    return list(request.paths)


def _max_num_batched_tokens(request: Request, op: str) -> int | None:
    """The request's max_num_batched_tokens, which only the token workspaces take."""
    mnbt = request.max_num_batched_tokens
    if mnbt is not None and mnbt <= 0:
        raise UserError(f"{mnbt} must be > 0; pass e.g. 32768", field="max_num_batched_tokens")
    if mnbt is not None and op == operations.DENSE_DECODE:
        raise UserError("sizes the token workspace of sparse-decode and sparse-prefill; "
                        "dense-decode's holds the scenario's [serving].max_batch_size requests: "
                        "drop it", field="max_num_batched_tokens")
    return mnbt


def _check_keys_taken(request: Request, parts: Sequence[SweepPart]) -> None:
    """Each swept quantity asked for must be one that some part sweeps."""
    swept = sorted({operations.operation(p.op).key for p in parts})
    for key in request.keys_given:
        if key not in swept:
            raise UserError(f"no operation of this sweep takes it (it sweeps "
                            f"{', '.join(sorted({p.op for p in parts}))}); give "
                            f"{' or '.join(swept)} instead", field=key)
