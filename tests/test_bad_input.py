"""Bad input never passes and never tracebacks: one parametrised test per command, one helper.

Every case must give what `mlamem.testing.check_bad_input` checks: exit 2, nothing on stdout,
one stderr line `mlamem: error: ...` naming the fix, no traceback, no file left behind. The
cases cover each principle, not each flag:
- a size needs a unit (only 0 goes without), and no size may pass 256 TiB;
- a T, or any token count, whose tensors cannot exist is refused before any work;
- contradicting flags, and a single-valued flag given twice, are errors;
- an output's format follows its extension, and --format must agree with it;
- every output path is tried before any work;
- a TOML the kernel cannot run is refused with the field named;
- an operation's flags (--requests, --context-len, --kv-len) apply to it alone, a KV length stays
  within max_model_len, and a dense decode's paged cache must be able to exist.
Ctrl-C (one line, exit 130, nothing written) runs the real process.
"""

import dataclasses
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from mlamem import render
from mlamem.cli import main
from mlamem.testing import check_bad_input, no_gpu, scenario_file, split_into_shards

RESULTS = Path(__file__).parent / "fixtures" / "results"
PROFILE = RESULTS / "profile-glm5-h200.json"
REPRO = RESULTS / "repro-oom-glm5-h200.json"
REPRO_CONTEXT_REUSE = RESULTS / "repro-oom-context-reuse-h200.json"
VALIDATE = RESULTS / "validate-h200.json"
LARGEST_GLM5_T = 2021161080  # 2**48 B // (64 padded heads x (576 + 512) x 2 B of q and out)


@dataclasses.dataclass(frozen=True)
class Made:
    """An argument made in the case's folder when the case runs: `make(inputs)` -> path."""

    make: Callable[["Inputs"], Path]


def toml(edits: dict[str, str], base: str = "glm5-fp8-tp8") -> Made:
    """A shipped scenario with text edits, as a TOML file."""
    return Made(lambda i: scenario_file(i.folder, base, edits))


def written(name: str, content: str | Callable[[], str]) -> Made:
    """A file holding `content` (or what it returns)."""
    def make(i: "Inputs") -> Path:
        path = i.folder / name
        path.write_text(content() if callable(content) else content)
        return path
    return Made(make)


def _json_with(source: Path, **fields) -> Callable[[], str]:
    return lambda: json.dumps({**json.loads(source.read_text()), **fields})


def shard(source: Path, index: int, count: int, name: str | None = None, **fields) -> Made:
    """Shard INDEX of COUNT of a saved result, as `--shard INDEX/COUNT` writes it (`fields`
    changed), in a file `name` (default: SOURCE-INDEXofCOUNT.json)."""
    def content() -> str:
        part = split_into_shards(json.loads(source.read_text()), count)[index - 1]
        return json.dumps({**part, **fields})
    return written(name or f"{source.stem}-{index}of{count}.json", content)


@dataclasses.dataclass
class Inputs:
    """What a case's arguments point at: {out} a folder, {file} a file, {unwritable} a folder
    where no file can be made, {baseline} a predicted gate baseline (glm5, T=1024)."""

    folder: Path
    baseline: Path
    unwritable: Callable[[], Path]

    def resolve(self, args: list) -> list[str]:
        places = {"out": self.folder / "out", "file": self.folder / "file",
                  "baseline": self.baseline}
        (self.folder / "out").mkdir(exist_ok=True)
        (self.folder / "file").write_text("a file, not a folder\n")
        if any("{unwritable}" in a for a in args if isinstance(a, str)):
            places["unwritable"] = self.unwritable()
        return [a.make(self).as_posix() if isinstance(a, Made) else a.format(**places)
                for a in args]


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> Path:
    """A predicted baseline of GLM-5 at T=1024, both paths."""
    path = tmp_path_factory.mktemp("baseline") / "glm5.json"
    assert main(["gate", "--predict", "--baseline", str(path), "--update", "--scenario",
                 "glm5-fp8-tp8", "--tokens", "1024"]) == 0
    return path


@pytest.fixture
def inputs(tmp_path, baseline) -> Inputs:
    folder = tmp_path / "case"
    folder.mkdir()

    def unwritable() -> Path:
        if os.geteuid() != 0:
            ro = tmp_path / "read-only"
            ro.mkdir(mode=0o555)
            return ro
        if Path("/proc").is_dir():  # root writes anywhere else
            return Path("/proc")
        pytest.skip("running as root without /proc: no folder here refuses a new file")
    return Inputs(folder, baseline, unwritable)


@pytest.fixture(autouse=True)
def _writable_again(tmp_path):
    yield
    for path in tmp_path.rglob("*"):  # let pytest remove a read-only folder
        if path.is_dir():
            path.chmod(0o755)


def _run(inputs: Inputs, command: str, args: list, fix: str) -> None:
    check_bad_input([command, *inputs.resolve(args)], fix, watch=inputs.folder)


# typer from 0.29 words a range through pydantic, older typer through click
AT_LEAST_1 = ("greater than or equal to 1", "not in the range x>=1")
TOML_CASES = [  # a scenario the decode kernel cannot run, refused with the field named
    pytest.param([toml({"num_attention_heads = 64 ": "num_attention_heads = 256 ",
                        "tensor_parallel = 8 ": "tensor_parallel = 1 "})],
                 "[parallel].tensor_parallel 1 leaves 256 heads per rank", id="toml-heads"),
    pytest.param([toml({"kv_lora_rank = 512": "kv_lora_rank = 448"})],
                 "[model].kv_lora_rank is 448", id="toml-latent"),
    pytest.param([toml({"qk_rope_head_dim = 64": "qk_rope_head_dim = 32"})],
                 "[model].qk_rope_head_dim is 32", id="toml-rope"),
    pytest.param([toml({"index_topk = 2048": "index_topk = 999999"})],
                 "[model].index_topk 999999 exceeds [serving].max_model_len", id="toml-topk"),
    pytest.param([toml({"max_num_batched_tokens = 32768": "max_num_batched_tokens = 2100000000"})],
                 "[serving].max_num_batched_tokens 2100000000 cannot be reserved",
                 id="toml-workspace-cannot-exist"),
    pytest.param([toml({"max_model_len = 131072": "max_model_len = 99999999999"})],
                 "[serving].max_model_len must be at most 2147483647", id="toml-beyond-int32"),
    pytest.param([toml({"memory_mib = 81079": "memory_mib = 999999999999"})],
                 "[gpu].memory_mib must be at most 268435456", id="toml-memory"),
    pytest.param([written("bad.toml", "name = 'x'\ndescription = 'y'\n[model]\nname = 1\n")],
                 "[model].name", id="toml-malformed"),
    pytest.param([written("broken.toml", "name = ")], "not valid TOML", id="toml-not-toml"),
]


SHARD_CASES = [  # --shard I/N: the same in profile, validate and gate
    *[pytest.param(["--shard", text], f"--shard: '{text}' is not a shard; write I/N",
                   id=f"shard-{text.replace('/', '-of-')}") for text in ("0/2", "3/2", "a/b", "1/0")],
    pytest.param(["--shard", "1/2", "--shard", "2/2"], "--shard is given twice",
                 id="shard-given-twice"),
]


LIST_CASES = [  # a comma list: empty, an empty item, an item twice (mlamem.spec.lists, every list alike)
    pytest.param(["--paths", ""], "--paths: '' lists nothing; list at least one path",
                 id="paths-empty"),
    pytest.param(["--paths", "alloc,,workspace"], "has an empty item", id="paths-empty-item"),
    pytest.param(["--paths", "workspace, workspace"], "workspace is listed twice",
                 id="paths-twice-spaced"),
]
TOKENS_LIST_CASES = [
    pytest.param(["--tokens", ""], "--tokens: '' lists nothing; list at least one T",
                 id="tokens-empty"),
    pytest.param(["--tokens", "1024,"], "--tokens: '1024,' has an empty item", id="tokens-trailing-comma"),
    pytest.param(["--tokens", "1024,01024"], "T=1024 is listed twice", id="tokens-twice-as-written"),
]
FORMAT_CASES = [  # typer's validation words its refusal without pydantic's "Value error," prefix
    pytest.param(["--format", "JSON"], "Invalid value for '--format': 'JSON' is not one of",
                 id="format-uppercase"),
]


