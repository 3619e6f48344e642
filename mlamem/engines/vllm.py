"""vLLM's rank, for the sparse decode step: one case per decode path.

The skeleton's phases as vLLM runs them (gpu_worker.determine_available_memory):
- init: the attention backend's workspace (workspace paths only), the weights, the indexer's
  top-k buffer and the KV pool the step reads;
- profile: a pass at max_num_batched_tokens that allocates the step's activations but skips
  attention, as the engine's profile run does;
- graph estimate (CUDA graphs on): vLLM 0.33.0's profile_cudagraph_memory: the two largest
  FULL decode graphs captured in a throwaway pool, extrapolated as first + max(second, 1 MiB) x
  (N - 1) from their device-wide growth (mem_get_info; predicted: the allocator's);
- KV sizing: `utilization x total - (init + profile peak + non-torch + graph estimate)`, in
  whole blocks;
- capture (graphs on): every FULL decode graph, largest first, into one pool that lives on;
- step: one full step at max_num_batched_tokens through the path under test.
The graphs hold the attention call only (mlamem/graphs.py), its q a static input buffer; which
sizes vLLM captures, and its estimate, are vLLM's rules (engines/vllm_rules.py), set in the
scenario's `[vllm]` table. The budget's own options are the CUDA graphs (`VLLMBudget`), and
repro-oom searches each path's largest safe max_num_batched_tokens.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from mlamem.allocator import round_size
from mlamem.attribution import ExpectedBuffer, expected_buffers
from mlamem.engines.base import (
    Budget,
    Case,
    Column,
    Engine,
    NoKVRoom,
    PhaseFailed,
    Step,
    Verdict,
    View,
    allocate_specs,
    non_torch_now,
)
from mlamem.engines.vllm_rules import sizes_to_capture, vllm_estimate
from mlamem.graph_capture import CallGraphs, capture_all
from mlamem.inputs import fill_query, make_inputs
from mlamem.kernel_api import OpInputs
from mlamem.kernels import BufferSpec
from mlamem.measure import runner
from mlamem.operations import SPARSE_DECODE, problem_for
from mlamem.paths import PATHS, KernelCall, plan, reserve_workspace, wrapper_allocations
from mlamem.scenario import Scenario
from mlamem.units import format_bytes, gib


@dataclass(frozen=True)
class VLLMBudget(Budget):
    """The budget with vLLM's options: its CUDA graphs."""

    cuda_graphs: bool = False  # the engine estimates, then captures, its CUDA graphs
    capture_sizes: tuple[int, ...] | None = None  # graphs on: None is the scenario's list

    def __post_init__(self) -> None:
        if self.capture_sizes is not None:  # a JSON request gives a list
            object.__setattr__(self, "capture_sizes", tuple(self.capture_sizes))
        super().__post_init__()

    def to_dict(self) -> dict:
        """The CUDA-graph fields only when on, so a result with graphs off reads as it did
        before they existed."""
        data = dataclasses.asdict(self)
        if not self.cuda_graphs:
            del data["cuda_graphs"], data["capture_sizes"]
        return data


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


@dataclass(kw_only=True)
class VLLMCase(Case):
    """One decode path through vLLM's rank: the shared figures and vLLM's own."""

    key_field = "path"

    path: str
    max_num_batched_tokens: int
    workspace_bytes: int = 0  # reserved at init (workspace paths)
    init_bytes: int | None = None  # everything allocated at init (weights, workspace, inputs)
    kv_cache_bytes: int | None = None
    kv_cache_tokens: int | None = None
    out_staging_gain_bytes: int | None = None  # more headroom if out were staged (no out=)
    # CUDA graphs (repro-oom --cuda-graphs on; absent from results without them)
    graph_estimate_bytes: int | None = None  # what vLLM set aside before KV sizing
    graph_estimate_source: str | None = None  # "device" (mem_get_info) or "allocator"
    graph_kv_tokens_lost: int | None = None  # KV tokens the estimate took
    graph_captures: int | None = None  # graphs captured after the KV cache
    graph_pool_bytes: int | None = None  # the pool they took (allocator reserved growth)
    graph_device_bytes: int | None = None  # the device-wide growth (measured)
    graph_estimate_error_bytes: int | None = None  # estimate - what they took, same source

    def to_dict(self) -> dict:
        data = super().to_dict()
        if self.graph_estimate_source is None:  # graphs off: the case as it always read
            for name in [n for n in data if n.startswith("graph_")]:
                del data[name]
        return data


