"""The contract docs/agents.md gives a script or an agent that runs bloomery: every exit
path of bloomery-serve, bloomery-cli and bloomery-bench, one row each, with its exit
status and the event or message it prints; and the doc's exit-code tables checked
against the rows, so that neither can change without the other.

A row: (id, program, arguments, environment, action, expected status, stream, regex).
Placeholders in the arguments: {tiny} (bloomery-mkmodel's default model, ~5 MB),
{copy} (a private copy of it), {notgguf}, {trunc} (the tiny model cut short),
{broken} (the tiny model with a tensor renamed: the router accepts it, the worker
does not), {missing}, {port} (a free port), {busy} (a port another socket listens
on), {tmp}. action: None runs the program until it exits; for bloomery-serve,
"sigterm" and "sigint" start it, wait for /health 200 and send the signal, "touch"
changes the model file's modification time once it is ready. stream: "out" or "err"
(for bloomery-serve, "err" is its log). The whole module takes a few seconds.
"""
import os
import re
import shutil
import signal
import socket
import subprocess

import pytest

import serverctl

DOC = os.path.join(serverctl.ROOT, "docs", "agents.md")
PROGRAMS = ("bloomery-serve", "bloomery-cli", "bloomery-bench")
RUN_TIMEOUT = 30   # seconds a row may run; each takes well under one
STOP_TIMEOUT = 20  # seconds from the signal (or the touch) to the exit

VERSION = r"^%s \d+\.\d+\.\d+$"
BENCH = ["-m", "{tiny}", "-p", "8", "-n", "4", "-r", "1", "--no-roofline", "-t", "1"]
CLI = ["-m", "{tiny}", "-p", "hello", "-n", "4", "-t", "1", "-s", "1", "-c", "256"]

