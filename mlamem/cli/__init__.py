"""The `mlamem` command line: each command parses its options, builds a request, runs it
through the library and emits the result. One module per command, registered on `app` in
`--help`'s order; the options they share are declared once, in `options`."""

from mlamem.cli import (  # noqa: F401, I001 (each registers its command, in --help's order)
    profile,
    validate,
    compare,
    repro_oom,
    report,
    merge,
    gate,
    explain,
    diff,
    plan,
    graphs,
    listings,
)
from mlamem.cli.app import app
from mlamem.cli.main import flag_for, main

__all__ = ["app", "flag_for", "main"]
