/* Chat-template engine: values, printing and JSON as Python does them, filters,
 * tests and methods, and the tree-walking renderer for the Jinja2 subset that
 * model chat templates use (see template.h for the contract; template_parse.c
 * turns the text into the tree).
 *
 * Errors inside the engine unwind with longjmp to rt_template_compile or
 * rt_template_render: every byte the engine allocates lives in an arena (one per
 * template, one per render), so unwinding never leaks and the hundreds of
 * fallible helpers need no error plumbing. Nothing outside these files sees a
 * jump. */
#include "template_impl.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <utf8proc.h>

// ---------------------------------------------------------------------------
// Arena and failure

static _Noreturn void fail_jump(fail_t *f);

_Noreturn void rt__fail_raise(fail_t *f, int code, const char *fmt, ...)
{
    if (f->err) {
        va_list ap;
        va_start(ap, fmt);
        f->err->code = code;
        vsnprintf(f->err->msg, sizeof f->err->msg, fmt, ap);
        va_end(ap);
    }
    fail_jump(f);
}

static _Noreturn void fail_jump(fail_t *f)
{
    longjmp(f->jb, 1);
}

#define ARENA_CHUNK ((size_t)64 << 10)

void *rt__alloc(arena_t *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    chunk_t *c = a->head;
    if (c && c->cap - c->used >= n) {
        void *p = (char *)c->data + c->used;
        c->used += n;
        return p;
    }
    /* A large block gets a chunk of its own, kept behind the head so the space
     * left in the head chunk is not abandoned. */
    size_t cap = n > ARENA_CHUNK / 4 ? n : ARENA_CHUNK;
    if (a->total + cap > a->limit)
        rt__fail_raise(a->fail, RT_ELIMIT, "template memory limit of %zu bytes reached",
                   a->limit);
    chunk_t *nc = malloc(sizeof *nc + cap);
    if (!nc)
        rt__fail_raise(a->fail, BL_ENOMEM, "out of memory allocating %zu bytes", cap);
    nc->cap = cap;
    nc->used = n;
    a->total += cap;
    if (c && cap != ARENA_CHUNK) {
        nc->next = c->next;
        c->next = nc;
    } else {
        nc->next = c;
        a->head = nc;
    }
    return nc->data;
}

/* Grows the block p (old bytes) to n bytes; extends in place when p is the most
 * recent allocation, which is the common case for a string being built. */
void *rt__realloc(arena_t *a, void *p, size_t old, size_t n)
{
    chunk_t *c = a->head;
    size_t o16 = (old + 15) & ~(size_t)15, n16 = (n + 15) & ~(size_t)15;
    if (p && c && (char *)p + o16 == (char *)c->data + c->used &&
        c->cap - (c->used - o16) >= n16) {
        c->used = c->used - o16 + n16;
        return p;
    }
    void *q = rt__alloc(a, n);
    if (old)
        memcpy(q, p, old < n ? old : n);
    return q;
}

static void arena_free(arena_t *a)
{
    chunk_t *c = a->head;
    while (c) {
        chunk_t *next = c->next;
        free(c);
        c = next;
    }
    a->head = NULL;
    a->total = 0;
}

static str_t astr(arena_t *a, const char *p, size_t n)
{
    char *q = rt__alloc(a, n + 1);
    if (n)
        memcpy(q, p, n);
    q[n] = 0;
    return (str_t){q, n};
}

static void sb_grow(arena_t *a, sb_t *b, size_t add)
{
    if (b->n + add > RT_TEMPLATE_MAX_OUTPUT)
        rt__fail_raise(a->fail, RT_ELIMIT, "rendered text exceeds %u bytes",
                   (unsigned)RT_TEMPLATE_MAX_OUTPUT);
    if (b->n + add + 1 <= b->cap)
        return;
    size_t nc = b->cap ? b->cap * 2 : 64;
    while (nc < b->n + add + 1)
        nc *= 2;
    b->p = rt__realloc(a, b->p, b->cap, nc);
    b->cap = nc;
}

void rt__sb_put(arena_t *a, sb_t *b, const char *p, size_t n)
{
    if (!n)
        return;
    sb_grow(a, b, n);
    memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void sb_puts(arena_t *a, sb_t *b, const char *s)
{
    rt__sb_put(a, b, s, strlen(s));
}

void rt__sb_putc(arena_t *a, sb_t *b, char c)
{
    rt__sb_put(a, b, &c, 1);
}

static void sb_printf(arena_t *a, sb_t *b, const char *fmt, ...) BL_PRINTF(3, 4);
static void sb_printf(arena_t *a, sb_t *b, const char *fmt, ...)
{
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k > 0)
        rt__sb_put(a, b, tmp, (size_t)k < sizeof tmp ? (size_t)k : sizeof tmp - 1);
}

// ---------------------------------------------------------------------------
// UTF-8: Python strings index by code point, so do ours.

/* Decodes the code point at s[*i], advancing *i; invalid bytes decode as
 * themselves (one byte each) so that nothing is lost. */
static int32_t u8_next(const char *s, size_t n, size_t *i)
{
    utf8proc_int32_t cp;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + *i,
                                          (utf8proc_ssize_t)(n - *i), &cp);
    if (k <= 0) {
        cp = (unsigned char)s[*i];
        k = 1;
    }
    *i += (size_t)k;
    return cp;
}

static size_t u8_len(str_t s)
{
    size_t i = 0, k = 0;
    while (i < s.n) {
        (void)u8_next(s.p, s.n, &i); /* only the count matters */
        k++;
    }
    return k;
}

void rt__sb_put_cp(arena_t *a, sb_t *b, int32_t cp)
{
    utf8proc_uint8_t tmp[8];
    utf8proc_ssize_t k = utf8proc_encode_char(cp, tmp);
    if (k <= 0) {
        tmp[0] = (utf8proc_uint8_t)cp;
        k = 1;
    }
    rt__sb_put(a, b, (const char *)tmp, (size_t)k);
}

/* Python's str.isspace(), which strip() and split() use. */
static bool py_space(int32_t c)
{
    return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
           c == 0x202f || c == 0x205f || c == 0x3000;
}

// ---------------------------------------------------------------------------
// Render state

typedef struct scope {
    struct scope *parent;
    str_t *names;
    value_t *vals;
    int n, cap;
} scope_t;

enum fnkind { FN_BUILTIN, FN_METHOD, FN_MACRO, FN_CALLER, FN_LOOPCYCLE };

typedef struct func {
    int kind;
    str_t name;
    value_t self;        /* FN_METHOD: the receiver */
    const node_t *node;  /* FN_MACRO: the macro; FN_CALLER: the call block */
    scope_t *scope;      /* FN_CALLER: where the call block's body runs */
} func_t;

typedef struct loopst {
    value_t *items;
    size_t n, i;
} loopst_t;

typedef struct rs {
    arena_t a;
    fail_t f;
    scope_t *root;    /* template-level variables (set at the top level) */
    scope_t *globals; /* the context and the built-in globals */
    int calls;
    uint64_t steps;   /* work done so far (see step), against RT_TEMPLATE_MAX_STEPS */
    const node_t *at; /* node being evaluated, for error positions */
    value_t blockval; /* body of the innermost {% filter %} block */
} rs_t;

static _Noreturn void rfail(rs_t *r, int code, const char *fmt, ...) BL_PRINTF(3, 4);
static _Noreturn void rfail(rs_t *r, int code, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (code == RT_ERAISED)
        rt__fail_raise(&r->f, code, "template line %d: raise_exception: %s", r->at ? r->at->line : 0, msg);
    rt__fail_raise(&r->f, code, "template line %d:%d: %s", r->at ? r->at->line : 0,
               r->at ? r->at->col : 0, msg);
}

#define RFAIL(r, ...) rfail((r), RT_ERENDER, __VA_ARGS__)

/* Counts n units of work: a statement, a loop turn, a comparison, an item that `in`
 * looks at. Loops and the data they walk may come from the client (messages,
 * tools), so a template that is quadratic in them is stopped at a limit, not left
 * running. */
static void step(rs_t *r, uint64_t n)
{
    r->steps += n;
    if (r->steps > RT_TEMPLATE_MAX_STEPS)
        rfail(r, RT_ELIMIT, "the render took more than %llu steps",
              (unsigned long long)RT_TEMPLATE_MAX_STEPS);
}

// --- constructors

static value_t vundef(const char *why)
{
    value_t v = {.t = V_UNDEF};
    v.u.why = why;
    return v;
}

static value_t vnone(void)
{
    return (value_t){.t = V_NONE};
}

static value_t vbool(bool b)
{
    value_t v = {.t = V_BOOL};
    v.u.b = b;
    return v;
}

static value_t vint(int64_t i)
{
    value_t v = {.t = V_INT};
    v.u.i = i;
    return v;
}

static value_t vfloat(double f)
{
    value_t v = {.t = V_FLOAT};
    v.u.f = f;
    return v;
}

static value_t vstr(str_t s)
{
    value_t v = {.t = V_STR};
    v.u.s = s;
    return v;
}

static value_t vcstr(const char *s)
{
    return vstr((str_t){s, strlen(s)});
}

static list_t *list_new(rs_t *r, size_t cap)
{
    list_t *l = rt__alloc(&r->a, sizeof *l);
    memset(l, 0, sizeof *l);
    if (cap) {
        l->v = rt__alloc(&r->a, cap * sizeof *l->v);
        l->cap = cap;
    }
    return l;
}

static void list_push(rs_t *r, list_t *l, value_t v)
{
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 4;
        l->v = rt__realloc(&r->a, l->v, l->cap * sizeof *l->v, nc * sizeof *l->v);
        l->cap = nc;
    }
    l->v[l->n++] = v;
}

static value_t vlist(list_t *l)
{
    value_t v = {.t = V_LIST};
    v.u.l = l;
    return v;
}

static dict_t *dict_new(rs_t *r)
{
    dict_t *d = rt__alloc(&r->a, sizeof *d);
    memset(d, 0, sizeof *d);
    return d;
}

static value_t vgen(list_t *l)
{
    l->gen = GEN_GENERATOR;
    return vlist(l);
}

static value_t vdict(dict_t *d)
{
    value_t v = {.t = V_DICT};
    v.u.d = d;
    return v;
}

static bool v_eq(const value_t *a, const value_t *b, int depth);

static value_t *dict_find(const dict_t *d, const value_t *k)
{
    for (size_t i = 0; i < d->n; i++) {
        if (k->t == V_STR && d->k[i].t == V_STR) {
            if (streq2(k->u.s, d->k[i].u.s))
                return &d->v[i];
        } else if (v_eq(k, &d->k[i], 0)) {
            return &d->v[i];
        }
    }
    return NULL;
}

static void dict_set(rs_t *r, dict_t *d, value_t k, value_t v)
{
    value_t *slot = dict_find(d, &k);
    if (slot) {
        *slot = v;
        return;
    }
    if (d->n == d->cap) {
        size_t nc = d->cap ? d->cap * 2 : 4;
        d->k = rt__realloc(&r->a, d->k, d->cap * sizeof *d->k, nc * sizeof *d->k);
        d->v = rt__realloc(&r->a, d->v, d->cap * sizeof *d->v, nc * sizeof *d->v);
        d->cap = nc;
    }
    d->k[d->n] = k;
    d->v[d->n] = v;
    d->n++;
}

static value_t vfunc(rs_t *r, int kind, str_t name)
{
    func_t *fn = rt__alloc(&r->a, sizeof *fn);
    memset(fn, 0, sizeof *fn);
    fn->kind = kind;
    fn->name = name;
    value_t v = {.t = V_FUNC};
    v.u.fn = fn;
    return v;
}

static const char *type_name(const value_t *v)
{
    switch (v->t) {
    case V_UNDEF: return "Undefined";
    case V_NONE: return "NoneType";
    case V_BOOL: return "bool";
    case V_INT: return "int";
    case V_FLOAT: return "float";
    case V_STR: return "str";
    case V_LIST:
        switch (v->u.l->gen) {
        case GEN_GENERATOR: return "generator";
        case GEN_ITEMS: return "dict_items";
        case GEN_KEYS: return "dict_keys";
        case GEN_VALUES: return "dict_values";
        }
        return v->u.l->tuple ? "tuple" : "list";
    case V_DICT: return v->u.d->ns ? "Namespace" : "dict";
    case V_FUNC: return "function";
    case V_LOOP: return "LoopContext";
    }
    return "?";
}

static _Noreturn void undef_fail(rs_t *r, const value_t *v)
{
    rfail(r, RT_ERENDER, "%s", v->u.why ? v->u.why : "undefined value");
}

static bool truthy(const value_t *v)
{
    switch (v->t) {
    case V_UNDEF: case V_NONE: return false;
    case V_BOOL: return v->u.b;
    case V_INT: return v->u.i != 0;
    case V_FLOAT: return v->u.f != 0.0;
    case V_STR: return v->u.s.n != 0;
    case V_LIST: return v->u.l->gen == GEN_GENERATOR || v->u.l->n != 0;
    case V_DICT: return v->u.d->ns || v->u.d->n != 0;
    default: return true;
    }
}

static bool is_num(const value_t *v)
{
    return v->t == V_INT || v->t == V_FLOAT || v->t == V_BOOL;
}

static double num_f(const value_t *v)
{
    return v->t == V_FLOAT ? v->u.f : v->t == V_INT ? (double)v->u.i : (double)v->u.b;
}

/* A float past int64's range saturates (NaN gives 0): the cast alone would be
 * undefined for the 1e300 a template may write. */
static int64_t num_i(const value_t *v)
{
    if (v->t == V_INT)
        return v->u.i;
    if (v->t == V_BOOL)
        return v->u.b;
    double f = v->u.f;
    if (f != f)
        return 0;
    if (f >= 9223372036854775807.0)
        return INT64_MAX;
    if (f <= -9223372036854775808.0)
        return INT64_MIN;
    return (int64_t)f;
}

// --- printing (Python str() and repr())

/* Python's repr() of a float: the shortest digits that read back exactly, in
 * fixed notation for exponents -4..15, else scientific with a 2-digit exponent. */
static void fmt_float(char *out, size_t outn, double d, bool json)
{
    if (isnan(d)) {
        snprintf(out, outn, "%s", json ? "NaN" : "nan");
        return;
    }
    if (isinf(d)) {
        snprintf(out, outn, "%s%s", d < 0 ? "-" : "", json ? "Infinity" : "inf");
        return;
    }
    char tmp[48];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, d);
        if (strtod(tmp, NULL) == d)
            break;
    }
    char digits[32];
    int nd = 0;
    const char *q = tmp;
    bool neg = *q == '-';
    if (neg)
        q++;
    for (; *q && *q != 'e'; q++)
        if (isdigit((unsigned char)*q))
            digits[nd++] = *q;
    int e = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    digits[nd] = 0;
    char *o = out;
    size_t left = outn;
#define EMIT(...) do { int k_ = snprintf(o, left, __VA_ARGS__); if (k_ > 0 && (size_t)k_ < left) { o += k_; left -= (size_t)k_; } } while (0)
    if (neg)
        EMIT("-");
    if (e >= -4 && e < 16) {
        int decpt = e + 1;
        if (decpt <= 0) {
            EMIT("0.");
            for (int i = 0; i < -decpt; i++)
                EMIT("0");
            EMIT("%s", digits);
        } else if (decpt >= nd) {
            EMIT("%s", digits);
            for (int i = nd; i < decpt; i++)
                EMIT("0");
            EMIT(".0");
        } else {
            EMIT("%.*s.%s", decpt, digits, digits + decpt);
        }
    } else {
        EMIT("%c", digits[0]);
        if (nd > 1)
            EMIT(".%s", digits + 1);
        EMIT("e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    }
#undef EMIT
}

static bool py_printable(int32_t c)
{
    if (c == ' ')
        return true;
    switch (utf8proc_category(c)) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO: case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP: case UTF8PROC_CATEGORY_ZS:
        return false;
    default:
        return true;
    }
}

