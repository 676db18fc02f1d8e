"""POST /v1/messages and /v1/messages/count_tokens against Anthropic's Messages API
shapes as llama-server gives them: system as a string or blocks, text blocks,
stop_sequences, stop_reason, usage, and the streamed event sequence."""
import pytest

from sse import post, stream

PATH = "/v1/messages"
MSGS = [{"role": "user", "content": "Tell me about mountains."}]


def messages(url, **body):
    body.setdefault("messages", MSGS)
    body.setdefault("model", "anything")
    r = post(url, PATH, body)
    assert r.status_code == 200, r.text
    return r.json()


def text_of(b):
    return "".join(c["text"] for c in b["content"] if c["type"] == "text")


def test_messages_plain(url):
    b = messages(url, max_tokens=4, temperature=0, ignore_eos=True)
    assert b["type"] == "message"
    assert b["role"] == "assistant"
    assert isinstance(b["id"], str) and b["id"]
    assert isinstance(b["model"], str)
    assert isinstance(b["content"], list) and b["content"]
    assert b["content"][0]["type"] == "text"
    assert isinstance(b["content"][0]["text"], str)
    assert b["stop_reason"] == "max_tokens"
    assert b.get("stop_sequence") is None
    u = b["usage"]
    assert u["input_tokens"] > 0
    assert u["output_tokens"] == 4
    assert "timings" not in b


def test_messages_system_string_and_blocks(url):
    none = messages(url, max_tokens=1, temperature=0)
    s = messages(url, max_tokens=1, temperature=0, system="You answer in one word.")
    blocks = messages(url, max_tokens=1, temperature=0,
                      system=[{"type": "text", "text": "You answer in one word."}])
    assert s["usage"]["input_tokens"] > none["usage"]["input_tokens"]
    assert s["usage"]["input_tokens"] == blocks["usage"]["input_tokens"]
    assert text_of(s) == text_of(blocks)


def test_messages_content_blocks(url):
    a = messages(url, max_tokens=3, temperature=0,
                 messages=[{"role": "user", "content": [{"type": "text", "text": "Tell me about mountains."}]}])
    b = messages(url, max_tokens=3, temperature=0)
    assert a["usage"]["input_tokens"] == b["usage"]["input_tokens"]
    assert text_of(a) == text_of(b)


