/* Chat templates: a Jinja2 interpreter for the subset that model chat templates
 * use, configured the way Hugging Face renders them (trim_blocks, lstrip_blocks,
 * loop controls, {% generation %}, a tojson that does not escape HTML, the
 * globals raise_exception and strftime_now, immutable sandbox rules).
 *
 * A template is compiled once and is immutable afterwards: any number of threads
 * may render the same template at once. Each render allocates from its own arena,
 * freed before rt_template_render returns. */
#ifndef RT_TEMPLATE_H
#define RT_TEMPLATE_H

#include <stddef.h>

#include <jansson.h>

#include "err.h"

/* Error codes beyond common/err.h, stored in bl_err_t.code and returned. Every
 * message names the template line (and column where known): "line 12:4: ...". */
enum {
    RT_ESYNTAX = -100, /* the template does not parse (unclosed tag, bad expression,
                          unknown filter or test) */
    RT_ERENDER = -101, /* a runtime error: undefined attribute access, type error,
                          a call that is not allowed in the sandbox */
    RT_ERAISED = -102, /* the template called raise_exception(msg); the message is msg */
    RT_ELIMIT = -103,  /* a documented limit was hit (see below) */
};

/* Limits, each refused with RT_ELIMIT rather than crashing:
 *   RT_TEMPLATE_MAX_SOURCE   template text size in bytes
 *   RT_TEMPLATE_MAX_NESTING  nesting of blocks and expressions at parse time
 *   RT_TEMPLATE_MAX_CALLS    depth of macro calls (recursion) at render time
 *   RT_TEMPLATE_MAX_OUTPUT   bytes of rendered output
 *   RT_TEMPLATE_MAX_MEMORY   bytes the render arena may take (strings built in
 *                            loops, converted context, intermediate values)
 *   RT_TEMPLATE_MAX_RANGE    items range() may produce (as Jinja's sandbox)
 *   RT_TEMPLATE_MAX_STEPS    work one render may do: statements run, loop turns,
 *                            comparisons, items `in` searches (a template quadratic in
 *                            the client's messages stops here instead of hanging)
 *   RT_TEMPLATE_MAX_DATA_DEPTH nesting of values printed or serialised (tojson of
 *                            a namespace that holds itself) */
#define RT_TEMPLATE_MAX_SOURCE (8u << 20)
#define RT_TEMPLATE_MAX_NESTING 200
#define RT_TEMPLATE_MAX_CALLS 200
/* The four limits on what a render may produce or do can be lowered where the engine
 * is compiled (-DRT_TEMPLATE_MAX_OUTPUT=...): the fuzz target renders with smaller
 * ones, so that one input cannot take a second and a gigabyte within the limits. */
#ifndef RT_TEMPLATE_MAX_OUTPUT
#define RT_TEMPLATE_MAX_OUTPUT (64u << 20)
#endif
#ifndef RT_TEMPLATE_MAX_MEMORY
#define RT_TEMPLATE_MAX_MEMORY (1024u << 20)
#endif
#ifndef RT_TEMPLATE_MAX_RANGE
#define RT_TEMPLATE_MAX_RANGE 100000
#endif
#ifndef RT_TEMPLATE_MAX_STEPS
#define RT_TEMPLATE_MAX_STEPS 100000000ull
#endif
#define RT_TEMPLATE_MAX_DATA_DEPTH 512

typedef struct rt_template rt_template_t;

/* Parses text[0..len) (UTF-8; need not be NUL-terminated). On success *out is a
 * template the caller frees with rt_template_destroy. Returns 0, RT_ESYNTAX,
 * RT_ELIMIT or BL_ENOMEM, and fills err on failure. */
int rt_template_compile(const char *text, size_t len, rt_template_t **out,
                        bl_err_t *err) BL_WUR;

/* Renders tpl with the members of the JSON object context as its variables
 * (messages, tools, add_generation_prompt, bos_token, ...). context may be NULL
 * (no variables). On success *out is a NUL-terminated string of *out_len bytes
 * that the caller frees with free(). Returns 0, RT_ERENDER, RT_ERAISED,
 * RT_ELIMIT, BL_EINVAL (context not an object) or BL_ENOMEM. */
int rt_template_render(const rt_template_t *tpl, const json_t *context, char **out,
                       size_t *out_len, bl_err_t *err) BL_WUR;

void rt_template_destroy(rt_template_t *tpl);

/* A short fixed name for an RT_E* or BL_E* code. */
const char *rt_template_strerror(int code);

#endif
