"""CUDA graphs on the CPU: vLLM 0.33.0's capture lists, its estimate rule, and the predicted
pool of the sparse decode across a capture list."""

import dataclasses
import json
from pathlib import Path

import pytest

from mlamem import scenario as scenarios
from mlamem.engines.vllm import VLLMBudget
from mlamem.errors import UserError
from mlamem.graphs import (
    MIN_PER_GRAPH_BYTES,
    GraphsResult,
    capture_sizes,
    full_decode_sizes,
    run_graphs,
    sizes_to_capture,
    vllm_estimate,
)
from mlamem.kernels import load_kernel
from mlamem.repro import run_repro

MiB = 1 << 20
VLLM_DEFAULT_51 = [1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)]


def serving(**fields):
    """GLM-5 with these [serving] and [vllm] fields (the rules read both)."""
    glm = scenarios.load("glm5-fp8-tp8")
    vllm = {k: fields.pop(k) for k in list(fields) if k not in ("max_num_batched_tokens",)}
    return dataclasses.replace(glm, serving=dataclasses.replace(glm.serving, **fields),
                               sections={"vllm": dataclasses.replace(glm.section("vllm"), **vllm)})


def test_default_list_is_vllms_51_sizes_largest_first():
    """max_num_seqs 1024 (vllm serve on an 80 GiB GPU): max min(1024 x 2, 512) = 512."""
    assert capture_sizes(serving()) == VLLM_DEFAULT_51
    assert full_decode_sizes(serving()) == sorted(VLLM_DEFAULT_51, reverse=True)


def test_full_decode_graphs_stop_at_max_num_seqs():
    """At max_num_seqs 256 the list still reaches 512 (PIECEWISE) but FULL decode graphs
    hold at most 256 requests: 35 of them."""
    assert capture_sizes(serving(max_num_seqs=256)) == VLLM_DEFAULT_51
    full = full_decode_sizes(serving(max_num_seqs=256))
    assert len(full) == 35 and full[0] == 256 and full[-1] == 1


def test_small_max_num_seqs_adds_itself_and_caps_the_list():
    """max_num_seqs 100: max = 200, and 100 (a uniform decode size) joins the list."""
    sizes = capture_sizes(serving(max_num_seqs=100))
    assert sizes[-1] == 200 and 100 in sizes and 104 in sizes
    assert full_decode_sizes(serving(max_num_seqs=100))[0] == 100


def test_speculative_tokens_round_full_graphs_to_whole_requests():
    """k = 1 (MTP): FULL decode graphs hold whole requests of 2 tokens (vLLM V2 rounds up)."""
    full = full_decode_sizes(serving(max_num_seqs=256, num_speculative_tokens=1))
    assert all(size % 2 == 0 for size in full) and full[0] == 512 and full[-1] == 2


def test_explicit_max_capture_size_and_max_num_batched_tokens_cap_the_list():
    assert capture_sizes(serving(max_cudagraph_capture_size=64))[-1] == 64
    assert capture_sizes(serving(max_num_batched_tokens=100)) == [
        1, 2, 4, *range(8, 100, 8), 100]


def test_modes_without_full_graphs_capture_no_attention():
    for mode in ("PIECEWISE", "NONE"):
        piecewise = serving(cudagraph_mode=mode)
        assert full_decode_sizes(piecewise) == []
        with pytest.raises(UserError, match="no CUDA graph"):
            sizes_to_capture(piecewise, None)


def test_capture_sizes_outside_the_workspace_are_refused():
    with pytest.raises(UserError, match="1 to 32768"):
        sizes_to_capture(scenarios.load("glm5-fp8-tp8"), [40000])
    assert sizes_to_capture(scenarios.load("glm5-fp8-tp8"), [1, 512, 8]) == [512, 8, 1]


def test_vllm_rule_floors_the_second_capture_at_one_mib():
    estimate = vllm_estimate("allocator", [200 * MiB, 0], actual=200 * MiB, graphs=51)
    assert estimate.per_graph_bytes == MIN_PER_GRAPH_BYTES
    assert estimate.estimate_bytes == 250 * MiB and estimate.error_bytes == 50 * MiB
    assert estimate.error_percent == 25.0
    larger = vllm_estimate("device", [300 * MiB, 2 * MiB], actual=400 * MiB, graphs=51)
    assert larger.estimate_bytes == 400 * MiB and larger.error_bytes == 0


def test_predicted_pool_is_the_largest_capture_not_the_sum():
    """Outputs held only weakly: every later capture fits the first one's blocks."""
    glm = scenarios.load("glm5-fp8-tp8")
    result = run_graphs(glm, ["alloc", "workspace"], command="test", sizes=[512, 256, 8, 1],
                        predict=True)
    alloc, workspace = result.paths
    assert not result.measured and result.capture_sizes == [512, 256, 8, 1]
    assert [c.pool_growth_bytes for c in alloc.captures[1:]] == [0, 0, 0]
    assert alloc.pool_bytes == alloc.captures[0].pool_growth_bytes
    assert alloc.held_bytes == 1024  # the first graph's RNG seed and offset, 2 x 512 B blocks
    names = [b["name"] for b in alloc.captures[0].buffers]
    assert names[:3] == ["graph_rng_state", "graph_rng_state", "padded_q"]
    assert "padded_q" not in [b["name"] for b in workspace.captures[0].buffers]
    assert workspace.pool_bytes < alloc.pool_bytes
    (estimate,) = alloc.estimates  # predicted: the allocator's figures only
    assert estimate.estimate_bytes == alloc.pool_bytes + 3 * MIN_PER_GRAPH_BYTES


