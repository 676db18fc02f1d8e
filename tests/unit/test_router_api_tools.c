/* Tests of router/api_tools.c's forced tool calls (rt__gen_force_tools): the grammar
 * that makes a reply one of the tools' calls, its parameters' $ref and $defs, and the
 * refusal that names the tool. The grammars are run with router/grammar.c's matcher
 * on whole call texts. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_gen_impl.h"
#include "grammar.h"

static json_t *J(const char *text)
{
    json_error_t e;
    json_t *j = json_loads(text, 0, &e);
    if (!j)
        fail_msg("bad test JSON: %s: %s", e.text, text);
    return j;
}

/* rt__gen_force_tools over tools (OpenAI's form, as text), no thought, one call. */
static int force(const char *tools, const char *name, rt_gen_params_t *p, bl_err_t *err)
{
    memset(p, 0, sizeof *p);
    json_t *t = J(tools);
    int rc = rt__gen_force_tools(p, t, name, 1, 0, err);
    json_decref(t);
    return rc;
}

/* 1 when p's grammar takes text whole. */
static int accepts(const rt_gen_params_t *p, const char *text)
{
    rt_grammar_t *g = NULL;
    rt_grammar_match_t *m = NULL;
    bl_err_t err = {0};
    if (rt_grammar_parse(&g, p->grammar, strlen(p->grammar), &err))
        fail_msg("the grammar does not compile: %s\n%s", err.msg, p->grammar);
    assert_int_equal(rt_grammar_match_create(&m, g, &err), 0);
    int ok = rt_grammar_match_feed(m, text, strlen(text)) == 0 && rt_grammar_match_done(m);
    rt_grammar_match_destroy(m);
    rt_grammar_destroy(g);
    return ok;
}