def _with_scenario(cases):
    return [pytest.param(["--scenario", *c.values[0]], c.values[1], id=c.id) for c in cases]


LARGEST_DENSE_B = 16777215  # int32 block ids // 128 blocks of 64 tokens per 8192-token request
OP_CASES = [  # --op and the flags of its sweep and KV length: the same in profile, validate, compare
    pytest.param(["--op", "sparse-decod"],
                 "'sparse-decod' is not one of 'sparse-decode', 'dense-decode', 'sparse-prefill'",
                 id="op-unknown"),
    pytest.param(["--op", "sparse-decode", "--requests", "16"], "give --tokens instead",
                 id="op-requests-for-sparse-decode"),
    pytest.param(["--op", "dense-decode", "--tokens", "16"], "give --requests instead",
                 id="op-tokens-for-dense-decode"),
    pytest.param(["--op", "sparse-prefill", "--context-len", "8192"],
                 "--context-len applies to --op dense-decode only", id="op-context-len-for-prefill"),
    pytest.param(["--op", "dense-decode", "--kv-len", "8192"],
                 "--kv-len applies to --op sparse-prefill only", id="op-kv-len-for-dense-decode"),
    pytest.param(["--op", "sparse-prefill", "--kv-len", "0"],
                 "Invalid value for '--kv-len'", id="kv-len-zero"),
    pytest.param(["--op", "dense-decode", "--context-len", "0"],
                 "Invalid value for '--context-len'", id="context-len-zero"),
    pytest.param(["--op", "dense-decode", "--requests", "0,16"], "write e.g. --requests 16,64,256",
                 id="requests-zero"),
    pytest.param(["--op", "dense-decode", "--requests", "16,16"], "b=16 is listed twice",
                 id="requests-twice-in-list"),
    pytest.param(["--op", "dense-decode", "--requests", "100000"],
                 "max_batch_size=256, which sizes the workspace; lower them or drop the "
                 "workspace paths", id="requests-beyond-workspace"),
    pytest.param(["--op", "dense-decode", "--requests", str(10**12), "--paths", "alloc"],
                 f"can take at that context is {LARGEST_DENSE_B}: lower b, or the context length",
                 id="requests-cannot-exist"),
    pytest.param(["--op", "dense-decode", "--requests", "3000000000", "--paths", "alloc"],
                 "--requests: b=3000000000 requests of 8192 context tokens cannot run",
                 id="requests-beyond-int32"),
    pytest.param(["--op", "dense-decode", "--requests", "20000000", "--paths", "alloc"],
                 "beyond int32 block ids", id="requests-block-ids-beyond-int32"),
    pytest.param(["--op", "dense-decode", "--context-len", "999999"],
                 "max_model_len=131072, the longest sequence it serves; lower it",
                 id="context-len-beyond-max-model-len"),
    pytest.param(["--op", "sparse-prefill", "--kv-len", "999999"],
                 "--kv-len: 999999 exceeds ", id="kv-len-beyond-max-model-len"),
    pytest.param(["--op", "dense-decode", "-s", "glm5-fp8-tp8"],
                 "scenario glm5-fp8-tp8 does not drive dense-decode", id="op-not-in-scenario"),
    pytest.param(["--op", "sparse-prefill", "-s", "kimi-k2-fp8-tp4-dp"],
                 "scenario kimi-k2-fp8-tp4-dp does not drive sparse-prefill",
                 id="prefill-not-in-scenario"),
    pytest.param(["--op", "dense-decode", "--scenario", toml(
        {"max_batch_size = 256 ": "max_batch_size = 2100000000 "}, "kimi-k2-dense-tp4-dp")],
        "[serving].max_batch_size 2100000000 cannot be reserved",
        id="toml-dense-workspace-cannot-exist"),
]


@pytest.mark.parametrize(("args", "fix"), [
    pytest.param(["--tokens", "0"], "positive integer", id="tokens-zero"),
    pytest.param(["--tokens", "1.5"], "positive integer", id="tokens-fraction"),
    pytest.param(["--tokens", "abc"], "positive integer", id="tokens-word"),
    pytest.param(["--tokens", "1024,1024"], "T=1024 is listed twice", id="tokens-twice-in-list"),
    pytest.param(["--tokens", "65536"], "--max-num-batched-tokens", id="tokens-beyond-workspace"),
    pytest.param(["--tokens", "2100000000"],
                 "T=2100000000 exceeds glm5-fp8-tp8's max_num_batched_tokens=32768, which bounds "
                 "the T a sweep takes, and no raise reaches it: q and out of that many tokens",
                 id="tokens-cannot-exist"),  # the bound a sweep meets first leads
    pytest.param(["--tokens", "2100000000"],
                 f"(the largest T glm5-fp8-tp8 can take is {LARGEST_GLM5_T})",
                 id="tokens-cannot-exist-largest"),
    pytest.param(["--tokens", "2147483648"],
                 "T=2147483648 exceeds glm5-fp8-tp8's max_num_batched_tokens=32768",
                 id="tokens-past-int32"),  # refused before the kernel (torch) loads
    pytest.param(["--tokens", "2100000000", "--paths", "alloc"],
                 f"T=2100000000 cannot run: q and out of that many tokens (64 heads, bf16) would "
                 f"take 266 TiB, over the 256 TiB any tensor here may take; the largest T "
                 f"glm5-fp8-tp8 can take is {LARGEST_GLM5_T}",
                 id="tokens-cannot-exist-alloc"),  # no workspace: its size bounds nothing
    pytest.param(["--max-num-batched-tokens", "0"], "--max-num-batched-tokens", id="mnbt-zero"),
    pytest.param(["--tokens", "1", "--max-num-batched-tokens", "99999999999999"],
                 "--max-num-batched-tokens: 99999999999999 cannot be reserved",
                 id="mnbt-cannot-exist"),
    pytest.param(["--scenario", "glm6"], "glm5-fp8-tp8", id="scenario-unknown"),
    pytest.param(["--scenario", "missing/file.toml"], "not found", id="scenario-no-file"),
    pytest.param(["--paths", "alloc,fast"], "expected one of: alloc, workspace", id="path-unknown"),
    pytest.param(["--paths", "alloc,alloc"], "alloc is listed twice", id="path-twice-in-list"),
    pytest.param(["--paths", "workspace-full"], "use kernel triton", id="path-kernel-cannot"),
    pytest.param(["--format", "xml"], "--format", id="format-unknown"),
    pytest.param(["--tokens", "1", "--tokens", "2"], "--tokens is given twice", id="given-twice"),
    pytest.param(["-s", "glm5-fp8-tp8", "--scenario", "glm5-fp8-tp8"],
                 "-s and --scenario are both given", id="short-and-long"),
    pytest.param(["--predict", "--no-predict"], "--predict and --no-predict", id="flag-and-no"),
    pytest.param(["--predict", "--require-gpu"], "contradict", id="predict-require-gpu"),
    pytest.param(["--require-gpu"], "--require-gpu: cannot measure", marks=no_gpu,
                 id="require-gpu-without-one"),
    pytest.param(["--breakdown", "--format", "csv"], "profile --breakdown writes",
                 id="breakdown-csv"),
    pytest.param(["--output", "{out}/rows.json", "--format", "csv"],
                 "rows.json is json by its extension", id="extension-vs-format"),
    pytest.param(["--breakdown", "--output", "{out}/b.csv"], ".csv names csv",
                 id="breakdown-csv-file"),
    pytest.param(["--output", "{out}/rows.pickle"], ".pickle names pickle", id="extension-foreign"),
    pytest.param(["--snapshot", "{out}/s.json"], "name the file s.pickle", id="snapshot-extension"),
    pytest.param(["--output", "{out}/same", "--snapshot", "{out}/same"],
                 "--output and --snapshot both name", id="output-and-snapshot-one-file"),
    pytest.param(["--output", "/no/such/folder/x.json"], "does not exist", id="output-no-folder"),
    pytest.param(["--output", "{file}/x.json"], "is a file, not a folder", id="output-under-file"),
    pytest.param(["--output", "{out}"], "is a folder", id="output-is-folder"),
    pytest.param(["--output", "{unwritable}/x.json"], "cannot write in", id="output-unwritable"),
    pytest.param(["--snapshot", "/no/such/folder/s.pickle"], "--snapshot", id="snapshot-no-folder"),
    pytest.param(["--snapshot", "{out}"], "--snapshot: ", id="snapshot-is-folder"),
    pytest.param(["--snapshot", "{unwritable}/s.pickle"], "cannot write in",
                 id="snapshot-unwritable"),
    pytest.param(["--report", "{file}"], "is a file", id="report-is-file"),
    pytest.param(["--report", "/no/such/folder/r"], "does not exist", id="report-no-parent"),
    pytest.param(["--report", "{unwritable}"], "cannot write in", id="report-unwritable"),
    pytest.param(["--report", "{unwritable}/new"], "cannot write in", id="report-parent-unwritable"),
    *_with_scenario(TOML_CASES),
    *OP_CASES,
    pytest.param(["--kernel", "triton", "--op", "sparse-prefill"],
                 "kernel triton does not run sparse-prefill", id="op-not-in-kernel"),
    pytest.param(["--paths", "workspace-full", "--op", "dense-decode"],
                 "no registered kernel takes all three", id="op-path-kernel-cannot"),
    pytest.param(["--op", "dense-decode", "--max-num-batched-tokens", "512"],
                 "[serving].max_batch_size requests: drop it", id="mnbt-with-dense-decode"),
    *SHARD_CASES,
    pytest.param(["--shard", "1/2", "--report", "{out}/r"], "drop --report",
                 id="shard-with-report"),
    *LIST_CASES, *TOKENS_LIST_CASES, *FORMAT_CASES,
    pytest.param(["-s", "{out}"], "is a folder; pass a scenario file (TOML)",
                 id="scenario-is-a-folder"),
])
def test_profile(inputs, args, fix):
    """profile: every bad input is one line, exit 2, before any work."""
    _run(inputs, "profile", args, fix)


