"""What a controller or worker does to the installation's JetStream objects when it starts.

It creates what is missing, with its own settings. It never changes the settings an installation
chose: one worker started with ``NOETL_EVENTS_MAX_AGE_S=3600`` used to cut every execution's history
to an hour at once, and give every worker of the pool its ack wait, without a word. Now it warns,
naming each setting (the installation's value and its own), and runs with the installation's. The
explicit ``noetl-stream provision`` still changes them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import msgspec
import structlog
from click.testing import CliRunner
from eventlog import wait_processed
from faultbooks import HOLD, hold_starts
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from procs import Processes

from noetl_stream.cli import main
from noetl_stream.client.submit import request_for, submit
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.kv.history import read_events
from noetl_stream.kv.provision import provision, stream_names
from noetl_stream.protocol import events as E
from noetl_stream.protocol.subjects import Topology
from noetl_stream.runtime.services import provision_at_start

THIRTY_DAYS_S = 30 * 24 * 3600.0


def other_settings(topology: Topology) -> Topology:
    """The probe's worker: its own retention, ack wait and deliveries."""
    return msgspec.structs.replace(
        topology, events_max_age_s=3600.0, command_ack_wait_s=60.0, command_max_deliver=3
    )


async def settings(js: JetStreamContext, topology: Topology) -> dict[str, Any]:
    pool = (await js.consumer_info(topology.commands_stream, topology.pool_consumer("default"))).config
    requests = (
        await js.consumer_info(topology.requests_stream, topology.controller_requests_consumer)
    ).config
    advisories = await js.consumer_info(topology.advisories_stream, topology.controller_advisories_consumer)
    return {
        "events max_age": (await js.stream_info(topology.events_stream)).config.max_age,
        "pool ack_wait": pool.ack_wait,
        "pool max_deliver": pool.max_deliver,
        "requests ack_wait": requests.ack_wait,
        "advisories ack_wait": advisories.config.ack_wait,
    }


INSTALLED = {
    "events max_age": THIRTY_DAYS_S,
    "pool ack_wait": 30.0,
    "pool max_deliver": 5,
    "requests ack_wait": 30.0,
    "advisories ack_wait": 30.0,
}


def differences(logs: list[MutableMapping[str, Any]]) -> dict[str, MutableMapping[str, Any]]:
    """The ``provision.settings_differ`` warnings, by object (each object is named once)."""
    warnings = [e for e in logs if e["event"] == "provision.settings_differ"]
    assert all(e["log_level"] == "warning" for e in warnings)
    by_object = {e["object"]: e for e in warnings}
    assert len(by_object) == len(warnings), warnings
    return by_object


async def test_a_process_with_other_settings_leaves_the_installation_as_it_is_and_says_so(
    nc: NATS, js: JetStreamContext, topology: Topology
) -> None:
    await provision(js, topology)  # the installation, with the defaults
    assert await settings(js, topology) == INSTALLED

    with structlog.testing.capture_logs() as logs:
        await provision_at_start(nc, other_settings(topology), ("default",))

    assert await settings(js, topology) == INSTALLED
    said = differences(logs)
    assert set(said) == {
        f"stream:{topology.events_stream}",
        f"consumer:{topology.commands_stream}/{topology.pool_consumer('default')}",
        f"consumer:{topology.requests_stream}/{topology.controller_requests_consumer}",
        f"consumer:{topology.advisories_stream}/{topology.controller_advisories_consumer}",
    }
    assert said[f"stream:{topology.events_stream}"]["settings"] == {
        "max_age": {"existing": THIRTY_DAYS_S, "this_process": 3600.0}
    }
    assert said[f"consumer:{topology.commands_stream}/{topology.pool_consumer('default')}"]["settings"] == {
        "ack_wait": {"existing": 30.0, "this_process": 60.0},
        "max_deliver": {"existing": 5, "this_process": 3},
    }
    assert all("noetl-stream provision" in e["fix"] for e in said.values())

    with structlog.testing.capture_logs() as logs:  # a process with the installation's settings: silent
        await provision_at_start(nc, topology, ("default",))
    assert differences(logs) == {}


async def test_the_provision_command_changes_the_settings_and_a_start_does_not_undo_it(
    nc: NATS, js: JetStreamContext, topology: Topology, nats_server: EmbeddedNats
) -> None:
    await provision(js, topology)
    env = {
        "NOETL_NATS_URL": nats_server.url,
        "NOETL_PREFIX": topology.prefix,
        "NOETL_EVENTS_MAX_AGE_S": "3600",
        "NOETL_COMMAND_ACK_WAIT_S": "60",
        "NOETL_COMMAND_MAX_DELIVER": "3",
    }
    out = await asyncio.to_thread(CliRunner().invoke, main, ["provision"], env=env)
    assert out.exit_code == 0, out.output
    assert f"stream:{topology.events_stream}" in json.loads(out.output)["updated"]
    changed = {
        "events max_age": 3600.0,
        "pool ack_wait": 60.0,
        "pool max_deliver": 3,
        "requests ack_wait": 60.0,
        "advisories ack_wait": 60.0,
    }
    assert await settings(js, topology) == changed

    with structlog.testing.capture_logs() as logs:  # a process still configured with the old ones
        await provision_at_start(nc, topology, ("default",))
    assert await settings(js, topology) == changed
    assert differences(logs)[f"stream:{topology.events_stream}"]["settings"] == {
        "max_age": {"existing": 3600.0, "this_process": THIRTY_DAYS_S}
    }


