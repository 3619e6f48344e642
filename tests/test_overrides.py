"""mlamem/spec/models/overrides.py and the options that drive it: --model, --gpu and --weights-per-rank
on every command that runs a scenario, and the one line for weights that do not fit."""

import json
from importlib import resources

import pytest

from mlamem.cli import main
from mlamem.spec import gpus, scenario
from mlamem.spec.models import overrides, shipped_config, weights_per_rank
from mlamem.testing import check_bad_input

GiB = 1024**3
CONFIGS = resources.files("mlamem.spec.models")
GLM5 = str(CONFIGS / "glm-5.json")  # the shipped GLM-5 config
DS = str(CONFIGS / "deepseek-v3.2.json")
# each command that runs a scenario, with what keeps its run small
COMMANDS = {"profile": ["profile", "--predict", "--tokens", "8", "--paths", "alloc"],
            "validate": ["validate", "-s", "glm5-fp8-tp8", "--tokens", "8"],
            "repro-oom": ["repro-oom", "--predict", "--paths", "alloc"],
            "plan": ["plan"],
            "graphs": ["graphs", "--predict", "--capture-sizes", "8", "--paths", "alloc"]}
BAD = {"--model": ("no-such-folder/config.json",
                   "--model: no-such-folder/config.json: no such model config"),
       "--gpu": ("H300", "--gpu: unknown GPU 'H300'; known: 'H100 SXM 80GB'"),
       "--weights-per-rank": ("40", "--weights-per-rank: '40' has no unit")}


