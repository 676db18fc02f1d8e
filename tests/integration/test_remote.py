"""Stages on another host (bloomery-node, docs/deploy.md "Several hosts"): a hostfile
names a worker line of another host than the router's, whose node serves the stage
over CURVE links. The "other host" here is the loopback under another name
(localhost beside 127.0.0.1: the hostfile compares hosts as written), so the relay
and the node speak TCP as between two machines.

What is checked: the answers and log-probabilities of a remote stage are one
process's bit for bit (with and without the hosttier's rings on the links); a
remote worker killed mid-service is reported by the node, the set restarts and
serves again; a node with another secret, a node whose model file is another one
(a private mount namespace puts another file at the path: another model, or one of
the same size whose content differs), a secret file others may
read, and hostfile lines this version does not take are refused by name; layers= splits the
stages where it says, and threads= sets a stage's threads (or the hosttier's); without layers=, the split
follows each stage's threads and its host's CPUs as its node reports them.

A GPU worker line of another host: the node reports its host's CUDA devices with its
facts, here made up (a bloomery-worker beside a copy of bloomery-node answers
--list-devices with $FAKE_DEVICES and runs the real worker otherwise); the plan puts
the stage on the card the line names, the node's worker gets the card in its Plan and,
this build or machine having no such card, fails the start with its reason. A card
the node lacks, two cards on one line of another host, and host RAM beside that card
without a hosttier line of its host are refused by name. With that line (and the
node's worker running the card's stage on the CPU) the node starts a hosttier there
for the stage's routed experts in host RAM: the answers are one process's, and a
killed hosttier fails its stage and comes back with the set."""
import os
import re
import signal
import subprocess
import time

import pytest

import serverctl
from sse import get, post
from test_tier import child_metric

FAST = ["-np", "2", "-c", "1024", "-t", "1", "-tb", "1"]
PROMPTS = ["The smith heats the iron", "Once upon a time in the village"]


def secret_file(path, text=None, mode=0o600):
    with open(path, "w") as f:
        f.write(text or os.urandom(32).hex())
    os.chmod(path, mode)
    return str(path)


