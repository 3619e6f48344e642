"""`mlamem plan`: KV-cache capacity for one rank, with the fp8 context-MLA workspace reserve.

The arithmetic of TensorRT-LLM PR #16399:
    k      = KV-cache bytes per token (layers x bytes per token per layer)
    w      = fp8 context-MLA K/V staging bytes per attended token
             = heads_per_rank x (qk_nope + qk_rope + v_head_dim) x 1 B
    L_cap  = min(max_batch_size, max_num_tokens) x max_seq_len
    reserve = min(w x L_cap, budget x w / (k + w)); admission cap = reserve / w tokens
    pool   = (budget - reserve) / k tokens
applied only when block reuse is on and chunked prefill is off. The reviewer's point, the BF16
full-gather buffers of the reuse path (full_kv and full_k), is shown separately and in an
"everything charged" variant where w also counts them. For sparse scenarios the vLLM side is
planned too: the mixed-batch per-call need (from the validated allocator model) and the bf16
prefill workspace, against the headroom the engine leaves.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mlamem.commands.profile import run_profile
from mlamem.engines import engine_names, load_engine
from mlamem.spec.context_reserve import (  # noqa: F401 (re-exported: the reserve sits below the engines)
    Reserve,
    admit,
    gather_bytes_per_token,
    kv_bytes_per_token,
    kv_len_cap,
    reserve,
    reserve_gate,
    staging_bytes_per_token,
)
from mlamem.spec.engines import vllm as vllm_rules
from mlamem.spec.errors import UserError
from mlamem.spec.lists import parse_list
from mlamem.spec.units import MAX_TOKENS, parse_bytes

if TYPE_CHECKING:
    from mlamem.results.plan import OnePlan, PlanFile
    from mlamem.spec.scenario import Scenario

SCHEMA = "mlamem.plan/1"
PREFILL_WORKSPACE_COPIES = 5  # vLLM's sparse-MLA bf16 prefill workspace: 5 x max_model_len x 576
SWEEPABLE = {"max-seq-len": "max_seq_len", "max-batch-size": "max_batch_size",
             "max-num-tokens": "max_num_tokens", "gpu-memory": "gpu_memory_bytes",
             "utilization": "utilization", "free-fraction": "free_fraction"}


@dataclass(frozen=True)
class PlanRequest:
    """One rank's memory and serving settings; sizes in bytes or tokens."""

    gpu_memory_bytes: int
    max_num_tokens: int  # tokens per step (vLLM max_num_batched_tokens)
    max_batch_size: int
    max_seq_len: int  # also vLLM's max_model_len
    block_reuse: bool
    chunked_prefill: bool
    utilization: float | None = None  # vLLM: KV budget = utilization x total - weights
    free_fraction: float | None = None  # TRT-LLM: KV budget = fraction x (total - weights)

    def __post_init__(self) -> None:
        for name in ("gpu_memory_bytes", "max_num_tokens", "max_batch_size", "max_seq_len"):
            if getattr(self, name) <= 0:
                raise UserError(f"must be > 0, got {getattr(self, name)}", field=name)
            if name != "gpu_memory_bytes" and getattr(self, name) > MAX_TOKENS:
                raise UserError(f"must be at most {MAX_TOKENS} (engines count tokens in int32), "
                                f"got {getattr(self, name)}", field=name)
        if (self.utilization is None) == (self.free_fraction is None):
            raise UserError("give one of utilization (vLLM) and free_fraction (TRT-LLM), "
                            "not both")
        for name in ("utilization", "free_fraction"):
            value = getattr(self, name)
            if value is not None and not 0 < value <= 1:
                raise UserError(f"{value} is outside (0, 1]; pass a fraction such as 0.9",
                                field=name)


def request_for(scenario: Scenario, **overrides) -> PlanRequest:
    """The scenario's settings, with any of PlanRequest's fields overridden (None = keep)."""
    s = scenario.serving
    values = dict(gpu_memory_bytes=scenario.gpu.memory_bytes,
                  max_num_tokens=s.max_num_batched_tokens,
                  max_batch_size=s.max_batch_size or s.max_num_batched_tokens,
                  max_seq_len=s.max_model_len, block_reuse=s.block_reuse,
                  chunked_prefill=s.chunked_prefill, utilization=None, free_fraction=None)
    values.update({k: v for k, v in overrides.items() if v is not None})
    if values["utilization"] is None and values["free_fraction"] is None:
        values["utilization"] = scenario.gpu.gpu_memory_utilization
    return PlanRequest(**values)


