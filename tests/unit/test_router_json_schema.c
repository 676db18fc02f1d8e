/* Tests of router/json_schema.c: the grammar text each schema keyword produces
 * (golden strings for small schemas, rule bodies and literals for the rest), the
 * refusal of every keyword the converter cannot honour, by name and JSON path, and
 * the bounds on nesting and on the grammar's size. Most tests read the text; some run
 * the grammars on router/grammar.c, the engine, among them integer ranges checked
 * value by value and on random ranges (the seed is printed; BLOOMERY_TEST_SEED=N
 * replays it). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar.h"
#include "json_schema.h"
#include "test_seed.h"

/* The fixed rules, as the converter writes them. */
#define R_VALUE "value ::= object | array | string | number | boolean | null\n"
#define R_OBJECT                                                                              \
    "object ::= \"{\" ws ( string ws \":\" ws value ( ws \",\" ws string ws \":\" ws value )* " \
    "ws )? \"}\"\n"
#define R_ARRAY "array ::= \"[\" ws ( value ( ws \",\" ws value )* ws )? \"]\"\n"
#define R_STRING "string ::= \"\\\"\" char* \"\\\"\"\n"
#define R_CHAR                                                                             \
    "char ::= [^\"\\\\\\x00-\\x1f] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} )\n"
#define R_NUMBER "number ::= integer ( \".\" [0-9]{1,16} )? ( [eE] [+\\-]? [0-9]{1,16} )?\n"
#define R_INTEGER "integer ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} )\n"
#define R_BOOLEAN "boolean ::= \"true\" | \"false\"\n"
#define R_NULL "null ::= \"null\"\n"
#define R_WS "ws ::= [ \\t\\n]{0,20}\n"

static json_t *load(const char *text)
{
    json_error_t je;
    json_t *s = json_loads(text, JSON_DECODE_ANY, &je);
    if (!s)
        fail_msg("bad test JSON (%s): %s", je.text, text);
    return s;
}

/* The grammar of a schema that must convert. */
static char *gbnf(const char *schema)
{
    json_t *s = load(schema);
    char *g = NULL;
    bl_err_t err = {0};
    int rc = rt_json_schema_to_gbnf(s, &g, &err);
    json_decref(s);
    if (rc)
        fail_msg("rt_json_schema_to_gbnf(%s): %d %s", schema, rc, err.msg);
    assert_non_null(g);
    return g;
}

/* A schema that must be refused with code, its message holding want. */
static void refused(const char *schema, int code, const char *want)
{
    json_t *s = load(schema);
    char *g = (char *)"untouched";
    bl_err_t err = {0};
    int rc = rt_json_schema_to_gbnf(s, &g, &err);
    json_decref(s);
    if (rc != code || !strstr(err.msg, want))
        fail_msg("%s: got %d \"%s\", want %d \"%s\"", schema, rc, err.msg, code, want);
    assert_null(g);
    assert_int_equal(err.code, code);
}

/* The body of rule name in grammar g ("" when absent); a static buffer. */
static const char *rule(const char *g, const char *name)
{
    static char body[1 << 16];
    size_t n = strlen(name);
    for (const char *line = g; *line;) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        if (len > n + 5 && !strncmp(line, name, n) && !strncmp(line + n, " ::= ", 5)) {
            len -= n + 5;
            assert_true(len < sizeof body);
            memcpy(body, line + n + 5, len);
            body[len] = '\0';
            return body;
        }
        line += len + (end ? 1 : 0);
    }
    return "";
}

static void assert_has(const char *g, const char *part)
{
    if (!strstr(g, part))
        fail_msg("grammar lacks \"%s\":\n%s", part, g);
}

/* --- values and types ----------------------------------------------------------- */

static void test_json_schema_true_accepts_any_json_value(void **state)
{
    (void)state;
    char *g = gbnf("true");
    assert_string_equal(g, "root ::= value\n" R_VALUE R_OBJECT R_ARRAY R_STRING R_CHAR R_NUMBER
                               R_INTEGER R_BOOLEAN R_NULL R_WS);
    free(g);
}

static void test_json_schema_empty_schema_accepts_any_json_value(void **state)
{
    (void)state;
    char *g = gbnf("{\"title\": \"anything\"}");
    assert_string_equal(rule(g, "root"), "value");
    free(g);
}

static void test_json_schema_string_type(void **state)
{
    (void)state;
    char *g = gbnf("{\"type\": \"string\"}");
    assert_string_equal(g, "root ::= string\n" R_STRING R_CHAR);
    free(g);
}

static void test_json_schema_number_type(void **state)
{
    (void)state;
    char *g = gbnf("{\"type\": \"number\"}");
    assert_string_equal(g, "root ::= number\n" R_NUMBER R_INTEGER);
    free(g);
}

static void test_json_schema_integer_type_has_no_leading_zeros(void **state)
{
    (void)state;
    char *g = gbnf("{\"type\": \"integer\"}");
    assert_string_equal(g, "root ::= integer\n" R_INTEGER);
    free(g);
}

static void test_json_schema_boolean_and_null_types(void **state)
{
    (void)state;
    char *g = gbnf("{\"type\": \"boolean\"}");
    assert_string_equal(g, "root ::= boolean\n" R_BOOLEAN);
    free(g);
    g = gbnf("{\"type\": \"null\"}");
    assert_string_equal(g, "root ::= null\n" R_NULL);
    free(g);
}

static void test_json_schema_type_array_is_alternatives(void **state)
{
    (void)state;
    char *g = gbnf("{\"type\": [\"string\", \"null\"]}");
    assert_string_equal(rule(g, "root"), "string | null");
    free(g);
    /* every integer is a number: integer adds nothing */
    g = gbnf("{\"type\": [\"integer\", \"number\", \"boolean\"]}");
    assert_string_equal(rule(g, "root"), "number | boolean");
    free(g);
}

static void test_json_schema_annotations_are_ignored(void **state)
{
    (void)state;
    char *g = gbnf("{\"$schema\": \"https://json-schema.org/draft/2020-12/schema\", \"$id\": \"x\", "
                   "\"$comment\": \"c\", \"title\": \"t\", \"description\": \"d\", \"default\": 1, "
                   "\"examples\": [1], \"deprecated\": false, \"readOnly\": false, "
                   "\"writeOnly\": false, \"type\": \"integer\"}");
    assert_string_equal(g, "root ::= integer\n" R_INTEGER);
    free(g);
}

/* --- objects ---------------------------------------------------------------------- */

static void test_json_schema_object_with_required_and_optional_property(void **state)
{
    (void)state;
    char *g = gbnf("{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}, "
                   "\"b\": {\"type\": \"string\"}}, \"required\": [\"a\"]}");
    assert_string_equal(g, "root ::= \"{\" ws \"\\\"a\\\"\" ws \":\" ws integer ( ws \",\" ws "
                           "\"\\\"b\\\"\" ws \":\" ws string )? ws \"}\"\n" R_STRING R_CHAR
                               R_INTEGER R_WS);
    free(g);
}

static void test_json_schema_object_all_optional_allows_empty_object(void **state)
{
    (void)state;
    char *g = gbnf("{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}, "
                   "\"b\": {\"type\": \"null\"}}}");
    /* nothing, a (then maybe b), or b alone: the empty object is one choice */
    assert_string_equal(rule(g, "root"),
                        "\"{\" ws ( ( \"\\\"a\\\"\" ws \":\" ws integer ( ws \",\" ws "
                        "\"\\\"b\\\"\" ws \":\" ws null )? | \"\\\"b\\\"\" ws \":\" ws null ) "
                        "ws )? \"}\"");
    free(g);
}

static void test_json_schema_object_keeps_schema_order_around_a_later_required(void **state)
{
    (void)state;
    char *g = gbnf("{\"properties\": {\"a\": {\"type\": \"integer\"}, \"b\": {\"type\": \"null\"}, "
                   "\"c\": {\"type\": \"boolean\"}}, \"required\": [\"b\"]}");
    /* a, if present, comes first with its comma; c, if present, last */
    assert_string_equal(rule(g, "root"),
                        "\"{\" ws ( \"\\\"a\\\"\" ws \":\" ws integer ws \",\" ws )? "
                        "\"\\\"b\\\"\" ws \":\" ws null ( ws \",\" ws \"\\\"c\\\"\" ws \":\" ws "
                        "boolean )? ws \"}\"");
    free(g);
}

