"""mlamem from Python: the per-call figures of `mlamem profile` for your own code.

    with mlamem.track(expect={"padded_q": ((1024, 64, 576), torch.bfloat16)}) as t:
        my_kernel(q, kv)
    t.peak_allocated_bytes, t.peak_reserved_bytes, t.allocations_in_call, t.buffers

- `track` measures exactly what runs inside its `with` block: it empties the allocator's cache
  and resets the peaks on entry, then records the allocator's trace until the block ends. A
  `with` block cannot run its body twice, so there is no warm-up: a first call's one-time
  allocations (compilation, library workspaces) are counted.
- `profile_call(fn, *args, **kwargs)` is `mlamem profile`'s protocol for one call: warm up once
  with the same arguments, empty the cache, reset the peaks, measure one call.

Both return a `Tracker`. Bytes are deltas over the state before the measured code: the peaks
(torch's max_memory_allocated / max_memory_reserved), NVML's device-used peak, and every
allocation inside, named from `expect` (name -> bytes, (shape, dtype), a BufferSpec or an
ExpectedBuffer) as `mlamem profile --breakdown` names a kernel's buffers; the rest by its
`frame`, the innermost Python frame outside torch, mlamem and the kernel libraries
(`file:line function`: the allocator trace's stacks when measured, the interpreter's stack at the
allocation when predicted; each buffer carries its frame either way). An out-of-memory
inside is recorded (`oom`, `failure`), not raised; any other exception propagates.

Devices. `device=None` means CUDA. `device="meta"` predicts instead: the code runs on the meta
device, and every meta allocation feeds mlamem's model of the caching allocator, as `mlamem
profile` predicts without a GPU; the figures are then labelled `measured=False`. Without CUDA
and without `device="meta"`, `NoCudaError` says so in one line: mlamem does not fall back to
predicting by itself, because a function whose tensors live on the CPU allocates nothing the
model sees, and would be reported as needing 0 bytes. Tensors made before the block are not in
the model, so a predicted reserved figure starts from an empty allocator.

Trackers do not nest: the allocator trace is one per process.
"""

from __future__ import annotations

import functools
import math
import pickle
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Self

import torch

from mlamem.commands.profile import call_figures
from mlamem.runtime import snapshot
from mlamem.runtime.attribution import BufferUse, ExpectedBuffer
from mlamem.runtime.measure import OUT_OF_MEMORY, CallRecord, Measuring, RecordField, measure_one
from mlamem.runtime.memory import CudaMemory, SimulatedMemory
from mlamem.spec.errors import UserError
from mlamem.spec.files import write_atomic
from mlamem.spec.kernel_api import BufferSpec
from mlamem.spec.units import format_bytes

NAMED_BY_EXPECT = "user"  # allocated_by of a buffer named by bytes or (shape, dtype) in `expect`

Expectation = int | tuple[tuple[int, ...], torch.dtype] | BufferSpec | ExpectedBuffer


class NoCudaError(UserError, RuntimeError):
    """No CUDA device to measure on; the message names device="meta", which predicts."""


def expected_from(expect: Mapping[str, Expectation] | None) -> list[ExpectedBuffer]:
    """The buffers `expect` names, in its order (attribution matches allocations to them in
    order, by requested bytes): bytes (int), (shape, dtype), a BufferSpec (allocated by the
    kernel) or an ExpectedBuffer (its own allocated_by). TypeError for anything else."""
    if expect is not None and not isinstance(expect, Mapping):
        raise TypeError(f"expect={expect!r}: give a mapping of buffer names to bytes (an int), "
                        "(shape, torch dtype), a BufferSpec or an ExpectedBuffer")
    buffers = []
    for name, value in (expect or {}).items():
        if isinstance(value, ExpectedBuffer):
            buffers.append(ExpectedBuffer(name, value.nbytes, value.allocated_by))
        elif isinstance(value, BufferSpec):
            buffers.append(ExpectedBuffer(name, value.nbytes, "kernel"))
        elif isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            buffers.append(ExpectedBuffer(name, value, NAMED_BY_EXPECT))
        elif (isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], torch.dtype)
              and all(isinstance(n, int) and n >= 0 for n in value[0])):
            nbytes = math.prod(value[0]) * value[1].itemsize
            buffers.append(ExpectedBuffer(name, nbytes, NAMED_BY_EXPECT))
        else:
            raise TypeError(f"expect[{name!r}] = {value!r}: expected bytes (an int >= 0), "
                            "(shape, torch dtype), a BufferSpec or an ExpectedBuffer")
    return buffers


