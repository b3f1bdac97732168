"""Hostile clients of the transport (issue 17): HTTP/2 rapid reset and its slower variants,
CONTINUATION floods, an HPACK bomb, stream-count and flow-control abuse, stalled and garbage TLS
handshakes. Each attack runs while a well-behaved client on another connection (in its own
process) keeps sending requests: the attack must be cut off or bounded, the gateway must stay
up, and the well-behaved client must keep its latency."""

from __future__ import annotations

import os
import socket
import time

import pytest

from harness import Gateway, Sim, http_json, wait_until
from tls_support import (
    CANCEL,
    ENHANCE_YOUR_CALM,
    FLAG_END_HEADERS,
    FLAG_END_STREAM,
    FRAME_CONTINUATION,
    FRAME_DATA,
    FRAME_HEADERS,
    FRAME_RST,
    REFUSED_STREAM,
    H2Frames,
    Probe,
    TestCA,
    TlsGateway,
    assert_latency_kept,
    baseline_latency,
    client_hello,
    frame,
    hpack_int,
    hpack_literal,
    log_lines,
    read_until_closed,
    rss_kib,
    sim_records,
    sse_data,
    wait_rows,
)

MAX_STREAMS = 16
WRITE_TIMEOUT_MS = 2000
HANDSHAKE_TIMEOUT_MS = 1000
MAX_REJECTED = 32  # malformed or refused streams a connection may send before it is closed
ATTACK_SECONDS = 2.5


class Target:
    """One listener under attack: the gateway, how to open an HTTP/2 connection to it, and a
    tenant for the attacker and one for the well-behaved client."""

    def __init__(self, gw: Gateway, ca: TestCA | None, sim: Sim):
        self.gw, self.ca, self.sim = gw, ca, sim
        self.tls = ca is not None
        _, self.key = gw.new_tenant(f"attacker-{gw.name}", top_up="10000.00")
        _, self.probe_key = gw.new_tenant(f"probe-{gw.name}", top_up="10000.00")

    def h2(self, **kw) -> H2Frames:
        h = H2Frames(self.gw.port, self.ca.context(alpn=["h2"]) if self.tls else None, **kw)
        h.run_until(lambda: h.server_settings, 5)
        return h

    def probe(self) -> Probe:
        return Probe(self.gw.port, self.probe_key, str(self.ca.path) if self.tls else None)

    def baseline(self) -> Probe:
        return baseline_latency(self.gw.port, self.probe_key, str(self.ca.path) if self.tls else None)

    def healthy(self) -> bool:
        if not self.gw.process.alive():
            return False
        if self.tls:
            return self.gw.request("GET", "/health", timeout=5)[0] == 200
        return http_json("GET", self.gw.base + "/health", timeout=5)[0] == 200

    def attack_records(self, since: int, ids=None) -> list[dict]:
        """The simulator's records of the attacker's requests (on `aguila`) since `since`."""
        return [r for r in sim_records(self.sim, since, ids).values() if r["model"] == "upstream-aguila"]

    def abuse(self, kind: str) -> float:
        return self.gw.metric_value("quipu_http2_abuse_total", kind=kind)

    def closes(self) -> float:
        """Connections closed for misbehaviour, every reason (`refused` counts streams)."""
        return sum(self.abuse(k) for k in ("rejected", "cancels", "flood", "protocol_error"))


@pytest.fixture(scope="module")
def targets(workdir):
    sim = Sim(workdir, name="sim-transport-hostile").start()
    ca = TestCA(workdir, "hostile")
    leaf = ca.issue("hostile-tls")
    ups = {"colibri": [sim.api_base], "aguila": [sim.api_base]}
    extra = (f"h2_max_streams = {MAX_STREAMS}\nclient_write_timeout_ms = {WRITE_TIMEOUT_MS}\n"
             f"tls_handshake_timeout_ms = {HANDSHAKE_TIMEOUT_MS}\nheader_timeout_ms = 5000")
    tls = TlsGateway(workdir, ups, ca, leaf, name="quipu-hostile-tls", server_extra=extra).start()
    plain = Gateway(workdir, ups, name="quipu-hostile-h2c", server_extra=extra).start()
    yield {"tls": Target(tls, ca, sim), "h2c": Target(plain, None, sim)}
    for g in (tls, plain):
        code = g.stop()
        assert code == 0, f"{g.name} did not exit cleanly ({code}):\n{g.process.tail()}"
    sim.stop()


