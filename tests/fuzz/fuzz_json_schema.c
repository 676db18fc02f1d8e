/* libFuzzer target for router/json_schema.c on its own: the converter of the
 * `json_schema` and `response_format` request fields to GBNF.
 *
 * Input: a JSON schema document (any JSON text; other bytes are skipped). A custom
 * mutator keeps most inputs schemas: it parses the input, then sets a schema keyword
 * to a value of the kind that keyword takes, deletes a member, copies one subschema
 * over another or wraps one in anyOf/allOf, and writes the document back; the rest
 * of the time, and for inputs that do not parse, libFuzzer's byte mutations run.
 *
 * Invariants beside the sanitizers':
 *   - every grammar the converter writes compiles with router/grammar.c, is at most
 *     RT_JSON_SCHEMA_MAX_GBNF bytes, and comes out the same from a second conversion;
 *   - the schema is only read: it is equal to a copy taken before;
 *   - a refusal is BL_EINVAL, BL_ERANGE or BL_ENOMEM with no grammar, and its message
 *     names the problem: "json_schema: 'KEYWORD' at PATH ...", "json_schema: the
 *     schema at PATH ..." or one of the converter's whole-schema messages;
 *   - when the root is {"const": V} or {"enum": [...]}, the grammar accepts V (each
 *     member) written compactly by jansson, unless it holds a real (whose spelling
 *     the converter chooses).
 * Seeds: tests/fuzz/corpus/fuzz_json_schema/. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar.h"
#include "json_schema.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed);
size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size);

static void check(int ok, const char *what, const char *detail)
{
    if (!ok) {
        fprintf(stderr, "fuzz_json_schema: %s\n%s\n", what, detail ? detail : "");
        abort();
    }
}

// --- the target ---------------------------------------------------------------------------

/* The grammar g accepts text to its end. */
static int accepts_whole(const rt_grammar_t *g, const char *text)
{
    rt_grammar_match_t *m = NULL;
    bl_err_t err;
    if (rt_grammar_match_create(&m, g, &err))
        return -1; /* a start past the matcher's bounds: nothing to say */
    int ok = rt_grammar_match_feed(m, text, strlen(text)) == 0 && rt_grammar_match_done(m);
    rt_grammar_match_destroy(m);
    return ok;
}

/* v holds a real: the converter spells a number its own way (json_schema.h), so
 * jansson's spelling of it may rightly be refused. */
static int has_real(const json_t *v)
{
    if (json_is_real(v))
        return 1;
    size_t i;
    const char *k;
    json_t *x;
    if (json_is_array(v))
        json_array_foreach(v, i, x)
            if (has_real(x))
                return 1;
    if (json_is_object(v))
        json_object_foreach((json_t *)v, k, x)
            if (has_real(x))
                return 1;
    return 0;
}

static void check_instance(const rt_grammar_t *g, const json_t *v, const char *gbnf)
{
    if (has_real(v))
        return;
    char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!text)
        return;
    int ok = accepts_whole(g, text);
    if (ok == 0) {
        fprintf(stderr, "instance: %s\n", text);
        check(0, "the grammar refuses a value the schema's const or enum lists", gbnf);
    }
    free(text);
}

