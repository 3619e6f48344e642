"""Plug-in kernels through the entry-point group `mlamem.kernels` (CPU).

The toy package in tests/fixtures/plugin_kernel, pip-installed into a temporary folder, is a
`--kernel` like the shipped ones wherever the folder is on the path: listed without importing
its adapter, predicted from its own allocation spec by `profile` (in-process and in a fresh
process) and `gate`, and listed by `mlamem kernels`. Broken plug-ins, and plug-ins taking a
name already taken, are one line each and break nothing else.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from mlamem.cli import main
from mlamem.kernels import REGISTRY, SHIPPED, KernelEntry, kernel_names, load_kernel

FIXTURE = Path(__file__).parent / "fixtures" / "plugin_kernel"
TOY_ENTRY = KernelEntry("toy_mlamem.adapter", "ToyKernel",
                        "a toy plug-in: takes out, lse and accum; predicts only",
                        ("sparse-decode",), package="toy-mlamem 0.1.0")

# The toy at GLM-5 (64 query heads per rank, run as 64), T = 1024, by its allocation spec:
PADDED_Q_BYTES = 1024 * 64 * 576 * 2  # q padded by the caller (alloc path), bf16
OUT_BYTES = 1024 * 64 * 512 * 2  # out, bf16, d_v 512
LSE_BYTES = 1024 * 64 * 4  # lse, float32
SCRATCH_BYTES = 1024 * 64 * 3 * 4  # toy_scratch: 3 int32 per (token, head)
PEAKS = {"alloc": PADDED_Q_BYTES + OUT_BYTES + LSE_BYTES + SCRATCH_BYTES,  # 143654912
         "workspace": LSE_BYTES + SCRATCH_BYTES,  # q and out staged: 1048576
         "workspace-full": 0}  # everything staged, the scratch replaced by the accum workspace
BUFFERS = {"alloc": {"padded_q": PADDED_Q_BYTES, "out": OUT_BYTES, "lse": LSE_BYTES,
                     "toy_scratch": SCRATCH_BYTES},
           "workspace": {"lse": LSE_BYTES, "toy_scratch": SCRATCH_BYTES},
           "workspace-full": {}}
PROFILE_TOY = ["profile", "--kernel", "toy", "--predict", "--format", "json", "--tokens", "1024"]

# A second, broken plug-in package (metadata written by hand): each entry point fails one way.
BROKEN_ENTRY_POINTS = """[mlamem.kernels]
missing = toy_broken_missing:ENTRY
notentry = toy_mlamem.adapter:ToyKernel
noadapter = toy_broken_entry:ENTRY
flashmla = toy_mlamem.entry:ENTRY
toy = toy_broken_entry:ENTRY
"""
BROKEN_ENTRY_MODULE = """from mlamem.kernels import KernelEntry