static void test_json_schema_object_every_required_property_is_present(void **state)
{
    (void)state;
    char *g = gbnf("{\"type\": \"object\", \"properties\": {\"x\": {\"type\": \"null\"}, "
                   "\"y\": {\"type\": \"null\"}}, \"required\": [\"y\", \"x\"]}");
    assert_string_equal(rule(g, "root"), "\"{\" ws \"\\\"x\\\"\" ws \":\" ws null ws \",\" ws "
                                         "\"\\\"y\\\"\" ws \":\" ws null ws \"}\"");
    free(g);
}

static void test_json_schema_object_many_optional_properties_chain_rest_rules(void **state)
{
    (void)state;
    char *g = gbnf("{\"properties\": {\"a\": {\"type\": \"null\"}, \"b\": {\"type\": \"null\"}, "
                   "\"c\": {\"type\": \"null\"}, \"d\": {\"type\": \"null\"}}}");
    assert_string_equal(rule(g, "root"),
                        "\"{\" ws ( ( \"\\\"a\\\"\" ws \":\" ws null rest | \"\\\"b\\\"\" ws \":\" "
                        "ws null rest-1 | \"\\\"c\\\"\" ws \":\" ws null rest-2 | \"\\\"d\\\"\" ws "
                        "\":\" ws null ) ws )? \"}\"");
    assert_string_equal(rule(g, "rest"), "( ws \",\" ws \"\\\"b\\\"\" ws \":\" ws null )? rest-1");
    assert_string_equal(rule(g, "rest-1"),
                        "( ws \",\" ws \"\\\"c\\\"\" ws \":\" ws null )? rest-2");
    assert_string_equal(rule(g, "rest-2"), "( ws \",\" ws \"\\\"d\\\"\" ws \":\" ws null )?");
    free(g);
}

static void test_json_schema_additional_properties_false_allows_no_other_key(void **state)
{
    (void)state;
    char *g = gbnf("{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"null\"}}, "
                   "\"additionalProperties\": false}");
    assert_string_equal(g, "root ::= \"{\" ws ( \"\\\"a\\\"\" ws \":\" ws null ws )? \"}\"\n" R_NULL
                               R_WS);
    free(g);
    g = gbnf("{\"type\": \"object\", \"additionalProperties\": false}");
    assert_string_equal(rule(g, "root"), "\"{\" ws \"}\"");
    free(g);
}

static void test_json_schema_additional_properties_true_adds_other_keys_after(void **state)
{
    (void)state;
    char *g = gbnf("{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"null\"}}, "
                   "\"required\": [\"a\"], \"additionalProperties\": true}");
    assert_string_equal(rule(g, "root"),
                        "\"{\" ws \"\\\"a\\\"\" ws \":\" ws null ( ws \",\" ws additional-key ws "
                        "\":\" ws value )* ws \"}\"");
    /* another key: not "a" (a string that is "a" and more, or starts otherwise) */
    assert_string_equal(rule(g, "additional-key"),
                        "\"\\\"\" ( \"\\\"\" | ( [^\"\\\\\\x00-\\x1fa] | \"\\\\\" ( [\"\\\\/bfnrt] "
                        "| \"u\" [0-9a-fA-F]{4} ) ) char* \"\\\"\" | \"a\" ( ( [^\"\\\\\\x00-\\x1f] "
                        "| \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} ) ) char* \"\\\"\" ) )");
    assert_has(g, R_VALUE);
    free(g);
}

static void test_json_schema_additional_properties_schema_types_other_values(void **state)
{
    (void)state;
    char *g = gbnf("{\"type\": \"object\", \"properties\": {\"ab\": {\"type\": \"null\"}, "
                   "\"ac\": {\"type\": \"null\"}}, \"additionalProperties\": "
                   "{\"type\": \"integer\"}}");
    assert_has(rule(g, "root"), "| additional-key ws \":\" ws integer ) ( ws \",\" ws "
                                "additional-key ws \":\" ws integer )* ws )? \"}\"");
    /* after "a": neither b nor c may end the key there */
    assert_has(rule(g, "additional-key"), "\"a\" ( \"\\\"\" | ( [^\"\\\\\\x00-\\x1fbc]");
    assert_true(strstr(g, "value ::=") == NULL);
    free(g);
}

static void test_json_schema_object_without_properties_takes_any_keys(void **state)
{
    (void)state;
    char *g = gbnf("{\"type\": \"object\"}");
    assert_string_equal(rule(g, "root"), "object");
    free(g);
    g = gbnf("{\"type\": \"object\", \"additionalProperties\": {\"type\": \"string\"}}");
    assert_string_equal(rule(g, "root"), "\"{\" ws ( string ws \":\" ws string ( ws \",\" ws "
                                         "string ws \":\" ws string )* ws )? \"}\"");
    free(g);
}

static void test_json_schema_nested_objects_get_rules_named_by_path(void **state)
{
    (void)state;
    char *g = gbnf("{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"object\", "
                   "\"properties\": {\"b\": {\"type\": \"object\", \"properties\": {\"c\": "
                   "{\"type\": \"integer\"}}, \"required\": [\"c\"]}}, \"required\": [\"b\"]}}, "
                   "\"required\": [\"a\"]}");
    assert_string_equal(rule(g, "root"), "\"{\" ws \"\\\"a\\\"\" ws \":\" ws a ws \"}\"");
    assert_string_equal(rule(g, "a"), "\"{\" ws \"\\\"b\\\"\" ws \":\" ws a-b ws \"}\"");
    assert_string_equal(rule(g, "a-b"), "\"{\" ws \"\\\"c\\\"\" ws \":\" ws integer ws \"}\"");
    free(g);
}

