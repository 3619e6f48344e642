"""Bytes are ints everywhere; these helpers only format them at the edges."""

import re

from mlamem.spec.errors import UserError

KiB = 1024
MiB = 1024**2
GiB = 1024**3


def gib(num_bytes: int) -> float:
    """Bytes as GiB (float), for display."""
    return num_bytes / GiB


def format_bytes(num_bytes: int) -> str:
    """Human-readable binary size, e.g. '2.250 GiB', '8.000 MiB', '32 B'."""
    sign = "-" if num_bytes < 0 else ""
    n = abs(num_bytes)
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size:
            return f"{sign}{n / size:.3f} {unit}"
    return f"{sign}{n} B"


_UNITS = {"B": 1, "KIB": KiB, "MIB": MiB, "GIB": GiB, "TIB": 1024**4,
          "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}

# The largest size any input may name or imply: 256 TiB, over a thousand times the memory of any
# GPU (an H200 has 141 GB) and far below the 2**63 bytes where torch's size arithmetic overflows.
MAX_BYTES = 2**48
# The most tokens any count may name: engines and kernels count tokens in int32 (FlashMLA's s_q,
# the int32 KV-token indices of the sparse decode).
MAX_TOKENS = 2**31 - 1

_SIZE = re.compile(r"(?P<number>[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)\s*(?P<unit>[A-Za-z]*)")


def format_huge(num_bytes: int) -> str:
    """A size too large for `format_bytes`' GiB, in TiB, e.g. '4,096 TiB' (for error messages)."""
    return f"{num_bytes / 1024**4:,.0f} TiB" if num_bytes >= 1024**4 else format_bytes(num_bytes)


def parse_bytes(text: str) -> int:
    """'80GiB' -> 85899345920; binary (KiB, MiB, GiB, TiB) and decimal (KB, MB, GB, TB) units.

    A number needs its unit ('B' for bytes); only 0 may go without one. Callers that need a
    positive size check it. Sizes above MAX_BYTES (256 TiB) are refused: no device has them.

    Raises ValueError naming the accepted forms.
    """
    match = _SIZE.fullmatch(text.strip())
    hint = "write e.g. 80GiB, 81559MiB or 80GB"
    if match is None or match["unit"].upper() not in _UNITS | {"": 1}:
        raise ValueError(f"{text!r} is not a size; {hint}")
    value, unit = float(match["number"]), match["unit"].upper()
    if not unit:
        if value != 0:
            raise ValueError(f"{text!r} has no unit; {hint} ({match['number']}B for bytes)")
        return 0
    if value * _UNITS[unit] > MAX_BYTES:  # also 1e400 (inf) and the like
        raise ValueError(f"{text!r} is more than {format_huge(MAX_BYTES)}, beyond any device; {hint}")
    return round(value * _UNITS[unit])


def check_fraction(value: float, field: str, *, one_allowed: bool = True) -> None:
    """A fraction of memory, in (0, 1] (`one_allowed`) or (0, 1): else a UserError naming
    `field`. Light, so a face can refuse a bad value before torch loads."""
    if not (0 < value <= 1 if one_allowed else 0 < value < 1):
        interval = "(0, 1]" if one_allowed else "(0, 1)"
        raise UserError(f"{value} is outside {interval}; pass a fraction such as 0.85", field=field)
