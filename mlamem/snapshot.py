"""Memory snapshots in PyTorch's format, openable in https://pytorch.org/memory_viz.

A measured sweep keeps torch's own trace entries (with Python stacks); a predicted one writes the
allocator model's events and segments in the same layout.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from mlamem.files import write_atomic


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
    write_atomic(path, pickle.dumps(build(calls)), option="--snapshot")
