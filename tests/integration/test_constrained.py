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
    ({"json_schema": {"type": "string", "pattern": "^a+$"}}, 400, "pattern"),
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
