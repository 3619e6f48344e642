"""The fp8_ds_mla KV-cache format: 656 bytes per token, quantized and dequantized on the CPU."""

import re

import torch

from mlamem.kernels.fp8_ds_mla import BYTES_PER_TOKEN, dequantize, quantize
from mlamem.kernels.own.e4m3_bf16 import E4M3_BITS_AS_BF16, E4M3_TO_BF16_PTX


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


def _run_bit_steps(ptx: str, word: int) -> dict[str, int]:
    """The prmt, shl and and lines of `ptx` run on a 32-bit register $2 = word (prmt with the
    PTX ISA's default mode: a selector nibble picks a byte of {b, a}, bit 3 set replicates that
    byte's sign); the registers they leave."""
    regs = {"$2": word, "0": 0}
    value = lambda operand: regs[operand] if operand in regs else int(operand, 0)  # noqa: E731
    for line in ptx.splitlines():
        found = re.match(r"\s*(prmt|shl|and)\.b32\s+(\w+),\s*(.+);", line)
        if not found:
            continue
        op, dest, operands = found.group(1), found.group(2), [o.strip() for o in found.group(3).split(",")]
        if op == "prmt":
            a, b, selector = (value(o) for o in operands)
            pool = [(a >> 8 * i) & 0xFF for i in range(4)] + [(b >> 8 * i) & 0xFF for i in range(4)]
            result = 0
            for i in range(4):
                nibble = (selector >> 4 * i) & 0xF
                byte = pool[nibble & 7]
                if nibble & 8:
                    byte = 0xFF if byte & 0x80 else 0
                result |= byte << 8 * i
        elif op == "shl":
            result = value(operands[0]) << value(operands[1])
        else:
            result = value(operands[0]) & value(operands[1])
        regs[dest] = result & 0xFFFFFFFF
    return regs


def test_e4m3_bits_moved_into_bf16_are_the_value_times_a_power_of_two():
    """The Gluon decode's dequantization PTX, before its bf16 multiply: every e4m3 byte but NaN,
    in every position of the register, becomes the bf16 of its value times 2^-120, exactly
    (subnormals, negative zero and the sign included)."""
    words = [b0 | (b0 ^ 0x5A) << 8 | ((b0 * 7) & 0xFF) << 16 | (0xFF - b0) << 24 for b0 in range(256)]
    for word in words:
        regs = _run_bit_steps(E4M3_TO_BF16_PTX, word)
        halves = [regs["lo"] & 0xFFFF, regs["lo"] >> 16, regs["hi"] & 0xFFFF, regs["hi"] >> 16]
        for position, half in enumerate(halves):
            byte = (word >> 8 * position) & 0xFF
            if byte & 0x7F == 0x7F:  # e4m3fn NaN: not in a quantized cache
                continue
            fp8 = torch.tensor([byte], dtype=torch.uint8).view(torch.float8_e4m3fn).double()
            bf16 = torch.tensor([half], dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
            assert torch.equal(bf16.double(), fp8 * E4M3_BITS_AS_BF16), (hex(byte), hex(half))
            assert bf16.signbit() == fp8.signbit(), hex(byte)
