"""Every JSON schema mlamem writes is documented field by field in docs/schemas.md.

For each schema the test writes a real document (predicted, on the CPU; validate from the
committed H200 comparisons, bench from its committed H200 output) and compares its fields, nested
objects as dotted names, with docs/schemas.md's table for that schema, in both directions.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from mlamem.cli import main

ROOT = Path(__file__).parent.parent
SCHEMAS = ROOT / "docs" / "schemas.md"
FIXTURES = Path(__file__).parent / "fixtures" / "results"
SHARED = "### JSON objects shared by the schemas"
MAP = ".<>"  # the keys of an object whose keys are data (`cases[].buffers.<buffer>`)


def documented_tables() -> dict[str, list[set[str]]]:
    """Schema name -> the fields of each of its docs/schemas.md tables, `object.*` rows expanded from
    the shared objects' tables and `<key>` placeholders written as MAP."""
    sections: dict[str, list[set[str]]] = {}
    current, table = None, None
    for line in SCHEMAS.read_text().splitlines():
        if line.startswith(("## ", "### ")):
            found = re.fullmatch(r"### JSON schema `(mlamem\.[a-z-]+/\d+)`", line)
            current = found.group(1) if found else SHARED if line == SHARED else None
            table = None
            continue
        if current is None or not line.startswith("|"):
            table = None
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0] == "field" or set(cells[0]) <= {"-"}:
            continue
        if table is None:
            table = set()
            sections.setdefault(current, []).append(table)
        table.update(re.sub(r"\.<[a-z_]+>$", MAP, name) for name in re.findall(r"`([^`]+)`",
                                                                                  cells[0]))
    shared = set().union(*sections.pop(SHARED))
    for tables in sections.values():
        for fields in tables:
            for star in [f for f in fields if f.endswith(".*")]:
                fields.remove(star)
                expansion = {f for f in shared if f.startswith(star[:-1])}
                assert expansion, f"docs/schemas.md: `{star}` names no shared object"
                fields |= expansion
    return sections


def written_fields(document, maps: set[str], prefix: str = "") -> set[str]:
    """Dotted names of every value in a JSON document: `a.b`, `rows[].c`; a documented map's
    keys become MAP; null, scalars, empty objects and lists of non-objects are leaves."""
    if prefix in maps:
        return {prefix + MAP}
    if isinstance(document, dict) and document:
        return set().union(*(written_fields(v, maps, f"{prefix}.{k}" if prefix else k)
                             for k, v in document.items()))
    if isinstance(document, list) and document and all(isinstance(v, dict) for v in document):
        return set().union(*(written_fields(v, maps, prefix + "[]") for v in document))
    return {prefix}


def differences(documents: list[dict], documented: set[str]) -> tuple[list[str], list[str]]:
    """(fields written but not documented, fields documented but never written)."""
    maps = {f[:-len(MAP)] for f in documented if f.endswith(MAP)}
    written = set().union(*(written_fields(d, maps) for d in documents))

    def under(name: str, names: set[str]) -> bool:  # an object or list holding documented ones
        return any(n.startswith((name + ".", name + "[]")) for n in names)

    return (sorted(w for w in written if w not in documented and not under(w, documented)),
            sorted(d for d in documented if d not in written and not under(d, written)))


def _json(tmp_path: Path, name: str, *args: str) -> dict:
    target = tmp_path / name
    assert main([*args, "--output", str(target)]) == 0
    return json.loads(target.read_text())


def _validate_document() -> dict:
    from mlamem import environment, render
    from mlamem.validate import Comparison

    saved = json.loads((FIXTURES / "validate-h200.json").read_text())
    comparisons = [Comparison(**{k: v for k, v in c.items() if k != "difference"})
                   for c in saved["comparisons"]]
    return json.loads(render.validation_json(comparisons, saved["command"],
                                             environment=environment.capture(),
                                             created=environment.now_utc()))


@pytest.fixture(scope="module")
def documents(tmp_path_factory) -> dict[str, list[list[dict]]]:
    """Schema -> for each docs/schemas.md table (mode), the documents written in that shape."""
    tmp = tmp_path_factory.mktemp("schemas")
    return {
        "mlamem.profile/1": [[_json(tmp, "profile.json", "profile", "--tokens", "1024",
                                    "--format", "json", "--predict")]],
        "mlamem.repro-oom/1": [
            [_json(tmp, "repro.json", "repro-oom", "--format", "json", "--predict")],
            [_json(tmp, "context.json", "repro-oom", "-s", "kimi-k2-context-reuse",
                   "--format", "json", "--predict")]],
        "mlamem.validate/1": [[_validate_document()]],
        "mlamem.baseline/1": [[_baseline(tmp)]],
        "mlamem.plan/1": [[_json(tmp, "plan.json", "plan", "--format", "json", "--sweep",
                                 "max-seq-len=32768,131072"),
                           _json(tmp, "plan-context.json", "plan", "-s",
                                 "kimi-k2-context-reuse", "--format", "json")]],
        "mlamem.bench/2": [[_bench_document()]],
        "mlamem.compare/1": [[_compare_document()]],
        "mlamem.graphs/1": [[_json(tmp, "graphs.json", "graphs", "--capture-sizes", "512,8",
                                   "--format", "json", "--predict")]],
    }


