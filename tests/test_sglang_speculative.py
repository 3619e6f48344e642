"""SGLang 0.5.23's speculative decoding from a pasted command (EAGLE, and NEXTN, its alias,
drafting with the checkpoint's MTP layer): the flags as sglang/srt/arg_groups/speculative_hook.py
reads them (_handle_eagle_family, _auto_choose_speculative_params), the KV cell with the draft
layer's (model_executor/pool_configurator.py, DefaultPoolConfigurator.__init__), the draft's
weights, the request pool its 48 running requests give, and a --serve prediction."""

import json
from importlib import resources

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlamem.cli import main
from mlamem.commands.repro import host_setup
from mlamem.engines.sglang import SGLang, SGLangBudget
from mlamem.kernels import FlashMLA
from mlamem.runtime.memory import SimulatedMemory
from mlamem.spec import scenario
from mlamem.spec.engines import sglang as rules
from mlamem.spec.models import overrides, shipped_config, weights_per_rank
from mlamem.spec.serve_command import from_command
from mlamem.testing import check_bad_input, check_command_reads_back

GiB = 1 << 30
H200 = "H200 SXM 141GB"
SG = "python3 -m sglang.launch_server"
GLM, DS = "zai-org/GLM-5-FP8", "deepseek-ai/DeepSeek-V3.2"
FLAGS = "--tp 8 --kv-cache-dtype fp8_e4m3"
# a pasted GLM-5 command: EAGLE with 3 steps, top-k 1, 4 draft tokens
EAGLE = (f"{SG} --model-path {GLM} {FLAGS} --speculative-algorithm EAGLE "
         "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4 "
         "--mem-fraction-static 0.85")
PLAIN = f"{SG} --model-path {GLM} {FLAGS} --mem-fraction-static 0.85"
# the speculative list for max_bs 512 (cuda_graph_hook.py, generate_decode_cuda_graph_batch_sizes)
# within a request pool of 48, largest first: range(1, 9) + range(10, 33, 2) + range(40, 65, 4)
SPECULATIVE_48 = [48, 44, 40, *range(32, 9, -2), *range(8, 0, -1)]


def unmodelled(notes) -> str:
    return next((n for n in notes if n.startswith("not modelled: ")), "")


def test_the_commands_draft_flags_reach_the_scenario():
    """A pasted GLM-5 command: EAGLE, 3 steps, top-k 1, 4 draft tokens per request in [sglang];
    none of the four flags is named as not modelled."""
    built = from_command(EAGLE, gpu_name=H200)
    assert built.scenario.section("sglang").speculative_num_draft_tokens == 4
    assert "--speculative" not in unmodelled(built.notes)
    assert any(n.startswith("speculative decoding: EAGLE (steps 3, top-k 1, 4 draft tokens, "
                            "given)") for n in built.notes)


def test_top_k_1_takes_steps_plus_one_draft_tokens():
    """NEXTN is EAGLE (_resolve_speculative_algorithm_alias, any case: the hook upper-cases it);
    with top-k 1, _handle_eagle_family sets speculative_num_draft_tokens to steps + 1: 8 -> 3."""
    built = from_command(f"sglang serve {DS} {FLAGS} --context-length 8192 "
                         "--speculative-algorithm nextn --speculative-num-steps 2 "
                         "--speculative-eagle-topk 1 --speculative-num-draft-tokens 8",
                         gpu_name=H200)
    assert built.scenario.section("sglang").speculative_num_draft_tokens == 3
    assert any("NEXTN is SGLang's EAGLE" in n and "--speculative-num-draft-tokens 8 is "
               "steps + 1 = 3 with top-k 1" in n for n in built.notes)


@pytest.mark.parametrize("model", [GLM, DS])
def test_the_algorithm_alone_takes_sglangs_auto_chosen_steps(model):
    """Only the algorithm: _auto_choose_speculative_params gives (3, 1, 4) for
    GlmMoeDsaForCausalLM and DeepseekV32ForCausalLM."""
    built = from_command(f"{SG} --model-path {model} {FLAGS} --context-length 8192 "
                         "--speculative-algorithm NEXTN", gpu_name=H200)
    assert built.scenario.section("sglang").speculative_num_draft_tokens == 4
    assert any("(steps 3, top-k 1, 4 draft tokens, SGLang 0.5.23's auto-chosen" in n
               for n in built.notes)


