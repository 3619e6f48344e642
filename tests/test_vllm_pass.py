"""vLLM 0.33.0's stages beyond attention (spec/engines/vllm_pass.py), each buffer held to the
formula of the source it cites, at GLM-5 TP8 32768 tokens and DeepSeek-V3.2 TP4 8192 tokens;
and the emulated rank's profile peak and init grown by them."""

import dataclasses

import pytest

from mlamem.engines.decode_rank import activation_specs
from mlamem.engines.vllm import VLLM
from mlamem.kernels import FlashMLA
from mlamem.runtime.memory import SimulatedMemory
from mlamem.spec import scenario as scenarios
from mlamem.spec.engines import vllm_pass
from mlamem.spec.engines.vllm import VLLMSection
from mlamem.spec.engines.vllm_moe import dense_mlp_stage, fused_moe_workspace, moe_stage

MiB = 1024**2


def with_vllm(scenario, **table):
    """The scenario with its `[vllm]` table's fields set."""
    sections = dict(scenario.sections)
    sections["vllm"] = dataclasses.replace(scenario.section("vllm"), **table)
    return dataclasses.replace(scenario, sections=sections)


@pytest.fixture(scope="module")
def glm():
    """glm5-fp8-tp8 (TP8: 8 heads/rank, max_model_len 131072) at vLLM's default max_num_seqs
    1024 (the shipped scenario takes the PR's 256)."""
    return with_vllm(scenarios.load("glm5-fp8-tp8"), max_num_seqs=1024)


@pytest.fixture(scope="module")
def dsv32_tp4():
    base = scenarios.load("deepseek-v32-fp8-tp8")  # max_model_len 163840
    return dataclasses.replace(base, parallel=dataclasses.replace(base.parallel,
                                                                  tensor_parallel=4))


def sizes(stage):
    return {b.name: b.nbytes for b in stage.buffers}


def test_indexer_buffers_by_their_formulas(glm, dsv32_tp4):
    """fused_q's fp8 query T x index_n_heads x index_head_dim and its float32 weights, the
    512 MiB logits bound, and the top-k exchange's 2 x T x index_topk x 4 B at TP > 1."""
    assert sizes(vllm_pass.indexer_stage(glm, 32768)) == {
        "indexer.q_fp8": 32768 * 32 * 128,  # GLM-5: index_n_heads 32
        "indexer.weights": 32768 * 32 * 4,
        "indexer.logits": 512 * MiB,
        "indexer.topk_exchange": 2 * 32768 * 2048 * 4}
    assert sizes(vllm_pass.indexer_stage(dsv32_tp4, 8192)) == {
        "indexer.q_fp8": 8192 * 64 * 128,  # DeepSeek-V3.2: index_n_heads 64
        "indexer.weights": 8192 * 64 * 4,
        "indexer.logits": 512 * MiB,
        "indexer.topk_exchange": 2 * 8192 * 2048 * 4}
    logits = next(b for b in vllm_pass.indexer_stage(glm, 32768).buffers
                  if b.name == "indexer.logits")  # the profile's stand-in: torch.empty
    assert not logits.sized_from_source and "sparse_attn_indexer" in logits.source


def test_step_indexer_logits_are_the_largest_transient(glm, dsv32_tp4):
    """In a step the prefill chunks' logits (<= 512 MiB), the top-k exchange and the decode
    logits (DeepGEMM's paged MQA logits: one max_model_len-wide float32 row per decode token,
    min(tokens, max_num_seqs x (1 + k)) of them) run one after another: the largest is live."""
    assert sizes(vllm_pass.indexer_stage(dsv32_tp4, 8192, step=True)) == {
        "indexer.q_fp8": 8192 * 64 * 128, "indexer.weights": 8192 * 64 * 4,
        "indexer.logits": 1024 * 163840 * 4}  # > 512 MiB and > the 128 MiB exchange
    assert sizes(vllm_pass.indexer_stage(glm, 32768, step=True))["indexer.logits"] == 512 * MiB
    mtp = with_vllm(glm, num_speculative_tokens=3)
    assert sizes(vllm_pass.indexer_stage(mtp, 32768, step=True))["indexer.logits"] == (
        4096 * 131072 * 4)
    logits = vllm_pass.indexer_stage(mtp, 32768, step=True).buffers[-1]
    assert logits.sized_from_source and "fp8_fp4_paged_mqa_logits" in logits.source
    assert [s.buffers for s in vllm_pass.step_stages(dsv32_tp4, 8192)][0] == (
        vllm_pass.indexer_stage(dsv32_tp4, 8192, step=True).buffers)


