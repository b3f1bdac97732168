"""TLS and HTTP/2 helpers for benches/run.py: the run's test CA and server certificate, and the
two load generators the TLS and h2 cells use besides wrk.

- `make_certs`: a throwaway CA and a server certificate for 127.0.0.1 and localhost (ECDSA P-256,
  openssl CLI), made once per run and shared by every TLS target (nginx, the bare Pingora
  forwarder, Quipu, the simulator's direct TLS baseline).
- `ab`: ApacheBench, one new TCP connection and one *full* TLS handshake per request. It builds
  a fresh SSL object per connection and never offers a session to resume (wrk and oha both do:
  wrk keeps the last session on its SSL object, oha's rustls client has an in-memory session
  cache, so their "new connection" runs measure resumed handshakes; see `wrk` with
  `Connection: close` in run.py for that variant).
- `h2load`: nghttp2's load generator, HTTP/2 with many streams per connection (ALPN h2 over TLS,
  prior knowledge on a plain port) or HTTP/1.1 for the direct baseline; latencies from its
  per-request log.
"""

from __future__ import annotations

import re
import shutil
import ssl
import statistics
import subprocess
from pathlib import Path


def make_certs(work: Path) -> dict[str, Path]:
    """A test CA and a server certificate (chain.pem, key.pem) valid for 127.0.0.1 and localhost."""
    d = work / "tls"
    d.mkdir(parents=True, exist_ok=True)
    ossl = lambda *a: subprocess.run(["openssl", *a], check=True, capture_output=True, cwd=d)  # noqa: E731
    p256 = ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"]
    ossl(*p256, "-out", "ca.key")
    ossl("req", "-x509", "-new", "-key", "ca.key", "-sha256", "-days", "2", "-subj", "/CN=Quipu bench CA",
         "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
         "-out", "ca.pem")
    ossl(*p256, "-out", "key.pem")
    ossl("req", "-new", "-key", "key.pem", "-subj", "/CN=localhost", "-out", "server.csr")
    (d / "ext.cnf").write_text("basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
                               "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n")
    ossl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
         "-days", "2", "-sha256", "-extfile", "ext.cnf", "-out", "chain.pem")
    ossl("verify", "-CAfile", "ca.pem", "chain.pem")
    return {"ca": d / "ca.pem", "cert": d / "chain.pem", "key": d / "key.pem"}


def client_context(ca: Path) -> ssl.SSLContext:
    """A client context that trusts only the run's CA (and checks the name)."""
    return ssl.create_default_context(cafile=str(ca))


def nginx_version() -> tuple[int, ...]:
    out = subprocess.run(["nginx", "-v"], capture_output=True, text=True).stderr
    m = re.search(r"nginx/(\d+)\.(\d+)\.(\d+)", out)
    return tuple(int(x) for x in m.groups()) if m else (0, 0, 0)


def nginx_listen(addr: str, tls: bool, h2: bool) -> str:
    """The listen lines for a TLS and/or HTTP/2 server block. `http2 on;` exists from nginx 1.25.1;
    before it (Debian 12 ships 1.22) the same thing is the `http2` parameter of `listen`."""
    new = nginx_version() >= (1, 25, 1)
    params = (" ssl" if tls else "") + (" http2" if h2 and not new else "")
    return f"listen {addr}{params} backlog=4096;" + (" http2 on;" if h2 and new else "")


def ab(url: str, body: str, headers: dict, conns: int, seconds: float, work: Path) -> dict:
    """ApacheBench: HTTP/1.0, a new connection per request (no -k), a full TLS handshake each on
    https. Same result keys as run.wrk (p50/p99 in µs). Each request also says `Connection:
    close`: HTTP/1.0 without keep-alive implies it, but Quipu answers such a request with
    `Connection: keep-alive` and leaves the connection open, and ab waits for the close."""
    bodyf, csv = work / "ab-body.json", work / "ab-percentiles.csv"
    bodyf.write_text(body)
    args = ["taskset", "-c", "1", "ab", "-q", "-l", "-r", "-s", "30", "-t", f"{max(1, round(seconds))}", "-n", "10000000",
            "-c", str(conns), "-p", str(bodyf), "-e", str(csv), "-H", "Connection: close"]
    for k, v in headers.items():
        if k.lower() == "content-type":
            args += ["-T", v]
        else:
            args += ["-H", f"{k}: {v}"]
    out = subprocess.run(args + [url], capture_output=True, text=True)
    text = out.stdout
    num = lambda pat: float(m.group(1)) if (m := re.search(pat, text)) else None  # noqa: E731
    done = num(r"Complete requests:\s+(\d+)")
    if not done:
        raise RuntimeError(f"ab failed: {out.stdout[-400:]} {out.stderr[-400:]}")
    failed = (num(r"Failed requests:\s+(\d+)") or 0) + (num(r"Non-2xx responses:\s+(\d+)") or 0)
    pct = {}
    for line in csv.read_text().splitlines()[1:]:
        p, t = line.split(",")
        pct[int(p)] = float(t)
    return {"requests": int(done), "errors": int(failed), "rps": num(r"Requests per second:\s+([\d.]+)"),
            "p50": pct[50] * 1000, "p99": pct[99] * 1000}


