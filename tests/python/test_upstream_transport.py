"""The upstream transport (issue 17): `https://` replicas verified against a CA bundle (or not,
when the operator says so), client certificates (mTLS), health checks over the same TLS, and
upstream host names resolved while the gateway runs (followed when they move, checked by
`serve --check`) — through the real binary, the TLS-serving simulator, the official SDKs and a
small DNS server of the test's own (dnslib) that answers from a mapping the test changes."""

from __future__ import annotations

import http.client
import re
import socket
import sqlite3
import subprocess
import threading
import time

import anthropic
import openai
import pytest
from dnslib import QTYPE, RCODE, RR, A
from dnslib.server import BaseResolver, DNSLogger, DNSServer

from harness import QUIPU, SIM, Gateway, Process, Sim, http_json, wait_until
from tls_support import (
    Leaf,
    TestCA,
    billing_problems,
    https_json,
    log_lines,
    peer_serial,
    sim_records,
    wait_rows,
)

# --- a simulator on any loopback address, over https when given a certificate ------------------


class Replica(Sim):
    """A `quipu-sim` listening on `host:port` (any 127.0.0.0/8 address: Linux routes the whole
    block to loopback). With `leaf` it serves HTTPS (its URL is then https://localhost:PORT,
    the name the certificate is for), and with `client_ca` it requires a client certificate
    signed by that CA; its `/sim/*` routes are then reached with `ca` and `client_leaf`."""

    def __init__(self, workdir, *args: str, host: str = "127.0.0.1", port: int | None = None,
                 leaf: Leaf | None = None, ca: TestCA | None = None, client_ca: TestCA | None = None,
                 client_leaf: Leaf | None = None, name: str = "sim"):
        self.host = host
        self.ctx = None
        tls: list[str] = []
        if leaf is not None:
            tls = ["--tls-cert", str(leaf.cert_path), "--tls-key", str(leaf.key_path)]
            if client_ca is not None:
                tls += ["--tls-client-ca", str(client_ca.path)]
            self.ctx = ca.context()
            if client_leaf is not None:
                self.ctx.load_cert_chain(str(client_leaf.cert_path), str(client_leaf.key_path))
        super().__init__(workdir, *tls, *args, port=port, name=name)

    @property
    def url(self) -> str:
        if self.ctx is not None:
            return f"https://localhost:{self.port}"
        return f"http://{self.host}:{self.port}"

    def call(self, method: str, path: str, body=None, timeout: float = 10.0):
        if self.ctx is not None:
            return https_json(method, self.url + path, self.ctx, body, timeout=timeout)
        return http_json(method, self.url + path, body, timeout=timeout)

    def start(self) -> "Replica":
        self.process = Process([str(SIM), "--listen", f"{self.host}:{self.port}", *self.args],
                               self.workdir / f"{self.name}-{self.port}.log")
        self.process.start()
        wait_until(lambda: self.call("GET", "/health", timeout=2)[0] in (200, 503), what=f"{self.name} up")
        return self

    def requests(self, since: int = 0) -> list[dict]:
        status, body, _ = self.call("GET", f"/sim/requests?since={since}")
        assert status == 200, body
        return body["requests"]

    def stats(self) -> dict:
        return self.call("GET", "/sim/stats")[1]

    def set_healthy(self, healthy: bool) -> None:
        assert self.call("POST", "/sim/health", {"healthy": healthy})[0] == 200

    def chat_ids(self, since: int) -> list[str]:
        return [r["request_id"] for r in self.requests(since)]


