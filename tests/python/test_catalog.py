"""The public read endpoints: their documented shapes (docs/formats.md), configured values, no key needed."""

from decimal import Decimal

import openai
import pytest

from harness import http_json


def test_models_spec_shape(gw):
    status, body, headers = http_json("GET", gw.base + "/v1/models")
    assert status == 200
    assert headers.get("x-request-id", "").startswith("req_")
    models = body["models"]
    assert [m["slug"] for m in models] == ["colibri", "aguila", "apu"]
    for m in models:
        assert set(m) == {"slug", "displayName", "description", "vision", "inPlans", "inFree"}
    assert models[0]["displayName"] == "Colibrí"
    assert models[0]["vision"] is False and models[1]["vision"] is True
    assert models[0]["inFree"] is True and models[2]["inFree"] is False


@pytest.mark.smoke
def test_models_sdk_list_shape(gw):
    _, body, _ = http_json("GET", gw.base + "/v1/models")
    assert body["object"] == "list"
    assert body["has_more"] is False
    assert body["first_id"] == "colibri" and body["last_id"] == "apu"
    for d in body["data"]:
        assert d["object"] == "model" and d["type"] == "model"
        assert isinstance(d["created"], int) and d["created_at"].endswith("Z")
    client = openai.OpenAI(base_url=gw.base + "/v1", api_key="unused")
    assert [m.id for m in client.models.list()] == ["colibri", "aguila", "apu"]
    assert client.models.retrieve("apu").id == "apu"


@pytest.mark.smoke
def test_pricing_values_are_the_configured_decimals(gw):
    status, body, _ = http_json("GET", gw.base + "/v1/pricing")
    assert status == 200
    assert body["currency"] == "PEN"
    assert body["minTopUpPEN"] == 10
    rates = body["perMillionTokens"]
    assert set(rates) == {"colibri", "aguila", "apu"}
    assert rates["colibri"] == {
        "inputPerMillionPEN": 0.2,
        "cachePerMillionPEN": 0.05,
        "outputPerMillionPEN": 0.8,
    }
    # Numbers are written from the exact decimals, not through a float.
    _, raw, _ = http_json("GET", gw.base + "/v1/pricing", headers={"Accept": "application/json"})
    assert Decimal(str(raw["perMillionTokens"]["apu"]["cachePerMillionPEN"])) == Decimal("0.75")


def test_plans_shape(gw):
    status, body, _ = http_json("GET", gw.base + "/v1/plans")
    assert status == 200
    assert [p["id"] for p in body["plans"]] == ["gratis", "pro"]
    pro = body["plans"][1]
    assert set(pro) == {"id", "displayName", "pricePEN", "usageLabel", "webSearch"}
    assert pro["pricePEN"] == 59.9 and pro["webSearch"] is True


def test_unknown_routes_and_methods(gw):
    status, body, _ = http_json("GET", gw.base + "/v2/nothing")
    assert status == 404 and body["error"]["type"] == "invalid_request_error"
    status, body, _ = http_json("GET", gw.base + "/v1/messages")
    assert status == 405 and body["type"] == "error"
    status, body, _ = http_json("GET", gw.base + "/v1/models/gpt-9")
    assert status == 404
