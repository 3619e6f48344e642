"""Figures for `mlamem report`, as PNG bytes: the same result gives the same bytes.

matplotlib runs on its Agg renderer through `Figure` objects (no pyplot, no global backend), in
matplotlib's default style whatever the user's matplotlibrc says, and the PNGs carry no software
or date stamp. Bytes are converted to GiB here, at the edge, and every axis states its unit.
"""

from __future__ import annotations

import io
from pathlib import PurePath
from typing import TYPE_CHECKING

import matplotlib
import matplotlib.style
from matplotlib.figure import Figure
from matplotlib.ticker import NullLocator

from mlamem.render.escape import escaped
from mlamem.results.graphs import GraphPath, GraphsFile
from mlamem.results.ledger import NOT_MODELLED
from mlamem.results.repro import ReproFile
from mlamem.spec.engine_registry import engine_spec
from mlamem.spec.units import GiB, MiB, format_bytes, gib

if TYPE_CHECKING:
    from mlamem.results.ledger import LogPath, ServerLogLedger
    from mlamem.results.profile import ProfileFile

DPI = 120
STYLE = {"font.size": 11, "axes.titlesize": 12, "figure.titlesize": 13, "legend.fontsize": 10,
         "axes.grid": True, "grid.alpha": 0.3, "axes.axisbelow": True}
PATH_COLORS = {"alloc": "tab:red", "workspace": "tab:blue"}
BUFFER_COLORS = ("tab:orange", "tab:purple", "tab:green", "tab:olive", "tab:cyan", "tab:brown",
                 "tab:pink", "tab:gray", "gold", "navy")
OTHER_FRACTION = 0.01  # buffers below 1 % of the tallest bar are drawn together as "other"
BUDGET_COLORS = {"weights": "#7f7f7f", "workspace": "tab:blue", "init_rest": "#c7c7c7",
                 "kv_cache": "tab:green", "free": "#f2f2f2", "need": "tab:orange",
                 "short": "tab:red"}


def _png(figure: Figure) -> bytes:
    """The figure as PNG bytes, without the Software stamp (so the bytes depend on data only)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})
    return buffer.getvalue()


def _figure(width: float, height: float) -> Figure:
    return Figure(figsize=(width, height), layout="constrained")


def plot_text(text: object) -> str:
    """Text from an input file as a plot shows it: `escaped` (one line, no control character),
    with `$` kept literal, so no name starts matplotlib's mathtext (`$\\foo$` would not draw)."""
    return escaped(text).replace("$", r"\$")


def _subject(measured: bool, gpu: str | None) -> str:
    return f"measured on {plot_text(gpu)}" if measured else "PREDICTED, not measured"


def _paths(result: ProfileFile) -> list[str]:
    return list(dict.fromkeys(row.path for row in result.rows))


def _tokens(result: ProfileFile) -> list[int]:
    return list(dict.fromkeys(row.tokens for row in result.rows))


def peak_vs_tokens(result: ProfileFile) -> bytes:
    """Per-call peak allocated against T, one line per path, log-2 T axis, GiB."""
    with matplotlib.style.context("default"), matplotlib.rc_context(STYLE):
        figure = _figure(8, 5)
        ax = figure.add_subplot()
        tokens = _tokens(result)
        for path in _paths(result):
            rows = [r for r in result.rows if r.path == path and r.failure is None]
            xs = [r.tokens for r in rows]
            ys = [gib(r.peak_allocated_bytes) for r in rows]
            ax.plot(xs, ys, marker="o", linewidth=2, color=PATH_COLORS.get(path),
                    label=f"{path} path")
            above = path == "alloc"  # the larger path labelled above-left, others to the right
            for x, y in zip(xs, ys, strict=True):
                ax.annotate(f"{y:.3f}", (x, y), textcoords="offset points",
                            xytext=(-6, 6) if above else (9, 0), ha="right" if above else "left",
                            va="bottom" if above else "center", fontsize=9,
                            color=PATH_COLORS.get(path),
                            bbox={"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none",
                                  "alpha": 0.85})
            for r in result.rows:
                if r.path == path and r.failure is not None:
                    ax.axvline(r.tokens, color=PATH_COLORS.get(path), linestyle=":",
                               label=f"{path} path: {'OOM' if r.oom else 'failed'} at T={r.tokens}")
        ax.set_xscale("log", base=2)
        ax.set_xticks(tokens, labels=[str(t) for t in tokens])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlim(min(tokens) / 1.5, max(tokens) * 1.5)
        top = max((gib(r.peak_allocated_bytes) for r in result.rows if r.failure is None),
                  default=1)
        ax.set_ylim(0, top * 1.1)
        ax.set_xlabel("T, query tokens per step (s_q of the decode call; log-2 scale)")
        ax.set_ylabel("per-call peak allocated (GiB)")
        ax.set_title(f"{plot_text(result.scenario.name)}: per-call peak allocation\n"
                     f"{_subject(result.measured, result.environment.gpu)}, "
                     f"{plot_text(result.kernel.label)}")
        ax.legend(loc="upper left")
        return _png(figure)


