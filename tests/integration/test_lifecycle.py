"""The server's processes under stress: kill -9 of bloomery-worker or bloomery-hosttier
during a request (the request ends with an error naming the process within about a
second, /health recovers, the next request succeeds), a worker that hangs (SIGSTOP:
the step times out after -to, the set restarts), SIGTERM and SIGINT (open
streams end cleanly, exit 0, nothing left behind), and clients that leave mid-request
(their slot is freed)."""
import os
import re
import signal
import subprocess
import threading
import time

import pytest
import requests

from sse import get, iter_events, post

LONG = {"prompt": "Once upon a time, in a village by the sea,", "n_predict": 4000,
        "ignore_eos": True, "temperature": 0}
# how long after the kill the request may take to end (issue: noticed within a second)
DEATH_NOTICED_S = 2.0


def open_stream(url, path="/completion", body=None):
    r = requests.post(url + path, json=dict(body or LONG, stream=True), stream=True, timeout=15)
    assert r.status_code == 200, r.text
    return r, iter_events(r)


def take(events, n):
    got = []
    for ev in events:
        got.append(ev)
        assert ev.error is None, "error before the test did anything: %r" % ev
        if len(got) == n:
            return got
    raise AssertionError("the stream ended after %d events: %r" % (len(got), got))


def drain(events):
    """Reads the rest of a stream: (events, None) or (events, the transport error)."""
    rest = []
    try:
        for ev in events:
            rest.append(ev)
    except (requests.exceptions.ChunkedEncodingError, requests.exceptions.ConnectionError,
            UnicodeDecodeError) as e:
        return rest, e
    return rest, None


def wait_health(url, timeout=30):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            r = get(url, "/health", timeout=2)
            last = (r.status_code, r.text)
            if r.status_code == 200:
                return time.monotonic()
            if r.status_code == 503:
                assert r.json()["error"]["code"] == 503
        except requests.RequestException as e:
            last = e
        time.sleep(0.1)
    raise AssertionError("/health did not recover within %d s: %r" % (timeout, last))


def busy_slots(url):
    return [s["id"] for s in get(url, "/slots").json() if s["is_processing"]]


@pytest.fixture(scope="module")
def life(module_servers):
    """A server of its own: these tests kill its children."""
    # the routed experts in the hosttier, so that both kinds of child can be killed
    return module_servers.start(["-np", "1", "-c", "4096", "-t", "1", "-tb", "1", "-ot", "ffn_.*_exps=HOSTTIER"])


GREEDY = {"prompt": "The same question before and after", "n_predict": 8, "temperature": 0,
          "ignore_eos": True, "return_tokens": True, "cache_prompt": False}


def kill_child_during_stream(srv, argv0, word):
    pid = srv.child(argv0)
    assert pid, "no %s below the server (children: %r)" % (argv0, srv.children())
    before = post(srv.url, "/completion", GREEDY)
    assert before.status_code == 200, before.text
    r, events = open_stream(srv.url)
    with r:
        take(events, 3)
        os.kill(pid, signal.SIGKILL)
        t_kill = time.monotonic()
        rest, broken = drain(events)
        t_end = time.monotonic()
    assert broken is None, "the stream was cut instead of ending with an error: %r" % broken
    errors = [ev.error for ev in rest if ev.error is not None]
    assert errors, "the stream ended without an error event: %r" % rest[-3:]
    msg = errors[-1].get("message", "")
    assert word in msg.lower(), "the error does not name the %s: %r" % (word, errors[-1])
    assert errors[-1].get("code") == 500, errors[-1]
    assert t_end - t_kill < DEATH_NOTICED_S, "the stream took %.2f s to end after the kill" % (t_end - t_kill)
    wait_health(srv.url)
    b = post(srv.url, "/completion", {"prompt": "After the restart", "n_predict": 4,
                                      "ignore_eos": True})
    assert b.status_code == 200, "the request after the restart failed: %s" % b.text
    assert b.json()["timings"]["predicted_n"] == 4
    new = srv.child(argv0)
    assert new and new != pid, "the %s was not restarted (pid %r)" % (argv0, new)
    # the restarted set computes what the first one did
    after = post(srv.url, "/completion", GREEDY)
    assert after.status_code == 200, after.text
    assert after.json()["tokens"] == before.json()["tokens"]


