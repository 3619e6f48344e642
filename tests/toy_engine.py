"""A toy engine, whole in one module: its scenario table `[toy]`, its case, its phases and its
view. tests/test_toy_engine.py registers it with one registry line and runs `mlamem repro-oom
--engine toy --predict` on it.

Its rank: init places `init_mib`; the profile pass allocates `profile_mib` and frees it; the KV
cache is utilization x total - (init + profile peak + non-torch), in whole `block_mib` blocks;
the step allocates the case's step size (`small_step_mib` or `large_step_mib`) at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mlamem.attribution import ExpectedBuffer
from mlamem.engines.base import Case, Column, Engine, NoKVRoom, Step, View
from mlamem.scenario import check_positive

MiB = 1 << 20


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


@dataclass(kw_only=True)
class ToyCase(Case):
    key_field = "size"

    size: str  # "small" or "large": which step size the case runs
    kv_cache_bytes: int | None = None


class Toy(Engine):
    name = "toy"
    case_type = ToyCase

    @classmethod
    def case_keys(cls, paths: list[str]) -> list[str]:
        return ["small", "large"]

    @classmethod
    def new_case(cls, key: str, budget: dict, *, measured: bool, **fields) -> ToyCase:
        return ToyCase(size=key, measured=measured, **fields)

    def _bytes(self, name: str) -> int:
        return getattr(self.scenario.section("toy"), name) * MiB

    def init(self) -> None:
        self.allocating = "toy init"
        self.resident.append(torch.empty(self._bytes("init_mib"), dtype=torch.uint8,
                                         device=self.memory.device))

    def profile(self) -> None:
        self.allocating = "toy profile"
        torch.empty(self._bytes("profile_mib"), dtype=torch.uint8, device=self.memory.device)

    def size_kv_cache(self) -> int:
        case, block = self.case, self._bytes("block_mib")
        rest = self._bytes("init_mib") + case.profile_peak_bytes + case.non_torch_bytes
        case.kv_cache_bytes = max(self.budget.requested_bytes - rest, 0) // block * block
        if case.kv_cache_bytes == 0:
            raise NoKVRoom("init, profile and non-torch memory leave no KV cache")
        return case.kv_cache_bytes

    def step(self) -> Step:
        nbytes = self._bytes(f"{self.case.size}_step_mib")
        device = self.memory.device

        def body() -> None:
            torch.empty(nbytes, dtype=torch.uint8, device=device)

        return Step(body, [ExpectedBuffer("toy_step", nbytes, "engine")])


Toy.view = View(
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

ENGINE = Toy
