"""CUDA graphs on the CPU: vLLM 0.33.0's capture lists, its estimate rule, and the predicted
pool of the sparse decode across a capture list."""

import dataclasses
import json
from pathlib import Path

import pytest

from mlamem.commands.graphs import (
    MIN_PER_GRAPH_BYTES,
    capture_sizes,
    full_decode_sizes,
    run_graphs,
    sizes_to_capture,
    vllm_estimate,
)
from mlamem.commands.repro import run_repro
from mlamem.commands.validate import compare_graphs
from mlamem.engines.vllm import VLLMBudget
from mlamem.kernels import load_kernel
from mlamem.results.graphs import GraphsFile
from mlamem.spec import gpus
from mlamem.spec import scenario as scenarios
from mlamem.spec.errors import UserError
from mlamem.testing import scenario_as_run

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
    assert capture_sizes(serving(max_num_seqs=1024)) == VLLM_DEFAULT_51
    assert full_decode_sizes(serving(max_num_seqs=1024)) == sorted(VLLM_DEFAULT_51, reverse=True)


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
    names = [b.name for b in alloc.captures[0].buffers]
    assert names[:3] == ["graph_rng_state", "graph_rng_state", "padded_q"]
    assert "padded_q" not in [b.name for b in workspace.captures[0].buffers]
    assert workspace.pool_bytes < alloc.pool_bytes
    allocator, device = alloc.estimates  # the device's as modelled from the host setup
    assert allocator.estimate_bytes == alloc.pool_bytes + 3 * MIN_PER_GRAPH_BYTES
    assert device.first_bytes == alloc.captures[0].pool_growth_bytes + _first_capture_bytes()
    # the process's first capture was the alloc path's: the workspace path's takes nothing more
    assert workspace.captures[0].device_growth_bytes == workspace.captures[0].pool_growth_bytes


def _first_capture_bytes() -> int:
    """The host setup's outside-allocator memory of a process's first CUDA-graph capture."""
    from mlamem.runtime.non_torch import GRAPH_CAPTURE, find_setup

    (module,) = find_setup("flashmla").loaded_by(GRAPH_CAPTURE)
    return module.bytes


GRAPHS_H200 = Path(__file__).parent / "fixtures" / "reports" / "graphs-h200"
ALLOCATOR_FIELDS = ("peak_allocated_bytes", "peak_reserved_bytes", "pool_growth_bytes",
                    "held_bytes", "buffers")


@pytest.mark.parametrize("name", ["graphs-glm5-flashmla.json", "graphs-glm5-flashmla-vllm.json",
                                  "graphs-deepseek-flashmla.json", "graphs-glm5-triton.json"])
def test_prediction_equals_the_h200_captures_to_the_byte(name):
    """reports/graphs-h200 (`python3 scripts/gpu_check.py --suite graphs`): every allocator figure
    of every capture, and each path's pool, predicted here as measured there."""
    measured = GraphsFile.parse(json.loads((GRAPHS_H200 / name).read_text()))
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
        # validate's comparison of a graph path (`validate --graphs`) agrees with this one
        differing = [c for c in compare_graphs(measured.scenario["name"], m, p) if not c.agrees]
        assert not differing, differing


# the Triton kernel's own module, loaded by its first (eager) launch: non_torch.toml has no
# record of Triton's, so the prediction takes FlashMLA's (`assumed`), without it
TRITON_MODULE = {"graphs-glm5-triton.json": {"alloc": 2 * MiB}}
GRAPHS_H200_RUNS = ["graphs-glm5-flashmla.json", "graphs-glm5-flashmla-vllm.json",
                    "graphs-glm5-triton.json", "graphs-deepseek-flashmla.json"]
GRAPH_MEMORY_H200 = Path(__file__).parent / "fixtures" / "reports" / "graph-memory-h200"


