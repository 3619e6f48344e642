"""`mlamem.diff/1`: the model of its files, and the objects only it holds."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from mlamem.results.base import Model, ResultFile
from mlamem.results.shared import CommandLine, MaybeBytes


class BufferChange(Model):
    """One named buffer (or, for snapshots, frame) in A and in B."""

    name: str = Field(
        description=(
            "the buffer's name (`padded_q`, `o_accum`, ...); between snapshots, an allocation of no "
            "MLA call found is named by its frame"))
    a_bytes: MaybeBytes = Field(
        description=(
            "its bytes in A (null: not in A): requested bytes in results; between snapshots, the "
            "blocks live at the peak (rounded to 512)"))
    b_bytes: MaybeBytes = Field(description="its bytes in B, the same figure (null: not in B)")
    change_bytes: int = Field(description="B − A, a missing side counting 0")


class DiffUnit(Model):
    """One case of A against its case in B: a profile's (scenario, T, path), a repro-oom case,
    a graphs capture, a snapshot's peak."""

    unit: str = Field(description="the case, as in A (or B where A lacks it)")
    a_label: str | None = Field(description="A's case (null: not in A)")
    b_label: str | None = Field(description="B's case (null: not in B)")
    a_peak_bytes: MaybeBytes = Field(
        description=(
            "A's peak: a profile's allocated peak, repro-oom's step peak, a capture's allocated "
            "peak, a snapshot's"))
    b_peak_bytes: MaybeBytes = Field(description="B's peak, the same figure")
    peak_change_bytes: int | None = Field(description="B − A (null where either is null)")
    buffers: list[BufferChange]


class EnvironmentChange(Model):
    """An environment field that differs, named as the gate names it."""

    name: str = Field(description="e.g. `kernel`, `measured`, `kernels.flashmla`, `torch`")
    a: str | int | None = Field(description="A's value")
    b: str | int | None = Field(description="B's value")
    blocking: bool = Field(description="the gate would refuse to compare across it")


class DiffFile(ResultFile):
    """`mlamem diff --format json`: two results of one kind, or two snapshots, compared."""

    schema_: Literal["mlamem.diff/1"] = Field(alias="schema", description="`mlamem.diff/1`")
    command: CommandLine = Field(description="the command line that made it")
    created: str = Field(description="when it was made: UTC, ISO 8601")
    kind: Literal["profile", "repro-oom", "graphs", "snapshot"] = Field(description="what A and B are")
    a: str = Field(description="file A")
    b: str = Field(description="file B")
    environment: list[EnvironmentChange]
    units: list[DiffUnit]
    peak_growth_bytes: int | None = Field(
        description="the largest peak change over the units (null: none paired)")
    fail_on_growth_bytes: MaybeBytes = Field(description="`--fail-on-growth` (null when not given)")
    failed: bool = Field(description="a peak grew by more than `fail_on_growth_bytes`")
