"""bloomery-serve --dry-run: the plan a start would make, printed before anything
loads. It exits 0 with the machine, the model, the placement, the context and
"fits: yes"; it opens no port, starts no worker (bloomery-worker runs only as
--list-devices, the device probe), makes no folder and reads the weights of no
file; its numbers are those the real start logs (event=plan) and shows in /props;
what the real start refuses it refuses with the same status and reason."""
import ctypes
import os
import re
import shutil
import socket
import subprocess
import time

import pytest

import serverctl
from sse import get

SECTIONS = ("machine\n", "model\n", "placement\n", "context\n", "fits: yes\n")


def serve(args, env=None, exe=None, timeout=30):
    """Runs bloomery-serve to its end: (status, stdout, stderr, seconds, pid)."""
    e = dict(os.environ)
    e.update(env or {})
    t0 = time.monotonic()
    p = subprocess.Popen([exe or serverctl.program("bloomery-serve")] + list(args), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, errors="replace", env=e)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for pid, _, _ in serverctl.descendants(p.pid):
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        p.kill()
        out, err = p.communicate()
        pytest.fail("bloomery-serve %s was still running after %d s:\n%s%s" % (" ".join(args), timeout, out, err))
    return p.returncode, out, err, time.monotonic() - t0, p.pid


def events(log, name):
    """The text of each `event=NAME ...` log line, without its time and level."""
    return [line[line.index("event=" + name):] for line in log.splitlines() if "event=" + name in line]


def failure(log):
    """What a failed start says: its start_failed lines and its plain messages."""
    return events(log, "start_failed") + [l for l in log.splitlines() if l.startswith("bloomery-serve:")]


def size_str(b):
    """The report's sizes: the plan's MiB / GiB, KiB and bytes below a MiB."""
    if b >= 1 << 30:
        return "%.2f GiB" % (b / (1 << 30))
    if b >= 1 << 20:
        return "%.1f MiB" % (b / (1 << 20))
    if b >= 1024:
        return "%.1f KiB" % (b / 1024)
    return "%d B" % b


