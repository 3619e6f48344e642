"""Errors a user can fix, and an interrupt: the CLI prints each on one line, never a traceback."""


class UserError(Exception):
    """Bad input. The message names the fix; the CLI prints it on one line and exits 2.

    `field` names what is wrong in the library's own words (`max_num_batched_tokens`,
    `tokens[2]`, `baseline`), never a face's: each face maps it to its own (the CLI to a flag,
    `mlamem.cli.flag_for`). Read as text, the error is `field: message`.
    """

    exit_code = 2

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message, self.field = message, field

    def __reduce__(self):  # keeps the field across processes (each repro case runs in its own)
        return _user_error, (type(self), self.message, self.field), self.__dict__

    def __str__(self) -> str:
        return self.message if self.field is None else f"{self.field}: {self.message}"

    def worded(self, name: str) -> str:
        """The one line with the field in a face's words, e.g. `--shard: ...`."""
        return self.message if self.field is None else f"{name}: {self.message}"


def _user_error(kind: type, message: str, field: str | None) -> UserError:
    error = kind.__new__(kind)
    UserError.__init__(error, message, field=field)
    return error


class Interrupted(BaseException):
    """Ctrl-C while the CLI runs (see `mlamem.runtime.interrupt`): one line, exit 130.

    Not a KeyboardInterrupt, so no library turns it into something else on the way up; a
    BaseException, so `except Exception` does not swallow it.
    """

    exit_code = 130


def interrupted_line(written: list) -> str:
    """The one line an interrupt prints: what the run had finished writing, usually nothing."""
    if not written:
        return "mlamem: interrupted; nothing written"
    return f"mlamem: interrupted; wrote only {', '.join(map(str, written))}"