static int refusal_named(const bl_err_t *err)
{
    static const char prefix[] = "json_schema: ";
    const char *m = err->msg;
    if (strncmp(m, prefix, sizeof prefix - 1) != 0)
        return 0;
    m += sizeof prefix - 1;
    if (m[0] == '\'')
        return strstr(m + 1, "' at ") != NULL;
    return !strncmp(m, "the schema at ", 14) || !strcmp(m, "out of memory") ||
           !strncmp(m, "the grammar would be larger than ", 33);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_error_t je;
    json_t *schema = json_loadb((const char *)data, size, JSON_DECODE_ANY, &je);
    if (!schema)
        return 0;
    json_t *copy = json_deep_copy(schema);
    char *gbnf = NULL;
    bl_err_t err = {0};
    int rc = rt_json_schema_to_gbnf(schema, &gbnf, &err);
    check(json_equal(schema, copy), "the converter changed the schema", NULL);
    if (rc == 0) {
        check(gbnf != NULL, "success without a grammar", NULL);
        size_t len = strlen(gbnf);
        check(len <= RT_JSON_SCHEMA_MAX_GBNF, "a grammar over the limit", NULL);
        rt_grammar_t *g = NULL;
        bl_err_t gerr = {0};
        if (rt_grammar_parse(&g, gbnf, len, &gerr) != 0) {
            fprintf(stderr, "%s\n", gerr.msg);
            check(0, "a converted schema does not compile", gbnf);
        }
        char *again = NULL;
        check(rt_json_schema_to_gbnf(schema, &again, &err) == 0 && !strcmp(gbnf, again),
              "a second conversion writes another grammar", gbnf);
        free(again);
        const json_t *c = json_is_object(schema) ? json_object_get(schema, "const") : NULL;
        const json_t *e = json_is_object(schema) ? json_object_get(schema, "enum") : NULL;
        if (json_object_size(schema) == 1 && c)
            check_instance(g, c, gbnf);
        if (json_object_size(schema) == 1 && json_is_array(e))
            for (size_t i = 0; i < json_array_size(e); i++)
                check_instance(g, json_array_get(e, i), gbnf);
        rt_grammar_destroy(g);
        free(gbnf);
    } else {
        check(gbnf == NULL, "a refusal left a grammar", NULL);
        check(rc == BL_EINVAL || rc == BL_ERANGE || rc == BL_ENOMEM, "an undocumented code",
              err.msg);
        check(err.code == rc, "the message's code is not the one returned", err.msg);
        check(refusal_named(&err), "a refusal does not name the problem", err.msg);
    }
    json_decref(copy);
    json_decref(schema);
    return 0;
}

// --- the mutator --------------------------------------------------------------------------

static uint32_t rng_next(uint32_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 17;
    *s ^= *s << 5;
    return *s;
}

static uint32_t pick(uint32_t *s, uint32_t n)
{
    return n ? rng_next(s) % n : 0;
}

static const char *const keywords[] = {
    "type", "properties", "required", "additionalProperties", "items", "prefixItems",
    "minItems", "maxItems", "minLength", "maxLength", "pattern", "format", "enum", "const",
    "anyOf", "oneOf", "allOf", "$ref", "$defs", "definitions", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "not", "if", "then", "else",
    "patternProperties", "propertyNames", "minProperties", "maxProperties", "uniqueItems",
    "contains", "additionalItems", "unevaluatedProperties", "title", "description", "default",
    "nullable", "$schema", "$id", "dependentRequired",
};
#define N_KEYWORDS (sizeof keywords / sizeof *keywords)

static const char *const types[] = {"object", "array", "string", "number", "integer",
                                    "boolean", "null", "any", ""};
static const char *const formats[] = {"date", "time", "date-time", "uuid", "email", "uri",
                                      "ipv4", "hostname", ""};
static const char *const patterns[] = {
    "^[a-z]+$", "^\\d{3}-\\d{4}$", "a|b|c", "(ab)*c?", "^(?:x|y){2,5}$", "[^\"\\\\]+",
    "\\w+@\\w+\\.com", "^.{0,1000}$", "(((a)))", "[\\u00e9-\\u00ff]", "\\x41+", "^$", "(?=a)",
    "a{1001}", "[z-a]", "\\b", "^(\\s|\\S)*$", "[\\d\\D]{2,}", "\\uD83D\\uDE00",
};
static const double numbers[] = {0, 1, -1, 0.5, -0.5, 2.25, 15, 16, 17, 999, 1000, 1001, 1e15,
                                 1e16, 1e17, 9007199254740993.0, -9223372036854775808.0,
                                 9223372036854775807.0, 1e308, -1e308, 3.0000001};
static const json_int_t ints[] = {0, 1, 2, 3, 10, 64, 999, 1000, 1001, 100000, -1, -7,
                                  INT64_MAX, INT64_MIN};

/* Every object and array of v, depth first (at most cap). */
static void collect(json_t *v, json_t **nodes, size_t *n, size_t cap)
{
    if (*n >= cap || !(json_is_object(v) || json_is_array(v)))
        return;
    nodes[(*n)++] = v;
    if (json_is_object(v)) {
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x)
            collect(x, nodes, n, cap);
    } else {
        size_t i;
        json_t *x;
        json_array_foreach(v, i, x)
            collect(x, nodes, n, cap);
    }
}

/* A member name of some object in nodes, or a fresh one. */
static const char *some_name(json_t **nodes, size_t n, uint32_t *s)
{
    static const char *const names[] = {"a", "b", "name", "x-y", "root", "a b", "\"q\"", ""};
    for (int tries = 0; tries < 4 && n; tries++) {
        json_t *o = nodes[pick(s, (uint32_t)n)];
        size_t k = json_object_size(o);
        if (!k)
            continue;
        size_t want = pick(s, (uint32_t)k), i = 0;
        const char *key;
        json_t *x;
        json_object_foreach(o, key, x)
            if (i++ == want)
                return key;
    }
    return names[pick(s, sizeof names / sizeof *names)];
}

