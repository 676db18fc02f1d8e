/* JSON Schema to GBNF (see json_schema.h): one walk over the schema that writes a
 * rule per object, array, alternative and $ref target, and the fixed rules for JSON
 * values (string, number, ws, ...) at the end, only those some rule uses.
 *
 * A schema becomes a "body": an item (a rule name or a literal, usable anywhere), a
 * sequence or alternatives. A body that is not an item gets a rule of its own, named
 * after where it sits ("a-b" for property b of property a), so that every place that
 * uses a schema refers to one item. $ref targets are rules named after their
 * definition, made once; a $ref met again while its target is being written is a
 * recursive rule, refused only when no JSON token would come before the recursion
 * (left recursion, which a grammar engine cannot run). */
#include "json_schema.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"

#define MAX_DEPTH RT_JSON_SCHEMA_MAX_DEPTH
#define MAX_OUT ((size_t)RT_JSON_SCHEMA_MAX_GBNF)
#define MAX_VISITS 100000 /* schemas walked in all; allOf chains could re-walk a lot */
#define MAX_REP 1000      /* the largest count a GBNF repetition {m,n} may hold */
#define MAX_TUPLE 64      /* prefixItems entries (their optional tails nest) */
#define MAX_NAME 40       /* a rule name's stem, before its "-N" suffix */
#define KEYS_INLINE 16    /* trie levels written inline before a new rule (see keys_node) */
#define UNBOUNDED (-1LL)

/* ---------------------------------------------------------------------------- */
/* text                                                                         */
/* ---------------------------------------------------------------------------- */

typedef bl_buf_t sbuf_t; /* common/buf.h */

/* 0, BL_ENOMEM, or BL_ERANGE when the text would pass the grammar's bound. */
static int sb_add(sbuf_t *b, const char *s, size_t n)
{
    return bl_buf_add(b, s, n, MAX_OUT);
}

static int sb_str(sbuf_t *b, const char *s)
{
    return sb_add(b, s, strlen(s));
}

BL_PRINTF(2, 3)
static int sb_fmt(sbuf_t *b, const char *fmt, ...)
{
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof tmp)
        return BL_ERANGE; /* only short numbers and names are formatted */
    return sb_add(b, tmp, (size_t)n);
}

static void sb_free(sbuf_t *b)
{
    bl_buf_free(b);
}

/* The text, owned by the caller from now on ("" when empty); NULL when out of memory. */
static char *sb_take(sbuf_t *b)
{
    char *p = b->p ? b->p : strdup("");
    memset(b, 0, sizeof *b);
    return p;
}

/* A GBNF string literal of s (JSON text: no control characters but for safety). */
static int gbnf_lit(sbuf_t *b, const char *s, size_t n)
{
    int rc = sb_add(b, "\"", 1);
    size_t run = 0; /* bytes of s[i - run, i) not yet written */
    for (size_t i = 0; i < n && !rc; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch != '"' && ch != '\\' && ch >= 0x20) {
            run++;
            continue;
        }
        rc = sb_add(b, s + i - run, run);
        run = 0;
        if (!rc)
            rc = ch == '"' || ch == '\\' ? sb_fmt(b, "\\%c", ch) : sb_fmt(b, "\\x%02X", ch);
    }
    if (!rc)
        rc = sb_add(b, s + n - run, run);
    return rc ? rc : sb_add(b, "\"", 1);
}

/* The JSON text of a string's content (no quotes), escaped as jansson writes it. */
static int json_escape(sbuf_t *b, const char *s, size_t n)
{
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        unsigned char ch = (unsigned char)s[i];
        switch (ch) {
        case '"': rc = sb_add(b, "\\\"", 2); break;
        case '\\': rc = sb_add(b, "\\\\", 2); break;
        case '\b': rc = sb_add(b, "\\b", 2); break;
        case '\f': rc = sb_add(b, "\\f", 2); break;
        case '\n': rc = sb_add(b, "\\n", 2); break;
        case '\r': rc = sb_add(b, "\\r", 2); break;
        case '\t': rc = sb_add(b, "\\t", 2); break;
        default:
            rc = ch < 0x20 ? sb_fmt(b, "\\u%04X", ch) : sb_add(b, s + i, 1);
        }
    }
    return rc;
}

/* The literal matching the JSON string s: "\"...\"" in GBNF. */
static int lit_json_string(sbuf_t *b, const char *s, size_t n)
{
    sbuf_t t = {0};
    int rc = sb_add(&t, "\"", 1);
    if (!rc)
        rc = json_escape(&t, s, n);
    if (!rc)
        rc = sb_add(&t, "\"", 1);
    if (!rc)
        rc = gbnf_lit(b, t.p, t.n);
    sb_free(&t);
    return rc;
}

/* ---------------------------------------------------------------------------- */
/* the walk's state                                                             */
/* ---------------------------------------------------------------------------- */

/* Where a schema sits, as a JSON pointer read from the innermost step up; NULL is
 * the root. Steps live on the stack of the walk, or on ctx.paths (allOf parts). */
typedef struct path {
    const struct path *up;
    const char *key; /* NULL: an array index */
    size_t idx;
} path_t;

typedef struct {
    char *name; /* NULL: a slot given back (the schema was a plain item) */
    char *body; /* NULL while being written */
} rule_t;

typedef struct {
    size_t rule; /* the target's rule */
    int busy;    /* its body is being written */
    int level;   /* ctx.level when it started */
} ref_t;

enum { KIND_ITEM, KIND_SEQ, KIND_ALT };

/* The fixed rules, in output order. */
enum {
    P_VALUE, P_OBJECT, P_ARRAY, P_STRING, P_CHAR, P_NUMBER, P_INTEGER, P_NONNEG, P_POS,
    P_BOOLEAN, P_NULL, P_DATE_S, P_TIME_S, P_DATETIME_S, P_UUID_S, P_DATETIME, P_DATE,
    P_TIME, P_UUID, P_WS, P_COUNT
};

#define B(p) (1u << (p))
static const struct {
    const char *name, *body;
    unsigned deps;
} PRIMS[P_COUNT] = {
    [P_VALUE] = {"value", "object | array | string | number | boolean | null",
                 B(P_OBJECT) | B(P_ARRAY) | B(P_STRING) | B(P_NUMBER) | B(P_BOOLEAN) |
                     B(P_NULL)},
    [P_OBJECT] = {"object",
                  "\"{\" ws ( string ws \":\" ws value ( ws \",\" ws string ws \":\" ws value )* "
                  "ws )? \"}\"",
                  B(P_STRING) | B(P_VALUE) | B(P_WS)},
    [P_ARRAY] = {"array", "\"[\" ws ( value ( ws \",\" ws value )* ws )? \"]\"",
                 B(P_VALUE) | B(P_WS)},
    [P_STRING] = {"string", "\"\\\"\" char* \"\\\"\"", B(P_CHAR)},
    [P_CHAR] = {"char", "[^\"\\\\\\x00-\\x1f] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} )",
                0},
    [P_NUMBER] = {"number",
                  "integer ( \".\" [0-9]{1,16} )? ( [eE] [+\\-]? [0-9]{1,16} )?", B(P_INTEGER)},
    [P_INTEGER] = {"integer", "\"-\"? ( \"0\" | [1-9] [0-9]{0,15} )", 0},
    [P_NONNEG] = {"nonneg-integer", "\"0\" | [1-9] [0-9]{0,15}", 0},
    [P_POS] = {"positive-integer", "[1-9] [0-9]{0,15}", 0},
    [P_BOOLEAN] = {"boolean", "\"true\" | \"false\"", 0},
    [P_NULL] = {"null", "\"null\"", 0},
    [P_DATE_S] = {"date-string", "\"\\\"\" date \"\\\"\"", B(P_DATE)},
    [P_TIME_S] = {"time-string", "\"\\\"\" time \"\\\"\"", B(P_TIME)},
    [P_DATETIME_S] = {"date-time-string", "\"\\\"\" date-time \"\\\"\"", B(P_DATETIME)},
    [P_UUID_S] = {"uuid-string", "\"\\\"\" uuid \"\\\"\"", B(P_UUID)},
    [P_DATETIME] = {"date-time", "date \"T\" time", B(P_DATE) | B(P_TIME)},
    [P_DATE] = {"date",
                "[0-9]{4} \"-\" ( \"0\" [1-9] | \"1\" [0-2] ) \"-\" "
                "( \"0\" [1-9] | [12] [0-9] | \"3\" [01] )",
                0},
    /* RFC 3339 full-time: the offset is required; second 60 is a leap second */
    [P_TIME] = {"time",
                "( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" ( [0-5] [0-9] | \"60\" ) "
                "( \".\" [0-9]{1,9} )? ( \"Z\" | [+\\-] ( [01] [0-9] | \"2\" [0-3] ) \":\" "
                "[0-5] [0-9] )",
                0},
    [P_UUID] = {"uuid",
                "[0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" "
                "[0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{12}",
                0},
    [P_WS] = {"ws", "[ \\t\\n]{0,20}", 0},
};
#undef B

typedef struct {
    const json_t *root;
    bl_err_t *err;
    int failed; /* err holds the message of the failure being returned */

    rule_t *rules; /* in output order; rules[0] is root */
    size_t n_rules, cap_rules;
    size_t nbytes; /* of the rules written so far */
    ref_t *refs;
    size_t n_refs, cap_refs;
    json_t *names;    /* every rule name in use (fixed ones included) -> true */
    json_t *counters; /* name stem -> the next "-N" suffix to try */
    json_t *refmap;   /* "$ref" text -> index in refs */
    unsigned prims;   /* fixed rules used, a bit per P_* */
    path_t **paths;   /* path steps on the heap, freed at the end */
    size_t n_paths, cap_paths;

    int depth;     /* schemas nested in the walk now */
    int level;     /* objects and arrays the walk is inside now (see gen_ref) */
    size_t visits; /* schemas walked so far */
} ctx_t;

static int grow(void **v, size_t *cap, size_t n, size_t size)
{
    if (n < *cap)
        return 0;
    size_t c = *cap ? *cap * 2 : 16;
    void *p = realloc(*v, c * size);
    if (!p)
        return BL_ENOMEM;
    *v = p;
    *cap = c;
    return 0;
}

/* at as a JSON pointer ("/" for the root); a long one keeps its innermost end. */
static void path_str(const path_t *at, char *buf, size_t size)
{
    char all[2048];
    const path_t *v[128];
    size_t n = 0, len = 0;
    for (const path_t *p = at; p && n < sizeof v / sizeof v[0]; p = p->up)
        v[n++] = p;
#define PUT(ch)                       \
    do {                              \
        if (len + 1 < sizeof all)     \
            all[len++] = (ch);        \
    } while (0)
    if (n == 0)
        PUT('/');
    while (n-- > 0) {
        PUT('/');
        if (!v[n]->key) {
            char num[24];
            (void)snprintf(num, sizeof num, "%zu", v[n]->idx);
            for (const char *k = num; *k; k++)
                PUT(*k);
            continue;
        }
        for (const char *k = v[n]->key; *k; k++) { /* JSON pointer: ~ is ~0, / is ~1 */
            if (*k == '~' || *k == '/') {
                PUT('~');
                PUT(*k == '~' ? '0' : '1');
            } else {
                PUT(*k);
            }
        }
    }
#undef PUT
    all[len] = '\0';
    if (len < size)
        memcpy(buf, all, len + 1);
    else
        (void)snprintf(buf, size, "...%s", all + len - (size - 4));
}

/* Records the failure: "json_schema: 'KW' at PATH WHAT", or without a keyword
 * "json_schema: the schema at PATH WHAT". Returns code. */
BL_PRINTF(5, 6)
static int fail(ctx_t *c, int code, const char *kw, const path_t *at, const char *fmt, ...)
{
    char where[160], what[256];
    path_str(at, where, sizeof where);
    va_list ap;
    va_start(ap, fmt);
    (void)vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    c->failed = 1;
    if (kw)
        return bl_err_set(c->err, code, "json_schema: '%s' at %s %s", kw, where, what);
    return bl_err_set(c->err, code, "json_schema: the schema at %s %s", where, what);
}

/* A path step that outlives the walk's stack frame (allOf parts, see collect). */
static int path_new(ctx_t *c, const path_t *up, const char *key, size_t idx, const path_t **out)
{
    if (grow((void **)&c->paths, &c->cap_paths, c->n_paths, sizeof *c->paths))
        return BL_ENOMEM;
    size_t klen = key ? strlen(key) + 1 : 0;
    path_t *p = malloc(sizeof *p + klen);
    if (!p)
        return BL_ENOMEM;
    p->up = up;
    p->idx = idx;
    p->key = NULL;
    if (key) {
        memcpy(p + 1, key, klen);
        p->key = (const char *)(p + 1);
    }
    c->paths[c->n_paths++] = p;
    *out = p;
    return 0;
}

static const char *prim(ctx_t *c, int p)
{
    c->prims |= 1u << p;
    return PRIMS[p].name;
}

/* "parent-part" with part cut down to [a-zA-Z0-9-], or part alone under the root
 * (parent ""), at most MAX_NAME bytes. */
static void hint_join(char out[MAX_NAME + 1], const char *parent, const char *part, size_t plen)
{
    size_t n = 0;
    for (; parent[n] && n < MAX_NAME; n++)
        out[n] = parent[n];
    if (n && n < MAX_NAME)
        out[n++] = '-';
    for (size_t i = 0; i < plen && n < MAX_NAME; i++) {
        unsigned char ch = (unsigned char)part[i];
        if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9'))
            out[n++] = (char)ch;
        else if (n && out[n - 1] != '-')
            out[n++] = '-';
    }
    while (n && out[n - 1] == '-')
        n--;
    if (!n)
        out[n++] = 'x';
    out[n] = '\0';
}

/* A rule name not yet in use: hint, else hint-1, hint-2, ... *out: caller frees. */
static int name_take(ctx_t *c, const char *hint, char **out)
{
    char buf[MAX_NAME + 32];
    *out = NULL;
    if (!json_object_get(c->names, hint)) {
        (void)snprintf(buf, sizeof buf, "%s", hint);
    } else {
        json_t *next = json_object_get(c->counters, hint);
        json_int_t i = next ? json_integer_value(next) : 1;
        for (;; i++) {
            (void)snprintf(buf, sizeof buf, "%.*s-%" JSON_INTEGER_FORMAT, MAX_NAME, hint, i);
            if (!json_object_get(c->names, buf))
                break;
        }
        if (json_object_set_new(c->counters, hint, json_integer(i + 1)))
            return BL_ENOMEM;
    }
    char *p = strdup(buf);
    if (!p || json_object_set_new(c->names, buf, json_true())) {
        free(p);
        return BL_ENOMEM;
    }
    *out = p;
    return 0;
}

/* An empty slot in the rule list, so that a rule comes before the rules its body makes. */
static int rule_push(ctx_t *c, size_t *slot)
{
    if (grow((void **)&c->rules, &c->cap_rules, c->n_rules, sizeof *c->rules))
        return BL_ENOMEM;
    c->rules[c->n_rules] = (rule_t){0};
    *slot = c->n_rules++;
    return 0;
}

/* Fills a slot's body (taken, freed on failure too); BL_ERANGE past the bound. */
static int rule_body(ctx_t *c, size_t slot, char *body)
{
    if (!body)
        return BL_ENOMEM;
    c->rules[slot].body = body;
    c->nbytes += strlen(c->rules[slot].name) + strlen(body) + 6;
    return c->nbytes > MAX_OUT ? BL_ERANGE : 0;
}

#define TRY(x)                       \
    do {                             \
        if ((rc = (x)) != 0)         \
            goto fail;               \
    } while (0)

/* ---------------------------------------------------------------------------- */
/* keywords                                                                     */
/* ---------------------------------------------------------------------------- */

enum {
    K_TYPE = 1u << 0,
    K_ENUM = 1u << 1,
    K_CONST = 1u << 2,
    K_ANYOF = 1u << 3,
    K_ONEOF = 1u << 4,
    K_ALLOF = 1u << 5,
    K_REF = 1u << 6,
    K_PROPERTIES = 1u << 7,
    K_REQUIRED = 1u << 8,
    K_ADDPROPS = 1u << 9,
    K_ITEMS = 1u << 10,
    K_PREFIX = 1u << 11,
    K_MINITEMS = 1u << 12,
    K_MAXITEMS = 1u << 13,
    K_MINLEN = 1u << 14,
    K_MAXLEN = 1u << 15,
    K_FORMAT = 1u << 16,
    K_MINIMUM = 1u << 17,
    K_MAXIMUM = 1u << 18,
    K_EXMIN = 1u << 19,
    K_EXMAX = 1u << 20,
    K_MULTOF = 1u << 21,
    K_PATTERN = 1u << 22,
};
#define K_OBJ (K_PROPERTIES | K_REQUIRED | K_ADDPROPS)
#define K_ARR (K_ITEMS | K_PREFIX | K_MINITEMS | K_MAXITEMS)
#define K_STR (K_MINLEN | K_MAXLEN | K_PATTERN)
#define K_NUM (K_MINIMUM | K_MAXIMUM | K_EXMIN | K_EXMAX | K_MULTOF)

static const struct {
    const char *name;
    unsigned bit;
} KEYWORDS[] = {
    {"type", K_TYPE},
    {"enum", K_ENUM},
    {"const", K_CONST},
    {"anyOf", K_ANYOF},
    {"oneOf", K_ONEOF},
    {"allOf", K_ALLOF},
    {"$ref", K_REF},
    {"properties", K_PROPERTIES},
    {"required", K_REQUIRED},
    {"additionalProperties", K_ADDPROPS},
    {"items", K_ITEMS},
    {"prefixItems", K_PREFIX},
    {"minItems", K_MINITEMS},
    {"maxItems", K_MAXITEMS},
    {"minLength", K_MINLEN},
    {"maxLength", K_MAXLEN},
    {"format", K_FORMAT},
    {"minimum", K_MINIMUM},
    {"maximum", K_MAXIMUM},
    {"exclusiveMinimum", K_EXMIN},
    {"exclusiveMaximum", K_EXMAX},
    {"multipleOf", K_MULTOF},
    {"pattern", K_PATTERN},
};

/* Annotations: they describe, never constrain. */
static const char *const IGNORED[] = {
    "title", "description", "default", "examples", "$schema", "$id", "$comment",
    "deprecated", "readOnly", "writeOnly",
};

static unsigned kw_bit(const char *key)
{
    for (size_t i = 0; i < sizeof KEYWORDS / sizeof KEYWORDS[0]; i++)
        if (strcmp(key, KEYWORDS[i].name) == 0)
            return KEYWORDS[i].bit;
    return 0;
}

/* The keywords of schema object s as K_* bits; any other keyword is refused. */
static int scan(ctx_t *c, const json_t *s, const path_t *at, unsigned *bits)
{
    const char *key;
    size_t klen;
    json_t *v;
    *bits = 0;
    json_object_keylen_foreach((json_t *)s, key, klen, v) {
        unsigned b = klen == strlen(key) ? kw_bit(key) : 0;
        if (b) {
            *bits |= b;
            continue;
        }
        int ignored = 0;
        for (size_t i = 0; i < sizeof IGNORED / sizeof IGNORED[0] && !ignored; i++)
            ignored = strcmp(key, IGNORED[i]) == 0;
        if (ignored)
            continue;
        if (strcmp(key, "$defs") == 0 || strcmp(key, "definitions") == 0) {
            if (!json_is_object(v))
                return fail(c, BL_EINVAL, key, at, "must be an object");
            continue; /* reached through $ref only */
        }
        return fail(c, BL_EINVAL, key, at, "is not supported");
    }
    return 0;
}

/* The first keyword of s (in the schema's order) among the bits of mask. */
static const char *first_kw(const json_t *s, unsigned mask)
{
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)s, key, v) {
        if (kw_bit(key) & mask)
            return key;
    }
    return "?";
}

