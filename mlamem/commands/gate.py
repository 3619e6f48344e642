"""`mlamem gate`: compare a profile sweep with a committed baseline, byte by byte.

A baseline (JSON schema `mlamem.baseline/1`) holds, for every (scenario, operation, swept
value, path) of a sweep, the figures the gate watches: peak allocated, peak reserved, bytes
allocated inside the call and the bytes of each named buffer; plus the environment it was made
in and the sweep itself (kernel, scenarios, operations, values, paths), so a bare rerun repeats
it exactly. The swept value is T (sparse decode), b requests (dense decode) or s_q (sparse
prefill), kept under `tokens` in every case. Baselines from before operations have no `op`:
they are sparse decode. Everything here works on plain data; `plan_sweep` checks a sweep before
any work (through `mlamem.commands.sweep`, the one planner), `run_sweep` is the one function that
runs the profiler.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from mlamem import operations, results
from mlamem.commands.profile import run_profile
from mlamem.commands.sweep import Request, SweepPart, plan
from mlamem.kernels import DEFAULT_KERNEL, REGISTRY
from mlamem.runtime.environment import kernel_versions
from mlamem.runtime.paths import PATH_NAMES
from mlamem.spec.errors import UserError
from mlamem.spec.files import check_name_length, loads_json, read_text
from mlamem.spec.kernel_api import DENSE_DECODE, SPARSE_DECODE, operation_names
from mlamem.spec.lists import parse_list
from mlamem.spec.units import parse_bytes

if TYPE_CHECKING:  # the profiler (and torch) load only when a sweep runs
    from mlamem.commands.shards import Shard
    from mlamem.results.baseline import BaselineFile
    from mlamem.results.profile import ProfileFile
    from mlamem.runtime.measure import CallMeasurement
    from mlamem.spec.kernel_api import KernelContract
    from mlamem.spec.scenario import Scenario

SCHEMA = "mlamem.baseline/1"

# Metric name -> the case field it reads; "buffer" compares each named buffer's bytes.
METRICS = {
    "peak_allocated": "peak_allocated_bytes",
    "peak_reserved": "peak_reserved_bytes",
    "allocated_in_call": "bytes_allocated_in_call",
    "buffer": None,
}


@dataclass(frozen=True)
class Tolerance:
    """Growth the gate lets pass: the larger of a byte count and a fraction of the baseline."""

    bytes: int = 0
    fraction: float = 0.0  # 0.005 = 0.5 %

    def allowed_bytes(self, baseline_bytes: int) -> int:
        return max(self.bytes, int(self.fraction * baseline_bytes))


# The default for every baseline, predicted or measured. Over 5 fresh-process sweeps of every
# shipped scenario on the H200 (benchmarks/gate_noise.py; reports/baselines/noise-h200.md), no
# gated figure moved by a single byte: the caching allocator is deterministic for a fixed request
# sequence. So measured baselines are byte-exact too; --tolerance loosens them.
EXACT = {metric: Tolerance() for metric in METRICS}


def default_tolerances() -> dict[str, Tolerance]:
    """Byte-exact for every metric, predicted and measured baselines alike (see `EXACT`)."""
    return dict(EXACT)


_TOLERANCE_HINT = ("write 0, 1MiB or 0.5%, or per metric e.g. peak_reserved=2MiB,buffer=0 "
                   f"(metrics: {', '.join(METRICS)}; units: B, KiB, MiB, GiB, or KB, MB, GB)")


def parse_tolerance(text: str) -> Tolerance:
    """'0' -> exact, '1MiB' -> 1048576 bytes, '0.5%' -> 0.5 % of the baseline figure."""
    number = text.strip().removesuffix("%")
    try:
        if number != text.strip():
            percent = float(number)
            if not 0 <= percent < float("inf"):  # also nan
                raise ValueError(text)
            return Tolerance(fraction=percent / 100)
        return Tolerance(bytes=parse_bytes(text))
    except ValueError:
        raise UserError(f"{text!r} is not a tolerance; {_TOLERANCE_HINT}", field="tolerance") from None


def parse_tolerances(text: str) -> dict[str, Tolerance]:
    """'0.5%' applies to every metric; 'peak_reserved=2MiB,buffer=0' to the metrics named, and
    '1MiB,buffer=0' to buffer 0 and to the others 1MiB, in either order. A metric named twice,
    or two tolerances for every metric, are refused."""
    def one(item: str) -> tuple[str | None, Tolerance]:
        metric, sep, value = item.partition("=")
        if not sep:
            return None, parse_tolerance(item)
        if metric.strip() not in METRICS:
            raise UserError(f"unknown metric {metric.strip()!r}; expected one of: "
                            f"{', '.join(METRICS)}", field="tolerance")
        return metric.strip(), parse_tolerance(value)

    chosen = parse_list(text, "tolerance", one, key=lambda pair: pair[0],
                        label=lambda pair: pair[0] or "a tolerance for every metric",
                        each="metric")
    every = {metric: tolerance for bare, tolerance in chosen if bare is None for metric in METRICS}
    return {**every, **{metric: tolerance for metric, tolerance in chosen if metric is not None}}


def baseline_from(results: Sequence[ProfileFile], sweep: dict, command: str) -> BaselineFile:
    """The gated figures of profile results (one per scenario, all measured or all predicted)."""
    from mlamem.results.baseline import BaselineFile  # pydantic: once a sweep has run

    cases = []
    for result in results:
        for row in result.rows:
            buffers: dict[str, int] = {}
            for b in row.buffers:
                buffers[b.name] = buffers.get(b.name, 0) + b.requested_bytes
            cases.append({
                "scenario": row.scenario, "op": row.op, "tokens": row.tokens,
                "requests": row.requests, "kv_tokens": row.kv_tokens, "path": row.path,
                "peak_allocated_bytes": row.peak_allocated_bytes,
                "peak_reserved_bytes": row.peak_reserved_bytes,
                "bytes_allocated_in_call": row.bytes_allocated_in_call, "buffers": buffers,
                "failure": row.failure})
    return BaselineFile.model_validate({
        "schema": SCHEMA, "command": command, "measured": all(r.measured for r in results),
        "not_measured_reason": results[0].not_measured_reason,
        "environment": results[0].environment.model_dump(), "sweep": sweep,
        "cases": cases})


def sweep_ops(sweep: dict) -> list[str]:
    """The operations a recorded sweep covers (`sweep`: a baseline's, as in its file)."""
    return list(sweep["ops"])


def sweep_values(sweep: dict | None, op: str) -> list[int]:
    """The values a recorded sweep gives `op` (`tokens`: T and s_q, `requests`: b); the
    operation's default sweep where the recorded sweep covered no operation swept that way."""
    key = operations.operation(op).key
    if sweep and any(operations.operation(o).key == key for o in sweep_ops(sweep)):
        return list(sweep.get(key, []))
    return list(operations.operation(op).default_sweep)


def plan_sweep(chosen: Sequence[tuple[str, Scenario]], ops: Sequence[str],
               values: dict[str, list[int]], paths: Sequence[str], kernel: KernelContract,
               *, op_given: bool = False, named: bool = True, keys_given: Sequence[str] = (),
               paths_given: bool = False, fix: str | None = None) -> list[SweepPart]:
    """The gate's sweep, checked and split into (scenario, operation) parts by the one sweep
    planner (`mlamem.commands.sweep.plan`): each chosen scenario runs every operation of `ops` that the
    kernel runs and the scenario declares, at `values[op]` (filtered by what its workspace
    holds) on the `paths` the kernel has for it.

    `chosen`: (name or TOML path as given, scenario) pairs. `op_given`: `ops` was asked for,
    and the kernel must run it. `named`: the scenarios were named (not `all`), so each must
    drive one of `ops`. `keys_given`: the swept quantities asked for (`tokens`, `requests`),
    whose values every scenario must take whole. `paths_given`: `paths` was asked for, so each
    must be supported; otherwise a part runs the ones of `paths` its kernel has. `fix` says
    what helps when a value asked for does not suit a scenario.
    """
    given = {o: v for o, v in values.items() if operations.operation(o).key in keys_given}
    return plan(Request(
        "gate", kernel, scenarios=chosen if named else (),
        candidate_scenarios=() if named else chosen, ops=ops if op_given else (),
        candidate_ops=None if op_given else ops, values=given,
        defaults={o: v for o, v in values.items() if o not in given}, keys=keys_given,
        paths=list(paths) if paths_given else None,
        candidate_paths=None if paths_given else list(paths), fix=fix))


def sweep_record(parts: Sequence[SweepPart], values: dict[str, list[int]], kernel: str) -> dict:
    """What a baseline records of its sweep, so that a bare rerun repeats it: the scenarios
    (names or TOML paths as given) and operations that ran, the values of each way of sweeping
    (as asked, before each scenario's filter; empty when no operation swept that way), every
    path a part ran, and the kernel."""
    ops = [o for o in operation_names() if any(p.op == o for p in parts)]
    names = list(dict.fromkeys(p.source for p in parts))
    by_key = {operations.operation(o).key: values[o] for o in ops}
    paths = [name for name in PATH_NAMES if any(name in p.paths for p in parts)]
    return {"scenarios": names, "ops": ops, "tokens": list(by_key.get("tokens", [])),
            "requests": list(by_key.get("requests", [])), "paths": paths, "kernel": kernel}


def run_sweep(parts: Sequence[SweepPart], sweep: dict, *, command: str,
              kernel: KernelContract, predict: bool = False,
              on_case: Callable[[str, str, CallMeasurement], None] | None = None
              ) -> BaselineFile:
    """Profile every part (measured on a GPU, else predicted) and keep the gated figures.
    `on_case(scenario, op, case)` sees each call as it finishes."""
    results = [run_profile(p.scenario, p.values, p.paths, command=command, kernel=kernel,
                           predict=predict, op=p.op,
                           on_case=on_case and (lambda case, p=p: on_case(p.scenario.name, p.op,
                                                                          case)))
               for p in parts]
    return baseline_from(results, sweep, command)


def shard_parts(parts: Sequence[SweepPart], shard: Shard) -> list[SweepPart]:
    """The parts with the values of `shard`'s units only (`Shard.pick_sweep`). A part keeps its
    place with no values where the shard holds none of its units: it then runs nothing, but
    still says how the sweep runs (measured or predicted, and where)."""
    return [dataclasses.replace(part, values=values)
            for part, values in shard.pick_sweep([(p, p.values) for p in parts])]


def sweep_kernel(sweep: dict | None) -> str:
    """The --kernel a recorded sweep ran; for a new baseline (none recorded), the default."""
    return sweep["kernel"] if sweep else DEFAULT_KERNEL


# Reading a baseline: every problem is one line naming the file and what to do.

def load(path: Path) -> BaselineFile:
    """Read and check a baseline file; UserError (exit 2) if missing, corrupt or wrong schema."""
    fix = "make one with an update run"  # the CLI adds its command
    check_name_length(path, "baseline")
    if not path.exists():
        raise UserError(f"{path} not found; {fix}", field="baseline")
    text = read_text(path, "baseline (JSON)", field="baseline")
    try:
        data = loads_json(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path} is not valid JSON ({exc}); {fix}", field="baseline") from None
    except (ValueError, RecursionError) as exc:
        raise UserError(f"{path} is not valid JSON ({exc}); {fix}", field="baseline") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        found = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise UserError(f"{path} has schema {found!r}, expected {SCHEMA!r}; {fix}",
                        field="baseline")
    try:
        return _parse(data)
    except ValueError as exc:
        raise UserError(f"{path} is not a valid {SCHEMA} file ({exc}); {fix}",
                        field="baseline") from None


def _parse(data: dict) -> BaselineFile:
    """A baseline file's object, checked by its model (`mlamem.results`: every field's type,
    older files' defaults), then what only a registry knows: the operations and the kernel."""
    baseline = results.parse(data, SCHEMA)
    for i, case in enumerate(baseline.cases):
        if case.op not in operation_names():
            raise ValueError(f"cases[{i}].op: {case.op!r} is not one of {', '.join(operation_names())}")
    sweep = baseline.sweep
    unknown = [o for o in sweep.ops if o not in operation_names()]
    if unknown:
        raise ValueError(f"sweep.ops: {unknown[0]!r} is not one of {', '.join(operation_names())}")
    if DENSE_DECODE in sweep.ops and "requests" not in sweep.model_fields_set:
        raise ValueError("sweep.requests: missing (the sweep covers dense-decode)")
    if sweep.kernel not in REGISTRY:
        raise ValueError(f"sweep.kernel: {sweep.kernel!r} is not one of {', '.join(REGISTRY)}")
    return baseline


def recorded_sweep(baseline: BaselineFile) -> dict:
    """A baseline's sweep as its file holds it (the keys an older file lacks stay absent)."""
    return baseline.sweep.model_dump(exclude_unset=True)


def check_covered(baseline: BaselineFile, parts: Sequence[SweepPart]) -> None:
    """Every case about to be swept must have baseline figures to compare with."""
    known = {case.key for case in baseline.cases}
    for part in parts:
        name, symbol = part.scenario.name, operations.operation(part.op).symbol
        for t in part.values:
            for path in part.paths:
                if (name, part.op, t, path) not in known:
                    raise UserError(f"the baseline has no figures for {name} {symbol}={t} {path} "
                                    f"({part.op}); drop the scenario, operation, value and path "
                                    "choices to rerun the baseline's sweep, or add the case by "
                                    "updating the baseline", field="baseline")


# The environment: what makes two sweeps comparable.

@dataclass(frozen=True)
class EnvironmentDifference:
    """One environment field that differs between the baseline and this run."""

    name: str  # e.g. "compute_capability"
    baseline: object
    current: object
    blocking: bool  # the comparison would be meaningless without --allow-env-change


def environment_differences(baseline: BaselineFile, current: BaselineFile
                            ) -> list[EnvironmentDifference]:
    """Fields that differ between a baseline and this run (`differences_between`)."""
    return differences_between(origin(baseline), origin(current))


def origin(baseline: BaselineFile) -> tuple[bool, str, dict]:
    """What makes a baseline's figures comparable: (measured, kernel, environment)."""
    return (baseline.measured, baseline.sweep.kernel,
            baseline.environment.model_dump(exclude_unset=True))


def differences_between(before: tuple[bool, str, dict], now: tuple[bool, str, dict]
                        ) -> list[EnvironmentDifference]:
    """Fields that differ between two results, each (measured, kernel, environment as a dict).
    Blocking: measured vs predicted, the kernel (--kernel), the version of the later result's
    kernel (`kernels.<name>`; other kernels' versions do not touch its figures), and, between
    measured results, the GPU architecture (compute capability, SM count). Between predictions,
    a version recorded on one side only does not block: the side without the kernel installed
    modelled the schema mlamem assumes for its pinned build (a CI baseline, read on a machine
    with FlashMLA)."""
    (was_measured, was_kernel, was_env), (is_measured, kernel, env) = before, now
    both_measured = was_measured and is_measured
    differences = []
    if was_measured != is_measured:
        differences.append(EnvironmentDifference(
            "measured", _kind(was_measured), _kind(is_measured), True))
    if was_kernel != kernel:
        differences.append(EnvironmentDifference("kernel", was_kernel, kernel, True))
    fields = [(name, blocking, was_env.get(name), env.get(name)) for name, blocking in (
        ("compute_capability", both_measured), ("sm_count", both_measured))]
    versions = _kernel_version(was_env, kernel), _kernel_version(env, kernel)
    fields.append((f"kernels.{kernel}", was_measured or is_measured or None not in versions,
                   *versions))
    fields += [(name, False, was_env.get(name), env.get(name))
               for name in ("gpu", "torch", "mlamem", "allocator_conf")]
    differences += [EnvironmentDifference(name, old, new, blocking)
                    for name, blocking, old, new in fields if old != new]
    return differences


def _kernel_version(env: dict, kernel: str) -> str | None:
    """`kernel`'s version in a saved environment (None where not recorded), read as
    `Environment.from_dict` reads it (an old baseline's per-kernel fields count), without
    needing the environment's other fields."""
    try:
        return kernel_versions(env).get(kernel)
    except ValueError as exc:  # a legacy field contradicting `kernels`: not a comparable file
        raise UserError(f"{exc}; make a new one (update the baseline)", field="baseline") from None


def _kind(measured: bool) -> str:
    return "measured" if measured else "predicted"


def check_comparable(differences: Sequence[EnvironmentDifference], source: Path) -> None:
    """Refuse (exit 2) a comparison across a blocking difference, saying what differs."""
    blocking = [d for d in differences if d.blocking]
    if blocking:
        what = "; ".join(f"{d.name}: baseline {d.baseline}, this run {d.current}" for d in blocking)
        raise UserError(f"{source} was made in a different environment ({what}); "
                        "allow the environment change to compare anyway, or update the baseline "
                        "to replace it", field="allow_env_change")


# The comparison.

@dataclass(frozen=True)
class Change:
    """One figure of one case that differs from the baseline."""

    scenario: str
    tokens: int  # the swept value: T, b or s_q
    path: str
    metric: str  # one of METRICS, or "failure" when the call newly fails or no longer fails
    buffer: str | None  # the buffer's name, for metric "buffer"
    baseline_bytes: int | None  # None: no such buffer in the baseline (or a failed call)
    current_bytes: int | None  # None: no such buffer now (or a failed call)
    allowed_bytes: int  # growth (and shrinkage) the tolerance lets pass as noise
    verdict: str  # "regressed", "improved" or "within tolerance"
    detail: str | None = None  # the failure, for metric "failure"
    op: str = SPARSE_DECODE  # the kernel operation

    @property
    def difference_bytes(self) -> int | None:
        if self.metric == "failure":
            return None
        return (self.current_bytes or 0) - (self.baseline_bytes or 0)


@dataclass(frozen=True)
class GateResult:
    """Every figure of the sweep compared with the baseline; only the ones that moved are kept."""

    changes: list[Change]
    compared_figures: int
    compared_cases: int
    not_swept: int  # baseline cases this sweep did not run
    not_in_baseline: int  # cases of this sweep the baseline lacks (only after --update)
    tolerances: dict[str, Tolerance]
    environment: list[EnvironmentDifference] = field(default_factory=list)

    @property
    def regressions(self) -> list[Change]:
        return [c for c in self.changes if c.verdict == "regressed"]

    @property
    def improvements(self) -> list[Change]:
        return [c for c in self.changes if c.verdict == "improved"]

    @property
    def passed(self) -> bool:
        return not self.regressions


def _verdict(difference: int, allowed: int) -> str | None:
    if difference > allowed:
        return "regressed"
    if difference < -allowed:
        return "improved"
    return "within tolerance" if difference else None


def compare(baseline: BaselineFile, current: BaselineFile,
            tolerances: dict[str, Tolerance]) -> GateResult:
    """Compare every gated figure of `current` with `baseline`; cases it lacks are counted."""
    before = {case.key: case for case in baseline.cases}
    changes, compared = [], 0
    for now in current.cases:
        base = before.get(now.key)
        if base is None:  # a case the baseline does not have (only after --update)
            continue
        where = {"scenario": now.scenario, "op": now.op, "tokens": now.tokens,
                 "path": now.path}
        if (base.failure is None) != (now.failure is None):
            changes.append(Change(
                **where, metric="failure", buffer=None, baseline_bytes=None, current_bytes=None,
                allowed_bytes=0, verdict="regressed" if now.failure else "improved",
                detail=f"fails: {now.failure}" if now.failure else f"no longer fails ({base.failure})"))
        if base.failure or now.failure:
            continue
        items = [(metric, None, getattr(base, key), getattr(now, key))
                 for metric, key in METRICS.items() if key]
        items += [("buffer", name, base.buffers.get(name), now.buffers.get(name))
                  for name in dict.fromkeys([*base.buffers, *now.buffers])]
        for metric, buffer, old, new in items:
            compared += 1
            allowed = tolerances[metric].allowed_bytes(old or 0)
            verdict = _verdict((new or 0) - (old or 0), allowed)
            if verdict:
                changes.append(Change(**where, metric=metric, buffer=buffer, baseline_bytes=old,
                                      current_bytes=new, allowed_bytes=allowed, verdict=verdict))
    swept = {case.key for case in current.cases}
    new_cases = sum(case.key not in before for case in current.cases)
    return GateResult(changes=changes, compared_figures=compared,
                      compared_cases=len(current.cases) - new_cases,
                      not_swept=sum(case.key not in swept for case in baseline.cases),
                      not_in_baseline=new_cases,
                      tolerances=tolerances,
                      environment=environment_differences(baseline, current))
