"""deploy/helm/noetl-stream after the deployment probe: what an operator hit, rendered by Helm's own SDK.

The NATS CA reaches the NATS connection only (``NOETL_NATS_CA``, not ``SSL_CERT_FILE``); a cluster's
comma-separated URLs get the credentials each, and the URL the chart builds connects to a real server
that refuses anonymous clients; ``.creds`` files can be mounted; ``extraEnv`` cannot silently shadow a
variable the chart sets; liveness does not restart pods during a NATS outage; ``--processes`` is a
pool setting; NOTES.txt shows the configured URL.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
from helm_support import (
    arg,
    chart_fixture,  # noqa: F401 (the `chart` fixture)
    container,
    env,
    lint_problems,
    pod_specs,
    render,
)

from noetl_stream.cli import main as cli_main
from noetl_stream.jetstream.connection import connect
from noetl_stream.jetstream.embedded import EmbeddedNats


def containers(values: dict[str, Any] | None, chart: helm.Chart) -> dict[str, dict[str, Any]]:
    """Every container the chart renders (Deployments, the provisioning Job, the prune CronJob)."""
    return {where: pod["containers"][0] for where, pod in pod_specs(render(chart, values)).items()}


def fail_message(chart: helm.Chart, values: dict[str, Any]) -> str:
    with pytest.raises(helm.HelmRenderError) as info:
        chart.render(values, name="noetl", namespace="noetl")
    return str(info.value)


# --- 1. the NATS CA is the NATS connection's, not the process's ---------------------------------------


def test_the_nats_ca_is_given_to_the_nats_connection_only(chart: helm.Chart) -> None:
    """SSL_CERT_FILE made the private CA the only one Python trusts: every `http` task to a public HTTPS
    endpoint failed with tls_error."""
    values = {"nats": {"url": "tls://nats.nats.svc:4222", "tls": {"caSecret": "nats-ca", "caKey": "ca.pem"}}}
    m = render(chart, values)
    pods = pod_specs(m)
    assert {k.split("/")[0] for k in pods} == {"Deployment", "Job", "CronJob"}
    for where, pod in pods.items():
        c = pod["containers"][0]
        e = env(c)
        assert "SSL_CERT_FILE" not in e and "SSL_CERT_DIR" not in e, where
        path = e["NOETL_NATS_CA"]["value"]
        mount = next(v for v in c["volumeMounts"] if path.startswith(v["mountPath"] + "/"))
        assert mount["readOnly"] is True, where
        volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
        assert volume["secret"]["secretName"] == "nats-ca" and path.endswith("/ca.pem"), where
    assert "export NOETL_NATS_CA=" in m.notes
    assert all("NOETL_NATS_CA" not in env(c) for c in containers(None, chart).values())


# --- 3. cluster URLs, auth off, .creds files ------------------------------------------------------------


CLUSTER = "nats://n1.nats:4222,nats://n2.nats:4222,tls://n3.nats:4223"


def test_a_cluster_url_list_gets_the_credentials_in_every_url(chart: helm.Chart) -> None:
    """docs/deploy.md tells users to give every node, comma-separated; the schema refused it."""
    values = {"nats": {"url": CLUSTER}}
    assert lint_problems(values) == []
    for where, c in containers(values, chart).items():
        url = env(c)["NOETL_NATS_URL"]["value"]
        creds = "$(NOETL_NATS_USER):$(NOETL_NATS_PASSWORD)@"
        assert url == f"nats://{creds}n1.nats:4222,nats://{creds}n2.nats:4222,tls://{creds}n3.nats:4223", (
            where
        )
    notes = render(chart, values).notes
    assert "nats://client:$PASSWORD@n1.nats:4222,nats://client:$PASSWORD@n2.nats:4222,tls://client:" in notes


def test_without_auth_the_url_is_used_as_given_credentials_included(chart: helm.Chart) -> None:
    """values.yaml: auth.enabled false connects with `url` as it is (no user, or credentials in it)."""
    given = "nats://app:s3cret@n1.nats:4222,nats://app:s3cret@n2.nats:4222"
    values = {"nats": {"url": given, "auth": {"enabled": False}}}
    assert lint_problems(values) == []
    m = render(chart, values)
    for where, c in containers(values, chart).items():
        e = env(c)
        assert e["NOETL_NATS_URL"]["value"] == given and "NOETL_NATS_USER" not in e, where
    assert "s3cret" not in m.notes  # `helm status` shows the notes
    assert "export NOETL_NATS_URL=nats://$USER:$PASSWORD@n1.nats:4222,nats://$USER:$PASSWORD@n2" in m.notes
    # With auth on, credentials in the URL would collide with the ones the chart adds.
    with pytest.raises(helm.HelmValuesError, match="/nats/url"):
        chart.validate_schema(chart.merge_values({"nats": {"url": given}}))


@pytest.mark.parametrize("url", ["nats://n1:4222/", "http://n1:4222", "nats://n1:4222,,nats://n2:4222"])
def test_what_is_not_a_nats_url_list_is_refused(chart: helm.Chart, url: str) -> None:
    with pytest.raises(helm.HelmValuesError, match="/nats/url"):
        chart.validate_schema(chart.merge_values({"nats": {"url": url}}))


async def test_the_url_the_chart_builds_reaches_a_cluster_whose_first_node_is_down(
    chart: helm.Chart, tmp_path: Path
) -> None:
    """The kubelet expands $(NOETL_NATS_USER) and $(NOETL_NATS_PASSWORD) in the value; the process
    connects with it (any node of the list) as its user, on a server that refuses anonymous clients."""
    conf = tmp_path / "auth.conf"
    conf.write_text('authorization { users: [ { user: "worker", password: "pw-7f3a9c" } ] }\n')
    with EmbeddedNats(tmp_path / "nats", config_file=conf) as server:
        values = {"nats": {"url": f"nats://127.0.0.1:1,nats://127.0.0.1:{server.port}"}}
        c = container(render(chart, values).get("Deployment", "noetl-noetl-stream-worker-default"))
        e = env(c)
        expanded = (
            e["NOETL_NATS_URL"]["value"]
            .replace("$(NOETL_NATS_USER)", e["NOETL_NATS_USER"]["value"])
            .replace("$(NOETL_NATS_PASSWORD)", "pw-7f3a9c")
        )
        nc = await connect(expanded, name="pytest-chart-url", connect_wait_s=15)
        try:
            assert nc.connected_url is not None and nc.connected_url.port == server.port
            await nc.flush(timeout=5)
        finally:
            await nc.close()


def test_creds_files_are_mounted_one_identity_per_pod(chart: helm.Chart) -> None:
    """JWT/NKey auth: NOETL_NATS_CREDS (read by jetstream.connection) names the pod's own .creds file, read-only."""
    values = {"nats": {"auth": {"enabled": False}, "credsSecret": "noetl-nats-creds"}}
    roles = {
        "Deployment/noetl-noetl-stream-controller": "controller",
        "Job/noetl-noetl-stream-provision": "admin",
    }
    roles |= {
        "Deployment/noetl-noetl-stream-worker-default": "worker",
        "CronJob/noetl-noetl-stream-prune": "controller",
    }
    pods = pod_specs(render(chart, values))
    assert set(pods) == set(roles)
    for where, pod in pods.items():
        c = pod["containers"][0]
        path = env(c)["NOETL_NATS_CREDS"]["value"]
        mount = next(v for v in c["volumeMounts"] if path.startswith(v["mountPath"] + "/"))
        assert mount["readOnly"] is True, where
        volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
        assert volume["secret"]["secretName"] == "noetl-nats-creds", where
        assert volume["secret"]["items"] == [{"key": roles[where], "path": path.rsplit("/", 1)[1]}], where
        assert "NOETL_NATS_PASSWORD" not in env(c), where
    message = fail_message(chart, {"nats": {"credsSecret": "noetl-nats-creds"}})
    assert "set nats.auth.enabled=false" in message


