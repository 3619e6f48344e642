"""The PTX of the Gluon decode's FlashMLA-rounded dequantization (gluon_sparse_decode's
BF16_SCALE), apart from the kernel so that it imports without triton.

Four e4m3 bytes (register $2) become four bf16 of the same values times E4M3_BITS_AS_BF16,
exactly, subnormals included, times a bf16x2 factor ($3, $4): each byte's 7 exponent-and-mantissa
bits go to bf16 bits 10..4 and its sign to bit 15 (prmt replicating the sign into the byte above,
shl 4, and), then one mul.rn.bf16x2 per pair. Out: $0 (bytes 0, 1), $1 (bytes 2, 3).
tests/test_fp8_ds_mla.py runs the bit steps on the CPU for every byte.
"""

E4M3_BITS_AS_BF16 = 2.0**-120  # the bf16 those bits make is the e4m3 value times this
E4M3_TO_BF16_PTX = """
{
.reg .b32 lo, hi;
prmt.b32 lo, $2, 0, 0x9180;
prmt.b32 hi, $2, 0, 0xB3A2;
shl.b32 lo, lo, 4;
shl.b32 hi, hi, 4;
and.b32 lo, lo, 0x87F087F0;
and.b32 hi, hi, 0x87F087F0;
mul.rn.bf16x2 $0, lo, $3;
mul.rn.bf16x2 $1, hi, $4;
}
"""
