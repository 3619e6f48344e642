"""Hostile files and paths (the four principles of trust at the edges), one parametrised test
per principle, each case through `mlamem.testing.check_bad_input`: exit 2, one line naming the
file or field, no traceback, nothing written in or outside the folder named.

1. every file read is a regular file within a size bound, UTF-8 TOML or finite JSON;
2. every path written is a regular file, and names from files become file names safely;
3. text from an input file stays inside its Markdown code span;
4. a baseline is validated before it gates.
"""

import json
import pickle
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlamem import render
from mlamem.spec.errors import UserError
from mlamem.spec.files import CONTROL_CHARACTERS, safe_name
from mlamem.testing import check_bad_input, scenario_file

ROOT = Path(__file__).parent
PROFILE = ROOT / "fixtures" / "results" / "profile-glm5-h200.json"
SNAPSHOT = ROOT / "fixtures" / "glm5-t1024-h200.snapshot.pickle"
BASELINE = ROOT.parent / "reports" / "baselines" / "predicted.json"
PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe"


def _write(folder: Path, name: str, data: bytes | str) -> str:
    path = folder / name
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return str(path)


def _profile_text(edit) -> str:
    data = json.loads(PROFILE.read_text())
    edit(data)
    return json.dumps(data)


SCENARIO_CASES = [
    pytest.param(lambda f: _write(f, "s.toml", PNG), "not UTF-8 text", id="png"),
    pytest.param(lambda f: _write(f, "s.toml", bytes(range(256))), "not UTF-8 text", id="random-bytes"),
    pytest.param(lambda f: str(scenario_file(f, edits={"gpu_memory_utilization = 0.85":
                                                       "gpu_memory_utilization = nan"})),
                 "[gpu].gpu_memory_utilization must be a finite number, got nan", id="nan"),
    pytest.param(lambda f: str(scenario_file(f, edits={"gpu_memory_utilization = 0.85":
                                                       "gpu_memory_utilization = inf"})),
                 "[gpu].gpu_memory_utilization must be a finite number, got inf", id="inf"),
    pytest.param(lambda f: str(f), "is a folder", id="folder"),
    pytest.param(lambda f: "/dev/zero", "not a regular file", id="device"),
]

RESULT_CASES = [
    pytest.param(lambda f: _write(f, "r.json", PNG), "not UTF-8 text", id="png"),
    pytest.param(lambda f: "/dev/zero", "not a regular file", id="device"),
    pytest.param(lambda f: _write(f, "r.json", '{"schema": NaN}'), "NaN is not a number", id="nan"),
    pytest.param(lambda f: _write(f, "r.json", "[" * 100000), "not valid JSON", id="deep"),
    pytest.param(lambda f: str(f), "is a folder", id="folder"),
]


def _baseline(edit):
    def make(folder: Path) -> str:
        data = json.loads(BASELINE.read_text())
        edit(data)
        return _write(folder, "b.json", json.dumps(data))
    return make


def _negative(data):
    data["cases"][0]["peak_allocated_bytes"] = -41182924900


def _duplicate(data):
    data["cases"].append({**data["cases"][0], "peak_reserved_bytes": 1})


def _buffer_negative(data):
    data["cases"][0]["buffers"]["out"] = -1


BASELINE_CASES = [
    pytest.param(_baseline(_negative), "cases[0].peak_allocated_bytes: -41182924900 is negative",
                 id="negative"),
    pytest.param(_baseline(_buffer_negative), "cases[0].buffers.out: -1 is negative", id="negative-buffer"),
    pytest.param(_baseline(_duplicate), "a second copy of", id="duplicate-case"),
    pytest.param(_baseline(lambda d: d.update(environment={})), "environment.gpu: missing",
                 id="empty-environment"),
    pytest.param(_baseline(lambda d: d.pop("environment")), "environment: missing", id="no-environment"),
    pytest.param(lambda f: _write(f, "b.json", '{"schema": "mlamem.baseline/1", "x": Infinity}'),
                 "Infinity is not a number", id="infinity"),
    pytest.param(lambda f: _write(f, "b.json", PNG), "not UTF-8 text", id="png"),
    pytest.param(lambda f: str(f), "is a folder", id="folder"),
]


