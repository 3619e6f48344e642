"""SGLang, as the spec layer knows it (no torch): its scenario table `[sglang]` (`SGLangSection`),
its rules at SGLang 0.5.23, its `python -m sglang.launch_server` / `sglang serve` parser and how
its saved results read (`SPEC`); its rank is `mlamem.engines.sglang`.

SGLang 0.5.23's own memory rules, without torch, each read from its source (the wheel,
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
  calculate_mla_kv_cache_dim), and with EAGLE drafting the draft layers' latent and indexer keys
  in the same cell (DefaultPoolConfigurator.__init__);
- speculative decoding: EAGLE (NEXTN is its alias) drafting with the checkpoint's own MTP
  layers, its steps, top-k and draft tokens as given or auto-chosen, and 48 running requests
  unless given (arg_groups/speculative_hook.py, _handle_eagle_family and
  _auto_choose_speculative_params).

SGLang measures GPU memory in MiB as `nvidia-smi --query-gpu=memory.total` prints it
(utils/common.py, get_nvgpu_memory_capacity), so `gpu_memory_mib` here is nvidia-smi's figure.

The serve command: `python -m sglang.launch_server ...` (or `sglang serve ...`) as SGLang 0.5.23's
parser reads it.

Every flag of SGLang 0.5.23's server is in sglang-0.5.23-flags.json (written from the wheel by
scripts/sglang_serve_flags.py), with its aliases and choices; prepare_server_args
(srt/server_args.py) builds a plain argparse parser, so `--x=y` and abbreviations work as there.
`sglang serve MODEL` takes the model as its first word (cli/serve.py,
_normalize_positional_model_path) and drops `--model-type` (_extract_model_type_override). The
flags mlamem models have their types here; any other that the command sets is named in the notes.

The scenario is SGLang's rank (engines/sglang.py): a DSA model's sparse decode over the fp8
cache (`--kv-cache-dtype fp8_e4m3`), its [sglang] table holding the command's memory flags.
Defaults follow SGLang 0.5.23: arg_groups/memory_hook.py handle_gpu_memory_settings (the chunked
prefill size by the GPU's memory, mem_fraction_static by the reserve rule), read from
the rules above; arg_groups/parallel_hook.py handle_deprecated_dp_attention
(`--dp-size N --enable-dp-attention` is `--attn-dp-size N`); arg_groups/cuda_graph_hook.py
(--disable-cuda-graph turns both phases' graphs off). The decode graphs' settings
(--cuda-graph-max-bs-decode, --cuda-graph-bs-decode) go to the [sglang] table; a command whose
decode graphs are on says to run repro-oom with --cuda-graphs on.

`--config FILE` is read as SGLang 0.5.23 reads it: `with_config_file`.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Annotated

from pydantic import BeforeValidator

from mlamem.spec.engines import AnyScenario, Column, EngineSpec, Verdict, View
from mlamem.spec.engines.decode_view import (
    budget_segments,
    failed_alloc_cell,
    gain_cell,
    gib_cell,
    kv_cell,
    safe_cell,
    step_need_bytes,
)
from mlamem.spec.engines.dsa_cache import indexer_key_bytes
from mlamem.spec.errors import UserError
from mlamem.spec.models import hf_config
from mlamem.spec.sections import FieldError, check_positive, section_model
from mlamem.spec.serve_command import config_file
from mlamem.spec.serve_command.parsed import EngineParser, Parsed
from mlamem.spec.units import MAX_TOKENS as MAX_INT  # a count's bound (int32)

VERSION = "0.5.23"  # the SGLang version these rules were read from (older ones: sglang_rules)
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
    #                                                   (EAGLE speculative decoding); None: 1
    engine_version: str | None = None  # the SGLang whose rules the rank follows; None: VERSION

    def __post_init__(self) -> None:
        if self.mem_fraction_static is not None and not 0 < self.mem_fraction_static < 1:
            raise FieldError("sglang", "mem_fraction_static", "must be in (0, 1)")
        for name in ("chunked_prefill_size", "max_running_requests", "cuda_graph_max_bs",
                     "speculative_num_draft_tokens"):
            if getattr(self, name) is not None:
                check_positive(self, "sglang", name)
        check_positive(self, "sglang", "index_head_dim")
        if self.engine_version is not None:
            try:
                sglang_rules(self.engine_version)
            except UserError as error:
                raise FieldError("sglang", "engine_version", error.message) from None
        if self.cuda_graph_bs is not None and (not self.cuda_graph_bs
                                               or min(self.cuda_graph_bs) < 1):
            raise FieldError("sglang", "cuda_graph_bs",
                             f"expected positive batch sizes, got {list(self.cuda_graph_bs)}")

    @property
    def running_requests(self) -> int | None:
        """max_running_requests as the request pool reads it: the given, else SGLang's 48 under
        speculative decoding (SPECULATIVE_MAX_RUNNING_REQUESTS), else None (the pool's rule)."""
        if self.max_running_requests is None and self.speculative_num_draft_tokens is not None:
            return SPECULATIVE_MAX_RUNNING_REQUESTS
        return self.max_running_requests

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
                       num_layers: int, index_kpool: int = 1,
                       indexer_layers: int | None = None, draft_layers: int = 0,
                       latent_as_stored: bool = True) -> int:
    """Bytes per token of a DSA model's fp8 KV cache on one rank: per layer the fp8 latent, its
    fp32 scales per 128 values and the bf16 RoPE part, plus the indexer's fp8 keys with their
    scales (uint8 storage) in `indexer_layers` of them (indexer_layer_count; None: every layer;
    0: none). `latent_as_stored` False: the latent counted as kv_lora_rank + qk_rope_head_dim
    one-byte values, as SGLang before 0.5.17 sizes the pool (SIZING_CELL_STORED_FROM).
    With EAGLE drafting (`draft_layers`, the draft's eagle_draft_num_layers), the target's cell
    also holds the draft pool's share (model_executor/pool_configurator.py,
    DefaultPoolConfigurator.__init__ for a DSA model): int(the latent part x draft layers /
    layers), in its float arithmetic, and the draft layers' indexer keys
    (_compute_dsa_indexer_cell_size with allocate_all_layers)."""
    if kv_lora_rank % FP8_QUANT_BLOCK:
        raise UserError(f"kv_lora_rank {kv_lora_rank} is not a multiple of {FP8_QUANT_BLOCK}, as "
                        "SGLang's fp8 DSA cache needs", field="model.kv_lora_rank")
    latent = (kv_lora_rank + kv_lora_rank // FP8_QUANT_BLOCK * 4 + qk_rope_head_dim * ROPE_STORAGE_BYTES
              if latent_as_stored else kv_lora_rank + qk_rope_head_dim)
    indexer = indexer_key_bytes(index_head_dim, index_kpool)
    target_kv = latent * num_layers
    cell = target_kv + indexer * (num_layers if indexer_layers is None else indexer_layers)
    if draft_layers:
        cell += int(target_kv * draft_layers / num_layers) + indexer * draft_layers
    return cell


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


# -- engine versions: the rules that differ among the SGLang versions users run --
# Read from the wheels of 0.4.6.post5, 0.4.7-0.4.10, 0.5.1-0.5.10, 0.5.15 and 0.5.20
# (`pip download --no-deps sglang==X`; srt/server_args.py unless named); a version between two
# read keeps the older one's rules.

