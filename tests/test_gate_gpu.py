"""`mlamem gate` on the GPU: measured baselines, measured == predicted, a measured regression."""

import json
from pathlib import Path

import pytest

from mlamem.cli import main
from mlamem.runtime.paths import PATHS
from mlamem.testing import needs_flashmla

pytestmark = [needs_flashmla, pytest.mark.gpu]
GLM5_T1024 = ["--scenario", "glm5-fp8-tp8", "--tokens", "1024"]


@pytest.fixture(scope="module")
def measured_baseline(tmp_path_factory):
    """A measured baseline of GLM-5 at T=1024, both paths, written by `mlamem gate --update`."""
    path = tmp_path_factory.mktemp("gate") / "measured.json"
    assert main(["gate", "--baseline", str(path), "--update", *GLM5_T1024]) == 0
    return path


def test_measured_baseline_then_a_second_run_passes(measured_baseline, capsys):
    """--update records a measured baseline with its GPU; a second measured run exits 0, with
    the default tolerances and with none (the gated figures do not move from run to run)."""
    data = json.loads(measured_baseline.read_text())
    assert data["measured"] is True and data["environment"]["compute_capability"]
    assert main(["gate", "--baseline", str(measured_baseline)]) == 0
    assert main(["gate", "--baseline", str(measured_baseline), "--tolerance", "0"]) == 0
    assert "FAILED" not in capsys.readouterr().out


def test_committed_predicted_baseline_passes_predicted_on_the_gpu():
    """The predicted baseline CI gates against (made on a CPU without flash_mla), predicted on
    the GPU machine: the same figures, the environment check lifted."""
    baseline = Path(__file__).parent / "fixtures" / "reports" / "baselines" / "predicted.json"
    assert main(["gate", "--baseline", str(baseline), "--predict", "--allow-env-change"]) == 0


def test_predicted_figures_pass_byte_exact_against_the_measured_baseline(measured_baseline):
    """With the environment check lifted, the prediction equals the measurement to the byte."""
    assert main(["gate", "--baseline", str(measured_baseline), "--predict", "--allow-env-change",
                 "--tolerance", "0"]) == 0


def test_measured_regression_fails(measured_baseline, monkeypatch, capsys, regressed_alloc_path):
    """The regressed wrapper, measured, fails with the extra padded copy's bytes in the diff."""
    monkeypatch.setitem(PATHS, "alloc", regressed_alloc_path)
    assert main(["gate", "--baseline", str(measured_baseline)]) == 1
    out = capsys.readouterr().out
    assert "| regressed | glm5-fp8-tp8 | 1024 | alloc | buffer bytes | unattributed |" in out
    assert f"+{1024 * 64 * 576 * 2} B" in out
