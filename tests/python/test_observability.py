"""The dashboards, proven against a real Prometheus scraping the real gateway; and the
provisioning, compose stack and Dockerfile, checked without a Docker engine.

The live part starts two simulator replicas and a gateway, a throwaway Prometheus (Debian's
`prometheus` package) scraping the gateway every second, drives every kind of traffic twice
(so every series both exists and moves inside the rate window), then evaluates every target of
every panel through `GET /api/v1/query` with Grafana's variables substituted. A query that
errors, returns nothing, or returns only NaN fails the test, all of them listed at once.

If `prometheus` or `promtool` is missing the tests fail (never skip): install Debian's
`prometheus` package (scripts/deps.sh does).
"""

from __future__ import annotations

import json
import math
import pathlib
import re
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "observability"))
sys.path.insert(0, str(ROOT / "dashboards"))

import generate  # noqa: E402
import obs  # noqa: E402
from harness import QUIPU  # noqa: E402

SCRAPE_INTERVAL_S = 1
# Panel targets allowed to return no data, with the reason. Keep it empty unless a series
# cannot be produced by a test (and say why).
EXEMPT: dict[str, str] = {}
EXPECTED_UIDS = {"quipu-operations.json": "quipu-operations", "quipu-billing.json": "quipu-billing"}
DS_REF = {"type": "prometheus", "uid": "${datasource}"}


@dataclass
class Live:
    stack: obs.Stack
    prom: obs.Prometheus
    rate_interval: str
    at: float
    exposition: str
    statuses: list[dict[str, int]]


def _require_prometheus() -> tuple[str, str]:
    try:
        return obs.prometheus_binaries()
    except RuntimeError as e:
        pytest.fail(str(e))


@pytest.fixture(scope="module")
def live(workdir):
    _require_prometheus()
    stack = obs.Stack(workdir).start()
    prom = None
    try:
        metrics_target = stack.gw.metrics_url.removeprefix("http://").removesuffix("/metrics")
        prom = obs.Prometheus(workdir, {"quipu": metrics_target}, SCRAPE_INTERVAL_S).start()
        t0 = time.time()
        prom.wait_scrapes_after("quipu", t0, n=2)
        # Pass 1 creates every series; pass 2 moves them after Prometheus has seen them once
        # (a series' first sample is its baseline, so increments before it never show in rate()).
        first = obs.drive_traffic(stack, nonce="pass-1")
        prom.wait_scrapes_after("quipu", time.time(), n=2)
        second = obs.drive_traffic(stack, nonce="pass-2")
        done = time.time()
        prom.wait_scrapes_after("quipu", done, n=3)
        at = time.time()
        # The window covers both passes and the baseline scrapes before them (>= 4 scrapes).
        window = max(30, math.ceil(at - t0) + 5)
        yield Live(stack, prom, f"{window}s", at, stack.gw.metrics(), [first, second])
    finally:
        if prom:
            prom.stop()
        stack.stop()


# ---------------------------------------------------------------------------------------------
# Prerequisites


