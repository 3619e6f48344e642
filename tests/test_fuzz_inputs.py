"""Fuzz every file input of every command with random bytes and near-valid TOML/JSON: whatever
the file holds, mlamem exits 0, 1 or 2 and never tracebacks. The CLI runs in this process
(`mlamem.cli.main`), derandomized and bounded by a few examples each; no per-example deadline,
since the first example pays the imports and a loaded CI runner is no benchmark."""

import contextlib
import io
import json
import pickle
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlamem.cli import main

ROOT = Path(__file__).parent
SCENARIO = (ROOT.parent / "scenarios" / "glm5-fp8-tp8.toml").read_text()
PROFILE = (ROOT / "fixtures" / "results" / "profile-glm5-h200.json").read_text()
BASELINE = json.dumps({**json.loads((ROOT.parent / "reports" / "baselines" / "predicted.json").read_text()),
                       "sweep": {"scenarios": ["glm5-fp8-tp8"], "ops": ["sparse-decode"], "tokens": [1024],
                                 "paths": ["alloc"], "kernel": "flashmla"}})

FUZZ = settings(derandomize=True, max_examples=25, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
                database=None)


@st.composite
def mutated(draw, text: str) -> bytes:
    """Random bytes, or `text` with a slice cut, replaced or a hostile token inserted."""
    if draw(st.booleans()):
        return draw(st.binary(max_size=200))
    start = draw(st.integers(0, len(text)))
    end = draw(st.integers(start, min(len(text), start + 40)))
    token = draw(st.sampled_from(["", "nan", "-1", "inf", "1e999", "\"", "[", "{", "NaN", "\n#",
                                  "\x00", "\udcff", "99999999999999999999999", "../", "`|"]))
    return (text[:start] + token + text[end:]).encode("utf-8", "surrogateescape")


def _run(args_for) -> None:
    with tempfile.TemporaryDirectory(prefix="mlamem-fuzz-") as folder:
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            code = main([str(a) for a in args_for(Path(folder))])
        assert code in (0, 1, 2), (code, err.getvalue())
        assert "Traceback" not in err.getvalue(), err.getvalue()


def _file(folder: Path, name: str, data: bytes) -> Path:
    (folder / name).write_bytes(data)
    return folder / name


@FUZZ
@given(mutated(SCENARIO))
def test_scenario(data):
    _run(lambda f: ["profile", "--predict", "--tokens", "1024", "--paths", "alloc",
                    "--scenario", _file(f, "s.toml", data)])


@FUZZ
@given(mutated(BASELINE))
def test_baseline(data):
    _run(lambda f: ["gate", "--predict", "--baseline", _file(f, "b.json", data)])


@FUZZ
@given(mutated(PROFILE))
def test_report(data):
    _run(lambda f: ["report", _file(f, "r.json", data), "--output", f / "r.md"])


@FUZZ
@given(mutated(PROFILE))
def test_merge(data):
    _run(lambda f: ["merge", _file(f, "r.json", data)])


SNAPSHOT = (ROOT / "fixtures" / "glm5-t1024-h200.snapshot.pickle").read_bytes()
PLAIN = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                     lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=8)


@st.composite
def mutated_snapshot(draw) -> bytes:
    """Random bytes; the H200 snapshot's pickle with a slice cut or replaced; or its data with
    one field of one event or segment set to a random plain value, pickled."""
    choice = draw(st.sampled_from(["bytes", "slice", "field"]))
    if choice == "bytes":
        return draw(st.binary(max_size=200))
    if choice == "slice":
        start = draw(st.integers(0, len(SNAPSHOT)))
        end = draw(st.integers(start, min(len(SNAPSHOT), start + 40)))
        return SNAPSHOT[:start] + draw(st.binary(max_size=20)) + SNAPSHOT[end:]
    data = pickle.loads(SNAPSHOT)
    events = data["device_traces"][0]
    target = draw(st.sampled_from([data, data["segments"][0], events[draw(
        st.integers(0, len(events) - 1))]]))
    target[draw(st.sampled_from([*target, "frames", "blocks"]))] = draw(PLAIN)
    return pickle.dumps(data)


@FUZZ
@given(mutated_snapshot())
def test_explain(data):
    _run(lambda f: ["explain", _file(f, "s.pickle", data), "--format", "json"])


@FUZZ
@given(mutated_snapshot())
def test_diff_snapshots(data):
    _run(lambda f: ["diff", _file(f, "a.pickle", SNAPSHOT), _file(f, "b.pickle", data)])


