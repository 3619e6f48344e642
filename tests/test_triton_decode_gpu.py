"""The compiled Triton decode on the GPU: numerics against FlashMLA, every element written,
bit-identical across caller buffers, and FlashMLA's allocations (measured) in allocating mode."""

import json
import math
import subprocess
import sys

import pytest
import torch

from mlamem.commands.profile import run_profile
from mlamem.kernels import FlashMLA, TritonDecode, TritonNativeDecode
from mlamem.kernels.flashmla import flashmla_allocations
from mlamem.kernels.own.triton_decode import (
    accum_workspace_numel,
    max_accum_workspace_numel,
    sparse_mla_decode_triton,
    split_plan,
)
from mlamem.kernels.reference import sparse_mla_decode_reference
from mlamem.operations import Problem
from mlamem.operations.sparse_decode import run_kernel
from mlamem.runtime.measure import local_sm_count
from mlamem.spec import scenario
from mlamem.testing import needs_flashmla, random_decode_inputs, relative_l2

_reason = TritonDecode().unavailable_reason()
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(_reason is not None, reason=f"needs triton and CUDA: {_reason}")]
SM_SCALE = 1 / math.sqrt(576)


def random_inputs(s_q, h_q, topk, seed, invalid_fraction=0.2):
    """mlamem.testing's random decode inputs on the GPU: a pool of 4 x topk tokens."""
    return random_decode_inputs(s_q, h_q, topk, seed=seed, invalid_fraction=invalid_fraction,
                                device="cuda")


@needs_flashmla
@pytest.mark.parametrize("topk", [128, 2048])
@pytest.mark.parametrize("h_q", [64, 128])
@pytest.mark.parametrize("s_q", [1, 64, 4096])
def test_matches_flashmla(s_q, h_q, topk, seed):
    """out within 1e-2 relative L2 of FlashMLA's, lse within 2e-2 of FlashMLA's: FlashMLA's own
    lse was up to 6.3e-3 from the fp32 reference's on the H200 (this kernel's 3.8e-3), so a
    1e-3 bound failed on FlashMLA's error, not this kernel's (reports/triton-h200)."""
    q, kv, indices = random_inputs(s_q, h_q, topk, seed)
    out, lse = run_kernel(TritonDecode(), q, kv, indices, sm_scale=SM_SCALE, d_v=512)
    ref_out, ref_lse = run_kernel(FlashMLA(), q, kv, indices, sm_scale=SM_SCALE, d_v=512)
    assert relative_l2(out, ref_out) <= 1e-2, f"seed {seed}"
    torch.testing.assert_close(lse, ref_lse, rtol=0, atol=2e-2,
                               msg=lambda detail: f"{detail} (seed {seed})")


@pytest.mark.parametrize("s_q", [1, 2, 64, 300])
def test_matches_reference(s_q, seed):
    """Against the torch reference on queries with a valid index; the last query has none, and
    gets out exactly 0 and lse -inf (at s_q = 1 it is the only query, through the split)."""
    q, kv, indices = random_inputs(s_q, 64, 256, seed, invalid_fraction=0.4)
    indices[0, -1] = -1
    out, lse = sparse_mla_decode_triton(q, kv, indices, sm_scale=SM_SCALE)
    ref_out, ref_lse = sparse_mla_decode_reference(q, kv, indices, sm_scale=SM_SCALE, d_v=512)
    valid = (indices[0] >= 0).any(-1)  # (s_q,) queries with at least one valid index
    if valid.any():
        assert relative_l2(out[0, valid], ref_out[0, valid]) <= 1e-2, f"seed {seed}"
        torch.testing.assert_close(lse[0][:, valid], ref_lse[0][:, valid], rtol=0, atol=1e-2,
                                   msg=lambda detail: f"{detail} (seed {seed})")
    assert (out[0, ~valid] == 0).all(), f"seed {seed}"
    assert torch.isneginf(lse[0][:, ~valid]).all(), f"seed {seed}"


