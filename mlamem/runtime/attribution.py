"""Where the bytes go: match a call's allocator events to named buffers.

The expected buffers come from the path (what the wrapper allocates, e.g. padded_q) and the
kernel adapter (what the kernel allocates inside: out, lse, scheduler tensors, accumulators).
Events are matched in order by requested size; anything left over is named by its frame where
the trace has Python stacks (`mlamem.runtime.frames.frame_label`), else listed as unattributed, never
dropped. Works on torch's trace entries and on the allocator model's alike.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from mlamem.runtime.allocator import round_size
from mlamem.runtime.frames import frame_label
from mlamem.spec.kernel_api import BufferSpec, allocated_in_call

UNATTRIBUTED = "unattributed"


@dataclass(frozen=True)
class ExpectedBuffer:
    """A buffer a path or kernel is expected to allocate inside the call."""

    name: str
    nbytes: int
    allocated_by: str  # "wrapper" or "kernel"


@dataclass(frozen=True)
class BufferUse:
    """One allocation inside the call, named."""

    name: str  # an expected buffer's name, else its frame, else "unattributed"
    allocated_by: str  # "wrapper", "kernel" or "unknown"
    requested_bytes: int
    block_bytes: int  # as the allocator counts it (rounded to 512)
    segment_bytes: int  # new device memory reserved (cudaMalloc) for it; 0 if it fit the cache
    live_at_peak: bool
    frame: str | None = None  # `file:line function` that asked for it; None: no stacks traced

    def to_dict(self) -> dict:
        """As a result states it: `frame` only where stacks were traced, so a result without
        them reads as it did before frames existed."""
        data = dataclasses.asdict(self)
        if data["frame"] is None:
            del data["frame"]
        return data


@dataclass(frozen=True)
class Breakdown:
    """A call's allocations by buffer, and whether the parts add up to the peak."""

    buffers: list[BufferUse]  # in allocation order
    missing: list[str]  # expected buffers that were never allocated
    peak_bytes: int  # sum of block_bytes of the buffers live at the peak

    @property
    def allocations(self) -> int:
        return len(self.buffers)

    @property
    def allocated_bytes(self) -> int:
        return sum(b.requested_bytes for b in self.buffers)


def expected_buffers(wrapper: list[BufferSpec], kernel: list[BufferSpec],
                     staged: tuple[str, ...]) -> list[ExpectedBuffer]:
    """What the call should allocate: the wrapper's buffers, then the kernel's not staged."""
    return ([ExpectedBuffer(s.name, s.nbytes, "wrapper") for s in wrapper]
            + [ExpectedBuffer(s.name, s.nbytes, "kernel")
               for s in allocated_in_call(kernel, staged)])


def attribute(events: list[dict], expected: list[ExpectedBuffer]) -> Breakdown:
    """Name each allocation in `events` (torch trace entries) and find what lives at the peak:
    an expected buffer's name, else the frame that asked for it (where the trace has stacks)."""
    unmatched = list(expected)
    uses: list[dict] = []
    live: dict[int, int] = {}  # address -> index into uses
    current = peak = new_segment = 0
    at_peak: set[int] = set()
    for event in events:
        if event["action"] == "segment_alloc":
            new_segment = event["size"]
        elif event["action"] == "alloc":
            match = next((e for e in unmatched if e.nbytes == event["size"]), None)
            if match is not None:
                unmatched.remove(match)
            frame = frame_label(event["frames"]) if event.get("frames") else None
            uses.append({"name": match.name if match else frame or UNATTRIBUTED,
                         "allocated_by": match.allocated_by if match else "unknown",
                         "requested_bytes": event["size"],
                         "block_bytes": round_size(event["size"]),
                         "segment_bytes": new_segment, "frame": frame})
            new_segment = 0
            live[event["addr"]] = len(uses) - 1
            current += uses[-1]["block_bytes"]
            if current > peak:
                peak, at_peak = current, set(live.values())
        elif event["action"] == "free_completed" and event["addr"] in live:
            current -= uses[live.pop(event["addr"])]["block_bytes"]
    return Breakdown(
        buffers=[BufferUse(**use, live_at_peak=i in at_peak) for i, use in enumerate(uses)],
        missing=[e.name for e in unmatched], peak_bytes=peak)
