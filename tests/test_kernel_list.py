"""`mlamem kernels` (mlamem.commands.kernel_list): every registered kernel, listed from its adapter (CPU)."""

import importlib.util
import subprocess
import sys

import pytest

from mlamem.commands import kernel_list
from mlamem.kernels import REGISTRY, Capabilities, KernelEntry, kernel_names
from mlamem.kernels.base import SPARSE_DECODE, KernelContract
from mlamem.results.kernels import KernelListing, KernelOperationListing


class ToyKernel(KernelContract):
    """A plug-in kernel registered from this test: sparse decode taking out and lse, no prefill
    answer yet."""

    name = "toy"
    label = "Toy"

    def unavailable_reason(self):
        return None

    def version(self):
        return "toy 0.1"

    def capabilities(self, op=SPARSE_DECODE):
        if op != SPARSE_DECODE:
            raise NotImplementedError(f"toy does not declare {op} yet\nsecond line")
        return Capabilities(takes_out=True, takes_lse=True, takes_accum_workspace=False,
                            head_counts=(16, 32, 64, 128), source="test")

    def run(self, problem, q, inputs, *, out=None, lse=None):
        raise NotImplementedError

    def allocations(self, problem, sm_count):
        return []


class BrokenKernel(ToyKernel):
    """An adapter that cannot even be constructed here."""

    label = "Broken"

    def __init__(self):
        raise RuntimeError("no such library")


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(REGISTRY, "toy", KernelEntry(__name__, "ToyKernel", "a toy",
                                                     ("sparse-decode", "sparse-prefill")))
    monkeypatch.setitem(REGISTRY, "broken", KernelEntry(__name__, "BrokenKernel", "broken"))


def test_every_registered_kernel_is_listed_once_in_registry_order():
    listings = kernel_list.list_kernels()
    assert [k.name for k in listings] == kernel_names()
    for k in listings:
        assert k.help == REGISTRY[k.name].help
        assert k.operation_names == REGISTRY[k.name].operations
        assert k.available == (k.reason is None)
    entries = kernel_list.render_kernels(listings).split("\n\n")[0]  # before the * note
    assert [line.split()[0] for line in entries.splitlines() if not line[0].isspace()] == (
        kernel_names())


@pytest.mark.skipif(importlib.util.find_spec("flash_mla") is not None, reason="flash_mla installed")
def test_flashmla_without_its_library_is_unavailable_saying_how_to_install():
    [flashmla] = [k for k in kernel_list.list_kernels() if k.name == "flashmla"]
    assert not flashmla.available and flashmla.version is None
    assert "pip install" in flashmla.reason


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm installed")
def test_flashmla_vllm_without_its_library_is_unavailable_saying_how_to_install(monkeypatch):
    from mlamem.kernels.flashmla_vllm import FOLDER_VARIABLE

    monkeypatch.delenv(FOLDER_VARIABLE, raising=False)
    [vllm] = [k for k in kernel_list.list_kernels() if k.name == "flashmla-vllm"]
    assert not vllm.available and vllm.version is None
    assert "pip install" in vllm.reason and FOLDER_VARIABLE in vllm.reason
    assert f"unavailable: {vllm.reason.split()[0]}" in kernel_list.render_kernels([vllm])


def test_a_plugin_kernel_appears_with_its_operations_and_version(toy):
    listings = {k.name: k for k in kernel_list.list_kernels()}
    assert list(listings)[-2:] == ["toy", "broken"]
    toy = listings["toy"]
    assert (toy.label, toy.help, toy.version, toy.available, toy.reason) == (
        "Toy", "a toy", "toy 0.1", True, None)
    decode, prefill = toy.operations
    assert (decode.op, decode.takes, decode.head_counts, decode.assumed, decode.error) == (
        "sparse-decode", "out, lse", [16, 32, 64, 128], False, None)
    assert prefill.op == "sparse-prefill" and prefill.takes is None
    assert prefill.error == "NotImplementedError: toy does not declare sparse-prefill yet"
    [line] = kernel_list.render_kernels([toy], width=200).splitlines()
    assert line == ("toy  sparse-decode(out, lse; h 16-128) sparse-prefill(?)  toy 0.1  available"
                    "  (?): NotImplementedError: toy does not declare sparse-prefill yet")


