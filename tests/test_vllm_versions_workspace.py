"""The stages beyond attention by vLLM version ([vllm].engine_version): each version's rule held
to the wheel it was read from (`pip download --no-deps vllm==X`, the files named below).

- the fused-MoE workspace: 0.10.2-0.13.0 Fp8MoEMethod.apply (quantization/fp8.py) and the
  unquantized method call `fused_experts` without expert parallelism, whose
  `fused_experts_impl` (fused_moe/fused_moe.py) allocates cache13 and intermediate_cache2 per
  call (torch.empty), at most VLLM_FUSED_MOE_CHUNK_SIZE tokens: a profile transient. From 0.14.0
  every method runs the modular kernel (`self.kernel`), whose workspace is the WorkspaceManager's
  (v1/worker/workspace.py, from 0.13.0). VLLM_FUSED_MOE_CHUNK_SIZE (envs.py): 32768 in
  0.10.2-0.11.0, 16384 in 0.12.0-0.17.0, gone from 0.18.0 (modular_kernel.py runs all M);
- the sparse MLA backend's and the indexer's shared workspace: from 0.13.0
  (flashmla_sparse.py FlashMLASparseImpl.__init__, current_workspace_manager); 0.11.0-0.12.0
  reserve none (models/deepseek_v2.py sparse_attn_indexer gathers K per prefill chunk);
- the sampler's cached top-k/top-p scratch: v1/sample/ops/topk_topp_triton.py, from 0.17.0.
"""

from dataclasses import replace

import pytest

from mlamem.engines.base import Budget
from mlamem.engines.vllm import VLLM
from mlamem.kernels import FlashMLA
from mlamem.runtime.memory import SimulatedMemory
from mlamem.spec import scenario as scenarios
from mlamem.spec.engines.vllm import engine_series
from mlamem.spec.engines.vllm_moe import (
    fused_moe_chunk_tokens,
    fused_moe_workspace,
    moe_note,
    moe_stage,
    moe_workspace_resident,
    unmodelled_reason,
)
from mlamem.spec.engines.vllm_pass import (
    indexer_stage,
    indexer_workspace_requests,
    sampler_stage,
    shared_workspace,
    sparse_mla_workspace_requests,
    topk_topp_buffer,
)

GLM5_MOE = dict(intermediate_size=12288, moe_intermediate_size=2048, n_routed_experts=256,
                num_experts_per_tok=8, n_shared_experts=1, first_k_dense_replace=3,
                quantization="fp8-block")


def at(scenario, version, **parallel):
    """The scenario under vLLM `version` (None: the default, 0.33.0)."""
    sections = dict(scenario.sections)
    sections["vllm"] = replace(scenario.section("vllm"), engine_version=version)
    return replace(scenario, sections=sections,
                   parallel=replace(scenario.parallel, **parallel))


@pytest.fixture(scope="module")
def glm5():
    shipped = scenarios.load("glm5-fp8-tp8")
    return replace(shipped, model=replace(shipped.model, **GLM5_MOE))


def test_engine_series_reads_the_scenario(glm5):
    assert engine_series(glm5) == (0, 33)
    assert engine_series(at(glm5, "0.19.1")) == (0, 19)
    assert engine_series(at(glm5, "v0.10.2")) == (0, 10)


@pytest.mark.parametrize(("version", "chunk"), [
    ("0.10.2", 32768), ("0.11.0", 32768), ("0.12.0", 16384), ("0.17.0", 16384),
    ("0.18.0", None), ("0.22.1", None), (None, None)])
def test_chunk_size_per_version(glm5, version, chunk):
    """envs.py VLLM_FUSED_MOE_CHUNK_SIZE's default, None where it is gone."""
    assert fused_moe_chunk_tokens(at(glm5, version)) == chunk


@pytest.mark.parametrize(("version", "resident"), [
    ("0.10.2", False), ("0.13.0", False), ("0.14.0", True), ("0.21.0", True), (None, True)])
def test_workspace_is_resident_from_the_modular_kernel(glm5, version, resident):
    assert moe_workspace_resident(at(glm5, version)) is resident


