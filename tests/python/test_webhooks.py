"""Alerts as webhooks, delivered to a real HTTP receiver started by the test, which checks every
delivery's signature (`Quipu-Signature: t=…,v1=HMAC-SHA256(secret, "t.body")`) and its event id
(header and body):

- a top-up's `topup.received` arrives once per top-up;
- `balance.low` once when a charge takes the balance below the tenant's threshold, not again
  while it stays below;
- `key.expiring_7d` / `key.expiring_1d` for keys that expire within 7 days / a day;
- `cap.reached_80` and `cap.reached_100` once each for a key's daily cap;
- a delivery the receiver answered 500 twice is delivered on the third attempt, same event id;
- an event whose receiver failed while Quipu stopped is delivered after Quipu starts again;
- a tenant's own endpoint (registered with a manage key) gets its tenant's events, signed with
  the secret it was given, and nothing of other tenants; other keys get 403;
- with 3 replicas on one PostgreSQL, each event is delivered once, by one of them; when that
  one is killed, another takes over.

Every "not delivered" check waits first for a later event to be delivered: deliveries go out in
the outbox's order, so by then the one that must not exist would have arrived.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import http.server
import json
import os
import signal
import threading
import time
from decimal import Decimal

import pytest

from cluster import fresh_database
from harness import Gateway, Sim, http_json, wait_until

OP_SECRET = "whsec_operator_test"
TOLERANCE_S = 300


class Receiver:
    """An HTTP server in a thread: records every delivery, checks its signature, and answers
    what `answer(event)` says (200 by default)."""

    def __init__(self, secret: str):
        self.secret = secret
        self.lock = threading.Lock()
        self.deliveries: list[dict] = []
        self.bad: list[str] = []
        self.answer = lambda event: 200
        self.server: http.server.ThreadingHTTPServer | None = None
        self.port = 0
        self.start()

    def start(self, port: int = 0) -> None:
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                problem = receiver.check(self.headers, body)
                event = json.loads(body) if not problem else {}
                status = receiver.answer(event) if not problem else 400
                with receiver.lock:
                    if problem:
                        receiver.bad.append(problem)
                    receiver.deliveries.append({"event": event, "status": status,
                                                "header_id": self.headers.get("quipu-event-id")})
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self.server:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks"

    def check(self, headers, body: bytes) -> str | None:
        sig = headers.get("quipu-signature", "")
        parts = dict(p.split("=", 1) for p in sig.split(",") if "=" in p)
        try:
            t = int(parts["t"])
        except (KeyError, ValueError):
            return f"no timestamp in {sig!r}"
        if abs(time.time() - t) > TOLERANCE_S:
            return f"timestamp {t} outside the tolerance"
        want = hmac.new(self.secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(want, parts.get("v1", "")):
            return "signature mismatch"
        if json.loads(body).get("id") != headers.get("quipu-event-id"):
            return "the body's id is not the header's"
        return None

    def accepted(self, tenant: str | None = None, kind: str | None = None) -> list[dict]:
        """Events answered 2xx, in arrival order."""
        with self.lock:
            return [d["event"] for d in self.deliveries
                    if d["status"] < 300 and d["event"]
                    and (tenant is None or d["event"]["tenant"] == tenant)
                    and (kind is None or d["event"]["type"] == kind)]

    def attempts(self, event_id: str) -> list[int]:
        with self.lock:
            return [d["status"] for d in self.deliveries if d["event"].get("id") == event_id]

    def wait_for(self, tenant: str, kind: str, n: int = 1, timeout: float = 20.0) -> list[dict]:
        wait_until(lambda: len(self.accepted(tenant, kind)) >= n, timeout,
                   what=f"{n} {kind} of {tenant} at the receiver")
        return self.accepted(tenant, kind)


def hooks_config(receiver: Receiver, private_ok: bool = True) -> str:
    # The receivers listen on 127.0.0.1: tenants' endpoints there need the operator's consent.
    return f"""
[[webhooks]]
url = "{receiver.url}"
secret = "{OP_SECRET}"

