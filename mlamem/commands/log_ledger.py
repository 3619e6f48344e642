"""`--log`: the user's server log beside mlamem's rank, the OOM it holds explained, and the serve
command that fits.

Every case is predicted on the allocator model (repro's `predict_case`) with the target GPU as
the physical device (the OOM message's total where it prints one). The user's server ran one
case (decode path): the one `--log-path` names, else the one the engine's release runs
(`ENGINE_RAN`). On that case, the memory the rank held beyond mlamem's model at the OOM is
mlamem's free memory at that request less the message's "X is free": where the model runs out
at the same request, its free memory then; where it fits, the largest memory held beside the
rank at which it still fits (repro's `largest_fitting`) plus the request. That one figure is
then held, on every case, on the physical device beside the rank (the host setup's
`held_bytes`, as memory another rank or process holds): outside vLLM's budget, which its total
sets, and in SGLang's reading of the free memory its pool is sized from; and repro's own
searches give each case's largest safe step tokens and fraction.
Without an OOM message, the engine's reading of the device's free memory at startup (vLLM's
init snapshot, SGLang's before the weights: STARTUP_FREE) gives that figure instead: what the
device used then beyond mlamem's one-process rank. Without a log of the user's, a public startup
line of a TP rank of the nearest layout stands in (spec/engines/rank_startup.py), read the same
way.
"""

from __future__ import annotations

import dataclasses
import re

from mlamem.commands.repro import (
    largest_fitting,
    largest_safe_fraction,
    largest_safe_on_target,
    predict_case,
)
from mlamem.engines.base import Budget, Engine, Verdict
from mlamem.results.ledger import NOT_MODELLED, ServerLogLedger
from mlamem.runtime.non_torch import NonTorchSetup
from mlamem.spec.engines import sglang, vllm
from mlamem.spec.engines.rank_startup import StandIn
from mlamem.spec.errors import UserError
from mlamem.spec.scenario import Scenario
from mlamem.spec.serve_command import with_flag
from mlamem.spec.server_log import OutOfMemory, ServerLog

MiB, GiB = 2**20, 2**30
# runtime/allocator.py AllocatorOutOfMemory's message, in a predicted case's failure line
FREE_UNDER_LIMIT = re.compile(r"with (\d+) bytes free under the limit")
# the ledger's components: (name, the log's figure, the case's field, or the fields it sums)
COMPONENTS = (("weights", "weights", "weights_bytes"),
              ("non-torch", "non_torch", "non_torch_bytes"),
              # vLLM 0.27+ prints the two above as one figure, and the peak with the graph
              # estimate as another: each such row only where the log gives it
              ("weights + non-torch", "weights_and_non_torch", ("weights_bytes", "non_torch_bytes")),
              ("activation peak", "activation_peak", "profile_peak_bytes"),
              ("CUDA-graph estimate", "cuda_graphs_estimated", "graph_estimate_bytes"),
              ("activation peak + CUDA-graph estimate", "activation_peak_and_graph_estimate",
               ("profile_peak_bytes", "graph_estimate_bytes")),
              ("CUDA graphs", "cuda_graphs", "graph_pool_bytes"),
              ("KV cache", "kv_cache", "kv_cache_bytes"))
STEP_FLAGS = {"vllm": vllm.FIELD_FLAGS["max_num_batched_tokens"],
              "sglang": sglang.FIELD_FLAGS["max_num_batched_tokens"]}
BOTH, MLAMEM_ONLY = "log", "mlamem only"  # where the row's figures come from


@dataclasses.dataclass(frozen=True)
class Rank:
    """What predicts one rank: the engine, scenario, kernel, budget, host and SM count."""

    engine: type[Engine]
    scenario: Scenario
    kernel: object
    budget: Budget
    host: NonTorchSetup
    sm_count: int

    def holding(self, held_bytes: int) -> NonTorchSetup:
        """The host with `held_bytes` more held on its device by other ranks or processes."""
        return dataclasses.replace(self.host, held_bytes=self.host.held_bytes + held_bytes)

    def case(self, key: str, held_bytes: int = 0, budget: Budget | None = None) -> dict:
        return predict_case(self.engine, self.scenario, self.kernel, budget or self.budget, key,
                            self.holding(held_bytes), self.sm_count)


def same_size(a: int | None, b: int) -> bool:
    """Two sizes equal as torch's message prints them: two decimals of its unit."""
    unit = GiB if b >= GiB else MiB if b >= MiB else 1024
    return a is not None and abs(a - b) <= 0.006 * unit


