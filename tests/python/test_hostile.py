"""Hostile input: a catalogue of bad requests through the real binary. Each must get a
well-formed error in its endpoint's shape with the right status and the docs/design.md error type
(and chat code); afterwards the gateway still serves, no reservation is left open, and no
refused request left a ledger row."""

from __future__ import annotations

import concurrent.futures as cf
import http.client
import json
import random
import re
import selectors
import socket
import sqlite3
import threading
import time
import uuid
from decimal import Decimal

import pytest

from harness import Gateway, Sim, http_json, wait_until

OK_MSG = [{"role": "user", "content": "hola [[sim: tokens=2]]"}]
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="


PICOS = 10**12
# Per million tokens (input, cached, output), as harness.model_block configures them.
PRICES = {"colibri": ("0.20", "0.05", "0.80"), "aguila": ("1.00", "0.25", "4.00"), "apu": ("3.00", "0.75", "12.00")}


def picos_charge(model: str, prompt: int, cached: int, completion: int) -> int:
    """A request's charge in pico-soles (exact: prices have at most 2 decimals, per million)."""
    i, c, o = (Decimal(p) for p in PRICES[model])
    picos = ((prompt - cached) * i + cached * c + completion * o) * PICOS / 1_000_000
    assert picos == int(picos)
    return int(picos)


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
    yield "duplicate keys", c(b'{"model":"colibri","model":"apu","messages":[{"role":"user","content":"hola [[sim: tokens=2]]"}]}'), 400
    yield "duplicate keys in a message", c(b'{"model":"colibri","messages":[{"role":"user","content":"x","content":"y"}]}'), 400
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
    yield "https image url to a metadata service", c(img("aguila", "https://169.254.169.254/latest/meta-data")), 400
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
    yield "bearer with two tokens", ("chat", m({}), {"Authorization": f"Bearer {key} {key}", "Content-Type": "application/json"}, {}), 401
    yield "duplicated Authorization headers", ("chat", m({}), [("Authorization", f"Bearer {key}"), ("Authorization", f"Bearer {key}"), ("Content-Type", "application/json")], {}), 401
    yield "duplicated Authorization, one wrong", ("chat", m({}), [("Authorization", "Bearer sk-qp-wrong"), ("Authorization", f"Bearer {key}"), ("Content-Type", "application/json")], {}), 401
    yield "a valid bearer and an extra x-api-key", ("chat", m({}), {"Authorization": f"Bearer {key}", "x-api-key": "sk-ant-api03-vendor", "Content-Type": "application/json"}, {}), 200
    yield "lowercase bearer scheme", ("chat", m({}), {"Authorization": f"bearer {key}", "Content-Type": "application/json"}, {}), 200
    yield "body over the limit", c(b'{"model":"colibri","messages":[{"role":"user","content":"' + b"a" * (2 * 1024 * 1024) + b'"}]}'), 413


def messages_cases(key: str):
    auth = {"x-api-key": key, "Content-Type": "application/json", "anthropic-version": "2023-06-01"}
    c = lambda body, headers=auth: ("messages", body, headers, {})  # noqa: E731
    ok = {"model": "colibri", "max_tokens": 10, "messages": OK_MSG}
    with_ = lambda **kw: {**ok, **kw}  # noqa: E731
    yield "messages invalid json", c(b"{"), 400
    yield "messages missing messages", c({"model": "colibri", "max_tokens": 5}), 400
    yield "messages format, messages empty", c(with_(messages=[])), 400
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
    yield "messages duplicate keys", c(b'{"model":"colibri","max_tokens":10,"max_tokens":20,"messages":[{"role":"user","content":"hola [[sim: tokens=2]]"}]}'), 400
    yield "messages https image url to a metadata service", c(with_(model="aguila", messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "https://169.254.169.254/latest/meta-data"}}]}])), 400
    yield "messages no key", c(ok, {"Content-Type": "application/json"}), 401
    yield "messages wrong key", c(ok, {**auth, "x-api-key": "sk-qp-wrong"}), 401
    yield "messages two wrong keys", c(ok, {**auth, "x-api-key": "sk-qp-wrong", "Authorization": "Bearer sk-qp-other"}), 401
    yield "messages empty x-api-key, no bearer", c(ok, {**auth, "x-api-key": ""}), 401
    yield "messages duplicated x-api-key", ("messages", ok, [("x-api-key", key), ("x-api-key", key), ("Content-Type", "application/json")], {}), 401
    yield "messages duplicated Authorization", ("messages", ok, [("Authorization", f"Bearer {key}"), ("Authorization", f"Bearer {key}"), ("Content-Type", "application/json")], {}), 401
    # Claude Code with both variables set: a vendor key in one header, the gateway key in the other.
    yield "messages gateway bearer, vendor x-api-key", c(ok, {**auth, "x-api-key": "sk-ant-api03-vendor", "Authorization": f"Bearer {key}"}), 200
    yield "messages vendor bearer, gateway x-api-key", c(ok, {**auth, "Authorization": "Bearer sk-ant-oat01-vendor"}), 200
    yield "messages bearer only", c(ok, {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}), 200
    yield "messages unknown model", c(with_(model="claude-unknown-9")), 404
    yield "messages body over the limit", c(b'{"model":"colibri","messages":[{"role":"user","content":"' + b"a" * (2 * 1024 * 1024) + b'"}]}'), 413
    yield "count_tokens bad body", ("count_tokens", b"[]", auth, {}), 400


