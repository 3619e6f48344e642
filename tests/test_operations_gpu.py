"""FlashMLA's three operations on the GPU, in both builds (sgl-flash-mla, vLLM's): predicted =
measured to the byte, paths bit-identical, outputs held to the torch reference, native head
counts as declared, and vLLM's `out_` writing into the caller's buffer.

Tolerances against the reference come from errors measured on an H200 with
`scripts/kernel_trace.py` (float32 reference, 2026-12-02), about 5x over:
- bf16 operations (dense decode over a bf16 cache, sparse prefill): out relative L2 0.0018 to
  0.0019, lse max abs 3e-6 to 5e-6 -> 0.01 and 1e-4;
- dense decode over an fp8 cache (fp8 q and KV, bf16 out): out relative L2 0.0137, lse max abs
  8.2e-4 there; 0.0163 and 2.9e-3 on mlamem's own fp8 inputs (`mlamem compare --op
  dense-decode -s kimi-k2-dense-fp8-tp4-dp`, reports/kernels-h200) -> 0.05 and 1e-2.
Across the two builds, sparse decode gives bit-identical out but lse differing in its last bits
(at most 9.5e-7 at T = 1024 to 32768, reports/kernels-h200/compare-sparse-decode.md).
"""

import pytest
import torch

from mlamem.commands.compare import run_compare
from mlamem.commands.profile import run_profile
from mlamem.commands.validate import run_validation
from mlamem.kernels import load_kernel
from mlamem.kernels.base import Problem, to_kernel_layout
from mlamem.kernels.flashmla import ALL_HEADS
from mlamem.spec import scenario
from mlamem.testing import check_bad_input, kernel_or_skip

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
BUILDS = ["flashmla", "flashmla-vllm"]
# (operation, scenario, two swept values)
CASES = [("dense-decode", "kimi-k2-dense-tp4-dp", (16, 256)),
         ("dense-decode", "kimi-k2-dense-fp8-tp4-dp", (16, 256)),
         ("sparse-prefill", "glm5-fp8-tp8", (1024, 8192)),
         ("sparse-prefill", "deepseek-v32-fp8-tp8", (2048,))]
TOLERANCE = {"bf16": (0.01, 1e-4), "fp8": (0.05, 1e-2)}  # out rel-L2, lse max abs
LSE_ULPS = 4e-6  # the builds' sparse decode lse: measured apart by at most 9.5e-7


kernel = kernel_or_skip


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize(("op", "name", "values"), CASES)
def test_prediction_equals_measurement(build, op, name, values):
    """Every buffer and the totals, allocated and reserved, predicted = measured on every path."""
    adapter = kernel(build)
    chosen = scenario.load(name)
    paths = ["alloc", "workspace"]
    comparisons = run_validation([(chosen, op, values)], paths, kernel=adapter)
    differing = [c for c in comparisons if not c.agrees]
    assert comparisons and not differing, differing[:5]


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize(("op", "name", "values"), CASES[:3])
def test_paths_are_bit_identical(build, op, name, values):
    """alloc and workspace give the same out and lse bits (measured)."""
    result = run_profile(scenario.load(name), values, ["alloc", "workspace"], command="test",
                         kernel=kernel(build), op=op)
    assert result.measured and all(row.outputs_equal for row in result.rows)


@pytest.mark.parametrize(("op", "name", "values"), CASES[:3])
def test_both_builds_within_tolerance_of_the_reference(op, name, values):
    """Each build's out and lse are within the measured-error tolerances of the reference."""
    chosen = scenario.load(name)
    cache = chosen.serving.kv_cache_dtype if op == "dense-decode" else "bf16"
    rel_l2, lse_abs = TOLERANCE[cache]
    result, _ = run_compare(chosen, op, values[:1], ["alloc"],
                         [kernel("flashmla"), kernel("flashmla-vllm")], command="test",
                         reference=load_kernel("reference")())
    for row in result.rows:
        for name_, error in row.errors.items():
            assert error.out_rel_l2 < rel_l2 and error.lse_max_abs < lse_abs, (name_, error)