@pytest.mark.parametrize("name", GRAPHS_H200_RUNS)
def test_predicted_device_growth_is_the_h200s(name):
    """reports/graphs-h200 (2026-12-03): the device column predicted from the host setup (the
    process's first capture's 70 MiB outside the allocator, the driver's 2 MiB steps at 9, 36
    and 41 live graphs, the first launches' modules) equals the measured one capture by
    capture, and so do each path's device growth and vLLM's device estimate, its actual and
    error; only the Triton alloc path is its kernel's unrecorded module apart."""
    measured = GraphsFile.parse(json.loads((GRAPHS_H200 / name).read_text()))
    predicted = run_graphs(scenarios.load(measured.scenario["name"]),
                           [p.path for p in measured.paths], command="test",
                           kernel=load_kernel(measured.kernel["name"])(),
                           sizes=measured.capture_sizes, predict=True)
    for m, p in zip(measured.paths, predicted.paths, strict=True):
        apart = TRITON_MODULE.get(name, {}).get(m.path, 0)
        assert [mc.device_growth_bytes for mc in m.captures] == [
            pc.device_growth_bytes for pc in p.captures], m.path
        assert m.device_bytes - p.device_bytes == apart, m.path
        assert m.unexplained_device_bytes - p.unexplained_device_bytes == apart, m.path
        m_device, p_device = m.estimates[1], p.estimates[1]
        assert m_device.source == p_device.source == "device"
        assert m_device.estimate_bytes == p_device.estimate_bytes
        assert m_device.actual_bytes - p_device.actual_bytes == apart
        assert p_device.error_bytes - m_device.error_bytes == apart


def test_the_h200_graph_steps_are_at_9_36_and_41_live_graphs_whatever_the_order():
    """reports/graph-memory-h200/graph-captures-flashmla.log (non_torch_probe.py graph-captures
    flashmla, every order with and without a warm-up, a fresh process each): beyond the first
    capture, the device grew outside the pool only at the capture that first brought a pool of
    the process to 9, 36 or 41 live graphs, 2 MiB each, and in this process's own NVML figure
    alike; the data the model charges them from (non_torch.toml) says the same."""
    from mlamem.runtime.non_torch import graph_step_launch, load_setups

    lines = (GRAPH_MEMORY_H200 / "graph-captures-flashmla.log").read_text().splitlines()
    runs = json.loads(lines[-1])["runs"]
    assert len(runs) == 10 and all("records" in run for run in runs)
    for run in runs:
        seen, steps = 0, []
        for record in run["records"]:
            if record.get("freed") or record["captures_in_process"] == 1:
                continue
            beyond = record["device_growth_bytes"] - record["pool_growth_bytes"]
            assert record["process_growth_bytes"] == record["device_growth_bytes"]
            new_high = record["live_graphs"] > seen
            seen = max(seen, record["live_graphs"])
            if beyond:
                assert new_high and beyond == 2 * MiB, (run["order"], record)
                steps.append(record["live_graphs"])
        assert steps == [n for n in (9, 36, 41) if n <= seen], (run["order"], run["warmup"])
    [setup] = [s for s in load_setups() if s.kernel == "flashmla" and s.gpu == "NVIDIA H200"]
    assert [(n, sum(m.bytes for m in setup.loaded_by(graph_step_launch(n))))
            for n in range(1, 52) if setup.loaded_by(graph_step_launch(n))] == [
        (9, 2 * MiB), (36, 2 * MiB), (41, 2 * MiB)]


# reports/graph-memory-h200's measured repro-oom --cuda-graphs on runs: (file, scenario, limits)
H200_GRAPH_REPROS = [("repro-graphs-deepseek.json", "deepseek-v32-fp8-tp8", [37091, 45440]),
                     ("repro-graphs-kimi-k2.json", "kimi-k2-fp8-tp4-dp", [45472, 45472])]


