"""Quipu in front of a REAL llama.cpp `llama-server` (not the simulator).

llama-server is built from source once per machine by scripts/llama-server.sh (cached outside
the repository; set QUIPU_LLAMA_SERVER to use another binary) and serves a tiny random GGUF
model written by llama_gguf.py: 2 layers, 64 dims, byte-level BPE, a ChatML template. Its output
is gibberish, but printable ASCII only and never an end-of-turn token, so every generation runs
to exactly `max_tokens`.

Each request's usage is checked three ways: what Quipu tells the client, what llama-server
itself counted (its Prometheus counters `llamacpp:prompt_tokens_total` — prompt tokens it
evaluated —, `llamacpp:prompt_tokens_cached_total` — reused from its prompt cache — and
`llamacpp:tokens_predicted_total`), and the ledger row, whose charge must be exactly those
tokens at the model's prices.
"""

from __future__ import annotations

import itertools
import json
import os
import pathlib
import sqlite3
import subprocess
import time
from decimal import Decimal

import anthropic
import openai
import pytest

from harness import ROOT, Gateway, Process, free_port, http_json, raw_connection, sse_events, wait_until
from llama_gguf import write_model

# colibri's prices in harness.model_block, soles per million tokens: input, cached, output.
PRICES = (Decimal("0.20"), Decimal("0.05"), Decimal("0.80"))
UPSTREAM_MODEL = "upstream-colibri"  # what Quipu sends as `model` (harness.model_block)
CTX = 4096  # llama-server's -c (all slots together)
_names = itertools.count(1)


_binary: dict[str, str] = {}  # "path" or "error", found once per session


def llama_server_binary() -> str:
    """The llama-server to test against: $QUIPU_LLAMA_SERVER, or the one scripts/llama-server.sh
    builds (once per machine: 10 to 30 minutes on two cores the first time, then instant).
    Fails the tests, never skips them, when there is none."""
    if not _binary:
        _binary.update(_find_llama_server())
    if "error" in _binary:
        pytest.fail(_binary["error"], pytrace=False)
    return _binary["path"]


def _find_llama_server() -> dict[str, str]:
    env = os.environ.get("QUIPU_LLAMA_SERVER")
    if env:
        if not (os.path.isfile(env) and os.access(env, os.X_OK)):
            return {"error": f"QUIPU_LLAMA_SERVER={env} is not an executable file"}
        return {"path": env}
    script = ROOT / "scripts" / "llama-server.sh"
    try:
        r = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=3600)
    except subprocess.TimeoutExpired:
        return {"error": f"{script} did not finish building llama-server within an hour"}
    path = r.stdout.strip()
    if r.returncode != 0 or not path or not os.access(path, os.X_OK):
        return {"error": (
            f"could not build llama.cpp's llama-server with {script} (exit {r.returncode}); it needs "
            "cmake, g++, make and curl (Debian: apt-get install cmake g++ make curl) and PyPI, or set "
            f"QUIPU_LLAMA_SERVER to a llama-server binary. Its log:\n{r.stderr[-4000:]}"
        )}
    return {"path": path}