def test_indexer_exchange_only_where_rows_are_sharded(glm):
    """No exchange at TP1 or with FULL graphs of mixed batches (tp_prefill_row_sharding_
    supported); no indexer at all for a dense-MLA model."""
    tp1 = dataclasses.replace(glm, parallel=dataclasses.replace(glm.parallel, tensor_parallel=1))
    assert "indexer.topk_exchange" not in sizes(vllm_pass.indexer_stage(tp1, 32768))
    full = with_vllm(glm, cudagraph_mode="FULL")
    assert "indexer.topk_exchange" not in sizes(vllm_pass.indexer_stage(full, 32768))
    kimi = scenarios.load("kimi-k2-fp8-tp4-dp")
    assert vllm_pass.indexer_stage(kimi, 8192) is None


def test_shared_workspace_is_the_largest_request(glm, dsv32_tp4):
    """FlashMLASparseImpl's request (q_concat, factor x max_model_len prefill rows, the
    64-padded query and output, the output): larger here than the indexer's K gather
    (max_model_len x 8 x factor rows of 128 + 4 B, and 1 MiB), each part 256-aligned."""
    glm_sparse = (32768 * 8 * 576 * 2 + 131072 * 5 * 576 * 2 + 32768 * 64 * 576 * 2
                  + 32768 * 64 * 512 * 2 + 32768 * 8 * 512 * 2)
    assert glm_sparse == 5_888_802_816
    assert vllm_pass.workspace_bytes(vllm_pass.indexer_workspace_requests(glm)) == (
        131072 * 40 * 128 + 131072 * 40 * 4 + MiB) == 693_108_736
    assert vllm_pass.shared_workspace(glm, 32768).nbytes == glm_sparse
    dsv_sparse = (8192 * 32 * 576 * 2 + 163840 * 5 * 576 * 2 + 8192 * 64 * 576 * 2
                  + 8192 * 64 * 512 * 2 + 8192 * 32 * 512 * 2)
    assert vllm_pass.shared_workspace(dsv32_tp4, 8192).nbytes == dsv_sparse == 2_654_994_432
    # the path's own workspace (padded q and out) is inside it
    share = 32768 * 64 * (576 + 512) * 2
    assert vllm_pass.decode_share_bytes(glm, 32768) == share
    assert vllm_pass.shared_workspace(glm, 32768, reserved=share).nbytes == glm_sparse - share
    # another request (the fused MoE's) joins the maximum, not the sum
    assert vllm_pass.shared_workspace(glm, 32768, other_requests=(7 << 30,)).nbytes == 7 << 30
    assert vllm_pass.shared_workspace(glm, 32768, other_requests=(1 << 30,)).nbytes == glm_sparse
    kimi = scenarios.load("kimi-k2-fp8-tp4-dp")
    assert vllm_pass.shared_workspace(kimi, 8192) is None
    assert vllm_pass.shared_workspace(kimi, 8192, other_requests=(1 << 30,)).nbytes == 1 << 30


def test_long_context_halves_the_factor(glm):
    """Past 256 Ki tokens the factor is 2 (VllmConfig.__post_init__), for both requests; the
    indexer's gather (576 x 2 // 132 = 8 rows of 132 B per prefill row of 1152 B) stays within
    the sparse backend's, as get_max_prefill_buffer_size sizes it."""
    long = dataclasses.replace(glm, serving=dataclasses.replace(glm.serving,
                                                                max_model_len=1_048_576))
    assert vllm_pass.workspace_factor(long) == 2
    gather = 1_048_576 * 8 * 2 * (128 + 4) + MiB
    assert vllm_pass.workspace_bytes(vllm_pass.indexer_workspace_requests(long)) == gather
    sparse = (256 * 8 * 576 * 2 + 1_048_576 * 2 * 576 * 2 + 256 * 64 * 576 * 2
              + 256 * 64 * 512 * 2 + 256 * 8 * 512 * 2)
    assert vllm_pass.shared_workspace(long, 256).nbytes == sparse > gather


