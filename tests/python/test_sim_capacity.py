"""The simulator's capacity model: `--max-num-seqs` slots, first come first served beyond them,
and the engines' own load gauges (`GET /metrics`, llama.cpp's `GET /slots`, `GET /sim/engine`).

Streams are held open by slow pacing and ended by closing their connection, so every start is
caused by the test, never by a timer running out.
"""

from __future__ import annotations

import json
import re
import socket
import time

import pytest

from harness import Sim, http_json, wait_until

# Slow enough that a held stream sends little, long enough that it never ends by itself.
HOLD = "[[sim: tokens=10000 delay_ms=200]]"

GAUGES = {
    "vllm": ("vllm:num_requests_running", "vllm:num_requests_waiting"),
    "sglang": ("sglang:num_running_reqs", "sglang:num_queue_reqs"),
    "llamacpp": ("llamacpp:requests_processing", "llamacpp:requests_deferred"),
}


def gauges(sim: Sim, flavor: str = "vllm") -> tuple[float, float]:
    """(running, waiting) as the engine's `/metrics` says, under the flavor's names."""
    status, text, _ = http_json("GET", sim.url + "/metrics")
    assert status == 200, text
    values = []
    for name in GAUGES[flavor]:
        m = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
        assert m, f"no {name} in:\n{text}"
        values.append(float(m.group(1)))
    return values[0], values[1]


def engine(sim: Sim) -> dict:
    return http_json("GET", sim.url + "/sim/engine")[1]


class Call:
    """One chat completion on its own connection, read incrementally."""

    def __init__(self, sim: Sim, rid: str, stream: bool = True, text: str = HOLD):
        self.rid = rid
        self.sock = socket.create_connection(("127.0.0.1", sim.port), timeout=15)
        body = json.dumps({"model": "sim", "stream": stream,
                           "messages": [{"role": "user", "content": f"{rid} {text}"}]}).encode()
        self.sent = time.monotonic()
        self.sock.sendall(
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: sim\r\nx-request-id: {rid}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
        )
        self.buf = b""
        self.first_data: float | None = None

    def read_until(self, marker: bytes) -> None:
        """Reads until `marker` has arrived (the socket timeout fails a stuck read)."""
        while marker not in self.buf:
            chunk = self.sock.recv(65536)
            assert chunk, f"{self.rid}: connection closed before {marker!r}: {self.buf[:300]!r}"
            self.buf += chunk

    def wait_first_chunk(self) -> float:
        """Seconds from sending to the first SSE data chunk."""
        self.read_until(b"data: ")
        if self.first_data is None:
            self.first_data = time.monotonic()
        return self.first_data - self.sent

    def close(self) -> None:
        self.sock.close()


def until_load(sim: Sim, running: int, waiting: int, flavor: str = "vllm") -> None:
    wait_until(lambda: gauges(sim, flavor) == (running, waiting), 10,
               f"running={running} waiting={waiting} (now {gauges(sim, flavor)})")


def records(sim: Sim, n: int) -> dict[str, dict]:
    def logged():
        recs = {r["request_id"]: r for r in sim.requests() if r["request_id"]}
        return len(recs) >= n and recs
    wait_until(logged, 15, f"{n} requests logged")
    return logged()


@pytest.fixture
def two_slots(workdir):
    s = Sim(workdir, "--max-num-seqs", "2", name="sim-two-slots").start()
    yield s
    s.stop()


