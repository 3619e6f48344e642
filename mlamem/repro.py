"""`mlamem repro-oom`: reproduce a runtime OOM of one engine rank, per path, and find the limit.

Each measured case runs `mlamem.engine` in its own process, so an OOM or a poisoned CUDA context
never reaches the next case or this one; a process that dies still gets a verdict. Without a
GPU every case is predicted by the same emulation on the allocator model.

The largest safe max_num_batched_tokens is searched on the validated allocator model (fast,
byte-exact against the GPU); on a GPU the answer T is then confirmed by measuring T (must fit)
and T + 1 (must OOM), and bisected by measurement if either disagrees.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from mlamem import environment
from mlamem.context_reuse import (
    VARIANT_LABELS,
    VARIANTS,
    ContextCase,
    emulate_context,
    is_context_reuse,
)
from mlamem.engine import CRASHED, ERROR, FITS, Budget, EngineCase, emulate
from mlamem.errors import UserError
from mlamem.kernels import DEFAULT_KERNEL, SparseDecodeKernel, load_kernel
from mlamem.measure import local_sm_count
from mlamem.memory import SimulatedMemory
from mlamem.non_torch import NonTorchSetup, calibrated, find_setup
from mlamem.paths import check_paths
from mlamem.profile import scenario_summary
from mlamem.scenario import Scenario, to_dict
from mlamem.units import format_bytes

SCHEMA = "mlamem.repro-oom/1"
SEARCH_CAP_TOKENS = 1 << 21  # the search stops here: "at least this many"
WORKER = (sys.executable, "-P", "-m", "mlamem.engine")  # -P: the installed mlamem, never cwd's
CASE_TIMEOUT_S = 600


@dataclass(frozen=True)
class ReproResult:
    """The JSON schema `mlamem.repro-oom/1`: one entry in `cases` per path."""

    command: str
    measured: bool
    not_measured_reason: str | None  # why the verdicts are predicted
    scenario: dict
    kernel: dict
    budget: dict  # gpu_memory_bytes, utilization, max_num_batched_tokens, requested_bytes
    environment: environment.Environment
    cases: list[dict]  # decode: EngineCase + max_safe_*; context-reuse: ContextCase
    notes: list[str] = field(default_factory=list)
    mode: str = "decode"  # "decode" (one case per path) or "context-reuse" (per reserve variant)
    non_torch: dict | None = None  # the host setup the model took non-torch memory from
    schema: str = SCHEMA
    created: str | None = None  # when it was made: UTC, ISO 8601 (None in older files)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ReproResult:
        """Read back `to_dict()`, a saved mlamem.repro-oom/1 file; KeyError/TypeError if malformed."""
        return cls(
            command=data["command"], measured=data["measured"],
            not_measured_reason=data["not_measured_reason"], scenario=data["scenario"],
            kernel=data["kernel"], budget=data["budget"],
            environment=environment.Environment.from_dict(data["environment"]),
            cases=[dict(case) for case in data["cases"]], notes=list(data.get("notes", [])),
            created=data.get("created"), mode=data.get("mode", "decode"),
            non_torch=data.get("non_torch"))


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
    if "variant" in request:
        return ContextCase(variant=request["variant"], measured=True, verdict=CRASHED,
                           failure=failure).to_dict()
    case = EngineCase(path=request["path"], measured=True, verdict=CRASHED, failure=failure,
                      max_num_batched_tokens=request["budget"]["max_num_batched_tokens"])
    return case.to_dict()


def _confirm_on_gpu(verdict_at: Callable[[int], str], verdicts: dict[int, str], on_model: int,
                    announce: Callable[[int], None]) -> tuple[int, str]:
    """Measure the model's answer T and T + 1; bisect by measurement if either disagrees."""
    def fits(tokens: int) -> bool:
        if tokens not in verdicts:
            announce(tokens)
            verdicts[tokens] = verdict_at(tokens)
        return verdicts[tokens] == FITS

    runs_before = len(verdicts)
    on_gpu, _ = largest_fitting(fits, on_model)
    if on_gpu == on_model:
        return on_gpu, (f"validated allocator model, confirmed on the GPU ({on_gpu} fits, "
                        f"{on_gpu + 1} runs out of memory)")
    return on_gpu, (f"measured bisection on the GPU ({len(verdicts) - runs_before} runs); "
                    f"the model said {on_model}")


