"""What the ``noetl-stream`` commands share: the exit codes, the ``--nats`` and ``--prefix`` options,
the installation's topology from ``--prefix`` and ``NOETL_*`` (`topology_for`), running a command's
coroutine (`run_async`) and a command on a NATS connection (`with_nats`), each mapping errors to an exit
code and one line on stderr, never a traceback."""

from __future__ import annotations

import re
import sys
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click
import msgspec

from noetl_stream.errors import ConfigurationError
from noetl_stream.protocol.subjects import Topology

T = TypeVar("T")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INVALID = 2

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
NATS_SCHEMES = ("nats", "tls", "ws", "wss")
"""The schemes the NATS client connects with (``HOST[:PORT]`` alone is ``nats://``, as it reads it)."""
_HOST = re.compile(r"[a-z0-9_.-]+")  # a name or an IPv4 address, as `urlsplit` gives it (lower case)


def _masked(url: str) -> str:
    """`url` with the user, password or token before its host replaced by ``***`` (with or without a
    scheme: ``u:pw@host`` is a URL the client takes too)."""
    start = url.find("://")
    start = 0 if start < 0 else start + 3
    end = next((i for i in range(start, len(url)) if url[i] in "/?#"), len(url))
    at = url.rfind("@", start, end)
    return url if at < 0 else f"{url[:start]}***{url[at:]}"


def _nats_url_problem(url: str) -> str | None:
    """What makes `url` (one of ``--nats``'s) a URL the NATS client cannot connect to, or None."""
    from urllib.parse import urlsplit

    scheme, sep, _ = url.partition("://")
    if sep and scheme not in NATS_SCHEMES:
        return f"the scheme must be {', '.join(NATS_SCHEMES[:-1])} or {NATS_SCHEMES[-1]}, not {scheme!r}"
    try:
        parts = urlsplit(url if sep else f"nats://{url}")
        host = parts.hostname
        parts.port  # noqa: B018 - raises for a port that is not a number from 0 to 65535
    except ValueError as exc:  # an unbalanced '[' of an IPv6 address, a port out of range
        return str(exc)
    if not host:
        return "it names no host"
    if ":" in host:  # [IPv6]
        import ipaddress

        try:
            ipaddress.IPv6Address(host.partition("%")[0])
        except ValueError:
            return f"{host!r} is not an IPv6 address"
    elif not _HOST.fullmatch(host):
        return f"{host!r} is not a host name or address"
    return None


def checked_nats_url(value: str | None) -> str | None:
    """`value` (``--nats`` / ``NOETL_NATS_URL``) if every comma-separated URL in it is one the NATS client
    can connect to (`NATS_SCHEMES`, a host; websocket and plain URLs not mixed). Otherwise exit 2 with one
    line naming the bad URL, credentials masked, and the form expected: before anything connects (the
    client read ``http://host:4222`` as the host ``http`` and answered "Name or service not known")."""
    if value is None:
        return None
    urls = [u.strip() for u in value.split(",") if u.strip()]
    expected = "expected nats://HOST:PORT (or tls://, ws://, wss://), several comma-separated for a cluster"
    if not urls:
        fail(f"no NATS URL in --nats / NOETL_NATS_URL: {expected}", EXIT_INVALID)
    for url in urls:
        problem = _nats_url_problem(url)
        if problem is not None:
            fail(
                f"invalid NATS URL {_masked(url)!r} (--nats / NOETL_NATS_URL): {problem}; {expected}",
                EXIT_INVALID,
            )
    if len({url.partition("://")[0] in ("ws", "wss") for url in urls}) > 1:
        shown = ", ".join(_masked(url) for url in urls)
        fail(
            f"invalid NATS URLs {shown!r} (--nats / NOETL_NATS_URL): websocket (ws://, wss://) and "
            "nats:// or tls:// URLs cannot be mixed; the nodes of a cluster are reached one way",
            EXIT_INVALID,
        )
    return value


