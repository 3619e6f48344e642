"""`mlamem report`: a PR-ready Markdown report with plots, from saved H200 results."""

import json
from pathlib import Path

import matplotlib.image
import pytest

from mlamem.cli import main
from mlamem.results.shared import Environment

FIXTURES = Path(__file__).parent / "fixtures"
RESULTS = FIXTURES / "results"  # copies of reports/*-h200 results
REPORTS = FIXTURES / "reports"  # copies of part of reports/, in the same layout
PROFILE = RESULTS / "profile-glm5-h200.json"
PREDICTED = RESULTS / "profile-glm5-h200.predicted.json"
REPRO = RESULTS / "repro-oom-glm5-h200.json"
VALIDATE = RESULTS / "validate-h200.json"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _render(folder: Path, *inputs: Path) -> Path:
    folder.mkdir()
    output = folder / "report.md"
    assert main(["report", *map(str, inputs), "--output", str(output)]) == 0
    return output


def test_report_reproduces_the_prs_table_and_verdicts(tmp_path):
    """The H200 report has the PR's table, the breakdown, the verdicts, the environment."""
    text = _render(tmp_path / "a", PROFILE, REPRO, VALIDATE).read_text()
    assert "| T | before (allocating path) | after (workspace path) | saved | outputs equal |" in text
    for line in ("| 1024 | 0.384 GiB | 0.313 GiB | 0.070 GiB | yes |",
                 "| 8192 | 3.068 GiB | 2.506 GiB | 0.562 GiB | yes |",
                 "| 16384 | 6.137 GiB | 5.012 GiB | 1.125 GiB | yes |",
                 "| 32768 | 12.273 GiB | 10.023 GiB | 2.250 GiB | yes |"):
        assert line in text
    assert text.count("#### T=") == 8  # the per-buffer breakdown at each (T, path)
    assert "| o_accum | kernel | 8589934592 | 8.000 GiB | yes | kept |" in text
    assert "OOM in step: o_accum (8.000 GiB, by kernel) with 7.665 GiB free" in text
    assert "headroom 1.914 GiB" in text
    assert "30 cases (scenario, T, path), 440 figures" in text and "every figure equal" in text
    assert ("| NVIDIA H200 (SM 9.0) | 580.159.04 | 13.0 | 2.11.0+cu130 | flashmla 1.0.0 | 0.1.0 |"
            in text)
    assert "`mlamem profile --format json --output /tmp/o2/glm5-fp8-tp8.json`" in text
    assert "PREDICTED" not in text  # all measured


def test_report_plots_are_valid_pngs_referenced_from_the_markdown(tmp_path):
    """Each plot is a valid PNG next to the Markdown, referenced from it."""
    output = _render(tmp_path / "a", PROFILE, REPRO)
    text = output.read_text()
    names = sorted(p.name for p in output.parent.glob("*.png"))
    assert names == ["report-profile-glm5-fp8-tp8-buffers.png",
                     "report-profile-glm5-fp8-tp8-peak.png",
                     "report-repro-oom-glm5-fp8-tp8-budget.png"]
    for name in names:
        assert f"]({name})" in text
        data = (output.parent / name).read_bytes()
        assert data.startswith(PNG_SIGNATURE)
        image = matplotlib.image.imread(output.parent / name)
        assert image.shape[0] > 400 and image.shape[1] > 800  # legible size
        assert b"Software" not in data and b"matplotlib" not in data


def test_names_from_files_are_drawn_as_text_in_every_plot(tmp_path):
    """A scenario name, kernel label and GPU holding `$...$` (matplotlib's mathtext, where an
    unknown command would not draw) and an ESC: every plot draws them as plain text."""
    hostile = "glm5 $\\foo{$ \x1b[31m"
    inputs = []
    for source in (PROFILE, REPRO):
        doc = json.loads(source.read_text())
        doc["scenario"]["name"] = hostile
        doc["kernel"]["label"] = f"FlashMLA {hostile}"
        doc["environment"]["gpu"] = f"H200 {hostile}"
        inputs.append(tmp_path / source.name)
        inputs[-1].write_text(json.dumps(doc))
    output = _render(tmp_path / "a", *inputs)
    assert len(list(output.parent.glob("*.png"))) == 3