async def test_what_is_missing_is_created_at_start_with_the_process_settings(
    nc: NATS, js: JetStreamContext, topology: Topology
) -> None:
    mine = other_settings(topology)
    with structlog.testing.capture_logs() as logs:
        await provision_at_start(nc, mine, ("default",))
    assert differences(logs) == {}
    for name in stream_names(topology):
        await js.stream_info(name)
    assert await settings(js, topology) == {
        "events max_age": 3600.0,
        "pool ack_wait": 60.0,
        "pool max_deliver": 3,
        "requests ack_wait": 60.0,
        "advisories ack_wait": 60.0,
    }

    # A worker of a new pool in that installation: its consumer is created, with its own settings.
    await provision_at_start(nc, topology, ("gpu",))
    gpu = (await js.consumer_info(topology.commands_stream, topology.pool_consumer("gpu"))).config
    assert (gpu.ack_wait, gpu.max_deliver) == (30.0, 5)
    assert (await js.stream_info(topology.events_stream)).config.max_age == 3600.0


INSTALLED_ACK_WAIT_S = 1.5


async def test_a_worker_keeps_its_commands_alive_by_the_installations_ack_wait(
    nats_server: EmbeddedNats, nc: NATS, js: JetStreamContext, topology: Topology, tmp_path: Path
) -> None:
    """The installation redelivers an unacknowledged command after 1.5 s; the processes are configured
    with 30 s. A worker that kept its command alive every 10 s (a third of its own setting) would see a
    4 s task delivered again, to run twice."""
    installed = msgspec.structs.replace(topology, command_ack_wait_s=INSTALLED_ACK_WAIT_S)
    await provision(js, installed, ("default",))
    runs = tmp_path / "runs.txt"
    configured = msgspec.structs.replace(topology, command_ack_wait_s=30.0)
    with Processes(nats_server.url, configured, tmp_path / "logs") as p:
        p.controller()
        worker = p.worker("w1", concurrency=2)
        eid = await submit(nc, topology, request_for(HOLD, "hold.yaml", {"path": str(runs), "hold": 4}))
        await wait_processed(js, topology, [eid], timeout=60)
        log = worker.log_path.read_text()

    started = [ev async for _, ev in read_events(js, topology, eid) if ev.name == E.STEP_STARTED]
    assert len(started) == 1, started
    assert hold_starts(runs) == [worker.pid], "the task ran more than once"
    pool = await js.consumer_info(topology.commands_stream, topology.pool_consumer("default"))
    assert pool.config.ack_wait == INSTALLED_ACK_WAIT_S
    warnings = [json.loads(line) for line in log.splitlines() if '"provision.settings_differ"' in line]
    said = {w["object"]: w["settings"] for w in warnings}
    assert said[f"consumer:{topology.commands_stream}/{topology.pool_consumer('default')}"] == {
        "ack_wait": {"existing": INSTALLED_ACK_WAIT_S, "this_process": 30.0}
    }


async def test_the_partition_count_and_lease_ttl_are_the_installations_and_named_when_they_differ(
    nc: NATS, js: JetStreamContext, topology: Topology
) -> None:
    installed = msgspec.structs.replace(topology, partitions=4, lease_ttl_s=3.0)
    await provision(js, installed)
    with structlog.testing.capture_logs() as logs:  # defaults: 8 partitions, 10 s, 30 days; here 1 hour
        await provision_at_start(nc, msgspec.structs.replace(topology, events_max_age_s=3600.0), ("default",))
    said = differences(logs)
    assert set(said) == {f"stream:{topology.events_stream}", f"kv:{topology.leases_bucket}"}
    assert said[f"stream:{topology.events_stream}"]["settings"] == {  # one warning for the stream
        "partitions": {"existing": 4, "this_process": 8},
        "max_age": {"existing": THIRTY_DAYS_S, "this_process": 3600.0},
    }
    assert said[f"kv:{topology.leases_bucket}"]["settings"] == {
        "max_age": {"existing": 3.0, "this_process": 10.0}
    }
    leases = (await js.stream_info(f"KV_{topology.leases_bucket}")).config
    assert leases.max_age == 3.0
    names = {c.name for c in await js.consumers_info(topology.events_stream)}
    assert names == {topology.controller_events_consumer(p) for p in range(4)}
