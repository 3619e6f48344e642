"""Non-torch device memory: what a process holds outside torch's caching allocator.

An engine counts it as device-used minus torch-reserved and charges it before sizing the KV
cache; the physical device then has that much less for torch. It belongs to the host GPU, the
software (torch, CUDA) and the kernel library the process loaded, not to the emulated target
GPU, so it lives as data (`non_torch.toml`, each figure with the command that measured it),
keyed by those, and never in a scenario.

It has three parts:
- `process_bytes`: what the device-wide reading holds beyond this process's own NVML figure:
  NVML-used growth the driver counts outside any process (seen before the CUDA context: 0 B on
  one H200 and 3.25 MiB on another, with the same driver and software);
- `context_bytes`: the CUDA context, the CUDA libraries and the kernel library once imported,
  in this process's own NVML figure;
- `modules`: device memory loaded lazily on the first launch of a kernel (CUDA_MODULE_LOADING=
  LAZY, the default), each with the launches that load it: on the H200 a step's first fill
  (`new_zeros`, `zero_`) adds 90 MiB, 62 of which FlashMLA's decode loads too when it comes
  first. The allocator model charges a module at the first launch that loads it, so the
  emulated step loses it from the physical device when the real one does. The first CUDA-graph
  capture of a process is such a launch too (`GRAPH_CAPTURE`): on the H200 it takes 70 MiB the
  allocator never sees, for every kernel, when the captured call has run eagerly before (its
  kernels' own modules loaded then, and charged at that launch). So is the first capture that
  brings a pool to N live graphs (`graph_step_launch`): on the H200 the driver's graph memory
  grows 2 MiB when a process first holds 9, 36 and 41 live graphs, whatever their sizes, and
  never again once it has (a later pool reuses it).

A measured repro-oom case charges this process's own figure (NVML's per-process used memory
less torch's reserved) where NVML lists the process, so another process's use moves nothing;
where it does not (a container's pid namespace) it charges the device-wide reading (NVML's used
memory, less what the others used at the start, less reserved). So the model and the measured
reading agree by construction, the model charges `context_bytes` and the modules loaded (what
the per-process reading holds), and keeps `process_bytes` on the physical device only: the
device-wide reading is `process_bytes` more. `calibrated` moves the charged part to a case's
measured figure; a device-wide one holds `process_bytes` as well, so it becomes 0 there.

`unallocatable_bytes` is the one fitted figure: near a full device, cudaMalloc fails that much
before NVML's used memory reaches the total (6 MiB on the H200: the smallest figure with which
both DeepSeek-V3.2 limits, 37032 and 45348 tokens, equal the measured ones; presumably page
tables and driver bookkeeping). It matters only when the target GPU is the whole host GPU.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, replace
from importlib import resources

DATA_FILE = "non_torch.toml"
GRAPH_CAPTURE = "torch.cuda.graph"  # the launch name of a CUDA-graph capture (SimulatedGraphs)


# The most live graphs the driver's steps were measured to (GLM-5's 51 FULL decode graphs): a
# pool of more may take steps the data does not hold
MEASURED_LIVE_GRAPHS = 51


def graph_steps_note(captures: int) -> str | None:
    """The line a result gives when its graphs outnumber MEASURED_LIVE_GRAPHS; else None."""
    if captures <= MEASURED_LIVE_GRAPHS:
        return None
    return (f"CUDA graphs: {captures} graphs, more than the {MEASURED_LIVE_GRAPHS} the host's graph "
            "memory was measured to: the driver's 2 MiB steps past them are not modelled, so a "
            "prediction's device figures may be that much low")


def graph_step_launch(live_graphs: int) -> str:
    """The launch name of a capture that brings one pool to `live_graphs` live graphs: the
    driver's graph memory grows in 2 MiB steps at some such counts, once per process."""
    return f"{GRAPH_CAPTURE}: live graph {live_graphs}"


@dataclass(frozen=True)
class LazyModule:
    """Device memory the first launch of any of `loaded_by` loads, once per process."""

    name: str
    bytes: int
    loaded_by: tuple[str, ...]  # aten op names ("aten.new_zeros"), "<kernel>.decode" or
    #                             GRAPH_CAPTURE (a process's first CUDA-graph capture)


@dataclass(frozen=True)
class NonTorchSetup:
    """The non-torch memory of one process on one host setup, in bytes."""

    gpu: str  # the host GPU as torch names it, e.g. "NVIDIA H200"
    gpu_memory_bytes: int  # its total memory as torch reports it: the physical limit
    torch: str  # torch.__version__
    cuda: str  # torch.version.cuda
    kernel: str  # the kernel library the process loaded (a --kernel name)
    kernel_version: str
    process_bytes: int
    context_bytes: int
    command: str  # what measured these figures
    measured_on: str  # the date
    modules: tuple[LazyModule, ...] = ()
    unallocatable_bytes: int = 0  # at the physical edge, what cudaMalloc cannot hand out
    #                               beyond NVML's non-torch reading (driver bookkeeping)
    assumed: str | None = None  # why this setup stands in for another; None when it matches
    held_bytes: int = 0  # what other ranks or processes hold on the device beyond this setup's
    #                      (a server log's figure, log_ledger; predicted cases only): the physical
    #                      device has that much less, and an engine reading its free memory sees it

    def __post_init__(self) -> None:
        modules = tuple(m if isinstance(m, LazyModule) else LazyModule(
            m["name"], m["bytes"], tuple(m["loaded_by"])) for m in self.modules)
        object.__setattr__(self, "modules", modules)  # TOML tables -> LazyModule

    def loaded_by(self, launch: str) -> list[LazyModule]:
        """The modules a first launch of `launch` loads (unless an earlier launch did)."""
        return [module for module in self.modules if launch in module.loaded_by]

    def describe(self) -> str:
        """One line: which setup the figures come from."""
        text = (f"{self.gpu}, torch {self.torch}, CUDA {self.cuda}, {self.kernel} "
                f"{self.kernel_version} (`{self.command}`, {self.measured_on})")
        return text if self.assumed is None else f"{text}; assumed: {self.assumed}"


