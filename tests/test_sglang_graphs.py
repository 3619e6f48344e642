"""SGLang's decode CUDA graphs (mlamem/engines/sglang.py, capture phase) on the allocator model:
the capture list against derivations by hand from SGLang 0.5.23's source
(arg_groups/cuda_graph_hook.py, generate_decode_cuda_graph_batch_sizes;
model_executor/runner/base_cuda_graph_runner.py, get_batch_sizes_to_capture;
mem_cache/kv_cache_configurator.py, resolve_max_num_reqs), the pool the captures take, and a
capture that runs out of memory."""

import json

import pytest

from mlamem.cli import main
from mlamem.commands.repro import host_setup
from mlamem.engines.sglang import SGLang, SGLangBudget
from mlamem.kernels import FlashMLA
from mlamem.runtime.memory import SimulatedMemory
from mlamem.spec import scenario as scenarios
from mlamem.spec.engines import sglang as rules
from mlamem.spec.errors import UserError
from mlamem.testing import scenario_file

MiB = 1 << 20
# the decode list for max_bs 512 without speculation, by hand from the source's ranges, largest
# first: [1, 2, 4, 8, 12] + range(16, 257, 8) + range(272, 512, 16) + range(512, 513, 32)
DEFAULT_512 = [512, *range(496, 271, -16), *range(256, 15, -8), 12, 8, 4, 2, 1]


def emulate(scenario, path: str, *, fraction: float | None = None, graphs: bool = True) -> dict:
    budget = SGLangBudget(gpu_memory_bytes=scenario.gpu.memory_bytes,
                          utilization=scenario.gpu.gpu_memory_utilization,
                          max_num_batched_tokens=SGLang.default_step_tokens(
                              scenario, scenario.gpu.memory_bytes),
                          mem_fraction_static=fraction, cuda_graphs=graphs)
    memory = SimulatedMemory(non_torch=host_setup("flashmla", predict=True,
                                                  target_bytes=scenario.gpu.memory_bytes))
    return SGLang.emulate(memory, scenario, FlashMLA(), budget, path, sm_count=132).to_dict()


def logits_bytes(case: dict) -> int:
    """The step's indexer logits chunk, as requested."""
    return next(b["requested_bytes"] for b in case["buffers"] if b["name"] == "indexer.logits")


def segments_bytes(case: dict) -> int:
    """The segments the case's buffers opened."""
    return sum(b["segment_bytes"] for b in case["buffers"])


def test_glm5_default_list_is_sglangs_for_max_bs_512():
    """GLM-5 TP8 on an H100: max_bs 512 (the H100 row at TP >= 4); the request pool is
    min(max(min(tokens / 131072 x 512, 4096), 2048), tokens // 2) = 2048 here, so the 52 sizes
    all stay, captured largest first at one token per request."""
    case = emulate(scenarios.load("glm5-fp8-tp8"), "alloc")
    assert len(DEFAULT_512) == 52
    assert case["graph_batch_sizes"] == DEFAULT_512
    assert case["graph_tokens_per_request"] == 1
    expected_pool = max(min(int(case["kv_cache_tokens"] / 131072 * 512), 4096), 2048)
    assert case["graph_request_pool"] == expected_pool == 2048
    assert case["graph_captures"] == 52


def test_max_running_requests_caps_the_list_and_the_pool(tmp_path):
    """--max-running-requests 100: handle_gpu_memory_settings caps the default max_bs 512 to
    100; the list is [1, 2, 4, 8, 12] + range(16, 101, 8) = ..., 96, and 100 appended as max_bs;
    the request pool is min(100 // 1, tokens // 2) = 100, so nothing is added or dropped."""
    path = scenario_file(tmp_path, edits={
        "\n[gpu]": "\n[sglang]\nmax_running_requests = 100\n\n[gpu]"})
    case = emulate(scenarios.load(str(path)), "alloc")
    assert case["graph_batch_sizes"] == [100, *range(96, 15, -8), 12, 8, 4, 2, 1]
    assert case["graph_request_pool"] == 100 and case["graph_captures"] == 17
    assert "capped by max_running_requests" in case["graph_list_source"]