def make_plan(scenario: Scenario, request: PlanRequest, kernel: str | None = None,
              engine: str | None = None, tokens_given: bool = True) -> OnePlan:
    """The plan for one rank; see the module docstring."""
    from mlamem.results.plan import OnePlan  # pydantic: once a plan is made
    weights = scenario.parallel.weights_bytes
    total = request.gpu_memory_bytes
    if request.utilization is not None:
        budget = int(request.utilization * total) - weights
        headroom = total - int(request.utilization * total)
    else:
        budget = int(request.free_fraction * (total - weights))
        headroom = total - weights - budget
    if budget <= 0:
        raise UserError(f"the weights ({weights} B) leave no KV budget on a {total} B GPU; "
                        "raise the GPU memory or the utilization", field="gpu_memory_bytes")
    k, w, gather = (plan_kv_bytes_per_token(scenario, request), staging_bytes_per_token(scenario),
                    gather_bytes_per_token(scenario))
    l_cap = kv_len_cap(request.max_batch_size, request.max_num_tokens, request.max_seq_len)
    applies, reason = reserve_gate(request.block_reuse, request.chunked_prefill)
    pool_without = budget // k
    return OnePlan.model_validate({
        "request": dataclasses.asdict(request), "weights_bytes": weights,
        "budget_bytes": budget, "k_bytes_per_token": k, "w_bytes_per_token": w,
        "gather_bytes_per_token": gather, "kv_len_cap_tokens": l_cap, "gate_on": applies,
        "gate_reason": reason, "pool_tokens_without_reserve": pool_without,
        "fp8_reserve": dataclasses.asdict(reserve(budget, k, w, l_cap, applies, pool_without)),
        "full_reserve": dataclasses.asdict(
            reserve(budget, k, w + gather, l_cap, applies, pool_without)),
        "vllm": _vllm_side(scenario, request, headroom, kernel) if scenario.model.index_topk
        else None,
        "engine_knobs": engine_knobs(scenario, request, kernel)
        if scenario.model.index_topk and request.utilization is not None else None,
        "engine_limits": None if engine is None
        else engine_limits(scenario, request, engine, kernel, tokens_given)})


def plan_kv_bytes_per_token(scenario: Scenario, request: PlanRequest) -> int:
    """k: under vLLM's budget (a utilization), vLLM's bytes per token, a DSA model's indexer
    keys included (spec.engines.vllm.kv_bytes_per_token); under TRT-LLM's (a free
    fraction), the cell alone, as TRT-LLM PR #16399's arithmetic counts it."""
    if request.utilization is None:
        return kv_bytes_per_token(scenario)
    return vllm_rules.kv_bytes_per_token(scenario)


def prefill_workspace_bytes(scenario: Scenario, max_model_len: int) -> int:
    """vLLM's sparse-MLA bf16 prefill workspace: 5 x max_model_len x d_qk x 2 B."""
    return PREFILL_WORKSPACE_COPIES * max_model_len * scenario.d_qk * 2


def _vllm_side(scenario: Scenario, request: PlanRequest, headroom: int,
               kernel_name: str | None = None) -> dict:
    """Per-call needs at max_num_tokens (allocator model, `kernel_name`'s sparse decode: the
    default kernel when None) and the prefill workspace."""
    from mlamem.kernels import DEFAULT_KERNEL, load_kernel

    tokens = request.max_num_tokens
    at = dataclasses.replace(scenario, serving=dataclasses.replace(
        scenario.serving, max_num_batched_tokens=tokens))
    kernel = load_kernel(kernel_name or DEFAULT_KERNEL)()
    rows = run_profile(at, [tokens], ["alloc", "workspace"], command="plan", predict=True,
                       kernel=kernel).rows
    needs = {row.path: row.peak_allocated_bytes for row in rows}
    prefill = prefill_workspace_bytes(scenario, request.max_seq_len)
    return {"kernel": kernel.name, "max_num_batched_tokens": tokens, "headroom_bytes": headroom,
            "per_call_need_bytes": needs,
            "per_call_fits": {path: need <= headroom for path, need in needs.items()},
            "prefill_workspace_bytes": prefill, "prefill_workspace_fits": prefill <= headroom}


def engine_knobs(scenario: Scenario, request: PlanRequest, kernel_name: str | None = None) -> dict:
    """The same pool under each engine's knob: vLLM's KV pool for the alloc path at the
    request's utilization (its emulation on the allocator model, as `repro-oom --predict`
    runs it), then each registered engine's fraction that gives that pool, as its own rule
    multiplies it (`Engine.knob_for_pool`), on the rank that engine keeps (`_rank_for_knob`)."""
    from mlamem.commands.repro import host_setup
    from mlamem.engines.vllm import VLLM, VLLMBudget
    from mlamem.kernels import DEFAULT_KERNEL, load_kernel

    kernel = load_kernel(kernel_name or DEFAULT_KERNEL)()
    budget = VLLMBudget(gpu_memory_bytes=request.gpu_memory_bytes, utilization=request.utilization,
                        max_num_batched_tokens=request.max_num_tokens)
    target = host_setup(kernel.name, predict=True, target_bytes=request.gpu_memory_bytes)
    case = _emulate_alloc(VLLM, scenario, kernel, budget, target)
    if not case.kv_cache_bytes:
        return {"pool_bytes": 0, "knobs": [], "note": case.failure or "vLLM leaves no KV pool"}
    rank = _rank_memory(request, case)
    ranks = {engine: _rank_for_knob(engine, scenario, request, kernel, target, rank)
             for engine in map(load_engine, engine_names())}
    knobs = [engine.knob_for_pool(own, case.kv_cache_bytes) for engine, own in ranks.items()
             if own is not None]
    return {"pool_bytes": case.kv_cache_bytes, "rank": dataclasses.asdict(rank),
            "knobs": [k._asdict() for k in knobs if k is not None]}


