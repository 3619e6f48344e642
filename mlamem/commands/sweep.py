"""The one sweep planner: a request (scenarios, operations, swept values, paths, kernel and
engine options) is checked before any work and planned into (scenario, operation) parts.
profile, validate, compare, gate, graphs, repro-oom and explain all plan through `plan`, and
check nothing themselves.

The planner runs before torch as far as it can: the kernel's registry entry declares its
operations, so the paths, the operations and the values' int32 bounds are refused before the
adapter (torch) loads; the rest needs the adapter's capabilities. Errors name the request's
field (`paths`, `max_num_batched_tokens`, `kernel`); each face words it its own way (the CLI as
the flag that sets it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mlamem import operations
from mlamem.runtime.paths import (
    PATH_NAMES,
    STAGING_PATHS,
    available_paths,
    check_path_names,
    check_paths,
)
from mlamem.spec import gpus
from mlamem.spec.errors import UserError
from mlamem.spec.kernel_registry import REGISTRY, load_kernel

if TYPE_CHECKING:
    from mlamem.spec.kernel_api import KernelContract
    from mlamem.spec.scenario import Scenario

RAISE_LIMIT = "raise max_num_batched_tokens or drop that T"
DROP_CASE = "drop that T or that scenario"


@dataclass(frozen=True)
class Policy:
    """What a command needs of its plan beyond what it asks: the command decides it, not the
    request."""

    op: str | None = None  # the one operation it runs, whatever the request names
    purpose: str | None = None  # why it needs that operation: its refusals say so
    measures: bool = False  # it holds predictions to measurements: the kernel must run here
    int32_first: bool = False  # its values' int32 bound is refused before the kernel loads


POLICIES = {
    "profile": Policy(int32_first=True),
    "graphs": Policy(operations.SPARSE_DECODE, "graphs captures the sparse decode"),
    "repro-oom": Policy(operations.SPARSE_DECODE, "repro-oom replays the engine's sparse decode step"),
    "validate": Policy(measures=True),
    "validate-graphs": Policy(operations.SPARSE_DECODE, measures=True),
}


@dataclass(frozen=True)
class SweepPart:
    """One (scenario, operation) of a sweep: the values it runs and the paths it runs them on."""

    scenario: Scenario  # with the request's max_num_batched_tokens, where it gives one
    source: str  # the scenario as given: a name or a TOML path
    op: str
    values: list[int]  # those the scenario can run (runnable_tokens)
    paths: list[str]
    kernel: KernelContract  # the adapter that runs it


@dataclass(frozen=True)
class Request:
    """What a command asks to sweep, before any check. Each choice comes as asked, where every
    item must run, or, where nothing was asked, as candidates of which each part keeps those it
    can run: scenarios, operations, values and paths alike. `command` names the command, whose
    policy (POLICIES) decides the rest."""

    command: str  # the command planning: profile, validate, graphs, ...
    kernel: str | KernelContract  # a registered name (its adapter loaded after the light checks)
    # named one by one: (as given, loaded, or a function loading it after the checks that need
    # no scenario); each must take part
    scenarios: Sequence[tuple[str, Scenario | Callable[[], Scenario]]] = ()
    candidate_scenarios: Sequence[tuple[str, Scenario]] = ()  # else ('all'): those that can
    ops: Sequence[str] = ()  # asked for: the kernel must run each
    candidate_ops: Sequence[str] | None = None  # else: those of these it runs (None: all it runs)
    # the values by operation: asked for, run whole; else defaults, of which each scenario runs
    # those it holds; none: the part runs the engine's own step only
    values: Mapping[str, Sequence[int]] = dataclasses.field(default_factory=dict)
    defaults: Mapping[str, Sequence[int]] = dataclasses.field(default_factory=dict)
    keys: Collection[str] = ()  # swept quantities asked for by key (tokens, requests): some part sweeps each
    paths: Sequence[str] | None = None  # asked for: every part must have them
    candidate_paths: Sequence[str] | None = None  # else: those of these (all) the kernel has
    kv_tokens: int | None = None  # one sequence's KV (dense decode's context, prefill's s_kv)
    max_num_batched_tokens: int | None = None  # sizes the token workspace; in the parts' scenario
    capture_sizes: Sequence[int] | None = None  # CUDA-graph capture sizes
    fix: str | None = None  # the face's words for what helps where a value overflows a workspace

    @property
    def policy(self) -> Policy:
        return POLICIES.get(self.command, Policy())

    @property
    def chosen(self) -> list[tuple[str, Scenario]]:
        return [*self.scenarios, *self.candidate_scenarios]


def plan(request: Request,
         load: Callable[[str], KernelContract] = lambda name: load_kernel(name)()
         ) -> list[SweepPart]:
    """Check `request` before any work and split it into parts, in the order of its scenarios
    and operations; a part that can run nothing is left out. UserError (naming the field) for
    the first thing that cannot run. `load` makes a kernel the request names (loading torch)
    once the checks that need no adapter pass."""
    ops = _check_light(request)
    request = dataclasses.replace(request, scenarios=[
        (source, scenario() if callable(scenario) else scenario)
        for source, scenario in request.scenarios])
    if request.policy.int32_first:
        _check_int32(request)
    _check_before_kernel(request, ops)
    kernel = load(request.kernel) if isinstance(request.kernel, str) else request.kernel
    parts = []
    for named, chosen in ((True, request.scenarios), (False, request.candidate_scenarios)):
        for source, scenario in chosen:
            for op in _scenario_ops(request, kernel, ops, scenario, named):
                part = _plan_part(request, kernel, source, scenario, op)
                if part.paths and (part.values or not _values_of(request, op)):
                    parts.append(part)
    if not parts:
        raise UserError(f"no chosen scenario drives {', '.join(ops)} with kernel "
                        f"{kernel.name}; pick another scenario, operation or kernel")
    _check_keys_taken(request, parts)
    if request.policy.measures:
        check_allocation_spec(kernel)
        graphs = request.command == "validate-graphs"
        check_runs_here(kernel, "mlamem graphs" if graphs else "mlamem profile")
    return parts


def _check_light(request: Request) -> list[str]:
    """What needs neither the adapter nor the scenarios (a refusal before pydantic and torch):
    the paths asked for and the operations against the kernel's declared ones. Returns the
    operations the request plans."""
    _check_path_list(request.paths)
    name, runs = _declared(request.kernel)
    ops = [request.policy.op] if request.policy.op else list(request.ops)
    if ops and runs:  # a broken plug-in's entry declares none: loading it says why, in one line
        check_kernel_ops(name, runs, ops, request.policy.purpose)
    _max_num_batched_tokens(request, None)
    return ops or list(request.candidate_ops or runs)


def _declared(kernel: str | KernelContract) -> tuple[str, tuple[str, ...]]:
    """The kernel's name and the operations it runs: its registry entry's, before it loads."""
    if not isinstance(kernel, str):
        return kernel.name, kernel.operations
    if kernel not in REGISTRY:
        raise UserError(f"unknown kernel {kernel!r}; expected one of {', '.join(REGISTRY)}",
                        field="kernel")
    return kernel, REGISTRY[kernel].operations


def _check_int32(request: Request) -> None:
    """The values asked for, and max_num_batched_tokens, within int32 (the head count that
    bounds them below it needs the kernel)."""
    from mlamem.spec.scenario import check_decode_tokens  # the scenario model: loaded with the scenarios

    for _, scenario in request.chosen:
        for op, values in request.values.items():
            spec = operations.operation(op)
            if spec.tokens_workspace:  # dense rows are bounded with their context, later
                check_decode_tokens(scenario, None, values, field=spec.key,
                                    max_tokens=request.max_num_batched_tokens,
                                    max_tokens_field=_max_tokens_field(request),
                                    workspace=_bounds_tokens(op, request.paths))


def check_target_gpu(scenario: Scenario, kernel: KernelContract) -> None:
    """The target GPU's architecture must have the kernel, modelled (`target_reason`): FlashMLA
    has no A100 kernel, and its SM100 ones are not modelled here."""
    capability = gpus.compute_capability(scenario.gpu.name)
    reason = None if capability is None else kernel.target_reason(scenario.gpu.name, capability)
    if reason is not None:
        raise UserError(reason, field="gpu")


MOST_PADDED_HEADS = 128  # the most heads a shipped kernel pads a rank's query heads to


def _check_before_kernel(request: Request, ops: list[str]) -> None:
    """What the named scenarios refuse without the kernel, before it loads (torch), in the
    words the checks after it use: an operation the command needs that the scenario does not
    drive, a KV length past the longest sequence, a value no staged workspace holds, a
    max_num_batched_tokens past int32."""
    from mlamem.spec.scenario import check_decode_tokens  # the scenario model: loaded with the scenarios

    purpose = request.policy.purpose
    for _, scenario in request.scenarios:
        if request.max_num_batched_tokens is not None:  # int32 here; the kernel's heads later
            check_decode_tokens(scenario, None, [], max_tokens=request.max_num_batched_tokens,
                                max_tokens_field=_max_tokens_field(request))
        driven = operations.scenario_operations(scenario)
        if purpose and ops[0] not in driven:
            raise UserError(f"{purpose}; {scenario.name} drives {', '.join(driven)}: pick a "
                            f"{ops[0]} scenario (see `mlamem scenarios`)", field="scenario")
        for op in set(ops) & set(driven):
            operations.operation(op).check_kv_tokens(scenario, _values_of(request, op),
                                                     request.kv_tokens)
    _check_workspace_rows(request)


def _check_workspace_rows(request: Request) -> None:
    """A value no staged workspace holds: every kernel has the workspace path, so a sweep of
    the default paths, or of a staging path, runs it. check_request refuses the same after the
    kernel loads, in the same words."""
    asked = request.paths if request.paths is not None else (request.candidate_paths or PATH_NAMES)
    if not set(asked) & set(STAGING_PATHS):
        return
    for _, scenario in request.scenarios:
        for op, values in request.values.items():
            if op not in operations.scenario_operations(scenario):
                continue  # _scenario_ops says why
            mnbt = _max_num_batched_tokens(request, op)
            sized = scenario if mnbt is None else dataclasses.replace(scenario, serving=(
                dataclasses.replace(scenario.serving, max_num_batched_tokens=mnbt)))
            if operations.workspace_rows(sized, op) is None:
                continue
            # a value no call can hold at any kernel's head count is check_decode_tokens's
            # refusal, once the kernel's padded heads are known
            can_exist = [v for v in values if v <= operations.decode_token_limit(
                sized, MOST_PADDED_HEADS)]
            too_big = sorted(set(can_exist) - set(runnable_tokens(sized, can_exist,
                                                                  STAGING_PATHS, op)))
            if too_big:
                spec = operations.operation(op)
                raise UserError(spec.workspace_refusal(sized, too_big[0], request.fix or RAISE_LIMIT),
                                field=spec.key)


def check_allocation_spec(kernel: KernelContract) -> None:
    """validate holds a kernel's allocation spec to the GPU: the kernel must have one."""
    if kernel.runs_on_meta:
        raise UserError(f"validate holds a kernel's allocation spec to the GPU; {kernel.label} "
                        "has none (it predicts by running itself on the meta device, where "
                        "cuBLAS's CUDA temporaries do not appear): validate another kernel "
                        "(`mlamem kernels`)", field="kernel")


