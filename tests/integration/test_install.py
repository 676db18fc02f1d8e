"""`make install DESTDIR=... PREFIX=/usr` and the tree it writes: the programs, docs,
systemd unit and env file where a Debian package puts them, and the installed
bloomery-serve started as bloomery.service starts it (no arguments but BLOOMERY_ARGS,
its settings from the env file's variables), finding its worker, its hosttier and its
chat page in the installed tree rather than in the build folder.

The unit is checked twice: parsed here (its sections and keys, the settings the
server relies on, no option that would hide the cards, every command and path it
names present in the tree, every folder the server writes inside the ones the sandbox
leaves writable), and, where systemd-analyze exists, by `systemd-analyze verify` on a
copy whose commands point into the staging folder (verify reports unknown keys only
as warnings, so its output is read too, and a misspelt key is shown to be caught).
"""
import filecmp
import os
import re
import shlex
import shutil
import stat
import subprocess
import tempfile

import pytest

import serverctl
from sse import get, post

ROOT = serverctl.ROOT
BUILD_DIR = os.path.join(ROOT, serverctl.BUILD)
PREFIX = "/usr"
UNIT = "/lib/systemd/system/bloomery.service"      # Debian's place for PREFIX=/usr
ENV_FILE = "/etc/bloomery/bloomery.env"
DOC_DIR = "/usr/share/doc/bloomery"
WAIT_READY = "/usr/libexec/bloomery/bloomery-wait-ready"

# The programs a user runs; every other bloomery-* the build gathers is installed too.
PROGRAMS = ["bloomery-serve", "bloomery-worker", "bloomery-hosttier", "bloomery-node", "bloomery-cli",
            "bloomery-bench", "bloomery-gguf", "bloomery-mkmodel", "bloomery-tokenize",
            "bloomery-template", "bloomery-stepbench", "bloomery-load", "bloomery-launch"]

# The keys the unit may use: a misspelt one is only a warning to systemd, and silently
# drops the setting it meant.
KNOWN_KEYS = {
    "Unit": {"Description", "Documentation", "Wants", "Requires", "BindsTo", "PartOf",
             "After", "Before", "StartLimitIntervalSec", "StartLimitBurst",
             "ConditionPathExists", "AssertPathExists"},
    "Service": {"Type", "EnvironmentFile", "Environment", "ExecStartPre", "ExecStart",
                "ExecStartPost", "ExecReload", "ExecStop", "ExecStopPost",
                "TimeoutStartSec", "TimeoutStopSec", "KillMode", "KillSignal",
                "SuccessExitStatus", "RestartPreventExitStatus", "Restart", "RestartSec",
                "DynamicUser", "User", "Group", "SupplementaryGroups", "WorkingDirectory",
                "StateDirectory", "CacheDirectory", "RuntimeDirectory", "LogsDirectory",
                "ConfigurationDirectory", "RuntimeDirectoryMode", "StateDirectoryMode",
                "CacheDirectoryMode", "ReadWritePaths", "ReadOnlyPaths", "LoadCredential",
                "UMask", "Nice", "CPUAffinity", "OOMScoreAdjust", "LimitMEMLOCK",
                "LimitNOFILE", "LimitCORE", "StandardOutput", "StandardError",
                "SyslogIdentifier", "NoNewPrivileges", "CapabilityBoundingSet",
                "AmbientCapabilities", "ProtectSystem", "ProtectHome", "PrivateTmp",
                "ProtectKernelTunables", "ProtectKernelModules", "ProtectKernelLogs",
                "ProtectControlGroups", "ProtectHostname", "ProtectProc", "ProcSubset",
                "RestrictAddressFamilies", "RestrictNamespaces", "RestrictRealtime",
                "RestrictSUIDSGID", "LockPersonality", "RemoveIPC",
                "SystemCallArchitectures"},
    "Install": {"WantedBy", "RequiredBy", "Alias", "Also"},
}
REPEATABLE = {"Environment", "EnvironmentFile", "ExecStartPre", "ExecStartPost",
              "ExecStop", "ExecStopPost", "Wants", "After", "Before", "Requires",
              "ReadWritePaths", "ReadOnlyPaths", "LoadCredential", "Documentation"}

