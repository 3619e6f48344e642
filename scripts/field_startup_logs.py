"""Predict each public startup log of reports/field/startup-logs.toml from its command alone and
write the comparison table, reports/field/startup-logs.md: in the repo root,

    python scripts/field_startup_logs.py [--check]

For each record with a GPU, from the record's command (`serve`, where the source launched the
server another way than mlamem reads) at the record's engine version (`--engine-version`, vLLM
only; absent: mlamem's default):
- `mlamem repro-oom --serve COMMAND --gpu GPU --predict --paths alloc`: the KV cache the rank
  gets (tokens and bytes; the engine's rank, vLLM's or SGLang's, as mlamem emulates it), and
- `mlamem plan --serve ...`: the pool without a reserve (the utilization's share less the
  weights), the only figure for a model repro-oom does not replay (dense MLA);
- the KV cache's bytes per token on one rank (the predicted bytes over the predicted tokens),
  against the logged GiB over the logged tokens (a range: the GiB figure is rounded to 0.01);
- the indexer cache's row width, where a log shows the cache's shape.
repro-oom's ledger of a TP rank holds a public TP rank's startup memory beside it
(spec/engines/rank_startup.py), its KV cache with it the column after (SGLang's pool shrinks
with it; vLLM's budget leaves it outside). The logged figure is compared with the first
prediction there is (repro-oom's with that memory held, repro-oom's, else plan's):
tokens where the log gives tokens (or blocks), else GiB; within 2% it agrees, else the row gives
the gap in GiB of KV cache and the record's `rest` names what accounts for it. Where mlamem
refuses the command, the row gives its one-line reason. --check exits 1 where the committed
table differs from the one the records give now.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tomllib
from pathlib import Path

from mlamem.spec.engines.dsa_cache import indexer_key_bytes
from mlamem.spec.errors import UserError
from mlamem.spec.serve_command import from_command

FIELD = Path(__file__).resolve().parents[1] / "reports" / "field"
RECORDS, TABLE = FIELD / "startup-logs.toml", FIELD / "startup-logs.md"
GiB = 1024**3
AGREES_WITHIN = 0.02  # agreement: within 2% of the logged KV cache


def mlamem(args: list[str]) -> tuple[dict | None, list[str]]:
    """One mlamem command's JSON result (None where it refuses) and its stderr lines; `-P`: the
    installed mlamem, never the checkout's folder of that name (a plain install's CI)."""
    done = subprocess.run([sys.executable, "-P", "-m", "mlamem", *args, "--format", "json"],
                          capture_output=True, text=True)
    lines = done.stderr.splitlines()
    return (json.loads(done.stdout) if done.returncode == 0 else None), lines


def refusal(lines: list[str]) -> str:
    """mlamem's one-line reason for refusing a command."""
    errors = [line.removeprefix("mlamem: error: ") for line in lines if "error:" in line]
    return (errors or lines or ["no reason printed"])[-1].removeprefix("--serve: ")


def not_modelled(lines: list[str]) -> str:
    notes = [line.split("not modelled: ", 1)[1] for line in lines if "note: not modelled:" in line]
    return notes[0] if notes else ""


def serve_args(record: dict, command: str) -> list[str]:
    args = ["--serve", record.get("serve", record["command"]), "--gpu", record["gpu"]]
    if record.get("engine_version"):
        args += ["--engine-version", record["engine_version"]]
    return [command, *args]