/* Sibling keywords a combinator does not combine with are refused, by name. */
static int only_beside(ctx_t *c, const json_t *s, const path_t *at, unsigned bits,
                       unsigned allowed, const char *comb)
{
    if (!(bits & ~allowed))
        return 0;
    return fail(c, BL_EINVAL, first_kw(s, bits & ~allowed), at, "beside '%s' is not supported",
                comb);
}

enum { T_OBJECT, T_ARRAY, T_STRING, T_NUMBER, T_INTEGER, T_BOOLEAN, T_NULL, T_COUNT };
static const char *const TYPE_NAMES[T_COUNT] = {
    "object", "array", "string", "number", "integer", "boolean", "null",
};

/* "type" as T_* in the schema's order (no repeats); *n = 0 when absent. */
static int parse_types(ctx_t *c, const json_t *s, const path_t *at, int order[T_COUNT],
                       size_t *n)
{
    const json_t *t = json_object_get(s, "type");
    *n = 0;
    if (!t)
        return 0;
    size_t count = json_is_array(t) ? json_array_size(t) : 1;
    if ((!json_is_string(t) && !json_is_array(t)) || count == 0)
        return fail(c, BL_EINVAL, "type", at, "must be a type name or an array of type names");
    for (size_t i = 0; i < count; i++) {
        const json_t *e = json_is_array(t) ? json_array_get(t, i) : t;
        if (!json_is_string(e))
            return fail(c, BL_EINVAL, "type", at,
                        "must be a type name or an array of type names");
        int k = 0;
        while (k < T_COUNT && strcmp(json_string_value(e), TYPE_NAMES[k]) != 0)
            k++;
        if (k == T_COUNT)
            return fail(c, BL_EINVAL, "type", at, "names an unknown type '%s'",
                        json_string_value(e));
        int seen = 0;
        for (size_t j = 0; j < *n; j++)
            seen |= order[j] == k;
        if (!seen)
            order[(*n)++] = k;
    }
    return 0;
}

/* A count keyword (minItems, maxLength, ...): a non-negative integer. */
static int get_count(ctx_t *c, const json_t *s, const char *key, const path_t *at,
                     long long *val, int *present)
{
    const json_t *v = json_object_get(s, key);
    *present = v != NULL;
    if (!v)
        return 0;
    double d = json_is_integer(v) ? (double)json_integer_value(v)
               : json_is_real(v)  ? json_real_value(v)
                                  : -1.0;
    if (d < 0 || d != floor(d) || d > 9007199254740992.0)
        return fail(c, BL_EINVAL, key, at, "must be a non-negative integer");
    *val = json_is_integer(v) ? (long long)json_integer_value(v) : (long long)d;
    return 0;
}

/* ---------------------------------------------------------------------------- */
/* pieces                                                                       */
/* ---------------------------------------------------------------------------- */

/* item{lo,hi} for counts up to MAX_REP (hi UNBOUNDED: no limit). */
static int rep_simple(sbuf_t *b, const char *item, long long lo, long long hi)
{
    int rc = sb_str(b, item);
    if (rc)
        return rc;
    if (hi == UNBOUNDED)
        return lo == 0 ? sb_str(b, "*") : lo == 1 ? sb_str(b, "+") : sb_fmt(b, "{%lld,}", lo);
    if (lo == 1 && hi == 1)
        return 0;
    if (lo == 0 && hi == 1)
        return sb_str(b, "?");
    return lo == hi ? sb_fmt(b, "{%lld}", lo) : sb_fmt(b, "{%lld,%lld}", lo, hi);
}

/* item (a single GBNF item) repeated lo to hi times (hi UNBOUNDED: no limit) into b;
 * nothing when hi is 0. GBNF counts stop at MAX_REP (R), so larger ones go by blocks
 * B = item{R}: lo = aR + r is "( B ){a} item{r}"; a range of e = aR + r more is
 * "( ( B ){0,a-1} item{0,R-1} | ( B ){a} item{0,r} )", two alternatives that never
 * match the same count. kw_lo, kw_hi: the keywords blamed when a count is too large. */
static int rep(ctx_t *c, sbuf_t *b, const char *item, long long lo, long long hi,
               const char *kw_lo, const char *kw_hi, const path_t *at)
{
    const long long R = MAX_REP;
    if (hi == 0)
        return 0;
    if (lo <= R && (hi == UNBOUNDED || hi <= R))
        return rep_simple(b, item, lo, hi);
    const long long e = hi == UNBOUNDED ? UNBOUNDED : hi - lo;
    if (lo / R > R || (e != UNBOUNDED && e / R > R))
        return fail(c, BL_ERANGE, lo / R > R ? kw_lo : kw_hi, at,
                    "needs a count over %lld, more than this converter writes", R * R);
    sbuf_t blk = {0};
    int rc = 0;
    const char *sp = "";
    TRY(sb_str(&blk, item));
    TRY(sb_fmt(&blk, "{%lld}", R));
    if (lo / R == 1) {
        TRY(sb_str(b, blk.p));
        sp = " ";
    } else if (lo / R > 1) {
        TRY(sb_str(b, "( "));
        TRY(sb_str(b, blk.p));
        TRY(sb_fmt(b, " ){%lld}", lo / R));
        sp = " ";
    }
    if (lo % R > 0) {
        TRY(sb_str(b, sp));
        TRY(rep_simple(b, item, lo % R, lo % R));
        sp = " ";
    }
    if (e == UNBOUNDED || (e > 0 && e <= R)) {
        TRY(sb_str(b, sp));
        TRY(rep_simple(b, item, 0, e));
    } else if (e > R) {
        const long long a = e / R, r = e % R;
        TRY(sb_str(b, sp));
        TRY(sb_str(b, "( "));
        if (a - 1 >= 1) {
            TRY(sb_str(b, "( "));
            TRY(sb_str(b, blk.p));
            TRY(a - 1 == 1 ? sb_str(b, " )? ") : sb_fmt(b, " ){0,%lld} ", a - 1));
        }
        TRY(rep_simple(b, item, 0, R - 1));
        TRY(sb_str(b, " | "));
        if (a == 1) {
            TRY(sb_str(b, blk.p));
        } else {
            TRY(sb_str(b, "( "));
            TRY(sb_str(b, blk.p));
            TRY(sb_fmt(b, " ){%lld}", a));
        }
        if (r > 0) {
            TRY(sb_str(b, " "));
            TRY(rep_simple(b, item, 0, r));
        }
        TRY(sb_str(b, " )"));
    }
fail:
    sb_free(&blk);
    return rc;
}

/* The shortest %g text that reads back as v (jansson writes 17 digits). */
static void real_text(double v, char buf[40])
{
    for (int prec = 1; prec <= 17; prec++) {
        (void)snprintf(buf, 40, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            return;
    }
}

/* The literal of a JSON value (enum, const): scalars as their JSON text, arrays and
 * objects token by token with ws between, keys in the value's order. */
static int lit_value(ctx_t *c, sbuf_t *b, const json_t *v, int depth, const char *kw,
                     const path_t *at)
{
    char num[40];
    int rc = 0;
    size_t i = 0;
    if (depth >= MAX_DEPTH)
        return fail(c, BL_ERANGE, kw, at, "holds a value nested deeper than %d levels",
                    MAX_DEPTH);
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        const char *key;
        size_t klen;
        json_t *e;
        prim(c, P_WS);
        rc = sb_str(b, "\"{\" ws");
        json_object_keylen_foreach((json_t *)v, key, klen, e) {
            if (!rc)
                rc = sb_str(b, i++ ? " ws \",\" ws " : " ");
            if (!rc)
                rc = lit_json_string(b, key, klen);
            if (!rc)
                rc = sb_str(b, " ws \":\" ws ");
            if (!rc)
                rc = lit_value(c, b, e, depth + 1, kw, at);
        }
        return rc ? rc : sb_str(b, i ? " ws \"}\"" : " \"}\"");
    }
    case JSON_ARRAY: {
        json_t *e;
        size_t idx;
        prim(c, P_WS);
        rc = sb_str(b, "\"[\" ws");
        json_array_foreach((json_t *)v, idx, e) {
            if (!rc)
                rc = sb_str(b, idx ? " ws \",\" ws " : " ");
            if (!rc)
                rc = lit_value(c, b, e, depth + 1, kw, at);
        }
        return rc ? rc : sb_str(b, json_array_size(v) ? " ws \"]\"" : " \"]\"");
    }
    case JSON_STRING:
        return lit_json_string(b, json_string_value(v), json_string_length(v));
    case JSON_INTEGER:
        (void)snprintf(num, sizeof num, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return gbnf_lit(b, num, strlen(num));
    case JSON_REAL:
        real_text(json_real_value(v), num);
        return gbnf_lit(b, num, strlen(num));
    case JSON_TRUE:
        return sb_str(b, "\"true\"");
    case JSON_FALSE:
        return sb_str(b, "\"false\"");
    default:
        return sb_str(b, "\"null\"");
    }
}

/* Whether schema s accepts any value: true or {}. */
static int is_any(const json_t *s)
{
    return json_is_true(s) || (json_is_object(s) && json_object_size(s) == 0);
}

/* Whether JSON value v is of one of the T_* types in mask (a bit per type). */
static int type_ok(const json_t *v, unsigned mask)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return !!(mask & (1u << T_OBJECT));
    case JSON_ARRAY: return !!(mask & (1u << T_ARRAY));
    case JSON_STRING: return !!(mask & (1u << T_STRING));
    case JSON_INTEGER: return !!(mask & (1u << T_NUMBER | 1u << T_INTEGER));
    case JSON_REAL:
        return (mask & (1u << T_NUMBER)) ||
               ((mask & (1u << T_INTEGER)) && json_real_value(v) == floor(json_real_value(v)));
    case JSON_TRUE:
    case JSON_FALSE: return !!(mask & (1u << T_BOOLEAN));
    default: return !!(mask & (1u << T_NULL));
    }
}

/* ---------------------------------------------------------------------------- */
/* schemas                                                                      */
/* ---------------------------------------------------------------------------- */

static int gen_body(ctx_t *c, const json_t *s, const char *name, const path_t *at, sbuf_t *out,
                    int *kind);

/* Schema s as one item: the body itself when it is one, else a new rule named after
 * hint holding the body, and its name. *item: caller frees. */
static int gen_item(ctx_t *c, const json_t *s, const char *hint, const path_t *at, char **item)
{
    char *name = NULL;
    sbuf_t b = {0};
    size_t slot;
    int kind, rc = 0;
    *item = NULL;
    TRY(name_take(c, hint, &name));
    TRY(rule_push(c, &slot));
    TRY(gen_body(c, s, name, at, &b, &kind));
    if (kind == KIND_ITEM) { /* no rule: the name goes back, the slot stays empty */
        (void)json_object_del(c->names, name);
        *item = sb_take(&b);
        rc = *item ? 0 : BL_ENOMEM;
        goto fail;
    }
    if (!(*item = strdup(name))) {
        rc = BL_ENOMEM;
        goto fail;
    }
    c->rules[slot].name = name;
    name = NULL;
    TRY(rule_body(c, slot, sb_take(&b)));
fail:
    free(name);
    sb_free(&b);
    if (rc) {
        free(*item);
        *item = NULL;
    }
    return rc;
}

/* The schema a $ref names: "#" (the root), "#/$defs/NAME", "#/definitions/NAME" (NAME
 * with JSON pointer escapes). *def: NAME decoded, caller frees; NULL for "#". */
static int resolve_ref(ctx_t *c, const char *ref, size_t rlen, const path_t *at,
                       const json_t **target, char **def)
{
    static const char *const DEFS[] = {"$defs", "definitions"};
    *target = NULL;
    *def = NULL;
    if (rlen == 1 && ref[0] == '#') {
        *target = c->root;
        return 0;
    }
    for (size_t k = 0; k < 2; k++) {
        const size_t pl = strlen(DEFS[k]) + 3; /* "#/" NAME "/" */
        if (rlen <= pl || strncmp(ref, "#/", 2) != 0 ||
            strncmp(ref + 2, DEFS[k], pl - 3) != 0 || ref[pl - 1] != '/')
            continue;
        char *d = malloc(rlen - pl + 1);
        size_t n = 0;
        if (!d)
            return BL_ENOMEM;
        for (size_t i = pl; i < rlen; i++) {
            char ch = ref[i];
            if (ch == '/')
                break; /* a path into a definition: not supported */
            if (ch == '~' && i + 1 < rlen && (ref[i + 1] == '0' || ref[i + 1] == '1'))
                ch = ref[++i] == '0' ? '~' : '/';
            d[n++] = ch;
        }
        d[n] = '\0';
        if (memchr(ref + pl, '/', rlen - pl)) {
            free(d);
            break;
        }
        const json_t *defs = json_object_get(c->root, DEFS[k]);
        const json_t *t = json_is_object(defs) ? json_object_getn(defs, d, n) : NULL;
        if (!t) {
            free(d);
            return fail(c, BL_EINVAL, "$ref", at, "points to '%s', which is not defined", ref);
        }
        *target = t;
        *def = d;
        return 0;
    }
    return fail(c, BL_EINVAL, "$ref", at,
                "is not supported in the form '%s' (only \"#\", \"#/$defs/NAME\" and "
                "\"#/definitions/NAME\")",
                ref);
}

/* A $ref: the rule of its target, written the first time. A target met again while
 * its body is being written becomes a recursive rule; that is refused when the walk
 * entered no object or array since (c->level unchanged): the rule would call itself
 * before matching anything. */
static int gen_ref(ctx_t *c, const json_t *s, const path_t *at, sbuf_t *out, int *kind)
{
    const json_t *r = json_object_get(s, "$ref");
    const json_t *target;
    char *def = NULL, *name = NULL;
    sbuf_t b = {0};
    size_t slot, ri;
    int rc = 0, k;
    *kind = KIND_ITEM;
    if (!json_is_string(r))
        return fail(c, BL_EINVAL, "$ref", at, "must be a string");
    const char *ref = json_string_value(r);
    const size_t rlen = json_string_length(r);
    const json_t *known = json_object_getn(c->refmap, ref, rlen);
    if (known) {
        const ref_t *e = &c->refs[json_integer_value(known)];
        if (e->busy && e->level == c->level)
            return fail(c, BL_EINVAL, "$ref", at,
                        "leads back to '%s' before any JSON token (left recursion)", ref);
        return sb_str(out, c->rules[e->rule].name);
    }
    TRY(resolve_ref(c, ref, rlen, at, &target, &def));
    char hint[MAX_NAME + 1];
    hint_join(hint, "", def, strlen(def));
    TRY(name_take(c, hint, &name));
    TRY(rule_push(c, &slot));
    c->rules[slot].name = name;
    name = NULL;
    TRY(grow((void **)&c->refs, &c->cap_refs, c->n_refs, sizeof *c->refs));
    ri = c->n_refs++;
    c->refs[ri] = (ref_t){.rule = slot, .busy = 1, .level = c->level};
    if (json_object_setn_new(c->refmap, ref, rlen, json_integer((json_int_t)ri))) {
        rc = BL_ENOMEM;
        goto fail;
    }
    const path_t p1 = {NULL, ref[2] == '$' ? "$defs" : "definitions", 0};
    const path_t p2 = {&p1, def, 0};
    TRY(gen_body(c, target, c->rules[slot].name, &p2, &b, &k));
    TRY(rule_body(c, slot, sb_take(&b)));
    c->refs[ri].busy = 0;
    TRY(sb_str(out, c->rules[slot].name));
fail:
    sb_free(&b);
    free(def);
    free(name);
    return rc;
}

