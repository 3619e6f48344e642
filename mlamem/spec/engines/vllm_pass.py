"""What vLLM 0.33.0's rank allocates beyond attention and the MoE layer, as stages
(spec/engines/rank_buffers.py): the DSA indexer, the sampler, the MTP drafter, a dense-MLA
layer's profile-run stand-in, and the init-time buffers (the shared workspace, the drafter's).
Without torch.

On CUDA a DSA model (DeepseekV32ForCausalLM, and GLM-5's GlmMoeDsaForCausalLM) is served by
models/deepseek_v32/ (nvidia/model.py, attention.py, nvidia/mtp.py), a dense-MLA model
(DeepseekV3ForCausalLM: DeepSeek-V3, R1, Kimi-K2) by model_executor/models/deepseek_v2.py
(model_executor/models/registry.py, models/deepseek_v32/__init__.py).

The profile pass (v1/worker/gpu_model_runner.py, `profile_run`) is `_dummy_run(max_num_tokens,
is_profile=True)` then `_dummy_sampler_run`. The dummy run builds no attention metadata: its
`attn_metadata: PerLayerAttnMetadata | None = None` is replaced only under `force_attention or
cudagraph_runtime_mode == CUDAGraphMode.FULL`, and a profile run is forced eager
(`force_eager=is_profile`). So every layer runs on `attn_metadata is None`:
- a DSA layer (deepseek_v32/attention.py, DeepseekV32Attention._sparse_indexer_and_attn) calls
  `sparse_attn_indexer`, whose profile branch ("careful! this will be None in dummy run")
  reserves its K-gather workspace in the shared workspace, allocates a logits stand-in of
  VLLM_SPARSE_INDEXER_MAX_LOGITS_MB and the top-k exchange's transient, and returns; then
  `if attn_metadata is None: output.zero_()`: its attention runs no kernel;
- a dense-MLA layer (model_executor/layers/attention/mla_attention.py, MLAAttention.forward_impl)
  allocates a stand-in for the chunked-context kv_b_proj output, then fills zeros.
After the model, in the dummy run, the drafter's `dummy_run` (speculative decoding on); then the
sampler over min(max_num_seqs, max_num_tokens) requests, and, speculative decoding on, the
rejection sampler on one draft per request (`profile_stages`).

A real step (`step_stages`) runs the same indexer on real metadata: its prefill logits come in
chunks of at most VLLM_SPARSE_INDEXER_MAX_LOGITS_MB (indexer.py, the chunk planner's
M x N x 4 <= max_logits_bytes), then its decode logits, one max_model_len-wide float32 row per
decode token, which the profile does not reserve; both from DeepGEMM, which cannot load here
(sized from the source). After the model it samples its requests, with the rejection sampler
where it verifies drafts (k per request), then the drafter proposes.

Init-time buffers (`resident_buffers`): the shared workspace (v1/worker/workspace.py, one buffer
as large as the largest request) that FlashMLASparseImpl.__init__ reserves and the indexer's
profile branch may grow; the drafter's persistent inputs and its MTP layer's own top-k buffer;
the sampler's Triton top-k/top-p scratch, which the profile's sampler caches for good.
The main model's top-k buffer (deepseek_v32/nvidia/model.py, DeepseekV32Model.__init__:
max_num_batched_tokens x index_topk int32) is the indices the rank allocates at init already
(runtime/inputs.py make_inputs), so it is not here.
"""

from __future__ import annotations

import math

from mlamem.spec.engines import AnyScenario as Scenario
from mlamem.spec.engines.rank_buffers import DTYPE_BYTES, RankBuffer, Stage
from mlamem.spec.engines.vllm import engine_series, settings

