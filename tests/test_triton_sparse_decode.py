"""The Triton decode kernels under Triton's CPU interpreter, against the torch reference.

Tiny sizes, random inputs from a seed fixed per test (named in each failure message). Skipped
where triton is not installed (CI) and on a machine with a CUDA device, where
tests/test_triton_decode_gpu.py checks the compiled kernels instead: the interpreter is chosen when
triton's kernels are defined, so the two cannot share one process.
"""

import importlib.util
import math
import os
import sys

import pytest
import torch

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed (CI leaves it out); pip install triton to run these "
                "tests", allow_module_level=True)
if torch.cuda.is_available():
    pytest.skip("a CUDA device is present: tests/test_triton_decode_gpu.py checks the compiled kernels",
                allow_module_level=True)
if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("triton was imported before TRITON_INTERPRET=1 could be set; run "
                "TRITON_INTERPRET=1 pytest tests/test_triton_sparse_decode.py", allow_module_level=True)
os.environ["TRITON_INTERPRET"] = "1"  # read when triton is imported

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from mlamem.kernels.own.triton_decode import (  # noqa: E402
    accum_workspace_numel,
    sparse_mla_decode_triton,
    split_plan,
)
from mlamem.kernels.reference import sparse_mla_decode_reference  # noqa: E402
from mlamem.testing import random_decode_inputs, relative_l2  # noqa: E402


@triton.jit
def _runtime_loop(x_ptr, n):
    total = 0
    for _ in range(0, n):
        total += 1
    tl.store(x_ptr, total)


def _interpreter_runs_loops() -> str | None:
    """None, or why this triton/numpy pair cannot interpret a loop with a runtime bound."""
    try:
        _runtime_loop[(1,)](torch.zeros(1, dtype=torch.int32), 3)
    except Exception as exc:
        return (f"Triton {triton.__version__}'s interpreter cannot run runtime loops here "
                f"({exc}); numpy < 2.4 or a newer triton fixes it")
    return None


_loop_problem = _interpreter_runs_loops()
pytestmark = [
    pytest.mark.skipif(_loop_problem is not None, reason=_loop_problem or ""),
    pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning"),
]

POOL_TOKENS = 320  # 5 blocks of 64 tokens, drawn with replacement by topk up to 256
SM_SCALE = 1 / math.sqrt(576)
SPLIT_SM_COUNT, NO_SPLIT_SM_COUNT = 132, 1  # an H200's SMs split small calls; 1 SM never does
SPLIT_TOPK = 256  # two loop steps of the default block_n (128): the least that can split
# lse against the fp32 reference, relative and absolute: K rounded to bf16 after its scale moves
# lse by up to 3.4e-3 relative here (cache values x2) and 3.8e-3 absolute on the H200
LSE_TOLERANCE = {"rtol": 1e-2, "atol": 1e-2}


def random_inputs(s_q, h_q, topk, seed):
    """mlamem.testing's random decode inputs on the small pool, cache values x2; in a call of 3
    or more queries the last query has no valid index (out 0, lse -inf)."""
    q, kv, indices = random_decode_inputs(s_q, h_q, topk, seed=seed, pool_tokens=POOL_TOKENS,
                                          cache_scale=2.0)
    if s_q >= 3:
        indices[0, -1] = -1
    return q, kv, indices


@pytest.mark.parametrize(("s_q", "h_q", "topk"),
                         [(1, 64, 64), (1, 64, 256), (5, 64, 128), (5, 64, 256), (2, 128, 256)])
