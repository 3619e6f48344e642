"""One case in its own process (the subprocess side of `repro`): measured on this GPU.

`python -P -m mlamem.engines REQUEST.json RESULT.json` reads a JSON request (the engine, the
scenario, the kernel, the budget and the case's key: `path`, `variant`, ...) and always writes a
JSON case, unless the process is killed.
"""

from __future__ import annotations

import json

from mlamem.engines import load_engine, request_engine
from mlamem.engines.base import Verdict
from mlamem.runtime import nvml
from mlamem.runtime.non_torch import local_setup, target_setup
from mlamem.spec import scenario


def run_request(request: dict) -> dict:
    """One case from a JSON request, measured on this GPU; a kernel that cannot run here makes
    an `error` case saying why."""
    from mlamem.kernels import DEFAULT_KERNEL, load_kernel
    from mlamem.runtime.measure import local_sm_count
    from mlamem.runtime.memory import CudaMemory

    used_before_cuda = nvml.used_by_uuid()  # before this process creates a CUDA context
    engine = load_engine(request_engine(request))
    chosen = scenario.from_dict(request["scenario"], request.get("source", "request"))
    budget = engine.budget_type(**request["budget"])
    key = request[engine.case_type.key_field]
    kernel = load_kernel(request.get("kernel", DEFAULT_KERNEL))()
    reason = kernel.unavailable_reason()
    if reason is not None:
        return engine.new_case(key, request["budget"], measured=True,
                               failure=f"cannot measure: {reason}").to_dict()
    memory = CudaMemory(used_before_cuda=used_before_cuda)
    memory.emulate_target(target_setup(kernel.name, budget.gpu_memory_bytes,
                                       host=local_setup(kernel.name)))
    return engine.emulate(memory, chosen, kernel, budget, key, sm_count=local_sm_count(),
                          seed=request.get("seed", 0)).to_dict()


def main(argv: list[str]) -> int:
    """`python -m mlamem.engines REQUEST.json RESULT.json`: always writes RESULT unless killed."""
    request_path, result_path = argv
    with open(request_path) as handle:
        request = json.load(handle)
    try:
        result = run_request(request)
    except Exception as exc:  # anything unforeseen still becomes a verdict
        result = {"verdict": Verdict.ERROR.value,
                  "failure": f"{type(exc).__name__}: {exc}".splitlines()[0]}
    with open(result_path, "w") as handle:
        json.dump(result, handle)
    return 0
