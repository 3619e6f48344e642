"""Scenarios: shipped files load into validated dataclasses; bad TOML names file and field."""

import dataclasses
from importlib import resources

import pytest

from mlamem.kernels import FlashMLA
from mlamem.spec import scenario
from mlamem.spec.errors import UserError
from mlamem.testing import scenario_file


def test_shipped_scenarios_have_the_issue_shapes():
    """GLM-5 TP8 has 8 heads/rank padded to 64, DeepSeek-V3.2 16, Kimi-K2 with attention-DP 64."""
    caps = FlashMLA().capabilities()
    expect = {"glm5-fp8-tp8": (8, 64, 78, 2048, 656), "deepseek-v32-fp8-tp8": (16, 64, 61, 2048, 656),
              "kimi-k2-fp8-tp4-dp": (64, 64, 61, 2048, 656),
              "kimi-k2-context-reuse": (64, 64, 61, 2048, 576),
              "kimi-k2-dense-tp4-dp": (64, 64, 61, None, 1152),
              "kimi-k2-dense-fp8-tp4-dp": (64, 64, 61, None, 576)}
    assert scenario.shipped_names() == sorted(expect)
    for name, (heads, padded, layers, topk, kv_bytes) in expect.items():
        s = scenario.load(name)
        assert (s.heads_per_rank, caps.padded_heads(s.heads_per_rank), s.model.num_layers) == (
            heads, padded, layers)
        assert (s.d_qk, s.d_v, s.decode_topk, s.kv_cache_bytes_per_token_per_layer) == (
            576, 512, topk, kv_bytes)


def test_shipped_scenarios_name_their_operations():
    """The DSA models drive sparse decode and prefill, Kimi-K2's stand-ins sparse decode, and the
    two Kimi-K2 dense files FlashMLA's dense decode: 256 requests of 8192 tokens, 64-token pages."""
    ops = {name: scenario.load(name).operations for name in scenario.shipped_names()}
    assert ops == {"glm5-fp8-tp8": ("sparse-decode", "sparse-prefill"),
                   "deepseek-v32-fp8-tp8": ("sparse-decode", "sparse-prefill"),
                   "kimi-k2-fp8-tp4-dp": ("sparse-decode",),
                   "kimi-k2-context-reuse": ("sparse-decode",),
                   "kimi-k2-dense-tp4-dp": ("dense-decode",),
                   "kimi-k2-dense-fp8-tp4-dp": ("dense-decode",)}
    for name in ("kimi-k2-dense-tp4-dp", "kimi-k2-dense-fp8-tp4-dp"):
        s = scenario.load(name).serving
        assert (s.block_size, s.max_batch_size, s.decode_context_len, s.synthetic_topk,
                s.max_num_batched_tokens, s.max_model_len) == (64, 256, 8192, None, 32768, 131072)


@pytest.mark.parametrize("name", scenario.shipped_names())
def test_shipped_scenarios_round_trip(name):
    """Every shipped scenario survives to_dict/from_dict (through TOML-like plain data, with
    operations as a list) unchanged, and its one-line summary names its operations, never
    "topk None"."""
    s = scenario.load(name)
    data = scenario.to_dict(s)
    assert data["operations"] == list(s.operations)
    assert scenario.from_dict(data, s.source) == s
    line = s.one_line()
    assert "+".join(s.operations) in line and "None" not in line


def test_dense_one_line_shows_the_batch():
    """A dense-decode scenario's summary shows its batch instead of a top-k."""
    line = scenario.load("kimi-k2-dense-tp4-dp").one_line()
    assert "dense-decode, batch 256 x 8192 tokens" in line and "topk" not in line


def test_old_toml_without_operations_is_sparse_decode(tmp_path):
    """A file from before `operations` (no key) loads as sparse decode, and to_dict writes it."""
    path = scenario_file(tmp_path, edits={
        'operations = ["sparse-decode", "sparse-prefill"]\n': ""})
    assert "operations" not in path.read_text().replace("operations it drives", "")
    s = scenario.load(str(path))
    assert s.operations == ("sparse-decode",) and s.decode_topk == 2048
    data = scenario.to_dict(s)
    assert data["operations"] == ["sparse-decode"]
    del data["operations"]
    assert scenario.from_dict(data, "old") == scenario.from_dict(scenario.to_dict(s), "old")


