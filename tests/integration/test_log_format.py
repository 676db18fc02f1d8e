"""--log-format json: every line the server and its children write is one JSON object
with the event's fields as members (quoted values unescaped), through a start, a
request, a killed worker's restart and a stop; a wrong format name is refused (2)."""
import json
import os
import signal
import subprocess
import time

import serverctl
from sse import post


def test_every_line_is_a_json_object(servers):
    srv = servers.start(["-np", "1", "-c", "512", "-t", "1", "--workers", "2", "--log-format", "json"])
    r = post(srv.url, "/completion", {"prompt": 'a "quoted" \u00e9 prompt', "n_predict": 2})
    assert r.status_code == 200, r.text
    pid = srv.child("bloomery-worker")
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while '"after":"restart"' not in srv.log(200000) and time.monotonic() < deadline:
        time.sleep(0.05)
    lines = [json.loads(line) for line in srv.log(200000).splitlines() if line.strip()]
    assert all({"ts", "level", "proc"} <= set(j) for j in lines), lines[:3]
    assert all(j["level"] in ("debug", "info", "warn", "error") for j in lines)
    events = {(j["proc"], j.get("event")) for j in lines}
    assert ("serve", "ready") in events and ("serve", "child_died") in events, events
    assert any(j["proc"].startswith("worker") for j in lines), "the children's lines are not there"
    ready = next(j for j in lines if j.get("event") == "ready" and j["proc"] == "serve" and "model" in j)
    assert ready["model"] == os.path.basename(srv.model)
    plan = [j for j in lines if j.get("event") == "plan"]
    assert plan and all("msg" in j for j in plan), plan
    config = next(j for j in lines if j.get("event") == "config")
    assert config["workers"] == "2" and config["slots"] == "1", config


def test_a_wrong_format_is_refused(tmp_path, model):
    p = subprocess.run([serverctl.program("bloomery-serve"), "-m", model, "--log-format", "xml",
                        "--port", str(serverctl.free_port())], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    assert "--log-format takes text or json, not 'xml'" in p.stderr


def test_start_screen_on_a_terminal_only(model, servers):
    """On a terminal the start shows the plan's report and, once ready, the address to
    open; into a pipe (or with --log-format json) only the log lines."""
    import pty
    import select
    port = serverctl.free_port()
    master, slave = pty.openpty()
    p = subprocess.Popen([serverctl.program("bloomery-serve"), "-m", model, "--port", str(port), "-np", "1",
                          "-c", "512", "-t", "1"], stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
    os.close(slave)
    out, deadline = b"", time.monotonic() + 60
    try:
        while b"ready: open" not in out and time.monotonic() < deadline:
            if select.select([master], [], [], 0.2)[0]:
                try:
                    out += os.read(master, 65536)
                except OSError:
                    break
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(30)
        os.close(master)
    text = out.decode("utf-8", "replace")
    assert "bloomery-serve: starting with this plan" in text, text
    assert "placement" in text and "fits: yes" in text, text
    assert "ready: open http://127.0.0.1:%d/" % port in text, text
    srv = servers.start(["-np", "1", "-c", "512", "-t", "1"])
    assert "starting with this plan" not in srv.log(100000) and "ready: open" not in srv.log(100000)
