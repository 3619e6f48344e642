"""A plug-in kernel: registered after the CLI was imported, it is a `--kernel` like the shipped
ones, and its predictions come from its own allocation spec (CPU)."""

from __future__ import annotations

import json

import pytest
import torch

from mlamem.cli import main
from mlamem.kernels import REGISTRY, BufferSpec, Capabilities, KernelEntry, SparseDecodeKernel
from mlamem.kernels.base import SPARSE_DECODE

SCRATCH = "toy_scratch"  # the toy's own temporary: only its allocation spec names it


class ToyKernel(SparseDecodeKernel):
    """A sparse decode that takes out, lse and an accumulator workspace, and allocates out,
    lse and a scratch buffer of 3 int32 per (token, head) when called without them."""

    name = "toy"
    label = "Toy"

    def unavailable_reason(self):
        return "a toy runs nowhere; it predicts"

    def version(self):
        return "toy 0.1"

    def capabilities(self, op=SPARSE_DECODE, kv_format=None):
        if op != SPARSE_DECODE:
            raise ValueError(f"{self.label} does not run {op}")
        return Capabilities(takes_out=True, takes_lse=True, takes_accum_workspace=True,
                            head_counts=(64, 128), source="the toy's own declaration")

    def decode(self, q, kv_cache, indices, *, sm_scale, d_v, out=None, lse=None,
               accum_workspace=None):
        raise NotImplementedError("a toy runs nowhere")

    def allocations(self, q_shape, d_v, sm_count):
        b, s_q, h_q, _ = q_shape
        return [BufferSpec("out", (b, s_q, h_q, d_v), torch.bfloat16, "returned"),
                BufferSpec("lse", (b, h_q, s_q), torch.float32, "returned"),
                BufferSpec(SCRATCH, (b, s_q, h_q, 3), torch.int32, "temporary")]

    def accum_workspace_numel(self, b, max_tokens, h_q, topk, d_v, sm_count):
        return b * max_tokens * h_q * 3


@pytest.fixture
def toy(monkeypatch):
    """The toy registered the way a plug-in registers: one REGISTRY entry, nothing imported."""
    monkeypatch.setitem(REGISTRY, "toy", KernelEntry(module=__name__, cls="ToyKernel",
                                                     help="a toy plug-in",
                                                     operations=("sparse-decode",)))


def test_profile_predicts_a_plugin_kernel_from_its_allocation_spec(toy, capsys):
    assert main(["profile", "--kernel", "toy", "--predict", "--format", "json",
                 "--tokens", "1024"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["kernel"]["name"] == "toy" and result["kernel"]["version"] == "toy 0.1"
    assert result["kernel"]["source"] == "the toy's own declaration"
    rows = {row["path"]: row for row in result["rows"]}
    assert list(rows) == ["alloc", "workspace", "workspace-full"]  # it takes all three
    heads, tokens = result["scenario"]["padded_heads"], 1024
    scratch = tokens * heads * 3 * 4
    buffers = {path: {b["name"]: b for b in row["buffers"]} for path, row in rows.items()}
    assert list(buffers["alloc"]) == ["padded_q", "out", "lse", SCRATCH]
    assert buffers["alloc"][SCRATCH]["allocated_by"] == "kernel"
    assert buffers["alloc"][SCRATCH]["requested_bytes"] == scratch
    assert list(buffers["workspace"]) == ["lse", SCRATCH]  # q and out staged
    assert buffers["workspace-full"] == {}  # the scratch is replaced by the accum workspace
    assert rows["workspace"]["peak_allocated_bytes"] == tokens * heads * 4 + scratch
    assert rows["workspace-full"]["peak_allocated_bytes"] == 0


def test_a_plugin_is_listed_and_suggested_for_workspace_full(toy, capsys):
    """`mlamem kernels` lists it; a kernel that cannot run workspace-full names it too."""
    assert main(["kernels"]) == 0
    listed = capsys.readouterr().out
    assert "toy  " in listed and "sparse-decode(out, lse, accum; h 64,128)  toy 0.1" in listed
    assert main(["profile", "--paths", "workspace-full", "--predict"]) == 2
    assert "--kernel toy" in capsys.readouterr().err


def test_an_unregistered_kernel_is_refused_listing_the_registry(toy, capsys):
    assert main(["profile", "--kernel", "toys", "--predict"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'toys' is not one of" in err and "'toy'" in err
