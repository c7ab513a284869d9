"""Rewriting legacy templates at the token level, keeping the author's spelling everywhere else.

Legacy conditions read names the canonical scopes do not have (``response``, ``error``, ``vars.x``,
a loop iterator as a bare name). The rewrites here rename those references and nothing else: a
name is a reference when the template reads it at top level (``undeclared_names``) and the token
is not an attribute (``a.name``), a filter or test name, or a keyword argument.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from jinja2 import TemplateSyntaxError

from noetl_stream.dsl.templates import ENV, _single_expression, check_syntax, has_template, undeclared_names
from noetl_stream.errors import NoetlError
from noetl_stream.protocol.events import LEGACY_ALIASES

_CODE_OPEN = frozenset({"variable_begin", "block_begin"})
_CODE_CLOSE = frozenset({"variable_end", "block_end"})
_SKIP = frozenset({"whitespace", "raw"})


class Tok(NamedTuple):
    kind: str
    value: str
    code: bool


def tokenize(source: str) -> list[Tok] | None:
    """The template's tokens, gaps included, so that joining them gives ``source`` back."""
    try:
        raw = list(ENV.lexer.tokeniter(source, None))
    except TemplateSyntaxError:
        return None
    out: list[Tok] = []
    cursor = 0
    code = False
    for _, kind, value in raw:
        at = source.find(value, cursor)
        if at < 0:
            return None
        if at > cursor:
            out.append(Tok("raw", source[cursor:at], code))
        if kind in _CODE_CLOSE:
            code = False
        out.append(Tok(kind, value, code))
        if kind in _CODE_OPEN:
            code = True
        cursor = at + len(value)
    if cursor < len(source):
        out.append(Tok("raw", source[cursor:], False))
    return out


def join(tokens: list[Tok]) -> str:
    return "".join(t.value for t in tokens)


def _sig(tokens: list[Tok], i: int, step: int) -> int:
    """Index of the nearest significant token from ``i`` in direction ``step`` (-1 when none)."""
    i += step
    while 0 <= i < len(tokens) and tokens[i].kind in _SKIP:
        i += step
    return i if 0 <= i < len(tokens) else -1


def _is(tokens: list[Tok], i: int, kind: str, value: str | None = None) -> bool:
    return 0 <= i < len(tokens) and tokens[i].kind == kind and (value is None or tokens[i].value == value)


Replacement = Callable[[str], str]


class Rewrite:
    """What to rename. ``names``: a top-level name -> expression; ``attrs``: ``(name, attr)`` ->
    expression (``error.status``); ``defined``: a name -> the expression that ``name is defined`` means."""

    def __init__(
        self,
        names: Mapping[str, str] | None = None,
        attrs: Mapping[tuple[str, str], str] | None = None,
        defined: Mapping[str, str] | None = None,
    ) -> None:
        self.names = dict(names or {})
        self.attrs = dict(attrs or {})
        self.defined = dict(defined or {})

    def touches(self) -> frozenset[str]:
        return frozenset(self.names) | {n for n, _ in self.attrs} | frozenset(self.defined)

    def merged(self, other: Rewrite) -> Rewrite:
        return Rewrite(
            {**self.names, **other.names}, {**self.attrs, **other.attrs}, {**self.defined, **other.defined}
        )


def _wrap(expr: str) -> str:
    simple = expr.replace(".", "").replace("_", "")
    if simple.isalnum() or _parenthesized(expr):
        return expr
    return f"({expr})"


def _parenthesized(expr: str) -> bool:
    if not (expr.startswith("(") and expr.endswith(")")):
        return False
    depth = 0
    for n, ch in enumerate(expr):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0 and n != len(expr) - 1:
            return False
    return depth == 0


