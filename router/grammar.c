/* GBNF grammars (see grammar.h): a recursive-descent compiler into flat rule arrays,
 * and a matcher that keeps the set of parse stacks the text so far allows. The
 * grammar text is untrusted (a request field): every count is bounded, left
 * recursion (which would loop the matcher) is refused at compile time, and a
 * grammar ambiguous enough to pass the stack bounds rejects the text instead of
 * growing without limit. */
#include "grammar.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_RULES 100000
#define MAX_ELEMS 1000000  /* over all rules */
#define MAX_REPEAT 1000    /* {m,n} */
#define MAX_NEST 256       /* groups inside groups */
#define MAX_STACKS 4096    /* live parse stacks of a matcher */
#define MAX_DEPTH 1024     /* elements on one stack */
#define MAX_EXPANSIONS 20000 /* stacks waiting for expansion in one step */
/* Stack elements copied by one call (accepts, feed, a scan): a grammar ambiguous
 * enough to need more gets "no" for what is left instead of stalling the thread
 * that samples. About a tenth of a second. */
#define WORK_ACCEPT ((size_t)4 << 20)
#define WORK_SCAN ((size_t)64 << 20)

/* A rule is its alternatives one after another, each ended by E_ALT, the last by
 * E_END. A character set is E_CHAR or E_CHAR_NOT, each member optionally followed by
 * E_RNG (the member is then the range v..upper), further members E_CHAR_ALT. */
enum { E_END, E_ALT, E_REF, E_CHAR, E_CHAR_NOT, E_RNG, E_CHAR_ALT, E_ANY };

typedef struct elem {
    uint32_t type, v;
} elem_t;

typedef struct rule {
    elem_t *e;
    size_t n, cap;
    char *name;  /* for errors; generated rules are "parent-N" */
    int defined; /* its definition was seen (generated rules always) */
    size_t use_at; /* first reference, a source offset for "not defined" */
} rule_t;

struct rt_grammar {
    rule_t *rules;
    size_t n, cap;
    size_t n_elems;
    uint32_t root;
    /* name -> rule id, open addressing; generated rules are not in it */
    uint32_t *hash;
    size_t hash_cap;
};

// --- compiling -----------------------------------------------------------------------

typedef struct vec {
    elem_t *e;
    size_t n, cap;
} vec_t;

typedef struct parser {
    rt_grammar_t *g;
    const char *src, *p, *end;
    bl_err_t *err;
    int rc;           /* the first error; later ones are not recorded */
    int nest;
    uint32_t cur;     /* the rule being defined, for generated rules' names */
    uint32_t n_gen;
} parser_t;