def test_an_adapter_that_fails_is_listed_with_its_one_line_reason(toy):
    [broken] = [k for k in kernel_list.list_kernels() if k.name == "broken"]
    assert broken.label == "Broken" and not broken.available and broken.version is None
    assert broken.reason == "the adapter does not load (RuntimeError: no such library)"
    assert [(o.op, o.error) for o in broken.operations] == [("sparse-decode", broken.reason)]
    assert kernel_list.render_kernels([broken]) == (
        "broken  sparse-decode(?)  unavailable: the adapter does not load (RuntimeError: no such "
        "library)\n")


def test_rendering_fits_the_width_and_marks_assumed_schemas():
    wide = KernelOperationListing(op="sparse-decode", takes="out", head_counts=[64, 128],
                                  assumed=True, error=None)
    listing = KernelListing(
        name="k", label="K", help="", operations=[wide, wide], version="1.0 sha256:0123456789abcdef",
        available=False, reason="not installed; " + "pip install something-long " * 6)
    text = kernel_list.render_kernels([listing])
    assert all(len(line) <= kernel_list.WIDTH for line in text.splitlines())
    assert "sparse-decode(out; h 64,128)*" in text and "* capabilities assumed" in text
    assert [line[:3] for line in text.splitlines()[1:3]] == ["   ", "   "]  # wrapped under it
    assert kernel_list.heads_text((64, 128)) == "64,128"
    assert kernel_list.heads_text((8, 16, 32, 64, 128)) == "8-128"
    assert kernel_list.heads_text((16, 64, 128)) == "16,64,128"
    assert kernel_list.render_kernels([]) == "no kernels registered\n"


def test_importing_the_listing_imports_no_adapter_nor_torch():
    code = ("import sys, mlamem.commands.kernel_list; "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('mlamem.kernels.')))")
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_kernels_command_prints_the_listing(capsys, monkeypatch):
    """`mlamem kernels`: the rendered listing, exit 0, also where no kernel runs (a CPU); piped
    without COLUMNS, at its own width."""
    from mlamem.cli import main

    monkeypatch.delenv("COLUMNS", raising=False)
    assert main(["kernels"]) == 0
    out, err = capsys.readouterr()
    assert out == kernel_list.render_kernels(kernel_list.list_kernels()) and err == ""
    for name in kernel_names():
        assert any(line.startswith(f"{name} ") for line in out.splitlines())


def test_the_kernels_command_lists_a_plugin(toy, capsys):
    from mlamem.cli import main

    assert main(["kernels"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("toy ") and "toy 0.1  available" in line for line in lines)
    assert any(line.startswith("broken ") and "the adapter does not load" in line
               for line in lines)


def test_kernels_help_starts_without_torch_or_an_adapter():
    code = ("import sys; from mlamem.cli import main; from mlamem.kernels import REGISTRY; "
            "code = main(['kernels', '--help']); heavy = ['torch', *(e.module for e in "
            "REGISTRY.values())]; print(code, sorted(m for m in heavy if m in sys.modules))")
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.splitlines()[-1] == "0 []"


def test_the_kernels_command_writes_json(capsys):
    """`mlamem kernels --format json`: schema mlamem.kernels/1, one object per registered kernel
    in registry order, with the listing's fields (docs/commands.md#mlamem-kernels)."""
    import json

    from mlamem.cli import main

    assert main(["kernels", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) == {"schema", "kernels", "warnings"}
    assert data["schema"] == "mlamem.kernels/1" and data["warnings"] == list(REGISTRY.warnings())
    assert [k["name"] for k in data["kernels"]] == kernel_names()
    for kernel, listing in zip(data["kernels"], kernel_list.list_kernels(), strict=True):
        assert set(kernel) == {"name", "label", "help", "operations", "version", "available",
                               "reason"}
        assert kernel["available"] is listing.available and kernel["reason"] == listing.reason
        assert [o["op"] for o in kernel["operations"]] == list(REGISTRY[kernel["name"]].operations)
        for op in kernel["operations"]:
            assert set(op) == {"op", "takes", "head_counts", "assumed", "error"}
            assert all(isinstance(h, int) for h in op["head_counts"])


def test_a_narrow_listing_cuts_no_word():
    """Narrower than an entry's words, the listing wraps between them and never inside one."""
    listings = kernel_list.list_kernels()
    wide = kernel_list.render_kernels(listings, width=400)
    narrow = kernel_list.render_kernels(listings, width=20)
    assert sorted(narrow.split()) == sorted(wide.split())
    assert len(narrow.splitlines()) > len(wide.splitlines())
