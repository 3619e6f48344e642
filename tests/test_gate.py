"""`mlamem gate`: tolerances, the environment check, the comparison, and the command end to end."""

import json
from pathlib import Path

import pytest

from mlamem import operations, render
from mlamem.cli import main
from mlamem.commands import gate
from mlamem.kernels import kernel_operations, load_kernel
from mlamem.runtime.paths import PATHS
from mlamem.spec import scenario as scenarios
from mlamem.spec.errors import UserError
from mlamem.testing import check_bad_input, no_gpu, one_line_error

# copies of reports/baselines/predicted*.json (.ci/run checks they are equal)
BASELINES = Path(__file__).parent / "fixtures" / "reports" / "baselines"
COMMITTED = BASELINES / "predicted.json"
GLM5_T1024 = ["--scenario", "glm5-fp8-tp8", "--tokens", "1024"]  # sparse decode and prefill
PADDED_Q_T1024 = 1024 * 64 * 576 * 2  # bytes of one padded q at T=1024 (75497472)
MiB = 1024**2


def _case(path="alloc", allocated=1000, reserved=2048, in_call=1000, buffers=None, failure=None):
    return {"scenario": "s", "op": "sparse-decode", "tokens": 8, "path": path,
            "peak_allocated_bytes": allocated, "peak_reserved_bytes": reserved,
            "bytes_allocated_in_call": in_call,
            "buffers": {"out": 1000} if buffers is None else buffers, "failure": failure}


SWEEP = {"scenarios": ["s"], "ops": ["sparse-decode"], "tokens": [8], "paths": ["alloc"],
         "kernel": "flashmla"}


def _baseline(*cases, measured=False, kernels=None, kernel="flashmla", **environment):
    env = {"gpu": None, "compute_capability": None, "sm_count": None, "gpu_memory_bytes": None,
           "driver": None, "cuda": None, "torch": "2.13.0", "mlamem": "0.1.0", "python": "3.12",
           "allocator_conf": None,
           "kernels": {"flashmla": None, "triton": None, **(kernels or {})}, **environment}
    return _read(env, kernel, cases, measured)


def _read(env: dict, kernel: str, cases, measured=False):
    """A baseline as `gate.load` reads its file."""
    return gate._parse({"schema": gate.SCHEMA, "command": "test", "measured": measured,
                        "not_measured_reason": None, "environment": env,
                        "sweep": {**SWEEP, "kernel": kernel}, "cases": list(cases)})


@pytest.mark.parametrize(("text", "expected"), [
    ("0", gate.Tolerance()),
    ("512B", gate.Tolerance(bytes=512)),
    ("1MiB", gate.Tolerance(bytes=MiB)),
    ("1.5 GiB", gate.Tolerance(bytes=3 * 512 * MiB)),
    ("0.5%", gate.Tolerance(fraction=0.005)),
])
def test_parse_tolerance(text, expected):
    """'0', bytes with binary units, and percentages of the baseline figure."""
    assert gate.parse_tolerance(text) == expected


def test_tolerances_per_metric():
    """A bare value applies to every metric; metric=value to that metric only."""
    assert gate.parse_tolerances("0.5%") == dict.fromkeys(gate.METRICS, gate.Tolerance(fraction=0.005))
    assert gate.parse_tolerances("peak_reserved=2MiB,buffer=0") == {
        "peak_reserved": gate.Tolerance(bytes=2 * MiB), "buffer": gate.Tolerance()}


def test_fractional_tolerance_scales_with_the_baseline():
    """0.5% of 1 GiB allows 5368709 bytes; a byte floor applies when it is larger."""
    assert gate.Tolerance(fraction=0.005).allowed_bytes(1024 * MiB) == 5368709
    assert gate.Tolerance(bytes=MiB, fraction=0.005).allowed_bytes(1000) == MiB


def test_growth_beyond_tolerance_regresses_and_within_passes():
    """+24 B with 16 B allowed regresses; with 32 B allowed it is within tolerance."""
    before, after = _baseline(_case()), _baseline(_case(allocated=1024))
    tight = gate.compare(before, after, dict.fromkeys(gate.METRICS, gate.Tolerance(bytes=16)))
    assert not tight.passed
    [change] = tight.regressions
    assert (change.metric, change.difference_bytes, change.allowed_bytes) == ("peak_allocated", 24, 16)
    loose = gate.compare(before, after, dict.fromkeys(gate.METRICS, gate.Tolerance(bytes=32)))
    assert loose.passed and [c.verdict for c in loose.changes] == ["within tolerance"]


