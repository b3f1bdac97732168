"""The messages format through the real binary, with the official `anthropic` SDK as client."""

import hashlib
import re
import json
import time
import urllib.request

import anthropic
import pytest

from harness import Gateway, http_json, sse_events, wait_until

TOOLS = [
    {
        "name": "get_weather",
        "description": "Weather for a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
]


def client(gw, key, **kw):
    kw.setdefault("max_retries", 0)
    return anthropic.Anthropic(base_url=gw.base, api_key=key, **kw)


@pytest.mark.smoke
def test_create(gw, sim, tenant):
    _, key = tenant
    r = client(gw, key).messages.with_raw_response.create(
        model="claude-sonnet-4-5", max_tokens=1024, messages=[{"role": "user", "content": "Hola"}]
    )
    assert r.headers["request-id"].startswith("req_")
    m = r.parse()
    assert m.type == "message" and m.role == "assistant"
    assert m.model == "claude-sonnet-4-5", "the name the client sent is echoed"
    assert m.content[0].type == "text" and m.content[0].text
    assert m.stop_reason == "end_turn"
    assert m.usage.output_tokens > 0 and m.usage.input_tokens >= 0
    assert m.usage.cache_creation_input_tokens == 0
    up = json.loads(sim.last_body())
    assert up["model"] == "upstream-aguila", "claude-sonnet-* is an alias of aguila"


@pytest.mark.smoke
def test_stream_final_message_equals_non_stream(gw, tenant):
    _, key = tenant
    c = client(gw, key)
    kwargs = dict(
        model="apu",
        max_tokens=500,
        system="Eres útil. [[sim: reasoning=5 tokens=12]]",
        messages=[{"role": "user", "content": "Explica algo [[sim: reasoning=5 tokens=12]]"}],
    )
    plain = c.messages.create(**kwargs)
    with c.messages.stream(**kwargs) as s:
        events = [e.type for e in s]
        final = s.get_final_message()
    assert events[0] == "message_start"
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in plain.content]
    assert final.stop_reason == plain.stop_reason
    assert final.usage.output_tokens == plain.usage.output_tokens
    # The second call hits the prefix cache: same total input, split differently.
    total = lambda u: u.input_tokens + u.cache_read_input_tokens  # noqa: E731
    assert total(final.usage) == total(plain.usage)
    assert final.usage.cache_read_input_tokens > 0
    assert final.content[0].type == "thinking"


@pytest.mark.smoke
def test_tool_use_round_trip(gw, tenant):
    _, key = tenant
    c = client(gw, key)
    messages = [{"role": "user", "content": "¿Clima en Lima? [[sim: tool=get_weather]]"}]
    with c.messages.stream(model="aguila", max_tokens=300, tools=TOOLS, messages=messages) as s:
        first = s.get_final_message()
    assert first.stop_reason == "tool_use"
    use = [b for b in first.content if b.type == "tool_use"][0]
    assert use.name == "get_weather" and use.input["city"] == "Lima"
    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "22 °C"}]},
    ]
    second = c.messages.create(model="aguila", max_tokens=300, tools=TOOLS, messages=messages)
    assert second.stop_reason == "end_turn"
    assert second.content[0].type == "text"


@pytest.mark.smoke
def test_count_tokens_comes_from_the_upstream_tokenizer(gw, tenant):
    _, key = tenant
    c = client(gw, key)
    messages = [{"role": "user", "content": "cuenta mis tokens, por favor"}]
    counted = c.messages.count_tokens(model="colibri", messages=messages, tools=TOOLS)
    assert counted.input_tokens > 0
    real = c.messages.create(model="colibri", max_tokens=50, messages=messages, tools=TOOLS)
    assert counted.input_tokens == real.usage.input_tokens + real.usage.cache_read_input_tokens
    # The beta path Claude Code uses.
    status, body, _ = http_json(
        "POST",
        gw.base + "/v1/messages/count_tokens?beta=true",
        {"model": "colibri", "messages": messages},
        {"x-api-key": key, "anthropic-version": "2023-06-01"},
    )
    assert status == 200 and set(body) == {"input_tokens"}


