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


def _profile(tmp_path, tokens: str, capsys, *options: str) -> tuple[Path, dict]:
    """A predicted profile of both paths at `tokens` (or `options`' own flags), with its
    snapshot."""
    shot, rows = tmp_path / f"t{tokens}.pickle", tmp_path / f"t{tokens}.json"
    values = list(options) or ["--tokens", tokens]
    assert main(["profile", "--predict", *values, "--snapshot", str(shot),
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


def test_the_h200_snapshot_at_two_held_out_t_gives_each_t_and_the_measured_saving(capsys):
    """`mlamem profile --tokens 2048,6144 --snapshot` on the H200 (reports/explain-h200): four
    calls, each found with its T at 64 heads; each saving equals the alloc - workspace peak of
    the profile measured in the same run, which is the padded q the alloc call allocated."""
    shot = FIXTURE.parent / "glm5-t2048-6144-h200.snapshot.pickle"
    profile = json.loads((FIXTURE.parent / "reports" / "explain-h200" / "profile-snapshot.json")
                         .read_text())
    assert profile["measured"]
    doc = _explain(capsys, shot, "--scenario", "glm5-fp8-tp8")
    assert [(c["path"], c["implied"], c["ambiguous"]) for c in doc["calls"]] == [
        (path, [{"tokens": t, "heads": 64}], False)
        for t in (2048, 6144) for path in ("alloc", "workspace")]
    peaks = {(r["tokens"], r["path"]): r["peak_allocated_bytes"] for r in profile["rows"]}
    for call in doc["calls"]:
        t = call["implied"][0]["tokens"]
        assert call["saving"]["saving_bytes"] == peaks[(t, "alloc")] - peaks[(t, "workspace")]
        if call["path"] == "alloc":
            assert call["buffers"][0]["name"] == "padded_q"
            assert call["buffers"][0]["requested_bytes"] == call["saving"]["saving_bytes"]


def test_the_h200_plain_pytorch_snapshot_names_the_users_frames_and_each_call(capsys, tmp_path):
    """A snapshot plain PyTorch wrote on the H200 (`_record_memory_history()` with its default
    C++ frames, then `_dump_snapshot`) around FlashMLA's alloc path inside a user's `layer`
    with a buffer of its own (tests/test_explain_gpu.py's recording, 2026-12-05): each call is
    found with its T at 64 heads, every live allocation is named by the user's Python frame
    (torch 2.11 writes the caching allocator's C++ frame with an empty file name), and each
    saving equals `mlamem profile`'s for that T."""
    shot = FIXTURE.parent / "plain-pytorch-layer-t2048-6144-h200.snapshot.pickle"
    doc = _explain(capsys, shot, "--scenario", "glm5-fp8-tp8")
    assert [(c["path"], c["implied"]) for c in doc["calls"]] == [
        ("alloc", [{"tokens": t, "heads": 64}]) for t in (2048, 6144)]
    assert [f["frame"] for f in doc["by_frame"]] == [
        "<string>:14 layer", "<string>:12 layer", "<string>:13 layer"]
    _, profile = _profile(tmp_path, "2048,6144", capsys)
    peaks = {(r["tokens"], r["path"]): r["peak_allocated_bytes"] for r in profile["rows"]}
    for call in doc["calls"]:
        t = call["implied"][0]["tokens"]
        assert call["saving"]["saving_bytes"] == peaks[(t, "alloc")] - peaks[(t, "workspace")]


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
    """T=50000 (above max_num_batched_tokens, solved for) and T=100 (below the 132 SMs,
    where the split count depends on T): each found, the first reproduced with a workspace
    wide enough for it."""
    shot = tmp_path / "s.pickle"
    assert main(["profile", "--predict", "--tokens", "50000,100", "--paths", "alloc",
                 "--snapshot", str(shot)]) == 0
    doc = _explain(capsys, shot, "-s", "glm5-fp8-tp8")
    assert [c["implied"] for c in doc["calls"]] == [[{"tokens": 50000, "heads": 64}],
                                                    [{"tokens": 100, "heads": 64}]]
    assert doc["calls"][0]["saving"]["command"].endswith("--max-num-batched-tokens 50000")


def _peaks(profile: dict) -> dict[tuple[int, str], int]:
    return {(r["tokens"], r["path"]): r["peak_allocated_bytes"] for r in profile["rows"]}


def test_a_dense_decode_snapshot_gives_each_call_its_requests_and_context(tmp_path, capsys):
    """A predicted dense decode at b=16 and 64 (4096 context tokens): each of its four calls is
    found as a dense decode with its b, unambiguous at the scenario's heads, its saving the
    profile's alloc - workspace peak and its command the dense decode's. The context is the
    scenario's (a dense decode allocates the same at any context): given the scenario at the
    context the profile ran, it is that one."""
    shot, profile = _profile(tmp_path, "b", capsys, "--op", "dense-decode", "-s",
                             "kimi-k2-dense-tp4-dp", "--requests", "16,64",
                             "--context-len", "4096")
    dense = tmp_path / "dense.toml"  # the scenario at the context the profile ran
    text = (Path(__file__).parents[1] / "scenarios" / "kimi-k2-dense-tp4-dp.toml").read_text()
    assert "decode_context_len = 8192" in text
    dense.write_text(text.replace("decode_context_len = 8192", "decode_context_len = 4096"))
    doc = _explain(capsys, shot, "-s", dense)
    # sgl-flash-mla's dense decode has no q to pad at 64 heads and no out= to stage: both
    # paths allocate alike, and the bytes do not tell them apart
    assert [(c["op"], c["path"]) for c in doc["calls"]] == [
        ("dense-decode", "alloc or workspace")] * 4
    assert [c["implied"] for c in doc["calls"]] == [
        [{"tokens": b, "heads": 64, "requests": b, "context_len": 4096}] for b in (16, 16, 64, 64)]
    assert not any(c["ambiguous"] for c in doc["calls"])
    peaks = _peaks(profile)
    for call, row in zip(doc["calls"], profile["rows"], strict=True):
        b = call["implied"][0]["requests"]
        assert row["kv_tokens"] == 4096
        assert call["saving"]["saving_bytes"] == peaks[(b, "alloc")] - peaks[(b, "workspace")]
        assert f"--op dense-decode --requests {b} " in call["saving"]["command"]
        assert [x["requested_bytes"] for x in call["buffers"]] == [
            x["requested_bytes"] for x in row["buffers"]]


def test_without_a_scenario_a_dense_decode_is_matched_at_its_own_default(tmp_path, capsys):
    """No --scenario: the dense decode, which the default scenario does not drive, is matched
    at its operation's default scenario (the registry's), and its command names it."""
    from mlamem.operations import DENSE_DECODE, operation

    shot, _ = _profile(tmp_path, "b", capsys, "--op", "dense-decode", "--requests", "32")
    doc = _explain(capsys, shot)
    assert {c["op"] for c in doc["calls"]} == {"dense-decode"}
    assert {s["requests"] for c in doc["calls"] for s in c["implied"]} >= {32}
    default = operation(DENSE_DECODE).default_scenario
    assert all(f"--scenario {default} --op dense-decode" in c["saving"]["command"]
               for c in doc["calls"] if c["saving"])


def test_a_sparse_prefill_snapshot_gives_each_call_its_tokens(tmp_path, capsys):
    """A predicted sparse prefill at s_q=1024 and 8192: the alloc calls (padded q first) are
    found with their s_q alone; the workspace calls' bytes also fit vLLM's build at the rank's
    own 8 heads (no q to pad, no out=: either path), so they are ambiguous, the scenario's
    padded heads among them; each saving is the profile's alloc - workspace peak and its
    command the prefill's."""
    shot, profile = _profile(tmp_path, "p", capsys, "--op", "sparse-prefill", "--tokens",
                             "1024,8192")
    doc = _explain(capsys, shot, "-s", "glm5-fp8-tp8")
    assert [(c["op"], c["path"]) for c in doc["calls"]] == [
        ("sparse-prefill", "alloc"), ("sparse-prefill", "alloc or workspace")] * 2
    calls = doc["calls"]
    assert calls[0]["implied"] == [{"tokens": 1024, "heads": 64, "kv_len": 8192}]
    assert calls[2]["implied"] == [{"tokens": 8192, "heads": 64, "kv_len": 8192}]
    assert calls[0]["buffers"][0]["name"] == "padded_q"
    for call, s_q in zip(calls, (1024, 1024, 8192, 8192), strict=True):
        assert {"tokens": s_q, "heads": 64, "kv_len": 8192} in call["implied"]
        assert call["ambiguous"] == (call["path"] != "alloc")
    peaks = _peaks(profile)
    for call, s_q in zip(calls, (1024, 1024, 8192, 8192), strict=True):
        assert call["saving"]["tokens"] == s_q
        assert call["saving"]["saving_bytes"] == peaks[(s_q, "alloc")] - peaks[(s_q, "workspace")]
        assert call["saving"]["removed_buffers"] == ["padded_q"]
        assert f"--op sparse-prefill --tokens {s_q} " in call["saving"]["command"]
    assert main(["explain", str(shot), "-s", "glm5-fp8-tp8", "--format", "markdown"]) == 0
    assert "| sparse-prefill |" in capsys.readouterr().out


def test_a_scenario_looks_for_the_operations_it_drives_only(capsys):
    """The H200 fixture's sparse decode under a dense-decode scenario: no call found, and a note
    says which operations were not looked for."""
    doc = _explain(capsys, FIXTURE, "-s", "kimi-k2-dense-tp4-dp")
    assert doc["calls"] == []
    assert any("does not drive sparse-decode, sparse-prefill" in n for n in doc["notes"])


# No MLA call where the allocations are not a kernel's spec in sizes and order.

def _users_snapshot(tmp_path, sizes: list[int]) -> Path:
    """A snapshot of a user's function that allocates `sizes` (bytes), in order, each kept
    live, through the allocator model (which writes the trace and segments as torch does),
    each allocation's stack the function's own."""
    import pickle

    from mlamem.runtime.allocator import CachingAllocatorModel
    from mlamem.runtime.frames import python_frames

    model = CachingAllocatorModel()
    model.trace = []

    def users_function() -> list:
        tensors = []
        for size in sizes:
            tensors.append(model.malloc(size, python_frames()))
        return tensors

    users_function()
    path = tmp_path / "user.pickle"
    path.write_bytes(pickle.dumps({"segments": model.segments(), "device_traces": [model.trace],
                                   "allocator_settings": {}, "external_annotations": []}))
    return path


def test_plain_4kib_allocations_are_no_mla_call(tmp_path, capsys):
    """2000 allocations of 4 KiB each (a user's loop) fit no kernel's spec in sizes and order:
    two equal buffers (vLLM's sparse prefill on the workspace path: max_logits, lse) are what
    any two allocations of one size are, so no call is claimed, with or without a scenario, and
    the text says none was found."""
    shot = _users_snapshot(tmp_path, [4096] * 2000)
    assert _explain(capsys, shot)["calls"] == []
    assert _explain(capsys, shot, "-s", "glm5-fp8-tp8")["calls"] == []
    assert main(["explain", str(shot), "--format", "markdown"]) == 0
    assert "MLA calls: none found" in capsys.readouterr().out
    assert main(["explain", str(shot)]) == 0
    assert "MLA calls: none found" in " ".join(capsys.readouterr().out.split())


def test_six_4mib_fp32_tensors_are_no_sparse_prefill(tmp_path, capsys):
    """Six fp32 tensors of 1M elements (4 MiB each) of a user's function: no sparse prefill at
    128 heads, nor any other call, and the peak is theirs, by the function's frame."""
    shot = _users_snapshot(tmp_path, [4 << 20] * 6)
    for args in ([], ["-s", "glm5-fp8-tp8"]):
        doc = _explain(capsys, shot, *args)
        assert doc["calls"] == []
        assert doc["peak_bytes"] == 6 * (4 << 20)
        [frame] = doc["by_frame"]
        assert frame["frame"].endswith(" users_function") and frame["allocations"] == 6

