/* Chat-template lexer and parser: turns template text into the syntax tree that
 * template.c renders. Hugging Face's whitespace settings (trim_blocks,
 * lstrip_blocks) are applied while lexing; errors unwind through fail_t. */
#include "template_impl.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---------------------------------------------------------------------------
// Lexer

enum tt { T_EOF, T_TEXT, T_VBEGIN, T_VEND, T_BBEGIN, T_BEND, T_NAME, T_STR, T_INT, T_FLOAT, T_OP };

typedef struct tok {
    uint8_t t;
    int line, col;
    str_t s;
    int64_t i;
    double f;
} tok_t;

typedef struct parser {
    arena_t *a;
    fail_t *f;
    const char *src;
    size_t len;
    tok_t *toks;
    size_t ntoks, cap, pos;
    int depth;
    int loops; /* enclosing for loops in the current macro, for break/continue */
} parser_t;

static _Noreturn void perr(parser_t *p, int line, int col, const char *fmt, ...) BL_PRINTF(4, 5);
static _Noreturn void perr(parser_t *p, int line, int col, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    rt__fail_raise(p->f, RT_ESYNTAX, "template line %d:%d: %s", line, col, msg);
}

static tok_t *push_tok(parser_t *p, int t, int line, int col)
{
    if (p->ntoks == p->cap) {
        size_t nc = p->cap ? p->cap * 2 : 256;
        p->toks = rt__realloc(p->a, p->toks, p->cap * sizeof *p->toks, nc * sizeof *p->toks);
        p->cap = nc;
    }
    tok_t *k = &p->toks[p->ntoks++];
    memset(k, 0, sizeof *k);
    k->t = (uint8_t)t;
    k->line = line;
    k->col = col;
    return k;
}

typedef struct lexpos {
    size_t i;
    int line;
    size_t line_start;
} lexpos_t;

static void lx_adv(const char *s, lexpos_t *L, size_t to)
{
    for (; L->i < to; L->i++)
        if (s[L->i] == '\n') {
            L->line++;
            L->line_start = L->i + 1;
        }
}

static int lx_col(const lexpos_t *L)
{
    return (int)(L->i - L->line_start) + 1;
}

static bool is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

/* Decodes a Python string literal body (the escapes Jinja accepts). */
static str_t decode_string(parser_t *p, const char *s, size_t n, int line, int col)
{
    sb_t b = {0};
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 >= n) {
            rt__sb_putc(p->a, &b, s[i]);
            continue;
        }
        char c = s[++i];
        switch (c) {
        case 'n': rt__sb_putc(p->a, &b, '\n'); break;
        case 't': rt__sb_putc(p->a, &b, '\t'); break;
        case 'r': rt__sb_putc(p->a, &b, '\r'); break;
        case '\\': rt__sb_putc(p->a, &b, '\\'); break;
        case '\'': rt__sb_putc(p->a, &b, '\''); break;
        case '"': rt__sb_putc(p->a, &b, '"'); break;
        case 'a': rt__sb_putc(p->a, &b, '\a'); break;
        case 'b': rt__sb_putc(p->a, &b, '\b'); break;
        case 'f': rt__sb_putc(p->a, &b, '\f'); break;
        case 'v': rt__sb_putc(p->a, &b, '\v'); break;
        case '\n': break; /* line continuation */
        case 'x': case 'u': case 'U': {
            int nd = c == 'x' ? 2 : c == 'u' ? 4 : 8;
            uint32_t cp = 0; /* eight hex digits may pass int32_t */
            for (int k = 0; k < nd; k++) {
                char h = i + 1 + (size_t)k < n ? s[i + 1 + (size_t)k] : 0;
                if (!isxdigit((unsigned char)h))
                    perr(p, line, col, "truncated \\%c escape in string literal", c);
                cp = cp * 16 + (uint32_t)(isdigit((unsigned char)h) ? h - '0' : (tolower(h) - 'a' + 10));
            }
            if (cp > 0x10FFFF) /* as Python: no such character */
                perr(p, line, col, "\\%c escape U+%X is past U+10FFFF in string literal", c, cp);
            i += (size_t)nd;
            rt__sb_put_cp(p->a, &b, (int32_t)cp);
            break;
        }
        default:
            if (c >= '0' && c <= '7') {
                int32_t cp = c - '0';
                for (int k = 0; k < 2 && i + 1 < n && s[i + 1] >= '0' && s[i + 1] <= '7'; k++)
                    cp = cp * 8 + (s[++i] - '0');
                rt__sb_put_cp(p->a, &b, cp);
            } else {
                rt__sb_putc(p->a, &b, '\\');
                rt__sb_putc(p->a, &b, c);
            }
        }
    }
    return b.p ? (str_t){b.p, b.n} : (str_t){"", 0};
}

static const char *const ops2[] = {"//", "**", "==", "!=", "<=", ">=", NULL};
static const char ops1[] = "+-/*%~<>=()[]{},.:|";

/* Lexes the inside of a {{ }} or {% %} tag starting at L->i, up to and
 * including its end marker and the whitespace that marker removes after it. */
