"""`mlamem.compare/1`: the model of its files, and the objects only it holds."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from mlamem.results.base import Migrate, Model, ResultFile
from mlamem.results.shared import CommandLine, Environment, Kernel, _filled, _with_environment


class ReferenceDifference(Model):
    """One kernel's output against the torch reference (float32 math, bf16 out)."""

    out_max_abs: float = Field(description="largest |out - reference out|")
    out_rel_l2: float = Field(description="||out - reference|| / ||reference||")
    lse_max_abs: float = Field(description="largest |lse - reference lse| (natural log), over finite entries")


class CompareRow(Model):
    """One (value, path): the two kernels' outputs side by side."""

    tokens: int = Field(description="the swept value: T, requests (dense decode) or s_q")
    path: str = Field(description="the wrapper path both kernels ran")
    out_equal: bool = Field(description="out and lse bit-identical between the two kernels")
    lse_equal: bool = Field(description="out and lse bit-identical between the two kernels")
    out_max_diff: float = Field(description="the largest absolute difference (0 when equal)")
    lse_max_diff: float = Field(description="the largest absolute difference (0 when equal)")
    errors: dict[str, ReferenceDifference | None] = Field(description="kernel name -> vs the reference")


def _legacy_compare(data: dict) -> dict:
    """Compare files from before `notes`."""
    return _with_environment(_filled(data, {"notes": []}))


class CompareFile(ResultFile):
    """`mlamem compare --format json`: the same inputs through two kernels."""

    MIGRATIONS: ClassVar[dict[int, Migrate]] = {1: _legacy_compare}
    KEY_ORDER: ClassVar[tuple[str, ...]] = (
        "command", "op", "scenario", "kernels", "kv_tokens", "rows", "environment", "created",
        "schema")

    schema_: Literal["mlamem.compare/1"] = Field(alias="schema", description="`mlamem.compare/1`")
    command: CommandLine = Field(description="the command line that made it")
    op: str = Field(description="the operation compared: `sparse-decode`, `dense-decode` or `sparse-prefill`")
    scenario: str = Field(description="the scenario's name")
    kernels: list[Kernel]
    kv_tokens: int = Field(
        description=(
            "KV tokens each query sees (dense decode: the context; prefill: s_kv; sparse decode: the "
            "pool)"))
    rows: list[CompareRow]
    environment: Environment
    created: str = Field(description="when it was made: UTC, ISO 8601")
    notes: list[str] = Field(description="caveats, e.g. no reference run")

    @property
    def measured(self) -> bool:
        """Always: comparing runs both kernels on the GPU."""
        return True

    @property
    def all_equal(self) -> bool:
        return all(r.out_equal and r.lse_equal for r in self.rows)
