/* The Anthropic Messages API: POST /v1/messages (streamed as message_start,
 * content_block_start/delta/stop, message_delta, message_stop) and
 * /v1/messages/count_tokens, with errors in Anthropic's shape. A reply's <think>
 * span becomes a "thinking" block before the text block, as llama-server does.
 *
 * Thread: the loop thread. */
#include "api_gen_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { BLOCK_NONE = 0, BLOCK_THINKING = 1, BLOCK_TEXT = 2 };

/* ---------------------------------------------------------------------------- */
/* requests                                                                       */
/* ---------------------------------------------------------------------------- */

/* Appends the text of an Anthropic system value (a string or text blocks). */
static int system_text(const json_t *sys, rt_gen_buf_t *out, bl_err_t *err)
{
    if (json_is_string(sys))
        return rt__gen_buf_add(out, json_string_value(sys), json_string_length(sys))
                   ? bl_err_set(err, BL_ENOMEM, "out of memory")
                   : 0;
    if (!json_is_array(sys))
        return bl_err_set(err, BL_EINVAL, "'system' must be a string or an array of text blocks");
    size_t i;
    json_t *b;
    json_array_foreach(sys, i, b) {
        json_t *type = json_is_object(b) ? json_object_get(b, "type") : NULL;
        json_t *text = json_is_object(b) ? json_object_get(b, "text") : NULL;
        if (!json_is_string(type) || strcmp(json_string_value(type), "text") ||
            !json_is_string(text))
            return bl_err_set(err, BL_EINVAL,
                              "system[%zu] must be a text block {\"type\": \"text\", \"text\": ...}",
                              i);
        /* llama-server joins system blocks with nothing between them */
        if (rt__gen_buf_add(out, json_string_value(text), json_string_length(text)))
            return bl_err_set(err, BL_ENOMEM, "out of memory");
    }
    return 0;
}

/* The text of a tool_result block's content: a string or text blocks, joined. */
static int tool_result_text(const json_t *c, size_t i, size_t j, rt_gen_buf_t *out, bl_err_t *err)
{
    if (!c || json_is_null(c) || json_is_string(c))
        return rt__gen_buf_add(out, json_is_string(c) ? json_string_value(c) : "",
                               json_is_string(c) ? json_string_length(c) : 0)
                   ? bl_err_set(err, BL_ENOMEM, "out of memory")
                   : 0;
    size_t k;
    json_t *b;
    if (json_is_array(c))
        json_array_foreach(c, k, b) {
            json_t *type = json_is_object(b) ? json_object_get(b, "type") : NULL;
            json_t *text = json_is_object(b) ? json_object_get(b, "text") : NULL;
            if (!json_is_string(type) || strcmp(json_string_value(type), "text") ||
                !json_is_string(text))
                return bl_err_set(err, BL_EINVAL, "messages[%zu].content[%zu].content[%zu]: only "
                                                  "text blocks are supported in a tool result",
                                  i, j, k);
            if ((k && rt__gen_buf_add(out, "\n", 1)) ||
                rt__gen_buf_add(out, json_string_value(text), json_string_length(text)))
                return bl_err_set(err, BL_ENOMEM, "out of memory");
        }
    else
        return bl_err_set(err, BL_EINVAL, "messages[%zu].content[%zu]: a tool_result's content "
                                          "must be a string or text blocks", i, j);
    return 0;
}

/* A tool_use block as an OpenAI tool call, appended to the message's tool_calls. */
static int tool_use_call(json_t *o, const json_t *b, size_t i, size_t j, bl_err_t *err)
{
    json_t *id = json_object_get(b, "id"), *name = json_object_get(b, "name"),
           *input = json_object_get(b, "input");
    if (!json_is_string(id) || !json_is_string(name) || (input && !json_is_object(input)))
        return bl_err_set(err, BL_EINVAL, "messages[%zu].content[%zu]: a tool_use block needs a "
                                          "string 'id' and 'name' and an object 'input'", i, j);
    json_t *calls = json_object_get(o, "tool_calls");
    if (!calls && (json_object_set_new(o, "tool_calls", json_array()) ||
                   !(calls = json_object_get(o, "tool_calls"))))
        return bl_err_set(err, BL_ENOMEM, "out of memory");
    json_t *call = json_pack("{s:O, s:s, s:{s:O, s:o}}", "id", id, "type", "function", "function",
                             "name", name, "arguments", input ? json_incref(input) : json_object());
    return !call || json_array_append_new(calls, call) ? bl_err_set(err, BL_ENOMEM, "out of memory")
                                                       : 0;
}

