"""SGLang's rank (mlamem/engines/sglang.py) on the allocator model: the pool its rule sizes, the
largest safe chunked_prefill_size as a boundary, its knobs, and its refusals."""

import json

import pytest

from mlamem.cli.main import main
from mlamem.commands.repro import host_setup, run_repro
from mlamem.engines.sglang import SGLang, SGLangBudget
from mlamem.kernels import FlashMLA
from mlamem.runtime.memory import SimulatedMemory
from mlamem.spec import scenario as scenarios
from mlamem.spec.errors import UserError
from mlamem.testing import check_bad_input, scenario_file

GiB = 1 << 30
MiB = 1 << 20


def budget(scenario, tokens: int, fraction: float | None = None) -> SGLangBudget:
    return SGLangBudget(gpu_memory_bytes=scenario.gpu.memory_bytes,
                        utilization=scenario.gpu.gpu_memory_utilization,
                        max_num_batched_tokens=tokens, mem_fraction_static=fraction)


def emulate(scenario, tokens: int, path: str = "alloc", fraction: float | None = None):
    memory = SimulatedMemory(non_torch=host_setup("flashmla", predict=True,
                                                  target_bytes=scenario.gpu.memory_bytes))
    return SGLang.emulate(memory, scenario, FlashMLA(), budget(scenario, tokens, fraction), path,
                          sm_count=132)


def test_glm5_pool_is_sglangs_rule_at_its_h100_defaults():
    """GLM-5 TP8 on an H100 at SGLang's defaults: chunked_prefill_size 8192 and the reserve
    rule's 0.799; the pool is free after init less 0.201 x free before the model (SGLang's GB
    floats), in whole 64-token pages of 788 B x 78 layers, and the step fits."""
    glm = scenarios.load("glm5-fp8-tp8")
    assert SGLang.default_step_tokens(glm, glm.gpu.memory_bytes) == 8192
    case = emulate(glm, 8192)
    assert (case.mem_fraction_static, case.fraction_source) == (0.799, "reserve rule: 16384 MiB")
    assert case.kv_cell_bytes == 61464
    # before the model: the first cap, nothing reserved; after init: the cap less init's
    # segments (the weights, the top-k buffer, the KV the step reads), rounded up by the allocator
    assert case.free_before_model_bytes >= case.torch_limit_bytes
    after = case.torch_limit_bytes - case.init_bytes
    assert after - 16 * MiB < case.free_after_init_bytes <= after
    pool = int((case.free_after_init_bytes / GiB - case.free_before_model_bytes / GiB * 0.201) * GiB)
    assert case.kv_cache_tokens == pool // 61464 // 64 * 64
    assert case.kv_cache_bytes == case.kv_cache_tokens * 61464
    assert case.verdict == "fits" and case.headroom_bytes > 0


@pytest.mark.parametrize("name", ["glm5-fp8-tp8", "deepseek-v32-fp8-tp8"])
@pytest.mark.parametrize("path", ["alloc", "workspace"])
def test_the_largest_safe_chunk_is_the_boundary(name, path):
    """The reported largest safe chunked_prefill_size fits and one token more runs out of
    memory, on the model, with the case's derived fraction pinned; given alone, SGLang
    re-derives the fraction from the chunk, and the reported largest chunk then fits and one
    more does not (on GLM-5's H100 a smaller chunk: past it the rule's fraction leaves no
    pool)."""
    chosen = scenarios.load(name)
    result = run_repro(chosen, budget(chosen, 8192), [path], command="test", predict=True,
                       engine="sglang")
    [case] = result.cases
    limit, alone, fraction = (case["max_safe_tokens"], case["max_safe_tokens_rederived"],
                              case["mem_fraction_static"])
    assert 8192 < limit < chosen.serving.max_num_batched_tokens + 16384
    assert [emulate(chosen, t, path, fraction).verdict for t in (limit, limit + 1)] == ["fits", "oom"]
    assert alone >= 8192
    assert emulate(chosen, alone, path).verdict == "fits"
    assert emulate(chosen, alone + 1, path).verdict != "fits"
    if name == "glm5-fp8-tp8":  # the pinned chunk given alone: the rule's fraction leaves no pool
        assert alone < limit and emulate(chosen, limit, path).verdict == "no-kv-room"


def test_a_given_chunk_feeds_the_reserve_rule_as_the_serve_command_does():
    """Without a fraction, the step's chunked_prefill_size (repro-oom's
    --max-num-batched-tokens) is the one SGLang's reserve rule reads: DeepSeek-V3.2 TP8 on the
    H200 at 16384 derives 0.801, as `--serve "... --chunked-prefill-size 16384"` does (not the
    default chunk's 0.886)."""
    from mlamem.spec.serve_command import from_command

    ds = scenarios.load("deepseek-v32-fp8-tp8")
    case = emulate(ds, 16384)
    assert (case.mem_fraction_static, case.fraction_source) == (0.801, "reserve rule: 28672 MiB")
    served = from_command("python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3.2 "
                          "--tp 8 --kv-cache-dtype fp8_e4m3 --context-length 4096 "
                          "--chunked-prefill-size 16384", gpu_name="H200 SXM 141GB").scenario
    assert served.gpu.gpu_memory_utilization == case.mem_fraction_static
    assert emulate(ds, 8192).mem_fraction_static == 0.886


