"""`mlamem report`: saved results (profile, repro-oom, graphs, validate, compare) as one PR-ready
Markdown document.

`load` reads a result file and checks it by its model (`mlamem.results`); each kind of result has
a `Section` whose hooks name, title, summarise and render it, and `build` iterates them over the
existing Markdown renderers (`mlamem.render`) and the figures (`mlamem.render.plots`); `write` puts
the PNGs next to the Markdown, each file whole or not at all. Plain data in, text and PNG bytes
out: the same inputs give the same bytes (the date shown is the one each result recorded).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from mlamem import render
from mlamem.commands import shards
from mlamem.operations import operation
from mlamem.results.compare import CompareFile
from mlamem.results.graphs import GraphsFile
from mlamem.results.profile import ProfileFile
from mlamem.results.repro import ReproFile
from mlamem.results.shared import Environment
from mlamem.results.validate import ValidateFile
from mlamem.spec.engine_registry import engine_names, engine_spec
from mlamem.spec.errors import UserError
from mlamem.spec.files import (
    check_name_length,
    check_output_path,
    fit_name,
    read_json,
    safe_name,
    write_atomic,
)
from mlamem.spec.kernel_api import SPARSE_DECODE
from mlamem.spec.units import format_bytes, gib

Result = ProfileFile | ReproFile | ValidateFile | CompareFile | GraphsFile


class Section:
    """How the report shows one kind of result: its hooks read a file, name it, title it,
    summarise it and render its part of the document. One subclass per result model, in the
    order the document shows them; nothing here dispatches on a kind string."""

    kind: str  # how the report names it ("profile", "repro-oom", ...)
    schema: str  # the JSON schema it reads
    result_type: type
    items: str  # the result's list a report needs at least one entry of

    @staticmethod
    def read(data: dict) -> Result:
        raise NotImplementedError

    def check(self, result: Result) -> str | None:
        """What a file that matches its model still lacks for a report, or None."""
        return None if getattr(result, self.items) else f"{self.items!r} is empty"

    def scenario(self, r) -> str:
        return r.scenario["name"]

    def title(self, r) -> str:
        return self.scenario(r)

    def figures(self, r) -> str:
        """The environment table's figures cell."""
        return "measured" if r.measured else "**PREDICTED**"

    def body(self, r, figure: Callable[..., list[str]], tag: str) -> list[str]:
        """The section's Markdown; `figure(suffix, alt, draw)` adds a plot."""
        raise NotImplementedError

    def summary(self, r, tag: str) -> list[str]:
        raise NotImplementedError


class ProfileSection(Section):
    kind, schema, result_type, items = "profile", ProfileFile.schema_name(), ProfileFile, "rows"
    read = staticmethod(ProfileFile.parse)

    def scenario(self, r: ProfileFile) -> str:
        return r.scenario.name

    def title(self, r: ProfileFile) -> str:
        op = "" if r.op == SPARSE_DECODE else f" {r.op}"
        return f"{self.scenario(r)}, {r.kernel.label}{op}"

    def body(self, r: ProfileFile, figure, tag: str) -> list[str]:
        return [render.markdown(r),
                *figure("peak", f"Per-call peak vs T{tag}", lambda plots: plots.peak_vs_tokens(r)),
                *figure("buffers", f"Buffers at each call's peak{tag}",
                        lambda plots: plots.buffers_by_tokens(r)),
                render.breakdown_markdown(r)]

    def summary(self, r: ProfileFile, tag: str) -> list[str]:
        by_tokens: dict[int, dict] = {}
        for row in r.rows:
            by_tokens.setdefault(row.tokens, {})[row.path] = row
        out = []
        paths = [p for p in ("alloc", "workspace", "workspace-full")
                 if any(p in rows for rows in by_tokens.values())]
        for tokens, rows in by_tokens.items():
            if all(p in rows and rows[p].failure is None for p in paths):
                out.append(f"{tokens}: " + " → ".join(
                    f"{gib(rows[p].peak_allocated_bytes):.3f}" for p in paths) + " GiB")
        if not out or len(paths) < 2:
            return []
        symbol = operation(r.op).symbol
        op = "" if r.op == SPARSE_DECODE else f" {r.op}"
        return [f"- profile{op} {r.scenario.name}, {r.kernel.label}{tag}: per-call "
                f"peak, {' → '.join(paths)} path, at {symbol} = " + "; ".join(out)]