# Options that break the server, with the reason (each also left out of KNOWN_KEYS).
BREAKS = {
    "PrivateDevices": "hides /dev/nvidia*, the cards",
    "DevicePolicy": "closes the device list, the cards included",
    "DeviceAllow": "turns the device list into an allow-list that must name every card node",
    "ProtectClock": "adds a DeviceAllow= entry, which on some systemd versions closes the cards",
    "MemoryDenyWriteExecute": "not checked against the CUDA driver's mappings",
    "SystemCallFilter": "not checked against io_uring (the disk tier) and the CUDA driver",
    "PrivateNetwork": "the server listens, and -hf downloads",
}

# Variables the env file may set that are not flags' variables: the unit's own, and
# the cache folder the hub code reads.
OWN_VARS = {"BLOOMERY_ARGS", "BLOOMERY_HEALTH_URL", "LLAMA_CACHE", "CUDA_CACHE_PATH",
            "XDG_RUNTIME_DIR"}
# Variables and flags whose value is a folder or file the server writes.
WRITTEN_VARS = {"LLAMA_CACHE", "CUDA_CACHE_PATH", "XDG_RUNTIME_DIR", "BLOOMERY_ARG_CACHE_DISK",
                "LLAMA_ARG_LOG_FILE"}
WRITTEN_FLAGS = {"--slot-save-path", "--cache-disk", "--log-file"}

SPECIFIERS = {"%C": "/var/cache", "%t": "/run", "%S": "/var/lib", "%L": "/var/log"}
TRUE = {"yes", "true", "on", "1"}


