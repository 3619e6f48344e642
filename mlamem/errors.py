"""Errors a user can fix, and an interrupt: the CLI prints each on one line, never a traceback."""


class UserError(Exception):
    """Bad input. The message names the fix; the CLI prints it on one line and exits 2."""

    exit_code = 2


class Interrupted(BaseException):
    """Ctrl-C while the CLI runs (see `mlamem.interrupt`): one line, exit 130.

    Not a KeyboardInterrupt, so no library turns it into something else on the way up; a
    BaseException, so `except Exception` does not swallow it.
    """

    exit_code = 130


def interrupted_line(written: list) -> str:
    """The one line an interrupt prints: what the run had finished writing, usually nothing."""
    if not written:
        return "mlamem: interrupted; nothing written"
    return f"mlamem: interrupted; wrote only {', '.join(map(str, written))}"

