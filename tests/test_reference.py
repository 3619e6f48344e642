"""The plain-torch reference decode against the definition of sparse attention, on the CPU."""

import math

import torch

from mlamem.kernels import Reference
from mlamem.kernels.fp8_ds_mla import BYTES_PER_TOKEN, dequantize, quantize
from mlamem.operations.sparse_decode import run_kernel


def naive_decode(q, kv, indices, sm_scale):
    """Per-query, per-head float64 loop: the definition of sparse attention."""
    s_q, h_q, _ = q.shape
    out = torch.zeros(s_q, h_q, 512, dtype=torch.float64)
    lse = torch.full((h_q, s_q), float("-inf"), dtype=torch.float64)
    for t in range(s_q):
        keys = [kv[i] for i in indices[t].tolist() if i >= 0]
        if not keys:
            continue
        k = torch.stack(keys).double()
        for h in range(h_q):
            scores = (k @ q[t, h].double()) * sm_scale
            lse[h, t] = torch.logsumexp(scores, 0)
            out[t, h] = torch.softmax(scores, 0) @ k[:, :512]
    return out, lse


def test_reference_matches_the_definition(seed):
    """The reference gives the naive loop's out and lse, invalid (-1) indices skipped."""
    gen = torch.Generator().manual_seed(seed)
    kv = quantize(torch.randn(128, 576, generator=gen)).view(2, 64, 1, BYTES_PER_TOKEN)
    q = torch.randn(1, 5, 64, 576, generator=gen).to(torch.bfloat16)
    indices = torch.randint(0, 128, (1, 5, 32), dtype=torch.int32, generator=gen)
    indices[0, :, ::3] = -1
    indices[0, 4] = -1  # a query with no valid key
    out, lse = run_kernel(Reference(), q, kv, indices, sm_scale=1 / math.sqrt(192), d_v=512)
    ref_out, ref_lse = naive_decode(q[0].float(), dequantize(kv).reshape(128, 576), indices[0],
                                    1 / math.sqrt(192))
    torch.testing.assert_close(out[0].double(), ref_out, rtol=1e-2, atol=1e-2,
                               msg=lambda detail: f"{detail} (seed {seed})")
    torch.testing.assert_close(lse[0].double(), ref_lse, rtol=1e-5, atol=1e-5,
                               msg=lambda detail: f"{detail} (seed {seed})")
    assert torch.equal(out[0, 4], torch.zeros_like(out[0, 4]))