def test_new_and_vanished_buffers():
    """A buffer new in this run is growth from 0; a buffer that is gone is an improvement."""
    before = _baseline(_case(buffers={"out": 1000, "padded_q": 500}))
    after = _baseline(_case(buffers={"out": 1000, "o_accum": 64}))
    result = gate.compare(before, after, gate.default_tolerances())
    verdicts = {c.buffer: (c.verdict, c.baseline_bytes, c.current_bytes) for c in result.changes}
    assert verdicts == {"padded_q": ("improved", 500, None), "o_accum": ("regressed", None, 64)}
    assert result.compared_figures == 3 + 3


def test_a_call_that_newly_fails_is_a_regression():
    """An OOM where the baseline had figures fails the gate, naming the failure."""
    failed = _case(allocated=None, reserved=None, in_call=None, buffers={}, failure="out of memory")
    result = gate.compare(_baseline(_case()), _baseline(failed), gate.EXACT)
    [change] = result.changes
    assert change.verdict == "regressed" and change.metric == "failure"
    assert "out of memory" in change.detail


def test_environment_blocks_only_what_makes_figures_incomparable():
    """Measured vs predicted, another version of the sweep's kernel, and (measured) another GPU
    block; torch and the other kernels' versions do not."""
    predicted = _baseline(_case())
    measured_h200 = _baseline(_case(), measured=True, compute_capability="9.0", sm_count=132,
                              gpu="NVIDIA H200", kernels={"flashmla": "1.0.0"})
    measured_b200 = _baseline(_case(), measured=True, compute_capability="10.0", sm_count=148,
                              gpu="NVIDIA B200", kernels={"flashmla": "1.0.0"})
    blocking = {d.name for d in gate.environment_differences(predicted, measured_h200) if d.blocking}
    assert blocking == {"measured", "kernels.flashmla"}
    blocking = {d.name for d in gate.environment_differences(measured_h200, measured_b200)
                if d.blocking}
    assert blocking == {"compute_capability", "sm_count"}
    triton_36, triton_37 = (_baseline(_case(), kernels={"triton": v}) for v in ("3.6.0", "3.7.0"))
    assert gate.environment_differences(triton_36, triton_37) == []  # FlashMLA sweeps ignore it
    triton_36, triton_37 = (_baseline(_case(), kernels={"triton": v}, kernel="triton")
                            for v in ("3.6.0", "3.7.0"))
    assert [(d.name, d.blocking) for d in gate.environment_differences(triton_36, triton_37)] == [
        ("kernels.triton", True)]
    newer_torch = _baseline(_case(), torch="2.14.0")
    differences = gate.environment_differences(predicted, newer_torch)
    assert [(d.name, d.blocking) for d in differences] == [("torch", False)]
    gate.check_comparable(differences, Path("b.json"))  # does not raise
    with pytest.raises(UserError, match=r"compute_capability: baseline 9.0, this run 10.0"):
        gate.check_comparable(gate.environment_differences(measured_h200, measured_b200),
                              Path("b.json"))


def test_environment_of_an_old_baseline_reads_its_kernel_fields():
    """A baseline from before `kernels` has `flash_mla` and `triton`: they compare as
    kernels.flashmla and kernels.triton; a legacy field contradicting `kernels` is refused."""
    old = {"gpu": None, "compute_capability": None, "sm_count": None, "gpu_memory_bytes": None,
           "driver": None, "cuda": None, "torch": "2.13.0", "mlamem": "0.1.0", "python": "3.12",
           "allocator_conf": None, "flash_mla": "1.0.0", "triton": "3.6.0"}
    old_baseline = _read(old, "flashmla", [_case()])
    same = _baseline(_case(), kernels={"flashmla": "1.0.0", "triton": "3.7.0"})
    assert gate.environment_differences(old_baseline, same) == []
    newer = _baseline(_case(), kernels={"flashmla": "1.1.0"})
    assert [(d.name, d.baseline, d.current, d.blocking)
            for d in gate.environment_differences(old_baseline, newer)] == [
        ("kernels.flashmla", "1.0.0", "1.1.0", True)]
    old_baseline = _read(old, "triton", [_case()])
    same = _baseline(_case(), kernels={"flashmla": "1.0.0", "triton": "3.7.0"}, kernel="triton")
    assert [d.name for d in gate.environment_differences(old_baseline, same)] == ["kernels.triton"]
    old["kernels"] = {"flashmla": "0.9.0"}
    with pytest.raises(ValueError, match="flash_mla '1.0.0' contradicts kernels.flashmla"):
        _read(old, "triton", [_case()])


