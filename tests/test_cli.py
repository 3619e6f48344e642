"""The command line: predicted output without a GPU, every output form, and bad input."""

import io
import json
import os
import re
import subprocess
import sys
from collections import Counter

import pandas as pd
import pytest

from mlamem.cli import app, main
from mlamem.kernels import REGISTRY
from mlamem.testing import no_gpu


@no_gpu
def test_profile_without_gpu_prints_predicted_table(capsys):
    """`mlamem profile --tokens 32768` exits 0 with figures labelled PREDICTED."""
    assert main(["profile", "--tokens", "32768"]) == 0
    captured = capsys.readouterr()
    assert "PREDICTED" in captured.out and "12.273" in captured.out
    assert "not measured" in captured.err


@no_gpu
def test_json_schema(capsys):
    """JSON rows carry the documented keys and measured: false, plus an environment block."""
    assert main(["profile", "--tokens", "1024,8192", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["schema"] == "mlamem.profile/1" and data["measured"] is False
    assert {"gpu", "driver", "torch", "kernels", "mlamem"} <= set(data["environment"])
    assert list(data["environment"]["kernels"]) == list(REGISTRY)
    assert len(data["rows"]) == 4
    for row in data["rows"]:
        assert {"scenario", "tokens", "path", "peak_allocated_bytes", "peak_reserved_bytes",
                "nvml_peak_bytes", "outputs_equal", "measured"} <= set(row)
        assert row["measured"] is False


@no_gpu
def test_markdown_has_the_prs_columns(capsys):
    """Markdown gives T, before, after, saved, outputs equal, and says it is predicted."""
    assert main(["profile", "--tokens", "1024", "--format", "markdown"]) == 0
    text = capsys.readouterr().out
    assert "| T | before (allocating path) | after (workspace path) | saved | outputs equal |" in text
    assert "| 1024 | 0.384 GiB | 0.313 GiB | 0.070 GiB | n/a |" in text
    assert "PREDICTED" in text and "out not staged" in text


def test_csv_and_output_file(tmp_path):
    """--output writes the whole file; CSV reads back with one row per (T, path), plain cells."""
    target = tmp_path / "rows.csv"
    assert main(["profile", "--tokens", "1024", "--format", "csv", "--output", str(target),
                 "--predict"]) == 0
    frame = pd.read_csv(io.StringIO(target.read_text()), dtype=str, keep_default_na=False)
    assert list(frame["path"]) == ["alloc", "workspace"]
    assert list(frame["staged"]) == ["", "padded_q"]
    assert [p.name for p in tmp_path.iterdir()] == ["rows.csv"]


def test_scenarios_lists_one_line_each(capsys):
    """`mlamem scenarios` prints each shipped scenario on one line."""
    assert main(["scenarios"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split()[0] for line in lines] == [
        "deepseek-v32-fp8-tp8", "glm5-fp8-tp8", "kimi-k2-context-reuse",
        "kimi-k2-dense-fp8-tp4-dp", "kimi-k2-dense-tp4-dp", "kimi-k2-fp8-tp4-dp"]


def test_python_dash_m_runs_as_a_real_process(tmp_path):
    """`python -m mlamem --help` works in a fresh interpreter (run outside the checkout, whose
    bare mlamem/ would come first on sys.path)."""
    done = subprocess.run([sys.executable, "-m", "mlamem", "profile", "--help"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0 and "--tokens" in done.stdout


def test_cli_kernel_option(capsys):
    """--kernel triton predicts all three paths by default; workspace-full with FlashMLA and an
    unknown kernel are one-line errors, exit 2, the latter listing the choices."""
    assert main(["profile", "--kernel", "triton", "--tokens", "1024", "--predict",
                 "--format", "json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["kernel"]["name"] == "triton" and result["kernel"]["label"] == "Triton"
    assert [r["path"] for r in result["rows"]] == ["alloc", "workspace", "workspace-full"]
    assert main(["profile", "--paths", "workspace-full", "--predict"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "use kernel triton" in err
    assert main(["profile", "--kernel", "cuda-magic"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "'flashmla', 'flashmla-vllm', 'triton', 'triton-native', 'reference'" in err


def test_markdown_names_the_kernel_and_every_path(capsys):
    """The report says which kernel it profiled and has one column per path."""
    assert main(["profile", "--kernel", "triton", "--tokens", "1024", "--predict",
                 "--format", "markdown"]) == 0
    text = capsys.readouterr().out
    assert "Triton allocation spec" in text
    assert "| T | alloc path | workspace path | workspace-full path | outputs equal |" in text
    assert "| 1024 | 0.384 GiB | 0.251 GiB | 0.000 GiB | n/a |" in text


START_CHECK = ("import sys; from mlamem.cli import main; from mlamem.kernels import REGISTRY; "
               "code = main(sys.argv[1:]); heavy = ['torch', 'pandas', 'matplotlib', "
               "*(entry.module for entry in REGISTRY.values())]; "
               "print(code, sorted(m for m in heavy if m in sys.modules))")


@pytest.mark.parametrize("args", [["--help"], ["profile", "--help"], ["gate", "--help"],
                                  ["scenarios"], ["plan", "-s", "kimi-k2-context-reuse"]])
def test_fast_start_imports_no_torch_pandas_matplotlib_or_adapter(args):
    """--help, scenarios and a context-reuse plan load none of torch, pandas, matplotlib or a
    kernel adapter: the --kernel choices and help come from the registry alone."""
    done = subprocess.run([sys.executable, "-P", "-c", START_CHECK, *args], capture_output=True,
                          text=True, timeout=120)
    assert done.stdout.splitlines()[-1] == "0 []", done.stderr


def test_piped_progress_is_one_line_per_case(capsys):
    """With stderr not a terminal, progress is one plain line per case, after the checks."""
    assert main(["profile", "--predict", "--tokens", "1024,8192", "--format", "json"]) == 0
    err = capsys.readouterr().err.splitlines()
    progress = [line for line in err if line.startswith("mlamem: profiling ")]
    assert [line.split("] ")[0] for line in progress] == [
        f"mlamem: profiling glm5-fp8-tp8 [{i}/4" for i in range(1, 5)]
    assert progress[0].endswith("glm5-fp8-tp8: T=1024 alloc ok")


def test_version_names_mlamem_torch_and_the_kernel_libraries_importing_none():
    """`mlamem --version`: mlamem's version, then torch's and each kernel library's (or 'not
    installed'), read from their metadata: not even torch is imported."""
    import importlib.metadata

    from mlamem.version import __version__

    code = ("import sys; from mlamem.cli import main; code = main(['--version']); "
            "print(code, sorted(m for m in ('torch', 'flash_mla', 'vllm', 'flashinfer') "
            "if m in sys.modules))")
    done = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True,
                          timeout=120)
    *lines, imported = done.stdout.splitlines()
    assert imported == "0 []", done.stderr
    assert lines[:2] == [f"mlamem {__version__}", f"torch {importlib.metadata.version('torch')}"]
    assert [line.split()[0] for line in lines[2:]] == ["sgl-flash-mla", "vllm", "flashinfer"]
    for line in lines[2:]:
        name, _, version = line.partition(" ")
        distribution = {"flashinfer": "flashinfer-python"}.get(name, name)
        try:
            assert version == importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            assert version == "not installed"


HELP_COMMANDS = [[], *([c.name or c.callback.__name__.replace("_", "-")]
                       for c in app.registered_commands)]


@pytest.mark.parametrize("command", HELP_COMMANDS, ids=lambda c: c[0] if c else "mlamem")
def test_h_is_help_everywhere(command, capsys):
    """-h prints what --help prints, for the app and every command."""
    assert main([*command, "--help"]) == 0
    expected = capsys.readouterr().out
    assert main([*command, "-h"]) == 0
    assert capsys.readouterr().out == expected and "Usage: mlamem" in expected


NUMBER = re.compile(r"\d+(?:\.\d+)?")


@pytest.mark.parametrize("columns", ["0", "20", "45", "abc", "200"])
def test_columns_never_cut_a_digit(columns, capsys, monkeypatch):
    """COLUMNS is honoured (0 or a word: as if unset, 80): every figure of the 80-column table
    is printed whole, within the width (a table too wide is one record per line)."""
    args = ["profile", "--predict", "--tokens", "1024,8192"]
    monkeypatch.setenv("COLUMNS", "80")
    assert main(args) == 0
    reference = capsys.readouterr().out
    monkeypatch.setenv("COLUMNS", columns)
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.strip() and "0.384" in out and "3.068" in out
    assert not Counter(NUMBER.findall(reference)) - Counter(NUMBER.findall(out)), out
    width = int(columns) if columns.isdigit() and int(columns) else 80
    assert max(map(len, out.splitlines())) <= width, out
    if width < 60:  # the table needs more: one record per line, each naming its columns
        assert "T: 8192; path: alloc; peak alloc: 3.068" in " ".join(out.split())


@pytest.mark.parametrize("command", [["plan"], ["kernels"], ["profile", "--breakdown",
                                                            "--tokens", "1024"]])
def test_every_table_follows_columns(command, capsys, monkeypatch):
    """plan, kernels and the breakdown follow COLUMNS too, keeping every figure whole."""
    monkeypatch.setenv("COLUMNS", "200")
    assert main([*command, *(["--predict"] if command[0] == "profile" else [])]) == 0
    wide = capsys.readouterr().out
    monkeypatch.setenv("COLUMNS", "30")
    assert main([*command, *(["--predict"] if command[0] == "profile" else [])]) == 0
    narrow = capsys.readouterr().out
    assert narrow != wide
    assert not Counter(NUMBER.findall(wide)) - Counter(NUMBER.findall(narrow)), narrow


@pytest.mark.parametrize("columns", ["200", "60", "30"])
def test_scenarios_follow_columns(columns, capsys, monkeypatch):
    """`mlamem scenarios` wraps each summary within COLUMNS, beside the name or under it (there
    also after a hyphen of a name), never cutting a figure; without COLUMNS, piped, each
    scenario is one line (for grep)."""
    monkeypatch.delenv("COLUMNS", raising=False)
    assert main(["scenarios"]) == 0
    piped = capsys.readouterr().out.splitlines()
    assert len(piped) == 6 and all(line.split()[0].endswith(("tp8", "dp", "reuse")) for line in piped)
    monkeypatch.setenv("COLUMNS", columns)
    assert main(["scenarios"]) == 0
    out = capsys.readouterr().out
    assert max(map(len, out.splitlines())) <= int(columns)
    rejoined = re.sub(r"(?<=[a-z]-)\n +", "", out)  # sparse-\n  decode: one word again
    assert rejoined.split() == " ".join(piped).split()  # the same words, in order


def test_predicted_run_says_what_it_did_not_follow(capsys, monkeypatch):
    """A predicted run with PYTORCH_CUDA_ALLOC_CONF set, and --bench, each say on stderr what
    they did not do; without them, no such note."""
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    assert main(["profile", "--predict", "--tokens", "1024", "--format", "json"]) == 0
    assert "note:" not in capsys.readouterr().err
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    assert main(["profile", "--predict", "--tokens", "1024", "--bench", "--format", "json"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert ("mlamem: note: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True is not followed: "
            "the allocator model predicts the default caching allocator") in err
    assert "mlamem: note: --bench timed nothing: predicted calls do not run" in err
    assert main(["plan", "--format", "json"]) == 0  # its sparse vLLM side runs the model
    assert capsys.readouterr().err.startswith("mlamem: note: PYTORCH_CUDA_ALLOC_CONF=")


@pytest.mark.parametrize("columns", ["0", "30"])
def test_piped_stderr_lines_are_not_wrapped(tmp_path, columns):
    """Piped, a stderr line stays one line whatever COLUMNS says (grep finds it whole)."""
    target = tmp_path / ("a-long-folder-name-" * 6) / "rows.json"
    target.parent.mkdir()
    done = subprocess.run([sys.executable, "-m", "mlamem", "profile", "--predict", "--tokens",
                           "1024", "--output", str(target)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, env={**os.environ, "COLUMNS": columns})
    assert done.returncode == 0, done.stderr
    assert f"mlamem: wrote {target}" in done.stderr.splitlines()