def chat(content: str, stream: bool = False) -> dict:
    """An attacker's request: on `aguila` (the probe asks `colibri`, so the simulator's log
    tells them apart)."""
    body = {"model": "aguila", "messages": [{"role": "user", "content": content}]}
    if stream:
        body["stream"] = True
    return body


def max_overlap(recs: list[dict]) -> int:
    """The most simulator requests that were running at the same moment."""
    edges = sorted([(r["at_ms"], 1) for r in recs] + [(r["ended_ms"], -1) for r in recs], key=lambda e: (e[0], e[1]))
    most = now = 0
    for _, d in edges:
        now += d
        most = max(most, now)
    return most


def describe_frames(frames: list[tuple[int, int, int]]) -> str:
    """A short account of the frames of one stream: runs of plain DATA frames are summed."""
    out, run = [], None
    names = {FRAME_DATA: "DATA", FRAME_HEADERS: "HEADERS", FRAME_RST: "RST_STREAM"}
    for kind, flags, length in frames:
        if kind == FRAME_DATA and not flags & FLAG_END_STREAM:
            run = (run[0] + 1, run[1] + length) if run else (1, length)
            continue
        if run:
            out.append(f"{run[0]} DATA frames ({run[1]} bytes)")
            run = None
        flag_names = [n for bit, n in ((FLAG_END_STREAM, "END_STREAM"), (FLAG_END_HEADERS, "END_HEADERS"))
                      if flags & bit and kind in (FRAME_DATA, FRAME_HEADERS)]
        out.append(f"{names.get(kind, kind)}({', '.join(flag_names)}; {length} bytes)")
    if run:
        out.append(f"{run[0]} DATA frames ({run[1]} bytes)")
    return ", ".join(out)


# --- 1. rapid reset -------------------------------------------------------------------------------


@pytest.mark.parametrize("listener", ["tls", "h2c"])
def test_rapid_reset_is_cut_off(targets, listener):
    """HEADERS (+ the body) and RST_STREAM back to back, thousands of them, on connection
    after connection: each connection is closed with GOAWAY(ENHANCE_YOUR_CALM) after a bounded
    number of streams, and the upstream sees little or nothing of it."""
    t = targets[listener]
    before = t.baseline()
    since = t.sim.stats()["seq"]
    body = chat("x [[sim: tokens=50 delay_ms=20]]")
    auth = {"authorization": f"Bearer {t.key}"}
    conns = []
    closes0 = t.closes()
    with t.probe() as during:
        deadline = time.monotonic() + ATTACK_SECONDS
        while time.monotonic() < deadline and len(conns) < 300:
            h = t.h2()
            classic = len(conns) % 2 == 0
            sent = 0
            while sent < 20_000:
                burst = b""
                for _ in range(100):
                    if classic:  # HEADERS(END_STREAM) of a GET, then RST_STREAM: CVE-2023-44487 as published
                        sid = h.new_stream()
                        frames = h.headers_frames(sid, h.request_headers("/v1/models", auth, method="GET"), True)
                    else:  # a whole chat request (HEADERS, DATA), then RST_STREAM
                        sid, frames = h.post("/v1/chat/completions", body, auth)
                    burst += frames + h.rst(sid, CANCEL)
                if not h.sendall(burst):
                    break
                sent += 100
                h.pump(0.001)
                if h.closed:
                    break
            closed = h.wait_closed(5)
            conns.append((sent, closed, h.goaway))
            h.close()
    attempted = sum(s for s, _, _ in conns)
    assert attempted >= 2000, f"the attack only got {attempted} streams out"
    still_open = [c for c in conns if not c[1]]
    assert not still_open, f"{len(still_open)} of {len(conns)} attacking connections were never closed"
    goaways = [g for _, _, g in conns if g is not None]
    assert goaways, "no attacking connection got a GOAWAY"
    assert {code for _, code in goaways} == {ENHANCE_YOUR_CALM}, goaways[:5]
    # Every connection closed for it is counted, once, whichever layer closed it (the h2
    # crate's reset budget, or the gateway's cancel and malformed-stream budgets). Some
    # clients see the close as a reset before they read its GOAWAY: closed is what counts.
    closed = sum(1 for _, was_closed, _ in conns if was_closed)
    wait_until(lambda: t.closes() - closes0 >= closed, 10, "every closed connection counted")
    assert t.closes() - closes0 == closed, (t.closes() - closes0, closed, len(goaways))
    # The server stopped processing each connection's streams early (the last stream id it
    # says it processed), of the thousands the attacker sent.
    assert max(last for last, _ in goaways) <= 2 * (MAX_STREAMS + MAX_REJECTED + 200), goaways
    # The upstream saw a bounded amount of it.
    attack = t.attack_records(since)
    assert len(attack) <= len(conns) * (MAX_STREAMS + MAX_REJECTED), f"{len(attack)} upstream requests"
    ids = [r["request_id"] for r in attack]
    assert set(ids) <= set(wait_rows(t.gw, ids)), "an upstream request of the attack has no ledger row"
    wait_until(lambda: t.gw.metric_value("quipu_reservations_open") == 0, 10, "reservations to be released")
    assert t.healthy()
    assert_latency_kept(before, during, f"rapid reset over {listener}")


