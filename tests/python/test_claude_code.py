"""Claude Code (the real CLI, offline) through the gateway: a tool-using turn.

The CLI is installed from the npm registry by scripts/deps-claude-code.sh, pinned: on Node 20,
npm would otherwise pick an old release, since newer ones declare `engines.node >= 22` (the CLI
is a native binary and does not use the system node). It talks to the
gateway with ANTHROPIC_BASE_URL; the simulator decides, from a directive in the prompt, to call
the CLI's Bash tool, the CLI runs it and sends the result back, and the simulator answers.
"""

import json
import os
import pathlib
import subprocess

import pytest

from harness import ROOT

CLAUDE = ROOT / "tests" / ".tools" / "claude-code" / "node_modules" / ".bin" / "claude"


@pytest.fixture(scope="module")
def claude_bin():
    if not CLAUDE.exists():
        r = subprocess.run([str(ROOT / "scripts" / "deps-claude-code.sh")], capture_output=True, text=True)
        assert r.returncode == 0, (
            "installing Claude Code failed (needs npm and the npm registry):\n" + r.stderr[-2000:]
        )
    assert CLAUDE.exists(), f"{CLAUDE} missing after install"
    return CLAUDE


def run_claude(claude_bin, gw, key, workdir: pathlib.Path, prompt: str, *extra: str):
    home = workdir / "cc-home"
    tmp = workdir / "cc-tmp"
    cwd = workdir / "cc-work"
    for d in (home, tmp, cwd):
        d.mkdir(exist_ok=True)
    (cwd / "hello.txt").write_text("hola\n")
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "TMPDIR": str(tmp),
        "LANG": "C.UTF-8",
        "ANTHROPIC_BASE_URL": gw.base,
        "ANTHROPIC_AUTH_TOKEN": key,
        "ANTHROPIC_API_KEY": "",
        "ANTHROPIC_MODEL": "aguila",
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": "colibri",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    return subprocess.run(
        [str(claude_bin), "-p", prompt, "--output-format", "json", *extra],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_claude_code_tool_using_turn(claude_bin, gw, sim, tenant, workdir):
    _, key = tenant
    since = sim.stats().get("seq", 0)
    prompt = 'list the files [[sim: tool=Bash tool_args={"command":"ls","description":"List_files"}]]'
    r = run_claude(claude_bin, gw, key, workdir, prompt, "--allowedTools", "Bash")
    assert r.returncode == 0, f"claude exited {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    out = json.loads(r.stdout)
    assert out["is_error"] is False, out
    assert out["num_turns"] >= 2, out
    assert out["result"]
    seen = [rec for rec in sim.requests(since) if rec.get("model") == "upstream-aguila"]
    assert len(seen) >= 2, "a tool call and the turn with its result"
    # The second request carries the tool's output back as a tool message.
    body = json.loads(sim.last_body())
    tool_msgs = [m for m in body["messages"] if m["role"] == "tool"]
    assert tool_msgs and "hello.txt" in json.dumps(tool_msgs)
    assert not any("x-anthropic-billing-header" in json.dumps(m) for m in body["messages"])


def test_claude_code_plain_prompt(claude_bin, gw, tenant, workdir):
    _, key = tenant
    r = run_claude(claude_bin, gw, key, workdir, "say hi [[sim: reply=Hola_desde_Quipu]]")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["result"].strip() == "Hola desde Quipu"


if os.environ.get("QUIPU_SKIP_CLAUDE_CODE") == "1":  # pragma: no cover - explicit opt-out only
    pytestmark = pytest.mark.skip(reason="QUIPU_SKIP_CLAUDE_CODE=1 was set by the person running the tests")


def test_claude_code_tool_using_turn_over_https(claude_bin, sim, workdir, monkeypatch):
    """The same tool-using turn with the gateway behind TLS (https://localhost:PORT, a test CA
    that Node trusts through NODE_EXTRA_CA_CERTS): the environment is run_claude's, only the
    base URL is https and that variable is added."""
    from tls_support import TestCA, TlsGateway

    ca = TestCA(workdir, "claude-code")
    leaf = ca.issue("claude-code-tls")
    gw = TlsGateway(workdir, {slug: [sim.api_base] for slug in ("colibri", "aguila", "apu")},
                    ca, leaf, name="quipu-cc-tls").start()
    try:
        assert gw.base.startswith("https://localhost:")
        _, key = gw.new_tenant("cc-tls")
        since = sim.stats().get("seq", 0)
        prompt = 'list the files [[sim: tool=Bash tool_args={"command":"ls","description":"List_files"}]]'
        real_run = subprocess.run

        def with_ca(argv, **kw):
            kw["env"] = {**kw["env"], "NODE_EXTRA_CA_CERTS": str(ca.path)}
            return real_run(argv, **kw)

        with monkeypatch.context() as m:
            m.setattr(subprocess, "run", with_ca)
            r = run_claude(claude_bin, gw, key, workdir, prompt, "--allowedTools", "Bash")
        assert r.returncode == 0, f"claude exited {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
        out = json.loads(r.stdout)
        assert out["is_error"] is False, out
        assert out["num_turns"] >= 2, out
        assert out["result"]
        seen = [rec for rec in sim.requests(since) if rec.get("model") == "upstream-aguila"]
        assert len(seen) >= 2, "a tool call and the turn with its result"
        # The second request carries the tool's output back as a tool message.
        body = json.loads(sim.last_body())
        tool_msgs = [m for m in body["messages"] if m["role"] == "tool"]
        assert tool_msgs and "hello.txt" in json.dumps(tool_msgs)
        assert not any("x-anthropic-billing-header" in json.dumps(m) for m in body["messages"])
        # Both turns went through this gateway's TLS listener.
        assert gw.metric_value("quipu_requests_total", route="messages", status="200") >= 2
    finally:
        code = gw.stop()
        assert code == 0, f"quipu did not exit cleanly ({code}):\n{gw.process.tail()}"
