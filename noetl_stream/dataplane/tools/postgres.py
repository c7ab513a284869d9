"""``postgres``: SQL with bound parameters through asyncpg, one connection pool per credential per worker.

Config:

* ``query: <sql>`` or ``command: <sql>`` (one of them; they mean the same). The result is NoETL's
  (`sqlresult`): the last statement's ``{rows, row_count, columns}`` when it returns rows, else
  ``{row_count, affected_rows, message}`` (``message`` the command tag, ``"INSERT 0 3"``), plus
  ``command_<i>`` with each statement's own result. Values are JSON-safe (Decimal, UUID, timestamps as
  ISO text; ``json``/``jsonb`` decoded).
* A text of several ``;``-separated statements (a script) runs them one by one, in autocommit unless
  ``transaction`` is set. It is split by PostgreSQL's own parser (pglast): dollar-quoted bodies, quoted
  strings and identifiers and comments stay whole. A script that does not parse runs no statement
  (``pg_error`` 42601). A text without ``;`` goes to the server as it is.
* ``params``: a list bound as ``$1, $2, ...`` (never interpolated into the SQL), for a text of one
  statement: with a script they are a ``config_error`` (give a list of statements, each with its own
  ``params``). ``many: true`` takes ``params`` as a list of parameter lists and runs the statement
  once per list (asyncpg ``executemany``, all or nothing): the rows of all runs when it returns rows
  (``RETURNING``), else ``{row_count: null, affected_rows: null, message: "EXECUTEMANY n", executed: n}``
  (asyncpg does not count the rows each run changed). A value for a ``json``/``jsonb`` parameter may be
  any JSON value; a string is taken as JSON text. Parameters are typed by the server and a string is
  accepted only for text-like types: to pass a rendered string to another type, cast it from text
  (``$1::text::timestamptz``, ``$1::text::int``).
* ``query``/``command`` may also be a list whose items are SQL texts or ``{query|command|sql: <sql>,
  params: [...], many: bool}``; their statements run in order and are numbered on (``command_<i>``).
  ``transaction: true`` runs all of them in one transaction (all or nothing); ``transaction:
  serializable`` (or ``repeatable_read``, ``read_committed``) also sets its isolation level.
* ``auth`` names a keychain entry of kind ``postgres_credential``: {host, port, user, password,
  database[, sslmode]} (or NoETL's names for them, db_host, db_port, db_user, db_password, db_name: where
  both are given, the canonical one wins) or {dsn}. ``dsn`` may also be given directly (e.g. from ``{{ keychain... }}``).
  ``pool`` (a NoETL connection pool name) is accepted and ignored: a worker keeps its own pools.
* ``spec.timeout``: ``{connect, statement}`` in seconds (a number sets both; ``read`` is taken for
  ``statement`` so that a step-wide http timeout applies too). ``spec.pool_size``: the pool's maximum
  size (a positive whole number or text holding one, default 10; anything else is a ``config_error``).
  A worker keeps one pool per credential and pool size: tasks of one credential with different sizes
  use different pools (each up to its size, so together up to the sum of their sizes).

Errors are ``pg_error`` with ``outcome.pg = {code, sqlstate, message}`` (plus ``detail``, ``hint``,
``constraint``, ``table`` when the server gives them, and ``statement``: the index of the statement
that failed). Retryable: serialization failure ``40001``,
deadlock ``40P01``, connection errors (class ``08``; a refused connection is reported as ``08001``),
server shutdown/startup (``57P01``-``57P03``) and ``53300`` (too many connections). A client-side
timeout is ``timeout`` (retryable). Values of the credential never appear in the outcome, and a DSN
that cannot be read is a ``config_error`` saying what is wrong in general terms (``invalid DSN: the port
is not a number``), never quoting it: the parser's messages quote parts of it, such as the piece of a
password with an unencoded ``/`` or ``:`` taken for the port. A result with two columns of one name (a
join's two ``id`` columns) is a ``pg_error`` naming them, never a row that silently lost one value.
"""

from __future__ import annotations

import decimal
import functools
import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