def _live_buffers(row) -> dict[str, int]:
    """Bytes of each buffer live at the call's peak (blocks: they add up to the peak)."""
    sizes: dict[str, int] = {}
    for b in row.buffers:
        if b.live_at_peak:
            name = plot_text(b.name)
            sizes[name] = sizes.get(name, 0) + b.block_bytes
    return sizes


def buffers_by_tokens(result: ProfileFile) -> bytes:
    """A stacked bar per T of the buffers live at the call's peak, one panel per path."""
    paths, tokens = _paths(result), _tokens(result)
    live = {(r.tokens, r.path): _live_buffers(r) for r in result.rows if r.failure is None}
    tallest = max((sum(v.values()) for v in live.values()), default=0)
    names = list(dict.fromkeys(name for sizes in live.values() for name in sizes))
    big = [n for n in names if max(s.get(n, 0) for s in live.values()) >= OTHER_FRACTION * tallest]
    small = [n for n in names if n not in big]
    colors = {name: BUFFER_COLORS[i % len(BUFFER_COLORS)] for i, name in enumerate(big)}
    with matplotlib.style.context("default"), matplotlib.rc_context(STYLE):
        figure = _figure(4.2 * len(paths) + 2.8, 5.2)
        axes = figure.subplots(1, len(paths), sharey=True, squeeze=False)[0]
        for ax, path in zip(axes, paths, strict=True):
            positions = range(len(tokens))
            bottoms = [0.0] * len(tokens)
            for name in [*big, *(["other"] if small else [])]:
                heights = []
                for t in tokens:
                    sizes = live.get((t, path), {})
                    value = (sum(sizes.get(n, 0) for n in small) if name == "other"
                             else sizes.get(name, 0))
                    heights.append(gib(value))
                label = name if name != "other" else f"other ({', '.join(small)})"
                ax.bar(positions, heights, bottom=bottoms, width=0.65, label=label,
                       color=colors.get(name, "#bbbbbb"), edgecolor="white", linewidth=0.5)
                bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
            for i, t in enumerate(tokens):
                total = f"{bottoms[i]:.3f}" if (t, path) in live else "failed"
                ax.annotate(total, (i, bottoms[i]), textcoords="offset points", xytext=(0, 3),
                            ha="center", fontsize=9)
            ax.set_xticks(list(positions), labels=[str(t) for t in tokens])
            ax.set_xlabel("T, query tokens per step")
            ax.set_title(f"{path} path")
            ax.grid(axis="x", visible=False)
        axes[0].set_ylabel("allocated at the call's peak (GiB)")
        axes[0].set_ylim(0, gib(tallest) * 1.08 if tallest else 1)
        handles, labels = axes[0].get_legend_handles_labels()
        figure.legend(handles[::-1], labels[::-1], loc="outside right center", title="buffer")
        figure.suptitle(f"{plot_text(result.scenario.name)}: buffers live at each call's peak\n"
                        f"{_subject(result.measured, result.environment.gpu)}, "
                        f"{plot_text(result.kernel.label)}")
        return _png(figure)


def _verdict_note(case: dict) -> str:
    if case["verdict"] == "fits":
        return f"fits, headroom {format_bytes(case['headroom_bytes'])}"
    if case["verdict"] == "oom":
        what = case.get("oom_buffer") or "an allocation"
        size = case.get("oom_requested_bytes")
        free = case.get("free_bytes_at_oom")
        return (f"OOM in {case['phase']}: {what}"
                + (f" ({format_bytes(size)})" if size is not None else "")
                + (f", {format_bytes(free)} free" if free is not None else ""))
    return case["verdict"]


