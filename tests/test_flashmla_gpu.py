"""FlashMLA on the GPU: numerics against the reference, measured == predicted, OOM rows."""

import json
import subprocess
import sys

import pytest
import torch

from mlamem.commands.profile import run_profile
from mlamem.kernels import FlashMLA, Reference
from mlamem.operations.sparse_decode import run_kernel
from mlamem.runtime.inputs import make_inputs
from mlamem.runtime.measure import measure_call
from mlamem.runtime.memory import CudaMemory, SimulatedMemory
from mlamem.spec import scenario
from mlamem.testing import needs_flashmla

pytestmark = [needs_flashmla, pytest.mark.gpu]
GLM5 = "glm5-fp8-tp8"


@pytest.mark.parametrize("seed", [1, 2])
def test_flashmla_agrees_with_reference(seed):
    """FlashMLA's out is within 1e-2 relative L2 of the torch reference; lse is close."""
    glm = scenario.load(GLM5)
    inputs = make_inputs(glm, 64, torch.device("cuda"), seed=seed, invalid_fraction=0.25)
    q = torch.zeros((64, 64, 576), dtype=torch.bfloat16, device="cuda")
    q[:, :8] = inputs.q  # GLM-5's 8 real heads, padded to 64 like the alloc path
    kwargs = {"sm_scale": glm.softmax_scale, "d_v": 512}
    out, lse = run_kernel(FlashMLA(), q.unsqueeze(0), inputs.kv_cache, inputs.indices, **kwargs)
    ref_out, ref_lse = run_kernel(Reference(), q.unsqueeze(0), inputs.kv_cache, inputs.indices,
                                  **kwargs)
    error = (out.float() - ref_out.float()).norm() / ref_out.float().norm()
    assert error <= 1e-2
    torch.testing.assert_close(lse, ref_lse, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("name", ["glm5-fp8-tp8", "deepseek-v32-fp8-tp8", "kimi-k2-fp8-tp4-dp"])
@pytest.mark.parametrize("path", ["alloc", "workspace"])
def test_measured_equals_predicted(name, path):
    """The allocator model predicts the measured allocated and reserved peaks to the byte."""
    chosen = scenario.load(name)
    kwargs = {"sm_count": torch.cuda.get_device_properties(0).multi_processor_count,
              "max_tokens": chosen.serving.max_num_batched_tokens}
    for tokens in (1024, 8192):
        measured = measure_call(CudaMemory(), chosen, FlashMLA(), tokens, path, **kwargs)
        predicted = measure_call(SimulatedMemory(), chosen, FlashMLA(), tokens, path, **kwargs)
        assert measured.failure is None
        assert measured.peak_allocated_bytes == predicted.peak_allocated_bytes
        assert measured.peak_reserved_bytes == predicted.peak_reserved_bytes


def test_paths_give_bit_identical_outputs():
    """Both paths give the same out and lse bits, so staging changes memory, not results."""
    result = run_profile(scenario.load(GLM5), [4096], ["alloc", "workspace"], command="test")
    assert result.measured
    assert [row.outputs_equal for row in result.rows] == [True, True]


def test_kernel_oom_becomes_a_row():
    """An OOM inside the stable-ABI kernel (a RuntimeError) is a row with the failed size."""
    glm = scenario.load(GLM5)
    tokens = 8192
    o_accum = 2 * tokens * 64 * 512 * 4
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.empty_cache()
    # room for inputs, padded q, out and lse, but not the 2 GiB o_accum
    torch.cuda.set_per_process_memory_fraction((1.5 * 2**30) / total)
    try:
        row = measure_call(CudaMemory(), glm, FlashMLA(), tokens, "alloc", sm_count=132,
                           max_tokens=32768)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    assert row.oom
    assert row.oom_requested_bytes == o_accum


def test_measured_breakdown_adds_up_and_names_every_buffer():
    """On the GPU every allocation inside the call is named and the parts add up to the peak."""
    result = run_profile(scenario.load(GLM5), [8192], ["alloc", "workspace"], command="test")
    for row in result.rows:
        assert row.measured
        assert row.missing_buffers == []
        assert "unattributed" not in [b.name for b in row.buffers]
        assert row.breakdown_peak_bytes == row.peak_allocated_bytes


def _profile_rows(*args: str) -> list[dict]:
    done = subprocess.run([sys.executable, "-P", "-m", "mlamem", "profile", *args, "--format",
                           "json"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["rows"]


@pytest.mark.parametrize("name", ["glm5-fp8-tp8", "deepseek-v32-fp8-tp8", "kimi-k2-fp8-tp4-dp"])
def test_default_sweep_measured_equals_predicted(name):
    """`mlamem profile` at its default T and paths, measured in a fresh process, equals
    `--predict` in every row's allocated and reserved peaks and each buffer's bytes, with both
    paths' outputs bit-identical; NVML, a device-wide reading, is not compared."""
    def figures(row: dict) -> dict:
        return {**{k: row[k] for k in ("tokens", "path", "peak_allocated_bytes",
                                       "peak_reserved_bytes", "bytes_allocated_in_call")},
                "buffers": [(b["name"], b["requested_bytes"], b["block_bytes"])
                            for b in row["buffers"]]}

    measured, predicted = _profile_rows("-s", name), _profile_rows("-s", name, "--predict")
    assert [figures(row) for row in measured] == [figures(row) for row in predicted]
    assert all(row["measured"] and row["outputs_equal"] for row in measured)