# The case each emulated engine's release runs, where the user does not say (--log-path), and why
ENGINE_RAN = {  # each cites the release's wrapper: the function that pads q and calls the kernel
    "vllm": ("alloc", "vLLM 0.33.0's _fp8_flash_mla_kernel, v1/attention/backends/mla/"
             "flashmla_sparse.py: q padded by new_zeros, out allocated; PR #60220's staging is in "
             "no release"),
    "sglang": ("alloc", "SGLang 0.5.23's _forward_flashmla_kv, srt/layers/attention/"
               "dsa_backend.py: q padded by new_zeros, out allocated"),
    "trtllm-context-reuse": ("none", "TensorRT-LLM reserves nothing for the fp8 context-MLA "
                             "workspace: PR #16399's reserve is in no release"),
}


def ran_case(log: ServerLog, engine: type[Engine]) -> tuple[str, str]:
    """The case the user's server ran, on which the held memory is derived, and why."""
    if log.ran_path is None:
        return ENGINE_RAN.get(engine.name, (engine.case_keys(["alloc"])[0], "the first case"))
    if engine.case_keys([log.ran_path]) != [log.ran_path]:
        raise UserError(f"{log.ran_path}: engine {engine.name}'s cases are not decode paths; "
                        "leave the path out", field="log_path")
    return log.ran_path, "--log-path"


def log_ledger(log: ServerLog, rank: Rank, keys: list[str], serve: str | None,
               stand_in: StandIn | None = None) -> ServerLogLedger:
    """Each case of `keys` beside the log: its ledger and, where the log holds an OOM, the
    buffer that failed, the memory held beyond the model (derived once, on the case the user's
    server ran), and with it each case's largest safe values and the command that carries them.
    `stand_in`: the public startup record read as `log`, where the user gave none, and why it
    was chosen."""
    oom = log.ooms[0] if log.ooms else None
    total = oom.total_bytes if oom is not None and oom.total_bytes else rank.budget.gpu_memory_bytes
    rank = dataclasses.replace(rank, host=dataclasses.replace(
        rank.host, gpu_memory_bytes=total, assumed="the target GPU as the physical device"))
    notes = [f"mlamem's figures: each case predicted on the allocator model with a {total / GiB:.2f}"
             " GiB device as the physical one (the OOM message's total, else the target's)"]
    if stand_in is None and log.engine is not None and log.engine != rank.engine.name.split("-")[0]:
        notes.append(f"the log's lines are {log.engine}'s; mlamem emulates {rank.engine.name} "
                     "(--engine): the figures compare one engine's rank with another's")
    if log.version is not None:
        notes.append(f"the log names {log.engine} {log.version}; mlamem's rules are those of the "
                     "engine version its spec cites (mlamem/spec/engines/)")
    if len(log.ooms) > 1:
        notes.append(f"{len(log.ooms)} different OOM messages: the first (line "
                     f"{oom.line_number}) is explained")
    ran, reason = ran_case(log, rank.engine)
    held, held_source = None, None
    if oom is not None and oom.free_bytes is not None:
        free_at_request = _model_free_at(rank, ran, rank.case(ran), oom.requested_bytes)
        held = None if free_at_request is None else free_at_request - oom.free_bytes
        held_source = f"OOM line {oom.line_number}"
    elif oom is None and (startup := _held_at_startup(log, rank, stand_in)) is not None:
        held, held_source, line = startup
        context = (rank.host.context_bytes + rank.host.process_bytes) / GiB
        reading = (f"line {line}" if stand_in is None else
                   f"a public TP{stand_in.record.tensor_parallel} rank's, standing in for this "
                   f"rank's: {stand_in.record.describe()}; chosen as {stand_in.why}")
        notes.append(f"held beyond mlamem's model: the device's use at the engine's startup "
                     f"reading ({reading}) less what mlamem's one-process rank holds then (its "
                     f"CUDA context, {context:.3f} GiB): another rank's share of the host (NCCL, "
                     "all-reduce buffers) or another process, held for the whole run")
        if stand_in is not None:
            notes.append("no --log: give your server's log (its startup reading, or its OOM "
                         "message) for your rank's own figure")
    paths = [_path(log, rank, key, oom, serve, held, held_source, rows=stand_in is None)
             for key in keys]
    return ServerLogLedger(
        source=log.source, engine=log.engine, version=log.version, lines=log.lines,
        figures=[dataclasses.asdict(f) for f in log.figures],
        ooms=[{**dataclasses.asdict(o), "frames": list(o.frames)} for o in log.ooms],
        paths=paths, notes=notes, held_path=ran if oom is not None else None,
        held_path_reason=reason if oom is not None else None,
        stand_in=None if stand_in is None else stand_in.record.describe(),
        stand_in_address=None if stand_in is None else stand_in.record.address)


