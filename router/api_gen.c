/* The generating routes' common ground: registration of every route that renders or
 * generates, the request fields they share (sampling, stop, logit_bias, limits and
 * the refusals of what cannot be honoured), prompt forms, chat messages, the <think>
 * splitter, and the life of one generation from rt_engine_submit to its last
 * event. llama-server's own /completion and /apply-template live here too; the
 * OpenAI routes are in api_openai.c and the Anthropic ones in api_anthropic.c.
 *
 * Thread: the loop thread. */
#include "api_gen_impl.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "grammar.h"
#include "json_schema.h"
#include "log.h"

/* ---------------------------------------------------------------------------- */
/* buffers                                                                        */
/* ---------------------------------------------------------------------------- */

int rt__gen_buf_add(rt_gen_buf_t *b, const char *s, size_t n)
{
    return bl_buf_add(b, s, n, 0);
}

void rt__gen_buf_free(rt_gen_buf_t *b)
{
    bl_buf_free(b);
}

/* Drops the first n bytes. */
void rt__gen_buf_consume(rt_gen_buf_t *b, size_t n)
{
    if (n >= b->n) {
        b->n = 0;
    } else {
        memmove(b->p, b->p + n, b->n - n);
        b->n -= n;
    }
    if (b->p)
        b->p[b->n] = '\0';
}

/* ---------------------------------------------------------------------------- */
/* typed field access                                                             */
/* ---------------------------------------------------------------------------- */

/* A member that is present and not null (null reads as absent, as clients send
 * null for "not given"). */
static json_t *field(const json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    return v && !json_is_null(v) ? v : NULL;
}

static int get_double(const json_t *o, const char *k, double *out, int *found, bl_err_t *err)
{
    json_t *v = field(o, k);
    if (found)
        *found = 0;
    if (!v)
        return 0;
    if (!json_is_number(v))
        return bl_err_set(err, BL_EINVAL, "'%s' must be a number", k);
    double x = json_number_value(v);
    if (!isfinite(x))
        return bl_err_set(err, BL_EINVAL, "'%s' must be a finite number", k);
    *out = x;
    if (found)
        *found = 1;
    return 0;
}

static int get_float(const json_t *o, const char *k, float *out, bl_err_t *err)
{
    double x = *out;
    int rc = get_double(o, k, &x, NULL, err);
    if (rc)
        return rc;
    if (fabs(x) > FLT_MAX)
        return bl_err_set(err, BL_EINVAL, "'%s' is out of range", k);
    *out = (float)x;
    return 0;
}

/* An integer; a real with an integral value is taken too (JavaScript clients send
 * 1.0 for 1). */
static int get_int(const json_t *o, const char *k, int64_t lo, int64_t hi, int64_t *out, int *found,
                   bl_err_t *err)
{
    json_t *v = field(o, k);
    if (found)
        *found = 0;
    if (!v)
        return 0;
    int64_t x;
    if (json_is_integer(v)) {
        x = (int64_t)json_integer_value(v);
    } else if (json_is_real(v)) {
        double d = json_real_value(v);
        if (!isfinite(d) || d != floor(d) || d < -9.2e18 || d > 9.2e18)
            return bl_err_set(err, BL_EINVAL, "'%s' must be an integer", k);
        x = (int64_t)d;
    } else {
        return bl_err_set(err, BL_EINVAL, "'%s' must be an integer", k);
    }
    if (x < lo || x > hi)
        return bl_err_set(err, BL_EINVAL, "'%s' must be between %lld and %lld (got %lld)", k,
                          (long long)lo, (long long)hi, (long long)x);
    *out = x;
    if (found)
        *found = 1;
    return 0;
}

static int get_bool(const json_t *o, const char *k, int *out, bl_err_t *err)
{
    json_t *v = field(o, k);
    if (!v)
        return 0;
    if (!json_is_boolean(v))
        return bl_err_set(err, BL_EINVAL, "'%s' must be a boolean", k);
    *out = json_is_true(v);
    return 0;
}

/* ---------------------------------------------------------------------------- */
/* request fields                                                                 */
/* ---------------------------------------------------------------------------- */

static int bias_add(rt_gen_params_t *p, int32_t token, float bias)
{
    if (p->n_bias == p->cap_bias) {
        size_t cap = p->cap_bias ? p->cap_bias * 2 : 16;
        rt_logit_bias_t *b = realloc(p->bias, cap * sizeof *b);
        if (!b)
            return BL_ENOMEM;
        p->bias = b;
        p->cap_bias = cap;
    }
    p->bias[p->n_bias].token = token;
    p->bias[p->n_bias].bias = bias;
    p->n_bias++;
    return 0;
}

/* The bias of one logit_bias entry: a number, or false to ban the token. *skip:
 * true, which llama-server ignores. */
static int bias_value(const json_t *v, float *out, int *skip, bl_err_t *err)
{
    *skip = 0;
    if (json_is_false(v)) {
        *out = -INFINITY;
        return 0;
    }
    if (json_is_true(v)) {
        *skip = 1;
        return 0;
    }
    if (!json_is_number(v) || !isfinite(json_number_value(v)))
        return bl_err_set(err, BL_EINVAL, "'logit_bias' values must be numbers or false");
    double x = json_number_value(v);
    *out = (float)(x > FLT_MAX ? FLT_MAX : x < -FLT_MAX ? -FLT_MAX : x);
    return 0;
}

/* A logit_bias key or first element: a token id (a JSON integer, or a string of
 * digits as OpenAI's object form has it), or text whose every token gets the bias
 * (as llama-server does). */
static int bias_target(rt_gen_params_t *p, const rt_gen_limits_t *lim, const json_t *key_json,
                       const char *key, float bias, bl_err_t *err)
{
    if (key_json && json_is_integer(key_json)) {
        json_int_t t = json_integer_value(key_json);
        if (t < 0 || t >= lim->n_vocab)
            return bl_err_set(err, BL_EINVAL,
                              "'logit_bias': token %lld is outside the vocabulary (0..%lld)",
                              (long long)t, (long long)lim->n_vocab - 1);
        return bias_add(p, (int32_t)t, bias);
    }
    if (key_json && !json_is_string(key_json))
        return bl_err_set(err, BL_EINVAL,
                          "'logit_bias' entries must be [token id or text, bias] pairs");
    size_t len = strlen(key);
    if (len > 0 && len <= 18) {
        char *end;
        errno = 0;
        long long t = strtoll(key, &end, 10);
        if (*end == '\0' && errno == 0 && (isdigit((unsigned char)key[0]) || key[0] == '-')) {
            if (t < 0 || t >= lim->n_vocab)
                return bl_err_set(err, BL_EINVAL,
                                  "'logit_bias': token %lld is outside the vocabulary (0..%lld)",
                                  t, (long long)lim->n_vocab - 1);
            return bias_add(p, (int32_t)t, bias);
        }
    }
    if (!lim->tok)
        return bl_err_set(err, BL_EINVAL, "'logit_bias': text keys need a tokenizer");
    rt_tokens_t toks = {0};
    bl_err_t terr;
    int rc = rt_tokenize(lim->tok, key, len, 0, &toks, &terr);
    if (rc) {
        rt_tokens_free(&toks);
        return bl_err_set(err, rc == BL_ENOMEM ? BL_ENOMEM : BL_EINVAL, "'logit_bias': %s",
                          terr.msg);
    }
    for (size_t i = 0; i < toks.n && !rc; i++)
        rc = bias_add(p, toks.ids[i], bias);
    rt_tokens_free(&toks);
    return rc ? bl_err_set(err, rc, "out of memory") : 0;
}

static int parse_logit_bias(const json_t *body, const rt_gen_limits_t *lim, rt_gen_params_t *p,
                            bl_err_t *err)
{
    json_t *lb = field(body, "logit_bias");
    if (!lb)
        return 0;
    int rc = 0, skip;
    float bias = 0.0f;
    if (json_is_object(lb)) {
        const char *key;
        json_t *v;
        json_object_foreach(lb, key, v) {
            if ((rc = bias_value(v, &bias, &skip, err)))
                return rc;
            if (!skip && (rc = bias_target(p, lim, NULL, key, bias, err)))
                return rc;
        }
        return 0;
    }
    if (!json_is_array(lb))
        return bl_err_set(err, BL_EINVAL, "'logit_bias' must be an object or an array of pairs");
    size_t i;
    json_t *el;
    json_array_foreach(lb, i, el) {
        if (!json_is_array(el) || json_array_size(el) != 2)
            return bl_err_set(err, BL_EINVAL,
                              "'logit_bias'[%zu] must be a [token id or text, bias] pair", i);
        json_t *k = json_array_get(el, 0);
        if ((rc = bias_value(json_array_get(el, 1), &bias, &skip, err)))
            return rc;
        if (skip)
            continue;
        if ((rc = bias_target(p, lim, k, json_is_string(k) ? json_string_value(k) : "", bias, err)))
            return rc;
    }
    return 0;
}

/* stop (a string or an array of strings) or Anthropic's stop_sequences. The
 * strings stay in the request JSON; rt_engine_submit copies them. */
static int parse_stop(const json_t *body, const char *name, int array_only, rt_gen_params_t *p,
                      bl_err_t *err)
{
    json_t *st = field(body, name);
    if (!st)
        return 0;
    if (json_is_string(st) && !array_only) {
        if (json_string_length(st) > 0)
            p->task.stop[p->task.n_stop++] = json_string_value(st);
        return 0;
    }
    if (!json_is_array(st))
        return bl_err_set(err, BL_EINVAL, "'%s' must be %s", name,
                          array_only ? "an array of strings" : "a string or an array of strings");
    size_t i;
    json_t *s;
    json_array_foreach(st, i, s) {
        if (!json_is_string(s))
            return bl_err_set(err, BL_EINVAL, "'%s'[%zu] must be a string", name, i);
        if (json_string_length(s) == 0)
            continue; /* llama-server skips empty stop words */
        if (p->task.n_stop == RT_MAX_STOP)
            return bl_err_set(err, BL_EINVAL, "'%s' has more than %d strings", name, RT_MAX_STOP);
        p->task.stop[p->task.n_stop++] = json_string_value(s);
    }
    return 0;
}

/* Fields whose only value we can honour is the one that turns them off. */
static int refuse_unsupported(const json_t *body, rt_gen_api_t api, bl_err_t *err)
{
    int64_t iv;
    double dv;
    int found, rc;
    json_t *v;

    if (api != RT_GEN_API_OAI_CHAT && api != RT_GEN_API_OAI_CMPL) { /* n: the OpenAI routes' (choices) */
        if ((rc = get_int(body, "n", 1, INT32_MAX, &iv, &found, err)))
            return rc;
        if (found && iv != 1)
            return bl_err_set(err, BL_EINVAL, "'n': only one completion choice is allowed here");
        if ((rc = get_int(body, "n_cmpl", 1, INT32_MAX, &iv, &found, err)))
            return rc;
        if (found && iv != 1)
            return bl_err_set(err, BL_EINVAL, "'n_cmpl': only one completion choice is allowed here");
    }
    if (api == RT_GEN_API_ANTHROPIC)
        return 0;

    if ((rc = get_int(body, "mirostat", 0, 2, &iv, &found, err)))
        return rc;
    if (found && iv != 0)
        return bl_err_set(err, BL_EINVAL, "'mirostat' sampling is not supported (only 0)");
    static const char *const off_when_zero[] = {"dry_multiplier", "xtc_probability",
                                                "dynatemp_range"};
    for (size_t i = 0; i < sizeof off_when_zero / sizeof *off_when_zero; i++) {
        if ((rc = get_double(body, off_when_zero[i], &dv, &found, err)))
            return rc;
        if (found && dv != 0.0)
            return bl_err_set(err, BL_EINVAL, "'%s' is not supported (only 0)", off_when_zero[i]);
    }
    if ((rc = get_double(body, "top_n_sigma", &dv, &found, err)))
        return rc;
    if (found && dv > 0.0)
        return bl_err_set(err, BL_EINVAL, "'top_n_sigma' is not supported (only -1)");
    if ((v = field(body, "lora")) && !(json_is_array(v) && json_array_size(v) == 0))
        return bl_err_set(err, BL_EINVAL, "'lora' is not supported: no adapters are loaded");

    if (api == RT_GEN_API_OAI_CMPL) {
        int b = 0;
        if ((rc = get_bool(body, "echo", &b, err)))
            return rc;
        if (b)
            return bl_err_set(err, BL_EINVAL, "'echo': only no echo is supported");
        if ((rc = get_int(body, "best_of", 1, INT32_MAX, &iv, &found, err)))
            return rc;
        if (found && iv != 1)
            return bl_err_set(err, BL_EINVAL, "'best_of' is not supported (only 1)");
        if ((v = field(body, "suffix")) && !json_is_string(v))
            return bl_err_set(err, BL_EINVAL, "'suffix' must be a string");
    }
    return 0;
}

/* "samplers": the chain's stages in order, as an array of llama.cpp's names or a
 * string of their letters ("kpt"); an unknown name is refused by name. */
static int parse_samplers(const json_t *body, rt_sampler_params_t *s, bl_err_t *err)
{
    json_t *v = field(body, "samplers");
    if (!v)
        return 0;
    if (!json_is_string(v) && !json_is_array(v))
        return bl_err_set(err, BL_EINVAL, "'samplers' must be an array of sampler names or a "
                                          "string of their letters");
    bl_err_t e2;
    int rc = 0;
    s->n_stages = 0;
    if (json_is_string(v)) {
        rc = rt_sampler_chain_add(s, json_string_value(v), json_string_length(v), 1, &e2);
    } else {
        size_t i;
        json_t *e;
        json_array_foreach(v, i, e) {
            if (!json_is_string(e))
                return bl_err_set(err, BL_EINVAL, "'samplers'[%zu] must be a string", i);
            if ((rc = rt_sampler_chain_add(s, json_string_value(e), json_string_length(e), 0, &e2)))
                break;
        }
    }
    return rc ? bl_err_set(err, rc, "'samplers': %s", e2.msg) : 0;
}

