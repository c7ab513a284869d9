"""``noetl-stream events ID [--follow] [--json]``: a readable timeline, or the raw events."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess

import msgspec
from helpers import playbook
from procs import NOETL_STREAM, run_cli

from noetl_stream.client.submit import request_for, submit
from noetl_stream.client.timeline import Timeline
from noetl_stream.client.tracking import follow
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.protocol.wire import Event, new_execution_id
from noetl_stream.runtime.local import Runtime

TEXT = playbook(
    """
    - step: start
      next: {arcs: [{step: each}]}
    - step: each
      loop: {in: "{{ [1, 2, 3] }}", iterator: n}
      tool: {kind: python, args: {n: "{{ iter.n }}"}, code: "result = n"}
      next: {arcs: [{step: boom}]}
    - step: boom
      tool:
        - name: divide
          kind: python
          code: "result = 1 / 0"
    """,
    name="timeline",
)
LINE = re.compile(r"^\s*\+(\d+\.\d{3})s  (\S+)")


def env(nats_server: EmbeddedNats, runtime: Runtime) -> dict[str, str]:
    return {**os.environ, "NOETL_NATS_URL": nats_server.url, "NOETL_PREFIX": runtime.topology.prefix}


async def test_follow_prints_a_readable_timeline_until_the_execution_ends(
    nats_server: EmbeddedNats, runtime: Runtime
) -> None:
    execution_id = new_execution_id()
    proc = await asyncio.create_subprocess_exec(
        str(NOETL_STREAM),
        "events",
        execution_id,
        "--follow",
        env=env(nats_server, runtime),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        await submit(runtime.nc, runtime.topology, request_for(TEXT, "t.yaml", execution_id=execution_id))
        events: list[Event] = []
        await follow(runtime.nc, runtime.topology, execution_id, events.append, timeout=30)
        async with asyncio.timeout(30):
            out, err = await proc.communicate()  # --follow ends by itself after playbook.processed
    finally:
        if proc.returncode is None:
            os.kill(proc.pid, signal.SIGKILL)
            await proc.wait()
    assert proc.returncode == 0, err.decode()
    header, *lines = out.decode().splitlines()

    assert header == Timeline.HEADER
    assert len(lines) == len(events)
    parsed = [LINE.match(line) for line in lines]
    assert all(parsed), lines
    assert [m.group(2) for m in parsed if m] == [e.name for e in events]
    offsets = [float(m.group(1)) for m in parsed if m]
    assert offsets[0] == 0.0 and offsets == sorted(offsets)

    (failed_task,) = [line for line in lines if " task.done " in line and "boom-1.divide.1" in line]
    assert re.search(
        r"  boom\s+boom-1\.divide\.1\s+error\s+\d+ms  python_error: ZeroDivisionError: division by zero",
        failed_task,
    )
    (iteration,) = [line for line in lines if " loop.iteration.done " in line and "each-1.2 " in line]
    assert re.search(r"  each\s+each-1\.2\s+ok\s+\d+ms", iteration)
    (loop_done,) = [line for line in lines if " loop.done " in line]
    assert "3/3 done, 0 failed" in loop_done
    assert re.search(r" playbook\.processed\s+failed\s+\d", lines[-1])
    assert all("\n" not in line and len(line) < 300 for line in lines)


async def test_json_prints_the_raw_events(nats_server: EmbeddedNats, runtime: Runtime) -> None:
    events: list[Event] = []
    summary = await runtime.run_playbook(TEXT, "t.yaml", on_event=events.append, timeout=30)

    code, out, err = await run_cli(env(nats_server, runtime), "events", summary.execution_id, "--json")

    assert code == 0, err
    printed = [msgspec.json.decode(line, type=Event) for line in out.splitlines()]
    assert printed == events
