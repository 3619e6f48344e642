"""Ctrl-C at any moment: one line on stderr, exit 130, no partial file, never a traceback.

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
GRACE_S = 1.0  # how long an interrupted run may take to unwind before it is ended anyway


def _leave(text: str) -> None:
    """Remove half-written temporaries, print `text`, exit now (from any thread)."""
    files.remove_temporaries()
    if sys.stderr.isatty():
        text = "\x1b[?25h" + text  # a progress bar may have hidden the cursor
    os.write(2, (text + "\n").encode())
    os._exit(EXIT_CODE)


def exit_at_once(signum=None, frame=None) -> None:
    """The SIGINT handler while the CLI starts: nothing is written yet."""
    _leave(interrupted_line(files.written()))


class Guard:
    """While a command runs: the first Ctrl-C raises Interrupted (later ones are ignored), and
    ends the process GRACE_S later should that exception be lost. Only in the main thread."""

    def __init__(self) -> None:
        self.since = len(files.written())
        self.interrupted = False
        self._said = threading.Lock()
        self._timer: threading.Timer | None = None
        self._previous = None

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
        self.interrupted = True
        self._timer = threading.Timer(GRACE_S, self._lost)
        self._timer.daemon = True
        self._timer.start()
        raise Interrupted

    def _lost(self) -> None:
        if self._said.acquire(blocking=False):
            _leave(self.line())

    def __enter__(self) -> Guard:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