def rewrite_text(source: str, rw: Rewrite) -> str:
    """``source`` with the references ``rw`` names rewritten (unchanged when there is none)."""
    if not has_template(source):
        return source
    reads = undeclared_names(source) & rw.touches()
    if not reads:
        return source
    tokens = tokenize(source)
    if tokens is None:
        return source
    out: list[Tok] = []
    i = 0
    while i < len(tokens):
        t = tokens[i]
        if not (t.code and t.kind == "name" and t.value in reads and _is_reference(tokens, i)):
            out.append(t)
            i += 1
            continue
        nxt = _sig(tokens, i, 1)
        # `name is [not] defined`
        if t.value in rw.defined and _is(tokens, nxt, "name", "is"):
            j = _sig(tokens, nxt, 1)
            negate = _is(tokens, j, "name", "not")
            if negate:
                j = _sig(tokens, j, 1)
            if _is(tokens, j, "name", "defined") or _is(tokens, j, "name", "undefined"):
                if tokens[j].value == "undefined":
                    negate = not negate
                expr = rw.defined[t.value]
                out.append(Tok("name", f"(not {_wrap(expr)})" if negate else _wrap(expr), True))
                i = j + 1
                continue
        # `name.attr`
        if _is(tokens, nxt, "operator", "."):
            a = _sig(tokens, nxt, 1)
            if _is(tokens, a, "name") and (t.value, tokens[a].value) in rw.attrs:
                out.append(Tok("name", _wrap(rw.attrs[(t.value, tokens[a].value)]), True))
                i = a + 1
                continue
        if t.value in rw.names:
            out.append(Tok("name", _wrap(rw.names[t.value]), True))
        else:
            out.append(t)
        i += 1
    return join(out)


class UntranslatableError(NoetlError):
    """A reference a chain rewrite has no canonical expression for (the message says why)."""


ChainRewrite = Callable[[tuple[str, ...], Callable[[int], bool]], tuple[str, int]]
"""``(attrs, compared) -> (expression, n)``: the expression that replaces a name and the first ``n``
attributes of the chain after it; ``compared(n)`` says whether the chain cut there is compared as it
stands (``==``, ``!=``, ``in``, ``not in``)."""

_COMPARISONS = frozenset({"==", "!="})


def rewrite_chains(source: str, name: str, rewrite: ChainRewrite) -> str:
    """Every reference to ``name`` in ``source`` with the attributes read after it (``name.a.b``)
    replaced as `rewrite` says; `rewrite` raises `UntranslatableError` for one it cannot spell."""
    if not has_template(source) or name not in undeclared_names(source):
        return source
    tokens = tokenize(source)
    if tokens is None:
        return source
    out: list[Tok] = []
    i = 0
    while i < len(tokens):
        t = tokens[i]
        if not (t.code and t.kind == "name" and t.value == name and _is_reference(tokens, i)):
            out.append(t)
            i += 1
            continue
        attrs: list[str] = []
        ends = [i]
        j = i
        while _is(tokens, d := _sig(tokens, j, 1), "operator", ".") and _is(
            tokens, a := _sig(tokens, d, 1), "name"
        ):
            attrs.append(tokens[a].value)
            ends.append(a)
            j = a

        def compared(n: int, start: int = i, ends: list[int] = ends) -> bool:
            nxt = _sig(tokens, ends[n], 1)
            if nxt >= 0 and tokens[nxt].kind == "operator" and tokens[nxt].value in _COMPARISONS:
                return True
            if _is(tokens, nxt, "name", "in") or (
                _is(tokens, nxt, "name", "not") and _is(tokens, _sig(tokens, nxt, 1), "name", "in")
            ):
                return True
            prev = _sig(tokens, start, -1)
            follows = nxt >= 0 and (
                (tokens[nxt].kind == "operator" and tokens[nxt].value in (".", "[", "(", "|"))
                or _is(tokens, nxt, "name", "is")
            )
            return (
                prev >= 0
                and tokens[prev].kind == "operator"
                and tokens[prev].value in _COMPARISONS
                and not follows
            )

        expr, n = rewrite(tuple(attrs), compared)
        alone = _is(tokens, _sig(tokens, i, -1), "variable_begin") and _is(
            tokens, _sig(tokens, ends[n], 1), "variable_end"
        )  # the whole of its {{ }}: no parentheses needed
        out.append(Tok("name", expr if alone else _wrap(expr), True))
        i = ends[n] + 1
    return join(out)


