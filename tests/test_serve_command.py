"""mlamem/serve_command: a scenario from a pasted serve command, field by field; gpus.py's table."""

import importlib.util
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlamem.cli import main
from mlamem.spec import gpus, scenario
from mlamem.spec.engines import sglang
from mlamem.spec.errors import UserError
from mlamem.spec.models import shipped_config, weights_per_rank
from mlamem.spec.serve_command import from_command, split_command
from mlamem.testing import check_bad_input, check_command_reads_back

GiB = 1024**3
SEED = ("vllm serve {folder} --tensor-parallel-size 8 --max-num-seqs 256 --attention-backend "
        "FLASHMLA_SPARSE --kv-cache-dtype fp8_ds_mla --max-num-batched-tokens 32768 "
        "--gpu-memory-utilization 0.85 --max-model-len 131072")
DS = "deepseek-ai/DeepSeek-V3.2"


@pytest.fixture
def glm5(tmp_path):
    """A GLM-5 config.json: the attention of the shipped glm5-fp8-tp8's [model], the rest of
    DeepSeek-V3.2's shape (GLM-5's MoE and indexer widths), block fp8."""
    m = scenario.load("glm5-fp8-tp8").model
    config = {"model_type": "glm_moe_dsa", "vocab_size": 154880, "hidden_size": m.hidden_size,
              "intermediate_size": 12288, "moe_intermediate_size": 2048,
              "num_hidden_layers": m.num_layers, "num_attention_heads": m.num_attention_heads,
              "q_lora_rank": 2048, "kv_lora_rank": m.kv_lora_rank,
              "qk_rope_head_dim": m.qk_rope_head_dim, "qk_nope_head_dim": m.qk_nope_head_dim,
              "v_head_dim": m.v_head_dim, "n_routed_experts": 256, "n_shared_experts": 1,
              "num_experts_per_tok": 8, "first_k_dense_replace": 3,
              "architectures": ["GlmMoeDsaForCausalLM"], "num_nextn_predict_layers": 1,
              "index_topk": m.index_topk, "index_n_heads": 32, "index_head_dim": 128,
              "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
    folder = tmp_path / "GLM-5"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_the_seed_command_differs_from_glm5_only_in_what_the_command_sets(glm5):
    built = from_command(SEED.format(folder=glm5), gpu_name="H100 SXM 80GB",
                         weights_bytes=40 * GiB)
    ours, shipped = scenario.to_dict(built.scenario), scenario.to_dict(scenario.load("glm5-fp8-tp8"))
    for data in (ours, shipped):  # words, not figures
        del data["name"], data["description"], data["model"]["name"]
        del data["parallel"]["weights_note"]
    assert ours.pop("engines") == ["vllm"] and shipped.pop("engines") == ["vllm", "sglang"]
    assert ours.pop("vllm") == {"max_num_seqs": 256, "cudagraph_mode": "FULL_AND_PIECEWISE",
                                "num_speculative_tokens": 0, "cuda_graphs": True,
                                "index_head_dim": 128}
    # the shipped scenario takes the PR's --max-num-seqs 256; graphs are the command's
    assert shipped.pop("vllm") == {"max_num_seqs": 256, "cudagraph_mode": "FULL_AND_PIECEWISE",
                                   "num_speculative_tokens": 0}
    assert ours == shipped
    assert built.cuda_graphs and any(n.startswith("CUDA graphs: on") for n in built.notes)
    assert "weights: override" in " ".join(built.notes)


def test_the_seed_command_without_an_override_says_the_weights_do_not_fit(glm5):
    with pytest.raises(UserError, match=r"GLM-5's weights are 8\d\.\d GiB per rank at TP8, more "
                                        r"than the H100 SXM 80GB's 79\.2 GiB: serve on more") as error:
        from_command(SEED.format(folder=glm5), gpu_name="H100 SXM 80GB")
    assert error.value.field == "weights_per_rank"


def test_enforce_eager_turns_graphs_off(glm5):
    built = from_command(SEED.format(folder=glm5) + " --enforce-eager", gpu_name="H100 SXM 80GB",
                         weights_bytes=40 * GiB)
    assert not built.cuda_graphs
    assert built.scenario.section("vllm").cudagraph_mode == "NONE"


def test_a_vllm_config_file_is_read_as_vllm_reads_it(glm5, tmp_path):
    """`--config FILE` (vLLM 0.33.0's FlexibleArgumentParser): the YAML's keys become flags
    after the model, the command's own flags win over them, false is the --no- form, a table is
    its JSON; the seed's flags in a file build the seed's scenario."""
    config = tmp_path / "seed.yaml"
    config.write_text("tensor-parallel-size: 8\nmax_num_seqs: 256\nattention-backend: FLASHMLA_SPARSE\n"
                      "kv-cache-dtype: fp8_ds_mla\nmax-num-batched-tokens: 16384\n"
                      "gpu-memory-utilization: 0.85\nmax-model-len: 131072\nenforce-eager: false\n"
                      "compilation-config:\n  cudagraph_mode: NONE\n")
    built = from_command(f"vllm serve {glm5} --config {config} --max-num-batched-tokens 32768",
                         gpu_name="H100 SXM 80GB", weights_bytes=40 * GiB)
    seed = from_command(SEED.format(folder=glm5) + " --enforce-eager", gpu_name="H100 SXM 80GB",
                        weights_bytes=40 * GiB)
    assert built.scenario.serving.max_num_batched_tokens == 32768  # the command's, not 16384
    assert not built.cuda_graphs and built.scenario.section("vllm").cudagraph_mode == "NONE"
    ours, theirs = scenario.to_dict(built.scenario), scenario.to_dict(seed.scenario)
    assert ours.pop("description") != theirs.pop("description")  # each names its command
    assert ours == theirs


@pytest.mark.parametrize(("text", "name", "fix"), [
    ("tensor-parallel-size: [8\n", "c.yaml", "not YAML"),
    ("- 8\n- 4\n", "c.yaml", "a table of flags"),
    ("tensor-parallel-size: 8\n", "c.json", ".yaml or .yml"),
    ("max-num-seqs: lots\n", "c.yaml", "--max-num-seqs"),
])
def test_a_vllm_config_file_it_cannot_take_is_one_line(text, name, fix, tmp_path):
    (tmp_path / name).write_text(text)
    check_bad_input(["scenarios", "--serve", f"vllm serve {DS} --config {tmp_path / name}"], fix)
    check_bad_input(["scenarios", "--serve", f"vllm serve {DS} --config={tmp_path / name}"],
                    "--config FILE")


def test_a_vllm_config_file_that_is_missing_or_a_folder_is_one_line(tmp_path):
    check_bad_input(["scenarios", "--serve", f"vllm serve {DS} --config {tmp_path}/no.yaml"],
                    "no such YAML config file")
    (tmp_path / "conf.yaml").mkdir()
    check_bad_input(["scenarios", "--serve", f"vllm serve {DS} --config {tmp_path}/conf.yaml"],
                    "is a folder")
    check_bad_input(["scenarios", "--serve", f"vllm serve {DS} --config"], "no file follows")


SGLANG_SEED = ("python -m sglang.launch_server --model-path {folder} --tp-size 8 --kv-cache-dtype "
               "fp8_e4m3 --mem-fraction-static 0.9 --chunked-prefill-size 32768 "
               "--context-length 131072 --cuda-graph-bs-decode 1 2 4 8 --enable-metrics")


def test_an_sglang_config_file_is_read_as_sglang_reads_it(glm5, tmp_path):
    """`--config FILE` (SGLang 0.5.23's ConfigArgumentMerger): the file's flags go before the
    command's words, so the command's win; a store_true key is its bare flag where true and
    nothing where false, a list its items, `32Ki` a count; a file with the seed's flags builds the
    seed's scenario, field by field."""
    config = tmp_path / "sgl.YML"  # the suffix in any case
    config.write_text("tp-size: 8\nkv-cache-dtype: fp8_e4m3\nmem-fraction-static: 0.9\n"
                      "chunked-prefill-size: 8192\ncontext-length: 128Ki\n"
                      "cuda-graph-bs-decode: [1, 2, 4, 8]\nenable-metrics: true\n"
                      "disable-radix-cache: false\n")
    for prog in (f"python -m sglang.launch_server --model-path {glm5}", f"sglang serve {glm5}"):
        built = from_command(f"{prog} --config {config} --chunked-prefill-size 32768",
                             gpu_name="H200 SXM 141GB", weights_bytes=40 * GiB)
        s = built.scenario
        assert (s.parallel.tensor_parallel, s.parallel.attention_data_parallel) == (8, 1)
        assert s.serving.max_num_batched_tokens == 32768  # the command's, not the file's 8192
        assert (s.serving.max_model_len, s.serving.kv_cache_dtype) == (131072, "fp8_ds_mla")
        table = s.section("sglang")
        assert (table.mem_fraction_static, table.chunked_prefill_size, table.cuda_graph_bs) == (
            0.9, 32768, (1, 2, 4, 8))
        assert "not modelled: --enable-metrics" in built.notes  # disable-radix-cache: false is no flag
        seed = from_command(SGLANG_SEED.format(folder=glm5), gpu_name="H200 SXM 141GB",
                            weights_bytes=40 * GiB)
        ours, theirs = scenario.to_dict(s), scenario.to_dict(seed.scenario)
        assert ours.pop("description") != theirs.pop("description")
        assert ours == theirs and built.notes == seed.notes


def test_an_sglang_config_file_without_the_model_in_sglang_serve_is_one_line(glm5, tmp_path):
    """`python -m sglang.launch_server` takes the model from the file; `sglang serve` looks for
    it on the command before it reads the file (cli/serve.py), so it refuses."""
    config = tmp_path / "c.yaml"
    config.write_text(f"model-path: {glm5}\nkv-cache-dtype: fp8_e4m3\ncontext-length: 4096\n")
    built = from_command(f"python -m sglang.launch_server --config {config}",
                         gpu_name="H200 SXM 141GB", weights_bytes=40 * GiB)
    assert built.scenario.serving.max_model_len == 4096
    check_bad_input(["scenarios", "--serve", f"sglang serve --config {config}"],
                    "the model must be on the command")


@pytest.mark.parametrize(("text", "name", "fix"), [
    ("tp-size: [8\n", "c.yaml", "not YAML"),
    ("- 8\n- 4\n", "c.yaml", "an SGLang config file is a table of flags"),
    ("tp-size: 8\n", "c.json", "SGLang reads a .yaml or .yml file"),
    ("tp-size: eight\n", "c.yaml", "--tp-size/--tensor-parallel-size: invalid int value"),
    ("tp_size: 8\n", "c.yaml", "passes it as --tp_size, which its parser does not know: write tp-size"),
    ("enable-dp-attention: true\n", "c.yaml",
     "refuses --enable-dp-attention (DeprecatedStoreTrueAction) in a config file: give --attn-dp-size"),
    ("disable_cuda_graph: false\n", "c.yaml", "refuses --disable-cuda-graph"),
    ("enable-dsa-fused-indexer: true\n", "c.yaml",
     "refuses --enable-dsa-fused-indexer (BooleanOptionalAction) in a config file"),
    ("no-enable-dsa-fused-indexer: true\n", "c.yaml", "refuses --enable-dsa-fused-indexer"),
    ("lora-paths: [a]\n", "c.yaml", "refuses --lora-paths (LoRAPathAction)"),
    ("8: tp\n", "c.yaml", "the key 8 is not a name"),
    ("context-length: 2001-02-30\n", "c.yaml", "not YAML (day is out of range for month)"),
    ("hicache-storage-backend-extra-config: {when: 2001-01-01}\n", "c.yaml",
     "not JSON serializable"),
])
def test_an_sglang_config_file_it_cannot_take_is_one_line(text, name, fix, tmp_path):
    (tmp_path / name).write_text(text)
    base = f"{SG} --model-path {DS} --kv-cache-dtype fp8_e4m3 --context-length 4096"
    check_bad_input(["scenarios", "--serve", f"{base} --config {tmp_path / name}",
                     "--weights-per-rank", "10GiB"], fix)


def test_an_sglang_config_file_that_is_missing_or_given_twice_is_one_line(tmp_path):
    base = f"{SG} --model-path {DS} --kv-cache-dtype fp8_e4m3 --context-length 4096"
    (tmp_path / "c.yaml").write_text("")  # empty: no flags
    built = from_command(f"{base} --tp 8 --config {tmp_path}/c.yaml", gpu_name="H200 SXM 141GB",
                         weights_bytes=10 * GiB)
    assert built.scenario.parallel.tensor_parallel == 8
    for words, fix in ((f"--config {tmp_path}/no.yaml", "no such YAML config file"),
                       (f"--config {tmp_path}/c.yaml --config {tmp_path}/c.yaml",
                        "more than one config file"),
                       ("--config", "no file follows"),
                       (f"--conf {tmp_path}/c.yaml", "--conf: SGLang 0.5.23 merges a config file "
                                                     "only from the separate words")):
        check_bad_input(["scenarios", "--serve", f"{base} {words}"], fix)


TRT_CMD = f"trtllm-serve {DS} --tp_size 8 --max_seq_len 16384"


def test_a_trtllm_config_file_is_read_as_trtllm_serve_reads_it(tmp_path):
    """`--config FILE` (trtllm-serve at 00209af1, update_llm_args_with_extra_dict): the file's
    LLM API fields win over the command's options (flags win only from PR #14812, later), its
    kv_cache_config is laid over the command's fraction key by key, and every field mlamem does
    not model is named; `--extra_llm_api_options` is the same option."""
    config = tmp_path / "extra-llm-api-config.yml"
    config.write_text("max_batch_size: 64\nmax_num_tokens: 8192\nmax_seq_len: 32768\n"
                      "enable_chunked_prefill: false\nprint_iter_log: true\n"
                      "cuda_graph_config:\n  enable_padding: true\n"
                      "kv_cache_config:\n  enable_block_reuse: true\n  tokens_per_block: 64\n"
                      "  dtype: fp8\n  max_tokens: 100000\n")
    for option in ("--config", "--extra_llm_api_options"):
        built = from_command(f"{TRT_CMD} --max_num_tokens 4096 "
                             f"--kv_cache_free_gpu_memory_fraction 0.75 --port 8001 "
                             f"{option} {config}", gpu_name="H200 SXM 141GB")
        s = built.scenario
        assert (s.parallel.tensor_parallel, s.serving.max_batch_size) == (8, 64)
        assert s.serving.max_num_batched_tokens == 8192  # the file's, over --max_num_tokens 4096
        assert (s.serving.max_model_len, s.serving.block_size, s.serving.kv_cache_dtype) == (
            32768, 64, "fp8")
        assert s.serving.block_reuse and not s.serving.chunked_prefill
        assert s.gpu.gpu_memory_utilization == 0.75  # the command's: the file's table lacks it
        assert ("not modelled: --port, cuda_graph_config, kv_cache_config.max_tokens, "
                "print_iter_log") in built.notes
        assert any(n.startswith("max_num_tokens 8192: the file's, over the command's "
                                "--max_num_tokens 4096") for n in built.notes)


def test_a_trtllm_config_file_wins_over_the_command_and_names_option_names(tmp_path):
    config = tmp_path / "c.txt"  # trtllm-serve reads the file whatever its name
    config.write_text(f"model: {DS}\ntensor_parallel_size: 4\ntp_size: 2\n"
                      "kv_cache_config:\n  free_gpu_memory_fraction: 0.6\n")
    built = from_command(f"trtllm-serve someone/other --tp_size 8 --max_seq_len 4096 "
                         f"--kv_cache_free_gpu_memory_fraction 0.8 --config={config}",
                         gpu_name="H200 SXM 141GB", weights_bytes=40 * GiB)
    s = built.scenario
    assert (s.parallel.tensor_parallel, s.gpu.gpu_memory_utilization) == (4, 0.6)
    assert s.model.name.startswith("DeepSeek-V3.2")  # the file's model, over the command's
    assert "not modelled: tp_size" in built.notes
    assert any("tp_size in " in n and "the file's field is tensor_parallel_size" in n
               for n in built.notes)


@pytest.mark.parametrize(("text", "fix"), [
    ("max_batch_size: [64\n", "not YAML"),
    ("", "empty: trtllm-serve hands the file's null"),
    ("- max_batch_size\n", "a TensorRT-LLM options file is a mapping of LLM API fields"),
    ("max_batch_size: lots\n", "max_batch_size: expected an integer, got 'lots'"),
    ("enable_chunked_prefill: 1\n", "enable_chunked_prefill: expected true or false"),
    ("kv_cache_config: 0.8\n", "kv_cache_config: expected a mapping of KvCacheConfig fields"),
    ("kv_cache_config:\n  free_gpu_memory_fraction: high\n",
     "kv_cache_config.free_gpu_memory_fraction: expected a number"),
    ("kv_cache_config:\n  dtype: nvfp4\n", "kv_cache_config.dtype nvfp4: mlamem models the fp8"),
    ("tensor_parallel_size: 0\n", "trtllm-serve --tp_size 0: must be at least 1"),
    ("max_seq_len: null\n", "max_seq_len: expected an integer, got None"),
    ("null: 1\n", "the key None is not a name"),
])
def test_a_trtllm_config_file_it_cannot_take_is_one_line(text, fix, tmp_path):
    (tmp_path / "c.yaml").write_text(text)
    check_bad_input(["scenarios", "--serve", f"{TRT_CMD} --config {tmp_path / 'c.yaml'}"], fix)


def test_a_trtllm_config_file_that_is_missing_is_one_line(tmp_path):
    check_bad_input(["scenarios", "--serve", f"{TRT_CMD} --config {tmp_path}/no.yaml"],
                    "no such YAML config file")
    check_bad_input(["scenarios", "--serve", f"{TRT_CMD} --config"],
                    "argument --config/--extra_llm_api_options: expected one argument")


def test_pyyaml_is_imported_only_for_a_config_file(tmp_path):
    """Each engine's command without `--config` imports no yaml; with one, it does."""
    import subprocess
    import sys

    (tmp_path / "c.yaml").write_text("max-num-seqs: 8\n")
    commands = [f"vllm serve {DS} -tp 8 --max-model-len 4096 --kv-cache-dtype fp8",
                f"{SG} --model-path {DS} --tp 8 --kv-cache-dtype fp8_e4m3 --context-length 4096",
                f"trtllm-serve {DS} --tp_size 8 --max_seq_len 4096"]
    for command, imported in [*((c, "False") for c in commands),
                              (f"{commands[0]} --config {tmp_path / 'c.yaml'}", "True")]:
        code = ("import sys; from mlamem.spec.serve_command import from_command; "
                f"from_command({command!r}, gpu_name='H200 SXM 141GB', weights_bytes=2**30); "
                "print('yaml' in sys.modules)")
        done = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True,
                              timeout=120)
        assert done.stdout.split() == [imported], (command, done.stderr[-2000:])


