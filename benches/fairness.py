#!/usr/bin/env python3
"""A fair share of a saturated cluster: one tenant's batch against another's interactive
streams, on an engine with 8 slots, with and without Quipu's queue.

    python3 benches/fairness.py                 # every scenario, 30 s each
    python3 benches/fairness.py --seconds 10    # shorter
    python3 benches/fairness.py --weights       # also: tenants of weight 1 and 3, both saturating
    python3 benches/fairness.py --batch         # also: a batch key alone, then an interactive one

The engine is the simulator with `--max-num-seqs 8` (FIFO beyond its slots, as vLLM's scheduler
does, with vLLM's running/waiting gauges). Tenant A keeps 32 streams of 40 tokens (20 ms a
token) going; tenant B sends one stream at a time. Scenarios, one after the other on the same
engine:

- `direct`: both talk to the engine;
- `quipu (no max_concurrency)`: through Quipu as it forwards without a queue (the before);
- `quipu (max_concurrency = 8)`: through one Quipu whose queue holds the backlog;
- `2 quipus, B alternating`: through two Quipu replicas in front of the same engine (A's
  streams split between them, B alternating per request), each reading the engine's own gauges;
- `2 quipus, B on one gateway`: the same, B's requests all through one of them (a client that
  keeps its connection, behind a TCP balancer).

Reported per scenario: B's time to first token (p50, p99), the engine's slot utilization (busy
slot-seconds over 8 × the window, from the simulator), A's completed streams per second, and
A's and B's together (what the engine finished: a queue that wastes nothing keeps it; A alone
must lose what B gains). `--dry` prints without recording in docs/benchmarks-fairness.md.
With `--weights`: two tenants of weights 1 and 3, each keeping 32 streams going through one
Quipu; the ratio of their output tokens over the window.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REL = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "release"
sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import free_port, wait_http  # noqa: E402

SLOTS = 8
ALLOWANCE = 0  # --allowance
A_STREAMS = 32
TEXT = "[[sim: tokens=40 delay_ms=20]]"
WORK = Path(tempfile.mkdtemp(prefix="quipu-fairness-"))


class Proc:
    def __init__(self, name: str, argv: list[str]):
        self.log = open(WORK / f"{name}.log", "wb")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def stop(self):
        self.proc.kill()
        self.proc.wait()
        self.log.close()


def sim() -> tuple[Proc, int]:
    port = free_port()
    p = Proc("sim", [str(REL / "quipu-sim"), "--listen", f"127.0.0.1:{port}", "--threads", "2",
                     "--max-num-seqs", str(SLOTS)])
    wait_http(f"http://127.0.0.1:{port}/health")
    return p, port


class Gateway:
    """One Quipu in front of the simulator, with tenants `a` and `b` (and `c` of weight 3 when
    asked), each with a key."""

    def __init__(self, name: str, sim_port: int, max_concurrency: int | None, weights: dict[str, int],
                 batch: tuple[str, ...] = (), gateways: int = 1):
        self.port, mport, aport = free_port(), free_port(), free_port()
        cfg = WORK / f"{name}.toml"
        cap = f"max_concurrency = {max_concurrency}\n" if max_concurrency else ""
        cfg.write_text(f"""