def make_env():
    """The environment for a nested make: none of an outer make's flags or variables."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "DESTDIR", "PREFIX")}
    return env


def run_make(*args, timeout=1800):
    return subprocess.run(["make", "-C", ROOT, "BUILD=" + BUILD_DIR] + list(args),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=make_env(), timeout=timeout)


@pytest.fixture(scope="module")
def stage(tmp_path_factory):
    """The staging folder `make install DESTDIR=... PREFIX=/usr` filled (the build is
    brought up to date first, as install depends on it)."""
    if not os.path.isdir(BUILD_DIR):
        pytest.skip("%s is not built (run make)" % BUILD_DIR)
    root = str(tmp_path_factory.mktemp("stage"))
    p = run_make("install", "DESTDIR=" + root, "PREFIX=" + PREFIX)
    assert p.returncode == 0, "make install failed (%d):\n%s" % (p.returncode, p.stdout[-6000:])
    return root


def inside(stage, path):
    return os.path.join(stage, path.lstrip("/"))


def parse_unit(path):
    """{section: [(key, value)]} of a unit file, as systemd reads it: # and ; comments,
    [Section] headers, Key=Value lines (a trailing backslash continues a line)."""
    sections, current, pending = {}, None, ""
    with open(path) as f:
        for n, raw in enumerate(f, 1):
            line = pending + raw.rstrip("\n")
            pending = ""
            if line.endswith("\\"):
                pending = line[:-1] + " "
                continue
            s = line.strip()
            if not s or s[0] in "#;":
                continue
            if s.startswith("[") and s.endswith("]"):
                current = s[1:-1]
                assert current not in sections, "%s:%d: section [%s] twice" % (path, n, current)
                sections[current] = []
                continue
            assert current is not None, "%s:%d: a setting before any section" % (path, n)
            assert "=" in s, "%s:%d: not Key=Value: %r" % (path, n, s)
            key, value = s.split("=", 1)
            sections[current].append((key.strip(), value.strip()))
    return sections


def unit_values(sections, section, key):
    return [v for k, v in sections.get(section, []) if k == key]


def unit_value(sections, section, key):
    values = unit_values(sections, section, key)
    assert len(values) == 1, "[%s] %s= is set %d times, once expected" % (section, key, len(values))
    return values[0]


def exec_path(value):
    """The program of an Exec*= line, without its prefixes (- + ! @ :)."""
    return shlex.split(value)[0].lstrip("-+!@:")


def env_lines(path, commented=False):
    """[(name, value)] of the env file's VAR=value lines; with commented, also those of
    its commented-out examples (`#VAR=value`)."""
    pat = re.compile(r"^(#?)([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
    out = []
    with open(path) as f:
        for line in f:
            m = pat.match(line.rstrip("\n"))
            if m and (commented or not m.group(1)):
                out.append((m.group(2), m.group(3).strip()))
    return out


def server_variables(program):
    """The variables bloomery-serve reads for its flags, from its --help."""
    p = subprocess.run([program, "--help"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=30)
    names = set(re.findall(r"\(env: ([A-Z][A-Z0-9_]*)\)", p.stdout))
    assert "LLAMA_ARG_MODEL" in names, "bloomery-serve --help lists no variables:\n" + p.stdout[:2000]
    return names


# --- the tree

def test_programs_are_installed_executable(stage):
    built = sorted(n for n in os.listdir(serverctl.BIN) if n.startswith("bloomery-"))
    scripts = {"bloomery-load": os.path.join(ROOT, "tools", "bloomery-load"),
               "bloomery-launch": os.path.join(ROOT, "deploy", "bloomery-launch")}
    for name in set(PROGRAMS) - set(scripts):
        assert name in built, "%s is not in %s" % (name, serverctl.BIN)
    for name in built + sorted(scripts):
        path = inside(stage, "/usr/bin/" + name)
        st = os.stat(path)
        assert stat.S_ISREG(st.st_mode), path
        assert stat.S_IMODE(st.st_mode) == 0o755, "%s has mode %o" % (path, stat.S_IMODE(st.st_mode))
        src = scripts.get(name) or os.path.join(serverctl.BIN, name)
        assert filecmp.cmp(src, path, shallow=False), "%s differs from %s" % (path, src)
    path = inside(stage, WAIT_READY)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o755, path


def test_docs_are_installed_where_the_readme_links_find_them(stage):
    doc = inside(stage, DOC_DIR)
    assert filecmp.cmp(os.path.join(ROOT, "README.md"), os.path.join(doc, "README.md"), shallow=False)
    for name in os.listdir(os.path.join(ROOT, "docs")):
        if name.endswith(".md"):
            path = os.path.join(doc, "docs", name)
            assert os.path.isfile(path), path
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o644, path
    with open(os.path.join(doc, "README.md")) as f:
        for link in set(re.findall(r"`(docs/[a-z_]+\.md)`", f.read())):
            assert os.path.isfile(os.path.join(doc, link)), "README names %s, not installed" % link
    if os.path.isfile(os.path.join(ROOT, "LICENSE")):
        assert os.path.isfile(os.path.join(doc, "LICENSE"))
    # the example env file as shipped, its /usr/local paths moved to PREFIX
    with open(os.path.join(ROOT, "deploy", "systemd", "bloomery.env")) as f:
        shipped = f.read().replace("/usr/local/share/doc/bloomery", DOC_DIR)
    with open(os.path.join(doc, "examples", "bloomery.env")) as f:
        assert f.read() == shipped


def test_unit_names_what_the_install_holds(stage):
    u = parse_unit(inside(stage, UNIT))
    start = unit_value(u, "Service", "ExecStart")
    assert exec_path(start) == PREFIX + "/bin/bloomery-serve", start
    # the model and flags come from the env file's variables, not from the unit
    assert shlex.split(start)[1:] == ["$BLOOMERY_ARGS"], start
    for key in ("ExecStart", "ExecStartPost"):
        for v in unit_values(u, "Service", key):
            path = inside(stage, exec_path(v))
            assert os.access(path, os.X_OK), "%s=%s: %s is not in the install" % (key, v, path)
    assert unit_value(u, "Service", "EnvironmentFile") == ENV_FILE
    env = inside(stage, ENV_FILE)
    assert stat.S_IMODE(os.stat(env).st_mode) == 0o600, "the env file may hold an API key"
    for d in unit_values(u, "Unit", "Documentation"):
        assert d.startswith("file:"), d
        assert os.path.isfile(inside(stage, d[len("file:"):])), d


def test_unit_parses_with_known_keys_and_the_settings_the_server_needs(stage):
    u = parse_unit(inside(stage, UNIT))
    assert set(u) == {"Unit", "Service", "Install"}, sorted(u)
    for section, items in u.items():
        seen = set()
        for key, value in items:
            assert key not in BREAKS, "%s=%s: %s" % (key, value, BREAKS[key])
            assert key in KNOWN_KEYS[section], "[%s] %s= is not a key this test knows" % (section, key)
            assert key in REPEATABLE or key not in seen, "[%s] %s= twice" % (section, key)
            seen.add(key)

    def svc(key):
        return unit_value(u, "Service", key)

    assert svc("DynamicUser") in TRUE
    assert svc("Restart") == "on-failure"
    assert re.fullmatch(r"\d+s?", svc("RestartSec")), svc("RestartSec")
    # SIGTERM to bloomery-serve alone: it stops its own children
    assert svc("KillMode") == "mixed" and svc("KillSignal") == "SIGTERM"
    assert svc("LimitMEMLOCK") == "infinity"
    assert int(svc("LimitNOFILE")) >= 4096
    assert svc("ProtectSystem") == "strict"
    assert svc("NoNewPrivileges") in TRUE and svc("PrivateTmp") in TRUE
    assert re.fullmatch(r"\d+min", svc("TimeoutStartSec")), "a large model needs minutes"
    assert "network-online.target" in " ".join(unit_values(u, "Unit", "After"))
    assert unit_value(u, "Install", "WantedBy") == "multi-user.target"


def test_what_the_server_writes_is_inside_the_writable_folders(stage):
    """ProtectSystem=strict leaves only the service's own folders writable: every
    folder the unit and the env file's examples point the server at must be one."""
    u = parse_unit(inside(stage, UNIT))
    writable = ["/var/lib/" + v for v in unit_values(u, "Service", "StateDirectory")]
    writable += ["/var/cache/" + v for v in unit_values(u, "Service", "CacheDirectory")]
    writable += ["/run/" + v for v in unit_values(u, "Service", "RuntimeDirectory")]
    writable += [p for v in unit_values(u, "Service", "ReadWritePaths") for p in v.split()]
    written = []
    for v in unit_values(u, "Service", "Environment"):
        for item in shlex.split(v):
            name, value = item.split("=", 1)
            assert name in OWN_VARS, "Environment=%s: not a variable the server reads" % name
            for spec, path in SPECIFIERS.items():
                value = value.replace(spec, path)
            written.append((name, value))
    for name, value in env_lines(inside(stage, ENV_FILE), commented=True):
        if name in WRITTEN_VARS:
            written.append((name, value))
        if name == "BLOOMERY_ARGS":
            words = value.split()
            written += [(w, words[i + 1]) for i, w in enumerate(words[:-1]) if w in WRITTEN_FLAGS]
    assert any(n == "XDG_RUNTIME_DIR" for n, _ in written), "the control sockets need a folder"
    for name, path in written:
        assert any(path == w or path.startswith(w.rstrip("/") + "/") for w in writable), \
            "%s=%s is outside the writable folders %s" % (name, path, writable)


