"""The fp8_ds_mla KV-cache format: 656 bytes per token, quantized and dequantized on the CPU."""

import torch

from mlamem.kernels.fp8_ds_mla import BYTES_PER_TOKEN, dequantize, quantize


def test_quantized_token_layout(seed):
    """656 bytes: fp8 NoPE, then 4 fp32 scales (amax/448 per 128), then exact bf16 RoPE."""
    latent = torch.randn(16, 576, generator=torch.Generator().manual_seed(seed))
    cache = quantize(latent)
    assert cache.shape == (16, BYTES_PER_TOKEN) and cache.dtype == torch.uint8
    scales = cache[:, 512:528].contiguous().view(torch.float32)
    expected = latent[:, :512].reshape(16, 4, 128).abs().amax(-1) / 448
    torch.testing.assert_close(scales, expected)
    rope = cache[:, 528:].contiguous().view(torch.bfloat16)
    assert torch.equal(rope, latent[:, 512:].to(torch.bfloat16))


def test_dequantize_round_trips_within_fp8_precision(seed):
    """Dequantized NoPE is within fp8 e4m3 precision of the input."""
    latent = torch.randn(64, 576, generator=torch.Generator().manual_seed(seed))
    back = dequantize(quantize(latent))
    error = (back[:, :512] - latent[:, :512]).norm() / latent[:, :512].norm()
    assert error < 0.05, f"seed {seed}"
