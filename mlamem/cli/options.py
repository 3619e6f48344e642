"""The options commands share, declared once as annotated types, and the parsing of their text.

Imported at start-up: nothing here loads torch, pandas or matplotlib, so `--help`, `scenarios`
and `plan` stay fast. What needs torch is imported in the command that uses it, after
`load_torch()` (benchmarks/cli_start.py measures this).
"""

from __future__ import annotations

import difflib
import sys
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from mlamem import operations, shards
from mlamem.cli.app import stderr
from mlamem.errors import UserError
from mlamem.gpus import GPUS
from mlamem.kernels import REGISTRY, load_kernel
from mlamem.lists import parse_list
from mlamem.scenario_names import shipped_names
from mlamem.units import parse_bytes

if TYPE_CHECKING:
    from mlamem.kernel_api import KernelContract
    from mlamem.scenario import Scenario


class Switch(StrEnum):
    on = "on"
    off = "off"


class Format(StrEnum):
    table = "table"
    markdown = "markdown"
    json = "json"
    csv = "csv"


class ReproFormat(StrEnum):
    table = "table"
    markdown = "markdown"
    json = "json"


def parse_tokens(text: str, option: str = "--tokens", symbol: str = "T") -> list[int]:
    """'1024,8192' -> [1024, 8192]; every T a positive integer, listed once."""
    example = {"--requests": "16,64,256", "--capture-sizes": "512,256,8,1"}.get(
        option, "1024,8192,32768")  # shipped scenarios take these
    field = option.removeprefix("--").replace("-", "_")

    def one(item: str) -> int:
        if not item.isdigit() or int(item) <= 0:
            raise UserError(f"{item!r} is not a positive integer; write e.g. {option} {example}",
                            field=field)
        return int(item)

    return parse_list(text, field, one, label=lambda value: f"{symbol}={value}", each=symbol)


def parse_sizes(text: str | None) -> list[int] | None:
    """--capture-sizes, or None when not given."""
    return None if text is None else parse_tokens(text, "--capture-sizes")


def parse_sweep(op: str, tokens: str | None, requests: str | None) -> list[int] | None:
    """The swept values of `op` from its flag (--requests for dense decode, else --tokens);
    None when not given (each scenario's defaults)."""
    spec = operations.operation(op)
    text, other = (requests, ("--tokens", tokens)) if spec.flag == "--requests" else (
        tokens, ("--requests", requests))
    if other[1] is not None:
        raise UserError(f"{other[0]}: {op} sweeps {spec.quantity}; give {spec.flag} instead")
    return None if text is None else parse_tokens(text, spec.flag, spec.symbol)


def split_paths(text: str | None) -> list[str] | None:
    """'alloc,workspace' -> ['alloc', 'workspace']; None (not given): every path the kernel has.
    Given, the list must name a path (`--paths ""` is refused, not read as the default)."""
    return None if text is None else parse_list(text, "paths", each="path")


def kv_length(op: str, context_len: int | None, kv_len: int | None) -> int | None:
    """The KV length flag that applies to `op`, refusing the one that does not."""
    for flag, value, wanted in (("--context-len", context_len, "dense-decode"),
                                ("--kv-len", kv_len, "sparse-prefill")):
        if value is not None and op != wanted:
            raise UserError(f"{flag} applies to --op {wanted} only; drop it for {op}")
    return context_len or kv_len


def parse_shard_option(text: str | None) -> shards.Shard | None:
    """--shard I/N, or None when not given."""
    return None if text is None else shards.parse_shard(text)


@dataclass(frozen=True)
class Changes:
    """--model, --gpu and --weights-per-rank as given: what changes in each scenario loaded."""

    model: str | None = None
    gpu: str | None = None
    weights_per_rank: str | None = None


def parse_size(text: str | None, field: str) -> int | None:
    """A size such as 40GiB (units.parse_bytes), or None when not given."""
    if text is None:
        return None
    try:
        return parse_bytes(text)
    except ValueError as error:
        raise UserError(str(error), field=field) from None


