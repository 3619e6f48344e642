"""`mlamem.bench/2`: the model of its files, and the objects only it holds."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from mlamem.results.base import Model, ResultFile
from mlamem.results.shared import Bytes


class BenchEnvironment(Model):
    gpu: str = Field(description="the GPU and its SMs")
    sm_count: int = Field(description="the GPU and its SMs")
    torch: str = Field(description="the versions timed")
    triton: str | None = Field(description="the versions timed")
    flash_mla: str | None = Field(description="the versions timed")


class BenchRow(Model):
    """One call timed (part 1: 64 heads from each KV pool; part 2, `rank_rows`: a rank's heads)."""

    scenario: str | None = Field(
        None, description=(
            "the scenario whose per-rank heads these are: `glm5-fp8-tp8` (8) or `deepseek-v32-fp8-tp8` "
            "(16)"))
    kernel: str = Field(
        description=(
            "`FlashMLA`, or mlamem's kernel with its design and launch config, e.g. `mlamem "
            "gluon-bf16-scale block_n=64 warps=8 stages=1 (default)`"))
    tokens: int = Field(description="s_q")
    heads: int = Field(description="query heads of the call (64 in part 1)")
    pool: str = Field(
        description=(
            "the KV pool the indices point into: `l2` (4 x topk tokens, 5.4 MB) or `hbm` (4 GiB), and "
            "its tokens"))
    pool_tokens: int = Field(
        description=(
            "the KV pool the indices point into: `l2` (4 x topk tokens, 5.4 MB) or `hbm` (4 GiB), and "
            "its tokens"))
    ms: float = Field(description="median time per call (`triton.testing.do_bench`)")
    tflops: float = Field(
        description="attention FLOP/s, in TFLOP/s: 2 · s_q · heads · topk · (576 + 512) / time")
    gathered_tb_per_s: float = Field(description="gathered KV bytes per second, in TB/s")
    allocated_bytes: Bytes = Field(
        description=(
            "the allocator's peak during one call in allocating mode, above what was allocated before"))
    rel_l2_vs_flashmla: float | None = Field(
        None, description="out's relative L2 error against FlashMLA's (absent in FlashMLA's own row)")
    ratio_vs_flashmla: float | None = Field(
        None, description="TFLOP/s over FlashMLA's at the same s_q and pool")
    speedup_vs_flashmla_padded: float | None = Field(
        None, description=(
            "FlashMLA's padded call's time (pad included) over this call's: above 1, this call is "
            "faster"))


class LseRow(Model):
    """The largest absolute lse difference between each pair of one shape (`--lse`)."""

    tokens: int = Field(description="s_q of the compared call")
    heads: int = Field(description="its query heads")
    topk: int = Field(description="its sparse top-k")
    flashmla_vs_reference: float = Field(description="FlashMLA's lse against the fp32 computation")
    triton_vs_reference: float = Field(description="mlamem's kernel's lse against the fp32 computation")
    triton_vs_flashmla: float = Field(description="mlamem's kernel's lse against FlashMLA's")


class BenchFile(ResultFile):
    """`python3 benchmarks/triton_vs_flashmla.py --json FILE` (GPU only); version 1 files
    (reports/triton-h200) are the older shape: part 1 from the small pool only."""

    VERSION: ClassVar[int] = 2

    schema_: Literal["mlamem.bench/2"] = Field(alias="schema", description="`mlamem.bench/2`")
    topk: int = Field(description="the sparse top-k of every call")
    environment: BenchEnvironment
    rows: list[BenchRow]
    rank_rows: list[BenchRow]
    lse: list[LseRow]