static json_t *small_schema(uint32_t *s, int depth);

/* A value of the kind keyword kw takes (or, now and then, another kind). */
static json_t *value_for(const char *kw, json_t **nodes, size_t n, uint32_t *s, int depth)
{
    if (pick(s, 10) == 0) { /* a wrong kind */
        switch (pick(s, 5)) {
        case 0: return json_null();
        case 1: return json_true();
        case 2: return json_string(types[pick(s, sizeof types / sizeof *types)]);
        case 3: return json_integer(ints[pick(s, sizeof ints / sizeof *ints)]);
        default: return json_array();
        }
    }
    if (!strcmp(kw, "type")) {
        if (pick(s, 4) == 0) {
            json_t *a = json_array();
            for (uint32_t i = 0, k = 1 + pick(s, 3); i < k; i++)
                json_array_append_new(a, json_string(types[pick(s, 7)]));
            return a;
        }
        return json_string(types[pick(s, sizeof types / sizeof *types)]);
    }
    if (!strcmp(kw, "format"))
        return json_string(formats[pick(s, sizeof formats / sizeof *formats)]);
    if (!strcmp(kw, "pattern"))
        return json_string(patterns[pick(s, sizeof patterns / sizeof *patterns)]);
    if (!strcmp(kw, "$ref")) {
        char ref[96];
        switch (pick(s, 4)) {
        case 0: return json_string("#");
        case 1: snprintf(ref, sizeof ref, "#/properties/%s", some_name(nodes, n, s)); break;
        case 2: snprintf(ref, sizeof ref, "#/definitions/%s", some_name(nodes, n, s)); break;
        default: snprintf(ref, sizeof ref, "#/$defs/%s", some_name(nodes, n, s)); break;
        }
        return json_string(ref);
    }
    if (!strcmp(kw, "required")) {
        json_t *a = json_array();
        for (uint32_t i = 0, k = pick(s, 4); i < k; i++)
            json_array_append_new(a, json_string(some_name(nodes, n, s)));
        return a;
    }
    if (!strcmp(kw, "properties") || !strcmp(kw, "$defs") || !strcmp(kw, "definitions") ||
        !strcmp(kw, "patternProperties") || !strcmp(kw, "dependentRequired")) {
        json_t *o = json_object();
        for (uint32_t i = 0, k = 1 + pick(s, 3); i < k; i++)
            json_object_set_new(o, some_name(nodes, n, s), small_schema(s, depth + 1));
        return o;
    }
    if (!strcmp(kw, "anyOf") || !strcmp(kw, "oneOf") || !strcmp(kw, "allOf") ||
        !strcmp(kw, "prefixItems")) {
        json_t *a = json_array();
        for (uint32_t i = 0, k = pick(s, 4); i < k; i++)
            json_array_append_new(a, small_schema(s, depth + 1));
        return a;
    }
    if (!strcmp(kw, "enum")) {
        json_t *a = json_array();
        for (uint32_t i = 0, k = pick(s, 4); i < k; i++)
            json_array_append_new(a, value_for("const", nodes, n, s, depth + 1));
        return a;
    }
    if (!strcmp(kw, "const") || !strcmp(kw, "default")) {
        switch (pick(s, 7)) {
        case 0: return json_string(some_name(nodes, n, s));
        case 1: return json_real(numbers[pick(s, sizeof numbers / sizeof *numbers)]);
        case 2: return json_integer(ints[pick(s, sizeof ints / sizeof *ints)]);
        case 3: return json_pack("{s:[i,s,n]}", some_name(nodes, n, s), 1, "\"\\\n\xc3\xa9");
        case 4: return json_boolean(pick(s, 2));
        case 5: return json_null();
        default: return json_string("a\"b\\c\n\t\x01\xe2\x82\xac");
        }
    }
    if (!strncmp(kw, "min", 3) || !strncmp(kw, "max", 3))
        return pick(s, 2) ? json_integer(ints[pick(s, sizeof ints / sizeof *ints)])
                          : json_real(numbers[pick(s, sizeof numbers / sizeof *numbers)]);
    if (!strncmp(kw, "exclusive", 9) || !strcmp(kw, "multipleOf")) {
        if (pick(s, 5) == 0)
            return json_boolean(pick(s, 2)); /* draft 4's form */
        return pick(s, 2) ? json_integer(ints[pick(s, sizeof ints / sizeof *ints)])
                          : json_real(numbers[pick(s, sizeof numbers / sizeof *numbers)]);
    }
    if (!strcmp(kw, "additionalProperties") || !strcmp(kw, "items") ||
        !strcmp(kw, "uniqueItems") || !strcmp(kw, "nullable") ||
        !strcmp(kw, "unevaluatedProperties") || !strcmp(kw, "additionalItems"))
        return pick(s, 2) ? json_boolean(pick(s, 2)) : small_schema(s, depth + 1);
    if (!strcmp(kw, "title") || !strcmp(kw, "description") || !strncmp(kw, "$", 1))
        return json_string("t");
    return small_schema(s, depth + 1);
}

