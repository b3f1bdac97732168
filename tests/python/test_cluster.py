"""In front of a cluster: failover, health, timeouts, faults mid-stream, client disconnects,
rate limits, prefix-cache-aware routing, graceful shutdown and graceful upgrades."""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import json
import os
import signal
import socket
import sqlite3
import threading
import time
from decimal import Decimal

import anthropic
import openai
import pytest

from harness import Gateway, Sim, http_json, sse_events, wait_until


def chat(gw, key, content, **kw):
    return http_json(
        "POST",
        gw.base + "/v1/chat/completions",
        {"model": "colibri", "messages": [{"role": "user", "content": content}], **kw},
        {"Authorization": f"Bearer {key}"},
        timeout=60,
    )


@pytest.fixture
def trio(workdir):
    sims = [Sim(workdir, name=f"sim-r{i}").start() for i in range(3)]
    gw = Gateway(
        workdir, {"colibri": [s.api_base for s in sims]}, name="quipu-trio",
        model_extra='routing = "least_loaded"',
    ).start()
    _, key = gw.new_tenant("cluster")
    yield gw, sims, key
    gw.stop()
    for s in sims:
        s.stop()


def test_a_replica_killed_mid_load_costs_no_new_request(trio):
    gw, sims, key = trio
    results: list[tuple[float, int]] = []
    errors: list[str] = []
    stop = threading.Event()

    def load():
        while not stop.is_set():
            t = time.time()
            try:
                status, _, _ = chat(gw, key, "hola [[sim: tokens=3 delay_ms=5]]")
            except Exception as e:  # noqa: BLE001 - recorded, asserted below
                errors.append(f"{type(e).__name__}: {e}")
                continue
            results.append((t, status))

    threads = [threading.Thread(target=load) for _ in range(6)]
    for t in threads:
        t.start()
    wait_until(lambda: len(results) >= 50, 15, "the load under way")
    killed_at = time.time()
    sims[1].stop(signal.SIGKILL)
    # The load goes on until the health checks have found the replica gone (the window where
    # requests still meet it), and for 50 requests at least.
    wait_until(lambda: gw.metric_value("quipu_upstream_healthy", replica=sims[1].api_base) == 0
               and sum(1 for t, _ in list(results) if t > killed_at + 0.05) > 50, 15,
               "the killed replica marked down, under load")
    stop.set()
    for t in threads:
        t.join()
    assert not errors, f"client errors under load: {errors[:5]}"
    after = [s for t, s in results if t > killed_at + 0.05]
    assert len(after) > 50
    assert all(s == 200 for s in after), f"failures after the kill: {[s for s in after if s != 200]}"
    assert gw.metric_value("quipu_upstream_healthy", replica=sims[1].api_base) == 0


def test_a_restarted_replica_rejoins(trio):
    gw, sims, key = trio
    sims[2].stop(signal.SIGKILL)
    wait_until(lambda: gw.metric_value("quipu_upstream_healthy", replica=sims[2].api_base) == 0, 5)
    for _ in range(5):
        assert chat(gw, key, "x [[sim: tokens=1]]")[0] == 200
    sims[2].start()
    wait_until(lambda: gw.metric_value("quipu_upstream_healthy", replica=sims[2].api_base) == 1, 10)
    for _ in range(30):
        chat(gw, key, "x [[sim: tokens=1]]")
    assert sims[2].stats()["requests"] > 0, "the restarted replica gets traffic again"


def test_unhealthy_everywhere_is_overloaded_with_retry_after(trio):
    gw, sims, key = trio
    for s in sims:
        s.set_healthy(False)
    wait_until(lambda: gw.metric_value("quipu_upstream_healthy", model="colibri") == 0, 5)
    status, body, headers = chat(gw, key, "hola")
    assert status == 503 and body["error"]["code"] == "upstream_unavailable"
    assert headers.get("retry-after")
    a = anthropic.Anthropic(base_url=gw.base, api_key=key, max_retries=0)
    with pytest.raises(anthropic.OverloadedError):
        a.messages.create(model="colibri", max_tokens=10, messages=[{"role": "user", "content": "hola"}])
    for s in sims:
        s.set_healthy(True)


