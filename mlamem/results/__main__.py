"""`python -m mlamem.results --write-schemas`: the JSON Schema of every result model into
docs/schemas/ (NAME.schema.json, e.g. profile-1.schema.json), the scenario file's
(scenario.schema.json), and the CSV files' columns (csv.md); `--check` exits 1 naming each
committed file that differs from the models."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mlamem.results import CSV, MODELS, model_for, models
from mlamem.spec.scenario import file_schema

DOCS = Path(__file__).resolve().parents[2] / "docs" / "schemas"


def file_name(schema: str) -> str:
    """'mlamem.profile/1' -> 'profile-1.schema.json'."""
    name, _, version = schema.removeprefix("mlamem.").partition("/")
    return f"{name}-{version}.schema.json"


def generated() -> dict[str, str]:
    """File name -> the JSON Schema text of that model, as committed."""
    texts = {}
    for schema in MODELS:
        document = model_for(schema).model_json_schema(by_alias=True, mode="validation")
        document = {"$schema": "https://json-schema.org/draft/2020-12/schema",
                    "$id": file_name(schema), **document}
        texts[file_name(schema)] = json.dumps(document, indent=2) + "\n"
    texts[SCENARIO_PAGE] = json.dumps({"$schema": "https://json-schema.org/draft/2020-12/schema",
                                       "$id": SCENARIO_PAGE, **file_schema()}, indent=2) + "\n"
    texts[CSV_PAGE] = csv_columns()
    return texts


CSV_PAGE = "csv.md"
SCENARIO_PAGE = "scenario.schema.json"


def csv_columns() -> str:
    """The Markdown page of the CSV files' columns, from the models' field descriptions."""
    lines = ["# CSV columns", "",
             "Generated from the result models by `python -m mlamem.results --write-schemas`; do "
             "not edit.", "",
             "A CSV cell is a plain value: empty for null, `true` or `false`, text as it is, a "
             "number; a list is joined by `;` (`padded_q;out`), a list of buffers is "
             "`name=requested_bytes` joined by `;` (`padded_q=75497472;out=67108864`). The JSON "
             "file of the same run holds every figure unabridged.", ""]
    for schema, (line, model_name, columns) in CSV.items():
        model = getattr(models, model_name)
        fields = model.model_fields
        lines += [f"## `--format csv` of {schema.removeprefix('mlamem.').partition('/')[0]}", "",
                  f"One line per {line}; its columns are fields of [{file_name(schema)}]"
                  f"({file_name(schema)}):", "",
                  "| column | meaning |", "|---|---|"]
        for name in columns or fields:
            field = fields.get(name) or models.GraphPath.model_fields[name]
            meaning = (field.description or "").replace("|", "\\|")
            lines.append(f"| `{name}` | {meaning} |")
        lines.append("")
    return "\n".join(lines)


def stale(folder: Path = DOCS) -> list[str]:
    """The committed schema files that differ from the models, are missing, or name no model."""
    texts = generated()
    committed = {p.name for p in [*folder.glob("*.schema.json"), folder / CSV_PAGE] if p.is_file()}
    return sorted([n for n, t in texts.items() if not (folder / n).is_file()
                   or (folder / n).read_text() != t] + sorted(committed - set(texts)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mlamem.results", description=__doc__)
    parser.add_argument("--write-schemas", action="store_true", help="write docs/schemas/")
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/schemas/ is stale")
    parser.add_argument("--folder", type=Path, default=DOCS)
    args = parser.parse_args(argv)
    if args.write_schemas:
        args.folder.mkdir(parents=True, exist_ok=True)
        for name, text in generated().items():
            (args.folder / name).write_text(text)
        for name in {p.name for p in args.folder.glob("*.schema.json")} - set(generated()):
            (args.folder / name).unlink()
    differ = stale(args.folder)
    if differ:
        print(f"{args.folder}: stale against the models: {', '.join(differ)}; run "
              "`python -m mlamem.results --write-schemas`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
