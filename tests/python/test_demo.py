"""`./scripts/run.sh --demo`: one command to a working gateway, as a newcomer would run it.

Runs the script on free ports (QUIPU_DEMO_*_PORT), waits for its "demo ready" line, runs every
curl it printed (each must answer 200), then stops it with SIGINT, as Ctrl-C would, and
expects a clean exit with both of its processes gone.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import threading
import time

from harness import ROOT, free_port

READY = "demo ready:"


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_demo_prints_working_curls_and_stops_cleanly_on_ctrl_c(workdir):
    ports = {name: free_port() for name in ("PORT", "SIM_PORT", "METRICS_PORT")}
    env = dict(os.environ)
    env.update({f"QUIPU_DEMO_{name}": str(port) for name, port in ports.items()})
    env["QUIPU_DEMO_DIR"] = str(workdir / "demo")
    proc = subprocess.Popen(
        [str(ROOT / "scripts" / "run.sh"), "--demo"],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # A test run started in the background (`./scripts/test.sh &`) inherits SIGINT ignored,
        # and a shell cannot trap a signal ignored on entry: give the demo Ctrl-C back.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    lines: list[str] = []
    ready = threading.Event()

    def read():
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith(READY):
                ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        # The binaries are built already (the build in the script is a no-op): seconds.
        deadline = time.time() + 300
        while not ready.wait(0.2):
            assert proc.poll() is None, "the demo exited early:\n" + "\n".join(lines)
            assert time.time() < deadline, "no ready line:\n" + "\n".join(lines)
        output = "\n".join(lines)

        curls = [line for line in lines if line.startswith("curl ")]
        paths = [shlex.split(c)[2].split(f":{ports['PORT']}", 1)[1] for c in curls]
        assert paths == [
            "/v1/models",
            "/v1/pricing",
            "/v1/plans",
            "/v1/chat/completions",
            "/v1/chat/completions",
            "/v1/messages",
            "/v1/messages/count_tokens",
        ], output
        for c in curls:
            r = subprocess.run(
                shlex.split(c) + ["-o", "/dev/null", "-w", "%{http_code}", "--max-time", "30"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert r.stdout == "200", f"{c}\n-> {r.stdout} {r.stderr}"

        # The key, the answer to the demo's own request and its ledger row were printed.
        assert any(line.strip().startswith("sk-qp-") for line in lines), output
        assert any(line.startswith("  < ") and len(line) > 4 for line in lines), output
        assert "Statement for demo" in output, output
        assert any(line.strip().startswith("colibri ") for line in lines), output
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        reader.join(timeout=10)
    output = "\n".join(lines)
    assert code == 0, output
    assert lines[-1] == "demo: stopped", output
    # Both processes are gone: nothing listens on their ports any more.
    assert not port_open(ports["PORT"]) and not port_open(ports["SIM_PORT"]), output
