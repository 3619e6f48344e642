"""`mlamem.kernels/1`: the model of its files, and the objects only it holds."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from mlamem.results.base import Model, ResultFile


class KernelOperationListing(Model):
    """What a kernel's adapter declares for one operation."""

    op: str = Field(description="the operation, e.g. `sparse-decode`")
    takes: str | None = Field(
        description="what the caller may pass in: `out`, `out, lse, accum`, `nothing`, or per "
                    "cache format (`bf16: out, fp8: nothing`); null when the adapter could not say")
    head_counts: list[int] = Field(description="the query head counts it runs natively")
    assumed: bool = Field(
        description="true where the kernel's schema cannot be read here, so the adapter's "
                    "declared facts are shown (the table's `*`)")
    error: str | None = Field(description="the adapter's one line when it could not answer")


class KernelListing(Model):
    """One registered kernel."""

    name: str = Field(description="the `--kernel` name")
    label: str = Field(description="how reports name it")
    help: str = Field(description="the registry's one line")
    operations: list[KernelOperationListing] = Field(description="in the registry's order")
    version: str | None = Field(description="the installed build's version; null when absent")
    available: bool = Field(description="it runs here")
    reason: str | None = Field(description="why not, naming the fix; null when available")

    @property
    def operation_names(self) -> tuple[str, ...]:
        return tuple(o.op for o in self.operations)


class KernelsFile(ResultFile):
    """`mlamem kernels --format json`: every registered kernel, as the table lists it."""

    schema_: Literal["mlamem.kernels/1"] = Field(alias="schema", description="`mlamem.kernels/1`")
    kernels: list[KernelListing] = Field(description="every registered kernel, in registry order")
    warnings: list[str] = Field(
        description="the plug-in warnings (a plug-in refused its name, unreadable metadata)")