char *rt__gen_gbnf_rename(const char *gbnf, const char *prefix, const char *root)
{
    size_t n = strlen(gbnf), pl = strlen(prefix), rl = root ? strlen(root) : 0;
    size_t names = 0;
    for (size_t i = 0; i < n; i++)
        names += isalnum((unsigned char)gbnf[i]) || gbnf[i] == '-' || gbnf[i] == '_';
    char *out = malloc(n + names * (pl > rl ? pl : rl) + 1), *o = out;
    if (!out)
        return NULL;
    for (size_t i = 0; i < n;) {
        char c = gbnf[i];
        if (c == '"' || c == '[' || c == '{' || c == '#') {
            /* a literal or a class (escapes and all), a repetition's counts, a comment */
            char close = c == '"' ? '"' : c == '[' ? ']' : c == '{' ? '}' : '\n';
            size_t j = i + 1;
            while (j < n && gbnf[j] != close)
                j += gbnf[j] == '\\' && c != '#' && j + 1 < n ? 2 : 1;
            j = j < n && c != '#' ? j + 1 : j;
            memcpy(o, gbnf + i, j - i);
            o += j - i;
            i = j;
        } else if (isalnum((unsigned char)c) || c == '-' || c == '_') {
            size_t j = i;
            while (j < n && (isalnum((unsigned char)gbnf[j]) || gbnf[j] == '-' || gbnf[j] == '_'))
                j++;
            if (root && j - i == 4 && !memcmp(gbnf + i, "root", 4)) {
                memcpy(o, root, rl);
                o += rl;
            } else {
                memcpy(o, prefix, pl);
                memcpy(o + pl, gbnf + i, j - i);
                o += pl + j - i;
            }
            i = j;
        } else {
            *o++ = c;
            i++;
        }
    }
    *o = '\0';
    return out;
}

/* A byte of a literal (in_class 0) or a class: control bytes as \xHH, the quote,
 * the backslash and a class's brackets, '^' and '-' escaped, the rest (UTF-8 too)
 * as it is. */
static int gbnf_byte(bl_buf_t *b, unsigned char c, int in_class)
{
    char e[8];
    if (c < 0x20 || c == 0x7f) {
        snprintf(e, sizeof e, "\\x%02X", c);
        return bl_buf_add(b, e, 4, 0);
    }
    if (c == '\\' || (!in_class && c == '"') ||
        (in_class && (c == ']' || c == '[' || c == '^' || c == '-'))) {
        e[0] = '\\', e[1] = (char)c;
        return bl_buf_add(b, e, 2, 0);
    }
    return bl_buf_add(b, (const char *)&c, 1, 0);
}

/* A byte as a literal of its own. */
static int gbnf_char(bl_buf_t *b, unsigned char c)
{
    return bl_buf_add(b, "\"", 1, 0) || gbnf_byte(b, c, 0) || bl_buf_add(b, "\"", 1, 0);
}

int rt__gen_gbnf_lit(bl_buf_t *b, const char *s, size_t n)
{
    int rc = bl_buf_add(b, "\"", 1, 0);
    for (size_t i = 0; !rc && i < n; i++)
        rc = gbnf_byte(b, (unsigned char)s[i], 0);
    return rc ? rc : bl_buf_add(b, "\"", 1, 0);
}

int rt__gen_gbnf_until(bl_buf_t *b, const char *name, const char *tag)
{
    const size_t L = strlen(tag);
    if (L == 0 || L > 64)
        return BL_EINVAL;
    for (size_t i = 0; i < L; i++)
        if ((unsigned char)tag[i] >= 0x80)
            return BL_EINVAL;
    /* State k: the text ends with tag[0..k) and with no longer start of the tag. A
     * byte c moves state k to the longest start of the tag that tag[0..k) c ends
     * with; the tag's last byte in state L-1 ends the rule. */
    char buf[160];
    int rc = 0;
    for (size_t k = 0; k < L && !rc; k++) {
        snprintf(buf, sizeof buf, k ? "\n%s-%zu ::= " : "\n%s ::= ", name, k);
        rc = bl_buf_add(b, buf, strlen(buf), 0) || gbnf_char(b, (unsigned char)tag[k]);
        if (!rc && k + 1 < L) {
            snprintf(buf, sizeof buf, " %s-%zu", name, k + 1);
            rc = bl_buf_add(b, buf, strlen(buf), 0);
        }
        char seen[128] = {0}, others[65];
        size_t n_others = 0;
        seen[(unsigned char)tag[k]] = 1;
        for (size_t i = 0; i < L && !rc; i++) {
            unsigned char c = (unsigned char)tag[i];
            if (seen[c])
                continue;
            seen[c] = 1;
            /* the next state after tag[0..k) c */
            size_t j = k + 1 < L ? k + 1 : L - 1;
            for (; j > 0; j--)
                if (tag[j - 1] == (char)c && !memcmp(tag, tag + k + 1 - j, j - 1))
                    break;
            if (j == 0)
                continue;
            others[n_others++] = (char)c;
            rc = bl_buf_add(b, " | ", 3, 0) || gbnf_char(b, c);
            if (!rc) {
                snprintf(buf, sizeof buf, " %s-%zu", name, j);
                rc = bl_buf_add(b, buf, strlen(buf), 0);
            }
        }
        /* every other character goes back to the start */
        rc = rc || bl_buf_add(b, " | [^", 5, 0) || gbnf_byte(b, (unsigned char)tag[k], 1);
        for (size_t i = 0; i < n_others && !rc; i++)
            rc = gbnf_byte(b, (unsigned char)others[i], 1);
        if (!rc) {
            snprintf(buf, sizeof buf, "] %s", name);
            rc = bl_buf_add(b, buf, strlen(buf), 0);
        }
    }
    return rc ? BL_ENOMEM : 0;
}

/* A rule name not in text (the converter's names come from the schema). */
static void unique_name(const char *text, const char *stem, char *out, size_t cap)
{
    snprintf(out, cap, "%s", stem);
    for (unsigned k = 2; strstr(text, out); k++)
        snprintf(out, cap, "%s%u", stem, k);
}

int rt__gen_grammar_wrap(const char *gbnf, int think, rt_chatfmt_t fmt, const char *body,
                         char **out, bl_err_t *err)
{
    *out = NULL;
    char rname[32], ws[32], thought[32];
    unique_name(gbnf, "wrapped-root", rname, sizeof rname);
    unique_name(gbnf, "wrap-ws", ws, sizeof ws);
    unique_name(gbnf, "wrap-thought", thought, sizeof thought);
    /* the grammar's root becomes an inner rule, references to it too (a schema's
     * $ref "#" means the schema, not the whole reply) */
    char *inner = rt__gen_gbnf_rename(gbnf, "", rname);
    if (!inner)
        return bl_err_set(err, BL_ENOMEM, "out of memory");
    const char *open, *close;
    rt_chatfmt_think_tags(fmt, &open, &close);
    const char *after = rt_chatfmt_think_next(fmt); /* harmony: the next message's start */
    bl_buf_t g = {0};
    int rc = bl_buf_add(&g, "root ::= ", 9, 0);
    if (!rc && think == 1)
        rc = bl_buf_add(&g, "( ", 2, 0) || rt__gen_gbnf_lit(&g, open, strlen(open)) ||
             bl_buf_add(&g, " ", 1, 0);
    if (!rc && think) {
        rc = bl_buf_add(&g, thought, strlen(thought), 0) || bl_buf_add(&g, " ", 1, 0) ||
             (*after && (rt__gen_gbnf_lit(&g, after, strlen(after)) || bl_buf_add(&g, " ", 1, 0)));
        if (!rc && think == 1)
            rc = bl_buf_add(&g, ")? ", 3, 0);
    }
    for (const char *p = body; !rc && *p; p++) {
        if (p[0] == '%' && (p[1] == 'R' || p[1] == 'W')) {
            const char *nm = p[1] == 'R' ? rname : ws;
            rc = bl_buf_add(&g, nm, strlen(nm), 0);
            p++;
        } else {
            rc = bl_buf_add(&g, p, 1, 0);
        }
    }
    /* The thought: any text up to the first close tag, which ends it (a thought of
     * .* would go on past its own end tag, so the constraint would never apply). */
    if (!rc && think)
        rc = rt__gen_gbnf_until(&g, thought, close);
    if (!rc) {
        char w[80];
        snprintf(w, sizeof w, "\n%s ::= [ \\t\\n]{0,20}\n", ws);
        rc = bl_buf_add(&g, w, strlen(w), 0) || bl_buf_add(&g, inner, strlen(inner), 0);
    }
    free(inner);
    if (rc) {
        bl_buf_free(&g);
        return bl_err_set(err, rc == BL_EINVAL ? BL_EINVAL : BL_ENOMEM,
                          rc == BL_EINVAL ? "the format's thought tags cannot be written as a "
                                            "grammar" : "out of memory");
    }
    *out = g.p;
    return 0;
}

/* What constrains the text: `grammar` (GBNF), `json_schema`, or `response_format`
 * json_object (with an optional `schema`) or json_schema (`json_schema.schema`);
 * one of them. A schema becomes GBNF (owned by p); the grammar is compiled here once
 * so that a bad one gets its 400 before the request queues. */
static int parse_constraint(const json_t *body, rt_gen_params_t *p, bl_err_t *err)
{
    const json_t *g = field(body, "grammar"), *js = field(body, "json_schema");
    const json_t *rf = field(body, "response_format"), *schema = NULL;
    const char *from = NULL;
    if (g && !json_is_string(g))
        return bl_err_set(err, BL_EINVAL, "'grammar' must be a string");
    if (g && json_string_length(g) == 0)
        g = NULL;
    if (js && !json_is_null(js)) {
        schema = js;
        from = "json_schema";
    }
    if (rf) {
        const json_t *t = json_is_object(rf) ? json_object_get(rf, "type") : NULL;
        if (!json_is_object(rf) || (t && !json_is_string(t)))
            return bl_err_set(err, BL_EINVAL, "'response_format' must be an object with a 'type'");
        const char *type = t ? json_string_value(t) : "text";
        const json_t *s = NULL;
        if (!strcmp(type, "json_object")) {
            s = json_object_get(rf, "schema");
            if (!s) /* any object */
                s = p->any_object = json_pack("{s:s}", "type", "object");
            if (!s)
                return bl_err_set(err, BL_ENOMEM, "out of memory");
        } else if (!strcmp(type, "json_schema")) {
            const json_t *j = json_object_get(rf, "json_schema");
            s = json_is_object(j) ? json_object_get(j, "schema") : NULL;
            if (!s)
                return bl_err_set(err, BL_EINVAL,
                                  "'response_format': type json_schema needs json_schema.schema");
        } else if (strcmp(type, "text") != 0) {
            return bl_err_set(err, BL_EINVAL,
                              "'response_format' of type \"%.64s\" is not supported (text, "
                              "json_object, json_schema)",
                              type);
        }
        if (s) {
            if (schema)
                return bl_err_set(err, BL_EINVAL,
                                  "give 'json_schema' or a JSON 'response_format', not both");
            schema = s;
            from = "response_format";
        }
    }
    if (g && schema)
        return bl_err_set(err, BL_EINVAL, "give 'grammar' or '%s', not both", from);
    const char *text = g ? json_string_value(g) : NULL;
    size_t len = g ? json_string_length(g) : 0;
    if (schema) {
        bl_err_t e2 = {0};
        int rc = rt_json_schema_to_gbnf(schema, &p->grammar, &e2);
        if (rc)
            return bl_err_set(err, rc == BL_ENOMEM ? BL_ENOMEM : BL_EINVAL, "'%s': %s", from, e2.msg);
        text = p->grammar;
        len = strlen(p->grammar);
    } else {
        from = "grammar";
    }
    if (!text)
        return 0;
    if (len > RT_GRAMMAR_MAX_BYTES)
        return bl_err_set(err, BL_EINVAL, "'%s'%s is %zu bytes of grammar; at most %d", from,
                          g ? "" : " becomes a grammar that", len, RT_GRAMMAR_MAX_BYTES);
    rt_grammar_t *compiled = NULL;
    bl_err_t e2 = {0};
    int rc = rt_grammar_parse(&compiled, text, len, &e2);
    rt_grammar_destroy(compiled);
    if (rc)
        return bl_err_set(err, rc == BL_ENOMEM ? BL_ENOMEM : BL_EINVAL, "'%s': %s", from, e2.msg);
    p->task.sampling.grammar = text;
    p->task.sampling.grammar_len = len;
    p->grammar_from = from;
    return 0;
}