static void test_json_schema_rule_names_use_only_letters_digits_and_dashes(void **state)
{
    (void)state;
    char *g = gbnf("{\"properties\": {\"my_key!\": {\"properties\": {}}, \"é\": "
                   "{\"properties\": {}}, \"string\": {\"properties\": {}}}}");
    for (const char *line = g; *line; line = strchr(line, '\n') + 1) {
        size_t n = strspn(line, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-");
        assert_true(n > 0);
        assert_memory_equal(line + n, " ::= ", 5);
    }
    assert_has(g, "\n" "my-key ::= ");
    assert_has(g, "\n" "x ::= ");        /* nothing of "é" is left for a name */
    assert_has(g, "\n" "string-1 ::= "); /* "string" is the fixed rule's, used or not */
    free(g);
}

/* --- arrays ----------------------------------------------------------------------- */

static void test_json_schema_array_of_items(void **state)
{
    (void)state;
    char *g = gbnf("{\"type\": \"array\", \"items\": {\"type\": \"string\"}}");
    assert_string_equal(g, "root ::= \"[\" ws ( string ( ws \",\" ws string )* ws )? \"]\"\n" R_STRING
                               R_CHAR R_WS);
    free(g);
}

static void test_json_schema_array_without_items_takes_any_values(void **state)
{
    (void)state;
    char *g = gbnf("{\"type\": \"array\"}");
    assert_string_equal(rule(g, "root"), "array");
    free(g);
}

static void test_json_schema_array_min_and_max_items(void **state)
{
    (void)state;
    char *g = gbnf("{\"type\": \"array\", \"items\": {\"type\": \"integer\"}, \"minItems\": 2, "
                   "\"maxItems\": 4}");
    assert_string_equal(rule(g, "root"),
                        "\"[\" ws integer ( ws \",\" ws integer ){1,3} ws \"]\"");
    free(g);
    g = gbnf("{\"type\": \"array\", \"items\": {\"type\": \"integer\"}, \"maxItems\": 0}");
    assert_string_equal(rule(g, "root"), "\"[\" ws \"]\"");
    free(g);
    g = gbnf("{\"type\": \"array\", \"items\": {\"type\": \"integer\"}, \"minItems\": 1}");
    assert_string_equal(rule(g, "root"), "\"[\" ws integer ( ws \",\" ws integer )* ws \"]\"");
    free(g);
}

static void test_json_schema_array_counts_past_1000_go_by_blocks(void **state)
{
    (void)state;
    char *g = gbnf("{\"type\": \"array\", \"items\": {\"type\": \"null\"}, \"minItems\": 2500}");
    /* 1 + 2 * 1000 + 499 = 2500, then any more */
    assert_string_equal(rule(g, "root"),
                        "\"[\" ws null ( ( ws \",\" ws null ){1000} ){2} ( ws \",\" ws null ){499} "
                        "( ws \",\" ws null )* ws \"]\"");
    free(g);
    g = gbnf("{\"type\": \"string\", \"maxLength\": 2500}");
    /* 0..1999 in the first alternative, 2000..2500 in the second */
    assert_string_equal(rule(g, "root"), "\"\\\"\" ( ( char{1000} )? char{0,999} | "
                                         "( char{1000} ){2} char{0,500} ) \"\\\"\"");
    free(g);
}

static void test_json_schema_array_prefix_items_tuple(void **state)
{
    (void)state;
    char *g = gbnf("{\"type\": \"array\", \"prefixItems\": [{\"type\": \"integer\"}, "
                   "{\"type\": \"string\"}], \"items\": false}");
    assert_string_equal(rule(g, "root"),
                        "\"[\" ws ( integer ( ws \",\" ws string )? ws )? \"]\"");
    free(g);
    g = gbnf("{\"type\": \"array\", \"prefixItems\": [{\"type\": \"integer\"}, "
             "{\"type\": \"string\"}, {\"type\": \"null\"}], \"minItems\": 2, \"maxItems\": 5, "
             "\"items\": {\"type\": \"boolean\"}}");
    assert_string_equal(rule(g, "root"),
                        "\"[\" ws integer ws \",\" ws string ( ws \",\" ws null ( ws \",\" ws "
                        "boolean ){0,2} )? ws \"]\"");
    free(g);
}

static void test_json_schema_array_prefix_items_then_any_values_without_items(void **state)
{
    (void)state;
    char *g = gbnf("{\"type\": \"array\", \"prefixItems\": [{\"type\": \"integer\"}], "
                   "\"minItems\": 1}");
    assert_string_equal(rule(g, "root"), "\"[\" ws integer ( ws \",\" ws value )* ws \"]\"");
    free(g);
}

static void test_json_schema_nested_arrays_and_objects(void **state)
{
    (void)state;
    char *g = gbnf("{\"type\": \"array\", \"items\": {\"type\": \"object\", \"properties\": "
                   "{\"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}, "
                   "\"maxItems\": 2}}, \"required\": [\"tags\"]}}");
    assert_string_equal(rule(g, "root"), "\"[\" ws ( item ( ws \",\" ws item )* ws )? \"]\"");
    assert_string_equal(rule(g, "item"), "\"{\" ws \"\\\"tags\\\"\" ws \":\" ws item-tags ws \"}\"");
    assert_string_equal(rule(g, "item-tags"),
                        "\"[\" ws ( string ( ws \",\" ws string )? ws )? \"]\"");
    free(g);
}

/* --- strings and numbers -------------------------------------------------------------- */

static void test_json_schema_string_min_and_max_length(void **state)
{
    (void)state;
    char *g = gbnf("{\"type\": \"string\", \"minLength\": 2, \"maxLength\": 5}");
    assert_string_equal(g, "root ::= \"\\\"\" char{2,5} \"\\\"\"\n" R_CHAR);
    free(g);
    g = gbnf("{\"type\": \"string\", \"maxLength\": 0}");
    assert_string_equal(rule(g, "root"), "\"\\\"\" \"\\\"\"");
    free(g);
}

static void test_json_schema_string_formats_have_fixed_shapes(void **state)
{
    (void)state;
    char *g = gbnf("{\"type\": \"array\", \"prefixItems\": [{\"type\": \"string\", \"format\": "
                   "\"date\"}, {\"type\": \"string\", \"format\": \"time\"}, {\"type\": "
                   "\"string\", \"format\": \"date-time\"}, {\"type\": \"string\", \"format\": "
                   "\"uuid\"}], \"items\": false, \"minItems\": 4}");
    assert_string_equal(rule(g, "root"),
                        "\"[\" ws date-string ws \",\" ws time-string ws \",\" ws date-time-string "
                        "ws \",\" ws uuid-string ws \"]\"");
    assert_string_equal(rule(g, "date-time"), "date \"T\" time");
    assert_string_equal(rule(g, "uuid"), "[0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" "
                                         "[0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" "
                                         "[0-9a-fA-F]{12}");
    assert_has(rule(g, "date"), "[0-9]{4} \"-\" ( \"0\" [1-9] | \"1\" [0-2] ) \"-\"");
    assert_has(rule(g, "time"), "( \"Z\" | [+\\-] ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] )");
    free(g);
}

static void test_json_schema_other_formats_are_plain_strings(void **state)
{
    (void)state;
    char *g = gbnf("{\"type\": \"string\", \"format\": \"email\"}");
    assert_string_equal(rule(g, "root"), "string");
    free(g);
}

static void test_json_schema_integer_lower_bound_zero_or_one(void **state)
{
    (void)state;
    char *g = gbnf("{\"type\": \"integer\", \"minimum\": 0}");
    assert_string_equal(g, "root ::= nonneg-integer\nnonneg-integer ::= \"0\" | [1-9] [0-9]{0,15}\n");
    free(g);
    g = gbnf("{\"type\": \"integer\", \"exclusiveMinimum\": -1}");
    assert_string_equal(rule(g, "root"), "nonneg-integer");
    free(g);
    g = gbnf("{\"type\": \"integer\", \"minimum\": 1, \"multipleOf\": 1}");
    assert_string_equal(g, "root ::= positive-integer\npositive-integer ::= [1-9] [0-9]{0,15}\n");
    free(g);
    g = gbnf("{\"type\": \"integer\", \"exclusiveMinimum\": 0}");
    assert_string_equal(rule(g, "root"), "positive-integer");
    free(g);
}

static void test_json_schema_integer_range_goes_by_length_and_prefix(void **state)
{
    (void)state;
    char *g = gbnf("{\"type\": \"integer\", \"minimum\": 13, \"maximum\": 147}");
    assert_string_equal(g, "root ::= \"1\" [3-9] | [2-9] [0-9] | \"1\" [0-3] [0-9] | \"14\" [0-7]\n");
    free(g);
    g = gbnf("{\"type\": \"integer\", \"minimum\": -15, \"exclusiveMaximum\": 8}");
    assert_string_equal(rule(g, "root"), "\"-\" ( [1-9] | \"1\" [0-5] ) | [0-7]");
    free(g);
    g = gbnf("{\"type\": \"integer\", \"minimum\": -5}"); /* the other side stops at 16 digits */
    assert_string_equal(rule(g, "root"), "\"-\" [1-5] | \"0\" | [1-9] [0-9]{0,15}");
    free(g);
    g = gbnf("{\"type\": \"integer\", \"minimum\": 10, \"maximum\": 9999}");
    assert_string_equal(rule(g, "root"), "[1-9] [0-9]{1,3}");
    free(g);
    g = gbnf("{\"type\": \"integer\", \"minimum\": 7.5, \"maximum\": 9.9, \"exclusiveMaximum\": 9}");
    assert_string_equal(g, "root ::= \"8\"\n"); /* bounds round inward, the tighter wins */
    free(g);
    /* a range inside an object gets a rule named after its property */
    g = gbnf("{\"type\": \"object\", \"properties\": {\"age\": {\"type\": \"integer\", "
             "\"minimum\": 1, \"maximum\": 120}}, \"required\": [\"age\"]}");
    assert_string_equal(rule(g, "age"), "[1-9] [0-9]? | \"1\" [0-1] [0-9] | \"120\"");
    free(g);
    g = gbnf("{\"type\": [\"integer\", \"null\"], \"maximum\": 0, \"minimum\": -99}");
    assert_string_equal(rule(g, "root"), "\"-\" [1-9] [0-9]? | \"0\" | null");
    free(g);
}

/* --- enum, const, anyOf -------------------------------------------------------------- */

static void test_json_schema_enum_strings_are_escaped_twice(void **state)
{
    (void)state;
    /* a"b, c\d, é and a newline: JSON escapes, then GBNF escapes of those */
    char *g = gbnf("{\"enum\": [\"a\\\"b\", \"c\\\\d\", \"\\u00e9t\\u00e9\", \"x\\ny\"]}");
    assert_string_equal(g, "root ::= \"\\\"a\\\\\\\"b\\\"\" | \"\\\"c\\\\\\\\d\\\"\" | "
                           "\"\\\"\xc3\xa9t\xc3\xa9\\\"\" | \"\\\"x\\\\ny\\\"\"\n");
    free(g);
}

static void test_json_schema_enum_of_any_json_values(void **state)
{
    (void)state;
    char *g = gbnf("{\"enum\": [1, 2.5, -0.1, null, true, false, [], {\"k\": [1, {}]}]}");
    assert_string_equal(rule(g, "root"),
                        "\"1\" | \"2.5\" | \"-0.1\" | \"null\" | \"true\" | \"false\" | \"[\" ws "
                        "\"]\" | \"{\" ws \"\\\"k\\\"\" ws \":\" ws \"[\" ws \"1\" ws \",\" ws "
                        "\"{\" ws \"}\" ws \"]\" ws \"}\"");
    free(g);
}

static void test_json_schema_enum_keeps_only_values_of_the_type(void **state)
{
    (void)state;
    char *g = gbnf("{\"type\": \"integer\", \"enum\": [\"1\", 1, 1.5, 2.0]}");
    assert_string_equal(g, "root ::= \"1\" | \"2\"\n");
    free(g);
    refused("{\"type\": \"string\", \"enum\": [1, 2]}", BL_EINVAL,
            "json_schema: 'enum' at / allows no value");
}

static void test_json_schema_const_is_one_literal(void **state)
{
    (void)state;
    char *g = gbnf("{\"type\": \"object\", \"properties\": {\"kind\": {\"const\": \"c\\u00e4t\"}}, "
                   "\"required\": [\"kind\"]}");
    assert_string_equal(rule(g, "root"),
                        "\"{\" ws \"\\\"kind\\\"\" ws \":\" ws \"\\\"c\xc3\xa4t\\\"\" ws \"}\"");
    free(g);
    g = gbnf("{\"const\": {\"a\": null}}");
    assert_string_equal(rule(g, "root"), "\"{\" ws \"\\\"a\\\"\" ws \":\" ws \"null\" ws \"}\"");
    free(g);
}

static void test_json_schema_any_of_is_alternatives(void **state)
{
    (void)state;
    char *g = gbnf("{\"type\": \"object\", \"properties\": {\"v\": {\"anyOf\": [{\"type\": "
                   "\"string\", \"maxLength\": 3}, {\"type\": \"integer\"}]}}, \"required\": "
                   "[\"v\"]}");
    assert_string_equal(rule(g, "root"), "\"{\" ws \"\\\"v\\\"\" ws \":\" ws v ws \"}\"");
    assert_string_equal(rule(g, "v"), "v-0 | integer");
    assert_string_equal(rule(g, "v-0"), "\"\\\"\" char{0,3} \"\\\"\"");
    free(g);
}

static void test_json_schema_one_of_is_read_as_any_of(void **state)
{
    (void)state;
    char *g = gbnf("{\"oneOf\": [{\"type\": \"boolean\"}, {\"type\": \"null\"}]}");
    assert_string_equal(rule(g, "root"), "boolean | null");
    free(g);
}

/* --- $ref and allOf ------------------------------------------------------------------ */

static void test_json_schema_ref_to_defs_is_a_rule(void **state)
{
    (void)state;
    char *g = gbnf("{\"$defs\": {\"Point\": {\"type\": \"object\", \"properties\": {\"x\": "
                   "{\"type\": \"number\"}}, \"required\": [\"x\"]}}, \"type\": \"array\", "
                   "\"items\": {\"$ref\": \"#/$defs/Point\"}}");
    assert_string_equal(rule(g, "root"), "\"[\" ws ( Point ( ws \",\" ws Point )* ws )? \"]\"");
    assert_string_equal(rule(g, "Point"), "\"{\" ws \"\\\"x\\\"\" ws \":\" ws number ws \"}\"");
    free(g);
    g = gbnf("{\"definitions\": {\"N\": {\"type\": \"null\"}}, \"$ref\": \"#/definitions/N\", "
             "\"description\": \"d\"}");
    assert_string_equal(g, "root ::= N\nN ::= null\n" R_NULL);
    free(g);
}

static void test_json_schema_recursive_ref_is_a_recursive_rule(void **state)
{
    (void)state;
    char *g = gbnf("{\"$defs\": {\"node\": {\"type\": \"object\", \"properties\": {\"value\": "
                   "{\"type\": \"integer\"}, \"children\": {\"type\": \"array\", \"items\": "
                   "{\"$ref\": \"#/$defs/node\"}}}, \"required\": [\"value\", \"children\"]}}, "
                   "\"$ref\": \"#/$defs/node\"}");
    assert_string_equal(rule(g, "root"), "node");
    assert_string_equal(rule(g, "node"),
                        "\"{\" ws \"\\\"value\\\"\" ws \":\" ws integer ws \",\" ws "
                        "\"\\\"children\\\"\" ws \":\" ws node-children ws \"}\"");
    assert_string_equal(rule(g, "node-children"),
                        "\"[\" ws ( node ( ws \",\" ws node )* ws )? \"]\"");
    free(g);
}

static void test_json_schema_ref_to_root_is_recursion(void **state)
{
    (void)state;
    char *g = gbnf("{\"type\": \"object\", \"properties\": {\"next\": {\"anyOf\": [{\"$ref\": "
                   "\"#\"}, {\"type\": \"null\"}]}}}");
    assert_string_equal(rule(g, "next"), "root | null");
    free(g);
}

static void test_json_schema_left_recursive_ref_is_refused(void **state)
{
    (void)state;
    refused("{\"anyOf\": [{\"$ref\": \"#\"}, {\"type\": \"null\"}]}", BL_EINVAL,
            "json_schema: '$ref' at /anyOf/0 leads back to '#' before any JSON token");
    refused("{\"$defs\": {\"a\": {\"$ref\": \"#/$defs/b\"}, \"b\": {\"$ref\": \"#/$defs/a\"}}, "
            "\"$ref\": \"#/$defs/a\"}",
            BL_EINVAL, "'$ref' at /$defs/b leads back to '#/$defs/a'");
}

static void test_json_schema_unknown_ref_forms_are_refused(void **state)
{
    (void)state;
    refused("{\"$ref\": \"https://example.com/s.json\"}", BL_EINVAL,
            "json_schema: '$ref' at / is not supported in the form 'https://example.com/s.json'");
    refused("{\"$defs\": {\"a\": {\"properties\": {\"b\": {}}}}, \"$ref\": "
            "\"#/$defs/a/properties/b\"}",
            BL_EINVAL, "'$ref' at / is not supported in the form");
    refused("{\"properties\": {\"p\": {\"$ref\": \"#/$defs/missing\"}}}", BL_EINVAL,
            "json_schema: '$ref' at /properties/p points to '#/$defs/missing', which is not "
            "defined");
    refused("{\"$ref\": 3}", BL_EINVAL, "'$ref' at / must be a string");
    refused("{\"$ref\": \"#\", \"type\": \"object\"}", BL_EINVAL,
            "'type' at / beside '$ref' is not supported");
}

static void test_json_schema_all_of_merges_object_properties(void **state)
{
    (void)state;
    char *g = gbnf("{\"$defs\": {\"B\": {\"properties\": {\"b\": {\"type\": \"integer\"}}}}, "
                   "\"allOf\": [{\"type\": \"object\", \"properties\": {\"a\": {\"type\": "
                   "\"string\"}}, \"required\": [\"a\"]}, {\"$ref\": \"#/$defs/B\", "
                   "\"required\": [\"b\"]}]}");
    assert_string_equal(rule(g, "root"),
                        "\"{\" ws \"\\\"a\\\"\" ws \":\" ws string ws \",\" ws \"\\\"b\\\"\" ws "
                        "\":\" ws integer ws \"}\"");
    free(g);
}

static void test_json_schema_all_of_one_schema_is_that_schema(void **state)
{
    (void)state;
    char *g = gbnf("{\"$defs\": {\"Color\": {\"enum\": [\"red\", \"green\"]}}, \"allOf\": "
                   "[{\"$ref\": \"#/$defs/Color\"}], \"description\": \"pydantic v1 style\"}");
    assert_string_equal(g, "root ::= Color\nColor ::= \"\\\"red\\\"\" | \"\\\"green\\\"\"\n");
    free(g);
}

static void test_json_schema_all_of_non_object_parts_are_refused(void **state)
{
    (void)state;
    refused("{\"allOf\": [{\"type\": \"string\"}, {\"maxLength\": 3}]}", BL_EINVAL,
            "json_schema: 'type' at /allOf/0 inside 'allOf' must be \"object\"");
    refused("{\"allOf\": [{\"properties\": {}}, {\"minItems\": 3}]}", BL_EINVAL,
            "'minItems' at /allOf/1 is not supported inside 'allOf'");
    refused("{\"allOf\": [{\"properties\": {\"a\": {}}}, {\"properties\": {\"a\": {}}}]}",
            BL_EINVAL, "'properties' at /allOf/1 defines 'a' again");
    refused("{\"allOf\": [{\"properties\": {\"a\": {\"pattern\": \"x\"}}}, {}]}", BL_EINVAL,
            "json_schema: 'pattern' at /allOf/0/properties/a is not supported");
}

/* --- refusals ------------------------------------------------------------------------ */

static void test_json_schema_pattern_is_refused_with_its_path(void **state)
{
    (void)state;
    refused("{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"string\", \"pattern\": "
            "\"^x$\"}}}",
            BL_EINVAL, "json_schema: 'pattern' at /properties/a is not supported");
}

static void test_json_schema_unsupported_keywords_are_refused_by_name(void **state)
{
    (void)state;
    static const char *const KW[] = {
        "not", "if", "then", "else", "dependentSchemas", "dependentRequired",
        "patternProperties", "uniqueItems", "contains", "minContains", "propertyNames",
        "minProperties", "maxProperties", "unevaluatedProperties", "additionalItems",
        "nullable", "discriminator",
    };
    for (size_t i = 0; i < sizeof KW / sizeof KW[0]; i++) {
        char schema[256], want[128];
        (void)snprintf(schema, sizeof schema,
                       "{\"type\": \"array\", \"items\": {\"type\": \"object\", \"%s\": {}}}",
                       KW[i]);
        (void)snprintf(want, sizeof want, "json_schema: '%s' at /items is not supported", KW[i]);
        refused(schema, BL_EINVAL, want);
    }
}

static void test_json_schema_bounds_on_numbers_and_empty_integer_ranges_are_refused(void **state)
{
    (void)state;
    refused("{\"type\": \"number\", \"minimum\": 0}", BL_EINVAL,
            "json_schema: 'minimum' at / is not supported on a 'number'");
    refused("{\"type\": \"number\", \"exclusiveMaximum\": 9}", BL_EINVAL,
            "'exclusiveMaximum' at / is not supported on a 'number'");
    refused("{\"properties\": {\"n\": {\"maximum\": 3}}}", BL_EINVAL,
            "'maximum' at /properties/n is not supported on a 'number'");
    refused("{\"type\": [\"integer\", \"number\"], \"minimum\": 1}", BL_EINVAL,
            "'minimum' at / is not supported on a 'number'");
    refused("{\"type\": \"integer\", \"multipleOf\": 2}", BL_EINVAL,
            "'multipleOf' at / is not supported");
    refused("{\"type\": \"integer\", \"exclusiveMinimum\": true, \"minimum\": 0}", BL_EINVAL,
            "'exclusiveMinimum' at / as a boolean (draft 4) is not supported");
    refused("{\"type\": \"integer\", \"maximum\": 9, \"exclusiveMaximum\": false}", BL_EINVAL,
            "'exclusiveMaximum' at / as a boolean (draft 4) is not supported");
    refused("{\"type\": \"integer\", \"minimum\": \"1\"}", BL_EINVAL,
            "'minimum' at / must be a number");
    refused("{\"type\": \"integer\", \"minimum\": 5, \"maximum\": 3}", BL_EINVAL,
            "json_schema: 'minimum' at / and 'maximum' leave no integer (the range would be [5, 3])");
    refused("{\"properties\": {\"n\": {\"type\": \"integer\", \"exclusiveMinimum\": 3, "
            "\"exclusiveMaximum\": 4}}}",
            BL_EINVAL, "'exclusiveMinimum' at /properties/n and 'exclusiveMaximum' leave no integer");
    refused("{\"type\": \"integer\", \"minimum\": 3.2, \"maximum\": 3.8}", BL_EINVAL,
            "'minimum' at / and 'maximum' leave no integer (the range would be [4, 3])");
    refused("{\"type\": \"integer\", \"minimum\": 2, \"exclusiveMinimum\": 2, \"maximum\": 2}",
            BL_EINVAL, "'exclusiveMinimum' at / and 'maximum' leave no integer");
    refused("{\"type\": \"integer\", \"minimum\": 1e19}", BL_EINVAL,
            "'minimum' at / leaves no integer in int64");
    refused("{\"type\": \"integer\", \"exclusiveMinimum\": 9223372036854775807}", BL_EINVAL,
            "'exclusiveMinimum' at / leaves no integer in int64");
    refused("{\"type\": \"integer\", \"exclusiveMaximum\": -9223372036854775808}", BL_EINVAL,
            "'exclusiveMaximum' at / leaves no integer in int64");
    refused("{\"type\": \"integer\", \"maximum\": -1e300}", BL_EINVAL,
            "'maximum' at / leaves no integer in int64");
}

static void test_json_schema_format_with_length_is_refused(void **state)
{
    (void)state;
    refused("{\"type\": \"string\", \"format\": \"date\", \"maxLength\": 10}", BL_EINVAL,
            "'maxLength' at / cannot be combined with 'format' 'date'");
}

static void test_json_schema_invalid_keyword_values_are_refused(void **state)
{
    (void)state;
    refused("{\"type\": 5}", BL_EINVAL,
            "json_schema: 'type' at / must be a type name or an array of type names");
    refused("{\"type\": []}", BL_EINVAL, "'type' at / must be a type name");
    refused("{\"type\": \"float\"}", BL_EINVAL, "'type' at / names an unknown type 'float'");
    refused("{\"type\": \"object\", \"properties\": []}", BL_EINVAL,
            "json_schema: 'properties' at / must be an object");
    refused("{\"type\": \"object\", \"properties\": {\"a\": {}}, \"required\": \"a\"}", BL_EINVAL,
            "json_schema: 'required' at / must be an array of strings");
    refused("{\"type\": \"object\", \"properties\": {\"a\": {}}, \"required\": [1]}", BL_EINVAL,
            "'required' at / must be an array of strings");
    refused("{\"type\": \"object\", \"properties\": {\"a\": {}}, \"required\": [\"b\"]}", BL_EINVAL,
            "'required' at / names 'b', which is not in 'properties'");
    refused("{\"type\": \"object\", \"additionalProperties\": 1}", BL_EINVAL,
            "'additionalProperties' at / must be a boolean or a schema");
    refused("{\"type\": \"array\", \"items\": [{}]}", BL_EINVAL,
            "'items' at / as an array (a tuple) is not supported");
    refused("{\"type\": \"array\", \"items\": 1}", BL_EINVAL, "'items' at / must be a schema");
    refused("{\"type\": \"array\", \"prefixItems\": {}}", BL_EINVAL,
            "'prefixItems' at / must be an array of schemas");
    refused("{\"type\": \"array\", \"minItems\": -1}", BL_EINVAL,
            "'minItems' at / must be a non-negative integer");
    refused("{\"type\": \"array\", \"maxItems\": 1.5}", BL_EINVAL,
            "'maxItems' at / must be a non-negative integer");
    refused("{\"type\": \"string\", \"minLength\": \"3\"}", BL_EINVAL,
            "'minLength' at / must be a non-negative integer");
    refused("{\"type\": \"string\", \"minLength\": 4, \"maxLength\": 3}", BL_EINVAL,
            "'minLength' at / is larger than 'maxLength'");
    refused("{\"type\": \"string\", \"format\": 1}", BL_EINVAL, "'format' at / must be a string");
    refused("{\"enum\": []}", BL_EINVAL, "'enum' at / must be a non-empty array");
    refused("{\"anyOf\": []}", BL_EINVAL, "'anyOf' at / must be a non-empty array of schemas");
    refused("{\"allOf\": {}}", BL_EINVAL, "'allOf' at / must be a non-empty array of schemas");
    refused("{\"$defs\": []}", BL_EINVAL, "'$defs' at / must be an object");
    refused("{\"properties\": {\"a\": 7}}", BL_EINVAL,
            "json_schema: the schema at /properties/a must be an object or a boolean");
}

static void test_json_schema_non_object_schemas_are_refused(void **state)
{
    (void)state;
    refused("\"string\"", BL_EINVAL, "json_schema: the schema at / must be an object or a boolean");
    refused("[]", BL_EINVAL, "the schema at / must be an object or a boolean");
    refused("false", BL_EINVAL, "the schema at / is false and accepts no value");
    char *g = (char *)"untouched";
    bl_err_t err = {0};
    assert_int_equal(rt_json_schema_to_gbnf(NULL, &g, &err), BL_EINVAL);
    assert_null(g);
}

static void test_json_schema_unsatisfiable_arrays_are_refused(void **state)
{
    (void)state;
    refused("{\"type\": \"array\", \"minItems\": 3, \"maxItems\": 2}", BL_EINVAL,
            "'minItems' at / is larger than the 2 items the array may hold");
    refused("{\"type\": \"array\", \"items\": false, \"minItems\": 1}", BL_EINVAL,
            "'minItems' at / is larger than the 0 items");
    refused("{\"type\": \"object\", \"properties\": {\"a\": false}, \"required\": [\"a\"]}",
            BL_EINVAL, "'required' at / names 'a', whose schema is false");
}

static void test_json_schema_combined_combinators_are_refused(void **state)
{
    (void)state;
    refused("{\"anyOf\": [{}], \"oneOf\": [{}]}", BL_EINVAL, "'oneOf' at / beside 'anyOf'");
    refused("{\"type\": \"string\", \"anyOf\": [{}]}", BL_EINVAL,
            "'type' at / beside 'anyOf' is not supported");
    refused("{\"enum\": [1], \"minimum\": 0}", BL_EINVAL, "'minimum' at / beside 'enum'");
}

/* --- bounds ----------------------------------------------------------------------------- */

static void test_json_schema_nesting_past_the_bound_is_refused(void **state)
{
    (void)state;
    json_t *s = json_pack("{s:s}", "type", "integer");
    for (int i = 0; i < RT_JSON_SCHEMA_MAX_DEPTH + 5; i++)
        s = json_pack("{s:s, s:o}", "type", "array", "items", s);
    char *g = (char *)"untouched";
    bl_err_t err = {0};
    assert_int_equal(rt_json_schema_to_gbnf(s, &g, &err), BL_ERANGE);
    assert_null(g);
    assert_non_null(strstr(err.msg, "/items/items nests deeper than 64 levels"));
    json_decref(s);

    /* just under the bound converts */
    s = json_pack("{s:s}", "type", "integer");
    for (int i = 0; i < RT_JSON_SCHEMA_MAX_DEPTH - 1; i++)
        s = json_pack("{s:s, s:o}", "type", "array", "items", s);
    assert_int_equal(rt_json_schema_to_gbnf(s, &g, &err), 0);
    free(g);
    json_decref(s);
}

static void test_json_schema_ref_chains_through_all_of_are_bounded(void **state)
{
    (void)state;
    /* each definition merges the next one twice: 2^25 parts unless bounded */
    json_t *defs = json_object();
    char name[16], ref[32];
    for (int i = 0; i < 25; i++) {
        (void)snprintf(name, sizeof name, "a%d", i);
        (void)snprintf(ref, sizeof ref, "#/$defs/a%d", i + 1);
        json_object_set_new(defs, name, json_pack("{s:[{s:s},{s:s}]}", "allOf", "$ref", ref,
                                                  "$ref", ref));
    }
    json_object_set_new(defs, "a25", json_pack("{s:s}", "type", "object"));
    json_t *s = json_pack("{s:o, s:s}", "$defs", defs, "$ref", "#/$defs/a0");
    char *g = (char *)"untouched";
    bl_err_t err = {0};
    assert_int_equal(rt_json_schema_to_gbnf(s, &g, &err), BL_ERANGE);
    assert_null(g);
    assert_non_null(strstr(err.msg, "expands to more than"));
    json_decref(s);
}

static void test_json_schema_huge_grammar_is_refused(void **state)
{
    (void)state;
    /* 3000 properties with 1000-character enum values: about 3 MB of grammar */
    json_t *props = json_object();
    char key[16], *val = malloc(1001);
    memset(val, 'v', 1000);
    val[1000] = '\0';
    for (int i = 0; i < 3000; i++) {
        (void)snprintf(key, sizeof key, "k%d", i);
        json_object_set_new(props, key, json_pack("{s:[s]}", "enum", val));
    }
    free(val);
    json_t *s = json_pack("{s:s, s:o}", "type", "object", "properties", props);
    char *g = (char *)"untouched";
    bl_err_t err = {0};
    assert_int_equal(rt_json_schema_to_gbnf(s, &g, &err), BL_ERANGE);
    assert_null(g);
    assert_string_equal(err.msg, "json_schema: the grammar would be larger than 1048576 bytes");
    json_decref(s);
}

static void test_json_schema_counts_past_a_million_are_refused(void **state)
{
    (void)state;
    refused("{\"type\": \"string\", \"minLength\": 5000000000}", BL_ERANGE,
            "'minLength' at / needs a count over 1000000");
    refused("{\"type\": \"array\", \"maxItems\": 2000000}", BL_ERANGE,
            "'maxItems' at / needs a count over 1000000");
}

static void test_json_schema_long_keys_split_the_exclusion_into_rules(void **state)
{
    (void)state;
    /* a 100-character key excluded from the extra keys: 16 levels inline per rule */
    char schema[512], key[101];
    memset(key, 'k', 100);
    key[100] = '\0';
    (void)snprintf(schema, sizeof schema,
                   "{\"properties\": {\"%s\": {}}, \"additionalProperties\": true}", key);
    char *g = gbnf(schema);
    assert_has(g, "\nadditional-key-6 ::= ");
    assert_true(strstr(g, "\nadditional-key-7 ::= ") == NULL);
    free(g);
}

/* Whether the grammar of schema takes text whole (through router/grammar.c, the
 * engine that runs these grammars). */
static int schema_takes(const char *schema, const char *text)
{
    char *g = gbnf(schema);
    rt_grammar_t *gr = NULL;
    rt_grammar_match_t *m = NULL;
    bl_err_t err = {0};
    if (rt_grammar_parse(&gr, g, strlen(g), &err))
        fail_msg("the engine refuses the grammar of %s: %s\n%s", schema, err.msg, g);
    assert_int_equal(rt_grammar_match_create(&m, gr, &err), 0);
    int ok = rt_grammar_match_feed(m, text, strlen(text)) == 0 && rt_grammar_match_done(m);
    rt_grammar_match_destroy(m);
    rt_grammar_destroy(gr);
    free(g);
    return ok;
}

static void test_json_schema_grammars_run_on_the_engine(void **state)
{
    (void)state;
    static const char obj[] =
        "{\"type\":\"object\",\"properties\":{\"ok\":{\"type\":\"boolean\"},"
        "\"n\":{\"type\":\"integer\",\"minimum\":0},\"tags\":{\"type\":\"array\","
        "\"items\":{\"enum\":[\"a\",\"b\\\"c\"]},\"maxItems\":2},\"s\":{\"type\":\"string\","
        "\"maxLength\":3},\"d\":{\"type\":\"string\",\"format\":\"date\"}},"
        "\"required\":[\"ok\"],\"additionalProperties\":false}";
    assert_true(schema_takes(obj, "{\"ok\":true}"));
    assert_true(schema_takes(obj, "{ \"ok\" : false ,\n \"n\": 12, \"tags\": [\"b\\\"c\", \"a\"],"
                                  " \"s\": \"\\u00e9x\", \"d\": \"2026-11-30\" }"));
    assert_true(schema_takes(obj, "{\"ok\":true,\"s\":\"\xc3\xa9t\xc3\xa9\"}"));
    assert_false(schema_takes(obj, "{}"));                          /* ok is required */
    assert_false(schema_takes(obj, "{\"n\":1,\"ok\":true}"));      /* schema order */
    assert_false(schema_takes(obj, "{\"ok\":true,\"n\":-1}"));
    assert_false(schema_takes(obj, "{\"ok\":true,\"tags\":[\"a\",\"a\",\"a\"]}"));
    assert_false(schema_takes(obj, "{\"ok\":true,\"s\":\"abcd\"}"));
    assert_false(schema_takes(obj, "{\"ok\":true,\"x\":1}"));      /* no other keys */
    assert_false(schema_takes(obj, "{\"ok\":true,\"d\":\"yesterday\"}"));
    static const char tree[] =
        "{\"$ref\":\"#/$defs/node\",\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":"
        "{\"v\":{\"type\":\"number\"},\"kids\":{\"type\":\"array\",\"items\":"
        "{\"$ref\":\"#/$defs/node\"}}},\"required\":[\"v\"]}}}";
    assert_true(schema_takes(tree, "{\"v\":1.5e3,\"kids\":[{\"v\":-0.25},{\"v\":2,\"kids\":[]}]}"));
    assert_false(schema_takes(tree, "{\"v\":01}"));
    assert_false(schema_takes(tree, "{\"v\":1,\"kids\":[{}]}"));
    static const char any[] = "{}";
    assert_true(schema_takes(any, "[1, \"two\", {\"three\": null}, true]"));
    assert_false(schema_takes(any, "[1, 2"));
    static const char anyof[] = "{\"anyOf\":[{\"type\":\"null\"},{\"const\":\"x\"}]}";
    assert_true(schema_takes(anyof, "null"));
    assert_true(schema_takes(anyof, "\"x\""));
    assert_false(schema_takes(anyof, "\"y\""));
}

/* --- integer ranges on the engine ------------------------------------------------- */

/* The engine's grammar for a schema, for many matches. */
static rt_grammar_t *grammar_of(const char *schema)
{
    char *g = gbnf(schema);
    rt_grammar_t *gr = NULL;
    bl_err_t err = {0};
    if (rt_grammar_parse(&gr, g, strlen(g), &err))
        fail_msg("the engine refuses the grammar of %s: %s\n%s", schema, err.msg, g);
    free(g);
    return gr;
}

/* Whether m's grammar takes text whole. */
static int takes(rt_grammar_match_t *m, const char *text)
{
    rt_grammar_match_reset(m);
    return rt_grammar_match_feed(m, text, strlen(text)) == 0 && rt_grammar_match_done(m);
}

/* Checks that schema's grammar takes v (written canonically) iff lo <= v <= hi. */
static void check_int(rt_grammar_match_t *m, const char *schema, long long lo, long long hi,
                      long long v)
{
    char text[32];
    (void)snprintf(text, sizeof text, "%lld", v);
    const int want = lo <= v && v <= hi;
    if (takes(m, text) != want)
        fail_msg("%s: \"%s\" is %s, want %s (range [%lld, %lld])", schema, text,
                 want ? "refused" : "taken", want ? "taken" : "refused", lo, hi);
}

/* Texts no integer schema takes: not canonical, or not integers. */
static void check_non_canonical(rt_grammar_match_t *m, const char *schema)
{
    static const char *const BAD[] = {
        "007", "00", "-0", "-00", "+5", "1.0", "0x1", "1e2", " 1", "1 ", "", "-", "--1", "01",
    };
    for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++)
        if (takes(m, BAD[i]))
            fail_msg("%s takes \"%s\"", schema, BAD[i]);
}

