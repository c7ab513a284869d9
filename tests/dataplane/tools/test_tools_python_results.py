"""A ``python`` task's result and error, end to end: ``result = ...``, ``def main`` (matching inputs,
``**kw``, async), a top-level ``return`` (NoETL's Rust engine wraps the code in a function); an exception
or a failed ``assert`` is a ``python_error`` with its type and a traceback of the task's own frames."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from helpers import playbook, run

from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.protocol.subjects import Topology
from noetl_stream.runtime.local import Runtime, local_runtime


def _task(code: str, args: str = "{}") -> str:
    body = "\n".join("        " + line for line in code.strip("\n").splitlines())
    return playbook(f"- step: start\n  tool:\n    kind: python\n    args: {args}\n    code: |\n{body}\n")


@pytest.mark.parametrize(
    ("code", "args", "result"),
    [
        pytest.param("result = a + 1", "{a: 1}", 2, id="result-variable"),
        pytest.param("def main(a):\n    return a * 10", "{a: 2, unused: 0}", 20, id="main-matching-inputs"),
        pytest.param("def main(**kw):\n    return sorted(kw)", "{a: 1, b: 2}", ["a", "b"], id="main-kw"),
        pytest.param(
            "import asyncio\nasync def main(a):\n    await asyncio.sleep(0)\n    return a",
            "{a: 3}",
            3,
            id="async-main",
        ),
        pytest.param("return {'sum': a + b}", "{a: 1, b: 2}", {"sum": 3}, id="top-level-return"),
        # assigning to an input works as at module level (the inputs are the wrapper's parameters)
        pytest.param("a = a + 1\nreturn a", "{a: 1}", 2, id="return-assigns-an-input"),
        # names assigned at the top are the wrapper's locals: functions defined there see them
        pytest.param(
            "rate = 3\ndef scaled(x):\n    return x * rate\nreturn [scaled(v) for v in values]",
            "{values: [1, 2]}",
            [3, 6],
            id="return-closures",
        ),
        # the code falls off its end: the local `result` is the result
        pytest.param(
            "if a:\n    return 'early'\nresult = 'late'", "{a: 0}", "late", id="return-falls-through"
        ),
        pytest.param("return input_data", "{a: 1}", {"a": 1}, id="return-input-data"),
        # a top-level return wins over a main it defines (main is not called)
        pytest.param("def main():\n    return 'main'\nreturn 'top'", "{}", "top", id="return-beside-main"),
        pytest.param(
            "from __future__ import annotations\ndef f(x: Later) -> int:\n    return x\nreturn f(4)",
            "{}",
            4,
            id="return-after-future-import",
        ),
    ],
)
async def test_the_result_forms(runtime: Runtime, code: str, args: str, result: object) -> None:
    r = await run(runtime, _task(code, args))
    assert r.status == "success", r.summary.error
    assert r.result == result


@pytest.mark.parametrize(
    ("code", "exception_type", "line", "frames"),
    [
        pytest.param(
            "x = 1\nassert x == 2, 'x must be 2'",
            "AssertionError",
            2,
            ['  File "<start.start_task>", line 2, in <module>', "    assert x == 2, 'x must be 2'"],
            id="assert",
        ),
        pytest.param(
            "def inner():\n    raise KeyError('k')\ndef main():\n    inner()",
            "KeyError",
            2,
            [
                '  File "<start.start_task>", line 4, in main',
                "    inner()",
                '  File "<start.start_task>", line 2, in inner',
                "    raise KeyError('k')",
            ],
            id="main-and-a-helper",
        ),
        pytest.param(
            "n = 0\nreturn 1 / n",
            "ZeroDivisionError",
            2,
            ['  File "<start.start_task>", line 2, in <module>', "    return 1 / n"],
            id="top-level-return-keeps-its-lines",
        ),
        pytest.param(
            "import sys\nsys.exit(3)",
            "SystemExit",
            2,
            ['  File "<start.start_task>", line 2, in <module>', "    sys.exit(3)"],
            id="sys-exit",
        ),
    ],
)
async def test_an_exception_is_a_python_error_with_its_type_and_traceback(
    runtime: Runtime, code: str, exception_type: str, line: int, frames: list[str]
) -> None:
    r = await run(runtime, _task(code))
    assert r.status == "failed"
    error = r.step_error("start")
    assert error["kind"] == "python_error" and error["message"].startswith(f"{exception_type}: "), error
    assert f"(line {line})" in error["message"]
    [done] = r.tasks("start")
    assert done.payload["error"]["traceback"] == error["traceback"]
    lines = error["traceback"].splitlines()
    # Python's own format (without its header line), with the task's frames only (none of the worker's)
    assert lines[:-1] == frames
    assert lines[-1].startswith(f"{exception_type}")
    assert "noetl_stream" not in error["traceback"] and "asyncio" not in error["traceback"]


async def test_a_timeout_error_the_code_raises_is_its_error_not_the_tasks_timeout(runtime: Runtime) -> None:
    r = await run(runtime, _task("import errno\nraise TimeoutError(errno.ETIMEDOUT, 'connect timed out')"))
    assert r.status == "failed"
    error = r.step_error("start")
    assert error["kind"] == "python_error" and error["retryable"] is False, error
    assert error["message"] == "TimeoutError: [Errno 110] connect timed out (line 2)"
    assert error["traceback"].splitlines()[:2] == [
        '  File "<start.start_task>", line 2, in <module>',
        "    raise TimeoutError(errno.ETIMEDOUT, 'connect timed out')",
    ]


async def test_a_module_functions_traceback_shows_its_frames(
    runtime: Runtime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "tbmod_check.py").write_text(
        "def check(a):\n    return _inner(a)\n\n\ndef _inner(a):\n    assert a > 0, 'a must be positive'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    text = playbook("- step: start\n  tool: {kind: python, module: 'tbmod_check:check', input: {a: -1}}")
    r = await run(runtime, text)
    assert r.status == "failed"
    error = r.step_error("start")
    assert error["kind"] == "python_error" and error["message"] == "AssertionError: a must be positive"
    source = tmp_path / "tbmod_check.py"
    assert error["traceback"].splitlines() == [
        f'  File "{source}", line 2, in check',
        "    return _inner(a)",
        f'  File "{source}", line 6, in _inner',
        "    assert a > 0, 'a must be positive'",
        "AssertionError: a must be positive",
    ]


async def test_a_policy_reads_the_exception_type(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool:
            - name: risky
              kind: python
              code: "assert False, 'nope'"
              spec:
                policy:
                  rules:
                    - when: "{{ outcome.py.exception_type == 'AssertionError' }}"
                      then: {do: continue, set_iter: {kind: "{{ outcome.error.kind }}"}}
            - name: after
              kind: noop
              result: "{{ iter.kind }}"
        """
    )
    r = await run(runtime, text)
    assert r.status == "success", r.summary.error
    assert r.result == "python_error"


