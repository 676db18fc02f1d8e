/* Tests of router/toolcall.c: each format's calls split out of a reply as it comes
 * (whole, and cut into pieces of every size from 1 to 7 bytes, which must agree),
 * what a stream shows of a call before it is whole, replies that only look like
 * calls, the format read off a template, and gpt-oss's channels. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_gen_impl.h"
#include "chatfmt.h"

#define DS_BAR "\xef\xbd\x9c"
#define DS_LOW "\xe2\x96\x81"
#define DS(x) "<" DS_BAR x DS_BAR ">"
#define DS_CALLS_BEGIN DS("tool" DS_LOW "calls" DS_LOW "begin")
#define DS_CALLS_END DS("tool" DS_LOW "calls" DS_LOW "end")
#define DS_CALL_BEGIN DS("tool" DS_LOW "call" DS_LOW "begin")
#define DS_CALL_END DS("tool" DS_LOW "call" DS_LOW "end")
#define DS_SEP DS("tool" DS_LOW "sep")

typedef struct run {
    rt_gen_buf_t text, reason;
    json_t *calls;
    /* per call index: whether its header was shown, and its arguments' pieces */
    int opened[8];
    rt_gen_buf_t shown[8];
} run_t;

static void run_free(run_t *r)
{
    rt__gen_buf_free(&r->text);
    rt__gen_buf_free(&r->reason);
    for (int i = 0; i < 8; i++)
        rt__gen_buf_free(&r->shown[i]);
    json_decref(r->calls);
}

static void take_events(const rt_gen_tools_t *t, run_t *r)
{
    for (size_t i = 0; i < t->n_ev; i++) {
        const rt_gen_call_ev_t *e = &t->ev[i];
        if (e->idx >= 8) fail_msg("event %d idx %zu (event %zu of %zu, calls %zu)", e->kind, e->idx, i, t->n_ev, json_array_size(t->calls));
        if (e->kind == RT_CALL_OPEN) {
            assert_false(r->opened[e->idx]);
            r->opened[e->idx] = 1;
            rt__gen_buf_free(&r->shown[e->idx]);
        } else if (e->kind == RT_CALL_ARGS) {
            assert_true(r->opened[e->idx]);
            assert_int_equal(rt__gen_buf_add(&r->shown[e->idx], e->args.p, e->args.n), 0);
        } else {
            r->opened[e->idx] = 0;
            rt__gen_buf_free(&r->shown[e->idx]);
        }
    }
}

/* s through the splitter of fmt in pieces of `piece` bytes (0: whole). */
static void split(rt_chatfmt_t fmt, const char *tools, const char *s, size_t piece, run_t *r)
{
    memset(r, 0, sizeof *r);
    json_error_t e;
    json_t *tl = tools ? json_loads(tools, 0, &e) : NULL;
    rt_gen_tools_t t;
    rt__gen_tools_init(&t, fmt, tl);
    json_decref(tl);
    size_t n = strlen(s), off = 0;
    assert_int_equal(rt__gen_buf_add(&r->text, "", 0), 0);
    assert_int_equal(rt__gen_buf_add(&r->reason, "", 0), 0);
    do {
        size_t k = piece && n - off > piece ? piece : n - off;
        int last = off + k == n;
        if (fmt == RT_CHATFMT_GPT_OSS)
            assert_int_equal(rt__gen_harmony_feed(&t, s + off, k, last, 1, &r->reason, &r->text), 0);
        else
            assert_int_equal(rt__gen_tools_feed(&t, s + off, k, last, &r->text), 0);
        take_events(&t, r);
        off += k;
    } while (off < n);
    if (n == 0) {
        assert_int_equal(rt__gen_tools_feed(&t, "", 0, 1, &r->text), 0);
    }
    assert_int_equal(t.hold.n, 0);
    r->calls = t.calls ? json_incref(t.calls) : json_array();
    rt__gen_tools_fini(&t);
}

