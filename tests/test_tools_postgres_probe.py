"""The ``postgres`` tool's failure edges, end to end: what a policy sees for bad settings, timeouts
and results with two columns of one name."""

from __future__ import annotations

import msgspec
import pytest
from helpers import playbook, run
from pgserver import PgServer

from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.protocol.subjects import Topology
from noetl_stream.runtime.local import local_runtime


async def test_dsn_that_is_not_a_url_is_a_config_error(nats_server: EmbeddedNats, topology: Topology) -> None:
    # libpq's key=value form is not a dsn asyncpg reads: a setting to fix (config_error), never a
    # pg_error that looks like a database problem, and the password in it is not in the error.
    text = playbook(
        """
        - step: start
          tool:
            kind: postgres
            dsn: "host=127.0.0.1 port=5432 user=app password=kv-SECRET-pw-91 dbname=app"
            query: SELECT 1
        """
    )
    async with local_runtime(nats_server.url, topology=topology) as rt:
        r = await run(rt, text)
    assert r.status == "failed"
    err = r.step_error("start")
    assert err["kind"] == "config_error" and err["retryable"] is False, err
    assert "invalid connection settings" in err["message"]
    assert "kv-SECRET-pw-91" not in msgspec.json.encode([err, *r.tasks("start")]).decode()


async def test_statement_timeout_names_the_limit(
    nats_server: EmbeddedNats, topology: Topology, pg: PgServer
) -> None:
    text = playbook(
        """
        - step: start
          tool:
            - name: slow
              kind: postgres
              dsn: "{{ dsn }}"
              query: SELECT pg_sleep(5)
              spec:
                timeout: {connect: 10, statement: 0.2}
                policy:
                  rules:
                    - when: "{{ outcome.status == 'error' }}"
                      then: {do: continue}
            - name: out
              kind: noop
              result: "{{ _prev }}"
        """,
        workload={"dsn": pg.dsn},
    )
    async with local_runtime(nats_server.url, topology=topology) as rt:
        r = await run(rt, text)
    assert r.status == "success", r.summary
    err = r.tasks("start", "slow")[0].payload["error"]
    assert err["kind"] == "timeout" and err["retryable"] is True
    assert err["message"] == "postgres: statement timed out after 0.2s (spec.timeout.statement)"
    assert pg.password not in msgspec.json.encode(r.tasks("start")).decode()


async def test_ranges_bit_strings_and_numerics_come_back_as_json(
    nats_server: EmbeddedNats, topology: Topology, pg: PgServer
) -> None:
    """A range is its bounds (not its repr), a bit string its digits; a numeric is a number: an integer
    when whole and below 2**53, else a float (digits beyond a double's are lost; docs/tools.md)."""
    text = playbook(
        """
        - step: start
          tool:
            kind: postgres
            dsn: "{{ dsn }}"
            query: >-
              SELECT int4range(1, 5) AS r, 'empty'::int4range AS e, B'101'::bit(3) AS b,
                     42::numeric AS whole, 1.5::numeric AS half
        """,
        workload={"dsn": pg.dsn},
    )
    async with local_runtime(nats_server.url, topology=topology) as rt:
        r = await run(rt, text)
    assert r.status == "success", r.summary.error
    (row,) = r.result["rows"]
    assert row["r"] == {"lower": 1, "upper": 5, "lower_inc": True, "upper_inc": False, "empty": False}
    assert row["e"]["empty"] is True and row["b"] == "101"
    assert row["whole"] == 42 and row["half"] == 1.5


@pytest.mark.parametrize(
    ("sql", "names"),
    [
        ("SELECT 1 AS a, 2 AS a, 3 AS b", "'a'"),
        ("SELECT * FROM (VALUES (1, 'x')) AS t(id, v) JOIN (VALUES (1, 'y')) AS u(id, v) ON t.id = u.id",
         "'id', 'v'"),
    ],
)  # fmt: skip
async def test_duplicate_column_names_are_an_error_naming_them(
    nats_server: EmbeddedNats, topology: Topology, pg: PgServer, sql: str, names: str
) -> None:
    # A row is a mapping: two columns of one name would keep one value and silently lose the other.
    text = playbook(
        """
        - step: start
          tool: {kind: postgres, dsn: "{{ dsn }}", query: "{{ sql }}"}
        """,
        workload={"dsn": pg.dsn, "sql": sql},
    )
    async with local_runtime(nats_server.url, topology=topology) as rt:
        r = await run(rt, text)
    assert r.status == "failed"
    err = r.step_error("start")
    assert err["kind"] == "pg_error" and err["retryable"] is False, err
    assert f"duplicate column names {names}" in err["message"] and "alias" in err["message"], err
    assert pg.password not in msgspec.json.encode(r.tasks("start")).decode()


async def test_duplicate_columns_in_a_transaction_roll_it_back(
    nats_server: EmbeddedNats, topology: Topology, pg: PgServer
) -> None:
    # The failing statement fails the whole transaction: the insert before it is not kept.
    table = "dup_" + topology.prefix
    text = playbook(
        f"""
        - step: start
          tool:
            - name: make
              kind: postgres
              dsn: "{{{{ dsn }}}}"
              command: CREATE TABLE {table} (id int)
            - name: both
              kind: postgres
              dsn: "{{{{ dsn }}}}"
              transaction: true
              command:
                - INSERT INTO {table} VALUES (1)
                - query: SELECT id, id FROM {table}
              spec:
                policy:
                  rules:
                    - when: "{{{{ outcome.status == 'error' }}}}"
                      then: {{do: continue}}
            - name: count
              kind: postgres
              dsn: "{{{{ dsn }}}}"
              query: SELECT count(*) AS n FROM {table}
        """,
        workload={"dsn": pg.dsn},
    )
    async with local_runtime(nats_server.url, topology=topology) as rt:
        r = await run(rt, text)
    assert r.status == "success", r.summary
    err = r.tasks("start", "both")[0].payload["error"]
    assert err["kind"] == "pg_error" and "duplicate column names 'id'" in err["message"], err
    assert r.step_result("start")["rows"] == [{"n": 0}]
