"""tools/bloomery-load against the shared server: a short run in each mode, with
machine-readable output and no errors."""
import json
import os
import subprocess

import pytest

import serverctl

TOOL = os.path.join(serverctl.ROOT, "tools", "bloomery-load")


@pytest.mark.parametrize("mode", ["chat", "completion", "native"])
def test_load_tool_short_run(url, mode):
    p = subprocess.run([TOOL, "--url", url, "-c", "2", "-d", "1.5", "-n", "6", "--mode", mode,
                        "--ignore-eos", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    out = json.loads(p.stdout)
    assert out["errors"] == 0, out["error_messages"]
    assert out["requests"] >= 2
    assert out["tokens"] == 6 * out["requests"]
    assert out["tokens_per_s"] > 0
    assert out["ttft_ms"]["n"] == out["requests"]
    assert 0 < out["ttft_ms"]["p50"] <= out["ttft_ms"]["p99"]
    assert out["itl_ms"]["p50"] is not None


def test_load_tool_reports_errors(url):
    """Requests the server refuses are counted and their message reported."""
    p = subprocess.run([TOOL, "--url", url, "-c", "1", "-d", "0.5", "-n", "0", "--json"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    assert p.returncode == 2  # -n 0 is refused by the tool itself
    p = subprocess.run([TOOL, "--url", url + "/nowhere", "-c", "1", "-d", "0.5", "--json"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    assert p.returncode == 1
    out = json.loads(p.stdout)
    assert "error" in out or out["errors"] > 0
