"""reports/field's startup-log records and scripts/field_startup_logs.py's comparison, on a CPU
and (but for one prediction a record quotes) without running mlamem: every record cites its
source and a logged figure, the comparison agrees within 2% or gives the gap in GiB, and --check
tells a stale table from a current one."""

import importlib.util
import json
import tomllib
from pathlib import Path

import pytest

from mlamem.cli import main

ROOT = Path(__file__).parent.parent
SCRIPT = ROOT / "scripts" / "field_startup_logs.py"
GiB = 1024**3


def _load():
    spec = importlib.util.spec_from_file_location("field_startup_logs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


logs = _load()
RECORDS = tomllib.loads(logs.RECORDS.read_text())["log"]
LOGGED = ("logged_tokens", "logged_blocks", "logged_gib", "logged_indexer_row_bytes")


def test_records_cite_a_source_and_a_logged_figure():
    """At least 8 records, each named once, of vLLM or SGLang, with its
    command, the source's own words, an https address and a figure the engine logged."""
    assert len(RECORDS) >= 8
    assert len({record["name"] for record in RECORDS}) == len(RECORDS)
    for record in RECORDS:
        assert record["engine"] in ("vllm", "sglang"), record["name"]
        assert record["command"] and record["quote"], record["name"]
        assert record["address"].startswith("https://"), record["name"]
        assert any(key in record for key in LOGGED), record["name"]
        assert ("logged_blocks" in record) == ("logged_block_size" in record), record["name"]


def test_blocks_count_as_tokens():
    record = {"logged_blocks": 4171, "logged_block_size": 64}
    assert logs.logged_tokens(record) == 266944
    assert logs.logged_tokens({"logged_tokens": 5}) == 5
    assert logs.logged_tokens({"logged_gib": 1.0}) is None


def test_comparison_agrees_within_two_percent():
    record = {"logged_tokens": 100_000, "logged_gib": 6.0}
    found = {"repro": (101_500, 6 * GiB), "plan": (200_000, 12 * GiB)}
    assert logs.comparison(record, found) == "agrees: repro-oom +1.50% tokens"


def test_comparison_gives_the_gap_in_gib_from_the_logged_gib():
    """Outside 2%: the first prediction (plan's where repro-oom refused) and the predicted bytes
    less the logged GiB."""
    record = {"logged_tokens": 100_000, "logged_gib": 6.0}
    found = {"repro_refused": "dense MLA", "plan": (150_000, 9 * GiB)}
    assert logs.comparison(record, found) == "plan +50.00% tokens; +3.00 GiB of KV cache"


def test_comparison_gives_the_token_gap_at_the_predicted_bytes_per_token():
    record = {"logged_blocks": 100, "logged_block_size": 64}
    found = {"repro": (12_800, 12_800 * 1000)}
    assert logs.comparison(record, found) == (
        f"repro-oom +100.00% tokens; {6400 * 1000 / GiB:+.2f} GiB of KV cache")


def test_comparison_names_the_refusal_or_nothing_to_compare():
    assert logs.comparison({"logged_tokens": 1}, {"refused": "no GPU"}) == "not predicted: no GPU"
    assert logs.comparison({"logged_indexer_row_bytes": 132}, {"plan": (1, 1)}) == "-"


def test_bytes_per_token_against_the_rounded_log():
    """mlamem's bytes per token (predicted bytes over tokens) beside the log's range: its GiB
    rounded to 0.01 over its tokens."""
    record = {"logged_tokens": 434048, "logged_gib": 24.85}
    ours, theirs = logs.per_token_cells(record, {"repro": (676352, 676352 * 61464)})
    assert (ours, theirs) == ("61,464", "61,461-61,486")


def test_check_tells_a_stale_table(tmp_path, monkeypatch):
    table = tmp_path / "startup-logs.md"
    monkeypatch.setattr(logs, "TABLE", table)
    monkeypatch.setattr(logs, "table", lambda: "the table\n")
    assert logs.main(["--check"]) == 1  # not written yet
    assert logs.main([]) == 0 and table.read_text() == "the table\n"
    assert logs.main(["--check"]) == 0
    table.write_text("an older table\n")
    assert logs.main(["--check"]) == 1


@pytest.mark.parametrize("record", RECORDS, ids=[record["name"] for record in RECORDS])
def test_committed_table_has_a_row_per_record(record):
    assert f"| {record['name']} |" in logs.TABLE.read_text()


def _predicted(record: dict, tmp_path: Path, flags: str) -> dict:
    """The alloc case of `repro-oom --predict` for the record's command with `flags` added, at
    the record's engine version."""
    output = tmp_path / "predicted.json"
    assert main(["repro-oom", "--predict", "--serve", f"{record['command']} {flags}", "--gpu",
                 record["gpu"], "--engine-version", record["engine_version"], "--paths", "alloc",
                 "--format", "json", "--output", str(output)]) == 0
    return json.loads(output.read_text())["cases"][0]


def test_the_thirty_two_thousand_token_reading_of_the_glm5_log_is_the_prediction(tmp_path):
    """glm5-h200-vllm-0.22's `rest` reads the thread's failing 8.00 GiB o_accum as a 32768-token
    step: its command with --max-num-batched-tokens 32768 (and with --enable-expert-parallel
    too), predicted at the record's version, gives the tokens and GiB the record quotes."""
    record = next(r for r in RECORDS if r["name"] == "glm5-h200-vllm-0.22")
    case = _predicted(record, tmp_path, "--max-num-batched-tokens 32768")
    assert (case["kv_cache_tokens"], case["oom_buffer"]) == (518207, "o_accum")
    quoted = f"{case['kv_cache_tokens']:,} tokens ({case['kv_cache_bytes'] / GiB:.2f} GiB)"
    assert quoted in record["rest"]
    with_ep = _predicted(record, tmp_path, "--max-num-batched-tokens 32768 --enable-expert-parallel")
    assert with_ep["kv_cache_tokens"] == 507456
    quoted = f"{with_ep['kv_cache_tokens']:,} tokens ({with_ep['kv_cache_bytes'] / GiB:.2f} GiB)"
    assert quoted in record["rest"]
    readme = (ROOT / "reports" / "field" / "README.md").read_text()
    # the recipe's "94.46 GiB per rank" read as decimal GB: 755.7 GB / 8, under mlamem's count
    assert round(755.7 / 8, 2) == 94.46
    assert (f"{94.46e9 / GiB:.2f} GiB, under mlamem's {case['weights_bytes'] / GiB:.2f} GiB count "
            "of GLM-5-FP8's weights") in " ".join(readme.split())


def test_the_int4_glm52_miss_is_the_one_the_readme_shows(tmp_path, capsys):
    """OpenThoughts-Agent's GLM-5.2-AWQ-INT4 rank, its quantization reconstructed: mlamem says
    the step fits at 0.90, where the server ran out of memory, and at 0.84; the README quotes
    both headrooms, and the run's notes say the int4 MoE layer is not modelled."""
    readme = " ".join((ROOT / "reports" / "field" / "README.md").read_text().split())
    command = ("vllm serve cyankiwi/GLM-5.2-AWQ-INT4 --tensor-parallel-size 8 "
               "--enable-expert-parallel --max-model-len 32768 --max-num-seqs 4 "
               "--gpu-memory-utilization {} --kv-cache-dtype fp8 --max-num-batched-tokens 16384")
    for utilization, shown in (("0.90", "with {:.3f} GiB of headroom"), ("0.84", "at 0.84, {:.3f} GiB")):
        output = tmp_path / f"{utilization}.json"
        assert main(["repro-oom", "--predict", "--serve", command.format(utilization), "--model",
                     str(ROOT / "reports" / "field" / "GLM-5.2-AWQ-INT4"), "--gpu", "H100 SXM 80GB",
                     "--engine-version", "0.23.0", "--paths", "alloc", "--format", "json",
                     "--output", str(output)]) == 0
        result = json.loads(output.read_text())
        [case] = result["cases"]
        assert case["verdict"] == "fits"
        assert shown.format(case["headroom_bytes"] / GiB) in readme
        if utilization == "0.90":  # with the public TP8 rank's startup memory standing in
            [with_stand_in] = result["log"]["paths"]
    assert with_stand_in["verdict_with_log"] == "fits"
    assert (f"with {with_stand_in['held_bytes'] / GiB:.3f} GiB held beside the rank the step still "
            f"fits at 0.90, its largest safe step {with_stand_in['max_safe_tokens']} tokens and "
            f"largest safe utilization {with_stand_in['max_safe_fraction']}") in readme
    assert "mlamem: note: the MoE layer: vLLM 0.23.0 runs int4 MoE through Marlin" in \
        capsys.readouterr().err


def _row(table: str, name: str) -> str:
    return next(line for line in table.splitlines() if line.startswith(f"| {name} |"))


def test_committed_table_is_current_and_the_readme_quotes_it():
    """startup-logs.md is what the script writes now (every record predicted again), and the
    README's figures for the eager GLM-5.1 records and the SGLang GLM-5.2 record are the table's."""
    import re

    assert logs.main(["--check"]) == 0
    table = logs.TABLE.read_text()
    readme = " ".join((ROOT / "reports" / "field" / "README.md").read_text().split())
    eager = [re.search(r"agrees: repro-oom, TP startup held \+(\d+\.\d\d)% GiB", _row(table, name))[1]
             for name in ("glm51-h200-vllm-0.19-eager", "glm51-h200-vllm-0.20-eager")]
    assert f"within {eager[0]}% and {eager[1]}%" in readme
    sglang = _row(table, "glm52-h200-sglang-0.5.13")
    off = re.search(r"agrees: repro-oom, TP startup held (-\d+\.\d\d)% tokens", sglang)
    alone, held = sglang.split(" | ")[8:10]
    logged, tokens = 540_800, int(alone.replace(",", ""))
    more = (tokens - logged) * 61_464 / 2**30  # at the stored cell
    assert (f"mlamem's one-process rank gets {alone} (+{100 * (tokens - logged) / logged:.2f}%, "
            f"{more:.2f} GiB more)") in readme
    assert f"mlamem predicts {held} tokens ({off[1]}%): it agrees" in readme


def test_the_sglang_row_sizes_what_the_draft_worker_holds_after_the_pool():
    """glm52-h200-sglang-0.5.13's `rest` sizes what 0.5.13's EAGLE worker holds after the
    target sized its pool: the MTP layer's weights at TP8 (its embedding and head the target's)
    and a one-layer pool of the logged tokens at the stored cell."""
    from mlamem.spec.models import shipped_config, weights_per_rank

    record = next(r for r in RECORDS if r["name"] == "glm52-h200-sglang-0.5.13")
    config = shipped_config("glm-5.2")
    layout = {"tp": 8, "engine": "sglang", "every_indexer": True}
    mtp = weights_per_rank(config, mtp=True, shared_head=True, **layout) - weights_per_rank(config, **layout)
    pool = record["logged_tokens"] * (656 + 132)
    assert (f"the MTP layer ({mtp / GiB:.2f} GiB a rank) and a one-layer pool of the same tokens "
            f"({pool / GiB:.2f} GiB)") in record["rest"]
