"""The flags older versions' parsers take that the current one lacks, merged over wheels in version
order: each flag once, its aliases the current table does not know, its kind the oldest version's,
and every version that takes it. scripts/vllm_older_flags.py and scripts/sglang_older_flags.py
read each wheel their own way and share this merge."""

from __future__ import annotations

from collections.abc import Callable


def older_flags(wheels: list[str], current: dict[str, dict],
                flags_of: Callable[[str], dict[str, dict]],
                version_of: Callable[[str], str]) -> dict[str, dict]:
    """`wheels` in the order given (oldest first), each read by `flags_of`; `current` the current
    parser's table, whose flags and aliases are left out."""
    known = set(current) | {a for f in current.values() for a in f["aliases"]}
    older: dict[str, dict] = {}
    for wheel in wheels:
        for flag, spec in flags_of(wheel).items():
            if flag in known:
                continue
            entry = older.setdefault(flag, {"aliases": [a for a in spec["aliases"]
                                                        if a not in known],
                                            "kind": spec["kind"], "versions": []})
            entry["versions"].append(version_of(wheel))
    return dict(sorted(older.items()))