def test_vllm_attention_dp_with_expert_parallel_abbreviations_and_env_prefix():
    built = from_command(f"VLLM_USE_DEEP_GEMM=1 vllm serve {DS} -dp=8 --enable-expert-parallel "
                         "--max-model-len=65536 --kv_cache_dtype fp8 --max-num-se 64 "
                         "--gpu-mem 0.8 --block-size 64 --port 8000 --trust-remote-code",
                         gpu_name="H200 SXM 141GB")
    s = built.scenario
    assert (s.parallel.tensor_parallel, s.parallel.attention_data_parallel) == (8, 8)
    assert s.heads_per_rank == 128
    assert (s.serving.max_model_len, s.serving.kv_cache_dtype, s.serving.block_size) == (
        65536, "fp8_ds_mla", 64)
    assert s.serving.max_num_batched_tokens == 8192  # vLLM's default on a 140 GiB GPU
    assert s.section("vllm").max_num_seqs == 64
    assert s.gpu.gpu_memory_utilization == 0.8
    assert (s.gpu.name, s.gpu.memory_mib, s.gpu.sm_count) == ("H200 SXM 141GB", 143155, 132)
    assert ("not modelled: --port, --trust-remote-code, VLLM_USE_DEEP_GEMM (environment)"
            in built.notes)
    assert any(n.startswith("--enable-expert-parallel: ") for n in built.notes)
    assert s.model.name == "DeepSeek-V3.2 FP8" and s.model.num_attention_heads == 128
    # routed experts over 8 ranks, attention whole on each: more than TP8's share
    tp8 = from_command(f"vllm serve {DS} -tp 8 --max-model-len 65536 --kv-cache-dtype fp8",
                       gpu_name="H200 SXM 141GB").scenario
    assert s.parallel.weights_gib_per_rank > tp8.parallel.weights_gib_per_rank > 0
    assert tp8.gpu.gpu_memory_utilization == 0.92  # vLLM 0.33.0's default


