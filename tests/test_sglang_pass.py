"""SGLang 0.5.23's chunked-prefill step beyond attention (mlamem/spec/engines/sglang_pass.py):
each buffer held to the formula of the source it cites, at GLM-5 TP8 (8192 tokens, SGLang's
chunked_prefill_size on an H100) and DeepSeek-V3.2 TP8 with EP (8192, its default on an H200),
and the rank's step peak grown by them."""

import dataclasses

import pytest

from mlamem.commands.repro import host_setup
from mlamem.engines.decode_rank import DecodeRank
from mlamem.engines.sglang import SGLang, SGLangBudget
from mlamem.kernels import FlashMLA
from mlamem.runtime.memory import SimulatedMemory
from mlamem.spec import scenario as scenarios
from mlamem.spec.engines.sglang_pass import (
    StepShape,
    logits_rows,
    mqa_logits_budget_bytes,
    shared_experts_fused,
    step_shape,
    step_stages,
)

GiB = 1 << 30
BUDGET = 2 * GiB  # an indexer logits budget for the formula tests

GLM5_TP8 = StepShape(
    tokens=8192, context_tokens=131072, hidden_size=6144, tensor_parallel=8,
    architecture="GlmMoeDsaForCausalLM", vocab_size=154880, intermediate_size=12288,
    moe_intermediate_size=2048, n_routed_experts=256, num_experts_per_tok=8, n_shared_experts=1,
    first_k_dense_replace=3, index_n_heads=32, index_head_dim=128, index_topk=2048)
DSV32_EP8 = StepShape(
    tokens=8192, context_tokens=163840, hidden_size=7168, tensor_parallel=8,
    expert_parallel=True, architecture="DeepseekV32ForCausalLM", vocab_size=129280,
    intermediate_size=18432, moe_intermediate_size=2048, n_routed_experts=256,
    num_experts_per_tok=8, n_shared_experts=1, first_k_dense_replace=3, index_n_heads=64,
    index_head_dim=128, index_topk=2048)


def emulate(scenario, tokens: int):
    """SGLang's rank on the allocator model at `tokens`, its fraction by the reserve rule."""
    memory = SimulatedMemory(non_torch=host_setup("flashmla", predict=True,
                                                  target_bytes=scenario.gpu.memory_bytes))
    budget = SGLangBudget(gpu_memory_bytes=scenario.gpu.memory_bytes,
                          utilization=scenario.gpu.gpu_memory_utilization,
                          max_num_batched_tokens=tokens)
    return SGLang.emulate(memory, scenario, FlashMLA(), budget, "alloc", sm_count=132)


def stage_map(shape: StepShape, budget: int = BUDGET) -> dict[str, dict[str, int]]:
    """Each stage's buffers' bytes by name."""
    return {s.name: {b.name: b.nbytes for b in s.buffers} for s in step_stages(shape, budget)}