@pytest.mark.lifecycle
def test_kill_worker_during_stream(life):
    kill_child_during_stream(life, "bloomery-worker", "worker")


@pytest.mark.lifecycle
def test_kill_hosttier_during_stream(life):
    kill_child_during_stream(life, "bloomery-hosttier", "hosttier")


def signal_worker_during_plain_request(srv, sig):
    """Sends sig to the worker while a long plain request runs: (worker pid, the
    response, seconds from the signal to the answer)."""
    pid = srv.child("bloomery-worker")
    assert pid
    out = {}

    def send():
        out["r"] = post(srv.url, "/completion", LONG, timeout=30)
        out["t"] = time.monotonic()

    th = threading.Thread(target=send)
    th.start()
    deadline = time.monotonic() + 10
    while not busy_slots(srv.url):
        assert time.monotonic() < deadline, "the request never took a slot"
        time.sleep(0.02)
    time.sleep(0.2)
    os.kill(pid, sig)
    t_sig = time.monotonic()
    th.join(30)
    return pid, out["r"], out["t"] - t_sig


@pytest.mark.lifecycle
def test_kill_worker_during_plain_request(life):
    _, r, took = signal_worker_during_plain_request(life, signal.SIGKILL)
    assert r.status_code == 500, r.text[:300]
    assert "worker" in r.json()["error"]["message"].lower(), r.text
    assert took < DEATH_NOTICED_S
    wait_health(life.url)
    assert post(life.url, "/completion", {"prompt": "again", "n_predict": 2}).status_code == 200


@pytest.mark.lifecycle
def test_kill_worker_while_idle(life):
    """A worker that dies with no request running is replaced, and the next request,
    the first on the new processes, succeeds (the death is nobody's error)."""
    wait_health(life.url)
    r = post(life.url, "/completion", GREEDY)
    assert r.status_code == 200, r.text[:300]
    before = r.json()["tokens"]
    pid = life.child("bloomery-worker")
    assert pid
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while life.child("bloomery-worker") in (None, pid):
        assert time.monotonic() < deadline, "the dead worker was not replaced"
        time.sleep(0.05)
    wait_health(life.url)
    r = post(life.url, "/completion", GREEDY)
    assert r.status_code == 200, r.text[:300]
    assert r.json()["tokens"] == before


@pytest.fixture(scope="module")
def short_timeout(module_servers):
    """A server whose steps may take 2 s (-to 2): these tests stop its worker."""
    return module_servers.start(["-np", "1", "-c", "4096", "-t", "1", "-tb", "1", "-to", "2"])


@pytest.mark.lifecycle
def test_hung_worker_is_restarted(short_timeout):
    """A worker that stops answering without dying (SIGSTOP) fails the request in the
    step with a 500 after the timeout; the set restarts and the next request works."""
    srv = short_timeout
    pid, r, took = signal_worker_during_plain_request(srv, signal.SIGSTOP)
    assert r.status_code == 500, r.text[:300]
    assert "no answer" in r.json()["error"]["message"], r.text
    assert 1.5 < took < 2.0 + DEATH_NOTICED_S, "ended %.2f s after the stop" % took
    wait_health(srv.url)
    assert post(srv.url, "/completion", {"prompt": "again", "n_predict": 2}).status_code == 200
    new = srv.child("bloomery-worker")
    assert new and new != pid, "the stopped worker was not replaced (pid %r)" % new
    with pytest.raises(ProcessLookupError):  # killed, not left stopped
        for _ in range(50):
            os.kill(pid, 0)
            time.sleep(0.1)


