"""mlamem's pytest plugin on the CPU, through pytester: its marks and fixture register, skip
without CUDA, and check limits against predicted measurements on the meta device."""

import subprocess
import sys

import pytest
import torch

pytest_plugins = ["pytester"]

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device here measures")

PREDICTED_TESTS = """
import pytest
import torch


@pytest.fixture
def workspace():
    return torch.empty((1024, 1024), device="meta")  # setup: outside the measured body


@pytest.mark.limit_gpu_memory("1MiB", device="meta")
def test_over_the_limit():
    torch.empty((1024, 1024), device="meta")


@pytest.mark.limit_gpu_memory("8MiB", device="meta")
def test_within_the_limit():
    torch.empty((1024, 1024), device="meta")


@pytest.mark.max_gpu_allocations(0, device="meta", expect={"scores": 4 * 1024 * 1024})
def test_allocates():
    torch.empty((1024, 1024), device="meta")
    torch.empty(256, device="meta")


@pytest.mark.max_gpu_allocations(0, device="meta")
def test_in_place_on_a_fixture(workspace):
    workspace.mul_(2)
"""


def test_marks_are_registered(pytester):
    """`pytest --markers` lists both marks with their arguments."""
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines([
        "@pytest.mark.limit_gpu_memory(limit, *, expect=None, device=None): *",
        "@pytest.mark.max_gpu_allocations(count, *, expect=None, device=None): *",
    ])


def test_fixture_is_registered(pytester):
    """`pytest --fixtures` lists gpu_memory."""
    result = pytester.runpytest("--fixtures")
    result.stdout.fnmatch_lines(["gpu_memory*", "*tracker factory*"])


@no_cuda
def test_marks_and_fixture_skip_without_cuda(pytester):
    """Without CUDA, a marked test and a test that asks the fixture to measure are skipped with
    the reason, before the marked test's fixtures run."""
    pytester.makepyfile("""
        import pytest

        @pytest.fixture
        def expensive():
            raise AssertionError("a skipped test's fixtures must not run")

        @pytest.mark.limit_gpu_memory("2GiB")
        def test_limited(expensive):
            pass

        @pytest.mark.max_gpu_allocations(0)
        def test_graph_safe():
            pass

        def test_fixture(gpu_memory):
            with gpu_memory.track():
                pass
    """)
    result = pytester.runpytest("-rs")
    result.assert_outcomes(skipped=3)
    result.stdout.fnmatch_lines(['*mlamem: no CUDA device*give the mark device="meta"*'])
    result.stdout.fnmatch_lines(['*mlamem: no CUDA device here*pass device="meta"*'])


def test_limits_are_checked_on_a_predicted_measurement(pytester):
    """On the meta device: 4 MiB allocated in the body fails a 1 MiB limit with the breakdown
    table and passes 8 MiB; an allocation fails max_gpu_allocations(0), naming it from expect,
    the others by the frame in the test file that made them; in place on a fixture's tensor
    passes it."""
    pytester.makepyfile(PREDICTED_TESTS)
    result = pytester.runpytest()
    result.assert_outcomes(passed=2, failed=2)
    lines = PREDICTED_TESTS.lstrip("\n").splitlines()  # as makepyfile writes it
    over, scores, small = (
        next(i for i, line in enumerate(lines, 1) if line.startswith(text) and i > after)
        for text, after in (("    torch.empty((1024", 0),
                            ("    torch.empty((1024", lines.index("def test_allocates():")),
                            ("    torch.empty(256", 0)))
    test_file = "test_limits_are_checked_on_a_predicted_measurement.py"
    result.stdout.fnmatch_lines([
        "*_ test_over_the_limit _*",
        "GPU peak allocated 4.000 MiB (4194304 B) (PREDICTED) exceeds limit_gpu_memory "
        "1.000 MiB (1048576 B)",
        "*mlamem: allocations inside (PREDICTED)*",
        f"*0/{test_file}:{over} test_over_the_limit unknown 4.000 MiB 4194304 yes",
        "*_ test_allocates _*",
        "2 GPU allocations inside the test body (PREDICTED), max_gpu_allocations(0): "
        f"scores 4.000 MiB at *0/{test_file}:{scores} test_allocates, "
        f"*0/{test_file}:{small} test_allocates 1.000 KiB",
    ])


def test_terminal_summary_has_each_measured_peak(pytester):
    """The summary lists every marked test's peak (and limit), passed or failed."""
    pytester.makepyfile(PREDICTED_TESTS)
    result = pytester.runpytest()
    result.stdout.fnmatch_lines([
        "*- mlamem GPU memory (test bodies) -*",
        "*::test_over_the_limit: peak allocated 4.000 MiB (limit 1.000 MiB) (PREDICTED), "
        "1 allocation inside",
        "*::test_within_the_limit: peak allocated 4.000 MiB (limit 8.000 MiB) (PREDICTED)*",
        "*::test_in_place_on_a_fixture: peak allocated 0 B (PREDICTED), 0 allocations inside",
    ])


def test_a_failing_body_keeps_its_own_failure(pytester):
    """An assertion in a marked body fails the test with that assertion, not a limit."""
    pytester.makepyfile("""
        import pytest

        @pytest.mark.limit_gpu_memory("1MiB", device="meta")
        def test_wrong():
            assert 1 == 2
    """)
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*assert 1 == 2*"])
    result.stdout.no_fnmatch_line("*exceeds limit_gpu_memory*")


