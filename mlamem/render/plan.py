"""`mlamem plan`: one plan as quantity/value rows, or a sweep as a table."""

from __future__ import annotations

import json

from rich import box
from rich.table import Table

from mlamem.render.common import console_text
from mlamem.units import format_bytes, gib


def _reserve_text(r: dict) -> str:
    if r["admission_cap_tokens"] is None:
        return f"none; pool {r['pool_tokens']} tokens"
    clamped = ", clamped to budget·w/(k+w)" if r["clamped"] else ""
    return (f"{format_bytes(r['reserve_bytes'])}{clamped}; admission cap "
            f"{r['admission_cap_tokens']} tokens; pool {r['pool_tokens']} tokens "
            f"({r['capacity_change_percent']:+.1f}%)")


def plan_rows(plan: dict, scenario: dict) -> list[tuple[str, str]]:
    """(quantity, value) lines of one plan, in reading order."""
    request = plan["request"]
    budget_rule = (f"utilization {request['utilization']} x total - weights"
                   if request["utilization"] is not None else
                   f"free fraction {request['free_fraction']} x (total - weights)")
    rows = [
        ("k: KV bytes per token", f"{plan['k_bytes_per_token']} B ({scenario['num_layers']} "
                                  f"layers x {scenario['kv_bytes_per_token_per_layer']} B, "
                                  f"{scenario['kv_cache_dtype']})"),
        ("w: fp8 staging per attended token", f"{plan['w_bytes_per_token']} B "
                                              f"({scenario['heads_per_rank']} heads x "
                                              "(qk_nope + qk_rope + v_head) x 1 B)"),
        ("BF16 gather per attended token", f"{plan['gather_bytes_per_token']} B (full_kv + "
                                           "full_k, not charged by the PR's reserve)"),
        ("KV budget", f"{format_bytes(plan['budget_bytes'])} ({budget_rule}; weights "
                      f"{format_bytes(plan['weights_bytes'])})"),
        ("L_cap", f"{plan['kv_len_cap_tokens']} tokens (min(max_batch_size "
                  f"{request['max_batch_size']}, max_num_tokens {request['max_num_tokens']}) x "
                  f"max_seq_len {request['max_seq_len']})"),
        ("reserve gate", plan["gate_reason"]),
        ("pool without reserve", f"{plan['pool_tokens_without_reserve']} tokens"),
        ("fp8 reserve (the PR)", _reserve_text(plan["fp8_reserve"])),
        ("everything charged (w + BF16)", _reserve_text(plan["full_reserve"])),
    ]
    vllm = plan.get("vllm")
    if vllm:
        headroom = format_bytes(vllm["headroom_bytes"])
        for path, need in vllm["per_call_need_bytes"].items():
            fits = "fits" if vllm["per_call_fits"][path] else "DOES NOT FIT"
            rows.append((f"vLLM mixed-batch call, {path} path",
                         f"{format_bytes(need)} at {vllm['max_num_batched_tokens']} tokens "
                         f"(allocator model): {fits} the {headroom} headroom"))
        fits = "fits" if vllm["prefill_workspace_fits"] else "DOES NOT FIT"
        rows.append(("vLLM bf16 prefill workspace",
                     f"{format_bytes(vllm['prefill_workspace_bytes'])} (5 x max_model_len x 576 "
                     f"x 2 B): {fits} the {headroom} headroom"))
    return rows


def _sweep_columns(result: dict) -> list[str]:
    columns = ["L_cap", "pool w/o", "fp8 GiB", "fp8 cap", "fp8 Δ", "full GiB", "full cap",
               "full Δ"]
    if result["plans"][0].get("vllm"):
        columns.append("prefill ws")
    return columns


def _sweep_cells(plan: dict) -> list[str]:
    """One sweep row: reserves in GiB, caps in tokens, pool change in percent."""
    cells = [str(plan["kv_len_cap_tokens"]), str(plan["pool_tokens_without_reserve"])]
    for key in ("fp8_reserve", "full_reserve"):
        r = plan[key]
        cells += [f"{gib(r['reserve_bytes']):.3f}", str(r["admission_cap_tokens"] or "-"),
                  f"{r['capacity_change_percent']:+.1f}%"]
    if plan.get("vllm"):
        v = plan["vllm"]
        cells.append(f"{gib(v['prefill_workspace_bytes']):.2f}"
                     + ("" if v["prefill_workspace_fits"] else " NO"))
    return cells


def plan_table(result: dict) -> Table:
    s = result["scenario"]
    title = f"mlamem plan: {s['name']}, one rank"
    if result["sweep"] is None:
        out = Table(title=title, box=box.SIMPLE_HEAD, show_header=False, pad_edge=False,
                    caption=f"Command: {result['command']}", caption_justify="left")
        out.add_column("quantity", no_wrap=True)
        out.add_column("value")
        for name, value in plan_rows(result["plans"][0], s):
            out.add_row(name, value)
        return out
    out = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1, 0, 0),
                caption="\n".join([f"reserve gate {result['plans'][0]['gate_reason']}",
                                   "GiB: reserve size; cap: admission cap in tokens; Δ: KV pool "
                                   "against no reserve; prefill ws: vLLM bf16 prefill workspace, "
                                   "GiB (NO: over the headroom)",
                                   f"Command: {result['command']}"]), caption_justify="left")
    for name in (result["sweep"]["name"], *_sweep_columns(result)):
        out.add_column(name, justify="right", no_wrap=True)
    for value, plan in zip(result["sweep"]["values"], result["plans"], strict=True):
        out.add_row(str(value), *_sweep_cells(plan))
    return out


def plan_markdown(result: dict) -> str:
    s = result["scenario"]
    lines = [f"### KV-cache plan: {s['name']}, one rank", ""]
    if result["sweep"] is None:
        lines += ["| quantity | value |", "|---|---|"]
        lines += [f"| {name} | {value} |" for name, value in plan_rows(result["plans"][0], s)]
    else:
        columns = [result["sweep"]["name"], *_sweep_columns(result)]
        lines += ["| " + " | ".join(columns) + " |", "|---" * len(columns) + "|"]
        for value, plan in zip(result["sweep"]["values"], result["plans"], strict=True):
            lines.append("| " + " | ".join([str(value), *_sweep_cells(plan)]) + " |")
        lines += ["", f"- Reserve gate {result['plans'][0]['gate_reason']}.",
                  "- GiB: reserve size; cap: admission cap in tokens; Δ: KV pool against no "
                  "reserve; prefill ws: vLLM bf16 prefill workspace in GiB."]
    lines += ["", f"- Command: `{result['command']}`"]
    return "\n".join(lines) + "\n"


PLAN_FORMATS = {"table": lambda r: console_text(plan_table(r)), "markdown": plan_markdown,
                "json": lambda r: json.dumps(r, indent=2) + "\n"}
