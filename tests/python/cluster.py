"""Several `quipu serve` replicas on one PostgreSQL behind a real nginx, on loopback: what an
operator runs behind a load balancer. Used by test_replicas.py and scripts/replicas.sh.

nginx is Debian's (scripts/deps.sh installs it); without it the tests fail and say so.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess
import threading
import time
import uuid
from decimal import Decimal

from harness import Gateway, Process, Sim, free_port, http_json, wait_until


def require_nginx() -> str:
    path = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
    if not path:
        raise RuntimeError("nginx is not installed: `apt-get install nginx` (scripts/deps.sh does it)")
    return path


def fresh_database(admin_url: str) -> str:
    """A new, empty database on the test server; its URL."""
    name = "quipu_" + uuid.uuid4().hex[:10]
    subprocess.run(["psql", admin_url, "-qc", f"CREATE DATABASE {name}"], check=True, capture_output=True)
    base, _, _ = admin_url.rpartition("/")
    return f"{base}/{name}"


def psql(url: str, sql: str) -> list[str]:
    r = subprocess.run(["psql", url, "-Atc", sql], check=True, capture_output=True, text=True)
    return [line for line in r.stdout.splitlines() if line]


class Balancer:
    """nginx, round robin over the replicas' ports: a failed connection goes to the next replica
    (nginx's default `proxy_next_upstream error timeout`, which never resends a request a replica
    may have started), streams pass through unbuffered, keep-alive connections to the replicas."""

    def __init__(self, workdir: pathlib.Path, ports: list[int], name: str = "nginx"):
        self.port = free_port()
        self.dir = workdir / f"{name}-{self.port}"
        self.dir.mkdir(parents=True, exist_ok=True)
        servers = "\n".join(f"        server 127.0.0.1:{p} max_fails=1 fail_timeout=1s;" for p in ports)
        user = "user root;" if os.geteuid() == 0 else ""
        (self.dir / "nginx.conf").write_text(f"""
{user}
worker_processes 1;
daemon off;
pid {self.dir}/nginx.pid;
error_log {self.dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {self.dir}/body;
    proxy_temp_path {self.dir}/proxy;
    fastcgi_temp_path {self.dir}/fastcgi;
    uwsgi_temp_path {self.dir}/uwsgi;
    scgi_temp_path {self.dir}/scgi;
    upstream quipu {{
{servers}
        keepalive 64;
    }}
    server {{
        listen 127.0.0.1:{self.port};
        client_max_body_size 32m;
        location / {{
            proxy_pass http://quipu;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 300s;
            proxy_next_upstream error timeout;
            proxy_next_upstream_tries 3;
        }}
    }}
}}
""")
        self.process: Process | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "Balancer":
        nginx = require_nginx()
        self.process = Process([nginx, "-p", str(self.dir), "-c", str(self.dir / "nginx.conf")],
                               self.dir / "nginx.log")
        self.process.start()
        wait_until(lambda: http_json("GET", self.base + "/health", timeout=2)[0] == 200, 15, "nginx up")
        # What answered must be this nginx, not a replica that took the port first.
        _, _, headers = http_json("GET", self.base + "/health", timeout=2)
        server = next((v for k, v in headers.items() if k.lower() == "server"), "")
        assert self.process.alive() and server.startswith("nginx"), (
            f"port {self.port} is not this balancer's (Server: {server!r}):\n{self.process.tail()}"
        )
        return self

    def stop(self) -> None:
        if self.process:
            self.process.stop(signal.SIGQUIT, timeout=10)


class Cluster:
    """`n` replicas of one configuration (each its own port) on one database, one simulator as
    the upstream of every model, and nginx in front."""

    def __init__(self, workdir: pathlib.Path, pg_url: str, n: int = 3, limits: str = "",
                 prices: dict[str, tuple[str, str, str]] | None = None, name: str = "rep"):
        self.workdir = workdir
        self.pg_url = pg_url
        self.sim = Sim(workdir, name=f"sim-{name}")
        self.name = name
        self.limits = limits
        self.prices = prices or {}
        self.replicas: list[Gateway] = []
        for i in range(n):
            self.replicas.append(self._gateway(i))
        self.balancer = Balancer(workdir, [g.port for g in self.replicas], name=f"nginx-{name}")

    def _gateway(self, i: int) -> Gateway:
        gw = Gateway(self.workdir, {"colibri": [self.sim.api_base], "apu": [self.sim.api_base]},
                     store_url=self.pg_url, name=f"quipu-{self.name}-{i}",
                     extra=f"\n[limits]\n{self.limits}\n" if self.limits else "")
        text = gw.config_text
        for slug, (i_, c_, o_) in self.prices.items():
            default = {"colibri": ("0.20", "0.05", "0.80"), "apu": ("3.00", "0.75", "12.00")}[slug]
            old = f'prices = {{ input = "{default[0]}", cached = "{default[1]}", output = "{default[2]}" }}'
            assert old in text, old
            text = text.replace(old, f'prices = {{ input = "{i_}", cached = "{c_}", output = "{o_}" }}')
        gw.config_text = text
        gw.config_path.write_text(text)
        return gw

    def start(self) -> "Cluster":
        self.sim.start()
        for g in self.replicas:
            g.start(wait=False)
        for g in self.replicas:
            g.wait_ready()
        self.balancer.start()
        return self

    def stop(self) -> None:
        self.balancer.stop()
        for g in self.replicas:
            g.stop()
        self.sim.stop()

    @property
    def base(self) -> str:
        return self.balancer.base

    def new_tenant(self, name: str, top_up: str, **key_args) -> str:
        _, secret = self.replicas[0].new_tenant(name, top_up=top_up, **key_args)
        for g in self.replicas[1:]:
            g.wait_key(secret)
        return secret

    def restart(self, i: int, timeout: float = 60.0) -> None:
        """Replaces replica `i` as a rolling restart does: SIGTERM (it stops accepting, finishes
        what it started, writes the ledger), then a new process on the same port."""
        old = self.replicas[i]
        code = old.stop(signal.SIGTERM, timeout=timeout)
        assert code == 0, f"{old.name} exited with {code}:\n{old.process.tail()}"
        new = Gateway.__new__(Gateway)
        new.__dict__.update(old.__dict__)
        new.process = None
        new.start()

    def ledger(self, tenant: str) -> dict[str, tuple[int, int, int, int]]:
        """request id -> (charge in pico-soles, input, cached, output tokens) of the tenant's rows."""
        rows = psql(self.pg_url, "SELECT entry_id || '|' || (-delta) || '|' || input_tokens || '|' || "
                    "cached_tokens || '|' || output_tokens FROM ledger WHERE kind = 'request' AND tenant_id = "
                    f"(SELECT id FROM tenants WHERE name = '{tenant}')")
        out = {}
        for r in rows:
            rid, charge, i, c, o = r.split("|")
            out[rid] = (int(charge), int(i), int(c), int(o))
        return out

    def balance(self, tenant: str) -> Decimal:
        (b,) = psql(self.pg_url, f"SELECT balance FROM tenants WHERE name = '{tenant}'")
        return Decimal(b) / Decimal(10**12)


def paced(rate: float, seconds: float, workers: int, fn, stop: threading.Event | None = None) -> list:
    """Calls `fn(i)` about `rate` times a second for `seconds` from `workers` threads (each its own
    share of the schedule); returns what the calls returned, in call order."""
    results: list = []
    lock = threading.Lock()
    start = time.time() + 0.05
    total = int(rate * seconds)

    def work(k: int) -> None:
        for i in range(k, total, workers):
            if stop is not None and stop.is_set():
                return
            due = start + i / rate
            delay = due - time.time()
            if delay > 0:
                time.sleep(delay)
            r = fn(i)
            with lock:
                results.append((i, r))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [r for _, r in sorted(results, key=lambda x: x[0])]