VERSION = "vLLM 0.33.0"
MAX_LOGITS_MB = 512  # envs.py VLLM_SPARSE_INDEXER_MAX_LOGITS_MB's default
RADIX_TOPK_WORKSPACE_BYTES = 1024 * 1024  # model_executor/layers/indexer_topk.py
WORKSPACE_ALIGNMENT = 256  # v1/worker/workspace.py get_simultaneous: round_up(actual, 256)
PREFILL_PADDING = 64  # flashmla_sparse.py FlashMLASparseImpl: prefill_padding
VOCAB_PADDING = 64  # vocab_parallel_embedding.py DEFAULT_VOCAB_PADDING_SIZE
INDEX_HEAD_DIM = 128  # GLM-5's and DeepSeek-V3.2's config.json index_head_dim
CHUNKED_CONTEXT_ROWS_CAP = 64 * 1024  # mla_attention.py determine_chunked_prefill_workspace_size
# by vLLM version ([vllm].engine_version), the first series of each rule, read from its wheel:
# v1/worker/workspace.py's WorkspaceManager, which FlashMLASparseImpl.__init__ and the indexer
# request from (0.11.0-0.12.0 reserve nothing at init: models/deepseek_v2.py
# sparse_attn_indexer gathers its keys per prefill chunk with torch.empty)
WORKSPACE_MANAGER_FROM = (0, 13)
TOPK_TOPP_TRITON_FROM = (0, 17)  # v1/sample/ops/topk_topp_triton.py, _TRITON_BUFFER_CACHE
# v1/sample/ops/topk_topp_sampler.py TopKTopPSampler.__init__: FlashInfer's sampler unless
# VLLM_USE_FLASHINFER_SAMPLER=0 in 0.10.2-0.11.0 (not read: sized as 0.17.0's here); from 0.12.0
# opt-in, so forward_native's apply_top_k_top_p sorts the vocabulary until 0.17.0's Triton kernel
SAMPLER_SORT_FROM = (0, 12)
# flashmla_sparse.py FlashMLASparseImpl.__init__'s request: the fp8 prefill gather alone in
# 0.13.0-0.17.0, q_concat (max_num_batched_tokens, heads, 576) beside it from 0.18.0 (a bf16
# cache: q_concat alone, its heads padded to 64 from 0.29.0), the five workspace_specs from 0.31.0
Q_CONCAT_FROM = (0, 18)
Q_CONCAT_PADDED_BF16_FROM = (0, 29)
WORKSPACE_SPECS_FROM = (0, 31)
# config/vllm.py sparse_mla_prefill_workspace_factor (5, or 2 above 256 Ki tokens) from 0.32.0;
# before, 5 fixed (flashmla_sparse.py get_prefill_workspace_size: max_model_len x 5; indexer.py
# get_max_prefill_buffer_size: max_model_len x 40 = 8 x 5)
WORKSPACE_FACTOR_CONFIG_FROM = (0, 32)
MAX_LOGITS_STANDIN_FROM = (0, 19)  # sparse_attn_indexer.py: the max_logits_elems stand-in
RADIX_TOPK_FROM = (0, 20)  # sparse_attn_indexer.py: RADIX_TOPK_WORKSPACE_SIZE in the request
ROW_SHARD_EXCHANGE_FROM = (0, 32)  # sparse_attn_indexer.py _reserve_row_shard_exchange_transient
BF16, FP32 = "bfloat16", "float32"

FLASHMLA_SPARSE = f"{VERSION} v1/attention/backends/mla/flashmla_sparse.py"
INDEXER_OP = f"{VERSION} model_executor/layers/sparse_attn_indexer.py"
FUSED_Q = f"{VERSION} models/deepseek_v32/common/kernels.py, fused_q"
INDEXER_META = f"{VERSION} v1/attention/backends/mla/indexer.py"
RUNNER = f"{VERSION} v1/worker/gpu_model_runner.py"
SAMPLER = f"{VERSION} v1/sample/sampler.py"
TOPK_TOPP = f"{VERSION} v1/sample/ops/topk_topp_sampler.py"
REJECTION = f"{VERSION} v1/sample/rejection_sampler.py"
PROPOSER = f"{VERSION} v1/spec_decode/llm_base_proposer.py, SpecDecodeBaseProposer.__init__"
MTP = f"{VERSION} model_executor/models/deepseek_mtp.py"


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def is_dsa(scenario: Scenario) -> bool:
    """The model has the DSA indexer (config.json index_topk), so vLLM serves it sparse."""
    return scenario.model.index_topk is not None


def index_head_dim(scenario: Scenario) -> int:
    """The indexer's head width: config.json index_head_dim, else the `[vllm]` table's, else 128
    (GLM-5's and DeepSeek-V3.2's)."""
    return (scenario.model.index_head_dim or settings(scenario).index_head_dim
            or INDEX_HEAD_DIM)


def spec_tokens(scenario: Scenario) -> int:
    """Speculative tokens per step (k): vLLM drafts them with the checkpoint's MTP layers."""
    return settings(scenario).num_speculative_tokens


def sampled_requests(scenario: Scenario, tokens: int) -> int:
    """The requests the profile's dummy batch samples: gpu_model_runner.py `_dummy_run`,
    num_reqs = min(num_tokens, max_num_seqs)."""
    return min(tokens, settings(scenario).max_num_seqs)


def workspace_factor(scenario: Scenario) -> int:
    """config/vllm.py VllmConfig.__post_init__: sparse_mla_prefill_workspace_factor is 5 where
    max_model_len <= 256 Ki tokens, else 2; 5 before vLLM 0.32.0 (WORKSPACE_FACTOR_CONFIG_FROM)."""
    if engine_series(scenario) < WORKSPACE_FACTOR_CONFIG_FROM:
        return 5
    return 5 if scenario.serving.max_model_len <= 256 * 1024 else 2