@pytest.mark.parametrize(("algorithm", "architecture", "chosen"), [
    ("EAGLE", "GlmMoeDsaForCausalLM", (3, 1, 4)), ("EAGLE", "DeepseekV32ForCausalLM", (3, 1, 4)),
    ("EAGLE", "DeepseekV3ForCausalLM", (3, 1, 4)), ("EAGLE", "LlamaForCausalLM", (5, 4, 8)),
    ("EAGLE", "Grok1ForCausalLM", (5, 4, 8)), ("STANDALONE", "LlamaForCausalLM", (3, 1, 4)),
    ("EAGLE", None, (3, 1, 4))])
def test_auto_chosen_params_follow_the_source(algorithm, architecture, chosen):
    assert rules.auto_speculative_params(algorithm, architecture) == chosen


@pytest.mark.parametrize(("flags", "fix"), [
    ("--speculative-algorithm EAGLE --speculative-eagle-topk 1",
     "give --speculative-num-steps too"),
    ("--speculative-algorithm EAGLE --speculative-num-draft-tokens 4",
     "give --speculative-num-steps too"),
    ("--speculative-algorithm EAGLE --speculative-num-steps 3",
     "give --speculative-eagle-topk 1"),
    ("--speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 4",
     "page of 64"),
    ("--speculative-algorithm EAGLE --speculative-num-steps 0 --speculative-eagle-topk 1",
     "--speculative-num-steps 0: must be at least 1"),
])
def test_draft_settings_sglang_refuses_are_one_line(flags, fix):
    check_bad_input(["scenarios", "--serve", f"{SG} --model-path {GLM} {FLAGS} "
                     f"--context-length 8192 {flags}", "--gpu", H200], fix)


@pytest.mark.parametrize("algorithm", ["EAGLE3", "NGRAM", "STANDALONE", "DFLASH", "MTP", "foo"])
def test_other_algorithms_are_one_note_never_refused(algorithm):
    """Any other algorithm (MTP and unknown names included: SGLang 0.5.23's from_string knows
    no MTP) is named in one note; the rank runs without drafting, its weights without the MTP
    layer's."""
    built = from_command(f"{PLAIN} --speculative-algorithm {algorithm} "
                         "--speculative-num-steps 2", gpu_name=H200)
    assert built.scenario.section("sglang").speculative_num_draft_tokens is None
    [note] = [n for n in built.notes if f"--speculative-algorithm {algorithm}" in n]
    assert "not modelled" in note
    assert "--speculative-num-steps" in unmodelled(built.notes)
    assert built.scenario.parallel.weights_gib_per_rank == round(
        weights_per_rank(shipped_config("glm-5"), tp=8, engine="sglang") / GiB, 3)


def test_another_draft_checkpoint_is_not_modelled():
    built = from_command(f"{EAGLE} --speculative-draft-model-path org/other-draft", gpu_name=H200)
    assert built.scenario.section("sglang").speculative_num_draft_tokens is None
    assert any(n.startswith("--speculative-draft-model-path org/other-draft: ")
               and "not modelled" in n for n in built.notes)


def test_the_dsa_cell_adds_the_draft_layers_at_two_shapes():
    """DefaultPoolConfigurator.__init__ for an EAGLE target of a DSA model: the target's cell,
    plus int(latent part x draft layers / layers) and the draft layers' indexer keys. Per layer
    656 B of latent (512 fp8 + 4 fp32 scales x 4 + 64 bf16 RoPE) and 132 B of indexer keys
    (128 + one fp32 scale): GLM-5's 78 layers 788 x 78 = 61464, + 656 + 132 = 62252;
    DeepSeek-V3.2's 61 layers 48068 + 788 = 48856."""
    shape = {"kv_lora_rank": 512, "qk_rope_head_dim": 64, "index_head_dim": 128}
    for layers, target, drafted in ((78, 61464, 62252), (61, 48068, 48856)):
        assert rules.dsa_fp8_cell_bytes(**shape, num_layers=layers) == target
        assert rules.dsa_fp8_cell_bytes(**shape, num_layers=layers, draft_layers=1) == drafted