static void repr_str(rs_t *r, sb_t *b, str_t s)
{
    bool sq = memchr(s.p, '\'', s.n) != NULL, dq = memchr(s.p, '"', s.n) != NULL;
    char quote = sq && !dq ? '"' : '\'';
    rt__sb_putc(&r->a, b, quote);
    size_t i = 0;
    while (i < s.n) {
        size_t st = i;
        int32_t c = u8_next(s.p, s.n, &i);
        if (c == quote || c == '\\') {
            rt__sb_putc(&r->a, b, '\\');
            rt__sb_putc(&r->a, b, (char)c);
        } else if (c == '\n') {
            sb_puts(&r->a, b, "\\n");
        } else if (c == '\r') {
            sb_puts(&r->a, b, "\\r");
        } else if (c == '\t') {
            sb_puts(&r->a, b, "\\t");
        } else if (c < 0x7f && c >= 0x20) {
            rt__sb_putc(&r->a, b, (char)c);
        } else if (!py_printable(c)) {
            if (c <= 0xff)
                sb_printf(&r->a, b, "\\x%02x", (unsigned)c);
            else if (c <= 0xffff)
                sb_printf(&r->a, b, "\\u%04x", (unsigned)c);
            else
                sb_printf(&r->a, b, "\\U%08x", (unsigned)c);
        } else {
            rt__sb_put(&r->a, b, s.p + st, i - st);
        }
    }
    rt__sb_putc(&r->a, b, quote);
}

static void v_repr(rs_t *r, sb_t *b, const value_t *v, int depth);

static void v_str(rs_t *r, sb_t *b, const value_t *v, int depth)
{
    char tmp[64];
    switch (v->t) {
    case V_UNDEF: return;
    case V_NONE: sb_puts(&r->a, b, "None"); return;
    case V_BOOL: sb_puts(&r->a, b, v->u.b ? "True" : "False"); return;
    case V_INT: sb_printf(&r->a, b, "%lld", (long long)v->u.i); return;
    case V_FLOAT: fmt_float(tmp, sizeof tmp, v->u.f, false); sb_puts(&r->a, b, tmp); return;
    case V_STR: rt__sb_put(&r->a, b, v->u.s.p, v->u.s.n); return;
    default: v_repr(r, b, v, depth);
    }
}

static void v_repr(rs_t *r, sb_t *b, const value_t *v, int depth)
{
    if (depth > RT_TEMPLATE_MAX_DATA_DEPTH)
        rfail(r, RT_ELIMIT, "value nested deeper than %d", RT_TEMPLATE_MAX_DATA_DEPTH);
    switch (v->t) {
    case V_UNDEF: sb_puts(&r->a, b, "Undefined"); return;
    case V_STR: repr_str(r, b, v->u.s); return;
    case V_LIST: {
        const list_t *l = v->u.l;
        if (l->gen == GEN_GENERATOR) {
            /* Python adds the object's address; a prompt must come out the same on
             * every render (the prompt cache) and must not show where the heap is */
            sb_puts(&r->a, b, "<generator object>");
            return;
        }
        if (l->gen)
            sb_printf(&r->a, b, "%s(", type_name(v));
        rt__sb_putc(&r->a, b, l->tuple ? '(' : '[');
        for (size_t i = 0; i < l->n; i++) {
            if (i)
                sb_puts(&r->a, b, ", ");
            v_repr(r, b, &l->v[i], depth + 1);
        }
        if (l->tuple && l->n == 1)
            rt__sb_putc(&r->a, b, ',');
        rt__sb_putc(&r->a, b, l->tuple ? ')' : ']');
        if (l->gen)
            rt__sb_putc(&r->a, b, ')');
        return;
    }
    case V_DICT: {
        const dict_t *d = v->u.d;
        if (d->ns)
            sb_puts(&r->a, b, "<Namespace ");
        rt__sb_putc(&r->a, b, '{');
        for (size_t i = 0; i < d->n; i++) {
            if (i)
                sb_puts(&r->a, b, ", ");
            v_repr(r, b, &d->k[i], depth + 1);
            sb_puts(&r->a, b, ": ");
            v_repr(r, b, &d->v[i], depth + 1);
        }
        rt__sb_putc(&r->a, b, '}');
        if (d->ns)
            rt__sb_putc(&r->a, b, '>');
        return;
    }
    case V_FUNC:
        sb_printf(&r->a, b, "<function %.*s>", (int)v->u.fn->name.n, v->u.fn->name.p);
        return;
    case V_LOOP:
        sb_puts(&r->a, b, "<LoopContext>");
        return;
    default:
        v_str(r, b, v, depth);
    }
}

static str_t to_str(rs_t *r, const value_t *v)
{
    if (v->t == V_STR)
        return v->u.s;
    sb_t b = {0};
    v_str(r, &b, v, 0);
    return sb_str(&b);
}

// --- JSON (Python json.dumps as Hugging Face's tojson calls it)

typedef struct jopts {
    const char *indent; /* NULL: one line */
    str_t item_sep, key_sep;
    bool sort_keys, ensure_ascii;
} jopts_t;

static void json_str(rs_t *r, sb_t *b, str_t s, bool ascii)
{
    rt__sb_putc(&r->a, b, '"');
    size_t i = 0;
    while (i < s.n) {
        size_t st = i;
        int32_t c = u8_next(s.p, s.n, &i);
        switch (c) {
        case '"': sb_puts(&r->a, b, "\\\""); break;
        case '\\': sb_puts(&r->a, b, "\\\\"); break;
        case '\n': sb_puts(&r->a, b, "\\n"); break;
        case '\r': sb_puts(&r->a, b, "\\r"); break;
        case '\t': sb_puts(&r->a, b, "\\t"); break;
        case '\b': sb_puts(&r->a, b, "\\b"); break;
        case '\f': sb_puts(&r->a, b, "\\f"); break;
        default:
            if (c < 0x20 || (ascii && c >= 0x7f)) {
                if (c > 0xffff) {
                    int32_t v = c - 0x10000;
                    sb_printf(&r->a, b, "\\u%04x\\u%04x", (unsigned)(0xd800 | (v >> 10)),
                              (unsigned)(0xdc00 | (v & 0x3ff)));
                } else {
                    sb_printf(&r->a, b, "\\u%04x", (unsigned)c);
                }
            } else {
                rt__sb_put(&r->a, b, s.p + st, i - st);
            }
        }
    }
    rt__sb_putc(&r->a, b, '"');
}

static void json_nl(rs_t *r, sb_t *b, const jopts_t *o, int level)
{
    rt__sb_putc(&r->a, b, '\n');
    for (int i = 0; i < level; i++)
        sb_puts(&r->a, b, o->indent);
}

static void json_val(rs_t *r, sb_t *b, const value_t *v, const jopts_t *o, int level)
{
    char tmp[64];
    if (level > RT_TEMPLATE_MAX_DATA_DEPTH)
        rfail(r, RT_ELIMIT, "tojson: value nested deeper than %d", RT_TEMPLATE_MAX_DATA_DEPTH);
    switch (v->t) {
    case V_NONE: sb_puts(&r->a, b, "null"); return;
    case V_BOOL: sb_puts(&r->a, b, v->u.b ? "true" : "false"); return;
    case V_INT: sb_printf(&r->a, b, "%lld", (long long)v->u.i); return;
    case V_FLOAT: fmt_float(tmp, sizeof tmp, v->u.f, true); sb_puts(&r->a, b, tmp); return;
    case V_STR: json_str(r, b, v->u.s, o->ensure_ascii); return;
    case V_LIST: {
        const list_t *l = v->u.l;
        if (l->gen)
            break;
        if (!l->n) {
            sb_puts(&r->a, b, "[]");
            return;
        }
        rt__sb_putc(&r->a, b, '[');
        for (size_t i = 0; i < l->n; i++) {
            if (i)
                rt__sb_put(&r->a, b, o->item_sep.p, o->item_sep.n);
            if (o->indent)
                json_nl(r, b, o, level + 1);
            json_val(r, b, &l->v[i], o, level + 1);
        }
        if (o->indent)
            json_nl(r, b, o, level);
        rt__sb_putc(&r->a, b, ']');
        return;
    }
    case V_DICT: {
        const dict_t *d = v->u.d;
        if (d->ns)
            break;
        if (!d->n) {
            sb_puts(&r->a, b, "{}");
            return;
        }
        /* keys become strings first, as json.dumps converts them */
        size_t *order = rt__alloc(&r->a, d->n * sizeof *order);
        str_t *keys = rt__alloc(&r->a, d->n * sizeof *keys);
        for (size_t i = 0; i < d->n; i++) {
            const value_t *k = &d->k[i];
            order[i] = i;
            if (k->t == V_STR) {
                keys[i] = k->u.s;
            } else if (k->t == V_NONE || k->t == V_BOOL || k->t == V_INT || k->t == V_FLOAT) {
                sb_t kb = {0};
                json_val(r, &kb, k, o, level + 1);
                keys[i] = sb_str(&kb);
            } else {
                rfail(r, RT_ERENDER, "tojson: keys must be str, int, float, bool or None, not %s",
                      type_name(k));
            }
        }
        if (o->sort_keys) {
            /* stable insertion sort: dicts in templates are small */
            for (size_t i = 1; i < d->n; i++) {
                size_t x = order[i], j = i;
                while (j > 0) {
                    str_t a = keys[order[j - 1]], c = keys[x];
                    size_t m = a.n < c.n ? a.n : c.n;
                    int cm = memcmp(a.p, c.p, m);
                    if (cm < 0 || (cm == 0 && a.n <= c.n))
                        break;
                    order[j] = order[j - 1];
                    j--;
                }
                order[j] = x;
            }
        }
        rt__sb_putc(&r->a, b, '{');
        for (size_t i = 0; i < d->n; i++) {
            if (i)
                rt__sb_put(&r->a, b, o->item_sep.p, o->item_sep.n);
            if (o->indent)
                json_nl(r, b, o, level + 1);
            json_str(r, b, keys[order[i]], o->ensure_ascii);
            rt__sb_put(&r->a, b, o->key_sep.p, o->key_sep.n);
            json_val(r, b, &d->v[order[i]], o, level + 1);
        }
        if (o->indent)
            json_nl(r, b, o, level);
        rt__sb_putc(&r->a, b, '}');
        return;
    }
    default:
        break;
    }
    rfail(r, RT_ERENDER, "tojson: object of type %s is not JSON serializable", type_name(v));
}

// --- comparison

static bool v_eq(const value_t *a, const value_t *b, int depth)
{
    if (depth > RT_TEMPLATE_MAX_DATA_DEPTH)
        return false;
    if (is_num(a) && is_num(b)) {
        if (a->t == V_FLOAT || b->t == V_FLOAT)
            return num_f(a) == num_f(b);
        return num_i(a) == num_i(b);
    }
    if (a->t != b->t)
        return false;
    switch (a->t) {
    case V_UNDEF: case V_NONE: return true;
    case V_STR: return streq2(a->u.s, b->u.s);
    case V_LIST:
        if (a->u.l->gen == GEN_GENERATOR || b->u.l->gen == GEN_GENERATOR)
            return a->u.l == b->u.l;
        if (a->u.l->n != b->u.l->n || a->u.l->tuple != b->u.l->tuple || a->u.l->gen != b->u.l->gen)
            return false;
        for (size_t i = 0; i < a->u.l->n; i++)
            if (!v_eq(&a->u.l->v[i], &b->u.l->v[i], depth + 1))
                return false;
        return true;
    case V_DICT:
        if (a->u.d == b->u.d)
            return true;
        if (a->u.d->ns || b->u.d->ns || a->u.d->n != b->u.d->n)
            return false;
        for (size_t i = 0; i < a->u.d->n; i++) {
            const value_t *o = dict_find(b->u.d, &a->u.d->k[i]);
            if (!o || !v_eq(&a->u.d->v[i], o, depth + 1))
                return false;
        }
        return true;
    case V_FUNC: return a->u.fn == b->u.fn;
    default: return false;
    }
}

static int cmp_str(str_t a, str_t b)
{
    size_t m = a.n < b.n ? a.n : b.n;
    int c = m ? memcmp(a.p, b.p, m) : 0;
    if (c)
        return c < 0 ? -1 : 1;
    return a.n < b.n ? -1 : a.n > b.n ? 1 : 0;
}

/* Python ordering: numbers with numbers, strings with strings, sequences
 * element-wise; anything else is a TypeError. */
static int v_cmp(rs_t *r, const value_t *a, const value_t *b, const char *op)
{
    step(r, 1);
    if (is_num(a) && is_num(b)) {
        if (a->t == V_FLOAT || b->t == V_FLOAT) {
            double x = num_f(a), y = num_f(b);
            return x < y ? -1 : x > y ? 1 : 0;
        }
        int64_t x = num_i(a), y = num_i(b);
        return x < y ? -1 : x > y ? 1 : 0;
    }
    if (a->t == V_STR && b->t == V_STR)
        return cmp_str(a->u.s, b->u.s);
    if (a->t == V_LIST && b->t == V_LIST && a->u.l->tuple == b->u.l->tuple && !a->u.l->gen &&
        !b->u.l->gen) {
        for (size_t i = 0; i < a->u.l->n && i < b->u.l->n; i++) {
            if (v_eq(&a->u.l->v[i], &b->u.l->v[i], 0))
                continue;
            return v_cmp(r, &a->u.l->v[i], &b->u.l->v[i], op);
        }
        return a->u.l->n < b->u.l->n ? -1 : a->u.l->n > b->u.l->n ? 1 : 0;
    }
    if (a->t == V_UNDEF)
        undef_fail(r, a);
    if (b->t == V_UNDEF)
        undef_fail(r, b);
    RFAIL(r, "'%s' not supported between instances of '%s' and '%s'", op, type_name(a),
          type_name(b));
    return 0;
}

// ---------------------------------------------------------------------------
// Scopes

static value_t *scope_find(scope_t *s, str_t name)
{
    for (; s; s = s->parent)
        for (int i = s->n - 1; i >= 0; i--)
            if (streq2(s->names[i], name))
                return &s->vals[i];
    return NULL;
}

static void scope_set(rs_t *r, scope_t *s, str_t name, value_t v)
{
    for (int i = 0; i < s->n; i++)
        if (streq2(s->names[i], name)) {
            s->vals[i] = v;
            return;
        }
    if (s->n == s->cap) {
        int nc = s->cap ? s->cap * 2 : 4;
        s->names = rt__realloc(&r->a, s->names, (size_t)s->cap * sizeof *s->names, (size_t)nc * sizeof *s->names);
        s->vals = rt__realloc(&r->a, s->vals, (size_t)s->cap * sizeof *s->vals, (size_t)nc * sizeof *s->vals);
        s->cap = nc;
    }
    s->names[s->n] = name;
    s->vals[s->n] = v;
    s->n++;
}

static scope_t *scope_new(rs_t *r, scope_t *parent)
{
    scope_t *s = rt__alloc(&r->a, sizeof *s);
    memset(s, 0, sizeof *s);
    s->parent = parent;
    return s;
}

// ---------------------------------------------------------------------------
// Calls: evaluated arguments

typedef struct callargs {
    value_t *pos;
    int npos;
    str_t *kwn;
    value_t *kwv;
    int nkw;
} callargs_t;

/* The argument at position i or named `name`, or NULL. */
static const value_t *arg(const callargs_t *c, int i, const char *name)
{
    if (i >= 0 && i < c->npos)
        return &c->pos[i];
    for (int k = 0; name && k < c->nkw; k++)
        if (streq(c->kwn[k], name))
            return &c->kwv[k];
    return NULL;
}

static value_t eval(rs_t *r, const node_t *e, scope_t *s);
static int exec_body(rs_t *r, node_t *const *body, int n, scope_t *s, sb_t *out);

