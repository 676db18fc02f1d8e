/* Tool calls, the request's side: OpenAI's "tools" and the tool_calls of assistant
 * messages checked (the template renders both), and a call forced by a grammar
 * when tool_choice asks for one. The reply's side is toolcall.c.
 *
 * Thread: the loop thread. */
#include "api_gen_impl.h"
#include "json_schema.h"
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------- */
/* request                                                                        */
/* ---------------------------------------------------------------------------- */

int rt__gen_check_tools(const json_t *tools, bl_err_t *err)
{
    if (!json_is_array(tools))
        return bl_err_set(err, BL_EINVAL, "'tools' must be an array");
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *type = json_is_object(t) ? json_object_get(t, "type") : NULL;
        json_t *fn = json_is_object(t) ? json_object_get(t, "function") : NULL;
        if (!json_is_string(type) || strcmp(json_string_value(type), "function") != 0)
            return bl_err_set(err, BL_EINVAL, "tools[%zu]: only {\"type\": \"function\", ...} "
                                              "tools are supported", i);
        if (!json_is_object(fn) || !json_is_string(json_object_get(fn, "name")) ||
            json_string_length(json_object_get(fn, "name")) == 0)
            return bl_err_set(err, BL_EINVAL, "tools[%zu].function must be an object with a "
                                              "non-empty 'name'", i);
        json_t *d = json_object_get(fn, "description"), *p = json_object_get(fn, "parameters");
        if (d && !json_is_null(d) && !json_is_string(d))
            return bl_err_set(err, BL_EINVAL, "tools[%zu].function.description must be a string",
                              i);
        if (p && !json_is_null(p) && !json_is_object(p))
            return bl_err_set(err, BL_EINVAL, "tools[%zu].function.parameters must be an object",
                              i);
    }
    return 0;
}

/* ---------------------------------------------------------------------------- */
/* a forced call                                                                  */
/* ---------------------------------------------------------------------------- */

/* The most bytes a forced call's grammar may take, every tool together. */
#define FORCE_MAX_GBNF (4u << 20)

typedef struct gb {
    bl_buf_t b;
    int rc; /* the first failure; later appends do nothing */
} gb_t;

static void gb_add(gb_t *g, const char *s, size_t n)
{
    if (!g->rc && (g->rc = bl_buf_add(&g->b, s, n, FORCE_MAX_GBNF)))
        g->rc = g->rc == BL_ERANGE ? BL_ERANGE : BL_ENOMEM;
}

static void gb_str(gb_t *g, const char *s) { gb_add(g, s, strlen(s)); }