class Node:
    """A bloomery-node --listen on three free ports (PORT, PORT+1, PORT+2)."""

    def __init__(self, tmp_path, secret, wrap=(), cwd=None, port=None, exe=None, env=None, addr="127.0.0.1"):
        self.port = port or free_ports(3, addr)
        self.log_path = str(tmp_path / ("node-%d-%d.log" % (self.port, time.monotonic_ns())))
        cmd = list(wrap) + [exe or serverctl.program("bloomery-node"), "--listen",
                            "tcp://%s:%d" % (addr, self.port), "--secret", secret]
        self.log_file = open(self.log_path, "wb")
        e = dict(os.environ)
        e.update(env or {})
        self.proc = subprocess.Popen(cmd, stdout=self.log_file, stderr=self.log_file, stdin=subprocess.DEVNULL,
                                     cwd=cwd or str(tmp_path), env=e)
        deadline = time.monotonic() + 10
        while "event=node_listening" not in self.log() and time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log()
            time.sleep(0.02)
        assert "event=node_listening" in self.log(), self.log()

    def log(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def worker_pid(self):
        for pid, argv0, _ in serverctl.descendants(self.proc.pid):
            if argv0 == "bloomery-worker":
                return pid
        return None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log_file.close()
        assert self.worker_pid() is None


def free_ports(n, addr="127.0.0.1"):
    """A port p with p..p+n-1 free on addr (checked by binding each)."""
    import socket
    for _ in range(200):
        p = serverctl.free_port()
        if p + n > 65535:
            continue
        socks = []
        try:
            for i in range(n):
                s = socket.socket()
                s.bind((addr, p + i))
                socks.append(s)
            return p
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError("no %d free ports in a row" % n)


def hostfile(tmp_path, node_port, name="hosts"):
    path = tmp_path / name
    path.write_text("127.0.0.1 8090 router\n127.0.0.1 9000 worker\nlocalhost %d worker\n" % node_port)
    return str(path)


def greedy(url, prompt):
    r = post(url, "/completion", {"prompt": prompt, "n_predict": 8, "n_probs": 3, "temperature": 0,
                                  "ignore_eos": True, "return_tokens": True})
    assert r.status_code == 200, r.text
    j = r.json()
    return j["tokens"], [[(t["id"], t["logprob"]) for t in x["top_logprobs"]] for x in j["completion_probabilities"]]


@pytest.fixture
def nodes(tmp_path):
    started = []

    def make(secret, **kw):
        n = Node(tmp_path, secret, **kw)
        started.append(n)
        return n
    yield make
    for n in started:
        n.stop()


@pytest.mark.parametrize("hosttier", [False, True])
def test_a_remote_stage_same_as_one_process(servers, nodes, tmp_path, hosttier):
    secret = secret_file(tmp_path / "secret")
    node = nodes(secret)
    extra = ["-ot", "ffn_.*_exps=HOSTTIER"] if hosttier else []
    one = servers.start(FAST + extra)
    srv = servers.start(FAST + extra + ["--hostfile", hostfile(tmp_path, node.port), "--cluster-secret", secret])
    assert "event=relay_up node=tcp://localhost:%d rings=%d" % (node.port, 4 if hosttier else 2) in srv.log(100000)
    assert "event=session_started worker=worker1" in node.log()
    assert node.worker_pid() is not None
    for p in PROMPTS:
        assert greedy(srv.url, p) == greedy(one.url, p), p


def two_stages(servers, nodes, tmp_path, local, remote, n_layers=None, args=FAST):
    """A node, and two servers of the same model (of n_layers layers, or the session's):
    one process, and a hostfile's two worker lines, this host's with the options local
    and the node's with remote. Returns (one, the hostfile's server, the node)."""
    model = None
    if n_layers:
        model = serverctl.make_model(str(tmp_path / ("layers%d.gguf" % n_layers)), "--layers", str(n_layers))
    secret = secret_file(tmp_path / "secret")
    node = nodes(secret)
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 8090 router\n127.0.0.1 9000 worker %s\nlocalhost %d worker %s\n"
                     % (local, node.port, remote))
    one = servers.start(FAST, model=model)
    srv = servers.start(list(args) + ["--hostfile", str(hosts), "--cluster-secret", secret], model=model)
    return one, srv, node


def test_layers_given_in_the_hostfile_split_the_stages_unevenly(servers, nodes, tmp_path):
    """layers= puts one layer of four on the router's host and three under the node."""
    one, srv, node = two_stages(servers, nodes, tmp_path, "layers=0-1", "layers=1-4", n_layers=4)
    log = srv.log(100000)
    assert "event=plan stage 0: layers 0..0 on the CPU" in log, log
    assert "event=plan stage 1: layers 1..3 on the CPU" in log, log
    assert "event=ready layers=1..4" in node.log()
    # nothing to weigh: the node's probe answer carries no read rates (0.3 s it spares)
    assert re.search(r"event=probe_answered .*read_mbps_one=0 read_mbps_all=0 ", node.log()), node.log()
    for p in PROMPTS:
        assert greedy(srv.url, p) == greedy(one.url, p), p


def split(n_layers, weights):
    """common/plan.c's split by weight: each stage its rounded-down share (at least
    one), the layers left to the largest remainders (the first of equal ones)."""
    q = [n_layers * w / sum(weights) for w in weights]
    c = [max(1, int(x)) for x in q]
    while sum(c) < n_layers:
        c[max(range(len(c)), key=lambda i: (q[i] - c[i], -i))] += 1
    while sum(c) > n_layers:
        c[max((i for i in range(len(c)) if c[i] > 1), key=lambda i: (c[i] - q[i], -i))] -= 1
    return c


