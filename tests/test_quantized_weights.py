"""Quantized checkpoints' weights from their quantization_config, the shipped models beside the first
three, and the published checkpoint sizes (mlamem/spec/models/checkpoints.json) each count is held to."""

import json
from dataclasses import replace
from importlib import resources

import pytest

from mlamem.spec.errors import UserError
from mlamem.spec.models import checkpoints, count_weights, shipped_config, weights_per_rank
from mlamem.spec.models.hf_config import HUB_NAMES, SHIPPED, parse_config
from mlamem.spec.models.overrides import counted_weights
from mlamem.spec.models.quantization import parse_quantization
from mlamem.spec.models.weights import hf_module

OUT, IN = 2048, 7168  # one routed expert's gate_proj (out x in)


def compressed_tensors(bits=4, group=32, symmetric=True, inputs=None, ignore=()):
    return {"quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": list(ignore),
            "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": inputs, "weights": {
                "num_bits": bits, "type": "int", "strategy": "group", "group_size": group,
                "symmetric": symmetric}}}}


@pytest.mark.parametrize(("config", "label", "expected"), [
    # compressed_tensors_wNa16.py create_weights: int32 weight_packed (out, in / 8), bf16 weight_scale
    # (out, in / group), weight_shape (two int32 in the checkpoint)
    (compressed_tensors(), "INT4", OUT * IN // 2 + 2 * OUT * IN // 32 + 8),
    # ... and int32 weight_zero_point (out / 8, in / group) when asymmetric
    (compressed_tensors(symmetric=False, group=128), "INT4",
     OUT * IN // 2 + 2 * OUT * IN // 128 + 8 + 4 * (OUT // 8) * (IN // 128)),
    # compressed_tensors_w4a8_fp8.py: the same weight tensors, with 8-bit activations
    (compressed_tensors(group=128, inputs={"num_bits": 8, "type": "float", "dynamic": True}), "W4A8",
     OUT * IN // 2 + 2 * OUT * IN // 128 + 8),
    # auto_awq.py: int32 qweight (in, out / 8), int32 qzeros (in / group, out / 8), fp16 scales
    ({"quant_method": "awq", "bits": 4, "group_size": 64, "zero_point": True}, "INT4 AWQ",
     IN * OUT // 2 + (IN // 64) * OUT // 2 + 2 * (IN // 64) * OUT),
    # auto_gptq.py: int32 qweight (in / 8, out), qzeros, fp16 scales, int32 g_idx (in)
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}, "INT4 GPTQ",
     IN * OUT // 2 + (IN // 128) * OUT // 2 + 2 * (IN // 128) * OUT + 4 * IN),
    # modelopt.py NVFP4: two fp4 to a byte, an fp8 scale per 16, fp32 weight_scale_2 and input_scale
    ({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}, "NVFP4",
     OUT * IN // 2 + OUT * IN // 16 + 8),
    # fp8.py per tensor: an fp32 weight_scale, and an input_scale when activations are static
    ({"quant_method": "fp8", "activation_scheme": "static"}, "FP8", OUT * IN + 8),
    ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "FP8", OUT * IN + 4),
    # compressed_tensors_w8a8_fp8.py per channel: an fp32 scale per output row
    ({"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"g": {
        "targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}}},
     "FP8", OUT * IN + 4 * OUT),
    # DeepSeek's block fp8: an fp32 weight_scale_inv per 128 x 128 block
    ({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}, "FP8",
     OUT * IN + 4 * (OUT // 128) * (IN // 128)),
])
def test_one_weights_bytes_follow_its_quantizations_layout(config, label, expected):
    quantization = parse_quantization(config)
    assert quantization.label == label
    assert quantization.weight_bytes(OUT, IN) == expected
    # 384 experts' tensors counted together: the per-tensor scalars once per expert
    assert quantization.weight_bytes(384 * OUT, IN, copies=384) == 384 * expected


@pytest.mark.parametrize(("config", "module", "quantized"), [
    # compressed-tensors: exact names, or a regular expression matched from the start after `re:`
    (compressed_tensors(ignore=["re:.*self_attn.*"]), "model.layers.3.self_attn.q_a_proj", False),
    (compressed_tensors(ignore=["re:.*self_attn.*"]), "model.layers.3.mlp.experts.0.up_proj", True),
    (compressed_tensors(ignore=["re:self_attn"]), "model.layers.3.self_attn.q_a_proj", True),
    (compressed_tensors(ignore=["model.layers.3.mlp.gate_proj"]), "model.layers.3.mlp.gate_proj", False),
    (compressed_tensors(ignore=["model.layers.3.mlp.gate_proj"]), "model.layers.4.mlp.gate_proj", True),
    # AWQ's modules_to_not_convert: a substring of the module's name
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "modules_to_not_convert": ["self_attn"]},
     "model.layers.0.self_attn.kv_b_proj", False),
    # modelopt's exclude_modules: wildcards
    ({"quant_method": "modelopt", "quant_algo": "NVFP4", "exclude_modules": ["model.layers.*.self_attn*"]},
     "model.layers.60.self_attn.o_proj", False),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4", "exclude_modules": ["model.layers.*.self_attn*"]},
     "model.layers.60.mlp.shared_experts.down_proj", True),
])
def test_the_modules_left_unquantized_match_as_each_format_matches_them(config, module, quantized):
    assert parse_quantization(config).quantizes(module) is quantized


def test_the_checkpoints_module_names_are_deepseeks():
    names = {hf_module(t) for t in count_weights(shipped_config("deepseek-v3.2")).tensors}
    assert {"model.embed_tokens", "lm_head", "model.norm", "model.layers.0.self_attn.q_a_proj",
            "model.layers.0.self_attn.indexer.wq_b", "model.layers.0.mlp.gate_proj",
            "model.layers.3.mlp.experts.0.down_proj", "model.layers.3.mlp.shared_experts.up_proj",
            "model.layers.3.mlp.gate", "model.layers.61.eh_proj"} <= names


def test_kimi_k2_thinking_stores_only_the_routed_experts_in_int4():
    """Its ignore list keeps attention, the shared experts and the dense layer's MLP in bf16; the MoE
    router is no Linear, the head ignored: 60 layers x 3 x 384 expert tensors are int4."""
    weights = count_weights(shipped_config("kimi-k2-thinking"))
    quantized = [t for t in weights.tensors if weights.stored_quantized(t)]
    assert {t.name.split(".", 2)[2] for t in quantized} == {
        "mlp.experts.gate_proj", "mlp.experts.up_proj", "mlp.experts.down_proj"}
    assert sum(t.copies for t in quantized) == 60 * 3 * 384
    bf16 = sum(t.params for t in weights.tensors if not weights.stored_quantized(t) and not t.fp32)
    expert = 3 * 2048 * 7168
    assert weights.bytes() == 60 * 384 * (expert // 2 + 2 * expert // 32 + 3 * 8) + 2 * bf16 + 4 * 60 * 384


def test_the_kimi_k2_family_leaves_the_same_small_tensors_uncounted():
    """Kimi-K2-Instruct-0905 (block fp8) and Kimi-K2-Thinking (int4) differ from their published
    total_size by the same 15,616 B (61 x 256): one small tensor a layer mlamem does not model,
    whatever the experts' format; so the int4 layout is counted to the byte."""
    by_repo = {r["repo"]: r for r in checkpoints.records()}
    for repo in ("moonshotai/Kimi-K2-Instruct-0905", "moonshotai/Kimi-K2-Thinking"):
        assert by_repo[repo]["published"] - checkpoints.count(by_repo[repo]) == 61 * 256


@pytest.mark.parametrize("record", checkpoints.records(), ids=lambda r: r["repo"])
def test_each_published_checkpoint_size_is_counted_within_1_percent(record):
    counted = checkpoints.count(record)
    assert record["counted"] == counted, "run python scripts/checkpoint_sizes.py --write"
    assert abs(counted - record["published"]) < 0.01 * record["published"]
    assert record["source"] and record["what"] and record["quantization"]


def test_nvfp4_checkpoints_match_the_hubs_parameter_count_to_its_rounding():
    """nvidia's NVFP4 DeepSeek-R1 checkpoints, by the Hub's parameter count (0.1B rounding): with
    attention in bf16 (FP4), then with its o_proj in NVFP4 too (FP4-v2), the MTP layer in bf16."""
    for record in checkpoints.records():
        if record.get("unit") == "parameters":
            assert abs(checkpoints.count(record) - record["published"]) <= 0.05e9


def test_the_checkpoint_table_regenerates_from_the_records():
    text = checkpoints.table(checkpoints.records())
    assert text.count("\n") == 1 + len(checkpoints.records())
    assert "| `moonshotai/Kimi-K2-Thinking` |" in text and "594,205,920,512" in text


def test_kimi_k25_reads_its_language_model_under_text_config():
    """vLLM 0.33.0 builds Kimi-K2.5's language model from config.text_config; the top level's
    quantization_config applies to it; its vision tower is flagged, not counted."""
    k25, thinking = shipped_config("kimi-k2.5"), shipped_config("kimi-k2-thinking")
    assert k25.vision and not thinking.vision
    assert count_weights(k25).bytes() == count_weights(thinking).bytes()
    assert counted_weights(k25, tp=8, dp=1, mtp=False)[1].endswith(", the vision tower not counted")
    assert "vision" not in counted_weights(thinking, tp=8, dp=1, mtp=False)[1]
    with pytest.raises(UserError) as error:
        parse_config({"model_type": "kimi_k25", "text_config": {"model_type": "kimi_k2", "vocab_size": 0}})
    assert error.value.field == "config.text_config.vocab_size"


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_config_parses_and_names_its_source(name):
    raw = json.loads(resources.files("mlamem.spec.models").joinpath(SHIPPED[name]).read_text())
    assert "huggingface.co" in raw["_source"]
    assert shipped_config(name).num_hidden_layers in (61, 78)


def test_every_hub_name_reads_a_shipped_config():
    assert set(HUB_NAMES.values()) == set(SHIPPED)


@pytest.mark.parametrize(("name", "indexer", "label"), [
    ("deepseek-v3", False, "FP8"), ("deepseek-r1", False, "FP8"), ("deepseek-v3.1", False, "FP8"),
    ("deepseek-v3.2-exp", True, "FP8"), ("glm-5.1", True, "FP8"), ("kimi-k2-thinking", False, "INT4"),
])
def test_the_new_models_are_dense_mla_or_dsa_as_their_families(name, indexer, label):
    config = shipped_config(name)
    assert (config.has_indexer, config.quantization.label) == (indexer, label)


def test_glm51_and_v3_family_weigh_as_the_models_they_share_an_architecture_with():
    assert count_weights(shipped_config("glm-5.1")).bytes() == count_weights(shipped_config("glm-5")).bytes()
    v3 = count_weights(shipped_config("deepseek-v3")).bytes()
    assert count_weights(shipped_config("deepseek-r1")).bytes() == v3
    assert count_weights(shipped_config("deepseek-v3.1")).bytes() == v3


def test_int4_kimi_at_tp8_fits_an_h100_where_fp8_kimi_does_not():
    """At TP8 (no attention-DP) one rank holds an eighth of everything but the replicated tensors:
    Kimi-K2's block fp8 checkpoint 120.8 GiB, more than an H100's 79.2 GiB; Kimi-K2-Thinking's int4
    experts 71.0 GiB, which fits."""
    h100 = 81079 * 1024**2
    assert weights_per_rank(shipped_config("kimi-k2"), tp=8) > h100
    assert weights_per_rank(shipped_config("kimi-k2-thinking"), tp=8) == 76_182_662_656 < h100


@pytest.mark.parametrize(("quant", "field"), [
    ({"quant_method": "bitsandbytes"}, "config.quantization_config.quant_method"),
    ({"quant_method": "awq", "bits": 3, "group_size": 128}, "config.quantization_config.bits"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 0}, "config.quantization_config.group_size"),
    ({"quant_method": "modelopt", "quant_algo": "INT8_SQ"}, "config.quantization_config.quant_algo"),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4", "exclude_modules": "lm_head"},
     "config.quantization_config.exclude_modules"),
    ({"quant_method": "compressed-tensors", "config_groups": {}}, "config.quantization_config.config_groups"),
    ({"quant_method": "compressed-tensors", "format": "marlin-24", "config_groups": {"g": {"weights": {}}}},
     "config.quantization_config.format"),
    ({"quant_method": "fp8", "weight_block_size": [128, True]},
     "config.quantization_config.weight_block_size"),
    ({**compressed_tensors(), "ignore": ["re:("]}, "config.quantization_config.ignore"),
    ({"quant_method": "compressed-tensors", "config_groups": {"g": {"targets": 16, "weights": {}}}},
     "config.quantization_config.config_groups.targets"),
])
def test_a_quantization_config_it_cannot_read_is_one_line_naming_the_field(quant, field):
    with pytest.raises(UserError) as error:
        parse_quantization(quant)
    assert error.value.field == field and "\n" not in str(error.value)


def test_the_hubs_parameter_count_adds_elements_not_bytes():
    """Two fp4 values are one U8 element, eight int4 one I32; each scale one element."""
    nvfp4 = parse_quantization({"quant_method": "modelopt", "quant_algo": "NVFP4"})
    assert nvfp4.weight_elements(OUT, IN) == OUT * IN // 2 + OUT * IN // 16 + 2
    assert parse_quantization(compressed_tensors()).weight_elements(OUT, IN) == (
        OUT * IN // 8 + OUT * IN // 32 + 2)


def test_sglangs_w4afp8_stores_the_experts_in_int4_and_every_other_linear_in_block_fp8():
    """SGLang 0.5.23 w4afp8.py: W4AFp8MoEMethod's int8 weight (two int4 a byte), fp32
    weight_scale_inv per 128 inputs and bf16 input_scale per expert tensor; Fp8LinearMethod's block
    fp8 for the rest. DeepSeek-R1 so stored: its block fp8 checkpoint less the experts' difference."""
    w4afp8 = parse_quantization({"quant_method": "w4afp8"})
    assert w4afp8.label == "W4AFP8"
    assert w4afp8.weight_bytes(OUT, IN, expert=True) == OUT * IN // 2 + 4 * OUT * IN // 128 + 2
    assert w4afp8.weight_bytes(OUT, IN) == OUT * IN + 4 * (OUT // 128) * (IN // 128)
    fp8 = count_weights(shipped_config("deepseek-r1"))
    mixed = count_weights(replace(shipped_config("deepseek-r1"), quantization=w4afp8))
    expert = OUT * IN  # each of 58 MoE layers' 256 experts x 3 weights of 2048 x 7168
    per_expert_weight = (expert + 4 * 16 * 56) - (expert // 2 + 4 * expert // 128 + 2)
    assert fp8.bytes() - mixed.bytes() == 58 * 256 * 3 * per_expert_weight


def test_awq_group_size_minus_one_is_one_group_per_row_as_gptqs():
    """AWQ's group_size -1 is channelwise, as GPTQ's: vLLM 0.33.0 serves it through awq_marlin
    (quantization/utils/marlin_utils.py MARLIN_SUPPORTED_GROUP_SIZES = [-1, 32, 64, 128]);
    qweight (in, out / 8), one row of qzeros and of fp16 scales."""
    quantization = parse_quantization({"quant_method": "awq", "bits": 4, "group_size": -1})
    assert quantization.weight_bytes(OUT, IN) == IN * OUT // 2 + OUT // 2 + 2 * OUT


def test_a_compressed_tensors_scheme_it_cannot_read_names_what_is_missing_not_none():
    """A config group without format or type is told by the keys it lacks, never "None"."""
    quant = {"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {
        "num_bits": 4, "group_size": 0}}}}
    with pytest.raises(UserError, match="no format, weights.type, weights.strategy") as error:
        parse_quantization(quant)
    assert "None" not in str(error.value)
