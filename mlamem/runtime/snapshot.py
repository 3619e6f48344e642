"""Memory snapshots in PyTorch's format, openable in https://pytorch.org/memory_viz.

A measured sweep keeps torch's own trace entries (with Python stacks); a predicted one writes the
allocator model's events and segments in the same layout. `read` is the one reader of a snapshot
from elsewhere (untrusted): through the bounded file reader, unpickled by `SnapshotUnpickler`,
which builds plain data only, then checked for the fields mlamem reads.
"""

from __future__ import annotations

import contextlib
import gc
import io
import pickle
from collections.abc import Iterator, Sequence
from itertools import compress, repeat
from operator import not_
from pathlib import Path
from typing import Protocol

from mlamem.spec.errors import UserError
from mlamem.spec.files import read_bytes, write_atomic
from mlamem.spec.units import MAX_BYTES

# torch's _dump_snapshot pickles dicts, lists, tuples, strings, numbers, booleans and None, all
# of which pickle opcodes build without naming a class; a set or frozenset (pickles of protocol
# 2 and 3 name these) is the only class a snapshot may name. Everything else is refused.
ALLOWED_CLASSES = frozenset({("builtins", "set"), ("builtins", "frozenset")})
MAX_SNAPSHOT_BYTES = 256 * 1024 * 1024  # an engine's snapshot with stacks; unpickled, some GiB
# A pickle spends at least one byte on each object it builds, so only reuse (a memo get) makes
# the data larger than its file; torch shares one frame list among a block and its few events,
# which keeps a real snapshot within a few nodes per byte (the H200's: 0.97). 16 per byte, with
# MAX_SNAPSHOT_BYTES, bounds the work a file can ask for; a tiny pickle reusing one object
# millions of times asks for far more.
MAX_NODES_PER_BYTE = 16
WHAT = "memory snapshot (the pickle torch.cuda.memory._dump_snapshot writes)"


class Traced(Protocol):
    """A measured call's trace and segments: a CallRecord, or a record that embeds one
    (CallMeasurement, api.Tracker)."""

    trace: list[dict] | None
    segments: list[dict] | None


def build(calls: Sequence[Traced]) -> dict:
    """One snapshot holding the measured calls' traces, in order, and the last segments."""
    traces = [event for call in calls for event in (call.trace or [])]
    segments = next((c.segments for c in reversed(calls) if c.segments is not None), [])
    return {"segments": segments, "device_traces": [traces], "allocator_settings": {},
            "external_annotations": []}


def write(path: Path, calls: Sequence[Traced]) -> None:
    """Pickle the snapshot to `path`, whole or not at all."""
    write_atomic(path, pickle.dumps(build(calls)), field="snapshot")


class RefusedClass(pickle.UnpicklingError):
    """A pickle naming a class a snapshot never names."""


class SnapshotUnpickler(pickle.Unpickler):
    """An unpickler that builds plain data only: a class outside ALLOWED_CLASSES (os.system,
    a torch tensor, any object with __reduce__) is an UnpicklingError naming it."""

    def find_class(self, module: str, name: str):
        if (module, name) in ALLOWED_CLASSES:
            return super().find_class(module, name)
        raise RefusedClass(f"it names {module}.{name}, which a snapshot never does")


def read(path: Path, field: str | None = None) -> dict:
    """A snapshot file as plain data, checked (`check`): a UserError in one line for a file
    that is too large, not a pickle, a pickle that names a class, or not a snapshot."""
    data = read_bytes(path, WHAT, field, limit=MAX_SNAPSHOT_BYTES)
    with _collector_paused():
        return _read_paused(path, field, data)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cycle collector off while a snapshot's millions of containers are built and
    walked (each of its passes would walk them all again: a 2M-event snapshot unpickles in a
    third of the time without them); plain data from a pickle the walk finds free of cycles."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _read_paused(path: Path, field: str | None, data: bytes) -> dict:
    try:
        snapshot = SnapshotUnpickler(io.BytesIO(data)).load()
    except RefusedClass as exc:
        raise UserError(f"{path}: not a memory snapshot ({exc})", field=field) from None
    except Exception as exc:  # noqa: BLE001 (any error of a corrupt pickle: EOF, bad opcode, ...)
        words = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        raise UserError(f"{path}: not a memory snapshot (not a pickle: {words})",
                        field=field) from None
    if not snapshot_within_nodes(snapshot, MAX_NODES_PER_BYTE * len(data)):
        raise UserError(f"{path}: not a memory snapshot (it reuses its objects to unpickle to "
                        f"more than {MAX_NODES_PER_BYTE} values per byte of the file, or refers "
                        "to itself)", field=field)
    problem = check(snapshot)
    if problem is not None:
        raise UserError(f"{path}: not a memory snapshot ({problem})", field=field)
    return snapshot


