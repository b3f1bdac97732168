"""Quipu's upstream HTTP/1.1 client against an upstream that is not the simulator: a plain
Python server that answers in the framings real servers use (HTTP/1.0 read-until-close, a
100 Continue first, chunk extensions and trailers, a body far larger than one read) and counts
the connections it is sent requests on, to show which responses let a connection be reused."""

from __future__ import annotations

import http.client
import itertools
import json
import socketserver
import threading
from http.server import BaseHTTPRequestHandler

import pytest

from harness import Gateway, free_port, http_json, sse_events

BIG = 300_000  # characters of content: several reads, past the 64 KiB the read buffer grows to


def completion(text: str) -> bytes:
    return json.dumps({
        "id": "cmpl-h1", "object": "chat.completion", "created": 1, "model": "upstream-colibri",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
    }).encode()


def stream_events(words: list[str]) -> bytes:
    def chunk(choices, usage=None):
        body = {"id": "c-h1", "object": "chat.completion.chunk", "created": 1,
                "model": "upstream-colibri", "choices": choices}
        if usage:
            body["usage"] = usage
        return b"data: " + json.dumps(body).encode() + b"\n\n"
    out = chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
    for w in words:
        out += chunk([{"index": 0, "delta": {"content": w}, "finish_reason": None}])
    out += chunk([{"index": 0, "delta": {}, "finish_reason": "stop"}])
    out += chunk([], {"prompt_tokens": 7, "completion_tokens": len(words), "total_tokens": 7 + len(words)})
    return out + b"data: [DONE]\n\n"


def chunked(payload: bytes, size: int) -> bytes:
    """`payload` in chunks of `size` bytes (cut anywhere, mid-event too), with an extension on
    each chunk and a trailer at the end."""
    out = b""
    for i in range(0, len(payload), size):
        part = payload[i:i + size]
        out += b"%x;piece=%d\r\n" % (len(part), i) + part + b"\r\n"
    return out + b"0\r\nx-checksum: 1\r\n\r\n"


class Upstream(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    posts: list[tuple[int, str]] = []  # (connection number, mode) of every chat request
    connections = itertools.count()

    def setup(self):
        super().setup()
        self.number = next(Upstream.connections)

    def log_message(self, *args):  # quiet
        pass

    def do_GET(self):
        self.wfile.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        mode = body["messages"][-1]["content"]
        Upstream.posts.append((self.number, mode))
        if mode == "http10":
            # No length, no chunking: the body ends when the connection closes.
            self.wfile.write(b"HTTP/1.0 200 OK\r\ncontent-type: application/json\r\n\r\n" + completion("diez"))
            self.close_connection = True
        elif mode == "continue":
            data = completion("siga")
            self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self.wfile.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(data) + data)
        elif mode == "big":
            data = completion("x" * BIG)
            self.wfile.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
                             % len(data) + data)
        elif mode == "keepalive":
            data = completion("otra vez")
            self.wfile.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(data) + data)
        elif mode == "close":
            # Says `close` but leaves the connection open: the client must not reuse it.
            data = completion("adiós")
            self.wfile.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: %d\r\n\r\n"
                             % len(data) + data)
        elif mode == "stream":
            self.wfile.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                             b"transfer-encoding: chunked\r\n\r\n")
            self.wfile.write(chunked(stream_events(["ha", "ce ", "sol ", "hoy"]), 37))
        self.wfile.flush()


class Server(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True


@pytest.fixture(scope="module")
def upstream_gw(workdir):
    port = free_port()
    server = Server(("127.0.0.1", port), Upstream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    gw = Gateway(workdir, {"colibri": [f"http://127.0.0.1:{port}/v1"]}, name="quipu-h1").start()
    _, key = gw.new_tenant("h1-upstream")
    yield gw, key
    gw.stop()
    server.shutdown()


def ask(gw, key, mode, **kw):
    return http_json("POST", gw.base + "/v1/chat/completions",
                     {"model": "colibri", "messages": [{"role": "user", "content": mode}], **kw},
                     {"Authorization": f"Bearer {key}"}, timeout=30)


@pytest.mark.parametrize("mode,content", [("http10", "diez"), ("continue", "siga"), ("close", "adiós")])
def test_framings_real_servers_use(upstream_gw, mode, content):
    gw, key = upstream_gw
    status, body, _ = ask(gw, key, mode)
    assert status == 200, body
    assert body["choices"][0]["message"]["content"] == content
    assert body["usage"]["prompt_tokens"] == 7 and body["usage"]["completion_tokens"] == 3


def test_a_body_larger_than_the_read_buffer(upstream_gw):
    gw, key = upstream_gw
    status, body, _ = ask(gw, key, "big")
    assert status == 200
    assert body["choices"][0]["message"]["content"] == "x" * BIG


def test_a_chunked_stream_cut_mid_event_with_extensions_and_trailers(upstream_gw):
    gw, key = upstream_gw
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=30)
    conn.request("POST", "/v1/chat/completions",
                 json.dumps({"model": "colibri", "stream": True,
                             "stream_options": {"include_usage": True},
                             "messages": [{"role": "user", "content": "stream"}]}),
                 {"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    resp = conn.getresponse()
    text = resp.read().decode()
    conn.close()
    assert resp.status == 200, text
    events = [d for _, d in sse_events(text)]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(d) for d in events[:-1]]
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert content == "hace sol hoy"
    assert chunks[-1]["usage"]["completion_tokens"] == 4


def test_connections_are_reused_only_when_the_response_allows_it(upstream_gw):
    gw, key = upstream_gw
    for mode in ["keepalive"] * 5 + ["close"] * 3:
        status, _, _ = ask(gw, key, mode)
        assert status == 200
    keepalive = {conn for conn, mode in Upstream.posts if mode == "keepalive"}
    closing = [conn for conn, mode in Upstream.posts if mode == "close"]
    # Five requests in a row on a kept-alive connection: one connection (two if the first
    # went out on a pooled one the upstream had just closed).
    assert len(keepalive) <= 2, Upstream.posts
    # A `Connection: close` response is never followed by another request on its connection
    # (the upstream here leaves it open, so only the client can keep that promise).
    assert len(set(closing)) == len(closing), Upstream.posts