def test_accept_then_cancel_is_bounded(targets):
    """The slower variants that get past h2's reset-before-accept guard: (a) HEADERS with the
    body still open, ~20 ms, then RST_STREAM; (b) a whole request whose answer has started,
    then RST_STREAM. Each accepted stream is a request task (and in (b) an upstream request)
    until it ends; the gateway caps a connection's live tasks at h2_max_streams, refuses the
    streams over it, and closes a connection that keeps being refused."""
    t = targets["tls"]
    before = t.baseline()
    since = t.sim.stats()["seq"]
    refused0, rejected0, cancels0 = t.abuse("refused"), t.abuse("rejected"), t.abuse("cancels")
    auth = {"authorization": f"Bearer {t.key}"}
    head = {**auth, "content-type": "application/json", "content-length": "100"}
    stream_body = chat("x [[sim: tokens=50 delay_ms=20]]", stream=True)
    per_conn = []
    with t.probe() as during:
        deadline = time.monotonic() + ATTACK_SECONDS
        variant = 0
        while time.monotonic() < deadline and len(per_conn) < 100:
            variant += 1
            h = t.h2()
            opened = 0
            if variant % 2:
                # (a) HEADERS, body never sent, reset after 20 ms; 16 at a time.
                while not h.closed and opened < 5000:
                    sids = [h.new_stream() for _ in range(MAX_STREAMS)]
                    if not h.sendall(b"".join(h.headers_frames(s, h.request_headers("/v1/chat/completions", head), False)
                                              for s in sids)):
                        break
                    opened += len(sids)
                    h.run_until(lambda: False, 0.02)
                    if not h.sendall(b"".join(h.rst(s) for s in sids)):
                        break
            else:
                # (b) a streamed request, reset once its answer has started; 16 in flight.
                live: set[int] = set()
                while not h.closed and opened < 5000:
                    burst = b""
                    while len(live) < MAX_STREAMS:
                        sid, frames = h.post("/v1/chat/completions", stream_body, auth)
                        burst += frames
                        live.add(sid)
                        opened += 1
                    if not h.sendall(burst):
                        break
                    h.pump(0.05)
                    resets = b""
                    for sid in list(live):
                        st = h.streams[sid]
                        if st["status"] is not None or st["reset"] is not None or st["ended"]:
                            if st["reset"] is None and not st["ended"]:
                                resets += h.rst(sid, CANCEL)
                            live.discard(sid)
                    if resets and not h.sendall(resets):
                        break
            closed = h.wait_closed(5)
            per_conn.append((opened, closed, h.goaway))
            h.close()
    assert len(per_conn) >= 4, per_conn
    still_open = [c for c in per_conn if not c[1]]
    assert not still_open, f"{len(still_open)} of {len(per_conn)} cancelling connections were never closed"
    # Each connection was closed after a bounded number of streams: its cap, the refusals
    # allowed, and the cancel budget (200 per 10 s) at the very most.
    assert max(o for o, _, _ in per_conn) <= MAX_STREAMS * 2 + MAX_REJECTED + 200 + MAX_STREAMS, per_conn
    assert t.abuse("rejected") + t.abuse("cancels") - rejected0 - cancels0 >= 1, "no connection counted as abusive"
    assert t.abuse("refused") > refused0
    # Upstream work was bounded too: never more requests at once than one connection's cap.
    recs = t.attack_records(since)
    assert max_overlap(recs) <= 2 * MAX_STREAMS, f"{max_overlap(recs)} upstream requests at once"
    # And every one that started is billed, its reservation released.
    ids = [r["request_id"] for r in recs if r["request_id"]]
    rows = wait_rows(t.gw, ids)
    assert set(ids) <= set(rows), "an upstream request of a cancelled stream has no ledger row"
    assert all(rows[i]["status"] == "client_disconnected" for i in ids), {rows[i]["status"] for i in ids}
    wait_until(lambda: t.gw.metric_value("quipu_reservations_open") == 0, 10, "reservations to be released")
    assert t.healthy()
    assert_latency_kept(before, during, "accept then cancel")