def emulate(scenario, *, graphs: bool = False) -> dict:
    budget = SGLangBudget(gpu_memory_bytes=scenario.gpu.memory_bytes,
                          utilization=scenario.gpu.gpu_memory_utilization,
                          max_num_batched_tokens=SGLang.default_step_tokens(
                              scenario, scenario.gpu.memory_bytes), cuda_graphs=graphs)
    memory = SimulatedMemory(non_torch=host_setup("flashmla", predict=True,
                                                  target_bytes=scenario.gpu.memory_bytes))
    return SGLang.emulate(memory, scenario, FlashMLA(), budget, "alloc", sm_count=132).to_dict()


def test_the_pool_holds_fewer_tokens_with_the_draft_layer():
    """The same weights and fraction: the same pool bytes, in cells of 62252 B with the draft
    layer, not 61464."""
    drafted, plain = (emulate(from_command(c, gpu_name=H200, weights_bytes=80 * GiB).scenario)
                      for c in (EAGLE, PLAIN))
    assert (drafted["kv_cell_bytes"], plain["kv_cell_bytes"]) == (62252, 61464)
    for case, cell in ((drafted, 62252), (plain, 61464)):
        pool = rules.kv_pool_bytes(case["free_after_init_bytes"], case["free_before_model_bytes"],
                                   0.85)
        assert case["kv_cache_tokens"] == pool // cell // 64 * 64
    assert drafted["free_after_init_bytes"] == plain["free_after_init_bytes"]
    assert drafted["kv_cache_tokens"] < plain["kv_cache_tokens"]


def test_the_drafts_weights_are_the_mtp_layers_without_their_own_head():
    """EAGLE loads the checkpoint's MTP layer; its own embedding and head (DeepSeek's) are freed
    for the target's (speculative/eagle_worker_v2.py, set_embed_and_head;
    models/deepseek_v2.py DeepseekV2ForCausalLM.set_embed_and_head). DeepSeek-V3.2 at TP8:
    2 x 129280 / 8 x 7168 x 2 B less than every MTP tensor."""
    ds = shipped_config("deepseek-v3.2")
    head = 2 * 129280 // 8 * 7168 * 2
    assert weights_per_rank(ds, tp=8, mtp=True, shared_head=True) == \
        weights_per_rank(ds, tp=8, mtp=True) - head
    glm = shipped_config("glm-5")  # GLM's MTP layer stores no embedding or head of its own
    assert weights_per_rank(glm, tp=8, mtp=True, shared_head=True) == \
        weights_per_rank(glm, tp=8, mtp=True)
    for command, model, drafting in ((EAGLE, glm, True), (PLAIN, glm, False)):
        built = from_command(command, gpu_name=H200)
        assert built.scenario.parallel.weights_gib_per_rank == round(weights_per_rank(
            model, tp=8, mtp=drafting, shared_head=drafting, engine="sglang") / GiB, 3)
    built = from_command(f"{SG} --model-path {DS} {FLAGS} --speculative-algorithm EAGLE",
                         gpu_name=H200)
    assert built.scenario.parallel.weights_gib_per_rank == round(
        weights_per_rank(ds, tp=8, mtp=True, shared_head=True, engine="sglang") / GiB, 3)
    assert any("MTP layers included (speculative decoding), their own embedding and head "
               "the target's" in n for n in built.notes)