def check_runs_here(kernel: KernelContract, predicts: str = "mlamem profile") -> None:
    """validate compares against measurements: the kernel must run here; else the command that
    `predicts` the same figures is named."""
    reason = kernel.unavailable_reason()
    if reason is not None:
        raise UserError(f"validate needs a GPU: it holds the prediction to measurements, and "
                        f"could not measure here ({reason}); for the prediction alone run "
                        f"instead: {predicts} with the same flags (it predicts where it cannot "
                        f"measure), and validate on a GPU where "
                        f"{kernel.label} runs")


def check_kernel_ops(kernel: str, runs: Sequence[str], ops: Sequence[str],
                     purpose: str | None = None) -> None:
    """`ops` must be among `runs`, what kernel `kernel` runs: its registry entry's operations
    where it is not loaded yet (a refusal before torch), else the adapter's."""
    for op in ops:
        operations.operation(op)
        if op in runs:
            continue
        if purpose:
            raise UserError(f"{purpose}; kernel {kernel} runs {', '.join(runs)}: pick a kernel "
                            f"that runs {op} (`mlamem kernels`)", field="kernel")
        raise UserError(f"kernel {kernel} does not run {op}; it runs {', '.join(runs)}: pick "
                        "one of them, or another kernel", field="op")


def _bounds_tokens(op: str, paths: Sequence[str] | None) -> bool:
    """Whether max_num_batched_tokens bounds `op`'s values on `paths` (None: the default, every
    path): a token workspace is staged."""
    return operations.operation(op).tokens_workspace and (
        paths is None or bool(set(paths) & set(STAGING_PATHS)))


