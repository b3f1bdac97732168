"""The chat format through the real binary, with the official `openai` SDK as the client."""

import json
import time

import openai
import pytest

from harness import Gateway, Sim, http_json


def client(gw, key):
    return openai.OpenAI(base_url=gw.base + "/v1", api_key=key, max_retries=0)


def last_upstream(sim):
    return json.loads(sim.last_body())


@pytest.mark.smoke
def test_create(gw, sim, tenant):
    _, key = tenant
    r = client(gw, key).chat.completions.with_raw_response.create(
        model="colibri", messages=[{"role": "user", "content": "Hola, ¿cómo estás?"}]
    )
    assert r.headers["x-request-id"].startswith("req_")
    c = r.parse()
    assert c.model == "colibri"
    assert c.object == "chat.completion"
    assert c.choices[0].message.content
    assert c.choices[0].finish_reason == "stop"
    assert c.usage.prompt_tokens > 0 and c.usage.completion_tokens > 0
    assert c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens
    assert c.usage.prompt_tokens_details.cached_tokens >= 0
    up = last_upstream(sim)
    assert up["model"] == "upstream-colibri"
    assert up["max_tokens"] == 8192 and up["temperature"] == 0.6


@pytest.mark.parametrize("sim_args", [("--flavor", "sglang"), ("--flavor", "llamacpp"), ("--no-cached-details",)],
                         ids=["sglang", "llamacpp", "vllm-without-details"])
def test_usage_always_has_cached_tokens(workdir, sim_args):
    """A chat answer's usage always has `prompt_tokens_details.cached_tokens`, whatever the model
    server left out (SGLang with no cache hit, llama.cpp, vLLM without the details flag): the
    client gets the billed count, in the body and in the stream's usage chunk."""
    name = "-".join(a.strip("-") for a in sim_args)
    up = Sim(workdir, *sim_args, name=f"sim-{name}").start()
    g = Gateway(workdir, {"colibri": [up.api_base]}, name=f"quipu-{name}").start()
    try:
        _, key = g.new_tenant(name)
        c = client(g, key)
        msgs = [{"role": "user", "content": f"una pregunta nueva para {name}: " + "palabra " * 200}]
        r = c.chat.completions.create(model="colibri", messages=msgs)
        assert r.usage.prompt_tokens_details.cached_tokens == 0, r.usage
        # The same prompt again: the simulator's prefix cache serves part of it.
        r = c.chat.completions.create(model="colibri", messages=msgs)
        details = r.usage.prompt_tokens_details
        expect_hits = sim_args != ("--no-cached-details",)
        assert details is not None and (details.cached_tokens > 0) == expect_hits, r.usage
        chunks = list(c.chat.completions.create(model="colibri", messages=msgs, stream=True,
                                                stream_options={"include_usage": True}))
        u = chunks[-1].usage
        assert u is not None and u.prompt_tokens_details.cached_tokens == details.cached_tokens, u
    finally:
        g.stop()
        up.stop()


def test_rules_reach_the_upstream(gw, sim, tenant):
    _, key = tenant
    client(gw, key).chat.completions.create(
        model="aguila",
        messages=[{"role": "developer", "content": "Sé breve."}, {"role": "user", "content": "hola"}],
        max_completion_tokens=50000,
        temperature=0.1,
        seed=3,
        stop=["FIN"],
        user="u-42",
        extra_body={"n": 3, "store": True, "metadata": {"x": "y"}},
    )
    up = last_upstream(sim)
    assert up["max_tokens"] == 8192
    assert up["messages"][0]["role"] == "system"
    assert up["temperature"] == 0.1 and up["seed"] == 3 and up["stop"] == ["FIN"] and up["user"] == "u-42"
    for dropped in ("n", "store", "metadata"):
        assert dropped not in up


