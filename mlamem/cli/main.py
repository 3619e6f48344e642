"""The CLI's entry point: run a command, and word what goes wrong as one line."""

from __future__ import annotations

import copy
import re
import sys

import typer

from mlamem.cli.app import app
from mlamem.cli.options import list_every_kernel
from mlamem.render.escape import escaped
from mlamem.runtime.interrupt import Guard
from mlamem.spec.errors import UserError
from mlamem.spec.redaction import argv_secrets, scrubbed

try:  # typer >= 0.28 vendors click; older typer uses the click package
    from typer._click import exceptions as click_errors
except ImportError:
    from click import exceptions as click_errors

# A library error's field in the CLI's words, where the flag is not the field's name in kebab case.
_FLAGS = {"gpu_memory_bytes": "--gpu-memory", "report_dir": "--report",
          "capture_sizes": "--capture-sizes", "free_fraction": "--free-fraction"}


# typer validates a choice through pydantic, whose message starts its reason with this
_VALUE_ERROR = re.compile(r"\bValue error, ")


def flag_for(field: str | None) -> str:
    """The flag that sets `field` (`max_num_batched_tokens` -> --max-num-batched-tokens,
    `tokens[2]` -> --tokens)."""
    name = (field or "").partition("[")[0]
    if name.startswith("config."):  # a field of the model's config.json: its message names it
        return "config.json"
    return _FLAGS.get(name, "--" + name.replace("_", "-"))


def main(argv: list[str] | None = None) -> int:
    """Entry point: bad input is one line on stderr with exit 2, Ctrl-C one line with exit 130
    (SIGTERM: 143); never a traceback."""
    args = sys.argv[1:] if argv is None else list(argv)
    guard = Guard()
    try:
        with guard:
            code = _run(args)
    except BaseException:
        if not guard.interrupted:  # a bug: its traceback is the report
            raise
        code = None  # whatever an interrupt turned into on its way up (C code may clear it)
    if guard.interrupted:
        guard.say()
        return guard.exit_code
    return code


def _run(args: list[str]) -> int:
    """Run the command; user errors become one line on stderr and exit 2."""
    try:
        group = _group(args)
        command = group.commands.get(args[0]) if args else None
        if command is not None and {"-h", "--help"} & set(args[1:]):
            list_every_kernel(command)
        _check_repeats(command, args)
        code = group.main(args=args, prog_name="mlamem", standalone_mode=False)
    except UserError as exc:
        # a refusal may quote a file (a baseline's environment): one line, no terminal sequence
        print(f"mlamem: error: {_hidden(escaped(exc.worded(flag_for(exc.field))), args)}",
              file=sys.stderr)
        return exc.exit_code
    except click_errors.UsageError as exc:
        if type(exc).__name__ == "NoArgsIsHelpError" and exc.ctx:  # bare `mlamem`
            print(exc.ctx.get_help())
            return 0
        command = exc.ctx.command_path if exc.ctx else "mlamem"
        message = _VALUE_ERROR.sub("", exc.format_message()).rstrip(".")
        print(f"mlamem: error: {_hidden(message, args)}; see `{command} --help`", file=sys.stderr)
        return 2
    except click_errors.ClickException as exc:
        print(f"mlamem: error: {_hidden(exc.format_message(), args)}", file=sys.stderr)
        return exc.exit_code
    except typer.Abort:
        return 130
    except typer.Exit as exc:
        return exc.exit_code
    return code if isinstance(code, int) else 0


def _hidden(line: str, args: list[str]) -> str:
    """An error line without the secrets mlamem's arguments hold (a click error quotes the
    words it could not place: `HF_TOKEN=...`, an unquoted --serve command's)."""
    return scrubbed(line, argv_secrets(args))


def _group(args: list[str]):
    """The click group app(...) builds, with only the command `args` name where they name one:
    typer reads every command's signature to build it, which for all of them costs a start
    ~0.1 s."""
    named = [info for info in app.registered_commands if args and args[0] == (
        info.name or typer.main.get_command_name(info.callback.__name__))]
    if not named:  # the app's help, its --version, or a name click refuses
        return typer.main.get_command(app)
    alone = copy.copy(app)
    alone.registered_commands = named
    return typer.main.get_command(alone)


def _check_repeats(command, args: list[str]) -> None:
    """A single-valued option given twice is a UserError (click would keep the last one
    silently); options declared repeatable (multiple=True, e.g. --expect-oom) may repeat.
    `command` is the click command args[0] names, if any."""
    if command is None or {"-h", "--help"} & set(args):
        return
    options = {name: param for param in command.params if param.param_type_name == "option"
               for name in (*param.opts, *param.secondary_opts)}
    seen: dict[str, str] = {}
    rest = iter(args[1:])
    for arg in rest:
        if arg == "--":
            return
        if arg.startswith("--"):
            name, attached = arg.partition("=")[0], "=" in arg
        else:  # a short option, its value maybe attached: -s NAME or -sNAME
            name, attached = arg[:2], len(arg) > 2
        param = options.get(name)
        if param is None:
            continue
        if not param.is_flag and not attached:
            next(rest, None)  # its value, whatever it looks like
        if param.multiple:
            continue
        if param.name in seen:
            first = seen[param.name]
            raise UserError(f"{name} is given twice; give it once" if first == name else
                            f"{first} and {name} are both given; give one")
        seen[param.name] = name
