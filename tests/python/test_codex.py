"""The OpenAI Codex CLI (the real CLI, offline) through the gateway's Responses API: a turn in
which the model calls Codex's shell tool (`exec_command`), Codex runs it and sends its output
back, and the final answer arrives.

The CLI is installed from the npm registry by scripts/deps-codex.sh (pinned to 0.169.0, the
version whose requests crates/quipu-core/src/translate/responses/tests/codex.rs encodes). It
runs with a throwaway CODEX_HOME and a custom model provider (`wire_api = "responses"`, the key
from an env var); the simulator decides, from a directive in the prompt, to call
`exec_command`.
"""

import json
import pathlib
import sqlite3
import subprocess
import time
from decimal import Decimal

import pytest

from harness import ROOT

CODEX = ROOT / "tests" / ".tools" / "codex" / "node_modules" / ".bin" / "codex"
AGUILA = (Decimal("1.00"), Decimal("0.25"), Decimal("4.00"))  # harness.model_block's prices


@pytest.fixture(scope="module")
def codex_bin():
    if not CODEX.exists():
        r = subprocess.run([str(ROOT / "scripts" / "deps-codex.sh")], capture_output=True, text=True)
        assert r.returncode == 0, "installing the Codex CLI failed (needs npm and the npm registry):\n" + r.stderr[-2000:]
    assert CODEX.exists(), f"{CODEX} missing after install"
    return CODEX


def run_codex(codex_bin, gw, key, workdir: pathlib.Path, prompt: str):
    home = workdir / "codex-home"
    cwd = workdir / "codex-work"
    for d in (home, cwd):
        d.mkdir(exist_ok=True)
    (cwd / "hola.txt").write_text("hola\n")
    provider = (
        f'model_providers.quipu={{name="Quipu", base_url="{gw.base}/v1", env_key="QUIPU_KEY", '
        'wire_api="responses", request_max_retries=0, stream_max_retries=0}'
    )
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "CODEX_HOME": str(home),
        "LANG": "C.UTF-8",
        "QUIPU_KEY": key,
    }
    return subprocess.run(
        [str(codex_bin), "exec", "--skip-git-repo-check", "--json", "--dangerously-bypass-approvals-and-sandbox",
         "-c", "model_provider=quipu", "-c", 'model="aguila"', "-c", provider, prompt],
        cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=180,
    )


def test_codex_runs_a_shell_tool_turn_through_quipu(codex_bin, gw, sim, tenant, workdir):
    name, key = tenant
    since = sim.stats().get("seq", 0)
    prompt = 'list the files [[sim: tool=exec_command tool_args={"cmd":"ls"}]]'
    r = run_codex(codex_bin, gw, key, workdir, prompt)
    assert r.returncode == 0, f"codex exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    events = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    types = [e.get("type") for e in events]
    assert "turn.completed" in types and "turn.failed" not in types, types
    done = next(e for e in events if e["type"] == "turn.completed")
    usage = done["usage"]
    assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0, usage
    items = [e["item"] for e in events if e["type"] == "item.completed"]
    kinds = [i.get("type") for i in items]
    assert "command_execution" in kinds, items
    assert kinds[-1] == "agent_message" and items[-1].get("text"), items
    # The upstream saw the call's turn, then the tool's output (Codex ran `ls`) as a tool message.
    seen = [rec for rec in sim.requests(since) if rec.get("model") == "upstream-aguila"]
    assert len(seen) >= 2, "a tool call and the turn with its result"
    body = json.loads(sim.last_body())
    assert body["messages"][0]["role"] == "system", "Codex's developer prompt becomes the system message"
    calls = [m for m in body["messages"] if m["role"] == "assistant" and m.get("tool_calls")]
    assert calls and calls[-1]["tool_calls"][0]["function"]["name"] == "exec_command"
    tool_msgs = [m for m in body["messages"] if m["role"] == "tool"]
    assert tool_msgs and "hola.txt" in json.dumps(tool_msgs), tool_msgs
    assert all(t["function"]["name"] != "web_search" for t in body.get("tools", [])
               if t.get("type") == "function")
    # Every request is a ledger row in the responses format, its tokens at the model's prices,
    # and together they are the usage Codex reports for the turn.
    deadline = time.time() + 10
    while True:
        con = sqlite3.connect(gw.store_url.removeprefix("sqlite://"))
        con.row_factory = sqlite3.Row
        rows = [dict(x) for x in con.execute(
            "SELECT l.* FROM ledger l JOIN tenants t ON t.id = l.tenant_id WHERE t.name = ? AND l.kind = 'request'",
            (name,))]
        con.close()
        if len(rows) >= len(seen) or time.time() > deadline:
            break
        time.sleep(0.05)
    assert len(rows) == len(seen), rows
    i, c, o = AGUILA
    for row in rows:
        assert row["format"] == "responses" and row["model"] == "aguila" and row["status"] == "ok", row
        expected = ((row["input_tokens"] - row["cached_tokens"]) * i + row["cached_tokens"] * c
                    + row["output_tokens"] * o) / Decimal(10**6)
        assert Decimal(-row["delta"]) / Decimal(10**12) == expected, row
    assert sum(r["input_tokens"] for r in rows) == usage["input_tokens"], (rows, usage)
    assert sum(r["output_tokens"] for r in rows) == usage["output_tokens"], (rows, usage)
    assert sum(r["cached_tokens"] for r in rows) == usage.get("cached_input_tokens", 0), (rows, usage)
