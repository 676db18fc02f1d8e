"""POST /infill: fill-in-the-middle with llama-server's prompt layout (extra chunks,
then <|fim_prefix|>PREFIX PROMPT<|fim_suffix|>SUFFIX<|fim_middle|>), the prefix and
suffix cut to the batch (3/4 and 1/4 of -b), /completion's fields and replies, and
the errors: wrong field types (400 naming the field) and a model without FIM tokens
(501). /v1/completions with a non-empty "suffix" takes the same path."""
import os
import subprocess

import pytest

import serverctl
from sse import data_events, post, stream

PRE, SUF, MID = "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"
REP, SEP = "<|repo_name|>", "<|file_sep|>"


def ids(url, text):
    r = post(url, "/tokenize", {"content": text})
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


@pytest.fixture(scope="module")
def small_batch(module_servers):
    """-b 64: the prefix keeps its last 48 ids, the suffix its first 14 - |prompt|; the
    extra chunks get up to 1024 - 64 - 2 * n_predict ids."""
    return module_servers.start(["-np", "1", "-c", "1024", "-b", "64", "-t", "1", "-tb", "1"])


def test_infill_layout(small_batch):
    url = small_batch.url
    body = {"input_prefix": "def add(a, b):\n    ", "input_suffix": "\n\nprint(add(1, 2))\n",
            "input_extra": [{"filename": "util.py", "text": "X = 1\n"}, {"text": "Y = 2\n"}],
            "prompt": "return", "n_predict": 4, "temperature": 0}
    r = post(url, "/infill", body)
    assert r.status_code == 200, r.text
    j = r.json()
    want = (REP + "myproject\n" + SEP + "util.py\nX = 1\n" + SEP + "tmp\nY = 2\n" + SEP
            + "filename\n" + PRE + body["input_prefix"] + "return" + SUF + body["input_suffix"] + MID)
    assert j["prompt"] == want
    # 7 special ids; each piece is tokenized alone: a file name, its newline, its text
    n_want = (7 + len(ids(url, "myproject\n")) + len(ids(url, "util.py")) + len(ids(url, "\n"))
              + len(ids(url, "X = 1\n")) + len(ids(url, "tmp")) + len(ids(url, "\n"))
              + len(ids(url, "Y = 2\n")) + len(ids(url, "filename\n"))
              + len(ids(url, body["input_prefix"])) + len(ids(url, "return"))
              + len(ids(url, body["input_suffix"])))
    assert j["tokens_evaluated"] == n_want
    assert j["tokens_predicted"] == 4
    assert j["stop_type"] == "limit"


def test_infill_same_as_completion_of_its_prompt(url):
    """The reply is the one /completion gives for the same tokens."""
    body = {"input_prefix": "for i in range(10):\n", "input_suffix": "\n", "n_predict": 6,
            "temperature": 0, "return_tokens": True, "cache_prompt": False}
    a = post(url, "/infill", body)
    assert a.status_code == 200, a.text
    p = post(url, "/tokenize", {"content": a.json()["prompt"], "parse_special": True})
    assert p.status_code == 200, p.text
    toks = p.json()["tokens"]
    b = post(url, "/completion", {"prompt": toks, "n_predict": 6, "temperature": 0,
                                  "return_tokens": True, "cache_prompt": False})
    assert b.status_code == 200, b.text
    assert a.json()["tokens"] == b.json()["tokens"]
    assert a.json()["content"] == b.json()["content"]


def test_infill_streams(url):
    r, evs = stream(url, "/infill", {"input_prefix": "x = ", "n_predict": 3, "temperature": 0})
    assert r.status_code == 200, r.text
    events = data_events(evs)
    assert len(events) == 4
    assert all(not e["stop"] for e in events[:3])
    assert events[-1]["stop"] and events[-1]["tokens_predicted"] == 3


def test_infill_cuts_prefix_and_suffix_to_the_batch(small_batch):
    url = small_batch.url
    prefix = "".join("line %d\n" % i for i in range(100))
    suffix = "".join("tail %d\n" % i for i in range(100))
    pi, si = ids(url, prefix), ids(url, suffix)
    assert len(pi) > 48 and len(si) > 14
    r = post(url, "/infill", {"input_prefix": prefix, "input_suffix": suffix, "n_predict": 1,
                              "temperature": 0, "return_tokens": True})
    assert r.status_code == 200, r.text
    placeholders = 2 + len(ids(url, "myproject\n")) + len(ids(url, "filename\n"))
    assert r.json()["tokens_evaluated"] == placeholders + 3 + 48 + 14
    r = post(url, "/infill", {"input_prefix": prefix, "input_suffix": suffix, "prompt": "ab",
                              "n_predict": 1, "temperature": 0})
    n_prompt = len(ids(url, "ab"))
    assert r.json()["tokens_evaluated"] == placeholders + 3 + 48 + n_prompt + (14 - n_prompt)
    detok = post(url, "/detokenize", {"tokens": pi[-48:]}).json()["content"]
    assert PRE + detok in r.json()["prompt"]


