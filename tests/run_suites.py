#!/usr/bin/python3
"""Runs every test suite of `make test` and prints one total line.

Suites: the cmocka unit tests (release build, then again under ASan and UBSan),
the pytest suites (tests/reference, tests/tools), the server's integration tests
(tests/integration: pytest against a real bloomery-serve), the Node client tests
(tests/clients: the official OpenAI and Anthropic SDKs against a server started
here) and the libFuzzer targets for a fixed time each. Each suite prints its own output and a summary line; the last
line is "N passed, N failed, N skipped" over all of them. Exit status 1 when
anything failed.

Environment: BLOOMERY_SHARED (default: ../shared beside the repository) is where
the oracles live; suites that need it skip with a message when it is absent.
BLOOMERY_FUZZ_SECONDS overrides the fuzzing time (default 40 per target).
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = "/usr/bin/python3"
PYTEST_DIRS = ["tests/reference", "tests/tools"]
INTEGRATION_DIRS = ["tests/integration"]
CLIENT_TESTS = "tests/clients"
# Each libFuzzer target and its seeds: a script that writes them (the GGUF seeds are
# binary), or a folder of seed files in the tree, which the run reads but never
# writes (what the run adds goes to the build folder).
FUZZ_TARGETS = {"fuzz_gguf": "tests/fuzz/make_corpus.py",
                "fuzz_arch": "tests/fuzz/make_corpus.py",
                "fuzz_args": "tests/fuzz/corpus/fuzz_args",
                "fuzz_grammar": "tests/fuzz/make_grammar_corpus.py",
                "fuzz_json_schema": "tests/fuzz/corpus/fuzz_json_schema",
                "fuzz_template": "tests/fuzz/corpus/fuzz_template",
                "fuzz_tools": "tests/fuzz/corpus/fuzz_tools",
                "fuzz_chat": "tests/fuzz/corpus/fuzz_chat",
                "fuzz_http": "tests/fuzz/corpus/fuzz_http",
                "fuzz_step": "tests/fuzz/corpus/fuzz_step",
                "fuzz_msg": "tests/fuzz/corpus/fuzz_msg",
                "fuzz_xread": "tests/fuzz/corpus/fuzz_xread",
                "fuzz_slotfile": "tests/fuzz/corpus/fuzz_slotfile",
                "fuzz_hostfile": "tests/fuzz/corpus/fuzz_hostfile",
                "fuzz_node": "tests/fuzz/corpus/fuzz_node"}
FUZZ_SECONDS = 40  # per target: the suite stays near five minutes


class Tally:
    def __init__(self):
        self.passed = self.failed = self.skipped = 0
        self.failures = []

    def add(self, other, suite):
        self.passed += other.passed
        self.failed += other.failed
        self.skipped += other.skipped
        self.failures += [("%s: %s" % (suite, f)) if suite else f for f in other.failures]

    def line(self):
        return "%d passed, %d failed, %d skipped" % (self.passed, self.failed, self.skipped)


TAP_LINE = re.compile(r"^(ok|not ok)\b\s*\d*\s*-?\s*(.*)$", re.I)
TAP_SKIP = re.compile(r"#\s*(SKIP|TODO)\b", re.I)


def run_tap(exe, env):
    """Runs one cmocka program with TAP output; a non-zero exit with no failing
    test (a sanitizer report, a crash) counts as one more failure."""
    t = Tally()
    p = subprocess.run([exe], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, errors="replace", timeout=900)
    sys.stdout.write(p.stdout)
    for line in p.stdout.splitlines():
        m = TAP_LINE.match(line.strip())
        if not m:
            continue
        if TAP_SKIP.search(m.group(2)):
            t.skipped += 1
        elif m.group(1).lower() == "ok":
            t.passed += 1
        else:
            t.failed += 1
            t.failures.append("%s: %s" % (os.path.basename(exe), m.group(2)))
    if p.returncode != 0 and t.failed == 0:
        t.failed += 1
        t.failures.append("%s exited with status %d" % (os.path.basename(exe), p.returncode))
    return t


def suite_unit(build, sanitized):
    env = dict(os.environ, CMOCKA_MESSAGE_OUTPUT="TAP")
    if sanitized:
        env["ASAN_OPTIONS"] = "detect_leaks=1:abort_on_error=0:exitcode=86"
        env["UBSAN_OPTIONS"] = "halt_on_error=1:print_stacktrace=1:exitcode=87"
    exes = sorted(glob.glob(os.path.join(build, "tests", "unit", "test_*")))
    exes = [e for e in exes if os.access(e, os.X_OK) and os.path.isfile(e)]
    t = Tally()
    if not exes:
        t.failed += 1
        t.failures.append("no unit test programs in %s" % build)
    for exe in exes:
        t.add(run_tap(exe, env), "")
    return t


def suite_pytest(build, dirs=PYTEST_DIRS, name="pytest"):
    t = Tally()
    xml = os.path.join(build, "%s-results.xml" % name)
    env = dict(os.environ, BLOOMERY_BIN=os.path.abspath(os.path.join(build, "bin")),
               BLOOMERY_BUILD=build, PYTHONDONTWRITEBYTECODE="1")
    dirs = [d for d in dirs if os.path.isdir(os.path.join(ROOT, d))]
    if os.path.exists(xml):
        os.remove(xml)
    p = subprocess.run([PY, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                        "--junitxml", xml] + dirs, cwd=ROOT, env=env)
    if not os.path.exists(xml):
        t.failed += 1
        t.failures.append("pytest wrote no results (status %d)" % p.returncode)
        return t
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = "%s::%s" % (case.get("classname"), case.get("name"))
        if case.find("skipped") is not None:
            t.skipped += 1
        elif case.find("failure") is not None or case.find("error") is not None:
            t.failed += 1
            t.failures.append(name)
        else:
            t.passed += 1
    # exit 5 is "no tests collected": not a failure of ours if nothing was there
    if p.returncode not in (0, 1, 5) and t.failed == 0:
        t.failed += 1
        t.failures.append("pytest exited with status %d" % p.returncode)
    return t


NODE_COUNT = re.compile(r"^# (tests|pass|fail|cancelled|skipped|todo) (\d+)$")


def suite_clients(build):
    """Starts a server on the test model and runs the Node tests against it; counts
    come from node --test's TAP summary, failure names from its `not ok` lines."""
    import tempfile
    t = Tally()
    files = sorted(glob.glob(os.path.join(ROOT, CLIENT_TESTS, "*.test.mjs")))
    if not files:
        return t
    os.environ["BLOOMERY_BIN"] = os.path.abspath(os.path.join(build, "bin"))
    sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
    import serverctl
    work = tempfile.mkdtemp(prefix="bloomery-clients-")
    srv = None
    try:
        model = serverctl.make_model(os.path.join(work, "test.gguf"))
        srv = serverctl.Server(model, serverctl.SHARED_FLAGS, log_dir=work).start()
        env = dict(os.environ, BLOOMERY_URL=srv.url)
        p = subprocess.run(["node", "--test", "--test-reporter=tap"] + files, cwd=ROOT, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           errors="replace", timeout=600)
    except (serverctl.ServerError, OSError, subprocess.TimeoutExpired) as e:
        t.failed += 1
        t.failures.append("client tests could not run: %s" % e)
        if srv is not None:
            srv.kill()
        return t
    finally:
        if srv is not None and srv.proc.poll() is None:
            problems = srv.stop()
            for problem in problems:
                t.failed += 1
                t.failures.append("server after the client tests: %s" % problem)
            if problems:
                print("the server's log:\n" + srv.log())
        shutil.rmtree(work, ignore_errors=True)
    sys.stdout.write(p.stdout)
    counts = {}
    for line in p.stdout.splitlines():
        m = NODE_COUNT.match(line.strip())
        if m:
            counts[m.group(1)] = int(m.group(2))
        m = re.match(r"^\s*not ok \d+ - (.*)$", line)
        if m and not TAP_SKIP.search(m.group(1)):
            t.failures.append("clients: %s" % m.group(1))
    if "pass" not in counts:
        t.failed += 1
        t.failures.append("node --test printed no summary (status %d)" % p.returncode)
        return t
    t.passed += counts.get("pass", 0)
    t.failed += counts.get("fail", 0) + counts.get("cancelled", 0)
    t.skipped += counts.get("skipped", 0) + counts.get("todo", 0)
    if p.returncode != 0 and t.failed == 0:
        t.failed += 1
        t.failures.append("node --test exited with status %d" % p.returncode)
    return t