#define WEATHER_DEFS                                                                       \
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {"   \
    "\"$defs\": {\"place\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": "    \
    "\"string\"}}, \"required\": [\"city\"], \"additionalProperties\": false}, \"unit\": "   \
    "{\"enum\": [\"c\", \"f\"]}}, \"type\": \"object\", \"properties\": {\"place\": "         \
    "{\"$ref\": \"#/$defs/place\"}, \"unit\": {\"$ref\": \"#/$defs/unit\"}}, "               \
    "\"required\": [\"place\", \"unit\"], \"additionalProperties\": false}}}]"

static void test_force_tools_reads_each_tools_own_defs(void **state)
{
    (void)state;
    rt_gen_params_t p;
    bl_err_t err = {0};
    if (force(WEATHER_DEFS, NULL, &p, &err))
        fail_msg("refused: %s", err.msg);
    assert_true(accepts(&p, "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"place\": "
                            "{\"city\": \"Paris\"}, \"unit\": \"c\"}}</tool_call>"));
    assert_false(accepts(&p, "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"place\": "
                             "{\"city\": \"Paris\"}, \"unit\": \"k\"}}</tool_call>"));
    rt__gen_params_fini(&p);
}

static void test_force_tools_keeps_two_tools_defs_apart(void **state)
{
    (void)state;
    rt_gen_params_t p;
    bl_err_t err = {0};
    const char *tools =
        "[{\"type\": \"function\", \"function\": {\"name\": \"a\", \"parameters\": {\"$defs\": "
        "{\"u\": {\"enum\": [\"c\"]}}, \"type\": \"object\", \"properties\": {\"u\": {\"$ref\": "
        "\"#/$defs/u\"}}, \"required\": [\"u\"]}}},"
        " {\"type\": \"function\", \"function\": {\"name\": \"b\", \"parameters\": "
        "{\"definitions\": {\"u\": {\"enum\": [\"k\"]}}, \"type\": \"object\", \"properties\": "
        "{\"u\": {\"$ref\": \"#/definitions/u\"}}, \"required\": [\"u\"]}}}]";
    if (force(tools, NULL, &p, &err))
        fail_msg("refused: %s", err.msg);
    assert_true(accepts(&p, "<tool_call>{\"name\": \"a\", \"arguments\": {\"u\": \"c\"}}</tool_call>"));
    assert_true(accepts(&p, "<tool_call>{\"name\": \"b\", \"arguments\": {\"u\": \"k\"}}</tool_call>"));
    assert_false(accepts(&p, "<tool_call>{\"name\": \"a\", \"arguments\": {\"u\": \"k\"}}</tool_call>"));
    assert_false(accepts(&p, "<tool_call>{\"name\": \"b\", \"arguments\": {\"u\": \"c\"}}</tool_call>"));
    rt__gen_params_fini(&p);
}

static void test_force_tools_follows_a_ref_to_the_parameters_root(void **state)
{
    (void)state;
    rt_gen_params_t p;
    bl_err_t err = {0};
    const char *tools =
        "[{\"type\": \"function\", \"function\": {\"name\": \"tree\", \"parameters\": {\"type\": "
        "\"object\", \"properties\": {\"kids\": {\"type\": \"array\", \"items\": {\"$ref\": "
        "\"#\"}}}, \"additionalProperties\": false}}}]";
    if (force(tools, NULL, &p, &err))
        fail_msg("refused: %s", err.msg);
    assert_true(accepts(&p, "<tool_call>{\"name\": \"tree\", \"arguments\": {\"kids\": [{\"kids\": "
                            "[]}, {}]}}</tool_call>"));
    assert_false(accepts(&p, "<tool_call>{\"name\": \"tree\", \"arguments\": {\"kids\": [{\"x\": "
                             "1}]}}</tool_call>"));
    rt__gen_params_fini(&p);
}

static void test_force_tools_leaves_refs_in_data_alone(void **state)
{
    (void)state;
    rt_gen_params_t p;
    bl_err_t err = {0};
    const char *tools =
        "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": "
        "\"object\", \"properties\": {\"c\": {\"const\": {\"$ref\": \"#/$defs/x\"}}, \"$ref\": "
        "{\"type\": \"integer\"}}, \"required\": [\"c\"], \"additionalProperties\": false}}}]";
    if (force(tools, NULL, &p, &err))
        fail_msg("refused: %s", err.msg);
    assert_true(accepts(&p, "<tool_call>{\"name\": \"f\", \"arguments\": {\"c\": {\"$ref\": "
                            "\"#/$defs/x\"}, \"$ref\": 3}}</tool_call>"));
    rt__gen_params_fini(&p);
}

static void test_force_tools_refusal_names_the_tool(void **state)
{
    (void)state;
    rt_gen_params_t p;
    bl_err_t err = {0};
    const char *tools =
        "[{\"type\": \"function\", \"function\": {\"name\": \"ok\"}},"
        " {\"type\": \"function\", \"function\": {\"name\": \"bad\", \"parameters\": {\"type\": "
        "\"object\", \"properties\": {\"x\": {\"not\": {}}}}}}]";
    assert_int_equal(force(tools, NULL, &p, &err), BL_EINVAL);
    const char *want = "tools[1]: the parameters: json_schema: 'not' at /properties/x";
    if (strncmp(err.msg, want, strlen(want)))
        fail_msg("message: %s", err.msg);
    /* forcing the other tool alone does not meet the bad one */
    assert_int_equal(force(tools, "ok", &p, &err), 0);
    rt__gen_params_fini(&p);
}

#define BAR "\xef\xbd\x9c"
#define LOW "\xe2\x96\x81"
#define DSM(x) "<" BAR x BAR ">"

#define PAINT                                                                              \
    "[{\"type\": \"function\", \"function\": {\"name\": \"paint\", \"parameters\": {"         \
    "\"type\": \"object\", \"properties\": {\"color\": {\"type\": \"string\"}, \"coats\": "  \
    "{\"type\": \"integer\"}, \"finish\": {\"type\": \"string\", \"enum\": [\"matte\", "      \
    "\"gloss\"]}}, \"required\": [\"color\", \"coats\"]}}},"                                 \
    " {\"type\": \"function\", \"function\": {\"name\": \"wait\"}}]"

/* Each format's call of paint({"color": "deep red", "coats": 2}) as its model writes
 * it; the same with a wrong argument (coats not an integer); a thought in its tags. */
static const struct {
    rt_chatfmt_t fmt;
    const char *call, *bad, *thought;
} k_calls[] = {
    {RT_CHATFMT_HERMES,
     "<tool_call>\n{\"name\": \"paint\", \"arguments\": {\"color\": \"deep red\", \"coats\": 2}}\n</tool_call>",
     "<tool_call>\n{\"name\": \"paint\", \"arguments\": {\"color\": \"deep red\", \"coats\": \"2\"}}\n</tool_call>",
     "<think>hmm</think>\n"},
    {RT_CHATFMT_QWEN3_CODER,
     "<tool_call>\n<function=paint>\n<parameter=color>\ndeep red\n</parameter>\n<parameter=coats>\n2\n"
     "</parameter>\n</function>\n</tool_call>",
     "<tool_call>\n<function=paint>\n<parameter=color>\ndeep red\n</parameter>\n<parameter=coats>\ntwo\n"
     "</parameter>\n</function>\n</tool_call>",
     "<think>a <b></think>"},
    {RT_CHATFMT_DEEPSEEK_R1,
     DSM("tool" LOW "calls" LOW "begin") DSM("tool" LOW "call" LOW "begin") "function" DSM("tool" LOW "sep")
     "paint\n```json\n{\"color\": \"deep red\", \"coats\": 2}\n```" DSM("tool" LOW "call" LOW "end")
     DSM("tool" LOW "calls" LOW "end"),
     DSM("tool" LOW "calls" LOW "begin") DSM("tool" LOW "call" LOW "begin") "function" DSM("tool" LOW "sep")
     "paint\n```json\n{\"color\": 1, \"coats\": 2}\n```" DSM("tool" LOW "call" LOW "end")
     DSM("tool" LOW "calls" LOW "end"),
     "<think>\nhmm\n</think>\n\n"},
    {RT_CHATFMT_DEEPSEEK_V31,
     DSM("tool" LOW "calls" LOW "begin") DSM("tool" LOW "call" LOW "begin") "paint" DSM("tool" LOW "sep")
     "{\"color\": \"deep red\", \"coats\": 2}" DSM("tool" LOW "call" LOW "end") DSM("tool" LOW "calls" LOW "end"),
     DSM("tool" LOW "calls" LOW "begin") DSM("tool" LOW "call" LOW "begin") "paint" DSM("tool" LOW "sep")
     "{\"coats\": 2}" DSM("tool" LOW "call" LOW "end") DSM("tool" LOW "calls" LOW "end"),
     "<think>hmm</think>"},
    {RT_CHATFMT_KIMI_K2,
     "<|tool_calls_section_begin|><|tool_call_begin|>functions.paint:0<|tool_call_argument_begin|>"
     "{\"color\": \"deep red\", \"coats\": 2}<|tool_call_end|><|tool_calls_section_end|>",
     "<|tool_calls_section_begin|><|tool_call_begin|>functions.paint<|tool_call_argument_begin|>"
     "{\"color\": \"deep red\", \"coats\": 2}<|tool_call_end|><|tool_calls_section_end|>",
     "<think>hmm</think>"},
    {RT_CHATFMT_GLM45,
     "<tool_call>paint\n<arg_key>color</arg_key>\n<arg_value>deep red</arg_value>\n"
     "<arg_key>coats</arg_key>\n<arg_value>2</arg_value>\n</tool_call>",
     "<tool_call>paint\n<arg_key>coats</arg_key>\n<arg_value>2</arg_value>\n</tool_call>",
     "<think>hmm</think>"},
    {RT_CHATFMT_MISTRAL_NEMO,
     "[TOOL_CALLS][{\"name\": \"paint\", \"arguments\": {\"color\": \"deep red\", \"coats\": 2}, "
     "\"id\": \"abcdefghi\"}]",
     "[TOOL_CALLS][{\"name\": \"paint\", \"arguments\": {\"color\": \"deep red\", \"coats\": 2}, "
     "\"id\": \"abc\"}]",
     "[THINK]hmm [/THINK"},
    {RT_CHATFMT_MAGISTRAL, "[TOOL_CALLS]paint[ARGS]{\"color\": \"deep red\", \"coats\": 2}",
     "[TOOL_CALLS]paint[ARGS]{\"color\": \"deep red\", \"coats\": 2.5}", "[THINK]x[/THINK]"},
    {RT_CHATFMT_LLAMA3, "{\"name\": \"paint\", \"parameters\": {\"color\": \"deep red\", \"coats\": 2}}",
     "{\"name\": \"paint\", \"arguments\": {\"color\": \"deep red\", \"coats\": 2}}", "<think>x</think>"},
    {RT_CHATFMT_COMMAND_R7B,
     "<|START_ACTION|>[{\"tool_call_id\": \"0\", \"tool_name\": \"paint\", \"parameters\": "
     "{\"color\": \"deep red\", \"coats\": 2}}]<|END_ACTION|>",
     "<|START_ACTION|>[{\"tool_call_id\": \"0\", \"tool_name\": \"paint\", \"parameters\": "
     "{\"color\": \"deep red\", \"coats\": 2}}]",
     "<|START_THINKING|>hmm<|END_THINKING|>"},
    {RT_CHATFMT_GPT_OSS,
     "<|channel|>commentary to=functions.paint <|constrain|>json<|message|>{\"color\": \"deep red\", "
     "\"coats\": 2}",
     "<|channel|>commentary to=functions.paint <|constrain|>json<|message|>{\"color\": \"deep red\"}",
     "<|channel|>analysis<|message|>A wall.<|end|><|start|>assistant"},
};

/* The calls fmt's parser finds in s. */
static json_t *parse_calls(rt_chatfmt_t fmt, const char *tools, const char *s)
{
    json_t *tl = J(tools);
    rt_gen_tools_t t;
    rt__gen_tools_init(&t, fmt, tl);
    json_decref(tl);
    rt_gen_buf_t text = {0}, reason = {0};
    if (fmt == RT_CHATFMT_GPT_OSS)
        assert_int_equal(rt__gen_harmony_feed(&t, s, strlen(s), 1, 1, &reason, &text), 0);
    else
        assert_int_equal(rt__gen_tools_feed(&t, s, strlen(s), 1, &text), 0);
    json_t *calls = t.calls ? json_incref(t.calls) : json_array();
    rt__gen_tools_fini(&t);
    rt__gen_buf_free(&text);
    rt__gen_buf_free(&reason);
    return calls;
}

static void test_force_tools_in_every_format(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof k_calls / sizeof *k_calls; i++) {
        rt_chatfmt_t f = k_calls[i].fmt;
        const char *fname = rt_chatfmt_name(f);
        rt_gen_params_t p;
        memset(&p, 0, sizeof p);
        p.fmt = f;
        bl_err_t err = {0};
        json_t *tools = J(PAINT);
        if (rt__gen_force_tools(&p, tools, NULL, 0, 1, &err))
            fail_msg("%s: refused: %s", fname, err.msg);
        if (!accepts(&p, k_calls[i].call))
            fail_msg("%s: the grammar refuses the call\n%s\n%s", fname, k_calls[i].call, p.grammar);
        if (accepts(&p, k_calls[i].bad))
            fail_msg("%s: the grammar takes a wrong call: %s", fname, k_calls[i].bad);
        char buf[2048];
        snprintf(buf, sizeof buf, "%s%s", k_calls[i].thought, k_calls[i].call);
        /* the last case's thought is not whole: refused */
        int whole_thought = f != RT_CHATFMT_MISTRAL_NEMO;
        if (accepts(&p, buf) != whole_thought)
            fail_msg("%s: a thought before the call: %s", fname, buf);
        snprintf(buf, sizeof buf, "Sure. %s", k_calls[i].call);
        if (accepts(&p, buf))
            fail_msg("%s: text before the call", fname);
        /* the parser reads what the grammar made */
        json_t *calls = parse_calls(f, PAINT, k_calls[i].call);
        json_t *c = json_object_get(json_array_get(calls, 0), "function");
        if (json_array_size(calls) != 1 ||
            strcmp(json_string_value(json_object_get(c, "name")) ?: "", "paint"))
            fail_msg("%s: parsed %zu calls", fname, json_array_size(calls));
        json_t *args = json_loads(json_string_value(json_object_get(c, "arguments")) ?: "", 0, NULL);
        json_t *want = J("{\"color\": \"deep red\", \"coats\": 2}");
        if (!json_equal(args, want))
            fail_msg("%s: arguments %s", fname, json_string_value(json_object_get(c, "arguments")));
        json_decref(args);
        json_decref(want);
        json_decref(calls);
        rt__gen_params_fini(&p);
        /* the other tool, by name; a harmony message holds one call */
        memset(&p, 0, sizeof p);
        p.fmt = f;
        assert_int_equal(rt__gen_force_tools(&p, tools, "wait", 0, 0, &err), 0);
        if (accepts(&p, k_calls[i].call))
            fail_msg("%s: forcing wait takes paint", fname);
        rt__gen_params_fini(&p);
        json_decref(tools);
    }
}

