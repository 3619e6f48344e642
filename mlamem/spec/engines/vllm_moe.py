"""vLLM 0.33.0's MoE layer and dense MLP layers on Hopper (SM90), as the stages a rank allocates
in the profile pass (`v1/worker/gpu_model_runner.py`, `profile_run` -> `_dummy_run(max_num_tokens)`)
and in every step (spec/engines/rank_buffers.py).

The fused-MoE experts vLLM picks on Hopper (`moe_backend`):
- block fp8 (128 x 128, DeepSeek's own fp8): `model_executor/layers/fused_moe/oracle/fp8.py`,
  `_get_priority_backends`: "On Hopper for Block Fp8, prefer Triton for TP and FI CUTLASS for
  EP": TRITON (`TritonExperts`) without expert parallelism, FLASHINFER_CUTLASS
  (`FlashInferExperts`) with it. DeepGEMM (`TritonOrDeepGemmExperts`) only where the user sets
  VLLM_USE_DEEP_GEMM or VLLM_MOE_USE_DEEP_GEMM (`select_fp8_moe_backend`: `envs.is_set`);
  their default of 1 leaves the order as above;
- bf16: `oracle/unquantized.py`, `_get_priority_backends`: on SM90 FlashInfer's kernels move
  behind TRITON, so `TritonExperts` with or without expert parallelism;
- int4 (compressed-tensors, AWQ, GPTQ): `oracle/int_wna16.py`, `_get_priority_backends`, through
  `prioritize_humming` (Humming ahead of Marlin on SM90 from 0.32.0; Marlin first before):
  HUMMING or MARLIN, neither modelled here.

Without attention data parallelism no token crosses ranks (`all2all_utils.py`,
`maybe_make_prepare_finalize`: `make_moe_prepare_and_finalize_no_dp_ep`), with or without
--enable-expert-parallel (EP = TP x DP ranks, `config.py` `FusedMoEParallelConfig.make`); the
default all2all backend, allgather_reducescatter (`config/parallel.py`), all-gathers every DP
rank's tokens into the experts where DP > 1 (`prepare_finalize/naive_dp_ep.py` prepare,
`distributed/device_communicators/all2all.py` AgRsAll2AllManager.dispatch), unchunked
(`forward_context.py` DPMetadata.sp_local_sizes), every DP rank running as many tokens as the
largest (`expert_tokens`). vLLM 0.33.0 runs the experts over all M tokens at once
(`modular_kernel.py`, `FusedMoEKernelModularImpl._fused_experts`: `M_chunk = M_full`; there is no
VLLM_FUSED_MOE_CHUNK_SIZE in its `envs.py`).

The experts' two workspaces come from the process-wide `WorkspaceManager`
(`v1/worker/workspace.py`, `get_simultaneous`): one uint8 buffer, each part rounded up to 256
bytes, grown to the largest request and kept for the life of the process (`fused_moe_workspace`).
The rest of the MoE stage is the tensors live inside the experts' second GEMM, the layer's
peak: the router logits, the shared experts' output, the top-k weights and ids, the layer's
output, the quantized input and its scales, the expert alignment and the quantized activation.

Older versions, by the scenario's [vllm].engine_version (each read from that version's wheel):
- 0.10.2-0.13.0: without expert parallelism Fp8MoEMethod.apply (`quantization/fp8.py`) and the
  unquantized method call `fused_experts`, whose `fused_experts_impl` (`fused_moe.py`) allocates
  cache13 (M, top-k, max(N, K)) and intermediate_cache2 (M x top-k, N / 2) per call
  (torch.empty): a transient of the MoE stage, not resident. From 0.14.0 every method runs the
  modular kernel (`self.kernel`), its workspace the WorkspaceManager's (from 0.13.0);
- VLLM_FUSED_MOE_CHUNK_SIZE (`envs.py`) bounds M: 32768 tokens in 0.10.2-0.11.0, 16384 in
  0.12.0-0.17.0, gone from 0.18.0; the modular kernel over more than one chunk requests the
  whole (M, K) output beside the chunk's workspaces (`_allocate_buffers`);
- VLLM_USE_DEEP_GEMM defaults to 1 from 0.11.0 (0 in 0.10.2), and before 0.17.0 the block-fp8
  experts run through DeepGEMM where deep_gemm is installed (`fused_experts`: allow_deep_gemm;
  0.14.0-0.16.0 `oracle/fp8.py`, DEEPGEMM ahead of TRITON): sized here as Triton's, said in
  `moe_note`;
- expert parallelism before 0.14.0 (FlashInfer's CUTLASS MoE outside the modular kernel, the
  modular kernel's own SharedResizableBuffer in 0.11.0-0.12.0) is not read.
"""