@pytest.mark.lifecycle
def test_sigterm_during_stream(servers):
    srv = servers.start(["-np", "2", "-c", "4096", "-t", "1"])
    r, events = open_stream(srv.url, "/v1/chat/completions",
                            {"messages": [{"role": "user", "content": "Tell a long story."}],
                             "max_tokens": 4000, "ignore_eos": True})
    r2, events2 = open_stream(srv.url)
    with r, r2:
        take(events, 3)
        take(events2, 3)
        srv.tree = srv.children()
        srv.proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        rest, broken = drain(events)
        rest2, broken2 = drain(events2)
        t_end = time.monotonic()
    assert broken is None and broken2 is None, "streams were cut: %r %r" % (broken, broken2)
    assert t_end - t0 < 5, "streams took %.1f s to end after SIGTERM" % (t_end - t0)
    # the OpenAI stream ends as a stream does: a last chunk with its finish_reason
    # and [DONE], or an error event (503, shutting down) as the last event
    assert rest, "the chat stream ended without a last event"
    if rest[-1].done:
        last = rest[-2]
        assert last.error is not None or any(c.get("finish_reason") for c in last.json()["choices"]), last
    else:
        assert rest[-1].error is not None, "the chat stream ended without [DONE] or an error: %r" % rest[-3:]
        assert rest[-1].error.get("code") == 503, rest[-1]
    # the native stream ends with a stop:true event or an error event
    assert rest2, "the /completion stream ended without a last event"
    assert rest2[-1].error is not None or rest2[-1].json().get("stop") is True, rest2[-1]
    try:
        rc = srv.proc.wait(15)
    except Exception:
        srv.kill()
        pytest.fail("the server did not exit within 15 s of SIGTERM:\n" + srv.log())
    assert rc == 0, "exit status %r after SIGTERM:\n%s" % (rc, srv.log())
    problems = srv.check_exit()
    assert not problems, problems


@pytest.mark.lifecycle
def test_sigint_idle(servers):
    srv = servers.start(["-np", "1", "-c", "512", "-t", "1", "-ot", "ffn_.*_exps=HOSTTIER"])
    srv.tree = srv.children()
    assert any(n == "bloomery-worker" for _, n, _ in srv.tree), srv.tree
    assert any(n == "bloomery-hosttier" for _, n, _ in srv.tree), srv.tree
    srv.proc.send_signal(signal.SIGINT)
    assert srv.proc.wait(15) == 0, srv.log()
    assert not srv.check_exit()
    # stops accepting: the port is closed
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(srv.url + "/health", timeout=2)


def wait_slots_free(url, timeout):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if not busy_slots(url):
            return time.monotonic() - t0
        time.sleep(0.05)
    raise AssertionError("slots still busy %.1f s after the clients left: %r" % (timeout, get(url, "/slots").json()))


def test_disconnect_mid_stream_frees_slot(server):
    url = server.url
    wait_slots_free(url, 10)
    r1, e1 = open_stream(url)
    r2, e2 = open_stream(url, "/v1/chat/completions",
                         {"messages": [{"role": "user", "content": "Go on and on."}],
                          "max_tokens": 4000, "ignore_eos": True})
    take(e1, 2)
    take(e2, 2)
    assert sorted(busy_slots(url)) == [0, 1]
    r1.close()
    r2.close()
    wait_slots_free(url, 1.5)
    t0 = time.monotonic()
    r = post(url, "/completion", {"prompt": "a new request", "n_predict": 3, "ignore_eos": True})
    assert r.status_code == 200
    assert time.monotonic() - t0 < 5
    # each stream whose client left is logged, as plain requests are
    log = server.log(200000)
    for path in ("/completion", "/v1/chat/completions"):
        assert re.search(r"event=client_gone path=%s reason=\w+ streaming=1" % re.escape(path),
                         log), log[-3000:]


def test_disconnect_plain_request_frees_slot(url):
    wait_slots_free(url, 10)
    with pytest.raises(requests.exceptions.ReadTimeout):
        requests.post(url + "/completion", json=LONG, timeout=(5, 0.5))
    wait_slots_free(url, 1.5)
    m = get(url, "/metrics").text
    assert re.search(r"^llamacpp:requests_processing\s+0(\.0*)?$", m, re.M), m