# --- 2. CONTINUATION flood ------------------------------------------------------------------------


@pytest.mark.parametrize("listener", ["tls", "h2c"])
def test_continuation_flood_is_cut_off(targets, listener):
    """HEADERS without END_HEADERS, then CONTINUATION frames without end — big ones (new
    headers, far over the header-list limit) and empty ones — on connection after connection:
    each is closed after a bounded amount, and the gateway's memory does not grow with it."""
    t = targets[listener]
    before = t.baseline()
    pid = t.gw.process.proc.pid
    rss0 = rss_kib(pid)
    peak = rss0
    results = []
    auth = {"authorization": f"Bearer {t.key}"}
    with t.probe() as during:
        deadline = time.monotonic() + ATTACK_SECONDS
        n = 0
        while time.monotonic() < deadline and n < 200:
            n += 1
            big = n % 2 == 1
            h = t.h2()
            sid = h.new_stream()
            h.sendall(frame(FRAME_HEADERS, 0, sid, h.request_headers("/v1/chat/completions", auth)))
            sent = 0
            while sent < 64 << 20:
                if big:
                    payload = b"".join(hpack_literal(f"x-flood-{sent}-{j}".encode(), b"v" * 1000) for j in range(15))
                    burst = frame(FRAME_CONTINUATION, 0, sid, payload) * 4
                else:
                    burst = frame(FRAME_CONTINUATION, 0, sid) * 2000
                if not h.sendall(burst):
                    break
                sent += len(burst)
                h.pump(0.001)
                if h.closed:
                    break
            closed = h.wait_closed(5)
            results.append((big, sent, closed, h.goaway))
            h.close()
            peak = max(peak, rss_kib(pid))
    assert any(big for big, *_ in results) and any(not big for big, *_ in results)
    open_ = [r for r in results if not r[2]]
    assert not open_, f"{len(open_)} flooding connections were never closed"
    # Bounded: each connection was cut off within a few header-list limits' worth of bytes.
    assert max(sent for _, sent, _, _ in results) <= 4 << 20, max(sent for _, sent, _, _ in results)
    assert (peak - rss0) < 32 * 1024, f"the gateway grew by {peak - rss0} KiB under a CONTINUATION flood"
    assert t.healthy()
    assert_latency_kept(before, during, f"CONTINUATION flood over {listener}")


# --- 3. HPACK bomb --------------------------------------------------------------------------------


def bomb_block(refs: int, scheme: bytes) -> bytes:
    """A request header block: the pseudo-headers, one 4,000-byte header inserted into the
    dynamic table, then `refs` one-byte references to it (each decodes to 4 KB)."""
    path = b"/v1/chat/completions"
    block = bytes([0x83, 0x87 if scheme == b"https" else 0x86])  # :method POST, :scheme
    block += bytes([0x04]) + hpack_int(len(path), 7) + path  # :path, literal, not indexed
    block += bytes([0x01]) + hpack_int(9, 7) + b"localhost"  # :authority
    block += hpack_literal(b"x-bomb", b"b" * 4000, index=True)
    return block + bytes([0xBE]) * refs  # index 62: the first dynamic-table entry


