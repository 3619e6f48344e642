"""The one reader of a comma-separated value ('1024,8192', 'alloc,workspace',
'max-seq-len=32768,131072', 'peak_reserved=2MiB,buffer=0'): every list an option takes goes
through `parse_list`, so an empty list, an empty item and a repeated item are refused alike."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mlamem.spec.errors import UserError


def parse_list(text: str, field: str, parse: Callable[[str], Any] = str, *,
               key: Callable[[Any], Any] | None = None,
               label: Callable[[Any], str] = str, each: str = "value") -> list:
    """'a, b' -> [parse('a'), parse('b')]. Items are stripped, then parsed (`parse` refuses a bad
    one in its own words); the list is refused, naming `field`, when it is empty, when an item
    is empty, and when two items are the same (`key(value)`, default the value: 1024 and 01024
    are the same T), as '`label(value)` is listed twice; list each `each` once'."""
    items = [item.strip() for item in text.split(",")]
    if not any(items):
        raise UserError(f"{text!r} lists nothing; list at least one {each}", field=field)
    if not all(items):
        raise UserError(f"{text!r} has an empty item (a comma too many); list each {each} once",
                        field=field)
    values, seen = [], set()
    for item in items:
        value = parse(item)
        same = value if key is None else key(value)
        if same in seen:
            raise UserError(f"{label(value)} is listed twice; list each {each} once", field=field)
        seen.add(same)
        values.append(value)
    return values
