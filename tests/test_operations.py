"""The kernel operations on the CPU: the H200 profiles of every operation predicted to the byte,
the operation table, the dense fp8 decode's quantized q, and which builds stage out.

Golden data comes from tests/fixtures/ only: `reports/kernels-h200/` (the H200 runs of
`python3 scripts/gpu_check.py --suite kernels`) is mirrored in tests/fixtures/reports/kernels-h200/
(see tests/fixtures/README.md); until it is, the H200 comparison skips and says so.
"""

import dataclasses
import json
import shlex
from pathlib import Path

import pytest

from mlamem import operations
from mlamem.cli import main
from mlamem.commands.profile import run_profile
from mlamem.kernels import DEFAULT_KERNEL, load_kernel
from mlamem.runtime.paths import available_paths
from mlamem.spec import scenario as scenarios
from mlamem.spec.errors import UserError
from mlamem.testing import scenario_file

KERNELS_H200 = Path(__file__).parent / "fixtures" / "reports" / "kernels-h200"
# The one profile whose scenario is not shipped: glm5-fp8-tp8 at tensor_parallel = 1 (64 heads
# per rank, no padding), saved beside the JSON as glm5-64-heads.toml by the GPU run.
TP1_NAME, TP1_TOML = "glm5-fp8-tp1-64-heads", "glm5-64-heads.toml"
# Model's fields after hidden_size: what a rank allocates beyond attention
MODEL_BEYOND_ATTENTION = ("vocab_size", "intermediate_size", "moe_intermediate_size",
                          "n_routed_experts", "num_experts_per_tok", "n_shared_experts",
                          "first_k_dense_replace", "index_n_heads", "index_head_dim",
                          "num_nextn_predict_layers", "quantization", "architecture",
                          "q_lora_rank")
TP1_EDITS = {'name = "glm5-fp8-tp8"': f'name = "{TP1_NAME}"',
             "tensor_parallel = 8 ": "tensor_parallel = 1 "}
# options of `mlamem profile` that take a value; any other option in a command is a flag
VALUE_OPTIONS = {"--kernel", "--op", "-s", "--scenario", "--tokens", "--requests",
                 "--context-len", "--kv-len", "--paths", "--format", "--output",
                 "--max-num-batched-tokens", "--snapshot", "--report"}


def _profile_files() -> list:
    if not KERNELS_H200.is_dir():
        reason = (f"{KERNELS_H200.relative_to(Path(__file__).parent.parent)} is absent: copy "
                  "reports/kernels-h200/profile-*.json and glm5-64-heads.toml there "
                  "(tests/fixtures/README.md)")
        return [pytest.param(None, marks=pytest.mark.skip(reason=reason), id="no-fixtures")]
    return ([pytest.param(p, id=p.stem) for p in sorted(KERNELS_H200.glob("profile-*.json"))]
            or [pytest.param(None, id="no-profiles")])


def _options(command: str) -> dict[str, str | None]:
    """`mlamem profile ...` -> {option: value, flag: None}; an option this test cannot read
    fails (it might change what the command ran)."""
    words = shlex.split(command)
    assert words[:2] == ["mlamem", "profile"], command
    options, rest = {}, iter(words[2:])
    for word in rest:
        assert word.startswith("-"), f"{command}: unexpected argument {word!r}"
        name, _, attached = word.partition("=")
        options[name] = (attached or next(rest)) if name in VALUE_OPTIONS else None
    return options


def _scenario(value: str, saved: dict, folder: Path, tmp_path: Path) -> scenarios.Scenario:
    """The scenario a command named: a shipped one, or the TP1 TOML (saved beside the JSON, else
    built from the shipped glm5-fp8-tp8 the same way)."""
    if value in scenarios.shipped_names():
        return scenarios.load(value)
    assert saved["name"] == TP1_NAME, f"{value}: not shipped and not {TP1_NAME}"
    beside = folder / Path(value).name
    return scenarios.load(str(beside if beside.is_file()
                              else scenario_file(tmp_path, "glm5-fp8-tp8", TP1_EDITS)))