static void eval_args(rs_t *r, const args_t *a, scope_t *s, callargs_t *c)
{
    memset(c, 0, sizeof *c);
    if (a->npos) {
        c->pos = rt__alloc(&r->a, (size_t)a->npos * sizeof *c->pos);
        for (int i = 0; i < a->npos; i++)
            c->pos[i] = eval(r, a->pos[i], s);
    }
    c->npos = a->npos;
    if (a->nkw) {
        c->kwv = rt__alloc(&r->a, (size_t)a->nkw * sizeof *c->kwv);
        for (int i = 0; i < a->nkw; i++)
            c->kwv[i] = eval(r, a->kwv[i], s);
    }
    c->kwn = a->kwn;
    c->nkw = a->nkw;
}

static const char *fmt_msg(rs_t *r, const char *fmt, ...) BL_PRINTF(2, 3);
static const char *fmt_msg(rs_t *r, const char *fmt, ...)
{
    char tmp[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    return astr(&r->a, tmp, strlen(tmp)).p;
}

static const char *obj_desc(const value_t *v)
{
    switch (v->t) {
    case V_NONE: return "None";
    case V_DICT: return v->u.d->ns ? "Namespace object" : "dict object";
    case V_LIST: return v->u.l->tuple ? "tuple object" : "list object";
    case V_STR: return "str object";
    case V_INT: return "int object";
    case V_FLOAT: return "float object";
    case V_BOOL: return "bool object";
    default: return "object";
    }
}

static value_t undef_attr(rs_t *r, const value_t *obj, str_t name)
{
    return vundef(fmt_msg(r, "'%s' has no attribute '%.*s'", obj_desc(obj), (int)(name.n < 60 ? name.n : 60), name.p));
}

static const char *const str_methods[] = {
    "startswith", "endswith", "split", "rsplit", "strip", "lstrip", "rstrip", "upper",
    "lower", "title", "capitalize", "replace", "find", "rfind", "index", "count",
    "format", "join", "isdigit", "isalpha", "isalnum", "isspace", "islower", "isupper",
    "splitlines", "removeprefix", "removesuffix", "isnumeric", "swapcase", NULL};
static const char *const dict_methods[] = {"get", "items", "keys", "values", "copy", NULL};
static const char *const dict_unsafe[] = {"pop", "popitem", "setdefault", "update", "clear", NULL};
static const char *const list_methods[] = {"index", "count", "copy", NULL};
static const char *const list_unsafe[] = {"append", "extend", "insert", "pop", "remove",
                                          "reverse", "sort", "clear", NULL};

static bool in_table(const char *const *t, str_t s)
{
    for (int i = 0; t[i]; i++)
        if (streq(s, t[i]))
            return true;
    return false;
}

static value_t method(rs_t *r, const value_t *self, str_t name)
{
    value_t f = vfunc(r, FN_METHOD, name);
    f.u.fn->self = *self;
    return f;
}

/* The immutable sandbox refuses methods that modify their object; like Jinja it
 * hands back an undefined that fails when used. */
static value_t unsafe_attr(rs_t *r, const value_t *obj, str_t name)
{
    return vundef(fmt_msg(r, "access to attribute '%.*s' of '%s' object is unsafe", (int)name.n,
                          name.p, type_name(obj)));
}

static value_t loop_attr(rs_t *r, const value_t *obj, str_t name)
{
    const loopst_t *l = obj->u.lp;
    int64_t i = (int64_t)l->i, n = (int64_t)l->n;
    if (streq(name, "index")) return vint(i + 1);
    if (streq(name, "index0")) return vint(i);
    if (streq(name, "revindex")) return vint(n - i);
    if (streq(name, "revindex0")) return vint(n - i - 1);
    if (streq(name, "first")) return vbool(i == 0);
    if (streq(name, "last")) return vbool(i == n - 1);
    if (streq(name, "length")) return vint(n);
    if (streq(name, "depth")) return vint(1);
    if (streq(name, "depth0")) return vint(0);
    if (streq(name, "previtem"))
        return i > 0 ? l->items[i - 1] : vundef("there is no previous item");
    if (streq(name, "nextitem"))
        return i + 1 < n ? l->items[i + 1] : vundef("there is no next item");
    if (streq(name, "cycle")) {
        value_t f = vfunc(r, FN_LOOPCYCLE, name);
        f.u.fn->self = *obj;
        return f;
    }
    return undef_attr(r, obj, name);
}

static value_t get_attr(rs_t *r, const value_t *obj, str_t name)
{
    switch (obj->t) {
    case V_UNDEF:
        undef_fail(r, obj);
    case V_DICT: {
        if (!obj->u.d->ns) {
            if (in_table(dict_methods, name))
                return method(r, obj, name);
            if (in_table(dict_unsafe, name))
                return unsafe_attr(r, obj, name);
        }
        value_t k = vstr(name);
        value_t *v = dict_find(obj->u.d, &k);
        return v ? *v : undef_attr(r, obj, name);
    }
    case V_STR:
        return in_table(str_methods, name) ? method(r, obj, name) : undef_attr(r, obj, name);
    case V_LIST:
        if (in_table(list_methods, name))
            return method(r, obj, name);
        if (in_table(list_unsafe, name))
            return unsafe_attr(r, obj, name);
        return undef_attr(r, obj, name);
    case V_LOOP:
        return loop_attr(r, obj, name);
    default:
        return undef_attr(r, obj, name);
    }
}

/* Byte offsets of each code point of s, plus s.n at the end; *count gets the
 * number of code points. */
static size_t *str_offsets(rs_t *r, str_t s, size_t *count)
{
    size_t *off = rt__alloc(&r->a, (s.n + 1) * sizeof *off);
    size_t i = 0, k = 0;
    while (i < s.n) {
        off[k++] = i;
        (void)u8_next(s.p, s.n, &i); /* only the position matters */
    }
    off[k] = s.n;
    *count = k;
    return off;
}

static value_t get_item(rs_t *r, const value_t *obj, const value_t *key)
{
    switch (obj->t) {
    case V_UNDEF:
        undef_fail(r, obj);
    case V_DICT: {
        value_t *v = dict_find(obj->u.d, key);
        if (v)
            return *v;
        if (key->t == V_STR)
            return get_attr(r, obj, key->u.s);
        return vundef(fmt_msg(r, "'%s' has no such item", obj_desc(obj)));
    }
    case V_LIST:
        if (obj->u.l->gen)
            return vundef(fmt_msg(r, "'%s' object is not subscriptable", type_name(obj)));
        if (key->t == V_INT || key->t == V_BOOL) {
            int64_t i = num_i(key), n = (int64_t)obj->u.l->n;
            if (i < 0)
                i += n;
            if (i >= 0 && i < n)
                return obj->u.l->v[i];
            return vundef(fmt_msg(r, "list index %lld out of range", (long long)num_i(key)));
        }
        if (key->t == V_STR)
            return get_attr(r, obj, key->u.s);
        return vundef("list indices must be integers");
    case V_STR:
        if (key->t == V_INT || key->t == V_BOOL) {
            size_t n;
            size_t *off = str_offsets(r, obj->u.s, &n);
            int64_t i = num_i(key);
            if (i < 0)
                i += (int64_t)n;
            if (i >= 0 && i < (int64_t)n)
                return vstr((str_t){obj->u.s.p + off[i], off[i + 1] - off[i]});
            return vundef("string index out of range");
        }
        if (key->t == V_STR)
            return get_attr(r, obj, key->u.s);
        return vundef("string indices must be integers");
    case V_LOOP:
        if (key->t == V_STR)
            return loop_attr(r, obj, key->u.s);
        return vundef("no such item");
    default:
        return vundef(fmt_msg(r, "'%s' has no such item", obj_desc(obj)));
    }
}

static int64_t slice_arg(rs_t *r, const value_t *v, bool *given)
{
    *given = false;
    if (!v || v->t == V_NONE)
        return 0;
    if (v->t != V_INT && v->t != V_BOOL)
        RFAIL(r, "slice indices must be integers or None");
    *given = true;
    return num_i(v);
}

static value_t get_slice(rs_t *r, const value_t *obj, const value_t *va, const value_t *vb,
                         const value_t *vc)
{
    bool ga, gb, gc;
    int64_t a = slice_arg(r, va, &ga), b = slice_arg(r, vb, &gb), c = slice_arg(r, vc, &gc);
    if (!gc)
        c = 1;
    if (c == 0)
        RFAIL(r, "slice step cannot be zero");
    size_t cnt = 0, *off = NULL;
    if (obj->t == V_STR)
        off = str_offsets(r, obj->u.s, &cnt);
    else if (obj->t == V_LIST && !obj->u.l->gen)
        cnt = obj->u.l->n;
    else if (obj->t == V_UNDEF)
        undef_fail(r, obj);
    else
        RFAIL(r, "'%s' object is not subscriptable", type_name(obj));
    int64_t n = (int64_t)cnt;
    if (c > 0) {
        if (!ga) a = 0;
        else { if (a < 0) a += n; if (a < 0) a = 0; if (a > n) a = n; }
        if (!gb) b = n;
        else { if (b < 0) b += n; if (b < 0) b = 0; if (b > n) b = n; }
    } else {
        if (!ga) a = n - 1;
        else { if (a < 0) a += n; if (a < 0) a = -1; if (a >= n) a = n - 1; }
        if (!gb) b = -1;
        else { if (b < 0) b += n; if (b < 0) b = -1; if (b >= n) b = n - 1; }
    }
    if (obj->t == V_STR) {
        if (c == 1)
            return vstr(a < b ? (str_t){obj->u.s.p + off[a], off[b] - off[a]} : (str_t){"", 0});
        sb_t out = {0};
        for (int64_t i = a; c > 0 ? i < b : i > b; i += c)
            rt__sb_put(&r->a, &out, obj->u.s.p + off[i], off[i + 1] - off[i]);
        return vstr(sb_str(&out));
    }
    list_t *l = list_new(r, 0);
    l->tuple = obj->u.l->tuple;
    for (int64_t i = a; c > 0 ? i < b : i > b; i += c)
        list_push(r, l, obj->u.l->v[i]);
    return vlist(l);
}

/* The items a for loop or a filter walks: list items, dict keys, string code
 * points; undefined walks as empty, like Jinja's Undefined. */
static list_t *iter_items(rs_t *r, const value_t *v)
{
    switch (v->t) {
    case V_UNDEF:
        return list_new(r, 0);
    case V_LIST:
        return v->u.l;
    case V_DICT: {
        if (v->u.d->ns)
            break;
        list_t *l = list_new(r, v->u.d->n);
        for (size_t i = 0; i < v->u.d->n; i++)
            list_push(r, l, v->u.d->k[i]);
        return l;
    }
    case V_STR: {
        list_t *l = list_new(r, 0);
        size_t i = 0;
        while (i < v->u.s.n) {
            size_t st = i;
            (void)u8_next(v->u.s.p, v->u.s.n, &i); /* only the span matters */
            list_push(r, l, vstr((str_t){v->u.s.p + st, i - st}));
        }
        return l;
    }
    default:
        break;
    }
    RFAIL(r, "'%s' object is not iterable", type_name(v));
    return NULL;
}

static bool v_in(rs_t *r, const value_t *a, const value_t *b)
{
    switch (b->t) {
    case V_UNDEF:
        return false;
    case V_STR:
        if (a->t != V_STR)
            RFAIL(r, "'in <string>' requires string as left operand, not %s", type_name(a));
        if (!a->u.s.n)
            return true;
        return memmem(b->u.s.p, b->u.s.n, a->u.s.p, a->u.s.n) != NULL;
    case V_LIST:
        for (size_t i = 0; i < b->u.l->n; i++)
            if (v_eq(a, &b->u.l->v[i], 0)) {
                step(r, i + 1);
                return true;
            }
        step(r, b->u.l->n);
        return false;
    case V_DICT:
        if (b->u.d->ns)
            break;
        if ((a->t == V_LIST && !a->u.l->tuple) || a->t == V_DICT)
            RFAIL(r, "unhashable type: '%s'", type_name(a));
        step(r, b->u.d->n);
        return dict_find(b->u.d, a) != NULL;
    default:
        break;
    }
    RFAIL(r, "argument of type '%s' is not iterable", type_name(b));
    return false;
}

static str_t html_escape(rs_t *r, str_t s)
{
    sb_t b = {0};
    for (size_t i = 0; i < s.n; i++) {
        switch (s.p[i]) {
        case '&': sb_puts(&r->a, &b, "&amp;"); break;
        case '<': sb_puts(&r->a, &b, "&lt;"); break;
        case '>': sb_puts(&r->a, &b, "&gt;"); break;
        case '"': sb_puts(&r->a, &b, "&#34;"); break;
        case '\'': sb_puts(&r->a, &b, "&#39;"); break;
        default: rt__sb_putc(&r->a, &b, s.p[i]);
        }
    }
    return sb_str(&b);
}

static void v_repr(rs_t *r, sb_t *b, const value_t *v, int depth);

/* Python's printf-style `fmt % args` for %s %r %d %i %f %x %% with optional
 * flags, width and precision; args is a tuple or one value. */
static str_t percent_format(rs_t *r, str_t fmt, const value_t *args)
{
    const value_t *av = args;
    size_t na = 1;
    /* Python lets a mapping (anything indexable but a tuple or str) go unused */
    bool mapping = args->t == V_DICT || args->t == V_UNDEF || (args->t == V_LIST && !args->u.l->tuple);
    if (args->t == V_LIST && args->u.l->tuple) {
        av = args->u.l->v;
        na = args->u.l->n;
    }
    size_t ai = 0;
    sb_t b = {0};
    for (size_t i = 0; i < fmt.n; i++) {
        if (fmt.p[i] != '%') {
            rt__sb_putc(&r->a, &b, fmt.p[i]);
            continue;
        }
        char spec[32];
        size_t k = 0;
        spec[k++] = '%';
        i++;
        const value_t *named = NULL;
        if (args->t == V_DICT && i < fmt.n && fmt.p[i] == '(') {
            const char *e = memchr(fmt.p + i, ')', fmt.n - i);
            if (!e)
                RFAIL(r, "incomplete format key");
            value_t key = vstr((str_t){fmt.p + i + 1, (size_t)(e - fmt.p) - i - 1});
            named = dict_find(args->u.d, &key);
            if (!named)
                RFAIL(r, "format key '%.*s' is missing", (int)key.u.s.n, key.u.s.p);
            i = (size_t)(e - fmt.p) + 1;
        }
        while (i < fmt.n && k < 20 && fmt.p[i] && strchr("-+ #0123456789.", fmt.p[i]))
            spec[k++] = fmt.p[i++];
        if (i >= fmt.n)
            RFAIL(r, "incomplete format");
        char conv = fmt.p[i];
        if (conv == '%') {
            rt__sb_putc(&r->a, &b, '%');
            continue;
        }
        if (!named && ai >= na)
            RFAIL(r, "not enough arguments for format string");
        const value_t *v = named ? named : &av[ai++];
        if (conv == 's' || conv == 'r') {
            sb_t t = {0};
            if (conv == 's')
                v_str(r, &t, v, 0);
            else
                v_repr(r, &t, v, 0);
            spec[k++] = '.';
            spec[k++] = '*';
            spec[k++] = 's';
            spec[k] = 0;
            if (k == 5) /* no flags or width: copy as is */
                rt__sb_put(&r->a, &b, t.p ? t.p : "", t.n);
            else
                sb_printf(&r->a, &b, spec, (int)t.n, t.p ? t.p : "");
        } else if (conv == 'd' || conv == 'i' || conv == 'x' || conv == 'X') {
            if (!is_num(v))
                RFAIL(r, "%%%c format: a number is required, not %s", conv, type_name(v));
            spec[k++] = 'l';
            spec[k++] = 'l';
            spec[k++] = conv == 'i' ? 'd' : conv;
            spec[k] = 0;
            sb_printf(&r->a, &b, spec, (long long)num_i(v));
        } else if (conv == 'f' || conv == 'e' || conv == 'g') {
            if (!is_num(v))
                RFAIL(r, "%%%c format: a number is required, not %s", conv, type_name(v));
            spec[k++] = conv;
            spec[k] = 0;
            sb_printf(&r->a, &b, spec, num_f(v));
        } else {
            rfail(r, BL_ENOTSUP, "format conversion '%%%c' is not supported", conv);
        }
    }
    if (ai < na && !mapping)
        RFAIL(r, "not all arguments converted during string formatting");
    return sb_str(&b);
}

static int64_t overflow(rs_t *r)
{
    RFAIL(r, "integer overflow");
    return 0;
}

static value_t binop(rs_t *r, int op, const value_t *a, const value_t *b)
{
    if (op == OP_MOD && a->t == V_STR) /* str % x formats before x's own operators */
        return vstr(percent_format(r, a->u.s, b));
    if (a->t == V_UNDEF)
        undef_fail(r, a);
    if (b->t == V_UNDEF)
        undef_fail(r, b);
    if (is_num(a) && is_num(b)) {
        bool fl = a->t == V_FLOAT || b->t == V_FLOAT;
        int64_t x = num_i(a), y = num_i(b), z;
        double fx = num_f(a), fy = num_f(b);
        switch (op) {
        case OP_ADD:
            if (fl) return vfloat(fx + fy);
            return vint(__builtin_add_overflow(x, y, &z) ? overflow(r) : z);
        case OP_SUB:
            if (fl) return vfloat(fx - fy);
            return vint(__builtin_sub_overflow(x, y, &z) ? overflow(r) : z);
        case OP_MUL:
            if (fl) return vfloat(fx * fy);
            return vint(__builtin_mul_overflow(x, y, &z) ? overflow(r) : z);
        case OP_DIV:
            if (fy == 0.0)
                RFAIL(r, "division by zero");
            return vfloat(fx / fy);
        case OP_FDIV:
        case OP_MOD:
            if (fl ? fy == 0.0 : y == 0)
                RFAIL(r, op == OP_MOD ? "modulo by zero" : "integer division or modulo by zero");
            if (fl) {
                double m = fmod(fx, fy), d = (fx - m) / fy;
                if (m != 0 && ((m < 0) != (fy < 0))) {
                    m += fy;
                    d -= 1.0;
                }
                double fd = floor(d);
                if (d - fd > 0.5)
                    fd += 1.0;
                if (d == 0.0) /* Python keeps the sign of the true quotient */
                    fd = copysign(0.0, fx / fy);
                return op == OP_MOD ? vfloat(m) : vfloat(fd);
            } else {
                if (x == INT64_MIN && y == -1)
                    RFAIL(r, "integer overflow");
                int64_t q = x / y, m = x % y;
                if (m != 0 && ((m < 0) != (y < 0))) {
                    q--;
                    m += y;
                }
                return op == OP_MOD ? vint(m) : vint(q);
            }
        case OP_POW:
            if (fx == 0.0 && fy < 0)
                RFAIL(r, "0.0 cannot be raised to a negative power");
            if (fl || y < 0)
                return vfloat(pow(fx, fy));
            {
                /* by squaring: a huge exponent of 0, 1 or -1 must not loop for ages */
                int64_t acc = 1, base = x;
                for (int64_t e = y; e > 0; e >>= 1) {
                    if ((e & 1) && __builtin_mul_overflow(acc, base, &acc))
                        RFAIL(r, "integer overflow");
                    /* a square that overflows while bits remain makes the result overflow */
                    if (e > 1 && __builtin_mul_overflow(base, base, &base))
                        RFAIL(r, "integer overflow");
                }
                return vint(acc);
            }
        }
    }
    if (op == OP_ADD && a->t == V_STR && b->t == V_STR) {
        str_t x = a->u.s, y = b->u.s;
        if (a->safe && !b->safe)
            y = html_escape(r, y);
        else if (b->safe && !a->safe)
            x = html_escape(r, x);
        sb_t o = {0};
        rt__sb_put(&r->a, &o, x.p, x.n);
        rt__sb_put(&r->a, &o, y.p, y.n);
        value_t v = vstr(sb_str(&o));
        v.safe = a->safe || b->safe;
        return v;
    }
    if (op == OP_ADD && a->t == V_LIST && b->t == V_LIST && !a->u.l->gen && !b->u.l->gen &&
        a->u.l->tuple == b->u.l->tuple) {
        list_t *l = list_new(r, a->u.l->n + b->u.l->n);
        for (size_t i = 0; i < a->u.l->n; i++)
            list_push(r, l, a->u.l->v[i]);
        for (size_t i = 0; i < b->u.l->n; i++)
            list_push(r, l, b->u.l->v[i]);
        l->tuple = a->u.l->tuple && b->u.l->tuple;
        return vlist(l);
    }
    if (op == OP_MUL && ((a->t == V_STR && (b->t == V_INT || b->t == V_BOOL)) ||
                         (b->t == V_STR && (a->t == V_INT || a->t == V_BOOL)))) {
        const value_t *sv = a->t == V_STR ? a : b, *nv = a->t == V_STR ? b : a;
        int64_t k = num_i(nv);
        if (k > 0 && sv->u.s.n > 0 && (uint64_t)k > RT_TEMPLATE_MAX_OUTPUT / sv->u.s.n)
            rfail(r, RT_ELIMIT, "string repetition exceeds %u bytes", (unsigned)RT_TEMPLATE_MAX_OUTPUT);
        if (sv->u.s.n == 0) /* any count of nothing: no loop over a count the limit did not bound */
            k = 0;
        sb_t o = {0};
        for (int64_t i = 0; i < k; i++)
            rt__sb_put(&r->a, &o, sv->u.s.p, sv->u.s.n);
        return vstr(sb_str(&o));
    }
    if (op == OP_MUL && ((a->t == V_LIST && (b->t == V_INT || b->t == V_BOOL)) ||
                         (b->t == V_LIST && (a->t == V_INT || a->t == V_BOOL)))) {
        const value_t *lv = a->t == V_LIST ? a : b, *nv = a->t == V_LIST ? b : a;
        int64_t k = num_i(nv);
        if (lv->u.l->gen)
            RFAIL(r, "unsupported operand type(s) for *: '%s' and 'int'", type_name(lv));
        if (k > 0 && lv->u.l->n > 0 && (uint64_t)k > (uint64_t)RT_TEMPLATE_MAX_RANGE / lv->u.l->n)
            rfail(r, RT_ELIMIT, "list repetition exceeds %d items", RT_TEMPLATE_MAX_RANGE);
        if (lv->u.l->n == 0) /* an empty list times any count: empty, without counting */
            k = 0;
        list_t *l = list_new(r, 0);
        l->tuple = lv->u.l->tuple;
        for (int64_t i = 0; i < k; i++)
            for (size_t j = 0; j < lv->u.l->n; j++)
                list_push(r, l, lv->u.l->v[j]);
        return vlist(l);
    }
    static const char *const names[] = {"+", "-", "*", "/", "//", "%", "**"};
    RFAIL(r, "unsupported operand type(s) for %s: '%s' and '%s'", names[op], type_name(a),
          type_name(b));
    return vnone();
}

// ---------------------------------------------------------------------------
// String helpers (Python str methods)

static const value_t *want_str(rs_t *r, const value_t *v, const char *what)
{
    if (!v || v->t != V_STR) {
        if (v && v->t == V_UNDEF)
            undef_fail(r, v);
        RFAIL(r, "%s must be a string, not %s", what, v ? type_name(v) : "nothing");
    }
    return v;
}

static int64_t want_int(rs_t *r, const value_t *v, const char *what)
{
    if (!v || (v->t != V_INT && v->t != V_BOOL))
        RFAIL(r, "%s must be an integer, not %s", what, v ? type_name(v) : "nothing");
    return num_i(v);
}

static bool cp_in(int32_t c, str_t set)
{
    size_t i = 0;
    while (i < set.n)
        if (u8_next(set.p, set.n, &i) == c)
            return true;
    return false;
}

/* strip/lstrip/rstrip: chars NULL means Python whitespace. */
static str_t str_strip(str_t s, const str_t *chars, bool left, bool right)
{
    size_t a = 0, b = s.n;
    if (left) {
        while (a < b) {
            size_t i = a;
            int32_t c = u8_next(s.p, s.n, &i);
            if (chars ? !cp_in(c, *chars) : !py_space(c))
                break;
            a = i;
        }
    }
    if (right) {
        while (b > a) {
            size_t st = b - 1;
            while (st > a && ((unsigned char)s.p[st] & 0xc0) == 0x80)
                st--;
            size_t i = st;
            int32_t c = u8_next(s.p, s.n, &i);
            if (chars ? !cp_in(c, *chars) : !py_space(c))
                break;
            b = st;
        }
    }
    return (str_t){s.p + a, b - a};
}

static list_t *str_split(rs_t *r, str_t s, const value_t *sepv, int64_t maxsplit, bool from_right)
{
    list_t *l = list_new(r, 0);
    if (sepv && sepv->t != V_NONE) {
        str_t sep = want_str(r, sepv, "separator")->u.s;
        if (!sep.n)
            RFAIL(r, "empty separator");
        if (!from_right) {
            size_t i = 0;
            while (maxsplit < 0 || (int64_t)l->n < maxsplit) {
                const char *f = memmem(s.p + i, s.n - i, sep.p, sep.n);
                if (!f)
                    break;
                list_push(r, l, vstr((str_t){s.p + i, (size_t)(f - s.p) - i}));
                i = (size_t)(f - s.p) + sep.n;
            }
            list_push(r, l, vstr((str_t){s.p + i, s.n - i}));
            return l;
        }
        /* rsplit: collect from the right, then reverse */
        size_t end = s.n;
        while (maxsplit < 0 || (int64_t)l->n < maxsplit) {
            size_t k = end;
            bool found = false;
            while (k >= sep.n) {
                if (memcmp(s.p + k - sep.n, sep.p, sep.n) == 0) {
                    found = true;
                    break;
                }
                k--;
            }
            if (!found)
                break;
            list_push(r, l, vstr((str_t){s.p + k, end - k}));
            end = k - sep.n;
        }
        list_push(r, l, vstr((str_t){s.p, end}));
        for (size_t i = 0; i < l->n / 2; i++) {
            value_t t = l->v[i];
            l->v[i] = l->v[l->n - 1 - i];
            l->v[l->n - 1 - i] = t;
        }
        return l;
    }
    /* whitespace split: runs of whitespace separate, ends are dropped */
    if (!from_right) {
        size_t i = 0;
        for (;;) {
            while (i < s.n) {
                size_t j = i;
                if (!py_space(u8_next(s.p, s.n, &j)))
                    break;
                i = j;
            }
            if (i >= s.n)
                break;
            if (maxsplit >= 0 && (int64_t)l->n >= maxsplit) {
                list_push(r, l, vstr((str_t){s.p + i, s.n - i}));
                break;
            }
            size_t st = i;
            while (i < s.n) {
                size_t j = i;
                if (py_space(u8_next(s.p, s.n, &j)))
                    break;
                i = j;
            }
            list_push(r, l, vstr((str_t){s.p + st, i - st}));
        }
        return l;
    }
    /* rsplit on whitespace with a limit: split fully, then rejoin the head */
    list_t *all = str_split(r, s, NULL, -1, false);
    if (maxsplit < 0 || (int64_t)all->n <= maxsplit + 1)
        return all;
    size_t keep = all->n - (size_t)maxsplit;
    str_t lastk = all->v[keep - 1].u.s;
    list_push(r, l, vstr((str_t){s.p, (size_t)(lastk.p + lastk.n - s.p)}));
    for (size_t i = keep; i < all->n; i++)
        list_push(r, l, all->v[i]);
    return l;
}

enum casemode { CASE_UPPER, CASE_LOWER, CASE_TITLE, CASE_CAPITALIZE, CASE_SWAP };

static bool cased(int32_t c)
{
    utf8proc_category_t k = utf8proc_category(c);
    return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT;
}

static str_t str_case(rs_t *r, str_t s, int mode)
{
    sb_t b = {0};
    size_t i = 0;
    bool prev_cased = false, first = true;
    while (i < s.n) {
        int32_t c = u8_next(s.p, s.n, &i), o = c;
        switch (mode) {
        case CASE_UPPER: o = utf8proc_toupper(c); break;
        case CASE_LOWER: o = utf8proc_tolower(c); break;
        case CASE_TITLE:
            o = prev_cased ? utf8proc_tolower(c) : utf8proc_totitle(c);
            prev_cased = cased(c);
            break;
        case CASE_CAPITALIZE: o = first ? utf8proc_totitle(c) : utf8proc_tolower(c); break;
        case CASE_SWAP:
            o = utf8proc_category(c) == UTF8PROC_CATEGORY_LU ? utf8proc_tolower(c) : utf8proc_toupper(c);
            break;
        }
        first = false;
        rt__sb_put_cp(&r->a, &b, o);
    }
    return sb_str(&b);
}

static str_t str_replace(rs_t *r, str_t s, str_t old, str_t rep, int64_t count)
{
    sb_t b = {0};
    if (!old.n) { /* Python inserts rep around every character */
        size_t i = 0;
        int64_t k = 0;
        while (count < 0 || k < count) {
            rt__sb_put(&r->a, &b, rep.p, rep.n);
            k++;
            if (i >= s.n)
                break;
            size_t st = i;
            (void)u8_next(s.p, s.n, &i); /* only the span matters */
            rt__sb_put(&r->a, &b, s.p + st, i - st);
        }
        rt__sb_put(&r->a, &b, s.p + i, s.n - i);
        return sb_str(&b);
    }
    size_t i = 0;
    int64_t k = 0;
    while (count < 0 || k < count) {
        const char *f = memmem(s.p + i, s.n - i, old.p, old.n);
        if (!f)
            break;
        rt__sb_put(&r->a, &b, s.p + i, (size_t)(f - s.p) - i);
        rt__sb_put(&r->a, &b, rep.p, rep.n);
        i = (size_t)(f - s.p) + old.n;
        k++;
    }
    rt__sb_put(&r->a, &b, s.p + i, s.n - i);
    return sb_str(&b);
}

static int64_t cp_index(str_t s, size_t byte_off)
{
    size_t i = 0;
    int64_t k = 0;
    while (i < byte_off) {
        (void)u8_next(s.p, s.n, &i); /* only the count matters */
        k++;
    }
    return k;
}

/* str.format with automatic or explicit positional fields and keyword fields;
 * format specs and conversions are not supported. */
static str_t str_format(rs_t *r, str_t f, const callargs_t *c)
{
    sb_t b = {0};
    int autoi = 0;
    for (size_t i = 0; i < f.n; i++) {
        char ch = f.p[i];
        if (ch == '{' && i + 1 < f.n && f.p[i + 1] == '{') {
            rt__sb_putc(&r->a, &b, '{');
            i++;
        } else if (ch == '}' && i + 1 < f.n && f.p[i + 1] == '}') {
            rt__sb_putc(&r->a, &b, '}');
            i++;
        } else if (ch == '{') {
            const char *e = memchr(f.p + i, '}', f.n - i);
            if (!e)
                RFAIL(r, "format: single '{' encountered in format string");
            str_t field = {f.p + i + 1, (size_t)(e - f.p) - i - 1};
            if (memchr(field.p, ':', field.n) || memchr(field.p, '!', field.n))
                rfail(r, BL_ENOTSUP, "format: format specs are not supported");
            const value_t *v;
            if (!field.n) {
                v = arg(c, autoi++, NULL);
            } else if (isdigit((unsigned char)field.p[0])) {
                v = arg(c, atoi(field.p), NULL);
            } else {
                v = NULL;
                for (int k = 0; k < c->nkw; k++)
                    if (streq2(c->kwn[k], field))
                        v = &c->kwv[k];
            }
            if (!v)
                RFAIL(r, "format: replacement field {%.*s} has no argument", (int)field.n, field.p);
            v_str(r, &b, v, 0);
            i = (size_t)(e - f.p);
        } else if (ch == '}') {
            RFAIL(r, "format: single '}' encountered in format string");
        } else {
            rt__sb_putc(&r->a, &b, ch);
        }
    }
    return sb_str(&b);
}

static bool str_all(str_t s, int kind)
{
    if (!s.n)
        return false;
    size_t i = 0;
    bool any_cased = false;
    while (i < s.n) {
        int32_t c = u8_next(s.p, s.n, &i);
        utf8proc_category_t k = utf8proc_category(c);
        bool letter = k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
        bool digit = k == UTF8PROC_CATEGORY_ND;
        bool numeric = digit || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
        switch (kind) {
        case 'd': if (!digit) return false; break;
        case 'n': if (!numeric) return false; break;
        case 'a': if (!letter) return false; break;
        case 'A': if (!letter && !numeric) return false; break;
        case 's': if (!py_space(c)) return false; break;
        case 'l':
            if (k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LT) return false;
            if (k == UTF8PROC_CATEGORY_LL) any_cased = true;
            break;
        case 'u':
            if (k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT) return false;
            if (k == UTF8PROC_CATEGORY_LU) any_cased = true;
            break;
        }
    }
    return (kind == 'l' || kind == 'u') ? any_cased : true;
}

static bool affix_match(rs_t *r, str_t s, const value_t *pv, bool suffix)
{
    if (pv && pv->t == V_LIST) {
        for (size_t i = 0; i < pv->u.l->n; i++)
            if (affix_match(r, s, &pv->u.l->v[i], suffix))
                return true;
        return false;
    }
    str_t p = want_str(r, pv, suffix ? "endswith argument" : "startswith argument")->u.s;
    if (p.n > s.n)
        return false;
    return memcmp(suffix ? s.p + s.n - p.n : s.p, p.p, p.n) == 0;
}

static value_t call_str_method(rs_t *r, str_t name, str_t s, const callargs_t *c)
{
    const value_t *a0 = arg(c, 0, NULL), *a1 = arg(c, 1, NULL);
    if (streq(name, "startswith") || streq(name, "endswith")) {
        bool suffix = name.p[0] == 'e';
        if (a1) {
            size_t n;
            size_t *off = str_offsets(r, s, &n);
            int64_t st = want_int(r, a1, "start");
            if (st < 0) st += (int64_t)n;
            if (st < 0) st = 0;
            if (st > (int64_t)n) return vbool(false);
            s = (str_t){s.p + off[st], s.n - off[st]};
        }
        return vbool(affix_match(r, s, a0, suffix));
    }
    if (streq(name, "split") || streq(name, "rsplit")) {
        const value_t *sep = arg(c, 0, "sep"), *mx = arg(c, 1, "maxsplit");
        return vlist(str_split(r, s, sep, mx ? want_int(r, mx, "maxsplit") : -1, name.p[0] == 'r'));
    }
    if (streq(name, "strip") || streq(name, "lstrip") || streq(name, "rstrip")) {
        str_t chars;
        bool have = a0 && a0->t != V_NONE;
        if (have)
            chars = want_str(r, a0, "strip argument")->u.s;
        return vstr(str_strip(s, have ? &chars : NULL, name.p[0] != 'r', name.p[0] != 'l'));
    }
    if (streq(name, "upper")) return vstr(str_case(r, s, CASE_UPPER));
    if (streq(name, "lower")) return vstr(str_case(r, s, CASE_LOWER));
    if (streq(name, "title")) return vstr(str_case(r, s, CASE_TITLE));
    if (streq(name, "capitalize")) return vstr(str_case(r, s, CASE_CAPITALIZE));
    if (streq(name, "swapcase")) return vstr(str_case(r, s, CASE_SWAP));
    if (streq(name, "replace")) {
        const value_t *cnt = arg(c, 2, "count");
        return vstr(str_replace(r, s, want_str(r, a0, "replace argument")->u.s,
                                want_str(r, a1, "replace argument")->u.s,
                                cnt ? want_int(r, cnt, "count") : -1));
    }
    if (streq(name, "find") || streq(name, "rfind") || streq(name, "index") || streq(name, "count")) {
        str_t sub = want_str(r, a0, "substring")->u.s;
        if (streq(name, "count")) {
            if (!sub.n)
                return vint((int64_t)u8_len(s) + 1);
            int64_t k = 0;
            size_t i = 0;
            const char *f;
            while ((f = memmem(s.p + i, s.n - i, sub.p, sub.n))) {
                k++;
                i = (size_t)(f - s.p) + sub.n;
            }
            return vint(k);
        }
        const char *f = NULL;
        if (name.p[0] == 'r') {
            for (size_t k = s.n + 1; k-- > 0;)
                if (k + sub.n <= s.n && memcmp(s.p + k, sub.p, sub.n) == 0) {
                    f = s.p + k;
                    break;
                }
        } else {
            f = sub.n ? memmem(s.p, s.n, sub.p, sub.n) : s.p;
        }
        if (!f && name.p[0] == 'i')
            RFAIL(r, "substring not found");
        return vint(f ? cp_index(s, (size_t)(f - s.p)) : -1);
    }
    if (streq(name, "format"))
        return vstr(str_format(r, s, c));
    if (streq(name, "join")) {
        list_t *items = iter_items(r, a0 ? a0 : &(value_t){.t = V_UNDEF});
        sb_t b = {0};
        for (size_t i = 0; i < items->n; i++) {
            if (i)
                rt__sb_put(&r->a, &b, s.p, s.n);
            str_t x = want_str(r, &items->v[i], "join item")->u.s;
            rt__sb_put(&r->a, &b, x.p, x.n);
        }
        return vstr(sb_str(&b));
    }
    if (streq(name, "isdigit")) return vbool(str_all(s, 'd'));
    if (streq(name, "isnumeric")) return vbool(str_all(s, 'n'));
    if (streq(name, "isalpha")) return vbool(str_all(s, 'a'));
    if (streq(name, "isalnum")) return vbool(str_all(s, 'A'));
    if (streq(name, "isspace")) return vbool(str_all(s, 's'));
    if (streq(name, "islower")) return vbool(str_all(s, 'l'));
    if (streq(name, "isupper")) return vbool(str_all(s, 'u'));
    if (streq(name, "removeprefix") || streq(name, "removesuffix")) {
        str_t p = want_str(r, a0, "affix")->u.s;
        bool suf = name.p[6] == 's';
        if (p.n <= s.n && memcmp(suf ? s.p + s.n - p.n : s.p, p.p, p.n) == 0)
            return vstr(suf ? (str_t){s.p, s.n - p.n} : (str_t){s.p + p.n, s.n - p.n});
        return vstr(s);
    }
    if (streq(name, "splitlines")) {
        list_t *l = list_new(r, 0);
        size_t i = 0, st = 0;
        while (i < s.n) {
            if (s.p[i] == '\n' || s.p[i] == '\r') {
                list_push(r, l, vstr((str_t){s.p + st, i - st}));
                if (s.p[i] == '\r' && i + 1 < s.n && s.p[i + 1] == '\n')
                    i++;
                st = ++i;
            } else {
                i++;
            }
        }
        if (st < s.n)
            list_push(r, l, vstr((str_t){s.p + st, s.n - st}));
        return vlist(l);
    }
    RFAIL(r, "str has no method '%.*s'", (int)name.n, name.p);
    return vnone();
}

static value_t pair(rs_t *r, value_t a, value_t b)
{
    list_t *l = list_new(r, 2);
    l->tuple = true;
    list_push(r, l, a);
    list_push(r, l, b);
    return vlist(l);
}

static value_t call_method(rs_t *r, const func_t *fn, const callargs_t *c)
{
    const value_t *self = &fn->self;
    str_t name = fn->name;
    if (self->t == V_STR)
        return call_str_method(r, name, self->u.s, c);
    if (self->t == V_DICT) {
        const dict_t *d = self->u.d;
        if (streq(name, "get")) {
            const value_t *k = arg(c, 0, "key"), *def = arg(c, 1, "default");
            if (!k)
                RFAIL(r, "get expected at least 1 argument");
            value_t *v = dict_find(d, k);
            return v ? *v : def ? *def : vnone();
        }
        list_t *l = list_new(r, d->n);
        for (size_t i = 0; i < d->n; i++)
            list_push(r, l, streq(name, "keys") ? d->k[i] : streq(name, "values") ? d->v[i]
                             : pair(r, d->k[i], d->v[i]));
        l->gen = streq(name, "keys") ? GEN_KEYS : streq(name, "values") ? GEN_VALUES : GEN_ITEMS;
        if (streq(name, "copy")) {
            dict_t *nd = dict_new(r);
            for (size_t i = 0; i < d->n; i++)
                dict_set(r, nd, d->k[i], d->v[i]);
            return vdict(nd);
        }
        return vlist(l);
    }
    if (self->t == V_LIST) {
        const list_t *l = self->u.l;
        const value_t *x = arg(c, 0, NULL);
        if (streq(name, "copy")) {
            list_t *nl = list_new(r, l->n);
            for (size_t i = 0; i < l->n; i++)
                list_push(r, nl, l->v[i]);
            return vlist(nl);
        }
        if (!x)
            RFAIL(r, "%.*s expected an argument", (int)name.n, name.p);
        int64_t k = 0;
        for (size_t i = 0; i < l->n; i++)
            if (v_eq(&l->v[i], x, 0)) {
                if (streq(name, "index"))
                    return vint((int64_t)i);
                k++;
            }
        if (streq(name, "index"))
            RFAIL(r, "value is not in list");
        return vint(k);
    }
    RFAIL(r, "no method '%.*s'", (int)name.n, name.p);
    return vnone();
}

// ---------------------------------------------------------------------------
// Filters and tests

static value_t apply_filter(rs_t *r, int id, const value_t *v, const callargs_t *c);
static bool apply_test(rs_t *r, int id, const value_t *v, const callargs_t *c);

/* Jinja's attribute getter: "a.b.0" walks items and attributes. */
static value_t attr_path(rs_t *r, const value_t *v, str_t path)
{
    value_t cur = *v;
    size_t i = 0;
    while (i <= path.n) {
        const char *dot = memchr(path.p + i, '.', path.n - i);
        size_t e = dot ? (size_t)(dot - path.p) : path.n;
        str_t part = {path.p + i, e - i};
        bool digits = part.n > 0;
        for (size_t k = 0; k < part.n; k++)
            digits = digits && isdigit((unsigned char)part.p[k]);
        value_t key = digits ? vint(strtoll(part.p, NULL, 10)) : vstr(part);
        cur = get_item(r, &cur, &key);
        i = e + 1;
        if (!dot)
            break;
    }
    return cur;
}

static int64_t v_len(rs_t *r, const value_t *v)
{
    switch (v->t) {
    case V_UNDEF: return 0;
    case V_STR: return (int64_t)u8_len(v->u.s);
    case V_LIST: if (v->u.l->gen != GEN_GENERATOR) return (int64_t)v->u.l->n; break;
    case V_DICT: if (!v->u.d->ns) return (int64_t)v->u.d->n; break;
    case V_LOOP: return (int64_t)v->u.lp->n;
    default: break;
    }
    RFAIL(r, "object of type '%s' has no len()", type_name(v));
    return 0;
}

static value_t sort_key(rs_t *r, const value_t *v, bool case_sensitive, const value_t *attr)
{
    value_t k = attr && attr->t == V_STR ? attr_path(r, v, attr->u.s) : *v;
    if (!case_sensitive && k.t == V_STR)
        k = vstr(str_case(r, k.u.s, CASE_LOWER));
    return k;
}

/* Stable sort of items by keys: a merge sort, since the lists may be the client's
 * (messages, tools) and long. An item moves before an earlier one only when its key
 * is strictly smaller (larger with reverse), so equal keys keep their order, as in
 * Python's sorted() both ways. */
static void stable_sort(rs_t *r, value_t *items, value_t *keys, size_t n, bool reverse)
{
    if (n < 2)
        return;
    value_t *bi = rt__alloc(&r->a, n * sizeof *bi), *bk = rt__alloc(&r->a, n * sizeof *bk);
    value_t *si = items, *sk = keys; /* the runs of width w are in si/sk */
    for (size_t w = 1; w < n; w *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * w) {
            size_t mid = lo + w < n ? lo + w : n, hi = mid + w < n ? mid + w : n;
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) {
                int cm = v_cmp(r, &sk[j], &sk[i], "<");
                size_t from = (reverse ? cm > 0 : cm < 0) ? j++ : i++;
                bi[k] = si[from];
                bk[k++] = sk[from];
            }
            for (; i < mid; i++, k++)
                bi[k] = si[i], bk[k] = sk[i];
            for (; j < hi; j++, k++)
                bi[k] = si[j], bk[k] = sk[j];
        }
        value_t *t = si;
        si = bi, bi = t;
        t = sk;
        sk = bk, bk = t;
    }
    if (si != items) {
        memcpy(items, si, n * sizeof *items);
        memcpy(keys, sk, n * sizeof *keys);
    }
}

