/* Unit tests of router/template.c: expressions, whitespace control, loops,
 * macros, filters, tests, error cases and allocation failure, one behaviour
 * per test. Expected
 * outputs are what Python's jinja2 gives with Hugging Face's settings
 * (trim_blocks, lstrip_blocks); tests/tools/test_templates.py compares whole
 * real templates against jinja2 itself. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

/* The engine is included, not linked, so that its static helpers can be tested
 * and its allocations made to fail (system headers come first, so the macros
 * below reach only the engine's own calls). */
static long alloc_budget = -1; /* allocations left before failing; -1: no limit */

static void *budget_malloc(size_t n)
{
    if (alloc_budget == 0)
        return NULL;
    if (alloc_budget > 0)
        alloc_budget--;
    return malloc(n);
}

static void *budget_calloc(size_t k, size_t n)
{
    if (alloc_budget == 0)
        return NULL;
    if (alloc_budget > 0)
        alloc_budget--;
    return calloc(k, n);
}

/* A smaller work limit than the server's, so that a test of it runs in a moment. */
#define RT_TEMPLATE_MAX_STEPS 2000000ull

#define malloc(n) budget_malloc(n)
#define calloc(k, n) budget_calloc(k, n)
#include "template.c"
#include "template_parse.c"
#undef malloc
#undef calloc

/* Compiles and renders tpl with the JSON object ctx (NULL: no variables).
 * Returns the code; on success *out is the rendered text (caller frees). */
static int render(const char *tpl, const char *ctx, char **out, bl_err_t *err)
{
    rt_template_t *t = NULL;
    json_t *c = NULL;
    *out = NULL;
    if (ctx) {
        json_error_t je;
        c = json_loads(ctx, 0, &je);
        assert_non_null(c);
    }
    int rc = rt_template_compile(tpl, strlen(tpl), &t, err);
    if (rc == 0) {
        size_t n = 0;
        rc = rt_template_render(t, c, out, &n, err);
        if (rc == 0)
            assert_int_equal(n, strlen(*out));
    }
    rt_template_destroy(t);
    json_decref(c);
    return rc;
}

static void expect(const char *tpl, const char *ctx, const char *want)
{
    bl_err_t err = {0};
    char *out = NULL;
    int rc = render(tpl, ctx, &out, &err);
    if (rc != 0)
        fail_msg("render failed (%d): %s", rc, err.msg);
    if (strcmp(out, want) != 0)
        fail_msg("template %s\n  got  [%s]\n  want [%s]", tpl, out, want);
    free(out);
}

/* Expects failure with `code` and a message containing `needle`. */
static void expect_error(const char *tpl, const char *ctx, int code, const char *needle)
{
    bl_err_t err = {0};
    char *out = NULL;
    int rc = render(tpl, ctx, &out, &err);
    free(out);
    if (rc != code)
        fail_msg("template %s: got code %d (%s), want %d", tpl, rc, err.msg, code);
    assert_int_equal(err.code, code);
    if (!strstr(err.msg, needle))
        fail_msg("message [%s] lacks [%s]", err.msg, needle);
}

// --- expressions

static void test_expr_integer_arithmetic_follows_python(void **state)
{
    (void)state;
    expect("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 3 - 5 * 2 }}", NULL,
           "3 -4 2 1024 -7");
    /* powers by squaring: a huge exponent of 0, 1 or -1 is immediate; past int64 is
     * refused; the last power below the bound is exact */
    expect("{{ 0 ** 10444444444444 }} {{ 1 ** 9223372036854775807 }} {{ (-1) ** 10444444444445 }} "
           "{{ 3 ** 0 }} {{ (-2) ** 63 }} {{ 3 ** 39 }}",
           NULL, "0 1 -1 1 -9223372036854775808 4052555153018976267");
    expect_error("{{ 2 ** 63 }}", NULL, RT_ERENDER, "integer overflow");
    expect_error("{{ 10 ** 1000000000000 }}", NULL, RT_ERENDER, "integer overflow");
}