def test_infill_as_an_editor_plugin_sends_it(url):
    """The request a code-completion plugin sends (llama.vim's fields): its own
    sampler chain with the infill stage, n_indent, the time limits, cache_prompt."""
    body = {"input_prefix": "def f(x):\n    if x:\n", "input_suffix": "\n    return x\n",
            "input_extra": [{"filename": "a.py", "text": "import os\n"}],
            "prompt": "        ", "n_predict": 16, "stop": [], "n_indent": 8, "top_k": 40,
            "top_p": 0.90, "samplers": ["top_k", "top_p", "infill"], "stream": False,
            "cache_prompt": True, "t_max_prompt_ms": 500, "t_max_predict_ms": 1000,
            "response_fields": ["content", "timings/prompt_n", "generation_settings/samplers",
                                "stop_type", "no/such"]}
    r = post(url, "/infill", body)
    assert r.status_code == 200, r.text
    j = r.json()
    # response_fields: only those paths, each under its whole path
    assert set(j) == {"content", "timings/prompt_n", "generation_settings/samplers", "stop_type"}
    assert j["generation_settings/samplers"] == ["top_k", "top_p", "infill"]
    assert j["timings/prompt_n"] > 10
    assert j["stop_type"] in ("eos", "limit")
    # a line shallower than 8 blanks ends the text before its first character
    for line in j["content"].split("\n")[1:]:
        stripped = line.lstrip(" \t")
        assert not stripped or len(line) - len(stripped) >= 8, repr(j["content"])


@pytest.mark.parametrize("body,word", [
    ({"input_prefix": 5}, "input_prefix"),
    ({"input_suffix": ["a"]}, "input_suffix"),
    ({"input_extra": {"text": "a"}}, "input_extra"),
    ({"input_extra": ["a"]}, "input_extra[0]"),
    ({"input_extra": [{"filename": "a"}]}, "input_extra[0]"),
    ({"input_extra": [{"text": "a", "filename": 3}]}, "filename"),
    ({"prompt": {"x": 1}}, "prompt"),
    ({"prompt": [1 << 40]}, "prompt"),
    ({"input_prefix": "a", "temperature": "hot"}, "temperature"),
    ({"input_prefix": "a", "n_indent": -1}, "n_indent"),
    ({"input_prefix": "a", "samplers": ["top_k", "warp"]}, "warp"),
    ({"input_prefix": "a", "response_fields": "content"}, "response_fields"),
    ({"input_prefix": "a", "response_fields": [1]}, "response_fields"),
])
def test_infill_refuses_bad_fields(url, body, word):
    r = post(url, "/infill", body)
    assert r.status_code == 400, r.text
    assert word in r.json()["error"]["message"]


def test_infill_without_fim_tokens_is_501(module_servers, tmp_path):
    """The built-in vocabulary of bloomery-mkmodel has no FIM tokens."""
    path = str(tmp_path / "nofim.gguf")
    p = subprocess.run([serverctl.program("bloomery-mkmodel"), "-o", path] + serverctl.MODEL_FLAGS,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert p.returncode == 0, p.stdout
    srv = module_servers.start(["-np", "1", "-c", "512", "-t", "1", "-tb", "1"], model=path)
    r = post(srv.url, "/infill", {"input_prefix": "a"})
    assert r.status_code == 501, r.text
    assert "prefix token" in r.json()["error"]["message"]
    assert r.json()["error"]["type"] == "not_supported_error"
    r = post(srv.url, "/v1/completions", {"prompt": "a", "suffix": "b"})
    assert r.status_code == 400, r.text
    assert "suffix" in r.json()["error"]["message"]
    assert post(srv.url, "/completion", {"prompt": "a", "n_predict": 1}).status_code == 200
    os.unlink(path)


def test_v1_completions_suffix_is_fim(small_batch):
    """/v1/completions with a non-empty suffix completes the gap between prompt and
    suffix: <pre>PROMPT<suf>SUFFIX<mid> (no extra chunks), the reply /completion
    gives for those ids."""
    url = small_batch.url
    body = {"prompt": "def f(x):\n    ", "suffix": "\n    return y\n", "max_tokens": 5,
            "temperature": 0}
    a = post(url, "/v1/completions", body)
    assert a.status_code == 200, a.text
    want = ids(url, PRE + body["prompt"] + SUF + body["suffix"] + MID)
    assert len(want) == 3 + len(ids(url, body["prompt"])) + len(ids(url, body["suffix"]))
    b = post(url, "/completion", {"prompt": want, "n_predict": 5, "temperature": 0})
    assert b.status_code == 200, b.text
    assert a.json()["choices"][0]["text"] == b.json()["content"]
    assert a.json()["usage"]["prompt_tokens"] == len(want)
    # an empty suffix is a plain completion
    c = post(url, "/v1/completions", dict(body, suffix=""))
    assert c.status_code == 200, c.text
    assert c.json()["usage"]["prompt_tokens"] == len(ids(url, body["prompt"]))


@pytest.mark.parametrize("body,word", [
    ({"prompt": [1, 2], "suffix": "x"}, "suffix"),
    ({"prompt": "a", "suffix": 3}, "suffix"),
])
def test_v1_completions_bad_suffix(url, body, word):
    r = post(url, "/v1/completions", body)
    assert r.status_code == 400, r.text
    assert word in r.json()["error"]["message"]