def same_free_port(*hosts: str) -> int:
    """A TCP port free on every one of `hosts` at once."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind((hosts[0], 0))
            port = s.getsockname()[1]
            try:
                for h in hosts[1:]:
                    with socket.socket() as t:
                        t.bind((h, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no port free on all of {hosts}")


# --- a DNS server answering from a mapping the test changes -------------------------------------


class MappedResolver(BaseResolver):
    """A records from `names` ({name: (address, ttl)}); NXDOMAIN for any other name; NOERROR
    with no answer for other record types of a known name. A name in `tcp_only` is answered
    over UDP with the TC (truncated) bit and no records, as a large answer is, so a resolver
    must ask again over TCP. A name in `delays` is answered that many seconds late. Every query
    is logged: (monotonic time, name, type, protocol)."""

    def __init__(self):
        self.names: dict[str, tuple[str, int]] = {}
        self.tcp_only: set[str] = set()
        self.delays: dict[str, float] = {}
        self.queries: list[tuple[float, str, str, str]] = []
        self.lock = threading.Lock()

    def point(self, name: str, address: str, ttl: int = 1) -> None:
        with self.lock:
            self.names[name] = (address, ttl)

    def resolve(self, request, handler):
        reply = request.reply()
        name = str(request.q.qname).rstrip(".").lower()
        kind = QTYPE[request.q.qtype]
        with self.lock:
            self.queries.append((time.monotonic(), name, kind, handler.protocol))
            found = self.names.get(name)
            delay = self.delays.get(name, 0.0)
        if delay:
            time.sleep(delay)  # a slow server is the point; each query has its own thread
        if found is None:
            reply.header.rcode = RCODE.NXDOMAIN
            return reply
        if name in self.tcp_only and handler.protocol == "udp":
            reply.header.tc = 1
            return reply
        if kind == "A":
            address, ttl = found
            reply.add_answer(RR(request.q.qname, QTYPE.A, rdata=A(address), ttl=ttl))
        return reply

    def queried(self, name: str, after: float = 0.0, protocol: str | None = None) -> list[tuple]:
        with self.lock:
            return [q for q in self.queries
                    if q[1] == name and q[0] > after and (protocol is None or q[3] == protocol)]


class TestDns:
    """dnslib servers on 127.0.0.1:PORT, UDP and TCP, sharing one `MappedResolver`."""

    __test__ = False

    def __init__(self):
        self.resolver = MappedResolver()
        quiet = DNSLogger(logf=lambda _msg: None)
        for _ in range(50):
            port = same_free_port("127.0.0.1")
            try:
                udp = DNSServer(self.resolver, address="127.0.0.1", port=port, logger=quiet)
                try:
                    tcp = DNSServer(self.resolver, address="127.0.0.1", port=port, tcp=True, logger=quiet)
                except OSError:
                    udp.server.server_close()
                    continue
            except OSError:
                continue
            self.port, self.servers = port, (udp, tcp)
            break
        else:
            raise RuntimeError("no port for the test DNS server")
        for s in self.servers:
            s.start_thread()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def point(self, name: str, address: str, ttl: int = 1) -> None:
        self.resolver.point(name, address, ttl)

    def queried(self, name: str, after: float = 0.0, protocol: str | None = None) -> list[tuple]:
        return self.resolver.queried(name, after, protocol)

    def stop(self) -> None:
        for s in self.servers:
            s.stop()
            s.server.server_close()


@pytest.fixture(scope="module")
def dns():
    d = TestDns()
    yield d
    d.stop()


# --- shared pieces -------------------------------------------------------------------------------


def tenant_rows(gw: Gateway, tenant: str) -> dict[str, dict]:
    con = sqlite3.connect(gw.store_url.removeprefix("sqlite://"))
    con.row_factory = sqlite3.Row
    rows = {r["entry_id"]: dict(r) for r in con.execute(
        "SELECT l.* FROM ledger l JOIN tenants t ON t.id = l.tenant_id WHERE t.name = ? AND l.kind = 'request'",
        (tenant,))}
    con.close()
    return rows


def assert_exact_bill(gw: Gateway, sim: Sim, tenant: str, since: int, ids: list[str]) -> None:
    """One ledger row per request of `ids` and no other for the tenant, each equal to the
    simulator's usage × the model's prices."""
    assert all(ids) and len(set(ids)) == len(ids), ids
    recs = sim_records(sim, since, ids)
    wait_rows(gw, ids)
    gw.ledger_barrier()  # a stray row of any request so far would be stored by now
    rows = tenant_rows(gw, tenant)
    assert sorted(rows) == sorted(ids), f"{len(rows)} rows for {len(ids)} requests"
    problems = billing_problems(rows, recs, ids)
    assert not problems, "\n".join(problems[:20])


def clients(gw: Gateway, key: str, timeout: float = 30.0) -> tuple[openai.OpenAI, anthropic.Anthropic]:
    return (openai.OpenAI(base_url=gw.base + "/v1", api_key=key, max_retries=0, timeout=timeout),
            anthropic.Anthropic(base_url=gw.base, api_key=key, max_retries=0, timeout=timeout))


def four_requests(gw: Gateway, key: str, tag: str) -> list[str]:
    """Chat and messages, each not streamed and streamed, with the official SDKs; checks every
    answer's text and returns the request ids. (`tag`: one word; the simulator's `reply=`
    directive turns underscores into spaces.)"""
    assert tag.isalnum(), tag
    oc, ac = clients(gw, key)
    ids = []
    r = oc.chat.completions.with_raw_response.create(
        model="colibri", messages=[{"role": "user", "content": f"hola [[sim: reply=chat_{tag}_cifrado]]"}])
    ids.append(r.headers["x-request-id"])
    c = r.parse()
    assert c.choices[0].message.content == f"chat {tag} cifrado" and c.choices[0].finish_reason == "stop"
    r = oc.chat.completions.with_raw_response.create(
        model="colibri", stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": f"cuenta [[sim: reply=uno_dos_{tag}_tres]]"}])
    ids.append(r.headers["x-request-id"])
    chunks = list(r.parse())
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == f"uno dos {tag} tres"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    r = ac.messages.with_raw_response.create(
        model="aguila", max_tokens=200, messages=[{"role": "user", "content": f"hola [[sim: reply=mensaje_{tag}]]"}])
    ids.append(r.headers["request-id"])
    m = r.parse()
    assert m.content[0].text == f"mensaje {tag}" and m.stop_reason == "end_turn"
    r = ac.messages.with_raw_response.create(
        model="apu", max_tokens=200, stream=True,
        messages=[{"role": "user", "content": f"cuenta [[sim: reply=cinco_{tag}_seis]]"}])
    ids.append(r.headers["request-id"])
    events = list(r.parse())
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta")
    assert text == f"cinco {tag} seis" and events[-1].type == "message_stop"
    oc.close()
    ac.close()
    return ids


def assert_refused_fast(gw: Gateway, key: str, limit: float = 5.0) -> None:
    """A chat request gets 503 and a messages request 529, each in its client's error format,
    within `limit` seconds (never a hang); the non-streamed and the streamed form alike."""
    oc, ac = clients(gw, key, timeout=30)
    for stream in (False, True):
        t = time.monotonic()
        with pytest.raises(openai.APIStatusError) as e:
            r = oc.chat.completions.create(model="colibri", stream=stream,
                                           messages=[{"role": "user", "content": "hola"}])
            if stream:
                list(r)
        took = time.monotonic() - t
        assert e.value.status_code == 503, (e.value.status_code, e.value.body)
        assert took < limit, f"chat (stream={stream}) took {took:.1f} s to fail"
        assert "replica" in e.value.body["message"], e.value.body
        assert e.value.body["type"], e.value.body

        t = time.monotonic()
        with pytest.raises(anthropic.APIStatusError) as e:
            r = ac.messages.create(model="aguila", max_tokens=50, stream=stream,
                                   messages=[{"role": "user", "content": "hola"}])
            if stream:
                list(r)
        took = time.monotonic() - t
        assert e.value.status_code == 529, (e.value.status_code, e.value.body)
        assert isinstance(e.value, anthropic.OverloadedError)
        assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "overloaded_error", e.value.body
        assert "replica" in e.value.body["error"]["message"], e.value.body
        assert took < limit, f"messages (stream={stream}) took {took:.1f} s to fail"
    oc.close()
    ac.close()


def wait_log(gw: Gateway, pattern: str, timeout: float = 10.0, after: int = 0) -> str:
    """The first line of the gateway's log (from line `after` on) matching `pattern`."""
    found: list[str] = []

    def seen():
        found[:] = [ln for ln in log_lines(gw)[after:] if re.search(pattern, ln)]
        return bool(found)

    try:
        wait_until(seen, timeout, what=f"a log line matching {pattern!r}")
    except TimeoutError:
        raise AssertionError(f"no log line matches {pattern!r}; log tail:\n{gw.process.tail(30)}") from None
    return found[0]


