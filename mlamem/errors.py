"""Errors a user can fix: the CLI prints them on one line and exits 2."""


class UserError(Exception):
    """Bad input. The message names the fix; the CLI prints it on one line and exits 2."""

    exit_code = 2
