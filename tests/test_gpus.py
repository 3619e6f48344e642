"""mlamem/gpus.py: GPUs by name, each figure with its source; a scenario moved to another GPU."""

import pytest

from mlamem import gpus, scenario
from mlamem.errors import UserError


def test_every_gpu_names_its_sources():
    for g in gpus.GPUS.values():
        assert g.smi_source and g.sm_source and (g.cuda_mib is None or g.cuda_source)
        assert g.cuda_mib is None or g.cuda_mib < g.smi_mib


def test_retarget_keeps_the_scenario_but_its_gpu():
    shipped = scenario.load("glm5-fp8-tp8")
    assert gpus.retarget(shipped, None) is shipped
    moved = gpus.retarget(shipped, "B200")
    assert (moved.gpu.name, moved.gpu.memory_mib, moved.gpu.sm_count) == ("B200", 183359, 148)
    assert moved.gpu.gpu_memory_utilization == shipped.gpu.gpu_memory_utilization
    assert scenario.to_dict(moved)["serving"] == scenario.to_dict(shipped)["serving"]
    with pytest.raises(UserError, match="unknown GPU 'H300'; known: 'H100 SXM 80GB'"):
        gpus.retarget(shipped, "H300")
