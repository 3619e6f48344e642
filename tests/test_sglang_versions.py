"""SGLang versions (spec/engines/sglang.py `sglang_rules`): each version's default
mem_fraction_static, chunked_prefill_size and decode graph list, held to the source line of the
wheel it cites (`pip download --no-deps sglang==X`, srt/server_args.py), and the serve parser
taking them from --engine-version or an older version's flag."""

import pytest

from mlamem.spec.engines import sglang
from mlamem.spec.errors import UserError

H100, H200, B200 = 81559, 143771, 183359  # nvidia-smi's MiB, as SGLang reads them
COMMAND = ("python -m sglang.launch_server --model-path zai-org/GLM-5-FP8 --tp 8 "
           "--kv-cache-dtype fp8_e4m3")


@pytest.mark.parametrize(("version", "fraction_rule", "dsa_prefill_graphs"), [
    ("0.4.6.post5", "by-tp", False), ("0.4.7", "by-tp", False), ("0.4.8", "by-gpu", False),
    ("0.5.2", "by-gpu", False), ("0.5.3", "reserve", False), ("0.5.10", "reserve", False),
    ("0.5.15", "reserve", True), ("0.5.23", "reserve", True), (None, "reserve", True)])
def test_rules_follow_each_wheel(version, fraction_rule, dsa_prefill_graphs):
    """server_args.py ServerArgs.__post_init__: mem_fraction_static by TP x PP in 0.4.0-0.4.7,
    reserved_mem by the GPU's row in 0.4.8-0.5.2; _handle_gpu_memory_settings' reserve from
    0.5.3; a DSA model's prefill graphs off (enable_piecewise_cuda_graph False before 0.5.10,
    model_config.py piecewise_cuda_graph_disabled_model_archs with GlmMoeDsaForCausalLM in
    0.5.10) until 0.5.15. The default is 0.5.23."""
    rules = sglang.sglang_rules(version)
    assert (rules.fraction_rule, rules.dsa_prefill_graphs) == (fraction_rule, dsa_prefill_graphs)
    assert rules.version == (version or "0.5.23")


@pytest.mark.parametrize("version", ["0.4.5", "0.3.6", "0.6.0", "latest", ""])
def test_versions_outside_those_read_are_refused(version):
    with pytest.raises(UserError, match=r"mlamem reads SGLang's rules of 0\.4\.6 to 0\.5\.23") as e:
        sglang.sglang_rules(version)
    assert e.value.field == "engine_version"


def test_the_tp_table_of_0_4():
    """0.4.6.post5 server_args.py: on a GPU of at most 81920 MiB 0.81 at TP 8, 0.88 at TP 1;
    above, 0.88, raised past 96 GiB to min(f + 48 GiB x (1 - f) / gpu, (gpu - 18 GiB) / gpu);
    chunked_prefill_size 8192 from 25000 MiB."""
    rules = sglang.sglang_rules("0.4.6.post5")
    assert sglang.version_defaults(rules, H100, tp_size=8).mem_fraction_static == 0.81
    assert sglang.version_defaults(rules, H100, tp_size=1).mem_fraction_static == 0.88
    h200 = min(0.88 + 48 * 1024 * 0.12 / H200, (H200 - 18 * 1024) / H200)
    assert sglang.version_defaults(rules, H200, tp_size=8).mem_fraction_static == h200
    assert sglang.version_defaults(rules, B200, tp_size=8).chunked_prefill_size == 8192
    # 0.4.7 adds a row past 180000 MiB (a B200): 0.79, 16384 tokens
    b200 = sglang.version_defaults(sglang.sglang_rules("0.4.7"), B200, tp_size=8)
    assert (b200.mem_fraction_static, b200.chunked_prefill_size) == (0.79, 16384)


