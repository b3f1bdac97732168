"""A saturated model's queue, through the real gateway and a simulator with two slots
(`--max-num-seqs 2`, `max_concurrency = 2`): requests beyond the slots wait in Quipu, never in
the engine; a tenant that was idle goes before a busy tenant's backlog; a full queue and a wait
that timed out are answered 429 `queue_full` in each format's shape, charged nothing; a client
that hangs up while queued gets its reservation back at once; a streaming client that waits
gets its head and the format's keep-alive, then its answer (or an error event); a slot a light
tenant frees is kept for its next request, then given to the backlog.

Slots are held by streams the test keeps open (slow pacing) and frees by closing them, so every
dispatch is caused by the test, never by a timer."""

from __future__ import annotations

import concurrent.futures as cf
import json
import socket
import time
import uuid
from decimal import Decimal

import pytest

from harness import Gateway, Sim, http_json, wait_until

HOLD = "[[sim: tokens=10000 delay_ms=200]]"
SHORT = "[[sim: tokens=3]]"
QUEUE_TIMEOUT_MS = 4000


@pytest.fixture(scope="module")
def sched(workdir):
    sim = Sim(workdir, "--max-num-seqs", "2", name="sim-sched").start()
    gw = Gateway(
        workdir, {"colibri": [sim.api_base]}, name="quipu-sched", model_extra="max_concurrency = 2",
        extra=f"""
[scheduling]
tenant_queue_cap = 2
queue_timeout_ms = {QUEUE_TIMEOUT_MS}
batch_age_limit_ms = 1000
stream_head_after_ms = 300
load_interval_ms = 200
""",
    ).start()
    yield gw, sim
    gw.stop()
    sim.stop()


PATHS = {"chat": "/v1/chat/completions", "messages": "/v1/messages", "responses": "/v1/responses"}


def body_for(fmt: str, text: str, stream: bool) -> dict:
    if fmt == "responses":
        return {"model": "colibri", "input": text, "stream": stream, "store": False}
    b = {"model": "colibri", "messages": [{"role": "user", "content": text}], "stream": stream}
    if fmt == "messages":
        b["max_tokens"] = 64
    return b