@pytest.mark.parametrize(("name", "scenario", "limits"), H200_GRAPH_REPROS)
def test_repro_with_graphs_predicts_the_h200_run(name, scenario, limits, vllm_cache_as_measured,
                                                 rank_before_stages):
    """reports/graph-memory-h200's `mlamem repro-oom --cuda-graphs on` runs (2026-12-05), each
    case its own process: predicted, every field equals the measured one, vLLM's device estimate
    and the captures' device growth included, and the limits too. Kimi-K2 at 64 heads pads
    nothing, so no fill runs before the graphs: the first capture's RNG prologue loads the
    fill's 28 MiB module, inside vLLM's estimate. The runs predate the rank's stages beyond
    attention, so the rank is predicted as it ran (`rank_before_stages`)."""
    from mlamem.commands.repro import prediction_differences

    measured = json.loads((GRAPH_MEMORY_H200 / name).read_text())
    result = run_repro(scenario_as_run(scenario, measured["budget"]),
                       VLLMBudget(**{k: measured["budget"][k] for k in (
                           "gpu_memory_bytes", "utilization", "max_num_batched_tokens",
                           "cuda_graphs")}),
                       ["alloc", "workspace"], command="test", predict=True)
    predicted = result.file_dict()
    assert prediction_differences(measured, predicted) == []
    for m, p in zip(measured["cases"], predicted["cases"], strict=True):
        assert m["graph_estimate_source"] == p["graph_estimate_source"] == "device"
        assert m["graph_device_bytes"] == p["graph_device_bytes"], m["path"]
    assert [c["max_safe_tokens"] for c in predicted["cases"]] == limits


def test_a_smaller_target_with_graphs_run_without_its_room_differs_only_in_the_limits(
        vllm_cache_as_measured, rank_before_stages):
    """GLM-5's 81559 MiB target, measured with CUDA graphs on the H200 on 2026-12-05 before a
    measured run kept to the target's room (the step's modules took the H200's spare memory):
    every field, the graphs' device figures included, equals the prediction with the target as
    the physical device but the limits, 31744 and 38880, which are above it. The run predates
    the rank's stages beyond attention, predicted as it ran (`rank_before_stages`), and
    glm5-fp8-tp8's max_num_seqs 256 (vLLM's default 1024 then)."""
    from mlamem.commands.repro import prediction_differences

    measured = json.loads((GRAPH_MEMORY_H200 / "repro-graphs-glm5.json").read_text())
    glm = scenario_as_run("glm5-fp8-tp8", measured["budget"])
    glm = dataclasses.replace(glm, sections={"vllm": dataclasses.replace(glm.section("vllm"),
                                                                         max_num_seqs=1024)})
    predicted = run_repro(glm,
                          VLLMBudget(**{k: measured["budget"][k] for k in (
                              "gpu_memory_bytes", "utilization", "max_num_batched_tokens",
                              "cuda_graphs")}),
                          ["alloc", "workspace"], command="test", predict=True).file_dict()
    differences = prediction_differences(measured, predicted)
    assert [d.split(": ")[:2] for d in differences] == [["alloc", "max_safe_tokens"],
                                                       ["workspace", "max_safe_tokens"]]
    assert [c["max_safe_tokens"] for c in measured["cases"]] == [31744, 38880]
    for was, case in zip(measured["cases"], predicted["cases"], strict=True):
        assert case["max_safe_tokens"] < was["max_safe_tokens"]


def test_a_capture_that_runs_out_of_memory_is_an_oom_verdict_in_phase_capture():
    """An engine that leaves the graphs nothing (its KV cache takes all but the metadata
    builders' buffers allocated after it and 1 MiB under the cap) gets `oom` in phase
    `capture`, with the buffer the capture could not place."""
    from mlamem.engines.vllm import VLLM
    from mlamem.runtime.memory import SimulatedMemory
    from mlamem.spec.engines.vllm_pass import after_kv_buffers

    class NoRoomForGraphs(VLLM):
        def size_kv_cache(self) -> int:
            used = self.memory.stats().reserved
            kept = after_kv_buffers(self.scenario, self.budget.max_num_batched_tokens).nbytes
            return self.case.torch_limit_bytes - used - kept - MiB

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
    seen = []
    result = run_graphs(glm, ["alloc"], command="test", sizes=[8, 1], predict=True,
                        on_capture=lambda path, capture: seen.append(capture))
    first = seen[0]
    assert first.call is not None and first.call.failure is None
    assert first.peak_allocated_bytes == first.call.peak_allocated_bytes
    assert result.paths[0].captures[0].peak_allocated_bytes == first.peak_allocated_bytes
    saved = result.file_dict()
    assert all("call" not in c for c in saved["paths"][0]["captures"])
    assert GraphsFile.parse(json.loads(json.dumps(saved))).file_dict() == saved