def test_dense_decode_only_has_no_topk():
    """decode_topk is None without a sparse operation, an int with one."""
    assert scenario.load("kimi-k2-dense-tp4-dp").decode_topk is None
    assert scenario.load("kimi-k2-context-reuse").decode_topk == 2048


def test_glm5_is_the_source_prs_crashing_config():
    """The default scenario is 8xH100 80 GB at utilization 0.85 with MNBT 32768."""
    s = scenario.load(scenario.DEFAULT_SCENARIO)
    assert s.name == "glm5-fp8-tp8"
    assert (s.serving.max_num_batched_tokens, s.gpu.gpu_memory_utilization) == (32768, 0.85)
    assert s.gpu.memory_bytes == 81079 * 1024**2


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
    # the model validates types strictly and numbers as finite
    ("gpu_memory_utilization = 0.85", "gpu_memory_utilization = nan",
     "[gpu].gpu_memory_utilization must be a finite number, got nan"),
    ("gpu_memory_utilization = 0.85", "gpu_memory_utilization = inf",
     "[gpu].gpu_memory_utilization must be a finite number, got inf"),
    ("num_layers = 78", "num_layers = true", "[model].num_layers must be int, got True"),
    ("num_layers = 78", "num_layers = 78.0", "[model].num_layers must be int, got 78.0"),
    ("max_num_seqs = 256 ", "max_num_seqs = \"many\" ", "[vllm].max_num_seqs must be int, got 'many'"),
    # what a rank allocates beyond attention: sizes in range, a top-k among the experts, a scheme
    ("num_experts_per_tok = 8", "num_experts_per_tok = 300",
     "[model].num_experts_per_tok 300 exceeds n_routed_experts 256"),
    ("n_shared_experts = 1", "n_shared_experts = -1", "[model].n_shared_experts must be >= 0"),
    ("vocab_size = 154880", "vocab_size = 0", "[model].vocab_size must be > 0"),
    ("moe_intermediate_size = 2048", "moe_intermediate_size = 99999999999",
     "[model].moe_intermediate_size must be at most"),
    ('quantization = "fp8-block"', 'quantization = "fp4"', "[model].quantization expected one of"),
])
def test_bad_toml_names_the_file_and_field(tmp_path, old, new, expected):
    """Each malformed scenario is a UserError that names the file and the field."""
    path = scenario_file(tmp_path, edits={old: new})
    with pytest.raises(UserError) as info:
        scenario.load(str(path))
    assert str(path) in str(info.value)
    assert expected in str(info.value)


GLM_OPS = 'operations = ["sparse-decode", "sparse-prefill"]'
DENSE_OPS = 'operations = ["dense-decode"]'
DENSE_CTX = "decode_context_len = 8192 "
DENSE_TOPK = "# dense decode: no synthetic_topk"


