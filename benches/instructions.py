#!/usr/bin/env python3
"""Instructions per request of Quipu builds, counted by callgrind: a figure that does not move
with the machine's load, for before/after comparisons of a change.

    python3 benches/instructions.py                                  # this build
    python3 benches/instructions.py --baseline OLD/quipu             # and an earlier build
    python3 benches/instructions.py --kinds chat,messages,responses  # the three formats
    python3 benches/instructions.py --baseline OLD/quipu --governed  # and a key with a model list and caps

Each build serves the same number of requests of each kind (non-streaming and streaming, four
keep-alive connections at a time: per-request cost, as wrk measures it) from the simulator,
under `valgrind --tool=callgrind` with instrumentation off except while a kind's requests run
(`callgrind_control -i`, one dump per kind), so start-up and shutdown are not counted. Each
phase's instructions, on every thread (the ledger's, the access log's, the stored-response
writer's included), are divided by its requests. Work driven by timers (the ledger's flush,
health checks) is counted for as long as a phase lasts: a little, and the same for two builds
that share those timers. The ledger flushes every 250 ms here, not every 10 ms: under valgrind
a request takes a hundred times longer, so a 10 ms flush writes a batch of a few rows where a
loaded gateway writes hundreds, and how many batches a phase writes would depend on how the
two builds' threads happen to be scheduled (a writer that ticks on time pays a transaction
every few requests; one starved by the request thread, once every fifty). `--rounds 2` measures the builds alternately twice, to show the
spread. Needs valgrind (Debian: `apt-get install valgrind`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import http.client
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REL = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "release"
sys.path.insert(0, str(Path(__file__).resolve().parent))

import tls as tlsmod  # noqa: E402
from run import free_port, wait_http  # noqa: E402

# Set by --tls: the test CA's client context, and the server's certificate and key.
CLIENT_CTX = None
CERTS: dict = {}


def connect(port: int) -> http.client.HTTPConnection:
    if CLIENT_CTX is not None:
        return http.client.HTTPSConnection("127.0.0.1", port, timeout=60, context=CLIENT_CTX)
    return http.client.HTTPConnection("127.0.0.1", port, timeout=60)


def wait_port(port: int, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"port {port}")

BODIES = {
    "chat": ("/v1/chat/completions", {"model": "colibri", "max_tokens": 16,
                                      "messages": [{"role": "user", "content": "hola, ¿qué tal? [[sim: tokens=16]]"}]}),
    "messages": ("/v1/messages", {"model": "colibri", "max_tokens": 16,
                                  "messages": [{"role": "user", "content": "hola, ¿qué tal? [[sim: tokens=16]]"}]}),
    # Stored (`store` defaults to true), as the SDKs send it by default.
    "responses": ("/v1/responses", {"model": "colibri", "max_output_tokens": 16,
                                    "input": "hola, ¿qué tal? [[sim: tokens=16]]"}),
    # Not stored, as the Codex CLI sends it: the translation's cost alone.
    "responses_unstored": ("/v1/responses", {"model": "colibri", "max_output_tokens": 16, "store": False,
                                             "input": "hola, ¿qué tal? [[sim: tokens=16]]"}),
}


def post(conn: http.client.HTTPConnection, key: str, path: str, body: dict, stream: bool) -> None:
    """One request on a keep-alive connection (as wrk and the SDKs send them)."""
    conn.request("POST", path, body=json.dumps(dict(body, stream=stream)).encode(), headers={
        "Authorization": f"Bearer {key}", "content-type": "application/json", "anthropic-version": "2023-06-01"})
    r = conn.getresponse()
    r.read()
    if r.status != 200:
        raise RuntimeError(f"{path}: HTTP {r.status}")


def measure(exe: str, sim_port: int, work: Path, label: str, per_kind: int, kinds: list[str],
            bare: bool = False, governed: bool = False) -> dict:
    """One build under callgrind; `bare`: the bare Pingora forwarder (chat requests only, no key)."""
    port, mport = free_port(), free_port()
    out = work / f"{label}.callgrind"
    valgrind = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
    if bare:
        tls_args = ["--tls-cert", str(CERTS["cert"]), "--tls-key", str(CERTS["key"])] if CERTS else []
        proc = subprocess.Popen([*valgrind, exe, "--listen", f"127.0.0.1:{port}",
                                 "--upstream", f"127.0.0.1:{sim_port}", *tls_args],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return run_phases(proc, port, "none", work, label, per_kind, kinds, out)
    tls_line = f'tls = {{ cert = "{CERTS["cert"]}", key = "{CERTS["key"]}" }}\n' if CERTS else ""
    cfg = work / f"{label}.toml"
    cfg.write_text(f"""