import asyncpg
import msgspec
import pglast
from asyncpg.pgproto import pgproto
from pglast.parser import ParseError

from noetl_stream.dataplane.outcome import Outcome, json_safe, sql_infinity
from noetl_stream.dataplane.tools.base import (
    DuplicateColumnsError,
    ToolContext,
    check_columns,
    script_file,
    seconds,
)
from noetl_stream.dataplane.tools.pgstatements import run_prepared
from noetl_stream.dataplane.tools.sqlresult import command_result, rows_result, task_result
from noetl_stream.errors import ConfigurationError, NoetlError
from noetl_stream.kv.keychain import CredentialNotFoundError, redact, secret_strings

CREDENTIAL_KINDS = ("postgres_credential", "postgres")
ISOLATION_LEVELS = ("read_committed", "repeatable_read", "serializable")
RETRYABLE_SQLSTATES = frozenset({"40001", "40P01", "57P01", "57P02", "57P03", "53300"})
DEFAULT_POOL_SIZE = 10
_CONNECT_KEYS = {"host": "host", "port": "port", "user": "user", "username": "user", "password": "password"}
_NOETL_KEYS = {
    "db_host": ("host",),
    "db_port": ("port",),
    "db_user": ("user", "username"),
    "db_password": ("password",),
    "db_name": ("database", "dbname"),
}
"""NoETL's names of a postgres credential's fields, and the names they stand for (which win if given)."""
_ENCODE_HINT = " (percent-encode / : @ ? # [ ] in the user name and password)"
# What asyncpg's (and urllib's) messages about a DSN they cannot read mean, by a phrase of the message;
# the message itself may quote the DSN, so only these texts are shown.
_DSN_PROBLEMS = (
    ("invalid literal for int()", "the port is not a number" + _ENCODE_HINT),
    ("port must be 0-65535", "the port is not in 0-65535"),
    ("Port out of range", "the port is not in 0-65535"),
    ("scheme is expected", 'the scheme is not "postgresql://" or "postgres://"'),
    ("IPv6", "the host is not a valid [IPv6] address" + _ENCODE_HINT),
    ("bad query field", "the query string is not name=value pairs" + _ENCODE_HINT),
    ("could not match", "the number of ports does not match the number of hosts"),
    ("`sslmode`", "sslmode is not one of disable, allow, prefer, require, verify-ca, verify-full"),
    ("`sslnegotiation`", "sslnegotiation is not one of postgres, direct"),
    ("TLS version", "ssl_min_protocol_version or ssl_max_protocol_version is not a TLS version"),
    ("target_session_attrs", "target_session_attrs is not a session attribute asyncpg knows"),
    ("gsslib", "gsslib is not gssapi or sspi"),
)


# asyncpg's message for a parameter value its codec refused quotes the value (its repr, cut to 40
# characters and "..."): "invalid input for query argument $1: 'tok_live_4f9a...' (<reason>)". A cut
# value is no longer the secret it starts with, so redaction by exact match misses it: the value is
# dropped from the message (`_without_values`).
_ARGUMENT_VALUE = re.compile(
    r"invalid input for query argument \$(\d+)(?: in element #(\d+) of executemany\(\) sequence)?: ",
)


# asyncpg decodes infinity/-infinity timestamps and dates to these objects (`sql_infinity`).
_INFINITE = (
    (getattr(pgproto, "infinity_datetime", None), "infinity"),
    (getattr(pgproto, "negative_infinity_datetime", None), "-infinity"),
    (getattr(pgproto, "infinity_date", None), "infinity"),
    (getattr(pgproto, "negative_infinity_date", None), "-infinity"),
)


class _ConfigError(NoetlError):
    pass


class _ScriptError(NoetlError):
    """A script pglast could not parse: PostgreSQL's syntax error, raised before any statement ran."""

    def __init__(self, where: str, exc: ParseError) -> None:
        reason = str(exc.args[0]) if exc.args else "syntax error"
        self.position = exc.args[1] + 1 if len(exc.args) > 1 and isinstance(exc.args[1], int) else None
        at = f" at character {self.position}" if self.position else ""
        super().__init__(f"'{where}': {reason}{at} (a script is parsed whole first: no statement ran)")


