"""Helpers for the client-transport tests (`test_tls_h2.py`, `test_transport_hostile.py`):
a test CA and certificates, a gateway with a TLS listener, exact-billing checks against the
simulator's request log, a raw HTTP/2 client built from frames, ClientHello bytes, and a
latency probe that runs in its own process (so a test's own load does not skew it)."""

from __future__ import annotations

import http.client
import json
import multiprocessing
import os
import pathlib
import socket
import sqlite3
import ssl
import statistics
import struct
import time
import urllib.error
import urllib.request
import warnings
from dataclasses import dataclass
from decimal import Decimal

import hpack
import trustme
from cryptography import x509

from harness import Gateway, Sim, wait_until

PICOS = 10**12
# Per million tokens (input, cached, output), as harness.model_block configures them.
PRICES = {
    "colibri": (Decimal("0.20"), Decimal("0.05"), Decimal("0.80")),
    "aguila": (Decimal("1.00"), Decimal("0.25"), Decimal("4.00")),
    "apu": (Decimal("3.00"), Decimal("0.75"), Decimal("12.00")),
}


# --- certificates ---------------------------------------------------------------------------


@dataclass
class Leaf:
    """A certificate (with its chain) and its key, as PEM bytes, and the paths they were
    first written to."""

    cert_path: pathlib.Path
    key_path: pathlib.Path
    cert_pem: bytes
    key_pem: bytes
    serial: int
    common_name: str

    def install(self, cert_path: pathlib.Path, key_path: pathlib.Path) -> None:
        """Replaces the files at `cert_path`/`key_path` with this pair (each by an atomic
        rename, as a certificate manager does)."""
        for path, data in ((key_path, self.key_pem), (cert_path, self.cert_pem)):
            tmp = path.with_name(path.name + ".new")
            tmp.write_bytes(data)
            os.replace(tmp, path)


class TestCA:
    """A throwaway certificate authority (trustme) whose PEM is written to `workdir`."""

    __test__ = False  # not a pytest class

    def __init__(self, workdir: pathlib.Path, name: str):
        self.workdir = workdir
        self.name = name
        self.ca = trustme.CA(organization_name=f"Quipu test CA {name}")
        self.path = workdir / f"{name}-ca.pem"
        self.ca.cert_pem.write_to_path(str(self.path))

    def issue(self, stem: str, common_name: str = "localhost") -> Leaf:
        cert = self.ca.issue_cert("localhost", "127.0.0.1", common_name=common_name)
        chain = b"".join(blob.bytes() for blob in cert.cert_chain_pems)
        key = cert.private_key_pem.bytes()
        cert_path, key_path = self.workdir / f"{stem}-cert.pem", self.workdir / f"{stem}-key.pem"
        cert_path.write_bytes(chain)
        key_path.write_bytes(key)
        serial = x509.load_pem_x509_certificate(cert.cert_chain_pems[0].bytes()).serial_number
        return Leaf(cert_path, key_path, chain, key, serial, common_name)

    def context(self, alpn: list[str] | None = None) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.path))
        if alpn:
            ctx.set_alpn_protocols(alpn)
        return ctx