def test_beyond_max_num_seqs_streams_wait_first_come_first_served(two_slots):
    sim = two_slots
    calls = []
    try:
        for i in (1, 2):
            calls.append(Call(sim, f"cap-{i}"))
            calls[-1].wait_first_chunk()  # a free slot: it starts at once
        until_load(sim, 2, 0)
        # Two more: each joins the queue in turn (arrival order made certain before the next).
        queued_seen = {}
        for i, waiting in ((3, 1), (4, 2)):
            calls.append(Call(sim, f"cap-{i}"))
            until_load(sim, 2, waiting)
            queued_seen[f"cap-{i}"] = time.monotonic()
        e = engine(sim)
        assert (e["max_num_seqs"], e["running"], e["waiting"]) == (2, 2, 2), e
        # The first stream's client leaves: its slot goes to the oldest waiter, 3, not 4.
        # Times are read before each close: the slot can only be handed over after it.
        closed = {"cap-3": time.monotonic()}
        calls[0].close()
        ttft3 = calls[2].wait_first_chunk()
        until_load(sim, 2, 1)
        assert ttft3 >= closed["cap-3"] - calls[2].sent, "3's first chunk came once it had a slot"
        closed["cap-4"] = time.monotonic()
        calls[1].close()
        calls[3].wait_first_chunk()
        until_load(sim, 2, 0)
        assert engine(sim)["started_after_waiting"] >= 2
    finally:
        for c in calls:
            c.close()
    until_load(sim, 0, 0)
    recs = records(sim, 4)
    queued = {rid: recs[rid]["queue_ms"] for rid in ("cap-1", "cap-2", "cap-3", "cap-4")}
    assert queued["cap-1"] == 0 and queued["cap-2"] == 0, queued
    for rid in ("cap-3", "cap-4"):
        # It waited at least from when the test saw it queued to when its slot was freed.
        seen = (closed[rid] - queued_seen[rid]) * 1000
        assert queued[rid] >= seen, (rid, queued, seen)
    assert all(recs[r]["cancelled"] for r in queued), "every client left mid-stream"
    # Utilization: some slot time was used, never more than the slots.
    u = engine(sim)["utilization"]
    assert 0 < u <= 1, u


def test_a_waiting_client_that_leaves_gives_up_its_place(workdir):
    sim = Sim(workdir, "--max-num-seqs", "1", name="sim-one-slot").start()
    held = waiter = late = None
    try:
        held = Call(sim, "hold-1")
        held.wait_first_chunk()
        waiter = Call(sim, "wait-2", stream=False, text="[[sim: tokens=3]]")
        until_load(sim, 1, 1)
        late = Call(sim, "wait-3", stream=False, text="[[sim: tokens=3]]")
        until_load(sim, 1, 2)
        seen = time.monotonic()
        waiter.close()  # a non-stream client gives up while queued
        until_load(sim, 1, 1)
        freed = time.monotonic()
        held.close()
        late.read_until(b'"finish_reason"')  # 3 got the slot and its whole answer
        until_load(sim, 0, 0)
    finally:
        for c in (held, waiter, late):
            if c:
                c.close()
    recs = records(sim, 3)
    assert recs["wait-2"]["cancelled"] and recs["wait-2"]["completion_tokens"] == 0
    assert not recs["wait-3"]["cancelled"]
    assert recs["wait-3"]["queue_ms"] >= (freed - seen) * 1000, recs["wait-3"]
    sim.stop()


@pytest.mark.parametrize("flavor", ["vllm", "sglang", "llamacpp"])
def test_each_flavor_reports_load_under_its_own_names(workdir, flavor):
    sim = Sim(workdir, "--max-num-seqs", "1", "--flavor", flavor,
              "--served-model-name", "sim", name=f"sim-{flavor}").start()
    calls = []
    try:
        calls.append(Call(sim, f"{flavor}-1"))
        calls[0].wait_first_chunk()
        calls.append(Call(sim, f"{flavor}-2"))
        until_load(sim, 1, 1, flavor)
        status, text, headers = http_json("GET", sim.url + "/metrics")
        ctype = {k.lower(): v for k, v in headers.items()}["content-type"]
        assert status == 200 and ctype.startswith("text/plain"), (status, headers)
        for name in GAUGES[flavor]:
            assert f"# TYPE {name} gauge" in text, text
        if flavor != "llamacpp":
            assert 'model_name="sim"' in text, text
        status, slots, _ = http_json("GET", sim.url + "/slots")
        if flavor == "llamacpp":
            assert status == 200 and [s["is_processing"] for s in slots] == [True], slots
        else:
            assert status == 404, "/slots is llama.cpp's"
    finally:
        for c in calls:
            c.close()
    until_load(sim, 0, 0, flavor)
    sim.stop()


def test_without_max_num_seqs_nothing_waits(workdir):
    sim = Sim(workdir, name="sim-unbounded").start()
    calls = [Call(sim, f"free-{i}") for i in range(6)]
    try:
        for c in calls:
            c.wait_first_chunk()
        until_load(sim, 6, 0)
        assert engine(sim)["utilization"] is None, "no slot count, no utilization"
    finally:
        for c in calls:
            c.close()
    until_load(sim, 0, 0)
    sim.stop()
