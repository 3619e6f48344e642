"""A new engine is two modules and one entry point: the toy engine's spec (tests/toy_engine_spec.py,
its `[toy]` table and view, no torch) and rank (tests/toy_engine.py, its phases), registered by
an entry point of the group `mlamem.engines` in a dist-info folder put on sys.path, as another
package would install it. It runs through `mlamem repro-oom --engine toy --predict`, its
verdicts and bytes those its phases give on the allocator model, and `mlamem report` reads its
saved result through its spec alone."""

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mlamem.cli import main
from mlamem.spec.engine_registry import engine_names, engine_spec, load_engine, rediscover
from mlamem.spec.errors import UserError
from mlamem.spec.units import GiB

MiB = 1 << 20
TESTS = Path(__file__).resolve().parent
SCENARIOS = TESTS.parent / "scenarios"
SMALL, LARGE = 1024, 20 * 1024  # MiB: the small step fits in the headroom, the large one not
RANKS = ("toy_engine", "mlamem.engines.vllm", "mlamem.engines.sglang",
         "mlamem.engines.trtllm_context_reuse", "mlamem.engines.decode_rank")


@pytest.fixture
def toy_site(tmp_path) -> Path:
    """A folder holding the toy package's dist-info: its metadata and its one entry point."""
    dist_info = tmp_path / "site" / "toy_engine-0.1.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-engine\nVersion: 0.1\n")
    (dist_info / "entry_points.txt").write_text("[mlamem.engines]\ntoy = toy_engine_spec:SPEC\n")
    return dist_info.parent


@pytest.fixture
def toy(toy_site, tmp_path) -> Iterator[Path]:
    """The toy installed (its dist-info on sys.path), and GLM-5 served by it with a [toy] table."""
    sys.path.insert(0, str(toy_site))
    rediscover()
    text = (SCENARIOS / "glm5-fp8-tp8.toml").read_text()
    scenario = tmp_path / "glm5-toy.toml"
    scenario.write_text(text.replace('engines = ["vllm", "sglang"]', 'engines = ["toy"]')
                        + f"\n[toy]\nsmall_step_mib = {SMALL}\nlarge_step_mib = {LARGE}\n")
    try:
        yield scenario
    finally:
        sys.path.remove(str(toy_site))
        rediscover()


def test_the_entry_point_registers_the_toy_after_the_shipped_engines(toy):
    assert engine_names() == ["vllm", "trtllm-context-reuse", "sglang", "toy"]
    spec = engine_spec("toy")
    assert spec.key_field == "size" and spec.section.__name__ == "ToySection"
    rank = load_engine("toy")
    assert rank.spec is spec and rank.case_type.key_field == spec.key_field


@pytest.mark.parametrize(("value", "problem"), [
    ("toy_engine_spec:VIEW", "is no mlamem.spec.engines.EngineSpec named 'toy'"),
    ("toy_engine_spec:NOSUCH", "does not load (AttributeError"),
    ("vllm_spec_nosuch:SPEC", "does not load (ModuleNotFoundError")])
def test_a_broken_entry_point_is_one_line_naming_it(toy_site, value, problem):
    (toy_site / "toy_engine-0.1.dist-info" / "entry_points.txt").write_text(
        f"[mlamem.engines]\ntoy = {value}\n")
    sys.path.insert(0, str(toy_site))
    rediscover()
    try:
        with pytest.raises(UserError, match=f"engine 'toy': its mlamem.engines entry point {value} "
                                            f"{re.escape(problem)}"):
            engine_spec("toy")
    finally:
        sys.path.remove(str(toy_site))
        rediscover()


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


def report_in_a_fresh_process(toy_site: Path, result: Path, output: Path) -> dict:
    """`mlamem report RESULT --output OUTPUT` in a fresh process with the toy installed: its
    exit code, and whether torch and which engine ranks were imported."""
    code = ("import json, sys; from mlamem.cli import main; code = main(sys.argv[1:]); "
            f"print(json.dumps({{'code': code, 'torch': 'torch' in sys.modules, "
            f"'ranks': sorted(m for m in {RANKS!r} if m in sys.modules)}}))")
    path = os.pathsep.join([str(toy_site), str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])])
    done = subprocess.run([sys.executable, "-P", "-c", code, "report", str(result), "--output",
                           str(output)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": path}, check=True)
    return json.loads(done.stdout.splitlines()[-1])


@pytest.fixture
def saved_toy(toy, tmp_path, capsys) -> Path:
    result = tmp_path / "toy.json"
    assert main(["repro-oom", "--scenario", str(toy), "--engine", "toy", "--predict",
                 "--gpu-memory", "40GiB", "--format", "json", "--output", str(result)]) == 0
    capsys.readouterr()
    return result


def test_report_reads_the_saved_toy_through_its_spec_alone(saved_toy, toy_site, tmp_path):
    """`mlamem report` draws the toy's saved result in its view without importing a rank."""
    seen = report_in_a_fresh_process(toy_site, saved_toy, tmp_path / "report.md")
    assert seen["code"] == 0 and seen["ranks"] == []
    assert "### Toy engine: glm5-fp8-tp8" in (tmp_path / "report.md").read_text()


def test_report_of_the_saved_toy_imports_no_torch(saved_toy, toy_site, tmp_path):
    """`mlamem report` of a saved result reads it through the result models and the engine's
    spec: torch never loads."""
    assert not report_in_a_fresh_process(toy_site, saved_toy, tmp_path / "report.md")["torch"]
