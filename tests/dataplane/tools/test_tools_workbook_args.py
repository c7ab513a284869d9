"""`kind: workbook`: the template's tool gets the caller's rendered ``args`` as its own ``args``.

docs/semantics.md: a workbook task runs the root template "with the caller's rendered `args` as
`args`"; docs/tools.md: a python task binds its ``args`` as local names (and as ``args``). A template
that declares ``args`` (or ``input``) of its own renders them with the caller's in scope as ``args``; they
are defaults, and the caller's keys win (as NoETL merges a workbook call's ``input``).
"""

from __future__ import annotations

from helpers import run

from noetl_stream.runtime.local import Runtime

HEADER = """apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: wb, path: tests/wb}
"""


async def test_a_template_without_args_of_its_own_gets_the_callers_args(runtime: Runtime) -> None:
    text = (
        HEADER
        + """workload: {xs: [1, 2, 3]}
workbook:
  double:
    kind: python
    code: |
      def main(v):
          return v * 2
  echo:
    kind: python
    code: |
      result = {"args": args, "local": label}
workflow:
  - step: start
    loop: {in: "{{ workload.xs }}", iterator: x, spec: {mode: parallel}}
    tool:
      - {name: double, kind: workbook, args: {v: "{{ iter.x }}"}}
      - {name: seen, kind: workbook, task: echo, args: {label: "x{{ iter.x }}", d: "{{ double }}"}}
"""
    )

    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    assert r.result == [{"args": {"label": f"x{x}", "d": 2 * x}, "local": f"x{x}"} for x in (1, 2, 3)]


async def test_a_templates_own_args_render_with_the_callers_and_the_callers_win_key_by_key(
    runtime: Runtime,
) -> None:
    text = (
        HEADER
        + """workbook:
  scaled:
    kind: python
    args: {scaled: "{{ args.v * 10 }}", unit: cm, tag: t}
    code: |
      result = dict(args)
workflow:
  - step: start
    tool:
      - {name: scaled, kind: workbook, args: {v: 4, unit: m, note: kept}}
"""
    )

    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    assert r.result == {"scaled": 40, "tag": "t", "v": 4, "unit": "m", "note": "kept"}
