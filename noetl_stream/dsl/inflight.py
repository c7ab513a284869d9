"""How many iterations of a loop run at once: ``loop.spec.max_in_flight``, once rendered.

``max_in_flight`` is a positive integer or a template (the compiler checks a literal); a template's
value is only known when the loop starts, on the controller for a distributed loop and on the worker
for a local one. Both read it with `loop_max_in_flight`, so a value means the same on either side:

* a whole number >= 1: an int, a float with nothing after the point (``4.0``), or the digits of one as
  text (``"4"``, ``" +4 "``);
* anything else (``"abc"``, ``2.5``, ``"4.0"``, ``true``, ``null``, a list, a mapping, ``0``, ``-1``) is a
  `MaxInFlightError` naming the step, the field and the value, whatever the loop's mode:
  ``step 'fetch' loop.spec.max_in_flight: max_in_flight must be a whole number >= 1, got 'abc'``.

Not given, a parallel loop runs every item at once (at least 1); a sequential loop runs one.
"""

from __future__ import annotations

import math
import re
from typing import Any

from noetl_stream.dsl.model import LoopSpec
from noetl_stream.dsl.templates import RenderError

__all__ = ["MaxInFlightError", "loop_max_in_flight"]

_DIGITS = re.compile(r"\s*[+-]?[0-9]+\s*")


class MaxInFlightError(RenderError):
    """A loop's rendered ``max_in_flight`` is not a whole number >= 1."""


def _whole_number(value: Any) -> int | None:
    if isinstance(value, bool):  # an int to Python, never a count to a playbook
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, str) and _DIGITS.fullmatch(value):
        return int(value)
    return None


def loop_max_in_flight(spec: LoopSpec, rendered: Any, total: int, where: str) -> int:
    """The iterations of a loop to run at once: 1 for a sequential loop, else `rendered` (the rendered
    ``spec.max_in_flight``), or every one of the `total` items (at least 1) when the spec gives none.

    `where` names the field in errors (``step 'x' loop.spec.max_in_flight``). A value that is given but
    not a whole number >= 1 raises `MaxInFlightError`, in a sequential loop too.
    """
    if spec.max_in_flight is None:
        return 1 if spec.mode == "sequential" else max(total, 1)
    count = _whole_number(rendered)
    if count is None:
        raise MaxInFlightError(f"max_in_flight must be a whole number >= 1, got {rendered!r}", where)
    if count < 1:
        raise MaxInFlightError(f"max_in_flight must be >= 1, got {rendered!r}", where)
    return 1 if spec.mode == "sequential" else count