# The command, end to end on the allocator model.

def _gate(*args: str) -> int:
    return main(["gate", "--predict", *args])


@pytest.fixture(scope="module")
def baseline_file(tmp_path_factory):
    """A predicted baseline of GLM-5 at T=1024, both paths, made by `mlamem gate --update`."""
    path = tmp_path_factory.mktemp("baseline") / "glm5.json"
    assert _gate("--baseline", str(path), "--update", *GLM5_T1024) == 0
    return path


def test_update_writes_a_baseline_and_a_rerun_passes(baseline_file, capsys):
    """--update records the cases, environment and sweep (every operation GLM-5 declares, T and
    s_q both 1024); an unchanged rerun exits 0."""
    data = json.loads(baseline_file.read_text())
    assert data["schema"] == "mlamem.baseline/1" and data["measured"] is False
    assert data["sweep"] == {"scenarios": ["glm5-fp8-tp8"], "ops": ["sparse-decode", "sparse-prefill"],
                             "tokens": [1024], "requests": [], "paths": ["alloc", "workspace"],
                             "kernel": "flashmla"}
    assert {"gpu", "compute_capability", "torch", "kernels", "mlamem"} <= set(data["environment"])
    assert [(c["op"], c["path"]) for c in data["cases"]] == [
        ("sparse-decode", "alloc"), ("sparse-decode", "workspace"),
        ("sparse-prefill", "alloc"), ("sparse-prefill", "workspace")]
    alloc = data["cases"][0]
    assert alloc["buffers"]["padded_q"] == PADDED_Q_T1024 and alloc["requests"] is None
    assert [p.name for p in baseline_file.parent.iterdir()] == [baseline_file.name]
    assert _gate("--baseline", str(baseline_file)) == 0
    assert "Every figure equals the baseline." in capsys.readouterr().out


def test_regressed_wrapper_fails_naming_case_buffer_and_bytes(baseline_file, capsys, monkeypatch,
                                                             regressed_alloc_path):
    """An extra padded copy of q fails the gate (exit 1); the diff names T, path, buffer, bytes."""
    monkeypatch.setitem(PATHS, "alloc", regressed_alloc_path)
    assert _gate("--baseline", str(baseline_file)) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out
    assert ("| regressed | glm5-fp8-tp8 | 1024 | alloc | buffer bytes | unattributed | - | "
            f"72.000 MiB | +{PADDED_Q_T1024} B (+72.000 MiB, new) |") in out
    assert (f"| regressed | glm5-fp8-tp8 | 1024 | alloc | peak allocated |  | 392.751 MiB | "
            f"464.751 MiB | +{PADDED_Q_T1024} B") in out
    assert "| workspace |" not in out  # the workspace path is untouched
    assert "**sparse-prefill**: s_q, prefill tokens of one call" in out  # its q is padded too
    assert "| regressed | glm5-fp8-tp8 | 1024 | alloc | peak allocated |  | 136.500 MiB |" in out


def test_tolerance_decides(baseline_file, capsys, monkeypatch, regressed_alloc_path):
    """The same regression passes under 100MiB, and fails under 10% (it is +18%)."""
    monkeypatch.setitem(PATHS, "alloc", regressed_alloc_path)
    assert _gate("--baseline", str(baseline_file), "--tolerance", "100MiB") == 0
    assert "| within tolerance | glm5-fp8-tp8 | 1024 | alloc |" in capsys.readouterr().out
    assert _gate("--baseline", str(baseline_file), "--tolerance", "10%") == 1