HEAD_TIMEOUT_MS = 2000

PATHS = {"chat": "/v1/chat/completions", "messages": "/v1/messages", "count_tokens": "/v1/messages/count_tokens"}

# docs/design.md's error table: (fmt, status) -> (error.type, chat error.code or None when unchecked).
ERROR_TABLE = {
    ("chat", 400): ("invalid_request_error", None),
    ("chat", 401): ("authentication_error", "invalid_api_key"),
    ("chat", 404): ("invalid_request_error", "model_not_found"),
    ("chat", 413): ("invalid_request_error", "request_too_large"),
    ("messages", 400): ("invalid_request_error", None),
    ("messages", 401): ("authentication_error", None),
    ("messages", 404): ("not_found_error", None),
    ("messages", 413): ("request_too_large", None),
}
ERROR_TABLE.update({("count_tokens", s): v for (f, s), v in list(ERROR_TABLE.items()) if f == "messages"})


def send(gw, path: str, body: bytes, headers) -> tuple[int, object, dict]:
    """POSTs with headers given as a dict or as a list of pairs (repeats allowed)."""
    pairs = list(headers.items()) if isinstance(headers, dict) else list(headers)
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=30)
    try:
        conn.putrequest("POST", path, skip_accept_encoding=True)
        for k, v in pairs:
            conn.putheader(k, v)
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        r = conn.getresponse()
        raw = r.read()
        hdrs = {k.lower(): v for k, v in r.getheaders()}
        status = r.status
    finally:
        conn.close()
    try:
        return status, json.loads(raw), hdrs
    except ValueError:
        return status, raw.decode(errors="replace"), hdrs


def error_problems(fmt: str, status: int, payload) -> list[str]:
    """What is wrong with an error response, per the error shapes and docs/design.md's table."""
    if fmt == "chat":
        if not (isinstance(payload, dict) and set(payload) == {"error"}
                and {"message", "type", "param", "code"} <= set(payload["error"])):
            return [f"wrong error shape: {str(payload)[:200]}"]
        got = (payload["error"]["type"], payload["error"]["code"])
    else:
        if not (isinstance(payload, dict) and payload.get("type") == "error"
                and {"type", "message"} <= set(payload.get("error", {}))):
            return [f"wrong error shape: {str(payload)[:200]}"]
        got = (payload["error"]["type"], None)
    want_type, want_code = ERROR_TABLE[(fmt, status)]
    problems = []
    if got[0] != want_type:
        problems.append(f"error.type {got[0]!r} != {want_type!r}")
    if want_code is not None and got[1] != want_code:
        problems.append(f"error.code {got[1]!r} != {want_code!r}")
    if not payload["error"]["message"]:
        problems.append("empty message")
    return problems


@pytest.fixture(scope="module")
def hostile(workdir):
    sim = Sim(workdir, name="sim-hostile").start()
    gw = Gateway(
        workdir, {s: [sim.api_base] for s in ("colibri", "aguila", "apu")}, name="quipu-hostile",
        server_extra=f"max_body_bytes = 1048576\nclient_write_timeout_ms = 2000\nheader_timeout_ms = {HEAD_TIMEOUT_MS}",
    ).start()
    _, key = gw.new_tenant("hostile")
    yield gw, sim, key
    gw.stop()
    sim.stop()