/* anyOf / oneOf: one alternative per schema (oneOf's "exactly one" is not checked:
 * a text that two alternatives match is accepted). */
static int gen_anyof(ctx_t *c, const json_t *s, const char *name, const path_t *at,
                     unsigned bits, sbuf_t *out, int *kind)
{
    const char *kw = bits & K_ANYOF ? "anyOf" : "oneOf";
    if ((bits & K_ANYOF) && (bits & K_ONEOF))
        return fail(c, BL_EINVAL, "oneOf", at, "beside 'anyOf' is not supported");
    int rc = only_beside(c, s, at, bits, K_ANYOF | K_ONEOF, kw);
    if (rc)
        return rc;
    const json_t *alts = json_object_get(s, kw);
    if (!json_is_array(alts) || json_array_size(alts) == 0)
        return fail(c, BL_EINVAL, kw, at, "must be a non-empty array of schemas");
    const path_t pk = {at, kw, 0};
    for (size_t i = 0; i < json_array_size(alts); i++) {
        const path_t pi = {&pk, NULL, i};
        char part[32], hint[MAX_NAME + 1];
        char *item;
        if (name[0])
            (void)snprintf(part, sizeof part, "%zu", i);
        else
            (void)snprintf(part, sizeof part, "alt-%zu", i);
        hint_join(hint, name, part, strlen(part));
        if ((rc = gen_item(c, json_array_get(alts, i), hint, &pi, &item)) != 0)
            return rc;
        rc = i ? sb_str(out, " | ") : 0;
        if (!rc)
            rc = sb_str(out, item);
        free(item);
        if (rc)
            return rc;
    }
    *kind = json_array_size(alts) == 1 ? KIND_ITEM : KIND_ALT;
    return 0;
}

/* enum / const: the values' literals, those of the schema's 'type' only. */
static int gen_enum(ctx_t *c, const json_t *s, const path_t *at, unsigned bits, sbuf_t *out,
                    int *kind)
{
    const char *kw = bits & K_ENUM ? "enum" : "const";
    int order[T_COUNT], rc, structured = 0;
    size_t nt, kept = 0;
    if ((rc = only_beside(c, s, at, bits, K_ENUM | K_CONST | K_TYPE | K_FORMAT, kw)) != 0 ||
        (rc = parse_types(c, s, at, order, &nt)) != 0)
        return rc;
    unsigned mask = nt ? 0 : ~0u;
    for (size_t i = 0; i < nt; i++)
        mask |= 1u << order[i];
    const json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
    if (en && (!json_is_array(en) || json_array_size(en) == 0))
        return fail(c, BL_EINVAL, "enum", at, "must be a non-empty array");
    const size_t count = en ? json_array_size(en) : 1;
    for (size_t i = 0; i < count; i++) {
        const json_t *v = en ? json_array_get(en, i) : cn;
        if ((en && cn && !json_equal(v, cn)) || !type_ok(v, mask))
            continue;
        if ((kept++ && (rc = sb_str(out, " | ")) != 0) ||
            (rc = lit_value(c, out, v, 0, kw, at)) != 0)
            return rc;
        structured |= json_is_object(v) || json_is_array(v);
    }
    if (!kept)
        return fail(c, BL_EINVAL, kw, at, "allows no value (none matches %s)",
                    en && cn ? "'const' and 'type'" : "'type'");
    *kind = kept > 1 ? KIND_ALT : structured ? KIND_SEQ : KIND_ITEM;
    return 0;
}

/* --- objects ------------------------------------------------------------------ */

typedef struct {
    const char *key;
    size_t klen;
    const json_t *schema;
    const path_t *at; /* the property's schema */
} prop_t;

typedef struct {
    const char *key;
    size_t klen;
    const path_t *at; /* the schema whose 'required' names it */
} req_t;

/* An object's properties and required keys, gathered from it and its allOf parts. */
typedef struct {
    prop_t *props;
    size_t n_props, cap_props;
    req_t *reqs;
    size_t n_reqs, cap_reqs;
    json_t *index;    /* key -> index in props */
    json_t *required; /* key -> true */
    int has_props;    /* some schema has 'properties' */
} obj_t;

static int collect(ctx_t *c, const json_t *s, const path_t *at, int outer, obj_t *o);

static int collect_(ctx_t *c, const json_t *s, const path_t *at, int outer, obj_t *o)
{
    const unsigned PART = K_TYPE | K_OBJ | K_ALLOF | K_REF;
    const char *key;
    size_t klen;
    json_t *v;
    unsigned bits;
    int rc = 0;
    char *def = NULL;
    if (json_is_true(s))
        return 0;
    if (json_is_false(s))
        return fail(c, BL_EINVAL, NULL, at, "is false and accepts no value");
    if (!json_is_object(s))
        return fail(c, BL_EINVAL, NULL, at, "must be an object or a boolean");
    if (!outer) { /* an allOf part: an object schema and nothing else */
        int order[T_COUNT];
        size_t nt;
        TRY(scan(c, s, at, &bits));
        if (bits & ~PART)
            return fail(c, BL_EINVAL, first_kw(s, bits & ~PART), at,
                        "is not supported inside 'allOf' (only object schemas merge)");
        TRY(parse_types(c, s, at, order, &nt));
        if (nt && (nt != 1 || order[0] != T_OBJECT))
            return fail(c, BL_EINVAL, "type", at, "inside 'allOf' must be \"object\"");
        const json_t *ap = json_object_get(s, "additionalProperties");
        if (ap && !json_is_false(ap))
            return fail(c, BL_EINVAL, "additionalProperties", at,
                        "inside 'allOf' is not supported unless false");
    }
    const json_t *props = json_object_get(s, "properties");
    if (props) {
        const path_t *pp;
        if (!json_is_object(props))
            return fail(c, BL_EINVAL, "properties", at, "must be an object");
        o->has_props = 1;
        TRY(path_new(c, at, "properties", 0, &pp));
        json_object_keylen_foreach((json_t *)props, key, klen, v) {
            const path_t *kp;
            if (json_object_getn(o->index, key, klen))
                return fail(c, BL_EINVAL, "properties", at,
                            "defines '%s' again (merged by 'allOf')", key);
            TRY(path_new(c, pp, key, 0, &kp));
            TRY(grow((void **)&o->props, &o->cap_props, o->n_props, sizeof *o->props));
            o->props[o->n_props] = (prop_t){key, klen, v, kp};
            if (json_object_setn_new(o->index, key, klen, json_integer((json_int_t)o->n_props)))
                return BL_ENOMEM;
            o->n_props++;
        }
    }
    const json_t *req = json_object_get(s, "required");
    if (req) {
        size_t i;
        if (!json_is_array(req))
            return fail(c, BL_EINVAL, "required", at, "must be an array of strings");
        json_array_foreach(req, i, v) {
            if (!json_is_string(v))
                return fail(c, BL_EINVAL, "required", at, "must be an array of strings");
            TRY(grow((void **)&o->reqs, &o->cap_reqs, o->n_reqs, sizeof *o->reqs));
            o->reqs[o->n_reqs++] = (req_t){json_string_value(v), json_string_length(v), at};
            if (json_object_setn_new(o->required, json_string_value(v), json_string_length(v),
                                     json_true()))
                return BL_ENOMEM;
        }
    }
    const json_t *all = json_object_get(s, "allOf");
    if (all) {
        const path_t *ap;
        if (!json_is_array(all) || json_array_size(all) == 0)
            return fail(c, BL_EINVAL, "allOf", at, "must be a non-empty array of schemas");
        TRY(path_new(c, at, "allOf", 0, &ap));
        for (size_t i = 0; i < json_array_size(all); i++) {
            const path_t *ip;
            TRY(path_new(c, ap, NULL, i, &ip));
            TRY(collect(c, json_array_get(all, i), ip, 0, o));
        }
    }
    const json_t *r = outer ? NULL : json_object_get(s, "$ref");
    if (r) { /* the part is its target's properties (inline: no rule of its own) */
        const json_t *target;
        const path_t *p1 = NULL, *p2 = NULL;
        if (!json_is_string(r))
            return fail(c, BL_EINVAL, "$ref", at, "must be a string");
        TRY(resolve_ref(c, json_string_value(r), json_string_length(r), at, &target, &def));
        if (def) {
            TRY(path_new(c, NULL, json_string_value(r)[2] == '$' ? "$defs" : "definitions", 0,
                         &p1));
            TRY(path_new(c, p1, def, 0, &p2));
        }
        TRY(collect(c, target, p2, 0, o));
    }
fail:
    free(def);
    return rc;
}

static int collect(ctx_t *c, const json_t *s, const path_t *at, int outer, obj_t *o)
{
    if (++c->visits > MAX_VISITS)
        return fail(c, BL_ERANGE, NULL, at, "expands to more than %d schemas", MAX_VISITS);
    if (c->depth >= MAX_DEPTH)
        return fail(c, BL_ERANGE, NULL, at, "nests deeper than %d levels", MAX_DEPTH);
    c->depth++;
    int rc = collect_(c, s, at, outer, o);
    c->depth--;
    return rc;
}

typedef struct {
    const char *p;
    size_t n;
} span_t;

typedef struct {
    size_t lo, hi, off; /* keys [lo, hi) share their first off bytes */
    size_t slot;        /* the rule to write */
} kwork_t;

static int span_cmp(const void *a, const void *b)
{
    const span_t *x = a, *y = b;
    int d = memcmp(x->p, y->p, x->n < y->n ? x->n : y->n);
    return d ? d : (x->n > y->n) - (x->n < y->n);
}

/* Bytes of the JSON string character at s[off]: an escape (2, or 6 for \uXXXX) or
 * one UTF-8 code point. */
static size_t unit_len(const char *s, size_t n, size_t off)
{
    unsigned char ch = (unsigned char)s[off];
    size_t len = ch == '\\'  ? (off + 1 < n && s[off + 1] == 'u' ? 6 : 2)
                 : ch < 0x80 ? 1
                 : ch >= 0xf0 ? 4
                 : ch >= 0xe0 ? 3
                              : 2;
    return len > n - off ? n - off : len;
}

/* One node of the trie of the listed keys (their escaped JSON text, sorted): the
 * alternatives that finish a key other than all of k[lo, hi). Those are: closing the
 * string here unless a key ends here; a character no key continues with, then any
 * characters; or a key's next character, then the child node. Children nest inline
 * KEYS_INLINE levels deep, then go to a rule of their own on the worklist, so that
 * neither this recursion nor the grammar's parentheses grow with key length.
 * A \uXXXX escape is not told apart from others: a key holding a control character
 * may come back as an extra key (keys are compared as text, not as decoded strings). */
static int keys_node(ctx_t *c, const span_t *k, size_t lo, size_t hi, size_t off, int depth,
                     const char *hint, sbuf_t *b, kwork_t **w, size_t *nw, size_t *capw)
{
    static const char ESC[] = "\"\\/bfnrt";
    sbuf_t cls = {0};
    unsigned esc = 0; /* bit i: a key continues with the escape \ESC[i] */
    int rc = 0;
    const int terminal = lo < hi && k[lo].n == off;
    if (terminal)
        lo++;
    for (size_t i = lo, j; i < hi; i = j) {
        const size_t u = unit_len(k[i].p, k[i].n, off);
        const char *up = k[i].p + off;
        for (j = i + 1; j < hi && k[j].n >= off + u && !memcmp(k[j].p + off, up, u); j++)
            ;
        if (up[0] == '\\') {
            const char *e = u == 2 ? memchr(ESC, up[1], sizeof ESC - 1) : NULL;
            if (e)
                esc |= 1u << (e - ESC);
        } else if (u == 1 && strchr("]-^\\", up[0])) {
            TRY(sb_add(&cls, "\\", 1));
            TRY(sb_add(&cls, up, 1));
        } else {
            TRY(sb_add(&cls, up, u));
        }
    }
    if (!terminal)
        TRY(sb_str(b, "\"\\\"\" | "));
    TRY(sb_str(b, "( [^\"\\\\\\x00-\\x1f"));
    if (cls.n)
        TRY(sb_add(b, cls.p, cls.n));
    TRY(sb_str(b, "] | \"\\\\\" ( "));
    if (esc != (1u << (sizeof ESC - 1)) - 1) {
        TRY(sb_str(b, "["));
        for (size_t i = 0; i < sizeof ESC - 1; i++)
            if (!(esc & (1u << i)))
                TRY(ESC[i] == '\\' ? sb_str(b, "\\\\") : sb_add(b, ESC + i, 1));
        TRY(sb_str(b, "] | "));
    }
    TRY(sb_str(b, "\"u\" [0-9a-fA-F]{4} ) ) char* \"\\\"\""));
    prim(c, P_CHAR);
    for (size_t i = lo, j; i < hi; i = j) {
        const size_t u = unit_len(k[i].p, k[i].n, off);
        const char *up = k[i].p + off;
        for (j = i + 1; j < hi && k[j].n >= off + u && !memcmp(k[j].p + off, up, u); j++)
            ;
        TRY(sb_str(b, " | "));
        TRY(gbnf_lit(b, up, u));
        if (depth + 1 < KEYS_INLINE) {
            TRY(sb_str(b, " ( "));
            TRY(keys_node(c, k, i, j, off + u, depth + 1, hint, b, w, nw, capw));
            TRY(sb_str(b, " )"));
            continue;
        }
        char *name;
        size_t slot;
        TRY(name_take(c, hint, &name));
        if ((rc = rule_push(c, &slot)) != 0) {
            free(name);
            goto fail;
        }
        c->rules[slot].name = name;
        TRY(grow((void **)w, capw, *nw, sizeof **w));
        (*w)[(*nw)++] = (kwork_t){i, j, off + u, slot};
        TRY(sb_str(b, " "));
        TRY(sb_str(b, name));
    }
fail:
    sb_free(&cls);
    return rc;
}

/* A rule matching a JSON string that is none of the object's listed keys, for the
 * keys of additionalProperties. *out: its name, caller frees. */
static int keys_except(ctx_t *c, const obj_t *o, const char *name, char **out)
{
    sbuf_t all = {0}, b = {0};
    size_t *ends = NULL, nw = 0, capw = 0, slot;
    span_t *k = NULL;
    kwork_t *w = NULL;
    char hint[MAX_NAME + 1], *rname = NULL;
    const size_t n = o->n_props;
    int rc = 0;
    *out = NULL;
    ends = malloc(n * sizeof *ends);
    k = malloc(n * sizeof *k);
    if (!ends || !k) {
        rc = BL_ENOMEM;
        goto fail;
    }
    for (size_t i = 0; i < n; i++) {
        TRY(json_escape(&all, o->props[i].key, o->props[i].klen));
        ends[i] = all.n;
    }
    for (size_t i = 0; i < n; i++) { /* all.p moved while growing: spans come after */
        const size_t start = i ? ends[i - 1] : 0;
        k[i] = (span_t){all.p ? all.p + start : "", ends[i] - start};
    }
    qsort(k, n, sizeof *k, span_cmp);
    hint_join(hint, name, "additional-key", strlen("additional-key"));
    TRY(name_take(c, hint, &rname));
    TRY(rule_push(c, &slot));
    c->rules[slot].name = rname;
    if (!(*out = strdup(rname))) {
        rc = BL_ENOMEM;
        goto fail;
    }
    rname = NULL;
    TRY(sb_str(&b, "\"\\\"\" ( "));
    TRY(keys_node(c, k, 0, n, 0, 0, hint, &b, &w, &nw, &capw));
    TRY(sb_str(&b, " )"));
    TRY(rule_body(c, slot, sb_take(&b)));
    while (nw > 0) {
        const kwork_t x = w[--nw];
        TRY(keys_node(c, k, x.lo, x.hi, x.off, 0, hint, &b, &w, &nw, &capw));
        TRY(rule_body(c, x.slot, sb_take(&b)));
    }
fail:
    sb_free(&all);
    sb_free(&b);
    free(ends);
    free(k);
    free(w);
    free(rname);
    if (rc) {
        free(*out);
        *out = NULL;
    }
    return rc;
}

/* The text of an object from its members: kv[i] the key, colon and value of listed
 * property i (req[i]: required), extra the key, colon and value of any other key
 * (NULL: none). Present properties come in the listed order, extra keys after them.
 * With a required property, the optional ones before it carry their comma after,
 * those after it before. With none, the first present property picks the
 * alternative, and after property i come the optional rest i+1, ... (inline for up to
 * three properties, else a chain of rules "NAME-rest", linear in size). */