def _is_reference(tokens: list[Tok], i: int) -> bool:
    prev = _sig(tokens, i, -1)
    if _is(tokens, prev, "operator", ".") or _is(tokens, prev, "operator", "|"):
        return False
    if _is(tokens, prev, "name", "is"):
        return False
    if _is(tokens, prev, "name", "not") and _is(tokens, _sig(tokens, prev, -1), "name", "is"):
        return False
    nxt = _sig(tokens, i, 1)
    return not _is(tokens, nxt, "operator", "=")


def rewrite_value(value: Any, rw: Rewrite) -> Any:
    """Rewrite every template string inside ``value`` (in place for containers; returns the value)."""
    if isinstance(value, str):
        return rewrite_text(value, rw)
    if isinstance(value, dict):
        for k in list(value):
            value[k] = rewrite_value(value[k], rw)
    elif isinstance(value, list):
        for idx, v in enumerate(value):
            value[idx] = rewrite_value(v, rw)
    return value


def reads(value: Any) -> frozenset[str]:
    """Top-level names read by the templates inside ``value``."""
    if isinstance(value, str):
        return undeclared_names(value) if has_template(value) else frozenset()
    names: set[str] = set()
    if isinstance(value, dict):
        for v in value.values():
            names |= reads(v)
    elif isinstance(value, list):
        for v in value:
            names |= reads(v)
    return frozenset(names)


def reads_attr(value: Any, name: str, attr: str) -> bool:
    """Whether a template inside ``value`` reads ``name.attr``."""
    if isinstance(value, dict):
        return any(reads_attr(v, name, attr) for v in value.values())
    if isinstance(value, list):
        return any(reads_attr(v, name, attr) for v in value)
    if not isinstance(value, str) or name not in reads(value):
        return False
    tokens = tokenize(value) or []
    for i, t in enumerate(tokens):
        if t.code and t.kind == "name" and t.value == name and _is_reference(tokens, i):
            d = _sig(tokens, i, 1)
            a = _sig(tokens, d, 1)
            if _is(tokens, d, "operator", ".") and _is(tokens, a, "name", attr):
                return True
    return False


# -- outcome.status == 'success' -------------------------------------------------------------------


def success_to_ok(source: str) -> str:
    """``outcome.status == 'success'`` (or ``!=``, ``in [...]``) -> ``'ok'`` (002 spelled it 'success')."""
    if "success" not in source or "outcome" not in source or not has_template(source):
        return source
    tokens = tokenize(source)
    if tokens is None:
        return source
    out = list(tokens)
    for j in _status_compared(tokens, "outcome"):
        _swap_success(out, j)
    return join(out)


def status_literals(source: str, subject: str) -> list[str]:
    """The strings a template compares ``<subject>.status`` with (``==``, ``!=``, ``in [...]``)."""
    return [name for _, names in compared_literals(source, subject, "status") for name in names]


def compared_literals(source: str, subject: str, attr: str) -> list[tuple[str, tuple[str, ...]]]:
    """Each comparison of ``<subject>.<attr>`` with string literals in a template: its operator (``==``,
    ``!=``, ``in``, ``not in``) and the literals (one, or the items of the list or tuple after ``in``)."""
    if subject not in source or attr not in source or not has_template(source):
        return []
    tokens = tokenize(source)
    if tokens is None:
        return []
    out: list[tuple[str, tuple[str, ...]]] = []
    for op, found in _compared(tokens, subject, attr):
        names = tuple(tokens[j].value[1:-1] for j in found if tokens[j].kind == "string")
        if names:
            out.append((op, names))
    return out


def _status_compared(tokens: list[Tok], subject: str) -> list[int]:
    return [j for _, found in _compared(tokens, subject, "status") for j in found]