/* One Anthropic message as OpenAI-style ones: text blocks become text parts, thinking
 * blocks the reasoning_content, tool_use blocks tool_calls, and each tool_result
 * block a "tool" message before what remains of the user's. */
static int convert_message(const json_t *m, size_t i, json_t *out_arr, bl_err_t *err)
{
    if (!json_is_object(m))
        return bl_err_set(err, BL_EINVAL, "messages[%zu] must be an object", i);
    json_t *role = json_object_get(m, "role");
    if (!json_is_string(role))
        return bl_err_set(err, BL_EINVAL, "messages[%zu]: 'role' must be a string", i);
    const char *r = json_string_value(role);
    if (strcmp(r, "user") && strcmp(r, "assistant"))
        return bl_err_set(err, BL_EINVAL,
                          "messages[%zu]: unknown role \"%.64s\" (user or assistant)", i, r);
    json_t *content = json_object_get(m, "content");
    if (!content || json_is_null(content))
        return bl_err_set(err, BL_EINVAL, "messages[%zu]: 'content' is required", i);
    json_t *o = json_pack("{s:s}", "role", r);
    if (!o)
        return bl_err_set(err, BL_ENOMEM, "out of memory");
    if (json_is_string(content)) {
        int bad = json_object_set(o, "content", content) || json_array_append(out_arr, o);
        json_decref(o);
        return bad ? bl_err_set(err, BL_ENOMEM, "out of memory") : 0;
    }
    if (!json_is_array(content)) {
        json_decref(o);
        return bl_err_set(err, BL_EINVAL,
                          "messages[%zu]: 'content' must be a string or an array of blocks", i);
    }
    json_t *parts = json_array();
    if (!parts || json_object_set_new(o, "content", parts)) {
        json_decref(o);
        return bl_err_set(err, BL_ENOMEM, "out of memory");
    }
    int rc = 0, n_results = 0;
    size_t j;
    json_t *b;
    json_array_foreach(content, j, b) {
        json_t *type = json_is_object(b) ? json_object_get(b, "type") : NULL;
        if (!json_is_string(type)) {
            rc = bl_err_set(err, BL_EINVAL,
                            "messages[%zu].content[%zu] must be a block with a string 'type'", i, j);
            break;
        }
        const char *t = json_string_value(type);
        if (!strcmp(t, "text")) {
            json_t *text = json_object_get(b, "text");
            if (!json_is_string(text)) {
                rc = bl_err_set(err, BL_EINVAL,
                                "messages[%zu].content[%zu]: a text block needs a string 'text'",
                                i, j);
                break;
            }
            if (json_array_append_new(parts, json_pack("{s:s, s:O}", "type", "text", "text", text))) {
                rc = bl_err_set(err, BL_ENOMEM, "out of memory");
                break;
            }
        } else if (!strcmp(t, "thinking") && !strcmp(r, "assistant")) {
            json_t *th = json_object_get(b, "thinking");
            if (json_is_string(th) && json_object_set(o, "reasoning_content", th)) {
                rc = bl_err_set(err, BL_ENOMEM, "out of memory");
                break;
            }
        } else if (!strcmp(t, "redacted_thinking") && !strcmp(r, "assistant")) {
            continue; /* opaque to this server */
        } else if (!strcmp(t, "image") || !strcmp(t, "document")) {
            rc = bl_err_set(err, BL_EINVAL, "messages[%zu].content[%zu]: %s input is not supported",
                            i, j, t);
            break;
        } else if (!strcmp(t, "tool_use") && !strcmp(r, "assistant")) {
            if ((rc = tool_use_call(o, b, i, j, err)))
                break;
        } else if (!strcmp(t, "tool_result") && !strcmp(r, "user")) {
            json_t *id = json_object_get(b, "tool_use_id");
            rt_gen_buf_t text = {0};
            if (!json_is_string(id))
                rc = bl_err_set(err, BL_EINVAL, "messages[%zu].content[%zu]: a tool_result needs "
                                                "a string 'tool_use_id'", i, j);
            else if (!(rc = tool_result_text(json_object_get(b, "content"), i, j, &text, err)) &&
                     json_array_append_new(out_arr,
                                           json_pack("{s:s, s:O, s:s%}", "role", "tool",
                                                     "tool_call_id", id, "content",
                                                     text.p ? text.p : "", text.n)))
                rc = bl_err_set(err, BL_ENOMEM, "out of memory");
            rt__gen_buf_free(&text);
            if (rc)
                break;
            n_results++;
        } else {
            rc = bl_err_set(err, BL_EINVAL, "messages[%zu].content[%zu]: %s \"%.64s\"", i, j,
                            !strcmp(t, "tool_use") || !strcmp(t, "tool_result")
                                ? "a block of another role:"
                                : "unsupported block type",
                            t);
            break;
        }
    }
    /* a user message of only tool results is those results */
    if (!rc && (!n_results || json_array_size(parts) > 0) && json_array_append(out_arr, o))
        rc = bl_err_set(err, BL_ENOMEM, "out of memory");
    json_decref(o);
    return rc;
}