OLDEST_VERSION = (0, 4, 6)
FRACTION_BY_GPU_FROM = (0, 4, 8)  # ServerArgs.__post_init__: reserved_mem by the GPU's row
B200_ROW_FROM = (0, 4, 7)  # ... by TP: 0.79 and 16384 tokens past 180000 MiB on CUDA
RESERVE_RULE_FROM = (0, 5, 3)  # _handle_gpu_memory_settings: 512 + 1.5 x chunk + 2 x max_bs ...
# a DSA model's prefill graphs (their 1.5 GiB in the reserve): enable_piecewise_cuda_graph False
# by default to 0.5.9; configs/model_config.py piecewise_cuda_graph_disabled_model_archs holds
# DeepseekV32ForCausalLM and GlmMoeDsaForCausalLM in 0.5.10, neither in 0.5.15
DSA_PREFILL_GRAPHS_FROM = (0, 5, 15)
# models/deepseek_v2.py DeepseekV32ForCausalLM, SGLang's first DSA model, from 0.5.3 (GLM-5's
# GlmMoeDsaForCausalLM in configs/model_config.py from 0.5.9)
DSA_MODELS_FROM = (0, 5, 3)
GLM_DSA_FROM = (0, 5, 9)  # configs/model_config.py names GlmMoeDsaForCausalLM from 0.5.9 (not 0.5.8)
# IndexCache: model_executor/pool_configurator.py _compute_dsa_indexer_cell_size gives index-K
# only to the layers that compute their own top-k (configs/model_config.py dsa_layer_skips_topk)
# from 0.5.18; every layer before (0.5.17's)
INDEXER_ON_OWN_LAYERS_FROM = (0, 5, 18)
# The cell SGLang divides the pool's memory by, where it is not the one it allocates: its
# latent as (kv_lora_rank + qk_rope_head_dim) x the fp8 element's byte before 0.5.17, where the
# DSA pool (mem_cache/memory_pool.py DSATokenToKVPool, kv_cache_dim) stores 656 B a layer for
# DeepSeek's 512 + 64 (model_executor/pool_configurator.py DefaultPoolConfigurator.
# _compute_cell_size in 0.5.13-0.5.16, model_runner.py or model_runner_kv_cache_mixin.py
# before; 0.5.17 sizes with calculate_mla_kv_cache_dim); and without the indexer's keys in 0.5.3
# (0.5.4 adds them, SGLang PR 11309), which the pool allocates all the same. So the pool holds more
# than the budget it was sized from.
SIZING_CELL_STORED_FROM = (0, 5, 17)
SIZING_INDEXER_FROM = (0, 5, 4)
# model_executor/cuda_graph_runner.py get_batch_sizes_to_capture before the reserve rule:
RUNNER_BS = (1, 2, 4, 8, *range(16, 161, 8))  # then + range(160, 257, 8) on a large GPU


@dataclass(frozen=True)
class SGLangRules:
    """What differs by SGLang version, each read from that version's wheel (the _FROM constants
    above name the file and the first version of each rule)."""

    version: str
    series: tuple[int, int, int]
    # mem_fraction_static without the flag: "by-tp" (0.4.6-0.4.7), "by-gpu" (0.4.8-0.5.2),
    # "reserve" (from 0.5.3, `resolve`)
    fraction_rule: str
    dsa_prefill_graphs: bool  # a DSA model's prefill graphs are on, and in the reserve
    indexer_on_own_layers: bool = True  # index-K only on the layers computing their top-k
    sizing_cell_stored: bool = True  # the pool sized with the latent as stored (656 B a layer)
    sizing_indexer: bool = True  # ... and with the indexer's keys


def sglang_rules(version: str | None) -> SGLangRules:
    """The rules of SGLang `version` (e.g. 0.5.5.post1; None: VERSION); UserError outside the
    versions read (0.4.6 to 0.5.23)."""
    version = VERSION if version is None else version
    match = re.fullmatch(r"v?(\d+)\.(\d+)\.(\d+)([.+\-]?[0-9A-Za-z.+\-]*)", version.strip())
    series = (int(match[1]), int(match[2]), int(match[3])) if match else None
    if series is None or not OLDEST_VERSION <= series <= (0, 5, 23):
        shown = version if len(version) <= 40 else f"{version[:40]}…"
        raise UserError(f"{shown!r}: mlamem reads SGLang's rules of 0.4.6 to {VERSION} (the "
                        f"default is {VERSION}); give one such as 0.5.5", field="engine_version")
    rule = ("reserve" if series >= RESERVE_RULE_FROM else
            "by-gpu" if series >= FRACTION_BY_GPU_FROM else "by-tp")
    return SGLangRules(version.strip().lstrip("v"), series, rule,
                       series >= DSA_PREFILL_GRAPHS_FROM, series >= INDEXER_ON_OWN_LAYERS_FROM,
                       series >= SIZING_CELL_STORED_FROM, series >= SIZING_INDEXER_FROM)


def indexer_layer_count(scenario: AnyScenario, rules: SGLangRules) -> int:
    """The layers whose index-K the pool holds: with IndexCache (index_topk_freq > 1) those that
    compute their own top-k, layer i skipping where max(i - offset + 1, 0) % freq != 0, offset
    the config's index_skip_topk_offset, else 2 (`max(layer_id - 1, 0) % freq`:
    configs/model_config.py dsa_layer_skips_topk; a config's indexer_types, which 0.5.23 reads
    first, gives the same 21 layers for GLM-5.2); every layer before 0.5.18."""
    model = scenario.model
    freq = model.index_topk_freq or 1
    if freq == 1 or not rules.indexer_on_own_layers:
        return model.num_layers
    offset = 2 if model.index_skip_topk_offset is None else model.index_skip_topk_offset
    return sum(max(i - offset + 1, 0) % freq == 0 for i in range(model.num_layers))


@dataclass(frozen=True)
class VersionDefaults:
    """An SGLang version's defaults for a DSA model's server on one GPU."""

    mem_fraction_static: float
    chunked_prefill_size: int
    reserved_mib: float | None  # the reserve the fraction comes from (None: by TP)
    cuda_graph_bs: tuple[int, ...] | None  # the runner's decode list; None: 0.5.23's rule


def version_defaults(rules: SGLangRules, gpu_mib: float, *, tp_size: int, pp_size: int = 1,
                     attn_dp_size: int = 1, dp_attention: bool = False,
                     decode_graphs: bool = True) -> VersionDefaults:
    """mem_fraction_static, chunked_prefill_size and the decode graph list SGLang `rules`
    derives on a GPU of `gpu_mib` (nvidia-smi's MiB) without the flags, for an aggregated
    server without speculative decoding."""
    if rules.fraction_rule == "reserve":
        resolved = resolve(gpu_mib, tp_size=tp_size, pp_size=pp_size, attn_dp_size=attn_dp_size,
                           decode_graphs=decode_graphs, prefill_graphs=rules.dsa_prefill_graphs)
        return VersionDefaults(resolved.mem_fraction_static, resolved.chunked_prefill_size,
                               resolved.reserved_mib, None)
    parallel = tp_size * pp_size
    if rules.fraction_rule == "by-gpu":  # 0.4.10 server_args.py __post_init__
        rows = ((20, 2.8 + parallel / 10), (35, 2.8 + parallel / 10), (90, 9.5 + parallel / 2),
                (160, 12 + parallel / 2), (None, 32))
        reserved = next(gib for below, gib in rows if below is None or gpu_mib < below * GiB_MIB)
        reserved = reserved * GiB_MIB + (4 * GiB_MIB if dp_attention else 0)
        fraction = round((gpu_mib - reserved) / gpu_mib, 3)
        chunk = 2048 if gpu_mib < 35 * GiB_MIB else 8192 if gpu_mib < 160 * GiB_MIB else 16384
        return VersionDefaults(fraction, chunk, reserved, _runner_bs(rules, gpu_mib))
    return _by_tp(rules, gpu_mib, parallel)


