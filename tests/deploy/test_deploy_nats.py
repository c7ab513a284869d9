"""deploy/nats: the server config with its users and permissions, and the JetStream JSON generated from code.

A real ``nats-server`` runs ``deploy/nats/nats-server.conf`` (a copy whose ``store_dir`` line is left to
the ``-sd`` flag, on free ports, with the tests' own passwords in the environment). The admin user
provisions; a controller and a worker run as real ``noetl-stream`` processes with their own users, a
client submits: the execution must succeed without a single permissions violation in the server log,
while the operations each identity must not do are refused.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import nats.errors
import pytest
from helpers import free_port
from nats.aio.client import Client as NATS
from nats.js import api
from nats.js.errors import NoKeysError, ObjectNotFoundError
from procs import NOETL_STREAM, NoetlProcess, Processes, run_cli
from ruamel.yaml import YAML

from noetl_stream.jetstream.connection import connect
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.kv.checkpoints import KvCheckpoints
from noetl_stream.kv.deadlines import DeadlineIndex
from noetl_stream.kv.history import read_events
from noetl_stream.kv.keychain import Keychain, KeychainKey, generate_key
from noetl_stream.kv.provision import consumer_configs, provision, stream_configs
from noetl_stream.kv.results import ResultStore
from noetl_stream.protocol import events as E
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import Checkpoint

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "nats"
USERS = ("controller", "worker", "client", "admin", "sys")
PASSWORDS = {user: f"test-{user}-7f3a9c" for user in USERS}
SECRET = "sk-deploy-test-0123456789"


def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("deploy_nats_generate", DEPLOY / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


generate = load_generator()


class Server:
    def __init__(self, nats: EmbeddedNats) -> None:
        self.nats = nats

    def url(self, user: str) -> str:
        return f"nats://{user}:{PASSWORDS[user]}@127.0.0.1:{self.nats.port}"

    def violations(self) -> list[str]:
        return [line for line in self.nats.log_path.read_text().splitlines() if "Violation" in line]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """nats-server with deploy/nats/nats-server.conf (and accounts.conf), passwords from the environment."""
    mp = pytest.MonkeyPatch()
    for user, password in PASSWORDS.items():
        mp.setenv(f"NOETL_NATS_{user.upper()}_PASSWORD", password)
    conf_dir = tmp_path_factory.mktemp("conf")
    shutil.copy(DEPLOY / "accounts.conf", conf_dir)
    text, n = re.subn(
        r'^(\s*)store_dir: "[^"]*"$',
        r"\1# store_dir: given with -sd",
        (DEPLOY / "nats-server.conf").read_text(),
        flags=re.M,
    )
    assert n == 1, "nats-server.conf should set jetstream.store_dir once"
    (conf_dir / "nats-server.conf").write_text(text)
    nats_server = EmbeddedNats(
        tmp_path_factory.mktemp("nats"), config_file=conf_dir / "nats-server.conf", monitor_port=0
    )
    try:
        nats_server.start()
        yield Server(nats_server)
    finally:
        nats_server.close()
        mp.undo()


class Session:
    """A connection as one user that records the errors the server sends it."""

    def __init__(self, nc: NATS, errors: list[str]) -> None:
        self.nc, self.errors = nc, errors
        self.js = nc.jetstream(timeout=0.5)

    async def violation(self, fragment: str) -> str:
        for _ in range(100):
            found = [
                e
                for e in self.errors
                if "permissions violation" in e.lower() and fragment.lower() in e.lower()
            ]
            if found:
                return found[0]
            await asyncio.sleep(0.01)
        raise AssertionError(f"no permissions violation for {fragment!r}; errors: {self.errors}")


@pytest.fixture
async def session(server: Server) -> AsyncIterator[Any]:
    opened: list[NATS] = []

    async def open_as(user: str) -> Session:
        errors: list[str] = []

        async def on_error(e: Exception) -> None:
            errors.append(str(e))

        nc = await connect(server.url(user), name=f"pytest-{user}", connect_wait_s=5, error_cb=on_error)
        opened.append(nc)
        return Session(nc, errors)

    yield open_as
    for nc in opened:
        await nc.close()


@pytest.fixture(scope="module")
def keychain_key() -> str:
    return generate_key()


@pytest.fixture
async def provisioned(server: Server, session: Any, keychain_key: str) -> Session:
    """The admin provisions everything and stores the credential the test playbook reads."""
    admin = await session("admin")
    await provision(admin.nc.jetstream(timeout=5), Topology(), ("default",))
    key = KeychainKey([keychain_key])
    await Keychain(admin.nc.jetstream(timeout=5), Topology(), key).put(
        "api", "secret_manager", {"value": SECRET}
    )
    return admin


# --- generated files ---------------------------------------------------------------------------------


def test_generated_files_are_what_the_generator_writes_from_the_code() -> None:
    files = generate.render(Topology(), ["default"])
    assert generate.stale(DEPLOY, files) == [], "run: .venv/bin/python deploy/nats/generate.py"
    # The same objects `provision` creates, in the nats CLI's JSON (durations in nanoseconds).
    events = json.loads((DEPLOY / "streams" / "NOETL_EVENTS.json").read_text())
    assert events["max_age"] == 30 * 24 * 3600 * 10**9 and events["duplicate_window"] == 120 * 10**9
    assert events["retention"] == "limits" and events["storage"] == "file" and events["allow_direct"] is True
    pool = json.loads((DEPLOY / "consumers" / "NOETL_COMMANDS.pool-default.json").read_text())
    assert pool["durable_name"] == "pool-default" and pool["ack_policy"] == "explicit"
    assert pool["filter_subject"] == "noetl.cmd.default.>" and pool["ack_wait"] == 30 * 10**9
    assert {p.name for p in (DEPLOY / "buckets").glob("*.json")} == {
        f"{c.name}.json" for c in stream_configs(Topology(), include_buckets=True)[4:]
    }


def test_generator_follows_topology_settings(tmp_path: Path) -> None:
    code = generate.main(["--out", str(tmp_path), "--replicas", "3", "--pool", "default", "--pool", "gpu"])
    assert code == 0
    gpu = json.loads((tmp_path / "consumers" / "NOETL_COMMANDS.pool-gpu.json").read_text())
    assert gpu == consumer_configs(Topology(replicas=3), ["gpu"])[-1].config.as_dict()
    assert json.loads((tmp_path / "streams" / "NOETL_COMMANDS.json").read_text())["num_replicas"] == 3
    assert (
        "nats consumer add NOETL_COMMANDS --config consumers/NOETL_COMMANDS.pool-gpu.json"
        in (tmp_path / "provision.sh").read_text()
    )
    assert generate.main(["--out", str(tmp_path), "--check", "--replicas", "3", "--pool", "default"]) == 1
    # Another prefix: the controller's task metrics subscribe to that installation's task events.
    acme = Topology(prefix="acme")
    subscribe = generate.permissions(acme)["controller"]["subscribe"]["allow"]
    assert {acme.any_execution_filter(n) for n in ("task.started", "task.done")} <= set(subscribe)
    # ... and to the worker boundaries that may carry them (noetl_stream/protocol/carried.py)
    assert {acme.any_execution_filter(n) for n in E.CARRIERS} <= set(subscribe)
    assert not any(s.startswith("noetl.") for s in subscribe)


async def test_objects_created_from_the_json_files_are_what_the_runtime_expects(
    server: Server, session: Any
) -> None:
    """What ``nats stream add --config`` / ``nats consumer add --config`` send; provision then finds no drift."""
    admin = await session("admin")
    for folder in ("streams", "buckets"):
        for path in sorted((DEPLOY / folder).glob("*.json")):
            config = json.loads(path.read_text())
            reply = await admin.nc.request(f"$JS.API.STREAM.CREATE.{config['name']}", path.read_bytes(), 5)
            assert "error" not in json.loads(reply.data), (path.name, reply.data)
    for path in sorted((DEPLOY / "consumers").glob("*.json")):
        stream = path.name.split(".", 1)[0]
        config = json.loads(path.read_text())
        body = json.dumps({"stream_name": stream, "config": config}).encode()
        reply = await admin.nc.request(f"$JS.API.CONSUMER.CREATE.{stream}.{config['name']}", body, 5)
        assert "error" not in json.loads(reply.data), (path.name, reply.data)
    report = await provision(admin.nc.jetstream(timeout=5), Topology(), ("default",))
    assert not report.changed, report


# --- the users at work ---------------------------------------------------------------------------------

PARENT = f"""
apiVersion: noetl.io/v2
kind: Playbook
metadata: {{name: perms, path: tests/perms}}
workload: {{pad: "{"x" * 6000}"}}
executor: {{spec: {{deadline_s: 300}}}}
workflow:
  - step: start
    tool:
      - name: key
        kind: secrets
        auth: api
        field: value
      - name: big
        kind: python
        args: {{k: "{{{{ key }}}}"}}
        code: |
          result = {{"matches": k == "{SECRET}", "blob": "x" * 300000}}
    next: {{arcs: [{{step: pages}}]}}
  - step: pages
    tool:
      - name: init
        kind: noop
        spec: {{policy: {{rules: [{{else: {{then: {{do: continue, set_ctx: {{page: 1}}}}}}}}]}}}}
      - name: fetch
        kind: noop
        spec:
          policy:
            rules:
              - when: "{{{{ ctx.page < 3 }}}}"
                then: {{do: jump, to: fetch, set_ctx: {{page: "{{{{ ctx.page + 1 }}}}"}}}}
              - else: {{then: {{do: continue}}}}
    next: {{arcs: [{{step: fan}}]}}
  - step: fan
    loop:
      in: "{{{{ ['1' ~ workload.pad, '2' ~ workload.pad, '3' ~ workload.pad] }}}}"  # stored out of line
      iterator: it
      spec: {{mode: parallel, max_in_flight: 2, policy: {{exec: distributed}}}}
    tool:
      kind: python
      args: {{n: "{{{{ iter.it[0] | int }}}}", start: "{{{{ start }}}}"}}
      code: |
        result = n * len(start["blob"])
    next: {{arcs: [{{step: child, when: "{{{{ event.name == 'loop.done' }}}}"}}]}}
  - step: child
    tool:
      kind: playbook
      path: child.yaml
      return_step: start
    next: {{arcs: [{{step: report}}]}}
  - step: report
    tool:
      kind: python
      args: {{fan: "{{{{ fan }}}}", matches: "{{{{ start.matches }}}}"}}
      code: |
        result = {{"fan": fan, "matches": matches}}
