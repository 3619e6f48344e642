"""`mlamem graphs` for people: the terminal table, the PR's Markdown, JSON, CSV, and the
`mlamem report` section with its plot, from results predicted on the CPU."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import re
from pathlib import Path

import matplotlib.image
import pytest

from mlamem import render
from mlamem.cli import main
from mlamem.commands.graphs import run_graphs, vllm_estimate
from mlamem.kernels import load_kernel
from mlamem.render import plots
from mlamem.render.common import signed_bytes
from mlamem.render.graphs import TABLE_WIDTH
from mlamem.render.report import build, load, write_result_report
from mlamem.results.graphs import Estimate, GraphsFile
from mlamem.spec import scenario
from mlamem.spec.errors import UserError
from mlamem.spec.units import MiB, format_bytes

SIZES = [512, 256, 8, 1]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def predicted() -> GraphsFile:
    return run_graphs(scenario.load("glm5-fp8-tp8"), ["alloc", "workspace"], sizes=SIZES,
                      command="mlamem graphs --capture-sizes 512,256,8,1 --predict",
                      predict=True)


@pytest.fixture(scope="module")
def three_paths() -> GraphsFile:
    return run_graphs(scenario.load("glm5-fp8-tp8"), ["alloc", "workspace", "workspace-full"],
                      kernel=load_kernel("triton")(), sizes=SIZES, command="mlamem graphs",
                      predict=True)


def _replace(model, **changes):
    return model.model_copy(update=changes)


def as_measured(result: GraphsFile, unequal_tokens: int = 8) -> GraphsFile:
    """The predicted result in a measured result's shape: each capture's device growth is its
    pool growth plus 2 MiB (instantiation), the replay at `unequal_tokens` differs, and the
    device estimate is vLLM's rule on those samples."""
    paths = []
    for path in result.paths:
        captures = [_replace(c, device_growth_bytes=c.pool_growth_bytes + 2 * MiB,
                                        replay_equal=c.tokens != unequal_tokens)
                    for c in path.captures]
        device = sum(c.device_growth_bytes for c in captures)
        estimate = Estimate.model_validate(dataclasses.asdict(vllm_estimate(
            "device", [c.device_growth_bytes for c in captures[:2]], device, len(captures))))
        paths.append(_replace(
            path, captures=captures, device_bytes=device,
            unexplained_device_bytes=device - path.pool_bytes,
            estimates=[*path.estimates, estimate]))
    environment = _replace(result.environment, gpu="NVIDIA H200",
                                      compute_capability="9.0")
    return _replace(result, measured=True, not_measured_reason=None, paths=paths,
                               environment=environment)


def _size_rows(text: str) -> list[list[str]]:
    """The cells of the per-capture table's rows (the first table): those that start with a
    capture size."""
    table = text.split("\n\n")[0]
    return [line.split() for line in table.splitlines()
            if line.strip() and line.split()[0].isdigit()]


def _totals(text: str) -> dict[str, str]:
    """The totals table's lines by their label."""
    return {re.split(r"\s{2,}", line.strip())[0]: line for line in text.splitlines()
            if line.strip()}


def test_every_format_renders_a_predicted_result(predicted):
    """table, markdown, json and csv each render, and the human ones say PREDICTED."""
    assert set(render.GRAPHS_FORMATS) == {"table", "markdown", "json", "csv"}
    texts = {name: fmt(predicted) for name, fmt in render.GRAPHS_FORMATS.items()}
    assert all(isinstance(text, str) and text.endswith("\n") for text in texts.values())
    assert "mlamem graphs: glm5-fp8-tp8 (PREDICTED), FlashMLA" in texts["table"]
    assert "PREDICTED, not measured (--predict was given)" in texts["table"]
    headings = [line for line in texts["markdown"].splitlines() if line.startswith("#")]
    assert len(headings) == 2 and all(h.endswith("(PREDICTED)") for h in headings)
    assert json.loads(texts["json"])["schema"] == "mlamem.graphs/1"