static const char *fn(const json_t *calls, size_t i, const char *k)
{
    return json_string_value(json_object_get(json_object_get(json_array_get(calls, i), "function"), k));
}

/* The text and calls of s in fmt, the same whatever the pieces; the names and
 * arguments as listed (n_calls pairs), and each shown call's pieces adding up to
 * its arguments (equal as JSON). */
static void expect(rt_chatfmt_t fmt, const char *tools, const char *s, const char *text,
                   size_t n_calls, ...)
{
    for (size_t piece = 0; piece <= 7; piece++) {
        run_t r;
        split(fmt, tools, s, piece, &r);
        if (strcmp(r.text.p, text))
            fail_msg("%s, pieces of %zu: text \"%s\", want \"%s\"", rt_chatfmt_name(fmt), piece,
                     r.text.p, text);
        assert_int_equal(json_array_size(r.calls), n_calls);
        va_list ap;
        va_start(ap, n_calls);
        for (size_t i = 0; i < n_calls; i++) {
            const char *name = va_arg(ap, const char *), *args = va_arg(ap, const char *);
            assert_string_equal(fn(r.calls, i, "name"), name);
            if (strcmp(fn(r.calls, i, "arguments"), args))
                fail_msg("%s, pieces of %zu: call %zu arguments %s, want %s", rt_chatfmt_name(fmt),
                         piece, i, fn(r.calls, i, "arguments"), args);
            const char *id = json_string_value(json_object_get(json_array_get(r.calls, i), "id"));
            assert_non_null(id);
            assert_true(id[0] != '\0');
            if (i < 8 && r.opened[i]) { /* what the stream showed is the same object */
                json_error_t e;
                json_t *a = json_loads(args, 0, &e), *b = json_loads(r.shown[i].p ? r.shown[i].p : "", 0, &e);
                if (!json_equal(a, b))
                    fail_msg("%s, pieces of %zu: call %zu showed \"%s\", its arguments are %s",
                             rt_chatfmt_name(fmt), piece, i, r.shown[i].p ? r.shown[i].p : "", args);
                json_decref(a);
                json_decref(b);
            }
        }
        va_end(ap);
        run_free(&r);
    }
}

static void test_hermes(void **state)
{
    (void)state;
    expect(RT_CHATFMT_HERMES, NULL,
           "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
           "Let me look.\n", 1, "get_weather", "{\"city\":\"Paris\"}");
    expect(RT_CHATFMT_HERMES, NULL,
           "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call><tool_call>{\"name\": \"b\", "
           "\"arguments\": {\"x\": [1, 2]}}</tool_call>",
           "", 2, "a", "{}", "b", "{\"x\":[1,2]}");
    /* not a call: text, tags and all */
    expect(RT_CHATFMT_HERMES, NULL, "<tool_call>oops</tool_call> done",
           "<tool_call>oops</tool_call> done", 0);
    /* the text ends inside the call: taken as far as it is whole */
    expect(RT_CHATFMT_HERMES, NULL, "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}", "", 1,
           "f", "{\"a\":1}");
}

static void test_qwen3_coder(void **state)
{
    (void)state;
    const char *tools = "[{\"type\": \"function\", \"function\": {\"name\": \"run\", \"parameters\": "
                        "{\"type\": \"object\", \"properties\": {\"cmd\": {\"type\": \"string\"}, "
                        "\"n\": {\"type\": \"integer\"}}}}}]";
    expect(RT_CHATFMT_QWEN3_CODER, tools,
           "Running it.\n<tool_call>\n<function=run>\n<parameter=cmd>\nls -l\n</parameter>\n"
           "<parameter=n>\n3\n</parameter>\n</function>\n</tool_call>",
           "Running it.\n", 1, "run", "{\"cmd\":\"ls -l\",\"n\":3}");
    /* a string parameter stays text even when it reads as JSON */
    expect(RT_CHATFMT_QWEN3_CODER, tools,
           "<tool_call><function=run><parameter=cmd>42</parameter></function></tool_call>", "", 1,
           "run", "{\"cmd\":\"42\"}");
    expect(RT_CHATFMT_QWEN3_CODER, tools, "<tool_call><bad></tool_call>", "<tool_call><bad></tool_call>", 0);
}

