"""deploy/: the Kubernetes manifests validate (``kubernetes-validate``, strict,
with the schemas it ships: no network), and the files agree with each other
and with the daemon: the ConfigMap's memorizzd.toml passes ``--check-config``,
the DaemonSet mounts what that file names, the agent pod mounts one of its
profiles' directories as one of its uids, and Prometheus keeps the pods the
DaemonSet annotates."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.harness import DAEMON_EXE

DEPLOY = Path(__file__).parents[2] / "deploy"
KUBE = DEPLOY / "kubernetes"
MANIFESTS = sorted([*KUBE.glob("*.yaml"), DEPLOY / "otel" / "kubernetes.yaml"])
K8S_VERSION = "1.30.0"
"""The oldest Kubernetes these manifests are meant for (still supported)."""


def _documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _one(name: str) -> dict[str, Any]:
    (doc,) = _documents(KUBE / name)
    return doc


def _config() -> dict[str, Any]:
    return tomllib.loads(_one("configmap.yaml")["data"]["memorizzd.toml"])


def _daemon() -> dict[str, Any]:
    (container,) = _one("daemonset.yaml")["spec"]["template"]["spec"]["containers"]
    return container


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def _mounts(container: dict[str, Any]) -> dict[str, str]:
    return {m["mountPath"]: m["name"] for m in container["volumeMounts"]}


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_every_manifest_validates(path: Path) -> None:
    docs = _documents(path)
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_validator_refuses_an_unknown_field() -> None:
    """The check above is worth something: a misspelt field fails."""
    doc = _one("daemonset.yaml")
    doc["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_configmaps_file_passes_check_config(tmp_path: Path) -> None:
    path = tmp_path / "memorizzd.toml"
    path.write_text(_one("configmap.yaml")["data"]["memorizzd.toml"])
    done = subprocess.run(
        [DAEMON_EXE, "--config", str(path), "--check-config"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "configuration ok" in done.stdout


def test_the_daemonset_runs_the_configmaps_file_with_its_probes() -> None:
    config = _config()
    spec = _one("daemonset.yaml")["spec"]["template"]["spec"]
    daemon = _daemon()
    mounts = _mounts(daemon)
    volumes = {v["name"]: v for v in spec["volumes"]}

    assert daemon["args"] == ["--config", "/etc/memorizzd/memorizzd.toml"]
    assert volumes[mounts["/etc/memorizzd"]]["configMap"]["name"] == "memorizzd-config"
    # memorizzctl in the probes finds the operator socket the config names
    assert _env(daemon)["MEMORIZZ_SOCKET"] == config["socket"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        command = daemon[probe]["exec"]["command"]
        assert command[:4] == ["memorizzctl", "daemon", "status", "--timeout"]
        # the command gives up (exit 75) before kubelet kills it
        assert 0 < float(command[4]) < daemon[probe]["timeoutSeconds"]
    # the state directory and the agents' directory are the host's
    state = volumes[mounts[config["state_dir"]]]
    assert state["hostPath"]["path"] == config["state_dir"]
    agents = volumes[mounts[config["agents_dir"]]]
    assert agents["hostPath"]["path"] == config["agents_dir"]
    # the operator socket is not: it stays in the pod
    assert "emptyDir" in volumes[mounts["/run/memorizzd"]]
    assert not config["socket"].startswith(config["agents_dir"] + "/")
    # the metrics port is the one the config listens on
    port = int(config["metrics"]["listen"].rpartition(":")[2])
    assert daemon["ports"] == [
        {"name": "metrics", "containerPort": port, "protocol": "TCP"}
    ]


def test_the_vault_key_is_a_secret_file_never_an_environment_variable() -> None:
    spec = _one("daemonset.yaml")["spec"]["template"]["spec"]
    daemon = _daemon()
    env = _env(daemon)
    assert not any("KEY" in name for name in env)
    assert not any("valueFrom" in e for e in daemon["env"])
    credentials = env["CREDENTIALS_DIRECTORY"]
    volume = {v["name"]: v for v in spec["volumes"]}[_mounts(daemon)[credentials]]
    assert volume["secret"]["items"] == [
        {"key": "memorizzd-key", "path": "memorizzd-key"}  # vault/keys.py's name
    ]
    # readable by the daemon's group (fsGroup) alone
    assert volume["secret"]["defaultMode"] == 0o440
    assert spec["securityContext"]["fsGroup"] == spec["securityContext"]["runAsUser"]


def test_the_daemon_runs_unprivileged_on_a_read_only_root() -> None:
    spec = _one("daemonset.yaml")["spec"]["template"]["spec"]
    pod = spec["securityContext"]
    assert pod["runAsNonRoot"] is True
    assert pod["runAsUser"] != 0
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    container = _daemon()["securityContext"]
    assert container["readOnlyRootFilesystem"] is True
    assert container["allowPrivilegeEscalation"] is False
    assert container["capabilities"] == {"drop": ["ALL"]}
    assert spec["automountServiceAccountToken"] is False
    # what it writes is on volumes: the sockets, the state, /tmp
    assert {"/run/memorizzd", "/var/lib/memorizzd", "/tmp"} <= set(_mounts(_daemon()))
    # the image runs as that user too (deploy/Dockerfile)
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert f"USER {pod['runAsUser']}:{pod['runAsGroup']}" in dockerfile
    assert 'ENTRYPOINT ["memorizzd"]' in dockerfile
    # the one root step changes owners, and nothing more
    (init,) = spec["initContainers"]
    assert init["securityContext"]["capabilities"] == {
        "drop": ["ALL"],
        "add": ["CHOWN", "FOWNER"],
    }
    assert init["securityContext"]["allowPrivilegeEscalation"] is False


def test_the_agent_pod_mounts_one_profiles_directory_as_its_uid() -> None:
    config = _config()
    pod = _one("agent-pod.yaml")["spec"]
    (volume,) = pod["volumes"]
    path = volume["hostPath"]["path"]
    assert volume["hostPath"]["type"] == "Directory"
    profile = next(
        p for p in config["profiles"] if path == f"{config['agents_dir']}/{p['name']}"
    )
    assert pod["securityContext"]["runAsUser"] in profile["uids"]
    (agent,) = pod["containers"]
    (mount,) = agent["volumeMounts"]
    assert _env(agent)["MEMORIZZ_SOCKET"] == f"{mount['mountPath']}/api.sock"


def test_prometheus_keeps_the_pods_the_daemonset_annotates() -> None:
    annotations = _one("daemonset.yaml")["spec"]["template"]["metadata"]["annotations"]
    scrape = yaml.safe_load((DEPLOY / "prometheus" / "kubernetes.yml").read_text())
    (job,) = scrape["scrape_configs"]
    (sd,) = job["kubernetes_sd_configs"]
    assert sd["role"] == "pod"
    assert sd["namespaces"]["names"] == [_one("namespace.yaml")["metadata"]["name"]]
    keep = next(r for r in job["relabel_configs"] if r.get("action") == "keep")
    (label,) = keep["source_labels"]
    annotation = label.removeprefix("__meta_kubernetes_pod_annotation_")
    assert re.fullmatch(keep["regex"], annotations["prometheus.io/scrape"])
    assert annotation == "prometheus_io_scrape"
    assert annotations["prometheus.io/port"] == str(
        _daemon()["ports"][0]["containerPort"]
    )
    # only the monitoring namespace reaches that port
    policy = _one("networkpolicy.yaml")["spec"]
    (rule,) = policy["ingress"]
    assert rule["ports"] == [
        {"protocol": "TCP", "port": int(annotations["prometheus.io/port"])}
    ]


def test_the_collector_receives_what_the_config_would_send() -> None:
    docs = {d["kind"]: d for d in _documents(DEPLOY / "otel" / "kubernetes.yaml")}
    service = docs["Service"]["metadata"]
    endpoint = f"http://{service['name']}.{service['namespace']}.svc:4318/v1/traces"
    assert endpoint in _one("configmap.yaml")["data"]["memorizzd.toml"]
    collector = yaml.safe_load(docs["ConfigMap"]["data"]["collector.yaml"])
    assert collector["receivers"]["otlp"]["protocols"]["http"]["endpoint"].endswith(
        ":4318"
    )
