"""Proof that every dashboard panel works against a real Prometheus scraping the real gateway,
plus static checks of the dashboards and of the compose stack.

Prometheus and promtool come from Debian's `prometheus` package (scripts/deps.sh installs it).
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
from pathlib import Path

import pytest
import yaml

from harness import ROOT, Gateway, Sim, free_port, http_json, wait_until

DASHBOARDS = [ROOT / "dashboards" / "quipu-operations.json", ROOT / "dashboards" / "quipu-billing.json"]
SUFFIXES = ("_bucket", "_sum", "_count")
PROMQL_WORDS = {
    "sum", "by", "rate", "increase", "histogram_quantile", "topk", "scalar", "max", "min", "avg",
    "le", "without", "on", "ignoring", "group_left", "bool", "and", "or", "unless", "count",
}


def panels(d: dict):
    for p in d["panels"]:
        if p.get("type") != "row":
            yield p
        yield from (q for q in p.get("panels", []) if q.get("type") != "row")


def exprs():
    for path in DASHBOARDS:
        d = json.loads(path.read_text())
        for p in panels(d):
            for t in p["targets"]:
                yield path.name, p["title"], t


def metric_names(expr: str) -> set[str]:
    """Identifiers of the expression that are metric names (not functions or labels)."""
    stripped = re.sub(r'\{[^}]*\}', "", expr)          # label matchers
    stripped = re.sub(r'\[[^\]]*\]', "", stripped)      # range selectors
    stripped = re.sub(r'by \([^)]*\)', "", stripped)    # grouping labels
    names = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", stripped))
    return {n for n in names if n not in PROMQL_WORDS and not n.startswith("$") and ("_" in n)}


def family(name: str) -> str:
    for s in SUFFIXES:
        if name.endswith(s):
            return name[: -len(s)]
    return name


def substitute(expr: str) -> str:
    return (
        expr.replace("$__rate_interval", "30s")
        .replace("$__range", "5m")
        .replace('=~"$model"', '=~".*"')
        .replace('=~"$tenant"', '=~".*"')
    )


# ---------------------------------------------------------------------------------------------
# Static checks


def test_dashboards_are_generated_from_generate_py():
    r = subprocess.run(["python3", str(ROOT / "dashboards" / "generate.py"), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_dashboard_conventions():
    for path in DASHBOARDS:
        d = json.loads(path.read_text())
        assert d["id"] is None and d["uid"] and d["schemaVersion"] >= 39
        names = [v["name"] for v in d["templating"]["list"]]
        assert names[0] == "datasource" and "model" in names
        if "billing" in path.name:
            assert "tenant" in names
        for p in panels(d):
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
            assert p.get("description"), f"{path.name}: {p['title']} has no description"
            assert p["fieldConfig"]["defaults"].get("unit"), p["title"]
            for t in p["targets"]:
                assert t["datasource"]["uid"] == "${datasource}"
                for fn in ("rate(", "increase("):
                    for m in re.finditer(re.escape(fn) + r"[^\[]*\[([^\]]+)\]", t["expr"]):
                        assert m.group(1) in ("$__rate_interval", "$__range"), (p["title"], t["expr"])


# ---------------------------------------------------------------------------------------------
# The live proof


def drive_traffic(gw: Gateway, sims: list[Sim]) -> None:
    """Traffic of every kind, in three waves a few scrapes apart: a series must grow after its
    first sample for rate() to see it."""
    keys = {}
    for wave in range(3):
        one_wave(gw, sims, wave, keys)
        time.sleep(2.5)


def one_wave(gw: Gateway, sims: list[Sim], wave: int, keys: dict) -> None:
    if not keys:
        keys["rich"] = gw.new_tenant("obs-rich", top_up="1000.00")[1]
        gw.cli("tenant", "create", "obs-broke")
        keys["broke"] = gw.cli("key", "create", "--tenant", "obs-broke")["secret"]
        gw.wait_key(keys["broke"])
    # A fresh one-request-per-minute key each wave, so every wave has a 429.
    limited = gw.new_tenant(f"obs-limited{wave}", top_up="100.00", rpm=1)[1]
    key, broke = keys["rich"], keys["broke"]
    bearer = {"Authorization": f"Bearer {key}"}
    xkey = {"x-api-key": key, "anthropic-version": "2023-06-01"}
    chat = gw.base + "/v1/chat/completions"
    msgs = gw.base + "/v1/messages"
    long_prompt = "contexto " * 400
    for i in range(2):
        for stream in (False, True):
            http_json("POST", chat, {"model": "colibri", "stream": stream,
                      "messages": [{"role": "user", "content": f"{long_prompt} turno {i} [[sim: tokens=20 reasoning=2]]"}]}, bearer)
            http_json("POST", msgs, {"model": "aguila", "max_tokens": 50, "stream": stream,
                      "messages": [{"role": "user", "content": f"hola {i} [[sim: tokens=15]]"}]}, xkey)
    http_json("POST", gw.base + "/v1/messages/count_tokens", {"model": "apu", "messages": [{"role": "user", "content": "x"}]}, xkey)
    for path in ("/v1/models", "/v1/pricing", "/v1/plans", "/v1/models/apu", "/nope"):
        http_json("GET", gw.base + path)
    http_json("POST", chat, {"model": "colibri", "messages": []}, bearer)                       # 400
    http_json("POST", chat, {"model": "colibri", "messages": []}, {"Authorization": "Bearer x"})  # 401
    http_json("POST", chat, {"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}, bearer)  # 404
    http_json("POST", chat, {"model": "apu", "messages": [{"role": "user", "content": "x"}]}, {"Authorization": f"Bearer {broke}"})  # 402
    for _ in range(3):
        http_json("POST", chat, {"model": "colibri", "messages": [{"role": "user", "content": "x [[sim: tokens=1]]"}]},
                  {"Authorization": f"Bearer {limited}"})                                     # 429
    for d in ("status=500", "status=503", "status=503", "overflow", "fail_after=1"):
        http_json("POST", chat, {"model": "colibri", "stream": d.startswith("fail"),
                  "messages": [{"role": "user", "content": f"[[sim: {d}]]"}]}, bearer)
    # A client that hangs up mid-stream.
    s = socket.create_connection(("127.0.0.1", gw.port))
    body = json.dumps({"model": "aguila", "stream": True, "messages": [{"role": "user", "content": "[[sim: tokens=30 delay_ms=100]]"}]}).encode()
    s.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    head = s.recv(2048)
    assert head.startswith(b"HTTP/1.1 200"), head[:200]
    s.close()
    time.sleep(0.3)
    if wave == 1:
        # A replica that dies: a connect failure, a retry, an unhealthy replica.
        sims[1].stop()
    for i in range(6):
        http_json("POST", chat, {"model": "colibri", "messages": [{"role": "user", "content": f"after {i} [[sim: tokens=2]]"}]}, bearer)


@pytest.fixture(scope="module")
def prometheus_bin():
    missing = [b for b in ("prometheus", "promtool") if not shutil.which(b)]
    assert not missing, (
        f"{', '.join(missing)} not found: install Debian's `prometheus` package "
        "(apt-get install -y prometheus; scripts/deps.sh does it)"
    )
    return shutil.which("prometheus")


@pytest.fixture(scope="module")
def live(workdir, prometheus_bin):
    sims = [Sim(workdir, name=f"sim-obs-{i}").start() for i in range(2)]
    gw = Gateway(
        workdir,
        {"colibri": [s.api_base for s in sims], "aguila": [sims[0].api_base], "apu": [sims[0].api_base]},
        name="quipu-obs",
    ).start()
    port = free_port()
    data = workdir / "prom-data"
    conf = workdir / "prometheus.yml"
    conf.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "quipu", "static_configs": [{"targets": [f"127.0.0.1:{gw.metrics_port}"]}]}],
    }))
    log = open(workdir / "prometheus.log", "wb")
    prom = subprocess.Popen(
        [prometheus_bin, f"--config.file={conf}", f"--storage.tsdb.path={data}",
         f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1h"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: http_json("GET", url + "/-/ready")[0] == 200, 30, "prometheus ready")
        wait_until(lambda: query(url, 'up{job="quipu"} == 1'), 30, "the first scrape")
        drive_traffic(gw, sims)
        time.sleep(2)
        yield gw, url
    finally:
        prom.terminate()
        prom.wait(10)
        log.close()
        gw.stop()
        for s in sims:
            s.stop()


def query(url: str, expr: str) -> list:
    status, body, _ = http_json("GET", url + "/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    if status != 200 or body.get("status") != "success":
        raise AssertionError(f"query failed ({status}): {expr}: {body}")
    return body["data"]["result"]


def test_every_panel_query_returns_data(live):
    _, url = live
    failures = []
    for dash, title, t in exprs():
        expr = substitute(t["expr"])
        try:
            result = query(url, expr)
        except AssertionError as e:
            failures.append(f"{dash} / {title}: {e}")
            continue
        values = [r["value"][1] for r in result]
        if not values or all(v == "NaN" for v in values):
            failures.append(f"{dash} / {title}: no data for {expr}")
    assert not failures, "\n".join(failures)


def test_dashboards_use_only_exported_metrics_and_chart_every_family(live):
    gw, _ = live
    text = gw.metrics()
    exported = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
    used = set()
    for _, _, t in exprs():
        used |= {family(n) for n in metric_names(t["expr"])}
    unknown = used - exported
    assert not unknown, f"dashboards query metrics the gateway does not export: {sorted(unknown)}"
    uncharted = {}
    for line in (ROOT / "dashboards" / "uncharted.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, reason = line.partition(" ")
            assert reason.strip(), f"uncharted.txt: {name} needs a reason"
            uncharted[name] = reason
    missing = exported - used - set(uncharted)
    assert not missing, f"exported but neither charted nor listed in dashboards/uncharted.txt: {sorted(missing)}"


def test_promtool_check_metrics_is_clean(live):
    gw, _ = live
    r = subprocess.run(["promtool", "check", "metrics"], input=gw.metrics(), capture_output=True, text=True)
    assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), r.stdout + r.stderr


# ---------------------------------------------------------------------------------------------
# The compose stack, offline (no Docker engine on these machines)


def test_compose_stack_is_consistent():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"quipu", "vllm", "llamacpp", "prometheus", "grafana"} <= set(services)
    assert services["vllm"]["profiles"] == ["gpu"] and services["llamacpp"]["profiles"] == ["cpu"]
    for name, svc in services.items():
        for dep in (svc.get("depends_on") or {}):
            assert dep in services, f"{name} depends on unknown service {dep}"
        assert "healthcheck" in svc, f"{name} has no healthcheck"
        for vol in svc.get("volumes", []):
            src = vol.split(":")[0]
            if src.startswith("./"):
                assert (ROOT / src).exists(), f"{name} mounts missing path {src}"
    # Quipu's compose config agrees with the ports and the scrape target.
    import tomllib
    conf = tomllib.loads((ROOT / "deploy" / "quipu.compose.toml").read_text())
    api_port = conf["server"]["listen"].rsplit(":", 1)[1]
    metrics_port = conf["server"]["metrics_listen"].rsplit(":", 1)[1]
    assert conf["server"]["metrics_listen"].startswith("0.0.0.0:"), "Prometheus scrapes from another container"
    assert any(p.endswith(f":{api_port}") for p in services["quipu"]["ports"])
    prom = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    targets = [t for job in prom["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]]
    assert f"quipu:{metrics_port}" in targets
    for m in conf["models"]:
        for u in m["upstreams"]:
            assert u.startswith("http://upstream:8000"), u
    assert "upstream:8000" in targets
    for svc in ("vllm", "llamacpp"):
        assert "upstream" in services[svc]["networks"]["default"]["aliases"]
    ds = yaml.safe_load((ROOT / "dashboards" / "provisioning" / "datasources" / "prometheus.yml").read_text())
    assert ds["datasources"][0]["url"] == "http://prometheus:9090"
    assert "9090:9090" in services["prometheus"]["ports"]
    prov = yaml.safe_load((ROOT / "dashboards" / "provisioning" / "dashboards" / "quipu.yml").read_text())
    mounts = services["grafana"]["volumes"]
    assert any(v.endswith(":" + prov["providers"][0]["options"]["path"] + ":ro") for v in mounts)
    # The image builds the binary the config needs and the config it ships parses.
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "cargo build --release --locked -p quipu" in dockerfile and "FROM debian:bookworm-slim" in dockerfile
    r = subprocess.run(
        [str(ROOT / "target" / "release" / "quipu"), "--config", str(ROOT / "deploy" / "quipu.compose.toml"), "serve", "--check"],
        capture_output=True, text=True, env={"QUIPU_ADMIN_TOKEN": "0123456789abcdef0123", "PATH": "/usr/bin:/bin"},
    )
    # `upstream` only resolves inside the compose network: the only acceptable failure here.
    assert r.returncode == 0 or "cannot resolve \"upstream:8000\"" in r.stderr, r.stderr
