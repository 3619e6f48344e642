"""mlamem/spec/gpus.py: GPUs by name, each figure with its source; a scenario moved to another GPU."""

import json
import re

import pytest

from mlamem.cli import main
from mlamem.spec import gpus, scenario
from mlamem.spec.errors import UserError


def test_every_gpu_names_its_sources():
    for g in gpus.GPUS.values():
        assert g.smi_source and g.sm_source and (g.cuda_mib is None or g.cuda_source)
        assert g.cuda_mib is None or g.cuda_mib < g.smi_mib


def test_every_gpu_has_a_compute_capability():
    """Which kernels a target runs is read from its compute capability: a GPU without one would
    skip KernelContract.target_reason's refusal."""
    assert set(gpus.COMPUTE_CAPABILITY) == set(gpus.GPUS)


@pytest.mark.parametrize(("name", "smi_mib", "sm_count"), [
    ("H20 141GB", 143771, 78), ("H20", 97871, 78), ("GH200 480GB", 97871, 132),
    ("H800", 81559, 132), ("H200 NVL", 143771, 132)])
def test_boards_users_of_these_kernels_run(name, smi_mib, sm_count):
    """The Hopper boards users serve MLA models on, nvidia-smi's memory and the SM count each
    from a public record: the 141 GB H20 (NVIDIA H20-3e) beside the 96 GB one."""
    board = gpus.gpu(name)
    assert (board.smi_mib, board.sm_count, board.memory_mib) == (smi_mib, sm_count, smi_mib)


def test_retarget_keeps_the_scenario_but_its_gpu():
    shipped = scenario.load("glm5-fp8-tp8")
    assert gpus.retarget(shipped, None) is shipped
    moved = gpus.retarget(shipped, "B200")
    assert (moved.gpu.name, moved.gpu.memory_mib, moved.gpu.sm_count) == ("B200", 183359, 148)
    assert moved.gpu.gpu_memory_utilization == shipped.gpu.gpu_memory_utilization
    assert scenario.to_dict(moved)["serving"] == scenario.to_dict(shipped)["serving"]
    with pytest.raises(UserError, match="unknown GPU 'H300'; known: 'H100 SXM 80GB'"):
        gpus.retarget(shipped, "H300")


@pytest.mark.parametrize(("given", "name"), [
    ("H200 SXM 141GB", "H200 SXM 141GB"), ("h200 sxm 141gb", "H200 SXM 141GB"),
    (" H200  SXM 141GB ", "H200 SXM 141GB"), ("H200 SXM", "H200 SXM 141GB"),
    ("a100", "A100 80GB"), ("h100 pcie", "H100 PCIe"), ("H20", "H20"), ("b200", "B200"),
    ("h20 141gb", "H20 141GB"), ("GH200", "GH200 480GB")])
def test_a_gpu_is_named_in_any_case_and_spacing_or_by_a_short_form_one_name_begins(given, name):
    assert gpus.gpu(given).name == name


@pytest.mark.parametrize(("given", "fix"), [
    ("H200", "GPU 'H200' could be 'H200 SXM 141GB' or 'H200 NVL'; give the full name, one of "
             "'H100 SXM 80GB'"),
    ("h100", "could be 'H100 SXM 80GB' or 'H100 PCIe'"), ("SXM", "unknown GPU 'SXM'"),
    ("", "unknown GPU ''"), ("H2", "unknown GPU 'H2'")])
def test_a_gpu_name_that_matches_no_or_several_entries_is_one_line_listing_them(given, fix):
    with pytest.raises(UserError, match=re.escape(fix)) as error:
        gpus.gpu(given)
    assert error.value.field == "gpu" and "'B200'" in error.value.message


def test_the_cli_takes_a_gpu_in_any_case(capsys):
    budgets = []
    for name in ("H200 SXM 141GB", "h200 sxm 141gb ", "H100 SXM 80GB"):
        assert main(["plan", "--gpu", name, "--format", "json"]) == 0
        budgets.append(json.loads(capsys.readouterr().out)["plans"][0]["budget_bytes"])
    assert budgets[0] == budgets[1] != budgets[2]
