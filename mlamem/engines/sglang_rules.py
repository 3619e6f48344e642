"""SGLang 0.5.23's own memory rules, without torch, each read from its source (the wheel,
`pip download --no-deps sglang==0.5.23`; paths under sglang/srt/):

- the GPU-dependent defaults of `--chunked-prefill-size` and the decode graphs' largest batch,
  and the reserve that derives `--mem-fraction-static` when it is not given
  (arg_groups/memory_hook.py, handle_gpu_memory_settings, reserve_for_graph_mb);
- the decode and prefill CUDA-graph batch-size lists
  (arg_groups/cuda_graph_hook.py, generate_decode_cuda_graph_batch_sizes,
  generate_prefill_cuda_graph_batch_sizes), and the decode list the runner captures: filtered by
  the request pool's size (model_executor/runner/base_cuda_graph_runner.py,
  get_batch_sizes_to_capture; the pool's size from mem_cache/kv_cache_configurator.py,
  KVCacheConfigurator.resolve_max_num_reqs), each graph at bs x the tokens per request
  (model_runner.py, decode_num_tokens_per_req: 1, or the draft tokens under speculation),
  captured largest first into the global graph pool (runner/decode_cuda_graph_runner.py,
  _capture_one_stream; runner_backend/full_cuda_graph_backend.py, capture_session);
- the KV pool: free memory after the weights, less the memory free before the model loaded
  times (1 - fraction) (mem_cache/kv_cache_configurator.py,
  KVCacheConfigurator._profile_available_bytes);
- the KV cell of a DSA model's fp8 cache, the indexer's keys included
  (model_executor/pool_configurator.py, DefaultPoolConfigurator._compute_cell_size and
  _compute_dsa_indexer_cell_size; mem_cache/kv_cache_configurator.py,
  calculate_mla_kv_cache_dim).

SGLang measures GPU memory in MiB as `nvidia-smi --query-gpu=memory.total` prints it
(utils/common.py, get_nvgpu_memory_capacity), so `gpu_memory_mib` here is nvidia-smi's figure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from pydantic import BeforeValidator

from mlamem.errors import UserError
from mlamem.scenario import FieldError, check_positive, section_model

GiB_MIB = 1024  # SGLang writes its reserve terms in MiB, GiB as 1024
FLOOR_MIB = 10 * GiB_MIB  # the reserve's floor on a GPU of over 60 GiB
MLA_PREFILL_GRAPH_MIB = 1.5 * GiB_MIB  # "MLA backend overhead is much higher than expected"
DEEPEP_MIB = 2 * GiB_MIB  # DeepEP's all-to-all buffers in the decode graph
DEEPEP_PREFILL_GRAPH_MIB = 1 * GiB_MIB  # DeepEP under breakable prefill graphs (bridge pool)
MLA_PREFILL_GRAPH_MAX_TOKENS = 8192  # an MLA model's prefill graphs capture at most this
FP8_QUANT_BLOCK = 128  # DSATokenToKVPool.quant_block_size: one fp32 scale per 128 latent values
ROPE_STORAGE_BYTES = 2  # DSATokenToKVPool.rope_storage_dtype: RoPE kept in bf16

# (below this many MiB, chunked_prefill_size, decode max_bs for TP < 4, for TP >= 4); the last
# row is every larger GPU (handle_gpu_memory_settings' comments name the GPUs of each row)
CAPACITY_ROWS = ((20 * GiB_MIB, 2048, 8, 8),  # T4, 4080
                 (35 * GiB_MIB, 4096, 48, 160),  # A10, 4090, 5090
                 (60 * GiB_MIB, 4096, 32, 160),  # A100 40GB, L40
                 (90 * GiB_MIB, 8192, 256, 512),  # H100, A100 80GB
                 (160 * GiB_MIB, 8192, 256, 512),  # H20, H200
                 (None, 16384, 512, 512))  # B200, MI300


# a TOML (or JSON) list of batch sizes, kept as a tuple
BatchSizes = Annotated[tuple[int, ...], BeforeValidator(lambda v: tuple(v) if isinstance(v, list) else v)]


@section_model
class SGLangSection:
    """The scenario's `[sglang]` table: SGLang's memory flags, None where SGLang derives them."""

    mem_fraction_static: float | None = None  # --mem-fraction-static; None: the reserve rule
    chunked_prefill_size: int | None = None  # --chunked-prefill-size; None: the GPU's default
    max_running_requests: int | None = None  # --max-running-requests; caps the default max_bs
    index_head_dim: int = 128  # the DSA indexer's key width (config.json index_head_dim)
    # the decode CUDA graphs (repro-oom --cuda-graphs on)
    cuda_graph_max_bs: int | None = None  # --cuda-graph-max-bs-decode; None: the GPU's default
    cuda_graph_bs: BatchSizes | None = None  # --cuda-graph-bs-decode; None: SGLang's list
    speculative_num_draft_tokens: int | None = None  # tokens per request in a decode graph
    #                                                   (speculative decoding); None: 1

    def __post_init__(self) -> None:
        if self.mem_fraction_static is not None and not 0 < self.mem_fraction_static < 1:
            raise FieldError("sglang", "mem_fraction_static", "must be in (0, 1)")
        for name in ("chunked_prefill_size", "max_running_requests", "cuda_graph_max_bs",
                     "speculative_num_draft_tokens"):
            if getattr(self, name) is not None:
                check_positive(self, "sglang", name)
        check_positive(self, "sglang", "index_head_dim")
        if self.cuda_graph_bs is not None and (not self.cuda_graph_bs
                                               or min(self.cuda_graph_bs) < 1):
            raise FieldError("sglang", "cuda_graph_bs",
                             f"expected positive batch sizes, got {list(self.cuda_graph_bs)}")

    @property
    def decode_max_bs(self) -> int | None:
        """The decode graphs' largest batch as given: the list's largest, else
        cuda_graph_max_bs (handle_gpu_memory_settings sets max_bs = max(bs) for a given list)."""
        return max(self.cuda_graph_bs) if self.cuda_graph_bs else self.cuda_graph_max_bs


def capacity_defaults(gpu_memory_mib: float, tp_size: int) -> tuple[int, int]:
    """SGLang's default chunked_prefill_size and decode graphs' max batch for this GPU."""
    for below, chunk, small_tp, large_tp in CAPACITY_ROWS:
        if below is None or gpu_memory_mib < below:
            return chunk, small_tp if tp_size < 4 else large_tp
    raise AssertionError("the last row has no bound")


def decode_graph_batch_sizes(max_bs: int, speculative: bool = False) -> list[int]:
    """The decode batch sizes SGLang captures, ascending, for a largest batch `max_bs`."""
    if speculative:  # less padding at small batches
        sizes = [*range(1, 9), *range(10, 33, 2), *range(40, 65, 4), *range(72, 257, 8),
                 *range(272, max_bs + 1, 16)]
    else:
        sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16),
                 *range(512, max_bs + 1, 32)]
    sizes = [s for s in sizes if s <= max_bs]
    return sizes if max_bs in sizes else [*sizes, max_bs]


def prefill_graph_batch_sizes(max_tokens: int) -> list[int]:
    """The prefill token counts SGLang captures, ascending, up to `max_tokens`."""
    sizes = [*range(4, 33, 4), *range(48, 257, 16), *range(288, 513, 32), *range(576, 1025, 64),
             *range(1280, 4097, 256), *range(4608, max_tokens + 1, 512)]
    return [s for s in sizes if s <= max_tokens]


def max_num_reqs(kv_tokens: int, context_len: int, max_running_requests: int | None,
                 attn_dp_size: int = 1) -> int:
    """resolve_max_num_reqs: the request pool's size per attention-DP worker, from the KV pool's
    tokens: --max-running-requests // DP where given, else int(tokens / context_len x 512)
    clamped to 2048..4096; at most tokens // 2 either way."""
    if max_running_requests is not None:
        return min(max(1, max_running_requests // attn_dp_size), kv_tokens // 2)
    return min(max(min(int(kv_tokens / context_len * 512), 4096), 2048), kv_tokens // 2)


def graph_alignment(tp_size: int, attn_dp_size: int) -> int:
    """get_cuda_graph_batch_size_alignment without two-batch overlap or context parallel: the
    attention-TP size where the graphs need a gathered buffer, which attention DP brings
    (utils/common.py, require_mlp_tp_gather, at the default moe_dense_tp_size and no all-to-all
    backend), else 1."""
    return tp_size // attn_dp_size if attn_dp_size > 1 else 1


def decode_capture_batches(max_bs: int, requests: int, *, given: tuple[int, ...] | None = None,
                           speculative: bool = False, tokens_per_request: int = 1,
                           alignment: int = 1) -> list[int]:
    """The decode batch sizes the runner captures, in its order (largest first):
    get_batch_sizes_to_capture on the list (given, else SGLang's for `max_bs`): the request
    pool (`requests`, max_num_reqs) rounded up to `alignment` is added where the list goes past
    it, then only sizes within it whose tokens (bs x tokens per request) are a multiple of
    `alignment` stay."""
    pool = -(-requests // alignment) * alignment
    sizes = list(given) if given else decode_graph_batch_sizes(max_bs, speculative)
    if max(sizes) > pool:
        sizes.append(pool)
    return sorted({s for s in sizes if s <= pool and s * tokens_per_request % alignment == 0},
                  reverse=True)


@dataclass(frozen=True)
class Resolved:
    """SGLang's settings after handle_gpu_memory_settings, with the reserve's terms in MiB."""

    chunked_prefill_size: int
    decode_max_bs: int
    decode_batch_sizes: tuple[int, ...]  # empty with decode graphs off
    prefill_batch_sizes: tuple[int, ...]  # empty with prefill graphs off
    activation_mib: float  # 512 + 1.5 x max(chunked_prefill_size, 2048)
    parallel_mib: float  # TP x PP / 8 GiB
    graph_mib: float  # reserve_for_graph_mb (DeepEP's prefill-graph term among them)
    deepep_mib: float  # reserve_for_deepep_a2a_mb: on top of the floor
    reserved_mib: float  # the sum, floored at 10 GiB on a GPU of over 60 GiB, DeepEP's on top
    mem_fraction_static: float  # given, or (gpu - reserved) / gpu rounded to 3 places
    fraction_given: bool


def resolve(gpu_memory_mib: float, *, tp_size: int, pp_size: int = 1, attn_dp_size: int = 1,
            chunked_prefill_size: int | None = None, cuda_graph_max_bs: int | None = None,
            max_running_requests: int | None = None, mem_fraction_static: float | None = None,
            decode_graphs: bool = True, prefill_graphs: bool = True, mla: bool = True,
            speculative: bool = False, deepep: bool = False) -> Resolved:
    """handle_gpu_memory_settings for an aggregated (not disaggregated) server on CUDA. An MLA
    model never takes the post-capture KV sizing (overrides.py, post_capture_kv_sizing_planned),
    so the reserve is the pre-capture one. Prefill graphs are SGLang's default on CUDA (the
    breakable backend, default_prefill_backend); `prefill_graphs=False` stands for
    `--cuda-graph-backend-prefill disabled`; `deepep` for `--moe-a2a-backend deepep`, which adds
    a prefill-graph term (reserve_for_graph_mb) and a decode-graph one over the floor
    (reserve_for_deepep_a2a_mb)."""
    if mem_fraction_static is not None and not 0 < mem_fraction_static < 1:
        raise UserError(f"{mem_fraction_static} is outside (0, 1)", field="sglang.mem_fraction_static")
    chunk_default, max_bs_default = capacity_defaults(gpu_memory_mib, tp_size)
    chunk = chunk_default if chunked_prefill_size is None else chunked_prefill_size
    max_bs = max_bs_default if cuda_graph_max_bs is None else cuda_graph_max_bs
    if cuda_graph_max_bs is None and max_running_requests is not None:
        max_bs = min(max_bs, max_running_requests)  # only a default max_bs follows the requests
    prefill_max = min(MLA_PREFILL_GRAPH_MAX_TOKENS, chunk) if mla else chunk
    decode_sizes = decode_graph_batch_sizes(max_bs, speculative) if decode_graphs else []
    prefill_sizes = prefill_graph_batch_sizes(prefill_max) if prefill_graphs else []

    activation = 512 + max(chunk, 2048) * 1.5
    parallel = tp_size * pp_size / 8 * GiB_MIB
    graph = max_bs * 2 if decode_graphs else 0.0
    if attn_dp_size > 1:  # attention-DP pads more, and more again past 300
        graph += max_bs * attn_dp_size * 3 + (max_bs * attn_dp_size * 1.5 if max_bs > 300 else 0)
    if prefill_graphs:
        graph += MLA_PREFILL_GRAPH_MIB if mla else len(prefill_sizes) * 8
        if deepep:  # reserve_for_graph_mb: BREAKABLE prefill and moe_a2a_backend "deepep"
            graph += DEEPEP_PREFILL_GRAPH_MIB
    reserved = activation + parallel + graph
    if gpu_memory_mib > 60 * GiB_MIB:
        reserved = max(reserved, FLOOR_MIB)
    deepep_mib = DEEPEP_MIB if deepep and decode_graphs else 0.0
    reserved += deepep_mib
    fraction = (mem_fraction_static if mem_fraction_static is not None
                else round((gpu_memory_mib - reserved) / gpu_memory_mib, 3))
    return Resolved(chunk, max_bs, tuple(decode_sizes), tuple(prefill_sizes), activation, parallel,
                    graph, deepep_mib, reserved, fraction, mem_fraction_static is not None)


def dsa_fp8_cell_bytes(*, kv_lora_rank: int, qk_rope_head_dim: int, index_head_dim: int,
                       num_layers: int, index_kpool: int = 1) -> int:
    """Bytes per token of a DSA model's fp8 KV cache on one rank: per layer the fp8 latent, its
    fp32 scales per 128 values and the bf16 RoPE part, plus the indexer's fp8 keys with their
    scales (uint8 storage), for every layer."""
    if kv_lora_rank % FP8_QUANT_BLOCK:
        raise UserError(f"kv_lora_rank {kv_lora_rank} is not a multiple of {FP8_QUANT_BLOCK}, as "
                        "SGLang's fp8 DSA cache needs", field="model.kv_lora_rank")
    latent = kv_lora_rank + kv_lora_rank // FP8_QUANT_BLOCK * 4 + qk_rope_head_dim * ROPE_STORAGE_BYTES
    indexer = -(-(index_head_dim + index_head_dim // FP8_QUANT_BLOCK * 4) // index_kpool)
    return (latent + indexer) * num_layers


def kv_pool_bytes(free_after_weights_bytes: int, free_before_model_bytes: int,
                  mem_fraction_static: float) -> int:
    """_profile_available_bytes: the free memory after the weights less the memory free before
    the model loaded times (1 - fraction), in SGLang's own arithmetic (GB floats, then bytes).
    Zero or less means SGLang refuses to start (its "Loaded weights leave no GPU memory")."""
    gb = 1 << 30
    rest = free_after_weights_bytes / gb - free_before_model_bytes / gb * (1 - mem_fraction_static)
    return int(rest * gb)


def fraction_for_pool(pool_bytes: int, free_after_weights_bytes: int,
                      free_before_model_bytes: int) -> float:
    """The smallest mem_fraction_static (3 places, as SGLang's suggestion rounds) whose pool is at
    least `pool_bytes`."""
    needed = 1 - (free_after_weights_bytes - pool_bytes) / free_before_model_bytes
    fraction = max(0.001, -(-round(needed * 1e6) // 1000) / 1000)
    while kv_pool_bytes(free_after_weights_bytes, free_before_model_bytes, fraction) < pool_bytes:
        fraction = round(fraction + 0.001, 3)
    return fraction
