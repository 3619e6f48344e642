"""`mlamem repro-oom`: verdicts per case (a path, a reserve variant, ...), in the columns the
result's engine declares (its spec's `view`, `mlamem.spec.engines`: no rank module)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from rich.console import Group

from mlamem.render.common import compact_table, console_text, limits_text, predicted_tag, with_notes
from mlamem.render.escape import escaped, markdown_code, markdown_row
from mlamem.render.ledger import commands_text, ledger_markdown, ledger_table
from mlamem.spec.engine_registry import engine_spec
from mlamem.spec.engines import View, charged_per_process
from mlamem.spec.units import format_bytes

if TYPE_CHECKING:
    from mlamem.results.repro import ReproFile


def _repro_label(result: ReproFile) -> str:
    env = result.environment
    if result.measured:
        return (f"measured on {env.gpu} (SM{env.compute_capability}), {result.kernel['label']}, "
                "each case in its own process")
    return (f"PREDICTED, not measured ({result.not_measured_reason}); allocator model + "
            f"{result.kernel['label']} allocation spec, {result.kernel['sm_count']} SMs")


def _budget_lines(result: ReproFile, markdown: bool = False) -> list[str]:
    """The budget's lines, the scenario's text in them escaped (the engine's rule is its own)."""
    b, s = result.budget, result.scenario
    first = result.cases[0] if result.cases else {}
    target, note = escaped(s["target_gpu"], markdown), escaped(s.get("weights_note"), markdown)
    gpu = (f"--gpu-memory; the scenario's GPU is {target}"
           if "scenario_gpu_memory_bytes" in b else f"{target} memory")
    engine = engine_spec(result.engine)
    share = (f" at utilization {b['utilization']} = {format_bytes(b['requested_bytes'])} for the "
             "engine" if engine.reads_utilization else "")
    lines = [f"target: {format_bytes(b['gpu_memory_bytes'])} ({gpu}){share}; "
             f"{engine.view.step_tokens} {b['max_num_batched_tokens']}",
             f"weights {format_bytes(first.get('weights_bytes', 0))} per rank"
             + (f" ({note})" if s.get("weights_note") else "")]
    if first.get("non_torch_bytes") is not None:
        lines.append(f"non-torch memory (CUDA context, libraries): "
                     f"{format_bytes(first['non_torch_bytes'])}{_charged_reading(first)}")
    return lines + [_budget_rule(result)]


def _charged_reading(case: dict) -> str:
    """Which NVML reading a measured case charged; '' where none was recorded (predicted,
    older files)."""
    if case.get("nvml_visibility") is None:
        return ""
    if charged_per_process(case):
        return ", this process's own NVML figure"
    return f", read device-wide: NVML gives no figure of this process's own ({case['nvml_visibility']})"


def _view(result: ReproFile) -> View:
    return engine_spec(result.engine).view


def _budget_rule(result: ReproFile) -> str:
    """Which rule sized the KV cache (context reuse: the KV budget), with its figures."""
    return _view(result).budget_rule(result.budget, result.cases)


def case_label(case: dict, engine: str) -> str:
    """A case in prose: 'alloc path' for vLLM, the reserve variant's label for context reuse."""
    return engine_spec(engine).view.case_label(case)


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
        where = "at CUDA-graph capture" if case["phase"] == "capture" else f"in {case['phase']}"
        text = f"OOM {where}: {what}"
        if size is not None:
            text += f" ({format_bytes(size)}, by {case.get('oom_allocated_by') or 'unknown'})"
        if case.get("free_bytes_at_oom") is not None:
            text += f" with {format_bytes(case['free_bytes_at_oom'])} free under the cap"
        return text
    if verdict == "no-kv-room":
        return "does not start: " + case["failure"]
    return f"{verdict}: {case.get('failure')}"


def _short_verdict(case: dict) -> str:
    return case["verdict"].upper() if case["verdict"] == "oom" else case["verdict"]


def repro_table(result: ReproFile) -> Group:
    """One row per case: its verdict, then the engine's columns (vLLM: the failed allocation,
    the KV cache the engine chose, the headroom, the largest safe T)."""
    engine = engine_spec(result.engine)
    view, key = engine.view, engine.key_field
    caption = [escaped(_repro_label(result)), *_budget_lines(result)]
    caption += [escaped(f"{view.row_name(c)}: {verdict_text(c)}") for c in result.cases
                if view.verdict_in_notes(c)]
    caption += map(escaped, [*_limits_lines(result), *result.notes])
    out = compact_table("mlamem repro-oom: " + view.table_title.format(
        scenario=escaped(result.scenario["name"]), predicted=predicted_tag(result.measured)))
    for name in (key, "verdict"):
        out.add_column(name, justify="left", no_wrap=True, overflow="fold")
    for column in view.table_columns:
        out.add_column(column.header, justify="left" if column.name else "right",
                       no_wrap=not column.name, overflow="fold")
    for c in result.cases:
        out.add_row(*map(escaped, (c[key], _short_verdict(c),
                                   *(column.cell(c) for column in view.table_columns))))
    if result.log is not None:
        return Group(with_notes(out, caption), ledger_table(result.log))
    return with_notes(out, caption)


def repro_markdown(result: ReproFile) -> str:
    """The reproduction as a PR section: budget, one row per case, how any limit was found."""
    engine = engine_spec(result.engine)
    view, key = engine.view, engine.key_field
    lines = [f"### {view.heading}: {escaped(result.scenario['name'], markdown=True)}"
             f"{predicted_tag(result.measured)}",
             "",
             f"{escaped(_repro_label(result), markdown=True)}.", ""]
    lines += [f"- {line}" for line in _budget_lines(result, markdown=True)] + [""]
    headers = [key, "verdict", *(column.header for column in view.markdown_columns)]
    lines += [markdown_row(headers), "|" + "---|" * len(headers)]
    for c in result.cases:
        lines.append(markdown_row([view.row_name(c), verdict_text(c),
                                   *(col.cell(c) for col in view.markdown_columns)]))
    lines += [""] + [f"- {escaped(line, markdown=True)}"
                     for line in [*_limits_lines(result), *result.notes]]
    lines.append(f"- Command: {markdown_code(result.command)}")
    if result.log is not None:
        lines += ["", ledger_markdown(result.log).rstrip("\n")]
    return "\n".join(lines) + "\n"


def _limits_lines(result: ReproFile) -> list[str]:
    """Per searched case, how its largest safe step tokens were found; with an engine's searched
    fraction (SGLang), each largest safe knob as a flag with the one it holds with."""
    engine = engine_spec(result.engine)
    key, fraction = engine.key_field, engine.searched_fraction
    lines = []
    for c in result.cases:
        if "max_safe_method" not in c:
            continue
        if fraction is None:
            lines.append(f"largest safe {engine.view.step_tokens} ({c[key]}): "
                         f"{c['max_safe_method']}")
            continue
        lines.append(f"{c[key]}: " + limits_text(
            engine.step_knob_name, fraction, step_tokens=c["max_num_batched_tokens"],
            fraction=c.get(fraction), max_tokens=c.get("max_safe_tokens"),
            max_fraction=c.get(f"max_safe_{fraction}"),
            rederived=c.get("max_safe_tokens_rederived")) + f" ({c['max_safe_method']})")
    return lines


def repro_json(result: ReproFile) -> str:
    return json.dumps(result.file_dict(), indent=2) + "\n"


def repro_text(result: ReproFile) -> str:
    """The table as text, then each command that fits on a line of its own (`--log`)."""
    return console_text(repro_table(result)) + (commands_text(result.log) if result.log else "")


REPRO_FORMATS = {"table": repro_text, "markdown": repro_markdown,
                 "json": repro_json}


