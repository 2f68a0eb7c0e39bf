"""The operators' files in deploy/ (docs/operations.md section 5): the Grafana dashboard,
the Prometheus alert rules and the Kubernetes example parse, name only metrics the
worker's registry has, and wire the probes, the metrics port, the config and the noise
key as the worker reads them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from dpstream.config.schema import PipelineConfig, parse_config
from dpstream.pipeline.worker.metrics import WorkerMetrics, exposed_names
from dpstream.pipeline.worker.operations import LIVEZ_PATH, METRICS_PATH, READYZ_PATH

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
METRIC = re.compile(r"\bdpstream_[a-z0-9_]+\b")


def manifest(name: str) -> dict[str, Any]:
    return yaml.safe_load((KUBERNETES / name).read_text())


def pipeline_config() -> PipelineConfig:
    return parse_config(yaml.safe_load(manifest("configmap.yaml")["data"]["pipeline.yaml"]))


def worker_container() -> dict[str, Any]:
    (container,) = manifest("deployment.yaml")["spec"]["template"]["spec"]["containers"]
    return container


def expressions(node: Any) -> list[str]:
    """Every PromQL expression in a dashboard: the panels' targets and the variables'
    queries."""
    if isinstance(node, dict):
        found = [v for k, v in node.items() if k in ("expr", "definition") and isinstance(v, str)]
        return found + [e for v in node.values() for e in expressions(v)]
    if isinstance(node, list):
        return [e for v in node for e in expressions(v)]
    return []


def registry_names() -> set[str]:
    return exposed_names(WorkerMetrics(pipeline_config()).registry)


def test_the_dashboard_shows_only_metrics_the_worker_has_and_most_of_them():
    dashboard = json.loads((DEPLOY / "grafana" / "dpstream.json").read_text())
    exprs = expressions(dashboard["panels"]) + expressions(dashboard["templating"])
    referenced = {name for e in exprs for name in METRIC.findall(e)}
    assert referenced and referenced <= registry_names(), referenced - registry_names()
    # Every metric family of the registry is on a panel, but the build info.
    families = {m.name for m in WorkerMetrics(pipeline_config()).registry.collect()}
    shown = {n for n in families if any(r.startswith(n) for r in referenced)}
    assert families - shown == set()
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${DS_PROMETHEUS}"


def test_the_alerts_cover_the_issue_and_name_only_metrics_the_worker_has():
    (group,) = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())["groups"]
    rules = {rule["alert"]: rule for rule in group["rules"]}
    assert {
        "DpstreamIngestLagGrowing",
        "DpstreamTicksLate",
        "DpstreamWorkerNotReady",
        "DpstreamBudgetNearTotal",
    } <= set(rules)
    referenced = {name for rule in rules.values() for name in METRIC.findall(rule["expr"])}
    assert referenced <= registry_names(), referenced - registry_names()
    for name, rule in rules.items():
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), name
        assert rule["annotations"]["summary"], name
        assert rule["expr"].count("(") == rule["expr"].count(")"), name
    assert "dpstream_ingest_lag_records" in rules["DpstreamIngestLagGrowing"]["expr"]
    assert "dpstream_release_lag_ticks" in rules["DpstreamTicksLate"]["expr"]
    assert "dpstream_ready" in rules["DpstreamWorkerNotReady"]["expr"]
    assert "dpstream_total_epsilon" in rules["DpstreamBudgetNearTotal"]["expr"]


def test_the_probes_and_the_port_are_the_workers():
    cfg, container = pipeline_config(), worker_container()
    assert cfg.metrics.enabled and cfg.metrics.host == "0.0.0.0"  # noqa: S104 - the pod's
    (port,) = container["ports"]
    assert port == {"name": "metrics", "containerPort": cfg.metrics.port, "protocol": "TCP"}
    probes = {kind: container[kind]["httpGet"] for kind in ("livenessProbe", "readinessProbe")}
    assert probes["livenessProbe"] == {"path": LIVEZ_PATH, "port": "metrics"}
    assert probes["readinessProbe"] == {"path": READYZ_PATH, "port": "metrics"}
    assert container["startupProbe"]["httpGet"] == {"path": LIVEZ_PATH, "port": "metrics"}
    annotations = manifest("deployment.yaml")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(cfg.metrics.port)
    assert annotations["prometheus.io/path"] == METRICS_PATH
    # Only Prometheus reaches the port (docs/security.md section 5).
    (ingress,) = manifest("networkpolicy.yaml")["spec"]["ingress"]
    assert ingress["ports"] == [{"port": "metrics", "protocol": "TCP"}]


def mounted(path: Path, volume_kind: str) -> tuple[dict[str, Any], str]:
    """The volume of ``volume_kind`` (configMap, secret) whose mount holds ``path``, and
    the item key the file is."""
    pod = manifest("deployment.yaml")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    for mount in worker_container()["volumeMounts"]:
        volume = volumes[mount["name"]]
        if volume_kind in volume and path.parent == Path(mount["mountPath"]):
            source = volume[volume_kind]
            items = {i["path"]: i["key"] for i in source.get("items", [])}
            assert mount.get("readOnly") is True
            return source, items.get(path.name, path.name)
    raise AssertionError(f"no {volume_kind} volume mounted at {path.parent}")


def test_the_config_and_the_noise_key_are_mounted_where_the_worker_reads_them():
    cfg, container = pipeline_config(), worker_container()
    command = container["command"]
    config_path = Path(command[command.index("--config") + 1])
    config_map, key = mounted(config_path, "configMap")
    assert config_map["name"] == manifest("configmap.yaml")["metadata"]["name"]
    assert key in manifest("configmap.yaml")["data"]
    # The key comes from the Secret's file, not from an environment variable.
    assert cfg.noise.mode == "keyed" and cfg.noise.key_env is None
    assert cfg.noise.key_file is not None
    secret_volume, key = mounted(cfg.noise.key_file, "secret")
    secret = manifest("secret.yaml")
    assert secret_volume["secretName"] == secret["metadata"]["name"]
    assert key in secret["stringData"]
    assert secret_volume["defaultMode"] == 0o400
    env = {e["name"] for e in container.get("env", [])}
    assert "DPSTREAM_NOISE_KEY" not in env


def test_kustomize_applies_every_manifest_but_the_secret():
    kustomization = manifest("kustomization.yaml")
    resources = set(kustomization["resources"])
    assert all((KUBERNETES / r).is_file() for r in resources)
    on_disk = {p.name for p in KUBERNETES.glob("*.yaml")} - {"kustomization.yaml"}
    assert on_disk - resources == {"secret.yaml"}  # a key is never applied from a repository
    namespaces = {manifest(r)["metadata"]["namespace"] for r in resources | {"secret.yaml"}}
    assert namespaces == {kustomization["namespace"]}
