"""Warp stall reasons per kernel out of an Nsight Compute report (.ncu-rep), without ncu.

Usage: python3 scripts/ncu_stalls.py REPORT.ncu-rep

Prints, for each kernel profiled in the report (in profiling order), the cycles a warp spent in
each stall reason per issued instruction (ncu's `smsp__average_warps_issue_stalled_*_per_issue_
active.ratio`, the Warp State Statistics section's chart), largest first, and their sum, which
is ncu's "Warp Cycles Per Issued Instruction".

The report is a stream of protobuf messages: a string table of metric names, and metric results
that refer to a name by its index (field 1) with a value message (field 2) holding a double. This
reads just that, by the wire format, with no schema. It checks what it read: the `selected`
reason is 1.0 per issued instruction by definition; a report where it is not is refused.
"""

import struct
import sys
from pathlib import Path

PREFIX = b"smsp__average_warps_issue_stalled_"
SUFFIX = b"_per_issue_active.ratio"
NAME_TAG = 0x0A  # field 1, length-delimited: one entry of the string table


def varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, at


def encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def string_table(data: bytes) -> list[bytes]:
    """The run of consecutive table entries that holds the first stall metric's name."""
    first = data.find(PREFIX)
    if first < 0:
        raise ValueError("no warp-stall metrics in this report: profile with --set full")
    for start in range(max(0, first - 1_000_000), first):
        names, at = [], start
        while at < len(data) and data[at] == NAME_TAG:
            length, body = varint(data, at + 1)
            if length > 512 or body + length > len(data):
                break
            names.append(data[body:body + length])
            at = body + length
        if at > first and len(names) > 50:
            return names
    raise ValueError("could not find the report's metric-name table")


def values(data: bytes, index: int) -> list[float]:
    """Every double recorded for the metric at `index` of the table, in file order."""
    key = b"\x08" + encode_varint(index) + b"\x12"
    found, at = [], data.find(key)
    while at >= 0:
        length, body = varint(data, at + len(key))
        inner = data[body:body + length]
        if len(inner) >= 9 and inner[0] & 7 == 1:  # a 64-bit field: the double
            found.append(struct.unpack("<d", inner[1:9])[0])
        at = data.find(key, at + 1)
    return found


def main(path: str) -> int:
    try:
        data = Path(path).read_bytes()
        names = string_table(data)
    except (OSError, ValueError) as exc:
        print(f"ncu_stalls.py: {path}: {exc}", file=sys.stderr)
        return 2
    reasons = {name[len(PREFIX):-len(SUFFIX)].decode(): values(data, i)
               for i, name in enumerate(names) if name.startswith(PREFIX) and name.endswith(SUFFIX)}
    kernels = len(reasons.get("selected", []))
    if not kernels or any(abs(v - 1.0) > 1e-3 for v in reasons["selected"]):
        print(f"ncu_stalls.py: {path}: the 'selected' reason is not 1.0 per issue: this report's "
              "layout is not the one this script reads", file=sys.stderr)
        return 2
    for kernel in range(kernels):
        row = {reason: found[kernel] for reason, found in reasons.items() if len(found) == kernels}
        print(f"kernel {kernel + 1} of {kernels}: {sum(row.values()):.2f} warp cycles per issued "
              "instruction")
        for reason, cycles in sorted(row.items(), key=lambda item: -item[1]):
            if cycles >= 0.005:
                print(f"  {reason:<22} {cycles:6.2f}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__.split("\n\n")[1])
    sys.exit(main(sys.argv[1]))