def to_bytes(s):
    num, unit = s.split()
    return float(num) * {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[unit]


def stages(report):
    """The placement table's stage rows: {index: (device, layers, [six sizes or None])}."""
    rows = {}
    section = report.split("placement\n", 1)[1].split("\n\n", 1)[0]
    for line in section.splitlines():
        m = re.match(r"^\s+(\d+)\s+(CPU|CUDA\d+)\s+(\S+)\s+(.*)$", line)
        if not m:
            continue
        cells = re.findall(r"(?:^|\s)(-|\d+(?:\.\d+)? (?:B|KiB|MiB|GiB))(?=\s|$)", m.group(4))
        assert len(cells) == 6, line
        rows[int(m.group(1))] = (m.group(2), m.group(3), [None if c == "-" else c for c in cells])
    return rows


@pytest.fixture(scope="module")
def fake_bin(tmp_path_factory):
    """bloomery-serve beside a bloomery-worker that writes each of its command lines to
    $FAKE_WORKER_LOG and answers --list-devices with $FAKE_DEVICES (lines "cuda INDEX
    TOTAL FREE NAME"): the devices of any machine, and a record of every start."""
    return serverctl.fake_devices_bin(str(tmp_path_factory.mktemp("fakebin")), "bloomery-serve")


H100 = "cuda 0 85899345920 84825604096 NVIDIA H100 80GB HBM3"


@pytest.fixture(scope="module")
def fake_node(tmp_path_factory):
    """bloomery-node with made-up devices (test_remote.make_fake_node)."""
    from test_remote import make_fake_node
    return make_fake_node(tmp_path_factory.mktemp("fakenode"))


def test_prints_the_plan_and_starts_nothing(model, tmp_path, fake_bin):
    """Exit 0 with every section, while the port is held by another socket (a start
    would fail to bind it), no worker run but the device probe, no runtime folder,
    no shared memory, no folder made for --slot-save-path or --cache-disk."""
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    try:
        shm, dirs = serverctl.shm_objects(), frozenset(serverctl.runtime_dirs())
        args = ["-m", model, "--port", str(port), "--dry-run", "-np", "2", "-c", "4096", "-t", "1",
                "--slot-save-path", str(tmp_path / "slots" / "a"), "--cache-disk", str(tmp_path / "cache")]
        rc, out, err, secs, pid = serve(args)
        assert rc == 0, out + err
        for s in SECTIONS:
            assert s in out, "no %r in:\n%s" % (s, out)
        assert "event=listening" not in err and "event=dry_run fits=yes" in err, err
        assert not (tmp_path / "slots").exists() and not (tmp_path / "cache").exists()
        # other servers may run beside the tests: only this process's would count
        assert not [n for n in serverctl.shm_objects() - shm if str(pid) in n]
        assert not serverctl.runtime_dirs(pid, dirs)
        assert secs < 10
        if not serverctl.gpu_present():  # the machine's CPU plan
            assert "gpus: none" in out, out
            assert [r[0] for r in stages(out).values()] == ["CPU"], out

        log = tmp_path / "worker.log"
        rc, out, err, _, _ = serve(args, exe=fake_bin, env={"FAKE_WORKER_LOG": str(log), "FAKE_DEVICES": H100})
        assert rc == 0, out + err
        assert log.read_text().splitlines() == ["--list-devices"], "a worker was started: " + log.read_text()
        assert "gpu CUDA0: NVIDIA H100 80GB HBM3, 79.00 GiB free of 80.00 GiB" in out, out
    finally:
        holder.close()


def test_numbers_agree_with_the_start(model, servers):
    """Two CPU stages and one layer's experts in the hosttier: the dry run logs the
    start's event=plan lines, and its table holds the sizes /props shows."""
    flags = ["-np", "2", "-c", "1024", "-t", "1", "--workers", "2",
             "-ot", "blk\\.1\\.ffn_(gate|up|down)_exps=HOSTTIER"]
    rc, out, err, _, _ = serve(["-m", model, "--dry-run"] + flags)
    assert rc == 0, out + err
    srv = servers.start(flags)
    assert events(err, "plan") == events(srv.log(20000), "plan")

    placement = get(srv.url, "/props").json()["placement"]
    rows = stages(out)
    assert len(rows) == len(placement["stages"]) == 2, out
    for i, st in enumerate(placement["stages"]):
        device, layers, cells = rows[i]
        lb, le = st["layers"]
        assert device == st["device"] and layers == (str(lb) if lb == le else "%d-%d" % (lb, le)), out
        weights, experts, _, kv, state, scratch = cells
        assert weights == size_str(st["weight_bytes"]), (cells, st)
        assert experts == (size_str(st["expert_bytes"]) if st["expert_bytes"] else None), (cells, st)
        assert kv == size_str(st["kv_bytes"]) and state is None and scratch is None, (cells, st)
    assert rows[1][2][2] == size_str(placement["host_expert_bytes"]), out
    assert "the routed experts of 1 of 2 layers, %s" % size_str(placement["host_expert_bytes"]) in out, out
    n_ctx = get(srv.url, "/slots").json()[0]["n_ctx"]
    assert "1024 positions: 2 slots of %d\n" % n_ctx in out, out


def truncated(model, tmp_path):
    bad = tmp_path / "truncated.gguf"
    with open(model, "rb") as f:
        bad.write_bytes(f.read()[:os.path.getsize(model) // 3])
    return str(bad)


@pytest.mark.parametrize("case,args,in_plan", [
    ("no context per slot", ["-c", "1", "-np", "2"], False),
    ("damaged file", [], False),
    ("-ncmoe above the layers", ["--n-cpu-moe", "3"], True),
    ("-ot matching nothing", ["-ot", "no_such_tensor=CPU"], True),
    ("--workers above the layers", ["--workers", "3"], True),
])
def test_refused_as_the_start_refuses(model, tmp_path, case, args, in_plan):
    """What cannot start: the same status and the same reason; a refusal of the plan
    also ends the report with fits: no and the reason."""
    path = truncated(model, tmp_path) if case == "damaged file" else model
    base = ["-m", path, "--port", str(serverctl.free_port()), "-t", "1"] + args
    rc_start, out_start, err_start, _, _ = serve(base)
    rc, out, err, _, _ = serve(base + ["--dry-run"])
    assert rc_start == 1 and rc == rc_start, (case, rc, out, err, out_start, err_start)
    assert failure(err) == failure(err_start) and failure(err), (case, err, err_start)
    assert "fits: yes" not in out
    if in_plan:
        reason = events(err, "start_failed")[0].split("reason=", 1)[1]
        assert "fits: no\n  %s\n" % reason in out, out


@pytest.mark.parametrize("args", [
    ["-np", "0"], ["--port", "notaport"], ["--no-such-flag"], ["--cache-reuse", "256"],
    ["-ctk", "q4_0", "-ctv", "q4_0"], ["--samplers", "top_k;warp"], ["--fit", "maybe"], ["-sm", "row"],
    ["--chat-template", "no-such-template"], ["--slots", "--no-slots"], ["-fitt", "512,1024"],
])
def test_bad_flags_are_refused_the_same(model, args):
    base = ["-m", model, "--port", str(serverctl.free_port()), "-t", "1"] + args
    rc_start, _, err_start, _, _ = serve(base)
    rc, out, err, _, _ = serve(base + ["--dry-run"])
    assert rc_start in (1, 2) and rc == rc_start, (args, rc, rc_start, err, err_start)
    assert failure(err) == failure(err_start) and failure(err), (args, err, err_start)
    assert "fits: yes" not in out


def test_a_card_too_small(model, fake_bin):
    """With the devices of another machine: the stage on the card with its scratch; a
    card the weights do not fit is refused as the start refuses it (status 1, the
    sizes), one that holds weights and cache but not the scratch is shown as tight."""
    base = ["-m", model, "--port", str(serverctl.free_port()), "-t", "1"]
    rc, out, err, _, _ = serve(base + ["--dry-run"], exe=fake_bin, env={"FAKE_DEVICES": H100})
    assert rc == 0, out + err
    (device, layers, cells), = stages(out).values()
    assert device == "CUDA0" and layers == "0-1" and cells[5] is not None, out
    assert re.search(r"CUDA0: stage 0 needs about \S+ \S+ \(weights, KV cache, scratch\) and keeps 1024 MiB "
                     r"free \(-fitt\), of 79.00 GiB free\n", out), out

    tiny = {"FAKE_DEVICES": "cuda 0 1073741824 10485760 Tiny GPU"}
    flags = ["--fit", "off", "-ngl", "99"]
    rc_start, _, err_start, _, _ = serve(base + flags, exe=fake_bin, env=tiny)
    rc, out, err, _, _ = serve(base + flags + ["--dry-run"], exe=fake_bin, env=tiny)
    assert rc_start == 1 and rc == 1, (out, err, err_start)
    assert failure(err) == failure(err_start), (err, err_start)
    assert "fits: no\n  plan: layers 0..1 on CUDA0 need" in out and "the card has 10.0 MiB free" in out, out

    small = {"FAKE_DEVICES": "cuda 0 1073741824 524288000 Small GPU"}
    rc, out, err, _, _ = serve(base + flags + ["--dry-run"], exe=fake_bin, env=small)
    assert rc == 0 and "fits: yes" in out, out + err
    assert "of 500.0 MiB free: tight: the weights and KV cache fit, the scratch and the margin do not" in out, out
    # --fit on (no placement given) moves the layers to the CPU instead
    rc, out, err, _, _ = serve(base + ["--dry-run"], exe=fake_bin, env=small)
    assert rc == 0 and "2 layers moved to the CPU" in out, out + err
    assert [r[0] for r in stages(out).values()] == ["CPU"], out


def test_hybrid_model_shows_its_recurrent_state(tmp_path):
    """qwen3next: the DeltaNet layers' state, one per slot, beside the K/V rows of its
    attention layer; on the CPU even where a card is (no DeltaNet kernels there)."""
    path = str(tmp_path / "qwen3next.gguf")
    subprocess.run([serverctl.program("bloomery-mkmodel"), "-o", path, "--arch", "qwen3next", "--threads", "2"],
                   check=True, stdout=subprocess.DEVNULL, timeout=120)
    state = {}
    for np_ in (1, 4):
        rc, out, err, _, _ = serve(["-m", path, "--dry-run", "-np", str(np_), "-c", "4096", "-t", "1"])
        assert rc == 0, out + err
        assert "3 gated DeltaNet, 1 attention" in out, out
        (device, _, cells), = stages(out).values()
        assert device == "CPU" and cells[3] is not None and cells[4] is not None, out
        state[np_] = to_bytes(cells[4])
    assert abs(state[4] - 4 * state[1]) <= 0.05 * state[4], state


def resident_pages(path, lo, hi):
    """(pages of [lo, hi) of path in the page cache, pages) through mincore."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                          ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    page = os.sysconf("SC_PAGE_SIZE")
    lo -= lo % page
    size = hi - lo
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, 1, 1, fd, lo)  # PROT_READ, MAP_SHARED
        assert addr not in (None, ctypes.c_void_p(-1).value)
        n = (size + page - 1) // page
        vec = (ctypes.c_ubyte * n)()
        try:
            assert libc.mincore(addr, size, vec) == 0
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)
    return sum(v & 1 for v in vec), n


def test_reads_the_header_and_not_the_weights(model, tmp_path):
    """The file's second half (weights only: the header with the vocabulary is at its
    start) stays out of the page cache through a dry run."""
    path = str(tmp_path / "copy.gguf")
    shutil.copyfile(model, path)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    size = os.path.getsize(path)
    cached, n = resident_pages(path, size // 2, size)
    if cached > n // 10:
        pytest.skip("the kernel keeps the file cached after POSIX_FADV_DONTNEED")
    rc, out, err, secs, _ = serve(["-m", path, "--dry-run", "-t", "1"])
    assert rc == 0, out + err
    cached, n = resident_pages(path, size // 2, size)
    assert cached <= n // 10, "%d of %d pages of the weights were read" % (cached, n)
    assert secs < 10


def test_hostfile_stages_with_their_hosts(model, tmp_path):
    """--hostfile: the start asks the node of another host's worker line for its CPUs
    and memory, and the report shows each stage's layers and host, the node's answer
    and the RAM the stage takes there."""
    from test_remote import Node, secret_file
    secret = secret_file(tmp_path / "secret")
    node = Node(tmp_path, secret)
    try:
        hosts = tmp_path / "hosts"
        hosts.write_text("127.0.0.1 8090 router\n127.0.0.1 9000 worker threads=1\n"
                         "localhost %d worker threads=2\n" % node.port)
        rc, out, err, secs, _ = serve(["-m", model, "--dry-run", "-t", "1", "--hostfile", str(hosts),
                                       "--cluster-secret", secret])
        assert rc == 0, out + err
        assert "event=probe_answered" in node.log(), node.log()
        assert "event=session_started" not in node.log()  # nothing but the question
    finally:
        node.stop()
    assert [r[1] for r in stages(out).values()] == ["0", "1"], out
    cpus = len(os.sched_getaffinity(0))
    # both hosts' read rates measured (the router's here, the node's there): the split follows them
    assert "  hosts (--hostfile): the layers split by the memory read rate each stage gets" in out, out
    rate = r"; reads memory at \d+\.\d GB/s with one thread, \d+\.\d with all\n"
    assert re.search(r"\n    stage 0: layers 0\.\.0 on 127\.0\.0\.1 \(this host\): %d CPUs?, \S+ \S+ available of "
                     r"\S+ \S+; 1 thread%s" % (cpus, rate), out), out
    assert re.search(r"\n    stage 1: layers 1\.\.1 on localhost through the node at tcp://localhost:%d: %d CPUs?, "
                     r"\S+ \S+ available of \S+ \S+; 2 threads%s" % (node.port, cpus, rate), out), out
    assert re.search(r"event=stage_host stage=1 host=localhost .* read_mbps_one=[1-9]\d* read_mbps_all=[1-9]", err), err
    assert re.search(r"tcp://localhost:%d: stage 1 takes \S+ \S+ \(weights and KV cache\) of that host's RAM, of "
                     r"\S+ \S+ available" % node.port, out), out
    assert secs < 10


def test_hostfile_gpu_stages_on_two_hosts(tmp_path, fake_node):
    """A DGX Spark pair as the report sees it: two hosts, each a node whose host has one
    GB10 (made up: fake_node), a GPU line each; the router's host runs no stage. The
    start asks both nodes, puts a stage on each card, the layers split evenly (two
    cards alike), and shows each stage's host, card, layers and bytes, and that each
    fits its card; then a CPU line of the router's host beside one card line: the card
    weighs as 64 of its host's threads, the CPU stage's one thread takes one layer of four."""
    from test_remote import GB10, Node, secret_file
    path = serverctl.make_model(str(tmp_path / "layers4.gguf"), "--layers", "4")
    secret = secret_file(tmp_path / "secret")
    a = Node(tmp_path, secret, exe=fake_node, env={"FAKE_DEVICES": GB10})
    b = Node(tmp_path, secret, exe=fake_node, env={"FAKE_DEVICES": GB10}, addr="127.0.0.2")
    try:
        hosts = tmp_path / "hosts"
        hosts.write_text("127.0.0.1 8090 router\nlocalhost %d worker 0\n127.0.0.2 %d worker all\n"
                         % (a.port, b.port))
        rc, out, err, secs, _ = serve(["-m", path, "--dry-run", "-t", "1", "--hostfile", str(hosts),
                                       "--cluster-secret", secret])
        assert rc == 0, out + err
        for n in (a, b):
            assert "event=probe_answered" in n.log() and " devices=1" in n.log(), n.log()
            assert "event=session_started" not in n.log()  # nothing but the question
        rows = stages(out)
        assert [(r[0], r[1]) for r in rows.values()] == [("CUDA0", "0-1"), ("CUDA0", "2-3")], out
        assert all(r[2][5] is not None for r in rows.values()), out  # a card's scratch
        assert ("  hosts (--hostfile): the layers split by the memory read rate each stage gets (a host's CPU stages "
                "together read at its rate for their threads, at most its CPUs, shared by their threads; a card at "
                "its copy rate, or where that is not known as 64 times its host's one-thread rate)") in out, out
        assert ("\n    stage 0: layers 0..1 on localhost through the node at tcp://localhost:%d: CUDA0 Fake GB10, "
                "121.07 GiB free of 128.00 GiB; copies its memory at 240 GB/s\n" % a.port) in out, out
        assert ("\n    stage 1: layers 2..3 on 127.0.0.2 through the node at tcp://127.0.0.2:%d: CUDA0 Fake GB10, "
                "121.07 GiB free of 128.00 GiB; copies its memory at 240 GB/s\n" % b.port) in out, out
        for i, host in enumerate(("localhost", "127.0.0.2")):
            assert re.search(r"\n  CUDA0 of %s \(Fake GB10\): stage %d needs about \S+ \S+ \(weights, KV cache, "
                             r"scratch\) and keeps 1024 MiB free \(-fitt\), of 121.07 GiB free\n" % (re.escape(host), i),
                             out), out
        assert "fits: yes" in out and "  host RAM: no weights (every layer on the cards)" in out, out
        assert re.search(r"event=stage_host stage=1 host=127\.0\.0\.2 .* device=CUDA0 card_free=130000000000 ", err)

        hosts.write_text("127.0.0.1 8090 router\n127.0.0.1 9000 worker threads=1\nlocalhost %d worker 0\n" % a.port)
        rc, out, err, _, _ = serve(["-m", path, "--dry-run", "-t", "1", "--hostfile", str(hosts),
                                    "--cluster-secret", secret])
        assert rc == 0, out + err
        assert [(r[0], r[1]) for r in stages(out).values()] == [("CPU", "0"), ("CUDA0", "1-3")], out
        assert re.search(r"\n    stage 0: layers 0\.\.0 on 127\.0\.0\.1 \(this host\): \d+ CPUs?, ", out), out

        # layers= decides, and is checked against the card
        hosts.write_text("127.0.0.1 8090 router\n127.0.0.1 9000 worker layers=0-3\nlocalhost %d worker 0 "
                         "layers=3-4\n" % a.port)
        rc, out, err, _, _ = serve(["-m", path, "--dry-run", "-t", "1", "--hostfile", str(hosts),
                                    "--cluster-secret", secret])
        assert rc == 0, out + err
        assert [(r[0], r[1]) for r in stages(out).values()] == [("CPU", "0-2"), ("CUDA0", "3")], out
        # no split to weigh: this host's read rates are not measured (0.3 s at each start)
        assert re.search(r"\n    stage 0: layers 0\.\.2 on 127\.0\.0\.1 \(this host\): [^\n]*thread[s]?\n", out), out
        assert not re.search(r"stage 0: [^\n]*reads memory", out), out
        # nor the node's: its probe asks for none
        answers = [line for line in a.log().splitlines() if "event=probe_answered" in line]
        assert answers and "read_mbps_one=0 read_mbps_all=0 " in answers[-1], a.log()
    finally:
        a.stop()
        b.stop()


def test_hostfile_gpu_stage_that_no_card_holds(tmp_path, fake_node):
    """One card line of another host whose card is too small for the model: the report
    and the start refuse it alike, naming the card, its host and the bytes."""
    from test_remote import Node, secret_file
    secret = secret_file(tmp_path / "secret")
    path = serverctl.make_model(str(tmp_path / "layers4.gguf"), "--layers", "4")
    node = Node(tmp_path, secret, exe=fake_node, env={"FAKE_DEVICES": "cuda 0 1073741824 10485760 Tiny GPU"})
    try:
        hosts = tmp_path / "hosts"
        hosts.write_text("127.0.0.1 8090 router\nlocalhost %d worker 0\n" % node.port)
        base = ["-m", path, "--port", str(serverctl.free_port()), "-t", "1", "--hostfile", str(hosts),
                "--cluster-secret", secret]
        rc, out, err, _, _ = serve(base + ["--dry-run"])
        rc_start, _, err_start, _, _ = serve(base)
    finally:
        node.stop()
    want = "no split of the 4 layers fits the stages' memory: CUDA0 (Tiny GPU) of localhost has room for "
    for text, r in ((out + err, rc), (err_start, rc_start)):
        assert r == 1, text
        assert want in text and "bytes: its 10.0 MiB free less the -fitt margin and the scratch) and its stage needs" \
            in text, text
    assert "fits: no\n  plan: no split" in out, out


def test_hostfile_node_that_does_not_answer(model, tmp_path):
    """A worker line whose node does not answer: the report says so, as the start
    fails (the probe waits 10 s for a handshake)."""
    from test_remote import free_ports, secret_file
    secret = secret_file(tmp_path / "secret")
    port = free_ports(3)
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 8090 router\n127.0.0.1 9000 worker\nlocalhost %d worker\n" % port)
    rc, out, err, secs, _ = serve(["-m", model, "--dry-run", "-t", "1", "--hostfile", str(hosts),
                                   "--cluster-secret", secret])
    assert rc == 1, out + err
    assert re.search(r"fits: no\n  the node at tcp://localhost:%d: .*after 10000 ms" % port, out), out
    assert "the node at tcp://localhost:%d" % port in failure(err)[0], err


def test_hostfile_split_refused_when_no_host_holds_it(tmp_path):
    """The hostfile's stages on one host, whose memory cannot hold the model's KV cache
    at this -c: the split is refused with the host and the bytes, as the start
    refuses it."""
    avail = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
    per_pos = 4 * 2 * 8 * 128 * 2  # layers x K and V x kv heads x head dim x f16
    n_ctx = 2 * avail // per_pos + 1
    if not avail or n_ctx > 1 << 24:
        pytest.skip("this machine's memory holds any context a slot may have")
    path = serverctl.make_model(str(tmp_path / "wide-kv.gguf"), "--layers", "4", "--heads", "8", "--kv-heads", "8",
                                "--head-dim", "128")
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 8090 router\n127.0.0.1 9000 worker\n127.0.0.1 9001 worker\n")
    base = ["-m", path, "--port", str(serverctl.free_port()), "-t", "1", "-np", "1", "-c", str(n_ctx),
            "--hostfile", str(hosts)]
    rc, out, err, _, _ = serve(base + ["--dry-run"])
    rc_start, _, err_start, _, _ = serve(base)
    want = ("no split of the 4 CPU layers fits the hosts' memory: 127.0.0.1 has ", " available (MemAvailable, ",
            "and its 2 stages need ", "bytes of weights and KV cache")
    for text, r in ((out + err, rc), (err_start, rc_start)):
        assert r == 1, text
        assert all(w in text for w in want), text
    assert "fits: no\n  plan: no split" in out, out