int rt__gen_parse_params(const json_t *body, rt_gen_api_t api, const rt_gen_limits_t *lim,
                         rt_gen_params_t *p, bl_err_t *err)
{
    memset(p, 0, sizeof *p);
    if (lim->defaults)
        p->task = *lim->defaults;
    else
        rt_task_params_default(&p->task);
    p->task.n_predict = lim->n_predict_default >= 0 ? lim->n_predict_default : -1;
    p->fmt = lim->fmt;
    p->seed_req = p->task.sampling.seed == RT_SEED_RANDOM ? -1 : (int64_t)p->task.sampling.seed;
    int rc, found;
    int64_t iv;
    rt_sampler_params_t *s = &p->task.sampling;

    if (!json_is_object(body))
        return bl_err_set(err, BL_EINVAL, "the request body must be a JSON object");
    p->n_choices = 1;
    if (api == RT_GEN_API_OAI_CHAT || api == RT_GEN_API_OAI_CMPL) { /* several choices, one after another */
        int64_t n = 1, nc = 1;
        int f1 = 0, f2 = 0;
        if ((rc = get_int(body, "n", 1, RT_MAX_CHOICES, &n, &f1, err)) ||
            (rc = get_int(body, "n_cmpl", 1, RT_MAX_CHOICES, &nc, &f2, err)))
            goto fail;
        if (f1 && f2 && n != nc) {
            rc = bl_err_set(err, BL_EINVAL, "'n' and 'n_cmpl' differ");
            goto fail;
        }
        p->n_choices = (int)(f1 ? n : nc);
    }
    if ((rc = refuse_unsupported(body, api, err)))
        goto fail;
    if (api != RT_GEN_API_ANTHROPIC && (rc = parse_constraint(body, p, err)))
        goto fail;

    /* sampling */
    if ((rc = get_float(body, "temperature", &s->temp, err)) ||
        (rc = get_float(body, "top_p", &s->top_p, err)))
        goto fail;
    if ((rc = get_int(body, "top_k", INT32_MIN, INT32_MAX, &iv, &found, err)))
        goto fail;
    if (found)
        s->top_k = (int32_t)iv;
    if (api != RT_GEN_API_ANTHROPIC) {
        if ((rc = get_float(body, "min_p", &s->min_p, err)) ||
            (rc = get_float(body, "typical_p", &s->typical_p, err)) ||
            (rc = get_float(body, "repeat_penalty", &s->repeat_penalty, err)) ||
            (rc = get_float(body, "presence_penalty", &s->presence_penalty, err)) ||
            (rc = get_float(body, "frequency_penalty", &s->frequency_penalty, err)))
            goto fail;
        if ((rc = get_int(body, "repeat_last_n", -1, INT32_MAX, &iv, &found, err)))
            goto fail;
        if (found)
            s->penalty_last_n = (int32_t)iv;
        if ((rc = get_int(body, "min_keep", 0, INT32_MAX, &iv, &found, err)))
            goto fail;
        if (found)
            s->min_keep = (int32_t)iv;
        if ((rc = get_int(body, "seed", -1, UINT32_MAX, &iv, &found, err)))
            goto fail;
        if (found) {
            p->seed_req = iv;
            s->seed = iv < 0 ? RT_SEED_RANDOM : (uint32_t)iv;
        }
        if ((rc = parse_logit_bias(body, lim, p, err)) || (rc = parse_samplers(body, s, err)))
            goto fail;
        s->logit_bias = p->bias;
        s->n_logit_bias = p->n_bias;
    }

    /* the token limit: n_predict wins over max_completion_tokens over max_tokens, as
     * in llama-server; Anthropic's max_tokens is required */
    if (api == RT_GEN_API_ANTHROPIC) {
        if (!field(body, "max_tokens")) {
            rc = bl_err_set(err, BL_EINVAL, "'max_tokens' is required");
            goto fail;
        }
        if ((rc = get_int(body, "max_tokens", 1, INT64_MAX, &p->task.n_predict, NULL, err)))
            goto fail;
    } else {
        static const char *const limits[] = {"max_tokens", "max_completion_tokens", "n_predict"};
        for (size_t i = 0; i < 3; i++) {
            int is_native = i == 2; /* -1: no limit */
            if ((rc = get_int(body, limits[i], is_native ? -1 : 0, INT64_MAX, &iv, &found, err)))
                goto fail;
            if (found)
                p->task.n_predict = iv;
        }
    }
    if (p->task.n_predict > lim->n_ctx_slot && lim->n_ctx_slot > 0)
        p->task.n_predict = lim->n_ctx_slot; /* the context ends it there anyway */

    /* stop strings */
    if ((rc = parse_stop(body, api == RT_GEN_API_ANTHROPIC ? "stop_sequences" : "stop",
                         api == RT_GEN_API_ANTHROPIC, p, err)))
        goto fail;

    /* streaming */
    if ((rc = get_bool(body, "stream", &p->stream, err)))
        goto fail;
    json_t *so = field(body, "stream_options");
    if (so && api != RT_GEN_API_ANTHROPIC) {
        if (!json_is_object(so)) {
            rc = bl_err_set(err, BL_EINVAL, "'stream_options' must be an object");
            goto fail;
        }
        if ((rc = get_bool(so, "include_usage", &p->include_usage, err)))
            goto fail;
    }
    if (api == RT_GEN_API_ANTHROPIC)
        goto check;

    /* probabilities */
    if (api == RT_GEN_API_OAI_CHAT) {
        int lp = 0, parallel = 1;
        if ((rc = get_bool(body, "parallel_tool_calls", &parallel, err)))
            goto fail;
        p->one_call = !parallel;
        if ((rc = get_bool(body, "logprobs", &lp, err)))
            goto fail;
        if ((rc = get_int(body, "top_logprobs", 0, RT_MAX_N_PROBS, &iv, &found, err)))
            goto fail;
        if (found && !lp) {
            rc = bl_err_set(err, BL_EINVAL, "top_logprobs requires logprobs to be set to true");
            goto fail;
        }
        if (lp) {
            p->want_probs = 1;
            p->task.n_probs = found ? (int)iv : RT_MAX_N_PROBS; /* llama-server's default */
        }
    } else if (api == RT_GEN_API_OAI_CMPL && field(body, "logprobs") && !field(body, "n_probs")) {
        if ((rc = get_int(body, "logprobs", 0, RT_MAX_N_PROBS, &iv, NULL, err)))
            goto fail;
        p->want_probs = 1;
        p->task.n_probs = (int)iv;
    }
    if ((rc = get_int(body, "n_probs", 0, RT_MAX_N_PROBS, &iv, &found, err)))
        goto fail;
    if (found) {
        p->task.n_probs = (int)iv;
        p->want_probs = iv > 0;
    }
    if ((rc = get_bool(body, "post_sampling_probs", &p->post_sampling_probs, err)))
        goto fail;

    /* llama-server's slot and cache controls */
    if ((rc = get_bool(body, "cache_prompt", &p->task.cache_prompt, err)) ||
        (rc = get_bool(body, "ignore_eos", &p->task.ignore_eos, err)) ||
        (rc = get_bool(body, "return_tokens", &p->return_tokens, err)) ||
        (rc = get_bool(body, "timings_per_token", &p->timings_per_token, err)) ||
        (rc = get_bool(body, "return_progress", &p->task.return_progress, err)))
        goto fail;
    if (api == RT_GEN_API_ANTHROPIC)
        p->task.return_progress = 0; /* the Anthropic stream has no such event */
    if ((rc = get_int(body, "id_slot", -1, lim->n_slots > 0 ? lim->n_slots - 1 : INT32_MAX, &iv,
                      &found, err)))
        goto fail;
    if (found)
        p->task.slot_id = (int32_t)iv;
    if ((rc = get_int(body, "t_max_predict_ms", 0, INT64_MAX / 2, &p->task.t_max_predict_ms, NULL,
                      err)))
        goto fail;
    if ((rc = get_int(body, "n_indent", 0, INT32_MAX, &iv, &found, err)))
        goto fail;
    if (found)
        p->task.n_indent = (int32_t)iv;
    /* speculative decoding's limits for this request (llama-server's keys) */
    static const char *const spec_keys[2] = {"speculative.n_max", "speculative.n_min"};
    int32_t *const spec_vals[2] = {&p->task.spec_n_max, &p->task.spec_n_min};
    for (int k = 0; k < 2; k++) {
        if ((rc = get_int(body, spec_keys[k], 0, INT32_MAX, &iv, &found, err)))
            goto fail;
        if (found)
            *spec_vals[k] = (int32_t)iv;
    }
    double pm;
    if ((rc = get_double(body, "speculative.p_min", &pm, &found, err)))
        goto fail;
    if (found && !(pm >= 0.0 && pm <= 1.0)) {
        rc = bl_err_set(err, BL_EINVAL, "'speculative.p_min' must be in 0..1");
        goto fail;
    }
    if (found)
        p->task.spec_p_min = (float)pm;
    const json_t *rf;
    if (api == RT_GEN_API_NATIVE && (rf = field(body, "response_fields"))) {
        size_t i;
        json_t *e;
        if (!json_is_array(rf)) {
            rc = bl_err_set(err, BL_EINVAL, "'response_fields' must be an array of strings");
            goto fail;
        }
        json_array_foreach(rf, i, e) {
            if (!json_is_string(e)) {
                rc = bl_err_set(err, BL_EINVAL, "'response_fields'[%zu] must be a string", i);
                goto fail;
            }
        }
        p->response_fields = json_array_size(rf) ? rf : NULL;
    }

check:
    if ((rc = rt_sampler_params_check(s, (int32_t)lim->n_vocab, err)))
        goto fail;
    return 0;
fail:
    rt__gen_params_fini(p);
    return rc;
}

void rt__gen_params_fini(rt_gen_params_t *p)
{
    free(p->grammar);
    p->grammar = NULL;
    json_decref(p->any_object);
    p->any_object = NULL;
    p->task.sampling.grammar = NULL;
    p->task.sampling.grammar_len = 0;
    free(p->bias);
    p->bias = NULL;
    p->n_bias = p->cap_bias = 0;
    p->task.sampling.logit_bias = NULL;
    p->task.sampling.n_logit_bias = 0;
}

/* ---------------------------------------------------------------------------- */
/* prompts                                                                        */
/* ---------------------------------------------------------------------------- */

/* Appends a string or an id of a prompt array; first: the first element, before
 * which the vocabulary's special tokens go. */
static int prompt_piece(const json_t *v, int first, rt_tokenizer_t *tok, int64_t n_vocab,
                        rt_tokens_t *out, bl_err_t *err)
{
    if (json_is_string(v)) {
        unsigned flags = RT_TOKENIZE_PARSE_SPECIAL | (first ? RT_TOKENIZE_ADD_SPECIAL : 0);
        bl_err_t terr;
        int rc = rt_tokenize(tok, json_string_value(v), json_string_length(v), flags, out, &terr);
        if (rc)
            return bl_err_set(err, rc == BL_ENOMEM ? BL_ENOMEM : BL_EINVAL, "\"prompt\": %s",
                              terr.msg);
        return 0;
    }
    if (json_is_integer(v)) {
        json_int_t id = json_integer_value(v);
        if (id < 0 || id >= n_vocab)
            return bl_err_set(err, BL_EINVAL,
                              "\"prompt\": token %lld is outside the vocabulary (0..%lld)",
                              (long long)id, (long long)n_vocab - 1);
        return rt_tokens_push(out, (int32_t)id) ? bl_err_set(err, BL_ENOMEM, "out of memory") : 0;
    }
    return bl_err_set(err, BL_EINVAL,
                      "\"prompt\" elements must be a string, a list of tokens, a JSON object "
                      "containing a prompt string, or a list of mixed strings & tokens.");
}

int rt__gen_prompt_tokens(const json_t *prompt, rt_tokenizer_t *tok, int64_t n_vocab,
                          rt_tokens_t *out, bl_err_t *err)
{
    if (!prompt || json_is_null(prompt))
        return bl_err_set(err, BL_EINVAL, "\"prompt\" is required");
    /* one prompt inside an array of prompts: llama-server answers several prompts with
     * several results; one is all this server answers */
    if (json_is_array(prompt) && json_array_size(prompt) >= 1) {
        json_t *e0 = json_array_get(prompt, 0);
        int nested = json_is_array(e0) || json_is_object(e0);
        int all_strings = 1;
        size_t i;
        json_t *e;
        json_array_foreach(prompt, i, e) all_strings &= json_is_string(e);
        if (nested || (all_strings && json_array_size(prompt) > 1)) {
            if (json_array_size(prompt) > 1)
                return bl_err_set(err, BL_EINVAL,
                                  "\"prompt\": several prompts in one request are not supported");
            prompt = e0;
        }
    }
    if (json_is_object(prompt)) {
        if (field(prompt, "multimodal_data"))
            return bl_err_set(err, BL_EINVAL,
                              "\"prompt\": multimodal_data is not supported (no media model)");
        json_t *ps = json_object_get(prompt, "prompt_string");
        if (!ps)
            return bl_err_set(err, BL_EINVAL, "\"prompt\": the object has no prompt_string");
        prompt = ps;
        if (json_is_object(prompt))
            return bl_err_set(err, BL_EINVAL, "\"prompt\": prompt_string must be a string or ids");
    }
    if (json_is_string(prompt))
        return prompt_piece(prompt, 1, tok, n_vocab, out, err);
    if (!json_is_array(prompt))
        return bl_err_set(err, BL_EINVAL,
                          "\"prompt\" must be a string, an array of token ids, or a mixed array");
    size_t i;
    json_t *e;
    json_array_foreach(prompt, i, e) {
        int rc = prompt_piece(e, i == 0, tok, n_vocab, out, err);
        if (rc)
            return rc;
    }
    return 0;
}

/* ---------------------------------------------------------------------------- */
/* chat messages                                                                  */
/* ---------------------------------------------------------------------------- */

/* The text of a content value: a string, null, or text parts joined with "\n" (as
 * llama-server joins them for templates that take strings). */
static int content_text(const json_t *c, size_t mi, rt_gen_buf_t *out, bl_err_t *err)
{
    if (!c || json_is_null(c))
        return rt__gen_buf_add(out, "", 0) ? bl_err_set(err, BL_ENOMEM, "out of memory") : 0;
    if (json_is_string(c))
        return rt__gen_buf_add(out, json_string_value(c), json_string_length(c))
                   ? bl_err_set(err, BL_ENOMEM, "out of memory")
                   : 0;
    if (!json_is_array(c))
        return bl_err_set(err, BL_EINVAL,
                          "messages[%zu]: expected 'content' to be a string or an array", mi);
    size_t j, n_text = 0;
    json_t *part;
    if (rt__gen_buf_add(out, "", 0))
        return bl_err_set(err, BL_ENOMEM, "out of memory");
    json_array_foreach(c, j, part) {
        json_t *type = json_is_object(part) ? json_object_get(part, "type") : NULL;
        if (!json_is_string(type))
            return bl_err_set(err, BL_EINVAL,
                              "messages[%zu].content[%zu]: each part must be an object with a "
                              "string 'type'", mi, j);
        const char *t = json_string_value(type);
        if (strcmp(t, "text") != 0) {
            if (!strcmp(t, "image_url") || !strcmp(t, "image"))
                return bl_err_set(err, BL_EINVAL,
                                  "messages[%zu].content[%zu]: image input is not supported", mi,
                                  j);
            if (!strcmp(t, "input_audio") || !strcmp(t, "audio"))
                return bl_err_set(err, BL_EINVAL,
                                  "messages[%zu].content[%zu]: audio input is not supported", mi,
                                  j);
            return bl_err_set(err, BL_EINVAL,
                              "messages[%zu].content[%zu]: unsupported content[].type \"%.64s\"",
                              mi, j, t);
        }
        json_t *text = json_object_get(part, "text");
        if (!json_is_string(text))
            return bl_err_set(err, BL_EINVAL,
                              "messages[%zu].content[%zu]: a text part needs a string 'text'", mi,
                              j);
        if ((n_text++ && rt__gen_buf_add(out, "\n", 1)) ||
            rt__gen_buf_add(out, json_string_value(text), json_string_length(text)))
            return bl_err_set(err, BL_ENOMEM, "out of memory");
    }
    return 0;
}