def peer_serial(port: int, ctx: ssl.SSLContext, host: str = "localhost") -> int:
    """The serial number of the certificate a new TLS connection to `port` is shown."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname=host) as s:
            return x509.load_der_x509_certificate(s.getpeercert(binary_form=True)).serial_number


# --- a gateway with a TLS listener ----------------------------------------------------------


def https_json(method: str, url: str, ctx: ssl.SSLContext, body=None, headers=None, timeout: float = 30.0):
    """`harness.http_json` over https with `ctx`: (status, parsed JSON or text, headers)."""
    data = None if body is None else (body if isinstance(body, (bytes, bytearray)) else json.dumps(body).encode())
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None and "Content-Type" not in (headers or {}):
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=ctx) as r:
            raw, status, hdrs = r.read(), r.status, dict(r.headers)
    except urllib.error.HTTPError as e:
        raw, status, hdrs = e.read(), e.code, dict(e.headers)
    try:
        return status, json.loads(raw), hdrs
    except ValueError:
        return status, raw.decode(errors="replace"), hdrs


class TlsGateway(Gateway):
    """A `quipu serve` whose API listener serves TLS with `leaf` (`[server] tls = {…}`); its
    `base` is https://localhost:PORT, and readiness and key checks go over TLS with the CA."""

    def __init__(self, workdir, upstreams, ca: TestCA, leaf: Leaf, name: str, server_extra: str = "", **kw):
        self.ca = ca
        self.cert_path, self.key_path = leaf.cert_path, leaf.key_path
        tls = f'tls = {{ cert = "{leaf.cert_path}", key = "{leaf.key_path}" }}'
        super().__init__(workdir, upstreams, name=name, server_extra=tls + "\n" + server_extra, **kw)

    @property
    def base(self) -> str:
        return f"https://localhost:{self.port}"

    def request(self, method: str, path: str, body=None, headers=None, timeout: float = 30.0):
        return https_json(method, self.base + path, self.ca.context(), body, headers, timeout)

    def wait_ready(self, timeout: float = 20.0) -> None:
        def up():
            if self.process and not self.process.alive():
                raise RuntimeError(f"quipu exited:\n{self.process.tail()}")
            return self.request("GET", "/health", timeout=2)[0] == 200

        wait_until(up, timeout, what="quipu (TLS) ready")

    def wait_key(self, secret: str, timeout: float = 3.0) -> None:
        wait_until(lambda: self.request("POST", "/v1/chat/completions", b"{}",
                                        {"Authorization": f"Bearer {secret}"})[0] != 401,
                   timeout, what="the new key to reach the gateway")


def log_lines(gw: Gateway) -> list[str]:
    return gw.process.log_path.read_text(errors="replace").splitlines()


# --- billing checks -------------------------------------------------------------------------


def ledger_rows(gw: Gateway) -> dict[str, dict]:
    con = sqlite3.connect(gw.store_url.removeprefix("sqlite://"))
    con.row_factory = sqlite3.Row
    rows = {r["entry_id"]: dict(r) for r in con.execute("SELECT * FROM ledger WHERE kind = 'request'")}
    con.close()
    return rows


def wait_rows(gw: Gateway, ids, timeout: float = 15.0) -> dict[str, dict]:
    """The ledger rows once every id in `ids` has one (or at the deadline)."""
    ids = set(ids)
    deadline = time.time() + timeout
    while True:
        rows = ledger_rows(gw)
        if ids <= set(rows) or time.time() > deadline:
            return rows
        time.sleep(0.05)


def sim_records(sim: Sim, since: int, ids=None, timeout: float = 15.0) -> dict[str, dict]:
    """The simulator's records since `since` by request id; waits until every id in `ids` is
    there (the simulator logs a request when it is done with it)."""
    deadline = time.time() + timeout
    while True:
        recs = {r["request_id"]: r for r in sim.requests(since) if r["request_id"]}
        if ids is None or set(ids) <= set(recs) or time.time() > deadline:
            return recs
        time.sleep(0.05)


def picos(model: str, prompt: int, cached: int, completion: int) -> int:
    """A charge in pico-soles (exact: prices have 2 decimals, per million tokens)."""
    i, c, o = PRICES[model]
    value = ((prompt - cached) * i + cached * c + completion * o) * PICOS / 1_000_000
    assert value == int(value)
    return int(value)


