"""Start real Quipu and simulator processes on free ports, for the integration tests.

Everything here drives the real binaries from `target/release` (built by scripts/test.sh):
`quipu` and `quipu-sim`. Nothing is mocked.
"""

from __future__ import annotations

import http.client
import json
import os
import pathlib
import signal
import socket
import sqlite3
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[2]
TARGET = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "release"
QUIPU = TARGET / "quipu"
SIM = TARGET / "quipu-sim"
ADMIN_TOKEN = "test-admin-token-0123456789"


def require_binaries() -> None:
    missing = [str(p) for p in (QUIPU, SIM) if not p.exists()]
    if missing:
        raise RuntimeError(
            f"missing {', '.join(missing)}: run `cargo build --release --workspace` "
            "(scripts/test.sh does it for you)"
        )


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A loopback port nothing listens on, never one this run has handed out before: the port is
    released before its server binds it, and the kernel may give a released port again — a
    balancer given a replica's port then fails to bind while the replica answers its health
    check, and every request reaches that one replica."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def wait_until(check, timeout: float = 15.0, what: str = "condition") -> None:
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            if check():
                return
        except Exception as e:  # noqa: BLE001 - retried until the deadline
            last = e
        time.sleep(0.05)
    raise TimeoutError(f"timed out waiting for {what}" + (f" (last error: {last})" if last else ""))


def http_json(method: str, url: str, body=None, headers=None, timeout: float = 30.0):
    """A request; returns (status, parsed JSON or raw text, headers)."""
    data = None if body is None else (body if isinstance(body, (bytes, bytearray)) else json.dumps(body).encode())
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None and "Content-Type" not in (headers or {}):
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            status, hdrs = r.status, dict(r.headers)
    except urllib.error.HTTPError as e:
        raw, status, hdrs = e.read(), e.code, dict(e.headers)
    try:
        return status, json.loads(raw), hdrs
    except ValueError:
        return status, raw.decode(errors="replace"), hdrs


class Process:
    """A child process whose output goes to a log file kept for failure reports."""

    # Every process started, so that one a failed test never stopped is stopped at the end of
    # the session (see `stop_leftovers`) instead of outliving the run.
    started: list["Process"] = []

    def __init__(self, argv: list[str], log_path: pathlib.Path, env=None):
        self.argv = argv
        self.log_path = log_path
        self.env = env
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            self.argv, stdout=self.log, stderr=subprocess.STDOUT, env=self.env, cwd=self.log_path.parent
        )
        Process.started.append(self)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def send_signal(self, sig: int) -> None:
        if self.alive():
            self.proc.send_signal(sig)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int | None:
        if self.proc is None:
            return None
        if self.alive():
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode

    def tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def stop_leftovers() -> int:
    """Kills every process still running that a test started; returns how many there were."""
    left = [p for p in Process.started if p.alive()]
    for p in left:
        p.proc.kill()
        p.proc.wait()
    Process.started.clear()
    return len(left)


class Sim:
    """One `quipu-sim` replica."""

    def __init__(self, workdir: pathlib.Path, *args: str, port: int | None = None, name: str = "sim"):
        self.port = port or free_port()
        self.args = list(args)
        self.workdir = workdir
        self.name = name
        self.process: Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_base(self) -> str:
        return self.url + "/v1"

    def start(self) -> "Sim":
        self.process = Process(
            [str(SIM), "--listen", f"127.0.0.1:{self.port}", *self.args],
            self.workdir / f"{self.name}-{self.port}.log",
        )
        self.process.start()
        wait_until(lambda: http_json("GET", self.url + "/health", timeout=2)[0] in (200, 503), what=f"{self.name} up")
        return self

    def stop(self, sig: int = signal.SIGKILL) -> None:
        if self.process:
            self.process.stop(sig, timeout=5)

    def requests(self, since: int = 0) -> list[dict]:
        status, body, _ = http_json("GET", f"{self.url}/sim/requests?since={since}")
        assert status == 200, body
        return body["requests"] if isinstance(body, dict) else body

    def stats(self) -> dict:
        return http_json("GET", self.url + "/sim/stats")[1]

    def reset(self) -> None:
        http_json("POST", self.url + "/sim/reset", {})

    def set_healthy(self, healthy: bool) -> None:
        http_json("POST", self.url + "/sim/health", {"healthy": healthy})

    def set_fault(self, status: int | None) -> None:
        """Answers every chat completion with `status` (None: back to normal), while the health
        check keeps passing."""
        http_json("POST", self.url + "/sim/fault", {"status": status})

    def last_body(self) -> bytes:
        with urllib.request.urlopen(self.url + "/sim/last-body", timeout=10) as r:
            return r.read()