static bool opt_bool(const value_t *v, bool def)
{
    return v ? truthy(v) : def;
}

static value_t f_tojson(rs_t *r, const value_t *v, const callargs_t *c)
{
    const value_t *ea = arg(c, 0, "ensure_ascii"), *ind = arg(c, 1, "indent"),
                  *sep = arg(c, 2, "separators"), *sk = arg(c, 3, "sort_keys");
    jopts_t o = {0};
    o.ensure_ascii = opt_bool(ea, false);
    o.sort_keys = opt_bool(sk, false);
    if (ind && ind->t != V_NONE) {
        if (ind->t == V_STR) {
            o.indent = astr(&r->a, ind->u.s.p, ind->u.s.n).p;
        } else {
            int64_t k = want_int(r, ind, "indent");
            if (k > 64)
                k = 64;
            char *sp = rt__alloc(&r->a, (size_t)(k > 0 ? k : 0) + 1);
            memset(sp, ' ', (size_t)(k > 0 ? k : 0));
            sp[k > 0 ? k : 0] = 0;
            o.indent = sp;
        }
    }
    o.item_sep = o.indent ? (str_t){",", 1} : (str_t){", ", 2};
    o.key_sep = (str_t){": ", 2};
    if (sep && sep->t != V_NONE) {
        if (sep->t != V_LIST || sep->u.l->n != 2)
            RFAIL(r, "tojson: separators must be a pair of strings");
        o.item_sep = want_str(r, &sep->u.l->v[0], "separator")->u.s;
        o.key_sep = want_str(r, &sep->u.l->v[1], "separator")->u.s;
    }
    sb_t b = {0};
    json_val(r, &b, v, &o, 0);
    return vstr(sb_str(&b));
}

