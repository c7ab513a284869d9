"""The embedded nats-server starts, stops, restarts on the same port and keeps file-stored data."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import urllib.request
from pathlib import Path

import pytest

from noetl_stream.embedded import EmbeddedNats, EmbeddedNatsError, find_nats_server
from noetl_stream.kv.provision import provision
from noetl_stream.natsconn import connect
from noetl_stream.subjects import Topology


def test_finds_the_wheel_binary() -> None:
    assert os.access(find_nats_server(), os.X_OK)


async def _publish_and_count(server: EmbeddedNats, topology: Topology, publish: int) -> int:
    nc = await connect(server.url, connect_wait_s=10)
    try:
        js = nc.jetstream(timeout=10)
        await provision(js, topology)
        for i in range(publish):
            await js.publish(topology.event_subject(f"e{i}", "step.done"), b"{}")
        return (await js.stream_info(topology.events_stream)).state.messages
    finally:
        await nc.close()


async def test_restart_keeps_port_and_file_data() -> None:
    topology = Topology(prefix="emb")
    async with EmbeddedNats() as server:
        url, first_pid = server.url, server.pid
        assert await _publish_and_count(server, topology, 3) == 3
        await asyncio.to_thread(server.restart)
        assert server.url == url and server.pid != first_pid
        assert await _publish_and_count(server, topology, 0) == 3


async def test_kill_then_start_recovers_file_data() -> None:
    topology = Topology(prefix="emb")
    async with EmbeddedNats() as server:
        assert await _publish_and_count(server, topology, 2) == 2
        server.kill()
        assert not server.running
        await asyncio.to_thread(server.start)
        assert await _publish_and_count(server, topology, 1) == 3


def test_stop_ends_the_process_and_close_removes_the_temp_dir() -> None:
    server = EmbeddedNats()
    server.start()
    pid = server.pid
    assert pid is not None and server.running
    server.stop()
    assert not server.running
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    directory = server.dir
    server.close()
    assert not directory.exists()


def test_a_forgotten_server_is_killed_and_its_temp_dir_removed() -> None:
    server = EmbeddedNats()
    server.start()
    pid, directory = server.pid, server.dir
    assert pid is not None
    del server
    gc.collect()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not directory.exists()


def test_closed_server_cannot_start_again() -> None:
    server = EmbeddedNats()
    server.close()
    with pytest.raises(EmbeddedNatsError, match="closed"):
        server.start()


def test_given_directory_is_kept(tmp_path: Path) -> None:
    with EmbeddedNats(tmp_path / "nats") as server:
        log = server.log_path.read_text()
        assert log.count("Server is ready") == 1 and "[WRN]" not in log and "[ERR]" not in log
    assert (tmp_path / "nats" / "store").is_dir()


def test_sync_interval_and_monitoring() -> None:
    with EmbeddedNats(monitor_port=0, sync_interval="always") as server:
        assert server.monitor_url is not None
        with urllib.request.urlopen(server.monitor_url + "/varz") as resp:
            varz = json.load(resp)
    assert varz["jetstream"]["config"]["sync_always"] is True


def test_extra_config_file_is_included(tmp_path: Path) -> None:
    extra = tmp_path / "extra.conf"
    extra.write_text("server_name: noetl-test-server\n")
    with EmbeddedNats(config_file=extra) as server:
        assert "noetl-test-server" in server.log_path.read_text()


def test_startup_failure_reports_the_log(tmp_path: Path) -> None:
    bad = tmp_path / "bad.conf"
    bad.write_text("this is { not valid\n")
    server = EmbeddedNats(config_file=bad)
    try:
        with pytest.raises(EmbeddedNatsError, match="exited"):
            server.start()
    finally:
        server.close()
    assert not server.running