def _emulate_alloc(engine, scenario: Scenario, kernel, budget, target):
    """`engine`'s first case for the alloc path on the allocator model, on `target`'s record."""
    from mlamem.runtime.memory import SimulatedMemory

    return engine.emulate(SimulatedMemory(non_torch=target), scenario, kernel, budget,
                          engine.case_keys(["alloc"])[0], sm_count=scenario.gpu.sm_count)


def _rank_memory(request: PlanRequest, case):
    """A case's init and profile peak as the engines' fractions read them (`RankMemory`)."""
    from mlamem.engines.base import RankMemory

    return RankMemory(request.gpu_memory_bytes, case.non_torch_bytes, case.init_bytes,
                      case.profile_peak_bytes or 0)


def _rank_for_knob(engine, scenario: Scenario, request: PlanRequest, kernel, target, vllm_rank):
    """The rank `engine`'s knob reads: its own emulation's at the request's step tokens where
    it serves the scenario (`Engine.check`; vLLM keeps its shared workspace at init, SGLang
    does not), else vLLM's (`vllm_rank`); None where its own init does not fit."""
    if engine.name == "vllm":
        return vllm_rank
    try:
        engine.check(scenario)
    except UserError:
        return vllm_rank  # a rank this engine does not run (TRT-LLM's outside context reuse)
    budget = engine.make_budget(gpu_memory_bytes=request.gpu_memory_bytes,
                                utilization=request.utilization,
                                max_num_batched_tokens=request.max_num_tokens)
    case = _emulate_alloc(engine, scenario, kernel, budget, target)
    if getattr(case, "init_bytes", None) is None or case.non_torch_bytes is None:
        return None  # its init does not fit: no fraction gives the pool
    return _rank_memory(request, case)


def engine_limits(scenario: Scenario, request: PlanRequest, engine: str,
                  kernel_name: str | None = None, tokens_given: bool = True) -> dict:
    """`engine`'s largest safe knobs for this rank, per path: its emulation on the allocator
    model, searched as `repro-oom --engine ENGINE --predict` searches them (the step's tokens,
    and the engine's memory fraction where it has one), at the request's GPU, from the
    request's step tokens where given (`tokens_given`), else the engine's default; CUDA
    graphs off."""
    from mlamem.commands.repro import run_repro, scenario_engine
    from mlamem.kernels import DEFAULT_KERNEL, load_kernel

    chosen = scenario_engine(scenario, engine)
    kernel = load_kernel(kernel_name or DEFAULT_KERNEL)()
    budget = chosen.make_budget(
        gpu_memory_bytes=request.gpu_memory_bytes,
        utilization=request.utilization or scenario.gpu.gpu_memory_utilization,
        max_num_batched_tokens=request.max_num_tokens if tokens_given
        else chosen.default_step_tokens(scenario, request.gpu_memory_bytes))
    result = run_repro(scenario, budget, ["alloc", "workspace"], command="plan", kernel=kernel,
                       predict=True, engine=chosen.name)
    key = chosen.case_type.key_field
    fraction = chosen.searched_fraction
    cases = [{"case": case[key], "verdict": case["verdict"], "backend": case.get("backend"),
              "max_safe_tokens": case.get("max_safe_tokens"),
              "fraction": None if fraction is None else case.get(fraction),
              "max_safe_tokens_rederived": case.get("max_safe_tokens_rederived"),
              "max_safe_fraction": None if fraction is None else case.get(f"max_safe_{fraction}")}
             for case in result.cases]
    return {"engine": chosen.name, "kernel": kernel.name, "step_knob": chosen.step_knob_name,
            "step_tokens": budget.max_num_batched_tokens, "fraction_knob": fraction, "cases": cases}