@pytest.mark.parametrize(("args", "fix"), [
    pytest.param(["--tokens", "0"], "positive integer", id="tokens-zero"),
    pytest.param(["--tokens", "99999999999999"], str(LARGEST_GLM5_T), id="tokens-cannot-exist"),
    pytest.param(["--tokens", "1", "--tokens", "2"], "--tokens is given twice", id="given-twice"),
    pytest.param(["--format", "csv"], "'csv' is not one of 'table', 'markdown', 'json'",
                 id="format-csv"),
    pytest.param(["--output", "{out}/v.csv"], ".csv names csv", id="extension-csv"),
    pytest.param(["--output", "{out}/v.json", "--format", "markdown"], "drop the format or name the file",
                 id="extension-vs-format"),
    pytest.param(["--output", "{unwritable}/v.json"], "cannot write in", id="output-unwritable"),
    pytest.param(["--scenario", "glm6"], "unknown scenario 'glm6'", id="scenario-unknown"),
    pytest.param(["--paths", "fast"], "unknown path 'fast'", id="path-unknown"),
    pytest.param([], "instead: mlamem profile with", marks=no_gpu, id="no-gpu"),
    pytest.param(["--graphs"], "instead: mlamem graphs", marks=no_gpu, id="graphs-no-gpu"),
    *_with_scenario(TOML_CASES[:4]),
    *OP_CASES,
    pytest.param(["--requests", "16"], "--requests needs --op", id="requests-without-op"),
    pytest.param(["--kernel", "triton", "--op", "sparse-prefill"],
                 "kernel triton does not run sparse-prefill", id="op-not-in-kernel"),
    pytest.param(["--paths", "workspace-full", "--op", "dense-decode"],
                 "no registered kernel takes all three", id="op-path-kernel-cannot"),
    *SHARD_CASES, *LIST_CASES, *TOKENS_LIST_CASES, *FORMAT_CASES,
])
def test_validate(inputs, args, fix):
    """validate: bad input is refused before the GPU check, one line, exit 2."""
    _run(inputs, "validate", args, fix)


@pytest.mark.parametrize(("args", "fix"), [
    pytest.param(["--kernels", "flashmla"], "give two different kernels", id="kernels-one"),
    pytest.param(["--kernels", "flashmla,flashmla"], "give two different kernels",
                 id="kernels-same-twice"),
    pytest.param(["--kernels", "flashmla,flashmla-vllm,triton"], "give two different kernels",
                 id="kernels-three"),
    pytest.param(["--kernels", "a,b"], "unknown kernel 'a'; expected one of flashmla",
                 id="kernels-unknown"),
    pytest.param(["--kernels", "flashmla,triton", "--op", "sparse-prefill"],
                 "kernel triton does not run sparse-prefill", id="op-not-in-kernel"),
    pytest.param(["--kernels", "flashmla,flashmla-vllm", "--kernels", "flashmla,triton"],
                 "--kernels is given twice", id="given-twice"),
    pytest.param(["--paths", "workspace-full", "--op", "dense-decode"],
                 "workspace-full needs a kernel that takes out=", id="path-kernel-cannot"),
    pytest.param(["--paths", "fast"], "unknown path 'fast'", id="path-unknown"),
    pytest.param(["--paths", "alloc,alloc"], "alloc is listed twice", id="path-twice-in-list"),
    pytest.param(["--tokens", "65536"], "lower --tokens or drop the workspace paths",
                 id="tokens-beyond-workspace"),
    pytest.param(["--tokens", "99999999999999"], str(LARGEST_GLM5_T), id="tokens-cannot-exist"),
    pytest.param(["--scenario", "glm6"], "unknown scenario 'glm6'", id="scenario-unknown"),
    pytest.param(["--format", "csv"], "'csv' is not one of 'table', 'markdown', 'json'",
                 id="format-csv"),
    pytest.param(["--output", "{out}/c.csv"], ".csv names csv", id="extension-csv"),
    pytest.param(["--output", "{out}/c.json", "--format", "markdown"], "drop the format or name the file",
                 id="extension-vs-format"),
    pytest.param(["--output", "{unwritable}/c.json"], "cannot write in", id="output-unwritable"),
    pytest.param([], "cannot run here", marks=no_gpu, id="no-gpu"),
    pytest.param(["--op", "dense-decode"], "cannot run here", marks=no_gpu, id="no-gpu-dense"),
    *_with_scenario(TOML_CASES[:4]),
    *OP_CASES, *LIST_CASES, *TOKENS_LIST_CASES, *FORMAT_CASES,
    pytest.param(["--kernels", "flashmla,"], "give two different kernels", id="kernels-empty-item"),
])
def test_compare(inputs, args, fix):
    """compare: bad input is refused before the GPU check (which is one line too), exit 2."""
    _run(inputs, "compare", args, fix)


