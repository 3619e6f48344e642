"""vLLM, as the spec layer knows it (no torch): its scenario table `[vllm]` (`VLLMSection`), its
rules at vLLM 0.33.0, its `vllm serve` parser and how its saved results read (`SPEC`); its rank
is `mlamem.engines.vllm`.

vLLM's own rules, without torch: its scenario table `[vllm]` (`VLLMSection`), which decode
sizes vLLM 0.33.0 captures as FULL graphs, and its estimate of the pool they take
(v1/worker/gpu/cudagraph_utils.py, profile_cudagraph_memory and _extrapolate_full_graph_memory):
first FULL capture + max(second, 1 MiB) x (N - 1).

The vLLM rank (engines/vllm.py) and `mlamem graphs` read the rules; the scenario loader reads
`VLLMSection` through the engine registry.

The serve command: `vllm serve MODEL ...` as vLLM 0.33.0's parser reads it.

Every flag of vLLM 0.33.0's `vllm serve` is in vllm-0.33.0-flags.json (written from the wheel by
scripts/vllm_serve_flags.py), so argparse takes `--x=y` and the abbreviations vLLM's parser takes;
`flexible` first rewrites the words as FlexibleArgumentParser.parse_args does
(vllm/utils/argparse_utils.py): `--x_y` for `--x-y`, -O3, dotted keys of the JSON configs.
The flags mlamem models have their types here; any other that the command sets is named in the notes.
Defaults follow vLLM 0.33.0: engine/arg_utils.py EngineArgs.get_batch_defaults (max_num_seqs and
max_num_batched_tokens by the GPU's memory), config/vllm.py VllmConfig.__post_init__
(--enforce-eager sets cudagraph_mode NONE).
A DSA model's scenario drives vLLM's sparse MLA (FLASHMLA_SPARSE, the fp8_ds_mla cache); a dense-MLA
model's (Kimi-K2) drives FlashMLA's dense decode (FLASHMLA, a bf16 or fp8 cache): `for_model`.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

from mlamem.spec.engines import AnyScenario as Scenario
from mlamem.spec.engines import Column, EngineSpec, Verdict, View
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
from mlamem.spec.sections import FieldError, check_positive, section_model
from mlamem.spec.serve_command import config_file
from mlamem.spec.serve_command.parsed import EngineParser, Parsed

MIN_PER_GRAPH_BYTES = 1 << 20  # vLLM's _MIN_PER_GRAPH_BYTES: "driver overhead" per graph

# vLLM 0.33.0's capture sizes (config/vllm.py, VllmConfig._set_cudagraph_sizes)
DEFAULT_MAX_GRAPH_SIZE = 512  # caps the default largest size; 1024 on data-center Blackwell
FULL_MODES = ("FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")  # decode graphs hold attention
# vLLM's CUDAGraphMode names (config/compilation.py)
CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")


@section_model
class VLLMSection:
    """The scenario's `[vllm]` table: vLLM's CUDA-graph settings, at vLLM 0.33.0's defaults."""

    max_num_seqs: int = 1024  # --max-num-seqs: `vllm serve` on a >= 70 GiB GPU other than A100
    max_cudagraph_capture_size: int | None = None  # None: vLLM's rule from max_num_seqs
    cudagraph_mode: str = "FULL_AND_PIECEWISE"  # -O2's mode; one of CUDAGRAPH_MODES
    num_speculative_tokens: int = 0  # MTP / speculative tokens per decode step (k)
    # a DSA model's indexer key width (config.json index_head_dim); None: 128, GLM-5's and
    # DeepSeek-V3.2's
    index_head_dim: int | None = None
    # the serve command captures CUDA graphs (no --enforce-eager): repro-oom's --cuda-graphs
    # default; None (a scenario written by hand) leaves it off
    cuda_graphs: bool | None = None
    # the vLLM version whose rules the rank and the capture sizes follow (VersionRules: the
    # graph estimate, the capture list); None: DEFAULT_VERSION (--engine-version sets it)
    engine_version: str | None = None

    def __post_init__(self) -> None:
        check_positive(self, "vllm", "max_num_seqs")
        if self.index_head_dim is not None:
            check_positive(self, "vllm", "index_head_dim")
        if self.max_cudagraph_capture_size is not None:
            check_positive(self, "vllm", "max_cudagraph_capture_size")
        if not 0 <= self.num_speculative_tokens <= 64:
            raise FieldError("vllm", "num_speculative_tokens",
                             f"{self.num_speculative_tokens} is outside 0..64")
        if self.engine_version is not None:
            try:
                version_rules(self.engine_version)
            except UserError as error:
                raise FieldError("vllm", "engine_version", error.message) from None
        if self.cudagraph_mode not in CUDAGRAPH_MODES:
            raise FieldError("vllm", "cudagraph_mode",
                             f"expected one of {', '.join(CUDAGRAPH_MODES)}, "
                             f"got {self.cudagraph_mode!r}")


def settings(scenario: Scenario) -> VLLMSection:
    """The scenario's `[vllm]` table, or its defaults."""
    return scenario.section("vllm")


def scenario_rules(scenario: Scenario) -> VersionRules:
    """The rules of the scenario's [vllm].engine_version (None: DEFAULT_VERSION)."""
    return version_rules(settings(scenario).engine_version)


def engine_series(scenario: Scenario) -> tuple[int, int]:
    """The (major, minor) of the scenario's vLLM version, the key of the per-version rules of
    the stages beyond attention (spec/engines/vllm_moe.py, vllm_pass.py)."""
    found = re.match(r"(\d+)\.(\d+)", scenario_rules(scenario).version)
    return int(found[1]), int(found[2])


def graph_estimate_rule(scenario: Scenario) -> str:
    """Whether the scenario's vLLM version sets its graph estimate aside before the KV cache
    (VersionRules.graph_estimate): "applied", "opt-in" or "none"."""
    return scenario_rules(scenario).graph_estimate


def blackwell(gpu_name: str) -> bool:
    """A data-center Blackwell board (SM100) by mlamem's GPU name: B200, GB200."""
    return gpu_name.startswith(("B", "GB"))


def request_counts(max_num_seqs: int, default_max: int = DEFAULT_MAX_GRAPH_SIZE) -> list[int]:
    """vLLM's request counts for uniform decode sizes under speculation (config/vllm.py)."""
    m = min(max_num_seqs, default_max)
    counts = [1, 2, 4] + list(range(8, min(m + 1, 256), 8)) + list(range(256, m + 1, 16))
    return sorted({c for c in counts if c <= m} | {m})