static int object_compose(ctx_t *c, char **kv, const int *req, size_t n, const char *extra,
                          const char *name, sbuf_t *out)
{
    char **rest = NULL;
    size_t r = 0;
    int rc = 0;
    prim(c, P_WS);
    TRY(sb_str(out, "\"{\" ws"));
    while (r < n && !req[r])
        r++;
    if (n == 0) {
        if (extra) {
            TRY(sb_str(out, " ( "));
            TRY(sb_str(out, extra));
            TRY(sb_str(out, " ( ws \",\" ws "));
            TRY(sb_str(out, extra));
            TRY(sb_str(out, " )* ws )?"));
        }
        TRY(sb_str(out, " \"}\""));
        goto fail;
    }
    if (r < n) {
        for (size_t i = 0; i < n; i++) {
            if (i < r) {
                TRY(sb_str(out, " ( "));
                TRY(sb_str(out, kv[i]));
                TRY(sb_str(out, " ws \",\" ws )?"));
            } else if (i == r || req[i]) {
                TRY(sb_str(out, i == r ? " " : " ws \",\" ws "));
                TRY(sb_str(out, kv[i]));
            } else {
                TRY(sb_str(out, " ( ws \",\" ws "));
                TRY(sb_str(out, kv[i]));
                TRY(sb_str(out, " )?"));
            }
        }
        if (extra) {
            TRY(sb_str(out, " ( ws \",\" ws "));
            TRY(sb_str(out, extra));
            TRY(sb_str(out, " )*"));
        }
        TRY(sb_str(out, " ws \"}\""));
        goto fail;
    }
    if (n > 3) {
        size_t *slots = malloc(n * sizeof *slots);
        rest = calloc(n, sizeof *rest);
        if (!slots || !rest) {
            free(slots);
            rc = BL_ENOMEM;
            goto fail;
        }
        for (size_t i = 0; i + 1 < n && !rc; i++) {
            char hint[MAX_NAME + 1], *nm;
            hint_join(hint, name, "rest", 4);
            if ((rc = name_take(c, hint, &nm)) != 0)
                break;
            if ((rc = rule_push(c, &slots[i])) != 0) {
                free(nm);
                break;
            }
            c->rules[slots[i]].name = rest[i] = nm;
        }
        for (size_t i = n - 1; i-- > 0 && !rc;) {
            sbuf_t b = {0};
            rc = sb_str(&b, "( ws \",\" ws ");
            if (!rc)
                rc = sb_str(&b, kv[i + 1]);
            if (!rc)
                rc = sb_str(&b, " )?");
            if (!rc && i + 2 < n) {
                rc = sb_str(&b, " ");
                if (!rc)
                    rc = sb_str(&b, rest[i + 1]);
            }
            if (rc)
                sb_free(&b);
            else
                rc = rule_body(c, slots[i], sb_take(&b));
        }
        free(slots);
        if (rc)
            goto fail;
    }
    const int group = n + (extra != NULL) > 1;
    TRY(sb_str(out, group ? " ( ( " : " ( "));
    for (size_t i = 0; i < n; i++) {
        if (i)
            TRY(sb_str(out, " | "));
        TRY(sb_str(out, kv[i]));
        if (rest && i + 1 < n) {
            TRY(sb_str(out, " "));
            TRY(sb_str(out, rest[i]));
        }
        for (size_t j = i + 1; !rest && j < n; j++) {
            TRY(sb_str(out, " ( ws \",\" ws "));
            TRY(sb_str(out, kv[j]));
            TRY(sb_str(out, " )?"));
        }
    }
    if (extra) {
        TRY(sb_str(out, " | "));
        TRY(sb_str(out, extra));
    }
    if (group)
        TRY(sb_str(out, " )"));
    if (extra) {
        TRY(sb_str(out, " ( ws \",\" ws "));
        TRY(sb_str(out, extra));
        TRY(sb_str(out, " )*"));
    }
    TRY(sb_str(out, " ws )? \"}\""));
fail:
    free(rest); /* the names belong to the rules */
    return rc;
}

/* The members' texts (see object_compose), written inside the object (c->level up). */
static int object_members(ctx_t *c, const json_t *s, const char *name, const path_t *at,
                          const obj_t *o, char **kv, int *req, size_t *n, char **extra)
{
    char hint[MAX_NAME + 1], *item = NULL, *key = NULL;
    sbuf_t t = {0};
    int rc = 0;
    for (size_t i = 0; i < o->n_props; i++) {
        const prop_t *p = &o->props[i];
        const int is_req = json_object_getn(o->required, p->key, p->klen) != NULL;
        if (json_is_false(p->schema)) { /* never present */
            if (is_req)
                return fail(c, BL_EINVAL, "required", at, "names '%s', whose schema is false",
                            p->key);
            continue;
        }
        hint_join(hint, name, p->key, p->klen);
        TRY(gen_item(c, p->schema, hint, p->at, &item));
        TRY(lit_json_string(&t, p->key, p->klen));
        TRY(sb_str(&t, " ws \":\" ws "));
        TRY(sb_str(&t, item));
        free(item);
        item = NULL;
        if (!(kv[*n] = sb_take(&t))) {
            rc = BL_ENOMEM;
            goto fail;
        }
        req[(*n)++] = is_req;
    }
    /* other keys: absent means none beside 'properties', any without it */
    const json_t *ap = json_object_get(s, "additionalProperties");
    const path_t app = {at, "additionalProperties", 0};
    if (!ap)
        ap = o->has_props ? json_false() : json_true();
    if (!json_is_object(ap) && !json_is_boolean(ap))
        return fail(c, BL_EINVAL, "additionalProperties", at, "must be a boolean or a schema");
    if (json_is_false(ap))
        goto fail;
    hint_join(hint, name, "additional-value", strlen("additional-value"));
    TRY(gen_item(c, ap, hint, &app, &item));
    if (o->n_props == 0)
        key = strdup(prim(c, P_STRING));
    else
        TRY(keys_except(c, o, name, &key));
    if (!key) {
        rc = BL_ENOMEM;
        goto fail;
    }
    prim(c, P_WS);
    TRY(sb_str(&t, key));
    TRY(sb_str(&t, " ws \":\" ws "));
    TRY(sb_str(&t, item));
    if (!(*extra = sb_take(&t)))
        rc = BL_ENOMEM;
fail:
    free(item);
    free(key);
    sb_free(&t);
    return rc;
}

/* An object: its properties and required keys with those of its allOf parts. */
static int gen_object(ctx_t *c, const json_t *s, const char *name, const path_t *at,
                      sbuf_t *out, int *kind)
{
    obj_t o = {0};
    char **kv = NULL, *extra = NULL;
    int *req = NULL, rc = 0;
    size_t n = 0;
    *kind = KIND_SEQ;
    o.index = json_object();
    o.required = json_object();
    if (!o.index || !o.required) {
        rc = BL_ENOMEM;
        goto fail;
    }
    TRY(collect(c, s, at, 1, &o));
    for (size_t i = 0; i < o.n_reqs; i++) {
        const req_t *r = &o.reqs[i];
        if (!json_object_getn(o.index, r->key, r->klen)) {
            rc = fail(c, BL_EINVAL, "required", r->at, "names '%s', which is not in 'properties'",
                      r->key);
            goto fail;
        }
    }
    /* any keys with any values: the fixed rule */
    const json_t *ap = json_object_get(s, "additionalProperties");
    if (!o.has_props && (!ap || is_any(ap))) {
        *kind = KIND_ITEM;
        rc = sb_str(out, prim(c, P_OBJECT));
        goto fail;
    }
    kv = calloc(o.n_props + 1, sizeof *kv);
    req = calloc(o.n_props + 1, sizeof *req);
    if (!kv || !req) {
        rc = BL_ENOMEM;
        goto fail;
    }
    c->level++;
    rc = object_members(c, s, name, at, &o, kv, req, &n, &extra);
    c->level--;
    if (rc)
        goto fail;
    TRY(object_compose(c, kv, req, n, extra, name, out));
fail:
    for (size_t i = 0; kv && i < n; i++)
        free(kv[i]);
    free(kv);
    free(req);
    free(extra);
    free(o.props);
    free(o.reqs);
    json_decref(o.index);
    json_decref(o.required);
    return rc;
}

/* allOf: object schemas merge into one object (their properties in order, the union
 * of their required keys; other keys only as the outer schema's
 * additionalProperties allows). A lone schema beside annotations is itself. */
static int gen_allof(ctx_t *c, const json_t *s, const char *name, const path_t *at,
                     unsigned bits, sbuf_t *out, int *kind)
{
    const json_t *parts = json_object_get(s, "allOf");
    int rc = only_beside(c, s, at, bits, K_ALLOF | K_TYPE | K_OBJ, "allOf");
    if (rc)
        return rc;
    if (!json_is_array(parts) || json_array_size(parts) == 0)
        return fail(c, BL_EINVAL, "allOf", at, "must be a non-empty array of schemas");
    if (bits & K_TYPE) {
        int order[T_COUNT];
        size_t nt;
        if ((rc = parse_types(c, s, at, order, &nt)) != 0)
            return rc;
        if (nt != 1 || order[0] != T_OBJECT)
            return fail(c, BL_EINVAL, "type", at, "beside 'allOf' must be \"object\"");
    }
    if (!(bits & ~K_ALLOF)) {
        size_t live = 0, only = 0;
        for (size_t i = 0; i < json_array_size(parts); i++) {
            const json_t *p = json_array_get(parts, i);
            if (!is_any(p)) {
                live++;
                only = i;
            }
        }
        const path_t pa = {at, "allOf", 0}, pi = {&pa, NULL, only};
        if (live == 0) {
            *kind = KIND_ITEM;
            return sb_str(out, prim(c, P_VALUE));
        }
        if (live == 1)
            return gen_body(c, json_array_get(parts, only), name, &pi, out, kind);
    }
    return gen_object(c, s, name, at, out, kind);
}

/* --- arrays, strings, numbers --------------------------------------------------- */

/* An array: prefixItems first (each optional once minItems is met, in order), then
 * items (absent: any value, as JSON Schema reads it; false: none). */
static int gen_array(ctx_t *c, const json_t *s, const char *name, const path_t *at,
                     sbuf_t *out, int *kind)
{
    const json_t *items = json_object_get(s, "items"), *prefix = json_object_get(s, "prefixItems");
    char *pitem[MAX_TUPLE] = {0}, *item = NULL, hint[MAX_NAME + 1];
    sbuf_t tail = {0}, t2 = {0}, el = {0}, grp = {0};
    long long m = 0, M = UNBOUNDED;
    int has_m, has_M, extra = 1, rc = 0;
    size_t k = 0;
    *kind = KIND_SEQ;
    TRY(get_count(c, s, "minItems", at, &m, &has_m));
    TRY(get_count(c, s, "maxItems", at, &M, &has_M));
    if (!has_M)
        M = UNBOUNDED;
    if (!prefix && (!items || is_any(items)) && m == 0 && M == UNBOUNDED) { /* the fixed rule */
        *kind = KIND_ITEM;
        rc = sb_str(out, prim(c, P_ARRAY));
        goto fail;
    }
    if (prefix && !json_is_array(prefix)) {
        rc = fail(c, BL_EINVAL, "prefixItems", at, "must be an array of schemas");
        goto fail;
    }
    if (prefix && json_array_size(prefix) > MAX_TUPLE) {
        rc = fail(c, BL_ERANGE, "prefixItems", at, "has more than %d entries", MAX_TUPLE);
        goto fail;
    }
    if (json_is_array(items)) {
        rc = fail(c, BL_EINVAL, "items", at,
                  "as an array (a tuple) is not supported; use 'prefixItems'");
        goto fail;
    }
    if (items && !json_is_object(items) && !json_is_boolean(items)) {
        rc = fail(c, BL_EINVAL, "items", at, "must be a schema");
        goto fail;
    }
    c->level++;
    const path_t pp = {at, "prefixItems", 0}, ip = {at, "items", 0};
    for (size_t i = 0; prefix && i < json_array_size(prefix) && !rc; i++) {
        const json_t *e = json_array_get(prefix, i);
        const path_t pi = {&pp, NULL, i};
        char part[32];
        if (json_is_false(e)) { /* no item at i, nor after it */
            extra = 0;
            break;
        }
        (void)snprintf(part, sizeof part, "item-%zu", i);
        hint_join(hint, name, part, strlen(part));
        if ((rc = gen_item(c, e, hint, &pi, &pitem[k])) == 0)
            k++;
    }
    if (!rc && extra && json_is_false(items)) {
        extra = 0;
    } else if (!rc && extra && json_is_object(items)) {
        hint_join(hint, name, "item", 4);
        rc = gen_item(c, items, hint, &ip, &item);
    } else if (!rc && extra) {
        rc = (item = strdup(prim(c, P_VALUE))) ? 0 : BL_ENOMEM;
    }
    c->level--;
    if (rc)
        goto fail;

    const long long kl = (long long)k;
    if (!extra && (M == UNBOUNDED || M > kl))
        M = kl;
    if (M != UNBOUNDED && m > M) {
        rc = fail(c, BL_EINVAL, "minItems", at, "is larger than the %lld items the array may hold",
                  M);
        goto fail;
    }
    const size_t kk = M != UNBOUNDED && M < kl ? (size_t)M : k; /* tuple entries usable */
    const size_t rq = m < (long long)kk ? (size_t)m : kk;      /* ... and required */
    if (item) {
        TRY(sb_str(&grp, "( ws \",\" ws "));
        TRY(sb_str(&grp, item));
        TRY(sb_str(&grp, " )"));
    }
    if (kk > 0) {
        /* items after the whole tuple, then the optional tuple entries inside out */
        if (kk == k && item && (M == UNBOUNDED || M > kl))
            TRY(rep(c, &tail, grp.p, m > kl ? m - kl : 0, M == UNBOUNDED ? UNBOUNDED : M - kl,
                    "minItems", "maxItems", at));
        for (size_t j = kk; j-- > (rq > 1 ? rq : 1);) {
            TRY(sb_str(&t2, "( ws \",\" ws "));
            TRY(sb_str(&t2, pitem[j]));
            if (tail.n) {
                TRY(sb_str(&t2, " "));
                TRY(sb_add(&t2, tail.p, tail.n));
            }
            TRY(sb_str(&t2, " )?"));
            sb_free(&tail);
            tail = t2;
            memset(&t2, 0, sizeof t2);
        }
        TRY(sb_str(&el, pitem[0]));
        for (size_t j = 1; j < rq; j++) {
            TRY(sb_str(&el, " ws \",\" ws "));
            TRY(sb_str(&el, pitem[j]));
        }
    } else if (item && M != 0) {
        TRY(sb_str(&el, item));
        TRY(rep(c, &tail, grp.p, m > 0 ? m - 1 : 0, M == UNBOUNDED ? UNBOUNDED : M - 1,
                "minItems", "maxItems", at));
    }
    if (tail.n) {
        TRY(sb_str(&el, " "));
        TRY(sb_add(&el, tail.p, tail.n));
    }
    prim(c, P_WS);
    if (!el.n) {
        TRY(sb_str(out, "\"[\" ws \"]\""));
    } else {
        TRY(sb_str(out, m == 0 ? "\"[\" ws ( " : "\"[\" ws "));
        TRY(sb_add(out, el.p, el.n));
        TRY(sb_str(out, m == 0 ? " ws )? \"]\"" : " ws \"]\""));
    }
fail:
    for (size_t i = 0; i < k; i++)
        free(pitem[i]);
    free(item);
    sb_free(&tail);
    sb_free(&t2);
    sb_free(&el);
    sb_free(&grp);
    return rc;
}

/* --- string patterns ------------------------------------------------------------ */

/* A "pattern" (an ECMA-262 regular expression, no flags) becomes a tree of nodes, then
 * the GBNF of the string's content as JSON text: each character as JSON writes it, raw
 * or, for '"', '\' and control characters, as its escape (what json_escape writes), so
 * that a class taking '"' takes the two characters \" of the text. A side without its
 * anchor ('^', '$') is padded with any JSON string characters ("char*"). */

#define PAT_MAX_LEN 4096         /* bytes of a pattern */
#define PAT_MAX_GROUPS 64        /* groups inside groups */
#define PAT_MAX_CELLS (1u << 20) /* nodes, children and ranges of one pattern */
#define CP_MAX 0x10FFFFu
#define CP_NONE UINT32_MAX       /* an escape that stands for a set (\d, \s, ...) */
#define KIND_EMPTY (-1)          /* a body that matches only the empty text: no text */

typedef struct {
    uint32_t lo, hi;
} cprange_t;

/* Code point ranges; sorted, disjoint and not adjacent once set_norm ran. */
typedef struct {
    cprange_t *r;
    size_t n, cap;
} cpset_t;

enum { RX_SET, RX_SEQ, RX_ALT, RX_REP, RX_PAD };

typedef struct {
    int type;
    int nullable;       /* matches the empty text */
    size_t off, n;      /* RX_SET: ranges in rx.ranges; others: children in rx.kids */
    long long min, max; /* RX_REP: counts (max UNBOUNDED: no limit) */
} rxnode_t;

typedef struct {
    ctx_t *c;
    const path_t *at;
    const char *s, *p, *end; /* the pattern and the parser's place in it */
    int depth;               /* groups open */
    rxnode_t *nodes;
    size_t n_nodes, cap_nodes;
    int *kids;
    size_t n_kids, cap_kids;
    cprange_t *ranges;
    size_t n_ranges, cap_ranges;
} rx_t;

/* JavaScript's \d, \w, \s (WhiteSpace and LineTerminator) and the line breaks '.'
 * does not take. */
