"""The base of every result model, the migrate steps and the one-line validation error."""

from __future__ import annotations

import json
import typing
from collections.abc import Callable
from typing import Any, ClassVar, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    PrivateAttr,
    ValidationError,
    model_serializer,
    model_validator,
)

Migrate = Callable[[dict], dict]

# pydantic's error type -> the words a one-line error uses.
_EXPECTED = {
    "int_type": "expected an integer", "int_from_float": "expected an integer",
    "float_type": "expected a number", "string_type": "expected a string",
    "bool_type": "expected true or false", "list_type": "expected a list",
    "dict_type": "expected an object", "model_type": "expected an object",
    "model_attributes_type": "expected an object", "none_required": "expected null",
    "missing": "missing", "extra_forbidden": "not a field of this schema",
    "too_short": "is empty", "literal_error": "not one of the allowed values",
}


class _InGivenOrder(BaseModel):
    """Dumped with its keys in the order they were given (a file's, or the code that filled
    it): an open object's keys differ by kind, so no declared order can keep them."""

    _given: tuple[str, ...] = PrivateAttr(default=())

    @model_validator(mode="wrap")
    @classmethod
    def _remember_order(cls, data: Any, handler: Callable[[Any], Any]) -> Any:
        model = handler(data)
        if isinstance(data, dict):
            model._given = tuple(data)
        return model

    @model_serializer(mode="wrap")
    def _in_given_order(self, handler: Callable[[Any], dict]) -> dict:
        dumped = handler(self)
        return {**{k: dumped[k] for k in self._given if k in dumped}, **dumped}


class Model(BaseModel):
    """A JSON object of a result file: types checked strictly (no "1" for 1, no true for 1),
    unknown keys refused."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class Open(_InGivenOrder):
    """An object whose listed keys are checked and whose other keys pass as they are (a
    scenario, kernel or engine case: their fields differ by kind). Read by key, as in its
    file (`case["verdict"]`, `case.get("max_safe_tokens")`), since which keys it has depends
    on its kind."""

    model_config = ConfigDict(strict=True, extra="allow", frozen=True)

    def __getitem__(self, key: str) -> Any:
        if key not in self:
            raise KeyError(key)
        return getattr(self, key)

    def __contains__(self, key: object) -> bool:
        return key in self.model_fields_set or key in (self.model_extra or {})

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key) if key in self else default


class ResultFile(Model):
    """A whole result file. `VERSION` is the schema's version; `MIGRATIONS[v]` turns a file of
    version v (or, for v = VERSION, one written before a field was recorded) into the next
    shape, one step per version, so the reading code never meets an older file."""

    VERSION: ClassVar[int] = 1
    MIGRATIONS: ClassVar[dict[int, Migrate]] = {}
    # the top-level keys its files have always begun with, where that is not the model's order
    KEY_ORDER: ClassVar[tuple[str, ...]] = ()

    def file_dict(self) -> dict:
        """The file's JSON object: every field given, by its JSON name (`schema`); a field left
        unset (a buffer's `frame` where no stacks were traced) is not written."""
        data = self.model_dump(by_alias=True, exclude_unset=True)
        return {**{key: data[key] for key in self.KEY_ORDER if key in data}, **data}

    @classmethod
    def schema_name(cls) -> str:
        """The schema its files name, e.g. `mlamem.profile/1` (its `schema` field's one value)."""
        return typing.get_args(cls.model_fields["schema_"].annotation)[0]

    @classmethod
    def parse(cls, data: dict) -> Self:
        """A file's JSON object, migrated and checked, as the model; ValueError (one line,
        `FIELD: what is wrong`) when it does not match."""
        return _validated(cls, cls.migrate(data))

    @classmethod
    def migrate(cls, data: dict) -> dict:
        schema = data.get("schema", "")
        version = int(schema.rpartition("/")[2]) if schema.rpartition("/")[2].isdigit() else cls.VERSION
        for step in range(version, cls.VERSION + 1):
            if step in cls.MIGRATIONS:
                data = cls.MIGRATIONS[step](data)
        return data


def no_second_copy(items: list, key: tuple[str, ...], where: str,
                   only: Callable[[Any], bool] | None = None) -> None:
    """ValueError naming the first of `items` (those `only` takes, if given) whose `key` fields
    repeat an earlier one's: two copies of one row or case would be settled by whichever comes
    last. A key field an item lacks (an open object's, e.g. a repro case's `variant`) counts as
    None."""
    seen: set[tuple] = set()
    for i, item in enumerate(items):
        if only is not None and not only(item):
            continue
        values = tuple(getattr(item, name, None) for name in key)
        if values in seen:
            shown = "/".join(str(v) for v in values if v is not None)
            raise ValueError(f"{where}[{i}]: a second copy of {shown}")
        seen.add(values)


def error_line(error: ValidationError) -> str:
    """The first problem as `FIELD: what is wrong` (`cases[3].tokens: expected an integer`),
    a wrong value before a missing one, and how many more there are."""
    errors = error.errors(include_url=False)
    first = min(errors, key=lambda e: e["type"] == "missing")  # a wrong value says most
    where = field_name(first["loc"])
    words = _EXPECTED.get(first["type"], first["msg"].removeprefix("Value error, "))
    if first["type"] == "literal_error":
        words = f"{first['input']!r} is {first['msg'].removeprefix('Input should be ')}"
    elif first["type"] == "greater_than_equal" and first["ctx"]["ge"] == 0:
        words = f"{first['input']} is negative"
    elif first["type"] == "less_than_equal":
        words = f"{first['input']} is more than {first['ctx']['le']}"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where}: {words}{more}" if where else f"{words}{more}"


def field_name(loc: tuple[Any, ...]) -> str:
    """('cases', 3, 'tokens') -> 'cases[3].tokens'."""
    name = ""
    for part in loc:
        if isinstance(part, int):
            name += f"[{part}]"
        elif not str(part).startswith(("function-", "typed-dict")):
            name += f".{part}" if name else str(part)
    return name


def check(model: type[ResultFile], data: dict) -> dict:
    """`data` migrated and validated by `model`; ValueError(one line) if it does not match."""
    migrated = model.migrate(data)
    _validated(model, migrated)
    return migrated


def _validated(model: type[ResultFile], data: dict) -> ResultFile:
    try:
        return model.model_validate(_as_json(data))
    except ValidationError as exc:
        raise ValueError(error_line(exc)) from None


def _as_json(data: dict) -> dict:
    """`data` as its JSON reads back: a result built in memory (tuples for lists) checks as its
    file would."""
    return json.loads(json.dumps(data))