def test_without_layers_the_split_follows_threads_and_cpus(servers, nodes, tmp_path):
    """Without layers=, the router asks the node for its host's CPUs, memory and read
    rates before it plans, and splits the layers by the rate each stage's threads get
    (its threads capped by its CPUs times the one-thread rate, at most the rate of
    all): here threads=1 on the router's host and threads=3 under the node, over 8
    layers; the rates are measured, so the split expected is the one the logged
    rates give."""
    one, srv, node = two_stages(servers, nodes, tmp_path, "threads=1", "threads=3", n_layers=8)
    cpus = len(os.sched_getaffinity(0))
    log = srv.log(100000)
    assert "event=probe_answered host=" in node.log(), node.log()
    assert re.search(r"event=probe_answered host=\S+ cpus=%d .*read_mbps_one=[1-9]\d* read_mbps_all=[1-9]" % cpus,
                     node.log()), node.log()
    assert re.search(r"event=stage_host stage=1 host=localhost node=tcp://localhost:%d cpus=%d mem_available=[1-9]"
                     % (node.port, cpus), log), log
    rates = {}
    for m in re.finditer(r"event=stage_host stage=(\d) .* read_mbps_one=(\d+) read_mbps_all=(\d+) threads=(\d+)",
                         log):
        rates[int(m.group(1))] = [int(g) for g in m.group(2, 3, 4)]
    assert sorted(rates) == [0, 1] and rates[0][2] == 1 and rates[1][2] == 3, log
    first, _ = split(8, [min(a, min(t, cpus) * o) for o, a, t in (rates[0], rates[1])])
    assert "event=plan stage 0: layers 0..%d on the CPU" % (first - 1) in log, log
    assert "event=plan stage 1: layers %d..7 on the CPU" % first in log, log
    assert "event=ready layers=%d..8 threads=3 " % first in node.log(), node.log()
    assert greedy(srv.url, PROMPTS[0]) == greedy(one.url, PROMPTS[0])


def test_threads_given_in_the_hostfile_set_each_stage(servers, nodes, tmp_path):
    """threads= on a worker line sets that stage's threads for decode and prompt steps
    alike, over -t and -tb (3 here, which no stage runs): the router's stage runs 1,
    the node's 2, as each worker's event=ready says; the answers are one process's."""
    wide = [a for a in FAST if a not in ("-t", "-tb", "1")] + ["-t", "3", "-tb", "3"]
    assert wide == ["-np", "2", "-c", "1024", "-t", "3", "-tb", "3"]
    one, srv, node = two_stages(servers, nodes, tmp_path, "threads=1", "threads=2", args=wide)
    ready = [line for line in srv.log(100000).splitlines() if "event=ready layers=" in line]
    assert len(ready) == 1 and "worker0" in ready[0], ready
    assert " threads=1 threads_batch=1 " in ready[0], ready
    ready = [line for line in node.log().splitlines() if "event=ready layers=" in line]
    assert len(ready) == 1 and " threads=2 threads_batch=2 " in ready[0], ready
    for p in PROMPTS:
        assert greedy(srv.url, p) == greedy(one.url, p), p


def test_a_killed_remote_worker_is_reported_and_the_set_restarts(servers, nodes, tmp_path):
    secret = secret_file(tmp_path / "secret")
    node = nodes(secret)
    srv = servers.start(FAST + ["--hostfile", hostfile(tmp_path, node.port), "--cluster-secret", secret])
    want = greedy(srv.url, PROMPTS[0])
    pid = node.worker_pid()
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while "start=2" not in srv.log(100000) and time.monotonic() < deadline:
        time.sleep(0.05)
    log = srv.log(100000)
    assert re.search(r"event=child_error process=worker1 .*worker1 on \S+ killed by signal 9", log), log
    assert "event=cluster_ready workers=2 hosttier=0 start=2" in log, log
    srv.wait_healthy(30)
    assert greedy(srv.url, PROMPTS[0]) == want
    assert node.worker_pid() not in (None, pid)