@pytest.mark.parametrize(("args", "fix"), [
    pytest.param(["--utilization", "0"], "outside (0, 1]", id="utilization-zero"),
    pytest.param(["--utilization", "1.5"], "outside (0, 1]", id="utilization-above-1"),
    pytest.param(["--utilization", "nan"], "outside (0, 1]", id="utilization-nan"),
    pytest.param(["--max-num-batched-tokens", "0"], AT_LEAST_1, id="mnbt-zero"),
    pytest.param(["--max-num-batched-tokens", "-5"], AT_LEAST_1, id="mnbt-negative"),
    pytest.param(["--max-num-batched-tokens", "99999999999999"], "cannot be reserved",
                 id="mnbt-cannot-exist"),
    pytest.param(["--gpu-memory", "lots"], "80GiB", id="size-word"),
    pytest.param(["--gpu-memory", "80"], "'80' has no unit", id="size-without-unit"),
    pytest.param(["--gpu-memory", "1e30GiB"], "more than 256 TiB", id="size-cannot-exist"),
    pytest.param(["--gpu-memory", "0"], "--gpu-memory: must be positive", id="size-zero"),
    pytest.param(["--paths", "alloc", "--expect-oom", "workspace"], "not among the --paths alloc",
                 id="expect-not-a-path"),
    pytest.param(["--expect-oom", "alloc", "--expect-fit", "alloc"],
                 "--expect-oom and --expect-fit both name alloc", id="expect-both"),
    pytest.param(["--utilization", "0.8", "--utilization", "0.9"], "--utilization is given twice",
                 id="given-twice"),
    pytest.param(["--scenario", "glm6"], "glm5-fp8-tp8", id="scenario-unknown"),
    pytest.param(["--output", "{out}/r.csv"], ".csv names csv", id="extension-csv"),
    pytest.param(["--output", "{unwritable}/r.json"], "cannot write in", id="output-unwritable"),
    pytest.param(["--kernel", "flashinfer"], "pick a kernel that runs sparse-decode",
                 id="kernel-without-sparse-decode"),
    pytest.param(["-s", "kimi-k2-dense-tp4-dp"], "pick a sparse-decode scenario",
                 id="scenario-without-sparse-decode"),
    *_with_scenario(TOML_CASES[:6]),
    *LIST_CASES, *FORMAT_CASES,
])
def test_repro_oom(inputs, args, fix):
    """repro-oom: every bad input is one line, exit 2, before any case runs."""
    _run(inputs, "repro-oom", args, fix)


@pytest.mark.parametrize(("args", "fix"), [
    pytest.param(["--capture-sizes", "abc"], "write e.g. --capture-sizes 512,256,8,1",
                 id="sizes-word"),
    pytest.param(["--capture-sizes", "0"], "positive integer", id="sizes-zero"),
    pytest.param(["--capture-sizes", "99999"], "a capture must hold 1 to 32768 tokens",
                 id="sizes-beyond-workspace"),
    pytest.param(["--capture-sizes", "8,8"], "listed twice", id="sizes-twice"),
    pytest.param(["--paths", "workspace-full"], "use kernel triton", id="path-needs-triton"),
    pytest.param(["--kernel", "flashinfer"], "pick a kernel that runs sparse-decode",
                 id="kernel-without-sparse-decode"),
    pytest.param(["-s", "kimi-k2-dense-tp4-dp"], "pick a sparse-decode scenario",
                 id="scenario-without-sparse-decode"),
    pytest.param(["--scenario", toml({'block_size = 64 ': 'block_size = 64\ncudagraph_mode = "PIECEWISE" '})],
                 "puts the attention call in no CUDA graph", id="toml-piecewise"),
    pytest.param(["--scenario", toml({'block_size = 64 ': 'block_size = 64\ncudagraph_mode = "full" '})],
                 "[vllm].cudagraph_mode expected one of NONE, PIECEWISE", id="toml-mode-unknown"),
    pytest.param(["--scenario", toml({'block_size = 64 ': 'block_size = 64\nmax_num_seqs = 0 '})],
                 "max_num_seqs", id="toml-max-num-seqs-zero"),
    pytest.param(["--format", "pdf"], "'pdf' is not one of", id="format-unknown"),
    pytest.param(["--output", "{unwritable}/g.json"], "cannot write in", id="output-unwritable"),
    pytest.param(["--report", "{file}"], "give a folder", id="report-is-a-file"),
    pytest.param(["--capture-sizes", "8,,1"], "--capture-sizes: '8,,1' has an empty item",
                 id="sizes-empty-item"),
    *LIST_CASES, *FORMAT_CASES,
])
def test_graphs(inputs, args, fix):
    """graphs: every bad input is one line, exit 2, before any capture."""
    _run(inputs, "graphs", args, fix)


@pytest.mark.parametrize(("args", "fix"), [
    pytest.param(["--cuda-graphs", "maybe"], "'maybe' is not one of 'on', 'off'",
                 id="graphs-switch"),
    pytest.param(["--capture-sizes", "8"], "applies to --cuda-graphs on", id="sizes-without-graphs"),
    pytest.param(["--cuda-graphs", "on", "--capture-sizes", "40000"],
                 "a capture must hold 1 to 32768 tokens", id="sizes-beyond-workspace"),
    pytest.param(["--cuda-graphs", "on", "-s", "kimi-k2-context-reuse"],
                 "has no CUDA-graph phases; use --engine vllm", id="graphs-context-reuse"),
    pytest.param(["--graphs-typo"], "No such option", id="unknown-option"),
])
def test_repro_oom_graphs(inputs, args, fix):
    _run(inputs, "repro-oom", args, fix)


@pytest.mark.parametrize(("args", "fix"), [
    pytest.param(["--graphs", "--tokens", "8"], "--tokens does not apply to --graphs",
                 id="tokens-with-graphs"),
    pytest.param(["--capture-sizes", "8"], "add --graphs", id="sizes-without-graphs"),
])
def test_validate_graphs(inputs, args, fix):
    _run(inputs, "validate", args, fix)


@pytest.mark.parametrize(("args", "fix"), [
    pytest.param(["--max-seq-len", "0"], "--max-seq-len: must be > 0", id="seq-len-zero"),
    pytest.param(["--max-batch-size", "-1"], "--max-batch-size: must be > 0", id="batch-negative"),
    pytest.param(["--gpu-memory", "0"], "--gpu-memory: must be > 0", id="size-zero"),
    pytest.param(["--gpu-memory", "80"], "has no unit", id="size-without-unit"),
    pytest.param(["--gpu-memory", "1e30GiB"], "more than 256 TiB", id="size-cannot-exist"),
    pytest.param(["--gpu-memory", "inf"], "is not a size", id="size-inf"),
    pytest.param(["--sweep", "gpu-memory=80,141"], "not all valid", id="sweep-size-without-unit"),
    pytest.param(["--max-num-tokens", "99999999999999"], "at most 2147483647",
                 id="tokens-beyond-int32"),
    pytest.param(["--max-num-tokens", "2100000000"], "--max-num-tokens: 2100000000 cannot be",
                 id="tokens-cannot-exist"),
    pytest.param(["--sweep", "max-seq-len=32768,99999999999"], "at most 2147483647",
                 id="sweep-beyond-int32"),
    pytest.param(["--utilization", "1.2"], "outside (0, 1]", id="utilization-above-1"),
    pytest.param(["--free-fraction", "0"], "outside (0, 1]", id="free-fraction-zero"),
    pytest.param(["--utilization", "0.9", "--free-fraction", "0.9"], "not both",
                 id="utilization-and-free-fraction"),
    pytest.param(["--sweep", "max-seq-len=32768,65536", "--max-seq-len", "5"],
                 "--sweep varies max-seq-len", id="sweep-and-flag"),
    pytest.param(["--block-reuse", "--no-block-reuse"], "--block-reuse and --no-block-reuse",
                 id="flag-and-no"),
    pytest.param(["--sweep", "speed=1,2"], "NAME one of", id="sweep-unknown"),
    pytest.param(["--sweep", "max-seq-len=a,b"], "not all valid", id="sweep-not-numbers"),
    pytest.param(["--output", "{out}/p.csv"], ".csv names csv", id="extension-csv"),
    pytest.param(["--output", "{unwritable}/p.json"], "cannot write in", id="output-unwritable"),
    pytest.param(["--kernel", "flashinfer"], "--kernel: plan's vLLM side models the sparse decode",
                 id="kernel-without-sparse-decode"),
    pytest.param(["--kernel", "cuda-magic"], "mlamem kernels", id="kernel-unknown"),
    pytest.param(["--kernel", "FlashMLA"], "lists them): did you mean 'flashmla'", id="kernel-capitalised"),
    *_with_scenario(TOML_CASES[:5]),  # the sparse vLLM side runs FlashMLA's allocation model
    pytest.param(["--sweep", "max-seq-len=131072,131072"],
                 "--sweep: max-seq-len=131072 is listed twice; list each value once",
                 id="sweep-value-twice"),
    pytest.param(["--sweep", "utilization=0.9,0.90"], "utilization=0.9 is listed twice",
                 id="sweep-value-twice-as-written"),
    pytest.param(["--sweep", "max-seq-len="], "lists nothing", id="sweep-no-values"),
    pytest.param(["--sweep", "max-seq-len=32768,,65536"], "has an empty item",
                 id="sweep-empty-item"),
    *FORMAT_CASES,
    pytest.param(["-s", "{out}"], "is a folder; pass a scenario file (TOML)",
                 id="scenario-is-a-folder"),
])
def test_plan(inputs, args, fix):
    """plan: bad sizes, counts, fractions and contradicting flags: one line, exit 2."""
    _run(inputs, "plan", args, fix)


