"""`mlamem explain SNAPSHOT`: a PyTorch memory snapshot's peak, what was live at it (by frame
and by segment), the MLA kernel calls in it and what the workspace path would save.

The peak replays the device trace (alloc, free_completed; an address allocated again was freed
where the trace lost the free); without a trace it is what the segments hold. A call is a run of
consecutive allocations whose sizes are a kernel's allocation spec (`allocations(problem,
sm_count)`, the adapter's own) for one of the registered operations (mlamem.operations) at some
rows (T, requests b or s_q) and head count, in its order, the alloc path's padded (or fp8) q just
before it where the path allocated one. Bytes fix only rows x heads for rows above the SM count
(T=8192 at 64 heads allocates what T=4096 at 128 does): without a scenario every head count the
kernel runs is tried, and a call matching more than one is ambiguous. Each operation is matched
at the scenario's dimensions where the scenario drives it, else (no scenario given) at its own
default scenario's; a dense decode's context length is the scenario's, which its allocations do
not depend on.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from mlamem.commands import sweep
from mlamem.commands.profile import run_profile
from mlamem.operations import (
    SPARSE_DECODE,
    default_kv_tokens,
    kv_format,
    operation,
    operation_names,
    padded_heads_for,
    problem_for,
    scenario_operations,
    workspace_rows,
)
from mlamem.runtime import environment, snapshot
from mlamem.runtime.allocator import round_size
from mlamem.runtime.attribution import expected_buffers
from mlamem.runtime.frames import StackLabels
from mlamem.runtime.paths import plan, wrapper_allocations

if TYPE_CHECKING:
    from mlamem.results.explain import ExplainFile
    from mlamem.spec.kernel_api import KernelContract
    from mlamem.spec.scenario import Scenario

SCHEMA = "mlamem.explain/1"
LINEAR_TOKENS = 1024  # T searched one by one; above it, by bisection on the largest buffer
MAX_TOKENS = 1 << 20  # the largest T searched
EITHER_PATH = "alloc or workspace"  # a call both paths allocate alike (no q to pad, no out=)
# T at which a buffer's bytes must lie on the line through T=LINEAR_TOKENS+1 and +2 to be
# taken as affine in T above LINEAR_TOKENS (each T then solved at once, not bisected)
AFFINE_CHECKS = (LINEAR_TOKENS + 3, 4099, 65537, MAX_TOKENS // 2 + 1, MAX_TOKENS)


@dataclass(frozen=True)
class Allocation:
    """One alloc event of the trace (or a live block of a segment)."""

    index: int  # its position among the trace's events (-1: from a segment)
    addr: int
    size: int  # requested bytes
    frame: str  # `file:line function` (mlamem.runtime.frames.frame_label)

    @property
    def block_bytes(self) -> int:
        return round_size(self.size)


@dataclass(frozen=True)
class Peak:
    """The allocated peak and the allocations live at it."""

    bytes: int  # the sum of the live blocks (rounded as the allocator counts them)
    source: str  # "trace" or "segments"
    event: int | None  # the trace event that reached it
    live: list[Allocation]


def replay(events: list[dict], labels: StackLabels) -> Peak | None:
    """The trace's allocated peak and what is live at it; None for a trace with no alloc. One
    pass holding each live block's bytes; what is live at the peak comes from a second pass."""
    live: dict[int, int] = {}  # address -> block bytes
    current = peak = 0
    peak_event = None
    for i, event in enumerate(events):
        action = event["action"]
        if action == "alloc":
            addr = event["addr"]
            if addr in live:  # allocated again: its free is not in the trace
                current -= live.pop(addr)
            live[addr] = block = round_size(event["size"])
            current += block
            if current > peak:
                peak, peak_event = current, i
        elif action == "free_completed" and event["addr"] in live:
            current -= live.pop(event["addr"])
    if peak_event is None:
        return None
    return Peak(peak, "trace", peak_event, _live_after(events, peak_event, labels))