def test_hpack_bomb_is_refused(targets):
    t = targets["tls"]
    before = t.baseline()
    since = t.sim.stats()["seq"]
    pid = t.gw.process.proc.pid
    rss0 = rss_kib(pid)
    peak = rss0
    outcomes = []
    with t.probe() as during:
        deadline = time.monotonic() + ATTACK_SECONDS
        while time.monotonic() < deadline and len(outcomes) < 300:
            h = t.h2()
            sid = h.new_stream()
            # 12,000 references: 48 MB once decoded, in a 12 KB frame.
            h.sendall(frame(FRAME_HEADERS, FLAG_END_HEADERS | FLAG_END_STREAM, sid, bomb_block(12_000, h.scheme)))
            h.run_until(lambda: h.streams[sid]["ended"] or h.streams[sid]["reset"] is not None or h.closed, 5)
            st = h.streams[sid]
            outcomes.append((st["status"], st["reset"], h.closed, h.goaway))
            h.close()
            peak = max(peak, rss_kib(pid))
    # Every bomb was refused: a 431, a reset stream or a closed connection — never decoded
    # into a request (which would have been answered 401: no key in the bomb).
    served = [o for o in outcomes if o[0] is not None and o[0] != 431]
    assert not served, served[:5]
    undecided = [o for o in outcomes if o[0] is None and o[1] is None and not o[2]]
    assert not undecided, f"{len(undecided)} bombs got no answer at all"
    assert (peak - rss0) < 32 * 1024, f"the gateway grew by {peak - rss0} KiB under HPACK bombs"
    # A header list just over the limit (17 × 4 KB) is answered 431, and the connection goes on.
    h = t.h2()
    sid = h.new_stream()
    h.sendall(frame(FRAME_HEADERS, FLAG_END_HEADERS | FLAG_END_STREAM, sid, bomb_block(17, h.scheme)))
    assert h.run_until(lambda: h.streams[sid]["status"] is not None or h.streams[sid]["reset"] is not None or h.closed, 5)
    assert h.streams[sid]["status"] == 431 or h.streams[sid]["reset"] is not None, h.streams[sid]
    sid2, frames = h.post("/v1/chat/completions", chat("hola [[sim: reply=sigo]]"), {"authorization": f"Bearer {t.key}"})
    h.sendall(frames)
    assert h.run_until(lambda: h.streams[sid2]["ended"], 10) and h.streams[sid2]["status"] == 200, (h.streams[sid2], h.goaway)
    h.close()
    assert len(t.attack_records(since)) == 1, "only the well-formed request reached the upstream"
    assert t.healthy()
    assert_latency_kept(before, during, "HPACK bomb")


# --- 4. stream-count and flow-control abuse -----------------------------------------------------


def test_stream_count_abuse_is_refused(targets):
    """A client that opens more streams than SETTINGS_MAX_CONCURRENT_STREAMS gets the extra
    ones refused (REFUSED_STREAM, safe to retry) while the first ones are served whole; one that
    resets its streams and opens new ones at once cannot get more request tasks (and upstream
    requests) running than the cap — the gateway refuses them and counts it."""
    t = targets["tls"]
    before = t.baseline()
    since = t.sim.stats()["seq"]
    refused0 = t.abuse("refused")
    auth = {"authorization": f"Bearer {t.key}"}
    with t.probe() as during:
        # (a) 16 slow streams and 8 more at once.
        h = t.h2()
        assert h.server_settings.get(3) == MAX_STREAMS, h.server_settings
        sids = []
        burst = b""
        for i in range(MAX_STREAMS + 8):
            sid, frames = h.post("/v1/chat/completions", chat(f"{i} [[sim: tokens=10 delay_ms=100]]", stream=True), auth)
            sids.append(sid)
            burst += frames
        assert h.sendall(burst)
        assert h.run_until(lambda: all(h.streams[s]["ended"] or h.streams[s]["reset"] is not None for s in sids), 20)
        served = [s for s in sids if h.streams[s]["status"] == 200]
        refused = [s for s in sids if h.streams[s]["reset"] is not None]
        assert served == sids[:MAX_STREAMS], [(h.streams[s]["status"], h.streams[s]["resets"]) for s in sids]
        assert all(h.streams[s]["resets"][0] == REFUSED_STREAM for s in refused) and len(refused) == 8
        for s in served:
            data = sse_data(bytes(h.streams[s]["data"]))
            assert data[-1] == "[DONE]" and h.streams[s]["reset"] is None, data[-2:]
        h.close()

        # (b) open 16, reset them once answered, open 16 more in the same write, again and again.
        h = t.h2()
        slow = chat("x [[sim: tokens=20 delay_ms=300]]", stream=True)
        first = [h.post("/v1/chat/completions", slow, auth) for _ in range(MAX_STREAMS)]
        assert h.sendall(b"".join(f for _, f in first))
        assert h.run_until(lambda: all(h.streams[s]["status"] for s, _ in first), 10)
        wave = [s for s, _ in first]
        for _ in range(6):
            nxt = [h.post("/v1/chat/completions", slow, auth) for _ in range(MAX_STREAMS)]
            if not h.sendall(b"".join(h.rst(s, CANCEL) for s in wave) + b"".join(f for _, f in nxt)):
                break
            wave = [s for s, _ in nxt]
            h.run_until(lambda: all(h.streams[s]["status"] or h.streams[s]["reset"] is not None for s in wave) or h.closed, 5)
            if h.closed:
                break
        gateway_refused = [s for s, st in h.streams.items() if st["resets"][:1] == [REFUSED_STREAM]]
        h.close()
    assert gateway_refused, "no stream over the live-task cap was refused"
    assert t.abuse("refused") > refused0, "the gateway's refusals are not counted"
    recs = t.attack_records(since)
    assert max_overlap(recs) <= MAX_STREAMS + 4, f"{max_overlap(recs)} upstream requests at once (cap {MAX_STREAMS})"
    wait_until(lambda: t.gw.metric_value("quipu_reservations_open") == 0, 10, "reservations to be released")
    assert t.healthy()
    assert_latency_kept(before, during, "stream-count abuse")