static const cprange_t RX_DIGIT[] = {{'0', '9'}};
static const cprange_t RX_WORD[] = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
static const cprange_t RX_SPACE[] = {
    {0x09, 0x0D},     {0x20, 0x20},     {0xA0, 0xA0},     {0x1680, 0x1680}, {0x2000, 0x200A},
    {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF},
};
static const cprange_t RX_BREAK[] = {{0x0A, 0x0A}, {0x0D, 0x0D}, {0x2028, 0x2029}};
/* The characters a JSON string holds raw: not '"', '\', a control or a surrogate. */
static const cprange_t RX_RAW[] = {{0x20, 0x21}, {0x23, 0x5B}, {0x5D, 0xD7FF}, {0xE000, CP_MAX}};
#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

static int set_add(cpset_t *s, uint32_t lo, uint32_t hi)
{
    if (grow((void **)&s->r, &s->cap, s->n, sizeof *s->r))
        return BL_ENOMEM;
    s->r[s->n++] = (cprange_t){lo, hi};
    return 0;
}

static int range_cmp(const void *a, const void *b)
{
    const cprange_t *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Sorts the ranges and merges those that overlap or touch. */
static void set_norm(cpset_t *s)
{
    size_t k = 0;
    if (s->n == 0)
        return;
    qsort(s->r, s->n, sizeof *s->r, range_cmp);
    for (size_t i = 1; i < s->n; i++) {
        if (s->r[i].lo <= s->r[k].hi + 1) {
            if (s->r[i].hi > s->r[k].hi)
                s->r[k].hi = s->r[i].hi;
        } else {
            s->r[++k] = s->r[i];
        }
    }
    s->n = k + 1;
}

/* The code points not in r[0, n) (normalized), added to out. */
static int set_invert(const cprange_t *r, size_t n, cpset_t *out)
{
    uint32_t next = 0;
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        if (r[i].lo > next)
            rc = set_add(out, next, r[i].lo - 1);
        next = r[i].hi + 1;
    }
    return rc || next > CP_MAX ? rc : set_add(out, next, CP_MAX);
}

/* The code points in both a and b (normalized), added to out. */
static int set_meet(const cprange_t *a, size_t na, const cprange_t *b, size_t nb, cpset_t *out)
{
    size_t i = 0, j = 0;
    int rc = 0;
    while (i < na && j < nb && !rc) {
        const uint32_t lo = a[i].lo > b[j].lo ? a[i].lo : b[j].lo;
        const uint32_t hi = a[i].hi < b[j].hi ? a[i].hi : b[j].hi;
        if (lo <= hi)
            rc = set_add(out, lo, hi);
        if (a[i].hi < b[j].hi)
            i++;
        else
            j++;
    }
    return rc;
}

/* A table (normalized), or with negate the code points not in it, added to s. */
static int set_table(cpset_t *s, const cprange_t *t, size_t n, int negate)
{
    int rc = 0;
    if (negate)
        return set_invert(t, n, s);
    for (size_t i = 0; i < n && !rc; i++)
        rc = set_add(s, t[i].lo, t[i].hi);
    return rc;
}

static int set_has(const cprange_t *r, size_t n, uint32_t cp)
{
    for (size_t i = 0; i < n; i++)
        if (r[i].lo <= cp && cp <= r[i].hi)
            return 1;
    return 0;
}

/* "'pattern' at PATH WHAT (at offset N)": where is a place in the pattern. */
BL_PRINTF(4, 5)
static int rx_fail(rx_t *x, int code, const char *where, const char *fmt, ...)
{
    char what[200];
    va_list ap;
    va_start(ap, fmt);
    (void)vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return fail(x->c, code, "pattern", x->at, "%s (at offset %zu)", what, (size_t)(where - x->s));
}

static int rx_room(rx_t *x)
{
    if (x->n_nodes + x->n_kids + x->n_ranges < PAT_MAX_CELLS)
        return 0;
    return rx_fail(x, BL_ERANGE, x->p, "is too complex to convert (over %u parts)", PAT_MAX_CELLS);
}

/* A node of type over kid[0, n) (a RX_SEQ or RX_ALT, or RX_REP's one child). */
static int rx_make(rx_t *x, int type, const int *kid, size_t n, int *id)
{
    int rc = rx_room(x);
    if (rc)
        return rc;
    if (grow((void **)&x->nodes, &x->cap_nodes, x->n_nodes, sizeof *x->nodes))
        return BL_ENOMEM;
    rxnode_t nd = {.type = type, .off = x->n_kids, .n = n, .nullable = type != RX_ALT};
    for (size_t i = 0; i < n; i++) {
        if (grow((void **)&x->kids, &x->cap_kids, x->n_kids, sizeof *x->kids))
            return BL_ENOMEM;
        x->kids[x->n_kids++] = kid[i];
        if (type == RX_ALT)
            nd.nullable |= x->nodes[kid[i]].nullable;
        else
            nd.nullable &= x->nodes[kid[i]].nullable;
    }
    if (type == RX_PAD)
        nd.nullable = 1;
    x->nodes[x->n_nodes] = nd;
    *id = (int)x->n_nodes++;
    return 0;
}

/* A set node of the normalized ranges r[0, n); an empty set is refused. */
static int rx_set(rx_t *x, const cprange_t *r, size_t n, const char *where, int *id)
{
    int rc = rx_room(x);
    if (rc)
        return rc;
    if (n == 0)
        return rx_fail(x, BL_EINVAL, where, "has a class that matches no character");
    if (grow((void **)&x->nodes, &x->cap_nodes, x->n_nodes, sizeof *x->nodes))
        return BL_ENOMEM;
    const size_t off = x->n_ranges;
    for (size_t i = 0; i < n; i++) {
        if (grow((void **)&x->ranges, &x->cap_ranges, x->n_ranges, sizeof *x->ranges))
            return BL_ENOMEM;
        x->ranges[x->n_ranges++] = r[i];
    }
    x->nodes[x->n_nodes] = (rxnode_t){.type = RX_SET, .off = off, .n = n};
    *id = (int)x->n_nodes++;
    return 0;
}

static int rx_char(rx_t *x, uint32_t cp, int *id)
{
    const cprange_t r = {cp, cp};
    return rx_set(x, &r, 1, x->p, id);
}

/* The code point of the UTF-8 sequence at x->p, moving past it. */
static int rx_utf8(rx_t *x, uint32_t *cp)
{
    const unsigned char *p = (const unsigned char *)x->p;
    const size_t left = (size_t)(x->end - x->p);
    const unsigned c = p[0];
    const size_t n = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3
                                 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (n == 0 || n > left)
        return rx_fail(x, BL_EINVAL, x->p, "is not valid UTF-8");
    uint32_t v = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xC0) != 0x80)
            return rx_fail(x, BL_EINVAL, x->p, "is not valid UTF-8");
        v = v << 6 | (p[i] & 0x3F);
    }
    x->p += n;
    *cp = v;
    return 0;
}

/* n hex digits at x->p as a number, moving past them; -1 when they are not there. */
static long rx_hex(rx_t *x, int n)
{
    long v = 0;
    if (x->end - x->p < n)
        return -1;
    for (int i = 0; i < n; i++) {
        const char h = x->p[i];
        const int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                      : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
        if (d < 0)
            return -1;
        v = v << 4 | d;
    }
    x->p += n;
    return v;
}

/* The escape whose '\' is at x->p: one code point (*cp), or a class escape (\d, \W,
 * ...) whose code points go into set (*cp = CP_NONE). in_class: inside [...], where
 * \b is a backspace. */
static int rx_escape(rx_t *x, int in_class, cpset_t *set, uint32_t *cp)
{
    static const char LETTERS[] = "tnrfv", CODES[] = "\t\n\r\f\v";
    const char *at = x->p++;
    if (x->p >= x->end)
        return rx_fail(x, BL_EINVAL, at, "ends with a lone '\\'");
    const char e = *x->p;
    const char *l = strchr(LETTERS, e);
    *cp = CP_NONE;
    if (e && l) {
        x->p++;
        *cp = (unsigned char)CODES[l - LETTERS];
        return 0;
    }
    switch (e) {
    case 'd': case 'D': x->p++; return set_table(set, RX_DIGIT, NELEM(RX_DIGIT), e == 'D');
    case 'w': case 'W': x->p++; return set_table(set, RX_WORD, NELEM(RX_WORD), e == 'W');
    case 's': case 'S': x->p++; return set_table(set, RX_SPACE, NELEM(RX_SPACE), e == 'S');
    case 'b':
        if (!in_class)
            return rx_fail(x, BL_EINVAL, at, "has a word boundary '\\b', which is not supported");
        x->p++;
        *cp = 0x08;
        return 0;
    case 'B': return rx_fail(x, BL_EINVAL, at, "has '\\B', which is not supported");
    case '0':
        if (x->p + 1 < x->end && x->p[1] >= '0' && x->p[1] <= '9')
            return rx_fail(x, BL_EINVAL, at, "has an octal escape, which is not supported");
        x->p++;
        *cp = 0;
        return 0;
    case 'x':
    case 'u': {
        x->p++;
        long v = rx_hex(x, e == 'x' ? 2 : 4);
        if (v < 0)
            return rx_fail(x, BL_EINVAL, at, "has '\\%c' without %d hex digits", e,
                           e == 'x' ? 2 : 4);
        /* a surrogate pair outside a class is the one character it encodes; a class
         * would hold its halves (no 'u' flag), which no UTF-8 text has */
        if (v >= 0xD800 && v <= 0xDBFF && !in_class && x->end - x->p >= 6 &&
            x->p[0] == '\\' && x->p[1] == 'u') {
            const char *back = x->p;
            x->p += 2;
            const long lo = rx_hex(x, 4);
            if (lo >= 0xDC00 && lo <= 0xDFFF)
                v = 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
            else
                x->p = back;
        }
        if (v >= 0xD800 && v <= 0xDFFF)
            return rx_fail(x, BL_EINVAL, at, "has a lone surrogate '\\u%04lX', which is not "
                           "supported", v);
        *cp = (uint32_t)v;
        return 0;
    }
    default:
        break;
    }
    if (e >= '1' && e <= '9')
        return rx_fail(x, BL_EINVAL, at, "has a backreference '\\%c', which is not supported", e);
    if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || e == '\0')
        return rx_fail(x, BL_EINVAL, at, "has the escape '\\%c', which is not supported",
                       e ? e : '0');
    return rx_utf8(x, cp); /* an escaped punctuation character is itself */
}

/* One class member at x->p: a code point (*cp), or a class escape added to s. */
static int rx_class_atom(rx_t *x, cpset_t *s, uint32_t *cp)
{
    if (*x->p == '\\')
        return rx_escape(x, 1, s, cp);
    return rx_utf8(x, cp);
}

/* A class [...] or [^...] whose '[' is at x->p. */
static int rx_class(rx_t *x, int *id)
{
    const char *at = x->p++;
    cpset_t s = {0}, inv = {0};
    int rc = 0, neg = 0;
    if (x->p < x->end && *x->p == '^') {
        neg = 1;
        x->p++;
    }
    for (;;) {
        uint32_t lo, hi;
        const char *from = x->p;
        if (x->p >= x->end) {
            rc = rx_fail(x, BL_EINVAL, at, "has a class '[' without its ']'");
            goto fail;
        }
        if (*x->p == ']') {
            x->p++;
            break;
        }
        TRY(rx_class_atom(x, &s, &lo));
        hi = lo;
        if (lo != CP_NONE && x->end - x->p >= 2 && x->p[0] == '-' && x->p[1] != ']') {
            x->p++;
            TRY(rx_class_atom(x, &s, &hi));
            if (hi == CP_NONE) {
                rc = rx_fail(x, BL_EINVAL, from, "has a range with a class escape");
                goto fail;
            }
            if (hi < lo) {
                rc = rx_fail(x, BL_EINVAL, from, "has a range out of order");
                goto fail;
            }
        }
        if (lo != CP_NONE)
            TRY(set_add(&s, lo, hi));
    }
    set_norm(&s);
    if (neg)
        TRY(set_invert(s.r, s.n, &inv));
    TRY(rx_set(x, neg ? inv.r : s.r, neg ? inv.n : s.n, at, id));
fail:
    free(s.r);
    free(inv.r);
    return rc;
}

/* The language of node id without the empty text, as a node (*out = -1: nothing is
 * left). A repetition of a part that can match nothing repeats this instead, since
 * the grammar engine refuses a repeated rule that can match nothing (left recursion). */
static int rx_nonempty(rx_t *x, int id, int *out)
{
    const rxnode_t nd = x->nodes[id];
    int *v = NULL, *alt = NULL, rc = 0;
    size_t n_alt = 0;
    *out = id;
    if (!nd.nullable)
        return 0;
    *out = -1;
    if (nd.type == RX_REP) { /* a nullable repetition has min 0 and a non-nullable child */
        const int kid = x->kids[nd.off];
        if (nd.max == 1) {
            *out = kid;
            return 0;
        }
        if ((rc = rx_make(x, RX_REP, &kid, 1, out)) != 0)
            return rc;
        x->nodes[*out].min = 1;
        x->nodes[*out].max = nd.max;
        x->nodes[*out].nullable = 0;
        return 0;
    }
    if (nd.type != RX_SEQ && nd.type != RX_ALT)
        return 0;
    if (!(v = malloc((nd.n + 1) * sizeof *v)) || !(alt = malloc((nd.n + 1) * sizeof *alt))) {
        rc = BL_ENOMEM;
        goto fail;
    }
    /* alternatives: a part's non-empty language; in a sequence (all parts nullable),
     * part i's non-empty language and the parts after it */
    for (size_t i = 0; i < nd.n; i++) {
        int a;
        TRY(rx_nonempty(x, x->kids[nd.off + i], &a));
        if (a < 0)
            continue;
        if (nd.type == RX_SEQ && i + 1 < nd.n) {
            v[0] = a;
            memcpy(v + 1, x->kids + nd.off + i + 1, (nd.n - i - 1) * sizeof *v);
            TRY(rx_make(x, RX_SEQ, v, nd.n - i, &a));
        }
        alt[n_alt++] = a;
    }
    if (n_alt == 1)
        *out = alt[0];
    else if (n_alt > 1)
        TRY(rx_make(x, RX_ALT, alt, n_alt, out));
fail:
    free(v);
    free(alt);
    return rc;
}

/* The quantifier at x->p (*, +, ?, {m}, {m,}, {m,n}, each maybe lazy) applied to
 * *atom, which becomes the repetition. */
static int rx_quant(rx_t *x, int *atom)
{
    const char *at = x->p;
    long long lo = 0, hi = UNBOUNDED;
    const char q = *x->p++;
    if (q == '+') {
        lo = 1;
    } else if (q == '?') {
        hi = 1;
    } else if (q == '{') {
        long long *v = &lo;
        int digits = 0;
        for (; x->p < x->end; x->p++) {
            const char ch = *x->p;
            if (ch >= '0' && ch <= '9') {
                if (*v <= MAX_REP)
                    *v = *v * 10 + (ch - '0');
                digits++;
            } else if (ch == ',' && v == &lo && digits) {
                v = &hi;
                hi = 0;
                digits = 0;
            } else {
                break;
            }
        }
        if (x->p >= x->end || *x->p != '}' || (v == &lo && !digits))
            return rx_fail(x, BL_EINVAL, at, "has a '{' that is not a quantifier {m}, {m,} or "
                           "{m,n} (write '\\{' for the character)");
        x->p++;
        if (v == &lo)
            hi = lo;
        else if (!digits)
            hi = UNBOUNDED;
        if (lo > MAX_REP || hi > MAX_REP)
            return rx_fail(x, BL_ERANGE, at, "has a count over %d, more than a grammar holds",
                           MAX_REP);
        if (hi != UNBOUNDED && hi < lo)
            return rx_fail(x, BL_EINVAL, at, "has {m,n} with n below m");
    }
    if (x->p < x->end && *x->p == '?')
        x->p++; /* lazy: the same language */
    if (hi == 0)
        return rx_make(x, RX_SEQ, NULL, 0, atom);
    int kid = *atom, rc;
    if (x->nodes[kid].nullable) { /* x{m,n} is then (x without "")({0,n}) */
        if ((rc = rx_nonempty(x, kid, &kid)) != 0)
            return rc;
        if (kid < 0)
            return rx_make(x, RX_SEQ, NULL, 0, atom);
        lo = 0;
    }
    if (lo == 1 && hi == 1) {
        *atom = kid;
        return 0;
    }
    if ((rc = rx_make(x, RX_REP, &kid, 1, atom)) != 0)
        return rc;
    x->nodes[*atom].min = lo;
    x->nodes[*atom].max = hi;
    x->nodes[*atom].nullable = lo == 0;
    return 0;
}

static int rx_alt(rx_t *x, int top, int *id);

static int push_int(int **v, size_t *n, size_t *cap, int val)
{
    if (grow((void **)v, cap, *n, sizeof **v))
        return BL_ENOMEM;
    (*v)[(*n)++] = val;
    return 0;
}

/* A group at x->p: ( ) or (?: ); others ((?=, (?<name>, ...) are refused. */
static int rx_group(rx_t *x, int *id)
{
    const char *at = x->p++;
    int rc;
    if (x->p < x->end && *x->p == '?') {
        const char a = x->end - x->p > 1 ? x->p[1] : '\0';
        const char b = x->end - x->p > 2 ? x->p[2] : '\0';
        if (a != ':')
            return rx_fail(x, BL_EINVAL, at, "has %s, which is not supported",
                           a == '=' ? "a lookahead '(?='"
                           : a == '!' ? "a negative lookahead '(?!'"
                           : a == '<' && (b == '=' || b == '!') ? "a lookbehind '(?<'"
                           : a == '<' ? "a named group '(?<'"
                                      : "a group '(?' with flags");
        x->p += 2;
    }
    if (++x->depth > PAT_MAX_GROUPS)
        return rx_fail(x, BL_ERANGE, at, "nests groups deeper than %d", PAT_MAX_GROUPS);
    if ((rc = rx_alt(x, 0, id)) != 0)
        return rc;
    if (x->p >= x->end || *x->p != ')')
        return rx_fail(x, BL_EINVAL, at, "has a group '(' without its ')'");
    x->p++;
    x->depth--;
    return 0;
}

