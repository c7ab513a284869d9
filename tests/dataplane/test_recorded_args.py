"""What a ``task.done`` records of the args its task ran with: the args as JSON up to
``ARGS_RECORD_LIMIT`` bytes, else only their size; -1 for args that have no JSON form."""

from __future__ import annotations

import datetime
import json

from noetl_stream.dataplane.pipeline import ARGS_RECORD_LIMIT, recorded_args
from noetl_stream.dsl.views import result_view


def test_args_are_recorded_as_plain_json() -> None:
    view = result_view({"id": 7, "tags": ["a"]})  # a step's result passed on as an argument
    got = recorded_args({"args": {"user": view, "on": datetime.date(2026, 1, 2), "n": 1.5}})
    assert got == {"args": {"user": {"id": 7, "tags": ["a"]}, "on": "2026-01-02", "n": 1.5}}
    assert type(got["args"]["user"]) is dict  # not the view: it travels as a value


def test_args_over_the_limit_are_recorded_as_their_size_only() -> None:
    rows = [{"a": i, "b": "x" * 20} for i in range(1000)]
    size = len(json.dumps({"rows": rows}, separators=(",", ":")))
    assert size > ARGS_RECORD_LIMIT
    assert recorded_args({"args": {"rows": rows}}) == {"args_bytes": size}
    at_limit = {"s": "x" * (ARGS_RECORD_LIMIT - len('{"s":""}'))}
    assert recorded_args({"args": at_limit}) == {"args": at_limit}


def test_args_without_a_json_form_and_tasks_without_args() -> None:
    assert recorded_args({"args": {"handle": object()}}) == {"args_bytes": -1}
    assert recorded_args({}) == {}
