/* Internals of the chat-template engine shared by template.c (values and the
 * renderer) and template_parse.c (lexer and parser): the arena, strings, value
 * and syntax-tree types. Only router/template*.c include this. */
#ifndef RT_TEMPLATE_IMPL_H
#define RT_TEMPLATE_IMPL_H

#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "template.h"

// ---------------------------------------------------------------------------
// Arena, failure, strings

/* Errors unwind with longjmp to the entry point that owns `jb` (compile or
 * render); every allocation lives in an arena, so nothing leaks on the way. */
typedef struct chunk {
    struct chunk *next;
    size_t cap, used;
    max_align_t data[];
} chunk_t;

typedef struct fail {
    jmp_buf jb;
    bl_err_t *err;
} fail_t;

typedef struct arena {
    chunk_t *head;
    size_t total, limit;
    fail_t *fail;
} arena_t;

typedef struct str {
    const char *p;
    size_t n;
} str_t;

/* Growable byte buffer in an arena; RT_TEMPLATE_MAX_OUTPUT bounds its size. */
typedef struct sb {
    char *p;
    size_t n, cap;
} sb_t;

static inline bool streq(str_t s, const char *c)
{
    size_t n = strlen(c);
    return s.n == n && memcmp(s.p, c, n) == 0;
}

static inline bool streq2(str_t a, str_t b)
{
    return a.n == b.n && (a.n == 0 || memcmp(a.p, b.p, a.n) == 0);
}

static inline str_t sb_str(const sb_t *b)
{
    return (str_t){b->p ? b->p : "", b->n};
}

/* Records code and message in f->err and jumps to f->jb. */
_Noreturn void rt__fail_raise(fail_t *f, int code, const char *fmt, ...) BL_PRINTF(3, 4);

/* Arena allocation; on exhaustion or past a->limit, fails through a->fail. */
void *rt__alloc(arena_t *a, size_t n);
/* Grows p from old to n bytes, in place when p was the latest allocation. */
void *rt__realloc(arena_t *a, void *p, size_t old, size_t n);

void rt__sb_put(arena_t *a, sb_t *b, const char *p, size_t n);
void rt__sb_putc(arena_t *a, sb_t *b, char c);
/* Appends code point cp as UTF-8. */
void rt__sb_put_cp(arena_t *a, sb_t *b, int32_t cp);

// ---------------------------------------------------------------------------
// Values

enum vt { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT, V_FUNC, V_LOOP };

struct list;
struct dict;
struct func;
struct loopst;

typedef struct value {
    uint8_t t;
    /* V_STR: a Markup string (made by |safe); `+` with a plain string then
     * HTML-escapes the plain side, as markupsafe does. */
    uint8_t safe;
    union {
        bool b;
        int64_t i;
        double f;
        str_t s;
        struct list *l;
        struct dict *d;
        struct func *fn;
        struct loopst *lp;
        const char *why; /* V_UNDEF: what was missing, for the error on use */
    } u;
} value_t;

typedef struct list {
    value_t *v;
    size_t n, cap;
    bool tuple;
    /* What Python would hold instead of a list: Jinja's map/select/unique/items
     * filters return generators and dict.items() a view. They iterate like
     * lists but print, serialise, measure and test differently. */
    uint8_t gen;
} list_t;

enum { GEN_NONE, GEN_GENERATOR, GEN_ITEMS, GEN_KEYS, GEN_VALUES };

typedef struct dict {
    value_t *k, *v;
    size_t n, cap;
    bool ns; /* made by namespace(): attributes may be assigned */
} dict_t;

// ---------------------------------------------------------------------------
// Syntax tree

enum nk {
    /* expressions */
    E_LIT, E_NAME, E_ATTR, E_ITEM, E_SLICE, E_CALL, E_FILTER, E_TEST, E_BIN, E_NEG,
    E_POS, E_NOT, E_AND, E_OR, E_CMP, E_COND, E_LIST, E_TUPLE, E_DICT, E_CONCAT,
    E_BLOCKVAL,
    /* statements */
    S_TEXT, S_OUT, S_IF, S_FOR, S_SET, S_SETATTR, S_SETBLOCK, S_MACRO, S_CALLBLOCK,
    S_FILTERBLOCK, S_BREAK, S_CONTINUE, S_WITH,
};

