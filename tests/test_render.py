"""What a person reads: every terminal table within 80 columns, bytes with units, CSV cells as
JSON, PREDICTED wherever the figures are, the budget rule of plan and repro-oom, and --help at
80 columns."""

from __future__ import annotations

import csv
import io
import json
import re
from collections import Counter
from pathlib import Path

import pytest

from mlamem import render
from mlamem.cli import app, main
from mlamem.commands.repro import read_result
from mlamem.render.common import WIDTH, console_text, count_text, signed_bytes
from mlamem.results.models import ProfileFile
from mlamem.results.models import ProfileRow as ProfileRowModel
from mlamem.results.plan import PlanFile
from mlamem.results.repro import ReproFile
from mlamem.results.validate import Comparison, ValidateFile

FIXTURES = Path(__file__).parent / "fixtures" / "results"
PREDICTED = {"measured": False, "not_measured_reason": "no GPU here"}


def _load(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def _profile(name: str = "profile-glm5-h200.json") -> ProfileFile:
    return ProfileFile.parse(_load(name))


def _repro(name: str, **changes) -> ReproFile:
    return read_result({**_load(name), **changes})


def _predicted_repro(name: str) -> ReproFile:
    """A saved measured result relabelled as predicted: the renderers read only `measured`."""
    data = _load(name)
    return _repro(name, **PREDICTED, cases=[{**c, "measured": False} for c in data["cases"]])


def _workspace_full(result: ProfileFile) -> ProfileFile:
    """The widest rows a profile has: the longest path name and every buffer staged."""
    rows = [r.model_copy(update={"path": "workspace-full",
                                 "staged": ["padded_q", "out", "lse", "accum_workspace"]})
            if r.path == "workspace" else r for r in result.rows]
    return result.model_copy(update={"rows": rows})


def _comparisons() -> list[Comparison]:
    return ValidateFile.parse(_load("validate-h200.json")).comparisons


def _plan(*args: str) -> PlanFile:
    from mlamem.commands import plan
    from mlamem.spec import scenario

    name = args[0] if args else "glm5-fp8-tp8"
    sweep = args[1] if len(args) > 1 else None
    return plan.run_plan(scenario.load(name), {}, sweep, command="mlamem plan")


TABLES = {
    "profile": lambda: render.table(_profile()),
    "profile, predicted": lambda: render.table(_profile("profile-glm5-h200.predicted.json")),
    "profile, workspace-full": lambda: render.table(_workspace_full(_profile())),
    "profile --breakdown": lambda: render.breakdown_table(_profile()),
    "repro-oom": lambda: render.repro_table(_repro("repro-oom-glm5-h200.json")),
    "repro-oom, context reuse": lambda: render.repro_table(
        _repro("repro-oom-context-reuse-h200.json")),
    "plan": lambda: render.plan_table(_plan()),
    "plan, context reuse": lambda: render.plan_table(_plan("kimi-k2-context-reuse")),
    "plan --sweep": lambda: render.plan_table(
        _plan("glm5-fp8-tp8", "max-seq-len=32768,131072,786432")),
    "plan --sweep gpu-memory": lambda: render.plan_table(
        _plan("kimi-k2-context-reuse", "gpu-memory=141GB,160GB,192GB")),
}


@pytest.mark.parametrize("name", list(TABLES))
def test_terminal_table_fits_80_columns(name):
    """Nothing is cut or wider than 80 columns, and no byte count is a raw 10-digit number."""
    text = console_text(TABLES[name]())
    assert max(len(line) for line in text.splitlines()) <= WIDTH, text
    assert "…" not in text, text
    shown = "\n".join(line for line in text.splitlines() if not line.startswith("Command:"))
    assert not re.search(r"\d{10}", shown), shown


NUMBER = re.compile(r"\d+(?:\.\d+)?")
NARROW_VIEWS = {**TABLES, "validate": lambda: render.validation_view(_comparisons(), "mlamem validate")}


@pytest.mark.parametrize("width", [20, 40, 60, 80])
@pytest.mark.parametrize("name", list(NARROW_VIEWS))
def test_a_narrow_width_never_cuts_a_digit(name, width):
    """At any width every figure the wide table shows is shown whole (a table too wide becomes
    one record per line), and no line is wider than the width."""
    wide, narrow = (console_text(NARROW_VIEWS[name](), width=w) for w in (400, width))
    assert not Counter(NUMBER.findall(wide)) - Counter(NUMBER.findall(narrow)), narrow
    assert max(len(line) for line in narrow.splitlines()) <= width, narrow
    assert "…" not in narrow


def test_a_table_too_wide_becomes_one_record_per_line():
    """fits() is whether every cell is drawn whole; records() is one 'header: value' line per row,
    empty cells left out, under the title."""
    from rich.table import Table

    from mlamem.render.common import fits, fitted, records

    table = Table(title="peaks")
    for header in ("", "T", "peak\nalloc", "saved"):
        table.add_column(header, no_wrap=True)
    table.add_row("a", "1024", "0.384", "")
    table.add_row("b", "8192", "3.068", "0.070")
    assert fits(table, 80) and not fits(table, 12)
    assert str(records(table)) == ("peaks\na; T: 1024; peak alloc: 0.384\n"
                                   "b; T: 8192; peak alloc: 3.068; saved: 0.070")
    assert fitted(table, 80) is table
    assert "0.384" in console_text(table, width=12) and "3.068" in console_text(table, width=12)


def test_validate_table_fits_80_columns_with_differences():
    """validate's table stays within 80 columns; figures that differ are listed in bytes."""
    comparisons = _comparisons()
    first = comparisons[0]
    comparisons[0] = first.model_copy(update={"measured": first.measured + 512,
                                              "difference": first.difference + 512})
    text = render.validation_table(comparisons, "mlamem validate")
    assert max(len(line) for line in text.splitlines()) <= WIDTH, text
    assert "…" not in text and "3.068 GiB" in text
    assert "+512 B" in text and "DIFFERS: deepseek-v32-fp8-tp8 T=1024 alloc total allocated" in text


def test_sweep_cells_are_readable():
    """L_cap beyond 10 million tokens is abbreviated, and the abbreviation is explained."""
    text = console_text(TABLES["plan --sweep"]())
    assert "4.29G" in text and "25.8G" in text and "M, G, T: 10^6, 10^9, 10^12 tokens" in text
    assert re.search(r"786432 +25\.8G +476949 ", text), text  # k: 788 B x 78 layers


def test_count_and_difference_cells():
    """Counts keep every digit below 10 million; differences are 0 or signed with units."""
    assert [count_text(n) for n in (581281, 9_999_999, 12_345_678, 4_294_967_296,
                                    999_999_999_999, None)] == [
        "581281", "9999999", "12.3M", "4.29G", "1.00T", "-"]
    assert [signed_bytes(n) for n in (0, 512, -3 * 2**20, None)] == [
        "0", "+512 B", "-3.000 MiB", "n/a"]


def test_csv_cells_are_plain_values():
    """Every CSV cell is a plain value: empty for null, true/false, text unquoted, lists joined
    by ';', buffers as name=requested_bytes; no JSON, no reprs."""
    result = _profile("profile-glm5-h200.predicted.json")
    text = render.to_csv(result)
    assert "None" not in text and "True" not in text and "'" not in text and '""' not in text
    rows = list(csv.DictReader(io.StringIO(text)))
    assert rows[0]["path"] == "alloc" and rows[1]["staged"] == "padded_q"
    assert rows[0]["wall_time_ms"] == "" and rows[0]["measured"] == "false"
    assert rows[0]["buffers"] == ";".join(f"{b.name}={b.requested_bytes}"
                                          for b in result.rows[0].buffers)
    assert rows[0]["buffers"].startswith("padded_q=") and rows[0]["tokens"] == "1024"
    assert list(rows[0]) == [name for name in ProfileRowModel.model_fields]


@pytest.mark.parametrize("name", ["profile, predicted", "profile --breakdown, predicted",
                                  "repro-oom, predicted", "context reuse, predicted"])
def test_predicted_output_never_says_measured(name):
    """A predicted run says PREDICTED in the title and never calls a figure measured."""
    profile = _profile("profile-glm5-h200.predicted.json")
    views = {
        "profile, predicted": [console_text(render.table(profile)), render.markdown(profile)],
        "profile --breakdown, predicted": [console_text(render.breakdown_table(profile)),
                                           render.breakdown_markdown(profile)],
        "repro-oom, predicted": [render.REPRO_FORMATS[f](_predicted_repro(
            "repro-oom-glm5-h200.json")) for f in ("table", "markdown")],
        "context reuse, predicted": [render.REPRO_FORMATS[f](_predicted_repro(
            "repro-oom-context-reuse-h200.json")) for f in ("table", "markdown")],
    }[name]
    for text in views:
        assert "(PREDICTED)" in text.splitlines()[0] + text.splitlines()[1], text
        flat = " ".join(text.split())
        assert not re.search(r"(?<!not )measured", flat.replace("measured on", "")), flat
    if "breakdown" in name:
        assert "add up to the predicted peak" in " ".join(views[0].split())


def test_measured_breakdown_says_measured():
    """A measured breakdown says the buffers add up to the measured peak, with units."""
    text = " ".join(console_text(render.breakdown_table(_profile())).split())
    assert "add up to the measured peak, 12.273 GiB" in text


def test_repro_states_its_budget_rule():
    """repro-oom says which rule sized the KV cache: vLLM's for decode, TRT-LLM's fraction of
    what weights and profiling leave for context reuse, with figures that add up."""
    decode = " ".join(console_text(render.repro_table(_repro("repro-oom-glm5-h200.json"))).split())
    assert "KV cache rule (vLLM's): utilization 0.85 x total - (init + profile peak + non-torch)" \
        in decode
    context = _repro("repro-oom-context-reuse-h200.json")
    for text in (console_text(render.repro_table(context)), render.repro_markdown(context)):
        flat = " ".join(text.split())
        assert ("KV budget rule (TRT-LLM's): free_gpu_memory_fraction x (total - non-torch - "
                "weights - profile peak) = 0.9 x (139.289 GiB - 100.000 GiB - 617.000 MiB) = "
                "34.817 GiB") in flat, flat
        assert "`mlamem plan` charges neither the profile peak nor non-torch memory" in flat


def test_plan_states_its_budget_rule():
    """plan says its budget rule, and for a context-reuse scenario how repro-oom's differs."""
    kimi = _plan("kimi-k2-context-reuse")
    rows = dict(render.plan_rows(kimi.plans[0], kimi.scenario))
    assert rows["KV budget"] == ("25.820 GiB = utilization 0.9 x total 139.800 GiB - weights "
                                 "100.000 GiB (vLLM's rule; no profile peak, no non-torch memory)")
    assert "profile peak" in rows["repro-oom's KV budget"]
    glm = _plan()
    assert "repro-oom's KV budget" not in dict(render.plan_rows(glm.plans[0], glm.scenario))
    from mlamem.commands import plan
    from mlamem.spec import scenario

    trt = plan.run_plan(scenario.load("kimi-k2-context-reuse"), {"free_fraction": 0.9}, None,
                        command="mlamem plan")
    assert "TRT-LLM's rule" in dict(render.plan_rows(trt.plans[0], trt.scenario))[
        "KV budget"]


COMMANDS = sorted(c.name or c.callback.__name__.replace("_", "-") for c in app.registered_commands)


@pytest.mark.parametrize("command", COMMANDS)
def test_help_reads_at_80_columns(command, capsys, monkeypatch):
    """`COLUMNS=80 mlamem COMMAND --help`: no line over 80 columns, every option named whole."""
    import typer

    monkeypatch.setenv("COLUMNS", "80")
    assert main([command, "--help"]) == 0
    text = capsys.readouterr().out
    assert max(len(line) for line in text.splitlines()) <= WIDTH, text
    assert "…" not in text
    click_command = typer.main.get_command(app).commands[command]
    for param in click_command.params:
        for option in [*param.opts, *param.secondary_opts]:
            if option.startswith("-"):
                assert re.search(rf"(^|[\s,/]){re.escape(option)}([\s,=]|$)", text, re.M), (
                    option, text)


def test_repro_header_names_the_scenario_gpu_only_for_its_memory():
    """With --gpu-memory the target line says the size came from the flag, not the GPU."""
    result = _repro("repro-oom-glm5-h200.json")
    default = " ".join(render.repro_markdown(result).split())
    assert "target: 79.647 GiB (H100 SXM 80GB memory) at utilization 0.85" in default
    budget = _load("repro-oom-glm5-h200.json")["budget"]
    override = _repro("repro-oom-glm5-h200.json", command="mlamem repro-oom --gpu-memory 70GiB",
                      budget={**budget, "gpu_memory_bytes": 70 * 2**30,
                              "scenario_gpu_memory_bytes": 81559 * 2**20})
    text = " ".join(render.repro_markdown(override).split())
    assert "target: 70.000 GiB (--gpu-memory; the scenario's GPU is H100 SXM 80GB)" in text


def test_oom_without_a_size_is_explained_under_the_table():
    """An OOM whose failed request is unknown (e.g. in init) is spelled out below the table."""
    cases = _load("repro-oom-glm5-h200.json")["cases"]
    case = {**cases[0], "phase": "init", "oom_requested_bytes": None, "oom_buffer": None,
            "free_bytes_at_oom": None, "kv_cache_bytes": None}
    text = " ".join(console_text(render.repro_table(
        _repro("repro-oom-glm5-h200.json", cases=[case, *cases[1:]]))).split())
    assert "alloc: OOM in init: an unattributed allocation" in text


def test_per_process_nvml_peaks_are_a_labelled_note_beside_the_device_wide_column():
    """A saved H200 run predates the per-process figure: it reads as null and adds no note; a
    row that has one is listed under the table, labelled this process's, the NVML column kept."""
    saved = _profile()
    assert {row.nvml_process_peak_bytes for row in saved.rows} == {None}
    before = " ".join(console_text(render.table(saved)).split())
    assert "this process" not in before
    first = saved.rows[0]
    rows = [first.model_copy(update={"nvml_process_peak_bytes": first.peak_reserved_bytes + 2**30}),
            *saved.rows[1:]]
    text = " ".join(console_text(render.table(saved.model_copy(update={"rows": rows}))).split())
    assert (f"NVML, this process (peak, absolute, GiB): T={first.tokens} {first.path} "
            f"{first.peak_reserved_bytes / 2**30 + 1:.3f}") in text
    assert text.startswith(before)  # the table and its notes as they were, the line after them


@pytest.mark.parametrize(("args", "columns"), [(["kernels"], 60), (["kernels"], 30),
                                               (["scenarios"], 30), (["scenarios"], 60)])
def test_listings_keep_to_columns(monkeypatch, capsys, args, columns):
    """`kernels` and `scenarios` wrap each entry within COLUMNS (20 and over); only a word wider
    than the line (a file name, a pip requirement) may overflow it, alone on its line."""
    from mlamem.cli import main

    monkeypatch.setenv("COLUMNS", str(columns))
    assert main(args) == 0
    long = [line for line in capsys.readouterr().out.splitlines()
            if len(line) > columns and len(line.split()) > 1]
    assert not long


@pytest.mark.parametrize("columns", ["4", "20"])
def test_a_narrow_table_cuts_no_number(monkeypatch, capsys, columns):
    """Below 20 columns a table is drawn at 20 (its records), where no number is cut: 0.384
    stays whole."""
    from mlamem.cli import main

    monkeypatch.setenv("COLUMNS", columns)
    assert main(["profile", "--predict", "--tokens", "1024", "--paths", "alloc"]) == 0
    out = capsys.readouterr().out
    assert "0.384;" in out.split() and max(map(len, out.splitlines())) == 20