def _live_after(events: list[dict], last: int, labels: StackLabels) -> list[Allocation]:
    """What is live once event `last` is done, replayed again (cheaper than copying at each new
    peak)."""
    live: dict[int, int] = {}  # address -> its alloc event
    for i in range(last + 1):
        event = events[i]
        if event["action"] == "alloc":
            live[event["addr"]] = i
        elif event["action"] == "free_completed":
            live.pop(event["addr"], None)
    return [_allocation(events, i, labels) for i in sorted(live.values())]


def _allocation(events: list[dict], index: int, labels: StackLabels) -> Allocation:
    event = events[index]
    return Allocation(index, event["addr"], event["size"], labels(event.get("frames", [])))


def segment_peak(segments: list[dict], labels: StackLabels) -> Peak:
    """Without a trace: what the segments hold allocated when the snapshot was taken."""
    live, addr = [], 0
    for segment in segments:
        addr = segment["address"]
        for block in segment["blocks"]:
            if block["state"].startswith("active"):
                live.append(Allocation(-1, addr, block.get("requested_size") or block["size"],
                                       labels(block.get("frames", []))))
            addr += block["size"]
    return Peak(sum(a.block_bytes for a in live), "segments", None, live)


def segment_spans(data: dict, events: list[dict]) -> list[tuple[int, int]]:
    """(address, size) of every segment the snapshot names: the trace's segment_alloc (and, for
    expandable segments, segment_map) events and the segments held at the end, by address."""
    spans = {(e["addr"], e["size"]) for e in events
             if e["action"] in ("segment_alloc", "segment_map")}
    spans |= {(s["address"], s["total_size"]) for s in data["segments"]}
    return sorted(spans)


def segments_of(spans: list[tuple[int, int]], addrs: list[int]
                ) -> dict[int, tuple[int, int] | None]:
    """The segment holding each address: of the spans starting at or below it, the nearest
    covering it (None: none does). One sweep of the addresses and spans by address, with the
    spans begun kept in a heap by start: one ending at or below an address covers no later
    one, so it leaves the heap for good."""
    found: dict[int, tuple[int, int] | None] = {}
    begun: list[tuple[int, int, int, int]] = []  # (-start, -size, start, size)
    next_span = 0
    for addr in sorted(set(addrs)):
        while next_span < len(spans) and spans[next_span][0] <= addr:
            start, size = spans[next_span]
            heapq.heappush(begun, (-start, -size, start, size))
            next_span += 1
        while begun and begun[0][2] + begun[0][3] <= addr:
            heapq.heappop(begun)
        found[addr] = begun[0][2:] if begun else None
    return found


# The MLA calls: runs of allocations that are a kernel's spec.

@dataclass(frozen=True)
class Shape:
    """One candidate: an operation's kernel on a path at a padded head count, what the call
    allocates at any rows (the path's wrapper buffers, then the kernel's spec less what the path
    stages)."""

    op: str
    kernel: str
    path: str  # "alloc" (with its padded q), "workspace" or EITHER_PATH
    heads: int  # padded heads (q's heads as the kernel sees them)
    sizes: Callable[[int], tuple[tuple[str, int], ...]]  # rows -> (buffer, bytes) in order


@dataclass
class CallMatch:
    """A run of allocations matching one or more candidates."""

    allocations: list[Allocation]
    names: list[str]
    path: str  # "alloc", "workspace" or EITHER_PATH
    candidates: list[tuple[str, str, int, int]] = field(default_factory=list)  # (op, kernel, rows, heads)
    span: tuple[int, int] = (0, 0)  # its allocations, as a range over the trace's allocations

    @property
    def span_range(self) -> range:
        return range(*self.span)