def load_scenario(name: str, changes: Changes = Changes()) -> Scenario:
    """A shipped scenario by name, or a TOML file by path, with `changes` applied
    (models.overrides.apply). The scenario model (pydantic) is imported here, when a file is
    read, not at start-up."""
    from mlamem import scenario
    from mlamem.models import overrides

    weights = parse_size(changes.weights_per_rank, "weights_per_rank")
    return overrides.apply(scenario.load(name), model=changes.model, gpu=changes.gpu,
                           weights_bytes=weights)


def check_weights_fit(scenario: Scenario, gpu_memory: str | None) -> None:
    """repro-oom's and plan's refusal, in one line, of one rank's weights (counted or given)
    where they exceed the target GPU's memory: --gpu-memory's where given (a zero is left to
    the budget's own check), else the scenario's [gpu]."""
    from mlamem.models import overrides

    memory = parse_size(gpu_memory, "gpu_memory_bytes")
    line = overrides.weights_fit_line(scenario, memory or None)
    if line:
        raise UserError(f"{line}: give a layout with more ranks, a larger GPU or the weights "
                        "per rank", field="weights_per_rank")


def load_scenarios(text: str, changes: Changes = Changes()) -> list[tuple[str, Scenario]]:
    """Comma-separated names or TOML paths, or 'all' for every shipped scenario: (as given,
    loaded) pairs, with `changes` applied to each."""
    names = shipped_names() if text == "all" else scenario_names(text)
    return [(name, load_scenario(name, changes)) for name in names]


def scenario_names(text: str) -> list[str]:
    """--scenario's comma-separated names or paths, each once."""
    return parse_list(text, "scenario", each="scenario")


def check_kernel_name(name: str | None) -> str | None:
    """--kernel: a registered name, checked against the registry when the command runs, so a
    plug-in kernel registered after this module was imported is a choice too."""
    if name is not None and name not in REGISTRY:
        close = difflib.get_close_matches(name.lower(), list(REGISTRY), n=1)
        hint = f": did you mean {close[0]!r}" if close else ""
        raise typer.BadParameter(f"{name!r} is not one of {', '.join(map(repr, REGISTRY))} "
                                 f"(`mlamem kernels` lists them){hint}")
    return name


KernelName = str  # a REGISTRY name, checked by check_kernel_name


def load_torch() -> None:
    """Import torch (seconds on a small CPU), showing `mlamem: loading torch…` on stderr
    meanwhile when stderr is a terminal. The line is erased once torch is in, so what follows
    (a bad input's one line, the progress bar) stands alone. Piped, nothing is printed: a line
    cannot be taken back there, and input checks that need the kernel may still fail."""
    if "torch" in sys.modules:
        return
    if not stderr.is_terminal:
        import torch  # noqa: F401
        return
    sys.stderr.write("mlamem: loading torch…")
    sys.stderr.flush()
    try:
        import torch  # noqa: F401
    finally:
        sys.stderr.write("\r\x1b[2K")
        sys.stderr.flush()


def make_kernel(name: str) -> KernelContract:
    """The registered kernel adapter `name`, instantiated (this loads torch)."""
    load_torch()
    return load_kernel(name)()


ScenarioOption = Annotated[str, typer.Option(
    "--scenario", "-s", help="A shipped scenario name (see `mlamem scenarios`) or a path to "
                             "your own TOML file.")]
ModelOption = Annotated[str | None, typer.Option(
    "--model", metavar="PATH", help="The model's Hugging Face config.json, or a folder holding "
    "one: replaces the scenario's [model] (heads, layers, ranks, index_topk, hidden_size) and "
    "counts its weights per rank at the scenario's layout.", show_default=False)]
GpuOption = Annotated[str | None, typer.Option(
    "--gpu", metavar="NAME", help=f"The target GPU by name, one of {', '.join(GPUS)}: its memory "
    "and SM count replace the scenario's [gpu] (the utilization is kept). Default: the "
    "scenario's GPU.", show_default=False)]
WeightsOption = Annotated[str | None, typer.Option(
    "--weights-per-rank", metavar="SIZE", help="One rank's weights, e.g. 40GiB: a labelled "
    "override of the scenario's (or --model's count).", show_default=False)]