def _path(log: ServerLog, rank: Rank, key: str, oom: OutOfMemory | None, serve: str | None,
          held: int | None, held_source: str | None, rows: bool = True) -> dict:
    """One case's ledger: its rows (`rows`: the log's and mlamem's components, else only the
    held memory's, for a stand-in log that holds no figure of the user's rank) and, with the
    held memory, its verdict and largest safe values."""
    case = rank.case(key)
    tokens = rank.budget.max_num_batched_tokens
    rows = _rows(log, case, rank.budget.gpu_memory_bytes) if rows else []
    explained = {"failing_buffer": None, "failing_buffer_bytes": None, "held_bytes": None,
                 "verdict_with_log": None, "kv_cache_tokens_with_log": None,
                 "max_safe_tokens": None, "max_safe_fraction": None,
                 "fraction_knob": None, "command_that_fits": None}
    if held is not None:
        explained.update(_explain(rank, key, case, oom, serve, held))
        rows.append({"component": NOT_MODELLED, "log_bytes": None, "log_line": None,
                     "mlamem_bytes": None, "difference_bytes": held, "source": held_source})
    return {"case": key, "rows": rows, "step_tokens": tokens, **explained}


# the engines' figure of the device's free memory at startup, read before the model loads: vLLM
# 0.11+'s init snapshot (v1/worker/gpu_worker.py init_device, after
# init_worker_distributed_environment; its "Free memory on device (X/Y GiB) on startup"),
# SGLang's free memory after its distributed init ("Load weight begin. avail mem=X GB",
# model_runner.py load_model, the `pre` its pool is sized from)
STARTUP_FREE = {"vllm": "free_at_startup", "sglang": "avail_before_weights"}


def _held_at_startup(log: ServerLog, rank: Rank, stand_in: StandIn | None
                     ) -> tuple[int, str, int] | None:
    """What the log's rank held at its engine's startup reading (the log's engine's, else the
    emulated one's) beyond what mlamem's rank holds then (its context and the host's own), with
    the row's source and the line: None where the log has no such reading, or the rank held no
    more. The total is the line's, else the stand-in record's GPU's, else the target's."""
    free = log.first(STARTUP_FREE.get(log.engine or rank.engine.name.split("-")[0], ""))
    if free is None:
        return None
    total = next((f.value for f in log.figures if f.name == "total_gpu_memory"
                  and f.line_number == free.line_number),
                 rank.host.gpu_memory_bytes if stand_in is None else stand_in.record.total_bytes)
    held = int(total - free.value) - rank.host.context_bytes - rank.host.process_bytes
    source = (f"startup line {free.line_number}" if stand_in is None
              else f"a public TP{stand_in.record.tensor_parallel} rank's startup line")
    return (held, source, free.line_number) if held > 0 else None


# a figure some logs give only as a share of the total: vLLM's graph estimate, as its utilization
# less the equivalent without it
AS_SHARE = {"cuda_graphs_estimated": "cuda_graphs_estimated_share"}


def _figure(log: ServerLog, name: str, total_bytes: int) -> tuple[int, int] | None:
    """The log's figure `name` in bytes, and its line; where the log gives it only as a share of
    the total (AS_SHARE), that share of the target's total memory."""
    figure = log.first(name)
    if figure is not None:
        return int(figure.value), figure.line_number
    share = log.first(AS_SHARE[name]) if name in AS_SHARE else None
    return None if share is None else (round(share.value * total_bytes), share.line_number)