static void test_expr_huge_floats_as_integers_saturate(void **state)
{
    (void)state;
    /* where an integer is wanted, a float past int64 saturates instead of undefined
     * behaviour: an index out of range, a repeat past the limits */
    bl_err_t err = {0};
    char *out = NULL;
    static const char *const tpls[] = {
        "{{ [1, 2][1e300] }}", "{{ [1, 2][-1e300] }}", "{{ 'ab'[1e300] }}",
        "{{ (1e300) | int }}", "{{ range(1e300) | length }}", "{{ '%d' % 1e300 }}",
        "{{ -(1e300) }}", "{{ [1][0.0 / 0.0] if false else 1 }}",
    };
    for (size_t i = 0; i < sizeof tpls / sizeof *tpls; i++) {
        (void)render(tpls[i], NULL, &out, &err);
        free(out);
        out = NULL;
    }
}

static void test_string_escapes_past_unicode_are_refused(void **state)
{
    (void)state;
    expect("{{ '\\U0001F600\\x41\\u00e9' }}", NULL, "\xF0\x9F\x98\x80" "A" "\xC3\xA9");
    bl_err_t err = {0};
    char *out = NULL;
    assert_int_equal(render("{{ '\\UFFFFFFFF' }}", NULL, &out, &err), RT_ESYNTAX);
    assert_non_null(strstr(err.msg, "past U+10FFFF"));
    assert_int_equal(render("{{ '\\U00110000' }}", NULL, &out, &err), RT_ESYNTAX);
}

static void test_expr_division_gives_float(void **state)
{
    (void)state;
    expect("{{ 7 / 2 }} {{ 4 / 2 }} {{ 0.1 + 0.2 }}", NULL, "3.5 2.0 0.30000000000000004");
}

static void test_expr_float_repr_switches_to_exponent(void **state)
{
    (void)state;
    expect("{{ 1e16 }} {{ 1e15 }} {{ 0.0001 }} {{ 0.00001 }} {{ 1.5e-7 }}", NULL,
           "1e+16 1000000000000000.0 0.0001 1e-05 1.5e-07");
}

static void test_expr_tilde_concatenates_as_strings(void **state)
{
    (void)state;
    expect("{{ 'a' ~ 1 ~ none ~ true ~ nope }}", NULL, "a1NoneTrue");
}

static void test_expr_comparison_chains(void **state)
{
    (void)state;
    expect("{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 1 == 1.0 }} {{ true == 1 }}", NULL,
           "True False True True");
}

static void test_expr_in_and_not_in(void **state)
{
    (void)state;
    expect("{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [1] }}", NULL,
           "True True True True");
}

static void test_expr_and_or_return_an_operand(void **state)
{
    (void)state;
    expect("{{ 0 or 'x' }} {{ 'a' and 'b' }} {{ '' and 'b' }}|{{ not [] }}", NULL, "x b |True");
}

static void test_expr_inline_if_without_else_is_undefined(void **state)
{
    (void)state;
    expect("[{{ 'y' if false }}] [{{ 'y' if true else 'n' }}]", NULL, "[] [y]");
}

static void test_expr_negative_index_and_reverse_slice(void **state)
{
    (void)state;
    expect("{{ xs[-1] }} {{ xs[::-1] }} {{ xs[1:] }} {{ 'abc'[::-1] }}", "{\"xs\": [1, 2, 3]}",
           "3 [3, 2, 1] [2, 3] cba");
}

static void test_expr_string_slices_count_code_points(void **state)
{
    (void)state;
    expect("{{ s[1:3] }} {{ s | length }} {{ s[-1] }}", "{\"s\": \"h\\u00e9llo\\u4e16\"}",
           "\xc3\xa9l 6 \xe4\xb8\x96");
}

static void test_expr_attribute_and_item_reach_dict_keys(void **state)
{
    (void)state;
    expect("{{ m.role }} {{ m['content'] }} {{ m.missing is defined }}",
           "{\"m\": {\"role\": \"user\", \"content\": \"hi\"}}", "user hi False");
}