def capture_sizes(scenario: Scenario) -> list[int]:
    """vLLM's `cudagraph_capture_sizes` for this serving config, ascending, by the rules of the
    scenario's version (config/vllm.py VllmConfig._set_cudagraph_sizes; VersionRules).

    At 0.33.0: max = max_cudagraph_capture_size, or min(max_num_seqs x (1 + k) x 2, 512; 1024
    on data-center Blackwell) by default, capped at max_num_batched_tokens; sizes [1, 2, 4] +
    range(8, 256, 8) + range(256, max + 1, 16) up to max, plus max_num_batched_tokens when it
    is within max, plus the uniform decode sizes (by default only).
    """
    vllm, rules = settings(scenario), scenario_rules(scenario)
    query_len = 1 + vllm.num_speculative_tokens
    tokens = scenario.serving.max_num_batched_tokens
    largest = vllm.max_cudagraph_capture_size
    uniform: list[int] = []
    if largest is None:
        default_max = (1024 if rules.blackwell_graph_size_1024 and blackwell(scenario.gpu.name)
                       else DEFAULT_MAX_GRAPH_SIZE)
        scale = query_len if rules.capture_speculative_max else 1
        largest = min(vllm.max_num_seqs * scale * 2, default_max)
        uniform = _uniform_decode_sizes(rules, vllm, largest, default_max)
    largest = min(tokens, largest)
    sizes = [i for i in (1, 2, 4) if i <= largest]
    if largest >= 8:
        sizes += list(range(8, min(largest + 1, 256) if rules.capture_step_16 else largest + 1,
                            8))
    if largest >= 256 and rules.capture_step_16:
        sizes += list(range(256, largest + 1, 16))
    if tokens <= largest and rules.capture_adds_batched_tokens:
        sizes.append(tokens)
    sizes += [s for s in uniform if s <= tokens]
    return sorted(set(sizes))


def _uniform_decode_sizes(rules: VersionRules, vllm: VLLMSection, largest: int,
                          default_max: int) -> list[int]:
    """The default list's uniform decode sizes: n x (1 + k) for vLLM's request counts under
    speculation (from 0.29.0), max_num_seqs without it (from 0.31.0)."""
    query_len = 1 + vllm.num_speculative_tokens
    if query_len > 1 and rules.capture_uniform_decode != "none":
        return sorted({n * query_len for n in request_counts(vllm.max_num_seqs, default_max)
                       if n * query_len <= largest})
    if query_len == 1 and rules.capture_uniform_decode == "all" and vllm.max_num_seqs <= largest:
        return [vllm.max_num_seqs]
    return []


