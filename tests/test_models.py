"""The Hugging Face config reader and the checkpoint's weight count, against published figures."""

import json
from dataclasses import replace
from importlib import resources

import pytest

from mlamem.spec.errors import UserError
from mlamem.spec.models import count_weights, load_config, shipped_config, weights_fit, weights_per_rank
from mlamem.spec.models.hf_config import hub_config, parse_config
from mlamem.spec.models.weights import placement

# deepseek-ai/DeepSeek-V3 on the Hugging Face Hub (https://huggingface.co/api/models/deepseek-ai/DeepSeek-V3,
# "safetensors"): {"BF16": 3918786560, "F8_E4M3": 680571043840, "F32": 41555600}, total 684531386000;
# its README: "685B ... 671B of the Main Model weights and 14B of the MTP Module weights".
V3_BF16, V3_FP8, V3_FP32 = 3918786560, 680571043840, 41555600


def shipped_raw() -> dict:
    return json.loads(resources.files("mlamem.spec.models").joinpath("deepseek-v3.2.json").read_text())


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
    ({"quantization_config": {"quant_method": "bitsandbytes"}}, "config.quantization_config.quant_method"),
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


# GLM-5 and Kimi-K2, the shipped configs of the other two families

def fp8(rows: int, cols: int) -> int:
    """A block-fp8 tensor's bytes: one byte a weight, four a 128 x 128 block's fp32 scale."""
    return rows * cols + 4 * -(-rows // 128) * -(-cols // 128)


def test_the_shipped_configs_read_by_their_model_types():
    glm, kimi = shipped_config("glm-5"), shipped_config("kimi-k2")
    assert (glm.model_type, glm.has_indexer, glm.mtp_embeddings) == ("glm_moe_dsa", True, False)
    assert (kimi.model_type, kimi.has_indexer, kimi.num_nextn_predict_layers) == ("kimi_k2", False, 0)
    assert glm.fp8_block == kimi.fp8_block == (128, 128)


def test_glm5_main_model_rounds_to_the_published_744b():
    # https://huggingface.co/zai-org/GLM-5 (README): "744B parameters (40B active)"; GLM-5's technical
    # report counts 744B total besides its 1 MTP layer
    weights = count_weights(shipped_config("glm-5"))
    assert round(weights.params() / 1e9) == 744


def test_glm_mtp_layer_matches_the_checkpoints_bytes_without_its_own_embedding():
    """GLM's MTP layer shares the main model's embedding and head: zai-org/GLM-5.2's layer 78 (GLM-5's
    dimensions) holds 791 tensors, 19,905,841,664 bytes in bf16, with no embed_tokens nor shared_head.head
    (a third-party extractor pinned to the Hub checkpoint, revision b4734de4, its EXPECTED_PAYLOAD_BYTES)."""
    bf16 = count_weights(replace(shipped_config("glm-5"), quantization=None))
    assert bf16.bytes(mtp=True) == 19_905_841_664
    assert not any(t.mtp and ("embed_tokens" in t.name or "shared_head.head" in t.name) for t in bf16.tensors)


# GLM-5.2's indexer_types (IndexShare: a full indexer every 4th layer after 3 full ones), as third-party
# copies of its config quote it; GLM-5.3's checkpoint has the same tensors
GLM52_INDEXERS = ["full"] * 3 + (["shared"] * 3 + ["full"]) * 18 + ["shared"] * 3


def glm52():
    raw = json.loads(resources.files("mlamem.spec.models").joinpath("glm-5.json").read_text())
    return parse_config(raw | {"indexer_types": GLM52_INDEXERS})


def checkpoint_tensors(config) -> tuple[int, int]:
    """The checkpoint's safetensors entries without the scales, and the block-fp8 ones among them (each has
    one weight_scale_inv entry): the count groups a layer's routed experts into one Tensor, and the
    indexer's LayerNorm weight and bias into one."""
    weights = count_weights(config)
    entries = fp8 = 0
    for t in weights.tensors:
        n = 2 if t.name.endswith(".indexer.k_norm") else 1
        n *= config.n_routed_experts if ".mlp.experts." in t.name else 1
        entries += n
        fp8 += n if weights.stored_quantized(t) else 0
    return entries, fp8


def test_glm52s_tensors_and_their_fp8_match_the_checkpoints_census():
    # NVIDIA-NeMo/Megatron-Bridge pull request #6117 (https://github.com/NVIDIA-NeMo/Megatron-Bridge/pull/6117):
    # an audit of GLM-5.3's 423 shard headers finds 59,585 base tensors, identical in names and shapes to
    # GLM-5.2's, 59,044 of them block-scaled FP8. The count matches both: the shared layers hold no indexer,
    # the MTP layer no embedding or head, and the norms, router, indexer weights_proj and eh_proj stay bf16.
    assert checkpoint_tensors(glm52()) == (59_585, 59_044)


def test_kimi_k2_matches_the_checkpoints_total_size_within_1_percent():
    # https://huggingface.co/moonshotai/Kimi-K2-Instruct/resolve/main/model.safetensors.index.json
    # "total_size": 1029173256720, as a third-party source ledger that fetched it records (139,644 tensors);
    # the count is 61 tensors and 6,832 bytes (61 x 112) short of it: a small tensor a layer it does not model
    weights = count_weights(shipped_config("kimi-k2"))
    entries, fp8 = checkpoint_tensors(shipped_config("kimi-k2"))
    assert entries + fp8 == 139_644 - 61
    assert abs(weights.bytes() - 1_029_173_256_720) < 0.01 * 1_029_173_256_720
    assert abs(weights.bytes() - 1_029_173_256_720) < 10_000
    # the Hub's "1.03T params" counts the fp32 scales as parameters; the README's "1T" rounds further
    assert round((weights.params() + weights.scales()) / 1e12, 2) == 1.03


def test_glm5_fp8_bytes_per_rank_at_tp8():
    """GLM-5 FP8 at TP8 (vLLM: attention, dense and shared MLPs and vocabulary over 8 ranks, routed experts
    over the 8 ranks of expert parallelism), by hand, bytes per rank, MTP apart:

    - embedding and head, bf16, split 8: 2 x 2 x 154880 x 6144 / 8 = 475,791,360
    - final norm, replicated: 2 x 6144 = 12,288
    - each of the 78 layers, replicated: 2 norms 2 x 2 x 6144, q_a fp8(2048, 6144), q_a norm 2 x 2048,
      kv_a fp8(576, 6144), kv_a norm 2 x 512, indexer wq_b fp8(4096, 2048), wk fp8(128, 6144), k_norm
      (LayerNorm weight and bias) 2 x 256, weights_proj bf16 2 x 32 x 6144; split 8: q_b fp8(64 x 256, 2048),
      kv_b fp8(64 x 448, 512), o fp8(6144, 64 x 256)
    - the 3 dense layers, split 8: gate and up fp8(12288, 6144), down fp8(6144, 12288)
    - the 75 MoE layers: router bf16 2 x 256 x 6144 and fp32 bias 4 x 256, replicated; split 8: experts gate
      and up fp8(256 x 2048, 6144), down fp8(256 x 6144, 2048), the shared expert's gate and up
      fp8(2048, 6144), down fp8(6144, 2048)
    = 95,228,613,120 B = 88.69 GiB, more than an 80 GB H100 holds
    """
    per_layer = (2 * 2 * 6144 + fp8(2048, 6144) + 2 * 2048 + fp8(576, 6144) + 2 * 512 + fp8(4096, 2048)
                 + fp8(128, 6144) + 2 * 256 + 2 * 32 * 6144
                 + (fp8(64 * 256, 2048) + fp8(64 * 448, 512) + fp8(6144, 64 * 256)) // 8)
    dense = (2 * fp8(12288, 6144) + fp8(6144, 12288)) // 8
    moe = (2 * 256 * 6144 + 4 * 256
           + (2 * fp8(256 * 2048, 6144) + fp8(256 * 6144, 2048) + 2 * fp8(2048, 6144) + fp8(6144, 2048)) // 8)
    hand = 2 * 2 * 154880 * 6144 // 8 + 2 * 6144 + 78 * per_layer + 3 * dense + 75 * moe
    weights = count_weights(shipped_config("glm-5"))
    assert weights.bytes_per_rank(tp=8, expert_ranks=8) == hand == 95_228_613_120


def test_kimi_k2_fp8_bytes_per_rank_at_tp4_with_attention_dp4():
    """Kimi-K2 FP8 on 4 ranks with attention data-parallel 4, as scenarios/kimi-k2-*.toml run it: each rank is
    one attention group of TP 1 holding attention, the dense MLP, the shared experts and the vocabulary whole;
    the routed experts split over the 4 ranks. By hand, bytes per rank (no MTP layers):

    - embedding and head, bf16: 2 x 2 x 163840 x 7168 = 4,697,620,480; final norm 2 x 7168
    - each of the 61 layers: 2 norms 2 x 2 x 7168, q_a fp8(1536, 7168), q_a norm 2 x 1536, q_b
      fp8(64 x 192, 1536), kv_a fp8(576, 7168), kv_a norm 2 x 512, kv_b fp8(64 x 256, 512),
      o fp8(7168, 64 x 128)
    - the 1 dense layer: gate and up fp8(18432, 7168), down fp8(7168, 18432)
    - the 60 MoE layers: router bf16 2 x 384 x 7168, fp32 bias 4 x 384, shared expert gate and up
      fp8(2048, 7168), down fp8(7168, 2048); split 4: experts gate and up fp8(384 x 2048, 7168), down
      fp8(384 x 7168, 2048)
    = 267,972,937,568 B = 249.6 GiB, more than an H200 holds
    """
    per_layer = (2 * 2 * 7168 + fp8(1536, 7168) + 2 * 1536 + fp8(64 * 192, 1536) + fp8(576, 7168) + 2 * 512
                 + fp8(64 * 256, 512) + fp8(7168, 64 * 128))
    dense = 2 * fp8(18432, 7168) + fp8(7168, 18432)
    moe = (2 * 384 * 7168 + 4 * 384 + 2 * fp8(2048, 7168) + fp8(7168, 2048)
           + (2 * fp8(384 * 2048, 7168) + fp8(384 * 7168, 2048)) // 4)
    hand = 2 * 2 * 163840 * 7168 + 2 * 7168 + 61 * per_layer + dense + 60 * moe
    weights = count_weights(shipped_config("kimi-k2"))
    assert weights.bytes_per_rank(tp=1, expert_ranks=4) == hand == 267_972_937_568


def test_glms_indexer_pattern_drops_the_shared_layers_indexers():
    pattern, config, every = GLM52_INDEXERS, glm52(), shipped_config("glm-5")
    indexers = {t.name.split(".")[1] for t in count_weights(config).tensors if ".indexer." in t.name}
    assert indexers == {str(i) for i, kind in enumerate(pattern) if kind == "full"} | {"78"}  # MTP holds one
    one = sum(t.params for t in count_weights(every).tensors if t.name.startswith("layers.0.indexer."))
    assert count_weights(every).params() - count_weights(config).params() == pattern.count("shared") * one


@pytest.mark.parametrize("pattern", [["full"] * 77, ["full"] * 77 + ["dense"], "full"])
def test_an_indexer_pattern_that_is_not_one_kind_per_layer_names_the_field(pattern):
    raw = json.loads(resources.files("mlamem.spec.models").joinpath("glm-5.json").read_text())
    with pytest.raises(UserError) as error:
        parse_config(raw | {"indexer_types": pattern})
    assert error.value.field == "config.indexer_types"


H100, H200 = 81079 * 2**20, 143155 * 2**20  # the scenarios' memory_mib of each


def test_weights_per_rank_places_a_scenarios_layout():
    glm, kimi = shipped_config("glm-5"), shipped_config("kimi-k2")
    assert weights_per_rank(glm, tp=8) == count_weights(glm).bytes_per_rank(tp=8, expert_ranks=8)
    # attention-DP 4 of TP4: four groups of one rank, the experts over all four
    assert weights_per_rank(kimi, tp=4, dp=4) == count_weights(kimi).bytes_per_rank(tp=1, expert_ranks=4)
    mtp = count_weights(glm).bytes_per_rank(tp=8, expert_ranks=8, mtp=True)
    assert weights_per_rank(glm, tp=8, mtp=True) == weights_per_rank(glm, tp=8) + mtp
    assert mtp > 0


@pytest.mark.parametrize(("model", "tp", "dp", "layers", "heads", "nope", "v"), [
    ("glm-5", 8, 1, 78, 64 // 8, 192, 256),  # TP8: 8 heads a rank
    ("deepseek-v3.2", 8, 8, 61, 128, 128, 128),  # attention-DP 8: every head on every rank
])
def test_the_up_projection_copies_are_kv_b_projs_shape_in_bf16(model, tp, dp, layers, heads, nope, v):
    """vLLM's W_UK_T and W_UV (a dequantized kv_b_proj), SGLang's w_kc and w_vc: a rank's heads of
    kv_b_proj, (nope + v) x kv_lora_rank each, in bf16, one per attention layer."""
    config = shipped_config(model)
    copy = layers * heads * (nope + v) * config.kv_lora_rank * 2
    for engine in ("vllm", "sglang"):
        counted = weights_per_rank(config, tp=tp, dp=dp, engine=engine)
        assert counted == weights_per_rank(config, tp=tp, dp=dp) + copy
    assert weights_per_rank(config, tp=tp, dp=dp, engine="trtllm-context-reuse") == weights_per_rank(
        config, tp=tp, dp=dp)
    # the MTP layer's attention too, where it loads
    drafting = {"tp": tp, "dp": dp, "mtp": True}
    assert (weights_per_rank(config, **drafting, engine="vllm") - weights_per_rank(config, **drafting)
            == copy + copy // layers)


def test_vllm_copies_kv_b_proj_only_where_the_checkpoint_stores_it_quantized():
    """get_and_maybe_dequant_weights gives an unquantized kv_b_proj back as is (W_UV and W_UK_T are its
    views); SGLang's contiguous w_kc and w_vc are copies either way."""
    bf16 = hub_config("zai-org/GLM-5.1")  # the bf16 checkpoint
    assert bf16.quantization is None
    assert weights_per_rank(bf16, tp=8, engine="vllm") == weights_per_rank(bf16, tp=8)
    copies = 78 * 8 * 448 * 512 * 2
    assert weights_per_rank(bf16, tp=8, engine="sglang") == weights_per_rank(bf16, tp=8) + copies


def test_weights_that_exceed_the_gpu_say_so_in_one_line():
    glm, kimi = shipped_config("glm-5"), shipped_config("kimi-k2")
    assert weights_fit("GLM-5", glm, tp=8, gpu="H100 SXM 80GB", gpu_bytes=H100) == (
        "GLM-5's weights are 88.7 GiB per rank at TP8, more than the H100 SXM 80GB's 79.2 GiB")
    assert weights_fit("Kimi-K2", kimi, tp=4, dp=4, gpu="H200 SXM 141GB", gpu_bytes=H200) == (
        "Kimi-K2's weights are 249.6 GiB per rank at TP4 with attention-DP 4, more than the H200 SXM 141GB's "
        "139.8 GiB")
    assert weights_fit("GLM-5", glm, tp=8, gpu="H200 SXM 141GB", gpu_bytes=H200) is None


def test_weights_fit_exactly_at_the_gpus_bytes_and_not_a_byte_above():
    glm = shipped_config("glm-5")
    per_rank = weights_per_rank(glm, tp=8, mtp=True)
    assert weights_fit("GLM-5", glm, tp=8, gpu="GPU", gpu_bytes=per_rank, mtp=True) is None
    line = weights_fit("GLM-5", glm, tp=8, gpu="GPU", gpu_bytes=per_rank - 1, mtp=True)
    assert line is not None and "at TP8 with its MTP layers" in line and "\n" not in line


@pytest.mark.parametrize(("tp", "dp", "field"), [(0, 1, "tensor_parallel"), (8, 3, "attention_data_parallel"),
                                                 (8, 0, "attention_data_parallel")])
def test_a_layout_the_ranks_cannot_hold_names_its_field(tp, dp, field):
    with pytest.raises(UserError) as error:
        weights_per_rank(shipped_config("glm-5"), tp=tp, dp=dp)
    assert error.value.field == field


def _nested_config(path, depth: int = 100_000):
    """A config.json nested deeper than Python's JSON parser recurses."""
    path.write_text('{"a": ' * depth + "1" + "}" * depth)
    return path


def test_a_deeply_nested_config_json_is_one_line(tmp_path):
    """100k levels of nesting: UserError naming the file, not a RecursionError."""
    config = _nested_config(tmp_path / "config.json")
    for given in (config, tmp_path):
        with pytest.raises(UserError, match=r"config\.json: not a config\.json \(nested deeper"):
            load_config(given)


def test_a_deeply_nested_config_json_is_one_line_from_the_cli(tmp_path):
    from mlamem.testing import check_bad_input

    config = _nested_config(tmp_path / "config.json")
    check_bad_input(["repro-oom", "--model", config], "nested deeper")
    check_bad_input(["scenarios", "--serve", f"vllm serve {tmp_path}"], "nested deeper")


@pytest.mark.parametrize(("engine", "version", "every"), [
    ("vllm", "0.23.0", True), ("vllm", "0.24.0", False), ("vllm", None, False),
    ("sglang", "0.5.13", True), ("sglang", "0.5.17", True), ("sglang", "0.5.18", False),
    ("sglang", None, False), ("trtllm", None, False)])
def test_engines_build_an_indexer_on_every_layer_before_indexcache_reached_their_models(
        engine, version, every):
    """vLLM before 0.24.0 (models/deepseek_v2.py: `if self.is_v32:` builds the Indexer, then
    marks the layer skip_topk) and SGLang before 0.5.18 (models/deepseek_v2.py `if
    self.use_dsa: self.indexer = Indexer(...)`) hold an indexer on an IndexCache shared layer too:
    GLM-5.2's 57 shared layers each hold one like layer 0's, replicated; GLM-5 has none shared."""
    from mlamem.spec.models.overrides import indexers_on_every_layer

    assert indexers_on_every_layer(engine, version) is every
    config = glm52()
    # wq_b and wk in fp8 with a scale per 128 x 128 block, weights_proj and k_norm in bf16
    per_layer = (fp8(32 * 128, 2048) + fp8(128, 6144) + 2 * 32 * 6144 + 2 * 2 * 128)
    extra = (weights_per_rank(config, tp=8, every_indexer=True)
             - weights_per_rank(config, tp=8))
    assert extra == GLM52_INDEXERS.count("shared") * per_layer == 57 * 9_571_008
    glm5 = shipped_config("glm-5")
    assert weights_per_rank(glm5, tp=8, every_indexer=True) == weights_per_rank(glm5, tp=8)
