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
    expert_parallel: bool = False  # the routed experts split over the group's ranks (EP)

    def fill_max_model_len(self, derived: tuple[int, str] | None, *, flag: str, engine: str,
                           release: str, default: str, allow_env: str) -> None:
        """The command's `flag`, or the engine's `default` from the model's config (`derived`:
        the length and its config key; one line where there is none); a length above the
        model's is one note: the engine refuses it without `allow_env`=1."""
        given = self.serving["max_model_len"]
        if given is None and derived is None:
            raise UserError(f"{self.prog}: the command sets no {flag} and the model's config "
                            f"sets none of max_position_embeddings and the other keys {engine} "
                            f"reads: add {flag}", field="serve")
        if given is None:
            self.serving["max_model_len"] = derived[0]
            self.notes.append(f"max_model_len {derived[0]}: {release}'s {default}, the model's "
                              f"{derived[1]} (config.json)")
        elif derived is not None and given > derived[0]:
            self.notes.append(f"{flag} {given} is above the model's {derived[0]} ({derived[1]}): "
                              f"{release} refuses it unless {allow_env}=1")


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