class ReproSection(Section):
    kind, schema, result_type, items = "repro-oom", ReproFile.schema_name(), ReproFile, "cases"
    read = staticmethod(ReproFile.parse)

    def check(self, result: ReproFile) -> str | None:
        """Also the engine, whose cases each name by the engine's own key."""
        if not result.cases:
            return f"{self.items!r} is empty"
        try:
            key = engine_spec(result.engine).key_field
        except (KeyError, ValueError):
            return f"engine: {result.engine!r} is not one of {', '.join(engine_names())}"
        for i, case in enumerate(result.cases):
            if not isinstance(case.get(key), str):
                return f"cases[{i}].{key}: expected a string"
        return None

    def body(self, r: ReproFile, figure, tag: str) -> list[str]:
        lines = [render.repro_markdown(r)]
        if engine_spec(r.engine).view.budget_plot:  # the engine's segments, one bar per case
            lines += figure("budget", f"Memory budget per path{tag}",
                            lambda plots: plots.repro_budget(r))
        if r.log is not None:  # --log: the log's figures beside mlamem's, per path
            lines += figure("ledger", f"The server log beside mlamem{tag}",
                            lambda plots: plots.log_ledger(r.log))
        return lines

    def summary(self, r: ReproFile, tag: str) -> list[str]:
        verdicts = "; ".join(f"{render.case_label(c, r.engine)}: {render.verdict_text(c)}"
                             for c in r.cases)
        return [f"- repro-oom {r.scenario['name']}, {r.kernel['label']}{tag}: {verdicts}"]


class GraphsSection(Section):
    kind, schema, result_type, items = "graphs", GraphsFile.schema_name(), GraphsFile, "paths"
    read = staticmethod(GraphsFile.parse)

    def title(self, r: GraphsFile) -> str:
        return f"{self.scenario(r)}, {r.kernel['label']}"

    def body(self, r: GraphsFile, figure, tag: str) -> list[str]:
        return [render.graphs_markdown(r),
                *figure("pool", f"CUDA-graph pool per capture size{tag}",
                        lambda plots: plots.graph_pool_vs_size(r))]

    def summary(self, r: GraphsFile, tag: str) -> list[str]:
        return [f"- graphs {r.scenario['name']}, {r.kernel['label']}{tag}: {_graphs_verdict(r)}"]


class ValidateSection(Section):
    kind, schema, result_type, items = "validate", ValidateFile.schema_name(), ValidateFile, "comparisons"
    read = staticmethod(ValidateFile.parse)

    def scenario(self, r: ValidateFile) -> str:
        return ", ".join(dict.fromkeys(c.scenario for c in r.comparisons))

    def figures(self, r: ValidateFile) -> str:
        return "measured and predicted, compared"

    def body(self, r: ValidateFile, figure, tag: str) -> list[str]:
        return [render.validation_markdown(r.comparisons, r.command)]

    def summary(self, r: ValidateFile, tag: str) -> list[str]:
        cases = {(c.scenario, c.tokens, c.path) for c in r.comparisons}
        differ = [c for c in r.comparisons if not c.agrees]
        verdict = ("every figure equal, to the byte" if not differ
                   else f"{len(differ)} figure(s) DIFFER")
        plural = "s" if len(cases) != 1 else ""
        return [f"- validate: {len(cases)} case{plural} (scenario, T, path), "
                f"{len(r.comparisons)} figures predicted and measured: {verdict}"]


class CompareSection(Section):
    kind, schema, result_type, items = "compare", CompareFile.schema_name(), CompareFile, "rows"
    read = staticmethod(CompareFile.parse)

    def scenario(self, r: CompareFile) -> str:
        return r.scenario

    def title(self, r: CompareFile) -> str:
        return f"{r.scenario}, {' vs '.join(k.name for k in r.kernels)}, {r.op}"

    def body(self, r: CompareFile, figure, tag: str) -> list[str]:
        return [render.compare_markdown(r)]

    def summary(self, r: CompareFile, tag: str) -> list[str]:
        return [f"- compare {r.op} {' vs '.join(k.name for k in r.kernels)}, {r.scenario}: "
                f"{_compare_verdict(r)}"]


SECTIONS = (ProfileSection(), ReproSection(), GraphsSection(), ValidateSection(),
            CompareSection())  # the document's order; inputs in given order within each


def section_for(result: Result) -> Section:
    """The section that shows `result`, by its type."""
    return next(s for s in SECTIONS if isinstance(result, s.result_type))


@dataclass(frozen=True)
class Saved:
    """One result file: how the report names it, and what it holds."""

    source: str  # the path as the report shows it
    result: Result

    @property
    def section(self) -> Section:
        return section_for(self.result)

    @property
    def kind(self) -> str:
        return self.section.kind


@dataclass(frozen=True)
class Report:
    """The document and its figures: file name (next to the Markdown) -> PNG bytes."""

    markdown: str
    figures: dict[str, bytes] = field(default_factory=dict)


