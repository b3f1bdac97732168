"""Tenant self-service on `/v1/keys`: a key with the `manage` scope creates, limits, rotates and
revokes its tenant's keys, never beyond its own limits or the operator's, never another
tenant's keys, and never tops up.

Each refusal is tried for real against a running gateway and checked for its status, its error
type and code (the chat shape, like every account route) and a message that names the limit.
"""

from __future__ import annotations

import itertools
import sqlite3
from decimal import Decimal

import pytest

from harness import Gateway, http_json, wait_until

_names = itertools.count(1)
PICO = Decimal(10) ** -12


def call(gw: Gateway, method: str, path: str, secret: str, body=None):
    return http_json(method, gw.base + path, body, {"Authorization": f"Bearer {secret}"})


def chat(gw: Gateway, secret: str, model: str = "colibri"):
    status, body, _ = call(
        gw, "POST", "/v1/chat/completions", secret,
        {"model": model, "messages": [{"role": "user", "content": "hola [[sim: tokens=7]]"}]},
    )
    return status, body


def refused(resp, status: int, type_: str, code: str, needle: str) -> None:
    got, body, _ = resp
    assert got == status, body
    err = body["error"]
    assert (err["type"], err["code"]) == (type_, code), err
    assert needle in err["message"], err


def key_of(gw: Gateway, secret: str, key_id: str) -> dict:
    status, body, _ = call(gw, "GET", "/v1/keys?limit=100", secret)
    assert status == 200, body
    return next(k for k in body["data"] if k["id"] == key_id)


def charges_of(gw: Gateway, key_id: str) -> Decimal:
    con = sqlite3.connect(f"file:{gw.store_url.removeprefix('sqlite://')}?mode=ro", uri=True)
    (s,) = con.execute(
        "SELECT COALESCE(SUM(-delta), 0) FROM ledger WHERE key_id = ? AND kind = 'request'", (key_id,)
    ).fetchone()
    con.close()
    return Decimal(s) * PICO


@pytest.fixture
def acme(gw):
    """A tenant with a S/ 100.00 monthly cap and three keys: a managing key limited to colibri
    and aguila with S/ 5.00 a day, a managing key without limits, a plain key; and another
    tenant with one key."""
    name = f"self{next(_names)}"
    plain, plain_secret = gw.new_tenant(name)
    gw.cli("tenant", "update", name, "--monthly-cap", "100.00")
    manager = gw.cli("key", "create", "--tenant", name, "--manage", "--models", "colibri,aguila",
                     "--budget", "5.00", "--budget-period", "day")
    free = gw.cli("key", "create", "--tenant", name, "--manage")
    other, other_secret = gw.new_tenant(f"other{next(_names)}")
    for k in (manager, free):
        gw.wait_key(k["secret"])
    return {
        "name": name,
        "manager": manager["secret"],
        "manager_id": manager["key_id"],
        "free": free["secret"],
        "plain": plain_secret,
        "plain_id": plain["key_id"],
        "other_id": other["key_id"],
        "other": other_secret,
    }


