"""The ``postgres`` tool's failure edges, end to end: what a policy sees for bad settings and timeouts."""

from __future__ import annotations

import msgspec
from helpers import playbook, run
from pgserver import PgServer

from noetl_stream.embedded import EmbeddedNats
from noetl_stream.local import local_runtime
from noetl_stream.subjects import Topology


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
    (row,) = r.result
    assert row["r"] == {"lower": 1, "upper": 5, "lower_inc": True, "upper_inc": False, "empty": False}
    assert row["e"]["empty"] is True and row["b"] == "101"
    assert row["whole"] == 42 and row["half"] == 1.5
