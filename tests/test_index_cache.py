"""IndexCache (GLM-5.2): only the DSA layers that compute their own top-k hold an indexer and its
key cache, by vLLM's rule (0.24.0-0.33.0 models/deepseek_v2.py) and SGLang's (0.5.18-0.5.23
configs/model_config.py dsa_layer_skips_topk), each at two shapes, with the versions before."""

import dataclasses
import json
from importlib import resources

import pytest

from mlamem.cli import main
from mlamem.spec.engines import sglang as sglang_rules
from mlamem.spec.engines import vllm as vllm_rules
from mlamem.spec.errors import UserError
from mlamem.spec.models import shipped_config
from mlamem.spec.models.hf_config import parse_config
from mlamem.spec.serve_command import from_command

GiB = 1024**3
FP8_TP8 = "-tp 8 --kv-cache-dtype fp8"
GLM52 = f"vllm serve zai-org/GLM-5.2-FP8 {FP8_TP8}"
H200 = "H200 SXM 141GB"
MLA_CELL, INDEXER_KEY = 656, 132  # fp8_ds_mla; 128 fp8 values + one fp32 scale


def _scenario(command: str = GLM52, version: str | None = None):
    return from_command(command, gpu_name=H200, weights_bytes=40 * GiB,
                        engine_version=version).scenario


def _with(scenario, **fields):
    return dataclasses.replace(scenario, model=dataclasses.replace(scenario.model, **fields))


def test_glm52_ships_its_index_cache_fields():
    config = shipped_config("glm-5.2")
    assert (config.index_topk_freq, config.index_skip_topk_offset) == (4, 3)
    assert sum(config.indexer_layers) == 21 and len(config.indexer_layers) == 78
    model = _scenario().model
    assert (model.index_topk_freq, model.index_skip_topk_offset) == (4, 3)


def test_vllm_counts_the_layers_computing_their_own_topk():
    """0.33.0: skip where max(i - offset + 1, 0) % freq != 0, offset the config's or 2."""
    glm52 = _scenario()
    assert vllm_rules.indexer_layer_count(glm52) == 21  # 0, 1, 2, 6, 10, ..., 74
    # a 61-layer DeepSeek-V3.2 with --hf-overrides index_topk_freq 4 and no offset: 0, 1, 5, ..., 57
    dsv32 = _with(_scenario(f"vllm serve deepseek-ai/DeepSeek-V3.2 {FP8_TP8}"), index_topk_freq=4)
    assert vllm_rules.indexer_layer_count(dsv32) == 2 + (57 - 5) // 4 + 1 == 16
    assert vllm_rules.indexer_layer_count(_scenario(f"vllm serve zai-org/GLM-5-FP8 {FP8_TP8}")) == 78


def test_vllm_before_0_24_builds_an_indexer_on_every_layer():
    assert vllm_rules.indexer_layer_count(_scenario(version="0.23.0")) == 78
    assert vllm_rules.indexer_layer_count(_scenario(version="0.24.0")) == 21


def test_vllm_kv_bytes_per_token_count_the_keys_of_those_layers():
    """GLM-5.2: 78 x 656 + 21 x 132 = 53,940 B (with its MTP layer, 79 x 656 + 22 x 132 =
    54,728 B, what local-inference-lab/vllm PR 82 measured for GLM-5.2-class models)."""
    assert vllm_rules.kv_bytes_per_token(_scenario()) == 78 * MLA_CELL + 21 * INDEXER_KEY == 53940
    assert vllm_rules.kv_bytes_per_token(_scenario(version="0.23.0")) == 78 * (MLA_CELL + INDEXER_KEY)
    assert vllm_rules.kv_block_bytes(_scenario()) == 64 * 53940


def test_sglang_counts_the_layers_computing_their_own_topk():
    """0.5.23 dsa_layer_skips_topk: offset the config's, else max(i - 1, 0) % freq."""
    glm52 = _scenario()
    assert sglang_rules.indexer_layer_count(glm52, sglang_rules.sglang_rules(None)) == 21
    no_offset = _with(glm52, index_skip_topk_offset=None)
    assert sglang_rules.indexer_layer_count(no_offset, sglang_rules.sglang_rules(None)) == \
        2 + (77 - 5) // 4 + 1 == 21  # 0, 1, 5, 9, ..., 77
    assert sglang_rules.indexer_layer_count(glm52, sglang_rules.sglang_rules("0.5.17")) == 78
    assert sglang_rules.indexer_layer_count(glm52, sglang_rules.sglang_rules("0.5.18")) == 21