def test_the_gpu_rows_of_0_4_8_to_0_5_2():
    """0.4.10 server_args.py: reserved_mem (9.5 + TP x PP / 2) GiB below 90 GiB, (12 + TP x PP
    / 2) GiB below 160 GiB, 4 GiB more with DP attention; chunked_prefill_size 8192 below 160
    GiB, 16384 above."""
    rules = sglang.sglang_rules("0.4.10")
    h200 = sglang.version_defaults(rules, H200, tp_size=8)
    assert h200.mem_fraction_static == round((H200 - 16 * 1024) / H200, 3) == 0.886
    assert sglang.version_defaults(rules, H100, tp_size=8).mem_fraction_static == round(
        (H100 - 13.5 * 1024) / H100, 3)
    assert sglang.version_defaults(rules, H200, tp_size=8, dp_attention=True
                                   ).mem_fraction_static == round((H200 - 20 * 1024) / H200, 3)
    assert h200.chunked_prefill_size == 8192
    assert sglang.version_defaults(rules, B200, tp_size=8).chunked_prefill_size == 16384


def test_the_reserve_before_and_after_the_dsa_prefill_graphs():
    """_handle_gpu_memory_settings at TP 8 on the H200: 512 + 1.5 x 8192 + 2 x 512 + 1024 MiB
    in 0.5.5; 0.5.15 and 0.5.23 add the MLA prefill graphs' 1.5 GiB."""
    reserve = 512 + 1.5 * 8192 + 2 * 512 + 1024
    old = sglang.version_defaults(sglang.sglang_rules("0.5.5"), H200, tp_size=8)
    assert old.mem_fraction_static == round((H200 - reserve) / H200, 3) == 0.897
    new = sglang.version_defaults(sglang.sglang_rules("0.5.15"), H200, tp_size=8)
    assert new.mem_fraction_static == round((H200 - reserve - 1536) / H200, 3) == 0.886


def test_decode_graphs_before_0_5_3():
    """cuda_graph_runner.py get_batch_sizes_to_capture: [1, 2, 4, 8] + range(16, 161, 8), plus
    range(160, 257, 8) past 90 GiB and range(256, 513, 16) past 160000 MiB (0.4.8-0.5.2; past
    96 GiB and no B200 row in 0.4.6.post5); from 0.5.3 SGLang 0.5.23's list (None)."""
    base = [1, 2, 4, 8, *range(16, 161, 8)]
    rules = sglang.sglang_rules("0.5.1")
    assert sglang.version_defaults(rules, H100, tp_size=8).cuda_graph_bs == tuple(base)
    assert sglang.version_defaults(rules, H200, tp_size=8).cuda_graph_bs == tuple(
        base + list(range(168, 257, 8)))
    assert sglang.version_defaults(rules, B200, tp_size=8).cuda_graph_bs[-1] == 512
    old = sglang.sglang_rules("0.4.6.post5")
    assert sglang.version_defaults(old, B200, tp_size=8).cuda_graph_bs[-1] == 256
    assert sglang.version_defaults(sglang.sglang_rules("0.5.3"), H200, tp_size=8
                                   ).cuda_graph_bs is None


def test_a_command_takes_its_versions_defaults():
    """--engine-version 0.5.5: the table holds 0.5.5's fraction, a note names the version;
    without it, 0.5.23's rules as before (no fraction in the table)."""
    from mlamem.spec.serve_command import from_command

    old = from_command(COMMAND, gpu_name="H200 SXM 141GB", engine_version="0.5.5")
    new = from_command(COMMAND, gpu_name="H200 SXM 141GB")
    assert old.scenario.sections["sglang"].mem_fraction_static == 0.897
    assert old.scenario.gpu.gpu_memory_utilization == 0.897
    assert new.scenario.sections["sglang"].mem_fraction_static is None
    assert new.scenario.gpu.gpu_memory_utilization == 0.886
    assert any(n.startswith("engine version: SGLang 0.5.5 (--engine-version") for n in old.notes)
    assert not any(n.startswith("engine version:") for n in new.notes)


def test_an_older_flag_is_read_named_and_pins_the_version():
    """--enable-flashinfer-mla is in 0.4.6.post5 and 0.4.7's parsers only: read, named as not
    modelled with its versions, and the command takes 0.4.7's rules."""
    from mlamem.spec.serve_command import from_command

    built = from_command(COMMAND + " --enable-flashinfer-mla",
                         gpu_name="H200 SXM 141GB")
    [note] = [n for n in built.notes if n.startswith("flags of older SGLang versions")]
    assert "--enable-flashinfer-mla (0.4.6.post5, 0.4.7)" in note
    assert any("engine version: SGLang 0.4.7 (or older" in n for n in built.notes)
    assert any("SGLang 0.4.7 has no DSA model" in n for n in built.notes)
    h200 = min(0.88 + 48 * 1024 * 0.12 / H200, (H200 - 18 * 1024) / H200)
    assert built.scenario.gpu.gpu_memory_utilization == h200