@pytest.mark.parametrize(("make", "fix"), SCENARIO_CASES)
def test_scenario_file(tmp_path, make, fix):
    check_bad_input(["profile", "--predict", "--tokens", "1024", "--scenario", make(tmp_path)], fix,
                    watch=tmp_path)


@pytest.mark.parametrize(("make", "fix"), RESULT_CASES)
@pytest.mark.parametrize("command", ["report", "merge"])
def test_result_file(tmp_path, command, make, fix):
    args = [command, make(tmp_path)] + (["--output", str(tmp_path / "r.md")] if command == "report" else [])
    check_bad_input(args, fix, watch=tmp_path)


@pytest.mark.parametrize(("make", "fix"), BASELINE_CASES)
def test_baseline_file(tmp_path, make, fix):
    check_bad_input(["gate", "--predict", "--baseline", make(tmp_path)], fix, watch=tmp_path)


@pytest.mark.parametrize(("output", "fix"), [("/dev/stdout", "not a regular file"),
                                           ("/dev/null", "not a regular file"),
                                           ("/dev/zero", "not a regular file")])
@pytest.mark.parametrize("command", ["report", "merge"])
def test_special_output_refused(tmp_path, command, output, fix):
    check_bad_input([command, str(PROFILE), "--output", output], fix, watch=tmp_path)


@pytest.mark.parametrize("args", [["report", str(PROFILE)],
                                  ["plan"], ["profile", "--predict", "--tokens", "1024"]])
def test_output_dash_is_stdout(tmp_path, monkeypatch, capsys, args):
    """`--output -` prints what omitting --output prints, and makes no file named '-'."""
    from mlamem.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(args) == 0
    omitted = capsys.readouterr().out
    assert main([*args, "--output", "-"]) == 0
    assert capsys.readouterr().out == omitted != ""
    assert not (tmp_path / "-").exists()


@pytest.mark.parametrize(("args", "fix"), [
    (["profile", "--predict", "--report", "-"], "'--report': - (stdout) is not a folder"),
    (["profile", "--predict", "--snapshot", "-"], "'--snapshot': - (stdout) cannot take it"),
    (["gate", "--predict", "--baseline", "-"], "'--baseline': - (stdout) cannot take it"),
    (["gate", "--predict", "--baseline", "-", "--update"], "rewritten in place: give a file path"),
])
def test_output_dash_refused_where_not_stdout(tmp_path, args, fix):
    check_bad_input(args, fix, watch=tmp_path)


def test_a_report_folder_under_dev_shm_is_a_folder(tmp_path):
    """--report's folder is judged by its file type, not a /dev prefix: /dev/shm is tmpfs."""
    from mlamem.render.report import check_report_dir

    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm here")
    check_report_dir(shm / f"mlamem-test-{tmp_path.name}")  # not created, not refused
    with pytest.raises(UserError, match="is not a folder"):
        check_report_dir(Path("/dev/null"))  # a device


@pytest.mark.parametrize(("name", "safe"), [("../../etc/x", "_.._etc_x"), ("a/b", "a_b"), ("", "unnamed"),
                                           ("..", "unnamed"), ("glm5-fp8-tp8", "glm5-fp8-tp8"),
                                           ("ü\n#", "___")])
def test_safe_name(name, safe):
    assert safe_name(name) == safe
    assert "/" not in safe_name(name) and not safe_name(name).startswith(".")


def test_report_folder_keeps_a_hostile_name_inside(tmp_path):
    """A scenario whose name holds ../ writes its result inside --report, not beside it."""
    from mlamem.cli import main

    path = scenario_file(tmp_path, edits={'name = "glm5-fp8-tp8"': 'name = "../../escaped"'})
    folder = tmp_path / "report"
    assert main(["profile", "--predict", "--tokens", "1024", "--scenario", str(path),
                 "--report", str(folder)]) == 0
    outside = {p for p in tmp_path.rglob("*") if p.is_file()} - set(folder.rglob("*"))
    assert outside == {path}
    assert (folder / "_.._escaped.predicted.json").is_file()


