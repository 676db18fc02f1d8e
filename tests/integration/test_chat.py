"""POST /v1/chat/completions against the OpenAI shapes llama-server gives: plain and
streamed answers, usage, logprobs, stop strings, seeds, token limits, logit_bias and
chat_template_kwargs. The model is random, so tests compare the server with itself
(stream against non-stream, greedy against greedy) rather than with fixed text."""
import pytest

from sse import data_events, post, stream

PATH = "/v1/chat/completions"
MSGS = [{"role": "user", "content": "Write one short sentence about rivers."}]


def chat(url, **body):
    body.setdefault("messages", MSGS)
    r = post(url, PATH, body)
    assert r.status_code == 200, r.text
    return r.json()


def chat_stream(url, **body):
    body.setdefault("messages", MSGS)
    r, events = stream(url, PATH, body)
    assert r.status_code == 200, r.text
    assert events and events[-1].done, "the stream does not end with data: [DONE]: %r" % events[-3:]
    chunks = data_events(events)
    for c in chunks:
        assert "error" not in c, c
    return chunks


def streamed_text(chunks):
    return "".join((c["choices"][0]["delta"].get("content") or "") for c in chunks if c["choices"])


def test_chat_plain(url):
    b = chat(url, max_tokens=6, temperature=0)
    assert b["object"] == "chat.completion"
    assert isinstance(b["id"], str) and b["id"]
    assert isinstance(b["created"], int)
    assert isinstance(b["model"], str)
    assert len(b["choices"]) == 1
    ch = b["choices"][0]
    assert ch["index"] == 0
    assert ch["message"]["role"] == "assistant"
    assert isinstance(ch["message"]["content"], str)
    assert ch["finish_reason"] in ("stop", "length")
    u = b["usage"]
    assert u["prompt_tokens"] > 5
    assert 1 <= u["completion_tokens"] <= 6
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    # llama-server adds its timings to every answer
    t = b["timings"]
    assert t["predicted_n"] == u["completion_tokens"]
    assert t["prompt_n"] + t.get("cache_n", 0) == u["prompt_tokens"]


def test_chat_stream_matches_plain(url):
    plain = chat(url, max_tokens=8, temperature=0)
    chunks = chat_stream(url, max_tokens=8, temperature=0)
    assert chunks, "no chunks"
    for c in chunks:
        assert c["object"] == "chat.completion.chunk"
        assert c["id"] == chunks[0]["id"], "chunk ids differ"
    first = [c for c in chunks if c["choices"]][0]
    assert first["choices"][0]["delta"].get("role") == "assistant"
    finals = [c for c in chunks if c["choices"] and c["choices"][0].get("finish_reason")]
    assert len(finals) == 1, "expected one chunk with finish_reason, got %d" % len(finals)
    assert finals[0]["choices"][0]["finish_reason"] == plain["choices"][0]["finish_reason"]
    last_choice = [c for c in chunks if c["choices"]][-1]
    assert last_choice is finals[0], "chunks with choices follow the finish_reason"
    assert streamed_text(chunks) == plain["choices"][0]["message"]["content"]


def test_chat_stream_include_usage(url):
    chunks = chat_stream(url, max_tokens=5, temperature=0, ignore_eos=True,
                         stream_options={"include_usage": True})
    last = chunks[-1]
    assert last["choices"] == [], "the usage chunk must have no choices: %r" % last
    u = last["usage"]
    assert u["completion_tokens"] == 5
    assert u["prompt_tokens"] > 0
    assert u["total_tokens"] == u["prompt_tokens"] + 5
    for c in chunks[:-1]:
        assert c.get("usage") in (None, {}) or c is last


def test_chat_max_tokens_and_length(url):
    b = chat(url, max_tokens=3, temperature=0, ignore_eos=True)
    assert b["usage"]["completion_tokens"] == 3
    assert b["choices"][0]["finish_reason"] == "length"
    b = chat(url, max_completion_tokens=2, temperature=0, ignore_eos=True)
    assert b["usage"]["completion_tokens"] == 2
    assert b["choices"][0]["finish_reason"] == "length"