ENTRY = KernelEntry("toy_broken_nowhere", "Nowhere", "an adapter that is not installed")
"""
BROKEN_PROBLEMS = {  # --kernel NAME -> what its one line says
    "missing": "plug-in toy-broken 0.1: toy_broken_missing:ENTRY does not load (ModuleNotFoundError: "
               "No module named 'toy_broken_missing'); fix or uninstall toy-broken",
    "notentry": "plug-in toy-broken 0.1: toy_mlamem.adapter:ToyKernel is the class ToyKernel, not a "
                "mlamem.kernels.KernelEntry; fix or uninstall toy-broken",
    "noadapter": "plug-in toy-broken 0.1: toy_broken_nowhere:Nowhere does not load "
                 "(ModuleNotFoundError: No module named 'toy_broken_nowhere'); fix or uninstall "
                 "toy-broken",
}
REFUSED = [
    "plug-in toy-broken 0.1: kernel 'flashmla' refused, a shipped kernel has that name; rename "
    "its mlamem.kernels entry point",
    "plug-in toy-broken 0.1: kernel 'toy' refused, toy-mlamem 0.1.0 registers it first",
]


@pytest.fixture(scope="module")
def toy_site(tmp_path_factory) -> Path:
    """The toy package pip-installed (no network, no dependencies) into a fresh folder: its code
    and its dist-info with the entry point."""
    source = tmp_path_factory.mktemp("toy-source") / "plugin_kernel"
    shutil.copytree(FIXTURE, source)  # pip builds inside the source: keep the fixture clean
    target = tmp_path_factory.mktemp("toy-site")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--no-build-isolation", "--no-index", "--target", str(target), str(source)],
                   check=True, capture_output=True, timeout=300)
    return target


@pytest.fixture
def broken_site(tmp_path) -> Path:
    """The broken package `toy-broken 0.1`: a dist-info and one light module."""
    dist_info = tmp_path / "toy_broken-0.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-broken\nVersion: 0.1\n")
    (dist_info / "entry_points.txt").write_text(BROKEN_ENTRY_POINTS)
    (tmp_path / "toy_broken_entry.py").write_text(BROKEN_ENTRY_MODULE)
    return tmp_path


@pytest.fixture
def garbled_site(tmp_path) -> Path:
    """The package `garbled 0.1`, whose entry_points.txt has a line that is no `name = value`."""
    dist_info = tmp_path / "garbled-0.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: garbled\nVersion: 0.1\n")
    (dist_info / "entry_points.txt").write_text("[mlamem.kernels]\nno value here\n")
    return tmp_path


@contextmanager
def on_path(*folders: Path) -> Iterator[None]:
    """`folders` first on sys.path, in order, the registry discovering their plug-ins; after,
    the path, the modules imported from them and the registry as they were."""
    sys.path[:0] = [str(f) for f in folders]
    REGISTRY.rediscover()
    try:
        yield
    finally:
        del sys.path[:len(folders)]
        for name, module in list(sys.modules.items()):
            if any(str(getattr(module, "__file__", None) or "").startswith(str(f)) for f in folders):
                del sys.modules[name]
        REGISTRY.rediscover()


@pytest.fixture
def toy(toy_site) -> Iterator[None]:
    with on_path(toy_site):
        yield


@pytest.fixture
def broken(toy_site, broken_site) -> Iterator[None]:
    """The toy, then the broken package, installed."""
    with on_path(toy_site, broken_site):
        yield


def with_site(site: Path) -> dict[str, str]:
    """The environment with `site` first on PYTHONPATH (kept: where mlamem itself may be)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(site), *filter(None, [os.environ.get("PYTHONPATH")])])}


def run_mlamem(args: list[str], site: Path) -> subprocess.CompletedProcess:
    """`python -P -m mlamem ARGS` in a fresh process with `site` on PYTHONPATH."""
    return subprocess.run([sys.executable, "-P", "-m", "mlamem", *args], capture_output=True,
                          text=True, env=with_site(site), timeout=300)


def profile_figures(document: dict) -> tuple[dict, dict]:
    """path -> peak allocated bytes, and path -> {buffer: requested bytes}, of a profile JSON."""
    rows = {row["path"]: row for row in document["rows"]}
    return ({path: row["peak_allocated_bytes"] for path, row in rows.items()},
            {path: {b["name"]: b["requested_bytes"] for b in row["buffers"]}
             for path, row in rows.items()})


def test_the_entry_point_registers_the_toy_after_the_shipped_kernels(toy):
    """The entry is the toy's own, its package recorded; its adapter loads when asked."""
    assert kernel_names() == [*SHIPPED, "toy"]
    assert REGISTRY["toy"] == TOY_ENTRY and REGISTRY.warnings() == []
    assert "toy_mlamem.adapter" not in sys.modules  # listed, not imported
    cls = load_kernel("toy")
    assert (cls.__module__, cls.__name__, cls.name) == ("toy_mlamem.adapter", "ToyKernel", "toy")
    assert tuple(cls.operations) == TOY_ENTRY.operations


def test_listing_the_toy_imports_neither_torch_nor_its_adapter(toy_site):
    code = ("import sys; from mlamem.kernels import kernel_help, kernel_names; "
            "print(kernel_names()[-1], '|', kernel_help('toy')); "
            "print(sorted(m for m in ('torch', 'toy_mlamem.adapter') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True,
                          env=with_site(toy_site), timeout=120)
    assert done.stdout.splitlines() == [f"toy | {TOY_ENTRY.help}", "[]"], done.stderr