def test_attention_dp_aligns_and_speculation_multiplies():
    """TP8 with attention DP 4: the graphs need a gathered buffer, so the alignment is the
    attention-TP size 8 // 4 = 2. --max-running-requests 200 is 50 per worker; max_bs 64 lists
    [1, 2, 4, 8, 12, 16, 24, ..., 64]; 64 > 50 adds 50 (already even); only sizes within 50 whose
    tokens are even stay: 1 goes. Under speculation with 3 draft tokens the speculative list
    1..8, 10..32 by 2, 40..64 by 4 keeps the even ones (bs x 3 even)."""
    alignment = rules.graph_alignment(8, 4)
    requests = rules.max_num_reqs(10**6, 131072, 200, 4)
    assert (alignment, requests) == (2, 50)
    assert rules.decode_capture_batches(64, requests, alignment=alignment) == [
        50, 48, 40, 32, 24, 16, 12, 8, 4, 2]
    speculative = rules.decode_capture_batches(64, requests, speculative=True,
                                               tokens_per_request=3, alignment=alignment)
    assert speculative == [50, 48, 44, 40, 32, 30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6,
                           4, 2]
    assert rules.graph_alignment(8, 1) == rules.graph_alignment(8, 8) == 1
    given = rules.decode_capture_batches(512, 2048, given=(160, 1, 8))
    assert given == [160, 8, 1]


@pytest.mark.parametrize("name", ["glm5-fp8-tp8", "deepseek-v32-fp8-tp8"])
def test_predicted_repro_oom_with_graphs_at_the_defaults(name, tmp_path):
    """`repro-oom --engine sglang --cuda-graphs on --predict` at the scenario's defaults: both
    paths fit, the KV pool is the one without graphs (they come after it), and the alloc path's
    pool is the largest capture's segments, by hand at 512 tokens and 64 padded heads: padded_q
    512 x 64 x 576 x 2 B = 36 MiB, out 512 x 64 x 512 x 2 = 32 MiB, o_accum 2 x 512 x 64 x 512 x
    4 = 128 MiB, one 2 MiB segment for lse, lse_accum and the metadata, and the RNG state's 2 MiB
    segment on the capture stream: 200 MiB; the smaller captures reuse it. The pool stays
    under the step: its peak grows by the pool, less the segments the step's smaller indexer
    logits chunk gives back."""
    output = tmp_path / "sg.json"
    assert main(["repro-oom", "-s", name, "--engine", "sglang", "--cuda-graphs", "on",
                 "--predict", "--format", "json", "--output", str(output)]) == 0
    result = json.loads(output.read_text())
    assert result["budget"]["cuda_graphs"] is True
    alloc, workspace = result["cases"]
    off = emulate(scenarios.load(name), "alloc", graphs=False)
    assert not any(k.startswith("graph_") for k in off)  # graphs off: the case as it read
    for case in (alloc, workspace):
        assert case["verdict"] == "fits" and case["phase"] == "done"
        for field in ("graph_list_source", "graph_batch_sizes", "graph_tokens_per_request",
                      "graph_request_pool", "graph_input_bytes", "graph_captures",
                      "graph_pool_bytes"):
            assert case[field] is not None, field
        # the device, modelled: the pool, the 70 MiB of the process's first capture, the
        # 62 + 28 MiB modules the first warm-up's fill and decode load (non_torch.toml), since
        # SGLang runs no kernel before its graphs, and the driver's 2 MiB at 9, 36 and 41 live
        # graphs
        assert case["graph_device_bytes"] == case["graph_pool_bytes"] + (70 + 62 + 28 + 6) * MiB
        assert case["max_safe_tokens"] > 0 and 0 < case["max_safe_mem_fraction_static"] < 1
    assert alloc["kv_cache_bytes"] == off["kv_cache_bytes"]
    assert alloc["graph_pool_bytes"] == (36 + 32 + 128 + 2 + 2) * MiB
    # the pool stays under the step, whose own segments differ: the indexer's logits chunk is
    # smaller (its budget, 20% of what is free at the step, lost the graphs': SGLang 0.5.23
    # layers/attention/mqa_logits_utils.py, mqa_logits_budget_bytes), and on DeepSeek-V3.2 the
    # allocator places the shared expert's 20 MiB activation in a segment of its own
    assert logits_bytes(alloc) < logits_bytes(off)
    assert (alloc["step_peak_bytes"] - off["step_peak_bytes"]
            == alloc["graph_pool_bytes"] + segments_bytes(alloc) - segments_bytes(off))
    assert alloc["headroom_bytes"] < off["headroom_bytes"]
    assert any(n.startswith("alloc: CUDA graphs: 52 decode graphs") for n in result["notes"])


