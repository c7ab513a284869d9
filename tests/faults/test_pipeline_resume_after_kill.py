"""A paginating pipeline resumed after a worker crash still reads its earlier tasks' results.

The worker running the pipeline is killed (SIGKILL) while page 3 runs; another worker gets the command
again, resumes at the page its checkpoint saved, and the tasks after the first read ``token``, the
first task's result, as before. A large result is kept out of the checkpoint (stored by reference).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
from helpers import playbook
from nats.js import JetStreamContext
from procs import Processes, provisioned, run_cli

from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.protocol.refs import is_ref
from noetl_stream.protocol.subjects import Topology

ACK_WAIT_S = 2.0

# Page 3 hangs the first time it runs (the worker is killed there); the redelivery goes on.
PAGINATE = playbook(
    r"""
    - step: start
      tool:
        - name: token
          kind: python
          args: {size: "{{ workload.size }}"}
          code: |
            result = {"t": "secret-abc", "pad": "x" * size}
        - name: init
          kind: noop
          spec: {policy: {rules: [{else: {then: {do: continue, set_iter: {page: 1, rows: []}}}}]}}
        - name: fetch_page
          kind: python
          args: {page: "{{ iter.page }}", tok: "{{ token.t }}", pad: "{{ token.pad | length }}",
                 path: "{{ workload.path }}"}
          code: |
            import os, time
            seen = open(path).read().split() if os.path.exists(path) else []
            with open(path, "a") as f:
                f.write(f"{page}\n")
            if page == 3 and "3" not in seen:
                time.sleep(60)
            result = {"rows": [f"p{page}-{tok}-{pad}"], "more": page < 5}
        - name: paginate
          kind: noop
          spec:
            policy:
              rules:
                - when: "{{ fetch_page.more }}"
                  then: {do: jump, to: fetch_page,
                         set_iter: {page: "{{ iter.page + 1 }}", rows: "{{ iter.rows + fetch_page.rows }}"}}
                - else:
                    then: {do: continue, set_iter: {rows: "{{ iter.rows + fetch_page.rows }}"}}
        - name: out
          kind: noop
          result: "{{ iter.rows }}"
    """,
    name="paginate",
)


@pytest.fixture
def topo(topology: Topology) -> Topology:
    return msgspec.structs.replace(topology, command_ack_wait_s=ACK_WAIT_S)


@pytest.fixture
async def procs(
    nats_server: EmbeddedNats, js: JetStreamContext, topo: Topology, tmp_path: Path
) -> AsyncIterator[Processes]:
    async with provisioned(nats_server.url, js, topo, tmp_path / "logs") as p:
        yield p


async def _until_page(path: Path, page: str) -> None:
    async with asyncio.timeout(30):
        while page not in (path.read_text().split() if path.exists() else []):
            await asyncio.sleep(0.02)


@pytest.mark.parametrize("size", [10, 300_000], ids=["inline", "by-reference"])
async def test_a_resumed_pagination_reads_the_results_of_its_earlier_tasks(
    procs: Processes, topo: Topology, js: JetStreamContext, tmp_path: Path, size: int
) -> None:
    pages = tmp_path / "pages.txt"
    book = tmp_path / "paginate.yaml"
    book.write_text(PAGINATE)
    procs.controller()
    first = procs.worker("w1", concurrency=2)
    client = asyncio.create_task(
        run_cli(
            procs.env,
            "submit",
            str(book),
            "--payload",
            json.dumps({"path": str(pages), "size": size}),
            "--wait",
            "--json",
            timeout=60,
        )
    )
    await _until_page(pages, "3")
    first.kill()
    kv = await js.key_value(topo.loops_bucket)
    saved = [(await kv.get(key)).value or b"" for key in await kv.keys()]
    procs.worker("w2", concurrency=2)

    code, out, err = await client

    summary = json.loads(out)
    assert code == 0 and summary["status"] == "success", f"{out}{err}\n{procs.logs()}"
    assert summary["result"] == [f"p{n}-secret-abc-{size}" for n in range(1, 6)]
    assert pages.read_text().split() == ["1", "2", "3", "3", "4", "5"]  # resumed at page 3
    # The checkpoint the crashed run left holds the token: inline when small, else by reference.
    (checkpoint,) = saved
    token = json.loads(checkpoint)["results"]["token"]
    if size < 1024:
        assert token == {"t": "secret-abc", "pad": "x" * size}
    else:
        assert is_ref(token) and token["$ref"]["size"] > size
        assert len(checkpoint) < 16 * 1024
