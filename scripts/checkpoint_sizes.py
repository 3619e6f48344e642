"""Print mlamem's weight count against each published checkpoint size (checkpoints.json) as a
Markdown table; with --write, recount each record's counted first.

    python scripts/checkpoint_sizes.py [--write]
"""

import argparse
import json
from pathlib import Path

from mlamem.spec.files import write_atomic
from mlamem.spec.models import checkpoints


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="recount counted in checkpoints.json")
    args = parser.parse_args()
    items = checkpoints.records()
    if args.write:
        items = checkpoints.recounted(items)
        path = Path(checkpoints.__file__).with_name(checkpoints.FILE)
        write_atomic(path, json.dumps(items, indent=1) + "\n")
    print(checkpoints.table(items))


if __name__ == "__main__":
    main()
