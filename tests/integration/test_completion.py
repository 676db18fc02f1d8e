"""POST /v1/completions, llama-server's /completion (string, ids and mixed prompts,
n_predict, stream, n_probs, return_tokens, cache_prompt), /tokenize, /detokenize,
/apply-template and /v1/chat/completions/input_tokens."""
import concurrent.futures
import json
import os

import jinja2
import pytest

import serverctl
from sse import data_events, post, stream

PROMPT = "The old lighthouse keeper walked down to the"


def completion(url, **body):
    r = post(url, "/completion", body)
    assert r.status_code == 200, r.text
    return r.json()


def tokenize(url, text, **kw):
    r = post(url, "/tokenize", dict(content=text, **kw))
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


# --- /v1/completions

def test_v1_completions(url):
    r = post(url, "/v1/completions", {"prompt": PROMPT, "max_tokens": 4, "temperature": 0,
                                      "ignore_eos": True})
    assert r.status_code == 200, r.text
    b = r.json()
    assert b["object"] == "text_completion"
    assert isinstance(b["id"], str) and isinstance(b["created"], int)
    ch = b["choices"][0]
    assert ch["index"] == 0
    assert isinstance(ch["text"], str)
    assert ch["finish_reason"] == "length"
    assert b["usage"]["completion_tokens"] == 4
    assert b["usage"]["prompt_tokens"] == len(tokenize(url, PROMPT))
    native = completion(url, prompt=PROMPT, n_predict=4, temperature=0, ignore_eos=True)
    assert ch["text"] == native["content"]


def test_v1_completions_stream(url):
    plain = post(url, "/v1/completions", {"prompt": PROMPT, "max_tokens": 6, "temperature": 0,
                                          "ignore_eos": True}).json()
    r, events = stream(url, "/v1/completions", {"prompt": PROMPT, "max_tokens": 6,
                                                "temperature": 0, "ignore_eos": True})
    assert r.status_code == 200, r.text
    assert events[-1].done, "no data: [DONE] at the end"
    chunks = data_events(events)
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert text == plain["choices"][0]["text"]
    fins = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0].get("finish_reason")]
    assert fins == ["length"]


# --- /completion

def test_completion_string_prompt(url):
    b = completion(url, prompt=PROMPT, n_predict=5, temperature=0, ignore_eos=True)
    assert isinstance(b["content"], str)
    assert b["stop"] is True
    assert b["stop_type"] == "limit"
    assert b["tokens"] == []  # return_tokens is off by default
    assert b["timings"]["predicted_n"] == 5
    n = len(tokenize(url, PROMPT))
    assert b["tokens_evaluated"] == n
    assert b["timings"]["prompt_n"] + b["timings"].get("cache_n", 0) == n
    assert b["truncated"] is False
    assert isinstance(b["generation_settings"], dict)
    assert b["generation_settings"]["n_predict"] == 5


def test_completion_return_tokens(url):
    b = completion(url, prompt=PROMPT, n_predict=4, temperature=0, ignore_eos=True, return_tokens=True)
    assert len(b["tokens"]) == 4 and all(isinstance(t, int) for t in b["tokens"])
    r = post(url, "/detokenize", {"tokens": b["tokens"]})
    assert r.status_code == 200
    d = r.json()["content"]
    # the last token may end inside a character, which the two may render differently
    assert d == b["content"] or d.rstrip("\ufffd") == b["content"].rstrip("\ufffd"), (d, b["content"])


def test_completion_ids_and_mixed_prompt(url):
    s = completion(url, prompt=PROMPT, n_predict=6, temperature=0, ignore_eos=True, return_tokens=True)
    ids = tokenize(url, PROMPT)
    i = completion(url, prompt=ids, n_predict=6, temperature=0, ignore_eos=True, return_tokens=True)
    assert i["tokens"] == s["tokens"]
    assert i["content"] == s["content"]
    head, tail = "The old lighthouse", " keeper walked down to the"
    assert tokenize(url, head) + tokenize(url, tail) == ids, "the split must not change the tokens"
    m = completion(url, prompt=tokenize(url, head) + [tail], n_predict=6, temperature=0,
                   ignore_eos=True, return_tokens=True)
    assert m["tokens"] == s["tokens"]
    assert m["tokens_evaluated"] == len(ids)


def test_completion_stream(url):
    plain = completion(url, prompt=PROMPT, n_predict=6, temperature=0, ignore_eos=True)
    r, events = stream(url, "/completion", {"prompt": PROMPT, "n_predict": 6, "temperature": 0,
                                            "ignore_eos": True})
    assert r.status_code == 200, r.text
    datas = [e.json() for e in events if not e.done]
    assert datas, "empty stream"
    for d in datas[:-1]:
        assert d["stop"] is False
        assert isinstance(d["content"], str)
        assert all(isinstance(t, int) for t in d.get("tokens", []))
    last = datas[-1]
    assert last["stop"] is True
    assert last["stop_type"] == "limit"
    assert last["timings"]["predicted_n"] == 6
    assert "".join(d["content"] for d in datas) == plain["content"]


def test_completion_n_predict_zero_and_limits(url):
    b = completion(url, prompt=PROMPT, n_predict=0)
    assert b["content"] == ""
    assert b["timings"]["predicted_n"] == 0


def test_completion_n_probs(url):
    b = completion(url, prompt=PROMPT, n_predict=3, temperature=0, ignore_eos=True, n_probs=5,
                   return_tokens=True)
    probs = b["completion_probabilities"]
    assert len(probs) == 3
    for k, p in enumerate(probs):
        assert p["id"] == b["tokens"][k]
        assert isinstance(p["token"], str)
        assert isinstance(p["bytes"], list)
        assert p["logprob"] <= 0.0
        top = p["top_logprobs"]
        assert len(top) == 5
        assert top[0]["id"] == p["id"], "greedy picked another token than the most likely"
        lps = [t["logprob"] for t in top]
        assert lps == sorted(lps, reverse=True)
        assert len({t["id"] for t in top}) == 5


