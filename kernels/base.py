"""The kernel contract, where adapters and plug-ins import it from.

The contract itself is `mlamem.kernel_api` (the spec layer, below the adapters); this module
re-exports it and adds `SparseDecodeKernel`, the class every adapter subclasses: the contract
with its default input maker, which draws valid synthetic inputs with mlamem's runtime.
"""

from __future__ import annotations

from mlamem.kernel_api import *  # noqa: F403
from mlamem.kernel_api import KernelContract, Problem


class SparseDecodeKernel(KernelContract):
    """Adapter for one MLA kernel implementation (its operations: `operations`)."""

    def make_inputs(self, problem: Problem, heads: int, device, seed: int = 0):
        """Valid synthetic inputs for `problem`: (q in rows layout at `heads` heads, OpInputs)."""
        from mlamem.inputs import make_op_inputs

        return make_op_inputs(problem, heads, device, seed)
