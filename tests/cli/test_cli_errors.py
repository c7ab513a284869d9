"""Bad input and unreachable or unprepared NATS, as a user meets them on the command line: one
``error: ...`` line on stderr, an exit code (1 failed, 2 invalid input or installation, 130 Ctrl-C),
no traceback and no credential of the NATS URL."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_cli_run import HELLO, cli, noetl

from noetl_stream.jetstream.embedded import EmbeddedNats, find_nats_server
from noetl_stream.runtime.local import Runtime


def one_error_line(proc: subprocess.CompletedProcess[str], code: int) -> str:
    """The process's only stderr line, which starts with 'error: ', after exiting with `code`."""
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def usage_error(proc: subprocess.CompletedProcess[str]) -> str:
    """A click usage error (exit 2): its 'Error: ...' line."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.stderr.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def plain_nats() -> Iterator[str]:
    """A nats-server without JetStream (a misconfigured installation)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [str(find_nats_server()), "-a", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "nats-server did not start"
                time.sleep(0.05)
        yield f"nats://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.parametrize("command", [["status", "x"], ["run", "playbooks/hello.yaml"]])
def test_a_refused_connection_is_one_line_without_the_urls_credentials(command: list[str]) -> None:
    # nothing listens on port 1: the client retries until the wait ends (NOETL_CONNECT_WAIT_S, default
    # 5 s; a few attempts here), each attempt used to log a warning line (`run`: the first one did)
    proc = noetl(*command, "--nats", "nats://admin:s3cret@127.0.0.1:1", env={"NOETL_CONNECT_WAIT_S": "2.5"})
    line = one_error_line(proc, 1)
    assert "s3cret" not in proc.stderr and "admin" not in proc.stderr
    assert "cannot connect to NATS at nats://***@127.0.0.1:1 within 2.5s" in line and "refused" in line


@pytest.mark.parametrize("wait", ["0", "soon"])
def test_a_connect_wait_that_is_not_a_positive_number_is_refused(wait: str) -> None:
    proc = noetl("status", "x", "--nats", "nats://127.0.0.1:1", env={"NOETL_CONNECT_WAIT_S": wait})
    assert (
        one_error_line(proc, 2) == f"error: NOETL_CONNECT_WAIT_S={wait!r} is not a number of seconds above 0"
    )


@pytest.mark.parametrize(
    "command", [["status", "x"], ["submit", "playbooks/hello.yaml"], ["run", "playbooks/hello.yaml"]]
)
def test_an_invalid_nats_url_is_an_error_line_not_a_traceback(command: list[str]) -> None:
    proc = noetl(*command, "--nats", "nats://127.0.0.1:99999")
    assert "invalid NATS URL 'nats://127.0.0.1:99999'" in one_error_line(proc, 2)  # before connecting


@pytest.mark.parametrize(
    "command",
    [
        ["status", "x"],
        ["events", "x"],
        ["executions"],
        ["ctx", "x"],
        ["catalog", "list"],
        ["provision"],
        ["run", "playbooks/hello.yaml"],
    ],
)
def test_a_server_without_jetstream_is_named(plain_nats: str, command: list[str]) -> None:
    proc = noetl(*command, "--nats", plain_nats)
    assert "JetStream is not available" in one_error_line(proc, 1)


@pytest.mark.parametrize(
    "command",
    [
        ["status", "x"],
        ["events", "x"],
        ["executions"],
        ["catalog", "list"],
        ["retry", "x"],
        ["submit", "playbooks/hello.yaml"],
    ],
)
def test_an_installation_not_provisioned_says_to_provision(
    nats_server: EmbeddedNats, command: list[str]
) -> None:
    prefix = "u" + uuid.uuid4().hex[:10]  # nothing provisioned under it
    proc = noetl(*command, "--nats", nats_server.url, "--prefix", prefix)
    assert "noetl-stream provision" in one_error_line(proc, 2)


@pytest.mark.parametrize("command", ["run", "submit"])
def test_an_unreadable_payload_file_is_a_usage_error(tmp_path: Path, command: str) -> None:
    for target in (tmp_path / "missing.json", tmp_path):
        proc = noetl(
            command, "playbooks/hello.yaml", "--payload", f"@{target}", "--nats", "nats://127.0.0.1:1"
        )
        line = usage_error(proc)
        assert "--payload" in line and f"cannot read {target}" in line


def test_run_refuses_zero_workers() -> None:
    # with no worker the execution could never finish: `run` used to wait forever
    proc = noetl("run", "playbooks/hello.yaml", "--workers", "0", timeout=30)
    assert "--workers" in usage_error(proc)


def test_replay_until_neither_a_sequence_nor_a_time_is_a_usage_error() -> None:
    # it used to be compared as text with the events' times, so any word replayed everything
    proc = noetl("replay", "x", "--until", "yesterday", "--nats", "nats://127.0.0.1:1")
    assert "--until" in usage_error(proc)


async def test_events_of_an_unknown_execution_is_an_error_like_status(
    nats_server: EmbeddedNats, runtime: Runtime
) -> None:
    env = {"NOETL_PREFIX": runtime.topology.prefix}
    nats_url = nats_server.url
    proc = noetl("events", "no-such-run", "--nats", nats_url, env=env)
    assert one_error_line(proc, 1) == "error: no execution no-such-run"
    summary = await runtime.run_playbook(HELLO, "hello.yaml", {}, timeout=30)
    ok = noetl("events", summary.execution_id, "--nats", nats_url, env=env)
    assert ok.returncode == 0 and "playbook.processed" in ok.stdout, ok.stderr
    # stdout closed at once (`| head -1` that went away): no 'Broken pipe' error line, no traceback
    closed = subprocess.Popen(
        [cli(), "events", summary.execution_id, "--nats", nats_url, "--prefix", runtime.topology.prefix],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert closed.stdout is not None and closed.stderr is not None
    closed.stdout.close()
    err = closed.stderr.read()
    assert closed.wait(timeout=60) == 1
    assert err == "", err


async def test_following_an_execution_not_started_yet_says_it_waits_then_shows_it(
    nats_server: EmbeddedNats, runtime: Runtime
) -> None:
    """``events <id> --follow`` of an id without events waited in silence (it may be about to start).
    It now says so on stderr after a second, keeps waiting, and prints the execution once it runs."""
    from noetl_stream.client.submit import request_for, submit
    from noetl_stream.client.tracking import follow

    execution_id = f"later-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen(
        [
            cli(),
            "events",
            execution_id,
            "--follow",
            "--nats",
            nats_server.url,
            "--prefix",
            runtime.topology.prefix,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        note = await asyncio.to_thread(proc.stderr.readline)
        assert note.strip() == (
            f"no events of execution {execution_id} yet: waiting for it to start (Ctrl-C to stop)"
        )
        request = request_for(HELLO, "hello.yaml", {}, execution_id)
        assert await submit(runtime.nc, runtime.topology, request) == execution_id
        await follow(runtime.nc, runtime.topology, execution_id, timeout=30)
        out, err = await asyncio.to_thread(proc.communicate, timeout=60)
        assert proc.returncode == 0, err
        assert "playbook.processed" in out and err == ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_retry_from_a_step_the_playbook_does_not_have_is_refused(
    nats_server: EmbeddedNats, runtime: Runtime
) -> None:
    # it used to submit a retry the controller could only fail, print its id and exit 0
    summary = await runtime.run_playbook(HELLO, "hello.yaml", {}, timeout=30)
    env = {"NOETL_PREFIX": runtime.topology.prefix}
    proc = noetl("retry", summary.execution_id, "--from-step", "nowhere", "--nats", nats_server.url, env=env)
    line = one_error_line(proc, 2)
    assert f"execution {summary.execution_id} has no step 'nowhere' (steps: start, end)" in line


def test_a_controller_whose_api_port_is_taken_says_so_and_leaves(nats_server: EmbeddedNats) -> None:
    """Not a traceback after it had started: it stops and its last line is the error, naming the address
    (exit 2, an installation problem)."""
    prefix = "p" + uuid.uuid4().hex[:10]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = ("controller", "--nats", nats_server.url, "--prefix", prefix, "--controller-id", "ctl-taken")
        proc = noetl(*args, "--http", f"127.0.0.1:{port}", "--api-token", "t" * 32)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: cannot serve the REST API on 127.0.0.1:{port}: "), last
    assert "in use" in last, last


@pytest.mark.parametrize("role", ["controller", "worker"])
def test_a_process_waiting_for_nats_names_the_servers_and_leaves_cleanly_on_sigterm(role: str) -> None:
    """Started before its server (as in a Kubernetes rollout), a controller or worker says once which
    servers it cannot reach (credentials masked) and keeps trying; a SIGTERM meanwhile ends it with exit 0
    and a line saying so (it died by the signal, saying nothing, before)."""
    with socket.socket() as s:  # nothing listens on either port
        s.bind(("127.0.0.1", 0))
        a = s.getsockname()[1]
        with socket.socket() as t:
            t.bind(("127.0.0.1", 0))
            b = t.getsockname()[1]
    urls = f"nats://admin:s3cret@127.0.0.1:{a},nats://127.0.0.1:{b}"
    proc = subprocess.Popen(
        [cli(), role, "--nats", urls], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        assert proc.stdout is not None
        seen = ""
        while "nats.cannot_connect" not in seen and proc.poll() is None:  # (the test's timeout bounds it)
            seen += proc.stdout.readline()
        assert "nats.cannot_connect" in seen, seen
        proc.terminate()
        rest, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    logs = seen + rest
    assert proc.returncode == 0, (proc.returncode, logs)
    assert f"nats://***@127.0.0.1:{a}, nats://127.0.0.1:{b}" in seen, seen
    assert "stopped_before_start" in logs, logs
    assert "s3cret" not in logs and "Traceback" not in logs, logs
