#!/usr/bin/env python3
"""Runs the stack the observability test uses (two simulator replicas, a gateway, Prometheus),
and keeps sending all kinds of traffic. Use it to look at the dashboards without Docker.

    CARGO_TARGET_DIR=/path/to/target .venv/bin/python tests/observability/live.py [--once]

It prints the Prometheus URL. Point a local Grafana's Prometheus datasource at it and import
dashboards/quipu-*.json. With --once it sends one pass, evaluates every panel query as the test
does, prints a table of the results and exits. Ctrl-C stops everything.
"""

from __future__ import annotations

import argparse
import itertools
import math
import pathlib
import shutil
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[0] / "python"))
sys.path.insert(0, str(HERE))

import obs  # noqa: E402
from harness import require_binaries, scratch_dir  # noqa: E402


def report(prom: obs.Prometheus, window: str) -> int:
    bad = 0
    for dash, title, ref, expr in obs.panel_targets(obs.load_dashboards()):
        r = prom.query(obs.substitute(expr, window))
        if r.get("status") != "success":
            state = f"ERROR {r.get('error')}"
        else:
            values = obs.finite_values(r)
            n = len(r["data"]["result"])
            state = f"{n} series" + (f", max {max(values):.4g}" if values else ", no finite value")
        ok = state.startswith(tuple("123456789")) and "no finite" not in state
        bad += not ok
        print(f"{'ok ' if ok else 'BAD'} {dash[6:-5]:<10} {title[:44]:<44} {ref} {state}")
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--once", action="store_true", help="one pass, print every panel query's result, exit")
    args = ap.parse_args()
    require_binaries()
    workdir = scratch_dir()
    stack = obs.Stack(workdir).start()
    prom = obs.Prometheus(workdir, {"quipu": stack.gw.metrics_url.removeprefix("http://").removesuffix("/metrics")}).start()
    print(f"gateway    {stack.gw.base}\nmetrics    {stack.gw.metrics_url}\nprometheus {prom.url}\nlogs       {workdir}")
    try:
        started = time.time()
        for n in itertools.count(1):
            obs.drive_traffic(stack, nonce=f"live-{n}")
            # Let Prometheus see every new series before the next pass moves it.
            prom.wait_scrapes_after("quipu", time.time(), n=3 if args.once and n == 2 else 2)
            if args.once and n == 2:
                window = f"{max(30, math.ceil(time.time() - started) + 5)}s"
                return 1 if report(prom, window) else 0
    except KeyboardInterrupt:
        return 0
    finally:
        prom.stop()
        stack.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