def stop_all(*things) -> None:
    """Stops gateways (each must exit cleanly) and simulators, every one even if one fails."""
    unclean = []
    for t in things:
        if isinstance(t, Gateway):
            code = t.stop()
            if code != 0:
                unclean.append(f"{t.name} did not exit cleanly ({code}):\n{t.process.tail()}")
        else:
            t.stop()
    assert not unclean, "\n".join(unclean)


TLS_MODELS = ("colibri", "aguila", "apu")


# --- 1, 2 and 4: an https:// replica, verified --------------------------------------------------


@pytest.fixture(scope="module")
def https_replica(workdir):
    """A simulator serving HTTPS with a certificate from a test CA, and a gateway whose
    `upstream_tls.ca` is that CA (verification on, the default)."""
    ca = TestCA(workdir, "upstream")
    leaf = ca.issue("upstream-sim")
    sim = Replica(workdir, leaf=leaf, ca=ca, name="sim-https").start()
    gw = Gateway(workdir, {s: [sim.api_base] for s in TLS_MODELS}, name="quipu-up-tls",
                 model_extra=f'upstream_tls = {{ ca = "{ca.path}" }}').start()
    yield gw, sim, ca, leaf
    stop_all(gw, sim)


def test_an_https_replica_answers_both_formats_billed_exactly(https_replica):
    gw, sim, ca, leaf = https_replica
    assert sim.api_base.startswith("https://localhost:")
    # The replica's port speaks TLS only, with the certificate the CA issued.
    assert peer_serial(sim.port, ca.context()) == leaf.serial
    with pytest.raises((OSError, http.client.HTTPException)):
        http_json("GET", f"http://127.0.0.1:{sim.port}/health", timeout=5)

    _, key = gw.new_tenant("up-tls")
    since = sim.stats()["seq"]
    ids = four_requests(gw, key, "tls")
    assert_exact_bill(gw, sim, "up-tls", since, ids)
    assert gw.metric_value("quipu_upstream_healthy", model="colibri", replica=sim.api_base) == 1
    assert not any("NOT verified" in ln for ln in log_lines(gw))