def shapes(scenario: Scenario, kernels: list[tuple[str, KernelContract]],
           heads: list[int] | None, op: str) -> list[Shape]:
    """Each kernel that runs `op`, on the workspace path and the alloc path, at each head
    count: `heads` (the scenario's, q at its heads per rank), else every head count it runs
    (q padded from fewer heads, and q at the padded heads). Where both paths allocate the same
    buffers (a kernel with no out= and no q to pad) the call is either's (EITHER_PATH)."""
    found: list[Shape] = []
    seen: dict[tuple, int] = {}  # (kernel, heads, buffer names) -> its index in found
    for name, kernel in kernels:
        if op not in kernel.operations:
            continue
        capabilities = kernel.capabilities(op, kv_format(scenario, op))
        for count in heads or list(capabilities.head_counts):
            for path in ("workspace", "alloc"):
                for q_heads in [scenario.heads_per_rank] if heads else sorted({1, count}):
                    def sizes(t: int, kernel=kernel, count=count, path=path, q_heads=q_heads,
                              capabilities=capabilities) -> tuple[tuple[str, int], ...]:
                        problem = problem_for(scenario, op, t, count)
                        staged = plan(path, q_heads, capabilities, kernel.label,
                                      problem.q_dtype).staged
                        wrapper = wrapper_allocations(path, t, q_heads, count, scenario.d_qk,
                                                      problem.q_dtype)
                        spec = kernel.allocations(problem, scenario.gpu.sm_count)
                        return tuple((e.name, e.nbytes)
                                     for e in expected_buffers(wrapper, spec, staged))

                    names = tuple(n for n, _ in sizes(1))
                    if (name, count, names) in seen:  # both paths allocate these buffers
                        i = seen[(name, count, names)]
                        if found[i].path != path:
                            found[i] = dataclasses.replace(found[i], path=EITHER_PATH)
                        continue
                    seen[(name, count, names)] = len(found)
                    found.append(Shape(op, name, path, count,
                                       functools.lru_cache(maxsize=None)(sizes)))
    return found


def op_scenarios(scenario: Scenario, source: str, scenario_given: bool
                 ) -> list[tuple[str, Scenario, str]]:
    """(operation, scenario, as given) for each operation matched: those `scenario` drives,
    and, where no scenario was given, every other registered one at its own default scenario."""
    from mlamem.spec import scenario as scenarios

    driven = scenario_operations(scenario)
    found = []
    for op in operation_names():
        if op in driven:
            found.append((op, scenario, source))
        elif not scenario_given:
            default = operation(op).default_scenario
            found.append((op, scenarios.load(default), default))
    return found


def _tokens_for(shape: Shape, size: int, anchor: int) -> list[int]:
    """The T at which the spec's `anchor`-th buffer has `size` bytes: those up to LINEAR_TOKENS
    (each tried once per shape), and above it the one a bisection on that buffer's bytes finds,
    which grow with T there (solved at once where they grow by the same bytes per T)."""
    found = list(_small_tokens(shape, anchor).get(size, ()))
    low, high = (shape.sizes(t)[anchor][1] for t in (LINEAR_TOKENS + 1, MAX_TOKENS))
    if not low <= size <= high:
        return found
    step = shape.sizes(LINEAR_TOKENS + 2)[anchor][1] - low
    if step > 0 and all(shape.sizes(t)[anchor][1] == low + step * (t - LINEAR_TOKENS - 1)
                        for t in AFFINE_CHECKS):
        t = LINEAR_TOKENS + 1 + (size - low) // step  # bytes affine in T: solved, then checked
    else:
        lo, hi = LINEAR_TOKENS + 1, MAX_TOKENS
        while lo < hi:
            mid = (lo + hi) // 2
            if shape.sizes(mid)[anchor][1] < size:
                lo = mid + 1
            else:
                hi = mid
        t = lo
    if shape.sizes(t)[anchor][1] == size:
        found.append(t)
    return found


@functools.lru_cache(maxsize=64)
def _small_tokens(shape: Shape, anchor: int) -> dict[int, list[int]]:
    """The `anchor`-th buffer's bytes at each T up to LINEAR_TOKENS -> those T."""
    found: dict[int, list[int]] = {}
    for t in range(1, LINEAR_TOKENS + 1):
        found.setdefault(shape.sizes(t)[anchor][1], []).append(t)
    return found


