"""Jinja2 templates: sandboxed, native-valued, compiled once.

* A string that is exactly one expression (``"{{ items }}"``) renders to the
  expression's native value (list, dict, int, bool, ...), not its text.
* Any other template renders to a string; a string without ``{{``/``{%`` is a
  constant and costs nothing.
* Names that do not exist fail loudly (``'foo' is undefined``, ``no key 'x' in the mapping``), but chains such
  as ``outcome.result.data.paging.hasMore | default(false)`` work: attribute and
  item access on an undefined value stays undefined until it is used.
* ``obj.key`` on a mapping reads the key first, so ``{{ fetch.items }}`` is the
  ``items`` field of a result, not ``dict.items``; a missing key named like a method is undefined
  unless called (`MissingKey`).
* A native value is JSON (it travels in events and commands): a ``str`` subclass becomes a ``str``,
  a tuple, set, ``range`` or generator a list; a value without a JSON form (a function, an object)
  fails the render, naming its type. Only a value the expression computed is walked: a read of the
  scope (``{{ fetch.rows }}``, ``{{ x | default([]) }}``) is JSON already. A view of a step result
  (`noetl_stream.dsl.views`) renders as its plain value.
* Where a rendered value becomes a tool's input (``render_value(..., json_text=True)``), a single
  expression whose value is text that looks like a JSON object or array (``'{"dpi": 203}'``) is that
  object, as NoETL's engines read it.
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
from jinja2.utils import missing
from msgspec import DecodeError
from msgspec.json import decode as json_decode

from noetl_stream.dsl import budget
from noetl_stream.dsl.budget import (
    FILTERS as SIZED_FILTERS,
)
from noetl_stream.dsl.budget import (
    BudgetExceededError,
    TemplateTooLargeError,
    check_binop,
    check_format,
    cpu_budget,
    needs_timer,
)
from noetl_stream.dsl.views import VIEWS, plain
from noetl_stream.errors import NoetlError
from noetl_stream.protocol.jsonvalue import PLAIN_TYPES, NotJSONError, to_json

MAX_RENDER_DEPTH = 64


class TemplateSyntaxProblemError(NoetlError):
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
    """Chainable on access, strict on use: rendering, iterating or testing truth fails, saying what was
    undefined in our words (`undefined_message`), not Jinja's."""

    __slots__ = ()

    @property
    def _undefined_message(self) -> str:
        return undefined_message(self._undefined_name, self._undefined_obj, self._undefined_hint)

    __str__ = Undefined._fail_with_undefined_error
    __iter__ = Undefined._fail_with_undefined_error
    __len__ = Undefined._fail_with_undefined_error
    __bool__ = Undefined._fail_with_undefined_error
    __contains__ = Undefined._fail_with_undefined_error
    __html__ = Undefined._fail_with_undefined_error


def undefined_message(name: Any, obj: Any = missing, hint: str | None = None) -> str:
    """What a template read that is not there: a name no scope defines, a key a mapping lacks, an item
    past a list's end, an attribute a value does not have."""
    if hint:
        return hint
    if obj is missing:
        return f"{name!r} is undefined"
    if isinstance(obj, Mapping):
        return f"no key {name!r} in the mapping"
    if isinstance(obj, (list, tuple)) and isinstance(name, int):
        return f"no item {name} in the list of {len(obj)}"
    what = "attribute" if isinstance(name, str) else "item"
    return f"a value of type '{type(obj).__name__}' has no {what} {name!r}"


class Environment(ImmutableSandboxedEnvironment):
    """The sandbox every template of a playbook runs in, with bounds on what one operation may build
    (`noetl_stream.dsl.budget`)."""

    intercepted_binops = frozenset({"*", "**", "%"})  # checked for size (and not folded at compile time)

    def __init__(self) -> None:
        super().__init__(
            undefined=StrictChainableUndefined,
            autoescape=False,
            keep_trailing_newline=True,
            extensions=["jinja2.ext.do", "jinja2.ext.loopcontrols"],
        )
        self.filters.update(_FILTERS)
        self.filters.update(SIZED_FILTERS)
        self.policies["json.dumps_kwargs"] = {"sort_keys": True, "default": _json_default}

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        check_binop(operator, left, right)
        return super().call_binop(context, operator, left, right)

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapped = super().wrap_str_format(value)
        if wrapped is not None and value.__name__ == "format":
            check_format(value.__self__)
        return wrapped

    def getattr(self, obj: Any, attribute: str) -> Any:
        if isinstance(obj, Mapping):
            try:
                return obj[attribute]
            except (KeyError, TypeError):
                pass
            value = super().getattr(obj, attribute)
            if callable(value) and not isinstance(value, Undefined):
                return MissingKey(value, obj, attribute)
            return value
        return super().getattr(obj, attribute)