int rt__gen_anthropic_messages(const json_t *body, json_t **out, bl_err_t *err)
{
    *out = NULL;
    if (!json_is_object(body))
        return bl_err_set(err, BL_EINVAL, "the request body must be a JSON object");
    json_t *msgs = json_object_get(body, "messages");
    if (!msgs || json_is_null(msgs))
        return bl_err_set(err, BL_EINVAL, "'messages' is required");
    if (!json_is_array(msgs))
        return bl_err_set(err, BL_EINVAL, "'messages' must be an array");
    if (json_array_size(msgs) == 0)
        return bl_err_set(err, BL_EINVAL, "'messages' must not be empty");
    json_t *arr = json_array();
    if (!arr)
        return bl_err_set(err, BL_ENOMEM, "out of memory");
    int rc = 0;
    json_t *sys = json_object_get(body, "system");
    if (sys && !json_is_null(sys)) {
        rt_gen_buf_t text = {0};
        rc = system_text(sys, &text, err);
        if (!rc && text.n &&
            json_array_append_new(arr, json_pack("{s:s, s:s%}", "role", "system", "content",
                                                 text.p, text.n)))
            rc = bl_err_set(err, BL_ENOMEM, "out of memory");
        rt__gen_buf_free(&text);
        if (rc)
            goto fail;
    }
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        if ((rc = convert_message(m, i, arr, err)))
            goto fail;
    }
    *out = arr;
    return 0;
fail:
    json_decref(arr);
    return rc;
}

/* Anthropic's tools ({"name", "description"?, "input_schema"}) as OpenAI function
 * tools for the template; *out a new array. Tools run by the provider (a "type"
 * other than "custom") are refused. */
static int convert_tools(const json_t *tools, json_t **out, bl_err_t *err)
{
    *out = NULL;
    if (!json_is_array(tools))
        return bl_err_set(err, BL_EINVAL, "'tools' must be an array");
    json_t *arr = json_array();
    if (!arr)
        return bl_err_set(err, BL_ENOMEM, "out of memory");
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *type = json_is_object(t) ? json_object_get(t, "type") : NULL;
        json_t *name = json_is_object(t) ? json_object_get(t, "name") : NULL;
        json_t *schema = json_is_object(t) ? json_object_get(t, "input_schema") : NULL;
        json_t *desc = json_is_object(t) ? json_object_get(t, "description") : NULL;
        if (type && !json_is_null(type) &&
            !(json_is_string(type) && !strcmp(json_string_value(type), "custom"))) {
            json_decref(arr);
            return bl_err_set(err, BL_EINVAL, "tools[%zu]: server tools (type \"%.64s\") are "
                                              "not supported; only client tools", i,
                              json_is_string(type) ? json_string_value(type) : "?");
        }
        if (!json_is_string(name) || !json_is_object(schema) ||
            (desc && !json_is_null(desc) && !json_is_string(desc))) {
            json_decref(arr);
            return bl_err_set(err, BL_EINVAL, "tools[%zu] must be {\"name\", \"description\"?, "
                                              "\"input_schema\": {...}}", i);
        }
        json_t *fn = json_pack("{s:O, s:O}", "name", name, "parameters", schema);
        if (!fn || (json_is_string(desc) && json_object_set(fn, "description", desc)) ||
            json_array_append_new(arr, json_pack("{s:s, s:o}", "type", "function", "function", fn))) {
            json_decref(arr);
            return bl_err_set(err, BL_ENOMEM, "out of memory");
        }
    }
    int rc = rt__gen_check_tools(arr, err);
    if (rc)
        json_decref(arr);
    else
        *out = arr;
    return rc;
}

