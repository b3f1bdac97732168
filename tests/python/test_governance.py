"""Keys that can be governed, through running gateways: model lists answered 403 in every
format, expiry and rotation answered 401, and spend caps that hold exactly across three
replicas on PostgreSQL and start over with their period.

A capped request here costs exactly what it reserves (input is free, the simulator writes
every token `max_tokens` allows), so "spent to within one request of the cap" is a sharp
check: S/ 0.0012 a request against a cap of S/ 0.05.
"""

from __future__ import annotations

import concurrent.futures as cf
import datetime as dt
import os
import threading
from decimal import Decimal

import pytest

from cluster import Cluster, fresh_database, psql
from harness import Gateway, Sim, http_json, wait_until

COST = Decimal("0.0012")  # 12 output tokens at S/ 100 per million, input free
CAP = Decimal("0.05")
DAY_S = 86_400


def chat(base: str, secret: str, model: str = "apu", max_tokens: int = 12):
    return http_json(
        "POST", base + "/v1/chat/completions",
        {"model": model, "max_tokens": max_tokens,
         "messages": [{"role": "user", "content": "[[sim: tokens=100000]]"}]},
        {"Authorization": f"Bearer {secret}"}, timeout=60,
    )


def messages(base: str, secret: str, model: str):
    return http_json(
        "POST", base + "/v1/messages",
        {"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": "hola"}]},
        {"x-api-key": secret, "anthropic-version": "2023-06-01"}, timeout=60,
    )


def responses(base: str, secret: str, model: str):
    return http_json(
        "POST", base + "/v1/responses",
        {"model": model, "max_output_tokens": 8, "input": "hola"},
        {"Authorization": f"Bearer {secret}"}, timeout=60,
    )


@pytest.fixture(scope="module")
def gw(workdir):
    sim = Sim(workdir, name="sim-gov").start()
    g = Gateway(workdir, {"colibri": [sim.api_base], "aguila": [sim.api_base]}, name="quipu-gov").start()
    yield g
    g.stop()
    sim.stop()


def test_a_key_limited_to_colibri_gets_403_on_aguila_in_every_format(gw):
    _, secret = gw.new_tenant("only-colibri", models="colibri")
    for call, error_of in [
        (chat, lambda b: (b["error"]["type"], b["error"]["message"])),
        (messages, lambda b: (b["error"]["type"], b["error"]["message"])),
        (responses, lambda b: (b["error"]["type"], b["error"]["message"])),
    ]:
        status, body, _ = call(gw.base, secret, "aguila")
        assert status == 403, (call.__name__, status, body)
        kind, message = error_of(body)
        assert kind == "permission_error", (call.__name__, body)
        assert "colibri" in message, message
        status, body, _ = call(gw.base, secret, "colibri")
        assert status == 200, (call.__name__, status, body)
    # The Anthropic format's body is its own shape.
    _, body, _ = messages(gw.base, secret, "aguila")
    assert body["type"] == "error"


def test_an_expired_key_and_a_rotated_key_after_its_grace_get_401(gw):
    soon = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=3)).strftime("%Y-%m-%dT%H:%M:%SZ")
    _, expiring = gw.new_tenant("expiring", expires=soon)
    assert chat(gw.base, expiring, "colibri")[0] == 200
    wait_until(lambda: chat(gw.base, expiring, "colibri")[0] == 401, 10, "the key to expire")
    status, body, _ = chat(gw.base, expiring, "colibri")
    assert body["error"]["type"] == "authentication_error" and "expired" in body["error"]["message"], body

    key, old = gw.new_tenant("rotating")
    rotated = gw.cli("key", "rotate", key["key_id"], "--grace", "4s")
    new = rotated["secret"]
    assert rotated["replaces"]["key_id"] == key["key_id"]
    gw.wait_key(new)
    # During the grace both work; after it, only the new one.
    assert chat(gw.base, old, "colibri")[0] == 200
    assert chat(gw.base, new, "colibri")[0] == 200
    wait_until(lambda: chat(gw.base, old, "colibri")[0] == 401, 15, "the old secret's grace to end")
    assert chat(gw.base, new, "colibri")[0] == 200


def test_a_disabled_key_is_refused_and_works_again_when_enabled(gw):
    key, secret = gw.new_tenant("switch")
    gw.cli("key", "update", key["key_id"], "--disable")
    wait_until(lambda: chat(gw.base, secret, "colibri")[0] == 401, 5, "the key to be switched off")
    gw.cli("key", "update", key["key_id"], "--enable")
    wait_until(lambda: chat(gw.base, secret, "colibri")[0] == 200, 5, "the key to be switched on")


