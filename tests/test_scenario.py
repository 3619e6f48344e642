"""Scenarios: shipped files load into validated dataclasses; bad TOML names file and field."""

import pytest

from mlamem import scenario
from mlamem.errors import UserError
from mlamem.kernels import FlashMLA
from mlamem.testing import scenario_file


def test_shipped_scenarios_have_the_issue_shapes():
    """GLM-5 TP8 has 8 heads/rank padded to 64, DeepSeek-V3.2 16, Kimi-K2 with attention-DP 64."""
    caps = FlashMLA().capabilities()
    expect = {"glm5-fp8-tp8": (8, 64, 78, 656), "deepseek-v32-fp8-tp8": (16, 64, 61, 656),
              "kimi-k2-fp8-tp4-dp": (64, 64, 61, 656), "kimi-k2-context-reuse": (64, 64, 61, 576)}
    assert scenario.shipped_names() == sorted(expect)
    for name, (heads, padded, layers, kv_bytes) in expect.items():
        s = scenario.load(name)
        assert (s.heads_per_rank, caps.padded_heads(s.heads_per_rank), s.model.num_layers) == (
            heads, padded, layers)
        assert (s.d_qk, s.d_v, s.decode_topk, s.kv_cache_bytes_per_token_per_layer) == (
            576, 512, 2048, kv_bytes)


def test_glm5_is_the_source_prs_crashing_config():
    """The default scenario is 8xH100 80 GB at utilization 0.85 with MNBT 32768."""
    s = scenario.load(scenario.DEFAULT_SCENARIO)
    assert s.name == "glm5-fp8-tp8"
    assert (s.serving.max_num_batched_tokens, s.gpu.gpu_memory_utilization) == (32768, 0.85)
    assert s.gpu.memory_bytes == 81559 * 1024**2


def test_user_toml_path_loads(tmp_path):
    """A user's own TOML file, passed by path, loads like a shipped one."""
    path = scenario_file(tmp_path, edits={'name = "glm5-fp8-tp8"': 'name = "mine"'})
    assert scenario.load(str(path)).name == "mine"


@pytest.mark.parametrize(("old", "new", "expected"), [
    ("num_layers = 78", "num_layers = \"many\"", "[model].num_layers must be int"),
    ("kv_lora_rank = 512", "", "[model].kv_lora_rank is missing"),
    ("block_size = 64", "block_size = 64\nblok = 3", "[serving].blok is not a known"),
    ("gpu_memory_utilization = 0.85", "gpu_memory_utilization = 1.5",
     "[gpu].gpu_memory_utilization must be in (0, 1]"),
    ("tensor_parallel = 8", "tensor_parallel = 7", "[parallel].tensor_parallel must divide"),
    ("[serving]", "[serving", "not valid TOML"),
    ("index_topk = 2048", "", "[serving].synthetic_topk is required"),
])
def test_bad_toml_names_the_file_and_field(tmp_path, old, new, expected):
    """Each malformed scenario is a UserError that names the file and the field."""
    path = scenario_file(tmp_path, edits={old: new})
    with pytest.raises(UserError) as info:
        scenario.load(str(path))
    assert str(path) in str(info.value)
    assert expected in str(info.value)


def test_unknown_scenario_lists_valid_names():
    """An unknown name is rejected with every valid name in the message."""
    with pytest.raises(UserError, match="unknown scenario 'glm6'") as info:
        scenario.load("glm6")
    assert all(name in str(info.value) for name in scenario.shipped_names())