/* Tools, tool_choice and thinking; *kwargs the template arguments (or NULL); *tools
 * whether the reply's calls are parsed; *one_call tool_choice's
 * disable_parallel_tool_use; *force (when not NULL) the tool a call must name for
 * tool_choice "tool", "" for "any", else NULL. */
static int anthropic_options(const rt_app_t *app, const json_t *body, json_t **kwargs, int *tools, int *one_call,
                             const char **force, bl_err_t *err)
{
    *kwargs = NULL;
    *tools = *one_call = 0;
    if (force)
        *force = NULL;
    int think = -1; /* thinking.type: -1 not given, 0 disabled, 1 enabled */
    json_t *v = json_object_get(body, "thinking");
    if (v && !json_is_null(v)) {
        json_t *t = json_is_object(v) ? json_object_get(v, "type") : NULL;
        if (!json_is_string(t))
            return bl_err_set(err, BL_EINVAL, "'thinking' must be an object with a 'type'");
        const char *ts = json_string_value(t);
        if (!strcmp(ts, "enabled") || !strcmp(ts, "adaptive"))
            think = 1;
        else if (!strcmp(ts, "disabled"))
            think = 0;
        else
            return bl_err_set(err, BL_EINVAL,
                              "'thinking.type' \"%.64s\" is not supported (enabled or disabled)",
                              ts);
    }
    int use_tools = 1;
    v = json_object_get(body, "tool_choice");
    if (v && !json_is_null(v)) {
        json_t *t = json_is_object(v) ? json_object_get(v, "type") : NULL;
        const char *ts = json_string_value(t), *named = NULL;
        if (ts && !strcmp(ts, "tool") &&
            !(named = json_string_value(json_object_get(v, "name"))))
            return bl_err_set(err, BL_EINVAL, "'tool_choice' of type \"tool\" needs a 'name'");
        if (!ts || (strcmp(ts, "auto") && strcmp(ts, "none") && strcmp(ts, "any") && !named))
            return bl_err_set(err, BL_EINVAL,
                              "'tool_choice' must be {\"type\": \"auto\"}, \"none\", \"any\" or "
                              "{\"type\": \"tool\", \"name\"}");
        if (named || !strcmp(ts, "any")) {
            json_t *tl = json_object_get(body, "tools");
            if (!json_is_array(tl) || json_array_size(tl) == 0)
                return bl_err_set(err, BL_EINVAL, "'tool_choice' forces a call, but 'tools' is empty");
            if (force)
                *force = named ? named : "";
        }
        use_tools = strcmp(ts, "none") != 0;
        *one_call = json_is_true(json_object_get(v, "disable_parallel_tool_use"));
    }
    json_t *list = NULL;
    v = json_object_get(body, "tools");
    int rc;
    if (v && !json_is_null(v) && (rc = convert_tools(v, &list, err)))
        return rc;
    if (list && (json_array_size(list) == 0 || !use_tools)) {
        json_decref(list);
        list = NULL;
    }
    if (list && app->no_jinja) { /* llama-server without Jinja */
        json_decref(list);
        return bl_err_set(err, BL_EINVAL, "tools param requires --jinja flag");
    }
    if (think < 0 && !list)
        return 0;
    if (!(*kwargs = json_object()) || (list && json_object_set_new(*kwargs, "tools", list)) ||
        (think >= 0 && json_object_set_new(*kwargs, "enable_thinking", json_boolean(think)))) {
        if (!*kwargs)
            json_decref(list);
        json_decref(*kwargs);
        *kwargs = NULL;
        return bl_err_set(err, BL_ENOMEM, "out of memory");
    }
    *tools = list != NULL && !app->skip_chat_parsing;
    return 0;
}

/* The prompt tokens of an Anthropic request. BL_EINVAL (400 text), BL_ENOMEM,
 * BL_ERANGE (it cannot fit a slot: *n_min; n_min NULL: no bound). */
