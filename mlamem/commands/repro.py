"""`mlamem repro-oom`: reproduce a runtime OOM of one engine rank, per path, and find the limit.

One engine (from the engine registry, the scenario's first unless chosen) runs each of its
cases; repro names no engine. Each measured case runs `python -m mlamem.engines` in its own
process, so an OOM or a poisoned CUDA context never reaches the next case or this one; a process
that dies still gets a verdict. Without a GPU every case is predicted by the same emulation on
the allocator model.

For an engine that names a searched knob (`Engine.searched_knob`: vLLM's max_num_batched_tokens),
its largest safe value is searched on the validated allocator model (fast, byte-exact against the
GPU); on a GPU the answer T is then confirmed by measuring T (must fit) and T + 1 (must OOM), and
bisected by measurement if either disagrees.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from mlamem import results
from mlamem.commands.profile import scenario_summary
from mlamem.engines import load_engine, request_engine
from mlamem.engines.base import NVML_FIELDS, Budget, Engine, Verdict, charged_per_process
from mlamem.kernels import DEFAULT_KERNEL, KernelContract, load_kernel
from mlamem.operations import padded_heads_for
from mlamem.results.repro import ReproFile
from mlamem.runtime import environment
from mlamem.runtime.measure import local_sm_count
from mlamem.runtime.memory import SimulatedMemory
from mlamem.runtime.non_torch import (
    NonTorchSetup,
    calibrated,
    find_setup,
    local_setup,
    target_setup,
)
from mlamem.runtime.paths import check_paths
from mlamem.spec.engine_registry import declared_engine
from mlamem.spec.errors import UserError
from mlamem.spec.scenario import Scenario, to_dict
from mlamem.spec.units import format_bytes

SCHEMA = "mlamem.repro-oom/1"
SEARCH_CAP_TOKENS = 1 << 21  # the search stops here: "at least this many"
WORKER = (sys.executable, "-P", "-m", "mlamem.engines")  # -P: the installed mlamem, never cwd's
CASE_TIMEOUT_S = 600


def read_result(data: dict | ReproFile) -> ReproFile:
    """A saved mlamem.repro-oom/1 file's object (or a result already read), checked by its
    model (older files' `mode` becomes `engine`); ValueError (one line naming the field) if
    malformed."""
    return data if isinstance(data, ReproFile) else results.parse(data, SCHEMA)


def largest_fitting(fits: Callable[[int], bool], guess: int,
                    cap: int = SEARCH_CAP_TOKENS) -> tuple[int, int]:
    """(largest T in [0, cap] with fits(T), number of fits calls), for a monotone `fits`.

    Gallops away from `guess` in steps 1, 2, 4, ... until the answer is bracketed, then bisects;
    a right guess costs two calls (guess fits, guess + 1 does not). 0 means nothing fits.
    """
    calls = 0

    def probe(tokens: int) -> bool:
        nonlocal calls
        calls += 1
        return fits(tokens)

    guess = min(max(guess, 1), cap)
    step = 1
    if probe(guess):
        low = guess
        while low < cap and probe(min(low + step, cap)):
            low, step = min(low + step, cap), step * 2
        if low == cap:
            return cap, calls
        high = min(low + step, cap)
    else:
        high = guess
        while high > 1 and not probe(max(high - step, 1)):
            high, step = max(high - step, 1), step * 2
        if high == 1:
            return 0, calls
        low = max(high - step, 1)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if probe(middle) else (low, middle)
    return low, calls


def run_case(request: dict, worker: Sequence[str] = WORKER,
             timeout_s: float = CASE_TIMEOUT_S) -> dict:
    """Run one case in its own process; a process that dies without a result gets CRASHED."""
    with tempfile.TemporaryDirectory(prefix="mlamem-case-") as folder:
        request_file, result_file = Path(folder, "request.json"), Path(folder, "result.json")
        request_file.write_text(json.dumps(request))
        try:
            done = subprocess.run([*worker, str(request_file), str(result_file)],
                                  capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return _crashed(request, f"no result after {timeout_s:.0f} s; the case was killed")
        if result_file.is_file():
            return json.loads(result_file.read_text())
        code = done.returncode
        how = (f"killed by {signal.Signals(-code).name}" if code < 0
               else f"exited with status {code}")
        last = next((line for line in reversed(done.stderr.splitlines()) if line.strip()), "")
        return _crashed(request, f"the case's process {how} without a result: {last}".rstrip(": "))


def _crashed(request: dict, failure: str) -> dict:
    engine = load_engine(request_engine(request))
    return engine.new_case(request[engine.case_type.key_field],
                           request["budget"], measured=True,
                           verdict=Verdict.CRASHED, failure=failure).to_dict()


def _confirm_on_gpu(verdict_at: Callable[[int], str], verdicts: dict[int, str], on_model: int,
                    announce: Callable[[int], None]) -> tuple[int, str]:
    """Measure the model's answer T and T + 1; bisect by measurement if either disagrees."""
    def fits(tokens: int) -> bool:
        if tokens not in verdicts:
            announce(tokens)
            verdicts[tokens] = verdict_at(tokens)
        return verdicts[tokens] == Verdict.FITS

    runs_before = len(verdicts)
    on_gpu, _ = largest_fitting(fits, on_model)
    if on_gpu == on_model:
        return on_gpu, (f"validated allocator model, confirmed on the GPU ({on_gpu} fits, "
                        f"{on_gpu + 1} runs out of memory)")
    return on_gpu, (f"measured bisection on the GPU ({len(verdicts) - runs_before} runs); "
                    f"the model said {on_model}")


def check_local_gpu(budget: Budget, local_total_bytes: int, local_name: str) -> None:
    """Refuse to emulate a target GPU larger than the local one, naming the local total in
    whole MiB (a target given as nvidia-smi's figure is a few hundred MiB over CUDA's)."""
    if budget.gpu_memory_bytes > local_total_bytes:
        raise UserError(f"{format_bytes(budget.gpu_memory_bytes)} exceeds this {local_name}'s "
                        f"{format_bytes(local_total_bytes)}; emulate a target GPU no larger than "
                        f"the local one, e.g. its own {local_total_bytes // 2**20}MiB",
                        field="gpu_memory_bytes")


def run_repro(scenario: Scenario, budget: Budget, paths: Sequence[str], *, command: str,
              kernel: KernelContract | None = None, predict: bool = False,
              engine: str | None = None, worker: Sequence[str] = WORKER,
              on_progress: Callable[[str], None] | None = None) -> ReproFile:
    """Emulate the rank once per case of `engine` (default: the scenario's first), then, where
    the engine searches it, each case's largest safe token budget."""
    kernel = kernel or load_kernel(DEFAULT_KERNEL)()
    chosen = scenario_engine(scenario, engine)
    check_paths(paths, kernel.capabilities(), kernel.label)
    reason = "--predict was given" if predict else kernel.unavailable_reason()
    if reason is None:  # the CLI checks this before any output; here for callers of the library
        local = host_setup(kernel.name)
        check_local_gpu(budget, local.gpu_memory_bytes, local.gpu)
    setup = host_setup(kernel.name, predict=reason is not None,
                       target_bytes=budget.gpu_memory_bytes, target_gpu=target_gpu(scenario, budget))
    sm_count = scenario.gpu.sm_count if reason is not None else local_sm_count()
    run = _Run(scenario, budget, kernel, chosen, setup, sm_count, measured=reason is None,
               worker=worker, progress=on_progress or (lambda _: None))
    cases = [run.case(key) for key in chosen.case_keys(list(paths))]
    notes = chosen.notes(cases)
    if not scenario.parallel.weights_gib_per_rank:
        notes.append("the scenario states no weights_gib_per_rank: weights count as 0 B; the "
                      "verdicts do not depend on it, only the KV-cache size does")
    return _result(scenario, budget, kernel, chosen, cases, notes, command=command,
                   reason=reason, sm_count=sm_count, setup=setup)


def predict_case(engine: type[Engine], scenario: Scenario, kernel: KernelContract,
                 budget: Budget, key: str, host: NonTorchSetup, sm_count: int) -> dict:
    """Case `key` of `engine` predicted on the allocator model, on the physical device and
    non-torch memory of `host`, as a result's case dict."""
    return engine.emulate(SimulatedMemory(non_torch=host), scenario, kernel, budget, key,
                          sm_count=sm_count).to_dict()


def target_gpu(scenario: Scenario, budget: Budget) -> str | None:
    """The target GPU's name, where the budget keeps its memory (--gpu-memory names none)."""
    return scenario.gpu.name if budget.gpu_memory_bytes == scenario.gpu.memory_bytes else None


@dataclass
class _Run:
    """One repro-oom run's cases: each emulated on the model (and, measured, run in its own
    process), then its limits searched, the target GPU as the physical device (`setup`)."""

    scenario: Scenario
    budget: Budget
    kernel: KernelContract
    engine: type[Engine]
    setup: NonTorchSetup
    sm_count: int
    measured: bool
    worker: Sequence[str]
    progress: Callable[[str], None]

    def request(self, key: str, at: Budget) -> dict:
        return {"engine": self.engine.name, "scenario": to_dict(self.scenario),
                "source": self.scenario.source, self.engine.case_type.key_field: key,
                "kernel": self.kernel.name, "budget": at.to_dict()}

    def predicted(self, key: str, at: Budget, host: NonTorchSetup) -> dict:
        return predict_case(self.engine, self.scenario, self.kernel, at, key, host, self.sm_count)

    def case(self, key: str) -> dict:
        """One case: its verdict (measured or predicted), then its limits."""
        chosen, budget, progress = self.engine, self.budget, self.progress
        progress(f"{chosen.view.case_label({chosen.case_type.key_field: key})}: emulating the rank")
        case = self.predicted(key, budget, self.setup)
        host = self.setup
        if self.measured:  # the model searches from this host's measured non-torch memory
            modelled = case["non_torch_bytes"]
            case = run_case(self.request(key, budget), self.worker)
            if case.get("non_torch_bytes") is not None:
                host = calibrated(self.setup, modelled, case["non_torch_bytes"],
                                  device_wide=not charged_per_process(case))
        if chosen.searched_knob is not None:
            self._search_knob(case, key, host)
        if chosen.searched_fraction is not None:
            progress(f"{key}: searching the largest safe {chosen.searched_fraction} on the model")
            case.update(largest_safe_fraction(
                case, budget, chosen.searched_fraction,
                lambda at: self.predicted(key, at, host)["verdict"]))
        return case

    def _search_knob(self, case: dict, key: str, host: NonTorchSetup) -> None:
        """The case's largest safe value of the engine's searched knob: as pinned, and with
        the fraction re-derived (where none is given)."""
        knob, budget = self.engine.searched_knob, self.budget
        pinned = self.engine.pinned(budget, case)
        case.update(_largest_safe(case, key, pinned, knob, host, measured=self.measured,
                                  predicted=self.predicted, request=self.request,
                                  worker=self.worker, progress=self.progress))
        if pinned != budget:  # the fraction follows the tokens where none is given
            self.progress(f"{key}: searching the largest safe {knob} with the fraction re-derived")
            case["max_safe_tokens_rederived"], _ = largest_fitting(
                lambda t: self.predicted(key, dataclasses.replace(budget, **{knob: t}),
                                         host)["verdict"] == Verdict.FITS,
                getattr(budget, knob))


def _largest_safe(case: dict, key: str, budget: Budget, knob: str, host: NonTorchSetup, *,
                  measured: bool, predicted, request, worker, progress) -> dict:
    """max_safe_tokens and max_safe_method of one case, for the engine's searched `knob`:
    searched on the model, then, measured, confirmed (or bisected) on the GPU."""
    def at(value: int) -> Budget:
        return dataclasses.replace(budget, **{knob: value})

    progress(f"{key}: searching the largest safe {knob} on the model")
    on_model, _ = largest_fitting(
        lambda t: predicted(key, at(t), host)["verdict"] == Verdict.FITS, getattr(budget, knob))
    if not measured or case["verdict"] in (Verdict.ERROR, Verdict.CRASHED):
        return {"max_safe_tokens": on_model,
                "max_safe_method": "validated allocator model (predicted, not measured)"}
    found, method = _confirm_on_gpu(
        lambda t: run_case(request(key, at(t)), worker)["verdict"],
        {getattr(budget, knob): case["verdict"]}, on_model,
        lambda t: progress(f"{key}: confirming on the GPU at {knob} {t}"))
    return {"max_safe_tokens": found, "max_safe_method": method}


def largest_safe_on_target(key: str, budget: Budget, knob: str, target_host: NonTorchSetup,
                            predicted, guess: int) -> int:
    """A case's largest safe `knob` on the model with the target GPU as the physical device
    (`target_host`): the CUDA modules loaded after the KV cache is sized take its memory."""
    found, _ = largest_fitting(lambda t: predicted(
        key, dataclasses.replace(budget, **{knob: t}), target_host)["verdict"] == Verdict.FITS,
        guess)
    return found


def largest_safe_fraction(case: dict, budget: Budget, knob: str,
                           verdict_at: Callable[[Budget], str]) -> dict:
    """max_safe_<knob>: the largest value of the budget's fraction `knob`, in thousandths as
    engines take it, at which the case fits on the model (0 where none does). A larger
    fraction gives the KV pool more, so the step runs out of memory above the answer; a
    smaller one may leave no pool at all."""
    def at(thousandths: int) -> Budget:
        return dataclasses.replace(budget, **{knob: thousandths / 1000})

    start = case.get(knob) or getattr(budget, knob) or 0.5
    found, _ = largest_fitting(lambda t: verdict_at(at(t)) != Verdict.OOM, round(start * 1000),
                               cap=999)
    if found and verdict_at(at(found)) != Verdict.FITS:
        found = 0
    return {f"max_safe_{knob}": found / 1000}


def scenario_engine(scenario: Scenario, engine: str | None = None) -> type[Engine]:
    """The engine to emulate: `engine`, which the scenario must declare, else its first; a
    UserError in one line when the scenario does not declare it or the engine refuses it."""
    chosen = load_engine(declared_engine(scenario, engine))
    chosen.check(scenario)
    return chosen


def check_target(budget: Budget, kernel: KernelContract, predict: bool) -> None:
    """Before any work: refuse to measure a target GPU larger than the local one."""
    if not predict and kernel.unavailable_reason() is None:
        setup = host_setup(kernel.name)
        check_local_gpu(budget, setup.gpu_memory_bytes, setup.gpu)


def host_setup(kernel_name: str, *, predict: bool = False, target_bytes: int | None = None,
               target_gpu: str | None = None) -> NonTorchSetup:
    """The non-torch memory data for this host (the closest record, labelled, if none matches).
    `predict`: the kernel's recorded host, wherever mlamem runs, so a prediction is the same on a
    CPU, an H100 or an H200 (a smaller local GPU never caps a target it does not run).
    `target_bytes`: the target GPU as the physical device (`non_torch.target_setup`): predicted,
    the record of the target's GPU, else the nearest record with the target's memory; measured,
    this host's where it is the target, else the target's record, else this host's with the
    target's memory (a larger GPU keeps to the target's room: CudaMemory.emulate_target)."""
    if predict or not torch.cuda.is_available():
        if target_bytes is None:
            return find_setup(kernel_name)
        return target_setup(kernel_name, target_bytes, target_gpu)
    host = local_setup(kernel_name)
    if target_bytes is None:
        return host
    return target_setup(kernel_name, target_bytes, target_gpu, host=host)


def _result(scenario, budget, kernel, engine, cases, notes, *, command, reason, sm_count,
            setup) -> ReproFile:
    capabilities = kernel.capabilities()
    summary = {**scenario_summary(scenario, padded_heads_for(kernel, scenario)),
               "weights_note": scenario.parallel.weights_note,
               "target_gpu": scenario.gpu.name}
    if reason is None:
        notes.append(f"the limit search models non-torch memory as {setup.describe()}, "
                     "calibrated to each case's measured figure")
        notes += non_torch_notes(cases, engine.case_type.key_field)
    else:
        notes.append(f"non-torch memory (CUDA context, libraries, modules loaded by first "
                     f"launches) and the physical memory are modelled as {setup.describe()}")
    return results.parse({
        "command": command, "measured": reason is None, "not_measured_reason": reason,
        "scenario": summary,
        "kernel": {"name": kernel.name, "label": kernel.label, "sm_count": sm_count,
                   "version": kernel.version(), **dataclasses.asdict(capabilities)},
        "budget": _budget_dict(budget, scenario),
        "environment": environment.capture().model_dump(), "cases": cases,
        "notes": notes, "engine": engine.name, "non_torch": dataclasses.asdict(setup),
        "schema": SCHEMA, "created": environment.now_utc()}, SCHEMA)


def non_torch_notes(cases: list[dict], key_field: str) -> list[str]:
    """A measured result's line per case on its NVML readings: the non-torch memory charged from
    this process's own figure, with the device-wide reading and the other processes' use beside
    it, or the device-wide fallback and why; vLLM's CUDA-graph estimate, which stays device-wide
    as vLLM reads it, with the other processes' use at that moment."""
    lines = []
    for case in cases:
        visibility = case.get("nvml_visibility")
        if visibility is None:  # nothing was read: a crashed case
            continue
        line = f"{case[key_field]}: " + _charged_text(case, visibility)
        if "graph_estimate_other_processes_bytes" in case:  # CUDA graphs on
            line += ("; vLLM's CUDA-graph estimate stays device-wide, as vLLM reads it "
                     "(mem_get_info's growth): other processes used "
                     f"{_amount(case['graph_estimate_other_processes_bytes'])} then")
        lines.append(line)
    return lines


def _charged_text(case: dict, visibility: str) -> str:
    """Which reading a measured case charged, with the other beside it."""
    if charged_per_process(case):
        return (f"non-torch memory charged from this process's own NVML figure "
                f"({_amount(case['non_torch_bytes'])}), which no other process moves; "
                f"device-wide, as the engine reads it: {_amount(case['non_torch_device_bytes'])}"
                f" (less the others' use at start), other processes using "
                f"{_amount(case['other_processes_bytes'])} then")
    return (f"non-torch memory charged device-wide ({_amount(case['non_torch_bytes'])}: NVML's "
            f"used memory less the others' use at start), as NVML gives no figure of this "
            f"process's own ({visibility}); another process's use after the start moves it, "
            "and the cap, KV cache and limits with it")


def _amount(value: int | None) -> str:
    return "unknown" if value is None else format_bytes(value)


def _budget_dict(budget: Budget, scenario: Scenario) -> dict:
    """The result's budget; where the target memory is not the scenario GPU's, that GPU's
    memory too (`scenario_gpu_memory_bytes`), so a reader can tell the two apart."""
    data = {**budget.to_dict(), "requested_bytes": budget.requested_bytes}
    if budget.gpu_memory_bytes != scenario.gpu.memory_bytes:
        data["scenario_gpu_memory_bytes"] = scenario.gpu.memory_bytes
    return data


# What a prediction cannot give, by name: `prediction_differences` skips these and says so.
NOT_PREDICTED_FIELDS = {
    "nvml_step_peak_bytes": "NVML reading",
    **dict.fromkeys(NVML_FIELDS, "NVML reading"),
    "nvml_visibility": "NVML's process list",
    "failure": "error text (torch's message against the model's)",
    "max_safe_method": "how the limit was found",
    "measured": "measured or predicted",
}
NOT_PREDICTED_TOP = ("command", "created", "measured", "not_measured_reason", "environment",
                     "notes", "kernel", "non_torch")  # where and how each result was made
# the scenario's words, not its figures: a weights_note reworded since a run (the placeholders that
# became labelled overrides) leaves the run's scenario the same
NOT_PREDICTED_SCENARIO = ("weights_note",)


def prediction_differences(measured: dict, predicted: dict) -> list[str]:
    """Every field of every case on which a predicted repro-oom result (a `ReproFile` or a saved
    file's object) differs from a measured one, as 'case: field: measured != predicted'; [] if equal.
    The fields of NOT_PREDICTED_FIELDS, NOT_PREDICTED_TOP and the scenario's
    NOT_PREDICTED_SCENARIO are skipped, and the ledger (`log`, predicted in both) where the
    measured result has none: a file measured before a public startup line stood in for a TP
    rank's log."""
    measured, predicted = (read_result(r).file_dict() for r in (measured, predicted))
    if measured.get("log") is None:
        predicted.pop("log", None)
    for result in (measured, predicted):
        result["scenario"] = {k: v for k, v in result["scenario"].items()
                              if k not in NOT_PREDICTED_SCENARIO}
    differences = [f"{key}: {measured.get(key)!r} != {predicted.get(key)!r}"
                   for key in sorted(set(measured) | set(predicted))
                   if key not in NOT_PREDICTED_TOP + ("cases",)
                   and measured.get(key) != predicted.get(key)]
    if len(measured["cases"]) != len(predicted["cases"]):
        return [*differences, "cases: the results have different numbers of cases"]
    key_field = load_engine(measured["engine"]).case_type.key_field
    for m, p in zip(measured["cases"], predicted["cases"], strict=True):
        name = m.get(key_field)
        differences += [f"{name}: {key}: {m.get(key)!r} != {p.get(key)!r}"
                        for key in sorted(set(m) | set(p))
                        if key not in NOT_PREDICTED_FIELDS and m.get(key) != p.get(key)]
    return differences