static void lex_tag(parser_t *p, lexpos_t *L, bool block, int open_line, int open_col,
                    bool *line_starting)
{
    const char *s = p->src;
    size_t n = p->len;
    int depth = 0;
    for (;;) {
        while (L->i < n && is_ws(s[L->i]))
            lx_adv(s, L, L->i + 1);
        if (L->i >= n)
            perr(p, open_line, open_col, "unclosed '%s' tag: end of template reached",
                 block ? "{%" : "{{");
        size_t i = L->i;
        int line = L->line, col = lx_col(L);
        char e = block ? '%' : '}';
        bool strip = false, keep = false;
        size_t end = 0;
        if (s[i] == '-' && i + 2 < n && s[i + 1] == e && s[i + 2] == '}' && (block || !depth)) {
            strip = true;
            end = i + 3;
        } else if (block && s[i] == '+' && i + 2 < n && s[i + 1] == '%' && s[i + 2] == '}') {
            keep = true;
            end = i + 3;
        } else if (s[i] == e && i + 1 < n && s[i + 1] == '}' && (block || !depth)) {
            end = i + 2;
        }
        if (end) {
            push_tok(p, block ? T_BEND : T_VEND, line, col);
            lx_adv(s, L, end);
            if (strip) {
                size_t j = L->i;
                while (j < n && is_ws(s[j]))
                    j++;
                lx_adv(s, L, j);
            } else if (block && !keep && L->i < n && s[L->i] == '\n') {
                lx_adv(s, L, L->i + 1); /* trim_blocks */
            }
            *line_starting = L->i > 0 && s[L->i - 1] == '\n';
            return;
        }
        char c = s[i];
        if (isalpha((unsigned char)c) || c == '_') {
            size_t j = i;
            while (j < n && (isalnum((unsigned char)s[j]) || s[j] == '_'))
                j++;
            tok_t *k = push_tok(p, T_NAME, line, col);
            k->s = (str_t){s + i, j - i};
            lx_adv(s, L, j);
        } else if (isdigit((unsigned char)c)) {
            size_t j = i;
            bool fl = false;
            while (j < n && (isdigit((unsigned char)s[j]) || s[j] == '_'))
                j++;
            if (j + 1 < n && s[j] == '.' && isdigit((unsigned char)s[j + 1])) {
                fl = true;
                j++;
                while (j < n && (isdigit((unsigned char)s[j]) || s[j] == '_'))
                    j++;
            }
            if (j < n && (s[j] == 'e' || s[j] == 'E')) {
                size_t k2 = j + 1;
                if (k2 < n && (s[k2] == '+' || s[k2] == '-'))
                    k2++;
                if (k2 < n && isdigit((unsigned char)s[k2])) {
                    fl = true;
                    j = k2;
                    while (j < n && isdigit((unsigned char)s[j]))
                        j++;
                }
            }
            char buf[64];
            size_t m = 0;
            for (size_t q = i; q < j && m < sizeof buf - 1; q++)
                if (s[q] != '_')
                    buf[m++] = s[q];
            buf[m] = 0;
            tok_t *k = push_tok(p, fl ? T_FLOAT : T_INT, line, col);
            if (fl) {
                k->f = strtod(buf, NULL);
            } else {
                errno = 0;
                long long v = strtoll(buf, NULL, 10);
                if (errno)
                    perr(p, line, col, "integer literal %s is too large", buf);
                k->i = v;
            }
            lx_adv(s, L, j);
        } else if (c == '\'' || c == '"') {
            size_t j = i + 1;
            while (j < n && s[j] != c) {
                if (s[j] == '\\' && j + 1 < n)
                    j++;
                j++;
            }
            if (j >= n)
                perr(p, line, col, "unterminated string literal");
            tok_t *k = push_tok(p, T_STR, line, col);
            k->s = decode_string(p, s + i + 1, j - i - 1, line, col);
            lx_adv(s, L, j + 1);
        } else {
            size_t len = 0;
            for (int q = 0; ops2[q]; q++)
                if (i + 1 < n && s[i] == ops2[q][0] && s[i + 1] == ops2[q][1])
                    len = 2;
            if (!len && c && strchr(ops1, c))
                len = 1;
            if (!len)
                perr(p, line, col, "unexpected character '%c'", c);
            if (c == '(' || c == '[' || c == '{')
                depth++;
            else if ((c == ')' || c == ']' || c == '}') && depth > 0)
                depth--;
            tok_t *k = push_tok(p, T_OP, line, col);
            k->s = (str_t){s + i, len};
            lx_adv(s, L, i + len);
        }
    }
}

