"""Fuzz every file input of every command with random bytes and near-valid TOML/JSON: whatever
the file holds, mlamem exits 0, 1 or 2 and never tracebacks (issue 26). The CLI runs in this
process (`mlamem.cli.main`), derandomized, a few examples each, within a deadline."""

import contextlib
import io
import json
import tempfile
from datetime import timedelta
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlamem.cli import main

ROOT = Path(__file__).parent
SCENARIO = (ROOT.parent / "scenarios" / "glm5-fp8-tp8.toml").read_text()
PROFILE = (ROOT / "fixtures" / "results" / "profile-glm5-h200.json").read_text()
BASELINE = json.dumps({**json.loads((ROOT.parent / "reports" / "baselines" / "predicted.json").read_text()),
                       "sweep": {"scenarios": ["glm5-fp8-tp8"], "ops": ["sparse-decode"], "tokens": [1024],
                                 "paths": ["alloc"], "kernel": "flashmla"}})

FUZZ = settings(derandomize=True, max_examples=25, deadline=timedelta(seconds=5),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
                database=None)


@st.composite
def mutated(draw, text: str) -> bytes:
    """Random bytes, or `text` with a slice cut, replaced or a hostile token inserted."""
    if draw(st.booleans()):
        return draw(st.binary(max_size=200))
    start = draw(st.integers(0, len(text)))
    end = draw(st.integers(start, min(len(text), start + 40)))
    token = draw(st.sampled_from(["", "nan", "-1", "inf", "1e999", "\"", "[", "{", "NaN", "\n#",
                                  "\x00", "\udcff", "99999999999999999999999", "../", "`|"]))
    return (text[:start] + token + text[end:]).encode("utf-8", "surrogateescape")


def _run(args_for) -> None:
    with tempfile.TemporaryDirectory(prefix="mlamem-fuzz-") as folder:
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            code = main([str(a) for a in args_for(Path(folder))])
        assert code in (0, 1, 2), (code, err.getvalue())
        assert "Traceback" not in err.getvalue(), err.getvalue()


def _file(folder: Path, name: str, data: bytes) -> Path:
    (folder / name).write_bytes(data)
    return folder / name


@FUZZ
@given(mutated(SCENARIO))
def test_scenario(data):
    _run(lambda f: ["profile", "--predict", "--tokens", "1024", "--paths", "alloc",
                    "--scenario", _file(f, "s.toml", data)])


@FUZZ
@given(mutated(BASELINE))
def test_baseline(data):
    _run(lambda f: ["gate", "--predict", "--baseline", _file(f, "b.json", data)])


@FUZZ
@given(mutated(PROFILE))
def test_report(data):
    _run(lambda f: ["report", _file(f, "r.json", data), "--output", f / "r.md"])


@FUZZ
@given(mutated(PROFILE))
def test_merge(data):
    _run(lambda f: ["merge", _file(f, "r.json", data)])