def _check_path_list(paths: Sequence[str] | None) -> None:
    """Paths asked for: each a known path, listed once (no kernel needed)."""
    twice = next((p for i, p in enumerate(paths or ()) if p in paths[:i]), None)
    if twice is not None:
        raise UserError(f"{twice} is listed twice; list each path once", field="paths")
    try:
        check_path_names(paths or ())
    except UserError as exc:
        raise UserError(str(exc), field="paths") from None


def _scenario_ops(request: Request, kernel: KernelContract, ops: list[str],
                  scenario: Scenario, named: bool) -> list[str]:
    """The operations of the request that `scenario` drives and the kernel runs on its cache;
    a scenario `named` one by one that has none is refused, saying why."""
    driven = operations.scenario_operations(scenario)
    purpose = request.policy.purpose
    if purpose and ops[0] not in driven:
        raise UserError(f"{purpose}; {scenario.name} drives {', '.join(driven)}: pick a "
                        f"{ops[0]} scenario (see `mlamem scenarios`)", field="scenario")
    chosen = [o for o in ops if o in kernel.operations and o in driven
              and operations.reads_cache(kernel, scenario, o)]
    if chosen or not named:
        return chosen
    if request.ops or request.policy.op:
        operations.check_supported(scenario, ops[0], kernel.name, kernel.operations)
        operations.check_cache(kernel, scenario, ops[0])
    covered = [o for o in ops if o in kernel.operations]
    raise UserError(f"scenario {scenario.name} drives {', '.join(driven)}; kernel {kernel.name} "
                    f"runs {', '.join(covered) or 'none of ' + ', '.join(ops)} in this "
                    "sweep: pick another scenario, operation or kernel", field="scenario")