def test_the_fixture_measures_one_call(pytester):
    """gpu_memory.track and gpu_memory.profile_call measure inside the test, predicted."""
    pytester.makepyfile("""
        import torch

        def test_track(gpu_memory):
            with gpu_memory.track(expect={"x": 4096}, device="meta") as t:
                torch.empty(1024, device="meta")
            assert t.peak_allocated_bytes == 4096 and t.buffers[0].name == "x"

        def test_profile_call(gpu_memory):
            t = gpu_memory.profile_call(lambda: torch.zeros(1024, device="meta"), device="meta")
            assert t.allocations_in_call == 1 and not t.measured
    """)
    pytester.runpytest().assert_outcomes(passed=2)


@pytest.mark.parametrize(("mark", "fix"), [
    ('limit_gpu_memory("2 gigs", device="meta")', "is not a size; write e.g. 80GiB"),
    ('limit_gpu_memory("0B", device="meta")', "give a size above 0"),
    ('max_gpu_allocations(-1, device="meta")', "give a count >= 0"),
    ('max_gpu_allocations(device="meta")', "write @pytest.mark.max_gpu_allocations(count, *,"),
    ('limit_gpu_memory("2GiB", devise="meta")', "unknown keyword 'devise'; write"),
    ('max_gpu_allocations(0, expct={"x": 1}, device="meta")', "unknown keyword 'expct'"),
    ('limit_gpu_memory("2GiB", device="mta")', "(device='mta'): give device=\"meta\""),
    ('max_gpu_allocations(0, device="gpu")', "(device='gpu'): give device=\"meta\""),
    ('limit_gpu_memroy("2GiB", device="meta")',
     "unknown mark 'limit_gpu_memroy': did you mean @pytest.mark.limit_gpu_memory?"),
    ('max_gpu_allocation(0)', "did you mean @pytest.mark.max_gpu_allocations?"),
])
def test_bad_mark_arguments_are_one_line_errors(pytester, mark, fix):
    """A bad mark argument errors the test in setup, naming the fix, with no traceback."""
    pytester.makepyfile(f"""
        import pytest

        @pytest.mark.{mark}
        def test_marked():
            pass
    """)
    result = pytester.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([f"*{fix}*"])
    result.stdout.no_fnmatch_line("*During handling of the above exception*")


def test_importing_the_plugin_imports_nothing_heavy():
    """Importing the plugin imports none of torch, rich, pandas or a kernel."""
    code = ("import sys, mlamem.pytest_plugin; "
            "print(sorted(m for m in ('torch', 'rich', 'pandas', 'mlamem.kernels') "
            "if m in sys.modules))")
    done = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True,
                          check=True, timeout=120)
    assert done.stdout.strip() == "[]"


def test_a_session_without_marks_imports_no_torch(pytester):
    """A whole pytest session in a fresh process, with the plugin loaded from its entry point
    and no mark used, never imports torch."""
    pytester.makepyfile("""
        import sys

        def test_no_torch(request):
            assert request.config.pluginmanager.has_plugin("mlamem")
            assert "torch" not in sys.modules
    """)
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_a_marked_body_stopped_by_a_test_outcome_stops_only_that_test(pytester):
    """An `async def` test (pytest without an async plugin fails or skips it), and bodies that
    call pytest.skip or pytest.fail, leave no figures: each is that one test's outcome, and the
    session runs on with no INTERNALERROR."""
    pytester.makepyfile("""
        import pytest
        import torch

        @pytest.mark.limit_gpu_memory("1MiB", device="meta")
        async def test_async():
            torch.empty(10, device="meta")

        @pytest.mark.max_gpu_allocations(0, device="meta")
        def test_skips():
            pytest.skip("not today")

        @pytest.mark.limit_gpu_memory("1MiB", device="meta")
        def test_fails():
            pytest.fail("by itself")

        def test_after():
            pass
    """)
    result = pytester.runpytest("-rs")
    outcomes = result.parseoutcomes()
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert outcomes.get("passed") == 1 and outcomes.get("failed", 0) + outcomes.get("skipped", 0) == 3
    result.stdout.fnmatch_lines(["*by itself*"])
    result.stdout.no_fnmatch_line("*INTERNALERROR*")


@pytest.mark.parametrize(("expect", "fix"), [
    ('"scores"', "limit_gpu_memory: expect='scores': give a mapping of buffer names"),
    ("[1, 2]", "limit_gpu_memory: expect=[1, 2]: give a mapping of buffer names"),
    ('{"a": "lots"}', "expect['a'] = 'lots': expected bytes"),
    ('{"a": -1}', "expect['a'] = -1: expected bytes"),
])
def test_a_bad_expect_is_one_line(pytester, expect, fix):
    """A bad expect= errors that one test in setup, naming the fix, with no traceback."""
    pytester.makepyfile(f"""
        import pytest

        @pytest.mark.limit_gpu_memory("1MiB", device="meta", expect={expect})
        def test_marked():
            pass

        def test_after():
            pass
    """)
    result = pytester.runpytest()
    result.assert_outcomes(errors=1, passed=1)
    result.stdout.fnmatch_lines([f"*{fix.replace('[', '[[]')}*"])  # [ opens a class in fnmatch
    result.stdout.no_fnmatch_line("*Traceback*")
    result.stdout.no_fnmatch_line("*During handling of the above exception*")
