/* Tool calls in the Hermes form Qwen's chat templates teach the model:
 *
 *   <tool_call>
 *   {"name": "get_weather", "arguments": {"city": "Paris"}}
 *   </tool_call>
 *
 * The request side checks OpenAI's "tools" and the tool_calls of assistant messages
 * (the template renders both); the reply side splits generated content into text and
 * calls, fed piece by piece so that a stream never shows a tag or half a call.
 *
 * Thread: the loop thread. */
#include "api_gen_impl.h"
#include "json_schema.h"
#include "log.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

static const char CALL_OPEN[] = "<tool_call>";
static const char CALL_CLOSE[] = "</tool_call>";
#define OPEN_LEN (sizeof CALL_OPEN - 1)
#define CLOSE_LEN (sizeof CALL_CLOSE - 1)

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

/* A tool's parameters, copied for their place in the forced call's schema, where
 * the root is the call's anyOf and no longer the parameters: the refs of tool k
 * move to the call schema's $defs, "#" to "#/$defs/tK", "#/$defs/N" to
 * "#/$defs/tK.N" and "#/definitions/N" to "#/$defs/tK:N" (the separators keep every
 * tool's names, and the two kinds, apart). Values that are data and not schemas
 * (const, enum, default, examples) keep their text. */
static int rebase_refs(json_t *v, const char *stem)
{
    if (json_is_array(v)) {
        size_t i;
        json_t *x;
        json_array_foreach(v, i, x) {
            if (rebase_refs(x, stem))
                return BL_ENOMEM;
        }
        return 0;
    }
    if (!json_is_object(v))
        return 0;
    const char *k;
    json_t *x;
    json_object_foreach(v, k, x) {
        if (!strcmp(k, "const") || !strcmp(k, "enum") || !strcmp(k, "default") ||
            !strcmp(k, "examples"))
            continue;
        if (strcmp(k, "$ref") || !json_is_string(x)) {
            /* a map of names (properties, $defs, ...) holds schemas: its keys are not
             * keywords, and a recursive walk reads them as names, never as "$ref" */
            if (!strcmp(k, "properties") || !strcmp(k, "patternProperties") ||
                !strcmp(k, "$defs") || !strcmp(k, "definitions") ||
                !strcmp(k, "dependentSchemas")) {
                const char *n;
                json_t *s;
                json_object_foreach(x, n, s) {
                    if (rebase_refs(s, stem))
                        return BL_ENOMEM;
                }
            } else if (rebase_refs(x, stem)) {
                return BL_ENOMEM;
            }
            continue;
        }
        const char *r = json_string_value(x);
        const char *to = NULL, *rest = NULL;
        if (!strcmp(r, "#"))
            to = "", rest = "";
        else if (!strncmp(r, "#/$defs/", 8))
            to = ".", rest = r + 8;
        else if (!strncmp(r, "#/definitions/", 14))
            to = ":", rest = r + 14;
        if (!to)
            continue; /* a form the converter refuses, alone as here */
        size_t n = strlen(stem) + strlen(rest) + 16;
        char *ref = malloc(n);
        if (!ref)
            return BL_ENOMEM;
        snprintf(ref, n, "#/$defs/%s%s%s", stem, to, rest);
        int bad = json_string_set(x, ref);
        free(ref);
        if (bad)
            return BL_ENOMEM;
    }
    return 0;
}

/* Tool k's parameters (NULL: any object) for the forced call's schema, and their
 * definitions added to defs under their new names. NULL when out of memory. */
static json_t *call_arguments(const json_t *params, size_t k, json_t *defs)
{
    if (!params || json_is_null(params))
        return json_pack("{s:s}", "type", "object");
    char stem[32];
    snprintf(stem, sizeof stem, "t%zu", k);
    json_t *args = json_deep_copy(params);
    if (!args || rebase_refs(args, stem))
        goto oom;
    static const char *const kinds[] = {"$defs", "definitions"};
    for (int d = 0; d < 2; d++) {
        json_t *m = json_object_get(args, kinds[d]);
        if (!json_is_object(m))
            continue; /* the converter names what is wrong with it */
        const char *n;
        json_t *s;
        json_object_foreach(m, n, s) {
            size_t len = strlen(stem) + strlen(n) + 2;
            char *name = malloc(len);
            if (!name)
                goto oom;
            snprintf(name, len, "%s%s%s", stem, d ? ":" : ".", n);
            int bad = json_object_set(defs, name, s);
            free(name);
            if (bad)
                goto oom;
        }
        json_object_del(args, kinds[d]);
    }
    /* "#" named the parameters themselves */
    if (json_object_set(defs, stem, args))
        goto oom;
    return args;
oom:
    json_decref(args);
    return NULL;
}

