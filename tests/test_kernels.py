"""The kernel interface (kernels/__init__.py, kernels/base.py): what a call allocates given the
buffers it is passed, and the simulated call on the meta device."""

import torch

from mlamem.kernels import TritonDecode
from mlamem.kernels.base import ACCUM_WORKSPACE, OpInputs, Problem, allocated_in_call, simulate_run
from mlamem.kernels.flashmla import flashmla_allocations

META = torch.device("meta")


def test_allocated_in_call_drops_what_is_passed():
    """A passed out or lse is not allocated; a passed accumulator workspace removes every temporary."""
    specs = flashmla_allocations((1, 8, 64, 576), 512, 132)
    names = [s.name for s in allocated_in_call(specs, ["out"])]
    assert names == ["lse", "scheduler_metadata", "num_splits", "lse_accum", "o_accum"]
    assert [s.name for s in allocated_in_call(specs, ["lse", ACCUM_WORKSPACE])] == ["out"]
    assert allocated_in_call(specs, ["out", "lse", ACCUM_WORKSPACE]) == []


def test_simulation_returns_the_passed_buffers():
    """simulate_run hands back the caller's out and lse instead of allocating them."""
    q = torch.empty((1, 4, 64, 576), dtype=torch.bfloat16, device=META)
    out = torch.empty((1, 4, 64, 512), dtype=torch.bfloat16, device=META)
    lse = torch.empty((1, 64, 4), device=META)
    problem = Problem("sparse-decode", rows=4, heads=64, sm_scale=0.1, kv_tokens=8192, topk=2048)
    got = simulate_run(TritonDecode(), 132, problem, q, OpInputs(kv=None), out=out, lse=lse,
                       accum_workspace=torch.empty(8, device=META))
    assert got[0] is out and got[1] is lse
