"""Sharded sweeps: `--shard I/N` runs one of N parts of a sweep; `merge` joins the parts' results.

The split. A sweep's unit is one (scenario, operation, swept value): every path of one T (b,
s_q) stays in one shard, because `outputs_equal` and `removed_by_workspace` compare the paths of
one value. The units, in the order the unsharded sweep runs them (scenarios as listed, each
scenario's operations in order, each operation's values as listed), are dealt round-robin:
unit k (from 0) goes to shard k mod N + 1. Shard I runs its units in that same order. A shard
may hold no unit (more shards than units): it runs nothing and its result is empty.

The merge. The shards of one sweep, all N of them, make the unsharded document again: its units
in the sweep's order (round-robin undone), every figure as the shards measured it. Fields that
differ from run to run are normalised (`PER_RUN`); everything else must agree across shards.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from mlamem import results
from mlamem.spec.errors import UserError
from mlamem.spec.redaction import redacted_command_line

Unit = TypeVar("Unit")
Group = TypeVar("Group")

_HINT = "write I/N with 1 <= I <= N, e.g. 2/4"


@dataclass(frozen=True)
class Shard:
    """Shard `index` of `count` (1-based), written I/N."""

    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def pick(self, units: Sequence[Unit]) -> list[Unit]:
        """This shard's units, in the sweep's order: every N-th from the I-th."""
        return list(units[self.index - 1::self.count])

    def pick_sweep(self, sweep: Sequence[tuple[Group, Sequence[Unit]]]
                   ) -> list[tuple[Group, list[Unit]]]:
        """A sweep as (group, values) pairs, e.g. ((scenario, op), T values): each group with
        the values of this shard's units (none where the shard holds none of that group's)."""
        numbered = [(i, value) for i, (_, values) in enumerate(sweep) for value in values]
        kept = self.pick(numbered)
        return [(group, [value for j, value in kept if j == i])
                for i, (group, _) in enumerate(sweep)]


def parse_shard(text: str) -> Shard:
    """'2/4' -> Shard(2, 4); anything else is a UserError."""
    index, sep, count = text.partition("/")
    if not (sep and index.strip().isdigit() and count.strip().isdigit()
            and 1 <= int(index) <= int(count)):
        raise UserError(f"{text!r} is not a shard; {_HINT}", field="shard")
    return Shard(int(index), int(count))


EMPTY_RESULT = "its result is empty and merges with the others"


def empty_note(shard: Shard, units: int, outcome: str = EMPTY_RESULT) -> str:
    """What a shard holding no unit says on stderr: that this is valid, and its `outcome`."""
    return (f"mlamem: note: shard {shard} holds none of this sweep's {units} unit(s) (scenario, "
            f"operation, value), dealt round-robin over the shards; {outcome}")


def interleave(per_shard: Sequence[Sequence[Unit]]) -> list[Unit]:
    """Undo the deal: shard I's k-th unit (from 0) was the sweep's unit k*N + I - 1.
    ValueError if the counts are not those of one round-robin deal."""
    count, total = len(per_shard), sum(map(len, per_shard))
    if [len(units) for units in per_shard] != [len(range(i, total, count)) for i in range(count)]:
        raise ValueError("not the round-robin deal of one sweep")
    return [per_shard[k % count][k // count] for k in range(total)]


# The merge works on the saved JSON documents.

ITEMS = {"mlamem.profile/1": "rows", "mlamem.validate/1": "comparisons"}  # the unit lists
# Options naming a file one run writes: dropped from a shard's command to give the sweep's.
PER_RUN_OPTIONS = ("--shard", "--output", "--snapshot")
# Fields that differ from run to run, and how a merged document fills them:
# `command` -> the sweep's command (PER_RUN_OPTIONS dropped), `created` -> the latest shard's,
# `environment.driver` and `environment.python` -> shard 1/N's; rows' `wall_time_ms` and
# `median_ms` stay as each shard measured them. Everything else must agree across shards.
PER_RUN = ("command", "created", "environment.driver", "environment.python",
           "rows[].wall_time_ms", "rows[].median_ms")


def sweep_command(command: str) -> str:
    """The command without the options that name a run's own files (PER_RUN_OPTIONS):
    `mlamem profile --shard 2/4 --output s2.json --predict` -> `mlamem profile --predict`."""
    words, kept = shlex.split(command), []
    skip = False
    for word in words:
        if skip:
            skip = False
        elif word in PER_RUN_OPTIONS:
            skip = True
        elif not word.startswith(tuple(f"{option}=" for option in PER_RUN_OPTIONS)):
            kept.append(word)
    return shlex.join(kept)


def normalised(document: dict) -> dict:
    """`document` with its PER_RUN fields made independent of the run: the sweep's command,
    and null for the others (where present). Two runs of one sweep normalise to the same
    document when every figure agrees."""
    out = {**document, "command": sweep_command(document["command"])}
    for field in PER_RUN:
        if field != "command":
            out = _null_at(out, field)
    return out


def _null_at(value: object, field: str) -> object:
    """`value` with `field` null: `a.b` a nested field, `a[].b` one in each item of list `a`."""
    head, _, rest = field.partition(".")
    name = head.removesuffix("[]")
    if not isinstance(value, dict) or name not in value:
        return value
    inner = value[name]
    if not rest:
        inner = None
    elif head.endswith("[]") and isinstance(inner, list):
        inner = [_null_at(item, rest) for item in inner]
    else:
        inner = _null_at(inner, rest)
    return {**value, name: inner}


def _sweep_identity(document: dict) -> dict:
    """What every shard of one sweep has in common: the normalised document less its units."""
    return {k: v for k, v in normalised(document).items()
            if k not in (ITEMS[document["schema"]], "shard", "agrees")}


def units_of(items: list[dict]) -> list[list[dict]]:
    """Rows or comparisons grouped by unit, in order (a unit's items are adjacent)."""
    def unit(item: dict) -> tuple:
        return item["scenario"], item.get("op"), item["tokens"]  # op: absent in older files

    groups: list[list[dict]] = []
    for item in items:
        if groups and unit(groups[-1][0]) == unit(item):
            groups[-1].append(item)
        else:
            groups.append([item])
    return groups


def _check_shard(name: str, document: dict) -> Shard:
    """The document's shard, and that it has what the merge reads."""
    schema = document.get("schema")
    if schema not in ITEMS:
        raise UserError(f"{name}: schema {schema!r} cannot be merged; merge takes shards of "
                        f"{' or '.join(ITEMS)}")
    if document.get("shard") is None:
        raise UserError(f"{name} is not a shard (its `shard` is null); merge takes the files "
                        "that a sweep's shard I/N wrote, all N of one sweep")

    try:
        results.read(document, schema)  # checked by its model; the merge joins the file as read
    except ValueError as exc:
        raise UserError(f"{name}: not a valid {schema} shard ({exc})") from None
    try:
        return parse_shard(str(document["shard"]))
    except UserError:
        raise UserError(f"{name}: shard {document['shard']!r} is not I/N") from None


def merge(documents: Sequence[tuple[str, dict]]) -> dict:
    """The unsharded document of one sweep's shards, given as (name, JSON document) pairs in
    any order. A UserError names the file(s) when they mix schemas, are not shards, repeat a
    shard, lack one, or belong to different sweeps."""
    if not documents:
        raise UserError("give the shard files to merge")
    first_name, first = documents[0]
    for name, document in documents[1:]:
        if document.get("schema") != first.get("schema"):
            raise UserError(f"{first_name} is {first.get('schema')} and {name} "
                            f"{document.get('schema')}: merge one schema at a time")
    by_index: dict[int, tuple[str, dict]] = {}
    count = None
    for name, document in documents:
        shard = _check_shard(name, document)
        if count is not None and shard.count != count:
            raise UserError(f"{first_name} is one of {count} shards and {name} one of "
                            f"{shard.count}: merge the shards of one split")
        count = shard.count
        if shard.index in by_index:
            raise UserError(f"{by_index[shard.index][0]} and {name} are both shard {shard}; "
                            "give each shard once")
        by_index[shard.index] = (name, document)
    missing = [f"{i}/{count}" for i in range(1, count + 1) if i not in by_index]
    if missing:
        given = ", ".join(f"{i}/{count}" for i in sorted(by_index))
        raise UserError(f"shard {', '.join(missing)} missing (given: {given}); merge needs all "
                        f"{count} shards of the sweep")
    ordered = [by_index[i] for i in range(1, count + 1)]
    base_name, base = ordered[0]
    identity = _sweep_identity(base)
    for name, document in ordered[1:]:
        other = _sweep_identity(document)
        if other != identity:
            field = next(k for k in dict.fromkeys([*identity, *other])
                         if identity.get(k) != other.get(k))
            raise UserError(f"{base_name} and {name} are shards of different sweeps (their "
                            f"{field} differs); merge the shards of one sweep")
    key = ITEMS[base["schema"]]
    try:
        units = interleave([units_of(document[key]) for _, document in ordered])
    except ValueError as exc:
        raise UserError(f"{', '.join(n for n, _ in ordered)}: {exc} (each shard's units are "
                        "not those a shard I/N deals); rerun the shards") from None
    merged = {**base, "command": redacted_command_line(sweep_command(base["command"])),
              key: [item for unit in units for item in unit], "shard": None}
    created = [d["created"] for _, d in ordered if d.get("created") is not None]
    if "created" in base:
        merged["created"] = max(created, default=None)
    if "agrees" in base:
        merged["agrees"] = all(d["agrees"] for _, d in ordered)
    return merged


def merged_json(documents: Sequence[tuple[str, dict]]) -> str:
    """`merge` as the text `mlamem merge` writes (indented as every result file)."""
    return json.dumps(merge(documents), indent=2) + "\n"


def merge_shards(documents: Sequence[tuple[str, dict]]) -> list[tuple[list[str], dict]]:
    """The documents as given, each with its name, except that the shards of each sweep merge
    into one, with their names, placed where its first shard was. Shards group by sweep
    (schema, split and `_sweep_identity`); a group that cannot merge is a UserError, and where
    a shard it lacks was given from another sweep, the error says what differs."""
    out: list[tuple[list[str], dict] | str] = []
    groups: dict[str, list[tuple[str, dict]]] = {}
    for name, document in documents:
        if document.get("schema") not in ITEMS or document.get("shard") is None:
            out.append(([name], document))
            continue
        shard = _check_shard(name, document)
        key = json.dumps([document["schema"], shard.count, _sweep_identity(document)],
                         sort_keys=True)
        if key not in groups:
            groups[key] = []
            out.append(key)
        groups[key].append((name, document))
    for members in groups.values():
        indices = {_check_shard(*m).index for m in members}
        if len(indices) == _check_shard(*members[0]).count:
            continue
        for other in (m for g in groups.values() if g is not members for m in g):
            if (other[1]["schema"] == members[0][1]["schema"]
                    and _check_shard(*other).index not in indices):
                merge([*members, other])  # raises: another split, or what differs
    return [item if isinstance(item, tuple) else
            ([name for name, _ in groups[item]], merge(groups[item])) for item in out]