nats_option = click.option(
    "--nats",
    "nats_url",
    envvar="NOETL_NATS_URL",
    default=DEFAULT_NATS_URL,
    show_default=True,
    callback=lambda _ctx, _param, value: checked_nats_url(value),
    help="NATS server URL, or several comma-separated (the nodes of a cluster) (env NOETL_NATS_URL).",
)
prefix_option = click.option(
    "--prefix",
    envvar="NOETL_PREFIX",
    default="noetl",
    show_default=True,
    help="Subject/stream prefix of the installation (env NOETL_PREFIX).",
)


TOPOLOGY_ENV = {
    "NOETL_COMMAND_ACK_WAIT_S": ("command_ack_wait_s", float),
    "NOETL_COMMAND_MAX_DELIVER": ("command_max_deliver", int),
    "NOETL_REPLICAS": ("replicas", int),
    "NOETL_STORAGE": ("storage", str),
    "NOETL_EVENTS_MAX_AGE_S": ("events_max_age_s", float),
    "NOETL_PARTITIONS": ("partitions", int),
    "NOETL_LEASE_TTL_S": ("lease_ttl_s", float),
}


def topology_for(prefix: str, **overrides: Any) -> Topology:
    """The installation's names and JetStream settings: ``--prefix`` plus the ``NOETL_*`` variables above
    (and `overrides` from command-line options, which win)."""
    import os

    from noetl_stream.protocol.subjects import TopologyError

    settings: dict[str, Any] = {}
    for env, (field, cast) in TOPOLOGY_ENV.items():
        raw = os.environ.get(env)
        if raw:
            try:
                settings[field] = cast(raw)
            except ValueError:
                raise click.BadParameter(f"{env}={raw!r} is not a valid {cast.__name__}") from None
    settings.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return Topology(prefix=prefix, **settings)
    except (TopologyError, TypeError, ValueError) as exc:
        raise click.BadParameter(str(exc), param_hint="--prefix / NOETL_* settings") from None


LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
LOG_LEVEL = click.Choice(LOG_LEVELS, case_sensitive=False)
"""``--log-level`` of the long-running commands: an unknown level is a usage error (exit 2)."""
GRACE = click.FloatRange(min=0)
CONCURRENCY = click.IntRange(min=1)


def run_async(coro: Coroutine[Any, Any, T], nats_url: str | None = None) -> T:
    """Run `coro` to the end; Ctrl-C exits 130, a lost connection or a NATS failure 1, a configuration
    error or an installation that is not provisioned 2 (one line on stderr, never a traceback)."""
    import nats.errors

    from noetl_stream.loop import run_event_loop

    try:
        _check_event_loop()
        return run_event_loop(coro)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        raise  # stdout closed (`| head`): click exits quietly, no error line
    except ConfigurationError as exc:
        coro.close()  # if it never started: no "coroutine was never awaited" warning
        fail(str(exc), EXIT_INVALID)
    except (ConnectionError, nats.errors.Error) as exc:
        fail(*_nats_failure(exc, nats_url))


EVENT_LOOPS = ("uvloop", "asyncio")
"""The values of ``NOETL_EVENT_LOOP`` (`noetl_stream.loop.run_event_loop`; ``uvloop`` falls back to
asyncio's loop when uvloop is not installed)."""


def _check_event_loop() -> None:
    """Refuse a ``NOETL_EVENT_LOOP`` that is not one of `EVENT_LOOPS` (any other value used to run
    asyncio's loop without a word)."""
    import os

    value = os.environ.get("NOETL_EVENT_LOOP")
    if value and value not in EVENT_LOOPS:
        raise ConfigurationError(f"NOETL_EVENT_LOOP={value!r}: expected {' or '.join(EVENT_LOOPS)}")


def fail(message: str, code: int) -> NoReturn:
    from noetl_stream.jetstream.connection import redact_urls

    click.echo(f"error: {redact_urls(message)}", err=True)
    sys.exit(code)


_PROVISION = "run `noetl-stream provision` (or check --prefix / NOETL_PREFIX)"
REFUSED = (
    "the NATS user this command connects as may not do this (its permissions: deploy/nats/accounts.conf)"
)