def within_nodes(data: object, cap: int) -> bool:
    """Whether `data`, walked as a tree (an object reached twice counted twice; a dict's key
    and value one each), has at most `cap` nodes and no cycle."""
    return nodes(data, cap) is not None


def nodes(data: object, cap: int) -> int | None:
    """The nodes of `data` walked as a tree (an object reached twice counted twice; a dict's
    key and value one each); None where there are more than `cap` or a cycle. Each distinct
    container is
    summed once, so the walk takes time in the objects unpickled, not in the tree it makes;
    a container's children are sorted and summed by C-level maps, not one by one in Python
    (a 2M-event snapshot is some 5M containers)."""
    sizes: dict[int, int] = {}  # id -> nodes under it, of a container summed
    opened: set[int] = set()
    stack: list[tuple[object, bool]] = [(data, False)]
    while stack:
        node, summing = stack.pop()
        if not summing and id(node) in sizes:
            continue
        children = [*node.keys(), *node.values()] if type(node) is dict else node
        nested = list(compress(children, map(_is_container, map(type, children))))
        unsummed = [] if summing else list(
            compress(nested, map(not_, map(sizes.__contains__, map(id, nested)))))
        if unsummed:  # open it: its children first, then it again, to sum
            if id(node) in opened:  # opened, not summed: an ancestor of itself
                return None
            opened.add(id(node))
            stack.append((node, True))
            stack.extend(zip(unsummed, repeat(False)))
        else:  # every child summed (or a leaf): summed at once
            total = 1 + len(children) - len(nested) + sum(map(sizes.__getitem__, map(id, nested)))
            if total > cap:
                return None
            sizes[id(node)] = total
    total = sizes.get(id(data), 1)
    return total if total <= cap else None


def snapshot_within_nodes(snapshot: object, cap: int) -> bool:
    """`within_nodes` of a snapshot, its trace events counted on a fast path: an event of plain
    values and a list of frames (each frame's nodes counted once, as `nodes` counts it) is
    2 x its keys + 1 + its frames'; any other is walked by `nodes`. The rest (segments, blocks)
    is walked by `nodes` whole."""
    traces = snapshot.get("device_traces") if type(snapshot) is dict else None
    if type(traces) is not list or not all(type(trace) is list for trace in traces):
        return within_nodes(snapshot, cap)
    used = nodes({**snapshot, "device_traces": []}, cap)
    if used is None:
        return False
    used += len(traces)
    frame_nodes: dict[int, int | None] = {}
    for trace in traces:
        for event in trace:
            counted = _plain_event_nodes(event, frame_nodes, cap)
            used += counted if counted is not None else (nodes(event, cap) or cap + 1)
            if used > cap:
                return False
    return True


def _plain_event_nodes(event: object, frame_nodes: dict[int, int | None], cap: int
                       ) -> int | None:
    """An event's nodes where it is plain (keys and values leaves but a list `frames`), by
    C-level maps; else None."""
    if type(event) is not dict or any(map(_is_container, map(type, event))):
        return None
    frames = event.get("frames")
    containers = sum(map(_is_container, map(type, event.values())))
    if containers == 0:
        return 1 + 2 * len(event)
    if containers != 1 or type(frames) is not list:
        return None
    try:
        counts = list(map(frame_nodes.__getitem__, map(id, frames)))
    except KeyError:  # a frame not seen before
        for frame in frames:
            frame_nodes.setdefault(id(frame), nodes(frame, cap))
        counts = list(map(frame_nodes.__getitem__, map(id, frames)))
    if None in counts:
        return None
    return 2 * len(event) + 1 + sum(counts)


_is_container = frozenset({dict, list, tuple, set, frozenset}).__contains__


