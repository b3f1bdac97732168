"""The cost on every answer: `usage.cost` (soles, a JSON number) in the chat response and its
stream's usage chunk, the messages response and `message_delta`, and the Responses API's
response object (non-streaming, `response.completed`, `response.failed`) equals the charge of
the request's ledger row, read back from the tenant's `GET /v1/requests`; and the official
`openai` and `anthropic` SDKs read every answer unharmed, the extra field included (their
models keep unknown fields: an attribute, and in `model_extra`)."""

import itertools
import json
import re
from decimal import Decimal

import anthropic
import openai
import pytest

from harness import http_json, wait_until

_nonce = itertools.count(1)

# A prompt long enough that its second sending is served partly from the simulator's prefix
# cache (cached input tokens, billed at the cache rate).
LONG = "una pregunta larga para la caché de prefijos: " + "palabra " * 300


def prompt(text: str) -> str:
    """`text`, unique to this test run's request (no prefix shared by accident)."""
    return f"[{next(_nonce)}] {text}"


def oai(gw, key):
    return openai.OpenAI(base_url=gw.base + "/v1", api_key=key, max_retries=0)


def ant(gw, key):
    return anthropic.Anthropic(base_url=gw.base, api_key=key, max_retries=0)


def ledger_row(gw, key: str, request_id: str, timeout: float = 15.0) -> dict:
    """The request's row in the tenant's own `/v1/requests`, once it is there."""
    found: dict = {}

    def there():
        status, body, _ = http_json("GET", gw.base + "/v1/requests?limit=100", None,
                                    {"Authorization": f"Bearer {key}"})
        assert status == 200, body
        found.update(next((r for r in body["data"] if r["id"] == request_id), {}))
        return bool(found)

    wait_until(there, timeout, f"the ledger row of {request_id}")
    return found


def charge(gw, key: str, request_id: str) -> Decimal:
    return Decimal(ledger_row(gw, key, request_id)["charge"]["exact"])


def as_read(cost) -> Decimal:
    """What an SDK read (a float from the JSON number), as the decimal it was written as: every
    cost has at most 12 decimals and fewer than 15 significant digits, so the float's shortest
    repr is that decimal."""
    assert isinstance(cost, float | int) and not isinstance(cost, bool), cost
    return Decimal(repr(cost))


def exact(raw_json: str, *path: str) -> Decimal:
    """The cost as written in the body, read as an exact decimal (no float on the way)."""
    v = json.loads(raw_json, parse_float=Decimal)
    for p in path:
        v = v[p]
    assert isinstance(v, Decimal | int), v
    return Decimal(v)


def cached_twice(send):
    """Sends the long prompt twice (the second finds its prefix cached); returns both results."""
    text = prompt(LONG + "[[sim: tokens=9]]")
    return send(text), send(text)


# --- chat -------------------------------------------------------------------------------------

def chat_create(c, text, model="colibri"):
    r = c.chat.completions.with_raw_response.create(model=model, messages=[{"role": "user", "content": text}])
    return r.headers["x-request-id"], r.parse(), r.http_response.text


def test_chat_response(gw, tenant):
    _, key = tenant
    c = oai(gw, key)
    for tokens, model in [(5, "colibri"), (37, "aguila")]:
        rid, comp, raw = chat_create(c, prompt(f"hola [[sim: tokens={tokens}]]"), model)
        assert comp.choices[0].message.content and comp.usage.completion_tokens == tokens
        cost = comp.usage.cost
        assert comp.usage.model_extra["cost"] == cost and comp.usage.model_dump()["cost"] == cost
        row = ledger_row(gw, key, rid)
        assert Decimal(row["charge"]["exact"]) == as_read(cost) == exact(raw, "usage", "cost") > 0
        assert (row["input_tokens"], row["output_tokens"]) == (comp.usage.prompt_tokens, tokens)


def test_chat_response_with_a_cached_prefix(gw, tenant):
    _, key = tenant
    c = oai(gw, key)
    (rid1, first, _), (rid2, second, raw) = cached_twice(lambda t: chat_create(c, t))
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens > 0, second.usage
    assert charge(gw, key, rid1) == as_read(first.usage.cost)
    assert charge(gw, key, rid2) == as_read(second.usage.cost) == exact(raw, "usage", "cost")
    assert second.usage.cost < first.usage.cost, "cached input costs less"


