"""Bad input: each request gets its 4xx with llama-server's error JSON naming the
problem, and the server goes on serving (checked after every test)."""
import json
import re
import select
import socket
import subprocess
import time

import pytest
import requests

import serverctl
from sse import assert_error, get, post

CHAT = "/v1/chat/completions"
MSGS = [{"role": "user", "content": "Hi"}]


@pytest.fixture(autouse=True)
def still_serving(url):
    yield
    r = get(url, "/health")
    assert r.status_code == 200, "the server stopped answering /health: %s" % r.text
    r = post(url, "/completion", {"prompt": "still there?", "n_predict": 1})
    assert r.status_code == 200, "the server stopped generating: %s" % r.text


def raw_post(url, path, data, headers=None):
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    return requests.post(url + path, data=data, headers=h, timeout=30)


@pytest.mark.parametrize("path", [CHAT, "/completion", "/v1/messages", "/tokenize"])
def test_malformed_json(url, path):
    assert_error(raw_post(url, path, b'{"messages": [{"role": "user", "content": "Hi"'), 400)
    assert_error(raw_post(url, path, b"not json at all"), 400)
    assert_error(raw_post(url, path, b""), 400)


def test_body_not_an_object(url):
    assert_error(raw_post(url, CHAT, b"[1, 2, 3]"), 400)
    assert_error(raw_post(url, "/completion", b'"a string"'), 400)


@pytest.mark.parametrize("path,body,field", [
    (CHAT, {"messages": "hello"}, "messages"),
    (CHAT, {"messages": [{"role": "user", "content": 42}]}, "content"),
    (CHAT, {"messages": MSGS, "max_tokens": "ten"}, "max_tokens"),
    (CHAT, {"messages": MSGS, "temperature": "hot"}, "temperature"),
    (CHAT, {"messages": MSGS, "stream": "yes"}, "stream"),
    (CHAT, {"messages": MSGS, "stop": 5}, "stop"),
    (CHAT, {"messages": MSGS, "seed": "abc"}, "seed"),
    (CHAT, {"messages": MSGS, "logit_bias": "none"}, "logit_bias"),
    (CHAT, {"messages": MSGS, "top_logprobs": "3", "logprobs": True}, "top_logprobs"),
    ("/completion", {"prompt": 12.5}, "prompt"),
    ("/completion", {"prompt": {"text": "x"}}, "prompt"),
    ("/completion", {"prompt": "x", "n_predict": "many"}, "n_predict"),
    ("/completion", {"prompt": "x", "n_probs": "5"}, "n_probs"),
    ("/tokenize", {"content": 5}, "content"),
    ("/detokenize", {"tokens": ["a", "b"]}, "tokens"),
    ("/v1/messages", {"messages": MSGS, "max_tokens": "lots"}, "max_tokens"),
    ("/v1/messages", {"messages": MSGS, "max_tokens": 4, "system": 7}, "system"),
])
def test_wrong_types(url, path, body, field):
    assert_error(post(url, path, body), 400, field)


@pytest.mark.parametrize("path,body", [
    (CHAT, {}),
    (CHAT, {"messages": []}),
    ("/v1/messages", {"max_tokens": 4}),
    ("/v1/messages", {"max_tokens": 4, "messages": []}),
    ("/v1/messages/count_tokens", {"messages": []}),
    ("/apply-template", {}),
    ("/v1/chat/completions/input_tokens", {"messages": []}),
])
def test_empty_or_missing_messages(url, path, body):
    assert_error(post(url, path, body), 400, "messages")


def test_missing_prompt(url):
    assert_error(post(url, "/completion", {"n_predict": 2}), 400, "prompt")
    assert_error(post(url, "/v1/completions", {"max_tokens": 2}), 400, "prompt")


def test_empty_prompt(url):
    assert_error(post(url, "/completion", {"prompt": "", "n_predict": 2}), 400)
    assert_error(post(url, "/completion", {"prompt": [], "n_predict": 2}), 400)


@pytest.mark.parametrize("path", [CHAT, "/v1/messages"])
def test_unknown_role(url, path):
    body = {"messages": [{"role": "wizard", "content": "Hi"}], "max_tokens": 2}
    assert_error(post(url, path, body), 400, "wizard")