static void lex(parser_t *p)
{
    const char *s = p->src;
    size_t n = p->len;
    lexpos_t L = {0, 1, 0};
    bool line_starting = true;
    while (L.i < n) {
        size_t q = L.i;
        while (q + 1 < n && !(s[q] == '{' && (s[q + 1] == '{' || s[q + 1] == '%' || s[q + 1] == '#')))
            q++;
        if (q + 1 >= n)
            q = n;
        size_t tend = q;
        char kind = 0, sign = 0;
        if (q < n) {
            kind = s[q + 1];
            if (q + 2 < n && (s[q + 2] == '-' || (s[q + 2] == '+' && kind != '{')))
                sign = s[q + 2];
            if (sign == '-') {
                while (tend > L.i && is_ws(s[tend - 1]))
                    tend--;
            } else if (sign != '+' && kind != '{') {
                /* lstrip_blocks: drop the indentation before a block or comment
                 * tag that starts its line. */
                size_t l = tend;
                while (l > L.i && (s[l - 1] == ' ' || s[l - 1] == '\t'))
                    l--;
                if ((l > L.i && s[l - 1] == '\n') || (l == L.i && line_starting))
                    tend = l;
            }
        }
        if (tend > L.i) {
            tok_t *k = push_tok(p, T_TEXT, L.line, lx_col(&L));
            k->s = (str_t){s + L.i, tend - L.i};
        }
        lx_adv(s, &L, q);
        if (q >= n)
            break;
        int line = L.line, col = lx_col(&L);
        size_t body = q + 2 + (sign ? 1 : 0);
        if (kind == '#') {
            const char *e = NULL;
            for (size_t j = body; j + 1 < n; j++)
                if (s[j] == '#' && s[j + 1] == '}') {
                    e = s + j;
                    break;
                }
            if (!e)
                perr(p, line, col, "unclosed comment: end of template reached");
            size_t j = (size_t)(e - s) + 2;
            if (e > s + body && e[-1] == '-') {
                while (j < n && is_ws(s[j]))
                    j++;
            } else if (j < n && s[j] == '\n') {
                j++;
            }
            lx_adv(s, &L, j);
            line_starting = s[j - 1] == '\n';
            continue;
        }
        push_tok(p, kind == '%' ? T_BBEGIN : T_VBEGIN, line, col);
        lx_adv(s, &L, body);
        /* {% raw %}...{% endraw %} is copied as text without lexing. */
        if (kind == '%') {
            size_t j = L.i;
            while (j < n && is_ws(s[j]))
                j++;
            if (n - j >= 3 && memcmp(s + j, "raw", 3) == 0 &&
                (j + 3 >= n || !(isalnum((unsigned char)s[j + 3]) || s[j + 3] == '_'))) {
                p->ntoks--; /* drop the {% */
                size_t k = j + 3;
                while (k < n && is_ws(s[k]))
                    k++;
                bool st = k < n && s[k] == '-';
                if (st)
                    k++;
                if (k + 1 >= n || s[k] != '%' || s[k + 1] != '}')
                    perr(p, line, col, "malformed raw tag");
                k += 2;
                if (st)
                    while (k < n && is_ws(s[k]))
                        k++;
                else if (k < n && s[k] == '\n')
                    k++;
                size_t start = k, endtag = 0, after = 0;
                for (size_t m = k; m + 1 < n && !endtag; m++) {
                    if (s[m] != '{' || s[m + 1] != '%')
                        continue;
                    size_t r = m + 2;
                    bool minus = r < n && s[r] == '-';
                    if (minus || (r < n && s[r] == '+'))
                        r++;
                    while (r < n && is_ws(s[r]))
                        r++;
                    if (n - r >= 6 && memcmp(s + r, "endraw", 6) == 0) {
                        r += 6;
                        while (r < n && is_ws(s[r]))
                            r++;
                        bool m2 = r < n && s[r] == '-';
                        if (m2)
                            r++;
                        if (r + 1 < n && s[r] == '%' && s[r + 1] == '}') {
                            endtag = m;
                            after = r + 2;
                            if (minus)
                                while (endtag > start && is_ws(s[endtag - 1]))
                                    endtag--;
                            if (m2)
                                while (after < n && is_ws(s[after]))
                                    after++;
                            else if (after < n && s[after] == '\n')
                                after++;
                        }
                    }
                }
                if (!endtag)
                    perr(p, line, col, "unclosed raw block");
                if (endtag > start) {
                    tok_t *t = push_tok(p, T_TEXT, line, col);
                    t->s = (str_t){s + start, endtag - start};
                }
                lx_adv(s, &L, after);
                line_starting = s[after - 1] == '\n';
                continue;
            }
        }
        lex_tag(p, &L, kind == '%', line, col, &line_starting);
    }
    push_tok(p, T_EOF, L.line, lx_col(&L));
}

// ---------------------------------------------------------------------------
// Names of the filters and tests (indexed by enum filt and enum test). An
// unknown name is refused when the template compiles, except where Jinja defers
// it (see check_names).

const char *const rt__filter_names[] = {
    "abs", "attr", "capitalize", "count", "default", "d", "dictsort", "e", "escape",
    "first", "float", "indent", "int", "items", "join", "last", "length", "list",
    "lower", "map", "max", "min", "reject", "rejectattr", "replace", "reverse",
    "round", "safe", "select", "selectattr", "sort", "string", "sum", "title",
    "tojson", "trim", "unique", "upper", "wordcount", "center", "batch", "format",
    "forceescape", "filesizeformat", "groupby", "pprint", "random", "slice", "striptags",
    "truncate", "urlencode", "urlize", "wordwrap", "xmlattr",
};

const char *const rt__test_names[] = {
    "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "even", "false",
    "float", "ge", "gt", "greaterthan", "in", "integer", "iterable", "le", "lt",
    "lessthan", "lower", "mapping", "ne", "none", "number", "odd", "sameas",
    "sequence", "string", "true", "undefined", "upper", "escaped", "filter", "test",
};

_Static_assert(sizeof rt__filter_names / sizeof *rt__filter_names == F_COUNT_, "filter table");
_Static_assert(sizeof rt__test_names / sizeof *rt__test_names == X_COUNT_, "test table");

int rt__lookup_name(const char *const *tab, int n, str_t s)
{
    for (int i = 0; i < n; i++)
        if (streq(s, tab[i]))
            return i;
    return -1;
}

// ---------------------------------------------------------------------------
// Parser

typedef struct nvec {
    node_t **v;
    int n, cap;
} nvec_t;

static void nv_push(parser_t *p, nvec_t *v, node_t *x)
{
    if (v->n == v->cap) {
        int nc = v->cap ? v->cap * 2 : 4;
        v->v = rt__realloc(p->a, v->v, (size_t)v->cap * sizeof *v->v, (size_t)nc * sizeof *v->v);
        v->cap = nc;
    }
    v->v[v->n++] = x;
}

static tok_t *peek(parser_t *p)
{
    return &p->toks[p->pos];
}

static tok_t *peek2(parser_t *p)
{
    return p->pos + 1 < p->ntoks ? &p->toks[p->pos + 1] : &p->toks[p->ntoks - 1];
}

static tok_t *next(parser_t *p)
{
    tok_t *t = &p->toks[p->pos];
    if (t->t != T_EOF)
        p->pos++;
    return t;
}

static bool is_op(const tok_t *t, const char *op)
{
    return t->t == T_OP && streq(t->s, op);
}

static bool is_name(const tok_t *t, const char *nm)
{
    return t->t == T_NAME && streq(t->s, nm);
}

static bool accept_op(parser_t *p, const char *op)
{
    if (!is_op(peek(p), op))
        return false;
    next(p);
    return true;
}

static bool accept_name(parser_t *p, const char *nm)
{
    if (!is_name(peek(p), nm))
        return false;
    next(p);
    return true;
}

static const char *tokdesc(const tok_t *t, char *buf, size_t n)
{
    switch (t->t) {
    case T_EOF: return "end of template";
    case T_TEXT: return "template text";
    case T_VBEGIN: return "'{{'";
    case T_VEND: return "'}}'";
    case T_BBEGIN: return "'{%'";
    case T_BEND: return "'%}'";
    case T_STR: return "string literal";
    case T_INT: return "integer literal";
    case T_FLOAT: return "float literal";
    default:
        snprintf(buf, n, "'%.*s'", (int)(t->s.n < 40 ? t->s.n : 40), t->s.p);
        return buf;
    }
}