class _Statement(msgspec.Struct, frozen=True):
    sql: str
    params: tuple[Any, ...] = ()
    many: bool = False


class _Float(decimal.Decimal):
    """A float parameter as the decimal of its shortest round-trip text (``0.1``, not the binary
    expansion ``0.1000000000000000055511151231257827021181583404541015625`` asyncpg's numeric codec
    writes for a float). Every codec that takes a float takes a Decimal alike (float4/float8 via
    ``__float__``, the integer types, arrays of them); a ``json`` parameter gets the float back."""

    original: float

    def __new__(cls, value: float) -> _Float:
        self = super().__new__(cls, repr(value))
        self.original = value
        return self


def _bindable(value: Any) -> Any:
    """`value` with its floats (also inside lists: arrays, ``many`` rows) as `_Float`; mappings are JSON
    values and keep theirs."""
    if isinstance(value, float):
        return _Float(value)
    if isinstance(value, (list, tuple)):
        return [_bindable(v) for v in value]
    return value


def _unbound(value: Any) -> Any:
    if isinstance(value, _Float):
        return value.original
    if isinstance(value, (list, tuple)):
        return [_unbound(v) for v in value]
    return value


def _encode_json(value: Any) -> str:
    if isinstance(value, str):
        return value
    return msgspec.json.encode(json_safe(_unbound(value))).decode()


async def _init_connection(conn: Any) -> None:
    for name in ("json", "jsonb"):
        await conn.set_type_codec(
            name, encoder=_encode_json, decoder=msgspec.json.decode, schema="pg_catalog"
        )


def _params(raw: Any, many: bool) -> tuple[Any, ...]:
    if raw is None:
        if many:
            raise _ConfigError("'many: true' needs 'params' (a list of parameter lists)")
        return ()
    if not isinstance(raw, (list, tuple)):
        raise _ConfigError(f"'params' must be a list (bound as $1, $2, ...), got {type(raw).__name__}")
    if many and not all(isinstance(row, (list, tuple)) for row in raw):
        raise _ConfigError("with 'many: true', 'params' must be a list of parameter lists")
    return tuple(tuple(row) for row in raw) if many else tuple(raw)


_FLOAT_TYPES = frozenset({"float4", "float8", "_float4", "_float8"})
"""Parameter types a float binds to as it is (a `_Float` would be turned back into the same float)."""


def _bound(stmt: _Statement, prepared: Any) -> Any:
    """The statement's params as they are bound (`_bindable`), each float kept as it is where its
    parameter is a ``float4``/``float8`` (or an array of them); a ``many`` statement's rows alike."""
    plain = tuple(t.name in _FLOAT_TYPES for t in prepared.get_parameters())
    if stmt.many:  # (most rows need nothing: looked at only where a value might)
        width = len(plain)
        watch = tuple(k for k in range(width) if not plain[k])
        return [
            row
            if len(row) == width
            and not any(type(row[k]) is float or isinstance(row[k], (list, tuple)) for k in watch)
            else _bound_row(row, plain)
            for row in stmt.params
        ]
    return _bound_row(stmt.params, plain)


def _bound_row(row: Sequence[Any], plain: tuple[bool, ...]) -> tuple[Any, ...]:
    return tuple(
        v
        if (k < len(plain) and plain[k]) or not (type(v) is float or isinstance(v, (list, tuple)))
        else _bindable(v)
        for k, v in enumerate(row)
    )


