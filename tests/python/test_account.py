"""The account routes, as a tenant uses them with its own key: `GET /v1/account`, `/v1/usage`,
`/v1/keys`, `/v1/requests`, `/v1/topups`, and their `/admin/tenants/{name}/…` twins.

Every figure is checked against the ledger itself (the SQLite file the gateway writes, read
with Python's sqlite3), two tenants side by side must never see each other, bad and revoked
keys get 401, every bound is enforced, and pages join up to the whole listing.
"""

from __future__ import annotations

import itertools
import sqlite3
import threading
import time
from decimal import Decimal

import pytest

from harness import ADMIN_TOKEN, Gateway, http_json, wait_until

_names = itertools.count(1)
PICO = Decimal(10) ** -12


def picos(p: int) -> Decimal:
    return Decimal(p) * PICO


def get(gw: Gateway, path: str, secret: str | None = None, **headers):
    h = dict(headers)
    if secret is not None:
        h.setdefault("Authorization", f"Bearer {secret}")
    return http_json("GET", gw.base + path, headers=h)


def ok(gw: Gateway, path: str, secret: str) -> dict:
    status, body, _ = get(gw, path, secret)
    assert status == 200, (path, status, body)
    return body


def chat(gw: Gateway, secret: str, text: str = "hola [[sim: tokens=7]]", model: str = "colibri") -> str:
    status, body, hdrs = http_json(
        "POST",
        gw.base + "/v1/chat/completions",
        {"model": model, "messages": [{"role": "user", "content": text}]},
        {"Authorization": f"Bearer {secret}"},
    )
    assert status == 200, body
    return hdrs["x-request-id"]


def db(gw: Gateway) -> sqlite3.Connection:
    con = sqlite3.connect(f"file:{gw.store_url.removeprefix('sqlite://')}?mode=ro", uri=True)
    con.row_factory = sqlite3.Row
    return con


def ledger(gw: Gateway, tenant: str) -> list[dict]:
    con = db(gw)
    rows = [
        dict(r)
        for r in con.execute(
            "SELECT l.* FROM ledger l JOIN tenants t ON t.id = l.tenant_id "
            "WHERE t.name = ? AND l.kind = 'request' ORDER BY l.at DESC, l.entry_id DESC",
            (tenant,),
        )
    ]
    con.close()
    return rows


def balance(gw: Gateway, tenant: str) -> Decimal:
    con = db(gw)
    (b,) = con.execute("SELECT balance FROM tenants WHERE name = ?", (tenant,)).fetchone()
    con.close()
    return picos(int(b))


def wait_rows(gw: Gateway, tenant: str, n: int) -> list[dict]:
    wait_until(lambda: len(ledger(gw, tenant)) >= n, 10, f"{n} ledger rows of {tenant}")
    return ledger(gw, tenant)


def totals(rows: list[dict]) -> dict:
    return {
        "requests": len(rows),
        "input_tokens": sum(r["input_tokens"] for r in rows),
        "cached_tokens": sum(r["cached_tokens"] for r in rows),
        "output_tokens": sum(r["output_tokens"] for r in rows),
        "charge": sum((picos(-r["delta"]) for r in rows), Decimal(0)),
    }


def usage_totals(u: dict) -> dict:
    return {
        "requests": u["requests"],
        "input_tokens": u["input_tokens"],
        "cached_tokens": u["cached_tokens"],
        "output_tokens": u["output_tokens"],
        "charge": Decimal(u["charge"]["exact"]),
    }


def money_ok(m: dict) -> Decimal:
    """An amount object: exact decimal and `S/ 1,234.56`, which is the exact one rounded."""
    exact = Decimal(m["exact"])
    shown = exact.quantize(Decimal("0.01"), rounding="ROUND_HALF_UP")
    sign = "-" if shown < 0 else ""
    assert m["display"] == f"{sign}S/ {abs(shown):,.2f}", m
    return exact


