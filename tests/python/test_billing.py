"""Money: exact charges, no overdraft under concurrency, durability across SIGTERM, statements."""

from __future__ import annotations

import concurrent.futures as cf
import json
import random
import signal
import sqlite3
import threading
import time
from decimal import Decimal

import anthropic
import openai
import pytest

from harness import Gateway, Sim, http_json

PRICES = {  # per million tokens, as harness.model_block configures them
    "colibri": (Decimal("0.20"), Decimal("0.05"), Decimal("0.80")),
    "aguila": (Decimal("1.00"), Decimal("0.25"), Decimal("4.00")),
    "apu": (Decimal("3.00"), Decimal("0.75"), Decimal("12.00")),
}


def charge(model: str, prompt: int, cached: int, completion: int, prices=PRICES) -> Decimal:
    i, c, o = prices[model]
    return ((prompt - cached) * i + cached * c + completion * o) / Decimal(1_000_000)


def ledger_rows(gw: Gateway) -> dict[str, dict]:
    con = sqlite3.connect(gw.store_url.removeprefix("sqlite://"))
    con.row_factory = sqlite3.Row
    rows = {r["entry_id"]: dict(r) for r in con.execute("SELECT * FROM ledger WHERE kind = 'request'")}
    con.close()
    return rows


def wait_ledger(gw: Gateway, n: int, timeout: float = 10.0) -> dict[str, dict]:
    deadline = time.time() + timeout
    while True:
        rows = ledger_rows(gw)
        if len(rows) >= n or time.time() > deadline:
            return rows
        time.sleep(0.05)


@pytest.fixture(scope="module")
def billing(workdir):
    sim = Sim(workdir, name="sim-billing").start()
    gw = Gateway(workdir, {s: [sim.api_base] for s in PRICES}, name="quipu-billing").start()
    yield gw, sim
    gw.stop()
    sim.stop()


def one_request(gw: Gateway, key: str, rng: random.Random) -> str | None:
    """A random request of any kind; returns the gateway's request id (None if refused)."""
    model = rng.choice(list(PRICES))
    kind = rng.choice(["chat", "chat_stream", "messages", "messages_stream"])
    fault = rng.choice(["", "", "", "reset_after=3", "fail_after=2", "stop=xyz", "tokens=1"])
    text = f"pregunta {rng.random()} [[sim: tokens={rng.randint(1, 40)} {fault} reasoning={rng.randint(0, 3)}]]"
    if kind.startswith("chat"):
        body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": rng.choice([5, 50, 8192])}
        headers = {"Authorization": f"Bearer {key}"}
        path = "/v1/chat/completions"
    else:
        body = {"model": model, "max_tokens": rng.choice([5, 50, 8192]), "messages": [{"role": "user", "content": text}]}
        headers = {"x-api-key": key, "anthropic-version": "2023-06-01"}
        path = "/v1/messages"
    if kind.endswith("stream"):
        body["stream"] = True
    status, _, hdrs = http_json("POST", gw.base + path, body, headers)
    return hdrs.get("x-request-id")


def test_ledger_equals_an_independent_recomputation(billing):
    gw, sim = billing
    name, secret = "exact", gw.new_tenant("exact", top_up="100000.00")[1]
    since = sim.stats()["seq"]
    rng = random.Random(7)
    n = 1500
    with cf.ThreadPoolExecutor(16) as pool:
        ids = list(pool.map(lambda _: one_request(gw, secret, random.Random(rng.random())), range(n)))
    assert all(ids)
    rows = wait_ledger(gw, n)
    assert len(rows) == n, f"{len(rows)} ledger rows for {n} admitted requests"
    seen = {r["request_id"]: r for r in sim.requests(since) if r["request_id"]}
    expected_total = Decimal(0)
    for rid in ids:
        rec = seen[rid]
        row = rows[rid]
        completion = rec["completion_tokens"]
        model = next(s for s in PRICES if rec["model"] == f"upstream-{s}")
        if rec["status"] != 200:
            completion, prompt, cached = 0, 0, 0
        else:
            prompt, cached = rec["prompt_tokens"], rec["cached_tokens"]
        assert (row["input_tokens"], row["cached_tokens"], row["output_tokens"]) == (prompt, cached, completion), (rid, rec, row)
        expected_total += charge(model, prompt, cached, completion)
    statement = gw.cli("statement", "--tenant", name)
    assert Decimal(statement["totals"]["charges"]) == expected_total
    assert Decimal(statement["balance"]) == Decimal("100000.00") - expected_total
    assert statement["totals"]["requests"] == n


@pytest.fixture(scope="module")
def pricey(workdir):
    """apu at S/ 300 per million output tokens: a worst case of about S/ 2.5 per request."""
    sim = Sim(workdir, name="sim-pricey").start()
    gw = Gateway(workdir, {"apu": [sim.api_base]}, name="quipu-pricey")
    gw.config_text = gw.config_text.replace('output = "12.00"', 'output = "300.00"')
    gw.config_path.write_text(gw.config_text)
    gw.start()
    yield gw, sim
    gw.stop()
    sim.stop()