S, C, B = PROGRAMS
ROWS = [
    # --- bloomery-serve: 0 ---
    ("serve-help", S, ["--help"], {}, None, 0, "out", r"^usage: bloomery-serve -m FILE"),
    ("serve-version", S, ["--version"], {}, None, 0, "out", VERSION % S),
    ("serve-sigterm", S, [], {}, "sigterm", 0, "err",
     r"(?s)serve event=ready model=.*serve event=shutdown reason=SIGTERM.*serve event=stopped exit_code=0"),
    ("serve-sigint", S, [], {}, "sigint", 0, "err",
     r"(?s)serve event=shutdown reason=SIGINT.*serve event=stopped exit_code=0"),
    ("serve-dry-run", S, ["-m", "{tiny}", "--port", "{busy}", "-t", "1", "--dry-run"], {}, None, 0, "out",
     r"^fits: yes$"),
    # --- bloomery-serve: 2, the flags ---
    ("serve-unknown-flag", S, ["--bogus-flag"], {}, None, 2, "err",
     r"^bloomery-serve: unknown flag '--bogus-flag'\nTry 'bloomery-serve --help'\."),
    ("serve-bad-value", S, ["-m", "{tiny}", "--port", "abc"], {}, None, 2, "err",
     r"^bloomery-serve: --port: 'abc' is not an integer"),
    ("serve-out-of-range", S, ["-m", "{tiny}", "--port", "99999"], {}, None, 2, "err",
     r"^bloomery-serve: --port: 99999 is outside 0\.\.65535"),
    ("serve-bad-env", S, ["-m", "{tiny}"], {"LLAMA_ARG_PORT": "abc"}, None, 2, "err",
     r"--port: 'abc' is not an integer \(from LLAMA_ARG_PORT\)"),
    ("serve-bad-size", S, ["-m", "{tiny}", "--port", "{port}", "--experts-ram", "12Q"], {}, None, 2, "err",
     r"^bloomery-serve: --experts-ram"),
    ("serve-log-colors", S, ["-m", "{tiny}", "--log-colors", "maybe"], {}, None, 2, "err",
     r"^bloomery-serve: --log-colors: 'maybe' is not on, off or auto"),
    ("serve-config-missing", S, ["-m", "{tiny}", "--config", "{missing}"], {}, None, 2, "err",
     r"^bloomery-serve: .*missing\.gguf"),
    # --- bloomery-serve: 1, the start ---
    ("serve-no-model", S, ["--port", "{port}"], {}, None, 1, "err",
     r"event=start_failed reason=no model: give -m FILE or -hf REPO"),
    ("serve-missing-model", S, ["-m", "{missing}", "--port", "{port}"], {}, None, 1, "err",
     r"serve event=start_failed reason=\S*missing\.gguf: cannot open: No such file"),
    ("serve-not-gguf", S, ["-m", "{notgguf}", "--port", "{port}"], {}, None, 1, "err",
     r"serve event=start_failed reason=\S*notgguf\.txt: bad magic .*not a GGUF file"),
    ("serve-truncated", S, ["-m", "{trunc}", "--port", "{port}"], {}, None, 1, "err",
     r"serve event=start_failed reason=\S*trunc\.gguf: .*past the end of the file"),
    ("serve-port-in-use", S, ["-m", "{tiny}", "--port", "{busy}", "-t", "1"], {}, None, 1, "err",
     r"serve event=start_failed reason=cannot listen on 127\.0\.0\.1:\d+: address already in use"),
    ("serve-refused-flag", S, ["-m", "{tiny}", "--port", "{port}", "--models-preset", "x.ini"], {}, None, 1, "err",
     r"serve event=start_failed reason=--models-preset: .*not supported"),
    ("serve-value-checked-late", S, ["-m", "{tiny}", "--port", "{port}", "--load-mode", "weird"], {}, None, 1,
     "err", r"serve event=start_failed reason=--load-mode: 'weird' is not"),
    ("serve-model-and-hf", S, ["-m", "{tiny}", "-hf", "a/b", "--offline", "--port", "{port}"], {}, None, 1, "err",
     r"serve event=start_failed reason=give -m FILE or -hf REPO, not both"),
    ("serve-hf-not-cached", S, ["-hf", "a/b", "--offline", "--port", "{port}"], {}, None, 1, "err",
     r"serve event=start_failed reason=--offline: a/b is not in the cache"),
    ("serve-dry-run-refused", S, ["-m", "{tiny}", "--port", "{port}", "--dry-run", "--n-cpu-moe", "99"], {}, None, 1,
     "out", r"^fits: no\n  --n-cpu-moe 99: the model has \d+ layers$"),
    ("serve-log-file", S, ["-m", "{tiny}", "--port", "{port}", "--log-file", "{missing}/serve.log"], {}, None, 1,
     "err", r"^bloomery-serve: --log-file \S+: No such file or directory"),
    ("serve-log-disable", S, ["-m", "{missing}", "--port", "{port}", "--log-disable"], {}, None, 1, "err",
     r"\A(?![\s\S]*event=)bloomery-serve: \S*missing\.gguf: cannot open"),
    # --- bloomery-serve: 1, the load and later ---
    ("serve-load-failed", S, ["-m", "{broken}", "--port", "{port}", "-t", "1"], {}, None, 1, "err",
     r"(?s)worker0 event=start_failed reason=.*serve event=load_failed reason=worker 0: \S*broken\.gguf: "
     r"tensor 'output_norm\.weight' is missing.*serve event=stopped exit_code=1"),
    ("serve-model-changed", S, [], {}, "touch", 1, "err",
     r"(?s)serve event=model_changed reason=\"\S*copy\.gguf: the model file was modified.*"
     r"serve event=cluster_failed reason=.*serve event=stopped exit_code=1"),

    # --- bloomery-cli ---
    ("cli-help", C, ["--help"], {}, None, 0, "out", r"^usage: bloomery-cli -m FILE"),
    ("cli-version", C, ["--version"], {}, None, 0, "out", VERSION % C),
    ("cli-prompt", C, CLI, {}, None, 0, "err",
     r"^bloomery-cli: prompt \d+ tokens in .*; generated 4 tokens in "),
    ("cli-unknown-flag", C, ["--bogus-flag"], {}, None, 2, "err",
     r"^bloomery-cli: unknown flag '--bogus-flag' \(see --help\)"),
    ("cli-bad-value", C, ["-m", "{tiny}", "-p", "hi", "-n", "abc"], {}, None, 2, "err",
     r"^bloomery-cli: --n-predict: 'abc' is not an integer"),
    ("cli-out-of-range", C, ["-m", "{tiny}", "-p", "hi", "-t", "0"], {}, None, 2, "err",
     r"^bloomery-cli: --threads: 0 is outside 1\.\.256"),
    ("cli-bad-env", C, ["-m", "{tiny}", "-p", "hi"], {"LLAMA_ARG_N_PREDICT": "abc"}, None, 2, "err",
     r"\(from LLAMA_ARG_N_PREDICT\)"),
    ("cli-no-model", C, ["-p", "hi"], {}, None, 2, "err",
     r"^bloomery-cli: -m FILE or -hf REPO is required"),
    ("cli-prompt-and-file", C, ["-m", "{tiny}", "-p", "hi", "-f", "{tiny}"], {}, None, 2, "err",
     r"^bloomery-cli: give -p or -f, not both"),
    ("cli-system-without-chat", C, ["-m", "{tiny}", "-p", "hi", "-sys", "x"], {}, None, 2, "err",
     r"^bloomery-cli: --system-prompt needs --chat"),
    ("cli-cache-type", C, ["-m", "{tiny}", "-p", "hi", "-ctk", "q4_9"], {}, None, 2, "err",
     r"^bloomery-cli: --cache-type-k: 'q4_9' is not f16, f32 or q8_0"),
    ("cli-model-and-hf", C, ["-m", "{tiny}", "-hf", "a/b", "--offline", "-p", "hi"], {}, None, 2, "err",
     r"^bloomery-cli: give -m FILE or -hf REPO, not both"),
    ("cli-missing-model", C, ["-m", "{missing}", "-p", "hi"], {}, None, 1, "err",
     r"^bloomery-cli: \S*missing\.gguf: cannot open: No such file"),
    ("cli-not-gguf", C, ["-m", "{notgguf}", "-p", "hi"], {}, None, 1, "err",
     r"^bloomery-cli: \S*notgguf\.txt: bad magic .*not a GGUF file"),
    ("cli-truncated", C, ["-m", "{trunc}", "-p", "hi"], {}, None, 1, "err",
     r"^bloomery-cli: \S*trunc\.gguf: .*past the end of the file"),
    ("cli-broken", C, ["-m", "{broken}", "-p", "hi", "-t", "1"], {}, None, 1, "err",
     r"^bloomery-cli: \S*broken\.gguf: tensor 'output_norm\.weight' is missing"),
    ("cli-empty-prompt", C, ["-m", "{tiny}", "-p", "", "-t", "1"], {}, None, 1, "err",
     r"^bloomery-cli: the prompt is empty"),
    ("cli-cpu-mask", C, ["-m", "{tiny}", "-p", "hi", "-C", "zz"], {}, None, 1, "err",
     r"^bloomery-cli: --cpu-mask: 'zz' is not a hex mask"),
    ("cli-hf-not-cached", C, ["-hf", "a/b", "--offline", "-p", "hi"], {}, None, 1, "err",
     r"^bloomery-cli: --offline: a/b is not in the cache"),

    # --- bloomery-bench ---
    ("bench-help", B, ["--help"], {}, None, 0, "out", r"^usage: bloomery-bench -m FILE"),
    ("bench-version", B, ["--version"], {}, None, 0, "out", VERSION % B),
    ("bench-run", B, BENCH, {}, None, 0, "out", r"(?s)^\| model \|.*\| pp8 \| .*\| tg4 \| "),
    ("bench-run-jsonl", B, BENCH + ["-o", "jsonl"], {}, None, 0, "out", r"^\{.*\"test\":\"tg4\".*\}$"),
    ("bench-unknown-flag", B, ["--bogus-flag"], {}, None, 2, "err",
     r"^bloomery-bench: unknown flag '--bogus-flag' \(see --help\)"),
    ("bench-bad-value", B, ["-m", "{tiny}", "-p", "abc"], {}, None, 2, "err",
     r"^bloomery-bench: --n-prompt: 'abc' is not a count"),
    ("bench-out-of-range", B, ["-m", "{tiny}", "-r", "0"], {}, None, 2, "err",
     r"^bloomery-bench: --repetitions: 0 is outside 1\.\.1000"),
    ("bench-no-model", B, ["-p", "8"], {}, None, 2, "err", r"^bloomery-bench: -m FILE is required"),
    ("bench-output", B, BENCH + ["-o", "csv"], {}, None, 2, "err", r"^bloomery-bench: -o: 'csv' is not md or jsonl"),
    ("bench-threads", B, ["-m", "{tiny}", "-t", "300"], {}, None, 2, "err",
     r"^bloomery-bench: -t: 300 threads is more than 256"),
    ("bench-kernel-rows", B, ["--kernels", "--kernel-rows", "100"], {}, None, 2, "err",
     r"^bloomery-bench: --kernel-rows: 100 is more than 64"),
    ("bench-missing-model", B, ["-m", "{missing}", "-p", "8", "-n", "4", "-r", "1"], {}, None, 1, "err",
     r"^bloomery-bench: \S*missing\.gguf: cannot open: No such file"),
    ("bench-not-gguf", B, ["-m", "{notgguf}", "-p", "8", "-n", "4", "-r", "1"], {}, None, 1, "err",
     r"^bloomery-bench: \S*notgguf\.txt: bad magic .*not a GGUF file"),
    ("bench-truncated", B, ["-m", "{trunc}", "-p", "8", "-n", "4", "-r", "1"], {}, None, 1, "err",
     r"^bloomery-bench: \S*trunc\.gguf: .*past the end of the file"),
    ("bench-broken", B, ["-m", "{broken}", "-p", "8", "-n", "4", "-r", "1", "-t", "1"], {}, None, 1, "err",
     r"^bloomery-bench: \S*broken\.gguf: tensor 'output_norm\.weight' is missing"),
    ("bench-cpu-mask", B, BENCH + ["-C", "zz"], {}, None, 1, "err",
     r"^bloomery-bench: --cpu-mask: 'zz' is not a hex mask"),
    ("bench-disk-missing", B, ["--disk", "-m", "{missing}", "-r", "1"], {}, None, 1, "err",
     r"^bloomery-bench: \S*missing\.gguf: cannot open"),
]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The model files of the rows, made once."""
    d = tmp_path_factory.mktemp("contract")
    tiny = str(d / "tiny.gguf")
    p = subprocess.run([serverctl.program("bloomery-mkmodel"), "-o", tiny], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=120)
    assert p.returncode == 0, p.stdout
    with open(tiny, "rb") as f:
        data = f.read()
    (d / "notgguf.txt").write_text("hello, not a GGUF file at all\n")
    (d / "trunc.gguf").write_bytes(data[:len(data) // 3])
    # a name of the same length keeps every offset: the file stays valid GGUF and the
    # router's checks pass; the worker misses the tensor while it loads
    assert data.count(b"output_norm.weight") == 1
    (d / "broken.gguf").write_bytes(data.replace(b"output_norm.weight", b"output_norX.weight"))
    return {"tiny": tiny, "notgguf": str(d / "notgguf.txt"), "trunc": str(d / "trunc.gguf"),
            "broken": str(d / "broken.gguf"), "missing": str(d / "missing.gguf")}


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No flag from the caller's environment, and a private (empty) model cache."""
    for k in list(os.environ):
        if k.startswith(("LLAMA_", "HF_", "BLOOMERY_")) or k == "MODEL_ENDPOINT":
            monkeypatch.delenv(k)
    for k in ("HF_HOME", "HF_HUB_CACHE", "LLAMA_CACHE"):
        monkeypatch.setenv(k, str(tmp_path / "cache"))