@pytest.mark.parametrize(("args", "fix"), [
    pytest.param(["--scenario", "glm6"], "unknown scenario 'glm6'", id="scenario-unknown"),
    pytest.param(["--tokens", "2048"], "no figures for glm5-fp8-tp8 T=2048 alloc",
                 id="tokens-not-in-baseline"),
    pytest.param(["--tokens", "99999999999999"], str(LARGEST_GLM5_T), id="tokens-cannot-exist"),
    pytest.param(["--tolerance", "5"], "write 0, 1MiB or 0.5%", id="size-without-unit"),
    pytest.param(["--tolerance", "1XB"], "write 0, 1MiB or 0.5%", id="size-unknown-unit"),
    pytest.param(["--tolerance", "-2%"], "write 0, 1MiB or 0.5%", id="percent-negative"),
    pytest.param(["--tolerance", "nan%"], "write 0, 1MiB or 0.5%", id="percent-nan"),
    pytest.param(["--tolerance", "-1MiB"], "write 0, 1MiB or 0.5%", id="size-negative"),
    pytest.param(["--tolerance", "1e30GiB"], "write 0, 1MiB or 0.5%", id="size-cannot-exist"),
    pytest.param(["--tolerance", "speed=1MiB"], "unknown metric 'speed'", id="metric-unknown"),
    pytest.param(["--paths", "fast"], "unknown path 'fast'", id="path-unknown"),
    pytest.param(["--tolerance", "0", "--tolerance", "1MiB"], "--tolerance is given twice",
                 id="given-twice"),
    pytest.param(["--update", "--tolerance", "0"], "--tolerance has no effect with --update",
                 id="update-and-tolerance"),
    pytest.param(["--update", "--allow-env-change"], "--allow-env-change has no effect",
                 id="update-and-allow-env-change"),
    pytest.param(["--baseline", "{out}/b.csv", "--update"], ".csv names csv",
                 id="baseline-extension"),
    pytest.param(["--baseline", "{unwritable}/b.json", "--update"], "cannot write in",
                 id="baseline-unwritable"),
    pytest.param(["--baseline", "{unwritable}/new/b.json", "--update"], "cannot write in",
                 id="baseline-folder-unwritable"),
    pytest.param(["--baseline", "{file}/new/b.json", "--update"], "is a file, not a folder",
                 id="baseline-under-file"),
    pytest.param(["--baseline", "{out}/missing.json"], "not found", id="baseline-missing"),
    pytest.param(["--baseline", written("empty.json", "")], "is not valid JSON",
                 id="baseline-empty"),
    pytest.param(["--baseline", written("half.json", '{"schema": "mlamem.baseline/1", "cases": [')],
                 "is not valid JSON", id="baseline-half"),
    pytest.param(["--baseline", written("list.json", "[1, 2]")], "has schema 'list'",
                 id="baseline-list"),
    pytest.param(["--baseline", written("profile.json", PROFILE.read_text)],
                 "has schema 'mlamem.profile/1'", id="baseline-other-schema"),
    *_with_scenario(TOML_CASES[:4]),
    *SHARD_CASES,
    pytest.param(["--update", "--shard", "1/2"], "drop --shard to update", id="shard-with-update"),
    pytest.param(["--tolerance", "1MiB,1MiB"], "a tolerance for every metric is listed twice",
                 id="tolerance-twice"),
    pytest.param(["--tolerance", "buffer=0,peak_reserved=1MiB,buffer=1MiB"],
                 "--tolerance: buffer is listed twice; list each metric once",
                 id="tolerance-metric-twice"),
    pytest.param(["--tolerance", "0,"], "has an empty item", id="tolerance-empty-item"),
    pytest.param(["--scenario", "glm5-fp8-tp8,glm5-fp8-tp8"],
                 "--scenario: glm5-fp8-tp8 is listed twice; list each scenario once",
                 id="scenario-twice"),
    pytest.param(["--baseline", "{out}"], "is a folder; pass a baseline (JSON)",
                 id="baseline-is-a-folder"),
    *LIST_CASES, *TOKENS_LIST_CASES,
])
def test_gate(inputs, args, fix):
    """gate: bad input, a bad baseline or a contradicting flag: one line, exit 2, no work."""
    if "--baseline" not in args:
        args = ["--baseline", "{baseline}", *args]
    _run(inputs, "gate", ["--predict", *args], fix)


def test_gate_baseline_fields(inputs, baseline):
    """A baseline with a field of the wrong type, or one missing, names it."""
    data = json.loads(baseline.read_text())
    data["cases"][0]["peak_allocated_bytes"] = "392 MiB"
    wrong = inputs.folder / "wrong.json"
    wrong.write_text(json.dumps(data))
    data = json.loads(baseline.read_text())
    del data["environment"]
    missing = inputs.folder / "missing.json"
    missing.write_text(json.dumps(data))
    for path, fix in ((wrong, "(cases[0].peak_allocated_bytes: expected an integer"),
                      (missing, "(environment: missing)")):
        line = check_bad_input(["gate", "--predict", "--baseline", path], fix, watch=inputs.folder)
        assert str(path) in line and "--update" in line


def _changed(fixture: Path, change: Callable[[dict], None]) -> Callable[[], str]:
    """The committed result `fixture` changed in place by `change`."""
    def content() -> str:
        data = json.loads(fixture.read_text())
        change(data)
        return json.dumps(data)
    return content


def _rows_changed(change: Callable[[list], None]) -> Callable[[], str]:
    """The H200 profile with its rows changed in place by `change`."""
    return _changed(PROFILE, lambda data: change(data["rows"]))


def _again(items: list, index: int = 0, **changes) -> None:
    """`items[index]` appended again, with `changes`: a second, differing copy."""
    items.append({**items[index], **changes})


