"""The toy engine's spec module, without torch: its scenario table `[toy]` and how its saved
results read. tests/test_toy_engine.py registers it through an entry point of the group
`mlamem.engines` (`toy = toy_engine_spec:SPEC`); its rank is tests/toy_engine.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlamem.spec.engines import Column, EngineSpec, View
from mlamem.spec.sections import check_positive


@dataclass(frozen=True)
class ToySection:
    """The scenario's `[toy]` table; the step sizes are required."""

    small_step_mib: int
    large_step_mib: int
    init_mib: int = 512
    profile_mib: int = 256
    block_mib: int = 2

    def __post_init__(self) -> None:
        for name in ("small_step_mib", "large_step_mib", "init_mib", "profile_mib", "block_mib"):
            check_positive(self, "toy", name)


VIEW = View(
    heading="Toy engine",
    cases_named="step sizes",
    table_title="{scenario}, toy{predicted}",
    table_columns=(Column("KV", lambda c: str(c.get("kv_cache_bytes"))),),
    markdown_columns=(Column("KV cache bytes", lambda c: str(c.get("kv_cache_bytes"))),),
    row_name=lambda c: f"{c['size']} step",
    case_label=lambda c: f"{c['size']} step",
    verdict_in_notes=lambda c: False,
    budget_rule=lambda budget, cases: "KV cache rule (the toy's): utilization x total - (init + "
                                      "profile peak + non-torch), in whole blocks")

SPEC = EngineSpec(name="toy", rank="toy_engine:Toy", view=VIEW, key_field="size",
                  section=ToySection)
