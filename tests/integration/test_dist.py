"""`make dist` and the tarball it writes: its name and layout, the run paths and
bundled libraries that let its programs run where nothing was installed, and the
unpacked bloomery-serve answering a completion with no library path, no build tree
on PATH and its own folder as the working directory; deploy/dist.sh refusing a build
folder that lacks a program.

The tarball is written to a folder of this test (DISTDIR), from the build the other
integration tests use (BLOOMERY_BUILD, default build), which make brings up to date
first as it does for `make install`; the build's own files are checked to be left as
they were.
"""
import hashlib
import os
import re
import shutil
import subprocess
import tarfile
import tempfile

import pytest

import serverctl
from sse import post

ROOT = serverctl.ROOT
BUILD_DIR = os.path.join(ROOT, serverctl.BUILD)
DIST_SH = os.path.join(ROOT, "deploy", "dist.sh")

# The programs a user runs (those of test_install.py, and ringbench); every other
# bloomery-* of the build's bin/ must be in the tarball too.
PROGRAMS = ["bloomery-serve", "bloomery-worker", "bloomery-hosttier", "bloomery-node", "bloomery-cli",
            "bloomery-bench", "bloomery-gguf", "bloomery-mkmodel", "bloomery-tokenize",
            "bloomery-template", "bloomery-stepbench", "bloomery-ringbench", "bloomery-load", "bloomery-launch"]

# The libraries the tarball leaves to the host (deploy/dist.sh says why): glibc's,
# GCC's runtime, the NVIDIA driver's. Any other library must come from its lib/.
SYSTEM_LIBS = re.compile(r"(linux-vdso\.so\.1|ld-linux[\w.-]*\.so\.\d+|libc\.so\.6|libm\.so\.6|"
                         r"libmvec\.so\.1|libpthread\.so\.0|libdl\.so\.2|librt\.so\.1|"
                         r"libresolv\.so\.2|libutil\.so\.1|libanl\.so\.1|libgcc_s\.so\.1|"
                         r"libstdc\+\+\.so\.6|libcuda\.so\.1|libnvidia-[\w.-]+\.so[\d.]*)")
# What else may be mapped into a running program: glibc's name-service modules, which
# it loads itself from the host's glibc.
RUNTIME_LIBS = re.compile(r"libnss_\w+\.so\.\d+")

# The demo model of `make serve` (the Makefile's DEMO_MODEL recipe).
DEMO_FLAGS = ["--layers", "4", "--n-embd", "256", "--experts", "8", "--experts-used", "2",
              "--expert-ff", "256"]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def build_bin_state():
    """{name: (sha256, mode)} of the build's programs."""
    out = {}
    for name in sorted(os.listdir(serverctl.BIN)):
        path = os.path.join(serverctl.BIN, name)
        if name.startswith("bloomery-") and os.path.isfile(path):
            out[name] = (sha256(path), os.stat(path).st_mode)
    return out


def meson_version():
    with open(os.path.join(ROOT, "meson.build")) as f:
        m = re.search(r"project\([^)]*?\bversion:\s*'([^']+)'", f.read(), re.S)
    assert m, "meson.build's project() names no version"
    return m.group(1)


def build_has_cuda():
    with open(os.path.join(BUILD_DIR, "bl_config.h")) as f:
        return re.search(r"^#define BL_HAVE_CUDA 1$", f.read(), re.M) is not None


def is_elf(path):
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def dynamic(path):
    p = subprocess.run(["readelf", "-d", path], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=30)
    assert p.returncode == 0, p.stdout
    return p.stdout


def runpath(path):
    """The DT_RUNPATH (or DT_RPATH) of an ELF file, or None."""
    m = re.search(r"\((?:RUNPATH|RPATH)\)\s+Library r(?:un)?path: \[([^\]]*)\]", dynamic(path))
    return m.group(1) if m else None


def soname(path):
    """The DT_SONAME of a shared library (what a program names it by), else its file name."""
    m = re.search(r"\(SONAME\)\s+Library soname: \[([^\]]*)\]", dynamic(path))
    return m.group(1) if m else os.path.basename(path)


