"""Keys (revocation without restart) and request bodies (large, routed, over the limit,
keep-alive)."""

import hashlib
import json
import os
import socket
import sqlite3
import time

import openai
import pytest

from harness import Gateway, Sim, http_json, raw_connection


def test_revoked_key_stops_working_within_two_seconds(gw, tenant):
    name, secret = tenant
    c = openai.OpenAI(base_url=gw.base + "/v1", api_key=secret, max_retries=0)
    c.chat.completions.create(model="colibri", messages=[{"role": "user", "content": "hola"}])
    key_id = gw.cli("key", "list", "--tenant", name)["keys"][0]["key_id"]
    gw.cli("key", "revoke", key_id)
    revoked_at = time.time()
    while True:
        try:
            c.chat.completions.create(model="colibri", messages=[{"role": "user", "content": "hola"}])
        except openai.AuthenticationError:
            break
        assert time.time() - revoked_at < 2.0, "revocation not effective within 2 s"
        time.sleep(0.05)
    assert gw.process.alive()


@pytest.mark.smoke
def test_keys_are_stored_only_as_hashes(gw, tenant):
    """A query on the store: the digest is there, the secret is nowhere (not in any column,
    nor anywhere in the database files)."""
    _, secret = tenant
    db = gw.store_url.removeprefix("sqlite://")
    con = sqlite3.connect(db)
    digests = [row[0] for row in con.execute("SELECT secret_sha256 FROM api_keys")]
    assert hashlib.sha256(secret.encode()).digest() in digests
    for table, in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
        for row in con.execute(f"SELECT * FROM {table}"):
            assert not any(isinstance(v, str) and secret in v for v in row), table
    con.close()
    for path in (db, db + "-wal"):
        if os.path.exists(path):
            assert secret.encode() not in open(path, "rb").read()


@pytest.fixture(scope="module")
def routed(workdir):
    """A gateway whose `apu` is served by its own simulator."""
    small = Sim(workdir, "--max-model-len", "1000000", name="sim-small").start()
    big = Sim(workdir, "--max-model-len", "1000000", name="sim-apu").start()
    g = Gateway(
        workdir,
        {"colibri": [small.api_base], "aguila": [small.api_base], "apu": [big.api_base]},
        name="quipu-routed",
    ).start()
    _, key = g.new_tenant("routed")
    yield g, small, big, key
    g.stop()
    small.stop()
    big.stop()


