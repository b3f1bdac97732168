"""The Responses API (`/v1/responses`) through the real binary, with the official `openai` SDK
as the client: create (text, instructions, item lists, function tools and a
`function_call_output` round trip, `json_schema`, reasoning), streams, stored responses
(`previous_response_id`, retrieve, input items, delete, another tenant's id), and the ledger row
of every billed request."""

import json
import sqlite3
import time
from decimal import Decimal

import openai
import pytest

from harness import Gateway, http_json, wait_until

PRICES = {  # per million tokens, as harness.model_block configures them
    "colibri": (Decimal("0.20"), Decimal("0.05"), Decimal("0.80")),
    "aguila": (Decimal("1.00"), Decimal("0.25"), Decimal("4.00")),
    "apu": (Decimal("3.00"), Decimal("0.75"), Decimal("12.00")),
}

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def client(gw, key):
    return openai.OpenAI(base_url=gw.base + "/v1", api_key=key, max_retries=0)


def last_upstream(sim):
    return json.loads(sim.last_body())


def ledger_row(gw, request_id: str, timeout: float = 10.0) -> dict:
    deadline = time.time() + timeout
    while True:
        con = sqlite3.connect(gw.store_url.removeprefix("sqlite://"))
        con.row_factory = sqlite3.Row
        row = con.execute("SELECT * FROM ledger WHERE entry_id = ?", (request_id,)).fetchone()
        con.close()
        if row is not None:
            return dict(row)
        assert time.time() < deadline, f"no ledger row for {request_id}"
        time.sleep(0.05)


def in_store(gw, response_id: str) -> bool:
    """Whether the stored response `response_id` is in the store (not only waiting for it)."""
    con = sqlite3.connect(gw.store_url.removeprefix("sqlite://"))
    try:
        return con.execute("SELECT 1 FROM responses WHERE id = ?", (response_id,)).fetchone() is not None
    finally:
        con.close()


def assert_billed(gw, request_id: str, model: str, usage) -> None:
    """The request's ledger row holds the upstream's usage (as the response reports it) × the
    model's price, labelled with the format."""
    row = ledger_row(gw, request_id)
    assert row["format"] == "responses", row
    assert row["model"] == model
    cached = usage.input_tokens_details.cached_tokens
    assert (row["input_tokens"], row["cached_tokens"], row["output_tokens"]) == (
        usage.input_tokens, cached, usage.output_tokens), (row, usage)
    i, c, o = PRICES[model]
    expected = ((usage.input_tokens - cached) * i + cached * c + usage.output_tokens * o) / Decimal(10**6)
    assert Decimal(-row["delta"]) / Decimal(10**12) == expected, (row, usage)


def unparsed(v):
    """A streamed response as the SDK's stream helper holds it, without the `parsed` members
    it adds to every text part (a structured-output convenience, not the API's)."""
    if isinstance(v, dict):
        return {k: unparsed(x) for k, x in v.items() if k != "parsed"}
    if isinstance(v, list):
        return [unparsed(x) for x in v]
    return v


def create(c, **kw):
    """responses.create, returning (response, request id)."""
    raw = c.responses.with_raw_response.create(**kw)
    return raw.parse(), raw.headers["x-request-id"]


@pytest.mark.smoke
def test_text_with_instructions(gw, sim, tenant):
    _, key = tenant
    r, rid = create(client(gw, key), model="colibri", instructions="Sé breve.", input="Hola, ¿cómo estás?")
    assert r.object == "response" and r.status == "completed"
    assert r.id.startswith("resp_") and r.model == "colibri"
    assert r.instructions == "Sé breve."
    assert r.max_output_tokens == 8192
    assert [o.type for o in r.output] == ["message"]
    msg = r.output[0]
    assert msg.role == "assistant" and msg.status == "completed"
    assert msg.content[0].type == "output_text" and msg.content[0].text
    assert r.output_text == msg.content[0].text
    u = r.usage
    assert u.input_tokens > 0 and u.output_tokens > 0
    assert u.total_tokens == u.input_tokens + u.output_tokens
    assert u.input_tokens_details.cached_tokens >= 0 and u.output_tokens_details.reasoning_tokens == 0
    up = last_upstream(sim)
    assert up["model"] == "upstream-colibri"
    assert up["messages"] == [
        {"role": "system", "content": "Sé breve."},
        {"role": "user", "content": "Hola, ¿cómo estás?"},
    ]
    assert up["max_tokens"] == 8192 and up["temperature"] == 0.6
    assert_billed(gw, rid, "colibri", u)


