"""The client-facing transport (issue 17): TLS on the API listener, HTTP/2 over TLS (ALPN) and
with prior knowledge (h2c), certificate reload, and HTTP/1.1's framing faults — through the real
binary, with the official SDKs over https, `httpx2` over HTTP/2 and raw frames, and every
request billed exactly as over plain HTTP/1.1."""

from __future__ import annotations

import dataclasses
import http.client
import json
import re
import signal
import socket
import sqlite3
import ssl
import threading
import time
import warnings

import anthropic
import httpx2
import openai
import pytest

from harness import ADMIN_TOKEN, Gateway, Sim, http_json, wait_until
from tls_support import (
    CANCEL,
    H2Frames,
    TestCA,
    TlsGateway,
    billing_problems,
    client_hello,
    https_json,
    peer_serial,
    picos,
    read_until_closed,
    sim_records,
    sse_data,
    tls11_client_hello,
    wait_rows,
)

TOOLS_CHAT = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
TOOLS_MESSAGES = [{"name": "get_weather", "description": "Weather for a city",
                   "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]


@pytest.fixture(scope="module")
def transport(workdir):
    """A simulator, a TLS gateway (HTTP/2 and HTTP/1.1) and a plain one (HTTP/1.1 and h2c)."""
    sim = Sim(workdir, name="sim-transport").start()
    ca = TestCA(workdir, "transport")
    leaf = ca.issue("transport-tls")
    ups = {s: [sim.api_base] for s in ("colibri", "aguila", "apu")}
    tls = TlsGateway(workdir, ups, ca, leaf, name="quipu-tls").start()
    plain = Gateway(workdir, ups, name="quipu-h2c").start()
    yield tls, plain, sim, ca
    for g in (tls, plain):
        code = g.stop()
        assert code == 0, f"{g.name} did not exit cleanly ({code}):\n{g.process.tail()}"
    sim.stop()


def tenant_rows(gw: Gateway, tenant: str) -> dict[str, dict]:
    con = sqlite3.connect(gw.store_url.removeprefix("sqlite://"))
    con.row_factory = sqlite3.Row
    rows = {r["entry_id"]: dict(r) for r in con.execute(
        "SELECT l.* FROM ledger l JOIN tenants t ON t.id = l.tenant_id WHERE t.name = ? AND l.kind = 'request'",
        (tenant,))}
    con.close()
    return rows


def assert_exact_bill(gw: Gateway, sim: Sim, tenant: str, since: int, ids: list[str]) -> None:
    """The tenant has exactly one ledger row per request in `ids` and no other, each equal to
    the simulator's usage × the model's prices."""
    assert all(ids) and len(set(ids)) == len(ids), ids
    recs = sim_records(sim, since, ids)
    wait_rows(gw, ids)
    gw.ledger_barrier()  # a stray row of any request so far would be stored by now
    rows = tenant_rows(gw, tenant)
    assert sorted(rows) == sorted(ids), f"{len(rows)} rows for {len(ids)} requests"
    problems = billing_problems(rows, recs, ids)
    assert not problems, "\n".join(problems[:20])


# --- 1. the official SDKs over https ---------------------------------------------------------


@pytest.mark.smoke
def test_the_sdks_over_tls(transport):
    gw, _, sim, ca = transport
    _, key = gw.new_tenant("sdk-tls")
    since = sim.stats()["seq"]
    oc = openai.OpenAI(base_url=gw.base + "/v1", api_key=key, max_retries=0,
                       http_client=openai.DefaultHttpxClient(verify=ca.context()))
    ac = anthropic.Anthropic(base_url=gw.base, api_key=key, max_retries=0,
                             http_client=httpx2.Client(verify=ca.context()))
    ids = []

    # Chat, not streamed and streamed.
    r = oc.chat.completions.with_raw_response.create(
        model="colibri", messages=[{"role": "user", "content": "Hola [[sim: reply=buenos_días_por_TLS]]"}])
    ids.append(r.headers["x-request-id"])
    c = r.parse()
    assert c.choices[0].message.content == "buenos días por TLS" and c.choices[0].finish_reason == "stop"
    assert c.usage.completion_tokens > 0
    r = oc.chat.completions.with_raw_response.create(
        model="colibri", stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "cuenta [[sim: reply=uno_dos_tres_cuatro]]"}])
    ids.append(r.headers["x-request-id"])
    chunks = list(r.parse())
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == "uno dos tres cuatro"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0

    # Messages, not streamed and streamed.
    r = ac.messages.with_raw_response.create(
        model="claude-opus-4-7", max_tokens=200,
        messages=[{"role": "user", "content": "Hola [[sim: reply=saludos_cifrados]]"}])
    ids.append(r.headers["request-id"])
    m = r.parse()
    assert m.content[0].text == "saludos cifrados" and m.stop_reason == "end_turn"
    r = ac.messages.with_raw_response.create(
        model="aguila", max_tokens=200, stream=True,
        messages=[{"role": "user", "content": "cuenta [[sim: reply=cinco_seis_siete]]"}])
    ids.append(r.headers["request-id"])
    events = list(r.parse())
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta")
    assert text == "cinco seis siete" and events[-1].type == "message_stop"

    # A tool call round trip in each format.
    messages = [{"role": "user", "content": "¿Clima en Lima? [[sim: tool=get_weather]]"}]
    r = oc.chat.completions.with_raw_response.create(model="aguila", messages=messages, tools=TOOLS_CHAT)
    ids.append(r.headers["x-request-id"])
    first = r.parse().choices[0]
    assert first.finish_reason == "tool_calls"
    call = first.message.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"] == "Lima"
    messages += [first.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "22 °C, soleado"}]
    r = oc.chat.completions.with_raw_response.create(model="aguila", messages=messages, tools=TOOLS_CHAT)
    ids.append(r.headers["x-request-id"])
    assert r.parse().choices[0].finish_reason == "stop"

    messages = [{"role": "user", "content": "¿Clima en Cusco? [[sim: tool=get_weather]]"}]
    r = ac.messages.with_raw_response.create(model="apu", max_tokens=300, tools=TOOLS_MESSAGES, messages=messages)
    ids.append(r.headers["request-id"])
    first = r.parse()
    assert first.stop_reason == "tool_use"
    use = [b for b in first.content if b.type == "tool_use"][0]
    assert use.name == "get_weather" and use.input["city"] == "Lima"
    messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "15 °C"}]}]
    r = ac.messages.with_raw_response.create(model="apu", max_tokens=300, tools=TOOLS_MESSAGES, messages=messages)
    ids.append(r.headers["request-id"])
    second = r.parse()
    assert second.stop_reason == "end_turn" and second.content[0].type == "text"
    oc.close()
    ac.close()

    assert_exact_bill(gw, sim, "sdk-tls", since, ids)


