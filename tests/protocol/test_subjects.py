"""Names match DESIGN.md §3; bad prefixes, pools and ids are rejected before reaching NATS."""

from __future__ import annotations

import pytest

from noetl_stream.errors import ConfigurationError
from noetl_stream.protocol import events
from noetl_stream.protocol.subjects import (
    MAX_NEW_ID_LENGTH,
    MAX_TOKEN_LENGTH,
    SubjectError,
    Topology,
    TopologyError,
    check_new_id,
    check_token,
)


def test_default_names_match_the_design() -> None:
    t = Topology()
    assert (t.events_stream, t.commands_stream, t.requests_stream) == (
        "NOETL_EVENTS",
        "NOETL_COMMANDS",
        "NOETL_REQUESTS",
    )
    assert t.event_subject("e1", events.STEP_DONE) == "noetl.events.e1.step.done"
    assert t.event_subject("e1", events.LOOP_ITERATION_DONE) == "noetl.events.e1.loop.iteration.done"
    assert t.events_filter("e1") == "noetl.events.e1.>"
    assert t.command_subject("default", "e1") == "noetl.cmd.default.e1"
    assert t.pool_filter("gpu") == "noetl.cmd.gpu.>"
    assert t.request_subject == "noetl.exec.request"
    assert t.pool_consumer("gpu") == "pool-gpu"
    assert t.controller_events_consumer(0) == "controller-0"
    assert t.controller_requests_consumer == "controller-requests"
    assert t.executions_bucket == "noetl_executions"
    assert (t.ctx_bucket, t.loops_bucket, t.catalog_bucket, t.keychain_bucket) == (
        "noetl_ctx",
        "noetl_loops",
        "noetl_catalog",
        "noetl_keychain",
    )
    assert t.results_store == "noetl_results"
    assert t.api_subject("execute") == "noetl.api.execute"
    assert t.service_name == "noetl"


def test_controller_filters_cover_exactly_the_controller_input_events() -> None:
    filters = Topology(partitions=4).controller_event_filters(3)
    assert "noetl.events.*.3.step.done" in filters
    assert sorted(filters) == list(filters)
    assert {f.removeprefix("noetl.events.*.3.") for f in filters} == set(events.CONTROLLER_INPUT_EVENTS)


def test_partitions_are_stored_after_the_execution_id_so_one_history_is_still_one_filter() -> None:
    t = Topology(partitions=8)
    assert t.events_subject_transform == (
        "noetl.events.*.>",
        "noetl.events.{{wildcard(1)}}.{{partition(8,1)}}.>",
    )
    assert t.stored_event_filter("e1", events.STEP_DONE) == "noetl.events.e1.*.step.done"
    assert t.stored_any_execution_filter(events.STEP_DONE) == "noetl.events.*.*.step.done"
    assert t.controller_events_consumer(7) == "controller-7"
    with pytest.raises(TopologyError):
        t.controller_events_consumer(8)
    with pytest.raises(TopologyError):
        Topology(partitions=0)


def test_prefix_changes_every_name() -> None:
    t = Topology(prefix="acme-prod")
    assert t.events_stream == "ACME-PROD_EVENTS"
    assert t.command_subject("default", "x") == "acme-prod.cmd.default.x"
    assert t.ctx_bucket == "acme-prod_ctx"
    assert t.results_store == "acme-prod_results"


@pytest.mark.parametrize(
    "prefix", ["", "no.dots", "has space", "star*", "gt>", "Upper", "9lives", "a/b", "ok\n"]
)
def test_bad_prefix_is_rejected(prefix: str) -> None:
    with pytest.raises(SubjectError, match="invalid prefix"):
        Topology(prefix=prefix)


@pytest.mark.parametrize("pool", ["", "a.b", "a b", "*", ">", "a\tb"])
def test_bad_pool_is_rejected(pool: str) -> None:
    t = Topology()
    with pytest.raises(SubjectError, match="invalid pool name"):
        t.command_subject(pool, "e1")
    with pytest.raises(SubjectError):
        t.pool_consumer(pool)


@pytest.mark.parametrize("execution_id", ["", "a.b", "a b", "*", ">", "x\n"])
def test_bad_execution_id_is_rejected(execution_id: str) -> None:
    t = Topology()
    with pytest.raises(SubjectError, match="invalid execution id"):
        t.event_subject(execution_id, events.STEP_DONE)
    with pytest.raises(SubjectError):
        t.events_filter(execution_id)
    with pytest.raises(SubjectError):
        check_token(execution_id)


def test_opaque_ids_are_accepted() -> None:
    assert check_token("01JD0F6Q7S3W0M8X9Y-a_b") == "01JD0F6Q7S3W0M8X9Y-a_b"


def test_bad_event_name_is_rejected() -> None:
    with pytest.raises(SubjectError, match="invalid event name"):
        Topology().event_subject("e1", "step..done")


def test_subject_errors_are_configuration_and_value_errors() -> None:
    assert issubclass(SubjectError, ConfigurationError) and issubclass(SubjectError, ValueError)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"duplicate_window_s": 60},
        {"replicas": 0},
        {"storage": "disk"},
        {"events_max_age_s": 30},
        {"command_max_deliver": 0},
        {"command_ack_wait_s": 0},
    ],
)
def test_bad_settings_are_rejected(kwargs: dict[str, object]) -> None:
    with pytest.raises(TopologyError):
        Topology(**kwargs)  # type: ignore[arg-type]


def test_a_token_longer_than_a_subject_can_carry_is_refused() -> None:
    """An id of any length once made the server close the controller's connection (its subjects overflowed
    the 4 KiB control line). New ids are held to 128 characters; ids of existing executions are read up
    to 1024, so that none started before that limit is lost to it."""
    assert check_token("a" * MAX_TOKEN_LENGTH, "execution id") == "a" * MAX_TOKEN_LENGTH
    with pytest.raises(SubjectError, match="invalid execution id of 1025 characters: at most 1024"):
        check_token("a" * (MAX_TOKEN_LENGTH + 1), "execution id")
    assert check_new_id("a" * MAX_NEW_ID_LENGTH) == "a" * MAX_NEW_ID_LENGTH
    with pytest.raises(SubjectError, match="invalid execution id of 129 characters: at most 128"):
        check_new_id("a" * (MAX_NEW_ID_LENGTH + 1))
    assert Topology().event_subject("a" * 500, "step.done").count("a" * 500) == 1  # an older, longer id