@pytest.mark.smoke
def test_hostile_catalogue(hostile):
    gw, sim, key = hostile
    cases = list(chat_cases(key)) + list(messages_cases(key))
    assert len(cases) >= 60
    assert len({name for name, _, _ in cases}) == len(cases), "case names are unique"
    failures = []
    admitted = 0
    for name, (fmt, body, headers, _), expected in cases:
        data = body if isinstance(body, (bytes, bytearray)) else json.dumps(body).encode()
        status, payload, hdrs = send(gw, PATHS[fmt], data, headers)
        problems = []
        if status != expected:
            problems.append(f"status {status} != {expected}: {str(payload)[:200]}")
        if not hdrs.get("x-request-id"):
            problems.append("no x-request-id")
        if expected >= 400 and status == expected:
            problems += error_problems(fmt, status, payload)
        if expected == 200:
            admitted += 1
        if problems:
            failures.append(f"{name}: {'; '.join(problems)}")
    assert not failures, "\n".join(failures)
    # Still serving, nothing left reserved, no row for a refused request.
    assert http_json("GET", gw.base + "/v1/models")[0] == 200
    # Every case has finished (queued its row, if it made one) before this last request, whose
    # row is then stored after theirs: the writer stores rows in the order they were queued.
    gw.wait_idle()
    status, _, hdrs = http_json(
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

    wait_until(lambda: gw.ledger_has(hdrs["x-request-id"]), 5, "the last request's ledger row")
    assert statuses() == [200] * (admitted + 1), "only the admitted requests are in the ledger"
    # The money agrees three ways: each row's charge is its tokens at the model's prices, the
    # statement's charges and top-ups are what the rows sum to, and so is the balance.
    con = sqlite3.connect(gw.store_url.removeprefix("sqlite://"))
    rows = con.execute(
        "SELECT l.kind, l.delta, l.model, l.input_tokens, l.cached_tokens, l.output_tokens FROM ledger l "
        "JOIN tenants t ON t.id = l.tenant_id WHERE t.name = 'hostile'").fetchall()
    con.close()
    requests = [r for r in rows if r[0] == "request"]
    assert len(requests) == admitted + 1
    bad = [r for r in requests if -r[1] != picos_charge(r[2], r[3], r[4], r[5])]
    assert not bad, f"rows whose charge is not their tokens at the model's prices: {bad}"
    charged = -sum(r[1] for r in requests)
    topped = sum(r[1] for r in rows if r[0] == "topup")
    assert charged > 0 and topped == 1000 * PICOS
    st = gw.cli("statement", "--tenant", "hostile")
    assert st["totals"]["requests"] == admitted + 1
    assert Decimal(st["totals"]["charges"]) == Decimal(charged) / PICOS, (st, charged)
    assert Decimal(st["totals"]["top_ups"]) == Decimal(topped) / PICOS, (st, topped)
    assert Decimal(st["balance"]) == Decimal(topped - charged) / PICOS, (st, topped, charged)


def raw_exchange(gw, request: bytes, timeout: float = 10.0) -> bytes:
    """Sends raw bytes and reads until the server closes or a complete response has arrived."""
    s = socket.create_connection(("127.0.0.1", gw.port), timeout=timeout)
    try:
        s.sendall(request)
        got = b""
        while True:
            try:
                chunk = s.recv(65536)
            except (ConnectionResetError, socket.timeout):
                break
            if not chunk:
                break
            got += chunk
            head, sep, body = got.partition(b"\r\n\r\n")
            if sep:
                length = [int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:")]
                if length and len(body) >= length[0]:
                    break
        return got
    finally:
        s.close()


def test_header_injection_attempts(hostile):
    """CR/LF smuggled into a request line, a header or a JSON field never becomes a response
    header, and never reaches an answer other than a refusal."""
    gw, _, key = hostile
    body = json.dumps({"model": "colibri", "messages": OK_MSG}).encode()
    auth = f"Authorization: Bearer {key}\r\n".encode()

    def post(path: bytes, extra: bytes = b"", payload: bytes = body) -> bytes:
        return (b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + extra
                + b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)

    cases = {
        # Encoded CRLF in the path: no route, a chat-shaped 404.
        "encoded CRLF in the path": (post(b"/v1/chat/completions%0d%0aX-Injected:%201", auth), 404),
        # A bare CR inside a header value, and a folded (obs-fold) header line: malformed HTTP.
        "bare CR in a header value": (post(b"/v1/chat/completions", auth + b"X-Note: a\rX-Injected: 1\r\n"), 400),
        "folded header line": (post(b"/v1/chat/completions", auth + b"X-Note: a\r\n X-Injected: 1\r\n"), 400),
        "bare LF splitting a header": (post(b"/v1/chat/completions", auth + b"X-Note: a\nX-Injected: 1\r\n"), None),
        # CR/LF inside JSON strings: a model that does not exist, a field that is not a date.
        "CRLF in the model name": (post(b"/v1/chat/completions", auth, json.dumps(
            {"model": "colibri\r\nX-Injected: 1", "messages": OK_MSG}).encode()), 404),
        "CRLF in a stop string": (post(b"/v1/chat/completions", auth, json.dumps(
            {"model": "colibri", "messages": OK_MSG, "stop": ["\r\nX-Injected: 1"]}).encode()), 200),
    }
    failures = []
    for name, (request, expected) in cases.items():
        raw = raw_exchange(gw, request)
        head, _, rest = raw.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1]) if lines[0].startswith(b"HTTP/1.1 ") else None
        if any(line.lower().startswith(b"x-injected") for line in lines[1:]):
            failures.append(f"{name}: an injected response header: {head!r}")
        if expected is None:
            # Either refused as malformed or read as one header; never served as a success
            # with an injected header (checked above).
            if status not in (200, 400):
                failures.append(f"{name}: status {status}")
        elif status != expected:
            failures.append(f"{name}: status {status} != {expected}: {raw[:300]!r}")
        elif expected == 404:
            failures += [f"{name}: {p}" for p in error_problems("chat", 404, json.loads(rest))
                         if "error.code" not in p]
            payload = json.loads(rest)
            want = "not_found" if b"%0d%0a" in request.split(b"\r\n")[0] else "model_not_found"
            if payload["error"]["code"] != want:
                failures.append(f"{name}: code {payload['error']['code']} != {want}")
    assert not failures, "\n".join(failures)
    assert http_json("GET", gw.base + "/v1/models")[0] == 200


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
    # The stream is under way (its head has arrived) before the key is revoked.
    text = b""
    while b"\r\n\r\n" not in text:
        chunk = conn.recv(65536)
        assert chunk, f"the gateway closed before the stream began: {text!r}"
        text += chunk
    gw.cli("key", "revoke", key["key_id"])
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


