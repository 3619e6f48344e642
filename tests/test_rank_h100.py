"""The rank with what it allocates beyond attention, measured on an H100 (2026-12-06,
reports/rank-h100, copied into tests/fixtures): each run's own command, predicted here on the
CPU, gives every field the GPU measured, and the report's table shows the runs' figures."""

import json
import shlex
from pathlib import Path

import pytest

from mlamem.cli import main
from mlamem.commands.repro import prediction_differences

RUNS = Path(__file__).parent / "fixtures" / "reports" / "rank-h100"
README = Path(__file__).parent.parent / "reports" / "rank-h100" / "README.md"
CASES = sorted(p.stem for p in RUNS.glob("rank-*.json") if not p.stem.endswith(".predicted"))


def _measured(name: str) -> dict:
    measured = json.loads((RUNS / f"{name}.json").read_text())
    assert measured["measured"] and measured["environment"]["gpu"] == "NVIDIA H100 80GB HBM3"
    return measured


def test_every_case_of_the_suite_was_run():
    assert CASES == ["rank-dsv32-ep-sglang", "rank-dsv32-ep-vllm", "rank-dsv32-sglang",
                     "rank-dsv32-vllm", "rank-glm5-sglang", "rank-glm5-vllm"]


@pytest.mark.parametrize("name", CASES)
def test_the_runs_command_predicted_here_is_the_measured_rank(name, tmp_path, capsys):
    measured = _measured(name)
    words = shlex.split(measured["command"])
    assert words[:2] == ["mlamem", "repro-oom"] and words[-4:-2] == ["--format", "json"]
    output = tmp_path / "predicted.json"
    assert main([*words[1:-1], str(output), "--predict"]) == 0
    capsys.readouterr()
    assert prediction_differences(measured, json.loads(output.read_text())) == []


def _row(measured: dict) -> str:
    def shown(case: dict) -> str:
        verdict = "fits" if case["verdict"] == "fits" else f"OOM on {case['oom_buffer']}"
        return f"{verdict}, {case['max_safe_tokens']}"
    alloc, workspace = measured["cases"]
    return f"{shown(alloc)} | {shown(workspace)} | " \
           f"{alloc['kv_cache_tokens']} / {workspace['kv_cache_tokens']} |"


@pytest.mark.parametrize("name", CASES)
def test_the_reports_table_shows_the_measured_figures(name):
    rows = [line for line in README.read_text().splitlines() if line.startswith(f"| `{name}` |")]
    row = rows[-1]  # the figures' table comes after the commands' one
    shown = row.split(" | ", 1)[1].replace(" at 32768,", ",")
    assert shown == _row(_measured(name))
