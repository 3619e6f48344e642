"""FlashInfer's MLA dense decode adapter (kernels/flashinfer_mla.py).

On the CPU: its predicted profile from the allocation spec, its listing, the one-line refusal of
`validate`, what it declares without importing flashinfer, and its call's plumbing (views in,
the caller's buffers out, lse turned to the natural log in place) through a stand-in wrapper.
On a GPU with flashinfer (skipped elsewhere): prediction = measurement to the byte on both
paths, out and lse held to the torch reference (and FlashMLA's beside it), the caller's buffers
written and returned, the paths bit-identical, and the head counts it declares running.
"""

import importlib.util
import math
import subprocess
import sys

import pytest
import torch

from mlamem.commands.profile import run_profile
from mlamem.kernels import REGISTRY, load_kernel
from mlamem.kernels.base import Problem, to_kernel_layout
from mlamem.kernels.flashinfer_mla import (
    FLOAT_WORKSPACE_BYTES,
    INSTALL_HINT,
    INT_WORKSPACE_BYTES,
    FlashInferInputs,
    FlashInferMLA,
)
from mlamem.runtime.paths import available_paths, check_paths
from mlamem.spec import scenario
from mlamem.spec.errors import UserError
from mlamem.testing import check_bad_input, kernel_or_skip

DENSE = "dense-decode"
KIMI = "kimi-k2-dense-tp4-dp"  # 64 heads per rank, bf16 paged cache, 8192-token contexts
HEADS = 64
REASON = FlashInferMLA().unavailable_reason()


def tiny_problem(heads=HEADS, rows=4, kv_tokens=1000, kv_format="bf16"):
    return Problem(op=DENSE, rows=rows, heads=heads, sm_scale=0.07, kv_tokens=kv_tokens,
                   kv_format=kv_format)


# On the CPU

def test_the_registry_entry_runs_the_dense_decode_only():
    entry = REGISTRY["flashinfer"]
    assert entry.operations == (DENSE,) and load_kernel("flashinfer") is FlashInferMLA


def test_capabilities_take_out_and_lse_but_no_accumulators():
    """Its split-KV partials live in the float workspace given at construction, so a call takes
    out= and lse= only: workspace-full is refused, naming what it lacks."""
    capabilities = FlashInferMLA().capabilities(DENSE)
    assert (capabilities.takes_out, capabilities.takes_lse,
            capabilities.takes_accum_workspace) == (True, True, False)
    assert capabilities.kv_formats == ("bf16",) and not capabilities.assumed
    assert capabilities.padded_heads(HEADS) == HEADS and capabilities.padded_heads(12) == 12
    assert available_paths(capabilities) == ["alloc", "workspace"]
    with pytest.raises(UserError, match="takes no accum_workspace="):
        check_paths(["workspace-full"], capabilities, FlashInferMLA.label, op=DENSE)
    with pytest.raises(ValueError, match="does not run sparse-decode"):
        FlashInferMLA().capabilities("sparse-decode")


def test_declaring_imports_no_flashinfer():
    """Listing, capabilities and the allocation spec answer without importing flashinfer."""
    code = ("import sys; from mlamem.kernels import load_kernel; from mlamem.kernels.base import "
            "Problem; k = load_kernel('flashinfer')(); k.capabilities('dense-decode'); "
            "k.version(); k.allocations(Problem('dense-decode', 4, 64, 0.1, 128, 'bf16'), 132); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'flashinfer'))")
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("requests", [16, 256])
def test_predicted_profile_allocates_out_and_lse_or_lse_alone(requests):
    """At Kimi-K2 (64 heads): the alloc path allocates out (b, 64, 512) bf16 and lse (b, 64)
    fp32 in the call; the workspace path stages out, so only lse."""
    out_bytes, lse_bytes = requests * HEADS * 512 * 2, requests * HEADS * 4
    result = run_profile(scenario.load(KIMI), [requests], ["alloc", "workspace"], command="test",
                         kernel=FlashInferMLA(), predict=True, op=DENSE)
    alloc, workspace = result.rows
    assert not result.measured and result.kernel.name == "flashinfer"
    assert alloc.failure is None and workspace.failure is None
    assert [(b.name, b.block_bytes) for b in alloc.buffers] == [
        ("out", out_bytes), ("lse", lse_bytes)]
    assert alloc.peak_allocated_bytes == out_bytes + lse_bytes
    assert workspace.staged == ["out"]
    assert [(b.name, b.block_bytes) for b in workspace.buffers] == [("lse", lse_bytes)]
    assert workspace.peak_allocated_bytes == lse_bytes


