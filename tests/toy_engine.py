"""The toy engine's rank: its case and its phases; its spec (its `[toy]` table and its view) is
tests/toy_engine_spec.py, which names this rank. tests/test_toy_engine.py registers the spec by
an entry point and runs `mlamem repro-oom --engine toy --predict` on it.

Its rank: init places `init_mib`; the profile pass allocates `profile_mib` and frees it; the KV
cache is utilization x total - (init + profile peak + non-torch), in whole `block_mib` blocks;
the step allocates the case's step size (`small_step_mib` or `large_step_mib`) at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from toy_engine_spec import SPEC

from mlamem.engines.base import Case, Engine, NoKVRoom, Step
from mlamem.runtime.attribution import ExpectedBuffer

MiB = 1 << 20


@dataclass(kw_only=True)
class ToyCase(Case):
    key_field = "size"

    size: str  # "small" or "large": which step size the case runs
    kv_cache_bytes: int | None = None


class Toy(Engine):
    name, spec, view = SPEC.name, SPEC, SPEC.view
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