def _values_of(request: Request, op: str) -> list[int]:
    return list(request.values.get(op, request.defaults.get(op, ())))


def _plan_part(request: Request, kernel: KernelContract, source: str, scenario: Scenario,
               op: str) -> SweepPart:
    """Check one (scenario, operation): its cache, paths, KV length, decode shape, workspace
    and values, in that order."""
    from mlamem.spec import scenario as scenarios  # the scenario model: loaded with the scenarios

    values, spec = _values_of(request, op), operations.operation(op)
    check_target_gpu(scenario, kernel)
    capabilities = kernel.capabilities(op, spec.kv_format(scenario))
    paths = _part_paths(request, kernel, capabilities, op)
    whole = op in request.values
    spec.check_kv_tokens(scenario, values, request.kv_tokens)
    mnbt = _max_num_batched_tokens(request, op)
    padded_heads = scenarios.check_decode(scenario, capabilities.head_counts, kernel.label)
    spec.check_workspace(scenario, padded_heads)
    scenarios.check_decode_tokens(
        scenario, padded_heads, values if whole else [], field=spec.key, max_tokens=mnbt,
        max_tokens_field=_max_tokens_field(request), workspace=_bounds_tokens(op, paths))
    if request.capture_sizes is not None:
        scenarios.check_decode_tokens(scenario, padded_heads, request.capture_sizes,
                                      field="capture_sizes")
    if mnbt is not None:
        scenario = dataclasses.replace(scenario, serving=dataclasses.replace(
            scenario.serving, max_num_batched_tokens=mnbt))
    if whole and values:
        check_request(scenario, values, paths, kernel, fix=request.fix or RAISE_LIMIT, op=op)
    return SweepPart(scenario, source, op, runnable_tokens(scenario, values, paths, op), paths,
                     kernel)