def _by_tp(rules: SGLangRules, gpu_mib: float, parallel: int) -> VersionDefaults:
    """0.4.6.post5's and 0.4.7's server_args.py __post_init__: a fraction by TP x PP on a GPU of
    at most 80 GiB, 0.88 above, raised past 96 GiB; 0.79 past 180000 MiB from 0.4.7."""
    b200 = rules.series >= B200_ROW_FROM and gpu_mib > 180_000
    fraction = 0.88
    if gpu_mib <= 81920:
        fraction = next(f for least, f in ((16, 0.79), (8, 0.81), (4, 0.85), (2, 0.87), (1, 0.88))
                        if parallel >= least)
    if b200:
        fraction = 0.79
    elif gpu_mib > 96 * GiB_MIB:
        fraction = min(fraction + 48 * GiB_MIB * (1 - fraction) / gpu_mib,
                       (gpu_mib - 18 * GiB_MIB) / gpu_mib)
    chunk = 16384 if b200 else 2048 if gpu_mib < 25_000 else 8192
    return VersionDefaults(fraction, chunk, None, _runner_bs(rules, gpu_mib))


def _runner_bs(rules: SGLangRules, gpu_mib: float) -> tuple[int, ...]:
    """get_batch_sizes_to_capture's default list: past 96 GiB (0.4.6.post5) or 90 GiB
    (0.4.8-0.5.2) + range(160, 257, 8), past 160000 MiB + range(256, 513, 16) (0.4.8-0.5.2)."""
    newer = rules.series >= FRACTION_BY_GPU_FROM
    sizes = list(RUNNER_BS)
    if gpu_mib > (90 if newer else 96) * GiB_MIB:
        sizes += range(160, 257, 8)
    if newer and gpu_mib > 160_000:
        sizes += range(256, 513, 16)
    return tuple(sorted(set(sizes)))


# -- speculative decoding: SGLang 0.5.23's arg_groups/speculative_hook.py --

# the algorithm mlamem models: EAGLE drafting with the checkpoint's own MTP layers; NEXTN is its
# alias (speculative/spec_registry.py _RESERVED_ALIASES; _resolve_speculative_algorithm_alias)
EAGLE, ALIASES = "EAGLE", {"NEXTN": "EAGLE"}
# speculative/spec_info.py SpeculativeAlgorithm's other built-ins: not modelled
OTHER_ALGORITHMS = ("DFLASH", "UNO", "DSPARK", "EAGLE3", "FROZEN_KV_MTP", "STANDALONE", "NGRAM")
SPECULATIVE_FROM = (0, 5, 23)  # the speculative rules were read from 0.5.23 only
SPECULATIVE_MAX_RUNNING_REQUESTS = 48  # _handle_eagle_family, without --max-running-requests
# _handle_eagle_family: these architectures draft with their own checkpoint's MTP layers (the
# draft path defaults to --model-path)
MTP_DRAFT_ARCHITECTURES = (
    "DeepseekV32ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV4ForCausalLM",
    "Glm4MoeForCausalLM", "Glm4MoeLiteForCausalLM", "GlmMoeDsaForCausalLM",
    "BailingMoeForCausalLM", "BailingMoeV2ForCausalLM", "BailingMoeV2_5ForCausalLM",
    "MistralLarge3ForCausalLM", "PixtralForConditionalGeneration", "HYV3ForCausalLM",
    "HYV4ForCausalLM", "Qwen4ExpForConditionalGeneration")
# _auto_choose_speculative_params: (steps, top-k, draft tokens); every other architecture (DSA
# models' among them) and STANDALONE take (3, 1, 4)
AUTO_WIDE = ("LlamaForCausalLM", "Grok1ForCausalLM", "Grok1VForCausalLM")


def auto_speculative_params(algorithm: str, architecture: str | None) -> tuple[int, int, int]:
    """_auto_choose_speculative_params: (steps, top-k, draft tokens) where only the algorithm is
    given: (5, 4, 8) for Llama and Grok-1, (3, 1, 4) for STANDALONE and every other model."""
    if algorithm != "STANDALONE" and architecture in AUTO_WIDE:
        return 5, 4, 8
    return 3, 1, 4


def _algorithm_note(algorithm: str) -> str:
    """Why an algorithm other than EAGLE is not modelled, in one note."""
    name = algorithm.upper()
    if name == "MTP":
        why = ("SGLang 0.5.23 has no algorithm of that name (speculative/spec_info.py, "
               "SpeculativeAlgorithm.from_string refuses it unless a plug-in registers it); NEXTN "
               "and EAGLE draft with the checkpoint's MTP layers")
    elif name in OTHER_ALGORITHMS:
        why = "mlamem models EAGLE (NEXTN) drafting with the checkpoint's own MTP layers only"
    else:
        why = ("no built-in algorithm of SGLang 0.5.23 (speculative/spec_info.py: a plug-in's, "
               "else refused at start-up)")
    return (f"--speculative-algorithm {algorithm}: not modelled ({why}); the rank runs without "
            "drafting")


def _check_draft_counts(given: dict, prog: str) -> None:
    """The three counts as _handle_eagle_family takes them: at least 1; top-k or draft tokens
    without steps trip its assert; steps without top-k its `speculative_eagle_topk > 1` (None
    against an int); top-k over 1 its check of the page (a DSA model's is 64, its backend dsa:
    arg_groups/model_overrides/deepseek_v2.py)."""
    steps, topk, tokens = (given.get(f"speculative_{key}") for key in
                           ("num_steps", "eagle_topk", "num_draft_tokens"))
    for flag, value in (("num-steps", steps), ("eagle-topk", topk), ("num-draft-tokens", tokens)):
        if value is not None and value < 1:
            raise UserError(f"{prog} --speculative-{flag} {value}: must be at least 1",
                            field="serve")
    if steps is None and (topk, tokens) != (None, None):
        raise UserError(f"{prog}: SGLang 0.5.23 asserts that neither --speculative-eagle-topk nor "
                        "--speculative-num-draft-tokens is set without --speculative-num-steps "
                        "(speculative_hook.py _handle_eagle_family): give --speculative-num-steps "
                        "too, or none of the three for its auto-chosen ones", field="serve")
    if steps is not None and topk is None:
        raise UserError(f"{prog} --speculative-num-steps {steps}: SGLang 0.5.23 fails at start-up "
                        "without a top-k (speculative_hook.py _handle_eagle_family compares it "
                        "with 1): give --speculative-eagle-topk 1", field="serve")
    if topk is not None and topk > 1:
        raise UserError(f"{prog} --speculative-eagle-topk {topk}: SGLang 0.5.23 refuses a top-k "
                        "over 1 with a page over 1 on its dsa backend (speculative_hook.py "
                        "_handle_eagle_family), and a DSA model takes a page of 64 "
                        "(model_overrides/deepseek_v2.py): give --speculative-eagle-topk 1",
                        field="serve")