class MissingKey(StrictChainableUndefined):
    """A key a mapping lacks that is the name of one of its methods (``ctx.items``, ``page.keys``):
    undefined for every use (``| default([])`` applies, ``| length`` fails) except a call, which calls
    the method (``ctx.items()``). A plain attribute lookup gave the bound method, so
    ``(ctx.items | default([])) | length`` failed with "builtin_function_or_method has no len()"."""

    __slots__ = ("_method",)
    unsafe_callable = False  # (what the sandbox asks a callable before calling it)
    alters_data = False
    jinja_pass_arg = None

    def __init__(self, method: Callable[..., Any], obj: Any, name: str) -> None:
        super().__init__(hint=f"no key '{name}' (a mapping's {name}() method is called with parentheses)")
        self._method = method

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._method(*args, **kwargs)


def _json_default(value: Any) -> Any:
    """``tojson`` of a value ``json`` cannot write: its JSON form (a view: its plain value)."""
    return to_json(value)


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

    __slots__ = ("_expr", "_parts", "_path", "_reads", "_tmpl", "guarded", "native", "source")

    def __init__(self, source: str) -> None:
        self.source = source
        self._expr: Any = None
        self._tmpl: Any = None
        self._reads = False
        """The expression only reads the scope (its containers are JSON already: not walked)."""
        self._path: _Path | None = None
        """The expression is a name and keys (``iter.n``, ``workload.rows[0]``): looked up directly."""
        self._parts: tuple[str | _Path, ...] | None = None
        """The template is text and such paths (``item-{{ iter.i }}``): put together directly."""
        inner = _single_expression(source)
        self.native = inner is not None
        try:
            if inner is not None:
                self._expr = ENV.compile_expression(inner, undefined_to_none=False)
                self._reads = _reads_only(inner)
                tree = ENV.parse(f"{{{{ {inner} }}}}")
                self._path = _path_of(tree)
            else:
                self._tmpl = ENV.from_string(source)
                tree = ENV.parse(source)
                self._parts = _parts_of(tree)
        except TemplateSyntaxError as exc:
            raise TemplateSyntaxProblemError(exc.message or "syntax error", exc.lineno or 1) from None
        self.guarded = needs_timer(tree)
        """It can loop or call: it renders under the CPU-time budget (`cpu_budget`)."""

    def render(self, scope: Mapping[str, Any]) -> Any:
        """The value; raises ``NotJSONError`` for a native value without a JSON form."""
        if self.guarded:
            with cpu_budget():
                return self._render(scope)
        return self._render(scope)

    def _render(self, scope: Mapping[str, Any]) -> Any:
        if self._expr is not None:
            path = self._path
            value = _MISSING if path is None else _walk(scope, path)
            if value is _MISSING:
                value = self._expr(scope)
            t = type(value)
            if t in PLAIN_TYPES or (self._reads and (t is dict or t is list)):
                return value
            if self._reads and isinstance(value, VIEWS):
                return plain(value)  # (a read of the scope: JSON already)
            if isinstance(value, Undefined):
                value._fail_with_undefined_error()
            return to_json(value)
        parts = self._parts
        if parts is not None:
            text = _joined(scope, parts)
            if text is not None:
                return text
        return self._tmpl.render(scope)


_Path = tuple[str, tuple[tuple[bool, Any], ...]]
"""A name, then each key with whether it is an attribute (``.key``) or an item (``[key]``)."""
_MISSING: Any = object()


def _path_of(tree: nodes.Template) -> _Path | None:
    """The path of a ``{{ name.key[0]['other'] }}`` template, if it is one."""
    body = tree.body
    if len(body) != 1 or not isinstance(body[0], nodes.Output) or len(body[0].nodes) != 1:
        return None
    return _node_path(body[0].nodes[0])


def _parts_of(tree: nodes.Template) -> tuple[str | _Path, ...] | None:
    """The text and paths of a template made of nothing else (``{{ base }}/items/{{ iter.id }}``)."""
    body = tree.body
    if len(body) != 1 or not isinstance(body[0], nodes.Output):
        return None
    parts: list[str | _Path] = []
    for node in body[0].nodes:
        if isinstance(node, nodes.TemplateData):
            parts.append(node.data)
        elif (path := _node_path(node)) is not None:
            parts.append(path)
        else:
            return None
    return tuple(parts)


