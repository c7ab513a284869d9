"""The conformance suite: playbooks written in NoETL's deployed dialect (tests/conformance/*.yaml) run on
a real runtime (nats-server, PostgreSQL, the aiohttp API of tests/conformance/api.py).

Each playbook ends in a check step that asserts what it must have computed, so `success` means the
dialect was understood. A second test runs the canonical form ``noetl-stream migrate`` writes and wants
it to validate without ``dialect`` diagnostics and to end the same way, with the same result.

What the runtime does not understand yet is listed in `RUN_GAPS` and `MIGRATE_GAPS` (a strict xfail
each, with the first error seen): a gap that closes turns its test red until it is taken off the list.
tests/conformance/GAPS.md groups them by cause.

``CONFORMANCE_REPORT=<file>`` appends one JSON line per run (validate, run and migrate outcomes) to
that file, for the gap table.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import yaml
from conformance.api import BEARER_TOKEN, ConformanceApi
from pgserver import PgServer

from noetl_stream.client.tracking import RunSummary
from noetl_stream.dsl import compile_playbook
from noetl_stream.dsl.migrate import migrate_text
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.kv.keychain import Keychain, KeychainKey, generate_key
from noetl_stream.protocol import events as E
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import Event
from noetl_stream.runtime.local import Runtime, local_runtime

HERE = Path(__file__).resolve().parents[1] / "conformance"
RUN_TIMEOUT_S = 45.0
RUNAWAY_FAILURES = 50
"""A run that failed this many steps is not waited for any longer (a cycle re-entering a failed step)."""


def is_child(path: Path) -> bool:
    """A child playbook, run by its parent: named ``child_*`` or headed ``# child``."""
    return path.name.startswith("child_") or path.read_text(encoding="utf-8").startswith("# child")


PLAYBOOKS = sorted(p for p in HERE.glob("*.yaml") if not is_child(p))
CHILDREN = sorted(p for p in HERE.glob("*.yaml") if is_child(p))

# Known gaps: playbook -> the first failure seen (tests/conformance/GAPS.md has them by cause).
RUN_GAPS: dict[str, str] = {}
MIGRATE_GAPS: dict[str, str] = {}


def _cases(gaps: dict[str, str]) -> list[Any]:
    return [
        pytest.param(
            p,
            id=p.stem,
            marks=[pytest.mark.xfail(strict=True, reason=gaps[p.stem])] if p.stem in gaps else [],
        )
        for p in PLAYBOOKS
    ]


# --- the world the playbooks run in --------------------------------------------------------------


@dataclass
class World:
    rt: Runtime
    api: ConformanceApi
    database: dict[str, Any]
    scratch: Path

    def payload(self, text: str) -> dict[str, Any]:
        """The values the test supplies, for the workload keys the playbook declares; a new `run_key`
        for every run (the API's counters and records are keyed by it)."""
        declared = (yaml.safe_load(text) or {}).get("workload") or {}
        given = {
            "api_url": self.api.url,
            "pg_auth": "pg_conformance",
            "pg_noetl_auth": "pg_noetl_fields",
            "api_auth": "api_bearer",
            "run_key": "r" + uuid.uuid4().hex[:10],
            "scratch_dir": str(self.scratch),
        }
        return {k: v for k, v in given.items() if k in declared}

    async def reset_database(self) -> None:
        """An empty public schema: a second run starts from what a first run found."""
        conn = await asyncpg.connect(**self.database)
        try:
            await conn.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public")
        finally:
            await conn.close()

    async def run(self, path: Path) -> Outcome:
        text = path.read_text(encoding="utf-8")
        self.scratch.mkdir(exist_ok=True)
        failed: list[Event] = []
        runaway = asyncio.Event()

        def on_event(event: Event) -> None:
            if event.name == E.STEP_FAILED:
                failed.append(event)
                if len(failed) >= RUNAWAY_FAILURES:
                    runaway.set()

        async def follow_run() -> RunSummary | None:
            try:
                return await self.rt.run_playbook(
                    text, str(path), self.payload(text), on_event, RUN_TIMEOUT_S
                )
            except TimeoutError:  # still running
                return None

        async def stop_a_runaway() -> None:
            await runaway.wait()
            follow.cancel()

        async with asyncio.TaskGroup() as tg:
            follow = tg.create_task(follow_run())
            watchdog = tg.create_task(stop_a_runaway())
            follow.add_done_callback(lambda _: watchdog.cancel())
        if follow.cancelled():
            summary = RunSummary(execution_id="?", status=f"running, {len(failed)} steps failed so far")
        else:
            summary = follow.result() or RunSummary(
                execution_id="?", status=f"running after {RUN_TIMEOUT_S:.0f} s"
            )
        workflow = (yaml.safe_load(text) or {}).get("workflow") or [{}]
        return Outcome(summary, failed, str(workflow[-1].get("step")))


@dataclass
class Outcome:
    summary: RunSummary
    failed: list[Event]
    """The ``step.failed`` events, handled ones too."""
    check_step: str
    """The playbook's last step, its check."""

    @property
    def status(self) -> str:
        return self.summary.status

    @property
    def result(self) -> Any:
        return self.summary.result

    @property
    def ok(self) -> bool:
        """Success, with the check step run: a branch that no arc continues ends the run, so a run can
        succeed without ever reaching its check."""
        check = self.summary.steps.get(self.check_step)
        return self.status == "success" and check is not None and check.status == "done"

    def failure(self) -> str:
        """Why the run did not pass: the execution's error, told by its step's own ``step.failed`` when
        there is one (the execution's error may be a later one: an arc condition that could not be
        evaluated on it); for a run that never ended, its first ``step.failed``."""
        if self.status == "success":
            ran = ", ".join(f"{name} ({s.status})" for name, s in self.summary.steps.items())
            return f"success without running the check step {self.check_step!r}: ran {ran}"
        error = self.summary.error or {}
        step = error.get("step")
        if self.status.startswith("running") and self.failed:
            step = self.failed[0].step
        own = next((e for e in self.failed if e.step == step), None)
        if own is not None:
            error = own.payload.get("error") or error
        where = f"step {step}: " if step else ""
        return f"{self.status}: {where}{error.get('kind')}: {error.get('message')}"