static void test_json_schema_integer_ranges_take_exactly_their_integers(void **state)
{
    (void)state;
    static const struct {
        const char *bounds; /* the schema's bound keywords */
        long long lo, hi;   /* the integers they allow */
    } CASES[] = {
        {"\"minimum\": 0, \"maximum\": 0", 0, 0},
        {"\"minimum\": 0, \"maximum\": 9", 0, 9},
        {"\"minimum\": 1, \"maximum\": 120", 1, 120},
        {"\"minimum\": 13, \"maximum\": 147", 13, 147},
        {"\"minimum\": -20, \"maximum\": -3", -20, -3},
        {"\"minimum\": -15, \"maximum\": 7", -15, 7},
        {"\"minimum\": 99, \"maximum\": 1001", 99, 1001},
        {"\"minimum\": -1000, \"maximum\": -999", -1000, -999},
        {"\"minimum\": 5, \"maximum\": 5", 5, 5},
        {"\"minimum\": -1, \"maximum\": 0", -1, 0},
        {"\"minimum\": 10, \"maximum\": 99", 10, 99},
        {"\"minimum\": 100, \"maximum\": 999", 100, 999},
        {"\"minimum\": 1, \"maximum\": 1000", 1, 1000},
        {"\"minimum\": -999, \"maximum\": 999", -999, 999},
        {"\"minimum\": 190, \"maximum\": 210", 190, 210},
        {"\"minimum\": 1000, \"maximum\": 1000", 1000, 1000},
        {"\"exclusiveMinimum\": 3, \"exclusiveMaximum\": 12", 4, 11},
        {"\"exclusiveMinimum\": -10, \"maximum\": 10, \"exclusiveMaximum\": 10", -9, 9},
        {"\"exclusiveMinimum\": -1, \"exclusiveMaximum\": 1", 0, 0},
        {"\"minimum\": 1.5, \"maximum\": 9.5", 2, 9},
        {"\"minimum\": -7.5, \"maximum\": -0.5", -7, -1},
        {"\"exclusiveMinimum\": 2.5, \"exclusiveMaximum\": 20.0", 3, 19},
        {"\"minimum\": -0.5, \"maximum\": 0.5", 0, 0},
        {"\"minimum\": 10, \"exclusiveMinimum\": 11, \"maximum\": 30, \"exclusiveMaximum\": 29",
         12, 28},
    };
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        char schema[256];
        (void)snprintf(schema, sizeof schema, "{\"type\": \"integer\", %s}", CASES[i].bounds);
        rt_grammar_t *gr = grammar_of(schema);
        rt_grammar_match_t *m = NULL;
        bl_err_t err = {0};
        assert_int_equal(rt_grammar_match_create(&m, gr, &err), 0);
        for (long long v = CASES[i].lo - 1100; v <= CASES[i].hi + 1100; v++)
            check_int(m, schema, CASES[i].lo, CASES[i].hi, v);
        check_non_canonical(m, schema);
        rt_grammar_match_destroy(m);
        rt_grammar_destroy(gr);
    }
}