def test_improvement_passes_and_says_to_update(tmp_path, monkeypatch, capsys,
                                               regressed_alloc_path):
    """Against a baseline made with the regressed wrapper, today's wrapper passes, suggests --update."""
    path = tmp_path / "old.json"
    with monkeypatch.context() as patch:
        patch.setitem(PATHS, "alloc", regressed_alloc_path)
        assert _gate("--baseline", str(path), "--update", *GLM5_T1024) == 0
    assert PATHS["alloc"] is not regressed_alloc_path
    capsys.readouterr()
    assert _gate("--baseline", str(path)) == 0
    out = capsys.readouterr().out
    assert "passed, 8 figure(s) improved" in out  # 4 figures of each operation
    assert f"| improved | glm5-fp8-tp8 | 1024 | alloc | buffer bytes | unattributed | 72.000 MiB | - | " \
           f"-{PADDED_Q_T1024} B" in out
    assert f"update the baseline with `mlamem gate --baseline {path} --update`" in out


def test_step_summary_is_appended(baseline_file, tmp_path, monkeypatch, capsys):
    """With $GITHUB_STEP_SUMMARY set, the Markdown diff is appended to that file."""
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    assert _gate("--baseline", str(baseline_file)) == 0
    text = summary.read_text()
    assert text.startswith("earlier step\n### mlamem gate: passed")
    assert capsys.readouterr().out in text


def test_other_environment_exits_2_unless_allowed(baseline_file, tmp_path, capsys):
    """A measured baseline against a predicted run exits 2 saying so; --allow-env-change compares."""
    data = json.loads(baseline_file.read_text())
    data.update(measured=True, not_measured_reason=None)
    data["environment"].update(gpu="NVIDIA H200", compute_capability="9.0")
    data["environment"]["kernels"]["flashmla"] = "0.9.0"
    path = tmp_path / "measured.json"
    path.write_text(json.dumps(data))
    assert _gate("--baseline", str(path)) == 2
    line = one_line_error(capsys)
    assert "measured: baseline measured, this run predicted" in line and "--allow-env-change" in line
    assert _gate("--baseline", str(path), "--allow-env-change") == 0
    assert "Environment: measured was measured, is predicted (compared anyway" in (
        capsys.readouterr().out)


def test_predictions_block_only_on_two_known_kernel_versions(baseline_file, tmp_path, monkeypatch,
                                                             capsys):
    """A predicted baseline made without FlashMLA installed (version None) passes where it is
    installed, as CI's baseline on a GPU machine; two known versions that differ still block."""
    from mlamem.runtime import environment

    installed = {"flashmla": "1.0.0"}
    monkeypatch.setattr(environment, "installed_kernel_versions", lambda: dict(installed))
    data = json.loads(baseline_file.read_text())
    data["environment"]["kernels"]["flashmla"] = None  # made where FlashMLA is absent (CI)
    without = tmp_path / "without-flashmla.json"
    without.write_text(json.dumps(data))
    assert _gate("--baseline", str(without)) == 0
    assert "kernels.flashmla" in capsys.readouterr().out  # said, not blocking
    data["environment"]["kernels"]["flashmla"] = "0.9.0"
    path = tmp_path / "older.json"
    path.write_text(json.dumps(data))
    assert _gate("--baseline", str(path)) == 2
    assert "kernels.flashmla: baseline 0.9.0, this run 1.0.0" in one_line_error(capsys)


def test_update_never_leaves_a_broken_file(baseline_file, tmp_path, capsys):
    """A failed --update leaves the old baseline byte for byte; a missing folder is created."""
    before = baseline_file.read_bytes()
    assert _gate("--baseline", str(baseline_file), "--update", "--scenario", "glm6") == 2
    assert baseline_file.read_bytes() == before
    assert sorted(p.name for p in baseline_file.parent.iterdir()) == [baseline_file.name]
    capsys.readouterr()
    assert _gate("--baseline", str(tmp_path / "ci" / "b.json"), "--update",
                 "--scenario", "glm5-fp8-tp8", "--tokens", "1024") == 0
    assert [p.name for p in (tmp_path / "ci").iterdir()] == ["b.json"]


