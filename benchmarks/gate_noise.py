"""Run-to-run noise of the figures `mlamem gate` compares, to choose measured tolerances.

Give it the JSON of several `mlamem profile --format json` runs (any scenarios, one file per run
and scenario); it prints, as Markdown, min / median / max of every figure of every
(scenario, T, path) across the runs, and per metric the largest spread (max - min).

    python3 benchmarks/gate_noise.py runs/*.json
"""

import argparse
import json
import statistics
from collections import defaultdict

SCALARS = ("peak_allocated_bytes", "peak_reserved_bytes", "bytes_allocated_in_call",
           "nvml_peak_bytes", "wall_time_ms")  # the first three are gated; NVML and time are not


def collect(files: list[str]) -> tuple[dict, set]:
    """{(scenario, T, path): {metric: [value per run]}} and whether each file was measured."""
    values: dict = defaultdict(lambda: defaultdict(list))
    measured = set()
    for name in files:
        with open(name) as handle:
            data = json.load(handle)
        measured.add(data["measured"])
        for row in data["rows"]:
            case = values[row["scenario"], row["tokens"], row["path"]]
            for metric in SCALARS:
                if row[metric] is not None:
                    case[metric].append(row[metric])
            buffers: dict = defaultdict(int)
            for b in row["buffers"]:
                buffers[b["name"]] += b["requested_bytes"]
            for buffer, nbytes in buffers.items():
                case[f"buffer {buffer}"].append(nbytes)
    return values, measured


def _number(value: float) -> str:
    return f"{value:.3f}" if isinstance(value, float) and not value.is_integer() else f"{int(value)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="mlamem profile --format json outputs")
    args = parser.parse_args()
    values, measured = collect(args.files)
    runs = sorted({len(v) for case in values.values() for v in case.values()})
    print(f"### Run-to-run noise over {runs} runs per case ({len(args.files)} files, "
          f"{'measured' if measured == {True} else 'NOT all measured'})\n")
    print("| metric | cases | largest spread (max - min) | largest spread, % of median | "
          "cases with any spread |\n|---|---|---|---|---|")
    spreads: dict = defaultdict(list)
    for case in values.values():
        for metric, v in case.items():
            key = "per-buffer bytes" if metric.startswith("buffer ") else metric
            median = statistics.median(v)
            spreads[key].append((max(v) - min(v), (max(v) - min(v)) / median if median else 0.0))
    for metric, items in spreads.items():
        unit = " ms" if metric == "wall_time_ms" else " B"
        print(f"| {metric} | {len(items)} | {_number(max(s for s, _ in items))}{unit} | "
              f"{100 * max(r for _, r in items):.4f}% | {sum(s > 0 for s, _ in items)} |")
    print("\n| scenario | T | path | metric | min | median | max | spread |\n"
          "|---|---|---|---|---|---|---|---|")
    for (scenario, tokens, path), case in values.items():
        for metric, v in case.items():
            if metric.startswith("buffer ") and max(v) == min(v):
                continue  # equal in every run: listed in the summary only
            print(f"| {scenario} | {tokens} | {path} | {metric} | {_number(min(v))} | "
                  f"{_number(statistics.median(v))} | {_number(max(v))} | "
                  f"{_number(max(v) - min(v))} |")


if __name__ == "__main__":
    main()