def test_vllm_graph_settings_from_json_and_speculation():
    built = from_command(
        f"vllm serve {DS} -tp 8 --max-model-len 32768 --kv-cache-dtype fp8_ds_mla "
        "--max-num-batched-tokens 16384 --max-num-seqs 32 "
        """-cc '{"cudagraph_mode": "full_decode_only", "max_cudagraph_capture_size": 128}' """
        """--speculative-config '{"method": "mtp", "num_speculative_tokens": 2}'""",
        gpu_name="B200", weights_bytes=50 * GiB)
    s, vllm = built.scenario, built.scenario.section("vllm")
    assert (vllm.cudagraph_mode, vllm.max_cudagraph_capture_size, vllm.num_speculative_tokens,
            vllm.max_num_seqs) == ("FULL_DECODE_ONLY", 128, 2, 32)
    assert s.serving.max_num_batched_tokens == 16384 and s.serving.max_model_len == 32768
    assert (s.gpu.memory_mib, s.gpu.sm_count) == (183359, 148)  # nvidia-smi's, cited
    assert s.parallel.weights_gib_per_rank == 50.0
    assert not any("not modelled in the JSON configs" in n for n in built.notes)  # method read
    assert built.cuda_graphs


def test_vllm_counts_as_vllm_writes_them():
    built = from_command(f"vllm serve {DS} -tp 8 --max-model-len 128K --kv-cache-dtype fp8 "
                         "--max-num-batched-tokens 16.384k --kv-cache-memory-bytes 0",
                         gpu_name="H200 SXM 141GB")
    assert built.scenario.serving.max_model_len == 131072
    assert built.scenario.serving.max_num_batched_tokens == 16384
    assert not any("kv-cache-memory-bytes" in n for n in built.notes)  # 0 is vLLM's unset


@pytest.mark.parametrize("flag", ["--kv-cache-memory-bytes 20G", "--kv-cache-memory=21474836480",
                                  "--kv_cache_memory_bytes 1k"])
def test_vllm_fixed_kv_size_is_refused(flag):
    """A fixed KV size (vLLM's kv_cache_memory_bytes, which ignores the utilization's KV
    sizing) is one line saying mlamem sizes the cache differently."""
    with pytest.raises(UserError) as error:
        from_command(f"vllm serve {DS} -tp 8 --max-model-len 8192 --kv-cache-dtype fp8 {flag}",
                     gpu_name="H200 SXM 141GB")
    message = error.value.message
    assert "--kv-cache-memory-bytes" in message and "size the cache differently" in message
    assert "\n" not in message


def test_vllm_capture_sizes_keep_their_largest():
    built = from_command(f"vllm serve {DS} -tp 8 --max-model-len 8192 --kv-cache-dtype fp8 "
                         "--cudagraph-capture-sizes 1 2 4 96 --max-num-seqs 512",
                         gpu_name="H200 SXM 141GB")
    assert built.scenario.section("vllm").max_cudagraph_capture_size == 96
    assert any("--capture-sizes" in note for note in built.notes)


def test_trtllm_command_field_by_field():
    built = from_command(f"trtllm-serve {DS} --tp_size 8 --max_num_tokens 4096 "
                         "--max_batch_size 32 --kv_cache_free_gpu_memory_fraction 0.75 "
                         "--max_seq_len=16384 --port 8001 --backend pytorch",
                         gpu_name="H200 SXM 141GB")
    s = built.scenario
    assert s.engines == ("trtllm-context-reuse", "vllm") and s.operations == ("sparse-decode",)
    assert (s.parallel.tensor_parallel, s.parallel.attention_data_parallel) == (8, 1)
    assert (s.serving.max_num_batched_tokens, s.serving.max_batch_size,
            s.serving.max_model_len) == (4096, 32, 16384)
    assert (s.serving.kv_cache_dtype, s.serving.block_size) == ("fp8", 32)
    assert s.serving.block_reuse and not s.serving.chunked_prefill  # TRT-LLM's defaults
    assert s.gpu.gpu_memory_utilization == 0.75
    assert s.model.index_topk == 2048 and s.serving.synthetic_topk is None
    assert "not modelled: --backend, --port" in built.notes
    assert not built.cuda_graphs


def test_trtllm_takes_no_abbreviation():
    with pytest.raises(UserError, match="unrecognized arguments: '--max_seq', '100'"):
        from_command(f"trtllm-serve {DS} --max_seq 100", gpu_name="H200 SXM 141GB")


@pytest.mark.parametrize(("command", "fix"), [
    (f"vllm serve {DS} --max-model-len 4096 --kv-cache-dtype fp8 -tp eight", "invalid int value"),
    (f"vllm serve {DS} --max-model-len 4096 --kv-cache-dtype fp8 --no-such-flag 1",
     "unrecognized arguments: '--no-such-flag'"),
    (f"vllm serve {DS} --max-model-len 4096 --kv-cache-dtype auto", "fp8_ds_mla"),
    (f"vllm serve {DS} --max-model-len 4096 --kv-cache-dtype fp8 -cc '{{mode'", "takes JSON"),
    (f"vllm serve {DS} -tp 8 --max-model-len 4096 --kv-cache-dtype fp8 "
     "--gpu-memory-utilization 1.5", "vllm serve --gpu-memory-utilization: "),
    ("vllm serve moonshotai/Kimi-K2-Instruct --kv-cache-dtype fp8", "add --max-model-len"),
    (f"vllm serve {DS} --kv-cache-dtype fp8 --max-model-len auto", "not a count"),
    (f"vllm serve {DS} --kv-cache-dtype fp8 --max-model-len 1.5K", "not a count"),
    (f"vllm serve {DS} -tp 8 --max-model-len 4096 --kv-cache-dtype fp8 --max-num-seqs 0",
     "vllm serve --max-num-seqs: "),
    (f"vllm serve {DS} --max-model-len 4096 --kv-cache-dtype fp8", "weights are 629.6 GiB per rank at TP1"),
    ("vllm serve someone/unknown --max-model-len 4096 --kv-cache-dtype fp8", "config.json"),
    (f"trtllm-serve {DS} --max_seq_len 100 --tp_size 6", "trtllm-serve --tp_size: "),
    ("sglang launch x", "expected `vllm serve"),
])
def test_a_value_it_cannot_take_is_one_line(command, fix):
    check_bad_input(["scenarios", "--serve", command], fix)


def test_unknown_gpu_lists_the_known_ones():
    line = check_bad_input(["scenarios", "--serve", f"vllm serve {DS}", "--gpu", "H300"])
    assert all(name in line for name in gpus.GPUS) and "--gpu" in line


def test_scenarios_serve_prints_toml_that_loads_back_equal(glm5, capsys):
    args = ["scenarios", "--serve", SEED.format(folder=glm5), "--gpu", "H100 SXM 80GB",
            "--weights-per-rank", "40GiB"]
    assert main(args) == 0
    out, err = capsys.readouterr()
    built = from_command(SEED.format(folder=glm5), gpu_name="H100 SXM 80GB",
                         weights_bytes=40 * GiB)
    again = scenario.parse(out, "printed")
    assert scenario.to_dict(again) == scenario.to_dict(built.scenario)
    assert "mlamem: note: CUDA graphs: on" in err


