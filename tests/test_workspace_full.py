"""The workspace-full path and --kernel on CPU: staging follows the kernel's capabilities, the
prediction allocates nothing inside a workspace-full call, and kernels that cannot are refused."""

import json

import pytest
import torch

from mlamem import scenario
from mlamem.cli import main
from mlamem.engine import Budget
from mlamem.errors import UserError
from mlamem.inputs import make_inputs
from mlamem.kernels import FlashMLA, Reference, TritonDecode
from mlamem.kernels.base import ACCUM_WORKSPACE, BufferSpec, allocated_in_call, simulate_decode
from mlamem.kernels.triton_decode import max_accum_workspace_numel
from mlamem.paths import (
    PATHS,
    DecodeCall,
    available_paths,
    check_paths,
    plan,
    reserve_workspace,
)
from mlamem.profile import DEFAULT_TOKENS, run_profile
from mlamem.repro import run_repro

GiB = 1024**3
META = torch.device("meta")
ALL_PATHS = ["alloc", "workspace", "workspace-full"]


@pytest.fixture(scope="module")
def glm():
    return scenario.load("glm5-fp8-tp8")


@pytest.fixture(scope="module")
def triton_prediction(glm):
    return run_profile(glm, DEFAULT_TOKENS, ALL_PATHS, command="test", kernel=TritonDecode(),
                       predict=True)


def _rows(result, path):
    return [r for r in result.rows if r.path == path]


def test_triton_workspace_column_is_the_prs_after_column(triton_prediction):
    """q and out staged: 0.251, 2.006, 4.012, 8.023 GiB at T = 1024, 8192, 16384, 32768."""
    rows = _rows(triton_prediction, "workspace")
    assert [r.peak_allocated_bytes / GiB for r in rows] == pytest.approx(
        [0.251, 2.006, 4.012, 8.023], abs=0.001)
    assert all(r.staged == ["padded_q", "out"] for r in rows)


def test_triton_alloc_column_is_flashmlas(glm, triton_prediction):
    """Allocating mode mirrors FlashMLA's buffers, so the alloc columns agree to the byte."""
    flashmla = run_profile(glm, DEFAULT_TOKENS, ["alloc"], command="test", kernel=FlashMLA(),
                           predict=True)
    assert ([r.peak_allocated_bytes for r in _rows(triton_prediction, "alloc")]
            == [r.peak_allocated_bytes for r in flashmla.rows])


def test_workspace_full_allocates_nothing_inside_the_call(triton_prediction):
    """q, out, lse and accumulators staged: 0 allocations, 0 bytes, and nothing missing."""
    for row in _rows(triton_prediction, "workspace-full"):
        assert row.staged == ["padded_q", "out", "lse", ACCUM_WORKSPACE]
        assert row.peak_allocated_bytes == 0 and row.peak_reserved_bytes == 0
        assert row.allocations_in_call == 0 and row.buffers == [] and row.missing_buffers == []


def test_allocated_in_call_drops_what_is_passed():
    """A passed out or lse is not allocated; a passed accumulator workspace removes every temporary."""
    specs = FlashMLA().allocations((1, 8, 64, 576), 512, 132)
    names = [s.name for s in allocated_in_call(specs, ["out"])]
    assert names == ["lse", "scheduler_metadata", "num_splits", "lse_accum", "o_accum"]
    assert [s.name for s in allocated_in_call(specs, ["lse", ACCUM_WORKSPACE])] == ["out"]
    assert allocated_in_call(specs, ["out", "lse", ACCUM_WORKSPACE]) == []


def test_simulation_returns_the_passed_buffers():
    """simulate_decode hands back the caller's out and lse instead of allocating them."""
    q = torch.empty((1, 4, 64, 576), dtype=torch.bfloat16, device=META)
    out = torch.empty((1, 4, 64, 512), dtype=torch.bfloat16, device=META)
    lse = torch.empty((1, 64, 4), device=META)
    got = simulate_decode(TritonDecode(), 132, q, None, None, sm_scale=0.1, d_v=512, out=out,
                          lse=lse, accum_workspace=torch.empty(8, device=META))
    assert got[0] is out and got[1] is lse


def test_workspace_full_reserves_lse_and_the_kernels_accumulators(glm):
    """lse is padded_heads x max_tokens floats; the accumulators are the kernel's own maximum."""
    kwargs = {"max_tokens": 32768, "padded_heads": 64, "d_qk": 576, "d_v": 512, "topk": 2048,
              "sm_count": 132, "device": META}
    full = reserve_workspace("workspace-full", TritonDecode(), **kwargs)
    assert full.lse.shape == (64 * 32768,) and full.lse.dtype == torch.float32
    assert full.accum_workspace.numel() == max_accum_workspace_numel(1, 64, 512, 2048, 132, 32768)
    assert full.lse_for(100).shape == (1, 64, 100) and full.lse_for(100).is_contiguous()
    staged_only = reserve_workspace("workspace", TritonDecode(), **kwargs)
    assert staged_only.lse is None and staged_only.accum_workspace is None
    assert reserve_workspace("alloc", TritonDecode(), **kwargs) is None


class ReferenceIntoBuffers(Reference):
    """The torch reference, writing into the out= and lse= it is given (accumulators unused)."""

    def capabilities(self):
        return TritonDecode().capabilities()

    def decode(self, q, kv_cache, indices, *, sm_scale, d_v, out=None, lse=None,
               accum_workspace=None):
        result = super().decode(q, kv_cache, indices, sm_scale=sm_scale, d_v=d_v)
        for given, computed in zip((out, lse), result, strict=True):
            if given is not None:
                given.copy_(computed)
        return (out if out is not None else result[0]), (lse if lse is not None else result[1])