def speculative(given: dict, model: str, rules: SGLangRules, prog: str) -> tuple[dict | None, str | None]:
    """The command's drafting as mlamem models it (the algorithm and the counts given), or None
    with the one note that says why not: no --speculative-algorithm (None, None), another
    algorithm, another draft checkpoint than the model's own, or a version before 0.5.23."""
    algorithm = given.get("speculative_algorithm")
    if algorithm is None:
        return None, None
    if ALIASES.get(algorithm.upper(), algorithm.upper()) != EAGLE:
        return None, _algorithm_note(algorithm)
    if rules.series < SPECULATIVE_FROM:
        return None, (f"--speculative-algorithm {algorithm}: SGLang {rules.version}'s speculative "
                      f"decoding is not modelled (its rules were read from {VERSION}); the rank "
                      "runs without drafting")
    draft = given.get("speculative_draft_model_path", model)
    if draft != model:
        return None, (f"--speculative-draft-model-path {draft}: another draft checkpoint than the "
                      "model's own MTP layers, not modelled; the rank runs without drafting")
    _check_draft_counts(given, prog)
    return {"algorithm": algorithm, **{key: given.get(f"speculative_{key}") for key in
                                       ("num_steps", "eagle_topk", "num_draft_tokens")}}, None


def _speculative_defaults(parsed: Parsed, config: hf_config.ModelConfig) -> None:
    """The draft tokens per request SGLang 0.5.23 settles on (_handle_eagle_family): the given
    steps + 1 with top-k 1, else _auto_choose_speculative_params'; to [sglang], with a note."""
    drafting = parsed.engine_settings.get("speculative")
    if drafting is None:
        return
    if config.architecture not in MTP_DRAFT_ARCHITECTURES or not config.num_nextn_predict_layers:
        raise UserError(f"{parsed.prog} --speculative-algorithm {drafting['algorithm']}: SGLang "
                        "0.5.23 drafts with the checkpoint's own MTP layers only for "
                        f"{', '.join(MTP_DRAFT_ARCHITECTURES[:6])}, ... (speculative_hook.py "
                        "_handle_eagle_family), and this model's config names "
                        f"{config.architecture} with {config.num_nextn_predict_layers} MTP layers: "
                        "leave out the speculative flags", field="serve")
    steps, topk, given = (drafting[key] for key in ("num_steps", "eagle_topk", "num_draft_tokens"))
    how = "given"
    if steps is None:
        steps, topk, given = auto_speculative_params(EAGLE, config.architecture)
        how = f"SGLang 0.5.23's auto-chosen for {config.architecture}"
    tokens = steps + 1 if topk == 1 else given
    table = parsed.sections.setdefault("sglang", {})
    table["speculative_num_draft_tokens"] = tokens
    name = drafting["algorithm"].upper()  # handle_speculative_decoding upper-cases it
    alias = f"; {name} is SGLang's EAGLE" if name != EAGLE else ""
    adjusted = (f"; --speculative-num-draft-tokens {given} is steps + 1 = {tokens} with top-k 1"
                if given not in (None, tokens) else "")
    requests = table.get("max_running_requests") or SPECULATIVE_MAX_RUNNING_REQUESTS
    parsed.notes.append(
        f"speculative decoding: EAGLE (steps {steps}, top-k {topk}, {tokens} draft tokens, {how})"
        f"{alias}{adjusted} (speculative_hook.py _handle_eagle_family): the checkpoint's MTP "
        f"layers ({config.num_nextn_predict_layers}) drafting, their weights counted, their KV "
        "and indexer keys in each token's cell (pool_configurator.py), each decode graph at "
        f"{tokens} tokens per request, the request pool at {requests} running requests"
        + ("" if "max_running_requests" in table else " (SGLang's default under speculation)")
        + "; the draft worker's own CUDA graphs are not modelled")


def draft_kv_layers(scenario_model, section: SGLangSection) -> int:
    """The draft layers the KV cell holds: the model's MTP layers with EAGLE drafting on
    (model_runner_components/spec_aux_hidden_state.py _resolve_eagle_aux_hidden_state:
    eagle_draft_num_layers is the config's num_nextn_predict_layers), else 0."""
    if section.speculative_num_draft_tokens is None:
        return 0
    return scenario_model.num_nextn_predict_layers or 0


# -- the serve command --

PROGS = ("python -m sglang.launch_server", "sglang serve")


@cache
def flag_table() -> dict[str, dict]:
    """Every flag of the server's parser (`sglang-0.5.23-flags.json`): its kind, aliases, nargs and
    choices; read on first use, so loading a scenario does not parse the table."""
    return json.loads(resources.files("mlamem.spec.engines").joinpath("sglang-0.5.23-flags.json")
                      .read_text())["flags"]


@cache
def older_flag_table() -> dict[str, dict]:
    """The flags older versions' parser takes and 0.5.23's lacks (sglang-older-flags.json,
    written from their wheels by scripts/sglang_older_flags.py): each with the versions that
    have it."""
    return json.loads(resources.files("mlamem.spec.engines").joinpath("sglang-older-flags.json")
                      .read_text())["flags"]


# an older version's flag takes a value or none, as its kind allows, so either form parses
_OLDER_KINDS = {"flag": {"nargs": "?"}, "value": {"nargs": "?"}, "list": {"nargs": "*"}}


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version))


def pinned_version(flags: list[str]) -> str | None:
    """The newest version read whose parser takes every one of `flags` (flags of older versions
    only). None without such flags."""
    table = older_flag_table()
    newest = [max(table[flag]["versions"], key=_version_key) for flag in flags]
    return min(newest, key=_version_key) if newest else None


def older_flags_note(flags: list[str]) -> str:
    """One note naming the given flags that only older versions take, with those versions."""
    table = older_flag_table()
    named = [f"{flag} ({', '.join(table[flag]['versions'])})" for flag in flags]
    return (f"flags of older SGLang versions, not modelled (SGLang {VERSION} has none of them "
            "and refuses them): " + ", ".join(named))