def test_env_file_sets_only_variables_the_server_reads(stage):
    known = server_variables(inside(stage, "/usr/bin/bloomery-serve")) | OWN_VARS
    active = dict(env_lines(inside(stage, ENV_FILE)))
    assert active.get("LLAMA_ARG_MODEL"), "the example must name a model"
    assert "LLAMA_ARG_HF_REPO" not in active, "-m and -hf together are refused"
    for name, _ in env_lines(inside(stage, ENV_FILE), commented=True):
        assert name in known, "%s is not a variable bloomery-serve or the unit reads" % name


def test_reinstall_keeps_the_env_file(stage):
    env = inside(stage, ENV_FILE)
    with open(env) as f:
        original = f.read()
    with open(env, "a") as f:
        f.write("LLAMA_ARG_ALIAS=kept-by-reinstall\n")
    try:
        p = run_make("install", "DESTDIR=" + stage, "PREFIX=" + PREFIX)
        assert p.returncode == 0, p.stdout[-4000:]
        assert "kept " + env in p.stdout, p.stdout[-2000:]
        with open(env) as f:
            assert "LLAMA_ARG_ALIAS=kept-by-reinstall" in f.read()
        assert stat.S_IMODE(os.stat(env).st_mode) == 0o600
    finally:  # the other tests read the file as installed
        with open(env, "w") as f:
            f.write(original)


