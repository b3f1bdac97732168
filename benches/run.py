#!/usr/bin/env python3
"""Quipu's side-by-side benchmark: direct, nginx, a bare Pingora forwarder, LiteLLM and Quipu in
front of the same fast upstream simulator, in one run on one machine.

    ./scripts/bench.sh            # full run, writes docs/benchmarks.md
    ./scripts/bench.sh --quick    # shorter cells, for a smoke test
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 60, headers=None) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            req = urllib.request.Request(url, headers=headers or {})
            urllib.request.urlopen(req, timeout=2).read()
            return
        except urllib.error.HTTPError:
            return
        except Exception:  # noqa: BLE001
            time.sleep(0.2)
    raise TimeoutError(url)


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
    return "/v1/chat/completions", {"model": model, "stream": stream,
                                    "messages": [{"role": "user", "content": text}]}


class Target:
    name: str
    base: str
    pid: int | None = None
    speaks_messages = False

    def request(self, scenario: str) -> tuple[str, str, dict]:
        """(url, body, headers) for a scenario; plain forwarders get the chat equivalent."""
        s = scenario if self.speaks_messages else scenario.replace("messages", "chat")
        path, b = body(s)
        if path == "/v1/messages":
            return self.base + path, json.dumps(b), {"x-api-key": KEY, "anthropic-version": "2023-06-01", "content-type": "application/json"}
        return self.base + path, json.dumps(b), {"Authorization": f"Bearer {KEY}", "content-type": "application/json"}


class Direct(Target):
    name = "direct"

    def __init__(self, sim_port):
        self.base = f"http://127.0.0.1:{sim_port}"


class Nginx(Target):
    name = "nginx"

    def __init__(self, sim_port):
        port = free_port()
        prefix = WORK / "nginx"
        (prefix / "logs").mkdir(parents=True, exist_ok=True)
        conf = prefix / "nginx.conf"
        conf.write_text(f"""
