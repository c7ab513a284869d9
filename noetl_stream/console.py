"""The ``noetl-stream`` console script (and ``python -m noetl_stream``).

It imports the command line inside the guard that turns a Ctrl-C during those imports (the first quarter
of a second: the tools, the templates, NATS) into what a Ctrl-C later gives, one line and exit 130,
instead of a traceback from whichever module was being imported. This module imports nothing itself.
"""

from __future__ import annotations

import sys

__all__ = ["entry"]

EXIT_INTERRUPTED = 130
"""128 + SIGINT, as a shell reports a command Ctrl-C ended (the command line's own)."""


def entry() -> None:
    try:
        from noetl_stream.cli import entry as command_line
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
    command_line()