def test_item_lists_and_a_function_call_round_trip(gw, sim, tenant):
    _, key = tenant
    c = client(gw, key)
    items = [
        {"role": "developer", "content": "Usa herramientas."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "¿Clima en Lima?"},
                                                        {"type": "input_text", "text": "[[sim: tool=get_weather]]"}]},
    ]
    r, rid = create(c, model="aguila", input=items, tools=[WEATHER], tool_choice="auto", store=False)
    assert r.status == "completed"
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1, r.output
    call = calls[0]
    assert call.name == "get_weather" and call.call_id and call.id.startswith("fc_")
    json.loads(call.arguments)
    up = last_upstream(sim)
    assert up["messages"][0] == {"role": "system", "content": "Usa herramientas."}
    assert up["tools"][0]["function"]["name"] == "get_weather"
    assert_billed(gw, rid, "aguila", r.usage)
    # The client runs the tool and sends its output back with the conversation so far.
    follow = items + [o.model_dump(exclude_none=True) for o in r.output] + [
        {"type": "function_call_output", "call_id": call.call_id, "output": "18 °C, nublado"}]
    r2, rid2 = create(c, model="aguila", input=follow, tools=[WEATHER], store=False)
    assert r2.status == "completed" and r2.output_text
    up = last_upstream(sim)
    assert up["messages"][-2]["tool_calls"][0]["id"] == call.call_id
    assert up["messages"][-1] == {"role": "tool", "tool_call_id": call.call_id, "content": "18 °C, nublado"}
    assert_billed(gw, rid2, "aguila", r2.usage)


def test_json_schema_and_reasoning_reach_the_upstream(gw, sim, tenant):
    _, key = tenant
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
              "additionalProperties": False}
    r, _ = create(client(gw, key), model="apu", input="Dame JSON",
                  text={"format": {"type": "json_schema", "name": "obj", "schema": schema, "strict": True}})
    assert r.text.format.type == "json_schema"
    up = last_upstream(sim)
    assert up["response_format"] == {"type": "json_schema",
                                     "json_schema": {"name": "obj", "schema": schema, "strict": True}}
    r, rid = create(client(gw, key), model="apu", input="Piensa. [[sim: reasoning=12]]",
                    reasoning={"effort": "high"})
    kinds = [o.type for o in r.output]
    assert kinds == ["reasoning", "message"], kinds
    assert r.output[0].content[0].type == "reasoning_text" and r.output[0].content[0].text
    assert r.usage.output_tokens_details.reasoning_tokens > 0
    assert r.reasoning.effort == "high"
    up = last_upstream(sim)
    assert up.get("reasoning_effort") == "high", up
    assert_billed(gw, rid, "apu", r.usage)


@pytest.mark.smoke
def test_stream_events_in_order_and_the_final_response_equals_the_deltas(gw, tenant):
    _, key = tenant
    c = client(gw, key)
    with c.responses.stream(model="colibri", input="Cuenta algo. [[sim: tokens=30 reasoning=5]]") as s:
        events = list(s)
        final = s.get_final_response()
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"], types
    assert types[-1] == "response.completed"
    seqs = [e.sequence_number for e in events]
    assert seqs == list(range(len(seqs))), seqs
    for needed in ("response.output_item.added", "response.content_part.added", "response.output_text.delta",
                   "response.output_text.done", "response.content_part.done", "response.output_item.done",
                   "response.reasoning_text.delta"):
        assert needed in types, (needed, types)
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text and final.output_text == text
    done = next(e for e in events if e.type == "response.output_text.done")
    assert done.text == text
    assert final.status == "completed" and final.usage.output_tokens > 0
    # The stored response is the one the stream completed with.
    completed = events[-1].response
    assert completed.output_text == text
    assert c.responses.retrieve(final.id).model_dump() == unparsed(completed.model_dump())