def open_stream(gw, secret: str, content: str, model: str = "colibri") -> socket.socket:
    """Starts a streamed chat completion on a raw socket; read it with `read_stream`."""
    conn = socket.create_connection(("127.0.0.1", gw.port), timeout=30)
    body = json.dumps({"model": model, "stream": True, "messages": [{"role": "user", "content": content}]}).encode()
    conn.sendall(
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {secret}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
    )
    return conn


def read_stream(conn: socket.socket) -> tuple[str, list[dict]]:
    """Reads a chunked SSE response to its end; returns (request id, the JSON chunks)."""
    text = b""
    while b"\r\n0\r\n\r\n" not in text:
        chunk = conn.recv(65536)
        if not chunk:
            break
        text += chunk
    conn.close()
    head, _, body = text.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    rid = re.search(rb"(?im)^x-request-id:\s*(\S+)", head).group(1).decode()
    # Undo the chunked framing, then split the SSE events.
    data, rest = b"", body
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        data, rest = data + rest[:size], rest[size + 2:]
    events = [line[6:] for line in data.decode().split("\n") if line.startswith("data: ")]
    assert events and events[-1] == "[DONE]", events[-3:]
    return rid, [json.loads(e) for e in events[:-1]]


def test_another_tenants_key_revoked_mid_stream(hostile):
    """Revoking tenant B's key while tenant A streams touches neither A's stream nor A's bill
    (A is charged exactly what an unaffected stream running beside it is: its metered tokens
    at the model's prices), B's next requests get 401, and B's balance and ledger are exactly
    what they were before the revocation."""
    gw, sim, _ = hostile
    _, a = gw.new_tenant("stream-a", top_up="100.00")
    b_key, b = gw.new_tenant("revoked-b", top_up="100.00")
    _, c = gw.new_tenant("unaffected-c", top_up="100.00")
    db = gw.store_url.removeprefix("sqlite://")

    def rows(tenant: str) -> list[tuple]:
        con = sqlite3.connect(db)
        got = con.execute("SELECT l.* FROM ledger l JOIN tenants t ON t.id = l.tenant_id WHERE t.name = ? "
                          "ORDER BY l.entry_id", (tenant,)).fetchall()
        con.close()
        return got

    def b_status(path="/v1/chat/completions", headers=None) -> int:
        body = {"model": "colibri", "max_tokens": 10, "messages": OK_MSG}
        return http_json("POST", gw.base + path, body, headers or {"Authorization": f"Bearer {b}"})[0]

    # B has spent something already: a row and a balance the revocation must leave alone.
    assert b_status() == 200
    wait_until(lambda: len(rows("revoked-b")) == 2, 5, "B's row")  # its top-up and its request
    b_rows, b_statement = rows("revoked-b"), gw.cli("statement", "--tenant", "revoked-b")
    since = sim.stats()["seq"]
    received = sim.stats()["requests"]
    slow = "[[sim: tokens=20 delay_ms=100]]"
    a_conn = open_stream(gw, a, f"alfa {slow}")
    c_conn = open_stream(gw, c, f"gama {slow}")
    started = time.time()
    # Both streams are admitted and under way upstream before B's key is revoked.
    wait_until(lambda: sim.stats()["requests"] >= received + 2, 5, "A's and C's streams upstream")
    gw.cli("key", "revoke", b_key["key_id"])
    # Polled with an empty body (400 while the key is known, no row), so that no request of B
    # is admitted in the refresh interval before the revocation takes effect.
    wait_until(lambda: http_json("POST", gw.base + "/v1/chat/completions", b"{}",
                                 {"Authorization": f"Bearer {b}"})[0] == 401, 3, "B's key refused")
    assert time.time() - started < 1.5, "B was refused while A was still streaming (20 x 100 ms)"
    assert b_status("/v1/messages", {"x-api-key": b, "anthropic-version": "2023-06-01"}) == 401
    a_id, a_chunks = read_stream(a_conn)
    c_id, c_chunks = read_stream(c_conn)
    assert time.time() - started >= 1.7, "the streams were slow ones"
    # A's stream is a whole, normal stream: the same shape as C's.
    assert not any("error" in ch for ch in a_chunks), a_chunks[-2:]
    shape = lambda chunks: [[c.get("finish_reason") for c in ch.get("choices", [])] for ch in chunks]  # noqa: E731
    assert shape(a_chunks) == shape(c_chunks)
    # A is charged exactly its metered tokens, like C.
    wait_until(lambda: len(rows("stream-a")) == 2 and len(rows("unaffected-c")) == 2, 5, "A's and C's rows")
    recs = {r["request_id"]: r for r in sim.requests(since) if r["request_id"]}
    for tenant, rid in (("stream-a", a_id), ("unaffected-c", c_id)):
        rec = recs[rid]
        assert (rec["status"], rec["completion_tokens"], rec["cancelled"]) == (200, 20, False), rec
        st = gw.cli("statement", "--tenant", tenant)
        expected = Decimal(picos_charge("colibri", rec["prompt_tokens"], rec["cached_tokens"], 20)) / PICOS
        assert (st["totals"]["requests"], st["totals"]["output_tokens"]) == (1, 20), st
        assert Decimal(st["totals"]["charges"]) == expected > 0, (tenant, st, rec)
        assert Decimal(st["balance"]) == Decimal("100.00") - expected, (tenant, st)
    (a_row,) = [r for r in rows("stream-a") if r[1] == "request"]
    (c_row,) = [r for r in rows("unaffected-c") if r[1] == "request"]
    con = sqlite3.connect(db)
    cols = [d[1] for d in con.execute("PRAGMA table_info(ledger)")]
    con.close()
    same = ("kind", "model", "format", "output_tokens", "status", "http_status", "unbilled", "input_estimated")
    assert [a_row[cols.index(k)] for k in same] == [c_row[cols.index(k)] for k in same], (a_row, c_row)
    # B: refused, and nothing of B's moved (a row of any request so far would be stored by now).
    assert b_status() == 401
    gw.ledger_barrier()
    assert rows("revoked-b") == b_rows
    after = gw.cli("statement", "--tenant", "revoked-b")
    assert after == b_statement, (b_statement, after)


