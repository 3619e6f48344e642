"""Formatting shared by every view: GiB cells, yes/no, the PREDICTED tag, rich to text."""

from __future__ import annotations

import io

from rich.console import Console

from mlamem.units import gib


def predicted_tag(measured: bool) -> str:
    """' (PREDICTED)' after the heading of every table of predicted figures; '' when measured."""
    return "" if measured else " (PREDICTED)"


def gib_text(value: int | None) -> str:
    return "n/a" if value is None else f"{gib(value):.3f}"


def equal_text(value: bool | None) -> str:
    return {True: "yes", False: "NO", None: "n/a"}[value]


def console_text(renderable, width: int = 120) -> str:
    console = Console(file=io.StringIO(), width=width, record=True)
    console.print(renderable)
    return console.export_text()


