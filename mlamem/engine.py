"""One rank of an inference engine, emulated in the engine's order, to reproduce runtime OOMs.

The order is vLLM's (gpu_worker.determine_available_memory):
1. cap the process at the target GPU's memory, less the non-torch memory (CUDA context,
   libraries) counted as device-used minus torch-reserved;
2. init: the attention backend's workspace (workspace paths only), the weights, the indexer's
   top-k buffer and the KV pool the step reads;
3. a profile pass at max_num_batched_tokens that allocates the step's activations but skips
   attention, as the engine's profile run does;
4. the KV cache sized as `utilization x total - (init + profile peak + non-torch)`, in whole
   blocks, and allocated;
5. one full step at max_num_batched_tokens through the path under test.
The same code runs on a GPU (`CudaMemory`, in its own process: see `repro`) and on the
allocator model (`SimulatedMemory`). Run as `python -m mlamem.engine REQUEST RESULT` it is one
isolated case: it reads a JSON request and always writes a JSON result.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from mlamem.allocator import round_size
from mlamem.attribution import ExpectedBuffer, attribute, expected_buffers
from mlamem.errors import UserError
from mlamem.inputs import fill_query, make_inputs
from mlamem.kernels import DEFAULT_KERNEL, KERNELS, BufferSpec, SparseDecodeKernel
from mlamem.measure import decoder, local_sm_count
from mlamem.memory import (
    CudaMemory,
    SimulatedMemory,
    is_out_of_memory,
    requested_bytes_from_message,
)
from mlamem.paths import PATHS, decode_call, plan, reserve_workspace, wrapper_allocations
from mlamem.scenario import Scenario

# Verdicts of one case (the `verdict` field of mlamem.repro-oom/1)
FITS = "fits"  # the full step ran; headroom_bytes is what was left under the cap
OOM = "oom"  # an allocation failed: oom_* fields say which, and phase says when
NO_KV_ROOM = "no-kv-room"  # init and profile leave nothing for the KV cache: the engine won't start
ERROR = "error"  # a failure that is not an out-of-memory (failure says what)
CRASHED = "crashed"  # the case's process died without a result (failure says how)
VERDICTS = (FITS, OOM, NO_KV_ROOM, ERROR, CRASHED)
PHASES = ("init", "profile", "kv-cache", "step", "done")


@dataclass(frozen=True)
class Budget:
    """The target GPU and the engine's memory settings for one rank."""

    gpu_memory_bytes: int  # the target GPU's total memory (e.g. an 80 GiB H100)
    utilization: float  # --gpu-memory-utilization
    max_num_batched_tokens: int  # tokens per step; sizes the workspace and the profile pass

    def __post_init__(self) -> None:
        if not 0 < self.utilization <= 1:
            raise UserError(f"--utilization {self.utilization} is outside (0, 1]; "
                            "pass a fraction such as 0.85")
        if self.gpu_memory_bytes <= 0:
            raise UserError("--gpu-memory must be positive; pass a size such as 80GiB")
        if self.max_num_batched_tokens <= 0:
            raise UserError(f"--max-num-batched-tokens {self.max_num_batched_tokens} must be "
                            "> 0; pass e.g. 32768")

    @property
    def requested_bytes(self) -> int:
        """What the engine may use: utilization x total."""
        return int(self.utilization * self.gpu_memory_bytes)


def kv_block_bytes(scenario: Scenario) -> int:
    """Bytes of one KV-cache block across all layers of a rank."""
    return (scenario.serving.block_size * scenario.kv_cache_bytes_per_token_per_layer
            * scenario.model.num_layers)


