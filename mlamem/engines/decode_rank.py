"""The rank both token-budget engines run for the sparse decode step (vLLM's and SGLang's):
one case per decode path, the same init and the same step, each engine sizing its KV cache its
own way.

- init: the attention backend's workspace (workspace paths only), the weights, the indexer's
  top-k buffer and the KV pool the step reads;
- step: one full step at the budget's max_num_batched_tokens through the path under test: the
  residual stream, q and the attention output around the kernel call (`activation_specs`), then
  the engine's stages beyond attention (`stages`: the MoE layer, the sampler, ...), each
  allocated and freed in turn (spec/engines/rank_buffers.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mlamem.engines.base import Case, Engine, Step, allocate_specs
from mlamem.kernels import BufferSpec
from mlamem.operations import SPARSE_DECODE
from mlamem.runtime.allocator import round_size
from mlamem.runtime.attribution import ExpectedBuffer
from mlamem.runtime.graph_capture import CallGraphs
from mlamem.runtime.inputs import fill_query, make_inputs
from mlamem.runtime.measure import plan_call
from mlamem.spec.engines.rank_buffers import Stage
from mlamem.spec.kernel_api import OpInputs
from mlamem.spec.scenario import Scenario


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


def stage_specs(stage: Stage) -> list[BufferSpec]:
    """A stage's buffers as the rank allocates them."""
    return [BufferSpec(b.name, b.shape, getattr(torch, b.dtype), "temporary")
            for b in stage.buffers]



@dataclass(kw_only=True)
class DecodeCase(Case):
    """One decode path through a token-budget engine's rank."""

    key_field = "path"

    path: str
    max_num_batched_tokens: int
    workspace_bytes: int = 0  # reserved at init (workspace paths)
    init_bytes: int | None = None  # everything allocated at init (weights, workspace, inputs)
    kv_cache_bytes: int | None = None
    kv_cache_tokens: int | None = None
    out_staging_gain_bytes: int | None = None  # more headroom if out were staged (no out=)


class DecodeRank(Engine):
    """The init and the step of a token-budget engine's rank; see the module docstring."""

    case_type = DecodeCase

    @classmethod
    def case_keys(cls, paths: list[str]) -> list[str]:
        return list(paths)

    def workspace_tokens(self) -> int:
        """The tokens the path's workspace is reserved for: the step's."""
        return self.budget.max_num_batched_tokens

    def allocate_stage(self, stage: Stage) -> list[torch.Tensor]:
        """A stage's buffers, in order; an OOM names the buffer (`allocating`)."""
        tensors = []
        for spec in stage_specs(stage):
            self.allocating = spec.name
            tensors.extend(allocate_specs([spec], self.memory.device).values())
        return tensors

    def run_stages(self, stages: list[Stage]) -> None:
        """Each stage's buffers allocated together, then freed before the next."""
        for stage in stages:
            tensors = self.allocate_stage(stage)
            del tensors

    def attention_live(self, tokens: int) -> list[Stage]:
        """What the step holds through the attention call beyond activation_specs (allocated
        before it, freed after); an engine that models none has none."""
        return []

    def stages(self, tokens: int) -> list[Stage]:
        """What the step allocates beyond attention at `tokens`, stage by stage, after the
        attention call (spec/engines/rank_buffers.py); an engine that models none has none."""
        return []

    def init(self) -> None:
        scenario, kernel, memory, case = self.scenario, self.kernel, self.memory, self.case
        tokens = self.budget.max_num_batched_tokens
        self.call_plan = plan = plan_call(scenario, kernel, SPARSE_DECODE, tokens, case.path,
                                          sm_count=self.sm_count)
        out_spec = next((s for s in kernel.allocations(plan.problem, self.sm_count)
                         if s.name == "out"), None)
        if out_spec is not None and not plan.takes_out:
            case.out_staging_gain_bytes = round_size(out_spec.nbytes)
        start = memory.stats().allocated
        self.allocating = "workspace"
        self.workspace = plan.reserve_workspace(memory, self.workspace_tokens())
        case.workspace_bytes = memory.stats().allocated - start
        self.allocating = "weights"
        self.resident.append(torch.empty(case.weights_bytes, dtype=torch.uint8,
                                         device=memory.device))
        self.allocating = "indices and KV pool"
        self.inputs = make_inputs(scenario, tokens, memory.device, self.seed, with_query=False)
        case.init_bytes = memory.stats().allocated - start

    def make_graph_call(self, largest_tokens: int) -> CallGraphs:
        """The attention call CUDA graphs capture: q from a static buffer of `largest_tokens`
        rows (resident), the step's KV pool and indices, the path's workspace."""
        scenario = self.scenario
        q_all = torch.empty((largest_tokens, scenario.heads_per_rank, scenario.d_qk),
                            dtype=torch.bfloat16, device=self.memory.device)
        fill_query(q_all, self.seed)
        self.resident.append(q_all)
        inputs = OpInputs(kv=self.inputs.kv_cache, indices=self.inputs.indices)
        return CallGraphs(self.call_plan, q_all, inputs, self.workspace)

    def step(self) -> Step:
        scenario, memory, plan = self.scenario, self.memory, self.call_plan
        inputs = OpInputs(kv=self.inputs.kv_cache, indices=self.inputs.indices)
        attend = plan.call(memory, inputs, self.workspace)
        step_specs = activation_specs(scenario, self.budget.max_num_batched_tokens)
        stages = self.stages(self.budget.max_num_batched_tokens)
        around = [s for stage in self.attention_live(self.budget.max_num_batched_tokens)
                  for s in stage_specs(stage)]
        beyond = [s for stage in stages for s in stage_specs(stage)]
        expected = ([ExpectedBuffer(s.name, s.nbytes, "engine")
                     for s in step_specs + around + beyond] + plan.expected)
        seed = self.seed

        def body() -> None:
            tensors = allocate_specs(step_specs, memory.device)
            held = allocate_specs(around, memory.device)  # the layer's locals, through the call
            fill_query(tensors["q"], seed)
            out, _ = attend(tensors["q"])
            tensors["attn_output"].copy_(out)
            del tensors["q"], tensors["attn_output"], out, held  # the residual stream stays
            self.run_stages(stages)

        return Step(body, expected)
