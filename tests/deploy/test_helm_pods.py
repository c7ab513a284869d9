"""deploy/helm/noetl-stream: every pod's environment and hardening.

The NATS/JetStream settings every component shares, the keychain key from its Secret, probes, the
security context and the writable /tmp, labels/annotations/extraEnv on every pod, and credentials kept
off command lines and ConfigMaps.
"""

from __future__ import annotations

import helm_python as helm
from helm_support import (
    chart_fixture,  # noqa: F401 (the `chart` fixture)
    container,
    env,
    load_values,
    pod_specs,
    render,
)

from noetl_stream.cli.common import TOPOLOGY_ENV

# --- NATS and keychain wiring ---------------------------------------------------------------------------


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


# --- probes, security context, writable /tmp ------------------------------------------------------------


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


# --- every pod: labels, extra env, credentials ----------------------------------------------------------


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
