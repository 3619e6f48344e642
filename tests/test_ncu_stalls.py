"""scripts/ncu_stalls.py on a report built in the wire format it reads: a metric-name table and
metric results referring to it by index, for two kernels."""

import struct
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parent.parent / "scripts" / "ncu_stalls.py"
STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def report(kernels: list[dict[str, float]]) -> bytes:
    names = [f"other__metric_{i}" for i in range(60)] + [STALL.format(r) for r in kernels[0]]
    table = b"".join(b"\x0a" + varint(len(n)) + n.encode() for n in names)
    results = b""
    for kernel in kernels:
        for reason, cycles in kernel.items():
            value = b"\x09" + struct.pack("<d", cycles)  # field 1, 64-bit: the double
            results += b"\x08" + varint(names.index(STALL.format(reason))) + b"\x12" + \
                varint(len(value)) + value
    return b"header" + table + b"\x00\x00" + results


def run(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(path)], capture_output=True, text=True)


def test_stalls_per_kernel_largest_first(tmp_path):
    path = tmp_path / "r.ncu-rep"
    path.write_bytes(report([{"selected": 1.0, "long_scoreboard": 2.25, "barrier": 1.5},
                             {"selected": 1.0, "long_scoreboard": 0.5, "barrier": 3.0}]))
    done = run(path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "kernel 1 of 2: 4.75 warp cycles per issued instruction"
    assert [line.split()[0] for line in lines[1:4]] == ["long_scoreboard", "barrier", "selected"]
    assert lines[4] == "kernel 2 of 2: 4.50 warp cycles per issued instruction"
    assert lines[5].split() == ["barrier", "3.00"]


def test_a_report_it_cannot_read_is_refused_in_one_line(tmp_path):
    wrong = tmp_path / "wrong.ncu-rep"
    wrong.write_bytes(report([{"selected": 0.5, "barrier": 1.0}]))  # selected must be 1.0
    empty = tmp_path / "empty.ncu-rep"
    empty.write_bytes(b"no metrics here")
    for path in (wrong, empty, tmp_path / "missing.ncu-rep"):
        done = run(path)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