[webhook_delivery]
timeout_ms = 2000
first_retry_ms = 300
max_retry_delay_s = 1
max_attempts = 8
poll_ms = 100
key_scan_s = 1
{"tenant_private_urls = true" if private_ok else ""}
"""


@pytest.fixture(scope="module")
def receiver():
    r = Receiver(OP_SECRET)
    yield r
    r.stop()
    assert not r.bad, f"deliveries with a bad signature or id: {r.bad}"


@pytest.fixture(scope="module")
def hooked(workdir, sim, receiver):
    g = Gateway(workdir, {"colibri": [sim.api_base]}, extra=hooks_config(receiver), name="quipu-hooks")
    g.start()
    yield g
    code = g.stop()
    assert code == 0, f"quipu did not exit cleanly ({code}):\n{g.process.tail()}"


_n = iter(range(1, 10_000))


def fresh(g: Gateway, **key_args) -> tuple[str, str]:
    name = f"wh{next(_n)}"
    _, secret = g.new_tenant(name, top_up="10.00", **key_args)
    return name, secret


def chat(g: Gateway, secret: str) -> None:
    status, body, _ = g.request(
        "POST", "/v1/chat/completions",
        {"model": "colibri", "max_tokens": 5, "messages": [{"role": "user", "content": "hi [[sim: tokens=3]]"}]},
        {"Authorization": f"Bearer {secret}"})
    assert status == 200, body


def barrier(g: Gateway, receiver: Receiver) -> None:
    """Returns once every event caused so far has been delivered or tried: a top-up of a tenant
    of its own, caused last, has arrived."""
    name = f"barrier{next(_n)}"
    g.cli("tenant", "create", name)
    g.cli("topup", "--tenant", name, "--amount", "10.00")
    receiver.wait_for(name, "topup.received")


def test_a_top_up_is_announced_once_signed_with_its_id(hooked, receiver):
    name, _ = fresh(hooked)
    hooked.cli("topup", "--tenant", name, "--amount", "25.00")
    events = receiver.wait_for(name, "topup.received", 2)
    assert [e["data"]["amount"] for e in events] == ["10.00", "25.00"]
    assert events[1]["data"]["balance"] == "35.00"
    assert all(e["id"].startswith("evt_") for e in events)
    barrier(hooked, receiver)
    # Once per cause: each top-up's event arrived once, with a distinct id.
    events = receiver.accepted(name, "topup.received")
    assert len(events) == 2 and events[0]["id"] != events[1]["id"]
    assert receiver.bad == []


def test_balance_low_fires_once_when_crossing(hooked, receiver):
    name, secret = fresh(hooked)
    hooked.cli("tenant", "update", name, "--low-balance", "10.00")
    chat(hooked, secret)  # 10.00 → a little less: crosses
    (low,) = receiver.wait_for(name, "balance.low")
    assert low["data"]["threshold"] == "10.00"
    assert Decimal("9.99") < Decimal(low["data"]["balance"]) < Decimal("10.00")
    chat(hooked, secret)  # still below: no second alert
    hooked.ledger_barrier()
    barrier(hooked, receiver)
    assert len(receiver.accepted(name, "balance.low")) == 1


def test_keys_about_to_expire_are_announced(hooked, receiver):
    name, _ = fresh(hooked)
    now = datetime.datetime.now(datetime.timezone.utc)
    soon = (now + datetime.timedelta(days=3)).strftime("%Y-%m-%dT%H:%M:%SZ")
    sooner = (now + datetime.timedelta(hours=12)).strftime("%Y-%m-%dT%H:%M:%SZ")
    week = hooked.cli("key", "create", "--tenant", name, "--expires", soon)
    day = hooked.cli("key", "create", "--tenant", name, "--expires", sooner)
    (e7,) = receiver.wait_for(name, "key.expiring_7d")
    (e1,) = receiver.wait_for(name, "key.expiring_1d")
    assert e7["data"]["key_id"] == week["key_id"]
    assert e1["data"]["key_id"] == day["key_id"]
    # Later scans find the same keys again and add nothing: once a key created after these
    # notices has had its own, a scan has run since.
    later = (now + datetime.timedelta(days=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    third = hooked.cli("key", "create", "--tenant", name, "--expires", later)
    wait_until(lambda: any(e["data"]["key_id"] == third["key_id"]
                           for e in receiver.accepted(name, "key.expiring_7d")), 20,
               what="the third key's notice")
    assert sorted(e["data"]["key_id"] for e in receiver.accepted(name, "key.expiring_7d")) == \
        sorted([week["key_id"], third["key_id"]])
    assert len(receiver.accepted(name, "key.expiring_1d")) == 1


def test_a_cap_alerts_at_80_and_100_percent_once_per_period(workdir, sim, receiver):
    """A key's daily cap of S/ 0.01 spent by requests of S/ 0.0012 (input free, 12 output
    tokens at S/ 100 per million): the charge that takes it to 80 % fires `cap.reached_80`;
    spending stops at 96 % (the next request's worst case does not fit), so `cap.reached_100`
    comes from the first refusal; more refusals add nothing."""
    g = Gateway(workdir, {"apu": [sim.api_base]}, extra=hooks_config(receiver), name="quipu-hooks-caps")
    default = 'prices = { input = "3.00", cached = "0.75", output = "12.00" }'
    assert default in g.config_text
    g.config_text = g.config_text.replace(default, 'prices = { input = "0.00", cached = "0.00", output = "100.00" }')
    g.config_path.write_text(g.config_text)
    g.start()
    try:
        name = f"capped{next(_n)}"
        key, secret = g.new_tenant(name, top_up="10.00", budget="0.01", **{"budget-period": "day"})

        def one() -> int:
            return g.request(
                "POST", "/v1/chat/completions",
                {"model": "apu", "max_tokens": 12, "messages": [{"role": "user", "content": "[[sim: tokens=100000]]"}]},
                {"Authorization": f"Bearer {secret}"})[0]

        statuses = [one() for _ in range(10)]
        assert statuses == [200] * 8 + [429, 429], statuses
        (e80,) = receiver.wait_for(name, "cap.reached_80")
        (e100,) = receiver.wait_for(name, "cap.reached_100")
        assert e80["data"]["owner"] == "key" and e80["data"]["key_id"] == key["key_id"], e80
        assert e80["data"]["cap"] == "0.01" and Decimal(e80["data"]["spent"]) >= Decimal("0.008"), e80
        assert e100["data"]["period_key"].startswith("day:"), e100
        assert one() == 429
        g.ledger_barrier()
        barrier(g, receiver)
        assert len(receiver.accepted(name, "cap.reached_80")) == 1
        assert len(receiver.accepted(name, "cap.reached_100")) == 1
    finally:
        g.stop()


def test_a_delivery_answered_500_twice_is_retried_with_the_same_id(hooked, receiver):
    name = f"flaky{next(_n)}"
    seen: dict[str, int] = {}

    def answer(event):
        if event.get("tenant") != name:
            return 200
        seen[event["id"]] = seen.get(event["id"], 0) + 1
        return 500 if seen[event["id"]] <= 2 else 200

    receiver.answer = answer
    try:
        failed = hooked.metric_value("quipu_webhook_deliveries_total", outcome="failed")
        hooked.cli("tenant", "create", name)
        hooked.cli("topup", "--tenant", name, "--amount", "10.00")
        (event,) = receiver.wait_for(name, "topup.received")
        assert receiver.attempts(event["id"]) == [500, 500, 200]
        assert hooked.metric_value("quipu_webhook_deliveries_total", outcome="failed") >= failed + 2
    finally:
        receiver.answer = lambda event: 200


def test_a_tenant_registers_its_own_endpoint_with_a_manage_key(hooked, receiver):
    name, plain = fresh(hooked)
    key = hooked.cli("key", "create", "--tenant", name, "--manage")
    manage = {"Authorization": f"Bearer {key['secret']}"}
    hooked.wait_key(key["secret"])
    own = Receiver("")
    try:
        status, body, _ = hooked.request("POST", "/v1/webhooks", {"url": own.url},
                                         {"Authorization": f"Bearer {plain}"})
        assert status == 403 and body["error"]["type"] == "permission_error", body
        assert body["error"]["code"] == "insufficient_permissions", body
        status, body, _ = hooked.request("POST", "/v1/webhooks", {"url": "ftp://x/"}, manage)
        assert status == 400 and body["error"]["param"] == "url", body
        status, body, _ = hooked.request("POST", "/v1/webhooks",
                                         {"url": own.url, "events": ["topup.received"]}, manage)
        assert status == 200, body
        assert body["secret"].startswith("whsec_") and body["events"] == ["topup.received"]
        own.secret = body["secret"]
        endpoint = body["id"]
        status, listing, _ = hooked.request("GET", "/v1/webhooks", headers=manage)
        assert [e["id"] for e in listing["data"]] == [endpoint]
        assert "secret" not in listing["data"][0], "the secret is shown once"

        other, _ = fresh(hooked)
        hooked.cli("topup", "--tenant", name, "--amount", "11.00")
        (mine,) = own.wait_for(name, "topup.received")
        assert mine["data"]["amount"] == "11.00"
        receiver.wait_for(other, "topup.received")
        barrier(hooked, receiver)
        # Its tenant's events only, each signed with its own secret (checked on arrival).
        assert {e["tenant"] for e in own.accepted()} == {name}
        assert own.bad == []

        status, body, _ = hooked.request("DELETE", f"/v1/webhooks/{endpoint}", headers=manage)
        assert status == 200 and body["deleted"] is True, body
        status, body, _ = hooked.request("DELETE", f"/v1/webhooks/{endpoint}", headers=manage)
        assert status == 404, body
        status, listing, _ = hooked.request("GET", "/v1/webhooks", headers=manage)
        assert listing["data"] == []
    finally:
        own.stop()


def test_an_event_is_delivered_after_a_restart(workdir, sim):
    # This gateway keeps the default: tenants' endpoints must be public (the operator's, like
    # this receiver on 127.0.0.1, may be anywhere).
    r = Receiver(OP_SECRET)
    g = Gateway(workdir, {"colibri": [sim.api_base]}, extra=hooks_config(r, private_ok=False),
                name="quipu-hooks-restart")
    g.start()
    try:
        g.cli("tenant", "create", "insider")
        secret = g.cli("key", "create", "--tenant", "insider", "--manage")["secret"]
        g.wait_key(secret)
        for url in ("http://127.0.0.1:9/x", "http://169.254.169.254/latest", "http://localhost/",
                    "http://[::1]/"):
            status, body, _ = g.request("POST", "/v1/webhooks", {"url": url},
                                        {"Authorization": f"Bearer {secret}"})
            assert status == 400 and "internal address" in body["error"]["message"], (url, body)

        r.answer = lambda event: 500  # the receiver fails while Quipu runs...
        g.cli("tenant", "create", "restarted")
        g.cli("topup", "--tenant", "restarted", "--amount", "10.00")
        wait_until(lambda: any(d["status"] == 500 for d in r.deliveries), 20, what="a failed attempt")
        assert g.stop() == 0
        r.answer = lambda event: 200  # ...recovers while Quipu is stopped...
        g.process = None
        g.start()  # ...and the same event is delivered by the new process.
        (event,) = r.wait_for("restarted", "topup.received")
        statuses = r.attempts(event["id"])
        assert statuses[0] == 500 and statuses[-1] == 200, statuses
        assert r.bad == []
    finally:
        g.stop()
        r.stop()


def test_three_replicas_deliver_each_event_once(workdir):
    admin = os.environ.get("QUIPU_TEST_PG_URL")
    assert admin, "QUIPU_TEST_PG_URL is not set: eval \"$(scripts/pg-test.sh start)\" first"
    url = fresh_database(admin)
    r = Receiver(OP_SECRET)
    s = Sim(workdir, name="sim-hooks").start()
    replicas = [Gateway(workdir, {"colibri": [s.api_base]}, store_url=url, extra=hooks_config(r),
                        name=f"quipu-hooks-{i}") for i in range(3)]
    try:
        for g in replicas:
            g.start(wait=False)
        for g in replicas:
            g.wait_ready()
        names = [f"rep{i}" for i in range(5)]
        for i, name in enumerate(names):
            replicas[i % 3].cli("tenant", "create", name)
            replicas[i % 3].cli("topup", "--tenant", name, "--amount", "10.00")
        for name in names:
            r.wait_for(name, "topup.received")
        barrier(replicas[0], r)
        for name in names:
            (event,) = r.accepted(name, "topup.received")
            assert r.attempts(event["id"]) == [200], f"{name}: delivered more than once"
        counts = [g.metric_value("quipu_webhook_deliveries_total", outcome="delivered") for g in replicas]
        assert sum(counts) == len(r.deliveries), (counts, len(r.deliveries))
        assert sorted(c > 0 for c in counts) == [False, False, True], f"one sender: {counts}"
        # The sender dies without a word: another replica takes over once its lease runs out.
        sender = replicas[counts.index(max(counts))]
        sender.process.stop(signal.SIGKILL, timeout=10)
        alive = [g for g in replicas if g is not sender]
        alive[0].cli("tenant", "create", "after-the-sender")
        alive[0].cli("topup", "--tenant", "after-the-sender", "--amount", "10.00")
        (event,) = r.wait_for("after-the-sender", "topup.received", timeout=30)
        assert r.attempts(event["id"]) == [200]
        assert r.bad == []
    finally:
        for g in replicas:
            if g.process and g.process.alive():
                g.stop()
        s.stop()
        r.stop()