def _statements(config: Mapping[str, Any]) -> list[_Statement]:
    """The statements to run, in order: the text's (split when it is a script) or the list's items'."""
    given = [k for k in ("query", "command") if config.get(k) is not None]
    if len(given) != 1:
        raise _ConfigError(
            "postgres task needs 'query' or 'command'" if not given else "give 'query' or 'command', not both"
        )
    key = given[0]
    value = config[key]
    if isinstance(value, str):
        return _script(key, value, config.get("params"), bool(config.get("many")))
    if not isinstance(value, list) or not value:
        raise _ConfigError(f"'{key}' must be SQL text or a non-empty list of statements")
    if config.get("params") is not None or config.get("many"):
        raise _ConfigError(f"with a list of statements, give 'params'/'many' per item of '{key}'")
    out = []
    for i, item in enumerate(value):
        if isinstance(item, str):
            out += _script(f"{key}[{i}]", item, None, False)
            continue
        if not isinstance(item, Mapping):
            raise _ConfigError(f"{key}[{i}] must be SQL text or a mapping with 'query' or 'command'")
        keys = [k for k in ("query", "command", "sql") if item.get(k) is not None]
        if len(keys) != 1:
            raise _ConfigError(f"{key}[{i}] needs exactly one of 'query', 'command' or 'sql'")
        out += _script(f"{key}[{i}]", item[keys[0]], item.get("params"), bool(item.get("many")))
    return out


def _script(where: str, sql: Any, params: Any, many: bool) -> list[_Statement]:
    """The statements of one SQL text; `params` (and `many`) bind a text of one statement only."""
    if not isinstance(sql, str) or not sql.strip():
        raise _ConfigError(f"'{where}' must be non-empty SQL text")
    texts = split_statements(sql, where)
    if not texts:
        raise _ConfigError(f"'{where}' holds no SQL statement (only comments or ';')")
    bound = _params(params, many)
    if len(texts) > 1 and (params is not None or many):
        raise _ConfigError(
            f"'{where}' holds {len(texts)} statements and 'params' bind one: give the statements as a list, "
            "each with its own params ([{command: ..., params: [...]}, ...])"
        )
    return [_Statement(text, bound, many) for text in texts]


def split_statements(sql: str, where: str = "query") -> list[str]:
    """The statements of a SQL text. A text without ``;`` is one statement, sent as it is (the server
    reports what is wrong with it); others are split by PostgreSQL's parser (pglast), so that ``;`` in
    a dollar-quoted body, a string, a quoted identifier or a comment does not split them. Raises
    `_ScriptError` for a text it cannot parse."""
    if ";" not in sql:
        return [sql]
    try:
        return [str(text) for text in pglast.split(sql)]
    except ParseError as exc:
        raise _ScriptError(where, exc) from None


def _timeouts(spec: Mapping[str, Any]) -> tuple[float | None, float | None]:
    raw = spec.get("timeout")
    try:
        if not isinstance(raw, Mapping):  # one number (or text holding one) for both
            return (seconds(raw, "spec.timeout", " (or {connect, statement})"),) * 2
        connect = seconds(raw.get("connect"), "spec.timeout.connect")
        statement = seconds(raw.get("statement", raw.get("read")), "spec.timeout.statement")
    except ValueError as exc:
        raise _ConfigError(str(exc)) from None
    return connect, statement


def _canonical(cred: Mapping[str, Any]) -> dict[str, Any]:
    """The credential with NoETL's ``db_host``, ``db_port``, ``db_user``, ``db_password``, ``db_name`` as
    ``host``, ``port``, ``user``, ``password``, ``database``, unless those are given themselves."""
    out = dict(cred)
    for src, names in _NOETL_KEYS.items():
        if cred.get(src) is not None and all(cred.get(n) is None for n in names):
            out[names[0]] = cred[src]
    return out


def _connect_args(cred: Mapping[str, Any], name: str) -> dict[str, Any]:
    kind = cred.get("kind")
    if kind not in CREDENTIAL_KINDS:
        raise _ConfigError(f"keychain entry '{name}' has kind '{kind}', not postgres_credential")
    cred = _canonical(cred)
    if cred.get("dsn"):
        return {"dsn": str(cred["dsn"])}
    if cred.get("value") and not cred.get("host"):  # a declaration's `env:` or text `file:`: a DSN
        return {"dsn": str(cred["value"])}
    args = {dst: cred[src] for src, dst in _CONNECT_KEYS.items() if cred.get(src) is not None}
    database = cred.get("database") or cred.get("dbname")
    if database:
        args["database"] = database
    if cred.get("sslmode"):
        args["ssl"] = cred["sslmode"]
    if "port" in args:
        try:
            args["port"] = int(args["port"])
        except (TypeError, ValueError):
            raise _ConfigError(f"keychain entry '{name}': port must be a number") from None
    if "host" not in args:
        raise _ConfigError(f"keychain entry '{name}' needs 'host' (or a 'dsn')")
    return args


