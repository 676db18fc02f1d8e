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


def test_load_tool_body(url):
    """--body's fields reach the server: a valid logit_bias runs clean, a malformed one
    is refused by the server for every request; a --body that is not a JSON object is
    refused by the tool."""
    base = [TOOL, "--url", url, "-c", "1", "-d", "1", "-n", "4", "--mode", "native", "--json"]
    p = subprocess.run(base + ["--body", '{"logit_bias": [[0, false], [1, -5.5]]}'],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert json.loads(p.stdout)["errors"] == 0
    p = subprocess.run(base + ["--body", '{"logit_bias": "all of them"}'],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    assert p.returncode == 1, p.stdout + p.stderr
    out = json.loads(p.stdout)
    assert out["errors"] > 0 and "logit_bias" in json.dumps(out["error_messages"])
    for bad in ("[1, 2]", "{nope", '"text"'):
        p = subprocess.run([TOOL, "--url", url, "-d", "1", "--body", bad], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=30)
        assert p.returncode == 2 and "--body" in p.stderr, (bad, p.stderr)
    p = subprocess.run([TOOL, "--url", url, "-d", "1", "--mix", "--body", "{}"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=30)
    assert p.returncode == 2 and "--mix" in p.stderr


MIX_KINDS = {"chat_stream", "chat", "native_stream", "cancel", "constrained", "bad"}


def run_tool(args, timeout=180):
    p = subprocess.run([TOOL] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=timeout)
    return p, (json.loads(p.stdout) if p.stdout.strip().startswith("{") else None)


def test_load_tool_mix(url, server):
    """Every kind of the mix against a real server: the well-formed ones are served,
    the malformed ones get their 4xx with the error JSON, nothing is counted as an
    error, and the resident memory of the server's two processes is sampled."""
    p, out = run_tool(["--url", url, "--mix", "-c", "3", "-d", "6", "-n", "4", "--seed", "5",
                       "--timeout", "60", "--server-pid", str(server.pid), "--rss-every", "1",
                       "--json"])
    assert out is not None, p.stdout + p.stderr
    assert out["errors"] == 0, out["error_messages"]
    assert p.returncode == 0, p.stderr
    assert out["mode"] == "mix"
    assert out["mix"]["bad"] == 2 and out["mix"]["constrained:chat_json_schema"] == 1
    kinds = out["kinds"]
    assert {k.split(":")[0] for k in kinds} == MIX_KINDS, sorted(kinds)
    assert sum(k["ok"] for k in kinds.values()) == out["requests"]
    assert any(k.startswith("bad:") for k in kinds) and all(k["errors"] == 0 for k in kinds.values())
    assert out["tokens"] > 0 and out["ttft_ms"]["n"] > 0

    rss = out["rss"]
    assert rss["server_pid"] == server.pid and rss["every_s"] == 1
    samples = rss["samples"]
    assert len(samples) >= 5, samples  # the start, about one a second, the end
    assert [s["t_s"] for s in samples] == sorted(s["t_s"] for s in samples)
    for s in samples:
        names = sorted(q["name"] for q in s["processes"])
        assert names == ["bloomery-serve", "bloomery-worker"], s
        assert all(q["rss_kb"] > 0 and q["rss_kb"] >= q["anon_kb"] for q in s["processes"]), s
    assert "rss at" in p.stderr


def test_load_tool_mix_text_report(url, server):
    """The text report lists the kinds and the RSS table; only the kinds asked run."""
    p, _ = run_tool(["--url", url, "--mix", "chat_stream=0,chat=0,native_stream=0,cancel=0,constrained=0,"
                     "bad:oversize_body=0", "-c", "2", "-d", "1.5", "--server-pid", str(server.pid)])
    assert p.returncode == 0, p.stdout + p.stderr
    assert "bad:" in p.stdout and "chat_stream" not in p.stdout, p.stdout
    assert "bad:oversize_body" not in p.stdout
    assert "rss (MB) at s:" in p.stdout and "bloomery-serve[%d]" % server.pid in p.stdout


def test_load_tool_mix_counts_what_is_wrong(tmp_path):
    """Against a server that answers 200 {} to everything, every kind is an error:
    the malformed requests were not refused, the answers are not completions."""
    import http.server
    import threading

    class Yes(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def answer(self):
            n = self.headers.get("Content-Length")
            if n and n.isdigit():
                self.rfile.read(int(n))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        do_GET = do_POST = answer

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Yes)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        p, out = run_tool(["--url", "http://127.0.0.1:%d" % srv.server_port, "--mix", "-c", "2",
                           "-d", "1", "--body-limit", "1000", "--timeout", "10", "--json"], timeout=60)
    finally:
        srv.shutdown()
    assert p.returncode == 1, p.stdout + p.stderr
    assert out["errors"] > 0 and out["requests"] == 0, out
    assert any(k.startswith("bad:") and v["errors"] for k, v in out["kinds"].items()), out["kinds"]
    assert any("expected 4" in m for m in out["error_messages"]), out["error_messages"]


def test_load_tool_resends_on_a_connection_the_server_closed(tmp_path):
    """A server that closes each connection after its streamed answer without a
    Connection: close header (as llama-server does): the next request on that
    connection fails before any answer, and goes again once on a fresh connection;
    counted as a reconnect, not an error, so the rate is the server's."""
    import http.server
    import threading

    class Once(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            n = self.headers.get("Content-Length")
            self.rfile.read(int(n) if n and n.isdigit() else 0)
            events = [{"content": "a", "stop": False}] * 3 + [{"content": "", "stop": True,
                                                              "timings": {"predicted_n": 3}}]
            body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            self.close_connection = True  # and say nothing of it

        def do_GET(self):  # /health
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "15")
            self.end_headers()
            self.wfile.write(b'{"status":"ok"}')

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Once)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        p, out = run_tool(["--url", "http://127.0.0.1:%d" % srv.server_port, "--mode", "native", "-c", "2",
                           "-d", "1", "-n", "3", "--json"], timeout=60)
    finally:
        srv.shutdown()
    assert p.returncode == 0, p.stdout + p.stderr
    assert out["errors"] == 0, out["error_messages"]
    assert out["requests"] >= 4 and out["tokens"] == 3 * out["requests"], out
    assert out["reconnects"] >= out["requests"] - 2, out


def test_load_tool_mix_flags():
    for args in (["--mix", "nothing=1"], ["--mix", "chat=-1"], ["--mix", "bad:nope=1"],
                 ["--rss-every", "5"], ["--server-pid", "999999999"]):
        p, _ = run_tool(["--url", "http://127.0.0.1:9", "-d", "1"] + args, timeout=30)
        assert p.returncode == 2, (args, p.stdout, p.stderr)


def test_load_tool_prefix_cache(servers):
    """--prefix-cache: the third prompt of each round starts from the first one's
    positions kept in host RAM (cache_n = the shared ids), the others from nothing;
    a server of several slots, and one without the cache, are told apart."""
    srv = servers.start(["-np", "1", "-c", "1024", "-t", "1"])
    cmd = [TOOL, "--url", srv.url, "--prefix-cache", "200", "--rounds", "2", "-n", "2", "--ignore-eos",
           "--json"]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    out = json.loads(p.stdout)
    assert out["prefix_tokens"] == 200 and len(out["rounds"]) == 2
    for g in out["rounds"]:
        assert g["cold"]["cache_n"] == 0 and g["other"]["cache_n"] == 0, g
        assert g["warm"]["cache_n"] == 200, g
        assert g["cold"]["prompt_n"] == 216 and g["warm"]["prompt_n"] == 16, g
        assert g["warm"]["ttft_ms"] > 0 and g["ratio"] > 0, g
    assert out["ratio_median"] is not None
    p = subprocess.run(cmd[:-1], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    assert p.returncode == 0 and "warm / cold time to first token" in p.stdout, p.stdout + p.stderr
    srv = servers.start(["-np", "1", "-c", "1024", "-t", "1", "-cram", "0"])
    p = subprocess.run([TOOL, "--url", srv.url, "--prefix-cache", "100", "--rounds", "1", "-n", "1", "--json"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert json.loads(p.stdout)["rounds"][0]["warm"]["cache_n"] == 0
    srv = servers.start(["-np", "2", "-c", "1024", "-t", "1"])
    p = subprocess.run([TOOL, "--url", srv.url, "--prefix-cache", "100", "--json"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=60)
    assert p.returncode == 1 and "-np 1" in json.loads(p.stdout)["error"], p.stdout
    p = subprocess.run([TOOL, "--url", srv.url, "--prefix-cache", "0"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=60)
    assert p.returncode == 2 and "--prefix-cache" in p.stderr
