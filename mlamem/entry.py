"""The `mlamem` console script and `python -m mlamem`: Ctrl-C is one line, exit 130 (SIGTERM:
143), from the first import on (importing the CLI may take seconds)."""

import signal
import sys

from mlamem.runtime import interrupt


def main() -> int:
    """Import the CLI and run it; Ctrl-C before the CLI takes over ends the process at once."""
    interrupt.on_stop(interrupt.exit_at_once)
    from mlamem.cli import main as run

    code = run()
    interrupt.on_stop(signal.SIG_IGN)  # done: a late Ctrl-C or SIGTERM changes nothing
    return code


if __name__ == "__main__":
    sys.exit(main())