int rt__gen_chat_messages(const json_t *messages, json_t **out, rt_gen_buf_t *prefill,
                          bl_err_t *err)
{
    *out = NULL;
    if (prefill)
        rt__gen_buf_free(prefill);
    if (!messages || json_is_null(messages))
        return bl_err_set(err, BL_EINVAL, "'messages' is required");
    if (!json_is_array(messages))
        return bl_err_set(err, BL_EINVAL, "Expected 'messages' to be an array");
    if (json_array_size(messages) == 0)
        return bl_err_set(err, BL_EINVAL, "'messages' must not be empty");
    json_t *arr = json_array();
    if (!arr)
        return bl_err_set(err, BL_ENOMEM, "out of memory");
    int rc = 0;
    size_t i, n = json_array_size(messages);
    json_t *m, *calls = NULL; /* the message's tool_calls until its object takes them */
    rt_gen_buf_t text = {0};
    json_array_foreach(messages, i, m) {
        if (!json_is_object(m)) {
            rc = bl_err_set(err, BL_EINVAL, "messages[%zu] must be an object", i);
            goto fail;
        }
        json_t *role = json_object_get(m, "role");
        if (!json_is_string(role)) {
            rc = bl_err_set(err, BL_EINVAL, "messages[%zu]: 'role' must be a string", i);
            goto fail;
        }
        const char *r = json_string_value(role);
        int assistant = !strcmp(r, "assistant");
        /* developer is OpenAI's newer name for system; templates know only system */
        if (!strcmp(r, "developer"))
            r = "system";
        else if (strcmp(r, "system") && strcmp(r, "user") && !assistant && strcmp(r, "tool")) {
            rc = bl_err_set(err, BL_EINVAL,
                            "messages[%zu]: unknown role \"%.64s\" (system, developer, user, "
                            "assistant or tool)", i, r);
            goto fail;
        }
        json_t *content = json_object_get(m, "content");
        json_t *tc = field(m, "tool_calls");
        if (tc && !assistant) {
            rc = bl_err_set(err, BL_EINVAL, "messages[%zu]: only assistant messages carry "
                            "'tool_calls'", i);
            goto fail;
        }
        if (tc && json_array_size(tc) > 0 &&
            (rc = rt__gen_message_tool_calls(tc, i, &calls, err)))
            goto fail;
        if (!content && !assistant) {
            rc = bl_err_set(err, BL_EINVAL,
                            "messages[%zu]: all non-assistant messages must contain 'content'", i);
            goto fail;
        }
        bl_buf_reset(&text);
        if ((rc = content_text(content, i, &text, err)))
            goto fail;
        if (prefill && assistant && i + 1 == n && !calls) {
            /* a last assistant message is a prefill: the reply continues it */
            if (i > 0) {
                json_t *prev = json_object_get(json_array_get(messages, i - 1), "role");
                if (json_is_string(prev) && !strcmp(json_string_value(prev), "assistant")) {
                    rc = bl_err_set(err, BL_EINVAL,
                                    "Cannot have 2 or more assistant messages at the end of the "
                                    "list.");
                    goto fail;
                }
            }
            if (rt__gen_buf_add(prefill, text.p, text.n)) {
                rc = bl_err_set(err, BL_ENOMEM, "out of memory");
                goto fail;
            }
            break;
        }
        json_t *o = json_object();
        if (!o || json_array_append_new(arr, o) ||
            json_object_set_new(o, "role", json_string(r)) ||
            json_object_set_new(o, "content", json_stringn(text.p, text.n))) {
            rc = bl_err_set(err, BL_ENOMEM, "out of memory");
            goto fail;
        }
        if (calls) {
            int bad = json_object_set_new(o, "tool_calls", calls); /* takes calls either way */
            calls = NULL;
            if (bad) {
                rc = bl_err_set(err, BL_ENOMEM, "out of memory");
                goto fail;
            }
        }
        static const char *const keep[] = {"name", "tool_call_id", "reasoning_content"};
        for (size_t k = 0; k < 3; k++) {
            json_t *v = field(m, keep[k]);
            if (!v)
                continue;
            if (!json_is_string(v)) {
                rc = bl_err_set(err, BL_EINVAL, "messages[%zu]: '%s' must be a string", i,
                                keep[k]);
                goto fail;
            }
            if (json_object_set(o, keep[k], v)) {
                rc = bl_err_set(err, BL_ENOMEM, "out of memory");
                goto fail;
            }
        }
    }
    rt__gen_buf_free(&text);
    *out = arr;
    return 0;
fail:
    rt__gen_buf_free(&text);
    json_decref(calls);
    json_decref(arr);
    if (prefill)
        rt__gen_buf_free(prefill);
    return rc;
}

int rt__gen_chat_options(const rt_app_t *app, const json_t *body, json_t **kwargs, int *reasoning,
                         int *tools, const char **force, bl_err_t *err)
{
    *kwargs = NULL;
    *reasoning = app->reasoning; /* llama-server's default (auto) splits <think> */
    if (tools)
        *tools = 0;
    if (force)
        *force = NULL;
    json_t *v, *tool_list = field(body, "tools");
    int rc;
    if (tool_list && (rc = rt__gen_check_tools(tool_list, err)))
        return rc;
    int use_tools = tool_list && json_array_size(tool_list) > 0;
    if (app->no_jinja && use_tools) /* llama-server without Jinja */
        return bl_err_set(err, BL_EINVAL, "tools param requires --jinja flag");
    if ((v = field(body, "tool_choice"))) {
        if (app->no_jinja && !(json_is_string(v) && !strcmp(json_string_value(v), "auto")))
            return bl_err_set(err, BL_EINVAL, "tool_choice param requires --jinja flag");
        /* "none", "auto", "required", or {"type": "function", "function": {"name"}} */
        const char *c = json_string_value(v), *named = NULL;
        if (json_is_object(v)) {
            json_t *fn = json_object_get(v, "function");
            const char *type = json_string_value(json_object_get(v, "type"));
            named = json_string_value(json_object_get(fn, "name"));
            if (!type || strcmp(type, "function") || !named)
                return bl_err_set(err, BL_EINVAL, "'tool_choice' as an object must be "
                                                  "{\"type\": \"function\", \"function\": {\"name\"}}");
        } else if (!c || (strcmp(c, "none") && strcmp(c, "auto") && strcmp(c, "required"))) {
            return bl_err_set(err, BL_EINVAL, "'tool_choice' must be \"none\", \"auto\", "
                                              "\"required\" or a named function");
        }
        if ((named || !strcmp(c, "required")) && !use_tools)
            return bl_err_set(err, BL_EINVAL, "'tool_choice' forces a call, but 'tools' is empty");
        if (force && (named || !strcmp(c, "required")))
            *force = named ? named : ""; /* "": any of the tools */
        use_tools &= !c || strcmp(c, "none") != 0;
    }
    if ((v = field(body, "parallel_tool_calls")) && !json_is_boolean(v))
        return bl_err_set(err, BL_EINVAL, "'parallel_tool_calls' must be a boolean");
    if (field(body, "functions"))
        return bl_err_set(err, BL_EINVAL, "'functions' is not supported");
    if (field(body, "function_call"))
        return bl_err_set(err, BL_EINVAL, "'function_call' is not supported");
    if ((v = field(body, "reasoning_format"))) {
        if (!json_is_string(v))
            return bl_err_set(err, BL_EINVAL, "'reasoning_format' must be a string");
        const char *f = json_string_value(v);
        *reasoning = !strcmp(f, "none") ? 0 : !strcmp(f, "deepseek-legacy") ? RT_REASONING_LEGACY : 1;
        if (strcmp(f, "none") && strcmp(f, "auto") && strcmp(f, "deepseek") &&
            strcmp(f, "deepseek-legacy"))
            return bl_err_set(err, BL_EINVAL,
                              "'reasoning_format' \"%.64s\" is not supported (none, auto, "
                              "deepseek)", f);
    }
    if ((v = field(body, "chat_template_kwargs"))) {
        if (!json_is_object(v))
            return bl_err_set(err, BL_EINVAL, "'chat_template_kwargs' must be an object");
        json_t *et = json_object_get(v, "enable_thinking");
        if (et && !json_is_boolean(et))
            return bl_err_set(err, BL_EINVAL,
                              "invalid type for \"enable_thinking\" (expected boolean)");
        *kwargs = json_deep_copy(v);
        if (!*kwargs)
            return bl_err_set(err, BL_ENOMEM, "out of memory");
    }
    if ((v = field(body, "reasoning_effort"))) {
        if (!json_is_string(v)) {
            json_decref(*kwargs);
            *kwargs = NULL;
            return bl_err_set(err, BL_EINVAL, "'reasoning_effort' must be a string");
        }
        /* llama-server: "none" turns thinking off; any value reaches the template */
        if (!*kwargs && !(*kwargs = json_object()))
            return bl_err_set(err, BL_ENOMEM, "out of memory");
        if (json_object_set(*kwargs, "reasoning_effort", v) ||
            (!strcmp(json_string_value(v), "none") && !json_object_get(*kwargs, "enable_thinking") &&
             json_object_set_new(*kwargs, "enable_thinking", json_false()))) {
            json_decref(*kwargs);
            *kwargs = NULL;
            return bl_err_set(err, BL_ENOMEM, "out of memory");
        }
    }
    if (use_tools) { /* the template lists them; the reply's calls are parsed */
        if ((!*kwargs && !(*kwargs = json_object())) ||
            json_object_set(*kwargs, "tools", tool_list)) {
            json_decref(*kwargs);
            *kwargs = NULL;
            return bl_err_set(err, BL_ENOMEM, "out of memory");
        }
        if (tools)
            *tools = !app->skip_chat_parsing;
    }
    return 0;
}

static int is_ws(char c)
{
    return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

int rt__gen_render_chat(rt_app_t *app, const json_t *messages, const json_t *kwargs,
                        int add_generation_prompt, const rt_gen_buf_t *prefill, char **out,
                        size_t *out_len, int *think_open, bl_err_t *err)
{
    *out = NULL;
    *think_open = 0;
    if (!app->tpl)
        return bl_err_set(err, BL_EINVAL, "the server has no chat template");
    char *text;
    size_t len;
    bl_err_t terr;
    /* the server's template arguments, then the request's over them */
    json_t *merged = NULL;
    if (app->tpl_kwargs) {
        if (!(merged = json_deep_copy(app->tpl_kwargs)) ||
            (kwargs && json_object_update(merged, (json_t *)kwargs))) {
            json_decref(merged);
            return bl_err_set(err, BL_ENOMEM, "out of memory");
        }
        kwargs = merged;
    }
    /* a template that walks the arguments' items gets them as objects, as the model
     * wrote them; one that prints them gets the text */
    json_t *conv = app->object_args ? rt_chat_args_as_objects(messages) : NULL;
    if (app->object_args && !conv) {
        json_decref(merged);
        return bl_err_set(err, BL_ENOMEM, "out of memory");
    }
    int rc = rt_chat_render(app->tpl, app->tok, conv ? conv : messages, add_generation_prompt, kwargs, &text,
                            &len, &terr);
    json_decref(conv);
    json_decref(merged);
    if (rc)
        return bl_err_set(err, rc, "chat template: %s", terr.msg);
    /* a template that writes bos_token itself (DeepSeek's, Llama 3's) would give a
     * tokenizer that adds one two of them: the text's is dropped, as llama.cpp does */
    if (rt_tokenizer_add_bos(app->tok) && rt_tokenizer_bos(app->tok) >= 0) {
        const rt_str_t b = rt_tokenizer_token_text(app->tok, rt_tokenizer_bos(app->tok));
        if (b.ptr && b.len > 0 && len >= b.len && !memcmp(text, b.ptr, b.len)) {
            memmove(text, text + b.len, len - b.len + 1);
            len -= b.len;
        }
    }
    if (prefill && prefill->n) {
        size_t pl = prefill->n;
        char *t = realloc(text, len + pl + 1);
        if (!t) {
            free(text);
            return bl_err_set(err, BL_ENOMEM, "out of memory");
        }
        memcpy(t + len, prefill->p, pl + 1);
        text = t;
        len += pl;
    } else {
        /* a template that opens <think> in the generation prompt: the model's first
         * words are reasoning */
        const char *open, *close;
        rt_chatfmt_think_tags(app->chatfmt, &open, &close);
        size_t e = len, ol = strlen(open);
        while (e > 0 && is_ws(text[e - 1]))
            e--;
        *think_open = e >= ol && !memcmp(text + e - ol, open, ol);
    }
    *out = text;
    *out_len = len;
    return 0;
}

/* ---------------------------------------------------------------------------- */
/* <think> splitting                                                              */
/* ---------------------------------------------------------------------------- */

enum {
    TS_START = 0,    /* nothing decided: a <think> may still come (after whitespace) */
    TS_THINK_LEAD,   /* inside the span, before its first non-space */
    TS_THINK,        /* inside the span */
    TS_CONTENT_LEAD, /* after </think>, before the first non-space */
    TS_CONTENT,      /* plain content to the end */
};

void rt__gen_think_init(rt_gen_think_t *t, int open, rt_chatfmt_t fmt)
{
    t->state = open ? TS_THINK_LEAD : TS_START;
    memset(&t->hold, 0, sizeof t->hold);
    rt_chatfmt_think_tags(fmt, &t->open, &t->close);
}

void rt__gen_think_fini(rt_gen_think_t *t)
{
    rt__gen_buf_free(&t->hold);
}

int rt__gen_buf_move(rt_gen_buf_t *from, size_t n, rt_gen_buf_t *to)
{
    if (n && rt__gen_buf_add(to, from->p, n))
        return BL_ENOMEM;
    rt__gen_buf_consume(from, n);
    return 0;
}

size_t rt__gen_tag_tail(const char *s, size_t n, const char *tag, size_t tag_len)
{
    for (size_t k = n < tag_len - 1 ? n : tag_len - 1; k > 0; k--)
        if (!memcmp(s + n - k, tag, k))
            return k;
    return 0;
}

int rt__gen_think_feed(rt_gen_think_t *t, const char *s, size_t n, rt_gen_buf_t *reason,
                       rt_gen_buf_t *content)
{
    if (t->state == TS_CONTENT && t->hold.n == 0)
        return n ? rt__gen_buf_add(content, s, n) : 0;
    if (rt__gen_buf_add(&t->hold, s, n))
        return BL_ENOMEM;
    rt_gen_buf_t *h = &t->hold;
    for (;;) {
        size_t i = 0;
        switch (t->state) {
        case TS_START: {
            while (i < h->n && is_ws(h->p[i]))
                i++;
            if (i == h->n)
                return 0;
            const size_t ol = strlen(t->open);
            size_t rem = h->n - i, m = rem < ol ? rem : ol;
            if (memcmp(h->p + i, t->open, m) != 0) {
                t->state = TS_CONTENT;
                continue;
            }
            if (rem < ol)
                return 0;
            rt__gen_buf_consume(h, i + ol);
            t->state = TS_THINK_LEAD;
            continue;
        }
        case TS_THINK_LEAD:
        case TS_CONTENT_LEAD:
            while (i < h->n && is_ws(h->p[i]))
                i++;
            rt__gen_buf_consume(h, i);
            if (h->n == 0)
                return 0;
            t->state = t->state == TS_THINK_LEAD ? TS_THINK : TS_CONTENT;
            continue;
        case TS_THINK: {
            const size_t cl = strlen(t->close);
            char *close = memmem(h->p, h->n, t->close, cl);
            if (close) {
                size_t k = (size_t)(close - h->p), e = k;
                while (e > 0 && is_ws(h->p[e - 1]))
                    e--;
                if (rt__gen_buf_move(h, e, reason))
                    return BL_ENOMEM;
                rt__gen_buf_consume(h, k - e + cl);
                t->state = TS_CONTENT_LEAD;
                continue;
            }
            /* keep a tail that may begin </think>, and trailing whitespace, which is
             * dropped if the span closes after it */
            size_t cut = h->n - rt__gen_tag_tail(h->p, h->n, t->close, cl);
            while (cut > 0 && is_ws(h->p[cut - 1]))
                cut--;
            return rt__gen_buf_move(h, cut, reason);
        }
        default: /* TS_CONTENT */
            return rt__gen_buf_move(h, h->n, content);
        }
    }
}

int rt__gen_think_finish(rt_gen_think_t *t, rt_gen_buf_t *reason, rt_gen_buf_t *content)
{
    rt_gen_buf_t *h = &t->hold;
    int rc = 0;
    switch (t->state) {
    case TS_START:
    case TS_CONTENT:
        rc = rt__gen_buf_move(h, h->n, content);
        break;
    case TS_THINK: {
        size_t e = h->n;
        while (e > 0 && is_ws(h->p[e - 1]))
            e--;
        rc = rt__gen_buf_move(h, e, reason);
        break;
    }
    default:
        break;
    }
    rt__gen_buf_consume(h, h->n);
    t->state = TS_CONTENT;
    return rc;
}

/* ---------------------------------------------------------------------------- */
/* reply pieces                                                                   */
/* ---------------------------------------------------------------------------- */

/* The length of the valid UTF-8 sequence at s[0..n), or 0 when it is not one. */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t len;
    unsigned min;
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        len = 2, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF)
        len = 3, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4)
        len = 4, min = 0x10000;
    else
        return 0;
    if (n < len)
        return 0;
    unsigned cp = c & (0x3F >> (len - 1));
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return len;
}

