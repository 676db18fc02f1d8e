"""Every flag llama-server takes (../shared/docs/llama-server-flags.tsv) is known to
bloomery-serve: accepted with its meaning, accepted with no effect (and the reason),
or refused by name at start (status 1) with the reason; its LLAMA_ARG_* variable
names the same flag; docs/serving.md's table says which. A flag added to the list
shows up here as a failing row."""
import os
import subprocess

import pytest

import llama_flags
import serverctl

pytestmark = pytest.mark.skipif(not os.path.exists(llama_flags.TSV), reason="the shared flag list is absent")


def serve(args, timeout=30, env=None):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([serverctl.program("bloomery-serve")] + args, capture_output=True, text=True,
                          timeout=timeout, env=e)


def spellings():
    return [(n, value) for names, value, _ in llama_flags.rows() for n in names]


def test_every_spelling_is_known_and_takes_its_value():
    """Each spelling, with a value where llama-server's takes one, parses: --version
    after it then prints the version (an unknown flag, or a value taken for a flag
    that has none, would stop the parse with status 2)."""
    bad = []
    for name, value in spellings():
        v = llama_flags.sample(value, name)
        p = serve([name] + ([v] if v is not None else []) + ["--version"])
        if p.returncode != 0 or not p.stdout.startswith("bloomery-serve "):
            bad.append("%s %s: status %d: %s" % (name, v or "", p.returncode, p.stderr.strip()[-200:]))
    assert not bad, "\n".join(bad)


def test_every_variable_names_its_flag():
    help_ = llama_flags.serve_help()
    bad = []
    for names, _, env in llama_flags.rows():
        if env and env not in {help_[n][1] for n in names if n in help_}:
            bad.append("%s: %s" % (" ".join(names), env))
    assert not bad, "\n".join(bad)


def test_refused_flags_stop_the_start_naming_the_flag(model):
    """A refused flag stops the start with status 1 and its name and reason, before
    the model is loaded."""
    help_ = llama_flags.serve_help()
    bad = []
    seen = set()
    for names, value, _ in llama_flags.rows():
        n = names[0]
        if n not in help_ or not help_[n][0].startswith("refused: ") or n in seen:
            continue
        seen.add(n)
        v = llama_flags.sample(value, n)
        p = serve(["-m", model, "--port", "0", n] + ([v] if v is not None else []), timeout=60)
        long_names = [x for x in names if x.startswith("--")] or names
        if p.returncode != 1 or not any(x in p.stderr for x in long_names):
            bad.append("%s: status %d: %s" % (n, p.returncode, p.stderr.strip()[-300:]))
    assert len(seen) >= 30, seen
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("args,says", [
    (["--spec-type", "ngram-map-k4v"], "--spec-type ngram-map-k4v"),
    (["--mirostat", "2"], "--mirostat 2"),
    (["--dry-multiplier", "0.8"], "--dry-multiplier 0.8"),
    (["--top-nsigma", "1.5"], "--top-n-sigma 1.5"),
    (["--load-mode", "dio"], "--load-mode dio"),
    (["--jinja", "--no-jinja"], "contradict"),
    (["--reasoning", "sometimes"], "--reasoning"),
])
def test_values_that_mean_something_else_are_refused(model, args, says):
    p = serve(["-m", model, "--port", "0"] + args, timeout=60)
    assert p.returncode in (1, 2) and says in p.stderr, p.stderr


def test_accepted_flags_without_effect_are_logged(servers):
    srv = servers.start(["-np", "1", "-c", "512", "-t", "1", "--spec-draft-p-split", "0.1", "--dry-multiplier",
                         "0", "-Cb", "0x1", "--spec-draft-threads-batch", "2", "--backend_sampling",
                         "--no-kv-unified"])
    log = srv.log(20000)
    for flag in ("--draft-p-split", "--dry-multiplier", "--cpu-mask-batch", "--threads-batch-draft",
                 "--backend-sampling"):
        assert "event=flag_no_effect flag=%s " % flag in log, log
    assert "event=flag_same flag=--no-kv-unified " in log, log


