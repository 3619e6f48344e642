"""Rendering results for people: rich tables, PR-style Markdown, JSON and CSV, one module per
command. No logic lives here; the library computes, these modules only format.

The names below load their module on first access (PEP 562), by a plain import each
(`_module`), so rendering a plan does not import the profiler, and with it torch.
"""

from types import ModuleType

_EXPORTS = {
    "common": ["csv_cell", "predicted_tag"],
    "compare": ["COMPARE_FORMATS", "compare_json", "compare_markdown", "compare_table",
                "compare_view"],
    "diff": ["DIFF_FORMATS", "diff_markdown"],
    "escape": ["escaped", "markdown_code", "markdown_row"],
    "explain": ["EXPLAIN_FORMATS", "explain_markdown"],
    "gate": ["baseline_json", "gate_markdown"],
    "graphs": ["GRAPHS_FORMATS", "error_percent_text", "estimate_of", "estimate_sources",
               "graphs_csv", "graphs_json", "graphs_markdown", "graphs_table"],
    "plan": ["PLAN_FORMATS", "plan_markdown", "plan_rows", "plan_table"],
    "profile": ["BREAKDOWN_FORMATS", "FORMATS", "breakdown_markdown", "breakdown_table",
                "markdown", "table", "to_csv", "to_json"],
    "ledger": ["commands_text", "ledger_markdown", "ledger_table"],
    "repro": ["REPRO_FORMATS", "case_label", "repro_markdown", "repro_table", "verdict_text"],
    "validate": ["VALIDATION_FORMATS", "validation_json", "validation_markdown",
                 "validation_rows", "validation_table", "validation_view"],
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}


def _module(name: str) -> ModuleType:
    """The render module `name`, imported now."""
    if name == "common":
        from mlamem.render import common as module
    elif name == "compare":
        from mlamem.render import compare as module
    elif name == "diff":
        from mlamem.render import diff as module
    elif name == "escape":
        from mlamem.render import escape as module
    elif name == "explain":
        from mlamem.render import explain as module
    elif name == "gate":
        from mlamem.render import gate as module
    elif name == "ledger":
        from mlamem.render import ledger as module
    elif name == "graphs":
        from mlamem.render import graphs as module
    elif name == "plan":
        from mlamem.render import plan as module
    elif name == "profile":
        from mlamem.render import profile as module
    elif name == "repro":
        from mlamem.render import repro as module
    else:
        from mlamem.render import validate as module
    return module


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_module(_MODULE_OF[name]), name)
    globals()[name] = value
    return value


__all__ = sorted(_MODULE_OF)