def test_eagle_caps_the_request_pool_at_48_not_the_reserve():
    """_handle_eagle_family resets max_running_requests to 48 after handle_gpu_memory_settings
    has sized the reserve (max_bs 512 on the H200 at TP8, its list the speculative one): the
    derived fraction is the plain command's, and the request pool (resolve_max_num_reqs) is 48,
    so the graphs captured are the speculative list's up to 48, at 4 tokens per request. A
    given --max-running-requests stays the user's."""
    derived = [from_command(c.replace(" --mem-fraction-static 0.85", ""), gpu_name=H200)
               for c in (EAGLE, PLAIN)]
    assert derived[0].scenario.gpu.gpu_memory_utilization == \
        derived[1].scenario.gpu.gpu_memory_utilization == 0.886
    case = emulate(from_command(EAGLE, gpu_name=H200).scenario, graphs=True)
    assert case["graph_request_pool"] == 48
    assert case["graph_batch_sizes"] == SPECULATIVE_48
    assert case["graph_tokens_per_request"] == 4
    given = emulate(from_command(f"{EAGLE} --max-running-requests 64", gpu_name=H200).scenario,
                    graphs=True)
    assert given["graph_request_pool"] == 64 and given["graph_batch_sizes"][0] == 64


def test_repro_oom_serve_models_the_draft(capsys):
    """`repro-oom --predict --serve` with a pasted GLM-5 command: no speculative flag among the
    notes' not-modelled ones, and a smaller pool than without drafting."""
    pools = []
    for command in (EAGLE, PLAIN):
        assert main(["repro-oom", "--predict", "--format", "json", "--serve", command,
                     "--gpu", H200]) == 0
        out, err = capsys.readouterr()
        assert "--speculative" not in next((line for line in err.splitlines()
                                            if "note: not modelled" in line), "")
        pools.append(json.loads(out)["cases"][0]["kv_cache_bytes"])
    assert pools[0] < pools[1]


def test_a_scenario_drafting_on_sglang_recounts_its_weights_with_model(tmp_path):
    """`--model` on a scenario whose [sglang] table drafts (speculative_num_draft_tokens): the
    MTP layer counted without its own embedding and head (overrides.loaded_weights)."""
    path = tmp_path / "eagle.toml"
    path.write_text((resources.files("mlamem.scenarios") / "deepseek-v32-fp8-tp8.toml").read_text()
                    + "\n[sglang]\nspeculative_num_draft_tokens = 4\n")
    config = str(resources.files("mlamem.spec.models") / "deepseek-v3.2.json")
    changed = overrides.apply(scenario.load(str(path)), model=config)
    assert changed.parallel.weights_bytes == weights_per_rank(
        shipped_config("deepseek-v3.2"), tp=8, mtp=True, shared_head=True, engine="vllm")
    assert changed.parallel.weights_note.endswith(
        "MTP layers included (speculative decoding), their own embedding and head the target's")


def test_a_scenario_drafting_without_mtp_layers_is_one_line(tmp_path):
    """SGLang sizes the draft's KV by the MTP layers: a scenario that drafts without
    [model].num_nextn_predict_layers is refused in one line."""
    text = (resources.files("mlamem.scenarios") / "glm5-fp8-tp8.toml").read_text()
    path = tmp_path / "eagle.toml"
    path.write_text(text.replace("num_nextn_predict_layers = 1\n", "")
                    + "\n[sglang]\nspeculative_num_draft_tokens = 4\n")
    check_bad_input(["repro-oom", "--predict", "-s", str(path), "--engine", "sglang"],
                    "[model].num_nextn_predict_layers")


_WORDS = ["--speculative-algorithm", "EAGLE", "nextn", "EAGLE3", "MTP", "--speculative-num-steps",
          "--speculative-eagle-topk", "--speculative-num-draft-tokens", "0", "1", "3", "-2", "x",
          "--speculative-draft-model-path", GLM, "--max-running-requests", "16"]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(words=st.lists(st.sampled_from(_WORDS), max_size=10))
def test_any_draft_flags_give_a_scenario_or_one_line(words):
    """Any mix of the speculative flags builds a scenario that reads back as it was written,
    or is refused in one line."""
    check_command_reads_back(" ".join([f"{SG} --model-path {GLM} {FLAGS} --context-length 4096",
                                       *words]), gpu_name=H200, weights_bytes=80 * GiB)
