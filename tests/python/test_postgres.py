"""Two gateway replicas on one PostgreSQL: shared keys (revocation within 2 s) and one balance,
shared exactly, never overdrawn.

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


def test_the_balance_is_shared_exactly_and_never_overdrawn(pair):
    a, b, _ = pair
    _, secret = a.new_tenant("shared-money", top_up="10.00")
    b.wait_key(secret)
    results: list[int] = []
    lock = threading.Lock()

    def go(i):
        gw = a if i % 2 else b
        s = chat(gw, secret, "[[sim: tokens=1000]]")
        with lock:
            results.append(s)

    # apu: 1000 output tokens at S/ 12 per million = S/ 0.012 each, so S/ 10 pays for about
    # 830 of the 3000; the worst case reserved per request is about S/ 0.1.
    with cf.ThreadPoolExecutor(32) as pool:
        list(pool.map(go, range(3000)))
    ok = results.count(200)
    refused = results.count(402)
    assert ok + refused == len(results), sorted(set(results))
    assert ok > 100
    time.sleep(1.0)
    st = a.cli("statement", "--tenant", "shared-money")
    charges = Decimal(st["totals"]["charges"])
    assert st["totals"]["requests"] == ok
    assert Decimal(st["balance"]) == Decimal("10.00") - charges
    assert Decimal(st["balance"]) >= 0
    st_b = b.cli("statement", "--tenant", "shared-money")
    assert st_b["balance"] == st["balance"], "both replicas read the same balance"
