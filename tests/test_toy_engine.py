"""A new engine is one module plus one registry line: the toy engine (tests/toy_engine.py), with
its own scenario table and phases, runs through `mlamem repro-oom --engine toy --predict`, and
its verdicts and bytes are those its phases give on the allocator model."""

import json
from pathlib import Path

import pytest

from mlamem.cli import main
from mlamem.engine_registry import REGISTRY, EngineEntry
from mlamem.units import GiB

MiB = 1 << 20
SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
SMALL, LARGE = 1024, 20 * 1024  # MiB: the small step fits in the headroom, the large one not


@pytest.fixture
def toy(monkeypatch, tmp_path):
    """The toy registered (the one line), and GLM-5 served by it with a [toy] table."""
    monkeypatch.setitem(REGISTRY, "toy", EngineEntry("toy_engine", section="toy_engine:ToySection"))
    text = (SCENARIOS / "glm5-fp8-tp8.toml").read_text()
    scenario = tmp_path / "glm5-toy.toml"
    scenario.write_text(text.replace('engines = ["vllm", "sglang"]', 'engines = ["toy"]')
                        + f"\n[toy]\nsmall_step_mib = {SMALL}\nlarge_step_mib = {LARGE}\n")
    return scenario


def test_repro_oom_runs_a_toy_engine_from_its_phases(toy, tmp_path, capsys):
    output = tmp_path / "toy.json"
    code = main(["repro-oom", "--scenario", str(toy), "--engine", "toy", "--predict",
                 "--gpu-memory", "40GiB", "--format", "json", "--output", str(output)])
    assert code == 0, capsys.readouterr().err
    result = json.loads(output.read_text())
    assert result["engine"] == "toy" and not result["measured"]
    assert result["budget"]["gpu_memory_bytes"] == 40 * GiB
    small, large = result["cases"]
    assert (small["size"], large["size"]) == ("small", "large")
    for case in (small, large):
        non_torch, cap = case["non_torch_bytes"], case["torch_limit_bytes"]
        assert non_torch > 0 and cap == 40 * GiB - non_torch
        assert case["profile_peak_bytes"] == 256 * MiB
        rest = 512 * MiB + 256 * MiB + non_torch
        assert case["kv_cache_bytes"] == (int(0.85 * 40 * GiB) - rest) // (2 * MiB) * (2 * MiB)
        placed = 512 * MiB + case["kv_cache_bytes"]
    assert small["verdict"] == "fits" and small["phase"] == "done"
    assert small["step_peak_bytes"] == placed + SMALL * MiB
    assert small["headroom_bytes"] == cap - placed - SMALL * MiB
    assert large["verdict"] == "oom" and large["phase"] == "step"
    assert (large["oom_buffer"], large["oom_allocated_by"]) == ("toy_step", "engine")
    assert large["oom_requested_bytes"] == LARGE * MiB
    assert large["free_bytes_at_oom"] == cap - placed
    assert "max_safe_tokens" not in small  # the toy names no searched knob


def test_the_toy_table_is_checked_by_the_toy_section(toy, capsys):
    """The toy's table is validated by its own class: a missing required field is one line."""
    toy.write_text(toy.read_text().replace(f"large_step_mib = {LARGE}\n", ""))
    assert main(["repro-oom", "--scenario", str(toy), "--engine", "toy", "--predict"]) == 2
    assert "[toy].large_step_mib is missing" in capsys.readouterr().err


def test_the_toy_result_renders_in_its_view(toy, capsys):
    assert main(["repro-oom", "--scenario", str(toy), "--engine", "toy", "--predict",
                 "--gpu-memory", "40GiB", "--format", "markdown"]) == 0
    text = capsys.readouterr().out
    assert "### Toy engine: glm5-fp8-tp8" in text and "| large step | OOM in step: toy_step" in text
