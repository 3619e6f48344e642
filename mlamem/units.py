"""Bytes are ints everywhere; these helpers only format them at the edges."""

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


_UNITS = {"": 1, "B": 1, "KIB": KiB, "MIB": MiB, "GIB": GiB, "TIB": 1024**4,
          "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}


def parse_bytes(text: str) -> int:
    """'80GiB' -> 85899345920; binary (KiB, MiB, GiB, TiB) and decimal (KB, MB, GB, TB) units.

    A bare number is bytes; 0 is allowed (callers that need a positive size check it).

    Raises ValueError naming the accepted forms.
    """
    number = text.strip().rstrip("BbIiKkMmGgTt ")
    unit = text.strip()[len(number):].strip().upper()
    try:
        value = float(number)
    except ValueError:
        value = None
    if value is None or unit not in _UNITS or value < 0:
        raise ValueError(f"{text!r} is not a size; write e.g. 80GiB, 81559MiB or 80GB")
    return int(value * _UNITS[unit])
