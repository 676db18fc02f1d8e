/* Command-line flags: see args.h. */
#include "args.h"
#include "bl_config.h"

#include <errno.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

int bl_parse_i64(const char *s, int64_t *out)
{
    if (!s || !*s)
        return BL_EINVAL;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10); /* base 10, as llama.cpp reads its flags: "010" is ten */
    if (errno || *end)
        return BL_EINVAL;
    *out = v;
    return 0;
}

int bl_parse_f32(const char *s, float *out)
{
    if (!s || !*s)
        return BL_EINVAL;
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno == ERANGE && fabsf(v) > 1.0f) /* overflow; underflow to 0 is fine */
        return BL_EINVAL;
    if (*end)
        return BL_EINVAL;
    *out = v;
    return 0;
}

int bl_parse_f64(const char *s, double *out)
{
    if (!s || !*s)
        return BL_EINVAL;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if ((errno == ERANGE && fabs(v) > 1.0) || *end)
        return BL_EINVAL;
    *out = v;
    return 0;
}

int bl_parse_size_mib(const char *s, int64_t *bytes)
{
    if (!s || *s < '0' || *s > '9') /* no sign, no space: strtoll would take both */
        return BL_EINVAL;
    char *end;
    errno = 0;
    const long long v = strtoll(s, &end, 10);
    if (errno)
        return BL_ERANGE;
    int shift = 20; /* a bare count is MiB */
    if (*end) {
        switch (*end) {
        case 'K': case 'k': shift = 10; break;
        case 'M': case 'm': shift = 20; break;
        case 'G': case 'g': shift = 30; break;
        default: return BL_EINVAL;
        }
        if (end[1])
            return BL_EINVAL;
    }
    if (v > INT64_MAX >> shift)
        return BL_ERANGE;
    *bytes = (int64_t)v << shift;
    return 0;
}

/* Does spelling [s, s + len) appear among the comma-separated names? */
static int has_name(const char *names, const char *s, size_t len)
{
    for (const char *p = names; *p;) {
        const char *comma = strchr(p, ',');
        size_t n = comma ? (size_t)(comma - p) : strlen(p);
        if (n == len && memcmp(p, s, len) == 0)
            return 1;
        if (!comma)
            break;
        p = comma + 1;
    }
    return 0;
}

/* The flag spelled [s, s + len), or NULL. */
static bl_arg_t *find_arg(bl_arg_t *args, int n_args, const char *s, size_t len)
{
    for (int k = 0; k < n_args; k++)
        if (has_name(args[k].names, s, len))
            return &args[k];
    return NULL;
}

/* The first spelling, for messages. */
static void first_name(const bl_arg_t *a, char *buf, size_t size)
{
    const char *comma = strchr(a->names, ',');
    size_t n = comma ? (size_t)(comma - a->names) : strlen(a->names);
    /* prefer the long spelling when there is one */
    const char *longest = strstr(a->names, "--");
    if (longest) {
        const char *end = strchr(longest, ',');
        n = end ? (size_t)(end - longest) : strlen(longest);
        snprintf(buf, size, "%.*s", (int)n, longest);
        return;
    }
    snprintf(buf, size, "%.*s", (int)n, a->names);
}