# the page SGLang sets for a DSA model on CUDA, whatever --page-size says: 64 x the indexer's
# key pooling, 1 for DeepSeek-V3.2 and GLM-5 (model_overrides/deepseek_v2.py,
# _deepseek_family_overrides)
PAGE_SIZE = 64
_SI = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_IEC = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def sglang_int(text: str) -> int:
    """A count as SGLang writes it (utils/common.py, human_readable_int): SI suffixes k, M, G, T
    (25.6k is 25600), IEC suffixes Ki, Mi, Gi, Ti (1Ki is 1024, no decimals), case-sensitive."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", text.strip())
    try:
        if match is None:
            return int(text.strip())
        number, suffix = match.groups()
        if suffix in _IEC:
            return int(number) * _IEC[suffix]
        return int(float(number) * _SI[suffix])
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count such as 4096, 32k or 2Ki") from None


# the flags mlamem models: their types (None: a flag without a value, or one whose choices the
# table holds); dest is the flag without dashes, with underscores
MODELLED = {"--model-path": str, "--tp-size": int, "--dp-size": int, "--attn-dp-size": int,
            "--enable-dp-attention": None, "--mem-fraction-static": float,
            "--chunked-prefill-size": int, "--max-running-requests": int, "--kv-cache-dtype": None,
            "--context-length": sglang_int, "--page-size": int,
            "--cuda-graph-max-bs-decode": int, "--cuda-graph-bs-decode": int,
            "--cuda-graph-backend-decode": None, "--cuda-graph-backend-prefill": None,
            "--disable-cuda-graph": None, "--disable-decode-cuda-graph": None,
            "--disable-prefill-cuda-graph": None, "--dsa-decode-backend": None,
            "--dsa-prefill-backend": None, "--ep-size": int}
# the speculative flags' types (the flag table has none); named as not modelled unless drafting is
SPECULATIVE_TYPES = {"--speculative-num-steps": int, "--speculative-eagle-topk": int,
                     "--speculative-num-draft-tokens": int}
DSA_BACKEND = "flashmla_kv"  # what SGLang picks for a DSA model's fp8 cache on Hopper
# the speculative flags mlamem reads where it models the command's drafting (`speculative`)
SPECULATIVE_FLAGS = ("--speculative-algorithm", "--speculative-num-steps",
                     "--speculative-eagle-topk", "--speculative-num-draft-tokens",
                     "--speculative-draft-model-path")
# the scenario's fields as SGLang's flags set them
FIELD_FLAGS = {"tensor_parallel": "--tp-size", "attention_data_parallel": "--attn-dp-size",
               "max_model_len": "--context-length",
               "max_num_batched_tokens": "--chunked-prefill-size",
               "mem_fraction_static": "--mem-fraction-static",
               "chunked_prefill_size": "--chunked-prefill-size",
               "max_running_requests": "--max-running-requests",
               "cuda_graph_max_bs": "--cuda-graph-max-bs-decode",
               "cuda_graph_bs": "--cuda-graph-bs-decode"}
_KINDS = {"bool": {"action": argparse.BooleanOptionalAction}, "flag": {"action": "store_true"},
          "value": {}}


def parser(prog: str) -> argparse.ArgumentParser:
    p = EngineParser(prog=prog, add_help=False, allow_abbrev=True)
    for flag, entry in flag_table().items():
        kind = dict(_KINDS[entry["kind"]])
        for key in ("nargs", "choices"):
            if entry[key] is not None:
                kind[key] = entry[key]
        if (MODELLED | SPECULATIVE_TYPES).get(flag) is not None:
            kind["type"] = (MODELLED | SPECULATIVE_TYPES)[flag]
        dest = flag.lstrip("-").replace("-", "_")
        p.add_argument(flag, *entry["aliases"], dest=dest, default=argparse.SUPPRESS, **kind)
    for flag, entry in older_flag_table().items():
        p.add_argument(flag, *entry["aliases"], dest=flag.lstrip("-").replace("-", "_"),
                       default=argparse.SUPPRESS, **_OLDER_KINDS[entry["kind"]])
    return p


def _cli_words(words: list[str]) -> list[str]:
    """`sglang serve`'s rewrite: a first word that is no flag is --model-path; --model-type
    (its backend selector) is dropped, and kept as `--model-type` for the notes."""
    if words and not words[0].startswith("-"):
        words = ["--model-path", *words]
    kept, skip = [], False
    for index, word in enumerate(words):
        if skip:
            skip = False
        elif word == "--model-type":
            skip, kept = index + 1 < len(words), [*kept, "--model-type=given"]
        elif word.startswith("--model-type="):
            kept.append("--model-type=given")
        else:
            kept.append(word)
    return kept


# the flags SGLang 0.5.23's ConfigArgumentMerger refuses in a config file (neither store_true nor
# one value): the DeprecatedStoreTrueAction pair (srt/server_args.py ServerArgs.add_cli_args) and
# LoRAPathAction (nargs "*", srt/arg_groups/fields/lora.py); every BooleanOptionalAction flag
# (kind "bool" in the table), its --no- form too, joins them in _config_keys
_CONFIG_REFUSED_ACTIONS = {"--disable-cuda-graph": "DeprecatedStoreTrueAction",
                           "--enable-dp-attention": "DeprecatedStoreTrueAction",
                           "--lora-paths": "LoRAPathAction"}
_CONFIG_FIX = {"--enable-dp-attention": "give --attn-dp-size N in the file (or put the flag on "
                                        "the command)",
               "--disable-cuda-graph": "give cuda-graph-backend-decode: disabled and "
                                       "cuda-graph-backend-prefill: disabled in the file (or put "
                                       "the flag on the command)"}


def _config_key(option: str) -> str:
    """A long option as ConfigArgumentMerger's _config_keys names it: no dashes in front, '_'
    for '-'."""
    return option[2:].replace("-", "_")


def _config_tables() -> tuple[dict[str, tuple[str, str]], set[str]]:
    """(the keys a config file may not hold -> (their flag, its action), the store_true keys)."""
    refused, store_true = {}, set()
    for flag, entry in flag_table().items():
        names = [flag, *entry["aliases"]]
        if entry["kind"] == "bool":
            names += [f"--no-{name[2:]}" for name in names]
            refused |= {_config_key(n): (flag, "BooleanOptionalAction") for n in names}
        elif flag in _CONFIG_REFUSED_ACTIONS:
            refused |= {_config_key(n): (flag, _CONFIG_REFUSED_ACTIONS[flag]) for n in names}
        elif entry["kind"] == "flag":
            store_true |= {_config_key(n) for n in names}
    return refused, store_true


CONFIG_REFUSED, CONFIG_STORE_TRUE = _config_tables()


def _abbreviates_config(word: str) -> bool:
    """Whether `word` sets --config other than as the separate word `--config`: `--config=FILE`
    or an abbreviation argparse resolves to it (`--conf FILE`)."""
    option = word.partition("=")[0]
    if word == "--config" or len(option) < 3 or not "--config".startswith(option):
        return False
    names = [n for flag, e in flag_table().items() for n in (flag, *e["aliases"])]
    return option == "--config" or [n for n in names if n.startswith(option)] == ["--config"]


def with_config_file(words: list[str], prog: str) -> list[str]:
    """`words` with a `--config FILE`'s flags pulled in, as SGLang 0.5.23 does
    (srt/server_args.py prepare_server_args, srt/utils/server_args_config_parser.py
    ConfigArgumentMerger.merge_config_with_args): only the word `--config` followed by a .yaml or
    .yml file (the suffix in any case) is merged; the file's flags go before all of the command's
    words, so the command's own flags win. A key becomes `--KEY` as written (tp-size; tp_size is
    no flag there); true is the bare flag of a store_true flag and nothing where false, `--KEY
    true|false` for any other; a list its items (none where empty), a table its JSON, anything
    else its text; an empty file is no flags. The flags it takes no value for in a file
    (BooleanOptionalAction, --enable-dp-attention, --disable-cuda-graph, --lora-paths) are
    refused, as SGLang refuses them. With `--config=FILE` SGLang reads no file: refused here."""
    for word in words:
        if _abbreviates_config(word):
            raise UserError(f"{prog} {word}: SGLang 0.5.23 merges a config file only from the "
                            "separate words `--config FILE` and ignores this one: write "
                            "`--config FILE`", field="serve")
    if words.count("--config") > 1:
        raise UserError(f"{prog} --config: more than one config file", field="serve")
    if "--config" not in words:
        return words
    index = words.index("--config")
    if index == len(words) - 1:
        raise UserError(f"{prog} --config: no file follows it", field="serve")
    path = Path(words[index + 1])
    if path.suffix.lower() not in (".yaml", ".yml"):
        raise UserError(f"{prog} --config {path}: SGLang reads a .yaml or .yml file",
                        field="serve")
    config = config_file.load(path)
    if config is None:
        config = {}
    if not isinstance(config, dict):
        raise UserError(f"{path}: an SGLang config file is a table of flags", field="serve")
    pulled = []
    for key, value in config.items():
        if not isinstance(key, str):
            raise config_file.key_error(path, key, "SGLang")
        if key.replace("-", "_") in CONFIG_REFUSED:
            flag, action = CONFIG_REFUSED[key.replace("-", "_")]
            fix = _CONFIG_FIX.get(flag, f"put {flag} on the command")
            raise UserError(f"{path}: {key}: SGLang 0.5.23 refuses {flag} ({action}) in a config "
                            f"file: {fix}", field="serve")
        if isinstance(value, bool):
            if key.replace("-", "_") in CONFIG_STORE_TRUE:
                flags = [f"--{key}"] if value else []
            else:
                flags = [f"--{key}", str(value).lower()]
        elif isinstance(value, list):
            flags = [f"--{key}", *map(str, value)] if value else []
        elif isinstance(value, dict):
            flags = [f"--{key}", config_file.as_json(path, key, value)]
        else:
            flags = [f"--{key}", str(value)]
        dashed = f"--{key.replace('_', '-')}"
        if flags and "_" in key and (dashed in flag_table() or any(dashed in e["aliases"]
                                                            for e in flag_table().values())):
            raise UserError(f"{path}: {key}: SGLang 0.5.23 passes it as --{key}, which its parser "
                            f"does not know: write {key.replace('_', '-')}", field="serve")
        pulled += flags
    return pulled + words[:index] + words[index + 2:]


def _names_model(words: list[str]) -> bool:
    """Whether `sglang serve` finds the model among the command's words before the config file
    is read (cli/utils.py try_get_model_path)."""
    return any((w in ("--model-path", "--model") and i + 1 < len(words))
               or w.startswith(("--model-path=", "--model=")) for i, w in enumerate(words))


def _check_memory_flags(given: dict, prog: str) -> None:
    """Refuse chunked prefill off, a count below 1 and a fraction outside (0, 1)."""
    chunk = given.get("chunked_prefill_size")
    if chunk is not None and chunk < 0:
        raise UserError(f"{prog} --chunked-prefill-size {chunk}: chunked prefill off is not "
                        "modelled (mlamem's step is one chunk); give a chunk size", field="serve")
    for flag, key in (("--chunked-prefill-size", "chunked_prefill_size"),
                      ("--max-running-requests", "max_running_requests")):
        if given.get(key, 1) < 1:
            raise UserError(f"{prog} {flag} {given[key]}: must be at least 1", field="serve")
    fraction = given.get("mem_fraction_static")
    if fraction is not None and not 0 < fraction < 1:
        raise UserError(f"{prog} --mem-fraction-static {fraction}: must be in (0, 1)",
                        field="serve")


def _notes(given: dict, unmodelled: list[str], tp: int, replicas: int) -> list[str]:
    """The command's notes: the flags not modelled, DP replicas, the page, other backends."""
    notes = []
    if replicas > 1:
        notes.append(f"--dp-size {replicas}: {replicas} replicas of the model, each on {tp} ranks; "
                     "one rank is the same in each")
    page = given.get("page_size", PAGE_SIZE)
    notes.append(f"block_size {PAGE_SIZE}: the page SGLang sets for a DSA model"
                 + (f" (it overrides --page-size {page})" if page != PAGE_SIZE else ""))
    for flag, key in (("--dsa-decode-backend", "dsa_decode_backend"),
                      ("--dsa-prefill-backend", "dsa_prefill_backend")):
        if given.get(key, DSA_BACKEND) != DSA_BACKEND:
            notes.append(f"{flag} {given[key]}: mlamem runs {DSA_BACKEND}'s FlashMLA sparse "
                         "decode, SGLang's for a DSA model's fp8 cache on Hopper")
    if unmodelled:
        notes.insert(0, "not modelled: " + ", ".join(unmodelled))
    return notes


