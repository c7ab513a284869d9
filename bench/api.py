"""API overhead: executions started per second through each way in, the same request body each time.

An execution counts as started when its ``playbook.execution.requested`` is stored (intake has decoded the
request, checked the playbook and recorded it), seen on a core subscription; the clock stops when every
call has returned and every execution has started.

* ``api_direct_starts_per_s``: a JetStream publish onto the request subject (``noetl.exec.request``),
  awaiting the stream's ack; the controller's intake picks the requests up from the stream;
* ``api_micro_starts_per_s``: a NATS request to the micro ``execute`` endpoint (intake runs before it
  replies with the execution id);
* ``api_rest_starts_per_s``: ``POST /api/executions`` (aiohttp client, keep-alive, bearer token; the same
  intake behind aiohttp, before the 201).

``concurrency`` calls are in flight at once; the caller is a separate NATS connection (and HTTP client)
in the bench process, so the runtime (controller, worker, REST server) shares its event loop as it does
for the other figures. Every started execution (a router step and a noop step) runs to the end, untimed,
before the next figure, so one way's backlog never slows the next.

    python -m bench.api [--quick] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from bench.runtime import chain_playbook
from noetl_stream.api import ApiServer
from noetl_stream.client.tracking import Completions
from noetl_stream.jetstream.connection import connect
from noetl_stream.protocol import events as E
from noetl_stream.protocol.wire import ExecutionRequest, encode, new_execution_id
from noetl_stream.runtime.local import Runtime

__all__ = ["ApiBench", "api_bench"]

TOKEN = "bench-token"
TEXT = chain_playbook(1, "api")
WAYS = ("direct", "micro", "rest")


def body(execution_id: str) -> bytes:
    return encode(ExecutionRequest(playbook=TEXT, file="api.yaml", execution_id=execution_id))


class ApiBench:
    """A client connection, an HTTP session and the controller's REST server, for the API figures."""

    def __init__(self, rt: Runtime, nc: NATS, session: aiohttp.ClientSession, server: ApiServer) -> None:
        self.rt, self.nc, self.session, self.server = rt, nc, session, server
        self.js = nc.jetstream()
        self.done = Completions(nc, rt.topology)
        self._waiting: set[str] = set()
        self._all_started = asyncio.Event()

    async def on_requested(self, msg: Msg) -> None:
        """``<prefix>.events.<execution_id>.playbook.execution.requested``: one more execution started."""
        self._waiting.discard(msg.subject.split(".")[2])
        if not self._waiting:
            self._all_started.set()

    async def direct(self, execution_id: str) -> None:
        await self.js.publish(
            self.rt.topology.request_subject,
            body(execution_id),
            headers={"Nats-Msg-Id": f"request:{execution_id}"},
        )

    async def micro(self, execution_id: str) -> None:
        reply = await self.nc.request(self.rt.topology.api_subject("execute"), body(execution_id), timeout=60)
        if (reply.headers or {}).get("Nats-Service-Error-Code"):
            raise RuntimeError(f"execute refused: {reply.data[:500]!r}")

    async def rest(self, execution_id: str) -> None:
        async with self.session.post(
            f"{self.server.url}/api/executions",
            data=body(execution_id),
            headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        ) as resp:
            text = await resp.read()
            if resp.status != 201:
                raise RuntimeError(f"POST /api/executions: {resp.status} {text[:500]!r}")

    async def starts_per_s(self, way: str, n: int, concurrency: int) -> float:
        """Start `n` executions `concurrency` calls at a time: executions started per second. Then wait,
        untimed, until all of them have finished (and check that they succeeded)."""
        start_one: Callable[[str], Awaitable[None]] = getattr(self, way)
        ids = [new_execution_id() for _ in range(n)]
        todo = iter(ids)
        self._waiting = set(ids)
        self._all_started.clear()

        async def caller() -> None:
            for execution_id in todo:
                await start_one(execution_id)

        t = time.perf_counter()
        async with asyncio.TaskGroup() as tg:
            for _ in range(min(concurrency, n)):
                tg.create_task(caller())
        async with asyncio.timeout(600):
            await self._all_started.wait()
        dt = time.perf_counter() - t
        finished = await asyncio.gather(*(self.done.wait(i, timeout=600) for i in ids))
        bad = [ev for ev in finished if ev.payload.get("status") != "success"]
        if bad:
            raise RuntimeError(f"{way}: {len(bad)} executions did not succeed: {bad[0].payload.get('error')}")
        return n / dt


