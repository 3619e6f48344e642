"""repro-oom of every shipped scenario on a GPU, measured and predicted: equal field by field.

Another process's CUDA context is a neighbour that moves repro-oom's device-wide figures, and
pytest's own process is one once a test has touched CUDA. So this file runs mlamem only in child
processes, checks the kernel there too, and is skipped where this process already holds a
context (scripts/gpu_check.py runs it alone, first). It asks no question of CUDA here: even
`torch.cuda.is_available()` initialises the driver, and that moved the figures by 64 KiB on the
H200.

GLM-5's expected verdicts (the alloc path out of memory at 32768) and the seed's limits (31488 /
38257) are predicted with the DSA layer's attention locals (spec/engines/vllm_pass.py), not yet
measured on a GPU."""

import functools
import json
import subprocess
import sys

import pytest
import torch

from mlamem.commands.repro import prediction_differences
from mlamem.spec import scenario as scenarios
from mlamem.testing import recorded_host_or_skip

NEIGHBOUR = ("this pytest process holds a CUDA context, a neighbour that moves repro-oom's "
             "figures; run this file alone (scripts/gpu_check.py does)")

# every shipped scenario repro-oom replays (its sparse decode step), with FlashMLA, under each
# engine it declares that replays the step; GLM-5 also with vLLM's build
# (kimi-k2-context-reuse: its first engine, context reuse); ids read NAME-KERNEL-by-ENGINE
REPRO_CASES = [pytest.param(name, kernel, engine, id=f"{name}-{kernel}-by-{engine}")
               for name, kernel, engine in [
                   *((name, "flashmla", engine) for name in scenarios.shipped_names()
                     if "sparse-decode" in scenarios.load(name).operations
                     for engine in scenarios.load(name).engines
                     if engine == scenarios.load(name).engines[0] or engine == "sglang"),
                   ("glm5-fp8-tp8", "flashmla-vllm", "vllm")]]
# the verdicts a scenario's cases must get (--expect-oom / --expect-fit); GLM-5's with the DSA
# layer's attention locals (the alloc path's limit 31488 under its 32768 tokens)
EXPECTED = {"glm5-fp8-tp8": ["--expect-oom", "alloc", "--expect-fit", "workspace"],
            "kimi-k2-context-reuse": ["--expect-oom", "none", "--expect-oom", "fp8",
                                      "--expect-fit", "full"]}
UNAVAILABLE = "from mlamem.kernels import load_kernel; import sys; " \
              "print(load_kernel(sys.argv[1])().unavailable_reason() or '')"


@functools.cache
def _unavailable_reason(kernel: str) -> str:
    """Why `kernel` cannot run on this machine ('' where it can), asked in a child process."""
    return _child("-c", UNAVAILABLE, kernel, timeout=120).stdout.strip()


def _child(*args: str, timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-P", *args], capture_output=True, text=True,
                          timeout=timeout)


def _repro_json(args: list[str], output) -> dict:
    done = _child("-m", "mlamem", "repro-oom", *args, "--format", "json", "--output", str(output),
                  timeout=400)
    assert done.returncode == 0, done.stderr
    return json.loads(output.read_text())


@pytest.mark.parametrize(("name", "kernel", "engine"), REPRO_CASES)
def test_every_shipped_scenario_measured_equals_predicted(name, kernel, engine, tmp_path):
    """`mlamem repro-oom` at the scenario's defaults, measured (exit 0 with the verdicts of
    EXPECTED) and predicted: equal in every field a prediction gives, case by case."""
    if torch.cuda.is_initialized():
        pytest.skip(NEIGHBOUR)
    if reason := _unavailable_reason(kernel):
        pytest.skip(f"{kernel}: {reason}")
    recorded_host_or_skip(target_mib=scenarios.load(name).gpu.memory_mib)
    args = ["-s", name, "--kernel", kernel, "--engine", engine]
    expected = EXPECTED.get(name, []) if engine == scenarios.load(name).engines[0] else []
    measured = _repro_json([*args, *expected], tmp_path / f"{name}.json")
    predicted = _repro_json([*args, "--predict"], tmp_path / f"{name}.predicted.json")
    assert measured["measured"] and not predicted["measured"]
    _charged_by_visibility(measured)
    assert prediction_differences(measured, predicted) == []