def runnable_tokens(scenario: Scenario, tokens: Sequence[int], paths: Sequence[str],
                    op: str = operations.SPARSE_DECODE) -> list[int]:
    """The values of `tokens` (the operation's rows: T, requests, s_q) that `scenario` can run
    on `paths`: a workspace holds at most its workspace_rows. Sweeps over scenarios run each
    scenario's own."""
    if not any(p in STAGING_PATHS for p in paths):
        return list(tokens)
    return [t for t in tokens if t <= operations.workspace_rows(scenario, op)]


def check_request(scenario: Scenario, tokens: Sequence[int], paths: Sequence[str],
                  kernel: KernelContract, fix: str = RAISE_LIMIT,
                  op: str = operations.SPARSE_DECODE) -> None:
    """Reject what cannot run, before anything is allocated; `fix` names the fields that help."""
    spec = operations.operation(op)
    operations.check_cache(kernel, scenario, op)
    check_paths(paths, kernel.capabilities(op, spec.kv_format(scenario)), kernel.label)
    too_big = sorted(set(tokens) - set(runnable_tokens(scenario, tokens, paths, op)))
    if too_big:
        raise UserError(spec.workspace_refusal(scenario, too_big[0], fix), field=spec.key)


def _part_paths(request: Request, kernel: KernelContract, capabilities, op: str) -> list[str]:
    """The paths asked for, checked against the kernel; else those it has of the candidates."""
    if request.paths is None:
        available = available_paths(capabilities)
        return [p for p in request.candidate_paths or PATH_NAMES if p in available]
    try:
        check_paths(request.paths, capabilities, kernel.label, op)
    except UserError as exc:
        raise UserError(str(exc), field="paths") from None
    return list(request.paths)


def _max_tokens_field(request: Request) -> str | None:
    """The field max_num_batched_tokens came from: the request's, else the scenario's (None)."""
    return None if request.max_num_batched_tokens is None else "max_num_batched_tokens"


def _max_num_batched_tokens(request: Request, op: str | None) -> int | None:
    """The request's max_num_batched_tokens, which only the token workspaces take (`op` None:
    its sign only)."""
    mnbt = request.max_num_batched_tokens
    if mnbt is not None and mnbt <= 0:
        raise UserError(f"{mnbt} must be > 0; pass e.g. 32768", field="max_num_batched_tokens")
    spec = None if op is None else operations.operation(op)
    if mnbt is not None and spec is not None and not spec.tokens_workspace:
        takers = [n for n in operations.operation_names()
                  if operations.operation(n).tokens_workspace]
        raise UserError(f"sizes the token workspace of {', '.join(takers[:-1])} and {takers[-1]}; "
                        f"{op}'s holds the scenario's [serving].{spec.workspace_bound} "
                        f"{spec.key}: drop it", field="max_num_batched_tokens")
    return mnbt


def _check_keys_taken(request: Request, parts: Sequence[SweepPart]) -> None:
    """Each swept quantity asked for must be one that some part sweeps."""
    swept = sorted({operations.operation(p.op).key for p in parts})
    for key in request.keys:
        if key not in swept:
            raise UserError(f"no operation of this sweep takes it (it sweeps "
                            f"{', '.join(sorted({p.op for p in parts}))}); give "
                            f"{' or '.join(swept)} instead", field=key)
