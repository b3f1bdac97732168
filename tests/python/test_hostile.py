"""Hostile input: a catalogue of bad requests through the real binary. Each must get a
well-formed error in its endpoint's shape with the right status; afterwards the gateway still
serves, no reservation is left open, and no refused request left a ledger row."""

from __future__ import annotations

import json
import socket
import sqlite3
import threading
import time

import pytest

from harness import Gateway, Sim, http_json, wait_until

OK_MSG = [{"role": "user", "content": "hola [[sim: tokens=2]]"}]
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="


def deep(n: int) -> bytes:
    return b'{"model":"colibri","messages":' + b"[" * n + b"]" * n + b"}"


def chat_cases(key: str):
    auth = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    c = lambda body, **kw: ("chat", body, auth, kw)  # noqa: E731
    m = lambda extra: {"model": "colibri", "messages": OK_MSG, **extra}  # noqa: E731
    img = lambda model, url: {"model": model, "messages": [{"role": "user", "content": [  # noqa: E731
        {"type": "text", "text": "mira"}, {"type": "image_url", "image_url": {"url": url}}]}]}
    yield "invalid json", c(b"{"), 400
    yield "invalid utf-8", c(b'{"model":"colibri","messages":[{"role":"user","content":"\xff\xfe"}]}'), 400
    yield "empty body", c(b""), 400
    yield "null body", c(b"null"), 400
    yield "array body", c(b'["colibri",[]]'), 400
    yield "duplicate keys", c(b'{"model":"colibri","model":"apu","messages":[]}'), 400
    yield "model not a string", c({"model": 7, "messages": OK_MSG}), 400
    yield "messages not an array", c({"model": "colibri", "messages": "hola"}), 400
    yield "messages empty", c({"model": "colibri", "messages": []}), 400
    yield "unknown role", c({"model": "colibri", "messages": [{"role": "robot", "content": "x"}]}), 400
    yield "missing role", c({"model": "colibri", "messages": [{"content": "x"}]}), 400
    yield "content a number", c({"model": "colibri", "messages": [{"role": "user", "content": 5}]}), 400
    yield "unknown content part", c({"model": "colibri", "messages": [{"role": "user", "content": [{"type": "audio"}]}]}), 400
    yield "negative max_tokens", c(m({"max_tokens": -1})), 400
    yield "zero max_tokens", c(m({"max_tokens": 0})), 400
    yield "fractional max_tokens", c(m({"max_tokens": 1.5})), 400
    yield "string max_tokens", c(m({"max_tokens": "100"})), 400
    yield "huge max_tokens is clamped", c(m({"max_tokens": 10**30})), 200
    yield "NaN temperature", c(b'{"model":"colibri","messages":[{"role":"user","content":"x"}],"temperature":NaN}'), 400
    yield "overflowing number", c(b'{"model":"colibri","messages":[{"role":"user","content":"x"}],"temperature":1e400}'), 400
    yield "negative temperature", c(m({"temperature": -1})), 400
    yield "top_p zero", c(m({"top_p": 0})), 400
    yield "stop with numbers", c(m({"stop": [1, 2]})), 400
    yield "too many stops", c(m({"stop": [f"s{i}" for i in range(17)]})), 400
    yield "logit_bias bad key", c(m({"logit_bias": {"hello": 1}})), 400
    yield "top_logprobs too many", c(m({"logprobs": True, "top_logprobs": 50})), 400
    yield "response_format type", c(m({"response_format": {"type": "xml"}})), 400
    yield "tools not an array", c(m({"tools": {"a": 1}})), 400
    yield "tool not a function", c(m({"tools": [{"type": "web_search"}]})), 400
    yield "tool name with spaces", c(m({"tools": [{"type": "function", "function": {"name": "rm -rf"}}]})), 400
    yield "tool_choice unknown tool", c(m({"tool_choice": {"type": "function", "function": {"name": "x"}}})), 400
    yield "tool message without id", c({"model": "colibri", "messages": [{"role": "tool", "content": "x"}]}), 400
    yield "tool result for no call", c({"model": "colibri", "messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": "r", "tool_call_id": "call_x"}]}), 400
    yield "image to a model without vision", c(img("colibri", "data:image/png;base64," + PNG)), 400
    yield "base64 that is not base64", c(img("aguila", "data:image/png;base64,@@not base64@@")), 400
    yield "image of an unknown type", c(img("aguila", "data:image/svg+xml;base64,PHN2Zz4=")), 400
    yield "image url to a metadata service", c(img("aguila", "http://169.254.169.254/latest/meta-data")), 400
    yield "10,000 levels of nesting", c(deep(10_000)), 400
    yield "stream not a boolean", c(m({"stream": "yes"})), 400
    yield "stream_options not an object", c(m({"stream": True, "stream_options": "usage"})), 400
    yield "unknown model", c({"model": "gpt-9", "messages": OK_MSG}), 404
    yield "model path traversal", c({"model": "../../etc/passwd", "messages": OK_MSG}), 404
    yield "model as a URL", c({"model": "http://evil.example/v1", "messages": OK_MSG}), 404
    yield "wrong content type", ("chat", json.dumps(m({})).encode(), {"Authorization": f"Bearer {key}", "Content-Type": "text/plain"}, {}), 400
    yield "multipart body", ("chat", b"--x\r\n\r\n--x--", {"Authorization": f"Bearer {key}", "Content-Type": "multipart/form-data; boundary=x"}, {}), 400
    yield "no key", ("chat", m({}), {"Content-Type": "application/json"}, {}), 401
    yield "wrong key", ("chat", m({}), {"Authorization": "Bearer sk-qp-wrong", "Content-Type": "application/json"}, {}), 401
    yield "basic auth", ("chat", m({}), {"Authorization": "Basic dXNlcjpwYXNz", "Content-Type": "application/json"}, {}), 401
    yield "x-api-key on the chat format", ("chat", m({}), {"x-api-key": key, "Content-Type": "application/json"}, {}), 401
    yield "empty bearer", ("chat", m({}), {"Authorization": "Bearer ", "Content-Type": "application/json"}, {}), 401
    yield "body over the limit", c(b'{"model":"colibri","messages":[{"role":"user","content":"' + b"a" * (2 * 1024 * 1024) + b'"}]}'), 413