def test_profile_predicts_the_toy_from_its_allocation_spec(toy, capsys):
    """In-process: the toy's buffers and peaks, to the byte, on every path it can run."""
    assert main(PROFILE_TOY) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["kernel"]["name"] == "toy" and result["kernel"]["version"] == "toy 0.1"
    assert result["kernel"]["source"] == "the toy's own declaration"
    assert result["scenario"]["padded_heads"] == 64
    assert profile_figures(result) == (PEAKS, BUFFERS)
    assert [row["staged"] for row in result["rows"]] == [
        [], ["padded_q", "out"], ["padded_q", "out", "lse", "accum_workspace"]]


def test_a_fresh_process_profiles_the_installed_toy(toy_site):
    """`python -P -m mlamem profile --kernel toy --predict` with the install folder on
    PYTHONPATH: the same figures as in-process."""
    done = run_mlamem(PROFILE_TOY, toy_site)
    assert done.returncode == 0, done.stderr
    assert profile_figures(json.loads(done.stdout)) == (PEAKS, BUFFERS)


def test_a_command_s_help_lists_the_toy_and_a_refusal_never_scans(toy_site):
    """--kernel's metavar and help list the toy where a command's help is shown; a command
    run with a shipped kernel, or refused, never runs the entry-point scan (it would import
    the toy's entry module), nor does the app's own help."""
    code = ("import sys; from mlamem.cli import main; code = main(sys.argv[1:]); "
            "print(code, 'toy_mlamem.entry' in sys.modules)")

    def run(*args: str) -> tuple[list[str], str]:
        done = subprocess.run([sys.executable, "-P", "-c", code, *args], capture_output=True,
                              text=True, env=with_site(toy_site), timeout=120)
        return done.stdout.splitlines()[-1].split(), done.stdout

    for command in ("profile", "gate"):
        last, out = run(command, "--help")
        flat = "".join(out.split())
        assert last == ["0", "True"] and "|flashinfer|toy>" in flat
        assert "".join(f"toy ({TOY_ENTRY.help})".split()) in flat
    assert run("--help")[0] == ["0", "False"]
    assert run("repro-oom", "-s", "nosuch")[0] == ["2", "False"]
    assert run("profile", "--kernel", "triton", "--op", "dense-decode")[0] == ["2", "False"]


def test_mlamem_kernels_lists_the_installed_toy(toy_site):
    done = run_mlamem(["kernels"], toy_site)
    assert done.returncode == 0, done.stderr
    assert ("toy            sparse-decode(out, lse, accum; h 64,128)  toy 0.1  unavailable: a toy "
            "runs nowhere;") in done.stdout


def test_gate_records_and_passes_a_baseline_of_the_toy(toy, tmp_path, capsys):
    """`gate --update --kernel toy` records the toy's figures; a rerun gates the baseline's
    kernel, the toy, and passes."""
    baseline = tmp_path / "toy.json"
    assert main(["gate", "--predict", "--baseline", str(baseline), "--update", "--kernel", "toy",
                 "--tokens", "1024", "--scenario", "glm5-fp8-tp8"]) == 0
    data = json.loads(baseline.read_text())
    assert data["sweep"]["kernel"] == "toy" and data["environment"]["kernels"]["toy"] == "toy 0.1"
    assert {case["path"]: case["peak_allocated_bytes"] for case in data["cases"]} == PEAKS
    assert {case["path"]: case["buffers"] for case in data["cases"]} == BUFFERS
    capsys.readouterr()
    assert main(["gate", "--predict", "--baseline", str(baseline)]) == 0
    assert "Every figure equals the baseline." in capsys.readouterr().out


def test_the_toy_is_suggested_for_workspace_full(toy, capsys):
    """A kernel that cannot run workspace-full names every kernel that can, the toy too."""
    assert main(["profile", "--paths", "workspace-full", "--predict"]) == 2
    assert re.search(r"use kernel .*\btoy\b", capsys.readouterr().err)