def test_workspace_full_path_writes_into_the_workspace_bit_identically(glm):
    """Every path gives the same bits; workspace-full's out and lse are views of the workspace."""
    cpu = torch.device("cpu")
    inputs = make_inputs(glm, 16, cpu, seed=5, invalid_fraction=0.2)
    call = DecodeCall(decode=ReferenceIntoBuffers().decode, kv_cache=inputs.kv_cache,
                      indices=inputs.indices, sm_scale=glm.softmax_scale, d_v=glm.d_v,
                      padded_heads=64, takes_out=True)
    workspace = reserve_workspace("workspace-full", TritonDecode(), max_tokens=32,
                                  padded_heads=64, d_qk=576, d_v=512, topk=glm.decode_topk,
                                  sm_count=132, device=cpu)
    workspace.lse.fill_(float("nan"))
    results = {path: PATHS[path](inputs.q, call, workspace) for path in ALL_PATHS}
    for out, lse in results.values():
        assert torch.equal(out, results["alloc"][0]) and torch.equal(lse, results["alloc"][1])
    out, lse = results["workspace-full"]
    assert out.data_ptr() == workspace.out.data_ptr()
    assert lse.data_ptr() == workspace.lse.data_ptr()
    assert torch.isnan(workspace.lse[64 * 16:]).all()  # past T untouched


def test_default_paths_are_what_the_kernel_supports():
    """FlashMLA (no lse=, no accumulators) and the reference stop at workspace; Triton has all three."""
    assert available_paths(FlashMLA().capabilities()) == ["alloc", "workspace"]
    assert available_paths(Reference().capabilities()) == ["alloc", "workspace"]
    assert available_paths(TritonDecode().capabilities()) == ALL_PATHS


@pytest.mark.parametrize("kernel", [FlashMLA(), Reference()])
def test_workspace_full_with_a_kernel_that_cannot_is_refused(glm, kernel):
    """A one-line user error naming what the kernel lacks and `--kernel triton`."""
    with pytest.raises(UserError, match="takes no .*lse=, accum_workspace=.*--kernel triton"):
        check_paths(["alloc", "workspace-full"], kernel.capabilities(), kernel.label)
    with pytest.raises(UserError, match="--kernel triton"):
        run_profile(glm, [1024], ["workspace-full"], command="t", kernel=kernel, predict=True)
    with pytest.raises(UserError, match="--kernel triton"):
        plan("workspace-full", 8, kernel.capabilities(), kernel.label)


def test_cli_kernel_option(capsys):
    """--kernel triton predicts all three paths by default; workspace-full with FlashMLA and an
    unknown kernel are one-line errors, exit 2, the latter listing the choices."""
    assert main(["profile", "--kernel", "triton", "--tokens", "1024", "--predict",
                 "--format", "json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["kernel"]["name"] == "triton" and result["kernel"]["label"] == "Triton"
    assert [r["path"] for r in result["rows"]] == ALL_PATHS
    assert main(["profile", "--paths", "workspace-full", "--predict"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--kernel triton" in err
    assert main(["profile", "--kernel", "cuda-magic"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'flashmla', 'triton', 'reference'" in err


def test_markdown_names_the_kernel_and_every_path(capsys):
    """The report says which kernel it profiled and has one column per path."""
    assert main(["profile", "--kernel", "triton", "--tokens", "1024", "--predict",
                 "--format", "markdown"]) == 0
    text = capsys.readouterr().out
    assert "Triton allocation spec" in text
    assert "| T | alloc path | workspace path | workspace-full path | outputs equal |" in text
    assert "| 1024 | 0.384 GiB | 0.251 GiB | 0.000 GiB | n/a |" in text


def test_gate_refuses_a_baseline_of_another_kernel(tmp_path, capsys):
    """A baseline records its kernel; gating it with another is an environment change (exit 2)."""
    baseline = tmp_path / "b.json"
    sweep = ["--tokens", "1024", "--scenario", "glm5-fp8-tp8"]
    assert main(["gate", "--predict", "--baseline", str(baseline), "--update", "--kernel",
                 "triton", *sweep]) == 0
    data = json.loads(baseline.read_text())
    assert data["sweep"]["kernel"] == "triton" and data["sweep"]["paths"] == ALL_PATHS
    capsys.readouterr()
    assert main(["gate", "--predict", "--baseline", str(baseline)]) == 0  # the baseline's kernel
    assert main(["gate", "--predict", "--baseline", str(baseline), "--kernel", "flashmla",
                 "--paths", "alloc"]) == 2
    assert "kernel: baseline triton, this run flashmla" in capsys.readouterr().err


def test_repro_workspace_full_step_allocates_only_the_engines_buffers(glm):
    """With every kernel buffer staged, the step allocates only the engine's activations."""
    budget = Budget(gpu_memory_bytes=glm.gpu.memory_bytes,
                    utilization=glm.gpu.gpu_memory_utilization,
                    max_num_batched_tokens=glm.serving.max_num_batched_tokens)
    result = run_repro(glm, budget, ["workspace", "workspace-full"], command="t",
                       kernel=TritonDecode(), predict=True)
    workspace, full = result.cases
    assert result.kernel["name"] == "triton"
    assert full["verdict"] == "fits"
    assert {b["allocated_by"] for b in full["buffers"]} == {"engine"}
    assert "o_accum" in {b["name"] for b in workspace["buffers"]}
    extra = full["workspace_bytes"] - workspace["workspace_bytes"]
    lse = BufferSpec("lse", (64 * budget.max_num_batched_tokens,), torch.float32, "returned")
    assert lse.nbytes < extra < lse.nbytes + 64 * 2**20  # lse plus tens of MB of accumulators
