"""`mlamem graphs`: what one attention call costs in a CUDA-graph pool across an engine's
capture list, measured or predicted, beside the engine's own estimate of it.

For one path, the call is captured at every size of the capture list, largest first, into one
shared private pool, as vLLM 0.33.0 captures its FULL decode graphs. Before each capture the
call runs once eagerly (vLLM's warm-up; measured: the reference a replay must equal bit for
bit); `torch.cuda.graph` then empties the cache and captures. A capture's outputs are kept only
as weak references, as vLLM keeps them (`weak_ref_tensors`): the blocks go back to the pool
and the next capture reuses them, so the pool ends about as large as the largest capture.
Per capture: the pool's growth (allocator reserved, and the device-wide growth vLLM reads
with `mem_get_info`; predicted, the model's, with the target GPU's record's memory outside the
allocator: mlamem/non_torch.toml), the peak inside the capture and what stays allocated.

vLLM's estimate (v1/worker/gpu/cudagraph_utils.py, profile_cudagraph_memory and
_extrapolate_full_graph_memory): first FULL capture + max(second, 1 MiB) x (N - 1), from
device-wide samples taken around each `torch.cuda.graph` after its warm-up. The first two
captures here are the same two, in a fresh pool, so the rule is applied to them.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence

from mlamem.commands.profile import scenario_summary
from mlamem.operations import padded_heads_for
from mlamem.results.graphs import GraphPath, GraphsFile
from mlamem.runtime import environment
from mlamem.runtime.graph_capture import (  # noqa: F401 (re-exported: the capture lives in the runtime)
    GRAPH_RNG_STATE,
    CallGraphs,
    Capture,
    capture_all,
    capture_one,
)
from mlamem.runtime.paths import check_paths, plan
from mlamem.spec.engines.vllm import (  # noqa: F401 (re-exported: vLLM's capture rules)
    DEFAULT_MAX_GRAPH_SIZE,
    FULL_MODES,
    MIN_PER_GRAPH_BYTES,
    Estimate,
    capture_list_source,
    capture_sizes,
    check_capture_sizes,
    full_decode_sizes,
    request_counts,
    settings,
    sizes_to_capture,
    vllm_estimate,
)
from mlamem.spec.kernel_api import SPARSE_DECODE
from mlamem.spec.scenario import Scenario

SCHEMA = "mlamem.graphs/1"


# Measuring


def measure_path(memory, scenario: Scenario, kernel, path: str, sizes: Sequence[int], *,
                 sm_count: int, seed: int = 0,
                 on_capture: Callable[[Capture], None] | None = None) -> GraphPath:
    """Capture `path`'s call at every size (largest first) into one pool; see the module."""
    from mlamem.runtime.measure import without_record  # torch: a reader of saved results needs none

    capabilities = kernel.capabilities(SPARSE_DECODE)
    staged = plan(path, scenario.heads_per_rank, capabilities, kernel.label).staged
    with memory:
        call = CallGraphs.make(memory, scenario, kernel, path, max(sizes), sm_count=sm_count,
                               seed=seed)
        memory.empty_cache()
        start, device_start = memory.stats(), memory.device_used_bytes()
        with memory.graphs() as graphs:
            captures, _ = capture_all(memory, graphs, call, sizes, on_capture)
            end, device_end = memory.stats(), memory.device_used_bytes()
        del call
    figures = {"path": path, "staged": list(staged),
               "captures": [without_record(c) for c in captures]}
    failed = next((c for c in captures if c.failure is not None), None)
    if failed is not None:
        return _graph_path({**figures, "failure": f"T={failed.tokens}: {failed.failure}"})
    pool = end.reserved - start.reserved
    device = (None if device_end is None or device_start is None
              else device_end - device_start)
    return _graph_path({
        **figures, "pool_bytes": pool, "held_bytes": end.allocated - start.allocated,
        "device_bytes": device,
        "unexplained_device_bytes": None if device is None else device - pool,
        "estimates": [dataclasses.asdict(e) for e in estimates(captures, pool, device)]})


def _graph_path(figures: dict) -> GraphPath:
    """One path's figures as its model; those a failed path lacks are null (estimates: none)."""
    empty = {"pool_bytes": None, "held_bytes": None, "device_bytes": None,
             "unexplained_device_bytes": None, "estimates": [], "failure": None}
    return GraphPath.model_validate({**empty, **figures})


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


