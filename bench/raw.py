"""Raw JetStream step baseline, the denominator of the runtime's benchmark ratios.

The method of ../shared/perf/js_limits.py ``step_seq_raw`` / ``step_c100_raw_msgspec``: a "step"
is command publish -> worker continuous pull -> event publish (awaiting the PubAck) -> controller
continuous pull -> next command, over two work-queue streams, with a ~500-byte msgspec JSON
envelope, worker and controller on separate connections in this process. No runtime code runs:
only `ContinuousPuller` (the consumer the runtime uses too).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api

from noetl_stream.natsconn import ContinuousPuller, connect

__all__ = ["raw_concurrent_steps_per_s", "raw_seq_steps_per_s"]


class Trace(msgspec.Struct):
    trace_id: str
    span_id: str


class Tool(msgspec.Struct):
    kind: str
    ref: str


class Envelope(msgspec.Struct):
    """The js_limits.py envelope (~500 bytes as JSON)."""

    v: int
    kind: str
    execution_id: str
    step: str
    seq: int
    attempt: int
    ts: float
    playbook: str
    node: str
    trace: Trace
    tool: Tool
    args: dict[str, Any]
    ctx: dict[str, Any]


_ARGS = {"items": [1, 2, 3], "name": "load_customers", "flag": True, "limit": 1000}
_CTX = {
    "workload": {"region": "west", "date": "2025-11-21"},
    "parent": None,
    "loop": {"index": 0, "size": 1000},
}
_TRACE = Trace("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")
_TOOL = Tool("python", "sha256:9f86d081884c7d659a2f")
_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(Envelope).decode


def _envelope(execution_id: str, seq: int, kind: str) -> bytes:
    return _encode(
        Envelope(
            v=1,
            kind=kind,
            execution_id=execution_id,
            step=f"step_{seq}",
            seq=seq,
            attempt=1,
            ts=time.time(),
            playbook="tests/fixtures/playbooks/bench/chain_10",
            node="worker-pool-a-0",
            trace=_TRACE,
            tool=_TOOL,
            args=_ARGS,
            ctx=_CTX,
        )
    )


async def raw_seq_steps_per_s(url: str, steps: int = 600) -> float:
    """Steps/s of one chain (each step waits for the previous one)."""
    return await _run(url, chains=1, steps=steps)


async def raw_concurrent_steps_per_s(url: str, chains: int = 100, steps: int = 40) -> float:
    """Steps/s of `chains` chains running concurrently."""
    return await _run(url, chains=chains, steps=steps)


async def _work_queue(js: JetStreamContext, name: str, consumer: str) -> None:
    await js.add_stream(
        name=name,
        subjects=[f"{name}.>"],
        storage=api.StorageType.FILE,
        retention=api.RetentionPolicy.WORK_QUEUE,
    )
    await js.add_consumer(
        name,
        durable_name=consumer,
        name=consumer,
        filter_subject=f"{name}.>",
        ack_policy=api.AckPolicy.EXPLICIT,
        max_ack_pending=20_000,
        max_waiting=512,
        ack_wait=60,
    )


async def _run(url: str, chains: int, steps: int) -> float:
    if chains < 1 or steps < 1:
        raise ValueError("chains and steps must be >= 1")
    tag = uuid.uuid4().hex[:8].upper()
    cmd, evt = f"BENCH_CMD_{tag}", f"BENCH_EVT_{tag}"
    ncc: NATS = await connect(url, name="bench-controller")
    ncw: NATS = await connect(url, name="bench-worker")
    jsc, jsw = ncc.jetstream(timeout=10), ncw.jetstream(timeout=10)
    remaining = chains
    done = asyncio.Event()

    async def on_command(msg: Msg) -> None:  # the worker; the "tool" is a no-op
        env = _decode(msg.data)
        await jsw.publish(f"{evt}.{env.execution_id}", _envelope(env.execution_id, env.seq, "event"))
        await msg.ack()

    async def on_event(msg: Msg) -> None:  # the controller
        nonlocal remaining
        env = _decode(msg.data)
        if env.seq + 1 < steps:
            await jsc.publish(
                f"{cmd}.{env.execution_id}", _envelope(env.execution_id, env.seq + 1, "command")
            )
        else:
            remaining -= 1
            if remaining == 0:
                done.set()
        await msg.ack()

    try:
        await _work_queue(jsc, cmd, "workers")
        await _work_queue(jsc, evt, "ctl")
        worker = ContinuousPuller(ncw, cmd, "workers", on_command, max_concurrency=200, batch=200)
        controller = ContinuousPuller(ncc, evt, "ctl", on_event, max_concurrency=200, batch=200)
        async with worker, controller:
            await ncc.flush()
            t0 = time.perf_counter()
            await asyncio.gather(
                *(jsc.publish(f"{cmd}.e{i:06d}", _envelope(f"e{i:06d}", 0, "command")) for i in range(chains))
            )
            async with asyncio.timeout(300):
                await done.wait()
            elapsed = time.perf_counter() - t0
    finally:
        for stream in (cmd, evt):
            try:
                await jsc.delete_stream(stream)
            except Exception:
                pass
        await ncw.close()
        await ncc.close()
    return chains * steps / elapsed