def closed_by_server(socks: list[socket.socket], within: float) -> list[socket.socket]:
    """Waits up to `within` seconds for the server to close each socket; returns those it did
    not close."""
    sel = selectors.DefaultSelector()
    for s in socks:
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
    open_ = set(socks)
    deadline = time.time() + within
    while open_ and time.time() < deadline:
        for key, _ in sel.select(timeout=max(0.0, deadline - time.time())):
            s = key.fileobj
            try:
                data = s.recv(65536)
            except (ConnectionResetError, BlockingIOError) as e:
                data = b"" if isinstance(e, ConnectionResetError) else None
            if data == b"":
                sel.unregister(s)
                open_.discard(s)
    sel.close()
    return list(open_)


def test_slowloris_and_idle_connections_do_not_stop_service(hostile):
    gw, _, key = hostile
    socks = []
    opened = time.time()
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
    assert status == 200 and elapsed < 1.0, (status, elapsed)
    # Idle and half-sent connections are closed once the head deadline passes.
    left = closed_by_server(socks, HEAD_TIMEOUT_MS / 1000 + 3 - (time.time() - opened))
    closed_after = time.time() - opened
    for s in socks:
        s.close()
    assert not left, f"{len(left)} of 1500 idle or slow connections still open after {closed_after:.1f} s"