def test_a_lost_host_gets_503_with_the_reason_until_it_is_back(servers, nodes, tmp_path):
    """The node itself goes (its host lost): the router keeps trying, answers 503 with
    the reason meanwhile (/health too), and serves again once a node is back."""
    import requests
    secret = secret_file(tmp_path / "secret")
    node = nodes(secret)
    port = node.port
    srv = servers.start(FAST + ["--hostfile", hostfile(tmp_path, port), "--cluster-secret", secret])
    want = greedy(srv.url, PROMPTS[0])
    node.proc.kill()
    node.proc.wait()
    deadline = time.monotonic() + 30
    r = None
    while time.monotonic() < deadline:
        r = requests.post(srv.url + "/completion", json={"prompt": "Hi", "n_predict": 2}, timeout=30)
        if r.status_code == 503:
            break
        time.sleep(0.2)
    assert r is not None and r.status_code == 503, (r and r.text, srv.log())
    assert "restarting" in r.json()["error"]["message"] and "the node at tcp://localhost:%d" % port in r.text, r.text
    # /health reads the server's view of the set, refreshed every 100 ms: it may lag
    # the 503 a generation route gave a moment earlier
    deadline = time.monotonic() + 2
    h = requests.get(srv.url + "/health", timeout=10)
    while h.status_code != 503 and time.monotonic() < deadline:
        time.sleep(0.05)
        h = requests.get(srv.url + "/health", timeout=10)
    assert h.status_code == 503 and "the node at" in h.text, h.text
    assert srv.proc.poll() is None, srv.log()
    again = Node(tmp_path, secret, port=port)
    try:
        srv.wait_healthy(60)
        assert greedy(srv.url, PROMPTS[0]) == want
    finally:
        again.stop()


def test_a_node_with_another_secret_is_refused(servers, nodes, tmp_path):
    """The start asks each node for its host's facts before it plans: a node of another
    cluster fails it there, before any worker starts."""
    node = nodes(secret_file(tmp_path / "theirs"))
    ours = secret_file(tmp_path / "ours")
    srv = servers.launch(FAST + ["--hostfile", hostfile(tmp_path, node.port), "--cluster-secret", ours])
    assert srv.proc.wait(60) == 1, srv.log()
    log = srv.log(100000)
    assert "event=start_failed" in log, log
    assert re.search(r"the node at tcp://localhost:%d.*(handshake|another cluster)" % node.port, log), log
    assert "event=session_started" not in node.log()


@pytest.mark.parametrize("other_kind", ["other_model", "same_size"])
def test_a_node_whose_model_file_differs_is_refused(servers, nodes, tmp_path, model, other_kind):
    """The node sees another file at the model's path (a private mount namespace
    binds one over it): its worker never loads it, and the error names both sizes
    and fingerprints. The other file is another model, or the same model of the
    same size with one byte of its last tensor changed (the end of the data is
    always in the fingerprint's sample)."""
    if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("no mount namespaces here")
    other = tmp_path / "other.gguf"
    if other_kind == "other_model":
        serverctl.make_model(str(other), "--layers", "3")
    else:
        data = bytearray(open(model, "rb").read())
        data[-1] ^= 0x40
        other.write_bytes(bytes(data))
        assert os.path.getsize(other) == os.path.getsize(model)
    secret = secret_file(tmp_path / "secret")
    script = 'mount --bind "$1" "$2" && shift 2 && exec "$@"'
    node = nodes(secret, wrap=["unshare", "-m", "sh", "-c", script, "sh", str(other), model])
    srv = servers.launch(FAST + ["--hostfile", hostfile(tmp_path, node.port), "--cluster-secret", secret])
    assert srv.proc.wait(60) == 1, srv.log()
    log = srv.log(100000)
    size = os.path.getsize(model)
    assert re.search(r"worker1 on \S+: %s differs from the router's \(another file or version of the model\): "
                     r"here %d bytes, fingerprint [0-9a-f]{12}; at the router %d bytes, fingerprint [0-9a-f]{12}" %
                     (re.escape(model), os.path.getsize(other), size), log), log
    here, there = re.search(r"fingerprint ([0-9a-f]{12}); at the router \d+ bytes, fingerprint ([0-9a-f]{12})",
                            log).groups()
    assert here != there
    assert "event=plan_refused" in node.log()
    assert "event=ready" not in node.log()  # its worker never loaded the file