GRAPHS = Path(__file__).parent / "fixtures" / "reports" / "graphs-h200" / "graphs-glm5-flashmla.json"
# (the fixture, its copy with a case twice, the line): through report, and diff where it compares the kind
SECOND_COPY_CASES = [
    pytest.param(REPRO, written("case2.json", _changed(REPRO, lambda d: _again(
        d["cases"], verdict="oom"))), "cases[2]: a second copy of alloc", id="repro-case-twice"),
    pytest.param(REPRO_CONTEXT_REUSE, written("variant2.json", _changed(
        REPRO_CONTEXT_REUSE, lambda d: _again(d["cases"], 1, verdict="oom"))),
        "cases[3]: a second copy of fp8", id="repro-variant-twice"),
    pytest.param(GRAPHS, written("path2.json", _changed(GRAPHS, lambda d: _again(
        d["paths"], pool_bytes=1))), "paths[2]: a second copy of alloc", id="graphs-path-twice"),
    pytest.param(GRAPHS, written("capture2.json", _changed(GRAPHS, lambda d: _again(
        d["paths"][1]["captures"], held_bytes=1))),
        "paths[1].captures[51]: a second copy of 512", id="graphs-capture-twice"),
    pytest.param(VALIDATE, written("total2.json", _changed(VALIDATE, lambda d: _again(
        d["comparisons"], measured=1))), "a second copy of deepseek-v32-fp8-tp8/sparse-decode/"
        "1024/alloc/allocated", id="validate-total-twice"),
]


ROW_CASES = [  # figures no run can give: report and diff alike
    pytest.param([written("neg.json", _rows_changed(
        lambda rows: rows[0].update(peak_allocated_bytes=-5)))],
        "rows[0].peak_allocated_bytes: -5 is negative", id="row-negative"),
    pytest.param([written("huge.json", _rows_changed(
        lambda rows: rows[1]["buffers"][0].update(requested_bytes=2**60)))],
        f"rows[1].buffers[0].requested_bytes: {2**60} is more than", id="buffer-beyond-any-device"),
    pytest.param([written("dup.json", _rows_changed(
        lambda rows: rows.append({**rows[0], "peak_allocated_bytes": 1})))],
        "a second copy of glm5-fp8-tp8/sparse-decode/1024/", id="row-twice"),
]


@pytest.mark.parametrize(("args", "fix"), [
    *ROW_CASES,
    *[pytest.param([case.values[1]], case.values[2], id=case.id) for case in SECOND_COPY_CASES],
    pytest.param(["{out}/missing.json"], "no such result file", id="input-missing"),
    pytest.param(["{out}"], "is a folder", id="input-folder"),
    pytest.param([written("half.json", lambda: PROFILE.read_text()[:5000])], "not valid JSON",
                 id="input-half"),
    pytest.param([written("list.json", "[1, 2]")], "not an mlamem result", id="input-list"),
    pytest.param(["{baseline}"], "schema 'mlamem.baseline/1' is not a result",
                 id="input-baseline"),
    pytest.param([written("noschema.json", "{}")], "schema None", id="input-no-schema"),
    pytest.param([written("norows.json", _json_with(PROFILE, rows=[]))], "'rows' is empty",
                 id="input-no-rows"),
    pytest.param([written("badrow.json", _json_with(PROFILE, rows=[{"tokens": "x"}]))],
                 "(rows[0].tokens: expected an integer", id="input-bad-row"),
    pytest.param([written("nokernel.json", lambda: json.dumps(
        {k: v for k, v in json.loads(REPRO.read_text()).items() if k != "kernel"}))],
        "(kernel: missing)", id="input-no-kernel"),
    pytest.param([written("noenv.json", _json_with(PROFILE, environment={"gpu": "x"}))],
                 "not a valid", id="input-bad-environment"),
    pytest.param([written("nobudget.json", _json_with(REPRO, budget={}))],
                 "not a valid mlamem.repro-oom/1", id="input-no-budget"),
    pytest.param([str(PROFILE), "--output", "/no/such/folder/report.md"], "does not exist",
                 id="output-no-folder"),
    pytest.param([str(PROFILE), "--output", "{out}/report.json"], ".json names json",
                 id="output-extension"),
    pytest.param([str(PROFILE), "--output", "{unwritable}/report.md"], "cannot write in",
                 id="output-unwritable"),
    pytest.param(["{out}/r.md", "--output", "{out}/r.md"], "and --output both name",
                 id="output-is-an-input"),
    pytest.param([str(PROFILE), "--output", "{out}/a.md", "--output", "{out}/b.md"],
                 "--output is given twice", id="given-twice"),
    pytest.param([shard(PROFILE, 1, 2)], "shard 2/2 missing (given: 1/2)", id="shard-missing"),
    pytest.param([shard(PROFILE, 1, 2), shard(PROFILE, 2, 2, command="mlamem profile")],
                 "are shards of different sweeps (their command differs)",
                 id="shards-of-different-sweeps"),
])
def test_report(inputs, args, fix):
    """report: a missing, corrupt or wrong-schema result, or a bad --output: one line, exit 2,
    nothing written (the good result beside a bad one is not reported either)."""
    if "--output" not in args:
        args = [str(PROFILE), *args, "--output", "{out}/report.md"]
    _run(inputs, "report", args, fix)


@pytest.mark.parametrize(("args", "fix"), [
    pytest.param([shard(PROFILE, 1, 4), shard(PROFILE, 2, 4), shard(PROFILE, 4, 4)],
                 "shard 3/4 missing (given: 1/4, 2/4, 4/4)", id="shard-missing"),
    pytest.param([shard(PROFILE, 1, 2), shard(PROFILE, 1, 2, name="again.json"),
                  shard(PROFILE, 2, 2)], "again.json are both shard 1/2; give each shard once",
                 id="shard-twice"),
    pytest.param([shard(PROFILE, 1, 2), shard(VALIDATE, 2, 2)], "merge one schema at a time",
                 id="schemas-mixed"),
    pytest.param([shard(PROFILE, 1, 2), str(PROFILE)], "is not a shard", id="not-a-shard"),
    pytest.param(["{baseline}"], "schema 'mlamem.baseline/1' cannot be merged",
                 id="schema-not-mergeable"),
    pytest.param([shard(PROFILE, 1, 2), shard(PROFILE, 2, 3)],
                 "is one of 2 shards and", id="splits-differ"),
    pytest.param([shard(PROFILE, 1, 2), shard(PROFILE, 2, 2, op="dense-decode")],
                 "are shards of different sweeps (their op differs)", id="sweeps-differ"),
    pytest.param([shard(PROFILE, 1, 2), shard(PROFILE, 2, 2, shard="2 of 2")],
                 "shard '2 of 2' is not I/N", id="shard-field-malformed"),
    pytest.param([shard(PROFILE, 1, 2), shard(PROFILE, 2, 2, rows="none")],
                 "not a valid mlamem.profile/1 shard", id="rows-malformed"),
    pytest.param(["{out}/missing.json"], "no such result file", id="input-missing"),
    pytest.param([], "Missing argument", id="no-input"),
    pytest.param([shard(PROFILE, 1, 1), "--output", "{out}/m.md"], ".md names markdown",
                 id="output-extension"),
    pytest.param([shard(PROFILE, 1, 1, name="m.json"), "--output", "{out}/../m.json"],
                 "and --output both name", id="output-is-an-input"),
    pytest.param([shard(PROFILE, 1, 1), "--output", "{unwritable}/m.json"], "cannot write in",
                 id="output-unwritable"),
])
def test_merge(inputs, args, fix):
    """merge: mixed schemas, a file that is not a shard, a missing, repeated or foreign shard,
    or a bad --output: one line, exit 2, nothing written."""
    _run(inputs, "merge", args, fix)


SNAPSHOT = Path(__file__).parent / "fixtures" / "glm5-t1024-h200.snapshot.pickle"


class _RunsCommand:
    """Pickled, it names os.system: loading it with plain pickle would run a shell command."""

    def __reduce__(self):
        return (os.system, ("touch pwned",))