def ldd(path):
    """[(soname, resolved path or None)] as the loader would find them with no
    LD_LIBRARY_PATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD")}
    p = subprocess.run(["ldd", path], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, env=env, timeout=60)
    assert p.returncode == 0, "ldd %s: %s" % (path, p.stdout)
    out = []
    for line in p.stdout.splitlines():
        m = re.match(r"\s*(\S+) => (?:not found|(\S+) \(0x[0-9a-f]+\))", line)
        if m:
            out.append((m.group(1), m.group(2)))
    return out


def inside(path, folder):
    return os.path.realpath(path).startswith(os.path.realpath(folder) + os.sep)


class Dist:
    def __init__(self, tarball, top, log):
        self.tarball = tarball
        self.top = top
        self.log = log

    def path(self, *parts):
        return os.path.join(self.top, *parts)


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    """`make dist DISTDIR=...` against the tests' build, unpacked into an empty folder."""
    if not os.path.isdir(BUILD_DIR):
        pytest.skip("%s is not built (run make)" % BUILD_DIR)
    outdir = str(tmp_path_factory.mktemp("dist"))
    before = build_bin_state()
    # none of an outer make's flags or variables
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "DISTDIR")}
    p = subprocess.run(["make", "--no-print-directory", "-C", ROOT, "BUILD=" + BUILD_DIR,
                        "DISTDIR=" + outdir, "dist"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, env=env, timeout=1800)
    assert p.returncode == 0, "make dist failed (%d):\n%s" % (p.returncode, p.stdout[-6000:])
    assert build_bin_state() == before, "make dist changed the build's own programs"
    tarball = p.stdout.strip().splitlines()[-1]
    assert os.path.isfile(tarball), "make dist's last line is not the tarball:\n" + p.stdout[-2000:]
    unpacked = str(tmp_path_factory.mktemp("unpacked"))
    u = subprocess.run(["tar", "-xzf", tarball, "-C", unpacked], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=120)
    assert u.returncode == 0, u.stdout
    tops = os.listdir(unpacked)
    assert len(tops) == 1, "the tarball holds %s, not one folder" % tops
    yield Dist(tarball, os.path.join(unpacked, tops[0]), p.stdout)
    # some 200 MB with a CUDA build: not left for pytest to keep
    shutil.rmtree(unpacked, ignore_errors=True)
    shutil.rmtree(outdir, ignore_errors=True)


# --- the tarball

def test_name_says_version_and_cuda(dist):
    name = "bloomery-%s-linux-x86_64%s" % (meson_version(), "-cuda" if build_has_cuda() else "")
    assert os.path.basename(dist.tarball) == name + ".tar.gz", dist.tarball
    assert os.path.basename(dist.top) == name
    with tarfile.open(dist.tarball) as t:
        for m in t.getmembers():
            assert m.name == name or m.name.startswith(name + "/"), m.name
            assert m.uid == 0 and m.gid == 0, "%s is owned by %d:%d" % (m.name, m.uid, m.gid)


def test_every_program_is_there_with_its_run_path(dist):
    built = [n for n in os.listdir(serverctl.BIN) if n.startswith("bloomery-")]
    bin_dir = dist.path("bin")
    have = sorted(os.listdir(bin_dir))
    for name in set(PROGRAMS) | set(built):
        assert name in have, "bin/ lacks %s: %s" % (name, have)
    for name in have:
        path = os.path.join(bin_dir, name)
        assert os.path.isfile(path) and os.access(path, os.X_OK), path
        assert os.stat(path).st_mode & 0o777 == 0o755, "%s has mode %o" % (name, os.stat(path).st_mode)
        if is_elf(path):
            assert runpath(path) == "$ORIGIN/../lib", "%s: run path %r" % (name, runpath(path))
        else:
            assert name in ("bloomery-load", "bloomery-launch"), "%s is not an ELF program" % name
    # the build's own programs keep the run path the build gave them
    assert runpath(os.path.join(serverctl.BIN, "bloomery-serve")) != "$ORIGIN/../lib"


def test_libraries_are_the_tarballs_or_the_base_systems(dist):
    lib_dir = dist.path("lib")
    libs = sorted(os.listdir(lib_dir))
    for name in libs:
        assert not SYSTEM_LIBS.fullmatch(name), "lib/ bundles %s, which the host must provide" % name
        assert runpath(os.path.join(lib_dir, name)) == "$ORIGIN", name
    used = set()
    files = [dist.path("bin", n) for n in sorted(os.listdir(dist.path("bin")))]
    files = [f for f in files if is_elf(f)] + [os.path.join(lib_dir, n) for n in libs]
    for f in files:
        for soname, path in ldd(f):
            where = os.path.relpath(f, dist.top)
            assert path, "%s: %s is not found" % (where, soname)
            if SYSTEM_LIBS.fullmatch(soname):
                assert not inside(path, lib_dir), "%s: %s from lib/" % (where, soname)
                continue
            assert inside(path, lib_dir), \
                "%s takes %s from %s, not from the tarball's lib/" % (where, soname, path)
            used.add(os.path.basename(path))
    assert used == set(libs), "lib/ holds libraries no program needs: %s" % sorted(set(libs) - used)
    # every bundled library is accounted for, with its package's copyright
    with open(dist.path("share", "doc", "bloomery", "third-party", "LIBRARIES")) as f:
        listed = {line.split()[0]: line.split()[1] for line in f if line.strip() and line[0] != "#"}
    assert sorted(listed) == libs
    for soname, pkg in listed.items():
        if pkg != "(not":
            assert os.path.isfile(dist.path("share", "doc", "bloomery", "third-party", pkg,
                                            "copyright")), "%s (%s) has no copyright file" % (soname, pkg)


def test_docs_and_examples(dist):
    doc = dist.path("share", "doc", "bloomery")
    assert os.path.isfile(os.path.join(doc, "README.md"))
    for name in os.listdir(os.path.join(ROOT, "docs")):
        if name.endswith(".md"):
            assert os.path.isfile(os.path.join(doc, "docs", name)), name
    assert os.path.isfile(os.path.join(doc, "LICENSE")) == os.path.isfile(os.path.join(ROOT, "LICENSE"))
    examples = sorted(os.listdir(dist.path("examples")))
    assert examples == ["bloomery-node.env", "bloomery-node.service", "bloomery-node@.service",
                        "bloomery-wait-ready", "bloomery.env", "bloomery.service"], examples
    assert os.access(dist.path("examples", "bloomery-wait-ready"), os.X_OK)
    # the unit names the tarball's own files, as unpacked or linked at /opt/bloomery
    with open(dist.path("examples", "bloomery.service")) as f:
        unit = f.read()
    settings = "".join(line for line in unit.splitlines(True) if not line.startswith("#"))
    assert "/usr/local" not in settings, settings
    named = re.findall(r"/opt/bloomery/([\w./-]*\w)", settings)
    assert "bin/bloomery-serve" in named and "examples/bloomery-wait-ready" in named, named
    with open(dist.path("examples", "bloomery.env")) as f:
        env = f.read()
    for text, what in ((unit, "bloomery.service"), (env, "bloomery.env")):
        for rel in re.findall(r"/opt/bloomery/([\w./-]*\w)", text):
            assert os.path.exists(dist.path(rel)), "%s names /opt/bloomery/%s, not in the tarball" % (what, rel)
    # the node units of a cluster's other hosts start the tarball's node
    for name in ("bloomery-node.service", "bloomery-node@.service"):
        with open(dist.path("examples", name)) as f:
            node = "".join(line for line in f if not line.startswith("#"))
        assert "/usr/local" not in node, (name, node)
        named = re.findall(r"/opt/bloomery/([\w./-]*\w)", node)
        assert "bin/bloomery-node" in named, (name, named)
        for rel in named:
            assert os.path.exists(dist.path(rel)), "%s names /opt/bloomery/%s, not in the tarball" % (name, rel)


# --- the unpacked server

class UnpackedServer(serverctl.Server):
    """bloomery-serve from the unpacked tarball: serverctl's launch, but with the
    environment given whole (not added to this process's) and its own working folder."""

    def __init__(self, program, model, args, env, cwd, log_dir):
        super().__init__(model, args, env=env, log_dir=log_dir)
        self.program = program
        self.cwd = cwd

    def command(self):
        return [self.program, "--host", "127.0.0.1", "--port", str(self.port),
                "-m", self.model] + self.args

    def launch(self):
        if self.port is None:  # start() picks another port after a clash
            self.port = serverctl.free_port()
        fd, self.log_path = tempfile.mkstemp(prefix="serve-", suffix=".log", dir=self.log_dir)
        self.shm_before = serverctl.shm_objects()
        self.dirs_before = frozenset(serverctl.runtime_dirs())
        self.proc = subprocess.Popen(self.command(), stdout=fd, stderr=fd, stdin=subprocess.DEVNULL,
                                     env=self.env, cwd=self.cwd)
        os.close(fd)
        return self


def clean_env():
    """This process's environment with no library path, no preload, no build tree on
    PATH and none of the tests' variables."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD") and not k.startswith(("BLOOMERY_", "LLAMA_"))}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "/usr/bin:/bin").split(os.pathsep)
                                  if p and not inside(p, ROOT) and os.path.realpath(p) != ROOT)
    env["LD_LIBRARY_PATH"] = ""
    return env


def mapped_libs(pid):
    """The shared objects a process has mapped."""
    with open("/proc/%d/maps" % pid) as f:
        return {line.split()[-1] for line in f
                if len(line.split()) >= 6 and ".so" in os.path.basename(line.split()[-1])}


def test_unpacked_server_serves_the_demo_model(dist, tmp_path):
    work = tmp_path / "run"
    work.mkdir()
    model = str(work / "bloomery-demo.gguf")
    p = subprocess.run([serverctl.program("bloomery-mkmodel"), "-o", model, "--tokenizer",
                        serverctl.TOKENIZER] + DEMO_FLAGS, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=300)
    assert p.returncode == 0, "bloomery-mkmodel: " + p.stdout
    bin_dir = dist.path("bin")
    env = clean_env()
    assert ROOT not in env["PATH"], env["PATH"]
    # one thread each; the routed experts to the hosttier, so that it must be found too
    args = ["-t", "1", "-tb", "1", "-c", "1024", "-ot", r"\.ffn_(up|down|gate)_exps=HOSTTIER"]
    srv = UnpackedServer(os.path.join(bin_dir, "bloomery-serve"), model, args, env, str(work),
                         str(tmp_path))
    try:
        srv.start()
    except serverctl.ServerError as e:
        pytest.fail(str(e), pytrace=False)
    try:
        # its processes are the tarball's programs, each with the tarball's libraries
        procs = {"bloomery-serve": srv.pid}
        procs.update({name: pid for pid, name, _ in srv.children()})
        for name in ("bloomery-serve", "bloomery-worker", "bloomery-hosttier"):
            assert name in procs, "no %s below the server: %s\n%s" % (name, procs, srv.log())
            exe = os.readlink("/proc/%d/exe" % procs[name])
            assert exe == os.path.join(bin_dir, name), exe
            for lib in mapped_libs(procs[name]):
                if inside(lib, dist.path("lib")):
                    continue
                so = soname(lib)
                assert SYSTEM_LIBS.fullmatch(so) or RUNTIME_LIBS.fullmatch(so), \
                    "%s has %s (%s) mapped, from outside the tarball" % (name, lib, so)

        r = post(srv.url, "/completion", {"prompt": "The old lighthouse keeper", "n_predict": 4,
                                          "temperature": 0, "ignore_eos": True})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["tokens_predicted"] == 4, body
        assert isinstance(body["content"], str) and body["content"], body
    finally:
        problems = srv.stop()
        os.unlink(model)  # 65 MB
    assert not problems, "%s\n%s" % ("; ".join(problems), srv.log())
    srv.discard_log()


# --- what dist.sh refuses

def run_dist_sh(build, out):
    return subprocess.run(["bash", DIST_SH, build, out], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=300)


def test_a_build_without_a_program_is_refused(tmp_path):
    if not os.path.isdir(BUILD_DIR):
        pytest.skip("%s is not built (run make)" % BUILD_DIR)
    fake = tmp_path / "build"
    (fake / "bin").mkdir(parents=True)
    with open(os.path.join(BUILD_DIR, "bl_config.h")) as f:
        (fake / "bl_config.h").write_text(f.read())
    for name in os.listdir(serverctl.BIN):
        if name.startswith("bloomery-") and name != "bloomery-worker":
            os.symlink(os.path.join(serverctl.BIN, name), str(fake / "bin" / name))
    out = tmp_path / "out"
    p = run_dist_sh(str(fake), str(out))
    assert p.returncode != 0, p.stdout + p.stderr
    assert "lacks bloomery-worker" in p.stderr, p.stderr
    assert not out.exists() or not any(out.iterdir()), "a refused build left %s" % list(out.iterdir())


def test_a_folder_that_is_not_a_build_is_refused(tmp_path):
    p = run_dist_sh(str(tmp_path), str(tmp_path / "out"))
    assert p.returncode != 0, p.stdout + p.stderr
    assert "not a configured build folder" in p.stderr, p.stderr
    assert not (tmp_path / "out").exists()
