"""The Triton kernel's acceptance checks over a measured and a predicted `profile --kernel triton`
JSON and FlashMLA's measured alloc column, one line per T: alloc equals FlashMLA's to the byte,
workspace equals the source PR's "after" column, workspace-full allocates at most 1 MiB, outputs
are bit-identical across paths, and measured equals predicted.

Usage: python3 scripts/triton_acceptance.py DIR  (DIR holds triton-profile.json,
triton-profile-predicted.json and flashmla-alloc.json)
"""

import json
import sys

PR_AFTER_GIB = {1024: 0.251, 8192: 2.006, 16384: 4.012, 32768: 8.023}  # the source PR's "after"
PATHS = ("alloc", "workspace", "workspace-full")


def rows(path: str) -> dict:
    with open(path) as handle:
        return {(r["tokens"], r["path"]): r for r in json.load(handle)["rows"]}


def main(folder: str) -> None:
    measured = rows(f"{folder}/triton-profile.json")
    predicted = rows(f"{folder}/triton-profile-predicted.json")
    flashmla = rows(f"{folder}/flashmla-alloc.json")
    for t, after in PR_AFTER_GIB.items():
        a, w, f = (measured[t, p]["peak_allocated_bytes"] for p in PATHS)
        reference = flashmla[t, "alloc"]["peak_allocated_bytes"]
        same = all(measured[t, p]["peak_allocated_bytes"] == predicted[t, p]["peak_allocated_bytes"]
                   for p in PATHS)
        print(f"T={t}: alloc {a} B == FlashMLA's {reference} B: {a == reference}; "
              f"workspace {w / 2**30:.3f} GiB vs {after}: {abs(w / 2**30 - after) <= 0.001}; "
              f"workspace-full {f} B <= 1 MiB: {f <= 2**20}; "
              f"outputs equal: {measured[t, 'alloc']['outputs_equal']}; "
              f"measured == predicted: {same}")


if __name__ == "__main__":
    main(sys.argv[1])