from __future__ import annotations

from mlamem.spec.engines.rank_buffers import DTYPE_BYTES, RankBuffer, Stage
from mlamem.spec.engines.vllm import engine_series, scenario_rules
from mlamem.spec.scenario import Scenario

VERSION = "vLLM 0.33.0"
FUSED_MOE = "model_executor/layers/fused_moe"
QUANT_BLOCK = 128  # block fp8: values per activation scale (1 x 128 groups)
WORKSPACE_ALIGN = 256  # v1/worker/workspace.py, get_simultaneous: round_up(actual, 256)
TMA_ALIGN_BYTES = 16  # utils/deep_gemm.py, get_tma_aligned_size: 16 // element_size

# the backends vLLM 0.33.0 picks on Hopper (moe_backend), by the values of its Fp8MoeBackend
# (fused_moe/oracle/fp8.py); Humming's buffers are not modelled
TRITON, FLASHINFER_CUTLASS, HUMMING, MARLIN = "TRITON", "FLASHINFER_CUTLASS", "HUMMING", "MARLIN"
INT_SCHEMES = ("int-pack", "awq", "gptq")
# by vLLM version (module docstring): the first series of each rule
MODULAR_KERNEL_FROM = (0, 14)  # quantization/fp8.py, Fp8MoEMethod.apply: self.kernel
DEEP_GEMM_DEFAULT_FROM = (0, 11)  # envs.py VLLM_USE_DEEP_GEMM "1"
TRITON_PREFERRED_FROM = (0, 17)  # oracle/fp8.py _get_priority_backends: "prefer Triton for TP"
CHUNK_16K_FROM = (0, 12)  # envs.py VLLM_FUSED_MOE_CHUNK_SIZE 16 * 1024; 32768 before
UNCHUNKED_FROM = (0, 18)  # envs.py: no VLLM_FUSED_MOE_CHUNK_SIZE
HUMMING_PREFERRED_FROM = (0, 32)  # oracle/int_wna16.py _get_priority_backends: prioritize_humming
# on SM90 (read in the 0.23.0-0.33.0 wheels); MARLIN first before it
INT_BACKENDS = {HUMMING: ("Humming", f"{FUSED_MOE}/oracle/int_wna16.py, prioritize_humming"),
                MARLIN: ("Marlin", f"{FUSED_MOE}/experts/marlin_moe.py")}


def _source(path: str, function: str) -> str:
    return f"{VERSION} {path}, {function}"


def scenario_version(scenario: Scenario) -> str:
    """The scenario's vLLM version as given ([vllm].engine_version, else the default)."""
    return scenario_rules(scenario).version


def fused_moe_chunk_tokens(scenario: Scenario) -> int | None:
    """VLLM_FUSED_MOE_CHUNK_SIZE's default in the scenario's vLLM (envs.py): the most tokens the
    experts run at once; None from 0.18.0, which runs all of them."""
    series = engine_series(scenario)
    if series >= UNCHUNKED_FROM:
        return None
    return 16 * 1024 if series >= CHUNK_16K_FROM else 32768


def moe_workspace_resident(scenario: Scenario) -> bool:
    """The experts' workspace is the WorkspaceManager's, kept for the process's life (0.14.0
    on: the modular kernel); before, `fused_experts_impl` allocates it per call."""
    return engine_series(scenario) >= MODULAR_KERNEL_FROM


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def expert_parallel_size(scenario: Scenario) -> int:
    """EP ranks: every TP x DP rank with --enable-expert-parallel, else 1 (`config.py`,
    `FusedMoEParallelConfig.make`: `ep_size = tp_size` after flattening DP into TP)."""
    parallel = scenario.parallel
    return parallel.tensor_parallel if parallel.expert_parallel else 1