/* One alternative: atoms and their quantifiers up to '|', ')' or the end. At the top
 * (top = 1) '^' may open it and '$' close it; a side without its anchor gets a pad. */
static int rx_seq(rx_t *x, int top, int *id)
{
    int *kid = NULL, rc = 0, atom, last = 0, end_anchor = 0;
    size_t n = 0, cap = 0;
    cpset_t s = {0};
    if (top && x->p < x->end && *x->p == '^') {
        x->p++;
    } else if (top) {
        TRY(rx_make(x, RX_PAD, NULL, 0, &atom));
        TRY(push_int(&kid, &n, &cap, atom));
    }
    last = -1;
    while (x->p < x->end && *x->p != '|' && *x->p != ')') {
        const char *at = x->p, ch = *x->p;
        uint32_t cp;
        if (ch == '$' && top && (x->p + 1 == x->end || x->p[1] == '|')) {
            x->p++;
            end_anchor = 1;
            break;
        }
        if (ch == '^' || ch == '$') {
            rc = rx_fail(x, BL_EINVAL, at, "has an anchor '%c' inside it, which is not supported "
                         "(only '^' at the start and '$' at the end)", ch);
            goto fail;
        }
        if (ch == '*' || ch == '+' || ch == '?' || ch == '{') {
            if (last < 0) {
                rc = rx_fail(x, BL_EINVAL, at, "has a quantifier '%c' with nothing to repeat", ch);
                goto fail;
            }
            TRY(rx_quant(x, &kid[last]));
            last = -1; /* "a**" is an error in JavaScript too */
            continue;
        }
        if (ch == '(') {
            TRY(rx_group(x, &atom));
        } else if (ch == '[') {
            TRY(rx_class(x, &atom));
        } else if (ch == '.') {
            x->p++;
            s.n = 0;
            TRY(set_table(&s, RX_BREAK, NELEM(RX_BREAK), 1));
            TRY(rx_set(x, s.r, s.n, at, &atom));
        } else if (ch == '\\') {
            s.n = 0;
            TRY(rx_escape(x, 0, &s, &cp));
            if (cp == CP_NONE)
                TRY(rx_set(x, s.r, s.n, at, &atom));
            else
                TRY(rx_char(x, cp, &atom));
        } else {
            TRY(rx_utf8(x, &cp));
            TRY(rx_char(x, cp, &atom));
        }
        last = (int)n;
        TRY(push_int(&kid, &n, &cap, atom));
    }
    /* an empty unanchored alternative needs one pad, not two */
    if (top && !end_anchor && !(n == 1 && x->nodes[kid[0]].type == RX_PAD)) {
        TRY(rx_make(x, RX_PAD, NULL, 0, &atom));
        TRY(push_int(&kid, &n, &cap, atom));
    }
    if (n == 1)
        *id = kid[0];
    else
        TRY(rx_make(x, RX_SEQ, kid, n, id));
fail:
    free(kid);
    free(s.r);
    return rc;
}

/* Alternatives separated by '|', up to ')' or the end; at the top (top = 1) to the end. */
static int rx_alt(rx_t *x, int top, int *id)
{
    int *alt = NULL, rc = 0, b;
    size_t n = 0, cap = 0;
    for (;;) {
        TRY(rx_seq(x, top, &b));
        TRY(push_int(&alt, &n, &cap, b));
        if (x->p >= x->end || *x->p != '|')
            break;
        x->p++;
    }
    if (top && x->p < x->end) {
        rc = rx_fail(x, BL_EINVAL, x->p, "has a ')' without its '('");
        goto fail;
    }
    if (n == 1)
        *id = alt[0];
    else
        TRY(rx_make(x, RX_ALT, alt, n, id));
fail:
    free(alt);
    return rc;
}

/* One code point in a GBNF class. */
static int class_char(sbuf_t *b, uint32_t cp)
{
    if (cp >= 0x20 && cp < 0x7F) {
        const char ch = (char)cp;
        return strchr("\\]-^\"[", ch) ? sb_fmt(b, "\\%c", ch) : sb_add(b, &ch, 1);
    }
    return cp <= 0xFF     ? sb_fmt(b, "\\x%02X", (unsigned)cp)
           : cp <= 0xFFFF ? sb_fmt(b, "\\u%04X", (unsigned)cp)
                          : sb_fmt(b, "\\U%08X", (unsigned)cp);
}

/* A GBNF class of the ranges r[0, n), "[^...]" when negated. */
static int class_text(sbuf_t *b, const cprange_t *r, size_t n, int negated)
{
    int rc = sb_str(b, negated ? "[^" : "[");
    for (size_t i = 0; i < n && !rc; i++) {
        rc = class_char(b, r[i].lo);
        if (!rc && r[i].hi > r[i].lo + 1)
            rc = sb_str(b, "-");
        if (!rc && r[i].hi > r[i].lo)
            rc = class_char(b, r[i].hi);
    }
    return rc ? rc : sb_str(b, "]");
}

/* The GBNF literal of code points cp[0, n) as JSON string content. */
static int lit_cps(sbuf_t *b, const uint32_t *cp, size_t n)
{
    sbuf_t u = {0}, j = {0};
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        char buf[4];
        const uint32_t v = cp[i];
        size_t k;
        if (v < 0x80) {
            buf[0] = (char)v;
            k = 1;
        } else if (v < 0x800) {
            buf[0] = (char)(0xC0 | v >> 6);
            buf[1] = (char)(0x80 | (v & 0x3F));
            k = 2;
        } else if (v < 0x10000) {
            buf[0] = (char)(0xE0 | v >> 12);
            buf[1] = (char)(0x80 | (v >> 6 & 0x3F));
            buf[2] = (char)(0x80 | (v & 0x3F));
            k = 3;
        } else {
            buf[0] = (char)(0xF0 | v >> 18);
            buf[1] = (char)(0x80 | (v >> 12 & 0x3F));
            buf[2] = (char)(0x80 | (v >> 6 & 0x3F));
            buf[3] = (char)(0x80 | (v & 0x3F));
            k = 4;
        }
        rc = sb_add(&u, buf, k);
    }
    if (!rc)
        rc = json_escape(&j, u.p ? u.p : "", u.n);
    if (!rc)
        rc = gbnf_lit(b, j.p ? j.p : "", j.n);
    sb_free(&u);
    sb_free(&j);
    return rc;
}

/* One alternative of emit_set: " | " before all but the first. */
static int set_alt(sbuf_t *b, int *n_alt)
{
    return (*n_alt)++ ? sb_str(b, " | ") : 0;
}

/* A set of more than one code point as JSON text: a class of the characters JSON
 * writes raw ("[^...]" when it reaches U+10FFFF), and the escapes of '"', '\' and
 * the control characters in it ("\\" [...], "\\u000" [...], "\\u001" [...]). */
static int emit_set(const cprange_t *r, size_t n, sbuf_t *out, int *kind)
{
    static const char SHORT[] = "\"\\\b\t\n\f\r", SHORT_AS[] = "\"\\btnfr";
    cpset_t raw = {0}, inv = {0}, esc = {0}, hex[2] = {{0}};
    int rc = 0, n_alt = 0, k = KIND_ITEM;
    TRY(set_meet(r, n, RX_RAW, NELEM(RX_RAW), &raw));
    if (raw.n) {
        n_alt++;
        if (raw.r[raw.n - 1].hi == CP_MAX) {
            TRY(set_invert(raw.r, raw.n, &inv));
            TRY(class_text(out, inv.r, inv.n, 1));
        } else {
            TRY(class_text(out, raw.r, raw.n, 0));
        }
    }
    for (uint32_t cp = 0; cp < 0x60; cp++) {
        if ((cp >= 0x20 && cp != '"' && cp != '\\') || !set_has(r, n, cp))
            continue;
        const char *sh = memchr(SHORT, (int)cp, sizeof SHORT - 1);
        if (sh)
            TRY(set_add(&esc, (unsigned char)SHORT_AS[sh - SHORT], (unsigned char)SHORT_AS[sh - SHORT]));
        else
            TRY(set_add(&hex[cp >> 4], "0123456789abcdef"[cp & 15], "0123456789abcdef"[cp & 15]));
    }
    if (esc.n == 1) {
        TRY(set_alt(out, &n_alt));
        const char ch = (char)esc.r[0].lo;
        TRY(ch == '"' || ch == '\\' ? sb_fmt(out, "\"\\\\\\%c\"", ch) : sb_fmt(out, "\"\\\\%c\"", ch));
    } else if (esc.n > 1) {
        TRY(set_alt(out, &n_alt));
        set_norm(&esc);
        TRY(sb_str(out, "\"\\\\\" "));
        TRY(class_text(out, esc.r, esc.n, 0));
        k = KIND_SEQ;
    }
    for (int h = 0; h < 2; h++) {
        if (!hex[h].n)
            continue;
        TRY(set_alt(out, &n_alt));
        if (hex[h].n == 1) {
            TRY(sb_fmt(out, "\"\\\\u00%d%c\"", h, (char)hex[h].r[0].lo));
        } else {
            set_norm(&hex[h]);
            TRY(sb_fmt(out, "\"\\\\u00%d\" ", h));
            TRY(class_text(out, hex[h].r, hex[h].n, 0));
            k = KIND_SEQ;
        }
    }
    *kind = n_alt > 1 ? KIND_ALT : k;
fail:
    free(raw.r);
    free(inv.r);
    free(esc.r);
    free(hex[0].r);
    free(hex[1].r);
    return rc;
}

static int rx_single(const rx_t *x, int id)
{
    const rxnode_t *nd = &x->nodes[id];
    return nd->type == RX_SET && nd->n == 1 && x->ranges[nd->off].lo == x->ranges[nd->off].hi;
}

/* Node id as GBNF into out; *kind: KIND_ITEM (one item: a quantifier may follow),
 * KIND_SEQ, KIND_ALT or KIND_EMPTY (nothing written). */
static int rx_emit(rx_t *x, int id, sbuf_t *out, int *kind)
{
    const rxnode_t nd = x->nodes[id];
    sbuf_t t = {0}, g = {0};
    uint32_t *run = NULL;
    int rc = 0, k;
    size_t items = 0;
    *kind = KIND_EMPTY;
    switch (nd.type) {
    case RX_PAD:
        *kind = KIND_SEQ;
        TRY(sb_str(out, prim(x->c, P_CHAR)));
        TRY(sb_str(out, "*"));
        break;
    case RX_SET:
        if (rx_single(x, id)) {
            *kind = KIND_ITEM;
            TRY(lit_cps(out, &x->ranges[nd.off].lo, 1));
        } else {
            TRY(emit_set(x->ranges + nd.off, nd.n, out, kind));
        }
        break;
    case RX_SEQ: /* runs of single characters become one literal */
        if (nd.n && !(run = malloc(nd.n * sizeof *run))) {
            rc = BL_ENOMEM;
            goto fail;
        }
        for (size_t i = 0; i < nd.n;) {
            size_t nrun = 0;
            t.n = 0;
            while (i < nd.n && rx_single(x, x->kids[nd.off + i]))
                run[nrun++] = x->ranges[x->nodes[x->kids[nd.off + i++]].off].lo;
            if (nrun) {
                k = KIND_ITEM;
                TRY(lit_cps(&t, run, nrun));
            } else {
                TRY(rx_emit(x, x->kids[nd.off + i++], &t, &k));
            }
            if (k == KIND_EMPTY)
                continue;
            TRY(sb_str(out, items++ ? " " : ""));
            if (k == KIND_ALT) {
                k = KIND_ITEM;
                TRY(sb_str(out, "( "));
                TRY(sb_add(out, t.p, t.n));
                TRY(sb_str(out, " )"));
            } else {
                TRY(sb_add(out, t.p, t.n));
            }
            *kind = items > 1 ? KIND_SEQ : k;
        }
        break;
    case RX_ALT:
        for (size_t i = 0; i < nd.n; i++) {
            TRY(sb_str(out, i ? " | " : ""));
            const size_t before = out->n;
            TRY(rx_emit(x, x->kids[nd.off + i], out, &k));
            if (out->n == before)
                TRY(sb_str(out, "\"\""));
        }
        *kind = KIND_ALT;
        break;
    default: /* RX_REP: its child, in a group unless it is one item */
        TRY(rx_emit(x, x->kids[nd.off], &g, &k));
        if (k == KIND_EMPTY)
            break;
        if (k != KIND_ITEM) {
            TRY(sb_str(&t, "( "));
            TRY(sb_add(&t, g.p, g.n));
            TRY(sb_str(&t, " )"));
        }
        TRY(rep_simple(out, k == KIND_ITEM ? g.p : t.p, nd.min, nd.max));
        *kind = KIND_SEQ;
    }
fail:
    sb_free(&t);
    sb_free(&g);
    free(run);
    return rc;
}

/* A string that "pattern" (JSON string pat) matches: its content as JSON text,
 * between the quotes. */
static int gen_pattern(ctx_t *c, const json_t *pat, const path_t *at, sbuf_t *out)
{
    rx_t x = {.c = c, .at = at};
    sbuf_t body = {0};
    int rc = 0, root, k;
    const size_t len = json_string_length(pat);
    if (len > PAT_MAX_LEN)
        return fail(c, BL_ERANGE, "pattern", at, "is longer than %d bytes", PAT_MAX_LEN);
    x.s = x.p = json_string_value(pat);
    x.end = x.s + len;
    TRY(rx_alt(&x, 1, &root));
    TRY(rx_emit(&x, root, &body, &k));
    TRY(sb_str(out, "\"\\\"\" "));
    if (k == KIND_ALT)
        TRY(sb_str(out, "( "));
    if (k != KIND_EMPTY)
        TRY(sb_add(out, body.p, body.n));
    if (k != KIND_EMPTY)
        TRY(sb_str(out, k == KIND_ALT ? " ) " : " "));
    TRY(sb_str(out, "\"\\\"\""));
fail:
    free(x.nodes);
    free(x.kids);
    free(x.ranges);
    sb_free(&body);
    return rc;
}

/* A string: a fixed shape for a known format, else what 'pattern' matches, else
 * minLength to maxLength JSON string characters (an escape counts as one). A pattern
 * beside a known format or a length is refused: the grammar cannot intersect them. */
static int gen_string(ctx_t *c, const json_t *s, const path_t *at, sbuf_t *out, int *kind)
{
    static const struct {
        const char *name;
        int prim;
    } FORMATS[] = {
        {"date", P_DATE_S}, {"time", P_TIME_S}, {"date-time", P_DATETIME_S}, {"uuid", P_UUID_S},
    };
    const json_t *f = json_object_get(s, "format"), *pat = json_object_get(s, "pattern");
    long long lo = 0, hi = UNBOUNDED;
    int has_lo, has_hi, fp = -1, rc;
    sbuf_t t = {0};
    *kind = KIND_ITEM;
    if (f && !json_is_string(f))
        return fail(c, BL_EINVAL, "format", at, "must be a string");
    for (size_t i = 0; f && i < sizeof FORMATS / sizeof FORMATS[0]; i++)
        if (strcmp(json_string_value(f), FORMATS[i].name) == 0)
            fp = FORMATS[i].prim;
    if ((rc = get_count(c, s, "minLength", at, &lo, &has_lo)) != 0 ||
        (rc = get_count(c, s, "maxLength", at, &hi, &has_hi)) != 0)
        return rc;
    if (!has_hi)
        hi = UNBOUNDED;
    if (pat && !json_is_string(pat))
        return fail(c, BL_EINVAL, "pattern", at, "must be a string");
    if (pat && (fp >= 0 || has_lo || has_hi))
        return fail(c, BL_EINVAL, "pattern", at, "cannot be combined with '%s'",
                    fp >= 0 ? "format" : has_lo ? "minLength" : "maxLength");
    if (pat) {
        *kind = KIND_SEQ;
        return gen_pattern(c, pat, at, out);
    }
    if (fp >= 0 && (has_lo || has_hi))
        return fail(c, BL_EINVAL, has_lo ? "minLength" : "maxLength", at,
                    "cannot be combined with 'format' '%s'", json_string_value(f));
    if (fp >= 0)
        return sb_str(out, prim(c, fp));
    if (!has_lo && !has_hi)
        return sb_str(out, prim(c, P_STRING));
    if (hi != UNBOUNDED && lo > hi)
        return fail(c, BL_EINVAL, "minLength", at, "is larger than 'maxLength'");
    *kind = KIND_SEQ;
    TRY(rep(c, &t, prim(c, P_CHAR), lo, hi, "minLength", "maxLength", at));
    TRY(sb_str(out, "\"\\\"\" "));
    if (t.n) {
        TRY(sb_add(out, t.p, t.n));
        TRY(sb_str(out, " "));
    }
    TRY(sb_str(out, "\"\\\"\""));
fail:
    sb_free(&t);
    return rc;
}

/* --- integer ranges ------------------------------------------------------------ */

