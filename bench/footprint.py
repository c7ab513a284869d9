"""What one noop step writes to JetStream: messages and bytes per step, by kind, and what each is for.

A tap (a separate connection with core subscriptions) sees every message as it is published: the
execution's events (``<prefix>.events.<id>.>``), its commands (``<prefix>.cmd.*.<id>``), its request,
KV writes (``$KV.<bucket>.>``: snapshots, ctx, checkpoints), object-store writes (``$O.<store>.>``) and
consumer acks (``$JS.ACK.<stream>.>``). Two chains of noop steps (``short`` and ``long`` steps) run one
after the other on an otherwise idle installation; the difference divided by ``long - short`` is the
cost of one more step, what the short chain writes beyond ``short`` such steps is the per-execution
cost. Bytes are what goes on the wire per message (subject, headers, body); the events stream's own
byte count (``stream_info``, stored with its partition token) is reported next to them.

The raw JetStream round trip (`bench.raw`) writes two messages per step: a command and an event of
`raw.envelope_bytes()` each.

    python -m bench.footprint
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from nats.aio.msg import Msg

from bench import raw
from bench.runtime import Runtime, chain_playbook
from noetl_stream.client.submit import request_for, submit
from noetl_stream.client.tracking import Completions
from noetl_stream.jetstream.connection import connect
from noetl_stream.protocol.wire import new_execution_id

__all__ = ["PURPOSE", "footprint"]

PURPOSE = {
    "step.scheduled": "controller: the step run exists (its args, pool); replay and inspect start from it",
    "step.started": "worker: a worker took the command (which worker, when): running vs queued "
    "(in step.done's message when the step ended before it was published)",
    "task.started": "worker: the task began (kind, attempt); per-task timing and retries (carried, idem)",
    "task.done": "worker: the task's outcome (status, result, attempt); per-task history (carried, idem)",
    "step.done": "worker: the boundary the controller folds (result, ctx patches): the only input; its "
    "message also carries the step run's step.started, task.started and task.done (carried.py)",
    "next.evaluated": "controller: which arcs fired and why (routing decision, audit)",
    "command": "controller -> worker: the step definition, args and the results its templates read",
    "ack": "consumer ack of a delivered event (controller) or command (worker)",
    "snapshot": "controller: execution state in the executions bucket (bounded replay after a restart)",
    "request": "client: the execution request (playbook text, payload) on the requests stream",
    "playbook.execution.requested": "controller intake: the request recorded in the execution's history",
    "playbook.request.evaluated": "controller: the compiled playbook's hash, name, warnings",
    "workflow.started": "controller: the execution's merged workload",
    "workflow.finished": "controller: final status, error and per-step statuses",
    "playbook.processed": "controller: the same summary, the one event clients wait for",
}


def _header_bytes(headers: dict[str, str] | None) -> int:
    if not headers:
        return 0
    return len(b"NATS/1.0\r\n\r\n") + sum(len(k) + len(v) + 4 for k, v in headers.items())


class Tap:
    """Counts (and sizes) every message published for one execution, by kind."""

    def __init__(self, execution_id: str, prefix: str) -> None:
        self.execution_id, self.prefix = execution_id, prefix
        self.count: dict[str, int] = defaultdict(int)
        self.bytes: dict[str, int] = defaultdict(int)

    def kind(self, subject: str) -> str | None:
        tokens = subject.split(".")
        if subject.startswith(f"{self.prefix}.events."):
            return ".".join(tokens[3:]) if tokens[2] == self.execution_id else None
        if subject.startswith(f"{self.prefix}.cmd."):
            return "command" if tokens[-1] == self.execution_id else None
        if subject.startswith("$JS.ACK."):
            return f"ack {tokens[2]}"
        if subject.startswith("$KV."):
            if tokens[1].endswith("_leases"):
                return None  # lease renewals: per second per controller, not per step
            return "snapshot" if tokens[1].endswith("_executions") else f"kv {tokens[1]}"
        if subject.startswith("$O."):
            return f"object {tokens[1]}"
        if subject == f"{self.prefix}.exec.request":
            return "request"
        return None

    async def on_msg(self, msg: Msg) -> None:
        kind = self.kind(msg.subject)
        if kind is None:
            return
        self.count[kind] += 1
        self.bytes[kind] += len(msg.subject) + len(msg.data) + _header_bytes(msg.headers)


async def _tapped_run(rt: Runtime, url: str, steps: int) -> tuple[Tap, int]:
    """Run one chain of `steps` noop steps with a tap on; (tap, bytes the events stream grew by)."""
    eid = new_execution_id()
    tap = Tap(eid, rt.topology.prefix)
    nc = await connect(url, name="bench-tap")
    js = rt.nc.jetstream()
    try:
        for subject in (f"{rt.topology.prefix}.>", "$KV.>", "$O.>", "$JS.ACK.>"):
            await nc.subscribe(subject, cb=tap.on_msg)
        await nc.flush()
        before = (await js.stream_info(rt.topology.events_stream)).state.bytes
        async with Completions(rt.nc, rt.topology) as done:
            await submit(
                rt.nc, rt.topology, request_for(chain_playbook(steps, f"fp{steps}"), "fp.yaml", None, eid)
            )
            ev = await done.wait(eid, timeout=300)
        if ev.payload.get("status") != "success":
            raise RuntimeError(f"footprint chain: {ev.payload.get('status')} {ev.payload.get('error')}")
        await asyncio.sleep(1.5)  # the last acks and the final snapshot
        await nc.flush()
        after = (await js.stream_info(rt.topology.events_stream)).state.bytes
    finally:
        with contextlib.suppress(Exception):
            await nc.drain()
    return tap, after - before


def _events(tap: Tap) -> tuple[int, int]:
    """(count, bytes) of the execution's events in a tap."""
    keys = [k for k in tap.count if k not in ("command", "request", "snapshot") and " " not in k]
    return sum(tap.count[k] for k in keys), sum(tap.bytes[k] for k in keys)