def test_glm5_tp8_moe_is_the_triton_runner_with_the_shared_expert_fused():
    """GLM-5 at TP8: 257 experts (the shared one fused), top-9, intermediate 2048 / 8 = 256:
    _fused_moe_kernel_sequence's caches at T x 9 rows, the fp8 input and down input, the router's
    fp32 logits and the top-k; no shared-expert stage."""
    stages = stage_map(GLM5_TP8)
    t, k, i, h = 8192, 9, 256, 6144
    held = {"moe.router_logits": t * 256 * 4, "moe.topk_weights": t * k * 4,
            "moe.topk_ids": t * k * 4}
    assert stages["moe.gate_up"] == {**held, "moe.intermediate_cache1": t * k * 2 * i * 2,
                                     "moe.input_fp8": t * h, "moe.input_scale": t * (h // 128) * 4}
    assert stages["moe.activation"] == {**held, "moe.intermediate_cache1": t * k * 2 * i * 2,
                                        "moe.intermediate_cache2": t * k * i * 2}
    assert stages["moe.down"] == {**held, "moe.intermediate_cache2": t * k * i * 2,
                                  "moe.intermediate_cache3": t * k * h * 2,
                                  "moe.down_input_fp8": t * k * i,
                                  "moe.down_input_scale": t * k * (i // 128) * 4}
    assert not any(name.startswith("moe.shared_expert") for name in stages)
    assert stages["moe.down"]["moe.intermediate_cache3"] == 864 * (1 << 20)


def test_dsv32_ep_moe_holds_its_share_of_experts_at_full_width_and_the_shared_expert_apart():
    """DeepSeek-V3.2 with EP8 (a2a none): 32 local experts at the full 2048 width, top-8, the
    ids mapped to local experts, the shared expert not fused (its architecture is not
    DeepSeek-V3's, and EP on CUDA disables it anyway): its MLP runs first at 2048 / 8, its
    output held through the routed experts."""
    stages = stage_map(DSV32_EP8)
    t, k, i, h = 8192, 8, 2048, 7168
    held = {"moe.router_logits": t * 256 * 4, "moe.topk_weights": t * k * 4,
            "moe.topk_ids": t * k * 4, "moe.topk_ids_local": t * k * 4,
            "moe.shared_output": t * h * 2}
    assert stages["moe.gate_up"] == {**held, "moe.intermediate_cache1": t * k * 2 * i * 2,
                                     "moe.input_fp8": t * h, "moe.input_scale": t * (h // 128) * 4}
    assert stages["moe.down"] == {**held, "moe.intermediate_cache2": t * k * i * 2,
                                  "moe.intermediate_cache3": t * k * h * 2,
                                  "moe.down_input_fp8": t * k * i,
                                  "moe.down_input_scale": t * k * (i // 128) * 4}
    w = 2048 // 8
    assert stages["moe.shared_expert.gate_up"] == {
        "moe.shared_expert.gate_up_input_fp8": t * h,
        "moe.shared_expert.gate_up_input_scale": (h // 128) * t * 4,
        "moe.shared_expert.gate_up": t * 2 * w * 2}
    assert stages["moe.shared_expert.down"] == {
        "moe.shared_expert.gate_up": t * 2 * w * 2, "moe.shared_expert.act": t * w * 2,
        "moe.shared_expert.down_input_fp8": t * w,
        "moe.shared_expert.down_input_scale": (w // 128) * t * 4,
        "moe.shared_expert.down_output": t * h * 2}


@pytest.mark.parametrize(("shape", "fused"), [
    (GLM5_TP8, True),
    (DSV32_EP8, False),  # DeepseekV32ForCausalLM is not the fusing architecture
    (dataclasses.replace(DSV32_EP8, expert_parallel=False), False),
    (dataclasses.replace(GLM5_TP8, expert_parallel=True), False),  # EP on CUDA
    (dataclasses.replace(GLM5_TP8, architecture="DeepseekV3ForCausalLM"), True),  # DeepSeek-V3
    (dataclasses.replace(GLM5_TP8, architecture="DeepseekV3ForCausalLM",
                         n_routed_experts=384), False),  # Kimi-K2: 384 fuses only for Quark
    (dataclasses.replace(GLM5_TP8, architecture=None), False),  # not known: no fusion claimed
])
def test_shared_expert_fusion_follows_sglangs_reasons(shape, fused):
    """shared_experts_fusion_disable_reason, case by case."""
    assert shared_experts_fused(shape) is fused


@pytest.mark.parametrize(("shape", "width"), [(GLM5_TP8, 12288 // 8), (DSV32_EP8, 18432 // 8)])
def test_dense_mlp_is_deepseekv2mlp_on_deepgemm_linears(shape, width):
    """The first_k_dense_replace layers' MLP at intermediate / TP: the gate-up GEMM's fp8 input
    (column-major scales, rows padded to 4) and output, then the down GEMM with gate_up still
    bound, the activation, its fp8 copy and the output; the GEMM outputs are DeepGEMM's."""
    stages, t, h = stage_map(shape), 8192, shape.hidden_size
    assert stages["dense_mlp.gate_up"] == {
        "dense_mlp.gate_up_input_fp8": t * h, "dense_mlp.gate_up_input_scale": h // 128 * t * 4,
        "dense_mlp.gate_up": t * 2 * width * 2}
    assert stages["dense_mlp.down"] == {
        "dense_mlp.gate_up": t * 2 * width * 2, "dense_mlp.act": t * width * 2,
        "dense_mlp.down_input_fp8": t * width,
        "dense_mlp.down_input_scale": width // 128 * t * 4, "dense_mlp.down_output": t * h * 2}
    deep_gemm = {b.name for s in step_stages(shape, BUDGET) for b in s.buffers
                 if b.sized_from_source}
    assert {"dense_mlp.gate_up", "dense_mlp.down_output", "indexer.logits"} <= deep_gemm


def test_the_indexer_logits_budget_is_sglangs():
    """mqa_logits_budget_bytes: min(30% of the GPU, 20% of (1 - mem_fraction_static) of it,
    20% of the free memory); with a fraction set, 30% never binds."""
    total = 80 * GiB
    assert mqa_logits_budget_bytes(total, 0.8, 100 * GiB) == int(int(total * 0.2) * 0.2)
    assert mqa_logits_budget_bytes(total, 0.8, 10 * GiB) == int(10 * GiB * 0.2)
    assert mqa_logits_budget_bytes(total, 0.0, 200 * GiB) == int(total * 0.2)


def test_glm5_indexer_at_a_131072_token_context():
    """GLM-5 (interleaved indexer rope: the fused query path): fp8 q and fp32 head weights, the
    131072 context's keys and scales gathered, the logits chunk of budget // (131072 x 4) rows,
    each padded to 256 columns, and the chunk's top-2048."""
    rows = BUDGET // (131072 * 4)
    assert logits_rows(8192, 131072, BUDGET) == rows == 4096
    assert stage_map(GLM5_TP8)["indexer"] == {
        "indexer.q_fp8": 8192 * 32 * 128, "indexer.weights": 8192 * 32 * 4,
        "indexer.k_gathered": 131072 * 128, "indexer.k_scale_gathered": 131072 * 4,
        "indexer.logits": rows * 131072 * 4, "indexer.topk_chunk": rows * 2048 * 4}


def test_dsv32_indexer_keeps_the_unfused_query_and_pads_its_logits_rows():
    """DeepSeek-V3.2 (neox-style indexer rope: no fusion): the bf16 query and key, act_quant's fp8
    q and scales and the head weights stay bound; a 163840 + 5 context's logits rows pad to
    163840 + 256 columns; the whole chunk fits a large budget."""
    shape = dataclasses.replace(DSV32_EP8, context_tokens=163845)
    t, cols = 8192, 163845
    assert stage_map(shape, 64 * GiB)["indexer"] == {
        "indexer.query": t * 64 * 128 * 2, "indexer.key": t * 128 * 2,
        "indexer.q_fp8": t * 64 * 128, "indexer.q_scale": t * 64 * 4,
        "indexer.weights": t * 64 * 4, "indexer.k_gathered": cols * 128,
        "indexer.k_scale_gathered": cols * 4, "indexer.logits": t * (163840 + 256) * 4,
        "indexer.topk_chunk": t * 2048 * 4}


def test_no_indexer_logits_within_topk_or_without_the_indexer():
    """A context within index_topk keeps all its tokens (no logits); a dense-MLA model has no
    indexer; small matrices are never chunked."""
    assert "indexer" not in stage_map(dataclasses.replace(GLM5_TP8, context_tokens=2048))
    assert "indexer" not in stage_map(dataclasses.replace(GLM5_TP8, index_topk=None))
    assert logits_rows(1000, 7999, 1) == 1000


@pytest.mark.parametrize(("shape", "vocab"), [(GLM5_TP8, 154880), (DSV32_EP8, 129280)])
def test_the_sampler_scores_one_token_per_request(shape, vocab):
    """One request's last token: its vocabulary shard and the gathered row in bf16, then the
    fp32 logits and their softmax."""
    stages = stage_map(shape)
    assert stages["sampler.lm_head"] == {"sampler.lm_head_shard": vocab // 8 * 2,
                                         "sampler.lm_head_gathered": vocab * 2}
    assert stages["sampler.softmax"] == {"sampler.logits": vocab * 4, "sampler.probs": vocab * 4}


def test_the_drafter_runs_only_with_speculative_decoding():
    """MTP on: the draft layer's MoE stages again, each with the target's hidden states for
    every token held."""
    assert not any(n.startswith("drafter") for n in stage_map(GLM5_TP8))
    stages = stage_map(dataclasses.replace(GLM5_TP8, speculative=True))
    assert stages["drafter.moe.down"] == {
        "drafter.target_hidden_states": 8192 * 6144 * 2,
        **{f"drafter.{n}": b for n, b in stages["moe.down"].items()}}


def test_unmodelled_checkpoints_have_no_mlp_stages_and_bf16_no_activation_quant():
    """An NVFP4 checkpoint's MoE and MLP paths are not modelled (none claimed); a bf16 one runs
    the same Triton runner without quantizing its activations."""
    assert not any(n.startswith(("moe", "dense"))
                   for n in stage_map(dataclasses.replace(GLM5_TP8, quantization="nvfp4")))
    bf16 = stage_map(dataclasses.replace(GLM5_TP8, quantization=None))
    assert "moe.input_fp8" not in bf16["moe.gate_up"]
    assert not any(n.endswith("_fp8") for n in bf16["dense_mlp.down"])


def test_every_buffer_cites_sglang_0_5_23():
    for shape in (GLM5_TP8, dataclasses.replace(DSV32_EP8, speculative=True)):
        for stage in step_stages(shape, BUDGET):
            assert all(b.source.startswith("SGLang 0.5.23 ") and ", " in b.source
                       for b in stage.buffers), stage.name


def test_the_shipped_scenarios_give_their_shapes():
    """step_shape reads the scenario: GLM-5's model fields, TP8, the 131072 context, no drafter."""
    glm = scenarios.load("glm5-fp8-tp8")
    shape = step_shape(glm, 8192)
    assert (shape.tokens, shape.context_tokens, shape.vocab_size, shape.n_routed_experts,
            shape.index_n_heads, shape.quantization, shape.speculative) == (
        8192, 131072, 154880, 256, 32, "fp8-block", False)


def test_the_sglang_step_peak_grows_by_its_stages(monkeypatch):
    """GLM-5 TP8 at 8192 tokens on the allocator model: the rank's stages are sglang_pass's, and
    the step's peak grows by them (by at most the largest stage: what the attention call freed
    is reused)."""
    glm = scenarios.load("glm5-fp8-tp8")
    seen, modelled = [], SGLang.stages
    monkeypatch.setattr(SGLang, "stages",
                        lambda self, tokens: seen.append(modelled(self, tokens)) or seen[-1])
    case = emulate(glm, 8192)
    monkeypatch.setattr(SGLang, "stages", DecodeRank.stages)
    bare = emulate(glm, 8192)
    [stages] = seen
    assert {s.name for s in stages} >= {"moe.down", "indexer", "dense_mlp.down", "sampler.softmax"}
    largest = max(s.nbytes for s in stages)
    assert 0 < case.step_peak_bytes - bare.step_peak_bytes <= largest + len(stages) * (2 << 20)
    assert case.kv_cache_tokens == bare.kv_cache_tokens  # the stages come after the pool