/* The largest magnitude rule "integer" writes (16 digits): the limit of a side that
 * has no bound. */
#define INT_LIM 9999999999999999LL

/* The alternatives of a range under construction: *n_alt so far in b, each a
 * sequence of items separated by spaces. */
typedef struct {
    sbuf_t *b;
    int n_alt;
} alts_t;

/* Appends alternatives built apart (n_alt of them in alts): grouped in parentheses
 * when there are several. */
static int sb_group(sbuf_t *b, const sbuf_t *alts, int n_alt)
{
    int rc = sb_str(b, n_alt > 1 ? "( " : "");
    if (!rc)
        rc = sb_add(b, alts->p, alts->n);
    return rc ? rc : sb_str(b, n_alt > 1 ? " )" : "");
}

/* Starts an alternative with the literal digits pre[0, npre) (none when npre is 0). */
static int alt_begin(alts_t *a, const char *pre, size_t npre)
{
    int rc = a->n_alt++ ? sb_str(a->b, " | ") : 0;
    if (!rc && npre)
        rc = gbnf_lit(a->b, pre, npre);
    return rc;
}

/* Appends " [0-9]{m,n}" (any digit, m to n times, in its shortest spelling) to an
 * alternative; nothing when n is 0. */
static int any_digits(sbuf_t *b, int m, int n)
{
    if (n == 0)
        return 0;
    if (m == 0 && n == 1)
        return sb_str(b, " [0-9]?");
    if (m == n)
        return n == 1 ? sb_str(b, " [0-9]") : sb_fmt(b, " [0-9]{%d}", n);
    return sb_fmt(b, " [0-9]{%d,%d}", m, n);
}

/* Whether the n digits at p are all ch. */
static int all_digit(const char *p, size_t n, char ch)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != ch)
            return 0;
    return 1;
}

/* The n-digit strings from x to y (digit strings of one length, x <= y), each after
 * the literal digits pre[0, npre), as alternatives: the leading digits both share join
 * the prefix; at the first digit that differs come x's digit with x's tail up to
 * 9...9, the digits between with any tail, and y's digit with 0...0 up to y's tail.
 * A tail of x that is 0...0 (or of y that is 9...9) needs no alternative of its own:
 * its digit joins the middle. n is at most 19 (2^63 has 19 digits), the length of
 * NINES and ZEROS; pre has room for as many. */
static int range_digits(alts_t *a, char *pre, size_t npre, const char *x, const char *y,
                        size_t n)
{
    static const char NINES[] = "9999999999999999999", ZEROS[] = "0000000000000000000";
    int rc;
    while (n && *x == *y) {
        pre[npre++] = *x++;
        y++;
        n--;
    }
    if (n == 0)
        return alt_begin(a, pre, npre);
    char lo = x[0], hi = y[0];
    if (!all_digit(x + 1, n - 1, '0')) {
        pre[npre] = x[0];
        if ((rc = range_digits(a, pre, npre + 1, x + 1, NINES, n - 1)) != 0)
            return rc;
        lo++;
    }
    const int y_full = all_digit(y + 1, n - 1, '9');
    if (!y_full)
        hi--;
    if (lo <= hi) {
        if (lo == hi) {
            pre[npre] = lo;
            rc = alt_begin(a, pre, npre + 1);
        } else {
            rc = alt_begin(a, pre, npre);
            if (!rc)
                rc = sb_fmt(a->b, npre ? " [%c-%c]" : "[%c-%c]", lo, hi);
        }
        if (!rc)
            rc = any_digits(a->b, (int)n - 1, (int)n - 1);
        if (rc)
            return rc;
    }
    if (!y_full) {
        pre[npre] = y[0];
        return range_digits(a, pre, npre + 1, ZEROS, y + 1, n - 1);
    }
    return 0;
}

static unsigned ndigits(uint64_t v)
{
    unsigned n = 1;
    while (v >= 10) {
        v /= 10;
        n++;
    }
    return n;
}

static uint64_t pow10u(unsigned n)
{
    uint64_t p = 1;
    while (n--)
        p *= 10;
    return p;
}

/* The numbers from x to y, of one digit count, as alternatives. */
static int range_len(alts_t *a, uint64_t x, uint64_t y)
{
    char xs[24], ys[24], pre[24];
    (void)snprintf(xs, sizeof xs, "%" PRIu64, x);
    (void)snprintf(ys, sizeof ys, "%" PRIu64, y);
    return range_digits(a, pre, 0, xs, ys, strlen(xs));
}

/* The canonical decimals from x to y (0 <= x <= y <= 2^63) as alternatives: by digit
 * count, where the counts x and y do not fill go by range_len and the counts between
 * (all of their numbers) share one "[1-9] [0-9]{m,n}". */
static int range_nonneg(alts_t *a, uint64_t x, uint64_t y)
{
    int rc;
    if (y <= 9) {
        if ((rc = alt_begin(a, NULL, 0)) != 0)
            return rc;
        return x == y ? sb_fmt(a->b, "\"%c\"", (char)('0' + x))
                      : sb_fmt(a->b, "[%c-%c]", (char)('0' + x), (char)('0' + y));
    }
    if (x == 0) {
        if ((rc = alt_begin(a, "0", 1)) != 0)
            return rc;
        x = 1;
    }
    const unsigned lx = ndigits(x), ly = ndigits(y);
    if (lx == ly)
        return range_len(a, x, y);
    unsigned from = lx, to = ly; /* the digit counts whose numbers all come in */
    if (x != pow10u(lx - 1)) {
        if ((rc = range_len(a, x, pow10u(lx) - 1)) != 0)
            return rc;
        from++;
    }
    if (y != pow10u(ly) - 1)
        to--;
    if (from <= to &&
        ((rc = alt_begin(a, NULL, 0)) != 0 || (rc = sb_str(a->b, "[1-9]")) != 0 ||
         (rc = any_digits(a->b, (int)from - 1, (int)to - 1)) != 0))
        return rc;
    return to < ly ? range_len(a, pow10u(ly - 1), y) : 0;
}

/* The range keywords of integers and numbers: which end each bounds, and whether
 * the end is left out. */
static const struct {
    const char *kw;
    int upper, exclusive;
} RANGE_KW[] = {
    {"minimum", 0, 0}, {"exclusiveMinimum", 0, 1},
    {"maximum", 1, 0}, {"exclusiveMaximum", 1, 1},
};

/* One bound keyword kw as an integer: for a lower bound the least integer at or
 * above it (above it when exclusive), for an upper one the greatest at or below it
 * (below it when exclusive). A bound past the far end of int64 clamps to that end;
 * *none: no int64 meets it (a lower bound above INT64_MAX, an upper one below
 * INT64_MIN). *present = 0 when absent. */
static int get_bound(ctx_t *c, const json_t *s, const char *kw, int upper, int exclusive,
                     const path_t *at, long long *val, int *present, int *none)
{
    const json_t *v = json_object_get(s, kw);
    *present = v != NULL;
    *none = 0;
    *val = 0;
    if (!v)
        return 0;
    if (json_is_boolean(v))
        return fail(c, BL_EINVAL, kw, at,
                    "as a boolean (draft 4) is not supported; give the bound as a number");
    if (!json_is_number(v))
        return fail(c, BL_EINVAL, kw, at, "must be a number");
    long long x;
    if (json_is_integer(v)) {
        x = (long long)json_integer_value(v);
    } else {
        const double d = json_real_value(v);
        /* the integer next to d inward (ceil for a lower bound), or outward when
         * exclusive, since the step below moves it in by one */
        const double f = upper == exclusive ? ceil(d) : floor(d);
        if (f >= 9223372036854775808.0) { /* 2^63 */
            *none = !upper;
            *val = INT64_MAX;
            return 0;
        }
        if (f < -9223372036854775808.0) {
            *none = upper;
            *val = INT64_MIN;
            return 0;
        }
        x = (long long)f;
    }
    if (!exclusive) {
        *val = x;
    } else if (upper) {
        *none = x == INT64_MIN;
        *val = x - !*none;
    } else {
        *none = x == INT64_MAX;
        *val = x + !*none;
    }
    return 0;
}

/* An integer: the canonical decimals (no leading zeros, no "-0") from the lower
 * bound to the upper one, minimum / exclusiveMinimum and maximum / exclusiveMaximum,
 * the tighter of each pair (non-integral bounds round inward). A side without a bound
 * stops at 16 digits, as rule "integer" does, unless the other bound lies past that:
 * then it stops at the end of int64. The negative part is "-" and the magnitudes.
 * multipleOf is honoured only as 1. */
static int gen_integer(ctx_t *c, const json_t *s, const path_t *at, sbuf_t *out, int *kind)
{
    const json_t *mo = json_object_get(s, "multipleOf");
    const char *kw_lo = NULL, *kw_hi = NULL;
    long long lo = 0, hi = 0;
    sbuf_t neg = {0};
    const size_t start = out->n;
    int rc = 0;
    *kind = KIND_ITEM;
    if (mo && (!json_is_number(mo) || json_number_value(mo) <= 0))
        return fail(c, BL_EINVAL, "multipleOf", at, "must be a number above 0");
    if (mo && json_number_value(mo) != 1.0)
        return fail(c, BL_EINVAL, "multipleOf", at, "is not supported (only 1 on an 'integer' is)");
    for (size_t i = 0; i < sizeof RANGE_KW / sizeof RANGE_KW[0]; i++) {
        long long v;
        int present, none;
        if ((rc = get_bound(c, s, RANGE_KW[i].kw, RANGE_KW[i].upper, RANGE_KW[i].exclusive, at, &v,
                            &present, &none)) != 0)
            return rc;
        if (!present)
            continue;
        if (none)
            return fail(c, BL_EINVAL, RANGE_KW[i].kw, at, "leaves no integer in int64 (%s %lld)",
                        RANGE_KW[i].upper ? "the least is" : "the most is",
                        RANGE_KW[i].upper ? (long long)INT64_MIN : (long long)INT64_MAX);
        if (!RANGE_KW[i].upper && (!kw_lo || v > lo)) {
            lo = v;
            kw_lo = RANGE_KW[i].kw;
        } else if (RANGE_KW[i].upper && (!kw_hi || v < hi)) {
            hi = v;
            kw_hi = RANGE_KW[i].kw;
        }
    }
    if (!kw_lo)
        lo = kw_hi && hi < -INT_LIM ? INT64_MIN : -INT_LIM;
    if (!kw_hi)
        hi = kw_lo && lo > INT_LIM ? INT64_MAX : INT_LIM;
    if (lo > hi)
        return fail(c, BL_EINVAL, kw_lo, at,
                    "and '%s' leave no integer (the range would be [%lld, %lld])", kw_hi, lo, hi);
    /* the ranges the fixed rules already write ("integer" is no such range: it takes
     * "-0", which "number" needs) */
    if (!kw_lo && !kw_hi)
        return sb_str(out, prim(c, P_INTEGER));
    if (lo == 0 && hi == INT_LIM)
        return sb_str(out, prim(c, P_NONNEG));
    if (lo == 1 && hi == INT_LIM)
        return sb_str(out, prim(c, P_POS));

    alts_t top = {out, 0};
    if (lo < 0) { /* "-" and the magnitudes from max(-hi, 1) to -lo */
        alts_t mag = {&neg, 0};
        const uint64_t m_lo = hi < 0 ? (uint64_t)0 - (uint64_t)hi : 1;
        TRY(range_nonneg(&mag, m_lo, (uint64_t)0 - (uint64_t)lo));
        TRY(alt_begin(&top, "-", 1));
        TRY(sb_str(out, " "));
        TRY(sb_group(out, &neg, mag.n_alt));
    }
    if (hi >= 0)
        TRY(range_nonneg(&top, lo < 0 ? 0 : (uint64_t)lo, (uint64_t)hi));
    *kind = top.n_alt > 1                                 ? KIND_ALT
            : memchr(out->p + start, ' ', out->n - start) ? KIND_SEQ
                                                          : KIND_ITEM;
fail:
    sb_free(&neg);
    return rc;
}

/* --- number ranges ------------------------------------------------------------- */

/* Most fraction digits a bounded number takes, as rule "number" (a bound with more
 * is refused). */
#define FRAC_LIM 16

/* A bound as an exact decimal: sign, integer part (big: past 19 digits), fraction
 * digits without trailing zeros. */
typedef struct {
    int present, incl, neg, big, nf;
    uint64_t ip;
    char fp[FRAC_LIM + 1];
    const char *kw;
} dec_t;

/* The shortest decimal that reads back as the double x, into d (its sign, integer
 * part and fraction); BL_ERANGE when its fraction has more than FRAC_LIM digits. */
static int dec_of_double(double x, dec_t *d)
{
    char buf[40];
    for (int p = 1; p <= 17; p++) {
        (void)snprintf(buf, sizeof buf, "%.*e", p - 1, x);
        if (strtod(buf, NULL) == x)
            break;
    }
    d->neg = buf[0] == '-';
    const char *m = buf + d->neg;
    char dig[24];
    int nd = 0;
    for (; *m && *m != 'e'; m++)
        if (*m >= '0' && *m <= '9')
            dig[nd++] = *m;
    const int e = *m == 'e' ? atoi(m + 1) : 0; /* value = dig[0].dig[1..] x 10^e */
    d->ip = 0;
    d->big = 0;
    d->nf = 0;
    for (int i = 0; i < nd || i <= e; i++) {
        const int digit = i < nd ? dig[i] - '0' : 0;
        const int place = e - i; /* 10^place */
        if (place >= 0) {
            if (d->ip > (UINT64_MAX - 9) / 10)
                d->big = 1;
            else
                d->ip = d->ip * 10 + (uint64_t)digit;
        } else if (i < nd) {
            const int at = -place - 1; /* fraction index */
            if (at >= FRAC_LIM)
                return BL_ERANGE;
            while (d->nf < at)
                d->fp[d->nf++] = '0';
            d->fp[d->nf++] = (char)('0' + digit);
        }
    }
    while (d->nf && d->fp[d->nf - 1] == '0')
        d->nf--;
    d->fp[d->nf] = '\0';
    if (d->big)
        d->ip = UINT64_MAX;
    if (d->ip == 0 && d->nf == 0)
        d->neg = 0;
    return 0;
}

/* Compares two decimals' values (<0, 0, >0). */
static int dec_cmp(const dec_t *a, const dec_t *b)
{
    if (a->neg != b->neg)
        return a->neg ? -1 : 1;
    int r = a->ip < b->ip ? -1 : a->ip > b->ip ? 1 : 0;
    if (r == 0) {
        for (int i = 0; i < FRAC_LIM && r == 0; i++) {
            const char x = i < a->nf ? a->fp[i] : '0', y = i < b->nf ? b->fp[i] : '0';
            r = (x > y) - (x < y);
        }
    }
    return a->neg ? -r : r;
}

/* A fraction under construction: the digit strings after "." (up to FRAC_LIM) whose
 * value 0.s lies above lo (when tl) and below hi (when th), each end inclusive or
 * not. States (i, tl, th): i digits taken, still equal to lo's (tl) or hi's (th)
 * first i digits; a state that is neither is free ([0-9]*). rules[i][tl][th]: the
 * rule of a tight state once named. */
typedef struct {
    ctx_t *c;
    const char *lo, *hi;
    int nlo, nhi, inc_lo, inc_hi;
    char *names[FRAC_LIM + 1][2][2];
    signed char live[FRAC_LIM + 1][2][2]; /* -1 unknown */
} frac_t;

static char frac_dig(const char *f, int n, int i) { return i < n ? f[i] : '0'; }

/* Whether the value may stop after i digits in state (tl, th). */
static int frac_end_ok(const frac_t *f, int i, int tl, int th)
{
    return (!tl || (i >= f->nlo && f->inc_lo)) && (!th || i < f->nhi || f->inc_hi);
}

static int frac_live(frac_t *f, int i, int tl, int th)
{
    if (!tl && !th)
        return 1;
    if (f->live[i][tl][th] >= 0)
        return f->live[i][tl][th];
    int ok = frac_end_ok(f, i, tl, th);
    if (!ok && i < FRAC_LIM) {
        const char a = tl ? frac_dig(f->lo, f->nlo, i) : '0', b = th ? frac_dig(f->hi, f->nhi, i) : '9';
        for (char d = a; d <= b && !ok; d++)
            ok = frac_live(f, i + 1, tl && d == a, th && d == b);
    }
    f->live[i][tl][th] = (signed char)ok;
    return ok;
}

static int frac_ref(frac_t *f, int i, int tl, int th, sbuf_t *b);

/* The alternatives of state (i, tl, th) into b (none when it is dead), with the
 * empty one when eps and the value may stop here; *n counts them. */