def memory_for(device: str | torch.device | None) -> CudaMemory | SimulatedMemory:
    """The backend for `device`: a CUDA device measures, "meta" predicts, both with Python stacks
    in the trace (each allocation's frame; save_snapshot's). None means CUDA; NoCudaError
    without it."""
    try:
        resolved = torch.device("cuda" if device is None else device)
    except (RuntimeError, TypeError):  # a name torch has no device for ("META"), or no name
        resolved = None
    if resolved is None or resolved.type not in ("cuda", "meta"):
        shown = str(device) if isinstance(device, torch.device) else device
        raise ValueError(f"device {shown!r}: expected cuda (measure) or meta (predict)")
    if resolved.type == "meta":
        return SimulatedMemory(record_stacks=True)
    if not torch.cuda.is_available():
        raise NoCudaError('no CUDA device here to measure on; pass device="meta" to predict a '
                          "function whose tensors are on the meta device")
    return CudaMemory(resolved if resolved.index is not None else None, record_stacks=True)


_active: list[Tracker] = []  # the tracker measuring now (at most one)


class Tracker:
    """The figures of one measured (or predicted) block or call; a context manager (`track`).

    Every byte count is a delta over the state just before the measured code, and is None until
    the block has ended (or when it failed before the figure was taken). The figures are those
    of `call`, the record of the measure function (`measure.measure_one`) that profile, graph
    captures and engine steps share.
    """

    def __init__(self, expect: Mapping[str, Expectation] | None = None,
                 device: str | torch.device | None = None):
        self.expected = expected_from(expect)
        self.memory = memory_for(device)
        self.measured: bool = self.memory.measured  # False: predicted on the meta device
        self.call: CallRecord | None = None  # the measured call's record (measure.measure_one)
        self.value: Any = None  # what profile_call's fn returned
        self._measuring: Measuring | None = None

    # each a delta over the state before the code; None until taken (or when it failed first)
    peak_allocated_bytes = RecordField(when_failed=True)
    peak_reserved_bytes = RecordField(when_failed=True)
    nvml_peak_bytes = RecordField(when_failed=True)  # predicted: reserved
    # this process's own NVML peak, absolute, not a delta (measured, where NVML lists it)
    nvml_process_peak_bytes = RecordField(when_failed=True)
    wall_time_ms = RecordField(when_failed=True)  # the code and a synchronize (measured only)
    breakdown = RecordField(when_failed=True)  # the allocations inside, by buffer
    trace = RecordField(when_failed=True)  # allocator trace entries (torch's layout)
    segments = RecordField(when_failed=True)  # allocator segments after the code

    # one line, "out of memory" or the error, and an out-of-memory's failed request
    failure = property(lambda self: self.call and self.call.failure_line)
    oom_requested_bytes = property(lambda self: self.call and self.call.oom_requested_bytes)

    @property
    def oom_buffer(self) -> str | None:
        """The expected buffer of that request's size."""
        failure = self.call and self.call.failure
        return failure.buffer if failure else None

    # -- the figures ---------------------------------------------------------------------

    @property
    def oom(self) -> bool:
        """Whether the code ran out of memory (recorded, not raised)."""
        return self.failure == OUT_OF_MEMORY

    @property
    def buffers(self) -> list[BufferUse]:
        """Each allocation inside, in order: name (from `expect`, else its frame), who
        allocated it, requested and block bytes, new segment bytes, live at the peak, and the
        frame that asked for it (`file:line function`)."""
        return [] if self.breakdown is None else list(self.breakdown.buffers)

    @property
    def missing(self) -> list[str]:
        """Expected buffers that were never allocated."""
        return [] if self.breakdown is None else list(self.breakdown.missing)

    @property
    def allocations_in_call(self) -> int | None:
        """Allocations made inside (0: safe to capture in a CUDA graph)."""
        return None if self.breakdown is None else self.breakdown.allocations

    @property
    def bytes_allocated_in_call(self) -> int | None:
        """Their requested bytes, summed."""
        return None if self.breakdown is None else self.breakdown.allocated_bytes

    def to_dict(self) -> dict:
        """The figures as the fields of a `mlamem.profile/1` row (ProfileRow) that apply."""
        return call_figures(self)

    def summary(self) -> str:
        """One line: the peaks and the allocations inside (or the failure)."""
        self._check_ended("summary")
        tag = "" if self.measured else " (PREDICTED)"
        if self.failure is not None and self.peak_allocated_bytes is None:
            requested = ("" if self.oom_requested_bytes is None
                         else f" requesting {format_bytes(self.oom_requested_bytes)}")
            return f"failed{tag}: {self.failure}{requested}"
        nvml = "n/a" if self.nvml_peak_bytes is None else format_bytes(self.nvml_peak_bytes)
        count = self.allocations_in_call
        return (f"peak allocated {format_bytes(self.peak_allocated_bytes)}{tag}, reserved "
                f"{format_bytes(self.peak_reserved_bytes)}, NVML {nvml}; "
                f"{count} allocation{'' if count == 1 else 's'}, "
                f"{format_bytes(self.bytes_allocated_in_call)} inside")

    def table(self, width: int | None = None) -> str:
        """The breakdown as text: one row per allocation inside (a buffer named by `expect`
        with the frame that made it), then whether the buffers live at the peak add up to it,
        and the expected buffers never allocated. `width`: the columns to fit, one record per
        allocation if too few; None: as wide as the rows (80 at least), no frame cut."""
        from mlamem.render.common import compact_table, console_text, natural_width, with_notes

        self._check_ended("table")
        if width is not None and (isinstance(width, bool) or not isinstance(width, int)
                                  or width < 1):
            wrong = ValueError if isinstance(width, int) and not isinstance(width, bool) else TypeError
            raise wrong(f"width={width!r}: give the columns to fit (an int >= 1), or None")
        tag = "" if self.measured else " (PREDICTED)"
        out = compact_table(f"mlamem: allocations inside{tag}")
        named = [b for b in self.buffers if b.frame is not None and b.name != b.frame]
        columns = ["buffer", "by", "size", "bytes", "live at peak"] + (["frame"] if named else [])
        for name in columns:
            out.add_column(name, justify="right" if name in ("size", "bytes") else "left",
                           no_wrap=True)
        for b in self.buffers:
            frame = [] if not named else ["" if b.frame == b.name else b.frame or ""]
            out.add_row(b.name, b.allocated_by, format_bytes(b.requested_bytes),
                        str(b.requested_bytes), "yes" if b.live_at_peak else "no", *frame)
        notes = [self.summary()]
        if self.breakdown is not None and self.peak_allocated_bytes is not None:
            parts, peak = self.breakdown.peak_bytes, self.peak_allocated_bytes
            notes.append(f"buffers live at the peak add up to the peak ({peak} B)" if parts == peak
                         else f"buffers live at the peak sum to {parts} B, the peak is {peak} B")
        if self.missing:
            notes.append(f"expected but not allocated: {', '.join(self.missing)}")
        width = natural_width(out) if width is None else width
        return console_text(with_notes(out, notes), width).rstrip("\n")

    def _check_ended(self, method: str) -> None:
        """The figures exist only once the block has ended: RuntimeError before."""
        if self.call is None:
            raise RuntimeError(f"nothing measured yet: call {method} after the block ends")

    def save_snapshot(self, path: str | Path) -> None:
        """Write a PyTorch memory snapshot of the measured code (a pickle for
        https://pytorch.org/memory_viz): torch's trace with Python stacks on a GPU, the allocator
        model's events in the same layout when predicted."""
        if self.trace is None:
            raise RuntimeError("nothing measured yet: call save_snapshot after the block ends")
        write_atomic(Path(path), pickle.dumps(snapshot.build([self])), field="save_snapshot")

    # -- the measurement -----------------------------------------------------------------

    def __enter__(self) -> Self:
        """Empty the cache, reset the peaks and start the allocator trace."""
        if _active:
            raise RuntimeError("mlamem trackers do not nest: the allocator trace is one per "
                               "process; end the running one first")
        self.memory.__enter__()
        self.memory.empty_cache()
        self._measuring = Measuring(self.memory, self.expected)
        self._measuring.start()
        _active.append(self)
        return self

    def __exit__(self, exc_type, exc, traceback) -> bool:
        """Stop the trace and take the figures; True (swallow it) for an out-of-memory."""
        try:
            call = self._measuring.finish(exc)
            if exc is not None and not isinstance(exc, Exception):
                return False  # an interrupt or a test outcome: no figures
            self.call = call
            return exc is not None and call.oom
        finally:
            self.memory.__exit__(exc_type, exc, traceback)
            _active.remove(self)


