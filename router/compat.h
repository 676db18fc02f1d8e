/* llama-server's flags that bloomery-serve takes only so that a llama-server command
 * line starts here too: each is accepted with no effect (what it sets does not exist
 * here, or is what this server always does) or refused by name at start, with the
 * reason, and some are accepted with the values that mean "off" and refused with
 * others. The flags with a meaning here are serve.c's own; this table is the rest,
 * so that no flag of llama-server is unknown (docs/serving.md, "llama-server's
 * flags", lists them all with their state). */
#ifndef RT_COMPAT_H
#define RT_COMPAT_H

#include "args.h"
#include "err.h"

#define RT_COMPAT_MAX 160 /* entries of the table */

/* What the command line gave the table's flags (filled by bl_args_parse). */
typedef struct rt_compat_seen {
    const char *value[RT_COMPAT_MAX];
    int flag[RT_COMPAT_MAX];
} rt_compat_seen_t;

/* Appends the table's flags to a (*n in, *n out; at most cap in all), parsed into
 * seen. BL_ERANGE when cap is too small. */
int rt_compat_args(bl_arg_t *a, int *n, int cap, rt_compat_seen_t *seen) BL_WUR;

/* After parsing: BL_ENOTSUP naming the first refused flag given (with the value
 * that made it refused, where it takes one) and why; else 0, having logged each
 * accepted flag given (event=flag_no_effect flag=... reason=...). */
int rt_compat_check(const rt_compat_seen_t *seen, bl_err_t *err) BL_WUR;

#endif