def expand(args, files, tmp_path, busy):
    subst = dict(files, port=str(serverctl.free_port()), busy=str(busy), tmp=str(tmp_path),
                 copy=str(tmp_path / "copy.gguf"))
    return [a.format(**subst) for a in args]


def kill_tree(proc):
    for pid, _, start in serverctl.descendants(proc.pid):
        st = serverctl.proc_stat(pid)
        if st is not None and st[3] == start:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    proc.kill()
    proc.wait()


def run_to_exit(argv, env):
    """(status, stdout, stderr) of a program run until it exits; bloomery-serve's
    runtime folder must be gone after its exit."""
    before = frozenset(serverctl.runtime_dirs())
    full_env = dict(os.environ, **env)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            env=full_env, cwd=serverctl.ROOT, text=True, errors="replace")
    try:
        out, err = proc.communicate(timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        out, err = proc.communicate()
        pytest.fail("%s did not exit within %d s:\n%s%s" % (" ".join(argv), RUN_TIMEOUT, out, err[-4000:]),
                    pytrace=False)
    left = serverctl.runtime_dirs(proc.pid, before)
    for d in left:
        shutil.rmtree(d, ignore_errors=True)
    assert not left, "%s left its runtime folder: %s" % (" ".join(argv), left)
    return proc.returncode, out, err


def run_serving(action, args, env, files, tmp_path):
    """Starts bloomery-serve on the tiny model (a private copy for "touch"), waits for
    /health 200, then signals it or changes its file; (status, log). Nothing of its
    process tree and no runtime folder may be left after its exit."""
    model = files["tiny"]
    if action == "touch":
        model = str(tmp_path / "copy.gguf")
        shutil.copyfile(files["tiny"], model)
    srv = serverctl.Server(model, ["-t", "1"] + list(args), env=env, log_dir=str(tmp_path))
    try:
        srv.start(timeout=RUN_TIMEOUT)
    except serverctl.ServerError as e:
        pytest.fail(str(e), pytrace=False)
    srv.tree = serverctl.descendants(srv.pid)
    if action == "touch":
        st = os.stat(model)
        os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    else:
        srv.proc.send_signal(signal.SIGTERM if action == "sigterm" else signal.SIGINT)
    try:
        rc = srv.proc.wait(STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        srv.kill()
        pytest.fail("bloomery-serve did not exit within %d s of the %s:\n%s"
                    % (STOP_TIMEOUT, action, srv.log(20000)), pytrace=False)
    problems = [p for p in srv.check_exit() if not p.startswith("bloomery-serve exited with status")]
    assert not problems, "%s\n%s" % ("; ".join(problems), srv.log(20000))
    return rc, srv.log(100000)


@pytest.mark.parametrize("row", ROWS, ids=[r[0] for r in ROWS])
def test_exit_path(row, files, clean_env, tmp_path):
    _, prog, args, env, action, code, stream, regex = row
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        argv = expand(args, files, tmp_path, busy.getsockname()[1])
        if action:
            rc, text = run_serving(action, argv, env, files, tmp_path)
            shown = text
        else:
            rc, out, err = run_to_exit([serverctl.program(prog)] + argv, env)
            text = out if stream == "out" else err
            shown = "stdout:\n%s\nstderr:\n%s" % (out[-3000:], err[-6000:])
    assert rc == code, "%s %s: exit %r, expected %d\n%s" % (prog, " ".join(argv), rc, code, shown)
    assert re.search(regex, text, re.M), "%s %s: std%s lacks /%s/\n%s" % (
        prog, " ".join(argv), stream, regex, shown)


def doc_exit_codes():
    """{program: {status, ...}} from the tables under '## Exit codes' in docs/agents.md
    (a '### `PROGRAM`' heading, then rows whose first cell is the status)."""
    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"^## Exit codes\s*$(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert m, "docs/agents.md has no '## Exit codes' section"
    codes, prog = {}, None
    for line in m.group(1).splitlines():
        h = re.match(r"^###\s+`?(bloomery-[a-z]+)`?", line)
        if h:
            prog = h.group(1)
            codes.setdefault(prog, set())
            continue
        r = re.match(r"^\|\s*`?(\d+)`?\s*\|", line)
        if r and prog:
            codes[prog].add(int(r.group(1)))
    return codes


def test_doc_lists_every_exit_code():
    """The doc's table of each program lists exactly the statuses the rows expect:
    a status added to the code needs a row here and a line in the doc."""
    doc = doc_exit_codes()
    for prog in PROGRAMS:
        want = {r[5] for r in ROWS if r[1] == prog}
        assert prog in doc, "docs/agents.md has no exit-code table for %s" % prog
        assert doc[prog] == want, "%s: docs/agents.md lists exit codes %s, the rows expect %s" % (
            prog, sorted(doc[prog]), sorted(want))


def test_doc_names_every_event():
    """Every event a row waits for is described in docs/agents.md."""
    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    events = {e for r in ROWS for e in re.findall(r"event=([a-z_]+)", r[7])}
    missing = sorted(e for e in events if "event=%s" % e not in text)
    assert not missing, "docs/agents.md does not mention: %s" % ", ".join("event=" + e for e in missing)
