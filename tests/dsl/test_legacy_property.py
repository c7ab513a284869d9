"""Property tests: mutated legacy (and sugar, dialect) playbooks never crash the translation, the
compiler or ``migrate``; what ``migrate`` writes always validates without extensions."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from legacy_support import CASE_FILE, fragment_002
from ruamel.yaml import YAML
from test_dsl_property import SETTINGS, _dump, _mutate, check

from noetl_stream.dsl import compile_playbook
from noetl_stream.dsl.migrate import migrate_text

EXTRA = """\
apiVersion: noetl.io/v2
kind: Playbook
name: extra
path: tests/extra
executor: {spec: {extensions: [legacy]}}
workload: {url: "http://x", items: [1, 2]}
workflow:
  - step: start
    next: [a, b]
  - step: a
    loop: {in: "{{ workload.items }}", iterator: item, mode: sequential}
    tool: {kind: http, endpoint: "{{ workload.url }}/{{ item }}", params: {page: 1}}
    case:
      - when: "{{ event.name == 'step.enter' and workload.skip }}"
        then: {skip: true}
      - when: "{{ event.name == 'step.enter' }}"
        then: {set: {ctx: {pages: []}}}
      - when: "{{ event.name == 'call.done' and response is defined and response.more }}"
        then:
          collect: {from: response.data, into: pages, mode: extend}
          call: {params: {page: "{{ response.page + 1 }}"}}
          sink: {tool: {kind: postgres, table: t}, args: {n: "{{ _retry.index }}"}}
      - when: "{{ event.name == 'call.error' }}"
        then: {retry: {max_attempts: 2, backoff_multiplier: 1.5}, next: [b]}
      - when: "{{ event.name == 'step.exit' and result }}"
        then:
          sink: {tool: {kind: postgres, auth: pg, command: "INSERT INTO t VALUES ({{ n }})"}, args: {n: 1}}
          next: [{step: b, args: {pages: "{{ pages }}"}}]
    vars: {count: "{{ result | length }}"}
  - step: b
    tool:
      - name: x
        kind: python
        code: "result = 1"
        set: {ctx.total: "{{ x }}", iter.n: 1}
        eval:
          - expr: "{{ outcome.status == 'success' }}"
            do: continue
            set_vars: {seen: true}
            set_prev: "{{ vars.seen }}"
          - else: {do: fail}
      - choose:
          - when: "{{ iter.n }}"
            then: [{kind: noop}]
          - else:
              - while: "{{ false }}"
                do: [{kind: noop, input: {a: 1}}]
    input: {q: 1}
    set: {ctx.done: true}
"""


def _load(text: str) -> Any:
    return YAML(typ="safe", pure=True).load(text)


def _wrapped_002() -> str:
    return (
        "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: w, path: w}\n"
        "executor: {spec: {extensions: [legacy]}}\nworkload: {base_url: u, sources: []}\nworkflow:\n"
        "  - step: start\n    next: crawl_sources\n" + fragment_002() + "  - step: summarize\n"
        "    tool: {kind: noop}\n  - step: tidy_up\n    tool: {kind: noop}\n"
    )


BASES = [
    CASE_FILE.read_text().replace(
        "kind: Playbook\n", "kind: Playbook\nexecutor: {spec: {extensions: [legacy]}}\n", 1
    ),
    _wrapped_002(),
    EXTRA,
]
BASE_DATA = [_load(text) for text in BASES]


# An example here compiles, migrates (a round-trip YAML load and dump) and compiles the result: several
# times the work of a test_dsl_property example, and a loaded CI runner once stretched a 0.1 s
# example past 2 s. The deadline still stops a blow-up; pytest's timeout stops a hang.
LEGACY_SETTINGS = settings(SETTINGS, deadline=timedelta(seconds=10))


def test_the_unmutated_bases_compile() -> None:
    for text in BASES:
        result = compile_playbook(text, "base.yaml")
        assert result.playbook is not None, [d.format() for d in result.errors]


@LEGACY_SETTINGS
@given(st.data())
def test_mutated_legacy_playbooks_never_crash_the_compiler_or_migrate(data: st.DataObject) -> None:
    mutated = _mutate(data.draw(st.sampled_from(BASE_DATA)), data.draw)
    text = _dump(mutated, data.draw(st.booleans()))
    check(text)
    migration = migrate_text(text, "fuzz.yaml")
    if migration.text is not None:
        assert compile_playbook(migration.text, "out.yaml").errors == ()
