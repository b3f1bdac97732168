"""Money under bursts, on SQLite and PostgreSQL: a funded tenant is never refused, the account
view always adds up, and a burst never overdraws.

A request here reserves about S/ 2.57 and costs about S/ 2.02 (prices scaled so that two
output tokens cost S/ 2.00), like the requests that found a tenant refused while S/ 52 of its
balance was still there: each tenant is funded for 50 requests and sends 40, two and ten at a
time. Every one must be admitted (402 only means the money is spent or held by requests in
flight), `/v1/account` polled throughout never shows a negative `available`, and the ledger and
balance agree to the pico-sol afterwards."""

from __future__ import annotations

import concurrent.futures as cf
import os
import subprocess
import threading
import uuid
from decimal import Decimal

import pytest

from harness import Gateway, Sim, http_json, wait_until

# Per million tokens: an input token costs S/ 0.001 (cached the same, so the prefix cache does
# not change a request's cost), an output token S/ 1.00.
PRICES = 'prices = { input = "1000.00", cached = "1000.00", output = "1000000.00" }'
PROMPT = "cuenta hasta dos [[sim: tokens=2 delay_ms=15]]"
MAX_TOKENS = 2
TENANTS = 20
REQUESTS = 40
FUNDED_FOR = 50


def store_url(kind: str, workdir) -> str | None:
    if kind == "sqlite":
        return None
    url = os.environ.get("QUIPU_TEST_PG_URL")
    assert url, (
        "QUIPU_TEST_PG_URL is not set: run the suite with scripts/test.sh, or start a server with "
        "`eval \"$(scripts/pg-test.sh start)\"` first"
    )
    name = "quipu_" + uuid.uuid4().hex[:10]
    subprocess.run(["psql", url, "-qc", f"CREATE DATABASE {name}"], check=True, capture_output=True)
    return f"{url.rpartition('/')[0]}/{name}"


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def money(request, workdir):
    sim = Sim(workdir, name=f"sim-money-{request.param}").start()
    gw = Gateway(workdir, {"apu": [sim.api_base]}, store_url=store_url(request.param, workdir),
                 name=f"quipu-money-{request.param}")
    gw.config_text = gw.config_text.replace(
        'prices = { input = "3.00", cached = "0.75", output = "12.00" }', PRICES)
    assert PRICES in gw.config_text
    gw.config_path.write_text(gw.config_text)
    gw.start()
    # What one request costs and reserves, measured once: the tests fund tenants from it.
    _, key = gw.new_tenant(f"calibration-{request.param}")
    status, body, _ = chat(gw, key)
    assert status == 200, body
    cost = Decimal(wait_rows(gw, key, 1)[0]["charge"])
    yield gw, cost
    gw.stop()
    sim.stop()


def chat(gw: Gateway, key: str):
    return http_json(
        "POST", gw.base + "/v1/chat/completions",
        {"model": "apu", "max_tokens": MAX_TOKENS, "messages": [{"role": "user", "content": PROMPT}]},
        {"Authorization": f"Bearer {key}"}, timeout=60,
    )


def wait_rows(gw: Gateway, key: str, n: int) -> list[dict]:
    """The tenant's request rows in the ledger (its own `/v1/requests`), once there are `n`;
    each with its exact `charge`."""
    rows: list[dict] = []

    def enough():
        nonlocal rows
        status, body, _ = http_json("GET", gw.base + "/v1/requests?limit=1000", None,
                                    {"Authorization": f"Bearer {key}"}, timeout=30)
        assert status == 200, body
        rows = [{**r, "charge": r["charge"]["exact"]} for r in body["data"]]
        return len(rows) >= n

    wait_until(enough, 20, f"{n} ledger rows")
    return rows


def balance(gw: Gateway, tenant: str) -> Decimal:
    return Decimal(gw.cli("statement", "--tenant", tenant)["balance"])


class AccountPoller:
    """Reads `/v1/account` as the tenant, over and over, until stopped; keeps every
    `available` it saw that was below zero, and how many reads it made."""

    def __init__(self, gw: Gateway, key: str):
        self.gw, self.key = gw, key
        self.negative: list[dict] = []
        self.reads = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            status, body, _ = http_json("GET", self.gw.base + "/v1/account", None,
                                        {"Authorization": f"Bearer {self.key}"}, timeout=30)
            if status != 200:
                continue
            self.reads += 1
            if Decimal(body["available"]["exact"]) < 0:
                self.negative.append({k: body[k]["exact"] for k in ("balance", "pending", "reserved", "available")})

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(30)


@pytest.mark.parametrize("concurrency", [2, 10])
def test_a_funded_tenant_is_never_refused(money, concurrency):
    gw, cost = money
    refused: dict[str, list[str]] = {}
    negative: dict[str, list[dict]] = {}
    reads = 0
    for i in range(TENANTS):
        name = f"funded-{concurrency}-{i}-{uuid.uuid4().hex[:6]}"
        top_up = cost * FUNDED_FOR
        _, key = gw.new_tenant(name, top_up=str(top_up))
        with AccountPoller(gw, key) as poller, cf.ThreadPoolExecutor(concurrency) as pool:
            results = list(pool.map(lambda _: chat(gw, key), range(REQUESTS)))
        reads += poller.reads
        statuses = [s for s, _, _ in results]
        if statuses.count(200) != REQUESTS:
            refused[name] = [b["error"]["message"] for s, b, _ in results if s != 200][:3]
        if poller.negative:
            negative[name] = poller.negative[:3]
        rows = wait_rows(gw, key, statuses.count(200))
        assert len(rows) == statuses.count(200), "one ledger row per admitted request"
        assert all(Decimal(r["charge"]) == cost for r in rows), "every request costs the same"
        left = balance(gw, name)
        assert left == top_up - cost * len(rows), (name, left, top_up, len(rows))
    assert not refused, f"funded tenants refused (402) at {concurrency} at a time: {refused}"
    assert not negative, f"/v1/account showed a negative available ({reads} reads): {negative}"
    assert reads >= TENANTS, "the account was hardly read"


def test_a_burst_never_overdraws_and_refuses_only_held_money(money):
    """200 requests at once against a balance for 50: each admitted request has exactly one
    ledger row, the balance is exact and not negative, and at least as many are admitted as
    the balance covers reservations for at one moment."""
    gw, cost = money
    name = f"burst-{uuid.uuid4().hex[:6]}"
    top_up = cost * FUNDED_FOR
    _, key = gw.new_tenant(name, top_up=str(top_up))
    barrier = threading.Barrier(200)

    def go(_):
        barrier.wait()
        return chat(gw, key)

    with AccountPoller(gw, key) as poller, cf.ThreadPoolExecutor(200) as pool:
        results = list(pool.map(go, range(200)))
    statuses = [s for s, _, _ in results]
    assert set(statuses) <= {200, 402}, sorted(set(statuses))
    admitted = statuses.count(200)
    rows = wait_rows(gw, key, admitted)
    assert len(rows) == admitted, "one ledger row per admitted request"
    ids = {r["id"] for r in rows}
    assert ids == {h.get("x-request-id") for s, _, h in results if s == 200}
    left = balance(gw, name)
    assert left == top_up - cost * admitted >= 0, (left, top_up, admitted)
    reserve = Decimal(next(b for s, b, _ in results if s == 402)["error"]["message"]
                      .split("may cost up to S/ ")[1].split(" ")[0]) if 402 in statuses else None
    if reserve is not None:
        assert admitted >= int(top_up // reserve), (admitted, top_up, reserve)
    assert not poller.negative, f"/v1/account showed a negative available: {poller.negative[:3]}"
