"""Two gateway replicas on one PostgreSQL: shared keys (revocation within 2 s) and one balance,
spent exactly by both at once with requests that cost their whole reservation, never overdrawn,
nothing left stranded in leases once idle.

Needs the throwaway server scripts/test.sh starts (QUIPU_TEST_PG_URL); without it the tests
fail and say so.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import subprocess
import threading
import time
import uuid
from decimal import Decimal

import pytest

from harness import ADMIN_TOKEN, Gateway, Sim, http_json


@pytest.fixture(scope="module")
def pg_url():
    url = os.environ.get("QUIPU_TEST_PG_URL")
    assert url, (
        "QUIPU_TEST_PG_URL is not set: run the suite with scripts/test.sh, or start a server with "
        "`eval \"$(scripts/pg-test.sh start)\"` first"
    )
    name = "quipu_" + uuid.uuid4().hex[:10]
    subprocess.run(["psql", url, "-qc", f"CREATE DATABASE {name}"], check=True, capture_output=True)
    base, _, _ = url.rpartition("/")
    yield f"{base}/{name}"


@pytest.fixture(scope="module")
def pair(workdir, pg_url):
    sim = Sim(workdir, name="sim-pg").start()
    ups = {s: [sim.api_base] for s in ("colibri", "aguila", "apu")}
    a = Gateway(workdir, ups, store_url=pg_url, name="quipu-pg-a").start()
    b = Gateway(workdir, ups, store_url=pg_url, name="quipu-pg-b").start()
    yield a, b, sim
    a.stop()
    b.stop()
    sim.stop()


def chat(gw, key, content="hola [[sim: tokens=5]]", model="apu"):
    return http_json(
        "POST", gw.base + "/v1/chat/completions",
        {"model": model, "messages": [{"role": "user", "content": content}]},
        {"Authorization": f"Bearer {key}"}, timeout=60,
    )[0]


def test_a_key_revoked_through_one_replica_is_refused_by_the_other(pair):
    a, b, _ = pair
    key, secret = a.new_tenant("shared-keys")
    b.wait_key(secret)
    assert chat(a, secret) == 200 and chat(b, secret) == 200
    status, body, _ = http_json(
        "POST", f"{a.admin}/admin/keys/{key['key_id']}/revoke", {}, {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    )
    assert status == 200, body
    revoked_at = time.time()
    while chat(b, secret) != 401:
        assert time.time() - revoked_at < 2.0, "replica b still accepts the revoked key after 2 s"
        time.sleep(0.05)


MAX_COST_TOKENS = 500
WORST = MAX_COST_TOKENS * Decimal("300.00") / 1_000_000  # S/ 0.15 at the prices below


@pytest.fixture(scope="module")
def pricey_pair(workdir, pg_url):
    """Two replicas on one database; apu has free input and S/ 300 per million output tokens,
    so a request that generates exactly its max_tokens costs exactly its reservation."""
    sim = Sim(workdir, name="sim-pg-pricey").start()
    gws = []
    for name in ("quipu-pg-pa", "quipu-pg-pb"):
        gw = Gateway(workdir, {"apu": [sim.api_base]}, store_url=pg_url, name=name)
        gw.config_text = gw.config_text.replace(
            'prices = { input = "3.00", cached = "0.75", output = "12.00" }',
            'prices = { input = "0.00", cached = "0.00", output = "300.00" }',
        )
        assert 'output = "300.00"' in gw.config_text
        gw.config_path.write_text(gw.config_text)
        gws.append(gw.start())
    yield gws[0], gws[1], sim, pg_url
    for gw in gws:
        gw.stop()
    sim.stop()


def psql(url: str, sql: str) -> list[str]:
    r = subprocess.run(["psql", url, "-Atc", sql], check=True, capture_output=True, text=True)
    return [line for line in r.stdout.splitlines() if line]


def leased(gw, tenant: str) -> Decimal:
    (t,) = [t for t in gw.cli("tenant", "list")["tenants"] if t["name"] == tenant]
    return Decimal(t["leased"])


def test_the_balance_is_shared_exactly_and_never_overdrawn(pricey_pair):
    a, b, _, url = pricey_pair
    balance = Decimal("10.00")
    _, secret = a.new_tenant("shared-money", top_up=str(balance))
    b.wait_key(secret)
    results: list[tuple[int, str | None]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(48)

    def go(i):
        gw = a if i % 2 else b
        if i < 48:
            barrier.wait()
        s, _, hdrs = http_json(
            "POST", gw.base + "/v1/chat/completions",
            {"model": "apu", "max_tokens": MAX_COST_TOKENS,
             "messages": [{"role": "user", "content": "[[sim: tokens=100000 delay_ms=1]]"}]},
            {"Authorization": f"Bearer {secret}"}, timeout=60,
        )
        with lock:
            results.append((s, hdrs.get("x-request-id")))

    # 120 requests of S/ 0.15 each at most, for S/ 10: both replicas run out together.
    with cf.ThreadPoolExecutor(48) as pool:
        list(pool.map(go, range(120)))
    statuses = [s for s, _ in results]
    admitted = sorted(rid for s, rid in results if s == 200)
    assert statuses.count(200) + statuses.count(402) == len(results), sorted(set(statuses))
    # Each replica can be left holding less than one request's worth it cannot use; beyond
    # that, every sol is spent and none twice.
    most = int(balance // WORST)
    assert most - 2 < len(admitted) <= most, len(admitted)

    deadline = time.time() + 10
    while True:
        rows = psql(url, "SELECT entry_id || ' ' || delta FROM ledger WHERE kind = 'request' AND tenant_id = "
                    "(SELECT id FROM tenants WHERE name = 'shared-money') ORDER BY entry_id")
        if len(rows) >= len(admitted) or time.time() > deadline:
            break
        time.sleep(0.1)
    ids = [r.split()[0] for r in rows]
    assert ids == admitted, "every admitted request has exactly one ledger row"
    assert all(Decimal(-int(r.split()[1])) / Decimal(10**12) == WORST for r in rows)
    st = a.cli("statement", "--tenant", "shared-money")
    charges = Decimal(st["totals"]["charges"])
    assert charges == WORST * len(admitted)
    assert Decimal(st["balance"]) == balance - charges >= 0
    assert Decimal(st["balance"]) < 2 * WORST
    assert b.cli("statement", "--tenant", "shared-money")["balance"] == st["balance"]
    # What is left sits in the replicas' leases (at most a request's worth each) until they
    # return them after a few idle seconds.
    held = leased(a, "shared-money")
    assert 0 <= held <= Decimal(st["balance"]), held
    deadline = time.time() + 15
    while leased(a, "shared-money") != 0:
        assert time.time() < deadline, "idle leases were not returned"
        time.sleep(0.2)
    assert Decimal(a.cli("statement", "--tenant", "shared-money")["balance"]) == balance - charges