class LlamaServer:
    """One `llama-server` on a free port, serving the tiny model."""

    def __init__(self, workdir: pathlib.Path, binary: str, model: pathlib.Path):
        self.workdir = workdir
        self.binary = binary
        self.model = model
        self.port = free_port()
        self.process: Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_base(self) -> str:
        return self.url + "/v1"

    def start(self) -> "LlamaServer":
        argv = [
            self.binary,
            "--model", str(self.model),
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--jinja",
            "--metrics",
            "--parallel", "2",
            "--ctx-size", str(CTX),
            "--threads", "1",
            "--threads-http", "4",
            "--alias", UPSTREAM_MODEL,
            "--no-warmup",
        ]
        self.process = Process(argv, self.workdir / f"llama-server-{self.port}.log")
        self.process.start()

        deadline = time.time() + 60
        while True:
            if not self.process.alive():
                raise RuntimeError(f"llama-server exited ({self.process.proc.returncode}):\n{self.process.tail()}")
            try:
                if http_json("GET", self.url + "/health", timeout=2)[0] == 200:  # 503 while loading
                    return self
            except OSError:
                pass  # not listening yet
            if time.time() > deadline:
                raise TimeoutError(f"llama-server not ready after 60 s:\n{self.process.tail()}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.process:
            self.process.stop(timeout=10)

    def counters(self) -> dict[str, float]:
        """llama-server's Prometheus counters, by name (without the `llamacpp:` prefix)."""
        status, text, _ = http_json("GET", self.url + "/metrics")
        assert status == 200, text
        out = {}
        for line in text.splitlines():
            if line.startswith("llamacpp:"):
                name, _, value = line.partition(" ")
                out[name.removeprefix("llamacpp:")] = float(value)
        return out

    def count(self, messages: list[dict], tools: list[dict] | None = None) -> int:
        """Tokens of the prompt llama-server builds for these chat messages: its chat template
        (/apply-template), tokenized the way it tokenizes a completion's prompt (/tokenize with
        the BOS added and special tokens parsed)."""
        body = {"messages": messages}
        if tools:
            body["tools"] = tools
        status, out, _ = http_json("POST", self.url + "/apply-template", body)
        assert status == 200, out
        status, toks, _ = http_json(
            "POST", self.url + "/tokenize", {"content": out["prompt"], "add_special": True, "parse_special": True}
        )
        assert status == 200, toks
        return len(toks["tokens"])


@pytest.fixture(scope="module")
def llama(workdir):
    binary = llama_server_binary()
    server = LlamaServer(workdir, binary, pathlib.Path(write_model(workdir / "tiny-llama.gguf"))).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def lgw(workdir, llama):
    g = Gateway(workdir, {"colibri": [llama.api_base]}, name="quipu-llama").start()
    yield g
    code = g.stop()
    assert code == 0, f"quipu did not exit cleanly ({code}):\n{g.process.tail()}"


@pytest.fixture
def key(lgw):
    _, secret = lgw.new_tenant(f"llama{next(_names)}")
    return secret


def charge(prompt: int, cached: int, completion: int) -> Decimal:
    i, c, o = PRICES
    return ((prompt - cached) * i + cached * c + completion * o) / Decimal(1_000_000)


def ledger_row(gw: Gateway, request_id: str, timeout: float = 10.0) -> dict:
    """The ledger row of one request, once the gateway has flushed it."""
    deadline = time.time() + timeout
    while True:
        con = sqlite3.connect(gw.store_url.removeprefix("sqlite://"))
        con.row_factory = sqlite3.Row
        row = con.execute("SELECT * FROM ledger WHERE kind = 'request' AND entry_id = ?", (request_id,)).fetchone()
        con.close()
        if row is not None:
            return dict(row)
        assert time.time() < deadline, f"no ledger row for {request_id}"
        time.sleep(0.05)


def assert_billed(gw: Gateway, request_id: str, prompt: int, cached: int, completion: int) -> None:
    row = ledger_row(gw, request_id)
    assert (row["input_tokens"], row["cached_tokens"], row["output_tokens"]) == (prompt, cached, completion), row
    assert row["input_estimated"] == 0 and row["unbilled"] == 0, row
    assert Decimal(-row["delta"]) / Decimal(10**12) == charge(prompt, cached, completion), row


class Counted:
    """What llama-server counted from its creation to `delta()`: prompt tokens it evaluated,
    prompt tokens it reused from its cache, tokens it generated."""

    def __init__(self, llama: LlamaServer):
        self.llama = llama
        self.start = llama.counters()

    def delta(self, expect_predicted: int) -> tuple[int, int, int]:
        # The counters move when the slot is released, which can be just after the response.
        def moved():
            now = self.llama.counters()
            return now["tokens_predicted_total"] - self.start["tokens_predicted_total"] >= expect_predicted

        wait_until(moved, 5, what="llama-server's counters")
        now = self.llama.counters()
        return tuple(
            int(now[name] - self.start[name])
            for name in ("prompt_tokens_total", "prompt_tokens_cached_total", "tokens_predicted_total")
        )


def test_llama_server_serves_the_tiny_model(llama):
    """The fixture itself: llama-server is up, serves the model under the alias, and the model's
    gibberish is printable ASCII running to max_tokens."""
    status, health, _ = http_json("GET", llama.url + "/health")
    assert (status, health) == (200, {"status": "ok"})
    status, models, _ = http_json("GET", llama.api_base + "/models")
    assert status == 200 and [m["id"] for m in models["data"]] == [UPSTREAM_MODEL], models
    status, body, _ = http_json(
        "POST", llama.api_base + "/chat/completions",
        {"model": UPSTREAM_MODEL, "messages": [{"role": "user", "content": "¡Hola, llama! ñandú 🦙"}],
         "max_tokens": 24, "temperature": 1.0},
    )
    assert status == 200, body
    text = body["choices"][0]["message"]["content"]
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 24
    assert text and all(0x20 <= ord(ch) <= 0x7E for ch in text), repr(text)


def test_chat(lgw, llama, key):
    """A chat completion through Quipu: the usage it reports is llama-server's, the ledger row
    bills exactly that, and the same prompt again is billed its cached tokens at the cache rate."""
    c = openai.OpenAI(base_url=lgw.base + "/v1", api_key=key, max_retries=0)
    messages = [
        {"role": "system", "content": "Eres un asistente breve."},
        {"role": "user", "content": "Cuéntame algo sobre los quipus incas, por favor. " * 3},
    ]
    expected_prompt = llama.count(messages)
    cached_seen = []
    for attempt in range(2):
        counted = Counted(llama)
        r = c.chat.completions.with_raw_response.create(model="colibri", messages=messages, max_tokens=20)
        assert r.http_response.status_code == 200
        rid = r.headers["x-request-id"]
        comp = r.parse()
        assert comp.object == "chat.completion" and comp.model == "colibri"
        choice = comp.choices[0]
        assert choice.finish_reason == "length"
        assert choice.message.role == "assistant" and choice.message.content
        u = comp.usage
        assert u.completion_tokens == 20
        assert u.prompt_tokens == expected_prompt, (u, expected_prompt)
        assert u.total_tokens == u.prompt_tokens + u.completion_tokens
        cached = u.prompt_tokens_details.cached_tokens
        assert (u.prompt_tokens - cached, cached, u.completion_tokens) == counted.delta(20), u
        assert_billed(lgw, rid, u.prompt_tokens, cached, u.completion_tokens)
        cached_seen.append(cached)
    # The first time at most the template's opening tokens can come from a slot's cache; the
    # second time the whole prompt but its last token does.
    assert cached_seen[1] > cached_seen[0] and cached_seen[1] > expected_prompt // 2, cached_seen


@pytest.mark.parametrize("include_usage", [True, False], ids=["include_usage", "no_usage"])
def test_chat_stream(lgw, llama, key, include_usage):
    """A streamed chat completion: well-formed chunks, then (when asked for) one usage chunk equal
    to what llama-server counted, and a ledger row for exactly that — also when the client did
    not ask for usage (llama-server reports it only when asked: Quipu must ask)."""
    messages = [{"role": "user", "content": f"Escribe un poema corto sobre el lago Titicaca ({include_usage}). 🌊"}]
    expected_prompt = llama.count(messages)
    body = {"model": "colibri", "messages": messages, "max_tokens": 16, "stream": True}
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    counted = Counted(llama)
    conn = raw_connection(lgw)
    conn.request(
        "POST", "/v1/chat/completions", json.dumps(body),
        {"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()
    assert resp.getheader("content-type", "").startswith("text/event-stream")
    rid = resp.getheader("x-request-id")
    raw = resp.read()
    conn.close()
    text = raw.decode("utf-8")  # strict: the stream is valid UTF-8
    events = sse_events(text)
    assert events[-1][1] == "[DONE]", events[-3:]
    chunks = [json.loads(data) for _, data in events[:-1]]
    assert all(ch["object"] == "chat.completion.chunk" and ch["model"] == "colibri" for ch in chunks)
    content = "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks if ch["choices"])
    assert content
    finishes = [ch["choices"][0]["finish_reason"] for ch in chunks if ch["choices"] and ch["choices"][0].get("finish_reason")]
    assert finishes == ["length"], finishes
    usage = [ch["usage"] for ch in chunks if ch.get("usage")]
    processed, cached, predicted = counted.delta(16)
    assert predicted == 16 and processed + cached == expected_prompt, (processed, cached, predicted)
    if include_usage:
        assert len(usage) == 1, usage
        u = usage[0]
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == u, "usage comes last, in a chunk of its own"
        assert u["completion_tokens"] == 16 and u["prompt_tokens"] == expected_prompt, u
        assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
        assert u["prompt_tokens_details"]["cached_tokens"] == cached, u
    else:
        assert usage == [], "usage the client did not ask for"
    assert_billed(lgw, rid, expected_prompt, cached, 16)


def test_messages(lgw, llama, key):
    """The messages format through Quipu to llama-server: Anthropic usage (input tokens not read
    from cache, cache reads) adds up to llama-server's count, and is billed exactly."""
    c = anthropic.Anthropic(base_url=lgw.base, api_key=key, max_retries=0)
    counted = Counted(llama)
    r = c.messages.with_raw_response.create(
        model="claude-haiku-4-5",  # alias of colibri
        max_tokens=12,
        system="Responde en castellano.",
        messages=[{"role": "user", "content": "¿Qué es un quipu? Explícalo en pocas palabras."}],
    )
    assert r.http_response.status_code == 200
    rid = r.headers["request-id"]
    m = r.parse()
    assert m.type == "message" and m.role == "assistant" and m.model == "claude-haiku-4-5"
    assert m.stop_reason == "max_tokens"
    assert [b.type for b in m.content] == ["text"] and m.content[0].text
    u = m.usage
    assert u.output_tokens == 12
    prompt = u.input_tokens + u.cache_read_input_tokens
    expected = llama.count(
        [{"role": "system", "content": "Responde en castellano."},
         {"role": "user", "content": "¿Qué es un quipu? Explícalo en pocas palabras."}]
    )
    assert prompt == expected, (u, expected)
    assert (u.input_tokens, u.cache_read_input_tokens, 12) == counted.delta(12), u
    assert_billed(lgw, rid, prompt, u.cache_read_input_tokens, u.output_tokens)


def test_messages_stream(lgw, llama, key):
    """A streamed messages request: the messages format's event sequence, valid UTF-8, usage equal to
    llama-server's counters, billed exactly."""
    body = {
        "model": "colibri",
        "max_tokens": 10,
        "stream": True,
        "messages": [{"role": "user", "content": "Háblame del Inti Raymi. ☀️"}],
    }
    counted = Counted(llama)
    conn = raw_connection(lgw)
    conn.request(
        "POST", "/v1/messages", json.dumps(body),
        {"x-api-key": key, "anthropic-version": "2023-06-01", "Content-Type": "application/json"},
    )
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()
    rid = resp.getheader("request-id")
    text = resp.read().decode("utf-8")
    conn.close()
    events = [(name, json.loads(data)) for name, data in sse_events(text) if name != "ping"]
    names = [name for name, _ in events]
    assert names[0] == "message_start" and names[-1] == "message_stop", names
    assert names[-2] == "message_delta", names
    assert all(name == data["type"] for name, data in events)
    assert "content_block_start" in names and "content_block_stop" in names
    deltas = [d["delta"] for n, d in events if n == "content_block_delta"]
    assert deltas and all(d["type"] == "text_delta" for d in deltas)
    assert "".join(d["text"] for d in deltas)
    start = events[0][1]["message"]["usage"]
    final = events[-2][1]
    assert final["delta"]["stop_reason"] == "max_tokens"
    u = final["usage"]
    assert u["output_tokens"] == 10
    input_tokens = u.get("input_tokens", start["input_tokens"])
    cache_read = u.get("cache_read_input_tokens", start.get("cache_read_input_tokens", 0)) or 0
    prompt = input_tokens + cache_read
    assert prompt == llama.count([{"role": "user", "content": body["messages"][0]["content"]}]), (start, u)
    assert (input_tokens, cache_read, 10) == counted.delta(10), (start, u)
    assert_billed(lgw, rid, prompt, cache_read, 10)


TOOLS = [
    {
        "name": "get_weather",
        "description": "Weather for a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
]


@pytest.mark.parametrize("with_tools", [False, True], ids=["plain", "tools"])
def test_count_tokens(lgw, llama, key, with_tools):
    """`POST /v1/messages/count_tokens` counts the prompt llama-server evaluates for the same
    messages request: exactly the input tokens (uncached + cache reads) that request reports and
    is billed, which are what llama-server's own template + tokenizer give."""
    c = anthropic.Anthropic(base_url=lgw.base, api_key=key, max_retries=0)
    kwargs = dict(
        model="colibri",
        system="Eres un contador de tokens.",
        messages=[{"role": "user", "content": "Cuenta mis tokens, por favor: ñ, 🦙 y «comillas»."}],
    )
    if with_tools:
        kwargs["tools"] = TOOLS
    real = c.messages.create(max_tokens=4, **kwargs)
    prompt = real.usage.input_tokens + real.usage.cache_read_input_tokens
    messages = [{"role": "system", "content": kwargs["system"]}, *kwargs["messages"]]
    tools = None
    if with_tools:
        tools = [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                                   "parameters": t["input_schema"]}} for t in TOOLS]
    assert prompt == llama.count(messages, tools), real.usage
    counted = c.messages.count_tokens(**kwargs)
    assert counted.input_tokens == prompt, (counted, real.usage)


def test_prompt_over_the_context_size(lgw, llama, key):
    """llama-server refuses a prompt longer than a slot's context (its 400
    `exceed_context_size_error`): Quipu answers each format's own context error and charges
    nothing."""
    big = "palabra " * 400  # about 2,800 tokens; a slot has CTX / 2
    s, body, hdrs = http_json(
        "POST", lgw.base + "/v1/chat/completions",
        {"model": "colibri", "messages": [{"role": "user", "content": big}], "max_tokens": 5},
        {"Authorization": f"Bearer {key}"},
    )
    assert s == 400 and body["error"]["code"] == "context_length_exceeded", body
    chat_id = hdrs["x-request-id"]
    s, body, hdrs = http_json(
        "POST", lgw.base + "/v1/messages",
        {"model": "colibri", "max_tokens": 5, "messages": [{"role": "user", "content": big}]},
        {"x-api-key": key, "anthropic-version": "2023-06-01"},
    )
    assert s == 400 and body["error"]["type"] == "invalid_request_error", body
    assert "prompt is too long" in body["error"]["message"], body
    for rid in (chat_id, hdrs["request-id"]):
        row = ledger_row(lgw, rid)
        assert (row["input_tokens"], row["cached_tokens"], row["output_tokens"], row["delta"]) == (0, 0, 0, 0), row