def test_sampler_over_the_gathered_vocabulary(glm, dsv32_tp4):
    """min(max_num_seqs, tokens) requests: the bf16 logits over the padded vocabulary, their
    float32 copy, the probabilities and the exponential noise, and the hidden states."""
    stage = vllm_pass.sampler_stage(glm, vllm_pass.sampled_requests(glm, 32768))
    assert sizes(stage) == {
        "sampler.last_hidden_states": 1024 * 6144 * 2,
        "sampler.random_hidden_states": 1024 * 6144 * 2,
        "sampler.logits": 1024 * 154880 * 2,
        "sampler.logits_fp32": 1024 * 154880 * 4,
        "sampler.probs": 1024 * 154880 * 4,
        "sampler.exponential_noise": 1024 * 154880 * 4}
    step = vllm_pass.sampler_stage(dsv32_tp4, 1024, dummy=False)
    assert sizes(step) == {
        "sampler.last_hidden_states": 1024 * 7168 * 2,
        "sampler.logits": 1024 * 129280 * 2,
        "sampler.logits_fp32": 1024 * 129280 * 4,
        "sampler.probs": 1024 * 129280 * 4,
        "sampler.exponential_noise": 1024 * 129280 * 4}
    assert vllm_pass.sampled_requests(with_vllm(glm, max_num_seqs=256), 32768) == 256
    assert vllm_pass.sampled_requests(glm, 512) == 512
    assert vllm_pass.padded_vocab(129281) == 129344


def test_topk_topp_scratch_is_kept(glm, dsv32_tp4):
    """The Triton top-k/top-p scratch the profile's sampler caches: min(next power of 2 of
    min(SMs, requests), SMs) rows of the vocabulary, float32."""
    assert vllm_pass.topk_topp_buffer(glm, 1024).nbytes == 132 * 154880 * 4
    assert vllm_pass.topk_topp_buffer(dsv32_tp4, 1024).nbytes == 132 * 129280 * 4
    assert vllm_pass.topk_topp_buffer(glm, 100).shape == (128, 154880)
    assert vllm_pass.topk_topp_buffer(glm, 5).shape == (8, 154880)


def test_rejection_sampler_and_drafter_with_mtp(glm, dsv32_tp4):
    """Speculative decoding on: the profile's rejection warm-up (one draft per request, 30 B
    per request per vocabulary entry), the MTP forward's [T, 2H] input and eh_proj output, and
    the drafter's persistent buffers with its MTP layer's own top-k buffer."""
    mtp = with_vllm(glm, num_speculative_tokens=3)
    profile = vllm_pass.rejection_stage(mtp, 1024, 1)
    assert profile.nbytes == 1024 * 154880 * (2 * 2 + 2 + 4 + 3 * 4 + 2 * 4)
    step = vllm_pass.rejection_stage(mtp, 1024, 3, dummy=False)
    assert sizes(step)["rejection.logits"] == 1024 * 4 * 154880 * 2
    assert sizes(step)["rejection.target_probs"] == 1024 * 3 * 154880 * 4
    assert sizes(vllm_pass.drafter_stage(mtp, 32768)) == {
        "drafter.eh_input": 32768 * 2 * 6144 * 2, "drafter.eh_proj_output": 32768 * 6144 * 2}
    mtp4 = with_vllm(dsv32_tp4, num_speculative_tokens=1)
    drafter = {b.name: b.nbytes for b in vllm_pass.drafter_buffers(mtp4, 8192)}
    assert drafter == {
        "drafter.input_ids": 8192 * 4, "drafter.positions": 8192 * 8,
        "drafter.hidden_states": 8192 * 7168 * 2, "drafter.arange": 8192 * 4,
        "drafter.inputs_embeds": 8192 * 7168 * 2, "drafter.backup_next_token_ids": 1024 * 4,
        "drafter.slot_mapping": 8192 * 8, "drafter.topk_indices_buffer.0": 8192 * 2048 * 4}
    assert vllm_pass.drafter_stage(glm, 32768) is None
    assert vllm_pass.rejection_stage(glm, 1024, 0) is None


def test_dense_mla_profile_standin():
    """A dense-MLA layer's profile run: kv_b_proj's stand-in over min(max(8 x max_model_len,
    4 x max_num_seqs x block_size), 64 Ki) rows; no shared workspace, no indexer."""
    kimi = scenarios.load("kimi-k2-fp8-tp4-dp")
    stage = vllm_pass.attention_profile_stage(kimi)
    rows = vllm_pass.chunked_context_rows(kimi)
    assert rows == 64 * 1024  # 8 x max_model_len is past the cap
    heads = kimi.heads_per_rank
    assert sizes(stage) == {"attention.kv_b_proj_standin": rows * heads * (128 + 128) * 2}
    assert [b.name for b in vllm_pass.resident_buffers(kimi, 8192).buffers] == [
        "sampler.topk_topp_buffer"]
    assert [s.name for s in vllm_pass.profile_stages(kimi, 8192)] == ["attention", "sampler"]


