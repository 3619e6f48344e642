"""The escapes of text from input files, for a terminal and for Markdown: plain text, no rich,
so the CLI's one-line refusals can use them without loading rich."""

from __future__ import annotations

import re

from mlamem.spec.files import CONTROL_CHARACTERS

_BREAKS = re.compile(r"[\n\r\t\v\f\x85\u2028\u2029]+")  # line breaks and tabs: one space


def escaped(text: object, markdown: bool = False) -> str:
    """The one escape for text from an input file (a scenario's name, a note, a buffer or frame
    name): one line with no control character, so no newline or terminal sequence (ESC, OSC's
    BEL) reaches a table or a terminal; for Markdown, `|` and backticks escaped too, so a table
    cell stays one cell and no code span opens."""
    flat = CONTROL_CHARACTERS.sub("", _BREAKS.sub(" ", str(text)))
    return flat.replace("|", "\\|").replace("`", "\\`") if markdown else flat


def markdown_code(text: object) -> str:
    """Text from an input file as a Markdown code span (`escaped`, then fenced): no newline,
    pipe or backtick in `text` can leave it (a table cell stays one cell)."""
    flat = escaped(text).replace("|", "\\|")
    longest = max((len(run) for run in re.findall(r"`+", flat)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if flat.startswith("`") or flat.endswith("`") else ""
    return f"{fence}{pad}{flat}{pad}{fence}"


def markdown_row(cells) -> str:
    """One Markdown table row, each cell `escaped` (a name from a file stays one cell)."""
    return "| " + " | ".join(escaped(cell, markdown=True) for cell in cells) + " |"
