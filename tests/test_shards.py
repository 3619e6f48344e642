"""Sharded sweeps: the round-robin split, the merge back to the unsharded result, gate shards,
and the CI page's GitHub Actions matrix (docs/ci.md) run through scripts/sharded-sweep.sh."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mlamem import operations, render
from mlamem.cli import main
from mlamem.commands import gate
from mlamem.commands.shards import PER_RUN, Shard, interleave, merge, normalised, parse_shard
from mlamem.kernels import load_kernel
from mlamem.results.validate import Comparison, ValidateFile
from mlamem.runtime import environment
from mlamem.spec import scenario as scenarios
from mlamem.spec.errors import UserError
from mlamem.testing import needs_flashmla, no_gpu, split_into_shards

ROOT = Path(__file__).parent.parent
SCRIPT = ROOT / "scripts" / "sharded-sweep.sh"
VALIDATE_H200 = Path(__file__).parent / "fixtures" / "results" / "validate-h200.json"
PROFILE_H200 = VALIDATE_H200.with_name("profile-glm5-h200.json")  # measured, timed
TOKENS = "1024,8192,16384,32768"
SWEPT = ("glm5-fp8-tp8", "deepseek-v32-fp8-tp8")  # the script's scenarios


def _all_shards(count: int) -> list[Shard]:
    return [Shard(i, count) for i in range(1, count + 1)]


@pytest.mark.parametrize("count", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("size", [0, 1, 3, 4, 10])
def test_the_deal_covers_every_unit_once_and_merges_back(size, count):
    """Every unit lands in exactly one shard, in the sweep's order, the same every time; merging
    the shards back gives the sweep's order."""
    units = [f"unit-{k}" for k in range(size)]
    picks = [shard.pick(units) for shard in _all_shards(count)]
    assert sorted(u for pick in picks for u in pick) == sorted(units)
    assert all(pick == [u for u in units if u in pick] for pick in picks)  # order kept
    assert picks == [shard.pick(units) for shard in _all_shards(count)]
    assert interleave(picks) == units


def test_the_deal_is_round_robin():
    """Unit k goes to shard k mod N + 1: 10 units over 3 shards, 4 values over 4."""
    assert [s.pick(list(range(10))) for s in _all_shards(3)] == [[0, 3, 6, 9], [1, 4, 7],
                                                                  [2, 5, 8]]
    assert [s.pick([1024, 8192, 16384, 32768]) for s in _all_shards(4)] == [
        [1024], [8192], [16384], [32768]]
    with pytest.raises(ValueError, match="round-robin"):
        interleave([[0], [1, 3], [2]])  # shard 1 would hold 0 and 3


@pytest.mark.parametrize(("text", "shard"), [("1/1", Shard(1, 1)), ("2/4", Shard(2, 4)),
                                             ("12/12", Shard(12, 12))])
def test_parse_shard(text, shard):
    """I/N with 1 <= I <= N."""
    assert parse_shard(text) == shard and str(shard) == text


@pytest.mark.parametrize("text", ["0/2", "3/2", "a/b", "1/0", "2", "1/2/3", "-1/2", "/4", ""])
def test_parse_shard_refuses(text):
    """Anything else is one line naming the form."""
    with pytest.raises(UserError, match=r"^shard: .* is not a shard; write I/N"):
        parse_shard(text)


@pytest.mark.parametrize(("command", "sweep"), [
    ("mlamem profile --shard 2/4 --predict --output s2.json", "mlamem profile --predict"),
    ("mlamem profile --shard=2/4 --output=s2.json --snapshot s.pickle -s glm5-fp8-tp8",
     "mlamem profile -s glm5-fp8-tp8"),
    ("mlamem validate --tokens 1024 --format json", "mlamem validate --tokens 1024 --format json"),
])
def test_a_shards_command_gives_the_sweeps(command, sweep):
    """--shard and the files a run writes (--output, --snapshot) are dropped, either spelling."""
    from mlamem.commands.shards import sweep_command

    assert sweep_command(command) == sweep


def test_per_run_fields_may_differ_and_the_rest_must_agree():
    """Shards made at other times, with another driver or Python, merge (the latest created,
    shard 1's environment); another torch is another sweep."""
    saved = json.loads(PROFILE_H200.read_text())
    first, second = split_into_shards({**saved, "created": "2026-01-01T00:00:00Z"}, 2)
    second = {**second, "created": "2099-01-01T00:00:00Z",
              "environment": {**second["environment"], "driver": "999.1", "python": "3.99.0"}}
    merged = merge([("a", first), ("b", second)])
    assert merged["created"] == "2099-01-01T00:00:00Z"
    assert merged["environment"] == saved["environment"]
    assert normalised(merged) == normalised({**saved, "created": None, "shard": None})
    second["environment"] = {**second["environment"], "torch": "9.9.9"}
    with pytest.raises(UserError, match="a and b are shards of different sweeps \\(their "
                                        "environment differs\\)"):
        merge([("a", first), ("b", second)])


