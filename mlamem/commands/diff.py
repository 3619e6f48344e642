"""`mlamem diff A B`: two results of one kind (profile, repro-oom, graphs) or two snapshots, case
by case: the peak in A and in B and, per named buffer, the bytes (between snapshots: the blocks
live at the peak, an MLA call's by buffer name, any other by its frame).

Cases pair by their key (a profile's scenario, operation, T and path); a case left over on each
side with the same key but its path pairs too, so alloc against workspace compares. Results from
different environments are compared, with the fields that differ named as the gate names them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mlamem import results
from mlamem.commands.explain import live_by_name, load
from mlamem.commands.gate import differences_between
from mlamem.results.diff import DiffFile
from mlamem.runtime import environment
from mlamem.spec.errors import UserError
from mlamem.spec.files import read_json
from mlamem.spec.scenario_names import DEFAULT_SCENARIO

SCHEMA = "mlamem.diff/1"
KINDS = {"mlamem.profile/1": "profile", "mlamem.repro-oom/1": "repro-oom",
         "mlamem.graphs/1": "graphs"}
SNAPSHOT_SUFFIXES = (".pickle", ".pkl")


@dataclass(frozen=True)
class Unit:
    """One case of one side: its key, its label, its peak and its bytes per name."""

    key: tuple
    loose: tuple  # the key without the path: pairs what is left over
    label: str
    peak_bytes: int | None
    buffers: dict[str, int]


@dataclass(frozen=True)
class Side:
    """One file read: its kind, cases, and (results only) what the gate compares."""

    kind: str
    units: list[Unit]
    origin: tuple[bool, str, dict] | None  # (measured, kernel, environment); None: a snapshot


def read_side(path: Path) -> Side:
    """A result file through its model (`mlamem.results`), or a snapshot; else a UserError."""
    if path.suffix.lower() in SNAPSHOT_SUFFIXES:
        return _snapshot_side(path)
    data = read_json(path)
    schema = data.get("schema")
    if schema not in KINDS:
        kinds = ", ".join(KINDS)
        raise UserError(f"{path}: {schema!r} is not a result diff compares ({kinds}, or "
                        "snapshots named .pickle)")
    try:
        data = results.read(data, schema)
    except ValueError as exc:
        raise UserError(f"{path}: not a valid {schema} file ({exc})") from None
    units = {"profile": _profile_units, "repro-oom": _repro_units,
             "graphs": _graphs_units}[KINDS[schema]](data)
    return Side(KINDS[schema], units, (data["measured"], data["kernel"]["name"],
                                       data["environment"]))


def _named(buffers: list[dict]) -> dict[str, int]:
    """Requested bytes per buffer name (several `unattributed` add up)."""
    named: dict[str, int] = {}
    for buffer in buffers:
        named[buffer["name"]] = named.get(buffer["name"], 0) + buffer["requested_bytes"]
    return named


def _profile_units(data: dict) -> list[Unit]:
    return [Unit((r["scenario"], r["op"], r["tokens"], r["path"]),
                 (r["scenario"], r["op"], r["tokens"]),
                 f"{r['scenario']} {r['op']} T={r['tokens']} {r['path']}",
                 r["peak_allocated_bytes"], _named(r["buffers"])) for r in data["rows"]]


def _repro_units(data: dict) -> list[Unit]:
    """One unit per case (a path, or a reserve variant), labelled with its verdict; the peak is
    the step's (null where it ran out of memory)."""
    units = []
    for i, case in enumerate(data["cases"]):
        name = str(case.get("path") or case.get("variant") or f"case {i}")
        units.append(Unit((data["scenario"]["name"], name), (data["scenario"]["name"],),
                          f"{data['scenario']['name']} {name} {case['verdict']}",
                          case.get("step_peak_bytes"), _named(case["buffers"])))
    return units