static value_t f_indent(rs_t *r, const value_t *v, const callargs_t *c)
{
    const value_t *w = arg(c, 0, "width"), *first = arg(c, 1, "first"), *blank = arg(c, 2, "blank");
    str_t ind;
    if (w && w->t == V_STR) {
        ind = w->u.s;
    } else {
        int64_t k = w ? want_int(r, w, "width") : 4;
        if (k < 0)
            k = 0;
        if (k > 4096)
            k = 4096;
        char *sp = rt__alloc(&r->a, (size_t)k + 1);
        memset(sp, ' ', (size_t)k);
        ind = (str_t){sp, (size_t)k};
    }
    if (v->t != V_STR) /* Jinja appends "\n" to the value itself */
        RFAIL(r, "indent: unsupported operand type(s) for +=: '%s' and 'str'", type_name(v));
    str_t s = v->u.s;
    /* lines as str.splitlines() of s + "\n" */
    list_t *lines = list_new(r, 0);
    size_t i = 0, st = 0;
    while (i < s.n) {
        if (s.p[i] == '\n' || s.p[i] == '\r') {
            list_push(r, lines, vstr((str_t){s.p + st, i - st}));
            if (s.p[i] == '\r' && i + 1 < s.n && s.p[i + 1] == '\n')
                i++;
            st = ++i;
        } else {
            i++;
        }
    }
    list_push(r, lines, vstr((str_t){s.p + st, s.n - st}));
    sb_t b = {0};
    if (opt_bool(first, false))
        rt__sb_put(&r->a, &b, ind.p, ind.n);
    for (size_t k = 0; k < lines->n; k++) {
        str_t ln = lines->v[k].u.s;
        if (k) {
            rt__sb_putc(&r->a, &b, '\n');
            if (ln.n || opt_bool(blank, false))
                rt__sb_put(&r->a, &b, ind.p, ind.n);
        }
        rt__sb_put(&r->a, &b, ln.p, ln.n);
    }
    return vstr(sb_str(&b));
}

