"""What one template may cost (`noetl_stream.dsl.budget`): operations that would build a huge value fail
before they run, and a template that loops renders under a CPU-time budget; in the controller (arcs) and
in the worker (args) a runaway template fails its step with a ``template_error`` and everything else goes
on."""

from __future__ import annotations

import pytest
from helpers import playbook, run

from noetl_stream.dsl import budget
from noetl_stream.dsl.templates import RenderError, compile_template, render_value
from noetl_stream.runtime.local import Runtime

NESTED_LOOPS = "{% for a in range(99999) %}{% for b in range(99999) %}{% endfor %}{% endfor %}true"
LONG_EXPRESSION = "{{ lipsum(n=10**6) | length > 0 }}"  # one expression, as arcs and admission need


@pytest.fixture
def short_budget(monkeypatch: pytest.MonkeyPatch) -> float:
    monkeypatch.setattr(budget, "TEMPLATE_CPU_S", 0.2)
    return 0.2


@pytest.mark.parametrize(
    ("template", "said"),
    [
        ("{{ '%0999999999d' % 1 }}", "a format width or precision of 999,999,999"),
        ("{{ '%*d' % (5, 1) }}", "'*' width"),
        ("{{ '{:>999999999}'.format(1) }}", "a format width or precision of 999,999,999"),
        ("{{ '{:>{w}}'.format(1, w=9) }}", "computed width"),
        ("{{ 'x' | center(10**9) }}", "center(1000000000)"),
        ("{{ 'x' | indent(10**9) }}", "indent(1000000000)"),
        ("{{ 'x' | wordwrap(10**9) }}", "wordwrap(1000000000)"),
        ("{{ '%0999999999d' | format(1) }}", "a format width or precision of 999,999,999"),
        ("{{ 'a' * (n * 2**61) }}", "str * "),
        ("{{ [0] * 10**7 }}", "list * 10000000"),
        ("{{ 7 ** 100000 }}", "bits"),
        ("{{ 'ab' | replace('a', 'x' * 100000) | replace('x', 'y' * 100) }}", "replace would hold"),
    ],
)
def test_an_operation_that_would_build_a_huge_value_fails_at_once(template: str, said: str) -> None:
    with pytest.raises(RenderError, match="value too large for a template") as exc:
        render_value(template, {"n": 1}, "step 's' args.x")
    assert said in str(exc.value) and str(exc.value).startswith("step 's' args.x: ")


@pytest.mark.parametrize(
    "template",
    [NESTED_LOOPS, "{{ lipsum(n=10**6) }}", "{% macro f() %}" + NESTED_LOOPS + "{% endmacro %}{{ f() }}"],
)
def test_a_template_that_runs_long_fails_when_its_cpu_time_is_used_up(
    template: str, short_budget: float
) -> None:
    assert compile_template(template).guarded
    with pytest.raises(RenderError, match=r"ran out of its 0.2 s of CPU time"):
        render_value(template, {}, "w")


@pytest.mark.parametrize(
    ("template", "value"),
    [
        ("{{ 'a' * 3 }}", "aaa"),
        ("{{ [1, 2] * 2 }}", [1, 2, 1, 2]),
        ("{{ '%05d' % 3 }}", "00003"),
        ("{{ '{:>5}'.format(1) }}", "    1"),
        ("{{ 2 ** 10 }}", 1024),
        ("{{ 'a-b' | replace('-', '--') }}", "a--b"),
        ("{{ 'x' | center(5) }}", "  x  "),
        ("{% for i in range(3) %}{{ i }}{% endfor %}", "012"),
        ("{{ range(3) | list }}", [0, 1, 2]),
    ],
)
def test_ordinary_uses_of_the_same_operations_are_untouched(template: str, value: object) -> None:
    assert render_value(template, {}, "w") == value


def test_only_templates_that_can_loop_or_call_run_under_the_timer() -> None:
    cheap = ["{{ args.x }}", "{{ event.name == 'step.done' and ctx.n > 2 }}", "{{ x | default(1) | int }}"]
    assert not any(compile_template(t).guarded for t in cheap)
    costly = [NESTED_LOOPS, "{{ x.split(',') }}", "{{ items | map('upper') | list }}", "{{ lipsum() }}"]
    assert all(compile_template(t).guarded for t in costly)


def test_a_number_out_of_range_is_a_template_error_not_an_internal_one() -> None:
    with pytest.raises(RenderError, match="a number out of range"):  # Jinja folds the constant to 'inf'
        render_value("{{ 1e308 + 1e308 }}", {}, "w")


async def test_a_runaway_arc_fails_its_execution_and_the_controller_goes_on(
    runtime: Runtime, short_budget: float
) -> None:
    text = playbook(
        f"""
        - step: start
          tool: {{kind: noop}}
          next:
            arcs:
              - step: end
                when: "{LONG_EXPRESSION}"
        - step: end
          tool: {{kind: noop}}
        """
    )
    r = await run(runtime, text)
    assert r.status == "failed"
    assert "ran out of its 0.2 s of CPU time" in str(r.summary.error), r.summary.error
    ok = await run(runtime, playbook("- step: start\n  tool: {kind: noop, result: 7}\n"))
    assert (ok.status, ok.result) == ("success", 7)


async def test_a_runaway_args_template_fails_its_step_and_the_worker_goes_on(
    runtime: Runtime, short_budget: float
) -> None:
    text = playbook(
        f"""
        - step: start
          tool:
            kind: noop
            args: {{x: "{NESTED_LOOPS}"}}
        """
    )
    r = await run(runtime, text)
    assert r.status == "failed"
    error = r.step_error("start")
    assert error["kind"] == "template_error" and "ran out of its 0.2 s of CPU time" in error["message"]
    ok = await run(runtime, playbook("- step: start\n  tool: {kind: noop, result: 7}\n"))
    assert (ok.status, ok.result) == ("success", 7)
