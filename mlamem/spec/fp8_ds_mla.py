"""The fp8_ds_mla KV-cache format: 656 bytes per token.

Layout of one token (DeepSeek-V3.2 / GLM-5, d_qk = 576):
    bytes   0..511  512 float8_e4m3fn NoPE values (the latent)
    bytes 512..527  4 float32 scales, one per 128 NoPE values
    bytes 528..655  64 bfloat16 RoPE values
"""

import torch

NOPE_DIM = 512
ROPE_DIM = 64
GROUP = 128  # NoPE values per scale
NUM_SCALES = NOPE_DIM // GROUP
BYTES_PER_TOKEN = NOPE_DIM + 4 * NUM_SCALES + 2 * ROPE_DIM  # 656
SCALES_BYTE = NOPE_DIM  # where a token's fp32 scales start (byte 512)
ROPE_BYTE = NOPE_DIM + 4 * NUM_SCALES  # where a token's bf16 RoPE values start (byte 528)
FP8_MAX = torch.finfo(torch.float8_e4m3fn).max  # 448


def quantize(latent: torch.Tensor) -> torch.Tensor:
    """Quantize (n, 576) latent+RoPE rows into (n, 656) uint8 fp8_ds_mla rows."""
    n = latent.shape[0]
    nope = latent[:, :NOPE_DIM].float().reshape(n, NUM_SCALES, GROUP)
    scales = nope.abs().amax(dim=-1, keepdim=True).clamp(min=1e-6) / FP8_MAX
    fp8 = (nope / scales).to(torch.float8_e4m3fn).reshape(n, NOPE_DIM)
    rope = latent[:, NOPE_DIM:].to(torch.bfloat16).contiguous()
    return torch.cat(
        [fp8.view(torch.uint8), scales.reshape(n, NUM_SCALES).view(torch.uint8),
         rope.view(torch.uint8)],
        dim=-1,
    )


def dequantize(cache: torch.Tensor) -> torch.Tensor:
    """(..., 656) fp8_ds_mla bytes -> (..., 576) float32 latent+RoPE."""
    raw = cache.reshape(-1, BYTES_PER_TOKEN).view(torch.uint8)
    n = raw.shape[0]
    fp8 = raw[:, :NOPE_DIM].contiguous().view(torch.float8_e4m3fn).float()
    scales = raw[:, NOPE_DIM:NOPE_DIM + 4 * NUM_SCALES].contiguous().view(torch.float32)
    rope = raw[:, NOPE_DIM + 4 * NUM_SCALES:].contiguous().view(torch.bfloat16).float()
    nope = (fp8.reshape(n, NUM_SCALES, GROUP) * scales.unsqueeze(-1)).reshape(n, NOPE_DIM)
    return torch.cat([nope, rope], dim=-1).reshape(*cache.shape[:-1], NOPE_DIM + ROPE_DIM)