@no_gpu
@pytest.mark.parametrize("name", ["predicted.json", "predicted-flashmla-vllm.json",
                                  "predicted-triton.json", "predicted-triton-native.json",
                                  "predicted-flashinfer.json"])
def test_committed_predicted_baselines_pass(name, capsys):
    """The predicted figures of every shipped scenario, in every operation it declares that the
    baseline's kernel runs, equal the committed baseline's: a bare gate reruns its sweep."""
    baseline = gate.load(BASELINES / name)
    kernel = baseline.sweep.kernel
    if load_kernel(kernel)().version() is not None:  # the baselines were made without it
        pytest.skip(f"kernel {kernel} is installed here; its predicted baseline assumes it is not")
    assert main(["gate", "--baseline", str(BASELINES / name)]) == 0
    out = capsys.readouterr().out
    assert "Every figure equals the baseline." in out and "not in this sweep" not in out
    ops = set(baseline.sweep.ops)
    adapter = load_kernel(kernel)()
    for scenario in scenarios.shipped_names():
        chosen = scenarios.load(scenario)
        declared = {op for op in operations.scenario_operations(chosen)
                    if op not in adapter.operations or operations.reads_cache(adapter, chosen, op)}
        swept = {c.op for c in baseline.cases if c.scenario == scenario}
        assert swept == declared & ops & set(kernel_operations(kernel)), scenario


def test_update_replaces_an_unreadable_baseline_and_lists_what_moved(tmp_path, monkeypatch,
                                                                     capsys, regressed_alloc_path):
    """--update over a corrupt file says so and writes a valid one; over a valid one it lists changes."""
    path = tmp_path / "b.json"
    path.write_text("{truncated")
    with monkeypatch.context() as patch:
        patch.setitem(PATHS, "alloc", regressed_alloc_path)
        assert _gate("--baseline", str(path), "--update", *GLM5_T1024) == 0
    assert "replacing an unreadable baseline" in capsys.readouterr().err
    assert gate.load(path).cases[0].buffers["unattributed"] == PADDED_Q_T1024
    assert _gate("--baseline", str(path), "--update") == 0
    out = capsys.readouterr().out
    assert "Changes from the previous baseline:" in out
    assert "| improved | glm5-fp8-tp8 | 1024 | alloc | buffer bytes | unattributed |" in out
    assert "unattributed" not in gate.load(path).cases[0].buffers


def test_gate_refuses_a_baseline_of_another_kernel(tmp_path, capsys):
    """A baseline records its kernel; gating it with another is an environment change (exit 2)."""
    baseline = tmp_path / "b.json"
    sweep = ["--tokens", "1024", "--scenario", "glm5-fp8-tp8"]
    assert main(["gate", "--predict", "--baseline", str(baseline), "--update", "--kernel",
                 "triton", *sweep]) == 0
    data = json.loads(baseline.read_text())
    assert data["sweep"]["kernel"] == "triton"
    assert data["sweep"]["paths"] == ["alloc", "workspace", "workspace-full"]
    capsys.readouterr()
    assert main(["gate", "--predict", "--baseline", str(baseline)]) == 0  # the baseline's kernel
    assert main(["gate", "--predict", "--baseline", str(baseline), "--kernel", "flashmla",
                 "--paths", "alloc"]) == 2
    assert "kernel: baseline triton, this run flashmla" in capsys.readouterr().err


# Operations: every case is (scenario, op, swept value, path).

def _old_format(data: dict) -> dict:
    """`data` as a baseline from before operations: sparse decode cases without `op`,
    `requests` or `kv_tokens`, a sweep without `ops`, `requests` or `kernel`, and the environment's
    per-kernel fields of that time (`flash_mla`, `triton`) instead of `kernels`."""
    env = {k: v for k, v in data["environment"].items() if k != "kernels"}
    env.update(flash_mla=data["environment"]["kernels"]["flashmla"],
               triton=data["environment"]["kernels"]["triton"])
    sweep = {k: v for k, v in data["sweep"].items() if k not in ("ops", "requests", "kernel")}
    sweep["scenarios"] = list(dict.fromkeys(c["scenario"] for c in data["cases"]
                                            if c["op"] == "sparse-decode"))
    cases = [{k: v for k, v in c.items() if k not in ("op", "requests", "kv_tokens")}
             for c in data["cases"] if c["op"] == "sparse-decode"]
    return {**data, "environment": env, "sweep": sweep, "cases": cases}