static value_t f_select(rs_t *r, int id, const value_t *v, const callargs_t *c)
{
    bool by_attr = id == F_SELECTATTR || id == F_REJECTATTR;
    bool want = id == F_SELECT || id == F_SELECTATTR;
    if (!truthy(v)) /* Jinja skips a falsy input (None, empty) without iterating */
        return vgen(list_new(r, 0));
    list_t *items = iter_items(r, v), *out = list_new(r, 0);
    int first_test = by_attr ? 1 : 0;
    const value_t *attr = by_attr ? arg(c, 0, NULL) : NULL;
    if (by_attr && (!attr || attr->t != V_STR))
        RFAIL(r, "%s needs an attribute name", rt__filter_names[id]);
    const value_t *tn = arg(c, first_test, NULL);
    int tid = -1;
    callargs_t tc = {0};
    if (tn) {
        tid = rt__lookup_name(rt__test_names, X_COUNT_, want_str(r, tn, "test name")->u.s);
        if (tid < 0)
            RFAIL(r, "no test named '%.*s'", (int)tn->u.s.n, tn->u.s.p);
        tc.pos = c->pos + first_test + 1;
        tc.npos = c->npos - first_test - 1;
    }
    for (size_t i = 0; i < items->n; i++) {
        value_t x = by_attr ? attr_path(r, &items->v[i], attr->u.s) : items->v[i];
        bool ok = tid >= 0 ? apply_test(r, tid, &x, &tc) : truthy(&x);
        if (ok == want)
            list_push(r, out, items->v[i]);
    }
    return vgen(out);
}

static value_t f_map(rs_t *r, const value_t *v, const callargs_t *c)
{
    if (!truthy(v))
        return vgen(list_new(r, 0));
    list_t *items = iter_items(r, v), *out = list_new(r, items->n);
    const value_t *attr = arg(c, -1, "attribute");
    if (attr) {
        const value_t *def = arg(c, -1, "default");
        for (size_t i = 0; i < items->n; i++) {
            value_t x = attr_path(r, &items->v[i], want_str(r, attr, "attribute")->u.s);
            list_push(r, out, x.t == V_UNDEF && def ? *def : x);
        }
        return vgen(out);
    }
    const value_t *fnm = arg(c, 0, NULL);
    if (!fnm)
        return vgen(items);
    int fid = rt__lookup_name(rt__filter_names, F_COUNT_, want_str(r, fnm, "filter name")->u.s);
    if (fid < 0)
        RFAIL(r, "no filter named '%.*s'", (int)fnm->u.s.n, fnm->u.s.p);
    callargs_t fc = *c;
    fc.pos++;
    fc.npos--;
    for (size_t i = 0; i < items->n; i++)
        list_push(r, out, apply_filter(r, fid, &items->v[i], &fc));
    return vgen(out);
}

static value_t f_minmax(rs_t *r, const value_t *v, const callargs_t *c, bool max)
{
    list_t *items = iter_items(r, v);
    if (!items->n)
        return vundef("no min/max item, sequence was empty");
    bool cs = opt_bool(arg(c, 0, "case_sensitive"), false);
    const value_t *attr = arg(c, 1, "attribute");
    size_t best = 0;
    value_t bk = sort_key(r, &items->v[0], cs, attr);
    for (size_t i = 1; i < items->n; i++) {
        value_t k = sort_key(r, &items->v[i], cs, attr);
        int cm = v_cmp(r, &k, &bk, "<");
        if (max ? cm > 0 : cm < 0) {
            best = i;
            bk = k;
        }
    }
    return items->v[best];
}

static value_t to_int_val(rs_t *r, const value_t *v, const value_t *def)
{
    switch (v->t) {
    case V_INT: return *v;
    case V_BOOL: return vint(v->u.b);
    case V_FLOAT:
        if (isfinite(v->u.f) && fabs(v->u.f) < 9.2e18)
            return vint((int64_t)v->u.f);
        break;
    case V_STR: {
        str_t s = str_strip(v->u.s, NULL, true, true);
        char buf[64];
        if (s.n && s.n < sizeof buf) {
            size_t m = 0;
            for (size_t i = 0; i < s.n; i++)
                if (s.p[i] != '_')
                    buf[m++] = s.p[i];
            buf[m] = 0;
            char *end;
            errno = 0;
            long long k = strtoll(buf, &end, 10);
            if (!*end && !errno)
                return vint(k);
            double d = strtod(buf, &end);
            if (!*end && isfinite(d) && fabs(d) < 9.2e18)
                return vint((int64_t)d);
        }
        break;
    }
    default:
        break;
    }
    return def ? *def : vint(0);
}

static value_t apply_filter(rs_t *r, int id, const value_t *v, const callargs_t *c)
{
    const value_t *a0 = arg(c, 0, NULL);
    switch (id) {
    case F_DEFAULT:
    case F_D: {
        const value_t *def = arg(c, 0, "default_value");
        bool boolean = opt_bool(arg(c, 1, "boolean"), false);
        if (v->t == V_UNDEF || (boolean && !truthy(v)))
            return def ? *def : vcstr("");
        return *v;
    }
    case F_LENGTH:
    case F_COUNT:
        return vint(v_len(r, v));
    case F_TOJSON:
        return f_tojson(r, v, c);
    case F_TRIM: {
        const value_t *ch = arg(c, 0, "chars");
        str_t chars;
        bool have = ch && ch->t != V_NONE;
        if (have)
            chars = want_str(r, ch, "chars")->u.s;
        value_t o = vstr(str_strip(to_str(r, v), have ? &chars : NULL, true, true));
        o.safe = v->safe;
        return o;
    }
    case F_UPPER: return vstr(str_case(r, to_str(r, v), CASE_UPPER));
    case F_LOWER: return vstr(str_case(r, to_str(r, v), CASE_LOWER));
    case F_CAPITALIZE: return vstr(str_case(r, to_str(r, v), CASE_CAPITALIZE));
    case F_TITLE: {
        /* Jinja: words start after whitespace, '-', and opening brackets */
        str_t s = to_str(r, v);
        sb_t b = {0};
        size_t i = 0;
        bool start = true;
        while (i < s.n) {
            int32_t ch = u8_next(s.p, s.n, &i);
            bool sep = py_space(ch) || ch == '-' || ch == '(' || ch == '{' || ch == '[' || ch == '<';
            rt__sb_put_cp(&r->a, &b, sep ? ch : start ? utf8proc_toupper(ch) : utf8proc_tolower(ch));
            start = sep;
        }
        return vstr(sb_str(&b));
    }
    case F_REPLACE: {
        const value_t *cnt = arg(c, 2, "count");
        return vstr(str_replace(r, to_str(r, v), to_str(r, want_str(r, arg(c, 0, "old"), "old")),
                                to_str(r, want_str(r, arg(c, 1, "new"), "new")),
                                cnt && cnt->t != V_NONE ? want_int(r, cnt, "count") : -1));
    }
    case F_JOIN: {
        const value_t *d = arg(c, 0, "d"), *attr = arg(c, 1, "attribute");
        list_t *items = iter_items(r, v);
        str_t sep = d ? to_str(r, d) : (str_t){"", 0};
        sb_t b = {0};
        for (size_t i = 0; i < items->n; i++) {
            if (i)
                rt__sb_put(&r->a, &b, sep.p, sep.n);
            value_t x = attr ? attr_path(r, &items->v[i], to_str(r, attr)) : items->v[i];
            v_str(r, &b, &x, 0);
        }
        return vstr(sb_str(&b));
    }
    case F_ITEMS: {
        if (v->t == V_UNDEF)
            return vlist(list_new(r, 0));
        if (v->t != V_DICT || v->u.d->ns)
            RFAIL(r, "can only get item pairs from a mapping, not %s", type_name(v));
        list_t *l = list_new(r, v->u.d->n);
        for (size_t i = 0; i < v->u.d->n; i++)
            list_push(r, l, pair(r, v->u.d->k[i], v->u.d->v[i]));
        return vgen(l);
    }
    case F_LIST: {
        list_t *src = iter_items(r, v), *l = list_new(r, src->n);
        for (size_t i = 0; i < src->n; i++)
            list_push(r, l, src->v[i]);
        return vlist(l);
    }
    case F_STRING: {
        value_t o = vstr(to_str(r, v));
        o.safe = v->safe;
        return o;
    }
    case F_SAFE: {
        value_t o = vstr(to_str(r, v));
        o.safe = 1;
        return o;
    }
    case F_E:
    case F_ESCAPE:
    case F_FORCEESCAPE: {
        if (v->t == V_STR && v->safe && id != F_FORCEESCAPE)
            return *v;
        value_t o = vstr(html_escape(r, to_str(r, v)));
        o.safe = 1;
        return o;
    }
    case F_FIRST:
    case F_LAST: {
        list_t *items = iter_items(r, v);
        if (!items->n)
            return vundef("no first item, sequence was empty");
        return items->v[id == F_FIRST ? 0 : items->n - 1];
    }
    case F_INT:
        if (v->t == V_UNDEF) /* int(Undefined) fails before any default applies */
            undef_fail(r, v);
        return to_int_val(r, v, arg(c, 0, "default"));
    case F_FLOAT: {
        const value_t *def = arg(c, 0, "default");
        if (v->t == V_UNDEF)
            undef_fail(r, v);
        if (is_num(v))
            return vfloat(num_f(v));
        if (v->t == V_STR) {
            str_t s = str_strip(v->u.s, NULL, true, true);
            char buf[64];
            if (s.n && s.n < sizeof buf) {
                memcpy(buf, s.p, s.n);
                buf[s.n] = 0;
                char *end;
                double d = strtod(buf, &end);
                if (!*end)
                    return vfloat(d);
            }
        }
        return def ? *def : vfloat(0.0);
    }
    case F_ABS:
        if (v->t == V_INT) {
            if (v->u.i == INT64_MIN)
                RFAIL(r, "integer overflow");
            return vint(v->u.i < 0 ? -v->u.i : v->u.i);
        }
        if (v->t == V_BOOL)
            return vint(v->u.b);
        if (v->t == V_FLOAT)
            return vfloat(fabs(v->u.f));
        RFAIL(r, "bad operand type for abs(): '%s'", type_name(v));
        return vnone();
    case F_ROUND: {
        const value_t *pr = arg(c, 0, "precision"), *me = arg(c, 1, "method");
        int64_t p = pr ? want_int(r, pr, "precision") : 0;
        if (!is_num(v))
            RFAIL(r, "round: '%s' is not a number", type_name(v));
        double x = num_f(v), m = pow(10.0, (double)p);
        str_t method = me ? want_str(r, me, "method")->u.s : (str_t){"common", 6};
        if (streq(method, "common")) {
            if (v->t == V_FLOAT && p >= 0) {
                /* Python rounds the exact binary value half to even, as printf
                 * does; past 1e17 or 30 digits a double has nothing to round */
                if (p > 30 || !isfinite(x) || fabs(x) >= 1e17)
                    return vfloat(x);
                char buf[96];
                snprintf(buf, sizeof buf, "%.*f", (int)p, x);
                return vfloat(strtod(buf, NULL));
            }
            double y = x * m, fl = floor(y), d = y - fl;
            double rr = d > 0.5 ? fl + 1 : d < 0.5 ? fl : (fmod(fl, 2.0) == 0 ? fl : fl + 1);
            return v->t == V_FLOAT ? vfloat(rr / m) : vint((int64_t)(rr / m));
        }
        if (streq(method, "ceil"))
            return vfloat(ceil(x * m) / m);
        if (streq(method, "floor"))
            return vfloat(floor(x * m) / m);
        RFAIL(r, "round: method must be common, ceil or floor");
        return vnone();
    }
    case F_REVERSE: {
        if (v->t == V_STR) {
            size_t n;
            size_t *off = str_offsets(r, v->u.s, &n);
            sb_t b = {0};
            for (size_t i = n; i-- > 0;)
                rt__sb_put(&r->a, &b, v->u.s.p + off[i], off[i + 1] - off[i]);
            return vstr(sb_str(&b));
        }
        list_t *src = iter_items(r, v), *l = list_new(r, src->n);
        for (size_t i = src->n; i-- > 0;)
            list_push(r, l, src->v[i]);
        return vgen(l);
    }
    case F_UNIQUE: {
        bool cs = opt_bool(arg(c, 0, "case_sensitive"), false);
        const value_t *attr = arg(c, 1, "attribute");
        list_t *src = iter_items(r, v), *l = list_new(r, 0), *seen = list_new(r, 0);
        for (size_t i = 0; i < src->n; i++) {
            value_t k = sort_key(r, &src->v[i], cs, attr);
            if ((k.t == V_LIST && !k.u.l->tuple) || k.t == V_DICT) /* Python keeps a set */
                RFAIL(r, "unhashable type: '%s'", type_name(&k));
            value_t sv = vlist(seen);
            if (!v_in(r, &k, &sv)) {
                list_push(r, seen, k);
                list_push(r, l, src->v[i]);
            }
        }
        return vgen(l);
    }
    case F_SORT: {
        bool rev = opt_bool(arg(c, 0, "reverse"), false), cs = opt_bool(arg(c, 1, "case_sensitive"), false);
        const value_t *attr = arg(c, 2, "attribute");
        list_t *src = iter_items(r, v), *l = list_new(r, src->n);
        value_t *keys = rt__alloc(&r->a, (src->n + 1) * sizeof *keys);
        for (size_t i = 0; i < src->n; i++) {
            list_push(r, l, src->v[i]);
            keys[i] = sort_key(r, &src->v[i], cs, attr);
        }
        stable_sort(r, l->v, keys, l->n, rev);
        return vlist(l);
    }
    case F_DICTSORT: {
        bool cs = opt_bool(arg(c, 0, "case_sensitive"), false);
        const value_t *by = arg(c, 1, "by");
        bool rev = opt_bool(arg(c, 2, "reverse"), false);
        if (v->t != V_DICT || v->u.d->ns)
            RFAIL(r, "dictsort: '%s' is not a mapping", type_name(v));
        bool by_value = by && by->t == V_STR && streq(by->u.s, "value");
        size_t n = v->u.d->n;
        list_t *l = list_new(r, n);
        value_t *keys = rt__alloc(&r->a, (n + 1) * sizeof *keys);
        for (size_t i = 0; i < n; i++) {
            list_push(r, l, pair(r, v->u.d->k[i], v->u.d->v[i]));
            keys[i] = sort_key(r, by_value ? &v->u.d->v[i] : &v->u.d->k[i], cs, NULL);
        }
        stable_sort(r, l->v, keys, n, rev);
        return vlist(l);
    }
    case F_INDENT:
        return f_indent(r, v, c);
    case F_WORDCOUNT: {
        str_t s = to_str(r, v);
        int64_t k = 0;
        bool in = false;
        size_t i = 0;
        while (i < s.n) {
            int32_t ch = u8_next(s.p, s.n, &i);
            utf8proc_category_t cat = utf8proc_category(ch);
            bool w = ch == '_' || (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_NO);
            if (w && !in)
                k++;
            in = w;
        }
        return vint(k);
    }
    case F_MAP:
        return f_map(r, v, c);
    case F_SELECT:
    case F_REJECT:
    case F_SELECTATTR:
    case F_REJECTATTR:
        return f_select(r, id, v, c);
    case F_ATTR:
        return get_attr(r, v, want_str(r, a0, "attribute name")->u.s);
    case F_MIN:
    case F_MAX:
        return f_minmax(r, v, c, id == F_MAX);
    case F_SUM: {
        const value_t *attr = arg(c, 0, "attribute"), *start = arg(c, 1, "start");
        list_t *items = iter_items(r, v);
        value_t acc = start ? *start : vint(0);
        for (size_t i = 0; i < items->n; i++) {
            value_t x = attr ? attr_path(r, &items->v[i], to_str(r, attr)) : items->v[i];
            acc = binop(r, OP_ADD, &acc, &x);
        }
        return acc;
    }
    case F_CENTER: {
        const value_t *w = arg(c, 0, "width");
        int64_t width = w ? want_int(r, w, "width") : 80;
        str_t s = to_str(r, v);
        int64_t n = (int64_t)u8_len(s);
        if (width > 4096)
            width = 4096;
        if (n >= width)
            return vstr(s);
        int64_t pad = width - n, left = pad / 2 + (pad & width & 1);
        sb_t b = {0};
        for (int64_t i = 0; i < left; i++)
            rt__sb_putc(&r->a, &b, ' ');
        rt__sb_put(&r->a, &b, s.p, s.n);
        for (int64_t i = 0; i < pad - left; i++)
            rt__sb_putc(&r->a, &b, ' ');
        return vstr(sb_str(&b));
    }
    case F_FORMAT: {
        list_t *t = list_new(r, (size_t)c->npos);
        t->tuple = true;
        for (int i = 0; i < c->npos; i++)
            list_push(r, t, c->pos[i]);
        value_t tv = vlist(t);
        return vstr(percent_format(r, to_str(r, v), &tv));
    }
    case F_BATCH: {
        int64_t size = want_int(r, arg(c, 0, "linecount"), "linecount");
        const value_t *fill = arg(c, 1, "fill_with");
        if (size <= 0)
            RFAIL(r, "batch: linecount must be positive");
        list_t *items = iter_items(r, v), *out = list_new(r, 0), *cur = NULL;
        for (size_t i = 0; i < items->n; i++) {
            if (!cur || (int64_t)cur->n == size) {
                cur = list_new(r, 0);
                list_push(r, out, vlist(cur));
            }
            list_push(r, cur, items->v[i]);
        }
        while (fill && cur && (int64_t)cur->n < size)
            list_push(r, cur, *fill);
        return vgen(out);
    }
    default:
        rfail(r, BL_ENOTSUP, "filter '%s' is not supported", rt__filter_names[id < F_COUNT_ ? id : 0]);
    }
}

