"""`mlamem diff A B`: two results of one kind, or two snapshots, per case and per buffer."""

import json
from pathlib import Path

import pytest

from mlamem import results
from mlamem.cli import main

FIXTURES = Path(__file__).parent / "fixtures"
SNAPSHOT = FIXTURES / "glm5-t1024-h200.snapshot.pickle"


@pytest.fixture(scope="module")
def paths_profiles(tmp_path_factory) -> tuple[Path, Path]:
    """Predicted profiles of the alloc path and of the workspace path at T=1024 and 8192."""
    folder = tmp_path_factory.mktemp("diff")
    for path in ("alloc", "workspace"):
        assert main(["profile", "--predict", "--tokens", "1024,8192", "--paths", path,
                     "--format", "json", "--output", str(folder / f"{path}.json")]) == 0
    return folder / "alloc.json", folder / "workspace.json"


def _diff(capsys, *args) -> tuple[int, dict]:
    capsys.readouterr()
    code = main(["diff", *map(str, args), "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    results.read(doc, "mlamem.diff/1")
    return code, doc


def test_alloc_against_workspace_names_the_buffers_that_moved(paths_profiles, capsys):
    """Each T's alloc row pairs with its workspace row; padded_q moved, by its bytes in the
    alloc profile, and every peak change is the profiles' difference."""
    a, b = paths_profiles
    code, doc = _diff(capsys, a, b)
    rows_a = json.loads(a.read_text())["rows"]
    rows_b = json.loads(b.read_text())["rows"]
    assert code == 0 and doc["kind"] == "profile" and doc["environment"] == []
    assert len(doc["units"]) == 2
    for unit, ra, rb in zip(doc["units"], rows_a, rows_b, strict=True):
        assert unit["peak_change_bytes"] == rb["peak_allocated_bytes"] - ra["peak_allocated_bytes"]
        moved = {x["name"]: x for x in unit["buffers"] if x["change_bytes"]}
        padded_q = next(x["requested_bytes"] for x in ra["buffers"] if x["name"] == "padded_q")
        assert moved == {"padded_q": {"name": "padded_q", "a_bytes": padded_q, "b_bytes": None,
                                      "change_bytes": -padded_q}}
        assert -unit["peak_change_bytes"] == padded_q


def test_fail_on_growth_exits_1_when_a_peak_grows_more(paths_profiles, capsys):
    """Workspace -> alloc grows each peak by padded_q: 0B fails, a larger allowance passes;
    alloc -> workspace shrinks and passes."""
    a, b = paths_profiles
    code, doc = _diff(capsys, b, a, "--fail-on-growth", "0B")
    assert code == 1 and doc["failed"] and doc["peak_growth_bytes"] > 0
    allowance = f"{doc['peak_growth_bytes']}B"
    assert _diff(capsys, b, a, "--fail-on-growth", allowance)[0] == 0
    assert _diff(capsys, a, b, "--fail-on-growth", "0B")[0] == 0


def test_the_markdown_is_ready_for_a_pull_request(paths_profiles, capsys):
    a, b = paths_profiles
    assert main(["diff", str(b), str(a), "--format", "markdown", "--fail-on-growth", "0B"]) == 1
    text = capsys.readouterr().out
    assert text.startswith("### mlamem diff (profile): FAILED")
    assert "| `glm5-fp8-tp8 sparse-decode T=1024 workspace → alloc` |" in text
    assert ("| `glm5-fp8-tp8 sparse-decode T=1024 workspace → alloc` | `padded_q` | - | "
            "72.000 MiB | +72.000 MiB (+75497472 B) |") in text


def test_environments_that_differ_are_named_as_the_gate_names_them(capsys):
    """A predicted H200 profile against the measured one: `measured` differs, blocking for the
    gate; the diff names it and compares anyway."""
    results_dir = FIXTURES / "results"
    code, doc = _diff(capsys, results_dir / "profile-glm5-h200.predicted.json",
                      results_dir / "profile-glm5-h200.json")
    assert code == 0
    assert {"name": "measured", "a": "predicted", "b": "measured", "blocking": True} in \
        doc["environment"]


def test_two_snapshots_compare_by_buffer_measured_equals_predicted(tmp_path, capsys):
    """The H200 snapshot against a predicted one at T=1024: at each peak the alloc-path call's
    buffers, named, with the same bytes, so nothing moved; against T=8192 each grows."""
    predicted, larger = tmp_path / "p.pickle", tmp_path / "l.pickle"
    for path, tokens in ((predicted, "1024"), (larger, "8192")):
        assert main(["profile", "--predict", "--tokens", tokens, "--snapshot", str(path)]) == 0
    code, doc = _diff(capsys, SNAPSHOT, predicted)
    [unit] = doc["units"]
    assert code == 0 and doc["kind"] == "snapshot"
    assert unit["a_peak_bytes"] == unit["b_peak_bytes"] == 411829248  # the alloc-path call
    assert [b["name"] for b in unit["buffers"]] == [
        "padded_q", "out", "lse", "scheduler_metadata", "num_splits", "lse_accum", "o_accum"]
    assert all(b["a_bytes"] == b["b_bytes"] for b in unit["buffers"])
    code, doc = _diff(capsys, SNAPSHOT, larger, "--fail-on-growth", "1GiB")
    [unit] = doc["units"]
    assert code == 1 and all(b["change_bytes"] > 0 for b in unit["buffers"]
                             if b["name"] not in ("scheduler_metadata", "num_splits"))
    assert sum(b["b_bytes"] for b in unit["buffers"]) == unit["b_peak_bytes"]


def test_a_profile_against_a_snapshot_is_one_line(paths_profiles, capsys):
    a, _ = paths_profiles
    assert main(["diff", str(a), str(SNAPSHOT)]) == 2
    assert "compare two of one kind" in capsys.readouterr().err


def test_a_growth_limit_with_no_case_paired_is_one_line(paths_profiles, tmp_path):
    """--fail-on-growth over two results that pair no case gates nothing: refused in one line
    (it passed, exit 0, before); without the limit the diff still shows both sides."""
    from mlamem.testing import check_bad_input

    a, _ = paths_profiles
    other = tmp_path / "deepseek.json"
    assert main(["profile", "--predict", "-s", "deepseek-v32-fp8-tp8", "--tokens", "1024",
                 "--format", "json", "--output", str(other)]) == 0
    check_bad_input(["diff", a, other, "--fail-on-growth", "0"], fix="nothing to gate")
    assert main(["diff", str(a), str(other)]) == 0


def test_repro_oom_cases_pair_by_path_with_their_verdicts(tmp_path, capsys):
    """The H200's repro-oom against a predicted run: each path's step peak in both, the
    verdicts in the labels, and the environment that differs named (measured, the GPU)."""
    predicted = tmp_path / "r.json"
    assert main(["repro-oom", "--predict", "--format", "json", "--output", str(predicted)]) == 0
    measured = FIXTURES / "results" / "repro-oom-glm5-h200.json"
    code, doc = _diff(capsys, measured, predicted)
    cases_a = json.loads(measured.read_text())["cases"]
    cases_b = json.loads(predicted.read_text())["cases"]
    assert code == 0 and doc["kind"] == "repro-oom"
    for unit, a, b in zip(doc["units"], cases_a, cases_b, strict=True):
        assert unit["a_label"].endswith(f"{a['path']} {a['verdict']}")
        assert unit["b_label"].endswith(f"{b['path']} {b['verdict']}")
        assert (unit["a_peak_bytes"], unit["b_peak_bytes"]) == (a["step_peak_bytes"],
                                                                b["step_peak_bytes"])
    assert {d["name"] for d in doc["environment"]} >= {"measured", "gpu"}


def test_graphs_captures_pair_by_path_and_t(tmp_path, capsys):
    """Two predicted capture lists: the captures both have pair with equal figures; the one
    only B has is listed with its buffers, their bytes the capture's own."""
    files = {}
    for name, sizes in (("a", "512,8"), ("b", "512,16,8")):
        files[name] = tmp_path / f"{name}.json"
        assert main(["graphs", "--predict", "--capture-sizes", sizes, "--format", "json",
                     "--output", str(files[name])]) == 0
    code, doc = _diff(capsys, files["a"], files["b"])
    assert code == 0 and doc["kind"] == "graphs"
    paired = [u for u in doc["units"] if u["a_label"] and u["b_label"]]
    assert len(paired) == 4 and all(u["peak_change_bytes"] == 0 for u in paired)
    added = {u["unit"]: u for u in doc["units"] if u["a_label"] is None}
    captures = {f"{p['path']} capture T={c['tokens']}": c
                for p in json.loads(files["b"].read_text())["paths"] for c in p["captures"]}
    assert set(added) == {"alloc capture T=16", "workspace capture T=16"}
    for label, unit in added.items():
        assert {b["name"]: b["b_bytes"] for b in unit["buffers"]} == {
            b["name"]: b["requested_bytes"] for b in captures[label]["buffers"]}
