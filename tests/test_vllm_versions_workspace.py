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
from mlamem.spec.engines.vllm_pass import shared_workspace, topk_topp_buffer

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
    assert shared_workspace(at(glm5, "0.12.0"), 8192) is None
    assert shared_workspace(at(glm5, "0.13.0"), 8192).nbytes == shared_workspace(glm5, 8192).nbytes


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
