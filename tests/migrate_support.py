"""What the tests of ``migrate`` on NoETL's dialect share: the checked migration of a playbook, its steps
as plain data, a task's policy rules, and a refusal's errors."""

from __future__ import annotations

from typing import Any

from helpers import playbook
from legacy_support import yaml

from noetl_stream.dsl import compile_playbook
from noetl_stream.dsl.migrate import migrate_text


def migrated(text: str) -> str:
    """The migrated text, checked: it validates without a ``dialect`` warning (nor any error) and
    migrates to itself; the original had ``dialect`` warnings and each rewrite was reported."""
    before = compile_playbook(text, "in.yaml")
    assert [d for d in before.diagnostics if d.code == "dialect"], "no NoETL form in the input"
    migration = migrate_text(text, "in.yaml")
    assert migration.text is not None, [d.format() for d in migration.diagnostics]
    assert migration.changed
    assert migration.errors == ()
    after = compile_playbook(migration.text, "out.yaml")
    assert after.errors == (), [d.format() for d in after.errors]
    assert [d.format() for d in after.diagnostics if d.code == "dialect"] == []
    again = migrate_text(migration.text, "out.yaml")
    assert (again.text, again.diagnostics, again.changed) == (migration.text, (), False)
    return migration.text


def steps(text: str) -> dict[str, Any]:
    return {s["step"]: s for s in yaml(text)["workflow"]}


def migrated_steps(workflow: str, *, workload: dict[str, Any] | None = None) -> dict[str, Any]:
    """The steps, by name, of the playbook whose ``workflow:`` is `workflow`, migrated (and checked)."""
    return steps(migrated(playbook(workflow, workload=workload)))


def rules(step: dict[str, Any], task: int | None = None) -> list[dict[str, Any]]:
    tool = step["tool"] if task is None else step["tool"][task]
    return list(tool["spec"]["policy"]["rules"])


def refused(text: str, file: str) -> list[str]:
    """The messages of the errors for which ``migrate`` writes nothing."""
    migration = migrate_text(text, file)
    assert migration.text is None
    return [d.message for d in migration.errors]
