"""Tests of bloomery-template (router/template.c) against Python's jinja2 driven the
way Hugging Face transformers renders chat templates: an ImmutableSandboxedEnvironment
with trim_blocks and lstrip_blocks, the loop-controls extension, the {% generation %}
tag, a tojson that does not escape HTML, and the globals raise_exception and
strftime_now.

Every template of ../shared/templates (and the one inside the tiny Qwen3 GGUF) is
rendered over a set of conversations, with add_generation_prompt and enable_thinking
both ways; the two outputs must match byte for byte, and where jinja2 raises (the
template rejects the conversation) bloomery-template must exit 1. Broken templates
must exit 1 with the template line named, never crash.

  /usr/bin/python3 -m pytest tests/tools/test_templates.py
The binary is found in $BLOOMERY_BIN (a folder) or build/bin under the repository
root; the templates in $BLOOMERY_SHARED or ../shared beside the repository.
"""
import concurrent.futures
import copy
import datetime
import glob
import json
import os
import re
import struct
import subprocess

import pytest

jinja2 = pytest.importorskip("jinja2")
from jinja2 import nodes  # noqa: E402
from jinja2.ext import Extension, loopcontrols  # noqa: E402
from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.join(os.environ.get("BLOOMERY_BIN") or os.path.join(ROOT, "build", "bin"), "bloomery-template")
SHARED = os.environ.get("BLOOMERY_SHARED") or os.path.join(ROOT, "..", "shared")
TEMPLATES = os.path.join(SHARED, "templates")
TINY = os.path.join(SHARED, "models", "qwen3moe-tiny-q4k.gguf")

SANITIZER_REPORT = re.compile(r"AddressSanitizer|LeakSanitizer|runtime error:|UndefinedBehaviorSanitizer")

needs_shared = pytest.mark.skipif(not os.path.isdir(TEMPLATES),
                                  reason=f"{TEMPLATES} is absent (set BLOOMERY_SHARED)")


# --- the reference: jinja2 configured as Hugging Face configures it ---------------