def _dsn_secrets(dsn: str) -> set[str]:
    out = {dsn}
    try:
        password = urlsplit(dsn).password
    except ValueError:
        password = None
    if password:
        out |= secret_strings(password) | secret_strings(unquote(password))
    return out


def _dsn_problem(exc: BaseException) -> str:
    """What is wrong with a DSN that could not be read, in general terms, never its text."""
    text = str(exc)
    for phrase, problem in _DSN_PROBLEMS:
        if phrase in text:
            return problem
    return "it cannot be read" + _ENCODE_HINT


def _pool_size(spec: Mapping[str, Any]) -> int:
    """``spec.pool_size``: a positive whole number, or text holding one (``"2"``); default 10."""
    raw = spec.get("pool_size")
    if raw is None:
        return DEFAULT_POOL_SIZE
    value = raw.strip() if isinstance(raw, str) else raw
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise _ConfigError(f"spec.pool_size must be a positive whole number, got {raw!r}")
    return value


async def _pool(ctx: ToolContext, connect: dict[str, Any], connect_timeout: float | None, size: int) -> Any:
    # One pool per credential and size: a task asking for another size gets a pool of its own.
    fingerprint = _fingerprint(msgspec.json.encode([sorted(connect.items()), size]))

    async def create() -> Any:
        kwargs: dict[str, Any] = dict(connect)
        if connect_timeout:
            kwargs["timeout"] = connect_timeout
        return await asyncpg.create_pool(min_size=0, max_size=size, init=_init_connection, **kwargs)

    async def close(pool: Any) -> None:
        await pool.close()

    assert ctx.services is not None
    return await ctx.services.get_or_create(f"postgres.pool.{fingerprint}", create, close)


@functools.lru_cache(maxsize=256)
def _fingerprint(settings: bytes) -> str:
    """The pool's key: a digest of its connection settings (a password is in them), worked out once."""
    return hashlib.sha256(settings).hexdigest()[:24]


def _rowcount(status: str) -> int:
    """The rows a command tag counts (``INSERT 0 3``: 3); 0 for a tag without a count (``CREATE TABLE``)."""
    last = status.rsplit(" ", 1)[-1] if status else ""
    return int(last) if last.isdigit() else 0


def _rows(records: Sequence[Any]) -> list[dict[str, Any]]:
    return [{k: sql_infinity(v, _INFINITE) for k, v in r.items()} for r in records]


async def _run_one(conn: Any, stmt: _Statement, timeout: float | None) -> dict[str, Any]:
    """One statement's result: prepared first (from the connection's statement cache, pgstatements.py), so that its
    columns are known (none: it returns no rows), also when no row comes back."""

    async def run(prepared: Any) -> dict[str, Any]:
        columns = [a.name for a in prepared.get_attributes()]
        check_columns(columns)
        params = _bound(stmt, prepared)
        if stmt.many:
            if columns:
                return rows_result(columns, _rows(await prepared.fetchmany(params, timeout=timeout)))
            await prepared.executemany(params, timeout=timeout)
            return {**command_result(None, f"EXECUTEMANY {len(params)}"), "executed": len(params)}
        records = await prepared.fetch(*params, timeout=timeout)
        if columns:
            return rows_result(columns, _rows(records))
        status = prepared.get_statusmsg() or ""
        return command_result(_rowcount(status), status)

    return await run_prepared(conn, stmt.sql, timeout, run, once=not stmt.many)


def _transaction(raw: Any) -> str | None:
    """None (autocommit), "" (a transaction at the server's default level) or an isolation level."""
    if raw is None or raw is False:
        return None
    if raw is True:
        return ""
    if isinstance(raw, str) and raw.lower().replace(" ", "_") in ISOLATION_LEVELS:
        return raw.lower().replace(" ", "_")
    raise _ConfigError(f"'transaction' must be true, false or one of {', '.join(ISOLATION_LEVELS)}")


