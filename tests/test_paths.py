"""The two wrapper paths compute the same thing; the workspace path reuses reserved buffers."""

import torch

from mlamem import scenario
from mlamem.inputs import make_inputs
from mlamem.kernels import Reference
from mlamem.paths import DecodeCall, Workspace, alloc_path, workspace_path


def test_workspace_path_is_bit_identical_even_with_a_poisoned_workspace():
    """Padding heads are zeroed and real heads copied, so stale workspace bytes never leak."""
    glm = scenario.load("glm5-fp8-tp8")
    inputs = make_inputs(glm, 16, torch.device("cpu"), seed=3, invalid_fraction=0.2)
    call = DecodeCall(decode=Reference().decode, kv_cache=inputs.kv_cache,
                      indices=inputs.indices, sm_scale=glm.softmax_scale, d_v=glm.d_v,
                      padded_heads=64, takes_out=False)
    workspace = Workspace.reserve(32, 64, glm.d_qk, glm.d_v, torch.device("cpu"))
    workspace.padded_q.fill_(float("nan"))
    out_a, lse_a = alloc_path(inputs.q, call)
    out_w, lse_w = workspace_path(inputs.q, call, workspace)
    assert out_a.shape == (16, 8, 512) and lse_a.shape == (8, 16)
    assert torch.equal(out_a, out_w) and torch.equal(lse_a, lse_w)
    assert not torch.isnan(out_w).any()
    assert workspace.padded_q[:16, 8:].abs().sum() == 0  # only the padding heads were zeroed
    assert torch.isnan(workspace.padded_q[16:]).all()  # rows past T untouched


def test_inputs_are_valid_and_never_zero():
    """Synthetic inputs: random q, in-range indices (-1 only where asked), a non-zero cache."""
    glm = scenario.load("glm5-fp8-tp8")
    inputs = make_inputs(glm, 8, torch.device("cpu"), seed=0)
    pool = inputs.kv_cache.shape[0] * inputs.kv_cache.shape[1]
    assert inputs.q.shape == (8, 8, 576) and inputs.q.dtype == torch.bfloat16
    assert inputs.q.abs().sum() > 0 and inputs.kv_cache.sum() > 0
    assert inputs.indices.min() >= 0 and inputs.indices.max() < pool
    assert inputs.indices.shape == (1, 8, 2048)
    again = make_inputs(glm, 8, torch.device("cpu"), seed=0)
    assert torch.equal(again.q, inputs.q)  # same seed, same values: paths see the same inputs