def test_the_reserve_rule_reads_nvidia_smis_total():
    """SGLang's rules read nvidia-smi's memory.total (143771 MiB on an H200), not the
    scenario's CUDA total (143155 MiB): at chunk 16384 the reserve's 28672 MiB gives 0.801 of
    the former, 0.800 of the latter. A budget the GPU table has no figure for is read as is, and
    a note says so."""
    ds = scenarios.load("deepseek-v32-fp8-tp8")
    assert ds.gpu.memory_mib == 143155
    case = emulate(ds, 16384)
    assert (case.smi_memory_mib, case.smi_memory_note) == (143771, None)
    assert case.mem_fraction_static == round((143771 - 28672) / 143771, 3) == 0.801
    assert round((143155 - 28672) / 143155, 3) == 0.800
    other = SGLang.emulate(SimulatedMemory(non_torch=host_setup("flashmla", predict=True)), ds, FlashMLA(),
                           SGLangBudget(gpu_memory_bytes=140000 * MiB, utilization=0.9,
                                        max_num_batched_tokens=16384), "alloc", sm_count=132)
    assert other.smi_memory_mib == 140000
    assert other.mem_fraction_static == round((140000 - 28672) / 140000, 3)
    assert "unknown for a 140000 MiB H200 SXM 141GB" in other.smi_memory_note
    assert other.smi_memory_note in SGLang.notes([other.to_dict()])


def test_a_given_fraction_sizes_the_pool():
    """--mem-fraction-static 0.7 leaves 0.3 x free before the model outside the pool: a smaller
    pool than the rule's 0.799, and the step's headroom grows by what the pool gave up less what
    the indexer's logits chunk grew by (to the allocator's rounding of the step's segments): its
    budget is 20% of what the pool leaves (SGLang 0.5.23 layers/attention/mqa_logits_utils.py,
    mqa_logits_static_budget_bytes), so at 0.7 all 8192 rows of the 131072-wide fp32 logits
    (4 GiB) fit one chunk, where at 0.799 it holds 6478 rows (20% of what is free at the step,
    less than 20% of the 0.201 the pool leaves)."""
    glm = scenarios.load("glm5-fp8-tp8")
    rule, given = emulate(glm, 8192), emulate(glm, 8192, fraction=0.7)
    assert (given.mem_fraction_static, given.fraction_source) == (0.7, "given")
    assert given.kv_cache_bytes < rule.kv_cache_bytes

    def logits(case):
        return next(b["requested_bytes"] for b in case.buffers if b["name"] == "indexer.logits")

    assert logits(given) == 8192 * 131072 * 4 and logits(rule) == 6478 * 131072 * 4
    gained = given.headroom_bytes - rule.headroom_bytes
    grown = logits(given) - logits(rule)
    assert abs(gained - (rule.kv_cache_bytes - given.kv_cache_bytes - grown)) < 4 * MiB


def test_too_small_a_fraction_does_not_start():
    """A fraction below what the weights take leaves no pool: SGLang refuses to start."""
    glm = scenarios.load("glm5-fp8-tp8")
    case = emulate(glm, 8192, fraction=0.3)
    assert case.verdict == "no-kv-room" and "raise mem_fraction_static" in case.failure


def test_repro_oom_engine_sglang_in_every_form(tmp_path, capsys):
    """`repro-oom --engine sglang --predict` as a table, Markdown and JSON: the engine, the
    chunk, the fraction and its source, the largest safe chunked_prefill_size."""
    output = tmp_path / "sglang.json"
    assert main(["repro-oom", "--engine", "sglang", "--predict", "--format", "json",
                 "--output", str(output)]) == 0
    result = json.loads(output.read_text())
    assert result["engine"] == "sglang" and result["budget"]["max_num_batched_tokens"] == 8192
    assert [c["mem_fraction_static"] for c in result["cases"]] == [0.799, 0.799]
    assert [c["backend"] for c in result["cases"]] == ["flashmla_kv", "what-if staging (not SGLang's)"]
    alone = result["cases"][0]["max_safe_tokens_rederived"]
    assert 8192 < alone < result["cases"][0]["max_safe_tokens"]
    assert main(["repro-oom", "--engine", "sglang", "--predict", "--format", "markdown"]) == 0
    markdown = capsys.readouterr().out
    assert "largest safe chunked_prefill_size" in markdown and "0.799 (reserve rule" in markdown
    assert "| alloc | fits: " in markdown and " | flashmla_kv | " in markdown
    assert (f"- alloc: largest safe --chunked-prefill-size {result['cases'][0]['max_safe_tokens']} "
            f"with --mem-fraction-static 0.799 pinned; --chunked-prefill-size {alone} alone") in markdown
    assert main(["repro-oom", "--engine", "sglang", "--predict"]) == 0
    table = capsys.readouterr().out
    assert "backends: alloc: flashmla_kv as SGLang 0.5.23 runs it" in " ".join(table.split())
    assert "SGLang (PREDICTED)" in table and "chunked_prefill_size 8192" in table
    assert "at utilization" not in table  # SGLang's fraction is not vLLM's utilization