def test_token_ids_out_of_range(url):
    assert_error(post(url, "/completion", {"prompt": [1, 2, 10 ** 9], "n_predict": 1}), 400)
    assert_error(post(url, "/completion", {"prompt": [-5], "n_predict": 1}), 400)
    assert_error(post(url, "/detokenize", {"tokens": [5, 10 ** 9]}), 400, "tokens[1]")


@pytest.mark.parametrize("path,body", [
    ("/completion", b'{"prompt": "caf\xc3 bad \xff\xfe", "n_predict": 1}'),
    (CHAT, b'{"messages": [{"role": "user", "content": "\xed\xa0\x80"}]}'),  # a UTF-16 surrogate
    ("/tokenize", b'{"content": "\xc0\xaf"}'),  # overlong
])
def test_invalid_utf8(url, path, body):
    assert_error(raw_post(url, path, body), 400)


def serve_help():
    p = subprocess.run([serverctl.program("bloomery-serve"), "--help"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=30)
    return p.stdout


def body_limit_flag():
    """The flag that sets the request-body limit, when bloomery-serve has one."""
    for line in serve_help().splitlines():
        if re.search(r"body", line, re.I):
            m = re.search(r"(--[a-z0-9-]+)", line)
            if m:
                return m.group(1)
    return None


def send_watching(port, head, pieces):
    """Sends head, then the pieces, stopping as soon as the server answers (as an
    HTTP/1.1 client must when the server refuses a body early). Returns the status
    line and the rest that arrived, or raises if the connection is reset before any
    answer could be read."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(head)
        for piece in pieces:
            r, _, _ = select.select([s], [], [], 0)
            if r:
                break
            try:
                s.sendall(piece)
            except (BrokenPipeError, ConnectionResetError):
                break  # the answer may still be waiting in the socket: read it below
        s.settimeout(10)
        data = b""
        try:
            while b"\r\n\r\n" not in data or len(data) < 64:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        except socket.timeout:
            pass
        except ConnectionResetError as e:
            if not data:
                raise AssertionError("the connection was reset before any answer: %r" % e)
        return data


def documented_body_limit():
    import os
    path = os.path.join(serverctl.ROOT, "docs", "serving.md")
    assert os.path.isfile(path), "no body-limit flag in --help and no docs/serving.md to say the default"
    with open(path) as f:
        doc = f.read()
    m = re.search(r"\*\*Body size\*\*: at most (\d+) (MiB|MB|KiB|kB)\b", doc)
    assert m, "docs/serving.md does not say the body limit"
    num = int(m.group(1))
    unit = m.group(2).lower()
    return num * {"mib": 1 << 20, "mb": 10 ** 6, "kib": 1024, "kb": 1000}[unit]


def test_body_over_the_limit(url, servers):
    flag = body_limit_flag()
    if flag:
        srv = servers.start(["-np", "1", "-c", "512", "-t", "1", flag, "65536"])
        target, limit = srv.url, 65536
    else:
        target, limit = url, documented_body_limit()
    port = int(target.rsplit(":", 1)[1])
    piece = b"a" * 65536
    n = limit // len(piece) + 2

    # a client that sends the whole body (as most do) gets the 413, not a reset
    r = raw_post(target, "/completion", b'{"prompt": "' + b"a" * limit + b'"}')
    assert r.status_code == 413, r.text[:300]
    assert r.json()["error"]["code"] == 413 and str(limit) in r.json()["error"]["message"], r.text

    # by Content-Length far past the limit: the answer comes without waiting for the body
    head = (b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % (3 * limit))
    data = send_watching(port, head, [])
    assert data.split(b"\r\n")[0].split(b" ")[1:2] == [b"413"], data[:300]
    body = json.loads(data.split(b"\r\n\r\n", 1)[1])
    assert body["error"]["code"] == 413 and str(limit) in body["error"]["message"], body

    # chunked, with no length given, far past the limit
    head = (b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")
    chunk = b"%x\r\n%s\r\n" % (len(piece), piece)
    data = send_watching(port, head, [chunk] * (3 * n) + [b"0\r\n\r\n"])
    assert data.split(b"\r\n")[0].split(b" ")[1:2] == [b"413"], data[:300]

    # just under the limit is served (the body parses as JSON and the route runs)
    ok = b'{"prompt": "hi", "n_predict": 1, "pad": "' + b"a" * (min(limit, 1 << 20) - 64) + b'"}'
    r = raw_post(target, "/completion", ok)
    assert r.status_code in (200, 400), r.text[:300]
    assert get(target, "/health").status_code == 200


def slot_ctx(url):
    return get(url, "/slots").json()[0]["n_ctx"]


def test_prompt_longer_than_context(url):
    n_ctx = slot_ctx(url)
    long_text = " river" * (n_ctx + 50)
    err = assert_error(post(url, "/completion", {"prompt": long_text, "n_predict": 1}), 400)
    assert str(n_ctx) in err["message"] or "context" in err["message"].lower(), err
    assert_error(post(url, CHAT, {"messages": [{"role": "user", "content": long_text}],
                                  "max_tokens": 1}), 400)
    assert_error(post(url, "/v1/messages", {"messages": [{"role": "user", "content": long_text}],
                                            "max_tokens": 1}), 400)


def test_negative_max_tokens(url):
    assert_error(post(url, CHAT, {"messages": MSGS, "max_tokens": -5}), 400, "max_tokens")
    assert_error(post(url, "/v1/messages", {"messages": MSGS, "max_tokens": -1}), 400, "max_tokens")
    assert_error(post(url, "/v1/completions", {"prompt": "x", "max_tokens": -3}), 400, "max_tokens")


def test_huge_max_tokens_is_capped(url):
    """max_tokens far past the context is not an error: generation stops at the
    slot's context (finish_reason length)."""
    n_ctx = slot_ctx(url)
    # a prompt that leaves room for only a few tokens
    text = " river" * (n_ctx - 40)
    n_prompt = len(post(url, "/tokenize", {"content": text}).json()["tokens"])
    assert n_ctx - n_prompt < 64
    r = post(url, "/completion", {"prompt": text, "n_predict": 10 ** 9, "ignore_eos": True,
                                  "temperature": 0}, timeout=120)
    assert r.status_code == 200, r.text
    b = r.json()
    assert b["stop_type"] == "limit"
    # the cache holds n_ctx positions; the token sampled from the last one is not
    # stored, so one more than the free positions may come out (as in llama-server)
    assert 0 < b["timings"]["predicted_n"] <= n_ctx - n_prompt + 1
    r = post(url, CHAT, {"messages": [{"role": "user", "content": text}], "max_tokens": 2 ** 31,
                         "temperature": 0, "ignore_eos": True}, timeout=120)
    assert r.status_code == 200, r.text
    b = r.json()
    assert b["choices"][0]["finish_reason"] == "length"
    assert b["usage"]["prompt_tokens"] + b["usage"]["completion_tokens"] <= n_ctx + 1


@pytest.mark.parametrize("path,body,field", [
    (CHAT, {"messages": MSGS, "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
            "tool_choice": "always"}, "tool_choice"),
    (CHAT, {"messages": MSGS, "tools": [{"type": "function", "function": {"parameters": {}}}]}, "tools"),
    (CHAT, {"messages": MSGS, "n": 65}, "n"),
    (CHAT, {"messages": MSGS, "response_format": {"type": "json_schema", "json_schema": {
        "schema": {"type": "string", "pattern": "^(?!a)$"}}}}, "response_format"),
    (CHAT, {"messages": MSGS, "grammar": "root ::= (\"a\""}, "grammar"),
    (CHAT, {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}, "image"),
    ("/completion", {"prompt": "x", "grammar": "root ::= undefined-rule"}, "grammar"),
    ("/completion", {"prompt": "x", "json_schema": {"type": "object", "not": {}}}, "json_schema"),
    ("/v1/completions", {"prompt": "x", "n": 0}, "n"),
    ("/v1/messages", {"messages": MSGS, "max_tokens": 4,
                      "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools"),
    ("/v1/messages", {"messages": MSGS, "max_tokens": 4, "tool_choice": {"type": "sometimes"},
                      "tools": [{"name": "f", "input_schema": {"type": "object"}}]}, "tool_choice"),
])
def test_refused_fields(url, path, body, field):
    err = assert_error(post(url, path, body), 400)
    assert re.search(r"(^|[^a-z_])%s([^a-z_]|$)" % re.escape(field), err["message"]), \
        "the error does not name %r: %r" % (field, err["message"])


def test_unknown_route(url):
    assert_error(post(url, "/v2/chat/completions", {"messages": MSGS}), 404)
    assert_error(get(url, "/healthz"), 404)


def test_a_huge_body_stalls_no_other_client(server):
    """Tokenizing megabytes happens off the HTTP loop: /health and another client's
    request are answered while a large /tokenize is still being worked on."""
    import socket
    import threading
    body = json.dumps({"content": "a" * (8 << 20)}).encode()
    host, port = server.url.split("//")[1].split(":")
    done = {}

    def big():
        s = socket.create_connection((host, int(port)))
        s.sendall(b"POST /tokenize HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
                  b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        done["sent"] = time.monotonic()
        data = b""
        while True:
            chunk = s.recv(1 << 20)
            if not chunk:
                break
            data += chunk
        s.close()
        done["big"] = time.monotonic()
        done["status"] = data.split(b" ", 2)[1]

    t = threading.Thread(target=big)
    t.start()
    while "sent" not in done and t.is_alive():
        time.sleep(0.01)
    r = requests.get(server.url + "/health", timeout=60)
    t_health = time.monotonic()
    r2 = requests.post(server.url + "/tokenize", json={"content": "hello"}, timeout=60)
    t_small = time.monotonic()
    t.join(120)
    assert r.status_code == 200 and r2.status_code == 200, (r.text, r2.text)
    assert done.get("status") == b"200", done
    assert t_health < done["big"] and t_small < done["big"], \
        "answered only after the large request: %r" % ((t_health, t_small, done),)


def test_a_prompt_too_long_for_the_context_is_refused_by_its_length(url):
    body = {"messages": [{"role": "user", "content": "a" * (16 << 20)}], "max_tokens": 2}
    r = requests.post(url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 400, r.text
    e = r.json()["error"]
    assert e["type"] == "exceed_context_size_error" and "at least" in e["message"], e
    r = requests.post(url + "/completion", json={"prompt": "b" * (16 << 20)}, timeout=120)
    assert r.status_code == 400 and "at least" in r.json()["error"]["message"], r.text


def _raw(url, data):
    host, port = url.split("//")[1].split(":")
    s = socket.create_connection((host, int(port)), timeout=30)
    s.sendall(data)
    out = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        out += chunk
    s.close()
    return out


def test_head_health_is_get_without_a_body(url):
    r = requests.head(url + "/health", timeout=30)
    assert r.status_code == 200 and r.content == b"", r
    assert int(r.headers["Content-Length"]) > 0
    r = requests.head(url + "/completion", timeout=30)
    assert r.status_code == 405 and "POST" in r.headers["Allow"], r.headers


def test_conflicting_content_lengths_are_refused_and_close(url):
    out = _raw(url, b"POST /tokenize HTTP/1.1\r\nHost: t\r\nContent-Length: 19\r\n"
                    b"Content-Length: 5\r\n\r\n{\"content\":\"hello\"}"
                    b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 400"), out[:200]
    assert out.count(b"HTTP/1.1") == 1, out  # nothing after the head is read as a request


def test_valid_json_edges(url):
    r = post(url, "/tokenize", {"content": "a\u0000b"})
    assert r.status_code == 200 and len(r.json()["tokens"]) >= 3, r.text
    r = requests.post(url + "/completion", data=b'{"prompt":"hi","n_predict":18446744073709551616}',
                      timeout=30)
    assert r.status_code == 400, r.text
    assert "'n_predict'" in r.json()["error"]["message"], r.text
    r = post(url, "/completion", {"prompt": "hi", "n_predict": 1, "stop": ["a\u0000"]})
    assert r.status_code == 400 and "'stop[0]'" in r.json()["error"]["message"], r.text
