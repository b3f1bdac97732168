"""Helpers for proving the dashboards against a real Prometheus scraping a real gateway.

Used by `tests/python/test_observability.py` and by `live.py` (which keeps the same stack
running for a person to look at). Nothing here is mocked: `Prometheus` runs Debian's
`prometheus` binary, and `drive_traffic` sends real requests to a real `quipu` in front of real
`quipu-sim` replicas.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import math
import pathlib
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request

from harness import Gateway, Process, Sim, free_port, http_json, wait_until

ROOT = pathlib.Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "dashboards"
INSTALL_HINT = (
    "install Debian's `prometheus` package (`sudo apt-get install prometheus`, which provides "
    "`prometheus` and `promtool`; scripts/deps.sh does it)"
)

# ---------------------------------------------------------------------------------------------
# Prometheus


def prometheus_binaries() -> tuple[str, str]:
    """Paths of `prometheus` and `promtool`; raises with the install hint if either is missing."""
    found = {name: shutil.which(name) for name in ("prometheus", "promtool")}
    missing = [n for n, p in found.items() if not p]
    if missing:
        raise RuntimeError(f"{' and '.join(missing)} not found: {INSTALL_HINT}")
    return found["prometheus"], found["promtool"]


class Prometheus:
    """A throwaway Prometheus on a free loopback port, scraping `targets` every `interval_s`."""

    def __init__(self, workdir: pathlib.Path, targets: dict[str, str], interval_s: int = 1):
        self.binary, self.promtool = prometheus_binaries()
        self.workdir = workdir / f"prometheus-{free_port()}"
        self.workdir.mkdir(parents=True)
        self.port = free_port()
        self.interval_s = interval_s
        jobs = "\n".join(
            f"  - job_name: {job}\n    metrics_path: /metrics\n    static_configs:\n      - targets: ['{target}']"
            for job, target in targets.items()
        )
        self.config = self.workdir / "prometheus.yml"
        self.config.write_text(
            f"global:\n  scrape_interval: {interval_s}s\n  scrape_timeout: {interval_s}s\n"
            f"  evaluation_interval: {interval_s}s\nscrape_configs:\n{jobs}\n"
        )
        self.process: Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "Prometheus":
        check = subprocess.run([self.promtool, "check", "config", str(self.config)], capture_output=True, text=True)
        if check.returncode != 0:
            raise RuntimeError(f"promtool check config failed:\n{check.stdout}{check.stderr}")
        self.process = Process(
            [
                self.binary,
                f"--config.file={self.config}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            self.workdir.parent / f"prometheus-{self.port}.log",
        )
        self.process.start()

        def ready():
            if not self.process.alive():
                raise RuntimeError(f"prometheus exited:\n{self.process.tail()}")
            with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                return r.status == 200

        wait_until(ready, 30, "prometheus ready")
        return self

    def stop(self) -> None:
        if self.process:
            self.process.stop(timeout=10)

    def api(self, path: str, **params) -> dict:
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params, doseq=True)}"
        try:
            with urllib.request.urlopen(url, timeout=30) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:  # 400/422 carry a JSON error body
            return json.loads(e.read())

    def query(self, expr: str, at: float | None = None) -> dict:
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        return self.api("query", **params)

    def wait_scrapes_after(self, job: str, t: float, n: int = 3, timeout: float = 30.0) -> None:
        """Waits until `job` has been scraped successfully `n` times after time `t`."""

        def enough():
            # up is 1 for a successful scrape, 0 for a failed one; the window starts after t.
            r = self.query(f'sum_over_time(up{{job="{job}"}}[{max(1, int(time.time() - t))}s])')
            res = r.get("data", {}).get("result", [])
            return res and float(res[0]["value"][1]) >= n

        wait_until(enough, timeout, f"{n} scrapes of {job} after {t:.0f}")


def promtool_check_metrics(promtool: str, exposition: str) -> tuple[int, str]:
    r = subprocess.run([promtool, "check", "metrics"], input=exposition, capture_output=True, text=True)
    return r.returncode, (r.stdout + r.stderr).strip()


# ---------------------------------------------------------------------------------------------
# Dashboards


def load_dashboards() -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("quipu-*.json"))}


def panels(dashboard: dict):
    """Every panel, including those nested in collapsed rows."""
    for p in dashboard.get("panels", []):
        yield p
        yield from p.get("panels", [])


def panel_targets(dashboards: dict[str, dict]) -> list[tuple[str, str, str, str]]:
    """(dashboard file, panel title, refId, expr) for every target of every panel."""
    out = []
    for name, d in dashboards.items():
        for p in panels(d):
            for t in p.get("targets", []):
                out.append((name, p.get("title", ""), t.get("refId", ""), t.get("expr", "")))
    return out


def substitute(expr: str, rate_interval: str, model: str = ".*", tenant: str = ".*") -> str:
    """Grafana's variables: `$model`/`$tenant` as All (`.*`, the dashboards' allValue) unless
    given, e.g. as Grafana formats a multi-value selection for Prometheus: `(a|b|c)`."""
    return (
        expr.replace("$__rate_interval", rate_interval)
        .replace("${model}", model)
        .replace("${tenant}", tenant)
        .replace("$model", model)
        .replace("$tenant", tenant)
    )


def multi_value(values: list[str]) -> str:
    """A multi-value selection as Grafana renders it in a Prometheus query."""
    return "(" + "|".join(re.escape(v) for v in sorted(values)) + ")"


_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGES = re.compile(r"\[[^\]]*\]")
_IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
PROMQL_WORDS = {
    "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile",
    "count_values", "group", "rate", "irate", "increase", "delta", "idelta", "deriv",
    "histogram_quantile", "timestamp", "time", "vector", "scalar", "abs", "clamp_min",
    "clamp_max", "label_replace", "label_join", "count_over_time", "avg_over_time",
    "max_over_time", "min_over_time", "sum_over_time", "last_over_time", "absent",
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
    "bool", "offset", "inf", "nan", "le",
}


def metric_names(expr: str) -> set[str]:
    """Metric names an expression selects (label names and functions removed)."""
    s = _STRINGS.sub('""', expr)
    s = _GROUPING.sub(" ", s)
    s = _MATCHERS.sub(" ", s)
    s = _RANGES.sub(" ", s)
    names = set()
    for m in _IDENT.finditer(s):
        word = m.group(0)
        if word.lower() in PROMQL_WORDS or word.startswith("$"):
            continue
        # A function call is followed by "(".
        rest = s[m.end():].lstrip()
        if rest.startswith("("):
            continue
        names.add(word)
    return names


def family_of(name: str) -> str:
    return re.sub(r"_(bucket|sum|count)$", "", name)


def exposition_families(text: str) -> dict[str, str]:
    """Family name -> type, from the `# TYPE` lines of an exposition."""
    out = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(maxsplit=3)
            out[name] = kind
    return out


def defined_families(metrics_rs: pathlib.Path) -> set[str]:
    """Metric names declared in src/metrics/mod.rs: the first argument of each constructor."""
    ctor = r"\b(?:hist|counter|float_counter|gauge_vec|Opts::new|HistogramOpts::new|IntGauge::new|IntCounter::new|Gauge::new)\(\s*"
    return set(re.findall(ctor + r'"([a-zA-Z_:][a-zA-Z0-9_:]*)"', metrics_rs.read_text()))


def finite_values(result: dict) -> list[float]:
    data = result.get("data", {})
    values = []
    for s in data.get("result", []) if isinstance(data.get("result"), list) else []:
        v = float(s["value"][1])
        if math.isfinite(v):
            values.append(v)
    return values


# ---------------------------------------------------------------------------------------------
# Traffic


class Stack:
    """Two simulator replicas and a gateway in front of them, configured so that every metric
    family can be made to move: prefix affinity on two replicas (colibri), short timeouts, and
    an expensive `apu` so that a S/ 10.00 tenant gets a 402."""

    def __init__(self, workdir: pathlib.Path):
        self.workdir = workdir
        self.sims = [Sim(workdir, name=f"sim-obs-{i}") for i in range(2)]
        self.gw: Gateway | None = None
        self.keys: dict[str, str] = {}

    def start(self) -> "Stack":
        for s in self.sims:
            s.start()
        a, b = (s.api_base for s in self.sims)
        gw = Gateway(
            self.workdir,
            {"colibri": [a, b], "aguila": [a], "apu": [b]},
            name="quipu-obs",
            model_extra="timeouts = { connect_ms = 500, first_byte_ms = 1000, idle_ms = 1000, request_ms = 1500 }",
        )
        # apu at S/ 2,000 per million output tokens: max_tokens=8192 (the clamp) reserves S/ 16.38 > S/ 10.
        gw.config_text = gw.config_text.replace('output = "12.00"', 'output = "2000.00"')
        # aguila is scheduled: two slots, a queue of one per tenant (the queue's metrics).
        gw.config_text = gw.config_text.replace(
            'upstream_model = "upstream-aguila"', 'upstream_model = "upstream-aguila"\nmax_concurrency = 2')
        gw.config_text += "\n[scheduling]\ntenant_queue_cap = 1\nload_interval_ms = 200\n"
        gw.config_path.write_text(gw.config_text)
        self.gw = gw.start()
        self.keys["acme"] = gw.new_tenant("acme")[1]
        self.keys["andes"] = gw.new_tenant("andes")[1]
        self.keys["thin"] = gw.new_tenant("thin", top_up="10.00")[1]
        self.keys["limited"] = gw.new_tenant("limited", rpm=1)[1]
        # A key whose daily cap is smaller than an apu request's worst case: refused by its cap.
        self.keys["capped"] = gw.new_tenant("capped", budget="0.01", **{"budget-period": "day"})[1]
        return self

    def stop(self) -> None:
        if self.gw:
            self.gw.stop()
        for s in self.sims:
            s.stop()


def _chat(gw: Gateway, key: str, content, model="colibri", stream=False, **kw):
    messages = content if isinstance(content, list) else [{"role": "user", "content": content}]
    return http_json(
        "POST", gw.base + "/v1/chat/completions",
        {"model": model, "messages": messages, "stream": stream, **kw},
        {"Authorization": f"Bearer {key}"}, timeout=30,
    )


def _messages(gw: Gateway, key: str, content, model="colibri", stream=False, max_tokens=64, path="/v1/messages"):
    body = {"model": model, "max_tokens": max_tokens, "messages": [{"role": "user", "content": content}]}
    if stream:
        body["stream"] = True
    return http_json(
        "POST", gw.base + path, body,
        {"x-api-key": key, "anthropic-version": "2023-06-01"}, timeout=30,
    )


def _disconnect_mid_stream(gw: Gateway, key: str) -> None:
    """Opens a slow stream, reads a few chunks, and hangs up."""
    payload = json.dumps({
        "model": "colibri", "stream": True,
        "messages": [{"role": "user", "content": "[[sim: tokens=60 delay_ms=40]]"}],
    }).encode()
    conn = socket.create_connection(("127.0.0.1", gw.port), timeout=10)
    conn.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {key}\r\nContent-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    got = b""
    while got.count(b"data: ") < 4:
        chunk = conn.recv(4096)
        if not chunk:
            break
        got += chunk
    conn.close()


def _system_prompt(k: int) -> str:
    """About 3 KB: several prefix-affinity blocks (1 KiB each)."""
    return f"Eres el asistente de la conversación {k}. " + " ".join(f"regla{k}_{i}" for i in range(300))


def drive_traffic(stack: Stack, nonce: str = "") -> dict[str, int]:
    """One pass of every kind of request; returns {what: HTTP status}. A different `nonce` per
    pass gives the conversations new prefixes, so each pass has affinity misses as well as hits."""
    gw = stack.gw
    acme, andes, thin, limited = (stack.keys[k] for k in ("acme", "andes", "thin", "limited"))
    seen: dict[str, int] = {}

    def note(what, result):
        seen[what] = result[0] if isinstance(result, tuple) else result

    # Catalog, not-found and wrong-method routes.
    for path in ("/v1/models", "/v1/models/colibri", "/v1/pricing", "/v1/plans", "/health", "/v1/nothing-here"):
        note(f"GET {path}", http_json("GET", gw.base + path))
    note("DELETE /v1/models", http_json("DELETE", gw.base + "/v1/models"))

    # Successes in both formats, streamed and not, on every model, for two tenants.
    for key in (acme, andes):
        for model in ("colibri", "aguila", "apu"):
            note(f"chat {model}", _chat(gw, key, "hola [[sim: tokens=12]]", model=model, max_tokens=64))
            note(f"chat stream {model}", _chat(gw, key, "hola [[sim: tokens=24 delay_ms=2]]", model=model, stream=True, max_tokens=64))
            note(f"messages {model}", _messages(gw, key, "hola [[sim: tokens=12]]", model=model))
            note(f"messages stream {model}", _messages(gw, key, "hola [[sim: tokens=24 delay_ms=2]]", model=model, stream=True))

    # Multi-turn conversations with long system prompts over two replicas: prefix affinity
    # (misses on the first turn, hits after) and cached input tokens.
    for k in range(4):
        history = [{"role": "system", "content": f"[{nonce}] " + _system_prompt(k)}]
        for turn in range(3):
            history.append({"role": "user", "content": f"turno {turn} [[sim: tokens=8]]"})
            status, body, _ = _chat(gw, acme, history, max_tokens=32)
            note(f"conversation {k}", status)
            reply = body["choices"][0]["message"]["content"] if status == 200 else "…"
            history.append({"role": "assistant", "content": reply})

    # count_tokens.
    note("count_tokens", _messages(gw, acme, "cuenta mis tokens", path="/v1/messages/count_tokens"))

    # Client errors: 400 (bad body, context length), 401, 404 (model), 402, 429.
    note("400 invalid body", http_json("POST", gw.base + "/v1/chat/completions", {"model": "colibri"},
                                       {"Authorization": f"Bearer {acme}"}))
    note("400 context length", _chat(gw, acme, "[[sim: overflow]]"))
    note("401 bad key", _chat(gw, "sk-quipu-not-a-key", "hola"))
    note("401 messages no key", http_json("POST", gw.base + "/v1/messages", {"model": "colibri"},
                                          {"anthropic-version": "2023-06-01"}))
    note("404 model", _chat(gw, acme, "hola", model="no-such-model"))
    note("402 thin", _chat(gw, thin, "hola [[sim: tokens=5]]", model="apu", max_tokens=8192))
    note("429 first", _chat(gw, limited, "hola [[sim: tokens=2]]"))
    note("429 second", _chat(gw, limited, "hola [[sim: tokens=2]]"))
    note("429 cap", _chat(gw, stack.keys["capped"], "hola [[sim: tokens=2]]", model="apu", max_tokens=64))

    # Upstream faults: 5xx, 503 on both replicas (a retry, then overloaded), broken streams,
    # a timeout, a client that hangs up mid-stream.
    note("upstream 500", _chat(gw, acme, "[[sim: status=500]]"))
    note("upstream 503", _chat(gw, acme, "[[sim: status=503]]"))
    note("stream fail_after", _chat(gw, acme, "[[sim: tokens=10 fail_after=2]]", stream=True))
    note("stream reset_after", _messages(gw, acme, "[[sim: tokens=10 reset_after=2]]", stream=True))
    note("timeout", _chat(gw, acme, "[[sim: ttfb_ms=2500]]", stream=True))
    _disconnect_mid_stream(gw, acme)
    note("client disconnect", 0)

    # aguila saturated by one tenant: two run, one waits in the queue, one is refused (429).
    with cf.ThreadPoolExecutor(4) as pool:
        queued = list(pool.map(
            lambda i: _chat(gw, andes, f"cola {i} [[sim: tokens=20 delay_ms=40]]", model="aguila", stream=True),
            range(4)))
    note("queue", sorted(r[0] for r in queued)[-1])

    # A few concurrent streams, so in-flight gauges and open streams are above zero while scraped.
    with cf.ThreadPoolExecutor(6) as pool:
        list(pool.map(lambda i: _chat(gw, andes, f"{i} [[sim: tokens=20 delay_ms=60]]", stream=True), range(6)))
    note("concurrent streams", 200)
    # Successes last, so no replica stays ejected after the faults.
    for model in ("colibri", "aguila", "apu"):
        note(f"final {model}", _chat(gw, acme, "adiós [[sim: tokens=4]]", model=model))
    return seen