def sparse_mla_workspace_requests(scenario: Scenario, tokens: int) -> list[tuple[tuple[int, ...], str]]:
    """FlashMLASparseImpl.__init__'s `workspace_specs`, (shape, dtype) each: q_concat, and on an
    fp8_ds_mla cache the prefill gather (factor x max_model_len rows) and the padded prefill
    query and outputs. Heads are the rank's; the prefill kernel pads them to 64. Older versions
    request less (WORKSPACE_MANAGER_FROM to WORKSPACE_SPECS_FROM: `_older_sparse_mla_requests`)."""
    if engine_series(scenario) < WORKSPACE_SPECS_FROM:
        return _older_sparse_mla_requests(scenario, tokens)
    heads, d_qk, d_v = scenario.heads_per_rank, scenario.d_qk, scenario.d_v
    padded = _round_up(heads, PREFILL_PADDING)
    if scenario.serving.kv_cache_dtype != "fp8_ds_mla":  # bf16: q_concat padded, nothing more
        return [((tokens, padded, d_qk), BF16)]
    prefill_rows = scenario.serving.max_model_len * workspace_factor(scenario)
    return [((tokens, heads, d_qk), BF16), ((prefill_rows, d_qk), BF16),
            ((tokens, padded, d_qk), BF16), ((tokens, padded, d_v), BF16),
            ((tokens, heads, d_v), BF16)]


def _older_sparse_mla_requests(scenario: Scenario, tokens: int
                               ) -> list[tuple[tuple[int, ...], str]]:
    """FlashMLASparseImpl.__init__'s request before 0.31.0: none before 0.13.0; the fp8 prefill
    gather (max_model_len x 5 rows); from 0.18.0 q_concat ahead of it, (tokens, heads, 576),
    alone on a bf16 cache, its heads padded to 64 there from 0.29.0."""
    series, fp8 = engine_series(scenario), scenario.serving.kv_cache_dtype == "fp8_ds_mla"
    if series < WORKSPACE_MANAGER_FROM:
        return []
    heads, d_qk = scenario.heads_per_rank, scenario.d_qk
    gather = [((scenario.serving.max_model_len * workspace_factor(scenario), d_qk), BF16)]
    if series < Q_CONCAT_FROM:
        return gather if fp8 else []
    if not fp8 and series >= Q_CONCAT_PADDED_BF16_FROM:
        heads = _round_up(heads, PREFILL_PADDING)
    return [((tokens, heads, d_qk), BF16)] + (gather if fp8 else [])


