"""deploy/helm/noetl-stream: read-only REST API tokens (controller.api.readTokensSecret ->
NOETL_API_READ_TOKENS), beside the operator tokens or instead of them."""

from __future__ import annotations

import re
from typing import Any

import helm_python as helm
import pytest
from helm_support import (
    arg,
    chart_fixture,  # noqa: F401 (the `chart` fixture)
    container,
    env,
    lint_problems,
    render,
)

CONTROLLER = "noetl-noetl-stream-controller"
SERVED = {"service": {"enabled": True}}


def controller_env(chart: helm.Chart, values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    c = container(render(chart, values).get("Deployment", CONTROLLER))
    assert arg(c, "--http") == ["0.0.0.0:8080"]
    return env(c)


def test_read_tokens_come_from_their_own_secret_beside_the_operator_tokens(chart: helm.Chart) -> None:
    values = {
        "controller": {
            **SERVED,
            "api": {"tokensSecret": "ops", "readTokensSecret": "readers", "readTokensKey": "viewers"},
        }
    }
    got = controller_env(chart, values)
    assert got["NOETL_API_TOKENS"]["valueFrom"]["secretKeyRef"] == {"name": "ops", "key": "tokens"}
    assert got["NOETL_API_READ_TOKENS"]["valueFrom"]["secretKeyRef"] == {"name": "readers", "key": "viewers"}
    assert lint_problems(values) == []


def test_read_tokens_alone_are_enough_to_serve_the_api(chart: helm.Chart) -> None:
    got = controller_env(chart, {"controller": {**SERVED, "api": {"readTokensSecret": "readers"}}})
    assert "NOETL_API_TOKENS" not in got
    assert got["NOETL_API_READ_TOKENS"]["valueFrom"]["secretKeyRef"] == {"name": "readers", "key": "tokens"}
    from_env = {"controller": SERVED, "extraEnv": [{"name": "NOETL_API_READ_TOKENS", "value": "r"}]}
    assert controller_env(chart, from_env)["NOETL_API_READ_TOKENS"] == {
        "name": "NOETL_API_READ_TOKENS",
        "value": "r",
    }


def test_without_any_token_the_install_is_refused_naming_both_values(chart: helm.Chart) -> None:
    with pytest.raises(helm.HelmRenderError, match=re.escape("or controller.api.readTokensSecret")):
        chart.render({"controller": SERVED}, name="noetl", namespace="noetl")


def test_extra_env_cannot_set_the_read_tokens_the_chart_sets(chart: helm.Chart) -> None:
    values = {
        "controller": {"api": {"readTokensSecret": "readers"}},
        "extraEnv": [{"name": "NOETL_API_READ_TOKENS", "value": "x"}],
    }
    with pytest.raises(helm.HelmRenderError) as info:
        chart.render(values, name="noetl", namespace="noetl")
    assert "extraEnv sets NOETL_API_READ_TOKENS, which the chart sets itself" in str(info.value)
    assert "controller.api.readTokensSecret" in str(info.value)


def test_the_schema_refuses_an_empty_read_tokens_key(chart: helm.Chart) -> None:
    with pytest.raises(helm.HelmValuesError, match="/controller/api/readTokensKey"):
        chart.validate_schema(chart.merge_values({"controller": {"api": {"readTokensKey": ""}}}))
