"""vLLM's rules in the spec layer (spec/engines/vllm.py): the KV cache's groups, bytes and the
token count it logs, each held to the vLLM 0.33.0 source line it cites."""

import dataclasses

import pytest

from mlamem.engines.vllm import VLLM
from mlamem.kernels import FlashMLA
from mlamem.runtime.memory import SimulatedMemory
from mlamem.spec import scenario as scenarios
from mlamem.spec.engines import vllm as rules
from mlamem.spec.engines.dsa_cache import indexer_key_bytes
from mlamem.spec.engines.sglang import dsa_fp8_cell_bytes
from mlamem.spec.errors import UserError

GiB = 1024**3


@pytest.fixture(scope="module")
def glm():
    return scenarios.load("glm5-fp8-tp8")


@pytest.fixture(scope="module")
def deepseek():
    return scenarios.load("deepseek-v32-fp8-tp8")


def with_vllm(scenario, **table):
    """The scenario with its [vllm] table's fields replaced."""
    section = dataclasses.replace(rules.settings(scenario), **table)
    return dataclasses.replace(scenario, sections={**scenario.sections, "vllm": section})


def test_indexer_key_bytes_follow_deepseek_v2_indexer():
    """Indexer.__init__: head_dim + head_dim // 128 * 4 bytes (fp8 keys, one fp32 scale per
    128), at two widths; SGLang's kpool divides it, rounding up."""
    assert indexer_key_bytes(128) == 128 + 128 // 128 * 4 == 132
    assert indexer_key_bytes(256) == 256 + 2 * 4 == 264
    assert indexer_key_bytes(128, index_kpool=4) == 33


def test_sglang_cell_unchanged_by_the_shared_indexer_formula():
    """SGLang's DSA cell still counts 656 + 132 B per layer (GLM-5: 78 layers)."""
    assert dsa_fp8_cell_bytes(kv_lora_rank=512, qk_rope_head_dim=64, index_head_dim=128,
                              num_layers=78) == 78 * (656 + 132) == 61_464


def test_dsa_bytes_per_token_count_the_indexer_cache(glm, deepseek):
    """A DSA model's vLLM KV cache holds the fp8_ds_mla cell and the indexer's keys in one group
    (UniformTypeKVCacheSpecs: the page is the sum of the layers' pages), at two shapes."""
    assert rules.kv_bytes_per_token_per_layer(glm) == 656 + 132
    assert rules.kv_block_bytes(glm) == 64 * 78 * 788 == 3_933_696
    wide = with_vllm(deepseek, index_head_dim=256)
    wide = dataclasses.replace(wide, serving=dataclasses.replace(wide.serving, block_size=128))
    assert rules.kv_bytes_per_token_per_layer(wide) == 656 + 264
    assert rules.kv_block_bytes(wide) == 128 * deepseek.model.num_layers * 920


def test_dense_mla_has_no_indexer_cache():
    """A dense-MLA model (Kimi-K2) keeps only its MLA cache: no indexer."""
    kimi = scenarios.load("kimi-k2-dense-tp4-dp")
    assert rules.kv_bytes_per_token_per_layer(kimi) == kimi.kv_cache_bytes_per_token_per_layer


def test_logged_tokens_follow_get_kv_cache_capacity():
    """get_kv_cache_capacity: int(num_blocks / cdiv(max_model_len, block_size) x max_model_len):
    whole blocks when max_model_len is a multiple of the block size, fewer otherwise."""
    assert rules.logged_kv_tokens(6782, 64, 202_752) == 6782 * 64 == 434_048
    assert rules.logged_kv_tokens(100, 64, 100) == 5000  # 100 blocks / 2 per request x 100
    assert rules.logged_kv_tokens(7, 64, 130) == int(7 / 3 * 130) == 303