@FUZZ
@given(mutated(PROFILE))
def test_diff_results(data):
    _run(lambda f: ["diff", _file(f, "a.json", PROFILE.encode()), _file(f, "b.json", data),
                    "--fail-on-growth", "0B"])


CONFIG = (ROOT.parent / "mlamem" / "spec" / "models" / "glm-5.json").read_text()


@FUZZ
@given(mutated(CONFIG))
def test_model_config(data):
    """--model's config.json: random bytes and near-valid JSON (a field cut, a NaN, a list for
    an object), on a predicted repro-oom, which counts the weights from it."""
    _run(lambda f: ["repro-oom", "--predict", "--paths", "alloc", "--model",
                    _file(f, "config.json", data)])


COUNTS = sorted(k for k, v in json.loads(CONFIG).items() if isinstance(v, int) and not isinstance(v, bool))


@FUZZ
@given(st.sampled_from(COUNTS), st.sampled_from([0, -1, None, True, "8", 2**31, 0.5]),
       st.sampled_from(["plan", "profile", "serve"]))
def test_model_config_count(name, value, door):
    """Each count of the config.json set to 0, a negative, null, a bool, a string, past int32 or
    a fraction, through plan, profile and --serve: exit 0 or 2, one line, never a traceback."""
    raw = json.loads(CONFIG) | {name: value}
    data = json.dumps(raw).encode()

    def args(folder: Path) -> list:
        _file(folder, "config.json", data)
        if door == "serve":
            return ["scenarios", "--serve", f"vllm serve {folder} -tp 8 --kv-cache-dtype "
                    "fp8_ds_mla --max-model-len 8192"]
        return (["plan", "--gpu", "H200 SXM 141GB"] if door == "plan" else
                ["profile", "--predict", "--tokens", "4096", "--paths", "alloc"]) + ["--model", folder]
    _run(args)


SERVE_CONFIG = ("tensor-parallel-size: 8\nmax-num-seqs: 256\nkv-cache-dtype: fp8_ds_mla\n"
                "max-num-batched-tokens: 32768\ngpu-memory-utilization: 0.85\nmax-model-len: 131072\n"
                "enforce-eager: true\ncompilation-config:\n  cudagraph_mode: NONE\n")


@FUZZ
@given(mutated(SERVE_CONFIG))
def test_serve_config_file(data):
    """`--serve "vllm serve MODEL --config FILE"`'s YAML: random bytes and near-valid YAML."""
    _run(lambda f: ["scenarios", "--serve", f"vllm serve zai-org/GLM-5-FP8 --config "
                    f"{_file(f, 'serve.yaml', data)}", "--weights-per-rank", "40GiB"])


SGLANG_SERVE_CONFIG = ("tp-size: 8\nkv-cache-dtype: fp8_e4m3\ncontext-length: 128Ki\n"
                       "mem-fraction-static: 0.85\nchunked-prefill-size: 16384\n"
                       "cuda-graph-bs-decode: [1, 2, 4, 8]\nenable-metrics: true\n"
                       "disable-radix-cache: false\nhicache-storage-backend-extra-config: {a: 1}\n")


@FUZZ
@given(mutated(SGLANG_SERVE_CONFIG))
def test_serve_config_file_sglang(data):
    """`--serve "python -m sglang.launch_server --model-path MODEL --config FILE"`'s YAML."""
    _run(lambda f: ["scenarios", "--serve", "python -m sglang.launch_server --model-path "
                    f"zai-org/GLM-5-FP8 --config {_file(f, 'serve.yaml', data)}",
                    "--weights-per-rank", "40GiB"])


TRTLLM_SERVE_CONFIG = ("max_batch_size: 64\nmax_num_tokens: 8192\nmax_seq_len: 32768\n"
                       "tensor_parallel_size: 8\nenable_chunked_prefill: false\n"
                       "moe_expert_parallel_size: 8\nprint_iter_log: true\n"
                       "kv_cache_config:\n  free_gpu_memory_fraction: 0.8\n"
                       "  enable_block_reuse: true\n  tokens_per_block: 32\n  dtype: fp8\n")


@FUZZ
@given(mutated(TRTLLM_SERVE_CONFIG))
def test_serve_config_file_trtllm(data):
    """`--serve "trtllm-serve MODEL --config FILE"`'s LLM API options YAML."""
    _run(lambda f: ["scenarios", "--serve", "trtllm-serve zai-org/GLM-5-FP8 --max_seq_len 4096 "
                    f"--config {_file(f, 'options.yaml', data)}", "--weights-per-rank", "40GiB"])