def _compared(tokens: list[Tok], subject: str, attr: str) -> list[tuple[str, list[int]]]:
    """Each comparison of ``<subject>.<attr>`` (or ``<subject>['<attr>']``): the operator and the indices
    of the tokens it is compared with: the other side of ``==``/``!=``, every token of the list or tuple
    after ``in``/``not in``."""
    found: list[tuple[str, list[int]]] = []
    for i, t in enumerate(tokens):
        if not (t.code and t.kind == "name" and t.value == subject):
            continue
        d = _sig(tokens, i, 1)
        s = _sig(tokens, d, 1)
        if _is(tokens, d, "operator", "[") and 0 <= s < len(tokens) and tokens[s].kind == "string":
            if tokens[s].value[1:-1] != attr or not _is(tokens, s := _sig(tokens, s, 1), "operator", "]"):
                continue
        elif not (_is(tokens, d, "operator", ".") and _is(tokens, s, "name", attr)):
            continue
        op = _sig(tokens, s, 1)
        if _is(tokens, op, "operator", "==") or _is(tokens, op, "operator", "!="):
            found.append((tokens[op].value, [_sig(tokens, op, 1)]))
        elif _is(tokens, op, "name", "in") or (
            _is(tokens, op, "name", "not") and _is(tokens, _sig(tokens, op, 1), "name", "in")
        ):
            j = _sig(tokens, op, 1) if tokens[op].value == "in" else _sig(tokens, _sig(tokens, op, 1), 1)
            items: list[int] = []
            if _is(tokens, j, "operator", "[") or _is(tokens, j, "operator", "("):
                depth = 0
                while j < len(tokens):
                    if tokens[j].kind == "operator" and tokens[j].value in "([":
                        depth += 1
                    elif tokens[j].kind == "operator" and tokens[j].value in ")]":
                        depth -= 1
                        if depth == 0:
                            break
                    items.append(j)
                    j += 1
            found.append(("in" if tokens[op].value == "in" else "not in", items))
        prev = _sig(tokens, i, -1)
        if _is(tokens, prev, "operator", "==") or _is(tokens, prev, "operator", "!="):
            found.append((tokens[prev].value, [_sig(tokens, prev, -1)]))
    return [(op, [j for j in js if 0 <= j < len(tokens)]) for op, js in found]


def _swap_success(out: list[Tok], i: int) -> None:
    if 0 <= i < len(out) and out[i].kind == "string" and out[i].value[1:-1] == "success":
        q = out[i].value[0]
        out[i] = Tok("string", f"{q}ok{q}", True)


# -- legacy event name aliases (call.done, call.error, step.exit) ----------------------------------


def alias_literals(source: str) -> list[str]:
    """The legacy event aliases a template that reads ``event`` names in string literals."""
    if not any(a in source for a in LEGACY_ALIASES):
        return []
    return [name for name in event_name_literals(source) if name in LEGACY_ALIASES]


def event_name_literals(source: str) -> list[str]:
    """The string literals of a template that reads ``event`` (the event names it compares with)."""
    if "event" not in source or not has_template(source):
        return []
    tokens = tokenize(source)
    if tokens is None or "event" not in undeclared_names(source):
        return []
    return [t.value[1:-1] for t in tokens if t.code and t.kind == "string"]


def _event_name_at(tokens: list[Tok], i: int, step: int) -> int:
    """Index of the far end of an ``event.name`` reference whose near end is at ``i`` (-1: none)."""
    a = i
    b = _sig(tokens, a, step)
    c = _sig(tokens, b, step)
    first, last = (a, c) if step > 0 else (c, a)
    if (
        _is(tokens, first, "name", "event")
        and _is(tokens, _sig(tokens, first, 1), "operator", ".")
        and _is(tokens, last, "name", "name")
        and _is_reference(tokens, first)
    ):
        return c
    return -1


def _listed(names: tuple[str, ...], q: str) -> str:
    return ", ".join(f"{q}{n}{q}" for n in names)


