"""`Settings.from_env`: each limit's variable, its default, an override, and a bad value's error."""

from __future__ import annotations

import pytest

from noetl_stream.errors import ConfigurationError
from noetl_stream.settings import Settings, template_cpu_s_from_env


def test_defaults_when_nothing_is_set() -> None:
    settings = Settings.from_env({})
    assert settings == Settings()
    assert settings.template_cpu_s == 2.0
    assert settings.max_child_depth == 32
    assert settings.controller_id is None


def test_each_variable_overrides_its_default() -> None:
    settings = Settings.from_env(
        {"NOETL_TEMPLATE_CPU_S": "0.5", "NOETL_MAX_CHILD_DEPTH": "3", "NOETL_CONTROLLER_ID": "ctl-a"}
    )
    assert settings == Settings(template_cpu_s=0.5, max_child_depth=3, controller_id="ctl-a")


def test_empty_values_leave_the_defaults() -> None:
    env = {"NOETL_TEMPLATE_CPU_S": "", "NOETL_MAX_CHILD_DEPTH": "", "NOETL_CONTROLLER_ID": ""}
    assert Settings.from_env(env) == Settings()


@pytest.mark.parametrize(
    ("raw", "says"),
    [("deep", "not a whole number"), ("2.5", "not a whole number"), ("-1", "must be 0 or more")],
)
def test_a_bad_child_depth_is_an_error_naming_the_variable(raw: str, says: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        Settings.from_env({"NOETL_MAX_CHILD_DEPTH": raw})
    assert str(caught.value) == f"NOETL_MAX_CHILD_DEPTH={raw!r}: {says}"


@pytest.mark.parametrize("raw", ["slow", "0", "-3"])
def test_a_template_budget_that_is_no_number_above_0_leaves_the_default(raw: str) -> None:
    assert template_cpu_s_from_env({"NOETL_TEMPLATE_CPU_S": raw}) == 2.0
    assert Settings.from_env({"NOETL_TEMPLATE_CPU_S": raw}).template_cpu_s == 2.0
