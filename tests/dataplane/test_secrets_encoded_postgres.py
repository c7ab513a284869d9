"""A DSN that cannot be read fails with what is wrong in general terms, never with pieces of its text.

A DSN written from a template with a password that is not percent-encoded (``/``, ``:``, ``#``, ``?``
or ``[`` in it) splits where the password should not: the parser then quotes a piece of the password
(``invalid literal for int() with base 10: 'ST'``) that is too short for any redaction to find. These
DSNs fail before a connection is tried, so no server is needed; the tool runs as a worker runs it,
with and without the worker's pools, and end to end from a keychain value.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import msgspec
import pytest
from helpers import run

from noetl_stream.dataplane.outcome import Outcome
from noetl_stream.dataplane.tools.base import ToolContext, WorkerServices
from noetl_stream.dataplane.tools.postgres import run_postgres
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.kv.keychain import Keychain, KeychainKey, generate_key
from noetl_stream.protocol.subjects import Topology
from noetl_stream.runtime.local import local_runtime

PREFIX = "postgres: invalid connection settings: invalid DSN: "


def pieces(secret: str) -> list[str]:
    """The runs of letters and digits of `secret`: what a parser splitting it at a delimiter quotes."""
    return re.findall(r"[A-Za-z0-9]{2,}", secret)


@pytest.fixture(params=["pooled", "direct"])
async def ctx(request: pytest.FixtureRequest) -> AsyncIterator[ToolContext]:
    services = WorkerServices() if request.param == "pooled" else None
    yield ToolContext(execution_id="e", step="s", task="t", spec={}, services=services)
    if services is not None:
        await services.close()


@pytest.mark.parametrize(
    ("dsn", "secret", "problem"),
    [
        ("postgresql://app:{s}@127.0.0.1:5432/db", "Qx7/Wk9", "the port is not a number"),
        ("postgresql://app:{s}@127.0.0.1:5432/db", "Qx7#Wk9", "the port is not a number"),
        ("postgresql://app:{s}@127.0.0.1:5432/db", "Qx7?Wk9=1", "the port is not a number"),
        ("postgresql://app:{s}@127.0.0.1:5432/db", "Qx7[Wk9", "the host is not a valid [IPv6] address"),
        ("postgresql://app@127.0.0.1:5432/db?{s}", "Qx7Wk9", "the query string is not name=value pairs"),
        ("postgresql://app@127.0.0.1:5432/db?target_session_attrs={s}", "Qx7Wk9", "target_session_attrs"),
        ("postgresql://app@127.0.0.1:5432/db?gsslib={s}", "Qx7Wk9", "gsslib is not gssapi or sspi"),
        ("postgresql://app@127.0.0.1:5432/db?ssl_min_protocol_version={s}", "Qx7Wk9", "is not a TLS version"),
        ("{s}://app@127.0.0.1:5432/db", "Qx7Wk9", 'the scheme is not "postgresql://" or "postgres://"'),
    ],
)
async def test_a_dsn_that_cannot_be_read_names_the_problem_not_its_text(
    ctx: ToolContext, dsn: str, secret: str, problem: str
) -> None:
    out = await run_postgres({"query": "SELECT 1", "dsn": dsn.format(s=secret)}, ctx)
    assert out.error is not None and out.error["kind"] == "config_error" and not out.error["retryable"]
    message = out.error["message"]
    assert message.startswith(PREFIX) and problem in message, message
    text = msgspec.json.encode(out).decode()
    assert [p for p in pieces(secret) if p in text] == []


async def test_a_port_past_65535_is_a_config_error(ctx: ToolContext) -> None:
    # The socket refuses it (OverflowError) before anything is sent; it used to leave the tool as an
    # exception the pipeline reported as kind "OverflowError".
    out: Outcome = await run_postgres(
        {"query": "SELECT 1", "dsn": "postgresql://app:pw-Qx7Wk9@127.0.0.1:99999/db"}, ctx
    )
    assert out.error is not None and out.error["kind"] == "config_error"
    assert out.error["message"] == PREFIX + "the port is not in 0-65535"


async def test_a_templated_dsn_with_an_unencoded_keychain_password_does_not_show_a_piece_of_it(
    nats_server: EmbeddedNats, topology: Topology
) -> None:
    secret = "ST/secret+val=77 x"
    text = """apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: dsn, path: tests/dsn}
keychain:
  - {name: kstatic, kind: static}
workflow:
  - step: start
    tool:
      kind: postgres
      dsn: "postgresql://postgres:{{ keychain.kstatic.value }}@127.0.0.1:5432/postgres"
      query: "SELECT 1 AS a"
"""
    key = KeychainKey([generate_key()])
    async with local_runtime(nats_server.url, topology=topology, keychain_key=key) as rt:
        await Keychain(rt.nc.jetstream(), topology, key).put("kstatic", "static", {"value": secret})
        r = await run(rt, text)
    assert r.status == "failed"
    err = r.step_error("start")
    assert err["kind"] == "config_error", err
    assert err["message"].startswith(PREFIX + "the port is not a number"), err
    everything = msgspec.json.encode([r.events, r.summary]).decode()
    assert "'ST'" not in everything and secret not in everything