def load(path: Path, shown_as: str | None = None) -> Saved:
    """Read one saved result, by its `schema`; a UserError names the file and what is wrong."""
    return load_document(read_json(path), str(path), shown_as)


def load_all(documents: Sequence[tuple[str, dict]], output: Path | None) -> list[Saved]:
    """Every result, in order, from its (file, `read_json`'s object); the shards of one sweep
    (`--shard I/N`) merge into one result first (`shards.merge_shards`), named by their files
    joined with ` + `."""
    return [load_document(data, " + ".join(names),
                          " + ".join(shown_path(Path(n), output) for n in names))
            for names, data in shards.merge_shards(documents)]


def load_document(data: dict, path: str, shown_as: str | None = None) -> Saved:
    """A result read from `path` (a file, or shards' files joined), checked by its model and
    by what its section needs; a UserError names `path` and what is wrong."""
    schema = data.get("schema")
    section = next((s for s in SECTIONS if s.schema == schema), None)
    if section is None:
        raise UserError(f"{path}: schema {schema!r} is not a result mlamem report reads; "
                        f"expected one of: {', '.join(s.schema for s in SECTIONS)}")
    saved = None
    try:
        saved = Saved(shown_as or str(path), section.read(data))
        problem = section.check(saved.result)
    except ValueError as exc:  # the model's one line: FIELD: what is wrong
        problem = str(exc)
    if problem is None:
        try:
            _sections(saved, None)  # everything the renderers read is there
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            problem = f"{type(exc).__name__}: {exc}"
    if problem is not None:
        raise UserError(f"{path}: not a valid {schema} result ({problem})")
    return saved


def shown_path(path: Path, output: Path | None) -> str:
    """How the report names an input: relative to the report's folder (or to here)."""
    base = output.parent if output is not None else Path(".")
    try:
        return os.path.relpath(path, base)
    except ValueError:  # another drive
        return str(path)


# The document


def _figure_names(saved: Sequence[Saved], prefix: str) -> list[str]:
    """A distinct stem per result: PREFIX-KIND-SCENARIO[-predicted][-N]."""
    names, taken = [], set()
    for s in saved:
        stem = (f"{prefix}-{s.kind}-{safe_name(s.section.scenario(s.result))}"
                + ("" if s.result.measured else "-predicted"))
        name, n = stem, 2
        while name in taken:
            name, n = f"{stem}-{n}", n + 1
        taken.add(name)
        names.append(name)
    return names


def _figure(figures: dict[str, bytes] | None, name: str, alt: str,
            draw: Callable[[ModuleType], bytes], source: str) -> list[str]:
    """Render a figure into `figures` and return its Markdown reference; nothing if no figures.
    `draw` gets the `mlamem.render.plots` module, imported (with matplotlib) only when a figure is drawn."""
    if figures is None:
        return []
    from mlamem.render import plots

    try:
        figures[name] = draw(plots)
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"{source}: cannot plot {alt!r} ({type(exc).__name__}: {exc})") from None
    return [f"![{alt}]({name})", ""]


def _sections(saved: Saved, figures: dict[str, bytes] | None, stem: str = "") -> list[str]:
    """One result's part of the document; its figures go into `figures` (None: no plots)."""
    r, section = saved.result, saved.section
    tag = render.predicted_tag(r.measured)

    def figure(suffix: str, alt: str, draw: Callable[[ModuleType], bytes]) -> list[str]:
        return _figure(figures, fit_name(f"{stem}-{suffix}", ".png"), alt, draw, saved.source)

    return [f"## {section.kind}: {render.escaped(section.title(r), markdown=True)}{tag}", "",
            f"From {render.markdown_code(saved.source)}.", "", *section.body(r, figure, tag)]


