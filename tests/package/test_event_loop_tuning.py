"""The garbage collector settings every long-running process starts with (`noetl_stream.loop`)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from noetl_stream.errors import ConfigurationError
from noetl_stream.loop import GC_THRESHOLD, run_event_loop, tune_gc


@pytest.fixture(autouse=True)
def restore_gc() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


def test_tune_gc_freezes_what_exists_and_sets_the_thresholds() -> None:
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    assert tune_gc((5_000, 7, 3)) == (5_000, 7, 3)
    assert gc.get_threshold() == (5_000, 7, 3)
    assert gc.get_freeze_count() > 1_000  # modules, classes, functions: out of the collector's sight
    gc.collect()  # frozen objects are not collected, and collecting still works
    assert gc.get_freeze_count() > 1_000


def test_the_default_and_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOETL_GC_THRESHOLD", raising=False)
    assert tune_gc() == GC_THRESHOLD
    assert GC_THRESHOLD[0] > 700  # the point: fewer young-generation collections than Python's default
    monkeypatch.setenv("NOETL_GC_THRESHOLD", "2000,10,10")
    assert tune_gc() == (2_000, 10, 10)
    assert gc.get_threshold() == (2_000, 10, 10)


@pytest.mark.parametrize("value", ["1,2", "a,b,c", "1,2,3,4", "-1,10,10", "0,10,10", "700;10;10"])
def test_a_bad_setting_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("NOETL_GC_THRESHOLD", value)
    before = gc.get_threshold()
    with pytest.raises(ConfigurationError, match="NOETL_GC_THRESHOLD must be three integers"):
        tune_gc()
    assert gc.get_threshold() == before  # nothing changed


def test_run_event_loop_runs_with_the_tuned_collector(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOETL_GC_THRESHOLD", "3000,11,12")

    async def inside() -> tuple[int, int, int]:
        return gc.get_threshold()

    gc.set_threshold(701, 11, 11)
    assert run_event_loop(inside()) == (3_000, 11, 12)
    assert gc.get_threshold() == (701, 11, 11)  # the caller's thresholds again
    assert gc.get_freeze_count() == 0


def test_the_cli_refuses_a_bad_setting_with_exit_code_2(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from click.testing import CliRunner

    from noetl_stream.cli import main

    playbook = tmp_path / "p.yaml"
    playbook.write_text(
        "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: p, path: p}\n"
        "workflow:\n  - step: start\n    tool: {kind: noop}\n"
    )
    monkeypatch.setenv("NOETL_GC_THRESHOLD", "lots")
    for args in (["run", str(playbook)], ["status", "--nats", "nats://127.0.0.1:1", "some-id"]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2, (args, result.output)
        assert "NOETL_GC_THRESHOLD must be three integers" in result.output
