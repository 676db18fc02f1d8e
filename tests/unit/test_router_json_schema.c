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

/* A control character in a const or enum string is written as jansson writes it
 * (\u000B, upper-case hex), so that the value's own JSON text is in the grammar. */
static int schema_takes(const char *schema, const char *text);
static void test_json_schema_enum_control_characters_as_jansson_writes_them(void **state)
{
    (void)state;
    json_t *v = json_string("a\x0b" "b\x1f");
    char *text = json_dumps(v, JSON_ENCODE_ANY);
    assert_true(schema_takes("{\"enum\": [\"a\\u000bb\\u001F\"]}", text));
    assert_true(schema_takes("{\"const\": \"a\\u000Bb\\u001f\"}", text));
    free(text);
    json_decref(v);
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
    refused("{\"allOf\": [{\"properties\": {\"a\": {\"not\": {}}}}, {}]}", BL_EINVAL,
            "json_schema: 'not' at /allOf/0/properties/a is not supported");
}

/* --- refusals ------------------------------------------------------------------------ */

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

static void test_json_schema_empty_number_and_integer_ranges_are_refused(void **state)
{
    (void)state;
    refused("{\"type\": \"number\", \"multipleOf\": 0.5}", BL_EINVAL,
            "json_schema: 'multipleOf' at / is not supported on a 'number'");
    refused("{\"type\": \"number\", \"minimum\": 2, \"maximum\": 1.5}", BL_EINVAL,
            "'minimum' at / and 'maximum' leave no number");
    refused("{\"properties\": {\"n\": {\"exclusiveMinimum\": 1, \"maximum\": 1}}}", BL_EINVAL,
            "'exclusiveMinimum' at /properties/n and 'maximum' leave no number");
    refused("{\"type\": \"number\", \"minimum\": 1e-20}", BL_EINVAL,
            "'minimum' at / has more than 16 decimals");
    refused("{\"type\": \"number\", \"minimum\": 1e300}", BL_EINVAL,
            "'minimum' at / leaves no number of at most 16 digits");
    refused("{\"type\": \"number\", \"maximum\": true}", BL_EINVAL,
            "'maximum' at / as a boolean (draft 4) is not supported");
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

/* --- number ranges on the engine -------------------------------------------------- */

static void test_json_schema_number_ranges_take_plain_decimals_in_range(void **state)
{
    (void)state;
    static const struct {
        const char *schema, *yes[8], *no[10];
    } C[] = {
        {"{\"type\": \"number\", \"minimum\": 0, \"maximum\": 1}",
         {"0", "1", "0.5", "0.999", "1.0", "1.000", "0.0", NULL},
         {"1.01", "-0.1", "2", "-0", "-0.0", "1e-3", "01", "1.", ".5", NULL}},
        {"{\"type\": \"number\", \"exclusiveMinimum\": 0, \"exclusiveMaximum\": 1}",
         {"0.0001", "0.5", "0.9999999999999999", NULL},
         {"0", "0.0", "1", "1.0", "1.5", "-0.5", NULL}},
        {"{\"type\": \"number\", \"minimum\": -2.5, \"maximum\": -0.5}",
         {"-2.5", "-1", "-0.5", "-0.75", "-2.50", NULL},
         {"-2.51", "-0.4", "0", "-3", "2", "-0.49", NULL}},
        {"{\"type\": \"number\", \"minimum\": 1.5}",
         {"1.5", "2", "100.25", "9999999999999999.5", NULL},
         {"1.49", "-5", "1", "0.5", "10000000000000000", NULL}},
        {"{\"type\": \"number\", \"exclusiveMaximum\": -0.25}",
         {"-0.26", "-1", "-1000000.125", NULL},
         {"-0.25", "-0.2", "0", "1", NULL}},
        {"{\"type\": [\"integer\", \"number\"], \"minimum\": 0.1, \"maximum\": 0.1}",
         {"0.1", "0.10", NULL},
         {"0.11", "0.09", "0", "1", NULL}},
        {"{\"type\": \"number\", \"minimum\": 3, \"exclusiveMinimum\": 3, \"maximum\": 3.001}",
         {"3.001", "3.0005", NULL},
         {"3", "3.0", "3.0011", "3.002", NULL}},
    };
    for (size_t i = 0; i < sizeof C / sizeof C[0]; i++) {
        for (int j = 0; C[i].yes[j]; j++)
            if (!schema_takes(C[i].schema, C[i].yes[j]))
                fail_msg("%s refuses %s", C[i].schema, C[i].yes[j]);
        for (int j = 0; C[i].no[j]; j++)
            if (schema_takes(C[i].schema, C[i].no[j]))
                fail_msg("%s takes %s", C[i].schema, C[i].no[j]);
    }
}

/* Decimals in millionths (|v| < 10^12): exact, so a reference can compare them. */
static void milli_text(long long v, int frac_digits, int extra_zeros, char *out, size_t cap)
{
    const unsigned long long a = v < 0 ? (unsigned long long)-v : (unsigned long long)v;
    int n = snprintf(out, cap, "%s%llu", v < 0 ? "-" : "", a / 1000000);
    if (frac_digits > 0 || extra_zeros > 0) {
        char f[8];
        (void)snprintf(f, sizeof f, "%06llu", a % 1000000);
        n += snprintf(out + n, cap - (size_t)n, ".%.*s%.*s", frac_digits, f, extra_zeros, "000");
    }
}

/* The fraction digits v needs (0 to 6). */
static int milli_digits(long long v)
{
    long long f = (v < 0 ? -v : v) % 1000000;
    int d = 6;
    while (d > 0 && f % 10 == 0) {
        f /= 10;
        d--;
    }
    return f == 0 ? 0 : d;
}

static void test_json_schema_number_random_ranges(void **state)
{
    (void)state;
    rng_t r = rng_for(2);
    for (int it = 0; it < 300; it++) {
        /* bounds of up to 3 decimals and 4 integer digits, by turns absent, inclusive
         * or exclusive */
        long long b[2];
        for (int k = 0; k < 2; k++) {
            const long long scale[] = {1000000, 100000, 10000, 1000};
            const long long unit = scale[rng_next(&r) % 4];
            b[k] = ((long long)(rng_next(&r) % 20001) - 10000) * unit / 10;
            b[k] -= b[k] % 1000; /* at most 3 decimals */
        }
        if (b[0] > b[1]) {
            const long long t = b[0];
            b[0] = b[1];
            b[1] = t;
        }
        const int has[2] = {(int)(rng_next(&r) % 4 != 0), (int)(rng_next(&r) % 4 != 0)};
        const int ex[2] = {(int)(rng_next(&r) % 2), (int)(rng_next(&r) % 2)};
        if (!has[0] && !has[1])
            continue;
        if (has[0] && has[1] && b[0] == b[1] && (ex[0] || ex[1]))
            continue; /* empty: refused, tested above */
        char schema[256], t0[40], t1[40];
        milli_text(b[0], milli_digits(b[0]), 0, t0, sizeof t0);
        milli_text(b[1], milli_digits(b[1]), 0, t1, sizeof t1);
        int n = snprintf(schema, sizeof schema, "{\"type\": \"number\"");
        if (has[0])
            n += snprintf(schema + n, sizeof schema - (size_t)n, ", \"%s\": %s",
                          ex[0] ? "exclusiveMinimum" : "minimum", t0);
        if (has[1])
            n += snprintf(schema + n, sizeof schema - (size_t)n, ", \"%s\": %s",
                          ex[1] ? "exclusiveMaximum" : "maximum", t1);
        (void)snprintf(schema + n, sizeof schema - (size_t)n, "}");
        rt_grammar_t *gr = grammar_of(schema);
        rt_grammar_match_t *m = NULL;
        bl_err_t err = {0};
        assert_int_equal(rt_grammar_match_create(&m, gr, &err), 0);
        for (int k = 0; k < 80; k++) {
            long long v;
            const long long near = b[rng_next(&r) % 2];
            const long long steps[] = {0, 1, 1000, 10000, 100000, 1000000};
            switch (rng_next(&r) % 3) {
            case 0: v = near; break;
            case 1:
                v = near + (rng_next(&r) % 2 ? 1 : -1) * steps[rng_next(&r) % 6] *
                               (long long)(1 + rng_next(&r) % 3);
                break;
            default: v = ((long long)(rng_next(&r) % 24001) - 12000) * 1000000 / 10 + (long long)(rng_next(&r) % 7);
            }
            const int want = (!has[0] || (ex[0] ? v > b[0] : v >= b[0])) &&
                             (!has[1] || (ex[1] ? v < b[1] : v <= b[1]));
            char text[48];
            milli_text(v, milli_digits(v), (int)(rng_next(&r) % 3), text, sizeof text);
            if (takes(m, text) != want)
                fail_msg("%s: %s is %s", schema, text, want ? "refused" : "taken");
            if (v == 0 && takes(m, "-0"))
                fail_msg("%s takes -0", schema);
        }
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

/* --- string patterns ---------------------------------------------------------------- */

/* The schema {"type": "string", "pattern": re} as JSON text; a static buffer. */
static const char *pattern_schema(const char *re)
{
    static char buf[1 << 14];
    json_t *s = json_pack("{s:s, s:s}", "type", "string", "pattern", re);
    assert_non_null(s);
    char *text = json_dumps(s, JSON_COMPACT);
    json_decref(s);
    assert_non_null(text);
    assert_true(strlen(text) < sizeof buf);
    strcpy(buf, text);
    free(text);
    return buf;
}

/* Whether the grammar of pattern re takes the JSON text json. */
static int pattern_takes(const char *re, const char *json)
{
    return schema_takes(pattern_schema(re), json);
}

static void test_json_schema_pattern_grammar_text(void **state)
{
    (void)state;
    char *g = gbnf(pattern_schema("^[A-Z]{3}-\\d+$"));
    assert_string_equal(g, "root ::= \"\\\"\" [A-Z]{3} \"-\" [0-9]+ \"\\\"\"\n");
    free(g);
    g = gbnf(pattern_schema("ab"));
    assert_string_equal(rule(g, "root"), "\"\\\"\" char* \"ab\" char* \"\\\"\"");
    assert_has(g, R_CHAR);
    free(g);
    g = gbnf(pattern_schema("^$"));
    assert_string_equal(g, "root ::= \"\\\"\" \"\\\"\"\n");
    free(g);
    g = gbnf("{\"pattern\": \"^x$\", \"title\": \"a string by its keyword\"}");
    assert_string_equal(rule(g, "root"), "\"\\\"\" \"x\" \"\\\"\"");
    free(g);
}

static void test_json_schema_pattern_anchored_runs_on_the_engine(void **state)
{
    (void)state;
    assert_true(pattern_takes("^[A-Z]{3}$", "\"ABC\""));
    assert_false(pattern_takes("^[A-Z]{3}$", "\"AB\""));
    assert_false(pattern_takes("^[A-Z]{3}$", "\"abcd\""));
    assert_false(pattern_takes("^[A-Z]{3}$", "\"ABCD\""));
    assert_true(pattern_takes("^\\d{4}-\\d{2}-\\d{2}$", "\"2026-01-31\""));
    assert_false(pattern_takes("^\\d{4}-\\d{2}-\\d{2}$", "\"2026-1-31\""));
    assert_false(pattern_takes("^\\d{4}-\\d{2}-\\d{2}$", "\"x2026-01-31\""));
    static const char alt[] = "^(foo|ba(r|z))+$";
    assert_true(pattern_takes(alt, "\"foo\""));
    assert_true(pattern_takes(alt, "\"barfoobaz\""));
    assert_false(pattern_takes(alt, "\"\""));
    assert_false(pattern_takes(alt, "\"bax\""));
    assert_false(pattern_takes(alt, "\"foob\""));
    assert_true(pattern_takes("^(?:ab){1,2}c{2,}$", "\"ababccc\""));
    assert_false(pattern_takes("^(?:ab){1,2}c{2,}$", "\"abababcc\""));
    assert_false(pattern_takes("^(?:ab){1,2}c{2,}$", "\"abc\""));
    assert_true(pattern_takes("^a+?b??$", "\"aa\"")); /* lazy: the same language */
    assert_true(pattern_takes("^$", "\"\""));
    assert_false(pattern_takes("^$", "\"a\""));
    /* anchors per top-level alternative */
    assert_true(pattern_takes("^a$|b", "\"a\""));
    assert_true(pattern_takes("^a$|b", "\"xbx\""));
    assert_false(pattern_takes("^a$|b", "\"ax\""));
    /* no '^': anything before; no '$': anything after */
    assert_true(pattern_takes("^ab", "\"abc\\\"\""));
    assert_false(pattern_takes("^ab", "\"cab\""));
    assert_true(pattern_takes("ab$", "\"\\ncab\""));
    assert_false(pattern_takes("ab$", "\"abc\""));
}

static void test_json_schema_pattern_unanchored_matches_anywhere(void **state)
{
    (void)state;
    assert_true(pattern_takes("ab", "\"xxabyy\""));
    assert_true(pattern_takes("ab", "\"ab\""));
    assert_true(pattern_takes("ab", "\"\\\"ab\\\\\""));
    assert_false(pattern_takes("ab", "\"xyz\""));
    assert_false(pattern_takes("ab", "\"a\\nb\""));
    assert_true(pattern_takes("", "\"anything\""));
    assert_true(pattern_takes("", "\"\""));
    assert_true(pattern_takes("a|", "\"x\""));
}

static void test_json_schema_pattern_classes_and_escapes(void **state)
{
    (void)state;
    assert_true(pattern_takes("^[a-c_\\d]+$", "\"a_9c\""));
    assert_false(pattern_takes("^[a-c_\\d]+$", "\"a-9\""));
    assert_true(pattern_takes("^[^a-c]$", "\"d\""));
    assert_true(pattern_takes("^[^a-c]$", "\"\xc3\xa9\""));
    assert_false(pattern_takes("^[^a-c]$", "\"b\""));
    assert_true(pattern_takes("^\\w\\W\\s\\S$", "\"_- x\""));
    assert_true(pattern_takes("^\\w\\W\\s\\S$", "\"a!\\t\\\"\""));
    assert_false(pattern_takes("^\\w\\W\\s\\S$", "\"a1 x\""));
    assert_true(pattern_takes("^[\\s\\d]+$", "\"1 \\n2\""));
    assert_true(pattern_takes("^\\D$", "\"x\""));
    assert_false(pattern_takes("^\\D$", "\"7\""));
    assert_true(pattern_takes("^\\.\\/\\*\\(\\)\\[\\]\\{\\}\\?\\+\\|\\^\\$\\-$", "\"./*()[]{}?+|^$-\""));
    assert_false(pattern_takes("^\\.$", "\"x\""));
    assert_true(pattern_takes("^\\x41\\u00e9\\t$", "\"A\xc3\xa9\\t\""));
    assert_true(pattern_takes("^\\uD83D\\uDE00$", "\"\xf0\x9f\x98\x80\""));
    assert_true(pattern_takes("^[\\b\\-]+$", "\"-\\b\""));
    assert_true(pattern_takes("^a]}$", "\"a]}\""));
    /* '.' takes any character but a line break, written as JSON writes it */
    assert_true(pattern_takes("^.$", "\"x\""));
    assert_true(pattern_takes("^.$", "\"\\t\""));
    assert_true(pattern_takes("^.$", "\"\\u0001\""));
    assert_true(pattern_takes("^.$", "\"\\\"\""));
    assert_false(pattern_takes("^.$", "\"\\n\""));
    assert_false(pattern_takes("^.$", "\"\\r\""));
    assert_false(pattern_takes("^.$", "\"\xe2\x80\xa8\""));
    assert_true(pattern_takes("^[^]$", "\"\\n\""));
    assert_true(pattern_takes("^\\n\\r$", "\"\\n\\r\""));
    assert_false(pattern_takes("^\\n$", "\"n\""));
}

static void test_json_schema_pattern_quote_and_backslash_are_json_escapes(void **state)
{
    (void)state;
    /* the regex a"b\c takes the value a"b\c, whose JSON text is "a\"b\\c" */
    assert_true(pattern_takes("^a\"b\\\\c$", "\"a\\\"b\\\\c\""));
    assert_false(pattern_takes("^a\"b\\\\c$", "\"a\"b\\c\""));
    assert_true(pattern_takes("^[\"\\\\]{2}$", "\"\\\"\\\\\""));
    assert_false(pattern_takes("^[\"\\\\]{2}$", "\"\\\"\""));
    assert_true(pattern_takes("^[^a]+$", "\"\\\\\\\"\\n\\u001f\""));
    assert_false(pattern_takes("^[^a]+$", "\"\\\\a\""));
    assert_true(pattern_takes("^\\\\d$", "\"\\\\d\""));
    assert_false(pattern_takes("^\\\\d$", "\"\\\\1\""));
    char *g = gbnf(pattern_schema("^[^a]$"));
    assert_string_equal(rule(g, "root"),
                        "\"\\\"\" ( [^\\x00-\\x1F\\\"\\\\a\\uD800-\\uDFFF] | \"\\\\\" "
                        "[\\\"\\\\bfnrt] | \"\\\\u000\" [0-7bef] | \"\\\\u001\" [0-9a-f] ) \"\\\"\"");
    free(g);
}

static void test_json_schema_pattern_repeated_empty_parts(void **state)
{
    (void)state;
    /* a repeated part that can match nothing repeats its non-empty matches, since the
     * engine refuses a repetition of what can be empty */
    assert_true(pattern_takes("^(a*)*$", "\"\""));
    assert_true(pattern_takes("^(a*)*$", "\"aaa\""));
    assert_true(pattern_takes("^(a?b?)+c$", "\"abbac\""));
    assert_true(pattern_takes("^(a?b?)+c$", "\"c\""));
    assert_false(pattern_takes("^(a?b?)+c$", "\"abd\""));
    assert_true(pattern_takes("^(a|()|b{0})*x$", "\"aax\""));
    assert_true(pattern_takes("^(){3}x{0}$", "\"\""));
    assert_true(pattern_takes("^(a{0,2}b?){2,5}$", "\"aabaab\""));
}

static void test_json_schema_pattern_unsupported_parts_are_refused(void **state)
{
    (void)state;
    static const struct {
        const char *re, *want;
    } BAD[] = {
        {"^a(?=b)", "a lookahead '(?=', which is not supported (at offset 2)"},
        {"a(?!b)", "a negative lookahead"},
        {"(?<=a)b", "a lookbehind"},
        {"(?<n>a)", "a named group"},
        {"(?i)a", "flags"},
        {"(a)\\1", "a backreference '\\1'"},
        {"\\bword", "a word boundary '\\b'"},
        {"a^b", "an anchor '^' inside it"},
        {"a$b", "an anchor '$' inside it"},
        {"(^a)", "an anchor '^' inside it"},
        {"(a$)", "an anchor '$' inside it"},
        {"*a", "a quantifier '*' with nothing to repeat"},
        {"a**", "a quantifier '*' with nothing to repeat"},
        {"a{2,1}", "{m,n} with n below m"},
        {"a{x}", "a '{' that is not a quantifier"},
        {"[b-a]", "a range out of order"},
        {"[]", "a class that matches no character"},
        {"[a-\\d]", "a range with a class escape"},
        {"[ab", "a class '[' without its ']'"},
        {"(ab", "a group '(' without its ')'"},
        {"ab)", "a ')' without its '('"},
        {"\\p{L}", "the escape '\\p'"},
        {"\\uD800", "a lone surrogate"},
        {"\\x4", "'\\x' without 2 hex digits"},
        {"a\\", "ends with a lone '\\'"},
    };
    for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++) {
        char want[256];
        (void)snprintf(want, sizeof want, "json_schema: 'pattern' at / has %s", BAD[i].want);
        refused(pattern_schema(BAD[i].re), BL_EINVAL, BAD[i].want);
        refused(pattern_schema(BAD[i].re), BL_EINVAL, "json_schema: 'pattern' at / ");
    }
    refused("{\"properties\": {\"a\": {\"type\": \"string\", \"pattern\": \"(?=x)\"}}}", BL_EINVAL,
            "json_schema: 'pattern' at /properties/a has a lookahead '(?='");
    refused("{\"type\": \"string\", \"pattern\": \"^a$\", \"maxLength\": 3}", BL_EINVAL,
            "'pattern' at / cannot be combined with 'maxLength'");
    refused("{\"type\": \"string\", \"pattern\": \"^a$\", \"format\": \"date\"}", BL_EINVAL,
            "'pattern' at / cannot be combined with 'format'");
    refused("{\"type\": \"string\", \"pattern\": 3}", BL_EINVAL, "'pattern' at / must be a string");
    refused("{\"enum\": [\"a\"], \"pattern\": \"a\"}", BL_EINVAL, "'pattern' at / beside 'enum'");
}

static void test_json_schema_pattern_bounds_are_refused(void **state)
{
    (void)state;
    refused(pattern_schema("^a{1001}$"), BL_ERANGE, "'pattern' at / has a count over 1000");
    refused(pattern_schema("^a{2,1001}$"), BL_ERANGE, "has a count over 1000");
    refused(pattern_schema("^a{99999999999999999999}$"), BL_ERANGE, "has a count over 1000");
    assert_true(pattern_takes("^a{0,1000}$", "\"aaaa\""));
    char re[8192];
    memset(re, 'a', 4097);
    re[4097] = '\0';
    refused(pattern_schema(re), BL_ERANGE, "'pattern' at / is longer than 4096 bytes");
    memset(re, 'a', 4096);
    re[4096] = '\0';
    char *g = gbnf(pattern_schema(re));
    free(g);
    size_t n = 0;
    for (int i = 0; i < 65; i++)
        re[n++] = '(';
    re[n++] = 'a';
    for (int i = 0; i < 65; i++)
        re[n++] = ')';
    re[n] = '\0';
    refused(pattern_schema(re), BL_ERANGE, "'pattern' at / nests groups deeper than 64");
    re[n - 1] = '\0'; /* 64 deep */
    assert_true(pattern_takes(re + 1, "\"a\""));
}

/* A reference matcher for the random test's patterns (ASCII; literals, '.', classes
 * with ranges and '^', \d, groups, '|', * + ? {m,n}; anchors are the caller's). For a
 * node and the positions it may start at (bit i: after i characters) it gives the
 * positions it may end at. */
typedef struct {
    char type; /* 'c' a class, 's' a sequence, 'a' alternatives, 'r' a repetition */
    unsigned char in[128];
    int kid[32], n, min, max; /* max -1: no limit */
} ref_node_t;

static ref_node_t g_ref[512];
static int g_nref;
static const char *g_rp;

static int ref_new(char type)
{
    assert_true(g_nref < (int)(sizeof g_ref / sizeof g_ref[0]));
    memset(&g_ref[g_nref], 0, sizeof g_ref[0]);
    g_ref[g_nref].type = type;
    return g_nref++;
}

static int ref_alt(void);

static int ref_atom(void)
{
    const char ch = *g_rp++;
    if (ch == '(') {
        if (g_rp[0] == '?' && g_rp[1] == ':')
            g_rp += 2;
        const int a = ref_alt();
        assert_int_equal(*g_rp++, ')');
        return a;
    }
    const int id = ref_new('c');
    unsigned char *in = g_ref[id].in;
    if (ch == '.') {
        memset(in, 1, 128);
        in['\n'] = in['\r'] = 0;
    } else if (ch == '[') {
        const int neg = *g_rp == '^';
        g_rp += neg;
        while (*g_rp != ']') {
            unsigned char lo = (unsigned char)*g_rp++;
            if (lo == '\\' && *g_rp == 'd') {
                g_rp++;
                memset(in + '0', 1, 10);
                continue;
            }
            if (lo == '\\')
                lo = *g_rp == 'n' ? (g_rp++, '\n') : (unsigned char)*g_rp++;
            unsigned char hi = lo;
            if (g_rp[0] == '-' && g_rp[1] != ']') {
                hi = (unsigned char)g_rp[1];
                g_rp += 2;
            }
            for (unsigned c = lo; c <= hi; c++)
                in[c] = 1;
        }
        g_rp++;
        for (int c = 0; neg && c < 128; c++)
            in[c] = !in[c];
    } else if (ch == '\\' && *g_rp == 'd') {
        g_rp++;
        memset(in + '0', 1, 10);
    } else {
        in[(unsigned char)(ch == '\\' ? *g_rp++ : ch)] = 1;
    }
    return id;
}

static int ref_seq(void)
{
    const int id = ref_new('s');
    while (*g_rp && *g_rp != '|' && *g_rp != ')') {
        int a = ref_atom();
        if (*g_rp == '*' || *g_rp == '+' || *g_rp == '?' || *g_rp == '{') {
            const int r = ref_new('r');
            g_ref[r].kid[0] = a;
            g_ref[r].min = *g_rp == '+';
            g_ref[r].max = *g_rp == '?' ? 1 : -1;
            if (*g_rp == '{') {
                char *end;
                g_ref[r].min = g_ref[r].max = (int)strtol(g_rp + 1, &end, 10);
                if (*end == ',')
                    g_ref[r].max = end[1] == '}' ? -1 : (int)strtol(end + 1, &end, 10);
                g_rp = strchr(g_rp, '}');
            }
            g_rp++;
            a = r;
        }
        assert_true(g_ref[id].n < 32);
        g_ref[id].kid[g_ref[id].n++] = a;
    }
    return id;
}

static int ref_alt(void)
{
    const int id = ref_new('a');
    do {
        assert_true(g_ref[id].n < 32);
        g_ref[id].kid[g_ref[id].n++] = ref_seq();
    } while (*g_rp == '|' && g_rp++);
    return id;
}

static uint64_t ref_run(int id, const char *t, size_t len, uint64_t from)
{
    const ref_node_t *nd = &g_ref[id];
    uint64_t to = 0;
    switch (nd->type) {
    case 'c':
        for (size_t i = 0; i < len; i++)
            if ((from >> i & 1) && nd->in[(unsigned char)t[i] & 127])
                to |= 1ull << (i + 1);
        return to;
    case 's':
        for (int k = 0; k < nd->n; k++)
            from = ref_run(nd->kid[k], t, len, from);
        return from;
    case 'a':
        for (int k = 0; k < nd->n; k++)
            to |= ref_run(nd->kid[k], t, len, from);
        return to;
    default: {
        /* past min + len rounds an unbounded repetition reaches nothing new */
        const int last = nd->max >= 0 ? nd->max : nd->min + (int)len + 1;
        to = nd->min == 0 ? from : 0;
        for (int k = 1; k <= last && from; k++) {
            from = ref_run(nd->kid[0], t, len, from);
            if (k >= nd->min)
                to |= from;
        }
        return to;
    }
    }
}

/* Whether pattern re (optionally ^ at its start, $ at its end) matches t. */
static int ref_matches(const char *re, const char *t)
{
    char body[256];
    const size_t len = strlen(t), rlen = strlen(re);
    const int a0 = re[0] == '^', a1 = rlen > 0 && re[rlen - 1] == '$';
    assert_true(rlen < sizeof body && len < 63);
    memcpy(body, re + a0, rlen - (size_t)a0 - (size_t)a1);
    body[rlen - (size_t)a0 - (size_t)a1] = '\0';
    g_nref = 0;
    g_rp = body;
    const int root = ref_alt();
    assert_int_equal(*g_rp, '\0');
    const uint64_t all = len == 63 ? ~0ull : (2ull << len) - 1;
    const uint64_t ends = ref_run(root, t, len, a0 ? 1 : all);
    return a1 ? (int)(ends >> len & 1) : ends != 0;
}

static void test_json_schema_pattern_random_texts_agree_with_a_reference(void **state)
{
    (void)state;
    static const char *const RES[] = {
        "^(a|b-)*1?$", "a+b",          "^[ab]{2,3}$",      "^[^a-]*$",
        "(ab|a)\\d",   "^.{1,3}$",     "^[\"\\\\]+a",      "b$",
        "^(a?b?){2}-$", "^(a*|b)+$",   "^$",               "^(?:\\d|[^\\d\\n])?\\\\$",
        "-.-",         "^([a\\-\"]{0,2}b|1)$", "^(a|ab)(c|bcd)?(d*)$",
    };
    static const char ALPHABET[] = "ab-1\"\\\ncd";
    rng_t r = rng_for(2);
    for (size_t p = 0; p < sizeof RES / sizeof RES[0]; p++) {
        const char *schema = pattern_schema(RES[p]);
        char *g = gbnf(schema);
        rt_grammar_t *gr = NULL;
        bl_err_t err = {0};
        if (rt_grammar_parse(&gr, g, strlen(g), &err))
            fail_msg("the engine refuses the grammar of %s: %s\n%s", RES[p], err.msg, g);
        for (int n = 0; n < 300; n++) {
            char t[16], json[64];
            const size_t len = rng_next(&r) % 9;
            for (size_t i = 0; i < len; i++)
                t[i] = ALPHABET[rng_next(&r) % (sizeof ALPHABET - 1)];
            t[len] = '\0';
            size_t k = 0;
            json[k++] = '"';
            for (size_t i = 0; i < len; i++) {
                if (t[i] == '"' || t[i] == '\\' || t[i] == '\n')
                    json[k++] = '\\';
                json[k++] = t[i] == '\n' ? 'n' : t[i];
            }
            json[k++] = '"';
            json[k] = '\0';
            rt_grammar_match_t *m = NULL;
            assert_int_equal(rt_grammar_match_create(&m, gr, &err), 0);
            const int got = rt_grammar_match_feed(m, json, k) == 0 && rt_grammar_match_done(m);
            rt_grammar_match_destroy(m);
            const int want = ref_matches(RES[p], t);
            if (got != want)
                fail_msg("pattern %s on %s: the grammar says %d, the reference %d (seed %llu)\n%s",
                         RES[p], json, got, want, (unsigned long long)g_seed, g);
        }
        rt_grammar_destroy(gr);
        free(g);
    }
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
        cmocka_unit_test(test_json_schema_enum_control_characters_as_jansson_writes_them),
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
        cmocka_unit_test(test_json_schema_unsupported_keywords_are_refused_by_name),
        cmocka_unit_test(test_json_schema_empty_number_and_integer_ranges_are_refused),
        cmocka_unit_test(test_json_schema_number_ranges_take_plain_decimals_in_range),
        cmocka_unit_test(test_json_schema_number_random_ranges),
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
        cmocka_unit_test(test_json_schema_pattern_grammar_text),
        cmocka_unit_test(test_json_schema_pattern_anchored_runs_on_the_engine),
        cmocka_unit_test(test_json_schema_pattern_unanchored_matches_anywhere),
        cmocka_unit_test(test_json_schema_pattern_classes_and_escapes),
        cmocka_unit_test(test_json_schema_pattern_quote_and_backslash_are_json_escapes),
        cmocka_unit_test(test_json_schema_pattern_repeated_empty_parts),
        cmocka_unit_test(test_json_schema_pattern_unsupported_parts_are_refused),
        cmocka_unit_test(test_json_schema_pattern_bounds_are_refused),
        cmocka_unit_test(test_json_schema_pattern_random_texts_agree_with_a_reference),
    };
    test_seed_init("test_router_json_schema");
    return cmocka_run_group_tests(tests, NULL, NULL);
}
