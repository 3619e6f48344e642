"""`mlamem merge`: the shards of one sweep into the unsharded result."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mlamem.cli import options as o
from mlamem.cli.app import app
from mlamem.cli.output import emit
from mlamem.commands import shards
from mlamem.spec.files import (
    check_distinct,
    check_given_once,
    check_output_path,
    pick_format,
    read_json,
)


@app.command()
def merge(
    shard_files: Annotated[list[Path], typer.Argument(
        help="The JSON files of one sweep's shards, all N of them (profile or validate "
             "--shard I/N --format json --output), in any order.", show_default=False)],
    output: Annotated[Path | None, typer.Option(
        parser=o.stdout_or_path, help="Write the merged JSON here instead of stdout (written "
        "whole or not at all); - is stdout.")] = None,
) -> None:
    """Join the shards of one sharded sweep into the result the unsharded sweep writes.

    Every figure is as the shards measured it, the units (scenario, operation, swept value) in
    the sweep's order. The fields that differ per run are normalised (README: Sharded sweeps):
    the command is the sweep's (--shard and --output dropped), created the latest shard's.
    Mixed schemas, a missing or repeated shard, or shards of different sweeps: one line, exit 2.
    """
    check_given_once(shard_files, "shard file")
    if output is not None:
        pick_format(output, None, ["json"], what="merge")
        check_distinct({**{str(path): path for path in shard_files}, "--output": output})
        check_output_path(output)
    documents = [(str(path), read_json(path)) for path in shard_files]
    emit(shards.merged_json(documents), output)
