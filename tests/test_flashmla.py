"""The FlashMLA adapter on the CPU: its allocation spec. On a GPU, tests/test_flashmla_gpu.py
checks the real kernel against it."""

from mlamem.kernels.flashmla import flashmla_allocations

GiB = 1024**3


def test_kernel_spec_accounts_for_split_kv_accumulators():
    """At T=32768 the spec holds out 2 GiB, lse 8 MiB, lse_accum 16 MiB, o_accum 8 GiB."""
    specs = {s.name: s.nbytes for s in flashmla_allocations((1, 32768, 64, 576), 512, 132)}
    assert specs == {"out": 2 * GiB, "lse": 8 << 20, "scheduler_metadata": 32, "num_splits": 8,
                     "lse_accum": 16 << 20, "o_accum": 8 * GiB}
    small = {s.name: s.shape for s in flashmla_allocations((1, 4, 64, 576), 512, 132)}
    assert small["o_accum"][0] == 1 + 132 // 4  # b + num_sm_parts


def test_split_count_below_64_heads():
    """Below 64 heads the split count is one 64-head tile's, max(132 // s_q // 1, 1), with no
    ZeroDivisionError; at 64 and 128 heads FlashMLA's SM90 sparse decode formula,
    max(132 // s_q // (h_q // 64), 1); the dense decode's ceil(h_q / 64) at s_q = 1."""
    from mlamem.kernels.flashmla import num_sm_parts

    assert [num_sm_parts(132, s_q, 8) for s_q in (1, 4, 200)] == [132, 33, 1]
    assert [num_sm_parts(132, 4, h_q) for h_q in (16, 32, 64, 128)] == [33, 33, 33, 16]
    assert [num_sm_parts(132, 1, h_q) for h_q in (16, 64, 128, 192)] == [132, 132, 66, 44]
    specs = {s.name: s.shape for s in flashmla_allocations((1, 4, 8, 576), 512, 132)}
    assert specs["scheduler_metadata"] == (33, 8) and specs["o_accum"][0] == 1 + 33