def test_a_head_dripped_byte_by_byte_is_cut_off(hostile):
    """Each byte arrives well within any per-read timeout; the head as a whole does not."""
    gw, _, key = hostile
    s = socket.create_connection(("127.0.0.1", gw.port), timeout=5)
    started = time.time()
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200
    cut = None
    for b in head:
        try:
            s.sendall(bytes([b]))
        except (BrokenPipeError, ConnectionResetError):
            cut = time.time() - started
            break
        if not closed_by_server([s], 0.2):
            cut = time.time() - started
            break
    s.close()
    assert cut is not None, "a head dripped over 40 s was never cut off"
    assert HEAD_TIMEOUT_MS / 1000 - 0.3 < cut < HEAD_TIMEOUT_MS / 1000 + 1.5, cut
    # A request that sends its head at once on a connection idle for a while still works.
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=10)
    conn.connect()
    time.sleep(HEAD_TIMEOUT_MS / 2000)  # time passing is the point: idle for half the head deadline
    conn.request("GET", "/v1/models")
    r = conn.getresponse()
    r.read()
    assert r.status == 200
    # …and, kept alive, a later request gets its own deadline from its first byte.
    time.sleep(HEAD_TIMEOUT_MS / 1000 + 0.5)  # time passing is the point: idle past a head deadline
    conn.request("POST", "/v1/chat/completions", json.dumps({"model": "colibri", "messages": OK_MSG}),
                 {"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    r = conn.getresponse()
    r.read()
    assert r.status == 200
    conn.close()


def test_connections_beyond_the_cap_are_closed_and_the_first_ones_work(workdir, hostile):
    _, sim, _ = hostile
    cap = 16
    gw = Gateway(workdir, {"colibri": [sim.api_base]}, name="quipu-capped",
                 server_extra=f"max_connections = {cap}").start()
    try:
        _, key = gw.new_tenant("capped")
        body = json.dumps({"model": "colibri", "messages": OK_MSG})
        headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}

        def ask(c):
            c.request("POST", "/v1/chat/completions", body, headers)
            r = c.getresponse()
            r.read()
            return r.status

        # The connections of start-up checks are closed on the server's side too.
        wait_until(lambda: gw.metric_value("quipu_client_connections") == 0, 5, "start-up connections to close")
        conns = [http.client.HTTPConnection("127.0.0.1", gw.port, timeout=10) for _ in range(cap)]
        assert [ask(c) for c in conns] == [200] * cap
        socks = [c.sock for c in conns]
        extra = socket.create_connection(("127.0.0.1", gw.port), timeout=5)
        try:
            extra.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
            got = extra.recv(65536)
        except ConnectionResetError:
            got = b""
        extra.close()
        assert got == b"", f"connection {cap + 1} was served: {got[:100]!r}"
        # The metrics say so (the metrics listener is not an API connection).
        assert gw.metric_value("quipu_client_connections_refused_total") >= 1
        assert gw.metric_value("quipu_client_connections") == cap
        # The first ones keep working, on the same connections.
        assert [ask(c) for c in conns] == [200] * cap
        assert [c.sock for c in conns] == socks
        # One closes: room for a new one.
        conns[0].close()

        def new_one_served():
            return http_json("GET", gw.base + "/v1/models", timeout=5)[0] == 200

        wait_until(new_one_served, 3, "a new connection once one closed")
        for c in conns[1:]:
            c.close()
    finally:
        gw.stop()


def test_a_client_that_stops_reading_releases_the_upstream(hostile):
    """The stream is 80 MB: more than every socket buffer between the simulator and the client
    can hold (the kernel may grow the gateway's upstream receive buffer to `tcp_rmem`'s 32 MB
    here), so it cannot run to its end while the client is not reading; only the gateway's
    write timeout can end it, by cancelling the upstream. With 16 MB it sometimes could."""
    gw, sim, key = hostile
    since = sim.stats()["seq"]
    conn = socket.socket()
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    conn.connect(("127.0.0.1", gw.port))
    body = json.dumps({"model": "colibri", "stream": True,
                       "messages": [{"role": "user", "content": "[[sim: tokens=40000 word_bytes=2000]]"}]}).encode()
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
    assert rec["cancelled"] and rec["completion_tokens"] < 40000, rec
    conn.close()


def test_a_slow_reader_is_served_with_bounded_buffering(hostile):
    """A client that reads a big stream a trickle at a time (2 KiB every 50 ms, so it never
    trips the 2 s write timeout) is served, but the gateway buffers only what the sockets hold:
    its memory does not grow with the 80 MB the simulator could produce at once, and the
    simulator itself is held back (it has produced a small part when the client leaves, and
    is then cancelled)."""
    gw, sim, key = hostile
    pid = gw.process.proc.pid

    def rss_kib() -> int:
        with open(f"/proc/{pid}/status") as f:
            return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))

    since = sim.stats()["seq"]
    before = rss_kib()
    conn = socket.socket()
    conn.settimeout(10)  # a gateway that stops sending fails the test, never hangs it
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    conn.connect(("127.0.0.1", gw.port))
    body = json.dumps({"model": "colibri", "stream": True,
                       "messages": [{"role": "user", "content": "[[sim: tokens=40000 word_bytes=2000]]"}]}).encode()
    conn.sendall(
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
    )
    got = 0
    peak = before
    until = time.time() + 4
    while time.time() < until:
        data = conn.recv(2048)
        assert data, "the gateway hung up on a client that was still reading"
        got += len(data)
        peak = max(peak, rss_kib())
        time.sleep(0.05)  # the pace of a slow reader: time passing is the point
    assert got > 50_000, f"only {got} bytes arrived in 4 s"
    assert peak - before < 8 * 1024, f"the gateway grew by {peak - before} KiB for a slow reader"
    conn.close()

    def released():
        recs = [r for r in sim.requests(since) if r["request_id"]]
        return recs and recs[-1]["ended_ms"] > 0 and recs[-1]

    wait_until(released, 15, "the upstream request to be released once the reader left")
    rec = released()
    # 40000 words of 2000 bytes (80 MB): a gateway that read ahead of its client would let the
    # fast simulator finish within the 4 s; held back by backpressure, it is cancelled midway
    # (about 3,000 here; the rest of what it produced sits in socket buffers, not the gateway).
    seen = {k: rec.get(k) for k in ("request_id", "cancelled", "completion_tokens", "ended_ms")}
    assert rec["cancelled"] and rec["completion_tokens"] < 40000, seen