def aliases_to_canonical(
    source: str, aliases: Mapping[str, tuple[str, ...]] = LEGACY_ALIASES, *, swap: bool = False
) -> str:
    """``event.name == 'call.done'`` -> ``event.name in ['step.done', 'loop.done']`` (also ``!=``, the
    literal first, and an alias inside ``event.name in [...]``); other uses stay as they are. With
    ``swap``, an alias `aliases` maps to one name is replaced by it (``event.name == 'step.done'``)."""
    if not any(a in aliases for a in alias_literals(source)):
        return source
    tokens = tokenize(source)
    if tokens is None:
        return source
    out = list(tokens)
    for i, t in enumerate(tokens):
        alias = t.value[1:-1] if t.code and t.kind == "string" else None
        if alias is None or alias not in aliases:
            continue
        names, q = aliases[alias], t.value[0]
        op = _sig(tokens, i, -1)
        if (_is(tokens, op, "operator", "==") or _is(tokens, op, "operator", "!=")) and _event_name_at(
            tokens, _sig(tokens, op, -1), -1
        ) >= 0:  # event.name == 'alias'
            if swap and len(names) == 1:
                out[i] = Tok("string", f"{q}{names[0]}{q}", True)
                continue
            out[op] = Tok("name", "in" if tokens[op].value == "==" else "not in", True)
            out[i] = Tok("operator", f"[{_listed(names, q)}]", True)
            continue
        op = _sig(tokens, i, 1)
        if _is(tokens, op, "operator", "==") or _is(tokens, op, "operator", "!="):
            end = _event_name_at(tokens, _sig(tokens, op, 1), 1)
            if end >= 0 and swap and len(names) == 1:  # 'alias' == event.name
                out[i] = Tok("string", f"{q}{names[0]}{q}", True)
                continue
            if end >= 0:  # 'alias' == event.name
                neg = "not " if tokens[op].value == "!=" else ""
                out[i] = Tok("name", f"event.name {neg}in [{_listed(names, q)}]", True)
                for k in range(i + 1, end + 1):
                    out[k] = Tok("raw", "", True)
                continue
        j = _sig(tokens, i, -1)  # inside event.name in [..., 'alias', ...]
        while _is(tokens, j, "string") or _is(tokens, j, "operator", ","):
            j = _sig(tokens, j, -1)
        if _is(tokens, j, "operator", "[") or _is(tokens, j, "operator", "("):
            k = _sig(tokens, j, -1)
            before = _sig(tokens, k, -1)
            if _is(tokens, before, "name", "not"):
                before = _sig(tokens, before, -1)
            if _is(tokens, k, "name", "in") and _event_name_at(tokens, before, -1) >= 0:
                out[i] = Tok("string", _listed(names, q), True)
    return join(out)


# -- templates as expressions ----------------------------------------------------------------------


def literal(value: Any) -> str:
    """A Jinja expression for a plain YAML value."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))}: {literal(v)}" for k, v in value.items()) + "}"
    return json.dumps(str(value))


def as_expression(value: Any) -> str | None:
    """A Jinja expression with the value of ``value`` (a template or a plain value); None when the
    template has statements (``{% %}``) and cannot be one expression."""
    if isinstance(value, str) and has_template(value):
        inner = _single_expression(value)
        if inner is not None:
            return inner
        tokens = tokenize(value)
        if tokens is None:
            return None
        parts: list[str] = []
        expr: list[Tok] | None = None
        for t in tokens:
            if t.kind == "block_begin":
                return None
            if t.kind == "variable_begin":
                expr = []
            elif t.kind == "variable_end":
                parts.append(f"({join(expr or []).strip()})")
                expr = None
            elif expr is not None:
                expr.append(t)
            elif t.value:
                parts.append(json.dumps(t.value))
        return " ~ ".join(parts) if parts else '""'
    if isinstance(value, (list, dict)) and reads(value):
        return None
    return literal(value)


def template(expr: str) -> str:
    return "{{ " + expr + " }}"


def one_condition(value: str) -> str | None:
    """A condition written as several ``{{ }}`` blocks with text around them, as one expression:
    ``"{{ a }} and {{ b }}"`` -> ``"{{ a and b }}"``. None when that does not parse (or it has ``{% %}``)."""
    tokens = tokenize(value)
    if tokens is None:
        return None
    parts: list[str] = []
    expr: list[Tok] | None = None
    for t in tokens:
        if t.kind == "block_begin":
            return None
        if t.kind == "variable_begin":
            expr = []
        elif t.kind == "variable_end":
            parts.append(_wrap(join(expr or []).strip()))
            expr = None
        elif expr is not None:
            expr.append(t)
        elif t.value.strip():
            parts.append(t.value.strip())
    out = template(" ".join(parts))
    if _single_expression(out) is None or check_syntax(out) is not None:
        return None
    return out


def inner(value: Any) -> str | None:
    """The expression of a single-expression template (``"{{ x }}"`` -> ``x``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str) and has_template(value):
        return _single_expression(value)
    return None


# -- event.name tests in case conditions -----------------------------------------------------------


