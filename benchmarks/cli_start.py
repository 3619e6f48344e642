"""CLI start-up and the predicted sweep, wall time from process start, on this machine.

Run on the machine to judge (no GPU needed):  python3 benchmarks/cli_start.py [--repeats 5]

Each figure is the median over fresh processes, after one warm-up run that leaves the bytecode
caches an installed package has (PYTHONDONTWRITEBYTECODE is dropped for the children):
- `python -c "import torch"`: what any command that needs torch pays first;
- a bare typer app with two commands, `--help` and running one: the floors for a typer CLI
  (parsing a command's options, typer 0.29 imports pydantic, which `--help` does not);
- `mlamem --help` and `mlamem scenarios`, which import none of torch, pandas or matplotlib;
- the refusals of REFUSALS (a missing scenario or file, a value out of range, a bad path,
  operation or sweep, a special file given as a result), which exit 2 before torch is imported;
- `mlamem profile --predict` for every decode scenario x 4 T x both paths, all in one process
  (the CLI called in-process, so imports count once), as wall and as wall minus the torch import;
- `python -c "import pytest"` and `python -c "import mlamem.pytest_plugin"`: what the pytest
  plugin adds to every pytest session where mlamem is installed.
Targets (on a 2-core CPU): `--help` within 0.15 s of the bare app's `--help`, and `scenarios`
and each refusal within 0.15 s of the bare app running a command;
the predicted sweep at most the torch import + 1 s; the plugin's import within
0.05 s of pytest's, importing none of torch, pandas, matplotlib or rich. Exits 1 if a target is
missed.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEAVY = ("torch", "pandas", "matplotlib")  # what --help and scenarios must not import
PLUGIN_HEAVY = (*HEAVY, "rich")  # what loading the pytest plugin must not import
DECODE_SCENARIOS = ("glm5-fp8-tp8", "deepseek-v32-fp8-tp8", "kimi-k2-fp8-tp4-dp")
TOKENS = "1024,8192,16384,32768"
HELP_SLACK_S = 0.15  # --help and scenarios: at most this much over the bare typer app
SWEEP_SLACK_S = 1.0  # the predicted sweep: at most this much over `import torch`
PLUGIN_SLACK_S = 0.05  # the pytest plugin's import: at most this much over `import pytest`

BARE_TYPER_APP = '''
import typer

app = typer.Typer()


@app.command()
def one(name: str = "x") -> None:
    """The first command."""


@app.command()
def two(count: int = 1) -> None:
    """The second command."""


app()
'''

SWEEP = f'''
import contextlib, io, sys
from mlamem.cli import main

with contextlib.redirect_stdout(io.StringIO()):
    for name in {DECODE_SCENARIOS!r}:
        code = main(["profile", "--predict", "--scenario", name, "--tokens", "{TOKENS}",
                     "--paths", "alloc,workspace"])
        if code != 0:
            sys.exit(code)
'''


CHILD_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


REFUSALS = (["repro-oom", "-s", "nosuch"], ["profile", "-s", "missing.toml"],
            ["repro-oom", "--utilization", "2"], ["explain", "/nonexistent.pickle"],
            ["report", "/dev/zero"], ["profile", "--paths", "bogus"],
            ["profile", "--tokens", "2147483648"],
            ["profile", "--kernel", "triton", "--op", "dense-decode"],
            ["plan", "--sweep", "bogus=1"])  # each must exit 2


def run_once(argv: list[str]) -> tuple[float, float]:
    """(wall, CPU) seconds of `argv` in a fresh process; the command must exit 0 (a refusal
    of REFUSALS: 2)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          env=CHILD_ENV)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != (2 if any(argv[-len(r):] == r for r in REFUSALS) else 0):
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}:\n{done.stderr}")
    return wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def median_s(argv: list[str], repeats: int) -> tuple[float, float]:
    """Median (wall, CPU) seconds over `repeats` fresh processes, after one warm-up."""
    run_once(argv)
    runs = [run_once(argv) for _ in range(repeats)]
    return statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs)


def heavy_imports(argv: list[str], names: tuple[str, ...] = HEAVY) -> list[str]:
    """Which of `names` the command imports (read from -X importtime)."""
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          env={**CHILD_ENV, "PYTHONPROFILEIMPORTTIME": "1"})
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()
                if line.startswith("import time:")}
    return [name for name in names if name in imported]


