"""mlamem plan: the context-MLA reserve arithmetic, worked by hand, and the CLI surface."""

import json

import pytest

from mlamem.cli import main
from mlamem.commands import plan as plans
from mlamem.spec import scenario as scenarios
from mlamem.testing import check_bad_input

GiB = 1024**3


@pytest.fixture(scope="module")
def kimi():
    return scenarios.load("kimi-k2-context-reuse")


def test_kimi_per_token_figures(kimi):
    """Kimi-K2 TP4 attention-DP: k = 61 x 576, w = 64 x 320 x 1 B, BF16 gather 64 x 448 x 2 B."""
    assert plans.kv_bytes_per_token(kimi) == 35_136
    assert plans.staging_bytes_per_token(kimi) == 20_480
    assert plans.gather_bytes_per_token(kimi) == 57_344


def test_memory_constrained_pool_is_budget_over_k_plus_w():
    """When w x L_cap exceeds budget x w/(k+w), the pool keeps budget/(k+w) tokens: -36.8%."""
    budget, k, w = 10 * GiB, 35_136, 20_480
    without = budget // k
    r = plans.reserve(budget, k, w, l_cap=16 * 32768, applies=True, pool_without=without)
    # worst case w x L_cap = 20,480 x 524,288 = 10 GiB, above the clamp
    # 10,737,418,240 x 20,480 / 55,616 = 3,953,939,973.3
    assert r.clamped and r.reserve_bytes == 3_953_939_973
    # (10,737,418,240 - 3,953,939,973) / 35,136 = 6,783,478,267 / 35,136 = 193,063.5 tokens,
    # which is budget / (k + w) = 193,063.5: the pool and the reserve share the budget as k : w
    assert r.pool_tokens == 193_063
    assert r.admission_cap_tokens == 193_063  # 3,953,939,973 / 20,480 = 193,063.5
    # against 10,737,418,240 / 35,136 = 305,595 tokens without a reserve: k/(k+w) - 1 = -36.82 %
    assert without == 305_595
    assert r.capacity_change_percent == pytest.approx(100 * (193_063 / 305_595 - 1))
    assert r.capacity_change_percent == pytest.approx(-36.8, abs=0.05)