def full_decode_sizes(scenario: Scenario) -> list[int]:
    """The FULL uniform-decode graphs (attention inside), largest first: vLLM V2's
    CudaGraphManager._init_candidates rounds each capture size up to a multiple of 1 + k and
    keeps those within max_num_seqs x (1 + k) and the largest capture size. Empty when the mode
    puts attention in no graph (NONE, PIECEWISE). Older versions' V1 runner
    (v1/cudagraph_dispatcher.py initialize_cudagraph_keys) keeps the capture sizes from 1 + k
    to max_num_seqs x (1 + k) unrounded: the same graphs without speculation."""
    vllm = settings(scenario)
    if vllm.cudagraph_mode not in FULL_MODES:
        return []
    query_len = 1 + vllm.num_speculative_tokens
    sizes = capture_sizes(scenario)
    if not sizes:
        return []
    rounded = {-(-s // query_len) * query_len for s in sizes}
    return sorted((s for s in rounded if s <= vllm.max_num_seqs * query_len
                   and s <= sizes[-1]), reverse=True)


def capture_list_source(scenario: Scenario) -> str:
    """Where the default list comes from, in words."""
    vllm = settings(scenario)
    largest = ("max_cudagraph_capture_size " + str(vllm.max_cudagraph_capture_size)
               if vllm.max_cudagraph_capture_size is not None
               else "max_cudagraph_capture_size by vLLM's rule")
    return (f"vLLM {scenario_rules(scenario).version}'s FULL decode graphs for cudagraph_mode "
            f"{vllm.cudagraph_mode}, "
            f"max_num_seqs {vllm.max_num_seqs}, {largest}, "
            f"{vllm.num_speculative_tokens} speculative tokens, max_num_batched_tokens "
            f"{scenario.serving.max_num_batched_tokens}")


def check_capture_sizes(sizes: Sequence[int], max_tokens: int) -> list[int]:
    """The sizes, largest first, without repeats; UserError for one outside 1..max_tokens."""
    for size in sizes:
        if not 1 <= size <= max_tokens:
            raise UserError(f"size {size}: a capture must hold 1 to {max_tokens} tokens (the "
                            "scenario's max_num_batched_tokens sizes the workspace)",
                            field="capture_sizes")
    return sorted(set(sizes), reverse=True)


def sizes_to_capture(scenario: Scenario, sizes: Sequence[int] | None) -> list[int]:
    """`sizes` (capture_sizes), or the scenario's FULL decode graphs; largest first."""
    if sizes is None:
        sizes = full_decode_sizes(scenario)
        if not sizes:
            raise UserError(f"{scenario.name}: cudagraph_mode {settings(scenario).cudagraph_mode} "
                            "puts the attention call in no CUDA graph (vLLM runs it eagerly); set "
                            "[vllm].cudagraph_mode = \"FULL_AND_PIECEWISE\" or give the sizes",
                            field="capture_sizes")
    return check_capture_sizes(sizes, scenario.serving.max_num_batched_tokens)


@dataclass(frozen=True)
class Estimate:
    """vLLM's rule on two samples: first + max(second, 1 MiB) x (graphs - 1)."""

    source: str  # "device" (mem_get_info, as vLLM) or "allocator" (reserved growth)
    first_bytes: int
    second_bytes: int
    per_graph_bytes: int  # max(second, 1 MiB)
    graphs: int
    estimate_bytes: int
    actual_bytes: int  # what the whole list took, by the same measure
    error_bytes: int  # estimate - actual
    error_percent: float | None  # of actual


def vllm_estimate(source: str, samples: Sequence[int], actual: int, graphs: int) -> Estimate:
    """vLLM's extrapolation from the first two captures' growth `samples`."""
    first = samples[0] if samples else 0
    second = samples[1] if len(samples) > 1 else 0
    per_graph = max(second, MIN_PER_GRAPH_BYTES) if graphs > 1 else 0
    estimate = first + per_graph * (graphs - 1) if graphs else 0
    return Estimate(source, first, second, per_graph, graphs, estimate, actual,
                    estimate - actual, round(100 * (estimate - actual) / actual, 2)
                    if actual else None)


# -- the KV cache (v1/core/kv_cache_planning.py, v1/kv_cache_interface.py) --

DEFAULT_INDEX_HEAD_DIM = 128  # [vllm].index_head_dim unset: GLM-5's and DeepSeek-V3.2's

def kv_bytes_per_token_per_layer(scenario: Scenario) -> int:
    """vLLM 0.33.0's KV-cache bytes per token in one layer: the MLA cell (656 B for fp8_ds_mla)
    and, for a DSA model, the indexer's key cache (132 B at index_head_dim 128: dsa_cache).

    Both are MLAAttentionSpecs of one block size (model_executor/layers/attention/
    mla_attention.py get_kv_cache_spec; models/deepseek_v2.py DeepseekV32IndexerCache
    .get_kv_cache_spec), so get_kv_cache_groups puts every layer of both in one group, a
    UniformTypeKVCacheSpecs whose page is the sum of its layers' pages (kv_cache_interface.py
    UniformTypeKVCacheSpecs.page_size_bytes)."""
    cell = scenario.kv_cache_bytes_per_token_per_layer
    if scenario.model.index_topk is None:  # dense MLA: no indexer
        return cell
    return cell + indexer_key_bytes(settings(scenario).index_head_dim or DEFAULT_INDEX_HEAD_DIM)


INDEXER_ON_OWN_LAYERS_FROM = (0, 24)  # models/deepseek_v2.py: no indexer on an IndexCache skip layer
DEFAULT_SKIP_TOPK_OFFSET = 2  # getattr(config, "index_skip_topk_offset", 2), 0.23.0-0.33.0


def indexer_layer_count(scenario: Scenario) -> int:
    """The decoder layers that hold a DSA indexer and its key cache. With IndexCache (a config's
    index_topk_freq > 1, GLM-5.2's 4) layer i skips its own top-k where max(i - offset + 1, 0) %
    freq != 0, offset the config's index_skip_topk_offset or 2 (models/deepseek_v2.py,
    DeepseekV2MLAAttention.__init__, 0.23.0-0.33.0); from 0.24.0 a skip layer builds no
    indexer (`if self.is_v32 and (not _skip_topk or is_mtp_layer)`), before it every layer
    does (0.21.0-0.23.0 build it, then skip its top-k). GLM-5.2's freq 4 and offset 3 give the
    21 'full' layers of its indexer_types."""
    model = scenario.model
    if model.index_topk is None:
        return 0
    freq = model.index_topk_freq or 1
    if freq == 1 or engine_series(scenario) < INDEXER_ON_OWN_LAYERS_FROM:
        return model.num_layers
    offset = DEFAULT_SKIP_TOPK_OFFSET if model.index_skip_topk_offset is None \
        else model.index_skip_topk_offset
    return sum(max(i - offset + 1, 0) % freq == 0 for i in range(model.num_layers))


def kv_bytes_per_token(scenario: Scenario) -> int:
    """The rank's KV-cache bytes per token over its layers: every layer's MLA cell and the key
    caches of the layers with an indexer (indexer_layer_count), all pages of the one
    UniformTypeKVCacheSpecs group (kv_bytes_per_token_per_layer)."""
    layers = scenario.model.num_layers
    without = layers - indexer_layer_count(scenario) if scenario.model.index_topk else 0
    key = indexer_key_bytes(settings(scenario).index_head_dim or DEFAULT_INDEX_HEAD_DIM)
    return layers * kv_bytes_per_token_per_layer(scenario) - without * key


def kv_block_bytes(scenario: Scenario) -> int:
    """Bytes of one KV-cache block over the rank's layers: kv_cache_planning.py
    _get_kv_cache_bytes_per_block, the group's page; at block_size 64 the backends' stride
    alignments (MultipleOf(64): flashmla_sparse.py customize_spec, indexer.py's kernel block
    size 64) add nothing (kv_cache_interface.py KVCacheSpec.get_block_stride_alignment)."""
    return scenario.serving.block_size * kv_bytes_per_token(scenario)


def logged_kv_tokens(num_blocks: int, block_size: int, max_model_len: int) -> int:
    """The count vLLM logs as "GPU KV cache size: N tokens": the blocks over those one request of
    max_model_len takes, times max_model_len, truncated (v1/core/kv_cache_utils.py
    get_kv_cache_capacity and get_max_concurrency_for_kv_cache_config, with
    FullAttentionSpec.max_memory_usage_bytes's cdiv(max_model_len, block_size) pages)."""
    per_request = -(-max_model_len // block_size)
    return int(num_blocks / per_request * max_model_len)


# -- engine versions: the rules that differ among the vLLM versions users run --

DEFAULT_VERSION = "0.33.0"  # the version mlamem's rules follow unless --engine-version says
OLDEST_VERSION = (0, 10)  # the oldest series whose rules were read (0.10.2's wheel)
# Where each rule changed, read from the wheels of 0.10.2, 0.11.0, 0.12.0, 0.13.0, 0.16.0-0.22.0
# and 0.25.0-0.33.0 (`pip download --no-deps vllm==X`; 0.23.0 and 0.24.0 for the indexer's layers,
# INDEXER_ON_OWN_LAYERS_FROM); a series between two read keeps the older one's rules
FRACTION_092_FROM = (0, 20)  # config/cache.py: 0.9 in 0.10.2-0.19.0, 0.92 from 0.20.0
GRAPH_ESTIMATE_FROM = (0, 20)  # envs.py VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS: "1" from 0.20.0
GRAPH_ESTIMATE_OPT_IN_FROM = (0, 18)  # ... "0" (opt-in) in 0.18.0-0.19.0; none in 0.17.0
# VllmConfig.__post_init__ (0.10.2: config/__init__.py) sets PIECEWISE where the config sets no
# cudagraph_mode; FULL_AND_PIECEWISE from 0.11.0
FULL_AND_PIECEWISE_FROM = (0, 11)
# VllmConfig._set_cudagraph_sizes (config/__init__.py to 0.11.0, config/vllm.py from 0.12.0):
CAPTURE_STEP_16_FROM = (0, 12)  # range(256, max + 1, 16); [1, 2, 4] + range(8, max + 1, 8) before
CAPTURE_SPECULATIVE_MAX_FROM = (0, 13)  # max = min(max_num_seqs x (1 + k) x 2, 512); x 2 before
CAPTURE_BATCHED_TOKENS_FROM = (0, 21)  # + max_num_batched_tokens when within the max
BLACKWELL_GRAPH_SIZE_FROM = (0, 28)  # default_max_graph_size 1024 on data-center Blackwell
CAPTURE_UNIFORM_SPECULATIVE_FROM = (0, 29)  # + the uniform decode sizes n x (1 + k), k > 0
CAPTURE_UNIFORM_SEQS_FROM = (0, 31)  # + max_num_seqs, k = 0
# engine/arg_utils.py EngineArgs.get_batch_defaults: a >= 160 GiB GPU gets 16384 tokens
LARGE_GPU_BATCH_FROM = (0, 28)
# an MTP drafter frees its own embedding for the target's in every version read, and its
# shared_head.head from 0.18.0 (v1/spec_decode/eagle.py, llm_base_proposer.py from 0.22.0:
# _maybe_share_lm_head, "Shared target model lm_head with MTP shared_head.head"); before, the
# head stays and the count keeps both (its embedding, a TP share of the vocabulary, too)
MTP_SHARES_HEAD_FROM = (0, 18)


@dataclass(frozen=True)
class VersionRules:
    """What differs by vLLM version, each read from that version's wheel (the _FROM constants
    above name the file and the first version of each rule)."""

    version: str
    # CacheConfig.gpu_memory_utilization's default (config/cache.py)
    gpu_memory_utilization: float
    # whether CUDA-graph memory is estimated and set aside before the KV cache is sized
    # (v1/worker/gpu_worker.py determine_available_memory, profile_cudagraph_memory, under
    # VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS of envs.py): "applied", "opt-in" (measured, set
    # aside only with the env var, off by default) or "none" (not measured)
    graph_estimate: str
    default_cudagraph_mode: str = "FULL_AND_PIECEWISE"
    capture_step_16: bool = True  # multiples of 16 from 256, else of 8 to the max
    capture_speculative_max: bool = True  # the default max scales with 1 + k
    capture_adds_batched_tokens: bool = True  # max_num_batched_tokens joins the list
    capture_uniform_decode: str = "all"  # uniform decode sizes: "none", "speculative", "all"
    blackwell_graph_size_1024: bool = True
    large_gpu_batch_tier: bool = True  # get_batch_defaults' >= 160 GiB tier
    mtp_shares_head: bool = True  # an MTP drafter holds the target's embedding and head
    indexers_on_every_layer: bool = False  # an IndexCache shared layer builds an indexer too


def version_rules(version: str | None) -> VersionRules:
    """The rules of vLLM `version` (e.g. 0.19.1; None: DEFAULT_VERSION); UserError outside the
    versions read (0.10 to 0.33)."""
    version = DEFAULT_VERSION if version is None else version
    match = re.fullmatch(r"v?(\d+)\.(\d+)(?:\.(\d+))?([.+\-]?[0-9A-Za-z.+\-]*)", version.strip())
    series = (int(match[1]), int(match[2])) if match else None
    if series is None or not OLDEST_VERSION <= series <= (0, 33):
        shown = version if len(version) <= 40 else f"{version[:40]}…"
        raise UserError(f"{shown!r}: mlamem reads vLLM's rules of 0.10 to 0.33 "
                        f"(the default is {DEFAULT_VERSION}); give one such as 0.19.1",
                        field="engine_version")
    estimate = ("applied" if series >= GRAPH_ESTIMATE_FROM else
                "opt-in" if series >= GRAPH_ESTIMATE_OPT_IN_FROM else "none")
    uniform = ("all" if series >= CAPTURE_UNIFORM_SEQS_FROM else "speculative"
               if series >= CAPTURE_UNIFORM_SPECULATIVE_FROM else "none")
    return VersionRules(
        version.strip().lstrip("v"), 0.92 if series >= FRACTION_092_FROM else 0.9, estimate,
        default_cudagraph_mode=("FULL_AND_PIECEWISE" if series >= FULL_AND_PIECEWISE_FROM
                                else "PIECEWISE"),
        capture_step_16=series >= CAPTURE_STEP_16_FROM,
        capture_speculative_max=series >= CAPTURE_SPECULATIVE_MAX_FROM,
        capture_adds_batched_tokens=series >= CAPTURE_BATCHED_TOKENS_FROM,
        capture_uniform_decode=uniform,
        blackwell_graph_size_1024=series >= BLACKWELL_GRAPH_SIZE_FROM,
        large_gpu_batch_tier=series >= LARGE_GPU_BATCH_FROM,
        mtp_shares_head=series >= MTP_SHARES_HEAD_FROM,
        indexers_on_every_layer=series < INDEXER_ON_OWN_LAYERS_FROM)


def _series(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def pinned_version(flags: list[str]) -> str | None:
    """The newest version read whose parser takes every one of `flags` (flags of older versions
    only): a command with --swap-space ran vLLM 0.17.0 or older. None without such flags."""
    table = older_flag_table()
    newest = [max(table[flag]["versions"], key=_series) for flag in flags]
    return min(newest, key=_series) if newest else None


# What a rank with graphs on leaves out where vLLM sets its graph estimate aside (from 0.20.0,
# GRAPH_ESTIMATE_FROM): vLLM's estimate captures the whole model, mlamem's the attention call
WHOLE_MODEL_GRAPHS_NOTE = (
    "CUDA graphs: vLLM {version} sets aside its estimate of the whole model's graphs before "
    "sizing the KV cache (v1/worker/gpu_worker.py determine_available_memory, "
    "profile_cudagraph_memory); mlamem's estimate holds the attention call's alone, so its KV "
    "cache is larger than vLLM's by the rest (about 10 GiB for GLM-5 at TP8 on 8 x H200 by two "
    "public logs, reports/field) and the step's headroom smaller by what vLLM sets aside beyond "
    "the graphs it captures")


def version_notes(rules: VersionRules, graphs: bool, inferred_from: list[str] | None = None
                  ) -> list[str]:
    """The version taken, and where its rules differ from what mlamem's rank runs, in words."""
    how = ("--engine-version" if inferred_from is None else
           f"or older, the newest version read whose parser takes {', '.join(inferred_from)}; "
           "--engine-version sets it")
    notes = [f"engine version: vLLM {rules.version} ({how}; mlamem's default is "
             f"{DEFAULT_VERSION})"]
    if graphs and rules.graph_estimate != "applied":
        how = ("estimates CUDA-graph memory only with VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1"
               if rules.graph_estimate == "opt-in" else "does not estimate CUDA-graph memory")
        notes.append(f"vLLM {rules.version} {how} before sizing the KV cache "
                     f"(v1/worker/gpu_worker.py determine_available_memory): [vllm].graph_estimate"
                     f" = \"{rules.graph_estimate}\", so the rank sizes the cache as without "
                     "graphs and captures them out of what utilization x total leaves")
    return notes


# -- the serve command --

PROG = "vllm serve"


@cache
def flag_table() -> dict[str, dict]:
    """Every flag of the server's parser (`vllm-0.33.0-flags.json`): its kind, aliases, nargs and
    choices; read on first use, so loading a scenario does not parse the table."""
    return json.loads(resources.files("mlamem.spec.engines").joinpath("vllm-0.33.0-flags.json")
                      .read_text())["flags"]


GiB = 1024**3


def _json(flag: str):
    def read(text: str) -> dict:
        try:
            value = json.loads(text)
        except (json.JSONDecodeError, RecursionError):  # RecursionError: nested too deep
            raise argparse.ArgumentTypeError(f"{flag} takes JSON, got {text!r}") from None
        if not isinstance(value, dict):
            raise argparse.ArgumentTypeError(f"{flag} takes a JSON object, got {text!r}")
        return value
    return read


_SUFFIXES = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
             "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def human_int(text: str) -> int:
    """A count as vLLM writes it (utils/argparse_utils.py, human_readable_int): 25.6k is 25600,
    1K is 1024 (no decimals with the binary suffixes)."""
    text = text.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", text)
    try:
        if match is None:
            return int(text)
        number, suffix = match.groups()
        if suffix.islower():  # decimal
            return int(float(number) * _SUFFIXES[suffix])
        return int(number) * _SUFFIXES[suffix]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count such as 4096, 32k or 2K") from None


def optimization_level(text: str) -> int:
    """-O / --optimization-level: vLLM 0.33.0's OptimizationLevel, 0 to 3 (config/vllm.py)."""
    if text not in ("0", "1", "2", "3"):
        raise argparse.ArgumentTypeError(f"{text!r} is not an optimization level 0, 1, 2 or 3")
    return int(text)


# the flags mlamem models: their types; dest is the flag without dashes, with underscores
MODELLED = {"--tensor-parallel-size": int, "--data-parallel-size": int,
            "--enable-expert-parallel": None, "--max-num-batched-tokens": human_int,
            "--max-num-seqs": int, "--max-model-len": human_int, "--gpu-memory-utilization": float,
            "--kv-cache-dtype": str, "--block-size": int, "--cudagraph-capture-sizes": int,
            "--max-cudagraph-capture-size": int,
            "--compilation-config": _json("--compilation-config"), "--enforce-eager": None,
            "--speculative-config": _json("--speculative-config"), "--attention-backend": str,
            "--model": str, "--optimization-level": optimization_level,
            "--kv-cache-memory-bytes": human_int}  # refused unless 0: _check_kv_memory
# config/speculative.py MTPModelTypes: the methods that draft with the checkpoint's own MTP
# layers (each alias but "mtp" is renamed to it in SpeculativeConfig.__post_init__)
MTP_METHODS = frozenset((
    "deepseek_mtp", "dots3_note_mtp", "mimo_mtp", "mimo_v2_mtp", "glm4_moe_mtp",
    "glm4_moe_lite_mtp", "glm_ocr_mtp", "ernie_mtp", "nemotron_h_mtp", "exaone_moe_mtp",
    "exaone4_5_mtp", "qwen3_next_mtp", "qwen4_exp_mtp", "qwen3_5_mtp", "longcat_flash_mtp",
    "bailing_hybrid_v3_mtp", "minimax_m3_mtp", "bailing_hybrid_mtp", "mtp", "kimi_k3_mtp",
    "pangu_ultra_moe_mtp", "step3p5_mtp", "step5_mtp", "hy_v3_mtp", "hy_v4_mtp", "gemma4_mtp",
    "inkling_mtp", "glm5_next_mtp"))
# the scenario's fields as vLLM's flags set them
FIELD_FLAGS = {"tensor_parallel": "--tensor-parallel-size",
               "attention_data_parallel": "--data-parallel-size",
               "max_num_batched_tokens": "--max-num-batched-tokens",
               "max_model_len": "--max-model-len", "block_size": "--block-size",
               "gpu_memory_utilization": "--gpu-memory-utilization",
               "max_num_seqs": "--max-num-seqs", "max_batch_size": "--max-num-seqs",
               "decode_context_len": "--max-model-len",
               "max_cudagraph_capture_size": "--max-cudagraph-capture-size",
               "num_speculative_tokens": "--speculative-config",
               "cudagraph_mode": "--compilation-config"}
# vLLM's kv-cache dtypes that mlamem's sparse decode reads, as mlamem names the cache
KV_DTYPES = {"fp8_ds_mla": "fp8_ds_mla", "fp8": "fp8_ds_mla", "fp8_e4m3": "fp8_ds_mla"}
# ... and those its dense decode reads (a dense-MLA model): "auto" keeps the model's dtype
# (utils/torch_utils.py kv_cache_dtype_str_to_dtype), bf16 for these checkpoints; "fp8" is
# fp8_e4m3 (STR_DTYPE_TO_TORCH_DTYPE), 576 B per token per layer
DENSE_KV_DTYPES = {"auto": "bf16", "bfloat16": "bf16", "fp8": "fp8", "fp8_e4m3": "fp8"}
_KINDS = {"bool": {"action": argparse.BooleanOptionalAction}, "flag": {"action": "store_true"},
          "optional": {"nargs": "?"}, "list": {"nargs": "+"}, "value": {}}


@cache
def older_flag_table() -> dict[str, dict]:
    """The flags older versions' `vllm serve` takes and 0.33.0's lacks (vllm-older-flags.json,
    written from their wheels by scripts/vllm_older_flags.py): each with the versions that have
    it."""
    return json.loads(resources.files("mlamem.spec.engines").joinpath("vllm-older-flags.json")
                      .read_text())["flags"]


# an older version's flag takes a value or none, as its kind allows, so either form parses
_OLDER_KINDS = {"bool": _KINDS["bool"], "flag": {"nargs": "?"}, "optional": {"nargs": "?"},
                "list": {"nargs": "*"}, "value": {"nargs": "?"}}


def parser() -> argparse.ArgumentParser:
    p = EngineParser(prog=PROG, add_help=False, allow_abbrev=True)
    p.add_argument("model_tag", nargs="?")
    for flag, entry in flag_table().items():
        kind = dict(_KINDS[entry["kind"]])
        if flag in MODELLED and MODELLED[flag] is not None:
            kind["type"] = MODELLED[flag]
        dest = flag.lstrip("-").replace("-", "_")
        p.add_argument(flag, *entry["aliases"], dest=dest, default=argparse.SUPPRESS, **kind)
    for flag, entry in older_flag_table().items():
        p.add_argument(flag, *entry["aliases"], dest=flag.lstrip("-").replace("-", "_"),
                       default=argparse.SUPPRESS, **_OLDER_KINDS[entry["kind"]])
    return p


def older_flags_note(flags: list[str]) -> str:
    """One note naming the given flags that only older versions take, with those versions."""
    table = older_flag_table()
    named = [f"{flag} ({', '.join(table[flag]['versions'])})" for flag in flags]
    return ("flags of older vLLM versions, not modelled (vLLM 0.33.0 has none of them and "
            "refuses them): " + ", ".join(named))


_NAME = re.compile(r"(?<=--)[^.]*")  # between the leading -- and the first dot


def flexible(words: list[str]) -> list[str]:
    """`words` rewritten as vLLM 0.33.0's FlexibleArgumentParser.parse_args rewrites them
    (utils/argparse_utils.py) before argparse reads them: underscores in a flag's name (up to
    its first dot) become dashes; -O3, -O=3 and -O 3 become --optimization-level 3; a dotted
    flag (--speculative-config.method mtp, -cc.cudagraph_mode=FULL) sets one key of its JSON
    flag, a `+` suffix taking a comma list, the value read as JSON, else a count (25.6k), else
    text; the keys of one flag merge (lists add up) and go last, as one JSON value."""
    rewritten = []
    for i, word in enumerate(words):
        if word.startswith("--"):
            key, eq, value = word.partition("=")
            rewritten.append(_NAME.sub(lambda m: m[0].replace("_", "-"), key, count=1) + eq + value)
        elif word.startswith("-O") and word != "-O":
            rewritten += ["--optimization-level", word[3:] if word[2] == "=" else word[2:]]
        elif word == "-O" and words[i + 1:i + 2] and words[i + 1] in ("0", "1", "2", "3"):
            rewritten.append("--optimization-level")
        elif word == "-O":  # vLLM's parser then has no -O to give the next word to
            after = words[i + 1] if i + 1 < len(words) else None
            raise UserError(f"{PROG} -O {after!r}: vLLM 0.33.0 reads -O as --optimization-level "
                            "0 to 3 only; give the compilation config as -cc '{...}' or "
                            "--compilation-config.KEY VALUE", field="serve")
        else:
            rewritten.append(word)
    merged: dict[str, dict] = {}
    kept, skip = [], False
    for i, word in enumerate(rewritten):
        if skip:
            skip = False
            continue
        name, eq, text = word.partition("=")
        if not (word.startswith("-") and "." in name):
            kept.append(word)
            continue
        if not eq:
            if i + 1 == len(rewritten):
                raise UserError(f"{PROG} {word}: no value follows it", field="serve")
            text, skip = rewritten[i + 1], True
        if name.endswith("+"):
            name, text = name[:-1], json.dumps(text.split(","))
        flag, *keys = name.split(".")
        value = _dotted_value(text)
        for key in reversed(keys):
            value = {key: value}
        _merge(merged.setdefault(flag, {}), value)
    for flag, table in merged.items():
        kept += [flag, json.dumps(table)]
    return kept


def _dotted_value(text: str):
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        try:
            return human_int(text)
        except argparse.ArgumentTypeError:
            return text


def _merge(table: dict, update: dict) -> None:
    """FlexibleArgumentParser's recursive_dict_update: tables merge, lists add up, else the
    later value wins."""
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(table.get(key), dict):
            _merge(table[key], value)
        elif isinstance(value, list) and isinstance(table.get(key), list):
            table[key] += value
        else:
            table[key] = value


def with_config_file(words: list[str]) -> list[str]:
    """`words` with a `--config FILE`'s flags pulled in, as vLLM 0.33.0 does
    (utils/argparse_utils.py, FlexibleArgumentParser._pull_args_from_config and
    load_config_file): the YAML's keys become flags, placed after the model and before the
    command's own flags, so the command's win; true is the bare flag, false its --no- form
    where the flag has one, a list its items, a table its JSON, anything else its text."""
    if any(w.startswith("--config=") for w in words):
        raise UserError(f"{PROG} --config=FILE: vLLM 0.33.0 reads a config file only as "
                        "`--config FILE`", field="serve")
    if words.count("--config") > 1:
        raise UserError(f"{PROG} --config: more than one config file", field="serve")
    if "--config" not in words:
        return words
    index = words.index("--config")
    if index == len(words) - 1:
        raise UserError(f"{PROG} --config: no file follows it", field="serve")
    path = Path(words[index + 1])
    if path.suffix not in (".yaml", ".yml"):
        raise UserError(f"{PROG} --config {path}: vLLM reads a .yaml or .yml file",
                        field="serve")
    config = config_file.load(path)
    if not isinstance(config, dict):
        raise UserError(f"{path}: a vLLM config file is a table of flags", field="serve")
    pulled = []
    for key, value in config.items():
        flag = f"--{key}"
        if isinstance(value, bool):
            pulled += [flag] if value else ([f"--no-{key}"] if _has_no_form(key) else [])
        elif isinstance(value, list):
            pulled += [flag, *map(str, value)] if value else []
        elif isinstance(value, dict):
            pulled += [flag, config_file.as_json(path, key, value)]
        else:
            pulled += [flag, str(value)]
    rest = words[:index] + words[index + 2:]
    model_first = bool(rest) and not rest[0].startswith("-")
    return rest[:1] + pulled + rest[1:] if model_first else pulled + rest


def _has_no_form(key: str) -> bool:
    entry = flag_table().get(f"--{key.replace('_', '-')}")
    return entry is not None and entry["kind"] == "bool"


def parse(words: list[str], version: str | None = None):
    words = with_config_file(words)
    given = vars(parser().parse_args(flexible(words)))
    model = given.pop("model_tag", None) or given.pop("model", None)
    if model is None:
        raise UserError(f"{PROG}: the command names no model", field="serve")
    unmodelled = sorted(f"--{d.replace('_', '-')}" for d in given
                        if f"--{d.replace('_', '-')}" not in MODELLED)
    older = [flag for flag in unmodelled if flag in older_flag_table()]
    unmodelled = [flag for flag in unmodelled if flag not in older]
    inferred = pinned_version(older) if version is None else None
    rules = version_rules(inferred if version is None else version)
    tp, dp = given.get("tensor_parallel_size", 1), given.get("data_parallel_size", 1)
    for flag, value in (("--tensor-parallel-size", tp), ("--data-parallel-size", dp)):
        if value < 1:
            raise UserError(f"{PROG} {flag} {value}: must be at least 1", field="serve")
    _check_kv_memory(given.get("kv_cache_memory_bytes"))
    sections, graphs, notes = _vllm_section(given, rules)
    if version is not None or inferred is not None:  # the rank follows its rules
        sections["vllm"]["engine_version"] = rules.version
    serving = {"max_num_batched_tokens": given.get("max_num_batched_tokens"),
               "max_model_len": given.get("max_model_len"),  # None: default_max_model_len
               "kv_cache_dtype": None,  # by the model: for_model
               "block_size": given.get("block_size", 64)}
    if "gpu_memory_utilization" not in given:
        notes.append(f"gpu_memory_utilization {rules.gpu_memory_utilization}: vLLM "
                     f"{rules.version}'s default")
    if version is not None or inferred is not None:
        notes += version_notes(rules, graphs, inferred_from=older if inferred else None)
    if graphs and rules.graph_estimate == "applied":
        notes.append(WHOLE_MODEL_GRAPHS_NOTE.format(version=rules.version))
    if "block_size" not in given:
        notes.append("block_size 64: vLLM takes the attention backend's; FlashMLA's is 64")
    if given.get("enable_expert_parallel"):
        notes.append(f"--enable-expert-parallel: the routed experts' bytes split over the "
                     f"{tp * dp} ranks as without it (whole experts instead of slices)")
    if older:
        notes.insert(0, older_flags_note(older))
    if unmodelled:
        notes.insert(0, "not modelled: " + ", ".join(unmodelled))
    fraction = given.get("gpu_memory_utilization", rules.gpu_memory_utilization)
    return Parsed(model=model, tensor_parallel=tp * dp, attention_data_parallel=dp, tp=tp,
                  serving=serving, memory_fraction=fraction, engines=["vllm"],
                  operations=["sparse-decode", "sparse-prefill"], sections=sections, notes=notes,
                  cuda_graphs=graphs, prog=PROG, flags=FIELD_FLAGS,
                  expert_parallel=bool(given.get("enable_expert_parallel")),
                  engine_settings={key: given.get(key) for key in
                                   ("kv_cache_dtype", "attention_backend", "block_size",
                                    "max_num_seqs", "dtype")}
                  | {"loads_mtp": (drafts := loads_mtp(given.get("speculative_config", {}))),
                     "mtp_shared_head": drafts and rules.mtp_shares_head})


def _check_sparse_block(block: int | None, gpu_name: str) -> None:
    """--block-size for FLASHMLA_SPARSE's fp8 cache: vLLM 0.33.0 takes a multiple of 64 on
    Hopper and 64 alone on Blackwell (SM100) (v1/attention/backends/mla/flashmla_sparse.py,
    FlashMLASparseBackend.get_supported_kernel_block_sizes)."""
    blackwell = gpu_name.startswith(("B", "GB"))
    if block is None or (block == 64 if blackwell else block > 0 and block % 64 == 0):
        return
    takes = "64 alone on Blackwell" if blackwell else "a multiple of 64 on Hopper"
    raise UserError(f"{PROG} --block-size {block}: FlashMLA's sparse backend (FLASHMLA_SPARSE) "
                    f"takes {takes} for the fp8_ds_mla cache (FlashMLASparseBackend."
                    "get_supported_kernel_block_sizes): use 64, or leave it out", field="serve")


def _check_kv_memory(size: int | None) -> None:
    """--kv-cache-memory-bytes: vLLM 0.33.0 then makes the KV cache that size after its profile
    run, skipping the graph estimate and utilization x total (gpu_worker.py
    determine_available_memory); mlamem's scenarios and budgets size it by the utilization, so a
    size is refused. 0 is unset there (a falsy walrus), and here."""
    if size:
        raise UserError(f"{PROG} --kv-cache-memory-bytes {size}: vLLM 0.33.0 then sizes the KV "
                        "cache to that many bytes, ignoring --gpu-memory-utilization; mlamem "
                        "sizes it as utilization x total - (init + profile peak + non-torch), "
                        "so it would size the cache differently: drop the flag and give "
                        "--gpu-memory-utilization", field="serve")


def for_model(parsed: Parsed, dense: bool, index_head_dim: int | None = None,
              gpu_name: str = "") -> None:
    """The cache, the operations and the backend's note, by the model: vLLM's sparse MLA
    (FLASHMLA_SPARSE, fp8_ds_mla, beside the indexer's keys of `index_head_dim`) for a DSA
    model, its dense MLA decode for a dense one, on `gpu_name`."""
    given = parsed.engine_settings
    backend = given["attention_backend"]
    if not dense:
        parsed.serving["kv_cache_dtype"] = _kv_dtype(given["kv_cache_dtype"])
        if index_head_dim is not None:
            parsed.sections.setdefault("vllm", {})["index_head_dim"] = index_head_dim
        _check_sparse_block(given["block_size"], gpu_name)
        if backend not in (None, "FLASHMLA_SPARSE"):
            parsed.notes.append(f"--attention-backend {backend}: mlamem runs FlashMLA's sparse "
                                "kernels (FLASHMLA_SPARSE) for this model")
        return
    kv = given["kv_cache_dtype"] or "auto"
    if kv not in DENSE_KV_DTYPES:
        raise UserError(f"{PROG} --kv-cache-dtype {kv}: mlamem models the plain bf16 or fp8 "
                        "cache of vLLM's dense MLA (FlashMLA's dense decode); use one of "
                        f"{', '.join(DENSE_KV_DTYPES)}", field="serve")
    if given["block_size"] not in (None, 64):
        raise UserError(f"{PROG} --block-size {given['block_size']}: FlashMLA's dense decode "
                        "reads 64-token pages (FlashMLABackend.get_supported_kernel_block_sizes); "
                        "vLLM runs another backend at that size: use 64, or leave it out",
                        field="serve")
    if kv == "auto" and given["dtype"] not in (None, "auto", "bfloat16"):
        raise UserError(f"{PROG} --dtype {given['dtype']}: with --kv-cache-dtype auto the cache "
                        "takes the model's dtype, and mlamem models a bf16 or fp8 cache: use "
                        "--dtype bfloat16, or --kv-cache-dtype bfloat16 or fp8", field="serve")
    cache = DENSE_KV_DTYPES[kv]
    parsed.serving["kv_cache_dtype"] = cache
    parsed.operations = ["dense-decode"]
    if given["kv_cache_dtype"] is None or kv == "auto":
        parsed.notes.append("kv_cache_dtype bf16: vLLM's auto keeps the model's dtype (bf16 for "
                            "this checkpoint)")
    if backend is None and cache == "bf16":  # platforms/cuda.py _get_backend_priorities, SM90
        parsed.notes.append("attention backend: vLLM 0.33.0 picks FLASH_ATTN_MLA (FA3) first for "
                            "a bf16 cache on Hopper; mlamem drives FlashMLA's dense decode, as "
                            "--attention-backend FLASHMLA runs it")
    elif backend not in (None, "FLASHMLA"):
        parsed.notes.append(f"--attention-backend {backend}: mlamem drives FlashMLA's dense "
                            "decode (FLASHMLA) for this model")


# config/model.py _get_and_verify_max_len: YaRN-like scalings leave max_position_embeddings
# scaled already, so their factor is not applied again
_SCALED_ALREADY = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")
_VLLM_LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length",
                     "model_max_length", "max_target_positions", "max_sequence_length",
                     "max_seq_length", "seq_len")


def default_max_model_len(config) -> tuple[int, str] | None:
    """vLLM 0.33.0's max_model_len for a generative model without --max-model-len, and the
    config key it comes from; None where the config sets none of the keys (vLLM then assumes
    2048 with a warning). ModelArchConfigConvertor.derive_max_model_len_and_key (the smallest
    key, model_max_length winning), then _get_and_verify_max_len's RoPE factor."""
    found = [(config.length_field(k), k) for k in _VLLM_LENGTH_KEYS
             if config.length_field(k) is not None]
    if not found:
        return None
    length, key = min(found, key=lambda pair: pair[0])
    if config.length_field("model_max_length") is not None:
        length, key = config.length_field("model_max_length"), "model_max_length"
    if config.rope_type not in _SCALED_ALREADY and config.rope_factor is not None:
        return int(length * config.rope_factor), f"{key} x rope factor {config.rope_factor:g}"
    return length, key


def fill_max_model_len(parsed: Parsed, config) -> None:
    """--max-model-len, or vLLM's default from the model's config (`Parsed.fill_max_model_len`)."""
    parsed.fill_max_model_len(default_max_model_len(config), flag="--max-model-len", engine="vLLM",
                              release="vLLM 0.33.0", default="default",
                              allow_env="VLLM_ALLOW_LONG_MAX_MODEL_LEN")


# what vLLM 0.33.0 runs for a DSA model's bf16 cache, which mlamem's vLLM rank does not
BF16_DSA_MISSING = ("vLLM decodes a DSA model's bf16 cache with FlashMLA's sparse prefill kernel "
                    "(v1/attention/backends/mla/flashmla_sparse.py _forward_bf16_kv, "
                    "flash_mla_sparse_fwd), a decode step mlamem's vLLM rank does not model")


def _kv_dtype(value: str | None) -> str:
    if value in (None, "auto", "bfloat16"):
        given = ("the command sets no --kv-cache-dtype" if value is None
                 else f"--kv-cache-dtype {value}")
        why = " (vLLM's 'auto' keeps the model's bf16)" if value != "bfloat16" else ""
        raise UserError(f"{PROG}: {given}{why}: "
                        f"{BF16_DSA_MISSING}; to run it, add --kv-cache-dtype fp8_ds_mla",
                        field="serve")
    if value not in KV_DTYPES:
        raise UserError(f"{PROG} --kv-cache-dtype {value}: mlamem models the fp8_ds_mla cache of "
                        f"vLLM's sparse MLA; use one of {', '.join(KV_DTYPES)}", field="serve")
    return KV_DTYPES[value]


def _vllm_section(given: dict, rules: VersionRules) -> tuple[dict, bool, list[str]]:
    """The [vllm] table, whether CUDA graphs hold the attention call, and notes."""
    notes: list[str] = []
    table: dict = {}
    if "max_num_seqs" in given:
        table["max_num_seqs"] = given["max_num_seqs"]
    compilation = given.get("compilation_config", {})
    mode = compilation.get("cudagraph_mode")
    if mode is None:  # the level's default where the config sets none (OPTIMIZATION_LEVEL_0x)
        mode = {0: "NONE", 1: "PIECEWISE"}.get(given.get("optimization_level"))
    if mode is None and rules.default_cudagraph_mode != "FULL_AND_PIECEWISE":
        mode = rules.default_cudagraph_mode
        notes.append(f"cudagraph_mode {mode}: vLLM {rules.version}'s default (VllmConfig."
                     "__post_init__)")
    if mode is not None:
        table["cudagraph_mode"] = str(mode).upper()
    sizes = given.get("cudagraph_capture_sizes") or compilation.get("cudagraph_capture_sizes")
    if isinstance(sizes, list):  # -cc.cudagraph_capture_sizes+ 1,2 gives text; pydantic reads ints
        sizes = [int(n) if isinstance(n, str) and n.isdigit() else n for n in sizes]
    if sizes is not None and not (isinstance(sizes, list) and sizes and all(
            isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in sizes)):
        raise UserError(f"{PROG} --cudagraph-capture-sizes: expected positive integers, got "
                        f"{sizes!r}", field="serve")
    largest = given.get("max_cudagraph_capture_size",
                        compilation.get("max_cudagraph_capture_size"))
    if sizes:
        largest = max(sizes) if largest is None else largest
        notes.append(f"--cudagraph-capture-sizes: the scenario keeps their largest ({max(sizes)}) "
                     "as max_cudagraph_capture_size; pass the list to repro-oom --capture-sizes")
    if largest is not None:
        table["max_cudagraph_capture_size"] = largest
    speculative = given.get("speculative_config", {})
    if "num_speculative_tokens" in speculative:
        table["num_speculative_tokens"] = speculative["num_speculative_tokens"]
    extra = sorted(set(compilation) - {"cudagraph_mode", "cudagraph_capture_sizes",
                                       "max_cudagraph_capture_size"})
    extra += [f"speculative_config.{k}" for k in sorted(set(speculative) - {
        "num_speculative_tokens", "method"})]
    method = speculative.get("method")
    if table.get("num_speculative_tokens", 0) > 0 and not loads_mtp(speculative):
        notes.append(f"speculative method {method!r}: it drafts without the checkpoint's MTP "
                     "layers, which are not counted; its drafter's weights are not modelled")
    if extra:
        notes.append("not modelled in the JSON configs: " + ", ".join(extra))
    if given.get("enforce_eager"):
        table["cudagraph_mode"] = "NONE"  # VllmConfig.__post_init__
    mode = table.get("cudagraph_mode", "FULL_AND_PIECEWISE")
    graphs = mode in FULL_MODES
    table["cuda_graphs"] = graphs
    notes.append("CUDA graphs: " + ("on (the command has no --enforce-eager): [vllm].cuda_graphs "
                                    "= true, repro-oom's --cuda-graphs default" if graphs else
                                    "off (--enforce-eager or cudagraph_mode NONE): "
                                    "[vllm].cuda_graphs = false" if mode == "NONE" else
                                    "PIECEWISE only, the attention call outside them (mlamem's "
                                    "graphs hold it alone; the piecewise graphs' memory is not "
                                    "modelled): [vllm].cuda_graphs = false"))
    return {"vllm": table}, graphs, notes


def loads_mtp(speculative: dict) -> bool:
    """--speculative-config drafts with the checkpoint's MTP layers: an MTP method, or neither
    a method nor a draft model (the checkpoint's own layers, as mlamem has read it)."""
    if not speculative.get("num_speculative_tokens"):
        return False
    method = speculative.get("method")
    return method in MTP_METHODS or (method is None and speculative.get("model") is None)


def batch_defaults(memory_mib: int, gpu_name: str, rules: VersionRules | None = None
                   ) -> tuple[int, int]:
    """`vllm serve`'s max_num_batched_tokens and max_num_seqs without the flags, by the GPU's
    memory (EngineArgs.get_batch_defaults, OPENAI_API_SERVER), at `rules`' version (None:
    DEFAULT_VERSION; the >= 160 GiB tier from 0.28.0)."""
    memory = memory_mib * 1024**2
    if memory >= 160 * GiB and (rules is None or rules.large_gpu_batch_tier):
        return 16384, 1024
    if memory >= 70 * GiB and "a100" not in gpu_name.lower():
        return 8192, 1024
    return 2048, 256


# -- how its saved results read --

def _budget_rule(budget: dict, cases: list[dict]) -> str:
    """The KV cache rule; the graph estimate only where the cases' version sets it aside."""
    aside = budget.get("cuda_graphs") and not any(c.get("graph_estimate_rule") for c in cases)
    graphs = " + CUDA-graph estimate" if aside else ""
    return (f"KV cache rule (vLLM's): utilization {budget['utilization']} x total - (init + "
            f"profile peak + non-torch{graphs}), in whole blocks, after a profile pass that "
            "skips attention")


VIEW = View(
    heading="Runtime OOM reproduction",
    cases_named="--paths",
    table_title="{scenario}{predicted}; GiB",
    table_columns=(
        Column("failed\nalloc", failed_alloc_cell, name=True),
        Column("free at\nOOM", lambda c: gib_cell(c.get("free_bytes_at_oom"))
               if c["verdict"] == Verdict.OOM else ""),
        Column("KV\ncache", lambda c: gib_cell(c.get("kv_cache_bytes"))),
        Column("head-\nroom", lambda c: gib_cell(c.get("headroom_bytes"))
               if c["verdict"] == Verdict.FITS else ""),
        Column("+if out\nstaged", gain_cell),
        Column("max\nsafe T", safe_cell)),
    markdown_columns=(
        Column("KV cache", kv_cell),
        Column("headroom", lambda c: f"{gib_cell(c.get('headroom_bytes'))} GiB"
               if c["verdict"] == Verdict.FITS else "-"),
        Column("+ if out staged", lambda c: gain_cell(c) + (
            " GiB" if c.get("out_staging_gain_bytes") is not None else "")),
        Column("largest safe max_num_batched_tokens", safe_cell)),
    row_name=lambda c: c["path"],
    case_label=lambda c: f"{c['path']} path",
    verdict_in_notes=lambda c: (c["verdict"] not in (Verdict.FITS, Verdict.OOM)
                                or c["verdict"] == Verdict.OOM
                                and c.get("oom_requested_bytes") is None),
    budget_rule=_budget_rule,
    budget_segments=budget_segments,
    step_need=step_need_bytes)


SPEC = EngineSpec(name="vllm", rank="mlamem.engines.vllm:VLLM", view=VIEW, key_field="path",
                  section=VLLMSection)