def _check_logprob_items(items, k):
    for it in items:
        assert isinstance(it["token"], str)
        assert it["logprob"] <= 0.0
        assert isinstance(it["bytes"], list) and all(0 <= x < 256 for x in it["bytes"])
        top = it["top_logprobs"]
        assert len(top) == k
        lps = [t["logprob"] for t in top]
        assert lps == sorted(lps, reverse=True), "top_logprobs not sorted: %r" % lps
        assert all(lp <= 0.0 for lp in lps)
        # greedy: the chosen token is the most likely one
        assert it["token"] == top[0]["token"]
        assert abs(it["logprob"] - top[0]["logprob"]) < 1e-4


def test_chat_logprobs(url):
    b = chat(url, max_tokens=4, temperature=0, ignore_eos=True, logprobs=True, top_logprobs=3)
    items = b["choices"][0]["logprobs"]["content"]
    assert len(items) == 4
    _check_logprob_items(items, 3)
    raw = b"".join(bytes(it["bytes"]) for it in items)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = None  # the last token may end inside a character
    if text is not None:
        assert text == b["choices"][0]["message"]["content"]


def test_chat_logprobs_stream(url):
    chunks = chat_stream(url, max_tokens=4, temperature=0, ignore_eos=True, logprobs=True,
                         top_logprobs=2)
    items = []
    for c in chunks:
        if c["choices"] and c["choices"][0].get("logprobs"):
            items += c["choices"][0]["logprobs"]["content"]
    assert len(items) == 4
    _check_logprob_items(items, 2)


def test_chat_stop_string(url):
    base = chat(url, max_tokens=16, temperature=0, ignore_eos=True)["choices"][0]["message"]["content"]
    text = base.strip()
    if len(text) < 6:
        pytest.skip("the model's greedy text is too short to cut: %r" % base)
    stop = text[len(text) // 2:len(text) // 2 + 2]
    cut = base[:base.find(stop)]
    b = chat(url, max_tokens=16, temperature=0, ignore_eos=True, stop=[stop])
    assert b["choices"][0]["message"]["content"] == cut
    assert b["choices"][0]["finish_reason"] == "stop"
    # the same through the stream, with stop given as a plain string
    chunks = chat_stream(url, max_tokens=16, temperature=0, ignore_eos=True, stop=stop)
    assert streamed_text(chunks) == cut
    fin = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0].get("finish_reason")]
    assert fin == ["stop"]


def test_chat_seed_reproducible(url):
    body = dict(max_tokens=10, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, ignore_eos=True)
    a = chat(url, seed=1234, **body)["choices"][0]["message"]["content"]
    b = chat(url, seed=1234, **body)["choices"][0]["message"]["content"]
    assert a == b, "the same seed gave different text"
    others = {chat(url, seed=s, **body)["choices"][0]["message"]["content"] for s in (1, 2, 3)}
    others.add(a)
    assert len(others) > 1, "four seeds at temperature 1 gave the same text: %r" % others


def test_chat_sampling_fields_accepted(url):
    b = chat(url, max_tokens=4, temperature=0.7, top_p=0.9, top_k=20, min_p=0.01,
             presence_penalty=0.5, frequency_penalty=0.5, repeat_penalty=1.1, seed=5)
    assert b["usage"]["completion_tokens"] >= 1