/* One side only: the other stops where rule "integer" stops, at 16 digits. */
static void test_json_schema_integer_one_sided_ranges_stop_at_16_digits(void **state)
{
    (void)state;
    static const struct {
        const char *bounds;
        long long lo, hi;
    } CASES[] = {
        {"\"minimum\": -5", -5, 9999999999999999LL},
        {"\"minimum\": 2", 2, 9999999999999999LL},
        {"\"minimum\": 12345", 12345, 9999999999999999LL},
        {"\"exclusiveMaximum\": 100", -9999999999999999LL, 99},
        {"\"maximum\": -42", -9999999999999999LL, -42},
        {"\"maximum\": 9999999999999999", -9999999999999999LL, 9999999999999999LL},
        /* a bound past 16 digits: the open side goes on to the end of int64 */
        {"\"minimum\": 100000000000000000", 100000000000000000LL, INT64_MAX},
        {"\"maximum\": -10000000000000000", INT64_MIN, -10000000000000000LL},
    };
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        char schema[256];
        (void)snprintf(schema, sizeof schema, "{\"type\": \"integer\", %s}", CASES[i].bounds);
        rt_grammar_t *gr = grammar_of(schema);
        rt_grammar_match_t *m = NULL;
        bl_err_t err = {0};
        assert_int_equal(rt_grammar_match_create(&m, gr, &err), 0);
        const long long lo = CASES[i].lo, hi = CASES[i].hi;
        const long long at[] = {lo, hi, lo / 2 + hi / 2, lo / 3 + hi / 3 * 2,
                                INT64_MIN, INT64_MAX, 0, -1, 1,
                                9999999999999999LL, 10000000000000000LL,
                                -9999999999999999LL, -10000000000000000LL};
        for (size_t k = 0; k < sizeof at / sizeof at[0]; k++)
            for (long long d = -3; d <= 3; d++) {
                const long long v = at[k];
                if ((d < 0 && v < INT64_MIN - d) || (d > 0 && v > INT64_MAX - d))
                    continue;
                check_int(m, schema, lo, hi, v + d);
            }
        check_non_canonical(m, schema);
        assert_false(takes(m, "99999999999999999999")); /* past int64 */
        assert_false(takes(m, "-99999999999999999999"));
        rt_grammar_match_destroy(m);
        rt_grammar_destroy(gr);
    }
}

