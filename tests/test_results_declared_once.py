"""A result is declared once: no dataclass or NamedTuple outside `mlamem/results/` repeats the
fields of a results model. A command returns its results model instead."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil

import pytest
from pydantic import BaseModel

import mlamem
from mlamem.results import models

MIN_SHARED = 4  # field names shared with one model ...
MIN_SHARE = 0.75  # ... making up at least this share of the class's own fields

# Records of the layers below the commands whose fields a result copies by design: each is the
# input or working state the result is made from, not a second declaration of the result. A
# command's own dataclass never belongs here. Each entry is "module.Class": the model it feeds.
RECORDED = {
    "mlamem.runtime.graph_capture.Capture": "results.Capture: a capture as it runs, holding its call record",
    "mlamem.runtime.attribution.BufferUse": "results.Buffer: attribution's named allocation",
    "mlamem.spec.context_reserve.Reserve": "results.Reserve: TRT-LLM's reserve arithmetic",
    "mlamem.engines.base.Knob": "results.EngineKnob: an engine's budget knob",
    "mlamem.engines.base.RankMemory": "results.RankFigures: a rank's memory after KV sizing",
    "mlamem.spec.engines.vllm.Estimate": "results.Estimate: vLLM's graph estimate rule",
    "mlamem.spec.kernel_api.Capabilities": "results.Kernel: what an adapter declares",
    "mlamem.runtime.non_torch.NonTorchSetup": "results.NonTorch: the non-torch data's host",
    "mlamem.spec.server_log.Figure": "results.LogFigure: a figure as the log reader reads it",
    "mlamem.spec.server_log.ServerLog": "results.ServerLogLedger: the log as the reader reads it",
    "mlamem.spec.server_log.OutOfMemory": "results.LogOom: an OOM message as the log reader reads it",
}


def _modules() -> list[str]:
    """Every mlamem module outside mlamem.results that imports here (a GPU-only one may not)."""
    names = []
    for info in pkgutil.walk_packages(mlamem.__path__, "mlamem."):
        if info.name.startswith("mlamem.results") or info.name.endswith("__main__"):
            continue
        try:
            importlib.import_module(info.name)
        except ImportError:
            continue
        names.append(info.name)
    return names


def _fields(cls: type) -> set[str] | None:
    """A dataclass's or NamedTuple's field names; None for any other class."""
    if dataclasses.is_dataclass(cls):
        return {f.name for f in dataclasses.fields(cls)}
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        return set(cls._fields)
    return None


def _records() -> dict[str, set[str]]:
    """"module.Class" -> its fields, for each dataclass and NamedTuple mlamem defines."""
    found = {}
    for name in _modules():
        for cls in vars(importlib.import_module(name)).values():
            if inspect.isclass(cls) and cls.__module__ == name and (fields := _fields(cls)):
                found[f"{name}.{cls.__qualname__}"] = fields
    return found


def _models() -> dict[str, set[str]]:
    return {cls.__name__: {f.alias or n for n, f in cls.model_fields.items()}
            for cls in vars(models).values()
            if inspect.isclass(cls) and issubclass(cls, BaseModel) and cls.model_fields}


def twins(records: dict[str, set[str]], results: dict[str, set[str]]) -> dict[str, str]:
    """"module.Class" -> the model whose fields it repeats."""
    found = {}
    for name, fields in records.items():
        model = max(results, key=lambda m: len(fields & results[m]))
        shared = len(fields & results[model])
        if shared >= MIN_SHARED and shared >= MIN_SHARE * len(fields):
            found[name] = model
    return found


def test_no_dataclass_repeats_a_results_model():
    """Each result is declared once, as its model in mlamem.results: no command, render or face
    dataclass repeats one (RECORDED: the lower layers' inputs a result copies)."""
    found = twins(_records(), _models())
    assert {n: m for n, m in found.items() if n not in RECORDED} == {}


def test_recorded_inputs_are_still_twins():
    """A RECORDED entry that no longer repeats a model goes from the list."""
    found = twins(_records(), _models())
    assert sorted(set(RECORDED) - set(found)) == []


@pytest.mark.parametrize("fields", [
    {"scenario", "tokens", "path", "measured", "oom"},  # a profile row's
    {"op", "takes", "head_counts", "assumed", "error"},  # a kernel listing's operation
])
def test_the_check_catches_a_copy(fields):
    """The comparison flags a class that repeats a model's fields."""
    assert twins({"x.Copy": fields}, _models())