def _graphs_units(data: dict) -> list[Unit]:
    return [Unit((p["path"], c["tokens"]), (c["tokens"],), f"{p['path']} capture T={c['tokens']}",
                 c["peak_allocated_bytes"], _named(c["buffers"]))
            for p in data["paths"] for c in p["captures"]]


def _snapshot_side(path: Path) -> Side:
    """A snapshot's peak and the bytes live at it per name: an MLA call's buffers by their
    names, other allocations by their frames (`mlamem.commands.explain.live_by_name`, in the default
    scenario's dimensions)."""
    from mlamem.spec import scenario

    data, events, _ = load(path)
    peak, named = live_by_name(data, events, scenario.load(DEFAULT_SCENARIO))
    return Side("snapshot", [Unit(("peak",), ("peak",), "peak", peak.bytes, named)], None)


def pair(a: list[Unit], b: list[Unit]) -> list[tuple[Unit | None, Unit | None]]:
    """Cases by key; then those left over whose loose key is alone on each side; the rest
    unpaired, A's in order, then B's."""
    by_key = {u.key: u for u in b}
    pairs = [(u, by_key.pop(u.key)) for u in a if u.key in by_key]
    paired = {id(u) for u, _ in pairs}
    left_a = [u for u in a if id(u) not in paired]
    left_b = list(by_key.values())
    for u in list(left_a):
        same_a = [x for x in left_a if x.loose == u.loose]
        same_b = [x for x in left_b if x.loose == u.loose]
        if len(same_a) == 1 and len(same_b) == 1:
            pairs.append((u, same_b[0]))
            left_a.remove(u)
            left_b.remove(same_b[0])
    return pairs + [(u, None) for u in left_a] + [(None, u) for u in left_b]


def diff(path_a: Path, path_b: Path, *, command: str,
         fail_on_growth: int | None = None) -> DiffFile:
    """A against B: its results model."""

    a, b = read_side(path_a), read_side(path_b)
    if a.kind != b.kind:
        raise UserError(f"{path_a} is a {a.kind} and {path_b} a {b.kind}; compare two of one kind")
    changes = ([] if a.origin is None else
               [{"name": d.name, "a": d.baseline, "b": d.current, "blocking": d.blocking}
                for d in differences_between(a.origin, b.origin)])
    units = [_unit(x, y) for x, y in pair(a.units, b.units)]
    growths = [u["peak_change_bytes"] for u in units if u["peak_change_bytes"] is not None]
    growth = max(growths, default=None)
    if fail_on_growth is not None and growth is None:
        raise UserError(f"no case of {path_a} pairs with one of {path_b}, so a growth limit has "
                        "nothing to gate; diff two results of one sweep", field="fail_on_growth")
    return DiffFile.model_validate({
        "schema": SCHEMA, "command": command, "created": environment.now_utc(),
        "kind": a.kind, "a": str(path_a), "b": str(path_b), "environment": changes,
        "units": units, "peak_growth_bytes": growth, "fail_on_growth_bytes": fail_on_growth,
        "failed": fail_on_growth is not None and growth is not None and growth > fail_on_growth})


def _unit(a: Unit | None, b: Unit | None) -> dict:
    names = list(dict.fromkeys([*(a.buffers if a else {}), *(b.buffers if b else {})]))
    peaks = (a and a.peak_bytes, b and b.peak_bytes)
    return {
        "unit": (a or b).label, "a_label": a and a.label, "b_label": b and b.label,
        "a_peak_bytes": peaks[0], "b_peak_bytes": peaks[1],
        "peak_change_bytes": None if None in peaks else peaks[1] - peaks[0],
        "buffers": [{"name": n, "a_bytes": a.buffers.get(n) if a else None,
                     "b_bytes": b.buffers.get(n) if b else None,
                     "change_bytes": (b.buffers.get(n, 0) if b else 0)
                     - (a.buffers.get(n, 0) if a else 0)} for n in names],
    }