def test_sparse_decode_builds_give_the_same_out():
    """sgl-flash-mla and vLLM's build give bit-identical sparse decode out on both paths, and
    lse within a few float32 ulps (they are not bit-identical)."""
    result, _ = run_compare(scenario.load("glm5-fp8-tp8"), "sparse-decode", [1024, 8192],
                         ["alloc", "workspace"], [kernel("flashmla"), kernel("flashmla-vllm")],
                         command="test")
    assert all(row.out_equal and row.lse_max_diff <= LSE_ULPS for row in result.rows), result.rows


def _tiny_call(adapter, op, heads, kv_format):
    problem = Problem(op=op, rows=64 if op != "dense-decode" else 4, heads=heads,
                      sm_scale=0.07, kv_tokens=4096 if op != "dense-decode" else 1024,
                      kv_format=kv_format, topk=None if op == "dense-decode" else 2048)
    q, inputs = adapter.make_inputs(problem, heads, torch.device("cuda"), seed=0)
    q = q.to(getattr(torch, problem.q_dtype))
    adapter.run(problem, to_kernel_layout(op, q), inputs)
    torch.cuda.synchronize()


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize(("op", "kv_format"), [("sparse-decode", "fp8_ds_mla"),
                                               ("dense-decode", "bf16"), ("dense-decode", "fp8"),
                                               ("sparse-prefill", "bf16")])
def test_declared_head_counts_match_a_live_probe(build, op, kv_format):
    """A head count runs natively exactly when the adapter declares it for this GPU."""
    adapter = kernel(build)
    declared = adapter.capabilities(op, kv_format).head_counts
    runs = []
    for heads in ALL_HEADS:
        try:
            _tiny_call(adapter, op, heads, kv_format)
            runs.append(heads)
        except RuntimeError:
            pass
    assert tuple(runs) == tuple(declared)


@pytest.mark.parametrize(("op", "kv_format"), [("sparse-decode", "fp8_ds_mla"),
                                               ("dense-decode", "bf16"),
                                               ("sparse-prefill", "bf16")])
def test_vllm_writes_into_the_callers_out(op, kv_format):
    """With out_, vLLM's build returns the caller's buffer, and the values equal its own out."""
    adapter = kernel("flashmla-vllm")
    assert adapter.capabilities(op, kv_format).takes_out and not adapter.capabilities(
        op, kv_format).assumed
    problem = Problem(op=op, rows=64, heads=64, sm_scale=0.07, kv_tokens=4096,
                      kv_format=kv_format, topk=None if op == "dense-decode" else 2048)
    q, inputs = adapter.make_inputs(problem, 64, torch.device("cuda"), seed=1)
    q = to_kernel_layout(op, q)
    own, _ = adapter.run(problem, q, inputs)
    buffer = torch.full_like(own, float("nan"))
    out, _ = adapter.run(problem, q, inputs, out=buffer)
    assert out.data_ptr() == buffer.data_ptr() and torch.equal(buffer, own)


@pytest.mark.parametrize(("args", "fix"), [
    (["--kernel", "triton", "--op", "dense-decode"], "kernel triton does not run dense-decode"),
    (["--kernel", "reference"], "torch reference has none")])
def test_validate_refuses_what_a_kernel_cannot_hold_in_one_line(args, fix):
    """On the GPU too, `validate` of an operation the kernel does not run, or of the reference
    (no allocation spec), exits 2 with one line and measures nothing."""
    check_bad_input(["validate", *args], fix)


@pytest.mark.parametrize("build", BUILDS)
def test_loaded_schemas_are_the_recorded_ones(build):
    """Every op schema the loaded library registers is the one the adapter records for a
    machine without it (so the capabilities predicted on a CPU are the GPU's)."""
    adapter = kernel(build)
    assert {op: adapter._schema(op) for op in adapter.assumed_schemas} == {
        op: (schema, False) for op, schema in adapter.assumed_schemas.items()}