def test_threads_on_the_hosttier_line(servers, tmp_path):
    """threads= on the hosttier line sets its expert pool's threads over -t (1 here), as
    its event=ready says; the answers are those of -t's pool."""
    (tmp_path / "hosts").write_text("127.0.0.1 8090 router\n127.0.0.1 9000 worker\n127.0.0.1 9100 hosttier threads=2\n")
    ot = ["-ot", "ffn_.*_exps=HOSTTIER"]
    one = servers.start(FAST + ot)
    srv = servers.start(FAST + ot + ["--hostfile", str(tmp_path / "hosts")])
    ready = [line for line in srv.log(100000).splitlines() if "event=ready workers=" in line]
    assert len(ready) == 1 and "hosttier" in ready[0] and " threads=2 " in ready[0], ready
    ready = [line for line in one.log(100000).splitlines() if "event=ready workers=" in line]
    assert len(ready) == 1 and " threads=1 " in ready[0], ready
    for p in PROMPTS:
        assert greedy(srv.url, p) == greedy(one.url, p), p


def test_names_label_the_processes_logs(servers, tmp_path):
    """name= on the router, worker and hosttier lines: each process logs under its
    line's name (the router's own lines too), and event=child_started ties the name to
    the process's tag."""
    (tmp_path / "hosts").write_text("127.0.0.1 8090 router name=front\n127.0.0.1 9000 worker name=stage-a\n"
                                    "127.0.0.1 9001 worker name=stage.b\n127.0.0.1 9100 hosttier name=ht_1\n")
    srv = servers.start(FAST + ["-ot", "ffn_.*_exps=HOSTTIER", "--hostfile", str(tmp_path / "hosts")])
    log = srv.log(100000)
    for tag, name in (("worker0", "stage-a"), ("worker1", "stage.b"), ("hosttier", "ht_1")):
        assert re.search(r"event=child_started process=%s name=%s pid=" % (tag, re.escape(name)), log), (name, log)
        assert re.search(r" %s event=" % re.escape(name), log), (name, log)
    assert re.search(r" front event=", log), log
    assert not re.search(r" (worker0|worker1) event=", log), log
    assert greedy(srv.url, PROMPTS[0])[0]


def test_refusals(servers, tmp_path):
    secret = secret_file(tmp_path / "secret")
    cases = [
        ("127.0.0.1 1 router\n127.0.0.1 2 worker 63\n", ["--cluster-secret", secret],
         r"hosts:2: GPU 63 of 127\.0\.0\.1: this host has (no CUDA device|CUDA)"),
        ("127.0.0.1 1 router\n127.0.0.1 2 worker threads=300\n", ["--cluster-secret", secret],
         r"hosts:2: threads=300: a worker runs at most 256"),
        ("127.0.0.1 1 router\n127.0.0.1 2 worker\n127.0.0.1 3 hosttier threads=300\n", [],
         r"hosts:3: threads=300: a hosttier runs at most 256"),
        ("127.0.0.1 1 router\nlocalhost 2 worker\n", [], r"need --cluster-secret"),
        ("127.0.0.1 1 router\nlocalhost 2 worker\nothers 9 hosttier\n", ["--cluster-secret", secret],
         r"hosts:3: a hosttier on others, where no worker line runs a stage"),
        ("127.0.0.1 1 router\n127.0.0.1 2 wrker\n", [], r"hosts:2: role 'wrker'"),
        ("127.0.0.1 1 router name=a\n127.0.0.1 2 worker name=a\n", [], r"hosts:2: name=a is also line 1's"),
        ("127.0.0.1 1 router\nlocalhost 2 worker\n", ["--cluster-secret", secret_file(tmp_path / "open", mode=0o644)],
         r"open.*(group|others)"),
    ]
    for text, extra, want in cases:
        (tmp_path / "hosts").write_text(text)
        srv = servers.launch(FAST + ["--hostfile", str(tmp_path / "hosts")] + extra)
        assert srv.proc.wait(60) == 1, (text, srv.log())
        assert re.search(want, srv.log(100000)), (text, srv.log())
    (tmp_path / "hosts").write_text("127.0.0.1 1 router\n127.0.0.1 2 worker\n")
    srv = servers.launch(FAST + ["--hostfile", str(tmp_path / "hosts"), "--workers", "2"])
    assert srv.proc.wait(60) == 1
    assert "--workers and --hostfile" in srv.log()


GB10 = "cuda 0 137438953472 130000000000 read_mbps=240000 Fake GB10"


