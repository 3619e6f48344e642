"""The engines' spec modules: one per engine, without torch (`vllm.py`, `sglang.py`, `trtllm.py`).

An engine is two modules: its spec module here, holding its scenario table's class, its rules
per engine version (each citing the source line it follows), its serve-command parser and flag
table, and how its saved results read (its `View`), gathered in one `EngineSpec`; and its rank
module (`mlamem.engines.<name>`, with torch: the phases and the buffers), which the spec names
as an entry point. The engine registry (`mlamem.spec.engine_registry`) finds the specs; render and
the spec layer read saved results through them and import no rank module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

# A mlamem.spec.scenario.Scenario, which sits above the spec modules (it reads their tables): the
# type of the scenario their rules read.
AnyScenario = Any


class Verdict(StrEnum):
    """What happened to one case (the `verdict` field of mlamem.repro-oom/1)."""

    FITS = "fits"  # the full step ran; headroom_bytes is what was left under the cap
    OOM = "oom"  # an allocation failed: oom_* fields say which, and phase says when
    NO_KV_ROOM = "no-kv-room"  # init and profile leave nothing for the KV cache: no start
    ERROR = "error"  # a failure that is not an out-of-memory (failure says what)
    CRASHED = "crashed"  # the case's process died without a result (failure says how)


def charged_per_process(case: dict) -> bool:
    """Whether a measured case's non_torch_bytes is this process's own figure, not the
    device-wide fallback (NonTorchReading.charged_bytes)."""
    return case.get("non_torch_process_bytes") is not None


@dataclass(frozen=True)
class Column:
    """One column of an engine's result table: its header and its cell, from a case dict."""

    header: str
    cell: Callable[[dict], str]
    name: bool = False  # a name column: left-aligned and wrapped (figures: right, one line)


@dataclass(frozen=True)
class View:
    """How an engine's repro-oom result reads (mlamem/render/repro.py draws it from this)."""

    heading: str  # the Markdown section: "### {heading}: {scenario}"
    cases_named: str  # what its cases are, in messages: "--paths", "reserve variants"
    table_title: str  # after "mlamem repro-oom: ", of {scenario} and {predicted} (the tag)
    table_columns: tuple[Column, ...]  # the terminal table's, after the case key and verdict
    markdown_columns: tuple[Column, ...]  # the Markdown table's, after the case and verdict
    row_name: Callable[[dict], str]  # a case in the Markdown table and the table's notes
    case_label: Callable[[dict], str]  # a case in prose, e.g. "alloc path"
    verdict_in_notes: Callable[[dict], bool]  # whether the table's notes spell out its verdict
    budget_rule: Callable[[dict, list[dict]], str]  # which rule sized the KV cache, from the
    #                                                 budget and the cases
    # the memory-budget bars the report draws per case: (label, bytes, color key) from 0 up to
    # the cap, and what the full step needed on top (None: no figure); None: no budget plot
    budget_segments: Callable[[dict], list[tuple[str, int, str]]] | None = None
    step_need: Callable[[dict], int | None] | None = None
    step_tokens: str = "max_num_batched_tokens"  # the budget's step tokens, in the engine's words

    @property
    def budget_plot(self) -> bool:
        """Whether the report draws the memory-budget plot for this engine's cases."""
        return self.budget_segments is not None


@dataclass(frozen=True)
class EngineSpec:
    """One engine as the spec layer knows it: enough to validate its scenario table and to read
    its saved results, without torch. Its rank (an `mlamem.engines.base.Engine` subclass) is
    named as an entry point's value, "module:Class", which the registry loads on demand."""

    name: str  # its name in the registry, the scenario's `engines` and --engine
    rank: str  # its rank class, "module:Class"
    view: View
    key_field: str  # the field that names a case among the engine's cases ("path", "variant")
    section: type | None = None  # its scenario table's class ([vllm]); None: it reads none
    reads_utilization: bool = True  # the budget's utilization is its knob (SGLang: no)
    searched_fraction: str | None = None  # a budget fraction repro-oom searches per case
    step_knob_name: str = "max_num_batched_tokens"  # its own name for the budget's step tokens
