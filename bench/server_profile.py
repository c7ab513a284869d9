"""Where nats-server's time goes: its own CPU profile during the 100-concurrent workload.

nats-server serves Go's pprof when started with ``prof_port``. This starts an embedded server with it,
runs rounds of 100 concurrent executions of 40 noop steps in this process (the ``concurrent_steps_per_s``
workload of `bench.runtime`), takes a CPU profile of the server over ``--duration`` seconds of them, and
prints its functions by own (self) and total (cumulative) share of the samples. No Go toolchain is
needed: `read_profile` reads pprof's format (gzipped ``profile.proto``) itself.

    .venv/bin/python -m bench.server_profile [--duration 6] [--partitions 8] [--top 25] [--out FILE]

``--out`` keeps the raw profile (``go tool pprof`` reads it elsewhere).
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import os
import socket
import tempfile
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from bench import runtime
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.logs import configure
from noetl_stream.loop import run_event_loop
from noetl_stream.protocol.subjects import Topology
from noetl_stream.runtime.local import local_runtime


@dataclass
class Profile:
    """Samples as stacks of function names (innermost first) with their weight (the last value: CPU ns)."""

    samples: list[tuple[list[str], int]]

    def own(self) -> Counter[str]:
        out: Counter[str] = Counter()
        for stack, weight in self.samples:
            if stack:
                out[stack[0]] += weight
        return out

    def total(self) -> Counter[str]:
        out: Counter[str] = Counter()
        for stack, weight in self.samples:
            for name in set(stack):
                out[name] += weight
        return out

    @property
    def weight(self) -> int:
        return sum(w for _, w in self.samples)


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, i


def _fields(buf: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of a protobuf message: varints and length-delimited fields."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 2:
            size, i = _varint(buf, i)
            value, i = buf[i : i + size], i + size
        elif wire == 1:
            value, i = buf[i : i + 8], i + 8
        elif wire == 5:
            value, i = buf[i : i + 4], i + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        yield number, wire, value


def _ints(value: int | bytes) -> list[int]:
    """A repeated integer field: one varint, or a packed run of them."""
    if isinstance(value, int):
        return [value]
    out, i = [], 0
    while i < len(value):
        v, i = _varint(value, i)
        out.append(v)
    return out


def read_profile(data: bytes) -> Profile:
    """A pprof profile (``profile.proto``, gzipped or not): Profile.sample = 2, location = 4, function = 5,
    string_table = 6; Sample.location_id = 1, value = 2; Location.id = 1, line = 4 (Line.function_id = 1);
    Function.id = 1, name = 2 (an index into the string table)."""
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    strings: list[str] = []
    raw_samples: list[tuple[list[int], list[int]]] = []
    locations: dict[int, list[int]] = {}
    functions: dict[int, int] = {}
    for number, _, value in _fields(data):
        if number == 6 and isinstance(value, bytes):
            strings.append(value.decode("utf-8", "replace"))
        elif number == 2 and isinstance(value, bytes):
            loc_ids: list[int] = []
            values: list[int] = []
            for n, _, v in _fields(value):
                if n == 1:
                    loc_ids += _ints(v)
                elif n == 2:
                    values += _ints(v)
            raw_samples.append((loc_ids, values))
        elif number == 4 and isinstance(value, bytes):
            loc_id, lines = 0, []
            for n, _, v in _fields(value):
                if n == 1 and isinstance(v, int):
                    loc_id = v
                elif n == 4 and isinstance(v, bytes):
                    lines += [fv for fn, _, fv in _fields(v) if fn == 1 and isinstance(fv, int)]
            locations[loc_id] = lines
        elif number == 5 and isinstance(value, bytes):
            fn_id = name = 0
            for n, _, v in _fields(value):
                if n == 1 and isinstance(v, int):
                    fn_id = v
                elif n == 2 and isinstance(v, int):
                    name = v
            functions[fn_id] = name
    samples = []
    for loc_ids, values in raw_samples:
        stack = [strings[functions[f]] for loc in loc_ids for f in locations.get(loc, ())]
        samples.append((stack, values[-1] if values else 1))
    return Profile(samples)


def _short(name: str) -> str:
    return name.replace("github.com/nats-io/nats-server/v2/", "")[:110]


def report(profile: Profile, top: int) -> str:
    weight = profile.weight or 1
    lines = [f"{len(profile.samples)} stacks"]
    for title, counts in (("own", profile.own()), ("total", profile.total())):
        lines.append(f"--- {title}")
        lines += [f"{100 * w / weight:5.1f} %  {_short(name)}" for name, w in counts.most_common(top)]
    return "\n".join(lines)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def measure(duration: float, partitions: int) -> bytes:
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        conf = os.path.join(tmp, "prof.conf")
        with open(conf, "w") as f:
            f.write(f"prof_port: {port}\n")
        async with EmbeddedNats(config_file=conf) as srv:
            topology = Topology(partitions=partitions)
            async with local_runtime(srv.url, workers=1, concurrency=128, topology=topology) as rt:
                await runtime.concurrent_steps_per_s(rt, 100, 40)  # warm-up
                stop = asyncio.Event()

                async def load() -> list[float]:
                    figures = []
                    while not stop.is_set():
                        figures.append(await runtime.concurrent_steps_per_s(rt, 100, 40))
                    return figures

                task = asyncio.create_task(load())
                url = f"http://127.0.0.1:{port}/debug/pprof/profile?seconds={max(1, round(duration))}"
                data = await asyncio.to_thread(
                    lambda: urllib.request.urlopen(url, timeout=duration + 30).read()
                )
                stop.set()
                figures = await task
                print(f"steps/s during the profile: {', '.join(f'{x:.0f}' for x in figures)}")
                return bytes(data)


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.server_profile", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--duration", type=float, default=6.0)
    parser.add_argument("--partitions", type=int, default=Topology().partitions)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--out", help="keep the raw pprof profile here")
    args = parser.parse_args()
    configure("warning")
    data = run_event_loop(measure(args.duration, args.partitions))
    if args.out:
        with open(args.out, "wb") as f:
            f.write(data)
    print(report(read_profile(data), args.top))


if __name__ == "__main__":
    main()
