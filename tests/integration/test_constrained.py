"""Constrained generation: `grammar` (GBNF), `json_schema`, and `response_format`
json_object / json_schema, on the native, OpenAI and chat routes, streamed and not.
The test model writes noise, so whatever it writes under a constraint must still be
what the constraint allows, and the text must end when the grammar is complete."""
import json

import pytest

from sse import data_events, post, stream

PROMPT = "The old lighthouse keeper walked down to the"
CONV = [{"role": "user", "content": "Give me the weather as JSON."}]

# A schema whose every value is bounded, so that the text completes within the
# token limit whatever the model prefers.
SCHEMA = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "color": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
        "note": {"type": "string", "maxLength": 3},
        "score": {"type": "number", "minimum": -0.5, "exclusiveMaximum": 2.25},
    },
    "required": ["ok", "color"],
    "additionalProperties": False,
}


def check_schema(value):
    assert isinstance(value, dict), value
    assert set(value) <= set(SCHEMA["properties"]), value
    assert isinstance(value["ok"], bool) and value["color"] in ("red", "green", "blue"), value
    if "tags" in value:
        assert len(value["tags"]) <= 2 and all(t in ("a", "b") for t in value["tags"]), value
    if "note" in value:
        assert isinstance(value["note"], str) and len(value["note"]) <= 3, value
    if "score" in value:
        assert isinstance(value["score"], (int, float)) and -0.5 <= value["score"] < 2.25, value


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_grammar_on_completion(url, seed):
    r = post(url, "/completion", {"prompt": PROMPT, "n_predict": 40, "seed": seed,
                                  "temperature": 1.0,
                                  "grammar": 'root ::= ("yes" | "no") " " [0-9]{1,3} "."\n'})
    assert r.status_code == 200, r.text
    b = r.json()
    c = b["content"]
    word, _, rest = c.partition(" ")
    assert word in ("yes", "no") and rest.endswith(".") and rest[:-1].isdigit(), repr(c)
    assert 1 <= len(rest) - 1 <= 3, repr(c)
    assert b["stop_type"] == "eos", b  # ended because the grammar was complete
    assert b["generation_settings"]["grammar"].startswith("root ::=")


def test_json_schema_on_completion_and_stream(url):
    body = {"prompt": PROMPT, "n_predict": 200, "seed": 5, "temperature": 1.0,
            "json_schema": SCHEMA}
    r = post(url, "/completion", body)
    assert r.status_code == 200, r.text
    check_schema(json.loads(r.json()["content"]))
    r, events = stream(url, "/completion", body)
    text = "".join(e.get("content", "") for e in data_events(events))
    check_schema(json.loads(text))


@pytest.mark.parametrize("fmt", [
    {"type": "json_schema", "json_schema": {"name": "weather", "strict": True, "schema": SCHEMA}},
    {"type": "json_object", "schema": SCHEMA},
])
def test_response_format_on_chat(url, fmt):
    r = post(url, "/v1/chat/completions", {"messages": CONV, "max_tokens": 200, "seed": 7,
                                            "temperature": 1.0, "response_format": fmt})
    assert r.status_code == 200, r.text
    ch = r.json()["choices"][0]
    check_schema(json.loads(ch["message"]["content"]))
    assert ch["finish_reason"] == "stop"


def test_response_format_json_object_gives_an_object(url):
    for seed in (1, 2):
        r = post(url, "/v1/completions", {"prompt": PROMPT, "max_tokens": 120, "seed": seed,
                                          "temperature": 0.7,
                                          "response_format": {"type": "json_object"}})
        assert r.status_code == 200, r.text
        ch = r.json()["choices"][0]
        text = ch["text"]
        assert text.lstrip().startswith("{"), repr(text)
        if ch["finish_reason"] == "stop":  # complete: one JSON object
            assert isinstance(json.loads(text), dict), repr(text)