def test_two_renders_are_byte_identical(tmp_path):
    """The same inputs give the same Markdown and the same PNG bytes."""
    first = _render(tmp_path / "a", PROFILE, PREDICTED, REPRO, VALIDATE)
    second = _render(tmp_path / "b", PROFILE, PREDICTED, REPRO, VALIDATE)
    files = sorted(p.name for p in first.parent.iterdir())
    assert files == sorted(p.name for p in second.parent.iterdir()) and len(files) == 6
    for name in files:
        assert (first.parent / name).read_bytes() == (second.parent / name).read_bytes(), name


def test_predicted_results_are_labelled_on_every_table(tmp_path):
    """Every table heading and plot of a predicted result says PREDICTED."""
    output = _render(tmp_path / "a", PREDICTED)
    text = output.read_text()
    headings = [line for line in text.splitlines() if line.startswith(("## ", "### ", "#### "))]
    tables = [h for h in headings if h.startswith(("### ", "#### "))]
    assert len(tables) == 10 and all(h.endswith("(PREDICTED)") for h in tables)
    assert "**PREDICTED**" in text
    assert sorted(p.name for p in output.parent.glob("*.png")) == [
        "report-profile-glm5-fp8-tp8-predicted-buffers.png",
        "report-profile-glm5-fp8-tp8-predicted-peak.png"]