@pytest.mark.parametrize("stall", ["stream_window", "connection_window"])
def test_a_stalled_http2_reader_is_dropped_after_the_write_timeout(targets, stall):
    """A client that lets its flow-control window run dry and never sends WINDOW_UPDATE while
    a long stream is answered: after client_write_timeout_ms the stream is given up — reset,
    not ended as if complete (END_STREAM marks a whole response: a client must be able to
    tell a cut one) — its upstream request is cancelled, it is billed as a client disconnect,
    and its reservation is released."""
    t = targets["tls"]
    before = t.baseline()
    since = t.sim.stats()["seq"]
    disconnects = t.gw.metric_value("quipu_client_disconnects_total")
    if stall == "stream_window":
        # A stream window of 0 bytes: not one byte of the answer can be sent.
        h = t.h2(settings={"initial_window_size": 0}, ack_data=False)
        content = "x [[sim: tokens=2000 delay_ms=5]]"
    else:
        # Stream windows of 1 MiB, but the connection's 64 KiB window is never given back.
        h = t.h2(settings={"initial_window_size": 1 << 20}, ack_data=False)
        content = "x [[sim: tokens=4000 delay_ms=2 word_bytes=200]]"
    with t.probe() as during:
        sid, frames = h.post("/v1/chat/completions", chat(content, stream=True), {"authorization": f"Bearer {t.key}"})
        started = time.monotonic()
        assert h.sendall(frames)
        h.run_until(lambda: h.streams[sid]["ended"] or h.streams[sid]["reset"] is not None or h.closed, 10)
        gave_up = time.monotonic() - started
    st = h.streams[sid]
    frames_seen = describe_frames([(kind, flags, length) for kind, flags, s, length in h.log if s == sid])
    h.close()
    assert st["status"] == 200, st
    assert st["ended"] or st["reset"] is not None or h.closed, "the stalled stream was never given up"
    assert WRITE_TIMEOUT_MS / 1000 - 0.3 < gave_up < WRITE_TIMEOUT_MS / 1000 + 3, gave_up
    rid = dict(st["headers"])[b"x-request-id"].decode()
    rec = sim_records(t.sim, since, [rid])[rid]
    # The upstream request was cancelled (it would have taken 10 s or more).
    assert rec["cancelled"] and rec["ended_ms"] - rec["at_ms"] < WRITE_TIMEOUT_MS + 3000, rec
    row = wait_rows(t.gw, [rid])[rid]
    assert row["status"] == "client_disconnected" and row["output_tokens"] <= rec["completion_tokens"], row
    assert t.gw.metric_value("quipu_client_disconnects_total") - disconnects == 1
    wait_until(lambda: t.gw.metric_value("quipu_reservations_open") == 0, 10, "the reservation to be released")
    assert t.healthy()
    assert_latency_kept(before, during, f"stalled reader ({stall})")
    # A response the gateway gave up on must not look complete to the client.
    ended_as_complete = st["ended"] and st["reset"] is None and not h.closed
    assert not ended_as_complete, (
        f"the cut-off stream was ended with END_STREAM, as if complete ({len(st['data'])} bytes of body); "
        f"frames received on it: {frames_seen}")


