"""The ``noetl-stream`` click group and the console script's entry point (`entry`).

The commands are registered on `main` by their modules (``noetl_stream.cli`` imports them all).
"""

from __future__ import annotations

import os
import sys

import click
import msgspec

from noetl_stream import __version__
from noetl_stream.cli.common import EXIT_FAILED, fail
from noetl_stream.errors import NoetlError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="noetl-stream")
def main() -> None:
    """Run NoETL playbooks (noetl.io/v2) on NATS JetStream."""
    try:  # (importing the tools and reading the installed packages' entry points take a moment)
        from noetl_stream.dsl.budget import set_cpu_seconds
        from noetl_stream.logs import configure
        from noetl_stream.runtime.plugins import load_plugins
        from noetl_stream.settings import template_cpu_s_from_env

        set_cpu_seconds(template_cpu_s_from_env(os.environ))
        configure("warning")
        load_plugins()
    except KeyboardInterrupt:  # Ctrl-C before the command began: not click's "Aborted!" and exit 1
        click.echo("interrupted", err=True)
        sys.exit(130)


def entry() -> None:
    """The ``noetl-stream`` console script: `main`, then an exit that does not wait for a thread a
    task left running. A ``kind: python`` task blocked in C (``time.sleep``, a socket read) cannot be
    interrupted, and the interpreter joins every thread at exit: a Ctrl-C'd ``run``, a ``run`` whose
    task timed out, or a worker past its shutdown grace stayed alive until the task's code returned.
    Everything of ours is closed by then (connections drained, the embedded server stopped); the
    threads are abandoned with the process. A failure no command handled is one error line (exit 1),
    never a traceback."""
    try:
        try:
            main(prog_name="noetl-stream")
        except msgspec.DecodeError as exc:  # a stored message that is not what it should be
            fail(f"a stored message could not be decoded: {exc}", EXIT_FAILED)
        except NoetlError as exc:  # a failure the core names that its command did not handle
            fail(str(exc) or type(exc).__name__, EXIT_FAILED)
    except SystemExit as exc:
        if _threads_left_running():
            import atexit
            import os

            code = exc.code
            if code is not None and not isinstance(code, int):
                print(code, file=sys.stderr)
            # What an exit runs besides joining threads: finalizers (an embedded server's directory),
            # the tracer's last batch of spans, logging's flush; in a thread, for a bounded time (an
            # exit function may wait too: multiprocessing's joins its children).
            import threading

            runner = threading.Thread(target=atexit._run_exitfuncs, name="noetl-exit", daemon=True)
            runner.start()
            runner.join(EXIT_FUNCTIONS_WAIT_S)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code if isinstance(code, int) else 0 if code is None else 1)
        raise


EXIT_FUNCTIONS_WAIT_S = 5.0
"""How long `entry` lets the exit functions run when it leaves abandoned threads behind."""


def _threads_left_running(wait_s: float = 0.2) -> bool:
    import threading
    import time

    deadline = time.monotonic() + wait_s
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join(max(0.0, deadline - time.monotonic()))
    return any(
        t is not threading.main_thread() and not t.daemon and t.is_alive() for t in threading.enumerate()
    )