def test_count_tokens_without_an_upstream_tokenizer_is_a_clear_501(workdir, sim):
    """A server with no tokenizer endpoint (here: a path it does not serve, as llama.cpp builds
    without `/tokenize` or SGLang answer) gets a 501 in the messages shape that says so — never
    a heuristic count."""
    g = Gateway(workdir, {"colibri": [sim.api_base]}, name="quipu-notok",
                model_extra='tokenize_path = "/no-tokenizer-here"').start()
    try:
        _, key = g.new_tenant("notok")
        # The SDK's own retry policy (two retries of every 5xx) is left on: the gateway's
        # `x-should-retry: false` must stop it, since asking again cannot succeed.
        with pytest.raises(anthropic.HTTPNotImplementedError) as e:
            client(g, key, max_retries=2).messages.count_tokens(
                model="colibri", messages=[{"role": "user", "content": "hola"}])
        assert e.value.status_code == 501
        assert e.value.response.headers["x-should-retry"] == "false"
        # Counted once the response is written: the client may read it a moment before.
        wait_until(lambda: g.metric_value("quipu_requests_total", route="count_tokens", status="501") == 1,
                   5, "the 501 to be counted")
        assert e.value.body["error"]["type"] == "api_error"
        assert "no tokenizer" in e.value.body["error"]["message"]
        assert "/no-tokenizer-here" in e.value.body["error"]["message"]
    finally:
        g.stop()


def test_models_list(gw):
    page = anthropic.Anthropic(base_url=gw.base, api_key="unused").models.list()
    assert [m.id for m in page.data] == ["colibri", "aguila", "apu"]
    assert page.data[1].display_name == "Águila"


def expect_status(gw, key, status, exc, **create):
    with pytest.raises(exc) as e:
        client(gw, key).messages.create(max_tokens=100, **create)
    assert e.value.status_code == status
    return e.value


def test_errors_raise_the_sdk_classes(gw, tenant):
    _, key = tenant
    hello = [{"role": "user", "content": "hola"}]
    e = expect_status(gw, "sk-qp-nope", 401, anthropic.AuthenticationError, model="colibri", messages=hello)
    assert e.body["error"]["type"] == "authentication_error"
    e = expect_status(gw, key, 404, anthropic.NotFoundError, model="gpt-9", messages=hello)
    assert "`colibri`, `aguila`, `apu`" in e.message
    e = expect_status(gw, key, 400, anthropic.BadRequestError, model="colibri", messages=[])
    assert e.body["error"]["type"] == "invalid_request_error"
    e = expect_status(
        gw, key, 400, anthropic.BadRequestError, model="colibri",
        messages=[{"role": "user", "content": "[[sim: overflow]]"}],
    )
    m = re.fullmatch(r"prompt is too long: (\d+) tokens > (\d+) maximum", e.body["error"]["message"])
    assert m and int(m.group(1)) > int(m.group(2)), e.body["error"]["message"]
    e = expect_status(
        gw, key, 529, anthropic.OverloadedError, model="colibri",
        messages=[{"role": "user", "content": "[[sim: status=503]]"}],
    )
    assert e.response.headers.get("retry-after")
    e = expect_status(
        gw, key, 429, anthropic.RateLimitError, model="colibri",
        messages=[{"role": "user", "content": "[[sim: status=429]]"}],
    )
    # An upstream 500 is the gateway's fault, not the client's: 502 `api_error`.
    e = expect_status(
        gw, key, 502, anthropic.InternalServerError, model="colibri",
        messages=[{"role": "user", "content": "[[sim: status=500]]"}],
    )
    assert e.body["error"]["type"] == "api_error" and e.response.headers.get("request-id")
    with pytest.raises(anthropic.BadRequestError):
        client(gw, key, default_headers={"anthropic-version": "yesterday"}).messages.create(
            model="colibri", max_tokens=10, messages=hello
        )