def _joined(scope: Mapping[str, Any], parts: tuple[str | _Path, ...]) -> str | None:
    """The template's text when every path in it is a plain value (a string, a number, a boolean, null:
    written as the engine writes them, ``str``); None otherwise (the engine renders it)."""
    out: list[str] = []
    for part in parts:
        if type(part) is str:
            out.append(part)
            continue
        value = _walk(scope, part)  # type: ignore[arg-type]
        if type(value) not in PLAIN_TYPES:  # (_MISSING too)
            return None
        out.append(value if type(value) is str else str(value))
    return "".join(out)


def _node_path(node: nodes.Node) -> _Path | None:
    steps: list[tuple[bool, Any]] = []
    while True:
        if isinstance(node, nodes.Getattr):
            steps.append((True, node.attr))
            node = node.node
        elif isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const):
            if type(node.arg.value) not in (str, int):
                return None
            steps.append((False, node.arg.value))
            node = node.node
        elif isinstance(node, nodes.Name) and node.ctx == "load":
            return node.name, tuple(reversed(steps))
        else:
            return None


def _walk(scope: Mapping[str, Any], path: _Path) -> Any:
    """The value at `path`, looked up as the sandbox would find it when it finds it at once (a name of
    the scope; a mapping's key, for an attribute; an item); `_MISSING` otherwise, and the template
    renders it (an undefined name, a method, an object's attribute: the sandbox's rules and errors)."""
    name, steps = path
    try:
        value = scope[name]
    except KeyError:
        return _MISSING
    for attribute, key in steps:
        if attribute and not isinstance(value, Mapping):
            return _MISSING
        try:
            value = value[key]
        except (TypeError, LookupError):
            return _MISSING
    return value


_READ_FILTERS = frozenset({"default", "d"})


def _reads_only(inner: str) -> bool:
    """Whether expression ``inner`` only reads the scope and literals (its value needs no walk)."""
    try:
        body = ENV.parse(f"{{{{ {inner} }}}}").body
    except TemplateSyntaxError:
        return False
    if len(body) != 1 or not isinstance(body[0], nodes.Output) or len(body[0].nodes) != 1:
        return False
    return _read(body[0].nodes[0])


def _read(node: nodes.Node) -> bool:
    if isinstance(node, nodes.Name):
        return node.name not in ENV.globals  # range, dict, cycler, ... are not scope values
    if isinstance(node, nodes.Const):
        return type(node.value) in PLAIN_TYPES
    if isinstance(node, nodes.Getattr):
        return _read(node.node)
    if isinstance(node, nodes.Getitem):
        return _read(node.node) and _read(node.arg)
    if isinstance(node, nodes.List):
        return all(_read(i) for i in node.items)
    if isinstance(node, nodes.Dict):
        return all(
            isinstance(p.key, nodes.Const) and type(p.key.value) is str and _read(p.value) for p in node.items
        )
    if isinstance(node, (nodes.And, nodes.Or)):
        return _read(node.left) and _read(node.right)
    if isinstance(node, nodes.CondExpr):
        return _read(node.test) and _read(node.expr1) and node.expr2 is not None and _read(node.expr2)
    if isinstance(node, nodes.Filter):
        return (
            node.name in _READ_FILTERS
            and node.node is not None
            and _read(node.node)
            and all(_read(a) for a in node.args)
            and not node.kwargs
            and node.dyn_args is None
            and node.dyn_kwargs is None
        )
    return False


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
    """Compile (and cache) a template string. Raises ``TemplateSyntaxProblemError``."""
    return Compiled(source)


class TemplateInfo(NamedTuple):
    """What the static checks need from a template: its syntax problem, or the names it reads."""

    problem: TemplateSyntaxProblemError | None
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
            TemplateSyntaxProblemError(exc.message or "syntax error", exc.lineno or 1), frozenset()
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
                problem = TemplateSyntaxProblemError(f"no {what} named '{node.name}'", node.lineno)
                return TemplateInfo(problem, frozenset())
    return TemplateInfo(None, frozenset(loads - stores))


@functools.lru_cache(maxsize=8192)
def attribute_reads(source: str) -> frozenset[tuple[str, str]]:
    """``(name, key)`` for each ``name.key`` or ``name['key']`` a template reads of a top-level name
    (``ctx.page``, ``iter._index``, ``loop.first``); empty when it does not parse. A name a ``{% for %}``
    or ``{% set %}`` of the template binds is not read from the scope (a for's ``loop`` included)."""
    try:
        ast = ENV.parse(source)
    except TemplateSyntaxError:
        return frozenset()
    stored = {n.name for n in ast.find_all(nodes.Name) if n.ctx != "load"}
    if any(True for _ in ast.find_all(nodes.For)):
        stored.add("loop")
    out: set[tuple[str, str]] = set()
    for node in ast.find_all((nodes.Getattr, nodes.Getitem)):
        assert isinstance(node, (nodes.Getattr, nodes.Getitem))
        target = node.node
        if not isinstance(target, nodes.Name) or target.ctx != "load" or target.name in stored:
            continue
        if isinstance(node, nodes.Getattr):
            out.add((target.name, node.attr))
        elif isinstance(node.arg, nodes.Const) and isinstance(node.arg.value, str):
            out.add((target.name, node.arg.value))
    return frozenset(out)


