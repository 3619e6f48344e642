"""SGLang 0.5.23's rank, for the sparse decode step: one case per decode path.

SGLang runs a DSA model with an fp8 cache on Hopper through `flashmla_kv` for decode and for
prefill (arg_groups/overrides.py, _dsa_split_backend_resolution): FlashMLA's sparse decode over
the fp8 cache, q padded with `new_zeros` to the kernel's head count and out allocated by the
kernel (layers/attention/dsa_backend.py, _forward_flashmla_kv), which is mlamem's alloc path.
A chunked prefill step is that call at `--chunked-prefill-size` tokens. The skeleton's phases
as SGLang runs them:
- init: the workspace (workspace paths only), the weights, the indexer's top-k buffer and the
  KV pool the step reads, as vLLM's rank (engines/decode_rank.py); the memory free before the
  model is what the cap leaves at the start;
- profile: none (SGLang runs no activation profile before sizing the pool);
- KV sizing: free after init - free before the model x (1 - mem_fraction_static), the fraction
  given or derived by SGLang's reserve rule for the target GPU; tokens = that // the DSA fp8
  cell (latent, scales, RoPE and the indexer's keys, per layer), in whole pages
  (engines/sglang_rules.py);
- step: one chunked prefill step of `chunked_prefill_size` tokens (the budget's
  max_num_batched_tokens) through the path under test.
CUDA graphs are not emulated for SGLang: its decode graphs are captured after the pool, out of
the reserve.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlamem.engines.base import Budget, Column, Knob, NoKVRoom, RankMemory, Verdict, View
from mlamem.engines.decode_rank import (
    DecodeCase,
    DecodeRank,
    budget_segments,
    failed_alloc_cell,
    gain_cell,
    gib_cell,
    kv_cell,
    safe_cell,
    step_need_bytes,
)
from mlamem.engines.sglang_rules import (
    SGLangSection,
    dsa_fp8_cell_bytes,
    fraction_for_pool,
    kv_pool_bytes,
    resolve,
)
from mlamem.errors import UserError
from mlamem.scenario import Scenario
from mlamem.units import check_fraction

MiB = 1 << 20
FP8_CACHE = "fp8_ds_mla"  # SGLang's --kv-cache-dtype fp8_e4m3 for a DSA model: the same layout


def settings(scenario: Scenario) -> SGLangSection:
    """The scenario's `[sglang]` table, or its defaults."""
    return scenario.section("sglang")


def resolved(scenario: Scenario, gpu_memory_bytes: int, mem_fraction_static: float | None):
    """SGLang's settings for this rank: sglang_rules.resolve on the scenario's parallel layout
    and `[sglang]` table, the GPU's memory in MiB as SGLang reads it (nvidia-smi's total),
    CUDA graphs as SGLang's defaults capture them (they size the reserve)."""
    table, parallel = settings(scenario), scenario.parallel
    return resolve(gpu_memory_bytes / MiB, tp_size=parallel.tensor_parallel,
                   attn_dp_size=parallel.attention_data_parallel,
                   chunked_prefill_size=table.chunked_prefill_size,
                   max_running_requests=table.max_running_requests,
                   mem_fraction_static=(table.mem_fraction_static if mem_fraction_static is None
                                        else mem_fraction_static))


@dataclass(frozen=True)
class SGLangBudget(Budget):
    """The budget with SGLang's knob: max_num_batched_tokens is --chunked-prefill-size, and
    `utilization` is not read (SGLang's fraction is mem_fraction_static)."""

    mem_fraction_static: float | None = None  # None: the scenario's, else SGLang's reserve rule

    def __post_init__(self) -> None:
        if self.mem_fraction_static is not None:
            check_fraction(self.mem_fraction_static, "mem_fraction_static", one_allowed=False)
        super().__post_init__()


@dataclass(kw_only=True)
class SGLangCase(DecodeCase):
    """One decode path through SGLang's rank: the shared figures and SGLang's own."""

    mem_fraction_static: float | None = None  # the fraction the pool was sized with
    fraction_source: str | None = None  # "given" or "reserve rule: N MiB"
    free_before_model_bytes: int | None = None  # what the cap left before the model
    free_after_init_bytes: int | None = None  # what it left after init, at KV sizing
    kv_cell_bytes: int | None = None  # SGLang's bytes per cached token on the rank