@pytest.mark.parametrize("s_q", [1, 64, 4096])
def test_every_element_written_and_buffers_change_nothing(s_q, seed):
    """Poisoned (NaN) out, lse and workspace are overwritten, with the allocating mode's bits."""
    q, kv, indices = random_inputs(s_q, 64, 2048, seed)
    allocated = sparse_mla_decode_triton(q, kv, indices, sm_scale=SM_SCALE)
    out = torch.full((1, s_q, 64, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full((1, 64, s_q), float("nan"), device="cuda")
    plan = split_plan(1, s_q, 64, 2048, local_sm_count())
    workspace = torch.full((accum_workspace_numel(1, s_q, 64, 512, plan) + 1,), float("nan"),
                           device="cuda")
    sparse_mla_decode_triton(q, kv, indices, sm_scale=SM_SCALE, out=out, lse=lse,
                             accum_workspace=workspace)
    assert not out.isnan().any() and not lse.isnan().any(), f"seed {seed}"
    assert torch.equal(out, allocated[0]) and torch.equal(lse, allocated[1])


def _allocations_in(call):
    """Sizes (bytes) of the allocator's alloc events while call() runs."""
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=100_000, clear_history=True)
    try:
        result = call()
        torch.cuda.synchronize()
    finally:
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
    events = snapshot["device_traces"][torch.cuda.current_device()]
    return result, [e["size"] for e in events if e["action"] == "alloc"]


@pytest.mark.parametrize("s_q", [1, 1024, 8192])
def test_allocations_are_flashmlas_or_none(s_q):
    """Allocating mode allocates FlashMLA's buffers in order; with every buffer passed, nothing."""
    q, kv, indices = random_inputs(s_q, 64, 2048, seed=0)
    sparse_mla_decode_triton(q, kv, indices, sm_scale=SM_SCALE)  # compile outside the trace
    _, sizes = _allocations_in(lambda: sparse_mla_decode_triton(q, kv, indices,
                                                                sm_scale=SM_SCALE))
    spec = flashmla_allocations(tuple(q.shape), 512, local_sm_count())
    assert sizes == [s.nbytes for s in spec]  # the trace records requested bytes
    out = torch.empty((1, s_q, 64, 512), dtype=torch.bfloat16, device="cuda")
    lse = torch.empty((1, 64, s_q), device="cuda")
    workspace = torch.empty(max_accum_workspace_numel(1, 64, 512, 2048, local_sm_count(), s_q),
                            device="cuda")
    _, sizes = _allocations_in(lambda: sparse_mla_decode_triton(
        q, kv, indices, sm_scale=SM_SCALE, out=out, lse=lse, accum_workspace=workspace))
    assert sizes == []


# Measured in a fresh process: reserved figures assume a cold allocator. In a full GPU run on
# the H200 this test measured 270532608 B reserved at T=1024 against 413138944 B predicted
# (and measured alone): most likely an earlier test left a live block in a cached segment.
_MEASURE = """
import json, sys
from mlamem.spec import scenario
from mlamem.kernels import FlashMLA, TritonDecode
from mlamem.runtime.measure import local_sm_count, measure_call
from mlamem.runtime.memory import CudaMemory, SimulatedMemory
path = sys.argv[1]
glm = scenario.load("glm5-fp8-tp8")
kwargs = {"sm_count": local_sm_count(), "max_tokens": glm.serving.max_num_batched_tokens}
rows = {}
for tokens in (1024, 8192):
    calls = {"triton": measure_call(CudaMemory(), glm, TritonDecode(), tokens, path, **kwargs),
             "predicted": measure_call(SimulatedMemory(), glm, TritonDecode(), tokens, path,
                                       **kwargs)}
    if path == "alloc":
        calls["flashmla"] = measure_call(CudaMemory(), glm, FlashMLA(), tokens, path, **kwargs)
    rows[tokens] = {name: [c.failure, c.peak_allocated_bytes, c.peak_reserved_bytes,
                           c.breakdown and c.breakdown.allocations] for name, c in calls.items()}
print(json.dumps(rows))
"""


@needs_flashmla
@pytest.mark.parametrize("path", ["alloc", "workspace", "workspace-full"])
def test_profile_columns_equal_flashmlas_and_the_prediction(path):
    """Measured peaks of the Triton kernel equal the model's predicted, and FlashMLA's measured
    on the alloc path; workspace-full allocates nothing inside the call (in a fresh process)."""
    done = subprocess.run([sys.executable, "-P", "-c", _MEASURE, path], capture_output=True,
                          text=True, timeout=300, check=True)
    for tokens, row in json.loads(done.stdout.splitlines()[-1]).items():
        failure, allocated, reserved, allocations = row["triton"]
        assert failure is None, (tokens, failure)
        assert [allocated, reserved] == row["predicted"][1:3], (tokens, row)
        if path == "alloc":
            assert allocated == row["flashmla"][1]
        if path == "workspace-full":
            assert allocations == 0 and allocated == 0


def test_three_paths_are_bit_identical_and_measured_as_predicted():
    """`profile --kernel triton` on the GPU: outputs equal across alloc, workspace and
    workspace-full, every byte as predicted."""
    glm = scenario.load("glm5-fp8-tp8")
    paths = ["alloc", "workspace", "workspace-full"]
    measured = run_profile(glm, [1024], paths, command="t", kernel=TritonDecode())
    predicted = run_profile(glm, [1024], paths, command="t", kernel=TritonDecode(), predict=True)
    assert measured.measured and all(r.failure is None for r in measured.rows)
    assert all(r.outputs_equal for r in measured.rows)
    assert ([r.peak_allocated_bytes for r in measured.rows]
            == [r.peak_allocated_bytes for r in predicted.rows])


# The native-head kernel (`triton-native`) on the GPU.

@needs_flashmla
@pytest.mark.parametrize("h_q", [8, 16, 32])
@pytest.mark.parametrize("s_q", [1, 64, 4096])
def test_native_heads_match_flashmlas_padded_call(s_q, h_q, seed, record_property):
    """At the rank's own heads, out within 1e-2 relative L2 and lse within 2e-2 of FlashMLA's
    call on q padded to 64 heads (its first h_q heads). Whether the native call also equals the
    padded Triton call bit for bit is recorded, not asserted: below 64 rows the compiler may
    pick other MMA instructions."""
    q, kv, indices = random_inputs(s_q, h_q, 2048, seed)
    out, lse = run_kernel(TritonNativeDecode(), q, kv, indices, sm_scale=SM_SCALE, d_v=512)
    padded_q = q.new_zeros((1, s_q, 64, 576))
    padded_q[:, :, :h_q] = q
    ref_out, ref_lse = run_kernel(FlashMLA(), padded_q, kv, indices, sm_scale=SM_SCALE, d_v=512)
    assert out.shape == (1, s_q, h_q, 512)
    assert relative_l2(out, ref_out[:, :, :h_q]) <= 1e-2, f"seed {seed}"
    torch.testing.assert_close(lse, ref_lse[:, :h_q], rtol=0, atol=2e-2,
                               msg=lambda detail: f"{detail} (seed {seed})")
    padded_out, padded_lse = run_kernel(TritonDecode(), padded_q, kv, indices, sm_scale=SM_SCALE,
                                        d_v=512)
    record_property("bit_identical_to_padded_triton",
                    torch.equal(out, padded_out[:, :, :h_q])
                    and torch.equal(lse, padded_lse[:, :h_q]))


@pytest.mark.parametrize("s_q", [1, 1024, 8192])
def test_native_allocations_are_its_spec_or_none(s_q):
    """At 8 heads: allocating mode allocates native_allocations' buffers (out and lse, the
    accumulators only for a call that can split); with every buffer passed, nothing."""
    q, kv, indices = random_inputs(s_q, 8, 2048, seed=0)
    kernel = TritonNativeDecode()
    run_kernel(kernel, q, kv, indices, sm_scale=SM_SCALE, d_v=512)  # compile outside the trace
    _, sizes = _allocations_in(lambda: run_kernel(kernel, q, kv, indices, sm_scale=SM_SCALE, d_v=512))
    problem = Problem("sparse-decode", rows=s_q, heads=8, sm_scale=SM_SCALE,
                      kv_tokens=kv.shape[0] * kv.shape[1], topk=2048, block_size=kv.shape[1])
    assert sizes == [s.nbytes for s in kernel.allocations(problem, local_sm_count())]
    out = torch.empty((1, s_q, 8, 512), dtype=torch.bfloat16, device="cuda")
    lse = torch.empty((1, 8, s_q), device="cuda")
    workspace = torch.empty(kernel.accum_numel(problem, local_sm_count()), device="cuda")
    _, sizes = _allocations_in(lambda: run_kernel(kernel, q, kv, indices, sm_scale=SM_SCALE,
                                                  d_v=512, out=out, lse=lse,
                                                  accum_workspace=workspace))
    assert sizes == []


_MEASURE_NATIVE = """
import json
from mlamem.spec import scenario
from mlamem.kernels import TritonNativeDecode
from mlamem.commands.profile import run_profile
rows = {}
for name in ("glm5-fp8-tp8", "deepseek-v32-fp8-tp8"):
    s = scenario.load(name)
    paths = ["alloc", "workspace", "workspace-full"]
    for predict in (False, True):
        result = run_profile(s, [1024, 8192], paths, command="t", kernel=TritonNativeDecode(),
                             predict=predict)
        rows[f"{name} {predict}"] = [[r.path, r.failure, r.outputs_equal, r.peak_allocated_bytes,
                                      r.peak_reserved_bytes, r.allocations_in_call,
                                      [b.name for b in r.buffers]] for r in result.rows]
print(json.dumps(rows))
"""


def test_native_profile_is_bit_identical_across_paths_and_measured_as_predicted():
    """`profile --kernel triton-native` at GLM-5 (8 heads) and DeepSeek-V3.2 (16 heads) TP8,
    T = 1024 and 8192, in a fresh process: no padded_q on any path, outputs equal across the
    three paths, and every peak (allocated, reserved) and buffer as predicted."""
    done = subprocess.run([sys.executable, "-P", "-c", _MEASURE_NATIVE], capture_output=True,
                          text=True, timeout=300, check=True)
    rows = json.loads(done.stdout.splitlines()[-1])
    for name in ("glm5-fp8-tp8", "deepseek-v32-fp8-tp8"):
        measured, predicted = rows[f"{name} False"], rows[f"{name} True"]
        for m, p in zip(measured, predicted, strict=True):
            assert m[1] is None and m[2], (name, m)
            assert "padded_q" not in m[6], (name, m)
            assert m[3:] == p[3:], (name, m, p)


# The default design, every design kept, and which one runs.

def _on_sm90():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Gluon kernel is written for SM90")


def test_the_gluon_kernel_runs_on_sm90_and_split_calls_fall_back():
    """On an SM90 GPU the default is the Gluon kernel in its gluon-bf16-scale design, with no
    fallback; a call that splits runs the Triton fallback of its head count, with its reason."""
    from mlamem.kernels.own.triton_sparse_decode import (
        DEFAULT_CONFIG,
        fallback_config,
        runnable_config,
    )

    _on_sm90()
    device = torch.device("cuda")
    assert DEFAULT_CONFIG.design == "gluon-bf16-scale"
    for heads in (8, 16, 64, 128):
        assert runnable_config(DEFAULT_CONFIG, heads, device, False) == (DEFAULT_CONFIG, None)
        config, reason = runnable_config(DEFAULT_CONFIG, heads, device, True)
        assert config == fallback_config(heads) and "split" in reason
    assert TritonNativeDecode().version().endswith("(gluon-bf16-scale)")
    assert TritonDecode().version().endswith("(gluon-bf16-scale)")


def _default_call(h_q, seed):
    """300 queries (no split on an H200) at h_q native heads in the default config, the last
    query without a valid index: (q, kv, indices, out, lse)."""
    from mlamem.kernels.own.triton_sparse_decode import DEFAULT_CONFIG, runnable_config

    _on_sm90()
    q, kv, indices = random_inputs(300, h_q, 2048, seed)
    indices[0, -1] = -1
    splits = split_plan(1, 300, h_q, 2048, local_sm_count(), DEFAULT_CONFIG.block_n).split
    assert runnable_config(DEFAULT_CONFIG, h_q, q.device, splits) == (DEFAULT_CONFIG, None)
    out, lse = sparse_mla_decode_triton(q, kv, indices, sm_scale=SM_SCALE, native=True)
    assert (out[0, -1] == 0).all() and torch.isneginf(lse[0, :, -1]).all()
    return q, kv, indices, out, lse


@needs_flashmla
@pytest.mark.parametrize("h_q", [8, 16, 64, 128])
def test_the_default_design_matches_flashmla(h_q, seed, record_property):
    """The default (gluon-bf16-scale) out within 1e-2 relative L2 and lse within 2e-2 of
    FlashMLA's (q padded to 64 heads below 64). It dequantizes as FlashMLA does, so its out is
    far closer than that (4.6e-5 relative L2 on the H200): recorded, not asserted."""
    q, kv, indices, out, lse = _default_call(h_q, seed)
    padded_q = q.new_zeros((1, 300, max(h_q, 64), 576))
    padded_q[:, :, :h_q] = q
    ref_out, ref_lse = run_kernel(FlashMLA(), padded_q, kv, indices, sm_scale=SM_SCALE, d_v=512)
    error = relative_l2(out[:, :-1], ref_out[:, :-1, :h_q])
    record_property("rel_l2_vs_flashmla", error)
    assert error <= 1e-2, f"seed {seed}"
    torch.testing.assert_close(lse[..., :-1], ref_lse[:, :h_q, :-1], rtol=0, atol=2e-2,
                               msg=lambda detail: f"{detail} (seed {seed})")


@pytest.mark.parametrize("h_q", [8, 16, 64, 128])
def test_the_default_design_matches_the_reference(h_q, seed):
    """The default against the fp32 torch reference on the queries with a valid index: out
    within 1e-2 relative L2, lse within 1e-2; the query with none gets out 0 and lse -inf."""
    q, kv, indices, out, lse = _default_call(h_q, seed)
    ref_out, ref_lse = sparse_mla_decode_reference(q, kv, indices, sm_scale=SM_SCALE, d_v=512)
    assert relative_l2(out[:, :-1], ref_out[:, :-1]) <= 1e-2, f"seed {seed}"
    torch.testing.assert_close(lse[..., :-1], ref_lse[..., :-1], rtol=0, atol=1e-2,
                               msg=lambda detail: f"{detail} (seed {seed})")


@needs_flashmla
@pytest.mark.parametrize("design", ["scaled", "folded-f16", "gluon-bf16-scale", "gluon"])
@pytest.mark.parametrize("h_q", [8, 16, 64, 128])
def test_every_design_matches_flashmla(design, h_q, seed):
    """Each design at 300 queries (no split on an H200) within 1e-2 relative L2 and 2e-2 in lse
    of FlashMLA (on q padded to 64 heads below 64), -inf and 0 where a query has no valid key,
    and the same bits whether out and lse are allocated or passed in."""
    from mlamem.kernels.own.triton_sparse_decode import LaunchConfig, runnable_config

    config = LaunchConfig(block_n=64, num_warps=8, design=design)
    assert runnable_config(config, h_q, torch.device("cuda"), False)[0] == config
    q, kv, indices = random_inputs(300, h_q, 2048, seed)
    indices[0, -1] = -1
    out, lse = sparse_mla_decode_triton(q, kv, indices, sm_scale=SM_SCALE, config=config,
                                        native=True)
    padded_q = q.new_zeros((1, 300, max(h_q, 64), 576))
    padded_q[:, :, :h_q] = q
    ref_out, ref_lse = run_kernel(FlashMLA(), padded_q, kv, indices, sm_scale=SM_SCALE, d_v=512)
    assert relative_l2(out[:, :-1], ref_out[:, :-1, :h_q]) <= 1e-2, f"seed {seed}"
    torch.testing.assert_close(lse[..., :-1], ref_lse[:, :h_q, :-1], rtol=0, atol=2e-2,
                               msg=lambda detail: f"{detail} (seed {seed})")
    assert (out[0, -1] == 0).all() and torch.isneginf(lse[0, :, -1]).all()
    given_out = torch.full_like(out, float("nan"))
    given_lse = torch.full_like(lse, float("nan"))
    sparse_mla_decode_triton(q, kv, indices, sm_scale=SM_SCALE, config=config, native=True,
                             out=given_out, lse=given_lse)
    assert torch.equal(given_out, out) and torch.equal(given_lse, lse)
