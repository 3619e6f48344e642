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