async def footprint(
    rt: Runtime, url: str, short: int = 10, long: int = 110, say: Callable[[str], None] = print
) -> dict[str, Any]:
    """Messages and bytes written per noop step (and per execution), by kind; see the module docstring."""
    say(f"footprint: chains of {short} and {long} noop steps with a tap on every write ...")
    await _tapped_run(rt, url, 3)  # warm: the plan cache, the consumers
    a, a_stored = await _tapped_run(rt, url, short)
    b, b_stored = await _tapped_run(rt, url, long)
    n = long - short
    kinds = sorted(set(a.count) | set(b.count))
    per_step = {
        k: {"count": (b.count[k] - a.count[k]) / n, "bytes": (b.bytes[k] - a.bytes[k]) / n} for k in kinds
    }
    per_execution = {
        k: {
            "count": a.count[k] - short * per_step[k]["count"],
            "bytes": a.bytes[k] - short * per_step[k]["bytes"],
        }
        for k in kinds
    }
    (ea, ba), (eb, bb) = _events(a), _events(b)
    events_per_step, event_bytes_per_step = (eb - ea) / n, (bb - ba) / n
    commands = per_step.get("command", {"count": 0.0, "bytes": 0.0})
    raw_bytes = raw.envelope_bytes()
    out: dict[str, Any] = {
        "footprint_events_per_step": events_per_step,
        "footprint_event_bytes_per_step": event_bytes_per_step,
        "footprint_stored_event_bytes_per_step": (b_stored - a_stored) / n,
        "footprint_commands_per_step": commands["count"],
        "footprint_command_bytes_per_step": commands["bytes"],
        "footprint_messages_per_step": events_per_step + commands["count"],
        "footprint_bytes_per_step": event_bytes_per_step + commands["bytes"],
        "footprint_acks_per_step": sum(v["count"] for k, v in per_step.items() if k.startswith("ack ")),
        "footprint_kv_writes_per_step": sum(
            v["count"] for k, v in per_step.items() if k == "snapshot" or k.startswith(("kv ", "object "))
        ),
        "raw_messages_per_step": 2.0,
        "raw_bytes_per_step": 2.0 * raw_bytes,
    }
    out["footprint_messages_ratio"] = out["footprint_messages_per_step"] / out["raw_messages_per_step"]
    out["footprint_bytes_ratio"] = out["footprint_bytes_per_step"] / out["raw_bytes_per_step"]
    out["footprint"] = {
        "short_steps": short,
        "long_steps": long,
        "per_step": per_step,
        "per_execution": per_execution,
        "purpose": {k: PURPOSE.get(k.split(" ")[0], "") for k in kinds},
    }
    return out


def table(fp: dict[str, Any]) -> str:
    """The per-step table as Markdown (what docs/performance.md shows)."""
    detail = fp["footprint"]
    lines = [
        "| written | per step | bytes per step | per execution | what it is for |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for kind, v in sorted(detail["per_step"].items(), key=lambda kv: (-kv[1]["count"], kv[0])):
        pe = detail["per_execution"][kind]["count"]
        lines.append(
            f"| `{kind}` | {v['count']:.2f} | {v['bytes']:,.0f} | {pe:.1f} | {detail['purpose'].get(kind, '')} |"
        )
    return "\n".join(lines)


async def _main() -> None:  # pragma: no cover - manual entry point
    from noetl_stream.jetstream.embedded import EmbeddedNats
    from noetl_stream.runtime.local import local_runtime

    with EmbeddedNats() as server:
        async with local_runtime(server.url, workers=1, concurrency=128) as rt:
            fp = await footprint(rt, server.url)
    print(table(fp))
    for k, v in fp.items():
        if isinstance(v, float):
            print(f"{k:<40} {v:,.2f}")


if __name__ == "__main__":
    import argparse

    from noetl_stream.logs import configure
    from noetl_stream.loop import run_event_loop

    argparse.ArgumentParser(
        prog="python -m bench.footprint",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    ).parse_args()
    configure("warning")
    run_event_loop(_main())