def test_transient_workspace_is_fused_experts_impl_caches_in_the_moe_stage(glm5):
    """0.13.0 at 32768 tokens: cache13 (M, topk, max(N, K)) and intermediate_cache2 (M x topk,
    N / 2), bf16, M = min(tokens, 16384), two tensors of their own in the MoE stage."""
    old = at(glm5, "0.13.0")
    m, topk, n, k = 16384, 8, 512, 6144
    stage = {b.name: b.nbytes for b in moe_stage(old, 32768).buffers}
    assert stage["moe.cache13"] == m * topk * max(n, k) * 2
    assert stage["moe.intermediate_cache2"] == m * topk * (n // 2) * 2
    assert "moe.cache13" not in {b.name for b in moe_stage(glm5, 32768).buffers}
    assert fused_moe_workspace(old, 32768) is None  # nothing for the shared workspace


def test_chunked_modular_workspace_adds_the_full_output(glm5):
    """0.16.0 at 32768 tokens: two chunks of 16384, so the output (M_full, K) is a third part of
    the WorkspaceManager request beside workspace13 and workspace2 at the chunk's M."""
    m, chunk, topk, k = 32768, 16384, 8, 6144  # N = 512 < K: max(N / 2, K) = max(N, K) = K
    workspace = fused_moe_workspace(at(glm5, "0.16.0"), m)
    assert workspace.nbytes == (chunk * topk * k + chunk * topk * k + m * k) * 2
    assert fused_moe_workspace(at(glm5, "0.16.0"), chunk).nbytes == 2 * chunk * topk * k * 2


def test_expert_parallel_before_the_modular_kernel_is_not_read(glm5):
    ep = at(glm5, "0.12.0", tensor_parallel=4, expert_parallel=True)
    assert "0.12.0" in unmodelled_reason(ep) and moe_stage(ep, 1024) is None
    assert unmodelled_reason(at(glm5, None, tensor_parallel=4, expert_parallel=True)) is None


def test_deep_gemm_note_where_it_defaulted_on(glm5):
    """envs.py VLLM_USE_DEEP_GEMM "1" from 0.11.0; the oracle prefers Triton from 0.17.0."""
    assert "DeepGEMM" in moe_note(at(glm5, "0.16.0"))
    assert moe_note(at(glm5, "0.10.2")) is None and moe_note(glm5) is None


def test_dsa_shared_workspace_from_the_workspace_manager(glm5):
    """None before 0.13.0; in 0.13.0 the larger of the sparse MLA backend's prefill gather
    (max_model_len x 5 rows of 576 bf16) and the indexer's K gather (x 40 rows of 128 fp8 and 4
    scale bytes)."""
    length = glm5.serving.max_model_len
    assert shared_workspace(at(glm5, "0.12.0"), 8192) is None
    assert shared_workspace(at(glm5, "0.13.0"), 8192).nbytes == max(
        5 * length * 576 * 2, 40 * length * 128 + 40 * length * 4)


def test_topk_topp_scratch_from_its_triton_kernel(glm5):
    assert topk_topp_buffer(at(glm5, "0.16.0"), 256) is None
    assert topk_topp_buffer(at(glm5, "0.17.0"), 256).nbytes == topk_topp_buffer(glm5, 256).nbytes


def test_the_rank_keeps_the_transient_workspace_out_of_init(glm5):
    """0.13.0: the MoE workspace is in the profile's MoE stage, not in init; default: in init
    (at 32768 tokens its 6 GiB request outgrows the sparse MLA backend's)."""
    budget = Budget(glm5.gpu.memory_bytes, glm5.gpu.gpu_memory_utilization, 32768)
    bare = replace(glm5, model=replace(glm5.model, n_routed_experts=None,
                                        first_k_dense_replace=None))
    for version, grows in (("0.13.0", False), (None, True)):
        case, without = (VLLM.emulate(SimulatedMemory(), at(s, version), FlashMLA(), budget,
                                      "alloc", sm_count=132) for s in (glm5, bare))
        assert (case.init_bytes > without.init_bytes) is grows


def _request_shapes(scenario, tokens=8192):
    return [shape for shape, _ in sparse_mla_workspace_requests(scenario, tokens)]


def test_sparse_mla_init_request_per_version(glm5):
    """flashmla_sparse.py FlashMLASparseImpl.__init__: 0.13.0-0.17.0 the fp8 prefill gather
    alone (get_prefill_workspace_size: max_model_len x 5); 0.18.0-0.30.0 q_concat beside it;
    0.31.0 the five workspace_specs; 0.32.0 on, the factor from config/vllm.py (2 above 256 Ki)."""
    heads, d_qk, length = glm5.heads_per_rank, glm5.d_qk, glm5.serving.max_model_len
    assert _request_shapes(at(glm5, "0.12.0")) == []
    assert _request_shapes(at(glm5, "0.13.0")) == [(5 * length, d_qk)]
    assert _request_shapes(at(glm5, "0.22.0")) == [(8192, heads, d_qk), (5 * length, d_qk)]
    assert len(_request_shapes(at(glm5, "0.31.0"))) == 5
    long = replace(glm5, serving=replace(glm5.serving, max_model_len=512 * 1024))
    assert _request_shapes(at(long, "0.31.0"))[1] == (5 * 512 * 1024, d_qk)
    assert _request_shapes(long)[1] == (2 * 512 * 1024, d_qk)


def test_bf16_q_concat_is_head_padded_from_0_29(glm5):
    """A bf16 cache (a dense-decode scenario of the same model) reserves q_concat alone."""
    bf16 = replace(glm5, operations=("dense-decode",), serving=replace(
        glm5.serving, kv_cache_dtype="bf16", max_batch_size=64, decode_context_len=4096))
    heads, d_qk = glm5.heads_per_rank, glm5.d_qk
    assert _request_shapes(at(bf16, "0.13.0")) == []
    assert _request_shapes(at(bf16, "0.28.0")) == [(8192, heads, d_qk)]
    assert _request_shapes(at(bf16, "0.29.0")) == [(8192, 64, d_qk)]


def test_indexer_profile_branch_per_version(glm5):
    """sparse_attn_indexer's profile branch: the K gather (max_model_len x 40 rows before
    0.32.0, indexer.py get_max_prefill_buffer_size) from 0.13.0; the radix top-k's 1 MiB from
    0.20.0; the VLLM_SPARSE_INDEXER_MAX_LOGITS_MB stand-in from 0.19.0; the top-k exchange's
    transient from 0.32.0."""
    length = glm5.serving.max_model_len
    assert [s for s, _ in indexer_workspace_requests(at(glm5, "0.16.0"))] == [
        (40 * length, 128), (40 * length, 4)]
    assert len(indexer_workspace_requests(at(glm5, "0.20.0"))) == 3
    names = {v: {b.name for b in indexer_stage(at(glm5, v), 8192).buffers}
             for v in ("0.18.0", "0.19.0", "0.31.0", "0.32.0")}
    assert "indexer.logits" not in names["0.18.0"] and "indexer.logits" in names["0.19.0"]
    assert "indexer.topk_exchange" not in names["0.31.0"]
    assert "indexer.topk_exchange" in names["0.32.0"]


def test_sampler_sorts_before_the_triton_top_k_top_p(glm5):
    """vLLM 0.12.0-0.16.0 sample the profile's dummy batch (top-k vocab - 1, top-p 0.9) through
    topk_topp_sampler.py forward_native, apply_top_k_top_p: at its scatter the float32 logits,
    their sorted copy (float32) and order (int64), the top-k and top-p masks (bool), the
    softmax/cumsum (float32) and the scattered result (float32) live together, 22 bytes a
    vocabulary entry beyond the copy, where 0.17.0 on masks in place (probabilities and noise,
    8 bytes)."""
    requests, vocab = 256, glm5.model.vocab_size
    old, new = sampler_stage(at(glm5, "0.16.0"), requests), sampler_stage(glm5, requests)
    assert old.nbytes - new.nbytes == requests * vocab * (22 - 8)
    assert {"sampler.logits_sort", "sampler.logits_idx"} <= {b.name for b in old.buffers}
    assert sampler_stage(at(glm5, "0.17.0"), requests).nbytes == new.nbytes
    assert sampler_stage(at(glm5, "0.11.0"), requests).nbytes == new.nbytes  # FlashInfer's