def written_bytes(name: str, content: Callable[[], bytes]) -> Made:
    """A file holding the bytes `content` returns."""
    def make(i: "Inputs") -> Path:
        path = i.folder / name
        path.write_bytes(content())
        return path
    return Made(make)


def _reused_block() -> dict:
    """8 KB of pickle that unpickles to 4 million blocks: one block and one segment reused."""
    block = {"size": 1, "state": "active_allocated", "frames": []}
    segment = {"address": 1, "total_size": 1, "blocks": [block] * 2000}
    return {"segments": [segment] * 2000, "device_traces": []}


def _recorded_with(part: Callable[[dict], dict], value: int) -> Callable[[], bytes]:
    """The H200 snapshot with the size of its `part` (a block or an event) set to `value`."""
    def content() -> bytes:
        data = pickle.loads(SNAPSHOT.read_bytes())
        part(data)["size"] = value
        return pickle.dumps(data)
    return content


def _cyclic() -> dict:
    """A snapshot whose segment list holds itself."""
    segments: list = []
    segments.append(segments)
    return {"segments": segments, "device_traces": []}


SNAPSHOT_CASES = [  # a file given as a snapshot that is none: explain and diff alike
    pytest.param([written_bytes("pwn.pickle", lambda: pickle.dumps(_RunsCommand()))],
                 "names posix.system, which a snapshot never does", id="snapshot-os-system"),
    pytest.param([written_bytes("half.pickle", lambda: SNAPSHOT.read_bytes()[:3000])],
                 "not a pickle", id="snapshot-truncated"),
    pytest.param([written_bytes("random.pickle", lambda: bytes(range(256)) * 8)],
                 "not a memory snapshot", id="snapshot-random-bytes"),
    pytest.param([written("json.pickle", '{"segments": []}')], "not a pickle",
                 id="snapshot-json"),
    pytest.param([written_bytes("list.pickle", lambda: pickle.dumps([1, 2]))],
                 "not a memory snapshot (expected an object)", id="snapshot-a-list"),
    pytest.param([written_bytes("nosize.pickle", lambda: pickle.dumps(
        {"segments": [], "device_traces": [[{"action": "alloc", "addr": 1}]]}))],
        "device_traces[0][0].size: missing", id="snapshot-event-without-size"),
    pytest.param([written_bytes("bomb.pickle", lambda: pickle.dumps(_reused_block()))],
                 "more than 16 values per byte of the file", id="snapshot-reuse-bomb"),
    pytest.param([written_bytes("cycle.pickle", lambda: pickle.dumps(_cyclic()))],
                 "refers to itself", id="snapshot-cycle"),
    pytest.param([written_bytes("neg.pickle", _recorded_with(
        lambda s: s["segments"][0]["blocks"][0], -1))],
                 "segments[0].blocks[0].size: -1 is negative", id="snapshot-negative-block"),
    pytest.param([written_bytes("huge.pickle", _recorded_with(
        lambda s: s["device_traces"][0][0], 2**200))],
                 f"device_traces[0][0].size: {2**200} is more than {2**48}",
                 id="snapshot-event-beyond-any-device"),
    pytest.param(["{out}/missing.pickle"], "no such memory snapshot", id="snapshot-missing"),
    pytest.param(["{out}"], "is a folder", id="snapshot-folder"),
]


@pytest.mark.parametrize(("args", "fix"), [
    *SNAPSHOT_CASES,
    pytest.param([str(SNAPSHOT), "-s", "no-such"], "no-such", id="scenario-unknown"),
    pytest.param([str(SNAPSHOT), "-s", "glm5-fp8-tp8", "-s", "glm5-fp8-tp8"],
                 "is given twice", id="given-twice"),
    pytest.param([str(SNAPSHOT), "--format", "csv"], "'csv' is not one of", id="format-csv"),
    pytest.param([str(SNAPSHOT), "--output", "{out}/e.csv"], "explain writes",
                 id="output-extension"),
    pytest.param([str(SNAPSHOT), "--output", "/no/such/folder/e.md"], "does not exist",
                 id="output-no-folder"),
    pytest.param([str(SNAPSHOT), "--output", "{unwritable}/e.md"], "cannot write in",
                 id="output-unwritable"),
    pytest.param([written_bytes("s.md", SNAPSHOT.read_bytes), "--output", "{out}/../s.md"],
                 "and --output both name", id="output-is-the-input"),
    pytest.param([], "Missing argument", id="no-input"),
])
def test_explain(inputs, args, fix):
    """explain: a file that is no snapshot (a pickle that would run a command, random bytes,
    JSON), an unknown scenario or a bad --output: one line, exit 2, nothing written or run."""
    _run(inputs, "explain", args, fix)
    assert not (inputs.folder / "pwned").exists() and not Path("pwned").exists()


@pytest.mark.parametrize(("args", "fix"), [
    *[pytest.param([str(SNAPSHOT), *case.values[0]], case.values[1], id=case.id)
      for case in SNAPSHOT_CASES],
    *[pytest.param([str(PROFILE), *case.values[0]], case.values[1], id=case.id)
      for case in ROW_CASES],
    *[pytest.param([str(case.values[0]), case.values[1]], case.values[2], id=case.id)
      for case in SECOND_COPY_CASES if "validate" not in case.id],
    pytest.param([str(PROFILE), str(SNAPSHOT)], "compare two of one kind", id="kinds-mixed"),
    pytest.param([str(PROFILE), "{baseline}"], "'mlamem.baseline/1' is not a result diff",
                 id="baseline"),
    pytest.param([str(PROFILE), written("half.json", lambda: PROFILE.read_text()[:5000])],
                 "not valid JSON", id="input-half"),
    pytest.param([str(PROFILE), written("badrow.json", _json_with(PROFILE, rows=[{"x": 1}]))],
                 "not a valid mlamem.profile/1 file", id="input-bad-row"),
    pytest.param([str(PROFILE), str(PROFILE), "--fail-on-growth", "10"],
                 "--fail-on-growth: '10' has no unit", id="growth-without-unit"),
    pytest.param([str(PROFILE), str(PROFILE), "--output", "{out}/d.csv"], "diff writes",
                 id="output-extension"),
    pytest.param([str(PROFILE), str(PROFILE), "--output", "{unwritable}/d.md"],
                 "cannot write in", id="output-unwritable"),
    pytest.param([str(PROFILE)], "Missing argument", id="one-input"),
])
def test_diff(inputs, args, fix):
    """diff: two kinds, a result it does not compare, a corrupt or hostile file, a size without
    its unit or a bad --output: one line, exit 2, nothing written or run."""
    _run(inputs, "diff", args, fix)
    assert not (inputs.folder / "pwned").exists() and not Path("pwned").exists()


@pytest.mark.parametrize(("args", "fix"), [
    pytest.param(["extra"], "unexpected extra argument", id="extra-argument"),
    pytest.param(["--serve-typo"], "No such option", id="unknown-option"),
    pytest.param(["--format", "csv"], "'csv' is not one of", id="bad-format"),
    pytest.param(["--weights-per-rank", "40GiB"], "--weights-per-rank applies to --serve",
                 id="serve-option-alone"),
    pytest.param(["--serve", "vllm serve x", "--weights-per-rank", "40"], "has no unit",
                 id="size-without-unit"),
])
def test_scenarios(inputs, args, fix):
    """scenarios takes no argument, and --serve's options only with it: anything else is one
    line, exit 2."""
    _run(inputs, "scenarios", args, fix)