def test_a_wrong_ca_fails_fast_and_says_why_and_verify_false_answers(https_replica, workdir):
    _, sim, _, _ = https_replica
    stranger = TestCA(workdir, "stranger")
    ups = {s: [sim.api_base] for s in TLS_MODELS}
    gw = Gateway(workdir, ups, name="quipu-wrong-ca",
                 model_extra=f'upstream_tls = {{ ca = "{stranger.path}" }}').start()
    try:
        _, key = gw.new_tenant("wrong-ca")
        since = sim.stats()["requests"]
        assert_refused_fast(gw, key)
        url = re.escape(sim.api_base)
        wait_log(gw, rf"replica {url} of (colibri|aguila|apu) failed its health check: TLS handshake failed: "
                     r".*invalid peer certificate: UnknownIssuer.*SNI: localhost")
        assert gw.metric_value("quipu_upstream_healthy", model="colibri", replica=sim.api_base) == 0
        # Nothing reached the replica's API (a failed handshake sends no request).
        assert sim.stats()["requests"] == since
        assert not any("NOT verified" in ln for ln in log_lines(gw))
    finally:
        stop_all(gw)

    # The same setup with `verify = false` answers, and says at start that it does not verify.
    gw = Gateway(workdir, ups, name="quipu-no-verify",
                 model_extra=f'upstream_tls = {{ ca = "{stranger.path}", verify = false }}').start()
    try:
        for slug in TLS_MODELS:
            wait_log(gw, rf"WARN.*model `{slug}`: upstream_tls\.verify = false — its https:// replicas' "
                         r"certificates are NOT verified", timeout=2)
        _, key = gw.new_tenant("no-verify")
        since = sim.stats()["seq"]
        ids = four_requests(gw, key, "sinverificar")
        assert_exact_bill(gw, sim, "no-verify", since, ids)
        assert not any("UnknownIssuer" in ln for ln in log_lines(gw))
    finally:
        stop_all(gw)


def test_health_checks_go_over_tls(https_replica):
    gw, sim, _, _ = https_replica
    _, key = gw.new_tenant("up-health")
    healthy = lambda: gw.metric_value("quipu_upstream_healthy", model="colibri", replica=sim.api_base)  # noqa: E731
    assert healthy() == 1
    mark = len(log_lines(gw))
    checks_before = sim.stats()["requests"]
    sim.set_healthy(False)
    try:
        # The check reached the replica over TLS and read its 503: the replica is out.
        wait_until(lambda: healthy() == 0, 5, what="quipu_upstream_healthy to go 0")
        wait_log(gw, rf"replica {re.escape(sim.api_base)} of colibri failed its health check: it answered 503",
                 after=mark)
        assert_refused_fast(gw, key)
    finally:
        sim.set_healthy(True)
    wait_until(lambda: healthy() == 1, 5, what="quipu_upstream_healthy back to 1")
    wait_log(gw, rf"replica {re.escape(sim.api_base)} of colibri is healthy", after=mark)
    ids = four_requests(gw, key, "devuelta")
    assert len(ids) == 4
    # Health checks are not chat requests: the simulator counted only these four.
    assert sim.stats()["requests"] == checks_before + 4


