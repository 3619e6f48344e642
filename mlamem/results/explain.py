"""`mlamem.explain/1`: the model of its files, and the objects only it holds."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from mlamem.results.base import Model, ResultFile
from mlamem.results.shared import Bytes, CommandLine, MaybeBytes


class FrameBytes(Model):
    """Bytes live at the snapshot's peak from one frame."""

    frame: str = Field(
        description=(
            "the innermost Python frame outside torch, mlamem and the kernel libraries, "
            "`file:line function` (else the innermost outside torch; `no frames` where the trace has none)"))
    bytes: Bytes = Field(description="the blocks live at the peak allocated there (rounded to 512)")
    allocations: int = Field(description="how many")


class SegmentBytes(Model):
    """Bytes live at the snapshot's peak in one segment."""

    address: int | None = Field(description="the segment's address (null: in no segment the snapshot names)")
    segment_bytes: MaybeBytes = Field(description="the segment's size")
    live_bytes: Bytes = Field(description="the blocks live in it at the peak")
    allocations: int = Field(description="how many")


class ImpliedShape(Model):
    """A T and padded head count at which the kernel allocates exactly the call's bytes."""

    op: str | None = Field(
        default=None,
        description="its operation, where the call's bytes fit more than one (else the call's `op`)")
    tokens: int = Field(
        description="the call's rows: T (sparse decode), requests b (dense decode), s_q (sparse prefill)")
    heads: int = Field(description="the padded heads q had in the kernel")
    requests: int | None = Field(default=None, description="dense decode: b, the requests (= `tokens`)")
    context_len: int | None = Field(
        default=None,
        description="dense decode: each request's context, the scenario's (its bytes do not depend on it)")
    kv_len: int | None = Field(
        default=None,
        description="sparse prefill: s_kv, the scenario's (its allocations do not depend on it)")

class CallBuffer(Model):
    """One allocation of a call found, named from the kernel's and path's spec."""

    name: str = Field(description="the buffer: `padded_q`, `out`, `lse`, ..., `o_accum`")
    requested_bytes: Bytes = Field(description="the bytes asked for")
    frame: str = Field(description="its frame, as `by_frame` names frames")
    live_at_peak: bool = Field(description="live at the snapshot's peak")


class Saving(Model):
    """What the workspace path saves on the call, from the predicted profile at its T."""

    op: str | None = Field(default=None, description="the operation profiled (null: sparse-decode)")
    tokens: int = Field(description="the rows profiled (T, b or s_q)")
    heads_per_rank: int = Field(description="the scenario's heads per rank")
    kernel: str = Field(description="the kernel profiled")
    alloc_peak_bytes: MaybeBytes = Field(description="the alloc path's predicted per-call peak")
    workspace_peak_bytes: MaybeBytes = Field(description="the workspace path's predicted per-call peak")
    saving_bytes: int = Field(description="alloc − workspace")
    removed_buffers: list[str] = Field(description="the buffers the workspace path does not allocate")
    saving_at_peak_bytes: Bytes = Field(
        description="of those, the bytes this call had live at the snapshot's peak (0 on the workspace path)")
    command: str = Field(description="the `mlamem profile` command that reproduces the call")


class FoundCall(Model):
    """One MLA kernel call found in the trace by its allocations."""

    first_event: int = Field(description="the trace event of its first allocation")
    op: str | None = Field(
        default=None, description="the operation whose allocations it matches (null: sparse-decode)")
    kernels: list[str] = Field(description="the kernels whose allocations it matches")
    path: str = Field(
        description="`alloc` (its padded q allocated just before), `workspace`, or `alloc or workspace` "
        "where both paths allocate the same buffers (no q to pad, no out= to stage)")
    implied: list[ImpliedShape] = Field(description="every (T, heads) its bytes fit")
    ambiguous: bool = Field(
        description="more than one (T, heads) fits: bytes fix only T × heads; `--scenario` fixes the heads")
    buffers: list[CallBuffer]
    live_at_peak_bytes: Bytes = Field(description="its blocks live at the snapshot's peak")
    saving: Saving | None = Field(
        description="null where no implied head count is the scenario's (give `--scenario`)")


class ExplainFile(ResultFile):
    """`mlamem explain --format json`: a PyTorch memory snapshot explained."""

    schema_: Literal["mlamem.explain/1"] = Field(alias="schema", description="`mlamem.explain/1`")
    command: CommandLine = Field(description="the command line that made it")
    snapshot: str = Field(description="the snapshot file read")
    created: str = Field(description="when it was made: UTC, ISO 8601")
    device: int = Field(description="the device whose trace is explained (the one with most events)")
    trace_events: int = Field(description="events in that device's trace")
    scenario: str = Field(description="the scenario giving the calls' dimensions")
    scenario_given: bool = Field(description="`--scenario` was given: its head count alone is tried")
    peak_bytes: Bytes = Field(description="the allocated peak (blocks rounded to 512)")
    peak_source: Literal["trace", "segments"] = Field(
        description="`trace`: replayed from the events; `segments`: what the segments held at the end")
    peak_event: int | None = Field(description="the trace event that reached the peak")
    reserved_bytes: Bytes = Field(description="the segments held when the snapshot was taken")
    by_frame: list[FrameBytes]
    by_segment: list[SegmentBytes]
    calls: list[FoundCall]
    notes: list[str] = Field(description="out-of-memory events and other caveats")