async def _run_all(
    conn: Any, stmts: Sequence[_Statement], transaction: str | None, timeout: float | None, done: list[Any]
) -> None:
    """Run `stmts` in order, their results appended to `done` (so a failure's statement is its length)."""
    if transaction is None:
        for stmt in stmts:
            done.append(json_safe(await _run_one(conn, stmt, timeout)))
        return
    async with conn.transaction(isolation=transaction or None):
        for stmt in stmts:
            done.append(json_safe(await _run_one(conn, stmt, timeout)))


def _without_values(message: str, exc: BaseException, values: frozenset[str]) -> str:
    """`message` in our words without the parameter value asyncpg quotes in it: "the value of parameter
    $1 (of row #2 of many) does not fit its type (<reason>)". The reason is the codec's exception
    (``exc.__cause__``), which may quote the whole value too (``invalid UUID '...'``): the task's text
    parameters `values` are masked in it."""
    match = _ARGUMENT_VALUE.search(message)
    if match is None:
        return message
    cause = exc.__cause__
    reason = str(cause) if cause is not None else ""
    detail = f" ({redact(reason, values)})" if reason and message.endswith(f" ({reason})") else ""
    row = f" of row #{match.group(2)} of many" if match.group(2) is not None else ""
    return f"{message[: match.start()]}the value of parameter ${match.group(1)}{row} does not fit its type{detail}"


def _text_values(stmts: Sequence[_Statement]) -> frozenset[str]:
    """The text parameters of `stmts` (also inside lists: arrays, ``many`` rows)."""
    out: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, str):
            out.add(value)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)

    for stmt in stmts:
        walk(stmt.params)
    return frozenset(out)


def _pg_error(
    exc: BaseException, code: str | None, values: frozenset[str] = frozenset(), statement: int | None = None
) -> Outcome:
    message = _without_values(getattr(exc, "message", None) or str(exc) or type(exc).__name__, exc, values)
    pg: dict[str, Any] = {"code": code, "sqlstate": code, "message": message}
    if statement is not None:
        pg["statement"] = statement
    for attr, key in (
        ("detail", "detail"),
        ("hint", "hint"),
        ("constraint_name", "constraint"),
        ("table_name", "table"),
    ):
        value = getattr(exc, attr, None)
        if value:
            pg[key] = value
    retryable = code is not None and (code in RETRYABLE_SQLSTATES or code.startswith("08"))
    where = f" [{code}]" if code else ""
    return Outcome.fail("pg_error", f"{type(exc).__name__}{where}: {message}", retryable=retryable, pg=pg)