def test_a_capture_oom_names_the_fraction_that_holds(capsys):
    """At mem_fraction_static 0.997 the pool leaves the graphs too little: the case is an OOM
    in phase capture, at the first graph (512: with the H100 target as the physical device;
    the H200's spare memory held one graph); its largest safe fraction F, re-run on the model,
    fits, and F + 0.001 does not."""
    glm = scenarios.load("glm5-fp8-tp8")
    assert main(["repro-oom", "--engine", "sglang", "--cuda-graphs", "on", "--predict",
                 "--mem-fraction-static", "0.997", "--paths", "alloc", "--format", "json"]) == 0
    [case] = json.loads(capsys.readouterr().out)["cases"]
    assert (case["verdict"], case["phase"]) == ("oom", "capture")
    assert case["graph_failed_batch_size"] == 512 and case["graph_captures"] == 0
    assert case["graph_pool_bytes"] is None and case["oom_allocated_by"] == "kernel"
    fraction = case["max_safe_mem_fraction_static"]
    assert 0.9 < fraction < 0.997
    assert emulate(glm, "alloc", fraction=fraction)["verdict"] == "fits"
    assert emulate(glm, "alloc", fraction=round(fraction + 0.001, 3))["verdict"] == "oom"
    assert main(["repro-oom", "--engine", "sglang", "--cuda-graphs", "on", "--predict",
                 "--mem-fraction-static", "0.997", "--paths", "alloc"]) == 0
    table = capsys.readouterr().out
    assert "alloc: OOM at CUDA-graph capture: o_accum" in table
    assert f"the largest that holds: {fraction:.3f}" in " ".join(table.split())
    assert main(["repro-oom", "--engine", "sglang", "--cuda-graphs", "on", "--predict",
                 "--mem-fraction-static", "0.997", "--paths", "alloc",
                 "--format", "markdown"]) == 0
    assert "| alloc | OOM at CUDA-graph capture: o_accum" in capsys.readouterr().out


def test_the_graphs_tables_fields_are_checked(tmp_path):
    """[sglang].cuda_graph_bs takes a list of positive batch sizes; other values are one line."""
    good = scenario_file(tmp_path, edits={
        "\n[gpu]": "\n[sglang]\ncuda_graph_bs = [1, 8, 160]\n\n[gpu]"})
    assert scenarios.load(str(good)).section("sglang").cuda_graph_bs == (1, 8, 160)
    assert scenarios.load(str(good)).section("sglang").decode_max_bs == 160
    bad = tmp_path / "bad"
    bad.mkdir()
    path = scenario_file(bad, edits={"\n[gpu]": "\n[sglang]\ncuda_graph_bs = [0, 8]\n\n[gpu]"})
    with pytest.raises(UserError, match="cuda_graph_bs"):
        scenarios.load(str(path))
