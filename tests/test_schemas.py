"""Every JSON schema mlamem writes has a pydantic model (mlamem/results) and a generated JSON
Schema file in docs/schemas/, committed and equal to what the models generate.

For each schema the test writes a real document (predicted, on the CPU; validate from the
committed H200 comparisons, bench from its committed H200 output), checks it with its model, and
compares its fields, nested objects as dotted names, with the committed schema file's, both ways:
nothing written that the schema lacks (except under an object whose other keys are open, such as
a scenario or an engine's case), nothing the schema requires that is never written.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pytest

from mlamem import results
from mlamem.cli import main
from mlamem.results.__main__ import file_name, stale

ROOT = Path(__file__).parent.parent
SCHEMAS = ROOT / "docs" / "schemas"
FIXTURES = Path(__file__).parent / "fixtures" / "results"
SNAPSHOT = Path(__file__).parent / "fixtures" / "glm5-t1024-h200.snapshot.pickle"
MAP = ".<>"  # the keys of an object whose keys are data (`cases[].buffers.<buffer>`)
OPEN = ".*"  # an object whose unlisted keys pass (`scenario.*`)


def schema_fields(schema: str) -> tuple[set[str], set[str]]:
    """(every field the committed schema file names, the required ones), as dotted names:
    `rows[].tokens`, `cases[].buffers.<>` (MAP) for a map's keys, `scenario.*` (OPEN) for an
    object that lets other keys pass."""
    document = json.loads((SCHEMAS / file_name(schema)).read_text())
    named: set[str] = set()
    required: set[str] = set()

    def resolve(node: dict) -> dict:
        if "$ref" in node:
            return resolve(document["$defs"][node["$ref"].rpartition("/")[2]])
        choices = [c for c in node.get("anyOf", []) if c.get("type") != "null"]
        return resolve(choices[0]) if len(choices) == 1 else node

    def walk(node: dict, prefix: str, needed: bool) -> None:
        node = resolve(node)
        if node.get("type") == "array" and isinstance(node.get("items"), dict):
            items = resolve(node["items"])
            if "properties" in items:
                return walk(items, prefix + "[]", needed)
        properties = node.get("properties")
        if not properties:
            named.add(prefix)
            if needed:
                required.add(prefix)
            extra = node.get("additionalProperties")
            if isinstance(extra, dict) and node.get("type") == "object":
                named.add(prefix + MAP)
            return
        if node.get("additionalProperties") is True:
            named.add(prefix + OPEN)
        for name, child in properties.items():
            walk(child, f"{prefix}.{name}" if prefix else name,
                 needed and name in node.get("required", []))

    walk(document, "", True)
    return named, required


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


def differences(documents: list[dict], named: set[str],
                required: set[str]) -> tuple[list[str], list[str]]:
    """(fields written that the schema lacks, fields the schema requires that are never written)."""
    maps = {f[:-len(MAP)] for f in named if f.endswith(MAP)}
    opened = {f[:-len(OPEN)] for f in named if f.endswith(OPEN)}
    written = set().union(*(written_fields(d, maps) for d in documents))

    def under(name: str, names: set[str]) -> bool:  # an object or list holding named ones
        return any(n.startswith((name + ".", name + "[]")) for n in names)

    def in_open(name: str) -> bool:
        return any(name.startswith((o + ".", o + "[]")) for o in opened)

    return (sorted(w for w in written if w not in named and not under(w, named)
                   and not in_open(w)),
            sorted(r for r in required if r not in written and not under(r, written)))


def _json(tmp_path: Path, name: str, *args: str) -> dict:
    target = tmp_path / name
    assert main([*args, "--output", str(target)]) == 0
    return json.loads(target.read_text())


def _stdout_json(*args: str) -> dict:
    """What a command without --output prints."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(list(args)) == 0
    return json.loads(out.getvalue())


def _validate_document() -> dict:
    from mlamem import render
    from mlamem.results.validate import ValidateFile
    from mlamem.runtime import environment

    saved = json.loads((FIXTURES / "validate-h200.json").read_text())
    comparisons = ValidateFile.parse(saved).comparisons
    return json.loads(render.validation_json(comparisons, saved["command"],
                                             environment=environment.capture(),
                                             created=environment.now_utc()))