class EventSplit(NamedTuple):
    events: frozenset[str] | None
    """The event names the condition tests (None: it does not test event.name)."""
    rest: str | None
    """The condition without its event.name tests (None: nothing is left)."""


class SplitError(NoetlError):
    pass


def split_event(when: Any) -> EventSplit:
    """Separate ``event.name == 'call.done' and <rest>`` into ``({'call.done'}, '<rest>')``."""
    if when is None or when is True:
        return EventSplit(None, None)
    expr = inner(when)
    if expr is None:
        raise SplitError("the condition must be one '{{ ... }}' expression")
    tokens = tokenize(template(expr))
    if tokens is None:
        raise SplitError("the condition does not parse")
    body = [t for t in tokens if t.code]
    conjuncts = _split(body, "and")
    events: frozenset[str] | None = None
    rest: list[str] = []
    for part in conjuncts:
        found = _event_test(part)
        if found is None:
            if any(
                t.kind == "name" and t.value == "event" and _names_event(part, k) for k, t in enumerate(part)
            ):
                raise SplitError(
                    "it tests 'event' in a way the translation cannot separate from the rest "
                    "(write the event test as a separate \"event.name == '...' and ...\")"
                )
            rest.append(join(part).strip())
        else:
            events = found if events is None else events & found
    text = " and ".join(rest) if rest else None
    return EventSplit(events, text)


def conjuncts(expr: str) -> list[str]:
    """The parts of an expression joined by a top-level ``and`` (the expression alone when none is, or
    when a top-level ``or`` or ``if`` binds looser than its ``and``)."""
    tokens = tokenize(template(expr))
    if tokens is None:
        return [expr]
    code = [t for t in tokens if t.code]
    if any(len(_split(code, word)) > 1 for word in ("or", "if")):
        return [expr]
    return [join(part).strip() for part in _split(code, "and")]


def _names_event(part: list[Tok], k: int) -> bool:
    return _is_reference(part, k)


def _split(tokens: list[Tok], word: str) -> list[list[Tok]]:
    parts: list[list[Tok]] = [[]]
    depth = 0
    for t in tokens:
        if t.kind == "operator" and t.value in "([{":
            depth += 1
        elif t.kind == "operator" and t.value in ")]}":
            depth -= 1
        if depth == 0 and t.kind == "name" and t.value == word:
            parts.append([])
            continue
        parts[-1].append(t)
    return parts


def _strip_parens(tokens: list[Tok]) -> list[Tok]:
    sig = [t for t in tokens if t.kind not in _SKIP]
    while len(sig) >= 2 and sig[0].value == "(" and sig[-1].value == ")":
        depth = 0
        balanced = True
        for n, t in enumerate(sig):
            if t.kind == "operator" and t.value == "(":
                depth += 1
            elif t.kind == "operator" and t.value == ")":
                depth -= 1
                if depth == 0 and n != len(sig) - 1:
                    balanced = False
                    break
        if not balanced:
            break
        sig = sig[1:-1]
    return sig


def _event_test(part: list[Tok]) -> frozenset[str] | None:
    sig = _strip_parens(part)
    alternatives = _split(sig, "or")
    if len(alternatives) > 1:
        names: set[str] = set()
        for alt in alternatives:
            found = _event_test(alt)
            if found is None:
                return None
            names |= found
        return frozenset(names)
    s = [t for t in sig if t.kind not in _SKIP]
    shape = [(t.kind, t.value) for t in s]
    head = [("name", "event"), ("operator", "."), ("name", "name")]
    if len(s) == 5 and shape[:3] == head and shape[3] == ("operator", "==") and s[4].kind == "string":
        return frozenset({s[4].value[1:-1]})
    if len(s) == 5 and shape[2:] == head and shape[1] == ("operator", "==") and s[0].kind == "string":
        return frozenset({s[0].value[1:-1]})
    if len(s) >= 6 and shape[:3] == head and shape[3] == ("name", "in") and shape[4][1] in "([":
        items = [t.value[1:-1] for t in s[5:-1] if t.kind == "string"]
        if all(t.kind == "string" or t.value == "," for t in s[5:-1]) and items:
            return frozenset(items)
    return None
