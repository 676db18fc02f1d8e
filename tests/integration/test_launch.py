"""A model over three "hosts" on this machine: two network namespaces, each joined to
the root namespace by a veth pair (with netem delay where the kernel has it, to stand
for a real link), each running a CPU stage under its node, and the router in the root
namespace; every process started by deploy/bloomery-launch from one hostfile, as on a
real cluster. The answers are one process's bit for bit; SIGTERM to a launcher stops
what it started; a node launched with another secret keeps the router from starting.
Needs root and `ip netns` (skipped otherwise). Also: bloomery-launch on one host, and
its refusals."""
import os
import re
import signal
import subprocess
import time

import pytest

import serverctl
from test_remote import FAST, PROMPTS, greedy, secret_file

ROOT = serverctl.ROOT
LAUNCH = os.path.join(ROOT, "deploy", "bloomery-launch")
BIN = os.path.dirname(serverctl.program("bloomery-serve"))


def run(*cmd, check=True):
    p = subprocess.run(list(cmd), capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError("%s: %s" % (" ".join(cmd), p.stderr))
    return p


def netns_ok():
    if os.geteuid() != 0:
        return False
    name = "blt-probe-%d" % os.getpid()
    if run("ip", "netns", "add", name, check=False).returncode != 0:
        return False
    run("ip", "netns", "del", name, check=False)
    return True


class Launch:
    """One bloomery-launch, in a namespace (ns) or the root one."""

    def __init__(self, tmp_path, args, ns=None, tag="launch"):
        self.log_path = str(tmp_path / ("%s.log" % tag))
        cmd = ([] if ns is None else ["ip", "netns", "exec", ns]) + [LAUNCH, "--bin", BIN] + args
        self.f = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self.f, stderr=self.f, stdin=subprocess.DEVNULL, cwd=ROOT)

    def log(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def wait_ready(self, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if "event=launch_ready" in self.log():
                return
            if self.proc.poll() is not None:
                raise AssertionError("launch exited %s:\n%s" % (self.proc.returncode, self.log()[-4000:]))
            time.sleep(0.05)
        raise AssertionError("launch not ready:\n" + self.log()[-4000:])

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.f.close()
        return self.proc.returncode


@pytest.fixture
def hosts():
    """Two namespaces, 10.77.N.2 each, joined to the root namespace's 10.77.N.1."""
    if not netns_ok():
        pytest.skip("needs root and network namespaces")
    tag = os.getpid() % 10000
    made, delay = [], False
    for i in (1, 2):
        ns, a, b = "blt%d-%d" % (tag, i), "blt%da%d" % (tag, i), "blt%db%d" % (tag, i)
        run("ip", "netns", "add", ns)
        made.append((ns, a))
        run("ip", "link", "add", a, "type", "veth", "peer", "name", b)
        run("ip", "link", "set", b, "netns", ns)
        run("ip", "addr", "add", "10.77.%d.1/24" % i, "dev", a)
        run("ip", "link", "set", a, "up")
        run("ip", "netns", "exec", ns, "ip", "addr", "add", "10.77.%d.2/24" % i, "dev", b)
        run("ip", "netns", "exec", ns, "ip", "link", "set", b, "up")
        run("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        # 1 ms each way where the kernel has netem
        if run("tc", "qdisc", "add", "dev", a, "root", "netem", "delay", "1ms", check=False).returncode == 0:
            run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", b, "root", "netem", "delay", "1ms",
                check=False)
            delay = True
    yield [ns for ns, _ in made], delay
    for ns, a in made:
        run("ip", "link", "del", a, check=False)
        run("ip", "netns", "del", ns, check=False)


def hostfile(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("10.77.1.1 8090 router\n10.77.1.2 9000 worker\n10.77.2.2 9000 worker\n")
    return str(path)


def test_two_hosts_through_launch_same_as_one_process(hosts, servers, model, tmp_path):
    (ns1, ns2), delay = hosts
    secret = secret_file(tmp_path / "secret")
    hf = hostfile(tmp_path)
    one = servers.start(FAST)
    want = {p: greedy(one.url, p) for p in PROMPTS}
    nodes = [Launch(tmp_path, ["--hostfile", hf, "--secret", secret], ns=ns, tag=ns) for ns in (ns1, ns2)]
    for n in nodes:
        n.wait_ready()
    port = serverctl.free_port()
    router = Launch(tmp_path, ["--hostfile", hf, "--secret", secret, "--this-host", "10.77.1.1", "--",
                               "-m", model, "--host", "127.0.0.1", "--port", str(port)] + FAST, tag="router")
    try:
        router.wait_ready(120)
        url = "http://127.0.0.1:%d" % port
        for p in PROMPTS:
            assert greedy(url, p) == want[p], p
        log = router.log()
        assert "event=relay_up node=tcp://10.77.1.2:9000" in log and "event=relay_up node=tcp://10.77.2.2:9000" in log
        for n in nodes:
            assert "event=session_started worker=worker" in n.log(), n.log()
    finally:
        assert router.stop() == 0, router.log()[-3000:]
        codes = [n.stop() for n in nodes]
    assert "event=launch_stopped" in router.log()
    assert codes == [0, 0], [n.log()[-2000:] for n in nodes]
    assert not [c for c in serverctl.descendants(router.proc.pid)]
    print("netem delay: %s" % delay)


def test_a_node_with_another_secret_keeps_the_router_down(hosts, model, tmp_path):
    (ns1, ns2), _ = hosts
    hf = hostfile(tmp_path)
    ours, theirs = secret_file(tmp_path / "ours"), secret_file(tmp_path / "theirs")
    nodes = [Launch(tmp_path, ["--hostfile", hf, "--secret", s], ns=ns, tag=ns) for ns, s in ((ns1, ours), (ns2, theirs))]
    for n in nodes:
        n.wait_ready()
    port = serverctl.free_port()
    router = Launch(tmp_path, ["--hostfile", hf, "--secret", ours, "--this-host", "10.77.1.1", "--",
                               "-m", model, "--port", str(port)] + FAST, tag="router")
    try:
        assert router.proc.wait(120) == 1, router.log()
        log = router.log()
        assert "event=launch_failed" in log, log
        assert re.search(r"the node at tcp://10\.77\.2\.2:9000", log), log
    finally:
        router.stop()
        for n in nodes:
            n.stop()


def test_one_host(model, tmp_path):
    port = serverctl.free_port()
    launch = Launch(tmp_path, ["-m", model, "--port", str(port)] + FAST)
    try:
        launch.wait_ready(60)
        assert greedy("http://127.0.0.1:%d" % port, PROMPTS[0])
    finally:
        assert launch.stop() == 0, launch.log()
    assert "event=launch_stopped" in launch.log()


def test_refusals(model, tmp_path):
    def launch(*args):
        return subprocess.run([LAUNCH, "--bin", BIN] + list(args), capture_output=True, text=True, timeout=60)
    p = launch("--hostfile", str(tmp_path / "none"))
    assert p.returncode == 2 and "--secret" in p.stderr
    p = launch("--hostfile", str(tmp_path / "none"), "--secret", "s")
    assert p.returncode == 2 and "cannot read the hostfile" in p.stderr
    (tmp_path / "h").write_text("10.9.9.9 1 router\n10.9.9.8 2 worker\n")
    p = launch("--hostfile", str(tmp_path / "h"), "--secret", "s")
    assert p.returncode == 2 and "no line of" in p.stderr
    p = launch("--wait", "soon", "-m", model)
    assert p.returncode == 2 and "whole seconds" in p.stderr
    p = launch("-m", str(tmp_path / "missing.gguf"), "--port", str(serverctl.free_port()))
    assert p.returncode == 1 and "event=launch_failed" in p.stderr, p.stderr