# --- 2. HTTP/2 over TLS, and h2c ----------------------------------------------------------------


def h2_exchange(client: httpx2.Client, base: str, key: str) -> tuple[list[str], dict]:
    """Chat and messages, each not streamed and streamed, over `client`; every response must
    be HTTP/2. Returns the request ids and the answers' texts."""
    ids, answers = [], {}
    auth = {"Authorization": f"Bearer {key}"}
    r = client.post(base + "/v1/chat/completions", headers=auth, json={
        "model": "colibri", "messages": [{"role": "user", "content": "hola [[sim: reply=respuesta_en_h2]]"}]})
    assert r.status_code == 200 and r.http_version == "HTTP/2", (r.status_code, r.http_version, r.text[:200])
    ids.append(r.headers["x-request-id"])
    answers["chat"] = r.json()["choices"][0]["message"]["content"]
    with client.stream("POST", base + "/v1/chat/completions", headers=auth, json={
            "model": "colibri", "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "hola [[sim: reply=flujo_en_h2_completo]]"}]}) as r:
        assert r.status_code == 200 and r.http_version == "HTTP/2"
        ids.append(r.headers["x-request-id"])
        data = sse_data(r.read())
    assert data[-1] == "[DONE]", data[-3:]
    chunks = [json.loads(d) for d in data[:-1]]
    answers["chat_stream"] = "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks if ch["choices"])
    assert chunks[-1]["usage"]["completion_tokens"] > 0
    mh = {"x-api-key": key, "anthropic-version": "2023-06-01"}
    r = client.post(base + "/v1/messages", headers=mh, json={
        "model": "aguila", "max_tokens": 100, "messages": [{"role": "user", "content": "hola [[sim: reply=mensaje_h2]]"}]})
    assert r.status_code == 200 and r.http_version == "HTTP/2", (r.status_code, r.text[:200])
    ids.append(r.headers["request-id"])
    answers["messages"] = r.json()["content"][0]["text"]
    with client.stream("POST", base + "/v1/messages", headers=mh, json={
            "model": "aguila", "max_tokens": 100, "stream": True,
            "messages": [{"role": "user", "content": "hola [[sim: reply=eventos_por_h2]]"}]}) as r:
        assert r.status_code == 200 and r.http_version == "HTTP/2"
        ids.append(r.headers["request-id"])
        events = [json.loads(d) for d in sse_data(r.read())]
    answers["messages_stream"] = "".join(e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta")
    assert events[-1]["type"] == "message_stop"
    return ids, answers


EXPECTED_ANSWERS = {"chat": "respuesta en h2", "chat_stream": "flujo en h2 completo",
                    "messages": "mensaje h2", "messages_stream": "eventos por h2"}


@pytest.mark.smoke
def test_http2_over_tls_and_h2c_prior_knowledge(transport):
    gw, plain, sim, ca = transport
    _, key = gw.new_tenant("h2-tls")
    since = sim.stats()["seq"]
    connects = []
    trace = lambda name, info: connects.append(name) if name == "connection.connect_tcp.started" else None  # noqa: E731
    with httpx2.Client(http2=True, verify=ca.context()) as client:
        client.event_hooks["request"] = [lambda req: req.extensions.__setitem__("trace", trace)]
        ids, answers = h2_exchange(client, gw.base, key)
        assert answers == EXPECTED_ANSWERS
        # The SDK over HTTP/2 as well, on the same connection.
        oc = openai.OpenAI(base_url=gw.base + "/v1", api_key=key, max_retries=0, http_client=client)
        r = oc.chat.completions.with_raw_response.create(
            model="apu", messages=[{"role": "user", "content": "x [[sim: reply=el_SDK_en_h2]]"}])
        assert r.http_response.http_version == "HTTP/2"
        assert r.parse().choices[0].message.content == "el SDK en h2"
        ids.append(r.headers["x-request-id"])
    assert len(connects) == 1, f"{len(connects)} connections for one HTTP/2 client"
    # The same answers over HTTP/1.1 (the reply directive fixes them; the transport must not
    # change a byte of the content).
    with httpx2.Client(verify=ca.context()) as h1:
        r = h1.post(gw.base + "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, json={
            "model": "colibri", "messages": [{"role": "user", "content": "hola [[sim: reply=respuesta_en_h2]]"}]})
        assert r.http_version == "HTTP/1.1" and r.json()["choices"][0]["message"]["content"] == answers["chat"]
        ids.append(r.headers["x-request-id"])
    assert_exact_bill(gw, sim, "h2-tls", since, ids)

    # h2c: HTTP/2 with prior knowledge on the plain listener.
    _, pkey = plain.new_tenant("h2c")
    since = sim.stats()["seq"]
    with httpx2.Client(http1=False, http2=True) as client:
        ids, answers = h2_exchange(client, plain.base, pkey)
    assert answers == EXPECTED_ANSWERS
    # HTTP/1.1 on the same listener still works (the listener tells them apart).
    status, body, hdrs = http_json("POST", plain.base + "/v1/chat/completions",
                                   {"model": "colibri", "messages": [{"role": "user", "content": "[[sim: tokens=3]]"}]},
                                   {"Authorization": f"Bearer {pkey}"})
    assert status == 200, body
    ids.append(hdrs["x-request-id"])
    assert_exact_bill(plain, sim, "h2c", since, ids)


# --- 3. 200 streams multiplexed on one connection ------------------------------------------------


def test_200_concurrent_streams_on_one_http2_connection(transport):
    """200 streamed requests sent at once on one HTTP/2 connection (one socket, frames written
    by hand: httpx's HTTP/2 client caps itself at 100 streams) all run at the same time and
    complete; each is billed exactly."""
    gw, _, sim, ca = transport
    _, key = gw.new_tenant("multiplex", top_up="5000.00")
    n = 200
    wait_until(lambda: gw.metric_value("quipu_client_connections") == 0, 10, "earlier connections to close")
    since = sim.stats()["seq"]
    h2 = H2Frames(gw.port, ca.context(alpn=["h2"]))
    sent = {}
    burst = b""
    for i in range(n):
        model = ("colibri", "aguila", "apu")[i % 3]
        content = f"flujo {i} [[sim: tokens={5 + i % 7} delay_ms=150]]"
        if i % 2 == 0:
            sid, frames = h2.post("/v1/chat/completions", {
                "model": model, "stream": True, "stream_options": {"include_usage": True},
                "messages": [{"role": "user", "content": content}]}, {"authorization": f"Bearer {key}"})
        else:
            sid, frames = h2.post("/v1/messages", {
                "model": model, "max_tokens": 100, "stream": True,
                "messages": [{"role": "user", "content": content}]},
                {"x-api-key": key, "anthropic-version": "2023-06-01"})
        sent[sid] = i
        burst += frames
    try:
        assert h2.sendall(burst)
        streams = h2.streams
        h2.run_until(lambda: sum(1 for s in streams.values() if s["data"] or s["reset"] is not None) == n, 30)
        refused = [(sid, s["resets"]) for sid, s in streams.items() if s["reset"] is not None]
        assert not refused, f"{len(refused)} of {n} streams were reset: {refused[:5]}"
        assert sum(1 for s in streams.values() if s["data"]) == n, \
            f"{sum(1 for s in streams.values() if s['data'])} of {n} streams started"
        # With every stream answering, the gateway sees one client connection.
        open_connections = gw.metric_value("quipu_client_connections")
        assert h2.run_until(lambda: all(s["ended"] or s["reset"] is not None for s in streams.values()), 60)
        assert not h2.closed and h2.goaway is None
    finally:
        h2.close()
    assert open_connections == 1, f"the gateway counted {open_connections} connections"
    results = {}
    for sid, i in sent.items():
        st = streams[sid]
        assert st["status"] == 200 and st["reset"] is None, (i, st["status"], st["reset"], bytes(st["data"])[:200])
        hdrs = dict(st["headers"])
        rid = (hdrs.get(b"x-request-id") or hdrs.get(b"request-id")).decode()
        data = sse_data(bytes(st["data"]))
        if i % 2 == 0:
            assert data[-1] == "[DONE]", (i, data[-2:])
            completion = json.loads(data[-2])["usage"]["completion_tokens"]
        else:
            events = [json.loads(d) for d in data]
            assert events[-1]["type"] == "message_stop", (i, events[-2:])
            completion = next(e for e in events if e["type"] == "message_delta")["usage"]["output_tokens"]
        results[rid] = (i, completion)
    assert len(results) == n
    recs = sim_records(sim, since, results)
    # Each stream got all its tokens, and its usage says so.
    for rid, (i, completion) in results.items():
        assert recs[rid]["completion_tokens"] == completion == 5 + i % 7, (i, recs[rid], completion)
    # The 200 ran at the same time upstream: every one started before the first one ended.
    starts = sorted(recs[rid]["at_ms"] for rid in results)
    ends = sorted(recs[rid]["ended_ms"] for rid in results)
    assert starts[-1] < ends[0], ("not all streams ran at once", starts[-1] - starts[0], ends[0] - starts[0])
    assert_exact_bill(gw, sim, "multiplex", since, list(results))


# --- 4. a stream reset mid-answer --------------------------------------------------------------


def test_an_http2_stream_reset_mid_answer_is_billed_and_cancelled(transport):
    gw, _, sim, ca = transport
    tenant, key = "resetter", gw.new_tenant("resetter")[1]
    since = sim.stats()["seq"]
    disconnects = gw.metric_value("quipu_client_disconnects_total")
    auth = {"authorization": f"Bearer {key}"}
    h2 = H2Frames(gw.port, ca.context(alpn=["h2"]))
    try:
        a, fa = h2.post("/v1/chat/completions", {"model": "aguila", "stream": True, "messages": [
            {"role": "user", "content": "largo [[sim: tokens=200 delay_ms=30]]"}]}, auth)
        b, fb = h2.post("/v1/chat/completions", {"model": "colibri", "stream": True, "messages": [
            {"role": "user", "content": "vecino [[sim: tokens=20 delay_ms=40]]"}]}, auth)
        c, fc = h2.post("/v1/messages", {"model": "apu", "max_tokens": 100, "stream": True, "messages": [
            {"role": "user", "content": "otro vecino [[sim: tokens=20 delay_ms=40]]"}]},
            {"x-api-key": key, "anthropic-version": "2023-06-01"})
        assert h2.sendall(fa + fb + fc)
        content_chunks = lambda sid: sum(  # noqa: E731
            1 for d in sse_data(bytes(h2.streams[sid]["data"])) if d != "[DONE]" and json.loads(d)["choices"]
            and json.loads(d)["choices"][0]["delta"].get("content"))
        assert h2.run_until(lambda: content_chunks(a) >= 3, 10), "the long stream's first tokens"
        assert h2.sendall(h2.rst(a, CANCEL))
        received = content_chunks(a)
        reset_at = time.time()
        assert h2.run_until(lambda: h2.streams[b]["ended"] and h2.streams[c]["ended"], 15), \
            "the other streams on the connection finish"
        # Its neighbours are whole.
        bd = sse_data(bytes(h2.streams[b]["data"]))
        assert h2.streams[b]["status"] == 200 and bd[-1] == "[DONE]"
        assert sum(1 for d in bd[:-1] if json.loads(d)["choices"] and json.loads(d)["choices"][0]["delta"].get("content")) == 20
        cd = [json.loads(d) for d in sse_data(bytes(h2.streams[c]["data"]))]
        assert h2.streams[c]["status"] == 200 and cd[-1]["type"] == "message_stop"
        assert h2.streams[b]["reset"] is None and h2.streams[c]["reset"] is None
        # The connection carries on: a new request on it is served.
        d, fd = h2.post("/v1/chat/completions", {"model": "colibri", "messages": [
            {"role": "user", "content": "¿sigues? [[sim: reply=sí]]"}]}, auth)
        assert h2.sendall(fd)
        assert h2.run_until(lambda: h2.streams[d]["ended"], 10)
        assert h2.streams[d]["status"] == 200 and json.loads(h2.streams[d]["data"])["choices"][0]["message"]["content"] == "sí"
        assert not h2.closed and h2.goaway is None
    finally:
        h2.close()

    ids = {sid: dict(h2.streams[sid]["headers"])[b"x-request-id"].decode() for sid in (a, b, d)}
    ids[c] = dict(h2.streams[c]["headers"])[b"request-id"].decode()
    recs = sim_records(sim, since, ids.values())
    rec = recs[ids[a]]
    # The upstream request was cancelled soon after the reset, long before its 6 s.
    assert rec["cancelled"] and rec["completion_tokens"] < 200, rec
    assert rec["ended_ms"] - rec["at_ms"] < 4000, rec
    rows = wait_rows(gw, ids.values())
    row = rows[ids[a]]
    assert row["status"] == "client_disconnected", row
    # Billed what was generated before the reset: at least what the client received, at most
    # what the simulator generated; the input as the upstream reported it.
    assert received <= row["output_tokens"] <= rec["completion_tokens"], (received, row, rec)
    assert (row["input_tokens"], row["cached_tokens"], row["input_estimated"]) == (rec["prompt_tokens"], rec["cached_tokens"], 0)
    assert -row["delta"] == picos("aguila", row["input_tokens"], row["cached_tokens"], row["output_tokens"]) > 0
    assert not billing_problems(rows, recs, [ids[b], ids[c], ids[d]]), billing_problems(rows, recs, [ids[b], ids[c], ids[d]])
    assert sorted(tenant_rows(gw, tenant)) == sorted(ids.values())
    wait_until(lambda: gw.metric_value("quipu_reservations_open") == 0, 5, "the reservation to be released")
    assert gw.metric_value("quipu_client_disconnects_total") - disconnects == 1
    assert time.time() - reset_at < 10


# --- 5. certificate reload under traffic ----------------------------------------------------


def test_certificate_reload_under_traffic(workdir, transport):
    _, _, sim, _ = transport
    ca = TestCA(workdir, "reload")
    first = ca.issue("reload-live", common_name="quipu-first")
    second = ca.issue("reload-second", common_name="quipu-second")
    third = ca.issue("reload-third", common_name="quipu-third")
    assert len({first.serial, second.serial, third.serial}) == 3
    gw = TlsGateway(workdir, {"colibri": [sim.api_base]}, ca, first, name="quipu-reload").start()
    try:
        _, key = gw.new_tenant("reload")
        ctx = ca.context()
        assert peer_serial(gw.port, ctx) == first.serial
        since = sim.stats()["seq"]
        # A long stream over TLS (HTTP/1.1), and an HTTP/2 connection, both opened before.
        s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", gw.port), timeout=30), server_hostname="localhost")
        body = json.dumps({"model": "colibri", "stream": True,
                           "messages": [{"role": "user", "content": "[[sim: tokens=40 delay_ms=100]]"}]}).encode()
        s.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {key}\r\n"
                  f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        stream_raw = [b""]

        def read_stream():
            while b"\r\n0\r\n\r\n" not in stream_raw[0]:
                chunk = s.recv(65536)
                if not chunk:
                    break
                stream_raw[0] += chunk

        reader = threading.Thread(target=read_stream)
        reader.start()
        h2client = httpx2.Client(http2=True, verify=ca.context())
        connects = []
        trace = {"trace": lambda name, info: connects.append(name) if name.endswith("connect_tcp.started") else None}
        assert h2client.get(gw.base + "/v1/models", extensions=trace).http_version == "HTTP/2"
        wait_until(lambda: b"\r\n\r\n" in stream_raw[0], 5, "the long stream under way")
        # Replace the files and signal: new handshakes get the second certificate.
        second.install(gw.cert_path, gw.key_path)
        gw.process.send_signal(signal.SIGHUP)
        wait_until(lambda: peer_serial(gw.port, ctx) == second.serial, 3, "the second certificate to be served")
        wait_until(lambda: "TLS certificate reloaded" in gw.process.tail(200), 3, "the reload in the log")
        # The HTTP/2 connection opened before is still in use (no new handshake).
        r = h2client.post(gw.base + "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                          json={"model": "colibri", "messages": [{"role": "user", "content": "[[sim: reply=sigo_aquí]]"}]},
                          extensions=trace)
        assert r.http_version == "HTTP/2" and r.json()["choices"][0]["message"]["content"] == "sigo aquí"
        # A pair that does not belong together is refused; the second certificate stays.
        dataclasses.replace(third, key_pem=second.key_pem).install(gw.cert_path, gw.key_path)
        gw.process.send_signal(signal.SIGHUP)
        wait_until(lambda: "TLS certificate not reloaded" in gw.process.tail(200), 3, "the refusal in the log")
        assert peer_serial(gw.port, ctx) == second.serial
        assert gw.request("GET", "/health")[0] == 200
        # Without a signal: a certificate manager replacing the files is noticed by polling.
        third.install(gw.cert_path, gw.key_path)
        wait_until(lambda: peer_serial(gw.port, ctx) == third.serial, 12, "the third certificate (polled)")
        # The stream opened under the first certificate ran to its end, intact.
        reader.join(15)
        s.close()
        head, _, rest = stream_raw[0].partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        rid = re.search(rb"(?im)^x-request-id:\s*(\S+)", head).group(1).decode()
        data, tail = b"", rest
        while tail:
            size_line, _, tail = tail.partition(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            if size == 0:
                break
            data, tail = data + tail[:size], tail[size + 2:]
        events = sse_data(data)
        assert events[-1] == "[DONE]"
        tokens = sum(1 for e in events[:-1] if json.loads(e)["choices"] and json.loads(e)["choices"][0]["delta"].get("content"))
        assert tokens == 40
        assert h2client.get(gw.base + "/v1/models", extensions=trace).status_code == 200
        h2client.close()
        assert len(connects) == 1, f"the HTTP/2 client connected {len(connects)} times: its connection was cut"
        recs = sim_records(sim, since, [rid, r.headers["x-request-id"]])
        rows = wait_rows(gw, [rid, r.headers["x-request-id"]])
        assert not billing_problems(rows, recs, [rid, r.headers["x-request-id"]])
    finally:
        gw.stop()


# --- 6. protocol versions and ALPN ------------------------------------------------------------


def test_the_admin_listener_over_tls_with_the_apis_certificate(workdir, transport):
    """`admin_tls = true`: the admin API answers over TLS (and not in plain HTTP), with the API
    listener's certificate, and a reload replaces it on both listeners."""
    _, _, sim, _ = transport
    ca = TestCA(workdir, "admin")
    first, second = ca.issue("admin-first"), ca.issue("admin-second")
    gw = TlsGateway(workdir, {"colibri": [sim.api_base]}, ca, first, name="quipu-admin-tls",
                    server_extra="admin_tls = true").start()
    try:
        admin = f"https://localhost:{gw.admin_port}"
        auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        status, body, _ = https_json("GET", admin + "/admin/tenants", ca.context(), headers=auth)
        assert status == 200, body
        assert https_json("GET", admin + "/admin/tenants", ca.context())[0] == 401
        with pytest.raises((OSError, http.client.HTTPException)):
            conn = http.client.HTTPConnection("127.0.0.1", gw.admin_port, timeout=5)
            conn.request("GET", "/admin/tenants", headers=auth)
            conn.getresponse().read()
        assert peer_serial(gw.admin_port, ca.context()) == first.serial
        second.install(gw.cert_path, gw.key_path)
        gw.process.send_signal(signal.SIGHUP)
        wait_until(lambda: peer_serial(gw.port, ca.context()) == second.serial, 3, "the API's new certificate")
        assert peer_serial(gw.admin_port, ca.context()) == second.serial
    finally:
        assert gw.stop() == 0, gw.process.tail()


def handshake(port: int, ctx: ssl.SSLContext) -> ssl.SSLSocket:
    return ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10), server_hostname="localhost")


def test_tls_versions_and_alpn(workdir, transport):
    gw, _, sim, ca = transport
    for version, name in ((ssl.TLSVersion.TLSv1_2, "TLSv1.2"), (ssl.TLSVersion.TLSv1_3, "TLSv1.3")):
        ctx = ca.context(alpn=["http/1.1"])
        ctx.minimum_version = ctx.maximum_version = version
        with handshake(gw.port, ctx) as s:
            assert s.version() == name
            s.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            got, _ = read_until_closed(s, 5)
            assert got.startswith(b"HTTP/1.1 200"), got[:100]

    # TLS 1.1 is refused: the server answers a TLS 1.1 ClientHello with an alert (or closes),
    # never a ServerHello, and counts a failed handshake.
    errors = gw.metric_value("quipu_tls_handshake_failures_total", reason="error")
    with socket.create_connection(("127.0.0.1", gw.port), timeout=5) as s:
        s.sendall(tls11_client_hello())
        got, closed = read_until_closed(s, 5)
    assert closed is not None, "the connection stayed open after a TLS 1.1 ClientHello"
    assert not got or got[0] == 21, f"not an alert: {got[:20]!r}"  # 21: alert; 22 would be a ServerHello
    wait_until(lambda: gw.metric_value("quipu_tls_handshake_failures_total", reason="error") == errors + 1, 3,
               "the refused handshake to be counted")
    # The same from Python's own TLS stack, where it still offers TLS 1.1.
    try:
        hello = client_hello(ssl.TLSVersion.TLSv1_1, ssl.TLSVersion.TLSv1_1, ciphers="DEFAULT:@SECLEVEL=0")
    except ssl.SSLError:
        hello = b""
    if hello:
        ctx = ca.context()
        ctx.set_ciphers("DEFAULT:@SECLEVEL=0")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            ctx.minimum_version = ctx.maximum_version = ssl.TLSVersion.TLSv1_1
        with pytest.raises(ssl.SSLError):
            handshake(gw.port, ctx).close()
        wait_until(lambda: gw.metric_value("quipu_tls_handshake_failures_total", reason="error") == errors + 2, 3,
                   "the second refused handshake to be counted")

    # ALPN: h2 when offered, http/1.1 when only it is offered, and no ALPN at all is HTTP/1.1.
    for offered, picked in ((["h2", "http/1.1"], "h2"), (["http/1.1", "h2"], "h2"), (["http/1.1"], "http/1.1"),
                            (["h2"], "h2"), (None, None)):
        with handshake(gw.port, ca.context(alpn=offered)) as s:
            assert s.selected_alpn_protocol() == picked, (offered, s.selected_alpn_protocol())
            if picked != "h2":
                s.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                got, _ = read_until_closed(s, 5)
                assert got.startswith(b"HTTP/1.1 200"), got[:100]

    # With `http2 = false` only http/1.1 is offered: an HTTP/2 client gets HTTP/1.1.
    leaf = ca.issue("h1-only")
    h1 = TlsGateway(workdir, {"colibri": [sim.api_base]}, ca, leaf, name="quipu-h1-only",
                    server_extra="http2 = false").start()
    try:
        with handshake(h1.port, ca.context(alpn=["h2", "http/1.1"])) as s:
            assert s.selected_alpn_protocol() == "http/1.1"
        with httpx2.Client(http2=True, verify=ca.context()) as client:
            r = client.get(h1.base + "/v1/models")
            assert r.status_code == 200 and r.http_version == "HTTP/1.1"
    finally:
        h1.stop()


# --- 7. HTTP/1.1 framing faults ----------------------------------------------------------------


def connect(gw: Gateway, ca: TestCA, tls: bool) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", gw.port), timeout=10)
    return ca.context(alpn=["http/1.1"]).wrap_socket(s, server_hostname="localhost") if tls else s


def read_responses(s: socket.socket, count: int, timeout: float = 10) -> list[tuple[int, dict, bytes]]:
    """Reads `count` HTTP/1.1 responses (Content-Length or chunked) from one connection."""
    buf, out = b"", []
    s.settimeout(timeout)

    def more():
        nonlocal buf
        try:
            chunk = s.recv(65536)
        except ssl.SSLEOFError:
            chunk = b""
        if not chunk:
            raise EOFError(f"closed after {len(out)} responses: {buf[:200]!r}")
        buf += chunk

    while len(out) < count:
        while b"\r\n\r\n" not in buf:
            more()
        head, _, buf = buf.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        if "content-length" in headers:
            n = int(headers["content-length"])
            while len(buf) < n:
                more()
            body, buf = buf[:n], buf[n:]
        elif headers.get("transfer-encoding") == "chunked":
            body = b""
            while True:
                while b"\r\n" not in buf:
                    more()
                size_line, _, rest = buf.partition(b"\r\n")
                size = int(size_line.split(b";")[0], 16)
                while len(rest) < size + 2:
                    more()
                    size_line, _, rest = buf.partition(b"\r\n")
                body += rest[:size]
                buf = rest[size + 2:]
                if size == 0:
                    break
        else:
            body = b""
        out.append((status, headers, body))
    return out


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_http1_pipelining_long_request_lines_and_bare_lf(transport, tls):
    tls_gw, plain, sim, ca = transport
    gw = tls_gw if tls else plain
    tenant = f"h1-faults-{'tls' if tls else 'plain'}"
    _, key = gw.new_tenant(tenant)
    since = sim.stats()["seq"]

    def post(content: str, extra: bytes = b"", sep: bytes = b"\r\n") -> bytes:
        body = json.dumps({"model": "colibri", "messages": [{"role": "user", "content": content}]}).encode()
        return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n" + extra
                + b"X-Note: a" + sep + f"Authorization: Bearer {key}\r\n".encode()
                + b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode()
                + b"\r\n\r\n" + body)

    # Two pipelined requests in one write: two answers, in order, on the one connection.
    s = connect(gw, ca, tls)
    s.sendall(post("uno [[sim: reply=primero ttfb_ms=300]]") + post("dos [[sim: reply=segundo]]"))
    answers = read_responses(s, 2)
    assert [a[0] for a in answers] == [200, 200], answers
    assert [json.loads(a[2])["choices"][0]["message"]["content"] for a in answers] == ["primero", "segundo"]
    ids = [a[1]["x-request-id"] for a in answers]
    # …and the connection carries a third.
    s.sendall(post("tres [[sim: reply=tercero]]"))
    ((status, headers, body),) = read_responses(s, 1)
    assert status == 200 and json.loads(body)["choices"][0]["message"]["content"] == "tercero"
    ids.append(headers["x-request-id"])
    s.close()

    # A request line longer than the head limit: 431 with the chat error shape.
    s = connect(gw, ca, tls)
    s.sendall(b"GET /v1/models?pad=" + b"a" * 70_000 + b" HTTP/1.1\r\nHost: localhost\r\n\r\n")
    ((status, headers, body),) = read_responses(s, 1)
    s.close()
    assert status == 431, (status, body[:200])
    err = json.loads(body)
    assert set(err) == {"error"} and err["error"]["type"] == "invalid_request_error", err
    assert err["error"]["code"] == "request_header_fields_too_large" and err["error"]["message"], err

    # A head line ending in a bare LF: 400, the connection closed, and not authenticated.
    before = len(wait_rows(gw, ids))
    sim_seq = sim.stats()["seq"]
    s = connect(gw, ca, tls)
    s.sendall(post("nunca [[sim: reply=no_debería]]", sep=b"\n"))
    ((status, headers, body),) = read_responses(s, 1)
    assert status == 400, (status, body[:300])
    err = json.loads(body)
    assert err["error"]["type"] == "invalid_request_error" and err["error"]["message"], err
    rest, closed = read_until_closed(s, 5)
    s.close()
    assert closed is not None and rest == b"", f"the connection stayed open after the bare LF: {rest[:100]!r}"
    # The same request with CRLF everywhere authenticates and is served.
    s = connect(gw, ca, tls)
    s.sendall(post("con CRLF [[sim: reply=sí_servido]]"))
    ((status, headers, body),) = read_responses(s, 1)
    s.close()
    assert status == 200 and json.loads(body)["choices"][0]["message"]["content"] == "sí servido"
    ids.append(headers["x-request-id"])
    assert len(wait_rows(gw, ids)) == before + 1
    # Nothing of the bare-LF request reached the upstream: only the CRLF one did.
    assert list(sim_records(sim, sim_seq, ids[-1:])) == ids[-1:]
    assert_exact_bill(gw, sim, tenant, since, ids)


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_http10_closes_unless_it_asks_to_keep_alive(transport, tls):
    """HTTP/1.0's default is one request per connection: the answer says `Connection: close` and
    the connection ends; with `Connection: keep-alive` it stays open for the next request."""
    tls_gw, plain, _sim, ca = transport
    gw = tls_gw if tls else plain
    s = connect(gw, ca, tls)
    s.sendall(b"GET /health HTTP/1.0\r\nHost: localhost\r\n\r\n")
    [(status, headers, body)] = read_responses(s, 1)
    assert (status, headers.get("connection"), json.loads(body)) == (200, "close", {"status": "ok"})
    s.settimeout(5)
    try:
        rest = s.recv(1)
    except (ssl.SSLEOFError, ConnectionResetError):
        rest = b""
    assert rest == b"", "the connection is closed after an HTTP/1.0 answer"
    s.close()
    s = connect(gw, ca, tls)
    s.sendall(b"GET /health HTTP/1.0\r\nHost: localhost\r\nConnection: keep-alive\r\n\r\n"
              b"GET /v1/plans HTTP/1.0\r\nHost: localhost\r\nConnection: keep-alive\r\n\r\n")
    answers = read_responses(s, 2)
    assert [a[0] for a in answers] == [200, 200]
    assert all(a[1].get("connection") == "keep-alive" for a in answers)
    s.close()
