"""The cells and the budget bars vLLM's and SGLang's result tables share (their decode cases),
from a saved case dict."""

from __future__ import annotations

from mlamem.spec.units import gib


def gib_cell(value: int | None) -> str:
    return "n/a" if value is None else f"{gib(value):.3f}"


def failed_alloc_cell(case: dict) -> str:
    if case.get("oom_requested_bytes") is None:
        return ""
    return f"{case.get('oom_buffer') or '?'} {gib_cell(case['oom_requested_bytes'])}"


def kv_cell(case: dict) -> str:
    if case.get("kv_cache_bytes") is None:
        return "n/a"
    return f"{gib(case['kv_cache_bytes']):.3f} GiB ({case['kv_cache_tokens']} tokens)"


def safe_cell(case: dict) -> str:
    tokens = case.get("max_safe_tokens")
    return "n/a" if tokens is None else ("none" if tokens == 0 else str(tokens))


def gain_cell(case: dict) -> str:
    gain = case.get("out_staging_gain_bytes")
    return "-" if gain is None else f"+{gib(gain):.3f}"


def budget_segments(case: dict) -> list[tuple[str, int, str]]:
    """(label, bytes, color key) from 0 up to the cap: what the engine placed before the step."""
    init = case.get("init_bytes")
    if init is None:
        return []
    weights, workspace = case.get("weights_bytes") or 0, case.get("workspace_bytes") or 0
    kv = case.get("kv_cache_bytes") or 0
    segments = [("weights", weights, "weights")]
    if workspace:
        segments.append(("workspace", workspace, "workspace"))
    segments.append(("rest of init", init - weights - workspace, "init_rest"))
    segments.append(("KV cache", kv, "kv_cache"))
    if case.get("torch_limit_bytes") is not None:
        segments.append(("free under the cap", case["torch_limit_bytes"] - init - kv, "free"))
    return segments


def step_need_bytes(case: dict) -> int | None:
    """What the full step needed on top of init and the KV cache (OOM: at least this much)."""
    base = (case.get("init_bytes") or 0) + (case.get("kv_cache_bytes") or 0)
    if case["verdict"] == "fits" and case.get("step_peak_bytes") is not None:
        return case["step_peak_bytes"] - base
    if case["verdict"] == "oom" and case.get("free_bytes_at_oom") is not None and \
            case.get("oom_requested_bytes") is not None and case["phase"] == "step":
        reserved = case["torch_limit_bytes"] - case["free_bytes_at_oom"]
        return reserved - base + case["oom_requested_bytes"]
    return None