static int apply(bl_arg_t *a, const char *value, const char *where, bl_err_t *err)
{
    char name[64];
    first_name(a, name, sizeof name);
    switch (a->kind) {
    case BL_ARG_FLAG:
        *(int *)a->dst = 1;
        return 0;
    case BL_ARG_STR:
        *(const char **)a->dst = value;
        return 0;
    case BL_ARG_I64: {
        int64_t v;
        if (bl_parse_i64(value, &v))
            return bl_err_set(err, BL_EINVAL, "%s%s: '%.64s' is not an integer", where, name, value);
        if (v < a->min || v > a->max)
            return bl_err_set(err, BL_EINVAL, "%s%s: %lld is outside %lld..%lld", where, name,
                              (long long)v, (long long)a->min, (long long)a->max);
        *(int64_t *)a->dst = v;
        return 0;
    }
    case BL_ARG_F32: {
        float v;
        if (bl_parse_f32(value, &v) || !isfinite(v))
            return bl_err_set(err, BL_EINVAL, "%s%s: '%.64s' is not a finite number", where, name,
                              value);
        if (v < a->fmin || v > a->fmax)
            return bl_err_set(err, BL_EINVAL, "%s%s: %g is outside %g..%g", where, name, (double)v,
                              a->fmin, a->fmax);
        *(float *)a->dst = v;
        return 0;
    }
    case BL_ARG_F64: {
        double v;
        if (bl_parse_f64(value, &v) || !isfinite(v))
            return bl_err_set(err, BL_EINVAL, "%s%s: '%.64s' is not a finite number", where, name,
                              value);
        if (v < a->fmin || v > a->fmax)
            return bl_err_set(err, BL_EINVAL, "%s%s: %g is outside %g..%g", where, name, v,
                              a->fmin, a->fmax);
        *(double *)a->dst = v;
        return 0;
    }
    case BL_ARG_FN: {
        bl_err_t inner = {0};
        int rc = a->fn(a->ud, value, &inner);
        if (rc)
            return bl_err_set(err, rc, "%s%s: %s", where, name, inner.msg);
        return 0;
    }
    }
    return bl_err_set(err, BL_EINVAL, "%s: bad flag table", name);
}

int bl_args_parse(bl_arg_t *args, int n_args, int argc, char **argv, int *n_positional,
                  int *help, bl_err_t *err)
{
    for (int i = 0; i < n_args; i++) {
        args[i].seen = 0;
        const char *v = args[i].env ? getenv(args[i].env) : NULL;
        if (!v)
            continue;
        if (args[i].kind == BL_ARG_FLAG) {
            /* a flag's variable is a boolean */
            if (!strcmp(v, "1") || !strcmp(v, "true") || !strcmp(v, "on"))
                *(int *)args[i].dst = 1;
            else if (strcmp(v, "0") && strcmp(v, "false") && strcmp(v, "off") && *v)
                return bl_err_set(err, BL_EINVAL, "%s: '%.64s' is not a boolean", args[i].env, v);
        } else {
            int rc = apply(&args[i], v, "", err);
            if (rc) {
                char msg[sizeof err->msg];
                snprintf(msg, sizeof msg, "%s", err->msg);
                return bl_err_set(err, rc, "%s (from %s)", msg, args[i].env);
            }
        }
        args[i].seen = 2;
    }

    int n_pos = 0, only_positional = 0;
    for (int i = 1; i < argc; i++) {
        char *arg = argv[i];
        if (only_positional || arg[0] != '-' || arg[1] == 0) {
            if (!n_positional)
                return bl_err_set(err, BL_EINVAL, "unexpected argument '%.64s'", arg);
            argv[1 + n_pos++] = arg;
            continue;
        }
        if (!strcmp(arg, "--")) {
            only_positional = 1;
            continue;
        }
        if (help && (!strcmp(arg, "-h") || !strcmp(arg, "--help"))) {
            *help = 1;
            continue;
        }
        if (help && !strcmp(arg, "--version")) { /* llama.cpp's programs all take it */
            const char *slash = strrchr(argv[0], '/');
            printf("%s %s\n", slash ? slash + 1 : argv[0], BL_VERSION);
            *help = BL_ARGS_VERSION;
            continue;
        }
        const char *eq = strncmp(arg, "--", 2) == 0 ? strchr(arg, '=') : NULL;
        size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
        bl_arg_t *a = find_arg(args, n_args, arg, len);
        if (!a && len > 2 && len < 128 && arg[1] == '-' && memchr(arg, '_', len)) {
            /* "--backend_sampling": a long name with '_' for '-', as scripts write them */
            char dashed[128];
            for (size_t c = 0; c < len; c++)
                dashed[c] = arg[c] == '_' ? '-' : arg[c];
            a = find_arg(args, n_args, dashed, len);
        }
        if (!a)
            return bl_err_set(err, BL_EINVAL, "unknown flag '%.*s'", (int)(len > 64 ? 64 : len),
                              arg);
        const char *value = NULL;
        if (a->kind == BL_ARG_FLAG) {
            if (eq)
                return bl_err_set(err, BL_EINVAL, "flag %.*s takes no value", (int)len, arg);
        } else if (eq) {
            value = eq + 1;
        } else if (i + 1 < argc) {
            value = argv[++i];
        } else {
            return bl_err_set(err, BL_EINVAL, "flag %s needs a value (%s)", arg,
                              a->metavar ? a->metavar : "VALUE");
        }
        int rc = apply(a, value, "", err);
        if (rc)
            return rc;
        a->seen = 1;
    }
    if (n_positional)
        *n_positional = n_pos;
    return 0;
}

