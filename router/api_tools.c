/* Tool calls, the request's side: OpenAI's "tools" and the tool_calls of assistant
 * messages checked (the template renders both), and a call forced by a grammar
 * when tool_choice asks for one. The reply's side is toolcall.c.
 *
 * Thread: the loop thread. */
#include "api_gen_impl.h"
#include "json_schema.h"
#include "log.h"

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
    if (!rt_chatfmt_can_force(p->fmt))
        return bl_err_set(err, BL_EINVAL, "'tool_choice': this model's template writes calls in "
                          "the %s form, for which forcing a call is not supported; use \"auto\"",
                          rt_chatfmt_name(p->fmt));
    const int llama3 = p->fmt == RT_CHATFMT_LLAMA3;
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
        const char *akey = llama3 ? "parameters" : "arguments";
        json_t *one = args ? json_pack("{s:s, s:{s:{s:s}, s:o}, s:[s,s], s:b}", "type", "object",
                                       "properties", "name", "const", n, akey, args,
                                       "required", "name", akey, "additionalProperties", 0)
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
    const char *body = llama3 ? (one_call ? "%W %R" : "%W %R ( %W %R )*")
                       : one_call ? "%W \"<tool_call>\" %W %R %W \"</tool_call>\""
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