int rt__gen_force_tools(rt_gen_params_t *p, const json_t *tools, const char *name, int one_call,
                        int think, bl_err_t *err)
{
    if (p->task.sampling.grammar)
        return bl_err_set(err, BL_EINVAL, "'tool_choice' cannot force a call together with "
                                          "'grammar', 'json_schema' or a JSON 'response_format'");
    /* one object schema per callable tool: {"name": const, "arguments": parameters} */
    json_t *any = json_array(), *defs = json_object();
    json_t *schema = json_pack("{s:o, s:o}", "anyOf", any, "$defs", defs);
    if (!any || !defs || !schema) {
        json_decref(schema);
        return bl_err_set(err, BL_ENOMEM, "out of memory");
    }
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *fn = json_object_get(t, "function");
        const char *n = json_string_value(json_object_get(fn, "name"));
        if (name && strcmp(n, name) != 0)
            continue;
        json_t *args = call_arguments(json_object_get(fn, "parameters"), i, defs);
        json_t *one = args ? json_pack("{s:s, s:{s:{s:s}, s:o}, s:[s,s], s:b}", "type", "object",
                                       "properties", "name", "const", n, "arguments", args,
                                       "required", "name", "arguments", "additionalProperties", 0)
                           : NULL;
        if (!one || json_array_append_new(any, one)) {
            json_decref(schema);
            return bl_err_set(err, BL_ENOMEM, "out of memory");
        }
    }
    if (json_array_size(any) == 0) {
        json_decref(schema);
        return bl_err_set(err, BL_EINVAL, "'tool_choice' names the function \"%.64s\", which "
                                          "'tools' does not list", name ? name : "");
    }
    char *call = NULL;
    bl_err_t e2 = {0};
    int rc = rt_json_schema_to_gbnf(schema, &call, &e2);
    json_decref(schema);
    if (rc == BL_ENOMEM)
        return bl_err_set(err, rc, "out of memory");
    if (rc) {
        /* name the tool whose parameters are refused alone, where their own paths
         * mean something; else the limit is the whole call's */
        json_array_foreach(tools, i, t) {
            json_t *fn = json_object_get(t, "function");
            const json_t *params = json_object_get(fn, "parameters");
            if ((name && strcmp(json_string_value(json_object_get(fn, "name")), name) != 0) ||
                !params || json_is_null(params))
                continue;
            char *alone = NULL;
            bl_err_t e3 = {0};
            int rc3 = rt_json_schema_to_gbnf(params, &alone, &e3);
            free(alone);
            if (rc3)
                return bl_err_set(err, rc3 == BL_ENOMEM ? BL_ENOMEM : BL_EINVAL,
                                  "tools[%zu]: the parameters: %s", i, e3.msg);
        }
        return bl_err_set(err, BL_EINVAL, "'tools': the forced call of every tool together: %s",
                          e2.msg);
    }
    /* one call, tags and all; "%R" is the call object, "%W" whitespace */
    const char *body = one_call ? "%W \"<tool_call>\" %W %R %W \"</tool_call>\""
                                : "%W \"<tool_call>\" %W %R %W \"</tool_call>\" ( %W "
                                  "\"<tool_call>\" %W %R %W \"</tool_call>\" )*";
    char *g = NULL;
    rc = rt__gen_grammar_wrap(call, think, body, &g, &e2);
    free(call);
    if (rc)
        return bl_err_set(err, rc, "'tools': %s", e2.msg);
    free(p->grammar);
    p->grammar = g;
    p->task.sampling.grammar = g;
    p->task.sampling.grammar_len = strlen(g);
    return 0;
}