def _charged_by_visibility(measured: dict) -> None:
    """Each case that reached KV sizing charged this process's own non-torch memory where NVML
    listed it, else the device-wide reading, which its note then names: what the model's charge
    (context + modules, mlamem/runtime/non_torch.py) equals field by field."""
    from mlamem.engines import load_engine
    from mlamem.runtime import nvml
    key_field = load_engine(measured["engine"]).case_type.key_field
    for case in measured["cases"]:
        if case.get("nvml_visibility") is None:  # failed before KV sizing: nothing read
            continue
        own = case["nvml_visibility"] == nvml.THIS_PROCESS
        assert case["non_torch_bytes"] == (case["non_torch_process_bytes"] if own
                                           else case["non_torch_device_bytes"]), case
        [note] = [n for n in measured["notes"] if n.startswith(f"{case[key_field]}: non-torch")]
        assert ("this process's own NVML figure" if own else case["nvml_visibility"]) in note


SGLANG_SCENARIOS = [name for name in scenarios.shipped_names()
                   if "sglang" in scenarios.load(name).engines]


@pytest.mark.parametrize("name", SGLANG_SCENARIOS)
def test_sglang_with_cuda_graphs_measured_equals_predicted(name, tmp_path):
    """`mlamem repro-oom --engine sglang --cuda-graphs on` at the scenario's defaults: the
    decode graphs captured after the pool, measured and predicted, equal in every field a
    prediction gives (the capture list, the captures taken, the pool, the step with what the
    graphs left), case by case; the device-wide growth is measured only."""
    if torch.cuda.is_initialized():
        pytest.skip(NEIGHBOUR)
    if reason := _unavailable_reason("flashmla"):
        pytest.skip(f"flashmla: {reason}")
    recorded_host_or_skip(target_mib=scenarios.load(name).gpu.memory_mib)
    args = ["-s", name, "--kernel", "flashmla", "--engine", "sglang", "--cuda-graphs", "on"]
    measured = _repro_json(args, tmp_path / f"{name}.json")
    predicted = _repro_json([*args, "--predict"], tmp_path / f"{name}.predicted.json")
    assert measured["measured"] and not predicted["measured"]
    for case in measured["cases"]:
        assert case["graph_captures"] == len(case["graph_batch_sizes"]), case["path"]
        assert case["graph_device_bytes"] is not None and case["graph_pool_bytes"] > 0
    assert prediction_differences(measured, predicted) == []


SEED_COMMAND = ("vllm serve zai-org/GLM-5-FP8 --tensor-parallel-size 8 --max-num-seqs 256 "
                "--attention-backend FLASHMLA_SPARSE --kv-cache-dtype fp8_ds_mla "
                "--max-num-batched-tokens 32768 --gpu-memory-utilization 0.85 "
                "--max-model-len 131072 --enforce-eager")


def test_the_seed_serve_command_measured_equals_predicted(tmp_path):
    """The seed's pasted `vllm serve` command, with --gpu "H100 SXM 80GB" and the
    seed's weights as the override, made into a scenario and reproduced on the GPU at its
    32768 tokens: the alloc path runs out of memory, the workspace path fits, and every figure
    a prediction gives is the measured one, the limits included (31488 and 38257 with the H100
    as the physical device, reports/repro-oom-h100/h100)."""
    if torch.cuda.is_initialized():
        pytest.skip(NEIGHBOUR)
    if reason := _unavailable_reason("flashmla"):
        pytest.skip(f"flashmla: {reason}")
    recorded_host_or_skip()
    done = _child("-m", "mlamem", "scenarios", "--serve", SEED_COMMAND, "--gpu", "H100 SXM 80GB",
                  "--weights-per-rank", "40GiB", timeout=120)
    assert done.returncode == 0, done.stderr
    seed = tmp_path / "seed.toml"
    seed.write_text(done.stdout)
    measured = _repro_json(["-s", str(seed), "--expect-oom", "alloc", "--expect-fit",
                            "workspace"], tmp_path / "seed.json")
    predicted = _repro_json(["-s", str(seed), "--predict"], tmp_path / "seed.predicted.json")
    _charged_by_visibility(measured)
    assert prediction_differences(measured, predicted) == []
    assert [c["max_safe_tokens"] for c in predicted["cases"]] == [31488, 38257]