static bool apply_test(rs_t *r, int id, const value_t *v, const callargs_t *c)
{
    const value_t *a0 = arg(c, 0, NULL);
    switch (id) {
    case X_DEFINED: return v->t != V_UNDEF;
    case X_UNDEFINED: return v->t == V_UNDEF;
    case X_NONE: return v->t == V_NONE;
    case X_STRING: return v->t == V_STR;
    case X_NUMBER: return is_num(v);
    case X_INTEGER: return v->t == V_INT;
    case X_FLOAT: return v->t == V_FLOAT;
    case X_BOOLEAN: return v->t == V_BOOL;
    case X_TRUE: return v->t == V_BOOL && v->u.b;
    case X_FALSE: return v->t == V_BOOL && !v->u.b;
    case X_MAPPING: return v->t == V_DICT && !v->u.d->ns;
    case X_ITERABLE:
        return v->t == V_UNDEF || v->t == V_STR || v->t == V_LIST || v->t == V_LOOP ||
               (v->t == V_DICT && !v->u.d->ns);
    case X_SEQUENCE:
        return v->t == V_UNDEF || v->t == V_STR || (v->t == V_LIST && !v->u.l->gen) || (v->t == V_DICT && !v->u.d->ns);
    case X_CALLABLE: return v->t == V_FUNC || v->t == V_UNDEF;
    case X_ESCAPED: return v->t == V_STR && v->safe;
    case X_FILTER: return v->t == V_STR && rt__lookup_name(rt__filter_names, F_COUNT_, v->u.s) >= 0;
    case X_TEST: return v->t == V_STR && rt__lookup_name(rt__test_names, X_COUNT_, v->u.s) >= 0;
    case X_LOWER: {
        str_t s = to_str(r, v);
        return str_all(s, 'l');
    }
    case X_UPPER: {
        str_t s = to_str(r, v);
        return str_all(s, 'u');
    }
    case X_ODD:
    case X_EVEN:
    case X_DIVISIBLEBY: {
        if (!is_num(v))
            RFAIL(r, "test '%s' needs a number, not %s", rt__test_names[id], type_name(v));
        value_t d = id == X_DIVISIBLEBY ? (a0 ? *a0 : vnone()) : vint(2);
        value_t m = binop(r, OP_MOD, v, &d);
        value_t want = vint(id == X_ODD ? 1 : 0);
        return v_eq(&m, &want, 0);
    }
    default:
        break;
    }
    if (!a0)
        RFAIL(r, "test '%s' needs an argument", rt__test_names[id]);
    switch (id) {
    case X_EQ: case X_EQUALTO: return v_eq(v, a0, 0);
    case X_NE: return !v_eq(v, a0, 0);
    case X_LT: case X_LESSTHAN: return v_cmp(r, v, a0, "<") < 0;
    case X_LE: return v_cmp(r, v, a0, "<=") <= 0;
    case X_GT: case X_GREATERTHAN: return v_cmp(r, v, a0, ">") > 0;
    case X_GE: return v_cmp(r, v, a0, ">=") >= 0;
    case X_IN: return v_in(r, v, a0);
    case X_SAMEAS:
        if (v->t != a0->t)
            return false;
        switch (v->t) {
        case V_LIST: return v->u.l == a0->u.l;
        case V_DICT: return v->u.d == a0->u.d;
        case V_FUNC: return v->u.fn == a0->u.fn;
        case V_STR: return v->u.s.p == a0->u.s.p && v->u.s.n == a0->u.s.n;
        default: return v_eq(v, a0, 0);
        }
    default:
        break;
    }
    rfail(r, BL_ENOTSUP, "test '%s' is not supported", rt__test_names[id]);
    return false;
}

// ---------------------------------------------------------------------------
// Calls

static value_t call_builtin(rs_t *r, str_t name, const callargs_t *c)
{
    if (streq(name, "range")) {
        int64_t a = 0, b, step = 1;
        if (c->npos == 1) {
            b = want_int(r, &c->pos[0], "range argument");
        } else if (c->npos == 2 || c->npos == 3) {
            a = want_int(r, &c->pos[0], "range argument");
            b = want_int(r, &c->pos[1], "range argument");
            if (c->npos == 3)
                step = want_int(r, &c->pos[2], "range argument");
        } else {
            RFAIL(r, "range expected 1 to 3 arguments, got %d", c->npos);
            return vnone();
        }
        if (step == 0)
            RFAIL(r, "range() arg 3 must not be zero");
        list_t *l = list_new(r, 0);
        for (int64_t i = a; step > 0 ? i < b : i > b; i += step) {
            if (l->n >= RT_TEMPLATE_MAX_RANGE)
                rfail(r, RT_ELIMIT, "range() produces more than %d items", RT_TEMPLATE_MAX_RANGE);
            list_push(r, l, vint(i));
        }
        return vlist(l);
    }
    if (streq(name, "namespace") || streq(name, "dict")) {
        dict_t *d = dict_new(r);
        d->ns = name.p[0] == 'n';
        for (int i = 0; i < c->npos; i++) {
            if (c->pos[i].t != V_DICT)
                RFAIL(r, "%.*s: positional argument must be a mapping", (int)name.n, name.p);
            for (size_t k = 0; k < c->pos[i].u.d->n; k++)
                dict_set(r, d, c->pos[i].u.d->k[k], c->pos[i].u.d->v[k]);
        }
        for (int i = 0; i < c->nkw; i++)
            dict_set(r, d, vstr(c->kwn[i]), c->kwv[i]);
        return vdict(d);
    }
    if (streq(name, "raise_exception")) {
        const value_t *m = arg(c, 0, "message");
        str_t s = m ? to_str(r, m) : (str_t){"", 0};
        rfail(r, RT_ERAISED, "%.*s", (int)(s.n < 300 ? s.n : 300), s.p);
    }
    if (streq(name, "strftime_now")) {
        str_t f = want_str(r, arg(c, 0, "format"), "strftime format")->u.s;
        char fmt[256], out[512];
        if (f.n >= sizeof fmt)
            RFAIL(r, "strftime_now: format too long");
        memcpy(fmt, f.p, f.n);
        fmt[f.n] = 0;
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        size_t k = strftime(out, sizeof out, fmt, &tm);
        return vstr(astr(&r->a, out, k));
    }
    RFAIL(r, "unknown function '%.*s'", (int)name.n, name.p);
    return vnone();
}

static value_t call_macro(rs_t *r, const func_t *fn, const callargs_t *c, value_t *caller)
{
    const node_t *m = fn->node;
    if (++r->calls > RT_TEMPLATE_MAX_CALLS)
        rfail(r, RT_ELIMIT, "macro calls nested deeper than %d (runaway recursion?)",
              RT_TEMPLATE_MAX_CALLS);
    scope_t *s = scope_new(r, r->root);
    bool *used = rt__alloc(&r->a, (size_t)c->nkw + 1);
    memset(used, 0, (size_t)c->nkw + 1);
    for (int i = 0; i < m->nnames; i++) {
        value_t v;
        bool have = false;
        if (i < c->npos) {
            v = c->pos[i];
            have = true;
        }
        for (int k = 0; k < c->nkw; k++)
            if (streq2(c->kwn[k], m->names[i])) {
                if (have)
                    RFAIL(r, "macro '%.*s' got multiple values for argument '%.*s'", (int)m->name.n,
                          m->name.p, (int)m->names[i].n, m->names[i].p);
                v = c->kwv[k];
                have = used[k] = true;
            }
        if (!have)
            v = m->defs[i] ? eval(r, m->defs[i], s)
                           : vundef(fmt_msg(r, "parameter '%.*s' was not provided", (int)m->names[i].n,
                                            m->names[i].p));
        scope_set(r, s, m->names[i], v);
    }
    list_t *varargs = list_new(r, 0);
    varargs->tuple = true;
    for (int i = m->nnames; i < c->npos; i++)
        list_push(r, varargs, c->pos[i]);
    dict_t *kwargs = dict_new(r);
    for (int k = 0; k < c->nkw; k++)
        if (!used[k])
            dict_set(r, kwargs, vstr(c->kwn[k]), c->kwv[k]);
    scope_set(r, s, (str_t){"varargs", 7}, vlist(varargs));
    scope_set(r, s, (str_t){"kwargs", 6}, vdict(kwargs));
    if (caller)
        scope_set(r, s, (str_t){"caller", 6}, *caller);
    sb_t out = {0};
    const node_t *saved = r->at;
    (void)exec_body(r, m->body, m->nbody, s, &out); /* break/continue cannot leave a macro */
    r->at = saved;
    r->calls--;
    return vstr(sb_str(&out));
}

static value_t call_value(rs_t *r, const value_t *f, const callargs_t *c, value_t *caller)
{
    if (f->t == V_UNDEF)
        undef_fail(r, f);
    if (f->t != V_FUNC)
        RFAIL(r, "'%s' object is not callable", type_name(f));
    const func_t *fn = f->u.fn;
    switch (fn->kind) {
    case FN_BUILTIN: return call_builtin(r, fn->name, c);
    case FN_METHOD: return call_method(r, fn, c);
    case FN_MACRO: return call_macro(r, fn, c, caller);
    case FN_LOOPCYCLE:
        if (!c->npos)
            RFAIL(r, "no items for cycling given");
        return c->pos[fn->self.u.lp->i % (size_t)c->npos];
    case FN_CALLER: {
        const node_t *cb = fn->node;
        if (++r->calls > RT_TEMPLATE_MAX_CALLS)
            rfail(r, RT_ELIMIT, "macro calls nested deeper than %d", RT_TEMPLATE_MAX_CALLS);
        scope_t *s = scope_new(r, fn->scope);
        for (int i = 0; i < cb->nnames; i++)
            scope_set(r, s, cb->names[i],
                      i < c->npos ? c->pos[i] : cb->defs[i] ? eval(r, cb->defs[i], s) : vundef("missing caller argument"));
        sb_t out = {0};
        (void)exec_body(r, cb->body, cb->nbody, s, &out); /* no loop to leave */
        r->calls--;
        return vstr(sb_str(&out));
    }
    }
    return vnone();
}

// ---------------------------------------------------------------------------
// Expressions

/* Whether Jinja's optimizer folds e into a constant at compile time. */
static bool is_const(const node_t *e)
{
    switch (e->kind) {
    case E_LIT: return true;
    case E_NEG: case E_POS: case E_NOT: return is_const(e->a);
    case E_BIN: return is_const(e->a) && is_const(e->b);
    default: return false;
    }
}