@pytest.mark.skipif(REASON is None, reason="flashinfer runs here: it measures")
def test_profile_on_the_cpu_is_labelled_predicted_with_the_install_hint(capsys):
    from mlamem.cli import main

    assert main(["profile", "--kernel", "flashinfer", "--op", DENSE, "--requests", "16"]) == 0
    err = capsys.readouterr().err
    assert f"not measured ({REASON})" in err and "PREDICTED" in err
    if importlib.util.find_spec("flashinfer") is None:
        assert f"flashinfer is not installed; {INSTALL_HINT}" == REASON


def test_mlamem_kernels_lists_it(capsys):
    from mlamem.cli import main

    assert main(["kernels"]) == 0
    [line] = [line for line in capsys.readouterr().out.splitlines()
              if line.startswith("flashinfer ")]
    assert "dense-decode(out, lse; h 1-128)" in line


@pytest.mark.skipif(REASON is None, reason="flashinfer runs here")
def test_validate_on_the_cpu_needs_a_gpu():
    check_bad_input(["validate", "--kernel", "flashinfer", "--op", DENSE, "-s", KIMI,
                     "--requests", "16"], fix="validate needs a GPU")


def test_an_fp8_cache_is_refused_in_one_line():
    with pytest.raises(NotImplementedError, match="reads a bf16 cache only"):
        FlashInferMLA().make_inputs(tiny_problem(kv_format="fp8"), HEADS, torch.device("meta"))


def test_on_meta_the_inputs_hold_what_the_engine_reserves_and_plans():
    """The float workspace (128 MiB), qo_indptr and kv_indptr, and the plan's 8 MiB int
    workspace, after mlamem's own inputs."""
    problem = tiny_problem()
    q, inputs = FlashInferMLA().make_inputs(problem, HEADS, torch.device("meta"))
    assert isinstance(inputs, FlashInferInputs) and inputs.wrapper is None
    assert q.shape == (4, HEADS, 576) and inputs.block_table.shape == (4, 16)
    assert [(tuple(t.shape), t.dtype) for t in inputs.plan_buffers] == [
        ((FLOAT_WORKSPACE_BYTES,), torch.uint8), ((5,), torch.int32), ((5,), torch.int32),
        ((INT_WORKSPACE_BYTES,), torch.uint8)]


def test_the_other_entry_points_say_what_they_do_not_run():
    kernel = FlashInferMLA()
    assert not hasattr(kernel, "decode")  # no sparse decode to stub
    with pytest.raises(NotImplementedError):
        kernel.allocations(Problem("sparse-prefill", 8, 64, 0.1, 128, "bf16", topk=64), 132)
    with pytest.raises(TypeError, match="takes no accum_workspace"):
        kernel.run(tiny_problem(), None, FlashInferInputs(kv=None), accum_workspace=object())
    with pytest.raises(ValueError, match="planned wrapper"):
        kernel.run(tiny_problem(), None, FlashInferInputs(kv=None))


class StandInWrapper:
    """Does what BatchMLAPagedAttentionWrapper.run does with its buffers (allocates out and
    lse when not given, returns them, lse in base 2), and records what it was given."""

    def __init__(self):
        self.given = None

    def run(self, *, q_nope, q_pe, ckv_cache, kpe_cache, out=None, lse=None, return_lse=False):
        assert return_lse
        self.given = {"q_nope": q_nope, "q_pe": q_pe, "ckv": ckv_cache, "kpe": kpe_cache,
                      "out": out, "lse": lse}
        out = torch.zeros_like(q_nope) if out is None else out.fill_(1.0)
        lse = torch.empty(q_nope.shape[:2], dtype=torch.float32) if lse is None else lse
        lse.fill_(3.0)  # base 2
        return out, lse


@pytest.mark.parametrize("given", [False, True])
def test_the_call_passes_views_and_returns_the_callers_buffers(given):
    """q and the cache go in as views (no copy); given out and lse are written and returned
    (in mlamem's layout); lse comes back as the natural log, converted in place."""
    kernel, problem = FlashInferMLA(torch.device("cpu")), tiny_problem(rows=3)
    q = to_kernel_layout(DENSE, torch.randn((3, HEADS, 576), dtype=torch.bfloat16))
    kv = torch.randn((12, 64, 1, 576), dtype=torch.bfloat16)
    inputs = FlashInferInputs(kv=kv, wrapper=StandInWrapper())
    out = torch.empty((3, 1, HEADS, 512), dtype=torch.bfloat16) if given else None
    lse = torch.empty((3, HEADS, 1), dtype=torch.float32) if given else None
    got_out, got_lse = kernel.run(problem, q, inputs, out=out, lse=lse)
    seen = inputs.wrapper.given
    assert seen["q_nope"].shape == (3, HEADS, 512) and seen["q_pe"].shape == (3, HEADS, 64)
    assert seen["ckv"].shape == (12, 64, 512) and seen["kpe"].shape == (12, 64, 64)
    assert seen["q_nope"].data_ptr() == q.data_ptr() == seen["q_pe"].data_ptr() - 512 * 2
    assert seen["ckv"].data_ptr() == kv.data_ptr() == seen["kpe"].data_ptr() - 512 * 2
    assert got_out.shape == (3, 1, HEADS, 512) and got_lse.shape == (3, HEADS, 1)
    if given:
        assert got_out is out and got_lse is lse
        assert seen["out"].data_ptr() == out.data_ptr() and seen["lse"].data_ptr() == lse.data_ptr()
        assert bool((out == 1.0).all())
    assert torch.allclose(got_lse, torch.full_like(got_lse, 3.0 * math.log(2.0)))