def moe_backend(scenario: Scenario) -> str | None:
    """The experts vLLM 0.33.0 picks on Hopper for the checkpoint and layout (module
    docstring; int4's by the scenario's version); None for a scheme whose backend is not read
    here."""
    scheme = scenario.model.quantization
    if scheme is None:
        return TRITON
    if scheme == "fp8-block":
        return FLASHINFER_CUTLASS if expert_parallel_size(scenario) > 1 else TRITON
    if scheme in INT_SCHEMES:
        return HUMMING if engine_series(scenario) >= HUMMING_PREFERRED_FROM else MARLIN
    return None


def unmodelled_reason(scenario: Scenario) -> str | None:
    """Why `moe_stage` gives no stage for a scenario with MoE fields; None where it gives one."""
    if not scenario.model.has_moe:
        return None
    backend = moe_backend(scenario)
    if backend in INT_BACKENDS:
        name, source = INT_BACKENDS[backend]
        return (f"vLLM {scenario_version(scenario)} runs int4 MoE through {name} on Hopper "
                f"({source}): its buffers are not modelled")
    if backend is None:
        return (f"the fused-MoE backend {VERSION} picks for {scenario.model.quantization} "
                f"checkpoints is not modelled")
    if expert_parallel_size(scenario) > 1 and not moe_workspace_resident(scenario):
        return (f"the experts vLLM {scenario_version(scenario)} runs with expert parallelism "
                f"(before the modular kernel of 0.14.0) are not read")
    return None


def moe_note(scenario: Scenario) -> str | None:
    """What the MoE stage leaves out, in one line, where it leaves anything out."""
    if (reason := unmodelled_reason(scenario)) is not None:
        return f"the MoE layer: {reason}"
    if (scenario.model.has_moe and scenario.model.quantization == "fp8-block"
            and DEEP_GEMM_DEFAULT_FROM <= engine_series(scenario) < TRITON_PREFERRED_FROM):
        return (f"the MoE layer: vLLM {scenario_version(scenario)} runs block-fp8 experts "
                "through DeepGEMM where deep_gemm is installed (envs.py VLLM_USE_DEEP_GEMM "
                "defaults to 1), whose workspace is sized here as Triton's")
    if scenario.model.has_moe and moe_backend(scenario) == FLASHINFER_CUTLASS:
        return (f"the MoE layer: {VERSION} runs block-fp8 experts with expert parallelism "
                f"through FlashInfer's CUTLASS MoE ({FUSED_MOE}/experts/flashinfer_cutlass_moe.py)"
                f"; its per-call workspace is sized from FlashInfer {FLASHINFER}'s source "
                "(flashinfer_workspace), not measured with FlashInfer here")
    return None


def _moe_dims(scenario: Scenario) -> tuple[int, int, int]:
    """(N = w13's rows, K = hidden, top-k) of the rank's fused experts: n_routed_experts / EP
    whole experts with expert parallelism, else every expert sliced by TP x DP."""
    model = scenario.model
    tp = 1 if expert_parallel_size(scenario) > 1 else scenario.parallel.tensor_parallel
    return 2 * model.moe_intermediate_size // tp, model.hidden_size, model.num_experts_per_tok


def _chunk(scenario: Scenario, tokens: int) -> int:
    """The tokens the experts run at once: all of them, or VLLM_FUSED_MOE_CHUNK_SIZE's."""
    return min(tokens, fused_moe_chunk_tokens(scenario) or tokens)


def expert_tokens(scenario: Scenario, tokens: int) -> int:
    """The tokens the experts run on one rank: its own, or with attention data parallelism every
    DP rank's, all-gathered (module docstring)."""
    return tokens * scenario.parallel.attention_data_parallel