def make_fake_node(d):
    """bloomery-node in folder d, its host's cards $FAKE_DEVICES: its worker answers
    --list-devices with them and runs the real worker for a stage."""
    return serverctl.fake_devices_bin(str(d), "bloomery-node", run_worker=True)


@pytest.fixture(scope="module")
def fake_node(tmp_path_factory):
    return make_fake_node(tmp_path_factory.mktemp("fakenode"))


def test_a_remote_gpu_line_gets_the_nodes_card(servers, nodes, tmp_path, fake_node):
    """A CPU line here and a GPU line of another host, whose node reports a GB10: the
    probe's answer carries the card, the plan puts the stage on it (the CPU stage takes
    what a card beside a thread leaves: one layer of four), the Plan the node's worker
    gets names it, and the worker, which has no such card, fails the start with its
    reason, exit 1."""
    if serverctl.gpu_present():
        pytest.skip("a real card here would take the made-up one's place")
    model = serverctl.make_model(str(tmp_path / "layers4.gguf"), "--layers", "4")
    secret = secret_file(tmp_path / "secret")
    node = nodes(secret, exe=fake_node, env={"FAKE_DEVICES": GB10})
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 8090 router\n127.0.0.1 9000 worker threads=1\nlocalhost %d worker 0\n" % node.port)
    srv = servers.launch(FAST + ["--hostfile", str(hosts), "--cluster-secret", secret], model=model)
    assert srv.proc.wait(60) == 1, srv.log()
    log = srv.log(100000)
    assert "event=probe_answered" in node.log() and " devices=1" in node.log(), node.log()
    assert re.search(r"event=stage_host stage=1 host=localhost node=tcp://localhost:%d .* device=CUDA0 "
                     r"card_free=130000000000 card_total=137438953472 card_name=\"Fake GB10\"" % node.port, log), log
    assert "event=plan stage 0: layers 0..0 on the CPU" in log, log
    assert "event=plan stage 1: layers 1..3 on CUDA0 (Fake GB10)" in log, log
    assert "event=session_started worker=worker1" in node.log(), node.log()
    # the node's worker was given the card: this build has no CUDA ("device: this build
    # has no CUDA") or this machine no card ("CUDA device 0 does not exist")
    assert re.search(r"event=child_error process=worker1 .*reason=\"worker 1: [^\"]*CUDA", log), log
    assert re.search(r"event=load_failed reason=worker 1: .*CUDA", log), log
    assert "event=ready" not in node.log()


def test_remote_gpu_lines_refused_by_name(servers, nodes, tmp_path, fake_node):
    """What the hostfile names that the node's host lacks, or that a node cannot serve,
    is refused at the start, naming the line, the host and the card: a GPU the node
    does not report, all on a host without one, two cards on one line of another host
    (its node serves one stage), layers= on a line of several GPUs here; host RAM beside
    another host's card without a hosttier line of that host (--cpu-moe); a host's
    hosttier too large for its memory."""
    secret = secret_file(tmp_path / "secret")
    one = nodes(secret, exe=fake_node, env={"FAKE_DEVICES": GB10})
    two = nodes(secret, exe=fake_node, env={"FAKE_DEVICES": GB10 + "\n" + GB10.replace("cuda 0", "cuda 1")})
    none = nodes(secret, exe=fake_node)
    head = "127.0.0.1 8090 router\n127.0.0.1 9000 worker\n"
    cases = [
        ("localhost %d worker 1\n" % one.port, [],
         r"hosts:3: GPU 1 of localhost: its node reports CUDA0 \(Fake GB10\)"),
        ("localhost %d worker all\n" % none.port, [], r"hosts:3: GPUS all on localhost: its node reports no CUDA"),
        ("localhost %d worker 0,1\n" % two.port, [],
         r"hosts:3: 2 GPUs of localhost on one line: its node serves one stage"),
        ("localhost %d worker all\n" % two.port, [], r"hosts:3: 2 GPUs of localhost on one line"),
        ("localhost %d worker 0\n" % one.port, ["--cpu-moe"],
         r"is on CUDA0 of localhost, another host than the router's, .* add a line 'localhost PORT hosttier'"),
        ("localhost %d worker 0\n" % one.port, ["-dev", "cuda0"], r"--device cuda0: with a hostfile"),
    ]
    for text, extra, want in cases:
        (tmp_path / "hosts").write_text(head + text)
        srv = servers.launch(FAST + ["--hostfile", str(tmp_path / "hosts"), "--cluster-secret", secret] + extra)
        assert srv.proc.wait(60) == 1, (text, srv.log())
        assert re.search(want, srv.log(100000)), (text, want, srv.log())
    (tmp_path / "hosts").write_text("127.0.0.1 8090 router\n127.0.0.1 9000 worker all layers=0-2\n")
    srv = servers.launch(FAST + ["--hostfile", str(tmp_path / "hosts")])
    assert srv.proc.wait(60) == 1
    assert re.search(r"hosts:2: (GPUS all on 127\.0\.0\.1: this host has no CUDA device|layers= on a line of)",
                     srv.log(100000)), srv.log()
    for n in (one, two, none):
        assert "event=session_started" not in n.log()  # nothing but the question


