"""The command line: predicted output without a GPU, every output form, and bad input."""

import io
import json
import subprocess
import sys

import pandas as pd
import pytest

from mlamem.cli import main
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
    assert err.count("\n") == 1 and "--kernel triton" in err
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