async def test_a_syntax_error_is_a_python_error_with_its_place(runtime: Runtime) -> None:
    r = await run(runtime, _task("return 1\nx = ("))
    assert r.status == "failed"
    error = r.step_error("start")
    assert error["kind"] == "python_error" and error["message"].startswith("SyntaxError: "), error
    assert "(line 2)" in error["message"]
    assert error["traceback"].splitlines()[:2] == ['  File "<start.start_task>", line 2', "    x = ("]


SECRET = "py-tb-secret-4c1d9e"


async def test_a_keychain_value_is_masked_in_the_traceback(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOETL_TEST_PY_TB_TOKEN", SECRET)
    text = """apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: tb, path: tests/tb}
keychain:
  - {name: token, kind: bearer, env: NOETL_TEST_PY_TB_TOKEN}
workflow:
  - step: start
    tool:
      kind: python
      code: |
        raise RuntimeError("refused: {{ keychain.token.value }}")
"""
    r = await run(runtime, text)
    assert r.status == "failed"
    error = r.step_error("start")
    # the source line shown and the exception's text both held the value
    assert error["traceback"].splitlines()[-2:] == [
        '    raise RuntimeError("refused: ***")',
        "RuntimeError: refused: ***",
    ]
    assert SECRET.encode() not in b"".join(msgspec.json.encode(e) for e in r.events)


# --- ``python`` task code, end to end: an ``async def main`` is awaited, its errors are the task's.


async def test_async_main_is_awaited(nats_server: EmbeddedNats, topology: Topology) -> None:
    text = playbook(
        """
        - step: start
          tool:
            - name: add
              kind: python
              args: {a: 2, b: 3}
              code: |
                import asyncio
                async def main(a, b):
                    await asyncio.sleep(0)
                    return {"sum": a + b}
            - name: boom
              kind: python
              code: |
                async def main():
                    raise LookupError("no such row")
              spec:
                policy:
                  rules:
                    - when: "{{ outcome.status == 'error' }}"
                      then: {do: continue}
            - name: out
              kind: noop
              result: {add: "{{ add }}", kind: "{{ _prev.error.kind | default('none') }}"}
        """
    )
    async with local_runtime(nats_server.url, topology=topology) as rt:
        r = await run(rt, text)
    assert r.status == "success", r.summary
    assert r.step_result("start")["add"] == {"sum": 5}
    [boom] = r.tasks("start", "boom")
    assert boom.payload["error"]["kind"] == "python_error"
    assert "no such row" in boom.payload["error"]["message"]


@pytest.mark.parametrize(
    "task",
    [
        "{kind: python, code: 'import time; time.sleep(3)', spec: {timeout: '0.3'}}",
        "{kind: script, code: 'sleep 3', spec: {timeout: '0.3'}}",
    ],
)
async def test_timeout_given_as_text_still_bounds_the_task(
    nats_server: EmbeddedNats, topology: Topology, task: str
) -> None:
    # `timeout: "0.3"` (quoted in YAML) must not read as "no limit".
    text = playbook(f"- step: start\n  tool: {task}")
    async with local_runtime(nats_server.url, topology=topology) as rt:
        r = await run(rt, text)
    assert r.status == "failed"
    err = r.step_error("start")
    assert err["kind"] == "timeout" and "0.3s" in err["message"], err


@pytest.mark.parametrize("timeout", ["soon", "-1", "'-0.5'"])
@pytest.mark.parametrize("kind, code", [("python", "result = 1"), ("script", "true")])
async def test_timeout_that_is_not_a_number_is_a_config_error(
    nats_server: EmbeddedNats, topology: Topology, kind: str, code: str, timeout: str
) -> None:
    # A negative limit too (it timed the task out at once, without a word about the value).
    text = playbook(f"- step: start\n  tool: {{kind: {kind}, code: '{code}', spec: {{timeout: {timeout}}}}}")
    async with local_runtime(nats_server.url, topology=topology) as rt:
        r = await run(rt, text)
    assert r.status == "failed"
    err = r.step_error("start")
    assert err["kind"] == "config_error" and "spec.timeout" in err["message"], err