static _Noreturn void unexpected(parser_t *p, const tok_t *t, const char *wanted)
{
    char buf[64];
    perr(p, t->line, t->col, "expected %s, got %s", wanted, tokdesc(t, buf, sizeof buf));
}

static void expect_op(parser_t *p, const char *op)
{
    if (!accept_op(p, op)) {
        char w[16];
        snprintf(w, sizeof w, "'%s'", op);
        unexpected(p, peek(p), w);
    }
}

static str_t expect_name(parser_t *p)
{
    tok_t *t = peek(p);
    if (t->t != T_NAME)
        unexpected(p, t, "a name");
    next(p);
    return t->s;
}

static void expect_bend(parser_t *p)
{
    if (peek(p)->t != T_BEND)
        unexpected(p, peek(p), "end of tag '%}'");
    next(p);
}

static node_t *mk(parser_t *p, int kind, const tok_t *at)
{
    node_t *x = rt__alloc(p->a, sizeof *x);
    memset(x, 0, sizeof *x);
    x->kind = (uint8_t)kind;
    x->line = at->line;
    x->col = at->col;
    return x;
}

static void enter(parser_t *p)
{
    if (++p->depth > RT_TEMPLATE_MAX_NESTING)
        rt__fail_raise(p->f, RT_ELIMIT, "template line %d:%d: nesting deeper than %d",
                   peek(p)->line, peek(p)->col, RT_TEMPLATE_MAX_NESTING);
}

static node_t *p_expr(parser_t *p);
static node_t *p_or(parser_t *p);
static node_t *p_unary(parser_t *p, bool with_filter);

/* Call arguments after '(' up to and including ')'. */
static void p_args(parser_t *p, args_t *a)
{
    nvec_t pos = {0}, kwv = {0};
    str_t *kwn = NULL;
    int kcap = 0;
    while (!accept_op(p, ")")) {
        if (pos.n || kwv.n)
            if (!accept_op(p, ",") || accept_op(p, ")"))
                break;
        tok_t *t = peek(p);
        if (t->t == T_NAME && is_op(peek2(p), "=")) {
            next(p);
            next(p);
            if (kwv.n == kcap) {
                int nc = kcap ? kcap * 2 : 4;
                kwn = rt__realloc(p->a, kwn, (size_t)kcap * sizeof *kwn, (size_t)nc * sizeof *kwn);
                kcap = nc;
            }
            kwn[kwv.n] = t->s;
            nv_push(p, &kwv, p_expr(p));
        } else {
            if (kwv.n)
                perr(p, t->line, t->col, "positional argument follows keyword argument");
            nv_push(p, &pos, p_expr(p));
        }
    }
    if (p->toks[p->pos - 1].t != T_OP || !streq(p->toks[p->pos - 1].s, ")"))
        expect_op(p, ")");
    a->pos = pos.v;
    a->npos = pos.n;
    a->kwn = kwn;
    a->kwv = kwv.v;
    a->nkw = kwv.n;
}

static node_t *p_primary(parser_t *p)
{
    tok_t *t = next(p);
    node_t *x;
    switch (t->t) {
    case T_NAME:
        if (streq(t->s, "true") || streq(t->s, "True") || streq(t->s, "false") ||
            streq(t->s, "False")) {
            x = mk(p, E_LIT, t);
            x->lit.t = V_BOOL;
            x->lit.u.b = t->s.p[0] == 't' || t->s.p[0] == 'T';
        } else if (streq(t->s, "none") || streq(t->s, "None")) {
            x = mk(p, E_LIT, t);
            x->lit.t = V_NONE;
        } else {
            x = mk(p, E_NAME, t);
            x->name = t->s;
        }
        return x;
    case T_STR: {
        x = mk(p, E_LIT, t);
        x->lit.t = V_STR;
        x->lit.u.s = t->s;
        if (peek(p)->t == T_STR) { /* adjacent literals concatenate */
            sb_t b = {0};
            rt__sb_put(p->a, &b, t->s.p, t->s.n);
            while (peek(p)->t == T_STR) {
                tok_t *u = next(p);
                rt__sb_put(p->a, &b, u->s.p, u->s.n);
            }
            x->lit.u.s = sb_str(&b);
        }
        return x;
    }
    case T_INT:
        x = mk(p, E_LIT, t);
        x->lit.t = V_INT;
        x->lit.u.i = t->i;
        return x;
    case T_FLOAT:
        x = mk(p, E_LIT, t);
        x->lit.t = V_FLOAT;
        x->lit.u.f = t->f;
        return x;
    case T_OP:
        if (streq(t->s, "(")) {
            if (accept_op(p, ")")) {
                x = mk(p, E_TUPLE, t);
                return x;
            }
            node_t *e = p_expr(p);
            if (!is_op(peek(p), ",")) {
                expect_op(p, ")");
                return e;
            }
            nvec_t items = {0};
            nv_push(p, &items, e);
            while (accept_op(p, ",")) {
                if (is_op(peek(p), ")"))
                    break;
                nv_push(p, &items, p_expr(p));
            }
            expect_op(p, ")");
            x = mk(p, E_TUPLE, t);
            x->args.pos = items.v;
            x->args.npos = items.n;
            return x;
        }
        if (streq(t->s, "[")) {
            nvec_t items = {0};
            while (!is_op(peek(p), "]")) {
                if (items.n) {
                    expect_op(p, ",");
                    if (is_op(peek(p), "]"))
                        break;
                }
                nv_push(p, &items, p_expr(p));
            }
            expect_op(p, "]");
            x = mk(p, E_LIST, t);
            x->args.pos = items.v;
            x->args.npos = items.n;
            return x;
        }
        if (streq(t->s, "{")) {
            nvec_t keys = {0}, vals = {0};
            while (!is_op(peek(p), "}")) {
                if (keys.n) {
                    expect_op(p, ",");
                    if (is_op(peek(p), "}"))
                        break;
                }
                nv_push(p, &keys, p_expr(p));
                expect_op(p, ":");
                nv_push(p, &vals, p_expr(p));
            }
            expect_op(p, "}");
            x = mk(p, E_DICT, t);
            x->args.pos = keys.v;
            x->args.npos = keys.n;
            x->args.kwv = vals.v;
            x->args.nkw = vals.n;
            return x;
        }
        break;
    default:
        break;
    }
    unexpected(p, t, "an expression");
    return NULL;
}

