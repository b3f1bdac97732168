"""The official `openai` Node SDK streams one Responses API request through the gateway.

The SDK is installed from the npm registry by scripts/deps-openai-node.sh (pinned); the client
script is openai_node_stream.cjs next to this file.
"""

import json
import pathlib
import subprocess

import pytest

from harness import ROOT

SDK = ROOT / "tests" / ".tools" / "openai-node"
SCRIPT = pathlib.Path(__file__).with_name("openai_node_stream.cjs")


@pytest.fixture(scope="module")
def node_sdk():
    if not (SDK / "node_modules" / "openai" / "package.json").exists():
        r = subprocess.run([str(ROOT / "scripts" / "deps-openai-node.sh")], capture_output=True, text=True)
        assert r.returncode == 0, "installing the openai Node SDK failed (needs npm and the npm registry):\n" + r.stderr[-2000:]
    return SDK


def test_node_sdk_streams_a_response(node_sdk, gw, tenant):
    _, key = tenant
    r = subprocess.run(["node", str(SCRIPT), str(node_sdk), gw.base + "/v1", key, "colibri"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    types = [t for t, _ in out["events"]]
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed", types
    assert [s for _, s in out["events"]] == list(range(len(types)))
    final = out["final"]
    assert final["status"] == "completed" and final["model"] == "colibri"
    assert out["text"] and final["output"][0]["content"][0]["text"] == out["text"]
    assert final["usage"]["output_tokens"] == 24