/* A uniform draw in [lo, hi]. */
static long long draw_in(rng_t *r, long long lo, long long hi)
{
    const uint64_t span = (uint64_t)hi - (uint64_t)lo;
    const uint64_t x = span == UINT64_MAX ? rng_next(r) : rng_next(r) % (span + 1);
    return (long long)((uint64_t)lo + x);
}

/* A bound of a random size: 1 to 19 digits, either sign, often at or near the ends
 * of int64 or a power of ten. */
static long long draw_bound(rng_t *r)
{
    const unsigned d = 1 + (unsigned)(rng_next(r) % 19);
    uint64_t p = 1;
    for (unsigned i = 1; i < d; i++)
        p *= 10;
    long long v;
    switch (rng_next(r) % 6) {
    case 0: v = INT64_MAX - (long long)(rng_next(r) % 4); break;
    case 1: v = INT64_MIN + (long long)(rng_next(r) % 4); break;
    case 2: v = (long long)(p - 1 + rng_next(r) % 3); break; /* 9...9, 10...0, 10...1 */
    default: v = draw_in(r, (long long)(p / 10), d == 19 ? INT64_MAX : (long long)(p * 10 - 1));
    }
    return v != INT64_MIN && rng_next(r) % 2 ? -v : v;
}

/* A random value: near a bound, or of a random size. */
static long long draw_near(rng_t *r, long long lo, long long hi)
{
    const long long a = rng_next(r) % 2 ? lo : hi;
    const long long d = (long long)(rng_next(r) % 2001) - 1000;
    switch (rng_next(r) % 3) {
    case 0:
        if ((d < 0 && a < INT64_MIN - d) || (d > 0 && a > INT64_MAX - d))
            return a;
        return a + d;
    case 1: return draw_in(r, lo, hi);
    default: return draw_bound(r);
    }
}