def test_no_overdraft_under_concurrency(pricey):
    gw, _ = pricey
    _, key = gw.new_tenant("thin", top_up="10.00")
    barrier = threading.Barrier(200)

    def go(_):
        barrier.wait()
        s, body, _ = http_json(
            "POST", gw.base + "/v1/chat/completions",
            {"model": "apu", "messages": [{"role": "user", "content": "[[sim: tokens=5 delay_ms=200]]"}]},
            {"Authorization": f"Bearer {key}"}, timeout=60,
        )
        return s, body

    with cf.ThreadPoolExecutor(200) as pool:
        results = list(pool.map(go, range(200)))
    statuses = [s for s, _ in results]
    admitted = statuses.count(200)
    refused = statuses.count(402)
    assert admitted + refused == 200, sorted(set(statuses))
    assert 1 <= admitted < 200
    for s, body in results:
        if s == 402:
            assert body["error"]["type"] == "insufficient_quota" and body["error"]["code"] == "insufficient_quota"
    wait_ledger(gw, admitted)
    statement = gw.cli("statement", "--tenant", "thin")
    assert statement["totals"]["requests"] == admitted
    balance = Decimal(statement["balance"])
    assert balance >= 0
    assert balance == Decimal("10.00") - Decimal(statement["totals"]["charges"])
    assert Decimal(statement["totals"]["charges"]) > 0


def test_sigterm_during_load_keeps_every_completed_request(workdir):
    sim = Sim(workdir, name="sim-sigterm").start()
    gw = Gateway(workdir, {s: [sim.api_base] for s in PRICES}, name="quipu-sigterm").start()
    _, key = gw.new_tenant("durable", top_up="1000.00")
    completed: list[str] = []
    stop = threading.Event()
    lock = threading.Lock()

    def worker(i):
        c = openai.OpenAI(base_url=gw.base + "/v1", api_key=key, max_retries=0)
        while not stop.is_set():
            try:
                r = c.chat.completions.with_raw_response.create(
                    model="colibri", messages=[{"role": "user", "content": f"{i} [[sim: tokens=8 delay_ms=20]]"}]
                )
                r.parse()
                with lock:
                    completed.append(r.headers["x-request-id"])
            except openai.APIError:
                return

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    time.sleep(1.5)
    gw.process.send_signal(signal.SIGTERM)
    stop.set()
    for t in threads:
        t.join(30)
    code = gw.process.proc.wait(30)
    assert code == 0
    assert completed, "no request completed before the signal"
    gw.start()  # same store
    rows = ledger_rows(gw)
    missing = [rid for rid in completed if rid not in rows]
    assert not missing, f"{len(missing)} of {len(completed)} completed requests lost"
    gw.stop()
    sim.stop()


def test_newcomer_flow_statement_matches_pricing(billing):
    gw, sim = billing
    _, key = gw.new_tenant("newcomer", top_up="20.00")
    since = sim.stats()["seq"]
    c = openai.OpenAI(base_url=gw.base + "/v1", api_key=key, max_retries=0)
    a = anthropic.Anthropic(base_url=gw.base, api_key=key, max_retries=0)
    c.chat.completions.create(model="colibri", messages=[{"role": "user", "content": "hola [[sim: tokens=30]]"}])
    c.chat.completions.create(model="colibri", messages=[{"role": "user", "content": "hola [[sim: tokens=30]]"}])
    a.messages.create(model="apu", max_tokens=100, messages=[{"role": "user", "content": "hola"}])
    recs = [r for r in sim.requests(since) if r["request_id"]]
    rows = wait_ledger(gw, 3)
    st = gw.cli("statement", "--tenant", "newcomer")
    by_model = {m["model"]: m for m in st["models"]}
    assert set(by_model) == {"colibri", "apu"}
    assert by_model["colibri"]["requests"] == 2
    expected = sum(
        charge(r["model"].removeprefix("upstream-"), r["prompt_tokens"], r["cached_tokens"], r["completion_tokens"])
        for r in recs
    )
    assert Decimal(st["totals"]["charges"]) == expected
    assert Decimal(st["balance"]) == Decimal("20.00") - expected
    assert by_model["colibri"]["cached_tokens"] > 0, "the second identical prompt hit the prefix cache"
    text = gw.cli_text("statement", "--tenant", "newcomer")
    assert "S/ " in text and "colibri" in text
    assert rows


def test_top_up_below_minimum_is_refused(billing):
    gw, _ = billing
    gw.cli("tenant", "create", "cheap")
    r = gw.cli("topup", "--tenant", "cheap", "--amount", "5.00", check=False)
    assert r["code"] != 0 and "S/ 10.00" in r["error"]
    status, body, _ = http_json(
        "POST", gw.admin + "/admin/topups", {"tenant": "cheap", "amount": "9.99"},
        {"Authorization": "Bearer test-admin-token-0123456789"},
    )
    assert status == 400 and "S/ 10.00" in body["error"]["message"]
    status, body, _ = http_json("POST", gw.admin + "/admin/topups", {"tenant": "cheap", "amount": "10.00"})
    assert status == 401, "the admin API refuses without its token"