@pytest.mark.parametrize("text", ["a\n# injected", "x`y", "a | b", "``", "`lead"])
def test_markdown_code_stays_one_span(text):
    span = render.markdown_code(text)
    assert "\n" not in span
    fence = span[: len(span) - len(span.lstrip("`"))]
    assert span.endswith(fence) and fence not in span[len(fence):-len(fence)]
    assert "|" not in span.replace("\\|", "")


def test_report_command_with_newline_injects_no_heading(tmp_path):
    path = _write(tmp_path, "p.json", _profile_text(lambda d: d.update(command="mlamem x\n# pwned")))
    from mlamem.cli import main

    assert main(["report", path, "--output", str(tmp_path / "r.md")]) == 0
    assert not any(line.startswith("# pwned") for line in (tmp_path / "r.md").read_text().splitlines())


@pytest.mark.parametrize("command", [["profile", "--predict", "--tokens", "1024"],
                                     ["graphs", "--predict", "--capture-sizes", "8,1"]])
def test_an_empty_report_folder_is_refused(tmp_path, command):
    """`--report ""` would be the current folder: refused, nothing written."""
    check_bad_input([*command, "--report", ""], "name a folder", watch=tmp_path)


def _full_disk(monkeypatch, free: int) -> None:
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr("mlamem.spec.files.shutil.disk_usage", lambda path: usage(1 << 40, 1 << 40, free))


def test_a_full_disk_is_refused_before_any_work(tmp_path, monkeypatch, capsys):
    """Less free than MIN_FREE_BYTES where the output goes: one line naming the folder and the
    fix, exit 2, before the sweep runs (no progress line), nothing written; enough free is
    taken as before."""
    from mlamem.cli import main
    from mlamem.spec.files import MIN_FREE_BYTES

    output = tmp_path / "p.json"
    _full_disk(monkeypatch, MIN_FREE_BYTES - 1)
    assert main(["profile", "--predict", "--tokens", "1024", "--output", str(output)]) == 2
    err = capsys.readouterr().err
    assert f"{MIN_FREE_BYTES - 1} bytes free" in err and "free some space" in err
    assert "profiling" not in err and not output.exists() and list(tmp_path.iterdir()) == []
    _full_disk(monkeypatch, MIN_FREE_BYTES)
    assert main(["profile", "--predict", "--tokens", "1024", "--output", str(output)]) == 0
    assert output.exists()


HOSTILE = "x\n# HEAD | zq`b\x1b[31mRED\x1b]0;TITLE\x07"  # a heading, a cell break, a span, ESC, OSC


@given(st.text())
def test_escaped_leaves_one_line_without_controls(text):
    """Terminal text loses every control character and line break; Markdown keeps no bare `|`
    or backtick."""
    plain, marked = render.escaped(text), render.escaped(text, markdown=True)
    for out in (plain, marked):
        assert not CONTROL_CHARACTERS.search(out) and len(out.splitlines()) <= 1
    assert "|" not in marked.replace("\\|", "") and "`" not in marked.replace("\\`", "")


def _hostile_profile(data: dict) -> None:
    data["scenario"]["name"] = HOSTILE
    data["notes"].append(HOSTILE)
    data["rows"][0]["buffers"][0]["name"] = HOSTILE


def _hostile_snapshot(folder: Path) -> str:
    data = pickle.loads(SNAPSHOT.read_bytes())
    for event in data["device_traces"][0]:
        for frame in event["frames"]:
            frame["name"], frame["filename"] = HOSTILE, HOSTILE
    return _write(folder, "s.pickle", pickle.dumps(data))