@pytest.fixture(scope="module")
def strict(workdir):
    """Short timeouts: connect 500 ms, first byte 800 ms, idle 800 ms."""
    sim = Sim(workdir, name="sim-strict").start()
    gw = Gateway(
        workdir, {"colibri": [sim.api_base]}, name="quipu-strict",
        model_extra="timeouts = { connect_ms = 500, first_byte_ms = 800, idle_ms = 800, request_ms = 800 }",
    ).start()
    _, key = gw.new_tenant("strict")
    yield gw, sim, key
    gw.stop()
    sim.stop()


def test_slow_replica_times_out_in_the_right_shape(strict):
    gw, _, key = strict
    status, body, _ = chat(gw, key, "[[sim: ttfb_ms=3000]]", stream=True)
    assert status == 504 and body["error"]["code"] == "upstream_timeout"
    status, body, _ = chat(gw, key, "[[sim: ttfb_ms=3000]]")
    assert status == 504
    status, body, _ = http_json(
        "POST", gw.base + "/v1/messages",
        {"model": "colibri", "max_tokens": 20, "messages": [{"role": "user", "content": "[[sim: ttfb_ms=3000]]"}]},
        {"x-api-key": key},
    )
    assert status == 504 and body["error"]["type"] == "timeout_error"


def raw_sse(gw, path, body, headers):
    conn = socket.create_connection(("127.0.0.1", gw.port), timeout=30)
    payload = json.dumps(body).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    conn.sendall(head.encode() + payload)
    return conn


def read_all(conn) -> str:
    """Reads one HTTP/1.1 response; returns the status line and the de-chunked body."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        b = conn.recv(65536)
        if not b:
            break
        buf += b
    head, _, rest = buf.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n")[0].decode()
    chunked = b"transfer-encoding: chunked" in head.lower()
    body = b""
    if chunked:
        while True:
            while b"\r\n" not in rest:
                b = conn.recv(65536)
                if not b:
                    return status_line + "\n" + body.decode(errors="replace")
                rest += b
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            while len(rest) < size + 2:
                b = conn.recv(65536)
                if not b:
                    return status_line + "\n" + (body + rest).decode(errors="replace")
                rest += b
            if size == 0:
                break
            body += rest[:size]
            rest = rest[size + 2 :]
    else:
        lengths = [int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")]
        while not lengths or len(rest) < lengths[0]:
            b = conn.recv(65536)
            if not b:
                break
            rest += b
        body = rest
    return status_line + "\n" + body.decode(errors="replace")


def test_stalled_stream_ends_with_an_error_frame(strict):
    gw, _, key = strict
    text = read_all(raw_sse(gw, "/v1/chat/completions", {
        "model": "colibri", "stream": True,
        "messages": [{"role": "user", "content": "[[sim: tokens=5 delay_ms=2000]]"}]},
        {"Authorization": f"Bearer {key}"}))
    assert "200 OK" in text.split("\n")[0]
    assert '"upstream_timeout"' in text and "data: [DONE]" in text


@pytest.mark.parametrize("fault", ["garbage_after=2", "reset_after=2", "fail_after=2"])
def test_broken_streams_end_with_an_error_in_each_format(gw, tenant, fault):
    _, key = tenant
    c = openai.OpenAI(base_url=gw.base + "/v1", api_key=key, max_retries=0)
    with pytest.raises(openai.APIError):
        for _ in c.chat.completions.create(
            model="colibri", messages=[{"role": "user", "content": f"[[sim: tokens=10 {fault}]]"}], stream=True
        ):
            pass
    conn = raw_sse(gw, "/v1/messages", {
        "model": "colibri", "max_tokens": 50, "stream": True,
        "messages": [{"role": "user", "content": f"[[sim: tokens=10 {fault}]]"}]},
        {"x-api-key": key, "anthropic-version": "2023-06-01"})
    status_line, _, body = read_all(conn).partition("\n")
    assert "200" in status_line
    events = [e for e, _ in sse_events(body)]
    assert events[0] == "message_start" and events[-1] == "error", events
    assert "message_stop" not in events


def test_client_disconnect_cancels_upstream_and_bills_partial_tokens(gw, sim, tenant):
    _, key = tenant
    since = sim.stats()["seq"]
    conn = raw_sse(gw, "/v1/chat/completions", {
        "model": "colibri", "stream": True,
        "messages": [{"role": "user", "content": "[[sim: tokens=60 delay_ms=100]]"}]},
        {"Authorization": f"Bearer {key}"})
    got = b""
    while got.count(b"data: ") < 6:
        got += conn.recv(4096)
    closed_at = time.time()
    conn.close()

    def cancelled():
        recs = [r for r in sim.requests(since) if r["request_id"]]
        return recs and recs[-1]["ended_ms"] > 0 and recs[-1]

    wait_until(cancelled, 5, "the simulator to see the cancel")
    rec = cancelled()
    assert rec["cancelled"]
    noticed = rec["ended_ms"] / 1000 - closed_at
    assert noticed < 0.1, f"upstream noticed the cancel after {noticed * 1000:.0f} ms"
    rid = rec["request_id"]
    db = gw.store_url.removeprefix("sqlite://")

    def row():
        con = sqlite3.connect(db)
        r = con.execute("SELECT output_tokens, status FROM ledger WHERE entry_id = ?", (rid,)).fetchone()
        con.close()
        return r

    wait_until(row, 5, "the ledger row")
    out, status = row()
    assert status == "client_disconnected"
    assert 4 <= out < 60, out


def clear_of_window_edge(gw, margin: int = 5) -> None:
    """Rate windows are fixed 60 s periods of the gateway's clock: on a long-running gateway a
    test could straddle two. A throwaway key limited to one request a minute learns, from its
    429's `retry-after`, how long the current window has left; close to its end, wait it out."""
    _, probe = gw.new_tenant(f"window-probe-{time.monotonic_ns()}", rpm=1)
    for _ in range(3):  # a third try only if the first two straddled a window edge
        status, _, headers = chat(gw, probe, "x [[sim: tokens=1]]")
        if status == 429:
            break
    assert status == 429, "the probe key must be limited after one request"
    left = int(headers["retry-after"])
    if left <= margin:
        time.sleep(left + 0.5)  # time passing is the point: the window must end