def suite_fuzz(build, seconds):
    t = Tally()
    for target, seeds in FUZZ_TARGETS.items():
        exe = os.path.join(build, "tests", "fuzz", target)
        if not os.access(exe, os.X_OK):
            t.failed += 1
            t.failures.append("%s is not built in %s" % (target, build))
            continue
        corpus = os.path.join(build, "corpus-" + target)
        os.makedirs(corpus, exist_ok=True)
        dirs = [corpus]
        if seeds.endswith(".py"):
            subprocess.run([PY, os.path.join(ROOT, seeds), corpus], check=True)
        else:
            dirs.append(os.path.join(ROOT, seeds))
        crashes = os.path.join(build, "crashes-" + target)
        os.makedirs(crashes, exist_ok=True)
        print("fuzz: %s for %d s from %s" % (target, seconds, " ".join(dirs)), flush=True)
        # undefined behaviour is a finding too: without this UBSan reports and goes on
        env = dict(os.environ, UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1")
        p = subprocess.run([exe, "-max_total_time=%d" % seconds, "-timeout=10",
                            "-rss_limit_mb=2048", "-print_final_stats=1",
                            "-artifact_prefix=" + crashes + "/"] + dirs,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           errors="replace", env=env)
        lines = p.stdout.splitlines()
        # what the target said it found (its own check, a sanitizer) sits far above
        # the stack trace and the stats: shown beside the tail
        found = [l for l in lines[:-25]
                 if re.match(r"(%s: |==\d+==\s*ERROR|.*runtime error:|SUMMARY: )" % target, l)]
        print("\n".join(found[:20] + lines[-25:]))
        if p.returncode == 0:
            t.passed += 1
        else:
            t.failed += 1
            t.failures.append("%s found a failure (status %d); inputs in %s"
                              % (target, p.returncode, crashes))
    return t


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--asan-build", default="build-asan")
    ap.add_argument("--fuzz-build", default="build-fuzz")
    ap.add_argument("--only", choices=["unit", "asan", "pytest", "integration", "clients", "fuzz"],
                    action="append")
    args = ap.parse_args()
    os.chdir(ROOT)

    shared = os.environ.get("BLOOMERY_SHARED") or os.path.join(os.path.dirname(ROOT), "shared")
    if os.path.isdir(shared):
        os.environ["BLOOMERY_SHARED"] = os.path.abspath(shared)
    else:
        print("run_suites: %s is absent: tests that need the shared oracles and models skip"
              % shared)

    suites = [
        ("unit", lambda: suite_unit(args.build, False)),
        ("asan", lambda: suite_unit(args.asan_build, True)),
        ("pytest", lambda: suite_pytest(args.build)),
        ("integration", lambda: suite_pytest(args.build, INTEGRATION_DIRS, "integration")),
        ("clients", lambda: suite_clients(args.build)),
        ("fuzz", lambda: suite_fuzz(args.fuzz_build,
                                    int(os.environ.get("BLOOMERY_FUZZ_SECONDS", FUZZ_SECONDS)))),
    ]
    total = Tally()
    results = []
    for name, fn in suites:
        if args.only and name not in args.only:
            continue
        print("=== suite %s" % name, flush=True)
        t0 = time.monotonic()
        t = fn()
        results.append((name, t, time.monotonic() - t0))
        total.add(t, name)
        sys.stdout.flush()

    print("=== summary")
    for name, t, secs in results:
        print("%-11s %s (%.0f s)" % (name, t.line(), secs))
    for f in total.failures:
        print("FAILED %s" % f)
    print(total.line(), flush=True)
    return 1 if total.failed else 0


if __name__ == "__main__":
    sys.exit(main())
