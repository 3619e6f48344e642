"""vLLM's rank, for the sparse decode step: one case per decode path.

The skeleton's phases as vLLM runs them (gpu_worker.determine_available_memory):
- init: the attention backend's workspace (workspace paths only), the weights, the indexer's
  top-k buffer and the KV pool the step reads; then what vLLM keeps beyond them: a DSA model's
  shared workspace (the sparse MLA backend's and the indexer's requests) and the MTP drafter's
  buffers (spec/engines/vllm_pass.py `resident_buffers`);
- profile: a pass at max_num_batched_tokens that allocates the step's activations but skips
  attention, as the engine's profile run does (the residual stream held through it), then
  its stages beyond attention, each freed before the next (`profile_stages`: the dense MLP
  layers', the indexer's profile branch or a dense-MLA layer's stand-in, the MoE layer's
  (spec/engines/vllm_moe.py), the drafter's dummy run, the sampler's: spec/engines/vllm_pass.py);
  the fused-MoE workspace is part of the shared workspace placed at init, as vLLM's
  WorkspaceManager keeps one buffer for both (from 0.14.0; before, by the scenario's
  [vllm].engine_version, a per-call transient of the MoE stage: vllm_moe.transient_workspace);
- graph estimate (CUDA graphs on): vLLM 0.33.0's profile_cudagraph_memory: the two largest
  FULL decode graphs captured in a throwaway pool, extrapolated as first + max(second, 1 MiB) x
  (N - 1) from their device-wide growth (mem_get_info; predicted: the model's, the host
  setup's outside-allocator memory of the first capture included, memory.SimulatedMemory);
  set aside from 0.20.0, measured only in 0.18-0.19 and skipped before, by the scenario's
  [vllm].engine_version (spec.engines.vllm.VersionRules.graph_estimate);
- KV sizing: `utilization x total - (init + profile peak + non-torch + graph estimate)`, in
  whole blocks of every layer's MLA cell and, for a DSA model, its indexer's keys (one cache
  group: spec.engines.vllm.kv_block_bytes), its tokens the count vLLM logs
  (`logged_kv_tokens`);
- capture (graphs on): every FULL decode graph, largest first, into one pool that lives on;
- step: one full step at max_num_batched_tokens through the path under test, then its stages
  beyond attention (`stages`: the indexer, the sampler, the drafter).
The graphs hold the attention call only (mlamem/commands/graphs.py), its q a static input buffer; which
sizes vLLM captures, and its estimate, are vLLM's rules (spec/engines/vllm.py), set in the
scenario's `[vllm]` table. The budget's own options are the CUDA graphs (`VLLMBudget`), and
repro-oom searches each path's largest safe max_num_batched_tokens.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from mlamem.engines.base import (
    Budget,
    Knob,
    NoKVRoom,
    PhaseFailed,
    RankMemory,
    allocate_specs,
    non_torch_now,
)
from mlamem.engines.decode_rank import (
    DecodeCase,
    DecodeRank,
    activation_specs,
)
from mlamem.runtime.graph_capture import capture_all
from mlamem.runtime.non_torch import graph_steps_note
from mlamem.spec.engines.rank_buffers import Stage
from mlamem.spec.engines.vllm import (
    SPEC,
    graph_estimate_rule,
    kv_block_bytes,
    logged_kv_tokens,
    sizes_to_capture,
    vllm_estimate,
)
from mlamem.spec.engines.vllm_moe import dense_mlp_stage, fused_moe_workspace, moe_stage
from mlamem.spec.engines.vllm_pass import (
    after_kv_buffers,
    attention_locals,
    profile_stages,
    resident_buffers,
    step_attention_buffers,
    step_stages,
)
from mlamem.spec.units import format_bytes


def kv_cache_bytes(budget: Budget, non_kv_bytes: int, block_bytes: int) -> int:
    """The engine's KV cache: what utilization x total leaves after the rest, in whole blocks."""
    return max((budget.requested_bytes - non_kv_bytes) // block_bytes, 0) * block_bytes


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


@dataclass(kw_only=True)
class VLLMCase(DecodeCase):
    """One decode path through vLLM's rank: the shared figures and vLLM's own."""

    # CUDA graphs (repro-oom --cuda-graphs on; absent from results without them)
    graph_estimate_bytes: int | None = None  # what vLLM set aside before KV sizing
    graph_estimate_source: str | None = None  # "device" (mem_get_info) or "allocator"
    # measured: the other processes' use as the estimate read the device-wide figure (after its
    # captures), NVML's device-wide used memory minus this process's
    graph_estimate_other_processes_bytes: int | None = None
    graph_kv_tokens_lost: int | None = None  # KV tokens the estimate took
    graph_captures: int | None = None  # graphs captured after the KV cache
    graph_pool_bytes: int | None = None  # the pool they took (allocator reserved growth)
    graph_device_bytes: int | None = None  # the device-wide growth (measured, or modelled)
    graph_estimate_error_bytes: int | None = None  # estimate - what they took, same source
    # the version's rule where it sets no estimate aside ("opt-in": measured, not set aside;
    # "none": not measured, 0); None: set aside, as vLLM 0.20.0 and later (absent from results)
    graph_estimate_rule: str | None = None

    def to_dict(self) -> dict:
        data = super().to_dict()
        if self.graph_estimate_source is None:  # graphs off: the case as it always read
            for name in [n for n in data if n.startswith("graph_")]:
                del data[name]
        elif self.graph_estimate_rule is None:
            del data["graph_estimate_rule"]
        return data


class VLLM(DecodeRank):
    """vLLM serving the scenario's sparse decode; see the module docstring."""

    name, spec, view = SPEC.name, SPEC, SPEC.view
    case_type = VLLMCase
    budget_type = VLLMBudget
    searched_knob = "max_num_batched_tokens"
    captures_graphs = True
    budget: VLLMBudget

    @classmethod
    def knob_for_pool(cls, rank: RankMemory, pool_bytes: int) -> Knob:
        """KV = utilization x total - (init + profile peak + non-torch)."""
        used = pool_bytes + rank.init_bytes + rank.activation_bytes + rank.non_torch_bytes
        return Knob(cls.name, "gpu_memory_utilization", used / rank.total_bytes,
                    "the GPU's total memory")

    @classmethod
    def check_graphs(cls, scenario, budget: VLLMBudget) -> None:
        """The capture sizes (given, else the scenario's FULL decode graphs) are within 1 to
        max_num_batched_tokens."""
        sizes_to_capture(scenario, budget.capture_sizes)

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
            if c.get("graph_estimate_rule"):
                line += (f" (the engine version's rule {c['graph_estimate_rule']!r}: the KV cache "
                         "is sized without it)")
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
        if any(c.get("graph_estimate_source") == "device" and not c["measured"] for c in cases):
            lines.append("CUDA graphs, predicted: the device-wide figures are the model's "
                         "reserved memory plus the host's non-torch memory, the first capture's "
                         "outside the allocator and the driver's 2 MiB steps at 9, 36 and 41 "
                         "live graphs included (mlamem/non_torch.toml)")
        if note := graph_steps_note(max((c.get("graph_captures") or 0) for c in cases)):
            lines.append(note)
        return lines

    def init(self) -> None:
        """The shared init, then what vLLM keeps beyond it: the shared workspace, less the
        path's own workspace it holds, and the drafter's buffers
        (spec.engines.vllm_pass.resident_buffers), counted in init_bytes."""
        super().init()
        tokens = self.budget.max_num_batched_tokens
        moe = fused_moe_workspace(self.scenario, tokens)
        resident = resident_buffers(self.scenario, tokens, reserved=self.case.workspace_bytes,
                                    other_requests=(moe.nbytes,) if moe else ())
        if resident is None:
            return
        start = self.memory.stats().allocated
        self.resident.extend(self.allocate_stage(resident))
        self.case.init_bytes += self.memory.stats().allocated - start

    def stages(self, tokens: int) -> list[Stage]:
        """A step beyond attention, in the engine's order: each layer's dense MLP (the first
        layers) or indexer and MoE; after the model the sampler (the rejection sampler where
        drafts are verified), then the drafter (spec.engines.vllm_moe, spec.engines.vllm_pass
        .step_stages)."""
        return self._in_order(step_stages(self.scenario, tokens), tokens)

    def profile_stages(self, tokens: int) -> list[Stage]:
        """The profile pass beyond attention, which differs from the step: each layer's ops on
        `attn_metadata is None` (the indexer's profile branch, a dense-MLA layer's stand-in),
        the dense MLP and MoE layers, then the drafter's dummy run and `_dummy_sampler_run`
        (spec.engines.vllm_pass.profile_stages)."""
        return self.with_attention_locals(
            self._in_order(profile_stages(self.scenario, tokens), tokens), tokens)

    def _in_order(self, passes: list[Stage], tokens: int) -> list[Stage]:
        """The layers' stages (the dense MLP, the attention's own, the MoE), then the rest."""
        layer = {"indexer", "attention"}
        stages = [dense_mlp_stage(self.scenario, tokens),
                  *(s for s in passes if s.name in layer), moe_stage(self.scenario, tokens),
                  *(s for s in passes if s.name not in layer)]
        return [s for s in stages if s is not None]

    def attention_live(self, tokens: int) -> list[Stage]:
        """A DSA layer's locals through the kernel's call, and the mixed batch's global top-k
        slots (spec.engines.vllm_pass.attention_locals, step_attention_buffers)."""
        stages = (attention_locals(self.scenario, tokens),
                  step_attention_buffers(self.scenario, tokens))
        return [s for s in stages if s is not None]

    def with_attention_locals(self, stages: list[Stage], tokens: int) -> list[Stage]:
        """The profile's attention-layer stage (the indexer's profile branch) with the layer's
        locals beside it, as they live through it (spec.engines.vllm_pass.attention_locals)."""
        local = attention_locals(self.scenario, tokens)
        if local is None:
            return stages
        return [Stage(s.name, local.buffers + s.buffers) if s.name == "indexer" else s
                for s in stages]

    def profile(self) -> None:
        """The step's activations allocated as the pass computes them, then the stages on the
        residual stream alone (q and the attention's output are gone after the layer's
        attention), each freed before the next."""
        self.allocating = "activations"
        device, tokens = self.memory.device, self.budget.max_num_batched_tokens
        held = allocate_specs(activation_specs(self.scenario, tokens), device)
        del held["q"], held["attn_output"]
        self.run_stages(self.profile_stages(tokens))
        del held

    def estimate_graphs(self) -> None:
        if not self.budget.cuda_graphs:
            return
        memory, case = self.memory, self.case
        self.graph_sizes = sizes_to_capture(self.scenario, self.budget.capture_sizes)
        self.allocating = "graph input (static q)"
        self.graph_call = self.make_graph_call(max(self.graph_sizes))
        rule = graph_estimate_rule(self.scenario)  # the version's (spec VersionRules)
        case.graph_estimate_rule = None if rule == "applied" else rule
        if rule == "none":  # vLLM <= 0.17: no profile_cudagraph_memory before the KV cache
            device = memory.device_used_bytes() is not None
            case.graph_estimate_source = "device" if device else "allocator"
            case.graph_estimate_bytes = 0
            return
        with memory.graphs() as graphs:  # a throwaway pool: gone before the KV cache
            captures, failure = capture_all(memory, graphs, self.graph_call,
                                            self.graph_sizes[:2])
        if failure is not None:
            raise PhaseFailed(failure)
        memory.empty_cache()
        # device-wide, as vLLM reads it, wherever the memory knows it (measured, or modelled
        # from the host setup); the allocator's growth only where nothing outside it is known
        device = memory.device_used_bytes() is not None
        case.graph_estimate_source = "device" if device else "allocator"
        if memory.measured:
            case.graph_estimate_other_processes_bytes = memory.other_processes_bytes()
        samples = [c.device_growth_bytes if device else c.pool_growth_bytes for c in captures]
        case.graph_estimate_bytes = vllm_estimate(case.graph_estimate_source, samples, 0,
                                                  len(self.graph_sizes)).estimate_bytes

    def capture_graphs(self) -> None:
        """After the KV cache: the metadata builders' buffers vLLM's initialize_kv_cache
        allocates (spec.engines.vllm_pass.after_kv_buffers), then, graphs on, the captures."""
        kept = after_kv_buffers(self.scenario, self.budget.max_num_batched_tokens)
        if kept is not None:
            self.resident.extend(self.allocate_stage(kept))
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
        set_aside = case.graph_estimate_bytes if case.graph_estimate_rule is None else 0
        case.kv_cache_bytes = kv_cache_bytes(budget, non_kv + (set_aside or 0), block)
        case.kv_cache_tokens = self.logged_tokens(case.kv_cache_bytes // block)
        if case.graph_estimate_bytes is not None:
            without = kv_cache_bytes(budget, non_kv, block) // block
            case.graph_kv_tokens_lost = self.logged_tokens(without) - case.kv_cache_tokens
        if case.kv_cache_bytes == 0:
            raise NoKVRoom(f"no memory left for the KV cache: init {case.init_bytes} B + profile "
                           f"peak {case.profile_peak_bytes} B + non-torch {case.non_torch_bytes} "
                           f"B exceed utilization x total = {budget.requested_bytes} B")
        return case.kv_cache_bytes

    def logged_tokens(self, blocks: int) -> int:
        """The KV tokens vLLM logs for `blocks` blocks (spec.engines.vllm.logged_kv_tokens)."""
        serving = self.scenario.serving
        return logged_kv_tokens(blocks, serving.block_size, serving.max_model_len)


def _signed(value: int) -> str:
    return ("+" if value >= 0 else "-") + format_bytes(abs(value))


ENGINE = VLLM