static int anthropic_prompt(rt_app_t *app, const json_t *body, rt_tokens_t *toks, int *think_open,
                            int *prefilled, int *tools, int *one_call, const char **force,
                            int *think_off, size_t *n_min, bl_err_t *err)
{
    json_t *amsgs = NULL, *msgs = NULL, *kwargs = NULL;
    rt_gen_buf_t prefill = {0};
    char *text = NULL;
    size_t len = 0;
    int rc;
    *think_open = 0;
    if ((rc = rt__gen_anthropic_messages(body, &amsgs, err)) ||
        (rc = anthropic_options(app, body, &kwargs, tools, one_call, force, err)) ||
        (rc = rt__gen_chat_messages(amsgs, &msgs, app->no_prefill_assistant ? NULL : &prefill, err)) ||
        (rc = rt__gen_chat_cannot_fit(app, msgs, &prefill, n_min, err)) ||
        (rc = rt__gen_render_chat(app, msgs, kwargs, 1, &prefill, &text, &len, think_open, err)))
        goto done;
    if (think_off)
        *think_off = rt__gen_thinking_off(app, kwargs, text, len);
    *prefilled = prefill.p != NULL;
    rc = rt__gen_tokenize_prompt(app, text, len, RT_TOKENIZE_ADD_SPECIAL | RT_TOKENIZE_PARSE_SPECIAL,
                                 toks, n_min, err);
done:
    if (rc && rc != BL_ENOMEM && rc != BL_ERANGE)
        rc = BL_EINVAL;
    free(text);
    rt__gen_buf_free(&prefill);
    json_decref(amsgs);
    json_decref(msgs);
    json_decref(kwargs);
    return rc;
}

/* ---------------------------------------------------------------------------- */
/* replies                                                                        */
/* ---------------------------------------------------------------------------- */

static const char *msg_model(const rt_gen_req_t *g)
{
    return g->app->model_alias ? g->app->model_alias : "";
}

static void msg_start(rt_gen_req_t *g)
{
    rt__gen_write_sse(
        g, "message_start",
        json_pack("{s:s, s:{s:s, s:s, s:s, s:[], s:s, s:n, s:n, s:{s:I, s:i}}}", "type",
                  "message_start", "message", "id", g->id, "type", "message", "role", "assistant",
                  "content", "model", msg_model(g), "stop_reason", "stop_sequence", "usage",
                  "input_tokens", (json_int_t)g->n_prompt, "output_tokens", 0));
}

/* Closes the open content block (a thinking block gets its empty signature first,
 * which Anthropic's clients expect before the stop). */
static void block_close(rt_gen_req_t *g)
{
    if (g->block_kind == BLOCK_NONE)
        return;
    if (g->block_kind == BLOCK_THINKING)
        rt__gen_write_sse(g, "content_block_delta",
                          json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_delta",
                                    "index", g->block_index, "delta", "type", "signature_delta",
                                    "signature", ""));
    rt__gen_write_sse(g, "content_block_stop",
                      json_pack("{s:s, s:i}", "type", "content_block_stop", "index",
                                g->block_index));
    g->block_kind = BLOCK_NONE;
}

/* Streams text into a block of kind, opening it (and closing another) first. */
static void block_text(rt_gen_req_t *g, int kind, const char *s, size_t n)
{
    int thinking = kind == BLOCK_THINKING;
    if (g->block_kind != kind) {
        block_close(g);
        g->block_index++;
        g->block_kind = kind;
        rt__gen_write_sse(g, "content_block_start",
                          json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_start",
                                    "index", g->block_index, "content_block", "type",
                                    thinking ? "thinking" : "text", thinking ? "thinking" : "text",
                                    ""));
    }
    if (n)
        rt__gen_write_sse(g, "content_block_delta",
                          json_pack("{s:s, s:i, s:{s:s, s:s%}}", "type", "content_block_delta",
                                    "index", g->block_index, "delta", "type",
                                    thinking ? "thinking_delta" : "text_delta",
                                    thinking ? "thinking" : "text", s, n));
}

/* A tool call as Anthropic's tool_use block: its id as "toolu_..." and the
 * arguments as the input object. NULL when out of memory. */