static void test_json_schema_integer_random_ranges(void **state)
{
    (void)state;
    rng_t r = rng_for(1);
    for (int it = 0; it < 400; it++) {
        long long lo = draw_bound(&r), hi = draw_bound(&r);
        if (lo > hi) {
            const long long t = lo;
            lo = hi;
            hi = t;
        }
        /* the bounds as inclusive or exclusive keywords, by turns */
        char schema[256];
        const int ex_lo = lo != INT64_MIN && rng_next(&r) % 2;
        const int ex_hi = hi != INT64_MAX && rng_next(&r) % 2;
        (void)snprintf(schema, sizeof schema, "{\"type\": \"integer\", \"%s\": %lld, \"%s\": %lld}",
                       ex_lo ? "exclusiveMinimum" : "minimum", ex_lo ? lo - 1 : lo,
                       ex_hi ? "exclusiveMaximum" : "maximum", ex_hi ? hi + 1 : hi);
        char *g = gbnf(schema);
        if (strlen(g) > 4096)
            fail_msg("%s: a grammar of %zu bytes:\n%s", schema, strlen(g), g);
        free(g);
        rt_grammar_t *gr = grammar_of(schema);
        rt_grammar_match_t *m = NULL;
        bl_err_t err = {0};
        assert_int_equal(rt_grammar_match_create(&m, gr, &err), 0);
        check_int(m, schema, lo, hi, lo);
        check_int(m, schema, lo, hi, hi);
        if (lo > INT64_MIN)
            check_int(m, schema, lo, hi, lo - 1);
        if (hi < INT64_MAX)
            check_int(m, schema, lo, hi, hi + 1);
        if (lo < INT64_MAX)
            check_int(m, schema, lo, hi, lo + 1);
        if (hi > INT64_MIN)
            check_int(m, schema, lo, hi, hi - 1);
        for (int k = 0; k < 60; k++)
            check_int(m, schema, lo, hi, draw_near(&r, lo, hi));
        check_non_canonical(m, schema);
        assert_false(takes(m, "9223372036854775808"));
        assert_false(takes(m, "-9223372036854775809"));
        assert_false(takes(m, "10000000000000000000"));
        rt_grammar_match_destroy(m);
        rt_grammar_destroy(gr);
    }
}

