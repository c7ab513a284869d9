"""``noetl-stream migrate`` on NoETL's dialect (noetl.io/v2 as NoETL's users write it): every form
``validate`` warns about (code ``dialect``) is written in its canonical spelling, the result validates
without a ``dialect`` warning and migrates to itself, comments and key order are kept; a form without
a canonical spelling is an error and nothing is written.

Here a whole playbook (comments, key order and styles kept, each form reported at its line) and the
command line; ``set:`` in its places is in test_migrate_dialect_set.py, a task's keys and its policy in
test_migrate_dialect_tasks.py, the names templates read in test_migrate_dialect_names.py."""

from __future__ import annotations

from typing import Any

from migrate_support import migrated
from test_migrate import noetl

from noetl_stream.dsl.migrate import migrate_text

# -- the whole file: comments, order, styles --------------------------------------------------------

# The first lines of the playbook, the same before and after.
HEAD = """\
# Pages through an API (NoETL's dialect).
apiVersion: noetl.io/v2
kind: Playbook
metadata:
  name: pages   # kept
  path: tests/pages
workload:
  api_url: http://127.0.0.1:1   # the API
workflow:
  - step: start
"""

NOETL = (
    HEAD
    + """\
    set:
      ctx.page: 1    # the first page
    next:
      arcs:
        - step: fetch

  # one page at a time
  - step: fetch
    tool:
      kind: http
      url: "{{ api_url }}/items"
      params: {page: "{{ page }}"}
      timeout: 5   # seconds
      spec:
        policy:
          rules:
            - when: "{{ output.status == 'error' and output.error.retryable }}"
              then: {do: retry, attempts: 3, backoff: fixed}
            - else: {do: continue}
    set:
      ctx.page: "{{ page + 1 }}"
      ctx.more: "{{ output.data.data.more }}"
    next:
      arcs:
        - step: fetch
          when: "{{ event.name == 'call.done' and ctx.more }}"
        - step: end
          when: "{{ event.name == 'call.done' }}"

  - step: end
    tool:
      kind: noop
      result: "{{ ctx.fetch.data }}"
"""
)

CANONICAL = (
    HEAD
    + """\
    tool:
      - name: start_set
        kind: noop
        spec:
          policy:
            rules:
              - when: "{{ outcome.status == 'ok' }}"
                then:
                  do: continue
                  set_ctx:
                    page: 1 # the first page
    next:
      arcs:
        - step: fetch

  # one page at a time
  - step: fetch
    tool:
      kind: http
      url: "{{ api_url }}/items"
      params: {page: "{{ ctx.page }}"}
      spec:
        policy:
          rules:
            - when: "{{ outcome.status == 'error' and (outcome.error.retryable | default(false)) }}"
              then: {do: retry, attempts: 3, backoff: none}
            - else:
                then:
                  do: continue
                  set_ctx:
                    page: "{{ ctx.page + 1 }}"
                    more: "{{ outcome.result.data.data.more }}"
        timeout: 5 # seconds
    next:
      arcs:
        - step: fetch
          when: "{{ event.name == 'step.done' and ctx.more }}"
        - step: end
          when: "{{ event.name == 'step.done' }}"

  - step: end
    tool:
      kind: noop
      result: "{{ fetch.data }}"
"""
)


def test_a_dialect_playbook_is_rewritten_keeping_comments_order_and_styles() -> None:
    assert migrated(NOETL) == CANONICAL


def test_each_form_is_reported_at_the_line_the_author_wrote_it() -> None:
    migration = migrate_text(NOETL, "pages.yaml")
    found = sorted((d.line, d.message.split(": ", 1)[1][:40]) for d in migration.diagnostics)
    assert found == [
        (11, "'set:' on a step is NoETL's; canonical: "),
        (22, "'{{ page }}' reads a ctx value bare (NoE"),
        (23, "'timeout: 5' written as 'spec: {timeout:"),
        (27, "'output' in a task policy is NoETL's env"),
        (28, "002 'backoff: fixed' translated to 'back"),  # (a legacy draft's form too)
        (29, "002 'else' with a flat action translated"),
        (30, "'output' in a step's 'set' is NoETL's na"),
        (30, "'set:' on a step is NoETL's; canonical: "),
        (31, "'{{ page }}' reads a ctx value bare (NoE"),
        (36, "'call.done' is NoETL's name for 'step.do"),
        (38, "'call.done' is NoETL's name for 'step.do"),
        (43, "'ctx.fetch' reads the result of step 'fe"),
    ]
    assert all(d.severity == "warning" for d in migration.diagnostics)


def test_a_canonical_playbook_is_not_changed() -> None:
    text = migrated(NOETL).replace("# kept", "#  as written")
    migration = migrate_text(text, "c.yaml")
    assert (migration.text, migration.diagnostics, migration.changed) == (text, (), False)


# -- the command line ------------------------------------------------------------------------------


def test_the_command_line_lists_what_it_rewrote(tmp_path: Any) -> None:
    source, out = tmp_path / "pages.yaml", tmp_path / "out.yaml"
    source.write_text(NOETL)
    proc = noetl("migrate", str(source), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert out.read_text() == CANONICAL
    lines = proc.stderr.splitlines()
    assert lines[-1] == f"{out}: migrated (2 legacy constructs translated, 10 NoETL dialect forms rewritten)"
    assert (
        f"{source}:23:7: warning: step 'fetch' task 'fetch_task': 'timeout: 5' written as 'spec: {{timeout: 5}}' (at workflow[1].tool.timeout)"
        in lines
    )
    again = noetl("migrate", str(out), "-q", "--in-place")
    assert (again.returncode, again.stderr) == (0, f"{out}: nothing to rewrite (already canonical)\n")
    assert out.read_text() == CANONICAL