def find_calls(events: list[dict], candidates: list[Shape], labels: StackLabels
               ) -> list[CallMatch]:
    """The runs of consecutive allocations that are a candidate's buffers at some T, in sizes
    and in order; each allocation in one call at most, the longest run first. A run whose
    buffers are all of one size is no call: any order of them matches, and any loop allocating
    one size twice would be one (vLLM's sparse prefill on the workspace path allocates only
    max_logits and lse, of one size). Each candidate looks only at the positions where its
    largest buffer's bytes are, so the work grows with the allocations, not with their
    product with the sizes the kernels allocate."""
    indices = [i for i, event in enumerate(events) if event["action"] == "alloc"]
    sizes = [events[i]["size"] for i in indices]
    positions: dict[int, list[int]] = {}
    for k, size in enumerate(sizes):
        positions.setdefault(size, []).append(k)
    matches: dict[tuple[int, int], CallMatch] = {}
    for shape in candidates:
        spec = shape.sizes(LINEAR_TOKENS + 1)
        anchor = max(range(len(spec)), key=lambda i: spec[i][1])
        for size, at in positions.items():
            for t in _tokens_for(shape, size, anchor):
                expected = shape.sizes(t)
                wanted = [b for _, b in expected]
                if len(set(wanted)) < 2:
                    continue
                for k in at:
                    start = k - anchor
                    if start >= 0 and sizes[start:start + len(wanted)] == wanted:
                        _add_match(matches, (start, start + len(wanted)), shape, t, expected)
    kept = _disjoint(matches)
    for match in kept:
        match.allocations = [_allocation(events, indices[k], labels) for k in match.span_range]
    return kept


def _add_match(matches: dict[tuple[int, int], CallMatch], span: tuple[int, int], shape: Shape,
               t: int, expected: tuple[tuple[str, int], ...]) -> None:
    if span not in matches:
        matches[span] = CallMatch([], [n for n, _ in expected], shape.path, span=span)
    match = matches[span]
    if match.path != shape.path:  # another kernel's, or heads', other path
        match.path = EITHER_PATH
    if (shape.op, shape.kernel, t, shape.heads) not in match.candidates:
        match.candidates.append((shape.op, shape.kernel, t, shape.heads))


def _disjoint(matches: dict[tuple[int, int], CallMatch]) -> list[CallMatch]:
    """The matches kept, in trace order: the longest first (the alloc path's run holds the
    workspace path's, less its padded q), then the earliest; one that shares an allocation with
    one kept is not."""
    taken: set[int] = set()
    kept = []
    for span in sorted(matches, key=lambda s: (s[0] - s[1], s[0])):
        if not taken.intersection(range(*span)):
            taken.update(range(*span))
            kept.append(matches[span])
    return sorted(kept, key=lambda m: m.span)


def live_by_name(data: dict, events: list[dict], scenario: Scenario) -> tuple[Peak, dict[str, int]]:
    """The peak, and the bytes live at it per name: a buffer of an MLA call found (at any head
    count the kernels run) by its buffer's name, any other allocation by its frame."""
    labels = StackLabels()
    peak = replay(events, labels) or segment_peak(data["segments"], labels)
    kernels = _kernels(None)
    calls = find_calls(events, [s for op, at, _ in op_scenarios(scenario, scenario.name, False)
                                for s in shapes(at, kernels, None, op)], labels)
    name_of = {a.index: name for call in calls
               for name, a in zip(call.names, call.allocations, strict=True)}
    named: dict[str, int] = {}
    for allocation in peak.live:
        name = name_of.get(allocation.index, allocation.frame)
        named[name] = named.get(name, 0) + allocation.block_bytes
    return peak, named


def load(path: Path) -> tuple[dict, list[dict], int]:
    """The snapshot, the device trace with the most events and that device's index."""
    data = snapshot.read(path)
    traces = data.get("device_traces") or [[]]
    device = max(range(len(traces)), key=lambda i: len(traces[i]))
    return data, traces[device], device


# The whole explanation, as the JSON schema mlamem.explain/1 holds it.