def test_default_prefix_is_usr_local_and_units_follow_it():
    """The install's paths without PREFIX (/usr/local, the unit beside it, where
    systemd also looks) and with PREFIX=/usr (Debian's /lib/systemd/system); -n: the
    commands are printed, not run."""
    for prefix, unit, binary in ((None, "/usr/local/lib/systemd/system/bloomery.service",
                                  "/usr/local/bin"),
                                 ("/usr", "/x/lib/systemd/system/bloomery.service", "/x/usr/bin"),
                                 ("/opt/bl", "/opt/bl/lib/systemd/system/bloomery.service",
                                  "/opt/bl/bin")):
        args = ["-n", "-o", "build", "install"]
        if prefix:
            args += ["PREFIX=" + prefix, "DESTDIR=/x" if prefix == "/usr" else "DESTDIR="]
        p = run_make(*args, timeout=60)
        assert p.returncode == 0, p.stdout
        assert unit in p.stdout, "%s: no %s in\n%s" % (prefix, unit, p.stdout)
        assert binary in p.stdout, "%s: no %s in\n%s" % (prefix, binary, p.stdout)
        assert "/etc/bloomery/bloomery.env" in p.stdout


def test_sysconfdir_moves_every_path_that_names_it(tmp_path):
    """SYSCONFDIR=/opt/etc: the units, the shipped examples and both env files written
    there name /opt/etc/bloomery, never /etc/bloomery (an admin reading the installed
    env file is told where it is)."""
    if not os.path.isdir(BUILD_DIR):
        pytest.skip("%s is not built (run make)" % BUILD_DIR)
    root = str(tmp_path / "stage")
    p = run_make("install", "DESTDIR=" + root, "PREFIX=/usr", "SYSCONFDIR=/opt/etc")
    assert p.returncode == 0, "make install failed (%d):\n%s" % (p.returncode, p.stdout[-6000:])
    files = [UNIT, NODE_UNIT, NODE_TEMPLATE, "/opt/etc/bloomery/bloomery.env",
             "/opt/etc/bloomery/bloomery-node.env", "/usr/share/doc/bloomery/examples/bloomery.env",
             "/usr/share/doc/bloomery/examples/bloomery-node.env"]
    for path in files:
        with open(inside(root, path)) as f:
            text = f.read()
        assert "/opt/etc/bloomery/" in text, "%s names no /opt/etc/bloomery/" % path
        stale = [line for line in text.splitlines() if re.search(r"(?<![\w/])/etc/bloomery", line)]
        assert not stale, "%s still names /etc/bloomery:\n%s" % (path, "\n".join(stale))
    assert not os.path.exists(inside(root, "/etc/bloomery")), "wrote into /etc despite SYSCONFDIR"


# --- the installed server

class InstalledServer(serverctl.Server):
    """bloomery-serve from the staging folder, run as the unit runs it: no arguments
    but BLOOMERY_ARGS (split at spaces, as systemd splits an unquoted $VAR), the rest
    from the environment."""

    def __init__(self, program, env, port, log_dir):
        super().__init__(None, (), env=env, port=port, log_dir=log_dir)
        self.program = program

    def launch(self):
        if self.port is None:  # start() picks another port after a clash
            self.port = serverctl.free_port()
        self.env["LLAMA_ARG_PORT"] = str(self.port)
        return super().launch()

    def command(self):
        return [self.program] + self.env.get("BLOOMERY_ARGS", "").split()


def exe_of(pid):
    try:
        return os.readlink("/proc/%d/exe" % pid)
    except OSError:
        return None