static json_t *small_schema(uint32_t *s, int depth)
{
    json_t *o = json_object();
    if (depth > 3)
        return o;
    for (uint32_t i = 0, k = pick(s, 3); i < k; i++) {
        const char *kw = keywords[pick(s, N_KEYWORDS)];
        json_object_set_new(o, kw, value_for(kw, NULL, 0, s, depth));
    }
    return o;
}

/* One structural change to doc; 0 when there was nothing to change. */
static int mutate_doc(json_t *doc, uint32_t *s)
{
    json_t *nodes[256];
    size_t n = 0;
    collect(doc, nodes, &n, sizeof nodes / sizeof *nodes);
    if (!n)
        return 0;
    json_t *at = nodes[pick(s, (uint32_t)n)];
    uint32_t op = pick(s, 6);
    if (json_is_array(at)) {
        if (op < 3 || json_array_size(at) == 0)
            return !json_array_append_new(at, small_schema(s, 1));
        return !json_array_remove(at, pick(s, (uint32_t)json_array_size(at)));
    }
    switch (op) {
    case 0:
    case 1: { /* set a keyword */
        const char *kw = keywords[pick(s, N_KEYWORDS)];
        return !json_object_set_new(at, kw, value_for(kw, nodes, n, s, 0));
    }
    case 2: { /* delete a member */
        const char *k = json_object_size(at) ? some_name(&at, 1, s) : NULL;
        return k && !json_object_del(at, k);
    }
    case 3: { /* copy another subschema over a member */
        json_t *from = nodes[pick(s, (uint32_t)n)];
        json_t *dup = json_deep_copy(from);
        return dup && !json_object_set_new(at, some_name(&at, 1, s), dup);
    }
    case 4: { /* wrap a member's value in anyOf / allOf */
        const char *k = json_object_size(at) ? some_name(&at, 1, s) : NULL;
        json_t *v = k ? json_object_get(at, k) : NULL;
        if (!json_is_object(v))
            return 0;
        json_t *w = json_pack("{s:[O,o]}", pick(s, 2) ? "anyOf" : "allOf", v,
                              small_schema(s, 2));
        return w && !json_object_set_new(at, k, w);
    }
    default: { /* a member renamed to a keyword */
        const char *k = json_object_size(at) ? some_name(&at, 1, s) : NULL;
        json_t *v = k ? json_incref(json_object_get(at, k)) : NULL;
        if (!v)
            return 0;
        json_object_del(at, k);
        return !json_object_set_new(at, keywords[pick(s, N_KEYWORDS)], v);
    }
    }
}

size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed)
{
    uint32_t s = seed | 1;
    json_t *doc = pick(&s, 4) ? json_loadb((const char *)data, size, JSON_DECODE_ANY, NULL)
                              : NULL;
    if (!doc)
        return LLVMFuzzerMutate(data, size, max_size);
    if (!json_is_object(doc) && !json_is_array(doc)) {
        json_decref(doc);
        doc = small_schema(&s, 0);
    }
    for (uint32_t i = 0, k = 1 + pick(&s, 3); i < k; i++)
        (void)mutate_doc(doc, &s); /* a change that did not take is only a lost turn */
    char *text = json_dumps(doc, JSON_COMPACT | JSON_ENCODE_ANY);
    json_decref(doc);
    size_t len = text ? strlen(text) : 0;
    if (!text || len > max_size) {
        free(text);
        return LLVMFuzzerMutate(data, size, max_size);
    }
    memcpy(data, text, len);
    free(text);
    return len;
}