def explain(path: Path, scenario: Scenario, scenario_source: str, *, scenario_given: bool,
            command: str, kernel_names: list[str] | None = None,
            loaded: tuple[dict, list[dict], int] | None = None) -> ExplainFile:
    """The snapshot at `path` explained (a dict of `mlamem.results.models.ExplainFile`).
    `scenario` (as given: `scenario_source`) gives the call's dimensions and, when
    `scenario_given`, its head count. `loaded`: `load(path)`, where the caller read it first."""
    data, events, device = loaded or load(path)
    labels = StackLabels()
    peak = replay(events, labels) or segment_peak(data["segments"], labels)
    spans = segment_spans(data, events)
    at_peak = {a.index for a in peak.live}
    kernels = _kernels(kernel_names)
    ops = {op: (at, at_source) for op, at, at_source in
           op_scenarios(scenario, scenario_source, scenario_given)}
    padded = {(op, name): padded_heads_for(kernel, at, op) for op, (at, _) in ops.items()
              for name, kernel in kernels if op in kernel.operations}
    candidates = []
    for op, (at, _) in ops.items():
        heads = sorted({h for (o, _), h in padded.items() if o == op}) if scenario_given else None
        candidates += shapes(at, kernels, heads, op)
    calls = find_calls(events, candidates, labels)
    notes = [f"event {i}: out of memory asking for {e['size']} bytes"
             for i, e in enumerate(events) if e["action"] == "oom"]
    skipped = [op for op in operation_names() if op not in ops]
    if skipped:
        notes.append(f"scenario {scenario.name} does not drive {', '.join(skipped)}: no calls "
                     "of it were looked for (give a scenario that drives it, or none)")
    if peak.source == "segments":
        notes.append("the snapshot has no trace: the peak is what its segments hold, with no "
                     "calls to find")
    from mlamem.results.explain import ExplainFile  # pydantic: once a snapshot is explained

    return ExplainFile.model_validate({
        "schema": SCHEMA, "command": command, "snapshot": str(path),
        "created": environment.now_utc(), "device": device, "trace_events": len(events),
        "scenario": scenario.name, "scenario_given": scenario_given,
        "peak_bytes": peak.bytes, "peak_source": peak.source, "peak_event": peak.event,
        "reserved_bytes": sum(s["total_size"] for s in data["segments"]),
        "by_frame": _by_frame(peak.live), "by_segment": _by_segment(peak.live, spans),
        "calls": [_call(c, at_peak, ops, padded) for c in calls], "notes": notes,
    })


def _kernels(names: list[str] | None) -> list[tuple[str, KernelContract]]:
    """The registered kernels to match (`names`, else the two FlashMLA builds compare holds
    to each other), loaded."""
    from mlamem.kernels import COMPARED_KERNELS, load_kernel

    return [(name, load_kernel(name)()) for name in names or COMPARED_KERNELS]


def _by_frame(live: list[Allocation]) -> list[dict]:
    """Bytes live at the peak per frame, largest first."""
    groups: dict[str, list[Allocation]] = {}
    for allocation in live:
        groups.setdefault(allocation.frame, []).append(allocation)
    rows = [{"frame": frame, "bytes": sum(a.block_bytes for a in group),
             "allocations": len(group)} for frame, group in groups.items()]
    return sorted(rows, key=lambda r: (-r["bytes"], r["frame"]))


def _by_segment(live: list[Allocation], spans: list[tuple[int, int]]) -> list[dict]:
    """Bytes live at the peak per segment, by address; allocations in no known segment apart."""
    groups: dict[tuple[int, int] | None, list[Allocation]] = {}
    segment = segments_of(spans, [a.addr for a in live])
    for allocation in live:
        groups.setdefault(segment[allocation.addr], []).append(allocation)
    return [{"address": None if span is None else span[0],
             "segment_bytes": None if span is None else span[1],
             "live_bytes": sum(a.block_bytes for a in group), "allocations": len(group)}
            for span, group in sorted(groups.items(), key=lambda kv: kv[0] or (-1, 0))]


