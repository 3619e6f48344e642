"""The API and the pytest plugin on a GPU, on the real kernels: mlamem.profile_call gives
`mlamem profile`'s figures to the byte, and the marks pass and fail as they should."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mlamem.testing import kernel_or_skip, needs_flashmla

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
pytest_plugins = ["pytester"]

TESTS = Path(__file__).parent
SCENARIO, TOKENS, PATHS = "glm5-fp8-tp8", 1024, ("alloc", "workspace")
COMPARED = ("peak_allocated_bytes", "peak_reserved_bytes", "allocations_in_call",
            "bytes_allocated_in_call", "breakdown_peak_bytes", "missing_buffers", "buffers")

# profile_call on the call `mlamem profile` builds, one path after another, in a fresh process
_PROFILE_CALL = f"""
import gc, json, sys
sys.path.insert(0, {str(TESTS)!r})
import torch
import mlamem
from mlamem.spec import scenario
from mlamem.kernels import FlashMLA
from mlamem.runtime.measure import local_sm_count
from mlamem.runtime.memory import CudaMemory
from test_api import decode_step

glm = scenario.load({SCENARIO!r})
rows = {{}}
for path in {PATHS!r}:
    step, expect = decode_step(FlashMLA(), glm, {TOKENS}, path, memory=CudaMemory(),
                               sm_count=local_sm_count())
    rows[path] = mlamem.profile_call(step, expect=expect).to_dict()
    del step
    gc.collect()
    torch.cuda.empty_cache()
print(json.dumps(rows))
"""


def _run(argv: list[str]) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


@needs_flashmla
def test_profile_call_gives_mlamem_profiles_figures(record_property):
    """FlashMLA, GLM-5, T=1024, alloc and workspace: profile_call on the same call equals
    `mlamem profile --require-gpu` to the byte in the peaks (allocated, reserved), the
    allocations in the call and every buffer; NVML is reported (record_property), not compared.
    Each side runs in a fresh process, so both start from a cold allocator."""
    profiled = json.loads(_run([
        sys.executable, "-P", "-m", "mlamem", "profile", "--scenario", SCENARIO,
        "--tokens", str(TOKENS), "--paths", ",".join(PATHS), "--format", "json",
        "--require-gpu"]))
    called = json.loads(_run([sys.executable, "-P", "-c", _PROFILE_CALL]).splitlines()[-1])
    for row in profiled["rows"]:
        mine = called[row["path"]]
        # profile records no frames by default; profile_call's are this script's line
        row["buffers"] = [{k: v for k, v in b.items() if k not in ("removed_by_workspace", "frame")}
                          for b in row["buffers"]]
        mine["buffers"] = [{k: v for k, v in b.items() if k != "frame"} for b in mine["buffers"]]
        assert row["measured"] and mine["measured"]
        assert {k: mine[k] for k in COMPARED} == {k: row[k] for k in COMPARED}, row["path"]
        record_property(f"nvml_peak_bytes {row['path']}",
                        {"profile": row["nvml_peak_bytes"], "profile_call": mine["nvml_peak_bytes"]})


def test_profile_call_names_each_allocation_by_its_frame_as_predicted():
    """Frames: profile_call on a function of the test's own with
    temporaries (a matmul, a softmax in fp32, a copy into a fresh output), measured on the GPU
    and predicted on the meta device: every allocation named by its frame in tests/test_api.py,
    the same names, bytes and frames on both, frame for frame."""
    from test_api import scores_then_copy

    import mlamem
    from mlamem.runtime.attribution import UNATTRIBUTED

    shapes = ((4096, 1024), (1024, 640))
    runs = {}
    for device in ("cuda", "meta"):
        x, w = (torch.randn(shape, device=device).to(torch.bfloat16) for shape in shapes)
        t = mlamem.profile_call(scores_then_copy, x, w, device=device)
        runs[device] = [(b.name, b.frame, b.requested_bytes, b.live_at_peak) for b in t.buffers]
        print(t.table())
        del x, w, t
        torch.cuda.empty_cache()
    measured, predicted = runs["cuda"], runs["meta"]
    assert measured == predicted
    assert len(measured) == 4
    assert all(name == frame and name.startswith("tests/test_api.py:")
               and name.endswith(" scores_then_copy") and name != UNATTRIBUTED
               for name, frame, _, _ in measured)


@needs_flashmla
def test_profile_frames_measured_and_predicted():
    """profile --frames at T=1024, on the H200 and predicted: the padded q's frame is the alloc
    path's line on both; the kernel's buffers are named by its spec on both, their frame the
    kernel library's entry when measured (mlamem's stand-in when predicted: docs/profile.md)."""
    argv = [sys.executable, "-P", "-m", "mlamem", "profile", "--scenario", SCENARIO,
            "--tokens", str(TOKENS), "--paths", "alloc", "--breakdown", "--frames",
            "--format", "json"]
    [measured] = json.loads(_run([*argv, "--require-gpu"]))["rows"]
    [predicted] = json.loads(_run([*argv, "--predict"]))["rows"]
    assert [b["name"] for b in measured["buffers"]] == [b["name"] for b in predicted["buffers"]]
    padded_q, *kernel = measured["buffers"]
    assert padded_q["frame"] == predicted["buffers"][0]["frame"]
    assert padded_q["frame"].startswith("mlamem/runtime/paths.py:")
    assert all(b["frame"].startswith("flash_mla/") for b in kernel), kernel


_CONFTEST = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
import pytest
from mlamem.spec import scenario
from mlamem.kernels import TritonDecode
from mlamem.runtime.measure import local_sm_count
from mlamem.runtime.memory import CudaMemory
from test_api import decode_step

GLM = scenario.load({SCENARIO!r})


def warm_step(path):
    step, _ = decode_step(TritonDecode(), GLM, {TOKENS}, path, memory=CudaMemory(),
                          sm_count=local_sm_count())
    step()  # compiles the Triton kernels in setup, outside the measured body
    return step


@pytest.fixture
def workspace_full_step():
    return warm_step("workspace-full")


@pytest.fixture
def alloc_step():
    return warm_step("alloc")
"""

