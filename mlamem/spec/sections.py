"""A scenario's sections as classes: `section_model` makes one (a frozen pydantic dataclass,
strict), `FieldError` is a bad field's one line and `check_positive` a count's bound. The
scenario (`scenario.py`) and the engines' own tables (`spec/engines/`) build on these; they sit
below both, as the scenario reads the engines' tables."""

from __future__ import annotations

import pydantic
from pydantic.dataclasses import dataclass

from mlamem.spec.units import MAX_TOKENS

# A section as a file gives it: the types exactly (an int may stand for a float), numbers finite.
SECTION_CONFIG = pydantic.ConfigDict(strict=True, allow_inf_nan=False)


def section_model(cls: type) -> type:
    """A scenario section (`[model]`, an engine's `[vllm]`, ...): a frozen pydantic dataclass
    validated as SECTION_CONFIG says; its own rules raise FieldError from `__post_init__`."""
    return dataclass(cls, frozen=True, config=SECTION_CONFIG)


class FieldError(Exception):
    """A bad field of a section, `[section].field problem`; `from_dict` names the source. Not a
    ValueError, so that pydantic passes it on from a section's `__post_init__` as it is."""

    def __init__(self, section: str, field: str, problem: str):
        super().__init__(f"[{section}].{field} {problem}")


def check_positive(obj: object, section: str, name: str, maximum: int = MAX_TOKENS) -> None:
    """A count in (0, maximum]: by default int32, as engines and kernels count tokens."""
    if getattr(obj, name) <= 0:
        raise FieldError(section, name, f"must be > 0, got {getattr(obj, name)}")
    if getattr(obj, name) > maximum:
        raise FieldError(section, name, f"must be at most {maximum}, got {getattr(obj, name)}")
