#!/usr/bin/env python3
"""Instructions per request of Quipu builds, counted by callgrind: a figure that does not move
with the machine's load, for before/after comparisons of a change.

    python3 benches/instructions.py                       # this build
    python3 benches/instructions.py --baseline OLD/quipu  # and an earlier build, same requests

Each build serves the same fixed number of requests (chat and messages, non-streaming and
streaming, four keep-alive connections at a time: per-request cost, as wrk measures it) from the simulator, under
`valgrind --tool=callgrind` with collection off until the requests start and off again when they
end (`callgrind_control -i`), so start-up and shutdown are not counted; the instructions of
that phase (every thread: the ledger's and the access log's included) are divided by the
requests. Work driven by timers (the ledger's 10 ms flush, health checks) is counted for as
long as the phase lasts, which under valgrind is minutes: a few percent of the figure, the same
for two builds that share those timers. `--rounds 2` measures the builds alternately twice, to
show the figure's spread. Needs valgrind (Debian: `apt-get install valgrind`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
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

from run import free_port, wait_http  # noqa: E402

BODIES = {
    "chat": ("/v1/chat/completions", {"model": "colibri", "max_tokens": 16,
                                      "messages": [{"role": "user", "content": "hola, ¿qué tal? [[sim: tokens=16]]"}]}),
    "messages": ("/v1/messages", {"model": "colibri", "max_tokens": 16,
                                  "messages": [{"role": "user", "content": "hola, ¿qué tal? [[sim: tokens=16]]"}]}),
}


def post(conn: http.client.HTTPConnection, key: str, path: str, body: dict, stream: bool) -> None:
    """One request on a keep-alive connection (as wrk and the SDKs send them)."""
    conn.request("POST", path, body=json.dumps(dict(body, stream=stream)).encode(), headers={
        "Authorization": f"Bearer {key}", "content-type": "application/json", "anthropic-version": "2023-06-01"})
    r = conn.getresponse()
    r.read()
    if r.status != 200:
        raise RuntimeError(f"{path}: HTTP {r.status}")


def measure(exe: str, sim_port: int, work: Path, label: str, per_kind: int) -> dict:
    port, mport = free_port(), free_port()
    cfg = work / f"{label}.toml"
    cfg.write_text(f"""
[server]
listen = "127.0.0.1:{port}"
metrics_listen = "127.0.0.1:{mport}"
threads = 1
pid_file = "{work}/{label}.pid"
upgrade_sock = "{work}/{label}.sock"
grace_period_seconds = 1
[store]
url = "sqlite://{work}/{label}.db"
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
    key = json.loads(run("key", "create", "--tenant", "bench", "--json").stdout)["secret"]
    out = work / f"{label}.callgrind"
    serve_env = {k: v for k, v in os.environ.items() if k not in ("QUIPU_LOG", "RUST_LOG")}
    proc = subprocess.Popen(["valgrind", "--tool=callgrind", "--instr-atstart=no",
                             f"--callgrind-out-file={out}", exe,
                             "--config", str(cfg), "serve"], env=serve_env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    wait_http(base + "/health", timeout=180)
    time.sleep(2)
    # First-request set-up (pool, lazy statics) is not counted.
    post(http.client.HTTPConnection("127.0.0.1", port, timeout=60), key, *BODIES["chat"], False)
    control = lambda flag: subprocess.run(["callgrind_control", "-i", flag, str(proc.pid)], check=True,  # noqa: E731
                                          capture_output=True)
    control("on")
    total = 0
    for kind, (path, body) in BODIES.items():
        for stream in (False, True):
            def worker(n=per_kind // 4):
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                for _ in range(n):
                    post(conn, key, path, body, stream)
                conn.close()
            threads = [threading.Thread(target=worker) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            total += (per_kind // 4) * 4
    control("off")
    proc.send_signal(15)
    proc.wait(timeout=120)
    text = subprocess.run(["callgrind_annotate", str(out)], capture_output=True, text=True).stdout
    m = re.search(r"([\d,]+)\s+\(100\.0%\)\s+PROGRAM TOTALS", text) or re.search(r"([\d,]+)\s+PROGRAM TOTALS", text)
    instructions = int(m.group(1).replace(",", "")) if m else None
    return {"label": label, "requests": total, "instructions": instructions,
            "per_request": instructions / total if instructions else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", help="an earlier quipu binary to count too")
    ap.add_argument("--requests", type=int, default=2000, help="requests of each of the four kinds")
    ap.add_argument("--rounds", type=int, default=1, help="measure each build this many times, alternately")
    ap.add_argument("--keep", action="store_true", help="keep the callgrind files (for callgrind_annotate)")
    args = ap.parse_args()
    if not shutil.which("valgrind"):
        print("valgrind is not installed (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="quipu-instr-"))
    sim_port = free_port()
    sim = subprocess.Popen([str(REL / "quipu-sim"), "--listen", f"127.0.0.1:{sim_port}", "--threads", "1"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http(f"http://127.0.0.1:{sim_port}/health")
        builds = [("now", str(REL / "quipu"))] + ([("baseline", args.baseline)] if args.baseline else [])
        results = [measure(exe, sim_port, work, f"{label}{k}", args.requests)
                   for k in range(args.rounds) for label, exe in builds]
    finally:
        sim.terminate()
        sim.wait()
    for r in results:
        print(f"{r['label']}: {r['per_request']:,.0f} instructions per request ({r['requests']} requests)")
    if args.baseline and all(r["per_request"] for r in results):
        now = [r["per_request"] for r in results if r["label"].startswith("now")]
        before = [r["per_request"] for r in results if r["label"].startswith("baseline")]
        print(f"now / baseline: {min(now) / min(before):.3f} (lowest of each), "
              f"{max(now) / max(before):.3f} (highest of each)")
    if args.keep:
        print(f"callgrind files in {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
