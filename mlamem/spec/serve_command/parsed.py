"""What a serve command says, in the scenario's layout, and the parser both engines' flags go
through."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from mlamem.spec.errors import UserError


@dataclass
class Parsed:
    """What an engine's command says, in the scenario's layout."""

    model: str  # the command's model argument
    tensor_parallel: int  # ranks of the group (TP x attention-DP)
    attention_data_parallel: int
    tp: int  # the engine's tensor-parallel size, for the weights' placement
    serving: dict
    memory_fraction: float
    engines: list[str]
    operations: list[str]
    sections: dict
    notes: list[str]
    cuda_graphs: bool
    prog: str
    flags: dict  # a scenario field -> the engine's flag that set it, for validation's errors
    engine_settings: dict = field(default_factory=dict)  # what only the engine's defaults read


class EngineParser(argparse.ArgumentParser):
    """argparse whose errors are one UserError line naming the engine's command."""

    def parse_args(self, args=None, namespace=None):
        known, rest = self.parse_known_args(args, namespace)
        if rest:  # each word quoted, so a blank or a line break shows
            self.error(f"unrecognized arguments: {', '.join(map(repr, rest))}")
        return known

    def error(self, message: str):
        one_line = message.replace("\r", "\\r").replace("\n", "\\n")
        raise UserError(f"{self.prog}: {one_line}", field="serve")
