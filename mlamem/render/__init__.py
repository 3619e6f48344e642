"""Rendering results for people: rich tables, PR-style Markdown, JSON and CSV, one module per
command. No logic lives here; the library computes, these modules only format."""

from mlamem.render.common import predicted_tag
from mlamem.render.gate import gate_markdown
from mlamem.render.plan import PLAN_FORMATS, plan_markdown, plan_rows, plan_table
from mlamem.render.profile import (
    BREAKDOWN_FORMATS,
    FORMATS,
    breakdown_markdown,
    breakdown_table,
    markdown,
    table,
    to_csv,
    to_json,
)
from mlamem.render.repro import REPRO_FORMATS, case_label, repro_markdown, repro_table, verdict_text
from mlamem.render.validate import (
    VALIDATION_FORMATS,
    validation_json,
    validation_markdown,
    validation_rows,
    validation_table,
)

__all__ = ["BREAKDOWN_FORMATS", "FORMATS", "PLAN_FORMATS", "REPRO_FORMATS", "VALIDATION_FORMATS",
           "breakdown_markdown", "breakdown_table", "case_label", "gate_markdown", "markdown",
           "plan_markdown", "plan_rows", "plan_table", "predicted_tag", "repro_markdown",
           "repro_table", "table", "to_csv", "to_json", "validation_json",
           "validation_markdown", "validation_rows", "validation_table", "verdict_text"]
