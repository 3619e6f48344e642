"""The fp8_ds_mla cache format, where adapters and scripts import it from: `mlamem.spec.fp8_ds_mla`
(the runtime layer, which the synthetic inputs use too)."""

from mlamem.spec.fp8_ds_mla import *  # noqa: F403