static void test_expr_dict_literal_keeps_insertion_order(void **state)
{
    (void)state;
    expect("{{ {'b': 1, 'a': [true, none]} }}", NULL, "{'b': 1, 'a': [True, None]}");
}

static void test_expr_string_repr_picks_quotes_like_python(void **state)
{
    (void)state;
    expect("{{ [\"it's\", 'say \"hi\"', 'a\\nb'] }}", NULL, "[\"it's\", 'say \"hi\"', 'a\\nb']");
}

static void test_expr_method_calls_with_keywords(void **state)
{
    (void)state;
    expect("{{ 'a b  c'.split() }} {{ 'a,b,c'.split(',', 1) }} {{ 'xxhixx'.strip('x') }} "
           "{{ d.get('k', 'none') }} {{ '{}-{n}'.format(1, n=2) }}",
           "{\"d\": {}}", "['a', 'b', 'c'] ['a', 'b,c'] hi none 1-2");
}

// --- whitespace control

static void test_ws_trim_blocks_drops_newline_after_tag(void **state)
{
    (void)state;
    expect("{% if true %}\nx\n{% endif %}\ny", NULL, "x\ny");
}

static void test_ws_lstrip_blocks_drops_indent_before_tag(void **state)
{
    (void)state;
    expect("a\n    {% if true %}\n    b\n    {% endif %}\nc", NULL, "a\n    b\nc");
}

static void test_ws_minus_strips_all_whitespace_around(void **state)
{
    (void)state;
    expect("a  \n  {{- 'x' -}}  \n  b", NULL, "axb");
}

static void test_ws_plus_keeps_indent(void **state)
{
    (void)state;
    expect("a\n  {%+ if true %}x{% endif %}", NULL, "a\n  x");
}

static void test_ws_lstrip_does_not_touch_print_tags(void **state)
{
    (void)state;
    expect("a\n  {{ 'x' }}\n", NULL, "a\n  x");
}

static void test_ws_comment_is_trimmed_like_a_block(void **state)
{
    (void)state;
    expect("a\n  {# note #}\nb", NULL, "a\nb");
}

static void test_ws_one_trailing_newline_is_dropped(void **state)
{
    (void)state;
    expect("x\n\n", NULL, "x\n");
}

static void test_ws_crlf_becomes_lf(void **state)
{
    (void)state;
    expect("a\r\nb\rc", NULL, "a\nb\nc");
}

// --- loops, scoping, macros

static void test_loop_variables(void **state)
{
    (void)state;
    expect("{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}"
           "{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}",
           "{\"xs\": [\"a\", \"b\"]}", "102TrueFalse2;211FalseTrue2;");
}

static void test_loop_previtem_and_nextitem(void **state)
{
    (void)state;
    expect("{% for x in [1, 2, 3] %}({{ loop.previtem }},{{ loop.nextitem }}){% endfor %}", NULL,
           "(,2)(1,3)(2,)");
}

static void test_loop_filter_counts_kept_items(void **state)
{
    (void)state;
    expect("{% for x in [1, 2, 3, 4] if x is even %}{{ x }}/{{ loop.length }} {% endfor %}", NULL,
           "2/2 4/2 ");
}

static void test_loop_else_runs_when_empty(void **state)
{
    (void)state;
    expect("{% for x in [] %}x{% else %}empty{% endfor %}", NULL, "empty");
}

static void test_loop_break_and_continue(void **state)
{
    (void)state;
    expect("{% for x in range(10) %}{% if x == 1 %}{% continue %}{% endif %}"
           "{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}",
           NULL, "023");
}

static void test_loop_unpacks_items(void **state)
{
    (void)state;
    expect("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}",
           "{\"d\": {\"z\": 1, \"a\": 2}}", "z=1;a=2;");
}

static void test_loop_set_does_not_leak_out(void **state)
{
    (void)state;
    expect("{% set y = 0 %}{% for x in [1, 2] %}{% set y = x %}{% endfor %}{{ y }}", NULL, "0");
}

static void test_loop_namespace_carries_state(void **state)
{
    (void)state;
    expect("{% set ns = namespace(n=0) %}{% for x in [1, 2, 3] %}{% set ns.n = ns.n + x %}"
           "{% endfor %}{{ ns.n }}",
           NULL, "6");
}