enum binop { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FDIV, OP_MOD, OP_POW };
enum cmpop { C_EQ, C_NE, C_LT, C_LE, C_GT, C_GE, C_IN, C_NOTIN };

typedef struct node node_t;

typedef struct args {
    node_t **pos;
    int npos;
    str_t *kwn;
    node_t **kwv;
    int nkw;
} args_t;

struct node {
    uint8_t kind;
    bool neg;  /* E_TEST: `is not` */
    int op;    /* operator, filter or test id */
    int line, col;
    str_t name; /* variable, attribute, filter, test, macro name */
    str_t name2;
    node_t *a, *b, *c;
    args_t args;      /* call/filter/test arguments; list items; dict keys (pos) and values (kwv) */
    int *ops;         /* E_CMP: the operators between args.pos */
    node_t **body;
    int nbody;
    node_t **alt; /* else branch */
    int nalt;
    str_t *names; /* for targets, set targets, macro parameters */
    node_t **defs; /* macro parameter defaults (NULL entries for none) */
    int nnames;
    value_t lit;
};

struct rt_template {
    arena_t arena;
    fail_t *fail;
    node_t **body;
    int nbody;
};

// ---------------------------------------------------------------------------
// Filters and tests, resolved to ids when the template is parsed

enum filt {
    F_ABS, F_ATTR, F_CAPITALIZE, F_COUNT, F_DEFAULT, F_D, F_DICTSORT, F_E, F_ESCAPE,
    F_FIRST, F_FLOAT, F_INDENT, F_INT, F_ITEMS, F_JOIN, F_LAST, F_LENGTH, F_LIST,
    F_LOWER, F_MAP, F_MAX, F_MIN, F_REJECT, F_REJECTATTR, F_REPLACE, F_REVERSE,
    F_ROUND, F_SAFE, F_SELECT, F_SELECTATTR, F_SORT, F_STRING, F_SUM, F_TITLE,
    F_TOJSON, F_TRIM, F_UNIQUE, F_UPPER, F_WORDCOUNT, F_CENTER, F_BATCH, F_FORMAT,
    F_FORCEESCAPE,
    /* Jinja filters this engine does not implement: known, so a template that
     * only names them compiles, but refused with BL_ENOTSUP when they run */
    F_FILESIZEFORMAT, F_GROUPBY, F_PPRINT, F_RANDOM, F_SLICE, F_STRIPTAGS, F_TRUNCATE,
    F_URLENCODE, F_URLIZE, F_WORDWRAP, F_XMLATTR,
    F_COUNT_
};

enum test {
    X_BOOLEAN, X_CALLABLE, X_DEFINED, X_DIVISIBLEBY, X_EQ, X_EQUALTO, X_EVEN, X_FALSE,
    X_FLOAT, X_GE, X_GT, X_GREATERTHAN, X_IN, X_INTEGER, X_ITERABLE, X_LE, X_LT,
    X_LESSTHAN, X_LOWER, X_MAPPING, X_NE, X_NONE, X_NUMBER, X_ODD, X_SAMEAS,
    X_SEQUENCE, X_STRING, X_TRUE, X_UNDEFINED, X_UPPER, X_ESCAPED, X_FILTER,
    X_TEST, X_COUNT_
};

extern const char *const rt__filter_names[]; /* F_COUNT_ names, by enum filt */
extern const char *const rt__test_names[];   /* X_COUNT_ names, by enum test */

/* Index of s in tab[0..n), or -1. */
int rt__lookup_name(const char *const *tab, int n, str_t s);

/* Parses src[0..n) (newlines already normalised) into a statement list of
 * *nbody nodes allocated in a; syntax errors fail through f. */
node_t **rt__parse(arena_t *a, fail_t *f, const char *src, size_t n, int *nbody);

#endif