def _segment_bars(ax, y: float, segments: list[tuple[str, int, str]], seen: set[str]) -> float:
    """A case's segments as one bar at `y` (each labelled once in the legend); its right end."""
    left = 0.0
    for label, size, key in segments:
        width = gib(size)
        ax.barh(y + 0.17, width, left=left, height=0.34, color=BUDGET_COLORS[key],
                edgecolor="black" if key == "free" else "white", linewidth=0.6,
                label=label if label not in seen else None)
        if width >= 2.5:
            ax.text(left + width / 2, y + 0.17, f"{width:.2f}", ha="center",
                    va="center", fontsize=9, color="white" if key in (
                        "weights", "kv_cache", "workspace") else "black")
        seen.add(label)
        left += width
    return left


def _need_bar(ax, y: float, case: dict, need: int, seen: set[str]) -> float:
    """The full step's need as a bar at `y` from init + KV cache, past the cap hatched, with
    its headroom or shortfall; its right end."""
    start = gib(case["init_bytes"] + case["kv_cache_bytes"])
    limit = gib(case["torch_limit_bytes"])
    fitting = min(gib(need), limit - start)
    label = "full step's need (activations + decode call)"
    ax.barh(y - 0.17, fitting, left=start, height=0.3, color=BUDGET_COLORS["need"],
            label=label if label not in seen else None)
    seen.add(label)
    if gib(need) > limit - start:
        label = "need beyond the cap"
        ax.barh(y - 0.17, gib(need) - (limit - start), left=limit, height=0.3,
                color=BUDGET_COLORS["short"], hatch="//", edgecolor="white",
                label=label if label not in seen else None)
        seen.add(label)
    ax.text(start - 0.3, y - 0.17, f"step {gib(need):.2f}", ha="right",
            va="center", fontsize=9)
    margin = limit - start - gib(need)
    ax.text(max(limit, start + gib(need)) + 0.4, y - 0.17,
            f"headroom {margin:.3f}" if margin >= 0 else f"short by {-margin:.3f}",
            ha="left", va="center", fontsize=9,
            color="black" if margin >= 0 else BUDGET_COLORS["short"])
    return start + gib(need)


def repro_budget(result: ReproFile) -> bytes:
    """One bar per case, of the segments its engine's view names (vLLM: weights, workspace,
    rest of init, KV cache, free), and the step's need."""
    engine = engine_spec(result.engine)
    view = engine.view
    cases = result.cases
    with matplotlib.style.context("default"), matplotlib.rc_context(STYLE):
        figure = _figure(11, 2.4 + 1.5 * len(cases))
        ax = figure.add_subplot()
        seen: set[str] = set()
        right = 0.0
        for i, case in enumerate(cases):
            y = len(cases) - 1 - i
            right = max(right, _segment_bars(ax, y, view.budget_segments(case), seen))
            need = view.step_need(case)
            if need is not None:
                right = max(right, _need_bar(ax, y, case, need, seen))
        caps = {case["torch_limit_bytes"] for case in cases if case.get("torch_limit_bytes")}
        for k, cap in enumerate(sorted(caps)):
            ax.axvline(gib(cap), color="black", linestyle="--", linewidth=1.2,
                       label="torch cap (target GPU less non-torch memory)" if k == 0 else None)
        ax.set_yticks(range(len(cases)), labels=[
            f"{plot_text(view.case_label(c))}\n{_verdict_note(c)}" for c in reversed(cases)])
        ax.set_xlim(0, right * 1.16 if right else 1)
        ax.set_ylim(-0.6, len(cases) - 0.4)
        ax.set_xlabel("device memory of one rank (GiB)")
        ax.grid(axis="y", visible=False)
        budget, s = result.budget, result.scenario
        target = f" ({s['target_gpu']})" if s.get("target_gpu") else ""
        share = f" at utilization {budget['utilization']}" if engine.reads_utilization else ""
        figure.suptitle(f"{plot_text(s['name'])}: memory of one engine rank, per path (GiB)\n"
                     f"target {format_bytes(budget['gpu_memory_bytes'])}{target}{share}, "
                     f"{view.step_tokens} {budget['max_num_batched_tokens']}\n"
                     f"{_subject(result.measured, result.environment.gpu)}, "
                     f"{plot_text(result.kernel['label'])}")
        figure.legend(loc="outside lower center", ncols=3)
        return _png(figure)