@pytest.fixture
async def api() -> AsyncIterator[ConformanceApi]:
    server = await ConformanceApi().start()
    yield server
    await server.stop()


@pytest.fixture
async def database(pg: PgServer) -> AsyncIterator[dict[str, Any]]:
    """A database of the test's own; its connection fields."""
    name = "conf_" + uuid.uuid4().hex[:10]
    admin = await asyncpg.connect(pg.dsn)
    try:
        await admin.execute(f"CREATE DATABASE {name}")
    finally:
        await admin.close()
    yield {**pg.credential(), "database": name}
    admin = await asyncpg.connect(pg.dsn)
    try:
        await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    finally:
        await admin.close()


@pytest.fixture
async def world(
    nats_server: EmbeddedNats,
    topology: Topology,
    api: ConformanceApi,
    database: dict[str, Any],
    tmp_path: Path,
) -> AsyncIterator[World]:
    """A controller and a worker whose keychain holds the playbooks' credentials: ``pg_conformance``
    (our field names), ``pg_noetl_fields`` (NoETL's ``db_*`` names) and the bearer ``api_bearer``."""
    key = KeychainKey([generate_key()])
    async with local_runtime(nats_server.url, topology=topology, keychain_key=key, concurrency=16) as rt:
        keychain = Keychain(rt.nc.jetstream(), topology, key)
        await keychain.put("pg_conformance", "postgres_credential", database)
        noetl_fields = {
            "db_host": database["host"],
            "db_port": database["port"],
            "db_user": database["user"],
            "db_password": database["password"],
            "db_name": database["database"],
        }
        await keychain.put("pg_noetl_fields", "postgres", noetl_fields)
        await keychain.put("api_bearer", "bearer", {"token": BEARER_TOKEN})
        yield World(rt, api, database, tmp_path / "scratch")


# --- reporting -----------------------------------------------------------------------------------


def _first_error(diagnostics: Any) -> str | None:
    errors = [d for d in diagnostics if d.severity == "error"]
    return errors[0].format() if errors else None


def _report(**fields: Any) -> None:
    target = os.environ.get("CONFORMANCE_REPORT")
    if target:
        with open(target, "a", encoding="utf-8") as out:
            out.write(json.dumps(fields, default=str) + "\n")


# --- the tests -----------------------------------------------------------------------------------


@pytest.mark.timeout(180)
@pytest.mark.parametrize("path", _cases(RUN_GAPS))
async def test_playbook_runs_to_success(world: World, path: Path) -> None:
    validation = compile_playbook(path.read_text(encoding="utf-8"), str(path))
    outcome = await world.run(path)
    _report(
        test="run",
        playbook=path.stem,
        validate=_first_error(validation.diagnostics),
        status=outcome.status if outcome.ok or outcome.status != "success" else "success, check not run",
        error=None if outcome.ok else outcome.failure(),
    )
    assert outcome.ok, outcome.failure()


def _migrate(source: Path, out_dir: Path) -> tuple[Path, str | None]:
    """What ``noetl-stream migrate SOURCE -o OUT_DIR/<name>`` writes (`migrate_text`, the function the
    command writes the output of; the command's own behaviour is tests/dsl/test_migrate_dialect.py's): the
    output's path, and the first error when it writes nothing."""
    target = out_dir / source.name
    migration = migrate_text(source.read_text(encoding="utf-8"), str(source))
    if migration.text is None:
        return target, _first_error(migration.diagnostics) or "no output"
    target.write_text(migration.text, encoding="utf-8")
    return target, None


@pytest.fixture(scope="module")
def migrated_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the migrated playbooks go, with the children they name by path migrated beside them once."""
    out = tmp_path_factory.mktemp("migrated")
    for child in CHILDREN:
        _, complaint = _migrate(child, out)
        assert complaint is None, f"{child.name}: {complaint}"
    return out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("path", _cases(MIGRATE_GAPS))
async def test_migrated_playbook_runs_the_same(world: World, path: Path, migrated_dir: Path) -> None:
    migrated, complaint = _migrate(path, migrated_dir)
    problems: list[str] = []
    if complaint is None:
        check = compile_playbook(migrated.read_text(encoding="utf-8"), str(migrated))
        error = _first_error(check.diagnostics)
        dialect = [d.format() for d in check.diagnostics if d.code == "dialect"]
        problems += [f"does not validate: {error}"] if error else []
        problems += [f"dialect diagnostic: {dialect[0]}"] if dialect else []
    else:
        problems.append(f"migrate: {complaint}")
    original = after = None
    if not problems:
        after = await world.run(migrated)
        await world.reset_database()
        original = await world.run(path)
        if not after.ok:
            problems.append(f"the migrated run: {after.failure()}")
        elif not original.ok:
            problems.append(f"the original run: {original.failure()}")
        elif after.result != original.result:
            problems.append(f"results differ: {original.result!r} became {after.result!r}")
    _report(
        test="migrate",
        playbook=path.stem,
        migrated=complaint is None,
        migrated_status=None if after is None else "checked" if after.ok else after.status,
        problem=problems[0] if problems else None,
    )
    assert not problems, problems[0]
    assert original is not None and after is not None
    assert (after.status, after.result) == (original.status, original.result)
