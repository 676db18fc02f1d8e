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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_force_tools_reads_each_tools_own_defs),
        cmocka_unit_test(test_force_tools_keeps_two_tools_defs_apart),
        cmocka_unit_test(test_force_tools_follows_a_ref_to_the_parameters_root),
        cmocka_unit_test(test_force_tools_leaves_refs_in_data_alone),
        cmocka_unit_test(test_force_tools_refusal_names_the_tool),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
