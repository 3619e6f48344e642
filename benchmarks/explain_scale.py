"""`mlamem explain` on a large synthetic snapshot: wall time and peak memory, from process start.

Run on the machine to judge (no GPU needed):  python3 benchmarks/explain_scale.py [--events N]

The snapshot (`mlamem.testing.synthetic_snapshot`) is in the layout torch's `_dump_snapshot`
writes: about N trace events (default 2,000,000) of allocations of a few hundred sizes, each
with a stack of a few frames, freed after a while, in 8 segments; every 10,000 events one of
FlashMLA's calls, as `mlamem profile --predict --tokens 1024,8192 --snapshot` allocates them
(the sparse decode's alloc and workspace paths), is allocated, then freed. `mlamem explain`
runs on it in a fresh process (`--format json --output`); the figures are its wall time and
its peak resident memory (the child's maxrss), and the calls it found. Exits 1 if explain
fails, or takes more than --limit-s seconds (60).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mlamem.testing import synthetic_snapshot


def flashmla_calls(folder: Path) -> list[list[int]]:
    """The requested bytes of each call a predicted profile's snapshot holds, in order: the
    allocations between one free and the next."""
    shot = folder / "calls.pickle"
    subprocess.run([sys.executable, "-m", "mlamem", "profile", "--predict", "--tokens",
                    "1024,8192", "--snapshot", str(shot), "--format", "json", "--output",
                    str(folder / "calls.json")], check=True, capture_output=True)
    calls: list[list[int]] = [[]]
    for event in pickle.loads(shot.read_bytes())["device_traces"][0]:
        if event["action"] == "alloc":
            calls[-1].append(event["size"])
        elif event["action"] == "free_completed" and calls[-1]:
            calls.append([])
    return [c for c in calls if c]


def explain_in_child(shot: Path, out: Path) -> tuple[float, int, int]:
    """Wall seconds, peak RSS (bytes) and exit code of `mlamem explain SHOT` in a process."""
    start = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "mlamem", "explain", str(shot),
                              "--format", "json", "--output", str(out)],
                             stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    return wall, usage.ru_maxrss * 1024, os.waitstatus_to_exitcode(status)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--limit-s", type=float, default=60.0)
    parser.add_argument("--keep", type=Path, help="write the snapshot here (else a temp file)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        shot = args.keep or folder / "synthetic.pickle"
        made = time.perf_counter()
        data = synthetic_snapshot(args.events, calls=flashmla_calls(folder))
        events = len(data["device_traces"][0])
        shot.write_bytes(pickle.dumps(data))
        file_bytes = shot.stat().st_size
        del data
        made = time.perf_counter() - made
        wall, rss, code = explain_in_child(shot, folder / "explain.json")
        doc = json.loads((folder / "explain.json").read_text()) if code == 0 else {}
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}")
    print(f"snapshot: {events} events, {file_bytes / 2**20:.0f} MiB, made in {made:.1f} s")
    print(f"mlamem explain: {wall:.1f} s, peak RSS {rss / 2**20:.0f} MiB, exit {code}, "
          f"{len(doc.get('calls', []))} MLA calls found, peak {doc.get('peak_bytes')} B")
    return 0 if code == 0 and wall <= args.limit_s else 1


if __name__ == "__main__":
    sys.exit(main())