class VLLM(Engine):
    """vLLM serving the scenario's sparse decode; see the module docstring."""

    name = "vllm"
    case_type = VLLMCase
    budget_type = VLLMBudget
    searched_knob = "max_num_batched_tokens"
    captures_graphs = True
    budget: VLLMBudget

    @classmethod
    def case_keys(cls, paths: list[str]) -> list[str]:
        return list(paths)

    @classmethod
    def new_case(cls, key: str, budget: dict, *, measured: bool, **fields) -> VLLMCase:
        return VLLMCase(path=key, max_num_batched_tokens=budget["max_num_batched_tokens"],
                        measured=measured, **fields)

    @classmethod
    def notes(cls, cases: list[dict]) -> list[str]:
        """With CUDA graphs: per path, the estimate, the KV tokens it took, the pool the
        captures took and the estimate's error."""
        lines = []
        for c in cases:
            if c.get("graph_estimate_bytes") is None:
                continue
            line = (f"{c['path']}: CUDA graphs: vLLM's estimate {format_bytes(c['graph_estimate_bytes'])}"
                    f" ({c['graph_estimate_source']}) took {c['graph_kv_tokens_lost']} KV tokens")
            if c.get("graph_pool_bytes") is not None:
                source = "device" if c["graph_estimate_source"] == "device" else "pool"
                taken = (c["graph_device_bytes"] if source == "device" else c["graph_pool_bytes"])
                line += (f"; {c['graph_captures']} captures took a {format_bytes(c['graph_pool_bytes'])}"
                         f" pool" + (f" ({format_bytes(c['graph_device_bytes'])} on the device)"
                                     if c.get("graph_device_bytes") is not None else "")
                         + f"; the estimate's error {_signed(c['graph_estimate_error_bytes'])}"
                         + (f" ({100 * c['graph_estimate_error_bytes'] / taken:+.1f}% of the "
                            f"{source})" if taken else ""))
            lines.append(line)
        return lines

    def init(self) -> None:
        scenario, kernel, memory, case = self.scenario, self.kernel, self.memory, self.case
        tokens = self.budget.max_num_batched_tokens
        capabilities = kernel.capabilities()
        self.padded_heads = capabilities.padded_heads(scenario.heads_per_rank)
        problem = problem_for(scenario, SPARSE_DECODE, tokens, self.padded_heads)
        out_spec = next((s for s in kernel.allocations(problem, self.sm_count)
                         if s.name == "out"), None)
        if out_spec is not None and not capabilities.takes_out:
            case.out_staging_gain_bytes = round_size(out_spec.nbytes)
        start = memory.stats().allocated
        self.allocating = "workspace"
        self.workspace = reserve_workspace(case.path, kernel, max_tokens=tokens,
                                           padded_heads=self.padded_heads, d_qk=scenario.d_qk,
                                           d_v=scenario.d_v, topk=scenario.decode_topk,
                                           sm_count=self.sm_count, device=memory.device)
        case.workspace_bytes = memory.stats().allocated - start
        self.allocating = "weights"
        self.resident.append(torch.empty(case.weights_bytes, dtype=torch.uint8,
                                         device=memory.device))
        self.allocating = "indices and KV pool"
        self.inputs = make_inputs(scenario, tokens, memory.device, self.seed, with_query=False)
        case.init_bytes = memory.stats().allocated - start

    def profile(self) -> None:
        self.allocating = "activations"
        allocate_specs(activation_specs(self.scenario, self.budget.max_num_batched_tokens),
                       self.memory.device)

    def estimate_graphs(self) -> None:
        if not self.budget.cuda_graphs:
            return
        memory, case = self.memory, self.case
        self.graph_sizes = sizes_to_capture(self.scenario, self.budget.capture_sizes)
        self.allocating = "graph input (static q)"
        self.graph_call = self._graph_call()
        with memory.graphs() as graphs:  # a throwaway pool: gone before the KV cache
            captures, failure = capture_all(memory, graphs, self.graph_call,
                                            self.graph_sizes[:2])
        if failure is not None:
            raise PhaseFailed(failure)
        memory.empty_cache()
        case.graph_estimate_source = "device" if memory.measured else "allocator"
        samples = [c.device_growth_bytes if memory.measured else c.pool_growth_bytes
                   for c in captures]
        case.graph_estimate_bytes = vllm_estimate(case.graph_estimate_source, samples, 0,
                                                  len(self.graph_sizes)).estimate_bytes

    def _graph_call(self) -> CallGraphs:
        """The attention call the graphs capture: q from a static buffer of the largest
        capture's rows, the step's KV pool and indices, the path's workspace."""
        scenario = self.scenario
        q_all = torch.empty((max(self.graph_sizes), scenario.heads_per_rank, scenario.d_qk),
                            dtype=torch.bfloat16, device=self.memory.device)
        fill_query(q_all, self.seed)
        self.resident.append(q_all)
        inputs = OpInputs(kv=self.inputs.kv_cache, indices=self.inputs.indices)
        return CallGraphs(scenario, self.kernel, self.case.path, self.sm_count, q_all, inputs,
                          self.workspace)

    def capture_graphs(self) -> None:
        if not self.budget.cuda_graphs:
            return
        memory, case = self.memory, self.case
        graphs = self.contexts.enter_context(memory.graphs())  # live until the case ends
        start, device_start = memory.stats(), memory.device_used_bytes()
        captures, failure = capture_all(memory, graphs, self.graph_call, self.graph_sizes)
        case.graph_captures = len(captures) - (failure is not None)
        if failure is not None:
            raise PhaseFailed(failure)
        case.graph_pool_bytes = memory.stats().reserved - start.reserved
        device_end = memory.device_used_bytes()
        if device_end is not None and device_start is not None:
            case.graph_device_bytes = device_end - device_start
        taken = (case.graph_device_bytes if case.graph_estimate_source == "device"
                 else case.graph_pool_bytes)
        case.graph_estimate_error_bytes = case.graph_estimate_bytes - taken
        # what graph instantiation took outside the allocator is gone from the device
        case.torch_limit_bytes = memory.set_limit(self.budget.gpu_memory_bytes
                                                  - non_torch_now(memory))

    def size_kv_cache(self) -> int:
        case, budget = self.case, self.budget
        block = kv_block_bytes(self.scenario)
        non_kv = case.init_bytes + case.profile_peak_bytes + case.non_torch_bytes
        case.kv_cache_bytes = kv_cache_bytes(budget, non_kv + (case.graph_estimate_bytes or 0),
                                             block)
        case.kv_cache_tokens = case.kv_cache_bytes // block * self.scenario.serving.block_size
        if case.graph_estimate_bytes is not None:
            without = kv_cache_bytes(budget, non_kv, block) // block
            case.graph_kv_tokens_lost = (without * self.scenario.serving.block_size
                                         - case.kv_cache_tokens)
        if case.kv_cache_bytes == 0:
            raise NoKVRoom(f"no memory left for the KV cache: init {case.init_bytes} B + profile "
                           f"peak {case.profile_peak_bytes} B + non-torch {case.non_torch_bytes} "
                           f"B exceed utilization x total = {budget.requested_bytes} B")
        return case.kv_cache_bytes

    def step(self) -> Step:
        scenario, kernel, memory, path = self.scenario, self.kernel, self.memory, self.case.path
        tokens = self.budget.max_num_batched_tokens
        capabilities = kernel.capabilities()
        staged = plan(path, scenario.heads_per_rank, capabilities, kernel.label).staged
        problem = problem_for(scenario, SPARSE_DECODE, tokens, self.padded_heads)
        inputs = OpInputs(kv=self.inputs.kv_cache, indices=self.inputs.indices)
        call = KernelCall(run=runner(kernel, memory, self.sm_count, problem, inputs),
                          op=SPARSE_DECODE, padded_heads=self.padded_heads,
                          takes_out=capabilities.takes_out)
        step_specs = activation_specs(scenario, tokens)
        expected = ([ExpectedBuffer(s.name, s.nbytes, "engine") for s in step_specs]
                    + expected_buffers(
                        wrapper_allocations(path, tokens, scenario.heads_per_rank,
                                            self.padded_heads, scenario.d_qk),
                        kernel.allocations(problem, self.sm_count), staged))
        workspace, seed = self.workspace, self.seed

        def body() -> None:
            tensors = allocate_specs(step_specs, memory.device)
            fill_query(tensors["q"], seed)
            out, _ = PATHS[path](tensors["q"], call, workspace)
            tensors["attn_output"].copy_(out)

        return Step(body, expected)