static void test_json_schema_integer_range_of_all_int64(void **state)
{
    (void)state;
    static const char schema[] =
        "{\"type\": \"integer\", \"minimum\": -9223372036854775808, "
        "\"maximum\": 9223372036854775807}";
    rt_grammar_t *gr = grammar_of(schema);
    rt_grammar_match_t *m = NULL;
    bl_err_t err = {0};
    assert_int_equal(rt_grammar_match_create(&m, gr, &err), 0);
    assert_true(takes(m, "-9223372036854775808"));
    assert_true(takes(m, "9223372036854775807"));
    assert_true(takes(m, "-9223372036854775799"));
    assert_true(takes(m, "9199999999999999999"));
    assert_true(takes(m, "0"));
    assert_false(takes(m, "-9223372036854775809"));
    assert_false(takes(m, "9223372036854775808"));
    assert_false(takes(m, "9300000000000000000"));
    assert_false(takes(m, "10000000000000000000"));
    check_non_canonical(m, schema);
    rt_grammar_match_destroy(m);
    rt_grammar_destroy(gr);
    /* bounds past int64 clamp to its ends */
    gr = grammar_of("{\"type\": \"integer\", \"minimum\": -1e30, \"exclusiveMaximum\": 1e30}");
    assert_int_equal(rt_grammar_match_create(&m, gr, &err), 0);
    assert_true(takes(m, "-9223372036854775808"));
    assert_true(takes(m, "9223372036854775807"));
    assert_false(takes(m, "9223372036854775808"));
    rt_grammar_match_destroy(m);
    rt_grammar_destroy(gr);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_schema_grammars_run_on_the_engine),
        cmocka_unit_test(test_json_schema_integer_ranges_take_exactly_their_integers),
        cmocka_unit_test(test_json_schema_integer_one_sided_ranges_stop_at_16_digits),
        cmocka_unit_test(test_json_schema_integer_random_ranges),
        cmocka_unit_test(test_json_schema_integer_range_of_all_int64),
        cmocka_unit_test(test_json_schema_true_accepts_any_json_value),
        cmocka_unit_test(test_json_schema_empty_schema_accepts_any_json_value),
        cmocka_unit_test(test_json_schema_string_type),
        cmocka_unit_test(test_json_schema_number_type),
        cmocka_unit_test(test_json_schema_integer_type_has_no_leading_zeros),
        cmocka_unit_test(test_json_schema_boolean_and_null_types),
        cmocka_unit_test(test_json_schema_type_array_is_alternatives),
        cmocka_unit_test(test_json_schema_annotations_are_ignored),
        cmocka_unit_test(test_json_schema_object_with_required_and_optional_property),
        cmocka_unit_test(test_json_schema_object_all_optional_allows_empty_object),
        cmocka_unit_test(test_json_schema_object_keeps_schema_order_around_a_later_required),
        cmocka_unit_test(test_json_schema_object_every_required_property_is_present),
        cmocka_unit_test(test_json_schema_object_many_optional_properties_chain_rest_rules),
        cmocka_unit_test(test_json_schema_additional_properties_false_allows_no_other_key),
        cmocka_unit_test(test_json_schema_additional_properties_true_adds_other_keys_after),
        cmocka_unit_test(test_json_schema_additional_properties_schema_types_other_values),
        cmocka_unit_test(test_json_schema_object_without_properties_takes_any_keys),
        cmocka_unit_test(test_json_schema_nested_objects_get_rules_named_by_path),
        cmocka_unit_test(test_json_schema_rule_names_use_only_letters_digits_and_dashes),
        cmocka_unit_test(test_json_schema_array_of_items),
        cmocka_unit_test(test_json_schema_array_without_items_takes_any_values),
        cmocka_unit_test(test_json_schema_array_min_and_max_items),
        cmocka_unit_test(test_json_schema_array_counts_past_1000_go_by_blocks),
        cmocka_unit_test(test_json_schema_array_prefix_items_tuple),
        cmocka_unit_test(test_json_schema_array_prefix_items_then_any_values_without_items),
        cmocka_unit_test(test_json_schema_nested_arrays_and_objects),
        cmocka_unit_test(test_json_schema_string_min_and_max_length),
        cmocka_unit_test(test_json_schema_string_formats_have_fixed_shapes),
        cmocka_unit_test(test_json_schema_other_formats_are_plain_strings),
        cmocka_unit_test(test_json_schema_integer_lower_bound_zero_or_one),
        cmocka_unit_test(test_json_schema_integer_range_goes_by_length_and_prefix),
        cmocka_unit_test(test_json_schema_enum_strings_are_escaped_twice),
        cmocka_unit_test(test_json_schema_enum_of_any_json_values),
        cmocka_unit_test(test_json_schema_enum_keeps_only_values_of_the_type),
        cmocka_unit_test(test_json_schema_const_is_one_literal),
        cmocka_unit_test(test_json_schema_any_of_is_alternatives),
        cmocka_unit_test(test_json_schema_one_of_is_read_as_any_of),
        cmocka_unit_test(test_json_schema_ref_to_defs_is_a_rule),
        cmocka_unit_test(test_json_schema_recursive_ref_is_a_recursive_rule),
        cmocka_unit_test(test_json_schema_ref_to_root_is_recursion),
        cmocka_unit_test(test_json_schema_left_recursive_ref_is_refused),
        cmocka_unit_test(test_json_schema_unknown_ref_forms_are_refused),
        cmocka_unit_test(test_json_schema_all_of_merges_object_properties),
        cmocka_unit_test(test_json_schema_all_of_one_schema_is_that_schema),
        cmocka_unit_test(test_json_schema_all_of_non_object_parts_are_refused),
        cmocka_unit_test(test_json_schema_pattern_is_refused_with_its_path),
        cmocka_unit_test(test_json_schema_unsupported_keywords_are_refused_by_name),
        cmocka_unit_test(test_json_schema_bounds_on_numbers_and_empty_integer_ranges_are_refused),
        cmocka_unit_test(test_json_schema_format_with_length_is_refused),
        cmocka_unit_test(test_json_schema_invalid_keyword_values_are_refused),
        cmocka_unit_test(test_json_schema_non_object_schemas_are_refused),
        cmocka_unit_test(test_json_schema_unsatisfiable_arrays_are_refused),
        cmocka_unit_test(test_json_schema_combined_combinators_are_refused),
        cmocka_unit_test(test_json_schema_nesting_past_the_bound_is_refused),
        cmocka_unit_test(test_json_schema_ref_chains_through_all_of_are_bounded),
        cmocka_unit_test(test_json_schema_huge_grammar_is_refused),
        cmocka_unit_test(test_json_schema_counts_past_a_million_are_refused),
        cmocka_unit_test(test_json_schema_long_keys_split_the_exclusion_into_rules),
    };
    test_seed_init("test_router_json_schema");
    return cmocka_run_group_tests(tests, NULL, NULL);
}