def test_the_server_name_is_the_urls_host_and_a_failed_attempt_says_why(https_replica, workdir, dns):
    """SNI and verification use the URL's host: the replica's certificate (from the trusted CA)
    is for `localhost`, and the URL names it `other-name.quipu.test`. That name's answer comes
    300 ms late, so the health check at start finds no address yet and the next one is a minute
    away: the requests themselves meet the failed handshake, fail at once (503/529), and each
    attempt's log line says why and what to check."""
    _, sim, ca, _ = https_replica
    name = "other-name.quipu.test"
    dns.point(name, "127.0.0.1", ttl=60)
    dns.resolver.delays[name] = 0.3
    url = f"https://{name}:{sim.port}/v1"
    gw = dns_gateway(workdir, dns, "quipu-sni", url, refresh_s=60, health_ms=60_000, models=TLS_MODELS,
                     model_extra=f'upstream_tls = {{ ca = "{ca.path}" }}').start()
    try:
        wait_log(gw, rf'"{re.escape(name)}" resolves to 127\.0\.0\.1:{sim.port}')
        _, key = gw.new_tenant("sni")
        since = sim.stats()["requests"]
        assert_refused_fast(gw, key)
        line = wait_log(gw, rf"request req_\w+ to {re.escape(url)} failed before any response: TLS handshake failed: "
                            rf'.*invalid peer certificate: certificate not valid for name "{re.escape(name)}".*SNI: {re.escape(name)}.*'
                            r" \(check the model's upstream_tls: CA bundle, server name, client certificate\)$")
        assert "UnknownIssuer" not in line
        assert sim.stats()["requests"] == since
        # It was the requests that found it, not a health check.
        assert not any("failed its health check" in ln for ln in log_lines(gw))
    finally:
        stop_all(gw)


# --- 3: mTLS -------------------------------------------------------------------------------------


def test_mtls_client_certificate(workdir):
    ca = TestCA(workdir, "mtls")
    leaf = ca.issue("mtls-sim")
    client = ca.issue("mtls-gateway", common_name="quipu-gateway")
    sim = Replica(workdir, leaf=leaf, ca=ca, client_ca=ca, client_leaf=client, name="sim-mtls").start()
    # The replica refuses a client without a certificate.
    with pytest.raises((OSError, http.client.HTTPException)):
        https_json("GET", sim.url + "/health", ca.context(), timeout=5)
    ups = {s: [sim.api_base] for s in TLS_MODELS}
    gw = Gateway(workdir, ups, name="quipu-mtls-none",
                 model_extra=f'upstream_tls = {{ ca = "{ca.path}" }}').start()
    try:
        _, key = gw.new_tenant("mtls-none")
        assert_refused_fast(gw, key)
        # The log says why: the replica's TLS alert (TLS 1.3 reports a refused client
        # certificate after the client's side of the handshake, on the first read).
        wait_log(gw, rf"replica {re.escape(sim.api_base)} of colibri failed its health check: .*CertificateRequired")
        assert gw.metric_value("quipu_upstream_healthy", model="colibri", replica=sim.api_base) == 0
        assert sim.stats()["requests"] == 0
    finally:
        stop_all(gw)

    gw = Gateway(workdir, ups, name="quipu-mtls", model_extra=(
        f'upstream_tls = {{ ca = "{ca.path}", client_cert = "{client.cert_path}", '
        f'client_key = "{client.key_path}" }}')).start()
    try:
        _, key = gw.new_tenant("mtls")
        since = sim.stats()["seq"]
        ids = four_requests(gw, key, "mtls")
        assert_exact_bill(gw, sim, "mtls", since, ids)
        assert gw.metric_value("quipu_upstream_healthy", model="colibri", replica=sim.api_base) == 1
        assert not any("failed its health check" in ln for ln in log_lines(gw))
    finally:
        stop_all(gw, sim)


# --- 5: upstream names followed while running ------------------------------------------------------