def billing_problems(rows: dict[str, dict], recs: dict[str, dict], ids) -> list[str]:
    """What is wrong with the rows of `ids` against the simulator's usage × the model's prices
    (requests that ran to their end)."""
    problems = []
    for rid in ids:
        row, rec = rows.get(rid), recs.get(rid)
        if row is None or rec is None:
            problems.append(f"{rid}: row {row is not None}, simulator record {rec is not None}")
            continue
        model = rec["model"].removeprefix("upstream-")
        got = (row["input_tokens"], row["cached_tokens"], row["output_tokens"], row["input_estimated"], row["unbilled"])
        want = (rec["prompt_tokens"], rec["cached_tokens"], rec["completion_tokens"], 0, 0)
        if got != want:
            problems.append(f"{rid}: tokens {got} != {want}")
        if (row["status"], row["http_status"]) != ("ok", 200):
            problems.append(f"{rid}: status {row['status']} / {row['http_status']}")
        charge = picos(model, rec["prompt_tokens"], rec["cached_tokens"], rec["completion_tokens"])
        if -row["delta"] != charge or charge <= 0:
            problems.append(f"{rid}: charged {-row['delta']} pico-soles, expected {charge}")
    return problems


# --- TLS ClientHello bytes ------------------------------------------------------------------