# --- 5. TLS handshakes that never finish ----------------------------------------------------------


def test_slow_and_never_started_tls_handshakes_time_out(targets):
    t = targets["tls"]
    before = t.baseline()
    timeouts0 = t.gw.metric_value("quipu_tls_handshake_failures_total", reason="timeout")
    errors0 = t.gw.metric_value("quipu_tls_handshake_failures_total", reason="error")
    hello = client_hello(alpn=["h2", "http/1.1"])
    assert hello[0] == 0x16 and len(hello) > 100
    n = 40
    with t.probe() as during:
        socks = []
        for i in range(n):
            s = socket.create_connection(("127.0.0.1", t.gw.port), timeout=5)
            if i % 2:
                s.sendall(hello[: len(hello) // 2])  # half a ClientHello, then nothing
            socks.append((s, time.monotonic()))
        closed_after = []
        for s, opened in socks:
            _, closed = read_until_closed(s, HANDSHAKE_TIMEOUT_MS / 1000 + 4 - (time.monotonic() - opened))
            closed_after.append(None if closed is None else time.monotonic() - opened)
            s.close()
    never = [c for c in closed_after if c is None]
    assert not never, f"{len(never)} of {n} stalled handshakes were never closed"
    assert all(HANDSHAKE_TIMEOUT_MS / 1000 - 0.2 < c < HANDSHAKE_TIMEOUT_MS / 1000 + 2 for c in closed_after), closed_after
    wait_until(lambda: t.gw.metric_value("quipu_tls_handshake_failures_total", reason="timeout") - timeouts0 == n, 3,
               "the timeouts to be counted")
    assert t.gw.metric_value("quipu_tls_handshake_failures_total", reason="error") == errors0
    assert t.healthy()
    assert_latency_kept(before, during, "stalled TLS handshakes")


def test_garbage_instead_of_a_client_hello(targets):
    t = targets["tls"]
    before = t.baseline()
    timeouts0 = t.gw.metric_value("quipu_tls_handshake_failures_total", reason="timeout")
    errors0 = t.gw.metric_value("quipu_tls_handshake_failures_total", reason="error")
    lines0 = len(log_lines(t.gw))
    kinds = {
        # Random bytes (the first one not a TLS record type).
        "random": lambda: b"\x00" + os.urandom(2000),
        # Plain HTTP to the TLS port.
        "plaintext http": lambda: b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\n\r\n",
        # A well-framed handshake record holding a whole "ClientHello" of random bytes (whole:
        # a message announced longer than what came would rightly be waited for).
        "garbage ClientHello": lambda: b"\x16\x03\x01\x00\x64" + b"\x01\x00\x00\x60" + os.urandom(96),
    }
    per_kind = 30
    closes = {k: [] for k in kinds}
    with t.probe() as during:
        for _ in range(per_kind):
            for name, make in kinds.items():
                s = socket.create_connection(("127.0.0.1", t.gw.port), timeout=5)
                s.sendall(make())
                got, closed = read_until_closed(s, 5)
                s.close()
                closes[name].append(closed)
                assert not got.startswith(b"HTTP/"), f"{name}: answered in plain HTTP: {got[:80]!r}"
    for name, cs in closes.items():
        assert all(c is not None for c in cs), f"{name}: {sum(c is None for c in cs)} connections left open"
        # Closed at once, not at the handshake deadline.
        assert max(cs) < HANDSHAKE_TIMEOUT_MS / 1000 * 0.8, (name, max(cs))
    wait_until(lambda: t.gw.metric_value("quipu_tls_handshake_failures_total", reason="error") - errors0
               == per_kind * len(kinds), 3, "the failed handshakes to be counted")
    assert t.gw.metric_value("quipu_tls_handshake_failures_total", reason="timeout") == timeouts0
    new = log_lines(t.gw)[lines0:]
    errors = [line for line in new if " ERROR " in line]
    warns = [line for line in new if " WARN " in line]
    assert not errors and len(warns) <= 1, (errors[:3], warns[:3])
    assert t.healthy()
    assert_latency_kept(before, during, "garbage handshakes")