@no_gpu
def test_an_old_baseline_without_op_reads_as_sparse_decode_and_passes(tmp_path, capsys):
    """The committed baseline as it was before operations (28 sparse decode cases, no `op`, no
    kernel) loads as sparse decode by flashmla, and a bare gate reruns only its sparse decode
    sweep and passes; --update then adds every other operation its scenarios declare."""
    path = tmp_path / "old.json"
    path.write_text(json.dumps(_old_format(json.loads(COMMITTED.read_text())), indent=2))
    old = gate.load(path)
    assert old.sweep.ops == ["sparse-decode"] and len(old.cases) == 28
    assert old.sweep.kernel == "flashmla"
    assert {c.op for c in old.cases} == {"sparse-decode"} and old.cases[0].kv_tokens is None
    assert main(["gate", "--baseline", str(path)]) == 0
    out = capsys.readouterr().out
    assert "Compared 260 figures over 28 cases" in out and "Every figure equals" in out
    assert "new in this sweep" not in out and "not in this sweep" not in out
    assert main(["gate", "--baseline", str(path), "--update", "--predict"]) == 0
    assert "case(s) are new in this sweep" in capsys.readouterr().out
    updated = gate.load(path)
    assert updated.sweep.ops == ["sparse-decode", "sparse-prefill"]
    assert {(c.scenario, c.op, c.tokens, c.path): c for c in updated.cases
            if c.op == "sparse-decode"}.keys() == {c.key for c in old.cases}


@pytest.fixture(scope="module")
def every_op_file(tmp_path_factory):
    """A predicted baseline of GLM-5 (sparse decode and prefill at 1024) and Kimi-K2 dense
    (dense decode at b=16), made by `mlamem gate --update`."""
    path = tmp_path_factory.mktemp("ops") / "ops.json"
    assert _gate("--baseline", str(path), "--update", "--scenario",
                 "glm5-fp8-tp8,kimi-k2-dense-tp4-dp", "--tokens", "1024", "--requests", "16") == 0
    return path


def test_a_baseline_of_every_operation_round_trips_and_passes(every_op_file, capsys):
    """Dense decode cases carry b as `requests` (= `tokens`) and the context as `kv_tokens`;
    the sweep records its operations and each one's values; load and write give the same
    file; a bare rerun compares all six cases and passes."""
    data = json.loads(every_op_file.read_text())
    assert data["sweep"] == {
        "scenarios": ["glm5-fp8-tp8", "kimi-k2-dense-tp4-dp"],
        "ops": ["sparse-decode", "dense-decode", "sparse-prefill"], "tokens": [1024],
        "requests": [16], "paths": ["alloc", "workspace"], "kernel": "flashmla"}
    assert [(c["scenario"], c["op"], c["tokens"], c["requests"], c["kv_tokens"], c["path"])
            for c in data["cases"]] == [
        ("glm5-fp8-tp8", "sparse-decode", 1024, None, 8192, "alloc"),
        ("glm5-fp8-tp8", "sparse-decode", 1024, None, 8192, "workspace"),
        ("glm5-fp8-tp8", "sparse-prefill", 1024, None, 8192, "alloc"),
        ("glm5-fp8-tp8", "sparse-prefill", 1024, None, 8192, "workspace"),
        ("kimi-k2-dense-tp4-dp", "dense-decode", 16, 16, 8192, "alloc"),
        ("kimi-k2-dense-tp4-dp", "dense-decode", 16, 16, 8192, "workspace")]
    assert render.baseline_json(gate.load(every_op_file)) == every_op_file.read_text()
    capsys.readouterr()
    assert _gate("--baseline", str(every_op_file)) == 0
    out = capsys.readouterr().out
    assert "over 6 cases" in out and "Every figure equals the baseline." in out
    assert _gate("--baseline", str(every_op_file), "--op", "dense-decode") == 0
    assert "4 baseline case(s) were not in this sweep" in capsys.readouterr().out