def test_node_arguments_and_secret_checked(tmp_path):
    node = serverctl.program("bloomery-node")
    p = subprocess.run([node, "--listen", "tcp://127.0.0.1:1"], capture_output=True, text=True)
    assert p.returncode == 2 and "usage" in (p.stdout + p.stderr).lower()
    p = subprocess.run([node, "--listen", "tcp://127.0.0.1:1", "--relay", "tcp://x:1", "--secret", "s"],
                       capture_output=True, text=True)
    assert p.returncode == 2
    loose = secret_file(tmp_path / "loose", mode=0o640)
    p = subprocess.run([node, "--listen", "tcp://127.0.0.1:5000", "--secret", loose], capture_output=True, text=True)
    assert p.returncode == 1 and "event=start_failed" in p.stderr, p.stderr
    short = secret_file(tmp_path / "short", text="abc")
    p = subprocess.run([node, "--listen", "tcp://127.0.0.1:5000", "--secret", short], capture_output=True, text=True)
    assert p.returncode == 1 and "fewer than the 32" in p.stderr, p.stderr
    good = secret_file(tmp_path / "good")
    p = subprocess.run([node, "--listen", "udp://127.0.0.1:5000", "--secret", good], capture_output=True, text=True)
    assert p.returncode == 1 and "tcp://HOST:PORT" in p.stderr, p.stderr
    p = subprocess.run([node, "--listen", "tcp://127.0.0.1:65534", "--secret", good], capture_output=True, text=True)
    assert p.returncode == 1 and "PORT 1..65533" in p.stderr, p.stderr


@pytest.fixture(scope="module")
def cards_node(tmp_path_factory):
    """bloomery-node whose host has $FAKE_DEVICES, its worker running what the plan
    puts on a card on the CPU, the real bloomery-hosttier beside it."""
    return serverctl.fake_devices_bin(str(tmp_path_factory.mktemp("cardsnode")), "bloomery-node", cards_as_cpu=True)


def hosttier_pid(node):
    for pid, argv0, _ in serverctl.descendants(node.proc.pid):
        if argv0 == "bloomery-hosttier":
            return pid
    return None


def node_hosttier_cluster(servers, nodes, tmp_path, cards_node, extra, model=None):
    """A CPU stage here (layers 0-1) and a card stage of another host (layers 2-3)
    whose host has a hosttier line: the model (made when not given), the server, the
    node."""
    if not model:
        model = serverctl.make_model(str(tmp_path / "layers4.gguf"), "--layers", "4")
    ht_line = "localhost 9100 hosttier threads=1 name=far-ht"
    secret = secret_file(tmp_path / "secret")
    node = nodes(secret, exe=cards_node, env={"FAKE_DEVICES": GB10})
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 8090 router\n127.0.0.1 9000 worker threads=1 layers=0-2\n"
                     "localhost %d worker 0 layers=2-4\n%s\n" % (node.port, ht_line))
    srv = servers.start(FAST + extra + ["--hostfile", str(hosts), "--cluster-secret", secret], model=model)
    return model, srv, node


