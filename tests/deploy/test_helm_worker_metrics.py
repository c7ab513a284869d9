"""deploy/helm/noetl-stream: the workers' /metrics (``workerMetrics``). Off by default; on, every worker
process gets ``--metrics`` on a port of its own (a pod of N processes: N ports, as `worker --processes`
assigns them), the pods are annotated for Prometheus and, with ``podMonitor``, a PodMonitor scrapes
every one of those ports."""

from __future__ import annotations

import re
from typing import Any

import helm_python as helm
import pytest
from helm_support import (
    arg,
    chart_fixture,  # noqa: F401 (the `chart` fixture)
    container,
    lint_problems,
    render,
)

from noetl_stream.cli import main as cli_main
from noetl_stream.runtime.supervisor import worker_commands

ON: dict[str, Any] = {
    "workerMetrics": {"enabled": True, "podMonitor": {"enabled": True, "labels": {"release": "prom"}}},
    "pools": [{"name": "default"}, {"name": "cpu", "processes": 3}],
}


def test_off_by_default(chart: helm.Chart) -> None:
    m = render(chart)
    w = m.get("Deployment", "noetl-noetl-stream-worker-default")
    assert arg(container(w), "--metrics") == [] and "ports" not in container(w)
    assert not any(k.startswith("prometheus.io/") for k in w["spec"]["template"]["metadata"]["annotations"])
    assert m.of("PodMonitor") == {}


def test_every_worker_process_serves_metrics_and_prometheus_scrapes_them_all(chart: helm.Chart) -> None:
    m = render(chart, ON)
    ports = {}
    for pool, processes in (("default", 1), ("cpu", 3)):
        w = m.get("Deployment", f"noetl-noetl-stream-worker-{pool}")
        c = container(w)
        assert arg(c, "--metrics") == ["0.0.0.0:9464"]
        assert "--metrics" in {o for p in cli_main.commands["worker"].params for o in p.opts}
        ports[pool] = {p["name"]: p["containerPort"] for p in c["ports"]}
        # the ports the CLI gives the pod's processes (`worker --processes N --metrics HOST:PORT`)
        children = worker_commands(processes, [], metrics=("0.0.0.0", 9464))
        served = [int(argv[argv.index("--metrics") + 1].rsplit(":", 1)[1]) for argv in children]
        assert sorted(ports[pool].values()) == served
        annotations = w["spec"]["template"]["metadata"]["annotations"]
        assert {k: v for k, v in annotations.items() if k.startswith("prometheus.io/")} == {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": "9464",
            "prometheus.io/path": "/metrics",
        }
    assert ports == {
        "default": {"metrics": 9464},
        "cpu": {"metrics": 9464, "metrics-2": 9465, "metrics-3": 9466},
    }

    monitor = m.get("PodMonitor", "noetl-noetl-stream-workers")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    spec = monitor["spec"]
    assert spec["selector"]["matchLabels"]["app.kubernetes.io/component"] == "worker"
    assert [e["port"] for e in spec["podMetricsEndpoints"]] == ["metrics", "metrics-2", "metrics-3"]
    assert all(e["path"] == "/metrics" and e["interval"] == "30s" for e in spec["podMetricsEndpoints"])
    assert lint_problems(ON) == []


def test_annotations_can_be_left_out_and_the_port_chosen(chart: helm.Chart) -> None:
    values = {"workerMetrics": {"enabled": True, "annotations": False, "port": 9100}}
    w = render(chart, values).get("Deployment", "noetl-noetl-stream-worker-default")
    assert arg(container(w), "--metrics") == ["0.0.0.0:9100"]
    assert container(w)["ports"] == [{"name": "metrics", "containerPort": 9100, "protocol": "TCP"}]
    assert not any(k.startswith("prometheus.io/") for k in w["spec"]["template"]["metadata"]["annotations"])


def test_a_pod_monitor_without_metrics_fails_with_a_message(chart: helm.Chart) -> None:
    with pytest.raises(helm.HelmRenderError, match=re.escape("needs workerMetrics.enabled")):
        chart.render({"workerMetrics": {"podMonitor": {"enabled": True}}}, name="noetl", namespace="noetl")
    with pytest.raises(helm.HelmValuesError, match="/workerMetrics/port"):  # the schema: a TCP port
        chart.render({"workerMetrics": {"enabled": True, "port": 0}}, name="noetl", namespace="noetl")