def _target_model(scenario: Scenario, kernel_name: str):
    """The allocator model with the scenario's GPU (--gpu) as the physical device: its own
    non-torch record, else the nearest one, named (`host_setup`, as repro-oom predicts)."""
    from mlamem.commands.repro import host_setup  # torch
    from mlamem.runtime.memory import SimulatedMemory

    return SimulatedMemory(non_torch=host_setup(kernel_name, predict=True,
                                                target_bytes=scenario.gpu.memory_bytes,
                                                target_gpu=scenario.gpu.name))


def run_graphs(scenario: Scenario, paths: Sequence[str], *, command: str, kernel=None,
               sizes: Sequence[int] | None = None, predict: bool = False,
               on_capture: Callable[[str, Capture], None] | None = None) -> GraphsFile:
    """Measure (or predict, without a GPU or with `predict`) every path over the capture list:
    the scenario's FULL decode graphs unless `sizes` is given."""
    from mlamem.kernels import DEFAULT_KERNEL, load_kernel
    from mlamem.runtime.measure import local_sm_count
    from mlamem.runtime.memory import CudaMemory

    kernel = kernel or load_kernel(DEFAULT_KERNEL)()
    capabilities = kernel.capabilities(SPARSE_DECODE)
    check_paths(paths, capabilities, kernel.label)
    serving = settings(scenario)  # vLLM's [vllm] table
    chosen = sizes_to_capture(scenario, sizes)
    source = capture_list_source(scenario) if sizes is None else "--capture-sizes"
    reason = "--predict was given" if predict else kernel.unavailable_reason()
    sm_count = local_sm_count() if reason is None else scenario.gpu.sm_count
    # predicted: one model for the process, as measured: what the first path's launches and
    # first capture load outside the allocator, a later path finds loaded
    model = None if reason is None else _target_model(scenario, kernel.name)
    measured_paths = []
    for path in paths:
        memory = CudaMemory() if model is None else model
        measured_paths.append(measure_path(
            memory, scenario, kernel, path, chosen, sm_count=sm_count,
            on_capture=None if on_capture is None else functools.partial(on_capture, path)))
    padded = padded_heads_for(kernel, scenario)
    notes = ["each capture's outputs are released after it (vLLM keeps weak references), "
             "so later captures reuse their blocks",
             "vLLM's estimate: first FULL capture + max(second, 1 MiB) x (N - 1), from the "
             "device-wide growth of the first two captures (mem_get_info); the allocator line "
             "applies the same rule to the allocator's reserved growth"]
    if model is not None:
        notes.append(f"device growth predicted as the model's reserved memory plus the target "
                     f"GPU's non-torch memory, first launches' modules and the process's first "
                     f"capture included: {model.non_torch.describe()}; not modelled: the 2 MiB "
                     "steps the device takes at some later captures, which leave those "
                     "captures' device growth, each path's device growth and vLLM's device "
                     "estimate's error apart from a measured run (docs/graphs.md)")
    if scenario.heads_per_rank >= 32:
        notes.append(f"{scenario.heads_per_rank} heads per rank: vLLM's FlashMLA sparse backend "
                     "runs such a decode as (requests, 1 + k, heads, d); this captures the "
                     "(1, T, heads, d) call it runs below 32 heads")
    if serving.cudagraph_mode in ("FULL_AND_PIECEWISE", "FULL"):
        notes.append("PIECEWISE graphs (mixed batches) run attention eagerly: they hold none of "
                     "the call's memory")
    return GraphsFile.model_validate({
        "command": command, "measured": reason is None, "not_measured_reason": reason,
        "scenario": scenario_summary(scenario, padded),
        "kernel": {"name": kernel.name, "label": kernel.label, "version": kernel.version(),
                   "sm_count": sm_count},
        "op": SPARSE_DECODE, "capture_sizes": list(chosen), "capture_sizes_source": source,
        "serving": {"max_num_seqs": serving.max_num_seqs,
                    "max_cudagraph_capture_size": serving.max_cudagraph_capture_size,
                    "cudagraph_mode": serving.cudagraph_mode,
                    "num_speculative_tokens": serving.num_speculative_tokens},
        "environment": environment.capture().model_dump(), "paths": measured_paths,
        "notes": notes, "schema": SCHEMA, "created": environment.now_utc()})