static value_t eval(rs_t *r, const node_t *e, scope_t *s)
{
    r->at = e;
    switch (e->kind) {
    case E_LIT:
        return e->lit;
    case E_NAME: {
        value_t *v = scope_find(s, e->name);
        if (v)
            return *v;
        return vundef(fmt_msg(r, "'%.*s' is undefined", (int)e->name.n, e->name.p));
    }
    case E_BLOCKVAL:
        return r->blockval;
    case E_ATTR: {
        value_t o = eval(r, e->a, s);
        r->at = e;
        return get_attr(r, &o, e->name);
    }
    case E_ITEM: {
        value_t o = eval(r, e->a, s), k = eval(r, e->b, s);
        r->at = e;
        return get_item(r, &o, &k);
    }
    case E_SLICE: {
        value_t o = eval(r, e->a, s), a, b, c;
        if (e->b) a = eval(r, e->b, s);
        if (e->c) b = eval(r, e->c, s);
        if (e->args.pos[0]) c = eval(r, e->args.pos[0], s);
        r->at = e;
        return get_slice(r, &o, e->b ? &a : NULL, e->c ? &b : NULL, e->args.pos[0] ? &c : NULL);
    }
    case E_CALL: {
        value_t f = eval(r, e->a, s);
        callargs_t c;
        eval_args(r, &e->args, s, &c);
        r->at = e;
        return call_value(r, &f, &c, NULL);
    }
    case E_FILTER: {
        value_t v = eval(r, e->a, s);
        callargs_t c;
        eval_args(r, &e->args, s, &c);
        r->at = e;
        if (e->op < 0)
            RFAIL(r, "no filter named '%.*s' found", (int)e->name.n, e->name.p);
        return apply_filter(r, e->op, &v, &c);
    }
    case E_TEST: {
        value_t v = eval(r, e->a, s);
        callargs_t c;
        eval_args(r, &e->args, s, &c);
        r->at = e;
        if (e->op < 0)
            RFAIL(r, "no test named '%.*s' found", (int)e->name.n, e->name.p);
        return vbool(apply_test(r, e->op, &v, &c) != e->neg);
    }
    case E_BIN: {
        if (e->op == OP_POW && e->a->kind == E_NEG && e->a->a->kind == E_LIT &&
            is_num(&e->a->a->lit) && !is_const(e->b)) {
            /* Jinja folds `-3` into a constant and writes it unparenthesised
             * before a `**` it cannot fold, so Python reads -(3 ** y) */
            value_t a = e->a->a->lit, b = eval(r, e->b, s);
            r->at = e;
            value_t p = binop(r, OP_POW, &a, &b);
            return p.t == V_FLOAT ? vfloat(-p.u.f) : vint(-num_i(&p));
        }
        value_t a = eval(r, e->a, s), b = eval(r, e->b, s);
        r->at = e;
        return binop(r, e->op, &a, &b);
    }
    case E_NEG:
    case E_POS: {
        value_t a = eval(r, e->a, s);
        r->at = e;
        if (a.t == V_UNDEF)
            undef_fail(r, &a);
        if (!is_num(&a))
            RFAIL(r, "bad operand type for unary %c: '%s'", e->kind == E_NEG ? '-' : '+', type_name(&a));
        if (e->kind == E_POS)
            return a.t == V_BOOL ? vint(a.u.b) : a;
        if (a.t == V_FLOAT)
            return vfloat(-a.u.f);
        if (num_i(&a) == INT64_MIN)
            RFAIL(r, "integer overflow");
        return vint(-num_i(&a));
    }
    case E_NOT: {
        value_t a = eval(r, e->a, s);
        return vbool(!truthy(&a));
    }
    case E_AND: {
        value_t a = eval(r, e->a, s);
        return truthy(&a) ? eval(r, e->b, s) : a;
    }
    case E_OR: {
        value_t a = eval(r, e->a, s);
        return truthy(&a) ? a : eval(r, e->b, s);
    }
    case E_COND: {
        value_t c = eval(r, e->a, s);
        if (truthy(&c))
            return eval(r, e->b, s);
        return e->c ? eval(r, e->c, s) : vundef("the inline if expression had no else branch");
    }
    case E_CMP: {
        value_t a = eval(r, e->args.pos[0], s);
        for (int i = 1; i < e->args.npos; i++) {
            value_t b = eval(r, e->args.pos[i], s);
            r->at = e;
            bool ok;
            switch (e->ops[i - 1]) {
            case C_EQ: ok = v_eq(&a, &b, 0); break;
            case C_NE: ok = !v_eq(&a, &b, 0); break;
            case C_LT: ok = v_cmp(r, &a, &b, "<") < 0; break;
            case C_LE: ok = v_cmp(r, &a, &b, "<=") <= 0; break;
            case C_GT: ok = v_cmp(r, &a, &b, ">") > 0; break;
            case C_GE: ok = v_cmp(r, &a, &b, ">=") >= 0; break;
            case C_IN: ok = v_in(r, &a, &b); break;
            default: ok = !v_in(r, &a, &b); break;
            }
            if (!ok)
                return vbool(false);
            a = b;
        }
        return vbool(true);
    }
    case E_LIST:
    case E_TUPLE: {
        list_t *l = list_new(r, (size_t)e->args.npos);
        l->tuple = e->kind == E_TUPLE;
        for (int i = 0; i < e->args.npos; i++)
            list_push(r, l, eval(r, e->args.pos[i], s));
        return vlist(l);
    }
    case E_DICT: {
        dict_t *d = dict_new(r);
        for (int i = 0; i < e->args.npos; i++) {
            value_t k = eval(r, e->args.pos[i], s);
            value_t v = eval(r, e->args.kwv[i], s);
            dict_set(r, d, k, v);
        }
        return vdict(d);
    }
    case E_CONCAT: {
        sb_t b = {0};
        for (int i = 0; i < e->args.npos; i++) {
            value_t v = eval(r, e->args.pos[i], s);
            v_str(r, &b, &v, 0);
        }
        return vstr(sb_str(&b));
    }
    }
    RFAIL(r, "cannot evaluate node kind %d", e->kind);
    return vnone();
}

// ---------------------------------------------------------------------------
// Statements

enum { FLOW_NORMAL, FLOW_BREAK, FLOW_CONTINUE };

static void assign(rs_t *r, scope_t *s, const node_t *n, const value_t *v)
{
    if (n->nnames == 1) {
        scope_set(r, s, n->names[0], *v);
        return;
    }
    list_t *items = iter_items(r, v);
    if (items->n != (size_t)n->nnames)
        RFAIL(r, "cannot unpack %zu values into %d names", items->n, n->nnames);
    for (int i = 0; i < n->nnames; i++)
        scope_set(r, s, n->names[i], items->v[i]);
}

static int exec_for(rs_t *r, const node_t *n, scope_t *s, sb_t *out)
{
    value_t it = eval(r, n->a, s);
    r->at = n;
    list_t *items = iter_items(r, &it);
    if (n->b) { /* `for x in xs if cond`: filter first, so loop.length counts what is kept */
        list_t *kept = list_new(r, 0);
        for (size_t i = 0; i < items->n; i++) {
            step(r, 1);
            scope_t *fs = scope_new(r, s);
            assign(r, fs, n, &items->v[i]);
            value_t c = eval(r, n->b, fs);
            if (truthy(&c))
                list_push(r, kept, items->v[i]);
        }
        items = kept;
    }
    if (!items->n) /* the else branch sits outside the loop: its break leaves an outer one */
        return exec_body(r, n->alt, n->nalt, s, out);
    loopst_t *lp = rt__alloc(&r->a, sizeof *lp);
    lp->items = items->v;
    lp->n = items->n;
    value_t lv = {.t = V_LOOP};
    lv.u.lp = lp;
    for (size_t i = 0; i < items->n; i++) {
        step(r, 1);
        lp->i = i;
        /* a fresh scope per iteration: what the body sets does not outlive it */
        scope_t *is = scope_new(r, s);
        assign(r, is, n, &items->v[i]);
        scope_set(r, is, (str_t){"loop", 4}, lv);
        int fl = exec_body(r, n->body, n->nbody, is, out);
        if (fl == FLOW_BREAK)
            break;
    }
    return FLOW_NORMAL;
}

static int exec_body(rs_t *r, node_t *const *body, int nb, scope_t *s, sb_t *out)
{
    for (int i = 0; i < nb; i++) {
        const node_t *n = body[i];
        r->at = n;
        step(r, 1);
        switch (n->kind) {
        case S_TEXT:
            rt__sb_put(&r->a, out, n->lit.u.s.p, n->lit.u.s.n);
            break;
        case S_OUT: {
            value_t v = eval(r, n->a, s);
            v_str(r, out, &v, 0);
            break;
        }
        case S_IF: {
            value_t c = eval(r, n->a, s);
            int fl = truthy(&c) ? exec_body(r, n->body, n->nbody, s, out)
                                : exec_body(r, n->alt, n->nalt, s, out);
            if (fl != FLOW_NORMAL)
                return fl;
            break;
        }
        case S_FOR: {
            int fl = exec_for(r, n, s, out);
            if (fl != FLOW_NORMAL)
                return fl;
            break;
        }
        case S_SET: {
            value_t v = eval(r, n->a, s);
            r->at = n;
            assign(r, s, n, &v);
            break;
        }
        case S_SETATTR: {
            value_t v = eval(r, n->a, s);
            value_t *ns = scope_find(s, n->name);
            r->at = n;
            if (!ns || ns->t != V_DICT || !ns->u.d->ns)
                RFAIL(r, "cannot assign attribute on non-namespace object '%.*s'", (int)n->name.n, n->name.p);
            dict_set(r, ns->u.d, vstr(n->name2), v);
            break;
        }
        case S_SETBLOCK: {
            sb_t b = {0};
            (void)exec_body(r, n->body, n->nbody, s, &b); /* set blocks hold no loop controls of their own */
            value_t v = vstr(sb_str(&b));
            if (n->a) {
                value_t saved = r->blockval;
                r->blockval = v;
                v = eval(r, n->a, s);
                r->blockval = saved;
            }
            scope_set(r, s, n->name, v);
            break;
        }
        case S_WITH: {
            /* values are computed in the enclosing scope, then bound in a new one */
            scope_t *ws = scope_new(r, s);
            value_t *vals = rt__alloc(&r->a, (size_t)(n->nnames + 1) * sizeof *vals);
            for (int k = 0; k < n->nnames; k++)
                vals[k] = eval(r, n->args.pos[k], s);
            for (int k = 0; k < n->nnames; k++)
                scope_set(r, ws, n->names[k], vals[k]);
            int fl = exec_body(r, n->body, n->nbody, ws, out);
            if (fl != FLOW_NORMAL)
                return fl;
            break;
        }
        case S_MACRO: {
            value_t f = vfunc(r, FN_MACRO, n->name);
            f.u.fn->node = n;
            scope_set(r, s, n->name, f);
            break;
        }
        case S_CALLBLOCK: {
            const node_t *call = n->a;
            value_t f = eval(r, call->a, s);
            callargs_t c;
            eval_args(r, &call->args, s, &c);
            value_t cf = vfunc(r, FN_CALLER, (str_t){"caller", 6});
            cf.u.fn->node = n;
            cf.u.fn->scope = s;
            r->at = n;
            if (f.t != V_FUNC || f.u.fn->kind != FN_MACRO)
                RFAIL(r, "'call' needs a macro");
            value_t v = call_macro(r, f.u.fn, &c, &cf);
            rt__sb_put(&r->a, out, v.u.s.p, v.u.s.n);
            break;
        }
        case S_FILTERBLOCK: {
            sb_t b = {0};
            (void)exec_body(r, n->body, n->nbody, s, &b); /* no loop controls escape a filter block */
            value_t saved = r->blockval;
            r->blockval = vstr(sb_str(&b));
            value_t v = eval(r, n->a, s);
            r->blockval = saved;
            v_str(r, out, &v, 0);
            break;
        }
        case S_BREAK:
            return FLOW_BREAK;
        case S_CONTINUE:
            return FLOW_CONTINUE;
        default:
            RFAIL(r, "cannot execute node kind %d", n->kind);
        }
    }
    return FLOW_NORMAL;
}

// ---------------------------------------------------------------------------
// Entry points

static value_t from_json(rs_t *r, const json_t *j, int depth)
{
    if (depth > RT_TEMPLATE_MAX_DATA_DEPTH)
        rt__fail_raise(&r->f, RT_ELIMIT, "context nested deeper than %d", RT_TEMPLATE_MAX_DATA_DEPTH);
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        dict_t *d = dict_new(r);
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)j, k, v) {
            if (d->n == d->cap) {
                size_t nc = d->cap ? d->cap * 2 : 4;
                d->k = rt__realloc(&r->a, d->k, d->cap * sizeof *d->k, nc * sizeof *d->k);
                d->v = rt__realloc(&r->a, d->v, d->cap * sizeof *d->v, nc * sizeof *d->v);
                d->cap = nc;
            }
            /* JSON object keys are unique, so append without a lookup */
            d->k[d->n] = vcstr(k);
            d->v[d->n] = from_json(r, v, depth + 1);
            d->n++;
        }
        return vdict(d);
    }
    case JSON_ARRAY: {
        list_t *l = list_new(r, json_array_size(j));
        size_t i;
        json_t *v;
        json_array_foreach(j, i, v)
            list_push(r, l, from_json(r, v, depth + 1));
        return vlist(l);
    }
    case JSON_STRING:
        return vstr((str_t){json_string_value(j), json_string_length(j)});
    case JSON_INTEGER:
        return vint((int64_t)json_integer_value(j));
    case JSON_REAL:
        return vfloat(json_real_value(j));
    case JSON_TRUE:
        return vbool(true);
    case JSON_FALSE:
        return vbool(false);
    default:
        return vnone();
    }
}

int rt_template_compile(const char *text, size_t len, rt_template_t **out, bl_err_t *err)
{
    *out = NULL;
    if (!text && len)
        return bl_err_set(err, BL_EINVAL, "template text is NULL");
    if (len > RT_TEMPLATE_MAX_SOURCE)
        return bl_err_set(err, RT_ELIMIT, "template is %zu bytes, more than the limit of %u", len,
                          (unsigned)RT_TEMPLATE_MAX_SOURCE);
    rt_template_t *t = calloc(1, sizeof *t);
    fail_t *f = calloc(1, sizeof *f);
    if (!t || !f) {
        free(t);
        free(f);
        return bl_err_set(err, BL_ENOMEM, "out of memory compiling a template");
    }
    bl_err_t local;
    f->err = err ? err : &local;
    t->fail = f;
    t->arena.limit = RT_TEMPLATE_MAX_MEMORY;
    t->arena.fail = f;
    if (setjmp(f->jb)) {
        int code = f->err->code;
        arena_free(&t->arena);
        free(f);
        free(t);
        return code;
    }
    /* Jinja normalises newlines to \n and drops one trailing newline. */
    char *src = rt__alloc(&t->arena, len + 1);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (text[i] == '\r') {
            src[n++] = '\n';
            if (i + 1 < len && text[i + 1] == '\n')
                i++;
        } else {
            src[n++] = text[i];
        }
    }
    if (n && src[n - 1] == '\n')
        n--;
    src[n] = 0;
    t->body = rt__parse(&t->arena, f, src, n, &t->nbody);
    f->err = NULL;
    *out = t;
    return 0;
}

static const char *const builtin_names[] = {"range", "namespace", "dict", "raise_exception",
                                            "strftime_now", NULL};

int rt_template_render(const rt_template_t *tpl, const json_t *context, char **out,
                       size_t *out_len, bl_err_t *err)
{
    *out = NULL;
    if (out_len)
        *out_len = 0;
    if (!tpl)
        return bl_err_set(err, BL_EINVAL, "template is NULL");
    if (context && !json_is_object(context))
        return bl_err_set(err, BL_EINVAL, "template context must be a JSON object");
    rs_t *r = calloc(1, sizeof *r);
    if (!r)
        return bl_err_set(err, BL_ENOMEM, "out of memory starting a render");
    bl_err_t local;
    r->f.err = err ? err : &local;
    r->a.limit = RT_TEMPLATE_MAX_MEMORY;
    r->a.fail = &r->f;
    if (setjmp(r->f.jb)) {
        int code = r->f.err->code;
        /* limits met deep in the arena or a buffer know no position: add it */
        if (r->at && strncmp(r->f.err->msg, "template line", 13) != 0) {
            char tmp[sizeof r->f.err->msg];
            snprintf(tmp, sizeof tmp, "template line %d:%d: %.400s", r->at->line, r->at->col,
                     r->f.err->msg);
            memcpy(r->f.err->msg, tmp, sizeof tmp);
        }
        arena_free(&r->a);
        free(r);
        return code;
    }
    scope_t *builtins = scope_new(r, NULL);
    for (int i = 0; builtin_names[i]; i++) {
        str_t nm = {builtin_names[i], strlen(builtin_names[i])};
        scope_set(r, builtins, nm, vfunc(r, FN_BUILTIN, nm));
    }
    r->globals = scope_new(r, builtins);
    if (context) {
        value_t cv = from_json(r, context, 0);
        for (size_t i = 0; i < cv.u.d->n; i++)
            scope_set(r, r->globals, cv.u.d->k[i].u.s, cv.u.d->v[i]);
    }
    r->root = scope_new(r, r->globals);
    sb_t o = {0};
    (void)exec_body(r, tpl->body, tpl->nbody, r->root, &o); /* the parser allows no top-level break */
    char *res = malloc(o.n + 1);
    if (!res) {
        arena_free(&r->a);
        free(r);
        return bl_err_set(err, BL_ENOMEM, "out of memory copying %zu rendered bytes", o.n);
    }
    if (o.n)
        memcpy(res, o.p, o.n);
    res[o.n] = 0;
    *out = res;
    if (out_len)
        *out_len = o.n;
    arena_free(&r->a);
    free(r);
    return 0;
}

void rt_template_destroy(rt_template_t *tpl)
{
    if (!tpl)
        return;
    arena_free(&tpl->arena);
    free(tpl->fail);
    free(tpl);
}

const char *rt_template_strerror(int code)
{
    switch (code) {
    case RT_ESYNTAX: return "template syntax error";
    case RT_ERENDER: return "template render error";
    case RT_ERAISED: return "template raised an exception";
    case RT_ELIMIT: return "template limit reached";
    }
    return bl_strerror(code);
}
