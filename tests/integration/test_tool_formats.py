"""Tool calls in each format a chat template can teach (router/toolcall.c), end to
end: a server whose template names the format (--chat-template-file), and a reply
that a grammar makes the model write word for word, split into OpenAI's
tool_calls, whole and streamed (the name first, then the arguments in pieces)."""
import json

import pytest

from sse import data_events, post, stream
from test_constrained import merge_deltas

BAR, LOW = "\uff5c", "\u2581"


def ds(x):
    return "<" + BAR + x + BAR + ">"


DS_CALLS = ds("tool" + LOW + "calls" + LOW + "begin"), ds("tool" + LOW + "calls" + LOW + "end")
DS_CALL = ds("tool" + LOW + "call" + LOW + "begin"), ds("tool" + LOW + "call" + LOW + "end")
DS_SEP = ds("tool" + LOW + "sep")

TOOLS = [{"type": "function", "function": {
    "name": "paint", "description": "Paint the wall.",
    "parameters": {"type": "object", "properties": {"color": {"type": "string"},
                                                    "coats": {"type": "integer"}}}}}]
ARGS = {"color": "deep red", "coats": 2}

# format: (a marker its template holds, the reply, the content the reply keeps,
# the reasoning it keeps)
CASES = {
    "hermes": ("<tool_call>",
               'On it.\n<tool_call>\n{"name": "paint", "arguments": {"color": "deep red", "coats": 2}}\n</tool_call>',
               "On it.", ""),
    "qwen3-coder": ("<tool_call><function=x><parameter=y>",
                    "<tool_call>\n<function=paint>\n<parameter=color>\ndeep red\n</parameter>\n"
                    "<parameter=coats>\n2\n</parameter>\n</function>\n</tool_call>", "", ""),
    "deepseek-r1": (DS_CALLS[0] + "function" + DS_SEP + "```json",
                    "Painting." + DS_CALLS[0] + DS_CALL[0] + "function" + DS_SEP + "paint\n```json\n"
                    '{"color": "deep red", "coats": 2}\n```' + DS_CALL[1] + DS_CALLS[1], "Painting.", ""),
    "deepseek-v3.1": (DS_CALLS[0] + DS_SEP,
                      DS_CALLS[0] + DS_CALL[0] + "paint" + DS_SEP + '{"color": "deep red", "coats": 2}'
                      + DS_CALL[1] + DS_CALLS[1], "", ""),
    "kimi-k2": ("<|tool_calls_section_begin|>",
                "<|tool_calls_section_begin|><|tool_call_begin|>functions.paint:0<|tool_call_argument_begin|>"
                '{"color": "deep red", "coats": 2}<|tool_call_end|><|tool_calls_section_end|>', "", ""),
    "glm-4.5": ("<tool_call><arg_key>",
                "<tool_call>paint\n<arg_key>color</arg_key>\n<arg_value>deep red</arg_value>\n"
                "<arg_key>coats</arg_key>\n<arg_value>2</arg_value>\n</tool_call>", "", ""),
    "mistral-nemo": ("[TOOL_CALLS]",
                     '[TOOL_CALLS][{"name": "paint", "arguments": {"color": "deep red", "coats": 2}, '
                     '"id": "abcdefghi"}]', "", ""),
    "magistral": ("[TOOL_CALLS][ARGS]", '[TOOL_CALLS]paint[ARGS]{"color": "deep red", "coats": 2}', "", ""),
    "llama-3.x": ("<|python_tag|>", '{"name": "paint", "parameters": {"color": "deep red", "coats": 2}}', "", ""),
    "command-r7b": ("<|START_ACTION|>",
                    "<|START_RESPONSE|>Sure.<|END_RESPONSE|><|START_ACTION|>[{\"tool_call_id\": \"0\", "
                    '"tool_name": "paint", "parameters": {"color": "deep red", "coats": 2}}]<|END_ACTION|>',
                    "Sure.", ""),
    "gpt-oss": ("<|channel|>",
                "<|channel|>analysis<|message|>A wall to paint.<|end|><|start|>assistant<|channel|>"
                'commentary to=functions.paint <|constrain|>json<|message|>{"color": "deep red", "coats": 2}',
                "", "A wall to paint."),
}

TEMPLATE = ("{#- %s -#}{%%- for m in messages %%}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
            "{%%- endfor %%}{%%- if add_generation_prompt %%}<|im_start|>assistant\n{%%- endif %%}")


