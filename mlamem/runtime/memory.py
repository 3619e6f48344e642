"""Two memory backends behind one interface, so one measurement protocol serves both.

`CudaMemory` reads the real caching allocator (`torch.cuda.memory_stats`), NVML and the
allocator's event trace. `SimulatedMemory` runs the same code on the meta device: a dispatch
mode feeds every meta allocation and free into `CachingAllocatorModel`, and the kernel adapters'
allocation specs stand in for what a kernel allocates inside itself.

Both capture CUDA graphs into one shared private pool (`memory.graphs()`), as engines do: on a
GPU with `torch.cuda.graph`, on the model by sending a capture's requests to a private pool.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import re
import weakref
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from mlamem.runtime import nvml
from mlamem.runtime.allocator import (
    CAPTURE_STREAM_POOL,
    ROUND_LARGE,
    AllocatorOutOfMemory,
    CachingAllocatorModel,
)
from mlamem.runtime.frames import python_frames
from mlamem.runtime.non_torch import GRAPH_CAPTURE, NonTorchSetup, graph_step_launch

_TRIED = re.compile(r"Tried to allocate ([0-9.]+) (B|KiB|MiB|GiB)")
_UNITS = {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}


@dataclass
class MemoryStats:
    """Allocator and device counters at one moment, in bytes."""

    allocated: int
    reserved: int
    peak_allocated: int
    peak_reserved: int
    device_used: int | None  # NVML's used memory (all processes); None without NVML
    num_ooms: int


@dataclass(frozen=True)
class NonTorchReading:
    """Non-torch memory (outside torch's allocator) at one moment, read two ways, in bytes.

    `process_bytes`: this process's own NVML figure less torch's reserved, which no other
    process moves; None where NVML does not give it (`visibility`: nvml.process_visibility).
    `device_bytes`: NVML's device-wide used memory, less what the other processes used before
    this one touched CUDA, less reserved: an engine's reading; another process's use after the
    start moves it. `other_processes_bytes`: device-wide used less this process's own figure
    (None where not visible). The device-wide reading holds, beyond this process's own, what
    NVML counts as used outside any process (`NonTorchSetup.process_bytes`).
    """

    visibility: str
    process_bytes: int | None
    device_bytes: int | None
    other_processes_bytes: int | None

    @property
    def charged_bytes(self) -> int | None:
        """What repro-oom charges: this process's own figure where NVML gives it, else the
        device-wide one (the fallback, which `visibility` names); None without NVML."""
        return self.device_bytes if self.process_bytes is None else self.process_bytes


def read_non_torch(handle, used_by_others_bytes: int, reserved_bytes: int) -> NonTorchReading:
    """A device's non-torch memory for this process, from one NVML process-list query and one
    device-wide reading, given torch's reserved bytes and what the others used at start."""
    own, visibility = nvml.process_reading(handle)
    used = nvml.used_bytes(handle)
    return NonTorchReading(
        visibility=visibility,
        process_bytes=None if own is None else own - reserved_bytes,
        device_bytes=None if used is None else used - used_by_others_bytes - reserved_bytes,
        other_processes_bytes=None if own is None or used is None else used - own)


@dataclass
class CallWatch:
    """What was seen while one call ran."""

    nvml_start_bytes: int | None = None  # NVML used memory as the call started (measured)
    nvml_peak_bytes: int | None = None  # peak NVML used memory during the call
    nvml_process_peak_bytes: int | None = None  # this process's peak (None: not visible)
    oom_requested_bytes: int | None = None  # the request that failed, when one did
    events: list[dict] = field(default_factory=list)  # allocator trace entries, torch's layout
    segments: list[dict] = field(default_factory=list)  # allocator segments at the end


class CudaMemory:
    """The real caching allocator and NVML of one CUDA device."""

    measured = True
    target: NonTorchSetup | None = None  # a smaller target GPU emulated (emulate_target)
    _watcher: _FirstLaunches | None = None  # its first launches, while this is entered

    def __init__(self, device: torch.device | None = None, record_stacks: bool = False,
                 used_before_cuda: dict[str, int] | None = None):
        self.device = device or torch.device("cuda", torch.cuda.current_device())
        self.record_stacks = record_stacks  # Python stacks in the trace: frames, memory_viz
        props = torch.cuda.get_device_properties(self.device)
        self.total_bytes = props.total_memory
        uuid = nvml.uuid_name(str(getattr(props, "uuid", "")) or None)
        self.nvml_handle = nvml.device_handle(uuid)
        # device memory other processes used before this one touched CUDA (nvml.used_by_uuid)
        self.used_by_others = (used_before_cuda or {}).get(uuid, 0)
        self._limited = False
        self.loaded: list = []  # the target record's modules loaded so far (emulated)
        self._cap: int | None = None
        self._device_non_torch = 0  # device-wide non-torch memory at the last set_limit
        self._loaded_since = 0  # modules' bytes loaded since then (emulated)
        torch.cuda.synchronize(self.device)  # creates the CUDA context: non-torch memory from here

    def emulate_target(self, target: NonTorchSetup) -> None:
        """Make this larger GPU measure what the smaller `target` (its physical memory, its
        driver's and cudaMalloc's bytes, its modules) would: the allocator's cap also keeps
        under the target's memory less this process's non-torch memory, read at each
        `set_limit`, and the target's driver bytes beyond it (its record's process_bytes;
        NVML's device-wide reading where it does not list the process), less the target's
        unallocatable bytes and the modules the record charges at first launches since
        (`launch`, every op seen through a dispatch mode while this memory is entered).
        Nothing where the device is no larger than the target."""
        if target.gpu_memory_bytes >= self.total_bytes:
            return
        self.target = target
        self._watcher = _FirstLaunches(self.launch)

    def launch(self, name: str) -> None:
        """A kernel launch (SimulatedMemory.launch): emulating a target, its first one charges
        the target record's modules that belong to it; otherwise nothing."""
        if self.target is None:
            return
        new = [m for m in self.target.loaded_by(name) if m not in self.loaded]
        if new:
            self.loaded += new
            self._loaded_since += sum(module.bytes for module in new)
            if self._cap is not None:  # else the first set_limit reads them
                self._apply_cap()

    def __enter__(self) -> CudaMemory:
        if self._watcher is not None:
            self._watcher.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._watcher is not None:
            self._watcher.__exit__(*exc)
        if self._limited:
            torch.cuda.set_per_process_memory_fraction(1.0, self.device)
            self._limited = False
        self.empty_cache()

    def set_limit(self, limit_bytes: int) -> int:
        """Cap the allocator's reserved memory at about `limit_bytes`; returns the exact cap.

        torch keeps `fraction x total` bytes, so the cap is that product, as torch computes it.
        """
        self._cap = limit_bytes
        if self.target is not None:  # as the model keeps to the target: its driver's bytes
            reading = self.non_torch_reading()  # beyond this process's own, which no other
            if reading.process_bytes is not None:  # process moves
                self._device_non_torch = reading.process_bytes + self.target.process_bytes
            else:  # the device-wide fallback holds the driver's bytes already
                self._device_non_torch = (reading.device_bytes if reading.device_bytes is not None
                                          else self.target.context_bytes
                                          + self.target.process_bytes)
            self._loaded_since = 0
        return self._apply_cap()

    def _apply_cap(self) -> int:
        """The cap: as set, and, emulating a target, no more than its physical room."""
        limit = self._cap
        if self.target is not None:
            limit = min(limit, self.target.gpu_memory_bytes - self._device_non_torch
                        - self._loaded_since - self.target.unallocatable_bytes)
        fraction = min(limit / self.total_bytes, 1.0)
        torch.cuda.set_per_process_memory_fraction(fraction, self.device)
        self._limited = True
        return int(fraction * self.total_bytes)

    def held_bytes(self) -> int:
        """What other ranks or processes hold beside a measured case: nothing (the memory a
        server log says they held is held in predictions only, log_ledger's)."""
        return 0

    def non_torch_reading(self) -> NonTorchReading:
        """The non-torch memory now, read both ways at one moment (`read_non_torch`)."""
        return read_non_torch(self.nvml_handle, self.used_by_others,
                              self.stats(device=False).reserved)

    def non_torch_bytes(self) -> int | None:
        """This process's device memory outside the allocator (CUDA context, libraries), as
        repro-oom charges it (`NonTorchReading.charged_bytes`); None without NVML."""
        return self.non_torch_reading().charged_bytes

    def non_torch_device_bytes(self) -> int | None:
        """The device-wide reading alone (`NonTorchReading.device_bytes`): NVML's used memory
        less the others' use at start, less reserved: what the physical device has lost."""
        return self.non_torch_reading().device_bytes

    @property
    def process_visibility(self) -> str:
        """Whether NVML lists this process with its memory now: the per-process figures'
        label, or why they are absent (nvml.process_visibility)."""
        return nvml.process_visibility(self.nvml_handle)

    def process_used_bytes(self) -> int | None:
        """This process's device memory as NVML lists it; None where not visible."""
        return nvml.process_used_bytes(self.nvml_handle)

    def non_torch_process_bytes(self) -> int | None:
        """`NonTorchReading.process_bytes` now: None where this process is not visible."""
        return self.non_torch_reading().process_bytes

    def other_processes_bytes(self) -> int | None:
        """`NonTorchReading.other_processes_bytes` now: the other processes' use; None where
        this process is not visible (`process_visibility`)."""
        return self.non_torch_reading().other_processes_bytes

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def device_used_bytes(self) -> int:
        """Device-wide used memory as `torch.cuda.mem_get_info` (cudaMemGetInfo) reports it:
        what vLLM's graph-memory estimate reads."""
        free, total = torch.cuda.mem_get_info(self.device)
        return total - free

    def graphs(self) -> CudaGraphs:
        """A set of CUDA graphs sharing one private pool (use as a context manager)."""
        return CudaGraphs(self)

    def empty_cache(self) -> None:
        """Release every cached block: collect unreachable reference cycles first, so a cycle
        that holds device tensors neither keeps their blocks from the release nor frees them
        when the garbage collector happens to run, in the middle of a measured call."""
        self.synchronize()
        gc.collect()
        torch.cuda.empty_cache()

    def reset_peaks(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)

    def stats(self, device: bool = True) -> MemoryStats:
        """The allocator's counters (one memory_stats call) and, with `device`, NVML's."""
        s = torch.cuda.memory_stats(self.device)
        return MemoryStats(
            allocated=s.get("allocated_bytes.all.current", 0),
            reserved=s.get("reserved_bytes.all.current", 0),
            peak_allocated=s.get("allocated_bytes.all.peak", 0),
            peak_reserved=s.get("reserved_bytes.all.peak", 0),
            device_used=nvml.used_bytes(self.nvml_handle) if device else None,
            num_ooms=s.get("num_ooms", 0),
        )

    @contextlib.contextmanager
    def watch(self):
        """Sample NVML and record the allocator's trace while the body runs; the body ends
        with a synchronize of its own (`measure.Measuring.finish`), so the NVML reading on exit
        is after the call's work."""
        result = CallWatch()
        torch.cuda.memory._record_memory_history(
            context="alloc" if self.record_stacks else None, stacks="python",
            max_entries=100_000, device=self.device, clear_history=True)
        try:
            with nvml.PeakSampler(self.nvml_handle) as sampler:
                result.nvml_start_bytes = sampler.start_bytes
                yield result
        finally:
            snapshot = torch.cuda.memory._snapshot(self.device)
            torch.cuda.memory._record_memory_history(enabled=None, device=self.device)
            result.nvml_peak_bytes = sampler.peak_bytes
            result.nvml_process_peak_bytes = sampler.process_peak_bytes
            index = self.device.index or 0
            traces = snapshot["device_traces"]
            result.events = list(traces[index]) if index < len(traces) else []
            result.segments = [s for s in snapshot["segments"] if s["device"] == index]
            ooms = [e["size"] for e in result.events if e["action"] == "oom"]
            result.oom_requested_bytes = ooms[-1] if ooms else None


class CudaGraphs:
    """CUDA graphs captured into one shared pool, largest first, as vLLM captures them.

    `torch.cuda.graph` empties the cache before each capture; the allocator sends the capture's
    requests to the pool, and the first live graph allocates the RNG state (two 8 B tensors) on
    the capture stream. On exit the graphs and the pool are dropped and the cache emptied.
    """

    def __init__(self, memory: CudaMemory):
        self.memory = memory
        self.pool = None
        self._graphs: list = []

    def __enter__(self) -> CudaGraphs:
        self.pool = torch.cuda.graph_pool_handle()
        return self

    def __exit__(self, *exc) -> None:
        self._graphs.clear()
        self.pool = None
        self.memory.empty_cache()

    @contextlib.contextmanager
    def capture(self):
        """Capture what the body launches into a new graph of the pool; an emulated target's
        first-capture modules are charged on entry, as SimulatedGraphs does."""
        for launch in (GRAPH_CAPTURE, SimulatedGraphs.RNG_PROLOGUE, graph_step_launch(self.live + 1)):
            self.memory.launch(launch)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            yield
        self._graphs.append(graph)

    @property
    def live(self) -> int:
        """Graphs captured and alive."""
        return len(self._graphs)

    def replay_last(self) -> None:
        self._graphs[-1].replay()
        self.memory.synchronize()


class SimulatedGraphs:
    """`CudaGraphs` on the allocator model: the same requests, sent to a private pool."""

    RNG_STATE_BYTES = (8, 8)  # the seed and offset tensors the first live graph registers
    # each capture's prologue fills them (CUDAGeneratorState::capture_prologue): where no fill
    # ran before, as at 64 heads with nothing to pad, the first capture loads the fill's module
    RNG_PROLOGUE = "aten.fill_"

    def __init__(self, memory: SimulatedMemory):
        self.memory = memory
        self.pool = object()
        self.live = 0  # graphs captured and alive
        self._rng_blocks: list = []

    def __enter__(self) -> SimulatedGraphs:
        return self

    def __exit__(self, *exc) -> None:
        model = self.memory.model
        for block in self._rng_blocks:
            model.free(block)
        self._rng_blocks.clear()
        model.release_pool(self.pool)
        model.empty_cache()

    @contextlib.contextmanager
    def capture(self):
        """Capture what the body allocates into the pool; the process's first capture also
        takes the host's outside-allocator graph memory (`GRAPH_CAPTURE`), its RNG prologue's
        fill the fill's module where none ran before, and the first
        capture that brings a pool to N live graphs the driver's step for N, if the host has
        one (`graph_step_launch`), both charged on entry."""
        self.memory.launch(GRAPH_CAPTURE)
        self.memory.launch(self.RNG_PROLOGUE)
        self.memory.launch(graph_step_launch(self.live + 1))
        model = self.memory.model
        model.empty_cache()  # as torch.cuda.graph does on entry
        if not self._rng_blocks:
            model.pool = CAPTURE_STREAM_POOL
            try:
                self._rng_blocks = [model.malloc(n) for n in self.RNG_STATE_BYTES]
            finally:
                model.end_allocate_to_pool()
        model.begin_allocate_to_pool(self.pool)
        try:
            yield
        finally:
            model.end_allocate_to_pool()
        self.live += 1

    def replay_last(self) -> None:
        """Nothing to replay on the meta device: a replay allocates nothing."""


class _FirstLaunches(TorchDispatchMode):
    """Calls `on_op` with each op's name (aten.new_zeros) before it runs, and runs it."""

    def __init__(self, on_op):
        super().__init__()
        self.on_op = on_op

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # as _MetaAllocations: no torch._dynamo import for a mode never compiled

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.on_op(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


class _StorageRef(weakref.ref):
    """A weak reference to a tracked storage, carrying its key in `_MetaAllocations.live`."""

    __slots__ = ("key",)


class _MetaAllocations(TorchDispatchMode):
    """Feeds the storage of every new meta tensor into the allocator model; frees on death.

    A storage's death only queues its block (the weakref callback is `deque.append`, C code that
    Ctrl-C cannot interrupt); `collect` frees the queue before the model is next used. So the
    model changes only in ordinary code, never half-way inside a finalizer.

    With `record_stacks`, an allocation made while the model records its trace carries the
    Python stack that asked for it, as torch's trace does with context="alloc"."""

    def __init__(self, model: CachingAllocatorModel, record_stacks: bool = False):
        super().__init__()
        self.model = model
        self.record_stacks = record_stacks
        self.live: dict[int, tuple[_StorageRef, object]] = {}  # id(storage) -> (ref, block)
        self._dead: collections.deque[_StorageRef] = collections.deque()

    on_op = None  # called with each op before it runs (SimulatedMemory's first launches)

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """False: torch then leaves __torch_dispatch__ unwrapped. By default it wraps every
        mode's in `torch._disable_dynamo`, whose first call imports torch._dynamo (seconds),
        for a mode that never runs under torch.compile."""
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.on_op is not None:
            self.on_op(func)
        result = _random_on_meta(func, args, kwargs or {})
        if result is None:
            result = func(*args, **(kwargs or {}))
        self.collect()  # before ids are compared: a dead storage's id may be reused
        # an input's storage (in place, a view) is no new memory, even one made before the mode
        inputs = {id(t.untyped_storage()) for t in tree_leaves((args, kwargs))
                  if isinstance(t, torch.Tensor) and t.device.type == "meta"}
        for tensor in tree_leaves(result):
            if isinstance(tensor, torch.Tensor) and tensor.device.type == "meta":
                storage = tensor.untyped_storage()
                if id(storage) not in inputs:
                    self._track(storage)
        return result

    def _track(self, storage) -> None:
        key = id(storage)
        if key in self.live:  # a view or an in-place result: no new memory
            return
        ref = _StorageRef(storage, self._dead.append)
        ref.key = key
        frames = (_allocating_stack() if self.record_stacks and self.model.trace is not None
                  else None)  # walked only when a trace keeps it
        self.live[key] = (ref, self.model.malloc(storage.nbytes(), frames))

    def collect(self) -> None:
        """Free the blocks of the storages that died since the last call, in order of death."""
        while self._dead:
            ref = self._dead.popleft()
            _, block = self.live.pop(ref.key)
            self.model.free(block)


def _allocating_stack() -> list[dict]:
    """The Python stack of the code whose op allocates, as torch's trace records it: this
    module's frames (the dispatch hook's own) left out."""
    frames = python_frames()
    inner = next((i for i, f in enumerate(frames) if f["filename"] != __file__), len(frames))
    return frames[inner:]


# Random ops draw values, which meta tensors do not have. Their meta kernels only check the
# arguments (torch._check, whose first call imports sympy: about 0.4 s) and return what `empty`
# would, so on meta they are answered here: in place, the input; a factory, an empty tensor of
# the size and dtype asked for. The allocator sees the same requests either way.
_RANDOM_IN_PLACE = frozenset({"normal_", "uniform_", "random_", "bernoulli_", "exponential_",
                              "geometric_", "log_normal_", "cauchy_"})
_RANDOM_FACTORIES = {"randn": None, "rand": None, "randint": torch.int64}  # name -> default dtype


def _random_on_meta(func, args, kwargs):
    """The result of a random op on the meta device without running it; None for other ops."""
    name = func.overloadpacket.__name__
    if name in _RANDOM_IN_PLACE:
        target = args[0] if args else kwargs.get("self")
        return target if isinstance(target, torch.Tensor) and target.device.type == "meta" else None
    if name not in _RANDOM_FACTORIES:
        return None
    # positional arguments first, in schema order (fewer than the schema has: defaults)
    given = dict(zip((a.name for a in func._schema.arguments), args, strict=False), **kwargs)
    if given.get("out") is not None or given.get("names") is not None:
        return None
    if given.get("device") is None or torch.device(given["device"]).type != "meta":
        return None
    dtype = given.get("dtype") or _RANDOM_FACTORIES[name] or torch.get_default_dtype()
    return torch.empty(given["size"], dtype=dtype, layout=given.get("layout"),
                       device=given["device"], pin_memory=given.get("pin_memory"))


class SimulatedMemory:
    """The allocator model, fed by meta-device tensors while this is entered."""

    measured = False
    device = torch.device("meta")

    def __init__(self, limit_bytes: int | None = None, non_torch: NonTorchSetup | None = None,
                 record_stacks: bool = False):
        """`non_torch`: the host setup to emulate on (repro-oom): its non-torch memory, which
        grows as ops launch for the first time, and its physical memory, which binds with it.
        `record_stacks`: Python stacks in the trace, as CudaMemory's (each allocation's frame)."""
        self._model = CachingAllocatorModel(limit_bytes)
        self._cap = limit_bytes
        self.non_torch = non_torch
        self.record_stacks = record_stacks
        self.loaded: list = []  # the host's lazily loaded modules, in the order they loaded
        self._mode = _MetaAllocations(self._model, record_stacks)
        self._mode.on_op = self._on_op if non_torch is not None else None

    @property
    def model(self) -> CachingAllocatorModel:
        """The allocator model, up to date: the blocks of storages dead by now are freed."""
        self._mode.collect()
        return self._model

    def set_limit(self, limit_bytes: int) -> int:
        self._cap = limit_bytes
        self._apply_limits()
        return limit_bytes

    def held_bytes(self) -> int:
        """What other ranks or processes hold on the device (NonTorchSetup.held_bytes): an
        engine's reading of the device's free memory sees it; 0 without a host setup."""
        return 0 if self.non_torch is None else self.non_torch.held_bytes

    def non_torch_bytes(self) -> int | None:
        """The host setup's non-torch memory so far, as a measured case charges it: this
        process's own (its context and the modules loaded; the setup's process_bytes lies
        outside it, on the physical device only); None without one."""
        if self.non_torch is None:
            return None
        return self.non_torch.context_bytes + sum(module.bytes for module in self.loaded)

    def launch(self, name: str) -> None:
        """A kernel launch (an aten op name, "<kernel>.decode", or a CUDA-graph capture,
        `GRAPH_CAPTURE`): its first one loads the host's modules that belong to it and the
        device has that much less for torch."""
        if self.non_torch is None:
            return
        new = [m for m in self.non_torch.loaded_by(name) if m not in self.loaded]
        if new:
            self.loaded += new
            self._apply_limits()

    def _on_op(self, func) -> None:
        self.launch(str(func.overloadpacket))

    def _apply_limits(self) -> None:
        """A segment must fit under the cap and in what the physical device has left: its
        memory less the device-wide non-torch memory (process_bytes + this process's own)."""
        limits = [self._cap]
        if self.non_torch is not None:
            limits.append(self.non_torch.gpu_memory_bytes - self.non_torch.process_bytes
                          - self.held_bytes() - self.non_torch_bytes()
                          - self.non_torch.unallocatable_bytes)
        limits = [limit for limit in limits if limit is not None]
        self.model.limit_bytes = min(limits) if limits else None

    def __enter__(self) -> SimulatedMemory:
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)

    def synchronize(self) -> None:
        pass

    process_visibility = None  # no NVML: nothing is read

    def process_used_bytes(self) -> None:
        return None

    def non_torch_process_bytes(self) -> None:
        return None

    def other_processes_bytes(self) -> None:
        return None

    def device_used_bytes(self) -> int | None:
        """This process's device memory as `mem_get_info` would read it on an otherwise idle
        device: the model's reserved segments (whole 2 MiB already, allocator.ROUND_LARGE)
        plus the host setup's non-torch memory so far, modules and the first graph capture's
        included, rounded up here to the 2 MiB steps the driver's figure moves in. None
        without a host setup: the memory outside the allocator is then not modelled."""
        non_torch = self.non_torch_bytes()
        if non_torch is None:
            return None
        return self.model.reserved_bytes + -(-non_torch // ROUND_LARGE) * ROUND_LARGE

    def graphs(self) -> SimulatedGraphs:
        return SimulatedGraphs(self)

    def empty_cache(self) -> None:
        self.model.empty_cache()

    def reset_peaks(self) -> None:
        self.model.reset_peaks()

    def stats(self, device: bool = True) -> MemoryStats:
        """The model's counters; `device` is moot: its reserved bytes stand for NVML's."""
        m = self.model
        return MemoryStats(
            allocated=m.allocated_bytes, reserved=m.reserved_bytes,
            peak_allocated=m.peak_allocated_bytes, peak_reserved=m.peak_reserved_bytes,
            device_used=m.reserved_bytes,  # cudaMalloc'd segments are what NVML would add
            num_ooms=m.num_ooms,
        )

    @contextlib.contextmanager
    def watch(self):
        result = CallWatch()
        self.model.trace = result.events
        try:
            yield result
        except AllocatorOutOfMemory as exc:
            result.oom_requested_bytes = exc.requested_bytes
            raise
        finally:
            self.model.trace = None
            result.segments = self.model.segments()
            result.nvml_peak_bytes = self.model.peak_reserved_bytes  # reserved stands for NVML


def is_out_of_memory(exc: BaseException, ooms_before: int | None = None,
                     ooms_after: int | None = None) -> bool:
    """Whether a failure was an out-of-memory, however it surfaced: the one place that says so.

    torch raises OutOfMemoryError (the model AllocatorOutOfMemory); a stable-ABI kernel
    (FlashMLA) turns the same failure into a RuntimeError whose text names
    `torch_call_dispatcher(... "aten::new_empty" ...)`. The allocator's num_ooms still counts
    it: when the caller read it before and after (`ooms_before`, `ooms_after`), the count
    decides such an error; without the counts, its text does.
    """
    if isinstance(exc, torch.OutOfMemoryError | AllocatorOutOfMemory):
        return True
    if not isinstance(exc, RuntimeError):
        return False
    text = str(exc).lower()
    if "out of memory" in text:
        return True
    if ooms_before is not None and ooms_after is not None:
        return ooms_after > ooms_before
    return "aten::new_empty" in text


def requested_bytes_from_message(message: str) -> int | None:
    """The size in an allocator message 'Tried to allocate 8.00 GiB', in bytes (approximate)."""
    match = _TRIED.search(message)
    return int(float(match.group(1)) * _UNITS[match.group(2)]) if match else None
