"""CUDA graphs on a GPU: every capture replays bit for bit, and the allocator model predicts
each capture's figures to the byte; repro-oom --cuda-graphs on, measured, equals the prediction
field by field, the device's graph memory outside the allocator included.

The repro-oom test runs mlamem only in child processes and comes first: another process's CUDA
context moves the device-wide figures it compares (tests/test_repro_shipped_gpu.py says how),
so it is skipped where this process already holds one (scripts/gpu_check.py's suite
`graph-memory` runs this file alone)."""

import json
import subprocess
import sys

import pytest

from mlamem.commands.graphs import measure_path
from mlamem.commands.validate import compare_graphs
from mlamem.spec import scenario as scenarios
from mlamem.testing import kernel_or_skip, recorded_host_or_skip

SIZES = [512, 496, 256, 8, 1]
NEIGHBOUR = ("this pytest process holds a CUDA context, a neighbour that moves repro-oom's "
             "device-wide figures; run this file alone (scripts/gpu_check.py's graph-memory)")
# vLLM's graphs at every sparse scenario's defaults (GLM-5's 51 FULL decode graphs), and two
# shapes no other test uses: DeepSeek-V3.2 at 20000 tokens per step with six capture sizes, and
# GLM-5 at 24000 with five sizes under a 0.9 utilization
GRAPH_REPROS = {"glm5-default": ["--cuda-graphs", "on"],
                "deepseek-default": ["-s", "deepseek-v32-fp8-tp8", "--cuda-graphs", "on"],
                "kimi-k2-default": ["-s", "kimi-k2-fp8-tp4-dp", "--cuda-graphs", "on"],
                "context-reuse-by-vllm": ["-s", "kimi-k2-context-reuse", "--engine", "vllm",
                                          "--cuda-graphs", "on"],
                "deepseek-six-sizes": ["-s", "deepseek-v32-fp8-tp8", "--cuda-graphs", "on",
                                       "--capture-sizes", "96,48,24,12,6,3",
                                       "--max-num-batched-tokens", "20000"],
                "glm5-five-sizes": ["--cuda-graphs", "on", "--capture-sizes", "200,100,50,25,5",
                                    "--max-num-batched-tokens", "24000", "--utilization", "0.9"]}


def _child(*args: str, timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-P", *args], capture_output=True, text=True,
                          timeout=timeout)


def _repro_json(args: list[str], output) -> dict:
    done = _child("-m", "mlamem", "repro-oom", *args, "--format", "json", "--output", str(output),
                  timeout=540)
    assert done.returncode == 0, done.stderr
    return json.loads(output.read_text())


@pytest.mark.parametrize("name", list(GRAPH_REPROS))
def test_repro_with_graphs_measured_equals_predicted(name, tmp_path):
    """`mlamem repro-oom --cuda-graphs on`, measured and predicted (the memory captures take
    outside the allocator modelled from non_torch.toml: the first capture's, and the driver's
    2 MiB steps at 9, 36 and 41 live graphs): equal in every field a prediction gives, the
    device-wide graph figures and vLLM's estimate from them included."""
    import torch

    from mlamem.commands.repro import prediction_differences

    if torch.cuda.is_initialized():
        pytest.skip(NEIGHBOUR)
    unavailable = _child("-c", "from mlamem.kernels import load_kernel; "
                         "print(load_kernel('flashmla')().unavailable_reason() or '')",
                         timeout=120).stdout.strip()
    if unavailable:
        pytest.skip(f"flashmla: {unavailable}")
    args = GRAPH_REPROS[name]
    chosen = args[args.index("-s") + 1] if "-s" in args else "glm5-fp8-tp8"
    recorded_host_or_skip(target_mib=scenarios.load(chosen).gpu.memory_mib)
    measured = _repro_json(args, tmp_path / f"{name}.json")
    predicted = _repro_json([*args, "--predict"], tmp_path / f"{name}.predicted.json")
    assert measured["measured"] and not predicted["measured"]
    assert prediction_differences(measured, predicted) == []
    for m, p in zip(measured["cases"], predicted["cases"], strict=True):
        assert m["graph_estimate_source"] == p["graph_estimate_source"] == "device"
        assert m["graph_device_bytes"] == p["graph_device_bytes"] is not None, m["path"]


def _both(kernel, scenario, path, sizes):
    import torch

    from mlamem.runtime.measure import local_sm_count
    from mlamem.runtime.memory import CudaMemory, SimulatedMemory

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return [measure_path(memory, scenario, kernel, path, sizes, sm_count=local_sm_count())
            for memory in (CudaMemory(), SimulatedMemory())]


@pytest.mark.parametrize("kernel_name", ["flashmla", "flashmla-vllm"])
@pytest.mark.parametrize("path", ["alloc", "workspace"])
@pytest.mark.parametrize("scenario_name", ["glm5-fp8-tp8", "deepseek-v32-fp8-tp8"])
def test_captures_replay_bit_identically_and_match_the_model(kernel_name, path, scenario_name):
    kernel = kernel_or_skip(kernel_name)
    scenario = scenarios.load(scenario_name)
    measured, predicted = _both(kernel, scenario, path, SIZES)
    assert measured.failure is None, measured.failure
    assert all(c.replay_equal for c in measured.captures)
    differing = [c for c in compare_graphs(scenario.name, measured, predicted) if not c.agrees]
    assert differing == []
    assert measured.pool_bytes == measured.captures[0].pool_growth_bytes > 0


def test_triton_workspace_full_puts_nothing_of_the_call_in_the_pool():
    """Only the first graph's RNG state (two 8 B tensors, one 2 MiB small segment)."""
    kernel = kernel_or_skip("triton")
    measured, predicted = _both(kernel, scenarios.load("glm5-fp8-tp8"), "workspace-full",
                                [512, 8, 1])
    assert all(c.replay_equal for c in measured.captures)
    assert measured.pool_bytes == predicted.pool_bytes == 2 << 20
    assert [c.peak_allocated_bytes for c in measured.captures] == [1024, 0, 0]