def client_hello(min_version=None, max_version=None, ciphers: str | None = None, alpn=None) -> bytes:
    """The bytes of the ClientHello Python's OpenSSL would send (made in memory)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    if ciphers:
        ctx.set_ciphers(ciphers)
    with warnings.catch_warnings():  # TLS 1.1 is deprecated, which is the point
        warnings.simplefilter("ignore", DeprecationWarning)
        if min_version:
            ctx.minimum_version = min_version
        if max_version:
            ctx.maximum_version = max_version
    if alpn:
        ctx.set_alpn_protocols(alpn)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_hostname="localhost")
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()


def tls11_client_hello() -> bytes:
    """A TLS 1.1 ClientHello built by hand (today's OpenSSL builds may refuse to make one):
    legacy version 3.2 in the record and the hello, no supported_versions extension, a few
    TLS 1.0/1.1 cipher suites, SNI and the EC extensions such a client sends."""

    def ext(kind: int, data: bytes) -> bytes:
        return struct.pack("!HH", kind, len(data)) + data

    sni_name = b"localhost"
    sni = struct.pack("!HBH", len(sni_name) + 3, 0, len(sni_name)) + sni_name
    groups = struct.pack("!H", 4) + struct.pack("!HH", 0x001D, 0x0017)
    points = bytes([1, 0])
    extensions = ext(0x0000, sni) + ext(0x000A, groups) + ext(0x000B, points) + ext(0xFF01, b"\x00")
    suites = [0xC013, 0xC014, 0xC009, 0xC00A, 0x002F, 0x0035]
    body = (b"\x03\x02" + os.urandom(32) + b"\x00"
            + struct.pack("!H", 2 * len(suites)) + b"".join(struct.pack("!H", s) for s in suites)
            + b"\x01\x00" + struct.pack("!H", len(extensions)) + extensions)
    handshake = b"\x01" + len(body).to_bytes(3, "big") + body
    return b"\x16\x03\x02" + struct.pack("!H", len(handshake)) + handshake


def read_until_closed(sock: socket.socket, timeout: float) -> tuple[bytes, float | None]:
    """Reads until the peer closes (returns what arrived and when it closed, seconds from the
    call) or `timeout` passes (closed-at None)."""
    started = time.monotonic()
    got = b""
    while True:
        left = timeout - (time.monotonic() - started)
        if left <= 0:
            return got, None
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            return got, None
        except OSError:  # reset, or a TLS connection cut without close_notify
            return got, time.monotonic() - started
        if not chunk:
            return got, time.monotonic() - started
        got += chunk


# --- a raw HTTP/2 client ---------------------------------------------------------------------

FRAME_DATA, FRAME_HEADERS, FRAME_PRIORITY, FRAME_RST, FRAME_SETTINGS = 0x0, 0x1, 0x2, 0x3, 0x4
FRAME_PUSH, FRAME_PING, FRAME_GOAWAY, FRAME_WINDOW_UPDATE, FRAME_CONTINUATION = 0x5, 0x6, 0x7, 0x8, 0x9
FLAG_END_STREAM, FLAG_ACK, FLAG_END_HEADERS = 0x1, 0x1, 0x4
PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR, REFUSED_STREAM, CANCEL = 0x1, 0x2, 0x3, 0x7, 0x8
COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 0x9, 0xB
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + struct.pack("!I", stream_id & 0x7FFFFFFF) + payload


def settings_frame(**settings: int) -> bytes:
    ids = {"header_table_size": 1, "enable_push": 2, "max_concurrent_streams": 3,
           "initial_window_size": 4, "max_frame_size": 5, "max_header_list_size": 6}
    return frame(FRAME_SETTINGS, 0, 0, b"".join(struct.pack("!HI", ids[k], v) for k, v in settings.items()))


def hpack_int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """An HPACK integer with an N-bit prefix, OR-ed into `first`'s high bits."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = [first | limit]
    value -= limit
    while value >= 128:
        out.append((value % 128) + 128)
        value //= 128
    out.append(value)
    return bytes(out)


def hpack_literal(name: bytes, value: bytes, index: bool = False) -> bytes:
    """A literal header field with a new name (no Huffman): with incremental indexing (inserted
    into the decoder's dynamic table) or without indexing."""
    return (bytes([0x40 if index else 0x00]) + hpack_int(len(name), 7) + name
            + hpack_int(len(value), 7) + value)


class H2Frames:
    """A client HTTP/2 connection on a raw socket, frame by frame: sends what a test builds
    (well-formed or not) and parses what the server sends back, with its own HPACK
    encoder/decoder (every request header block is encoded by one stateful encoder, so the
    blocks must reach the server in the order they were encoded)."""

    def __init__(self, port: int, ctx: ssl.SSLContext | None = None, settings: dict | None = None,
                 timeout: float = 10.0, ack_data: bool = True):
        raw = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if ctx is not None:
            self.sock = ctx.wrap_socket(raw, server_hostname="localhost")
            assert self.sock.selected_alpn_protocol() == "h2", self.sock.selected_alpn_protocol()
        else:
            self.sock = raw
        self.scheme = b"https" if ctx is not None else b"http"
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self.decoder.max_allowed_table_size = 1 << 16
        self.buf = b""
        self.next_id = 1
        self.ack_data = ack_data
        self.closed = False
        self.goaway: tuple[int, int] | None = None  # (last stream id, error code)
        self.streams: dict[int, dict] = {}
        self.server_settings: dict[int, int] = {}
        self.frames_in = 0
        self.log: list[tuple[int, int, int, int]] = []  # (type, flags, stream, length) received
        self.sendall(PREFACE + settings_frame(**(settings or {})))

    # sending

    def sendall(self, data: bytes) -> bool:
        """Sends; False once the server has closed the connection."""
        try:
            self.sock.sendall(data)
            return True
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError, OSError):
            self.closed = True
            return False

    def new_stream(self) -> int:
        sid = self.next_id
        self.next_id += 2
        self.streams[sid] = {"status": None, "headers": [], "data": bytearray(), "ended": False, "reset": None,
                             "resets": []}
        return sid

    def request_headers(self, path: str, headers: dict | None = None, method: str = "POST") -> bytes:
        pairs = [(":method", method), (":scheme", self.scheme.decode()), (":authority", "localhost"), (":path", path)]
        pairs += [(k.lower(), v) for k, v in (headers or {}).items()]
        return self.encoder.encode(pairs)

    def headers_frames(self, sid: int, block: bytes, end_stream: bool) -> bytes:
        return frame(FRAME_HEADERS, FLAG_END_HEADERS | (FLAG_END_STREAM if end_stream else 0), sid, block)

    def post(self, path: str, body: dict | bytes, headers: dict, end_stream: bool = True) -> tuple[int, bytes]:
        """The frames of a POST with its body (in one DATA frame); returns (stream id, bytes)."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        sid = self.new_stream()
        hdrs = {"content-type": "application/json", "content-length": str(len(data)), **headers}
        out = self.headers_frames(sid, self.request_headers(path, hdrs), False)
        out += frame(FRAME_DATA, FLAG_END_STREAM if end_stream else 0, sid, data)
        return sid, out

    def rst(self, sid: int, code: int = CANCEL) -> bytes:
        return frame(FRAME_RST, 0, sid, struct.pack("!I", code))

    # receiving

    def pump(self, timeout: float = 0.5) -> bool:
        """Reads what has arrived (waiting up to `timeout` for something) and handles it;
        False once the connection is closed."""
        if self.closed:
            return False
        self.sock.settimeout(timeout)
        try:
            chunk = self.sock.recv(1 << 20)
        except (socket.timeout, ssl.SSLWantReadError):
            return True
        except (ConnectionResetError, BrokenPipeError, ssl.SSLError, OSError):
            self.closed = True
            return False
        if not chunk:
            self.closed = True
            return False
        self.buf += chunk
        replies = b""
        while len(self.buf) >= 9:
            length = int.from_bytes(self.buf[:3], "big")
            if len(self.buf) < 9 + length:
                break
            kind, flags = self.buf[3], self.buf[4]
            sid = struct.unpack("!I", self.buf[5:9])[0] & 0x7FFFFFFF
            payload = self.buf[9:9 + length]
            self.buf = self.buf[9 + length:]
            self.frames_in += 1
            if len(self.log) < 10_000:
                self.log.append((kind, flags, sid, length))
            replies += self.handle(kind, flags, sid, payload)
        if replies:
            self.sendall(replies)
        return True

    def handle(self, kind: int, flags: int, sid: int, payload: bytes) -> bytes:
        st = self.streams.get(sid)
        if kind == FRAME_SETTINGS and not flags & FLAG_ACK:
            for i in range(0, len(payload), 6):
                k, v = struct.unpack("!HI", payload[i:i + 6])
                self.server_settings[k] = v
            return frame(FRAME_SETTINGS, FLAG_ACK, 0)
        if kind == FRAME_PING and not flags & FLAG_ACK:
            return frame(FRAME_PING, FLAG_ACK, 0, payload)
        if kind == FRAME_GOAWAY:
            last, code = struct.unpack("!II", payload[:8])
            self.goaway = (last & 0x7FFFFFFF, code)
        elif kind == FRAME_RST and st is not None:
            code = struct.unpack("!I", payload[:4])[0]
            st["resets"].append(code)
            if st["reset"] is None:
                st["reset"] = code
        elif kind == FRAME_HEADERS and st is not None:
            block = payload
            if flags & 0x8:  # PADDED
                block = block[1:len(block) - block[0]]
            if flags & 0x20:  # PRIORITY
                block = block[5:]
            hdrs = self.decoder.decode(block, raw=True)
            st["headers"] += hdrs
            for k, v in hdrs:
                if k == b":status":
                    st["status"] = int(v)
            if flags & FLAG_END_STREAM:
                st["ended"] = True
        elif kind == FRAME_DATA:
            if st is not None:
                st["data"] += payload
                if flags & FLAG_END_STREAM:
                    st["ended"] = True
            if self.ack_data and payload:
                out = frame(FRAME_WINDOW_UPDATE, 0, 0, struct.pack("!I", len(payload)))
                if st is not None and not st["ended"]:
                    out += frame(FRAME_WINDOW_UPDATE, 0, sid, struct.pack("!I", len(payload)))
                return out
        return b""

    def run_until(self, done, timeout: float) -> bool:
        """Pumps until `done()` or the connection closes or `timeout`; returns done()."""
        deadline = time.monotonic() + timeout
        while not done() and time.monotonic() < deadline:
            if not self.pump(min(0.2, max(0.01, deadline - time.monotonic()))):
                break
        return bool(done())

    def wait_closed(self, timeout: float) -> bool:
        """Pumps until the server closes the connection; True if it did within `timeout`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.pump(min(0.2, max(0.01, deadline - time.monotonic()))):
                return True
        return False

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def sse_data(raw: bytes) -> list[str]:
    """The `data:` payloads of an SSE body (of its complete events, when it is still coming)."""
    text = raw.decode(errors="replace").replace("\r\n", "\n")
    text = text[:text.rfind("\n\n") + 2] if "\n\n" in text else ""
    return [line[5:].strip() for line in text.split("\n") if line.startswith("data:")]