def test_completion_n_probs_stream(url):
    r, events = stream(url, "/completion", {"prompt": PROMPT, "n_predict": 3, "temperature": 0,
                                            "ignore_eos": True, "n_probs": 4})
    assert r.status_code == 200
    n = 0
    for e in events:
        d = e.json()
        if d["stop"]:
            continue
        for p in d["completion_probabilities"]:
            assert len(p["top_logprobs"]) == 4
            n += 1
    assert n == 3


def test_completion_cache_prompt(url):
    prompt = "A prompt that nothing else in these tests sends, about copper kettles and rain."
    n = len(tokenize(url, prompt))
    first = completion(url, prompt=prompt, n_predict=2, temperature=0, cache_prompt=True)
    second = completion(url, prompt=prompt, n_predict=2, temperature=0, cache_prompt=True)
    t = second["timings"]
    # all but (at most) the last prompt token come from the slot's cache
    assert t["cache_n"] >= n - 1, (first["timings"], t)
    assert t["prompt_n"] + t["cache_n"] == n
    assert second["tokens_cached"] >= n - 1
    assert second["content"] == first["content"]
    off = completion(url, prompt=prompt, n_predict=2, temperature=0, cache_prompt=False)
    assert off["timings"].get("cache_n", 0) == 0
    assert off["content"] == first["content"]


def test_completion_stop_word(url):
    base = completion(url, prompt=PROMPT, n_predict=16, temperature=0, ignore_eos=True)["content"]
    text = base.strip()
    if len(text) < 6:
        pytest.skip("greedy text too short: %r" % base)
    stop = text[len(text) // 2:len(text) // 2 + 2]
    b = completion(url, prompt=PROMPT, n_predict=16, temperature=0, ignore_eos=True, stop=[stop])
    assert b["content"] == base[:base.find(stop)]
    assert b["stop_type"] == "word"
    assert b["stopping_word"] == stop


def test_completion_parallel_requests_queue(url):
    """Three requests on two slots: the third waits for a free slot, all succeed."""
    body = {"prompt": PROMPT, "n_predict": 12, "temperature": 0, "ignore_eos": True}
    with concurrent.futures.ThreadPoolExecutor(3) as ex:
        rs = list(ex.map(lambda _: post(url, "/completion", body), range(3)))
    assert [r.status_code for r in rs] == [200, 200, 200], [r.text for r in rs]
    texts = {r.json()["content"] for r in rs}
    assert len(texts) == 1, "greedy answers differ between slots: %r" % texts


# --- /tokenize, /detokenize

TEXTS = ["Hello world", "  leading spaces and\ttabs\nnew lines", "héllo wörld, 日本語, emoji 🙂",
         "<|im_start|>user\nhi<|im_end|>", "12345 + 678 = 13023"]


@pytest.mark.parametrize("text", TEXTS)
def test_tokenize_detokenize_round_trip(url, text):
    ids = tokenize(url, text)
    assert ids and all(isinstance(i, int) for i in ids)
    r = post(url, "/detokenize", {"tokens": ids})
    assert r.status_code == 200, r.text
    assert r.json()["content"] == text


def test_tokenize_special_and_pieces(url):
    assert tokenize(url, "<|im_start|>") == [151644]
    plain = tokenize(url, "<|im_start|>", parse_special=False)
    assert len(plain) > 1 and 151644 not in plain
    pieces = tokenize(url, "Hello world", with_pieces=True)
    assert [p["piece"] for p in pieces] == ["Hello", " world"]
    assert [p["id"] for p in pieces] == tokenize(url, "Hello world")
    # Qwen3 adds no BOS, so add_special changes nothing
    assert tokenize(url, "Hello", add_special=True) == tokenize(url, "Hello")
    # a piece that is part of a character comes as its bytes
    pieces = tokenize(url, "\U0001d518", with_pieces=True)
    assert len(pieces) >= 2
    raw = b""
    for p in pieces:
        if isinstance(p["piece"], list):
            raw += bytes(p["piece"])
        else:
            raw += p["piece"].encode("utf-8")
    assert raw == "\U0001d518".encode("utf-8")
    assert any(isinstance(p["piece"], list) for p in pieces)


def test_tokenize_matches_mkmodel_vocab(url):
    # ids of the real Qwen3 tokenizer (Hugging Face)
    assert tokenize(url, "Hello world") == [9707, 1879]


# --- templates

def qwen3_template():
    with open(os.path.join(serverctl.TOKENIZER, "tokenizer_config.json")) as f:
        return json.load(f)["chat_template"]


def render(messages, **kw):
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = lambda m: (_ for _ in ()).throw(Exception(m))
    return env.from_string(qwen3_template()).render(messages=messages, add_generation_prompt=True, **kw)


CONV = [{"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Name a river."}]


def test_apply_template(url):
    r = post(url, "/apply-template", {"messages": CONV})
    assert r.status_code == 200, r.text
    assert r.json()["prompt"] == render(CONV)
    r = post(url, "/apply-template", {"messages": CONV, "chat_template_kwargs": {"enable_thinking": False}})
    assert r.status_code == 200, r.text
    assert r.json()["prompt"] == render(CONV, enable_thinking=False)
    assert r.json()["prompt"].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_input_tokens(url):
    r = post(url, "/v1/chat/completions/input_tokens", {"messages": CONV})
    assert r.status_code == 200, r.text
    n = len(tokenize(url, render(CONV)))
    assert r.json()["input_tokens"] == n