def test_chat_stream_usage_chunk(gw, tenant):
    _, key = tenant
    c = oai(gw, key)
    for text in [prompt("hola [[sim: tokens=5]]"), prompt("hola [[sim: tokens=23 reasoning=4]]")]:
        r = c.chat.completions.with_raw_response.create(
            model="colibri", messages=[{"role": "user", "content": text}], stream=True,
            stream_options={"include_usage": True})
        chunks = list(r.parse())
        usage = chunks[-1].usage
        assert chunks[-1].choices == [] and usage is not None
        assert all(ch.usage is None for ch in chunks[:-1])
        assert charge(gw, key, r.headers["x-request-id"]) == as_read(usage.cost) > 0
    # The cached prefix, streamed.
    text = prompt(LONG + "[[sim: tokens=6]]")
    c.chat.completions.create(model="colibri", messages=[{"role": "user", "content": text}])
    r = c.chat.completions.with_raw_response.create(
        model="colibri", messages=[{"role": "user", "content": text}], stream=True,
        stream_options={"include_usage": True})
    usage = list(r.parse())[-1].usage
    assert usage.prompt_tokens_details.cached_tokens > 0
    assert charge(gw, key, r.headers["x-request-id"]) == as_read(usage.cost)


def test_chat_stream_without_usage_has_no_cost_to_show(gw, tenant):
    """A client that did not ask for the usage chunk gets no usage, so no cost; it is billed."""
    _, key = tenant
    r = oai(gw, key).chat.completions.with_raw_response.create(
        model="colibri", messages=[{"role": "user", "content": prompt("hola [[sim: tokens=4]]")}],
        stream=True)
    chunks = list(r.parse())
    assert chunks and all(ch.usage is None for ch in chunks)
    assert charge(gw, key, r.headers["x-request-id"]) > 0


# --- messages ---------------------------------------------------------------------------------

def message_create(c, text):
    r = c.messages.with_raw_response.create(
        model="claude-sonnet-4-5", max_tokens=1024, messages=[{"role": "user", "content": text}])
    return r.headers["request-id"], r.parse(), r.http_response.text


def test_messages_response(gw, tenant):
    _, key = tenant
    c = ant(gw, key)
    for tokens in (5, 31):
        rid, m, raw = message_create(c, prompt(f"Hola [[sim: tokens={tokens}]]"))
        assert m.content[0].text and m.usage.output_tokens == tokens
        assert m.id == f"msg_{rid}"
        cost = m.usage.cost
        assert m.usage.model_extra["cost"] == cost and m.usage.model_dump()["cost"] == cost
        row = ledger_row(gw, key, rid)
        assert Decimal(row["charge"]["exact"]) == as_read(cost) == exact(raw, "usage", "cost") > 0
        assert row["input_tokens"] == m.usage.input_tokens + m.usage.cache_read_input_tokens
    (rid1, first, _), (rid2, second, _) = cached_twice(lambda t: message_create(c, t))
    assert second.usage.cache_read_input_tokens > 0, second.usage
    assert charge(gw, key, rid1) == as_read(first.usage.cost)
    assert charge(gw, key, rid2) == as_read(second.usage.cost) < as_read(first.usage.cost)


def test_messages_stream_message_delta(gw, tenant):
    _, key = tenant
    c = ant(gw, key)
    text = prompt(LONG + "[[sim: tokens=12 reasoning=3]]")
    for cached in (False, True):
        with c.messages.stream(model="claude-sonnet-4-5", max_tokens=1024,
                               messages=[{"role": "user", "content": text}]) as s:
            events = list(s)
            final = s.get_final_message()
            rid = s.request_id
        start = next(e for e in events if e.type == "message_start")
        assert getattr(start.message.usage, "cost", None) is None, "message_start's usage is not final"
        delta = [e for e in events if e.type == "message_delta"]
        assert len(delta) == 1
        usage = delta[0].usage
        assert (usage.cache_read_input_tokens > 0) == cached, usage
        assert final.stop_reason == "end_turn" and final.usage.output_tokens == usage.output_tokens
        assert final.content[-1].text
        assert charge(gw, key, rid) == as_read(usage.cost) > 0


# --- Responses API ----------------------------------------------------------------------------

def request_id_of(response_id: str) -> str:
    """`resp_<hex>` answers `req_<hex>`."""
    assert response_id.startswith("resp_")
    return "req_" + response_id.removeprefix("resp_")


