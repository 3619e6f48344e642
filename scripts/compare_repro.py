"""Compare a measured repro-oom result with a predicted one, field by field.

    python3 scripts/compare_repro.py MEASURED.json PREDICTED.json

Prints every differing field of every case, then the fields it skipped and why (what a
prediction cannot give: NVML readings, error texts, where and when each result was made); the
CUDA-graph figures, the device-wide ones included, are compared. Exits 1 if any compared field
differs.
"""

import json
import sys
from pathlib import Path

from mlamem.commands.repro import NOT_PREDICTED_FIELDS, NOT_PREDICTED_TOP, prediction_differences


def main(argv: list[str]) -> int:
    measured, predicted = (json.loads(Path(path).read_text()) for path in argv)
    differences = prediction_differences(measured, predicted)
    for line in differences:
        print(f"differs: {line}")
    cases = len(measured["cases"])
    print(f"{argv[0]} against {argv[1]}: {cases} cases, "
          f"{'equal' if not differences else f'{len(differences)} differences'}")
    skipped = [f"{name} ({why})" for name, why in NOT_PREDICTED_FIELDS.items()]
    print(f"skipped per case: {', '.join(skipped)}; skipped at the top: "
          f"{', '.join(NOT_PREDICTED_TOP)}")
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
