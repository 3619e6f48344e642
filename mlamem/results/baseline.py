"""`mlamem.baseline/1`: the model of its files, and the objects only it holds."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from mlamem.results.base import Migrate, Model, ResultFile, no_second_copy
from mlamem.results.legacy import KERNEL_BEFORE_FLAG
from mlamem.results.shared import (
    SPARSE_DECODE,
    Bytes,
    CommandLine,
    Environment,
    MaybeBytes,
    _each,
    _with_environment,
)


class Sweep(Model):
    """The sweep a baseline was made from, so a bare rerun repeats it."""

    scenarios: list[str] = Field(
        min_length=1,
        description="the scenarios as given (names or TOML paths): what a bare `mlamem gate` reruns")
    ops: list[str] = Field(
        description=(
            "the operations swept (`sparse-decode`, `dense-decode`, `sparse-prefill`), each scenario "
            "the ones it declares; absent in older baselines, which are `sparse-decode`"))
    tokens: list[int] = Field(
        description=(
            "the T (sparse decode) and s_q (sparse prefill) values asked for, each scenario running "
            "those its workspace holds (empty when neither operation is swept), and the paths"))
    requests: list[int] | None = Field(
        None, description=(
            "the b values of the dense decode (empty when it is not swept; absent in older baselines)"))
    paths: list[str] = Field(
        min_length=1, description=(
            "the T (sparse decode) and s_q (sparse prefill) values asked for, each scenario running "
            "those its workspace holds (empty when neither operation is swept), and the paths"))
    kernel: str = Field(
        description="the `--kernel` name (absent in older baselines, which are `flashmla`)")


class CaseFigures(Model):
    """The gated figures of one (scenario, op, swept value, path); null where the call failed."""

    scenario: str = Field(description="the case; `tokens` is the swept value: T, b or s_q")
    op: str = Field(
        description=(
            "its operation (absent in older baselines: `sparse-decode`); a case is (scenario, op, "
            "tokens, path)"))
    tokens: int = Field(description="the case; `tokens` is the swept value: T, b or s_q")
    requests: int | None = Field(
        None, description="the dense decode's b, = `tokens` (null for the other operations)")
    kv_tokens: int | None = Field(
        None, description=(
            "KV tokens each query saw: the sparse decode's pool, the dense decode's context length, the "
            "prefill's s_kv (absent in older baselines)"))
    path: str = Field(description="the case; `tokens` is the swept value: T, b or s_q")
    peak_allocated_bytes: MaybeBytes = Field(description="the call's allocated and reserved peaks")
    peak_reserved_bytes: MaybeBytes = Field(description="the call's allocated and reserved peaks")
    bytes_allocated_in_call: MaybeBytes = Field(description="requested bytes allocated inside the call")
    buffers: dict[str, Bytes] = Field(description="buffer name -> requested bytes")
    failure: str | None = Field(description="the failed call's error line (null unless it failed)")

    @property
    def key(self) -> tuple[str, str, int, str]:
        """(scenario, op, tokens, path): what names the case."""
        return self.scenario, self.op, self.tokens, self.path


def _legacy_baseline(data: dict) -> dict:
    """Baselines from before operations and --kernel: every case is sparse decode, by flashmla."""
    data = _with_environment(data)
    sweep = data.get("sweep")
    if isinstance(sweep, dict):  # added after its keys, so a file writes back as it was read
        added = {"ops": [SPARSE_DECODE], "kernel": KERNEL_BEFORE_FLAG}
        data = {**data, "sweep": {**sweep, **{k: v for k, v in added.items() if k not in sweep}}}
    return {**data, "cases": _each(data.get("cases"), {"op": SPARSE_DECODE})}


class BaselineFile(ResultFile):
    """`mlamem gate --update`: a sweep's gated figures and where they were made."""

    MIGRATIONS: ClassVar[dict[int, Migrate]] = {1: _legacy_baseline}

    schema_: Literal["mlamem.baseline/1"] = Field(alias="schema", description="`mlamem.baseline/1`")
    command: CommandLine = Field(description="the command line that made it")
    measured: bool = Field(description="false when the figures are predicted")
    not_measured_reason: str | None = Field(description="why nothing was measured (null when measured)")
    environment: Environment
    sweep: Sweep
    cases: list[CaseFigures]

    @model_validator(mode="after")
    def _one_copy_of_each_case(self) -> BaselineFile:
        no_second_copy(self.cases, ("scenario", "op", "tokens", "path"), "cases")
        return self


