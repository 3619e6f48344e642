"""SGLang 0.5.23's chunked-prefill step beyond attention, as stages (no torch): the MoE layer,
the dense MLP of the first layers, the DSA indexer, the sampler and the MTP drafter.

Read from SGLang 0.5.23's source (the wheel; paths under sglang/srt/ unless they start with
sglang/). What SGLang runs on Hopper for a block-fp8 checkpoint:

- the MoE runner: `--moe-runner-backend auto` and `--moe-a2a-backend none` by default
  (arg_groups/fields/exec_.py); on Hopper no override moves them (arg_groups/overrides.py,
  _deepseek_moe_quant_resolution picks flashinfer_trtllm on SM100 only), so Fp8MoEMethod picks
  Triton (layers/quantization/fp8.py, create_moe_runner: DeepGEMM only where
  is_deepgemm_moe_runner_backend_enabled, i.e. with a DeepEP, Mooncake or NIXL all-to-all). With
  `--ep-size` alone the a2a stays "none": the same Triton runner, each rank holding its share
  of the experts at the full intermediate width and every token's top-k rows
  (token_dispatcher/standard.py). DeepEP (and with it DeepGEMM's grouped GEMM) is not modelled:
  the scenario names no all-to-all backend.
- the Triton runner's buffers (layers/moe/moe_runner/triton_utils/fused_moe.py,
  _fused_moe_kernel_sequence), in one shot, without chunking: intermediate_cache1
  (T*k, 2I), the fp8 quantized input (sglang/kernels/ops/moe/fused_moe_triton_kernels.py,
  invoke_fused_moe_kernel: sglang_per_token_group_quant_fp8), intermediate_cache2 (T*k, I),
  intermediate_cache3 (T, k, H) and the quantized down-projection input; inplace, so the
  output is the input (MoeRunnerConfig.inplace).
- the router: fp32 logits (models/deepseek_v2.py, MoEGate.forward) and the top-k weights and ids
  (layers/moe/topk.py, biased_grouped_topk_gpu), with the fused shared expert's slot appended.
- the shared expert: fused into the MoE as one more expert where
  DeepseekV2ForCausalLM.shared_experts_fusion_disable_reason finds no reason (DeepSeek-V3's
  and GLM-5's architectures, 256 routed experts, one shared, no expert parallelism on CUDA);
  else a DeepseekV2MLP run before the routed experts, its output held through them
  (DeepseekV2MoE.forward_normal: the runner is inplace, so the shared expert goes first).
- the dense MLP of the first `first_k_dense_replace` layers and the shared expert: DeepseekV2MLP
  through block-fp8 linears on DeepGEMM (layers/quantization/fp8_utils.py,
  deepgemm_w8a8_block_fp8_linear_with_fallback: the input quantized with column-major,
  TMA-aligned fp32 scales).
- the DSA indexer (layers/attention/dsa/dsa_indexer.py, Indexer._get_topk_ragged): its fp8
  query and head weights, the indexer keys gathered for the context, the fp32 logits of the
  query rows against the context (DeepGEMM's fp8_mqa_logits, rows padded to 256 columns:
  layers/attention/mqa_logits_utils.py), row-chunked to a budget of free memory, and each
  chunk's top-k. The step's top-k result itself is the indices mlamem's rank allocates at init
  (runtime/inputs.py make_inputs): not counted again.
- the sampler: the logits of each request's last token only (layers/logits_processor.py), over
  the vocabulary gathered from the TP ranks, then softmax (layers/sampler.py).
- the MTP drafter (speculative decoding): its one decoder layer runs the step's tokens again
  with the target's hidden states held (models/deepseek_nextn.py, DeepseekModelNextN.forward).

The step's tokens are `--chunked-prefill-size`; its context, which the indexer scores, is the
longest prompt's (`max_model_len`: the last chunk of it is the step's worst case).

Two rules read config.json's `architectures[0]` (the shared expert's fusion, and the indexer's
fused query path, which GLM-5's interleaved indexer rope takes): where the scenario's model does
not name it, neither is claimed. Not modelled: DeepEP's all-to-all and DeepGEMM's grouped GEMM
(`--moe-a2a-backend deepep`); the padded rows of a tuned down-projection config with USE_TMA
(triton 3.5.1's H200 config for 257 experts at N 256: at most (E + 1) x (BLOCK_SIZE_M - 1) rows
more in cache1 and cache2); moe_align_block_size's sorted ids (int32, T x k plus (E + 1) x
(BLOCK_SIZE_M - 1): under 1 MiB at 8192 tokens); a config with router_fp32 (an fp32 copy of
the hidden states for the gate); the draft layer's own fusion (taken as the target's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from mlamem.spec.engines.rank_buffers import RankBuffer, Stage

if TYPE_CHECKING:
    from mlamem.spec.scenario import Scenario

VERSION = "0.5.23"  # the SGLang version these rules were read from
FP8_BLOCK = "fp8-block"  # the one checkpoint quantization these stages model (and bf16: None)
GROUP = 128  # the fp8 block's per-token-group width (weight_block_size[1])
TMA_ROWS = 4  # column-major scales pad their rows to 4 (create_per_token_group_quant_fp8_output_scale)
VOCAB_PADDING = 64  # layers/vocab_parallel_embedding.py, DEFAULT_VOCAB_PADDING_SIZE
# the architectures whose shared expert fuses (DeepseekV2ForCausalLM.fused_shared_experts_architecture
# and GlmMoeDsaForCausalLM's), and the routed-expert counts the fusion is validated for
FUSING_ARCHITECTURES = ("DeepseekV3ForCausalLM", "GlmMoeDsaForCausalLM")
FUSING_EXPERT_COUNTS = (256,)  # 384 (Kimi-K2.5) fuses only for a Quark MXFP4 checkpoint
# layers/attention/mqa_logits_utils.py
LOGITS_ROW_ALIGN = 256  # MQA_LOGITS_ROW_ALIGN_ELEMS: DeepGEMM pads a logits row to 1024 bytes
LOGITS_STATIC_SKIP_ELEMS = 8_000_000  # MQA_LOGITS_STATIC_SKIP_ELEMS: below this, never chunked
LOGITS_TOTAL_MEM_FRACTION = 0.3  # MQA_LOGITS_TOTAL_MEM_FRACTION
LOGITS_FREE_MEM_FRACTION = 0.2  # environ.py SGLANG_DSA_MQA_LOGITS_FREE_MEM_FRACTION's default
INDEX_K_SCALE_BYTES = 4  # one fp32 scale per gathered indexer key (dsa_index_k_cache.py)


def source(path: str, function: str) -> str:
    """A buffer's citation: SGLang 0.5.23, its file and function."""
    return f"SGLang {VERSION} {path}, {function}"