def indexer_workspace_requests(scenario: Scenario) -> list[tuple[tuple[int, ...], str]]:
    """The indexer's profile-branch request (sparse_attn_indexer, `_gather_workspace_shapes`):
    its K gather, get_max_prefill_buffer_size rows (max_model_len x (576 x 2 // 132) x factor)
    of fp8 values and 4 scale bytes, and the radix top-k's workspace (from vLLM 0.20.0,
    RADIX_TOPK_FROM)."""
    width = index_head_dim(scenario)
    rows = scenario.serving.max_model_len * (576 * 2 // 132) * workspace_factor(scenario)
    requests = [((rows, width), "float8_e4m3fn"), ((rows, 4), "uint8")]
    if engine_series(scenario) >= RADIX_TOPK_FROM:
        requests.append(((RADIX_TOPK_WORKSPACE_BYTES,), "uint8"))
    return requests


def workspace_bytes(requests: list[tuple[tuple[int, ...], str]]) -> int:
    """One get_simultaneous request's bytes: each part rounded up to 256 B."""
    total = 0
    for shape, dtype in requests:
        size = DTYPE_BYTES[dtype]
        for dim in shape:
            size *= dim
        total += _round_up(size, WORKSPACE_ALIGNMENT)
    return total


def decode_share_bytes(scenario: Scenario, tokens: int) -> int:
    """The part of the sparse MLA backend's request that holds the kernel's head-padded query
    and output (its third and fourth specs: tokens x 64-padded heads x 576 and x 512, bf16):
    what mlamem's workspace paths reserve at init as the path's own workspace."""
    requests = sparse_mla_workspace_requests(scenario, tokens)
    return workspace_bytes(requests[2:4]) if len(requests) == 5 else 0


def shared_workspace(scenario: Scenario, tokens: int, reserved: int = 0,
                     other_requests: tuple[int, ...] = ()) -> RankBuffer | None:
    """The rank's shared workspace: one buffer as large as its largest request
    (WorkspaceManager._ensure_workspace_size grows it, never shrinks it). A DSA model's requests
    are the sparse MLA backend's at init and the indexer's in the profile pass; `other_requests`
    are the bytes of any other (the fused-MoE kernels request from the same buffer:
    fused_moe/modular_kernel.py, current_workspace_manager().get_simultaneous). Less `reserved`,
    the bytes of it the path's own workspace already holds (at most `decode_share_bytes`). None
    where nothing requests it."""
    requests = list(other_requests)
    if is_dsa(scenario) and engine_series(scenario) >= WORKSPACE_MANAGER_FROM:
        requests += [workspace_bytes(sparse_mla_workspace_requests(scenario, tokens)),
                     workspace_bytes(indexer_workspace_requests(scenario))]
    if not requests:
        return None
    size = max(requests) - min(reserved, decode_share_bytes(scenario, tokens))
    return RankBuffer("workspace.shared", (size,), "uint8",
                      f"{VERSION} v1/worker/workspace.py, WorkspaceManager.get_simultaneous; "
                      f"{FLASHMLA_SPARSE}, FlashMLASparseImpl.__init__; {INDEXER_OP}, "
                      "sparse_attn_indexer")


def row_shard_exchange(scenario: Scenario) -> bool:
    """The indexer's top-k exchange runs (indexer.py tp_prefill_row_sharding_supported): TP over
    more than one rank and no FULL graphs of mixed batches (DCP, PCP and the env switches at
    their defaults), from vLLM 0.32.0 (ROW_SHARD_EXCHANGE_FROM)."""
    return (scenario.parallel.attention_tensor_parallel > 1
            and settings(scenario).cudagraph_mode != "FULL"
            and engine_series(scenario) >= ROW_SHARD_EXCHANGE_FROM)


def decode_logits_bytes(scenario: Scenario, tokens: int) -> int:
    """A step's decode logits (sparse_attn_indexer's decode branch: DeepGEMM's
    fp8_fp4_paged_mqa_logits, [B x next_n, max_model_len], float32 on Hopper): one
    max_model_len-wide row per decode token, at most min(tokens, max_num_seqs x (1 + k))."""
    decode_tokens = min(tokens, settings(scenario).max_num_seqs * (1 + spec_tokens(scenario)))
    return decode_tokens * scenario.serving.max_model_len * DTYPE_BYTES[FP32]


def indexer_stage(scenario: Scenario, tokens: int, *, step: bool = False) -> Stage | None:
    """One DSA layer's indexer at `tokens`, as live around `sparse_attn_indexer`: its fp8 query
    (tokens, index_n_heads, index_head_dim) and its weights (tokens, index_n_heads) float32
    (fused_q's outputs; the bf16 query and the fused wk/weights GEMM's output are dead inside the
    compiled piece before it), and its logits. The profile branch holds a stand-in of
    VLLM_SPARSE_INDEXER_MAX_LOGITS_MB and, where it runs, the top-k exchange's transient
    (2 x tokens x index_topk x 4 B) together. A `step` runs the prefill chunks' logits (at most
    that bound), the exchange, then the decode logits (`decode_logits_bytes`) one after another:
    the largest is its logits. Its key goes into the cache inside fused_norm_rope (no tensor of
    its own); its top-k output is the buffer allocated at init. None for a dense-MLA model."""
    if not is_dsa(scenario):
        return None
    heads, width = scenario.model.index_n_heads, index_head_dim(scenario)
    bound = MAX_LOGITS_MB * 1024 * 1024
    exchange = 2 * tokens * scenario.model.index_topk * 4 if row_shard_exchange(scenario) else 0
    op = f"{INDEXER_OP}, sparse_attn_indexer"
    if step:
        logits = RankBuffer(
            "indexer.logits", (max(bound, exchange, decode_logits_bytes(scenario, tokens)),),
            "uint8", f"{op}: the largest of the prefill chunks' logits ({INDEXER_META}, M x N x "
            "4 <= max_logits_bytes), exchange_topk and the decode branch's (DeepGEMM "
            "fp8_fp4_paged_mqa_logits)", sized_from_source=True)
    else:
        logits = RankBuffer("indexer.logits", (bound,), "uint8",
                            f"{op} (profile branch: torch.empty(max_logits_elems, uint8))")
    # the profile's stand-in from vLLM 0.19.0 (MAX_LOGITS_STANDIN_FROM)
    buffers = [logits] if step or engine_series(scenario) >= MAX_LOGITS_STANDIN_FROM else []
    if heads:  # config.json index_n_heads; a scenario without it leaves its query out
        buffers[:0] = [
            RankBuffer("indexer.q_fp8", (tokens, heads, width), "float8_e4m3fn",
                       f"{FUSED_Q} (index_q_fp8 = empty_like(index_q, fp8)); "
                       f"{VERSION} models/deepseek_v32/attention.py, DeepseekV32Attention.forward"),
            RankBuffer("indexer.weights", (tokens, heads), FP32,
                       f"{FUSED_Q} (index_weights_out, float32)")]
    if exchange and not step:
        buffers.append(RankBuffer("indexer.topk_exchange", (exchange,), "uint8",
                                  f"{INDEXER_OP}, _reserve_row_shard_exchange_transient"))
    return Stage("indexer", tuple(buffers)) if buffers else None


def chunked_context_rows(scenario: Scenario) -> int:
    """MLACommonMetadataBuilder.determine_chunked_prefill_workspace_size: min(max(8 x
    max_model_len, 4 x max_num_seqs x block_size), 64 Ki), aligned to the block size
    (align_mla_chunked_context_workspace_size)."""
    serving = scenario.serving
    rows = min(max(8 * serving.max_model_len,
                   4 * settings(scenario).max_num_seqs * serving.block_size),
               CHUNKED_CONTEXT_ROWS_CAP)
    return _round_up(max(rows, serving.block_size), serving.block_size)


def attention_profile_stage(scenario: Scenario) -> Stage | None:
    """A dense-MLA layer in the profile run (MLAAttention.forward_impl, `attn_metadata is
    None`): the stand-in for kv_b_proj's output over the chunked context, (rows, heads per rank,
    qk_nope_head_dim + v_head_dim) bf16. None for a DSA model, whose DeepseekV32Attention
    returns zeros without it."""
    if is_dsa(scenario):
        return None
    model = scenario.model
    shape = (chunked_context_rows(scenario), scenario.heads_per_rank,
             model.qk_nope_head_dim + model.v_head_dim)
    return Stage("attention", (RankBuffer(
        "attention.kv_b_proj_standin", shape, BF16,
        f"{VERSION} model_executor/layers/attention/mla_attention.py, MLAAttention.forward_impl "
        "(attn_metadata is None)"),))


def padded_vocab(vocab: int) -> int:
    """The lm_head's rows over all ranks (ParallelLMHead: pad_vocab_size(vocab, 64)), the width
    of the logits all-gathered to every rank (LogitsProcessor._gather_logits: all-gather on
    CUDA, `use_all_gather`) before the view to the vocabulary."""
    return _round_up(vocab, VOCAB_PADDING)


def sampler_stage(scenario: Scenario, requests: int, *, dummy: bool = True) -> Stage | None:
    """The sampler over `requests` requests, as live at its peak (random_sample): the last
    hidden states, the logits (lm_head output in the model's bf16, all-gathered to the padded
    vocabulary), their float32 copy (Sampler.forward), the probabilities (softmax, float32) and
    the exponential noise (float32). `dummy`: the profile's `_dummy_sampler_run`, which samples
    random hidden states (`torch.rand_like`). The top-k/top-p masks are applied in place
    (apply_top_k_top_p_triton); vLLM 0.12.0-0.16.0 sort instead (`_sort_buffers`). None
    without the model's vocab_size or hidden_size."""
    vocab, hidden = scenario.model.vocab_size, scenario.model.hidden_size
    if not vocab or not hidden:
        return None
    rows = (requests, vocab)
    buffers = [RankBuffer("sampler.last_hidden_states", (requests, hidden), BF16,
                          f"{RUNNER}, _dummy_run (hidden_states[logit_indices_device])")]
    if dummy:
        buffers.append(RankBuffer("sampler.random_hidden_states", (requests, hidden), BF16,
                                  f"{RUNNER}, _dummy_sampler_run (torch.rand_like)"))
    buffers += [
        RankBuffer("sampler.logits", (requests, padded_vocab(vocab)), BF16,
                   f"{VERSION} model_executor/layers/logits_processor.py, "
                   "LogitsProcessor._get_logits (all-gathered)"),
        RankBuffer("sampler.logits_fp32", rows, FP32,
                   f"{SAMPLER}, Sampler.forward (logits.to(torch.float32))")]
    if SAMPLER_SORT_FROM <= engine_series(scenario) < TOPK_TOPP_TRITON_FROM:
        return Stage("sampler", tuple(buffers + _sort_buffers(scenario, rows)))
    buffers += [
        RankBuffer("sampler.probs", rows, FP32,
                   f"{TOPK_TOPP}, TopKTopPSampler.forward_native (softmax, float32)"),
        RankBuffer("sampler.exponential_noise", rows, FP32,
                   f"{TOPK_TOPP}, random_sample (empty_exponential_noise_like)")]
    return Stage("sampler", tuple(buffers))


def _sort_buffers(scenario: Scenario, rows: tuple[int, int]) -> list[RankBuffer]:
    """vLLM 0.12.0-0.16.0's apply_top_k_top_p (v1/sample/ops/topk_topp_sampler.py, the dummy
    batch's top-k and top-p both set) at its scatter, its peak: the sorted logits and their
    order, the top-k mask, the top-p softmax and cumsum (in place) and mask, the scattered
    result; random_sample's probabilities and noise come after the sort's are freed, and are
    smaller."""
    source = (f"vLLM {settings(scenario).engine_version} v1/sample/ops/topk_topp_sampler.py, "
              "apply_top_k_top_p")
    return [RankBuffer("sampler.logits_sort", rows, FP32, f"{source} (logits.sort)"),
            RankBuffer("sampler.logits_idx", rows, "int64", f"{source} (logits.sort)"),
            RankBuffer("sampler.top_k_mask", rows, "bool", f"{source} (logits_sort < ...)"),
            RankBuffer("sampler.probs_sort", rows, FP32, f"{source} (softmax, cumsum)"),
            RankBuffer("sampler.top_p_mask", rows, "bool", f"{source} (probs_sum <= 1 - p)"),
            RankBuffer("sampler.logits_scattered", rows, FP32, f"{source} (scatter)")]


def rejection_stage(scenario: Scenario, requests: int, drafts: int, *,
                    dummy: bool = True) -> Stage | None:
    """The rejection sampler over `requests` requests of `drafts` draft tokens each, as live in
    sample_recovered_tokens: the target logits (bf16, one row per draft and one bonus row per
    request), the bonus rows' copy and the bonus sampler's raw float32 logits (kept in its
    output), the drafts' float32 logits and their processed clone, the target probabilities,
    and the per-request exponential noise and its reciprocal. `dummy`: the profile's warm-up in
    `_dummy_sampler_run`, one draft per request, its logits `torch.randn(num_tokens + num_reqs,
    vocab)`. None without speculative decoding, the vocab_size or the hidden_size."""
    vocab = scenario.model.vocab_size
    if not vocab or not scenario.model.hidden_size or drafts == 0:
        return None
    width = vocab if dummy else padded_vocab(vocab)
    draft_rows, request_rows = (requests * drafts, vocab), (requests, vocab)
    forward = f"{REJECTION}, RejectionSampler.forward"
    return Stage("rejection_sampler", (
        RankBuffer("rejection.logits", (requests * (1 + drafts), width), BF16,
                   f"{RUNNER}, _dummy_sampler_run (torch.randn)" if dummy else
                   f"{VERSION} model_executor/layers/logits_processor.py, "
                   "LogitsProcessor._get_logits (all-gathered)"),
        RankBuffer("rejection.bonus_logits", request_rows, BF16,
                   f"{forward} (logits[bonus_logits_indices])"),
        RankBuffer("rejection.bonus_raw_logits", request_rows, FP32,
                   f"{SAMPLER}, Sampler.forward (raw_logits: logits.to(torch.float32))"),
        RankBuffer("rejection.target_logits_fp32", draft_rows, FP32,
                   f"{forward} (raw_target_logits.to(torch.float32))"),
        RankBuffer("rejection.target_logits", draft_rows, FP32, f"{forward} (clone)"),
        RankBuffer("rejection.target_probs", draft_rows, FP32,
                   f"{REJECTION}, rejection_sample (softmax, float32)"),
        RankBuffer("rejection.noise", request_rows, FP32,
                   f"{REJECTION}, sample_recovered_tokens (q)"),
        RankBuffer("rejection.inv_noise", request_rows, FP32,
                   f"{REJECTION}, sample_recovered_tokens (q.reciprocal())")))


def mtp_source(scenario: Scenario) -> str:
    """The MTP layer's module: deepseek_v32's on CUDA for a DSA model, deepseek_mtp's else."""
    if is_dsa(scenario):
        return (f"{VERSION} models/deepseek_v32/nvidia/mtp.py, "
                "DeepseekV32MultiTokenPredictorLayer")
    return f"{MTP}, DeepSeekMultiTokenPredictorLayer"


def drafter_stage(scenario: Scenario, tokens: int) -> Stage | None:
    """The MTP drafter's forward over `tokens` tokens (the profile's `drafter.dummy_run`, the
    step's propose) before its decoder layer: the normed embeddings and hidden states
    concatenated, (tokens, 2 x hidden) bf16, and eh_proj's output. Its decoder layer's indexer
    and MoE are a main layer's, whose stages bound them. None without speculative decoding."""
    hidden = scenario.model.hidden_size
    if not spec_tokens(scenario) or not hidden:
        return None
    forward = f"{mtp_source(scenario)}.forward"
    return Stage("drafter", (
        RankBuffer("drafter.eh_input", (tokens, 2 * hidden), BF16,
                   f"{forward} (enorm, hnorm and cat: [N, 2H])"),
        RankBuffer("drafter.eh_proj_output", (tokens, hidden), BF16, f"{forward} (eh_proj)")))


def drafter_buffers(scenario: Scenario, tokens: int) -> list[RankBuffer]:
    """The drafter's persistent buffers (speculative decoding on): the proposer's inputs for
    up to max_num_batched_tokens tokens (SpecDecodeBaseProposer.__init__) and, for a DSA model,
    each MTP layer's own top-k buffer (max_num_batched_tokens x index_topk int32)."""
    hidden = scenario.model.hidden_size
    if not spec_tokens(scenario) or not hidden:
        return []
    seqs = settings(scenario).max_num_seqs
    buffers = [RankBuffer("drafter.input_ids", (tokens,), "int32", PROPOSER),
               RankBuffer("drafter.positions", (tokens,), "int64", PROPOSER),
               RankBuffer("drafter.hidden_states", (tokens, hidden), BF16, PROPOSER),
               RankBuffer("drafter.arange", (max(seqs + 1, tokens),), "int32", PROPOSER),
               RankBuffer("drafter.inputs_embeds", (tokens, hidden), BF16, PROPOSER),
               RankBuffer("drafter.backup_next_token_ids", (seqs,), "int32", PROPOSER),
               RankBuffer("drafter.slot_mapping", (tokens,), "int64", PROPOSER)]
    if is_dsa(scenario):
        layers = scenario.model.num_nextn_predict_layers or 1
        buffers += [RankBuffer(f"drafter.topk_indices_buffer.{i}",
                               (tokens, scenario.model.index_topk), "int32",
                               f"{mtp_source(scenario)}.__init__") for i in range(layers)]
    return buffers


def topk_topp_buffer(scenario: Scenario, requests: int) -> RankBuffer | None:
    """The top-k/top-p Triton kernel's scratch, cached for the process's life
    (topk_topp_triton.py apply_top_k_top_p_triton: `_TRITON_BUFFER_CACHE`, (min(next power of 2
    of min(SMs, requests), SMs), vocab) float32), first allocated by the profile's sampler run
    with top-k on. None without the vocab_size or hidden_size (no sampler modelled), or before
    vLLM 0.17.0, which has no such kernel (TOPK_TOPP_TRITON_FROM)."""
    vocab, hidden = scenario.model.vocab_size, scenario.model.hidden_size
    if not vocab or not hidden or engine_series(scenario) < TOPK_TOPP_TRITON_FROM:
        return None
    sms = scenario.gpu.sm_count
    programs = min(sms, requests)
    rows = min(1 << (programs - 1).bit_length(), sms)
    return RankBuffer("sampler.topk_topp_buffer", (rows, vocab), FP32,
                      f"{VERSION} v1/sample/ops/topk_topp_triton.py, apply_top_k_top_p_triton")


def resident_buffers(scenario: Scenario, tokens: int, reserved: int = 0,
                     other_requests: tuple[int, ...] = ()) -> Stage | None:
    """What the rank allocates beyond the weights, the KV cache, the indexer's top-k buffer and
    the path's own workspace (`reserved` bytes, see `shared_workspace`, as are
    `other_requests`), and keeps: the shared workspace, the drafter's buffers, and the
    sampler's cached top-k/top-p scratch (allocated in the profile pass, which holds it after;
    placed at init here, which sizes the KV cache the same). None if nothing."""
    extra = [shared_workspace(scenario, tokens, reserved, other_requests),
             topk_topp_buffer(scenario, sampled_requests(scenario, tokens))]
    buffers = [b for b in extra if b is not None] + drafter_buffers(scenario, tokens)
    return Stage("resident", tuple(buffers)) if buffers else None


def step_stages(scenario: Scenario, tokens: int) -> list[Stage]:
    """A step at `tokens` tokens beyond attention and the MoE, in the engine's order: each
    layer's indexer; after the model the sampler over min(max_num_seqs, tokens) requests (the
    rejection sampler, k drafts each, where speculative decoding is on), then the drafter."""
    requests = sampled_requests(scenario, tokens)
    k = spec_tokens(scenario)
    sampling = (rejection_stage(scenario, requests, k, dummy=False) if k
                else sampler_stage(scenario, requests, dummy=False))
    stages = [indexer_stage(scenario, tokens, step=True), sampling,
              drafter_stage(scenario, tokens)]
    return [s for s in stages if s is not None]


def profile_stages(scenario: Scenario, tokens: int) -> list[Stage]:
    """vLLM's profile pass at `tokens` (max_num_batched_tokens) beyond attention and the MoE, in
    the engine's order: each layer's indexer (a DSA model) or its MLA profile stand-in (a
    dense-MLA model); then the drafter's dummy run; then `_dummy_sampler_run`: the sampler over
    min(max_num_seqs, tokens) requests and, speculative decoding on, the rejection sampler on
    one draft per request."""
    requests = sampled_requests(scenario, tokens)
    stages = [indexer_stage(scenario, tokens), attention_profile_stage(scenario),
              drafter_stage(scenario, tokens), sampler_stage(scenario, requests),
              rejection_stage(scenario, requests, 1 if spec_tokens(scenario) else 0)]
    return [s for s in stages if s is not None]


# -- what a DSA layer's attention holds while its kernel runs --

DSA_ATTENTION = f"{VERSION} models/deepseek_v32/attention.py"
DSA_MODEL = f"{VERSION} models/deepseek_v32/nvidia/model.py"
SPARSE_MLA = f"{VERSION} model_executor/layers/attention/sparse_mla_attention.py"


def attention_locals(scenario: Scenario, tokens: int) -> Stage | None:
    """A DSA layer's tensors alive through its attention, the kernel's call included, in the
    profile pass and the step: vLLM 0.33.0 runs GLM-5 and DeepSeek-V3.2 eagerly
    (config/vllm.py `_maybe_enable_breakable_cudagraph`: compilation off for them), so
    `DeepseekV32Attention.forward`'s locals live until it returns. Beside mlamem's residual
    stream, q and output (activation_specs): the previous layer's MoE output the model's loop
    still holds (the layer's all-reduce is out of place), the fused q/kv down-projection and its
    normed q, the up-projected q, the indexer's query (bf16 and fp8), its key and head weights,
    the latent and RoPE key. None for a dense-MLA model or a scenario without the indexer's and
    the query's widths."""
    model = scenario.model
    if not is_dsa(scenario) or not (model.index_n_heads and model.q_lora_rank
                                    and model.hidden_size):
        return None
    heads, index_dim = model.index_n_heads, index_head_dim(scenario)
    latent, rope = model.kv_lora_rank, model.qk_rope_head_dim
    fused = f"{VERSION} models/deepseek_v32/common/kernels.py"
    buffers = (
        RankBuffer("attention.previous_moe_output", (tokens, model.hidden_size), "bfloat16",
                   f"{DSA_MODEL}, DeepseekV32Model.forward (the layer loop); "
                   f"{VERSION} model_executor/layers/fused_allreduce_rms_norm.py (out of place)"),
        RankBuffer("attention.qkv_lora", (tokens, model.q_lora_rank + latent + rope), "bfloat16",
                   f"{DSA_ATTENTION}, DeepseekV32Attention.forward (fused_qkv_a_proj)"),
        RankBuffer("attention.q_c", (tokens, model.q_lora_rank), "bfloat16",
                   f"{fused}, fused_norm_rope"),
        RankBuffer("attention.kv_c", (tokens, latent), "bfloat16", f"{fused}, fused_norm_rope"),
        RankBuffer("attention.k_pe", (tokens, rope), "bfloat16", f"{fused}, fused_norm_rope"),
        RankBuffer("attention.q_b", (tokens, scenario.heads_per_rank,
                                     model.qk_nope_head_dim + rope), "bfloat16",
                   f"{DSA_ATTENTION}, DeepseekV32Attention.forward (q_b_proj)"),
        RankBuffer("attention.index_q", (tokens, heads, index_dim), "bfloat16",
                   f"{DSA_ATTENTION}, DeepseekV32Attention.forward (the indexer's wq_b, "
                   "replicated: every head on each rank)"),
        RankBuffer("attention.index_q_fp8", (tokens, heads, index_dim), "float8_e4m3fn",
                   FUSED_Q),
        RankBuffer("attention.index_kw", (tokens, index_dim + heads), "bfloat16",
                   f"{DSA_ATTENTION}, DeepseekV32Attention.forward (the indexer's wk and "
                   "head weights, fused)"),
        RankBuffer("attention.index_weights", (tokens, heads), "float32", FUSED_Q),
    )
    return Stage("attention_locals", buffers)


def step_attention_buffers(scenario: Scenario, tokens: int) -> Stage | None:
    """What only a real step's mixed batch adds around the kernel: the top-k indices converted
    to global cache slots (flashmla_sparse.py, the mixed-batch path, into
    sparse_utils.py's `empty_like`), one int32 per token and top-k entry; None without the
    layer's locals (attention_locals)."""
    if attention_locals(scenario, tokens) is None:
        return None
    return Stage("attention_step", (RankBuffer(
        "attention.global_topk_slots", (tokens, scenario.model.index_topk), "int32",
        f"{FLASHMLA_SPARSE}, FlashMLASparseImpl (mixed batch); {VERSION} "
        "v1/attention/backends/mla/sparse_utils.py, the slot conversion"),))


def block_table_width(scenario: Scenario) -> int:
    """v1/worker/block_table.py `get_block_table_width`: a request's most blocks
    (max_model_len / block_size, rounded up), aligned to 128 tokens' worth of blocks."""
    serving = scenario.serving
    blocks = -(-serving.max_model_len // serving.block_size)
    alignment = 128 // math.gcd(128, serving.block_size)
    return _round_up(blocks, alignment)


def after_kv_buffers(scenario: Scenario, tokens: int) -> Stage | None:
    """What the attention metadata builders allocate in `initialize_kv_cache`, after the KV
    cache is sized, and keep (gpu_model_runner.py): the indexer builder's expanded block table
    (max_num_batched_tokens x the block table's width, int32) and the sparse MLA builder's
    chunked-prefill workspace (chunked_context_rows x (kv_lora_rank + RoPE), bf16). None for a
    model without the layer's locals."""
    if attention_locals(scenario, tokens) is None:
        return None
    model = scenario.model
    return Stage("after_kv_cache", (
        RankBuffer("indexer.expanded_block_table", (tokens, block_table_width(scenario)),
                   "int32", f"{INDEXER_META}, the indexer's metadata builder __init__ "
                   "(expanded_block_table_buffer)"),
        RankBuffer("sparse_mla.chunked_prefill_workspace",
                   (chunked_context_rows(scenario), model.kv_lora_rank + model.qk_rope_head_dim),
                   "bfloat16", f"{SPARSE_MLA}, the sparse MLA metadata builder __init__ "
                   "(chunked_prefill_workspace)"),
    ))
