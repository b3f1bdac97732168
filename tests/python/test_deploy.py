"""The multi-replica deployment files, checked without Docker or a cluster (neither is on the
test machine):

- both compose files against the Compose Specification's schema (tests/schemas), and the
  replicas stack's parts against each other: 3 replicas with health checks on one PostgreSQL,
  nginx over exactly them, Prometheus scraping every one (promtool), their config valid
  (`quipu serve --check`);
- the Kubernetes manifests (deploy/kubernetes) against the Kubernetes API schemas
  (`kubernetes-validate`, strict: an unknown field is an error), and what they must say:
  readiness on /health, a preStop drain inside a grace period that covers Quipu's drain and
  ledger flush, a PodDisruptionBudget over the same pods, the store URL from a Secret, a config
  `quipu serve --check` accepts.

What was not run: `docker compose up` and `kubectl apply`. docs/replicas.md says so too.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import tomllib

import jsonschema
import kubernetes_validate
import pytest
import yaml

from harness import QUIPU, ROOT

REPLICAS_COMPOSE = ROOT / "docker-compose.replicas.yml"
K8S = ROOT / "deploy" / "kubernetes" / "quipu.yaml"
# The Kubernetes version the manifests are validated for (kubernetes-validate ships its schemas).
K8S_VERSION = "1.33.0"


def compose_schema() -> dict:
    return json.loads((ROOT / "tests" / "schemas" / "compose-spec.json").read_text())


@pytest.mark.parametrize("name", ["docker-compose.yml", "docker-compose.replicas.yml"])
def test_compose_files_follow_the_compose_specification(name):
    doc = yaml.safe_load((ROOT / name).read_text())
    errors = sorted(jsonschema.Draft7Validator(compose_schema()).iter_errors(doc), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors)


def test_the_schema_check_can_fail():
    doc = yaml.safe_load(REPLICAS_COMPOSE.read_text())
    doc["services"]["quipu-1"]["healthcheck"]["interval"] = 10
    doc["services"]["balancer"]["ports"] = "8080:8080"
    doc["services"]["postgres"]["restart_policy"] = "always"
    assert len(list(jsonschema.Draft7Validator(compose_schema()).iter_errors(doc))) >= 2


def quipu_check(text: str, env: dict | None = None) -> None:
    path = ROOT / "tests" / ".tmp" / f"deploy-check-{os.getpid()}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    try:
        r = subprocess.run([str(QUIPU), "--config", str(path), "serve", "--check"], capture_output=True,
                           text=True, env={**os.environ, **(env or {})})
    finally:
        path.unlink()
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_replicas_stack_fits_together():
    doc = yaml.safe_load(REPLICAS_COMPOSE.read_text())
    services = doc["services"]
    replicas = sorted(s for s in services if s.startswith("quipu-"))
    assert replicas == ["quipu-1", "quipu-2", "quipu-3"]
    cfg_text = (ROOT / "deploy" / "replicas" / "quipu.toml").read_text()
    cfg = tomllib.loads(cfg_text)
    listen = int(cfg["server"]["listen"].rsplit(":", 1)[1])
    metrics = int(cfg["server"]["metrics_listen"].rsplit(":", 1)[1])
    assert cfg["store"]["url"] == "env:QUIPU_STORE_URL"
    for name in replicas:
        s = services[name]
        assert s["depends_on"]["postgres"]["condition"] == "service_healthy"
        assert f":{listen}/health" in " ".join(s["healthcheck"]["test"])
        assert s["environment"]["QUIPU_STORE_URL"].startswith("postgres://")
        assert "@postgres:5432/" in s["environment"]["QUIPU_STORE_URL"]
        assert "./deploy/replicas/quipu.toml:/etc/quipu/quipu.toml:ro" in s["volumes"]
        assert "ports" not in s, f"{name}: replicas are reached through the balancer only"
    single = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    for name, s in services.items():
        # A service that `extends` one of the single stack inherits its healthcheck.
        base = single[s["extends"]["service"]] if "extends" in s else {}
        check = s.get("healthcheck") or base.get("healthcheck") or {}
        assert check.get("test"), f"{name} has no healthcheck"
        for dep, spec in (s.get("depends_on") or {}).items():
            assert dep in services and spec["condition"] == "service_healthy", (name, dep)
    # nginx balances over exactly the replicas, on their API port.
    nginx = (ROOT / "deploy" / "replicas" / "nginx.conf").read_text()
    assert sorted(re.findall(r"server (quipu-\d):(\d+)", nginx)) == [(r, str(listen)) for r in replicas]
    assert "proxy_next_upstream error timeout;" in nginx and "proxy_buffering off;" in nginx
    mounts = services["balancer"]["volumes"]
    assert "./deploy/replicas/nginx.conf:/etc/nginx/nginx.conf:ro" in mounts
    # Prometheus scrapes every replica.
    prom_path = ROOT / "deploy" / "replicas" / "prometheus.yml"
    prom = yaml.safe_load(prom_path.read_text())
    jobs = {j["job_name"]: j for j in prom["scrape_configs"]}
    assert sorted(jobs["quipu"]["static_configs"][0]["targets"]) == [f"{r}:{metrics}" for r in replicas]
    promtool = subprocess.run(["promtool", "check", "config", str(prom_path)], capture_output=True, text=True)
    assert promtool.returncode == 0, promtool.stdout + promtool.stderr
    # The model servers come from the single stack; the config the replicas run is valid.
    assert services["vllm"]["extends"] == {"file": "docker-compose.yml", "service": "vllm"}
    assert services["llamacpp"]["extends"] == {"file": "docker-compose.yml", "service": "llamacpp"}
    quipu_check(cfg_text.replace("upstream:8000", "127.0.0.1:8000"),
                {"QUIPU_STORE_URL": "postgres://quipu:x@127.0.0.1:5432/quipu"})


def k8s_docs() -> list[dict]:
    return [d for d in yaml.safe_load_all(K8S.read_text()) if d]


def test_kubernetes_manifests_are_valid_resources():
    docs = k8s_docs()
    assert {d["kind"] for d in docs} >= {"Secret", "ConfigMap", "Deployment", "Service", "PodDisruptionBudget"}
    for d in docs:
        try:
            kubernetes_validate.validate(d, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{d['kind']} {d['metadata']['name']}: {e.message} at {'/'.join(map(str, e.path))}")


def test_the_kubernetes_check_can_fail():
    (dep,) = [d for d in k8s_docs() if d["kind"] == "Deployment"]
    dep["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["pathh"] = "/health"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(dep, K8S_VERSION, strict=True)


def test_kubernetes_manifests_drain_probe_and_protect_the_replicas():
    docs = {(d["kind"], d["metadata"]["name"]): d for d in k8s_docs()}
    dep = docs[("Deployment", "quipu")]
    pod = dep["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert dep["spec"]["replicas"] >= 3
    assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert dep["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    (c,) = pod["spec"]["containers"]
    cfg_text = docs[("ConfigMap", "quipu-config")]["data"]["quipu.toml"]
    cfg = tomllib.loads(cfg_text)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["http"] == int(cfg["server"]["listen"].rsplit(":", 1)[1])
    assert ports["metrics"] == int(cfg["server"]["metrics_listen"].rsplit(":", 1)[1])
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    # preStop, then Quipu's own drain and ledger flush, all within the grace period.
    pre_stop = c["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep" and int(pre_stop[1]) >= 5
    needed = int(pre_stop[1]) + cfg["server"]["grace_period_seconds"] + cfg["store"]["shutdown_flush_timeout_s"]
    assert pod["spec"]["terminationGracePeriodSeconds"] >= needed
    # The store URL comes from the Secret; the config reads it from the environment.
    env = {e["name"]: e for e in c["env"]}
    ref = env["QUIPU_STORE_URL"]["valueFrom"]["secretKeyRef"]
    secret = docs[("Secret", ref["name"])]
    assert ref["key"] in secret["stringData"]
    assert cfg["store"]["url"] == "env:QUIPU_STORE_URL"
    assert not re.search(r"postgres://\w+:\w+@", cfg_text), "no password in the ConfigMap"
    # The PodDisruptionBudget and the Services select these pods.
    pdb = docs[("PodDisruptionBudget", "quipu")]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"].get("maxUnavailable") == 1 or pdb["spec"].get("minAvailable")
    for name in ("quipu", "quipu-metrics"):
        assert docs[("Service", name)]["spec"]["selector"].items() <= labels.items()
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(ports["metrics"])
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert mounts[os.path.dirname(env["QUIPU_CONFIG"]["value"])] == "config"
    assert cfg["store"]["spill_dir"].startswith(next(p for p, n in mounts.items() if n == "data"))
    quipu_check(cfg_text.replace("vllm.llm.svc.cluster.local:8000", "127.0.0.1:8000"),
                {"QUIPU_STORE_URL": "postgres://quipu:x@127.0.0.1:5432/quipu"})
