"""What the command line says where it used to say nothing, or the wrong thing, on a real NATS server:
``submit --wait`` with no controller, an empty ``executions`` list, ``replay --until`` before an
execution began, and a keychain entry no tool could use."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import pytest
from nats.js import JetStreamContext
from test_cli_errors import one_error_line
from test_cli_run import HELLO, cli, noetl

from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.kv.history import read_events
from noetl_stream.kv.keychain import generate_key
from noetl_stream.kv.provision import provision
from noetl_stream.protocol import events as E
from noetl_stream.protocol.subjects import Topology
from noetl_stream.runtime.local import Runtime, local_runtime


async def _line(stream: object, within_s: float = 30.0) -> str:
    """The next line of a child's output (it failed to say anything if none comes in `within_s`)."""
    readline = stream.readline  # type: ignore[attr-defined]
    line: str = await asyncio.wait_for(asyncio.to_thread(readline), within_s)
    return line.rstrip("\n")


async def test_submit_wait_names_the_execution_and_says_when_no_controller_takes_it(
    nats_server: EmbeddedNats, js: JetStreamContext, topology: Topology, tmp_path: Path
) -> None:
    """It printed nothing, for ever, when no controller ran for the prefix. It now says the execution id
    at once (on stderr: with --json stdout is the outcome alone), a hint when no controller has recorded
    the request after a few seconds, and still ends like `run` once a controller comes."""
    await provision(js, topology)  # provisioned, but no controller
    file = tmp_path / "hello.yaml"
    file.write_text(HELLO)
    proc = subprocess.Popen(
        [
            cli(),
            "submit",
            str(file),
            "--wait",
            "--json",
            "--nats",
            nats_server.url,
            "--prefix",
            topology.prefix,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None and proc.stdout is not None
        said = await _line(proc.stderr)
        assert said.startswith("execution ") and said.endswith(" submitted: waiting for it to end"), said
        execution_id = said.split()[1]
        hint = await _line(proc.stderr)
        assert hint.startswith(
            f"no controller has taken execution {execution_id} yet (no {E.EXECUTION_REQUESTED}"
        )
        assert f"is a controller running for prefix '{topology.prefix}'" in hint and "Still waiting" in hint
        assert proc.poll() is None  # it goes on waiting
        async with local_runtime(nats_server.url, topology=topology):
            code = await asyncio.to_thread(proc.wait, 60)
        out, err = proc.communicate()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 0, err
    summary = json.loads(out)
    assert summary["execution_id"] == execution_id and summary["status"] == "success"


async def test_submit_wait_says_no_hint_when_a_controller_runs(
    nats_server: EmbeddedNats, runtime: Runtime, tmp_path: Path
) -> None:
    file = tmp_path / "hello.yaml"
    file.write_text(HELLO)
    proc = await asyncio.to_thread(
        noetl, "submit", str(file), "--wait", "--nats", nats_server.url, "--prefix", runtime.topology.prefix
    )
    assert proc.returncode == 0, proc.stderr
    assert "submitted: waiting for it to end" in proc.stderr.splitlines()[0]
    assert "no controller" not in proc.stderr
    assert json.loads(proc.stdout)["result"]["greeting"] == "hello world"  # stdout: the outcome only


@pytest.mark.parametrize(
    ("filters", "said"),
    [
        ([], "no executions"),
        (
            ["--status", "failed", "--playbook", "hello", "--since", "2020-01-01"],
            "no executions with status 'failed', playbook 'hello', updated since '2020-01-01'",
        ),
    ],
)
async def test_an_empty_executions_list_says_so_on_stderr(
    nats_server: EmbeddedNats, js: JetStreamContext, topology: Topology, filters: list[str], said: str
) -> None:
    # it printed nothing at all
    await provision(js, topology)
    proc = await asyncio.to_thread(
        noetl, "executions", *filters, "--nats", nats_server.url, "--prefix", topology.prefix
    )
    assert proc.returncode == 0 and proc.stdout == "", proc
    assert proc.stderr == f"{said}\n"


async def test_an_executions_page_past_the_end_says_how_many_there_are(
    nats_server: EmbeddedNats, runtime: Runtime
) -> None:
    await runtime.run_playbook(HELLO, "hello.yaml", timeout=30)
    proc = await asyncio.to_thread(
        noetl, "executions", "--offset", "5", "--nats", nats_server.url, "--prefix", runtime.topology.prefix
    )
    assert proc.returncode == 0 and proc.stdout == "", proc
    assert proc.stderr == "no executions at --offset 5: 1 in all\n"


async def test_replay_until_before_the_first_event_names_the_first_sequence(
    nats_server: EmbeddedNats, runtime: Runtime, js: JetStreamContext
) -> None:
    # it said "execution ... has no events"
    await runtime.run_playbook(HELLO, "hello.yaml", timeout=30)
    later = await runtime.run_playbook(HELLO, "hello.yaml", timeout=30)
    firsts = [
        (seq, ev)
        async for seq, ev in read_events(
            js, runtime.topology, later.execution_id, names=E.CONTROLLER_INPUT_EVENTS
        )
    ]
    seq, first = firsts[0]
    assert seq > 1  # the first execution's events are before it
    proc = await asyncio.to_thread(
        noetl,
        "replay",
        later.execution_id,
        "--until",
        str(seq - 1),
        "--nats",
        nats_server.url,
        "--prefix",
        runtime.topology.prefix,
    )
    assert one_error_line(proc, 2) == (
        f"error: execution {later.execution_id} has no events up to --until {seq - 1}: that is before its "
        f"first event, stream sequence {seq} (at {first.timestamp})"
    )
    proc = await asyncio.to_thread(
        noetl,
        "replay",
        "no-such-run",
        "--until",
        "5",
        "--nats",
        nats_server.url,
        "--prefix",
        runtime.topology.prefix,
    )
    assert one_error_line(proc, 2) == "error: execution no-such-run has no events"


KNOWN_KINDS = (
    "api_key, basic, bearer, http_basic, http_bearer, postgres, postgres_credential, secret_manager, static"
)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            ["--kind", "nosuchkind", "--field", "a=b"],
            f"error: unknown keychain entry kind 'nosuchkind': use one of {KNOWN_KINDS}",
        ),
        (
            ["--kind", "bearer", "--field", "notoken=b"],
            "error: keychain entry 'e' (kind bearer) has no 'token' (its fields: notoken)",
        ),
    ],
)
async def test_a_keychain_entry_no_tool_could_use_is_refused_and_not_stored(
    nats_server: EmbeddedNats, js: JetStreamContext, topology: Topology, args: list[str], said: str
) -> None:
    # it was stored ("set e ..."), and the mistake showed later as a task's credential_error
    await provision(js, topology)
    env = {"NOETL_KEYCHAIN_KEY": generate_key()}
    where = ["--nats", nats_server.url, "--prefix", topology.prefix]
    proc = await asyncio.to_thread(noetl, "keychain", "set", "e", *args, *where, env=env)
    assert one_error_line(proc, 2) == said
    listed = await asyncio.to_thread(noetl, "keychain", "list", *where)
    assert listed.returncode == 0 and listed.stdout == "", listed


async def test_keychain_entries_the_tools_take_are_stored(
    nats_server: EmbeddedNats, js: JetStreamContext, topology: Topology, tmp_path: Path
) -> None:
    await provision(js, topology)
    env = {"NOETL_KEYCHAIN_KEY": generate_key()}
    where = ["--nats", nats_server.url, "--prefix", topology.prefix]
    spec = tmp_path / "pg.json"
    spec.write_text(json.dumps({"kind": "postgres", "fields": {"dsn": "postgresql://u:p@db/x"}}))
    for args in (
        ["a", "--kind", "static", "--field", "anything=1"],
        ["b", "--kind", "http_bearer", "--field", "token=t-123456"],
        ["c", "--kind", "api_key", "--field", "value=v-123456", "--field", "param=appid"],
        ["d", "--from-json", str(spec)],
    ):
        proc = await asyncio.to_thread(noetl, "keychain", "set", *args, *where, env=env)
        assert proc.returncode == 0 and proc.stdout.startswith(f"set {args[0]} "), proc
    listed = await asyncio.to_thread(noetl, "keychain", "list", *where)
    assert listed.stdout.split() == ["a", "static", "b", "http_bearer", "c", "api_key", "d", "postgres"]