def _context_reuse(scenario, budget, kernel, *, command, reason, worker, progress,
                   sm_count, setup) -> ReproResult:
    """The three reserve variants of the context-MLA reuse case, each in its own process."""
    cases = []
    for variant in VARIANTS:
        progress(f"context reuse: {VARIANT_LABELS[variant]}")
        if reason is None:
            request = {"scenario": to_dict(scenario), "source": scenario.source,
                       "variant": variant, "kernel": kernel.name,
                       "budget": dataclasses.asdict(budget)}
            cases.append(run_case(request, worker))
        else:
            cases.append(emulate_context(SimulatedMemory(non_torch=setup), scenario, variant,
                                         budget.gpu_memory_bytes, budget.utilization).to_dict())
    return _result(scenario, budget, kernel, cases, [], command=command, reason=reason,
                   sm_count=sm_count, setup=setup, mode="context-reuse")


def check_local_gpu(budget: Budget, local_total_bytes: int, local_name: str) -> None:
    """Refuse to emulate a target GPU larger than the local one."""
    if budget.gpu_memory_bytes > local_total_bytes:
        raise UserError(f"--gpu-memory {format_bytes(budget.gpu_memory_bytes)} exceeds this "
                        f"{local_name}'s {format_bytes(local_total_bytes)}; emulate a target GPU "
                        "no larger than the local one")


def run_repro(scenario: Scenario, budget: Budget, paths: Sequence[str], *, command: str,
              kernel: SparseDecodeKernel | None = None, predict: bool = False,
              worker: Sequence[str] = WORKER,
              on_progress: Callable[[str], None] | None = None) -> ReproResult:
    """Emulate the rank once per path, then search each path's largest safe token budget."""
    kernel = kernel or load_kernel(DEFAULT_KERNEL)()
    check_paths(paths, kernel.capabilities(), kernel.label)
    reason = "--predict was given" if predict else kernel.unavailable_reason()
    measured = reason is None
    setup = host_setup(kernel.name)
    if measured:  # the CLI checks this before any output; here for callers of the library
        check_local_gpu(budget, setup.gpu_memory_bytes, setup.gpu)
    sm_count = local_sm_count() if measured else scenario.gpu.sm_count
    progress = on_progress or (lambda _: None)
    if is_context_reuse(scenario):
        return _context_reuse(scenario, budget, kernel, command=command, reason=reason,
                              worker=worker, progress=progress, sm_count=sm_count, setup=setup)

    def request(path: str, tokens: int) -> dict:
        return {"scenario": to_dict(scenario), "source": scenario.source, "path": path,
                "kernel": kernel.name,
                "budget": {**dataclasses.asdict(budget), "max_num_batched_tokens": tokens}}

    def predicted(path: str, tokens: int, host: NonTorchSetup) -> dict:
        at = dataclasses.replace(budget, max_num_batched_tokens=tokens)
        return emulate(SimulatedMemory(non_torch=host), scenario, kernel, at, path,
                       sm_count=sm_count).to_dict()

    cases = []
    for path in paths:
        tokens = budget.max_num_batched_tokens
        progress(f"{path}: full step at {tokens} tokens")
        case = predicted(path, tokens, setup)
        host = setup
        if measured:  # the model searches from this host's measured non-torch memory
            modelled = case["non_torch_bytes"]
            case = run_case(request(path, tokens), worker)
            if case.get("non_torch_bytes") is not None:
                host = calibrated(setup, modelled, case["non_torch_bytes"])
        progress(f"{path}: searching the largest safe max_num_batched_tokens on the model")
        on_model, _ = largest_fitting(
            lambda t, p=path, h=host: predicted(p, t, h)["verdict"] == FITS, tokens)
        case["max_safe_tokens"] = on_model
        case["max_safe_method"] = "validated allocator model (predicted, not measured)"
        if measured and case["verdict"] not in (ERROR, CRASHED):
            case["max_safe_tokens"], case["max_safe_method"] = _confirm_on_gpu(
                lambda t, p=path: run_case(request(p, t), worker)["verdict"],
                {tokens: case["verdict"]}, on_model,
                lambda t, p=path: progress(f"{p}: confirming on the GPU at {t} tokens"))
        cases.append(case)
    notes = []
    if not scenario.parallel.weights_gib_per_rank:
        notes.append("the scenario states no weights_gib_per_rank: weights count as 0 B; the "
                      "verdicts do not depend on it, only the KV-cache size does")
    return _result(scenario, budget, kernel, cases, notes, command=command, reason=reason,
                   sm_count=sm_count, setup=setup)


