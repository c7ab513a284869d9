"""deploy/helm/noetl-stream: the workloads an operator relies on, and where they run.

One Deployment (and autoscaler) per pool naming its consumer, several controllers sharing the partitions
the provisioning Job creates, the prune CronJob, the optional REST Service/Ingress/ServiceMonitor,
graceful termination, and the placement (per-pool overrides, topology spread, the Jobs' scheduling).
"""

from __future__ import annotations

import re

import helm_python as helm
import pytest
from helm_support import (
    arg,
    chart_fixture,  # noqa: F401 (the `chart` fixture)
    container,
    env,
    load_values,
    pod_specs,
    render,
)

from noetl_stream.cli import main as cli_main

# --- default values -------------------------------------------------------------------------------------


def test_default_install(chart: helm.Chart) -> None:
    m = render(chart)
    assert sorted(m.of("Deployment")) == [
        "noetl-noetl-stream-controller",
        "noetl-noetl-stream-worker-default",
    ]
    assert not m.of("ScaledObject") and not m.of("HorizontalPodAutoscaler")
    assert not m.of("Service") and not m.of("Ingress") and not m.of("ServiceMonitor")  # REST API: later
    assert m.get("Deployment", "noetl-noetl-stream-worker-default")["spec"]["replicas"] == 2

    controller = m.get("Deployment", "noetl-noetl-stream-controller")
    assert controller["spec"]["replicas"] == 1
    # Leases make an overlap safe: the new controller joins before the old one hands its partitions over.
    assert controller["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    c = container(controller)
    assert c["args"][0] == "controller" and arg(c, "--pool") == ["default"] and arg(c, "--grace") == ["30"]
    assert "--http" not in c["args"] and "ports" not in c
    assert controller["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 30 + 15
    assert env(c)["NOETL_CONTROLLER_ID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert m.get("ConfigMap", "noetl-noetl-stream")["data"]["NOETL_PARTITIONS"] == "8"
    # One controller: a disruption budget over it would protect nothing.
    assert "noetl-noetl-stream-controller" not in m.of("PodDisruptionBudget")

    job = m.get("Job", "noetl-noetl-stream-provision")
    annotations = job["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "pre-install,pre-upgrade,pre-rollback"
    assert "hook-succeeded" in annotations["helm.sh/hook-delete-policy"]
    jc = job["spec"]["template"]["spec"]["containers"][0]
    assert jc["args"] == ["provision", "--pool", "default", "--partitions", "8", "--lease-ttl", "10"]
    assert env(jc)["NOETL_NATS_USER"]["value"] == "admin"
    assert env(jc)["NOETL_NATS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "noetl-nats-users",
        "key": "admin",
    }

    # prune: a daily CronJob as the controller user (no admin password outside the hook).
    cron = m.get("CronJob", "noetl-noetl-stream-prune")["spec"]
    assert cron["schedule"] == "23 3 * * *" and cron["concurrencyPolicy"] == "Forbid"
    pod = cron["jobTemplate"]["spec"]["template"]["spec"]
    pc = pod["containers"][0]
    assert pc["args"] == ["prune", "--older-than", "3600"]
    assert env(pc)["NOETL_NATS_USER"]["value"] == "controller"
    assert env(pc)["NOETL_NATS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "noetl-nats-users",
        "key": "controller",
    }
    assert pc["envFrom"] == [{"configMapRef": {"name": "noetl-noetl-stream"}}]
    assert pc["securityContext"]["readOnlyRootFilesystem"] is True
    assert {"name": "tmp", "mountPath": "/tmp"} in pc["volumeMounts"]
    assert pod["restartPolicy"] == "Never" and pod["automountServiceAccountToken"] is False
    assert not render(chart, {"prune": {"enabled": False}}).of("CronJob")


# --- several controllers ---------------------------------------------------------------------------------


def test_several_controllers_share_the_partitions_the_job_provisions(chart: helm.Chart) -> None:
    m = render(chart, load_values("controllers-values.yaml"))
    controller = m.get("Deployment", "noetl-noetl-stream-controller")
    assert controller["spec"]["replicas"] == 3
    assert controller["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    pod = controller["spec"]["template"]["spec"]
    assert pod["topologySpreadConstraints"][0]["topologyKey"] == "kubernetes.io/hostname"
    c = container(controller)
    # Each pod's id in the leases is its own name (unique, and kept across a container restart).
    assert env(c)["NOETL_CONTROLLER_ID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert "NOETL_CONTROLLER_ID" not in env(
        container(m.get("Deployment", "noetl-noetl-stream-worker-default"))
    )

    # The Job creates the events stream with 12 partitions, a consumer each, and the leases bucket's TTL.
    job = container(m.get("Job", "noetl-noetl-stream-provision"))
    assert arg(job, "--partitions") == ["12"] and arg(job, "--lease-ttl") == ["15"]
    settings = m.get("ConfigMap", "noetl-noetl-stream")["data"]
    assert (settings["NOETL_PARTITIONS"], settings["NOETL_LEASE_TTL_S"]) == ("12", "15")
    assert {k: v["value"] for k, v in env(job).items() if k in settings} == settings

    # A node drain takes at most one controller down at a time; the others take its partitions over.
    pdb = m.get("PodDisruptionBudget", "noetl-noetl-stream-controller")["spec"]
    assert pdb["maxUnavailable"] == 1
    assert pdb["selector"]["matchLabels"] == controller["spec"]["selector"]["matchLabels"]
    assert "replicas: 3, sharing 12 partitions" in m.notes and "nats kv ls noetl_leases" in m.notes


def test_the_chart_passes_only_options_the_cli_has(chart: helm.Chart) -> None:
    """A flag or variable the CLI does not know would fail the Job or be silently ignored."""
    m = render(chart, load_values("controllers-values.yaml"))
    options = {
        name: {opt for p in command.params for opt in p.opts} for name, command in cli_main.commands.items()
    }
    job = container(m.get("Job", "noetl-noetl-stream-provision"))
    assert {a for a in job["args"][1:] if a.startswith("--")} <= options["provision"]
    c = container(m.get("Deployment", "noetl-noetl-stream-controller"))
    assert {a for a in c["args"][1:] if a.startswith("--")} <= options["controller"]
    w = container(m.get("Deployment", "noetl-noetl-stream-worker-default"))
    assert {a for a in w["args"][1:] if a.startswith("--")} <= options["worker"]
    cron = m.get("CronJob", "noetl-noetl-stream-prune")["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    prune = cron["containers"][0]
    assert prune["args"][0] == "prune"
    assert {a for a in prune["args"][1:] if a.startswith("--")} <= options["prune"]
    controller_id = next(p for p in cli_main.commands["controller"].params if "--controller-id" in p.opts)
    assert controller_id.envvar in env(c)


# --- several pools, KEDA ---------------------------------------------------------------------------------


def test_every_pool_gets_a_deployment_and_a_scaled_object_naming_its_consumer(chart: helm.Chart) -> None:
    m = render(chart, load_values("keda-values.yaml"))
    pools = ["default", "gpu", "io"]
    workers = {n: d for n, d in m.of("Deployment").items() if "-worker-" in n}
    assert sorted(workers) == [f"noetl-noetl-stream-worker-{p}" for p in pools]
    scaled = m.of("ScaledObject")
    assert sorted(scaled) == sorted(workers)
    for pool in pools:
        name = f"noetl-noetl-stream-worker-{pool}"
        deployment = workers[name]
        assert "replicas" not in deployment["spec"], "KEDA owns the replica count"
        c = container(deployment)
        assert c["args"][:3] == ["worker", "--pool", pool]
        so = scaled[name]["spec"]
        assert so["scaleTargetRef"] == {"name": name}
        (trigger,) = so["triggers"]
        assert trigger["type"] == "nats-jetstream"
        assert trigger["metadata"]["stream"] == "NOETL_COMMANDS"
        assert trigger["metadata"]["consumer"] == f"pool-{pool}"
        assert trigger["metadata"]["account"] == "NOETL"
        assert (
            trigger["metadata"]["natsServerMonitoringEndpoint"] == "nats-headless.nats.svc.cluster.local:8222"
        )
        assert all(isinstance(v, str) for v in trigger["metadata"].values())  # KEDA metadata is strings
        assert m.get("PodDisruptionBudget", name)["spec"]["selector"]["matchLabels"]["noetl.io/pool"] == pool
    gpu = workers["noetl-noetl-stream-worker-gpu"]
    gc = container(gpu)
    assert arg(gc, "--concurrency") == ["2"] and arg(gc, "--grace") == ["600"]
    assert gpu["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 600 + 15
    assert gpu["spec"]["template"]["spec"]["nodeSelector"] == {"accelerator": "nvidia"}
    assert gpu["spec"]["template"]["spec"]["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert gc["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert scaled["noetl-noetl-stream-worker-gpu"]["spec"]["minReplicaCount"] == 0
    assert scaled["noetl-noetl-stream-worker-gpu"]["spec"]["triggers"][0]["metadata"]["lagThreshold"] == "2"
    assert arg(container(workers["noetl-noetl-stream-worker-io"]), "--concurrency") == ["128"]
    # --task-events: the default (all) unless the pool says otherwise.
    assert arg(gc, "--task-events") == ["all"]
    assert arg(container(workers["noetl-noetl-stream-worker-io"]), "--task-events") == ["informative"]
    # The controller knows every pool (the first is the default), the Job provisions every consumer.
    assert arg(container(m.get("Deployment", "noetl-noetl-stream-controller")), "--pool") == pools
    job = m.get("Job", "noetl-noetl-stream-provision")["spec"]["template"]["spec"]["containers"][0]
    assert arg(job, "--pool") == pools


# --- HPA, inline credentials, REST service ------------------------------------------------------------


def test_hpa_alternative_inline_secrets_and_optional_service(chart: helm.Chart) -> None:
    m = render(chart, load_values("hpa-values.yaml"))
    assert not m.of("ScaledObject")
    (hpa,) = m.of("HorizontalPodAutoscaler").values()  # pool batch turned it off
    assert hpa["spec"]["scaleTargetRef"]["name"] == "noetl-noetl-stream-worker-default"
    assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"
    assert "replicas" not in m.get("Deployment", "noetl-noetl-stream-worker-default")["spec"]
    assert m.get("Deployment", "noetl-noetl-stream-worker-batch")["spec"]["replicas"] == 1

    secret = m.get("Secret", "noetl-noetl-stream-nats")
    assert set(secret["stringData"]) == {"controller", "worker"}  # no admin password for the runtime
    hook_secret = m.get("Secret", "noetl-noetl-stream-provision")
    assert set(hook_secret["stringData"]) == {"admin"}
    assert "hook-succeeded" in hook_secret["metadata"]["annotations"]["helm.sh/hook-delete-policy"]
    assert int(hook_secret["metadata"]["annotations"]["helm.sh/hook-weight"]) < 0  # before the Job
    c = container(m.get("Deployment", "noetl-noetl-stream-controller"))
    assert env(c)["NOETL_NATS_URL"]["value"].startswith("tls://$(NOETL_NATS_USER):")
    # The CA is the NATS connection's only: SSL_CERT_FILE would make it the only CA of every TLS connection.
    assert env(c)["NOETL_NATS_CA"]["value"] == "/etc/noetl/nats-ca/ca.crt"
    assert "SSL_CERT_FILE" not in env(c)
    assert c["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    assert arg(c, "--http") == ["0.0.0.0:8080"]  # the REST API listens where the Service points
    assert env(c)["NOETL_API_TOKENS"]["valueFrom"]["secretKeyRef"] == {
        "name": "noetl-api-tokens",
        "key": "tokens",
    }
    service = m.get("Service", "noetl-noetl-stream-controller")
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    rule = m.get("Ingress", "noetl-noetl-stream")["spec"]["rules"][0]
    assert rule["http"]["paths"][0]["backend"]["service"]["name"] == "noetl-noetl-stream-controller"
    assert m.get("ServiceMonitor", "noetl-noetl-stream")["spec"]["endpoints"][0]["port"] == "http"


# --- overrides, API auth, scheduling --------------------------------------------------------------------


def test_a_pool_replaces_resources_and_placement_instead_of_merging_them(chart: helm.Chart) -> None:
    values = {
        "workerDefaults": {
            "nodeSelector": {"pool": "workers"},
            "tolerations": [{"key": "dedicated", "operator": "Exists"}],
            "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
        },
        "pools": [
            {"name": "default"},
            {
                "name": "big",
                # Merged with the defaults' 1Gi limit, this request would make an invalid pod.
                "resources": {"requests": {"cpu": "2", "memory": "8Gi"}},
                "nodeSelector": {"node.kubernetes.io/instance-type": "r6i.2xlarge"},
                "affinity": {},
                "pdb": {"maxUnavailable": 2},
                "autoscaling": {"keda": {"enabled": True}},
            },
        ],
    }
    m = render(chart, values)
    big = m.get("Deployment", "noetl-noetl-stream-worker-big")
    pod = big["spec"]["template"]["spec"]
    assert container(big)["resources"] == {"requests": {"cpu": "2", "memory": "8Gi"}}
    assert pod["nodeSelector"] == {"node.kubernetes.io/instance-type": "r6i.2xlarge"}
    assert "affinity" not in pod
    assert pod["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]  # not overridden: inherited
    default = m.get("Deployment", "noetl-noetl-stream-worker-default")["spec"]["template"]["spec"]
    assert default["nodeSelector"] == {"pool": "workers"}
    assert container(m.get("Deployment", "noetl-noetl-stream-worker-default"))["resources"]["limits"] == {
        "memory": "1Gi"
    }
    # pdb and autoscaling still merge key by key.
    assert m.get("PodDisruptionBudget", "noetl-noetl-stream-worker-big")["spec"]["maxUnavailable"] == 2
    so = m.get("ScaledObject", "noetl-noetl-stream-worker-big")["spec"]
    assert (so["minReplicaCount"], so["maxReplicaCount"]) == (1, 10)


def test_the_service_monitor_sends_a_bearer_token(chart: helm.Chart) -> None:
    """/metrics answers 401 without a token: Prometheus must send one."""
    m = render(chart, load_values("hpa-values.yaml"))
    (endpoint,) = m.get("ServiceMonitor", "noetl-noetl-stream")["spec"]["endpoints"]
    assert endpoint["authorization"] == {
        "type": "Bearer",
        "credentials": {"name": "noetl-api-tokens", "key": "tokens"},
    }
    own = load_values("hpa-values.yaml")
    own["controller"]["serviceMonitor"] |= {"tokenSecret": "prometheus-token", "tokenKey": "token"}
    (endpoint,) = render(chart, own).get("ServiceMonitor", "noetl-noetl-stream")["spec"]["endpoints"]
    assert endpoint["authorization"]["credentials"] == {"name": "prometheus-token", "key": "token"}
    no_token = {
        "controller": {"service": {"enabled": True}, "serviceMonitor": {"enabled": True}},
        "extraEnv": [{"name": "NOETL_API_TOKENS", "value": "x"}],
    }
    with pytest.raises(helm.HelmRenderError, match=re.escape("/metrics requires a bearer token")):
        chart.render(no_token, name="noetl", namespace="noetl")


def test_controllers_are_spread_over_nodes_counting_only_this_release(chart: helm.Chart) -> None:
    m = render(chart, {"controller": {"replicas": 2}})
    controller = m.get("Deployment", "noetl-noetl-stream-controller")
    (spread,) = controller["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert spread["whenUnsatisfiable"] == "ScheduleAnyway"  # one node must still be able to run them all
    assert spread["labelSelector"]["matchLabels"] == controller["spec"]["selector"]["matchLabels"]
    assert spread["labelSelector"]["matchLabels"]["app.kubernetes.io/instance"] == "noetl"
    # A pool's constraint gets its own pods' labels; a hand-written selector is kept.
    mine = {"matchLabels": {"team": "a"}}
    pools = {
        "pools": [
            {
                "name": "etl",
                "topologySpreadConstraints": [
                    {
                        "maxSkew": 1,
                        "topologyKey": "topology.kubernetes.io/zone",
                        "whenUnsatisfiable": "DoNotSchedule",
                    },
                    {
                        "maxSkew": 1,
                        "topologyKey": "kubernetes.io/hostname",
                        "whenUnsatisfiable": "ScheduleAnyway",
                        "labelSelector": mine,
                    },
                ],
            }
        ]
    }
    worker = render(chart, pools).get("Deployment", "noetl-noetl-stream-worker-etl")
    zone, host = worker["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert zone["labelSelector"]["matchLabels"] == worker["spec"]["selector"]["matchLabels"]
    assert zone["labelSelector"]["matchLabels"]["noetl.io/pool"] == "etl"
    assert host["labelSelector"] == mine


def test_jobs_run_on_the_controllers_nodes_with_the_pull_secrets(chart: helm.Chart) -> None:
    """On a cluster whose nodes are all tainted or labelled for noetl, the provisioning hook (which every
    install and upgrade waits for) and the prune CronJob must be schedulable too."""
    node_affinity = {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}
            ]
        }
    }
    toleration = {"key": "dedicated", "operator": "Equal", "value": "noetl", "effect": "NoSchedule"}
    anti = {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {
                "topologyKey": "kubernetes.io/hostname",
                "labelSelector": {"matchLabels": {"app.kubernetes.io/component": "controller"}},
            }
        ]
    }
    values = {
        "imagePullSecrets": [{"name": "regcred"}],
        "nats": {"auth": {"existingSecret": "my-nats"}},
        "controller": {
            "replicas": 2,
            "nodeSelector": {"pool": "system"},
            "tolerations": [toleration],
            "affinity": {"nodeAffinity": node_affinity, "podAntiAffinity": anti},
        },
        "pools": [{"name": "default", "replicas": 3}, {"name": "etl", "replicas": 1}],
    }
    m = render(chart, values)
    for kind in ("Job", "CronJob"):
        ((where, pod),) = [(k, p) for k, p in pod_specs(m).items() if k.startswith(kind + "/")]
        assert pod["nodeSelector"] == {"pool": "system"}, where
        assert pod["tolerations"] == [toleration], where
        assert pod["affinity"] == {"nodeAffinity": node_affinity}, where  # not the controllers' anti-affinity
    for where, pod in pod_specs(m).items():
        assert pod["imagePullSecrets"] == [{"name": "regcred"}], where
        for e in pod["containers"][0]["env"]:
            if e["name"] == "NOETL_NATS_PASSWORD":
                assert e["valueFrom"]["secretKeyRef"]["name"] == "my-nats", where
    assert not m.of("Secret")  # credentials only from the existing Secret
    defaults = pod_specs(render(chart))
    assert not {"nodeSelector", "tolerations", "affinity"} & set(defaults["Job/noetl-noetl-stream-provision"])