def check(snapshot: object) -> str | None:
    """None when `snapshot` has what mlamem reads: `segments` (each with address, total_size and
    blocks of size and state) and `device_traces` (lists of events with action, addr, size,
    and frames of filename, line, name where given); else the first field that is wrong (a
    wrong value before a missing one), as `segments[0].address: expected an integer`. One walk
    in plain Python, each frame object checked once however many stacks share it: a snapshot
    of millions of events is checked in seconds, building nothing."""
    problems = _Problems()
    if not isinstance(snapshot, dict):
        return "expected an object"
    problems.fields(snapshot, "", TOP)
    for i, segment in enumerate(snapshot.get("segments") if isinstance(
            snapshot.get("segments"), list) else []):
        where = f"segments[{i}]"
        if problems.fields(segment, where, SEGMENT):
            for j, block in enumerate(segment["blocks"] if isinstance(
                    segment.get("blocks"), list) else []):
                if problems.fields(block, f"{where}.blocks[{j}]", BLOCK):
                    problems.frames(block, f"{where}.blocks[{j}]")
    traces = snapshot.get("device_traces")
    for i, trace in enumerate(traces if isinstance(traces, list) else []):
        if not isinstance(trace, list):
            problems.add(f"device_traces[{i}]", "expected a list")
            continue
        for j, event in enumerate(trace):
            # the rare event not plainly right is checked again, in words
            if not problems.plain_event(event) and problems.fields(
                    event, f"device_traces[{i}][{j}]", EVENT):
                problems.frames(event, f"device_traces[{i}][{j}]")
    return problems.first()


# The fields mlamem reads, in the order they are checked: name -> (kind, required); a field
# not required may be absent (frames, device_traces) or, for requested_size, None.
BYTES = "bytes"  # a byte count: an integer from 0 to MAX_BYTES
TOP = {"segments": (list, True), "device_traces": (list, False)}
SEGMENT = {"address": (int, True), "total_size": (BYTES, True), "blocks": (list, True)}
BLOCK = {"size": (BYTES, True), "requested_size": (BYTES, False), "state": (str, True)}
EVENT = {"action": (str, True), "addr": (int, True), "size": (BYTES, True)}
FRAME = {"filename": (str, True), "line": (int, True), "name": (str, True)}
_WORDS = {int: "expected an integer", str: "expected a string", list: "expected a list"}


class _Problems:
    """The problems a walk finds: the first wrong value, the first missing field."""

    def __init__(self) -> None:
        self.wrong: str | None = None
        self.missing: str | None = None
        self.good_frames: set[int] = set()  # ids of frame objects found right

    def add(self, where: str, words: str) -> None:
        if words == "missing":
            self.missing = self.missing or f"{where}: missing"
        else:
            self.wrong = self.wrong or (f"{where}: {words}" if where else words)

    def first(self) -> str | None:
        return self.wrong or self.missing

    def fields(self, node: object, where: str, fields: dict[str, tuple[object, bool]]) -> bool:
        """Check `node`'s `fields`; whether it is an object at all."""
        if not isinstance(node, dict):
            self.add(where, "expected an object")
            return False
        for name, (kind, required) in fields.items():
            place = f"{where}.{name}" if where else name
            if name not in node:
                if required:
                    self.add(place, "missing")
            elif not (kind is BYTES and not required and node[name] is None):
                self._value(node[name], place, kind)
        return True

    def _value(self, value: object, where: str, kind: object) -> None:
        if kind is BYTES:
            if type(value) is not int:
                self.add(where, "expected an integer")
            elif value < 0:
                self.add(where, f"{value} is negative")
            elif value > MAX_BYTES:
                self.add(where, f"{value} is more than {MAX_BYTES}")
        elif not (type(value) is kind or (kind is not int and isinstance(value, kind))):
            self.add(where, _WORDS[kind])

    def plain_event(self, event: object) -> bool:
        """Whether `event` is plainly right: what EVENT asks, and frames already found right
        (checked without building a word: the path of millions of events)."""
        if type(event) is not dict:
            return False
        size, frames = event.get("size"), event.get("frames", [])
        return (type(event.get("action")) is str and type(event.get("addr")) is int
                and type(size) is int and 0 <= size <= MAX_BYTES
                and type(frames) is list and self.good_frames.issuperset(map(id, frames)))

    def frames(self, node: dict, where: str) -> None:
        """`node`'s frames, where given: a list of {filename, line, name}."""
        frames = node.get("frames", [])
        if not isinstance(frames, list):
            self.add(f"{where}.frames", "expected a list")
            return
        for k, frame in enumerate(frames):
            if id(frame) not in self.good_frames:
                wrong, missing = self.wrong, self.missing
                self.fields(frame, f"{where}.frames[{k}]", FRAME)
                if (wrong, missing) == (self.wrong, self.missing):
                    self.good_frames.add(id(frame))
