"""The soak: a mixed workload for a given time, with a replica restarted twice, then the books.

    .venv/bin/python tests/python/soak.py --minutes 10      # or scripts/soak.sh 10

Both formats, streams and not, successes, client errors (400/401/404), upstream failures
(5xx, resets, garbage, mid-stream errors), client disconnects, and two rolling restarts of one
`colibri` replica. Afterwards:

- the ledger equals, request by request and to the last pico-sol, a recomputation from the
  tokens the simulators report, and every request an upstream saw has its ledger row;
- every request got the status its kind calls for (200 for a clean one), and no client saw a
  connection error;
- no reservation is open;
- the gateway's RSS (medians over a few seconds) grew less than 5 % after warm-up (the two-minute default), and less than 2 %
  over the second half of the window: a leak grows with the requests, caches level off. The
  one-minute version in the suite (tests/python/test_soak.py) holds the same 5 %.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import socket
import sqlite3
import sys
import threading
import time
from decimal import Decimal
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from harness import Gateway, Sim, http_json, require_binaries, scratch_dir, wait_until  # noqa: E402

PRICES = {
    "colibri": (Decimal("0.20"), Decimal("0.05"), Decimal("0.80")),
    "aguila": (Decimal("1.00"), Decimal("0.25"), Decimal("4.00")),
    "apu": (Decimal("3.00"), Decimal("0.75"), Decimal("12.00")),
}


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def disconnect_mid_stream(gw: Gateway, key: str, rng: random.Random) -> None:
    """Reads a few chunks of a paced stream and hangs up.

    The pace (400 ms) is far longer than the client takes to hang up and the gateway to close
    the upstream, so the upstream never writes a chunk the gateway did not read: the count of
    tokens both sides saw is the same, and the books can be compared exactly."""
    body = json.dumps({"model": "colibri", "stream": True,
                       "messages": [{"role": "user", "content": f"{rng.random()} [[sim: tokens=50 delay_ms=400]]"}]}).encode()
    s = socket.create_connection(("127.0.0.1", gw.port), timeout=3)
    s.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
              f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    got = b""
    want = rng.randint(2, 5)
    try:
        # Stop at `want` frames, or when the answer was not a stream (an error, e.g. while a
        # replica restarts) and is complete.
        while got.count(b"data: ") < want and b"0\r\n\r\n" not in got:
            chunk = s.recv(4096)
            if not chunk:
                break
            got += chunk
            if got.startswith(b"HTTP/1.1") and b" 200 " not in got.split(b"\r\n", 1)[0] and b"\r\n\r\n" in got:
                break
    finally:
        s.close()


def one(gw: Gateway, keys: list[str], rng: random.Random) -> str | None:
    """One request of a random kind; returns what was wrong with its status, if anything."""
    key = rng.choice(keys)
    roll = rng.random()
    model = rng.choice(list(PRICES))
    fault = rng.choice([""] * 16 + ["reset_after=3", "fail_after=2", "garbage_after=2", "status=500", "overflow"] * 2 + ["status=503"])
    text = f"{rng.random()} [[sim: tokens={rng.randint(1, 60)} {fault}]]"
    stream = rng.random() < 0.5
    if roll < 0.08:
        key = "sk-qp-not-a-key"
    if roll < 0.11:
        model = "gpt-unknown"
    chat_format = rng.random() < 0.5
    if chat_format:
        body = {"model": model, "messages": [{"role": "user", "content": text}], "stream": stream}
        if roll > 0.97:
            body["messages"][0]["role"] = "robot"
        status = http_json("POST", gw.base + "/v1/chat/completions", body,
                           {"Authorization": f"Bearer {key}"}, timeout=60)[0]
    else:
        body = {"model": model, "max_tokens": 100, "messages": [{"role": "user", "content": text}], "stream": stream}
        status = http_json("POST", gw.base + "/v1/messages", body,
                           {"x-api-key": key, "anthropic-version": "2023-06-01"}, timeout=60)[0]
    # What each kind of request must get (docs/design.md's error table); checked in this order.
    if roll < 0.08:
        want = 401
    elif roll < 0.11:
        want = 404
    elif chat_format and roll > 0.97:
        want = 400
    elif fault == "status=500":
        want = 502
    elif fault == "status=503":
        want = 503 if chat_format else 529
    elif fault == "overflow":
        want = 400
    else:
        # Clean requests, and faults mid-stream (an error frame under the 200).
        want = 200
    if status != want:
        return f"{status} instead of {want} ({'chat' if chat_format else 'messages'}, stream={stream}, {fault or 'clean'})"
    return None


def keep(archive: dict, port: int, r: dict) -> None:
    """Files a simulator record under its request id; a request retried on another replica
    (after a 503 or a failed connect) has several."""
    if r["request_id"]:
        archive.setdefault(r["request_id"], {})[(port, r["seq"], r["at_ms"])] = r


def served(records: dict) -> dict:
    """The record that answered the client: the 200 if one replica gave it, else the last."""
    recs = list(records.values())
    return next((r for r in recs if r["status"] == 200), recs[-1])


def collect(sims: list[Sim], archive: dict, seen: dict) -> None:
    """Moves what each simulator saw since the last call into `archive`."""
    for s in sims:
        try:
            recs = s.requests(seen.get(s.port, 0))
        except Exception:  # noqa: BLE001 - a replica being restarted
            continue
        for r in recs:
            seen[s.port] = max(seen.get(s.port, 0), r["seq"])
            keep(archive, s.port, r)


def rolling_restart(gw: Gateway, sim: Sim, archive: dict) -> None:
    """Drains a replica (unhealthy → no new requests), keeps what it saw, restarts it."""
    sim.set_healthy(False)
    wait_until(lambda: gw.metric_value("quipu_upstream_healthy", replica=sim.api_base) == 0, 10)
    # Quipu's own count first: a request it routed here just before the flip may not have
    # reached the simulator yet (its in_flight is 0 meanwhile), and would be served, and
    # billed, after the records below were read.
    wait_until(lambda: gw.metric_value("quipu_upstream_in_flight", replica=sim.api_base) == 0, 30)
    wait_until(lambda: sim.stats()["in_flight"] == 0, 30)
    # From here on it answers 503 (the gateway fails such a request over to another replica):
    # should the gateway still route a request here — all replicas looking unhealthy to a
    # starved health check puts a pool into panic routing — the record lost with the process
    # is a refusal, never the answer that was billed.
    sim.set_fault(503)
    wait_until(lambda: sim.stats()["in_flight"] == 0, 30)  # one that slipped in before the flip
    for r in sim.requests(0):
        keep(archive, sim.port, r)
    sim.stop(signal.SIGKILL)
    time.sleep(0.5)
    sim.start()  # a fresh process: its record numbers start again
    # Back within a health interval (2 s) once any ejection (2 intervals) has run out, and the
    # gauge is recomputed at the next check: up to ~8 s by design. 10 s timed out once in CI
    # with the soak's eight client threads on two cores, and the cause was not found, so the
    # bound has room for a slow check — and a timeout says what the gateway saw of the replica
    # (failed checks, or ejections renewed by traffic), for whoever meets it next.
    try:
        wait_until(lambda: gw.metric_value("quipu_upstream_healthy", replica=sim.api_base) == 1,
                   30, f"replica {sim.api_base} to be healthy again")
    except TimeoutError as e:
        seen = [line for line in gw.process.tail(2000).splitlines()
                if sim.api_base in line and "quipu::access" not in line]
        raise TimeoutError(f"{e}; the gateway's log about it:\n" + "\n".join(seen[-20:])) from e


def log(msg: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(seconds: float, workdir: Path, threads: int = 8, warmup: float = 90.0) -> dict:
    """Runs the workload for `warmup` + `seconds`; RSS growth is measured over `seconds` (the
    allocator, SQLite's page cache and the connection pools settle in the warm-up, which
    includes one rolling restart)."""
    require_binaries()
    sims = [Sim(workdir, name=f"soak-sim-{i}").start() for i in range(3)]
    gw = Gateway(
        workdir,
        {"colibri": [sims[0].api_base, sims[1].api_base], "aguila": [sims[2].api_base], "apu": [sims[2].api_base]},
        name="soak-quipu",
        model_extra='routing = "least_loaded"',
    )
    # The `status=503` fault is a property of the request, not of the replica: two such requests
    # in a row eject a healthy replica (often a model's only one). Ejection never takes a whole
    # healthy pool out (panic routing), so every clean request must still get its 200.
    gw.start()
    keys = [gw.new_tenant(f"soak{i}", top_up="100000.00")[1] for i in range(4)]
    stop = threading.Event()
    errors: list[str] = []
    wrong_status: list[str] = []
    done = [0]

    def worker(n, task):
        rng = random.Random(n)
        while not stop.is_set():
            try:
                problem = task(gw, keys if task is one else rng.choice(keys), rng)
            except Exception as e:  # noqa: BLE001 - a client-side error is itself a finding
                errors.append(repr(e))
                continue
            done[0] += 1
            if problem:
                wrong_status.append(problem)

    # Disconnecting clients are slow by design (paced streams): they get threads of their own.
    pool = [threading.Thread(target=worker, args=(i, one)) for i in range(threads)]
    pool += [threading.Thread(target=worker, args=(100 + i, disconnect_mid_stream)) for i in range(2)]
    started = time.time() + warmup
    for t in pool:
        t.start()
    try:
        archive: dict[str, dict] = {}
        seen: dict[int, int] = {}
        # (time, kB) twice a second. Levels are medians over a few seconds, so that one sample
        # taken during a burst of buffers does not stand for the steady size.
        rss_samples: list[tuple[float, int]] = []
        restarts = [started + seconds * 0.3, started + seconds * 0.65]
        midpoint = started + seconds / 2

        def level(t0: float, t1: float) -> int:
            window = sorted(kb for t, kb in rss_samples if t0 <= t <= t1)
            return window[len(window) // 2] if window else rss_kb(gw.process.proc.pid)

        def wait_to(t):
            last_collect = 0.0
            while time.time() < t:
                if time.time() - last_collect >= 1.0:
                    collect(sims, archive, seen)
                    last_collect = time.time()
                rss_samples.append((time.time(), rss_kb(gw.process.proc.pid)))
                time.sleep(0.5)

        # The warm-up goes through every phase of the workload once, a rolling restart included:
        # the first one leaves a one-off step in RSS (buffers and pools at a new high-water
        # mark), which is not growth.
        wait_to(started - warmup / 2)
        log("restarting a replica (warm-up)")
        seen.pop(sims[1].port, None)
        rolling_restart(gw, sims[1], archive)
        wait_to(started)
        rss_warm = level(started - 10, started)
        log(f"warmed up: RSS {rss_warm} kB")
        for at in restarts:
            wait_to(at)
            collect(sims, archive, seen)
            log("restarting a replica")
            seen.pop(sims[1].port, None)
            rolling_restart(gw, sims[1], archive)
            log("replica back")
        wait_to(started + seconds)
        rss_end = level(started + seconds - 10, started + seconds)
        rss_mid = level(midpoint - 5, midpoint + 5)
    except BaseException:
        # Whatever failed, the workers must not keep a test process alive.
        stop.set()
        gw.stop()
        for s in sims:
            s.stop()
        raise
    stop.set()
    log("stopping the workload")
    for t in pool:
        t.join(60)
    log("checking the books")
    wait_until(lambda: gw.metric_value("quipu_reservations_open") == 0, 10, "reservations to close")
    # A stream whose client hung up is settled at once, but its upstream may still be writing
    # until the gateway's cancel reaches it; the simulator keeps its record only then. Wait for
    # every simulator to be idle, so the last records are in before they are read.
    wait_until(lambda: all(s.stats()["in_flight"] == 0 for s in sims), 30, "the simulators to be idle")
    collect(sims, archive, seen)

    def ledger_rows() -> list[dict]:
        con = sqlite3.connect(gw.store_url.removeprefix("sqlite://"))
        con.row_factory = sqlite3.Row
        try:
            return [dict(r) for r in con.execute("SELECT * FROM ledger WHERE kind = 'request'")]
        finally:
            con.close()

    # The ledger writer flushes in batches: poll (with a deadline) until every request an
    # upstream saw has its row; what is still missing then is reported below as unbilled.
    deadline = time.monotonic() + 15
    rows = ledger_rows()
    while time.monotonic() < deadline and not set(archive) <= {r["entry_id"] for r in rows}:
        time.sleep(0.1)
        rows = ledger_rows()
    mismatches = []
    expected = Decimal(0)
    recorded = Decimal(0)
    ledger_ids = {row["entry_id"] for row in rows}
    # Every request an upstream saw was admitted, so it must have its row, whatever its end.
    unbilled = sorted(rid for rid in archive if rid not in ledger_ids)
    for row in rows:
        rec = served(archive[row["entry_id"]]) if row["entry_id"] in archive else None
        recorded += Decimal(-row["delta"]) / Decimal(10**12)
        if rec is None:
            # Admitted but never reached an upstream (e.g. every replica failed): nothing to bill.
            if row["input_tokens"] or row["output_tokens"]:
                mismatches.append(
                    f"{row['entry_id']}: billed tokens but no upstream saw it: {row['model']} "
                    f"{row['status']} {row['http_status']} in={row['input_tokens']} out={row['output_tokens']}"
                )
            continue
        if rec["status"] == 200:
            want = (rec["prompt_tokens"], rec["cached_tokens"], rec["completion_tokens"])
        else:
            want = (0, 0, 0)
        got = (row["input_tokens"], row["cached_tokens"], row["output_tokens"])
        if got != want:
            mismatches.append(f"{row['entry_id']}: ledger {got} vs upstream {want} ({rec.get('finish_reason')}, cancelled={rec['cancelled']})")
        i, c, o = PRICES[row["model"]]
        expected += ((want[0] - want[1]) * i + want[1] * c + want[2] * o) / Decimal(1_000_000)
    reservations = gw.metric_value("quipu_reservations_open")
    report = {
        "seconds": seconds,
        "warmup_seconds": warmup,
        "requests_in_ledger": len(rows),
        "upstream_records": len(archive),
        "ledger_total": str(recorded),
        "recomputed_total": str(expected),
        "mismatches": mismatches[:20],
        "mismatch_count": len(mismatches),
        "upstream_requests_without_row": unbilled[:20],
        "unbilled_count": len(unbilled),
        "client_requests": done[0],
        "wrong_statuses": sorted({e: wrong_status.count(e) for e in wrong_status}.items())[:20],
        "wrong_status_count": len(wrong_status),
        "client_error_count": len(errors),
        "reservations_open": reservations,
        "rss_warm_kb": rss_warm,
        "rss_end_kb": rss_end,
        "rss_mid_kb": rss_mid,
        "rss_growth": (rss_end - rss_warm) / rss_warm if rss_warm else 0.0,
        # Growth over the second half of the window, relative to the warm size: a leak keeps
        # growing at the request rate; SQLite's page cache (2 MiB) and the allocator settle.
        "rss_steady_growth": (rss_end - rss_mid) / rss_warm if rss_warm else 0.0,
        "rss_samples_kb": [kb for _, kb in rss_samples[:: max(1, len(rss_samples) // 40)]],
        "client_errors": sorted({e: errors.count(e) for e in errors}.items())[:10],
    }
    code = gw.stop()
    report["exit_code"] = code
    for s in sims:
        s.stop()
    return report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--warmup-seconds", type=float, default=120)
    args = ap.parse_args()
    report = run(args.minutes * 60, scratch_dir(), args.threads, args.warmup_seconds)
    print(json.dumps(report, indent=2))
    ok = (
        report["mismatch_count"] == 0
        and report["unbilled_count"] == 0
        and report["wrong_status_count"] == 0
        and report["client_error_count"] == 0
        and Decimal(report["ledger_total"]) == Decimal(report["recomputed_total"])
        and report["reservations_open"] == 0
        and report["rss_growth"] < 0.05
        and report["rss_steady_growth"] < 0.02
        and report["exit_code"] == 0
    )
    print("SOAK PASSED" if ok else "SOAK FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
