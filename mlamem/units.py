"""Bytes are ints everywhere; these helpers only format and parse them at the edges."""

import re

from mlamem.errors import UserError

KiB = 1024
MiB = 1024**2
GiB = 1024**3

_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNIT = {"": 1, "B": 1, "K": KiB, "M": MiB, "G": GiB, "T": 1024 * GiB}


def gib(num_bytes: int) -> float:
    """Bytes as GiB (float), for display."""
    return num_bytes / GiB


def format_bytes(num_bytes: int) -> str:
    """Human-readable binary size, e.g. '2.25 GiB', '8.0 MiB', '512 B'."""
    sign = "-" if num_bytes < 0 else ""
    n = abs(num_bytes)
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size:
            return f"{sign}{n / size:.3f} {unit}"
    return f"{sign}{n} B"


def parse_bytes(text: str, option: str) -> int:
    """Parse '80GiB', '81559MiB', '1.5G' or a plain byte count into bytes."""
    match = _SIZE.match(text)
    if not match:
        raise UserError(f"{option}: cannot read {text!r} as a size; write e.g. 80GiB or 81559MiB")
    value, unit = match.groups()
    return int(float(value) * _UNIT[(unit or "").upper()[:1]])