@pytest.mark.parametrize("path", _profile_files())
def test_prediction_equals_the_h200_profile(path, tmp_path):
    """Each H200 profile's command, re-run as a prediction on the CPU, gives every row's
    allocated and reserved peaks to the byte."""
    if path is None:
        pytest.fail(f"no profile-*.json in {KERNELS_H200}")
    measured = json.loads(path.read_text())
    assert measured["measured"] and all(r["measured"] for r in measured["rows"])
    options = _options(measured["command"])
    op = options.get("--op") or operations.SPARSE_DECODE
    spec = operations.operation(op)
    assert op == measured["op"]
    chosen = _scenario(options.get("-s") or options.get("--scenario") or spec.default_scenario,
                       measured["scenario"], path.parent, tmp_path)
    assert chosen.name == measured["scenario"]["name"]
    if options.get("--max-num-batched-tokens"):
        chosen = dataclasses.replace(chosen, serving=dataclasses.replace(
            chosen.serving, max_num_batched_tokens=int(options["--max-num-batched-tokens"])))
    kernel = load_kernel(options.get("--kernel") or DEFAULT_KERNEL)()
    assert kernel.name == measured["kernel"]["name"]
    values = ([int(v) for v in options[spec.flag].split(",")] if options.get(spec.flag)
              else list(spec.default_sweep))
    paths = (options["--paths"].split(",") if options.get("--paths") else
             available_paths(kernel.capabilities(op, operations.kv_format(chosen, op))))
    kv = options.get(spec.kv_flag) if spec.kv_flag else None

    predicted = run_profile(chosen, values, paths, command=measured["command"], op=op,
                            kv_tokens=None if kv is None else int(kv), predict=True,
                            kernel=kernel)

    assert not predicted.measured
    key = ("tokens", "path", "kv_tokens", "peak_allocated_bytes", "peak_reserved_bytes")
    got = [tuple(getattr(r, k) for k in key) for r in predicted.rows]
    want = [tuple(r[k] for k in key) for r in measured["rows"]]
    assert got == want, (f"{len(got)} rows predicted, {len(want)} on the H200; {key}:\n"
                         + "\n".join(f"predicted {g}\nH200      {w}"
                                     for g, w in zip(got, want, strict=False) if g != w))


def test_the_tp1_scenario_is_glm5_at_tensor_parallel_1(tmp_path):
    """The TOML saved by the GPU run is the shipped glm5-fp8-tp8 with only its name and
    tensor_parallel = 1 changed (what the fallback above builds); it predates glm5-fp8-tp8
    declaring SGLang, rewording its weights note and taking CUDA's H100 total (81079 MiB) for
    nvidia-smi's 81559, so it serves vLLM only, says "placeholder" and has the larger figure.
    It also predates the model fields beyond attention (vocabulary, MLP, MoE, indexer, MTP,
    quantization, architecture, the query's compressed width q_lora_rank) and the `[vllm]`
    table's max_num_seqs 256, which a kernel profile does not read: it leaves them all out, and
    its attention fields are the shipped ones."""
    built = scenarios.load(str(scenario_file(tmp_path, "glm5-fp8-tp8", TP1_EDITS)))
    assert (built.name, built.heads_per_rank) == (TP1_NAME, 64)
    saved = KERNELS_H200 / TP1_TOML
    if not saved.is_file():
        pytest.skip(f"{saved} is absent")
    saved = scenarios.load(str(saved))
    parallel = dataclasses.replace(saved.parallel, weights_note=built.parallel.weights_note)
    assert saved.gpu.memory_mib == 81559
    gpu = dataclasses.replace(saved.gpu, memory_mib=built.gpu.memory_mib)
    beyond_attention = {name: getattr(built.model, name) for name in MODEL_BEYOND_ATTENTION}
    assert {name: getattr(saved.model, name) for name in MODEL_BEYOND_ATTENTION} == dict.fromkeys(
        MODEL_BEYOND_ATTENTION)
    model = dataclasses.replace(saved.model, **beyond_attention)
    assert saved.sections == {}
    assert dataclasses.replace(saved, source=built.source, engines=built.engines,
                               parallel=parallel, gpu=gpu, model=model,
                               sections=built.sections) == built