def load_setups() -> list[NonTorchSetup]:
    """Every setup in the shipped data file."""
    data = tomllib.loads((resources.files("mlamem.runtime") / DATA_FILE).read_text())
    return [NonTorchSetup(**entry) for entry in data["setup"]]


def find_setup(kernel: str, gpu: str | None = None, torch_version: str | None = None,
               cuda: str | None = None, gpu_memory_bytes: int | None = None) -> NonTorchSetup:
    """The setup for `kernel` on this host; the closest one, labelled `assumed`, if none matches:
    the same GPU's (other software), else the nearest by memory.

    Without a GPU named (`gpu` None: no GPU here, or a prediction) the first setup of the
    kernel stands in: the prediction is then the emulation as that host would run it.
    """
    setups = load_setups()
    for setup in setups:
        if (setup.kernel, setup.gpu, setup.torch, setup.cuda) == (kernel, gpu, torch_version, cuda):
            return setup
    candidates = [s for s in setups if s.kernel == kernel] or setups
    same_gpu = [s for s in candidates if s.gpu == gpu]
    chosen = (same_gpu[0] if same_gpu else candidates[0] if gpu_memory_bytes is None else
              min(candidates, key=lambda s: abs(s.gpu_memory_bytes - gpu_memory_bytes)))
    if gpu is None:
        why = f"predicted as the {chosen.gpu} of this record would run it"
    else:
        why = f"no record for {kernel} on {gpu}, torch {torch_version}, CUDA {cuda}"
    if chosen.kernel != kernel:
        why += f"; {kernel} not measured, {chosen.kernel}'s figures used"
    if gpu_memory_bytes is not None:
        chosen = replace(chosen, gpu=gpu or chosen.gpu, gpu_memory_bytes=gpu_memory_bytes)
    return replace(chosen, assumed=why)


def local_setup(kernel: str) -> NonTorchSetup:
    """The setup for `kernel` on this process's CUDA device (`find_setup` with its name, torch,
    CUDA and total memory)."""
    import torch  # the caller runs on a GPU

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return find_setup(kernel, props.name, torch.__version__, torch.version.cuda,
                      props.total_memory)


MIB = 2**20


def physical_bytes(target_bytes: int, device_bytes: int) -> int:
    """The target GPU's physical memory: `device_bytes`, a recorded or local device's exact
    total, where the target names it in whole MiB (a scenario's memory_mib is CUDA's total
    rounded down: the H200's 143155 MiB is its 150109880320 B), else `target_bytes` itself."""
    return device_bytes if target_bytes // MIB == device_bytes // MIB else target_bytes


def target_setup(kernel: str, target_bytes: int, target_gpu: str | None = None,
                 host: NonTorchSetup | None = None) -> NonTorchSetup:
    """The non-torch setup with the target GPU as the physical device: the host itself where it
    is the target; else the record of the target's GPU (a record of `kernel` whose total the
    target gives in whole MiB); else `host` (measured: a larger GPU emulating the target) or,
    predicted, the nearest record of `kernel` by memory, with the target's memory as the
    physical limit and `assumed` saying which record stands in."""
    if host is not None and physical_bytes(target_bytes, host.gpu_memory_bytes) == \
            host.gpu_memory_bytes:
        return host
    setups = [s for s in load_setups() if s.kernel == kernel] or load_setups()
    same = [s for s in setups if physical_bytes(target_bytes, s.gpu_memory_bytes)
            == s.gpu_memory_bytes]
    if same:
        return replace(same[0], assumed=None if same[0].kernel == kernel else
                       f"{kernel} not measured, {same[0].kernel}'s figures used")
    target = _target_words(target_gpu, target_bytes)
    if host is not None:
        return replace(host, gpu_memory_bytes=target_bytes, assumed=_joined(
            host.assumed, f"no record of the {target} target: this {host.gpu}'s, with the "
            "target's memory as the physical device"))
    nearest = min(setups, key=lambda s: abs(s.gpu_memory_bytes - target_bytes))
    why = (f"no record of the {target} target: the nearest record, the {nearest.gpu}'s, with "
           "the target's memory as the physical device")
    if nearest.kernel != kernel:
        why += f"; {kernel} not measured, {nearest.kernel}'s figures used"
    return replace(nearest, gpu_memory_bytes=target_bytes, assumed=why)


def _target_words(target_gpu: str | None, target_bytes: int) -> str:
    size = f"{target_bytes / 2**30:.3f} GiB"
    return f"{target_gpu}'s {size}" if target_gpu else size


def _joined(first: str | None, second: str) -> str:
    return second if first is None else f"{first}; {second}"


def calibrated(setup: NonTorchSetup, modelled_bytes: int, measured_bytes: int, *,
               device_wide: bool = False) -> NonTorchSetup:
    """`setup` with its charged figure (`context_bytes`) moved so the model charges
    `measured_bytes` where it charged `modelled_bytes` (the same point of the same case).

    `device_wide`: the case charged the device-wide reading (NVML did not give its own figure),
    which holds what lies outside the process too: `process_bytes` becomes 0, so the physical
    device the model keeps to has that reading's memory less, no more."""
    return replace(setup, context_bytes=setup.context_bytes + measured_bytes - modelled_bytes,
                   process_bytes=0 if device_wide else setup.process_bytes)