def test_responses_object(gw, tenant):
    _, key = tenant
    c = oai(gw, key)

    def create(text):
        r = c.responses.with_raw_response.create(model="colibri", input=text)
        return r.headers["x-request-id"], r.parse(), r.http_response.text

    for tokens in (5, 29):
        rid, resp, raw = create(prompt(f"hola [[sim: tokens={tokens}]]"))
        assert resp.output_text and resp.usage.output_tokens == tokens
        assert request_id_of(resp.id) == rid
        cost = resp.usage.cost
        assert resp.usage.model_extra["cost"] == cost and resp.usage.model_dump()["cost"] == cost
        assert charge(gw, key, rid) == as_read(cost) == exact(raw, "usage", "cost") > 0
    (rid1, first, _), (rid2, second, _) = cached_twice(create)
    assert second.usage.input_tokens_details.cached_tokens > 0, second.usage
    assert charge(gw, key, rid1) == as_read(first.usage.cost)
    assert charge(gw, key, rid2) == as_read(second.usage.cost) < as_read(first.usage.cost)
    # The stored object answers the same cost.
    again = c.responses.retrieve(second.id)
    assert again.usage.cost == second.usage.cost


def test_responses_stream_completed(gw, tenant):
    _, key = tenant
    c = oai(gw, key)
    text = prompt(LONG + "[[sim: tokens=14 reasoning=5]]")
    for cached in (False, True):
        r = c.responses.with_raw_response.create(model="colibri", input=text, stream=True)
        events = list(r.parse())
        assert all(e.response.usage is None for e in events if e.type in ("response.created", "response.in_progress"))
        done = [e for e in events if e.type == "response.completed"]
        assert len(done) == 1
        usage = done[0].response.usage
        assert (usage.input_tokens_details.cached_tokens > 0) == cached, usage
        assert charge(gw, key, r.headers["x-request-id"]) == as_read(usage.cost) > 0
    # The SDK's stream helper accumulates the same response.
    with c.responses.stream(model="colibri", input=prompt("hola [[sim: tokens=8]]")) as s:
        for _ in s:
            pass
        final = s.get_final_response()
    assert final.status == "completed" and final.output_text
    assert charge(gw, key, request_id_of(final.id)) == as_read(final.usage.cost) > 0


def test_responses_stream_cut_short_is_billed_as_its_failed_object_says(gw, tenant):
    """An upstream that breaks mid-answer: `response.failed` carries the usage metered (the
    tokens relayed) and its cost, which is what the ledger row charges."""
    _, key = tenant
    r = oai(gw, key).responses.with_raw_response.create(
        model="colibri", input=prompt("hola [[sim: tokens=30 reset_after=6]]"), stream=True)
    events = list(r.parse())
    failed = [e for e in events if e.type == "response.failed"]
    assert len(failed) == 1 and events[-1] is failed[0]
    usage = failed[0].response.usage
    assert 0 < usage.output_tokens < 30
    row = ledger_row(gw, key, r.headers["x-request-id"])
    assert Decimal(row["charge"]["exact"]) == as_read(usage.cost) > 0
    assert row["output_tokens"] == usage.output_tokens


@pytest.mark.parametrize("fmt", ["chat", "messages", "responses"])
def test_raw_streams_write_the_cost_as_an_exact_number(gw, tenant, fmt):
    """Read without an SDK: the number is the ledger's exact decimal, digit for digit."""
    _, key = tenant
    text = prompt("hola [[sim: tokens=7]]")
    path, body = {
        "chat": ("/v1/chat/completions", {"model": "colibri", "messages": [{"role": "user", "content": text}],
                                          "stream": True, "stream_options": {"include_usage": True}}),
        "messages": ("/v1/messages", {"model": "claude-sonnet-4-5", "max_tokens": 64,
                                      "messages": [{"role": "user", "content": text}], "stream": True}),
        "responses": ("/v1/responses", {"model": "colibri", "input": text, "stream": True}),
    }[fmt]
    status, raw, headers = http_json("POST", gw.base + path, body, {"Authorization": f"Bearer {key}"})
    assert status == 200, raw
    datas = [line.removeprefix("data: ") for line in raw.splitlines() if line.startswith("data: {")]
    costs = []
    for d in datas:
        # Numbers kept as the literal text they were written as.
        v = json.loads(d, parse_float=str, parse_int=str)
        usage = {"chat": lambda: v.get("usage"), "messages": lambda: v.get("usage"),
                 "responses": lambda: (v.get("response") or {}).get("usage")}[fmt]()
        if usage and "cost" in usage:
            costs.append(usage["cost"])
    assert len(costs) == 1, costs
    literal = costs[0]
    assert re.fullmatch(r"0\.\d{0,11}[1-9]", literal), f"not a plain decimal: {literal}"
    assert charge(gw, key, headers["x-request-id"]) == Decimal(literal)
