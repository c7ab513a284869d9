"""Bounds on what one template may cost: a template is a playbook author's code, and it runs inside the
controller (arcs, admission, a distributed loop's ``in``) and the worker (args, task config) on their
event loops, where one render that never ends stalls every execution they hold.

Two bounds, both from the template itself:

* **Size.** An operation that builds one large value in a single C call cannot be interrupted, so it is
  checked before it runs: ``*`` on a string or list, ``**`` on integers, printf-style ``%`` and
  ``str.format`` widths, and the ``center``/``indent``/``wordwrap``/``replace``/``format`` filters
  (`check_binop`, `check_format`, `FILTERS`). Past ``MAX_TEMPLATE_ITEMS`` characters or items (or
  ``MAX_INT_BITS`` for an integer) the render fails.
* **Time.** A template that can loop (``{% for %}``, a macro, any call or a filter outside a short list
  of cheap ones: `needs_timer`, decided once when it is compiled) renders under a CPU-time timer
  (``ITIMER_VIRTUAL``; ``SIGALRM`` is left to others, such as pytest-timeout). When
  ``TEMPLATE_CPU_S`` seconds run out, `BudgetExceededError` is raised where the template is, and the render
  fails. The timer is used on the main thread only (where the controller and the worker render);
  elsewhere the size bounds still hold. Templates that only read, compare and do arithmetic (nearly
  all of them) pay nothing.
"""

from __future__ import annotations

import re
import signal
import string
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from jinja2 import filters as jfilters
from jinja2 import nodes

from noetl_stream.errors import NoetlError
from noetl_stream.settings import DEFAULT_TEMPLATE_CPU_S

__all__ = [
    "FILTERS",
    "MAX_INT_BITS",
    "MAX_TEMPLATE_ITEMS",
    "TEMPLATE_CPU_S",
    "BudgetExceededError",
    "TemplateTooLargeError",
    "check_binop",
    "check_format",
    "cpu_budget",
    "needs_timer",
    "set_cpu_seconds",
]

MAX_TEMPLATE_ITEMS = 1_000_000
"""The most characters or items one template operation may build."""
MAX_INT_BITS = 65_536
"""The largest integer a template may compute with ``**`` (about 20,000 digits)."""
MAX_FORMAT_WIDTH = 10_000
"""The widest field or precision of a format (``'%10000d'``, ``'{:>10000}'``)."""


TEMPLATE_CPU_S = DEFAULT_TEMPLATE_CPU_S
"""CPU seconds one render may take (default 2): set by the process's edge, the command line or the
runtime, from ``NOETL_TEMPLATE_CPU_S`` (`Settings.template_cpu_s`, `set_cpu_seconds`)."""


def set_cpu_seconds(seconds: float) -> None:
    """Make `seconds` the CPU time one render may take (`TEMPLATE_CPU_S`) in this process."""
    global TEMPLATE_CPU_S
    TEMPLATE_CPU_S = seconds


class BudgetExceededError(BaseException):
    """A render used up its CPU time (raised by the timer's signal, inside the template)."""


class TemplateTooLargeError(NoetlError, ValueError):
    """An operation would build a value past the size bounds."""


# -- size ---------------------------------------------------------------------------------------------
def _too_large(what: str, size: int, limit: int) -> TemplateTooLargeError:
    return TemplateTooLargeError(f"{what} would hold {size:,} items; a template may build at most {limit:,}")


def check_binop(operator: str, left: Any, right: Any) -> None:
    """Raise `TemplateTooLargeError` if ``left <operator> right`` would build a value past the bounds."""
    if operator == "*":
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, (str, bytes, list, tuple)) and isinstance(n, int) and not isinstance(n, bool):
                size = len(seq) * max(n, 0)
                if size > MAX_TEMPLATE_ITEMS:
                    raise _too_large(f"{type(seq).__name__} * {n}", size, MAX_TEMPLATE_ITEMS)
    elif operator == "**":
        if (
            isinstance(left, int)
            and isinstance(right, int)
            and not isinstance(left, bool)
            and abs(left) > 1
            and right > 0
        ):
            bits = left.bit_length() * right
            if bits > MAX_INT_BITS:
                raise TemplateTooLargeError(
                    f"{left} ** {right} would have about {bits:,} bits; a template may compute at most "
                    f"{MAX_INT_BITS:,}"
                )
    elif operator == "%" and isinstance(left, str):
        _check_printf(left)


_PRINTF = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?[diouxXeEfFgGcrsa%]")


def _check_printf(fmt: str) -> None:
    for m in _PRINTF.finditer(fmt):
        for part in m.groups():
            if part == "*":
                raise TemplateTooLargeError(
                    "a '*' width or precision in a format is not allowed in a template"
                )
            if part is not None and int(part) > MAX_FORMAT_WIDTH:
                raise TemplateTooLargeError(
                    f"a format width or precision of {int(part):,}; a template may use at most "
                    f"{MAX_FORMAT_WIDTH:,}"
                )