/* Whether the subscript starting at the current token holds a top-level comma
 * before its closing bracket (a tuple index). */
static bool subscript_is_tuple(parser_t *p)
{
    int depth = 0;
    for (size_t i = p->pos; i < p->ntoks; i++) {
        const tok_t *t = &p->toks[i];
        if (t->t != T_OP) {
            if (t->t != T_NAME && t->t != T_STR && t->t != T_INT && t->t != T_FLOAT)
                return false;
            continue;
        }
        if (is_op(t, "(") || is_op(t, "[") || is_op(t, "{"))
            depth++;
        else if (is_op(t, ")") || is_op(t, "]") || is_op(t, "}")) {
            if (depth-- == 0)
                return false;
        } else if (depth == 0 && is_op(t, ","))
            return true;
        else if (depth == 0 && is_op(t, ":"))
            return false;
    }
    return false;
}

static node_t *p_postfix(parser_t *p, node_t *x)
{
    for (;;) {
        tok_t *t = peek(p);
        if (is_op(t, ".")) {
            next(p);
            tok_t *u = next(p);
            if (u->t == T_NAME) {
                node_t *y = mk(p, E_ATTR, t);
                y->a = x;
                y->name = u->s;
                x = y;
            } else if (u->t == T_INT) {
                node_t *y = mk(p, E_ITEM, t);
                y->a = x;
                y->b = mk(p, E_LIT, u);
                y->b->lit.t = V_INT;
                y->b->lit.u.i = u->i;
                x = y;
            } else {
                unexpected(p, u, "an attribute name");
            }
        } else if (is_op(t, "[")) {
            next(p);
            if (is_op(peek(p), "]") || (!is_op(peek(p), ":") && subscript_is_tuple(p))) {
                /* x[] and x[a, b] index with a tuple, as in Jinja */
                node_t *key = mk(p, E_TUPLE, t);
                nvec_t items = {0};
                while (!accept_op(p, "]")) {
                    if (items.n)
                        expect_op(p, ",");
                    if (accept_op(p, "]"))
                        break;
                    nv_push(p, &items, p_expr(p));
                }
                key->args.pos = items.v;
                key->args.npos = items.n;
                node_t *y = mk(p, E_ITEM, t);
                y->a = x;
                y->b = key;
                x = y;
                continue;
            }
            node_t *a = NULL, *b = NULL, *c = NULL;
            bool slice = false;
            if (!is_op(peek(p), ":"))
                a = p_expr(p);
            if (accept_op(p, ":")) {
                slice = true;
                if (!is_op(peek(p), "]") && !is_op(peek(p), ":"))
                    b = p_expr(p);
                if (accept_op(p, ":") && !is_op(peek(p), "]"))
                    c = p_expr(p);
            }
            expect_op(p, "]");
            node_t *y = mk(p, slice ? E_SLICE : E_ITEM, t);
            y->a = x;
            if (slice) {
                y->b = a;
                y->c = b;
                y->args.pos = rt__alloc(p->a, sizeof(node_t *));
                y->args.pos[0] = c;
            } else {
                y->b = a;
            }
            x = y;
        } else if (is_op(t, "(")) {
            next(p);
            node_t *y = mk(p, E_CALL, t);
            y->a = x;
            p_args(p, &y->args);
            x = y;
        } else {
            return x;
        }
    }
}

static node_t *p_filter(parser_t *p, node_t *x)
{
    tok_t *nt = peek(p);
    str_t name = expect_name(p);
    /* an unknown name is checked after parsing: Jinja allows it inside if
     * blocks and inline ifs, failing only when it runs */
    int id = rt__lookup_name(rt__filter_names, F_COUNT_, name);
    node_t *y = mk(p, E_FILTER, nt);
    y->a = x;
    y->name = name;
    y->op = id;
    if (accept_op(p, "("))
        p_args(p, &y->args);
    return y;
}

static node_t *p_filter_expr(parser_t *p, node_t *x)
{
    for (;;) {
        tok_t *t = peek(p);
        if (is_op(t, "|")) {
            next(p);
            x = p_filter(p, x);
        } else if (is_name(t, "is")) {
            next(p);
            bool neg = accept_name(p, "not");
            tok_t *nt = peek(p);
            str_t name = expect_name(p);
            int id = rt__lookup_name(rt__test_names, X_COUNT_, name);
            node_t *y = mk(p, E_TEST, nt);
            y->a = x;
            y->name = name;
            y->op = id;
            y->neg = neg;
            tok_t *u = peek(p);
            if (accept_op(p, "(")) {
                p_args(p, &y->args);
            } else if ((u->t == T_NAME || u->t == T_STR || u->t == T_INT || u->t == T_FLOAT ||
                        is_op(u, "[") || is_op(u, "{")) &&
                       !is_name(u, "else") && !is_name(u, "or") && !is_name(u, "and")) {
                node_t *arg = p_postfix(p, p_primary(p));
                y->args.pos = rt__alloc(p->a, sizeof(node_t *));
                y->args.pos[0] = arg;
                y->args.npos = 1;
            }
            x = y;
        } else if (is_op(t, "(")) {
            next(p);
            node_t *y = mk(p, E_CALL, t);
            y->a = x;
            p_args(p, &y->args);
            x = y;
        } else {
            return x;
        }
    }
}