def test_report_to_stdout_has_no_plots(tmp_path, capsys, monkeypatch):
    """Without --output the Markdown goes to stdout and no file is written."""
    monkeypatch.chdir(tmp_path)
    assert main(["report", str(PROFILE)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# mlamem report") and "![" not in out
    assert list(tmp_path.iterdir()) == []


def test_profile_report_runs_and_reports_in_one_step(tmp_path):
    """`profile --report DIR` writes the result JSON, report.md and the plots."""
    folder = tmp_path / "run"
    assert main(["profile", "--tokens", "1024,8192", "--predict", "--format", "json",
                 "--output", str(tmp_path / "out.json"), "--report", str(folder)]) == 0
    assert sorted(p.name for p in folder.iterdir()) == [
        "glm5-fp8-tp8.predicted.json", "report-profile-glm5-fp8-tp8-predicted-buffers.png",
        "report-profile-glm5-fp8-tp8-predicted-peak.png", "report.md"]
    saved = json.loads((folder / "glm5-fp8-tp8.predicted.json").read_text())
    assert saved["schema"] == "mlamem.profile/1" and saved["created"].endswith("Z")
    text = (folder / "report.md").read_text()
    assert "| 8192 | 3.068 GiB | 2.506 GiB | 0.562 GiB | n/a |" in text
    assert saved["created"] in text  # the date comes from the result
    # The saved JSON renders to the same report again (only the path to it differs).
    again = tmp_path / "again" / "report.md"
    again.parent.mkdir()
    assert main(["report", str(folder / "glm5-fp8-tp8.predicted.json"), "--output",
                 str(again)]) == 0
    assert again.read_text() == text.replace("`glm5-fp8-tp8.predicted.json`",
                                             "`../run/glm5-fp8-tp8.predicted.json`")
    assert (again.parent / "report-profile-glm5-fp8-tp8-predicted-peak.png").read_bytes() == (
        folder / "report-profile-glm5-fp8-tp8-predicted-peak.png").read_bytes()


def test_committed_h200_report_is_what_the_tool_makes():
    """reports/report-h200/report.md is the tool's render of the committed H200 results (their
    copies in tests/fixtures/reports, which .ci/run checks equal reports/)."""
    from mlamem.render import report

    committed = REPORTS / "report-h200" / "report.md"
    inputs = [committed.parent.parent / p for p in (
        "report-h200/profile-glm5-fp8-tp8.json", "profile-h200/deepseek-v32-fp8-tp8.json",
        "profile-h200/kimi-k2-fp8-tp4-dp.json", "repro-oom-h200/glm5-fp8-tp8.json",
        "context-reuse-h200/kimi-k2-context-reuse.json", "triton-h200/triton-profile.json",
        "validate-h200/validate-h200.json")]
    saved = [report.load(p, report.shown_path(p, committed)) for p in inputs]
    built = report.build(saved, figure_prefix="report")
    assert committed.read_text() == built.markdown
    for data in built.figures.values():  # the bytes may vary by matplotlib version
        assert data.startswith(PNG_SIGNATURE)


def test_validation_json_with_environment_reads_back(tmp_path):
    """A validate result saved now records its environment and date, and the report shows them."""
    from mlamem import render
    from mlamem.commands.validate import comparison
    from mlamem.render.report import load
    from mlamem.runtime import environment

    comparisons = [comparison("glm5-fp8-tp8", 1024, "alloc", "total", metric, 5, 5,
                              "sparse-decode") for metric in ("allocated", "reserved")]
    env = environment.capture()
    path = tmp_path / "v.json"
    path.write_text(render.validation_json(comparisons, "mlamem validate", environment=env,
                                           created="2026-12-02T10:00:00Z"))
    saved = load(path)
    assert saved.result.environment == env and saved.result.created == "2026-12-02T10:00:00Z"
    assert main(["report", str(path), "--output", str(tmp_path / "r.md")]) == 0
    text = (tmp_path / "r.md").read_text()
    assert "2026-12-02T10:00:00Z" in text and "1 case (scenario, T, path), 2 figures" in text


def test_environment_records_every_registered_kernel_and_reads_old_files(monkeypatch):
    """capture() records each registered kernel's version in registry order (None where its
    adapter fails); files from before `kernels` read their flash_mla and triton fields into it."""
    from mlamem.kernels import REGISTRY, KernelEntry, kernel_names
    from mlamem.render.report import load
    from mlamem.runtime import environment

    monkeypatch.setitem(REGISTRY, "missing", KernelEntry("mlamem.no_such_module", "X", "gone"))
    env = environment.capture()
    assert list(env.kernels) == kernel_names() and env.kernels["missing"] is None
    saved = json.loads(json.dumps(env.model_dump()))
    assert Environment(**saved) == env
    assert load(PROFILE).result.environment.kernels == {"flashmla": "1.0.0"}
    triton = load(REPORTS / "triton-h200" / "triton-profile.json").result.environment
    assert triton.kernels == {"flashmla": "1.0.0", "triton": "3.6.0"}
    old = json.loads(PROFILE.read_text())["environment"]
    assert environment.kernel_versions({**old, "triton": None}) == {
        "flashmla": "1.0.0", "triton": None}
    with pytest.raises(ValueError, match="flash_mla '1.0.0' contradicts kernels.flashmla"):
        environment.kernel_versions({**old, "kernels": {"flashmla": "0.9.0"}})
    with pytest.raises(ValueError, match="unknown"):
        Environment(**{**saved, "unknown": 1})


def test_a_compare_result_gets_its_section_and_verdict(capsys):
    """A saved `mlamem compare` (the H200's two FlashMLA builds) is a report section: its table
    and, in the summary, whether out and lse were bit-identical and by how much they differ."""
    source = REPORTS / "kernels-h200" / "compare-sparse-decode.json"
    assert main(["report", str(source)]) == 0
    text = capsys.readouterr().out
    assert ("- compare sparse-decode flashmla vs flashmla-vllm, glm5-fp8-tp8: out bit-identical, "
            "lse by up to 9.54e-07") in text
    assert "## compare: glm5-fp8-tp8, flashmla vs flashmla-vllm, sparse-decode" in text
    assert "| 32768 | workspace | lse differs (max 9.54e-07) |" in text


@pytest.mark.parametrize("twice", [["{f}", "{f}"], ["{f}", "{d}/../results/{name}"]])
def test_a_result_given_twice_is_one_line(twice):
    """`report a.json a.json` (or the same file by two names) would print its sections twice:
    refused in one line, before anything is read; `merge` of a shard given twice alike."""
    from mlamem.testing import check_bad_input

    saved = RESULTS / "repro-oom-glm5-h200.json"
    args = [a.format(f=saved, d=saved.parent, name=saved.name) for a in twice]
    check_bad_input(["report", *args], fix="is given twice; give each result file once")
    check_bad_input(["merge", *args], fix="is given twice; give each shard file once")