def test_gate_shards_keep_every_path_of_a_value_together():
    """gate's sweep over several scenarios and operations: each (scenario, op, value) runs in
    exactly one shard with all its paths; shards follow the sweep's order."""
    kernel = load_kernel("flashmla")()
    chosen = [(name, scenarios.load(name)) for name in
              ("glm5-fp8-tp8", "kimi-k2-dense-tp4-dp", "deepseek-v32-fp8-tp8")]
    values = {op: list(operations.operation(op).default_sweep) for op in operations.operation_names()}
    parts = gate.plan_sweep(chosen, list(kernel.operations), values,
                            ["alloc", "workspace"], kernel)
    units = [(p.scenario.name, p.op, v, tuple(p.paths)) for p in parts for v in p.values]
    assert len(units) > 12 and len({u[1] for u in units}) == 3
    per_shard = [[(p.scenario.name, p.op, v, tuple(p.paths))
                  for p in gate.shard_parts(parts, shard) for v in p.values]
                 for shard in _all_shards(5)]
    assert interleave(per_shard) == units


def _profile(tmp_path: Path, name: str, *args: str) -> dict:
    """`mlamem profile --predict ARGS --format json --output NAME`, run here as from a shell
    (the command a result records is the process's)."""
    path = tmp_path / name
    argv = ["profile", "--predict", *args, "--format", "json", "--output", str(path)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", ["mlamem", *argv])
        assert main(argv) == 0
    return json.loads(path.read_text())


def test_profile_shards_merge_to_the_unsharded_profile(tmp_path, capsys):
    """Three paths (the Triton kernel), four T over three shards: each T's paths in one shard,
    with outputs_equal and removed_by_workspace as unsharded; the merge equals the unsharded
    profile in every figure and key order, differing only in the PER_RUN fields."""
    args = ["--kernel", "triton", "--tokens", "8192,1024,32768,16384"]
    whole = _profile(tmp_path, "whole.json", *args)
    parts = [_profile(tmp_path, f"s{i}.json", *args, "--shard", f"{i}/3") for i in (1, 2, 3)]
    for part in parts:
        paths = {}
        for row in part["rows"]:
            paths.setdefault(row["tokens"], []).append(row["path"])
        assert all(p == ["alloc", "workspace", "workspace-full"] for p in paths.values())
    assert [[r["tokens"] for r in p["rows"][::3]] for p in parts] == [[8192, 16384], [1024],
                                                                      [32768]]
    merged = merge([(f"s{i}.json", p) for i, p in ((3, parts[2]), (1, parts[0]), (2, parts[1]))])
    assert merged["shard"] is None and whole["shard"] is None
    assert merged["command"] == ("mlamem profile --predict --kernel triton --tokens "
                                 "8192,1024,32768,16384 --format json")  # --output dropped
    assert normalised(merged) == normalised(whole) and list(merged) == list(whole)
    differing = {k for k in whole if whole[k] != merged[k]}
    assert differing <= {f.partition(".")[0].partition("[")[0] for f in PER_RUN}


def test_an_empty_shard_writes_a_valid_result_that_merges(tmp_path, capsys):
    """More shards than units: the empty shards say so, write no rows, and merge."""
    parts = [_profile(tmp_path, f"s{i}.json", "--tokens", "1024,8192", "--shard", f"{i}/4")
             for i in (1, 2, 3, 4)]
    err = capsys.readouterr().err
    assert err.count("holds none of this sweep's 2 unit(s)") == 2
    assert [len(p["rows"]) for p in parts] == [2, 2, 0, 0]
    merged = merge([(f"s{i}", p) for i, p in enumerate(parts, 1)])
    whole = _profile(tmp_path, "whole.json", "--tokens", "1024,8192")
    assert normalised(merged) == normalised(whole)
    assert main(["profile", "--predict", "--tokens", "1024", "--shard", "2/2", "--format",
                 "markdown"]) == 0
    assert "No T in shard 2/2 of this sweep." in capsys.readouterr().out


def _validate_json(comparisons: list[Comparison], command: str, shard: str | None) -> dict:
    return json.loads(render.validation_json(
        comparisons, command, environment=environment.capture(), created=environment.now_utc(),
        shard=shard))


def test_validate_shards_merge_to_the_unsharded_validation():
    """The committed H200 validation (3 scenarios x 5 T x 2 paths, measured and predicted),
    dealt into 4 shards as `validate --shard I/4` runs them: the merge equals the whole, and
    a shard that disagrees makes the merge disagree."""
    saved = json.loads(VALIDATE_H200.read_text())
    comparisons = ValidateFile.parse(saved).comparisons
    whole = _validate_json(comparisons, saved["command"], None)
    parts = split_into_shards(whole, 4)
    assert [len({(c["scenario"], c["tokens"]) for c in p["comparisons"]}) for p in parts] == [
        4, 4, 4, 3]  # 15 units over 4 shards
    merged = merge([(f"validate-{i}.json", p) for i, p in enumerate(reversed(parts))])
    assert merged == {**whole, "command": "mlamem validate --tokens 1024,4096,8192,16384,32768 "
                                          "--format json"}
    parts[2]["comparisons"][0] = {**parts[2]["comparisons"][0], "measured": 1, "difference": 1}
    parts[2]["agrees"] = False
    assert merge([(f"validate-{i}.json", p) for i, p in enumerate(parts)])["agrees"] is False


@needs_flashmla
def test_validate_shards_on_the_gpu_merge_to_the_unsharded_validation(tmp_path, capsys):
    """On the GPU: `validate --shard I/2` over two scenarios merges to the unsharded run."""
    args = ["validate", "-s", "glm5-fp8-tp8,deepseek-v32-fp8-tp8", "--tokens", "1024,8192",
            "--format", "json", "--output"]
    for name, shard in (("whole", []), ("s1", ["--shard", "1/2"]), ("s2", ["--shard", "2/2"])):
        code = main([*args, str(tmp_path / f"{name}.json"), *shard])
        output = tmp_path / f"{name}.json"
        if code != 0:  # what disagreed, not the whole document (pytest would cut it short)
            differing = output.exists() and [c for c in json.loads(output.read_text())[
                "comparisons"] if c["difference"] != 0]
            pytest.fail(f"{name}: exit {code}: {capsys.readouterr().err[-3000:]}\n{differing}")
    documents = [(name, json.loads((tmp_path / name).read_text()))
                 for name in ("s1.json", "s2.json")]
    whole = json.loads((tmp_path / "whole.json").read_text())
    assert normalised(merge(documents)) == normalised(whole)


@pytest.fixture(scope="module")
def small_baseline(tmp_path_factory) -> Path:
    """A predicted baseline of GLM-5 at T = s_q = 1024 and 8192, with the sparse decode's alloc
    peak at T=8192 set 1 MiB lower, so that case (unit 1 of 4: shard 2 of 2) has grown."""
    path = tmp_path_factory.mktemp("shards") / "glm5.json"
    assert main(["gate", "--predict", "--baseline", str(path), "--update", "--scenario",
                 "glm5-fp8-tp8", "--tokens", "1024,8192"]) == 0
    data = json.loads(path.read_text())
    [case] = [c for c in data["cases"] if (c["op"], c["tokens"], c["path"]) ==
              ("sparse-decode", 8192, "alloc")]
    case["peak_allocated_bytes"] -= 1024**2
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(("shard", "code", "cases"), [
    (None, 1, 8), ("1/2", 0, 4), ("2/2", 1, 4), ("4/5", 0, 2), ("5/5", 0, 0)])
def test_a_gate_shard_exits_by_its_own_cases(small_baseline, capsys, shard, code, cases):
    """The grown case fails the whole sweep and the shard holding it, no other shard; an
    empty shard passes, saying why."""
    args = ["gate", "--predict", "--baseline", str(small_baseline)]
    assert main([*args, *(["--shard", shard] if shard else [])]) == code
    out = capsys.readouterr().out
    assert f"over {cases} cases" in out
    assert ("| regressed | glm5-fp8-tp8 | 8192 | alloc | peak allocated |" in out) == (code == 1)
    if shard:
        assert f"shard {shard} of the sweep" in out
    if shard == "5/5":
        assert "Shard 5/5 holds no case of this sweep" in out


def _mlamem_lines(text: str) -> list[str]:
    """The mlamem commands of a script or a workflow's `run:` steps, in order."""
    return re.findall(r"^\s*(?:- run: )?(mlamem .*?)\s*$", text, re.M)


@no_gpu
def test_the_docs_matrix_runs_through_the_script(tmp_path):
    """scripts/sharded-sweep.sh holds the CI page's matrix's mlamem lines, runs them (every gate
    shard passes against the committed predicted baseline), and each merged profile equals the
    unsharded `mlamem profile --predict` in every figure; the report merges the shards too."""
    ci_page = (ROOT / "docs" / "ci.md").read_text()
    [matrix] = [block for block in re.findall(r"```yaml\n(.*?)```", ci_page, re.S)
                if "matrix:" in block and "--shard" in block]
    script = SCRIPT.read_text()
    assert _mlamem_lines(matrix.replace("${{ matrix.shard }}", "$shard")) == _mlamem_lines(script)
    out = tmp_path / "sweep"
    run = subprocess.run(["bash", str(SCRIPT), str(out)], capture_output=True, text=True,
                         env={**os.environ, "PATH": f"{Path(sys.executable).parent}:"
                                                   f"{os.environ['PATH']}"})
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count("### mlamem gate: passed") == 4
    report = (out / "report.md").read_text()
    for scenario in SWEPT:
        merged = json.loads((out / f"profile-{scenario}.json").read_text())
        whole = _profile(tmp_path, f"{scenario}.json", "--scenario", scenario, "--tokens", TOKENS)
        assert normalised(merged) == normalised(whole)
        assert len(merged["rows"]) == 8
        shards = " + ".join(f"profile-{scenario}-shard-{i}.json" for i in (1, 2, 3, 4))
        assert f"From `{shards}`." in report
    assert "| 32768 | 12.273 GiB | 10.023 GiB | 2.250 GiB | n/a |" in report