def track(expect: Mapping[str, Expectation] | None = None,
          device: str | torch.device | None = None) -> Tracker:
    """Measure exactly what runs inside the `with` block, once:

        with mlamem.track(expect={"o_accum": o_accum_bytes}) as t:
            my_kernel(q, kv)
        print(t.table())

    On entry the allocator's cache is emptied and the peaks are reset, so the reserved peak is
    what the block needs from the device with a cold cache. A `with` block cannot be re-run, so
    there is no warm-up: one-time allocations of a first call count (use `profile_call` to leave
    them out). `expect` names buffers: name -> bytes, (shape, dtype), BufferSpec or
    ExpectedBuffer; other allocations are named by their frame. `device`: None or a CUDA device
    measures (NoCudaError without CUDA); "meta" predicts, for code whose tensors are on the meta
    device. An out-of-memory inside is recorded on the tracker (`oom`, `failure`) and not
    raised; any other exception propagates after the figures are taken.
    """
    return Tracker(expect, device)


def profile_call(fn: Callable[..., Any], *args: Any,
                 expect: Mapping[str, Expectation] | None = None,
                 device: str | torch.device | None = None, warmup: bool = True,
                 **kwargs: Any) -> Tracker:
    """`mlamem profile`'s protocol for one call of `fn(*args, **kwargs)`: warm up once with the
    same arguments (unless `warmup=False`), release the cached segments, reset the peaks, then
    measure one call under the allocator trace. Returns the Tracker, with what `fn` returned in
    `value`. `expect` and `device` are as for `track` (they, and `warmup`, are profile_call's
    own: to pass `fn` a keyword of one of those names, wrap it in a lambda or
    functools.partial). An out-of-memory, in the warm-up or the call, is recorded and not
    raised; any other exception propagates.
    """
    tracker = Tracker(expect, device)
    memory, raised = tracker.memory, []

    def body() -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            raised.append(exc)
            raise

    if _active:
        raise RuntimeError("mlamem trackers do not nest: profile_call runs inside another one")
    tracker = Tracker(expect, device)
    memory = tracker.memory
    call = functools.partial(fn, *args, **kwargs)
    _active.append(tracker)
    try:
        with memory:
            run = measure_one(memory, call, tracker.expected, raise_errors=True) if warmup else None
            if run is None or run.failure is None:
                del run  # the warm-up's outputs go before the cache is emptied
                memory.empty_cache()
                run = measure_one(memory, call, tracker.expected, raise_errors=True)
            tracker.value, run.value = run.value, None
            tracker.call = run
    finally:
        _active.remove(tracker)
    return tracker
