"""The skeleton every emulated engine rank runs in, the case it fills, and the budget.

`Engine.emulate` runs one case through one rank in the engines' start-up order:
1. cap torch at the target GPU's memory less the non-torch memory (CUDA context, libraries),
   counted as used minus torch-reserved: measured, this process's own NVML figure where NVML
   lists it, else device-wide (`memory.NonTorchReading.charged_bytes`);
2. init (`init`): what the engine places before profiling (weights, workspaces, inputs);
3. profile (`profile`): the engine's profile pass; its peak over init is recorded, then the
   cache is emptied;
4. the non-torch memory is read again and the cap set from it, as the engine's profile ends;
5. graph estimate (`estimate_graphs`): the CUDA graphs' memory, where the engine estimates it
   before sizing the KV cache (with CUDA graphs on);
6. KV sizing (`size_kv_cache`): the engine sizes its KV cache (or raises `NoKVRoom`) and the
   skeleton allocates it;
7. capture (`capture_graphs`): the CUDA-graph captures after the KV cache (graphs on;
   vLLM's and SGLang's);
8. one full step (`step`), measured by `measure.measure_one`.
A failure before the step is the engine's own allocation (`allocating` names it), unless a
phase reports a classified one (`PhaseFailed`, e.g. a capture); in the step an OOM is named
from the step's expected buffers. The same code runs on a GPU
(`CudaMemory`, each case in its own process: `python -m mlamem.engines`) and on the allocator
model (`SimulatedMemory`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import ClassVar, NamedTuple

import torch

from mlamem.kernels import BufferSpec, KernelContract
from mlamem.runtime.attribution import ExpectedBuffer
from mlamem.runtime.measure import CallRecord, Failure, classify_failure, measure_one, without_record
from mlamem.runtime.memory import CudaMemory, SimulatedMemory
from mlamem.spec.engines import (  # noqa: F401 (re-exported: the ranks' results read through the specs)
    Column,
    EngineSpec,
    Verdict,
    View,
    charged_per_process,
)
from mlamem.spec.errors import UserError
from mlamem.spec.scenario import Scenario
from mlamem.spec.units import check_fraction


class Phase(StrEnum):
    """How far a case got, in the skeleton's order; DONE once the step completed."""

    INIT = "init"
    PROFILE = "profile"
    GRAPH_ESTIMATE = "graph-estimate"
    KV_CACHE = "kv-cache"
    CAPTURE = "capture"
    STEP = "step"
    DONE = "done"


@dataclass(frozen=True)
class Budget:
    """The target GPU and the memory settings every engine takes for one rank; an engine with
    options of its own subclasses it (`Engine.budget_type`)."""

    gpu_memory_bytes: int  # the target GPU's total memory (e.g. an 80 GiB H100)
    utilization: float  # --gpu-memory-utilization (TRT-LLM: free_gpu_memory_fraction)
    max_num_batched_tokens: int  # tokens per step; sizes the workspace and the profile pass

    def __post_init__(self) -> None:
        check_fraction(self.utilization, "utilization")
        if self.gpu_memory_bytes <= 0:
            raise UserError("must be positive; pass a size such as 80GiB", field="gpu_memory_bytes")
        if self.max_num_batched_tokens <= 0:
            raise UserError(f"{self.max_num_batched_tokens} must be > 0; pass e.g. 32768",
                            field="max_num_batched_tokens")

    @property
    def requested_bytes(self) -> int:
        """What the engine may use: utilization x total."""
        return int(self.utilization * self.gpu_memory_bytes)

    def to_dict(self) -> dict:
        """The budget as a request or a result states it."""
        return dataclasses.asdict(self)