def test_stream_without_usage(gw, tenant):
    _, key = tenant
    chunks = list(
        client(gw, key).chat.completions.create(
            model="colibri", messages=[{"role": "user", "content": "cuenta"}], stream=True
        )
    )
    assert chunks, "no chunks"
    assert all(c.model == "colibri" for c in chunks)
    assert all(c.usage is None for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert chunks[-1].choices[0].finish_reason == "stop"


@pytest.mark.smoke
def test_stream_with_usage(gw, tenant):
    _, key = tenant
    chunks = list(
        client(gw, key).chat.completions.create(
            model="colibri",
            messages=[{"role": "user", "content": "cuenta"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    usage = [c.usage for c in chunks if c.usage is not None]
    assert len(usage) == 1, "exactly the final chunk carries usage"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens >= 0


@pytest.mark.smoke
def test_tools_round_trip(gw, tenant):
    _, key = tenant
    c = client(gw, key)
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather for a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    messages = [{"role": "user", "content": "¿Clima en Lima? [[sim: tool=get_weather]]"}]
    first = c.chat.completions.create(model="aguila", messages=messages, tools=tools)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    assert args["city"] == "Lima"
    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "22 °C, soleado"},
    ]
    second = c.chat.completions.create(model="aguila", messages=messages, tools=tools)
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content

    # The same through a stream: the arguments arrive in fragments and join to the same JSON.
    stream = c.chat.completions.create(
        model="aguila", messages=messages[:1], tools=tools, stream=True
    )
    fragments = []
    for chunk in stream:
        for d in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
            fragments.append(d.function.arguments or "")
    assert json.loads("".join(fragments)) == args


@pytest.mark.smoke
def test_errors_raise_the_sdk_classes_with_our_messages(gw, tenant):
    _, key = tenant
    with pytest.raises(openai.AuthenticationError) as e:
        client(gw, "sk-qp-not-a-key").chat.completions.create(
            model="colibri", messages=[{"role": "user", "content": "x"}]
        )
    assert "invalid or revoked API key" in str(e.value)
    assert e.value.body["type"] == "authentication_error"
    assert e.value.body["code"] == "invalid_api_key"

    with pytest.raises(openai.NotFoundError) as e:
        client(gw, key).chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "x"}])
    assert "`colibri`, `aguila`, `apu`" in str(e.value)
    assert e.value.body["code"] == "model_not_found"

    with pytest.raises(openai.BadRequestError) as e:
        client(gw, key).chat.completions.create(model="colibri", messages=[{"role": "robot", "content": "x"}])
    assert "unknown role" in str(e.value)
    assert e.value.body["param"] == "messages[0].role"


def test_missing_key_and_wrong_scheme(gw):
    status, body, headers = http_json(
        "POST", gw.base + "/v1/chat/completions", {"model": "colibri", "messages": []}
    )
    assert status == 401 and body["error"]["type"] == "authentication_error"
    assert headers.get("x-request-id")


def test_upstream_errors_are_rerendered(gw, tenant):
    _, key = tenant
    c = client(gw, key)
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="colibri", messages=[{"role": "user", "content": "[[sim: overflow]]"}])
    assert e.value.body["code"] == "context_length_exceeded"
    assert "upstream-colibri" not in str(e.value)
    with pytest.raises(openai.InternalServerError) as e:
        c.chat.completions.create(model="colibri", messages=[{"role": "user", "content": "[[sim: status=500]]"}])
    assert e.value.status_code == 502


@pytest.mark.smoke
def test_mid_stream_failure_becomes_an_error_event(gw, tenant):
    _, key = tenant
    stream = client(gw, key).chat.completions.create(
        model="colibri", messages=[{"role": "user", "content": "[[sim: fail_after=3]]"}], stream=True
    )
    with pytest.raises(openai.APIError):
        for _ in stream:
            pass


def test_first_chunk_arrives_before_the_upstream_finishes(gw, tenant):
    _, key = tenant
    started = time.time()
    arrivals = []
    for chunk in client(gw, key).chat.completions.create(
        model="colibri",
        messages=[{"role": "user", "content": "[[sim: tokens=6 delay_ms=300]]"}],
        stream=True,
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            arrivals.append(time.time() - started)
    assert len(arrivals) >= 5
    total = time.time() - started
    assert total > 1.5, "the simulator paces its chunks"
    assert arrivals[0] < 0.9, f"first token at {arrivals[0]:.2f}s of {total:.2f}s: buffered?"
    assert arrivals[-1] - arrivals[0] > 1.0