class SGLang(DecodeRank):
    """SGLang serving a DSA model's sparse decode over an fp8 cache; see the module docstring."""

    name = "sglang"
    case_type = SGLangCase
    budget_type = SGLangBudget
    searched_knob = "max_num_batched_tokens"
    searched_fraction = "mem_fraction_static"
    reads_utilization = False
    budget: SGLangBudget

    @classmethod
    def check(cls, scenario: Scenario) -> None:
        if scenario.model.index_topk is None or scenario.serving.kv_cache_dtype != FP8_CACHE:
            raise UserError(
                f"{scenario.name}: SGLang runs FlashMLA's sparse decode (flashmla_kv) only for a "
                f"DSA model ([model].index_topk) with an fp8 cache ({FP8_CACHE}); for other models "
                "and caches it picks another attention backend (FA3 for a bf16 cache on Hopper), "
                "which mlamem does not drive", field="engine")

    @classmethod
    def knob_for_pool(cls, rank: RankMemory, pool_bytes: int) -> Knob:
        """pool = free after init - free before the model x (1 - fraction); the smallest
        fraction in thousandths that gives at least `pool_bytes`."""
        before = rank.total_bytes - rank.non_torch_bytes
        return Knob(cls.name, "mem_fraction_static",
                    fraction_for_pool(pool_bytes, before - rank.init_bytes, before),
                    "the memory free before the model loads")

    @classmethod
    def default_step_tokens(cls, scenario: Scenario, gpu_memory_bytes: int) -> int:
        """SGLang's chunked_prefill_size: the `[sglang]` table's, else its default for the GPU."""
        return resolved(scenario, gpu_memory_bytes, None).chunked_prefill_size

    @classmethod
    def new_case(cls, key: str, budget: dict, *, measured: bool, **fields) -> SGLangCase:
        return SGLangCase(path=key, max_num_batched_tokens=budget["max_num_batched_tokens"],
                          measured=measured, **fields)

    def init(self) -> None:
        self.case.free_before_model_bytes = (self.case.torch_limit_bytes
                                             - self.memory.stats().reserved)
        super().init()

    def profile(self) -> None:
        return None  # SGLang sizes its pool without an activation profile

    def size_kv_cache(self) -> int:
        case, scenario, memory = self.case, self.scenario, self.memory
        rules = resolved(scenario, self.budget.gpu_memory_bytes, self.budget.mem_fraction_static)
        case.mem_fraction_static = rules.mem_fraction_static
        case.fraction_source = ("given" if rules.fraction_given
                                else f"reserve rule: {rules.reserved_mib:g} MiB")
        case.free_after_init_bytes = case.torch_limit_bytes - memory.stats().reserved
        case.kv_cell_bytes = dsa_fp8_cell_bytes(
            kv_lora_rank=scenario.model.kv_lora_rank, qk_rope_head_dim=scenario.model.qk_rope_head_dim,
            index_head_dim=settings(scenario).index_head_dim, num_layers=scenario.model.num_layers)
        pool = kv_pool_bytes(case.free_after_init_bytes, case.free_before_model_bytes,
                             rules.mem_fraction_static)
        page = scenario.serving.block_size
        case.kv_cache_tokens = max(pool, 0) // case.kv_cell_bytes // page * page
        case.kv_cache_bytes = case.kv_cache_tokens * case.kv_cell_bytes
        if case.kv_cache_tokens == 0:
            raise NoKVRoom(f"no memory left for the KV pool: {case.free_after_init_bytes} B free "
                           f"after init, less (1 - {rules.mem_fraction_static}) x "
                           f"{case.free_before_model_bytes} B free before the model; SGLang "
                           "refuses to start (raise mem_fraction_static)")
        return case.kv_cache_bytes


def _fraction_cell(case: dict) -> str:
    fraction = case.get("max_safe_mem_fraction_static")
    return "n/a" if fraction is None else ("none" if fraction == 0 else f"{fraction:.3f}")


def _budget_rule(budget: dict, cases: list[dict]) -> str:
    fractions = sorted({f"{c['mem_fraction_static']} ({c['fraction_source']})" for c in cases
                        if c.get("mem_fraction_static") is not None})
    return ("KV pool rule (SGLang's): free after init - free before the model x (1 - "
            f"mem_fraction_static {', '.join(fractions) or 'n/a'}), in whole pages of the DSA "
            f"fp8 cell; no profile pass; chunked_prefill_size {budget['max_num_batched_tokens']}")


SGLang.view = View(
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
        Column("max safe\nfraction", _fraction_cell)),
    markdown_columns=(
        Column("KV pool", kv_cell),
        Column("mem_fraction_static", lambda c: f"{c.get('mem_fraction_static')} "
                                                f"({c.get('fraction_source')})"),
        Column("headroom", lambda c: f"{gib_cell(c.get('headroom_bytes'))} GiB"
               if c["verdict"] == Verdict.FITS else "-"),
        Column("+ if out staged", lambda c: gain_cell(c) + (
            " GiB" if c.get("out_staging_gain_bytes") is not None else "")),
        Column("largest safe chunked_prefill_size", safe_cell),
        Column("largest safe mem_fraction_static (model)", _fraction_cell)),
    row_name=lambda c: c["path"],
    case_label=lambda c: f"{c['path']} path",
    verdict_in_notes=lambda c: (c["verdict"] not in (Verdict.FITS, Verdict.OOM)
                                or c["verdict"] == Verdict.OOM
                                and c.get("oom_requested_bytes") is None),
    budget_rule=_budget_rule,
    budget_segments=budget_segments,
    step_need=step_need_bytes,
    step_tokens="chunked_prefill_size")

ENGINE = SGLang
