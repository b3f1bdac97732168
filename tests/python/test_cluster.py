"""In front of a cluster: failover, health, timeouts, faults mid-stream, client disconnects,
rate limits, prefix-cache-aware routing and graceful upgrades."""

from __future__ import annotations

import concurrent.futures as cf
import json
import signal
import socket
import sqlite3
import threading
import time

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
    stop = threading.Event()

    def load():
        while not stop.is_set():
            t = time.time()
            status, _, _ = chat(gw, key, "hola [[sim: tokens=3 delay_ms=5]]")
            results.append((t, status))

    threads = [threading.Thread(target=load) for _ in range(6)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    killed_at = time.time()
    sims[1].stop(signal.SIGKILL)
    time.sleep(2.0)
    stop.set()
    for t in threads:
        t.join()
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
        while True:
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


def test_rate_limit_per_key(gw):
    _, limited = gw.new_tenant("limited", rpm=3)
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
    shares = {}
    for routing in ("prefix_affinity", "round_robin"):
        sims = [Sim(workdir, name=f"sim-{routing}-{i}").start() for i in range(2)]
        gw = Gateway(
            workdir, {"colibri": [s.api_base for s in sims]}, name=f"quipu-{routing}",
            model_extra=f'routing = "{routing}"',
        ).start()
        _, key = gw.new_tenant("affinity")
        shares[routing] = cached_share(gw, key)
        gw.stop()
        for s in sims:
            s.stop()
    with capsys.disabled():
        print(
            f"\ncached-token share, 2 replicas, 5 conversations x 6 turns: "
            f"prefix affinity {shares['prefix_affinity']:.1%}, round robin {shares['round_robin']:.1%}"
        )
    assert shares["prefix_affinity"] > 0.75
    assert shares["prefix_affinity"] > shares["round_robin"] + 0.15


def test_graceful_upgrade_keeps_a_stream_and_every_request(workdir):
    sim = Sim(workdir, name="sim-upgrade").start()
    old = Gateway(workdir, {"colibri": [sim.api_base]}, name="quipu-upgrade").start()
    _, key = old.new_tenant("upgrade")
    stream_text: dict = {}

    def long_stream():
        conn = raw_sse(old, "/v1/chat/completions", {
            "model": "colibri", "stream": True,
            "messages": [{"role": "user", "content": "[[sim: tokens=40 delay_ms=150]]"}]},
            {"Authorization": f"Bearer {key}"})
        stream_text["text"] = read_all(conn)

    t = threading.Thread(target=long_stream)
    t.start()
    time.sleep(0.5)
    statuses: list[int] = []
    stop = threading.Event()

    def steady():
        while not stop.is_set():
            statuses.append(chat(old, key, "x [[sim: tokens=2]]")[0])
            time.sleep(0.02)

    s = threading.Thread(target=steady)
    s.start()
    new = Gateway.__new__(Gateway)
    new.__dict__.update(old.__dict__)
    new.name = "quipu-upgrade-new"
    new.start("--upgrade", wait=False)
    time.sleep(0.5)
    old.process.send_signal(signal.SIGQUIT)
    t.join(30)
    time.sleep(1.0)
    stop.set()
    s.join()
    assert old.process.proc.wait(30) == 0
    text = stream_text["text"]
    assert text.count("data: ") >= 40 and "data: [DONE]" in text, text[-500:]
    assert statuses and all(x == 200 for x in statuses), [x for x in statuses if x != 200]
    assert chat(new, key, "after [[sim: tokens=2]]")[0] == 200
    new.stop()
    sim.stop()