def test_stage_order_and_sources(glm):
    """The profile: indexer, sampler; the step: indexer, sampler; every buffer cites vLLM
    0.33.0's file and function."""
    assert [s.name for s in vllm_pass.profile_stages(glm, 32768)] == ["indexer", "sampler"]
    mtp = with_vllm(glm, num_speculative_tokens=1)
    assert [s.name for s in vllm_pass.profile_stages(mtp, 32768)] == [
        "indexer", "drafter", "sampler", "rejection_sampler"]
    assert [s.name for s in vllm_pass.step_stages(mtp, 32768)] == [
        "indexer", "rejection_sampler", "drafter"]
    for stage in vllm_pass.profile_stages(mtp, 32768) + [vllm_pass.resident_buffers(mtp, 32768)]:
        for buffer in stage.buffers:
            assert buffer.source.startswith("vLLM 0.33.0 "), buffer
            assert ".py" in buffer.source, buffer


def test_the_rank_holds_them(glm):
    """The emulated rank's profile peak is the residual stream (hidden_states and residual: q
    and the attention's output are freed after the layer's attention) plus the largest of its
    stages, in the engine's order (the dense MLP, the indexer with the layer's locals, the MoE,
    then the sampler), within the allocator's rounding; its
    init grows by the shared workspace, the largest of its requests (the sparse MLA backend's,
    the indexer's, the fused MoE's, folded in: one WorkspaceManager buffer), less the path's own
    share of it."""
    budget = VLLM.budget_type(glm.gpu.memory_bytes, glm.gpu.gpu_memory_utilization, 32768)
    case = VLLM.emulate(SimulatedMemory(), glm, FlashMLA(), budget, "workspace", sm_count=132)
    rank = VLLM(SimulatedMemory(), glm, FlashMLA(), budget,
                VLLM.new_case("workspace", budget.to_dict(), measured=False), sm_count=132)
    stages = rank.profile_stages(32768)
    assert [s.name for s in stages] == ["dense_mlp", "indexer", "moe", "sampler"]
    assert stages[2] == moe_stage(glm, 32768) and stages[0] == dense_mlp_stage(glm, 32768)
    stream = sum(s.nbytes for s in activation_specs(glm, 32768)
                 if s.name in ("hidden_states", "residual"))
    assert stream == 2 * 32768 * 6144 * 2
    # the indexer's stage holds the layer's locals beside it (vllm_pass.attention_locals):
    # the largest, past the sampler's
    indexer = vllm_pass.indexer_stage(glm, 32768)
    assert stages[1].buffers == (vllm_pass.attention_locals(glm, 32768).buffers
                                 + indexer.buffers)
    largest = max(s.nbytes for s in stages)
    assert largest == stages[1].nbytes == 2_510_290_944 > vllm_pass.sampler_stage(glm, 1024).nbytes
    assert stream + largest <= case.profile_peak_bytes < stream + largest + MiB
    # init: 40 GiB of weights + the path's workspace + the indices and KV pool (test_repro's
    # 47,786,885,120) + the shared workspace (the fused MoE's 6 GiB request, the largest) less
    # the path's share + the top-k/top-p scratch (81,776,640 B, whose 2 MiB-rounded segment's
    # 12,288 B tail is under the allocator's 1 MiB split threshold, so its block takes it)
    requests = [vllm_pass.workspace_bytes(vllm_pass.sparse_mla_workspace_requests(glm, 32768)),
                vllm_pass.workspace_bytes(vllm_pass.indexer_workspace_requests(glm)),
                fused_moe_workspace(glm, 32768).nbytes]
    assert requests == [5_888_802_816, 693_108_736, 6 * 1024 ** 3]
    share = vllm_pass.decode_share_bytes(glm, 32768)
    assert case.init_bytes == (47_786_885_120 + max(requests) - share + 132 * 154880 * 4
                               + 12_288) == 49_747_722_240


def test_section_default_is_what_the_stages_read():
    """The stages read the `[vllm]` table's max_num_seqs (1024 by default)."""
    assert VLLMSection().max_num_seqs == 1024


