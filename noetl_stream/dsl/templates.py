"""Jinja2 templates: sandboxed, native-valued, compiled once.

* A string that is exactly one expression (``"{{ items }}"``) renders to the
  expression's native value (list, dict, int, bool, ...), not its text.
* Any other template renders to a string; a string without ``{{``/``{%`` is a
  constant and costs nothing.
* Names that do not exist fail loudly (``'foo' is undefined``), but chains such
  as ``outcome.result.data.paging.hasMore | default(false)`` work: attribute and
  item access on an undefined value stays undefined until it is used.
* ``obj.key`` on a mapping reads the key first, so ``{{ fetch.items }}`` is the
  ``items`` field of a result, not ``dict.items``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from jinja2 import ChainableUndefined, TemplateSyntaxError, nodes
from jinja2.exceptions import SecurityError, TemplateError, UndefinedError
from jinja2.runtime import Undefined
from jinja2.sandbox import ImmutableSandboxedEnvironment

from noetl_stream.errors import NoetlError

MAX_RENDER_DEPTH = 64


class TemplateSyntaxProblem(NoetlError):
    """A template does not parse. ``lineno`` is 1-based within the template text."""

    def __init__(self, message: str, lineno: int) -> None:
        super().__init__(message)
        self.message = message
        self.lineno = lineno


class RenderError(NoetlError):
    """A template failed while rendering (undefined name, type error, sandbox violation)."""

    def __init__(self, message: str, where: str = "") -> None:
        super().__init__(f"{where}: {message}" if where else message)
        self.message = message
        self.where = where


class StrictChainableUndefined(ChainableUndefined):
    """Chainable on access, strict on use: rendering, iterating or testing truth fails."""

    __slots__ = ()

    __str__ = Undefined._fail_with_undefined_error
    __iter__ = Undefined._fail_with_undefined_error
    __len__ = Undefined._fail_with_undefined_error
    __bool__ = Undefined._fail_with_undefined_error
    __contains__ = Undefined._fail_with_undefined_error
    __html__ = Undefined._fail_with_undefined_error


class Environment(ImmutableSandboxedEnvironment):
    """The sandbox every template of a playbook runs in."""

    def __init__(self) -> None:
        super().__init__(
            undefined=StrictChainableUndefined,
            autoescape=False,
            keep_trailing_newline=True,
            extensions=["jinja2.ext.do", "jinja2.ext.loopcontrols"],
        )
        self.filters.update(_FILTERS)

    def getattr(self, obj: Any, attribute: str) -> Any:
        if isinstance(obj, Mapping):
            try:
                return obj[attribute]
            except (KeyError, TypeError):
                pass
        return super().getattr(obj, attribute)


def _to_int(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


_FILTERS: dict[str, Callable[..., Any]] = {
    "ceil": lambda v: math.ceil(float(v)),
    "floor": lambda v: math.floor(float(v)),
}

ENV = Environment()


def has_template(text: str) -> bool:
    return "{{" in text or "{%" in text


class Compiled:
    """A compiled template: ``render(scope)`` returns its value."""

    __slots__ = ("_expr", "_tmpl", "native", "source")

    def __init__(self, source: str) -> None:
        self.source = source
        self._expr: Any = None
        self._tmpl: Any = None
        inner = _single_expression(source)
        self.native = inner is not None
        try:
            if inner is not None:
                self._expr = ENV.compile_expression(inner, undefined_to_none=False)
            else:
                self._tmpl = ENV.from_string(source)
        except TemplateSyntaxError as exc:
            raise TemplateSyntaxProblem(exc.message or "syntax error", exc.lineno or 1) from None

    def render(self, scope: Mapping[str, Any]) -> Any:
        if self._expr is not None:
            value = self._expr(scope)
            if isinstance(value, Undefined):
                value._fail_with_undefined_error()
            return value
        return self._tmpl.render(scope)


def _single_expression(source: str) -> str | None:
    """If ``source`` is ``{{ expr }}`` and nothing else, return ``expr``."""
    text = source.strip()
    if not (text.startswith("{{") and text.endswith("}}")):
        return None
    try:
        tokens = list(ENV.lex(text))
    except TemplateSyntaxError:
        return None
    kinds = [t[1] for t in tokens if t[1] != "whitespace"]
    if not kinds or kinds[0] != "variable_begin" or kinds[-1] != "variable_end":
        return None
    if kinds.count("variable_begin") != 1 or "block_begin" in kinds or "data" in kinds:
        return None
    return text[2:-2].strip().removeprefix("-").removesuffix("-").strip()


@functools.lru_cache(maxsize=8192)
def compile_template(source: str) -> Compiled:
    """Compile (and cache) a template string. Raises ``TemplateSyntaxProblem``."""
    return Compiled(source)


class TemplateInfo(NamedTuple):
    """What the static checks need from a template: its syntax problem, or the names it reads."""

    problem: TemplateSyntaxProblem | None
    names: frozenset[str]


@functools.lru_cache(maxsize=8192)
def analyze(source: str) -> TemplateInfo:
    """Parse (not compile) a template once: syntax, unknown filters/tests, the top-level names read.

    Parsing is a fraction of Jinja's compile-to-Python cost, so the compiler checks every template
    of a playbook this way and leaves compiling to the first render.
    """
    try:
        ast = ENV.parse(source)
    except TemplateSyntaxError as exc:
        return TemplateInfo(
            TemplateSyntaxProblem(exc.message or "syntax error", exc.lineno or 1), frozenset()
        )
    loads: set[str] = set()
    stores: set[str] = set()
    for node in ast.find_all((nodes.Name, nodes.Filter, nodes.Test, nodes.For)):
        if isinstance(node, nodes.Name):
            (loads if node.ctx == "load" else stores).add(node.name)
        elif isinstance(node, nodes.For):
            stores.add("loop")
        elif isinstance(node, (nodes.Filter, nodes.Test)):
            filter_ = isinstance(node, nodes.Filter)
            if node.name not in (ENV.filters if filter_ else ENV.tests):
                what = "filter" if filter_ else "test"
                problem = TemplateSyntaxProblem(f"no {what} named '{node.name}'", node.lineno)
                return TemplateInfo(problem, frozenset())
    return TemplateInfo(None, frozenset(loads - stores))


def check_syntax(source: str) -> TemplateSyntaxProblem | None:
    return analyze(source).problem


def undeclared_names(source: str) -> frozenset[str]:
    """Top-level names a template reads (for static checks); empty when it does not parse."""
    return analyze(source).names


def render_value(value: Any, scope: Mapping[str, Any], where: str = "", _depth: int = 0) -> Any:
    """Render every template inside ``value`` (strings, lists, dicts) against ``scope``."""
    if isinstance(value, str):
        if not has_template(value):
            return value
        try:
            return compile_template(value).render(scope)
        except TemplateSyntaxProblem as exc:
            raise RenderError(f"template syntax error: {exc.message}", where) from None
        except UndefinedError as exc:
            raise RenderError(str(exc.message or "undefined value"), where) from None
        except SecurityError as exc:
            raise RenderError(f"not allowed in a template: {exc}", where) from None
        except TemplateError as exc:
            raise RenderError(str(exc), where) from None
        except (TypeError, ValueError, ArithmeticError, LookupError, AttributeError) as exc:
            raise RenderError(f"{type(exc).__name__}: {exc}", where) from None
        except RecursionError:
            raise RenderError("template recursion too deep", where) from None
    if _depth > MAX_RENDER_DEPTH:
        raise RenderError("value nested too deeply", where)
    if isinstance(value, dict):
        return {
            k: render_value(v, scope, f"{where}.{k}" if where else str(k), _depth + 1)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [render_value(v, scope, f"{where}[{i}]", _depth + 1) for i, v in enumerate(value)]
    return value


_FALSE_STRINGS = frozenset({"", "false", "0", "no", "none", "null", "off"})


def truthy(value: Any) -> bool:
    """Truth of a rendered ``when``: strings like ``"False"`` count as false."""
    if isinstance(value, str):
        return value.strip().lower() not in _FALSE_STRINGS
    if isinstance(value, Undefined):
        return False
    return bool(value)


def evaluate_when(when: Any, scope: Mapping[str, Any], where: str = "") -> bool:
    """Evaluate a ``when`` condition; ``None`` (omitted) is true."""
    if when is None:
        return True
    return truthy(render_value(when, scope, where))