static node_t *p_unary(parser_t *p, bool with_filter)
{
    enter(p);
    tok_t *t = peek(p);
    node_t *x;
    if (is_op(t, "-") || is_op(t, "+")) {
        next(p);
        x = mk(p, is_op(t, "-") ? E_NEG : E_POS, t);
        x->a = p_unary(p, false);
    } else {
        x = p_primary(p);
    }
    x = p_postfix(p, x);
    if (with_filter)
        x = p_filter_expr(p, x);
    p->depth--;
    return x;
}

static node_t *bin(parser_t *p, int op, node_t *l, node_t *r, tok_t *at)
{
    node_t *x = mk(p, E_BIN, at);
    x->op = op;
    x->a = l;
    x->b = r;
    return x;
}

static node_t *p_pow(parser_t *p)
{
    node_t *x = p_unary(p, true);
    while (is_op(peek(p), "**")) {
        tok_t *t = next(p);
        x = bin(p, OP_POW, x, p_unary(p, true), t);
    }
    return x;
}

static node_t *p_math2(parser_t *p)
{
    node_t *x = p_pow(p);
    for (;;) {
        tok_t *t = peek(p);
        int op = is_op(t, "*") ? OP_MUL : is_op(t, "/") ? OP_DIV : is_op(t, "//") ? OP_FDIV
                 : is_op(t, "%") ? OP_MOD : -1;
        if (op < 0)
            return x;
        next(p);
        x = bin(p, op, x, p_pow(p), t);
    }
}

static node_t *p_concat(parser_t *p)
{
    node_t *x = p_math2(p);
    if (!is_op(peek(p), "~"))
        return x;
    nvec_t parts = {0};
    nv_push(p, &parts, x);
    tok_t *t = peek(p);
    while (accept_op(p, "~"))
        nv_push(p, &parts, p_math2(p));
    node_t *y = mk(p, E_CONCAT, t);
    y->args.pos = parts.v;
    y->args.npos = parts.n;
    return y;
}

static node_t *p_math1(parser_t *p)
{
    node_t *x = p_concat(p);
    for (;;) {
        tok_t *t = peek(p);
        int op = is_op(t, "+") ? OP_ADD : is_op(t, "-") ? OP_SUB : -1;
        if (op < 0)
            return x;
        next(p);
        x = bin(p, op, x, p_concat(p), t);
    }
}

static node_t *p_compare(parser_t *p)
{
    node_t *x = p_math1(p);
    nvec_t operands = {0};
    int *ops = NULL, nops = 0;
    tok_t *at = peek(p);
    for (;;) {
        tok_t *t = peek(p);
        int op = is_op(t, "==") ? C_EQ : is_op(t, "!=") ? C_NE : is_op(t, "<") ? C_LT
                 : is_op(t, "<=") ? C_LE : is_op(t, ">") ? C_GT : is_op(t, ">=") ? C_GE
                 : is_name(t, "in") ? C_IN
                 : (is_name(t, "not") && is_name(peek2(p), "in")) ? C_NOTIN : -1;
        if (op < 0)
            break;
        next(p);
        if (op == C_NOTIN)
            next(p);
        if (!operands.n)
            nv_push(p, &operands, x);
        nv_push(p, &operands, p_math1(p));
        ops = rt__realloc(p->a, ops, (size_t)nops * sizeof *ops, (size_t)(nops + 1) * sizeof *ops);
        ops[nops++] = op;
    }
    if (!nops)
        return x;
    node_t *y = mk(p, E_CMP, at);
    y->args.pos = operands.v;
    y->args.npos = operands.n;
    y->ops = ops;
    return y;
}

static node_t *p_not(parser_t *p)
{
    tok_t *t = peek(p);
    if (is_name(t, "not")) {
        next(p);
        enter(p);
        node_t *x = mk(p, E_NOT, t);
        x->a = p_not(p);
        p->depth--;
        return x;
    }
    return p_compare(p);
}

static node_t *p_and(parser_t *p)
{
    node_t *x = p_not(p);
    while (is_name(peek(p), "and")) {
        tok_t *t = next(p);
        node_t *y = mk(p, E_AND, t);
        y->a = x;
        y->b = p_not(p);
        x = y;
    }
    return x;
}

static node_t *p_or(parser_t *p)
{
    node_t *x = p_and(p);
    while (is_name(peek(p), "or")) {
        tok_t *t = next(p);
        node_t *y = mk(p, E_OR, t);
        y->a = x;
        y->b = p_and(p);
        x = y;
    }
    return x;
}

static node_t *p_expr(parser_t *p)
{
    enter(p);
    node_t *x = p_or(p);
    while (is_name(peek(p), "if")) {
        tok_t *t = next(p);
        node_t *y = mk(p, E_COND, t);
        y->b = x;
        y->a = p_or(p);
        if (accept_name(p, "else"))
            y->c = p_expr(p);
        x = y;
    }
    p->depth--;
    return x;
}

/* An expression, or a bare tuple `a, b` (set values and output). */
static node_t *p_tuple(parser_t *p)
{
    tok_t *t = peek(p);
    node_t *x = p_expr(p);
    if (!is_op(peek(p), ","))
        return x;
    nvec_t items = {0};
    nv_push(p, &items, x);
    while (accept_op(p, ",")) {
        tok_t *u = peek(p);
        if (u->t == T_BEND || u->t == T_VEND)
            break;
        nv_push(p, &items, p_expr(p));
    }
    node_t *y = mk(p, E_TUPLE, t);
    y->args.pos = items.v;
    y->args.npos = items.n;
    return y;
}

// --- statements

static node_t **p_body(parser_t *p, const char *const *stops, int *nout, int *which,
                       const tok_t *opener, const char *what);

static const char *const end_tags[] = {"endif", "elif", "else", "endfor", "endset",
                                       "endmacro", "endcall", "endfilter", "endwith",
                                       "endgeneration", NULL};