def test_a_remote_card_stage_uses_the_hosttier_of_its_host(servers, nodes, tmp_path, cards_node):
    """--cpu-moe beside a card of another host whose host has a hosttier line: the
    node starts bloomery-hosttier there (its line's threads= and name=) on the stage's
    experts rings, which stay on that host (two links, not three); the router runs no
    hosttier; the answers are one CPU process's, token and top log-probability; its
    calls show in /metrics with the stage's counters (hosttier_expert_calls). Then
    -ot puts layer 0's experts in the router's hosttier as well: both run, each with
    its own layers, and the answers stay the same."""
    if serverctl.gpu_present():
        pytest.skip("a real card here would take the made-up one's place")
    model, srv, node = node_hosttier_cluster(servers, nodes, tmp_path, cards_node, ["--cpu-moe"])
    ref = servers.start(FAST, model=model)
    log = srv.log(100000)
    assert "event=relay_up node=tcp://localhost:%d rings=4 hosttier=node" % node.port in log, log
    assert "event=plan stage 1: layers 2..3 on CUDA0 (Fake GB10)" in log, log
    assert "event=child_started process=hosttier" not in log, log  # none on the router's host
    nlog = node.log()
    assert "event=session_started worker=worker1 rings=4 hosttier=here" in nlog, nlog
    assert re.search(r"event=child_started process=hosttier stage=1 pid=\d+", nlog), nlog
    assert re.search(r" far-ht event=ready workers=1 threads=1 ", nlog), nlog
    assert "event=hosttier_ready stage=worker1" in nlog, nlog
    assert hosttier_pid(node)
    p = get(srv.url, "/props").json()["placement"]
    assert [s["node_hosttier"] for s in p["stages"]] == [False, True], p
    assert p["hosttier"] is False and p["host_expert_bytes"] == 0 and p["node_host_expert_bytes"] > 0, p
    assert p["stages"][1]["host_expert_bytes"] == p["node_host_expert_bytes"], p
    for prompt in PROMPTS:
        assert greedy(srv.url, prompt) == greedy(ref.url, prompt), prompt
    # its calls in the router's /metrics, with the stage's counters
    assert child_metric(srv.url, "child_hosttier_expert_calls", "worker1") > 0
    srv.stop()
    node.stop()

    model, srv, node = node_hosttier_cluster(servers, nodes, tmp_path, cards_node,
                                             ["-ot", r"blk\.0\.ffn_.*_exps=HOSTTIER", "--cpu-moe"], model)
    log = srv.log(100000)
    assert "event=child_started process=hosttier" in log, log
    p = get(srv.url, "/props").json()["placement"]
    assert p["host_expert_layers"] == [0, 2, 3] and p["hosttier"] is True, p
    assert 0 < p["host_expert_bytes"] < p["node_host_expert_bytes"], p
    for prompt in PROMPTS:
        assert greedy(srv.url, prompt) == greedy(ref.url, prompt), prompt


def test_a_killed_node_hosttier_fails_the_stage_and_the_set_restarts(servers, nodes, tmp_path, cards_node):
    """kill -9 of the hosttier a node started: the node reports it as the stage's
    failure, naming the host, the set restarts (a new session, a new hosttier) and
    the next answer is the one before."""
    if serverctl.gpu_present():
        pytest.skip("a real card here would take the made-up one's place")
    _, srv, node = node_hosttier_cluster(servers, nodes, tmp_path, cards_node, ["--cpu-moe"])
    before = greedy(srv.url, PROMPTS[0])
    pid = hosttier_pid(node)
    assert pid, node.log()
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and "hosttier on " not in srv.log(100000):
        time.sleep(0.1)
    assert re.search(r"worker1's hosttier on [^ ]+ killed by signal 9", srv.log(100000)), srv.log(100000)
    deadline = time.monotonic() + 60
    new = None
    while time.monotonic() < deadline:
        new = hosttier_pid(node)
        if new and new != pid and "event=hosttier_ready" in node.log().split("killed by signal 9")[-1]:
            break
        time.sleep(0.1)
    assert new and new != pid, node.log()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and get(srv.url, "/health").status_code != 200:
        time.sleep(0.1)
    assert greedy(srv.url, PROMPTS[0]) == before