"""

CHILD = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: perms-child, path: tests/perms-child}
workflow:
  - step: start
    tool:
      kind: python
      code: |
        result = "child ok"
"""


async def task_metrics(url: str, token: str) -> dict[str, float]:
    """``noetl_task_duration_seconds_count`` by task kind, from the controller's ``/metrics``."""
    import aiohttp

    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{url}/metrics", headers={"Authorization": f"Bearer {token}"}) as resp,
    ):
        assert resp.status == 200, await resp.text()
        text = await resp.text()
    counts = re.findall(r'^noetl_task_duration_seconds_count\{kind="([^"]+)"\} (\S+)$', text, flags=re.M)
    return {kind: float(n) for kind, n in counts}


async def test_controller_and_worker_run_an_execution_as_their_own_users(
    server: Server, provisioned: Session, keychain_key: str, tmp_path: Path, eventually: Any
) -> None:
    (tmp_path / "parent.yaml").write_text(PARENT)
    (tmp_path / "child.yaml").write_text(CHILD)
    topology = Topology()
    before = len(server.violations())
    token, port, worker_port = "deploy-test-token", free_port(), free_port()
    with (
        Processes(server.url("controller"), topology, tmp_path / "logs") as ctl,
        Processes(server.url("worker"), topology, tmp_path / "logs") as wrk,
    ):
        wrk.env["NOETL_KEYCHAIN_KEY"] = keychain_key
        # As the chart runs it with controller.service.enabled: the REST API and /metrics on, whose task
        # metrics subscribe to the workers' task events (core NATS) as the controller user.
        ctl.env["NOETL_API_TOKENS"] = token
        args = ["controller", "--grace", "5", "--controller-id", "controller", "--http", f"127.0.0.1:{port}"]
        args += ["--nats", ctl.nats_url, "--prefix", topology.prefix]
        ctl.all.append(NoetlProcess("controller", [str(NOETL_STREAM), *args], ctl.env, ctl.log_dir).start())
        wrk.worker("w1", concurrency=4, metrics=f"127.0.0.1:{worker_port}")  # as workerMetrics.enabled
        client_env = {**ctl.env, "NOETL_NATS_URL": server.url("client")}
        code, out, err = await run_cli(
            client_env, "submit", str(tmp_path / "parent.yaml"), "--wait", "--json", timeout=45
        )
        logs = ctl.logs() + wrk.logs()
        assert code == 0, f"{out}{err}\n{logs}\n{server.violations()}"
        summary = json.loads(out)
        assert summary["status"] == "success", summary
        assert summary["result"] == {"fan": [300000, 600000, 900000], "matches": True}
        # The fan loop's items were stored out of line and deleted (as the controller) when it finished.
        store = await provisioned.js.object_store(topology.results_store)
        with pytest.raises(ObjectNotFoundError):
            await store.get_info(f"{summary['execution_id']}/fan-1/items", show_deleted=True)
        # The client can follow up on what it started: status, and replay against the live snapshot.
        code, out, err = await run_cli(client_env, "replay", summary["execution_id"], "--verify", timeout=30)
        assert code == 0, f"{out}{err}\n{server.violations()}"
        # `prune` runs as the controller (a CronJob needs no admin password): an orphan object goes, the
        # finished execution's result objects stay while its history does.
        await store.put("gone-e1/gone-s1/result", b"{}")
        code, out, err = await run_cli(ctl.env, "prune", "--older-than", "0", "--json", timeout=30)
        assert code == 0, f"{out}{err}\n{server.violations()}"
        assert json.loads(out)["pruned"] == ["gone-e1/gone-s1/result"], out
        # The controller saw the workers' task events: their durations are on /metrics.
        url = f"http://127.0.0.1:{port}"
        await eventually(lambda: _has_python_tasks(url, token), timeout=10)
        # The worker counted its own, and read its consumer's lag as the worker user.
        worker_metrics = await _worker_metrics(worker_port)
        assert worker_metrics['noetl_worker_tasks_total{kind="python",status="ok"}'] >= 5, worker_metrics
        assert 'noetl_worker_consumer_pending{pool="default"}' in worker_metrics, worker_metrics
        assert server.violations()[before:] == [], logs