def _signed(value: int) -> str:
    return ("+" if value >= 0 else "-") + format_bytes(abs(value))


def _gib(value: int | None) -> str:
    return "n/a" if value is None else f"{gib(value):.3f}"


def _failed_alloc(case: dict) -> str:
    if case.get("oom_requested_bytes") is None:
        return ""
    return f"{case.get('oom_buffer') or '?'} {_gib(case['oom_requested_bytes'])}"


def _kv(case: dict) -> str:
    if case.get("kv_cache_bytes") is None:
        return "n/a"
    return f"{gib(case['kv_cache_bytes']):.3f} GiB ({case['kv_cache_tokens']} tokens)"


def _safe(case: dict) -> str:
    tokens = case.get("max_safe_tokens")
    return "n/a" if tokens is None else ("none" if tokens == 0 else str(tokens))


def _gain(case: dict) -> str:
    gain = case.get("out_staging_gain_bytes")
    return "-" if gain is None else f"+{gib(gain):.3f}"


def _budget_segments(case: dict) -> list[tuple[str, int, str]]:
    """(label, bytes, color key) from 0 up to the cap: what the engine placed before the step."""
    init = case.get("init_bytes")
    if init is None:
        return []
    weights, workspace = case.get("weights_bytes") or 0, case.get("workspace_bytes") or 0
    kv = case.get("kv_cache_bytes") or 0
    segments = [("weights", weights, "weights")]
    if workspace:
        segments.append(("workspace", workspace, "workspace"))
    segments.append(("rest of init", init - weights - workspace, "init_rest"))
    segments.append(("KV cache", kv, "kv_cache"))
    if case.get("torch_limit_bytes") is not None:
        segments.append(("free under the cap", case["torch_limit_bytes"] - init - kv, "free"))
    return segments