@pytest.fixture(scope="module")
def documents(tmp_path_factory) -> dict[str, list[list[dict]]]:
    """Schema -> the documents written in it, grouped by shape (repro-oom: per engine)."""
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
        "mlamem.kernels/1": [[_stdout_json("kernels", "--format", "json")]],
        "mlamem.explain/1": [[_json(tmp, "explain.json", "explain", str(SNAPSHOT)),
                              _json(tmp, "explain-s.json", "explain", str(SNAPSHOT), "-s",
                                    "glm5-fp8-tp8")]],
        "mlamem.diff/1": [[_diff_document(tmp), _json(tmp, "diff-s.json", "diff", str(SNAPSHOT),
                                                      str(SNAPSHOT), "--format", "json"),
                           _json(tmp, "diff-h200.json", "diff",
                                 str(FIXTURES / "profile-glm5-h200.predicted.json"),
                                 str(FIXTURES / "profile-glm5-h200.json"), "--format", "json")]],
    }


def _diff_document(tmp: Path) -> dict:
    """A diff of two profiles (alloc against workspace) with --fail-on-growth."""
    for path in ("alloc", "workspace"):
        _json(tmp, f"{path}.json", "profile", "--predict", "--tokens", "1024", "--paths", path,
              "--format", "json")
    target = tmp / "diff.json"
    main(["diff", str(tmp / "alloc.json"), str(tmp / "workspace.json"), "--fail-on-growth",
          "0B", "--output", str(target)])
    return json.loads(target.read_text())


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
    """A compare result as the GPU writes it, built from its models (comparing needs a GPU);
    the figures are placeholders, the shape is the point."""
    from mlamem import render
    from mlamem.results.compare import CompareFile, CompareRow, ReferenceDifference
    from mlamem.runtime import environment

    error = ReferenceDifference(out_max_abs=0.004, out_rel_l2=0.002, lse_max_abs=5e-6)
    result = CompareFile(
        schema="mlamem.compare/1", command="mlamem compare", op="sparse-prefill", scenario="glm5-fp8-tp8",
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


def test_every_schema_the_code_writes_has_a_model(documents):
    """A schema named anywhere in mlamem/ or benchmarks/ has its model, its committed schema
    file and a document in this test; the only other schema file is the scenario file's."""
    named = {m for folder in ("mlamem", "benchmarks") for path in (ROOT / folder).rglob("*.py")
             for m in re.findall(r"\"(mlamem\.[a-z-]+/\d+)\"", path.read_text())}
    assert named == set(results.MODELS) == set(documents)
    assert ({p.name for p in SCHEMAS.glob("*.schema.json")}
            == {file_name(s) for s in named} | {"scenario.schema.json"})


def test_the_csv_columns_page_lists_what_csv_writes(tmp_path):
    """docs/schemas/csv.md names every column a profile and a graphs CSV have, in order."""
    page = (SCHEMAS / "csv.md").read_text()
    for command in ("profile", "graphs"):
        target = tmp_path / f"{command}.csv"
        extra = ["--tokens", "1024"] if command == "profile" else ["--capture-sizes", "512,8"]
        assert main([command, "--predict", *extra, "--output", str(target)]) == 0
        header = target.read_text().splitlines()[0].split(",")
        section = page.split(f"of {command}\n", 1)[1].split("\n## ", 1)[0]
        assert re.findall(r"^\| `([a-z_]+)` \|", section, re.M) == header


def test_the_committed_schemas_are_the_models():
    """docs/schemas/ is what `python -m mlamem.results --write-schemas` writes, byte for byte."""
    assert stale(SCHEMAS) == [], "run `python -m mlamem.results --write-schemas`"


def test_a_stale_schema_is_caught(tmp_path):
    """A committed file edited by hand, or one for no model, is named."""
    for path in SCHEMAS.iterdir():
        (tmp_path / path.name).write_text(path.read_text())
    (tmp_path / "profile-1.schema.json").write_text("{}\n")
    (tmp_path / "gone-1.schema.json").write_text("{}\n")
    assert stale(tmp_path) == ["gone-1.schema.json", "profile-1.schema.json"]


@pytest.mark.parametrize("schema", list(results.MODELS))
def test_the_schema_names_every_field(schema, documents):
    """Each document written in `schema` passes its model, and the committed schema file names
    every field it has and nothing it requires is missing."""
    named, required = schema_fields(schema)
    written = [doc for shape in documents[schema] for doc in shape]
    for document in written:
        results.read(document, schema)
    missing, never = differences(written, named, required)
    assert not missing, f"{schema}: written but not in docs/schemas/{file_name(schema)}: {missing}"
    assert not never, f"{schema}: required by the schema but never written: {never}"


def test_a_new_field_is_caught():
    """The comparison finds a field the schema lacks, a required one never written, and knows
    a map's keys and an open object's."""
    named = {"a", "b.c", "rows[].d", "m" + MAP, "s" + OPEN, "s.name"}
    document = {"a": 1, "b": {"c": None, "new": 2}, "rows": [{"d": 1}], "m": {"x.y": 1},
                "s": {"name": "x", "other": 1}}
    assert differences([document], named, named - {"m" + MAP, "s" + OPEN}) == (["b.new"], [])
    assert differences([{"a": 1, "b": None, "rows": [], "m": {}}], named, {"b.c", "rows[].d"}) == (
        [], ["b.c", "rows[].d"])


def test_a_broken_file_is_one_line_naming_the_field():
    """A wrong type, a missing field and an unknown one: `FIELD: what is wrong`, one line."""
    saved = json.loads((FIXTURES / "profile-glm5-h200.json").read_text())
    saved["rows"][3]["tokens"] = "1024"
    with pytest.raises(ValueError, match=r"^rows\[3\]\.tokens: expected an integer$"):
        results.read(saved, "mlamem.profile/1")
    del saved["rows"][3]["tokens"]
    with pytest.raises(ValueError, match=r"^rows\[3\]\.tokens: missing$"):
        results.read(saved, "mlamem.profile/1")
    saved["rows"][3]["tokens"], saved["colour"] = 1024, "red"
    with pytest.raises(ValueError, match=r"^colour: not a field of this schema$"):
        results.read(saved, "mlamem.profile/1")


def test_an_older_file_is_migrated_once():
    """A profile file from before `op`, `created` and `shard`, with the environment's legacy
    `flash_mla`: the migrate step fills in sparse decode and nulls and moves the version into
    `kernels`; the file's own figures pass through unchanged."""
    saved = json.loads((FIXTURES / "profile-glm5-h200.json").read_text())
    assert "op" not in saved and "flash_mla" in saved["environment"]
    data = results.read(saved, "mlamem.profile/1")
    assert data["op"] == "sparse-decode" and data["created"] is None and data["shard"] is None
    assert data["environment"]["kernels"] == {"flashmla": saved["environment"]["flash_mla"]}
    assert all(r["op"] == "sparse-decode" for r in data["rows"])
    assert [r["peak_allocated_bytes"] for r in data["rows"]] == [
        r["peak_allocated_bytes"] for r in saved["rows"]]


def _committed_results() -> list[Path]:
    found = []
    for path in sorted([*ROOT.glob("reports/**/*.json"), *ROOT.glob("tests/fixtures/**/*.json")]):
        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        if isinstance(data, dict) and data.get("schema") in results.MODELS:
            found.append(path)
    return found


@pytest.mark.parametrize("path", _committed_results(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_committed_result_passes_its_model(path):
    """Every result file in reports/ and tests/fixtures, old and new, reads through its model."""
    data = json.loads(path.read_text())
    results.read(data, data["schema"])


MODELS_LOADED = "print(sorted(m for m in sys.modules if m == 'mlamem.results.models'))"


@pytest.mark.parametrize("code", [
    "import sys; from mlamem.cli import main; main(['--help'])",
    "import sys; from mlamem.cli import main; main(['scenarios'])",
    "import sys; import mlamem.pytest_plugin"])
def test_the_models_load_only_where_a_file_is_read(code):
    """`--help`, `scenarios` and the pytest plugin load no result model; reading a file does."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-P", "-c", f"{code}\n{MODELS_LOADED}"],
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.splitlines()[-1] == "[]", done.stderr
    read = (f"import sys, json; from mlamem import results; results.parse(json.load(open("
            f"{str(FIXTURES / 'profile-glm5-h200.json')!r})), 'mlamem.profile/1')\n{MODELS_LOADED}")
    done = subprocess.run([sys.executable, "-P", "-c", read], capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.splitlines()[-1] == "['mlamem.results.models']", done.stderr