def test_an_unknown_kernel_is_refused_listing_the_plug_in_too(toy, capsys):
    assert main(["profile", "--kernel", "toys", "--predict"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'toys' is not one of" in err and "'toy'" in err


def test_broken_and_refused_plug_ins_are_one_line_each_in_mlamem_kernels(broken, capsys):
    """Each broken plug-in is listed, unavailable with its problem; each refused name is one
    line at the end; the toy and the shipped kernels are listed as before."""
    assert kernel_names() == [*SHIPPED, "toy", "missing", "notentry", "noadapter"]
    assert REGISTRY["flashmla"] == SHIPPED["flashmla"] and REGISTRY["toy"] == TOY_ENTRY
    assert main(["kernels"]) == 0
    out = capsys.readouterr().out
    flat = " ".join(out.split())
    for name, problem in BROKEN_PROBLEMS.items():
        assert f"{name} unavailable: {problem}" in flat
    assert out.endswith("\n\n" + "\n".join(REFUSED) + "\n")
    assert "toy sparse-decode(out, lse, accum; h 64,128) toy 0.1" in flat


@pytest.mark.parametrize("name", list(BROKEN_PROBLEMS))
def test_kernel_broken_is_one_line_naming_the_package(broken, capsys, name):
    assert main(["profile", "--kernel", name, "--predict"]) == 2
    assert capsys.readouterr().err == f"mlamem: error: kernel {name!r}: {BROKEN_PROBLEMS[name]}\n"


def test_other_commands_work_beside_broken_plug_ins(broken, capsys):
    """The shipped default kernel is not overridden, and the toy still profiles."""
    assert main(["profile", "--predict", "--format", "json", "--tokens", "1024"]) == 0
    assert json.loads(capsys.readouterr().out)["kernel"]["name"] == "flashmla"
    assert main(PROFILE_TOY) == 0
    assert profile_figures(json.loads(capsys.readouterr().out)) == (PEAKS, BUFFERS)


def test_a_package_whose_entry_points_do_not_parse_is_one_line(toy_site, garbled_site, capsys):
    """Its entry points are left out, named in one line at the end of `mlamem kernels`; the
    other packages' plug-ins are found. (torch reads entry points too, when imported: a fresh
    process fails there, but `--help` and the commands without torch work.)"""
    with on_path(toy_site, garbled_site):
        assert kernel_names() == [*SHIPPED, "toy"]
        assert main(["kernels"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("package garbled 0.1: its entry points do not parse (") and last.endswith(
        "); fix or uninstall garbled")


def test_a_contract_1_plug_in_runs_through_the_shim(toy):
    """The toy is written against contract 1 (decode, allocations(q_shape)): the registry hands
    back a contract-2 class whose allocations(problem) are the toy's own."""
    from mlamem.spec.kernel_api import CONTRACT_VERSION, LegacyKernel, Problem

    cls = load_kernel("toy")
    assert issubclass(cls, LegacyKernel) and cls.contract == CONTRACT_VERSION
    assert cls.legacy.contract == 1
    problem = Problem("sparse-decode", rows=1024, heads=64, sm_scale=0.1, kv_tokens=8192,
                      topk=2048)
    kernel = cls()
    assert kernel.allocations(problem, 132) == kernel.kernel.allocations((1, 1024, 64, 576),
                                                                         512, 132)
    assert kernel.accum_numel(problem, 132) == 1024 * 64 * 3
    with pytest.raises(ValueError, match="contract 1.* runs only sparse-decode"):
        kernel.allocations(Problem("dense-decode", 4, 64, 0.1, 128, "bf16"), 132)


def test_a_plug_in_of_another_contract_is_one_line(toy, monkeypatch, capsys):
    import toy_mlamem.adapter

    monkeypatch.setattr(toy_mlamem.adapter.ToyKernel, "contract", 3)
    assert main(PROFILE_TOY) == 2
    assert capsys.readouterr().err.splitlines() == [
        "mlamem: error: kernel 'toy': plug-in toy-mlamem 0.1.0: toy_mlamem.adapter:ToyKernel implements "
        "kernel contract 3; this mlamem implements 2 (and adapts 1); fix or uninstall toy-mlamem"]
