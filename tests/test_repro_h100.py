"""GLM-5's repro-oom at its H100 target (CUDA's total, 81079 MiB), measured on an H100 80GB itself
(2026-12-06, the rank with its stages beyond attention and its attention locals) and on an H200
emulating it (2026-12-05, before them) (reports/repro-oom-h100, copied into tests/fixtures): the
prediction, made here on the CPU, against both."""

import json
from importlib import resources
from pathlib import Path

import pytest

from mlamem.cli import main
from mlamem.commands.repro import prediction_differences

RUNS = Path(__file__).parent / "fixtures" / "reports" / "repro-oom-h100"
SEED_SERVE = ("vllm serve zai-org/GLM-5-FP8 -tp 8 --max-num-seqs 256 --kv-cache-dtype fp8_ds_mla "
              "--max-num-batched-tokens 32768 --gpu-memory-utilization 0.85 --max-model-len 131072")
ARGS = {"repro-glm5": [], "repro-glm5-sglang": ["--engine", "sglang"],
        "repro-glm5-graphs": ["--cuda-graphs", "on"],
        "repro-seed-eager": ["--serve", f"{SEED_SERVE} --enforce-eager", "--gpu", "H100 SXM 80GB",
                             "--weights-per-rank", "40GiB"]}
def _shipped_as_measured(tmp_path: Path) -> Path:
    """glm5-fp8-tp8 as it was shipped when these runs were made: vLLM's default max_num_seqs
    1024 (it now takes the PR's 256)."""
    shipped = (resources.files("mlamem.scenarios") / "glm5-fp8-tp8.toml").read_text()
    assert "\nmax_num_seqs = 256 " in shipped
    path = tmp_path / "glm5-fp8-tp8.toml"
    path.write_text(shipped.replace("\nmax_num_seqs = 256 ", "\nmax_num_seqs = 1024"))
    return path


def _predicted(args: list[str], tmp_path: Path, capsys, seqs_as_then: bool = False) -> dict:
    """The prediction of one run; `seqs_as_then`: glm5-fp8-tp8 at the max_num_seqs it had."""
    output = tmp_path / "predicted.json"
    shipped = seqs_as_then and "--serve" not in args
    if shipped:
        args = ["-s", str(_shipped_as_measured(tmp_path)), *args]
    assert main(["repro-oom", *args, "--predict", "--format", "json", "--output", str(output)]) == 0
    capsys.readouterr()
    predicted = json.loads(output.read_text())
    if shipped:  # the file's name, as the shipped scenario's source reads
        predicted["scenario"]["source"] = "glm5-fp8-tp8.toml"
    return predicted


def _measured(gpu: str, name: str) -> dict:
    measured = json.loads((RUNS / gpu / f"{name}.json").read_text())
    assert measured["measured"] and measured["scenario"]["target_gpu"] == "H100 SXM 80GB"
    if measured["scenario"]["model"] == "GLM-5-FP8 FP8":  # the seed's name before h-edges
        measured["scenario"]["model"] = "GLM-5-FP8"  # dropped the doubled FP8 (a word, no figure)
    return measured


@pytest.mark.parametrize("name", ARGS)
def test_the_h100_itself_equals_the_prediction(name, tmp_path, capsys):
    """vLLM eager, SGLang and vLLM's CUDA graphs on the H100 the scenario names: every field a
    prediction gives, the limits (each N fits, N + 1 runs out of memory) and SGLang's largest
    fractions included, now that the prediction keeps to the target as the physical device
    (the H100's record in mlamem/non_torch.toml). The runs of 2026-12-06 (commit a42fa89)
    measured the rank as it is: its stages beyond attention, the DSA layer's attention locals,
    the indexer's keys in vLLM's KV cache, glm5-fp8-tp8 at the PR's max_num_seqs 256."""
    measured = _measured("h100", name)
    assert measured["environment"]["gpu"] == "NVIDIA H100 80GB HBM3"
    assert prediction_differences(measured, _predicted(ARGS[name], tmp_path, capsys)) == []


@pytest.mark.parametrize("name", ARGS)
def test_the_h200_runs_before_the_target_room_differ_only_in_the_limits(name, tmp_path, capsys,
                                                                        vllm_cache_as_measured,
                                                                        rank_before_stages):
    """The H200 runs of 2026-12-05 emulated the H100 target in the H200's larger memory, whose
    spare memory took the modules the step loads after the KV cache is sized: every field but
    the largest safe values equals the prediction, and each of their limits is above it, the
    H100's own, never under. (A measured run on a larger GPU now keeps to the target's room.)
    They predate the rank's stages beyond attention and the indexer's keys in vLLM's KV cache:
    the rank is predicted as it ran (`rank_before_stages`, `vllm_cache_as_measured`), the
    shipped scenario at max_num_seqs 1024 as it then was."""
    measured = _measured("h200", name)
    assert measured["environment"]["gpu"] == "NVIDIA H200"
    predicted = _predicted(ARGS[name], tmp_path, capsys, seqs_as_then=True)
    differences = prediction_differences(measured, predicted)
    assert differences and all(": max_safe_" in d for d in differences), differences
    for was, case in zip(measured["cases"], predicted["cases"], strict=True):
        assert was["max_safe_tokens"] > case["max_safe_tokens"]