def mlamem_argv() -> list[str]:
    """The installed console script beside this interpreter, else `python -m mlamem`."""
    script = shutil.which("mlamem", path=str(Path(sys.executable).parent))
    return [script] if script else [sys.executable, "-m", "mlamem"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="processes per figure (median)")
    args = parser.parse_args()
    python, mlamem, n = sys.executable, mlamem_argv(), args.repeats
    with tempfile.TemporaryDirectory() as folder:
        bare_app = Path(folder) / "bare_typer_app.py"
        bare_app.write_text(BARE_TYPER_APP)
        rows = [
            ('python -c "import torch"', [python, "-c", "import torch"]),
            ("bare typer app --help (floor)", [python, str(bare_app), "--help"]),
            ("bare typer app, a command (floor)", [python, str(bare_app), "one"]),
            ("mlamem --help", [*mlamem, "--help"]),
            ("mlamem scenarios", [*mlamem, "scenarios"]),
            *((f"refused: mlamem {' '.join(r)}", [*mlamem, *r]) for r in REFUSALS),
            (f"profile --predict: {len(DECODE_SCENARIOS)} scenarios x 4 T x 2 paths, "
             "one process", [python, "-c", SWEEP]),
            ('python -c "import pytest" (plugin floor)', [python, "-c", "import pytest"]),
            ('python -c "import mlamem.pytest_plugin"',
             [python, "-c", "import mlamem.pytest_plugin"]),
        ]
        figures = {label: median_s(argv, n) for label, argv in rows}
        faces = rows[3:5 + len(REFUSALS)]  # --help, scenarios, the refusals
        sweep, pytest_row, plugin = rows[5 + len(REFUSALS):]
        heavy = {label: heavy_imports(argv) for label, argv in faces}
        plugin_heavy = heavy_imports(plugin[1], PLUGIN_HEAVY)
    walls = {label: wall for label, (wall, _) in figures.items()}
    torch_s, sweep_s = walls[rows[0][0]], walls[sweep[0]]
    floors = {label: walls[rows[2][0]] for label, _ in faces}  # a command's floor
    floors[rows[3][0]] = walls[rows[1][0]]  # --help's
    pytest_s, plugin_s = walls[pytest_row[0]], walls[plugin[0]]

    print(f"# mlamem start-up: {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"median of {n} fresh processes each")
    print(f"# mlamem run as: {' '.join(mlamem)}")
    print()
    print("| what | wall s | CPU s | wall - floor | imports |")
    print("|---|---:|---:|---:|---|")
    for label, _ in rows:
        wall, cpu = figures[label]
        over = f"{wall - floors[label]:+.3f}" if label in heavy else ""
        imports = (", ".join(heavy[label]) or "none of torch, pandas, matplotlib"
                   if label in heavy else "")
        if label == plugin[0]:
            over = f"{plugin_s - pytest_s:+.3f} (over pytest)"
            imports = ", ".join(plugin_heavy) or "none of torch, pandas, matplotlib, rich"
        print(f"| {label} | {wall:.3f} | {cpu:.3f} | {over} | {imports} |")
    print(f"| the sweep less `import torch` | {sweep_s - torch_s:.3f} | "
          f"{figures[sweep[0]][1] - figures[rows[0][0]][1]:.3f} | | |")
    print()

    checks = [(f"{label}: within {HELP_SLACK_S} s of the bare typer app's floor",
               walls[label] - floors[label] <= HELP_SLACK_S and not heavy[label])
              for label in heavy]
    checks.append((f"predicted sweep: at most `import torch` + {SWEEP_SLACK_S} s "
                   f"({sweep_s:.3f} <= {torch_s + SWEEP_SLACK_S:.3f})",
                   sweep_s <= torch_s + SWEEP_SLACK_S))
    checks.append((f"pytest plugin: within {PLUGIN_SLACK_S} s of `import pytest` "
                   f"({plugin_s - pytest_s:+.3f} s), importing none of {', '.join(PLUGIN_HEAVY)}",
                   plugin_s - pytest_s <= PLUGIN_SLACK_S and not plugin_heavy))
    for text, ok in checks:
        print(f"{'PASS' if ok else 'MISS'}  {text}")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    raise SystemExit(main())
