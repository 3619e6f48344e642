"""`mlamem graphs`: what one attention call costs in a CUDA-graph pool across an engine's
capture list, measured or predicted, beside the engine's own estimate of it.

For one path, the call is captured at every size of the capture list, largest first, into one
shared private pool, as vLLM 0.33.0 captures its FULL decode graphs. Before each capture the
call runs once eagerly (vLLM's warm-up; measured: the reference a replay must equal bit for
bit); `torch.cuda.graph` then empties the cache and captures. A capture's outputs are kept only
as weak references, as vLLM keeps them (`weak_ref_tensors`): the blocks go back to the pool
and the next capture reuses them, so the pool ends about as large as the largest capture.
Per capture: the pool's growth (allocator reserved, and the device-wide growth vLLM reads
with `mem_get_info`), the peak inside the capture and what stays allocated.

vLLM's estimate (v1/worker/gpu/cudagraph_utils.py, profile_cudagraph_memory and
_extrapolate_full_graph_memory): first FULL capture + max(second, 1 MiB) x (N - 1), from
device-wide samples taken around each `torch.cuda.graph` after its warm-up. The first two
captures here are the same two, in a fresh pool, so the rule is applied to them.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mlamem import environment
from mlamem.errors import UserError
from mlamem.kernels.base import SPARSE_DECODE
from mlamem.paths import check_paths, plan
from mlamem.scenario import Scenario, Serving

if TYPE_CHECKING:
    from mlamem.measure import CallRecord

SCHEMA = "mlamem.graphs/1"
MIN_PER_GRAPH_BYTES = 1 << 20  # vLLM's _MIN_PER_GRAPH_BYTES: "driver overhead" per graph
GRAPH_RNG_STATE = "graph_rng_state"  # the first live graph's seed and offset (2 x 8 B)

# vLLM 0.33.0's capture sizes (config/vllm.py, VllmConfig._set_cudagraph_sizes)
DEFAULT_MAX_GRAPH_SIZE = 512  # caps the default largest size, on every GPU (no per-arch value)
FULL_MODES = ("FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")  # decode graphs hold attention


def request_counts(max_num_seqs: int) -> list[int]:
    """vLLM's request counts for uniform decode sizes under speculation (config/vllm.py)."""
    m = min(max_num_seqs, DEFAULT_MAX_GRAPH_SIZE)
    counts = [1, 2, 4] + list(range(8, min(m + 1, 256), 8)) + list(range(256, m + 1, 16))
    return sorted({c for c in counts if c <= m} | {m})


def capture_sizes(serving: Serving) -> list[int]:
    """vLLM 0.33.0's `cudagraph_capture_sizes` for this serving config, ascending.

    max = max_cudagraph_capture_size, or min(max_num_seqs x (1 + k) x 2, 512) by default,
    capped at max_num_batched_tokens; sizes [1, 2, 4] + range(8, 256, 8) + range(256, max + 1,
    16) up to max, plus max_num_batched_tokens when it is within max, plus the uniform decode
    sizes (by default only).
    """
    query_len = 1 + serving.num_speculative_tokens
    tokens = serving.max_num_batched_tokens
    largest = serving.max_cudagraph_capture_size
    uniform: list[int] = []
    if largest is None:
        largest = min(serving.max_num_seqs * query_len * 2, DEFAULT_MAX_GRAPH_SIZE)
        if query_len > 1:
            uniform = sorted({n * query_len for n in request_counts(serving.max_num_seqs)
                              if n * query_len <= largest})
        elif serving.max_num_seqs <= largest:
            uniform = [serving.max_num_seqs]
    largest = min(tokens, largest)
    sizes = [i for i in (1, 2, 4) if i <= largest]
    if largest >= 8:
        sizes += list(range(8, min(largest + 1, 256), 8))
    if largest >= 256:
        sizes += list(range(256, largest + 1, 16))
    if tokens <= largest:
        sizes.append(tokens)
    sizes += [s for s in uniform if s <= tokens]
    return sorted(set(sizes))