# On a GPU with flashinfer

needs_flashinfer = pytest.mark.skipif(REASON is not None, reason=f"needs flashinfer: {REASON}")
TOLERANCE = (0.01, 1e-4)  # out relative L2, lse max abs: the bf16 dense decode's, as FlashMLA's


available = kernel_or_skip


@pytest.mark.gpu
@needs_flashinfer
def test_prediction_equals_measurement():
    """Every buffer and the totals, allocated and reserved, predicted = measured, both paths."""
    from mlamem.commands.validate import run_validation

    comparisons = run_validation([(scenario.load(KIMI), DENSE, (16, 256))],
                                 ["alloc", "workspace"], kernel=FlashInferMLA())
    differing = [c for c in comparisons if not c.agrees]
    assert comparisons and not differing, differing[:5]


@pytest.mark.gpu
@needs_flashinfer
def test_flashinfer_and_flashmla_within_tolerance_of_the_reference():
    from mlamem.commands.compare import run_compare

    rel_l2, lse_abs = TOLERANCE
    result, _ = run_compare(scenario.load(KIMI), DENSE, [16], ["alloc", "workspace"],
                         [FlashInferMLA(), available("flashmla")], command="test",
                         reference=load_kernel("reference")())
    for row in result.rows:
        for name, error in row.errors.items():
            assert error.out_rel_l2 < rel_l2 and error.lse_max_abs < lse_abs, (name, error)


def _against_reference(heads, rows=4, kv_tokens=1000):
    """FlashInfer's out and lse against the reference's, at `heads` heads, as (rel L2, abs)."""
    kernel, reference = FlashInferMLA(), load_kernel("reference")()
    problem = tiny_problem(heads=heads, rows=rows, kv_tokens=kv_tokens)
    q, inputs = kernel.make_inputs(problem, heads, torch.device("cuda"), seed=heads)
    q = to_kernel_layout(DENSE, q)
    out, lse = kernel.run(problem, q, inputs)
    ref_out, ref_lse = reference.run(problem, q, inputs)
    error = ((out.float() - ref_out.float()).norm() / ref_out.float().norm()).item()
    return error, (lse - ref_lse).abs().max().item()


@pytest.mark.gpu
@needs_flashinfer
def test_out_and_natural_log_lse_match_the_reference():
    rel_l2, lse_abs = TOLERANCE
    error, lse_error = _against_reference(HEADS, rows=64, kv_tokens=4096)
    assert error < rel_l2 and lse_error < lse_abs, (error, lse_error)


@pytest.mark.gpu
@needs_flashinfer
@pytest.mark.parametrize("heads", [1, 8, 16, 24, 32, 64, 100, 128])
def test_declared_head_counts_run_natively(heads):
    """Any head count runs (heads packed with requests into 64-row tiles): a sample of the
    declared 1-128, odd ones included, each within tolerance of the reference."""
    assert heads in FlashInferMLA().capabilities(DENSE).head_counts
    rel_l2, lse_abs = TOLERANCE
    error, lse_error = _against_reference(heads)
    assert error < rel_l2 and lse_error < lse_abs, (heads, error, lse_error)


@pytest.mark.gpu
@needs_flashinfer
def test_writes_into_and_returns_the_callers_buffers():
    """Given out and lse, the call returns those very buffers, holding its own values."""
    kernel, problem = FlashInferMLA(), tiny_problem(rows=64, kv_tokens=4096)
    q, inputs = kernel.make_inputs(problem, HEADS, torch.device("cuda"), seed=1)
    q = to_kernel_layout(DENSE, q)
    own_out, own_lse = kernel.run(problem, q, inputs)
    out, lse = torch.full_like(own_out, float("nan")), torch.full_like(own_lse, float("nan"))
    got_out, got_lse = kernel.run(problem, q, inputs, out=out, lse=lse)
    assert got_out is out and got_lse is lse
    assert torch.equal(out, own_out) and torch.equal(lse, own_lse)


@pytest.mark.gpu
@needs_flashinfer
def test_paths_are_bit_identical():
    result = run_profile(scenario.load(KIMI), [16, 256], ["alloc", "workspace"], command="test",
                         kernel=FlashInferMLA(), op=DENSE)
    assert result.measured and all(row.outputs_equal for row in result.rows)
