"""repro-oom on a GPU: the measured verdicts, confirmed limits and agreement with the model."""


import pytest
import torch

from mlamem.cli import main
from mlamem.commands.repro import host_setup, run_repro
from mlamem.engines.base import Budget, charged_per_process
from mlamem.engines.vllm import VLLM
from mlamem.kernels import FlashMLA
from mlamem.runtime.memory import SimulatedMemory
from mlamem.runtime.non_torch import calibrated
from mlamem.spec import scenario as scenarios
from mlamem.testing import needs_flashmla, one_line_error, recorded_host_or_skip

pytestmark = needs_flashmla
GiB = 1024**3
COMPARED = ("verdict", "phase", "workspace_bytes", "init_bytes", "profile_peak_bytes",
            "kv_cache_bytes", "step_peak_bytes", "oom_requested_bytes", "oom_buffer",
            "free_bytes_at_oom")


@pytest.fixture(scope="module")
def glm_result():
    glm = scenarios.load("glm5-fp8-tp8")
    budget = Budget(glm.gpu.memory_bytes, glm.gpu.gpu_memory_utilization, 32768)
    return glm, budget, run_repro(glm, budget, ["alloc", "workspace"], command="test")


def test_glm5_defaults_measured(glm_result):
    """On the GPU the alloc path OOMs on the 8 GiB o_accum; the workspace path fits."""
    _, budget, result = glm_result
    alloc, workspace = result.cases
    assert result.measured
    assert alloc["verdict"] == "oom" and alloc["oom_buffer"] == "o_accum"
    assert alloc["oom_requested_bytes"] == 8 * GiB and alloc["non_torch_bytes"] > 0
    assert workspace["verdict"] == "fits" and workspace["headroom_bytes"] > 0
    # the target's own non-torch record (the H100's, on an H100 or an H200 keeping to its room)
    recorded = host_setup("flashmla", target_bytes=budget.gpu_memory_bytes).assumed is None
    for case in result.cases:  # elsewhere the model can be tokens off: bisected
        method = case["max_safe_method"]
        assert ("confirmed on the GPU" if recorded else "on the GPU") in method, method


def test_measured_equals_the_model(glm_result):
    """Calibrated to the measured non-torch memory, the model with the target as the physical
    device predicts every byte of each case."""
    glm, budget, result = glm_result
    setup = host_setup("flashmla", target_bytes=budget.gpu_memory_bytes)
    for measured in result.cases:
        modelled = VLLM.emulate(SimulatedMemory(non_torch=setup), glm, FlashMLA(), budget,
                           measured["path"], sm_count=132).non_torch_bytes
        host = calibrated(setup, modelled, measured["non_torch_bytes"],
                          device_wide=not charged_per_process(measured))
        predicted = VLLM.emulate(SimulatedMemory(non_torch=host), glm, FlashMLA(), budget,
                            measured["path"], sm_count=132)
        predicted = predicted.to_dict()
        assert {k: predicted[k] for k in COMPARED} == {k: measured[k] for k in COMPARED}


def test_target_larger_than_local_gpu_is_refused(capsys):
    """--gpu-memory above the local GPU's memory exits 2 with one line."""
    local = torch.cuda.get_device_properties(0).total_memory
    assert main(["repro-oom", "--gpu-memory", f"{local // 1024**2 + 1}MiB"]) == 2
    assert "no larger than the local one" in one_line_error(capsys)


def test_context_reuse_measured_matches_prediction():
    """On the GPU the three reserve variants get the predicted verdicts and failing buffers."""
    kimi = scenarios.load("kimi-k2-context-reuse")
    recorded_host_or_skip(target_mib=kimi.gpu.memory_mib)  # an H200 target: refused on an H100
    budget = Budget(kimi.gpu.memory_bytes, kimi.gpu.gpu_memory_utilization, 8192)
    measured = run_repro(kimi, budget, ["alloc"], command="test")
    predicted = run_repro(kimi, budget, ["alloc"], command="test", predict=True)
    assert measured.measured and measured.engine == "trtllm-context-reuse"
    keys = ("verdict", "oom_buffer", "admitted", "trimmed", "attended_tokens")
    assert [{k: c[k] for k in keys} for c in measured.cases] == [
        {k: c[k] for k in keys} for c in predicted.cases]
    assert [c["verdict"] for c in measured.cases] == ["oom", "oom", "fits"]