# What helps where a value does not fit a scenario's workspace, in the CLI's words.
RAISE_LIMIT = "raise it with --max-num-batched-tokens or drop that T from --tokens"
DROP_CASE = "drop that T from --tokens or that scenario from --scenario"
KERNEL_HELP = [f"{name} ({entry.help})" for name, entry in REGISTRY.items()]
KERNEL_METAVAR = f"<{'|'.join(REGISTRY)}>"  # the kernels registered at start-up
KernelOption = Annotated[KernelName, typer.Option(
    callback=check_kernel_name, metavar=KERNEL_METAVAR,
    help=f"The kernel: {', '.join(KERNEL_HELP[:-1])} or {KERNEL_HELP[-1]}. `mlamem "
         "kernels` lists what each runs and takes, and whether it runs here.")]
PathsOption = Annotated[str | None, typer.Option(
    help="Comma-separated paths: 'alloc' (q padded with new_zeros, kernel allocates out), "
         "'workspace' (q and out staged in buffers reserved up front), 'workspace-full' (q, out, "
         "lse and accumulators staged: nothing allocated in the call; a kernel that takes all "
         "four, see `mlamem kernels`). "
         "Default: every path the kernel supports.")]

OpName = StrEnum("OpName", {name: name for name in operations.OPERATION_TABLE})
OpOption = Annotated[OpName, typer.Option(
    "--op", help="The kernel operation: sparse-decode (sweeps T, --tokens), dense-decode "
                 "(sweeps b requests, --requests, at --context-len) or sparse-prefill (sweeps "
                 "s_q, --tokens, against --kv-len). `mlamem kernels` lists who runs what.")]
RequestsOption = Annotated[str | None, typer.Option(
    help="dense-decode: comma-separated b values, requests per decode step (one query each). "
         "Default: " + ",".join(map(str, operations.OPERATION_TABLE["dense-decode"]
                                    .default_sweep)) + ".", show_default=False)]
ContextOption = Annotated[int | None, typer.Option(
    "--context-len", min=1, help="dense-decode: context tokens of each request. Default: the "
                                 "scenario's decode_context_len.", show_default=False)]
KvLenOption = Annotated[int | None, typer.Option(
    "--kv-len", min=1, help="sparse-prefill: s_kv, the gathered KV tokens the queries index. "
                            "Default: 4 x topk.", show_default=False)]
ShardOption = Annotated[str | None, typer.Option(
    "--shard", metavar="I/N", help="Run shard I of N of the sweep, e.g. 2/4: its units (scenario, "
    "operation, swept value; every path of a value together) dealt round-robin. `mlamem merge` "
    "and `mlamem report` join the shards' JSON into the unsharded result.", show_default=False)]
OutputOption = Annotated[Path | None, typer.Option(
    help="Write to this file instead of stdout (written whole or not at all).")]
PlainOutputOption = Annotated[Path | None, typer.Option(
    help="Write to this file instead of stdout.")]
PredictOption = Annotated[bool, typer.Option(
    help="Predict even where a GPU could measure: what a CPU-only machine prints.")]
CaptureSizesOption = Annotated[str | None, typer.Option(
    help="Comma-separated capture sizes (tokens per graph), e.g. 512,256,8,1. Default: the "
         "FULL decode graphs vLLM 0.33.0 captures for the scenario's [serving] "
         "max_num_seqs, max_cudagraph_capture_size, cudagraph_mode and "
         "num_speculative_tokens (51 sizes, 512 down to 1, at the defaults).",
    show_default=False)]


def format_option(schema: str, formats: str = "table, markdown or json",
                  extensions: str = ".txt, .md, .json", after: str = ""):
    """The --format option of a command writing `formats` (then `after`), its JSON schema
    `schema`."""
    return typer.Option(
        "--format", help=f"{formats} (schema {schema}){after}. Default: what --output's extension "
                         f"names ({extensions}), else table.", show_default=False)


def _folder(value: str | Path) -> Path:
    """A folder path as given: an empty one is refused (Path('') would be the current folder)."""
    if str(value) == "":
        raise typer.BadParameter("empty; name a folder, e.g. --report report/")
    return Path(value)


def report_option(what: str):
    """--report DIR: also write a report of `what` (e.g. 'its plots (PNG)')."""
    return typer.Option(
        "--report", parser=_folder, help="Also write a report into this folder (created if needed): the "
                         f"result JSON, report.md and {what}, as `mlamem report` makes.")