def _environment_table(saved: Sequence[Saved]) -> list[str]:
    lines = ["| result | kind | figures | GPU | driver | CUDA | torch | kernels | mlamem | made "
             "(UTC) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for s in saved:
        env, r = s.result.environment, s.result
        figures = s.section.figures(r)
        if env is None:
            cells = ["not recorded"] + ["-"] * 5
        else:
            gpu = (f"{env.gpu} (SM {env.compute_capability})" if env.gpu else "none")
            cells = [gpu, env.driver or "-", env.cuda or "-", env.torch, _kernels_cell(env),
                     env.mlamem]
        cells = [render.escaped(cell, markdown=True) for cell in cells]
        lines.append(f"| {render.markdown_code(s.source)} | {s.kind} | {figures} | " + " | ".join(cells)
                     + f" | {r.created or 'not recorded'} |")
    lines += ["", "Commands that produced them:", ""]
    lines += [f"- {render.markdown_code(s.source)}: {render.markdown_code(s.result.command)}" for s in saved]
    return lines


def _kernels_cell(env: Environment) -> str:
    """The kernels with a version, `name version` each, e.g. `flashmla 1.0.0, triton 3.6.0`."""
    return ", ".join(f"{name} {version}" for name, version in env.kernels.items()
                     if version is not None) or "-"


def _graphs_verdict(r: GraphsFile) -> str:
    """The pool per path and how far off vLLM's estimate is (device-wide where known:
    measured, or modelled from the host setup)."""
    pools = " / ".join(f"{'failed' if p.pool_bytes is None else format_bytes(p.pool_bytes)} "
                       f"({p.path})" for p in r.paths)
    source = "device" if "device" in render.estimate_sources(r) else "allocator"
    off = " / ".join(f"{render.error_percent_text(render.estimate_of(p, source))} ({p.path})"
                     for p in r.paths)
    return (f"{len(r.capture_sizes)} captures, pool {pools}; vLLM's estimate ({source}) off "
            f"by {off}")


def _compare_verdict(r: CompareFile) -> str:
    """out and lse: bit-identical everywhere, or the largest differences."""
    if r.all_equal:
        return "out and lse bit-identical at every (value, path)"
    parts = [("out bit-identical" if all(row.out_equal for row in r.rows)
              else f"out differs by up to {max(row.out_max_diff for row in r.rows):.3g}"),
             ("lse bit-identical" if all(row.lse_equal for row in r.rows)
              else f"lse by up to {max(row.lse_max_diff for row in r.rows):.3g}")]
    return ", ".join(parts)


def build(saved: Sequence[Saved], figure_prefix: str | None) -> Report:
    """The whole document; figures named FIGURE_PREFIX-..., or none if the prefix is None."""
    ordered = sorted(saved, key=lambda s: SECTIONS.index(s.section))
    figures: dict[str, bytes] | None = None if figure_prefix is None else {}
    stems = _figure_names(ordered, figure_prefix or "")
    lines = ["# mlamem report", ""]
    if any(not s.result.measured for s in ordered):
        lines += ["**Some figures here are PREDICTED by the allocator model, not measured;** "
                  "every such table and plot says so.", ""]
    lines += ["## Summary", ""]
    for s in ordered:
        lines += [render.escaped(line, markdown=True)  # names from the files, one line each
                  for line in s.section.summary(s.result, render.predicted_tag(s.result.measured))]
    lines += ["", "## Environment", "", *_environment_table(ordered), ""]
    for s, stem in zip(ordered, stems, strict=True):
        lines += _sections(s, figures, stem)
    text = "\n".join(lines).rstrip("\n") + "\n"
    return Report(markdown=text.replace("\n\n\n", "\n\n"), figures=figures or {})


def write(report: Report, output: Path) -> list[Path]:
    """The figures, then the Markdown that references them; each written whole or not at all."""
    written = []
    for name, data in report.figures.items():
        path = output.parent / name
        write_atomic(path, data)
        written.append(path)
    write_atomic(output, report.markdown)
    return [*written, output]


REPORT_NAME = "report.md"


def check_report_dir(folder: Path) -> None:
    """Fail before any work if `profile --report FOLDER` (or `graphs --report`) could not write
    there: FOLDER, or the folder it would be created in, must exist and take a new file (tried,
    as root too)."""
    check_name_length(folder, "report_dir")
    if folder.exists() and not folder.is_dir():
        what = "a file" if folder.is_file() else "not a folder (a device or a pipe)"
        raise UserError(f"{folder} is {what}; give a folder (it is created if needed)",
                        field="report_dir")
    check_output_path(folder / REPORT_NAME if folder.is_dir() else folder, "report_dir")


def write_result_report(result: ProfileFile | GraphsFile, folder: Path) -> list[Path]:
    """`profile --report FOLDER` and `graphs --report FOLDER`: the result JSON, report.md and
    its PNGs, in FOLDER."""
    made = not folder.exists()
    folder.mkdir(exist_ok=True)
    try:
        return _write_into(result, folder)
    except BaseException:
        if made and not any(folder.iterdir()):  # no empty report folder left behind
            folder.rmdir()
        raise


def _write_into(result: ProfileFile | GraphsFile, folder: Path) -> list[Path]:
    """write_result_report's files in `folder`, which exists."""
    name = (safe_name(section_for(result).scenario(result)) + ("" if result.measured else ".predicted")
            + ".json")
    write_atomic(folder / name, json.dumps(result.file_dict(), indent=2) + "\n", "report_dir")
    output = folder / REPORT_NAME
    report = build([Saved(name, result)], figure_prefix=output.stem)
    return [folder / name, *write(report, output)]