@dataclass(kw_only=True)
class Case:
    """One case through one emulated rank: the figures every engine records, in bytes
    (absolute unless named otherwise). An engine's case subclass adds its own."""

    key_field: ClassVar[str]  # the field that names the case among its engine's cases

    measured: bool
    verdict: Verdict = Verdict.ERROR
    phase: Phase = Phase.INIT  # the phase it reached; DONE when the step completed
    torch_limit_bytes: int | None = None  # the cap on torch's reserved memory
    non_torch_bytes: int | None = None  # at KV sizing, charged: measured (this process's own
    # NVML figure, else device-wide: nvml_visibility says which), or the host setup's model
    weights_bytes: int = 0
    profile_peak_bytes: int | None = None  # the profile pass's peak over init
    step_peak_bytes: int | None = None  # torch's reserved peak during the step (fits)
    headroom_bytes: int | None = None  # cap - step peak (fits)
    nvml_step_peak_bytes: int | None = None  # measured: this process's device memory at the peak
    # (device-wide NVML less what others used at start: a neighbour's later use moves it)
    # NVML's readings (measured; absent from predicted cases, NVML_FIELDS):
    nvml_visibility: str | None = None  # "this process": non_torch_bytes is its own figure;
    # else why NVML does not give it, and non_torch_bytes is the device-wide fallback
    nvml_process_step_peak_bytes: int | None = None  # this process's own NVML peak in the step
    # at KV sizing, beside non_torch_bytes: the non-torch memory from this process's own figure,
    # which no neighbour moves; the device-wide reading, as the engine reads it (less the
    # others' use at start: a neighbour's later use moves it); the other processes' use then,
    # NVML's device-wide used memory minus this process's
    non_torch_process_bytes: int | None = None
    non_torch_device_bytes: int | None = None
    other_processes_bytes: int | None = None
    oom_requested_bytes: int | None = None  # the allocation that failed
    oom_buffer: str | None = None  # its name, e.g. "o_accum"
    oom_allocated_by: str | None = None  # who asked: "wrapper", "kernel", "engine", "init", ...
    free_bytes_at_oom: int | None = None  # cap - reserved when it failed
    failure: str | None = None  # one line, for oom, no-kv-room, error and crashed
    buffers: list[dict] = field(default_factory=list)  # the step's allocations, named
    call: CallRecord | None = None  # the measured step's record; not saved (to_dict)

    def record_failure(self, failure: Failure) -> None:
        """An OOM with the request, buffer and free bytes it names; anything else an error."""
        self.failure = failure.text
        if not failure.oom:
            self.verdict = Verdict.ERROR
            return
        self.verdict = Verdict.OOM
        self.oom_requested_bytes = failure.requested_bytes
        self.oom_buffer, self.oom_allocated_by = failure.buffer, failure.allocated_by
        if failure.reserved_bytes is not None and self.torch_limit_bytes is not None:
            self.free_bytes_at_oom = self.torch_limit_bytes - failure.reserved_bytes

    def record_step(self, call: CallRecord, memory) -> None:
        """The measured step: its failure, or its reserved peak, the headroom under the cap and
        its named buffers."""
        self.call = call
        if call.failure is not None:
            self.record_failure(call.failure)
            return
        self.verdict, self.phase = Verdict.FITS, Phase.DONE
        self.step_peak_bytes = call.after.peak_reserved
        self.headroom_bytes = self.torch_limit_bytes - call.after.peak_reserved
        self.buffers = [b.to_dict() for b in call.buffers]
        if memory.measured and call.device_peak_bytes is not None:
            self.nvml_step_peak_bytes = call.device_peak_bytes - memory.used_by_others
        self.nvml_process_step_peak_bytes = call.nvml_process_peak_bytes

    def record_non_torch(self, memory) -> None:
        """At KV sizing: the non-torch memory the engine is charged (the model's, or one
        measured reading: `NonTorchReading.charged_bytes`) and, measured, both readings beside
        it, the other processes' use at that moment and whether this process's own is visible."""
        if not memory.measured:
            self.non_torch_bytes = non_torch_now(memory)
            return
        reading = memory.non_torch_reading()
        self.non_torch_bytes = reading.charged_bytes or 0  # as non_torch_now: 0 without NVML
        self.nvml_visibility = reading.visibility
        self.non_torch_process_bytes = reading.process_bytes
        self.non_torch_device_bytes = reading.device_bytes
        self.other_processes_bytes = reading.other_processes_bytes

    def to_dict(self) -> dict:
        """The JSON case: its key first, verdict and phase as plain strings."""
        data = {name: value.value if isinstance(value, Enum) else value
                for name, value in without_record(self).items()
                if self.measured or name not in NVML_FIELDS}  # predicted: as it read
        return {self.key_field: data.pop(self.key_field), **data}


# A measured case's NVML readings beside its charged figures: a predicted case has none
# (nothing is read), and its dict stays as it read before they were recorded
NVML_FIELDS = ("nvml_visibility", "nvml_process_step_peak_bytes", "non_torch_process_bytes",
               "non_torch_device_bytes", "other_processes_bytes",
               "graph_estimate_other_processes_bytes")


class PhaseFailed(Exception):
    """Raised by a phase with a failure it classified itself (a capture names its buffer)."""

    def __init__(self, failure: Failure):
        super().__init__(failure.text)
        self.failure = failure


class NoKVRoom(Exception):
    """Raised by `Engine.size_kv_cache`: nothing is left for the KV cache; says why."""