@pytest.mark.parametrize("sm_count", [SPLIT_SM_COUNT, NO_SPLIT_SM_COUNT])
def test_matches_reference(s_q, h_q, topk, sm_count, seed):
    """out within 1e-2 relative L2 of the fp32 reference, -inf and 0 where no key, and lse
    (natural log) within LSE_TOLERANCE: the kernel rounds each dequantized K value to bf16."""
    q, kv, indices = random_inputs(s_q, h_q, topk, seed)
    out, lse = sparse_mla_decode_triton(q, kv, indices, sm_scale=SM_SCALE, sm_count=sm_count)
    ref_out, ref_lse = sparse_mla_decode_reference(q, kv, indices, sm_scale=SM_SCALE, d_v=512)
    assert relative_l2(out, ref_out) <= 1e-2, f"seed {seed}"
    torch.testing.assert_close(lse, ref_lse, **LSE_TOLERANCE,
                               msg=lambda detail: f"{detail} (seed {seed})")
    no_keys = (indices[0] < 0).all(-1)  # (s_q,)
    assert torch.equal(out[0, no_keys], torch.zeros_like(out[0, no_keys]))


def test_split_runs_when_expected():
    """The parametrized cases above do cover both schemes."""
    assert split_plan(1, 5, 64, SPLIT_TOPK, SPLIT_SM_COUNT).split
    assert not split_plan(1, 5, 64, SPLIT_TOPK, NO_SPLIT_SM_COUNT).split


@pytest.mark.parametrize("s_q", [1, 5])
def test_every_element_written(s_q, seed):
    """out, lse and the workspace poisoned with NaN: every out and lse element is overwritten."""
    q, kv, indices = random_inputs(s_q, 64, SPLIT_TOPK, seed)
    plan = split_plan(1, s_q, 64, SPLIT_TOPK, SPLIT_SM_COUNT)
    assert plan.split
    out_slot = torch.full((8, 64, 512), float("nan"), dtype=torch.bfloat16)  # a workspace slot
    out = out_slot[:s_q].unsqueeze(0)
    lse = torch.full((1, 64, s_q), float("nan"))
    workspace = torch.full((accum_workspace_numel(1, s_q, 64, 512, plan) + 7,), float("nan"))
    got_out, got_lse = sparse_mla_decode_triton(q, kv, indices, sm_scale=SM_SCALE, out=out,
                                                lse=lse, accum_workspace=workspace,
                                                sm_count=SPLIT_SM_COUNT)
    assert got_out.data_ptr() == out.data_ptr() and got_lse.data_ptr() == lse.data_ptr()
    assert not out.isnan().any(), f"seed {seed}"
    assert not lse.isnan().any(), f"seed {seed}"
    assert out_slot[s_q:].isnan().all()  # nothing past the call's rows


@pytest.mark.parametrize("s_q", [1, 5])
def test_split_and_no_split_agree(s_q, seed):
    """The split-KV scheme with its combine gives the single-pass result, up to rounding."""
    q, kv, indices = random_inputs(s_q, 64, SPLIT_TOPK, seed)
    split = sparse_mla_decode_triton(q, kv, indices, sm_scale=SM_SCALE, sm_count=SPLIT_SM_COUNT)
    whole = sparse_mla_decode_triton(q, kv, indices, sm_scale=SM_SCALE,
                                     sm_count=NO_SPLIT_SM_COUNT)
    assert relative_l2(split[0], whole[0]) <= 5e-3, f"seed {seed}"
    torch.testing.assert_close(split[1], whole[1], rtol=1e-5, atol=1e-5, msg=f"seed {seed}")


def test_caller_buffers_give_bit_identical_results(seed):
    """Allocating mode and caller-provided out, lse and workspace give the same bits."""
    q, kv, indices = random_inputs(3, 64, SPLIT_TOPK, seed)
    plan = split_plan(1, 3, 64, SPLIT_TOPK, SPLIT_SM_COUNT)
    assert plan.split
    allocated = sparse_mla_decode_triton(q, kv, indices, sm_scale=SM_SCALE,
                                         sm_count=SPLIT_SM_COUNT)
    out, lse = torch.empty(1, 3, 64, 512, dtype=torch.bfloat16), torch.empty(1, 64, 3)
    workspace = torch.empty(accum_workspace_numel(1, 3, 64, 512, plan))
    staged = sparse_mla_decode_triton(q, kv, indices, sm_scale=SM_SCALE, out=out, lse=lse,
                                      accum_workspace=workspace, sm_count=SPLIT_SM_COUNT)
    assert torch.equal(allocated[0], staged[0]) and torch.equal(allocated[1], staged[1])