CARDINALITY_FAMILIES = ("quipu_requests_total", "gen_ai_server_request_duration_seconds")


def series(exposition: str, families=CARDINALITY_FAMILIES) -> set[tuple[str, str]]:
    """The (family, labels) series of `families` in a scrape; a histogram's buckets, sum and
    count are one series (its `le` label dropped)."""
    out = set()
    for line in exposition.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, _, labels = line.rpartition(" ")[0].partition("{")
        family = re.sub(r"_(bucket|sum|count)$", "", name) if name not in families else name
        if family in families:
            out.add((family, re.sub(r',?le="[^"]*"', "", labels.rstrip("}")).lstrip(",")))
    return out


def test_metric_label_cardinality_stays_bounded(hostile):
    """Client-chosen strings never become label values: ~200 requests with random model names,
    unknown paths, methods and header values add at most a handful of series to the request
    counter and the duration histogram, and no random string appears anywhere in the scrape."""
    gw, _, key = hostile
    rng = random.Random(1234)
    used: list[str] = []

    def rand() -> str:
        used.append(f"zq{uuid.UUID(int=rng.getrandbits(128)).hex[:12]}")
        return used[-1]

    chat_auth = {"Authorization": f"Bearer {key}"}
    msg_auth = {"x-api-key": key, "anthropic-version": "2023-06-01"}

    def one(i: int) -> int:
        r = rand()
        kind = i % 10
        if kind == 0:  # an unknown model, chat
            return http_json("POST", gw.base + "/v1/chat/completions", {"model": r, "messages": OK_MSG}, chat_auth)[0]
        if kind == 1:  # an unknown model, messages
            return http_json("POST", gw.base + "/v1/messages", {"model": r, "max_tokens": 5, "messages": OK_MSG}, msg_auth)[0]
        if kind == 2:  # an alias pattern with a random tail: served, counted under the real model
            return http_json("POST", gw.base + "/v1/messages", {"model": f"claude-haiku-{r}", "max_tokens": 5,
                                                                "messages": OK_MSG}, msg_auth)[0]
        if kind == 3:  # an unknown model, no key
            return http_json("POST", gw.base + "/v1/chat/completions", {"model": r, "messages": OK_MSG})[0]
        if kind == 4:  # unknown paths
            return http_json("GET", gw.base + f"/v1/{r}", headers=chat_auth)[0]
        if kind == 5:
            return http_json("POST", gw.base + f"/{r}/chat/completions", {"model": "colibri", "messages": OK_MSG}, chat_auth)[0]
        if kind == 6:  # an unknown method
            return http_json(r.upper(), gw.base + "/v1/chat/completions", headers=chat_auth)[0]
        if kind == 7:  # a random model in a count_tokens request
            return http_json("POST", gw.base + "/v1/messages/count_tokens", {"model": r, "messages": OK_MSG}, msg_auth)[0]
        # Served requests carrying random values in every header a client controls.
        headers = {**chat_auth, "User-Agent": r, "X-Request-Id": r, "X-Forwarded-For": r, "X-Forwarded-Host": r,
                   "Host": f"{r}.example", "Origin": f"https://{r}.example", "Referer": f"https://{r}.example/",
                   "X-Stainless-Lang": r, "X-Title": r, "OpenAI-Organization": r, "X-Tenant": r, "X-Model": r,
                   f"X-{r}": r}
        return http_json("POST", gw.base + "/v1/chat/completions",
                         {"model": "colibri", "messages": OK_MSG, "user": r, "metadata": {"tenant": r},
                          "stream": i % 20 == 9}, headers)[0]

    # Warm up: every kind of request once, so the outcomes' series exist before the count.
    warm = [one(i) for i in range(10)]
    assert warm.count(200) == 3, warm
    before = gw.metrics()
    start = len(used)
    with cf.ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(one, range(10, 210)))
    assert statuses.count(200) == 60 and all(s in (200, 400, 401, 404, 405) for s in statuses), statuses
    after = gw.metrics()
    assert len(used) - start == 200
    new = series(after) - series(before)
    assert len(new) <= 4, f"{len(new)} new series from 200 random requests: {sorted(new)[:10]}"
    assert {f for f, _ in series(after)} == set(CARDINALITY_FAMILIES), "both families are exported"
    leaked = sorted({r for r in used if r in after or r.upper() in after})
    assert not leaked, f"{len(leaked)} client strings are label values, e.g. {leaked[:3]}"
    # The counter did count them: the random traffic is in the existing series.
    total = lambda text: sum(float(line.rpartition(" ")[2]) for line in text.splitlines()  # noqa: E731
                             if line.startswith("quipu_requests_total{"))
    assert total(after) - total(before) >= 200


