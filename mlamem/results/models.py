"""The result models: one `ResultFile` per JSON schema mlamem writes, one module each
(`mlamem.results.profile`, `.repro`, ...), and the objects they share (`mlamem.results.shared`).

Each model states what a file of its schema holds; `mlamem.results.read` checks a file against
it after its migrate steps. Files written before a field was recorded keep schema version 1: the
step for version 1 (`_legacy_*`) fills in what they lack, in one place, so no reader needs a
default for a missing key. This module gathers the models, for the schema writer and for readers
that pick a model by its schema's name.
"""

from __future__ import annotations

from mlamem.results.base import ResultFile
from mlamem.results.baseline import BaselineFile, CaseFigures, Sweep
from mlamem.results.bench import BenchEnvironment, BenchFile, BenchRow, LseRow
from mlamem.results.compare import CompareFile, CompareRow, ReferenceDifference
from mlamem.results.diff import BufferChange, DiffFile, DiffUnit, EnvironmentChange
from mlamem.results.explain import (
                                       CallBuffer,
                                       ExplainFile,
                                       FoundCall,
                                       FrameBytes,
                                       ImpliedShape,
                                       Saving,
                                       SegmentBytes,
)
from mlamem.results.graphs import Capture, Estimate, GraphPath, GraphsFile, Serving
from mlamem.results.kernels import KernelListing, KernelOperationListing, KernelsFile
from mlamem.results.ledger import LedgerRow, LogFigure, LogOom, LogPath, ServerLogLedger
from mlamem.results.plan import (
                                       EngineKnob,
                                       EngineKnobs,
                                       EngineLimit,
                                       EngineLimits,
                                       OnePlan,
                                       PlanFile,
                                       PlanRequest,
                                       PlanScenario,
                                       PlanSweep,
                                       RankFigures,
                                       Reserve,
                                       VllmPlan,
)
from mlamem.results.profile import ProfileFile, ProfileRow
from mlamem.results.repro import Budget, NonTorch, NonTorchModule, ReproCase, ReproFile
from mlamem.results.shared import Buffer, Bytes, Environment, Kernel, MaybeBytes, Scenario
from mlamem.results.validate import Comparison, ValidateFile

FILES: tuple[type[ResultFile], ...] = (ProfileFile, ReproFile, GraphsFile, ValidateFile,
                                       CompareFile, BaselineFile, PlanFile, BenchFile)

__all__ = [
    'BaselineFile', 'BenchEnvironment', 'BenchFile', 'BenchRow', 'Budget', 'Buffer', 'BufferChange',
    'Bytes', 'CallBuffer', 'Capture', 'CaseFigures', 'CompareFile', 'CompareRow', 'Comparison',
    'DiffFile', 'DiffUnit', 'EngineKnob', 'EngineKnobs', 'EngineLimit', 'EngineLimits',
    'Environment', 'EnvironmentChange', 'Estimate', 'ExplainFile', 'FILES', 'FoundCall',
    'FrameBytes', 'GraphPath', 'GraphsFile', 'ImpliedShape', 'Kernel', 'KernelListing',
    'KernelOperationListing', 'KernelsFile', 'LseRow', 'MaybeBytes', 'NonTorch', 'NonTorchModule',
    'OnePlan', 'PlanFile', 'PlanRequest', 'PlanScenario', 'PlanSweep', 'ProfileFile', 'ProfileRow',
    'LedgerRow', 'LogFigure', 'LogOom', 'LogPath',
    'RankFigures', 'ReferenceDifference', 'ReproCase', 'ReproFile', 'Reserve', 'Saving', 'Scenario',
    'ServerLogLedger',
    'SegmentBytes', 'Serving', 'Sweep', 'ValidateFile', 'VllmPlan',
]
