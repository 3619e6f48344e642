"""The Hugging Face config reader and the checkpoint's weight count, against published figures."""

import json
from dataclasses import replace
from importlib import resources

import pytest

from mlamem.errors import UserError
from mlamem.models import count_weights, load_config, shipped_config
from mlamem.models.hf_config import parse_config
from mlamem.models.weights import placement

# deepseek-ai/DeepSeek-V3 on the Hugging Face Hub (https://huggingface.co/api/models/deepseek-ai/DeepSeek-V3,
# "safetensors"): {"BF16": 3918786560, "F8_E4M3": 680571043840, "F32": 41555600}, total 684531386000;
# its README: "685B ... 671B of the Main Model weights and 14B of the MTP Module weights".
V3_BF16, V3_FP8, V3_FP32 = 3918786560, 680571043840, 41555600


def shipped_raw() -> dict:
    return json.loads(resources.files("mlamem.models").joinpath("deepseek-v3.2.json").read_text())


def deepseek_v3():
    """DeepSeek-V3.2 is DeepSeek-V3's shape plus the DSA indexer: without it, DeepSeek-V3."""
    return replace(shipped_config("deepseek-v3.2"), model_type="deepseek_v3", index_n_heads=0)


def test_deepseek_v3_matches_the_hubs_count_per_dtype():
    weights = count_weights(deepseek_v3())
    fp32 = sum(t.params for t in weights.tensors if t.fp32) + weights.scales() + weights.scales(mtp=True)
    total = weights.params() + weights.params(mtp=True) + weights.scales() + weights.scales(mtp=True)
    assert fp32 == V3_FP32
    assert total == V3_BF16 + V3_FP8 + V3_FP32
    assert weights.bytes() + weights.bytes(mtp=True) == 2 * V3_BF16 + V3_FP8 + 4 * V3_FP32


def test_deepseek_v3_main_and_mtp_round_to_the_published_671b_and_14b():
    weights = count_weights(deepseek_v3())
    assert round(weights.params() / 1e9) == 671
    # the 14B is the rounded difference: 13.46B of MTP params, with 685B of all the Hub counts
    all_params = weights.params() + weights.params(mtp=True) + weights.scales() + weights.scales(mtp=True)
    assert round(all_params / 1e9) - round(weights.params() / 1e9) == 14


def test_deepseek_v32_adds_the_indexer_and_rounds_to_the_published_685b():
    # https://huggingface.co/deepseek-ai/DeepSeek-V3.2: "Model size 685B params"
    v32, v3 = count_weights(shipped_config("deepseek-v3.2")), count_weights(deepseek_v3())
    indexer = sum(t.params for t in v32.tensors if ".indexer." in t.name)
    assert indexer == 62 * (64 * 128 * 1536 + 128 * 7168 + 2 * 128 + 64 * 7168)
    assert v32.params() + v32.params(mtp=True) == v3.params() + v3.params(mtp=True) + indexer
    assert round((v32.params() + v32.params(mtp=True) + v32.scales() + v32.scales(mtp=True)) / 1e9) == 685


def test_mtp_layers_are_counted_apart():
    config = shipped_config("deepseek-v3.2")
    without = count_weights(replace(config, num_nextn_predict_layers=0))
    weights = count_weights(config)
    assert weights.params() == without.params() and without.params(mtp=True) == 0
    assert weights.params(mtp=True) > 2 * config.vocab_size * config.hidden_size


def test_a_folder_or_its_config_json_reads_alike(tmp_path):
    raw = shipped_raw()
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert load_config(tmp_path) == load_config(tmp_path / "config.json") == shipped_config("deepseek-v3.2")


@pytest.mark.parametrize(("change", "field"), [
    ({"model_type": "llama"}, "config.model_type"),
    ({"hidden_size": None}, "config.hidden_size"),
    ({"index_n_heads": "64"}, "config.index_n_heads"),
    ({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128]}},
     "config.quantization_config.weight_block_size"),
    ({"quantization_config": {"quant_method": "awq"}}, "config.quantization_config.quant_method"),
])
def test_an_unknown_model_type_or_a_missing_field_names_the_field(change, field):
    raw = shipped_raw()
    with pytest.raises(UserError) as error:
        parse_config(raw | change)
    assert error.value.field == field


def test_an_unreadable_model_path_names_the_field(tmp_path):
    with pytest.raises(UserError) as error:
        load_config(tmp_path)
    assert error.value.field == "model"


def test_one_rank_holds_all_and_eight_ranks_share_all_but_the_replicated_tensors():
    weights = count_weights(shipped_config("deepseek-v3.2"))
    assert weights.bytes_per_rank(tp=1, expert_ranks=1) == weights.bytes()
    replicated = sum(weights._bytes(t) for t in weights.tensors if placement(t) == "replicated" and not t.mtp)
    assert 8 * weights.bytes_per_rank(tp=8, expert_ranks=8) == weights.bytes() + 7 * replicated
    # attention data-parallel (tp 1 per group, experts over 8 ranks) keeps attention whole on each rank
    assert weights.bytes_per_rank(tp=1, expert_ranks=8) > weights.bytes_per_rank(tp=8, expert_ranks=8)


def test_placement_follows_vllms_layers():
    names = {t.name: placement(t) for t in count_weights(shipped_config("deepseek-v3.2")).tensors}
    assert names["layers.0.mlp.gate_proj"] == names["layers.3.q_b_proj"] == names["lm_head"] == "tp"
    replicated = ("layers.3.mlp.gate", "layers.3.indexer.wq_b", "layers.3.q_a_proj", "norm")
    assert {names[name] for name in replicated} == {"replicated"}
    assert names["layers.3.mlp.experts.down_proj"] == "experts"
