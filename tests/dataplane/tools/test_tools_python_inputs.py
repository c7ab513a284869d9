"""What ``python`` task code sees, end to end: its ``input:``/``args:`` keys as globals and as a whole
(``input_data``, ``args``), the pre-imported modules, and its ``libs:`` imports (checked by the compiler)."""

from __future__ import annotations

import pytest
from helpers import playbook, run
from legacy_support import report

from noetl_stream.runtime.local import Runtime


async def test_input_keys_are_rendered_globals_and_the_whole_mapping_is_input_data_and_args(
    runtime: Runtime,
) -> None:
    text = playbook(
        """
        - step: start
          tool:
            kind: python
            input: {city: "{{ workload.city }}", n: "{{ workload.n * 2 }}"}
            code: |
              result = {"city": city, "n": n, "input_data": input_data, "args": args}
        """,
        workload={"city": "Oslo", "n": 21},
    )
    r = await run(runtime, text)
    assert r.status == "success", r.summary.error
    whole = {"city": "Oslo", "n": 42}
    assert r.result == {"city": "Oslo", "n": 42, "input_data": whole, "args": whole}


async def test_input_beside_args_is_merged_into_them_and_wins(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool:
            kind: python
            args: {a: 1, both: from-args}
            input: {b: "{{ workload.b }}", both: from-input}
            code: |
              result = [a, b, both, sorted(input_data)]
        """,
        workload={"b": 2},
    )
    r = await run(runtime, text)
    assert r.status == "success", r.summary.error
    assert r.result == [1, 2, "from-input", ["a", "b", "both"]]


def test_input_beside_args_that_is_not_a_mapping_is_a_compile_error() -> None:
    text = playbook(
        """
        - step: start
          tool:
            kind: python
            args: "{{ workload.x }}"
            input: {b: 2}
            code: "result = 1"
        """
    )
    assert report(text) == [
        "8:7: step 'start' task 'start_task': 'input' and 'args' are merged (input's keys win), so both "
        "must be mappings; 'args' is not: keep one"
    ]


async def test_json_os_datetime_uuid_and_sys_are_imported(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool:
            kind: python
            code: |
              result = [
                  json.dumps({"a": 1}),
                  os.path.join("a", "b"),
                  datetime.date(2024, 2, 29).isoformat(),
                  str(uuid.UUID(int=1)),
                  sys.version_info[0],
              ]
        """
    )
    r = await run(runtime, text)
    assert r.status == "success", r.summary.error
    assert r.result == ['{"a": 1}', "a/b", "2024-02-29", "00000000-0000-0000-0000-000000000001", 3]


async def test_libs_import_modules_and_names_under_their_aliases(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool:
            kind: python
            libs:
              pp: pprint                                # import pprint as pp
              textwrap: textwrap                        # import textwrap
              dt: {from: datetime, import: datetime}    # from datetime import datetime as dt
              etree: {from: xml, import: etree}         # from xml import etree (a submodule)
            code: |
              result = [pp.pformat([1]), textwrap.dedent("  x"), dt(2024, 1, 2).day, etree.__name__]
        """
    )
    r = await run(runtime, text)
    assert r.status == "success", r.summary.error
    assert r.result == ["[1]", "x", 2, "xml.etree"]


@pytest.mark.parametrize(
    ("libs", "message"),
    [
        ("{pd: no_such_module_zz}", "libs 'pd': cannot import 'no_such_module_zz'"),
        ("{f: {from: os, import: no_such_name_zz}}", "libs 'f': cannot import 'no_such_name_zz' from 'os'"),
    ],
)
async def test_a_lib_that_cannot_be_imported_is_a_task_error_naming_it(
    runtime: Runtime, libs: str, message: str
) -> None:
    text = playbook(f"- step: start\n  tool: {{kind: python, libs: {libs}, code: 'result = 1'}}")
    r = await run(runtime, text)
    assert r.status == "failed"
    error = r.step_error("start")
    assert error["kind"] == "python_error" and message in error["message"], error


def test_a_malformed_libs_is_a_compile_error_at_its_place() -> None:
    text = playbook(
        """
        - step: start
          tool:
            kind: python
            libs:
              ok: json
              9x: os
              dt: {from: datetime}
              bad: "not a module"
            code: "result = 1"
        - step: other
          tool: {kind: python, libs: [pandas], code: "result = 1"}
        """
    )
    assert report(text) == [
        "10:9: step 'start' task 'start_task': libs name '9x' must be a Python identifier (the code reads it)",
        "11:9: step 'start' task 'start_task': libs 'dt': missing 'import' ({pd: pandas} or "
        "{dt: {from: datetime, import: datetime}})",
        "12:14: step 'start' task 'start_task': libs 'bad' must be a module name or {from, import}, got "
        "'not a module'",
        "15:32: step 'other' task 'other_task': 'libs' must be a mapping of names to modules: {pd: pandas} or "
        "{dt: {from: datetime, import: datetime}}",
    ]