def test_installed_server_starts_from_the_env_file_and_finds_its_parts(stage, model, tmp_path):
    env = dict(env_lines(inside(stage, ENV_FILE)))
    assert "BLOOMERY_ARGS" not in env, "the example sets no flags beyond its variables"
    port = serverctl.free_port()
    # short, as /run/bloomery is: the control sockets' paths must fit a sockaddr_un
    runtime = tempfile.mkdtemp(prefix="bl-run-")
    env.update({
        "LLAMA_ARG_MODEL": model,          # the example's model path, replaced by the test's
        "LLAMA_ARG_PORT": str(port),
        "LLAMA_ARG_THREADS": "1",
        "LLAMA_ARG_CTX_SIZE": "1024",
        # the routed experts to the hosttier, so that it must be found too
        "BLOOMERY_ARGS": r"-ot \.ffn_(up|down|gate)_exps=HOSTTIER -tb 1",
        # as the unit's Environment= sets them, in folders of this test
        "XDG_RUNTIME_DIR": runtime,
        "LLAMA_CACHE": str(tmp_path / "hf"),
    })
    bin_dir = inside(stage, "/usr/bin")
    srv = InstalledServer(os.path.join(bin_dir, "bloomery-serve"), env, port, str(tmp_path))
    try:
        srv.start()
    except serverctl.ServerError as e:
        pytest.fail(str(e), pytrace=False)
    try:
        # its processes are the installed programs, not build/bin's
        kids = {name: exe_of(pid) for pid, name, _ in srv.children()}
        for name in ("bloomery-worker", "bloomery-hosttier"):
            assert name in kids, "no %s below the server: %s\n%s" % (name, kids, srv.log())
            assert kids[name] == os.path.join(bin_dir, name), kids

        r = post(srv.url, "/completion", {"prompt": "The old lighthouse keeper", "n_predict": 4,
                                          "temperature": 0, "ignore_eos": True})
        assert r.status_code == 200, r.text
        assert r.json()["tokens_predicted"] == 4, r.json()
        page = get(srv.url, "/")
        assert page.status_code == 200 and "<title>bloomery</title>" in page.text

        # the unit's readiness check finds the server from the same variables
        p = subprocess.run([inside(stage, WAIT_READY), "30"], env=dict(os.environ, **env),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
        assert p.returncode == 0, p.stdout
        if shutil.which("curl"):
            assert "answered 200" in p.stdout, p.stdout
        else:
            assert "curl is not installed" in p.stdout, p.stdout
    finally:
        problems = srv.stop()
        left = os.listdir(runtime)
        shutil.rmtree(runtime, ignore_errors=True)
    assert not problems, "%s\n%s" % ("; ".join(problems), srv.log())
    assert left == [], "left in XDG_RUNTIME_DIR: %s" % left
    srv.discard_log()


def test_wait_ready_gives_up_after_its_limit(stage):
    if not shutil.which("curl"):
        pytest.skip("curl is not installed: bloomery-wait-ready does not wait without it")
    env = dict(os.environ, LLAMA_ARG_HOST="127.0.0.1", LLAMA_ARG_PORT=str(serverctl.free_port()))
    env.pop("BLOOMERY_HEALTH_URL", None)
    p = subprocess.run([inside(stage, WAIT_READY), "1"], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=30)
    assert p.returncode == 1, p.stdout
    assert "did not answer 200 within 1 s" in p.stdout, p.stdout


# --- systemd's own check

def verify(unit_path):
    p = subprocess.run(["systemd-analyze", "verify", "--man=no", unit_path],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    # lines about other units of the host are not this test's business
    ours = [line for line in p.stdout.splitlines() if "bloomery" in line]
    return p.returncode, ours, p.stdout


def test_systemd_analyze_verifies_the_unit(stage, tmp_path):
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze is not installed (Debian package systemd); the unit "
                    "is still parsed by the tests above")
    # verify checks that each command exists: point ours into the staging folder
    def staged(m):
        path = inside(stage, m.group(2))
        return m.group(1) + (path if os.path.exists(path) else m.group(2))

    with open(inside(stage, UNIT)) as f:
        text = re.sub(r"^(Exec\w+=[-+!@:]*)(\S+)", staged, f.read(), flags=re.M)
    assert inside(stage, "/usr/bin/bloomery-serve") in text
    unit = tmp_path / "bloomery.service"
    unit.write_text(text)
    rc, ours, out = verify(str(unit))
    assert rc == 0 and not ours, "systemd-analyze verify (status %d):\n%s" % (rc, out)

    # the check is worth something: a misspelt key is reported, though verify exits 0
    bad = tmp_path / "bad" / "bloomery.service"
    bad.parent.mkdir()
    bad.write_text(text.replace("ProtectSystem=strict", "ProtectSytem=strict"))
    _, ours, out = verify(str(bad))
    assert any("ProtectSytem" in line for line in ours), out


NODE_UNIT = "/lib/systemd/system/bloomery-node.service"


def test_node_unit_is_installed_and_verifies(stage, tmp_path):
    """bloomery-node.service (a cluster's other hosts): installed beside bloomery.service
    with its paths for PREFIX, its env file in /etc/bloomery, the secret handed over as
    a credential (the node refuses a secret others may read), and systemd's own check."""
    svc = {}
    for k, v in parse_unit(inside(stage, NODE_UNIT))["Service"]:
        svc.setdefault(k, []).append(v)
    assert svc["ExecStart"][0].startswith("/usr/bin/bloomery-node --listen ${BLOOMERY_NODE_LISTEN}")
    assert os.access(inside(stage, "/usr/bin/bloomery-node"), os.X_OK)
    assert svc["EnvironmentFile"] == ["/etc/bloomery/bloomery-node.env"]
    assert svc["LoadCredential"] == ["cluster.secret:/etc/bloomery/cluster.secret"]
    assert "--secret ${CREDENTIALS_DIRECTORY}/cluster.secret" in svc["ExecStart"][0]
    env = inside(stage, "/etc/bloomery/bloomery-node.env")
    with open(env) as f:
        assert re.search(r"^BLOOMERY_NODE_LISTEN=tcp://\S+:\d+$", f.read(), re.M)
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze is not installed (Debian package systemd)")
    with open(inside(stage, NODE_UNIT)) as f:
        text = f.read().replace("/usr/bin/bloomery-node", inside(stage, "/usr/bin/bloomery-node"))
    unit = tmp_path / "bloomery-node.service"
    unit.write_text(text)
    rc, ours, out = verify(str(unit))
    assert rc == 0 and not ours, "systemd-analyze verify (status %d):\n%s" % (rc, out)


NODE_TEMPLATE = "/lib/systemd/system/bloomery-node@.service"
# The template's settings that name its instance; every other one is the plain unit's.
PER_INSTANCE = {("Unit", "Description"), ("Service", "Environment"), ("Service", "EnvironmentFile"),
                ("Service", "ExecStart"), ("Service", "RuntimeDirectory")}


def instance_folder_problems(sections):
    """Why the instances of a template would share a folder: systemd removes an
    instance's runtime folder when it stops, under the feet of another using it."""
    problems = []
    runtime = unit_values(sections, "Service", "RuntimeDirectory")
    if len(runtime) != 1 or "%i" not in runtime[0]:
        problems.append("RuntimeDirectory=%s does not name the instance (%%i)" % runtime)
    tmpdir = [item.split("=", 1)[1] for v in unit_values(sections, "Service", "Environment")
              for item in shlex.split(v) if item.startswith("TMPDIR=")]
    if len(runtime) == 1 and tmpdir != ["%t/" + runtime[0]]:
        problems.append("TMPDIR=%s is not the instance's runtime folder %%t/%s" % (tmpdir, runtime[0]))
    return problems


def test_node_template_is_installed_per_port_and_verifies(stage, tmp_path):
    """bloomery-node@.service (one node a stage on a host of several, the instance its
    PORT): installed beside bloomery-node.service with its paths for PREFIX, the
    instance used as the port and in its own env file and runtime folder, the rest as
    the plain unit, and systemd's own check of an instance."""
    path = inside(stage, NODE_TEMPLATE)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644, path
    u = parse_unit(path)
    assert set(u) == {"Unit", "Service", "Install"}, sorted(u)
    for section, items in u.items():
        for key, value in items:
            assert key not in BREAKS, "%s=%s: %s" % (key, value, BREAKS[key])
            assert key in KNOWN_KEYS[section], "[%s] %s= is not a key this test knows" % (section, key)
            assert "/usr/local" not in value, "[%s] %s=%s: not moved to PREFIX" % (section, key, value)
    for d in unit_values(u, "Unit", "Documentation"):
        assert os.path.isfile(inside(stage, d[len("file:"):])), d

    def svc(key):
        return unit_values(u, "Service", key)

    start = unit_value(u, "Service", "ExecStart")
    assert start.startswith("/usr/bin/bloomery-node --listen tcp://${BLOOMERY_NODE_HOST}:%i "), start
    assert "--secret ${CREDENTIALS_DIRECTORY}/cluster.secret" in start, start
    assert svc("LoadCredential") == ["cluster.secret:/etc/bloomery/cluster.secret"]
    assert svc("EnvironmentFile") == ["/etc/bloomery/bloomery-node.env",
                                      "-/etc/bloomery/bloomery-node@%i.env"]
    # the default address, set before the files so that either may replace it
    before_files = u["Service"][:[k for k, _ in u["Service"]].index("EnvironmentFile")]
    assert ("Environment", "BLOOMERY_NODE_HOST=0.0.0.0") in before_files, u["Service"]
    assert unit_value(u, "Service", "RuntimeDirectory") == "bloomery-node-%i"
    assert instance_folder_problems(u) == []

    # the rest is the plain unit's, so the two do not drift apart
    plain = parse_unit(inside(stage, NODE_UNIT))
    for section in ("Unit", "Service", "Install"):
        ours = [kv for kv in u[section] if (section, kv[0]) not in PER_INSTANCE]
        theirs = [kv for kv in plain[section] if (section, kv[0]) not in PER_INSTANCE]
        assert ours == theirs, "[%s] differs from bloomery-node.service's" % section

    # the check is worth something: a template whose instances share a folder fails it
    with open(path) as f:
        text = f.read()
    shared = tmp_path / "shared.service"
    shared.write_text(text.replace("bloomery-node-%i", "bloomery-node"))
    assert instance_folder_problems(parse_unit(str(shared))), "a shared runtime folder passed"

    # the instance name is used only as a port: the node refuses any other
    secret = tmp_path / "cluster.secret"
    secret.write_text("ab" * 32)
    secret.chmod(0o600)
    node = inside(stage, "/usr/bin/bloomery-node")
    argv = [node if w == "/usr/bin/bloomery-node" else w for w in shlex.split(start)
            if w != "$BLOOMERY_NODE_ARGS"]
    argv = [w.replace("${BLOOMERY_NODE_HOST}", "127.0.0.1").replace("%i", "abc")
            .replace("${CREDENTIALS_DIRECTORY}", str(tmp_path)) for w in argv]
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=30)
    assert p.returncode == 1 and "event=start_failed" in p.stdout, p.stdout
    assert "'tcp://127.0.0.1:abc' is not tcp://HOST:PORT" in p.stdout, p.stdout

    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze is not installed (Debian package systemd)")
    # verify loads an instance from the template beside it
    (tmp_path / "bloomery-node@.service").write_text(text.replace("/usr/bin/bloomery-node", node))
    rc, ours, out = verify(str(tmp_path / "bloomery-node@9000.service"))
    assert rc == 0 and not ours, "systemd-analyze verify (status %d):\n%s" % (rc, out)
    # and reads the template: a misspelt key in it is reported for the instance
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "bloomery-node@.service").write_text(
        text.replace("/usr/bin/bloomery-node", node).replace("ProtectSystem=strict", "ProtectSytem=strict"))
    _, ours, out = verify(str(bad / "bloomery-node@9000.service"))
    assert any("ProtectSytem" in line for line in ours), out
