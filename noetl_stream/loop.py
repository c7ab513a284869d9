"""Run a coroutine on uvloop when it is installed (1.1-1.5x faster hot paths), else on asyncio's loop,
with the garbage collector tuned for a long-running message processor (`tune_gc`)."""

from __future__ import annotations

import asyncio
import gc
import os
import time
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from noetl_stream.errors import ConfigurationError

T = TypeVar("T")

GC_THRESHOLD: tuple[int, int, int] = (10_000, 20, 10)
"""Collect the youngest generation every 10,000 net allocations instead of Python's 700.

Every event a controller or worker handles allocates a few dozen short-lived containers (decoded
events, payload dicts, effects), freed by reference counting; with the default threshold the cyclic
collector ran every few messages and cost 10-15 % of the CPU of a noop step (`make bench`, see
docs/performance.md). Only garbage in reference cycles waits longer for collection; the older
generations' thresholds are Python's."""


def tune_gc(threshold: tuple[int, int, int] | None = None) -> tuple[int, int, int]:
    """Move everything allocated so far (modules, classes, functions: never garbage) out of the
    collector's sight (`gc.freeze`) and set the collection thresholds: `threshold`, else
    ``NOETL_GC_THRESHOLD`` (``"gen0,gen1,gen2"``), else `GC_THRESHOLD`. Returns what was set."""
    if threshold is None:
        threshold = _threshold_from_env(os.environ.get("NOETL_GC_THRESHOLD"))
    gc.collect()  # garbage that exists now would otherwise be frozen with the rest, until `gc.unfreeze`
    gc.freeze()
    gc.set_threshold(*threshold)
    return threshold


def _threshold_from_env(value: str | None) -> tuple[int, int, int]:
    if not value:
        return GC_THRESHOLD
    try:
        parts = tuple(int(p) for p in value.split(","))
    except ValueError:
        parts = ()
    if len(parts) != 3 or parts[0] < 1 or any(p < 0 for p in parts):  # gen0 0 would turn collection off
        raise ConfigurationError(
            f"NOETL_GC_THRESHOLD must be three integers 'gen0,gen1,gen2', gen0 >= 1, got {value!r}"
        )
    return parts[0], parts[1], parts[2]


EXECUTOR_SHUTDOWN_WAIT_S = 0.5
"""How long the end of an event loop waits for its default executor's threads (idle ones end in
microseconds; a thread still busy then runs code that cannot be stopped)."""


class _Executor(ThreadPoolExecutor):
    """asyncio's default executor (same size), except at the end of the loop: asyncio joins its
    threads without a limit, so a ``kind: python`` task blocked in C (``time.sleep``, a socket read;
    its thread cannot be interrupted) kept a Ctrl-C'd ``noetl-stream run``, or a worker past its
    grace, alive until the task's code returned. This one waits `EXECUTOR_SHUTDOWN_WAIT_S` and
    leaves the rest to the command line's exit (`noetl_stream.cli.entry`)."""

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        super().shutdown(wait=False, cancel_futures=cancel_futures)
        if wait:
            deadline = time.monotonic() + EXECUTOR_SHUTDOWN_WAIT_S
            for thread in list(self._threads):
                thread.join(max(0.0, deadline - time.monotonic()))


async def _with_executor(coro: Coroutine[Any, Any, T]) -> T:
    asyncio.get_running_loop().set_default_executor(_Executor(thread_name_prefix="asyncio"))
    return await coro


def run_event_loop(coro: Coroutine[Any, Any, T]) -> T:
    before = gc.get_threshold()
    try:
        tune_gc()
    except ConfigurationError:
        coro.close()  # never started: no "coroutine was never awaited" warning
        raise
    try:
        if os.environ.get("NOETL_EVENT_LOOP", "uvloop") == "uvloop":
            try:
                import uvloop
            except ImportError:
                pass
            else:
                return uvloop.run(_with_executor(coro))
        return asyncio.run(_with_executor(coro))
    finally:
        # Give the frozen objects back to the collector: the interpreter's last collection at exit
        # skips frozen ones, and extension modules then report their objects as leaked. The caller's
        # thresholds hold again (a process that runs several loops, or a test session).
        gc.unfreeze()
        gc.set_threshold(*before)