def dns_gateway(workdir, dns: TestDns, name: str, url: str, refresh_s: int, health_ms: int = 300,
                models=("colibri",), model_extra: str = "") -> Gateway:
    """A gateway whose `models` have the one replica `url`, resolving names with `dns`, and
    health checks every `health_ms` (the first one at start)."""
    gw = Gateway(workdir, {m: [url] for m in models}, name=name, model_extra=model_extra,
                 server_extra=f'dns_servers = ["{dns.address}"]\ndns_refresh_s = {refresh_s}')
    if health_ms != 300:
        gw.config_text = gw.config_text.replace("interval_ms = 300,", f"interval_ms = {health_ms},")
        assert f"interval_ms = {health_ms}," in gw.config_text
        gw.config_path.write_text(gw.config_text)
    return gw


def chat_once(gw: Gateway, key: str, timeout: float = 10.0) -> tuple[int, str | None]:
    status, body, hdrs = http_json("POST", gw.base + "/v1/chat/completions", {
        "model": "colibri", "max_tokens": 5, "messages": [{"role": "user", "content": "hola [[sim: tokens=2]]"}]},
        {"Authorization": f"Bearer {key}"}, timeout=timeout)
    return status, hdrs.get("x-request-id")


def pair(workdir, tag: str) -> tuple[Replica, Replica, int]:
    """Simulator A on 127.0.0.1:P and B on 127.0.0.2:P (the same port)."""
    port = same_free_port("127.0.0.1", "127.0.0.2")
    a = Replica(workdir, host="127.0.0.1", port=port, name=f"sim-{tag}-a").start()
    b = Replica(workdir, host="127.0.0.2", port=port, name=f"sim-{tag}-b").start()
    return a, b, port


def until_served_by(gw: Gateway, key: str, sim: Replica, limit: float, why=lambda: "") -> float:
    """Sends chat requests until one is answered by `sim` (its request log has the id);
    returns the seconds it took. Fails after `limit` seconds (saying `why()` too)."""
    since = sim.stats()["seq"]
    t = time.monotonic()
    while time.monotonic() - t < limit:
        status, rid = chat_once(gw, key, timeout=5)
        if status == 200 and rid in sim_records(sim, since, [rid], timeout=2):
            return time.monotonic() - t
        time.sleep(0.1)
    raise AssertionError(f"no request reached {sim.url} within {limit} s. {why()}\n"
                         f"gateway log:\n{gw.process.tail(6)}")


def assert_served_by(gw: Gateway, key: str, sim: Replica, other: Replica, n: int = 3) -> None:
    s_since, o_since = sim.stats()["seq"], other.stats()["seq"]
    ids = []
    for _ in range(n):
        status, rid = chat_once(gw, key)
        assert status == 200, status
        ids.append(rid)
    assert set(ids) <= set(sim_records(sim, s_since, ids)), f"not all of {ids} reached {sim.url}"
    assert not other.chat_ids(o_since), f"{other.url} got requests meant for {sim.url}"


def test_a_repointed_name_is_followed(workdir, dns):
    a, b, port = pair(workdir, "dns")
    name = "llm.quipu.test"
    dns.point(name, "127.0.0.1", ttl=1)
    url = f"http://{name}:{port}/v1"
    gw = dns_gateway(workdir, dns, "quipu-dns", url, refresh_s=2).start()
    try:
        wait_log(gw, rf'replica {re.escape(url)} of colibri: "{re.escape(name)}" resolves to 127\.0\.0\.1:{port}')
        _, key = gw.new_tenant("dns")
        assert_served_by(gw, key, a, b)
        assert dns.queried(name, protocol="udp"), "the gateway did not ask the configured DNS server"

        dns.point(name, "127.0.0.2", ttl=1)
        took = until_served_by(gw, key, b, limit=6)
        assert took < 5, f"the new address was followed after {took:.1f} s"
        wait_log(gw, rf'replica {re.escape(url)} of colibri: "{re.escape(name)}" now resolves to '
                     rf"127\.0\.0\.2:{port} \(was 127\.0\.0\.1:{port}\)", timeout=1)
        assert_served_by(gw, key, b, a)

        # B goes away and the name points back at A: a connect failure makes the gateway look
        # again at once.
        b.stop()
        dns.point(name, "127.0.0.1", ttl=1)
        took = until_served_by(gw, key, a, limit=6)
        assert took < 4, f"the move back was followed after {took:.1f} s"
        wait_log(gw, rf'"{re.escape(name)}" now resolves to 127\.0\.0\.1:{port} \(was 127\.0\.0\.2:{port}\)',
                 timeout=1)
        status, rid = chat_once(gw, key)
        assert status == 200 and rid in sim_records(a, 0, [rid])
    finally:
        stop_all(gw, a, b)