class GenerationTag(Extension):
    """{% generation %}...{% endgeneration %} renders its body (transformers uses it
    to mark assistant tokens)."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.datetime.now().strftime(fmt)


def hf_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def py_render(text, ctx, compiled=None):
    """Returns (output, None) or (None, error text). `compiled` reuses a template
    compiled by hf_env().from_string(text)."""
    try:
        tpl = compiled or hf_env().from_string(text)
        return tpl.render(**copy.deepcopy(ctx)), None
    except Exception as e:  # the template rejected the conversation, or is broken
        return None, f"{type(e).__name__}: {e}"


def bt_render(tmp_path, text, ctx, name="t"):
    if not os.access(BIN, os.X_OK):
        pytest.fail(f"{BIN} is missing: build it, or set BLOOMERY_BIN to the folder holding it")
    tp = tmp_path / f"{name}.jinja"
    cp = tmp_path / f"{name}.json"
    tp.write_bytes(text.encode("utf-8"))
    cp.write_text(json.dumps(ctx, ensure_ascii=False), encoding="utf-8")
    p = subprocess.run([BIN, "--template", str(tp), "--context", str(cp)],
                       capture_output=True, timeout=60)
    err = p.stderr.decode(errors="replace")
    assert p.returncode >= 0, f"killed by signal {-p.returncode}: {err}"
    # a sanitizer build reports on stderr and may still exit 1, like a refusal
    assert not SANITIZER_REPORT.search(err), err
    return p


# --- conversations ------------------------------------------------------------------

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city. Returns \"temp\" & <conditions>.",
        "parameters": {"type": "object", "properties": {
            "location": {"type": "string", "description": "City name, e.g. Paris"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "description": "Forecast days"},
        }, "required": ["location"]}}},
    {"type": "function", "function": {
        "name": "search",
        "description": "Search the web.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string"},
            "filters": {"type": "array", "items": {"type": "string"}},
        }, "required": ["query"]}}},
]

SYS = {"role": "system", "content": "You are a helpful assistant. Réponds en français si possible."}
U1 = {"role": "user", "content": "Hello! What's 2+2? Use \"quotes\" & <tags>\nplease."}
A1 = {"role": "assistant", "content": "2+2 is 4. 😀"}
U2 = {"role": "user", "content": "Thanks. Now tell me about 東京."}

CALL = {"role": "assistant", "content": "", "tool_calls": [
    {"id": "abcDEF123", "type": "function", "function": {
        "name": "get_weather",
        "arguments": {"location": "Paris", "unit": "celsius", "days": 3, "ratio": 0.5,
                      "flags": ["a", "b"], "extra": {"x": True, "y": None}}}},
]}
RESULT = {"role": "tool", "tool_call_id": "abcDEF123", "name": "get_weather",
          "content": "{\"temp\": 21, \"conditions\": \"sunny\"}"}
FINAL = {"role": "assistant", "content": "It is 21 °C and sunny in Paris."}

CONVERSATIONS = {
    "system_user": [SYS, U1],
    "user_only": [U1],
    "multi_turn": [SYS, U1, A1, U2],
    "tools": [SYS, {"role": "user", "content": "Weather in Paris?"}, CALL, RESULT, FINAL,
              {"role": "user", "content": "And tomorrow?"}],
    "tools_pending": [{"role": "user", "content": "Weather in Paris?"}, CALL, RESULT],
    "reasoning": [U1, {"role": "assistant", "content": "4.",
                       "reasoning_content": "The user asks 2+2. That is 4."}, U2],
    # OpenAI clients send content null beside tool_calls, several calls at once,
    # and arguments as a JSON string
    "tools_parallel": [{"role": "user", "content": "Weather in Paris and Oslo?"},
                       {"role": "assistant", "content": None, "tool_calls": [
                           {"id": "a1b2c3d4e", "type": "function", "function": {
                               "name": "get_weather", "arguments": {"location": "Paris"}}},
                           {"id": "Zz9Yy8Xx7", "type": "function", "function": {
                               "name": "get_weather", "arguments": {"location": "Oslo", "days": 2}}}]},
                       {"role": "tool", "tool_call_id": "a1b2c3d4e", "content": "18 C"},
                       {"role": "tool", "tool_call_id": "Zz9Yy8Xx7", "content": "3 C"}],
    "tools_string_args": [{"role": "user", "content": "Search it."},
                          {"role": "assistant", "content": "Searching.", "tool_calls": [
                              {"id": "q1w2e3r4t", "type": "function", "function": {
                                  "name": "search", "arguments": "{\"query\": \"jinja\"}"}}]},
                          {"role": "tool", "tool_call_id": "q1w2e3r4t", "content": "found"}],
    "content_parts": [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
                      {"role": "user", "content": [{"type": "text", "text": "Part one."},
                                                   {"type": "text", "text": "Part two."}]}],
}
TOOL_CONVS = {"tools", "tools_pending", "tools_parallel", "tools_string_args"}


def contexts():
    for conv, msgs in CONVERSATIONS.items():
        for agp in (True, False):
            for think in (True, False):
                ctx = {"messages": msgs, "tools": TOOLS if conv in TOOL_CONVS else None,
                       "add_generation_prompt": agp, "enable_thinking": think,
                       "bos_token": "<s>", "eos_token": "</s>"}
                yield f"{conv}-agp{int(agp)}-think{int(think)}", ctx


# --- templates ----------------------------------------------------------------------

def gguf_chat_template(path):
    """tokenizer.chat_template from a GGUF file's metadata, or None."""
    with open(path, "rb") as f:
        data = f.read(64 << 20)
    if data[:4] != b"GGUF":
        return None
    off = 8
    n_tensors, n_kv = struct.unpack_from("<QQ", data, off)
    off += 16
    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def read_str(o):
        (n,) = struct.unpack_from("<Q", data, o)
        return data[o + 8:o + 8 + n], o + 8 + n

    def read_val(t, o):
        if t == 8:
            return read_str(o)
        if t == 9:
            (et, cnt) = struct.unpack_from("<IQ", data, o)
            o += 12
            for _ in range(cnt):
                _, o = read_val(et, o)
            return None, o
        fmt = "<" + scalar[t]
        return struct.unpack_from(fmt, data, o)[0], o + struct.calcsize(fmt)

    for _ in range(n_kv):
        key, off = read_str(off)
        (t,) = struct.unpack_from("<I", data, off)
        off += 4
        val, off = read_val(t, off)
        if key == b"tokenizer.chat_template":
            return val.decode("utf-8")
    return None


def template_files():
    return sorted(glob.glob(os.path.join(TEMPLATES, "*.jinja"))) if os.path.isdir(TEMPLATES) else []


def template_text(name):
    if name == "gguf:qwen3moe-tiny":
        if not os.path.exists(TINY):
            pytest.skip(f"{TINY} is absent")
        text = gguf_chat_template(TINY)
        assert text, "the tiny GGUF has no tokenizer.chat_template"
        return text
    with open(os.path.join(TEMPLATES, name), encoding="utf-8") as f:
        return f.read()


TEMPLATE_NAMES = ["gguf:qwen3moe-tiny"] + [os.path.basename(p) for p in template_files()]


