"""`mlamem explain`: a snapshot's peak, what was live at it, and the MLA calls found in it, on
the H200 fixture and on snapshots mlamem writes in predicted runs."""

import json
from pathlib import Path

from mlamem import results
from mlamem.cli import main

FIXTURE = Path(__file__).parent / "fixtures" / "glm5-t1024-h200.snapshot.pickle"


def _explain(capsys, *args) -> dict:
    capsys.readouterr()
    assert main(["explain", *map(str, args), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    results.read(doc, "mlamem.explain/1")  # the file its schema documents
    return doc


def _profile(tmp_path, tokens: str, capsys) -> tuple[Path, dict]:
    """A predicted profile of both paths at `tokens`, with its snapshot."""
    shot, rows = tmp_path / f"t{tokens}.pickle", tmp_path / f"t{tokens}.json"
    assert main(["profile", "--predict", "--tokens", tokens, "--snapshot", str(shot),
                 "--format", "json", "--output", str(rows)]) == 0
    capsys.readouterr()
    return shot, json.loads(rows.read_text())


def test_the_h200_snapshot_holds_the_t1024_call_at_its_peak(capsys):
    """The fixture (`mlamem profile --tokens 1024 --snapshot`, sgl-flash-mla on the H200) holds
    an alloc-path call and a workspace-path call at T=1024; with the scenario the T is fixed,
    and the alloc call is the peak: padded_q + the kernel's buffers, all live."""
    doc = _explain(capsys, FIXTURE, "--scenario", "glm5-fp8-tp8")
    alloc, workspace = doc["calls"]
    assert [(c["path"], c["implied"], c["ambiguous"]) for c in doc["calls"]] == [
        ("alloc", [{"tokens": 1024, "heads": 64}], False),
        ("workspace", [{"tokens": 1024, "heads": 64}], False)]
    assert [b["name"] for b in alloc["buffers"]] == [
        "padded_q", "out", "lse", "scheduler_metadata", "num_splits", "lse_accum", "o_accum"]
    assert "flashmla" in alloc["kernels"] and workspace["kernels"] == ["flashmla"]
    assert doc["peak_bytes"] == alloc["live_at_peak_bytes"] == sum(
        b["bytes"] for b in doc["by_frame"]) == sum(s["live_bytes"] for s in doc["by_segment"])
    assert {b["frame"] for b in alloc["buffers"]} == {
        "mlamem/paths.py:64 alloc_path",
        "flash_mla/flash_mla_interface.py:254 flash_mla_with_kvcache"}
    saving = alloc["saving"]
    padded_q = alloc["buffers"][0]["requested_bytes"]
    assert saving["removed_buffers"] == ["padded_q"]
    assert saving["saving_bytes"] == saving["saving_at_peak_bytes"] == padded_q
    assert "--tokens 1024 --paths alloc,workspace" in saving["command"]


def test_without_a_scenario_the_heads_are_ambiguous(capsys):
    """Bytes fix only T x heads: T=1024 at 64 heads allocates what T=512 at 128 does."""
    doc = _explain(capsys, FIXTURE)
    assert all(c["ambiguous"] for c in doc["calls"])
    assert doc["calls"][0]["implied"] == [{"tokens": 512, "heads": 128},
                                          {"tokens": 1024, "heads": 64}]
    assert doc["calls"][0]["saving"]["tokens"] == 1024  # the default scenario's 64 heads


def test_a_predicted_snapshot_at_two_t_gives_each_t_and_the_profiles_saving(tmp_path, capsys):
    """A predicted run at T=4096 and 8192 writes four calls; each is found with its T, and the
    saving equals the profile's alloc - workspace peak at that T."""
    shot, profile = _profile(tmp_path, "4096,8192", capsys)
    doc = _explain(capsys, shot, "--scenario", "glm5-fp8-tp8")
    found = [(c["path"], c["implied"][0]["tokens"]) for c in doc["calls"]]
    assert found == [("alloc", 4096), ("workspace", 4096), ("alloc", 8192), ("workspace", 8192)]
    peaks = {(r["tokens"], r["path"]): r["peak_allocated_bytes"] for r in profile["rows"]}
    for call in doc["calls"]:
        t = call["implied"][0]["tokens"]
        assert call["saving"]["saving_bytes"] == peaks[(t, "alloc")] - peaks[(t, "workspace")]
        row = next(r for r in profile["rows"] if (r["tokens"], r["path"]) == (t, call["path"]))
        assert [b["requested_bytes"] for b in call["buffers"]] == [
            b["requested_bytes"] for b in row["buffers"]]


def test_the_markdown_and_table_name_the_calls(capsys):
    """Markdown for an issue: the peak, the frames, the calls with the command to reproduce."""
    assert main(["explain", str(FIXTURE), "--format", "markdown"]) == 0
    text = capsys.readouterr().out
    assert "### mlamem explain" in text and "T=1024 at 64 heads" in text
    assert "`mlamem profile --scenario glm5-fp8-tp8 --tokens 1024" in text
    assert main(["explain", str(FIXTURE), "-s", "glm5-fp8-tp8"]) == 0
    assert "72.000 MiB per call (padded_q)" in " ".join(capsys.readouterr().out.split())


def test_without_a_trace_the_peak_is_what_the_segments_hold(tmp_path, capsys):
    """A snapshot of segments only (a trace not recorded) gives the blocks they hold."""
    import pickle

    data = pickle.loads(FIXTURE.read_bytes())
    data["device_traces"] = [[]]
    path = tmp_path / "segments.pickle"
    path.write_bytes(pickle.dumps(data))
    doc = _explain(capsys, path)
    held = sum(b["size"] for s in data["segments"] for b in s["blocks"]
               if b["state"].startswith("active"))
    assert doc["peak_source"] == "segments" and doc["peak_bytes"] == held
    assert doc["calls"] == []


def test_a_t_above_the_workspace_and_one_below_the_sm_count_are_found(tmp_path, capsys):
    """T=50000 (above max_num_batched_tokens, found by bisection) and T=100 (below the 132 SMs,
    where the split count depends on T): each found, the first reproduced with a workspace
    wide enough for it."""
    shot = tmp_path / "s.pickle"
    assert main(["profile", "--predict", "--tokens", "50000,100", "--paths", "alloc",
                 "--snapshot", str(shot)]) == 0
    doc = _explain(capsys, shot, "-s", "glm5-fp8-tp8")
    assert [c["implied"] for c in doc["calls"]] == [[{"tokens": 50000, "heads": 64}],
                                                    [{"tokens": 100, "heads": 64}]]
    assert doc["calls"][0]["saving"]["command"].endswith("--max-num-batched-tokens 50000")