@pytest.mark.smoke
def test_a_manage_key_creates_limits_rotates_and_revokes_a_key(gw, acme):
    m = acme["manager"]
    status, made, _ = call(gw, "POST", "/v1/keys", m, {
        "label": "ci", "models": ["colibri"], "budget": {"amount": "1.00", "period": "day"},
        "expires_at": "2099-01-01T00:00:00Z",
    })
    assert status == 200, made
    assert made["secret"].startswith("sk-qp-") and made["tenant"] == acme["name"]
    assert made["rules"]["models"] == ["colibri"] and made["rules"]["scopes"] == []
    assert made["rules"]["budget"] == {"amount": "1.00", "period": "day"}
    # The gateway serving the answer knows the key already: no refresh interval to wait.
    assert chat(gw, made["secret"])[0] == 200
    status, body = chat(gw, made["secret"], "aguila")
    assert status == 403 and "colibri" in body["error"]["message"], body

    # Its cap, what it spent this period and what is left, as the ledger has it.
    gw.ledger_barrier()
    spent = charges_of(gw, made["key_id"])
    assert spent > 0
    listed = key_of(gw, m, made["key_id"])
    cap = listed["cap"]
    assert (cap["period"], cap["amount"]["exact"]) == ("day", "1.00")
    assert Decimal(cap["spent"]["exact"]) == spent
    assert Decimal(cap["remaining"]["exact"]) == Decimal("1.00") - spent
    assert cap["resets_at"].endswith("05:00:00Z"), "a Lima day ends at 05:00 UTC"
    assert listed["rules"]["expires_at"] == "2099-01-01T00:00:00Z"
    # The secret is shown once: never in a listing.
    status, page, _ = call(gw, "GET", "/v1/keys?limit=100", m)
    assert made["secret"] not in str(page)

    # Limit it: a smaller cap, a new label; `null` clears the expiry.
    status, line, _ = call(gw, "PATCH", f"/v1/keys/{made['key_id']}", m, {
        "label": "ci-small", "budget": {"amount": "0.50", "period": "day"}, "expires_at": None,
    })
    assert status == 200, line
    assert line["label"] == "ci-small" and line["rules"]["budget"]["amount"] == "0.50"
    assert line["rules"]["expires_at"] is None
    assert key_of(gw, m, made["key_id"])["cap"]["amount"]["exact"] == "0.50"

    # Rotate: a new secret with the same settings; the old one works through its grace.
    status, rotated, _ = call(gw, "POST", f"/v1/keys/{made['key_id']}/rotate", m, {"grace": "24h"})
    assert status == 200, rotated
    assert rotated["replaces"]["key_id"] == made["key_id"]
    assert rotated["rules"] == line["rules"] and rotated["secret"] != made["secret"]
    assert chat(gw, rotated["secret"])[0] == 200
    assert chat(gw, made["secret"])[0] == 200, "the old secret works during the grace"

    # Revoke both: each secret is refused from then on.
    for key_id, secret in ((rotated["key_id"], rotated["secret"]), (made["key_id"], made["secret"])):
        status, gone, _ = call(gw, "DELETE", f"/v1/keys/{key_id}", m)
        assert status == 200 and gone == {"key_id": key_id, "revoked_now": True}, gone
        wait_until(lambda s=secret: chat(gw, s)[0] == 401, 5, "the revoked key to be refused")
        status, body = chat(gw, secret)
        assert body["error"]["type"] == "authentication_error"
        assert key_of(gw, m, key_id)["revoked"] is True
    # Revoked is gone: a second DELETE is not found.
    refused(call(gw, "DELETE", f"/v1/keys/{made['key_id']}", m),
            404, "not_found_error", "key_not_found", "no active key")


def test_a_key_without_the_manage_scope_writes_nothing(gw, acme):
    p = acme["plain"]
    for method, path, body in [
        ("POST", "/v1/keys", {"label": "x"}),
        ("PATCH", f"/v1/keys/{acme['plain_id']}", {"label": "x"}),
        ("DELETE", f"/v1/keys/{acme['plain_id']}", None),
        ("POST", f"/v1/keys/{acme['plain_id']}/rotate", {}),
    ]:
        refused(call(gw, method, path, p, body), 403, "permission_error", "insufficient_permissions",
                "manage scope")
    assert chat(gw, p)[0] == 200, "the plain key is untouched"
    assert key_of(gw, p, acme["plain_id"])["label"] == ""


def test_another_tenants_keys_are_not_found(gw, acme):
    for secret in (acme["manager"], acme["free"]):
        for method, path, body in [
            ("PATCH", f"/v1/keys/{acme['other_id']}", {"disabled": True}),
            ("DELETE", f"/v1/keys/{acme['other_id']}", None),
            ("POST", f"/v1/keys/{acme['other_id']}/rotate", {"grace": "1h"}),
            ("PATCH", "/v1/keys/key_000000000000", {"label": "x"}),
        ]:
            # The same answer as an id that does not exist: nothing says the key is there.
            key_id = path.split("/")[3]
            refused(call(gw, method, path, secret, body), 404, "not_found_error", "key_not_found",
                    f'no active key with id "{key_id}" in your account')
    assert chat(gw, acme["other"])[0] == 200, "the other tenant's key still works"


