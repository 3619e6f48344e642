"""`mlamem gate`: fail CI when per-call memory grows against a baseline file."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from mlamem import operations, render
from mlamem.cli import options as o
from mlamem.cli.app import app
from mlamem.cli.output import append_step_summary, command_line, note_predicted, progress
from mlamem.commands import gate as gating
from mlamem.commands import shards
from mlamem.runtime import environment
from mlamem.runtime.paths import PATH_NAMES
from mlamem.spec.errors import UserError
from mlamem.spec.files import check_output_path, pick_format, write_atomic
from mlamem.spec.scenario_names import shipped_names

BaselineOption = Annotated[Path, typer.Option(
    parser=o.no_stdout("the baseline is read and rewritten in place: give a file path, "
                       "e.g. --baseline ci/mlamem-baseline.json"),
    help="The baseline file (JSON schema mlamem.baseline/1); --update writes it.")]
GateScenarioOption = Annotated[str | None, o.scenario_option(
    "the baseline's (all for a new one)", many=True)]
GateOpOption = Annotated[str | None, o.op_option(
    "Gate this operation only. Default: the baseline's operations; with --update, every "
    "operation the kernel runs that each scenario declares.")]
GateTokensOption = Annotated[str | None, o.tokens_option(
    f"the baseline's ({o.DECODE_SWEEP} for a new one), each scenario "
    "the ones its max_num_batched_tokens allows")]
GateRequestsOption = Annotated[str | None, o.requests_option(
    f"the baseline's ({o.DENSE_SWEEP} for a new one)")]
GatePathsOption = Annotated[str | None, typer.Option(
    help="Comma-separated paths. Default: the baseline's (every path the kernel supports "
         "for a new one).")]
GateKernelOption = Annotated[o.KernelName | None, o.kernel_option(
    f"the baseline's ({gating.DEFAULT_KERNEL} for a new one)")]
ToleranceOption = Annotated[str | None, typer.Option(
    help="Growth that still passes: 0 (byte-exact), 1MiB, 0.5%, or per metric, e.g. "
         "peak_reserved=2MiB,buffer=0 (metrics: " + ", ".join(gating.METRICS) + "). "
         "Default: 0, byte-exact, for predicted and measured baselines alike (measured "
         "figures do not move between runs: reports/baselines/noise-h200.md).")]
UpdateOption = Annotated[bool, typer.Option(
    help="Write this run's figures as the new baseline (atomically), showing what changed.")]
AllowEnvChangeOption = Annotated[bool, typer.Option(
    help="Compare even across a different GPU architecture, kernel version, or measured "
         "against predicted.")]
ShardOption = Annotated[str | None, typer.Option(
    "--shard", metavar="I/N", help="Gate shard I of N of the sweep, e.g. 2/4 (its units "
    "dealt as profile --shard deals them): compare only its cases and exit by them, so CI "
    "passes when every shard passes. Not with --update.", show_default=False)]


@app.command()
def gate(
    baseline: BaselineOption,
    scenario: GateScenarioOption = None,
    op: GateOpOption = None,
    tokens: GateTokensOption = None,
    requests: GateRequestsOption = None,
    paths: GatePathsOption = None,
    kernel: GateKernelOption = None,
    tolerance: ToleranceOption = None,
    update: UpdateOption = False,
    allow_env_change: AllowEnvChangeOption = False,
    predict: Annotated[bool, o.predict_option(" (to gate against a predicted baseline)")] = False,
    shard: ShardOption = None,
) -> None:
    """Fail CI when per-call memory grows: compare a profile sweep with a baseline file.

    Every (scenario, operation, swept value, path) of the sweep is measured on a GPU (predicted
    without one) and its peak allocated, peak reserved, bytes allocated inside the call and
    per-buffer bytes are compared with the baseline. Without flags the baseline's own sweep
    (kernel, scenarios, operations, values, paths) runs again. Exits 1 if any grew beyond the
    tolerance, 0 otherwise (an improvement says to update the baseline), 2 on bad input or a
    baseline from a different environment. Prints a Markdown diff, also appended to
    $GITHUB_STEP_SUMMARY when set.
    """
    overrides, chosen_shard = _checked_flags(tolerance, allow_env_change, shard, update)
    values_given = _values_given(op, tokens, requests)
    previous, unreadable = _previous(baseline, update)
    recorded = gating.recorded_sweep(previous) if previous else None
    decode = o.make_kernel(kernel if kernel is not None else gating.sweep_kernel(recorded or {}))
    values = {name: values_given.get(operations.operation(name).key)
              or gating.sweep_values(recorded, name) for name in operations.operation_names()}
    parts = _sharded(_plan(scenario, op, paths, decode, recorded, values, values_given, update),
                     chosen_shard)
    compared = previous is not None and not update and not allow_env_change
    if not update:
        gating.check_covered(previous, parts)
    if compared:  # this machine against the baseline's
        _check_here(previous, decode, predict, baseline)
    if unreadable is not None:
        print(f"mlamem: replacing an unreadable baseline ({unreadable.worded('--baseline')})",
              file=sys.stderr)
    current = _run(parts, values, decode, predict)
    if compared:
        gating.check_comparable(gating.environment_differences(previous, current), baseline)
    note_predicted(current)
    _finish(previous, current, overrides, baseline, update, chosen_shard)


def _checked_flags(tolerance: str | None, allow_env_change: bool, shard: str | None,
                   update: bool):
    """(the tolerances given, the shard given), refusing the flags --update makes moot."""
    for flag, given in (("--tolerance", tolerance is not None),
                        ("--allow-env-change", allow_env_change)):
        if update and given:
            raise UserError(f"{flag} has no effect with --update, which writes this run's "
                            "figures whatever they are; drop one of them")
    overrides = gating.parse_tolerances(tolerance) if tolerance is not None else {}
    chosen_shard = o.parse_shard_option(shard)
    if update and chosen_shard is not None:
        raise UserError("--update writes the whole sweep's baseline, --shard gates a part of it: "
                        "drop --shard to update")
    return overrides, chosen_shard


def _sharded(parts, chosen_shard):
    """The parts of the shard asked for (all without --shard); a note when it holds none."""
    if chosen_shard is None:
        return parts
    units = sum(len(p.values) for p in parts)
    parts = gating.shard_parts(parts, chosen_shard)
    if not any(p.values for p in parts):
        print(shards.empty_note(chosen_shard, units, "it compares nothing and passes"),
              file=sys.stderr)
    return parts


def _values_given(op, tokens: str | None, requests: str | None) -> dict[str, list[int]]:
    """The values asked for, by swept quantity (`tokens`, `requests`)."""
    if op is not None:  # --tokens or --requests, whichever the operation sweeps
        swept = o.parse_sweep(op, tokens, requests)
        return {} if swept is None else {operations.operation(op).key: swept}
    return {key: o.parse_tokens(text, flag, symbol) for key, flag, text, symbol in (
        ("tokens", "--tokens", tokens, "T"), ("requests", "--requests", requests, "b"))
        if text is not None}


def _previous(baseline: Path, update: bool):
    """(the baseline, None), or with --update (None, its error) where it cannot be read; a new
    baseline's folder is created, as in `--baseline ci/mlamem.json --update`."""
    if update:
        pick_format(baseline, None, ["json"], "baseline", what="a baseline")
        check_output_path(baseline, "baseline", parents=True)
    if update and not baseline.exists():
        return None, None
    try:
        return gating.load(baseline), None
    except UserError as exc:
        if not update:
            raise UserError(f"{exc.message}: `mlamem gate --baseline {baseline} --update`",
                            field=exc.field) from None
        return None, exc  # said once every input is checked