GRAPHS_H200 = Path(__file__).parent / "fixtures" / "reports" / "graphs-h200"
ALLOCATOR_FIELDS = ("peak_allocated_bytes", "peak_reserved_bytes", "pool_growth_bytes",
                    "held_bytes", "buffers")


@pytest.mark.parametrize("name", ["graphs-glm5-flashmla.json", "graphs-glm5-flashmla-vllm.json",
                                  "graphs-deepseek-flashmla.json", "graphs-glm5-triton.json"])
def test_prediction_equals_the_h200_captures_to_the_byte(name):
    """reports/graphs-h200 (`python3 scripts/gpu_check.py --suite graphs`): every allocator figure
    of every capture, and each path's pool, predicted here as measured there."""
    measured = GraphsResult.from_dict(json.loads((GRAPHS_H200 / name).read_text()))
    assert measured.measured and all(c.replay_equal for p in measured.paths for c in p.captures)
    predicted = run_graphs(scenarios.load(measured.scenario["name"]),
                           [p.path for p in measured.paths], command="test",
                           kernel=load_kernel(measured.kernel["name"])(),
                           sizes=measured.capture_sizes, predict=True)
    for m, p in zip(measured.paths, predicted.paths, strict=True):
        assert (m.pool_bytes, m.held_bytes) == (p.pool_bytes, p.held_bytes)
        assert m.estimates[0] == p.estimates[0]  # vLLM's rule on the allocator's figures
        for mc, pc in zip(m.captures, p.captures, strict=True):
            assert [getattr(mc, f) for f in ALLOCATOR_FIELDS] == [
                getattr(pc, f) for f in ALLOCATOR_FIELDS], (m.path, mc.tokens)


def test_repro_with_graphs_predicts_the_h200_pool_and_verdicts():
    """The measured repro-oom --cuda-graphs on: the model gives the same verdicts, captures
    and pool; the estimate differs by what the device took outside the allocator."""
    measured = json.loads((GRAPHS_H200 / "repro-graphs-glm5.json").read_text())
    result = run_repro(scenarios.load("glm5-fp8-tp8"),
                       VLLMBudget(**{k: measured["budget"][k] for k in (
                           "gpu_memory_bytes", "utilization", "max_num_batched_tokens",
                           "cuda_graphs")}),
                       ["alloc", "workspace"], command="test", predict=True)
    for m, p in zip(measured["cases"], result.to_dict()["cases"], strict=True):
        for field in ("verdict", "phase", "oom_buffer", "graph_captures", "graph_pool_bytes"):
            assert m[field] == p[field], (m["path"], field)
        assert m["graph_estimate_source"] == "device" and p["graph_estimate_source"] == "allocator"
        assert m["graph_estimate_bytes"] > p["graph_estimate_bytes"]


def test_a_capture_that_runs_out_of_memory_is_an_oom_verdict_in_phase_capture():
    """An engine that leaves the graphs nothing (its KV cache takes all but 1 MiB under the
    cap) gets `oom` in phase `capture`, with the buffer the capture could not place."""
    from mlamem.engines.vllm import VLLM
    from mlamem.memory import SimulatedMemory

    class NoRoomForGraphs(VLLM):
        def size_kv_cache(self) -> int:
            used = self.memory.stats().reserved
            return self.case.torch_limit_bytes - used - MiB

    glm = scenarios.load("glm5-fp8-tp8")
    budget = VLLMBudget(glm.gpu.memory_bytes, glm.gpu.gpu_memory_utilization, 32768,
                    cuda_graphs=True)
    case = NoRoomForGraphs.emulate(SimulatedMemory(), glm, load_kernel("flashmla")(), budget,
                                   "alloc", sm_count=132).to_dict()
    assert (case["verdict"], case["phase"]) == ("oom", "capture")
    assert case["oom_buffer"] == "padded_q" and case["oom_allocated_by"] == "wrapper"
    assert case["graph_captures"] == 0 and case["free_bytes_at_oom"] < 20 * MiB


def test_a_capture_embeds_its_record_and_saves_without_it():
    """Each capture carries the measure function's record; the saved result does not."""
    glm = scenarios.load("glm5-fp8-tp8")
    result = run_graphs(glm, ["alloc"], command="test", sizes=[8, 1], predict=True)
    first = result.paths[0].captures[0]
    assert first.call is not None and first.call.failure is None
    assert first.peak_allocated_bytes == first.call.peak_allocated_bytes
    saved = result.to_dict()
    assert all("call" not in c for c in saved["paths"][0]["captures"])
    assert GraphsResult.from_dict(json.loads(json.dumps(saved))).to_dict() == saved