def _json(args: list[str], capsys) -> dict:
    assert main([*args, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)
WEIGHTLESS = ("profile", "validate", "graphs")  # per-call and per-capture figures


@pytest.mark.parametrize("option", list(BAD))
@pytest.mark.parametrize("command", list(COMMANDS))
def test_each_command_takes_each_option_and_refuses_its_bad_value_in_one_line(command, option):
    """The option reaches the scenario the command loads: its bad value is the loader's line;
    profile, validate and graphs, whose figures the weights do not change, have no
    --weights-per-rank."""
    value, fix = BAD[option]
    if option == "--weights-per-rank" and command in WEIGHTLESS:
        fix = "No such option: --weights-per-rank"
    check_bad_input([*COMMANDS[command], option, value], fix)


SERVE = ("vllm serve zai-org/GLM-5-FP8 -tp 8 --max-num-seqs 256 --kv-cache-dtype fp8_ds_mla "
         "--max-num-batched-tokens 32768 --gpu-memory-utilization 0.85 --max-model-len 131072")


@pytest.mark.parametrize("args", [["scenarios", "--serve", SERVE], ["plan"],
                                  ["repro-oom", "--predict"]])
def test_weights_per_rank_zero_is_refused(args):
    """A rank holds weights: 0 is one line, on --serve as on the commands that load a file."""
    line = check_bad_input([*args, "--weights-per-rank", "0"], "one rank holds weights")
    assert line.startswith("mlamem: error: --weights-per-rank: ")


def test_serve_refuses_given_weights_larger_than_the_gpu():
    """--weights-per-rank is held to the GPU on --serve too (the H200 by default)."""
    line = check_bad_input(["scenarios", "--serve", SERVE, "--weights-per-rank", "500GiB"],
                           "GLM-5-FP8's weights are 500.0 GiB per rank at TP8, more than the "
                           "H200 SXM 141GB's 139.8 GiB")
    assert line.startswith("mlamem: error: --weights-per-rank: ")


def test_model_replaces_the_model_and_counts_the_weights_at_the_layout():
    glm = scenario.load("glm5-fp8-tp8")
    changed = overrides.apply(glm, model=DS)
    config = shipped_config("deepseek-v3.2")
    m = changed.model
    assert (m.name, m.num_attention_heads, m.num_layers, m.hidden_size, m.index_topk) == (
        "deepseek-v3.2 FP8", 128, 61, 7168, 2048)
    assert (m.kv_lora_rank, m.qk_rope_head_dim, m.qk_nope_head_dim, m.v_head_dim) == (
        config.kv_lora_rank, config.qk_rope_head_dim, config.qk_nope_head_dim, config.v_head_dim)
    assert changed.heads_per_rank == 16
    assert changed.parallel.weights_bytes == weights_per_rank(config, tp=8, engine="vllm")  # to the byte
    assert changed.parallel.weights_note == (f"counted from {DS}: 80.351 GiB per rank, with vllm's bf16 "
                                             "W_UK_T and W_UV (kv_b_proj) as it loads")
    assert (changed.serving, changed.gpu, changed.name) == (glm.serving, glm.gpu, glm.name)


def test_the_count_follows_attention_dp_and_the_mtp_layers(tmp_path):
    kimi = overrides.apply(scenario.load("kimi-k2-fp8-tp4-dp"), model=str(CONFIGS / "kimi-k2.json"))
    assert kimi.parallel.weights_bytes == weights_per_rank(shipped_config("kimi-k2"), tp=4, dp=4,
                                                           engine="vllm")
    path = tmp_path / "mtp.toml"  # speculative decoding loads the MTP layers
    path.write_text((resources.files("mlamem.scenarios") / "deepseek-v32-fp8-tp8.toml").read_text()
                    + "\n[vllm]\nnum_speculative_tokens = 1\n")
    mtp = overrides.apply(scenario.load(str(path)), model=DS)
    assert mtp.parallel.weights_bytes == weights_per_rank(shipped_config("deepseek-v3.2"), tp=8,
                                                          mtp=True, shared_head=True, engine="vllm")
    assert mtp.parallel.weights_note.endswith(
        "MTP layers included (speculative decoding), their own embedding and head the target's")


def test_model_reads_a_folder_holding_a_config_json(tmp_path):
    folder = tmp_path / "GLM-5"
    folder.mkdir()
    (folder / "config.json").write_text((CONFIGS / "glm-5.json").read_text())
    changed = overrides.apply(scenario.load("glm5-fp8-tp8"), model=str(folder), gpu="B200")
    assert changed.model.name == "GLM-5 FP8"
    assert changed.parallel.weights_bytes == weights_per_rank(shipped_config("glm-5"), tp=8, engine="vllm")


def test_gpu_retargets_and_weights_per_rank_is_a_labelled_override():
    glm = scenario.load("glm5-fp8-tp8")
    b200 = gpus.gpu("B200")
    changed = overrides.apply(glm, model=GLM5, gpu="B200", weights_bytes=30 * GiB)
    assert (changed.gpu.name, changed.gpu.memory_mib, changed.gpu.sm_count) == (
        "B200", b200.memory_mib, b200.sm_count)
    assert changed.gpu.gpu_memory_utilization == glm.gpu.gpu_memory_utilization
    assert changed.parallel.weights_bytes == 30 * GiB  # the override wins over the count
    assert changed.parallel.weights_note.startswith("override: given as --weights-per-rank")
    assert overrides.apply(glm) == glm


def test_plan_reads_each_option(capsys):
    plain = _json(["plan"], capsys)["plans"][0]
    counted = _json(["plan", "--model", GLM5, "--gpu", "H200 SXM 141GB"], capsys)
    given = _json(["plan", "--weights-per-rank", "30GiB"], capsys)["plans"][0]
    assert plain["weights_bytes"] == 40 * GiB and given["weights_bytes"] == 30 * GiB
    glm5 = weights_per_rank(shipped_config("glm-5"), tp=8, engine="vllm")
    assert counted["plans"][0]["weights_bytes"] == glm5
    assert counted["plans"][0]["request"]["gpu_memory_bytes"] == 143155 * 1024**2
    assert counted["scenario"]["model"] == "glm-5 FP8"
    assert given["budget_bytes"] - plain["budget_bytes"] == 10 * GiB  # utilization x total - weights


def test_repro_oom_reads_each_option(capsys):
    base = ["repro-oom", "--predict", "-s", "deepseek-v32-fp8-tp8", "--paths", "alloc"]
    plain = _json(base, capsys)
    counted = _json([*base, "--model", DS, "--gpu", "H200 NVL"], capsys)  # B200: refused
    given = _json([*base, "--weights-per-rank", "70GiB"], capsys)
    assert counted["scenario"]["target_gpu"] == "H200 NVL"
    assert counted["budget"]["gpu_memory_bytes"] == gpus.gpu("H200 NVL").memory_mib * 1024**2
    assert counted["scenario"]["weights_note"].startswith(f"counted from {DS}")
    assert given["scenario"]["weights_note"].startswith("override:")
    kv = [result["cases"][0]["kv_cache_bytes"] for result in (plain, given)]
    tokens = plain["cases"][0]["kv_cache_tokens"]
    block = kv[0] // tokens * 64  # the scenario's block_size
    assert abs(kv[1] - kv[0] - 10 * GiB) < block  # 10 GiB fewer weights, in whole KV blocks


@pytest.mark.parametrize("command", ["profile", "graphs"])
def test_profile_and_graphs_run_the_models_heads(command, capsys):
    result = _json([*COMMANDS[command], "--model", DS], capsys)
    assert (result["scenario"]["model"], result["scenario"]["heads_per_rank"]) == (
        "deepseek-v3.2 FP8", 16)


@pytest.mark.parametrize("command", ["repro-oom", "plan"])
def test_weights_that_do_not_fit_the_gpu_are_one_line(command):
    """The shipped GLM-5 config at TP8 on an H100: 88.7 GiB per rank, refused before any run."""
    line = check_bad_input([*COMMANDS[command], "--model", GLM5, "--gpu", "H100 SXM 80GB"],
                           "glm-5 FP8's weights are 89.0 GiB per rank at TP8, more than the "
                           "H100 SXM 80GB's 79.2 GiB")
    assert line.startswith("mlamem: error: --weights-per-rank: ")
    check_bad_input([*COMMANDS[command], "--weights-per-rank", "80GiB"],
                    "GLM-5 FP8's weights are 80.0 GiB per rank at TP8, more than the H100")


@pytest.mark.parametrize("command", ["repro-oom", "plan"])
def test_the_memory_given_is_the_target(command):
    """--gpu-memory names the target's memory: the weights are held to it. They are the
    scenario file's, so the line names the file's field, not --weights-per-rank."""
    line = check_bad_input([*COMMANDS[command], "--gpu-memory", "39GiB"],
                           "GLM-5 FP8's weights are 40.0 GiB per rank at TP8, more than the "
                           "emulated GPU's 39.0 GiB")
    assert line.startswith("mlamem: error: glm5-fp8-tp8.toml: [parallel].weights_gib_per_rank: ")


@pytest.mark.parametrize("command", ["repro-oom", "plan"])
def test_a_files_weights_that_do_not_fit_name_its_field(command, tmp_path):
    text = (resources.files("mlamem.scenarios") / "glm5-fp8-tp8.toml").read_text()
    path = tmp_path / "big.toml"
    path.write_text(text.replace("weights_gib_per_rank = 40", "weights_gib_per_rank = 90"))
    line = check_bad_input([*COMMANDS[command], "-s", path],
                           "weights are 90.0 GiB per rank at TP8, more than the H100")
    assert line.startswith(f"mlamem: error: {path}: [parallel].weights_gib_per_rank: ")


def test_weights_that_fit_run(capsys):
    for args in (["--model", GLM5, "--weights-per-rank", "40GiB"],
                 ["--model", GLM5, "--gpu", "H200 SXM 141GB"],
                 ["--model", GLM5, "--gpu-memory", "120GiB"]):
        assert main([*COMMANDS["plan"], *args]) == 0
    capsys.readouterr()


def test_a_config_without_a_field_names_it(tmp_path):
    raw = json.loads((CONFIGS / "glm-5.json").read_text())
    del raw["hidden_size"]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    check_bad_input(["plan", "--model", str(tmp_path)], "config.json: hidden_size is missing")


@pytest.mark.parametrize(("change", "fix"), [
    ({"quantization_config": 5}, "config.json: quantization_config needs a JSON object"),
    ({"quantization_config": [1]}, "config.json: quantization_config needs a JSON object"),
    ({"model_type": ["glm_moe_dsa"]}, "config.json: model_type ['glm_moe_dsa'] is not known"),
    ({"tie_word_embeddings": "yes"}, "config.json: tie_word_embeddings needs true or false"),
    ({"num_hidden_layers": 10**12}, "config.json: num_hidden_layers needs an integer in 1..4096"),
    ({"n_routed_experts": 10**9}, "config.json: n_routed_experts needs an integer in 1..65536"),
    ({"hidden_size": 1 << 40}, "config.json: hidden_size needs an integer in 1..2147483647"),
    ({"moe_layer_freq": 0}, "config.json: moe_layer_freq needs an integer in 1..2147483647, got 0"),
    ({"num_attention_heads": 0}, "config.json: num_attention_heads needs an integer in 1.."),
    ({"index_n_heads": 0}, "config.json: index_n_heads needs an integer in 1.."),
    ({"num_hidden_layers": 0}, "config.json: num_hidden_layers needs an integer in 1..4096"),
    ({"kv_lora_rank": None}, "config.json: kv_lora_rank is missing"),
])
def test_a_hostile_config_field_is_one_line(tmp_path, change, fix):
    """A field of the wrong type or an impossible size is one line naming it, before any count
    (10^12 layers would enumerate 10^12 tensors)."""
    raw = {**json.loads((CONFIGS / "glm-5.json").read_text()), **change}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    check_bad_input(["repro-oom", "--predict", "--model", str(tmp_path)], fix)


@pytest.mark.parametrize("args", [
    ["plan", "--gpu", "H200 SXM 141GB", "--model"],
    ["profile", "--predict", "--tokens", "4096", "--paths", "alloc", "--model"],
    ["scenarios", "--serve"]])
@pytest.mark.parametrize(("change", "fix"), [
    ({"moe_layer_freq": 0}, "config.json: moe_layer_freq needs an integer in 1..2147483647, got 0"),
    ({"num_attention_heads": 0}, "config.json: num_attention_heads needs an integer in 1.."),
    ({"index_n_heads": 0}, "config.json: index_n_heads needs an integer in 1.."),
    ({"kv_lora_rank": None}, "config.json: kv_lora_rank is missing"),
    ({"num_attention_heads": 3}, "the model's [parallel].tensor_parallel must divide "
                                 "num_attention_heads"),
])
def test_a_zero_or_missing_count_is_the_configs_own_field_on_every_door(tmp_path, args, change,
                                                                        fix):
    """A count of 0 (moe_layer_freq divides a layer index) or a missing field is one line naming
    the config.json's field, on plan, profile and --serve alike; never a shipped TOML's name."""
    raw = {**json.loads((CONFIGS / "glm-5.json").read_text()), **change}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    if args[0] == "scenarios":
        args = [*args, f"vllm serve {tmp_path} -tp 8 --kv-cache-dtype fp8_ds_mla "
                       "--max-model-len 8192"]
    else:
        args = [*args, str(tmp_path)]
    line = check_bad_input(args, fix)
    assert ".toml" not in line and "[model]" not in line


@pytest.mark.parametrize("content", ["[1, 2]", '{"model_type": NaN}', "not json"])
def test_a_config_that_is_not_one_object_is_one_line(tmp_path, content):
    (tmp_path / "config.json").write_text(content)
    check_bad_input(["repro-oom", "--predict", "--model", str(tmp_path)], "--model: ")