class Canary:
    """A TCP listener on 127.0.0.1 that records every connection made to it (and its first
    bytes); it answers nothing."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.seen: list[bytes] = []
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            conn.settimeout(0.5)
            try:
                first = conn.recv(4096)
            except OSError:
                first = b""
            self.seen.append(first)
            conn.close()

    def stop(self):
        self.stopped.set()
        self.thread.join(2)
        self.sock.close()


def test_the_gateway_never_fetches_a_url_for_a_client(workdir, hostile):
    """Image URLs (chat `image_url`, messages `image` with a `url` source) and header values
    naming a local listener never make the gateway connect to it: with the default policy the
    URLs are refused, with `image_urls = "forward_any"` they are passed to the upstream as text
    (the simulator, like vLLM's API layer here, does not fetch: it has no HTTP client), and the
    headers do not pick where requests go. The listener sees no connection."""
    strict, sim, strict_key = hostile
    canary = Canary()
    lax = Gateway(workdir, {s: [sim.api_base] for s in ("colibri", "aguila")}, name="quipu-forward-any",
                  extra='[security]\nimage_urls = "forward_any"\n').start()
    try:
        _, lax_key = lax.new_tenant("fetcher")
        target = f"127.0.0.1:{canary.port}"
        urls = [f"http://{target}/cat.png", f"https://{target}/cat.png", f"http://localhost:{canary.port}/x.png"]
        hostile_headers = {"X-Forwarded-Host": target, "Host": target, "Forwarded": f"host={target};proto=http",
                           "X-Forwarded-For": "127.0.0.1", "X-Original-URL": f"http://{target}/",
                           "X-Rewrite-URL": f"http://{target}/", "X-Upstream": f"http://{target}/v1",
                           "Referer": f"http://{target}/", "Origin": f"http://{target}",
                           "X-Forwarded-Proto": "http", "X-Forwarded-Port": str(canary.port)}
        for gw, key, want in ((strict, strict_key, 400), (lax, lax_key, 200)):
            for url in urls:
                since = sim.stats()["seq"]
                chat = {"model": "aguila", "max_tokens": 5, "messages": [{"role": "user", "content": [
                    {"type": "text", "text": "mira [[sim: tokens=2]]"},
                    {"type": "image_url", "image_url": {"url": url}}]}]}
                status, body, _ = http_json("POST", gw.base + "/v1/chat/completions", chat,
                                            {**hostile_headers, "Authorization": f"Bearer {key}"})
                assert status == want, (gw.name, url, status, body)
                messages = {"model": "aguila", "max_tokens": 5, "messages": [{"role": "user", "content": [
                    {"type": "text", "text": "mira [[sim: tokens=2]]"},
                    {"type": "image", "source": {"type": "url", "url": url}}]}]}
                status, body, _ = http_json("POST", gw.base + "/v1/messages", messages,
                                            {**hostile_headers, "x-api-key": key, "anthropic-version": "2023-06-01"})
                assert status == want, (gw.name, url, status, body)
                if want == 200:
                    # Forwarded as text to the configured replica (the simulator), not fetched.
                    assert len(sim.requests(since)) == 2, sim.requests(since)
                    assert json.loads(sim.last_body())["model"] == "upstream-aguila"
                    assert url in sim.last_body().decode(), sim.last_body()[:500]
        # A plain request with the hostile headers still goes to the configured replica.
        status, _, _ = http_json("POST", strict.base + "/v1/chat/completions", {"model": "colibri", "messages": OK_MSG},
                                 {**hostile_headers, "Authorization": f"Bearer {strict_key}"})
        assert status == 200 and json.loads(sim.last_body())["model"] == "upstream-colibri"
        # Every request has finished; then a connection of ours, recorded after any the
        # gateways made (the listener takes them in order): it is the only one.
        for g in (strict, lax):
            g.wait_idle()
        with socket.create_connection(("127.0.0.1", canary.port), timeout=2) as ours:
            ours.sendall(b"ours")
        wait_until(lambda: b"ours" in canary.seen, 5, "the listener to record our connection")
        assert canary.seen == [b"ours"], f"the listener was connected to: {canary.seen}"
    finally:
        lax.stop()
        canary.stop()
