"""`mlamem repro-oom`: verdicts per path (or per context-reuse reserve variant)."""

from __future__ import annotations

import json

from rich.console import Group

from mlamem.context_reuse import VARIANT_LABELS
from mlamem.render.common import (
    compact_table,
    console_text,
    gib_text,
    predicted_tag,
    with_notes,
)
from mlamem.repro import ReproResult
from mlamem.units import format_bytes, gib


def _repro_label(result: ReproResult) -> str:
    env = result.environment
    if result.measured:
        return (f"measured on {env.gpu} (SM{env.compute_capability}), {result.kernel['label']}, "
                "each case in its own process")
    return (f"PREDICTED, not measured ({result.not_measured_reason}); allocator model + "
            f"{result.kernel['label']} allocation spec, {result.kernel['sm_count']} SMs")


def _budget_lines(result: ReproResult) -> list[str]:
    b, s = result.budget, result.scenario
    first = result.cases[0] if result.cases else {}
    gpu = (f"--gpu-memory; the scenario's GPU is {s['target_gpu']}"
           if "--gpu-memory" in result.command.split() or "--gpu-memory=" in result.command
           else f"{s['target_gpu']} memory")
    lines = [f"target: {format_bytes(b['gpu_memory_bytes'])} ({gpu}) at "
             f"utilization {b['utilization']} = {format_bytes(b['requested_bytes'])} for the "
             f"engine; max_num_batched_tokens {b['max_num_batched_tokens']}",
             f"weights {format_bytes(first.get('weights_bytes', 0))} per rank"
             + (f" ({s['weights_note']})" if s.get("weights_note") else "")]
    if first.get("non_torch_bytes") is not None:
        lines.append(f"non-torch memory (CUDA context, libraries): "
                     f"{format_bytes(first['non_torch_bytes'])}")
    return lines + [_budget_rule(result)]


def _budget_rule(result: ReproResult) -> str:
    """Which rule sized the KV cache (context reuse: the KV budget), with its figures."""
    b = result.budget
    if result.mode != "context-reuse":
        return (f"KV cache rule (vLLM's): utilization {b['utilization']} x total - (init + "
                "profile peak + non-torch), in whole blocks, after a profile pass that skips "
                "attention")
    figures = ""
    case = next((c for c in result.cases if c.get("budget_bytes") is not None), None)
    if case is not None:
        cap, weights, profile = (case["torch_limit_bytes"], case["weights_bytes"],
                                 case["profile_peak_bytes"])
        figures = f" = {format_bytes(case['budget_bytes'])}"
        if int(b["utilization"] * (cap - weights - profile)) == case["budget_bytes"]:
            figures = (f" = {b['utilization']} x ({format_bytes(cap)} - {format_bytes(weights)} "
                       f"- {format_bytes(profile)}){figures}")
    return (f"KV budget rule (TRT-LLM's): free_gpu_memory_fraction x (total - non-torch - "
            f"weights - profile peak){figures}; each variant's reserve comes out of it. "
            "`mlamem plan` charges neither the profile peak nor non-torch memory, so its "
            "reserves differ")


def case_label(case: dict) -> str:
    """'alloc path' for a decode case, the reserve variant's label for a context-reuse one."""
    return f"{case['path']} path" if case.get("path") else VARIANT_LABELS[case["variant"]]


def verdict_text(case: dict) -> str:
    """One line: what happened to this path."""
    verdict = case["verdict"]
    if verdict == "fits":
        return (f"fits: step peak {format_bytes(case['step_peak_bytes'])} under a "
                f"{format_bytes(case['torch_limit_bytes'])} cap, headroom "
                f"{format_bytes(case['headroom_bytes'])}")
    if verdict == "oom":
        size = case.get("oom_requested_bytes")
        what = case.get("oom_buffer") or "an unattributed allocation"
        text = f"OOM in {case['phase']}: {what}"
        if size is not None:
            text += f" ({format_bytes(size)}, by {case.get('oom_allocated_by') or 'unknown'})"
        if case.get("free_bytes_at_oom") is not None:
            text += f" with {format_bytes(case['free_bytes_at_oom'])} free under the cap"
        return text
    if verdict == "no-kv-room":
        return "does not start: " + case["failure"]
    return f"{verdict}: {case.get('failure')}"


def _kv(case: dict) -> str:
    if case.get("kv_cache_bytes") is None:
        return "n/a"
    return f"{gib(case['kv_cache_bytes']):.3f} GiB ({case['kv_cache_tokens']} tokens)"


def _safe(case: dict) -> str:
    tokens = case.get("max_safe_tokens")
    return "n/a" if tokens is None else ("none" if tokens == 0 else str(tokens))


def _gain(case: dict) -> str:
    gain = case.get("out_staging_gain_bytes")
    return "-" if gain is None else f"+{gib(gain):.3f}"


def _context_cells(c: dict) -> list[str]:
    """Reserve, admission, KV pool and step of one context-reuse variant."""
    cap = c.get("admission_cap_tokens")
    return ["-" if c.get("reserve_bytes") is None else format_bytes(c["reserve_bytes"]),
            "none" if cap is None else str(cap),
            "n/a" if c.get("kv_pool_tokens") is None else str(c["kv_pool_tokens"]),
            f"{len(c.get('admitted', []))} / {len(c.get('trimmed', []))}",
            "n/a" if c.get("attended_tokens") is None else str(c["attended_tokens"])]