def parse(words: list[str], prog: str, version: str | None = None) -> Parsed:
    model_type = False
    if prog == "sglang serve":
        words = _cli_words(words)
        model_type = "--model-type=given" in words
        words = [w for w in words if w != "--model-type=given"]
        if "--config" in words and not _names_model(words):
            raise UserError(f"{prog} --config: the model must be on the command: SGLang's serve "
                            "looks for --model-path before it reads the config file "
                            "(cli/serve.py); put the model on the command", field="serve")
    words = with_config_file(words, prog)
    given = vars(parser(prog).parse_args(words))
    model = given.pop("model_path", None)
    if model is None:
        raise UserError(f"{prog}: the command names no model (--model-path)", field="serve")
    unmodelled = sorted({f"--{d.replace('_', '-')}" for d in given
                         if f"--{d.replace('_', '-')}" not in MODELLED}
                        | ({"--model-type"} if model_type else set()))
    older = [flag for flag in unmodelled if flag in older_flag_table()]
    unmodelled = [flag for flag in unmodelled if flag not in older]
    inferred = pinned_version(older) if version is None else None
    rules = sglang_rules(inferred if version is None else version)
    tp, attention_dp, replicas = _layout(given, prog)
    _check_memory_flags(given, prog)
    drafting, draft_note = speculative(given, model, rules, prog)
    if drafting is not None:
        unmodelled = [flag for flag in unmodelled if flag not in SPECULATIVE_FLAGS]
    chunk = given.get("chunked_prefill_size")
    table = {key: given[key] for key in ("mem_fraction_static", "chunked_prefill_size",
                                         "max_running_requests") if key in given}
    notes = _notes(given, unmodelled, tp, replicas) + ([draft_note] if draft_note else [])
    if older:
        notes.insert(0, older_flags_note(older))
    if version is not None or inferred is not None:
        table["engine_version"] = rules.version
        how = ("--engine-version" if inferred is None else
               f"or older, the newest version read whose parser takes {', '.join(older)}; "
               "--engine-version sets it")
        notes.append(f"engine version: SGLang {rules.version} ({how}; mlamem's default is "
                     f"{VERSION})")
    serving = {"max_num_batched_tokens": chunk, "max_model_len": given.get("context_length"),
               "kv_cache_dtype": _kv_dtype(given.get("kv_cache_dtype"), prog),
               "block_size": PAGE_SIZE}
    graphs = _graphs(given)
    if "cuda_graph_bs_decode" in given:
        table["cuda_graph_bs"] = given["cuda_graph_bs_decode"]
    elif graphs["max_bs"] is not None:
        table["cuda_graph_max_bs"] = graphs["max_bs"]
    sections = {"sglang": table} if table else {}
    return Parsed(model=model, tensor_parallel=tp, attention_data_parallel=attention_dp, tp=tp,
                  serving=serving, memory_fraction=given.get("mem_fraction_static", 0.0),
                  engines=["sglang"], operations=["sparse-decode"], sections=sections,
                  notes=notes, cuda_graphs=graphs["decode"], prog=prog, flags=FIELD_FLAGS,
                  expert_parallel=given.get("ep_size", 1) > 1,
                  engine_settings={"graphs": graphs, "rules": rules, "speculative": drafting,
                                   "loads_mtp": drafting is not None,
                                   "mtp_shared_head": drafting is not None})


# utils/hf_transformers/common.py CONTEXT_LENGTH_KEYS: the first the config sets wins
_SGLANG_LENGTH_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length",
                       "max_position_embeddings")