static void gb_fmt(gb_t *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void gb_fmt(gb_t *g, const char *fmt, ...)
{
    char t[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t, sizeof t, fmt, ap);
    va_end(ap);
    gb_add(g, t, n < 0 ? 0 : (size_t)n < sizeof t ? (size_t)n : sizeof t - 1);
}

/* " LITERAL" */
static void gb_lit(gb_t *g, const char *s, size_t n)
{
    gb_str(g, " ");
    if (!g->rc && n && rt__gen_gbnf_lit(&g->b, s, n))
        g->rc = BL_ENOMEM;
}

/* A form's text: runs of bytes as literals, a space as "fc-ws", %X by what x says
 * (chatfmt.h). */
static void gb_form(gb_t *g, const char *form, const char *name, const char *args,
                    int json_name)
{
    for (const char *p = form; *p;) {
        size_t run = strcspn(p, " %");
        if (run) {
            gb_lit(g, p, run);
            p += run;
            continue;
        }
        if (*p == ' ') {
            gb_str(g, " fc-ws");
            p++;
            continue;
        }
        char k = p[1];
        p += k ? 2 : 1;
        if (k == 'N') {
            if (json_name) {
                json_t *s = json_string(name);
                char *j = s ? json_dumps(s, JSON_ENCODE_ANY) : NULL;
                json_decref(s);
                if (!j) {
                    g->rc = BL_ENOMEM;
                    return;
                }
                gb_lit(g, j, strlen(j));
                free(j);
            } else {
                gb_lit(g, name, strlen(name));
            }
        } else if (k == 'A') {
            gb_fmt(g, " %s", args);
        } else if (k == 'I') {
            gb_str(g, " [0-9]{1,4}");
        } else if (k == '9') {
            gb_str(g, " [a-zA-Z0-9]{9}");
        } else if (k == '_') {
            gb_lit(g, " ", 1);
        }
    }
}

/* Appends schema's grammar to g with its rules named prefix-*. BL_EINVAL or
 * BL_ERANGE with e saying why the converter refused it, BL_ENOMEM. */
static int gb_schema(gb_t *g, const json_t *schema, const char *prefix, bl_err_t *e)
{
    char *gbnf = NULL;
    int rc = rt_json_schema_to_gbnf(schema, &gbnf, e);
    if (rc)
        return rc;
    char *r = rt__gen_gbnf_rename(gbnf, prefix, NULL);
    free(gbnf);
    if (!r)
        return BL_ENOMEM;
    gb_str(g, "\n");
    gb_str(g, r);
    free(r);
    return 0;
}

/* Whether a property is text to a key/value parser: its schema's type is "string". */
static int is_text(const json_t *prop)
{
    const json_t *t = json_object_get(prop, "type");
    return json_is_string(t) && !strcmp(json_string_value(t), "string");
}

/* Rule fc-aK: tool k's arguments as key/value pairs in kv's form: its properties in
 * the schema's order, the required ones always, the others maybe; a string
 * property's value is text up to the value's close tag (its enum or const, when it
 * has one, as written), any other value JSON of the property's schema. Without
 * "properties" (and extra keys not refused), any keys with text values. Sub-rules
 * go to tail. */
static int kv_args(gb_t *g, gb_t *tail, const rt_kvform_t *kv, const json_t *params, size_t k,
                   int *free_keys, bl_err_t *err)
{
    const json_t *props = json_object_get(params, "properties");
    const json_t *req = json_object_get(params, "required");
    gb_fmt(g, "\nfc-a%zu ::=", k);
    if (!json_is_object(props) && !json_is_false(json_object_get(params, "additionalProperties"))) {
        gb_str(g, " ( fc-ws");
        gb_lit(g, kv->key_open, strlen(kv->key_open));
        gb_str(g, " fc-key");
        if (kv->val_open) {
            gb_str(g, " fc-ws");
            gb_lit(g, kv->val_open, strlen(kv->val_open));
        }
        gb_str(g, " fc-val )*");
        *free_keys = 1;
        return 0;
    }
    const char *key;
    const json_t *prop;
    size_t j = 0;
    if (!json_is_object(props) || json_object_size(props) == 0)
        gb_str(g, " \"\""); /* no arguments */
    json_object_foreach((json_t *)props, key, prop) {
        int required = 0;
        size_t i;
        const json_t *r;
        json_array_foreach(req, i, r) {
            if (json_is_string(r) && !strcmp(json_string_value(r), key))
                required = 1;
        }
        gb_str(g, required ? " fc-ws" : " ( fc-ws");
        gb_lit(g, kv->key_open, strlen(kv->key_open));
        gb_lit(g, key, strlen(key));
        gb_lit(g, kv->key_close, strlen(kv->key_close));
        if (kv->val_open) {
            gb_str(g, " fc-ws");
            gb_lit(g, kv->val_open, strlen(kv->val_open));
        }
        const json_t *en = json_object_get(prop, "enum"), *cn = json_object_get(prop, "const");
        if (is_text(prop) && (json_is_string(cn) || json_is_array(en))) {
            /* the values as written */
            const char *nl = kv->strip_nl ? " \"\\n\"?" : "";
            gb_fmt(g, "%s (", nl);
            const json_t *v;
            size_t n = 0;
            json_array_foreach(json_is_string(cn) ? NULL : en, i, v) {
                if (!json_is_string(v))
                    continue;
                gb_str(g, n++ ? " |" : "");
                gb_lit(g, json_string_value(v), json_string_length(v));
            }
            if (json_is_string(cn))
                gb_lit(g, json_string_value(cn), json_string_length(cn)), n++;
            if (!n)
                return bl_err_set(err, BL_EINVAL, "tools[%zu]: the parameters' property '%.64s' "
                                                  "is a string with no string in its enum",
                                  k, key);
            gb_fmt(g, " )%s", nl);
            gb_lit(g, kv->val_close, strlen(kv->val_close));
        } else if (is_text(prop)) {
            gb_fmt(g, " fc-v%zu-%zu", k, j);
            char name[48];
            snprintf(name, sizeof name, "fc-v%zu-%zu", k, j);
            if (!tail->rc && rt__gen_gbnf_until(&tail->b, name, kv->val_close))
                tail->rc = BL_ENOMEM;
        } else {
            /* the property's schema, with the definitions its refs may name */
            json_t *ps = json_is_object(prop) ? json_deep_copy(prop) : json_incref((json_t *)prop);
            static const char *const kinds[] = {"$defs", "definitions"};
            for (int d = 0; ps && json_is_object(ps) && d < 2; d++) {
                json_t *defs = json_object_get(params, kinds[d]);
                if (defs && !json_object_get(ps, kinds[d]) && json_object_set(ps, kinds[d], defs)) {
                    json_decref(ps);
                    ps = NULL;
                }
            }
            if (!ps)
                return bl_err_set(err, BL_ENOMEM, "out of memory");
            char prefix[48];
            snprintf(prefix, sizeof prefix, "t%zu-p%zu-", k, j);
            bl_err_t e2 = {0};
            int rc = gb_schema(tail, ps, prefix, &e2);
            json_decref(ps);
            if (rc)
                return bl_err_set(err, rc == BL_ENOMEM ? BL_ENOMEM : BL_EINVAL,
                                  "tools[%zu]: the parameters' property '%.64s': %s", k, key,
                                  rc == BL_ENOMEM ? "out of memory" : e2.msg);
            gb_fmt(g, " fc-ws t%zu-p%zu-root fc-ws", k, j);
            gb_lit(g, kv->val_close, strlen(kv->val_close));
        }
        if (!required)
            gb_str(g, " )?");
        j++;
    }
    return 0; /* the buffers keep their own failures */
}

int rt__gen_force_tools(rt_gen_params_t *p, const json_t *tools, const char *name, int one_call,
                        int think, bl_err_t *err)
{
    if (p->task.sampling.grammar)
        return bl_err_set(err, BL_EINVAL, "'tool_choice' cannot force a call together with "
                                          "'grammar', 'json_schema' or a JSON 'response_format'");
    const rt_callform_t *f = rt_chatfmt_callform(p->fmt);
    gb_t g = {0}, tail = {0};
    int rc = 0, free_keys = 0;
    size_t n = 0, i;
    json_t *t;
    /* one rule per callable tool: fc-tK, its arguments tK-root (JSON) or fc-aK */
    json_array_foreach(tools, i, t) {
        json_t *fn = json_object_get(t, "function");
        const char *tn = json_string_value(json_object_get(fn, "name"));
        if (name && strcmp(tn, name) != 0)
            continue;
        const json_t *params = json_object_get(fn, "parameters");
        char args[48];
        if (f->kv) {
            gb_t rule = {0};
            rc = kv_args(&rule, &tail, f->kv, params, i, &free_keys, err);
            gb_add(&tail, rule.b.p ? rule.b.p : "", rule.b.n);
            if (rule.rc && !tail.rc)
                tail.rc = rule.rc;
            bl_buf_free(&rule.b);
            if (rc)
                break;
            snprintf(args, sizeof args, "fc-a%zu", i);
        } else {
            json_t *any = json_is_object(params) ? NULL : json_pack("{s:s}", "type", "object");
            char prefix[32];
            snprintf(prefix, sizeof prefix, "t%zu-", i);
            bl_err_t e2 = {0};
            rc = (!json_is_object(params) && !any) ? BL_ENOMEM
                                                   : gb_schema(&tail, any ? any : params, prefix, &e2);
            json_decref(any);
            if (rc) {
                bl_err_set(err, rc == BL_ENOMEM ? BL_ENOMEM : BL_EINVAL, "tools[%zu]: the "
                           "parameters: %s", i, rc == BL_ENOMEM ? "out of memory" : e2.msg);
                break;
            }
            snprintf(args, sizeof args, "t%zu-root", i);
        }
        gb_fmt(&g, "%sfc-t%zu", n++ ? " | " : "fc-call ::= ", i);
        gb_fmt(&tail, "\nfc-t%zu ::=", i);
        gb_form(&tail, f->call, tn, args, f->json_name);
    }
    if (!rc && n == 0)
        rc = bl_err_set(err, BL_EINVAL, "'tool_choice' names the function \"%.64s\", which "
                                        "'tools' does not list", name ? name : "");
    if (!rc) {
        /* the calls */
        bl_buf_t calls = g.b;
        g.b = (bl_buf_t){0};
        gb_str(&g, "root ::=");
        gb_form(&g, f->open, "", "", 0);
        gb_str(&g, " fc-call");
        if (!one_call && !f->single) {
            gb_str(&g, " (");
            gb_form(&g, f->sep, "", "", 0);
            gb_str(&g, " fc-call )*");
        }
        gb_form(&g, f->close, "", "", 0);
        gb_str(&g, "\n");
        gb_add(&g, calls.p ? calls.p : "", calls.n);
        bl_buf_free(&calls);
        gb_str(&g, "\nfc-ws ::= [ \\t\\n]{0,20}");
        if (free_keys && !tail.rc &&
            (rt__gen_gbnf_until(&tail.b, "fc-key", f->kv->key_close) ||
             rt__gen_gbnf_until(&tail.b, "fc-val", f->kv->val_close)))
            tail.rc = BL_ENOMEM;
        gb_add(&g, tail.b.p ? tail.b.p : "", tail.b.n);
        gb_str(&g, "\n");
        rc = g.rc ? g.rc : tail.rc;
        if (rc)
            bl_err_set(err, rc, rc == BL_ERANGE ? "'tools': the grammar that forces a call "
                                                  "would be over %u bytes"
                                                : "out of memory",
                       FORCE_MAX_GBNF);
    }
    char *out = NULL;
    bl_err_t e2 = {0};
    if (!rc && (rc = rt__gen_grammar_wrap(g.b.p, think, p->fmt, "%R", &out, &e2)))
        bl_err_set(err, rc, "'tools': %s", e2.msg);
    bl_buf_free(&g.b);
    bl_buf_free(&tail.b);
    if (rc)
        return rc;
    free(p->grammar);
    p->grammar = out;
    p->task.sampling.grammar = out;
    p->task.sampling.grammar_len = strlen(out);
    return 0;
}

int rt__gen_thinking_off(const rt_app_t *app, const json_t *kwargs, const char *prompt, size_t len)
{
    /* the request's arguments sit over the server's, as rt__gen_render_chat merges them */
    const json_t *on = json_object_get(kwargs, "enable_thinking");
    if (!json_is_boolean(on) && app->tpl_kwargs)
        on = json_object_get(app->tpl_kwargs, "enable_thinking");
    if (json_is_false(on))
        return 1;
    /* a template that closes the thought in its generation prompt (DeepSeek-V3.1's
     * "</think>" when thinking is not asked for) has turned it off itself */
    const char *open, *close;
    rt_chatfmt_think_tags(app->chatfmt, &open, &close);
    const size_t cl = close ? strlen(close) : 0;
    while (len > 0 && (prompt[len - 1] == ' ' || prompt[len - 1] == '\n' || prompt[len - 1] == '\r' ||
                       prompt[len - 1] == '\t'))
        len--;
    return cl > 0 && len >= cl && !memcmp(prompt + len - cl, close, cl);
}

int rt__gen_message_tool_calls(const json_t *calls, size_t mi, json_t **out, bl_err_t *err)
{
    *out = NULL;
    if (!json_is_array(calls))
        return bl_err_set(err, BL_EINVAL, "messages[%zu]: 'tool_calls' must be an array", mi);
    json_t *arr = json_array();
    if (!arr)
        return bl_err_set(err, BL_ENOMEM, "out of memory");
    size_t i;
    json_t *c;
    json_array_foreach(calls, i, c) {
        json_t *fn = json_is_object(c) ? json_object_get(c, "function") : NULL;
        json_t *name = json_is_object(fn) ? json_object_get(fn, "name") : NULL;
        json_t *args = json_is_object(fn) ? json_object_get(fn, "arguments") : NULL;
        json_t *id = json_is_object(c) ? json_object_get(c, "id") : NULL;
        if (!json_is_string(name) || (args && !json_is_string(args) && !json_is_object(args)) ||
            (id && !json_is_null(id) && !json_is_string(id))) {
            json_decref(arr);
            return bl_err_set(err, BL_EINVAL,
                              "messages[%zu].tool_calls[%zu] must be {\"id\", \"type\": "
                              "\"function\", \"function\": {\"name\", \"arguments\"}}", mi, i);
        }
        /* arguments as the JSON text the model wrote (an object is written out) */
        char *text = args && json_is_object(args)
                         ? json_dumps(args, JSON_COMPACT | JSON_PRESERVE_ORDER)
                         : strdup(args ? json_string_value(args) : "{}");
        json_t *o = text ? json_pack("{s:s, s:{s:O, s:s}}", "type", "function", "function",
                                     "name", name, "arguments", text)
                         : NULL;
        free(text);
        if (!o || (json_is_string(id) && json_object_set(o, "id", id)) ||
            json_array_append_new(arr, o)) {
            json_decref(arr);
            return bl_err_set(err, BL_ENOMEM, "out of memory");
        }
    }
    *out = arr;
    return 0;
}

/* ---------------------------------------------------------------------------- */
/* reply                                                                          */
/* ---------------------------------------------------------------------------- */

size_t rt__gen_calls_kept(const rt_gen_req_t *g)
{
    size_t n = json_array_size(g->calls.calls);
    return g->params.one_call && n > 1 ? 1 : n;
}