def _clean(text: str, markdown: bool) -> None:
    """No terminal sequence, no line the input file began; in Markdown no bare `|` of its own
    (a cell stays one cell)."""
    assert "\x1b" not in text and "\x07" not in text
    assert not any(line.lstrip().startswith(("# HEAD", "HEAD")) for line in text.splitlines())
    assert not markdown or (re.search(r"(?<!\\)\| zq", text) is None and "\\| zq" in text)


@pytest.mark.parametrize("command", [
    pytest.param(lambda p, s, out: ["report", p, "--output", out], id="report"),
    pytest.param(lambda p, s, out: ["diff", str(PROFILE), p], id="diff-table"),
    pytest.param(lambda p, s, out: ["diff", str(PROFILE), p, "--format", "markdown"],
                 id="diff-markdown"),
    pytest.param(lambda p, s, out: ["diff", str(SNAPSHOT), s], id="diff-snapshots"),
    pytest.param(lambda p, s, out: ["explain", s], id="explain-table"),
    pytest.param(lambda p, s, out: ["explain", s, "--format", "markdown"], id="explain-markdown"),
])
def test_text_from_files_is_escaped_in_every_view(tmp_path, capsys, request, command):
    """A scenario name, a note, a buffer or frame name with a newline, a pipe, a backtick and
    terminal sequences reaches no table, heading or terminal raw."""
    from mlamem.cli import main

    profile = _write(tmp_path, "p.json", _profile_text(_hostile_profile))
    out = tmp_path / "r.md"
    assert main(command(profile, _hostile_snapshot(tmp_path), str(out))) == 0
    captured = capsys.readouterr()
    markdown = "markdown" in request.node.callspec.id or out.exists()
    _clean(captured.err, markdown=False)
    _clean(out.read_text() if out.exists() else captured.out, markdown)


FIXTURES = ROOT / "fixtures" / "reports"
REPRO = FIXTURES / "repro-oom-h200" / "glm5-fp8-tp8.json"
GRAPHS = FIXTURES / "graphs-h200" / "graphs-glm5-flashmla.json"
VALIDATE = FIXTURES / "validate-h200" / "validate-h200.json"
COMPARE = FIXTURES / "kernels-h200" / "compare-sparse-decode.json"
GATE_BASELINE = FIXTURES / "baselines" / "predicted.json"


def _hostile_repro(data: dict) -> None:
    data["scenario"]["name"] = data["scenario"]["weights_note"] = HOSTILE
    data["notes"].append(HOSTILE)
    data["cases"][0]["path"] = data["cases"][-1]["oom_buffer"] = HOSTILE


def _hostile_graphs(data: dict) -> None:
    data["scenario"]["name"] = data["capture_sizes_source"] = HOSTILE
    data["notes"].append(HOSTILE)
    data["paths"][0]["path"] = HOSTILE


def _hostile_validate(data: dict) -> None:
    for comparison in data["comparisons"]:  # each scenario and buffer keeps its own name
        comparison["scenario"] = HOSTILE + comparison["scenario"]
        if comparison["item"] != "total":
            comparison["item"] = HOSTILE + comparison["item"]


def _hostile_compare(data: dict) -> None:
    data["scenario"] = data["kernels"][0]["version"] = HOSTILE
    data["notes"].append(HOSTILE)
    data["rows"][0]["path"] = HOSTILE


def _hostile_baseline(data: dict) -> None:
    data["environment"]["mlamem"] = HOSTILE  # an environment line of the gate's notes
    case = next(c for c in data["cases"] if (c["scenario"], c["op"], c["tokens"], c["path"])
                == ("glm5-fp8-tp8", "sparse-decode", 1024, "alloc"))
    case["buffers"][HOSTILE] = case["buffers"].pop("padded_q")  # gone and new: two rows


def _hostile_copy(folder: Path, fixture: Path, edit) -> str:
    data = json.loads(fixture.read_text())
    edit(data)
    return _write(folder, f"hostile-{fixture.name}", json.dumps(data))