@pytest.fixture
def two(gw):
    """Two fresh tenants with a key each and a few requests each: [(name, secret, ids)]."""
    out = []
    for top in ("150.00", "80.00"):
        name = f"acct{next(_names)}"
        _, secret = gw.new_tenant(name, top_up=top)
        ids = [chat(gw, secret, f"q{i} [[sim: tokens={3 + i}]]", model) for i, model in
               enumerate(["colibri", "aguila", "apu", "colibri"])]
        out.append((name, secret, ids))
    for name, _, ids in out:
        wait_rows(gw, name, len(ids))
    return out


@pytest.mark.smoke
def test_each_tenant_sees_its_own_money_and_only_its_own(gw, two):
    for (name, secret, ids), (other, _, other_ids) in [(two[0], two[1]), (two[1], two[0])]:
        rows = ledger(gw, name)
        a = ok(gw, "/v1/account", secret)
        assert a["object"] == "account" and a["tenant"]["name"] == name
        assert money_ok(a["balance"]) == balance(gw, name)
        assert a["requests_in_flight"] == 0 and Decimal(a["reserved"]["exact"]) == 0
        t = totals(rows)
        assert money_ok(a["spend"]["total"]) == t["charge"]
        assert money_ok(a["spend"]["today"]) == t["charge"]
        assert a["usage"]["requests"] == 4
        assert a["key"]["prefix"].startswith("sk-qp-") and secret.startswith(a["key"]["prefix"])
        assert a["key"]["usage"]["requests"] == 4
        assert a["key"]["last_used_at"] is not None

        reqs = ok(gw, "/v1/requests", secret)
        assert [r["id"] for r in reqs["data"]] == [r["entry_id"] for r in rows]
        assert set(r["id"] for r in reqs["data"]) == set(ids)
        assert not set(other_ids) & {r["id"] for r in reqs["data"]}
        for got, want in zip(reqs["data"], rows):
            assert Decimal(got["charge"]["exact"]) == picos(-want["delta"])
            assert (got["input_tokens"], got["cached_tokens"], got["output_tokens"]) == (
                want["input_tokens"], want["cached_tokens"], want["output_tokens"])
            assert got["model"] == want["model"] and got["key"] == want["key_id"]

        u = ok(gw, "/v1/usage", secret)
        assert usage_totals(u["totals"]) == t
        assert sum(Decimal(d["charge"]["exact"]) for d in u["data"]) == t["charge"]
        by_model = ok(gw, "/v1/usage?group_by=model", secret)
        assert {d["model"]: d["requests"] for d in by_model["data"]} == {"colibri": 2, "aguila": 1, "apu": 1}
        for d in by_model["data"]:
            assert usage_totals(d) == totals([r for r in rows if r["model"] == d["model"]])
        by_key = ok(gw, "/v1/usage?group_by=key", secret)
        assert [d["key"] for d in by_key["data"]] == [a["key"]["id"]]

        keys = ok(gw, "/v1/keys", secret)
        assert [k["id"] for k in keys["data"]] == [a["key"]["id"]]
        assert Decimal(keys["data"][0]["usage"]["charge"]["exact"]) == t["charge"]
        ups = ok(gw, "/v1/topups", secret)
        assert len(ups["data"]) == 1
        # The other tenant's admin view is not this one.
        assert other != name


@pytest.mark.smoke
def test_bad_revoked_and_missing_keys_are_refused(gw):
    name = f"acct{next(_names)}"
    key, secret = gw.new_tenant(name)
    _, second = gw.new_tenant(f"acct{next(_names)}")  # noqa: F841 - another tenant exists
    paths = ["/v1/account", "/v1/usage", "/v1/keys", "/v1/requests", "/v1/topups"]
    for path in paths:
        for headers in [{}, {"Authorization": "Bearer sk-qp-nope"}, {"Authorization": "Basic abc"},
                        {"x-api-key": "sk-qp-nope"}]:
            status, body, hdrs = http_json("GET", gw.base + path, headers=headers)
            assert status == 401, (path, headers, body)
            assert body["error"]["type"] == "authentication_error", body
            assert body["error"]["code"] == "invalid_api_key"
            assert "x-request-id" in {k.lower() for k in hdrs}
        # x-api-key works as on the API.
        status, body, _ = http_json("GET", gw.base + path, headers={"x-api-key": secret})
        assert status == 200, (path, body)
    gw.cli("key", "revoke", key["key_id"])
    wait_until(lambda: get(gw, "/v1/account", secret)[0] == 401, 5, "the revocation to apply")
    for path in paths:
        status, body, _ = get(gw, path, secret)
        assert status == 401 and body["error"]["message"] == "invalid or revoked API key", (path, body)


