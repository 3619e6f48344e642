"""CUDA graphs on a GPU: every capture replays bit for bit, and the allocator model predicts
each capture's figures to the byte."""

import pytest

from mlamem import scenario as scenarios
from mlamem.graphs import measure_path
from mlamem.testing import kernel_or_skip
from mlamem.validate import compare_graphs

SIZES = [512, 496, 256, 8, 1]


def _both(kernel, scenario, path, sizes):
    import torch

    from mlamem.measure import local_sm_count
    from mlamem.memory import CudaMemory, SimulatedMemory

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
    assert measured.complete, measured.failure
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