def default_context_length(config: hf_config.ModelConfig) -> tuple[int, str] | None:
    """SGLang 0.5.23's context length without --context-length, and the key it comes from
    (utils/hf_transformers/common.py get_context_length, as configs/model_config.py
    _derive_context_length takes it): the first key set, times rope_scaling's factor unless
    the scaling names its original length or is llama3; None where no key is set (SGLang then
    takes 2048)."""
    key = next((k for k in _SGLANG_LENGTH_KEYS if config.length_field(k) is not None), None)
    if key is None:
        return None
    factor = config.rope_factor or 1
    if config.rope_original_length is not None or config.rope_type == "llama3":
        factor = 1
    length = int(factor * config.length_field(key))
    return length, key if factor == 1 else f"{key} x rope factor {factor:g}"


def fill_max_model_len(parsed: Parsed, config: hf_config.ModelConfig) -> None:
    """--context-length, or SGLang's default from the model's config
    (`Parsed.fill_max_model_len`)."""
    parsed.fill_max_model_len(default_context_length(config), flag="--context-length",
                              engine="SGLang", release="SGLang 0.5.23", default="context length",
                              allow_env="SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN")


def _layout(given: dict, prog: str) -> tuple[int, int, int]:
    """(tp_size, attention-DP groups, replicas) after handle_deprecated_dp_attention."""
    tp, dp, attention_dp = (given.get(key, 1) for key in ("tp_size", "dp_size", "attn_dp_size"))
    for flag, value in (("--tp-size", tp), ("--dp-size", dp), ("--attn-dp-size", attention_dp),
                        ("--ep-size", given.get("ep_size", 1))):
        if value < 1:
            raise UserError(f"{prog} {flag} {value}: must be at least 1", field="serve")
    flag = "--attn-dp-size"
    if given.get("enable_dp_attention") and attention_dp == 1:
        attention_dp, dp, flag = dp, 1, "--dp-size"
    if tp % attention_dp:  # arg_groups/parallel_hook.py _handle_data_parallelism asserts it
        raise UserError(f"{prog} {flag} {attention_dp}: SGLang 0.5.23 splits --tp-size {tp} "
                        "into attention-DP groups, so it must divide it", field="serve")
    return tp, attention_dp, dp


def _kv_dtype(value: str | None, prog: str) -> str:
    if value == "fp8_e4m3":
        return "fp8_ds_mla"  # SGLang's fp8 DSA cache: the fp8_ds_mla token layout
    why = ("SGLang's 'auto' keeps a bf16 cache for a DSA model on Hopper" if value in (None, "auto")
           else f"a {value} cache")
    given = "sets no --kv-cache-dtype" if value is None else f"--kv-cache-dtype {value}"
    raise UserError(f"{prog} {given}: {why}, which SGLang decodes with FA3 (or "
                    "another backend than flashmla_kv), and mlamem has no adapter for it; "
                    "mlamem models SGLang's fp8 DSA cache: use --kv-cache-dtype fp8_e4m3",
                    field="serve")


def _graphs(given: dict) -> dict:
    """The CUDA-graph settings that size SGLang's reserve, as cuda_graph_hook folds them."""
    decode = prefill = not given.get("disable_cuda_graph", False)
    decode = decode and not given.get("disable_decode_cuda_graph", False)
    prefill = prefill and not given.get("disable_prefill_cuda_graph", False)
    if "cuda_graph_backend_decode" in given:
        decode = given["cuda_graph_backend_decode"] != "disabled"
    if "cuda_graph_backend_prefill" in given:
        prefill = given["cuda_graph_backend_prefill"] != "disabled"
    sizes = given.get("cuda_graph_bs_decode")
    if sizes is not None and min(sizes) < 1:
        raise UserError(f"--cuda-graph-bs-decode: expected positive batch sizes, got {sizes}",
                        field="serve")
    if sizes is not None and max(sizes) > MAX_INT:
        raise UserError(f"--cuda-graph-bs-decode: expected batch sizes at most {MAX_INT}, got "
                        f"{max(sizes)}", field="serve")
    max_bs = max(sizes) if sizes else given.get("cuda_graph_max_bs_decode")
    if max_bs is not None and max_bs < 1:
        raise UserError(f"--cuda-graph-max-bs-decode {max_bs}: must be at least 1", field="serve")
    if max_bs is not None and max_bs > MAX_INT:  # the scenario's bound, before the rules' lists
        raise UserError(f"--cuda-graph-max-bs-decode {max_bs}: must be at most {MAX_INT}",
                        field="serve")
    return {"decode": decode, "prefill": prefill, "max_bs": max_bs}


def fill_defaults(parsed: Parsed, config: hf_config.ModelConfig, gpu_name: str, smi_mib: float) -> None:
    """What SGLang decides by the model and the GPU (`gpu_name`, with nvidia-smi's total in MiB):
    the indexer's key width, the chunked prefill size and, without --mem-fraction-static, the
    fraction its reserve rule gives (with the command's CUDA graphs), by the rules of the
    command's version (`SGLangRules`; 0.5.23's unless --engine-version or an older flag says)."""
    graphs, rules = parsed.engine_settings["graphs"], parsed.engine_settings["rules"]
    parsed.sections.setdefault("sglang", {})["index_head_dim"] = config.index_head_dim
    _speculative_defaults(parsed, config)
    if config.architecture == "GlmMoeDsaForCausalLM" and rules.series < GLM_DSA_FROM:
        parsed.notes.append(f"SGLang {rules.version} has no GlmMoeDsaForCausalLM (GLM-5's, from "
                            "0.5.9): the rank follows its rules as it would a DeepSeek-V3.2")
    if gpu_name.startswith(("B", "GB")):  # overrides.py _dsa_split_backend_resolution
        parsed.notes.append(f"{gpu_name}: SGLang decodes a DSA model's fp8 cache with trtllm "
                            f"on Blackwell; mlamem runs {DSA_BACKEND}'s, as on Hopper")
    if rules.fraction_rule != "reserve":
        _older_defaults(parsed, rules, gpu_name, smi_mib)
        return
    table = parsed.sections["sglang"]
    resolved = resolve(  # nvidia-smi's total, as SGLang reads it
        smi_mib, tp_size=parsed.tensor_parallel,
        attn_dp_size=parsed.attention_data_parallel,
        chunked_prefill_size=table.get("chunked_prefill_size"),
        cuda_graph_max_bs=graphs["max_bs"],
        max_running_requests=table.get("max_running_requests"),
        mem_fraction_static=table.get("mem_fraction_static"),
        decode_graphs=graphs["decode"],
        prefill_graphs=graphs["prefill"] and rules.dsa_prefill_graphs,
        speculative="speculative_num_draft_tokens" in table)
    if parsed.serving["max_num_batched_tokens"] is None:
        parsed.serving["max_num_batched_tokens"] = resolved.chunked_prefill_size
        parsed.notes.append(f"max_num_batched_tokens {resolved.chunked_prefill_size}: SGLang "
                            f"{rules.version}'s chunked_prefill_size on the {gpu_name}")
    default_graphs = (graphs == {"decode": True, "prefill": True, "max_bs": None}
                      and rules.dsa_prefill_graphs)
    if not resolved.fraction_given and not default_graphs:
        # the rank derives the fraction with 0.5.23's default graphs: keep this one
        table["mem_fraction_static"] = resolved.mem_fraction_static
        parsed.notes.append(f"mem_fraction_static {resolved.mem_fraction_static}: SGLang "
                            f"{rules.version}'s reserve rule ({resolved.reserved_mib:g} MiB) on "
                            f"the {gpu_name} with the command's CUDA graphs"
                            + ("" if rules.dsa_prefill_graphs else " (a DSA model's prefill "
                               "graphs off, as before 0.5.15)"))
    if resolved.mem_fraction_static <= 0:
        raise UserError(f"{parsed.prog}: SGLang {rules.version}'s reserve rule sets aside "
                        f"{resolved.reserved_mib:g} MiB of the {gpu_name}'s {smi_mib:g} MiB for "
                        "the command's chunked prefill and CUDA graphs (handle_gpu_memory_"
                        "settings), leaving no mem_fraction_static for the pool: lower "
                        "--cuda-graph-max-bs-decode or --chunked-prefill-size, or give "
                        "--mem-fraction-static", field="serve")
    parsed.memory_fraction = resolved.mem_fraction_static
    parsed.notes.append(f"gpu_memory_utilization {resolved.mem_fraction_static}: SGLang's "
                        "mem_fraction_static (" + ("given" if resolved.fraction_given else
                                                   f"its reserve rule, {resolved.reserved_mib:g} "
                                                   f"MiB, on the {gpu_name}")
                        + "); SGLang's rank reads [sglang]")
    parsed.notes.append(_graphs_note(graphs))