# (b) the operation table

EXPECTED = {  # op: flag, key, symbol, KV flag, KV key
    "sparse-decode": ("--tokens", "tokens", "T", None, None),
    "dense-decode": ("--requests", "requests", "b", "--context-len", "context_len"),
    "sparse-prefill": ("--tokens", "tokens", "s_q", "--kv-len", "kv_len"),
}


def test_every_operation_has_one_row_with_its_flags():
    assert operations.operation_names() == tuple(EXPECTED)
    for op, (flag, key, symbol, kv_flag, kv_key) in EXPECTED.items():
        spec = operations.operation(op)
        assert spec.name == op
        assert (spec.flag, spec.key, spec.symbol, spec.kv_flag, spec.kv_key) == (
            flag, key, symbol, kv_flag, kv_key)


def test_the_flags_are_options_of_each_command(capsys):
    """profile, validate and compare take every operation's flags."""
    flags = {f for spec in map(operations.operation, operations.operation_names())
             for f in (spec.flag, spec.kv_flag) if f} | {"--op"}
    for command in ("profile", "validate", "compare"):
        assert main([command, "--help"]) == 0
        text = capsys.readouterr().out
        assert all(flag in text for flag in flags), command


def test_each_default_scenario_drives_its_operation_and_runs_its_default_sweep():
    for op, spec in ((op, operations.operation(op)) for op in operations.operation_names()):
        chosen = scenarios.load(spec.default_scenario)
        assert op in operations.scenario_operations(chosen)
        assert max(spec.default_sweep) <= operations.workspace_rows(chosen, op)


def test_an_unknown_operation_names_the_known_ones():
    with pytest.raises(UserError, match="expected one of: sparse-decode, dense-decode, "
                                        "sparse-prefill"):
        operations.operation("sparse-decod")


def test_workspace_rows_are_requests_for_dense_decode_and_tokens_otherwise():
    dense = [s for s in map(scenarios.load, scenarios.shipped_names())
             if operations.DENSE_DECODE in operations.scenario_operations(s)]
    assert dense
    for s in dense:
        assert operations.workspace_rows(s, "dense-decode") == s.serving.max_batch_size
        assert s.serving.max_batch_size != s.serving.max_num_batched_tokens  # tells them apart
    glm5 = scenarios.load("glm5-fp8-tp8")
    for op in ("sparse-decode", "sparse-prefill"):
        assert operations.workspace_rows(glm5, op) == glm5.serving.max_num_batched_tokens


def test_default_kv_tokens_and_formats():
    kimi, glm5 = scenarios.load("kimi-k2-dense-fp8-tp4-dp"), scenarios.load("glm5-fp8-tp8")
    assert operations.default_kv_tokens(kimi, "dense-decode") == kimi.serving.decode_context_len
    assert operations.default_kv_tokens(glm5, "sparse-prefill") == 4 * glm5.decode_topk
    assert operations.kv_format(kimi, "dense-decode") == "fp8"
    assert operations.kv_format(scenarios.load("kimi-k2-dense-tp4-dp"), "dense-decode") == "bf16"
    assert operations.kv_format(glm5, "sparse-decode") == "fp8_ds_mla"
    assert operations.kv_format(glm5, "sparse-prefill") == "bf16"


def test_kv_lengths_stop_at_max_model_len_and_dense_requests_at_their_cache():
    """A KV length up to max_model_len runs; one more is refused. The largest b a dense decode
    takes at 8192 context tokens (128 blocks of 64) is int32 block ids // 128; one more is
    refused."""
    kimi, glm5 = scenarios.load("kimi-k2-dense-tp4-dp"), scenarios.load("glm5-fp8-tp8")
    longest = kimi.serving.max_model_len
    operations.check_kv_tokens(kimi, "dense-decode", [16], longest)
    with pytest.raises(UserError, match="exceeds .*max_model_len.*; lower it") as error:
        operations.check_kv_tokens(kimi, "dense-decode", [16], longest + 1)
    assert error.value.field == "context_len"  # the CLI words it --context-len
    operations.check_kv_tokens(glm5, "sparse-prefill", [1024], glm5.serving.max_model_len)
    with pytest.raises(UserError, match="; lower it") as error:
        operations.check_kv_tokens(glm5, "sparse-prefill", [1024], glm5.serving.max_model_len + 1)
    assert error.value.field == "kv_len"
    largest = (2**31 - 1) // (8192 // 64)
    operations.check_kv_tokens(kimi, "dense-decode", [largest], 8192)
    with pytest.raises(UserError, match=f"b={largest + 1} .* beyond int32 block ids") as error:
        operations.check_kv_tokens(kimi, "dense-decode", [16, largest + 1], 8192)
    assert error.value.field == "requests[1]"