def test_worst_case_fits_reserves_w_times_l_cap():
    """With room to spare the reserve is exactly w x L_cap and the cap is L_cap."""
    r = plans.reserve(100 * GiB, 35_136, 20_480, l_cap=4 * 8192, applies=True,
                      pool_without=100 * GiB // 35_136)
    assert not r.clamped and r.reserve_bytes == 20_480 * 32768
    assert r.admission_cap_tokens == 32768


@pytest.mark.parametrize(("reuse", "chunked", "on"), [(True, False, True), (True, True, False),
                                                     (False, False, False), (False, True, False)])
def test_gate_only_with_reuse_and_without_chunked_prefill(kimi, reuse, chunked, on):
    """The reserve applies only with block reuse on and chunked prefill off; else the pool is whole."""
    plan = plans.make_plan(kimi, plans.request_for(kimi, block_reuse=reuse,
                                                   chunked_prefill=chunked))
    assert plan.gate_on is on
    if not on:
        assert plan.fp8_reserve.reserve_bytes == 0 and plan.fp8_reserve.admission_cap_tokens is None
        assert plan.fp8_reserve.pool_tokens == plan.pool_tokens_without_reserve


def test_admission_cap_keeps_at_least_one_request():
    """Requests are admitted in order while the sum fits; the first always is."""
    assert plans.admit([40_000, 10, 10], cap_tokens=1000) == ([0], [1, 2])
    assert plans.admit([300, 300, 300, 300], cap_tokens=700) == ([0, 1], [2, 3])
    assert plans.admit([300, 300], cap_tokens=None) == ([0, 1], [])
    assert plans.admit([5], cap_tokens=0) == ([0], [])


def test_glm_prefill_workspace_at_786432():
    """vLLM's bf16 prefill workspace for GLM at max_model_len 786432: 4.22 GiB per rank."""
    glm = scenarios.load("glm5-fp8-tp8")
    nbytes = plans.prefill_workspace_bytes(glm, 786_432)
    assert nbytes == 5 * 786_432 * 576 * 2 and round(nbytes / GiB, 2) == 4.22


def test_glm_vllm_side_uses_the_allocator_model():
    """The per-call needs are the profile's predicted peaks; alloc exceeds the 0.85 headroom."""
    glm = scenarios.load("glm5-fp8-tp8")
    vllm = plans.make_plan(glm, plans.request_for(glm)).vllm
    assert vllm.per_call_need_bytes["alloc"] == 13_178_504_192  # 12.273 GiB, as measured
    assert vllm.per_call_fits == {"alloc": False, "workspace": True}


def test_vllm_side_with_vllms_own_build_stages_out(capsys):
    """--kernel flashmla-vllm: the workspace path's per-call need drops by the staged out, to the
    vLLM PR's after figure (8.023 GiB at 32768 tokens, the H200's measurement)."""
    needs = {}
    for kernel in ("flashmla", "flashmla-vllm"):
        assert main(["plan", "--kernel", kernel, "--format", "json"]) == 0
        vllm = json.loads(capsys.readouterr().out)["plans"][0]["vllm"]
        assert vllm["kernel"] == kernel
        needs[kernel] = vllm["per_call_need_bytes"]
    assert needs["flashmla-vllm"]["workspace"] == 8615101440
    assert needs["flashmla"]["workspace"] - needs["flashmla-vllm"]["workspace"] == 2 * 1024**3
    assert needs["flashmla"]["alloc"] == needs["flashmla-vllm"]["alloc"]


def test_cli_json_and_sweep(capsys):
    """--sweep gives one plan per value; JSON follows mlamem.plan/1."""
    assert main(["plan", "-s", "kimi-k2-context-reuse", "--sweep",
                 "max-seq-len=32768,131072", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["schema"] == "mlamem.plan/1" and data["sweep"]["values"] == [32768, 131072]
    assert [p["kv_len_cap_tokens"] for p in data["plans"]] == [16 * 32768, 16 * 131072]



SPARSE = [name for name in scenarios.shipped_names() if scenarios.load(name).model.index_topk]


def _plan_json(args, capsys) -> dict:
    capsys.readouterr()
    assert main(["plan", *args, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("name", SPARSE)
def test_plan_engine_sglang_on_every_sparse_scenario(name, capsys):
    """`plan --engine sglang` gives each path's largest safe chunked_prefill_size with the
    derived mem_fraction_static pinned, the largest given alone (SGLang re-derives the fraction
    from it) and the largest mem_fraction_static at SGLang's default chunk, and each holds as a
    bound: the rank fits at it and not one step above (thousandths; one token); a scenario that
    does not declare SGLang is one line."""
    import dataclasses

    from mlamem.commands.repro import host_setup
    from mlamem.engines.sglang import SGLang
    from mlamem.kernels import load_kernel
    from mlamem.runtime.memory import SimulatedMemory

    scenario = scenarios.load(name)
    if "sglang" not in scenario.engines:
        capsys.readouterr()
        assert main(["plan", "-s", name, "--engine", "sglang"]) == 2
        assert "not sglang" in capsys.readouterr().err
        return
    limits = _plan_json(["-s", name, "--engine", "sglang"], capsys)["plans"][0]["engine_limits"]
    gpu_bytes = scenario.gpu.memory_bytes
    assert limits["step_knob"] == "chunked_prefill_size"
    assert limits["step_tokens"] == SGLang.default_step_tokens(scenario, gpu_bytes)
    kernel = load_kernel("flashmla")()
    start = SGLang.make_budget(gpu_memory_bytes=gpu_bytes, utilization=0.9,
                               max_num_batched_tokens=limits["step_tokens"])

    def verdict(path, **knobs):
        memory = SimulatedMemory(non_torch=host_setup("flashmla", predict=True,
                                                      target_bytes=gpu_bytes))
        return SGLang.emulate(memory, scenario, kernel, dataclasses.replace(start, **knobs), path,
                              sm_count=scenario.gpu.sm_count).to_dict()["verdict"]

    assert [c["case"] for c in limits["cases"]] == ["alloc", "workspace"]
    for case in limits["cases"]:
        tokens, fraction = case["max_safe_tokens"], case["max_safe_fraction"]
        pinned, alone = case["fraction"], case["max_safe_tokens_rederived"]
        assert pinned == SGLang.pinned(start, {"fraction_source": "reserve rule",
                                               "mem_fraction_static": pinned}).mem_fraction_static
        assert verdict(case["case"], max_num_batched_tokens=tokens, mem_fraction_static=pinned) \
            == "fits"
        assert verdict(case["case"], max_num_batched_tokens=tokens + 1,
                       mem_fraction_static=pinned) == "oom"
        assert verdict(case["case"], max_num_batched_tokens=alone) == "fits"
        assert verdict(case["case"], max_num_batched_tokens=alone + 1) != "fits"
        assert verdict(case["case"], mem_fraction_static=fraction) == "fits"
        assert verdict(case["case"], mem_fraction_static=round(fraction + 0.001, 3)) == "oom"


def test_plan_engine_vllm_gives_repro_oom_limits(capsys):
    """At GLM-5's defaults, vLLM's largest safe max_num_batched_tokens per path are
    repro-oom's (31488 and 38257 with the DSA layer's attention locals, as an H100 measured
    them); the alloc path runs out of memory at the default 32768."""
    limits = _plan_json(["--engine", "vllm"], capsys)["plans"][0]["engine_limits"]
    assert [(c["case"], c["verdict"], c["max_safe_tokens"], c["max_safe_fraction"])
            for c in limits["cases"]] == [("alloc", "oom", 31488, None),
                                          ("workspace", "fits", 38257, None)]


def test_plan_engine_in_every_format_and_a_sweep(capsys):
    """The engine's limits show in the table and Markdown, per swept value in a sweep's notes,
    and the step tokens a sweep of max-num-tokens gives are the engine's start."""
    capsys.readouterr()
    assert main(["plan", "--engine", "sglang"]) == 0
    text = capsys.readouterr().out
    words = text.split()
    assert "--mem-fraction-static" in words and words.count("sglang:") == 2
    # each largest safe knob with the one it holds with, as SGLang's flags
    assert "--chunked-prefill-size 37992 with --mem-fraction-static 0.799 pinned" in " ".join(words)
    assert "alone (without --mem-fraction-static" in " ".join(words)
    assert "--mem-fraction-static 0.955 at --chunked-prefill-size 8192" in " ".join(words)
    result = _plan_json(["--engine", "sglang", "--sweep", "max-num-tokens=8192,16384"], capsys)
    assert [p["engine_limits"]["step_tokens"] for p in result["plans"]] == [8192, 16384]
    capsys.readouterr()
    assert main(["plan", "--engine", "sglang", "--sweep", "max-num-tokens=8192,16384",
                 "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    assert ("- max-num-tokens=16384, sglang: workspace: fits at --chunked-prefill-size 16384; "
            "largest safe --chunked-prefill-size") in out


@pytest.mark.parametrize("args", [
    ["--max-seq-len", "1"],
    ["--max-seq-len", "2047"],
    ["-s", "kimi-k2-context-reuse", "--max-seq-len", "1024"],
    ["--sweep", "max-seq-len=1024,32768"],
])
def test_a_sequence_shorter_than_the_top_k_is_refused(args):
    """plan --max-seq-len below the top-k each query attends (2048): the KV a query gathers
    cannot exist in so short a sequence; it was planned as though it did."""
    check_bad_input(["plan", *args], ("--max-seq-len", "max-seq-len="))


def test_a_sequence_as_long_as_the_top_k_is_planned(capsys):
    assert main(["plan", "--max-seq-len", "2048", "--format", "json"]) == 0
