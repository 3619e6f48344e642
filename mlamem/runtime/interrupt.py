"""Ctrl-C (or SIGTERM) at any moment: one line on stderr, exit 130 (143), no partial file,
never a traceback.

Two phases. While the CLI starts (imports), nothing is written yet: the first Ctrl-C says so and
leaves at once (`exit_at_once`). While a command runs, `Guard` raises `Interrupted` so the run
unwinds (temporary files removed, child processes killed). Some C code clears any Python error
raised under it (torch's import of numpy does), so should the exception vanish, or unwinding
hang, the process still exits GRACE_S later.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

from mlamem.spec import files
from mlamem.spec.errors import Interrupted, interrupted_line

EXIT_CODE = Interrupted.exit_code  # 130, as a shell reports SIGINT
# The signals that stop a run: Ctrl-C, and SIGTERM (`kill`, a CI runner's timeout); each exits
# 128 + its number, as a shell reports a process it ended
STOPPING = (signal.SIGINT, signal.SIGTERM)
GRACE_S = 1.0  # how long an interrupted run may take to unwind before it is ended anyway


def exit_code(signum: int | None) -> int:
    """The exit status after `signum` (130 for Ctrl-C, 143 for SIGTERM)."""
    return 128 + signum if signum in STOPPING else EXIT_CODE


def _leave(text: str, signum: int | None = None) -> None:
    """Remove half-written temporaries, print `text`, exit now (from any thread)."""
    files.remove_temporaries()
    if sys.stderr.isatty():
        text = "\x1b[?25h" + text  # a progress bar may have hidden the cursor
    os.write(2, (text + "\n").encode())
    os._exit(exit_code(signum))


def exit_at_once(signum=None, frame=None) -> None:
    """The SIGINT and SIGTERM handler while the CLI starts: nothing is written yet."""
    _leave(interrupted_line(files.written()), signum)


def on_stop(handler) -> dict:
    """Set `handler` for every stopping signal; returns the handlers it replaced."""
    return {signum: signal.signal(signum, handler) for signum in STOPPING}


class Guard:
    """While a command runs: the first Ctrl-C or SIGTERM raises Interrupted (later ones are
    ignored), and ends the process GRACE_S later should that exception be lost. Only in the
    main thread."""

    def __init__(self) -> None:
        self.since = len(files.written())
        self.interrupted = False
        self.signum: int | None = None  # the signal that stopped the run
        self._said = threading.Lock()
        self._timer: threading.Timer | None = None
        self._previous: dict = {}

    @property
    def exit_code(self) -> int:
        """The exit status the stopping signal gives (130 for Ctrl-C, 143 for SIGTERM)."""
        return exit_code(self.signum)

    def line(self) -> str:
        """The one line to print: what this run finished writing, usually nothing."""
        return interrupted_line(files.written()[self.since:])

    def say(self) -> bool:
        """Print the line unless it was printed already; False if it was."""
        if not self._said.acquire(blocking=False):
            return False
        print(self.line(), file=sys.stderr, flush=True)
        return True

    def _handler(self, signum, frame) -> None:
        if self.interrupted:
            return
        self.interrupted, self.signum = True, signum
        self._timer = threading.Timer(GRACE_S, self._lost)
        self._timer.daemon = True
        self._timer.start()
        raise Interrupted

    def _lost(self) -> None:
        if self._said.acquire(blocking=False):
            _leave(self.line(), self.signum)

    def __enter__(self) -> Guard:
        if threading.current_thread() is threading.main_thread():
            self._previous = on_stop(self._handler)
        return self

    def __exit__(self, *exc) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