FUSED_MOE = source("layers/moe/moe_runner/triton_utils/fused_moe.py", "_fused_moe_kernel_sequence")
MOE_QUANT = source("sglang/kernels/ops/moe/fused_moe_triton_kernels.py", "invoke_fused_moe_kernel")
GATE = source("models/deepseek_v2.py", "MoEGate.forward")
TOPK = source("layers/moe/topk.py", "biased_grouped_topk_gpu")
LOCAL_IDS = source("layers/moe/token_dispatcher/standard.py", "StandardDispatcher.dispatch")
SHARED = source("models/deepseek_v2.py", "DeepseekV2MoE.forward_normal")
MLP = source("models/deepseek_v2.py", "DeepseekV2MLP.forward")
LINEAR = source("layers/quantization/fp8_utils.py", "deepgemm_w8a8_block_fp8_linear_with_fallback")
DP_GATHER = source("layers/dp_attention.py", "dp_gather_partial")
INDEXER = source("layers/attention/dsa/dsa_indexer.py", "Indexer._get_topk_ragged")
INDEX_K = source("sglang/kernels/ops/kvcache/dsa_index_k_cache.py", "_get_k_and_s_triton")
LOGITS_ROWS = source("layers/attention/mqa_logits_utils.py", "mqa_logits_row_bytes")
TOPK_OUT = source("layers/attention/dsa/dsa_topk_backend.py", "DSATopKBackend.topk_transform")
LM_HEAD = source("layers/logits_processor.py", "LogitsProcessor._get_logits")
SAMPLER = source("layers/sampler.py", "Sampler.forward")
NEXTN = source("models/deepseek_nextn.py", "DeepseekModelNextN.forward")