static int fail_at(parser_t *ps, const char *at, int code, const char *what)
{
    if (ps->rc)
        return ps->rc;
    int line = 1, col = 1;
    for (const char *q = ps->src; q < at && q < ps->end; q++) {
        if (*q == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    ps->rc = bl_err_set(ps->err, code, "grammar: line %d, column %d: %s", line, col, what);
    return ps->rc;
}

static int vec_push(parser_t *ps, vec_t *v, uint32_t type, uint32_t val)
{
    if (ps->rc)
        return ps->rc;
    if (ps->g->n_elems >= MAX_ELEMS)
        return fail_at(ps, ps->p, BL_ERANGE, "the grammar has more than 1000000 elements");
    if (v->n == v->cap) {
        size_t cap = v->cap ? 2 * v->cap : 16;
        elem_t *e = realloc(v->e, cap * sizeof *e);
        if (!e)
            return fail_at(ps, ps->p, BL_ENOMEM, "out of memory");
        v->e = e;
        v->cap = cap;
    }
    v->e[v->n++] = (elem_t){type, val};
    ps->g->n_elems++;
    return 0;
}

static uint64_t hash_name(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static int add_rule(parser_t *ps, const char *name, size_t n, uint32_t *id)
{
    rt_grammar_t *g = ps->g;
    if (g->n >= MAX_RULES)
        return fail_at(ps, ps->p, BL_ERANGE, "the grammar has more than 100000 rules");
    if (g->n == g->cap) {
        size_t cap = g->cap ? 2 * g->cap : 32;
        rule_t *r = realloc(g->rules, cap * sizeof *r);
        if (!r)
            return fail_at(ps, ps->p, BL_ENOMEM, "out of memory");
        g->rules = r;
        g->cap = cap;
    }
    rule_t *r = &g->rules[g->n];
    memset(r, 0, sizeof *r);
    r->name = malloc(n + 1);
    if (!r->name)
        return fail_at(ps, ps->p, BL_ENOMEM, "out of memory");
    memcpy(r->name, name, n);
    r->name[n] = '\0';
    *id = (uint32_t)g->n++;
    return 0;
}

/* The id of the named rule, created (undefined) on first sight. */
static int named_rule(parser_t *ps, const char *name, size_t n, uint32_t *id)
{
    rt_grammar_t *g = ps->g;
    if (2 * (g->n + 1) > g->hash_cap) { /* grow and rehash */
        size_t cap = g->hash_cap ? 2 * g->hash_cap : 64;
        uint32_t *h = malloc(cap * sizeof *h);
        if (!h)
            return fail_at(ps, ps->p, BL_ENOMEM, "out of memory");
        memset(h, 0xff, cap * sizeof *h);
        for (size_t i = 0; i < g->hash_cap; i++) {
            uint32_t r = g->hash[i];
            if (r == UINT32_MAX)
                continue;
            size_t k = hash_name(g->rules[r].name, strlen(g->rules[r].name)) & (cap - 1);
            while (h[k] != UINT32_MAX)
                k = (k + 1) & (cap - 1);
            h[k] = r;
        }
        free(g->hash);
        g->hash = h;
        g->hash_cap = cap;
    }
    size_t k = hash_name(name, n) & (g->hash_cap - 1);
    for (; g->hash[k] != UINT32_MAX; k = (k + 1) & (g->hash_cap - 1)) {
        const char *rn = g->rules[g->hash[k]].name;
        if (strlen(rn) == n && memcmp(rn, name, n) == 0) {
            *id = g->hash[k];
            return 0;
        }
    }
    int rc = add_rule(ps, name, n, id);
    if (rc)
        return rc;
    g->hash[k] = *id;
    return 0;
}

static int gen_rule(parser_t *ps, uint32_t *id)
{
    char name[160];
    int n = snprintf(name, sizeof name, "%.128s-%u", ps->g->rules[ps->cur].name, ++ps->n_gen);
    int rc = add_rule(ps, name, (size_t)n, id);
    if (!rc)
        ps->g->rules[*id].defined = 1;
    return rc;
}

static void skip_space(parser_t *ps, int newlines)
{
    const char *p = ps->p;
    while (p < ps->end) {
        if (*p == ' ' || *p == '\t' || (newlines && (*p == '\n' || *p == '\r'))) {
            p++;
        } else if (*p == '#') {
            while (p < ps->end && *p != '\n')
                p++;
        } else {
            break;
        }
    }
    ps->p = p;
}

static int is_name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
}

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                          : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                                                 : -1;
}

/* One source character of a literal or class, escapes resolved, UTF-8 decoded. */
static int parse_char(parser_t *ps, uint32_t *cp)
{
    const char *p = ps->p;
    if (p >= ps->end)
        return fail_at(ps, p, BL_EINVAL, "unexpected end of the grammar");
    unsigned char c = (unsigned char)*p;
    if (c == '\\') {
        if (p + 1 >= ps->end)
            return fail_at(ps, p, BL_EINVAL, "unexpected end after '\\'");
        char e = p[1];
        int digits = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
        if (digits) {
            uint32_t v = 0;
            for (int i = 0; i < digits; i++) {
                int h = p + 2 + i < ps->end ? hexval(p[2 + i]) : -1;
                if (h < 0)
                    return fail_at(ps, p, BL_EINVAL, "a \\x, \\u or \\U escape needs hex digits");
                v = v << 4 | (uint32_t)h;
            }
            if (v > 0x10FFFF)
                return fail_at(ps, p, BL_EINVAL, "an escape beyond U+10FFFF");
            *cp = v;
            ps->p = p + 2 + digits;
            return 0;
        }
        static const char from[] = "nrt\\\"[]-^/", to[] = "\n\r\t\\\"[]-^/";
        const char *f = strchr(from, e);
        if (!f || !e)
            return fail_at(ps, p, BL_EINVAL, "unknown escape");
        *cp = (unsigned char)to[f - from];
        ps->p = p + 2;
        return 0;
    }
    int n = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (!n || p + n > ps->end)
        return fail_at(ps, p, BL_EINVAL, "the grammar is not valid UTF-8");
    uint32_t v = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
    for (int i = 1; i < n; i++) {
        if (((unsigned char)p[i] & 0xC0) != 0x80)
            return fail_at(ps, p, BL_EINVAL, "the grammar is not valid UTF-8");
        v = v << 6 | ((unsigned char)p[i] & 0x3F);
    }
    *cp = v;
    ps->p = p + n;
    return 0;
}

static int parse_alternates(parser_t *ps, vec_t *out, int nested);

static int parse_count(parser_t *ps, uint32_t *v)
{
    const char *p = ps->p;
    uint32_t x = 0;
    if (p >= ps->end || *p < '0' || *p > '9')
        return fail_at(ps, p, BL_EINVAL, "expected a number in {m,n}");
    while (p < ps->end && *p >= '0' && *p <= '9') {
        x = x * 10 + (uint32_t)(*p++ - '0');
        if (x > MAX_REPEAT)
            return fail_at(ps, ps->p, BL_EINVAL, "a repetition count over 1000");
    }
    *v = x;
    ps->p = p;
    return 0;
}

/* Replaces out[start..n) (one item) by its repetition min..max (max UINT32_MAX:
 * unbounded), through generated rules. */
static int repeat(parser_t *ps, vec_t *out, size_t start, uint32_t min, uint32_t max)
{
    size_t len = out->n - start;
    elem_t *item = malloc(len * sizeof *item);
    if (!item)
        return fail_at(ps, ps->p, BL_ENOMEM, "out of memory");
    memcpy(item, out->e + start, len * sizeof *item);
    ps->g->n_elems -= len;
    out->n = start;
    int rc = 0;
    for (uint32_t k = 0; k < min && !rc; k++)
        for (size_t i = 0; i < len && !rc; i++)
            rc = vec_push(ps, out, item[i].type, item[i].v);
    if (!rc && max == UINT32_MAX) { /* rec ::= item rec | (nothing) */
        uint32_t id;
        rc = gen_rule(ps, &id);
        vec_t r = {0};
        for (size_t i = 0; i < len && !rc; i++)
            rc = vec_push(ps, &r, item[i].type, item[i].v);
        if (!rc)
            rc = vec_push(ps, &r, E_REF, id);
        if (!rc)
            rc = vec_push(ps, &r, E_ALT, 0);
        if (!rc)
            rc = vec_push(ps, &r, E_END, 0);
        if (!rc) {
            rule_t *rr = &ps->g->rules[id];
            rr->e = r.e, rr->n = r.n, rr->cap = r.cap;
            rc = vec_push(ps, out, E_REF, id);
        } else {
            free(r.e);
        }
    } else if (!rc && max > min) { /* nested: (item (item (...)?)?)? */
        uint32_t inner = UINT32_MAX;
        for (uint32_t k = 0; k < max - min && !rc; k++) {
            uint32_t id;
            rc = gen_rule(ps, &id);
            vec_t r = {0};
            for (size_t i = 0; i < len && !rc; i++)
                rc = vec_push(ps, &r, item[i].type, item[i].v);
            if (!rc && inner != UINT32_MAX)
                rc = vec_push(ps, &r, E_REF, inner);
            if (!rc)
                rc = vec_push(ps, &r, E_ALT, 0);
            if (!rc)
                rc = vec_push(ps, &r, E_END, 0);
            if (rc) {
                free(r.e);
                break;
            }
            rule_t *rr = &ps->g->rules[id];
            rr->e = r.e, rr->n = r.n, rr->cap = r.cap;
            inner = id;
        }
        if (!rc)
            rc = vec_push(ps, out, E_REF, inner);
    }
    free(item);
    return rc;
}

static int parse_sequence(parser_t *ps, vec_t *out, int nested)
{
    size_t last = SIZE_MAX; /* where the last item starts, for a repetition */
    while (!ps->rc && ps->p < ps->end) {
        const char *at = ps->p;
        char c = *at;
        if (c == '"') {
            last = out->n;
            ps->p++;
            while (!ps->rc && ps->p < ps->end && *ps->p != '"') {
                uint32_t cp;
                if (!parse_char(ps, &cp))
                    vec_push(ps, out, E_CHAR, cp);
            }
            if (ps->rc)
                return ps->rc;
            if (ps->p >= ps->end)
                return fail_at(ps, at, BL_EINVAL, "a literal without its closing '\"'");
            ps->p++;
            if (out->n == last) /* "": matches nothing, as an empty item */
                last = SIZE_MAX;
        } else if (c == '[') {
            last = out->n;
            ps->p++;
            int neg = ps->p < ps->end && *ps->p == '^';
            if (neg)
                ps->p++;
            uint32_t first = neg ? E_CHAR_NOT : E_CHAR;
            while (!ps->rc && ps->p < ps->end && *ps->p != ']') {
                uint32_t lo, hi;
                if (parse_char(ps, &lo))
                    break;
                vec_push(ps, out, out->n == last ? first : E_CHAR_ALT, lo);
                if (ps->p + 1 < ps->end && *ps->p == '-' && ps->p[1] != ']') {
                    ps->p++;
                    if (parse_char(ps, &hi))
                        break;
                    if (hi < lo)
                        return fail_at(ps, at, BL_EINVAL, "a range whose end is below its start");
                    vec_push(ps, out, E_RNG, hi);
                }
            }
            if (ps->rc)
                return ps->rc;
            if (ps->p >= ps->end)
                return fail_at(ps, at, BL_EINVAL, "a class without its closing ']'");
            if (out->n == last)
                return fail_at(ps, at, BL_EINVAL, "an empty character class");
            ps->p++;
        } else if (c == '.') {
            last = out->n;
            vec_push(ps, out, E_ANY, 0);
            ps->p++;
        } else if (is_name_char(c)) {
            const char *s = ps->p;
            while (ps->p < ps->end && is_name_char(*ps->p))
                ps->p++;
            uint32_t id;
            if (named_rule(ps, s, (size_t)(ps->p - s), &id))
                return ps->rc;
            if (!ps->g->rules[id].use_at)
                ps->g->rules[id].use_at = (size_t)(s - ps->src) + 1;
            last = out->n;
            vec_push(ps, out, E_REF, id);
        } else if (c == '(') {
            if (++ps->nest > MAX_NEST)
                return fail_at(ps, at, BL_EINVAL, "groups nested deeper than 256");
            ps->p++;
            skip_space(ps, 1);
            uint32_t id;
            if (gen_rule(ps, &id))
                return ps->rc;
            vec_t r = {0};
            parse_alternates(ps, &r, 1);
            rule_t *rr = &ps->g->rules[id];
            rr->e = r.e, rr->n = r.n, rr->cap = r.cap;
            if (ps->rc)
                return ps->rc;
            if (ps->p >= ps->end || *ps->p != ')')
                return fail_at(ps, at, BL_EINVAL, "a group without its closing ')'");
            ps->p++;
            ps->nest--;
            last = out->n;
            vec_push(ps, out, E_REF, id);
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            if (last == SIZE_MAX)
                return fail_at(ps, at, BL_EINVAL, "a repetition with nothing before it");
            uint32_t min = 0, max = UINT32_MAX;
            ps->p++;
            if (c == '+')
                min = 1;
            else if (c == '?')
                max = 1;
            else if (c == '{') {
                skip_space(ps, 0);
                if (parse_count(ps, &min))
                    return ps->rc;
                skip_space(ps, 0);
                max = min;
                if (ps->p < ps->end && *ps->p == ',') {
                    ps->p++;
                    skip_space(ps, 0);
                    max = UINT32_MAX;
                    if (ps->p < ps->end && *ps->p != '}' && parse_count(ps, &max))
                        return ps->rc;
                    skip_space(ps, 0);
                }
                if (ps->p >= ps->end || *ps->p != '}')
                    return fail_at(ps, at, BL_EINVAL, "expected '}' after {m,n}");
                ps->p++;
                if (max < min)
                    return fail_at(ps, at, BL_EINVAL, "{m,n} with n below m");
            }
            if (repeat(ps, out, last, min, max))
                return ps->rc;
            last = SIZE_MAX; /* "a**" is refused */
        } else {
            break;
        }
        skip_space(ps, nested);
    }
    return ps->rc;
}

static int parse_alternates(parser_t *ps, vec_t *out, int nested)
{
    parse_sequence(ps, out, nested);
    while (!ps->rc && ps->p < ps->end && *ps->p == '|') {
        vec_push(ps, out, E_ALT, 0);
        ps->p++;
        skip_space(ps, 1);
        parse_sequence(ps, out, nested);
    }
    vec_push(ps, out, E_END, 0);
    return ps->rc;
}

/* Rules that can match the empty text, to a fixed point. */
static void find_nullable(const rt_grammar_t *g, char *nullable)
{
    memset(nullable, 0, g->n);
    for (int changed = 1; changed;) {
        changed = 0;
        for (size_t r = 0; r < g->n; r++) {
            if (nullable[r])
                continue;
            const elem_t *e = g->rules[r].e;
            int all = 1;
            for (;; e++) {
                if (e->type == E_END || e->type == E_ALT) {
                    if (all) {
                        nullable[r] = 1;
                        changed = 1;
                        break;
                    }
                    if (e->type == E_END)
                        break;
                    all = 1;
                } else if (e->type == E_REF) {
                    all &= nullable[e->v];
                } else {
                    all = 0;
                }
            }
        }
    }
}

/* A rule that reaches itself before any character: the matcher would expand it
 * forever. Depth-first over "may start with" edges, without recursion. */
static int check_left_recursion(parser_t *ps)
{
    rt_grammar_t *g = ps->g;
    char *nullable = malloc(g->n);
    uint8_t *color = calloc(g->n, 1); /* 0 new, 1 on the path, 2 done */
    struct frame {
        uint32_t r;
        const elem_t *e;
        int blocked; /* this alternative met a character or a non-nullable rule */
    } *st = malloc(g->n * sizeof *st);
    if (!nullable || !color || !st) {
        free(nullable), free(color), free(st);
        return fail_at(ps, ps->p, BL_ENOMEM, "out of memory");
    }
    find_nullable(g, nullable);
    int rc = 0;
    for (size_t start = 0; start < g->n && !rc; start++) {
        if (color[start])
            continue;
        size_t sp = 0;
        st[sp++] = (struct frame){(uint32_t)start, g->rules[start].e, 0};
        color[start] = 1;
        while (sp && !rc) {
            struct frame *f = &st[sp - 1];
            const elem_t *e = f->e;
            if (e->type == E_END) {
                color[f->r] = 2;
                sp--;
                continue;
            }
            f->e++;
            if (e->type == E_ALT) {
                f->blocked = 0;
                continue;
            }
            if (f->blocked)
                continue;
            if (e->type != E_REF) {
                f->blocked = 1;
                continue;
            }
            f->blocked = !nullable[e->v];
            if (color[e->v] == 1) {
                char msg[200];
                snprintf(msg, sizeof msg, "rule '%.100s' is left-recursive",
                         g->rules[e->v].name);
                rc = fail_at(ps, ps->src, BL_EINVAL, msg);
            } else if (color[e->v] == 0) {
                color[e->v] = 1;
                st[sp++] = (struct frame){e->v, g->rules[e->v].e, 0};
            }
        }
    }
    free(nullable), free(color), free(st);
    return rc;
}

int rt_grammar_parse(rt_grammar_t **out, const char *text, size_t len, bl_err_t *err)
{
    *out = NULL;
    rt_grammar_t *g = calloc(1, sizeof *g);
    if (!g)
        return bl_err_set(err, BL_ENOMEM, "grammar: out of memory");
    parser_t ps = {.g = g, .src = text, .p = text, .end = text + len, .err = err};
    skip_space(&ps, 1);
    if (ps.p >= ps.end)
        fail_at(&ps, ps.p, BL_EINVAL, "the grammar is empty");
    while (!ps.rc && ps.p < ps.end) {
        const char *s = ps.p;
        while (ps.p < ps.end && is_name_char(*ps.p))
            ps.p++;
        if (ps.p == s) {
            fail_at(&ps, s, BL_EINVAL, "expected a rule name");
            break;
        }
        uint32_t id;
        if (named_rule(&ps, s, (size_t)(ps.p - s), &id))
            break;
        if (g->rules[id].defined) {
            char msg[200];
            snprintf(msg, sizeof msg, "rule '%.100s' is defined twice", g->rules[id].name);
            fail_at(&ps, s, BL_EINVAL, msg);
            break;
        }
        g->rules[id].defined = 1;
        skip_space(&ps, 0);
        if (ps.end - ps.p < 3 || memcmp(ps.p, "::=", 3) != 0) {
            fail_at(&ps, ps.p, BL_EINVAL, "expected '::=' after the rule name");
            break;
        }
        ps.p += 3;
        skip_space(&ps, 1);
        ps.cur = id;
        vec_t r = {0};
        parse_alternates(&ps, &r, 0);
        rule_t *rr = &g->rules[id]; /* parse may have moved the rule array */
        rr->e = r.e, rr->n = r.n, rr->cap = r.cap;
        if (ps.rc)
            break;
        if (ps.p < ps.end && *ps.p != '\n' && *ps.p != '\r') {
            fail_at(&ps, ps.p, BL_EINVAL, "unexpected character");
            break;
        }
        skip_space(&ps, 1);
    }
    for (size_t i = 0; !ps.rc && i < g->n; i++)
        if (!g->rules[i].defined) {
            char msg[200];
            snprintf(msg, sizeof msg, "rule '%.100s' is used but not defined", g->rules[i].name);
            fail_at(&ps, text + g->rules[i].use_at - 1, BL_EINVAL, msg);
        }
    if (!ps.rc) {
        uint32_t root = UINT32_MAX;
        size_t k = hash_name("root", 4) & (g->hash_cap - 1);
        for (; g->hash[k] != UINT32_MAX; k = (k + 1) & (g->hash_cap - 1))
            if (!strcmp(g->rules[g->hash[k]].name, "root"))
                root = g->hash[k];
        if (root == UINT32_MAX)
            fail_at(&ps, text, BL_EINVAL, "no rule named 'root'");
        g->root = root;
    }
    if (!ps.rc)
        check_left_recursion(&ps);
    if (ps.rc) {
        rt_grammar_destroy(g);
        return ps.rc;
    }
    *out = g;
    return 0;
}

void rt_grammar_destroy(rt_grammar_t *g)
{
    if (!g)
        return;
    for (size_t i = 0; i < g->n; i++) {
        free(g->rules[i].e);
        free(g->rules[i].name);
    }
    free(g->rules);
    free(g->hash);
    free(g);
}

// --- matching --------------------------------------------------------------------------

/* Stacks of positions in the rules, concatenated; the top of a stack (its last
 * element) is a character set still to match, and an empty stack means the root
 * rule is complete. */
typedef struct stackset {
    const elem_t **buf;
    size_t len, cap;
    uint32_t *off, *size;
    size_t n, cap_n;
} stackset_t;

struct rt_grammar_match {
    const rt_grammar_t *g;
    stackset_t *depth;  /* a vocabulary scan's state at each byte of a piece */
    size_t n_depth;
    elem_t root[2];    /* a reference to the root rule, then E_END */
    stackset_t cur;    /* where the text so far leaves the parse */
    stackset_t a, b;   /* scratch for steps */
    stackset_t todo;   /* scratch for expansions */
    const elem_t **tmp; /* one stack being built (MAX_DEPTH + 2) */
    uint8_t pend[4];   /* a UTF-8 sequence begun and not finished */
    int n_pend;
    size_t work, work_max; /* elements copied by the current call, its bound */
};

static void ss_clear(stackset_t *s)
{
    s->len = s->n = 0;
}

static void ss_free(stackset_t *s)
{
    free(s->buf);
    free(s->off);
    free(s->size);
    memset(s, 0, sizeof *s);
}

/* Appends stack v[0..n) unless an equal one is there (dedup); -1 past a bound or on
 * allocation failure. */
static int ss_add(stackset_t *s, const elem_t *const *v, size_t n, int dedup)
{
    if (dedup)
        for (size_t i = 0; i < s->n; i++)
            if (s->size[i] == n && (n == 0 || !memcmp(s->buf + s->off[i], v, n * sizeof *v)))
                return 0;
    if (s->n >= (dedup ? MAX_STACKS : MAX_EXPANSIONS) || n > MAX_DEPTH)
        return -1;
    if (s->n == s->cap_n) {
        size_t cap = s->cap_n ? 2 * s->cap_n : 16;
        uint32_t *o = realloc(s->off, cap * sizeof *o);
        if (!o)
            return -1;
        s->off = o;
        uint32_t *z = realloc(s->size, cap * sizeof *z);
        if (!z)
            return -1;
        s->size = z;
        s->cap_n = cap;
    }
    if (s->len + n > s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 256;
        while (cap < s->len + n)
            cap *= 2;
        const elem_t **b = realloc(s->buf, cap * sizeof *b);
        if (!b)
            return -1;
        s->buf = b;
        s->cap = cap;
    }
    if (n)
        memcpy(s->buf + s->len, v, n * sizeof *v);
    s->off[s->n] = (uint32_t)s->len;
    s->size[s->n++] = (uint32_t)n;
    s->len += n;
    return 0;
}

static int is_end(const elem_t *e)
{
    return e->type == E_END || e->type == E_ALT;
}

/* Expands rule references on top of v[0..n) until every stack's top is a character
 * set (or the stack is empty), adding the results to out. */
static int advance(rt_grammar_match_t *m, const elem_t *const *v, size_t n, stackset_t *out)
{
    stackset_t *todo = &m->todo;
    ss_clear(todo);
    if (ss_add(todo, v, n, 0))
        return -1;
    while (todo->n) {
        size_t k = todo->n - 1, sz = todo->size[k];
        if ((m->work += sz + 1) > m->work_max)
            return -1;
        if (sz)
            memcpy(m->tmp, todo->buf + todo->off[k], sz * sizeof *m->tmp);
        todo->n--;
        todo->len = todo->off[k];
        if (sz == 0 || m->tmp[sz - 1]->type != E_REF) {
            if (ss_add(out, m->tmp, sz, 1))
                return -1;
            continue;
        }
        const elem_t *ref = m->tmp[sz - 1];
        size_t base = sz - 1;
        if (!is_end(ref + 1))
            m->tmp[base++] = ref + 1; /* what follows the reference, once it is done */
        const elem_t *alt = m->g->rules[ref->v].e;
        for (;;) {
            size_t t = base;
            if (!is_end(alt))
                m->tmp[t++] = alt;
            if (ss_add(todo, m->tmp, t, 0))
                return -1;
            while (!is_end(alt))
                alt++;
            if (alt->type == E_END)
                break;
            alt++;
        }
    }
    return 0;
}

/* Whether the set at pos matches cp; *after: the element past the set. */
static int set_match(const elem_t *pos, uint32_t cp, const elem_t **after)
{
    if (pos->type == E_ANY) {
        *after = pos + 1;
        return 1;
    }
    int neg = pos->type == E_CHAR_NOT, found = 0;
    do {
        if (pos[1].type == E_RNG) {
            found |= pos->v <= cp && cp <= pos[1].v;
            pos += 2;
        } else {
            found |= pos->v == cp;
            pos++;
        }
    } while (pos->type == E_CHAR_ALT);
    *after = pos;
    return found != neg;
}

/* Whether the set at pos may match some code point in lo..hi (a negated set is
 * taken to: the check is for an unfinished UTF-8 sequence, settled when it ends). */
static int set_may_match(const elem_t *pos, uint32_t lo, uint32_t hi)
{
    if (pos->type == E_ANY || pos->type == E_CHAR_NOT)
        return 1;
    do {
        uint32_t a = pos->v, b = pos[1].type == E_RNG ? pos[1].v : pos->v;
        if (a <= hi && lo <= b)
            return 1;
        pos += pos[1].type == E_RNG ? 2 : 1;
    } while (pos->type == E_CHAR_ALT);
    return 0;
}

static int step(rt_grammar_match_t *m, const stackset_t *in, uint32_t cp, stackset_t *out)
{
    ss_clear(out);
    for (size_t i = 0; i < in->n; i++) {
        size_t sz = in->size[i];
        if (!sz)
            continue;
        const elem_t *const *s = in->buf + in->off[i];
        const elem_t *after;
        if (!set_match(s[sz - 1], cp, &after))
            continue;
        /* advance() copies from todo, so the new stack goes through it */
        const elem_t **v = m->tmp;
        memcpy(v, s, (sz - 1) * sizeof *v);
        size_t n = sz - 1;
        if (!is_end(after))
            v[n++] = after;
        if (advance(m, v, n, out))
            return -1;
    }
    return 0;
}

static int utf8_len(uint8_t c)
{
    return c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3
                                                   : c >= 0xF0 && c <= 0xF4 ? 4
                                                                            : 0;
}

/* Takes byte c of UTF-8 text into seq[0..*n): 1 with *cp when it completes a
 * character (*n back to 0), 0 while the character is unfinished, -1 when the bytes
 * are not UTF-8 (overlong forms and surrogates included). */
static int utf8_take(uint8_t *seq, int *n, uint8_t c, uint32_t *cp)
{
    int L = utf8_len(*n ? seq[0] : c);
    if (!L || (*n && (c & 0xC0) != 0x80))
        return -1;
    seq[(*n)++] = c;
    if (*n < L)
        return 0;
    uint32_t v = L == 1 ? seq[0] : L == 2 ? seq[0] & 0x1Fu : L == 3 ? seq[0] & 0x0Fu : seq[0] & 0x07u;
    for (int k = 1; k < L; k++)
        v = v << 6 | (seq[k] & 0x3Fu);
    *n = 0;
    if ((L == 3 && v < 0x800) || (L == 4 && (v < 0x10000 || v > 0x10FFFF)) ||
        (v >= 0xD800 && v <= 0xDFFF))
        return -1;
    *cp = v;
    return 1;
}

/* Whether some stack of in may take a character that begins with the unfinished
 * sequence seq[0..n) (its code points span lo..hi; no overlong form). */
static int partial_fits(const stackset_t *in, const uint8_t *seq, int n)
{
    static const uint32_t least[5] = {0, 0, 0x80, 0x800, 0x10000};
    int L = utf8_len(seq[0]);
    uint32_t lo = L == 2 ? seq[0] & 0x1Fu : L == 3 ? seq[0] & 0x0Fu : seq[0] & 0x07u;
    for (int k = 1; k < n; k++)
        lo = lo << 6 | (seq[k] & 0x3Fu);
    int rest = 6 * (L - n);
    uint32_t hi = (lo << rest) | ((1u << rest) - 1);
    lo <<= rest;
    if (lo < least[L])
        lo = least[L];
    if (hi > 0x10FFFF)
        hi = 0x10FFFF;
    if (lo > hi)
        return 0;
    for (size_t i = 0; i < in->n; i++)
        if (in->size[i] && set_may_match(in->buf[in->off[i] + in->size[i] - 1], lo, hi))
            return 1;
    return 0;
}

/* Runs bytes from m->cur; with commit, m moves there. 1 when they can follow. */
static int run(rt_grammar_match_t *m, const char *bytes, size_t len, int commit)
{
    m->work = 0;
    m->work_max = WORK_ACCEPT;
    const stackset_t *in = &m->cur;
    uint8_t pend[4];
    int n_pend = m->n_pend;
    memcpy(pend, m->pend, sizeof pend);
    for (size_t i = 0; i < len; i++) {
        uint32_t cp;
        int got = utf8_take(pend, &n_pend, (uint8_t)bytes[i], &cp);
        if (got < 0)
            return 0;
        if (!got)
            continue;
        stackset_t *out = in == &m->a ? &m->b : &m->a;
        if (step(m, in, cp, out) || out->n == 0)
            return 0;
        in = out;
    }
    /* could the sequence begun end in a character some stack takes? */
    if (n_pend && !partial_fits(in, pend, n_pend))
        return 0;
    if (commit) {
        if (in != &m->cur) {
            stackset_t t = m->cur;
            m->cur = *in;
            *(stackset_t *)in = t;
        }
        memcpy(m->pend, pend, sizeof pend);
        m->n_pend = n_pend;
    }
    return 1;
}

int rt_grammar_match_create(rt_grammar_match_t **out, const rt_grammar_t *g, bl_err_t *err)
{
    *out = NULL;
    rt_grammar_match_t *m = calloc(1, sizeof *m);
    if (!m || !(m->tmp = malloc((MAX_DEPTH + 2) * sizeof *m->tmp))) {
        free(m);
        return bl_err_set(err, BL_ENOMEM, "grammar: out of memory");
    }
    m->g = g;
    m->root[0] = (elem_t){E_REF, g->root};
    m->root[1] = (elem_t){E_END, 0};
    rt_grammar_match_reset(m);
    if (m->cur.n == 0) {
        rt_grammar_match_destroy(m);
        return bl_err_set(err, BL_ERANGE, "grammar: the start expands past the matcher's bounds");
    }
    *out = m;
    return 0;
}

void rt_grammar_match_reset(rt_grammar_match_t *m)
{
    const elem_t *start = &m->root[0];
    ss_clear(&m->cur);
    m->n_pend = 0;
    m->work = 0;
    m->work_max = WORK_ACCEPT;
    if (advance(m, &start, 1, &m->cur))
        ss_clear(&m->cur);
}

void rt_grammar_match_destroy(rt_grammar_match_t *m)
{
    if (!m)
        return;
    ss_free(&m->cur);
    ss_free(&m->a);
    ss_free(&m->b);
    ss_free(&m->todo);
    for (size_t i = 0; i < m->n_depth; i++)
        ss_free(&m->depth[i]);
    free(m->depth);
    free(m->tmp);
    free(m);
}

int rt_grammar_match_accepts(rt_grammar_match_t *m, const char *bytes, size_t len)
{
    return run(m, bytes, len, 0);
}

int rt_grammar_match_feed(rt_grammar_match_t *m, const char *bytes, size_t len)
{
    return run(m, bytes, len, 1) ? 0 : BL_EINVAL;
}

// --- a vocabulary scan ---------------------------------------------------------------

/* Trie nodes in depth-first order: a node's children follow it, each with the byte
 * that leads to it; ids[tok .. tok + n_tok) are the tokens whose piece ends there. */
typedef struct vnode {
    uint32_t first_child, next_sibling; /* 0: none (node 0 is the root) */
    uint32_t tok, n_tok;
    uint8_t byte;
} vnode_t;

struct rt_grammar_vocab {
    vnode_t *nodes;
    size_t n_nodes, cap;
    int32_t *ids;  /* the tokens sorted by piece */
    int32_t n;     /* of them (pieces of length 0 are left out) */
    int32_t n_all; /* the vocabulary's size */
    size_t max_len;
};

static const char *const *sort_pieces;
static const size_t *sort_lens;

static int by_piece(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    size_t lx = sort_lens[x], ly = sort_lens[y];
    int c = memcmp(sort_pieces[x], sort_pieces[y], lx < ly ? lx : ly);
    return c ? c : lx < ly ? -1 : lx > ly ? 1 : (x > y) - (x < y);
}

static int vnode_new(rt_grammar_vocab_t *v, uint8_t byte, uint32_t *id)
{
    if (v->n_nodes == v->cap) {
        size_t cap = v->cap ? 2 * v->cap : 1024;
        vnode_t *n = realloc(v->nodes, cap * sizeof *n);
        if (!n)
            return -1;
        v->nodes = n;
        v->cap = cap;
    }
    v->nodes[v->n_nodes] = (vnode_t){0, 0, 0, 0, byte};
    *id = (uint32_t)v->n_nodes++;
    return 0;
}

int rt_grammar_vocab_create(rt_grammar_vocab_t **out, const char *const *pieces,
                            const size_t *lens, int32_t n, bl_err_t *err)
{
    *out = NULL;
    rt_grammar_vocab_t *v = calloc(1, sizeof *v);
    size_t *path = NULL; /* the nodes of the previous piece, by depth */
    uint32_t *last_child = NULL;
    if (!v || !(v->ids = malloc((size_t)(n > 0 ? n : 1) * sizeof *v->ids)))
        goto oom;
    int32_t k = 0;
    for (int32_t i = 0; i < n; i++) {
        if (lens[i] == 0)
            continue;
        v->ids[k++] = i;
        if (lens[i] > v->max_len)
            v->max_len = lens[i];
    }
    v->n = k;
    v->n_all = n;
    /* qsort has no user pointer; building is single-threaded per call site */
    sort_pieces = pieces;
    sort_lens = lens;
    qsort(v->ids, (size_t)k, sizeof *v->ids, by_piece);
    path = malloc((v->max_len + 1) * sizeof *path);
    last_child = calloc(v->max_len + 1, sizeof *last_child);
    uint32_t root;
    if (!path || !last_child || vnode_new(v, 0, &root))
        goto oom;
    path[0] = root;
    size_t depth = 0; /* of the previous piece's path */
    const char *prev = NULL;
    size_t prev_len = 0;
    for (int32_t t = 0; t < k; t++) {
        const char *p = pieces[v->ids[t]];
        size_t len = lens[v->ids[t]], lcp = 0;
        while (prev && lcp < len && lcp < prev_len && p[lcp] == prev[lcp])
            lcp++;
        if (lcp > depth)
            lcp = depth;
        for (size_t d = lcp; d < len; d++) { /* new nodes below the shared prefix */
            uint32_t id;
            if (vnode_new(v, (uint8_t)p[d], &id))
                goto oom;
            vnode_t *parent = &v->nodes[path[d]];
            if (!parent->first_child)
                parent->first_child = id;
            else
                v->nodes[last_child[d]].next_sibling = id;
            last_child[d] = id;
            last_child[d + 1] = 0;
            path[d + 1] = id;
        }
        vnode_t *end = &v->nodes[path[len]];
        if (!end->n_tok)
            end->tok = (uint32_t)t;
        end->n_tok++;
        depth = len;
        prev = p;
        prev_len = len;
    }
    free(path);
    free(last_child);
    *out = v;
    return 0;
oom:
    free(path);
    free(last_child);
    rt_grammar_vocab_destroy(v);
    return bl_err_set(err, BL_ENOMEM, "grammar: out of memory for the vocabulary's trie");
}

void rt_grammar_vocab_destroy(rt_grammar_vocab_t *v)
{
    if (!v)
        return;
    free(v->nodes);
    free(v->ids);
    free(v);
}

/* The state after byte b from (in, pend): *out holds the stacks, pend the unfinished
 * UTF-8 bytes. 0 when nothing can follow (the subtree is dead). */
static int scan_byte(rt_grammar_match_t *m, const stackset_t *in, const uint8_t *pend, int n_pend,
                     uint8_t b, stackset_t *out, uint8_t *pend_out, int *n_pend_out)
{
    uint8_t seq[4];
    memcpy(seq, pend, (size_t)n_pend);
    uint32_t cp;
    int got = utf8_take(seq, &n_pend, b, &cp);
    if (got < 0)
        return 0;
    if (!got) { /* still inside a character: may some stack take one like it? */
        if (!partial_fits(in, seq, n_pend))
            return 0;
        ss_clear(out);
        m->work += in->len;
        for (size_t i = 0; i < in->n; i++)
            if (ss_add(out, in->buf + in->off[i], in->size[i], 0))
                return 0;
        memcpy(pend_out, seq, (size_t)n_pend);
        *n_pend_out = n_pend;
        return 1;
    }
    *n_pend_out = 0;
    return step(m, in, cp, out) == 0 && out->n > 0;
}

size_t rt_grammar_match_scan(rt_grammar_match_t *m, const rt_grammar_vocab_t *v,
                             unsigned char *allowed)
{
    memset(allowed, 0, (size_t)v->n_all);
    if (m->n_depth < v->max_len + 1) { /* one state per byte of the longest piece */
        stackset_t *d = realloc(m->depth, (v->max_len + 1) * sizeof *d);
        if (!d)
            return 0;
        memset(d + m->n_depth, 0, (v->max_len + 1 - m->n_depth) * sizeof *d);
        m->depth = d;
        m->n_depth = v->max_len + 1;
    }
    struct frame {
        uint32_t node, child;
        uint8_t pend[4];
        int n_pend;
    } *st = malloc((v->max_len + 1) * sizeof *st);
    if (!st)
        return 0;
    m->work = 0;
    m->work_max = WORK_SCAN;
    /* depth 0 is the matcher's own state */
    const stackset_t *at0 = &m->cur;
    size_t n_allowed = 0, sp = 0;
    st[0] = (struct frame){0, v->nodes[0].first_child, {0}, m->n_pend};
    memcpy(st[0].pend, m->pend, sizeof m->pend);
    sp = 1;
    while (sp) {
        struct frame *f = &st[sp - 1];
        if (!f->child) {
            sp--;
            continue;
        }
        const vnode_t *c = &v->nodes[f->child];
        f->child = c->next_sibling;
        const stackset_t *in = sp == 1 ? at0 : &m->depth[sp - 1];
        struct frame nf = {f->child, c->first_child, {0}, 0};
        nf.node = (uint32_t)(c - v->nodes);
        if (!scan_byte(m, in, f->pend, f->n_pend, c->byte, &m->depth[sp], nf.pend, &nf.n_pend))
            continue; /* nothing below can follow either */
        for (uint32_t k = 0; k < c->n_tok; k++)
            allowed[v->ids[c->tok + k]] = 1;
        n_allowed += c->n_tok;
        if (c->first_child)
            st[sp++] = nf;
    }
    free(st);
    return n_allowed;
}

int rt_grammar_match_done(const rt_grammar_match_t *m)
{
    if (m->n_pend)
        return 0;
    for (size_t i = 0; i < m->cur.n; i++)
        if (m->cur.size[i] == 0)
            return 1;
    return 0;
}
