"""Run a coroutine on uvloop when it is installed (1.1-1.5x faster hot paths), else on asyncio's loop."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run_event_loop(coro: Coroutine[Any, Any, T]) -> T:
    if os.environ.get("NOETL_EVENT_LOOP", "uvloop") == "uvloop":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.run(coro)
    return asyncio.run(coro)