_MARKED_TESTS = f"""
import pytest
from conftest import GLM
from mlamem.kernels import TritonDecode
from mlamem.runtime.measure import local_sm_count
from test_api import decode_expect

ALLOC_EXPECT = decode_expect(TritonDecode(), GLM, {TOKENS}, "alloc", local_sm_count())


@pytest.mark.max_gpu_allocations(0)
@pytest.mark.limit_gpu_memory("1MiB")
def test_workspace_full_is_graph_safe(workspace_full_step):
    workspace_full_step()


@pytest.mark.max_gpu_allocations(0, expect=ALLOC_EXPECT)
def test_alloc_path_is_graph_safe(alloc_step):
    alloc_step()


@pytest.mark.limit_gpu_memory("256MiB", expect=ALLOC_EXPECT)
def test_alloc_path_fits_256_mib(alloc_step):
    alloc_step()


@pytest.mark.limit_gpu_memory("512MiB")
def test_alloc_path_fits_512_mib(alloc_step):
    alloc_step()
"""


def test_marks_pass_and_fail_on_the_triton_kernel(pytester):
    """The Triton decode at GLM-5 T=1024: workspace-full passes max_gpu_allocations(0) and a
    1 MiB limit; the alloc path fails max_gpu_allocations(0), naming each buffer it allocated
    with its size, and fails a 256 MiB limit (its peak is about 393 MiB) with the table, and
    passes 512 MiB. Measured in a fresh pytest process."""
    kernel_or_skip("triton")
    pytester.makeconftest(_CONFTEST)
    pytester.makepyfile(_MARKED_TESTS)
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines([
        "*_ test_alloc_path_is_graph_safe _*",
        "7 GPU allocations inside the test body, max_gpu_allocations(0): padded_q 72.000 MiB at "
        "*.py:* test_alloc_path_is_graph_safe, out 64.000 MiB at *, lse 256.000 KiB at *, "
        "scheduler_metadata * B at *, num_splits * B at *, lse_accum * at *, o_accum * at *",
        "*_ test_alloc_path_fits_256_mib _*",
        "GPU peak allocated * exceeds limit_gpu_memory 256.000 MiB (268435456 B)",
        "*o_accum*kernel*yes*",
        "*::test_workspace_full_is_graph_safe: peak allocated 0 B (limit 1.000 MiB), "
        "0 allocations inside",
    ])