async def _worker_metrics(port: int) -> dict[str, float]:
    """A worker's ``/metrics``: each sample's value by its line's name and labels."""
    import aiohttp

    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/metrics") as resp:
        assert resp.status == 200, await resp.text()
        text = await resp.text()
    samples = (line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    return {name: float(value) for name, value in samples}


async def _has_python_tasks(url: str, token: str) -> bool:
    return (await task_metrics(url, token)).get("python", 0.0) >= 5  # start, fan x 3, report


async def test_worker_cannot_publish_commands_or_take_the_controllers_work(
    server: Server, provisioned: Session, session: Any
) -> None:
    worker = await session("worker")
    logged = len(server.violations())
    with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
        await worker.js.publish("noetl.cmd.default.x", b"{}")
    assert 'publish to "noetl.cmd.default.x"' in (await worker.violation("noetl.cmd.default.x")).lower()
    # The server log shows it too: the "no violation in the log" checks of this module can fail.
    assert any("noetl.cmd.default.x" in line for line in server.violations()[logged:]), server.violations()
    pending = await provisioned.js.stream_info("NOETL_COMMANDS", subjects_filter="noetl.cmd.default.x")
    assert not pending.state.subjects, "a command published by a worker reached the stream"

    # Nor pull the controller's input, nor change a stream (runtime identities only read configs).
    with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
        await worker.nc.request("$JS.API.CONSUMER.MSG.NEXT.NOETL_EVENTS.controller-0", b'{"batch":1}', 0.5)
    await worker.violation("NOETL_EVENTS.controller-0")
    config = stream_configs(Topology())[0]
    config.max_age = 1.0
    with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
        await worker.js.update_stream(config)
    info = await provisioned.js.stream_info("NOETL_EVENTS")
    assert info.config.max_age == Topology().events_max_age_s

    # What it needs still works: reading an event, pulling its pool.
    await provisioned.js.publish("noetl.events.e1.step.done", b"{}")
    assert (await worker.js.get_last_msg("NOETL_EVENTS", "noetl.events.e1.*.step.done")).data == b"{}"
    assert (await worker.js.consumer_info("NOETL_COMMANDS", "pool-default")).name == "pool-default"


async def test_the_controller_reads_with_ephemeral_consumers_but_never_changes_its_own(
    server: Server, provisioned: Session, session: Any
) -> None:
    """docs/deploy.md section 1: the controller creates (and deletes) only the ephemeral consumers it reads
    histories with; its durable consumers are the admin's to create, change or delete."""
    t = Topology()
    controller = await session("controller")
    await provisioned.js.publish(t.event_subject("ephemeral-e1", "step.done"), b"{}")
    durables = {c.name for c in await provisioned.js.consumers_info(t.events_stream)}
    assert [seq async for seq, _ in read_events(controller.js, t, "ephemeral-e1")] == []  # not an event
    assert not controller.errors, controller.errors  # its ephemeral consumer came and went
    assert {c.name for c in await provisioned.js.consumers_info(t.events_stream)} == durables

    durable = t.controller_events_consumer(0)
    with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
        await controller.js.delete_consumer(t.events_stream, durable)
    await controller.violation(f"CONSUMER.DELETE.{t.events_stream}.{durable}")
    config = (await provisioned.js.consumer_info(t.events_stream, durable)).config
    config.ack_wait = 1.0
    with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
        await controller.js.add_consumer(t.events_stream, config)
    await controller.violation(f"CONSUMER.CREATE.{t.events_stream}.{durable}")
    info = await provisioned.js.consumer_info(t.events_stream, durable)
    assert info.config.ack_wait == t.lease_ttl_s


async def test_a_worker_replaces_a_result_object_with_a_purge(
    server: Server, provisioned: Session, session: Any
) -> None:
    """Why the worker may purge OBJ_noetl_results (docs/deploy.md section 1): nats-py's object store
    removes the chunks of the object a put replaces (a redelivered command storing its result again)
    with a purge of the stream."""
    t = Topology()
    worker = await session("worker")
    results = ResultStore(worker.js, t)
    store = await provisioned.js.object_store(t.results_store)
    await results.put_encoded("replaced-e1/s1/result", b'"first"')
    first = f"$O.{t.results_store}.C.{(await store.get_info('replaced-e1/s1/result')).nuid}"

    async def stored() -> dict[str, int]:
        info = await provisioned.js.stream_info(f"OBJ_{t.results_store}", subjects_filter="$O.>")
        return info.state.subjects or {}

    assert first in await stored()
    await results.put_encoded("replaced-e1/s1/result", b'"second"')
    assert await results.get_encoded("replaced-e1/s1/result") == b'"second"'
    assert not worker.errors, worker.errors
    assert first not in await stored()  # the replaced object's chunks were purged
    await ResultStore(provisioned.js, t).delete("replaced-e1/s1/result")


async def test_runtime_identities_forget_keys_without_purging_the_bucket_streams(
    server: Server, provisioned: Session, session: Any
) -> None:
    """Removing a deadline key (controller) or a checkpoint (worker) is a publish on the bucket's
    subjects (a purge marker that expires); neither identity may purge a KV bucket's whole stream."""
    t = Topology()
    controller, worker = await session("controller"), await session("worker")
    index = DeadlineIndex(await controller.js.key_value(t.executions_bucket))
    await index.add(0, "forget-e1", 1e12)
    await index.remove(0, "forget-e1")
    assert "forget-e1" not in dict(await index.of_partition(0))
    checkpoints = KvCheckpoints(worker.js, t, "forget-e1")
    await checkpoints.save("run", Checkpoint(pc=1))
    await checkpoints.clear("run")
    assert await checkpoints.load("run") is None

    for who, bucket in ((controller, t.executions_bucket), (worker, t.loops_bucket)):
        kv = await provisioned.js.key_value(bucket)
        await kv.put("forget-e1.kept", b"v")
        with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
            await who.js.purge_stream(f"KV_{bucket}")
        await who.violation(f"STREAM.PURGE.KV_{bucket}")
        assert (await kv.get("forget-e1.kept")).value == b"v"
        await kv.purge("forget-e1.kept")


async def test_client_cannot_read_the_keychain(server: Server, provisioned: Session, session: Any) -> None:
    client = await session("client")
    with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
        await client.js.key_value("noetl_keychain")
    await client.violation("KV_noetl_keychain")
    for direct in (False, True):
        with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
            await client.js.get_last_msg("KV_noetl_keychain", "$KV.noetl_keychain.api", direct=direct)
    with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
        await client.js.subscribe("$KV.noetl_keychain.>", stream="KV_noetl_keychain", ordered_consumer=True)
    await client.nc.subscribe("$KV.noetl_keychain.>")
    assert "subscription" in (await client.violation('"$KV.noetl_keychain.>"')).lower()
    # The admin (and workers) can; the client can still read what is meant for it.
    assert (await provisioned.js.get_last_msg("KV_noetl_keychain", "$KV.noetl_keychain.api")).data
    await provisioned.js.publish("noetl.events.e2.step.done", b"{}")
    assert (await client.js.get_last_msg("NOETL_EVENTS", "noetl.events.e2.*.step.done")).data == b"{}"
    executions = await client.js.key_value("noetl_executions")
    try:
        await executions.keys()  # the client may list snapshots
    except NoKeysError:
        pass
    sub = await client.js.subscribe(
        "noetl.events.e2.>",
        stream="NOETL_EVENTS",
        ordered_consumer=True,
        deliver_policy=api.DeliverPolicy.ALL,
    )
    stored = f"noetl.events.e2.{Topology().partition_of('e2')}.step.done"  # + the partition
    assert (await sub.next_msg(timeout=2)).subject == stored
    await sub.unsubscribe()


async def test_a_command_the_users_permissions_refuse_says_so(server: Server, provisioned: Session) -> None:
    """The server drops a refused request, so the client sees only a timeout: the CLI names the refusal
    instead of "NATS did not answer in time" (one error line, exit 2)."""
    env = {**os.environ, "NOETL_NATS_URL": server.url("client")}
    code, out, err = await run_cli(env, "keychain", "list", timeout=30)
    assert code == 2, (code, out, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].lower().startswith("error: permissions violation for publish to"), err
    assert "kv_noetl_keychain" in lines[0].lower() and "may not do this" in lines[0]
    assert PASSWORDS["client"] not in err


# --- the Kubernetes side ---------------------------------------------------------------------------------


def test_values_for_the_nats_chart_carry_the_same_accounts_and_a_jetstream_cluster() -> None:
    values = YAML(typ="safe").load((DEPLOY / "values-nats.yaml").read_text())
    merge = values["config"]["merge"]
    assert merge["accounts"] == generate.helm_accounts(Topology())
    assert merge["system_account"] == generate.SYSTEM_ACCOUNT
    assert values["config"]["cluster"] == {"enabled": True, "replicas": 3}
    jetstream = values["config"]["jetstream"]
    assert (
        jetstream["enabled"]
        and jetstream["fileStore"]["enabled"]
        and jetstream["fileStore"]["pvc"]["enabled"]
    )
    assert values["config"]["monitor"]["enabled"] is True  # KEDA reads /jsz
    env = values["container"]["env"]
    for user in USERS:  # every placeholder the accounts use is set from the Secret
        ref = env[f"NOETL_NATS_{user.upper()}_PASSWORD"]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": "noetl-nats-users", "key": user}
    # The noetl-stream chart's KEDA triggers name this account.
    chart_values = YAML(typ="safe").load(
        (DEPLOY.parent / "helm" / "noetl-stream" / "values.yaml").read_text()
    )
    assert chart_values["workerDefaults"]["autoscaling"]["keda"]["account"] == generate.ACCOUNT
    assert chart_values["nats"]["auth"]["existingSecret"] == "noetl-nats-users"


async def test_probe_passes_while_connected_to_the_nats_port(server: Server, session: Any) -> None:
    await session("client")  # this network namespace now has a connection to the server's port
    probe = DEPLOY.parent / "docker" / "noetl-probe"

    def run_probe(url: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "NOETL_NATS_URL": url}
        return subprocess.run(
            [sys.executable, str(probe)], env=env, capture_output=True, text=True, timeout=10
        )

    assert (await asyncio.to_thread(run_probe, server.url("worker"))).returncode == 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        unused = s.getsockname()[1]
    failed = await asyncio.to_thread(run_probe, f"nats://worker:x@127.0.0.1:{unused}")
    assert failed.returncode == 1 and str(unused) in failed.stderr