def test_table_lists_every_size_largest_first_then_the_totals(predicted):
    """One row per capture size, largest first, each path's peak and pool growth with units;
    then each path's pool and vLLM's estimates, allocator and device (modelled), with their
    errors in bytes and %."""
    text = render.GRAPHS_FORMATS["table"](predicted)
    rows = _size_rows(text)
    assert [int(row[0]) for row in rows] == SIZES
    alloc, workspace = predicted.paths
    first = rows[0]
    assert " ".join(first[1:]) == (
        f"{format_bytes(alloc.captures[0].peak_allocated_bytes)} "
        f"+{format_bytes(alloc.captures[0].pool_growth_bytes)} "
        f"{format_bytes(workspace.captures[0].peak_allocated_bytes)} "
        f"+{format_bytes(workspace.captures[0].pool_growth_bytes)}")
    assert all(row[3] == "0" and row[6] == "0" for row in rows[1:])  # later ones reuse the pool
    pool_line = next(line for line in text.splitlines() if line.startswith("pool (reserved"))
    assert pool_line.split()[-4:] == [*format_bytes(alloc.pool_bytes).split(),
                                      *format_bytes(workspace.pool_bytes).split()]
    estimate = alloc.estimates[0]
    assert estimate.source == "allocator" and estimate.error_percent is not None
    assert (f"+{format_bytes(estimate.error_bytes)} ({estimate.error_percent:+.1f}%)"
            in text)
    device = alloc.estimates[1]  # modelled: the host setup's memory outside the allocator
    assert device.source == "device"
    assert format_bytes(device.estimate_bytes) in _totals(text)["vLLM's estimate (device)"]
    assert "rep" not in text.split("\n")[2]  # nothing replays on the model
    assert max(len(line) for line in text.splitlines()) <= TABLE_WIDTH


def test_the_long_default_list_stays_compact():
    """The 51 default sizes (vLLM's default max_num_seqs 1024): one row each, within the table
    width."""
    glm = scenario.load("glm5-fp8-tp8")
    glm = dataclasses.replace(glm, sections={"vllm": dataclasses.replace(glm.section("vllm"),
                                                                         max_num_seqs=1024)})
    result = run_graphs(glm, ["alloc", "workspace"],
                        command="mlamem graphs --predict", predict=True)
    text = render.GRAPHS_FORMATS["table"](result)
    assert len(result.capture_sizes) == 51
    assert [int(row[0]) for row in _size_rows(text)] == result.capture_sizes
    assert max(len(line) for line in text.splitlines()) <= 80