def _plan(scenario: str | None, op, paths: str | None, kernel, recorded: dict | None,
          values: dict, values_given: dict, update: bool):
    """The sweep's parts. Defaults: the baseline's own sweep; for a new baseline, every
    shipped scenario, each operation's default values and every path the kernel has."""
    if op is not None:
        ops = [op]
    elif update:  # every operation the kernel runs; each scenario keeps those it declares
        ops = list(kernel.operations)
    else:
        ops = gating.sweep_ops(recorded)
    names = recorded["scenarios"] if recorded else shipped_names()
    if scenario == "all":
        names = shipped_names()
    elif scenario is not None:
        names = o.scenario_names(scenario)
    asked = o.split_paths(paths) if paths is not None else None
    return gating.plan_sweep(
        [(name, o.load_scenario(name)) for name in names], ops, values,
        asked or list(recorded["paths"] if recorded else PATH_NAMES), kernel,
        op_given=op is not None, named=scenario not in (None, "all"),
        keys_given=list(values_given), paths_given=asked is not None, fix=o.DROP_CASE)


def _check_here(previous, kernel, predict: bool, baseline: Path) -> None:
    """Refuse, before the sweep runs, a machine the baseline's figures cannot be compared on."""
    reason = "--predict was given" if predict else kernel.unavailable_reason()
    here = (reason is None, kernel.name, environment.capture().model_dump())
    gating.check_comparable(gating.differences_between(gating.origin(previous), here), baseline)


def _run(parts, values: dict, kernel, predict: bool):
    """Profile every part, with progress: the current figures."""
    total = sum(len(p.values) * len(p.paths) for p in parts)
    with progress("gate", total) as advance:
        return gating.run_sweep(
            parts, gating.sweep_record(parts, values, kernel.name), command=command_line(),
            kernel=kernel, predict=predict,
            on_case=lambda name, op, case: advance(
                f"{name} {op}: {operations.operation(op).symbol}={case.tokens} {case.path} "
                f"{case.failure or 'ok'}"))


def _finish(previous, current, overrides: dict, baseline: Path, update: bool,
            chosen_shard) -> None:
    """Compare, write the baseline with --update, print the diff; exit 1 where memory grew."""
    tolerances = {**gating.default_tolerances(), **overrides}
    result = None if previous is None else gating.compare(previous, current, tolerances)
    if update:
        write_atomic(baseline, render.baseline_json(current), "baseline", parents=True)
    text = render.gate_markdown(result, baseline=str(baseline), measured=current.measured,
                                updated=update,
                                shard=None if chosen_shard is None else str(chosen_shard))
    sys.stdout.write(text)
    append_step_summary(text)
    if result is not None and not update and not result.passed:
        raise typer.Exit(1)