# --- 4. extraEnv cannot shadow what the chart sets --------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "values", "expected"),
    [
        ("NOETL_NATS_URL", {}, "from nats.url and nats.auth"),
        ("NOETL_NATS_PASSWORD", {}, "from nats.auth"),
        ("HOME", {}, "the writable emptyDir"),
        ("NOETL_PREFIX", {}, "from prefix and jetstream.*"),  # from the ConfigMap (envFrom), or the Job's env
        ("NOETL_PARTITIONS", {}, "from prefix and jetstream.*"),
        ("NOETL_API_TOKENS", {"controller": {"api": {"tokensSecret": "t"}}}, "in the controller container"),
        ("NOETL_KEYCHAIN_KEY_FILE", {"keychain": {"existingSecret": "kc"}}, "in the worker container"),
        ("NOETL_NATS_CA", {"nats": {"tls": {"caSecret": "ca"}}}, "from nats.tls.caSecret"),
        ("NOETL_CONTROLLER_ID", {}, "in the controller container"),
    ],
)
def test_extra_env_naming_a_variable_the_chart_sets_fails(
    chart: helm.Chart, extra: str, values: dict[str, Any], expected: str
) -> None:
    """Kubernetes keeps one of two variables of the same name without a word (and env wins over envFrom):
    an extraEnv NOETL_NATS_URL replaced every component's URL, credentials and all."""
    message = fail_message(chart, {**values, "extraEnv": [{"name": extra, "value": "x"}]})
    assert f"extraEnv sets {extra}, which the chart sets itself" in message
    assert expected in message