def test_chat_logit_bias(url):
    tpl = post(url, "/apply-template", {"messages": MSGS}).json()["prompt"]
    r = post(url, "/completion", {"prompt": tpl, "n_predict": 1, "temperature": 0, "n_probs": 2,
                                  "ignore_eos": True})
    assert r.status_code == 200, r.text
    cp = r.json()["completion_probabilities"][0]
    banned = cp["id"]
    b = chat(url, max_tokens=1, temperature=0, ignore_eos=True, logprobs=True, top_logprobs=1)
    assert b["choices"][0]["logprobs"]["content"][0]["token"] == cp["token"]
    # OpenAI's form: {"id": bias}; -100 bans the greedy token
    b2 = chat(url, max_tokens=1, temperature=0, ignore_eos=True, logprobs=True, top_logprobs=1,
              logit_bias={str(banned): -100})
    assert b2["choices"][0]["logprobs"]["content"][0]["token"] != cp["token"]
    # llama-server's form: [[id, false]] bans it
    r2 = post(url, "/completion", {"prompt": tpl, "n_predict": 1, "temperature": 0,
                                   "ignore_eos": True, "logit_bias": [[banned, False]],
                                   "return_tokens": True})
    assert r2.status_code == 200, r2.text
    assert r2.json()["tokens"][0] != banned
    # a large positive bias forces a token everywhere
    forced = post(url, "/tokenize", {"content": " river"}).json()["tokens"]
    assert len(forced) == 1
    b3 = chat(url, max_tokens=3, temperature=0, ignore_eos=True, logit_bias={str(forced[0]): 100})
    assert b3["choices"][0]["message"]["content"].strip() == "river river river"


def test_chat_text_parts(url):
    parts = [{"type": "text", "text": "Write one short sentence"}, {"type": "text", "text": " about rivers."}]
    b = chat(url, messages=[{"role": "user", "content": parts}], max_tokens=2, temperature=0)
    assert b["usage"]["completion_tokens"] >= 1


def test_chat_enable_thinking(url):
    # Qwen3's template closes an empty think block when enable_thinking is false
    on = chat(url, max_tokens=1, temperature=0)
    off = chat(url, max_tokens=1, temperature=0, chat_template_kwargs={"enable_thinking": False})
    empty = post(url, "/tokenize", {"content": "<think>\n\n</think>\n\n"}).json()["tokens"]
    assert off["usage"]["prompt_tokens"] == on["usage"]["prompt_tokens"] + len(empty)


def test_chat_system_and_turns(url):
    msgs = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "Name a river."}]
    b = chat(url, messages=msgs, max_tokens=2, temperature=0)
    tpl = post(url, "/apply-template", {"messages": msgs}).json()["prompt"]
    n = len(post(url, "/tokenize", {"content": tpl}).json()["tokens"])
    assert b["usage"]["prompt_tokens"] == n


def test_chat_prompt_cache(url):
    msgs = [{"role": "user", "content": "A chat prompt about brass lanterns that no other test sends."}]
    a = chat(url, messages=msgs, max_tokens=2, temperature=0)
    b = chat(url, messages=msgs, max_tokens=2, temperature=0)
    n = b["usage"]["prompt_tokens"]
    assert b["timings"]["cache_n"] >= n - 1, (a["timings"], b["timings"])
    assert b["choices"][0]["message"]["content"] == a["choices"][0]["message"]["content"]


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]


def test_chat_tools_reach_the_template(url):
    """tools go to the template (Qwen3's lists them in <tools>); tool_choice none
    leaves them out; an assistant turn with tool_calls and the tool's answer render
    as the template writes them."""
    msgs = [{"role": "user", "content": "Weather in Oslo?"}]
    p = post(url, "/apply-template", {"messages": msgs, "tools": TOOLS}).json()["prompt"]
    assert "<tools>" in p and '"get_weather"' in p
    p = post(url, "/apply-template", {"messages": msgs, "tools": TOOLS,
                                      "tool_choice": "none"}).json()["prompt"]
    assert "<tools>" not in p
    turns = msgs + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "-3 C, snow"}]
    p = post(url, "/apply-template", {"messages": turns, "tools": TOOLS}).json()["prompt"]
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>' in p
    assert "<tool_response>\n-3 C, snow\n</tool_response>" in p
    r = post(url, "/v1/chat/completions", {"messages": turns, "tools": TOOLS, "max_tokens": 4,
                                           "temperature": 0})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] in ("stop", "length", "tool_calls")
    assert "message" in choice
