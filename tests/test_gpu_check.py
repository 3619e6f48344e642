"""scripts/gpu_check.py on a CPU: it names its suites, refuses a bad one in one line, and every
command it would run on the GPU names files, mlamem commands and tests that exist."""

import importlib.util
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
SCRIPT = ROOT / "scripts" / "gpu_check.py"


def _load():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gpu_check = _load()
COMMANDS = [(suite, command) for suite, commands in gpu_check.SUITES.items() for command in commands]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)


def test_list_names_every_suite_without_torch():
    """--list prints one suite a line, `tests`, `tests-cpu` and `tests-slow` (the whole pytest set)
    among them, and imports neither torch nor mlamem: it needs no CUDA."""
    done = _run("--list")
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.splitlines() == list(gpu_check.SUITES)
    whole = " ".join(c for suite in ("tests", "tests-cpu", "tests-slow")
                     for c in gpu_check.SUITES[suite])
    # the three suites: every test file, the GPU files in `tests`, the rest in `tests-cpu`
    gpu_files = {f"tests/{p.name}" for p in (ROOT / "tests").glob("*_gpu.py")}
    assert set(gpu_check.FAST_GPU_TESTS.split()) | set(gpu_check.SLOW_GPU_TESTS) == gpu_files
    assert gpu_check.SUITES["tests"][0].endswith(gpu_check.FAST_GPU_TESTS)
    assert gpu_check.SUITES["tests-cpu"][0].endswith(" --ignore-glob=tests/*_gpu.py tests")
    assert all(t in whole for t in gpu_check.SLOW_GPU_TESTS)
    probe = (f"import runpy, sys; sys.argv = [{str(SCRIPT)!r}, '--list']\n"
             f"try:\n    runpy.run_path({str(SCRIPT)!r}, run_name='__main__')\n"
             "except SystemExit as exit:\n    assert exit.code == 0\n"
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'mlamem')))")
    imported = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                              cwd=ROOT, timeout=60)
    assert imported.stdout.splitlines()[-1] == "[]", imported.stderr


def test_list_of_a_suite_prints_its_commands():
    """--list --suite A,B prints each suite's name, then its commands, indented."""
    done = _run("--list", "--suite", "gate,native-bench")
    lines = done.stdout.splitlines()
    assert done.returncode == 0
    assert lines == ["gate", *(f"  {c}" for c in gpu_check.SUITES["gate"]),
                     "native-bench", *(f"  {c}" for c in gpu_check.SUITES["native-bench"])]


@pytest.mark.parametrize("args", [["--suite", "profile,nope", "out"], ["--suite", "", "--list"],
                                  ["--suite", "tests"]])
def test_bad_usage_is_one_line_and_exit_2(args, tmp_path):
    """An unknown suite (named, with the known ones) or no OUTDIR: one stderr line, exit 2,
    nothing run and nothing written."""
    done = _run(*args)
    assert done.returncode == 2 and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith("gpu_check.py: ")
    if "nope" in args[1]:
        assert line.startswith("gpu_check.py: unknown suite 'nope'; expected all or some of: tests,")
    assert not (ROOT / "out").exists()


def test_words_become_the_commands_run():
    """`mlamem` runs as a module, @NAME is a JSON output in the suite's folder, {out} is it."""
    out = Path("/results/gate")
    assert gpu_check.argv_of("mlamem profile -s glm5-fp8-tp8 @1-glm5", out) == [
        "python3", "-m", "mlamem", "profile", "-s", "glm5-fp8-tp8", "--format", "json",
        "--output", "/results/gate/1-glm5.json"]
    assert gpu_check.argv_of("python3 scripts/x.py {out}/a.json", out) == [
        "python3", "scripts/x.py", "/results/gate/a.json"]
    assert gpu_check.label("mlamem gate --baseline {out}/b.json --update") == "gate"
    assert gpu_check.label("mlamem profile --predict @glm5.predicted") == "glm5.predicted"
    assert gpu_check.both("mlamem graphs @g") == ["mlamem graphs @g", "mlamem graphs --predict @g.predicted"]


def test_every_file_a_command_names_exists():
    """Each tests/, scripts/, benchmarks/ or reports/ path in a command is in the repository (a
    test's node id, FILE::TEST, by its file)."""
    named = {word.split("=")[-1].split("::")[0] for _, command in COMMANDS
             for word in shlex.split(command)
             if word.startswith(("tests/", "scripts/", "benchmarks/", "reports/"))}
    assert named and sorted(p for p in named if not (ROOT / p).exists()) == []


def test_every_mlamem_command_exists():
    """Each `mlamem COMMAND` the suites run answers --help."""
    commands = sorted({shlex.split(c)[1] for _, c in COMMANDS if c.startswith("mlamem ")})
    assert {"profile", "validate", "repro-oom", "gate", "graphs", "compare", "report"} <= set(commands)
    for name in commands:
        done = subprocess.run([sys.executable, "-P", "-m", "mlamem", name, "--help"], capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, (name, done.stderr)


@pytest.mark.parametrize("command", sorted({c for _, c in COMMANDS if " -k " in c}))
def test_every_test_selection_selects_tests(command):
    """A pytest command with -k collects at least one test (they run on the GPU, skip here)."""
    words = shlex.split(command.format(out="/tmp"))
    selection = [w for w in words[words.index("pytest") + 1:]
                 if not w.startswith(("-q", "-rs", "-p", "no:", "--"))]
    done = subprocess.run([sys.executable, "-P", "-m", "pytest", "--collect-only", "-q", "-p",
                           "no:cacheprovider", *selection], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stdout[-500:]  # 5: no test collected