static void p_names(parser_t *p, str_t **names, int *n)
{
    int cap = 0;
    *names = NULL;
    *n = 0;
    bool paren = accept_op(p, "(");
    do {
        if (paren && is_op(peek(p), ")"))
            break;
        str_t nm = expect_name(p);
        if (*n == cap) {
            int nc = cap ? cap * 2 : 2;
            *names = rt__realloc(p->a, *names, (size_t)cap * sizeof **names, (size_t)nc * sizeof **names);
            cap = nc;
        }
        (*names)[(*n)++] = nm;
    } while (accept_op(p, ","));
    if (paren)
        expect_op(p, ")");
}

static node_t *p_if(parser_t *p, tok_t *t)
{
    static const char *const stops[] = {"elif", "else", "endif", NULL};
    node_t *x = mk(p, S_IF, t);
    x->a = p_expr(p);
    expect_bend(p);
    int which;
    x->body = p_body(p, stops, &x->nbody, &which, t, "if");
    if (which == 0) { /* elif: the rest is an if nested in the else branch */
        tok_t *e = &p->toks[p->pos - 1];
        x->alt = rt__alloc(p->a, sizeof(node_t *));
        x->alt[0] = p_if(p, e);
        x->nalt = 1;
        return x;
    }
    if (which == 1) {
        static const char *const stops2[] = {"endif", NULL};
        expect_bend(p);
        x->alt = p_body(p, stops2, &x->nalt, &which, t, "if");
    }
    expect_bend(p);
    return x;
}

static node_t *p_stmt(parser_t *p)
{
    tok_t *t = peek(p);
    if (t->t != T_NAME)
        unexpected(p, t, "a tag name");
    next(p);
    int which;
    if (streq(t->s, "if"))
        return p_if(p, t);
    if (streq(t->s, "for")) {
        static const char *const stops[] = {"else", "endfor", NULL};
        static const char *const stops2[] = {"endfor", NULL};
        node_t *x = mk(p, S_FOR, t);
        p_names(p, &x->names, &x->nnames);
        if (!accept_name(p, "in"))
            unexpected(p, peek(p), "'in'");
        x->a = p_or(p);
        if (accept_name(p, "if"))
            x->b = p_expr(p);
        if (is_name(peek(p), "recursive"))
            perr(p, peek(p)->line, peek(p)->col, "recursive loops are not supported");
        expect_bend(p);
        p->loops++;
        x->body = p_body(p, stops, &x->nbody, &which, t, "for");
        p->loops--;
        if (which == 0) {
            expect_bend(p);
            x->alt = p_body(p, stops2, &x->nalt, &which, t, "for");
        }
        expect_bend(p);
        return x;
    }
    if (streq(t->s, "set")) {
        str_t name = expect_name(p);
        if (accept_op(p, ".")) {
            node_t *x = mk(p, S_SETATTR, t);
            x->name = name;
            x->name2 = expect_name(p);
            expect_op(p, "=");
            x->a = p_tuple(p);
            expect_bend(p);
            return x;
        }
        if (peek(p)->t == T_BEND || is_op(peek(p), "|")) {
            static const char *const stops[] = {"endset", NULL};
            node_t *x = mk(p, S_SETBLOCK, t);
            x->name = name;
            if (is_op(peek(p), "|")) { /* {% set x | filter %}: filters the body */
                node_t *f = mk(p, E_BLOCKVAL, t);
                while (accept_op(p, "|"))
                    f = p_filter(p, f);
                x->a = f;
            }
            expect_bend(p);
            x->body = p_body(p, stops, &x->nbody, &which, t, "set");
            expect_bend(p);
            return x;
        }
        node_t *x = mk(p, S_SET, t);
        p->pos--; /* reparse the target as a name list */
        p_names(p, &x->names, &x->nnames);
        expect_op(p, "=");
        x->a = p_tuple(p);
        expect_bend(p);
        return x;
    }
    if (streq(t->s, "macro") || streq(t->s, "call")) {
        bool is_call = streq(t->s, "call");
        node_t *x = mk(p, is_call ? S_CALLBLOCK : S_MACRO, t);
        if (!is_call)
            x->name = expect_name(p);
        bool params = true; /* a macro always has a parameter list, a call block may */
        if (is_call)
            params = accept_op(p, "(");
        else
            expect_op(p, "(");
        if (params) {
            nvec_t defs = {0};
            int cap = 0;
            while (!accept_op(p, ")")) {
                if (x->nnames)
                    expect_op(p, ",");
                if (accept_op(p, ")"))
                    break;
                str_t nm = expect_name(p);
                if (x->nnames == cap) {
                    int nc = cap ? cap * 2 : 4;
                    x->names = rt__realloc(p->a, x->names, (size_t)cap * sizeof(str_t), (size_t)nc * sizeof(str_t));
                    cap = nc;
                }
                x->names[x->nnames++] = nm;
                nv_push(p, &defs, accept_op(p, "=") ? p_expr(p) : NULL);
            }
            x->defs = defs.v;
        }
        if (is_call) {
            x->a = p_expr(p);
            if (x->a->kind != E_CALL)
                perr(p, t->line, t->col, "'call' needs a macro call");
        }
        expect_bend(p);
        int saved = p->loops;
        p->loops = 0;
        static const char *const ms[] = {"endmacro", NULL};
        static const char *const cs[] = {"endcall", NULL};
        x->body = p_body(p, is_call ? cs : ms, &x->nbody, &which, t, t->s.p[0] == 'm' ? "macro" : "call");
        p->loops = saved;
        if (!is_call && peek(p)->t == T_NAME)
            next(p); /* {% endmacro name %} */
        expect_bend(p);
        return x;
    }
    if (streq(t->s, "filter")) {
        static const char *const stops[] = {"endfilter", NULL};
        node_t *x = mk(p, S_FILTERBLOCK, t);
        node_t *base = mk(p, E_BLOCKVAL, t);
        node_t *f = p_filter(p, base);
        while (is_op(peek(p), "|")) {
            next(p);
            f = p_filter(p, f);
        }
        x->a = f;
        expect_bend(p);
        x->body = p_body(p, stops, &x->nbody, &which, t, "filter");
        expect_bend(p);
        return x;
    }
    if (streq(t->s, "with")) {
        static const char *const stops[] = {"endwith", NULL};
        node_t *x = mk(p, S_WITH, t);
        nvec_t vals = {0};
        int cap = 0;
        while (peek(p)->t != T_BEND) {
            if (x->nnames)
                expect_op(p, ",");
            str_t nm = expect_name(p);
            expect_op(p, "=");
            if (x->nnames == cap) {
                int nc = cap ? cap * 2 : 4;
                x->names = rt__realloc(p->a, x->names, (size_t)cap * sizeof(str_t), (size_t)nc * sizeof(str_t));
                cap = nc;
            }
            x->names[x->nnames++] = nm;
            nv_push(p, &vals, p_expr(p));
        }
        x->args.pos = vals.v;
        x->args.npos = vals.n;
        expect_bend(p);
        x->body = p_body(p, stops, &x->nbody, &which, t, "with");
        expect_bend(p);
        return x;
    }
    if (streq(t->s, "generation")) {
        /* Hugging Face's assistant-mask tag: renders its body unchanged. */
        static const char *const stops[] = {"endgeneration", NULL};
        expect_bend(p);
        node_t *x = mk(p, S_IF, t);
        x->neg = true; /* a body of its own, not a conditional (see check_names) */
        x->a = mk(p, E_LIT, t);
        x->a->lit.t = V_BOOL;
        x->a->lit.u.b = true;
        x->body = p_body(p, stops, &x->nbody, &which, t, "generation");
        expect_bend(p);
        return x;
    }
    if (streq(t->s, "break") || streq(t->s, "continue")) {
        if (!p->loops)
            perr(p, t->line, t->col, "'%.*s' outside a for loop", (int)t->s.n, t->s.p);
        node_t *x = mk(p, t->s.p[0] == 'b' ? S_BREAK : S_CONTINUE, t);
        expect_bend(p);
        return x;
    }
    for (int i = 0; end_tags[i]; i++)
        if (streq(t->s, end_tags[i]))
            perr(p, t->line, t->col, "unexpected '%s': no open block takes it", end_tags[i]);
    perr(p, t->line, t->col, "unknown tag '%.*s'", (int)(t->s.n < 40 ? t->s.n : 40), t->s.p);
    return NULL;
}