def test_bounds_are_enforced_in_the_chat_error_shape(gw, tenant):
    _, secret = tenant
    bad = {
        "/v1/usage?from=2026-11-02&to=2026-11-01": "from",
        "/v1/usage?from=2025-01-01&to=2026-01-03": "to",
        "/v1/usage?from=yesterday": "from",
        "/v1/usage?group_by=week": "group_by",
        "/v1/usage?groupby=day": "groupby",
        "/v1/usage?limit=0": "limit",
        "/v1/usage?limit=1001": "limit",
        "/v1/usage?utc_offset=%2B05:30": "utc_offset",
        "/v1/usage?cursor=bm9wZQ": "cursor",
        "/v1/requests?limit=abc": "limit",
        "/v1/keys?from=2026-01-01": "from",
        "/v1/account?x=1": "x",
    }
    for path, param in bad.items():
        status, body, _ = get(gw, path, secret)
        assert status == 400, (path, body)
        assert body["error"]["type"] == "invalid_request_error", body
        assert body["error"]["param"] == param, (path, body)
    # A full leap-free year plus a day is the most one query covers.
    status, body, _ = get(gw, "/v1/usage?from=2025-01-01&to=2026-01-01", secret)
    assert status == 200 and len(body["data"]) == 100 and body["has_more"], body
    # Read-only routes: no other method.
    status, body, _ = http_json("POST", gw.base + "/v1/usage", {}, {"Authorization": f"Bearer {secret}"})
    assert status == 405, body
    # A cursor only continues its own query.
    first = ok(gw, "/v1/usage?from=2026-01-01&to=2026-03-01&limit=10", secret)
    c = first["next_cursor"]
    status, body, _ = get(gw, f"/v1/usage?from=2026-01-02&to=2026-03-01&limit=10&cursor={c}", secret)
    assert status == 400 and body["error"]["param"] == "cursor", body
    status, body, _ = get(gw, f"/v1/requests?cursor={c}", secret)
    assert status == 400 and body["error"]["param"] == "cursor", body


def test_pages_join_up_to_the_whole_listing(gw):
    name = f"acct{next(_names)}"
    _, secret = gw.new_tenant(name)
    extra = [gw.cli("key", "create", "--tenant", name, "--label", f"k{i}") for i in range(2)]
    for k in extra:
        gw.wait_key(k["secret"])
    ids = [chat(gw, s, f"p{i} [[sim: tokens=2]]") for i, s in enumerate([secret] * 5 + [extra[0]["secret"]])]
    rows = wait_rows(gw, name, len(ids))
    for top in ("10.00", "11.00", "12.00"):
        gw.cli("topup", "--tenant", name, "--amount", top)

    def walk(path: str, limit: int) -> list[dict]:
        items, cursor, pages = [], None, 0
        while True:
            sep = "&" if "?" in path else "?"
            page = ok(gw, f"{path}{sep}limit={limit}" + (f"&cursor={cursor}" if cursor else ""), secret)
            assert len(page["data"]) <= limit
            items += page["data"]
            pages += 1
            if not page["has_more"]:
                assert page["next_cursor"] is None
                return items
            cursor = page["next_cursor"]
            assert pages < 50

    reqs = walk("/v1/requests", 2)
    assert [r["id"] for r in reqs] == [r["entry_id"] for r in rows]
    assert set(ids) == {r["id"] for r in reqs}
    keys = walk("/v1/keys", 2)
    assert len(keys) == 3 and len({k["id"] for k in keys}) == 3
    by_key = {k["id"]: k["usage"]["requests"] for k in keys}
    assert sorted(by_key.values()) == [0, 1, 5]
    ups = walk("/v1/topups", 2)
    assert [Decimal(u["amount"]["exact"]) for u in ups] == [Decimal("12"), Decimal("11"), Decimal("10"), Decimal("1000")]
    days = walk("/v1/usage?group_by=day", 7)
    assert len(days) == 30 and len({d["day"] for d in days}) == 30
    assert sum(d["requests"] for d in days) == 6
    assert sum(Decimal(d["charge"]["exact"]) for d in days) == totals(rows)["charge"]
    models = walk("/v1/usage?group_by=key", 1)
    assert sum(m["requests"] for m in models) == 6