[server]
{tls_line}listen = "127.0.0.1:{port}"
metrics_listen = "127.0.0.1:{mport}"
threads = 1
pid_file = "{work}/{label}.pid"
upgrade_sock = "{work}/{label}.sock"
grace_period_seconds = 1
[store]
url = "sqlite://{work}/{label}.db"
ledger_flush_ms = 250
[[models]]
slug = "colibri"
display_name = "Colibrí"
upstream_model = "colibri"
upstreams = ["http://127.0.0.1:{sim_port}/v1"]
prices = {{ input = "0.20", cached = "0.05", output = "0.80" }}
""")
    env = dict(os.environ, QUIPU_LOG="warn")
    run = lambda *a: subprocess.run([exe, "--config", str(cfg), *a], check=True, capture_output=True, text=True, env=env)  # noqa: E731
    run("tenant", "create", "bench")
    run("topup", "--tenant", "bench", "--amount", "1000000.00")
    limits = ["--models", "colibri,colib*", "--budget", "1000000.00", "--budget-period", "day"] if governed else []
    if governed:
        run("tenant", "update", "bench", "--monthly-cap", "1000000.00")
    key = json.loads(run("key", "create", "--tenant", "bench", *limits, "--json").stdout)["secret"]
    serve_env = {k: v for k, v in os.environ.items() if k not in ("QUIPU_LOG", "RUST_LOG")}
    proc = subprocess.Popen([*valgrind, exe, "--config", str(cfg), "serve"], env=serve_env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return run_phases(proc, port, key, work, label, per_kind, kinds, out)


def run_phases(proc, port: int, key: str, work: Path, label: str, per_kind: int, kinds: list[str],
               out: Path) -> dict:
    wait_port(port)
    time.sleep(2)
    # First-request set-up (pool, lazy statics) is not counted.
    post(connect(port), key, *BODIES["chat"], False)
    def control(*flags: str) -> None:
        subprocess.run(["callgrind_control", *flags, str(proc.pid)], check=True, capture_output=True)

    total = 0
    parts = []  # (kind, stream, requests), in the order of their dumps
    for kind in kinds:
        path, body = BODIES[kind]
        for stream in (False, True):
            control("-z")
            control("-i", "on")
            def worker(n=per_kind // 4):
                conn = connect(port)
                for _ in range(n):
                    post(conn, key, path, body, stream)
                conn.close()
            threads = [threading.Thread(target=worker) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            time.sleep(0.5)  # background work the requests queued (ledger rows, stored responses)
            control("-i", "off")
            control("-d")
            n = (per_kind // 4) * 4
            parts.append((kind, stream, n))
            total += n
    proc.send_signal(15)
    proc.wait(timeout=120)
    dumps = sorted(work.glob(f"{label}.callgrind.*"), key=lambda f: int(f.name.rsplit(".", 1)[1]))
    by_kind = {}
    instructions = 0
    for (kind, stream, n), dump in zip(parts, dumps):
        ir = totals(dump)
        instructions += ir
        by_kind[f"{kind}{'_stream' if stream else ''}"] = ir / n
    return {"label": label, "requests": total, "instructions": instructions,
            "per_request": instructions / total if instructions else None, "by_kind": by_kind}


def totals(dump: Path) -> int:
    text = subprocess.run(["callgrind_annotate", str(dump)], capture_output=True, text=True).stdout
    m = re.search(r"([\d,]+)\s+\(100\.0%\)\s+PROGRAM TOTALS", text) or re.search(r"([\d,]+)\s+PROGRAM TOTALS", text)
    return int(m.group(1).replace(",", "")) if m else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", help="an earlier quipu binary to count too")
    ap.add_argument("--requests", type=int, default=2000, help="requests of each of the four kinds")
    ap.add_argument("--rounds", type=int, default=1, help="measure each build this many times, alternately")
    ap.add_argument("--keep", action="store_true", help="keep the callgrind files (for callgrind_annotate)")
    ap.add_argument("--kinds", default="chat,messages",
                    help="request kinds, of chat,messages,responses,responses_unstored (an earlier build may lack responses)")
    ap.add_argument("--bare", action="store_true",
                    help="also count the bare Pingora forwarder (benches/bare-forwarder), chat requests only")
    ap.add_argument("--governed", action="store_true",
                    help="the key has a model list and a daily cap, its tenant a monthly cap")
    ap.add_argument("--tls", action="store_true", help="serve over TLS (a test CA), keep-alive connections")
    args = ap.parse_args()
    if not shutil.which("valgrind"):
        print("valgrind is not installed (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="quipu-instr-"))
    if args.tls:
        global CLIENT_CTX, CERTS
        CERTS = tlsmod.make_certs(work)
        CLIENT_CTX = tlsmod.client_context(CERTS["ca"])
    sim_port = free_port()
    sim = subprocess.Popen([str(REL / "quipu-sim"), "--listen", f"127.0.0.1:{sim_port}", "--threads", "1"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http(f"http://127.0.0.1:{sim_port}/health")
        builds = [("now", str(REL / "quipu"))] + ([("baseline", args.baseline)] if args.baseline else [])
        kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
        if args.governed:
            builds.append(("governed", str(REL / "quipu")))
        results = [measure(exe, sim_port, work, f"{label}{k}", args.requests, kinds,
                           governed=label == "governed")
                   for k in range(args.rounds) for label, exe in builds]
        if args.bare:
            results += [measure(str(REL / "bare-forwarder"), sim_port, work, f"bare{k}", args.requests,
                                ["chat"], bare=True) for k in range(args.rounds)]
    finally:
        sim.terminate()
        sim.wait()
    for r in results:
        print(f"{r['label']}: {r['per_request']:,.0f} instructions per request ({r['requests']} requests); "
              + ", ".join(f"{k} {v:,.0f}" for k, v in r["by_kind"].items()))
    if args.baseline and all(r["per_request"] for r in results):
        now = [r["per_request"] for r in results if r["label"].startswith("now")]
        before = [r["per_request"] for r in results if r["label"].startswith("baseline")]
        print(f"now / baseline: {min(now) / min(before):.3f} (lowest of each), "
              f"{max(now) / max(before):.3f} (highest of each)")
        governed = [r for r in results if r["label"].startswith("governed")]
        if governed:
            print(f"governed / baseline: {min(r['per_request'] for r in governed) / min(before):.3f} (lowest of each)")
        for kind in results[0]["by_kind"]:
            per = lambda prefix: min(r["by_kind"][kind] for r in results if r["label"].startswith(prefix))  # noqa: E731
            extra = f", governed {per('governed') / per('baseline'):.3f}" if governed else ""
            print(f"  {kind}: now {per('now') / per('baseline'):.3f}{extra}")
    if args.bare:
        for kind in ("chat", "chat_stream"):
            now = min(r["by_kind"][kind] for r in results if r["label"].startswith("now"))
            bare = min(r["by_kind"][kind] for r in results if r["label"].startswith("bare"))
            print(f"{kind}: quipu / bare forwarder {now / bare:.2f}")
    if args.keep:
        print(f"callgrind files in {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