@dataclass(frozen=True)
class StepShape:
    """What SGLang's step sizes its buffers by, on one rank (the model as config.json gives it)."""

    tokens: int  # the step's tokens on this rank (--chunked-prefill-size)
    context_tokens: int  # the prompt the step's chunk ends (the indexer's columns)
    hidden_size: int
    tensor_parallel: int  # SGLang's tp_size (all ranks, attention DP included)
    attention_data_parallel: int = 1
    expert_parallel: bool = False  # --ep-size tp_size (EP over every rank)
    quantization: str | None = FP8_BLOCK  # a scheme of spec/models/quantization.py; None: bf16
    architecture: str | None = None  # config.json architectures[0]; None: not known
    vocab_size: int | None = None
    intermediate_size: int | None = None  # the dense MLP's
    moe_intermediate_size: int | None = None
    n_routed_experts: int | None = None
    num_experts_per_tok: int | None = None
    n_shared_experts: int | None = None
    first_k_dense_replace: int = 0
    index_n_heads: int | None = None  # the DSA indexer; None: a dense-MLA model
    index_head_dim: int | None = None
    index_topk: int | None = None
    speculative: bool = False  # MTP (EAGLE) drafting on
    requests: int = 1  # requests in the step (a chunked prefill of one request: 1)

    @property
    def moe_tokens(self) -> int:
        """Tokens the MLP layers see: the attention-DP group's, gathered (DP_GATHER)."""
        return self.tokens * self.attention_data_parallel

    @property
    def moe_ep_size(self) -> int:
        return self.tensor_parallel if self.expert_parallel else 1

    @property
    def quantized(self) -> bool:
        return self.quantization == FP8_BLOCK

    @property
    def modelled(self) -> bool:
        """Whether SGLang's path for this checkpoint is modelled: block fp8 or bf16."""
        return self.quantization in (FP8_BLOCK, None)


def buf(name: str, shape: tuple[int, ...], dtype: str, cited: str,
        deep_gemm: bool = False) -> RankBuffer:
    """One buffer; `deep_gemm`: its kernel is DeepGEMM's, which cannot load here."""
    return RankBuffer(name, tuple(shape), dtype, cited, sized_from_source=deep_gemm)