def test_prometheus_and_promtool_are_installed():
    prometheus, promtool = _require_prometheus()
    out = subprocess.run([prometheus, "--version"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    out = subprocess.run([promtool, "--version"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


# ---------------------------------------------------------------------------------------------
# Live: a real Prometheus scraping the real gateway


def test_traffic_reached_every_outcome(live):
    for statuses in live.statuses:
        got = set(statuses.values())
        for status in (200, 400, 401, 402, 404, 405, 429, 502, 503, 504):
            assert status in got, f"no {status} in this pass: {statuses}"


def _variable_values(live: Live) -> dict[str, list[str]]:
    """Each query variable's values, fetched as Grafana does for `label_values(selector, label)`."""
    out = {}
    for d in obs.load_dashboards().values():
        for v in d["templating"]["list"]:
            if v["type"] == "query":
                selector, label = _label_values(v["query"]["query"])
                r = live.prom.api(f"label/{label}/values", **{"match[]": selector})
                assert r["status"] == "success" and r["data"], f"${v['name']} has no values: {r}"
                assert out.setdefault(v["name"], r["data"]) == r["data"], f"${v['name']} differs between dashboards"
    return out


def _label_values(query: str) -> tuple[str, str]:
    m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query)
    assert m, f"not a label_values() query: {query!r}"
    return m.group(1), m.group(2)


def test_every_panel_query_returns_data(live):
    """Each target twice: with the variables at All (`.*`), and with every value selected
    (`(a|b|…)`, as Grafana sends a multi-value selection). The second catches a misspelt label
    name, which `=~".*"` would match on every series."""
    values = _variable_values(live)
    selections = {
        "All": {"model": ".*", "tenant": ".*"},
        "each value": {k: obs.multi_value(v) for k, v in values.items()},
    }
    problems = []
    checked = 0
    for dash, title, ref, expr in obs.panel_targets(obs.load_dashboards()):
        for sel_name, sel in selections.items():
            q = obs.substitute(expr, live.rate_interval, **sel)
            assert "$" not in q, f"unsubstituted variable in {dash} / {title} / {ref}: {q}"
            checked += 1
            where = f"{dash} / {title} / {ref} [{sel_name}]: {q}"
            r = live.prom.query(q, at=live.at)
            if r.get("status") != "success":
                problems.append(f"ERROR   {where}\n        {r.get('errorType')}: {r.get('error')}")
                continue
            if any(k in expr for k in EXEMPT):
                continue
            result = r["data"]["result"]
            if not result:
                problems.append(f"NO DATA {where}")
            elif not obs.finite_values(r):
                problems.append(f"NaN     {where}\n        {result[:3]}")
            # The range query Grafana actually sends must work as well.
            rr = live.prom.api("query_range", query=q, start=f"{live.at - 60:.3f}", end=f"{live.at:.3f}", step="5")
            if rr.get("status") != "success":
                problems.append(f"RANGE   {where}\n        {rr.get('error')}")
    assert checked > 120, f"only {checked} evaluations"
    assert not problems, (
        f"{len(problems)} of {checked} panel query evaluations failed (rate interval {live.rate_interval}):\n"
        + "\n".join(problems)
    )


def test_gauges_moved_under_traffic(live):
    """The unlabelled gauges exist (at 0) from start-up, so "returns data" proves nothing about
    them: each must have been above zero in some scrape while the concurrent streams ran."""
    for expr in (
        "sum(quipu_streams_open)",
        'sum(quipu_requests_in_flight{route=~"chat|messages"})',
        "quipu_reservations_open",
        "sum(quipu_upstream_in_flight)",
    ):
        q = f"max_over_time(({expr})[{live.rate_interval}:1s])"
        r = live.prom.query(q, at=live.at)
        assert r.get("status") == "success", r
        values = [float(s["value"][1]) for s in r["data"]["result"]]
        assert values and max(values) > 0, f"{expr} never rose above 0 under traffic: {r}"


def _series(live: Live, dash: str, title: str, ref: str = "A") -> list[dict]:
    for d, t, r, expr in obs.panel_targets(obs.load_dashboards()):
        if (d, t, r) == (dash, title, ref):
            res = live.prom.query(obs.substitute(expr, live.rate_interval), at=live.at)
            assert res["status"] == "success", res
            return res["data"]["result"]
    raise AssertionError(f"no panel {dash} / {title} / {ref}")


def _labels(series: list[dict], label: str) -> set[str]:
    return {s["metric"].get(label, "") for s in series if math.isfinite(float(s["value"][1])) and float(s["value"][1]) > 0}


def test_panels_show_every_kind_of_traffic(live):
    """Beyond "some data": the labels the traffic produced appear in the panels meant for them."""
    ops, bill = "quipu-operations.json", "quipu-billing.json"
    routes = _labels(_series(live, ops, "Requests by route"), "route")
    assert routes >= {"chat", "messages", "count_tokens", "models", "model", "pricing", "plans", "health",
                      "not_found", "method_not_allowed"}, routes
    errors = _labels(_series(live, ops, "Errors by type"), "error_type")
    assert errors >= {"authentication", "invalid_request", "context_length", "model_not_found", "route_not_found",
                      "method_not_allowed", "insufficient_balance", "rate_limited", "overloaded",
                      "upstream_timeout", "upstream_error"}, errors
    assert _labels(_series(live, ops, "Requests by HTTP status"), "status") >= {
        "200", "400", "401", "402", "404", "405", "429", "502", "503", "504"}
    assert _labels(_series(live, ops, "Replica selections by reason"), "reason") >= {"affinity", "least_loaded"}
    assert _labels(_series(live, ops, "Prefix-affinity outcomes"), "outcome") >= {"hit", "miss"}
    assert "status_503" in _labels(_series(live, ops, "Upstream failures by kind"), "kind")
    assert "colibri" in _labels(_series(live, ops, "Retries on another replica"), "model")
    assert "chat" in _labels(_series(live, ops, "Client disconnects"), "route")
    assert _labels(_series(live, ops, "Tokens per second by type"), "type") == {"input", "cached_input", "output"}
    share = _series(live, ops, "Cached-token share")
    assert share and 0 < float(share[0]["value"][1]) < 1, share
    assert {"version", "store"} <= set(_series(live, ops, "Build")[0]["metric"])
    rl = _series(live, bill, "Rate-limited requests")
    assert any(s["metric"] == {"tenant": "limited", "scope": "key", "limit": "requests"} for s in rl), rl
    assert _labels(_series(live, bill, "Insufficient balance (402)"), "tenant") == {"thin"}
    assert _labels(_series(live, bill, "Spend by tenant"), "tenant") >= {"acme", "andes"}
    assert _labels(_series(live, bill, "Spend by model"), "model") == {"colibri", "aguila", "apu"}
    top = _series(live, bill, "Top tenants by spend")
    assert top and len(top) <= 10
    assert "new" in _labels(_series(live, bill, "Ledger rows written"), "result")


def test_template_variables_have_values(live):
    values = _variable_values(live)
    assert {"colibri", "aguila", "apu"} <= set(values["model"]), values
    # thin was only ever refused (402): it has no token series, yet must be selectable.
    assert {"acme", "andes", "limited", "thin"} <= set(values["tenant"]), values


def test_promtool_check_metrics_is_clean(live):
    _, promtool = _require_prometheus()
    code, out = obs.promtool_check_metrics(promtool, live.exposition)
    assert code == 0 and not out, f"promtool check metrics:\n{out}"


def test_every_defined_family_is_exported_after_the_traffic(live):
    defined = obs.defined_families(ROOT / "src" / "metrics" / "mod.rs")
    exported = set(obs.exposition_families(live.exposition))
    assert len(defined) >= 20, defined
    assert not defined - exported, f"defined in src/metrics/mod.rs but not in the scrape: {sorted(defined - exported)}"
    assert not exported - defined, f"in the scrape but not found in src/metrics/mod.rs: {sorted(exported - defined)}"


def test_every_dashboard_metric_exists_in_the_scrape(live):
    exported = obs.exposition_families(live.exposition)
    missing = []
    for dash, title, ref, expr in obs.panel_targets(obs.load_dashboards()):
        for name in obs.metric_names(expr):
            fam = obs.family_of(name)
            if fam not in exported or (fam != name and exported[fam] != "histogram"):
                missing.append(f"{dash} / {title} / {ref}: {name}")
            if name.endswith("_total") and exported.get(name) != "counter":
                missing.append(f"{dash} / {title} / {ref}: {name} is not a counter")
    assert not missing, "metrics the dashboards use but the gateway does not export:\n" + "\n".join(missing)


def _uncharted() -> dict[str, str]:
    out = {}
    for line in (ROOT / "dashboards" / "uncharted.txt").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, reason = line.partition(" ")
        assert reason.strip(), f"dashboards/uncharted.txt: {name} needs a reason"
        out[name] = reason.strip()
    return out


def test_every_family_is_charted_or_listed_as_uncharted(live):
    exported = set(obs.exposition_families(live.exposition)) | obs.defined_families(ROOT / "src" / "metrics" / "mod.rs")
    charted = {obs.family_of(n) for _, _, _, e in obs.panel_targets(obs.load_dashboards()) for n in obs.metric_names(e)}
    uncharted = _uncharted()
    neither = sorted(exported - charted - set(uncharted))
    assert not neither, f"exported but neither charted nor in dashboards/uncharted.txt: {neither}"
    both = sorted(set(uncharted) & charted)
    assert not both, f"charted, so remove from dashboards/uncharted.txt: {both}"
    gone = sorted(set(uncharted) - exported)
    assert not gone, f"dashboards/uncharted.txt lists families that no longer exist: {gone}"


# ---------------------------------------------------------------------------------------------
# Static: the dashboard JSON


@pytest.mark.smoke
def test_committed_dashboards_equal_the_generator_output():
    rendered = generate.render()
    assert set(rendered) == set(EXPECTED_UIDS)
    for name, text in rendered.items():
        committed = (ROOT / "dashboards" / name).read_text()
        assert committed == text, f"dashboards/{name} is stale: run `python3 dashboards/generate.py`"
    r = subprocess.run([sys.executable, str(ROOT / "dashboards" / "generate.py"), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_dashboard_conventions():
    problems = []
    uids = set()
    for name, d in obs.load_dashboards().items():
        p = lambda msg: problems.append(f"{name}: {msg}")  # noqa: E731
        if d.get("id", "missing") is not None:
            p('"id" must be null')
        if d.get("uid") != EXPECTED_UIDS.get(name):
            p(f"uid {d.get('uid')!r}, expected {EXPECTED_UIDS.get(name)!r}")
        uids.add(d.get("uid"))
        if not isinstance(d.get("schemaVersion"), int) or d["schemaVersion"] < 39:
            p("schemaVersion must be >= 39")
        if "__inputs" in d:
            p("__inputs (export-for-sharing placeholders) cannot be resolved by provisioning")
        variables = {v["name"]: v for v in d["templating"]["list"]}
        ds = variables.get("datasource", {})
        if ds.get("type") != "datasource" or ds.get("query") != "prometheus":
            p("needs a `datasource` variable of type datasource, query prometheus")
        for var, query in (("model", "label_values(quipu_requests_total, model)"),
                           ("tenant", generate.TENANT_VALUES)):
            v = variables.get(var, {})
            if v.get("type") != "query" or v.get("query", {}).get("query") != query:
                p(f"variable {var} must be a query variable on {query}")
            if not (v.get("multi") and v.get("includeAll") and v.get("allValue") == ".*"):
                p(f"variable {var} must be multi-value with All = .*")
            if v.get("datasource") != DS_REF:
                p(f"variable {var} must use the datasource variable")
        exprs = [e for _, _, _, e in obs.panel_targets({name: d})]
        for var in ("model", "tenant"):
            if not any(f'=~"${var}"' in e for e in exprs):
                p(f"no query uses ${var}")
        ids = set()
        for panel in obs.panels(d):
            t = panel.get("title", "?")
            if panel.get("id") in ids:
                p(f"duplicate panel id {panel.get('id')}")
            ids.add(panel.get("id"))
            g = panel.get("gridPos", {})
            if not (0 <= g.get("x", -1) and g.get("x", 0) + g.get("w", 99) <= 24 and g.get("h", 0) > 0):
                p(f"{t}: bad gridPos {g}")
            if panel.get("type") == "row":
                continue
            if panel.get("datasource") != DS_REF:
                p(f"{t}: panel datasource must be {DS_REF}")
            if not panel.get("description", "").strip():
                p(f"{t}: no description")
            if not panel.get("fieldConfig", {}).get("defaults", {}).get("unit"):
                p(f"{t}: no unit")
            if not panel.get("targets"):
                p(f"{t}: no targets")
            for tgt in panel.get("targets", []):
                if tgt.get("datasource") != DS_REF:
                    p(f"{t}/{tgt.get('refId')}: target datasource must be {DS_REF}")
                expr = tgt.get("expr", "")
                for fn, rng in re.findall(r"\b(rate|irate|increase|[a-z_]+_over_time)\s*\([^\[\]]*\[([^\]]*)\]", expr):
                    if rng != "$__rate_interval":
                        p(f"{t}/{tgt.get('refId')}: {fn}(…[{rng}]) must use [$__rate_interval]")
                for name_ in obs.metric_names(expr):
                    if name_.endswith("_total") and not re.search(rf"\b(rate|irate|increase)\(\s*{name_}\b", expr):
                        p(f"{t}/{tgt.get('refId')}: counter {name_} outside rate()/increase()")
    assert len(uids) == len(EXPECTED_UIDS)
    assert not problems, "\n".join(problems)


def test_metric_name_extraction():
    """The static checks above rely on this parser: label names are not metric names."""
    expr = ('histogram_quantile(0.95, sum by (le, gen_ai_request_model, stream) '
            '(rate(gen_ai_server_request_duration_seconds_bucket{gen_ai_request_model=~"$model"}[$__rate_interval])))'
            ' / sum(quipu_streams_open) * on (model) group_left (replica) quipu_upstream_healthy')
    assert obs.metric_names(expr) == {
        "gen_ai_server_request_duration_seconds_bucket", "quipu_streams_open", "quipu_upstream_healthy"}


# ---------------------------------------------------------------------------------------------
# Static: provisioning, compose, Prometheus and Dockerfile


def _compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _quipu_config() -> dict:
    return tomllib.loads((ROOT / "deploy" / "quipu.compose.toml").read_text())


def _port(addr: str) -> int:
    return int(addr.rsplit(":", 1)[1])


def _published(service: dict) -> dict[int, str]:
    """Container port -> the host side of each published port (`[ip:]host:container`)."""
    out = {}
    for spec in service.get("ports", []):
        parts = str(spec).split(":")
        out[int(parts[-1].split("/")[0])] = ":".join(parts[:-1])
    return out


def _mounts(service: dict) -> list[tuple[str, str]]:
    out = []
    for v in service.get("volumes", []):
        if isinstance(v, dict):
            out.append((v.get("source", ""), v.get("target", "")))
        else:
            parts = v.split(":")
            out.append((parts[0], parts[1]))
    return out


def test_compose_file_structure():
    c = _compose()
    services = c["services"]
    assert {"quipu", "vllm", "llamacpp", "prometheus", "grafana"} <= set(services)
    assert services["vllm"].get("profiles") == ["gpu"] and services["llamacpp"].get("profiles") == ["cpu"]
    profiles = {p for s in services.values() for p in s.get("profiles", [])}
    assert profiles == {"gpu", "cpu"}
    for name, s in services.items():
        assert "healthcheck" in s and s["healthcheck"].get("test"), f"{name} has no healthcheck"
        deps = s.get("depends_on", {})
        assert isinstance(deps, dict), f"{name}: depends_on must name a condition"
        for dep, spec in deps.items():
            assert dep in services, f"{name} depends on unknown service {dep}"
            assert spec.get("condition") == "service_healthy", f"{name} -> {dep} must wait for service_healthy"
        for source, target in _mounts(s):
            if source.startswith((".", "/")):
                assert source.startswith("./"), f"{name}: host path {source} must be relative to the repository"
                assert (ROOT / source).exists(), f"{name}: mounted host path {source} does not exist"
                assert target and target.startswith("/"), f"{name}: bad mount target for {source}"
            else:
                assert source in (c.get("volumes") or {}), f"{name}: named volume {source} is not declared"
    # Quipu depends on whichever upstream the profile starts, and is built from the Dockerfile.
    q = services["quipu"]
    assert set(q["depends_on"]) == {"vllm", "llamacpp"}
    assert all(spec.get("required") is False for spec in q["depends_on"].values())
    assert (ROOT / q["build"]["context"] / q["build"]["dockerfile"]).exists()
    assert ("quipu-data", "/var/lib/quipu") in _mounts(q)
    assert services["prometheus"]["depends_on"] == {"quipu": {"condition": "service_healthy"}}
    assert "prometheus" in services["grafana"]["depends_on"]


def test_compose_upstreams_have_the_required_flags():
    services = _compose()["services"]
    vllm = " ".join(services["vllm"]["command"])
    for flag in ("--enable-prompt-tokens-details", "--enable-force-include-usage", "--enable-prefix-caching",
                 "--served-model-name=", "--tool-call-parser=", "--reasoning-parser=", "--enable-auto-tool-choice"):
        assert flag in vllm, f"vllm is missing {flag}"
    gpu = services["vllm"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["driver"] == "nvidia" and "gpu" in gpu["capabilities"]
    assert services["vllm"]["image"].startswith("vllm/vllm-openai:")
    llama = " ".join(services["llamacpp"]["command"])
    for flag in ("--jinja", "--metrics", "--parallel=", "--alias="):
        assert flag in llama, f"llamacpp is missing {flag}"
    assert services["llamacpp"]["image"] == "ghcr.io/ggml-org/llama.cpp:server"
    assert any(t == "/models" for _, t in _mounts(services["llamacpp"])), "llamacpp needs a GGUF model volume"
    # Both answer as `upstream:8000`, the host Quipu's config points at, and serve its upstream_model.
    model = _quipu_config()["models"][0]
    for name in ("vllm", "llamacpp"):
        s = services[name]
        assert "upstream" in s["networks"]["default"]["aliases"], name
        assert "--port=8000" in s["command"], name
    assert "--served-model-name=" + model["upstream_model"] in services["vllm"]["command"]
    assert "--alias=" + model["upstream_model"] in services["llamacpp"]["command"]
    assert all(u.startswith("http://upstream:8000/") for m in _quipu_config()["models"] for u in m["upstreams"])


def test_compose_ports_and_scrape_targets_agree_with_the_quipu_config():
    cfg = _quipu_config()["server"]
    listen, metrics = _port(cfg["listen"]), _port(cfg["metrics_listen"])
    assert cfg["metrics_listen"].startswith("0.0.0.0:"), "metrics must listen beyond loopback to be scraped"
    assert cfg["listen"].startswith("0.0.0.0:")
    services = _compose()["services"]
    q = services["quipu"]
    published = _published(q)
    assert listen in published and metrics in published, f"quipu publishes {published}, config listens on {listen}, {metrics}"
    assert f":{listen}/health" in " ".join(q["healthcheck"]["test"])
    assert ("./deploy/quipu.compose.toml", "/etc/quipu/quipu.toml") in _mounts(q)
    assert q["environment"]["QUIPU_CONFIG"] == "/etc/quipu/quipu.toml"

    prom_cfg = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in prom_cfg["scrape_configs"]}
    assert jobs["quipu"]["static_configs"][0]["targets"] == [f"quipu:{metrics}"]
    assert jobs["quipu"].get("metrics_path", "/metrics") == "/metrics"
    assert jobs["upstream"]["static_configs"][0]["targets"] == ["upstream:8000"]
    mounts = dict((t, s) for s, t in _mounts(services["prometheus"]))
    assert mounts["/etc/prometheus/prometheus.yml"] == "./deploy/prometheus.yml"
    _, promtool = _require_prometheus()
    r = subprocess.run([promtool, "check", "config", str(ROOT / "deploy" / "prometheus.yml")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_grafana_provisioning_matches_the_stack():
    services = _compose()["services"]
    prov = ROOT / "dashboards" / "provisioning"
    ds = yaml.safe_load((prov / "datasources" / "prometheus.yml").read_text())["datasources"]
    assert len(ds) == 1
    ds = ds[0]
    assert ds["type"] == "prometheus" and ds["uid"] == "prometheus"
    prom_port = _port(next(a for a in services["prometheus"]["command"] if a.startswith("--web.listen-address=")))
    assert ds["url"] == f"http://prometheus:{prom_port}", "the datasource must point at the prometheus service"
    prom_cfg = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    assert ds["jsonData"]["timeInterval"] == prom_cfg["global"]["scrape_interval"], \
        "timeInterval must equal the scrape interval so $__rate_interval is right"
    providers = yaml.safe_load((prov / "dashboards" / "quipu.yml").read_text())["providers"]
    assert len(providers) == 1 and providers[0]["type"] == "file"
    mounts = {t: s for s, t in _mounts(services["grafana"])}
    assert mounts["/etc/grafana/provisioning"] == "./dashboards/provisioning"
    path = providers[0]["options"]["path"]
    assert mounts.get(path) == "./dashboards", f"the provider reads {path}, which must be the dashboards mount"
    home = services["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home.startswith(path + "/") and (ROOT / "dashboards" / home.rsplit("/", 1)[1]).exists()
    for s in services["grafana"]["volumes"]:
        if s.startswith("./"):
            assert s.endswith(":ro"), f"grafana mounts {s} writable"


def test_compose_quipu_config_is_valid():
    """`quipu serve --check` on deploy/quipu.compose.toml, with the upstream host made resolvable."""
    text = (ROOT / "deploy" / "quipu.compose.toml").read_text().replace("upstream:8000", "127.0.0.1:8000")
    path = ROOT / "tests" / ".tmp" / "quipu.compose.check.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    r = subprocess.run([str(QUIPU), "--config", str(path), "serve", "--check"], capture_output=True, text=True)
    path.unlink()
    assert r.returncode == 0, r.stdout + r.stderr


def test_dockerfile():
    text = (ROOT / "Dockerfile").read_text()
    stages = re.findall(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?", text, re.M | re.I)
    assert stages[0] == ("rust:1.95-bookworm", "builder"), stages
    assert stages[-1][0] == "debian:bookworm-slim", stages
    assert re.search(r"apt-get install[^\n]*\bcmake\b", text)
    assert "cargo build --release -p quipu --locked" in text
    runtime = text.split("FROM debian:bookworm-slim", 1)[1]
    assert re.search(r"apt-get install[^\n]*\bcurl\b", runtime)
    user = re.findall(r"^USER\s+(\S+)", runtime, re.M)
    assert user and not user[-1].startswith(("root", "0")), "the runtime must not run as root"
    assert "COPY conf/quipu.toml /etc/quipu/quipu.toml" in runtime
    assert re.search(r"^VOLUME .*/var/lib/quipu", runtime, re.M)
    assert "HEALTHCHECK" in runtime
    for src in re.findall(r"^COPY\s+(?!--from)(\S+)\s", text, re.M):
        assert src == "." or (ROOT / src).exists(), f"COPY {src}: no such path"
    ignored = [l.strip() for l in (ROOT / ".dockerignore").read_text().splitlines() if l.strip() and not l.startswith("#")]
    for needed in ("conf", "src", "crates", "tests", "Cargo.toml", "Cargo.lock"):
        assert needed not in ignored, f".dockerignore drops {needed}, which the build needs"
    assert "target" in ignored and ".git" in ignored


@pytest.mark.smoke
def test_docs_describe_every_metric():
    doc = (ROOT / "docs" / "observability.md").read_text()
    missing = sorted(f for f in obs.defined_families(ROOT / "src" / "metrics" / "mod.rs") if f"`{f}`" not in doc)
    assert not missing, f"docs/observability.md does not describe: {missing}"
    for name, d in obs.load_dashboards().items():
        for panel in obs.panels(d):
            if panel.get("type") != "row":
                assert panel["title"] in doc, f"docs/observability.md does not describe panel {name} / {panel['title']}"
