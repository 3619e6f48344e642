"""The kernel contract, where adapters and plug-ins import it from.

The contract itself is `mlamem.spec.kernel_api` (the spec layer, below the adapters); this module
re-exports it: `KernelContract`, which adapters implement, and `SparseDecodeKernel`, contract 1,
which plug-ins written before it implement and the registry adapts.
"""

from __future__ import annotations

from mlamem.spec.kernel_api import *  # noqa: F403
from mlamem.spec.kernel_api import KernelContract, LegacyKernel, SparseDecodeKernel  # noqa: F401