int rt__gen_thinking_off(const rt_app_t *app, const json_t *kwargs)
{
    /* the request's arguments sit over the server's, as rt__gen_render_chat merges them */
    const json_t *on = json_object_get(kwargs, "enable_thinking");
    if (!json_is_boolean(on) && app->tpl_kwargs)
        on = json_object_get(app->tpl_kwargs, "enable_thinking");
    return json_is_false(on);
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

void rt__gen_tools_init(rt_gen_tools_t *t)
{
    memset(t, 0, sizeof *t);
}

void rt__gen_tools_fini(rt_gen_tools_t *t)
{
    rt__gen_buf_free(&t->hold);
    rt__gen_buf_free(&t->args);
    json_decref(t->calls);
    json_decref(t->open_name);
    t->calls = NULL;
    t->open_name = NULL;
}

/* "call_" and 24 random letters and digits, as OpenAI's ids look. */
static void call_id(char out[32])
{
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    unsigned char r[24];
    if (getrandom(r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) {
        static unsigned seq;
        for (size_t i = 0; i < sizeof r; i++)
            r[i] = (unsigned char)(++seq * 2654435761u >> 24);
    }
    memcpy(out, "call_", 5);
    for (size_t i = 0; i < sizeof r; i++)
        out[5 + i] = abc[r[i] % (sizeof abc - 1)];
    out[29] = '\0';
}

/* The call a <tool_call> body holds: {"name": "...", "arguments": {...}} (arguments
 * may also be a JSON string). NULL when it is not one, or out of memory. */
static json_t *parse_call(const char *s, size_t n, const char *id_given)
{
    json_error_t e;
    json_t *j = json_loadb(s, n, 0, &e);
    json_t *name = json_is_object(j) ? json_object_get(j, "name") : NULL;
    json_t *args = json_is_object(j) ? json_object_get(j, "arguments") : NULL;
    json_t *call = NULL;
    if (json_is_string(name) && json_string_length(name) > 0 &&
        (!args || json_is_object(args) || json_is_string(args))) {
        char *text = !args ? strdup("{}")
                     : json_is_string(args)
                         ? strdup(json_string_value(args))
                         : json_dumps(args, JSON_COMPACT | JSON_PRESERVE_ORDER);
        char id[32];
        if (id_given)
            snprintf(id, sizeof id, "%s", id_given);
        else
            call_id(id);
        if (text)
            call = json_pack("{s:s, s:s, s:{s:O, s:s}}", "id", id, "type", "function", "function",
                             "name", name, "arguments", text);
        free(text);
    }
    json_decref(j);
    return call;
}

static void args_advance(rt_gen_tools_t *t, const char *b, size_t n);

/* One finished <tool_call> body: a call, or (not a call) the whole span as text, its
 * closing tag only if it had one. */
static int close_call(rt_gen_tools_t *t, const char *body, size_t n, int closed,
                      rt_gen_buf_t *text)
{
    json_t *call = parse_call(body, n, t->open ? t->open_id : NULL);
    if (t->open) { /* the arguments' last bytes, up to the end of their object */
        args_advance(t, body, n);
        t->open = 0;
        json_decref(t->open_name);
        t->open_name = NULL;
    }
    if (call) {
        if (!t->calls && !(t->calls = json_array())) {
            json_decref(call);
            return BL_ENOMEM;
        }
        return json_array_append_new(t->calls, call) ? BL_ENOMEM : 0;
    }
    return rt__gen_buf_add(text, CALL_OPEN, OPEN_LEN) || rt__gen_buf_add(text, body, n) ||
                   (closed && rt__gen_buf_add(text, CALL_CLOSE, CLOSE_LEN))
               ? BL_ENOMEM
               : 0;
}

/* Skips JSON blanks from i; the index of the first other byte. */
static size_t skip_ws(const char *s, size_t n, size_t i)
{
    while (i < n && strchr(" \t\r\n", s[i]))
        i++;
    return i;
}

/* An open call's header: the body so far begins {"name": "NAME", "arguments": {
 * (blanks anywhere between). Sets the open state; 0 when not (yet) that. */
static int find_header(rt_gen_tools_t *t, const char *b, size_t n)
{
    size_t i = skip_ws(b, n, 0);
    static const char key1[] = "\"name\"", key2[] = "\"arguments\"";
    if (i >= n || b[i] != '{')
        return 0;
    i = skip_ws(b, n, i + 1);
    if (n - i < sizeof key1 - 1 || memcmp(b + i, key1, sizeof key1 - 1))
        return 0;
    i = skip_ws(b, n, i + sizeof key1 - 1);
    if (i >= n || b[i] != ':')
        return 0;
    i = skip_ws(b, n, i + 1);
    if (i >= n || b[i] != '"')
        return 0;
    size_t e = i + 1; /* the name's end quote, past escapes */
    while (e < n && b[e] != '"')
        e += b[e] == '\\' ? 2 : 1;
    if (e >= n)
        return 0;
    json_error_t je;
    json_t *name = json_loadb(b + i, e + 1 - i, JSON_DECODE_ANY, &je);
    if (!json_is_string(name) || json_string_length(name) == 0) {
        json_decref(name);
        return 0;
    }
    i = skip_ws(b, n, e + 1);
    if (i < n && b[i] == ',')
        i = skip_ws(b, n, i + 1);
    if (i >= n || n - i < sizeof key2 - 1 || memcmp(b + i, key2, sizeof key2 - 1)) {
        json_decref(name);
        return 0;
    }
    i = skip_ws(b, n, i + sizeof key2 - 1);
    if (i >= n || b[i] != ':') {
        json_decref(name);
        return 0;
    }
    i = skip_ws(b, n, i + 1);
    if (i >= n || b[i] != '{') { /* arguments as a string, or not yet begun: whole at the end */
        json_decref(name);
        return 0;
    }
    t->open = 1;
    t->open_name = name;
    call_id(t->open_id);
    t->args_at = t->args_scan = i;
    t->depth = t->in_str = t->esc = 0;
    return 1;
}

/* Releases the open call's argument bytes read since the last time, up to the end of
 * their object (never past it, nor into a UTF-8 character not yet whole). */
static void args_advance(rt_gen_tools_t *t, const char *b, size_t n)
{
    size_t i = t->args_scan, from = i;
    for (; i < n; i++) {
        const char c = b[i];
        if (t->in_str) {
            if (t->esc)
                t->esc = 0;
            else if (c == '\\')
                t->esc = 1;
            else if (c == '"')
                t->in_str = 0;
        } else if (c == '"') {
            t->in_str = 1;
        } else if (c == '{' || c == '[') {
            t->depth++;
        } else if (c == '}' || c == ']') {
            if (--t->depth == 0) {
                i++;
                break;
            }
        }
        if (t->depth == 0 && i > t->args_at) /* past the object: stop */
            break;
    }
    size_t to = i;
    while (to > from && ((unsigned char)b[to - 1] & 0xC0) == 0x80)
        to--; /* a continuation byte at the end: hold its character back */
    if (to > from && (unsigned char)b[to - 1] >= 0xC0)
        to--;
    if (to < i) { /* rescan those bytes next time */
        t->args_scan = to;
        /* undo the scanner's view of them: only string bytes can be cut, so the state
         * is "in a string, no escape" */
        t->in_str = 1;
        t->esc = 0;
    } else {
        t->args_scan = i;
    }
    if (to > from && rt__gen_buf_add(&t->args, b + from, to - from))
        BL_LOG(BL_LOG_WARN, "event=tool_arguments_lost reason=out_of_memory");
}

int rt__gen_tools_feed(rt_gen_tools_t *t, const char *s, size_t n, int last, rt_gen_buf_t *text)
{
    rt_gen_buf_t *h = &t->hold;
    if (n && rt__gen_buf_add(h, s, n))
        return BL_ENOMEM;
    for (;;) {
        if (!t->in_call) {
            const char *o = h->n >= OPEN_LEN ? memmem(h->p, h->n, CALL_OPEN, OPEN_LEN) : NULL;
            if (!o) /* text, but for an end that may become <tool_call> */
                return rt__gen_buf_move(
                    h, h->n - (last ? 0 : rt__gen_tag_tail(h->p, h->n, CALL_OPEN, OPEN_LEN)), text);
            if (rt__gen_buf_move(h, (size_t)(o - h->p), text))
                return BL_ENOMEM;
            rt__gen_buf_consume(h, OPEN_LEN);
            t->in_call = 1;
            continue;
        }
        const char *c = h->n >= CLOSE_LEN ? memmem(h->p, h->n, CALL_CLOSE, CLOSE_LEN) : NULL;
        if (!c && !last) { /* the body is still coming: its arguments as far as they go */
            if (!t->open)
                find_header(t, h->p, h->n);
            if (t->open)
                args_advance(t, h->p, h->n - rt__gen_tag_tail(h->p, h->n, CALL_CLOSE, CLOSE_LEN));
            return 0;
        }
        t->in_call = 0;
        if (!c && h->n == 0) /* the text ended right after <tool_call> */
            return rt__gen_buf_add(text, CALL_OPEN, OPEN_LEN) ? BL_ENOMEM : 0;
        /* closed, or the text ended inside the call (a model that stops right after
         * the JSON): the body as it is */
        const size_t body = c ? (size_t)(c - h->p) : h->n;
        if (close_call(t, h->p, body, c != NULL, text))
            return BL_ENOMEM;
        rt__gen_buf_consume(h, c ? body + CLOSE_LEN : body);
        if (h->n == 0)
            return 0;
    }
}