def model_block(slug: str, upstreams: list[str], extra: str = "") -> str:
    display = {"colibri": "Colibrí", "aguila": "Águila", "apu": "Apu"}.get(slug, slug)
    vision = "false" if slug == "colibri" else "true"
    prices = {
        "colibri": ("0.20", "0.05", "0.80"),
        "aguila": ("1.00", "0.25", "4.00"),
        "apu": ("3.00", "0.75", "12.00"),
    }.get(slug, ("1.00", "0.10", "2.00"))
    ups = ", ".join(f'"{u}"' for u in upstreams)
    return f"""
[[models]]
slug = "{slug}"
display_name = "{display}"
description = "Test model {slug}"
vision = {vision}
in_plans = true
in_free = {"true" if slug == "colibri" else "false"}
upstream_model = "upstream-{slug}"
upstreams = [{ups}]
context_window = 32768
prices = {{ input = "{prices[0]}", cached = "{prices[1]}", output = "{prices[2]}" }}
thinking_on = {{ chat_template_kwargs = {{ enable_thinking = true }} }}
thinking_off = {{ chat_template_kwargs = {{ enable_thinking = false }} }}
health = {{ interval_ms = 300, max_failures = 2 }}
{extra}
"""


class Gateway:
    """One `quipu serve` with a generated config."""

    def __init__(
        self,
        workdir: pathlib.Path,
        upstreams: dict[str, list[str]],
        store_url: str | None = None,
        extra: str = "",
        model_extra: str = "",
        name: str = "quipu",
        server_extra: str = "",
    ):
        self.workdir = workdir
        self.port = free_port()
        self.metrics_port = free_port()
        self.admin_port = free_port()
        # Where a process started with `--upgrade` waits for this one's listeners.
        self.upgrade_sock = workdir / (name + "_upgrade.sock")
        self.name = name
        self.models = list(upstreams)
        self.store_url = store_url or f"sqlite://{workdir / (name + '-' + str(free_port()) + '.db')}"
        models = "".join(model_block(slug, ups, model_extra) for slug, ups in upstreams.items())
        tiers = {"apu": "claude-opus-*", "aguila": "claude-sonnet-*", "colibri": "claude-haiku-*"}
        aliases = "\n".join(f'"{tiers[s]}" = "{s}"' for s in upstreams if s in tiers)
        self.config_text = f"""
[server]
listen = "127.0.0.1:{self.port}"
metrics_listen = "127.0.0.1:{self.metrics_port}"
admin_listen = "127.0.0.1:{self.admin_port}"
admin_token = "{ADMIN_TOKEN}"
threads = 2
grace_period_seconds = 30
pid_file = "{workdir / (name + '.pid')}"
upgrade_sock = "{self.upgrade_sock}"
{server_extra}

[store]
url = "{self.store_url}"
ledger_flush_ms = 20
key_refresh_ms = 200

[billing]
min_top_up = "10.00"
lease_chunk = "5.00"

[streaming]
ping_interval_ms = 1000

[aliases]
{aliases}

[[plans]]
id = "gratis"
display_name = "Gratis"
price = "0.00"
usage_label = "30 mensajes al día"
web_search = false

[[plans]]
id = "pro"
display_name = "Pro"
price = "59.90"
usage_label = "Uso intensivo"
web_search = true
{extra}
{models}
"""
        self.config_path = workdir / f"{name}.toml"
        self.config_path.write_text(self.config_text)
        self.process: Process | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    @property
    def admin(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def env(self) -> dict:
        env = dict(os.environ)
        env.setdefault("QUIPU_LOG", "info")
        return env

    def start(self, *extra_args: str, wait: bool = True) -> "Gateway":
        self.process = Process(
            [str(QUIPU), "--config", str(self.config_path), "serve", *extra_args],
            self.workdir / f"{self.name}.log",
            env=self.env(),
        )
        self.process.start()
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 20.0) -> None:
        def up():
            if self.process and not self.process.alive():
                raise RuntimeError(f"quipu exited:\n{self.process.tail()}")
            return http_json("GET", self.base + "/health", timeout=2)[0] == 200

        wait_until(up, timeout, what="quipu ready")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 40.0) -> int | None:
        return self.process.stop(sig, timeout) if self.process else None

    def cli(self, *args: str, check: bool = True) -> dict | list | str:
        """Runs `quipu --config <this config> <args> --json` and returns the parsed output."""
        r = subprocess.run(
            [str(QUIPU), "--config", str(self.config_path), *args, "--json"],
            capture_output=True,
            text=True,
            env=self.env(),
            timeout=60,
        )
        if check and r.returncode != 0:
            raise RuntimeError(f"quipu {' '.join(args)} failed ({r.returncode}): {r.stderr}")
        if r.returncode != 0:
            return {"error": r.stderr.strip(), "code": r.returncode}
        return json.loads(r.stdout)

    def cli_text(self, *args: str) -> str:
        """Runs `quipu --config <this config> <args>` and returns what it printed."""
        r = subprocess.run(
            [str(QUIPU), "--config", str(self.config_path), *args],
            capture_output=True, text=True, env=self.env(), timeout=60,
        )
        if r.returncode != 0:
            raise RuntimeError(f"quipu {' '.join(args)} failed ({r.returncode}): {r.stderr}")
        return r.stdout

    def new_tenant(self, name: str, top_up: str | None = "1000.00", **key_args) -> tuple[dict, str]:
        """Creates a tenant (topped up) and a key; returns (key info, secret)."""
        self.cli("tenant", "create", name)
        if top_up:
            self.cli("topup", "--tenant", name, "--amount", top_up)
        args = ["key", "create", "--tenant", name]
        for k, v in key_args.items():
            args += [f"--{k}", str(v)]
        key = self.cli(*args)
        if self.process and self.process.alive():
            self.wait_key(key["secret"])
        return key, key["secret"]

    def wait_key(self, secret: str, timeout: float = 3.0) -> None:
        """Waits until the running gateway's key snapshot knows `secret` (a refresh interval)."""

        def known():
            status, _, _ = http_json(
                "POST", self.base + "/v1/chat/completions", b"{}", {"Authorization": f"Bearer {secret}"}
            )
            return status != 401

        wait_until(known, timeout, what="the new key to reach the gateway")

    def request(self, method: str, path: str, body=None, headers=None, timeout: float = 30.0):
        """A request to the API listener: (status, parsed JSON or raw text, headers)."""
        return http_json(method, self.base + path, body, headers, timeout)

    def wait_idle(self, timeout: float = 15.0) -> None:
        """Waits until no API request is in flight (`quipu_requests_in_flight`): each request
        has then finished — settled, queued its ledger row, counted its metrics."""
        wait_until(lambda: self.metric_value("quipu_requests_in_flight") == 0, timeout,
                   what=f"{self.name}: every request to finish")

    def ledger_has(self, request_id: str) -> bool:
        """Whether the store has the ledger row of `request_id`."""
        if self.store_url.startswith("sqlite://"):
            con = sqlite3.connect(self.store_url.removeprefix("sqlite://"))
            try:
                return con.execute("SELECT 1 FROM ledger WHERE entry_id = ?", (request_id,)).fetchone() is not None
            finally:
                con.close()
        r = subprocess.run(["psql", self.store_url, "-Atc", "SELECT 1 FROM ledger WHERE entry_id = "
                            f"'{request_id}'"], check=True, capture_output=True, text=True)
        return r.stdout.strip() == "1"

    def ledger_barrier(self, timeout: float = 15.0) -> None:
        """Returns once every request the gateway has received so far has its ledger row in the
        store, if it makes one: what a check that a row was NOT written waits for, instead of a
        clock. Every request finishes first (a finished request has queued its row); then one
        more request, of a tenant of its own (created here once, with a row of its own in the
        ledger from then on), is answered and its row waited for: the writer stores rows in the
        order they were queued, so every row queued before it is stored by then."""
        self.wait_idle(timeout)
        if getattr(self, "_barrier_key", None) is None:
            self._barrier_key = self.new_tenant(f"ledger-barrier-{self.port}", top_up="100.00")[1]
        status, body, hdrs = self.request(
            "POST", "/v1/chat/completions",
            {"model": self.models[0], "max_tokens": 1,
             "messages": [{"role": "user", "content": "barrier [[sim: tokens=1]]"}]},
            {"Authorization": f"Bearer {self._barrier_key}"},
        )
        assert status == 200, f"the ledger barrier's request: {status} {body}"
        rid = hdrs["x-request-id"]
        wait_until(lambda: self.ledger_has(rid), timeout, what=f"{self.name}: the ledger barrier's row")

    def metrics(self) -> str:
        with urllib.request.urlopen(self.metrics_url, timeout=10) as r:
            return r.read().decode()

    def metric_value(self, name: str, **labels) -> float:
        """Sum of the samples of `name` whose labels include `labels`."""
        total = 0.0
        for line in self.metrics().splitlines():
            if not line.startswith(name):
                continue
            head, _, value = line.rpartition(" ")
            metric, _, label_text = head.partition("{")
            if metric != name:
                continue
            if all(f'{k}="{v}"' in label_text for k, v in labels.items()):
                total += float(value)
        return total


def raw_connection(gw: Gateway) -> http.client.HTTPConnection:
    return http.client.HTTPConnection("127.0.0.1", gw.port, timeout=30)


def sse_events(text: str) -> list[tuple[str | None, str]]:
    """Parses an SSE body into (event, data) pairs."""
    events = []
    for frame in text.replace("\r\n", "\n").split("\n\n"):
        if not frame.strip():
            continue
        name, data = None, []
        for line in frame.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip(" "))
        events.append((name, "\n".join(data)))
    return events


def scratch_dir() -> pathlib.Path:
    base = ROOT / "tests" / ".tmp"
    base.mkdir(parents=True, exist_ok=True)
    return pathlib.Path(tempfile.mkdtemp(dir=base))