def test_messages_stop_sequences(url):
    base = text_of(messages(url, max_tokens=16, temperature=0, ignore_eos=True))
    t = base.strip()
    if len(t) < 6:
        pytest.skip("greedy text too short: %r" % base)
    stop = t[len(t) // 2:len(t) // 2 + 2]
    b = messages(url, max_tokens=16, temperature=0, ignore_eos=True, stop_sequences=[stop])
    assert text_of(b) == base[:base.find(stop)]
    assert b["stop_reason"] == "stop_sequence"
    assert b["stop_sequence"] == stop


ORDER = ["message_start", "content_block_start", "content_block_delta", "content_block_stop",
         "message_delta", "message_stop"]


def test_messages_stream(url):
    plain = messages(url, max_tokens=6, temperature=0, ignore_eos=True)
    r, events = stream(url, PATH, {"model": "x", "messages": MSGS, "max_tokens": 6,
                                   "temperature": 0, "ignore_eos": True})
    assert r.status_code == 200, r.text
    datas = []
    for e in events:
        d = e.json()
        assert e.name == d["type"], "event: %r but data type %r" % (e.name, d["type"])
        if d["type"] != "ping":
            datas.append(d)
    kinds = [d["type"] for d in datas]
    # the sequence: start, one text block with its deltas, the message delta, stop
    compact = [k for i, k in enumerate(kinds) if i == 0 or k != kinds[i - 1]]
    assert compact == ORDER, kinds
    start = datas[0]["message"]
    assert start["type"] == "message" and start["role"] == "assistant"
    assert start["content"] == []
    assert start["usage"]["input_tokens"] == plain["usage"]["input_tokens"]
    assert datas[1]["index"] == 0 and datas[1]["content_block"]["type"] == "text"
    text = ""
    for d in datas:
        if d["type"] == "content_block_delta":
            assert d["index"] == 0
            assert d["delta"]["type"] == "text_delta"
            text += d["delta"]["text"]
    assert text == text_of(plain)
    md = [d for d in datas if d["type"] == "message_delta"][0]
    assert md["delta"]["stop_reason"] == "max_tokens"
    assert md["usage"]["output_tokens"] == 6


def test_count_tokens(url):
    body = {"model": "x", "messages": MSGS, "system": "Be brief."}
    r = post(url, "/v1/messages/count_tokens", body)
    assert r.status_code == 200, r.text
    c = r.json()
    assert set(c) == {"input_tokens"}, c
    b = messages(url, max_tokens=1, temperature=0, system="Be brief.")
    assert c["input_tokens"] == b["usage"]["input_tokens"]


def test_messages_sampling_fields(url):
    b = messages(url, max_tokens=3, temperature=0.7, top_p=0.9, top_k=20)
    assert b["usage"]["output_tokens"] >= 1


def test_messages_stream_stop_sequence(url):
    base = text_of(messages(url, max_tokens=16, temperature=0, ignore_eos=True))
    t = base.strip()
    if len(t) < 6:
        pytest.skip("greedy text too short: %r" % base)
    stop = t[len(t) // 2:len(t) // 2 + 2]
    r, events = stream(url, PATH, {"model": "x", "messages": MSGS, "max_tokens": 16, "temperature": 0,
                                   "ignore_eos": True, "stop_sequences": [stop]})
    assert r.status_code == 200, r.text
    datas = [e.json() for e in events]
    text = "".join(d["delta"]["text"] for d in datas if d["type"] == "content_block_delta")
    assert text == base[:base.find(stop)]
    md = [d for d in datas if d["type"] == "message_delta"][0]
    assert md["delta"]["stop_reason"] == "stop_sequence"
    assert md["delta"].get("stop_sequence") == stop


TOOLS = [{"name": "get_weather", "description": "The weather in a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]


def test_messages_tools_and_tool_history(url):
    """Client tools reach the template (the prompt grows by their listing); a history
    with a tool_use and its tool_result is accepted and rendered."""
    base = post(url, "/v1/messages/count_tokens", {"messages": MSGS}).json()["input_tokens"]
    with_tools = post(url, "/v1/messages/count_tokens",
                      {"messages": MSGS, "tools": TOOLS}).json()["input_tokens"]
    assert with_tools > base + 20
    none = post(url, "/v1/messages/count_tokens", {"messages": MSGS, "tools": TOOLS,
                                                   "tool_choice": {"type": "none"}})
    assert none.json()["input_tokens"] == base
    history = MSGS + [
        {"role": "assistant", "content": [
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "toolu_01", "name": "get_weather",
             "input": {"city": "Oslo"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01", "content": "-3 C"}]}]
    r = post(url, PATH, {"model": "x", "max_tokens": 4, "messages": history, "tools": TOOLS,
                         "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["stop_reason"] in ("end_turn", "max_tokens", "tool_use")


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_errors_before_the_route_have_anthropics_shape(url, path):
    import requests
    for r, status in ((requests.post(url + path, data=b"{", timeout=30), 400),
                      (requests.post(url + path, data=b"[1]", timeout=30), 400),
                      (requests.post(url + path, data=b"", timeout=30), 400),
                      (requests.get(url + path, timeout=30), 405)):
        assert r.status_code == status, r.text
        j = r.json()
        assert j["type"] == "error" and j["error"]["type"] == "invalid_request_error", j
        assert j["error"]["message"], j
    # the other routes keep llama-server's shape
    r = requests.post(url + "/v1/chat/completions", data=b"{", timeout=30)
    assert r.json()["error"]["code"] == 400, r.text


def test_auth_error_on_messages_has_anthropics_shape(servers):
    import requests
    srv = servers.start(["-np", "1", "-c", "512", "-t", "1", "--api-key", "k"])
    r = requests.post(srv.url + "/v1/messages", json={"max_tokens": 1, "messages": []}, timeout=30)
    assert r.status_code == 401, r.text
    assert r.json() == {"type": "error", "error": {"type": "authentication_error",
                                                   "message": "Invalid API Key"}}, r.text


def test_thinking_budget_tokens(url):
    base = {"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    r = post(url, "/v1/messages", dict(base, thinking={"type": "enabled", "budget_tokens": 4}))
    assert r.status_code == 200, r.text
    for bad in (0, -3, "many", 1.5):
        r = post(url, "/v1/messages", dict(base, thinking={"type": "enabled", "budget_tokens": bad}))
        assert r.status_code == 400, r.text
        assert "budget_tokens" in r.json()["error"]["message"], r.text
