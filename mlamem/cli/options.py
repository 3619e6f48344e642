"""The options commands share, declared once as annotated types, and the parsing of their text.

Imported at start-up: nothing here loads torch, pandas or matplotlib, so `--help`, `scenarios`
and `plan` stay fast. What needs torch is imported in the command that uses it, after
`load_torch()` (benchmarks/cli_start.py measures this).
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from mlamem import operations
from mlamem.cli.app import stderr
from mlamem.commands import shards
from mlamem.kernels import REGISTRY, SHIPPED, KernelEntry, load_kernel
from mlamem.spec.errors import UserError
from mlamem.spec.gpus import GPUS
from mlamem.spec.lists import parse_list
from mlamem.spec.models import overrides
from mlamem.spec.scenario_names import DEFAULT_SCENARIO, check_exists, shipped_names
from mlamem.spec.server_log import read_log
from mlamem.spec.units import parse_bytes

if TYPE_CHECKING:
    from mlamem.spec.kernel_api import KernelContract
    from mlamem.spec.scenario import Scenario


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


SWEEP_FLAGS = ("--tokens", "--requests")  # the flags the commands take for a swept quantity


def parse_sweep(op: str, tokens: str | None, requests: str | None) -> list[int] | None:
    """The swept values of `op` from its flag (the operation's `flag`); None when not given
    (each scenario's defaults). The other flag is refused, naming the operation's."""
    spec = operations.operation(op)
    given = dict(zip(SWEEP_FLAGS, (tokens, requests), strict=True))
    for flag, text in given.items():
        if text is not None and flag != spec.flag:
            raise UserError(f"{flag}: {op} sweeps {spec.quantity}; give {spec.flag} instead")
    text = given.get(spec.flag)
    return None if text is None else parse_tokens(text, spec.flag, spec.symbol)


def split_paths(text: str | None) -> list[str] | None:
    """'alloc,workspace' -> ['alloc', 'workspace']; None (not given): every path the kernel has.
    Given, the list must name a path (`--paths ""` is refused, not read as the default)."""
    return None if text is None else parse_list(text, "paths", each="path")


def kv_length(op: str, context_len: int | None, kv_len: int | None) -> int | None:
    """The KV length flag that applies to `op` (the operation's `kv_flag`), refusing another."""
    own = operations.operation(op).kv_flag
    for flag, value in (("--context-len", context_len), ("--kv-len", kv_len)):
        if value is not None and flag != own:
            owners = [name for name in operations.operation_names()
                      if operations.operation(name).kv_flag == flag]
            raise UserError(f"{flag} applies to --op {' or '.join(owners)} only; drop it for {op}")
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
    engine_version: str | None = None  # --engine-version: the rules --serve's command takes


def parse_size(text: str | None, field: str) -> int | None:
    """A size such as 40GiB (units.parse_bytes), or None when not given."""
    if text is None:
        return None
    try:
        return parse_bytes(text)
    except ValueError as error:
        raise UserError(str(error), field=field) from None


SERVE_GPU = "H200 SXM 141GB"  # --serve's GPU when --gpu is not given: this project's GPU


def load_served(command: str, changes: Changes = Changes()) -> Scenario:
    """The scenario a pasted serve command makes (serve_command.from_command) with `changes`
    (--gpu default SERVE_GPU); its notes (unmodelled flags, CUDA graphs, defaults) on stderr."""
    from mlamem.spec.serve_command import from_command

    built = from_command(command, gpu_name=changes.gpu or SERVE_GPU, model=changes.model,
                         weights_bytes=parse_size(changes.weights_per_rank, "weights_per_rank"),
                         engine_version=changes.engine_version)
    for note in built.notes:
        typer.echo(f"mlamem: note: {note}", err=True)
    return built.scenario


def load_one(name: str | None, serve: str | None, changes: Changes = Changes()) -> Scenario:
    """repro-oom's and plan's scenario: --serve's command or --scenario (default
    DEFAULT_SCENARIO), not both."""
    if serve is not None and name is not None:
        raise UserError("--serve and --scenario both name the scenario; give one")
    if serve is not None:
        return load_served(serve, changes)
    if changes.engine_version is not None:
        raise UserError("--engine-version applies to --serve's command; add --serve, or drop it")
    return load_scenario(name or DEFAULT_SCENARIO, changes)


def load_scenario(name: str, changes: Changes = Changes()) -> Scenario:
    """A shipped scenario by name, or a TOML file by path, with `changes` applied
    (models.overrides.apply). The scenario model (pydantic) is imported here, when a file is
    read, not at start-up, nor for a name or path that names none."""
    weights = parse_size(changes.weights_per_rank, "weights_per_rank")
    check_exists(name)
    from mlamem.spec import scenario

    return overrides.apply(scenario.load(name), model=changes.model, gpu=changes.gpu,
                           weights_bytes=weights)


def check_weights_fit(scenario: Scenario, gpu_memory: str | None, from_file: bool) -> None:
    """repro-oom's and plan's refusal, in one line, of one rank's weights (counted or given)
    where they exceed the target GPU's memory: --gpu-memory's where given (a zero is left to
    the budget's own check), else the scenario's [gpu]. The line names what set the weights:
    the scenario file's field where they are `from_file`, else --weights-per-rank."""
    memory = parse_size(gpu_memory, "gpu_memory_bytes")
    line = overrides.weights_fit_line(scenario, memory or None)
    if not line:
        return
    if from_file:
        raise UserError(f"{scenario.source or scenario.name}: [parallel].weights_gib_per_rank: "
                        f"{line}: give a layout with more ranks, a larger GPU or "
                        "--weights-per-rank")
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
    if not stderr().is_terminal:
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


def _help(text: str, default: str | None) -> dict:
    """typer.Option's help: `text`, then what leaving the option out means where `default` says
    it (typer's own `[default: ...]` is left out then)."""
    if default is None:
        return {"help": text}
    return {"help": f"{text} Default: {default}.", "show_default": False}


# Each shared option is declared once below: a factory where its help differs per command (the
# command passes its words), an annotated type where it does not.
SCENARIO_HELP = "A shipped scenario name (see `mlamem scenarios`) or a path to your own TOML file."
SCENARIOS_HELP = "Comma-separated scenario names or TOML paths, or 'all' for every shipped scenario."


def scenario_option(default: str | None = None, *, many: bool = False, text: str | None = None):
    """--scenario (-s): one scenario, or with `many` a comma list or 'all'; `text` replaces the
    help's first sentence."""
    return typer.Option("--scenario", "-s", callback=_named, **_help(
        text or (SCENARIOS_HELP if many else SCENARIO_HELP), default))


def _named(value: str | None) -> str | None:
    """--scenario as given; an empty one (an unset shell variable) is refused, not read as the
    default."""
    if value is not None and not value.strip():
        raise typer.BadParameter("empty; name a scenario (see `mlamem scenarios`) or a TOML file")
    return value


def _op_scenarios() -> str:
    """Each operation's own default scenario, the sparse decode's first."""
    first = operations.operation(operations.operation_names()[0]).default_scenario
    return "; ".join([first, *(f"{op.name}: {op.default_scenario}" for op in
                               map(operations.operation, operations.operation_names())
                               if op.default_scenario != first)])


ScenarioOption = Annotated[str, scenario_option()]
OpScenarioOption = Annotated[str | None, scenario_option(f"the operation's ({_op_scenarios()})")]
ScenariosOption = Annotated[str, scenario_option(many=True)]
# repro-oom's and plan's: None is --serve's scenario, else DEFAULT_SCENARIO
OneScenarioOption = Annotated[str | None, scenario_option(
    f"{DEFAULT_SCENARIO}, unless --serve gives the scenario")]
ServeOption = Annotated[str | None, typer.Option(
    "--serve", metavar="COMMAND", help="The command that started the server, quoted (`vllm "
    "serve MODEL ...`, `trtllm-serve ...`, `python -m sglang.launch_server ...`): runs the "
    "scenario `mlamem scenarios --serve` prints for it, with --model, --gpu (default "
    f"{SERVE_GPU}) and --weights-per-rank; its notes go to stderr. Not with --scenario.",
    show_default=False)]
ModelOption = Annotated[str | None, typer.Option(
    "--model", metavar="PATH", help="The model's Hugging Face config.json, or a folder holding "
    "one: replaces the scenario's [model] (heads, layers, ranks, index_topk, hidden_size) and "
    "counts its weights per rank at the scenario's layout.", show_default=False)]
GpuOption = Annotated[str | None, typer.Option(
    "--gpu", metavar="NAME", help=f"The target GPU by name, one of {', '.join(GPUS)}: its memory "
    "and SM count replace the scenario's [gpu] (the utilization is kept). Default: the "
    "scenario's GPU.", show_default=False)]
EngineVersionOption = Annotated[str | None, typer.Option(
    "--engine-version", metavar="VERSION", help="The vLLM (0.10 to 0.33, e.g. 0.19.1) or SGLang "
    "(0.4.6 to 0.5.23, e.g. 0.5.5) version --serve's command ran: its defaults (utilization, "
    "graph estimate, capture sizes, batch tokens; mem_fraction_static, chunked prefill) replace "
    "the default's, and the notes name it. Default: vLLM 0.33.0, SGLang 0.5.23.",
    show_default=False)]
WeightsOption = Annotated[str | None, typer.Option(
    "--weights-per-rank", metavar="SIZE", help="One rank's weights, e.g. 40GiB: a labelled "
    "override of the scenario's (or --model's count).", show_default=False)]
LogOption = Annotated[str | None, typer.Option(
    "--log", metavar="FILE", help="The server's own log (vLLM, SGLang or TensorRT-LLM; `-`: "
    "standard input): its memory figures beside mlamem's for the same rank (the ledger), its "
    "OOM message explained, and the serve command with the largest safe value put in.",
    show_default=False)]


class LogPath(StrEnum):
    alloc = "alloc"
    workspace = "workspace"


LogPathOption = Annotated[LogPath | None, typer.Option(
    "--log-path", help="With --log: the decode path the log's engine ran (alloc: q padded with "
    "new_zeros, the kernel allocates out; workspace: q and out staged, vLLM PR #60220). The "
    "memory the rank held beyond mlamem's model is derived on it, then used on every path. "
    "Default: the path the engine's release runs (alloc for vLLM and SGLang).",
    show_default=False)]


def server_log(log: str | None, log_path: LogPath | None):
    """--log read (None without it), with the path --log-path says its engine ran; --log-path
    without --log refused. Both in one line before any work."""
    if log is None:
        if log_path is not None:
            raise UserError("it names the path the engine of a server log ran; give the log with "
                            "--log, or leave it out",
                            field="log_path")
        return None
    return read_log(log, ran_path=log_path and log_path.value)
# What helps where a value does not fit a scenario's workspace, in the CLI's words.
RAISE_LIMIT = "raise it with --max-num-batched-tokens or drop that T from --tokens"
DROP_CASE = "drop that T from --tokens or that scenario from --scenario"


def tokens_option(default: str):
    """--tokens: the T (sparse-prefill: s_q) values swept."""
    return typer.Option("--tokens", **_help(
        "Comma-separated T values: query tokens per step, the s_q of one decode call "
        "(sparse-prefill: s_q prefill tokens).", default))


def requests_option(default: str):
    """--requests: dense-decode's b values swept."""
    return typer.Option("--requests", **_help(
        "dense-decode: comma-separated b values, requests per decode step (one query each).",
        default))


DECODE_SWEEP = ",".join(map(str, operations.operation(operations.SPARSE_DECODE).default_sweep))
DENSE_SWEEP = ",".join(map(str, operations.operation(operations.DENSE_DECODE).default_sweep))
RequestsOption = Annotated[str | None, requests_option(DENSE_SWEEP)]


def _kernels_metavar(kernels: Mapping[str, KernelEntry]) -> str:
    return f"<{'|'.join(kernels)}>"


def _kernels_help(kernels: Mapping[str, KernelEntry]) -> str:
    listed = [f"{name} ({entry.help})" for name, entry in kernels.items()]
    return (f"The kernel: {', '.join(listed[:-1])} or {listed[-1]}. `mlamem kernels` lists what "
            "each runs and takes, and whether it runs here.")


def kernel_option(default: str | None = None, *, text: str | None = None):
    """--kernel: a registered name, checked when the command runs (check_kernel_name). Its
    metavar and help list the shipped kernels; `list_every_kernel` adds the plug-ins."""
    return typer.Option("--kernel", callback=check_kernel_name, metavar=_kernels_metavar(SHIPPED),
                        **_help(text or _kernels_help(SHIPPED), default))


def list_every_kernel(command) -> None:
    """The click `command`'s --kernel metavar and help with the plug-in kernels too, for its
    help: the entry-point scan that finds them costs a start ~40 ms, so it waits for this."""
    for param in command.params:
        if "--kernel" in param.opts:
            param.metavar = _kernels_metavar(REGISTRY)
            param.help = param.help.replace(_kernels_help(SHIPPED), _kernels_help(REGISTRY))


KernelOption = Annotated[KernelName, kernel_option()]
PathsOption = Annotated[str | None, typer.Option(
    help="Comma-separated paths: 'alloc' (q padded with new_zeros, kernel allocates out), "
         "'workspace' (q and out staged in buffers reserved up front), 'workspace-full' (q, out, "
         "lse and accumulators staged: nothing allocated in the call; a kernel that takes all "
         "four, see `mlamem kernels`). "
         "Default: every path the kernel supports.")]

def check_op_name(name: str | None) -> str | None:
    """--op: a registered operation, checked when the command runs, so an operation registered
    after this module was imported is a choice too."""
    names = operations.operation_names()
    if name is not None and name not in names:
        raise typer.BadParameter(f"{name!r} is not one of {', '.join(map(repr, names))}")
    return name


def op_option(text: str, default: str | None = None):
    """--op, a registered operation's name; `text`: its help."""
    return typer.Option("--op", callback=check_op_name,
                        metavar=f"<{'|'.join(operations.operation_names())}>",
                        **_help(text, default))


OpOption = Annotated[str, op_option(
    "The kernel operation: sparse-decode (sweeps T, --tokens), dense-decode (sweeps b requests, "
    "--requests, at --context-len) or sparse-prefill (sweeps s_q, --tokens, against --kv-len). "
    "`mlamem kernels` lists who runs what.")]
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
def stdout_or_path(value: str | Path) -> Path | None:
    """--output: '-' is stdout, as omitting it is (None); else the path."""
    return None if str(value) == "-" else Path(value)


def no_stdout(fix: str):
    """The parser of a path option that cannot be stdout: '-' refused, saying `fix`."""
    def parse(value: str | Path) -> Path:
        if str(value) == "-":
            raise typer.BadParameter(f"- (stdout) cannot take it; {fix}")
        return Path(value)
    return parse


OutputOption = Annotated[Path | None, typer.Option(
    parser=stdout_or_path, help="Write to this file instead of stdout (written whole or not at "
    "all); - is stdout.")]
PlainOutputOption = Annotated[Path | None, typer.Option(
    parser=stdout_or_path, help="Write to this file instead of stdout; - is stdout.")]


def predict_option(why: str = ""):
    """--predict/--no-predict; `why` follows the help's sentence."""
    return typer.Option("--predict/--no-predict", help="Predict on the allocator model even where "
                        f"a GPU could measure{why}.")


PredictOption = Annotated[bool, predict_option(": what a CPU-only machine prints")]


def gpu_memory_option(text: str):
    """--gpu-memory SIZE, e.g. 80GiB (units.parse_bytes); the scenario's GPU's by default."""
    return typer.Option("--gpu-memory", metavar="SIZE", **_help(text, "the scenario's GPU's memory"))


def utilization_option(text: str):
    """--utilization, a fraction; the scenario's by default."""
    return typer.Option("--utilization", **_help(text, "the scenario's"))


def max_tokens_option(sizes: str, default: str = "the scenario's"):
    """--max-num-batched-tokens, at least 1; `sizes`: what it sizes."""
    return typer.Option("--max-num-batched-tokens", min=1, **_help(
        f"Tokens per step (max_num_batched_tokens): sizes {sizes}.",
        default))


def capture_sizes_option(default: str, applies: str = ""):
    """--capture-sizes; `applies`: with which other option, in brackets."""
    return typer.Option("--capture-sizes", **_help(
        f"Comma-separated capture sizes (tokens per graph), e.g. 512,256,8,1{applies}.", default))


CaptureSizesOption = Annotated[str | None, capture_sizes_option(
    "the FULL decode graphs vLLM 0.33.0 captures for the scenario's [serving] max_num_seqs, "
    "max_cudagraph_capture_size, cudagraph_mode and num_speculative_tokens (51 sizes, 512 down "
    "to 1, at the defaults)")]


def format_option(schema: str | None, formats: str = "table, markdown or json",
                  extensions: str | None = ".txt, .md, .json", after: str = ""):
    """--format: `formats` (then `after`), JSON in schema `schema`; `extensions`: what --output's
    extension picks (None: a listing, written to stdout only, whose default typer shows)."""
    text = f"{formats}{f' (schema {schema})' if schema else ''}{after}."
    if extensions is None:
        return typer.Option("--format", help=text)
    return typer.Option("--format", **_help(
        text, f"what --output's extension names ({extensions}), else table"))


def _folder(value: str | Path) -> Path:
    """A folder path as given: an empty one is refused (Path('') would be the current folder),
    and '-' (a folder cannot be stdout)."""
    if str(value) in ("", "-"):
        raise typer.BadParameter(f"{'empty' if not str(value) else '- (stdout) is not a folder'}"
                                 "; name a folder, e.g. --report report/ (the table goes to "
                                 "stdout without it)")
    return Path(value)


def report_option(what: str):
    """--report DIR: also write a report of `what` (e.g. 'its plots (PNG)')."""
    return typer.Option(
        "--report", parser=_folder, help="Also write a report into this folder (created if needed): the "
                         f"result JSON, report.md and {what}, as `mlamem report` makes.")