def test_nothing_beyond_the_managing_key_or_the_operator(gw, acme):
    m, free = acme["manager"], acme["free"]
    colibri_day = {"models": ["colibri"], "budget": {"amount": "1.00", "period": "day"}}
    beyond = [
        # Beyond the managing key's own cap (S/ 5.00 a day).
        (m, {"models": ["colibri"], "budget": {"amount": "5.01", "period": "day"}},
         "could spend more than the managing key's cap (S/ 5.00 daily)"),
        (m, {"models": ["colibri"], "budget": {"amount": "20.00", "period": "week"}},
         "the managing key's cap"),
        (m, {"models": ["colibri"]}, "give the key a budget within it"),
        # Beyond its models.
        (m, {"models": ["apu"], "budget": {"amount": "1.00", "period": "day"}},
         "the managing key may use only colibri, aguila; not apu"),
        (m, {"budget": {"amount": "1.00", "period": "day"}}, "give the new key a model list"),
        # Beyond the tenant's monthly cap (S/ 100.00), for a managing key without a cap.
        (free, {"budget": {"amount": "100.01", "period": "month"}}, "your account's monthly cap"),
        (free, {"budget": {"amount": "3.50", "period": "day"}}, "your account's monthly cap"),
        (free, {"budget": {"amount": "1000.00", "period": "total"}}, "your account's monthly cap"),
        (free, {"label": "no cap"}, "your account's monthly cap is S/ 100.00 monthly"),
        # The manage scope is the operator's to give.
        (m, {**colibri_day, "manage": True}, "only the operator can give a key the manage scope"),
        (free, {"budget": {"amount": "1.00", "period": "day"}, "manage": True}, "manage scope"),
    ]
    for secret, body, needle in beyond:
        refused(call(gw, "POST", "/v1/keys", secret, body), 403, "permission_error",
                "insufficient_permissions", needle)

    # Within both: made. Then raising its cap past either is refused, and it keeps its cap.
    status, k, _ = call(gw, "POST", "/v1/keys", free, {"budget": {"amount": "3.00", "period": "day"}})
    assert status == 200, k
    refused(call(gw, "PATCH", f"/v1/keys/{k['key_id']}", free,
                 {"budget": {"amount": "150.00", "period": "month"}}),
            403, "permission_error", "insufficient_permissions", "your account's monthly cap")
    refused(call(gw, "PATCH", f"/v1/keys/{k['key_id']}", free, {"budget": None}),
            403, "permission_error", "insufficient_permissions", "your account's monthly cap")
    status, k2, _ = call(gw, "POST", "/v1/keys", m, colibri_day)
    assert status == 200, k2
    refused(call(gw, "PATCH", f"/v1/keys/{k2['key_id']}", m, {"budget": {"amount": "6.00", "period": "day"}}),
            403, "permission_error", "insufficient_permissions", "the managing key's cap")
    refused(call(gw, "PATCH", f"/v1/keys/{k2['key_id']}", m, {"models": ["colibri", "apu"]}),
            403, "permission_error", "insufficient_permissions", "not apu")
    assert key_of(gw, m, k2["key_id"])["rules"]["budget"]["amount"] == "1.00"
    assert key_of(gw, m, k["key_id"])["rules"]["budget"]["amount"] == "3.00"

    # Keys with the manage scope are the operator's, the caller itself included.
    for target in (acme["manager_id"],):
        for secret in (m, free):
            refused(call(gw, "DELETE", f"/v1/keys/{target}", secret), 403, "permission_error",
                    "insufficient_permissions", "only the operator")
    assert chat(gw, m)[0] == 200

    # Bad settings are a 400 naming them.
    status, body, _ = call(gw, "POST", "/v1/keys", free, {"tenant": "other"})
    assert status == 400 and "tenant" in body["error"]["message"], body
    status, body, _ = call(gw, "POST", f"/v1/keys/{k['key_id']}/rotate", free, {"grace": "soon"})
    assert status == 400 and "grace" in body["error"]["message"], body


def test_no_key_tops_up(gw, acme):
    for secret in (acme["manager"], acme["free"], acme["plain"]):
        refused(call(gw, "POST", "/v1/topups", secret, {"amount": "50.00"}),
                405, "invalid_request_error", "method_not_allowed",
                "top-ups are made by the operator")
    status, ups, _ = call(gw, "GET", "/v1/topups", acme["manager"])
    assert status == 200 and len(ups["data"]) == 1, "only the operator's top-up"