def kv_cache_bytes(budget: Budget, non_kv_bytes: int, block_bytes: int) -> int:
    """The engine's KV cache: what utilization x total leaves after the rest, in whole blocks."""
    return max((budget.requested_bytes - non_kv_bytes) // block_bytes, 0) * block_bytes


def activation_specs(scenario: Scenario, tokens: int) -> list[BufferSpec]:
    """The step's tensors alive around attention: the profile pass allocates these and no more.

    The residual stream in and out (when the scenario gives hidden_size), the attention input
    q and the layer's attention output, which the engine allocates outside the kernel.
    """
    heads = scenario.heads_per_rank
    specs = [BufferSpec("q", (tokens, heads, scenario.d_qk), torch.bfloat16, "temporary"),
             BufferSpec("attn_output", (tokens, heads, scenario.d_v), torch.bfloat16, "temporary")]
    if scenario.model.hidden_size:
        hidden = (tokens, scenario.model.hidden_size)
        specs[:0] = [BufferSpec("hidden_states", hidden, torch.bfloat16, "temporary"),
                     BufferSpec("residual", hidden, torch.bfloat16, "temporary")]
    return specs


@dataclass
class EngineCase:
    """One path through one emulated rank. Bytes are absolute unless named otherwise."""

    path: str
    max_num_batched_tokens: int
    measured: bool
    verdict: str = ERROR  # one of VERDICTS
    phase: str = "init"  # the phase it reached (PHASES); "done" when the step completed
    torch_limit_bytes: int | None = None  # the cap on torch's reserved memory
    non_torch_bytes: int | None = None  # at KV sizing: measured, or the host setup's model
    weights_bytes: int = 0
    workspace_bytes: int = 0  # reserved at init (workspace paths)
    init_bytes: int | None = None  # everything allocated at init (weights, workspace, inputs)
    profile_peak_bytes: int | None = None  # the profile pass's peak over init
    kv_cache_bytes: int | None = None
    kv_cache_tokens: int | None = None
    step_peak_bytes: int | None = None  # torch reserved peak during the step, absolute
    headroom_bytes: int | None = None  # cap - step peak (fits)
    nvml_step_peak_bytes: int | None = None  # this process's device memory at the step's peak
    oom_requested_bytes: int | None = None  # the allocation that failed
    oom_buffer: str | None = None  # its name (attribution spec), e.g. "o_accum"
    oom_allocated_by: str | None = None  # "wrapper", "kernel", "engine" or "init"
    free_bytes_at_oom: int | None = None  # cap - reserved when it failed
    out_staging_gain_bytes: int | None = None  # more headroom if out were staged (no out=)
    failure: str | None = None  # one line, for oom, error and crashed
    buffers: list[dict] = field(default_factory=list)  # the step's allocations, named

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def emulate(memory: CudaMemory | SimulatedMemory, scenario: Scenario, kernel: SparseDecodeKernel,
            budget: Budget, path: str, *, sm_count: int, seed: int = 0) -> EngineCase:
    """Run one rank through init, profile, KV sizing and a full step; see the module docstring.

    Predicted, the non-torch memory is the `SimulatedMemory`'s host setup (0 B without one).
    """
    case = EngineCase(path=path, max_num_batched_tokens=budget.max_num_batched_tokens,
                      measured=memory.measured, weights_bytes=scenario.parallel.weights_bytes)
    with memory:
        _run(memory, scenario, kernel, budget, case, sm_count=sm_count, seed=seed)
    return case


def non_torch_now(memory) -> int:
    """Non-torch memory now: measured, or modelled from the host setup; 0 B if neither knows."""
    return memory.non_torch_bytes() or 0


def _run(memory, scenario, kernel, budget, case, *, sm_count, seed):
    tokens, path = budget.max_num_batched_tokens, case.path
    capabilities = kernel.capabilities()
    padded_heads = capabilities.padded_heads(scenario.heads_per_rank)
    staged = plan(path, scenario.heads_per_rank, capabilities, kernel.label).staged
    out_spec = next((s for s in kernel.allocations((1, tokens, padded_heads, scenario.d_qk),
                                                   scenario.d_v, sm_count) if s.name == "out"), None)
    if out_spec is not None and not capabilities.takes_out:
        case.out_staging_gain_bytes = round_size(out_spec.nbytes)
    allocating = "weights"
    resident: list[torch.Tensor] = []  # weights and KV cache: alive until the case ends
    before = memory.stats()
    try:
        case.torch_limit_bytes = memory.set_limit(budget.gpu_memory_bytes - non_torch_now(memory))
        # init, in the engine's order: backend workspace, weights, indexer buffer and KV pool
        allocating = "workspace"
        workspace = reserve_workspace(path, kernel, max_tokens=tokens, padded_heads=padded_heads,
                                      d_qk=scenario.d_qk, d_v=scenario.d_v,
                                      topk=scenario.decode_topk, sm_count=sm_count,
                                      device=memory.device)
        case.workspace_bytes = memory.stats().allocated - before.allocated
        allocating = "weights"
        resident.append(torch.empty(case.weights_bytes, dtype=torch.uint8, device=memory.device))
        allocating = "indices and KV pool"
        inputs = make_inputs(scenario, tokens, memory.device, seed, with_query=False)
        case.init_bytes = memory.stats().allocated - before.allocated

        case.phase, allocating = "profile", "activations"
        memory.reset_peaks()
        start = memory.stats().allocated
        activations = allocate_specs(activation_specs(scenario, tokens), memory.device)
        del activations
        case.profile_peak_bytes = memory.stats().peak_allocated - start
        memory.empty_cache()

        case.phase, allocating = "kv-cache", "kv_cache"
        case.non_torch_bytes = non_torch = non_torch_now(memory)
        case.torch_limit_bytes = memory.set_limit(budget.gpu_memory_bytes - non_torch)
        block = kv_block_bytes(scenario)
        case.kv_cache_bytes = kv_cache_bytes(
            budget, case.init_bytes + case.profile_peak_bytes + non_torch, block)
        case.kv_cache_tokens = case.kv_cache_bytes // block * scenario.serving.block_size
        if case.kv_cache_bytes == 0:
            case.verdict = NO_KV_ROOM
            case.failure = (f"no memory left for the KV cache: init {case.init_bytes} B + profile "
                            f"peak {case.profile_peak_bytes} B + non-torch {non_torch} B exceed "
                            f"utilization x total = {budget.requested_bytes} B")
            return
        resident.append(torch.empty(case.kv_cache_bytes, dtype=torch.uint8,
                                    device=memory.device))
    except Exception as exc:
        record_failure(case, exc, memory, before.num_ooms, allocating)
        return

    call = decode_call(decode=decoder(kernel, memory, sm_count), kv_cache=inputs.kv_cache,
                      indices=inputs.indices, sm_scale=scenario.softmax_scale, d_v=scenario.d_v,
                      padded_heads=padded_heads, takes_out=capabilities.takes_out)
    step_specs = activation_specs(scenario, tokens)
    expected = ([ExpectedBuffer(s.name, s.nbytes, "engine") for s in step_specs]
                + expected_buffers(
                    wrapper_allocations(path, tokens, scenario.heads_per_rank, padded_heads,
                                        scenario.d_qk),
                    kernel.allocations((1, tokens, padded_heads, scenario.d_qk), scenario.d_v,
                                       sm_count), staged))

    def step() -> None:
        tensors = allocate_specs(step_specs, memory.device)
        fill_query(tensors["q"], seed)
        out, _ = PATHS[path](tensors["q"], call, workspace)
        tensors["attn_output"].copy_(out)

    watch = run_step(memory, case, expected, step)
    if watch is not None and memory.measured and watch.nvml_peak_bytes is not None:
        case.nvml_step_peak_bytes = watch.nvml_peak_bytes - memory.used_by_others


def run_step(memory, case, expected: list[ExpectedBuffer], body: Callable[[], None]):
    """Run a step under the allocator trace; returns the watch, or None if it failed.

    A failure is classified into `case` (an OOM names the buffer from `expected`); success sets
    the verdict, the step's reserved peak, the headroom under the cap and the named buffers.
    """
    case.phase = "step"
    memory.reset_peaks()
    pre_step, watch = memory.stats(), None
    try:
        with memory.watch() as watch:
            body()
            memory.synchronize()
    except Exception as exc:
        record_failure(case, exc, memory, pre_step.num_ooms, None, watch, expected,
                       pre_step.reserved)
        return None
    after = memory.stats()
    case.verdict, case.phase = FITS, "done"
    case.step_peak_bytes = after.peak_reserved
    case.headroom_bytes = case.torch_limit_bytes - after.peak_reserved
    case.buffers = [dataclasses.asdict(b) for b in attribute(watch.events, expected).buffers]
    return watch


def allocate_specs(specs: list[BufferSpec], device: torch.device) -> dict[str, torch.Tensor]:
    """Empty tensors for `specs`, by name, in order."""
    return {s.name: torch.empty(s.shape, dtype=s.dtype, device=device) for s in specs}


def record_failure(case, exc: Exception, memory, ooms_before: int, allocating: str | None,
                   watch=None, expected: list[ExpectedBuffer] | None = None,
                   reserved_before: int = 0) -> None:
    """Classify a failure: an OOM names the allocation and the free bytes; else an error."""
    first_line = str(exc).splitlines()[0] if str(exc) else ""
    case.failure = f"{type(exc).__name__}: {first_line}"
    if not is_out_of_memory(exc, ooms_before, memory.stats().num_ooms):
        case.verdict = ERROR
        return
    case.verdict = OOM
    if watch is None:  # before the step: the engine's own allocation failed
        case.oom_buffer, case.oom_allocated_by = allocating, "init"
        case.oom_requested_bytes = getattr(exc, "requested_bytes", None) or (
            requested_bytes_from_message(str(exc)))
        return
    requested, reserved = oom_event(watch.events, reserved_before)
    case.oom_requested_bytes = requested or watch.oom_requested_bytes
    if reserved is not None and case.torch_limit_bytes is not None:
        case.free_bytes_at_oom = case.torch_limit_bytes - reserved
    if case.oom_requested_bytes is not None and expected is not None:
        missing = set(attribute(watch.events, expected).missing)
        named = next((e for e in expected if e.name in missing
                      and round_size(e.nbytes) == round_size(case.oom_requested_bytes)), None)
        if named is not None:
            case.oom_buffer, case.oom_allocated_by = named.name, named.allocated_by


def oom_event(events: list[dict], reserved_before: int) -> tuple[int | None, int | None]:
    """(bytes requested, reserved bytes) at the first 'oom' in an allocator trace."""
    reserved = reserved_before
    for event in events:
        if event["action"] == "segment_alloc":
            reserved += event["size"]
        elif event["action"] == "segment_free":
            reserved -= event["size"]
        elif event["action"] == "oom":
            return event["size"], reserved
    return None, None


def run_request(request: dict) -> dict:
    """One case from a JSON request (the subprocess side of `repro`): measured on this GPU."""
    from mlamem import nvml, scenario

    used_before_cuda = nvml.used_by_uuid()  # before this process creates a CUDA context
    chosen = scenario.from_dict(request["scenario"], request.get("source", "request"))
    budget = Budget(**request["budget"])
    kernel = KERNELS[request.get("kernel", DEFAULT_KERNEL)]()
    reason = kernel.unavailable_reason()
    if reason is not None:
        case = EngineCase(path=request.get("path", request.get("variant")), measured=True,
                          max_num_batched_tokens=budget.max_num_batched_tokens,
                          failure=f"cannot measure: {reason}")
        return case.to_dict()
    memory = CudaMemory(used_before_cuda=used_before_cuda)
    if "variant" in request:  # the context-MLA reuse case (mlamem.context_reuse)
        from mlamem.context_reuse import emulate_context

        return emulate_context(memory, chosen, request["variant"], budget.gpu_memory_bytes,
                               budget.utilization).to_dict()
    return emulate(memory, chosen, kernel, budget, request["path"],
                   sm_count=local_sm_count(), seed=request.get("seed", 0)).to_dict()


def main(argv: list[str]) -> int:
    """`python -m mlamem.engine REQUEST.json RESULT.json`: always writes RESULT unless killed."""
    request_path, result_path = argv
    with open(request_path) as handle:
        request = json.load(handle)
    try:
        result = run_request(request)
    except Exception as exc:  # anything unforeseen still becomes a verdict
        result = {"verdict": ERROR, "failure": f"{type(exc).__name__}: {exc}".splitlines()[0]}
    with open(result_path, "w") as handle:
        json.dump(result, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