def ceil_to(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


# -- the MoE layer --

def shared_experts_fused(shape: StepShape) -> bool:
    """Whether SGLang fuses the shared expert into the routed experts (models/deepseek_v2.py,
    DeepseekV2ForCausalLM.shared_experts_fusion_disable_reason): DeepSeek-V3's or GLM-5's
    architecture, 256 routed experts, one shared, and no expert parallelism on CUDA."""
    return (shape.architecture in FUSING_ARCHITECTURES
            and shape.n_routed_experts in FUSING_EXPERT_COUNTS
            and shape.n_shared_experts == 1 and shape.moe_ep_size == 1)


@dataclass(frozen=True)
class MoELayout:
    """The Triton runner's problem on this rank."""

    local_experts: int  # experts this rank holds (w13's first dimension)
    topk: int  # slots per token: the routed top-k, and the fused shared expert's
    intermediate: int  # the per-rank intermediate width I (w13 gives 2I)
    fused_shared: bool


def moe_layout(shape: StepShape) -> MoELayout | None:
    """The runner's layout (DeepseekV2MoE.__init__ and FusedMoE): None for a model without
    routed experts or a checkpoint whose MoE path is not modelled."""
    if not (shape.n_routed_experts and shape.num_experts_per_tok and shape.moe_intermediate_size
            and shape.modelled):
        return None
    fused = shared_experts_fused(shape)
    extra = shape.n_shared_experts if fused else 0
    moe_tp = shape.tensor_parallel // shape.moe_ep_size
    return MoELayout(local_experts=(shape.n_routed_experts + extra) // shape.moe_ep_size,
                     topk=shape.num_experts_per_tok + extra,
                     intermediate=shape.moe_intermediate_size // moe_tp, fused_shared=fused)


def _router_buffers(shape: StepShape, layout: MoELayout) -> list[RankBuffer]:
    """What stays live from the router through the routed experts."""
    t, k = shape.moe_tokens, layout.topk
    held = [buf("moe.router_logits", (t, shape.n_routed_experts), "float32", GATE),
            buf("moe.topk_weights", (t, k), "float32", TOPK),
            buf("moe.topk_ids", (t, k), "int32", TOPK)]
    if shape.moe_ep_size > 1:  # the global ids mapped to this rank's experts
        held.append(buf("moe.topk_ids_local", (t, k), "int32", LOCAL_IDS))
    if not layout.fused_shared and shape.n_shared_experts:
        held.append(buf("moe.shared_output", (t, shape.hidden_size), "bfloat16", SHARED))
    if shape.attention_data_parallel > 1:
        held.append(buf("moe.gathered_hidden_states", (t, shape.hidden_size), "bfloat16",
                        DP_GATHER))
    return held


def _quantized(name: str, rows: int, cols: int, cited: str) -> list[RankBuffer]:
    """A per-token-group fp8 copy and its row-major fp32 scales."""
    return [buf(f"{name}_fp8", (rows, cols), "float8_e4m3fn", cited),
            buf(f"{name}_scale", (rows, -(-cols // GROUP)), "float32", cited)]


def moe_stages(shape: StepShape) -> list[Stage]:
    """The routed experts' three points (FUSED_MOE): the gate-up GEMM (cache1 and the quantized
    input), the activation (cache1 and cache2), the down GEMM (cache2, cache3 and the quantized
    cache2), each with the router's buffers; with an unfused shared expert, its MLP first."""
    layout = moe_layout(shape)
    if layout is None:
        return []
    t, k, i, h = shape.moe_tokens, layout.topk, layout.intermediate, shape.hidden_size
    held = _router_buffers(shape, layout)
    cache1 = buf("moe.intermediate_cache1", (t * k, 2 * i), "bfloat16", FUSED_MOE)
    cache2 = buf("moe.intermediate_cache2", (t * k, i), "bfloat16", FUSED_MOE)
    cache3 = buf("moe.intermediate_cache3", (t, k, h), "bfloat16", FUSED_MOE)
    gate_up = [*held, cache1] + (_quantized("moe.input", t, h, MOE_QUANT) if shape.quantized
                                 else [])
    down = [*held, cache2, cache3] + (_quantized("moe.down_input", t * k, i, MOE_QUANT)
                                      if shape.quantized else [])
    stages = [Stage("moe.gate_up", tuple(gate_up)), Stage("moe.activation", (*held, cache1, cache2)),
              Stage("moe.down", tuple(down))]
    if not layout.fused_shared and shape.n_shared_experts:
        width = shape.moe_intermediate_size * shape.n_shared_experts // shape.tensor_parallel
        stages[:0] = mlp_stages(shape, width, "moe.shared_expert")
    return stages


# -- DeepseekV2MLP: the dense layers and the unfused shared expert --

def _linear_input(name: str, rows: int, cols: int) -> list[RankBuffer]:
    """A block-fp8 linear's quantized input: fp8, and column-major fp32 scales whose rows are
    padded to 4 (LINEAR, sglang_per_token_group_quant_fp8 with scale_tma_aligned)."""
    return [buf(f"{name}_fp8", (rows, cols), "float8_e4m3fn", LINEAR),
            buf(f"{name}_scale", (-(-cols // GROUP), ceil_to(rows, TMA_ROWS)), "float32", LINEAR)]


def mlp_stages(shape: StepShape, width: int, name: str) -> list[Stage]:
    """A DeepseekV2MLP of per-rank intermediate `width` at the step's tokens (MLP): the gate-up
    GEMM (its quantized input and output), then the down GEMM (gate_up still bound, the
    activation, its quantized copy and the output). Outputs come from DeepGEMM's GEMMs."""
    if not shape.modelled or width <= 0:
        return []
    t, h, fp8 = shape.moe_tokens, shape.hidden_size, shape.quantized
    gate_up = buf(f"{name}.gate_up", (t, 2 * width), "bfloat16", LINEAR, deep_gemm=fp8)
    act = buf(f"{name}.act", (t, width), "bfloat16", MLP)
    out = buf(f"{name}.down_output", (t, h), "bfloat16", LINEAR, deep_gemm=fp8)
    first = (_linear_input(f"{name}.gate_up_input", t, h) if fp8 else []) + [gate_up]
    second = [gate_up, act] + (_linear_input(f"{name}.down_input", t, width) if fp8 else [])
    return [Stage(f"{name}.gate_up", tuple(first)), Stage(f"{name}.down", (*second, out))]


def dense_mlp_stages(shape: StepShape) -> list[Stage]:
    """The first_k_dense_replace layers' MLP, TP over every rank (moe_dense_tp_size unset)."""
    if not shape.first_k_dense_replace or not shape.intermediate_size:
        return []
    return mlp_stages(shape, shape.intermediate_size // shape.tensor_parallel, "dense_mlp")


# -- the DSA indexer --

ACT_QUANT = source("sglang/kernels/ops/quantization/act_quant_triton.py", "act_quant")
INDEXER_Q = source("sglang/kernels/ops/attention/dsa/indexer_q.py",
                   "fused_q_indexer_rope_first_quant")
Q_K_BF16 = source("layers/attention/dsa/dsa_indexer.py", "Indexer._get_q_k_bf16")
HEAD_GATE = source("layers/attention/dsa/dsa_indexer.py", "Indexer._get_logits_head_gate")
# the architectures whose config sets indexer_rope_interleave (GLM-5's): SGLang then runs the
# fused query path (Indexer.__init__, use_dsa_indexer_fusion: not is_neox_style); DeepSeek-V3.2's
# config leaves it unset, so its indexer's rope is neox-style and the query path unfused
INTERLEAVED_INDEXER_ROPE = ("GlmMoeDsaForCausalLM",)


def mqa_logits_budget_bytes(total_memory_bytes: int, mem_fraction_static: float,
                            free_bytes: int) -> int:
    """The indexer's logits budget (layers/attention/mqa_logits_utils.py,
    mqa_logits_static_budget_bytes then mqa_logits_budget_bytes): the lesser of 30% of the GPU,
    20% of what the pool leaves ((1 - mem_fraction_static) of the GPU) and 20% of the memory
    free when the first large prefill runs."""
    static = min(int(int(total_memory_bytes * max(0.0, 1.0 - mem_fraction_static))
                     * LOGITS_FREE_MEM_FRACTION),
                 int(total_memory_bytes * LOGITS_TOTAL_MEM_FRACTION))
    return max(1, min(int(free_bytes * LOGITS_FREE_MEM_FRACTION), static))


def logits_rows(rows: int, cols: int, budget_bytes: int) -> int:
    """Query rows per logits chunk (INDEXER, mqa_logits_should_chunk): all of them under
    MQA_LOGITS_STATIC_SKIP_ELEMS elements or within the budget, else as many rows of
    `cols` fp32 as the budget holds."""
    if rows * cols < LOGITS_STATIC_SKIP_ELEMS or rows * cols * 4 <= budget_bytes:
        return rows
    return min(max(1, budget_bytes // max(cols * 4, 1)), rows)


def _indexer_query(shape: StepShape) -> list[RankBuffer]:
    """The indexer's query side at its logits: fp8 q and fp32 head weights; where its rope is
    neox-style (no fusion), the bf16 query and key and the q scales stay bound too."""
    t, h, d = shape.tokens, shape.index_n_heads, shape.index_head_dim
    if shape.architecture in INTERLEAVED_INDEXER_ROPE:
        return [buf("indexer.q_fp8", (t, h, d), "float8_e4m3fn", INDEXER_Q),
                buf("indexer.weights", (t, h, 1), "float32", INDEXER_Q)]
    return [buf("indexer.query", (t, h, d), "bfloat16", Q_K_BF16),
            buf("indexer.key", (t, d), "bfloat16", Q_K_BF16),
            buf("indexer.q_fp8", (t, h, d), "float8_e4m3fn", ACT_QUANT),
            buf("indexer.q_scale", (t, h, -(-d // GROUP)), "float32", ACT_QUANT),
            buf("indexer.weights", (t, h, 1), "float32", HEAD_GATE)]


def indexer_stage(shape: StepShape, logits_budget_bytes: int) -> Stage | None:
    """The indexer of one layer at its logits and top-k (INDEXER): the query side, the
    context's indexer keys and scales gathered, one chunk of fp32 logits (its rows padded to
    256 columns by DeepGEMM, which cannot load here) and the chunk's top-k. None for a dense-MLA
    model, or a context within index_topk (all its tokens are kept: no logits,
    Indexer._should_skip_logits_computation). The step's top-k result is mlamem's indices, made
    at init (runtime/inputs.py make_inputs): not counted here."""
    if not shape.index_topk or not shape.index_n_heads or not shape.index_head_dim:
        return None
    cols = shape.context_tokens
    if cols <= shape.index_topk:
        return None
    rows = logits_rows(shape.tokens, cols, logits_budget_bytes)
    return Stage("indexer", (
        *_indexer_query(shape),
        buf("indexer.k_gathered", (cols, shape.index_head_dim), "uint8", INDEX_K),
        buf("indexer.k_scale_gathered", (cols, INDEX_K_SCALE_BYTES), "uint8", INDEX_K),
        buf("indexer.logits", (rows, ceil_to(cols, LOGITS_ROW_ALIGN)), "float32", LOGITS_ROWS,
            deep_gemm=True),
        buf("indexer.topk_chunk", (rows, shape.index_topk), "int32", TOPK_OUT)))


# -- the sampler and the drafter --

def sampler_stages(shape: StepShape) -> list[Stage]:
    """The last token of each request (a chunked prefill of one request: one row): the LM
    head's vocabulary shard and its gather over the TP ranks (LM_HEAD), then the fp32 logits and
    the softmax SGLang samples from (SAMPLER). None without the vocabulary size: an empty list."""
    if not shape.vocab_size:
        return []
    rows, padded = shape.requests, ceil_to(shape.vocab_size, VOCAB_PADDING)
    shard = buf("sampler.lm_head_shard", (rows, padded // shape.tensor_parallel), "bfloat16",
                LM_HEAD)
    gathered = buf("sampler.lm_head_gathered", (rows, padded), "bfloat16", LM_HEAD)
    logits = buf("sampler.logits", (rows, shape.vocab_size), "float32", LM_HEAD)
    probs = buf("sampler.probs", (rows, shape.vocab_size), "float32", SAMPLER)
    return [Stage("sampler.lm_head", (shard, gathered) if shape.tensor_parallel > 1 else (shard,)),
            Stage("sampler.softmax", (logits, probs))]


def drafter_stages(shape: StepShape) -> list[Stage]:
    """With MTP drafting on, its one decoder layer runs the step's tokens again after the
    target (NEXTN), the target's hidden states for every token held as its input: its MoE's
    stages, each with them. The draft layer's runner and fusion are taken as the target's."""
    if not shape.speculative:
        return []
    held = buf("drafter.target_hidden_states", (shape.tokens, shape.hidden_size), "bfloat16",
               NEXTN)
    return [Stage(f"drafter.{s.name}", (held, *(
        RankBuffer(f"drafter.{b.name}", b.shape, b.dtype, b.source, b.sized_from_source)
        for b in s.buffers))) for s in moe_stages(shape)]


def step_stages(shape: StepShape, logits_budget_bytes: int) -> list[Stage]:
    """Everything SGLang 0.5.23's chunked-prefill step allocates beyond attention, stage by stage
    in the order of a layer and the step: the dense MLP (a first layer), the indexer and the MoE
    (a sparse layer), the sampler, the drafter."""
    indexer = indexer_stage(shape, logits_budget_bytes)
    return [*dense_mlp_stages(shape), *([indexer] if indexer else []), *moe_stages(shape),
            *sampler_stages(shape), *drafter_stages(shape)]


def step_shape(scenario: Scenario, tokens: int) -> StepShape:
    """The step's shape from the scenario: its model's config fields, its parallel layout,
    `[sglang].speculative_num_draft_tokens` (drafting on) and max_model_len (the context the
    last chunk of the longest prompt ends)."""
    model, parallel = scenario.model, scenario.parallel
    return StepShape(
        tokens=tokens, context_tokens=max(scenario.serving.max_model_len, tokens),
        hidden_size=model.hidden_size or 0, tensor_parallel=parallel.tensor_parallel,
        attention_data_parallel=parallel.attention_data_parallel,
        expert_parallel=parallel.expert_parallel, quantization=model.quantization,
        # config.json's architectures[0], where the scenario's model gives it
        architecture=getattr(model, "architecture", None),
        vocab_size=model.vocab_size, intermediate_size=model.intermediate_size,
        moe_intermediate_size=model.moe_intermediate_size,
        n_routed_experts=model.n_routed_experts, num_experts_per_tok=model.num_experts_per_tok,
        n_shared_experts=model.n_shared_experts,
        first_k_dense_replace=model.first_k_dense_replace or 0,
        index_n_heads=model.index_n_heads, index_head_dim=model.index_head_dim,
        index_topk=model.index_topk,
        speculative=scenario.section("sglang").speculative_num_draft_tokens is not None)