def test_large_request_is_routed_by_its_model_and_arrives_intact(routed):
    g, small, big, key = routed
    text = ("Lorem ipsum dolor sit amet, ñandú 🦙 " * 9000)[: 300 * 1024]
    conn = raw_connection(g)
    body = json.dumps({"model": "apu", "messages": [{"role": "user", "content": text}]}).encode()
    assert len(body) > 300 * 1024
    conn.request("POST", "/v1/chat/completions", body, {"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    r = conn.getresponse()
    payload = json.loads(r.read())
    assert r.status == 200, payload
    assert payload["model"] == "apu"
    sock = conn.sock
    up = json.loads(big.last_body())
    assert up["model"] == "upstream-apu"
    assert up["messages"][0]["content"] == text
    # keep-alive survives: the next request goes over the same socket.
    conn.request("GET", "/v1/pricing")
    r2 = conn.getresponse()
    r2.read()
    assert r2.status == 200 and conn.sock is sock


def test_body_over_the_limit_is_413_in_the_endpoint_shape(routed):
    g, _, _, key = routed
    conn = raw_connection(g)
    huge = b'{"model":"colibri","messages":[{"role":"user","content":"' + b"x" * (32 * 1024 * 1024) + b'"}]}'
    conn.request("POST", "/v1/messages", huge, {"x-api-key": key, "Content-Type": "application/json"})
    r = conn.getresponse()
    body = json.loads(r.read())
    assert r.status == 413
    assert body["type"] == "error" and body["error"]["type"] == "request_too_large"
    sock = conn.sock
    conn.request("POST", "/v1/chat/completions", huge, {"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    r = conn.getresponse()
    body = json.loads(r.read())
    assert r.status == 413
    assert body["error"]["code"] == "request_too_large"
    conn.request("GET", "/v1/models")
    r = conn.getresponse()
    r.read()
    assert r.status == 200 and conn.sock is sock, "keep-alive survives a 413"


def test_headers_over_the_limit_are_431_in_the_endpoint_shape(small):
    """`server.max_header_bytes` (here the 64 KiB default) answers in the endpoint's shape, with
    a request id, keeps the connection; heads pingora itself refuses (over 1 MiB, over 256
    headers) get its bare 400 and a closed connection, and the gateway goes on serving."""
    g, key = small
    conn = raw_connection(g)
    big = {"x-padding": "p" * (65 * 1024)}
    body = json.dumps({"model": "colibri", "messages": [{"role": "user", "content": "hola"}]})
    conn.request("POST", "/v1/messages", body, {"x-api-key": key, "Content-Type": "application/json", **big})
    r = conn.getresponse()
    err = json.loads(r.read())
    assert r.status == 431 and r.getheader("request-id"), err
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert "65536-byte limit" in err["error"]["message"]
    sock = conn.sock
    conn.request("POST", "/v1/chat/completions", body, {"Authorization": f"Bearer {key}", "Content-Type": "application/json", **big})
    r = conn.getresponse()
    err = json.loads(r.read())
    assert r.status == 431 and err["error"]["code"] == "request_header_fields_too_large", err
    conn.request("POST", "/v1/chat/completions", body, {"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    r = conn.getresponse()
    r.read()
    assert r.status == 200 and conn.sock is sock, "the connection survives a 431"
    assert g.metric_value("quipu_requests_total", status="431", error_type="headers_too_large") == 2

    host, port = g.base.split("//")[1].split(":")
    for head in (b"x-big: " + b"a" * (1100 * 1024) + b"\r\n",
                 b"".join(b"x-h%d: v\r\n" % i for i in range(300))):
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + head + b"\r\n")
            reply = s.recv(4096)
        assert reply.startswith(b"HTTP/1.1 400"), reply[:200]
    status, _, _ = http_json("GET", g.base + "/v1/models")
    assert status == 200


@pytest.fixture(scope="module")
def small(workdir):
    """A gateway with a 1 MiB body limit."""
    sim = Sim(workdir, name="sim-small-limit").start()
    g = Gateway(workdir, {"colibri": [sim.api_base]}, name="quipu-small-limit",
                server_extra="max_body_bytes = 1048576").start()
    _, key = g.new_tenant("small")
    yield g, key
    g.stop()
    sim.stop()


def json_in_chunks(total: int, piece: int = 64 * 1024):
    """A JSON chat body of about `total` bytes, as an iterator (sent chunked, no length)."""
    yield b'{"model":"colibri","messages":[{"role":"user","content":"'
    sent = 0
    while sent < total:
        n = min(piece, total - sent)
        yield b"a" * n
        sent += n
    yield b'"}]}'


def test_chunked_body_over_the_limit_is_413_in_the_endpoint_shape(small):
    g, key = small
    conn = raw_connection(g)
    sock = None
    for path, headers in (("/v1/messages", {"x-api-key": key}), ("/v1/chat/completions", {"Authorization": f"Bearer {key}"})):
        # An iterator and no length: http.client sends `Transfer-Encoding: chunked`.
        conn.request("POST", path, json_in_chunks(3 * 1024 * 1024 // 2),
                     {**headers, "Content-Type": "application/json"}, encode_chunked=True)
        r = conn.getresponse()
        body = json.loads(r.read())
        assert r.status == 413, body
        if path == "/v1/messages":
            assert body["type"] == "error" and body["error"]["type"] == "request_too_large"
        else:
            assert body["error"]["type"] == "invalid_request_error"
            assert body["error"]["code"] == "request_too_large"
        sock = sock or conn.sock
        assert conn.sock is sock, "drained within bounds: the connection is kept"
    conn.request("GET", "/v1/models")
    r = conn.getresponse()
    r.read()
    assert r.status == 200 and conn.sock is sock
    status, _, _ = http_json("POST", g.base + "/v1/chat/completions",
                             {"model": "colibri", "messages": [{"role": "user", "content": "hola [[sim: tokens=2]]"}]},
                             {"Authorization": f"Bearer {key}"})
    assert status == 200


def endless_chunks(s: socket.socket, pause: float = 0.0, seconds: float = 20.0) -> tuple[int, float]:
    """Sends chunks until the server hangs up; returns (bytes sent, seconds it took)."""
    chunk = b"a" * (64 * 1024 if not pause else 1)
    frame = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    sent = 0
    started = time.time()
    while time.time() - started < seconds:
        try:
            s.sendall(frame)
        except (BrokenPipeError, ConnectionResetError, socket.timeout):
            break
        sent += len(chunk)
        if pause:
            time.sleep(pause)  # the drip's pace: time passing is the point
            s.setblocking(False)
            try:
                if s.recv(65536) == b"":
                    break
            except BlockingIOError:
                pass
            except ConnectionResetError:
                break
            finally:
                s.setblocking(True)
    return sent, time.time() - started


@pytest.mark.parametrize("pace", ["flood", "drip"])
def test_an_endless_refused_chunked_body_is_cut_off(small, pace):
    """A refused request (no key) with a chunked body that never ends: read up to 4x the limit
    (flood) or for 10 s (drip), then the connection is closed; the gateway serves others."""
    g, key = small
    s = socket.create_connection(("127.0.0.1", g.port), timeout=15)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Transfer-Encoding: chunked\r\n\r\n")
    if pace == "flood":
        sent, took = endless_chunks(s)
        assert sent < 16 * 1024 * 1024, f"{sent} bytes accepted"
        assert took < 10
    else:
        sent, took = endless_chunks(s, pause=0.25)
        assert 8 < took < 14, f"cut off after {took:.1f} s"
    s.close()
    status, _, _ = http_json("POST", g.base + "/v1/chat/completions",
                             {"model": "colibri", "messages": [{"role": "user", "content": "hola [[sim: tokens=2]]"}]},
                             {"Authorization": f"Bearer {key}"})
    assert status == 200