@pytest.mark.parametrize(("args", "fix"), [
    (["--engine", "sglang", "--utilization", "0.9"], "--mem-fraction-static; pass that"),
    (["--mem-fraction-static", "0.8"], "the vllm engine has no such option"),
    (["--engine", "sglang", "--mem-fraction-static", "1.2"], "outside (0, 1)"),
    (["--engine", "sglang", "--cuda-graphs", "on", "--capture-sizes", "512"],
     "set [sglang].cuda_graph_bs"),
    (["-s", "kimi-k2-fp8-tp4-dp", "--engine", "sglang"], "declares vllm"),
])
def test_sglang_knobs_are_checked(args, fix):
    check_bad_input(["repro-oom", "--predict", *args], fix)


def test_a_model_without_the_indexer_is_refused():
    """Kimi-K2 has no DSA indexer: SGLang does not run flashmla_kv for it, and one line says so."""
    kimi = scenarios.load("kimi-k2-fp8-tp4-dp")
    with pytest.raises(UserError, match=r"only for a DSA model \(\[model\].index_topk\)"):
        SGLang.check(kimi)


def test_the_sglang_table_is_checked_by_its_section(tmp_path):
    """The scenario's [sglang] table is validated by its own section, field by field."""
    path = scenario_file(tmp_path, edits={"\n[gpu]": "\n[sglang]\nmem_fraction_static = 1.5\n\n[gpu]"})
    check_bad_input(["repro-oom", "-s", str(path), "--engine", "sglang", "--predict"],
                    "[sglang].mem_fraction_static")
    path = scenario_file(tmp_path, edits={"\n[gpu]": "\n[sglang]\nchunked_prefill_size = 4096\n"
                                                     "mem_fraction_static = 0.75\n\n[gpu]"})
    case = emulate(scenarios.load(str(path)), 4096)
    assert (case.mem_fraction_static, case.fraction_source) == (0.75, "given")
    assert SGLang.default_step_tokens(scenarios.load(str(path)), 80 * GiB) == 4096


def test_the_largest_safe_fraction_is_the_boundary():
    """At chunked_prefill_size 32768 a fraction of 0.9 runs out of memory; the reported largest
    safe mem_fraction_static fits and 0.001 more does not, on the model."""
    glm = scenarios.load("glm5-fp8-tp8")
    result = run_repro(glm, budget(glm, 32768, 0.9), ["alloc"], command="test", predict=True,
                       engine="sglang")
    [case] = result.cases
    assert case["verdict"] == "oom" and case["oom_buffer"] == "o_accum"
    fraction = case["max_safe_mem_fraction_static"]
    assert 0.5 < fraction < 0.9
    verdicts = [emulate(glm, 32768, fraction=round(f, 3)).verdict for f in (fraction, fraction + 0.001)]
    assert verdicts == ["fits", "oom"]


def test_the_same_pool_under_each_engines_knob():
    """plan's knob table: vLLM's alloc-path pool at the scenario's 0.85, and each engine's
    fraction for it. vLLM's is 0.85 less its last part block; SGLang's fraction, read on SGLang's
    own init (without the shared workspace vLLM keeps at init) and run through SGLang's own
    emulation at the same step tokens, gives at least that pool (less than one step, 0.001 of the
    memory free before the model, more), and one step less gives less; TRT-LLM's (whose
    context-reuse rank does not serve GLM-5) is the pool over what is free after vLLM's init and
    profile."""
    from mlamem.commands import plan

    glm = scenarios.load("glm5-fp8-tp8")
    table = plan.engine_knobs(glm, plan.request_for(glm))
    pool, rank = table["pool_bytes"], table["rank"]
    knobs = {k["engine"]: k["value"] for k in table["knobs"]}
    assert set(knobs) == {"vllm", "sglang", "trtllm-context-reuse"}
    assert 0.8499 < knobs["vllm"] <= 0.85
    free = rank["total_bytes"] - rank["non_torch_bytes"] - rank["init_bytes"] - rank["activation_bytes"]
    assert knobs["trtllm-context-reuse"] == pool / free
    tokens = glm.serving.max_num_batched_tokens
    got, less = (emulate(glm, tokens, fraction=round(f, 3)).kv_cache_bytes
                 for f in (knobs["sglang"], knobs["sglang"] - 0.001))
    step = (rank["total_bytes"] - rank["non_torch_bytes"]) / 1000
    assert pool - 4 * MiB < got < pool + step and less < pool