@pytest.mark.parametrize(("args", "fix"), [
    *FORMAT_CASES,
    pytest.param(["--format", "csv"], "'csv' is not one of 'table', 'json'", id="format-csv"),
    pytest.param(["--format", "json", "--format", "table"], "--format is given twice",
                 id="given-twice"),
    pytest.param(["extra"], "unexpected extra argument", id="extra-argument"),
])
def test_kernels(inputs, args, fix):
    """kernels: a format it does not write, or anything else, is one line, exit 2."""
    _run(inputs, "kernels", args, fix)


@pytest.mark.parametrize(("args", "fix"), [
    pytest.param(["--version", "--versoin"], "No such option: --versoin", id="option-typo"),
    pytest.param(["-x"], "No such option: -x", id="unknown-short-option"),
])
def test_app_options(inputs, args, fix):
    """The app's own options: a typo is one line naming --help."""
    check_bad_input(inputs.resolve(args), fix, watch=inputs.folder)


def test_unknown_command(inputs):
    """A command that does not exist: one line naming --help."""
    _run(inputs, "profiel", [], "mlamem --help")


@pytest.mark.parametrize(("command", "formats"), [
    ("profile", render.FORMATS), ("validate", render.VALIDATION_FORMATS),
    ("repro-oom", render.REPRO_FORMATS), ("plan", render.PLAN_FORMATS),
    ("explain", render.EXPLAIN_FORMATS), ("diff", render.DIFF_FORMATS)])
def test_format_choices_are_what_the_command_writes(capsys, command, formats):
    """--help offers exactly the formats the command accepts (validate once offered csv)."""
    assert main([command, "--help"]) == 0
    offered = re.search(r"--format [<\[]([a-z|]+)[>\]]", capsys.readouterr().out)
    assert offered and offered.group(1).split("|") == list(formats)


@pytest.mark.parametrize(("name", "same_as"), [
    ("rows.json", "json"), ("rows.csv", "csv"), ("rows.md", "markdown"), ("rows.txt", "table"),
    ("rows.out", "table")])
def test_output_extension_names_the_format(tmp_path, name, same_as):
    """Without --format, .json writes JSON, .csv CSV, .md Markdown, .txt the table, and any
    other name the default, the table: each the bytes --format gives."""
    run = ["profile", "--predict", "--tokens", "1024", "--paths", "alloc", "--output"]
    assert main([*run, str(tmp_path / name)]) == 0
    assert main([*run, str(tmp_path / "explicit"), "--format", same_as]) == 0
    strip = re.compile(r'"created": "[^"]*"')  # the one field that differs between two runs
    assert (strip.sub("", (tmp_path / name).read_text())
            == strip.sub("", (tmp_path / "explicit").read_text()))


def test_decode_dims_are_the_cache_layout():
    """The head dims a scenario must have are those of the fp8_ds_mla cache the kernels read."""
    from mlamem.kernels import fp8_ds_mla
    from mlamem.spec import scenario

    assert (scenario.DECODE_LATENT, scenario.DECODE_ROPE) == (fp8_ds_mla.NOPE_DIM,
                                                              fp8_ds_mla.ROPE_DIM)


def _process(args: list[str], cwd: Path) -> subprocess.Popen:
    """`python -m mlamem ARGS` as its own process, started in `cwd` (outside the checkout)."""
    return subprocess.Popen([sys.executable, "-m", "mlamem", *args], cwd=cwd, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_a_real_process_says_one_line(tmp_path):
    """`python -m mlamem` with bad input: exit 2, one line, no traceback."""
    done = _process(["plan", "--gpu-memory", "80"], tmp_path)
    out, err = done.communicate(timeout=120)
    assert done.returncode == 2 and out == ""
    assert err.startswith("mlamem: error: --gpu-memory") and err.count("\n") == 1, err


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
@pytest.mark.parametrize("when", ["starting", "running"])
def test_ctrl_c_is_one_line_and_nothing_written(tmp_path, when, stop):
    """Ctrl-C (or SIGTERM, as `kill` or a CI runner's timeout sends) while the CLI starts (0.5 s
    in) or while it works (at its first progress line): the line `interrupted; nothing written`
    (or what was whole by then), exit 130 (SIGTERM: 143), no traceback, no partial or temporary
    file."""
    run = _process(["profile", "--predict", "--output", str(tmp_path / "rows.json"),
                    "--report", str(tmp_path / "report")], tmp_path)
    first = ""
    if when == "starting":
        time.sleep(0.5)
    else:
        first = run.stderr.readline()  # a progress line: the sweep is under way
    run.send_signal(stop)
    _, err = run.communicate(timeout=120)
    err = first + err
    if run.returncode == 0:
        pytest.skip("the run finished before Ctrl-C")
    assert run.returncode == 128 + stop and "Traceback" not in err, err
    files = sorted(str(p) for p in tmp_path.rglob("*") if p.is_file())
    said = "nothing written" if not files else f"wrote only {', '.join(files)}"
    assert sorted(err.splitlines()[-1].split(", ")) == sorted(
        f"mlamem: interrupted; {said}".split(", ")), err  # files: what was whole before Ctrl-C
    assert not any(p.name.endswith(".tmp") for p in tmp_path.rglob("*"))


LONG = "y" * 300  # longer than a file system takes for one name (255 bytes)


def test_a_scenario_name_too_long_for_a_file_name_still_makes_its_report(tmp_path):
    """A scenario's name becomes the report's JSON and figure names: one too long for a file
    name is cut (with a hash, so two long names stay apart), never found only after the run
    with a traceback and an empty report folder left behind."""
    path = scenario_file(tmp_path, edits={'name = "glm5-fp8-tp8"': f'name = "{LONG}"'})
    report = tmp_path / "report"
    assert main(["profile", "--predict", "--tokens", "1024", "--paths", "alloc", "-s", str(path),
                 "--report", str(report)]) == 0
    names = [p.name for p in report.iterdir()]
    assert "report.md" in names and any(n.endswith(".json") for n in names), names
    assert all(len(n.encode()) <= 255 for n in names), names


def test_figure_names_of_a_long_report_name_fit(tmp_path):
    """report --output with a long (but valid) name: the figures named after it fit too."""
    output = tmp_path / ("z" * 240 + ".md")
    assert main(["report", str(RESULTS / "profile-glm5-h200.json"), "--output", str(output)]) == 0
    assert all(len(p.name.encode()) <= 255 for p in tmp_path.iterdir())
    assert len(list(tmp_path.glob("*.png"))) > 0


@pytest.mark.parametrize("args", [
    ["profile", "--predict", "--tokens", "1024", "--output", f"{LONG}.json"],
    ["profile", "--predict", "--tokens", "1024", "--report", LONG],
    ["report", str(RESULTS / "profile-glm5-h200.json"), "--output", f"{LONG}.md"],
    ["profile", "-s", f"{LONG}.toml"],
    ["plan", "--output", f"{LONG}/plan.json"],
    ["diff", f"{LONG}.pickle", str(RESULTS / "profile-glm5-h200.json")],
    ["explain", f"{LONG}.pickle"],
    ["report", f"{LONG}.json"],
    ["gate", "--predict", "--baseline", f"{LONG}.json"],
    ["plan", "--model", LONG],
    ["scenarios", "--serve", f"vllm serve {LONG} -tp 8 --kv-cache-dtype fp8_ds_mla"],
])
def test_a_name_too_long_for_a_file_is_one_line(args):
    """A path with a name longer than a file system takes: one line before any work, exit 2."""
    check_bad_input(args, ("too long", "longer than", "no local folder"))


@pytest.mark.parametrize("command", [["profile", "--predict", "--tokens", "64"],
                                     ["repro-oom", "--predict"], ["plan"], ["graphs", "--predict"]])
@pytest.mark.parametrize("name", ["", " "])
def test_an_empty_scenario_is_refused_not_the_default(command, name):
    """--scenario '' (an unset shell variable) ran the default scenario in silence."""
    check_bad_input([*command, "--scenario", name], "--scenario")