static void test_macro_defaults_and_keywords(void **state)
{
    (void)state;
    expect("{% macro m(a, b='B', c=none) %}[{{ a }}{{ b }}{{ c }}]{% endmacro %}"
           "{{ m(1) }}{{ m(1, c=3) }}{{ m(a=2, b=4) }}",
           NULL, "[1BNone][1B3][24None]");
}

static void test_macro_caller_renders_call_body(void **state)
{
    (void)state;
    expect("{% macro w(t) %}<{{ t }}>{{ caller() }}</{{ t }}>{% endmacro %}"
           "{% call w('b') %}in{% endcall %}",
           NULL, "<b>in</b>");
}

static void test_set_block_captures_output(void **state)
{
    (void)state;
    expect("{% set b %}x{{ 1 + 1 }}{% endset %}[{{ b }}]", NULL, "[x2]");
}

static void test_with_binds_in_a_new_scope(void **state)
{
    (void)state;
    expect("{% set a = 5 %}{% with a = 1, b = a %}{{ a }}{{ b }}{% endwith %}{{ a }}", NULL, "155");
}

static void test_generation_tag_renders_body(void **state)
{
    (void)state;
    expect("{% generation %}gen{% endgeneration %}", NULL, "gen");
}

// --- filters

static void test_filter_tojson_uses_python_separators(void **state)
{
    (void)state;
    expect("{{ d | tojson }}", "{\"d\": {\"a\": [1, 2.5, null, true], \"b\": {}}}",
           "{\"a\": [1, 2.5, null, true], \"b\": {}}");
}

static void test_filter_tojson_indent(void **state)
{
    (void)state;
    expect("{{ d | tojson(indent=2) }}", "{\"d\": {\"a\": [1], \"b\": []}}",
           "{\n  \"a\": [\n    1\n  ],\n  \"b\": []\n}");
}

static void test_filter_tojson_keeps_html_and_unicode(void **state)
{
    (void)state;
    expect("{{ '<&>\\'\u00e9\n' | tojson }}", NULL, "\"<&>'\xc3\xa9\\n\"");
}

static void test_filter_tojson_ensure_ascii_and_sort_keys(void **state)
{
    (void)state;
    expect("{{ {'b': '\u00e9', 'a': 1} | tojson(ensure_ascii=true, sort_keys=true) }}", NULL,
           "{\"a\": 1, \"b\": \"\\u00e9\"}");
}

static void test_filter_tojson_of_undefined_fails(void **state)
{
    (void)state;
    expect_error("\n{{ nope | tojson }}", NULL, RT_ERENDER, "line 2");
}

static void test_filter_default_and_boolean_mode(void **state)
{
    (void)state;
    expect("{{ nope | default('d') }} {{ none | default('d') }} {{ '' | default('d', true) }}", NULL,
           "d None d");
}

static void test_filter_selectattr_and_map(void **state)
{
    (void)state;
    expect("{{ ps | selectattr('age', 'gt', 20) | map(attribute='name') | join(',') }}",
           "{\"ps\": [{\"name\": \"a\", \"age\": 30}, {\"name\": \"b\", \"age\": 3},"
           " {\"name\": \"c\", \"age\": 40}]}",
           "a,c");
}

/* Python prints a generator with its address; a prompt must not carry one (it would
 * differ on every render, defeating the prompt cache, and show a heap address). */
static void test_filter_map_generator_prints_no_address(void **state)
{
    (void)state;
    expect("{{ xs | map('upper') }}|{{ xs | select }}", "{\"xs\": [\"a\"]}",
           "<generator object>|<generator object>");
}

/* Nested loops over what the client sends are quadratic in it; a render that does
 * more work than the limit is refused instead of running on. */