worker_processes 1;
error_log {prefix}/logs/error.log warn;
pid {prefix}/nginx.pid;
events {{ worker_connections 20000; }}
http {{
  access_log off;
  upstream sim {{ server 127.0.0.1:{sim_port}; keepalive 128; }}
  server {{
    listen 127.0.0.1:{port} backlog=4096;
    client_max_body_size 32m;
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
        self.server = Server("nginx", ["nginx", "-p", str(prefix), "-c", str(conf), "-g", "daemon off;"], "0")
        self.pid = self.server.proc.pid
        self.base = f"http://127.0.0.1:{port}"
        wait_http(self.base + "/health")


class Bare(Target):
    name = "pingora-bare"

    def __init__(self, sim_port):
        port = free_port()
        self.server = Server("bare", [str(REL / "bare-forwarder"), "--listen", f"127.0.0.1:{port}",
                                      "--upstream", f"127.0.0.1:{sim_port}", "--threads", "1"], "0")
        self.pid = self.server.proc.pid
        self.base = f"http://127.0.0.1:{port}"
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

    def __init__(self, sim_port, threads: int = 1, name: str = "quipu"):
        port, mport = free_port(), free_port()
        cfg = WORK / f"{name}.toml"
        cfg.write_text(f"""
[server]
listen = "127.0.0.1:{port}"
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
        q = str(REL / "quipu")
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
        self.base = f"http://127.0.0.1:{port}"
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


async def hold_streams(port: int, key: str, n: int, hold: float) -> int:
    """Opens n streams and keeps them until `hold` seconds pass; returns how many got a 200."""
    body = json.dumps({"model": "colibri", "stream": True, "messages": [{"role": "user", "content": "[[sim: tokens=30 delay_ms=1000]]"}]}).encode()
    req = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
           f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
    ok = 0
    writers = []

    async def one():
        nonlocal ok
        try:
            r, w = await asyncio.open_connection("127.0.0.1", port)
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
    await asyncio.sleep(hold)
    for _, w in writers:
        w.close()
    return ok


# ---------------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--repeat", type=int, default=3, help="runs per cell; the median is reported")
    ap.add_argument("--litellm-venv", default=str(ROOT / "benches" / ".venv-litellm"))
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks.md"))
    ap.add_argument("--streams-only", type=int, metavar="N",
                    help="only the open-streams test with N streams; prints its figures, writes nothing")
    args = ap.parse_args()
    secs = 2 if args.quick else args.seconds
    if args.quick:
        args.repeat = 1
    global WORK
    WORK = Path(tempfile.mkdtemp(prefix="quipu-bench-"))
    # Each open stream holds two descriptors in a proxy (client and upstream): 10,000 streams
    # need more than the usual 20,000. Root may raise the hard limit; others get what they have.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(hard, 65536), max(hard, 65536)))
    except (ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    sim_port = free_port()
    sim = Server("sim", [str(REL / "quipu-sim"), "--listen", f"127.0.0.1:{sim_port}", "--threads", "1"], "1")
    wait_http(f"http://127.0.0.1:{sim_port}/health")
    if args.streams_only:
        figures = {"quipu": open_streams(sim_port, args.streams_only),
                   "pingora-bare": open_streams_bare(sim_port, args.streams_only)}
        sim.stop()
        print(json.dumps(figures))
        return 0
    targets: list[Target] = [Direct(sim_port)]
    notes = []
    for make in (lambda: Nginx(sim_port), lambda: Bare(sim_port), lambda: Quipu(sim_port),
                 lambda: LiteLLM(sim_port, Path(args.litellm_venv))):
        try:
            targets.append(make())
        except Exception as e:  # noqa: BLE001 - reported in the output
            notes.append(f"could not start a target: {e!r}")
    scenarios = ["chat", "messages", "chat_stream", "messages_stream"]
    concurrencies = [1, 16, 64]
    rows = []
    for scenario in scenarios:
        for c in concurrencies:
            # Each cell is measured `repeat` times, the targets interleaved (A B C A B C …), and
            # the median kept: one noisy second on a shared VM moves a single run by 10-30 %.
            samples: dict[str, list[dict]] = {}
            for _ in range(args.repeat):
                for t in targets:
                    url, b, h = t.request(scenario)
                    cpu0 = cpu_seconds(t.pid) if t.pid else 0
                    try:
                        r = wrk(url, b, h, c, secs)
                    except Exception as e:  # noqa: BLE001
                        notes.append(f"{t.name} {scenario} c={c}: {e}")
                        continue
                    cpu = (cpu_seconds(t.pid) - cpu0) if t.pid else None
                    r["cpu_us"] = (cpu / r["requests"] * 1e6) if cpu is not None and r["requests"] else None
                    samples.setdefault(t.name, []).append(r)
            base = None
            for t in targets:
                runs = samples.get(t.name)
                if not runs:
                    continue
                med = lambda k: statistics.median(x[k] for x in runs) if all(x[k] is not None for x in runs) else None  # noqa: E731
                row = {"target": t.name, "scenario": scenario, "c": c, "rps": med("rps"), "p50": med("p50") / 1000,
                       "p99": med("p99") / 1000, "errors": sum(x["errors"] for x in runs),
                       "requests": sum(x["requests"] for x in runs), "cpu_us": med("cpu_us"),
                       "cpu_spread": (min(x["cpu_us"] for x in runs), max(x["cpu_us"] for x in runs)) if med("cpu_us") else None,
                       "rss_mb": rss_kb(t.pid) / 1024 if t.pid else None, "runs": len(runs),
                       "equiv": scenario.startswith("messages") and not t.speaks_messages}
                if t.name == "direct":
                    base = row
                if base:
                    row["add_p50"] = row["p50"] - base["p50"]
                    row["add_p99"] = row["p99"] - base["p99"]
                rows.append(row)
                print(json.dumps(row), flush=True)
    ttfb = {}
    for t in targets:
        for scenario in ("chat_stream", "messages_stream"):
            url, b, h = t.request(scenario)
            ttfb[(t.name, scenario)] = ttfb_ms(url, b, h, 60 if args.quick else 300)
    open_loop = {}
    for t in targets:
        url, b, h = t.request("chat")
        open_loop[t.name] = oha_open_loop(url, b, h, 200 if t.name == "litellm" else 1000, 5 if args.quick else 10)
    for t in targets:
        if hasattr(t, "server"):
            t.server.stop()
    n_streams = 2000 if args.quick else 10000
    conc = {"quipu": open_streams(sim_port, n_streams), "pingora-bare": open_streams_bare(sim_port, n_streams)}
    sim.stop()
    write_report(args, rows, ttfb, open_loop, conc, notes)
    return 0


def open_streams(sim_port: int, n: int) -> dict:
    """n concurrent streams through Quipu (two worker threads, as configured by default)."""
    q = Quipu(sim_port, threads=2, name="quipu-streams")
    idle = rss_kb(q.pid, "VmRSS") / 1024
    ok = asyncio.run(hold_streams(int(q.base.rsplit(":", 1)[1]), q.key, n, 5))
    peak = rss_kb(q.pid) / 1024
    q.server.stop()
    return {"streams": n, "ok": ok, "idle_mb": idle, "peak_mb": peak}


def open_streams_bare(sim_port: int, n: int) -> dict:
    """The same n streams through the bare Pingora forwarder (two threads, like Quipu)."""
    port = free_port()
    server = Server("bare-streams", [str(REL / "bare-forwarder"), "--listen", f"127.0.0.1:{port}",
                                     "--upstream", f"127.0.0.1:{sim_port}", "--threads", "2"], "0")
    wait_http(f"http://127.0.0.1:{port}/health")
    idle = rss_kb(server.proc.pid, "VmRSS") / 1024
    ok = asyncio.run(hold_streams(port, KEY, n, 5))
    peak = rss_kb(server.proc.pid) / 1024
    server.stop()
    return {"streams": n, "ok": ok, "idle_mb": idle, "peak_mb": peak}


def fmt(x, d=2):
    return "—" if x is None else f"{x:.{d}f}"


def write_report(args, rows, ttfb, open_loop, conc, notes):
    by = {(r["target"], r["scenario"], r["c"]): r for r in rows}
    cpu_name = next((l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines() if l.startswith("model name")), "?")
    lines = [
        "# Benchmarks", "",
        f"Run {datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC} on {os.cpu_count()} × {cpu_name}, {platform.release()}.",
        f"Command: `./scripts/bench.sh{' --quick' if args.quick else ''}` (benches/run.py; each cell {2 if args.quick else args.seconds:g} s of wrk, closed loop, "
        f"{args.repeat} run(s) with the targets interleaved, medians reported).",
        "Quipu runs as shipped: access log on (written to a file), SQLite ledger, metrics.",
        "Every proxy runs on CPU 0 with one worker; wrk and the simulator share CPU 1.",
        "Latency in ms; CPU is the proxy's process-tree user+system time per request (µs); RSS is peak (MB).",
        "Plain forwarders (nginx, pingora-bare) have no messages endpoint: their messages rows forward the equivalent chat request.", "",
        "| scenario | c | target | req/s | p50 | p99 | +p50 vs direct | +p99 vs direct | CPU µs/req | peak RSS | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['scenario']}{' (chat eq.)' if r['equiv'] else ''} | {r['c']} | {r['target']} | {r['rps']:.0f} | {fmt(r['p50'], 3)} | {fmt(r['p99'], 3)} | "
                     f"{fmt(r.get('add_p50'), 3)} | {fmt(r.get('add_p99'), 3)} | {fmt(r['cpu_us'], 1)} | {fmt(r['rss_mb'], 1)} | {r['errors']} |")
    lines += ["", "## Ratios of CPU per request (medians)", "",
              "| scenario | c | quipu / pingora-bare | quipu / nginx | litellm / quipu |", "|---|---|---|---|---|"]
    for s in ("chat", "messages", "chat_stream", "messages_stream"):
        for c in (1, 16, 64):
            q, b, n, l = (by.get((t, s, c), {}).get("cpu_us") for t in ("quipu", "pingora-bare", "nginx", "litellm"))
            ratio = lambda a, bb: f"{a / bb:.2f}" if a and bb else "—"  # noqa: E731
            lines.append(f"| {s} | {c} | {ratio(q, b)} | {ratio(q, n)} | {ratio(l, q)} |")
    spread = [r for r in rows if r.get("cpu_spread") and r["target"] in ("quipu", "pingora-bare", "nginx")]
    if spread:
        lines += ["", "Spread of CPU µs/req over the runs of a cell (min – max): "
                  + "; ".join(f"{r['target']} {r['scenario']} c={r['c']}: {r['cpu_spread'][0]:.1f}–{r['cpu_spread'][1]:.1f}"
                              for r in spread if r["c"] == 16) + "."]
    lines += ["", "## Time to first byte of a stream (concurrency 1, median)", "",
              "| target | chat stream ms | messages stream ms | added vs direct (chat) | added vs direct (messages) |",
              "|---|---|---|---|---|"]
    d = ttfb.get(("direct", "chat_stream"))
    dm = ttfb.get(("direct", "messages_stream"))
    for t in sorted({k[0] for k in ttfb}, key=["direct", "nginx", "pingora-bare", "quipu", "litellm"].index):
        a, m = ttfb[(t, "chat_stream")], ttfb[(t, "messages_stream")]
        lines.append(f"| {t} | {a:.3f} | {m:.3f} | {a - d:+.3f} | {m - dm:+.3f} |")
    lines.append("")
    lines.append("The direct messages row is the simulator's chat stream (it has no messages endpoint), "
                 "so Quipu's added messages time includes the whole translation.")
    lines += ["", "## Open loop (fixed rate, oha --latency-correction)", "", "| target | rate | achieved req/s | p50 ms | p99 ms |", "|---|---|---|---|---|"]
    for t, r in open_loop.items():
        if r and "rps" in r:
            lines.append(f"| {t} | {200 if t == 'litellm' else 1000} | {r['rps']:.0f} | {r['p50']:.3f} | {r['p99']:.3f} |")
        else:
            lines.append(f"| {t} | — | — | — | — |")
    lines += ["", "## Concurrent open streams (two worker threads each)", "",
              "| target | streams open | of | idle RSS MB | peak RSS MB |", "|---|---|---|---|---|"]
    for t, r in conc.items():
        lines.append(f"| {t} | {r['ok']} | {r['streams']} | {r['idle_mb']:.1f} | {r['peak_mb']:.1f} |")
    lines.append("")
    if notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
