"""`noetl-stream retry`: re-run a failed execution from its failed step, reusing what succeeded."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

from helpers import playbook
from procs import NOETL_STREAM

from noetl_stream.client.submit import RetryError, request_for, retry_request, submit
from noetl_stream.client.tracking import follow
from noetl_stream.runtime.local import Runtime

FLAKY = """
- step: start
  tool:
    kind: python
    args: {mark: "{{ workload.mark }}"}
    code: |
      open(mark, "a").write("start\\n")
      result = 20
  next:
    arcs: [{step: compute, args: {base: "{{ start }}"}}]
- step: compute
  tool:
    kind: python
    args: {base: "{{ args.base }}", flag: "{{ workload.flag }}", mark: "{{ workload.mark }}"}
    code: |
      import os
      open(mark, "a").write("compute\\n")
      if not os.path.exists(flag):
          raise RuntimeError("flag missing")
      result = base + 1
"""


async def test_retry_reruns_only_the_failed_step_with_its_args(runtime: Runtime, tmp_path: Path) -> None:
    mark, flag = tmp_path / "mark.txt", tmp_path / "flag"
    text = playbook(FLAKY, workload={"mark": str(mark), "flag": str(flag)})
    first = await submit(runtime.nc, runtime.topology, request_for(text, "flaky.yaml"))
    failed = await follow(runtime.nc, runtime.topology, first, timeout=20)
    assert failed.status == "failed" and failed.error is not None
    assert failed.error["kind"] == "python_error"

    flag.write_text("ok")
    request = await retry_request(runtime.nc, runtime.topology, first)
    second = await submit(runtime.nc, runtime.topology, request)
    summary = await follow(runtime.nc, runtime.topology, second, timeout=20)
    assert summary.status == "success"
    assert summary.result == 21  # the args of the failed run (base = start's recorded result)
    assert mark.read_text().split() == ["start", "compute", "compute"]  # `start` did not run again
    assert "start" not in summary.steps


async def test_retry_refuses_an_execution_without_failures(runtime: Runtime, tmp_path: Path) -> None:
    text = playbook("- step: start\n  tool: {kind: noop, result: 1}\n")
    done = await submit(runtime.nc, runtime.topology, request_for(text, "ok.yaml"))
    assert (await follow(runtime.nc, runtime.topology, done, timeout=20)).status == "success"
    try:
        await retry_request(runtime.nc, runtime.topology, done)
    except RetryError as exc:
        assert "no failed step" in str(exc)
    else:
        raise AssertionError("retry of a successful execution must be refused")
    request = await retry_request(runtime.nc, runtime.topology, done, ("start",))
    again = await follow(
        runtime.nc, runtime.topology, await submit(runtime.nc, runtime.topology, request), timeout=20
    )
    assert again.status == "success" and again.result == 1


async def test_retry_wait_prints_like_submit_wait(runtime: Runtime, tmp_path: Path) -> None:
    """The timeline on stderr and the outcome's last lines; ``--json`` the summary on stdout."""
    mark, flag = tmp_path / "mark.txt", tmp_path / "flag"
    text = playbook(FLAKY, workload={"mark": str(mark), "flag": str(flag)})
    first = await submit(runtime.nc, runtime.topology, request_for(text, "flaky.yaml"))
    assert (await follow(runtime.nc, runtime.topology, first, timeout=20)).status == "failed"
    flag.write_text("ok")
    target = ("--nats", runtime.nc.connected_url.geturl() if runtime.nc.connected_url else "", "--prefix")
    proc = await asyncio.create_subprocess_exec(
        str(NOETL_STREAM), "retry", first, "--wait", *target, runtime.topology.prefix,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    assert "  ✔ compute done" in err.decode().splitlines()
    assert json.loads(out.decode()) == {"result": 21, "ctx": {}}  # as submit --wait, not the --json summary