def h2load(url: str, body: str, headers: dict, conns: int, streams: int, seconds: float, work: Path,
           h1: bool = False) -> dict:
    """h2load: `conns` connections with up to `streams` concurrent streams each (h2 by ALPN over
    TLS, prior knowledge on http://); with h1=True, HTTP/1.1 (one request in flight per
    connection, since a body is posted). p50/p99 in µs from the per-request log."""
    if not shutil.which("h2load"):
        raise RuntimeError("h2load is not installed (Debian package nghttp2-client)")
    bodyf, log = work / "h2load-body.json", work / "h2load.log"
    bodyf.write_text(body)
    log.unlink(missing_ok=True)
    args = ["taskset", "-c", "1", "h2load", "-t", "1", "-c", str(conns), "-m", str(streams), "-D", f"{seconds:g}",
            "-d", str(bodyf), f"--log-file={log}"]
    if h1:
        args.append("--h1")
    for k, v in headers.items():
        args += ["-H", f"{k}: {v}"]
    out = subprocess.run(args + [url], capture_output=True, text=True)
    text = out.stdout
    m = re.search(r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored, (\d+) timeout", text)
    if not m or not log.exists():
        raise RuntimeError(f"h2load failed: {text[-600:]} {out.stderr[-300:]}")
    rows = [line.split("\t") for line in log.read_text().splitlines()]
    lat = sorted(int(r[2]) for r in rows if len(r) >= 3)
    if not lat:
        raise RuntimeError(f"h2load finished no request: {text[-600:]}")
    errored = int(m.group(6)) + int(m.group(7))
    # At the end of -D the requests still in flight are cancelled and counted as errored: at most
    # one per stream slot. Errors are the non-2xx answers and any errored request beyond those.
    non2xx = sum(1 for r in rows if len(r) >= 3 and not r[1].startswith("2"))
    fin = re.search(r"finished in ([\d.]+)(m?s), ([\d.]+) req/s", text)
    proto = re.search(r"Application protocol: (\S+)", text)
    return {"requests": len(lat), "errors": non2xx + max(0, errored - conns * streams),
            "rps": float(fin.group(3)) if fin else len(lat) / seconds,
            "p50": statistics.median(lat), "p99": lat[min(len(lat) - 1, int(len(lat) * 0.99))],
            "proto": proto.group(1) if proto else "?"}


def h2load_hold(url: str, body: str, headers: dict, conns: int, streams: int, n: int, work: Path):
    """Starts h2load sending n long requests at once over `conns` connections of `streams`
    streams each; returns (process, a function that waits for it and parses its counts)."""
    bodyf, outf = work / "h2load-hold.json", work / "h2load-hold.out"
    bodyf.write_text(body)
    args = ["taskset", "-c", "1", "h2load", "-t", "1", "-c", str(conns), "-m", str(streams), "-n", str(n),
            "-d", str(bodyf)]
    for k, v in headers.items():
        args += ["-H", f"{k}: {v}"]
    out = open(outf, "w")
    proc = subprocess.Popen(args + [url], stdout=out, stderr=subprocess.STDOUT)

    def result() -> dict:
        proc.wait()
        out.close()
        text = outf.read_text()
        m = re.search(r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored, (\d+) timeout", text)
        if not m:
            raise RuntimeError(f"h2load failed: {text[-600:]}")
        codes = re.search(r"status codes: (\d+) 2xx", text)
        ok = int(codes.group(1)) if codes else int(m.group(4))
        return {"succeeded": ok, "errors": n - ok}
    return proc, result