@pytest.mark.parametrize(("s_q", "h_q", "topk"), [(1, 8, 256), (5, 8, 256), (3, 16, 256),
                                                  (2, 32, 128), (2, 128, 256)])
@pytest.mark.parametrize("sm_count", [SPLIT_SM_COUNT, NO_SPLIT_SM_COUNT])
def test_native_heads_match_reference(s_q, h_q, topk, sm_count, seed):
    """The native-head kernel at the rank's own heads (8 and 16 padded to 16 rows in registers)
    is as close to the fp32 reference as the padded kernel."""
    q, kv, indices = random_inputs(s_q, h_q, topk, seed)
    out, lse = sparse_mla_decode_triton(q, kv, indices, sm_scale=SM_SCALE, sm_count=sm_count,
                                        native=True)
    ref_out, ref_lse = sparse_mla_decode_reference(q, kv, indices, sm_scale=SM_SCALE, d_v=512)
    assert out.shape == (1, s_q, h_q, 512)
    assert relative_l2(out, ref_out) <= 1e-2, f"seed {seed}"
    torch.testing.assert_close(lse, ref_lse, **LSE_TOLERANCE,
                               msg=lambda detail: f"{detail} (seed {seed})")


@pytest.mark.parametrize(("s_q", "h_q"), [(5, 8), (3, 16), (2, 32)])
@pytest.mark.parametrize("sm_count", [SPLIT_SM_COUNT, NO_SPLIT_SM_COUNT])
def test_native_heads_equal_the_padded_call(s_q, h_q, sm_count, seed):
    """Each head's row is computed alone: in one launch config (so one plan), the native call
    gives the padded call's first h_q heads up to fp32 summation order (numpy's matmul, which
    the interpreter's tl.dot runs, may sum a 16-row product in another order than a 64-row one:
    up to 6e-5 relative L2 and 1.5e-5 in lse seen; bit-equal at 32 heads)."""
    from mlamem.kernels.own.triton_sparse_decode import NATIVE_FALLBACK_CONFIG as config

    q, kv, indices = random_inputs(s_q, h_q, SPLIT_TOPK, seed)
    assert (split_plan(1, s_q, h_q, SPLIT_TOPK, sm_count, config.block_n)
            == split_plan(1, s_q, 64, SPLIT_TOPK, sm_count, config.block_n))
    out, lse = sparse_mla_decode_triton(q, kv, indices, sm_scale=SM_SCALE, sm_count=sm_count,
                                        native=True, config=config)
    padded_q = q.new_zeros((1, s_q, 64, 576))
    padded_q[:, :, :h_q] = q
    padded_out, padded_lse = sparse_mla_decode_triton(padded_q, kv, indices, sm_scale=SM_SCALE,
                                                      sm_count=sm_count, config=config)
    assert relative_l2(out, padded_out[:, :, :h_q]) <= 1e-4, f"seed {seed}"
    torch.testing.assert_close(lse, padded_lse[:, :h_q], rtol=0, atol=1e-4,
                               msg=lambda detail: f"{detail} (seed {seed})")


@pytest.mark.parametrize("sm_count", [SPLIT_SM_COUNT, NO_SPLIT_SM_COUNT])
def test_native_heads_write_their_rows_and_nothing_else(sm_count, seed):
    """At 8 heads (16 rows in registers) every out and lse element of the call is written and
    nothing past them: the workspace slot's next rows keep their NaN."""
    q, kv, indices = random_inputs(5, 8, SPLIT_TOPK, seed)
    out_slot = torch.full((8, 8, 512), float("nan"), dtype=torch.bfloat16)
    lse_slot = torch.full((8 * 8,), float("nan"))
    out, lse = out_slot[:5].unsqueeze(0), lse_slot[:8 * 5].view(1, 8, 5)
    plan = split_plan(1, 5, 8, SPLIT_TOPK, sm_count)
    workspace = torch.full((accum_workspace_numel(1, 5, 8, 512, plan) + 7,), float("nan"))
    sparse_mla_decode_triton(q, kv, indices, sm_scale=SM_SCALE, out=out, lse=lse,
                             accum_workspace=workspace, sm_count=sm_count, native=True)
    assert not out.isnan().any() and not lse.isnan().any(), f"seed {seed}"
    assert out_slot[5:].isnan().all() and lse_slot[8 * 5:].isnan().all()


