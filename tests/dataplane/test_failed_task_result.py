"""A task whose outcome was an error, continued past by its policy, has no result under its name: a
later task reading it gets a template error, never the result of the task's previous run."""

from __future__ import annotations

from helpers import playbook

from noetl_stream.runtime.local import Runtime

# `fetch_page` fails on page 3 (its policy continues); `store` records what it sees, pages 1 to 3.
PAGES = """
- step: start
  tool:
    - name: init
      kind: noop
      spec: {policy: {rules: [{else: {then: {do: continue, set_iter: {page: 1, log: []}}}}]}}
    - name: fetch_page
      kind: python
      args: {page: "{{ iter.page }}"}
      code: |
        if page == 3:
            raise LookupError("page 3 is gone")
        result = {"page": page}
      spec:
        policy:
          rules:
            - else: {then: {do: continue}}
    - name: store
      kind: python
      args: {seen: SEEN, page: "{{ iter.page }}", log: "{{ iter.log }}"}
      code: |
        result = log + [[page, seen]]
      spec:
        policy:
          rules:
            - when: "{{ outcome.status == 'ok' and iter.page < 3 }}"
              then: {do: jump, to: fetch_page, set_iter: {page: "{{ iter.page + 1 }}", log: "{{ outcome.result }}"}}
            - when: "{{ outcome.status == 'ok' }}"
              then: {do: break}
            - else: {then: {do: fail}}
"""


async def test_a_failed_task_continued_past_has_no_result_under_its_name(runtime: Runtime) -> None:
    guarded = PAGES.replace("SEEN", "\"{{ fetch_page.page if fetch_page is defined else 'none' }}\"")
    summary = await runtime.run_playbook(playbook(guarded), timeout=30)
    assert summary.status == "success", summary.error
    assert summary.result == [[1, 1], [2, 2], [3, "none"]]  # not page 2's result again


async def test_reading_a_failed_task_s_result_is_a_template_error(runtime: Runtime) -> None:
    summary = await runtime.run_playbook(
        playbook(PAGES.replace("SEEN", '"{{ fetch_page.page }}"')), timeout=30
    )
    assert summary.status == "failed"
    assert summary.error is not None
    assert summary.error["kind"] == "template_error", summary.error
    assert "'fetch_page' is undefined" in summary.error["message"], summary.error
