"""`mlamem plan`: one plan as quantity/value rows, or a sweep as a table."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from rich.console import Group

from mlamem.render.common import (
    compact_table,
    console_text,
    count_text,
    engine_flag,
    limits_text,
    with_notes,
)
from mlamem.render.escape import escaped, markdown_code, markdown_row
from mlamem.render.ledger import commands_text, ledger_markdown, ledger_table
from mlamem.spec.units import format_bytes, gib

if TYPE_CHECKING:
    from mlamem.results.plan import EngineLimits, OnePlan, PlanFile, PlanScenario, Reserve


def _reserve_text(r: Reserve) -> str:
    if r.admission_cap_tokens is None:
        return f"none; pool {r.pool_tokens} tokens"
    clamped = ", clamped to budget·w/(k+w)" if r.clamped else ""
    return (f"{format_bytes(r.reserve_bytes)}{clamped}; admission cap "
            f"{r.admission_cap_tokens} tokens; pool {r.pool_tokens} tokens "
            f"({r.capacity_change_percent:+.1f}%)")


def budget_rule(plan: OnePlan) -> str:
    """How the KV budget was sized, with its figures: vLLM's rule or TRT-LLM's."""
    request, weights = plan.request, format_bytes(plan.weights_bytes)
    total = format_bytes(request["gpu_memory_bytes"])
    if request["utilization"] is not None:
        rule = (f"utilization {request['utilization']} x total {total} - weights {weights} "
                "(vLLM's rule")
    else:
        rule = (f"free_gpu_memory_fraction {request['free_fraction']} x (total {total} - "
                f"weights {weights}) (TRT-LLM's rule")
    return f"{format_bytes(plan.budget_bytes)} = {rule}; no profile peak, no non-torch memory)"


REPRO_RULE = ("utilization, as TRT-LLM's free_gpu_memory_fraction, x (total - non-torch - "
              "weights - profile peak), after a profile run: another budget, so other reserves")


def _indexer_part(plan: OnePlan, scenario: PlanScenario) -> str:
    """', + N B indexer keys' where k holds vLLM's DSA indexer cache beside the cell (per layer,
    or in all where only some layers hold an indexer)."""
    extra = plan.k_bytes_per_token - scenario.num_layers * scenario.kv_bytes_per_token_per_layer
    if extra % scenario.num_layers:
        return f" + {extra} B of indexer keys" if extra else ""
    return f" + {extra // scenario.num_layers} B indexer keys" if extra else ""


def plan_rows(plan: OnePlan, scenario: PlanScenario) -> list[tuple[str, str]]:
    """(quantity, value) lines of one plan, in reading order."""
    request = plan.request
    rows = [
        ("k: KV bytes per token", f"{plan.k_bytes_per_token} B ({scenario.num_layers} "
                                  f"layers x {scenario.kv_bytes_per_token_per_layer} B, "
                                  f"{scenario.kv_cache_dtype}"
                                  + _indexer_part(plan, scenario) + ")"),
        ("w: fp8 staging per attended token", f"{plan.w_bytes_per_token} B "
                                              f"({scenario.heads_per_rank} heads x "
                                              "(qk_nope + qk_rope + v_head) x 1 B)"),
        ("BF16 gather per attended token", f"{plan.gather_bytes_per_token} B (full_kv + "
                                           "full_k, not charged by the PR's reserve)"),
        ("KV budget", budget_rule(plan)),
        ("L_cap", f"{plan.kv_len_cap_tokens:,} tokens (min(max_batch_size "
                  f"{request['max_batch_size']}, max_num_tokens {request['max_num_tokens']}) x "
                  f"max_seq_len {request['max_seq_len']})"),
        ("reserve gate", plan.gate_reason),
        ("pool without reserve", f"{plan.pool_tokens_without_reserve} tokens"),
        ("fp8 reserve (the PR)", _reserve_text(plan.fp8_reserve)),
        ("everything charged (w + BF16)", _reserve_text(plan.full_reserve)),
    ]
    if plan.gate_on:
        rows.append(("repro-oom's KV budget", REPRO_RULE))
    vllm = plan.vllm
    if vllm:
        headroom = format_bytes(vllm.headroom_bytes)
        for path, need in vllm.per_call_need_bytes.items():
            fits = "fits" if vllm.per_call_fits[path] else "DOES NOT FIT"
            rows.append((f"vLLM mixed-batch call, {path} path ({vllm.kernel})",
                         f"{format_bytes(need)} at {vllm.max_num_batched_tokens} tokens "
                         f"(allocator model): {fits} the {headroom} headroom"))
        fits = "fits" if vllm.prefill_workspace_fits else "DOES NOT FIT"
        rows.append(("vLLM bf16 prefill workspace",
                     f"{format_bytes(vllm.prefill_workspace_bytes)} (5 x max_model_len x 576 "
                     f"x 2 B): {fits} the {headroom} headroom"))
    knobs = plan.engine_knobs
    if knobs and knobs.knobs:
        pool = format_bytes(knobs.pool_bytes)
        for knob in knobs.knobs:
            rows.append((f"same {pool} KV pool: {knob.engine}",
                         f"{knob.name} {knob.value:.3f} (of {knob.multiplies})"))
    return rows + _engine_rows(plan.engine_limits)


def _engine_rows(limits: EngineLimits | None) -> list[tuple[str, str]]:
    """`--engine`: one row per case, its largest safe knobs under the engine, as flags, each
    with the knob it holds with."""
    if not limits:
        return []
    rows = []
    for case in limits.cases:
        found = limits_text(limits.step_knob, limits.fraction_knob,
                            step_tokens=limits.step_tokens, fraction=case.fraction,
                            max_tokens=case.max_safe_tokens,
                            max_fraction=case.max_safe_fraction,
                            rederived=case.max_safe_tokens_rederived)
        at = f"{case.verdict} at {engine_flag(limits.step_knob)} {limits.step_tokens}"
        backend = f"; backend {case.backend}" if case.backend else ""
        rows.append((f"{limits.engine}: {case.case}",
                     "; ".join([t for t in (at, found) if t])
                     + f" (allocator model, {limits.kernel}{backend})"))
    return rows


def _sweep_columns(result: PlanFile) -> list[str]:
    """Column headings; a newline splits a two-line heading in the terminal table."""
    columns = ["L_cap", "pool\nw/o", "fp8\nGiB", "fp8\ncap", "fp8\nΔ", "full\nGiB",
               "full\ncap", "full\nΔ"]
    if result.plans[0].vllm:
        columns.append("prefill\nws")
    return columns


def _sweep_value(result: PlanFile, value) -> str:
    return format_bytes(value) if result.sweep.name == "gpu-memory" else str(value)


def _sweep_cells(plan: OnePlan, count=str) -> list[str]:
    """One sweep row: reserves in GiB, caps in tokens (`count` formats them), pool change in
    percent."""
    cells = [count(plan.kv_len_cap_tokens), count(plan.pool_tokens_without_reserve)]
    for r in (plan.fp8_reserve, plan.full_reserve):
        cells += [f"{gib(r.reserve_bytes):.3f}",
                  "-" if r.admission_cap_tokens is None else count(r.admission_cap_tokens),
                  f"{r.capacity_change_percent:+.1f}%"]
    if plan.vllm:
        v = plan.vllm
        cells.append(f"{gib(v.prefill_workspace_bytes):.2f}"
                     + ("" if v.prefill_workspace_fits else " NO"))
    return cells


_LEGEND = "GiB: reserve size; cap: admission cap in tokens; Δ: KV pool against no reserve"
_PREFILL_LEGEND = "prefill ws: vLLM bf16 prefill workspace, GiB (NO: over the headroom)"


def _sweep_notes(result: PlanFile) -> list[str]:
    """Under a sweep: the budget rule (of the first value), the gate and the legend."""
    first = result.plans[0]
    notes = [f"KV budget, first row: {budget_rule(first)}"]
    if first.gate_on:
        notes.append(f"repro-oom's KV budget: {REPRO_RULE}")
    legend = _LEGEND + (f"; {_PREFILL_LEGEND}" if first.vllm else "")
    engine = [f"{result.sweep.name}={_sweep_value(result, value)}, {name}: {text}"
              for value, plan in zip(result.sweep.values, result.plans, strict=True)
              for name, text in _engine_rows(plan.engine_limits)]
    return notes + [f"reserve gate {first.gate_reason}", legend, *engine]


def plan_table(result: PlanFile) -> Group:
    """One plan as quantity/value rows, or a sweep as one row per value, within 80 columns;
    token counts of 10 million and more are abbreviated (M, G: 10^6, 10^9)."""
    s = result.scenario
    title = f"mlamem plan: {escaped(s.name)}, one rank"
    if result.sweep is None:
        out = compact_table(title)
        out.show_header = False
        out.add_column("quantity", no_wrap=True)
        out.add_column("value")
        for name, value in plan_rows(result.plans[0], s):
            out.add_row(name, escaped(value))
        return with_notes(out, [escaped(f"Command: {result.command}")])
    out = compact_table(title)
    for name in (result.sweep.name, *_sweep_columns(result)):
        out.add_column(name, justify="right", no_wrap=True)
    for value, plan in zip(result.sweep.values, result.plans, strict=True):
        out.add_row(_sweep_value(result, value), *_sweep_cells(plan, count_text))
    notes = _sweep_notes(result)
    if any("G" in c or "M" in c for p in result.plans for c in _sweep_cells(p, count_text)[:2]):
        notes.insert(-1, "M, G, T: 10^6, 10^9, 10^12 tokens")
    return with_notes(out, [escaped(note) for note in [*notes, f"Command: {result.command}"]])


def plan_markdown(result: PlanFile) -> str:
    s = result.scenario
    lines = [f"### KV-cache plan: {escaped(s.name, markdown=True)}, one rank", ""]
    if result.sweep is None:
        lines += ["| quantity | value |", "|---|---|"]
        lines += [markdown_row(row) for row in plan_rows(result.plans[0], s)]
    else:
        columns = [result.sweep.name, *(c.replace("\n", " ") for c in _sweep_columns(result))]
        lines += [markdown_row(columns), "|---" * len(columns) + "|"]
        for value, plan in zip(result.sweep.values, result.plans, strict=True):
            lines.append(markdown_row([_sweep_value(result, value), *_sweep_cells(plan)]))
        lines += [""] + [f"- {escaped(note, markdown=True)}." for note in _sweep_notes(result)]
    lines += ["", f"- Command: {markdown_code(result.command)}"]
    if result.log is not None:
        lines += ["", ledger_markdown(result.log).rstrip("\n")]
    return "\n".join(lines) + "\n"


def plan_json(result: PlanFile) -> str:
    return json.dumps(result.file_dict(), indent=2) + "\n"


def plan_text(result: PlanFile) -> str:
    """The plan's table, then, with --log, the ledger and each command that fits unwrapped."""
    if result.log is None:
        return console_text(plan_table(result))
    return console_text(Group(plan_table(result), ledger_table(result.log))) + commands_text(result.log)


PLAN_FORMATS = {"table": plan_text, "markdown": plan_markdown,
                "json": plan_json}