def messages_cases(key: str):
    auth = {"x-api-key": key, "Content-Type": "application/json", "anthropic-version": "2023-06-01"}
    c = lambda body, headers=auth: ("messages", body, headers, {})  # noqa: E731
    ok = {"model": "colibri", "max_tokens": 10, "messages": OK_MSG}
    with_ = lambda **kw: {**ok, **kw}  # noqa: E731
    yield "messages invalid json", c(b"{"), 400
    yield "messages missing messages", c({"model": "colibri", "max_tokens": 5}), 400
    yield "messages empty", c(with_(messages=[])), 400
    yield "bad version header", c(ok, {**auth, "anthropic-version": "2023/06/01"}), 400
    yield "bad compat-version header", c(ok, {**auth, "compat-version": "latest"}), 400
    yield "unknown block type", c(with_(messages=[{"role": "user", "content": [{"type": "hologram"}]}])), 400
    yield "tool_result without tool_use", c(with_(messages=[{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "r"}]}])), 400
    yield "messages base64 not base64", c(with_(model="aguila", messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "%%%"}}]}])), 400
    yield "messages image without vision", c(with_(messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}]}])), 400
    yield "messages image media type", c(with_(model="aguila", messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/bmp", "data": PNG}}]}])), 400
    yield "messages negative max_tokens", c(with_(max_tokens=-5)), 400
    yield "messages temperature out of range", c(with_(temperature=5)), 400
    yield "messages system a number", c(with_(system=42)), 400
    yield "messages role unknown", c(with_(messages=[{"role": "robot", "content": "x"}])), 400
    yield "messages nesting", ("messages", deep(10_000), auth, {}), 400
    yield "messages no key", c(ok, {"Content-Type": "application/json"}), 401
    yield "messages wrong key", c(ok, {**auth, "x-api-key": "sk-qp-wrong"}), 401
    yield "messages two different keys", c(ok, {**auth, "Authorization": "Bearer sk-qp-other"}), 401
    yield "messages unknown model", c(with_(model="claude-unknown-9")), 404
    yield "messages body over the limit", c(b'{"model":"colibri","messages":[{"role":"user","content":"' + b"a" * (2 * 1024 * 1024) + b'"}]}'), 413
    yield "count_tokens bad body", ("count_tokens", b"[]", auth, {}), 400


PATHS = {"chat": "/v1/chat/completions", "messages": "/v1/messages", "count_tokens": "/v1/messages/count_tokens"}


@pytest.fixture(scope="module")
def hostile(workdir):
    sim = Sim(workdir, name="sim-hostile").start()
    gw = Gateway(
        workdir, {s: [sim.api_base] for s in ("colibri", "aguila", "apu")}, name="quipu-hostile",
        server_extra="max_body_bytes = 1048576\nclient_write_timeout_ms = 2000",
    ).start()
    _, key = gw.new_tenant("hostile")
    yield gw, sim, key
    gw.stop()
    sim.stop()


def test_hostile_catalogue(hostile):
    gw, sim, key = hostile
    cases = list(chat_cases(key)) + list(messages_cases(key))
    assert len(cases) >= 60
    failures = []
    for name, (fmt, body, headers, _), expected in cases:
        data = body if isinstance(body, (bytes, bytearray)) else json.dumps(body).encode()
        status, payload, hdrs = http_json("POST", gw.base + PATHS[fmt], data, headers)
        problems = []
        if status != expected:
            problems.append(f"status {status} != {expected}")
        if not hdrs.get("x-request-id"):
            problems.append("no x-request-id")
        if expected >= 400:
            if fmt == "chat":
                ok = isinstance(payload, dict) and set(payload) == {"error"} and {"message", "type", "param", "code"} <= set(payload["error"])
            else:
                ok = isinstance(payload, dict) and payload.get("type") == "error" and {"type", "message"} <= set(payload.get("error", {}))
            if not ok:
                problems.append(f"wrong error shape: {str(payload)[:200]}")
        if problems:
            failures.append(f"{name}: {'; '.join(problems)}")
    assert not failures, "\n".join(failures)
    # Still serving, nothing left reserved, no row for a refused request.
    assert http_json("GET", gw.base + "/v1/models")[0] == 200
    status, _, _ = http_json(
        "POST", gw.base + "/v1/chat/completions", {"model": "colibri", "messages": OK_MSG},
        {"Authorization": f"Bearer {key}"},
    )
    assert status == 200
    wait_until(lambda: gw.metric_value("quipu_reservations_open") == 0, 5, "reservations to close")

    def statuses():
        con = sqlite3.connect(gw.store_url.removeprefix("sqlite://"))
        rows = [r[0] for r in con.execute("SELECT http_status FROM ledger WHERE kind = 'request'")]
        con.close()
        return rows

    wait_until(lambda: len(statuses()) >= 2, 5, "the ledger rows")
    time.sleep(0.2)
    assert statuses() == [200, 200], "only the two admitted requests are in the ledger"


def test_headers_cannot_choose_the_upstream(hostile):
    gw, sim, key = hostile
    status, _, _ = http_json(
        "POST", gw.base + "/v1/chat/completions", {"model": "colibri", "messages": OK_MSG},
        {"Authorization": f"Bearer {key}", "X-Forwarded-Host": "evil.example", "Host": "169.254.169.254",
         "X-Upstream": "http://evil.example", "Forwarded": "host=evil.example"},
    )
    assert status == 200, "the request still went to the configured replica"
    assert json.loads(sim.last_body())["model"] == "upstream-colibri"


def test_a_key_revoked_mid_stream(hostile):
    gw, sim, _ = hostile
    key, secret = gw.new_tenant("victim")
    conn = socket.create_connection(("127.0.0.1", gw.port), timeout=30)
    body = json.dumps({"model": "colibri", "stream": True, "messages": [{"role": "user", "content": "[[sim: tokens=20 delay_ms=100]]"}]}).encode()
    conn.sendall(
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {secret}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
    )
    time.sleep(0.5)
    gw.cli("key", "revoke", key["key_id"])
    text = b""
    while b"0\r\n\r\n" not in text:
        chunk = conn.recv(65536)
        if not chunk:
            break
        text += chunk
    conn.close()
    assert b"data: [DONE]" in text, "the admitted stream finishes"
    wait_until(lambda: http_json("POST", gw.base + "/v1/chat/completions", {"model": "colibri", "messages": OK_MSG},
                                 {"Authorization": f"Bearer {secret}"})[0] == 401, 3)
    wait_until(lambda: gw.cli("statement", "--tenant", "victim")["totals"]["requests"] == 1, 5, "the row")
    st = gw.cli("statement", "--tenant", "victim")
    assert st["totals"]["output_tokens"] == 20, "charged to its tenant, in full"


def test_slowloris_and_idle_connections_do_not_stop_service(hostile):
    gw, _, key = hostile
    socks = []
    for i in range(1500):
        s = socket.create_connection(("127.0.0.1", gw.port), timeout=5)
        if i % 3 == 0:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")  # never finished
        socks.append(s)
    t = time.time()
    status, _, _ = http_json(
        "POST", gw.base + "/v1/chat/completions", {"model": "colibri", "messages": OK_MSG},
        {"Authorization": f"Bearer {key}"},
    )
    elapsed = time.time() - t
    for s in socks:
        s.close()
    assert status == 200 and elapsed < 1.0, (status, elapsed)


def test_a_client_that_stops_reading_releases_the_upstream(hostile):
    gw, sim, key = hostile
    since = sim.stats()["seq"]
    conn = socket.socket()
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    conn.connect(("127.0.0.1", gw.port))
    body = json.dumps({"model": "colibri", "stream": True,
                       "messages": [{"role": "user", "content": "[[sim: tokens=8000 word_bytes=2000]]"}]}).encode()
    conn.sendall(
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
    )
    conn.recv(1024)  # then stop reading

    def released():
        recs = [r for r in sim.requests(since) if r["request_id"]]
        return recs and recs[-1]["ended_ms"] > 0 and recs[-1]

    wait_until(released, 15, "the upstream request to be released")
    rec = released()
    assert rec["cancelled"] and rec["completion_tokens"] < 8000
    conn.close()
