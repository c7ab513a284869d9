"""The keychain store on a real NATS server: encryption at rest, keys, resolver, redaction, CLI."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from noetl_stream.cli import main
from noetl_stream.errors import ConfigurationError
from noetl_stream.jetstream.connection import connect
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.kv.keychain import (
    KEY_ENV,
    KEY_FILE_ENV,
    CredentialNotFoundError,
    Keychain,
    KeychainKey,
    generate_key,
    redact,
    secret_strings,
    secret_values,
)
from noetl_stream.kv.provision import provision
from noetl_stream.protocol.subjects import Topology

PASSWORD = "s3cret-Pa55word!"


@pytest.fixture
async def kc(js: JetStreamContext, topology: Topology) -> Keychain:
    await provision(js, topology)
    return Keychain(js, topology, KeychainKey([generate_key()]))


async def test_put_get_roundtrip_and_encrypted_at_rest(
    kc: Keychain, js: JetStreamContext, topology: Topology
) -> None:
    fields = {"host": "db", "port": 5432, "user": "app", "password": PASSWORD, "database": "d"}
    await kc.put("pg_main", "postgres_credential", fields)
    entry = await kc.get("pg_main")
    assert entry.kind == "postgres_credential" and entry.fields == fields
    assert entry.resolved() == {**fields, "kind": "postgres_credential"}
    raw = (await (await js.key_value(topology.keychain_bucket)).get("pg_main")).value
    assert raw is not None
    assert PASSWORD.encode() not in raw and b"app" not in raw  # the fields are one ciphertext
    assert b"postgres_credential" in raw  # the kind is readable, so `list` needs no key


async def test_list_and_delete_need_no_key(kc: Keychain, js: JetStreamContext, topology: Topology) -> None:
    await kc.put("b_token", "bearer", {"token": "t-123456"})
    await kc.put("a_pg", "postgres_credential", {"dsn": "postgresql://u:p@h/d"})
    keyless = Keychain(js, topology, from_env=False)
    assert await keyless.list() == [("a_pg", "postgres_credential"), ("b_token", "bearer")]
    with pytest.raises(ConfigurationError, match=KEY_ENV):
        await keyless.get("a_pg")
    with pytest.raises(ConfigurationError, match=KEY_ENV):
        await keyless.put("c", "static", {"value": "x"})
    assert await keyless.delete("a_pg") is True
    assert await keyless.delete("a_pg") is False
    assert await kc.list() == [("b_token", "bearer")]
    with pytest.raises(CredentialNotFoundError, match="no keychain entry 'a_pg'"):
        await kc.get("a_pg")
    # Purged: the bucket's stream keeps one empty marker for the key and no ciphertext. (Read from the
    # stream: nats-py's kv.history() may end before its first entry on a loaded machine.)
    stream, subject = f"KV_{topology.keychain_bucket}", f"$KV.{topology.keychain_bucket}.a_pg"
    info = await js.stream_info(stream, subjects_filter=subject)
    assert info.state.subjects == {subject: 1}
    marker = await js.get_last_msg(stream, subject)
    assert not marker.data and (marker.headers or {}).get("KV-Operation") == "PURGE"


async def test_empty_keychain_lists_nothing(kc: Keychain) -> None:
    assert await kc.list() == []
    with pytest.raises(CredentialNotFoundError):
        await kc.get("missing")


async def test_wrong_key_and_rotation(kc: Keychain, js: JetStreamContext, topology: Topology) -> None:
    old = generate_key()
    writer = Keychain(js, topology, KeychainKey([old]))
    await writer.put("tok", "bearer", {"token": "abc-123456"})
    with pytest.raises(ConfigurationError, match="different key"):
        await Keychain(js, topology, KeychainKey([generate_key()])).get("tok")
    new = generate_key()
    rotated = Keychain(js, topology, KeychainKey.from_env({KEY_ENV: f"{new},{old}"}))
    assert (await rotated.get("tok")).fields == {"token": "abc-123456"}
    await rotated.put("tok", "bearer", {"token": "abc-123456"})  # re-encrypted with the new key
    assert (await Keychain(js, topology, KeychainKey([new])).get("tok")).kind == "bearer"


async def test_key_from_file_and_bad_keys(tmp_path: Path) -> None:
    key = generate_key()
    path = tmp_path / "key"
    path.write_text(key + "\n")
    assert KeychainKey.from_env({KEY_FILE_ENV: str(path)}) is not None
    assert KeychainKey.from_env({}) is None
    with pytest.raises(ConfigurationError, match="cannot read the keychain key file"):
        KeychainKey.from_env({KEY_FILE_ENV: str(tmp_path / "missing")})
    with pytest.raises(ConfigurationError, match="invalid keychain key"):
        KeychainKey(["not-a-key"])


async def test_names_are_checked(kc: Keychain) -> None:
    for bad in ("a.b", "a b", "", "-x", "a>"):
        with pytest.raises(ConfigurationError, match="invalid keychain name"):
            await kc.put(bad, "static", {"value": "x"})
    with pytest.raises(ConfigurationError, match="'kind' is not a field"):
        await kc.put("ok", "static", {"kind": "x"})


async def test_missing_bucket_is_a_clear_error(js: JetStreamContext) -> None:
    kc = Keychain(js, Topology(prefix="nobucketshere"), KeychainKey([generate_key()]))
    with pytest.raises(ConfigurationError, match="noetl-stream provision"):
        await kc.list()


async def test_resolver_caches_briefly_and_sees_changes(kc: Keychain) -> None:
    await kc.put("tok", "bearer", {"token": "first-token"})
    resolve = kc.resolver(cache_s=0.2)
    assert await resolve("tok") == {"token": "first-token", "kind": "bearer"}
    (await resolve("tok"))["token"] = "mutated"  # callers get copies
    assert (await resolve("tok"))["token"] == "first-token"
    await kc.put("tok", "bearer", {"token": "second-token"})
    await asyncio.sleep(0.25)
    assert (await resolve("tok"))["token"] == "second-token"
    with pytest.raises(KeyError):
        await resolve("nope")


def test_secret_values_skip_identifiers() -> None:
    fields = {"host": "db.local", "port": 5432, "user": "app", "password": PASSWORD, "extra": {"pin": 4321}}
    assert secret_values(fields) == {PASSWORD, "4321"}
    assert secret_strings("tok-abcdef") == {"tok-abcdef"}
    assert secret_strings({"token": "x1y2z3", "header": "X-Key"}) == {"x1y2z3"}


def test_redact_everywhere() -> None:
    obj = {
        "message": f"login failed for password {PASSWORD} at host",
        "nested": [PASSWORD, {"k": f"Bearer {PASSWORD}"}, 1, None, True],
        PASSWORD: "as a key",
        "bytes": f"x{PASSWORD}".encode(),
        "pin": 4321,
        "short": "ab",
        "text": "about a cab",
    }
    out = redact(obj, {PASSWORD, "4321", "ab"})
    assert out == {
        "message": "login failed for password *** at host",
        "nested": ["***", {"k": "Bearer ***"}, 1, None, True],
        "***": "as a key",
        "bytes": b"x***",
        "pin": "***",
        "short": "***",  # short secrets only where a whole value equals them ...
        "text": "about a cab",  # ... never inside other text
    }
    assert obj["nested"][0] == PASSWORD  # the input is not changed
    assert redact(obj, set()) is obj


# --- CLI ---------------------------------------------------------------------------------------------


def _cli(
    args: list[str], nats_url: str, prefix: str, key: str | None, input: str | None = None
) -> tuple[int, str]:
    env = {KEY_ENV: key} if key else {KEY_ENV: ""}
    res = CliRunner().invoke(
        main, ["keychain", *args, "--nats", nats_url, "--prefix", prefix], env=env, input=input
    )
    return res.exit_code, res.output


async def _provisioned(nats_server: EmbeddedNats, topology: Topology) -> None:
    nc: NATS = await connect(nats_server.url, name="pytest-provision", connect_wait_s=10)
    try:
        await provision(nc.jetstream(), topology)
    finally:
        await nc.close()


async def test_cli_set_get_list_delete_never_print_values(
    nats_server: EmbeddedNats, topology: Topology, tmp_path: Path
) -> None:
    await _provisioned(nats_server, topology)
    key = generate_key()
    url, prefix = nats_server.url, topology.prefix

    def cli(args: list[str], with_key: bool = True, input: str | None = None) -> tuple[int, str]:
        return _cli(args, url, prefix, key if with_key else None, input)

    code, out = await asyncio.to_thread(
        cli,
        [
            "set",
            "pg_main",
            "--kind",
            "postgres_credential",
            "--field",
            "host=db",
            "--field",
            f"password={PASSWORD}",
        ],
    )
    assert code == 0, out
    assert "pg_main" in out and PASSWORD not in out
    spec = tmp_path / "tok.json"
    spec.write_text(json.dumps({"kind": "bearer", "token": "tok-from-json-1234"}))
    code, out = await asyncio.to_thread(cli, ["set", "api", "--from-json", str(spec)])
    assert code == 0 and "tok-from-json-1234" not in out
    code, out = await asyncio.to_thread(
        cli, ["set", "stdin_one", "--kind", "static", "--from-json", "-"], True, '{"value": "v-123456"}'
    )
    assert code == 0, out

    code, out = await asyncio.to_thread(cli, ["list"], False)
    assert code == 0 and out.split("\n")[:3] == [
        "api\tbearer",
        "pg_main\tpostgres_credential",
        "stdin_one\tstatic",
    ]
    code, out = await asyncio.to_thread(cli, ["list", "--json"], False)
    assert json.loads(out)[0] == {"name": "api", "kind": "bearer"}
    code, out = await asyncio.to_thread(cli, ["get", "pg_main"])
    assert code == 0 and json.loads(out) == {
        "name": "pg_main",
        "kind": "postgres_credential",
        "fields": ["host", "password"],
    }
    assert PASSWORD not in out

    code, out = await asyncio.to_thread(cli, ["get", "pg_main"], False)
    assert code == 2 and KEY_ENV in out
    code, out = await asyncio.to_thread(cli, ["set", "x", "--kind", "static", "--field", "value=1"], False)
    assert code == 2 and KEY_ENV in out
    code, out = await asyncio.to_thread(cli, ["set", "x", "--field", "value=1"])
    assert code == 2 and "kind" in out

    code, out = await asyncio.to_thread(cli, ["delete", "pg_main"], False)
    assert code == 0 and "deleted pg_main" in out
    code, out = await asyncio.to_thread(cli, ["delete", "pg_main"], False)
    assert code == 1 and "no keychain entry" in out
    code, out = await asyncio.to_thread(cli, ["get", "pg_main"])
    assert code == 1 and "no keychain entry 'pg_main'" in out


def test_cli_keygen_prints_a_usable_key() -> None:
    res = CliRunner().invoke(main, ["keychain", "keygen"])
    assert res.exit_code == 0
    KeychainKey([res.output.strip()])