# ---------------------------------------------------------------------------------------------
# Caps across three replicas


def burst(base: str, secrets: list[str], n: int) -> dict[int, int]:
    """`n` requests at once (round robin over `secrets`); status -> count. Every refusal is a
    cap's 429, with `retry-after` and a message naming the cap."""
    statuses: dict[int, int] = {}
    lock = threading.Lock()

    def one(i: int) -> None:
        status, body, hdrs = chat(base, secrets[i % len(secrets)])
        if status == 429:
            assert int(hdrs["retry-after"]) > 0, hdrs
            assert body["error"]["code"] == "budget_exceeded", body
            assert "cap of S/ 0.05" in body["error"]["message"], body
            assert "resets at" in body["error"]["message"], body
        else:
            assert status == 200, (status, body)
        with lock:
            statuses[status] = statuses.get(status, 0) + 1

    with cf.ThreadPoolExecutor(n) as pool:
        list(pool.map(one, range(n)))
    return statuses


def spent(cluster: Cluster, tenant: str) -> Decimal:
    ledger = cluster.ledger(tenant)
    return sum((Decimal(c) for c, *_ in ledger.values()), Decimal(0)) / Decimal(10**12)


def leases_home(cluster: Cluster) -> bool:
    (held,) = psql(cluster.pg_url, "SELECT COALESCE(SUM(amount), 0) FROM cap_leases")
    return Decimal(held) == 0


def spend_to_the_cap(cluster: Cluster, tenant: str, secrets: list[str], admitted: int) -> None:
    """After a burst: the period's ledger sum is within the cap, exactly; once the replicas'
    idle leases are home, requests one at a time spend it to within one request."""
    wait_until(lambda: len(cluster.ledger(tenant)) == admitted, 15, "the admitted requests' rows")
    total = spent(cluster, tenant)
    assert total == COST * admitted <= CAP, (total, admitted)
    wait_until(lambda: leases_home(cluster), 20, "idle cap leases to go home")
    i = 0
    while chat(cluster.base, secrets[i % len(secrets)])[0] == 200:
        i += 1
        assert i < 100, "the cap never refused"
    wait_until(lambda: len(cluster.ledger(tenant)) == admitted + i, 15, "the last requests' rows")
    total = spent(cluster, tenant)
    assert total <= CAP, total
    assert CAP - total < COST, f"only S/ {total} of the cap of S/ {CAP} spent"


def test_caps_hold_across_three_replicas_and_start_over_with_their_period(workdir, pg_admin, capsys):
    cluster = Cluster(workdir, fresh_database(pg_admin), n=3, name="caps",
                      prices={"apu": ("0.00", "0.00", "100.00")}).start()
    try:
        # A key's daily cap.
        key_secret = cluster.new_tenant("daily", top_up="100.00", budget="0.05", **{"budget-period": "day"})
        statuses = burst(cluster.base, [key_secret], 200)
        assert statuses.get(429, 0) > 0, statuses
        spend_to_the_cap(cluster, "daily", [key_secret], statuses[200])
        key_total = spent(cluster, "daily")
        # A tenant's monthly cap, over two keys of its own.
        first = cluster.new_tenant("monthly", top_up="100.00")
        cluster.replicas[0].cli("tenant", "update", "monthly", "--monthly-cap", "0.05")
        # A key created after the change: a replica that knows it has read the cap too.
        key2 = cluster.replicas[0].cli("key", "create", "--tenant", "monthly")["secret"]
        for g in cluster.replicas:
            g.wait_key(key2)
        statuses = burst(cluster.base, [first, key2], 200)
        assert statuses.get(429, 0) > 0, statuses
        spend_to_the_cap(cluster, "monthly", [first, key2], statuses[200])
        month_total = spent(cluster, "monthly")
        # The balances paid what the caps let through, no more.
        assert cluster.balance("daily") == Decimal("100.00") - key_total
        assert cluster.balance("monthly") == Decimal("100.00") - month_total
        # Forty days later (the replicas restarted on a clock moved forward), both caps have
        # started over.
        for i, g in enumerate(cluster.replicas):
            g.env = lambda: {**os.environ, "QUIPU_LOG": "info", "QUIPU_CLOCK_OFFSET_S": str(40 * DAY_S)}
            cluster.restart(i)
        assert chat(cluster.base, key_secret)[0] == 200
        assert chat(cluster.base, first)[0] == 200
        with capsys.disabled():
            print(f"\ncaps through 3 replicas, 200 at once: daily key cap spent S/ {key_total} of S/ {CAP}; "
                  f"monthly tenant cap S/ {month_total} of S/ {CAP}; each request S/ {COST}")
    finally:
        cluster.stop()