def test_sglang_cell_holds_index_k_of_those_layers():
    latent = 512 + 512 // 128 * 4 + 64 * 2
    cell = sglang_rules.dsa_fp8_cell_bytes(kv_lora_rank=512, qk_rope_head_dim=64, index_head_dim=128,
                                           num_layers=78, indexer_layers=21)
    assert cell == 78 * latent + 21 * INDEXER_KEY
    assert sglang_rules.dsa_fp8_cell_bytes(kv_lora_rank=512, qk_rope_head_dim=64,
                                           index_head_dim=128, num_layers=61) == 61 * (latent + 132)


def test_plan_shows_the_indexer_keys_of_some_layers(capsys):
    assert main(["plan", "--serve", GLM52, "--gpu", H200]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "53940 B (78 layers x 656 B, fp8_ds_mla + 2772 B of indexer keys)" in out


@pytest.mark.parametrize(("field", "value"), [("index_topk_freq", 0), ("index_topk_freq", "4"),
                                              ("index_skip_topk_offset", -1)])
def test_a_bad_index_cache_field_is_one_error(field, value):
    raw = json.loads(resources.files("mlamem.spec.models").joinpath("glm-5.2.json").read_text())
    with pytest.raises(UserError, match=field):
        parse_config(raw | {field: value})


def test_sglang_draft_layer_keeps_its_keys_beside_the_targets_shared_ones():
    """With EAGLE drafting the draft layer's share joins the cell, its index-K on every draft
    layer (allocate_all_layers) while the target's stays on its 21 own-top-k layers."""
    latent = 512 + 512 // 128 * 4 + 64 * 2
    cell = sglang_rules.dsa_fp8_cell_bytes(kv_lora_rank=512, qk_rope_head_dim=64, index_head_dim=128,
                                           num_layers=78, indexer_layers=21, draft_layers=1)
    assert cell == 78 * latent + 21 * INDEXER_KEY + latent + INDEXER_KEY


def test_the_sglang_rank_holds_the_cell_of_its_version(tmp_path, capsys):
    """An SGLang rank of GLM-5.2, predicted: 0.5.23's cell (21 layers of index-K), and with
    --engine-version 0.5.17 every layer's; the version reaches [sglang].engine_version."""
    command = ("python -m sglang.launch_server --model-path zai-org/GLM-5.2-FP8 --tp 8 "
               "--kv-cache-dtype fp8_e4m3 --context-length 131072 --disable-cuda-graph")
    latent = 512 + 512 // 128 * 4 + 64 * 2
    for version, keys in ((None, 21), ("0.5.17", 78)):
        built = from_command(command, gpu_name=H200, weights_bytes=40 * GiB, engine_version=version)
        assert built.scenario.section("sglang").engine_version == version
        output = tmp_path / f"{version}.json"
        assert main(["repro-oom", "--predict", "--serve", command, "--gpu", H200,
                     "--weights-per-rank", "40GiB", "--paths", "alloc", "--format", "json",
                     "--output", str(output), *(["--engine-version", version] if version else [])]) == 0
        capsys.readouterr()
        case = json.loads(output.read_text())["cases"][0]
        assert case["kv_cell_bytes"] == 78 * latent + keys * INDEXER_KEY


def test_a_scenarios_bad_sglang_version_names_its_field(tmp_path, capsys):
    shipped = (resources.files("mlamem.scenarios") / "glm5-fp8-tp8.toml").read_text()
    path = tmp_path / "bad.toml"
    path.write_text(shipped + '\n[sglang]\nengine_version = "9.9"\n')
    assert main(["repro-oom", "-s", str(path), "--engine", "sglang", "--predict"]) == 2
    error = capsys.readouterr().err.strip()
    assert "[sglang].engine_version" in error and "0.4.6 to 0.5.23" in error and "\n" not in error