def _setup_note(result) -> str:
    """The predicted result's note naming the non-torch record it modelled the device on."""
    (note,) = [n for n in result.notes if n.startswith("device growth predicted")]
    return note


def test_an_h100_scenario_is_predicted_on_the_h100_record():
    """GLM-5 targets the H100 (81079 MiB): its graphs are modelled on the H100's own record, the
    target as the physical device (repro-oom's `host_setup`), not the H200's."""
    glm = scenarios.load("glm5-fp8-tp8")
    assert glm.gpu.name == "H100 SXM 80GB"
    note = _setup_note(run_graphs(glm, ["alloc"], command="test", sizes=[8, 1], predict=True))
    assert "NVIDIA H100 80GB HBM3, torch" in note
    assert "NVIDIA H200, torch" not in note and "assumed" not in note


def test_an_h200_scenario_is_predicted_on_the_h200_record():
    deepseek = scenarios.load("deepseek-v32-fp8-tp8")
    note = _setup_note(run_graphs(deepseek, ["alloc"], command="test", sizes=[8, 1],
                                  predict=True))
    assert "NVIDIA H200, torch" in note
    assert "H100" not in note and "assumed" not in note


@pytest.mark.parametrize(("gpu", "nearest"), [("H20", "NVIDIA H100 80GB HBM3"),
                                              ("H20 141GB", "NVIDIA H200")])
def test_a_gpu_without_a_record_names_the_nearest(gpu, nearest):
    """`--gpu H20` (97871 MiB): no record of its own, so the nearest by memory stands in, with
    the H20's memory as the physical device, and the note says which."""
    glm = gpus.retarget(scenarios.load("glm5-fp8-tp8"), gpu)
    note = _setup_note(run_graphs(glm, ["alloc"], command="test", sizes=[8, 1], predict=True))
    assert f"{nearest}, torch" in note
    assert f"no record of the {gpu}'s" in note and f"the nearest record, the {nearest}'s" in note


def test_the_predicted_table_says_the_target_gpu_is_modelled():
    """The table's label: the device column is the target GPU's (its record), not this host's."""
    from mlamem import render

    result = run_graphs(scenarios.load("glm5-fp8-tp8"), ["alloc"], command="test", sizes=[8, 1],
                        predict=True)
    text = render.graphs_markdown(result)
    assert "+ the target GPU's non-torch memory" in text
    assert "the host's non-torch memory" not in text


def test_a_neighbours_free_between_two_device_reads_is_a_negative_growth_not_a_traceback():
    """`mem_get_info` is device-wide: another process freeing 2 GiB between a capture's two reads
    makes its growth, and the device rule's estimate, negative (seen on an H100 beside the noisy
    neighbour). The file still validates and reads back."""
    path = Path(__file__).parent.parent / "reports" / "graphs-h200" / "graphs-glm5-flashmla.json"
    data = json.loads(path.read_text())
    capture = data["paths"][0]["captures"][2]
    capture["device_growth_bytes"] = -(2 << 30)
    device = [c["device_growth_bytes"] for c in data["paths"][0]["captures"][:2]]
    estimate = vllm_estimate("device", [-(2 << 30), *device[1:]], actual=-(1 << 30), graphs=51)
    data["paths"][0]["estimates"] = [dataclasses.asdict(estimate)]
    data["paths"][0]["device_bytes"] = -(1 << 30)
    parsed = GraphsFile.parse(data)
    assert parsed.paths[0].captures[2].device_growth_bytes == -(2 << 30)
    assert parsed.paths[0].estimates[0].first_bytes == -(2 << 30)