static void test_deepseek(void **state)
{
    (void)state;
    expect(RT_CHATFMT_DEEPSEEK_R1, NULL,
           "Checking." DS_CALLS_BEGIN DS_CALL_BEGIN "function" DS_SEP "get_weather\n```json\n"
           "{\"city\": \"Paris\"}\n```" DS_CALL_END DS_CALL_BEGIN "function" DS_SEP "get_time\n```json\n"
           "{}\n```" DS_CALL_END DS_CALLS_END,
           "Checking.", 2, "get_weather", "{\"city\":\"Paris\"}", "get_time", "{}");
    expect(RT_CHATFMT_DEEPSEEK_V31, NULL,
           DS_CALLS_BEGIN DS_CALL_BEGIN "get_weather" DS_SEP "{\"city\": \"Paris\"}" DS_CALL_END
           DS_CALLS_END " after",
           " after", 1, "get_weather", "{\"city\":\"Paris\"}");
    /* the text ends after the first call: it is kept */
    expect(RT_CHATFMT_DEEPSEEK_V31, NULL,
           DS_CALLS_BEGIN DS_CALL_BEGIN "f" DS_SEP "{\"a\": \"\xc3\xa9\"}" DS_CALL_END, "", 1, "f",
           "{\"a\":\"\xc3\xa9\"}");
    /* a broken second call: the first is kept, the rest is text */
    expect(RT_CHATFMT_DEEPSEEK_V31, NULL,
           DS_CALLS_BEGIN DS_CALL_BEGIN "f" DS_SEP "{}" DS_CALL_END DS_CALL_BEGIN "g" DS_SEP "nope",
           DS_CALL_BEGIN "g" DS_SEP "nope", 1, "f", "{}");
}

static void test_kimi(void **state)
{
    (void)state;
    const char *s = "Two cities.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
                    "<|tool_call_argument_begin|>{\"city\": \"Hangzhou\"}<|tool_call_end|>"
                    "<|tool_call_begin|>functions.get_weather:1<|tool_call_argument_begin|>"
                    "{\"city\": \"Paris\"}<|tool_call_end|><|tool_calls_section_end|>";
    expect(RT_CHATFMT_KIMI_K2, NULL, s, "Two cities.", 2, "get_weather", "{\"city\":\"Hangzhou\"}",
           "get_weather", "{\"city\":\"Paris\"}");
    run_t r;
    split(RT_CHATFMT_KIMI_K2, NULL, s, 0, &r);
    assert_string_equal(json_string_value(json_object_get(json_array_get(r.calls, 1), "id")),
                        "functions.get_weather:1");
    run_free(&r);
}

static void test_glm(void **state)
{
    (void)state;
    const char *tools = "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
                        "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": "
                        "\"string\"}, \"days\": {\"type\": \"integer\"}, \"opts\": {\"type\": "
                        "\"object\"}}}}}]";
    expect(RT_CHATFMT_GLM45, tools,
           "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>\n"
           "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n<arg_key>opts</arg_key>\n"
           "<arg_value>{\"unit\": \"C\"}</arg_value>\n</tool_call>",
           "", 1, "get_weather", "{\"city\":\"Beijing\",\"days\":3,\"opts\":{\"unit\":\"C\"}}");
    /* a tool the request does not list: JSON where it reads as JSON, else text */
    expect(RT_CHATFMT_GLM45, NULL,
           "<tool_call>other<arg_key>a</arg_key><arg_value>true</arg_value><arg_key>b</arg_key>"
           "<arg_value>x y</arg_value></tool_call>",
           "", 1, "other", "{\"a\":true,\"b\":\"x y\"}");
    /* no arguments */
    expect(RT_CHATFMT_GLM45, NULL, "<tool_call>now\n</tool_call>", "", 1, "now", "{}");
}