@pytest.mark.parametrize("body,status,needle", [
    ({"grammar": "root ::= (\"a\"\n"}, 400, "'grammar': grammar: line 1"),
    ({"grammar": "root ::= other\n"}, 400, "'other' is used but not defined"),
    ({"grammar": 5}, 400, "'grammar' must be a string"),
    ({"grammar": "root ::= \"a\"", "json_schema": {"type": "string"}}, 400, "not both"),
    ({"json_schema": {"type": "string", "pattern": "^(a)\\1$"}}, 400, "pattern"),
    ({"json_schema": {"type": "number", "multipleOf": 0.5}}, 400, "multipleOf"),
    ({"json_schema": {"type": "number", "minimum": 2, "maximum": 1}}, 400, "leave no number"),
    ({"response_format": {"type": "json_schema"}}, 400, "json_schema.schema"),
    ({"response_format": {"type": "xml"}}, 400, "'response_format' of type \"xml\""),
    ({"response_format": {"type": "json_object"}, "json_schema": {}}, 400, "not both"),
])
def test_bad_constraints_are_400s(url, body, status, needle):
    r = post(url, "/completion", dict({"prompt": PROMPT, "n_predict": 2}, **body))
    assert r.status_code == status, r.text
    assert needle in r.json()["error"]["message"], r.text


def test_empty_grammar_is_no_grammar(url):
    r = post(url, "/completion", {"prompt": PROMPT, "n_predict": 3, "grammar": "",
                                  "ignore_eos": True})
    assert r.status_code == 200, r.text
    assert r.json()["timings"]["predicted_n"] == 3


TOOLS = [
    {"type": "function", "function": {"name": "paint", "parameters": {
        "type": "object", "properties": {"color": {"enum": ["red", "blue"]},
                                         "coats": {"type": "integer", "minimum": 0}},
        "required": ["color"]}}},
    {"type": "function", "function": {"name": "wait", "parameters": {
        "type": "object", "properties": {}}}},
]
NO_THINK = {"enable_thinking": False}


def merge_deltas(deltas):
    """OpenAI's streamed tool calls as whole calls: an entry with an id opens call
    `index` (its name and the arguments so far), the others add to its arguments."""
    calls = {}
    for d in deltas:
        i = d["index"]
        if "id" in d:
            assert i not in calls, deltas
            calls[i] = {"id": d["id"], "type": d["type"],
                        "function": {"name": d["function"]["name"], "arguments": d["function"].get("arguments", "")}}
        else:
            assert i in calls, deltas
            calls[i]["function"]["arguments"] += d["function"]["arguments"]
    return [calls[i] for i in sorted(calls)]


def check_calls(calls, names):
    assert calls, "no tool call"
    for c in calls:
        assert c["type"] == "function" and c["function"]["name"] in names, c
        args = json.loads(c["function"]["arguments"])
        if c["function"]["name"] == "paint":
            assert args["color"] in ("red", "blue"), args
            assert set(args) <= {"color", "coats"}, args
        else:
            assert args == {}, args


@pytest.mark.parametrize("seed", [1, 2])
def test_tool_choice_required_writes_a_call(url, seed):
    r = post(url, "/v1/chat/completions", {
        "messages": CONV, "tools": TOOLS, "tool_choice": "required", "seed": seed,
        "parallel_tool_calls": False, "max_tokens": 300, "temperature": 1.0,
        "chat_template_kwargs": NO_THINK})
    assert r.status_code == 200, r.text
    ch = r.json()["choices"][0]
    assert ch["finish_reason"] == "tool_calls", ch
    assert len(ch["message"]["tool_calls"]) == 1, ch
    check_calls(ch["message"]["tool_calls"], {"paint", "wait"})


def test_tool_choice_named_function_streamed(url):
    body = {"messages": CONV, "tools": TOOLS, "seed": 3, "max_tokens": 300, "temperature": 1.0,
            "tool_choice": {"type": "function", "function": {"name": "wait"}},
            "parallel_tool_calls": False, "chat_template_kwargs": NO_THINK}
    r, events = stream(url, "/v1/chat/completions", body)
    assert r.status_code == 200
    deltas = [tc for e in data_events(events) for ch in e.get("choices", [])
              for tc in ch.get("delta", {}).get("tool_calls", []) or []]
    check_calls(merge_deltas(deltas), {"wait"})
    finishes = [ch.get("finish_reason") for e in data_events(events) for ch in e.get("choices", [])]
    assert "tool_calls" in finishes, finishes


