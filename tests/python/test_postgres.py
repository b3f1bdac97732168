"""Two gateway replicas on one PostgreSQL: shared keys (revocation within 2 s) and one balance,
spent exactly by both at once with requests that cost their whole reservation, never overdrawn,
nothing left stranded in leases once idle.

Needs the throwaway server scripts/test.sh starts (QUIPU_TEST_PG_URL); without it the tests
fail and say so.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import json
import os
import pathlib
import signal
import subprocess
import threading
import time
import uuid
from decimal import Decimal

import pytest

from harness import ADMIN_TOKEN, ROOT, Gateway, Sim, http_json, wait_until


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



def test_keys_are_stored_only_as_hashes(pair):
    """The PostgreSQL version of the SQLite check in test_keys_and_bodies.py: the api_keys row
    holds the secret's SHA-256 and a short display prefix; the secret itself is in no column of
    any table (every row of every table of the schema, read as text), nor in a gateway's log,
    even after it served a request with it."""
    a, b, _ = pair
    key, secret = a.new_tenant("hashed-keys")
    b.wait_key(secret)
    assert chat(a, secret) == 200 and chat(b, secret) == 200
    digest = hashlib.sha256(secret.encode()).hexdigest()
    (row,) = psql(a.store_url, "SELECT encode(secret_sha256, 'hex') || '|' || secret_prefix FROM api_keys "
                  f"WHERE id = '{key['key_id']}'")
    stored_digest, prefix = row.split("|")
    assert stored_digest == digest, "the digest is the key's SHA-256"
    assert secret.startswith(prefix) and len(prefix) <= len(secret) // 2, (prefix, secret)
    tables = psql(a.store_url, "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
    assert {"api_keys", "tenants", "ledger"} <= set(tables), tables
    for table in tables:
        rows = psql(a.store_url, f"SELECT t::text FROM {table} t")
        assert rows or table != "api_keys"
        leaked = [r for r in rows if secret in r or secret.lower() in r.lower()]
        assert not leaked, f"the secret is stored in {table}: {leaked}"
    for gw in (a, b):
        assert secret not in gw.process.log_path.read_text(errors="replace"), f"{gw.name}'s log has the secret"


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


# ---------------------------------------------------------------------------------------------
# The database down at shutdown: bounded retry, spill file, import.

COLIBRI = (Decimal("0.20"), Decimal("0.05"), Decimal("0.80"))  # harness.model_block's prices
SPILL_TIMEOUT_S = 3


def pg_server(action: str) -> None:
    """Stops (`pause`) or restarts (`resume`) the test server, keeping its data and port."""
    pg_dir = os.environ.get("QUIPU_TEST_PG_DIR")
    assert pg_dir, "QUIPU_TEST_PG_DIR is not set: start the server with scripts/pg-test.sh"
    subprocess.run([str(ROOT / "scripts" / "pg-test.sh"), action, pg_dir], check=True, capture_output=True)


def colibri_charge(rec: dict) -> Decimal:
    i, c, o = COLIBRI
    cached = rec["cached_tokens"]
    return ((rec["prompt_tokens"] - cached) * i + cached * c + rec["completion_tokens"] * o) / Decimal(1_000_000)


def test_a_shutdown_with_the_database_down_spills_and_the_import_restores_every_charge(workdir, pg_url):
    sim = Sim(workdir, name="sim-pg-spill").start()
    gw = Gateway(workdir, {"colibri": [sim.api_base]}, store_url=pg_url, name="quipu-pg-spill")
    spill_dir = workdir / "pg-spill"
    gw.config_text = gw.config_text.replace(
        "key_refresh_ms = 200",
        f'key_refresh_ms = 200\nshutdown_flush_timeout_s = {SPILL_TIMEOUT_S}\nspill_dir = "{spill_dir}"',
    )
    assert "shutdown_flush_timeout_s" in gw.config_text
    gw.config_path.write_text(gw.config_text)
    gw.start()
    top_up = Decimal("100.00")
    _, key = gw.new_tenant("spill", top_up=str(top_up))
    since = sim.stats()["seq"]

    def ask(i: int) -> str:
        status, body, hdrs = http_json(
            "POST", gw.base + "/v1/chat/completions",
            {"model": "colibri", "messages": [{"role": "user", "content": f"pregunta {i} [[sim: tokens={5 + i}]]"}]},
            {"Authorization": f"Bearer {key}"}, timeout=30,
        )
        assert status == 200, body
        return hdrs["x-request-id"]

    # Stored while the database is up; the replica now holds a lease to admit the rest against.
    stored = ask(0)
    tenant_rows = "SELECT entry_id, delta FROM ledger WHERE kind = 'request' AND tenant_id = " \
        "(SELECT id FROM tenants WHERE name = 'spill') ORDER BY entry_id"
    deadline = time.time() + 10
    while not psql(pg_url, tenant_rows):
        assert time.time() < deadline, "the first row never reached the ledger"
        time.sleep(0.05)

    pg_server("pause")
    try:
        answered = [ask(i) for i in range(1, 9)]
        # The writer has tried to store their rows, failed, and is retrying.
        wait_until(lambda: gw.metric_value("quipu_ledger_flush_seconds_count", result="error") >= 1
                   and gw.metric_value("quipu_ledger_queue_rows") >= len(answered), 10,
                   "the ledger writer failing on the answered requests' rows")
        signalled = time.time()
        gw.process.send_signal(signal.SIGTERM)
        try:
            code = gw.process.proc.wait(SPILL_TIMEOUT_S + 20)
        except subprocess.TimeoutExpired:
            gw.process.proc.kill()
            pytest.fail(f"SIGTERM with the database down did not end the gateway:\n{gw.process.tail()}")
        took = time.time() - signalled
    finally:
        pg_server("resume")
    log = gw.process.log_path.read_text(errors="replace")
    gw.process.log.close()
    assert code == 0, log[-3000:]
    # It kept retrying for the timeout, and then did not hang on the database.
    assert SPILL_TIMEOUT_S * 0.9 <= took <= SPILL_TIMEOUT_S + 10, took

    files = sorted(spill_dir.glob("ledger-spill-*.jsonl"))
    assert len(files) == 1, sorted(spill_dir.iterdir())
    spill = files[0]
    assert not list(spill_dir.glob(".*.tmp"))
    lines = [json.loads(line) for line in spill.read_text().splitlines()]
    assert sorted(line["request_id"] for line in lines) == sorted(answered), "exactly the answered requests"
    assert str(spill) in log and "quipu ledger import" in log and f"{len(answered)} ledger rows" in log

    # Every spilled row is exactly what the simulator metered, money as an integer string.
    recs = {r["request_id"]: r for r in sim.requests(since) if r["request_id"]}
    expected = {rid: colibri_charge(recs[rid]) for rid in [stored, *answered]}
    for line in lines:
        rec = recs[line["request_id"]]
        assert isinstance(line["charge_picos"], str)
        assert Decimal(int(line["charge_picos"])) / Decimal(10**12) == expected[line["request_id"]]
        assert (int(line["input_tokens"]), int(line["cached_tokens"]), int(line["output_tokens"])) == (
            rec["prompt_tokens"], rec["cached_tokens"], rec["completion_tokens"])
        assert (line["model"], line["format"], line["status"], line["http_status"]) == ("colibri", "chat", "ok", 200)

    # The database is back but has only the first row: the spilled charges are not applied yet.
    assert [r.split("|")[0] for r in psql(pg_url, tenant_rows)] == [stored]
    st = gw.cli("statement", "--tenant", "spill")
    assert Decimal(st["balance"]) == top_up - expected[stored]

    # A restarted gateway names the file it has not imported, leaves it alone, and exports the
    # count an alert watches; the import (run while it serves) brings the count back to 0.
    gw.start()
    restart_log = gw.process.log_path.read_text(errors="replace")[len(log):]
    assert "not imported" in restart_log and str(spill) in restart_log, restart_log[-2000:]
    assert spill.exists()
    assert gw.metric_value("quipu_ledger_spill_files", state="complete") == 1
    assert gw.metric_value("quipu_ledger_spill_files", state="incomplete") == 0

    report = gw.cli("ledger", "import", str(spill))
    wait_until(lambda: gw.metric_value("quipu_ledger_spill_files", state="complete") == 0,
               timeout=12, what="quipu_ledger_spill_files back to 0 after the import")
    assert gw.stop() == 0
    (f,) = report["files"]
    assert sorted(f["new"]) == sorted(answered) and f["duplicate"] == [] and f["rejected"] == []
    assert Decimal(f["charged"]) == sum(expected[rid] for rid in answered)
    assert not spill.exists() and pathlib.Path(f["renamed_to"]) == spill.with_name(spill.name + ".imported")
    st = gw.cli("statement", "--tenant", "spill")
    total = sum(expected.values())
    assert Decimal(st["totals"]["charges"]) == total
    assert Decimal(st["balance"]) == top_up - total
    assert st["totals"]["requests"] == len(answered) + 1
    rows = {r.split("|")[0]: int(r.split("|")[1]) for r in psql(pg_url, tenant_rows.replace("entry_id, delta", "entry_id || '|' || delta"))}
    assert {rid: Decimal(-d) / Decimal(10**12) for rid, d in rows.items()} == expected
    # The stopped replica's lease (5.00, the lease chunk) still held the money those requests
    # spent, and drops by it as the live path would have; unless it was reclaimed as stale.
    (t,) = [t for t in gw.cli("tenant", "list")["tenants"] if t["name"] == "spill"]
    assert Decimal(t["leased"]) in (Decimal("5.00") - total, 0), t

    again = gw.cli("ledger", "import", f["renamed_to"])
    assert again["totals"]["new"] == 0 and again["totals"]["duplicate"] == len(answered)
    assert Decimal(again["totals"]["charged"]) == 0
    assert gw.cli("statement", "--tenant", "spill")["balance"] == st["balance"]
    sim.stop()


def test_a_store_outage_stops_admission_at_max_unstored_rows_and_loses_nothing(workdir, pg_url):
    """With the database down, rows queue in memory; at `store.max_unstored_rows` the gateway
    refuses new billable requests (overloaded, with retry-after) instead of holding ever more
    money no ledger has. When the database is back, the queue is written and requests are
    admitted again; every answered request has its row."""
    sim = Sim(workdir, name="sim-pg-backlog").start()
    gw = Gateway(workdir, {"colibri": [sim.api_base]}, store_url=pg_url, name="quipu-pg-backlog")
    gw.config_text = gw.config_text.replace(
        "key_refresh_ms = 200", "key_refresh_ms = 200\nledger_batch_rows = 1\nmax_unstored_rows = 3")
    assert "max_unstored_rows = 3" in gw.config_text
    gw.config_path.write_text(gw.config_text)
    gw.start()
    _, key = gw.new_tenant("backlog", top_up="100.00")
    try:
        def ask(i: int, fmt: str = "chat"):
            if fmt == "chat":
                return http_json("POST", gw.base + "/v1/chat/completions",
                                 {"model": "colibri", "messages": [{"role": "user", "content": f"b{i} [[sim: tokens=3]]"}]},
                                 {"Authorization": f"Bearer {key}"}, timeout=30)
            return http_json("POST", gw.base + "/v1/messages",
                             {"model": "colibri", "max_tokens": 20, "messages": [{"role": "user", "content": f"b{i} [[sim: tokens=3]]"}]},
                             {"x-api-key": key, "anthropic-version": "2023-06-01"}, timeout=30)

        rows = "SELECT entry_id FROM ledger WHERE kind = 'request' AND tenant_id = " \
            "(SELECT id FROM tenants WHERE name = 'backlog')"
        status, _, hdrs = ask(0)  # takes a lease while the database is up
        assert status == 200
        answered = [hdrs["x-request-id"]]
        # Its row is written before the outage, so the outage starts with nothing owed.
        wait_until(lambda: answered[0] in psql(pg_url, rows), timeout=10,
                   what="the first request's ledger row")
        pg_server("pause")
        try:
            refused = None
            for i in range(1, 40):
                status, body, hdrs = ask(i)
                if status == 200:
                    answered.append(hdrs["x-request-id"])
                    continue
                refused = (status, body, hdrs)
                break
            assert refused, f"{len(answered)} requests admitted with the store down and a cap of 3 rows"
            status, body, hdrs = refused
            assert status == 503 and body["error"]["code"] == "upstream_unavailable", body
            assert "cannot record charges" in body["error"]["message"] and hdrs.get("retry-after") == "5"
            # Exactly the cap: 3 rows owed, then nothing more is admitted.
            assert len(answered) == 1 + 3, answered
            status, body, _ = ask(99, "messages")
            assert status == 529 and body["error"]["type"] == "overloaded_error", body
            # The gauge follows on the writer's next retry.
            wait_until(lambda: gw.metric_value("quipu_ledger_queue_rows") >= 3, timeout=10,
                       what="quipu_ledger_queue_rows showing the backlog")
        finally:
            pg_server("resume")
        deadline = time.time() + 20
        while ask(100)[0] != 200:
            assert time.time() < deadline, "admission did not resume once the store was back"
            time.sleep(0.2)
        deadline = time.time() + 10
        while not set(answered) <= set(psql(pg_url, rows)):
            assert time.time() < deadline, "rows queued during the outage never reached the ledger"
            time.sleep(0.1)
        assert gw.stop() == 0
    finally:
        gw.stop()
        sim.stop()