static void test_mistral(void **state)
{
    (void)state;
    expect(RT_CHATFMT_MISTRAL_NEMO, NULL,
           "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"x\": 1}, \"id\": \"abcdefghi\"}, "
           "{\"name\": \"b\", \"arguments\": {}}]",
           "", 2, "a", "{\"x\":1}", "b", "{}");
    run_t r;
    split(RT_CHATFMT_MISTRAL_NEMO, NULL, "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}, \"id\": \"abcdefghi\"}]", 0, &r);
    assert_string_equal(json_string_value(json_object_get(json_array_get(r.calls, 0), "id")), "abcdefghi");
    run_free(&r);
    expect(RT_CHATFMT_MAGISTRAL, NULL,
           "Sure.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]get_time[ARGS]{}",
           "Sure.", 2, "get_weather", "{\"city\":\"Paris\"}", "get_time", "{}");
    expect(RT_CHATFMT_MAGISTRAL, NULL, "[TOOL_CALLS]f[CALL_ID]k1[ARGS]{\"a\": 2}", "", 1, "f", "{\"a\":2}");
    expect(RT_CHATFMT_MAGISTRAL, NULL, "[TOOL_CALLS] then nothing", "[TOOL_CALLS] then nothing", 0);
}

static void test_llama3(void **state)
{
    (void)state;
    expect(RT_CHATFMT_LLAMA3, NULL,
           "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", "", 1, "get_weather",
           "{\"city\":\"Paris\"}");
    expect(RT_CHATFMT_LLAMA3, NULL,
           "{\"type\": \"function\", \"name\": \"f\", \"parameters\": {}}", "", 1, "f", "{}");
    expect(RT_CHATFMT_LLAMA3, NULL, "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"q\": 1}}", "", 1,
           "f", "{\"q\":1}");
    /* code with braces is text, decided at its first word */
    expect(RT_CHATFMT_LLAMA3, NULL, "int main() { return 0; } and {\"a\": 1}",
           "int main() { return 0; } and {\"a\": 1}", 0);
}

static void test_command_r(void **state)
{
    (void)state;
    expect(RT_CHATFMT_COMMAND_R7B, NULL,
           "<|START_RESPONSE|>Looking.<|END_RESPONSE|><|START_ACTION|>[\n{\"tool_call_id\": \"0\", "
           "\"tool_name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}\n]<|END_ACTION|>",
           "Looking.", 1, "get_weather", "{\"city\":\"Paris\"}");
}

static void test_gpt_oss(void **state)
{
    (void)state;
    expect(RT_CHATFMT_GPT_OSS, NULL,
           "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>"
           "commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}",
           "", 1, "get_weather", "{\"city\":\"Paris\"}");
    run_t r;
    split(RT_CHATFMT_GPT_OSS, NULL,
          "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>"
          "Hello!",
          3, &r);
    assert_string_equal(r.reason.p, "Think.");
    assert_string_equal(r.text.p, "Hello!");
    assert_int_equal(json_array_size(r.calls), 0);
    run_free(&r);
    /* a reply without channels is content */
    split(RT_CHATFMT_GPT_OSS, NULL, "Plain words.", 2, &r);
    assert_string_equal(r.text.p, "Plain words.");
    run_free(&r);
}