def _graphs_note(graphs: dict) -> str:
    state = ", ".join(f"{phase} {'on' if graphs[phase] else 'off'}" for phase in
                      ("decode", "prefill"))
    return (f"CUDA graphs ({state}): " + (
        "the decode graphs are captured after the pool: run repro-oom with --cuda-graphs on"
        if graphs["decode"] else "no decode graphs: repro-oom runs without --cuda-graphs")
        + "; the prefill graphs size the reserve only")


def _older_defaults(parsed: Parsed, rules: SGLangRules, gpu_name: str, smi_mib: float) -> None:
    """fill_defaults for a version before the reserve rule (0.4.6-0.5.2, `version_defaults`):
    the chunk, the runner's decode list and the fraction go to the scenario."""
    graphs, table = parsed.engine_settings["graphs"], parsed.sections["sglang"]
    if rules.series < DSA_MODELS_FROM:
        parsed.notes.append(f"SGLang {rules.version} has no DSA model (DeepseekV32ForCausalLM "
                            "arrives in 0.5.3): its defaults are shown as it derives them")
    found = version_defaults(rules, smi_mib, tp_size=parsed.tensor_parallel,
                             attn_dp_size=parsed.attention_data_parallel,
                             dp_attention=parsed.attention_data_parallel > 1,
                             decode_graphs=graphs["decode"])
    if parsed.serving["max_num_batched_tokens"] is None:
        parsed.serving["max_num_batched_tokens"] = found.chunked_prefill_size
        parsed.notes.append(f"max_num_batched_tokens {found.chunked_prefill_size}: SGLang "
                            f"{rules.version}'s chunked_prefill_size on the {gpu_name}")
    if graphs["decode"] and graphs["max_bs"] is None:
        table["cuda_graph_bs"] = list(found.cuda_graph_bs)
        parsed.notes.append(f"cuda_graph_bs up to {found.cuda_graph_bs[-1]}: SGLang "
                            f"{rules.version}'s decode graphs on the {gpu_name} (model_executor/"
                            "cuda_graph_runner.py get_batch_sizes_to_capture)")
    if table.get("mem_fraction_static") is None:
        table["mem_fraction_static"] = found.mem_fraction_static
        how = (f"reserved_mem {found.reserved_mib:g} MiB by the GPU's row" if found.reserved_mib
               else f"by TP x PP {parsed.tensor_parallel}")
        parsed.notes.append(f"mem_fraction_static {found.mem_fraction_static:.4g}: SGLang "
                            f"{rules.version}'s default ({how}, server_args.py ServerArgs."
                            f"__post_init__) on the {gpu_name}")
    parsed.memory_fraction = table["mem_fraction_static"]
    parsed.notes.append(f"gpu_memory_utilization {parsed.memory_fraction:.4g}: SGLang's "
                        "mem_fraction_static; SGLang's rank reads [sglang]")
    parsed.notes.append(_graphs_note(graphs))


# -- how its saved results read --

def fraction_cell(case: dict) -> str:
    fraction = case.get("max_safe_mem_fraction_static")
    return "n/a" if fraction is None else ("none" if fraction == 0 else f"{fraction:.3f}")


def _budget_rule(budget: dict, cases: list[dict]) -> str:
    fractions = sorted({f"{c['mem_fraction_static']} ({c['fraction_source']})" for c in cases
                        if c.get("mem_fraction_static") is not None})
    graphs = "; then the decode CUDA graphs, out of what is left" if budget.get("cuda_graphs") else ""
    return ("KV pool rule (SGLang's): free after init - free before the model x (1 - "
            f"mem_fraction_static {', '.join(fractions) or 'n/a'}), in whole pages of the DSA "
            f"fp8 cell; no profile pass{graphs}; chunked_prefill_size "
            f"{budget['max_num_batched_tokens']}")


VIEW = View(
    heading="Runtime OOM reproduction (SGLang)",
    cases_named="--paths",
    table_title="{scenario}, SGLang{predicted}; GiB",
    table_columns=(
        Column("failed\nalloc", failed_alloc_cell, name=True),
        Column("free at\nOOM", lambda c: gib_cell(c.get("free_bytes_at_oom"))
               if c["verdict"] == Verdict.OOM else ""),
        Column("KV\npool", lambda c: gib_cell(c.get("kv_cache_bytes"))),
        Column("head-\nroom", lambda c: gib_cell(c.get("headroom_bytes"))
               if c["verdict"] == Verdict.FITS else ""),
        Column("+if out\nstaged", gain_cell),
        Column("max safe\nchunk", safe_cell),
        Column("max safe\nfraction", fraction_cell)),
    markdown_columns=(
        Column("backend", lambda c: c.get("backend") or "n/a"),
        Column("KV pool", kv_cell),
        Column("mem_fraction_static", lambda c: f"{c.get('mem_fraction_static')} "
                                                f"({c.get('fraction_source')})"),
        Column("headroom", lambda c: f"{gib_cell(c.get('headroom_bytes'))} GiB"
               if c["verdict"] == Verdict.FITS else "-"),
        Column("+ if out staged", lambda c: gain_cell(c) + (
            " GiB" if c.get("out_staging_gain_bytes") is not None else "")),
        Column("largest safe chunked_prefill_size (fraction pinned)", safe_cell),
        Column("largest safe chunked_prefill_size alone (fraction re-derived)",
               lambda c: safe_cell({"max_safe_tokens": c.get("max_safe_tokens_rederived")})),
        Column("largest safe mem_fraction_static at the chunk (model)", fraction_cell)),
    row_name=lambda c: c["path"],
    case_label=lambda c: f"{c['path']} path",
    verdict_in_notes=lambda c: (c["verdict"] not in (Verdict.FITS, Verdict.OOM)
                                or c["verdict"] == Verdict.OOM
                                and (c.get("oom_requested_bytes") is None
                                     or c["phase"] == "capture")),
    budget_rule=_budget_rule,
    budget_segments=budget_segments,
    step_need=step_need_bytes,
    step_tokens="chunked_prefill_size")


SPEC = EngineSpec(name="sglang", rank="mlamem.engines.sglang:SGLang", view=VIEW, key_field="path",
                  section=SGLangSection, reads_utilization=False,
                  searched_fraction="mem_fraction_static", step_knob_name="chunked_prefill_size")