_WIDTH = re.compile(r"\d+")
_FORMATTER = string.Formatter()


def check_format(fmt: str) -> None:
    """Raise `TemplateTooLargeError` for a ``str.format`` string with a huge (or computed) width."""
    try:
        fields = list(_FORMATTER.parse(fmt))
    except ValueError:
        return  # str.format itself says what is wrong
    for _, _, spec, _ in fields:
        if not spec:
            continue
        if "{" in spec:
            raise TemplateTooLargeError(
                "a computed width in a format ('{:{w}}') is not allowed in a template"
            )
        for digits in _WIDTH.findall(spec):
            if int(digits) > MAX_FORMAT_WIDTH:
                raise TemplateTooLargeError(
                    f"a format width or precision of {int(digits):,}; a template may use at most "
                    f"{MAX_FORMAT_WIDTH:,}"
                )


def _width(value: Any, what: str) -> None:
    if isinstance(value, int) and value > MAX_TEMPLATE_ITEMS:
        raise _too_large(what, value, MAX_TEMPLATE_ITEMS)


def _center(value: Any, width: int = 80) -> str:
    _width(width, f"center({width})")
    return jfilters.do_center(value, width)


def _indent(s: Any, width: int | str = 4, first: bool = False, blank: bool = False) -> str:
    if isinstance(width, str):
        _width(len(width), "indent")
    else:
        _width(width, f"indent({width})")
        lines = str(s).count("\n") + 1
        _width(width * lines, f"indent({width}) of {lines} lines")
    return jfilters.do_indent(s, width, first, blank)


def _replace(eval_ctx: Any, s: Any, old: Any, new: Any, count: int | None = None) -> Any:
    text, o, n = str(s), str(old), str(new)
    if len(n) > len(o):
        times = text.count(o) if o else len(text) + 1
        if count is not None and count >= 0:
            times = min(times, count)
        _width(len(text) + times * (len(n) - len(o)), "replace")
    return jfilters.do_replace(eval_ctx, s, old, new, count)


def _format(value: Any, *args: Any, **kwargs: Any) -> str:
    _check_printf(str(value))
    return jfilters.do_format(value, *args, **kwargs)


def _wordwrap(environment: Any, s: Any, width: int = 79, *args: Any, **kwargs: Any) -> str:
    _width(width, f"wordwrap({width})")
    return jfilters.do_wordwrap(environment, s, width, *args, **kwargs)


_replace.jinja_pass_arg = jfilters.do_replace.jinja_pass_arg  # type: ignore[attr-defined]
_wordwrap.jinja_pass_arg = jfilters.do_wordwrap.jinja_pass_arg  # type: ignore[attr-defined]

FILTERS: dict[str, Callable[..., Any]] = {
    "center": _center,
    "indent": _indent,
    "replace": _replace,
    "format": _format,
    "wordwrap": _wordwrap,
}
"""Jinja's filters that take a size, with the size checked first."""


# -- time ---------------------------------------------------------------------------------------------
_CHEAP_FILTERS = frozenset(
    {
        "abs", "bool", "capitalize", "ceil", "d", "default", "e", "escape", "first", "float", "floor",
        "int", "last", "length", "count", "lower", "upper", "round", "string", "title", "tojson", "trim",
    }
)  # fmt: skip
"""Filters that take time in proportion to their input, with no size argument: no timer."""
_LOOPING = (nodes.For, nodes.Macro, nodes.CallBlock, nodes.FilterBlock, nodes.Call)


def needs_timer(tree: nodes.Node) -> bool:
    """Whether a template can run for long: it loops, defines a macro, calls something or uses a
    filter that is not a cheap one."""
    for node in tree.find_all((*_LOOPING, nodes.Filter)):
        if not isinstance(node, nodes.Filter) or node.name not in _CHEAP_FILTERS:
            return True
    return False


_MAIN = threading.main_thread().ident
_state = {"armed": False, "installed": False}


def _on_timer(signum: int, frame: Any) -> None:
    if _state["armed"]:
        _state["armed"] = False
        raise BudgetExceededError


def _install() -> bool:
    if not _state["installed"]:
        if signal.getsignal(signal.SIGVTALRM) not in (signal.SIG_DFL, None):
            return False  # someone else's timer: leave it alone
        signal.signal(signal.SIGVTALRM, _on_timer)
        _state["installed"] = True
    return True


@contextmanager
def cpu_budget() -> Iterator[None]:
    """Run the body under the CPU-time timer (main thread, not nested; else as is)."""
    if _state["armed"] or threading.get_ident() != _MAIN or not _install():
        yield
        return
    _state["armed"] = True
    signal.setitimer(signal.ITIMER_VIRTUAL, TEMPLATE_CPU_S)
    try:
        yield
    finally:
        _state["armed"] = False  # first: a signal delivered from here on does nothing
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)
