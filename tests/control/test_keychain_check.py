"""A playbook's declared ``keychain`` is resolved before its workflow starts (real runs): an entry that
cannot be resolved ends the execution before any step runs, naming the entry and never a value; a
keychain that resolves starts the workflow after ``keychain.resolved``. A controller that dies between
the check and its answer resumes it from the events."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from helpers import playbook, requested, run
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from noetl_stream.control.core.keychaincheck import CHECK_RUN
from noetl_stream.control.core.plans import PlanCache
from noetl_stream.control.core.reducer import Reducer
from noetl_stream.control.resume import queued_command_ids, resume
from noetl_stream.dataplane.command import CommandRun
from noetl_stream.dataplane.worker import Worker
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.jetstream.outbox import Outbox
from noetl_stream.kv.history import read_events
from noetl_stream.kv.keychain import Keychain, KeychainKey, generate_key
from noetl_stream.kv.provision import provision
from noetl_stream.protocol import events as E
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import Event, event_id, now_iso
from noetl_stream.runtime.local import local_runtime

SECRET = "present-token-VALUE-7f3c91"


def _book(marker: Path, keychain: str) -> str:
    """`start` writes `marker` when it runs (a task that ran leaves a trace outside the events too)."""
    workflow = f"""
    - step: start
      tool:
        kind: python
        args: {{token: "{{{{ keychain.present.token }}}}"}}
        code: |
          open({str(marker)!r}, "w").write("ran")
          result = len(token)
    """
    return playbook(workflow) + "keychain:\n" + keychain


STORE_ENTRIES = "  - {name: present, kind: bearer}\n  - {name: absent, kind: bearer}\n"


def _later_use(marker: Path) -> str:
    """`start` uses no credential (it ran, before the check: a step resolves only what it reads) and
    writes `marker`; `use` reads the keychain."""
    workflow = f"""
    - step: start
      tool:
        kind: python
        code: |
          open({str(marker)!r}, "w").write("ran")
          result = 1
      next:
        arcs:
          - step: use
    - step: use
      tool:
        kind: python
        args: {{token: "{{{{ keychain.present.token }}}}"}}
        code: result = len(token)
    """
    return playbook(workflow) + "keychain:\n" + STORE_ENTRIES


async def test_a_missing_store_entry_ends_the_execution_before_start_runs(
    nats_server: EmbeddedNats, topology: Topology, tmp_path: Path
) -> None:
    key = KeychainKey([generate_key()])
    marker = tmp_path / "ran"
    async with local_runtime(nats_server.url, topology=topology, keychain_key=key) as rt:
        await Keychain(rt.nc.jetstream(), topology, key).put("present", "bearer", {"token": SECRET})
        r = await run(rt, _later_use(marker))

    assert r.status == "failed", r.summary
    error = r.summary.error
    assert error is not None and error["kind"] == "credential_error" and error["entry"] == "absent"
    assert "no keychain entry 'absent'" in error["message"]
    assert not marker.exists()
    assert r.names() == [
        E.EXECUTION_REQUESTED,
        E.REQUEST_EVALUATED,
        E.KEYCHAIN_FAILED,
        E.WORKFLOW_FINISHED,
        E.PLAYBOOK_PROCESSED,
    ]
    (failed,) = r.named(E.KEYCHAIN_FAILED)
    assert failed.step is None and failed.step_run_id == CHECK_RUN and failed.source == "worker"
    assert failed.payload["error"]["entry"] == "absent"
    assert SECRET not in msgspec.json.encode(r.events).decode() + msgspec.json.encode(r.summary).decode()


async def test_a_resolved_keychain_is_recorded_before_the_workflow_starts(
    nats_server: EmbeddedNats, topology: Topology, tmp_path: Path
) -> None:
    key = KeychainKey([generate_key()])
    marker = tmp_path / "ran"
    async with local_runtime(nats_server.url, topology=topology, keychain_key=key) as rt:
        await Keychain(rt.nc.jetstream(), topology, key).put("present", "bearer", {"token": SECRET})
        r = await run(rt, _book(marker, "  - {name: present, kind: bearer}\n"))

    assert r.status == "success", r.summary
    assert r.result == len(SECRET) and marker.exists()
    names = r.names()
    assert names[:4] == [E.EXECUTION_REQUESTED, E.REQUEST_EVALUATED, E.KEYCHAIN_RESOLVED, E.WORKFLOW_STARTED]
    (resolved,) = r.named(E.KEYCHAIN_RESOLVED)
    assert resolved.payload == {"entries": ["present"]}
    assert SECRET not in msgspec.json.encode(r.events).decode()


async def test_an_env_entry_missing_from_the_workers_environment_ends_it_before_start(
    nats_server: EmbeddedNats, topology: Topology, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOETL_TEST_CHECK_PRESENT", SECRET)
    monkeypatch.delenv("NOETL_TEST_CHECK_ABSENT", raising=False)
    marker = tmp_path / "ran"
    keychain = (
        "  - {name: present, kind: bearer, env: NOETL_TEST_CHECK_PRESENT}\n"
        "  - {name: later, kind: bearer, env: NOETL_TEST_CHECK_ABSENT}\n"
    )
    async with local_runtime(nats_server.url, topology=topology) as rt:
        r = await run(rt, _book(marker, keychain).replace("keychain.present.token", "keychain.present.value"))

    assert r.status == "failed", r.summary
    error = r.summary.error
    assert error is not None and error["kind"] == "credential_error" and error["entry"] == "later"
    assert (
        "keychain entry 'later' is not available (environment variable NOETL_TEST_CHECK_ABSENT)"
        in error["message"]
    )
    assert not marker.exists() and not r.named(E.STEP_SCHEDULED, E.STEP_STARTED, E.TASK_STARTED)
    assert SECRET not in msgspec.json.encode(r.events).decode()


BOOK = playbook("- step: start\n  tool: {kind: noop}\n") + "keychain:\n  - {name: api, kind: bearer}\n"


async def test_resume_between_the_check_and_its_answer(js: JetStreamContext, topology: Topology) -> None:
    """The controller stored the evaluation and published the check, then died. Whoever resumes the
    execution publishes neither again, and the answer, once stored, starts the workflow."""
    await provision(js, topology)
    eid = "kcresume0"
    outbox = Outbox(js, topology)
    outbox.event(requested(eid, BOOK))
    await outbox.flush()
    _, fx = Reducer(PlanCache()).apply(None, requested(eid, BOOK), 1)
    (check,) = fx.commands
    outbox = Outbox(js, topology)
    for ev in fx.events:
        outbox.event(ev)
    outbox.command(check)
    await outbox.flush()

    out = await resume(js, topology, Reducer(PlanCache()), eid, None, after=0)
    assert out.state is not None and out.state.keychain_check and not out.state.runs
    assert out.events == [] and out.commands == []
    assert await queued_command_ids(js, topology, eid) == {check.command_id}

    resolved = Event(
        event_id=event_id(eid, CHECK_RUN, E.KEYCHAIN_RESOLVED),
        execution_id=eid,
        name=E.KEYCHAIN_RESOLVED,
        source="worker",
        entity_type="workflow",
        entity_id=eid,
        status="success",
        timestamp=now_iso(),
        step_run_id=CHECK_RUN,
        payload={"entries": ["api"]},
    )
    outbox = Outbox(js, topology)
    outbox.event(resolved)
    await outbox.flush()

    again = await resume(js, topology, Reducer(PlanCache()), eid, None, after=0)
    assert (
        again.state is not None and not again.state.keychain_check and list(again.state.runs) == ["start-1"]
    )
    assert [ev.name for ev in again.events] == [E.WORKFLOW_STARTED, E.STEP_SCHEDULED]
    assert [cmd.step_run_id for cmd in again.commands] == ["start-1"]  # not the check: a worker answered
    names = [ev.name async for _, ev in read_events(js, topology, eid)]
    assert names == [
        E.EXECUTION_REQUESTED,
        E.REQUEST_EVALUATED,
        E.KEYCHAIN_RESOLVED,
        E.WORKFLOW_STARTED,
        E.STEP_SCHEDULED,
    ]


@pytest.mark.parametrize("present", [True, False])
async def test_a_worker_of_an_earlier_release_answers_the_check_with_a_step_boundary(
    nc: NATS, topology: Topology, monkeypatch: pytest.MonkeyPatch, present: bool
) -> None:
    """During an upgrade a check may reach a worker that does not know the flag: it runs the command as a
    step without tasks, resolving the declarations and running nothing, and its boundary answers."""
    if present:
        monkeypatch.setenv("NOETL_TEST_CHECK_OLD", SECRET)
    else:
        monkeypatch.delenv("NOETL_TEST_CHECK_OLD", raising=False)
    text = playbook("- step: start\n  tool: {kind: noop}\n") + (
        "keychain:\n  - {name: api, kind: bearer, env: NOETL_TEST_CHECK_OLD}\n"
    )
    await provision(nc.jetstream(), topology)
    reducer = Reducer(PlanCache())
    state, fx = reducer.apply(None, requested("kcold", text), 1)
    (check,) = fx.commands
    assert check.keychain_check and check.step_def.tasks == ()
    blind = msgspec.structs.replace(check, keychain_check=False)  # what an earlier worker decodes
    old = CommandRun(Worker(nc, topology).run_parts, blind, Outbox(nc.jetstream(), topology))

    await old.execute()

    assert [ev.name for ev in old.events.pending] == (
        [E.STEP_STARTED, E.STEP_DONE] if present else [E.STEP_FAILED]
    )
    for seq, ev in enumerate(old.events.pending, start=2):
        state, fx = reducer.apply(state, ev, seq)
    assert state is not None and not state.keychain_check
    if present:
        assert list(state.runs) == ["start-1"] and [c.step_run_id for c in fx.commands] == ["start-1"]
    else:
        assert state.status == "failed" and state.error is not None
        assert state.error["kind"] == "credential_error" and "'api'" in state.error["message"]