class Held:
    """A request on its own connection, read as it comes; closed by the test."""

    def __init__(self, gw: Gateway, key: str, fmt: str = "chat", text: str = HOLD, stream: bool = True):
        self.sock = socket.create_connection(("127.0.0.1", gw.port), timeout=20)
        body = json.dumps(body_for(fmt, f"{uuid.uuid4().hex[:8]} {text}", stream)).encode()
        self.sock.sendall(
            f"POST {PATHS[fmt]} HTTP/1.1\r\nHost: q\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        self.buf = b""
        self.closed = False

    def pump(self, timeout: float = 0.05) -> bytes:
        self.sock.settimeout(timeout)
        try:
            chunk = self.sock.recv(65536)
            if not chunk:
                self.closed = True
            self.buf += chunk
        except socket.timeout:
            pass
        return self.buf

    def read_until(self, needle: bytes, timeout: float = 15) -> bytes:
        deadline = time.monotonic() + timeout
        while needle not in self.buf and time.monotonic() < deadline and not self.closed:
            self.pump(0.1)
        assert needle in self.buf, f"{needle!r} never came; got {self.buf[:600]!r}"
        return self.buf

    def close(self):
        self.sock.close()


def engine(sim: Sim) -> dict:
    return http_json("GET", sim.url + "/sim/engine")[1]


def depth(gw: Gateway) -> float:
    return gw.metric_value("quipu_queue_depth", model="colibri")


def account(gw: Gateway, key: str) -> dict:
    status, body, _ = http_json("GET", gw.base + "/v1/account", None, {"Authorization": f"Bearer {key}"})
    assert status == 200, body
    return body


def fill_slots(gw: Gateway, sim: Sim, key: str) -> list[Held]:
    """Both slots held by `key`'s streams, the engine running exactly them."""
    held = [Held(gw, key) for _ in range(2)]
    wait_until(lambda: engine(sim)["running"] == 2, 10, "both slots running")
    return held


def close_all(sim: Sim, gw: Gateway, held: list[Held]):
    for h in held:
        h.close()
    wait_until(lambda: engine(sim)["running"] == 0 and depth(gw) == 0, 15, "the pool to drain")


def test_requests_beyond_the_slots_wait_in_quipu_and_an_idle_tenant_goes_first(sched):
    gw, sim = sched
    _, a = gw.new_tenant(f"busy-{uuid.uuid4().hex[:6]}")
    _, b = gw.new_tenant(f"idle-{uuid.uuid4().hex[:6]}")
    held = fill_slots(gw, sim, a)
    backlog = [Held(gw, a) for _ in range(2)]
    wait_until(lambda: depth(gw) == 2, 10, "tenant A's backlog queued in Quipu")
    # Nothing waits inside the engine: its own queue stays empty.
    assert engine(sim)["waiting"] == 0
    quick = Held(gw, b, text=SHORT)
    wait_until(lambda: depth(gw) == 3, 10, "tenant B queued behind A's backlog")
    held[0].close()
    # The freed slot goes to B (idle until now), not to A's older backlog.
    quick.read_until(b"data: [DONE]")
    assert depth(gw) >= 1, "B jumped the queue only once a slot freed"
    assert engine(sim)["waiting"] == 0
    close_all(sim, gw, held[1:] + backlog + [quick])


@pytest.mark.parametrize("fmt", ["chat", "messages", "responses"])
def test_a_full_queue_is_429_queue_full_and_costs_nothing(sched, fmt):
    gw, sim = sched
    _, key = gw.new_tenant(f"full-{fmt}-{uuid.uuid4().hex[:6]}")
    held = fill_slots(gw, sim, key)
    backlog = [Held(gw, key) for _ in range(2)]
    wait_until(lambda: depth(gw) == 2, 10, "the tenant's queue full")
    rejected = gw.metric_value("quipu_queue_rejections_total", reason="tenant_queue_full")
    status, body, headers = http_json("POST", gw.base + PATHS[fmt], body_for(fmt, SHORT, False),
                                      {"Authorization": f"Bearer {key}"})
    assert status == 429, body
    assert int(headers.get("retry-after", "0")) >= 1
    if fmt == "messages":
        assert body["type"] == "error" and body["error"]["type"] == "rate_limit_error", body
    else:
        assert body["error"]["type"] == "rate_limit_error" and body["error"]["code"] == "queue_full", body
    assert gw.metric_value("quipu_queue_rejections_total", reason="tenant_queue_full") == rejected + 1
    close_all(sim, gw, held + backlog)
    # Nothing was charged for it: its ledger row is zero.
    refused = []

    def row_written():
        rows = http_json("GET", gw.base + "/v1/requests?limit=50", None,
                         {"Authorization": f"Bearer {key}"})[1]["data"]
        refused[:] = [r for r in rows if r["http_status"] == 429]
        return refused

    wait_until(row_written, 10, "the refused request's ledger row")
    assert len(refused) == 1 and Decimal(refused[0]["charge"]["exact"]) == 0, refused


def test_a_wait_past_the_queue_timeout_is_429_in_each_format(sched):
    gw, sim = sched
    # One tenant per format: each waits alone in its own queue (the cap is 2).
    keys = {fmt: gw.new_tenant(f"slow-{fmt}-{uuid.uuid4().hex[:6]}")[1] for fmt in PATHS}
    _, holder = gw.new_tenant(f"holder-{uuid.uuid4().hex[:6]}")
    held = fill_slots(gw, sim, holder)
    timeouts = gw.metric_value("quipu_queue_rejections_total", reason="timeout")

    def call(fmt):
        return http_json("POST", gw.base + PATHS[fmt], body_for(fmt, SHORT, False),
                         {"Authorization": f"Bearer {keys[fmt]}"}, timeout=30)

    with cf.ThreadPoolExecutor(3) as pool:
        results = dict(zip(PATHS, pool.map(call, PATHS)))
    for fmt, (status, body, headers) in results.items():
        assert status == 429, (fmt, body)
        assert "retry-after" in headers, fmt
        if fmt == "messages":
            assert body["error"]["type"] == "rate_limit_error", body
        else:
            assert body["error"]["code"] == "queue_full", body
    assert gw.metric_value("quipu_queue_rejections_total", reason="timeout") == timeouts + 3
    for key in keys.values():
        acct = account(gw, key)
        assert Decimal(acct["reserved"]["exact"]) == 0 and acct["requests_in_flight"] == 0
    close_all(sim, gw, held)


def test_a_client_that_hangs_up_while_queued_pays_nothing_and_its_reservation_is_back(sched):
    gw, sim = sched
    _, key = gw.new_tenant(f"gone-{uuid.uuid4().hex[:6]}")
    _, holder = gw.new_tenant(f"holder-{uuid.uuid4().hex[:6]}")
    held = fill_slots(gw, sim, holder)
    cancelled = gw.metric_value("quipu_queue_rejections_total", reason="cancelled")
    waiting = Held(gw, key, text=SHORT, stream=False)
    wait_until(lambda: depth(gw) == 1, 10, "the request queued")
    assert account(gw, key)["requests_in_flight"] == 1
    waiting.close()
    wait_until(lambda: depth(gw) == 0, 10, "the request to leave the queue")
    wait_until(lambda: account(gw, key)["requests_in_flight"] == 0, 10, "its reservation released")
    acct = account(gw, key)
    assert Decimal(acct["reserved"]["exact"]) == 0, acct
    assert gw.metric_value("quipu_queue_rejections_total", reason="cancelled") == cancelled + 1
    # It never reached the engine, and its ledger row charges nothing.
    rows = []
    wait_until(lambda: rows.extend(http_json("GET", gw.base + "/v1/requests", None,
                                             {"Authorization": f"Bearer {key}"})[1]["data"]) or rows,
               10, "its ledger row")
    assert [Decimal(r["charge"]["exact"]) for r in rows] == [0], rows
    assert engine(sim)["running"] == 2
    close_all(sim, gw, held)


@pytest.mark.parametrize("fmt,keepalive", [("chat", b": waiting for a slot"),
                                           ("messages", b"event: ping"),
                                           ("responses", b": waiting for a slot")])
def test_a_streaming_client_that_waits_gets_its_head_and_keep_alives_then_its_answer(sched, fmt, keepalive):
    gw, sim = sched
    _, key = gw.new_tenant(f"stream-{fmt}-{uuid.uuid4().hex[:6]}")
    _, holder = gw.new_tenant(f"holder-{uuid.uuid4().hex[:6]}")
    held = fill_slots(gw, sim, holder)
    waiting = Held(gw, key, fmt=fmt, text=SHORT)
    waiting.read_until(keepalive)
    assert waiting.buf.startswith(b"HTTP/1.1 200"), waiting.buf[:200]
    assert b"text/event-stream" in waiting.buf.split(b"\r\n\r\n")[0]
    held[0].close()
    end = {"chat": b"data: [DONE]", "messages": b"event: message_stop", "responses": b"response.completed"}[fmt]
    waiting.read_until(end)
    close_all(sim, gw, held[1:] + [waiting])


def test_a_stream_that_times_out_in_the_queue_ends_with_an_error_event(sched):
    gw, sim = sched
    _, key = gw.new_tenant(f"late-{uuid.uuid4().hex[:6]}")
    _, holder = gw.new_tenant(f"holder-{uuid.uuid4().hex[:6]}")
    held = fill_slots(gw, sim, holder)
    waiting = Held(gw, key, fmt="chat", text=SHORT)
    waiting.read_until(b": waiting for a slot")
    text = waiting.read_until(b"data: [DONE]", timeout=QUEUE_TIMEOUT_MS / 1000 + 10).decode()
    error = json.loads("{" + text.split("data: {", 1)[1].split("\n", 1)[0])
    assert error["error"]["code"] == "queue_full", error
    close_all(sim, gw, held + [waiting])


def test_a_slot_freed_by_a_light_tenant_waits_for_its_next_request(workdir):
    """Tenant B, one stream at a time, beside tenant A's backlog: B's freed slot is kept for
    B's next request (`return_hold_ms`, long here so that no timing decides the test), then
    goes to A's backlog when B does not come back."""
    sim = Sim(workdir, "--max-num-seqs", "2", name="sim-hold").start()
    gw = Gateway(workdir, {"colibri": [sim.api_base]}, name="quipu-hold", model_extra="max_concurrency = 2",
                 extra="[scheduling]\nreturn_hold_ms = 4000\nload_interval_ms = 200\n").start()
    try:
        _, a = gw.new_tenant(f"batch-{uuid.uuid4().hex[:6]}")
        _, b = gw.new_tenant(f"light-{uuid.uuid4().hex[:6]}")
        running = [Held(gw, a), Held(gw, b)]
        wait_until(lambda: engine(sim)["running"] == 2, 10, "both slots running")
        backlog = [Held(gw, a) for _ in range(2)]
        wait_until(lambda: depth(gw) == 2, 10, "tenant A's backlog queued in Quipu")
        returned = gw.metric_value("quipu_dispatches_total", placement="returned")
        # B's stream ends: Quipu counts one slot in use, and A's backlog stays where it is.
        running[1].close()
        wait_until(lambda: gw.metric_value("quipu_replica_slots_in_use", model="colibri") == 1, 10,
                   "B's slot released")
        assert depth(gw) == 2
        # B's next request takes the kept slot at once.
        again = Held(gw, b, text=SHORT)
        again.read_until(b"data: [DONE]")
        assert gw.metric_value("quipu_dispatches_total", placement="returned") == returned + 1
        assert depth(gw) == 2
        # B does not come back this time: when the hold lapses, A's oldest request gets the slot.
        again.close()
        wait_until(lambda: depth(gw) == 1, 10, "the lapsed hold's slot given to A's backlog")
        close_all(sim, gw, running[:1] + backlog + [again])
    finally:
        gw.stop()
        sim.stop()