def check_target(budget: Budget, kernel: SparseDecodeKernel, predict: bool) -> None:
    """Before any work: refuse to measure a target GPU larger than the local one."""
    if not predict and kernel.unavailable_reason() is None:
        setup = host_setup(kernel.name)
        check_local_gpu(budget, setup.gpu_memory_bytes, setup.gpu)


def host_setup(kernel_name: str) -> NonTorchSetup:
    """The non-torch memory data for this host (the closest record, labelled, if none matches)."""
    if not torch.cuda.is_available():
        return find_setup(kernel_name)
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return find_setup(kernel_name, props.name, torch.__version__, torch.version.cuda,
                      props.total_memory)


def _result(scenario, budget, kernel, cases, notes, *, command, reason, sm_count, setup,
            mode="decode") -> ReproResult:
    capabilities = kernel.capabilities()
    padded_heads = capabilities.padded_heads(scenario.heads_per_rank)
    summary = {**scenario_summary(scenario, padded_heads),
               "weights_note": scenario.parallel.weights_note,
               "target_gpu": scenario.gpu.name}
    if reason is None:
        notes.append(f"the limit search models non-torch memory as {setup.describe()}, "
                     "calibrated to each case's measured figure")
    else:
        notes.append(f"non-torch memory (CUDA context, libraries, modules loaded by first "
                     f"launches) and the physical memory are modelled as {setup.describe()}")
    return ReproResult(
        command=command, measured=reason is None, not_measured_reason=reason, scenario=summary,
        mode=mode, non_torch=dataclasses.asdict(setup),
        kernel={"name": kernel.name, "label": kernel.label, "sm_count": sm_count,
                "version": kernel.version(),
                **dataclasses.asdict(capabilities)},
        budget={**dataclasses.asdict(budget), "requested_bytes": budget.requested_bytes},
        environment=environment.capture(), cases=cases, notes=notes,
        created=environment.now_utc())


# What a prediction cannot give, by name: `prediction_differences` skips these and says so.
NOT_PREDICTED_FIELDS = {
    "nvml_step_peak_bytes": "NVML reading",
    "failure": "error text (torch's message against the model's)",
    "max_safe_method": "how the limit was found",
    "measured": "measured or predicted",
}
NOT_PREDICTED_TOP = ("command", "created", "measured", "not_measured_reason", "environment",
                     "notes", "kernel", "non_torch")  # where and how each result was made


def prediction_differences(measured: dict, predicted: dict) -> list[str]:
    """Every field of every case on which a predicted repro-oom result (`to_dict()` or a saved
    file) differs from a measured one, as 'case: field: measured != predicted'; [] if equal.
    The fields of NOT_PREDICTED_FIELDS and NOT_PREDICTED_TOP are skipped."""
    measured, predicted = (ReproResult.from_dict(r).to_dict() for r in (measured, predicted))
    differences = [f"{key}: {measured.get(key)!r} != {predicted.get(key)!r}"
                   for key in sorted(set(measured) | set(predicted))
                   if key not in NOT_PREDICTED_TOP + ("cases",)
                   and measured.get(key) != predicted.get(key)]
    if len(measured["cases"]) != len(predicted["cases"]):
        return [*differences, "cases: the results have different numbers of cases"]
    for m, p in zip(measured["cases"], predicted["cases"], strict=True):
        name = m.get("path") or m.get("variant")
        differences += [f"{name}: {key}: {m.get(key)!r} != {p.get(key)!r}"
                        for key in sorted(set(m) | set(p))
                        if key not in NOT_PREDICTED_FIELDS and m.get(key) != p.get(key)]
    return differences