json_t *rt__gen_json_piece(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    /* an incomplete character at the end: dropped, as llama-server's validate_utf8 */
    size_t end = n;
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        unsigned c = u[n - back];
        if ((c & 0xC0) == 0x80)
            continue;
        size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        if (need > back)
            end = n - back;
        break;
    }
    rt_gen_buf_t b = {0};
    size_t i = 0;
    while (i < end) {
        size_t l = utf8_seq(u + i, end - i);
        if (l) {
            if (rt__gen_buf_add(&b, s + i, l))
                goto oom;
            i += l;
        } else {
            if (rt__gen_buf_add(&b, "\xEF\xBF\xBD", 3))
                goto oom;
            i++;
        }
    }
    json_t *j = json_stringn(b.p ? b.p : "", b.n);
    rt__gen_buf_free(&b);
    return j;
oom:
    rt__gen_buf_free(&b);
    return NULL;
}

json_t *rt__gen_json_real(double x)
{
    if (isnan(x) || x < -FLT_MAX)
        x = -FLT_MAX;
    else if (x > FLT_MAX)
        x = FLT_MAX;
    return json_real(x);
}

json_t *rt__gen_timings_json(const rt_timings_t *t)
{
    int64_t prompt_n = t->n_prompt - t->n_cached;
    if (prompt_n < 0)
        prompt_n = 0;
    double ppt = prompt_n > 0 ? t->prompt_ms / (double)prompt_n : 0.0;
    double pps = t->prompt_ms > 0 ? 1e3 / t->prompt_ms * (double)prompt_n : 0.0;
    double gpt = t->n_predicted > 0 ? t->predicted_ms / (double)t->n_predicted : 0.0;
    double gps = t->predicted_ms > 0 ? 1e3 / t->predicted_ms * (double)t->n_predicted : 0.0;
    json_t *j = json_pack("{s:I, s:I, s:o, s:o, s:o, s:I, s:o, s:o, s:o}", "cache_n",
                          (json_int_t)t->n_cached, "prompt_n", (json_int_t)prompt_n, "prompt_ms",
                          rt__gen_json_real(t->prompt_ms), "prompt_per_token_ms", rt__gen_json_real(ppt),
                          "prompt_per_second", rt__gen_json_real(pps), "predicted_n",
                          (json_int_t)t->n_predicted, "predicted_ms", rt__gen_json_real(t->predicted_ms),
                          "predicted_per_token_ms", rt__gen_json_real(gpt), "predicted_per_second",
                          rt__gen_json_real(gps));
    if (j && t->n_drafted > 0) { /* speculative decoding, as llama-server reports it */
        json_object_set_new(j, "draft_n", json_integer((json_int_t)t->n_drafted));
        json_object_set_new(j, "draft_n_accepted", json_integer((json_int_t)t->n_accepted));
    }
    return j;
}

static json_t *bytes_json(const char *s, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++)
        if (json_array_append_new(a, json_integer((unsigned char)s[i]))) {
            json_decref(a);
            return NULL;
        }
    return a;
}

/* {id, token, bytes, logprob|prob} of one candidate. */
static json_t *prob_one(const rt_tokenizer_t *tok, const rt_token_prob_t *p, int post)
{
    rt_str_t piece = rt_tokenizer_piece(tok, p->id);
    const char *s = piece.ptr ? piece.ptr : "";
    size_t n = piece.ptr ? piece.len : 0;
    return json_pack("{s:i, s:o, s:o, s:o}", "id", (int)p->id, "token", rt__gen_json_piece(s, n),
                     "bytes", bytes_json(s, n), post ? "prob" : "logprob",
                     rt__gen_json_real(post ? p->prob : p->logprob));
}

json_t *rt__gen_prob_entry(const rt_tokenizer_t *tok, const rt_event_t *ev, int post)
{
    json_t *e = prob_one(tok, &ev->sampled, post);
    json_t *top = json_array();
    if (!e || !top)
        goto fail;
    for (int i = 0; i < ev->n_probs_out; i++)
        if (json_array_append_new(top, prob_one(tok, &ev->probs[i], post)))
            goto fail;
    if (json_object_set_new(e, post ? "top_probs" : "top_logprobs", top))
        goto fail_e;
    return e;
fail:
    json_decref(top);
fail_e:
    json_decref(e);
    return NULL;
}

char *rt__gen_sse(const char *event, json_t *j, size_t *len)
{
    *len = 0;
    if (!j)
        return NULL;
    char *body = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!body)
        return NULL;
    size_t bl = strlen(body), el = event ? strlen(event) : 0;
    size_t cap = bl + el + 32;
    char *out = malloc(cap);
    if (out) {
        int n = event ? snprintf(out, cap, "event: %s\ndata: %s\n\n", event, body)
                      : snprintf(out, cap, "data: %s\n\n", body);
        *len = (size_t)n;
    }
    free(body);
    return out;
}

