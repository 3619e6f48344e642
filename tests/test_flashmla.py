"""The FlashMLA adapter on the CPU: its allocation spec. On a GPU, tests/test_flashmla_gpu.py
checks the real kernel against it."""

from mlamem.kernels import FlashMLA

GiB = 1024**3


def test_kernel_spec_accounts_for_split_kv_accumulators():
    """At T=32768 the spec holds out 2 GiB, lse 8 MiB, lse_accum 16 MiB, o_accum 8 GiB."""
    specs = {s.name: s.nbytes for s in FlashMLA().allocations((1, 32768, 64, 576), 512, 132)}
    assert specs == {"out": 2 * GiB, "lse": 8 << 20, "scheduler_metadata": 32, "num_splits": 8,
                     "lse_accum": 16 << 20, "o_accum": 8 * GiB}
    small = {s.name: s.shape for s in FlashMLA().allocations((1, 4, 64, 576), 512, 132)}
    assert small["o_accum"][0] == 1 + 132 // 4  # b + num_sm_parts