async def run_postgres(config: dict[str, Any], ctx: ToolContext) -> Outcome:
    secrets: set[str] = set()
    try:
        if config.get("script") is not None:  # NoETL's file script: its text is the command
            try:
                text = script_file(config, ctx)
            except ValueError as exc:
                raise _ConfigError(str(exc)) from None
            config = {**{k: v for k, v in config.items() if k != "script"}, "command": text}
        stmts = _statements(config)
        transaction = _transaction(config.get("transaction"))
        connect_timeout, timeout = _timeouts(ctx.spec)
        pool_size = _pool_size(ctx.spec)
        auth, dsn = config.get("auth"), config.get("dsn")
        if auth is not None and dsn is not None:
            raise _ConfigError("give 'auth' (a keychain entry) or 'dsn', not both")
        if auth is not None:
            if not isinstance(auth, str):
                raise _ConfigError("'auth' must name a keychain entry")
            cred = await ctx.credential(auth)
            secrets = secret_strings(cred)
            connect = _connect_args(cred, auth)
        elif isinstance(dsn, str) and dsn:
            connect = {"dsn": dsn}
        else:
            raise _ConfigError("postgres task needs 'auth' (a postgres_credential in the keychain) or 'dsn'")
        if "dsn" in connect:
            secrets |= _dsn_secrets(connect["dsn"])
    except _ConfigError as exc:
        return _redacted(Outcome.fail("config_error", str(exc)), secrets)
    except _ScriptError as exc:
        pg = {"code": "42601", "sqlstate": "42601", "message": str(exc), "position": exc.position}
        return _redacted(Outcome.fail("pg_error", f"SyntaxError [42601]: {exc}", pg=pg), secrets)
    except KeyError as exc:
        msg = (
            str(exc)
            if isinstance(exc, CredentialNotFoundError)
            else f"no keychain entry {config.get('auth')!r}"
        )
        return Outcome.fail("credential_error", msg)
    except ConfigurationError as exc:
        return Outcome.fail("credential_error", str(exc))
    connected = False
    results: list[Any] = []
    try:
        if ctx.services is not None:
            pool = await _pool(ctx, connect, connect_timeout, pool_size)
            async with pool.acquire(timeout=connect_timeout) as conn:
                connected = True
                await _run_all(conn, stmts, transaction, timeout, results)
        else:
            conn = await asyncpg.connect(**connect, timeout=connect_timeout or 60)
            connected = True
            try:
                await _init_connection(conn)
                await _run_all(conn, stmts, transaction, timeout, results)
            finally:
                await conn.close()
    except asyncpg.PostgresError as exc:
        outcome = _pg_error(
            exc, getattr(exc, "sqlstate", None), _text_values(stmts), _failed(stmts, results, connected)
        )
    except asyncpg.ClientConfigurationError as exc:  # a dsn asyncpg cannot read (not a URL, ...)
        outcome = _settings_error(exc, "dsn" in connect)
    except DuplicateColumnsError as exc:
        outcome = _pg_error(exc, None, statement=_failed(stmts, results, connected))
    except asyncpg.InterfaceError as exc:  # client-side misuse: wrong number or type of params, ...
        outcome = _pg_error(exc, None, _text_values(stmts), _failed(stmts, results, connected))
    except (ValueError, OverflowError) as exc:
        # Connected: a value the statement's codecs refused (a string that is not JSON, bad UTF-8, ...).
        # Else settings refused before connecting: a malformed dsn (bad port, bad IPv6 host), a port
        # past 65535 (the socket's OverflowError).
        outcome = (
            _pg_error(exc, None, statement=_failed(stmts, results, connected))
            if connected
            else _settings_error(exc, "dsn" in connect)
        )
    except TimeoutError:
        phase, limit = ("statement", timeout) if connected else ("connect", connect_timeout)
        outcome = Outcome.fail(
            "timeout",
            f"postgres: {phase} timed out" + (f" after {limit}s (spec.timeout.{phase})" if limit else ""),
            retryable=True,
            pg={"code": None, "sqlstate": None, "message": "timeout"},
        )
    except (OSError, ConnectionError) as exc:
        outcome = _pg_error(exc, "08001")
    else:
        outcome = Outcome.ok(
            task_result(results), pg={"code": None, "sqlstate": None, "statements": len(stmts)}
        )
    return _redacted(outcome, secrets)


def _failed(stmts: Sequence[_Statement], done: Sequence[Any], connected: bool) -> int | None:
    """The index of the statement that failed (`done` holds the results of those before it); None for
    a failure before any ran (connecting)."""
    return len(done) if connected and len(done) < len(stmts) else None


def _settings_error(exc: BaseException, from_dsn: bool) -> Outcome:
    """``config_error`` for connection settings asyncpg refused before connecting. A DSN's problem is
    told in general terms (`_dsn_problem`): the parser quotes fragments of the DSN, and a DSN rendered
    from a template with an unencoded password puts a piece of the password there."""
    if from_dsn:
        return Outcome.fail(
            "config_error", f"postgres: invalid connection settings: invalid DSN: {_dsn_problem(exc)}"
        )
    return Outcome.fail("config_error", f"postgres: invalid connection settings: {exc}")


def _redacted(outcome: Outcome, secrets: set[str]) -> Outcome:
    if secrets and outcome.status == "error":
        outcome.error = redact(outcome.error, secrets)
        outcome.helpers = redact(outcome.helpers, secrets)
    return outcome
