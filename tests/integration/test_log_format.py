"""--log-format json: every line the server and its children write is one JSON object
with the event's fields as members (quoted values unescaped), through a start, a
request, a killed worker's restart and a stop; a wrong format name is refused (2)."""
import json
import os
import re
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
    """On a terminal the start shows the plan's report, a loading bar that ends at
    100%, the kernels each process runs and, once ready, the address to open; into a
    pipe (or with --log-format json) only the log lines, the loading progress as
    event lines with rate and time left."""
    port = serverctl.free_port()
    text = serverctl.run_on_terminal([serverctl.program("bloomery-serve"), "-m", model, "--port", str(port),
                                      "-np", "1", "-c", "512", "-t", "1"], b"ready: open")
    assert "bloomery-serve: starting with this plan" in text, text
    assert "placement" in text and "fits: yes" in text, text
    assert "ready: open http://127.0.0.1:%d/" % port in text, text
    assert re.search(r"loading \[#+\] 100%  [0-9.]+ [KMG]iB in [0-9.:]+( s)?", text), text
    assert re.search(r"kernels\r?\n  worker0: CPU (ref|avx2|avx512)\r?\n", text), text
    # the bar is a status line: every log line erases it first
    assert "\r\x1b[K" in text
    # no intermediate progress line on a terminal (the bar shows it)
    assert len(re.findall(r"event=load_progress process=worker0 stage=weights", text)) <= 2, text
    srv = servers.start(["-np", "1", "-c", "512", "-t", "1"])
    log = srv.log(100000)
    assert "starting with this plan" not in log and "ready: open" not in log
    assert "\x1b" not in log
    assert re.search(r"event=load_progress process=worker0 stage=weights done=(\d+) total=\1 rate_mib_s=[0-9.]+ "
                     r"eta_s=0\.0", log), log
    assert re.search(r'event=child_ready process=worker0 pid=\d+ kernels="CPU (ref|avx2|avx512)"', log), log