def test_a_regression_in_one_operation_fails_naming_it_and_its_value(every_op_file, tmp_path,
                                                                     capsys):
    """A dense decode case whose baseline figure is 4 KiB lower fails the gate (exit 1) in a
    dense-decode table whose value column is b; the other operations pass untouched."""
    data = json.loads(every_op_file.read_text())
    [case] = [c for c in data["cases"] if c["op"] == "dense-decode" and c["path"] == "workspace"]
    case["peak_allocated_bytes"] -= 4096
    path = tmp_path / "lower.json"
    path.write_text(json.dumps(data))
    assert _gate("--baseline", str(path)) == 1
    out = capsys.readouterr().out
    assert "FAILED, 1 figure(s) grew" in out
    assert "**dense-decode**: b, requests of one decode step" in out
    assert "| verdict | scenario | b | path | metric |" in out
    assert "| regressed | kimi-k2-dense-tp4-dp | 16 | workspace | peak allocated |" in out
    assert "+4096 B" in out and "sparse-decode" not in out and "sparse-prefill" not in out


def test_an_operation_the_kernel_does_not_run_is_one_line(baseline_file, tmp_path):
    """`gate --kernel triton --op dense-decode`: one line naming what triton runs, exit 2, no
    file written, against a baseline or making one."""
    for args in (["--baseline", str(baseline_file)],
                 ["--baseline", str(tmp_path / "new.json"), "--update"]):
        line = check_bad_input(["gate", "--predict", *args, "--kernel", "triton", "--op",
                                "dense-decode"], "kernel triton does not run dense-decode",
                               watch=tmp_path)
        assert "it runs sparse-decode" in line


@pytest.mark.parametrize(("args", "fix"), [
    pytest.param(["--op", "sparse-prefill", "--requests", "16"], "give --tokens instead",
                 id="requests-for-prefill"),
    pytest.param(["--scenario", "kimi-k2-dense-tp4-dp", "--tokens", "1024"],
                 "--tokens: no operation of this sweep takes it", id="tokens-for-dense"),
    pytest.param(["--scenario", "glm5-fp8-tp8", "--op", "dense-decode"],
                 "scenario glm5-fp8-tp8 does not drive dense-decode", id="op-not-declared"),
    pytest.param(["--scenario", "kimi-k2-dense-tp4-dp", "--requests", "512"],
                 "512 requests exceed kimi-k2-dense-tp4-dp's max_batch_size=256",
                 id="requests-over-batch"),
])
def test_bad_operation_input_is_one_line(tmp_path, args, fix):
    """An operation's values on the wrong flag, or one its scenario does not drive: exit 2."""
    check_bad_input(["gate", "--predict", "--baseline", str(tmp_path / "b.json"), "--update",
                     *args], fix, watch=tmp_path)


def test_gate_runs_vllms_flashmla_build(tmp_path, capsys):
    """--kernel flashmla-vllm predicts (from its assumed schema without vLLM) and a bare rerun
    uses the kernel the baseline recorded."""
    path = tmp_path / "vllm.json"
    assert _gate("--baseline", str(path), "--update", "--kernel", "flashmla-vllm",
                 "--scenario", "kimi-k2-dense-fp8-tp4-dp", "--requests", "64") == 0
    data = json.loads(path.read_text())
    assert data["sweep"]["kernel"] == "flashmla-vllm" and data["sweep"]["ops"] == ["dense-decode"]
    assert "flashmla-vllm" in data["environment"]["kernels"]
    capsys.readouterr()
    assert _gate("--baseline", str(path)) == 0
    assert "Every figure equals the baseline." in capsys.readouterr().out


@pytest.mark.parametrize("field", ["paths", "scenarios"])
def test_a_baseline_sweep_listing_nothing_is_refused(field, tmp_path):
    """A baseline whose sweep lists no paths (or no scenarios) was rerun over every path: an
    empty list is refused in one line naming the field, not read as all."""
    data = json.loads(COMMITTED.read_text())
    data["sweep"] = {"scenarios": ["glm5-fp8-tp8"], "ops": ["sparse-decode"], "tokens": [1024],
                     "paths": ["alloc"], "kernel": "flashmla", field: []}
    (tmp_path / "b.json").write_text(json.dumps(data))
    check_bad_input(["gate", "--predict", "--baseline", str(tmp_path / "b.json")], field)