static json_t *tool_use_block(const json_t *call)
{
    const char *id = json_string_value(json_object_get(call, "id"));
    json_t *fn = json_object_get(call, "function");
    json_t *input = json_loads(json_string_value(json_object_get(fn, "arguments")), 0, NULL);
    char tid[64];
    snprintf(tid, sizeof tid, "toolu_%s", id && !strncmp(id, "call_", 5) ? id + 5 : "");
    return json_pack("{s:s, s:s, s:O, s:o}", "type", "tool_use", "id", tid, "name",
                     json_object_get(fn, "name"), "input",
                     json_is_object(input) ? input : (json_decref(input), json_object()));
}

static void msg_token(rt_gen_req_t *g, const rt_event_t *ev, const char *reason,
                      size_t reason_len, const char *content, size_t content_len)
{
    (void)ev;
    if (reason_len)
        block_text(g, BLOCK_THINKING, reason, reason_len);
    if (content_len)
        block_text(g, BLOCK_TEXT, content, content_len);
    /* each call as its own tool_use block: start (empty input), the input JSON, stop */
    for (size_t kept = rt__gen_calls_kept(g); g->n_calls_sent < kept; g->n_calls_sent++) {
        const json_t *call = json_array_get(g->calls.calls, g->n_calls_sent);
        json_t *b = tool_use_block(call);
        if (!b)
            continue;
        block_close(g);
        g->block_index++;
        const char *args = json_string_value(
            json_object_get(json_object_get(call, "function"), "arguments"));
        json_object_set_new(b, "input", json_object());
        rt__gen_write_sse(g, "content_block_start",
                          json_pack("{s:s, s:i, s:o}", "type", "content_block_start", "index",
                                    g->block_index, "content_block", b));
        rt__gen_write_sse(g, "content_block_delta",
                          json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_delta",
                                    "index", g->block_index, "delta", "type", "input_json_delta",
                                    "partial_json", args ? args : "{}"));
        rt__gen_write_sse(g, "content_block_stop",
                          json_pack("{s:s, s:i}", "type", "content_block_stop", "index",
                                    g->block_index));
    }
}

static void msg_done(rt_gen_req_t *g, const rt_event_t *ev)
{
    const size_t n_calls = rt__gen_calls_kept(g);
    const char *stop_reason = n_calls ? "tool_use" : rt__gen_anthropic_stop_reason(ev->stop_type);
    json_t *stop_seq = ev->stop_type == RT_STOP_WORD && ev->stopping_word
                           ? json_string(ev->stopping_word)
                           : json_null();
    int64_t n_out = ev->timings.n_predicted;
    if (g->params.stream) {
        if (g->block_index < 0)
            block_text(g, BLOCK_TEXT, "", 0); /* clients expect at least one block */
        block_close(g);
        rt__gen_write_sse(g, "message_delta",
                          json_pack("{s:s, s:{s:s, s:o}, s:{s:I}}", "type", "message_delta",
                                    "delta", "stop_reason", stop_reason, "stop_sequence", stop_seq,
                                    "usage", "output_tokens", (json_int_t)n_out));
        rt__gen_write_sse(g, "message_stop", json_pack("{s:s}", "type", "message_stop"));
        rt_req_stream_end(g->r);
        return;
    }
    json_t *content = json_array();
    if (content && g->reasoning.n)
        json_array_append_new(content, json_pack("{s:s, s:s%, s:s}", "type", "thinking",
                                                 "thinking", g->reasoning.p, g->reasoning.n,
                                                 "signature", ""));
    size_t b = 0, e = g->content.n; /* beside calls, only text that is not blank */
    while (n_calls && b < e && strchr(" \t\r\n", g->content.p[b]))
        b++;
    while (n_calls && e > b && strchr(" \t\r\n", g->content.p[e - 1]))
        e--;
    if (content && (e > b || (!g->reasoning.n && !n_calls)))
        json_array_append_new(content, json_pack("{s:s, s:s%}", "type", "text", "text",
                                                 g->content.p ? g->content.p + b : "", e - b));
    for (size_t i = 0; content && i < n_calls; i++)
        json_array_append_new(content, tool_use_block(json_array_get(g->calls.calls, i)));
    json_t *j = json_pack("{s:s, s:s, s:s, s:o, s:s, s:s, s:o, s:{s:I, s:I}}", "id", g->id, "type",
                          "message", "role", "assistant", "content", content, "model",
                          msg_model(g), "stop_reason", stop_reason, "stop_sequence", stop_seq,
                          "usage", "input_tokens", (json_int_t)g->n_prompt, "output_tokens",
                          (json_int_t)n_out);
    if (j)
        rt_req_send_json(g->r, 200, j);
    else
        rt__gen_send_error(g->r, g->api, 500, NULL, "out of memory");
}