def _nats_failure(exc: BaseException, nats_url: str | None = None) -> tuple[str, int]:
    """The one-line message and the exit code of a failure talking to NATS."""
    import nats.errors
    import nats.js.errors as jse

    if isinstance(exc, jse.ServiceUnavailableError):
        return "JetStream is not available on the NATS server (start nats-server with -js)", EXIT_FAILED
    if isinstance(exc, jse.BucketNotFoundError):
        return f"a KV bucket of the installation does not exist: {_PROVISION}", EXIT_INVALID
    if isinstance(exc, jse.NotFoundError) and exc.err_code == 10059:
        return f"a stream of the installation does not exist: {_PROVISION}", EXIT_INVALID
    if isinstance(exc, jse.NoStreamResponseError):
        return f"no JetStream stream stores this subject: {_PROVISION}", EXIT_INVALID
    if isinstance(exc, nats.errors.TimeoutError):
        return "NATS did not answer in time", EXIT_FAILED
    if isinstance(exc, jse.APIError):
        detail = exc.description or type(exc).__name__
    else:
        detail = str(exc).removeprefix("nats: ").strip() or type(exc).__name__
    if isinstance(exc, ConnectionError) or nats_url is None:
        return (detail if isinstance(exc, ConnectionError) else f"NATS: {detail}"), EXIT_FAILED
    return f"NATS ({nats_url}): {detail}", EXIT_FAILED


CLI_CONNECT_WAIT_S = 5.0
"""How long a command waits for its first connection to NATS before it says it cannot connect
(``NOETL_CONNECT_WAIT_S`` overrides it)."""


def connect_wait_s() -> float:
    import math
    import os

    raw = os.environ.get("NOETL_CONNECT_WAIT_S")
    if not raw:
        return CLI_CONNECT_WAIT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        fail(f"NOETL_CONNECT_WAIT_S={raw!r} is not a number of seconds above 0", EXIT_INVALID)
    return value


def with_nats(nats_url: str, name: str, action: Callable[[Any], Awaitable[T]]) -> T:
    """Connect to NATS as client `name`, return what `action(connection)` returns, and close; errors exit
    as in `run_async`. While connecting, the client's errors are not logged, one per attempt: the last
    one is in the error line if the connection cannot be made."""
    import nats.errors
    import structlog

    from noetl_stream.jetstream.connection import connect, refusal

    connected = False
    last_error: list[str] = []
    log = structlog.get_logger("noetl_stream.jetstream.connection").bind(nats_client=name)
    wait_s = connect_wait_s()

    async def on_error(e: Exception) -> None:
        error = str(e) or type(e).__name__
        if not connected:
            last_error[:] = [error]
        elif "permissions violation" in error.lower():
            log.debug("nats.error", error=error)  # in the error line of the failure it causes
        else:
            log.warning("nats.error", error=error, kind=type(e).__name__)

    async def go() -> T:
        nonlocal connected
        try:
            # nats-py reads max_reconnect_attempts=0 as "no limit": the wait alone bounds the first
            # connection (a refused one is tried about once a second until then).
            nc = await connect(
                nats_url,
                name=name,
                connect_wait_s=wait_s,
                max_reconnect_attempts=0,
                error_cb=on_error,
            )
        except ConnectionError as exc:
            raise ConnectionError(f"{exc} ({last_error[0]})" if last_error else str(exc)) from None
        connected = True
        try:
            return await action(nc)
        except (TimeoutError, nats.errors.TimeoutError):
            refused = refusal(nc)
            if refused is not None:  # the request went nowhere: the server dropped it
                raise ConfigurationError(f"{refused}: {REFUSED}") from None
            raise
        finally:
            await nc.close()

    return run_async(go(), nats_url)


def read_playbook(file: Path) -> str:
    """FILE's text; exit 2 with the reason if it cannot be read."""
    try:
        return file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        click.echo(f"{file}: cannot read: {exc}", err=True)
        sys.exit(EXIT_INVALID)


def echo_json(value: object) -> None:
    click.echo(msgspec.json.encode(value).decode())
