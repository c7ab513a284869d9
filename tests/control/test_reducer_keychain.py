"""The keychain check in the reducer: a playbook that declares a keychain starts its workflow only once a
worker has resolved it (``keychain.resolved``), and fails before any step on ``keychain.failed``. Which
entries the check covers, and where it runs. Pure: the real reducer, no NATS."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from helpers import playbook, requested

from noetl_stream.control.core.keychaincheck import CHECK_FLAG, CHECK_RUN
from noetl_stream.control.core.plans import PlanCache
from noetl_stream.control.core.reducer import Reducer
from noetl_stream.control.core.state import ExecutionState
from noetl_stream.control.poison import failure_for
from noetl_stream.protocol import events as E
from noetl_stream.protocol.wire import Command, Event, control_event, now_iso

WORKFLOW = """
- step: start
  tool: {kind: noop, result: 1}
  next:
    arcs:
      - step: use
- step: use
  tool:
    kind: http
    url: http://localhost:1/x
    auth: api
"""
KEYCHAIN = """keychain:
  - {name: api, kind: bearer}
  - {name: local, kind: bearer, env: SOME_TOKEN}
  - {name: mounted, kind: static, file: /run/secrets/x}
"""


def _book(workflow: str = WORKFLOW, keychain: str = KEYCHAIN, executor: str = "") -> str:
    return playbook(workflow) + keychain + executor


def answer(name: str, run_id: str = CHECK_RUN, eid: str = "e1", **payload: Any) -> Event:
    return Event(
        event_id=f"{eid}:{run_id}:{name}",
        execution_id=eid,
        name=name,
        source="worker",
        entity_type="workflow",
        entity_id=eid,
        status="error" if name == E.KEYCHAIN_FAILED else "success",
        timestamp=now_iso(),
        step_run_id=run_id,
        payload=payload,
    )


FAILED = {
    "kind": "credential_error",
    "retryable": False,
    "message": "no keychain entry 'api' in the keychain store",
    "entry": "api",
}


@pytest.fixture
def reducer() -> Reducer:
    return Reducer(PlanCache())


def checking(reducer: Reducer, text: str | None = None) -> tuple[ExecutionState, Command]:
    state, fx = reducer.apply(None, requested("e1", text or _book()), 1)
    assert state is not None
    assert [e.name for e in fx.events] == [E.REQUEST_EVALUATED]
    (cmd,) = fx.commands
    return state, cmd


def test_a_declared_keychain_is_checked_before_the_workflow_starts(reducer: Reducer) -> None:
    state, cmd = checking(reducer)

    assert state.keychain_check and not state.runs and not state.terminal
    assert cmd.keychain_check and cmd.step_run_id == CHECK_RUN and cmd.command_id == f"e1:{CHECK_RUN}"
    assert cmd.step == "start" and cmd.step_def.name == "start" and cmd.step_def.tasks == ()
    assert cmd.pool == "default"
    assert [(d.name, d.kind, d.config) for d in cmd.keychain] == [
        ("api", "bearer", {}),
        ("local", "bearer", {"env": "SOME_TOKEN"}),
        ("mounted", "static", {"file": "/run/secrets/x"}),
    ]
    # A valid command on the wire, and the same one when the request is folded again (a resume).
    assert msgspec.json.decode(msgspec.json.encode(cmd), type=Command).keychain_check
    _, again = checking(Reducer(PlanCache()))
    assert again.command_id == cmd.command_id


def test_resolved_starts_the_workflow(reducer: Reducer) -> None:
    state, _ = checking(reducer)

    _, fx = reducer.apply(state, answer(E.KEYCHAIN_RESOLVED, entries=["api", "local", "mounted"]), 2)

    assert [e.name for e in fx.events] == [E.WORKFLOW_STARTED, E.STEP_SCHEDULED]
    assert [c.step_run_id for c in fx.commands] == ["start-1"] and not state.keychain_check


def test_failed_ends_the_execution_before_any_step(reducer: Reducer) -> None:
    state, _ = checking(reducer)

    _, fx = reducer.apply(state, answer(E.KEYCHAIN_FAILED, error=FAILED), 2)

    assert [e.name for e in fx.events] == [E.WORKFLOW_FINISHED, E.PLAYBOOK_PROCESSED]
    assert not fx.commands and not state.step_runs
    assert state.status == "failed" and state.error == {**FAILED, "step": None}
    assert fx.events[-1].payload["error"] == {**FAILED, "step": None}
    assert fx.events[-1].payload["status"] == "failed"


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        (answer(E.KEYCHAIN_RESOLVED, run_id="start-1"), "it names run 'start-1', not the keychain check's"),
        (answer(E.KEYCHAIN_FAILED, run_id="other", error=FAILED), "it names run 'other'"),
    ],
)
def test_an_answer_of_another_run_is_ignored_and_the_check_stays_pending(
    reducer: Reducer, event: Event, reason: str
) -> None:
    state, _ = checking(reducer)

    _, fx = reducer.apply(state, event, 2)

    assert fx.ignored is not None and fx.ignored.startswith(reason), fx.ignored
    assert not fx.events and not fx.commands and state.keychain_check and not state.terminal


def test_an_answer_with_no_check_pending_is_ignored(reducer: Reducer) -> None:
    """A duplicate (the check was answered already), or an answer for an execution that never had a
    check (it declares no keychain): nothing changes."""
    state, _ = checking(reducer)
    reducer.apply(state, answer(E.KEYCHAIN_RESOLVED), 2)
    runs = dict(state.runs)

    _, fx = reducer.apply(state, answer(E.KEYCHAIN_FAILED, error=FAILED), 3)

    assert fx.ignored is not None and "no keychain check is pending" in fx.ignored
    assert not fx.events and not fx.commands and state.runs == runs and not state.terminal

    plain, _ = reducer.apply(None, requested("e2", playbook("- step: start\n  tool: {kind: noop}")), 1)
    assert plain is not None and not plain.keychain_check and "start-1" in plain.runs
    _, fx = reducer.apply(plain, answer(E.KEYCHAIN_RESOLVED, eid="e2"), 2)
    assert fx.ignored is not None and "no keychain check is pending" in fx.ignored and not fx.events


def test_a_cancel_while_the_check_is_pending_ends_the_execution(reducer: Reducer) -> None:
    state, _ = checking(reducer)

    _, fx = reducer.apply(state, control_event("e1", E.EXECUTION_CANCEL_REQUESTED, "stop"), 2)

    assert state.status == "cancelled" and not state.keychain_check
    assert [e.name for e in fx.events] == [E.WORKFLOW_FINISHED, E.PLAYBOOK_PROCESSED]
    _, late = reducer.apply(state, answer(E.KEYCHAIN_RESOLVED), 3)
    assert not late.events and not late.commands and state.status == "cancelled"


def test_a_request_recorded_before_the_check_existed_starts_at_once(reducer: Reducer) -> None:
    """Replay of an execution requested before this release: its request has no check flag, and its
    history has workflow.started right after the evaluation; it replays as it ran."""
    event = requested("e1", _book())
    old = msgspec.structs.replace(event, payload={k: v for k, v in event.payload.items() if k != CHECK_FLAG})

    state, fx = reducer.apply(None, old, 1)

    assert state is not None and not state.keychain_check and "start-1" in state.runs
    assert [e.name for e in fx.events] == [E.REQUEST_EVALUATED, E.WORKFLOW_STARTED, E.STEP_SCHEDULED]


def test_a_retry_of_recorded_results_is_not_checked(reducer: Reducer) -> None:
    event = requested("e1", _book())
    request = {
        **event.payload["request"],
        "resume": {"execution_id": "old", "tokens": [{"step": "use"}], "results": {"start": 1}},
    }
    retry = msgspec.structs.replace(event, payload={**event.payload, "request": request})

    state, fx = reducer.apply(None, retry, 1)

    assert state is not None and not state.keychain_check and list(state.runs) == ["use-1"]
    assert [c.step for c in fx.commands] == ["use"]


def test_a_check_given_up_on_fails_the_execution(reducer: Reducer) -> None:
    """Every delivery of the check crashed its worker: the poison handler writes its keychain.failed."""
    state, cmd = checking(reducer)
    event = failure_for(cmd, 5)
    assert event.name == E.KEYCHAIN_FAILED and event.step is None and event.step_run_id == CHECK_RUN

    reducer.apply(state, event, 2)

    assert state.status == "failed" and state.error is not None
    assert state.error["kind"] == "max_deliver_exceeded" and "keychain check" in state.error["message"]


# -- which entries, which pool -------------------------------------------------------------------


def _checked(text: str, reducer: Reducer) -> tuple[str, list[str]] | None:
    state, fx = reducer.apply(None, requested("e1", text), 1)
    assert state is not None
    checks = [c for c in fx.commands if c.keychain_check]
    if not checks:
        assert not state.keychain_check and state.runs
        return None
    return checks[0].pool, [d.name for d in checks[0].keychain]


def test_one_pool_checks_every_entry_there(reducer: Reducer) -> None:
    assert _checked(_book(executor="executor: {spec: {pool: etl}}\n"), reducer) == (
        "etl",
        ["api", "local", "mounted"],
    )


def test_a_keychain_reader_on_another_pool_leaves_the_worker_entries_to_the_steps(reducer: Reducer) -> None:
    """`use` reads the keychain on pool `edge`: only its workers may have `local` and `mounted`."""
    workflow = WORKFLOW + "  spec: {pool: edge}\n"
    assert _checked(_book(workflow), reducer) == ("default", ["api"])


def test_only_worker_entries_on_several_pools_means_no_check(reducer: Reducer) -> None:
    workflow = WORKFLOW + "  spec: {pool: edge}\n"
    keychain = "keychain:\n  - {name: api, kind: bearer, env: API_TOKEN}\n"
    assert _checked(_book(workflow, keychain), reducer) is None


def test_a_step_on_another_pool_that_reads_no_keychain_changes_nothing(reducer: Reducer) -> None:
    workflow = """
    - step: start
      tool: {kind: noop}
      spec: {pool: edge}
      next:
        arcs:
          - step: use
    - step: use
      tool: {kind: http, url: http://localhost:1/x, auth: api}
    """
    assert _checked(_book(workflow, executor="executor: {spec: {pool: etl}}\n"), reducer) == (
        "edge",
        ["api"],
    )


def test_a_start_that_only_routes_checks_on_the_pool_of_the_first_step_with_a_tool(reducer: Reducer) -> None:
    workflow = """
    - step: start
      next:
        arcs:
          - step: use
    - step: use
      tool: {kind: http, url: http://localhost:1/x, auth: api}
      spec: {pool: edge}
    """
    assert _checked(_book(workflow), reducer) == ("edge", ["api", "local", "mounted"])


def test_the_request_pool_is_where_steps_without_one_run(reducer: Reducer) -> None:
    event = requested("e1", _book())
    state, fx = reducer.apply(
        None, msgspec.structs.replace(event, payload={**event.payload, "pool": "mine"}), 1
    )
    assert state is not None and [(c.pool, c.keychain_check) for c in fx.commands] == [("mine", True)]


def test_a_templated_auth_makes_the_step_a_keychain_reader(reducer: Reducer) -> None:
    """``auth: "{{ pg_auth }}"`` may render to a declared entry: the step's command carries the
    declarations, so the worker finds the rendered name among them."""
    workflow = """
    - step: start
      tool: {kind: postgres, query: SELECT 1, auth: "{{ pg_auth }}"}
    """
    text = playbook(workflow, workload={"pg_auth": "pg_local"}) + (
        "keychain:\n  - {name: pg_local, kind: postgres_credential, env: PG_DSN}\n"
    )
    state, _ = reducer.apply(None, requested("e1", text), 1)
    assert state is not None
    _, fx = reducer.apply(state, answer(E.KEYCHAIN_RESOLVED), 2)
    (cmd,) = fx.commands
    assert cmd.step == "start" and [d.name for d in cmd.keychain] == ["pg_local"] and not cmd.keychain_check