def test_public_glm5_h200_log_is_788_bytes_per_token():
    """github.com/vllm-project/vllm/issues/44545 (GLM-5 FP8, 8xH200, fp8 cache): 434,048
    tokens in 24.85 GiB.
    The blocks vLLM makes of any 24.845-24.855 GiB at 78 x 788 B per token give that count,
    and at 78 x 656 B (the cell alone) none does."""
    def tokens(available: int, per_token: int) -> int:
        return rules.logged_kv_tokens(available // (64 * per_token), 64, 202_752)
    low, high = int(24.845 * GiB), int(24.855 * GiB)
    assert tokens(low, 78 * 788) <= 434_048 <= tokens(high, 78 * 788)
    assert tokens(high, 78 * 656) > tokens(low, 78 * 656) > 434_048 * 1.19


def test_rank_sizes_the_cache_in_788_byte_tokens(glm):
    """The predicted vLLM rank's KV cache: whole blocks of 64 x 78 x 788 B, its tokens the
    count vLLM logs."""
    case = VLLM.emulate(SimulatedMemory(), glm, FlashMLA(),
                        VLLM.make_budget(gpu_memory_bytes=glm.gpu.memory_bytes,
                                         utilization=glm.gpu.gpu_memory_utilization,
                                         max_num_batched_tokens=32768),
                        "workspace", sm_count=132)
    assert case.kv_cache_bytes % 3_933_696 == 0
    assert case.kv_cache_tokens == case.kv_cache_bytes // 3_933_696 * 64


OLDER_COMMAND = ("vllm serve zai-org/GLM-5-FP8 -tp 8 --kv-cache-dtype fp8 --swap-space 16 "
                 "--max-num-partial-prefills 2 --disable-log-requests --max-seq-len-to-capture "
                 "8192 --num-lookahead-slots 0")


def test_older_versions_flags_are_taken_and_named():
    """Flags vLLM 0.10-0.22 took and 0.33.0 dropped (--swap-space, --max-num-partial-prefills,
    ...) are read, with or without a value, and named in one note with their versions, not
    refused as unknown."""
    from mlamem.spec.serve_command import from_command

    built = from_command(OLDER_COMMAND, gpu_name="H200 SXM 141GB")
    [note] = [n for n in built.notes if n.startswith("flags of older vLLM versions")]
    for flag in ("--swap-space (0.10.2, 0.11.0, 0.12.0, 0.13.0, 0.14.0, 0.16.0, 0.17.0)",
                 "--max-num-partial-prefills",
                 "--disable-log-requests", "--max-seq-len-to-capture (0.10.2)",
                 "--num-lookahead-slots"):
        assert flag in note
    plain = from_command("vllm serve zai-org/GLM-5-FP8 -tp 8 --kv-cache-dtype fp8",
                         gpu_name="H200 SXM 141GB").scenario
    # --max-seq-len-to-capture is 0.10.2's alone: the command ran 0.10.2 or older, whose
    # default utilization is 0.9 and which sets no graph estimate aside; the rest is the plain
    # command's scenario
    assert "engine version: vLLM 0.10.2 (or older" in " ".join(built.notes)
    assert built.scenario.gpu.gpu_memory_utilization == 0.9
    assert rules.settings(built.scenario).engine_version == "0.10.2"
    assert dataclasses.replace(built.scenario, description="", gpu=plain.gpu,
                               sections=plain.sections) == dataclasses.replace(plain, description="")


def test_an_older_flag_pins_the_newest_version_that_takes_it():
    """--swap-space is in 0.10.2 to 0.17.0's parsers, not 0.18.0's: 0.17.0 or older;
    flags every version read takes pin nothing older than the newest of them."""
    assert rules.pinned_version(["--swap-space"]) == "0.17.0"
    assert rules.pinned_version(["--swap-space", "--task"]) == "0.12.0"
    assert rules.pinned_version(["--max-num-partial-prefills"]) == "0.26.0"
    assert rules.pinned_version([]) is None


def test_older_flags_table_holds_only_flags_0_33_0_lacks():
    """vllm-older-flags.json (scripts/vllm_older_flags.py) names no flag of 0.33.0's table."""
    current = rules.flag_table()
    names = set(current) | {a for f in current.values() for a in f["aliases"]}
    older = rules.older_flag_table()
    assert "--swap-space" in older and "--max-num-partial-prefills" in older
    assert not names & set(older)


@pytest.mark.parametrize(("version", "fraction", "estimate"), [
    ("0.10.2", 0.9, "none"), ("0.16.0", 0.9, "none"), ("0.18.0", 0.9, "opt-in"),
    ("0.19.1", 0.9, "opt-in"), ("0.20.0", 0.92, "applied"), ("0.22.1rc1.dev69+gf69ede495", 0.92,
                                                            "applied"), (None, 0.92, "applied")])
def test_version_rules_follow_each_wheel(version, fraction, estimate):
    """config/cache.py's default utilization: 0.9 in 0.10.2, 0.11.0, 0.16.0, 0.18.0 and 0.19.0,
    0.92 from 0.20.0 (and in 0.22.0, 0.33.0); envs.py VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS:
    "1" from 0.20.0, "0" in 0.18.0-0.19.0, no profile_cudagraph_memory in 0.16.0. The default
    is vLLM 0.33.0."""
    found = rules.version_rules(version)
    assert (found.gpu_memory_utilization, found.graph_estimate) == (fraction, estimate)
    assert found.version == (version or "0.33.0")


@pytest.mark.parametrize("version", ["0.9.2", "0.34.0", "1.0", "latest", ""])
def test_versions_outside_those_read_are_refused(version):
    with pytest.raises(UserError, match=r"mlamem reads vLLM's rules of 0\.10 to 0\.33") as error:
        rules.version_rules(version)
    assert error.value.field == "engine_version"


def test_an_older_version_takes_its_default_utilization():
    """--engine-version 0.19.1 without --gpu-memory-utilization: 0.9, said in the notes with
    the graph estimate's difference; the default stays 0.33.0's 0.92."""
    from mlamem.spec.serve_command import from_command

    command = "vllm serve zai-org/GLM-5-FP8 -tp 8 --kv-cache-dtype fp8"
    old = from_command(command, gpu_name="H200 SXM 141GB", engine_version="0.19.1")
    new = from_command(command, gpu_name="H200 SXM 141GB")
    assert old.scenario.gpu.gpu_memory_utilization == 0.9
    assert new.scenario.gpu.gpu_memory_utilization == 0.92
    assert "gpu_memory_utilization 0.9: vLLM 0.19.1's default" in old.notes
    assert any("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1" in n for n in old.notes)
    assert "gpu_memory_utilization 0.92: vLLM 0.33.0's default" in new.notes


def test_engine_version_is_read_by_the_commands_engine():
    """A vLLM version on an SGLang command is refused by SGLang's range (tests/
    test_sglang_versions.py holds SGLang's versions)."""
    from mlamem.spec.serve_command import from_command

    with pytest.raises(UserError, match="mlamem reads SGLang's rules of 0.4.6 to 0.5.23"):
        from_command("python -m sglang.launch_server --model-path zai-org/GLM-5-FP8 --tp 8 "
                     "--kv-cache-dtype fp8_e4m3", gpu_name="H200 SXM 141GB",
                     engine_version="0.19.1")


@pytest.mark.parametrize(("flags", "given"), [
    ("", "sets no --kv-cache-dtype"), ("--kv-cache-dtype auto", "--kv-cache-dtype auto"),
    ("--kv-cache-dtype bfloat16", "--kv-cache-dtype bfloat16")])
def test_a_bf16_dsa_cache_is_one_line_naming_what_is_missing_and_the_flag(flags, given):
    """vLLM runs a DSA model's bf16 cache through FlashMLA's sparse prefill kernel for decode
    too (flashmla_sparse.py _forward_bf16_kv), which mlamem's vLLM rank does not run: one line
    naming it and --kv-cache-dtype fp8_ds_mla."""
    from mlamem.spec.serve_command import from_command

    with pytest.raises(UserError) as error:
        from_command(f"vllm serve zai-org/GLM-5-FP8 -tp 8 {flags}", gpu_name="H200 SXM 141GB")
    message = str(error.value)
    assert "\n" not in message and given in message
    assert "_forward_bf16_kv" in message and "--kv-cache-dtype fp8_ds_mla" in message


@pytest.mark.parametrize("version", ["", " ", "x" * 5000])
def test_a_blank_or_long_engine_version_is_refused_in_a_short_line(version):
    """--engine-version '' is no version (not the default, silently); a long one is not echoed
    whole."""
    from mlamem.spec.serve_command import from_command

    with pytest.raises(UserError, match="mlamem reads vLLM's rules") as error:
        from_command("vllm serve zai-org/GLM-5-FP8 -tp 8 --kv-cache-dtype fp8_ds_mla",
                     gpu_name="H200 SXM 141GB", engine_version=version)
    assert len(str(error.value)) < 300


def _graphs_case(scenario, graphs: bool):
    budget = VLLM.make_budget(gpu_memory_bytes=scenario.gpu.memory_bytes,
                              utilization=scenario.gpu.gpu_memory_utilization,
                              max_num_batched_tokens=8192, cuda_graphs=graphs,
                              capture_sizes=[16, 8, 4] if graphs else None)
    return VLLM.emulate(SimulatedMemory(), scenario, FlashMLA(), budget, "alloc", sm_count=132)


@pytest.mark.parametrize(("version", "rule"), [("0.19.0", "opt-in"), ("0.16.0", "none")])
def test_a_version_without_the_estimate_sizes_the_cache_before_its_graphs(glm, version, rule):
    """vLLM 0.10.2-0.16.0 (v1/worker/gpu_worker.py determine_available_memory:
    requested_memory - non_kv_cache_memory, no profile_cudagraph_memory) and 0.18.0-0.19.0
    (profile_cudagraph_memory runs, its estimate applied only with
    VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1, "0" by default in envs.py) size the KV cache as
    without graphs, then capture them (compile_or_warm_up_model) out of what utilization left."""
    without, applied = _graphs_case(glm, False), _graphs_case(glm, True)
    old = _graphs_case(with_vllm(glm, engine_version=version), True)
    # the version's own stages beyond attention (0.16.0 keeps no top-k/top-p scratch:
    # spec.engines.vllm_pass.TOPK_TOPP_TRITON_FROM), without graphs
    old_without = _graphs_case(with_vllm(glm, engine_version=version), False)
    assert applied.kv_cache_bytes < without.kv_cache_bytes
    assert old.kv_cache_bytes == old_without.kv_cache_bytes and old.graph_kv_tokens_lost == 0
    assert old.graph_captures == applied.graph_captures == 3
    assert old.graph_pool_bytes == applied.graph_pool_bytes
    estimate = applied.graph_estimate_bytes if rule == "opt-in" else 0
    assert (old.graph_estimate_bytes, old.graph_estimate_rule) == (estimate, rule)
    assert applied.graph_estimate_rule is None
    assert "graph_estimate_rule" not in applied.to_dict()


@pytest.mark.parametrize(("version", "rule"), [("0.16.0", "none"), ("0.19.1", "opt-in"),
                                               ("0.20.0", "applied"), (None, "applied")])
def test_the_version_reaches_the_rank_through_the_vllm_table(version, rule):
    """--engine-version sets [vllm].engine_version, whose rules the rank follows; the default
    (None) leaves the table, and its TOML, as they were."""
    from mlamem.spec.serve_command import from_command

    built = from_command("vllm serve zai-org/GLM-5-FP8 -tp 8 --kv-cache-dtype fp8",
                         gpu_name="H200 SXM 141GB", engine_version=version)
    assert rules.settings(built.scenario).engine_version == version
    assert rules.graph_estimate_rule(built.scenario) == rule
    assert ("engine_version" in scenarios.to_toml(built.scenario)) == (version is not None)


def test_a_vllm_table_with_an_unread_version_is_refused():
    with pytest.raises(Exception, match=r"\[vllm\]\.engine_version.*0\.10 to 0\.33"):
        with_vllm(scenarios.load("glm5-fp8-tp8"), engine_version="0.9.2")


# (version, default cudagraph_mode, capture list: multiples of 16 from 256, max x (1 + k),
#  + max_num_batched_tokens, uniform decode sizes, Blackwell's 1024, the >= 160 GiB batch tier)
VERSION_TABLE = [
    ("0.10.2", "PIECEWISE", False, False, False, "none", False, False),
    ("0.11.0", "FULL_AND_PIECEWISE", False, False, False, "none", False, False),
    ("0.12.0", "FULL_AND_PIECEWISE", True, False, False, "none", False, False),
    ("0.13.0", "FULL_AND_PIECEWISE", True, True, False, "none", False, False),
    ("0.20.0", "FULL_AND_PIECEWISE", True, True, False, "none", False, False),
    ("0.21.0", "FULL_AND_PIECEWISE", True, True, True, "none", False, False),
    ("0.27.0", "FULL_AND_PIECEWISE", True, True, True, "none", False, False),
    ("0.28.0", "FULL_AND_PIECEWISE", True, True, True, "none", True, True),
    ("0.29.0", "FULL_AND_PIECEWISE", True, True, True, "speculative", True, True),
    ("0.30.0", "FULL_AND_PIECEWISE", True, True, True, "speculative", True, True),
    ("0.31.0", "FULL_AND_PIECEWISE", True, True, True, "all", True, True),
    (None, "FULL_AND_PIECEWISE", True, True, True, "all", True, True)]


@pytest.mark.parametrize("row", VERSION_TABLE, ids=lambda row: row[0] or "default")
def test_capture_and_batch_rules_follow_each_wheel(row):
    """Each version's wheel: the default cudagraph_mode (0.10.2's config/__init__.py
    VllmConfig.__post_init__: PIECEWISE; FULL_AND_PIECEWISE from 0.11.0); _set_cudagraph_sizes
    (0.10.2-0.11.0: [1, 2, 4] + range(8, max + 1, 8), max = SchedulerConfig.cuda_graph_sizes'
    min(max_num_seqs x 2, 512); config/vllm.py: + range(256, max + 1, 16) from 0.12.0, max x
    (1 + k) from 0.13.0, max_num_batched_tokens within the max from 0.21.0, the uniform decode
    sizes under speculation from 0.29.0 and [max_num_seqs] without from 0.31.0, 1024 on
    data-center Blackwell from 0.28.0); engine/arg_utils.py get_batch_defaults' >= 160 GiB tier
    from 0.28.0."""
    version, *expected = row
    found = rules.version_rules(version)
    assert [found.default_cudagraph_mode, found.capture_step_16, found.capture_speculative_max,
            found.capture_adds_batched_tokens, found.capture_uniform_decode,
            found.blackwell_graph_size_1024, found.large_gpu_batch_tier] == expected


def _sizes(scenario, version, tokens=8192, **table):
    scenario = with_vllm(scenario, engine_version=version, **table)
    serving = dataclasses.replace(scenario.serving, max_num_batched_tokens=tokens)
    return rules.capture_sizes(dataclasses.replace(scenario, serving=serving))


def test_capture_sizes_follow_each_versions_rule(glm):
    """max_num_seqs 1024: multiples of 8 to 512 (0.11.0: 67 sizes), of 16 from 256 (0.12.0:
    51); 0.20.0 leaves out a max_num_batched_tokens within the max that 0.21.0 adds; under
    speculation the max doubles from 0.13.0 and the uniform decode sizes join from 0.29.0;
    without it, 0.31.0 adds max_num_seqs."""
    assert _sizes(glm, "0.11.0") == [1, 2, 4, *range(8, 513, 8)]
    assert _sizes(glm, "0.12.0") == [1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)]
    assert _sizes(glm, "0.20.0", tokens=300) == _sizes(glm, "0.12.0")[:-14]
    assert _sizes(glm, "0.21.0", tokens=300) == [*_sizes(glm, "0.20.0", tokens=300), 300]
    spec = {"max_num_seqs": 20, "num_speculative_tokens": 2}
    assert _sizes(glm, "0.12.0", **spec)[-1] == 40 and _sizes(glm, "0.13.0", **spec)[-1] == 120
    assert 60 not in _sizes(glm, "0.28.0", **spec) and 60 in _sizes(glm, "0.29.0", **spec)
    assert 100 not in _sizes(glm, "0.30.0", max_num_seqs=100)
    assert 100 in _sizes(glm, "0.31.0", max_num_seqs=100)
    assert _sizes(glm, None, max_num_seqs=100) == _sizes(glm, "0.31.0", max_num_seqs=100)


