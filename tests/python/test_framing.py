"""HTTP/1.1 request framing on raw sockets: a request whose framing is ambiguous (both
`Content-Length` and `Transfer-Encoding`) is answered at most once and its connection closed
(RFC 9112 §6.1), so no bytes after it can be read as a second, smuggled request; an
absolute-form request target (RFC 9112 §3.2.2) is served like the origin-form one, and only
ever by Quipu's own routes."""

from __future__ import annotations

import json
import socket
import sqlite3
import time

import pytest

from harness import Gateway, Sim, wait_until

CHAT = json.dumps({"model": "colibri", "messages": [{"role": "user", "content": "hola [[sim: tokens=2]]"}]}).encode()


@pytest.fixture(scope="module")
def framing(workdir):
    sim = Sim(workdir, name="sim-framing").start()
    gw = Gateway(workdir, {"colibri": [sim.api_base]}, name="quipu-framing").start()
    _, key = gw.new_tenant("framing")
    yield gw, sim, key
    gw.stop()
    sim.stop()


def responses_until_close(port: int, request: bytes, timeout: float = 10.0) -> tuple[list[bytes], bool]:
    """Sends `request` and reads until the server closes the connection (or `timeout` passes
    without it). Returns the status lines of every response read, and whether it closed."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    got = b""
    closed = False
    try:
        s.sendall(request)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            s.settimeout(max(0.05, deadline - time.monotonic()))
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            except ConnectionResetError:
                closed = True
                break
            if not chunk:
                closed = True
                break
            got += chunk
    finally:
        s.close()
    return status_lines(got), closed


def status_lines(data: bytes) -> list[bytes]:
    """The status line of each whole response in `data`, read as a client would: each head,
    then the body its `Content-Length` or chunked framing says."""
    out = []
    while data:
        head, sep, rest = data.partition(b"\r\n\r\n")
        if not sep:
            break
        lines = head.split(b"\r\n")
        out.append(lines[0])
        fields = {k.strip().lower(): v.strip() for k, _, v in (line.partition(b":") for line in lines[1:])}
        if fields.get(b"transfer-encoding", b"").lower() == b"chunked":
            while True:
                size_line, _, rest = rest.partition(b"\r\n")
                size = int(size_line.split(b";")[0], 16)
                rest = rest[size + 2:]
                if size == 0:
                    break
        else:
            rest = rest[int(fields.get(b"content-length", b"0")):]
        data = rest
    return out


def ledger_count(gw: Gateway) -> int:
    con = sqlite3.connect(gw.store_url.removeprefix("sqlite://"))
    try:
        return con.execute("SELECT COUNT(*) FROM ledger WHERE kind = 'request'").fetchone()[0]
    finally:
        con.close()


def test_content_length_and_chunked_body_smuggling_one_answer_then_close(framing):
    """The probe's request: `Content-Length: 41` and `Transfer-Encoding: chunked`, a chunked
    body that ends at once and a `GET /v1/models` behind it. A front end framing by
    Content-Length sees one request; so must the client: one answer, then the close."""
    gw, _, key = framing
    smuggled = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
    body = b"0\r\n\r\n" + smuggled
    assert len(body) == 41
    request = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
               + f"Authorization: Bearer {key}\r\n".encode()
               + b"Content-Type: application/json\r\nContent-Length: 41\r\n"
               + b"Transfer-Encoding: chunked\r\n\r\n" + body)
    statuses, closed = responses_until_close(gw.port, request)
    assert len(statuses) <= 1, f"the smuggled request was answered too: {statuses}"
    assert closed, "the connection stayed open after a request with both Content-Length and Transfer-Encoding"


def test_chunked_then_short_content_length_smuggling_one_answer_then_close(framing):
    """`Transfer-Encoding: chunked` first and a short `Content-Length`: the chunked chat is
    served (and billed once), then the connection closes; the request behind it is never
    read as one."""
    gw, _, key = framing
    rows_before = ledger_count(gw)
    chunked = f"{len(CHAT):x}\r\n".encode() + CHAT + b"\r\n0\r\n\r\n"
    smuggled = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
    request = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
               + f"Authorization: Bearer {key}\r\n".encode()
               + b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n"
               + chunked + smuggled)
    statuses, closed = responses_until_close(gw.port, request)
    assert statuses == [b"HTTP/1.1 200 OK"], statuses
    assert closed, "the connection stayed open after a request with both Content-Length and Transfer-Encoding"
    wait_until(lambda: ledger_count(gw) == rows_before + 1, 10, "the chat's ledger row")


def test_an_unambiguous_request_keeps_its_connection(framing):
    """The same chat framed by Content-Length alone keeps the connection: the close above is
    caused by the ambiguity, not by every POST."""
    gw, _, key = framing
    one = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
           + f"Authorization: Bearer {key}\r\n".encode()
           + b"Content-Type: application/json\r\n"
           + f"Content-Length: {len(CHAT)}\r\n\r\n".encode() + CHAT)
    models = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    statuses, closed = responses_until_close(gw.port, one + models)
    assert statuses == [b"HTTP/1.1 200 OK", b"HTTP/1.1 200 OK"], statuses
    assert closed


@pytest.mark.parametrize("host", ["matching", "other"])
def test_absolute_form_target_is_served_like_origin_form(framing, host):
    """`POST http://host:port/v1/chat/completions`: answered as `/v1/chat/completions` is,
    with the Host header (RFC 9112 §3.2.2: ignored when the target has an authority)."""
    gw, sim, key = framing
    authority = f"127.0.0.1:{gw.port}"
    host_header = authority if host == "matching" else "example.com"
    request = (f"POST http://{authority}/v1/chat/completions HTTP/1.1\r\nHost: {host_header}\r\n".encode()
               + f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n".encode()
               + f"Content-Length: {len(CHAT)}\r\nConnection: close\r\n\r\n".encode() + CHAT)
    s = socket.create_connection(("127.0.0.1", gw.port), timeout=10)
    got = b""
    try:
        s.sendall(request)
        while chunk := s.recv(65536):
            got += chunk
    finally:
        s.close()
    head, _, body = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), got[:300]
    answer = json.loads(body)
    assert answer["object"] == "chat.completion" and answer["model"] == "colibri", answer


def test_absolute_form_target_to_another_host_is_still_quipus_own_route(framing):
    """An absolute-form target naming another host is no proxy request: Quipu answers it from
    its own routes (here the catalog), and nothing is fetched from that host."""
    gw, _, _ = framing
    request = b"GET http://169.254.169.254/v1/models HTTP/1.1\r\nHost: 169.254.169.254\r\nConnection: close\r\n\r\n"
    s = socket.create_connection(("127.0.0.1", gw.port), timeout=10)
    got = b""
    try:
        s.sendall(request)
        while chunk := s.recv(65536):
            got += chunk
    finally:
        s.close()
    head, _, body = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), got[:300]
    assert {m["slug"] for m in json.loads(body)["models"]} == {"colibri"}