@dataclass(frozen=True)
class RankMemory:
    """One rank's memory as the engines' fractions see it, in bytes: the GPU's total, the
    non-torch memory (CUDA context, libraries), what init places (the weights and the rest) and
    the activations a profile pass peaks at (`Engine.knob_for_pool`)."""

    total_bytes: int
    non_torch_bytes: int
    init_bytes: int
    activation_bytes: int


class Knob(NamedTuple):
    """An engine's memory fraction, and what it multiplies."""

    engine: str
    name: str  # the engine's flag, e.g. gpu_memory_utilization
    value: float
    multiplies: str  # in words: "the GPU's total memory", ...


class Step(NamedTuple):
    """The full step: what it runs, and the buffers it is expected to allocate (to name them)."""

    body: Callable[[], None]
    expected: list[ExpectedBuffer]


class Engine(ABC):
    """One engine; an instance is one rank running one case (`emulate`).

    Subclasses implement the phases (`init`, `profile`, `size_kv_cache`, `step`) and may
    implement the CUDA-graph ones (`estimate_graphs`, `capture_graphs`); `emulate` runs them in
    the skeleton's order (see the module docstring). Tensors that stay for the case go in
    `resident`; `allocating` names what is being allocated, for an OOM outside the step.
    """

    name: ClassVar[str]  # its name in the engine registry
    spec: ClassVar[EngineSpec]  # its spec (spec/engines): its view, knobs' names, table
    case_type: ClassVar[type[Case]]
    budget_type: ClassVar[type[Budget]] = Budget  # its knobs and options
    captures_graphs: ClassVar[bool] = False  # has CUDA-graph phases (its budget's cuda_graphs)
    searched_knob: ClassVar[str | None] = None  # the budget knob (a token count) whose largest
    #                                             safe value repro-oom searches per case
    searched_fraction: ClassVar[str | None] = None  # a budget fraction whose largest safe value
    #                                                 repro-oom searches per case, on the model
    step_knob_name: ClassVar[str] = "max_num_batched_tokens"  # the engine's own name for the
    #                                                          budget's max_num_batched_tokens
    reads_utilization: ClassVar[bool] = True  # the budget's utilization is its knob (SGLang: no)
    view: ClassVar[View]
    kv_cache_name: ClassVar[str] = "kv_cache"  # names the KV cache, should allocating it fail

    def __init__(self, memory: CudaMemory | SimulatedMemory, scenario: Scenario,
                 kernel: KernelContract, budget: Budget, case: Case, *, sm_count: int,
                 seed: int = 0):
        self.memory, self.scenario, self.kernel, self.budget = memory, scenario, kernel, budget
        self.case, self.sm_count, self.seed = case, sm_count, seed
        self.resident: list[torch.Tensor] = []  # weights, KV cache, ...: alive until the case ends
        self.contexts = contextlib.ExitStack()  # entered for the case (CUDA graphs), closed after
        self.allocating = "weights"

    # What the engine serves and how its cases are named

    @classmethod
    def check(cls, scenario: Scenario) -> None:
        """Refuse, in one line (UserError), a scenario this engine cannot serve."""
        return None  # by default it serves every scenario that declares it

    @classmethod
    @abstractmethod
    def case_keys(cls, paths: list[str]) -> list[str]:
        """The cases repro-oom runs, by key, given the chosen decode paths."""

    @classmethod
    def notes(cls, cases: list[dict]) -> list[str]:
        """Lines the result adds about these cases (none by default)."""
        return []

    @classmethod
    def knob_for_pool(cls, rank: RankMemory, pool_bytes: int) -> Knob | None:
        """This engine's memory fraction that gives a KV pool of `pool_bytes` on `rank`, as
        its own rule multiplies it; None for an engine without one."""
        return None

    @classmethod
    def pinned(cls, budget: Budget, case: dict) -> Budget:
        """The budget the step-token search varies: `budget`, or, for an engine that derives its
        fraction from the step's tokens when none is given (SGLang), with the fraction `case`
        ran with pinned; a different budget asks for the search with the fraction re-derived
        too (`max_safe_tokens_rederived`)."""
        return budget

    @classmethod
    def check_graphs(cls, scenario: Scenario, budget: Budget) -> None:
        """With CUDA graphs on: refuse, in one line (UserError), graph settings this engine
        cannot capture, before any case runs."""
        return None

    @classmethod
    def default_step_tokens(cls, scenario: Scenario, gpu_memory_bytes: int) -> int:
        """The step's tokens (the budget's max_num_batched_tokens) when none is given."""
        return scenario.serving.max_num_batched_tokens

    @classmethod
    def make_budget(cls, **knobs) -> Budget:
        """This engine's budget from the knobs a face gathered: an option the engine lacks is
        dropped while it is off (None or False), refused (UserError naming it) when set."""
        names = {f.name for f in dataclasses.fields(cls.budget_type)}
        for name, value in knobs.items():
            if name not in names and value not in (None, False):
                raise UserError(f"the {cls.name} engine has no such option (given {value!r})",
                                field=name)
        return cls.budget_type(**{k: v for k, v in knobs.items() if k in names})

    @classmethod
    @abstractmethod
    def new_case(cls, key: str, budget: dict, *, measured: bool, **fields) -> Case:
        """An empty case for `key` under `budget`, as a request states it (`Budget.to_dict`;
        fields: e.g. the failure of a case that never ran)."""

    @classmethod
    def emulate(cls, memory: CudaMemory | SimulatedMemory, scenario: Scenario,
                kernel: KernelContract, budget: Budget, key: str, *, sm_count: int,
                seed: int = 0) -> Case:
        """Run case `key` through one rank of this engine; see the module docstring. A plain
        `Budget` reads as this engine's, its options off."""
        if not isinstance(budget, cls.budget_type):
            budget = cls.make_budget(**dataclasses.asdict(budget))
        case = cls.new_case(key, budget.to_dict(), measured=memory.measured,
                            weights_bytes=scenario.parallel.weights_bytes)
        with memory:  # the rank and its tensors are gone before the memory is left
            engine = cls(memory, scenario, kernel, budget, case, sm_count=sm_count, seed=seed)
            with engine.contexts:
                engine._run()
            del engine
        return case

    def _run(self) -> None:
        memory, case = self.memory, self.case
        before = memory.stats(device=False)
        try:
            case.torch_limit_bytes = memory.set_limit(self.budget.gpu_memory_bytes
                                                      - non_torch_now(memory))
            self.init()
            case.phase = Phase.PROFILE
            memory.reset_peaks()
            start = memory.stats().allocated
            self.profile()
            case.profile_peak_bytes = memory.stats().peak_allocated - start
            memory.empty_cache()
            case.record_non_torch(memory)
            case.torch_limit_bytes = memory.set_limit(self.budget.gpu_memory_bytes
                                                      - case.non_torch_bytes)
            case.phase = Phase.GRAPH_ESTIMATE
            self.estimate_graphs()
            case.phase = Phase.KV_CACHE
            kv_bytes = self.size_kv_cache()
            self.allocating = self.kv_cache_name
            self.resident.append(torch.empty(kv_bytes, dtype=torch.uint8, device=memory.device))
            case.phase = Phase.CAPTURE
            self.capture_graphs()
        except NoKVRoom as no_room:
            case.verdict, case.failure = Verdict.NO_KV_ROOM, str(no_room)
            return
        except PhaseFailed as failed:
            case.record_failure(failed.failure)
            return
        except Exception as exc:
            failure = classify_failure(exc, memory, before.num_ooms)
            if failure.oom:  # before the step: the engine's own allocation failed
                failure = dataclasses.replace(failure, buffer=self.allocating,
                                              allocated_by="init")
            case.record_failure(failure)
            return
        case.phase = Phase.STEP
        step = self.step()
        case.record_step(measure_one(memory, step.body, step.expected), memory)

    # The phases, in the skeleton's order

    @abstractmethod
    def init(self) -> None:
        """Place what the engine allocates before profiling; keep it in `resident`."""

    @abstractmethod
    def profile(self) -> None:
        """The profile pass: allocate what it allocates and let it go."""

    def estimate_graphs(self) -> None:
        """Before KV sizing: the memory the engine sets aside for CUDA graphs."""
        return None  # by default none (vLLM's engine estimates them, engines/vllm.py)

    @abstractmethod
    def size_kv_cache(self) -> int:
        """The KV cache's bytes, the engine's figures recorded in the case; raise NoKVRoom
        when nothing is left for it."""

    def capture_graphs(self) -> None:
        """After the KV cache: the engine's CUDA-graph captures."""
        return None  # by default none (vLLM's engine captures them, engines/vllm.py)

    @abstractmethod
    def step(self) -> Step:
        """The full step the case ends with."""


def non_torch_now(memory) -> int:
    """Non-torch memory now, as charged: measured (this process's own where NVML lists it, else
    device-wide), or modelled from the host setup; 0 B if neither knows."""
    return memory.non_torch_bytes() or 0


def allocate_specs(specs: list[BufferSpec], device: torch.device) -> dict[str, torch.Tensor]:
    """Empty tensors for `specs`, by name, in order."""
    return {s.name: torch.empty(s.shape, dtype=s.dtype, device=device) for s in specs}