def test_check_supported_names_the_kernel_or_the_scenario():
    glm5 = scenarios.load("glm5-fp8-tp8")
    with pytest.raises(UserError, match="kernel triton does not run sparse-prefill"):
        operations.check_supported(glm5, "sparse-prefill", "triton", ("sparse-decode",))
    with pytest.raises(UserError, match="scenario glm5-fp8-tp8 does not drive dense-decode"):
        operations.check_supported(glm5, "dense-decode", "flashmla", operations.operation_names())


# (c) the dense fp8 decode quantizes q on the alloc path only

@pytest.mark.parametrize("kernel", ["flashmla", "flashmla-vllm"])
def test_dense_fp8_alloc_path_quantizes_q_and_the_workspace_path_stages_it(kernel):
    b_values = [16, 64]
    result = run_profile(scenarios.load("kimi-k2-dense-fp8-tp4-dp"), b_values,
                         ["alloc", "workspace"], command="test", op="dense-decode",
                         predict=True, kernel=load_kernel(kernel)())
    rows = {(r.tokens, r.path): r for r in result.rows}
    for b in b_values:
        quantized = [x for x in rows[b, "alloc"].buffers if x.name == "quantized_q"]
        assert [(x.allocated_by, x.requested_bytes) for x in quantized] == [
            ("wrapper", b * 64 * 576)]  # b x 64 heads x 576 fp8 bytes
        assert not [x for x in rows[b, "workspace"].buffers if x.name == "quantized_q"]
        assert "quantized_q" in rows[b, "workspace"].staged
        assert rows[b, "alloc"].peak_allocated_bytes > rows[b, "workspace"].peak_allocated_bytes


def test_dense_bf16_decode_has_no_quantized_q():
    result = run_profile(scenarios.load("kimi-k2-dense-tp4-dp"), [16], ["alloc", "workspace"],
                         command="test", op="dense-decode", predict=True,
                         kernel=load_kernel("flashmla")())
    assert not [x for r in result.rows for x in r.buffers if x.name == "quantized_q"]


# (d) vLLM's build takes out_ in the dense bf16 decode, not in the fp8 one

def test_vllm_build_stages_out_for_dense_bf16_but_not_fp8():
    """The capabilities read off the schemas (on a GPU the loaded ones, which
    test_operations_gpu.py holds to the recorded ones that stand in here)."""
    vllm, sgl = load_kernel("flashmla-vllm")(), load_kernel("flashmla")()
    assert vllm.capabilities("dense-decode", "bf16").takes_out
    assert not vllm.capabilities("dense-decode", "fp8").takes_out  # fwd_kvcache_mla_fp8: no out_
    for kv in ("bf16", "fp8"):
        assert not sgl.capabilities("dense-decode", kv).takes_out


@pytest.mark.parametrize(("scenario", "stages_out"), [
    ("kimi-k2-dense-tp4-dp", True), ("kimi-k2-dense-fp8-tp4-dp", False)])
def test_vllm_dense_workspace_path_stages_out_only_over_bf16(scenario, stages_out):
    result = run_profile(scenarios.load(scenario), [16], ["workspace"], command="test",
                         op="dense-decode", predict=True, kernel=load_kernel("flashmla-vllm")())
    (row,) = result.rows
    assert ("out" in row.staged) is stages_out
    assert any(x.name == "out" for x in row.buffers) is not stages_out