def test_rate_limit_per_key(gw):
    _, limited = gw.new_tenant("limited", rpm=3)
    clear_of_window_edge(gw)
    _, other = gw.new_tenant("unlimited")
    for _ in range(3):
        assert chat(gw, limited, "x [[sim: tokens=1]]")[0] == 200
    status, body, headers = chat(gw, limited, "x [[sim: tokens=1]]")
    assert status == 429 and body["error"]["code"] == "rate_limit_exceeded"
    assert 1 <= int(headers["retry-after"]) <= 60
    status, body, headers = http_json(
        "POST", gw.base + "/v1/messages",
        {"model": "colibri", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
        {"x-api-key": limited},
    )
    assert status == 429 and body["error"]["type"] == "rate_limit_error" and headers.get("retry-after")
    assert chat(gw, other, "x [[sim: tokens=1]]")[0] == 200, "other keys are unaffected"


def cached_share(gw, key, conversations=5, turns=6) -> float:
    """A multi-turn workload: each conversation has its own long system prompt."""
    c = openai.OpenAI(base_url=gw.base + "/v1", api_key=key, max_retries=0)
    prompt = cached = 0
    histories = [
        [{"role": "system", "content": f"Conversación {k}. " + " ".join(f"regla{k}_{i}" for i in range(400))}]
        for k in range(conversations)
    ]
    for turn in range(turns):
        for h in histories:
            h.append({"role": "user", "content": f"turno {turn}: " + "detalle " * 40 + "[[sim: tokens=30]]"})
            r = c.chat.completions.create(model="colibri", messages=h)
            prompt += r.usage.prompt_tokens
            cached += r.usage.prompt_tokens_details.cached_tokens
            h.append({"role": "assistant", "content": r.choices[0].message.content})
    return cached / prompt


def test_prefix_affinity_beats_round_robin(workdir, capsys):
    shares, bills = {}, {}
    for routing in ("prefix_affinity", "round_robin"):
        sims = [Sim(workdir, name=f"sim-{routing}-{i}").start() for i in range(2)]
        gw = Gateway(
            workdir, {"colibri": [s.api_base for s in sims]}, name=f"quipu-{routing}",
            model_extra=f'routing = "{routing}"',
        ).start()
        _, key = gw.new_tenant("affinity")
        shares[routing] = cached_share(gw, key)
        gw.stop()  # writes the ledger
        bills[routing] = Decimal(gw.cli("statement", "--tenant", "affinity")["totals"]["charges"])
        for s in sims:
            s.stop()
    with capsys.disabled():
        print(
            f"\ncached-token share, 2 replicas, 5 conversations x 6 turns: "
            f"prefix affinity {shares['prefix_affinity']:.1%}, round robin {shares['round_robin']:.1%}; "
            f"the same workload billed S/ {bills['prefix_affinity']} with affinity, "
            f"S/ {bills['round_robin']} round robin"
        )
    assert shares["prefix_affinity"] > 0.75
    assert shares["prefix_affinity"] > shares["round_robin"] + 0.15
    assert bills["prefix_affinity"] < bills["round_robin"], bills


def stream_tokens(text: str) -> tuple[str, int, bool]:
    """(status line, content chunks, ended with [DONE]) of a raw chat-format SSE response."""
    status_line, _, body = text.partition("\n")
    n = 0
    for _, data in sse_events(body):
        if data == "[DONE]":
            continue
        try:
            chunk = json.loads(data)
        except ValueError:
            continue
        for c in chunk.get("choices") or []:
            if (c.get("delta") or {}).get("content"):
                n += 1
    return status_line, n, body.rstrip().endswith("data: [DONE]")


def test_graceful_upgrade_keeps_a_stream_and_every_request(workdir):
    sim = Sim(workdir, name="sim-upgrade").start()
    old = Gateway(workdir, {"colibri": [sim.api_base]}, name="quipu-upgrade").start()
    _, key = old.new_tenant("upgrade")
    stream_text: dict = {}
    errors: list[str] = []

    def long_stream():
        try:
            conn = raw_sse(old, "/v1/chat/completions", {
                "model": "colibri", "stream": True,
                "messages": [{"role": "user", "content": "[[sim: tokens=40 delay_ms=150]]"}]},
                {"Authorization": f"Bearer {key}"})
            stream_text["text"] = read_all(conn)
        except Exception as e:  # noqa: BLE001 - recorded, asserted below
            errors.append(f"stream: {type(e).__name__}: {e}")

    received = sim.stats()["requests"]
    t = threading.Thread(target=long_stream)
    t.start()
    wait_until(lambda: sim.stats()["requests"] > received, 5, "the long stream upstream")
    statuses: list[int] = []
    stop = threading.Event()

    def steady():
        while not stop.is_set():
            try:
                statuses.append(chat(old, key, "x [[sim: tokens=2]]")[0])
            except Exception as e:  # noqa: BLE001 - recorded, asserted below
                errors.append(f"steady: {type(e).__name__}: {e}")
            time.sleep(0.02)  # the load's pace

    s = threading.Thread(target=steady)
    s.start()
    new = Gateway.__new__(Gateway)
    new.__dict__.update(old.__dict__)
    new.name = "quipu-upgrade-new"
    assert not os.path.exists(old.upgrade_sock), old.upgrade_sock
    new.start("--upgrade", wait=False)
    wait_until(lambda: os.path.exists(old.upgrade_sock), 10, "the new process's hand-over socket")
    old.process.send_signal(signal.SIGQUIT)
    t.join(30)
    # The old process exits once its stream is done; requests keep flowing to the new one.
    assert old.process.proc.wait(30) == 0
    wait_until(lambda: new.metric_value("quipu_requests_total", model="colibri") >= 20, 10,
               "the new process to serve the steady requests")
    stop.set()
    s.join()
    assert not errors, errors
    status_line, tokens, done = stream_tokens(stream_text["text"])
    assert "200" in status_line and tokens == 40 and done, stream_text["text"][-500:]
    assert len(statuses) > 50, f"only {len(statuses)} requests during the upgrade"
    assert all(x == 200 for x in statuses), [x for x in statuses if x != 200]
    assert chat(new, key, "after [[sim: tokens=2]]")[0] == 200
    new.stop()
    sim.stop()


def refused(gw) -> bool:
    """Whether a new connection to the gateway gets no answer (refused, reset or closed)."""
    try:
        s = socket.create_connection(("127.0.0.1", gw.port), timeout=1)
    except OSError:
        return True
    try:
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        return s.recv(1024) == b""
    except OSError:
        return True
    finally:
        s.close()


def test_sigterm_finishes_every_stream_and_refuses_new_connections(workdir):
    sim = Sim(workdir, name="sim-term").start()
    gw = Gateway(workdir, {"colibri": [sim.api_base]}, name="quipu-term").start()
    _, key = gw.new_tenant("term")
    texts: dict[int, str] = {}
    errors: list[str] = []

    def one_stream(i):
        try:
            conn = raw_sse(gw, "/v1/chat/completions", {
                "model": "colibri", "stream": True,
                "messages": [{"role": "user", "content": f"{i} [[sim: tokens=20 delay_ms=100]]"}]},
                {"Authorization": f"Bearer {key}"})
            texts[i] = read_all(conn)
        except Exception as e:  # noqa: BLE001 - recorded, asserted below
            errors.append(f"stream {i}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=one_stream, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    wait_until(lambda: sim.stats()["in_flight"] == 6, 5, "six streams under way")
    wait_until(lambda: gw.metric_value("quipu_client_connections") == 6, 5, "only the streams' connections")
    # A catalog request whose head is only half sent when the signal arrives.
    half = socket.create_connection(("127.0.0.1", gw.port), timeout=10)
    half.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n")
    wait_until(lambda: gw.metric_value("quipu_client_connections") == 7, 5, "the half-sent request accepted")
    signalled = time.time()
    gw.process.send_signal(signal.SIGTERM)
    wait_until(lambda: refused(gw), 2, "new connections to be refused")
    half.sendall(b"\r\n")
    answer = read_all(half)
    half.close()
    assert answer.startswith("HTTP/1.1 200"), answer[:200]
    assert '"models"' in answer
    for t in threads:
        t.join(30)
    code = gw.process.proc.wait(15)
    exited = time.time() - signalled
    assert code == 0
    assert not errors, errors
    for i in range(6):
        status_line, tokens, done = stream_tokens(texts[i])
        assert "200" in status_line and tokens == 20 and done, (i, texts[i][-300:])
    assert refused(gw)
    # It exits when the streams are done, not at the end of the 30 s grace period.
    assert exited < 8, f"exited {exited:.1f} s after SIGTERM"
    con = sqlite3.connect(gw.store_url.removeprefix("sqlite://"))
    rows = con.execute("SELECT status, output_tokens FROM ledger WHERE kind = 'request'").fetchall()
    con.close()
    assert sorted(rows) == [("ok", 20)] * 6, rows
    sim.stop()


def test_an_overloaded_replica_is_failed_over_and_its_gauge_recovers(workdir):
    sims = [Sim(workdir, name=f"sim-503-{i}").start() for i in range(2)]
    gw = Gateway(
        workdir, {"colibri": [s.api_base for s in sims]}, name="quipu-503",
        model_extra='routing = "round_robin"',
    ).start()
    try:
        _, key = gw.new_tenant("failover")
        sims[0].set_fault(503)
        bad = sims[0].api_base
        results = []
        gauge_seen = set()
        for i in range(24):
            if i % 3 == 0:
                results.append(chat(gw, key, f"{i} [[sim: tokens=2]]")[0])
            elif i % 3 == 1:
                conn = raw_sse(gw, "/v1/chat/completions", {
                    "model": "colibri", "stream": True,
                    "messages": [{"role": "user", "content": f"{i} [[sim: tokens=3]]"}]},
                    {"Authorization": f"Bearer {key}"})
                status_line, tokens, done = stream_tokens(read_all(conn))
                results.append(200 if "200" in status_line and tokens == 3 and done else status_line)
            else:
                results.append(http_json(
                    "POST", gw.base + "/v1/messages",
                    {"model": "colibri", "max_tokens": 10,
                     "messages": [{"role": "user", "content": f"{i} [[sim: tokens=2]]"}]},
                    {"x-api-key": key})[0])
            gauge_seen.add(gw.metric_value("quipu_upstream_healthy", replica=bad))
        assert results == [200] * 24, results
        answered_503 = [r for r in sims[0].requests() if r["request_id"]]
        assert answered_503 and all(r["status"] == 503 for r in answered_503)
        served = {r["request_id"] for r in sims[1].requests() if r["status"] == 200}
        assert {r["request_id"] for r in answered_503} <= served, "each 503 was retried elsewhere"
        assert gw.metric_value("quipu_upstream_retries_total", model="colibri") >= len(answered_503)
        assert 0 in gauge_seen, "the failing replica was ejected"
        # The ejection ends by itself: the gauge comes back without any traffic.
        wait_until(lambda: gw.metric_value("quipu_upstream_healthy", replica=bad) == 1, 5,
                   "the gauge to recover after the ejection")
    finally:
        gw.stop()
        for s in sims:
            s.stop()


def test_no_retry_once_bytes_reached_the_client(workdir):
    sims = [Sim(workdir, name=f"sim-noretry-{i}").start() for i in range(2)]
    gw = Gateway(
        workdir, {"colibri": [s.api_base for s in sims]}, name="quipu-noretry",
        model_extra='routing = "round_robin"',
    ).start()
    try:
        _, key = gw.new_tenant("noretry")
        for fault in ("reset_after=3", "fail_after=3"):
            for path, headers, body in (
                ("/v1/chat/completions", {"Authorization": f"Bearer {key}"},
                 {"model": "colibri", "stream": True}),
                ("/v1/messages", {"x-api-key": key}, {"model": "colibri", "stream": True, "max_tokens": 50}),
            ):
                before = {s.port: len(s.requests()) for s in sims}
                conn = raw_sse(gw, path, {**body, "messages": [
                    {"role": "user", "content": f"{fault} [[sim: tokens=10 {fault}]]"}]}, headers)
                text = read_all(conn)
                status_line, _, rest = text.partition("\n")
                assert "200" in status_line, text[:300]
                assert "error" in rest, rest[-300:]
                # A retry would be made before the request finishes, and logged by a simulator
                # once it is done with it.
                gw.wait_idle()
                wait_until(lambda: all(s.stats()["in_flight"] == 0 for s in sims), 5, "the simulators idle")
                after = {s.port: len(s.requests()) for s in sims}
                attempts = sum(after[p] - before[p] for p in after)
                assert attempts == 1, f"{fault} on {path}: {attempts} upstream attempts"
    finally:
        gw.stop()
        for s in sims:
            s.stop()


def test_timeouts_are_one_deadline_per_phase(strict):
    """first_byte_ms and request_ms are 800 ms: a header at 500 ms and the rest at 1000 ms is
    too late, although neither wait alone passes 800 ms."""
    gw, _, key = strict
    t = time.time()
    status, body, _ = chat(gw, key, "[[sim: ttfb_ms=500 body_ms=500 tokens=2]]")
    assert status == 504 and body["error"]["code"] == "upstream_timeout", body
    assert time.time() - t < 1.0
    t = time.time()
    status, body, _ = chat(gw, key, "[[sim: ttfb_ms=500 prefill_ms=500 tokens=2]]", stream=True)
    assert status == 504 and body["error"]["code"] == "upstream_timeout", body
    assert time.time() - t < 1.0
    # Each alone within the deadline is fine.
    assert chat(gw, key, "[[sim: ttfb_ms=200 body_ms=200 tokens=2]]")[0] == 200
    assert chat(gw, key, "[[sim: ttfb_ms=200 prefill_ms=200 tokens=2]]", stream=True)[0] == 200


def test_count_tokens_has_a_deadline(strict):
    gw, _, key = strict
    t = time.time()
    status, body, _ = http_json(
        "POST", gw.base + "/v1/messages/count_tokens",
        {"model": "colibri", "messages": [{"role": "user", "content": "hola [[sim: ttfb_ms=5000]]"}]},
        {"x-api-key": key},
    )
    assert status == 504 and body["error"]["type"] == "timeout_error", body
    assert time.time() - t < 1.5


def test_count_tokens_stops_when_its_client_leaves(gw, tenant):
    _, key = tenant

    def left():
        return gw.metric_value("quipu_client_disconnects_total", route="count_tokens")

    before = left()
    upstream = lambda: gw.metric_value("quipu_upstream_in_flight", model="colibri")  # noqa: E731
    busy = upstream()
    conn = raw_sse(gw, "/v1/messages/count_tokens", {
        "model": "colibri", "messages": [{"role": "user", "content": "hola [[sim: ttfb_ms=5000]]"}]},
        {"x-api-key": key})
    wait_until(lambda: upstream() > busy, 5, "the count to be waiting on the upstream")
    conn.close()
    wait_until(lambda: left() == before + 1, 2, "the gateway to notice the client left")


def test_no_pings_before_the_upstream_answers_so_errors_keep_their_status(gw, tenant):
    """An upstream that takes longer than the ping interval to answer 500: the client gets a
    real HTTP error, not a 200 stream with pings and an error frame."""
    _, key = tenant
    t = time.time()
    conn = raw_sse(gw, "/v1/messages", {
        "model": "colibri", "max_tokens": 50, "stream": True,
        "messages": [{"role": "user", "content": "[[sim: ttfb_ms=2500 status=500]]"}]},
        {"x-api-key": key, "anthropic-version": "2023-06-01"})
    text = read_all(conn)
    status_line, _, body = text.partition("\n")
    assert time.time() - t >= 2.4
    assert "502" in status_line, text[:300]
    assert "ping" not in body
    assert json.loads(body)["error"]["type"] == "api_error"


def tokens_of(fmt: str, body: dict) -> int:
    if fmt == "chat":
        return body["usage"]["total_tokens"]
    u = body["usage"]
    return u["input_tokens"] + u.get("cache_read_input_tokens", 0) + u["output_tokens"]


def ask(gw, fmt: str, key: str, text: str):
    if fmt == "chat":
        return chat(gw, key, text)
    return http_json(
        "POST", gw.base + "/v1/messages",
        {"model": "colibri", "max_tokens": 100, "messages": [{"role": "user", "content": text}]},
        {"x-api-key": key, "anthropic-version": "2023-06-01"}, timeout=60,
    )


def assert_limited(gw, key: str, scope: str, limit: str):
    """The next request of `key` is refused in both formats, with retry-after."""
    status, body, headers = ask(gw, "chat", key, "x [[sim: tokens=1]]")
    assert status == 429 and body["error"]["code"] == "rate_limit_exceeded", body
    assert body["error"]["type"] == "rate_limit_error"
    assert f"{limit} per minute for this {scope}" in body["error"]["message"], body
    assert 1 <= int(headers["retry-after"]) <= 60
    status, body, headers = ask(gw, "messages", key, "x [[sim: tokens=1]]")
    assert status == 429 and body["type"] == "error" and body["error"]["type"] == "rate_limit_error", body
    assert 1 <= int(headers["retry-after"]) <= 60


_limited = itertools.count()


@pytest.fixture
def limited_gateway(workdir, sim):
    """Gateways with `[limits]`, fresh so that the test runs early in its first window."""
    made = []

    def make(limits: str):
        g = Gateway(workdir, {"colibri": [sim.api_base]}, name=f"quipu-limits-{next(_limited)}",
                    extra=f"\n[limits]\n{limits}\n").start()
        made.append(g)
        return g

    yield make
    for g in made:
        g.stop()


def test_rate_limit_per_tenant_requests(limited_gateway):
    gw = limited_gateway("tenant_requests_per_minute = 4")
    _, k1 = gw.new_tenant("busy")
    k2 = gw.cli("key", "create", "--tenant", "busy")["secret"]
    gw.wait_key(k2)
    _, other = gw.new_tenant("quiet")
    # Four requests across the tenant's two keys, in both formats.
    for i, k in enumerate([k1, k2, k1, k2]):
        assert ask(gw, ("chat", "messages")[i % 2], k, "x [[sim: tokens=1]]")[0] == 200
    assert_limited(gw, k1, "tenant", "requests")
    assert_limited(gw, k2, "tenant", "requests")
    assert ask(gw, "chat", other, "x [[sim: tokens=1]]")[0] == 200, "other tenants are unaffected"


def spend_tokens(gw, key: str, limit: int, fmt_cycle=("chat", "messages")) -> int:
    """Sends requests until the window holds at least `limit` tokens; returns the total."""
    used = 0
    i = 0
    while used < limit:
        fmt = fmt_cycle[i % len(fmt_cycle)]
        status, body, _ = ask(gw, fmt, key, f"{i} [[sim: tokens=20]]")
        assert status == 200, f"refused with {used} of {limit} tokens used: {body}"
        used += tokens_of(fmt, body)
        i += 1
    return used


def test_rate_limit_per_key_tokens(limited_gateway):
    gw = limited_gateway("key_tokens_per_minute = 0")
    _, limited = gw.new_tenant("tpm-key", tpm=100)
    _, other = gw.new_tenant("tpm-other")
    spend_tokens(gw, limited, 100)
    assert_limited(gw, limited, "key", "tokens")
    assert ask(gw, "chat", other, "x [[sim: tokens=1]]")[0] == 200, "other keys are unaffected"


def test_rate_limit_per_tenant_tokens(limited_gateway):
    gw = limited_gateway("tenant_tokens_per_minute = 150")
    _, k1 = gw.new_tenant("tokens")
    k2 = gw.cli("key", "create", "--tenant", "tokens")["secret"]
    gw.wait_key(k2)
    _, other = gw.new_tenant("tokens-other")
    used = 0
    i = 0
    while used < 150:
        k = (k1, k2)[i % 2]
        status, body, _ = ask(gw, "chat", k, f"{i} [[sim: tokens=20]]")
        assert status == 200, f"refused with {used} of 150 tokens used: {body}"
        used += tokens_of("chat", body)
        i += 1
    assert_limited(gw, k1, "tenant", "tokens")
    assert_limited(gw, k2, "tenant", "tokens")
    assert ask(gw, "messages", other, "x [[sim: tokens=1]]")[0] == 200, "other tenants are unaffected"


def test_upstream_connections_are_reused_after_streams(workdir):
    """A finished stream's upstream body is read to its end, so the connection goes back to the
    pool: sequential requests of every kind, streamed or not, share one upstream connection
    instead of opening one each (a TCP handshake and a new vLLM connection per stream)."""
    sim = Sim(workdir, name="sim-reuse").start()
    gw = Gateway(workdir, {"colibri": [sim.api_base]}, name="quipu-reuse").start()
    _, key = gw.new_tenant("reuse")
    since = sim.stats()["seq"]
    c = openai.OpenAI(base_url=gw.base + "/v1", api_key=key, max_retries=0)
    m = anthropic.Anthropic(base_url=gw.base, api_key=key, max_retries=0)
    for i in range(4):
        for _ in c.chat.completions.create(
            model="colibri", stream=True, messages=[{"role": "user", "content": f"{i} [[sim: tokens=30]]"}]
        ):
            pass
        with m.messages.stream(model="colibri", max_tokens=50,
                               messages=[{"role": "user", "content": f"{i} [[sim: tokens=30]]"}]) as s:
            s.get_final_message()
        c.chat.completions.create(model="colibri", messages=[{"role": "user", "content": f"{i} [[sim: tokens=3]]"}])
    recs = [r for r in sim.requests(since) if r["request_id"]]
    gw.stop()
    sim.stop()
    assert len(recs) == 12, len(recs)
    peers = {r["peer"] for r in recs}
    # Sequential requests: one connection does (the key check before the loop may add one).
    assert len(peers) <= 2, f"{len(peers)} upstream connections for 12 sequential requests: {sorted(peers)}"