_CONTEXT_COLUMNS = ("reserve", "admission cap", "KV pool tokens", "admitted / trimmed",
                    "attended KV")


def _context_table(result: ReproResult) -> Group:
    out = compact_table(f"mlamem repro-oom: {result.scenario['name']}, context-MLA reuse"
                        f"{predicted_tag(result.measured)}")
    for name in ("variant", "verdict", *_CONTEXT_COLUMNS):
        out.add_column(name.replace(" ", "\n", 1) if name not in ("variant", "verdict") else name,
                       justify="left" if name in ("variant", "verdict") else "right",
                       no_wrap=True)
    for c in result.cases:
        out.add_row(c["variant"], c["verdict"].upper() if c["verdict"] == "oom" else c["verdict"],
                    *_context_cells(c))
    return with_notes(out, [_repro_label(result), *_budget_lines(result),
                            *[f"{case_label(c)}: {verdict_text(c)}" for c in result.cases],
                            *result.notes])


def _context_markdown(result: ReproResult) -> str:
    lines = [f"### Context-MLA reuse OOM: {result.scenario['name']}{predicted_tag(result.measured)}",
             "",
             f"{_repro_label(result)}.", ""]
    lines += [f"- {line}" for line in _budget_lines(result)] + [""]
    lines += ["| variant | verdict | " + " | ".join(_CONTEXT_COLUMNS) + " |",
              "|---|---|" + "---|" * len(_CONTEXT_COLUMNS)]
    for c in result.cases:
        lines.append(f"| {case_label(c)} | {verdict_text(c)} | "
                     + " | ".join(_context_cells(c)) + " |")
    lines += [""] + [f"- {note}" for note in result.notes]
    lines.append(f"- Command: `{result.command}`")
    return "\n".join(lines) + "\n"


def repro_table(result: ReproResult) -> Group:
    """One row per path: the verdict, the KV cache the engine chose, the largest safe T."""
    if result.mode == "context-reuse":
        return _context_table(result)
    caption = [_repro_label(result), *_budget_lines(result)]
    caption += [f"{c['path']}: {verdict_text(c)}" for c in result.cases
                if c["verdict"] not in ("fits", "oom") or c.get("oom_requested_bytes") is None
                and c["verdict"] == "oom"]
    caption += [f"largest safe T ({c['path']}): {c.get('max_safe_method')}"
                for c in result.cases]
    caption += result.notes
    out = compact_table(f"mlamem repro-oom: {result.scenario['name']}"
                        f"{predicted_tag(result.measured)}; GiB")
    for name in ("path", "verdict", "failed\nalloc", "free at\nOOM", "KV\ncache", "head-\nroom",
                 "+if out\nstaged", "max\nsafe T"):
        left = name in ("path", "verdict", "failed\nalloc")
        out.add_column(name, justify="left" if left else "right",
                       no_wrap=name != "failed\nalloc", overflow="fold")
    for c in result.cases:
        out.add_row(c["path"], c["verdict"].upper() if c["verdict"] == "oom" else c["verdict"],
                    "" if c.get("oom_requested_bytes") is None
                    else f"{c.get('oom_buffer') or '?'} {gib_text(c['oom_requested_bytes'])}",
                    gib_text(c.get("free_bytes_at_oom")) if c["verdict"] == "oom" else "",
                    "n/a" if c.get("kv_cache_bytes") is None else gib_text(c["kv_cache_bytes"]),
                    gib_text(c.get("headroom_bytes")) if c["verdict"] == "fits" else "",
                    _gain(c), _safe(c))
    return with_notes(out, caption)


def repro_markdown(result: ReproResult) -> str:
    """The reproduction as a PR section: budget, one row per path, how the limit was found."""
    if result.mode == "context-reuse":
        return _context_markdown(result)
    lines = [f"### Runtime OOM reproduction: {result.scenario['name']}{predicted_tag(result.measured)}",
             "",
             f"{_repro_label(result)}.", ""]
    lines += [f"- {line}" for line in _budget_lines(result)] + [""]
    lines += ["| path | verdict | KV cache | headroom | + if out staged | largest safe "
              "max_num_batched_tokens |", "|---|---|---|---|---|---|"]
    for c in result.cases:
        headroom = f"{gib_text(c.get('headroom_bytes'))} GiB" if c["verdict"] == "fits" else "-"
        gain = _gain(c) + (" GiB" if c.get("out_staging_gain_bytes") is not None else "")
        lines.append(f"| {c['path']} | {verdict_text(c)} | {_kv(c)} | {headroom} | {gain} | "
                     f"{_safe(c)} |")
    lines += [""] + [f"- {c['path']}: largest safe max_num_batched_tokens by "
                     f"{c.get('max_safe_method')}" for c in result.cases]
    lines += [f"- {note}" for note in result.notes] + [f"- Command: `{result.command}`"]
    return "\n".join(lines) + "\n"


def repro_json(result: ReproResult) -> str:
    return json.dumps(result.to_dict(), indent=2) + "\n"


REPRO_FORMATS = {"table": lambda r: console_text(repro_table(r)), "markdown": repro_markdown,
                 "json": repro_json}


