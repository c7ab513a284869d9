"""``noetl-stream migrate``: legacy playbooks rewritten in the canonical form, comments and order kept;
``validate --legacy`` and ``run --legacy``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from noetl_stream.dsl import compile_playbook
from noetl_stream.dsl.migrate import migrate_text
from noetl_stream.jetstream.embedded import EmbeddedNats

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parents[1] / "data"

COMMENTED = """\
# A legacy playbook.
apiVersion: noetl.io/v2
kind: Playbook
name: commented   # the old root name
path: tests/commented
workload:
  greeting: hello   # kept as is
workflow:
  # the first step
  - step: start
    next: work    # go on
  - step: work
    desc: does the work
    tool:
      kind: python
      code: |
        result = 42
    vars:
      answer: "{{ result }}"   # stored for later
    next: [end]
  # the last step
  - step: end
    tool: {kind: noop, result: "{{ vars.answer }}"}
"""

MIGRATED = """\
# A legacy playbook.
apiVersion: noetl.io/v2
kind: Playbook
metadata:
  name: commented # the old root name
  path: tests/commented
workload:
  greeting: hello   # kept as is
workflow:
  # the first step
  - step: start
    next:         # go on
      arcs:
        - step: work
  - step: work
    desc: does the work
    tool:
      - name: work_task
        kind: python
        code: |
          result = 42
      - name: work_result
        kind: noop
        spec:
          policy:
            rules:
              - else:
                  then:
                    do: continue
                    set_ctx:
                      answer: "{{ outcome.result }}" # stored for later
    next:
      arcs:
        - step: end
          when: "{{ event.name != 'step.failed' }}"
  # the last step
  - step: end
    tool: {kind: noop, result: "{{ ctx.answer }}"}
"""


def test_migrate_keeps_comments_key_order_and_styles() -> None:
    migration = migrate_text(COMMENTED, "commented.yaml")
    assert migration.text == MIGRATED
    assert migration.changed
    assert [d.line for d in migration.diagnostics] == [4, 11, 20, 18, 23]


def test_the_result_validates_without_extensions_and_migrates_to_itself() -> None:
    migration = migrate_text(COMMENTED, "commented.yaml")
    assert migration.text is not None
    result = compile_playbook(migration.text, "out.yaml")
    assert result.playbook is not None and result.diagnostics == ()
    again = migrate_text(migration.text, "out.yaml")
    assert (again.text, again.diagnostics, again.changed) == (migration.text, (), False)


@pytest.mark.parametrize("name", ["legacy/case_retry_sink.yaml", "dsl/minimal_label_as_key.yaml"])
def test_fixture_playbooks_migrate_to_playbooks_that_validate(name: str) -> None:
    text = (DATA / name).read_text()
    migration = migrate_text(text, name)
    assert migration.text is not None, [d.format() for d in migration.errors]
    assert migration.text.startswith(text.splitlines()[0] + "\n")  # the leading comment stays
    assert compile_playbook(migration.text, name).errors == ()


def test_a_construct_without_translation_means_no_output() -> None:
    text = COMMENTED.replace("workload:", "vars: {a: 1}\nworkload:")
    migration = migrate_text(text, "bad.yaml")
    assert migration.text is None
    assert [d.format() for d in migration.errors] == [
        "bad.yaml:6:1: root 'vars' has no canonical translation: a playbook has no execution variables with "
        "initial values (put inputs in workload, and write state with set_ctx in a task policy) (at vars)"
    ]


# -- the command line -------------------------------------------------------------------------------


def cli() -> str:
    local = Path(sys.executable).parent / "noetl-stream"
    found = str(local) if local.exists() else shutil.which("noetl-stream")
    assert found
    return found


def noetl(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "NOETL_NATS_URL"}
    return subprocess.run([cli(), *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


@pytest.fixture
def legacy_file(tmp_path: Path) -> Path:
    path = tmp_path / "legacy.yaml"
    path.write_text(COMMENTED)
    return path


def test_migrate_prints_the_result_and_lists_what_it_translated(legacy_file: Path) -> None:
    proc = noetl("migrate", str(legacy_file))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == MIGRATED
    assert f"{legacy_file}:4:1: warning: root 'name', 'path' translated to metadata (at name)" in proc.stderr
    quiet = noetl("migrate", "-q", str(legacy_file))
    assert (quiet.stdout, quiet.stderr) == (MIGRATED, "")


def test_migrate_writes_to_a_file_or_in_place(legacy_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.yaml"
    proc = noetl("migrate", str(legacy_file), "-o", str(out), "-q")
    assert proc.returncode == 0, proc.stderr
    assert out.read_text() == MIGRATED
    assert legacy_file.read_text() == COMMENTED
    assert proc.stderr == f"{out}: migrated (5 legacy constructs translated)\n"
    proc = noetl("migrate", str(legacy_file), "--in-place", "-q")
    assert proc.returncode == 0, proc.stderr
    assert legacy_file.read_text() == MIGRATED


def test_migrate_refuses_what_it_cannot_translate_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(COMMENTED.replace("workload:", "vars: {a: 1}\nworkload:"))
    proc = noetl("migrate", str(path), "--in-place")
    assert proc.returncode == 2
    assert "root 'vars' has no canonical translation" in proc.stderr
    assert path.read_text().startswith("# A legacy playbook.\napiVersion")
    assert "vars: {a: 1}" in path.read_text()


def test_migrate_needs_one_output(legacy_file: Path, tmp_path: Path) -> None:
    proc = noetl("migrate", str(legacy_file), "-o", str(tmp_path / "x.yaml"), "--in-place")
    assert proc.returncode == 2
    assert "give -o or --in-place, not both" in proc.stderr


def test_validate_legacy(legacy_file: Path) -> None:
    plain = noetl("validate", str(legacy_file))
    assert plain.returncode == 2
    assert "(enable legacy extensions to translate it)" in plain.stderr
    legacy = noetl("validate", "--legacy", str(legacy_file))
    assert legacy.returncode == 0, legacy.stderr
    assert legacy.stdout.endswith(f"{legacy_file}: ok (commented, 3 steps)\n")
    assert (
        f"{legacy_file}:4:1: warning: root 'name', 'path' translated to metadata (at name)" in legacy.stdout
    )
    shown = noetl("validate", "--legacy", "--show-canonical", str(legacy_file))
    assert shown.returncode == 0
    assert f"# {legacy_file}: canonical form\n" in shown.stdout
    assert (
        "              - else:\n                  then:\n                    do: continue\n" in shown.stdout
    )


def test_run_legacy_runs_the_translation(legacy_file: Path, nats_server: EmbeddedNats) -> None:
    proc = noetl("run", "--legacy", "--json", "--nats", nats_server.url, str(legacy_file), "--prefix", "tmig")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (out["status"], out["result"], out["ctx"]) == ("success", 42, {"answer": 42})
    refused = noetl("run", "--json", "--nats", nats_server.url, str(legacy_file))
    assert refused.returncode == 2