@pytest.mark.smoke
def test_stream_of_a_function_call(gw, tenant):
    _, key = tenant
    with client(gw, key).responses.stream(model="colibri", input="[[sim: tool=get_weather]]", tools=[WEATHER]) as s:
        events = list(s)
        final = s.get_final_response()
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    call = next(o for o in final.output if o.type == "function_call")
    assert args == done.arguments == call.arguments and call.name == "get_weather"


@pytest.mark.smoke
def test_previous_response_id_over_three_turns(gw, sim, tenant):
    _, key = tenant
    c = client(gw, key)
    r1, _ = create(c, model="aguila", instructions="Recuerda.", input="Me llamo Ana.")
    r2, _ = create(c, model="aguila", input="Vivo en Cusco.", previous_response_id=r1.id)
    r3, rid3 = create(c, model="aguila", input="¿Quién soy?", previous_response_id=r2.id)
    assert r3.previous_response_id == r2.id and r3.status == "completed"
    up = last_upstream(sim)
    assert up["messages"] == [
        {"role": "user", "content": "Me llamo Ana."},
        {"role": "assistant", "content": r1.output_text},
        {"role": "user", "content": "Vivo en Cusco."},
        {"role": "assistant", "content": r2.output_text},
        {"role": "user", "content": "¿Quién soy?"},
    ], "the earlier turns are rebuilt (instructions are not carried over)"
    # The rebuilt prompt is what is billed.
    assert_billed(gw, rid3, "aguila", r3.usage)
    assert r3.usage.input_tokens > r1.usage.input_tokens
    # Its input items: the whole conversation, newest first by default.
    items = c.responses.input_items.list(r3.id)
    texts = [i.content[0].text for i in items.data]
    assert texts == ["¿Quién soy?", r2.output_text, "Vivo en Cusco.", r1.output_text, "Me llamo Ana."]
    asc = c.responses.input_items.list(r3.id, order="asc", limit=2)
    assert [i.content[0].text for i in asc.data] == ["Me llamo Ana.", r1.output_text] and asc.has_more


def test_retrieve_input_items_delete(gw, tenant):
    _, key = tenant
    c = client(gw, key)
    r, _ = create(c, model="colibri", input=[{"role": "user", "content": "uno"}], metadata={"k": "v"})
    got = c.responses.retrieve(r.id)
    assert got.model_dump() == r.model_dump()
    assert got.metadata == {"k": "v"}
    items = c.responses.input_items.list(r.id)
    assert len(items.data) == 1 and items.data[0].role == "user" and items.data[0].id
    c.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.delete(r.id)


def test_a_deleted_response_is_gone_at_once(gw, tenant):
    """Deleted while it waits for the store (the writer gathers responses for 10 ms) or while
    its batch is being written: it never reads back, and deleting it again is a 404."""
    _, key = tenant
    c = client(gw, key)
    for i in range(20):
        r, _ = create(c, model="colibri", input=f"borrar {i}")
        c.responses.delete(r.id)
        with pytest.raises(openai.NotFoundError):
            c.responses.retrieve(r.id)
        with pytest.raises(openai.NotFoundError):
            c.responses.delete(r.id)
        if i % 2:
            # Once the batch it was in has been written: a response stored after it is in the
            # store (the writer takes them in order, one batch at a time).
            after, _ = create(c, model="colibri", input=f"después {i}")
            wait_until(lambda: in_store(gw, after.id), 5, "a later response in the store")
            with pytest.raises(openai.NotFoundError):
                c.responses.retrieve(r.id)


