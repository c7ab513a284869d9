"""Shared by the Helm chart tests: deploy/helm/noetl-stream rendered by Helm's own Go SDK
(helm-python-sdk), offline, and every rendered manifest validated against the Kubernetes OpenAPI schemas
(kubernetes-validate, strict: no unknown fields).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
from ruamel.yaml import YAML

CHART = Path(__file__).resolve().parents[1] / "deploy" / "helm" / "noetl-stream"
KUBE_VERSION = "1.30"
CRDS = {"ScaledObject", "ServiceMonitor", "PodMonitor"}  # not in the Kubernetes schemas


def load_values(name: str) -> dict[str, Any]:
    values: dict[str, Any] = YAML(typ="safe").load((CHART / "ci" / name).read_text())
    return values


@pytest.fixture(scope="module", name="chart")
def chart_fixture() -> Iterator[helm.Chart]:
    """The chart, loaded once per test module: import `chart_fixture` to use `chart`."""
    with helm.Chart.load(CHART) as loaded:
        yield loaded


class Manifests:
    def __init__(self, rendered: dict[str, str]) -> None:
        self.notes = next((text for path, text in rendered.items() if path.endswith("NOTES.txt")), "")
        self.objects: list[dict[str, Any]] = []
        for path, text in sorted(rendered.items()):
            if path.endswith(".yaml"):
                self.objects += [doc for doc in YAML(typ="safe").load_all(text) if doc]

    def of(self, kind: str) -> dict[str, dict[str, Any]]:
        return {o["metadata"]["name"]: o for o in self.objects if o["kind"] == kind}

    def get(self, kind: str, name: str) -> dict[str, Any]:
        found = self.of(kind)
        assert name in found, f"no {kind} {name}; have {sorted(found)}"
        return found[name]


def render(chart: helm.Chart, values: dict[str, Any] | None = None) -> Manifests:
    manifests = Manifests(chart.render(values, name="noetl", namespace="noetl"))
    for obj in manifests.objects:
        if obj["kind"] not in CRDS:
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
    return manifests


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (only,) = deployment["spec"]["template"]["spec"]["containers"]
    return only


def env(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in c.get("env", [])}


def arg(c: dict[str, Any], flag: str) -> list[str]:
    args = c["args"]
    return [args[i + 1] for i, a in enumerate(args) if a == flag]


def lint_problems(values: dict[str, Any] | None) -> list[str]:
    report = helm.lint(CHART, values, strict=True, namespace="noetl", kube_version="v1.30.0")
    return report["errors"] + [m["error"] for m in report["messages"] if m["severity"] >= 2]


def pod_specs(m: Manifests) -> dict[str, dict[str, Any]]:
    """Every pod template: Deployments, the provisioning Job and the prune CronJob."""
    pods = {f"Deployment/{n}": d["spec"]["template"]["spec"] for n, d in m.of("Deployment").items()}
    pods |= {f"Job/{n}": j["spec"]["template"]["spec"] for n, j in m.of("Job").items()}
    pods |= {
        f"CronJob/{n}": c["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        for n, c in m.of("CronJob").items()
    }
    return pods