@pytest.mark.parametrize(("base", "edits", "expected"), [
    # operations: known names, at least one, each once, a list of strings
    ("glm5-fp8-tp8", {GLM_OPS: 'operations = ["sparse-decoder"]'},
     "[top].operations has unknown 'sparse-decoder'; expected names from ['sparse-decode', "
     "'dense-decode', 'sparse-prefill']; fix that field"),
    ("glm5-fp8-tp8", {GLM_OPS: "operations = []"},
     "[top].operations is empty; list at least one of ['sparse-decode', 'dense-decode', "
     "'sparse-prefill'], or leave it out for ['sparse-decode']; fix that field"),
    ("glm5-fp8-tp8", {GLM_OPS: 'operations = ["sparse-decode", "sparse-decode"]'},
     "[top].operations lists 'sparse-decode' more than once; name each operation once"),
    ("glm5-fp8-tp8", {GLM_OPS: 'operations = "sparse-decode"'},
     "[top].operations must be a list of names from ['sparse-decode', 'dense-decode', "
     "'sparse-prefill'], got 'sparse-decode'"),
    ("glm5-fp8-tp8", {GLM_OPS: 'operations = ["sparse-decode", "dense-decode"]'},
     "[top].operations lists both sparse-decode and dense-decode, which read different caches"),
    # a dense model needs synthetic_topk for either sparse operation
    ("kimi-k2-fp8-tp4-dp", {"synthetic_topk = 2048 ": "# "},
     "[serving].synthetic_topk is required for sparse-decode on a dense-MLA model "
     "([model].index_topk unset): set it, or drop sparse-decode from operations; fix that field"),
    ("kimi-k2-fp8-tp4-dp", {"synthetic_topk = 2048 ": "# ",
                            'operations = ["sparse-decode"]': 'operations = ["sparse-prefill"]'},
     "[serving].synthetic_topk is required for sparse-prefill on a dense-MLA model"),
    ("kimi-k2-dense-tp4-dp", {DENSE_TOPK: "synthetic_topk = 2048"},
     "[serving].synthetic_topk is set but no operation uses it (operations ['dense-decode']): "
     "remove it, or add sparse-decode or sparse-prefill to operations"),
    # sparse decode reads fp8_ds_mla; dense decode a plain bf16 or fp8 cache
    ("glm5-fp8-tp8", {'kv_cache_dtype = "fp8_ds_mla"': 'kv_cache_dtype = "bf16"'},
     "[serving].kv_cache_dtype is 'bf16'; sparse-decode reads the fp8_ds_mla cache: set "
     'kv_cache_dtype = "fp8_ds_mla", or operations = ["dense-decode"] for a plain cache'),
    ("kimi-k2-dense-tp4-dp", {'kv_cache_dtype = "bf16"': 'kv_cache_dtype = "fp8_ds_mla"'},
     "[serving].kv_cache_dtype is 'fp8_ds_mla'; dense-decode reads a plain cache of 576 values "
     "per token: set it to 'bf16' or 'fp8'; fix that field"),
    # only a context-reuse scenario (TRT-LLM's cache in kv_cache_dtype) may pair fp8 with it
    ("kimi-k2-context-reuse", {"chunked_prefill = false": "chunked_prefill = true"},
     "[serving].kv_cache_dtype is 'fp8'; sparse-decode reads the fp8_ds_mla cache"),
    # dense decode needs its batch: max_batch_size and decode_context_len
    ("kimi-k2-dense-tp4-dp", {"max_batch_size = 256 ": "# "},
     "[serving].max_batch_size is required for dense-decode (requests per decode step): set it, "
     "or drop dense-decode from operations"),
    ("kimi-k2-dense-tp4-dp", {DENSE_CTX: "# "},
     "[serving].decode_context_len is required for dense-decode (context tokens of each "
     "request): set it, or drop dense-decode from operations"),
    ("kimi-k2-dense-tp4-dp", {DENSE_CTX: "decode_context_len = 0 "},
     "[serving].decode_context_len must be > 0, got 0"),
    ("kimi-k2-dense-tp4-dp", {DENSE_CTX: "decode_context_len = 131073 "},
     "[serving].decode_context_len 131073 exceeds [serving].max_model_len 131072: a request "
     "cannot hold more tokens than a sequence; lower it or raise max_model_len"),
    ("kimi-k2-dense-tp4-dp", {DENSE_CTX: 'decode_context_len = "long" '},
     "[serving].decode_context_len must be int, got 'long'"),
    ("kimi-k2-fp8-tp4-dp", {"block_size = 64 ": "decode_context_len = 8192\nblock_size = 64 "},
     "[serving].decode_context_len is set but no operation uses it (operations "
     "['sparse-decode']): remove it, or add dense-decode to operations"),
])
def test_operation_rules_are_one_line_errors(tmp_path, base, edits, expected):
    """Each operation's needs are checked at load; a miss is one line naming file, field, fix."""
    path = scenario_file(tmp_path, base, edits)
    with pytest.raises(UserError) as info:
        scenario.load(str(path))
    message = str(info.value)
    assert message.startswith(f"{path}: ") and expected in message and "\n" not in message


@pytest.mark.parametrize(("base", "edits", "operations"), [
    # sparse prefill alone on a DSA model, or on a dense one with synthetic_topk
    ("glm5-fp8-tp8", {GLM_OPS: 'operations = ["sparse-prefill"]'}, ("sparse-prefill",)),
    ("kimi-k2-fp8-tp4-dp", {'operations = ["sparse-decode"]': 'operations = ["sparse-prefill"]'},
     ("sparse-prefill",)),
    # dense decode with the sparse prefill (which needs a top-k) on an fp8 cache
    ("kimi-k2-dense-fp8-tp4-dp", {DENSE_OPS: 'operations = ["dense-decode", "sparse-prefill"]',
                                  DENSE_TOPK: "synthetic_topk = 2048"},
     ("dense-decode", "sparse-prefill")),
    # a dense model without synthetic_topk is fine when nothing sparse runs
    ("kimi-k2-dense-tp4-dp", {}, ("dense-decode",)),
    # decode_context_len may be the whole max_model_len
    ("kimi-k2-dense-tp4-dp", {DENSE_CTX: "decode_context_len = 131072 "}, ("dense-decode",)),
])
def test_operation_rules_accept(tmp_path, base, edits, operations):
    """What each operation needs, and no more, loads."""
    s = scenario.load(str(scenario_file(tmp_path, base, edits)))
    assert s.operations == operations
    assert scenario.from_dict(scenario.to_dict(s), s.source) == s


