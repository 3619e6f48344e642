"""The wrapper paths compute the same thing: alloc, workspace (reused reserved buffers) and
workspace-full (everything staged), and only kernels that can take the buffers get a path."""

import functools

import pytest
import torch

from mlamem.commands.profile import run_profile
from mlamem.kernels import FlashMLA, Reference, TritonDecode
from mlamem.kernels.base import OpInputs
from mlamem.operations import SPARSE_DECODE, problem_for
from mlamem.runtime.inputs import make_inputs
from mlamem.runtime.paths import (
    PATHS,
    KernelCall,
    Workspace,
    alloc_path,
    available_paths,
    check_paths,
    plan,
    reserve_workspace,
    workspace_path,
)
from mlamem.spec import scenario
from mlamem.spec.errors import UserError

META = torch.device("meta")
ALL_PATHS = ["alloc", "workspace", "workspace-full"]


@pytest.fixture(scope="module")
def glm():
    return scenario.load("glm5-fp8-tp8")


@pytest.fixture
def one_cpu_thread():
    """The CPU reference on one thread: with two, its float32 matmuls' reduction order varies
    from run to run (seen: 3 runs in 20 differed in the last bit), which is not the paths'."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def sparse_decode_call(kernel, glm, inputs, tokens: int, *, takes_out: bool) -> KernelCall:
    """The sparse decode's call of `kernel` at `tokens` over an engine's inputs, as measure
    runs it."""
    problem = problem_for(glm, SPARSE_DECODE, tokens, 64)
    run = functools.partial(kernel.run, problem,
                            inputs=OpInputs(kv=inputs.kv_cache, indices=inputs.indices))
    return KernelCall(run=run, op=SPARSE_DECODE, padded_heads=64, takes_out=takes_out)


def test_workspace_path_is_bit_identical_even_with_a_poisoned_workspace(one_cpu_thread):
    """Padding heads are zeroed and real heads copied, so stale workspace bytes never leak."""
    glm = scenario.load("glm5-fp8-tp8")
    inputs = make_inputs(glm, 16, torch.device("cpu"), seed=3, invalid_fraction=0.2)
    call = sparse_decode_call(Reference(), glm, inputs, 16, takes_out=False)
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


def test_workspace_full_reserves_lse_and_the_kernels_accumulators(glm):
    """lse is padded_heads x max_tokens floats; the accumulators are the kernel's own maximum."""
    kwargs = {"max_tokens": 32768, "padded_heads": 64, "d_qk": 576, "d_v": 512, "topk": 2048,
              "sm_count": 132, "device": META}
    full = reserve_workspace("workspace-full", TritonDecode(), **kwargs)
    assert full.lse.shape == (64 * 32768,) and full.lse.dtype == torch.float32
    # Only calls with fewer programs (s_q x 64/64 heads) than the 132 SMs split. The largest,
    # s_q = 131, has num_sm_parts = max(132 // 131, 1) = 1, so at most 1 + 1 = 2 splits fit
    # FlashMLA's accumulators, and 2 is what it wants (ceil(132 / 131)): 2 x 131 = 262 partial
    # rows of 64 heads x (1 lse + 512 out) floats. Smaller s_q split more but have fewer rows
    # (s_q = 66: 2 x 66; s_q = 1: 16 x 1).
    assert full.accum_workspace.numel() == 2 * 131 * 64 * (1 + 512) == 8_601_984
    assert full.lse_for(100).shape == (1, 64, 100) and full.lse_for(100).is_contiguous()
    staged_only = reserve_workspace("workspace", TritonDecode(), **kwargs)
    assert staged_only.lse is None and staged_only.accum_workspace is None
    assert reserve_workspace("alloc", TritonDecode(), **kwargs) is None


class ReferenceIntoBuffers(Reference):
    """The torch reference, writing into the out= and lse= it is given (accumulators unused)."""

    def capabilities(self):
        return TritonDecode().capabilities()

    def run(self, problem, q, inputs, *, out=None, lse=None, accum_workspace=None):
        result = super().run(problem, q, inputs)
        for given, computed in zip((out, lse), result, strict=True):
            if given is not None:
                given.copy_(computed)
        return (out if out is not None else result[0]), (lse if lse is not None else result[1])


def test_workspace_full_path_writes_into_the_workspace_bit_identically(glm):
    """Every path gives the same bits; workspace-full's out and lse are views of the workspace."""
    cpu = torch.device("cpu")
    inputs = make_inputs(glm, 16, cpu, seed=5, invalid_fraction=0.2)
    call = sparse_decode_call(ReferenceIntoBuffers(), glm, inputs, 16, takes_out=True)
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
    """A one-line user error naming what the kernel lacks and the kernels that can."""
    with pytest.raises(UserError, match="takes no .*lse=, accum_workspace=.*use kernel triton"):
        check_paths(["alloc", "workspace-full"], kernel.capabilities(), kernel.label)
    with pytest.raises(UserError, match="use kernel triton"):
        run_profile(glm, [1024], ["workspace-full"], command="t", kernel=kernel, predict=True)
    with pytest.raises(UserError, match="use kernel triton"):
        plan("workspace-full", 8, kernel.capabilities(), kernel.label)