def test_engine_version_is_refused_for_trtllm():
    from mlamem.spec.serve_command import from_command

    with pytest.raises(UserError, match="TensorRT-LLM"):
        from_command("trtllm-serve zai-org/GLM-5-FP8 --tp_size 8", gpu_name="H200 SXM 141GB",
                     engine_version="0.5.9")


@pytest.mark.parametrize(("layers", "rank", "rope", "index"), [(78, 512, 64, 128), (61, 512, 64, 128)])
def test_the_cell_before_0_5_17_counts_the_latent_as_one_byte_values(layers, rank, rope, index):
    """Before 0.5.17 SGLang sizes the DSA pool with (kv_lora_rank + qk_rope_head_dim) x the fp8
    element's byte a layer (pool_configurator.py _compute_cell_size, 0.5.13-0.5.16), where its
    pool stores the latent, its scales and a bf16 RoPE part: 576 against 656 B a layer; the
    indexer's keys (128 fp8 + a 4-byte scale) alike in both. GLM-5's and DeepSeek-V3.2's shapes."""
    cell = {"kv_lora_rank": rank, "qk_rope_head_dim": rope, "index_head_dim": index,
            "num_layers": layers}
    assert sglang.dsa_fp8_cell_bytes(**cell, latent_as_stored=False) == layers * (rank + rope + 132)
    assert sglang.dsa_fp8_cell_bytes(**cell) == layers * (rank + rank // 128 * 4 + 2 * rope + 132)
    assert sglang.dsa_fp8_cell_bytes(**cell, latent_as_stored=False, indexer_layers=0) == \
        layers * (rank + rope)


@pytest.mark.parametrize(("version", "sizing"), [
    ("0.5.3", 61 * 576), ("0.5.4", 61 * (576 + 132)), ("0.5.16", 61 * (576 + 132)),
    ("0.5.17", None), (None, None)])
def test_an_older_pool_is_sized_by_one_cell_and_holds_another(tmp_path, version, sizing):
    """SGLang 0.5.3 sizes the pool without the indexer's keys (0.5.4 adds them, SGLang PR 11309),
    and before 0.5.17 with a one-byte latent: the rank takes the tokens its version's cell gives
    and allocates them at the cell the pool stores (61 x 788 B for DeepSeek-V3.2), more than the
    budget that sized it; from 0.5.17 the two cells are one."""
    import json

    from mlamem.cli import main

    out = tmp_path / "repro.json"
    command = ("python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3.2 --tp 8 "
               "--kv-cache-dtype fp8_e4m3")
    args = ["repro-oom", "--predict", "--serve", command, "--gpu", "H200 SXM 141GB", "--paths",
            "alloc", "--format", "json", "--output", str(out)]
    assert main(args + (["--engine-version", version] if version else [])) == 0
    case = json.loads(out.read_text())["cases"][0]
    pool = sglang.kv_pool_bytes(case["free_after_init_bytes"], case["free_before_model_bytes"],
                                case["mem_fraction_static"])
    assert case.get("kv_sizing_cell_bytes") == sizing
    assert case["kv_cell_bytes"] == 61 * (656 + 132)
    assert case["kv_cache_tokens"] == pool // (sizing or case["kv_cell_bytes"]) // 64 * 64
    assert case["kv_cache_bytes"] == case["kv_cache_tokens"] * case["kv_cell_bytes"]
    assert (case["kv_cache_bytes"] > pool) is (sizing is not None)


@pytest.mark.parametrize(("version", "noted"), [("0.5.3", True), ("0.5.8", True), ("0.5.9", False)])
def test_a_glm5_command_before_sglang_knew_glm5_is_noted(version, noted):
    """configs/model_config.py names GlmMoeDsaForCausalLM from 0.5.9 (not in 0.5.8's): before,
    a GLM-5 command is read by the version's rules with a note that it had no such model."""
    from mlamem.spec.serve_command import from_command

    built = from_command(COMMAND, gpu_name="H200 SXM 141GB", engine_version=version)
    assert any("has no GlmMoeDsaForCausalLM" in note for note in built.notes) is noted
