"""Memory snapshots in PyTorch's format, openable in https://pytorch.org/memory_viz.

A measured sweep keeps torch's own trace entries (with Python stacks); a predicted one writes the
allocator model's events and segments in the same layout. `read` is the one reader of a snapshot
from elsewhere (untrusted): through the bounded file reader, unpickled by `SnapshotUnpickler`,
which builds plain data only, then checked for the fields mlamem reads.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from mlamem.spec.errors import UserError
from mlamem.spec.files import read_bytes, write_atomic

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
    try:
        snapshot = SnapshotUnpickler(io.BytesIO(data)).load()
    except RefusedClass as exc:
        raise UserError(f"{path}: not a memory snapshot ({exc})", field=field) from None
    except Exception as exc:  # noqa: BLE001 (any error of a corrupt pickle: EOF, bad opcode, ...)
        words = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        raise UserError(f"{path}: not a memory snapshot (not a pickle: {words})",
                        field=field) from None
    if not within_nodes(snapshot, MAX_NODES_PER_BYTE * len(data)):
        raise UserError(f"{path}: not a memory snapshot (it reuses its objects to unpickle to "
                        f"more than {MAX_NODES_PER_BYTE} values per byte of the file, or refers "
                        "to itself)", field=field)
    problem = check(snapshot)
    if problem is not None:
        raise UserError(f"{path}: not a memory snapshot ({problem})", field=field)
    return snapshot


def within_nodes(data: object, cap: int) -> bool:
    """Whether `data`, walked as a tree (an object reached twice counted twice; a dict's key
    and value one each), has at most `cap` nodes and no cycle. Each distinct container is
    summed once, so the walk takes time in the objects unpickled, not in the tree it makes."""
    sizes: dict[int, int] = {}  # id -> nodes under it, of a container summed
    opened: set[int] = set()
    stack: list[tuple[object, bool]] = [(data, False)]
    while stack:
        node, summing = stack.pop()
        children = _children(node)
        if summing:
            total = 1 + sum(sizes.get(id(child), 1) for child in children)
            if total > cap:
                return False
            sizes[id(node)] = total
        elif id(node) not in sizes:
            if id(node) in opened:  # opened, not summed: an ancestor of itself
                return False
            opened.add(id(node))
            stack.append((node, True))
            stack.extend((child, False) for child in children
                         if isinstance(child, _CONTAINERS) and id(child) not in sizes)
    return sizes.get(id(data), 1) <= cap


_CONTAINERS = (dict, list, tuple, set, frozenset)


def _children(node: object) -> list:
    if isinstance(node, dict):
        return [*node.keys(), *node.values()]
    return list(node) if isinstance(node, _CONTAINERS) else []


def check(snapshot: object) -> str | None:
    """None when `snapshot` has what mlamem reads: `segments` (each with address, total_size and
    blocks of size and state) and `device_traces` (lists of events with action, addr, size,
    and frames of filename, line, name where given); else the first field that is wrong."""
    from pydantic import ValidationError

    from mlamem.results.base import error_line

    try:
        _snapshot_model().model_validate(snapshot)
    except ValidationError as exc:
        return error_line(exc)
    return None


def _snapshot_model():
    """The pydantic model of what `check` asks of a snapshot (pydantic loaded when reading)."""
    from pydantic import BaseModel, ConfigDict

    from mlamem.results.models import Bytes

    class Part(BaseModel):
        model_config = ConfigDict(strict=True, extra="allow")

    class Frame(Part):
        filename: str
        line: int
        name: str

    class Event(Part):
        action: str
        addr: int
        size: Bytes
        frames: list[Frame] = []

    class Block(Part):
        size: Bytes
        requested_size: Bytes | None = None
        state: str
        frames: list[Frame] = []

    class Segment(Part):
        address: int
        total_size: Bytes
        blocks: list[Block]

    class Snapshot(Part):
        segments: list[Segment]
        device_traces: list[list[Event]] = []

    return Snapshot
