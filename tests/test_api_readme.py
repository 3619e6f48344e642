"""The API page's examples (docs/api.md), run as written (on the meta device without a GPU):
the API example prints what the page shows, the test file passes."""

import contextlib
import io
import re
from pathlib import Path

import torch

pytest_plugins = ["pytester"]

API_PAGE = Path(__file__).parent.parent / "docs" / "api.md"


def section_blocks() -> list[tuple[str, str]]:
    """(language, code) of each fenced block on the page, in order."""
    return re.findall(r"^```(\w+)\n(.*?)^```$", API_PAGE.read_text(), flags=re.MULTILINE | re.DOTALL)


def test_the_page_has_the_api_example_its_output_and_a_test_file():
    """Three blocks: the API example, what it prints, the pytest file."""
    assert [language for language, _ in section_blocks()] == ["python", "text", "python"]


def test_api_example_runs_and_prints_what_the_page_shows(tmp_path, monkeypatch):
    """The API example runs as written; without a GPU it prints the page's output, and its
    snapshot file is written."""
    (_, example), (_, shown), _ = section_blocks()
    monkeypatch.chdir(tmp_path)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(example, "docs/api.md", "exec"), {"__name__": "readme_example"})
    if torch.cuda.is_available():
        assert printed.getvalue().splitlines()[0] == "75497472 75497472 1"
    else:
        assert printed.getvalue() == shown
    assert (tmp_path / "pad_heads.pickle").stat().st_size > 0


def test_pytest_example_passes(pytester):
    """The plugin example's three tests pass (predicted on the meta device without a GPU)."""
    *_, (_, test_file) = section_blocks()
    pytester.makepyfile(test_pad_heads=test_file)
    result = pytester.runpytest()
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["*::test_padding_fits: peak allocated 72.000 MiB "
                                 "(limit 80.000 MiB)*"])
