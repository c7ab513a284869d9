"""deploy/helm/noetl-stream: linted and rendered by Helm's own Go SDK (helm-python-sdk), offline.

Rendered manifests are validated against the Kubernetes OpenAPI schemas (kubernetes-validate, strict:
no unknown fields) and checked for what an operator relies on: one Deployment (and autoscaler) per
pool naming its consumer, several controllers sharing the partitions, the NATS/keychain wiring,
probes, the security context, graceful termination.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
from ruamel.yaml import YAML

from noetl_stream.cli import TOPOLOGY_ENV
from noetl_stream.cli import main as cli_main

CHART = Path(__file__).resolve().parents[1] / "deploy" / "helm" / "noetl-stream"
KUBE_VERSION = "1.30"
CRDS = {"ScaledObject", "ServiceMonitor"}  # not in the Kubernetes schemas


def load_values(name: str) -> dict[str, Any]:
    values: dict[str, Any] = YAML(typ="safe").load((CHART / "ci" / name).read_text())
    return values


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
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


# --- default values ------------------------------------------------------------------------------------


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


def test_every_component_gets_the_same_nats_and_jetstream_settings(chart: helm.Chart) -> None:
    m = render(chart, {"prefix": "acme", "jetstream": {"replicas": 1, "commandAckWaitSeconds": 2.5}})
    settings = m.get("ConfigMap", "noetl-noetl-stream")["data"]
    assert settings == {
        "NOETL_PREFIX": "acme",
        "NOETL_REPLICAS": "1",
        "NOETL_STORAGE": "file",
        "NOETL_EVENTS_MAX_AGE_S": "2592000",
        "NOETL_COMMAND_ACK_WAIT_S": "2.5",
        "NOETL_COMMAND_MAX_DELIVER": "5",
        "NOETL_PARTITIONS": "8",
        "NOETL_LEASE_TTL_S": "10",
    }
    assert set(settings) - {"NOETL_PREFIX"} <= set(TOPOLOGY_ENV)  # every one is read by the CLI
    job = container(m.get("Job", "noetl-noetl-stream-provision"))
    assert {k: v["value"] for k, v in env(job).items() if k in settings} == settings  # provisions the same
    for name, role in (
        ("noetl-noetl-stream-controller", "controller"),
        ("noetl-noetl-stream-worker-default", "worker"),
    ):
        c = container(m.get("Deployment", name))
        assert c["envFrom"] == [{"configMapRef": {"name": "noetl-noetl-stream"}}]
        e = env(c)
        assert e["NOETL_NATS_USER"]["value"] == role
        assert e["NOETL_NATS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
            "name": "noetl-nats-users",
            "key": role,
        }
        # The kubelet expands $(VAR) from the variables defined before it.
        names = list(e)
        assert names.index("NOETL_NATS_URL") > names.index("NOETL_NATS_PASSWORD")
        assert e["NOETL_NATS_URL"]["value"] == (
            "nats://$(NOETL_NATS_USER):$(NOETL_NATS_PASSWORD)@nats.nats.svc.cluster.local:4222"
        )


def test_probes_security_context_and_writable_tmp(chart: helm.Chart) -> None:
    m = render(chart)
    for deployment in m.of("Deployment").values():
        pod = deployment["spec"]["template"]["spec"]
        c = container(deployment)
        for probe in ("startupProbe", "readinessProbe"):
            assert c[probe]["exec"]["command"] == ["noetl-probe"], probe  # connected to NATS
        # Alive unless NATS is reachable and the process has no connection (not during an outage).
        assert c["livenessProbe"]["exec"]["command"] == ["noetl-probe", "--liveness"]
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]
        assert pod["automountServiceAccountToken"] is False
    job = m.get("Job", "noetl-noetl-stream-provision")["spec"]["template"]["spec"]
    assert job["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True


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


def test_workers_read_the_keychain_key_from_the_secret(chart: helm.Chart) -> None:
    m = render(chart, load_values("keda-values.yaml"))
    worker = m.get("Deployment", "noetl-noetl-stream-worker-default")
    c = container(worker)
    path = env(c)["NOETL_KEYCHAIN_KEY_FILE"]["value"]
    mount = next(v for v in c["volumeMounts"] if path.startswith(v["mountPath"] + "/"))
    assert mount["readOnly"] is True
    volume = next(v for v in worker["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"])
    assert volume["secret"]["secretName"] == "noetl-keychain"
    assert volume["secret"]["items"] == [{"key": "fernet", "path": path.rsplit("/", 1)[1]}]
    assert "NOETL_KEYCHAIN_KEY" not in env(c)  # the key itself is never in the pod spec
    # The controller does not decrypt credentials.
    assert "NOETL_KEYCHAIN_KEY_FILE" not in env(
        container(m.get("Deployment", "noetl-noetl-stream-controller"))
    )


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


# --- audit fixes: pod environment, overrides, API auth, scheduling -----------------------------------------


def pod_specs(m: Manifests) -> dict[str, dict[str, Any]]:
    """Every pod template: Deployments, the provisioning Job and the prune CronJob."""
    pods = {f"Deployment/{n}": d["spec"]["template"]["spec"] for n, d in m.of("Deployment").items()}
    pods |= {f"Job/{n}": j["spec"]["template"]["spec"] for n, j in m.of("Job").items()}
    pods |= {
        f"CronJob/{n}": c["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        for n, c in m.of("CronJob").items()
    }
    return pods


def test_every_container_works_in_the_writable_tmp(chart: helm.Chart) -> None:
    """The root filesystem is read-only and the image's WORKDIR is on it: DuckDB spills a query larger
    than its memory limit to ./.tmp (its default temp_directory), which failed there."""
    pods = pod_specs(render(chart))
    assert {k.split("/")[0] for k in pods} == {"Deployment", "Job", "CronJob"}
    for where, pod in pods.items():
        (c,) = pod["containers"]
        assert c["workingDir"] == "/tmp", where
        mount = next(v for v in c["volumeMounts"] if v["mountPath"] == c["workingDir"])
        volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
        assert "emptyDir" in volume and not mount.get("readOnly"), where


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


@pytest.mark.parametrize("schedule", ["@daily", "@hourly", "*/30 * * * *", "0 0 1 1 *"])
def test_prune_schedule_accepts_cron_macros_and_five_fields(chart: helm.Chart, schedule: str) -> None:
    values = {"prune": {"schedule": schedule}}
    chart.validate_schema(chart.merge_values(values))
    assert render(chart, values).get("CronJob", "noetl-noetl-stream-prune")["spec"]["schedule"] == schedule


@pytest.mark.parametrize("schedule", ["daily", "23 3 * *", "@every-day"])
def test_prune_schedule_rejects_what_is_not_a_cron_schedule(chart: helm.Chart, schedule: str) -> None:
    with pytest.raises(helm.HelmValuesError, match="/prune/schedule"):
        chart.validate_schema(chart.merge_values({"prune": {"schedule": schedule}}))


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


def test_pod_labels_annotations_and_extra_env_reach_every_pod(chart: helm.Chart) -> None:
    """deploy.md: added to every pod / container, the provisioning Job and the prune CronJob included."""
    values = {
        "podLabels": {"team": "data"},
        "podAnnotations": {"example.com/owner": "data"},
        "extraEnv": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}],
        "pools": [{"name": "default"}, {"name": "etl"}],
    }
    m = render(chart, values)
    templates = {f"Deployment/{n}": d["spec"]["template"] for n, d in m.of("Deployment").items()}
    templates |= {f"Job/{n}": j["spec"]["template"] for n, j in m.of("Job").items()}
    templates |= {
        f"CronJob/{n}": c["spec"]["jobTemplate"]["spec"]["template"] for n, c in m.of("CronJob").items()
    }
    assert {k.split("/")[0] for k in templates} == {"Deployment", "Job", "CronJob"}
    for where, template in templates.items():
        assert template["metadata"]["labels"]["team"] == "data", where
        assert template["metadata"]["annotations"]["example.com/owner"] == "data", where
        for c in template["spec"]["containers"]:
            assert env(c)["HTTPS_PROXY"]["value"] == "http://proxy:3128", (where, c["name"])


def test_credentials_stay_off_command_lines_and_config_maps(chart: helm.Chart) -> None:
    m = render(chart, load_values("hpa-values.yaml"))
    passwords = ["0123456789abcdefcontroller", "0123456789abcdefworker", "0123456789abcdefadmin"]
    for where, pod in pod_specs(m).items():
        text = str(pod["containers"][0].get("args", [])) + str(pod["containers"][0].get("command", []))
        assert not any(p in text for p in passwords) and "$(NOETL_NATS_PASSWORD)" not in text, where
    assert not any(p in str(m.of("ConfigMap")) for p in passwords)
    # NOTES tell the user to put the client's URL in the environment, not in `--nats` (visible in ps).
    # (hpa-values.yaml's URL is tls://: the notes use it.)
    assert "--nats tls://" not in m.notes and "export NOETL_NATS_URL=tls://client:" in m.notes


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