def _start_time(pid):
    with open("/proc/%d/stat" % pid) as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


@pytest.mark.lifecycle
def test_stale_runtime_folders_are_removed_at_start(servers):
    """A SIGKILLed router leaves its folder of control sockets; the next server removes
    the folders of servers that no longer run (by pid and start time, so a reused pid
    does not keep a folder alive) and leaves those of live ones."""
    import pathlib
    import shutil
    import tempfile
    # a short base: a unix socket path holds 107 bytes
    tmp_path = pathlib.Path(tempfile.mkdtemp(prefix="blrt-", dir="/tmp"))
    try:
        _stale_runtime_folders(servers, tmp_path)
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


def _stale_runtime_folders(servers, tmp_path):
    env = {"XDG_RUNTIME_DIR": str(tmp_path)}
    killed = servers.start(["-np", "1", "-c", "512", "-t", "1"], env=env)
    killed.tree = killed.children()
    left = [p for p in os.listdir(tmp_path) if p.startswith("bloomery-serve-%d-" % killed.pid)]
    assert len(left) == 1, os.listdir(tmp_path)
    killed.kill()
    assert os.path.isdir(tmp_path / left[0]), "the killed server's folder is already gone"

    me = os.getpid()
    dead = subprocess.Popen(["true"])
    dead.wait()
    fakes = {
        "bloomery-serve-%d-aaaaaa" % dead.pid: "%d 123\n" % dead.pid,          # gone
        "bloomery-serve-%d-bbbbbb" % me: "%d %d\n" % (me, _start_time(me) + 1),  # pid reused
        "bloomery-serve-%d-cccccc" % me: "%d %d\n" % (me, _start_time(me)),      # alive
        "bloomery-serve-%d-dddddd" % me: None,                                   # alive, starting
        "bloomery-serve-%d-eeeeee" % dead.pid: None,                             # gone, starting
    }
    for name, owner in fakes.items():
        (tmp_path / name).mkdir(mode=0o700)
        if owner is not None:
            (tmp_path / name / "owner").write_text(owner)
    # a draft model's control folder inside a gone server's, with a socket file in it;
    # a link out of the folder is removed, never followed
    (tmp_path / ("bloomery-serve-%d-aaaaaa" % dead.pid) / "draft").mkdir(mode=0o700)
    (tmp_path / ("bloomery-serve-%d-aaaaaa" % dead.pid) / "draft" / "x.sock").write_text("")
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "file").write_text("kept")
    os.symlink(str(keep), str(tmp_path / ("bloomery-serve-%d-aaaaaa" % dead.pid) / "link"))
    srv = servers.start(["-np", "1", "-c", "512", "-t", "1"], env=env)
    have = set(os.listdir(tmp_path))
    assert left[0] not in have, have
    assert "bloomery-serve-%d-aaaaaa" % dead.pid not in have, have
    assert "bloomery-serve-%d-bbbbbb" % me not in have, have
    assert "bloomery-serve-%d-eeeeee" % dead.pid not in have, have
    assert "bloomery-serve-%d-cccccc" % me in have, have
    assert "bloomery-serve-%d-dddddd" % me in have, have
    assert "event=runtime_dir_stale" in srv.log(100000), srv.log()
    assert "event=runtime_dir_left" not in srv.log(100000), srv.log()
    assert (keep / "file").read_text() == "kept"
    mine = [p for p in have if p.startswith("bloomery-serve-%d-" % srv.pid)]
    assert len(mine) == 1, have
    with open(tmp_path / mine[0] / "owner") as f:
        pid, start = f.read().split()
    assert int(pid) == srv.pid and int(start) == _start_time(srv.pid)
    assert not srv.stop(), srv.log()
    assert not any(p.startswith("bloomery-serve-%d-" % srv.pid) for p in os.listdir(tmp_path))
