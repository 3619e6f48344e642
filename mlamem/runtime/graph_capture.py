"""Capturing one attention call as CUDA graphs, size after size, into one pool (runtime).

`mlamem graphs` and the vLLM engine both capture through `capture_all`; see mlamem/commands/graphs.py
for what is measured per capture.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mlamem.runtime.attribution import ExpectedBuffer
from mlamem.spec.kernel_api import SPARSE_DECODE
from mlamem.spec.scenario import Scenario

if TYPE_CHECKING:
    from mlamem.runtime.measure import CallPlan, CallRecord

GRAPH_RNG_STATE = "graph_rng_state"  # the first live graph's seed and offset (2 x 8 B)


@dataclass
class Capture:
    """One capture at `tokens`; bytes are deltas over the state just before it."""

    tokens: int
    peak_allocated_bytes: int | None = None  # the peak inside the capture
    peak_reserved_bytes: int | None = None
    pool_growth_bytes: int | None = None  # new segments, after its outputs were released
    held_bytes: int | None = None  # still allocated after its outputs were released
    device_growth_bytes: int | None = None  # mem_get_info's growth (measured, or modelled)
    replay_equal: bool | None = None  # the replay's out and lse equal the eager call's bits
    buffers: list[dict] = field(default_factory=list)  # the capture's allocations, named
    failure: str | None = None  # one line, when the warm-up or the capture failed
    oom: bool = False
    oom_requested_bytes: int | None = None
    call: CallRecord | None = None  # the measured warm-up (when it failed) or capture; not saved

    def take(self, call: CallRecord) -> None:
        """The figures of the measured call: its failure, or its peaks and named buffers."""
        self.call = call
        if call.failure is not None:
            self.failure, self.oom = call.failure.text, call.failure.oom
            self.oom_requested_bytes = call.failure.requested_bytes
            return
        self.peak_allocated_bytes = call.peak_allocated_bytes
        self.peak_reserved_bytes = call.peak_reserved_bytes
        self.buffers = [b.to_dict() for b in call.buffers]


@dataclass
class CallGraphs:
    """What capturing one path's call needs: its plan, its inputs at the largest size and its
    workspace."""

    plan: CallPlan  # the call; each capture plans it at its own size (`CallPlan.at`)
    q_all: object  # (largest, heads, d_qk): each capture takes the first T rows
    inputs: object  # OpInputs at the largest size
    workspace: object  # Workspace or None (alloc)

    @classmethod
    def make(cls, memory, scenario: Scenario, kernel, path: str, largest: int, *, sm_count: int,
             seed: int = 0) -> CallGraphs:
        """Inputs for `largest` rows, and the workspace the backend reserves."""
        from mlamem.runtime.measure import plan_call

        plan = plan_call(scenario, kernel, SPARSE_DECODE, largest, path, sm_count=sm_count)
        q_all, inputs = kernel.make_inputs(plan.problem, scenario.heads_per_rank, memory.device,
                                           seed)
        workspace = plan.reserve_workspace(memory, scenario.serving.max_num_batched_tokens)
        return cls(plan, q_all, inputs, workspace)

    def step_and_expected(self, memory, tokens: int):
        """The path's call at `tokens` rows, and the buffers it should allocate."""
        plan = self.plan.at(tokens)
        inputs = dataclasses.replace(self.inputs, indices=self.inputs.indices[:, :tokens])
        step = functools.partial(plan.call(memory, inputs, self.workspace), self.q_all[:tokens])
        return step, plan.expected


def capture_all(memory, graphs, call: CallGraphs, sizes: Sequence[int],
                on_capture: Callable[[Capture], None] | None = None):
    """Capture the call at every size, in order, into `graphs`' pool; stops at a failure.
    Returns the captures and the failure (measure.Failure) of the last, or None."""
    captures: list[Capture] = []
    failure = None
    for tokens in sizes:
        step, expected = call.step_and_expected(memory, tokens)
        if not captures and not graphs.live:  # the first live graph registers the RNG state
            expected = [ExpectedBuffer(GRAPH_RNG_STATE, 8, "torch.cuda.graph")] * 2 + expected
        capture, failure = capture_one(memory, graphs, step, tokens, expected)
        captures.append(capture)
        if on_capture is not None:
            on_capture(capture)
        if failure is not None:
            break
    return captures, failure


def capture_one(memory, graphs, step, tokens: int, expected):
    """vLLM's warm-up (one eager call, outside the pool), then the capture; measured, the
    replay is compared with the warm-up's out and lse bit for bit. Returns the capture and
    its failure (measure.Failure), or None."""
    from mlamem.runtime.measure import measure_one

    capture = Capture(tokens=tokens)
    warmup = measure_one(memory, step, expected)
    if warmup.failure is not None:
        capture.take(warmup)
        return capture, warmup.failure
    eager = [t.cpu() for t in warmup.value] if memory.measured else None
    del warmup
    memory.empty_cache()  # torch.cuda.graph empties it too; here so `before` is after it
    device_before = memory.device_used_bytes()

    def captured():
        with graphs.capture():
            return step()

    run = measure_one(memory, captured, expected)
    capture.take(run)
    if run.failure is not None:
        return capture, run.failure
    out, lse = run.value
    run.value = None
    if eager is not None:
        graphs.replay_last()
        capture.replay_equal = bool(out.cpu().equal(eager[0]) and lse.cpu().equal(eager[1]))
    del out, lse  # weak references only, as vLLM keeps a graph's outputs
    memory.empty_cache()  # the comparison's copies: the pool's figures are the pool's own
    released, device_after = memory.stats(device=False), memory.device_used_bytes()
    capture.pool_growth_bytes = released.reserved - run.before.reserved
    capture.held_bytes = released.allocated - run.before.allocated
    if device_after is not None and device_before is not None:
        capture.device_growth_bytes = device_after - device_before
    return capture, None