def _bench_document() -> dict:
    """What benchmarks/triton_vs_flashmla.py --json writes (timing needs a GPU), from its own
    row and document functions; the figures are placeholders, the shape is the point."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench", ROOT / "benchmarks" /
                                                  "triton_vs_flashmla.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    part1 = bench.with_ratio([bench.timing_row("FlashMLA", 8192, 64, "l2", 5.7, 1 << 30),
                              bench.timing_row("Triton", 8192, 64, "l2", 13.0, 1 << 30, 1e-3)])
    part2 = bench.with_speedup("glm5-fp8-tp8", [
        bench.timing_row("FlashMLA, q padded", 8192, 8, "hbm", 6.0, 1 << 30),
        bench.timing_row("Triton native heads", 8192, 8, "hbm", 4.0, 1 << 26, 1e-3)])
    environment = {"gpu": "H200", "sm_count": 132, "torch": "2.11", "triton": "3.6.0",
                   "flash_mla": "1.0.0"}
    lse = [{"tokens": 1024, "heads": 64, "topk": 2048, "flashmla_vs_reference": 1e-3,
            "triton_vs_reference": 1e-3, "triton_vs_flashmla": 1e-3}]
    return json.loads(json.dumps(bench.document(environment, part1, part2, lse)))


def _compare_document() -> dict:
    """A compare result as the GPU writes it, built from its dataclasses (comparing needs a
    GPU); the figures are placeholders, the shape is the point."""
    from mlamem import environment, render
    from mlamem.compare import CompareResult, CompareRow, ReferenceDifference

    error = ReferenceDifference(out_max_abs=0.004, out_rel_l2=0.002, lse_max_abs=5e-6)
    result = CompareResult(
        command="mlamem compare", op="sparse-prefill", scenario="glm5-fp8-tp8",
        kernels=[{"name": n, "label": n, "version": None, "head_counts": [64]}
                 for n in ("flashmla", "flashmla-vllm")],
        kv_tokens=8192, rows=[CompareRow(tokens=1024, path="alloc", out_equal=False,
                                         lse_equal=False, out_max_diff=0.001,
                                         lse_max_diff=1e-6,
                                         errors={"flashmla": error, "flashmla-vllm": error})],
        environment=environment.capture(), created=environment.now_utc(), notes=["a note"])
    return json.loads(render.compare_json(result))


def _baseline(tmp: Path) -> dict:
    target = tmp / "baseline.json"
    assert main(["gate", "--baseline", str(target), "--update", "--predict", "--scenario",
                 "glm5-fp8-tp8", "--tokens", "1024"]) == 0
    return json.loads(target.read_text())


def test_every_schema_the_code_writes_has_a_docs_section(documents):
    """A schema named anywhere in mlamem/ or benchmarks/ has its docs/schemas.md table and a document
    in this test."""
    named = {m for folder in ("mlamem", "benchmarks") for path in (ROOT / folder).rglob("*.py")
             for m in re.findall(r"\"(mlamem\.[a-z-]+/\d+)\"", path.read_text())}
    assert named == set(documented_tables()) == set(documents)


@pytest.mark.parametrize("schema", ["mlamem.profile/1", "mlamem.repro-oom/1",
                                    "mlamem.validate/1", "mlamem.baseline/1", "mlamem.plan/1",
                                    "mlamem.bench/2", "mlamem.compare/1",
                                    "mlamem.graphs/1"])
def test_the_docs_document_every_field(schema, documents):
    """docs/schemas.md's table for `schema` lists every field a written document has, and nothing
    else; repro-oom's context-reuse cases are checked against their own table."""
    tables = documented_tables()[schema]
    shapes = documents[schema]
    assert len(tables) == len(shapes), f"{schema}: {len(tables)} tables in docs/schemas.md"
    for i, (fields, written) in enumerate(zip(tables, shapes, strict=True)):
        if i:  # a later table replaces the first one's cases[], keeps the rest
            fields = fields | {f for f in tables[0] if not f.startswith("cases[]")}
        missing, stale = differences(written, fields)
        assert not missing, (f"{schema}: written but not in docs/schemas.md's table under "
                             f"'### JSON schema `{schema}`': {missing}")
        assert not stale, f"{schema}: in docs/schemas.md's table but never written: {stale}"


def test_a_new_field_is_caught():
    """The comparison finds an undocumented field, a stale one, and knows a map's keys."""
    documented = {"a", "b.c", "rows[].d", "m" + MAP}
    document = {"a": 1, "b": {"c": None, "new": 2}, "rows": [{"d": 1}], "m": {"x.y": 1}}
    assert differences([document], documented) == (["b.new"], [])
    assert differences([{"a": 1, "b": None, "rows": [], "m": {}}], documented) == (
        [], ["b.c", "rows[].d"])
