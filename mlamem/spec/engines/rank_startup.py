"""What a tensor-parallel rank's device holds at its engine's startup reading, from public logs.

A rank of TP > 1 sets up NCCL's communicators and the custom all-reduce's buffers before its
engine reads the device's free memory (vLLM 0.11+ `v1/worker/gpu_worker.py` `init_device` takes
its init snapshot after `init_worker_distributed_environment`; SGLang's `model_runner.py`
`load_model` logs "Load weight begin. avail mem", the `pre` its pool is sized from), so that
memory is outside what the engine budgets, and mlamem's one-process rank holds none of it. Where
the user gives no log of their own (`--log`), a public startup line of the nearest layout stands
in: each record (`rank-startup-records.json`) is one line, verbatim, read by the reader of a
user's log (`spec/server_log.py`), with its address, engine, version, GPU and TP size.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import NamedTuple

from mlamem.spec.gpus import gpu
from mlamem.spec.server_log import ServerLog, parse_lines

DATA_FILE = "rank-startup-records.json"
ENGINES = ("vllm", "sglang")  # the engines whose ranks the records stand in for
MiB = 2**20


@dataclass(frozen=True)
class StartupRecord:
    """One public startup line of a TP rank, and where it was found."""

    engine: str  # "vllm" or "sglang"
    version: str
    gpu: str  # a name of spec/gpus.py
    tensor_parallel: int
    model: str
    source: str  # the address in a few words, for a terminal's width
    address: str
    line: str  # verbatim

    @property
    def total_bytes(self) -> int:
        """The record's GPU's total memory as CUDA reports it, for a line that prints none."""
        return gpu(self.gpu).memory_mib * MiB

    def log(self) -> ServerLog:
        """The line read as a user's log is, its source named in a few words."""
        return parse_lines([self.line], source=self.source)

    def describe(self) -> str:
        return (f"{self.engine} {self.version} at TP{self.tensor_parallel} on {self.gpu} "
                f"({self.model}; {self.source})")


class StandIn(NamedTuple):
    """The record standing in for a rank's own log, and why it was chosen."""

    record: StartupRecord
    why: str


@cache
def records() -> tuple[StartupRecord, ...]:
    """Every shipped record."""
    data = json.loads((resources.files("mlamem.spec.engines") / DATA_FILE).read_text())
    return tuple(StartupRecord(**record) for record in data["records"])


def stand_in(engine: str, tensor_parallel: int) -> StandIn | None:
    """The record that stands in for a rank of `engine` at `tensor_parallel`, and why it was
    chosen: of the records of at least that many ranks (a rank's communicators grow with its
    peers), the engine's own where it has one, the fewest ranks of them; where every record has
    fewer ranks, the engine's largest, a lower bound. None for one rank: it sets up no
    communicator."""
    if tensor_parallel <= 1:
        return None
    own = [r for r in records() if r.engine == engine] or list(records())
    at_least = [r for r in records() if r.tensor_parallel >= tensor_parallel]
    candidates = [r for r in at_least if r.engine == engine] or at_least
    if candidates:
        chosen = min(candidates, key=lambda r: r.tensor_parallel)
        size = ("the same TP size" if chosen.tensor_parallel == tensor_parallel
                else f"the fewest ranks recorded above TP{tensor_parallel}")
        engine_note = "" if chosen.engine == engine else f"; no {engine} record of that size"
        return StandIn(chosen, f"{size}{engine_note}")
    chosen = max(own, key=lambda r: r.tensor_parallel)
    return StandIn(chosen, f"the most ranks recorded, fewer than TP{tensor_parallel}: a lower "
                           "bound of what this rank holds")
