"""Memory snapshots in PyTorch's format, openable in https://pytorch.org/memory_viz.

A measured sweep keeps torch's own trace entries (with Python stacks); a predicted one writes the
allocator model's events and segments in the same layout.
"""

from __future__ import annotations

import pickle
from pathlib import Path

from mlamem.files import write_atomic
from mlamem.measure import CallMeasurement


def build(calls: list[CallMeasurement]) -> dict:
    """One snapshot holding the measured calls' traces, in order, and the last segments."""
    traces = [event for call in calls for event in (call.trace or [])]
    segments = next((c.segments for c in reversed(calls) if c.segments is not None), [])
    return {"segments": segments, "device_traces": [traces], "allocator_settings": {},
            "external_annotations": []}


def write(path: Path, calls: list[CallMeasurement]) -> None:
    """Pickle the snapshot to `path`, whole or not at all."""
    write_atomic(path, pickle.dumps(build(calls)), option="--snapshot")
