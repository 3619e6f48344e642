"""Compare two results of one sweep (say, merged shards and the unsharded run), field by field.

    python3 scripts/compare_sweeps.py MERGED.json UNSHARDED.json

Both documents are normalised first (`mlamem.shards.normalised`: the per-run fields of
PER_RUN). Prints every field that differs. NVML readings are device-wide and vary from run to
run on a GPU, so they are reported but not compared. Exits 1 if any other field differs.
"""

import json
import sys
from pathlib import Path

from mlamem.shards import normalised

REPORTED_ONLY = ("nvml_",)  # a field whose last name starts with one of these


def differences(a: object, b: object, where: str = "") -> list[tuple[str, object, object]]:
    """(field, a's value, b's value) for every leaf that differs."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for key in sorted(a.keys() | b.keys())
                for d in differences(a.get(key), b.get(key), f"{where}.{key}".lstrip("."))]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [(where, f"{len(a)} items", f"{len(b)} items")]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True))
                for d in differences(x, y, f"{where}[{i}]")]
    return [] if a == b else [(where, a, b)]


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    a, b = (normalised(json.loads(Path(path).read_text())) for path in argv)
    compared, reported = [], []
    for field, x, y in differences(a, b):
        leaf = field.rsplit(".", 1)[-1]
        (reported if leaf.startswith(REPORTED_ONLY) else compared).append(f"{field}: {x} != {y}")
    for line in compared:
        print(f"differs: {line}")
    for line in reported:
        print(f"reported, not compared: {line}")
    verdict = "equal in every compared field" if not compared else f"{len(compared)} fields differ"
    print(f"{argv[0]} against {argv[1]}: {verdict}; {len(reported)} NVML reading(s) differ")
    return 1 if compared else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