def transient_workspace(scenario: Scenario, tokens: int) -> list[RankBuffer]:
    """vLLM 0.10.2-0.13.0's `fused_experts_impl` (fused_moe.py) caches, allocated per call at
    M = min(tokens, VLLM_FUSED_MOE_CHUNK_SIZE): cache13 (M, top-k, max(N, K)) and
    intermediate_cache2 (M x top-k, N / 2), bf16; none from 0.14.0 (`fused_moe_workspace`)."""
    if (not scenario.model.has_moe or unmodelled_reason(scenario)
            or moe_workspace_resident(scenario)):
        return []
    tokens = expert_tokens(scenario, tokens)
    (n, k, topk), m = _moe_dims(scenario), _chunk(scenario, tokens)
    source = (f"vLLM {scenario_version(scenario)} {FUSED_MOE}/fused_moe.py, fused_experts_impl "
              "(torch.empty)")
    return [RankBuffer("moe.cache13", (m * topk * max(n, k),), "bfloat16", source),
            RankBuffer("moe.intermediate_cache2", (m * topk, n // 2), "bfloat16", source)]


def fused_moe_workspace(scenario: Scenario, tokens: int) -> RankBuffer | None:
    """The experts' workspace13 and workspace2 as the WorkspaceManager holds them: one uint8
    buffer of both, each rounded up to 256 bytes (`FusedMoEKernelModularImpl._allocate_buffers`,
    `get_simultaneous`), kept for the process's life, at the chunk's M where the version chunks
    (with the whole (M, K) output beside them over more than one chunk); None where no stage is
    modelled or the version allocates it per call (`transient_workspace`)."""
    if (not scenario.model.has_moe or unmodelled_reason(scenario)
            or not moe_workspace_resident(scenario)):
        return None
    n, k, topk = _moe_dims(scenario)
    tokens = expert_tokens(scenario, tokens)
    m, bf16 = _chunk(scenario, tokens), DTYPE_BYTES["bfloat16"]
    if moe_backend(scenario) == TRITON:  # experts/triton_moe.py, TritonExperts.workspace_shapes
        workspace13 = max(m * topk * max(n // 2, k), m * k)  # shared with the (M, K) output
        workspace2 = m * topk * max(n, k)
        function = "TritonExperts.workspace_shapes, FusedMoEKernelModularImpl._allocate_buffers"
        path = f"{FUSED_MOE}/experts/triton_moe.py"
    else:  # experts/flashinfer_cutlass_moe.py, FlashInferExperts.workspace_shapes
        workspace13, workspace2 = m * k, 0
        function = "FlashInferExperts.workspace_shapes, FusedMoEKernelModularImpl._allocate_buffers"
        path = f"{FUSED_MOE}/experts/flashinfer_cutlass_moe.py"
    parts = [workspace13, workspace2] + ([tokens * k] if m < tokens else [])  # the output
    size = sum(_round_up(part * bf16, WORKSPACE_ALIGN) for part in parts)
    return RankBuffer("moe.workspace", (size,), "uint8", _source(path, function))


def router_logits_dtype(scenario: Scenario) -> str:
    """The gate's output: fp32 for GLM-5's configs (`models/deepseek_v2.py`,
    `_get_moe_router_dtype`: model_type glm_moe_dsa, whose class is GlmMoeDsaForCausalLM; a
    scenario that names no architecture is told by the model's name), else the model's bf16
    (`router/gate_linear.py`, `GateLinear.forward`, out_dtype None)."""
    model = scenario.model
    glm = (model.architecture == "GlmMoeDsaForCausalLM" if model.architecture
           else "glm" in model.name.lower())
    return "float32" if glm else "bfloat16"


def _routing_buffers(scenario: Scenario, tokens: int) -> list[RankBuffer]:
    """What the MoE layer holds through the experts' call before they run: the router logits,
    the shared experts' output (run first, on the main stream, above
    VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD = 256 tokens), the top-k weights and ids, and
    the layer's output."""
    model, (_, hidden, topk) = scenario.model, _moe_dims(scenario)
    runner = f"{FUSED_MOE}/runner/moe_runner.py"
    buffers = [RankBuffer("moe.router_logits", (tokens, model.n_routed_experts),
                          router_logits_dtype(scenario),
                          _source(runner, "MoERunner._forward_impl (self.gate)"))]
    if model.n_shared_experts:
        buffers.append(RankBuffer(
            "moe.shared_output", (tokens, hidden), "bfloat16",
            _source(f"{FUSED_MOE}/runner/shared_experts.py", "SharedExperts.forward "
                    "(SharedExpertsOrder.NO_OVERLAP), DeepseekV2MLP's down_proj"),
            sized_from_source=model.quantization == "fp8-block"))
    topk_source = _source(f"{FUSED_MOE}/router/grouped_topk_router.py", "grouped_topk")
    buffers += [RankBuffer("moe.topk_weights", (tokens, topk), "float32", topk_source),
                RankBuffer("moe.topk_ids", (tokens, topk), "int32", topk_source),
                RankBuffer("moe.output", (tokens, hidden), "bfloat16",
                           _source(f"{FUSED_MOE}/modular_kernel.py",
                                   "FusedMoEKernelModularImpl.apply (hidden_states.new_empty)"))]
    return buffers


def _triton_buffers(scenario: Scenario, tokens: int) -> list[RankBuffer]:
    """TritonExperts.apply at its second GEMM: the expert alignment (BLOCK_SIZE_M 64 of
    `get_default_config` for block fp8 and bf16 above 64 tokens) and, for block fp8, the input
    quantized in prepare and the activation quantized after SiLU."""
    n, hidden, topk = _moe_dims(scenario)
    align = f"{FUSED_MOE}/moe_align_block_size.py"
    block_m = 64  # fused_moe.py, get_default_config: BLOCK_SIZE_M 64 where M > 64
    padded = tokens * topk + scenario.model.n_routed_experts * (block_m - 1)
    buffers = [RankBuffer("moe.sorted_token_ids", (padded,), "int32",
                          _source(align, "moe_align_block_size")),
               RankBuffer("moe.expert_ids", (-(-padded // block_m),), "int32",
                          _source(align, "moe_align_block_size"))]
    if scenario.model.quantization != "fp8-block":
        return buffers
    quant = _source(f"{FUSED_MOE}/utils.py", "moe_kernel_quantize_input (per_token_group_quant_fp8)")
    act = _source(f"{FUSED_MOE}/experts/triton_moe.py", "TritonExperts.apply (the activation's "
                  "per-block quantization)")
    rows = tokens * topk
    return [RankBuffer("moe.a1q", (tokens, hidden), "float8_e4m3fn", quant),
            RankBuffer("moe.a1q_scale", (tokens, hidden // QUANT_BLOCK), "float32", quant),
            *buffers,
            RankBuffer("moe.a2q", (rows, n // 2), "float8_e4m3fn", act),
            RankBuffer("moe.a2q_scale", (rows, n // 2 // QUANT_BLOCK), "float32", act)]


def _gathered_buffers(scenario: Scenario, gathered: int) -> list[RankBuffer]:
    """With attention data parallelism, what prepare's all-gather makes of every DP rank's
    tokens beside the rank's own (`naive_dp_ep.py` prepare, all2all.py
    AgRsAll2AllManager.dispatch: all_gatherv of the input, its scales, the top-k weights and
    ids). The input is the bf16 hidden state for FlashInfer's experts (unquantized), the
    quantized input and its scales for Triton's (gathered in `_triton_buffers`)."""
    if gathered == 0 or scenario.parallel.attention_data_parallel == 1:
        return []
    _, hidden, topk = _moe_dims(scenario)
    source = _source(f"{FUSED_MOE}/prepare_finalize/naive_dp_ep.py", "prepare (all_gatherv)")
    inputs = ([RankBuffer("moe.gathered_hidden", (gathered, hidden), "bfloat16", source)]
              if moe_backend(scenario) == FLASHINFER_CUTLASS else [])
    return [*inputs, RankBuffer("moe.gathered_topk_weights", (gathered, topk), "float32", source),
            RankBuffer("moe.gathered_topk_ids", (gathered, topk), "int32", source)]


FLASHINFER = "0.7.2.post1"  # vLLM 0.33.0's pin (flashinfer-python==0.7.2.post1); 0.6.12's sizing is the same
FLASHINFER_ALIGN = 128  # csrc/nv_internal/tensorrt_llm/common/workspace.h kCudaMemAlign


def flashinfer_workspace(scenario: Scenario, m: int, m_seen: int) -> list[RankBuffer]:
    """FlashInfer's CUTLASS MoE for block fp8 on SM90 (bf16 activations, fp8 weights), per call
    over M = `m` tokens: the workspace its binding allocates (flashinfer_cutlass_fused_moe_binding.cu
    getWorkspaceInfo: the runner's getWorkspaceSize, cutlass_fused_moe_kernels.cuh
    getWorkspaceDeviceBufferSizes, and src_to_dest_map, each padded to 128 B), and core.py
    cutlass_fused_moe's experts_to_token_score. No TMA warp-specialised GEMM for bf16 x fp8, so
    its GEMM, finalize and FP4 terms are 0; the block-scale GEMM quantizes A itself
    (fp8_blockscale_gemm.cu getWorkspaceSizeBase), its rows the largest top-k x M the shared
    runner has seen (`m_seen`: the profile pass's), never less."""
    n, k, experts = scenario.model.moe_intermediate_size, scenario.model.hidden_size, \
        scenario.model.n_routed_experts // expert_parallel_size(scenario)
    topk, rows = scenario.model.num_experts_per_tok, scenario.model.num_experts_per_tok * m
    per_block = next((t for t in (32, 64, 128, 256, 512, 1024) if -(-m // t) * experts <= t), 1024)
    blocks = -(-m // per_block)

    def gemm(k_in: int) -> int:  # getWorkspaceSizeBase: the GEMM's fp8 A and its fp32 scales
        seen = max(_round_up(rows, 4), _round_up(topk * m_seen, 4))
        padded = (rows + experts * 31) // 32 * 32  # deep_gemm compute_padded_offset
        return seen * k_in + padded * -(-k_in // QUANT_BLOCK) * 4

    parts = [4 * rows, 4 * rows,  # the permuted rows and their experts
             4 * experts * blocks, 4 * experts * blocks, 4 * experts * m,  # the blocked counts
             8 * (experts + 1),  # each expert's first token
             2 * rows * max(k, n), 4 * rows * n,  # the GEMMs' overlapped inputs and outputs
             8 * experts, 8 * experts,  # the alpha scale pointers
             max(gemm(k), gemm(n))]  # fc1 over K, fc2 over N
    size = (_round_up(sum(_round_up(p, FLASHINFER_ALIGN) for p in parts), FLASHINFER_ALIGN)
            + _round_up(4 * rows, FLASHINFER_ALIGN))
    binding = (f"flashinfer {FLASHINFER} csrc/fused_moe/cutlass_backend/"
               "flashinfer_cutlass_fused_moe_binding.cu")
    return [RankBuffer("moe.flashinfer_workspace", (size,), "int8",
                       f"{binding}, getWorkspaceInfo (cutlass_fused_moe_kernels.cuh "
                       "getWorkspaceDeviceBufferSizes)", sized_from_source=True),
            RankBuffer("moe.experts_to_token_score", (experts, m), "float32",
                       f"flashinfer {FLASHINFER} fused_moe/core.py, cutlass_fused_moe",
                       sized_from_source=True)]


def moe_stage(scenario: Scenario, tokens: int) -> Stage | None:
    """The MoE layer's tensors live at its peak, inside the experts' second GEMM, beside the
    resident workspace (`fused_moe_workspace`); None for a model without MoE fields or where
    `unmodelled_reason` names what is missing. With attention data parallelism the experts run
    on every DP rank's tokens (`expert_tokens`, `_gathered_buffers`). FlashInfer's CUTLASS
    experts (block fp8 with expert parallelism) take the input unquantized
    (`FlashInferExperts.expects_unquantized_inputs`) and allocate their workspace per call
    (`flashinfer_workspace`)."""
    if not scenario.model.has_moe or unmodelled_reason(scenario):
        return None
    m = expert_tokens(scenario, tokens)
    buffers = _routing_buffers(scenario, tokens) + _gathered_buffers(scenario, m)
    if moe_backend(scenario) == TRITON:
        buffers += _triton_buffers(scenario, m)
    else:
        seen = expert_tokens(scenario, scenario.serving.max_num_batched_tokens)
        buffers += flashinfer_workspace(scenario, m, seen)
    return Stage("moe", tuple(buffers + transient_workspace(scenario, tokens)))


def _tma_scale_elements(tokens: int, features: int) -> int:
    """The fp32 activation scales DeepGEMM takes: column-major, each column's tokens rounded up
    to 16 bytes (`quantization/utils/fp8_utils.py`, `per_token_group_quant_fp8` with
    tma_aligned_scales: `torch.empty_strided((m, sf_k), (1, tma_aligned_m))`'s storage)."""
    groups, aligned = features // QUANT_BLOCK, _round_up(tokens, TMA_ALIGN_BYTES // 4)
    return tokens + (groups - 1) * aligned


def _linear_input(name: str, tokens: int, features: int, fp8: bool) -> list[RankBuffer]:
    """A block-fp8 Linear's input quantized for DeepGEMM (`kernels/linear/scaled_mm/deep_gemm.py`,
    `DeepGemmFp8BlockScaledMMKernel`, its QuantFP8 with column-major TMA-aligned scales); a
    bf16 Linear's takes its input as it is."""
    if not fp8:
        return []
    source = _source("kernels/linear/scaled_mm/deep_gemm.py",
                     "DeepGemmFp8BlockScaledMMKernel (QuantFP8, per_token_group_quant_fp8)")
    return [RankBuffer(f"{name}.q", (tokens, features), "float8_e4m3fn", source, True),
            RankBuffer(f"{name}.scale", (_tma_scale_elements(tokens, features),), "float32",
                       source, True)]


def _linear_output(name: str, tokens: int, features: int, fp8: bool) -> RankBuffer:
    if fp8:
        return RankBuffer(name, (tokens, features), "bfloat16", _source(
            "kernels/linear/scaled_mm/deep_gemm.py",
            "DeepGemmFp8BlockScaledMMKernel.apply_block_scaled_mm (torch.empty)"), True)
    return RankBuffer(name, (tokens, features), "bfloat16",
                      _source("model_executor/layers/linear.py", "UnquantizedLinearMethod.apply"))


def dense_mlp_stage(scenario: Scenario, tokens: int) -> Stage | None:
    """The first_k_dense_replace layers' MLP (`models/deepseek_v2.py`, `DeepseekV2MLP.forward`:
    gate_up_proj, SiluAndMul, down_proj at intermediate_size / TP) at its largest moment: the
    gate_up GEMM (its input quantized, its output), the activation (gate_up and SiLU's output,
    `layers/activation.py` `SiluAndMul.forward_cuda`) or the down GEMM (its input, quantized
    for block fp8, and its output). Block-fp8 GEMMs run through DeepGEMM on Hopper above 32
    tokens, which cannot load here: their buffers are sized from the source. None without the
    fields."""
    model = scenario.model
    if not (model.first_k_dense_replace and model.intermediate_size and model.hidden_size):
        return None
    fp8 = model.quantization == "fp8-block"
    hidden = model.hidden_size
    inner = model.intermediate_size // scenario.parallel.attention_tensor_parallel
    gate_up = _linear_output("mlp.gate_up", tokens, 2 * inner, fp8)
    act = RankBuffer("mlp.act", (tokens, inner), "bfloat16", _source(
        "model_executor/layers/activation.py", "SiluAndMul.forward_cuda"))
    moments = [
        [*_linear_input("mlp.x", tokens, hidden, fp8), gate_up],
        [gate_up, act],
        [*(_linear_input("mlp.act", tokens, inner, True) if fp8 else [act]),
         _linear_output("mlp.down", tokens, hidden, fp8)],
    ]
    largest = max(moments, key=lambda buffers: sum(b.nbytes for b in buffers))
    return Stage("dense_mlp", tuple(largest))