def test_blackwell_captures_to_1024_from_0_28_0(glm):
    """config/vllm.py _set_cudagraph_sizes: default_max_graph_size 1024 on data-center
    Blackwell (SM100) from 0.28.0, 512 before and on Hopper (at vLLM's default max_num_seqs
    1024: the list stops at 2 x max_num_seqs, 512 at glm5-fp8-tp8's 256)."""
    b200 = dataclasses.replace(glm, gpu=dataclasses.replace(glm.gpu, name="B200"))
    seqs = {"max_num_seqs": 1024}
    assert _sizes(b200, "0.27.0", **seqs)[-1] == 512 and _sizes(glm, None, **seqs)[-1] == 512
    assert _sizes(b200, "0.28.0", **seqs)[-1] == _sizes(b200, None, **seqs)[-1] == 1024
    assert _sizes(b200, None)[-1] == 512


@pytest.mark.parametrize(("version", "tokens"), [("0.27.0", 8192), ("0.28.0", 16384),
                                                 (None, 16384)])
def test_a_b200_takes_its_versions_batch_default(version, tokens):
    """get_batch_defaults: a >= 160 GiB GPU (B200) gets 16384 tokens from 0.28.0, 8192
    before; the note names the version."""
    from mlamem.spec.serve_command import from_command

    built = from_command("vllm serve zai-org/GLM-5-FP8 -tp 8 --kv-cache-dtype fp8",
                         gpu_name="B200", engine_version=version)
    assert built.scenario.serving.max_num_batched_tokens == tokens
    assert (f"max_num_batched_tokens {tokens}: vLLM {version or '0.33.0'}'s default on the "
            "B200") in built.notes