def test_markdown_has_each_paths_estimate_and_error(predicted):
    """The summary row per path: pool, largest capture's peak, the device growth (modelled
    from the host setup) and the part the pool does not explain, vLLM's estimates (allocator,
    device), their errors."""
    text = render.graphs_markdown(predicted)
    for path in predicted.paths:
        estimate, device = path.estimates
        row = next(line for line in text.splitlines() if line.startswith(f"| {path.path} |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[2:] == [
            format_bytes(path.pool_bytes), format_bytes(path.captures[0].peak_allocated_bytes),
            format_bytes(path.held_bytes), format_bytes(path.device_bytes),
            signed_bytes(path.unexplained_device_bytes), format_bytes(estimate.estimate_bytes),
            f"+{format_bytes(estimate.error_bytes)} ({estimate.error_percent:+.1f}%)",
            format_bytes(device.estimate_bytes),
            f"{signed_bytes(device.error_bytes)} ({device.error_percent:+.1f}%)", "n/a"]
        assert (f"{format_bytes(estimate.first_bytes)} + {format_bytes(estimate.per_graph_bytes)}"
                f" x {len(SIZES) - 1} = {format_bytes(estimate.estimate_bytes)}") in text
    captures = [line for line in text.splitlines() if line.split("|")[1:2] and
                line.split("|")[1].strip().isdigit()]
    assert [int(line.split("|")[1]) for line in captures] == SIZES
    assert text.rstrip().endswith(f"- Command: `{predicted.command}`")


def test_csv_has_one_row_per_capture_per_path(predicted):
    """(path, tokens) rows in capture order, every cell the capture's plain value."""
    rows = list(csv.DictReader(io.StringIO(render.graphs_csv(predicted))))
    assert len(rows) == sum(len(p.captures) for p in predicted.paths) == 2 * len(SIZES)
    expected = [(p.path, c) for p in predicted.paths for c in p.captures]
    for row, (path, capture) in zip(rows, expected, strict=True):
        assert row == {"path": path, **{name: render.csv_cell(getattr(capture, name))
                                        for name in list(row)[1:]}}
        assert row["tokens"] == str(capture.tokens) and row["failure"] in ("", capture.failure)
    assert list(rows[0]) == ["path", "tokens", "peak_allocated_bytes", "peak_reserved_bytes",
                             "pool_growth_bytes", "held_bytes", "device_growth_bytes",
                             "replay_equal", "failure"]


@pytest.mark.parametrize("shape", ["predicted", "measured"])
def test_json_round_trips(predicted, shape):
    """graphs_json reads back through GraphsFile.from_dict to the same dictionary."""
    result = predicted if shape == "predicted" else as_measured(predicted)
    text = render.graphs_json(result)
    assert text.endswith("}\n")
    assert GraphsFile.parse(json.loads(text)).file_dict() == result.file_dict()


def test_measured_result_shows_device_figures_and_replay_marks(three_paths):
    """Measured: a replay mark per capture, device growth, the part the pool does not explain
    and vLLM's device estimate; three paths still fit the table width."""
    result = as_measured(three_paths)
    text = render.GRAPHS_FORMATS["table"](result)
    assert max(len(line) for line in text.splitlines()) <= TABLE_WIDTH
    rows = {int(row[0]): row for row in _size_rows(text)}
    assert rows[8].count("NO") == 3 and rows[512].count("yes") == 3
    assert "measured on NVIDIA H200 (SM9.0), Triton" in text and "PREDICTED" not in text
    lines = _totals(text)
    assert lines["not explained by the pool"].split()[-2:] == ["+8.000", "MiB"]  # 4 x 2 MiB
    device = result.paths[0].estimates[1]
    assert device.source == "device"
    assert format_bytes(device.estimate_bytes) in lines["vLLM's estimate (device)"]
    assert lines["every replay bit-identical"].split()[-3:] == ["NO", "NO", "NO"]
    markdown = render.graphs_markdown(result)
    assert "| device growth | not explained by the pool |" in markdown
    assert "vLLM's estimate (device)" in markdown and "(PREDICTED)" not in markdown


def test_a_failed_capture_stops_its_path_in_every_view(predicted):
    """An OOM at T=256: that cell says OOM with the request, later sizes are '-', the path's
    totals n/a, and the failure is named."""
    alloc = predicted.paths[0]
    oom = _replace(alloc.captures[1], peak_allocated_bytes=None, failure="OOM",
                              oom=True, oom_requested_bytes=64 * MiB)
    failed = _replace(alloc, captures=[alloc.captures[0], oom], pool_bytes=None,
                                 held_bytes=None, estimates=[],
                                 failure="T=256: OutOfMemoryError: CUDA out of memory")
    result = _replace(predicted, paths=[failed, predicted.paths[1]])
    rows = {int(row[0]): row for row in _size_rows(render.GRAPHS_FORMATS["table"](result))}
    assert rows[256][1:5] == ["OOM", "(64.000", "MiB)", "-"]
    assert rows[8][1:3] == ["-", "-"]
    markdown = render.graphs_markdown(result)
    assert "| alloc | - | n/a | " in markdown
    assert "alloc path stopped at T=256: OutOfMemoryError: CUDA out of memory" in markdown
    assert len(list(csv.DictReader(io.StringIO(render.graphs_csv(result))))) == 2 + len(SIZES)
    assert plots.graph_pool_vs_size(result).startswith(PNG_SIGNATURE)


def test_plot_is_a_deterministic_png(predicted, three_paths):
    """The pool plot is the same bytes twice, predicted or measured."""
    for result in (predicted, as_measured(three_paths)):
        first = plots.graph_pool_vs_size(result)
        assert first.startswith(PNG_SIGNATURE) and b"Software" not in first
        assert plots.graph_pool_vs_size(result) == first


def _saved(tmp_path: Path, result: GraphsFile) -> Path:
    path = tmp_path / "graphs.predicted.json"
    path.write_text(render.graphs_json(result))
    return path


def test_report_renders_a_saved_graphs_file_with_its_plot(tmp_path, predicted):
    """`mlamem report` reads mlamem.graphs/1: the summary line, the section and the plot."""
    (tmp_path / "out").mkdir()
    output = tmp_path / "out" / "report.md"
    assert main(["report", str(_saved(tmp_path, predicted)), "--output", str(output)]) == 0
    text = output.read_text()
    alloc, workspace = predicted.paths
    assert (f"- graphs glm5-fp8-tp8, FlashMLA (PREDICTED): 4 captures, pool "
            f"{format_bytes(alloc.pool_bytes)} (alloc) / {format_bytes(workspace.pool_bytes)} "
            f"(workspace); vLLM's estimate (device) off by "
            f"{alloc.estimates[1].error_percent:+.1f}% (alloc) / "
            f"{workspace.estimates[1].error_percent:+.1f}% (workspace)") in text
    assert "## graphs: glm5-fp8-tp8, FlashMLA (PREDICTED)" in text
    assert render.graphs_markdown(predicted) in text
    name = "report-graphs-glm5-fp8-tp8-predicted-pool.png"
    assert f"![CUDA-graph pool per capture size (PREDICTED)]({name})" in text
    image = matplotlib.image.imread(output.parent / name)
    assert image.shape[0] > 400 and image.shape[1] > 800


def test_report_summary_uses_the_device_estimate_when_measured(tmp_path, predicted):
    """A measured file's summary line quotes vLLM's own (device-wide) estimate."""
    result = as_measured(predicted)
    report = build([load(_saved(tmp_path, result))], figure_prefix=None)
    device = [p.estimates[1].error_percent for p in result.paths]
    assert (f"vLLM's estimate (device) off by {device[0]:+.1f}% (alloc) / {device[1]:+.1f}% "
            "(workspace)") in report.markdown
    assert report.figures == {}


def test_report_rejects_a_graphs_file_without_paths(tmp_path, predicted):
    """A graphs file with no paths is refused with the file and the reason."""
    data = {**predicted.file_dict(), "paths": []}
    path = tmp_path / "empty.json"
    path.write_text(json.dumps(data))
    with pytest.raises(UserError, match=r"not a valid mlamem.graphs/1 result \('paths' is empty"):
        load(path)


def test_graphs_report_folder_holds_the_json_report_and_plot(tmp_path, predicted):
    """`graphs --report DIR` (write_result_report): the result JSON, report.md and the plot;
    the JSON reads back to the same result."""
    folder = tmp_path / "run"
    written = write_result_report(predicted, folder)
    assert sorted(p.name for p in written) == [
        "glm5-fp8-tp8.predicted.json", "report-graphs-glm5-fp8-tp8-predicted-pool.png",
        "report.md"]
    saved = json.loads((folder / "glm5-fp8-tp8.predicted.json").read_text())
    assert GraphsFile.parse(saved).file_dict() == predicted.file_dict()
    assert "## graphs: glm5-fp8-tp8, FlashMLA (PREDICTED)" in (folder / "report.md").read_text()