void bl_args_usage(FILE *f, const char *prog, const char *synopsis, const bl_arg_t *args,
                   int n_args)
{
    fprintf(f, "usage: %s %s\n\n", prog, synopsis);
    for (int i = 0; i < n_args; i++) {
        char left[96];
        snprintf(left, sizeof left, "%s%s%s", args[i].names, args[i].metavar ? " " : "",
                 args[i].metavar ? args[i].metavar : "");
        /* "-t,--threads" reads better as "-t, --threads" */
        char spaced[128];
        size_t o = 0;
        for (const char *p = left; *p && o + 2 < sizeof spaced; p++) {
            spaced[o++] = *p;
            if (*p == ',')
                spaced[o++] = ' ';
        }
        spaced[o] = 0;
        fprintf(f, "  %-32s  %s", spaced, args[i].help ? args[i].help : ""); /* two spaces at least: the names end there */
        if (args[i].env)
            fprintf(f, " (env: %s)", args[i].env);
        fputc('\n', f);
    }
    fprintf(f, "  %-32s  %s\n", "-h, --help", "print this and exit");
    fprintf(f, "  %-32s  %s\n", "--version", "print the version and exit");
}

void bl_args_completion_bash(FILE *f, const char *prog, const bl_arg_t *args, int n_args)
{
    /* a shell function name: the program's name with '-' as '_' */
    char fn[64];
    size_t k = 0;
    for (const char *p = prog; *p && k + 1 < sizeof fn; p++)
        fn[k++] = (*p == '-' || *p == '.') ? '_' : *p;
    fn[k] = 0;
    fprintf(f, "_%s() {\n    local cur=\"${COMP_WORDS[COMP_CWORD]}\"\n    local flags=\"-h --help --version", fn);
    for (int i = 0; i < n_args; i++)
        for (const char *p = args[i].names; *p;) {
            const char *comma = strchr(p, ',');
            const size_t len = comma ? (size_t)(comma - p) : strlen(p);
            fprintf(f, " %.*s", (int)len, p);
            if (!comma)
                break;
            p = comma + 1;
        }
    fprintf(f, "\"\n    COMPREPLY=($(compgen -W \"$flags\" -- \"$cur\"))\n}\n");
    fprintf(f, "complete -o default -F _%s %s\n", fn, prog);
}

int bl_arg_flash_attn(void *ud, const char *v, bl_err_t *err)
{
    int *fa = ud;
    if (!strcmp(v, "auto"))
        *fa = BL_FLASH_AUTO;
    else if (!strcmp(v, "on") || !strcmp(v, "1") || !strcmp(v, "true"))
        *fa = BL_FLASH_ON;
    else if (!strcmp(v, "off") || !strcmp(v, "0") || !strcmp(v, "false"))
        *fa = BL_FLASH_OFF;
    else
        return bl_err_set(err, BL_EINVAL, "'%.32s' is not on, off or auto", v);
    return 0;
}

int bl_arg_experts_vram(void *ud, const char *v, bl_err_t *err)
{
    int64_t bytes;
    if (!strcmp(v, "auto")) {
        *(int64_t *)ud = BL_EXPERTS_VRAM_AUTO;
        return 0;
    }
    const int rc = bl_parse_size_mib(v, &bytes);
    if (rc == BL_ERANGE)
        return bl_err_set(err, BL_EINVAL, "'%.32s' is more bytes than fit in 64 bits", v);
    if (rc && v[0] == '-')
        return bl_err_set(err, BL_EINVAL, "'%.32s' is negative (0: no slots)", v);
    if (rc)
        return bl_err_set(err, BL_EINVAL, "'%.32s' is not auto or a size (MiB, or N with a K, M or G suffix)", v);
    *(int64_t *)ud = bytes;
    return 0;
}