static void test_limit_steps_stop_a_quadratic_render(void **state)
{
    (void)state;
    expect_error("{% for i in range(3000) %}{% for j in range(3000) %}{% endfor %}{% endfor %}x",
                 NULL, RT_ELIMIT, "steps");
    expect_error("{% for m in range(3000) if m in range(3000) %}{% endfor %}", NULL, RT_ELIMIT,
                 "steps");
    expect("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}x", NULL,
           "x");
}

/* A sort of the client's data may be long: it must fit the work limit (a quadratic
 * sort of 3000 reversed items takes 4.5 million comparisons), and keep equal keys in
 * their order both ways, as Python does. */
static void test_filter_sort_of_a_long_list_fits_the_step_limit(void **state)
{
    (void)state;
    expect("{{ range(3000) | reverse | sort | first }} {{ range(3000) | sort(reverse=true) | first }}",
           NULL, "0 2999");
    expect("{% set xs = [{'k': 1, 'v': 'a'}, {'k': 0, 'v': 'b'}, {'k': 1, 'v': 'c'}, {'k': 0, 'v': 'd'}] %}"
           "{{ xs | sort(attribute='k') | map(attribute='v') | join }} "
           "{{ xs | sort(attribute='k', reverse=true) | map(attribute='v') | join }}",
           NULL, "bdac acbd");
}

static void test_filter_select_on_none_is_empty(void **state)
{
    (void)state;
    expect("{{ none | selectattr('x') | list }}", NULL, "[]");
}

static void test_filter_trim_join_upper(void **state)
{
    (void)state;
    expect("{{ '  a b  ' | trim | upper }}|{{ [1, 'x'] | join('-') }}", NULL, "A B|1-x");
}

static void test_filter_dictsort_and_items(void **state)
{
    (void)state;
    expect("{{ d | dictsort }} {{ d | items | list }}", "{\"d\": {\"b\": 1, \"A\": 2}}",
           "[('A', 2), ('b', 1)] [('b', 1), ('A', 2)]");
}

static void test_filter_indent_skips_first_line_and_blank_lines(void **state)
{
    (void)state;
    expect("{{ 'a\nb\n\nc' | indent(2) }}", NULL, "a\n  b\n\n  c");
}

static void test_filter_unique_sort_reverse(void **state)
{
    (void)state;
    expect("{{ ['b', 'A', 'a'] | unique | list }} {{ [3, 1, 2] | sort }} {{ [1, 2] | reverse | list }}",
           NULL, "['b', 'A'] [1, 2, 3] [2, 1]");
}

static void test_filter_numbers(void **state)
{
    (void)state;
    expect("{{ '42' | int }} {{ 'x' | int(7) }} {{ '2.5' | float }} {{ -3 | abs }} "
           "{{ 2.567 | round(2) }} {{ 2.5 | round }}",
           NULL, "42 7 2.5 3 2.57 2.0");
}

static void test_filter_safe_string_escapes_plain_side_of_plus(void **state)
{
    (void)state;
    expect("{{ 'a'|safe + '<b>' }}", NULL, "a&lt;b&gt;");
}

// --- tests

static void test_tests_types(void **state)
{
    (void)state;
    expect("{{ d is mapping }} {{ ns is mapping }} {{ xs is sequence }} {{ 's' is string }} "
           "{{ 1 is number }} {{ true is integer }} {{ none is none }} {{ nope is defined }}",
           "{\"d\": {}, \"xs\": []}", "True False True True True False True False");
}

static void test_tests_with_arguments(void **state)
{
    (void)state;
    expect("{{ 4 is divisibleby 2 }} {{ 'a' is in ['a'] }} {{ 1 is eq 1 }} {{ 2 is gt 1 }}", NULL,
           "True True True True");
}

// --- errors

static void test_error_unclosed_block_names_its_line(void **state)
{
    (void)state;
    expect_error("a\n{% if x %}\nb", NULL, RT_ESYNTAX, "line 2");
}

static void test_error_unclosed_tag_names_its_line(void **state)
{
    (void)state;
    expect_error("a\n\n{{ x ", NULL, RT_ESYNTAX, "line 3");
}

static void test_error_unknown_filter_is_a_syntax_error(void **state)
{
    (void)state;
    expect_error("x\n{{ y | frobnicate }}", NULL, RT_ESYNTAX, "frobnicate");
}