@pytest.mark.parametrize("body,needle", [
    ({"tool_choice": "required"}, "'tools' is empty"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "fly"}}}, "fly"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
     "together"),
])
def test_tool_choice_refusals(url, body, needle):
    r = post(url, "/v1/chat/completions", dict({"messages": CONV, "max_tokens": 4}, **body))
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]["message"], r.text


def test_anthropic_tool_choice_any_writes_a_tool_use(url):
    tools = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]}
             for t in TOOLS]
    r = post(url, "/v1/messages", {
        "model": "x", "max_tokens": 300, "messages": [{"role": "user", "content": "Paint it."}],
        "tools": tools, "tool_choice": {"type": "tool", "name": "paint",
                                        "disable_parallel_tool_use": True},
        "thinking": {"type": "disabled"}, "temperature": 1.0})
    assert r.status_code == 200, r.text
    b = r.json()
    assert b["stop_reason"] == "tool_use", b
    uses = [c for c in b["content"] if c["type"] == "tool_use"]
    assert len(uses) == 1 and uses[0]["name"] == "paint", b
    assert uses[0]["input"]["color"] in ("red", "blue"), b


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_number_range_on_completion(url, seed):
    """A bounded number: a plain decimal inside the bounds, every time."""
    schema = {"type": "number", "exclusiveMinimum": -1.5, "maximum": 0.75}
    r = post(url, "/completion", {"prompt": PROMPT, "n_predict": 24, "seed": seed,
                                  "temperature": 1.0, "json_schema": schema})
    assert r.status_code == 200, r.text
    text = r.json()["content"]
    if r.json()["stop_type"] == "eos":  # complete
        v = json.loads(text)
        assert -1.5 < v <= 0.75 and "e" not in text.lower(), repr(text)


def test_a_grammar_past_its_bound_is_named_not_a_context_overflow(url):
    # 100,000 alternatives: past the grammar's size bound; the request is 1 token
    alts = " | ".join('"a%d"' % i for i in range(100000))
    r = post(url, "/completion", {"prompt": "x", "n_predict": 2, "grammar": "root ::= " + alts})
    assert r.status_code == 400, r.text
    e = r.json()["error"]
    assert e["type"] == "invalid_request_error", e
    assert "'grammar'" in e["message"] and "context" not in e["message"], e
    r = post(url, "/v1/chat/completions", {"messages": CONV, "max_tokens": 2,
                                            "json_schema": {"enum": ["v%d" % i for i in range(100000)]}})
    assert r.status_code == 400, r.text
    assert "'json_schema'" in r.json()["error"]["message"], r.text
    assert r.json()["error"]["type"] == "invalid_request_error", r.text


# A schema that refers to its own root ($ref "#"): bounded by maxProperties so that
# the reply ends.
TREE = {"type": "object", "properties": {"next": {"$ref": "#"}}, "additionalProperties": False}


def test_a_schema_referring_to_its_root_works_on_every_route(url):
    r = post(url, "/completion", {"prompt": PROMPT, "n_predict": 30, "json_schema": TREE})
    assert r.status_code == 200, r.text
    assert r.json()["content"].lstrip().startswith("{"), r.text
    for body in ({"json_schema": TREE},
                 {"response_format": {"type": "json_schema", "json_schema": {"schema": TREE}}}):
        r = post(url, "/v1/chat/completions", dict({"messages": CONV, "max_tokens": 30}, **body))
        assert r.status_code == 200, r.text
        content = r.json()["choices"][0]["message"]["content"]
        assert content.lstrip().startswith("{"), repr(content)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_constraint_holds_after_a_thought(url, seed):
    # thinking left on and the thought kept in the content: whatever follows the
    # first </think> is an integer
    r = post(url, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 40, "seed": seed,
        "temperature": 1.0, "json_schema": {"type": "integer"}, "reasoning_format": "none"})
    assert r.status_code == 200, r.text
    ch = r.json()["choices"][0]
    text = ch["message"]["content"]
    if "<think>" in text:
        assert "</think>" in text or ch["finish_reason"] == "length", repr(text)
        text = text.split("</think>", 1)[1] if "</think>" in text else ""
    text = text.strip()
    if ch["finish_reason"] == "stop":
        int(text)
    else:
        assert text == "" or text.lstrip("-").isdigit() or text == "-", repr(text)