# --- a latency probe in its own process --------------------------------------------------------


def _probe_main(port: int, ca_path: str | None, key: str, ready, stop, out) -> None:
    """Runs in a child process: one keep-alive HTTP/1.1 connection (TLS when `ca_path`), a
    small chat completion after another until `stop` is set; sends back the latencies (None
    for a request that failed). The first request (connecting, warming up) is not counted."""
    body = json.dumps({"model": "colibri", "max_tokens": 5,
                       "messages": [{"role": "user", "content": "hola [[sim: tokens=2]]"}]})
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}

    def connect():
        if ca_path:
            ctx = ssl.create_default_context(cafile=ca_path)
            ctx.set_alpn_protocols(["http/1.1"])
            return http.client.HTTPSConnection("localhost", port, timeout=10, context=ctx)
        return http.client.HTTPConnection("127.0.0.1", port, timeout=10)

    conn = connect()

    def one() -> float | None:
        nonlocal conn
        t = time.monotonic()
        try:
            conn.request("POST", "/v1/chat/completions", body, headers)
            r = conn.getresponse()
            r.read()
            return time.monotonic() - t if r.status == 200 else None
        except (OSError, http.client.HTTPException):
            conn.close()
            conn = connect()
            return None

    while one() is None and not stop.is_set():
        time.sleep(0.1)  # a poll: until the first request succeeds (the caller's deadline: 30 s)
    ready.set()
    samples: list[float | None] = []
    while not stop.is_set():
        samples.append(one())
        time.sleep(0.02)  # the probe's pace
    conn.close()
    out.send(samples)