def gbnf_literal(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


@pytest.fixture(scope="module", params=sorted(CASES))
def fmt_server(request, module_servers, tmp_path_factory):
    name = request.param
    path = tmp_path_factory.mktemp("tpl") / ("%s.jinja" % name)
    path.write_text(TEMPLATE % CASES[name][0], encoding="utf-8")
    srv = module_servers.start(["-c", "2048", "--chat-template-file", str(path)])
    return name, srv


def body(name, **kw):
    b = {"messages": [{"role": "user", "content": "Paint the wall."}], "tools": TOOLS,
         "max_tokens": 600, "grammar": "root ::= " + gbnf_literal(CASES[name][1])}
    b.update(kw)
    return b


def test_the_format_is_read_off_the_template(fmt_server):
    name, srv = fmt_server
    assert "chat_format=%s" % name in srv.log(200000), name


def test_calls_split_out(fmt_server):
    name, srv = fmt_server
    r = post(srv.url, "/v1/chat/completions", body(name))
    assert r.status_code == 200, r.text
    ch = r.json()["choices"][0]
    msg = ch["message"]
    assert ch["finish_reason"] == "tool_calls", (name, ch)
    calls = msg["tool_calls"]
    assert len(calls) == 1, (name, msg)
    assert calls[0]["type"] == "function" and calls[0]["id"], calls
    assert calls[0]["function"]["name"] == "paint", calls
    assert json.loads(calls[0]["function"]["arguments"]) == ARGS, calls
    assert (msg.get("content") or "").strip() == CASES[name][2], (name, msg)
    assert (msg.get("reasoning_content") or "") == CASES[name][3], (name, msg)


def test_calls_streamed_as_they_come(fmt_server):
    name, srv = fmt_server
    r, events = stream(srv.url, "/v1/chat/completions", body(name))
    assert r.status_code == 200
    deltas = [tc for e in data_events(events) for ch in e.get("choices", [])
              for tc in ch.get("delta", {}).get("tool_calls", []) or []]
    calls = merge_deltas(deltas)
    assert [c["function"]["name"] for c in calls] == ["paint"], (name, deltas)
    assert json.loads(calls[0]["function"]["arguments"]) == ARGS, (name, deltas)
    # the header came first, and the arguments in more than one piece
    assert "id" in deltas[0] and len(deltas) >= 3, (name, deltas)
    text = "".join(ch.get("delta", {}).get("content") or "" for e in data_events(events)
                   for ch in e.get("choices", []))
    assert text.strip() == CASES[name][2], (name, text)
    finishes = [ch.get("finish_reason") for e in data_events(events) for ch in e.get("choices", [])]
    assert "tool_calls" in finishes, finishes


# a tool whose every call is short: the forced grammar ends whatever the model picks
FORCED_TOOLS = [{"type": "function", "function": {
    "name": "paint", "parameters": {
        "type": "object", "additionalProperties": False, "required": ["color", "coats"],
        "properties": {"color": {"type": "string", "enum": ["red", "deep blue"]},
                       "coats": {"type": "integer", "minimum": 1, "maximum": 3}}}}},
    {"type": "function", "function": {"name": "wait", "parameters": {
        "type": "object", "properties": {}, "additionalProperties": False}}}]


@pytest.mark.parametrize("seed", [1, 2])
def test_forcing_a_call_in_the_format(fmt_server, seed):
    """tool_choice "required" and a named function: a grammar in the format's own form
    makes the model write a call, which the format's parser splits out"""
    name, srv = fmt_server
    for choice, names in (("required", {"paint", "wait"}),
                          ({"type": "function", "function": {"name": "paint"}}, {"paint"})):
        r = post(srv.url, "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "Paint."}], "tools": FORCED_TOOLS,
            "tool_choice": choice, "parallel_tool_calls": False, "max_tokens": 200,
            "temperature": 1.0, "seed": seed, "chat_template_kwargs": {"enable_thinking": False}})
        assert r.status_code == 200, (name, r.text)
        ch = r.json()["choices"][0]
        assert ch["finish_reason"] == "tool_calls", (name, ch)
        calls = ch["message"]["tool_calls"]
        assert len(calls) == 1 and calls[0]["function"]["name"] in names, (name, ch)
        args = json.loads(calls[0]["function"]["arguments"])
        if calls[0]["function"]["name"] == "paint":
            assert args["color"] in ("red", "deep blue") and args["coats"] in (1, 2, 3), (name, args)
        else:
            assert args == {}, (name, args)


def test_a_call_cut_off_by_the_limit_ends_with_length(fmt_server):
    """As llama-server: a reply the token limit stops is "length", whatever the
    parser made of the text so far."""
    name, srv = fmt_server
    r = post(srv.url, "/v1/chat/completions", body(name, max_tokens=3))
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] == "length", (name, r.json())