@pytest.mark.filterwarnings("error:Glyph")  # a control character drawn into a figure
@pytest.mark.parametrize(("fixture", "edit", "command", "markdown"), [
    pytest.param(REPRO, _hostile_repro, lambda h, out: ["report", h, "--output", out], True,
                 id="repro-report"),
    pytest.param(REPRO, _hostile_repro, lambda h, out: ["diff", str(REPRO), h], False,
                 id="repro-diff"),
    pytest.param(GRAPHS, _hostile_graphs, lambda h, out: ["report", h, "--output", out], True,
                 id="graphs-report"),
    pytest.param(GRAPHS, _hostile_graphs,
                 lambda h, out: ["diff", str(GRAPHS), h, "--format", "markdown"], True,
                 id="graphs-diff"),
    pytest.param(VALIDATE, _hostile_validate, lambda h, out: ["report", h, "--output", out], True,
                 id="validate-report"),
    pytest.param(COMPARE, _hostile_compare, lambda h, out: ["report", h, "--output", out], True,
                 id="compare-report"),
    pytest.param(GATE_BASELINE, _hostile_baseline,
                 lambda h, out: ["gate", "--predict", "--baseline", h, "--scenario",
                                 "glm5-fp8-tp8", "--tokens", "1024"], True, id="gate-baseline"),
])
def test_text_from_other_results_is_escaped(tmp_path, capsys, fixture, edit, command, markdown):
    """A repro-oom, graphs, validate, compare or baseline file whose names, notes and environment
    hold a newline, a pipe, a backtick and terminal sequences reaches no table or terminal raw."""
    from mlamem.cli import main

    hostile, out = _hostile_copy(tmp_path, fixture, edit), tmp_path / "r.md"
    assert main(command(hostile, str(out))) in (0, 1)  # the gate fails on its new buffer
    captured = capsys.readouterr()
    _clean(captured.err, markdown=False)
    _clean(out.read_text() if out.exists() else captured.out, markdown)


def test_a_refusal_quoting_a_file_is_one_clean_line(tmp_path, monkeypatch):
    """A baseline made with a kernel version holding a newline and terminal sequences: the
    gate's refusal (here FlashMLA 1.0.0 is installed) quotes it in one line, without them."""
    from mlamem.runtime import environment

    monkeypatch.setattr(environment, "installed_kernel_versions", lambda: {"flashmla": "1.0.0"})
    hostile = _hostile_copy(tmp_path, GATE_BASELINE,
                            lambda data: data["environment"]["kernels"].update(flashmla=HOSTILE))
    line = check_bad_input(["gate", "--predict", "--baseline", hostile, "--scenario",
                            "glm5-fp8-tp8", "--tokens", "1024"], "kernels.flashmla: baseline x")
    _clean(line, markdown=False)


def test_a_scenario_name_is_one_printable_line(tmp_path):
    """A TOML whose name holds a newline or ESC is refused where it is read, in one line."""
    for name in ("nl\\n# HEAD | x", "a\\u001b[31mRED"):
        path = scenario_file(tmp_path, edits={'name = "glm5-fp8-tp8"': f'name = "{name}"'})
        check_bad_input(["profile", "--predict", "--tokens", "1024", "--scenario", str(path)],
                        "[top].name")


MARKUP = "x[/bold]y[red"  # rich markup that does not parse: text, never markup


def test_rich_markup_in_a_name_or_path_is_plain_text(tmp_path, capsys):
    """A scenario name and an output path holding rich markup are printed as they are, in the
    table and in stderr's lines, never read as markup (an unmatched tag raised MarkupError)."""
    from mlamem.cli import main

    path = scenario_file(tmp_path, edits={'name = "glm5-fp8-tp8"': f'name = "{MARKUP}"'})
    output = tmp_path / "o[red]x.md"  # read as markup, [red] would vanish from the line
    assert main(["profile", "--predict", "--tokens", "1024", "--scenario", str(path)]) == 0
    assert MARKUP in capsys.readouterr().out
    assert main(["profile", "--predict", "--tokens", "1024", "--output", str(output)]) == 0
    assert output.exists() and f"wrote {output}" in capsys.readouterr().err