def check_syntax(source: str) -> TemplateSyntaxProblemError | None:
    return analyze(source).problem


def undeclared_names(source: str) -> frozenset[str]:
    """Top-level names a template reads (for static checks); empty when it does not parse."""
    return analyze(source).names


def json_text(value: Any) -> Any:
    """Text that looks like a JSON object or array (``'{"a": 1}'``, ``' [1, 2] '``) as that object; any
    other value as it is."""
    if type(value) is not str:
        return value
    text = value.strip()
    if len(text) < 2 or (text[0], text[-1]) not in (("{", "}"), ("[", "]")):
        return value
    try:
        return json_decode(text)
    except DecodeError:
        return value


def json_inputs(source: Any, rendered: Any) -> Any:
    """`rendered`, what `source` rendered to, with the JSON-looking text each single expression of
    `source` gave parsed (`json_text`): ``render_value(..., as_input=True)`` for a value rendered
    already. Walks `source` and `rendered` side by side; a key or item only one of them has is kept."""
    if isinstance(source, str):
        if type(rendered) is str and has_template(source) and compile_template(source).native:
            return json_text(rendered)
        return rendered
    if isinstance(source, dict) and type(rendered) is dict:
        out: dict[Any, Any] | None = None
        for k, v in rendered.items():
            if k in source:
                new = json_inputs(source[k], v)
                if new is not v:
                    out = dict(rendered) if out is None else out
                    out[k] = new
        return rendered if out is None else out
    if isinstance(source, list) and type(rendered) is list and len(source) == len(rendered):
        items = [json_inputs(s, v) for s, v in zip(source, rendered, strict=True)]
        return rendered if all(a is b for a, b in zip(items, rendered, strict=True)) else items
    return rendered


def render_value(
    value: Any, scope: Mapping[str, Any], where: str = "", _depth: int = 0, *, as_input: bool = False
) -> Any:
    """Render every template inside ``value`` (strings, lists, dicts) against ``scope``. `as_input`:
    the value becomes a tool's input (a task's config, a step's ``input``, a loop's ``in``, an arc's
    ``args``): a single expression that renders to JSON-looking text gives the object (`json_text`)."""
    if isinstance(value, str):
        if not has_template(value):
            return value
        try:
            compiled = compile_template(value)
            out = compiled.render(scope)
            return json_text(out) if as_input and compiled.native else out
        except TemplateSyntaxProblemError as exc:
            raise RenderError(f"template syntax error: {exc.message}", where) from None
        except UndefinedError as exc:
            raise RenderError(str(exc.message or "undefined value"), where) from None
        except SecurityError as exc:
            raise RenderError(f"not allowed in a template: {exc}", where) from None
        except NotJSONError as exc:
            raise RenderError(
                f"{exc} (a template's value is passed on as JSON: a string, number, boolean, null, "
                "list or mapping)",
                where,
            ) from None
        except TemplateError as exc:
            raise RenderError(str(exc), where) from None
        except TemplateTooLargeError as exc:
            raise RenderError(f"value too large for a template: {exc}", where) from None
        except BudgetExceededError:
            raise RenderError(
                f"template ran out of its {budget.TEMPLATE_CPU_S:g} s of CPU time (a loop, or a value too large "
                "for a template; compute it in a task)",
                where,
            ) from None
        except MemoryError:
            raise RenderError("template needs more memory than there is (a value too large)", where) from None
        except RecursionError:
            raise RenderError("template recursion too deep", where) from None
        except NameError as exc:  # Jinja folds an overflowing constant (1e308 + 1e308) into the name 'inf'
            raise RenderError(f"a number out of range or an unknown name ({exc})", where) from None
        except (TypeError, ValueError, ArithmeticError, LookupError, AttributeError) as exc:
            raise RenderError(f"{type(exc).__name__}: {exc}", where) from None
    if _depth > MAX_RENDER_DEPTH:
        raise RenderError("value nested too deeply", where)
    if isinstance(value, dict):
        return {
            k: render_value(v, scope, f"{where}.{k}" if where else str(k), _depth + 1, as_input=as_input)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [
            render_value(v, scope, f"{where}[{i}]", _depth + 1, as_input=as_input)
            for i, v in enumerate(value)
        ]
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