def predict(record: dict) -> dict:
    """repro-oom's and plan's KV cache for the record's command: tokens, bytes and the source,
    or why mlamem predicts nothing."""
    if not record.get("gpu"):
        return {"refused": "the source names no GPU"}
    repro, lines = mlamem([*serve_args(record, "repro-oom"), "--predict", "--paths", "alloc"])
    plan, plan_lines = mlamem(serve_args(record, "plan"))
    found = {"not_modelled": not_modelled(lines or plan_lines)}
    if repro is not None:
        case = repro["cases"][0]
        found["repro"] = (case["kv_cache_tokens"], case["kv_cache_bytes"])
        ledger = repro.get("log")  # a TP rank's: a public TP rank's startup memory held
        held = ledger["paths"][0]["kv_cache_tokens_with_log"] if ledger else None
        if held is not None and case["kv_cache_tokens"]:
            found["repro_held"] = (held, held * case["kv_cache_bytes"] // case["kv_cache_tokens"])
    else:
        found["repro_refused"] = refusal(lines)
    if plan is not None:
        pool = plan["plans"][0]
        found["plan"] = (pool["pool_tokens_without_reserve"], pool["budget_bytes"])
    elif repro is None:
        found["refused"] = refusal(plan_lines)
    return found


def logged_tokens(record: dict) -> int | None:
    if "logged_blocks" in record:
        return record["logged_blocks"] * record["logged_block_size"]
    return record.get("logged_tokens")


def logged_cell(record: dict) -> str:
    tokens = logged_tokens(record)
    parts = ([f"{record['logged_blocks']:,} blocks of {record['logged_block_size']} "
              f"({tokens:,} tokens)"] if "logged_blocks" in record else
             [f"{tokens:,} tokens"] if tokens is not None else [])
    if "logged_gib" in record:
        unit = "GiB" if record["engine"] == "vllm" else "GB (SGLang's GB: 2^30 B)"
        parts.append(f"{record['logged_gib']:.2f} {unit}")
    return ", ".join(parts) or record["quote"].split("INFO: ")[-1]


def per_token_cells(record: dict, found: dict) -> list[str]:
    """Bytes per token: mlamem's (the predicted bytes over the predicted tokens) and the log's
    range (its GiB figure is rounded to 0.01)."""
    tokens, size = found.get("repro") or found.get("plan") or (0, 0)
    ours = size // tokens if tokens else None
    logged = logged_tokens(record)
    if logged is None or "logged_gib" not in record:
        return [f"{ours:,}" if ours else "-", "-"]
    low = (record["logged_gib"] - 0.005) * GiB / logged
    high = (record["logged_gib"] + 0.005) * GiB / logged
    return [f"{ours:,}" if ours else "-", f"{low:,.0f}-{high:,.0f}"]


def comparison(record: dict, found: dict) -> str:
    """The first prediction against the log: agrees within 2%, or how far off and by how many
    GiB of KV cache."""
    if "refused" in found:
        return f"not predicted: {found['refused']}"
    tokens, size = found.get("repro_held") or found.get("repro") or found["plan"]
    source = ("repro-oom, TP startup held" if "repro_held" in found
              else "repro-oom" if "repro" in found else "plan")
    logged = logged_tokens(record)
    if logged is None and "logged_gib" not in record:
        return "-"
    if logged is not None and record.get("compare") != "gib":
        off = (tokens - logged) / logged
        what = "tokens"
    else:
        off = (size - record["logged_gib"] * GiB) / (record["logged_gib"] * GiB)
        what = "GiB"
    if abs(off) <= AGREES_WITHIN:
        return f"agrees: {source} {100 * off:+.2f}% {what}"
    gap = (size - record["logged_gib"] * GiB if "logged_gib" in record
           else (tokens - logged) * size / tokens)
    return f"{source} {100 * off:+.2f}% {what}; {gap / GiB:+.2f} GiB of KV cache"


def indexer_cell(record: dict) -> str:
    if "logged_indexer_row_bytes" not in record:
        return "-"
    try:
        built = from_command(record.get("serve", record["command"]), gpu_name=record["gpu"],
                             engine_version=record.get("engine_version"))
    except UserError as error:
        return f"- (mlamem: {error})"
    ours = indexer_key_bytes(built.scenario.section("vllm").index_head_dim or 128)
    return f"{ours} / {record['logged_indexer_row_bytes']}"


def engine_cell(record: dict) -> str:
    read_as = (f"read as {record['engine_version']}" if record.get("engine_version")
               else "read at mlamem's default version")
    return f"{record['engine']} {record['version']} ({read_as})"


def command_cell(record: dict) -> str:
    partial = "" if record.get("command_complete", True) else " (partial)"
    read_as = f"; mlamem reads `{record['serve']}`" if "serve" in record else ""
    return f"`{record['command']}`{partial}{read_as}"


def prediction_cells(record: dict, found: dict) -> list[str]:
    """repro-oom's and plan's KV tokens, where the log gives a KV cache to compare them with."""
    if logged_tokens(record) is None and "logged_gib" not in record:
        return ["-", "-", "-"]
    repro = (f"{found['repro'][0]:,}" if "repro" in found else
             f"- ({found['repro_refused']})" if "repro_refused" in found else "-")
    held = f"{found['repro_held'][0]:,}" if "repro_held" in found else "-"
    plan = f"{found['plan'][0]:,}" if "plan" in found else "-"
    return [repro, held, plan]


def row(record: dict) -> str:
    found = predict(record)
    gpu = record.get("gpu", "not stated")
    cells = [record["name"], engine_cell(record), f"{record['model']}; {gpu}",
             command_cell(record), logged_cell(record), *per_token_cells(record, found),
             indexer_cell(record), *prediction_cells(record, found), comparison(record, found),
             record.get("rest", ""), found.get("not_modelled", "") or "-",
             f"[source]({record['address'].split()[0]}) {record['address'].partition(' ')[2]}"]
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


HEADER = ("| record | engine (version mlamem reads it at) | model; GPU | command | logged | "
          "B/token, mlamem | B/token, log | indexer B/token/layer (mlamem / log) | KV tokens "
          "(repro-oom --predict) | KV tokens, TP startup held (its ledger) | pool tokens (plan) | "
          "predicted vs log | what accounts for the rest | flags mlamem does not model | "
          "address |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def table() -> str:
    records = tomllib.loads(RECORDS.read_text())["log"]
    return "\n".join([
        "# Public startup logs against mlamem's prediction", "",
        "Written by `python scripts/field_startup_logs.py` from startup-logs.toml; each "
        "prediction from the record's command alone (`mlamem repro-oom --serve COMMAND --gpu GPU "
        "--predict --paths alloc`, `mlamem plan --serve ...`), at the engine version the record "
        "gives (`--engine-version`; none: mlamem's default, vLLM 0.33.0 or SGLang 0.5.23). "
        "repro-oom's ledger of a TP rank holds a public TP rank's startup memory beside it "
        "(mlamem/spec/engines/rank_startup.py), and its KV cache with it is the one compared. "
        "\"agrees\": within 2% of the logged KV cache; otherwise the gap in GiB of KV cache is the "
        "predicted cache less the logged one (or the token gap at mlamem's bytes per token).", "",
        HEADER, *map(row, records), ""])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 where the table is stale")
    args = parser.parse_args(argv)
    text = table()
    if args.check:
        stale = not TABLE.exists() or TABLE.read_text() != text
        print(f"{TABLE}: {'stale: run python scripts/field_startup_logs.py' if stale else 'up to date'}")
        return 1 if stale else 0
    TABLE.write_text(text)
    print(f"{TABLE}: {text.count(chr(10)) - 6} records")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