def _call(match: CallMatch, at_peak: set[int], ops: dict[str, tuple[Scenario, str]],
          padded: dict[tuple[str, str], int]) -> dict:
    """One call found: its operation, buffers, the rows and heads it implies, and the saving
    the profile predicts for the implied shape that is the scenario's (`ops`: each operation's
    scenario and its source; `padded`: its heads per operation and kernel)."""
    implied = sorted({(op, t, heads) for op, _, t, heads in match.candidates})
    kernels = sorted({k for _, k, _, _ in match.candidates})
    op, kernel = next((o, k) for o, k, _, _ in match.candidates)
    fitting = [t for o, t, h in implied if o == op and h == padded[(op, kernel)]]
    live = [a for a in match.allocations if a.index in at_peak]
    return {
        "first_event": match.allocations[0].index, "op": op, "kernels": kernels,
        "path": match.path,
        "implied": [_implied(o, t, h, ops[o][0], len({o for o, _, _ in implied}) > 1)
                    for o, t, h in implied],
        "ambiguous": len(implied) > 1,
        "buffers": [{"name": name, "requested_bytes": a.size, "frame": a.frame,
                     "live_at_peak": a.index in at_peak}
                    for name, a in zip(match.names, match.allocations, strict=True)],
        "live_at_peak_bytes": sum(a.block_bytes for a in live),
        "saving": _saving(op, *ops[op], kernel, fitting[0], match, at_peak)
        if fitting else None,
    }


def _implied(op: str, rows: int, heads: int, scenario: Scenario, name_op: bool) -> dict:
    """One implied shape: its rows as `tokens` (as the profile's rows hold them) and under the
    operation's own key, a KV length the scenario's (the call's bytes do not depend on it), and
    its operation where the call fits more than one (`name_op`)."""
    shape = {"tokens": rows, "heads": heads, operation(op).key: rows}
    if operation(op).kv_key is not None:
        shape[operation(op).kv_key] = default_kv_tokens(scenario, op)
    return {"op": op, **shape} if name_op else shape


@functools.lru_cache(maxsize=256)  # an engine's snapshot repeats a T call after call
def _profiled(op: str, scenario: Scenario, source: str, kernel_name: str, tokens: int
              ) -> tuple[str, int, dict]:
    """The predicted profile of the alloc and workspace paths of `op` at `tokens` rows: the
    command that reproduces it, the heads per rank, and its rows by path."""
    from mlamem.kernels import load_kernel

    kernel = load_kernel(kernel_name)()
    limit = scenario.serving.max_num_batched_tokens
    # the workspace must hold the call's rows, where max_num_batched_tokens sizes it
    wider = tokens if tokens > limit and workspace_rows(scenario, op) == limit else None
    [part] = sweep.plan(sweep.Request("explain", kernel, scenarios=[(source, scenario)], ops=[op],
                          values={op: [tokens]}, paths=["alloc", "workspace"],
                          max_num_batched_tokens=wider))
    command = (f"mlamem profile --scenario {source}"
               + ("" if op == SPARSE_DECODE else f" --op {op}")
               + f" {operation(op).flag} {tokens} --paths alloc,workspace "
               f"--kernel {kernel_name} --breakdown"
               + (f" --max-num-batched-tokens {wider}" if wider else ""))
    result = run_profile(part.scenario, part.values, part.paths, command=command,
                         kernel=kernel, predict=True, op=part.op)
    return command, part.scenario.heads_per_rank, {row.path: row for row in result.rows}


def _saving(op: str, scenario: Scenario, source: str, kernel_name: str, tokens: int,
            match: CallMatch, at_peak: set[int]) -> dict:
    """What the workspace path saves on this call: the predicted profile of the alloc and
    workspace paths at its T (`run_profile`, as `mlamem profile --predict` runs it), the
    buffers it removes, and those of them live at the snapshot's peak."""
    command, heads_per_rank, rows = _profiled(op, scenario, source, kernel_name, tokens)
    removed = sorted({b.name for b in rows["alloc"].buffers if b.removed_by_workspace})
    at_peak_removed = sum(a.block_bytes for name, a in zip(match.names, match.allocations,
                                                           strict=True)
                          if name in removed and a.index in at_peak)
    return {
        "op": op, "tokens": tokens, "heads_per_rank": heads_per_rank, "kernel": kernel_name,
        "alloc_peak_bytes": rows["alloc"].peak_allocated_bytes,
        "workspace_peak_bytes": rows["workspace"].peak_allocated_bytes,
        "saving_bytes": rows["alloc"].peak_allocated_bytes
        - rows["workspace"].peak_allocated_bytes,
        "removed_buffers": removed,
        "saving_at_peak_bytes": at_peak_removed if match.path == "alloc" else 0,
        "command": command,
    }
