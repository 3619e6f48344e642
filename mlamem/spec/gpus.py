"""GPUs by name: the memory CUDA reports, what nvidia-smi shows, and the SM count, each figure with
where it comes from. `--gpu NAME` reads a scenario's [gpu] from here: on `mlamem scenarios --serve`
and on every command that runs a scenario (models/overrides.py); without it a command keeps the
scenario's own [gpu].

nvidia-smi's memory.total is one figure per board; CUDA's total (cudaMemGetInfo, torch's
total_memory) is a few hundred MiB lower and moves with the driver (three public H100 logs: 81082,
81089 and 81090 MiB). A scenario's memory_mib takes nvidia-smi's figure where no figure was measured
here; the H100's and the H200's are CUDA's totals measured on this project's H100 and H200, as
the shipped scenarios have them. vLLM budgets against CUDA's total, and a target no larger than
CUDA's total can be measured on that GPU (nvidia-smi's H100 figure is 480 MiB more than an H100 holds).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from mlamem.spec.errors import UserError

if TYPE_CHECKING:
    from mlamem.spec.scenario import Scenario

# Public logs were found with the search tools' find_string over public repositories; the quoted
# text is the log line itself.
SMI_LOG = "nvidia-smi --query-gpu=name,memory.total in a public log: "
TORCH_LOG = "torch.cuda.get_device_properties in a public log: "


@dataclass(frozen=True)
class GPU:
    name: str
    smi_mib: int  # nvidia-smi memory.total
    sm_count: int
    smi_source: str
    sm_source: str
    cuda_mib: int | None = None  # CUDA's total (torch total_memory), where a source gives one
    cuda_source: str = ""
    measured_mib: int | None = None  # CUDA's total measured on this project's GPU

    @property
    def memory_mib(self) -> int:
        """The scenario's [gpu].memory_mib: measured here, else nvidia-smi's."""
        return self.measured_mib or self.smi_mib

    def memory_note(self) -> str:
        if self.measured_mib:
            return (f"memory_mib {self.measured_mib} is CUDA's total measured on this project's "
                    f"{self.name} (nvidia-smi shows {self.smi_mib} MiB)")
        cuda = (f"; CUDA reports about {self.cuda_mib} MiB (driver-dependent), which vLLM budgets "
                "against" if self.cuda_mib else "")
        return f"memory_mib {self.smi_mib} is nvidia-smi's memory.total{cuda}"


_H200_MEASURED = ("reports/repro-oom-h200/README.md and gpu.txt: NVIDIA H200, 580.159.04, 143771 MiB "
                  "(nvidia-smi); torch total_memory 143155.9 MiB (scenarios/deepseek-v32-fp8-tp8.toml)")

_H100_MEASURED = ("reports/repro-oom-h100/h100/gpu.txt: NVIDIA H100 80GB HBM3, 580.159.04, 81559 MiB "
                  "(nvidia-smi); torch total_memory 85017493504 B = 81079 MiB, 132 SMs (public logs: "
                  "81082 to 81090 MiB with other drivers)")

GPUS = {g.name: g for g in (
    GPU("H100 SXM 80GB", 81559, 132, SMI_LOG + "'NVIDIA H100 80GB HBM3, 81559 MiB'",
        TORCH_LOG + "'NVIDIA H100 80GB HBM3', total_memory=81089MB, multi_processor_count=132",
        cuda_mib=81079, cuda_source=_H100_MEASURED, measured_mib=81079),
    GPU("H100 PCIe", 81559, 114, SMI_LOG + "'NVIDIA H100 PCIe, 81559 MiB'",
        "NVIDIA LaunchPad H100 MIG guide (docs.nvidia.com/launchpad/ai/h100-mig): 114 SMs per GPU"),
    GPU("H800", 81559, 132, SMI_LOG + "'NVIDIA H800, 81559 MiB, 570.158.01'",
        "not found in a public log: the H800 is the H100 SXM's GH100 part with less NVLink; "
        "132 as the H100 SXM"),
    GPU("H20", 97871, 78, SMI_LOG + "'NVIDIA H20, 97871 MiB'",
        TORCH_LOG + "'NVIDIA H20', total_memory=97285MB, multi_processor_count=78",
        cuda_mib=97285, cuda_source=TORCH_LOG + "total_memory=97285MB"),
    GPU("H20 141GB", 143771, 78, "a public record of 8 x H20-3e (nvidia-smi names the 141 GB H20 "
        "'NVIDIA H20-3e'): gpu_name 'NVIDIA H20-3e', gpu_memory_mib 143771; another: 'GPU: "
        "NVIDIA H20-3e, 143771 MiB/GPU'",
        "a public record: 'device': 'NVIDIA H20-3e', 'compute_capability': (9, 0), 'sm_count': "
        "78 (the 96 GB H20's 78 too)"),
    GPU("GH200 480GB", 97871, 132, "a public note: '`nvidia-smi` reports `NVIDIA GH200 480GB, "
        "97871 MiB`' (the 96 GB HBM3 board; 480GB is the superchip's memory with Grace's)",
        "a public record: 'The GPU is an NVIDIA GH200 480GB (sm_90, 132 SMs)'"),
    GPU("H200 SXM 141GB", 143771, 132, _H200_MEASURED,
        "this project's H200: reports/native-h200/bench.log 'gpu NVIDIA H200, sm_count 132'",
        cuda_mib=143155, cuda_source=_H200_MEASURED, measured_mib=143155),
    GPU("H200 NVL", 143771, 132, SMI_LOG + "'NVIDIA H200 NVL, 143771 MiB, 132 SMs, compute "
        "capability 9.0'", SMI_LOG + "the same line: 132 SMs"),
    GPU("B200", 183359, 148, SMI_LOG + "'NVIDIA B200, 183359 MiB, 580.126.09'",
        TORCH_LOG + "'NVIDIA B200', total_memory=182631MB, multi_processor_count=148",
        cuda_mib=182631, cuda_source=TORCH_LOG + "total_memory=182631MB (182642 in another)"),
    GPU("A100 80GB", 81920, 108, SMI_LOG + "'NVIDIA A100-SXM4-80GB, 81920 MiB'",
        "NVIDIA A100 Tensor Core GPU Architecture whitepaper: 108 SMs"),
)}

# Compute capability by GPU name (NVIDIA's CUDA GPUs table, developer.nvidia.com/cuda-gpus; the
# H200 NVL's, the H20 141GB's (9, 0) and the GH200's sm_90 also in their public records above):
# which kernels a target runs (KernelContract.target_reason)
COMPUTE_CAPABILITY = {"H100 SXM 80GB": "9.0", "H100 PCIe": "9.0", "H800": "9.0", "H20": "9.0",
                      "H20 141GB": "9.0", "GH200 480GB": "9.0", "H200 SXM 141GB": "9.0",
                      "H200 NVL": "9.0", "B200": "10.0", "A100 80GB": "8.0"}


def compute_capability(name: str) -> str | None:
    """The compute capability of the GPU named exactly `name` (a scenario's [gpu].name); None
    for a GPU this table does not hold."""
    return COMPUTE_CAPABILITY.get(name)


def _words(name: str) -> list[str]:
    return name.casefold().split()


def gpu(name: str) -> GPU:
    """The GPU named `name`, in any case and spacing (`h200 sxm 141gb `), or by a short form
    that begins exactly one name's words (`a100`, `H200 SXM`); one line listing the known ones
    otherwise."""
    words = _words(name)
    exact = [g for n, g in GPUS.items() if "".join(_words(n)) == "".join(words)]
    begun = [g for n, g in GPUS.items() if words and _words(n)[:len(words)] == words]
    if exact or len(begun) == 1:
        return (exact or begun)[0]
    known = ", ".join(repr(n) for n in GPUS)
    if begun:
        raise UserError(f"GPU {name!r} could be {' or '.join(repr(g.name) for g in begun)}; "
                        f"give the full name, one of {known}", field="gpu")
    raise UserError(f"unknown GPU {name!r}; known: {known}", field="gpu")


def retarget(scenario: Scenario, name: str | None) -> Scenario:
    """`scenario` sized for the GPU named `name` (its memory and SM count; the engine's
    utilization kept), validated as a file is; None keeps the scenario's own GPU."""
    from mlamem.spec import scenario as _scenario  # pydantic: loaded where a scenario is

    if name is None:
        return scenario
    target = gpu(name)
    data = _scenario.to_dict(scenario)
    data["gpu"] = {**data["gpu"], "name": target.name, "memory_mib": target.memory_mib,
                   "sm_count": target.sm_count}
    return _scenario.from_dict(data, scenario.source or scenario.name)