LEDGER_COLORS = {"weights": "#7f7f7f", "non-torch": "tab:brown", "activation peak": "tab:purple",
                 "CUDA graphs": "tab:cyan", "KV cache": "tab:green", "step buffers": "tab:orange"}
# ledger rows not stacked: the graph estimate is set aside from the KV cache, not held beside
# it, and vLLM 0.27+'s one figure for two components repeats two bars' sum
NOT_STACKED = ("CUDA-graph estimate", "weights + non-torch", "activation peak + CUDA-graph estimate")
HELD_LABEL = "held by the rank beyond mlamem's model"
NOT_IN_LOG = "hatched: mlamem's figure, not printed by the log"


def _ledger_bars(path: LogPath) -> dict[str, list[tuple[str, int, bool]]]:
    """The log's bar and mlamem's, as (component, bytes, whose figure it is: the bar's own);
    the step's buffers summed, the held memory last on mlamem's."""
    bars: dict[str, list[tuple[str, int, bool]]] = {"mlamem": [], "the log": []}
    step = sum(r.mlamem_bytes or 0 for r in path.rows if r.component.startswith("step buffer"))
    for row in path.rows:
        if (row.component in (NOT_MODELLED, *NOT_STACKED)
                or row.component.startswith("step buffer")):
            continue
        if row.mlamem_bytes is not None:
            bars["mlamem"].append((row.component, row.mlamem_bytes, True))
        if row.log_bytes is not None or row.mlamem_bytes is not None:
            logged = row.log_bytes is not None
            bars["the log"].append((row.component, row.log_bytes if logged else row.mlamem_bytes,
                                    logged))
    if step:
        bars["the log"].append(("step buffers", step, False))
        bars["mlamem"].append(("step buffers", step, True))
    if path.held_bytes:
        bars["mlamem"].append((HELD_LABEL, path.held_bytes, True))
    return bars


def _ledger_bar(ax, y: float, whose: str, segments: list[tuple[str, int, bool]],
                seen: set[str]) -> float:
    """One stacked bar at `y`, each segment tagged `whose: component` (its gid); its right end."""
    left = 0.0
    for component, size, own in segments:
        width = gib(size)
        held = component == HELD_LABEL
        patch = ax.barh(y, width, left=left, height=0.36, label=None if component in seen
                        else component, color="white" if held else LEDGER_COLORS[component],
                        edgecolor=BUDGET_COLORS["short"] if held else "white",
                        hatch="//" if held or not own else None, alpha=1.0 if own else 0.45)
        patch[0].set_gid(f"{whose}: {component}")
        seen.add(component)
        if width >= 2.5:
            ax.text(left + width / 2, y, f"{width:.2f}", ha="center", va="center", fontsize=9)
        left += width
    return left


def ledger_figure(ledger: ServerLogLedger) -> Figure:
    """Per path, the log's figures as one stacked bar and mlamem's as another, mlamem's ending
    in the memory the rank held beyond its model; the OOM message's device total as a line."""
    with matplotlib.style.context("default"), matplotlib.rc_context(STYLE):
        rows = [(path, whose, bar) for path in ledger.paths
                for whose, bar in _ledger_bars(path).items()]
        figure = _figure(11, 2.4 + 0.7 * len(rows))
        ax = figure.add_subplot()
        seen: set[str] = set()
        right = max((_ledger_bar(ax, len(rows) - 1 - i, whose, bar, seen)
                     for i, (_, whose, bar) in enumerate(rows)), default=0.0)
        total = ledger.ooms[0].total_bytes if ledger.ooms else None
        if total:
            ax.axvline(gib(total), color="black", linestyle="--", linewidth=1.2,
                       label="the device's total (the OOM message)")
            right = max(right, gib(total))
        ax.set_yticks(range(len(rows)), labels=[
            f"{plot_text(path.case)}: {whose}" for path, whose, _ in reversed(rows)])
        ax.set_xlim(0, right * 1.08 if right else 1)
        ax.set_xlabel("device memory of one rank (GiB)")
        ax.grid(axis="y", visible=False)
        held_on = (f"; held memory derived on the {plot_text(ledger.held_path)} path"
                   if ledger.held_path else "")
        figure.suptitle(f"the server log {plot_text(PurePath(ledger.source).name)} beside mlamem, per path "
                        f"(GiB)\n{NOT_IN_LOG}{held_on}")
        figure.legend(loc="outside lower center", ncols=3)
        return figure