def test_scenarios_lists_as_json(capsys):
    assert main(["scenarios", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == scenario.shipped_names()
    check_bad_input(["scenarios", "--gpu", "B200"], "--gpu applies to --serve")
    check_bad_input(["scenarios", "--serve", f"vllm serve {DS}", "--format", "json"],
                    "--serve prints TOML")


def test_the_description_leaves_secrets_out():
    built = from_command(f"HF_TOKEN=hf_a vllm serve {DS} -tp 8 --max-model-len 4096 "
                         "--kv-cache-dtype fp8 --hf-token hf_b --api-key=sk_c --port 1 "
                         "--max-num-batched-tokens 8192",
                         gpu_name="H200 SXM 141GB")
    description = built.scenario.description
    assert "hf_a" not in description and "hf_b" not in description and "sk_c" not in description
    assert "--hf-token ... --api-key=... --port 1" in description
    assert "--max-num-batched-tokens 8192" in description  # a token count is no secret


def test_split_command_drops_environment_prefixes():
    assert split_command("env A=1 B='x y' vllm serve m --port 1") == [
        "vllm", "serve", "m", "--port", "1"]


def _predicted(args, capsys) -> list[dict]:
    assert main(["repro-oom", "--predict", "--format", "json", *args]) == 0
    document = json.loads(capsys.readouterr().out)
    keys = ("path", "verdict", "oom_buffer", "oom_requested_bytes", "free_bytes_at_oom",
            "headroom_bytes", "kv_cache_bytes", "max_safe_tokens")
    return [{key: case[key] for key in keys} for case in document["cases"]]


def test_repro_oom_predicts_for_the_seed_what_the_shipped_scenario_predicts(glm5, tmp_path,
                                                                            capsys):
    """The seed's scenario, graphs on, against glm5-fp8-tp8 (the PR's --max-num-seqs 256) with
    graphs on, at the command's 32768 tokens: past the alloc path's limit, within the workspace
    path's (31573 and 38400), so the first runs out of memory."""
    ours = tmp_path / "seed.toml"
    assert main(["scenarios", "--serve", SEED.format(folder=glm5), "--gpu", "H100 SXM 80GB",
                 "--weights-per-rank", "40GiB"]) == 0
    ours.write_text(capsys.readouterr().out)
    predicted = _predicted(["-s", str(ours), "--cuda-graphs", "on"], capsys)
    assert predicted == _predicted(["--cuda-graphs", "on"], capsys)
    assert [(case["verdict"], case["oom_buffer"]) for case in predicted] == [
        ("oom", "o_accum"), ("fits", None)]


def _eager_seed_limits(glm5, tmp_path, capsys) -> list[int]:
    path = tmp_path / "eager.toml"
    assert main(["scenarios", "--serve", SEED.format(folder=glm5) + " --enforce-eager", "--gpu",
                 "H100 SXM 80GB", "--weights-per-rank", "40GiB"]) == 0
    path.write_text(capsys.readouterr().out)
    return [case["max_safe_tokens"] for case in _predicted(["-s", str(path)], capsys)]


def test_repro_oom_limits_of_the_eager_seed(glm5, tmp_path, capsys):
    """The issue's figures: with --enforce-eager (graphs off) the largest safe T per path, the
    DSA layer's attention locals held; measured on an H100 on 2026-12-06
    (reports/repro-oom-h100/h100/repro-seed-eager.json)."""
    assert _eager_seed_limits(glm5, tmp_path, capsys) == [31488, 38257]


_WORDS = ["-tp", "8", "-dp", "2", "--enable-expert-parallel", "--max-model-len", "4k", "-cc",
          '{"cudagraph_mode": 5}', '{"cudagraph_capture_sizes": 5}', "--speculative-config",
          '{"num_speculative_tokens": "x"}', "[1]", "--kv-cache-dtype", "fp8", "auto", "--block-size",
          "-1", "--max-num-seqs", "0", "--gpu-memory-utilization", "nan", "--enforce-eager",
          "--cudagraph-capture-sizes", "0", "--no-enforce-eager", "--port", "=", "''", "--",
          "--max-num-batched-tokens", "1e9", "--kv-cache-memory-bytes", "1G", "--model",
          "bfloat16", "fp8_e4m3", "64", "--dtype", "half"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(words=st.lists(st.sampled_from(_WORDS), max_size=12),
       engine=st.sampled_from([f"vllm serve {DS}", f"trtllm-serve {DS} --max_seq_len 100",
                               "vllm serve moonshotai/Kimi-K2-Instruct"]))
def test_any_command_is_a_scenario_or_one_line(words, engine):
    """Commands made of the modelled flags and odd values: a scenario, or a UserError."""
    check_command_reads_back(" ".join([engine, *words]), gpu_name="H200 SXM 141GB",
                             weights_bytes=10 * GiB)


@pytest.mark.parametrize(("hub_name", "heads", "layers"), [("zai-org/GLM-5-FP8", 64, 78),
                                                           ("deepseek-ai/DeepSeek-V3.2", 128, 61)])
def test_a_shipped_models_hub_name_uses_its_config(hub_name, heads, layers):
    """The README tour's command names the model by its hub name: the shipped config is read
    (GLM-5: 64 heads, 78 layers). Kimi-K2's hub name reads its config too, a dense-MLA model
    whose scenario drives the dense decode."""
    built = from_command(f"vllm serve {hub_name} -tp 8 --kv-cache-dtype fp8_ds_mla "
                         "--max-model-len 131072", gpu_name="H200 SXM 141GB",
                         weights_bytes=40 * GiB)
    model = built.scenario.model
    assert (model.num_attention_heads, model.num_layers) == (heads, layers)
    kimi = from_command("vllm serve moonshotai/Kimi-K2-Instruct -tp 4 --max-model-len 8192 "
                        "--kv-cache-dtype fp8", gpu_name="H200 SXM 141GB", weights_bytes=GiB)
    assert (kimi.scenario.model.num_layers, kimi.scenario.operations) == (61, ("dense-decode",))


KIMI = "moonshotai/Kimi-K2-Instruct"
# the shipped kimi-k2-dense-fp8-tp4-dp as a vLLM command: 4 ranks of attention-DP with EP
KIMI_FP8 = (f"vllm serve {KIMI} -dp 4 --enable-expert-parallel --max-num-seqs 256 "
            "--max-num-batched-tokens 32768 --max-model-len 131072 --kv-cache-dtype fp8 "
            "--gpu-memory-utilization 0.9 --attention-backend FLASHMLA")


def test_a_kimi_k2_command_field_by_field():
    """A dense-MLA model: vLLM's dense decode, --max-num-seqs requests at --max-model-len, the
    cache vLLM's auto keeps (bf16), attention-DP over -dp."""
    built = from_command(f"vllm serve {KIMI} -dp 4 --enable-expert-parallel --max-model-len 128K "
                         "--max-num-seqs 128 --port 8000", gpu_name="H200 SXM 141GB",
                         weights_bytes=60 * GiB)
    s = built.scenario
    assert (s.operations, s.engines) == (("dense-decode",), ("vllm",))
    assert (s.parallel.tensor_parallel, s.parallel.attention_data_parallel) == (4, 4)
    assert s.heads_per_rank == 64 and s.parallel.weights_gib_per_rank == 60.0
    m = s.model
    assert (m.name, m.num_attention_heads, m.num_layers, m.kv_lora_rank, m.qk_rope_head_dim,
            m.qk_nope_head_dim, m.v_head_dim, m.index_topk, m.hidden_size) == (
        "Kimi-K2-Instruct FP8", 64, 61, 512, 64, 128, 128, None, 7168)
    v = s.serving
    assert (v.max_num_batched_tokens, v.max_model_len, v.kv_cache_dtype, v.block_size,
            v.max_batch_size, v.decode_context_len, v.synthetic_topk) == (
        8192, 131072, "bf16", 64, 128, 131072, None)
    assert s.kv_cache_bytes_per_token_per_layer == 1152
    assert s.section("vllm").max_num_seqs == 128
    assert s.gpu.gpu_memory_utilization == 0.92  # vLLM 0.33.0's default
    notes = " | ".join(built.notes)
    assert "not modelled: --port" in notes and "vLLM's auto keeps the model's dtype" in notes
    assert "picks FLASH_ATTN_MLA (FA3) first for a bf16 cache on Hopper" in notes
    assert "decode_context_len 131072: --max-model-len" in notes


@pytest.mark.parametrize(("kv", "cache", "size"), [("fp8", "fp8", 576), ("fp8_e4m3", "fp8", 576),
                                                   ("bfloat16", "bf16", 1152)])
def test_a_kimi_k2_cache_dtype_and_vllms_default_batch(kv, cache, size):
    """fp8 is fp8_e4m3, 576 B per token per layer; without --max-num-seqs the batch is vLLM's
    default max_num_seqs on the GPU (1024 on an H200, 256 on an A100)."""
    for gpu, seqs in (("H200 SXM 141GB", 1024), ("A100 80GB", 256)):
        built = from_command(f"vllm serve {KIMI} -tp 4 --max-model-len 32768 --kv-cache-dtype "
                             f"{kv}", gpu_name=gpu, weights_bytes=40 * GiB)
        s = built.scenario
        assert (s.serving.kv_cache_dtype, s.kv_cache_bytes_per_token_per_layer) == (cache, size)
        assert (s.serving.max_batch_size, s.section("vllm").max_num_seqs) == (seqs, seqs)
        assert (s.parallel.tensor_parallel, s.parallel.attention_data_parallel) == (4, 1)
        assert s.heads_per_rank == 16
        assert any(n.startswith(f"max_batch_size {seqs}: vLLM 0.33.0's max_num_seqs default")
                   for n in built.notes)
        assert ("FLASH_ATTN_MLA" in " ".join(built.notes)) == (cache == "bf16")


@pytest.mark.parametrize(("command", "fix"), [
    (f"vllm serve {KIMI} -dp 4 --enable-expert-parallel --max-model-len 131072",
     "Kimi-K2-Instruct's weights are 250.5 GiB per rank at TP4 with attention-DP 4, more than "
     "the H200 SXM 141GB's 139.8 GiB: serve on more ranks, or give the weights per rank"),
    (f"vllm serve {KIMI} -tp 8 --max-model-len 4096 --kv-cache-dtype fp8_ds_mla",
     "--kv-cache-dtype fp8_ds_mla: mlamem models the plain bf16 or fp8 cache"),
    (f"vllm serve {KIMI} -tp 8 --max-model-len 4096 --kv-cache-dtype fp8_e5m2",
     "use one of auto, bfloat16, fp8, fp8_e4m3"),
    (f"vllm serve {KIMI} -tp 8 --max-model-len 4096 --block-size 16",
     "--block-size 16: FlashMLA's dense decode reads 64-token pages"),
    (f"vllm serve {KIMI} -tp 8 --max-model-len 4096 --max-num-seqs 0",
     "vllm serve --max-num-seqs: "),
    (f"vllm serve {KIMI} -tp 8 --max-model-len 4096 --dtype half",
     "--dtype half: with --kv-cache-dtype auto the cache takes the model's dtype"),
])
def test_a_kimi_k2_value_it_cannot_take_is_one_line(command, fix):
    extra = [] if "-dp 4" in command else ["--weights-per-rank", "40GiB"]
    check_bad_input(["scenarios", "--serve", command, *extra], fix)


def test_scenarios_serve_kimi_k2_loads_back_equal_and_profiles_the_dense_decode(tmp_path,
                                                                                capsys):
    command = f"vllm serve {KIMI} -dp 4 --enable-expert-parallel --max-model-len 131072"
    assert main(["scenarios", "--serve", command, "--weights-per-rank", "60GiB"]) == 0
    out, err = capsys.readouterr()
    path = tmp_path / "kimi.toml"
    path.write_text(out)
    built = from_command(command, gpu_name="H200 SXM 141GB", weights_bytes=60 * GiB)
    assert scenario.to_dict(scenario.load(str(path))) == scenario.to_dict(built.scenario)
    assert "mlamem: note: decode_context_len 131072" in err
    assert main(["profile", "--op", "dense-decode", "-s", str(path), "--predict", "--format",
                 "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert {(r["requests"], r["kv_tokens"]) for r in rows} == {
        (b, 131072) for b in (16, 64, 128, 256)}
    assert all(not r["oom"] and r["peak_allocated_bytes"] > 0 for r in rows)


def _flat(table: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in table.items():
        flat.update(_flat(value, f"{prefix}{key}.") if isinstance(value, dict)
                    else {prefix + key: value})
    return flat


def test_a_command_like_kimi_k2_dense_fp8_tp4_dp_differs_in_what_it_lists(tmp_path, capsys):
    """Every field that differs from the shipped scenario, listed; the words aside, the
    command's context (its --max-model-len, not the shipped 8192) and its [vllm] table, where
    the shipped file keeps vLLM's default max_num_seqs 1024 beside max_batch_size 256."""
    built = from_command(KIMI_FP8, gpu_name="H200 SXM 141GB", weights_bytes=60 * GiB)
    ours = _flat(scenario.to_dict(built.scenario))
    shipped = _flat(scenario.to_dict(scenario.load("kimi-k2-dense-fp8-tp4-dp")))
    differ = {k: (ours.get(k), shipped.get(k)) for k in ours.keys() | shipped.keys()
              if ours.get(k) != shipped.get(k)}
    words = ("name", "description", "model.name", "parallel.weights_note")
    assert sorted(differ) == sorted([*words, "serving.decode_context_len", "vllm.max_num_seqs",
                                     "vllm.cudagraph_mode", "vllm.num_speculative_tokens",
                                     "vllm.cuda_graphs", "parallel.expert_parallel"])
    assert differ["vllm.cuda_graphs"] == (True, None)  # the command captures graphs
    assert differ["parallel.expert_parallel"] == (True, False)  # --enable-expert-parallel
    assert differ["serving.decode_context_len"] == (131072, 8192)
    assert differ["vllm.max_num_seqs"] == (256, None)
    assert (differ["vllm.cudagraph_mode"], differ["vllm.num_speculative_tokens"]) == (
        ("FULL_AND_PIECEWISE", None), (0, None))  # vLLM's defaults, written out
    assert scenario.load("kimi-k2-dense-fp8-tp4-dp").section("vllm").max_num_seqs == 1024
    # at the shipped context the dense decode predicts the same peaks
    path = tmp_path / "kimi-fp8.toml"
    path.write_text(scenario.to_toml(built.scenario))
    peaks = []
    for source in (str(path), "kimi-k2-dense-fp8-tp4-dp"):
        assert main(["profile", "--op", "dense-decode", "-s", source, "--predict",
                     "--context-len", "8192", "--format", "json"]) == 0
        peaks.append([(r["requests"], r["path"], r["peak_allocated_bytes"],
                       r["peak_reserved_bytes"]) for r in
                      json.loads(capsys.readouterr().out)["rows"]])
    assert peaks[0] == peaks[1] and len(peaks[0]) == 8


SG = "python -m sglang.launch_server"


def test_sglang_launch_server_field_by_field():
    built = from_command(f"SGLANG_ENABLE_JIT_DEEPGEMM=1 {SG} --model-path {DS} --tp-size 8 "
                         "--kv-cache-dtype fp8_e4m3 --context-length 64k "
                         "--mem-fraction-static 0.8 --chunked-prefill-size 4096 "
                         "--max-running-requests 64 --page-size 64 --port 30000 "
                         "--trust-remote-code", gpu_name="H200 SXM 141GB")
    s = built.scenario
    assert s.engines == ("sglang",) and s.operations == ("sparse-decode",)
    assert (s.parallel.tensor_parallel, s.parallel.attention_data_parallel) == (8, 1)
    assert (s.serving.max_num_batched_tokens, s.serving.max_model_len, s.serving.kv_cache_dtype,
            s.serving.block_size) == (4096, 64000, "fp8_ds_mla", 64)  # SGLang's k is 1000
    table = s.section("sglang")
    assert (table.mem_fraction_static, table.chunked_prefill_size,
            table.max_running_requests) == (0.8, 4096, 64)
    assert s.gpu.gpu_memory_utilization == 0.8
    assert (s.gpu.name, s.gpu.memory_mib) == ("H200 SXM 141GB", 143155)
    assert ("not modelled: --port, --trust-remote-code, SGLANG_ENABLE_JIT_DEEPGEMM (environment)"
            in built.notes)
    assert built.cuda_graphs  # no --disable-cuda-graph: SGLang captures its decode graphs
    assert "CUDA graphs (decode on, prefill on): the decode graphs are captured after the pool: " \
           "run repro-oom with --cuda-graphs on; the prefill graphs size the reserve only" in built.notes
    # the same server as vLLM serves it counts the same weights
    vllm = from_command(f"vllm serve {DS} -tp 8 --max-model-len 64000 --kv-cache-dtype fp8",
                        gpu_name="H200 SXM 141GB").scenario
    assert s.parallel.weights_gib_per_rank == vllm.parallel.weights_gib_per_rank


SMI_H200_MIB = 143771  # nvidia-smi's memory.total of an H200 (mlamem/spec/gpus.py)


def test_sglang_serve_attention_dp_abbreviations_and_graphs(glm5):
    """`sglang serve MODEL`, `--dp N --enable-dp-attention` as attention DP, abbreviations and
    --x=y; the defaults by the GPU, and the reserve rule's fraction with the command's graphs."""
    rules = sglang  # the rules beside the parser, in its spec module
    command = (f"sglang serve {glm5} --tp 8 --dp=8 --enable-dp-attention "
               "--kv-cache-dtype=fp8_e4m3 --context-len 32Ki --cuda-graph-max-bs-decode 128 "
               "--model-type llm")
    built = from_command(command, gpu_name="H200 SXM 141GB", weights_bytes=40 * GiB)
    s = built.scenario
    assert (s.parallel.tensor_parallel, s.parallel.attention_data_parallel) == (8, 8)
    assert s.heads_per_rank == 64  # attention DP: every head on each rank
    assert s.serving.max_model_len == 32768
    chunk, _ = rules.capacity_defaults(SMI_H200_MIB, 8)
    assert s.serving.max_num_batched_tokens == chunk and s.section("sglang").chunked_prefill_size is None
    # SGLang's rules read nvidia-smi's total (143771), not CUDA's (143155: 0.869 here)
    with_graphs = rules.resolve(SMI_H200_MIB, tp_size=8, attn_dp_size=8, cuda_graph_max_bs=128)
    default = rules.resolve(SMI_H200_MIB, tp_size=8, attn_dp_size=8)
    assert with_graphs.mem_fraction_static == 0.870
    assert with_graphs.mem_fraction_static != default.mem_fraction_static
    assert s.section("sglang").mem_fraction_static == with_graphs.mem_fraction_static
    assert s.section("sglang").cuda_graph_max_bs == 128 and built.cuda_graphs
    assert s.gpu.gpu_memory_utilization == with_graphs.mem_fraction_static
    assert "not modelled: --model-type" in built.notes
    assert "block_size 64: the page SGLang sets for a DSA model" in built.notes
    paged = from_command(command + " --page-size 16", gpu_name="H200 SXM 141GB",
                         weights_bytes=40 * GiB)
    assert paged.scenario.serving.block_size == 64
    assert "block_size 64: the page SGLang sets for a DSA model (it overrides --page-size 16)" \
        in paged.notes
    # graphs as SGLang's defaults take them: the table leaves the fraction to the engine
    plain = from_command(f"{SG} --model {glm5} --attn-dp-size 4 --tp 8 --kv-cache-dtype fp8_e4m3 "
                         "--context-length 4096", gpu_name="H200 SXM 141GB",
                         weights_bytes=40 * GiB).scenario
    assert plain.parallel.attention_data_parallel == 4
    assert plain.section("sglang").mem_fraction_static is None
    assert plain.gpu.gpu_memory_utilization == rules.resolve(
        SMI_H200_MIB, tp_size=8, attn_dp_size=4).mem_fraction_static
    off = from_command(f"python3 -m sglang.launch_server --model-path {glm5} --tp 8 "
                       "--kv-cache-dtype fp8_e4m3 --context-length 4096 --disable-cuda-graph "
                       "--dp-size 2", gpu_name="H200 SXM 141GB", weights_bytes=40 * GiB)
    assert off.scenario.parallel.attention_data_parallel == 1  # two replicas, not attention DP
    assert off.scenario.section("sglang").mem_fraction_static == rules.resolve(
        SMI_H200_MIB, tp_size=8, decode_graphs=False, prefill_graphs=False).mem_fraction_static
    assert any(n.startswith("--dp-size 2: 2 replicas") for n in off.notes)
    assert any(n.startswith("CUDA graphs (decode off, prefill off): no decode graphs")
               for n in off.notes)
    assert not off.cuda_graphs


@pytest.mark.parametrize(("command", "fix"), [
    (f"{SG} --model-path {DS} --tp 8 --context-length 4096 --kv-cache-dtype bf16",
     "--kv-cache-dtype bf16: a bf16 cache, which SGLang decodes with FA3"),
    (f"{SG} --model-path {DS} --tp 8 --context-length 4096",
     "sets no --kv-cache-dtype: SGLang's 'auto' keeps a bf16 cache"),
    (f"{SG} --model-path {DS} --tp 8 --context-length 4096 --kv-cache-dtype auto",
     "--kv-cache-dtype auto: SGLang's 'auto' keeps a bf16 cache"),
    (f"{SG} --model-path {DS} --tp 8 --context-length 4096 --kv-cache-dtype fp8",
     "invalid choice: 'fp8'"),
    (f"{SG} --model-path {DS} --tp 8 --kv-cache-dtype fp8_e4m3 --context-length 1.5Ki",
     "not a count"),
    (f"{SG} --model-path {DS} --tp 8 --kv-cache-dtype fp8_e4m3 --context-length 4096 "
     "--chunked-prefill-size -1", "chunked prefill off is not modelled"),
    (f"{SG} --model-path {DS} --tp 8 --kv-cache-dtype fp8_e4m3 --context-length 4096 "
     "--mem-fraction-static 1.2", "--mem-fraction-static 1.2: must be in (0, 1)"),
    (f"{SG} --model-path {DS} --tp 0 --kv-cache-dtype fp8_e4m3 --context-length 4096",
     "--tp-size 0: must be at least 1"),
    (f"{SG} --model-path {DS} --tp 8 --ep-size -2 --kv-cache-dtype fp8_e4m3 --context-length 4096",
     "--ep-size -2: must be at least 1"),
    (f"{SG} --model-path {DS} --tp 8 --kv-cache-dtype fp8_e4m3 --context-length 4096 "
     "--cuda-graph-max 8", "ambiguous option: --cuda-graph-max"),
    (f"{SG} --model-path {DS} --tp 8 --kv-cache-dtype fp8_e4m3 --context-length 4096 "
     "--no-such-flag", "unrecognized arguments: '--no-such-flag'"),
    (f"{SG} --model-path {DS} --config=c.yaml", "ignores this one: write `--config FILE`"),
    (f"{SG} --model-path {DS} --tp 8 --kv-cache-dtype fp8_e4m3 --context-length 4096 "
     "--cuda-graph-max-bs-decode 99999999999999999999999", "must be at most 2147483647"),
    (f"{SG} --tp 8 --kv-cache-dtype fp8_e4m3 --context-length 4096", "names no model"),
    (f"{SG} --model-path {DS} --tp 6 --kv-cache-dtype fp8_e4m3 --context-length 4096",
     "python -m sglang.launch_server --tp-size: "),
    ("sglang serve moonshotai/Kimi-K2-Instruct --tp 8 --kv-cache-dtype fp8_e4m3 "
     "--context-length 4096", "no DSA indexer"),
])
def test_an_sglang_value_it_cannot_take_is_one_line(command, fix):
    check_bad_input(["scenarios", "--serve", command, "--weights-per-rank", "10GiB"], fix)


def test_sglang_dsa_backends_and_blackwell_are_noted():
    built = from_command(f"sglang serve {DS} --tensor-parallel-size 8 --kv-cache-dtype fp8_e4m3 "
                         "--context-length 4096 --dsa-decode-backend fa3", gpu_name="B200")
    assert built.scenario.parallel.tensor_parallel == 8
    notes = " ".join(built.notes)
    assert "--dsa-decode-backend fa3: mlamem runs flashmla_kv's" in notes
    assert "B200: SGLang decodes a DSA model's fp8 cache with trtllm on Blackwell" in notes
    assert not any(n.startswith("not modelled") for n in built.notes)  # both modelled


def test_the_sglang_flag_table_is_the_wheels():
    """The shipped table is what scripts/sglang_serve_flags.py reads from SGLang 0.5.23's wheel
    (where the wheel is on this machine)."""
    wheels = sorted(Path("/work/wheels").glob("sglang-0.5.23-*.whl"))
    if not wheels:
        pytest.skip("no sglang-0.5.23 wheel under /work/wheels")
    spec = importlib.util.spec_from_file_location(
        "sglang_serve_flags", Path(__file__).parents[1] / "scripts" / "sglang_serve_flags.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert json.loads(json.dumps(script.document(str(wheels[0]))))["flags"] == sglang.flag_table()


def test_the_sglang_flag_table_is_sglangs():
    """Every flag of the table is its own: the modelled ones among them, aliases SGLang gives."""
    assert set(sglang.MODELLED) <= set(sglang.flag_table())
    assert sglang.flag_table()["--tp-size"]["aliases"] == ["--tensor-parallel-size"]
    assert sglang.flag_table()["--model-path"]["aliases"] == ["--model"]
    assert sglang.flag_table()["--kv-cache-dtype"]["choices"][:3] == ["auto", "fp8_e5m2", "fp8_e4m3"]
    assert (sglang.sglang_int("25.6k"), sglang.sglang_int("2Ki"), sglang.sglang_int("7")) == (
        25600, 2048, 7)


def test_scenarios_serve_sglang_runs_in_repro_oom_as_the_shipped_scenario(glm5, tmp_path, capsys):
    """docs/repro-oom.md's SGLang example as its command: the printed TOML runs in repro-oom
    --engine sglang and predicts what glm5-fp8-tp8 predicts with the same two flags."""
    path = tmp_path / "sglang.toml"
    command = (f"{SG} --model-path {glm5} --tp-size 8 --kv-cache-dtype fp8_e4m3 "
               "--mem-fraction-static 0.9 --chunked-prefill-size 32768 --context-length 131072")
    assert main(["scenarios", "--serve", command, "--gpu", "H100 SXM 80GB",
                 "--weights-per-rank", "40GiB"]) == 0
    out, err = capsys.readouterr()
    path.write_text(out)
    assert "[sglang]" in out and "mlamem: note: CUDA graphs (decode on, prefill on)" in err
    ours = _predicted(["-s", str(path), "--engine", "sglang"], capsys)
    shipped = _predicted(["-s", "glm5-fp8-tp8", "--engine", "sglang", "--mem-fraction-static",
                          "0.9", "--max-num-batched-tokens", "32768"], capsys)
    assert ours == shipped
    assert [case["verdict"] for case in ours] == ["oom", "oom"]


_SG_WORDS = ["--tp", "8", "--dp-size", "2", "--attn-dp-size", "4", "--enable-dp-attention",
             "--context-length", "4k", "1.5Ki", "--kv-cache-dtype", "fp8_e4m3", "bf16",
             "--page-size", "-1", "--mem-fraction-static", "1", "0.5", "nan",
             "--chunked-prefill-size", "0", "-1", "--max-running-requests",
             "--cuda-graph-bs-decode", "--cuda-graph-max-bs-decode", "--disable-cuda-graph",
             "--cuda-graph-backend-prefill", "disabled", "--port", "=", "''", "--", "--model"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(words=st.lists(st.sampled_from(_SG_WORDS), max_size=12),
       program=st.sampled_from([f"{SG} --model-path {DS}", f"sglang serve {DS}"]))
def test_any_sglang_command_is_a_scenario_or_one_line(words, program):
    check_command_reads_back(" ".join([program, "--kv-cache-dtype fp8_e4m3 --context-length 100",
                                       *words]), gpu_name="H200 SXM 141GB", weights_bytes=10 * GiB)


def test_sglang_reads_the_indexer_width_from_the_config(glm5):
    config = json.loads((glm5 / "config.json").read_text())
    (glm5 / "config.json").write_text(json.dumps(config | {"index_head_dim": 256}))
    built = from_command(f"{SG} --model-path {glm5} --tp 8 --kv-cache-dtype fp8_e4m3 "
                         "--context-length 4096", gpu_name="H200 SXM 141GB", weights_bytes=40 * GiB)
    assert built.scenario.section("sglang").index_head_dim == 256


VLLM_CMD = "vllm serve {folder} -tp 8 --kv-cache-dtype fp8_ds_mla"
SGLANG_CMD = "python -m sglang.launch_server --model-path {folder} --tp 8 --kv-cache-dtype fp8_e4m3"


def _with_fields(folder: Path, tmp_path: Path, **fields) -> Path:
    """The GLM-5 fixture's config.json with `fields` added, in a folder of its own."""
    config = json.loads((folder / "config.json").read_text()) | fields
    other = tmp_path / "with-fields"
    other.mkdir(exist_ok=True)
    (other / "config.json").write_text(json.dumps(config))
    return other


@pytest.mark.parametrize(("fields", "vllm_len", "sglang_len"), [
    # vLLM takes the smallest key, SGLang the first of its order
    ({"max_position_embeddings": 4096, "seq_length": 8192}, 4096, 8192),
    ({"max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 4}},
     16384, 16384),
    ({"max_position_embeddings": 163840, "rope_scaling": {
        "type": "yarn", "factor": 40, "original_max_position_embeddings": 4096}}, 163840, 163840),
    # vLLM scales a dynamic RoPE; SGLang does not once the scaling names its original length
    ({"max_position_embeddings": 8192, "rope_scaling": {
        "rope_type": "dynamic", "factor": 2, "original_max_position_embeddings": 4096}},
     16384, 8192),
    ({"max_position_embeddings": 8192, "model_max_length": 16384}, 16384, 16384),
    ({"max_position_embeddings": 131072, "rope_parameters": {"rope_type": "llama3", "factor": 8}},
     131072, 131072),
])
def test_the_default_context_is_each_engines_rule_on_the_config(glm5, tmp_path, fields, vllm_len,
                                                                 sglang_len):
    """Without --max-model-len / --context-length the context is the engine's own default, by
    vLLM 0.33.0's and SGLang 0.5.23's rules (hand-derived here), and a note says where from."""
    folder = _with_fields(glm5, tmp_path, **fields)
    for command, expected, engine in ((VLLM_CMD, vllm_len, "vLLM 0.33.0"),
                                      (SGLANG_CMD, sglang_len, "SGLang 0.5.23")):
        built = from_command(command.format(folder=folder), gpu_name="H200 SXM 141GB",
                             weights_bytes=40 * GiB)
        assert built.scenario.serving.max_model_len == expected, command
        assert any(n.startswith(f"max_model_len {expected}: {engine}") for n in built.notes)


@pytest.mark.parametrize(("hub_name", "length"), [("zai-org/GLM-5-FP8", 202752), (DS, 163840)])
def test_a_shipped_models_context_comes_from_its_config(hub_name, length):
    for command in (VLLM_CMD, SGLANG_CMD):
        built = from_command(command.format(folder=hub_name), gpu_name="H200 SXM 141GB",
                             weights_bytes=40 * GiB)
        assert built.scenario.serving.max_model_len == length


def test_a_context_above_the_models_is_noted():
    built = from_command(VLLM_CMD.format(folder=DS) + " --max-model-len 262144",
                         gpu_name="H200 SXM 141GB", weights_bytes=40 * GiB)
    assert built.scenario.serving.max_model_len == 262144
    assert any("above the model's 163840" in n and "VLLM_ALLOW_LONG_MAX_MODEL_LEN" in n
               for n in built.notes)


@pytest.mark.parametrize(("command", "fields", "fix"), [
    (SGLANG_CMD, {}, "add --context-length"),
    (VLLM_CMD, {}, "add --max-model-len"),
    (VLLM_CMD, {"max_position_embeddings": "long"}, "config.json: max_position_embeddings needs"),
    (SGLANG_CMD, {"max_position_embeddings": 0}, "config.json: max_position_embeddings needs"),
    (VLLM_CMD, {"max_position_embeddings": 4096, "rope_scaling": {"factor": -1}},
     "config.json: rope_scaling.factor needs"),
    (VLLM_CMD, {"max_position_embeddings": 4096, "rope_scaling": [2]}, "config.json: rope_scaling needs"),
    (SGLANG_CMD, {"max_position_embeddings": 4096, "rope_scaling": {
        "factor": 2, "original_max_position_embeddings": True}},
     "config.json: rope_scaling.original_max_position_embeddings needs"),
])
def test_a_context_it_cannot_derive_is_one_line(glm5, tmp_path, command, fields, fix):
    folder = _with_fields(glm5, tmp_path, **fields)
    check_bad_input(["scenarios", "--serve", command.format(folder=folder),
                     "--weights-per-rank", "40GiB"], fix)


def test_a_command_pasted_over_several_lines_reads_as_one():
    """Backslash-newline joins the lines as a shell does: the same scenario as on one line."""
    one = f"vllm serve {DS} -tp 8 --kv-cache-dtype fp8_ds_mla --max-model-len 8192"
    lines = f"vllm serve {DS} \\\n  -tp 8 \\\r\n  --kv-cache-dtype fp8_ds_mla \\\n  --max-model-len 8192"
    assert split_command(lines) == split_command(one)
    assert (from_command(lines, gpu_name="H200 SXM 141GB").scenario
            == from_command(one, gpu_name="H200 SXM 141GB").scenario)


def test_a_bad_word_is_quoted_so_the_error_stays_one_line():
    """A word the parser cannot place, even one holding a line break, is shown by its repr."""
    check_bad_input(["scenarios", "--serve", f"vllm serve {DS} -tp 8 '\n' --x-y 'a\nb'"],
                    "unrecognized arguments: '\\n', '--x-y', 'a\\nb'")


VLLM_BASE = f"vllm serve {DS} -tp 8 --kv-cache-dtype fp8_ds_mla --max-model-len 8192"


@pytest.mark.parametrize(("flags", "table"), [
    ("--speculative-config.method mtp --speculative-config.num_speculative_tokens 1",
     {"num_speculative_tokens": 1}),
    ("--speculative_config.num_speculative_tokens=2", {"num_speculative_tokens": 2}),
    ("--compilation-config.cudagraph_mode=FULL_DECODE_ONLY", {"cudagraph_mode": "FULL_DECODE_ONLY"}),
    ("-cc.max_cudagraph_capture_size=64 -cc.cudagraph_mode FULL",
     {"max_cudagraph_capture_size": 64, "cudagraph_mode": "FULL"}),
    ("-cc.cudagraph_capture_sizes+ 8,16 -cc.cudagraph_capture_sizes+ 32",
     {"max_cudagraph_capture_size": 32}),
    ("-O0", {"cudagraph_mode": "NONE"}),
    ("-O 1", {"cudagraph_mode": "PIECEWISE"}),
    ("-O=0 -cc.cudagraph_mode=FULL", {"cudagraph_mode": "FULL"}),
    ("-O3", {"cudagraph_mode": "FULL_AND_PIECEWISE"}),
])
def test_vllms_flexible_forms_set_the_json_configs_keys(flags, table):
    """Dotted keys, `+` lists and -O read as FlexibleArgumentParser rewrites them; the config's
    own key wins over the optimization level's default."""
    built = from_command(f"{VLLM_BASE} {flags}", gpu_name="H200 SXM 141GB")
    vllm = scenario.to_dict(built.scenario).get("vllm", {})
    assert {key: vllm.get(key, "FULL_AND_PIECEWISE" if key == "cudagraph_mode" else None)
            for key in table} == table
    # graphs that hold the attention call (PIECEWISE leaves it out, NONE has none)
    assert built.cuda_graphs == (table.get("cudagraph_mode") not in ("NONE", "PIECEWISE"))


@pytest.mark.parametrize(("flags", "fix"), [
    ("-O '{\"cudagraph_mode\": \"NONE\"}'", "reads -O as --optimization-level 0 to 3 only"),
    ("-O.cudagraph_mode=NONE", "'.cudagraph_mode=NONE' is not an optimization level"),
    ("-O5", "'5' is not an optimization level"),
    ("--speculative-config.method", "--speculative-config.method: no value follows it"),
])
def test_a_form_vllm_033_does_not_take_is_one_line(flags, fix):
    check_bad_input(["scenarios", "--serve", f"{VLLM_BASE} {flags}"], fix)


@pytest.mark.parametrize(("extra", "on"), [("", True), (" --enforce-eager", False)])
def test_the_command_decides_repro_ooms_cuda_graphs(tmp_path, capsys, extra, on):
    """A scenario from a command records whether it captures graphs, and repro-oom runs them so
    by default, saying where the choice came from; --cuda-graphs overrides it."""
    built = from_command(VLLM_BASE + extra, gpu_name="H200 SXM 141GB")
    assert scenario.to_dict(built.scenario)["vllm"]["cuda_graphs"] is on
    path = tmp_path / "s.toml"
    path.write_text(scenario.to_toml(built.scenario))
    run = ["repro-oom", "-s", str(path), "--predict", "--paths", "alloc", "--format", "json"]
    assert main(run) == 0
    out, err = capsys.readouterr()
    assert bool(json.loads(out)["budget"].get("cuda_graphs")) is on
    assert f"CUDA graphs {'on' if on else 'off'}: the scenario's [vllm].cuda_graphs" in err
    assert main([*run, "--cuda-graphs", "off"]) == 0
    out, err = capsys.readouterr()
    assert not json.loads(out)["budget"].get("cuda_graphs") and "[vllm].cuda_graphs" not in err


def test_a_shipped_scenario_keeps_graphs_off_by_default(capsys):
    """A scenario that does not record the choice runs without graphs, as before."""
    assert main(["repro-oom", "--predict", "--paths", "alloc", "--format", "json"]) == 0
    out, err = capsys.readouterr()
    assert not json.loads(out)["budget"].get("cuda_graphs") and "[vllm].cuda_graphs" not in err


@pytest.mark.parametrize(("spec", "mtp"), [
    ('{"method": "mtp", "num_speculative_tokens": 1}', True),
    ('{"method": "deepseek_mtp", "num_speculative_tokens": 1}', True),
    ('{"num_speculative_tokens": 1}', True),
    ('{"method": "eagle", "model": "x/y", "num_speculative_tokens": 1}', False),
    ('{"method": "ngram", "num_speculative_tokens": 2}', False),
    ('{"method": "mtp", "num_speculative_tokens": 0}', False),
])
def test_mtp_layers_count_only_for_a_method_that_drafts_with_them(spec, mtp):
    """vLLM 0.33.0's MTP methods (mtp and its aliases) load the checkpoint's MTP layers, less
    their own embedding and head, which the drafter frees for the target's
    (llm_base_proposer.py _maybe_share_embeddings, _maybe_share_lm_head); eagle, ngram or a
    draft model do not, and a note says their drafter is not modelled."""
    config = shipped_config("deepseek-v3.2")
    built = from_command(f"{VLLM_BASE} --speculative-config '{spec}'", gpu_name="H200 SXM 141GB")
    assert built.scenario.parallel.weights_bytes == pytest.approx(
        weights_per_rank(config, tp=8, mtp=mtp, shared_head=mtp, engine="vllm"),
        abs=2**30 / 1000)  # 3 decimals
    assert any("drafts without the checkpoint's MTP layers" in n for n in built.notes) is (
        not mtp and '"num_speculative_tokens": 0' not in spec)


def test_an_mtp_drafter_keeps_its_own_head_before_vllm_0_18():
    """vLLM 0.17.0 frees the MTP layer's embedding but not its shared_head.head: the count keeps
    both (MTP_SHARES_HEAD_FROM); from 0.18.0 neither."""
    config, spec = shipped_config("deepseek-v3.2"), '{"method": "mtp", "num_speculative_tokens": 1}'
    for version, shared in (("0.17.0", False), ("0.18.0", True)):
        built = from_command(f"{VLLM_BASE} --speculative-config '{spec}'", gpu_name="H200 SXM 141GB",
                             engine_version=version)
        assert built.scenario.parallel.weights_bytes == pytest.approx(
            weights_per_rank(config, tp=8, mtp=True, shared_head=shared, engine="vllm"),
            abs=2**30 / 1000)
    # docs/models.md's figure
    shown = weights_per_rank(config, tp=8, mtp=True, shared_head=True, engine="vllm") / GiB
    models = (Path(__file__).parent.parent / "docs" / "models.md").read_text()
    assert f"with MTP, {shown:.3f} GiB, not the" in " ".join(models.split())


@pytest.mark.parametrize("model", ["someorg/Kimi-K2", "deepseek-v3.2", "GLM-5", "someorg/GLM-5",
                                   "~/models/Kimi-K2"])
def test_a_model_that_is_no_folder_and_no_shipped_hub_name_asks_for_model(model):
    """A shipped model's exact hub name uses its config, and so does a local path whose last folder
    is one (tests/test_shipped_models_serve.py); another org's checkpoint, a bare name or a folder
    of another name is not enough."""
    check_bad_input(["scenarios", "--serve", VLLM_BASE.replace(DS, model)],
                    "is no local folder with a config.json and no shipped model")


def test_a_shipped_hub_name_in_any_case_uses_its_config_and_says_so():
    built = from_command(VLLM_BASE.replace(DS, "DEEPSEEK-AI/deepseek-v3.2"), gpu_name="H200 SXM 141GB")
    assert built.scenario.model == from_command(VLLM_BASE, gpu_name="H200 SXM 141GB").scenario.model
    assert ("model DEEPSEEK-AI/deepseek-v3.2: the shipped config mlamem/spec/models/deepseek-v3.2.json "
            "(deepseek-ai/DeepSeek-V3.2)") in built.notes


def test_environment_prefixes_are_named_as_not_modelled():
    """`NAME=VALUE` before the command is named on the not-modelled line, never dropped."""
    base = f"vllm serve {DS} -tp 8 --max-model-len 8192 --kv-cache-dtype fp8"
    built = from_command(f"VLLM_ATTENTION_BACKEND=FLASHMLA_SPARSE env HF_TOKEN=x {base} --port 1",
                         gpu_name="H200 SXM 141GB")
    assert ("not modelled: --port, VLLM_ATTENTION_BACKEND (environment), HF_TOKEN (environment)"
            in built.notes)
    assert "HF_TOKEN" not in built.scenario.description  # the prefixes are left out there
    alone = from_command(f"CUDA_VISIBLE_DEVICES=0,1 {base}", gpu_name="H200 SXM 141GB")
    assert alone.notes[0] == "not modelled: CUDA_VISIBLE_DEVICES (environment)"


HUB_SEED = SEED.format(folder="zai-org/GLM-5-FP8")
SEED_TARGET = ["--gpu", "H100 SXM 80GB", "--weights-per-rank", "40GiB"]


def test_repro_oom_and_plan_take_the_command_as_scenarios_serve_makes_it(capsys):
    """`--serve COMMAND` runs the scenario `scenarios --serve` prints, with its notes and its
    graphs default: the eager seed gives the shipped scenario's verdicts and limits (both at the
    command's --max-num-seqs 256), and plan its budget."""
    served = _predicted(["--serve", HUB_SEED + " --enforce-eager", *SEED_TARGET], capsys)
    assert served == _predicted([], capsys)  # glm5-fp8-tp8: graphs off
    assert [case["max_safe_tokens"] for case in served] == [31488, 38257]
    assert main(["plan", "--serve", HUB_SEED, *SEED_TARGET, "--format", "json"]) == 0
    out, err = capsys.readouterr()
    assert "mlamem: note: weights: override: given as --weights-per-rank" in err
    assert main(["plan", "--format", "json"]) == 0
    shipped = json.loads(capsys.readouterr().out)["plans"][0]["budget_bytes"]
    assert json.loads(out)["plans"][0]["budget_bytes"] == shipped
    assert main(["repro-oom", "--serve", HUB_SEED, *SEED_TARGET, "--predict", "--paths", "alloc",
                 "--format", "json"]) == 0
    out, err = capsys.readouterr()
    assert "CUDA graphs on: the scenario's [vllm].cuda_graphs" in err
    assert json.loads(out)["cases"][0]["max_safe_tokens"] == 31573  # graphs on (docs/scenarios.md)


@pytest.mark.parametrize("command", ["repro-oom", "plan"])
def test_serve_and_scenario_together_are_one_line(command):
    check_bad_input([command, "--serve", HUB_SEED, "-s", "glm5-fp8-tp8"],
                    "--serve and --scenario both name the scenario; give one")
    check_bad_input([command, "--serve", HUB_SEED, "--gpu", "H100 SXM 80GB"],
                    "--weights-per-rank: GLM-5-FP8's weights are 89.0 GiB per rank at TP8")


# Pasted commands of the three engines: `scenarios --serve` writes each as TOML, and what it
# writes loads back equal and runs (a predicted profile of its first operation)
ROUND_TRIP = [
    "vllm serve zai-org/GLM-5-FP8 -tp 8 --kv-cache-dtype fp8_ds_mla",
    "vllm serve deepseek-ai/DeepSeek-V3.2 -tp 8 --kv-cache-dtype fp8_ds_mla --max-model-len 4096 "
    "--gpu-memory-utilization 0.1234567890123456789",
    "vllm serve moonshotai/Kimi-K2-Instruct -tp 8 --max-model-len 32768",
    f"{SG} --model-path zai-org/GLM-5-FP8 --tp 8 --kv-cache-dtype fp8_e4m3",
    f"{SG} --model-path {DS} --tp 8 --dp 8 --enable-dp-attention --kv-cache-dtype fp8_e4m3 "
    "--context-length 8192",
    "trtllm-serve zai-org/GLM-5-FP8 --tp_size 8 --max_seq_len 4096",
    f"trtllm-serve {DS} --tp_size 8 --max_seq_len 65536 --max_num_tokens 4096",
]


@pytest.mark.parametrize("command", ROUND_TRIP)
def test_what_scenarios_serve_writes_loads_back_and_runs(command, tmp_path, capsys):
    """Write then load round-trips: the TOML `scenarios --serve` prints is a scenario its own
    loader takes, equal to the one built, that a predicted profile runs; and every note on
    stderr starts `mlamem: note:`, as every other line mlamem writes there starts `mlamem:`."""
    args = ["--weights-per-rank", "40GiB"]
    assert main(["scenarios", "--serve", command, *args]) == 0
    out, err = capsys.readouterr()
    assert err and all(line.startswith("mlamem: note: ") for line in err.splitlines()), err
    path = tmp_path / "served.toml"
    path.write_text(out)
    built = from_command(command, gpu_name="H200 SXM 141GB", weights_bytes=40 * GiB)
    loaded = scenario.load(str(path))
    assert scenario.to_dict(loaded) == scenario.to_dict(built.scenario)
    op = loaded.operations[0]
    values = ["--requests", "16"] if op == "dense-decode" else ["--tokens", "64"]
    assert main(["profile", "--predict", "--paths", "alloc", "--op", op, *values,
                 "-s", str(path)]) == 0, capsys.readouterr().err


@pytest.mark.parametrize(("command", "flag"), [
    ("vllm serve zai-org/GLM-5-FP8 -tp 8 --kv-cache-dtype fp8_ds_mla --max-model-len 1024",
     "--max-model-len 1024"),
    (f"{SG} --model-path zai-org/GLM-5-FP8 --tp 8 --kv-cache-dtype fp8_e4m3 --context-length 100",
     "--context-length 100"),
    ("trtllm-serve zai-org/GLM-5-FP8 --tp_size 8 --max_seq_len 100", "--max_seq_len 100"),
])
def test_a_sequence_shorter_than_the_top_k_is_refused_by_its_flag(command, flag):
    """A longest sequence below the model's top-k (2048) made a TOML that every command then
    refused: it is refused here, in one line naming the command's flag."""
    line = check_bad_input(["scenarios", "--serve", command, "--weights-per-rank", "40GiB"], flag)
    assert "index_topk 2048" in line and "[serving]" not in line, line


def test_an_fp8_checkpoint_is_named_once_fp8(capsys):
    """A checkpoint whose name says FP8 is not named 'GLM-5-FP8 FP8'."""
    assert main(["scenarios", "--serve", "vllm serve zai-org/GLM-5-FP8 -tp 8 --kv-cache-dtype "
                 "fp8_ds_mla", "--weights-per-rank", "40GiB"]) == 0
    data = scenario.parse(capsys.readouterr().out, "printed")
    assert data.model.name == "GLM-5-FP8"


def test_errors_about_a_pasted_command_name_its_flags():
    """An SGLang command whose capture sizes leave no memory for the pool names its capture
    flag, not [gpu].gpu_memory_utilization; a --dp-size that does not divide --tp-size names
    --dp-size, not --attention-data-parallel (no engine's flag); a value past int32 names the
    flag, not a TOML field."""
    line = check_bad_input(["scenarios", "--serve", f"{SG} --model-path zai-org/GLM-5-FP8 --tp 8 "
                            "--kv-cache-dtype fp8_e4m3 --cuda-graph-max-bs-decode 100000"],
                           "--cuda-graph-max-bs-decode")
    assert "gpu_memory_utilization" not in line and "[gpu]" not in line, line
    line = check_bad_input(["scenarios", "--serve", f"{SG} --model-path zai-org/GLM-5-FP8 --tp 8 "
                            "--dp 3 --enable-dp-attention --kv-cache-dtype fp8_e4m3"], "--dp-size 3")
    assert "--attention-data-parallel" not in line, line
    line = check_bad_input(["scenarios", "--serve", "vllm serve zai-org/GLM-5-FP8 -tp 8 "
                            "--kv-cache-dtype fp8_ds_mla --max-num-batched-tokens 100000000000"],
                           "--max-num-batched-tokens: must be at most")
    assert "[serving]" not in line and "fix that field" not in line, line


def test_repro_oom_of_a_dense_mla_command_names_the_command(capsys):
    """repro-oom --serve with a dense-MLA model (no --scenario given) says the command's model
    is dense MLA, not 'pick a sparse-decode scenario'."""
    assert main(["repro-oom", "--predict", "--serve", "vllm serve moonshotai/Kimi-K2-Instruct "
                 "-tp 8 --max-model-len 32768"]) == 2
    line = capsys.readouterr().err.splitlines()[-1]
    assert line.startswith("mlamem: error: --serve: ") and "dense MLA" in line, line
    assert "--scenario" not in line and "pick a sparse-decode scenario" not in line, line


@pytest.mark.parametrize(("block", "gpu", "fits"), [
    (7, "H200 SXM 141GB", False), (32, "H100 SXM 80GB", False), (64, "H200 SXM 141GB", True),
    (128, "H200 SXM 141GB", True), (128, "B200", False), (64, "B200", True)])
def test_vllm_sparse_block_size_is_what_flashmla_sparse_takes(block, gpu, fits):
    """--block-size for a DSA model: vLLM 0.33.0's FLASHMLA_SPARSE takes a multiple of 64 on
    Hopper and 64 alone for an fp8 cache on Blackwell (get_supported_kernel_block_sizes); any
    other size ran as though FlashMLA read it."""
    command = (f"vllm serve zai-org/GLM-5-FP8 -tp 8 --kv-cache-dtype fp8_ds_mla "
               f"--max-model-len 8192 --block-size {block}")
    args = ["scenarios", "--serve", command, "--gpu", gpu, "--weights-per-rank", "40GiB"]
    if fits:
        built = from_command(command, gpu_name=gpu, weights_bytes=40 * GiB)
        assert built.scenario.serving.block_size == block
    else:
        check_bad_input(args, f"--block-size {block}")
