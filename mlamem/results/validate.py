"""`mlamem.validate/1`: the model of its files, and the objects only it holds."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from mlamem.results.base import Migrate, Model, ResultFile, no_second_copy
from mlamem.results.shared import (
    SPARSE_DECODE,
    CommandLine,
    Environment,
    MaybeBytes,
    _each,
    _filled,
    _with_environment,
)


class Comparison(Model):
    """One figure, predicted and measured, in bytes."""

    scenario: str = Field(description="the case: scenario name, T, path")
    tokens: int = Field(description="the case: scenario name, T, path")
    path: str = Field(description="the case: scenario name, T, path")
    item: str = Field(description="a buffer's name, or `total`")
    metric: str = Field(description="`allocated` or `reserved`")
    predicted: MaybeBytes = Field(
        description=(
            "the figure on the allocator model and on the GPU, in bytes (null where one side has no "
            "such buffer)"))
    measured: MaybeBytes = Field(
        description=(
            "the figure on the allocator model and on the GPU, in bytes (null where one side has no "
            "such buffer)"))
    difference: int | None = Field(description="measured − predicted, in bytes (null when either is null)")
    op: str = Field(description="the kernel operation (`tokens` is then T, requests or s_q)")
    predicted_frame: str | None = Field(
        None, description=(
            "the buffer's frame on the allocator model, `file:line function` (null for a total, "
            "where that side has no such buffer, and in older files)"))
    measured_frame: str | None = Field(
        None, description="the buffer's frame in the GPU's allocator trace, the same way")

    @property
    def agrees(self) -> bool:
        return self.difference == 0


def _legacy_validate(data: dict) -> dict:
    """Validate files from before operations (sparse decode), `environment`, `created`, `shard`."""
    data = _with_environment(_filled(data, {"environment": None, "created": None, "shard": None}))
    return {**data, "comparisons": _each(data.get("comparisons"), {"op": SPARSE_DECODE})}


class ValidateFile(ResultFile):
    """`mlamem validate --format json`: one comparison per (scenario, value, path, item, metric)."""

    MIGRATIONS: ClassVar[dict[int, Migrate]] = {1: _legacy_validate}

    schema_: Literal["mlamem.validate/1"] = Field(alias="schema", description="`mlamem.validate/1`")
    command: CommandLine = Field(description="the command line that made it")
    agrees: bool = Field(description="every figure equal, predicted and measured")
    comparisons: list[Comparison]
    environment: Environment | None
    created: str | None = Field(description="when it was made: UTC, ISO 8601 (absent in older files)")
    shard: str | None = Field(
        description=(
            "`\"I/N\"` when the file is shard I of N of a sweep (`--shard`; null when unsharded, absent "
            "in older files)"))

    @property
    def measured(self) -> bool:
        """Always: it compares measured figures with predicted ones."""
        return True

    @model_validator(mode="after")
    def _one_copy_of_each_total(self) -> ValidateFile:
        # a buffer's name may repeat (two allocations of one name); a case's total may not
        no_second_copy(self.comparisons, ("scenario", "op", "tokens", "path", "metric"),
                       "comparisons", only=lambda c: c.item == "total")
        return self