void rt__gen_random_id(char *out, size_t cap, const char *prefix)
{
    static const char alnum[] = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    unsigned char r[32];
    if (getrandom(r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) {
        /* no entropy yet (early boot): ids need only be unlikely to repeat */
        static uint64_t x;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        x ^= (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uint64_t)getpid();
        for (size_t i = 0; i < sizeof r; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            r[i] = (unsigned char)x;
        }
    }
    size_t pl = strlen(prefix);
    if (cap < pl + 33) {
        if (cap)
            out[0] = '\0';
        return;
    }
    memcpy(out, prefix, pl);
    for (size_t i = 0; i < 32; i++)
        out[pl + i] = alnum[r[i] % 62];
    out[pl + 32] = '\0';
}

const char *rt__gen_finish_reason(rt_stop_type_t s)
{
    return s == RT_STOP_EOS || s == RT_STOP_WORD ? "stop" : "length";
}

const char *rt__gen_anthropic_stop_reason(rt_stop_type_t s)
{
    return s == RT_STOP_EOS ? "end_turn" : s == RT_STOP_WORD ? "stop_sequence" : "max_tokens";
}

const char *rt__gen_stop_type_name(rt_stop_type_t s)
{
    switch (s) {
    case RT_STOP_EOS:
        return "eos";
    case RT_STOP_WORD:
        return "word";
    case RT_STOP_LIMIT:
        return "limit";
    default:
        return "none";
    }
}

/* ---------------------------------------------------------------------------- */
/* errors                                                                         */
/* ---------------------------------------------------------------------------- */

/* Anthropic's error type for a status. */

static void send_error_v(rt_req_t *r, rt_gen_api_t api, int status, const char *type,
                         const char *fmt, va_list ap)
{
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    if (api == RT_GEN_API_ANTHROPIC) {
        json_t *j = rt_http_error_json(status, type, msg, 1);
        if (j) {
            rt_req_send_json(r, status, j);
            return;
        }
    }
    rt_req_send_error(r, status, type, "%s", msg);
}

void rt__gen_send_error(rt_req_t *r, rt_gen_api_t api, int status, const char *type,
                        const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    send_error_v(r, api, status, type, fmt, ap);
    va_end(ap);
}

int rt__gen_unavailable(rt_req_t *r, int anthropic)
{
    rt_app_t *app = rt_req_app(r);
    rt_gen_api_t api = anthropic ? RT_GEN_API_ANTHROPIC : RT_GEN_API_NATIVE;
    if (app->loading) {
        rt__gen_send_error(r, api, 503, "unavailable_error", "Loading model");
        return 1;
    }
    char down[1024];
    if (rt_app_down(app, down, sizeof down)) {
        rt__gen_send_error(r, api, 503, "unavailable_error", "%s", down);
        return 1;
    }
    if (app->stopping) {
        rt__gen_send_error(r, api, 503, "unavailable_error", "server is shutting down");
        return 1;
    }
    return 0;
}

/* llama-server's answer to a prompt longer than a slot's context. */
/* at_least: n_prompt is a bound from the prompt's length (it was not tokenized). */
static void send_exceed_context(rt_req_t *r, rt_gen_api_t api, size_t n_prompt, int64_t n_ctx,
                                int at_least)
{
    char msg[256];
    snprintf(msg, sizeof msg,
             "request (%s%zu tokens) exceeds the available context size (%lld tokens), try "
             "increasing it", at_least ? "at least " : "", n_prompt, (long long)n_ctx);
    if (api == RT_GEN_API_ANTHROPIC) {
        rt__gen_send_error(r, api, 400, NULL, "%s", msg);
        return;
    }
    json_t *j = json_pack("{s:{s:i, s:s, s:s, s:I, s:I}}", "error", "code", 400, "message", msg,
                          "type", "exceed_context_size_error", "n_prompt_tokens",
                          (json_int_t)n_prompt, "n_ctx", (json_int_t)n_ctx);
    if (j)
        rt_req_send_json(r, 400, j);
    else
        rt_req_send_error(r, 400, "exceed_context_size_error", "%s", msg);
}

/* ---------------------------------------------------------------------------- */
/* prompts made off the loop                                                      */
/* ---------------------------------------------------------------------------- */

int rt__gen_tokenize_prompt(const rt_app_t *app, const char *text, size_t len, unsigned flags,
                            rt_tokens_t *out, size_t *n_min, bl_err_t *err)
{
    /* megabytes that cannot fit are refused by their length, not tokenized first */
    size_t least = rt_tokenizer_min_tokens(app->tok, len);
    if (n_min && app->n_ctx_slot > 0 && least >= (size_t)app->n_ctx_slot) {
        *n_min = least;
        return bl_err_set(err, BL_ERANGE, "the prompt of %zu bytes takes at least %zu tokens; "
                          "a slot's context holds %lld", len, least, (long long)app->n_ctx_slot);
    }
    bl_err_t terr;
    int rc = rt_tokenize(app->tok, text, len, flags, out, &terr);
    return rc ? bl_err_set(err, rc, "tokenizing the prompt: %s", terr.msg) : 0;
}

int rt__gen_chat_cannot_fit(const rt_app_t *app, const json_t *msgs, const rt_gen_buf_t *prefill,
                            size_t *n_min, bl_err_t *err)
{
    if (!n_min || app->n_ctx_slot <= 0)
        return 0;
    /* every template writes the last message (the reply follows it) and the prefill */
    const json_t *c = json_object_get(json_array_get(msgs, json_array_size(msgs) - 1), "content");
    size_t len = (json_is_string(c) ? json_string_length(c) : 0) + (prefill ? prefill->n : 0);
    size_t least = rt_tokenizer_min_tokens(app->tok, len);
    if (least < (size_t)app->n_ctx_slot)
        return 0;
    *n_min = least;
    return bl_err_set(err, BL_ERANGE, "the last message of %zu bytes takes at least %zu tokens; "
                      "a slot's context holds %lld", len, least, (long long)app->n_ctx_slot);
}

void rt__gen_bound_thought(rt_gen_req_t *g, size_t n_prompt, int64_t budget)
{
    int64_t limit = g->params.task.n_predict > 0 ? g->params.task.n_predict
                                                 : g->app->n_ctx_slot - (int64_t)n_prompt;
    if (budget <= 0)
        budget = limit / 2;
    if (budget < 1)
        budget = 1;
    g->params.task.sampling.think_budget = budget > INT32_MAX ? INT32_MAX : (int32_t)budget;
    g->params.task.sampling.think_open = g->think_open;
    /* the format's own tags: [THINK], <|START_THINKING|>, harmony's analysis channel */
    rt_chatfmt_think_tags(g->params.fmt, &g->params.task.sampling.think_tags[0],
                          &g->params.task.sampling.think_tags[1]);
}

void rt__gen_send_prep_error(rt_gen_req_t *g)
{
    const rt_gen_prep_t *p = &g->prep;
    if (p->rc == BL_ERANGE)
        send_exceed_context(g->r, g->api, p->n_min, g->app->n_ctx_slot, 1);
    else
        rt__gen_send_error(g->r, g->api,
                           p->rc == BL_ENOMEM ? 500 : p->rc == BL_ENOTSUP ? 501 : 400, NULL, "%s",
                           p->err.msg[0] ? p->err.msg : "out of memory");
}

static void prep_gone(void *ud)
{
    rt_gen_req_t *g = ud;
    g->gone = 1;
}

static void prep_work(void *ud, rt_tokenizer_t *tok)
{
    rt_gen_req_t *g = ud;
    /* the app as the preparer sees it: its settings, with the preparer's tokenizer */
    rt_app_t app = *g->app;
    app.tok = tok;
    g->prep._work(g, &app);
}

static void prep_done(void *ud, int cancelled)
{
    rt_gen_req_t *g = ud;
    if (g->gone) {
        rt__gen_req_free(g);
        return;
    }
    rt_req_on_gone(g->r, NULL, NULL);
    if (cancelled) {
        rt__gen_send_error(g->r, g->api, 503, "unavailable_error", "server is shutting down");
        rt__gen_req_free(g);
        return;
    }
    g->prep._next(g);
}

void rt__gen_prepare(rt_gen_req_t *g, void (*work)(rt_gen_req_t *g, rt_app_t *app),
                     void (*next)(rt_gen_req_t *g))
{
    g->prep._work = work;
    g->prep._next = next;
    /* a generation (it has ops) queues apart from requests that only inspect */
    rt_prep_t *prep = g->ops || !g->app->prep_inspect ? g->app->prep : g->app->prep_inspect;
    if (!prep) {
        work(g, g->app);
        next(g);
        return;
    }
    /* the body outlives the request if the client leaves while the job is out */
    g->prep._body = json_incref(rt_req_json(g->r));
    rt_req_on_gone(g->r, prep_gone, g);
    if (rt_prep_submit(prep, prep_work, prep_done, g)) {
        rt_req_on_gone(g->r, NULL, NULL);
        rt__gen_send_error(g->r, g->api, 500, NULL, "out of memory");
        rt__gen_req_free(g);
    }
}

void rt__gen_route(rt_req_t *r, rt_gen_api_t api, const rt_gen_ops_t *ops, const char *id_prefix,
                   void (*work)(rt_gen_req_t *g, rt_app_t *app), void (*next)(rt_gen_req_t *g))
{
    rt_gen_limits_t lim;
    rt_gen_req_t *g = rt__gen_begin(r, api, ops, id_prefix, &lim);
    if (!g)
        return;
    bl_err_t err = {0};
    int rc = rt__gen_parse_params(rt_req_json(r), api, &lim, &g->params, &err);
    if (rc) {
        rt__gen_send_error(r, api, rc == BL_ENOMEM ? 500 : 400, NULL, "%s", err.msg);
        rt__gen_req_free(g);
        return;
    }
    rt__gen_prepare(g, work, next);
}

/* ---------------------------------------------------------------------------- */
/* one generation                                                                 */
/* ---------------------------------------------------------------------------- */

rt_gen_req_t *rt__gen_req_new(rt_req_t *r, rt_app_t *app, rt_gen_api_t api, const rt_gen_ops_t *ops,
                              const char *id_prefix)
{
    rt_gen_req_t *g = calloc(1, sizeof *g);
    if (!g)
        return NULL;
    g->r = r;
    g->app = app;
    g->api = api;
    g->ops = ops;
    g->created = (int64_t)time(NULL);
    g->block_index = -1;
    rt__gen_random_id(g->id, sizeof g->id, id_prefix);
    rt__gen_think_init(&g->think, 0, app->chatfmt); /* the calls' splitter: zeroed is empty */
    return g;
}

rt_gen_req_t *rt__gen_begin(rt_req_t *r, rt_gen_api_t api, const rt_gen_ops_t *ops,
                            const char *id_prefix, rt_gen_limits_t *lim)
{
    if (rt__gen_unavailable(r, api == RT_GEN_API_ANTHROPIC))
        return NULL;
    rt_app_t *app = rt_req_app(r);
    (void)rt__gen_limits(app, lim); /* cannot fail */
    rt_gen_req_t *g = rt__gen_req_new(r, app, api, ops, id_prefix);
    if (!g)
        rt__gen_send_error(r, api, 500, NULL, "out of memory");
    return g;
}

void rt__gen_req_free(rt_gen_req_t *g)
{
    if (!g)
        return;
    rt_tokens_free(&g->prep.toks);
    free(g->prep.text);
    json_decref(g->prep._body);
    rt__gen_params_fini(&g->params);
    rt__gen_think_fini(&g->think);
    rt__gen_buf_free(&g->content);
    rt__gen_tools_fini(&g->calls);
    rt__gen_buf_free(&g->reasoning);
    json_decref(g->probs);
    json_decref(g->tokens);
    json_decref(g->choices);
    free(g->prompt_text);
    free(g);
}

void rt__gen_write(rt_gen_req_t *g, const char *s, size_t n)
{
    if (!g->gone && g->streaming && n)
        rt_req_stream_write(g->r, s, n);
}

void rt__gen_write_sse(rt_gen_req_t *g, const char *event, json_t *j)
{
    size_t len;
    char *s = rt__gen_sse(event, j, &len);
    if (!s) {
        BL_LOG(BL_LOG_ERROR, "event=sse_format_failed req=%s reason=out_of_memory", g->id);
        return;
    }
    rt__gen_write(g, s, len);
    free(s);
}

void rt__gen_fail(rt_gen_req_t *g, int status, const char *message)
{
    if (g->gone)
        return;
    if (!g->streaming) {
        rt__gen_send_error(g->r, g->api, status, NULL, "%s", message);
        return;
    }
    if (g->api == RT_GEN_API_ANTHROPIC) {
        rt__gen_write_sse(g, "error", rt_http_error_json(status, NULL, message, 1));
    } else {
        const char *type = status == 400 ? "invalid_request_error"
                           : status == 503 ? "unavailable_error"
                                           : "server_error";
        rt__gen_write_sse(g, NULL,
                          json_pack("{s:{s:i, s:s, s:s}}", "error", "code", status, "message",
                                    message, "type", type));
    }
    rt_req_stream_end(g->r);
}

/* The client left: the task stops and nothing more is written. Runs at most once;
 * if it comes while an event is handled, the event's handler frees g. */
static void on_gone(void *ud)
{
    rt_gen_req_t *g = ud;
    g->gone = 1;
    if (g->task) {
        rt_engine_cancel(g->app->engine, g->task);
        g->task = NULL;
    }
    if (!g->in_event)
        rt__gen_req_free(g);
}

/* The reply's splitters, fresh for a generation: the thought's tags and the tool
 * call format are the template's, the parameter types the request's tools'. */
static void reset_splitters(rt_gen_req_t *g)
{
    rt__gen_think_fini(&g->think);
    rt__gen_think_init(&g->think, g->think_open, g->params.fmt);
    rt__gen_tools_fini(&g->calls);
    rt__gen_tools_init(&g->calls, g->params.fmt, json_object_get(rt_req_json(g->r), "tools"));
}

/* Text an event released, split when reasoning is on, to the reply. */
static int deliver_text(rt_gen_req_t *g, const rt_event_t *ev, const char *text, size_t len,
                        int last)
{
    rt_gen_buf_t reason = {0}, content = {0};
    int rc = 0;
    if (g->params.fmt == RT_CHATFMT_GPT_OSS && (g->params.reasoning || g->params.tools)) {
        /* harmony: the channels say what is thought, said and called */
        rc = rt__gen_harmony_feed(&g->calls, text ? text : "", len, last, g->params.tools,
                                  g->params.reasoning ? &reason : NULL, &content);
    } else if (g->params.reasoning) {
        if ((len && rt__gen_think_feed(&g->think, text, len, &reason, &content)) ||
            (last && rt__gen_think_finish(&g->think, &reason, &content)))
            rc = BL_ENOMEM;
        if (!rc && g->params.reasoning == RT_REASONING_LEGACY) {
            /* deepseek-legacy: the thought also stays in the content, tags and all */
            rt__gen_buf_free(&content);
            if (len && rt__gen_buf_add(&content, text, len))
                rc = BL_ENOMEM;
        }
    } else if (len && rt__gen_buf_add(&content, text, len)) {
        rc = BL_ENOMEM;
    }
    if (!rc && g->params.tools && g->params.fmt != RT_CHATFMT_GPT_OSS) {
        /* the content's tool calls come out of it */
        rt_gen_buf_t plain = {0};
        rc = rt__gen_tools_feed(&g->calls, content.p ? content.p : "", content.n, last, &plain);
        rt__gen_buf_free(&content);
        content = plain;
    }
    if (!rc && (memchr(content.p ? content.p : "", '\n', content.n)))
        g->has_new_line = 1;
    if (!rc && !g->params.stream) {
        if ((reason.n && rt__gen_buf_add(&g->reasoning, reason.p, reason.n)) ||
            (content.n && rt__gen_buf_add(&g->content, content.p, content.n)))
            rc = BL_ENOMEM;
    }
    if (!rc && g->params.stream && g->ops->token &&
        (reason.n || content.n || ev->kind == RT_EV_TOKEN))
        g->ops->token(g, ev, reason.p ? reason.p : "", reason.n, content.p ? content.p : "",
                      content.n);
    rt__gen_buf_free(&reason);
    rt__gen_buf_free(&content);
    return rc;
}

static void on_event(void *ud, const rt_event_t *ev);

/* return_progress: llama-server's prompt_progress (total, cache, processed, time_ms)
 * in a chunk of the API's stream. */
static void write_progress(rt_gen_req_t *g, const rt_event_t *ev)
{
    json_t *pp = json_pack("{s:I, s:I, s:I, s:I}", "total", (json_int_t)ev->timings.n_prompt, "cache",
                           (json_int_t)ev->timings.n_cached, "processed", (json_int_t)ev->progress_done, "time_ms",
                           (json_int_t)ev->progress_ms);
    json_t *j = NULL;
    if (g->api == RT_GEN_API_OAI_CHAT)
        j = json_pack("{s:[], s:I, s:s, s:s, s:s}", "choices", "created", (json_int_t)g->created, "id", g->id,
                      "model", g->app->model_alias ? g->app->model_alias : "", "object", "chat.completion.chunk");
    else if (g->api == RT_GEN_API_OAI_CMPL)
        j = json_pack("{s:[], s:I, s:s, s:s, s:s}", "choices", "created", (json_int_t)g->created, "id", g->id,
                      "model", g->app->model_alias ? g->app->model_alias : "", "object", "text_completion");
    else if (g->api == RT_GEN_API_NATIVE)
        j = json_pack("{s:i, s:s, s:b}", "index", g->choice, "content", "", "stop", 0);
    if (!j) {
        json_decref(pp);
        return;
    }
    json_object_set_new(j, "prompt_progress", pp);
    rt__gen_write_sse(g, NULL, j);
}

/* n > 1: clears the finished choice's text and starts the next on the same prompt
 * (its own seed when the request fixed one). A refusal ends the request. */
static void next_choice(rt_gen_req_t *g)
{
    g->choice++;
    rt__gen_buf_free(&g->content);
    rt__gen_buf_free(&g->reasoning);
    reset_splitters(g);
    g->n_calls_sent = 0;
    g->has_new_line = 0;
    g->text_offset = 0;
    json_decref(g->probs);
    g->probs = g->params.want_probs ? json_array() : NULL;
    if (g->params.seed_req >= 0)
        g->params.task.sampling.seed = (uint32_t)(g->params.seed_req + g->choice);
    bl_err_t err = {0};
    rt_task_t *task = NULL;
    const int rc = rt_engine_submit(g->app->engine, g->prep.toks.ids, g->prep.toks.n, &g->params.task, on_event, g,
                                    &task, &err);
    if (rc) {
        rt__gen_fail(g, rc == BL_ECLOSED ? 503 : 500, err.msg[0] ? err.msg : "the next choice could not start");
        g->gone = 1;
        return;
    }
    g->task = task;
    if (g->params.stream && g->ops->start)
        g->ops->start(g);
}

static void on_event(void *ud, const rt_event_t *ev)
{
    rt_gen_req_t *g = ud;
    if (g->gone)
        return; /* cannot happen after rt_engine_cancel; kept for safety */
    g->in_event = 1;
    switch (ev->kind) {
    case RT_EV_TOKEN:
        g->n_events++;
        if (!g->params.stream) {
            if ((g->params.return_tokens &&
                 json_array_append_new(g->tokens, json_integer(ev->token))) ||
                (g->params.want_probs &&
                 json_array_append_new(g->probs,
                                       rt__gen_prob_entry(g->app->tok, ev,
                                                          g->params.post_sampling_probs)))) {
                BL_LOG(BL_LOG_WARN, "event=reply_incomplete req=%s reason=out_of_memory", g->id);
            }
        }
        if (deliver_text(g, ev, ev->text, ev->len, 0))
            BL_LOG(BL_LOG_WARN, "event=reply_incomplete req=%s reason=out_of_memory", g->id);
        break;
    case RT_EV_PROGRESS: /* return_progress: streams only */
        if (g->params.stream)
            write_progress(g, ev);
        break;
    case RT_EV_DONE:
        g->task = NULL; /* over: nothing to cancel */
        if (deliver_text(g, ev, ev->tail ? ev->tail : "", ev->tail ? ev->tail_len : 0, 1))
            BL_LOG(BL_LOG_WARN, "event=reply_incomplete req=%s reason=out_of_memory", g->id);
        if (!g->gone && g->choice + 1 < g->params.n_choices) { /* this choice's part, then the next */
            g->more = 1;
            g->ops->done(g, ev);
            g->more = 0;
            g->n_predicted_sum += ev->timings.n_predicted;
            next_choice(g);
            break;
        }
        if (!g->gone)
            g->ops->done(g, ev);
        g->gone = 1; /* answered: the request is the HTTP layer's again */
        break;
    case RT_EV_ERROR:
        g->task = NULL;
        rt__gen_fail(g, ev->status ? ev->status : 500,
                     ev->message ? ev->message : "generation failed");
        g->gone = 1;
        break;
    }
    g->in_event = 0;
    if (g->gone)
        rt__gen_req_free(g);
}

void rt__gen_submit(rt_gen_req_t *g, const int32_t *prompt, size_t n)
{
    rt_app_t *app = g->app;
    rt_req_t *r = g->r;
    g->n_prompt = (int64_t)n;
    if (n == 0) {
        rt__gen_send_error(r, g->api, 400, NULL, "\"prompt\" must not be empty");
        rt__gen_req_free(g);
        return;
    }
    if ((g->params.want_probs && !(g->probs = json_array())) ||
        (g->params.return_tokens && !(g->tokens = json_array()))) {
        rt__gen_send_error(r, g->api, 500, NULL, "out of memory");
        rt__gen_req_free(g);
        return;
    }
    reset_splitters(g);
    /* a format whose markers are control tokens needs them as text to split on */
    if ((g->params.reasoning || g->params.tools) && !g->params.task.special)
        g->params.task.special = RT_TASK_SPECIAL_MARKERS;
    bl_err_t err = {0};
    rt_task_t *task = NULL;
    int rc = rt_engine_submit(app->engine, prompt, n, &g->params.task, on_event, g, &task, &err);
    if (rc) {
        if (rc == BL_ERANGE)
            send_exceed_context(r, g->api, n, app->n_ctx_slot, 0);
        else if (rc == BL_ECLOSED)
            rt__gen_send_error(r, g->api, 503, "unavailable_error", "server is shutting down");
        else if (rc == BL_EINVAL)
            rt__gen_send_error(r, g->api, 400, NULL, "%s", err.msg);
        else
            rt__gen_send_error(r, g->api, 500, NULL, "%s", err.msg[0] ? err.msg : "out of memory");
        rt__gen_req_free(g);
        return;
    }
    g->task = task;
    if (g->params.stream) {
        rt_req_stream_start(r, 200, "text/event-stream", on_gone, g);
        g->streaming = 1;
        if (g->ops->start)
            g->ops->start(g);
    } else {
        rt_req_on_gone(r, on_gone, g);
    }
}

/* ---------------------------------------------------------------------------- */
/* llama-server's /completion                                                     */
/* ---------------------------------------------------------------------------- */

void rt_app_defaults(rt_app_t *app)
{
    rt_task_params_default(&app->defaults);
    app->reasoning = 1;
    app->tpl_kwargs = NULL;
    app->n_predict_default = -1;
}

void rt_api_spec_limits_json(json_t *params, rt_spec_limits_t l)
{
    json_object_set_new(params, "speculative.n_max", json_integer(l.n_max));
    json_object_set_new(params, "speculative.n_min", json_integer(l.n_min));
    json_object_set_new(params, "speculative.p_min", rt__gen_json_real(l.p_min));
}

json_t *rt_api_samplers_json(const rt_sampler_params_t *s)
{
    json_t *a = json_array();
    for (int i = 0; a && i < s->n_stages; i++)
        json_array_append_new(a, json_string(rt_sampler_stage_name(s->stages[i])));
    return a;
}

json_t *rt__gen_settings_json(const rt_gen_req_t *g)
{
    const rt_task_params_t *t = &g->params.task;
    const rt_sampler_params_t *s = &t->sampling;
    json_t *stop = json_array(), *bias = json_array(), *samplers = rt_api_samplers_json(s);
    for (int i = 0; stop && i < t->n_stop; i++)
        json_array_append_new(stop, json_string(t->stop[i]));
    for (size_t i = 0; bias && i < s->n_logit_bias; i++)
        json_array_append_new(bias, json_pack("{s:o, s:i}", "bias",
                                              rt__gen_json_real(s->logit_bias[i].bias), "token",
                                              (int)s->logit_bias[i].token));
    json_t *j = json_pack(
        "{s:I, s:I, s:o, s:i, s:o, s:o, s:o, s:i, s:o, s:o, s:o, s:i, s:o, s:I, s:I, s:b, s:b, "
        "s:i, s:i, s:o, s:s, s:o, s:b, s:b}",
        "n_predict", (json_int_t)t->n_predict, "seed",
        (json_int_t)(g->params.seed_req < 0 ? (json_int_t)RT_SEED_RANDOM : g->params.seed_req),
        "temperature", rt__gen_json_real(s->temp), "top_k", (int)s->top_k, "top_p",
        rt__gen_json_real(s->top_p), "min_p", rt__gen_json_real(s->min_p), "typical_p",
        rt__gen_json_real(s->typical_p), "repeat_last_n", (int)s->penalty_last_n, "repeat_penalty",
        rt__gen_json_real(s->repeat_penalty), "presence_penalty",
        rt__gen_json_real(s->presence_penalty), "frequency_penalty",
        rt__gen_json_real(s->frequency_penalty), "mirostat", 0, "stop",
        stop ? stop : json_array(), "max_tokens", (json_int_t)t->n_predict, "n_keep",
        (json_int_t)0, "ignore_eos", t->ignore_eos, "stream", g->params.stream, "n_probs",
        t->n_probs, "min_keep", (int)s->min_keep, "logit_bias", bias ? bias : json_array(),
        "grammar", s->grammar ? s->grammar : "", "samplers", samplers ? samplers : json_array(),
        "timings_per_token", g->params.timings_per_token, "post_sampling_probs",
        g->params.post_sampling_probs);
    if (j)
        json_object_set_new(j, "n_ctx", json_integer(g->app->n_ctx_slot));
    if (j)
        json_object_set_new(j, "model", json_string(g->app->model_alias ? g->app->model_alias : ""));
    if (j && g->app->engine)
        rt_api_spec_limits_json(j, rt_engine_spec_limits(g->app->engine, t));
    return j;
}

static void native_token(rt_gen_req_t *g, const rt_event_t *ev, const char *reason,
                         size_t reason_len, const char *content, size_t content_len)
{
    (void)reason;
    (void)reason_len;
    json_t *j = json_pack("{s:i, s:s%, s:[], s:b, s:i, s:I, s:I}", "index", 0, "content", content,
                          content_len, "tokens", "stop", 0, "id_slot", ev->slot,
                          "tokens_predicted", (json_int_t)ev->timings.n_predicted,
                          "tokens_evaluated", (json_int_t)g->n_prompt);
    if (!j)
        return;
    if (ev->kind == RT_EV_TOKEN) {
        json_array_append_new(json_object_get(j, "tokens"), json_integer(ev->token));
        if (g->params.want_probs) {
            json_t *a = json_array();
            json_array_append_new(a, rt__gen_prob_entry(g->app->tok, ev,
                                                        g->params.post_sampling_probs));
            json_object_set_new(j, "completion_probabilities", a);
        }
    }
    if (g->params.timings_per_token)
        json_object_set_new(j, "timings", rt__gen_timings_json(&ev->timings));
    rt__gen_write_sse(g, NULL, j);
}

json_t *rt__gen_native_final(rt_gen_req_t *g, const rt_event_t *ev)
{
    int stream = g->params.stream;
    json_t *j = json_pack(
        "{s:i, s:s%, s:o, s:i, s:b, s:s, s:I, s:I, s:o, s:s, s:b, s:b, s:s, s:s, s:I, s:o}",
        "index", 0, "content", stream ? "" : (g->content.p ? g->content.p : ""),
        stream ? (size_t)0 : g->content.n, "tokens",
        (!stream && g->tokens) ? json_incref(g->tokens) : json_array(), "id_slot", ev->slot,
        "stop", 1, "model", g->app->model_alias ? g->app->model_alias : "", "tokens_predicted",
        (json_int_t)ev->timings.n_predicted, "tokens_evaluated", (json_int_t)g->n_prompt,
        "generation_settings", rt__gen_settings_json(g), "prompt",
        g->prompt_text ? g->prompt_text : "", "has_new_line", g->has_new_line, "truncated", 0,
        "stop_type", rt__gen_stop_type_name(ev->stop_type), "stopping_word",
        ev->stop_type == RT_STOP_WORD && ev->stopping_word ? ev->stopping_word : "",
        "tokens_cached", (json_int_t)(g->n_prompt + ev->timings.n_predicted), "timings",
        rt__gen_timings_json(&ev->timings));
    if (j && !stream && g->probs && json_array_size(g->probs))
        json_object_set(j, "completion_probabilities", g->probs);
    return j;
}

/* llama-server's response_fields: the reply reduced to the paths asked for ("a/b"
 * reads j["a"]["b"]), each under its whole path as the key; a path that leads
 * nowhere is left out. Takes j; NULL when out of memory. */
static json_t *pick_fields(json_t *j, const json_t *paths)
{
    json_t *out = j ? json_object() : NULL;
    size_t i;
    json_t *p;
    json_array_foreach(paths, i, p) {
        if (!out)
            break;
        const char *path = json_string_value(p), *seg = path;
        json_t *cur = j;
        for (;;) {
            const char *slash = strchr(seg, '/');
            size_t n = slash ? (size_t)(slash - seg) : strlen(seg);
            cur = json_is_object(cur) ? json_object_getn(cur, seg, n) : NULL;
            if (!cur || !slash)
                break;
            seg = slash + 1;
        }
        if (cur && json_object_set(out, path, cur)) {
            json_decref(out);
            out = NULL;
        }
    }
    json_decref(j);
    return out;
}

static void native_done(rt_gen_req_t *g, const rt_event_t *ev)
{
    json_t *j = rt__gen_native_final(g, ev);
    if (g->params.response_fields)
        j = pick_fields(j, g->params.response_fields);
    if (g->params.stream) {
        rt__gen_write_sse(g, NULL, j);
        rt_req_stream_end(g->r);
    } else if (j) {
        rt_req_send_json(g->r, 200, j);
    } else {
        rt__gen_send_error(g->r, g->api, 500, NULL, "out of memory");
    }
}

static const rt_gen_ops_t native_ops = {NULL, native_token, native_done};

static rt_gen_limits_t limits_of(rt_app_t *app)
{
    rt_gen_limits_t l = {app->tok, app->n_vocab, app->n_ctx_slot, app->n_slots,
                         app->n_predict_default, &app->defaults, app->chatfmt};
    return l;
}

int rt__gen_limits(rt_app_t *app, rt_gen_limits_t *out)
{
    *out = limits_of(app);
    return 0;
}

/* The prompt ids of a native request; the route's own part of native_route. */
/* The bytes of text in a "prompt" field (strings, also inside arrays and
 * prompt_string objects), for the length bound before tokenizing. */
static size_t prompt_text_bytes(const json_t *v, int depth)
{
    if (json_is_string(v))
        return json_string_length(v);
    if (depth > 2)
        return 0;
    if (json_is_object(v))
        return prompt_text_bytes(json_object_get(v, "prompt_string"), depth + 1);
    size_t n = 0, i;
    json_t *e;
    if (json_is_array(v))
        json_array_foreach(v, i, e) n += prompt_text_bytes(e, depth + 1);
    return n;
}

/* The preparer's side of a /completion-shaped route: the prompt's tokens (and their
 * text, echoed as "prompt"). */
static void native_prompt_text(rt_gen_req_t *g, rt_app_t *app)
{
    rt_gen_prep_t *p = &g->prep;
    if (!p->rc && p->toks.n) {
        size_t len;
        bl_err_t derr;
        if (rt_detokenize(app->tok, p->toks.ids, p->toks.n, RT_DETOK_SPECIAL, &g->prompt_text,
                          &len, &derr))
            g->prompt_text = NULL; /* the echo of the prompt is informative only */
    }
}

void rt__gen_prep_prompt(rt_gen_prep_t *p, const rt_app_t *app, const json_t *prompt)
{
    size_t least = rt_tokenizer_min_tokens(app->tok, prompt_text_bytes(prompt, 0));
    if (app->n_ctx_slot > 0 && least >= (size_t)app->n_ctx_slot) {
        p->n_min = least;
        p->rc = BL_ERANGE;
        return;
    }
    p->rc = rt__gen_prompt_tokens(prompt, app->tok, app->n_vocab, &p->toks, &p->err);
}

static void completion_work(rt_gen_req_t *g, rt_app_t *app)
{
    rt__gen_prep_prompt(&g->prep, app, json_object_get(rt_req_json(g->r), "prompt"));
    native_prompt_text(g, app);
}

static void infill_work(rt_gen_req_t *g, rt_app_t *app)
{
    rt_gen_prep_t *p = &g->prep;
    p->rc = rt__gen_fim_tokens(app, rt_req_json(g->r), RT_GEN_API_NATIVE, g->params.task.n_predict,
                               &p->toks, &p->err);
    native_prompt_text(g, app);
}

static void native_next(rt_gen_req_t *g)
{
    if (g->prep.rc) {
        rt__gen_send_prep_error(g);
        rt__gen_req_free(g);
        return;
    }
    rt__gen_submit(g, g->prep.toks.ids, g->prep.toks.n);
}

/* A generation in /completion's shape: the fields, then the prompt made off the
 * loop by work (its error: 400, or 501 for BL_ENOTSUP), then the task. */
static void native_route(rt_req_t *r, void (*work)(rt_gen_req_t *g, rt_app_t *app))
{
    rt__gen_route(r, RT_GEN_API_NATIVE, &native_ops, "cmpl-", work, native_next);
}

static void route_completion(rt_req_t *r) { native_route(r, completion_work); }

/* ---------------------------------------------------------------------------- */
/* /infill: fill-in-the-middle                                                    */
/* ---------------------------------------------------------------------------- */

/* A text field of an /infill body: "" when absent or null, else it must be a string. */
static int infill_text(const json_t *o, const char *k, const char *where, const char **s,
                       size_t *len, bl_err_t *err)
{
    json_t *v = field(o, k);
    *s = "";
    *len = 0;
    if (!v)
        return 0;
    if (!json_is_string(v))
        return bl_err_set(err, BL_EINVAL, "%s\"%s\" must be a string", where, k);
    *s = json_string_value(v);
    *len = json_string_length(v);
    return 0;
}

/* Appends the ids of text, special tokens taken as plain text and no bos (code may
 * hold anything, <|im_start|> included). */
static int infill_tokenize(rt_tokenizer_t *tok, const char *s, size_t len, rt_tokens_t *out,
                           bl_err_t *err)
{
    bl_err_t terr;
    int rc = rt_tokenize(tok, s, len, 0, out, &terr);
    if (rc)
        return bl_err_set(err, rc == BL_ENOMEM ? BL_ENOMEM : BL_EINVAL, "infill: %s", terr.msg);
    return 0;
}

static int infill_push(rt_tokens_t *out, int32_t id, bl_err_t *err)
{
    return rt_tokens_push(out, id) ? bl_err_set(err, BL_ENOMEM, "out of memory") : 0;
}


/* The context chunks of input_extra (other files of the project) as llama-server
 * lays them out: <repo>myproject\n, then per chunk <file_sep>FILENAME\n TEXT (or a
 * "--- snippet ---" line where the vocabulary has no file separator), then
 * <file_sep>filename\n for the file being edited. */
static int infill_extra(rt_tokenizer_t *tok, const json_t *body, rt_tokens_t *out, bl_err_t *err)
{
    const int32_t rep = rt_tokenizer_fim(tok, RT_FIM_REP), sep = rt_tokenizer_fim(tok, RT_FIM_SEP);
    int rc = 0;
    if (rep >= 0 && ((rc = infill_push(out, rep, err)) ||
                     (rc = infill_tokenize(tok, "myproject\n", 10, out, err))))
        return rc;
    json_t *extra = field(body, "input_extra");
    if (extra && !json_is_array(extra))
        return bl_err_set(err, BL_EINVAL, "\"input_extra\" must be an array of {\"filename\", "
                                          "\"text\"} objects");
    size_t i;
    json_t *c;
    json_array_foreach(extra, i, c) {
        char where[48];
        snprintf(where, sizeof where, "input_extra[%zu]: ", i);
        if (!json_is_object(c))
            return bl_err_set(err, BL_EINVAL, "input_extra[%zu] must be an object with \"text\"",
                              i);
        if (!json_is_string(json_object_get(c, "text")))
            return bl_err_set(err, BL_EINVAL, "input_extra[%zu]: \"text\" must be a string", i);
        const char *name, *text;
        size_t name_len, text_len;
        if ((rc = infill_text(c, "filename", where, &name, &name_len, err)) ||
            (rc = infill_text(c, "text", where, &text, &text_len, err)))
            return rc;
        if (!field(c, "filename")) {
            name = "tmp";
            name_len = 3;
        }
        if (sep >= 0) {
            if ((rc = infill_push(out, sep, err)) ||
                (rc = infill_tokenize(tok, name, name_len, out, err)) ||
                (rc = infill_tokenize(tok, "\n", 1, out, err)))
                return rc;
        } else if ((rc = infill_tokenize(tok, "\n\n--- snippet ---\n\n", 19, out, err))) {
            return rc;
        }
        if ((rc = infill_tokenize(tok, text, text_len, out, err)))
            return rc;
    }
    if (sep >= 0 && ((rc = infill_push(out, sep, err)) ||
                     (rc = infill_tokenize(tok, "filename\n", 9, out, err))))
        return rc;
    return 0;
}

/* The prompt of a fill-in-the-middle request, llama-server's /infill layout:
 *   [the last n_extra ids of the extra chunks] [bos] <pre> PREFIX PROMPT <suf> SUFFIX <mid>
 * The prefix keeps its last 3/4 of the batch, the suffix its first
 * batch/4 - 2 - |PROMPT| ids, the extra chunks what is left of the context after a
 * batch and twice n_predict. /infill (RT_GEN_API_NATIVE) reads input_prefix,
 * input_suffix, input_extra and an optional "prompt" (the text already typed after
 * the prefix); /v1/completions (RT_GEN_API_OAI_CMPL) the "prompt" string before
 * the gap and the "suffix" after it. Returns 0, BL_EINVAL (a field named in err),
 * BL_ENOTSUP (the model has no FIM tokens) or BL_ENOMEM. */
int rt__gen_fim_tokens(rt_app_t *app, const json_t *body, rt_gen_api_t api, int64_t n_predict,
                       rt_tokens_t *out, bl_err_t *err)
{
    rt_tokenizer_t *tok = app->tok;
    const int oai = api == RT_GEN_API_OAI_CMPL;
    const int32_t pre = rt_tokenizer_fim(tok, RT_FIM_PRE), suf = rt_tokenizer_fim(tok, RT_FIM_SUF),
                  mid = rt_tokenizer_fim(tok, RT_FIM_MID);
    if (pre < 0 || suf < 0 || mid < 0)
        return bl_err_set(err, BL_ENOTSUP, "%s is not supported by this model:%s%s%s",
                          oai ? "'suffix' (fill-in-the-middle)" : "infill",
                          pre < 0 ? " no prefix token." : "", suf < 0 ? " no suffix token." : "",
                          mid < 0 ? " no middle token." : "");
    const char *ps, *ss;
    size_t pl, sl;
    rt_tokens_t prefix = {0}, suffix = {0}, prompt = {0}, extra = {0};
    int rc;
    if (oai && !json_is_string(field(body, "prompt")))
        return bl_err_set(err, BL_EINVAL, "'suffix' needs \"prompt\" as one string (the text "
                                          "before the gap)");
    if ((rc = infill_text(body, oai ? "prompt" : "input_prefix", "", &ps, &pl, err)) ||
        (rc = infill_text(body, oai ? "suffix" : "input_suffix", "", &ss, &sl, err)) ||
        (!oai && (rc = infill_extra(tok, body, &extra, err))) ||
        (rc = infill_tokenize(tok, ps, pl, &prefix, err)) ||
        (rc = infill_tokenize(tok, ss, sl, &suffix, err)))
        goto done;
    json_t *p = oai ? NULL : field(body, "prompt");
    if (p && !json_is_string(p) && !json_is_array(p)) {
        rc = bl_err_set(err, BL_EINVAL, "\"prompt\" must be a string or an array of token ids "
                                        "and strings");
        goto done;
    }
    if (p && json_is_string(p)) {
        rc = prompt_piece(p, 0, tok, app->n_vocab, &prompt, err);
    } else if (p) {
        size_t i;
        json_t *e;
        json_array_foreach(p, i, e) {
            if ((rc = prompt_piece(e, 0, tok, app->n_vocab, &prompt, err)))
                break;
        }
    }
    if (rc)
        goto done;

    /* The batch the prefix and suffix share, at most the slot's context. */
    const int64_t nb = app->n_batch < app->n_ctx_slot ? app->n_batch : app->n_ctx_slot;
    const int64_t n_pre = (int64_t)prefix.n < 3 * (nb / 4) ? (int64_t)prefix.n : 3 * (nb / 4);
    int64_t n_suf = nb / 4 - (2 + (int64_t)prompt.n);
    n_suf = n_suf < 0 ? 0 : n_suf > (int64_t)suffix.n ? (int64_t)suffix.n : n_suf;
    int64_t n_extra = app->n_ctx_slot - nb - 2 * n_predict;
    n_extra = n_extra < 0 ? 0 : n_extra > (int64_t)extra.n ? (int64_t)extra.n : n_extra;
    const int32_t bos = rt_tokenizer_add_bos(tok) ? rt_tokenizer_bos(tok) : -1;
    typedef struct {
        const int32_t *ids;
        size_t from, n;
    } seg_t;
    const seg_t head[] = {
        {extra.ids, extra.n - (size_t)n_extra, (size_t)n_extra},
        {&bos, 0, bos >= 0},
    }, pre_part[] = {
        {&pre, 0, 1},
        {prefix.ids, prefix.n - (size_t)n_pre, (size_t)n_pre},
        {prompt.ids, 0, prompt.n},
    }, suf_part[] = {
        {&suf, 0, 1},
        {suffix.ids, 0, (size_t)n_suf},
    }, tail[] = {{&mid, 0, 1}};
    /* --spm-infill: the suffix part first, as SentencePiece-style FIM models expect */
    const struct {
        const seg_t *s;
        size_t n;
    } order[] = {
        {head, 2},
        {app->spm_infill ? suf_part : pre_part, app->spm_infill ? 2 : 3},
        {app->spm_infill ? pre_part : suf_part, app->spm_infill ? 3 : 2},
        {tail, 1},
    };
    for (size_t o = 0; !rc && o < sizeof order / sizeof *order; o++)
        for (size_t k = 0; !rc && k < order[o].n; k++)
            for (size_t i = 0; !rc && i < order[o].s[k].n; i++)
                rc = infill_push(out, order[o].s[k].ids[order[o].s[k].from + i], err);
done:
    rt_tokens_free(&prefix);
    rt_tokens_free(&suffix);
    rt_tokens_free(&prompt);
    rt_tokens_free(&extra);
    return rc;
}

/* POST /infill: code completion between input_prefix and input_suffix; the body
 * takes every /completion field, and the reply is /completion's. */
static void route_infill(rt_req_t *r) { native_route(r, infill_work); }

static void apply_template_work(rt_gen_req_t *g, rt_app_t *app)
{
    rt_gen_prep_t *p = &g->prep;
    const json_t *body = rt_req_json(g->r);
    json_t *msgs = NULL, *kwargs = NULL;
    rt_gen_buf_t prefill = {0};
    int reasoning, think_open;
    if (!(p->rc = rt__gen_chat_options(app, body, &kwargs, &reasoning, NULL, NULL, &p->err)) &&
        !(p->rc = rt__gen_chat_messages(json_object_get(body, "messages"), &msgs,
                                               app->no_prefill_assistant ? NULL : &prefill,
                                        &p->err)))
        p->rc = rt__gen_render_chat(app, msgs, kwargs, p->add_gen, &prefill, &p->text, &p->len,
                                    &think_open, &p->err);
    if (p->rc && p->rc != BL_ENOMEM)
        p->rc = BL_EINVAL;
    rt__gen_buf_free(&prefill);
    json_decref(msgs);
    json_decref(kwargs);
}

static void apply_template_next(rt_gen_req_t *g)
{
    if (g->prep.rc) {
        rt__gen_send_prep_error(g);
    } else {
        json_t *j = json_pack("{s:s%}", "prompt", g->prep.text, g->prep.len);
        if (j)
            rt_req_send_json(g->r, 200, j);
        else
            rt_req_send_error(g->r, 500, NULL, "out of memory");
    }
    rt__gen_req_free(g);
}

/* POST /apply-template: the chat prompt the template makes of messages. */
static void route_apply_template(rt_req_t *r)
{
    const json_t *body = rt_req_json(r);
    bl_err_t err = {0};
    if (!json_is_object(body)) {
        rt_req_send_error(r, 400, NULL, "the request body must be a JSON object");
        return;
    }
    int add_gen = 1;
    if (get_bool(body, "add_generation_prompt", &add_gen, &err)) {
        rt_req_send_error(r, 400, NULL, "%s", err.msg);
        return;
    }
    rt_gen_req_t *g = rt__gen_req_new(r, rt_req_app(r), RT_GEN_API_NATIVE, NULL, "");
    if (!g) {
        rt_req_send_error(r, 500, NULL, "out of memory");
        return;
    }
    g->prep.add_gen = add_gen;
    rt__gen_prepare(g, apply_template_work, apply_template_next);
}

/* ---------------------------------------------------------------------------- */
/* registration                                                                   */
/* ---------------------------------------------------------------------------- */

/* Routes of llama-server this server does not serve: 501 with the reason, as
 * llama-server answers them when started without --embeddings / --reranking,
 * rather than a 404 that reads like a wrong URL. */
static void route_embeddings(rt_req_t *r)
{
    rt_req_send_error(r, 501, NULL, "embeddings are not supported by this server (generation "
                                    "models only)");
}

static void route_rerank(rt_req_t *r)
{
    rt_req_send_error(r, 501, NULL, "reranking is not supported by this server (generation "
                                    "models only)");
}

void rt_api_gen_register(rt_http_t *h)
{
    static const struct {
        const char *path;
        rt_route_fn fn;
    } routes[] = {
        {"/completion", route_completion},
        {"/completions", rt__api_oai_completions},
        {"/infill", route_infill},
        {"/v1/completions", rt__api_oai_completions},
        {"/chat/completions", rt__api_chat},
        {"/v1/chat/completions", rt__api_chat},
        {"/v1/chat/completions/input_tokens", rt__api_chat_input_tokens},
        {"/v1/responses", rt__api_responses},
        {"/responses", rt__api_responses},
        {"/v1/responses/input_tokens", rt__api_responses_input_tokens},
        {"/apply-template", route_apply_template},
        {"/v1/messages", rt__api_messages},
        {"/v1/messages/count_tokens", rt__api_messages_count_tokens},
        {"/embedding", route_embeddings},
        {"/embeddings", route_embeddings},
        {"/v1/embeddings", route_embeddings},
        {"/rerank", route_rerank},
        {"/reranking", route_rerank},
        {"/v1/rerank", route_rerank},
        {"/v1/reranking", route_rerank},
    };
    for (size_t i = 0; i < sizeof routes / sizeof *routes; i++)
        if (rt_http_route(h, "POST", routes[i].path, routes[i].fn,
                          strncmp(routes[i].path, "/v1/messages", 12) ? 0 : RT_ROUTE_ANTHROPIC))
            BL_LOG(BL_LOG_ERROR, "event=route_failed path=%s reason=out_of_memory",
                   routes[i].path);
}