/* Unknown filter and test names fail at compile time, except inside an if
 * block or an inline if (Jinja's "soft" frames), where they fail when run.
 * Loops, macros and other bodies start a frame that is not soft again. */
static void check_names(parser_t *p, const node_t *x, bool soft);

static void check_list(parser_t *p, node_t *const *v, int n, bool soft)
{
    for (int i = 0; i < n; i++)
        if (v[i])
            check_names(p, v[i], soft);
}

static void check_names(parser_t *p, const node_t *x, bool soft)
{
    if (!x)
        return;
    if ((x->kind == E_FILTER || x->kind == E_TEST) && x->op < 0 && !soft)
        perr(p, x->line, x->col, "no %s named '%.*s'", x->kind == E_FILTER ? "filter" : "test",
             (int)x->name.n, x->name.p);
    bool inner = soft;
    if (x->kind == E_COND || (x->kind == S_IF && !x->neg))
        inner = soft = true;
    if (x->kind == S_FOR || x->kind == S_MACRO || x->kind == S_CALLBLOCK ||
        x->kind == S_SETBLOCK || x->kind == S_FILTERBLOCK || x->kind == S_WITH ||
        (x->kind == S_IF && x->neg))
        inner = false;
    check_names(p, x->a, soft);
    check_names(p, x->b, soft);
    check_names(p, x->c, soft);
    if (x->kind == E_SLICE) {
        check_names(p, x->args.pos[0], soft);
    } else {
        check_list(p, x->args.pos, x->args.npos, soft);
        check_list(p, x->args.kwv, x->args.nkw, soft);
    }
    check_list(p, x->defs, x->defs ? x->nnames : 0, inner);
    check_list(p, x->body, x->nbody, inner);
    check_list(p, x->alt, x->nalt, inner);
}

static node_t **p_body(parser_t *p, const char *const *stops, int *nout, int *which,
                       const tok_t *opener, const char *what)
{
    nvec_t body = {0};
    enter(p);
    for (;;) {
        tok_t *t = peek(p);
        if (t->t == T_EOF) {
            if (stops)
                perr(p, opener->line, opener->col,
                     "'%s' block is not closed: end of template reached looking for 'end%s'",
                     what, what);
            break;
        }
        if (t->t == T_TEXT) {
            next(p);
            node_t *x = mk(p, S_TEXT, t);
            x->lit.t = V_STR;
            x->lit.u.s = t->s;
            nv_push(p, &body, x);
        } else if (t->t == T_VBEGIN) {
            next(p);
            node_t *x = mk(p, S_OUT, t);
            x->a = p_tuple(p);
            if (peek(p)->t != T_VEND)
                unexpected(p, peek(p), "end of print statement '}}'");
            next(p);
            nv_push(p, &body, x);
        } else if (t->t == T_BBEGIN) {
            tok_t *nm = peek2(p);
            int w = -1;
            for (int i = 0; stops && stops[i]; i++)
                if (is_name(nm, stops[i]))
                    w = i;
            if (w >= 0) {
                next(p);
                next(p);
                *which = w;
                break;
            }
            next(p);
            nv_push(p, &body, p_stmt(p));
        } else {
            unexpected(p, t, "template text or a tag");
        }
    }
    p->depth--;
    *nout = body.n;
    return body.v;
}

node_t **rt__parse(arena_t *a, fail_t *f, const char *src, size_t n, int *nbody)
{
    parser_t p = {.a = a, .f = f, .src = src, .len = n};
    lex(&p);
    node_t **body = p_body(&p, NULL, nbody, &(int){0}, &p.toks[0], "template");
    check_list(&p, body, *nbody, false);
    return body;
}