@contextlib.asynccontextmanager
async def api_bench(rt: Runtime, url: str, concurrency: int) -> AsyncIterator[ApiBench]:
    """The REST server on the runtime's controller (stopped afterwards: its metrics observer would slow
    the other figures), a client connection and a keep-alive HTTP session."""
    server = ApiServer(rt.controller, "127.0.0.1", 0, (TOKEN,))
    await server.start()
    nc = await connect(url, name="bench-api-client")
    try:
        connector = aiohttp.TCPConnector(limit=concurrency)
        async with aiohttp.ClientSession(connector=connector) as session:
            bench = ApiBench(rt, nc, session, server)
            started = rt.topology.any_execution_filter(E.EXECUTION_REQUESTED)
            sub = await nc.subscribe(started, cb=bench.on_requested, pending_msgs_limit=1_000_000)
            try:
                async with bench.done:
                    yield bench
            finally:
                await sub.unsubscribe()
    finally:
        await nc.drain()
        await server.stop()


async def measure(
    rt: Runtime,
    url: str,
    add: Callable[[str, float], None],
    *,
    repeat: int,
    n: int,
    concurrency: int = 16,
    say: Callable[[str], None] = lambda _: None,
) -> None:
    """`repeat` rounds of the three ways, interleaved (one warm-up round first, not recorded)."""
    async with api_bench(rt, url, concurrency) as bench:
        for way in WAYS:
            await bench.starts_per_s(way, min(n, 50), concurrency)
        for i in range(repeat):
            say(
                f"api round {i + 1}/{repeat}: {n} executions started, {concurrency} at once (direct, micro, REST) ..."
            )
            for way in WAYS:
                add(f"api_{way}_starts_per_s", await bench.starts_per_s(way, n, concurrency))


def ratios(out: dict[str, object]) -> None:
    """``api_micro_ratio`` and ``api_rest_ratio``: starts/s through the API over a direct publish."""
    direct = out.get("api_direct_starts_per_s")
    for way in ("micro", "rest"):
        value = out.get(f"api_{way}_starts_per_s")
        if isinstance(direct, float) and isinstance(value, float) and direct:
            out[f"api_{way}_ratio"] = value / direct


def main() -> None:
    from noetl_stream.jetstream.embedded import EmbeddedNats
    from noetl_stream.logs import configure
    from noetl_stream.loop import run_event_loop
    from noetl_stream.runtime.local import local_runtime

    parser = argparse.ArgumentParser(prog="python -m bench.api")
    parser.add_argument("--quick", action="store_true", help="fewer executions (a smoke run)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    configure("warning")
    n = 200 if args.quick else 1000
    samples: dict[str, list[float]] = {}

    async def go(url: str) -> None:
        async with local_runtime(url, workers=1, concurrency=128) as rt:
            await measure(
                rt,
                url,
                lambda k, v: samples.setdefault(k, []).append(v),
                repeat=max(1, args.repeat),
                n=n,
                concurrency=args.concurrency,
                say=lambda s: print(s, file=sys.stderr, flush=True),
            )

    with EmbeddedNats() as server:
        run_event_loop(go(server.url))
    out: dict[str, object] = {k: statistics.median(v) for k, v in samples.items()}
    ratios(out)
    for k, v in out.items():
        print(f"{k:<26}  {v:,.2f}" if isinstance(v, float) else f"{k:<26}  {v}")
    print(f"(medians of {args.repeat} rounds of {n} executions, {args.concurrency} at once)")


if __name__ == "__main__":
    main()
