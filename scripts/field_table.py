"""reports/field's table of OOM reports, regenerated from their records: in the repo root,

    python3 scripts/field_table.py [--check]

Each `reports/field/oom-*.json` record names the public report, the user's serve command, GPU
and outcome, and its log (`oom-*.log`, the report's lines quoted). For each, the log is read
(mlamem/spec/server_log.py); where mlamem models the rank, `mlamem repro-oom --predict --serve
COMMAND --gpu GPU --log LOG` runs, and the table gives the memory held beyond mlamem's model
(derived on the path the user's server ran) and, per path with it held, the failing buffer,
mlamem's verdict (the ran path's beside the user's outcome) and the largest safe value.
The table goes between the README's `<!-- oom-table -->` markers; --check exits 1 where the
committed table differs. Startup-log records (other files) are not read here.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from mlamem.cli import main as mlamem
from mlamem.spec.server_log import read_log
from mlamem.spec.units import format_bytes

FIELD = Path(__file__).resolve().parent.parent / "reports" / "field"
START, END = "<!-- oom-table -->", "<!-- /oom-table -->"
HEADER = ("| report | engine | model, GPU | the log's OOM | with the log, per path | user's "
          "outcome | fix that worked |\n|---|---|---|---|---|---|---|")


def _gib(value: int | None) -> str:
    return "?" if value is None else format_bytes(value)


def _ledger(record: dict, log: Path) -> dict:
    """repro-oom --predict with the record's command and log: the result's `log` object."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder, "repro.json")
        args = ["repro-oom", "--predict", "--serve", record["command"], "--gpu", record["gpu"],
                "--log", str(log), "--format", "json", "--output", str(out)]
        if record.get("weights_per_rank"):
            args += ["--weights-per-rank", record["weights_per_rank"]]
        if mlamem(args) != 0:
            raise SystemExit(f"{log.name}: mlamem repro-oom failed")
        return json.loads(out.read_text())["log"]


def _with_log(record: dict, log: Path) -> str:
    if record["not_modelled"]:
        return f"not modelled: {record['not_modelled']}"
    ledger = _ledger(record, log)
    paths = ledger["paths"]
    cells = [f"held {_gib(paths[0]['held_bytes'])}, derived on {ledger['held_path']} (the path the "
             "server ran)"]
    for path in paths:
        buffer = path["failing_buffer"] or "no buffer of that size"
        cells.append(f"{path['case']}: {buffer}, verdict {path['verdict_with_log']}, largest safe "
                     f"step tokens {path['max_safe_tokens']}")
    return "; ".join(cells)


def row(record_file: Path) -> str:
    record = json.loads(record_file.read_text())
    log = FIELD / record["log"]
    read = read_log(str(log))
    oom = read.ooms[0]
    source = record["source"]
    link = f"[{record_file.stem}]({source})" if source.startswith("https://") else record_file.stem
    cells = [link, record["engine"], f"{record['model']}; {record['gpu']}",
             f"tried {_gib(oom.requested_bytes)}, {_gib(oom.free_bytes)} free of "
             f"{_gib(oom.total_bytes)}", _with_log(record, log), record["outcome"],
             record["fix"] or "none named"]
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def table() -> str:
    return "\n".join([HEADER, *(row(f) for f in sorted(FIELD.glob("oom-*.json")))])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 where the table is stale")
    args = parser.parse_args(argv)
    readme = FIELD / "README.md"
    text = readme.read_text()
    before, _, rest = text.partition(START)
    _, _, after = rest.partition(END)
    new = f"{before}{START}\n{table()}\n{END}{after}"
    if args.check:
        if new != text:
            print(f"{readme}: the OOM table is stale; run python3 scripts/field_table.py",
                  file=sys.stderr)
            return 1
        return 0
    readme.write_text(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