def log_ledger(ledger: ServerLogLedger) -> bytes:
    """The ledger's figure as PNG bytes."""
    return _png(ledger_figure(ledger))


GRAPH_PATH_COLORS = {**PATH_COLORS, "workspace-full": "tab:green"}
ESTIMATE_STYLES = {"allocator": "--", "device": ":"}


def _cumulative(path: GraphPath, field: str) -> list[tuple[int, int]]:
    """(T, the sum of `field` over the captures up to and including T's), in capture order,
    over the captures that succeeded."""
    points, total = [], 0
    for capture in path.captures:
        if capture.failure is not None or getattr(capture, field) is None:
            break
        total += getattr(capture, field)
        points.append((capture.tokens, total))
    return points


def _tick_sizes(sizes: list[int]) -> list[int]:
    """The powers of two among the sizes, and the smallest and largest."""
    return sorted({s for s in sizes if s & (s - 1) == 0} | {min(sizes), max(sizes)})


def graph_pool_vs_size(result: GraphsFile) -> bytes:
    """Per path, the pool after each capture (cumulative, capture order: largest T first) and
    the peak inside each capture (lighter), with vLLM's estimates as dashed (allocator) and
    dotted (device, measured) lines; MiB, or GiB from 1 GiB up."""
    sizes = result.capture_sizes
    heights = [c.peak_allocated_bytes or 0 for p in result.paths for c in p.captures]
    heights += [max(p.device_bytes or 0, p.pool_bytes or 0) for p in result.paths]
    heights += [e.estimate_bytes for p in result.paths for e in p.estimates]
    unit, scale = ("GiB", GiB) if max(heights, default=0) >= GiB else ("MiB", MiB)
    with matplotlib.style.context("default"), matplotlib.rc_context(STYLE):
        figure = _figure(9.5, 6.5)
        ax = figure.add_subplot()
        for path in result.paths:
            color, name = GRAPH_PATH_COLORS.get(path.path), plot_text(path.path)
            pool = _cumulative(path, "pool_growth_bytes")
            ax.plot([t for t, _ in pool], [b / scale for _, b in pool], marker="o",
                    markersize=3, linewidth=2, color=color,
                    label=f"{name}: pool after each capture")
            device = _cumulative(path, "device_growth_bytes")
            if device:
                ax.plot([t for t, _ in device], [b / scale for _, b in device], linestyle="-.",
                        linewidth=1.5, color=color,
                        label=f"{name}: device growth after each capture (mem_get_info)")
            peaks = [c for c in path.captures if c.failure is None]
            ax.plot([c.tokens for c in peaks], [c.peak_allocated_bytes / scale for c in peaks],
                    marker=".", markersize=3, linewidth=1, alpha=0.4, color=color,
                    label=f"{name}: peak inside each capture")
            for estimate in path.estimates:
                ax.axhline(estimate.estimate_bytes / scale, color=color,
                           linestyle=ESTIMATE_STYLES[estimate.source], linewidth=1.3,
                           label=f"{name}: vLLM's estimate ({estimate.source}) "
                                 f"{format_bytes(estimate.estimate_bytes)}, "
                                 + ("error n/a" if estimate.error_percent is None
                                    else f"{estimate.error_percent:+.1f}%"))
            failed = next((c for c in path.captures if c.failure is not None), None)
            if failed is not None:
                ax.axvline(failed.tokens, color=color, linestyle=":", linewidth=1,
                           label=f"{name}: {'OOM' if failed.oom else 'failed'} at "
                                 f"T={failed.tokens}")
        ax.set_xscale("log", base=2)
        ticks = _tick_sizes(sizes)
        ax.set_xticks(ticks, labels=[str(t) for t in ticks])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlim(max(sizes) * 1.4, min(sizes) / 1.4)  # capture order: largest first
        ax.set_ylim(0, max(heights, default=0) / scale * 1.12 or 1)
        ax.set_xlabel("capture size T, tokens (capture order, largest first; log-2 scale)")
        ax.set_ylabel(f"pool after each capture; peak inside it ({unit})")
        ax.set_title(f"{plot_text(result.scenario['name'])}: CUDA-graph pool over {len(sizes)} captures\n"
                     f"{_subject(result.measured, result.environment.gpu)}, "
                     f"{plot_text(result.kernel['label'])}")
        figure.legend(loc="outside lower center", ncols=2, fontsize=9)
        return _png(figure)