def test_attention_locals_by_their_formulas(glm, dsv32_tp4):
    """A DSA layer's locals through its attention call, T tokens: the previous layer's MoE
    output (T x hidden), the fused q/kv down-projection (T x (q_lora_rank + kv_lora_rank +
    RoPE)) and its normed q, latent and RoPE key, q_b (T x heads/rank x (NoPE + RoPE)), the
    indexer's replicated query in bf16 and fp8 (T x index heads x 128), its fused key and head
    weights (T x (128 + index heads), bf16) and float32 weights; bf16 unless named."""
    assert sizes(vllm_pass.attention_locals(glm, 32768)) == {
        "attention.previous_moe_output": 32768 * 6144 * 2,
        "attention.qkv_lora": 32768 * (2048 + 512 + 64) * 2,  # GLM-5: q_lora_rank 2048
        "attention.q_c": 32768 * 2048 * 2,
        "attention.kv_c": 32768 * 512 * 2,
        "attention.k_pe": 32768 * 64 * 2,
        "attention.q_b": 32768 * 8 * (192 + 64) * 2,  # 8 heads/rank, qk_nope_head_dim 192
        "attention.index_q": 32768 * 32 * 128 * 2,
        "attention.index_q_fp8": 32768 * 32 * 128,
        "attention.index_kw": 32768 * (128 + 32) * 2,
        "attention.index_weights": 32768 * 32 * 4}
    assert sizes(vllm_pass.attention_locals(dsv32_tp4, 8192)) == {
        "attention.previous_moe_output": 8192 * 7168 * 2,
        "attention.qkv_lora": 8192 * (1536 + 512 + 64) * 2,  # DeepSeek-V3.2: q_lora_rank 1536
        "attention.q_c": 8192 * 1536 * 2,
        "attention.kv_c": 8192 * 512 * 2,
        "attention.k_pe": 8192 * 64 * 2,
        "attention.q_b": 8192 * 32 * (128 + 64) * 2,  # TP4: 32 heads/rank
        "attention.index_q": 8192 * 64 * 128 * 2,
        "attention.index_q_fp8": 8192 * 64 * 128,
        "attention.index_kw": 8192 * (128 + 64) * 2,
        "attention.index_weights": 8192 * 64 * 4}
    assert vllm_pass.attention_locals(scenarios.load("kimi-k2-fp8-tp4-dp"), 8192) is None
    for buffer in vllm_pass.attention_locals(glm, 32768).buffers:
        assert buffer.source.startswith("vLLM 0.33.0 ") and ".py" in buffer.source, buffer


def test_step_attention_buffers_are_the_global_topk_slots(glm, dsv32_tp4):
    """The mixed batch's top-k indices as global cache slots: T x index_topk int32."""
    assert sizes(vllm_pass.step_attention_buffers(glm, 32768)) == {
        "attention.global_topk_slots": 32768 * 2048 * 4}
    assert sizes(vllm_pass.step_attention_buffers(dsv32_tp4, 8192)) == {
        "attention.global_topk_slots": 8192 * 2048 * 4}
    assert vllm_pass.step_attention_buffers(scenarios.load("kimi-k2-fp8-tp4-dp"), 8192) is None


def test_after_kv_buffers_by_their_formulas(glm, dsv32_tp4):
    """After the KV cache: the indexer's expanded block table, T x the block table's width
    (max_model_len / block_size, aligned to 128 tokens' worth of 64-token blocks: 2) int32,
    and the sparse MLA builder's chunked-prefill workspace, min(max(8 x max_model_len,
    4 x max_num_seqs x block_size), 64 Ki) rows of 576 bf16."""
    assert vllm_pass.block_table_width(glm) == 131072 // 64 == 2048
    assert vllm_pass.block_table_width(dsv32_tp4) == 163840 // 64 == 2560
    odd = dataclasses.replace(glm, serving=dataclasses.replace(
        glm.serving, max_model_len=131072 + 64))  # 2049 blocks, aligned up to 2050
    assert vllm_pass.block_table_width(odd) == 2050
    assert sizes(vllm_pass.after_kv_buffers(glm, 32768)) == {
        "indexer.expanded_block_table": 32768 * 2048 * 4,
        "sparse_mla.chunked_prefill_workspace": 64 * 1024 * 576 * 2}
    assert sizes(vllm_pass.after_kv_buffers(dsv32_tp4, 8192)) == {
        "indexer.expanded_block_table": 8192 * 2560 * 4,
        "sparse_mla.chunked_prefill_workspace": 64 * 1024 * 576 * 2}
    assert vllm_pass.after_kv_buffers(scenarios.load("kimi-k2-fp8-tp4-dp"), 8192) is None