[server]
listen = "127.0.0.1:{self.port}"
metrics_listen = "127.0.0.1:{mport}"
admin_listen = "127.0.0.1:{aport}"
threads = 2
pid_file = "{WORK}/{name}.pid"
upgrade_sock = "{WORK}/{name}.sock"
grace_period_seconds = 1
max_in_flight = 4096
[store]
url = "sqlite://{WORK}/{name}.db"
[scheduling]
load_interval_ms = 200
gateways = {gateways}
engine_queue_allowance = {ALLOWANCE}
[[models]]
slug = "colibri"
display_name = "Colibrí"
upstream_model = "colibri"
upstreams = ["http://127.0.0.1:{sim_port}/v1"]
prices = {{ input = "0.20", cached = "0.05", output = "0.80" }}
{cap}""")
        q = str(REL / "quipu")
        env = dict(os.environ, QUIPU_LOG="warn")
        run = lambda *a: subprocess.run([q, "--config", str(cfg), *a], check=True, capture_output=True,  # noqa: E731
                                        text=True, env=env)
        self.keys = {}
        for tenant, weight in weights.items():
            run("tenant", "create", tenant)
            if weight != 1:
                run("tenant", "update", tenant, "--weight", str(weight))
            run("topup", "--tenant", tenant, "--amount", "1000000.00")
            priority = ["--priority", "batch"] if tenant in batch else []
            self.keys[tenant] = json.loads(run("key", "create", "--tenant", tenant, *priority,
                                               "--json").stdout)["secret"]
        self.proc = Proc(name, [q, "--config", str(cfg), "serve"])
        wait_http(f"http://127.0.0.1:{self.port}/health")
        time.sleep(1.0)  # the key snapshot


def stream(port: int, key: str | None, tag: str) -> tuple[float | None, int]:
    """One chat stream: (seconds to its first content chunk, content chunks)."""
    body = json.dumps({"model": "colibri", "stream": True, "max_tokens": 64,
                       "messages": [{"role": "user", "content": f"{tag} {TEXT}"}]})
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    sent = time.monotonic()
    c.request("POST", "/v1/chat/completions", body, headers)
    r = c.getresponse()
    first, chunks = None, 0
    if r.status != 200:
        r.read()
        c.close()
        return None, 0
    for line in r:
        if line.startswith(b"data: {") and b'"content":"' in line:
            chunks += 1
            if first is None:
                first = time.monotonic() - sent
    c.close()
    return first, chunks


class Load:
    """Keeps `n` streams of one tenant going against `ports` (round robin) until stopped, from a
    process of its own: the streams' threads would otherwise share the interpreter lock with
    the thread that times B's first token, adding up to its switch interval (5 ms) of jitter
    to a figure of about 1 ms."""

    def __init__(self, ports: list[int], keys: list[str | None], n: int, tag: str):
        ctx = multiprocessing.get_context("fork")
        self._counting = ctx.Value("b", 0)
        self._done = ctx.Value("q", 0)
        self._tokens = ctx.Value("q", 0)
        self.stop = ctx.Event()
        self.proc = ctx.Process(target=self.serve, args=(ports, keys, n, tag), daemon=True)
        self.proc.start()

    @property
    def counting(self) -> bool:
        return bool(self._counting.value)

    @counting.setter
    def counting(self, on: bool):
        self._counting.value = int(on)

    @property
    def done(self) -> int:
        return self._done.value

    @property
    def tokens(self) -> int:
        return self._tokens.value

    def serve(self, ports, keys, n, tag):
        threads = [threading.Thread(target=self.run, args=(ports[i % len(ports)], keys[i % len(keys)], f"{tag}{i}"),
                                    daemon=True) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def run(self, port, key, tag):
        k = 0
        while not self.stop.is_set():
            _, chunks = stream(port, key, f"{tag}-{k}")
            k += 1
            with self._done.get_lock():
                if self._counting.value and not self.stop.is_set():
                    self._done.value += 1
                    self._tokens.value += chunks

    def end(self):
        self.stop.set()
        self.proc.join(120)
        if self.proc.is_alive():
            self.proc.kill()


def engine(sim_port: int, path: str) -> dict:
    c = http.client.HTTPConnection("127.0.0.1", sim_port, timeout=10)
    c.request("POST" if path == "/sim/reset" else "GET", path, "{}" if path == "/sim/reset" else None,
              {"Content-Type": "application/json"})
    body = c.getresponse().read()
    c.close()
    return json.loads(body) if body.strip() else {}


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")


def scenario(name: str, sim_port: int, ports: list[int], a_keys, b_keys, seconds: float,
             b_ports: list[int] | None = None) -> dict:
    """A keeps its streams going against `ports`; B sends one stream at a time against
    `b_ports` (default: `ports`), alternating."""
    b_ports = b_ports or ports
    a = Load(ports, a_keys, A_STREAMS, "a")
    time.sleep(3.0)  # the batch reaches its steady state: every slot busy, the rest waiting
    engine(sim_port, "/sim/reset")
    a.counting = True
    started = time.monotonic()
    ttft = []
    k = 0
    while time.monotonic() - started < seconds:
        i = k % len(b_ports)
        first, _ = stream(b_ports[i], b_keys[i], f"b{k}")
        k += 1
        if first is not None:
            ttft.append(first)
    elapsed = time.monotonic() - started
    report = engine(sim_port, "/sim/engine")
    a.counting = False
    a.end()
    return {
        "scenario": name,
        "b_requests": len(ttft),
        "b_p50": pct(ttft, 0.5),
        "b_p99": pct(ttft, 0.99),
        "utilization": report.get("utilization"),
        "a_per_s": a.done / elapsed,
        "all_per_s": (a.done + len(ttft)) / elapsed,
    }


def weights_scenario(sim_port: int, gw: Gateway, seconds: float) -> dict:
    light = Load([gw.port], [gw.keys["a"]], A_STREAMS, "w1")
    heavy = Load([gw.port], [gw.keys["c"]], A_STREAMS, "w3")
    time.sleep(3.0)
    light.counting = heavy.counting = True
    time.sleep(seconds)
    light.counting = heavy.counting = False
    t1, t3 = light.tokens, heavy.tokens
    light.end()
    heavy.end()
    return {"weight_1_tokens": t1, "weight_3_tokens": t3, "ratio": t3 / t1 if t1 else float("nan")}


def batch_scenario(sim_port: int, gw: Gateway, seconds: float) -> dict:
    """A batch key saturating alone, then an interactive tenant arriving: the batch's share of
    the engine alone, and the interactive tenant's time to first token while the batch runs."""
    batch = Load([gw.port], [gw.keys["d"]], A_STREAMS, "batch")
    time.sleep(3.0)
    engine(sim_port, "/sim/reset")
    batch.counting = True
    time.sleep(seconds / 2)
    alone = engine(sim_port, "/sim/engine").get("utilization")
    started = time.monotonic()
    ttft = []
    k = 0
    while time.monotonic() - started < seconds / 2:
        first, _ = stream(gw.port, gw.keys["b"], f"i{k}")
        k += 1
        if first is not None:
            ttft.append(first)
    batch.end()
    return {"alone_utilization": alone, "b_requests": len(ttft), "b_p50": pct(ttft, 0.5),
            "b_p99": pct(ttft, 0.99)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--weights", action="store_true", help="also the weights 1 : 3 scenario")
    ap.add_argument("--weights-seconds", type=float, default=60, help="how long the weights scenario counts")
    ap.add_argument("--batch", action="store_true", help="also the batch-priority scenario")
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks-fairness.md"))
    ap.add_argument("--dry", action="store_true", help="print the results without recording them")
    ap.add_argument("--allowance", type=int, default=0,
                    help="scheduling.engine_queue_allowance of the gateways (requests let wait in the engine)")
    args = ap.parse_args()
    global ALLOWANCE
    ALLOWANCE = args.allowance
    s, sim_port = sim()
    rows, gws = [], []
    try:
        rows.append(scenario("direct", sim_port, [sim_port], [None], [None], args.seconds))
        plain = Gateway("plain", sim_port, None, {"a": 1, "b": 1})
        gws.append(plain)
        rows.append(scenario("quipu (no max_concurrency)", sim_port, [plain.port], [plain.keys["a"]], [plain.keys["b"]], args.seconds))
        plain.proc.stop()
        one = Gateway("one", sim_port, SLOTS, {"a": 1, "b": 1, "c": 3, "d": 1}, batch=("d",))
        gws.append(one)
        rows.append(scenario("quipu (max_concurrency = 8)", sim_port, [one.port], [one.keys["a"]], [one.keys["b"]], args.seconds))
        weights = weights_scenario(sim_port, one, args.weights_seconds) if args.weights else None
        batch = batch_scenario(sim_port, one, args.seconds) if args.batch else None
        one.proc.stop()
        g1 = Gateway("g1", sim_port, SLOTS, {"a": 1, "b": 1}, gateways=2)
        g2 = Gateway("g2", sim_port, SLOTS, {"a": 1, "b": 1}, gateways=2)
        gws += [g1, g2]
        rows.append(scenario("2 quipus, B alternating", sim_port, [g1.port, g2.port],
                             [g1.keys["a"], g2.keys["a"]], [g1.keys["b"], g2.keys["b"]], args.seconds))
        # A client that keeps its connection (the SDKs do) stays on one gateway behind a TCP
        # balancer; B here reaches g1 only, A still both.
        rows.append(scenario("2 quipus, B on one gateway", sim_port, [g1.port, g2.port],
                             [g1.keys["a"], g2.keys["a"]], [g1.keys["b"]], args.seconds, b_ports=[g1.port]))
    finally:
        for g in gws:
            g.proc.stop()
        s.stop()
    direct = rows[0]
    lines = [f"## {date.today().isoformat()}: {args.seconds:.0f} s per scenario, {os.cpu_count()} cores, "
             f"engine_queue_allowance = {args.allowance}",
             "",
             "| scenario | B requests | B ttft p50 | B ttft p99 | engine slots busy | A streams/s | vs direct | A+B streams/s | vs direct |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        util = f"{r['utilization'] * 100:.1f} %" if isinstance(r["utilization"], (int, float)) else "–"
        lines.append(f"| {r['scenario']} | {r['b_requests']} | {r['b_p50']:.4f} s | {r['b_p99']:.4f} s | {util} | "
                     f"{r['a_per_s']:.2f} | {r['a_per_s'] / direct['a_per_s'] * 100:.1f} % | "
                     f"{r['all_per_s']:.2f} | {r['all_per_s'] / direct['all_per_s'] * 100:.1f} % |")
    one = rows[2]
    ratio = lambda r, k: r[k] / one[k] if isinstance(r[k], (int, float)) and one[k] else float("nan")  # noqa: E731
    for r in rows[3:]:
        lines += ["", f"{r['scenario']} against one Quipu: B p50 × {ratio(r, 'b_p50'):.2f}, "
                      f"p99 × {ratio(r, 'b_p99'):.2f}; engine busy × {ratio(r, 'utilization'):.3f}; "
                      f"A streams/s × {ratio(r, 'a_per_s'):.3f}."]
    if weights:
        lines += ["", f"Weights 1 : 3, both tenants saturating through one Quipu: output tokens "
                      f"{weights['weight_1_tokens']} : {weights['weight_3_tokens']} = 1 : {weights['ratio']:.2f}."]
    if batch:
        util = batch["alone_utilization"]
        util = f"{util * 100:.1f} %" if isinstance(util, (int, float)) else "–"
        lines += ["", f"Batch priority through one Quipu (`max_concurrency = 8`): a batch key with 32 streams "
                      f"alone keeps {util} of the engine's slots busy; then an interactive tenant's time to "
                      f"first token while the batch runs: p50 {batch['b_p50']:.4f} s, p99 {batch['b_p99']:.4f} s "
                      f"({batch['b_requests']} requests)."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.dry:
        return 0
    out = Path(args.out)
    head = out.read_text() if out.exists() else "# Fairness benchmark history\n\nWritten by `benches/fairness.py` (see its docstring); newest first.\n\n"
    marker = "\n## "
    i = head.find(marker)
    out.write_text(head[:i + 1] + text + "\n" + head[i + 1:] if i >= 0 else head + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