def step_need_bytes(case: dict) -> int | None:
    """What the full step needed on top of init and the KV cache (OOM: at least this much)."""
    base = (case.get("init_bytes") or 0) + (case.get("kv_cache_bytes") or 0)
    if case["verdict"] == "fits" and case.get("step_peak_bytes") is not None:
        return case["step_peak_bytes"] - base
    if case["verdict"] == "oom" and case.get("free_bytes_at_oom") is not None and \
            case.get("oom_requested_bytes") is not None and case["phase"] == "step":
        reserved = case["torch_limit_bytes"] - case["free_bytes_at_oom"]
        return reserved - base + case["oom_requested_bytes"]
    return None


def _budget_rule(budget: dict, cases: list[dict]) -> str:
    graphs = " + CUDA-graph estimate" if budget.get("cuda_graphs") else ""
    return (f"KV cache rule (vLLM's): utilization {budget['utilization']} x total - (init + "
            f"profile peak + non-torch{graphs}), in whole blocks, after a profile pass that "
            "skips attention")


VLLM.view = View(
    heading="Runtime OOM reproduction",
    cases_named="--paths",
    table_title="{scenario}{predicted}; GiB",
    table_columns=(
        Column("failed\nalloc", _failed_alloc, name=True),
        Column("free at\nOOM", lambda c: _gib(c.get("free_bytes_at_oom"))
               if c["verdict"] == Verdict.OOM else ""),
        Column("KV\ncache", lambda c: _gib(c.get("kv_cache_bytes"))),
        Column("head-\nroom", lambda c: _gib(c.get("headroom_bytes"))
               if c["verdict"] == Verdict.FITS else ""),
        Column("+if out\nstaged", _gain),
        Column("max\nsafe T", _safe)),
    markdown_columns=(
        Column("KV cache", _kv),
        Column("headroom", lambda c: f"{_gib(c.get('headroom_bytes'))} GiB"
               if c["verdict"] == Verdict.FITS else "-"),
        Column("+ if out staged", lambda c: _gain(c) + (
            " GiB" if c.get("out_staging_gain_bytes") is not None else "")),
        Column("largest safe max_num_batched_tokens", _safe)),
    row_name=lambda c: c["path"],
    case_label=lambda c: f"{c['path']} path",
    verdict_in_notes=lambda c: (c["verdict"] not in (Verdict.FITS, Verdict.OOM)
                                or c["verdict"] == Verdict.OOM
                                and c.get("oom_requested_bytes") is None),
    budget_rule=_budget_rule,
    budget_segments=_budget_segments,
    step_need=step_need_bytes)

ENGINE = VLLM
