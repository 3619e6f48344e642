"""The rank with what it allocates beyond attention, measured on an H100 (2026-12-06,
reports/rank-h100, rank-drafts-h100 and rank-older-h100, copied into tests/fixtures): each run's own
command, predicted here on the CPU, gives every field the GPU measured, and each report's table
shows its runs' figures."""

import json
import shlex
from pathlib import Path

import pytest

from mlamem.cli import main
from mlamem.commands.repro import prediction_differences

FOLDERS = ("rank-h100", "rank-drafts-h100", "rank-older-h100")
FIXTURES = Path(__file__).parent / "fixtures" / "reports"
REPORTS = Path(__file__).parent.parent / "reports"
CASES = sorted(f"{folder}/{p.stem}" for folder in FOLDERS for p in (FIXTURES / folder).glob("rank-*.json")
               if not p.stem.endswith(".predicted"))


def _measured(case: str) -> dict:
    measured = json.loads((FIXTURES / f"{case}.json").read_text())
    assert measured["measured"] and measured["environment"]["gpu"] == "NVIDIA H100 80GB HBM3"
    return measured


def test_every_case_of_the_suites_was_run():
    drafts = [f"rank-drafts-h100/rank-{name}"
              for name in ("glm5-sglang-eagle", "glm52-sglang", "glm52-vllm")]
    rank = [f"rank-h100/rank-{name}" for name in ("dsv32-ep-sglang", "dsv32-ep-vllm", "dsv32-sglang",
                                                 "dsv32-vllm", "glm5-sglang", "glm5-vllm")]
    older = [f"rank-older-h100/rank-{name}" for name in ("glm52-sglang-0.5.13", "glm52-vllm-0.23")]
    assert drafts + rank + older == CASES


@pytest.mark.parametrize("case", CASES)
def test_the_runs_command_predicted_here_is_the_measured_rank(case, tmp_path, capsys):
    measured = _measured(case)
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


@pytest.mark.parametrize("case", CASES)
def test_the_reports_table_shows_the_measured_figures(case):
    folder, name = case.split("/")
    readme = (REPORTS / folder / "README.md").read_text()
    rows = [line for line in readme.splitlines() if line.startswith(f"| `{name}` |")]
    row = rows[-1]  # the figures' table comes after the commands' one
    shown = row.split(" | ", 1)[1].replace(" at 32768,", ",")
    assert shown == _row(_measured(case))