def test_docs_table_is_the_servers():
    """docs/serving.md's table is what the server says of each flag (regenerate it
    with `python3 tests/integration/llama_flags.py --write`)."""
    have = llama_flags.doc_table()
    assert have is not None, "docs/serving.md lacks the table's markers"
    assert have == llama_flags.table(), "docs/serving.md's flag table is stale: run " \
                                        "python3 tests/integration/llama_flags.py --write"
    assert "| unknown" not in have and "; unknown" not in have


FAST = ["-np", "1", "-c", "512", "-t", "1"]


def test_cors_flags(servers):
    """--cors-origins localhost echoes only local origins; other values go out as
    given; the preflight carries --cors-methods, --cors-headers and the credentials."""
    import requests
    srv = servers.start(FAST + ["--cors-origins", "localhost", "--cors-methods", "GET, POST",
                                "--cors-headers", "Authorization, Content-Type"])
    for origin, want in (("http://localhost:3000", "http://localhost:3000"), ("http://127.0.0.1", "http://127.0.0.1"),
                         ("http://[::1]:8080", "http://[::1]:8080"), ("http://evil.test", None),
                         ("http://localhost.evil.test", None)):
        r = requests.get(srv.url + "/health", headers={"Origin": origin}, timeout=10)
        assert r.status_code == 200 and r.headers.get("Access-Control-Allow-Origin") == want, (origin, r.headers)
    r = requests.options(srv.url + "/v1/chat/completions", headers={"Origin": "http://localhost:5173"}, timeout=10)
    assert r.status_code == 200
    assert r.headers["Access-Control-Allow-Origin"] == "http://localhost:5173"
    assert r.headers["Access-Control-Allow-Methods"] == "GET, POST"
    assert r.headers["Access-Control-Allow-Headers"] == "Authorization, Content-Type"
    assert r.headers["Access-Control-Allow-Credentials"] == "true"
    srv = servers.start(FAST + ["--cors-origins", "https://app.test", "--no-cors-credentials"])
    r = requests.options(srv.url + "/health", headers={"Origin": "http://other.test"}, timeout=10)
    assert r.headers["Access-Control-Allow-Origin"] == "https://app.test"
    assert r.headers["Access-Control-Allow-Credentials"] == "false"
    assert r.headers["Access-Control-Allow-Methods"] == "GET, POST, DELETE, OPTIONS"
    assert requests.get(srv.url + "/health", timeout=10).headers["Access-Control-Allow-Origin"] == "https://app.test"


def test_alias_list_tags_and_request_defaults(servers):
    """-a takes several names (the first in byte order names the model), --tags are
    listed; -r, --ignore-eos and --no-cache-prompt are every request's defaults."""
    import requests
    srv = servers.start(FAST + ["-a", "zeta, alpha,zeta,,beta", "--tags", "moe,local", "-r", "\\n", "--ignore-eos",
                                "--no-cache-prompt", "--reuse-port"])
    m = requests.get(srv.url + "/v1/models", timeout=10).json()["data"][0]
    assert m["id"] == "alpha" and m["aliases"] == ["alpha", "beta", "zeta"] and m["tags"] == ["local", "moe"], m
    r = requests.post(srv.url + "/completion", json={"prompt": "a b c", "n_predict": 4, "temperature": 0},
                      timeout=60).json()
    s = r["generation_settings"]
    assert s["ignore_eos"] is True and s["stop"] == ["\n"], s
    assert "\n" not in r["content"]


def test_no_jinja_uses_the_built_in_template_and_refuses_tools(servers):
    import requests
    srv = servers.start(FAST + ["--no-jinja"])
    assert "source=chatml reason=--no-jinja" in srv.log(20000)
    ok = requests.post(srv.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                               "max_tokens": 2}, timeout=60)
    assert ok.status_code == 200, ok.text
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    r = requests.post(srv.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                              "tools": tools, "max_tokens": 2}, timeout=60)
    assert r.status_code == 400 and "tools param requires --jinja flag" in r.json()["error"]["message"], r.text