static void test_error_unknown_filter_inside_if_fails_only_when_run(void **state)
{
    (void)state;
    expect("{% if false %}{{ y | frobnicate }}{% endif %}ok", NULL, "ok");
    expect_error("{% if true %}\n{{ y | frobnicate }}{% endif %}", NULL, RT_ERENDER, "line 2");
}

static void test_error_known_but_unimplemented_filter_fails_when_run(void **state)
{
    (void)state;
    expect("{% if false %}{{ s | truncate(2) }}{% endif %}ok", NULL, "ok");
    expect_error("\n{{ 'abcdef' | truncate(2) }}", NULL, BL_ENOTSUP, "truncate");
}

static void test_error_bad_expression(void **state)
{
    (void)state;
    expect_error("{{ 1 + }}", NULL, RT_ESYNTAX, "line 1:");
}

static void test_error_break_outside_loop(void **state)
{
    (void)state;
    expect_error("{% break %}", NULL, RT_ESYNTAX, "outside");
}

static void test_error_attribute_of_undefined(void **state)
{
    (void)state;
    expect_error("\n\n{{ nope.x }}", NULL, RT_ERENDER, "line 3");
}

static void test_error_raise_exception_carries_message(void **state)
{
    (void)state;
    expect_error("{{ raise_exception('roles must alternate') }}", NULL, RT_ERAISED,
                 "roles must alternate");
}

static void test_error_list_append_is_refused_by_sandbox(void **state)
{
    (void)state;
    expect_error("{% set xs = [] %}{% set _ = xs.append(1) %}", NULL, RT_ERENDER, "unsafe");
}

static void test_error_runaway_recursion_is_bounded(void **state)
{
    (void)state;
    expect_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, RT_ELIMIT,
                 "nested deeper");
}

static void test_error_deep_parse_nesting_is_bounded(void **state)
{
    (void)state;
    size_t n = 100000;
    char *t = malloc(2 * n + 16);
    assert_non_null(t);
    size_t k = 0;
    memcpy(t, "{{ ", 3);
    k = 3;
    memset(t + k, '(', n / 2);
    k += n / 2;
    t[k++] = '1';
    memset(t + k, ')', n / 2);
    k += n / 2;
    strcpy(t + k, " }}");
    expect_error(t, NULL, RT_ELIMIT, "nesting");
    free(t);
}

