"""The access log: one line per request with the fields an operator needs, off when asked, and
never a secret (API keys, the admin token) in the log or in the metrics."""

from __future__ import annotations

import re

import anthropic
import openai

from harness import ADMIN_TOKEN, Gateway, http_json

FIELDS = (
    "request_id route format tenant key model status outcome error in cached out charge_pen "
    "latency_ms ttft_ms queue_ms replica attempts"
).split()


def _access_lines(gw: Gateway) -> dict[str, dict[str, str]]:
    """The gateway's access-log lines, by request id, as field → value."""
    lines = {}
    for line in gw.process.log_path.read_text(errors="replace").splitlines():
        if " quipu::access " not in line:
            continue
        fields = dict(re.findall(r"(\w+)=(\S+)", line.split(" quipu::access ", 1)[1]))
        assert fields.get("request_id") not in lines, f"two access lines for one request: {line}"
        lines[fields["request_id"]] = fields
    return lines


def test_one_access_line_per_request_and_no_secret_anywhere(workdir, sim):
    gw = Gateway(workdir, {"colibri": [sim.api_base], "aguila": [sim.api_base]}, name="quipu-log").start()
    try:
        key, secret = gw.new_tenant("logged")
        ids: dict[str, tuple[str, int]] = {}

        chat = openai.OpenAI(base_url=gw.base + "/v1", api_key=secret, max_retries=0)
        r = chat.chat.completions.with_raw_response.create(
            model="colibri", messages=[{"role": "user", "content": "hola"}], max_tokens=20
        )
        ids[r.headers["x-request-id"]] = ("ok", 200)

        msgs = anthropic.Anthropic(base_url=gw.base, api_key=secret, max_retries=0)
        with msgs.messages.with_streaming_response.create(
            model="aguila", max_tokens=20, stream=True, messages=[{"role": "user", "content": "hola"}]
        ) as s:
            for _ in s.iter_lines():
                pass
            ids[s.headers["request-id"]] = ("ok", 200)

        # Refusals carry secrets of their own: a wrong key, and a real one in the wrong place.
        wrong = "sk-quipu-" + "x" * 40
        status, _, h = http_json(
            "POST", gw.base + "/v1/chat/completions",
            {"model": "colibri", "messages": [{"role": "user", "content": "hola"}]},
            {"Authorization": f"Bearer {wrong}"},
        )
        assert status == 401
        ids[h["x-request-id"]] = ("refused", 401)
        status, _, h = http_json(
            "POST", gw.base + "/v1/chat/completions",
            {"model": "colibri", "messages": [{"role": "user", "content": "hola"}]},
            {"x-api-key": secret},  # the chat format takes Bearer only
        )
        assert status == 401
        ids[h["x-request-id"]] = ("refused", 401)
        status, _, h = http_json(
            "POST", gw.base + "/v1/chat/completions",
            {"model": "nope", "messages": [{"role": "user", "content": "hola"}]},
            {"Authorization": f"Bearer {secret}"},
        )
        assert status == 404
        ids[h["x-request-id"]] = ("refused", 404)
        # The admin API, with its token.
        assert http_json("GET", gw.admin + "/admin/tenants", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})[0] == 200

        scrape = gw.metrics()
    finally:
        assert gw.stop() == 0
    log = gw.process.log_path.read_text(errors="replace")
    lines = _access_lines(gw)

    for rid, (_, status) in ids.items():
        assert rid in lines, f"no access line for {rid}"
        fields = lines[rid]
        missing = [f for f in FIELDS if f not in fields]
        assert not missing, f"access line for {rid} lacks {missing}: {fields}"
        assert fields["status"] == str(status), fields
    ok = [lines[r] for r, (kind, _) in ids.items() if kind == "ok"]
    for f in ok:
        assert f["tenant"] == "logged" and f["key"] == key["key_id"], f
        assert int(f["in"]) > 0 and int(f["out"]) > 0, f
        assert f["replica"].startswith("http://127.0.0.1:"), f
        assert float(f["charge_pen"]) > 0, f
    assert {f["format"] for f in ok} == {"chat", "messages"}
    stream = next(f for f in ok if f["format"] == "messages")
    assert stream["ttft_ms"] != "-", "a stream's access line carries its time to first token"

    for s in (secret, wrong, ADMIN_TOKEN):
        assert s not in log, "a secret reached the log"
        assert s not in scrape, "a secret reached the metrics"


def test_access_log_can_be_turned_off(workdir, sim):
    gw = Gateway(workdir, {"colibri": [sim.api_base]}, name="quipu-quiet")
    gw.env = lambda: {**Gateway.env(gw), "QUIPU_LOG": "info,quipu::access=off"}
    gw.start()
    try:
        _, secret = gw.new_tenant("quiet")
        c = openai.OpenAI(base_url=gw.base + "/v1", api_key=secret, max_retries=0)
        c.chat.completions.create(model="colibri", messages=[{"role": "user", "content": "hola"}])
    finally:
        assert gw.stop() == 0
    log = gw.process.log_path.read_text(errors="replace")
    assert " quipu::access " not in log
    assert " INFO " in log, "other info records still appear"