def test_billing_size_and_timeout_errors_raise_the_sdk_classes(workdir, sim):
    """402, 413 and 504 through the SDK: each status maps to its exception class, and the body
    is the messages error shape with the docs/design.md type."""
    g = Gateway(workdir, {"colibri": [sim.api_base]}, name="quipu-sdkerr",
                server_extra="max_body_bytes = 1048576",
                model_extra="timeouts = { request_ms = 500, first_byte_ms = 500 }").start()
    try:
        _, key = g.new_tenant("sdkerr")
        _, broke = g.new_tenant("sdkbroke", top_up=None)
        hello = [{"role": "user", "content": "hola"}]
        e = expect_status(g, broke, 402, anthropic.PaymentRequiredError, model="colibri", messages=hello)
        assert e.body["error"]["type"] == "billing_error"
        e = expect_status(g, key, 413, anthropic.ContentTooLargeError, model="colibri",
                          messages=[{"role": "user", "content": "x" * (1024 * 1024 + 1)}])
        assert e.body["error"]["type"] == "request_too_large"
        e = expect_status(g, key, 504, anthropic.GatewayTimeoutError, model="colibri",
                          messages=[{"role": "user", "content": "[[sim: ttfb_ms=2000]]"}])
        assert e.body["error"]["type"] == "timeout_error"
    finally:
        g.stop()


@pytest.mark.smoke
def test_mid_stream_error_is_an_error_event(gw, tenant):
    _, key = tenant
    seen = []
    with pytest.raises(anthropic.APIStatusError) as e:
        with client(gw, key).messages.stream(
            model="colibri", max_tokens=100, messages=[{"role": "user", "content": "[[sim: tokens=10 fail_after=2]]"}]
        ) as s:
            for ev in s:
                seen.append(ev.type)
    # The generated text arrived first; then the error frame, typed as the upstream's failure.
    assert "message_start" in seen and "content_block_delta" in seen, seen
    assert e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "api_error", e.value.body


def raw_stream(gw, key, body, headers=None):
    req = urllib.request.Request(
        gw.base + "/v1/messages?beta=true",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"x-api-key": key, "content-type": "application/json", "anthropic-version": "2023-06-01", **(headers or {})},
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.status, dict(r.headers), r.read().decode()


def test_pings_while_the_upstream_is_silent(gw, tenant):
    _, key = tenant
    t = time.time()
    status, headers, text = raw_stream(
        gw, key,
        {"model": "colibri", "max_tokens": 50, "stream": True,
         "messages": [{"role": "user", "content": "[[sim: prefill_ms=2600 tokens=3]]"}]},
    )
    assert status == 200 and time.time() - t > 2.5
    events = sse_events(text)
    names = [e for e, _ in events]
    assert names[0] == "message_start", "message_start precedes pings"
    assert names.count("ping") >= 2
    assert names[-1] == "message_stop"
    for name, data in events:
        assert json.loads(data)["type"] == name


def test_claude_code_shaped_request(gw, sim, tenant):
    _, key = tenant

    def body(nonce):
        return {
            "model": "claude-opus-5-5",
            "max_tokens": 32000,
            "stream": True,
            "thinking": {"type": "adaptive", "display": "omitted"},
            "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
            "output_config": {"effort": "high"},
            "metadata": {"user_id": json.dumps({"device_id": "ab" * 32, "session_id": "s-1"})},
            "system": [
                {"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.330.{nonce}; cc_entrypoint=sdk-cli;"},
                {"type": "text", "text": "You are a Claude agent.", "cache_control": {"type": "ephemeral"}},
            ],
            "tools": [dict(TOOLS[0], defer_loading=True, cache_control={"type": "ephemeral"})],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "<system-reminder>x</system-reminder>"}, {"type": "text", "text": "say hi"}]},
                {"role": "system", "content": [{"type": "text", "text": "# Environment", "cache_control": {"type": "ephemeral"}}]},
            ],
        }

    headers = {
        "authorization": f"Bearer {key}",
        "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,made-up-beta-2099-01-01",
        "x-stainless-retry-count": "0",
    }
    hashes = []
    for nonce in ("440", "ed0"):
        status, _, text = raw_stream(gw, key, body(nonce), headers)
        assert status == 200
        assert sse_events(text)[-1][0] == "message_stop"
        hashes.append(hashlib.sha256(sim.last_body()).hexdigest())
    assert hashes[0] == hashes[1], "the billing-header nonce must not reach the upstream"
    up = json.loads(sim.last_body())
    assert up["max_tokens"] == 8192
    assert up["model"] == "upstream-apu"
    assert not any("x-anthropic-billing-header" in json.dumps(m) for m in up["messages"])
