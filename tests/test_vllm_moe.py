"""vLLM 0.33.0's MoE layer and dense MLP layers (spec/engines/vllm_moe.py): each buffer held to
the formula of the source it cites, at two shapes, and the emulated rank's profile peak."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from mlamem.cli import main
from mlamem.engines.base import Budget
from mlamem.engines.decode_rank import activation_specs
from mlamem.engines.vllm import VLLM
from mlamem.kernels import FlashMLA
from mlamem.runtime.allocator import round_size
from mlamem.runtime.memory import SimulatedMemory
from mlamem.spec import scenario as scenarios
from mlamem.spec.engines.vllm_moe import (
    FLASHINFER_CUTLASS,
    HUMMING,
    TRITON,
    dense_mlp_stage,
    flashinfer_workspace,
    fused_moe_workspace,
    moe_backend,
    moe_note,
    moe_stage,
    router_logits_dtype,
    unmodelled_reason,
)
from mlamem.spec.engines.vllm_pass import sparse_mla_workspace_requests, workspace_bytes
from mlamem.spec.serve_command import from_command

# the MoE fields of the Hugging Face configs (mlamem/spec/models/glm-5.json, deepseek-v3.2.json)
GLM5_MOE = dict(intermediate_size=12288, moe_intermediate_size=2048, n_routed_experts=256,
                num_experts_per_tok=8, n_shared_experts=1, first_k_dense_replace=3,
                quantization="fp8-block")
DSV32_MOE = dict(intermediate_size=18432, moe_intermediate_size=2048, n_routed_experts=256,
                 num_experts_per_tok=8, n_shared_experts=1, first_k_dense_replace=3,
                 quantization="fp8-block")

ROOT = Path(__file__).parent.parent


def with_moe(name: str, fields: dict, **parallel):
    shipped = scenarios.load(name)
    return replace(shipped, model=replace(shipped.model, **fields),
                   parallel=replace(shipped.parallel, **parallel))


@pytest.fixture(scope="module")
def glm5_tp8():
    """GLM-5 FP8 at TP8, no expert parallelism (the seed's layout)."""
    return with_moe("glm5-fp8-tp8", GLM5_MOE)


@pytest.fixture(scope="module")
def dsv32_tp4_ep():
    """DeepSeek-V3.2 FP8 at TP4 with --enable-expert-parallel."""
    return with_moe("deepseek-v32-fp8-tp8", DSV32_MOE, tensor_parallel=4, expert_parallel=True)


def with_vllm(scenario, **table):
    """The scenario with its `[vllm]` table's fields set."""
    sections = dict(scenario.sections)
    sections["vllm"] = replace(scenario.section("vllm"), **table)
    return replace(scenario, sections=sections)


def sizes(stage) -> dict[str, tuple[tuple[int, ...], int]]:
    return {b.name: (b.shape, b.nbytes) for b in stage.buffers}


def test_backend_per_quantization_and_layout(glm5_tp8, dsv32_tp4_ep):
    """oracle/fp8.py: Triton for block fp8 under TP, FlashInfer CUTLASS with EP; bf16: Triton
    either way (oracle/unquantized.py); int4: Humming (oracle/int_wna16.py), not modelled."""
    assert moe_backend(glm5_tp8) == TRITON
    assert moe_backend(dsv32_tp4_ep) == FLASHINFER_CUTLASS
    assert "FlashInfer" in moe_note(dsv32_tp4_ep) and moe_note(glm5_tp8) is None
    bf16_ep = replace(dsv32_tp4_ep, model=replace(dsv32_tp4_ep.model, quantization=None))
    assert moe_backend(bf16_ep) == TRITON
    int4 = replace(glm5_tp8, model=replace(glm5_tp8.model, quantization="int-pack"))
    assert moe_backend(int4) == HUMMING and "Humming" in unmodelled_reason(int4)
    assert moe_stage(int4, 1024) is None and fused_moe_workspace(int4, 1024) is None


def test_glm5_tp8_moe_at_32768(glm5_tp8):
    """TritonExperts at M = 32768, top-8, N = 2 x 2048 / 8 = 512, K = 6144, 256 experts."""
    m, topk, n, k, experts = 32768, 8, 512, 6144, 256
    # workspace13 (M, topk, max(N / 2, K)) and workspace2 (M, topk, max(N, K)), bf16, each
    # rounded up to 256 bytes in one uint8 buffer
    assert fused_moe_workspace(glm5_tp8, m).nbytes == 2 * (m * topk * k * 2) == 6_442_450_944
    padded = m * topk + experts * 63  # moe_align_block_size at BLOCK_SIZE_M 64
    assert sizes(moe_stage(glm5_tp8, m)) == {
        "moe.router_logits": ((m, experts), m * experts * 4),  # fp32: glm_moe_dsa
        "moe.shared_output": ((m, k), m * k * 2),
        "moe.topk_weights": ((m, topk), m * topk * 4),
        "moe.topk_ids": ((m, topk), m * topk * 4),
        "moe.output": ((m, k), m * k * 2),
        "moe.a1q": ((m, k), m * k),  # fp8, 1 x 128 groups
        "moe.a1q_scale": ((m, k // 128), m * k // 128 * 4),
        "moe.sorted_token_ids": ((padded,), padded * 4),
        "moe.expert_ids": ((-(-padded // 64),), -(-padded // 64) * 4),
        "moe.a2q": ((m * topk, n // 2), m * topk * n // 2),
        "moe.a2q_scale": ((m * topk, n // 2 // 128), m * topk * 2 * 4),
    }
    assert moe_stage(glm5_tp8, m).nbytes == 1_118_912_496


def test_dsv32_tp4_ep_moe_at_8192(dsv32_tp4_ep):
    """FlashInferExperts with EP over 4 ranks: input unquantized, workspace13 (M, K) bf16 and
    no workspace2; router logits in the model's bf16; FlashInfer's own workspace, by hand from
    getWorkspaceDeviceBufferSizes (E = 64 experts on the rank, R = 8 x 8192 rows, 128-B
    padding): the two permutation maps 2 x 4R, the blocked counts and cumsum 2 x 4 x 64 x 8
    (1024 tokens per block), 4 x 64 x 8192, the expert offsets 8 x 65 (640 padded), the GEMM
    inputs 2R x 7168 and outputs 4R x 2048, two pointer arrays 8 x 64, and the block-scale
    GEMM's quantized A at the largest rows the runner has seen, the profile's 8 x 32768 (the
    scenario's max_num_batched_tokens): 262144 x 7168 + 67520 x 56 x 4; then src_to_dest 4R."""
    m, topk, k, experts = 8192, 8, 7168, 256
    rows = m * topk
    assert fused_moe_workspace(dsv32_tp4_ep, m).nbytes == m * k * 2 == 117_440_512
    workspace = (2 * 4 * rows + 2 * 4 * 64 * 8 + 4 * 64 * m + 640 + 2 * rows * k + 4 * rows * 2048
                 + 2 * 8 * 64 + 32768 * topk * k + 67520 * 56 * 4 + 4 * rows)
    assert workspace == 3_373_457_024
    assert sizes(moe_stage(dsv32_tp4_ep, m)) == {
        "moe.router_logits": ((m, experts), m * experts * 2),
        "moe.shared_output": ((m, k), m * k * 2),
        "moe.topk_weights": ((m, topk), m * topk * 4),
        "moe.topk_ids": ((m, topk), m * topk * 4),
        "moe.output": ((m, k), m * k * 2),
        "moe.flashinfer_workspace": ((workspace,), workspace),
        "moe.experts_to_token_score": ((64, m), 64 * m * 4),
    }


def test_flashinfer_workspace_of_glm52_at_dp16():
    """The 26.21 GiB of https://github.com/vllm-project/vllm/issues/47127: FlashInfer's
    workspace for GLM-5.2 at DP16 with EP, 8192 tokens per DP rank all-gathered (M = 131072, 16
    experts on the rank): 28,139,694,592 B, which torch requests in 2 MiB steps as
    28,141,682,688 B, printed 26.21 GiB; at DP8, 13.11 GiB."""
    sizes_by_dp = {}
    for dp in (8, 16):
        scenario = from_command(f"vllm serve zai-org/GLM-5.2-FP8 -dp {dp} --enable-expert-parallel "
                                "--kv-cache-dtype fp8 --max-num-batched-tokens 8192",
                                gpu_name="H100 SXM 80GB", weights_bytes=40 * 1024**3).scenario
        m = 8192 * dp
        sizes_by_dp[dp] = flashinfer_workspace(scenario, m, m)[0].nbytes
    assert sizes_by_dp == {8: 14_074_194_816, 16: 28_139_694_592}
    requested = -(-sizes_by_dp[16] // (2 << 20)) * (2 << 20)
    assert (requested, f"{requested / 1024**3:.2f}") == (28_141_682_688, "26.21")


def test_bf16_expert_parallel_is_triton_with_whole_experts(dsv32_tp4_ep):
    """bf16 with EP: TritonExperts over whole experts (N = 2 x 2048), no quantized tensors."""
    bf16 = replace(dsv32_tp4_ep, model=replace(dsv32_tp4_ep.model, quantization=None))
    m, topk, k = 8192, 8, 7168
    assert fused_moe_workspace(bf16, m).nbytes == 2 * (m * topk * k * 2)  # max(4096, 7168) = K
    names = {b.name for b in moe_stage(bf16, m).buffers}
    assert "moe.a1q" not in names and "moe.a2q" not in names and "moe.sorted_token_ids" in names


def test_dense_mlp_glm5_tp8_at_32768_is_the_down_gemm(glm5_tp8):
    """intermediate 12288 / 8 = 1536: the down GEMM (its DeepGEMM input and scales, its
    output) outweighs the gate_up GEMM and the activation."""
    m, inner, k = 32768, 1536, 6144
    stage = dense_mlp_stage(glm5_tp8, m)
    assert sizes(stage) == {
        "mlp.act.q": ((m, inner), m * inner),
        "mlp.act.scale": ((m * inner // 128,), m * inner // 128 * 4),  # M is TMA-aligned
        "mlp.down": ((m, k), m * k * 2),
    }
    assert stage.nbytes == 454_557_696
    assert all(b.sized_from_source for b in stage.buffers)  # DeepGEMM's


def test_dense_mlp_dsv32_tp4_at_8192_is_the_activation(dsv32_tp4_ep):
    """intermediate 18432 / 4 = 4608: gate_up (M, 9216) and SiLU's output (M, 4608), bf16."""
    m, inner = 8192, 4608
    assert sizes(dense_mlp_stage(dsv32_tp4_ep, m)) == {
        "mlp.gate_up": ((m, 2 * inner), m * 2 * inner * 2),
        "mlp.act": ((m, inner), m * inner * 2),
    }


def test_tma_aligned_scales_round_each_column_to_16_bytes(glm5_tp8):
    """8191 tokens: each of the 12 scale columns but the last spans 8192 rows."""
    scale = sizes(dense_mlp_stage(glm5_tp8, 8191))["mlp.act.scale"]
    assert scale == ((8191 + 11 * 8192,), (8191 + 11 * 8192) * 4)


def test_no_moe_fields_no_stage():
    shipped = scenarios.load("glm5-fp8-tp8")
    bare = replace(shipped, model=replace(shipped.model, n_routed_experts=None,
                                          first_k_dense_replace=None))
    assert moe_stage(bare, 1024) is None and dense_mlp_stage(bare, 1024) is None


def test_the_fused_moe_workspace_is_folded_into_the_shared_workspace_at_init(glm5_tp8):
    """The fused-MoE workspace is a request of vLLM's one WorkspaceManager buffer, which the
    rank keeps from init: on both paths, init grows over the same model without MoE layers by
    what the MoE's 6 GiB request adds to the buffer's maximum (over the sparse MLA backend's),
    not by the whole; the profile's peak, the sampler's stage here, is the same."""
    budget = Budget(glm5_tp8.gpu.memory_bytes, glm5_tp8.gpu.gpu_memory_utilization, 32768)
    bare = replace(glm5_tp8, model=replace(glm5_tp8.model, n_routed_experts=None,
                                            first_k_dense_replace=None))
    workspace = fused_moe_workspace(glm5_tp8, 32768).nbytes
    attention = workspace_bytes(sparse_mla_workspace_requests(glm5_tp8, 32768))
    assert (workspace, attention) == (6 * 1024 ** 3, 5_888_802_816)
    for path in ("alloc", "workspace"):
        case, without = (VLLM.emulate(SimulatedMemory(), s, FlashMLA(), budget, path, sm_count=132)
                         for s in (glm5_tp8, bare))
        assert case.init_bytes - without.init_bytes == workspace - attention == 553_648_128
        assert case.profile_peak_bytes == without.profile_peak_bytes


def test_the_profile_holds_the_moe_stage_on_the_residual_stream(glm5_tp8,
                                                               rank_before_attention_locals):
    """The emulated vLLM rank's predicted profile peak at 49152 tokens and 256 sequences, where
    the MoE stage is its largest (over the dense MLP's, the indexer's and the sampler's): the
    residual stream (hidden_states and residual; q and the attention's output are freed after
    the layer's attention) under the MoE stage, each of its buffers in its own block. Without
    the DSA layer's attention locals beside the indexer's stage (`rank_before_attention_locals`),
    which with them is the larger here (the locals alone 49152 x 39,616 B, past the MoE's
    1,678,336,000)."""
    tokens, few = 49152, with_vllm(glm5_tp8, max_num_seqs=256)
    budget = Budget(few.gpu.memory_bytes, few.gpu.gpu_memory_utilization, tokens)
    rank = VLLM(SimulatedMemory(), few, FlashMLA(), budget,
                VLLM.new_case("alloc", budget.to_dict(), measured=False), sm_count=132)
    stages = rank.profile_stages(tokens)
    assert [s.name for s in stages] == ["dense_mlp", "indexer", "moe", "sampler"]
    assert max(stages, key=lambda s: s.nbytes) == moe_stage(few, tokens)
    stream = sum(round_size(s.nbytes) for s in activation_specs(few, tokens)
                 if s.name in ("hidden_states", "residual"))
    moe = sum(round_size(b.nbytes) for b in moe_stage(few, tokens).buffers)
    for path in ("alloc", "workspace"):
        case = VLLM.emulate(SimulatedMemory(), few, FlashMLA(), budget, path, sm_count=132)
        assert case.phase == "step"  # the profile done (the step's o_accum runs out)
        assert case.profile_peak_bytes == stream + moe == 2 * tokens * 6144 * 2 + 1_678_336_000




def test_the_router_is_fp32_for_glm5s_architecture_not_its_name(glm5_tp8, dsv32_tp4_ep):
    """vLLM's glm_moe_dsa routes in fp32 (deepseek_v2.py, _get_moe_router_dtype): told by the
    scenario's architecture where it names one, by the model's name only where it does not."""
    renamed = replace(glm5_tp8, model=replace(glm5_tp8.model, name="my-model"))
    assert router_logits_dtype(renamed) == "float32"  # GlmMoeDsaForCausalLM
    glm_named = replace(dsv32_tp4_ep, model=replace(dsv32_tp4_ep.model, name="glm-like"))
    assert router_logits_dtype(glm_named) == "bfloat16"  # DeepseekV32ForCausalLM
    unnamed = replace(glm5_tp8, model=replace(glm5_tp8.model, architecture=None))
    assert router_logits_dtype(unnamed) == "float32"  # "GLM-5 FP8"


def test_the_dp16_glm52_command_runs_out_of_memory_in_the_profile_pass(tmp_path, capsys):
    """That thread's command, completed with DP16 and EP (the recipe's dep mode) and the recipe's
    fp8 cache on Hopper, at vLLM 0.23.0 on an H100 with GLM-5.2's counted weights: the profile
    pass fails on FlashInfer's 26.21 GiB workspace, as the thread's server did."""
    output = tmp_path / "repro.json"
    command = ("vllm serve zai-org/GLM-5.2-FP8 --max-num-seqs 128 --max-model-len 202752 "
               "--max-num-batched-tokens 8192 --tensor-parallel-size 1 --data-parallel-size 16 "
               "--enable-expert-parallel --gpu-memory-utilization 0.95 --kv-cache-dtype fp8")
    assert main(["repro-oom", "--predict", "--serve", command, "--gpu", "H100 SXM 80GB",
                 "--engine-version", "0.23.0", "--paths", "alloc", "--format", "json",
                 "--output", str(output)]) == 0
    capsys.readouterr()
    case = json.loads(output.read_text())["cases"][0]
    assert (case["verdict"], case["phase"], case["oom_buffer"], case["oom_requested_bytes"]) == \
        ("oom", "profile", "moe.flashinfer_workspace", 28_139_694_592)
    readme = " ".join((ROOT / "reports" / "field" / "README.md").read_text().split())
    assert f"the weights counted at {case['weights_bytes'] / 2**30:.2f} GiB per rank" in readme


@pytest.mark.parametrize(("command", "version", "left_out"), [
    ("vllm serve moonshotai/Kimi-K2-Thinking -tp 8 --max-model-len 32768", None,
     "vLLM 0.33.0 runs int4 MoE through Humming"),
    # Humming is preferred on SM90 from 0.32.0; Marlin before
    ("vllm serve moonshotai/Kimi-K2-Thinking -tp 8 --max-model-len 32768", "0.31.0",
     "vLLM 0.31.0 runs int4 MoE through Marlin"),
    ("vllm serve zai-org/GLM-5-FP8 -tp 8 --kv-cache-dtype fp8 --enable-expert-parallel", None,
     "FlashInfer's CUTLASS MoE"),
    ("vllm serve zai-org/GLM-5-FP8 -tp 8 --kv-cache-dtype fp8", None, None),  # Triton's, modelled
])
def test_a_serve_command_says_what_its_moe_layer_leaves_out(command, version, left_out):
    """A "fits" is weighed against what the rank leaves out: an int4 checkpoint's experts
    (Humming or Marlin by version, not modelled), FlashInfer's workspace sized from its source;
    Triton's says nothing."""
    notes = [n for n in from_command(command, gpu_name="H200 SXM 141GB", engine_version=version).notes
             if n.startswith("the MoE layer: ")]
    if left_out is None:
        assert notes == []
    else:
        assert len(notes) == 1 and left_out in notes[0]