def test_stored_responses_are_counted(workdir, sim):
    # A gateway of its own, so that no response another test queued is counted meanwhile.
    gw = Gateway(workdir, {"colibri": [sim.api_base]}, name="quipu-responses-counted").start()
    try:
        _, key = gw.new_tenant("counted")
        c = client(gw, key)
        assert gw.metric_value("quipu_stored_responses_total", result="stored") == 0
        for i in range(3):
            create(c, model="colibri", input=f"cuenta {i}")
        create(c, model="colibri", input="no se guarda", store=False)
        wait_until(lambda: gw.metric_value("quipu_stored_responses_total", result="stored") == 3,
                   5, "three responses to be stored")
        for result in ("queue_full", "failed", "invalid"):
            assert gw.metric_value("quipu_stored_responses_total", result=result) == 0, result
    finally:
        gw.stop()


def test_store_false_is_not_retrievable(gw, tenant):
    _, key = tenant
    c = client(gw, key)
    r, _ = create(c, model="colibri", input="hola", store=False)
    assert r.store is False
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(r.id)


def test_max_output_tokens_makes_an_incomplete_response(gw, tenant):
    _, key = tenant
    r, rid = create(client(gw, key), model="colibri", input="Habla mucho. [[sim: tokens=100]]",
                    max_output_tokens=16)
    assert r.status == "incomplete"
    assert r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 16
    assert_billed(gw, rid, "colibri", r.usage)


def test_another_tenants_response_is_not_found(gw, tenant):
    _, key = tenant
    _, other = gw.new_tenant(f"intruso-{time.time_ns()}")
    mine, _ = create(client(gw, key), model="colibri", input="secreto")
    theirs = client(gw, other)
    with pytest.raises(openai.NotFoundError) as e:
        theirs.responses.retrieve(mine.id)
    missing = client(gw, key)
    with pytest.raises(openai.NotFoundError) as e2:
        missing.responses.retrieve("resp_doesnotexist")
    # The same answer as for an id that does not exist: nothing leaks.
    assert e.value.body["code"] == e2.value.body["code"] == "response_not_found"
    assert e.value.body["message"].replace(mine.id, "X") == e2.value.body["message"].replace("resp_doesnotexist", "X")
    with pytest.raises(openai.NotFoundError):
        theirs.responses.input_items.list(mine.id)
    with pytest.raises(openai.NotFoundError):
        theirs.responses.delete(mine.id)
    with pytest.raises(openai.NotFoundError):
        theirs.responses.create(model="colibri", input="¿y?", previous_response_id=mine.id)
    # Still there for its owner.
    assert client(gw, key).responses.retrieve(mine.id).id == mine.id


def test_errors_in_the_responses_shape(gw, tenant):
    _, key = tenant
    with pytest.raises(openai.NotFoundError) as e:
        client(gw, key).responses.create(model="gpt-9", input="hola")
    body = e.value.body
    assert body["code"] == "model_not_found" and body["param"] == "model"
    assert "colibri" in body["message"] and "aguila" in body["message"]
    with pytest.raises(openai.AuthenticationError) as e:
        client(gw, "sk-quipu-nope").responses.create(model="colibri", input="hola")
    assert e.value.status_code == 401
    status, raw, _ = http_json("POST", gw.base + "/v1/responses", {"model": "colibri", "input": 3},
                            headers={"Authorization": f"Bearer {key}"})
    assert status == 400
    assert list(raw["error"]) == ["type", "code", "message", "param"], raw
    assert raw["error"]["param"] == "input"
    # A hosted tool the upstream cannot run is dropped; forcing it is a 400 naming it.
    r, _ = create(client(gw, key), model="colibri", input="hola", tools=[{"type": "web_search"}])
    assert r.status == "completed"
    with pytest.raises(openai.BadRequestError) as e:
        client(gw, key).responses.create(model="colibri", input="hola", tools=[{"type": "web_search"}],
                                         tool_choice={"type": "web_search"})
    assert "web_search" in e.value.body["message"]
