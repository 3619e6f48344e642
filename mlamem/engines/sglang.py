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
  (spec/engines/sglang.py);
- capture (CUDA graphs on, `SGLangBudget.cuda_graphs`): the decode graphs, after the pool, out
  of what the fraction left: the batch sizes of spec/engines/sglang.py (SGLang's list, or
  `[sglang].cuda_graph_bs`, up to `cuda_graph_max_bs`, within the request pool the KV pool
  gives), largest first, each at bs x tokens per request, into one pool that lives on. Each
  graph holds the attention call only (as vLLM's, engines/vllm.py), its q a static buffer:
  flashmla_kv's, q padded by `new_zeros`, on the path under test. SGLang warms each graph up
  twice before its capture (runner_backend/full_cuda_graph_backend.py, capture_one); the second
  warm-up frees what the first did, so one is measured. A capture that runs out of memory stops
  SGLang at start-up ("Capture cuda graph failed", runner/decode_cuda_graph_runner.py), whose
  advice is a lower mem_fraction_static: the case's largest safe fraction is that fix;
- step: one chunked prefill step of `chunked_prefill_size` tokens (the budget's
  max_num_batched_tokens) through the path under test, with what the graphs left.
The prefill graphs (breakable, for an MLA model up to 8192 tokens) are not captured: they size
the reserve only.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from mlamem.engines.base import (
    Budget,
    Knob,
    NoKVRoom,
    PhaseFailed,
    RankMemory,
    non_torch_now,
)
from mlamem.engines.decode_rank import (
    DecodeCase,
    DecodeRank,
)
from mlamem.runtime.graph_capture import capture_all
from mlamem.runtime.non_torch import graph_steps_note
from mlamem.spec.engines.rank_buffers import Stage
from mlamem.spec.engines.sglang import (
    SPEC,
    SGLangSection,
    decode_capture_batches,
    draft_kv_layers,
    dsa_fp8_cell_bytes,
    fraction_cell,
    fraction_for_pool,
    graph_alignment,
    indexer_layer_count,
    kv_pool_bytes,
    max_num_reqs,
    resolve,
    sglang_rules,
)
from mlamem.spec.engines.sglang_pass import mqa_logits_budget_bytes, step_shape, step_stages
from mlamem.spec.errors import UserError
from mlamem.spec.gpus import GPUS
from mlamem.spec.scenario import Scenario
from mlamem.spec.units import check_fraction, format_bytes

MiB = 1 << 20
BACKEND = "flashmla_kv"  # SGLang 0.5.23's DSA backend over an fp8 cache on Hopper (overrides.py)
WHAT_IF = "what-if staging (not SGLang's)"  # a staging path: what SGLang does not do
FP8_CACHE = "fp8_ds_mla"  # SGLang's --kv-cache-dtype fp8_e4m3 for a DSA model: the same layout


def settings(scenario: Scenario) -> SGLangSection:
    """The scenario's `[sglang]` table, or its defaults."""
    return scenario.section("sglang")


def smi_memory_mib(scenario: Scenario, gpu_memory_bytes: int) -> tuple[float, str | None]:
    """The GPU total SGLang's rules read, in MiB: nvidia-smi's memory.total
    (utils/common.py, get_nvgpu_memory_capacity), from the GPU table where the target is the
    scenario's GPU (one of its figures); else the budget's total, and a note saying so."""
    known = GPUS.get(scenario.gpu.name)
    mib = gpu_memory_bytes / MiB
    if known is not None and mib in (known.smi_mib, known.cuda_mib, known.measured_mib):
        return known.smi_mib, None
    return mib, (f"nvidia-smi's memory.total is unknown for a {mib:g} MiB {scenario.gpu.name} "
                 "(no figure of mlamem's GPU table): SGLang's rules read the budget's total "
                 "instead")


def resolved(scenario: Scenario, gpu_memory_bytes: int, mem_fraction_static: float | None,
             chunked_prefill_size: int | None = None):
    """SGLang's settings for this rank: spec.engines.sglang.resolve on the scenario's parallel layout
    and `[sglang]` table, the GPU's memory as SGLang reads it (`smi_memory_mib`), CUDA graphs
    as SGLang's defaults capture them (they size the reserve); `chunked_prefill_size` is the
    step's (the budget's), else the table's, else the GPU's default: a derived fraction follows
    it."""
    table, parallel = settings(scenario), scenario.parallel
    return resolve(smi_memory_mib(scenario, gpu_memory_bytes)[0],
                   tp_size=parallel.tensor_parallel,
                   attn_dp_size=parallel.attention_data_parallel,
                   chunked_prefill_size=chunked_prefill_size or table.chunked_prefill_size,
                   cuda_graph_max_bs=table.decode_max_bs,
                   max_running_requests=table.max_running_requests,
                   speculative=table.speculative_num_draft_tokens is not None,
                   mem_fraction_static=(table.mem_fraction_static if mem_fraction_static is None
                                        else mem_fraction_static))


def graph_tokens_per_request(scenario: Scenario) -> int:
    """A decode graph's tokens per request: 1, or the draft tokens under speculative decoding
    (model_runner.py, decode_num_tokens_per_req)."""
    return settings(scenario).speculative_num_draft_tokens or 1


@dataclass(frozen=True)
class SGLangBudget(Budget):
    """The budget with SGLang's knob: max_num_batched_tokens is --chunked-prefill-size, and
    `utilization` is not read (SGLang's fraction is mem_fraction_static)."""

    mem_fraction_static: float | None = None  # None: the scenario's, else SGLang's reserve rule
    cuda_graphs: bool = False  # the decode CUDA graphs are captured after the pool

    def __post_init__(self) -> None:
        if self.mem_fraction_static is not None:
            check_fraction(self.mem_fraction_static, "mem_fraction_static", one_allowed=False)
        super().__post_init__()

    def to_dict(self) -> dict:
        """`cuda_graphs` only when on, so a result without graphs reads as it did before."""
        data = dataclasses.asdict(self)
        if not self.cuda_graphs:
            del data["cuda_graphs"]
        return data


@dataclass(kw_only=True)
class SGLangCase(DecodeCase):
    """One decode path through SGLang's rank: the shared figures and SGLang's own."""

    backend: str | None = None  # the SGLang backend the path stands for (BACKEND), or WHAT_IF
    mem_fraction_static: float | None = None  # the fraction the pool was sized with
    fraction_source: str | None = None  # "given" or "reserve rule: N MiB"
    free_before_model_bytes: int | None = None  # what the cap left before the model
    free_after_init_bytes: int | None = None  # what it left after init, at KV sizing
    kv_cell_bytes: int | None = None  # SGLang's bytes per cached token on the rank
    # the bytes per token SGLang divides the pool's memory by, where its version's differ from
    # what the pool allocates (before 0.5.17: spec.engines.sglang SIZING_CELL_STORED_FROM)
    kv_sizing_cell_bytes: int | None = None
    smi_memory_mib: float | None = None  # the GPU total SGLang's rules read (nvidia-smi's)
    smi_memory_note: str | None = None  # where the budget's total stood in for nvidia-smi's
    # the decode CUDA graphs (repro-oom --cuda-graphs on; absent from results without them)
    graph_list_source: str | None = None  # where the batch sizes come from, in words
    graph_batch_sizes: list[int] | None = None  # the batch sizes, in capture order (largest first)
    graph_tokens_per_request: int | None = None  # each graph's tokens: bs x this
    graph_request_pool: int | None = None  # max_num_reqs: the list stops there
    graph_input_bytes: int | None = None  # the static q buffer the graphs read
    graph_captures: int | None = None  # graphs captured (a failed capture not counted)
    graph_failed_batch_size: int | None = None  # the batch whose capture failed
    graph_pool_bytes: int | None = None  # the pool they took (allocator reserved growth)
    graph_device_bytes: int | None = None  # the device-wide growth (measured, or the model's)

    def to_dict(self) -> dict:
        data = super().to_dict()
        if self.kv_sizing_cell_bytes is None:  # sized with the cell it allocates, as always read
            del data["kv_sizing_cell_bytes"]
        if self.graph_list_source is None:  # graphs off: the case as it always read
            for name in [n for n in data if n.startswith("graph_")]:
                del data[name]
        return data


class SGLang(DecodeRank):
    """SGLang serving a DSA model's sparse decode over an fp8 cache; see the module docstring."""

    name, spec, view = SPEC.name, SPEC, SPEC.view
    case_type = SGLangCase
    budget_type = SGLangBudget
    searched_knob = "max_num_batched_tokens"
    searched_fraction, step_knob_name = SPEC.searched_fraction, SPEC.step_knob_name
    reads_utilization = SPEC.reads_utilization
    captures_graphs = True
    budget: SGLangBudget

    @classmethod
    def check(cls, scenario: Scenario) -> None:
        if scenario.model.index_topk is None or scenario.serving.kv_cache_dtype != FP8_CACHE:
            raise UserError(
                f"{scenario.name}: SGLang runs FlashMLA's sparse decode (flashmla_kv) only for a "
                f"DSA model ([model].index_topk) with an fp8 cache ({FP8_CACHE}); for other models "
                "and caches it picks another attention backend (FA3 for a bf16 cache on Hopper), "
                "which mlamem does not drive", field="engine")
        if (settings(scenario).speculative_num_draft_tokens is not None
                and not scenario.model.num_nextn_predict_layers):
            raise UserError(
                f"{scenario.name}: [sglang].speculative_num_draft_tokens asks for EAGLE drafting "
                "with the checkpoint's MTP layers, which SGLang sizes the draft's KV by "
                "([model].num_nextn_predict_layers, none here): set it, or leave drafting out",
                field="sglang.speculative_num_draft_tokens")

    @classmethod
    def knob_for_pool(cls, rank: RankMemory, pool_bytes: int) -> Knob:
        """pool = free after init - free before the model x (1 - fraction); the smallest
        fraction in thousandths that gives at least `pool_bytes`."""
        before = rank.total_bytes - rank.non_torch_bytes
        return Knob(cls.name, "mem_fraction_static",
                    fraction_for_pool(pool_bytes, before - rank.init_bytes, before),
                    "the memory free before the model loads")

    @classmethod
    def pinned(cls, budget: Budget, case: dict) -> Budget:
        """With the fraction derived by the reserve rule, the fraction the case ran with pinned:
        SGLang re-derives it from a chunk given alone."""
        if case.get("fraction_source", "given") == "given" or case.get("mem_fraction_static") is None:
            return budget
        return dataclasses.replace(budget, mem_fraction_static=case["mem_fraction_static"])

    @classmethod
    def default_step_tokens(cls, scenario: Scenario, gpu_memory_bytes: int) -> int:
        """SGLang's chunked_prefill_size: the `[sglang]` table's, else its default for the GPU."""
        return resolved(scenario, gpu_memory_bytes, None).chunked_prefill_size

    @classmethod
    def make_budget(cls, **knobs) -> Budget:
        """The budget; capture sizes in tokens are vLLM's, and refused with SGLang's own."""
        if knobs.get("capture_sizes") is not None:
            raise UserError("SGLang captures batch sizes, not token counts: set "
                            "[sglang].cuda_graph_bs in the scenario", field="capture_sizes")
        return super().make_budget(**knobs)

    @classmethod
    def notes(cls, cases: list[dict]) -> list[str]:
        """The backend each path stands for; where the budget's total stood in for
        nvidia-smi's; with CUDA graphs: per path, the
        list, the pool the captures took, or the capture that failed and the fraction that
        holds; and where they outnumber the graphs the host's
        graph memory was measured to, that the device figures may miss steps."""
        lines = ["backends: " + "; ".join(f"{c['path']}: {_backend_text(c)}" for c in cases)]
        lines += sorted({c["smi_memory_note"] for c in cases if c.get("smi_memory_note")})
        lines += [_graphs_note(c) for c in cases if c.get("graph_list_source") is not None]
        if note := graph_steps_note(max((c.get("graph_captures") or 0) for c in cases)):
            lines.append(note)
        return lines

    @classmethod
    def new_case(cls, key: str, budget: dict, *, measured: bool, **fields) -> SGLangCase:
        return SGLangCase(path=key, max_num_batched_tokens=budget["max_num_batched_tokens"],
                          backend=BACKEND if key == "alloc" else WHAT_IF, measured=measured,
                          **fields)

    def free_now(self) -> int:
        """The device's free memory as SGLang reads it (utils get_available_gpu_memory,
        cudaMemGetInfo): what the cap leaves, less what other ranks or processes hold."""
        return (self.case.torch_limit_bytes - self.memory.stats().reserved
                - self.memory.held_bytes())

    def init(self) -> None:
        self.case.free_before_model_bytes = self.free_now()
        super().init()

    def profile(self) -> None:
        return None  # SGLang sizes its pool without an activation profile

    def stages(self, tokens: int) -> list[Stage]:
        """SGLang 0.5.23's chunked-prefill step beyond attention (spec/engines/sglang_pass.py):
        the indexer's logits budget from the GPU's total, the pool's fraction and what is free
        now (SGLang measures it at its first large prefill)."""
        free = self.free_now()
        budget = mqa_logits_budget_bytes(self.budget.gpu_memory_bytes,
                                         self.rules().mem_fraction_static, free)
        return step_stages(step_shape(self.scenario, tokens), budget)

    def workspace_tokens(self) -> int:
        """The step's tokens, or the largest decode graph's where that is more (graphs on)."""
        tokens = self.budget.max_num_batched_tokens
        if not self.budget.cuda_graphs:
            return tokens
        table, rules = settings(self.scenario), self.rules()
        largest = max(table.cuda_graph_bs or rules.decode_batch_sizes)
        return max(tokens, largest * graph_tokens_per_request(self.scenario))

    def rules(self):
        """spec.engines.sglang.resolve for this rank's budget."""
        return resolved(self.scenario, self.budget.gpu_memory_bytes,
                        self.budget.mem_fraction_static, self.budget.max_num_batched_tokens)

    def size_kv_cache(self) -> int:
        case, scenario = self.case, self.scenario
        rules = self.rules()
        case.mem_fraction_static = rules.mem_fraction_static
        case.smi_memory_mib, case.smi_memory_note = smi_memory_mib(scenario,
                                                                   self.budget.gpu_memory_bytes)
        case.fraction_source = ("given" if rules.fraction_given
                                else f"reserve rule: {rules.reserved_mib:g} MiB")
        case.free_after_init_bytes = self.free_now()
        version = sglang_rules(settings(scenario).engine_version)
        cell = {"kv_lora_rank": scenario.model.kv_lora_rank,
                "qk_rope_head_dim": scenario.model.qk_rope_head_dim,
                "index_head_dim": settings(scenario).index_head_dim,
                "num_layers": scenario.model.num_layers,
                "indexer_layers": indexer_layer_count(scenario, version),
                "draft_layers": draft_kv_layers(scenario.model, settings(scenario))}
        case.kv_cell_bytes = dsa_fp8_cell_bytes(**cell)
        sizing = dsa_fp8_cell_bytes(**cell | {
            "latent_as_stored": version.sizing_cell_stored,
            "indexer_layers": cell["indexer_layers"] if version.sizing_indexer else 0})
        case.kv_sizing_cell_bytes = sizing if sizing != case.kv_cell_bytes else None
        pool = kv_pool_bytes(case.free_after_init_bytes, case.free_before_model_bytes,
                             rules.mem_fraction_static)
        page = scenario.serving.block_size
        case.kv_cache_tokens = max(pool, 0) // sizing // page * page
        case.kv_cache_bytes = case.kv_cache_tokens * case.kv_cell_bytes
        if case.kv_cache_tokens == 0:
            raise NoKVRoom(f"no memory left for the KV pool: {case.free_after_init_bytes} B free "
                           f"after init, less (1 - {rules.mem_fraction_static}) x "
                           f"{case.free_before_model_bytes} B free before the model; SGLang "
                           "refuses to start (raise mem_fraction_static)")
        return case.kv_cache_bytes

    def capture_graphs(self) -> None:
        if not self.budget.cuda_graphs:
            return
        memory, case, scenario = self.memory, self.case, self.scenario
        table, rules = settings(scenario), self.rules()
        parallel, per_request = scenario.parallel, graph_tokens_per_request(scenario)
        case.graph_request_pool = max_num_reqs(case.kv_cache_tokens, scenario.serving.max_model_len,
                                               table.running_requests,
                                               parallel.attention_data_parallel)
        case.graph_batch_sizes = decode_capture_batches(
            rules.decode_max_bs, case.graph_request_pool, given=table.cuda_graph_bs,
            speculative=table.speculative_num_draft_tokens is not None,
            tokens_per_request=per_request,
            alignment=graph_alignment(parallel.tensor_parallel, parallel.attention_data_parallel))
        case.graph_tokens_per_request = per_request
        case.graph_list_source = _list_source(table, rules.decode_max_bs)
        self.allocating = "graph input (static q)"
        start = memory.stats().allocated
        call = self.make_graph_call(case.graph_batch_sizes[0] * per_request)
        case.graph_input_bytes = memory.stats().allocated - start
        graphs = self.contexts.enter_context(memory.graphs())  # live until the case ends
        start, device_start = memory.stats(), memory.device_used_bytes()
        captures, failure = capture_all(memory, graphs, call,
                                        [bs * per_request for bs in case.graph_batch_sizes])
        case.graph_captures = len(captures) - (failure is not None)
        if failure is not None:
            case.graph_failed_batch_size = case.graph_batch_sizes[len(captures) - 1]
            raise PhaseFailed(failure)
        case.graph_pool_bytes = memory.stats().reserved - start.reserved
        device_end = memory.device_used_bytes()
        if device_end is not None and device_start is not None:
            case.graph_device_bytes = device_end - device_start
        # what graph instantiation took outside the allocator is gone from the device
        case.torch_limit_bytes = memory.set_limit(self.budget.gpu_memory_bytes
                                                  - non_torch_now(memory))


def _list_source(table: SGLangSection, max_bs: int) -> str:
    """Where the capture list comes from, in SGLang's words."""
    if table.cuda_graph_bs:
        given = "[sglang].cuda_graph_bs (--cuda-graph-bs-decode)"
    else:
        bound = ("[sglang].cuda_graph_max_bs" if table.cuda_graph_max_bs is not None
                 else "the GPU's default" + (", capped by max_running_requests"
                                             if table.max_running_requests is not None else ""))
        kind = "speculative " if table.speculative_num_draft_tokens is not None else ""
        given = f"SGLang 0.5.23's {kind}decode list up to max_bs {max_bs} ({bound})"
    return f"{given}, within the request pool"


def _backend_text(case: dict) -> str:
    """A path's backend in words."""
    if case.get("backend") == BACKEND:
        return f"{BACKEND} as SGLang 0.5.23 runs it (arg_groups/overrides.py)"
    return f"what-if staging of the {case['path']} path, which SGLang does not do"


def _graphs_note(case: dict) -> str:
    """One path's CUDA-graph line."""
    sizes, per_request = case["graph_batch_sizes"], case["graph_tokens_per_request"]
    listed = (f"{len(sizes)} decode graphs, bs {sizes[0]} down to {sizes[-1]} x {per_request} "
              f"token{'s' if per_request > 1 else ''} per request ({case['graph_list_source']} "
              f"of {case['graph_request_pool']}), static q {format_bytes(case['graph_input_bytes'])}")
    if case.get("graph_failed_batch_size") is not None:
        fraction = fraction_cell(case)
        return (f"{case['path']}: CUDA graphs: {listed}; OOM at CUDA-graph capture of bs "
                f"{case['graph_failed_batch_size']} after {case['graph_captures']} graphs: SGLang "
                "stops at start-up (\"Capture cuda graph failed\"; its advice: a lower "
                f"mem_fraction_static); the largest that holds: {fraction}")
    device = case.get("graph_device_bytes")
    return (f"{case['path']}: CUDA graphs: {listed}; captured largest first into a "
            f"{format_bytes(case['graph_pool_bytes'])} pool"
            + ("" if device is None else f" ({format_bytes(device)} on the device)")
            + "; the step ran with what they left")


ENGINE = SGLang