@pytest.mark.parametrize("design", ["scaled", "folded-f16"])
@pytest.mark.parametrize(("s_q", "h_q", "sm_count"), [(5, 64, SPLIT_SM_COUNT), (3, 8, NO_SPLIT_SM_COUNT)])
def test_every_design_matches_reference(design, s_q, h_q, sm_count, seed):
    """Each Triton design at 64 heads (split) and 8 (no split, topk not a multiple of block_n):
    as close to the fp32 reference as the scaled one, -inf and 0 where no key. Folding the
    scales into p and the scores is exact in the dot inputs (only p times the scale is
    rounded), so the folded design is no further from the reference."""
    from mlamem.kernels.own.triton_sparse_decode import LaunchConfig

    config = LaunchConfig(block_n=64, num_warps=4, design=design)
    q, kv, indices = random_inputs(s_q, h_q, 160, seed)
    out, lse = sparse_mla_decode_triton(q, kv, indices, sm_scale=SM_SCALE, sm_count=sm_count,
                                        config=config, native=True)
    ref_out, ref_lse = sparse_mla_decode_reference(q, kv, indices, sm_scale=SM_SCALE, d_v=512)
    assert relative_l2(out, ref_out) <= 1e-2, f"seed {seed}"
    torch.testing.assert_close(lse, ref_lse, **LSE_TOLERANCE,
                               msg=lambda detail: f"{detail} (seed {seed})")
    no_keys = (indices[0] < 0).all(-1)
    assert torch.equal(out[0, no_keys], torch.zeros_like(out[0, no_keys]))
    assert torch.isneginf(lse[0][:, no_keys]).all()


def test_gluon_designs_fall_back_with_a_reason_here():
    """Where the Gluon kernel cannot run (here: Triton's interpreter) or the call splits, each
    Gluon design falls back to the Triton design of its head count, with a one-line reason; a
    Triton design runs as asked."""
    from mlamem.kernels.own.triton_sparse_decode import (
        DEFAULT_CONFIG,
        FALLBACK_CONFIG,
        GLUON_DESIGNS,
        NATIVE_FALLBACK_CONFIG,
        LaunchConfig,
        fallback_config,
        runnable_config,
    )

    assert DEFAULT_CONFIG.design == "gluon-bf16-scale"
    cpu = torch.device("cpu")
    for heads, fallback in ((8, NATIVE_FALLBACK_CONFIG), (16, NATIVE_FALLBACK_CONFIG),
                            (32, NATIVE_FALLBACK_CONFIG), (64, FALLBACK_CONFIG),
                            (128, FALLBACK_CONFIG)):
        assert fallback_config(heads) == fallback
        for design in GLUON_DESIGNS:
            for splits in (False, True):
                config, reason = runnable_config(LaunchConfig(64, 8, 1, design), heads, cpu, splits)
                assert config == fallback
                assert "CUDA GPU" in reason and "\n" not in reason
        assert runnable_config(fallback, heads, cpu, True) == (fallback, None)


def test_an_unknown_design_is_refused():
    """A design that is not kept (here: one removed) is refused, naming the designs there are."""
    from mlamem.kernels.own.triton_sparse_decode import LaunchConfig

    with pytest.raises(ValueError, match="design must be one of scaled, folded-f16, "
                                         "gluon-bf16-scale, gluon, got 'folded-bf16'"):
        LaunchConfig(design="folded-bf16")