/* While a call is generated, a stream sees its name first, then its arguments. */
static void test_shown_early(void **state)
{
    (void)state;
    rt_gen_tools_t t;
    rt__gen_tools_init(&t, RT_CHATFMT_DEEPSEEK_V31, NULL);
    rt_gen_buf_t text = {0};
    const char *a = DS_CALLS_BEGIN DS_CALL_BEGIN "search" DS_SEP "{\"q\": \"bl";
    assert_int_equal(rt__gen_tools_feed(&t, a, strlen(a), 0, &text), 0);
    assert_int_equal(t.n_ev, 2);
    assert_int_equal(t.ev[0].kind, RT_CALL_OPEN);
    assert_string_equal(json_string_value(t.ev[0].name), "search");
    assert_int_equal(t.ev[1].kind, RT_CALL_ARGS);
    assert_string_equal(t.ev[1].args.p, "{\"q\": \"bl");
    const char *b = "oom\"}" DS_CALL_END;
    assert_int_equal(rt__gen_tools_feed(&t, b, strlen(b), 0, &text), 0);
    assert_int_equal(t.n_ev, 1);
    assert_string_equal(t.ev[0].args.p, "oom\"}");
    assert_int_equal(json_array_size(t.calls), 1);
    assert_int_equal(text.n, 0);
    rt__gen_tools_fini(&t);
    rt__gen_buf_free(&text);
}

static void test_detect(void **state)
{
    (void)state;
    static const struct {
        const char *src;
        rt_chatfmt_t want;
    } cases[] = {
        {NULL, RT_CHATFMT_HERMES},
        {"{{ '<|im_start|>' }}", RT_CHATFMT_HERMES},
        {"<tool_call>\\n{\"name\": ...}\\n</tool_call>", RT_CHATFMT_HERMES},
        {"<tool_call>\\n<function={{ name }}>\\n<parameter=", RT_CHATFMT_QWEN3_CODER},
        {DS_CALLS_BEGIN "{{ name }}" DS_SEP, RT_CHATFMT_DEEPSEEK_V31},
        {DS_CALLS_BEGIN "function" DS_SEP "{{ name }}\\n```json", RT_CHATFMT_DEEPSEEK_R1},
        {"<|tool_calls_section_begin|>", RT_CHATFMT_KIMI_K2},
        {"<tool_call>{{ name }}<arg_key>", RT_CHATFMT_GLM45},
        {"[TOOL_CALLS][{{ calls }}]", RT_CHATFMT_MISTRAL_NEMO},
        {"[TOOL_CALLS]{{ name }}[ARGS]", RT_CHATFMT_MAGISTRAL},
        {"<|start_header_id|>ipython<|end_header_id|>", RT_CHATFMT_LLAMA3},
        {"<|START_ACTION|>", RT_CHATFMT_COMMAND_R7B},
        {"<|start|>assistant<|channel|>final<|message|>", RT_CHATFMT_GPT_OSS},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        rt_chatfmt_t f = rt_chatfmt_detect(cases[i].src);
        if (f != cases[i].want)
            fail_msg("case %zu: %s, want %s", i, rt_chatfmt_name(f), rt_chatfmt_name(cases[i].want));
    }
    for (int f = 0; f < RT_CHATFMT_N; f++) {
        assert_non_null(rt_chatfmt_markers((rt_chatfmt_t)f)[0]);
        const char *o, *c;
        rt_chatfmt_think_tags((rt_chatfmt_t)f, &o, &c);
        assert_true(o[0] && c[0]);
    }
    for (int f = 0; f < RT_CHATFMT_N; f++)
        assert_non_null(strstr(rt_chatfmt_callform((rt_chatfmt_t)f)->call, "%A"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hermes),      cmocka_unit_test(test_qwen3_coder),
        cmocka_unit_test(test_deepseek),    cmocka_unit_test(test_kimi),
        cmocka_unit_test(test_glm),         cmocka_unit_test(test_mistral),
        cmocka_unit_test(test_llama3),      cmocka_unit_test(test_command_r),
        cmocka_unit_test(test_gpt_oss),     cmocka_unit_test(test_shown_early),
        cmocka_unit_test(test_detect),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