/* Key/value formats: an optional enum property as its raw values; a tool with no
 * properties takes any keys. */
static void test_force_tools_key_value_forms(void **state)
{
    (void)state;
    rt_gen_params_t p;
    memset(&p, 0, sizeof p);
    p.fmt = RT_CHATFMT_GLM45;
    bl_err_t err = {0};
    json_t *tools = J(PAINT);
    assert_int_equal(rt__gen_force_tools(&p, tools, NULL, 1, 0, &err), 0);
    static const char with[] = "<tool_call>paint\n<arg_key>color</arg_key>\n<arg_value>red</arg_value>\n"
                               "<arg_key>coats</arg_key>\n<arg_value>2</arg_value>\n<arg_key>finish"
                               "</arg_key>\n<arg_value>gloss</arg_value>\n</tool_call>";
    assert_true(accepts(&p, with));
    assert_false(accepts(&p, "<tool_call>paint\n<arg_key>color</arg_key>\n<arg_value>red</arg_value>\n"
                             "<arg_key>coats</arg_key>\n<arg_value>2</arg_value>\n<arg_key>finish"
                             "</arg_key>\n<arg_value>\"gloss\"</arg_value>\n</tool_call>"));
    assert_true(accepts(&p, "<tool_call>wait</tool_call>"));
    assert_true(accepts(&p, "<tool_call>wait<arg_key>any</arg_key><arg_value>x < y</arg_value>"
                            "</tool_call>"));
    /* one call */
    char two[1024];
    snprintf(two, sizeof two, "%s\n%s", with, with);
    assert_false(accepts(&p, two));
    json_t *calls = parse_calls(RT_CHATFMT_GLM45, PAINT, with);
    const char *a = json_string_value(json_object_get(json_object_get(json_array_get(calls, 0),
                                                                      "function"), "arguments"));
    assert_non_null(a);
    assert_non_null(strstr(a, "\"finish\":\"gloss\""));
    json_decref(calls);
    rt__gen_params_fini(&p);
    json_decref(tools);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_force_tools_reads_each_tools_own_defs),
        cmocka_unit_test(test_force_tools_keeps_two_tools_defs_apart),
        cmocka_unit_test(test_force_tools_follows_a_ref_to_the_parameters_root),
        cmocka_unit_test(test_force_tools_leaves_refs_in_data_alone),
        cmocka_unit_test(test_force_tools_refusal_names_the_tool),
        cmocka_unit_test(test_force_tools_in_every_format),
        cmocka_unit_test(test_force_tools_key_value_forms),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