static const rt_gen_ops_t msg_ops = {msg_start, msg_token, msg_done};

/* ---------------------------------------------------------------------------- */
/* routes                                                                         */
/* ---------------------------------------------------------------------------- */

static void messages_work(rt_gen_req_t *g, rt_app_t *app)
{
    rt_gen_prep_t *p = &g->prep;
    const json_t *body = rt_req_json(g->r);
    p->rc = anthropic_prompt(app, body, &p->toks, &g->think_open, &p->prefilled, &p->tools,
                             &p->one_call, &p->force, &p->think_off, &p->n_min, &p->err);
    if (!p->rc && p->force) { /* tool_choice any or tool: the grammar writes the call */
        json_t *list = NULL;
        if (!(p->rc = convert_tools(json_object_get(body, "tools"), &list, &p->err)))
            p->rc = rt__gen_force_tools(&g->params, list, *p->force ? p->force : NULL, p->one_call,
                                        g->think_open ? 2 : p->think_off ? 0 : 1, &p->err);
        json_decref(list);
    }
}

/* thinking.budget_tokens: 0 when absent, else a positive integer. */
static int thinking_budget(const json_t *body, int64_t *budget, bl_err_t *err)
{
    *budget = 0;
    json_t *v = json_object_get(json_object_get(body, "thinking"), "budget_tokens");
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 1)
        return bl_err_set(err, BL_EINVAL, "'thinking.budget_tokens' must be a positive integer");
    *budget = json_integer_value(v);
    return 0;
}

static void messages_next(rt_gen_req_t *g)
{
    rt_gen_prep_t *p = &g->prep;
    int64_t budget = 0;
    if (!p->rc)
        p->rc = thinking_budget(rt_req_json(g->r), &budget, &p->err);
    if (p->rc) {
        rt__gen_send_prep_error(g);
        rt__gen_req_free(g);
        return;
    }
    /* the thought ends by its budget (thinking.budget_tokens), and a constrained
     * reply (forced tool use) always gets room after it */
    if (budget <= 0)
        budget = g->app->reasoning_budget; /* --reasoning-budget */
    if (!p->think_off && (budget > 0 || g->params.task.sampling.grammar))
        rt__gen_bound_thought(g, p->toks.n, budget);
    g->params.reasoning = !p->prefilled && g->app->reasoning; /* thinking blocks: split */
    if (g->params.reasoning)
        g->params.reasoning = 1;
    g->params.tools = p->tools;
    g->params.one_call = p->one_call;
    rt__gen_submit(g, p->toks.ids, p->toks.n);
}

void rt__api_messages(rt_req_t *r)
{
    rt__gen_route(r, RT_GEN_API_ANTHROPIC, &msg_ops, "msg_", messages_work, messages_next);
}

static void count_tokens_work(rt_gen_req_t *g, rt_app_t *app)
{
    rt_gen_prep_t *p = &g->prep;
    int think_open;
    p->rc = anthropic_prompt(app, rt_req_json(g->r), &p->toks, &think_open, &p->prefilled,
                             &p->tools, &p->one_call, NULL, NULL, NULL, &p->err);
}

static void count_tokens_next(rt_gen_req_t *g)
{
    if (g->prep.rc) {
        rt__gen_send_prep_error(g);
    } else {
        json_t *j = json_pack("{s:I}", "input_tokens", (json_int_t)g->prep.toks.n);
        if (j)
            rt_req_send_json(g->r, 200, j);
        else
            rt__gen_send_error(g->r, RT_GEN_API_ANTHROPIC, 500, NULL, "out of memory");
    }
    rt__gen_req_free(g);
}

void rt__api_messages_count_tokens(rt_req_t *r)
{
    rt_gen_req_t *g = rt__gen_req_new(r, rt_req_app(r), RT_GEN_API_ANTHROPIC, NULL, "");
    if (!g) {
        rt__gen_send_error(r, RT_GEN_API_ANTHROPIC, 500, NULL, "out of memory");
        return;
    }
    rt__gen_prepare(g, count_tokens_work, count_tokens_next);
}