static void test_error_runaway_output_is_bounded(void **state)
{
    (void)state;
    expect_error("{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(40) %}"
                 "{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                 NULL, RT_ELIMIT, "exceeds");
}

/* Repeating nothing any number of times is nothing, at once (the count is not
 * walked); repeating something past the limits is refused, however large the count. */
static void test_repetition_counts_are_bounded(void **state)
{
    (void)state;
    expect("{{ ((1, 2)|list * 0 * 444888888888888888)|length }}|{{ '' * 9000000000000000000 }}|"
           "{{ [] * 9000000000000000000 }}", NULL, "0||[]");
    expect_error("{{ 'ab' * 9000000000000000000 }}", NULL, RT_ELIMIT, "exceeds");
    expect_error("{{ [1, 2] * 9000000000000000000 }}", NULL, RT_ELIMIT, "exceeds");
}

static void test_error_context_must_be_an_object(void **state)
{
    (void)state;
    rt_template_t *t = NULL;
    bl_err_t err = {0};
    assert_int_equal(rt_template_compile("x", 1, &t, &err), 0);
    json_t *arr = json_array();
    char *out = NULL;
    assert_int_equal(rt_template_render(t, arr, &out, NULL, &err), BL_EINVAL);
    assert_null(out);
    json_decref(arr);
    rt_template_destroy(t);
}

static void test_float_repr_matches_python(void **state)
{
    (void)state;
    static const struct { double d; const char *py; } cases[] = {
        {0.0, "0.0"}, {-0.0, "-0.0"}, {1.0, "1.0"}, {0.1, "0.1"}, {1.0 / 3, "0.3333333333333333"},
        {123456789.125, "123456789.125"}, {1e16, "1e+16"}, {9999999999999998.0, "9999999999999998.0"},
        {1e-4, "0.0001"}, {1.5e-5, "1.5e-05"}, {2.5e300, "2.5e+300"}, {-7.25, "-7.25"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char buf[64];
        fmt_float(buf, sizeof buf, cases[i].d, false);
        assert_string_equal(buf, cases[i].py);
    }
}

/* Every allocation in turn fails: the result is BL_ENOMEM or success, never a
 * crash or a leak (the sanitizer build checks leaks). */
static void test_allocation_failure_is_reported(void **state)
{
    (void)state;
    const char *src = "{%- set ns = namespace(n=0) -%}{% macro m(x) %}<{{ x | tojson }}>{% endmacro %}"
                      "{%- for msg in messages %}{% set ns.n = ns.n + 1 %}{{ m(msg) }}"
                      "{{ msg.content.split(' ') | join('_') }}{% endfor %}{{ ns.n }}";
    json_t *c = json_loads("{\"messages\": [{\"role\": \"user\", \"content\": \"a b c\"},"
                           " {\"role\": \"assistant\", \"content\": \"d e\"}]}", 0, NULL);
    assert_non_null(c);
    bool succeeded = false;
    for (long budget = 0; budget < 200 && !succeeded; budget++) {
        rt_template_t *t = NULL;
        char *out = NULL;
        bl_err_t err = {0};
        alloc_budget = budget;
        int rc = rt_template_compile(src, strlen(src), &t, &err);
        if (rc == 0)
            rc = rt_template_render(t, c, &out, NULL, &err);
        alloc_budget = -1;
        if (rc == 0) {
            assert_non_null(strstr(out, "a_b_c"));
            succeeded = true;
        } else {
            assert_int_equal(rc, BL_ENOMEM);
            assert_int_equal(err.code, BL_ENOMEM);
            assert_null(out);
        }
        free(out);
        rt_template_destroy(t);
    }
    assert_true(succeeded);
    json_decref(c);
}

static void test_template_renders_twice_the_same(void **state)
{
    (void)state;
    const char *src = "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
                      "{{ m.content }}{% endfor %}{{ ns.n }}";
    rt_template_t *t = NULL;
    bl_err_t err = {0};
    assert_int_equal(rt_template_compile(src, strlen(src), &t, &err), 0);
    json_t *c = json_loads("{\"messages\": [{\"content\": \"a\"}, {\"content\": \"b\"}]}", 0, NULL);
    for (int i = 0; i < 2; i++) {
        char *out = NULL;
        assert_int_equal(rt_template_render(t, c, &out, NULL, &err), 0);
        assert_string_equal(out, "ab2");
        free(out);
    }
    json_decref(c);
    rt_template_destroy(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_expr_integer_arithmetic_follows_python),
        cmocka_unit_test(test_repetition_counts_are_bounded),
        cmocka_unit_test(test_expr_huge_floats_as_integers_saturate),
        cmocka_unit_test(test_string_escapes_past_unicode_are_refused),
        cmocka_unit_test(test_expr_division_gives_float),
        cmocka_unit_test(test_expr_float_repr_switches_to_exponent),
        cmocka_unit_test(test_expr_tilde_concatenates_as_strings),
        cmocka_unit_test(test_expr_comparison_chains),
        cmocka_unit_test(test_expr_in_and_not_in),
        cmocka_unit_test(test_expr_and_or_return_an_operand),
        cmocka_unit_test(test_expr_inline_if_without_else_is_undefined),
        cmocka_unit_test(test_expr_negative_index_and_reverse_slice),
        cmocka_unit_test(test_expr_string_slices_count_code_points),
        cmocka_unit_test(test_expr_attribute_and_item_reach_dict_keys),
        cmocka_unit_test(test_expr_dict_literal_keeps_insertion_order),
        cmocka_unit_test(test_expr_string_repr_picks_quotes_like_python),
        cmocka_unit_test(test_expr_method_calls_with_keywords),
        cmocka_unit_test(test_ws_trim_blocks_drops_newline_after_tag),
        cmocka_unit_test(test_ws_lstrip_blocks_drops_indent_before_tag),
        cmocka_unit_test(test_ws_minus_strips_all_whitespace_around),
        cmocka_unit_test(test_ws_plus_keeps_indent),
        cmocka_unit_test(test_ws_lstrip_does_not_touch_print_tags),
        cmocka_unit_test(test_ws_comment_is_trimmed_like_a_block),
        cmocka_unit_test(test_ws_one_trailing_newline_is_dropped),
        cmocka_unit_test(test_ws_crlf_becomes_lf),
        cmocka_unit_test(test_loop_variables),
        cmocka_unit_test(test_loop_previtem_and_nextitem),
        cmocka_unit_test(test_loop_filter_counts_kept_items),
        cmocka_unit_test(test_loop_else_runs_when_empty),
        cmocka_unit_test(test_loop_break_and_continue),
        cmocka_unit_test(test_loop_unpacks_items),
        cmocka_unit_test(test_loop_set_does_not_leak_out),
        cmocka_unit_test(test_loop_namespace_carries_state),
        cmocka_unit_test(test_macro_defaults_and_keywords),
        cmocka_unit_test(test_macro_caller_renders_call_body),
        cmocka_unit_test(test_set_block_captures_output),
        cmocka_unit_test(test_with_binds_in_a_new_scope),
        cmocka_unit_test(test_generation_tag_renders_body),
        cmocka_unit_test(test_filter_tojson_uses_python_separators),
        cmocka_unit_test(test_filter_tojson_indent),
        cmocka_unit_test(test_filter_tojson_keeps_html_and_unicode),
        cmocka_unit_test(test_filter_tojson_ensure_ascii_and_sort_keys),
        cmocka_unit_test(test_filter_tojson_of_undefined_fails),
        cmocka_unit_test(test_filter_default_and_boolean_mode),
        cmocka_unit_test(test_filter_selectattr_and_map),
        cmocka_unit_test(test_filter_select_on_none_is_empty),
        cmocka_unit_test(test_filter_map_generator_prints_no_address),
        cmocka_unit_test(test_limit_steps_stop_a_quadratic_render),
        cmocka_unit_test(test_filter_sort_of_a_long_list_fits_the_step_limit),
        cmocka_unit_test(test_filter_trim_join_upper),
        cmocka_unit_test(test_filter_dictsort_and_items),
        cmocka_unit_test(test_filter_indent_skips_first_line_and_blank_lines),
        cmocka_unit_test(test_filter_unique_sort_reverse),
        cmocka_unit_test(test_filter_numbers),
        cmocka_unit_test(test_filter_safe_string_escapes_plain_side_of_plus),
        cmocka_unit_test(test_tests_types),
        cmocka_unit_test(test_tests_with_arguments),
        cmocka_unit_test(test_error_unclosed_block_names_its_line),
        cmocka_unit_test(test_error_unclosed_tag_names_its_line),
        cmocka_unit_test(test_error_unknown_filter_is_a_syntax_error),
        cmocka_unit_test(test_error_unknown_filter_inside_if_fails_only_when_run),
        cmocka_unit_test(test_error_known_but_unimplemented_filter_fails_when_run),
        cmocka_unit_test(test_error_bad_expression),
        cmocka_unit_test(test_error_break_outside_loop),
        cmocka_unit_test(test_error_attribute_of_undefined),
        cmocka_unit_test(test_error_raise_exception_carries_message),
        cmocka_unit_test(test_error_list_append_is_refused_by_sandbox),
        cmocka_unit_test(test_error_runaway_recursion_is_bounded),
        cmocka_unit_test(test_error_deep_parse_nesting_is_bounded),
        cmocka_unit_test(test_error_runaway_output_is_bounded),
        cmocka_unit_test(test_error_context_must_be_an_object),
        cmocka_unit_test(test_float_repr_matches_python),
        cmocka_unit_test(test_allocation_failure_is_reported),
        cmocka_unit_test(test_template_renders_twice_the_same),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