def queries_since(dns: TestDns, name: str, since: float):
    """A description of the DNS queries for `name` since `since` (for failure messages)."""
    return lambda: (f"DNS queries for {name} since then: "
                    f"{[(round(q[0] - since, 2), q[2], q[3]) for q in dns.queried(name, after=since)]}")


def test_dns_refresh_s_bounds_a_long_ttl(workdir, dns):
    """A record with a 5-minute TTL is still looked up again every `dns_refresh_s` (2 s), and
    a change is followed by then."""
    a, b, port = pair(workdir, "ttl")
    name = "long-ttl.quipu.test"
    dns.point(name, "127.0.0.1", ttl=300)
    url = f"http://{name}:{port}/v1"
    gw = dns_gateway(workdir, dns, "quipu-ttl", url, refresh_s=2).start()
    try:
        wait_log(gw, rf'"{re.escape(name)}" resolves to 127\.0\.0\.1:{port}')
        _, key = gw.new_tenant("ttl")
        assert_served_by(gw, key, a, b)
        moved = time.monotonic()
        dns.point(name, "127.0.0.2", ttl=300)
        took = until_served_by(gw, key, b, limit=6, why=queries_since(dns, name, moved))
        assert took < 5, f"followed after {took:.1f} s"
        wait_log(gw, rf'"{re.escape(name)}" now resolves to 127\.0\.0\.2:{port} \(was 127\.0\.0\.1:{port}\)',
                 timeout=1)
    finally:
        stop_all(gw, a, b)


def test_a_connect_failure_resolves_again_at_once(workdir, dns):
    """With a long TTL and `dns_refresh_s` (60 s), only the failed connect can make the
    gateway look the name up again: it does so at once, and the new address answers."""
    a, b, port = pair(workdir, "moved")
    name = "moved.quipu.test"
    dns.point(name, "127.0.0.2", ttl=60)
    url = f"http://{name}:{port}/v1"
    # Health checks only at start (the next one in a minute): a request finds the failure.
    gw = dns_gateway(workdir, dns, "quipu-moved", url, refresh_s=60, health_ms=60_000).start()
    try:
        wait_log(gw, rf'"{re.escape(name)}" resolves to 127\.0\.0\.2:{port}')
        _, key = gw.new_tenant("moved")
        assert_served_by(gw, key, b, a)
        # Moved in DNS while B still answers: nothing makes the gateway look again yet.
        dns.point(name, "127.0.0.1", ttl=60)
        # Time passing is the point: nothing but the TTL (60 s) would make it look again, and
        # a resolver that ignored it would have looked again within this.
        time.sleep(1.5)
        assert_served_by(gw, key, b, a, n=2)
        # B goes away: the next request's connect fails, and the name is looked up again.
        b.stop()
        killed = time.monotonic()
        took = until_served_by(gw, key, a, limit=6, why=queries_since(dns, name, killed))
        assert took < 4, f"re-resolved after {took:.1f} s"
        assert dns.queried(name, after=killed), "no DNS query after the connect failure"
        wait_log(gw, rf'"{re.escape(name)}" now resolves to 127\.0\.0\.1:{port} \(was 127\.0\.0\.2:{port}\)',
                 timeout=1)
    finally:
        stop_all(gw, a, b)


