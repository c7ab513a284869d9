"""deploy/helm/noetl-stream: the values it accepts and the ones it refuses, with a message.

Helm's lint is clean in strict mode for the CI values files; the values schema and the templates refuse
what would make a broken install (bad names, contradicting options, too many controllers, missing token
secrets, colliding or over-long names); every value is documented in the deploy guide.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import helm_python as helm
import pytest
from helm_support import (
    CHART,
    arg,
    chart_fixture,  # noqa: F401 (the `chart` fixture)
    container,
    lint_problems,
    load_values,
    render,
)
from ruamel.yaml import YAML

# --- lint ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values_file", [None, "keda-values.yaml", "hpa-values.yaml", "controllers-values.yaml"]
)
def test_lint_is_clean_in_strict_mode(values_file: str | None) -> None:
    assert lint_problems(load_values(values_file) if values_file else None) == []


@pytest.mark.parametrize(
    ("bad", "where"),
    [
        ({"pools": [{"name": "GPU_pool"}]}, "/pools/0/name"),
        ({"pools": []}, "/pools"),
        ({"controller": {"replicas": -1}}, "/controller/replicas"),
        ({"jetstream": {"partitions": 0}}, "/jetstream/partitions"),
        ({"jetstream": {"partitions": 1025}}, "/jetstream/partitions"),
        ({"jetstream": {"leaseTtlSeconds": 0.5}}, "/jetstream/leaseTtlSeconds"),
        ({"workerDefaults": {"concurrency": 0}}, "/workerDefaults/concurrency"),
        ({"workerDefaults": {"taskEvents": "none"}}, "/workerDefaults/taskEvents"),
        ({"prune": {"olderThanSeconds": -1}}, "/prune/olderThanSeconds"),
        ({"jetstream": {"commandMaxDeliver": 0}}, "/jetstream/commandMaxDeliver"),
        ({"nats": {"url": "nats://user:secret@nats:4222"}}, "/nats/url"),
        ({"prefix": "Noetl"}, "/prefix"),
        ({"workers": {"replicas": 3}}, "additional properties 'workers'"),
    ],
)
def test_bad_values_fail_schema_validation(chart: helm.Chart, bad: dict[str, Any], where: str) -> None:
    with pytest.raises(helm.HelmValuesError, match=where):
        chart.validate_schema(chart.merge_values(bad))
    assert lint_problems(bad), "lint accepted values the schema rejects"


def test_contradicting_values_fail_with_a_message(chart: helm.Chart) -> None:
    both = {
        "pools": [{"name": "default", "autoscaling": {"keda": {"enabled": True}, "hpa": {"enabled": True}}}]
    }
    with pytest.raises(
        helm.HelmRenderError, match=re.escape("enable autoscaling.keda or autoscaling.hpa, not both")
    ):
        chart.render(both, name="noetl", namespace="noetl")
    no_password = {"nats": {"auth": {"existingSecret": ""}}}
    with pytest.raises(helm.HelmRenderError, match=re.escape("nats.auth.controller.password is required")):
        chart.render(no_password, name="noetl", namespace="noetl")
    twice = {"pools": [{"name": "a"}, {"name": "a"}]}
    with pytest.raises(helm.HelmRenderError, match='"a" is listed twice'):
        chart.render(twice, name="noetl", namespace="noetl")


def test_more_controllers_than_partitions_fail_with_a_message(chart: helm.Chart) -> None:
    too_many = {"controller": {"replicas": 3}, "jetstream": {"partitions": 2}}
    with pytest.raises(
        helm.HelmRenderError,
        match=re.escape("controller.replicas (3) is more than jetstream.partitions (2)"),
    ):
        chart.render(too_many, name="noetl", namespace="noetl")
    with pytest.raises(helm.HelmRenderError, match=re.escape("jetstream.partitions (8)")):  # the default
        chart.render({"controller": {"replicas": 9}}, name="noetl", namespace="noetl")
    # As many controllers as partitions is fine: one partition each.
    m = render(chart, {"controller": {"replicas": 4}, "jetstream": {"partitions": 4}})
    assert m.get("Deployment", "noetl-noetl-stream-controller")["spec"]["replicas"] == 4


def test_a_release_name_with_a_dot_fails_with_a_message(chart: helm.Chart) -> None:
    """Pod names are controller ids, and a controller id is one NATS subject token."""
    with pytest.raises(helm.HelmRenderError, match=re.escape("has a '.': controllers use their pod name")):
        chart.render({"fullnameOverride": "noetl.prod"}, name="noetl", namespace="noetl")


# --- refused at install ---------------------------------------------------------------------------------


def test_the_rest_api_needs_its_token_secret(chart: helm.Chart) -> None:
    """`controller --http` exits at start without a bearer token: refuse the install instead."""
    with pytest.raises(helm.HelmRenderError, match=re.escape("needs controller.api.tokensSecret")):
        chart.render({"controller": {"service": {"enabled": True}}}, name="noetl", namespace="noetl")
    from_env = {
        "controller": {"service": {"enabled": True}},
        "extraEnv": [{"name": "NOETL_API_TOKENS", "valueFrom": {"secretKeyRef": {"name": "t", "key": "t"}}}],
    }
    assert arg(
        container(render(chart, from_env).get("Deployment", "noetl-noetl-stream-controller")), "--http"
    )


@pytest.mark.parametrize("schedule", ["@daily", "@hourly", "*/30 * * * *", "0 0 1 1 *"])
def test_prune_schedule_accepts_cron_macros_and_five_fields(chart: helm.Chart, schedule: str) -> None:
    values = {"prune": {"schedule": schedule}}
    chart.validate_schema(chart.merge_values(values))
    assert render(chart, values).get("CronJob", "noetl-noetl-stream-prune")["spec"]["schedule"] == schedule


@pytest.mark.parametrize("schedule", ["daily", "23 3 * *", "@every-day"])
def test_prune_schedule_rejects_what_is_not_a_cron_schedule(chart: helm.Chart, schedule: str) -> None:
    with pytest.raises(helm.HelmValuesError, match="/prune/schedule"):
        chart.validate_schema(chart.merge_values({"prune": {"schedule": schedule}}))


def test_pools_whose_deployment_names_collide_after_truncation_fail_with_a_message(chart: helm.Chart) -> None:
    """Names are cut at 63 characters: two long pool names could otherwise render one Deployment twice."""
    values = {
        "fullnameOverride": "production-workflows-noetl-stream",
        "pools": [{"name": "nightly-batch-exports-eu-a"}, {"name": "nightly-batch-exports-eu-b"}],
    }
    with pytest.raises(helm.HelmRenderError, match=re.escape("both get the Deployment name")):
        chart.render(values, name="noetl", namespace="noetl")
    values["fullnameOverride"] = "noetl"
    assert len(render(chart, values).of("Deployment")) == 3


def test_every_value_is_documented_in_the_deploy_guide() -> None:
    """docs/deploy.md's table names every key of values.yaml (as `key` or `.key`)."""
    values: dict[str, Any] = YAML(typ="safe").load((CHART / "values.yaml").read_text())
    table = (CHART.parents[2] / "docs" / "deploy.md").read_text().split("## 7. Values", 1)[1]
    opaque = {"resources", "podSecurityContext", "securityContext", "startup", "readiness", "liveness"}

    def keys(d: dict[str, Any], path: str = "") -> Iterator[str]:
        for k, v in d.items():
            if isinstance(v, dict) and v and k not in opaque and not path.endswith("hosts"):
                yield from keys(v, f"{path}{k}.")
            else:
                yield f"{path}{k}"

    missing = [
        key
        for key in keys(values)
        if not re.search(r"[`.…{,]" + re.escape(key.rsplit(".", 1)[-1]) + r"[`,/ }\[]", table)
        and not re.search(r"`" + re.escape(key.rsplit(".", 1)[0]) + r"\.\*`", table)
    ]
    assert missing == [], missing


def test_names_of_a_long_release_stay_within_kubernetes_limits(chart: helm.Chart) -> None:
    """A full name of 63 characters (the most Helm's names allow): every object's name stays within 63
    (a Service's limit), the prune CronJob's within 52 (its Jobs add 11), and the Ingress still points at
    the controller's Service."""
    values = {
        "fullnameOverride": "x" * 63,
        "controller": {
            "replicas": 2,
            "service": {"enabled": True},
            "api": {"tokensSecret": "api-tokens"},
            "ingress": {"enabled": True},
        },
    }
    manifests = render(chart, values)
    for obj in manifests.objects:
        name = obj["metadata"]["name"]
        assert len(name) <= (52 if obj["kind"] == "CronJob" else 63), (obj["kind"], name)
    (service,) = manifests.of("Service")
    (ingress,) = manifests.of("Ingress").values()
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]["name"]
    assert backend == service and service.endswith("-controller")
    assert any(name.endswith("-controller") for name in manifests.of("Deployment"))
    assert f"deployment/{service}" in manifests.notes
