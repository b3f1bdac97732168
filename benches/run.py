#!/usr/bin/env python3
"""Quipu's side-by-side benchmark: direct, nginx, a bare Pingora forwarder, LiteLLM and Quipu in
front of the same fast upstream simulator, in one run on one machine.

    ./scripts/bench.sh            # full run, writes docs/benchmarks-<date>.md
    ./scripts/bench.sh --quick    # shorter cells, for a smoke test (docs/benchmarks-<date>-quick.md)
    python3 benches/run.py --streams-only 10000   # only the open-streams memory test
    QUIPU_BENCH_WRAP="heaptrack -o /tmp/q" python3 benches/run.py --streams-only 6000

Pinning (2-core machine): every proxy runs on CPU 0 with one worker thread/process; the load
generator and the simulator share CPU 1. So a proxy's numbers are its own, and the direct
baseline has the same client and upstream as every proxy.

Measured per cell: requests/s, latency p50/p99 (wrk, closed loop), added p50/p99 versus
direct, server CPU time per request (utime+stime of the proxy's whole process tree from /proc,
divided by the requests served), peak RSS (VmHWM). Plus: time to first byte of streams at
concurrency 1 (a raw-socket client, median of many), an open-loop fixed-rate run (oha with
latency correction, so no coordinated omission), and 10,000 concurrent open streams through
Quipu.

TLS and HTTP/2 (same run, same pinning, same interleaving and medians; benches/tls.py): a test CA
and a server certificate made at the start (ECDSA P-256) serve nginx, the bare Pingora forwarder
and Quipu over TLS, each against the simulator over plain HTTP; the direct TLS baseline is a
second simulator serving TLS itself. Cells: keep-alive HTTP/1.1 over TLS (wrk), a new connection
with a full handshake per request (ab), a new connection with a resumed session per request (wrk
with `Connection: close`), HTTP/2 over TLS and h2c with many streams per connection (h2load),
and the open-streams test over TLS.

Binaries come from $CARGO_TARGET_DIR/release (default target/release); QUIPU_BENCH_QUIPU,
QUIPU_BENCH_QUIPU_SIM and QUIPU_BENCH_BARE_FORWARDER override one binary each (say, Quipu from
target/release and the bench binaries from a target directory of their own).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import resource
import signal
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REL = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "release"
KEY = "sk-bench-0123456789"
CLK = os.sysconf("SC_CLK_TCK")
sys.path.insert(0, str(Path(__file__).resolve().parent))
import tls as tlsmod  # noqa: E402  (benches/tls.py)

# The run's test CA and server certificate ({"ca", "cert", "key"}) and a client context that
# trusts it; set in main().
CERTS: dict[str, Path] = {}
CLIENT_CTX = None
# HTTP/2 cells: connections × concurrent streams per connection (64 requests in flight, like
# the c = 64 HTTP/1.1 cells).
H2_CONNS, H2_STREAMS = 4, 16


def binary(name: str) -> str:
    """A benchmark binary: QUIPU_BENCH_<NAME> if set, else $CARGO_TARGET_DIR/release/<name>."""
    return os.environ.get("QUIPU_BENCH_" + name.upper().replace("-", "_"), str(REL / name))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 60, headers=None) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            req = urllib.request.Request(url, headers=headers or {})
            urllib.request.urlopen(req, timeout=2, context=CLIENT_CTX if url.startswith("https:") else None).read()
            return
        except urllib.error.HTTPError:
            return
        except Exception:  # noqa: BLE001
            time.sleep(0.2)
    raise TimeoutError(url)


def wait_port(port: int, timeout: float = 60) -> None:
    """For listeners that speak no HTTP/1.1 (nginx's h2c-only port before 1.25.1)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
            return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(port)


def tree(pid: int) -> list[int]:
    """pid and all its descendants."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def cpu_seconds(pid: int) -> float:
    total = 0
    for p in tree(pid):
        try:
            f = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(f[11]) + int(f[12])
        except (OSError, IndexError):
            pass
    return total / CLK


def rss_kb(pid: int, field: str = "VmHWM") -> int:
    total = 0
    for p in tree(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith(field + ":"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total


class Server:
    def __init__(self, name: str, argv: list[str], cpu: str, env=None, cwd=None):
        self.name = name
        self.log = open(WORK / f"{name}.log", "wb")
        self.proc = subprocess.Popen(["taskset", "-c", cpu, *argv], stdout=self.log, stderr=subprocess.STDOUT,
                                     env=env, cwd=cwd, start_new_session=True)

    # Seconds a profiler wrapping the server (QUIPU_BENCH_WRAP) gets to write its output after
    # SIGINT; 0 kills at once.
    grace = 0

    def stop(self) -> None:
        if self.grace:
            try:
                os.killpg(self.proc.pid, signal.SIGINT)
                self.proc.wait(timeout=self.grace)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        try:
            os.killpg(self.proc.pid, 9)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.log.close()


# ---------------------------------------------------------------------------------------------
# The five targets


def body(scenario: str, model: str = "colibri") -> tuple[str, dict]:
    """(path, JSON body) of a scenario; 100 chunks for streams, 20 tokens otherwise."""
    stream = scenario.endswith("stream")
    tokens = 100 if stream else 20
    text = f"Hola, cuéntame algo. [[sim: tokens={tokens}]]"
    if scenario.startswith("messages"):
        return "/v1/messages", {"model": model, "max_tokens": 512, "stream": stream,
                                "messages": [{"role": "user", "content": text}]}
    if scenario.startswith("responses"):
        # As the SDKs send it by default: stored (`store: true`), so the cell includes the write.
        return "/v1/responses", {"model": model, "stream": stream, "input": text}
    return "/v1/chat/completions", {"model": model, "stream": stream,
                                    "messages": [{"role": "user", "content": text}]}


class Target:
    name: str
    base: str
    pid: int | None = None
    speaks_messages = False
    speaks_responses = False
    # "h1" (HTTP/1.1, plain or TLS), "h2" (ALPN h2 over TLS, or h1 too), "h2c" (prior knowledge).
    proto = "h1"

    def request(self, scenario: str) -> tuple[str, str, dict]:
        """(url, body, headers) for a scenario; plain forwarders get the chat equivalent."""
        s = scenario if self.speaks_messages else scenario.replace("messages", "chat")
        s = s if self.speaks_responses else s.replace("responses", "chat")
        path, b = body(s)
        if path == "/v1/messages":
            return self.base + path, json.dumps(b), {"x-api-key": KEY, "anthropic-version": "2023-06-01", "content-type": "application/json"}
        return self.base + path, json.dumps(b), {"Authorization": f"Bearer {KEY}", "content-type": "application/json"}


class Direct(Target):
    name = "direct"

    def __init__(self, sim_port, name: str = "direct", tls: bool = False):
        self.name = name
        self.base = f"{'https' if tls else 'http'}://127.0.0.1:{sim_port}"


class Nginx(Target):
    name = "nginx"

    def __init__(self, sim_port, mode: str = "plain"):
        """mode: "plain" (HTTP/1.1), "tls" (TLS 1.2/1.3, ALPN h2 and http/1.1) or "h2c" (HTTP/2
        with prior knowledge on a plain port); each its own nginx, same static key check."""
        port = free_port()
        self.name = "nginx" if mode == "plain" else f"nginx-{mode}"
        self.proto = {"plain": "h1", "tls": "h2", "h2c": "h2c"}[mode]
        prefix = WORK / self.name
        listen = f"listen 127.0.0.1:{port} backlog=4096;"
        tls = ""
        if mode == "tls":
            listen = tlsmod.nginx_listen(f"127.0.0.1:{port}", tls=True, h2=True)
            tls = (f"ssl_certificate {CERTS['cert']};\n    ssl_certificate_key {CERTS['key']};\n"
                   "    ssl_protocols TLSv1.2 TLSv1.3;\n")
        elif mode == "h2c":
            listen = tlsmod.nginx_listen(f"127.0.0.1:{port}", tls=False, h2=True)
        (prefix / "logs").mkdir(parents=True, exist_ok=True)
        conf = prefix / "nginx.conf"
        conf.write_text(f"""
worker_processes 1;
error_log {prefix}/logs/error.log warn;
pid {prefix}/nginx.pid;
events {{ worker_connections 20000; }}
http {{
  access_log off;
  # nginx closes a connection after 1,000 requests by default (HTTP/2 too, which h2load does not
  # reopen); pingora and Quipu set no such limit.
  keepalive_requests 1000000;
  upstream sim {{ server 127.0.0.1:{sim_port}; keepalive 128; }}
  server {{
    {listen}
    {tls}client_max_body_size 32m;
    location / {{
      if ($http_authorization != "Bearer {KEY}") {{ return 401; }}
      proxy_pass http://sim;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }}
  }}
}}
""")
        self.server = Server(self.name, ["nginx", "-p", str(prefix), "-c", str(conf), "-g", "daemon off;"], "0")
        self.pid = self.server.proc.pid
        self.base = f"{'https' if mode == 'tls' else 'http'}://127.0.0.1:{port}"
        if mode == "h2c":
            wait_port(port)
        else:
            wait_http(self.base + "/health")


def bare_argv(sim_port: int, port: int, threads: int, mode: str) -> list[str]:
    argv = [binary("bare-forwarder"), "--listen", f"127.0.0.1:{port}", "--upstream", f"127.0.0.1:{sim_port}",
            "--threads", str(threads)]
    if mode == "tls":
        argv += ["--tls-cert", str(CERTS["cert"]), "--tls-key", str(CERTS["key"])]
    elif mode == "h2c":
        argv.append("--h2c")
    return argv


class Bare(Target):
    name = "pingora-bare"

    def __init__(self, sim_port, mode: str = "plain"):
        """mode: "plain" (as before: no h2c), "tls" (ALPN h2 and http/1.1) or "h2c"."""
        port = free_port()
        self.name = "pingora-bare" if mode == "plain" else f"pingora-bare-{mode}"
        self.proto = {"plain": "h1", "tls": "h2", "h2c": "h2c"}[mode]
        self.server = Server("bare" if mode == "plain" else self.name, bare_argv(sim_port, port, 1, mode), "0")
        self.pid = self.server.proc.pid
        self.base = f"{'https' if mode == 'tls' else 'http'}://127.0.0.1:{port}"
        wait_http(self.base + "/health")


class LiteLLM(Target):
    name = "litellm"
    speaks_messages = True

    def __init__(self, sim_port, venv: Path):
        port = free_port()
        cfg = WORK / "litellm.yaml"
        cfg.write_text(f"""
model_list:
  - model_name: colibri
    litellm_params:
      model: hosted_vllm/colibri
      api_base: http://127.0.0.1:{sim_port}/v1
      api_key: sk-upstream
litellm_settings:
  drop_params: true
  telemetry: false
general_settings:
  master_key: {KEY}
""")
        env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True", LITELLM_TELEMETRY="False",
                   LITELLM_LOG="ERROR", DISABLE_SCHEMA_UPDATE="True")
        self.server = Server("litellm", [str(venv / "bin" / "litellm"), "--config", str(cfg), "--port", str(port),
                                         "--host", "127.0.0.1", "--num_workers", "1"], "0", env=env)
        self.pid = self.server.proc.pid
        self.base = f"http://127.0.0.1:{port}"
        wait_http(self.base + "/health/liveliness", timeout=180)


class Quipu(Target):
    name = "quipu"
    speaks_messages = True
    speaks_responses = True

    def __init__(self, sim_port, threads: int = 1, name: str = "quipu", tls: bool = False, proto: str = "h1",
                 exe: str | None = None):
        """tls: the API listener serves TLS (ALPN h2 and http/1.1, Quipu's defaults); a plain
        listener takes h2c as shipped (`h2c = true`), so proto only says which cells use it.
        exe: another build of quipu (the same-run baseline, QUIPU_BENCH_BASELINE)."""
        port, mport = free_port(), free_port()
        self.name = name
        self.proto = "h2" if tls else proto
        cfg = WORK / f"{name}.toml"
        tls_line = f'tls = {{ cert = "{CERTS["cert"]}", key = "{CERTS["key"]}" }}\n' if tls else ""
        cfg.write_text(f"""
[server]
{tls_line}listen = "127.0.0.1:{port}"
metrics_listen = "127.0.0.1:{mport}"
threads = {threads}
pid_file = "{WORK}/{name}.pid"
upgrade_sock = "{WORK}/{name}.sock"
grace_period_seconds = 1
[store]
url = "sqlite://{WORK}/{name}.db"
[[models]]
slug = "colibri"
display_name = "Colibrí"
upstream_model = "colibri"
upstreams = ["http://127.0.0.1:{sim_port}/v1"]
prices = {{ input = "0.20", cached = "0.05", output = "0.80" }}
""")
        q = exe or binary("quipu")
        cli_env = dict(os.environ, QUIPU_LOG="warn")
        # The server runs as shipped: default log level, so the access log is on (to a file).
        env = {k: v for k, v in os.environ.items() if k not in ("QUIPU_LOG", "RUST_LOG")}
        run = lambda *a: subprocess.run([q, "--config", str(cfg), *a], check=True, capture_output=True, text=True, env=cli_env)  # noqa: E731
        run("tenant", "create", "bench")
        run("topup", "--tenant", "bench", "--amount", "1000000.00")
        secret = json.loads(run("key", "create", "--tenant", "bench", "--json").stdout)["secret"]
        self.key = secret
        # QUIPU_BENCH_WRAP="heaptrack -o /tmp/q" runs quipu under a profiler.
        wrap = os.environ.get("QUIPU_BENCH_WRAP", "").split()
        self.server = Server(name, [*wrap, q, "--config", str(cfg), "serve"], "0", env=env)
        if wrap:
            self.server.grace = 60
        self.pid = self.server.proc.pid
        self.base = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
        wait_http(self.base + "/health")
        time.sleep(1.0)  # the key snapshot

    def request(self, scenario):
        url, b, h = super().request(scenario)
        return url, b, {k: (v.replace(KEY, self.key)) for k, v in h.items()}


# ---------------------------------------------------------------------------------------------
# Measurements


def wrk(url: str, body: str, headers: dict, conns: int, seconds: float) -> dict:
    script = WORK / "wrk.lua"
    hdrs = "\n".join(f'wrk.headers["{k}"] = "{v}"' for k, v in headers.items())
    script.write_text(f'wrk.method = "POST"\nwrk.body = {json.dumps(body)}\n{hdrs}\n'
                      'done = function(summary, latency, requests)\n'
                      '  io.write(string.format("JSON {\\"requests\\": %d, \\"errors\\": %d, \\"p50\\": %d, \\"p99\\": %d}\\n",\n'
                      '    summary.requests, summary.errors.status + summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,\n'
                      '    latency:percentile(50), latency:percentile(99)))\nend\n')
    out = subprocess.run(["taskset", "-c", "1", "wrk", "-t1", f"-c{conns}", f"-d{seconds}s", "--timeout", "30s",
                          "-s", str(script), url], capture_output=True, text=True).stdout
    m = re.search(r"JSON (\{.*\})", out)
    if not m:
        raise RuntimeError(f"wrk failed: {out}")
    r = json.loads(m.group(1))
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    r["rps"] = float(rps.group(1)) if rps else r["requests"] / seconds
    return r


def ttfb_ms(url: str, body: str, headers: dict, n: int) -> float:
    """Median time from sending a request to the first byte of the response body (ms)."""
    host, port = url.split("//")[1].split("/")[0].split(":")
    path = "/" + url.split("//")[1].split("/", 1)[1]
    head = f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {len(body.encode())}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    req = head.encode() + body.encode()
    times = []
    for _ in range(n):
        s = socket.create_connection((host, int(port)))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        t = time.perf_counter()
        s.sendall(req)
        buf = b""
        while b"data:" not in buf and b'"id"' not in buf:
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
        times.append((time.perf_counter() - t) * 1000)
        s.close()
    return statistics.median(times)


def oha_open_loop(url: str, body: str, headers: dict, rate: int, seconds: int) -> dict | None:
    oha = shutil.which("oha") or str(Path.home() / ".cargo" / "bin" / "oha")
    if not Path(oha).exists():
        return None
    args = ["taskset", "-c", "1", oha, "-z", f"{seconds}s", "-q", str(rate), "--latency-correction", "--no-tui",
            "--output-format", "json", "-m", "POST", "-d", body]
    for k, v in headers.items():
        args += ["-H", f"{k}: {v}"]
    out = subprocess.run(args + [url], capture_output=True, text=True)
    try:
        j = json.loads(out.stdout)
    except ValueError:
        return {"error": out.stderr[-300:]}
    p = j.get("latencyPercentiles", {})
    return {"rps": j["summary"]["requestsPerSec"], "p50": p.get("p50", 0) * 1000, "p99": p.get("p99", 0) * 1000,
            "success": j["summary"]["successRate"]}


STREAM_BODY = {"model": "colibri", "stream": True,
               "messages": [{"role": "user", "content": "[[sim: tokens=300 delay_ms=1000]]"}]}


async def hold_streams(port: int, key: str, n: int, hold: float, ctx=None, probe=None) -> int:
    """Opens n streams and keeps them until `hold` seconds pass; returns how many got a 200.
    With ctx, each stream is its own TLS connection (a full handshake, HTTP/1.1). probe() runs
    once all are open, while they are held."""
    # A chunk a second for 5 minutes: every stream is still open when the last one opens.
    body = json.dumps(STREAM_BODY).encode()
    req = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
           f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
    ok = 0
    writers = []

    async def one():
        nonlocal ok
        try:
            if ctx is None:
                r, w = await asyncio.open_connection("127.0.0.1", port)
            else:
                r, w = await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname="localhost",
                                                     ssl_handshake_timeout=60)
            w.write(req)
            await w.drain()
            line = await asyncio.wait_for(r.readline(), 60)
            if b" 200 " in line:
                ok += 1
            writers.append((r, w))
        except Exception:  # noqa: BLE001
            pass

    batch = 500
    for i in range(0, n, batch):
        await asyncio.gather(*(one() for _ in range(min(batch, n - i))))
    if probe:
        probe()
    await asyncio.sleep(hold)
    for _, w in writers:
        w.close()
    return ok


# ---------------------------------------------------------------------------------------------


SECTIONS = ("plain", "tls", "tls-new", "tls-resumed", "h2", "h2c", "ttfb", "open-loop", "streams")

# The TLS and HTTP/2 cells: section -> (scenarios and concurrencies, the targets in the order
# they are interleaved, the first being the baseline the added latency is measured against).
TLS_CELLS = {
    # HTTP/1.1 over TLS, keep-alive: wrk opens its connections (one handshake each) and reuses them.
    "tls": [("chat", 1), ("chat", 16), ("chat", 64), ("messages", 16), ("chat_stream", 16)],
    # A new TCP connection and a full TLS handshake per request (ab: HTTP/1.0, no keep-alive).
    "tls-new": [("chat", 1), ("chat", 16)],
    # A new TCP connection per request, the TLS session resumed (wrk with Connection: close).
    "tls-resumed": [("chat", 16)],
    # HTTP/2, H2_CONNS connections × H2_STREAMS streams; "c" is the requests in flight.
    "h2": [("chat", H2_CONNS * H2_STREAMS), ("chat_stream", H2_CONNS * H2_STREAMS)],
    "h2c": [("chat", H2_CONNS * H2_STREAMS), ("chat_stream", H2_CONNS * H2_STREAMS)],
}
TLS_TARGETS = {
    "tls": ["direct-tls", "nginx-tls", "pingora-bare-tls", "quipu-tls"],
    "tls-new": ["direct-tls", "nginx-tls", "pingora-bare-tls", "quipu-tls"],
    "tls-resumed": ["direct-tls", "nginx-tls", "pingora-bare-tls", "quipu-tls"],
    "h2": ["direct-tls", "nginx-tls", "pingora-bare-tls", "quipu-tls"],
    "h2c": ["direct", "nginx-h2c", "pingora-bare-h2c", "quipu-h2c"],
}


def run_one(section: str, t: Target, scenario: str, c: int, secs: float) -> dict:
    """One run of one target in one cell; p50/p99 in µs."""
    url, b, h = t.request(scenario)
    if section in ("plain", "tls"):
        return wrk(url, b, h, c, secs)
    if section == "tls-resumed":
        return wrk(url, b, {**h, "Connection": "close"}, c, secs)
    if section == "tls-new":
        return tlsmod.ab(url, b, h, c, secs, WORK)
    if section in ("h2", "h2c"):
        if t.name.startswith("direct"):  # the simulator speaks HTTP/1.1: as many connections as streams
            return tlsmod.h2load(url, b, h, c, 1, secs, WORK, h1=True)
        r = tlsmod.h2load(url, b, h, H2_CONNS, c // H2_CONNS, secs, WORK)
        if r.get("proto") not in ("h2", "h2c"):
            raise RuntimeError(f"{t.name} did not speak HTTP/2 (h2load: {r.get('proto')})")
        return r
    raise ValueError(section)


def measure_cell(section: str, scenario: str, c: int, targets: list[Target], secs: float, repeat: int,
                 notes: list[str]) -> list[dict]:
    """Each cell is measured `repeat` times, the targets interleaved (A B C A B C …), and the
    median kept: one noisy second on a shared VM moves a single run by 10-30 %."""
    samples: dict[str, list[dict]] = {}
    for _ in range(repeat):
        for t in targets:
            cpu0 = cpu_seconds(t.pid) if t.pid else 0
            try:
                r = run_one(section, t, scenario, c, secs)
            except Exception as e:  # noqa: BLE001
                notes.append(f"{section}: {t.name} {scenario} c={c}: {e}")
                continue
            cpu = (cpu_seconds(t.pid) - cpu0) if t.pid else None
            r["cpu_us"] = (cpu / r["requests"] * 1e6) if cpu is not None and r["requests"] else None
            samples.setdefault(t.name, []).append(r)
    rows, base = [], None
    for i, t in enumerate(targets):
        runs = samples.get(t.name)
        if not runs:
            continue
        med = lambda k: statistics.median(x[k] for x in runs) if all(x[k] is not None for x in runs) else None  # noqa: E731
        row = {"section": section, "target": t.name, "scenario": scenario, "c": c, "rps": med("rps"), "p50": med("p50") / 1000,
               "p99": med("p99") / 1000, "errors": sum(x["errors"] for x in runs),
               "requests": sum(x["requests"] for x in runs), "cpu_us": med("cpu_us"),
               "cpu_spread": (min(x["cpu_us"] for x in runs), max(x["cpu_us"] for x in runs)) if med("cpu_us") else None,
               "rss_mb": rss_kb(t.pid) / 1024 if t.pid else None, "runs": len(runs),
               "equiv": (scenario.startswith("messages") and not t.speaks_messages)
               or (scenario.startswith("responses") and not t.speaks_responses)}
        if i == 0 and t.name.startswith("direct"):
            base = row
        if base:
            row["add_p50"] = row["p50"] - base["p50"]
            row["add_p99"] = row["p99"] - base["p99"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--repeat", type=int, default=3, help="runs per cell; the median is reported")
    ap.add_argument("--litellm-venv", default=str(ROOT / "benches" / ".venv-litellm"))
    ap.add_argument("--out", help="the report to write (default: docs/benchmarks-<UTC date>[-quick].md; "
                    "docs/benchmarks.md is the hand-written index and history, never written here)")
    ap.add_argument("--previous",
                    help="an earlier report whose plain rows this run's are compared with (read before --out is written; "
                    "default: the newest report in docs/, by the date on its Run line)")
    ap.add_argument("--sections", default=",".join(SECTIONS),
                    help=f"comma-separated subset of {','.join(SECTIONS)} (default: all)")
    ap.add_argument("--streams-only", type=int, metavar="N",
                    help="only the open-streams test with N streams, plain and over TLS; prints its figures, writes nothing")
    args = ap.parse_args()
    secs = 2 if args.quick else args.seconds
    if args.quick:
        args.repeat = 1
    sections = [x.strip() for x in args.sections.split(",") if x.strip()]
    if unknown := set(sections) - set(SECTIONS):
        ap.error(f"unknown sections: {', '.join(sorted(unknown))}")
    if args.out is None:
        args.out = str(ROOT / "docs" / f"benchmarks-{datetime.now(timezone.utc):%Y-%m-%d}{'-quick' if args.quick else ''}.md")
    if args.previous is None:
        args.previous = newest_report(ROOT / "docs")
    previous = read_previous(Path(args.previous)) if args.previous else {}
    global WORK, CERTS, CLIENT_CTX
    WORK = Path(tempfile.mkdtemp(prefix="quipu-bench-"))
    # One CA and server certificate for every TLS target of the run.
    CERTS = tlsmod.make_certs(WORK)
    CLIENT_CTX = tlsmod.client_context(CERTS["ca"])
    # Each open stream holds two descriptors in a proxy (client and upstream): 10,000 streams
    # need more than the usual 20,000. Root may raise the hard limit; others get what they have.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(hard, 65536), max(hard, 65536)))
    except (ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    sim_port = free_port()
    sim = Server("sim", [binary("quipu-sim"), "--listen", f"127.0.0.1:{sim_port}", "--threads", "1"], "1")
    wait_http(f"http://127.0.0.1:{sim_port}/health")
    if args.streams_only:
        notes: list[str] = []
        figures = all_open_streams(sim_port, args.streams_only, notes)
        sim.stop()
        print(json.dumps({**figures, "notes": notes}))
        return 0
    notes = []
    rows: list[dict] = []

    def start(makers) -> list[Target]:
        started = []
        for make in makers:
            try:
                started.append(make())
            except Exception as e:  # noqa: BLE001 - reported in the output
                notes.append(f"could not start a target: {e!r}")
        return started

    # The plain part first, with only its own targets running (as in earlier runs, so that its
    # rows compare with theirs); the TLS and HTTP/2 targets start when it is over.
    direct = Direct(sim_port)
    plain_targets: list[Target] = [direct]
    if any(x in sections for x in ("plain", "ttfb", "open-loop")):
        plain_targets += start([lambda: Nginx(sim_port), lambda: Bare(sim_port), lambda: Quipu(sim_port),
                                lambda: LiteLLM(sim_port, Path(args.litellm_venv))])
        # The same cells for an earlier build of Quipu, interleaved with the others: a
        # regression shows against this run's own baseline, not against another day's machine.
        before = os.environ.get("QUIPU_BENCH_BASELINE")
        if before:
            plain_targets += start([lambda: Quipu(sim_port, name=BASELINE_NAME, exe=before)])
    if "plain" in sections:
        for scenario in ["chat", "messages", "responses", "chat_stream", "messages_stream", "responses_stream"]:
            for c in [1, 16, 64]:
                rows += measure_cell("plain", scenario, c, plain_targets, secs, args.repeat, notes)
    ttfb = {}
    if "ttfb" in sections:
        for t in plain_targets:
            for scenario in ("chat_stream", "messages_stream"):
                url, b, h = t.request(scenario)
                ttfb[(t.name, scenario)] = ttfb_ms(url, b, h, 60 if args.quick else 300)
    open_loop = {}
    if "open-loop" in sections:
        for t in plain_targets:
            url, b, h = t.request("chat")
            open_loop[t.name] = oha_open_loop(url, b, h, 200 if t.name == "litellm" else 1000, 5 if args.quick else 10)
    for t in plain_targets:
        if hasattr(t, "server"):
            t.server.stop()

    want_tls = any(x in sections for x in TLS_CELLS if x != "h2c")
    tls_targets: list[Target] = [direct]
    sim_tls = None
    if want_tls:
        # The direct TLS baseline: a second simulator serving TLS itself, on the load generator's CPU.
        sim_tls_port = free_port()
        sim_tls = Server("sim-tls", [binary("quipu-sim"), "--listen", f"127.0.0.1:{sim_tls_port}", "--threads", "1",
                                     "--tls-cert", str(CERTS["cert"]), "--tls-key", str(CERTS["key"])], "1")
        try:
            wait_http(f"https://127.0.0.1:{sim_tls_port}/health")
        except TimeoutError as e:
            notes.append(f"the TLS simulator did not start: {e!r}")
        tls_targets.append(Direct(sim_tls_port, name="direct-tls", tls=True))
        tls_targets += start([lambda: Nginx(sim_port, "tls"), lambda: Bare(sim_port, "tls"),
                              lambda: Quipu(sim_port, name="quipu-tls", tls=True)])
    if "h2c" in sections:
        tls_targets += start([lambda: Nginx(sim_port, "h2c"), lambda: Bare(sim_port, "h2c"),
                              lambda: Quipu(sim_port, name="quipu-h2c", proto="h2c")])
    by_name = {t.name: t for t in tls_targets}
    for section, cells in TLS_CELLS.items():
        if section not in sections:
            continue
        ts = [by_name[n] for n in TLS_TARGETS[section] if n in by_name]
        for scenario, c in cells:
            rows += measure_cell(section, scenario, c, ts, secs, args.repeat, notes)
    for t in tls_targets:
        if hasattr(t, "server"):
            t.server.stop()
    if sim_tls:
        sim_tls.stop()
    conc = {}
    if "streams" in sections:
        conc = all_open_streams(sim_port, 2000 if args.quick else 10000, notes)
    sim.stop()
    write_report(args, rows, ttfb, open_loop, conc, notes, previous)
    return 0


BASELINE_NAME = os.environ.get("QUIPU_BENCH_BASELINE_LABEL", "quipu-before")


def before_after(by: dict) -> list[str]:
    """This build against the same-run baseline build, cell by cell."""
    out = []
    for s in ("chat", "messages", "chat_stream", "messages_stream"):
        for c in (1, 16, 64):
            now, was = by.get(("quipu", s, c)), by.get((BASELINE_NAME, s, c))
            if not (now and was):
                continue
            out.append(f"| {s} | {c} | {fmt(was['cpu_us'], 1)} → {fmt(now['cpu_us'], 1)} | {ratio(now['cpu_us'], was['cpu_us'])} | "
                       f"{fmt(was.get('add_p50'), 3)} → {fmt(now.get('add_p50'), 3)} | {fmt(was['rps'], 0)} → {fmt(now['rps'], 0)} | "
                       f"{fmt(was['rss_mb'], 1)} → {fmt(now['rss_mb'], 1)} |")
    if not out:
        return []
    return ["", f"## This build against {BASELINE_NAME}, in the same run", "",
            f"`{BASELINE_NAME}` is an earlier build of Quipu (`QUIPU_BENCH_BASELINE`), measured in the same cells, "
            "interleaved with the other targets, on the same machine at the same time: the fair before/after.", "",
            "| scenario | c | CPU µs/req before → now | now / before | +p50 ms before → now | req/s before → now | peak RSS MB before → now |",
            "|---|---|---|---|---|---|---|"] + out


def fd_figures(pid: int) -> dict:
    """Open descriptors of a server (all its processes) and its own limit on them."""
    fds = 0
    for p in tree(pid):
        try:
            fds += len(os.listdir(f"/proc/{p}/fd"))
        except OSError:
            pass
    limit = None
    try:
        for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
            if line.startswith("Max open files"):
                limit = int(line.split()[3])
    except (OSError, ValueError, IndexError):
        pass
    return {"fds": fds, "fd_limit": limit}


def hold_and_measure(pid: int, port: int, key: str, n: int, tls: bool) -> dict:
    idle = rss_kb(pid, "VmRSS") / 1024
    idle_fds = fd_figures(pid)
    peak_fds = {}
    t0 = time.time()
    ok = asyncio.run(hold_streams(port, key, n, 5, ctx=CLIENT_CTX if tls else None,
                                  probe=lambda: peak_fds.update(fd_figures(pid), open_s=time.time() - t0)))
    peak = rss_kb(pid) / 1024
    # Each stream holds two descriptors (client and upstream): what the limit leaves room for,
    # and how many were open at once (from the descriptors held once all had been opened).
    ceiling = (idle_fds["fd_limit"] - idle_fds["fds"]) // 2 if idle_fds["fd_limit"] else None
    at_once = (peak_fds["fds"] - idle_fds["fds"]) // 2 if peak_fds.get("fds") else None
    return {"streams": n, "ok": ok, "at_once": at_once, "idle_mb": idle, "peak_mb": peak, "tls": tls, "http": "h1",
            "idle_fds": idle_fds["fds"], "peak_fds": peak_fds.get("fds"), "fd_limit": idle_fds["fd_limit"],
            "ceiling": ceiling, "open_s": peak_fds.get("open_s")}


def hold_h2_and_measure(pid: int, url: str, key: str, n: int) -> dict:
    """n streams over HTTP/2 on TLS connections of H2_HOLD_STREAMS streams each (h2load): the
    client side needs one descriptor per connection, the proxy one per stream upstream."""
    idle = rss_kb(pid, "VmRSS") / 1024
    idle_fds = fd_figures(pid)
    conns = -(-n // H2_HOLD_STREAMS)
    h = {"Authorization": f"Bearer {key}", "content-type": "application/json"}
    # Streams of 20 chunks a second apart: all are open long before the first ends.
    body = json.dumps({**STREAM_BODY, "messages": [{"role": "user", "content": "[[sim: tokens=20 delay_ms=1000]]"}]})
    t0 = time.time()
    proc, result = tlsmod.h2load_hold(url, body, h, conns, H2_HOLD_STREAMS, n, WORK)
    peak_fds, open_s = 0, None
    while proc.poll() is None:
        f = fd_figures(pid)["fds"]
        if f > peak_fds:
            peak_fds = f
            if f - idle_fds["fds"] - conns >= n and open_s is None:
                open_s = time.time() - t0
        time.sleep(0.25)
    r = result()
    at_once = peak_fds - idle_fds["fds"] - conns  # one upstream connection per open stream
    return {"streams": n, "ok": r["succeeded"], "at_once": at_once, "idle_mb": idle, "peak_mb": rss_kb(pid) / 1024,
            "tls": True, "http": f"h2, {conns} connections", "idle_fds": idle_fds["fds"], "peak_fds": peak_fds,
            "fd_limit": idle_fds["fd_limit"], "ceiling": idle_fds["fd_limit"] - idle_fds["fds"] - conns if idle_fds["fd_limit"] else None,
            "open_s": open_s, "errors": r["errors"]}


# Streams per HTTP/2 connection in the open-streams test over h2 (pingora's default limit is 100).
H2_HOLD_STREAMS = 100


def open_streams(sim_port: int, n: int, tls: bool = False, h2: bool = False) -> dict:
    """n concurrent streams through Quipu (two worker threads, as configured by default); with
    tls, each stream its own TLS connection, or with h2 too, H2_HOLD_STREAMS per TLS connection."""
    q = Quipu(sim_port, threads=2, name="quipu-streams" + ("-tls" if tls else "") + ("-h2" if h2 else ""), tls=tls)
    try:
        if h2:
            return hold_h2_and_measure(q.pid, q.base + "/v1/chat/completions", q.key, n)
        return hold_and_measure(q.pid, int(q.base.rsplit(":", 1)[1]), q.key, n, tls)
    finally:
        q.server.stop()


def open_streams_bare(sim_port: int, n: int, tls: bool = False, h2: bool = False) -> dict:
    """The same n streams through the bare Pingora forwarder (two threads, like Quipu)."""
    port = free_port()
    server = Server("bare-streams" + ("-tls" if tls else "") + ("-h2" if h2 else ""),
                    bare_argv(sim_port, port, 2, "tls" if tls else "plain"), "0")
    try:
        base = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
        wait_http(base + "/health")
        if h2:
            return hold_h2_and_measure(server.proc.pid, base + "/v1/chat/completions", KEY, n)
        return hold_and_measure(server.proc.pid, port, KEY, n, tls)
    finally:
        server.stop()


# (name, tls, h2) of the open-streams runs.
STREAM_RUNS = [("", False, False), ("-tls", True, False), ("-tls-h2", True, True)]


def all_open_streams(sim_port: int, n: int, notes: list[str]) -> dict:
    out = {}
    for sfx, tls, h2 in STREAM_RUNS:
        for name, fn in (("quipu", open_streams), ("pingora-bare", open_streams_bare)):
            try:
                out[name + sfx] = fn(sim_port, n, tls=tls, h2=h2)
            except Exception as e:  # noqa: BLE001
                notes.append(f"open streams, {name}{sfx}: {e!r}")
    return out


def newest_report(docs: Path) -> str | None:
    """The newest report this script wrote in `docs` (`benchmarks-*.md` with a `Run … UTC` line)."""
    dated = []
    for path in docs.glob("benchmarks-*.md"):
        if m := re.search(r"^Run (\d{4}-\d\d-\d\d \d\d:\d\d) UTC", path.read_text(), re.M):
            dated.append((m.group(1), str(path)))
    return max(dated)[1] if dated else None


def read_previous(path: Path) -> dict:
    """The plain rows of an earlier report: (target, scenario, c) -> {rps, p50, cpu_us}, and its date."""
    out: dict = {}
    try:
        text = path.read_text()
    except OSError:
        return out
    if m := re.search(r"^Run (\d{4}-\d\d-\d\d \d\d:\d\d UTC)", text, re.M):
        out["_date"] = m.group(1)
    # Only the first table: the plain HTTP/1.1 rows.
    table = text.split("\n\n## ", 1)[0]
    for line in table.splitlines():
        cols = [x.strip() for x in line.strip().strip("|").split("|")]
        if len(cols) != 11 or not cols[1].isdigit():
            continue
        scenario = cols[0].replace(" (chat eq.)", "")
        num = lambda x: None if x in ("—", "") else float(x)  # noqa: E731
        out[(cols[2], scenario, int(cols[1]))] = {"rps": num(cols[3]), "p50": num(cols[4]), "cpu_us": num(cols[8])}
    return out


def fmt(x, d=2):
    return "—" if x is None else f"{x:.{d}f}"


def ratio(a, b):
    return f"{a / b:.2f}" if a and b else "—"


SECTION_TITLES = {
    "tls": "HTTP/1.1 over TLS, keep-alive (wrk)",
    "tls-new": "A new connection per request, full TLS handshake (ab)",
    "tls-resumed": "A new connection per request, TLS session resumed (wrk, `Connection: close`)",
    "h2": f"HTTP/2 over TLS (ALPN h2; h2load, {H2_CONNS} connections × {H2_STREAMS} streams)",
    "h2c": f"HTTP/2 with prior knowledge, plain (h2c; h2load, {H2_CONNS} connections × {H2_STREAMS} streams)",
}

TLS_METHOD = (
    "Method. One test CA and one server certificate for 127.0.0.1 and localhost (ECDSA P-256, made with "
    "the openssl CLI at the start of the run, benches/tls.py) serve every TLS target: nginx (`listen … ssl` "
    "with HTTP/2 on a server block and port of its own, TLS 1.2 and 1.3, the same static key check as its "
    "plain row), the bare Pingora forwarder (pingora's rustls `TlsSettings::intermediate` with `enable_h2()`, "
    "still nothing but `upstream_peer`) and Quipu (`[server] tls`); each is its own process, pinned and "
    "measured like the plain rows, and forwards to the same simulator over plain HTTP/1.1. The direct "
    "baseline of the TLS cells is a second simulator serving TLS itself (on the load generator's CPU), so "
    "\"added\" latency is what the proxy hop adds to a client that speaks TLS anyway. TLS handshakes are "
    "counted in the CPU per request as they happen: in the keep-alive cells wrk opens its c connections "
    "once per run of a cell (one handshake each, amortised over all the run's requests); in the "
    "\"new connection\" cells every request is a new TCP connection and a new handshake, and the proxy's "
    "CPU for accepting, handshaking, serving and closing is all in its µs/request. \"Full handshake\" is "
    "ApacheBench (`ab`, HTTP/1.0, `Connection: close` on each request): it makes a fresh TLS session for every connection "
    "and never offers one to resume, so each request costs the server an ECDHE key exchange and an ECDSA "
    "signature (TLS 1.3, X25519). wrk with `Connection: close` is the \"resumed\" row: wrk keeps the last "
    "session on its connection object and resumes it (TLS 1.3 PSK with a fresh ECDHE, no certificate "
    "signature), which each server here accepts (nginx by session ticket, rustls from its session cache); "
    "oha `--disable-keepalive` resumes too (its rustls client caches sessions), so neither measures a full "
    "handshake. ab's latency of a request runs from the connect to the last byte of the response, the "
    "handshake included; ab is one process sharing CPU 1 with the simulator, and its own handshakes (key "
    "exchange, signature check) are what limit these cells' req/s when a proxy's CPU per request times "
    "its req/s stays under one core (the direct row shows the client's own ceiling). HTTP/2 cells use h2load with "
    f"{H2_CONNS} connections and up to {H2_STREAMS} concurrent streams on each ({H2_CONNS * H2_STREAMS} "
    "requests in flight, like the c = 64 HTTP/1.1 cells); their direct baseline is h2load over HTTP/1.1 "
    f"with {H2_CONNS * H2_STREAMS} connections (the simulator speaks HTTP/1.1 only), and latencies come from "
    "h2load's per-request log (request sent to the end of the response).")


def section_table(rows: list[dict], base: str) -> list[str]:
    lines = [f"| scenario | c | target | req/s | p50 | p99 | +p50 vs {base} | +p99 vs {base} | CPU µs/req | peak RSS | errors |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['scenario']}{' (chat eq.)' if r['equiv'] else ''} | {r['c']} | {r['target']} | {fmt(r['rps'], 0)} | {fmt(r['p50'], 3)} | {fmt(r['p99'], 3)} | "
                     f"{fmt(r.get('add_p50'), 3)} | {fmt(r.get('add_p99'), 3)} | {fmt(r['cpu_us'], 1)} | {fmt(r['rss_mb'], 1)} | {r['errors']} |")
    return lines


def write_report(args, rows, ttfb, open_loop, conc, notes, previous=None):
    previous = previous or {}
    plain = [r for r in rows if r["section"] == "plain"]
    by = {(r["target"], r["scenario"], r["c"]): r for r in plain}
    sby = {(r["section"], r["target"], r["scenario"], r["c"]): r for r in rows}
    cpu_name = next((l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines() if l.startswith("model name")), "?")
    lines = [
        "# Benchmarks", "",
        f"Run {datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC} on {os.cpu_count()} × {cpu_name}, {platform.release()}.",
        f"Command: `./scripts/bench.sh{' --quick' if args.quick else ''}` (benches/run.py; each cell {2 if args.quick else args.seconds:g} s of wrk, closed loop "
        f"(ab and h2load in the TLS and HTTP/2 cells), {args.repeat} run(s) with the targets interleaved, medians reported).",
        "Quipu runs as shipped: access log on (written to a file), SQLite ledger, metrics.",
        "Every proxy runs on CPU 0 with one worker; wrk and the simulator share CPU 1.",
        "Latency in ms; CPU is the proxy's process-tree user+system time per request (µs); RSS is peak (MB).",
        "Plain forwarders (nginx, pingora-bare) have no messages endpoint: their messages rows forward the equivalent chat request; "
        "only Quipu is measured on the Responses API, the others' responses rows forward the equivalent chat request.",
        "The TLS and HTTP/2 rows of the same run are in [their own section](#tls-and-http2), next to these plain rows.", "",
        "| scenario | c | target | req/s | p50 | p99 | +p50 vs direct | +p99 vs direct | CPU µs/req | peak RSS | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in plain:
        lines.append(f"| {r['scenario']}{' (chat eq.)' if r['equiv'] else ''} | {r['c']} | {r['target']} | {fmt(r['rps'], 0)} | {fmt(r['p50'], 3)} | {fmt(r['p99'], 3)} | "
                     f"{fmt(r.get('add_p50'), 3)} | {fmt(r.get('add_p99'), 3)} | {fmt(r['cpu_us'], 1)} | {fmt(r['rss_mb'], 1)} | {r['errors']} |")
    if plain:
        lines += ["", "## Ratios of CPU per request (medians)", "",
                  "| scenario | c | quipu / pingora-bare | quipu / nginx | litellm / quipu |", "|---|---|---|---|---|"]
        for s in ("chat", "messages", "responses", "chat_stream", "messages_stream", "responses_stream"):
            for c in (1, 16, 64):
                q, b, n, l = (by.get((t, s, c), {}).get("cpu_us") for t in ("quipu", "pingora-bare", "nginx", "litellm"))
                lines.append(f"| {s} | {c} | {ratio(q, b)} | {ratio(q, n)} | {ratio(l, q)} |")
        lines += ["", "## Quipu's CPU per request, Responses API / chat format (goal: ≤ 1.2)", "",
                  "| scenario | c | responses / chat |", "|---|---|---|"]
        for s, chat in (("responses", "chat"), ("responses_stream", "chat_stream")):
            for c in (1, 16, 64):
                r, q = (by.get(("quipu", x, c), {}).get("cpu_us") for x in (s, chat))
                lines.append(f"| {s} | {c} | {ratio(r, q)} |")
    lines += before_after(by)
    spread = [r for r in rows if r.get("cpu_spread") and r["target"] in ("quipu", "pingora-bare", "nginx", BASELINE_NAME)]
    if spread:
        lines += ["", "Spread of CPU µs/req over the runs of a cell (min – max): "
                  + "; ".join(f"{r['target']} {r['scenario']} c={r['c']}: {r['cpu_spread'][0]:.1f}–{r['cpu_spread'][1]:.1f}"
                              for r in spread if r["c"] == 16) + "."]
    if ttfb:
        lines += ["", "## Time to first byte of a stream (concurrency 1, median)", "",
                  "| target | chat stream ms | messages stream ms | added vs direct (chat) | added vs direct (messages) |",
                  "|---|---|---|---|---|"]
        d = ttfb.get(("direct", "chat_stream"))
        dm = ttfb.get(("direct", "messages_stream"))
        for t in sorted({k[0] for k in ttfb}, key=["direct", "nginx", "pingora-bare", "quipu", BASELINE_NAME, "litellm"].index):
            a, m = ttfb[(t, "chat_stream")], ttfb[(t, "messages_stream")]
            lines.append(f"| {t} | {a:.3f} | {m:.3f} | {a - d:+.3f} | {m - dm:+.3f} |")
        lines.append("")
        lines.append("The direct messages row is the simulator's chat stream (it has no messages endpoint), "
                     "so Quipu's added messages time includes the whole translation.")
    if open_loop:
        lines += ["", "## Open loop (fixed rate, oha --latency-correction)", "", "| target | rate | achieved req/s | p50 ms | p99 ms |", "|---|---|---|---|---|"]
        for t, r in open_loop.items():
            if r and "rps" in r:
                lines.append(f"| {t} | {200 if t == 'litellm' else 1000} | {r['rps']:.0f} | {r['p50']:.3f} | {r['p99']:.3f} |")
            else:
                lines.append(f"| {t} | — | — | — | — |")
    if conc:
        lines += ["", "## Concurrent open streams (two worker threads each)", "",
                  "Streams of a chunk a second, all opened and then held together. Over HTTP/1.1 each stream is its own "
                  "connection (over TLS, its own full handshake, from one Python client), held 5 s once all are open; a "
                  "proxy then holds two descriptors per stream (client and upstream). Over HTTP/2 (h2load, TLS, "
                  f"{H2_HOLD_STREAMS} streams per connection) it holds one per stream (upstream) and one per connection, "
                  "and the streams are held until they end (20 s). \"Open at once\" is counted from the descriptors the "
                  "proxy held at the peak, less those it had when idle; \"room for\" is what the proxy's own descriptor "
                  "limit leaves for streams; \"answered\" counts the 200s.", "",
                  "| target | HTTP | streams | answered | open at once | idle RSS MB | peak RSS MB | descriptors at peak | descriptor limit | room for | s to open all |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for t, r in conc.items():
            lines.append(f"| {t} | {r.get('http', 'h1')} | {r['streams']} | {r['ok']} | {fmt(r.get('at_once'), 0)} | {r['idle_mb']:.1f} | {r['peak_mb']:.1f} | "
                         f"{fmt(r.get('peak_fds'), 0)} | {fmt(r.get('fd_limit'), 0)} | {fmt(r.get('ceiling'), 0)} | {fmt(r.get('open_s'), 1)} |")
    tls_rows = [r for r in rows if r["section"] in TLS_CELLS]
    if tls_rows:
        lines += ["", '<a id="tls-and-http2"></a>', "## TLS and HTTP/2", "", TLS_METHOD]
        for section in TLS_CELLS:
            srows = [r for r in tls_rows if r["section"] == section]
            if srows:
                lines += ["", f"### {SECTION_TITLES[section]}", ""] + section_table(srows, srows[0]["target"] if srows[0]["target"].startswith("direct") else "direct")
        lines += ["", "### Ratios of CPU per request (medians)", "",
                  "| cells | scenario | c | quipu / pingora-bare | quipu / nginx | pingora-bare / nginx |", "|---|---|---|---|---|---|"]
        for section, cells in TLS_CELLS.items():
            sfx = "-h2c" if section == "h2c" else "-tls"
            for s, c in cells:
                q, b, n = (sby.get((section, t + sfx, s, c), {}).get("cpu_us") for t in ("quipu", "pingora-bare", "nginx"))
                if q or b or n:
                    lines.append(f"| {section} | {s} | {c} | {ratio(q, b)} | {ratio(q, n)} | {ratio(b, n)} |")
        lines += side_by_side(sby)
    lines += targets_report(args, sby, conc, previous)
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    lines.append("")
    Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines))


# (section, target suffix, scenario, c, column title) of the side-by-side tables.
SIDE = [("plain", "", "chat", 16, "plain c=16"), ("tls", "-tls", "chat", 16, "TLS keep-alive c=16"),
        ("tls-new", "-tls", "chat", 16, "TLS new conn., full c=16"), ("tls-resumed", "-tls", "chat", 16, "TLS new conn., resumed c=16"),
        ("plain", "", "chat", 64, "plain c=64"), ("tls", "-tls", "chat", 64, "TLS keep-alive c=64"),
        ("h2", "-tls", "chat", H2_CONNS * H2_STREAMS, f"h2 over TLS {H2_CONNS}×{H2_STREAMS}"),
        ("h2c", "-h2c", "chat", H2_CONNS * H2_STREAMS, f"h2c {H2_CONNS}×{H2_STREAMS}")]


def side_by_side(sby: dict) -> list[str]:
    """The plain rows next to the TLS and HTTP/2 rows of the same run (chat)."""
    cols = [x for x in SIDE if any(k[0] == x[0] for k in sby)]
    out = ["", "### Plain, TLS and HTTP/2 side by side (chat, this run)", ""]
    for metric, title, d in (("cpu_us", "CPU µs/req", 1), ("rps", "req/s", 0), ("p50", "p50 ms", 3)):
        out += [f"| {title} | " + " | ".join(x[4] for x in cols) + " |", "|---|" + "---|" * len(cols)]
        for fam in ("nginx", "pingora-bare", "quipu"):
            vals = []
            for section, sfx, s, c, _ in cols:
                r = sby.get((section, fam + sfx, s, c))
                vals.append(fmt(r.get(metric) if r else None, d))
            out.append(f"| {fam} | " + " | ".join(vals) + " |")
        out.append("")
    return out[:-1]


def targets_report(args, sby: dict, conc: dict, previous: dict) -> list[str]:
    """Issue 17's targets, computed from this run."""
    out = ["", "## Targets (issue 17, TLS and HTTP/2)", ""]
    if args.quick:
        out += ["Quick mode (one short run per cell, fewer streams): the verdicts below are a smoke test of the "
                "benchmark, not a measurement.", ""]
    out += ["| target | this run | met |", "|---|---|---|"]
    head = len(out)

    def cells(section):
        return [(s, c) for s, c in TLS_CELLS[section]]

    # 1. CPU per request over TLS (keep-alive) ≤ 1.3 × the bare Pingora TLS forwarder's.
    got = [(s, c, sby.get(("tls", "quipu-tls", s, c), {}).get("cpu_us"), sby.get(("tls", "pingora-bare-tls", s, c), {}).get("cpu_us"))
           for s, c in cells("tls")]
    got = [(s, c, q / b) for s, c, q, b in got if q and b]
    if got:
        met = "yes" if all(x <= 1.3 for *_, x in got) else "no: " + ", ".join(f"{s} c={c}" for s, c, x in got if x > 1.3)
        out.append("| CPU per request over TLS (keep-alive) ≤ 1.3 × bare Pingora over TLS | "
                   + ", ".join(f"{s} c={c}: {x:.2f} ×" for s, c, x in got) + f" | {met} |")
    # 2. A new-connection TLS request ≤ 1.2 × nginx's CPU.
    got = []
    for s, c in cells("tls-new"):
        q, n, b = (sby.get(("tls-new", t, s, c), {}).get("cpu_us") for t in ("quipu-tls", "nginx-tls", "pingora-bare-tls"))
        if q and n:
            got.append((s, c, q / n, b / n if b else None))
    if got:
        met = "yes" if all(x <= 1.2 for _, _, x, _ in got) else "no: " + ", ".join(f"{s} c={c}" for s, c, x, _ in got if x > 1.2)
        out.append("| CPU per new-connection TLS request (full handshake) ≤ 1.2 × nginx | "
                   + ", ".join(f"{s} c={c}: {x:.2f} × (bare Pingora {fmt(y)} ×)" for s, c, x, y in got) + f" | {met} |")
    # 3. 10,000 open TLS streams: over HTTP/1.1 (a TLS connection each) and over h2.
    for key, how in (("quipu-tls", "one TLS connection each"), ("quipu-tls-h2", f"HTTP/2 over TLS, {H2_HOLD_STREAMS} streams per connection")):
        r = conc.get(key)
        if not r:
            continue
        at_once = r.get("at_once") or 0
        # (a descriptor or two of the idle count can be a health check's connection still closing)
        if r["ok"] == r["streams"] and at_once >= r["streams"] - 2:
            met = "yes" if r["streams"] >= 10000 else f"not at 10,000 here ({r['streams']:,} in this mode)"
        elif r.get("ceiling") and at_once >= min(r["streams"], r["ceiling"]) - 20 and at_once >= 0.99 * r["streams"]:
            met = (f"to the descriptor limit: {r['streams'] - at_once} could not be open at once, the proxy's limit of "
                   f"{r['fd_limit']:,} descriptors leaves room for {r['ceiling']:,}")
        else:
            met = "no"
        bare = conc.get(key.replace("quipu", "pingora-bare"))
        out.append(f"| {r['streams']:,} open TLS streams served ({how}) | {at_once:,} open at once, {r['ok']:,} answered, peak RSS {r['peak_mb']:.0f} MB, "
                   f"idle {r['idle_mb']:.1f} MB, {fmt(r.get('peak_fds'), 0)} descriptors at peak"
                   + (f" (bare Pingora: {bare.get('at_once') or 0:,} at once, {bare['peak_mb']:.0f} MB)" if bare else "") + f" | {met} |")
    # 4. The plain rows do not regress beyond noise (≤ 10 %) against the previous report.
    reg = plain_regression(sby, previous)
    if reg:
        worse = [x for x in reg if x["ratio_change"] is not None and x["ratio_change"] > 1.10]
        met = "yes" if not worse else "no: " + ", ".join(f"{x['scenario']} c={x['c']}" for x in worse)
        changes = [x["ratio_change"] for x in reg if x["ratio_change"] is not None]
        out.append(f"| plain rows: Quipu's CPU per request relative to bare Pingora within 10 % of the previous report ({previous.get('_date', '?')}) | "
                   f"change of quipu / pingora-bare {min(changes):.2f}–{max(changes):.2f} × (median {statistics.median(changes):.2f} ×) | {met} |")
        out += ["", "### Plain rows against the previous report", "",
                f"This run's plain rows next to those of {Path(args.previous).name} as it was before this run "
                f"({previous.get('_date', '?')}). Whole runs drift on this machine, so the drift-free check is "
                "Quipu's CPU per request relative to bare Pingora's in the same run.", "",
                "| scenario | c | quipu req/s (before → now) | quipu CPU µs/req | pingora-bare CPU µs/req | quipu / pingora-bare | change |",
                "|---|---|---|---|---|---|---|"]
        for x in reg:
            out.append(f"| {x['scenario']} | {x['c']} | {fmt(x['rps0'], 0)} → {fmt(x['rps1'], 0)} | {fmt(x['q0'], 1)} → {fmt(x['q1'], 1)} | "
                       f"{fmt(x['b0'], 1)} → {fmt(x['b1'], 1)} | {fmt(x['r0'])} → {fmt(x['r1'])} | {fmt(x['ratio_change'])} × |")
    return out if len(out) > head else []


def plain_regression(sby: dict, previous: dict) -> list[dict]:
    out = []
    for s in ("chat", "messages", "chat_stream", "messages_stream"):
        for c in (1, 16, 64):
            now_q, now_b = sby.get(("plain", "quipu", s, c)), sby.get(("plain", "pingora-bare", s, c))
            was_q, was_b = previous.get(("quipu", s, c)), previous.get(("pingora-bare", s, c))
            if not (now_q and was_q):
                continue
            q0, q1 = was_q["cpu_us"], now_q["cpu_us"]
            b0, b1 = (was_b or {}).get("cpu_us"), (now_b or {}).get("cpu_us")
            r0 = q0 / b0 if q0 and b0 else None
            r1 = q1 / b1 if q1 and b1 else None
            out.append({"scenario": s, "c": c, "rps0": was_q["rps"], "rps1": now_q["rps"], "q0": q0, "q1": q1, "b0": b0, "b1": b1,
                        "r0": r0, "r1": r1, "ratio_change": r1 / r0 if r0 and r1 else None})
    return out

if __name__ == "__main__":
    sys.exit(main())