def test_a_replica_that_moved_while_idle_is_found_again(workdir, dns):
    """No request is in flight when the replica moves: the health check's connect failure is
    the only sign, and it must make the gateway look the name up again too (else the model
    answers 503 until the TTL or `dns_refresh_s` runs out, here a minute)."""
    a, b, port = pair(workdir, "idle")
    name = "idle.quipu.test"
    dns.point(name, "127.0.0.2", ttl=60)
    url = f"http://{name}:{port}/v1"
    gw = dns_gateway(workdir, dns, "quipu-idle", url, refresh_s=60).start()
    try:
        wait_log(gw, rf'"{re.escape(name)}" resolves to 127\.0\.0\.2:{port}')
        _, key = gw.new_tenant("idle")
        assert_served_by(gw, key, b, a)
        dns.point(name, "127.0.0.1", ttl=60)
        b.stop()
        killed = time.monotonic()
        healthy = lambda: gw.metric_value("quipu_upstream_healthy", model="colibri", replica=url)  # noqa: E731
        wait_until(lambda: healthy() == 0, 3, what="the health check to find B gone")
        # Still no request: the checks alone must lead the gateway to A.
        try:
            wait_until(lambda: healthy() == 1, 5, what="the replica to be healthy again (at A)")
        except TimeoutError as e:
            raise AssertionError(f"{e}; {queries_since(dns, name, killed)()}; gateway log:\n"
                                 f"{gw.process.tail(4)}") from None
        status, rid = chat_once(gw, key)
        assert status == 200 and rid in sim_records(a, 0, [rid])
        wait_log(gw, rf'"{re.escape(name)}" now resolves to 127\.0\.0\.1:{port} \(was 127\.0\.0\.2:{port}\)',
                 timeout=1)
    finally:
        stop_all(gw, a, b)


# --- 6: serve --check ------------------------------------------------------------------------------


def serve_check(gw: Gateway) -> subprocess.CompletedProcess:
    return subprocess.run([str(QUIPU), "--config", str(gw.config_path), "serve", "--check"],
                          capture_output=True, text=True, env=gw.env(), timeout=60)


def test_serve_check_reports_unresolvable_names_and_missing_ca(workdir, dns):
    ca = TestCA(workdir, "check")
    dns.point("llm-check.quipu.test", "127.0.0.1", ttl=30)
    dns.point("tcp-only.quipu.test", "127.0.0.1", ttl=30)
    dns.resolver.tcp_only.add("tcp-only.quipu.test")
    missing = workdir / "no-such-ca.pem"
    servers = f'dns_servers = ["{dns.address}"]'

    bad = Gateway(workdir, {
        "colibri": ["http://llm-check.quipu.test:8000/v1", "http://nowhere.quipu.test:8000/v1"],
        "aguila": ["https://localhost:8443/v1", "http://also-nowhere.quipu.test/v1"],
    }, name="quipu-check-bad", server_extra=servers,
        model_extra=f'upstream_tls = {{ ca = "{missing}" }}')
    asked = time.monotonic()
    r = serve_check(bad)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    want = [
        r'^models\[0\]\.upstreams\[1\]: "nowhere\.quipu\.test" does not resolve: .+',
        r'^models\[1\]\.upstreams\[1\]: "also-nowhere\.quipu\.test" does not resolve: .+',
        rf"^model `aguila`: upstream_tls: .*{re.escape(str(missing))}",
    ]
    for pattern in want:
        assert sum(bool(re.search(pattern, ln)) for ln in lines) == 1, f"{pattern!r} not once in:\n{r.stderr}"
    assert len(lines) == len(want), r.stderr
    assert "llm-check" not in r.stderr
    # The names were asked of the configured server.
    assert dns.queried("nowhere.quipu.test", after=asked)
    assert dns.queried("llm-check.quipu.test", after=asked)

    # `quipu serve` itself refuses to start on the missing CA, naming the file.
    t = time.monotonic()
    p = subprocess.run([str(QUIPU), "--config", str(bad.config_path), "serve"],
                       capture_output=True, text=True, env=bad.env(), timeout=30)
    assert p.returncode != 0 and str(missing) in p.stderr, (p.returncode, p.stderr[-2000:])
    assert time.monotonic() - t < 10

    # Fixed: every name resolves (one only over TCP, after a truncated UDP answer) and the CA
    # loads.
    good = Gateway(workdir, {
        "colibri": ["http://llm-check.quipu.test:8000/v1", "http://tcp-only.quipu.test:8000/v1"],
        "aguila": ["https://localhost:8443/v1", "http://127.0.0.1:8001/v1"],
    }, name="quipu-check-good", server_extra=servers, model_extra=f'upstream_tls = {{ ca = "{ca.path}" }}')
    asked = time.monotonic()
    r = serve_check(good)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    assert "configuration OK" in r.stdout and "every upstream name resolves" in r.stdout, r.stdout
    assert dns.queried("tcp-only.quipu.test", after=asked, protocol="tcp"), "no TCP retry after a truncated answer"