def full_decode_sizes(serving: Serving) -> list[int]:
    """The FULL uniform-decode graphs (attention inside), largest first: vLLM V2's
    CudaGraphManager._init_candidates rounds each capture size up to a multiple of 1 + k and
    keeps those within max_num_seqs x (1 + k) and the largest capture size. Empty when the mode
    puts attention in no graph (NONE, PIECEWISE)."""
    if serving.cudagraph_mode not in FULL_MODES:
        return []
    query_len = 1 + serving.num_speculative_tokens
    sizes = capture_sizes(serving)
    if not sizes:
        return []
    rounded = {-(-s // query_len) * query_len for s in sizes}
    return sorted((s for s in rounded if s <= serving.max_num_seqs * query_len
                   and s <= sizes[-1]), reverse=True)


def capture_list_source(serving: Serving) -> str:
    """Where the default list comes from, in words."""
    largest = ("max_cudagraph_capture_size " + str(serving.max_cudagraph_capture_size)
               if serving.max_cudagraph_capture_size is not None
               else "max_cudagraph_capture_size by vLLM's rule")
    return (f"vLLM 0.33.0's FULL decode graphs for cudagraph_mode {serving.cudagraph_mode}, "
            f"max_num_seqs {serving.max_num_seqs}, {largest}, "
            f"{serving.num_speculative_tokens} speculative tokens, max_num_batched_tokens "
            f"{serving.max_num_batched_tokens}")


def check_capture_sizes(sizes: Sequence[int], max_tokens: int) -> list[int]:
    """The sizes, largest first, without repeats; UserError for one outside 1..max_tokens."""
    for size in sizes:
        if not 1 <= size <= max_tokens:
            raise UserError(f"--capture-sizes {size}: a capture must hold 1 to {max_tokens} "
                            "tokens (the scenario's max_num_batched_tokens sizes the workspace)")
    return sorted(set(sizes), reverse=True)


def sizes_to_capture(scenario: Scenario, sizes: Sequence[int] | None) -> list[int]:
    """`sizes` (--capture-sizes), or the scenario's FULL decode graphs; largest first."""
    serving = scenario.serving
    if sizes is None:
        sizes = full_decode_sizes(serving)
        if not sizes:
            raise UserError(f"{scenario.name}: cudagraph_mode {serving.cudagraph_mode} puts the "
                            "attention call in no CUDA graph (vLLM runs it eagerly); set "
                            "[serving].cudagraph_mode = \"FULL_AND_PIECEWISE\" or pass "
                            "--capture-sizes")
    return check_capture_sizes(sizes, serving.max_num_batched_tokens)


# What one capture and one path hold


@dataclass
class Capture:
    """One capture at `tokens`; bytes are deltas over the state just before it."""

    tokens: int
    peak_allocated_bytes: int | None = None  # the peak inside the capture
    peak_reserved_bytes: int | None = None
    pool_growth_bytes: int | None = None  # new segments, after its outputs were released
    held_bytes: int | None = None  # still allocated after its outputs were released
    device_growth_bytes: int | None = None  # mem_get_info's growth (measured only)
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
        self.buffers = [dataclasses.asdict(b) for b in call.buffers]


@dataclass(frozen=True)
class Estimate:
    """vLLM's rule on two samples: first + max(second, 1 MiB) x (graphs - 1)."""

    source: str  # "device" (mem_get_info, as vLLM) or "allocator" (reserved growth)
    first_bytes: int
    second_bytes: int
    per_graph_bytes: int  # max(second, 1 MiB)
    graphs: int
    estimate_bytes: int
    actual_bytes: int  # what the whole list took, by the same measure
    error_bytes: int  # estimate - actual
    error_percent: float | None  # of actual


def vllm_estimate(source: str, samples: Sequence[int], actual: int, graphs: int) -> Estimate:
    """vLLM's extrapolation from the first two captures' growth `samples`."""
    first = samples[0] if samples else 0
    second = samples[1] if len(samples) > 1 else 0
    per_graph = max(second, MIN_PER_GRAPH_BYTES) if graphs > 1 else 0
    estimate = first + per_graph * (graphs - 1) if graphs else 0
    return Estimate(source, first, second, per_graph, graphs, estimate, actual,
                    estimate - actual, round(100 * (estimate - actual) / actual, 2)
                    if actual else None)


@dataclass
class GraphPath:
    """One path captured at every size of the list."""

    path: str
    staged: list[str]
    captures: list[Capture]
    pool_bytes: int | None = None  # reserved growth over all captures: the pool
    held_bytes: int | None = None  # allocated after all captures, outputs released
    device_bytes: int | None = None  # mem_get_info growth over all captures (measured)
    unexplained_device_bytes: int | None = None  # device - pool: instantiation, modules
    estimates: list[Estimate] = field(default_factory=list)
    failure: str | None = None  # the first capture that failed, in one line

    @property
    def complete(self) -> bool:
        return self.failure is None


@dataclass(frozen=True)
class GraphsResult:
    """The JSON schema `mlamem.graphs/1`."""

    command: str
    measured: bool
    not_measured_reason: str | None
    scenario: dict
    kernel: dict
    op: str
    capture_sizes: list[int]  # largest first, as captured
    capture_sizes_source: str
    serving: dict  # max_num_seqs, max_cudagraph_capture_size, cudagraph_mode, ...
    environment: environment.Environment
    paths: list[GraphPath]
    notes: list[str] = field(default_factory=list)
    schema: str = SCHEMA
    created: str | None = None

    def to_dict(self) -> dict:
        from mlamem.measure import without_record

        return without_record(self)

    @classmethod
    def from_dict(cls, data: dict) -> GraphsResult:
        """Read back a saved mlamem.graphs/1 file; KeyError/TypeError if malformed."""
        paths = [GraphPath(**{**p, "captures": [Capture(**c) for c in p["captures"]],
                              "estimates": [Estimate(**e) for e in p["estimates"]]})
                 for p in data["paths"]]
        return cls(**{**data, "paths": paths,
                      "environment": environment.Environment.from_dict(data["environment"]),
                      "notes": list(data.get("notes", []))})


# Measuring


@dataclass
class CallGraphs:
    """What capturing one path's call needs: its inputs at the largest size and workspace."""

    scenario: Scenario
    kernel: object
    path: str
    sm_count: int
    q_all: object  # (largest, heads, d_qk): each capture takes the first T rows
    inputs: object  # OpInputs at the largest size
    workspace: object  # Workspace or None (alloc)

    @classmethod
    def make(cls, memory, scenario: Scenario, kernel, path: str, largest: int, *, sm_count: int,
             seed: int = 0, workspace=None, reserve: bool = True) -> CallGraphs:
        """Inputs for `largest` rows, and the workspace the backend reserves (unless given)."""
        from mlamem.operations import problem_for
        from mlamem.paths import reserve_workspace

        padded = _padded_heads(scenario, kernel)
        problem = problem_for(scenario, SPARSE_DECODE, largest, padded)
        q_all, inputs = kernel.make_inputs(problem, scenario.heads_per_rank, memory.device, seed)
        if workspace is None and reserve:
            workspace = reserve_workspace(
                path, kernel, max_tokens=scenario.serving.max_num_batched_tokens,
                padded_heads=padded, d_qk=scenario.d_qk, d_v=scenario.d_v, topk=problem.topk,
                sm_count=sm_count, device=memory.device)
        return cls(scenario, kernel, path, sm_count, q_all, inputs, workspace)

    def step_and_expected(self, memory, tokens: int):
        """The path's call at `tokens` rows, and the buffers it should allocate."""
        from mlamem.attribution import expected_buffers
        from mlamem.measure import runner
        from mlamem.operations import kv_format, problem_for
        from mlamem.paths import PATHS, KernelCall, wrapper_allocations

        scenario, kernel = self.scenario, self.kernel
        capabilities = kernel.capabilities(SPARSE_DECODE, kv_format(scenario, SPARSE_DECODE))
        padded = capabilities.padded_heads(scenario.heads_per_rank)
        problem = problem_for(scenario, SPARSE_DECODE, tokens, padded)
        inputs = dataclasses.replace(self.inputs, indices=self.inputs.indices[:, :tokens])
        call = KernelCall(run=runner(kernel, memory, self.sm_count, problem, inputs),
                          op=SPARSE_DECODE, padded_heads=padded,
                          takes_out=capabilities.takes_out)
        staged = plan(self.path, scenario.heads_per_rank, capabilities, kernel.label).staged
        expected = expected_buffers(
            wrapper_allocations(self.path, tokens, scenario.heads_per_rank, padded, scenario.d_qk),
            kernel.op_allocations(problem, self.sm_count), staged)
        return functools.partial(PATHS[self.path], self.q_all[:tokens], call, self.workspace), expected


def _padded_heads(scenario: Scenario, kernel) -> int:
    from mlamem.operations import kv_format

    capabilities = kernel.capabilities(SPARSE_DECODE, kv_format(scenario, SPARSE_DECODE))
    return capabilities.padded_heads(scenario.heads_per_rank)


def capture_all(memory, graphs, call: CallGraphs, sizes: Sequence[int],
                on_capture: Callable[[Capture], None] | None = None):
    """Capture the call at every size, in order, into `graphs`' pool; stops at a failure.
    Returns the captures and the failure (measure.Failure) of the last, or None."""
    from mlamem.attribution import ExpectedBuffer

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
    from mlamem.measure import measure_one

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


def measure_path(memory, scenario: Scenario, kernel, path: str, sizes: Sequence[int], *,
                 sm_count: int, seed: int = 0,
                 on_capture: Callable[[Capture], None] | None = None) -> GraphPath:
    """Capture `path`'s call at every size (largest first) into one pool; see the module."""
    capabilities = kernel.capabilities(SPARSE_DECODE)
    staged = plan(path, scenario.heads_per_rank, capabilities, kernel.label).staged
    result = GraphPath(path=path, staged=list(staged), captures=[])
    with memory:
        call = CallGraphs.make(memory, scenario, kernel, path, max(sizes), sm_count=sm_count,
                               seed=seed)
        memory.empty_cache()
        start, device_start = memory.stats(), memory.device_used_bytes()
        with memory.graphs() as graphs:
            result.captures, _ = capture_all(memory, graphs, call, sizes, on_capture)
            end, device_end = memory.stats(), memory.device_used_bytes()
        del call
    failed = next((c for c in result.captures if c.failure is not None), None)
    if failed is not None:
        result.failure = f"T={failed.tokens}: {failed.failure}"
        return result
    result.pool_bytes = end.reserved - start.reserved
    result.held_bytes = end.allocated - start.allocated
    if device_end is not None and device_start is not None:
        result.device_bytes = device_end - device_start
        result.unexplained_device_bytes = result.device_bytes - result.pool_bytes
    result.estimates = estimates(result.captures, result.pool_bytes, result.device_bytes)
    return result


def estimates(captures: Sequence[Capture], pool_bytes: int,
              device_bytes: int | None) -> list[Estimate]:
    """vLLM's rule on the allocator's growth, and on the device's where it was measured."""
    count = len(captures)
    found = [vllm_estimate("allocator", [c.pool_growth_bytes for c in captures[:2]],
                           pool_bytes, count)]
    if device_bytes is not None:
        found.append(vllm_estimate("device", [c.device_growth_bytes for c in captures[:2]],
                                   device_bytes, count))
    return found


def run_graphs(scenario: Scenario, paths: Sequence[str], *, command: str, kernel=None,
               sizes: Sequence[int] | None = None, predict: bool = False,
               on_capture: Callable[[str, Capture], None] | None = None) -> GraphsResult:
    """Measure (or predict, without a GPU or with `predict`) every path over the capture list:
    the scenario's FULL decode graphs unless `sizes` is given."""
    from mlamem.kernels import DEFAULT_KERNEL, load_kernel
    from mlamem.measure import local_sm_count
    from mlamem.memory import CudaMemory, SimulatedMemory
    from mlamem.profile import scenario_summary

    kernel = kernel or load_kernel(DEFAULT_KERNEL)()
    capabilities = kernel.capabilities(SPARSE_DECODE)
    check_paths(paths, capabilities, kernel.label)
    serving = scenario.serving
    chosen = sizes_to_capture(scenario, sizes)
    source = capture_list_source(serving) if sizes is None else "--capture-sizes"
    reason = "--predict was given" if predict else kernel.unavailable_reason()
    sm_count = local_sm_count() if reason is None else scenario.gpu.sm_count
    results = []
    for path in paths:
        memory = CudaMemory() if reason is None else SimulatedMemory()
        results.append(measure_path(
            memory, scenario, kernel, path, chosen, sm_count=sm_count,
            on_capture=None if on_capture is None else functools.partial(on_capture, path)))
    padded = capabilities.padded_heads(scenario.heads_per_rank)
    notes = ["each capture's outputs are released after it (vLLM keeps weak references), "
             "so later captures reuse their blocks",
             "vLLM's estimate: first FULL capture + max(second, 1 MiB) x (N - 1), from the "
             "device-wide growth of the first two captures (mem_get_info); the allocator line "
             "applies the same rule to the allocator's reserved growth"]
    if scenario.heads_per_rank >= 32:
        notes.append(f"{scenario.heads_per_rank} heads per rank: vLLM's FlashMLA sparse backend "
                     "runs such a decode as (requests, 1 + k, heads, d); this captures the "
                     "(1, T, heads, d) call it runs below 32 heads")
    if serving.cudagraph_mode in ("FULL_AND_PIECEWISE", "FULL"):
        notes.append("PIECEWISE graphs (mixed batches) run attention eagerly: they hold none of "
                     "the call's memory")
    return GraphsResult(
        command=command, measured=reason is None, not_measured_reason=reason,
        scenario=scenario_summary(scenario, padded),
        kernel={"name": kernel.name, "label": kernel.label, "version": kernel.version(),
                "sm_count": sm_count},
        op=SPARSE_DECODE, capture_sizes=chosen, capture_sizes_source=source,
        serving={"max_num_seqs": serving.max_num_seqs,
                 "max_cudagraph_capture_size": serving.max_cudagraph_capture_size,
                 "cudagraph_mode": serving.cudagraph_mode,
                 "num_speculative_tokens": serving.num_speculative_tokens},
        environment=environment.capture(), paths=results, notes=notes,
        created=environment.now_utc())