class Probe:
    """A well-behaved client on its own connection, in its own process, measuring request
    latencies while it runs: `with Probe(...) as p: …attack…` then `p.samples`."""

    def __init__(self, port: int, key: str, ca_path: str | None = None):
        ctx = multiprocessing.get_context("spawn")
        self.stop, self.ready = ctx.Event(), ctx.Event()
        self.recv, send = ctx.Pipe(duplex=False)
        self.proc = ctx.Process(target=_probe_main, args=(port, ca_path, key, self.ready, self.stop, send), daemon=True)
        self.samples: list[float | None] = []

    def __enter__(self) -> "Probe":
        """Starts the probe and returns once it has made a first request (the samples taken
        from then on are the ones measured)."""
        self.proc.start()
        if not self.ready.wait(30):
            self.proc.kill()
            raise RuntimeError("the latency probe made no successful request in 30 s")
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        if self.recv.poll(30):
            self.samples = self.recv.recv()
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()

    @property
    def failures(self) -> int:
        return sum(1 for s in self.samples if s is None)

    @property
    def p50(self) -> float:
        ok = [s for s in self.samples if s is not None]
        return statistics.median(ok) if ok else float("inf")


def baseline_latency(port: int, key: str, ca_path: str | None, seconds: float = 1.0) -> Probe:
    with Probe(port, key, ca_path) as p:
        time.sleep(seconds)  # time passing is the point: the probe samples for `seconds`
    assert len(p.samples) >= 5 and p.failures == 0, p.samples
    return p


def assert_latency_kept(before: Probe, during: Probe, what: str) -> None:
    """The well-behaved client kept its latency during an attack: every request succeeded, and
    the median stayed within 5× the one before plus 50 ms (generous: a 2-core machine also
    runs the attacker and the simulator)."""
    assert during.samples, f"{what}: the probe made no request"
    assert during.failures == 0, f"{what}: {during.failures} of {len(during.samples)} probe requests failed"
    bound = 5 * before.p50 + 0.05
    assert during.p50 < bound, (f"{what}: the well-behaved client's median latency went from "
                                f"{before.p50 * 1000:.1f} ms to {during.p50 * 1000:.1f} ms (bound {bound * 1000:.0f} ms)")


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0