def test_check_decode_skips_the_topk_without_sparse_operations():
    """check_decode bounds the top-k only when there is one; a dense scenario passes it."""
    dense = scenario.load("kimi-k2-dense-tp4-dp")
    assert scenario.check_decode(dense, (64, 128), "FlashMLA") == 64


def test_scenario_accepts_operations_as_a_list():
    """Built directly, a list of operations reads as a tuple, and bad ones are refused too."""
    s = scenario.load("glm5-fp8-tp8")
    assert dataclasses.replace(s, operations=["sparse-decode"]).operations == ("sparse-decode",)
    with pytest.raises(scenario.FieldError, match=r"\[top\]\.operations has unknown 'prefill'"):
        dataclasses.replace(s, operations=("prefill",))


def test_unknown_scenario_lists_valid_names():
    """An unknown name is rejected with every valid name in the message."""
    with pytest.raises(UserError, match="unknown scenario 'glm6'") as info:
        scenario.load("glm6")
    assert all(name in str(info.value) for name in scenario.shipped_names())


def test_vllm_settings_in_serving_migrate_to_their_own_table():
    """vLLM's CUDA-graph settings are its [vllm] table; a file of the older layout, with them in
    [serving], loads the same (one migrate step), and a key given in both is refused."""
    shipped = (resources.files("mlamem.scenarios") / "glm5-fp8-tp8.toml").read_text()
    text = shipped[:shipped.index("\n[vllm]\n") + 1]  # without its [vllm] table (the PR's 256)
    old = scenario.parse(text.replace("[serving]\n", "[serving]\nmax_num_seqs = 256\n"
                                       'cudagraph_mode = "FULL"\n'), "old.toml")
    new = scenario.parse(text + '\n[vllm]\nmax_num_seqs = 256\ncudagraph_mode = "FULL"\n',
                          "new.toml")
    assert old.section("vllm") == new.section("vllm")
    assert (new.section("vllm").max_num_seqs, new.section("vllm").cudagraph_mode) == (256, "FULL")
    assert scenario.parse(text, "none.toml").section("vllm").max_num_seqs == 1024  # the default
    again = scenario.from_dict(scenario.to_dict(new), "again")
    assert again.section("vllm") == new.section("vllm")
    assert "vllm" not in scenario.to_dict(scenario.parse(text, "none.toml"))  # none given: none out
    with pytest.raises(UserError, match=r"\[serving\].max_num_seqs is also in \[vllm\]"):
        scenario.parse(text.replace("[serving]\n", "[serving]\nmax_num_seqs = 8\n")
                        + "\n[vllm]\nmax_num_seqs = 256\n", "both.toml")
    with pytest.raises(UserError, match=r"\[vllm\].max_num_seqs must be > 0"):
        scenario.parse(text + "\n[vllm]\nmax_num_seqs = 0\n", "zero.toml")


def test_the_file_schema_names_every_key_the_shipped_files_use():
    """docs/schemas/scenario.schema.json comes from the models: each shipped file's keys are in
    it, its sections' required keys are the models' required fields, and no other key is."""
    import tomllib

    schema = scenario.file_schema()
    assert schema["additionalProperties"] is False
    for name in scenario.shipped_names():
        data = tomllib.loads((resources.files("mlamem.scenarios") / f"{name}.toml").read_text())
        assert set(data) <= set(schema["properties"]), name
        for section, table in data.items():
            if isinstance(table, dict):
                properties = schema["properties"][section]
                assert set(table) <= set(properties["properties"]), (name, section)
                assert set(properties.get("required", [])) <= set(table), (name, section)
    required = schema["properties"]["serving"]["required"]
    assert required == [f.name for f in dataclasses.fields(scenario.Serving)
                        if f.default is dataclasses.MISSING]


@pytest.mark.parametrize("name", scenario.shipped_names())
def test_to_toml_reads_back_to_an_equal_scenario(name):
    shipped = scenario.load(name)
    again = scenario.parse(scenario.to_toml(shipped), "again")
    assert scenario.to_dict(again) == scenario.to_dict(shipped)
    assert again.sections == shipped.sections