def test_reserved_shows_a_request_in_flight(gw, tenant):
    name, secret = tenant
    done = threading.Event()

    def slow():
        chat(gw, secret, "espera [[sim: tokens=3 body_ms=2500]]")
        done.set()

    t = threading.Thread(target=slow)
    t.start()
    try:
        def held():
            a = ok(gw, "/v1/account", secret)
            return a["requests_in_flight"] == 1 and Decimal(a["reserved"]["exact"]) > 0 and (
                Decimal(a["available"]["exact"])
                == Decimal(a["balance"]["exact"]) - Decimal(a["reserved"]["exact"]) - Decimal(a["pending"]["exact"]))

        wait_until(held, 2.0, "the request in flight to show as reserved")
    finally:
        t.join(10)
    assert done.is_set()
    wait_until(lambda: ok(gw, "/v1/account", secret)["requests_in_flight"] == 0, 5, "the request to end")
    rows = wait_rows(gw, name, 1)
    a = ok(gw, "/v1/account", secret)
    assert Decimal(a["reserved"]["exact"]) == 0
    assert money_ok(a["balance"]) == balance(gw, name) == Decimal("1000") - totals(rows)["charge"]


def test_the_admin_api_answers_the_same_for_any_tenant(gw, two):
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    for name, secret, _ in two:
        for path in ["/usage?group_by=model", "/usage?from=2026-01-01&to=2026-01-31", "/requests?limit=3",
                     "/topups", "/keys"]:
            route, _, query = path.partition("?")
            mine = ok(gw, f"/v1{route}" + (f"?{query}" if query else ""), secret)
            status, theirs, _ = http_json("GET", f"{gw.admin}/admin/tenants/{name}{path}", headers=admin)
            assert status == 200, theirs
            assert theirs == mine, path
        status, acct, _ = http_json("GET", f"{gw.admin}/admin/tenants/{name}/account", headers=admin)
        assert status == 200 and acct["tenant"]["name"] == name and acct["key"] is None
        assert Decimal(acct["balance"]["exact"]) == balance(gw, name)
    status, body, _ = http_json("GET", f"{gw.admin}/admin/tenants/nobody/usage", headers=admin)
    assert status == 404, body
    status, body, _ = http_json("GET", f"{gw.admin}/admin/tenants/{two[0][0]}/usage?limit=0", headers=admin)
    assert status == 400, body
    status, _, _ = http_json("GET", f"{gw.admin}/admin/tenants/{two[0][0]}/usage")
    assert status == 401


def test_the_page_is_served_from_the_binary_with_a_strict_policy(gw):
    for path, ctype in [("/account", "text/html"), ("/account/", "text/html"),
                        ("/account/app.js", "text/javascript"), ("/account/app.css", "text/css"),
                        ("/account/icon.svg", "image/svg+xml")]:
        status, body, hdrs = http_json("GET", gw.base + path)
        h = {k.lower(): v for k, v in hdrs.items()}
        assert status == 200, (path, body)
        assert h["content-type"].startswith(ctype), (path, h)
        assert "default-src 'self'" in h["content-security-policy"]
        assert "unsafe-inline" not in h["content-security-policy"]
        assert h["x-content-type-options"] == "nosniff"
    status, body, _ = http_json("GET", gw.base + "/account/missing.js")
    assert status == 404 and body["error"]["code"] == "not_found", body
    status, _, _ = http_json("POST", gw.base + "/account", {})
    assert status == 405