def test_extra_env_the_chart_does_not_set_reaches_every_container_once(chart: helm.Chart) -> None:
    # NOETL_API_TOKENS without controller.api.tokensSecret is the documented alternative.
    extra = [
        {"name": "HTTPS_PROXY", "value": "http://proxy:3128"},
        {"name": "NOETL_API_TOKENS", "value": "t"},
    ]
    values = {
        "extraEnv": extra,
        "controller": {"service": {"enabled": True}},
        "nats": {"tls": {"caSecret": "ca"}},
        "keychain": {"existingSecret": "kc"},
    }
    for where, c in containers(values, chart).items():
        names = [e["name"] for e in c["env"]]
        assert len(names) == len(set(names)), where
        assert names[-2:] == ["HTTPS_PROXY", "NOETL_API_TOKENS"], where  # after the chart's own
    twice = [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]
    assert "extraEnv lists A twice" in fail_message(chart, {"extraEnv": twice})


# --- 5. liveness is not readiness ----------------------------------------------------------------------------


def test_liveness_does_not_restart_pods_for_a_nats_outage(chart: helm.Chart) -> None:
    """A NATS outage of ~5 minutes restarted every controller and worker (liveness failed without a
    connection): `noetl-probe --liveness` passes while no NATS server is reachable."""
    for where, c in containers(None, chart).items():
        if not where.startswith("Deployment/"):
            continue
        assert c["readinessProbe"]["exec"]["command"] == ["noetl-probe"], where
        assert c["livenessProbe"]["exec"]["command"] == ["noetl-probe", "--liveness"], where
        # It may try every server of the URL (up to 4 s) before it answers.
        assert c["livenessProbe"]["timeoutSeconds"] >= 5, where
        live, ready = c["livenessProbe"], c["readinessProbe"]
        assert (
            live["periodSeconds"] * live["failureThreshold"]
            > ready["periodSeconds"] * ready["failureThreshold"]
        )


# --- 6. worker processes ----------------------------------------------------------------------------------------


def test_worker_processes_are_a_pool_setting(chart: helm.Chart) -> None:
    values = {
        "workerDefaults": {"processes": 2},
        "pools": [
            {"name": "default"},
            {"name": "cpu", "processes": 4, "concurrency": 2},
            {"name": "one", "processes": 1},
        ],
    }
    m = render(chart, values)
    worker = {
        p: container(m.get("Deployment", f"noetl-noetl-stream-worker-{p}")) for p in ("default", "cpu", "one")
    }
    assert arg(worker["default"], "--processes") == ["2"]
    assert arg(worker["cpu"], "--processes") == ["4"] and arg(worker["cpu"], "--concurrency") == ["2"]
    assert arg(worker["one"], "--processes") == []  # one process: no supervisor
    assert (
        "--processes"
        not in container(render(chart).get("Deployment", "noetl-noetl-stream-worker-default"))["args"]
    )
    options = {opt for p in cli_main.commands["worker"].params for opt in p.opts}
    assert "--processes" in options
    with pytest.raises(helm.HelmValuesError, match="/pools/0/processes"):
        chart.validate_schema(chart.merge_values({"pools": [{"name": "default", "processes": 0}]}))


# --- 9. notes ------------------------------------------------------------------------------------------------


def test_the_notes_use_the_configured_url(chart: helm.Chart) -> None:
    notes = render(chart, {"nats": {"url": "tls://nats.example.internal:7422"}}).notes
    assert "export NOETL_NATS_URL=tls://client:$PASSWORD@nats.example.internal:7422" in notes
    assert not re.search(r"nats://client:\S*:4222", notes)