static int frac_alts(frac_t *f, int i, int tl, int th, int eps, sbuf_t *b, int *n)
{
    int rc = 0;
    *n = 0;
    if (eps && frac_end_ok(f, i, tl, th)) {
        TRY(sb_str(b, "\"\""));
        (*n)++;
    }
    if (i >= FRAC_LIM)
        return 0;
    const char a = tl ? frac_dig(f->lo, f->nlo, i) : '0', z = th ? frac_dig(f->hi, f->nhi, i) : '9';
    if (a > z)
        return 0;
    /* the digit equal to a tight bound's, then the free ones between */
    char lo_free = a, hi_free = z;
    if (tl || th) {
        const int tl2 = tl, th2 = th && a == z;
        if (tl && frac_live(f, i + 1, tl2, th2)) {
            TRY(sb_fmt(b, *n ? " | \"%c\"" : "\"%c\"", a));
            TRY(frac_ref(f, i + 1, tl2, th2, b));
            (*n)++;
        }
        if (tl)
            lo_free = (char)(a + 1);
        if (th && !(tl && a == z) && frac_live(f, i + 1, 0, 1)) {
            TRY(sb_fmt(b, *n ? " | \"%c\"" : "\"%c\"", z));
            TRY(frac_ref(f, i + 1, 0, 1, b));
            (*n)++;
        }
        if (th)
            hi_free = (char)(z - 1);
    }
    if (lo_free <= hi_free) {
        TRY(sb_str(b, *n ? " | " : ""));
        TRY(lo_free == hi_free ? sb_fmt(b, "\"%c\"", lo_free) : sb_fmt(b, "[%c-%c]", lo_free, hi_free));
        TRY(any_digits(b, 0, FRAC_LIM - i - 1));
        (*n)++;
    }
fail:
    return rc;
}

/* Appends " NAME" for a live tight state (its rule made on first use), or the free
 * digits. */
static int frac_ref(frac_t *f, int i, int tl, int th, sbuf_t *b)
{
    if (!tl && !th)
        return any_digits(b, 0, FRAC_LIM - i);
    /* past an inclusive bound's last digit: any digits above a lower bound, zeros
     * only against an upper one */
    if (!th && i >= f->nlo && f->inc_lo)
        return any_digits(b, 0, FRAC_LIM - i);
    if (th && i >= f->nhi && f->inc_hi && (!tl || (i >= f->nlo && f->inc_lo)))
        return FRAC_LIM - i == 0 ? 0 : sb_fmt(b, " \"0\"{0,%d}", FRAC_LIM - i);
    int rc = 0;
    if (!f->names[i][tl][th]) {
        char *name = NULL;
        size_t slot;
        sbuf_t body = {0};
        int n;
        if ((rc = name_take(f->c, "number-fraction", &name)) != 0)
            return rc;
        if ((rc = rule_push(f->c, &slot)) != 0) {
            free(name);
            return rc;
        }
        f->c->rules[slot].name = name;
        f->names[i][tl][th] = name;
        if ((rc = frac_alts(f, i, tl, th, 1, &body, &n)) != 0 || (rc = rule_body(f->c, slot, sb_take(&body))) != 0) {
            sb_free(&body);
            return rc;
        }
    }
    return sb_fmt(b, " %s", f->names[i][tl][th]);
}

/* Appends the fraction part after an integer part equal to lo's (lo given) and/or
 * hi's: " ( "." ... )?" or " "." ( ... )", nothing when only no fraction fits;
 * *dead when nothing fits. */
static int frac_part(ctx_t *c, const dec_t *lo, const dec_t *hi, sbuf_t *b, int *dead)
{
    frac_t f = {.c = c};
    memset(f.live, -1, sizeof f.live);
    const int tl = lo != NULL, th = hi != NULL;
    if (lo) {
        f.lo = lo->fp;
        f.nlo = lo->nf;
        f.inc_lo = lo->incl;
    }
    if (hi) {
        f.hi = hi->fp;
        f.nhi = hi->nf;
        f.inc_hi = hi->incl;
    }
    sbuf_t alts = {0};
    int n = 0, rc = frac_alts(&f, 0, tl, th, 0, &alts, &n);
    const int stop_ok = frac_end_ok(&f, 0, tl, th);
    *dead = !rc && n == 0 && !stop_ok;
    if (!rc && n && (rc = sb_str(b, stop_ok ? " ( \".\" ( " : " \".\" ( ")) == 0 &&
        (rc = sb_add(b, alts.p, alts.n)) == 0)
        rc = sb_str(b, stop_ok ? " ) )?" : " )");
    sb_free(&alts);
    return rc;
}

/* Appends the alternative "ip" and the fraction part frac_part allows after it
 * (against lo's and/or hi's digits), unless none does. */
static int int_then_frac(ctx_t *c, alts_t *a, uint64_t ip, const dec_t *lo, const dec_t *hi)
{
    sbuf_t tail = {0};
    char digits[24];
    int dead, rc = frac_part(c, lo, hi, &tail, &dead);
    if (!rc && !dead) {
        (void)snprintf(digits, sizeof digits, "%" PRIu64, ip);
        if ((rc = alt_begin(a, digits, strlen(digits))) == 0)
            rc = sb_add(a->b, tail.p, tail.n);
    }
    sb_free(&tail);
    return rc;
}

/* Appends the non-negative plain decimals w (no exponent, no leading zeros) with
 * lo <= w <= hi (each end inclusive or not, hi may be absent: up to 16 integer
 * digits) as alternatives. */
static int number_nonneg(ctx_t *c, alts_t *a, const dec_t *lo, const dec_t *hi)
{
    if (hi && hi->ip == lo->ip)
        return int_then_frac(c, a, lo->ip, lo, hi);
    int rc = int_then_frac(c, a, lo->ip, lo, NULL);
    sbuf_t mid = {0};
    const uint64_t m_hi = hi ? hi->ip - 1 : (uint64_t)INT_LIM;
    if (!rc && lo->ip + 1 <= m_hi) {
        alts_t m = {&mid, 0};
        TRY(range_nonneg(&m, lo->ip + 1, m_hi));
        TRY(alt_begin(a, NULL, 0));
        TRY(sb_group(a->b, &mid, m.n_alt));
        TRY(sb_fmt(a->b, " ( \".\" [0-9]{1,%d} )?", FRAC_LIM));
    }
    if (!rc && hi)
        rc = int_then_frac(c, a, hi->ip, NULL, hi);
fail:
    sb_free(&mid);
    return rc;
}

/* A number with bounds: the plain decimals (no exponent, no "-0", at most 16 integer
 * and 16 fraction digits) from the lower bound to the upper one, minimum /
 * exclusiveMinimum and maximum / exclusiveMaximum, the tighter of each pair. The
 * bounds are read as the shortest decimals of their doubles (0.1 is 0.1). The
 * negative part is "-" and the magnitudes. multipleOf is not supported. */
static int gen_number(ctx_t *c, const json_t *s, const path_t *at, sbuf_t *out, int *kind)
{
    dec_t lo = {0}, hi = {0};
    int rc = 0;
    *kind = KIND_ITEM;
    if (json_object_get(s, "multipleOf"))
        return fail(c, BL_EINVAL, "multipleOf", at, "is not supported on a 'number'");
    for (size_t i = 0; i < sizeof RANGE_KW / sizeof RANGE_KW[0]; i++) {
        const json_t *v = json_object_get(s, RANGE_KW[i].kw);
        if (!v)
            continue;
        if (json_is_boolean(v))
            return fail(c, BL_EINVAL, RANGE_KW[i].kw, at,
                        "as a boolean (draft 4) is not supported; give the bound as a number");
        if (!json_is_number(v) || !isfinite(json_number_value(v)))
            return fail(c, BL_EINVAL, RANGE_KW[i].kw, at, "must be a number");
        dec_t d = {.present = 1, .incl = !RANGE_KW[i].exclusive, .kw = RANGE_KW[i].kw};
        if (json_is_integer(v)) {
            const json_int_t x = json_integer_value(v);
            d.neg = x < 0;
            d.ip = x < 0 ? (uint64_t)0 - (uint64_t)x : (uint64_t)x;
        } else if (dec_of_double(json_real_value(v), &d) != 0) {
            return fail(c, BL_EINVAL, RANGE_KW[i].kw, at, "has more than %d decimals", FRAC_LIM);
        }
        dec_t *cur = RANGE_KW[i].upper ? &hi : &lo;
        const int r = cur->present ? dec_cmp(&d, cur) : 0;
        /* the tighter: higher lower bounds, lower upper ones, exclusive on a tie */
        if (!cur->present || (RANGE_KW[i].upper ? r < 0 : r > 0) || (r == 0 && !d.incl))
            *cur = d;
    }
    if (!lo.present && !hi.present)
        return sb_str(out, prim(c, P_NUMBER));
    if (lo.present && hi.present) {
        const int r = dec_cmp(&lo, &hi);
        if (r > 0 || (r == 0 && (!lo.incl || !hi.incl)))
            return fail(c, BL_EINVAL, lo.kw, at, "and '%s' leave no number", hi.kw);
    }
    alts_t top = {out, 0};
    const size_t start = out->n;
    sbuf_t neg = {0};
    /* the magnitudes below zero: lower end from the upper bound (or just above 0),
     * upper end from the lower bound (or none) */
    if (!lo.present || lo.neg) {
        dec_t wl = {.present = 1, .incl = 0}, wh = lo;
        if (hi.present && hi.neg) {
            wl = hi;
            wl.neg = 0;
        }
        wh.neg = 0;
        const int have_hi = lo.present && !lo.big && lo.ip <= (uint64_t)INT_LIM;
        if (wl.big || wl.ip > (uint64_t)INT_LIM) {
            /* no magnitude this large is written */
        } else {
            alts_t mag = {&neg, 0};
            TRY(number_nonneg(c, &mag, &wl, have_hi ? &wh : NULL));
            if (mag.n_alt) {
                TRY(alt_begin(&top, "-", 1));
                TRY(sb_str(out, " "));
                TRY(sb_group(out, &neg, mag.n_alt));
            }
        }
    }
    if (!hi.present || !hi.neg) {
        dec_t wl = lo.present && !lo.neg ? lo : (dec_t){.present = 1, .incl = 1};
        const int have_hi = hi.present && !hi.big && hi.ip <= (uint64_t)INT_LIM;
        if (!wl.big && wl.ip <= (uint64_t)INT_LIM && !(hi.present && dec_cmp(&hi, &wl) < 0))
            TRY(number_nonneg(c, &top, &wl, have_hi ? &hi : NULL));
    }
    if (top.n_alt == 0)
        TRY(fail(c, BL_EINVAL, lo.present ? lo.kw : hi.kw, at, "leaves no number of at most 16 digits"));
    *kind = top.n_alt > 1                                 ? KIND_ALT
            : memchr(out->p + start, ' ', out->n - start) ? KIND_SEQ
                                                          : KIND_ITEM;
fail:
    sb_free(&neg);
    return rc;
}

/* By 'type' (a name or a list: alternatives), or without one by the keywords present
 * (properties: an object, ...; none: any value). */
static int gen_types(ctx_t *c, const json_t *s, const char *name, const path_t *at,
                     unsigned bits, sbuf_t *out, int *kind)
{
    int order[T_COUNT], has_number = 0, k = KIND_ITEM, rc;
    size_t nt, done = 0;
    if ((rc = parse_types(c, s, at, order, &nt)) != 0)
        return rc;
    if (nt == 0) {
        if (bits & K_OBJ)
            order[nt++] = T_OBJECT;
        if (bits & K_ARR)
            order[nt++] = T_ARRAY;
        if (bits & K_STR)
            order[nt++] = T_STRING;
        if (bits & K_NUM)
            order[nt++] = T_NUMBER;
    }
    if (nt == 0) {
        *kind = KIND_ITEM;
        return sb_str(out, prim(c, P_VALUE));
    }
    for (size_t i = 0; i < nt; i++)
        has_number |= order[i] == T_NUMBER;
    for (size_t i = 0; i < nt; i++) {
        if (order[i] == T_INTEGER && has_number)
            continue; /* every integer is a number */
        if (done++ && (rc = sb_str(out, " | ")) != 0)
            return rc;
        switch (order[i]) {
        case T_OBJECT: rc = gen_object(c, s, name, at, out, &k); break;
        case T_ARRAY: rc = gen_array(c, s, name, at, out, &k); break;
        case T_STRING: rc = gen_string(c, s, at, out, &k); break;
        case T_INTEGER: rc = gen_integer(c, s, at, out, &k); break;
        case T_NUMBER:
            k = KIND_ITEM;
            rc = bits & K_NUM ? gen_number(c, s, at, out, &k) : sb_str(out, prim(c, P_NUMBER));
            break;
        case T_BOOLEAN:
            k = KIND_ITEM;
            rc = sb_str(out, prim(c, P_BOOLEAN));
            break;
        default:
            k = KIND_ITEM;
            rc = sb_str(out, prim(c, P_NULL));
        }
        if (rc)
            return rc;
    }
    *kind = done > 1 ? KIND_ALT : k;
    return 0;
}

static int gen_body_(ctx_t *c, const json_t *s, const char *name, const path_t *at,
                     sbuf_t *out, int *kind)
{
    unsigned bits;
    int rc;
    *kind = KIND_ITEM;
    if (json_is_true(s))
        return sb_str(out, prim(c, P_VALUE));
    if (json_is_false(s))
        return fail(c, BL_EINVAL, NULL, at, "is false and accepts no value");
    if (!json_is_object(s))
        return fail(c, BL_EINVAL, NULL, at, "must be an object or a boolean");
    if ((rc = scan(c, s, at, &bits)) != 0)
        return rc;
    if (bits & K_REF) {
        rc = only_beside(c, s, at, bits, K_REF, "$ref");
        return rc ? rc : gen_ref(c, s, at, out, kind);
    }
    if (bits & (K_ANYOF | K_ONEOF))
        return gen_anyof(c, s, name, at, bits, out, kind);
    if (bits & K_ALLOF)
        return gen_allof(c, s, name, at, bits, out, kind);
    if (bits & (K_ENUM | K_CONST))
        return gen_enum(c, s, at, bits, out, kind);
    return gen_types(c, s, name, at, bits, out, kind);
}

/* Schema s as a body into out; name: the rule it goes in ("" for root), the stem of
 * the rules it makes. */
static int gen_body(ctx_t *c, const json_t *s, const char *name, const path_t *at, sbuf_t *out,
                    int *kind)
{
    if (++c->visits > MAX_VISITS)
        return fail(c, BL_ERANGE, NULL, at, "expands to more than %d schemas", MAX_VISITS);
    if (c->depth >= MAX_DEPTH)
        return fail(c, BL_ERANGE, NULL, at, "nests deeper than %d levels", MAX_DEPTH);
    c->depth++;
    int rc = gen_body_(c, s, name, at, out, kind);
    c->depth--;
    return rc;
}

/* ---------------------------------------------------------------------------- */
/* entry point                                                                  */
/* ---------------------------------------------------------------------------- */

int rt_json_schema_to_gbnf(const json_t *schema, char **out, bl_err_t *err)
{
    ctx_t c = {.root = schema, .err = err};
    sbuf_t b = {0};
    size_t slot;
    int rc = 0, kind;
    if (out)
        *out = NULL;
    if (!schema || !out)
        return bl_err_set(err, BL_EINVAL, "json_schema: no schema");
    c.names = json_object();
    c.counters = json_object();
    c.refmap = json_object();
    if (!c.names || !c.counters || !c.refmap) {
        rc = BL_ENOMEM;
        goto fail;
    }
    for (int p = 0; p < P_COUNT; p++) /* the fixed rules' names are taken */
        if (json_object_set_new(c.names, PRIMS[p].name, json_true())) {
            rc = BL_ENOMEM;
            goto fail;
        }
    /* root first; "$ref": "#" finds it like any target */
    TRY(rule_push(&c, &slot));
    TRY(name_take(&c, "root", &c.rules[slot].name));
    TRY(grow((void **)&c.refs, &c.cap_refs, c.n_refs, sizeof *c.refs));
    c.refs[c.n_refs++] = (ref_t){.rule = slot, .busy = 1, .level = 0};
    if (json_object_set_new(c.refmap, "#", json_integer(0))) {
        rc = BL_ENOMEM;
        goto fail;
    }
    TRY(gen_body(&c, schema, "", NULL, &b, &kind));
    TRY(rule_body(&c, slot, sb_take(&b)));
    c.refs[0].busy = 0;

    unsigned used = c.prims;
    for (int changed = 1; changed;) {
        changed = 0;
        for (int p = 0; p < P_COUNT; p++)
            if ((used & (1u << p)) && (PRIMS[p].deps & ~used)) {
                used |= PRIMS[p].deps;
                changed = 1;
            }
    }
    for (size_t i = 0; i < c.n_rules; i++) {
        if (!c.rules[i].name)
            continue;
        TRY(sb_str(&b, c.rules[i].name));
        TRY(sb_str(&b, " ::= "));
        TRY(sb_str(&b, c.rules[i].body));
        TRY(sb_str(&b, "\n"));
    }
    for (int p = 0; p < P_COUNT; p++) {
        if (!(used & (1u << p)))
            continue;
        TRY(sb_str(&b, PRIMS[p].name));
        TRY(sb_str(&b, " ::= "));
        TRY(sb_str(&b, PRIMS[p].body));
        TRY(sb_str(&b, "\n"));
    }
    if (!(*out = sb_take(&b)))
        rc = BL_ENOMEM;
fail:
    if (rc && !c.failed && rc == BL_ENOMEM)
        (void)bl_err_set(err, rc, "json_schema: out of memory");
    else if (rc && !c.failed)
        (void)bl_err_set(err, rc, "json_schema: the grammar would be larger than %zu bytes",
                         MAX_OUT);
    for (size_t i = 0; i < c.n_rules; i++) {
        free(c.rules[i].name);
        free(c.rules[i].body);
    }
    free(c.rules);
    free(c.refs);
    for (size_t i = 0; i < c.n_paths; i++)
        free(c.paths[i]);
    free(c.paths);
    json_decref(c.names);
    json_decref(c.counters);
    json_decref(c.refmap);
    sb_free(&b);
    return rc;
}
