"""`mlamem compare`: the same inputs through two kernels."""

from __future__ import annotations

from typing import Annotated

import typer

from mlamem import operations, render
from mlamem.cli import options as o
from mlamem.cli.app import app
from mlamem.cli.output import command_line, emit, progress
from mlamem.commands.compare import check_kernels, run_compare
from mlamem.commands.sweep import Request, plan
from mlamem.kernels import COMPARED_KERNELS, REFERENCE_KERNEL, REGISTRY
from mlamem.spec.errors import UserError
from mlamem.spec.files import check_output_path, pick_format
from mlamem.spec.lists import parse_list


@app.command()
def compare(
    kernels: Annotated[str, typer.Option(
        help="Two comma-separated kernel names to run on the same inputs (`mlamem kernels` "
             "lists them).")] = ",".join(COMPARED_KERNELS),
    op: o.OpOption = operations.SPARSE_DECODE,
    tokens: Annotated[str | None, o.tokens_option("the operation's sweep")] = None,
    requests: o.RequestsOption = None,
    context_len: o.ContextOption = None,
    kv_len: o.KvLenOption = None,
    scenario: o.OpScenarioOption = None,
    paths: Annotated[str, typer.Option(
        help="Comma-separated wrapper paths both kernels run.")] = "alloc,workspace",
    reference: Annotated[bool, typer.Option(
        help="Also hold each kernel to the plain-torch reference (out relative L2, lse max "
             "abs).")] = True,
    output_format: Annotated[o.ReproFormat | None, o.format_option("mlamem.compare/1")] = None,
    output: o.PlainOutputOption = None,
) -> None:
    """Run the same inputs through two kernels: are out and lse bit-identical per (T, path)?

    Where they differ, the largest difference, and each kernel's error against the torch
    reference. Needs a GPU where both kernels run. Example: `mlamem compare --op
    sparse-prefill` holds sgl-flash-mla and vLLM's FlashMLA build to the reference.
    """
    names = _kernel_names(kernels)
    values = o.parse_sweep(op, tokens, requests)
    kv_tokens = o.kv_length(op, context_len, kv_len)
    output_format = o.ReproFormat(pick_format(output, output_format and output_format.value,
                                              list(o.ReproFormat), what="compare"))
    if output is not None:
        check_output_path(output)
    name = scenario or operations.operation(op).default_scenario
    loaded = o.load_scenario(name)  # a bad file is refused before torch loads
    pair = [o.make_kernel(kernel_name) for kernel_name in names]
    part = _plan(op, (name, loaded), values, paths, pair, kv_tokens)
    check_kernels(pair, op)  # needs the GPU: after every input check, before any progress line
    reference_kernel = o.make_kernel(REFERENCE_KERNEL) if reference else None
    symbol = operations.operation(op).symbol
    with progress(f"comparing {names[0]} and {names[1]}",
                  len(part.values) * len(part.paths)) as advance:
        result, failure = run_compare(part.scenario, op, part.values, part.paths, pair,
                             command=command_line(), kv_tokens=kv_tokens,
                             reference=reference_kernel,
                             on_case=lambda t, p: advance(f"{symbol}={t} {p}"))
    if failure is not None:  # memory.is_out_of_memory said so; the sweep stopped there
        raise UserError(f"compare ran out of GPU memory ({failure.text}); "
                        f"drop the largest {symbol} or add --no-reference")
    terminal = render.compare_view(result) if output_format is o.ReproFormat.table else None
    emit(render.COMPARE_FORMATS[output_format.value](result), output, terminal_table=terminal)


def _kernel_names(kernels: str) -> list[str]:
    """--kernels: two different registered kernels."""
    try:
        names = parse_list(kernels, "kernels", each="kernel")
    except UserError:  # empty, or a kernel twice: the one fix below says what to give
        names = []
    if len(names) != 2:
        raise UserError(f"--kernels: give two different kernels, e.g. {','.join(COMPARED_KERNELS)}; "
                        f"got {kernels!r}")
    for name in names:
        if name not in REGISTRY:
            raise UserError(f"--kernels: unknown kernel {name!r}; expected one of "
                            f"{', '.join(REGISTRY)}")
    return names


def _plan(op: str, scenario: tuple, values: list[int] | None, paths: str, pair,
          kv_tokens: int | None):
    """The one part both kernels run, checked for each of them; `scenario` is (as given,
    loaded)."""
    flag = operations.operation(op).flag
    parts = [plan(Request(
        "compare", kernel, scenarios=[scenario], ops=[op],
        values={op: values or list(operations.operation(op).default_sweep)},
        paths=o.split_paths(paths), kv_tokens=kv_tokens,
        fix=f"lower {flag} or drop the workspace paths from --paths"))[0] for kernel in pair]
    return parts[0]