@needs_shared
@pytest.mark.parametrize("name", TEMPLATE_NAMES)
def test_template_matches_jinja2(tmp_path, name):
    """One template over every conversation: outputs equal, or both refuse."""
    text = template_text(name)
    try:
        compiled = hf_env().from_string(text)
    except Exception:  # every render then fails the same way
        compiled = None
    cases = list(contexts())
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        runs = list(pool.map(lambda c: bt_render(tmp_path, text, c[1], name=c[0]), cases))
    problems = []
    for (cid, ctx), p in zip(cases, runs):
        want, perr = py_render(text, ctx, compiled)
        got = p.stdout
        if perr is not None:
            if p.returncode != 1:
                problems.append(f"{cid}: jinja2 raised ({perr[:200]}) but bloomery-template "
                                f"exited {p.returncode}")
        elif p.returncode != 0:
            problems.append(f"{cid}: bloomery-template failed: {p.stderr.decode(errors='replace')[:300]}")
        elif got != want.encode("utf-8"):
            w = want.encode("utf-8")
            i = next((k for k in range(min(len(w), len(got))) if w[k] != got[k]), min(len(w), len(got)))
            problems.append(f"{cid}: outputs differ at byte {i}: jinja2 {w[max(0, i - 40):i + 60]!r} "
                            f"vs ours {got[max(0, i - 40):i + 60]!r}")
    assert not problems, f"{name}: " + "\n".join(problems[:6])


# --- broken templates -----------------------------------------------------------------

BROKEN = {
    "unclosed_if": ("line one\n{% if messages %}\nnever closed", 2),
    "unclosed_tag": ("a\nb {{ messages[0].content\n", 2),
    "unknown_filter": ("x\n\n{{ messages | frobnicate }}", 3),
    "unknown_test": ("{% if messages is frobnicated %}{% endif %}", 1),
    "bad_syntax": ("ok\n{{ 1 + }}", 2),
    "stray_endfor": ("a\nb\n{% endfor %}", 3),
    "unknown_tag": ("{% frobnicate %}", 1),
    "unterminated_string": ("\n{{ 'abc }}", 2),
    "undefined_attribute": ("a\n{{ nothing.here }}", 2),
    "raise_exception": ("a\nb\n{{ raise_exception('no system role allowed') }}", 3),
    "not_callable": ("{{ messages() }}", 1),
    "deep_recursion": ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}\n{{ f(0) }}", 1),
    "deep_nesting": ("{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}", 1),
    "unsafe_append": ("{% set xs = [] %}\n{% set _ = xs.append(1) %}", 2),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_template_exits_1_naming_the_line(tmp_path, case):
    text, line = BROKEN[case]
    ctx = {"messages": [U1]}
    _, perr = py_render(text, ctx)
    assert perr is not None, "the reference should reject this template too"
    p = bt_render(tmp_path, text, ctx)
    err = p.stderr.decode(errors="replace")
    assert p.returncode == 1, f"exit {p.returncode}, stderr {err}"
    assert p.stdout == b""
    assert re.search(rf"\bline {line}\b", err), err


def test_raise_exception_message_reaches_stderr(tmp_path):
    p = bt_render(tmp_path, "{{ raise_exception('Conversation roles must alternate') }}", {})
    assert p.returncode == 1
    assert b"Conversation roles must alternate" in p.stderr


def test_context_must_be_an_object(tmp_path):
    tp = tmp_path / "t.jinja"
    tp.write_text("hi")
    cp = tmp_path / "c.json"
    cp.write_text("[1, 2]")
    p = subprocess.run([BIN, "--template", str(tp), "--context", str(cp)], capture_output=True, timeout=60)
    assert p.returncode == 1


# --- small behaviours, each against jinja2 ----------------------------------------------

