"""A serve command that names a shipped model: by its hub name, by a local folder of that name with
or without its config.json, or by the Hugging Face cache's folder; dense-MLA and quantized models."""

import json
from importlib import resources

import pytest

from mlamem.spec.errors import UserError
from mlamem.spec.models import shipped_config, weights_per_rank
from mlamem.spec.models.hf_config import hub_config
from mlamem.spec.serve_command import from_command

GiB = 1024**3
H200 = "H200 SXM 141GB"
DSA = "-tp 8 --kv-cache-dtype fp8_ds_mla --max-model-len 131072"
DENSE = "-tp 8 --kv-cache-dtype fp8 --max-model-len 32768"


@pytest.mark.parametrize(("model", "shipped"), [
    ("/models/GLM-5.1-FP8", "glm-5.1"), ("/models/glm-5.1-fp8/", "glm-5.1"),
    ("/data/DeepSeek-V3.2-Exp", "deepseek-v3.2-exp"), ("~/models/GLM-5", "glm-5"),
    ("./checkpoints/Kimi-K2-Thinking", "kimi-k2-thinking"), ("data/hf/DeepSeek-R1", "deepseek-r1"),
    ("/root/.cache/huggingface/hub/models--zai-org--GLM-5.1-FP8/snapshots/0123abc", "glm-5.1"),
])
def test_a_local_folder_without_its_config_is_read_by_its_name_with_a_note(model, shipped):
    config = shipped_config(shipped)
    flags = DSA if config.has_indexer else DENSE
    built = from_command(f"vllm serve {model} {flags}", gpu_name=H200, weights_bytes=40 * GiB)
    assert (built.scenario.model.num_attention_heads, built.scenario.model.num_layers) == (
        config.num_attention_heads, config.num_hidden_layers)
    notes = " | ".join(built.notes)
    assert f"model {model}: no config.json there, so read by the folder's name as" in notes
    assert f"mlamem/spec/models/{shipped}.json" in notes


def test_a_local_folder_with_its_config_reads_that_config(tmp_path):
    folder = tmp_path / "GLM-5.1-FP8"
    folder.mkdir()
    raw = json.loads(resources.files("mlamem.spec.models").joinpath("glm-5.1.json").read_text())
    (folder / "config.json").write_text(json.dumps({**raw, "num_attention_heads": 32}))
    built = from_command(f"vllm serve {folder} {DSA}", gpu_name=H200, weights_bytes=40 * GiB)
    assert built.scenario.model.num_attention_heads == 32
    assert not any("read by the folder's name" in note for note in built.notes)


def test_a_folder_of_no_shipped_name_is_one_line_naming_the_fix():
    with pytest.raises(UserError) as error:
        from_command(f"vllm serve /models/My-Model {DSA}", gpu_name=H200, weights_bytes=40 * GiB)
    assert "give the model's config.json" in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("hub", ["deepseek-ai/DeepSeek-V3", "deepseek-ai/DeepSeek-R1-0528",
                                 "deepseek-ai/DeepSeek-V3.1-Terminus"])
def test_deepseek_v3_family_runs_the_dense_decode_with_counted_weights(hub):
    """MLA without the DSA indexer: vLLM's dense decode; the block fp8 weights counted at TP8."""
    built = from_command(f"vllm serve {hub} -tp 8 --max-model-len 32768 --kv-cache-dtype fp8",
                         gpu_name=H200)
    s = built.scenario
    assert s.operations == ("dense-decode",) and s.model.num_attention_heads == 128
    expected = weights_per_rank(shipped_config("deepseek-v3"), tp=8, engine="vllm") / GiB
    assert s.parallel.weights_gib_per_rank == round(expected, 3)
    assert s.model.name.endswith(" FP8")


def test_kimi_k2_thinking_counts_its_int4_experts():
    built = from_command("vllm serve moonshotai/Kimi-K2-Thinking -tp 8 --max-model-len 32768 "
                         "--kv-cache-dtype fp8", gpu_name="H100 SXM 80GB")
    s = built.scenario
    assert (s.model.name, s.operations) == ("Kimi-K2-Thinking INT4", ("dense-decode",))
    assert s.parallel.weights_gib_per_rank == round(76_182_662_656 / GiB, 3)


@pytest.mark.parametrize(("hub", "fp8"), [("zai-org/GLM-5", False), ("zai-org/GLM-5-FP8", True),
                                          ("zai-org/GLM-5.1", False), ("zai-org/GLM-5.1-FP8", True)])
def test_glms_bf16_checkpoints_are_counted_in_bf16(hub, fp8):
    """zai-org/GLM-5 and GLM-5.1 are the bf16 weights, -FP8 the block fp8 ones: the same fields,
    without the quantization_config for the bf16 ones, which the note says; a name that says FP8
    is not given it twice."""
    built = from_command(f"vllm serve {hub} {DSA}", gpu_name=H200, weights_bytes=40 * GiB)
    assert built.scenario.model.name == hub.split("/")[-1]
    assert any("(bf16 weights)" in note for note in built.notes) is not fp8
    if not fp8:  # every tensor in bf16: about twice the fp8 checkpoint's bytes
        fp8_bytes = weights_per_rank(shipped_config("glm-5"), tp=8)
        assert 1.9 * fp8_bytes < weights_per_rank(hub_config(hub), tp=8) < 2 * fp8_bytes
