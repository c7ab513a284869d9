"""Raw JetStream step baseline, the denominator of the runtime's benchmark ratios.

The method of the JetStream limits measurement (``js_limits.py``'s ``step_seq_raw`` / ``step_c100_raw_msgspec``): a "step"
is command publish -> worker continuous pull -> event publish (awaiting the PubAck) -> controller
continuous pull -> next command, over two work-queue streams, with a ~500-byte msgspec JSON
envelope, worker and controller on separate connections in this process. No runtime code runs:
only `ContinuousPuller` (the consumer the runtime uses too).

``worker_process=True`` runs the worker side in a child process (``python -m bench.raw worker URL
STREAM``), js_limits.py's ``step_c100_2proc``: the denominator of the figures whose controller and
workers are separate processes (`bench.scale`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
import uuid
from typing import Any

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api

from noetl_stream.jetstream.connection import connect
from noetl_stream.jetstream.puller import ContinuousPuller
from noetl_stream.logs import configure
from noetl_stream.loop import run_event_loop

__all__ = ["envelope_bytes", "raw_concurrent_steps_per_s", "raw_seq_steps_per_s"]


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


def envelope_bytes() -> int:
    """Bytes of one raw message on the wire: subject and envelope (no headers)."""
    return len("BENCH_CMD_0123ABCD.e000000") + len(_envelope("e000000", 0, "command"))


async def raw_seq_steps_per_s(url: str, steps: int = 600, *, worker_process: bool = False) -> float:
    """Steps/s of one chain (each step waits for the previous one)."""
    return await _run(url, chains=1, steps=steps, worker_process=worker_process)


async def raw_concurrent_steps_per_s(
    url: str, chains: int = 100, steps: int = 40, *, worker_process: bool = False
) -> float:
    """Steps/s of `chains` chains running concurrently (the worker side in a child process if asked)."""
    return await _run(url, chains=chains, steps=steps, worker_process=worker_process)


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


def _worker_handler(js: JetStreamContext, evt: str) -> Any:
    async def on_command(msg: Msg) -> None:  # the worker; the "tool" is a no-op
        env = _decode(msg.data)
        await js.publish(f"{evt}.{env.execution_id}", _envelope(env.execution_id, env.seq, "event"))
        await msg.ack()

    return on_command


async def _worker_process_main(url: str, tag: str) -> None:
    """The worker side alone (``python -m bench.raw worker URL TAG``), until SIGTERM."""
    cmd, evt = f"BENCH_CMD_{tag}", f"BENCH_EVT_{tag}"
    nc: NATS = await connect(url, name="bench-worker")
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    on_command = _worker_handler(nc.jetstream(timeout=10), evt)
    async with ContinuousPuller(nc, cmd, "workers", on_command, max_concurrency=200, batch=200):
        await nc.flush()
        print("ready", flush=True)
        await stop.wait()
    await nc.close()


async def _start_worker_process(url: str, tag: str) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.raw",
        "worker",
        url,
        tag,
        stdout=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.DEVNULL,
        start_new_session=True,
    )
    assert proc.stdout is not None
    async with asyncio.timeout(30):
        line = await proc.stdout.readline()
    if line.strip() != b"ready":
        await _stop(proc)
        raise RuntimeError("the raw worker process did not start")
    return proc


async def _stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            async with asyncio.timeout(10):
                await proc.wait()
        except TimeoutError:
            os.kill(proc.pid, signal.SIGKILL)
            await proc.wait()


async def _run(url: str, chains: int, steps: int, worker_process: bool = False) -> float:
    if chains < 1 or steps < 1:
        raise ValueError("chains and steps must be >= 1")
    tag = uuid.uuid4().hex[:8].upper()
    cmd, evt = f"BENCH_CMD_{tag}", f"BENCH_EVT_{tag}"
    ncc: NATS = await connect(url, name="bench-controller")
    ncw: NATS = await connect(url, name="bench-worker")
    jsc, jsw = ncc.jetstream(timeout=10), ncw.jetstream(timeout=10)
    remaining = chains
    done = asyncio.Event()
    on_command = _worker_handler(jsw, evt)
    child: asyncio.subprocess.Process | None = None

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
        if worker_process:
            child = await _start_worker_process(url, tag)
        worker = ContinuousPuller(ncw, cmd, "workers", on_command, max_concurrency=200, batch=200)
        controller = ContinuousPuller(ncc, evt, "ctl", on_event, max_concurrency=200, batch=200)
        async with contextlib.AsyncExitStack() as stack:
            if child is None:
                await stack.enter_async_context(worker)
            await stack.enter_async_context(controller)
            await ncc.flush()
            t0 = time.perf_counter()
            await asyncio.gather(
                *(jsc.publish(f"{cmd}.e{i:06d}", _envelope(f"e{i:06d}", 0, "command")) for i in range(chains))
            )
            async with asyncio.timeout(300):
                await done.wait()
            elapsed = time.perf_counter() - t0
    finally:
        if child is not None:
            await _stop(child)
        for stream in (cmd, evt):
            try:
                await jsc.delete_stream(stream)
            except Exception:
                pass
        await ncw.close()
        await ncc.close()
    return chains * steps / elapsed


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "worker":
        configure("warning")
        run_event_loop(_worker_process_main(sys.argv[2], sys.argv[3]))
    else:
        sys.exit("usage: python -m bench.raw worker NATS_URL TAG")