def check_vllm_side(scenario: Scenario, requests: Sequence[PlanRequest],
                    kernel_name: str | None = None) -> None:
    """Refuse, before any plan, a scenario or max_num_tokens the vLLM side's model of the
    kernel's calls cannot run (heads per rank, head dims, tensors too large to exist)."""
    from mlamem.kernels import DEFAULT_KERNEL, load_kernel
    from mlamem.spec.scenario import check_decode, check_decode_tokens

    kernel = load_kernel(kernel_name or DEFAULT_KERNEL)()
    if "sparse-decode" not in kernel.operations:
        raise UserError(f"plan's vLLM side models the sparse decode; kernel {kernel.name} runs "
                        f"{', '.join(kernel.operations)}: pick a kernel that runs it "
                        "(`mlamem kernels`)", field="kernel")
    padded_heads = check_decode(scenario, kernel.capabilities().head_counts, kernel.label)
    for request in requests:
        given = request.max_num_tokens != scenario.serving.max_num_batched_tokens
        check_decode_tokens(scenario, padded_heads, [], max_tokens=request.max_num_tokens,
                            max_tokens_field="max_num_tokens" if given else None)


def plan_requests(scenario: Scenario, overrides: dict, sweep: str | None
                  ) -> tuple[str | None, list, list[PlanRequest]]:
    """The swept field, its values and one request per value (one request, [None], unswept),
    each checked: pure arithmetic, so the CLI calls it before torch loads."""
    swept, values = parse_sweep(sweep) if sweep else (None, [None])
    requests = [request_for(scenario, **(overrides if swept is None else {**overrides, swept: value}))
                for value in values]
    for request in requests:
        _check_topk(scenario, request, sweep if swept == "max_seq_len" else None,
                    given=overrides.get("max_seq_len") is not None)
    return swept, values, requests


def _check_topk(scenario: Scenario, request: PlanRequest, sweep: str | None,
                given: bool) -> None:
    """A sequence shorter than the top-k each query attends cannot hold the KV a sparse call
    gathers. `sweep` and `given` say where max_seq_len came from (else the scenario's
    max_model_len, which scenario.check_decode holds to it)."""
    topk = scenario.decode_topk
    if topk is None or request.max_seq_len >= topk or not (sweep or given):
        return  # the scenario's own max_model_len: check_decode says so, naming its fields
    where = f"--sweep {sweep}: " if sweep else ""
    raise UserError(f"{where}{request.max_seq_len} is below {scenario.name}'s top-k {topk}, "
                    "the tokens each query attends: a sequence that short cannot hold them; "
                    f"give {topk} or more", field=None if sweep else "max_seq_len")


def run_plan(scenario: Scenario, overrides: dict, sweep: str | None, *, command: str,
             kernel: str | None = None, engine: str | None = None) -> PlanFile:
    """The result `mlamem.plan/1`: one plan, or one per value of the swept variable.

    `overrides` are PlanRequest fields (None keeps the scenario's); `sweep` is 'NAME=V1,V2'.
    """
    swept, values, requests = plan_requests(scenario, overrides, sweep)
    if scenario.model.index_topk:
        check_vllm_side(scenario, requests, kernel)
    if engine is not None:  # before any work: the scenario must declare it, the engine take it
        from mlamem.commands.repro import scenario_engine
        scenario_engine(scenario, engine)
    tokens_given = swept == "max_num_tokens" or overrides.get("max_num_tokens") is not None
    plans = [make_plan(scenario, request, kernel, engine, tokens_given) for request in requests]
    from mlamem.results.plan import PlanFile  # pydantic: once a plan is made

    return PlanFile.model_validate({
        "schema": SCHEMA, "command": command,
        "scenario": {"name": scenario.name, "model": scenario.model.name,
                     "heads_per_rank": scenario.heads_per_rank,
                     "num_layers": scenario.model.num_layers,
                     "kv_cache_dtype": scenario.serving.kv_cache_dtype,
                     "kv_bytes_per_token_per_layer": scenario.kv_cache_bytes_per_token_per_layer,
                     "weights_note": scenario.parallel.weights_note},
        "sweep": None if swept is None else {"name": sweep.partition("=")[0].strip(),
                                             "values": values},
        "plans": plans,
    })


def parse_sweep(text: str) -> tuple[str, list]:
    """'max-seq-len=32768,131072' -> ('max_seq_len', [32768, 131072]); each value once."""
    name, sep, values = text.partition("=")
    name = name.strip()
    if not sep or name not in SWEEPABLE:
        raise UserError(f"{text!r}: write NAME=V1,V2,... with NAME one of: "
                        f"{', '.join(SWEEPABLE)}", field="sweep")
    field = SWEEPABLE[name]
    parse = {"gpu_memory_bytes": parse_bytes, "utilization": float,
             "free_fraction": float}.get(field, int)

    def one(item: str):
        try:
            return parse(item)
        except ValueError:
            raise UserError(f"{text!r}: {values!r} are not all valid values for {name}",
                            field="sweep") from None

    return field, parse_list(values, "sweep", one, label=lambda value: f"{name}={value}")