def _rows(log: ServerLog, case: dict, total_bytes: int) -> list[dict]:
    """The components the log and mlamem both know, then the step's buffers (mlamem only)."""
    rows = []
    for component, figure_name, field in COMPONENTS:
        figure, ours = _figure(log, figure_name, total_bytes), _case_bytes(case, field)
        if figure is None and (ours is None or not isinstance(field, str)):
            continue
        rows.append({"component": component,
                     "log_bytes": None if figure is None else figure[0],
                     "log_line": None if figure is None else figure[1],
                     "mlamem_bytes": ours,
                     "difference_bytes": (figure[0] - ours
                                          if figure is not None and ours is not None else None),
                     "source": BOTH if figure is not None else MLAMEM_ONLY})
    for buffer in case.get("buffers", []):
        rows.append({"component": f"step buffer {buffer['name']}", "log_bytes": None,
                     "log_line": None, "mlamem_bytes": buffer["requested_bytes"],
                     "difference_bytes": None, "source": MLAMEM_ONLY})
    if case.get("oom_buffer") and not case.get("buffers"):
        rows.append({"component": f"step buffer {case['oom_buffer']} (failed)", "log_bytes": None,
                     "log_line": None, "mlamem_bytes": case["oom_requested_bytes"],
                     "difference_bytes": None, "source": MLAMEM_ONLY})
    return rows


def _case_bytes(case: dict, field: str | tuple[str, ...]) -> int | None:
    """The case's figure for a component: its field, or the sum of its fields where it has all."""
    if isinstance(field, str):
        return case.get(field)
    parts = [case.get(name) for name in field]
    return None if None in parts else sum(parts)


def _explain(rank: Rank, key: str, case: dict, oom: OutOfMemory | None, serve: str | None,
             held: int) -> dict:
    """With the memory held beyond the model beside the rank: the failing buffer (where the log
    has an OOM), the verdict and the largest safe values."""
    with_log = rank.case(key, held)
    buffer = None if oom is None else (_buffer_of_size(case, oom.requested_bytes)
                                       or _buffer_of_size(with_log, oom.requested_bytes))
    engine, budget = rank.engine, rank.budget
    held_host = rank.holding(held)

    def predicted(k: str, at: Budget, host: NonTorchSetup) -> dict:
        return predict_case(engine, rank.scenario, rank.kernel, at, k, host, rank.sm_count)

    found = {"failing_buffer": buffer, "held_bytes": held,
             "failing_buffer_bytes": oom.requested_bytes if buffer else None,
             "verdict_with_log": with_log["verdict"],
             "kv_cache_tokens_with_log": with_log.get("kv_cache_tokens")}
    knob = engine.searched_knob
    if knob is not None:
        found["max_safe_tokens"] = largest_safe_on_target(
            key, engine.pinned(budget, with_log), knob, held_host, predicted, getattr(budget, knob))
        flag = STEP_FLAGS.get(engine.name)
        if serve is not None and flag is not None and found["max_safe_tokens"]:
            found["command_that_fits"] = with_flag(serve, flag, found["max_safe_tokens"])
    fraction = engine.searched_fraction or ("utilization" if engine.reads_utilization else None)
    if fraction is not None:
        safe = largest_safe_fraction(with_log, budget, fraction,
                                     lambda at: predicted(key, at, held_host)["verdict"])
        found["max_safe_fraction"], found["fraction_knob"] = safe[f"max_safe_{fraction}"], fraction
    return found


def _model_free_at(rank: Rank, key: str, case: dict, requested: int) -> int | None:
    """The free memory the model's device has when the step asks for `requested` bytes, as
    torch's message counts it (the allocator's unallocatable bytes included); None where the
    case neither fails at nor allocates a buffer of that size."""
    margin = rank.host.unallocatable_bytes
    if case["verdict"] == Verdict.OOM and same_size(case.get("oom_requested_bytes"), requested):
        # the allocator model's own figure: free under the binding limit (the cap, or the
        # physical device less its non-torch memory), where free_bytes_at_oom is the cap's
        model_free = FREE_UNDER_LIMIT.search(case.get("failure") or "")
        return (int(model_free[1]) if model_free else case["free_bytes_at_oom"] or 0) + margin
    if case["verdict"] != Verdict.FITS or _buffer_of_size(case, requested) is None:
        return None
    held_mib, _ = largest_fitting(
        lambda mib: rank.case(key, mib * MiB)["verdict"] == Verdict.FITS,
        max(case.get("headroom_bytes") or MiB, MiB) // MiB, cap=rank.host.gpu_memory_bytes // MiB)
    return held_mib * MiB + requested + margin


def _buffer_of_size(case: dict, size: int) -> str | None:
    """The case's step buffer of that size (as torch's message prints it), or its failed one."""
    if same_size(case.get("oom_requested_bytes"), size) and case.get("oom_buffer"):
        return case["oom_buffer"]
    return next((b["name"] for b in case.get("buffers", []) if same_size(b["requested_bytes"], size)),
                None)