SNIPPETS = {
    "whitespace": "a\n  {% if true %}\n    x\n  {% endif %}\nb {{- ' c ' -}} d\n{#- c -#}\ne",
    "loop_vars": "{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.first }}"
                 "{{ loop.last }}{{ loop.length }}{{ loop.previtem }}{{ loop.nextitem }};{% endfor %}",
    "loop_filter_else": "{% for x in xs if x > 1 %}{{ x }}{{ loop.length }}{% else %}none{% endfor %}"
                        "{% for x in [] %}x{% else %}empty{% endfor %}",
    "loop_controls": "{% for x in xs %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 3 %}{% break %}"
                     "{% endif %}{{ x }}{% endfor %}",
    "unpack": "{% for k, v in d.items() %}{{ k }}={{ v }},{% endfor %}{% for k, v in d | dictsort %}{{ k }}{% endfor %}",
    "namespace": "{% set ns = namespace(n=0, s='') %}{% for x in xs %}{% set ns.n = ns.n + x %}"
                 "{% set ns.s = ns.s ~ x %}{% endfor %}{{ ns.n }} {{ ns.s }}",
    "scoping": "{% set y = 1 %}{% for x in xs %}{% set y = x %}{{ y }}{% endfor %}{{ y }}",
    "macro": "{% macro m(a, b='B', c=none) %}[{{ a }}{{ b }}{{ c }}]{% endmacro %}{{ m(1) }}{{ m(1, c=3) }}{{ m(a=2, b=4) }}",
    "caller": "{% macro wrap(t) %}<{{ t }}>{{ caller() }}</{{ t }}>{% endmacro %}{% call wrap('b') %}in{% endcall %}",
    "arith": "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 1.5 * 2 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1e-5 }} {{ 3 - 5 }}",
    "strings": "{{ 'a' ~ 1 ~ none ~ true }} {{ 'ab' * 3 }} {{ 'Hello World'[::-1] }} {{ 'héllo'[1:3] }} {{ 'abc'[-1] }}",
    "compare": "{{ 1 < 2 < 3 }} {{ 'a' in 'abc' }} {{ 2 not in xs }} {{ 1 == 1.0 }} {{ none == none }} {{ [1,2] == [1,2] }}",
    "logic": "{{ 0 or 'x' }} {{ 1 and 'y' }} {{ not xs }} {{ 'yes' if xs else 'no' }} {{ 'a' if false }}|",
    "tests": "{{ xs is sequence }} {{ d is mapping }} {{ 1 is number }} {{ 1 is integer }} {{ 1.0 is float }} "
             "{{ none is none }} {{ true is boolean }} {{ 'x' is string }} {{ nope is defined }} {{ nope is undefined }} "
             "{{ xs is iterable }} {{ 3 is odd }} {{ 4 is divisibleby 2 }} {{ 'a' is in ['a'] }} {{ 1 is eq 1 }} {{ false is false }}",
    "filters_text": "{{ '  pad  ' | trim }}|{{ 'xxhixx' | trim('x') }}|{{ 'hello world' | title }}|{{ 'hELLO' | capitalize }}|"
                    "{{ 'a-b' | replace('-', '+') }}|{{ 'abc' | upper }}{{ 'ABC' | lower }}|{{ 'one two  three' | wordcount }}|"
                    "{{ 'l1\nl2\n\nl3' | indent(2) }}|{{ 'l1\nl2' | indent(2, true) }}",
    "filters_seq": "{{ xs | length }} {{ xs | first }} {{ xs | last }} {{ xs | join(',') }} {{ xs | reverse | list }} "
                   "{{ [3,1,2] | sort }} {{ ['b','A','a'] | unique | list }} {{ xs | sum }} {{ xs | min }} {{ xs | max }} "
                   "{{ people | map(attribute='name') | join('/') }} {{ people | selectattr('age', 'gt', 20) | list | length }} "
                   "{{ people | rejectattr('age') | list }} {{ xs | select('odd') | list }} {{ xs | reject('even') | list }} "
                   "{{ ['a','b'] | map('upper') | list }} {{ d | items | list }} {{ d | dictsort(reverse=true) }}",
    "filters_num": "{{ '42' | int }} {{ 'x' | int(7) }} {{ '3.5' | float }} {{ -3 | abs }} {{ 2.567 | round(2) }} "
                   "{{ 2.5 | round }} {{ 3.7 | round(0, 'floor') }} {{ 1 | string }}{{ none | string }}",
    "default": "{{ nope | default('d') }} {{ none | default('d') }} {{ '' | default('d', true) }} {{ nope | d(1) }}",
    "tojson": "{{ d | tojson }} {{ d | tojson(indent=2) }} {{ 'é<>&\"\n' | tojson }} {{ 'é' | tojson(ensure_ascii=true) }} "
              "{{ d | tojson(sort_keys=true, separators=(',', ':')) }} {{ [1.0, 1e100, none, true] | tojson }}",
    "repr": "{{ d }} {{ xs }} {{ people[0] }} {{ ('a', 1) }} {{ [\"it's\", 'q\"', '\\n\\t'] }} {{ d.items() | list }}",
    "methods": "{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a b c'.rsplit(' ', 1) }} {{ '<x>'.strip('<>') }} "
               "{{ 'abc'.startswith('a') }} {{ 'abc'.endswith(('x', 'c')) }} {{ 'aXbX'.replace('X', '-') }} "
               "{{ 'hello'.find('l') }} {{ 'hello'.count('l') }} {{ '{} and {x}'.format(1, x=2) }} {{ d.get('a') }} "
               "{{ d.get('zz', 'none') }} {{ d.keys() | list }} {{ d.values() | list }} {{ '-'.join(['a', 'b']) }} "
               "{{ 'Ab'.lower() }}{{ 'ab'.upper() }} {{ '  x '.lstrip() }}|{{ ' x  '.rstrip() }}|",
    "safe_markup": "{{ 'a<'|safe + '<b>' }} {{ '<x>' + 'y'|safe }} {{ ('q'|safe) ~ '<' }}",
    "set_block": "{% set b %}inner {{ xs | length }}{% endset %}[{{ b }}]",
    "filter_block": "{% filter upper %}shout {{ xs[0] }}{% endfilter %}",
    "generation": "{% generation %}gen {{ xs[1] }}{% endgeneration %}",
    "raw": "{% raw %}{{ not parsed }}{% endraw %}",
    "dict_literals": "{% set m = {'k': [1, {'n': none}], 'j': (1,)} %}{{ m.k[1].n }} {{ m['j'] }} {{ m | length }}",
    "undefined_ops": "{{ nope }}|{{ nope | length }}|{{ nope ~ 'x' }}|{% for x in nope %}x{% endfor %}|{{ nope == nope }}|{{ nope | list }}",
    "range": "{{ range(3) | list }} {{ range(1, 10, 3) | list }} {{ range(5, 0, -2) | list }}",
    "trailing_newline": "line\n",
    "lstrip_comment": "a\n   {# c #}\nb\n  {%- if true %} x{% endif %}\n",
    "strftime": "{{ strftime_now('%Y') | length }}",
    "dict_attr_method": "{{ d.items is defined }} {{ d['items'] is defined }} {{ xs.append is defined }}",
    "split_edges": "{{ 'a b c '.split(None, 1) }} {{ ' a b c '.rsplit(None, 1) }} {{ 'a,b,c'.rsplit(',', 1) }} "
                   "{{ ''.split() }} {{ ''.split(',') }} {{ 'a  b'.split(' ') }}",
    "generators": "{{ xs | select('odd') is sequence }} {% if [] | select('odd') %}truthy{% endif %} "
                  "{{ d.items() }} {{ d.keys() }} {{ xs | map('string') | join }}",
    "for_else_break": "{% for x in xs %}{% for y in [] %}{% else %}{% if x == 2 %}{% break %}{% endif %}"
                      "{% endfor %}{{ x }}{% endfor %}",
    "repetition_round": "{{ [1] * 2 }} {{ 'ab' * 0 }}| {{ 5 | round(-1) }} {{ 15 | round(-1) }} {{ 2.675 | round(2) }}",
    "macro_varargs": "{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, k=3) }}",
    "percent_format": "{{ '%s and %d' % ('a', 3) }} {{ '%5.2f|%-4s|%r|%%' % (3.14159, 'ab', 'q') }} "
                      "{{ '%s-%s' | format(1, 'b') }} {{ [1, 2, 3] | batch(2, 0) | list }}",
    "undefined_edges": "{{ nope | last }}|{{ 'x%s' % nope }}|{{ 'abc' % {'a': 1} }}|{{ '' % [1] }}|{{ 2.5 is odd }}|"
                       "{{ nope | sum }}|{{ nope | min }}|{{ nope is iterable }}|{{ nope is callable }}",
    "with_and_set_filter": "{% set a = 5 %}{% with a = 1, b = a %}{{ a }}{{ b }}{% endwith %}{{ a }} "
                           "{% set x | upper %} hi {{ 1 }} {% endset %}[{{ x }}] {{ 'upper' is filter }} "
                           "{{ 'odd' is test }} {{ '<a>' | forceescape }}{% if false %}{{ x | truncate(3) }}{% endif %}",
    "late_binding": "{% set x = 1 %}{% macro m() %}{{ x }}{% endmacro %}{% set x = 2 %}{{ m() }}",
}

SNIPPET_CTX = {
    "xs": [1, 2, 3, 4],
    "d": {"b": 2, "a": 1, "c": [1, "x"]},
    "people": [{"name": "Ann", "age": 31}, {"name": "Bob", "age": 0}, {"name": "Cy", "age": 19}],
}


@pytest.mark.parametrize("name", sorted(SNIPPETS))
def test_snippet_matches_jinja2(tmp_path, name):
    text = SNIPPETS[name]
    want, perr = py_render(text, SNIPPET_CTX)
    assert perr is None, perr
    p = bt_render(tmp_path, text, SNIPPET_CTX)
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    assert p.stdout.decode("utf-8") == want
