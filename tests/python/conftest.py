"""Shared fixtures: one simulator and one gateway for most tests, tenants on demand.

Tests that need their own topology (several replicas, PostgreSQL, restarts) build it with the
classes in `harness.py`.
"""

from __future__ import annotations

import itertools
import os
import pathlib
import shutil
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))

from harness import Gateway, Sim, require_binaries, scratch_dir, stop_leftovers  # noqa: E402

_names = itertools.count(1)


@pytest.fixture(scope="module")
def pg_admin():
    """The test PostgreSQL's URL, for tests that run replicas behind nginx on it: a fresh
    database each (`cluster.fresh_database`)."""
    from cluster import require_nginx

    url = os.environ.get("QUIPU_TEST_PG_URL")
    assert url, (
        "QUIPU_TEST_PG_URL is not set: run the suite with scripts/test.sh, or start a server with "
        "`eval \"$(scripts/pg-test.sh start)\"` first"
    )
    try:
        require_nginx()
    except RuntimeError as e:
        pytest.fail(str(e))
    return url


@pytest.fixture(scope="session")
def workdir():
    require_binaries()
    d = scratch_dir()
    yield d
    # Session fixtures have stopped theirs by now; what is left, a failed test started.
    stop_leftovers()
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def sim(workdir):
    s = Sim(workdir, "--reasoning-field", "reasoning").start()
    yield s
    s.stop()


@pytest.fixture(scope="session")
def gw(workdir, sim):
    g = Gateway(workdir, {slug: [sim.api_base] for slug in ("colibri", "aguila", "apu")})
    g.start()
    yield g
    code = g.stop()
    assert code == 0, f"quipu did not exit cleanly ({code}):\n{g.process.tail()}"


@pytest.fixture
def tenant(gw):
    """A fresh tenant with S/ 1,000.00 and a key: (name, secret)."""
    name = f"t{next(_names)}"
    _, secret = gw.new_tenant(name)
    return name, secret


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "smoke: the integration smoke of the fast tier (`scripts/test.sh --fast` runs only these; "
        "docs/testing.md says why these)",
    )


def pytest_runtest_makereport(item, call):
    # On failure, show the tail of every process log of the session's workdir.
    if call.when == "call" and call.excinfo is not None:
        wd = item.funcargs.get("workdir")
        if wd:
            for log in sorted(pathlib.Path(wd).glob("*.log")):
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
                item.add_report_section("call", f"log {log.name}", tail)