def test_vllm_0_10_defaults_to_piecewise_graphs_without_attention():
    """vLLM 0.10.2's default cudagraph_mode is PIECEWISE: attention runs outside the graphs,
    so the rank captures none ([vllm].cuda_graphs false) and a note says why; a mode the
    command sets stands."""
    from mlamem.spec.serve_command import from_command

    command = "vllm serve zai-org/GLM-5-FP8 -tp 8 --kv-cache-dtype fp8"
    old = from_command(command, gpu_name="H200 SXM 141GB", engine_version="0.10.2")
    vllm = rules.settings(old.scenario)
    assert (vllm.cudagraph_mode, vllm.cuda_graphs, old.cuda_graphs) == ("PIECEWISE", False, False)
    assert any("cudagraph_mode PIECEWISE: vLLM 0.10.2's default" in n for n in old.notes)
    given = from_command(command + " -cc.cudagraph_mode=FULL", gpu_name="H200 SXM 141GB",
                         engine_version="0.10.2")
    assert rules.settings(given.scenario).cudagraph_mode == "FULL" and given.cuda_graphs


def test_the_budget_rule_names_the_estimate_only_where_the_version_sets_it_aside():
    """The report's KV cache rule: '+ CUDA-graph estimate' with graphs on at 0.20.0 and later,
    not where the cases' version sizes the cache without it."""
    budget = {"utilization": 0.9, "cuda_graphs": True}
    assert "CUDA-graph estimate" in rules.VIEW.budget_rule(budget, [{}])
    assert "CUDA-graph estimate" not in rules.VIEW.budget_rule(
        budget, [{"graph_estimate_rule": "none"}])
