/* The OpenAI Responses API as llama-server serves it: POST /v1/responses (stateless:
 * no response is stored, so previous_response_id is refused) and
 * /v1/responses/input_tokens. A request becomes a chat request (instructions and
 * input items as messages, function tools, text.format as response_format,
 * reasoning.effort), runs the chat path, and its reply is written as a response
 * object, or streamed as Responses' named events.
 *
 * Thread: the loop thread. */
#include "api_gen_impl.h"

#include <stdlib.h>
#include <string.h>

/* The key of the chat body that carries the Responses request's own fields, for the
 * reply's echo of them. */
#define ECHO_KEY "__responses"

/* ---------------------------------------------------------------------------- */
/* the request as a chat request                                                  */
/* ---------------------------------------------------------------------------- */

/* The text of an input item's content: a string, or input_text/output_text parts. */
static int item_text(const json_t *c, size_t i, json_t **out, bl_err_t *err)
{
    if (json_is_string(c)) {
        *out = json_incref((json_t *)c);
        return 0;
    }
    if (!json_is_array(c))
        return bl_err_set(err, BL_EINVAL, "input[%zu]: 'content' must be a string or an array of parts", i);
    size_t k;
    json_t *p;
    bl_buf_t b = {0};
    json_array_foreach(c, k, p) {
        const char *type = json_string_value(json_object_get(p, "type"));
        const json_t *t = json_object_get(p, "text");
        if (!type || (strcmp(type, "input_text") && strcmp(type, "output_text") && strcmp(type, "text"))) {
            rt__gen_buf_free(&b);
            return bl_err_set(err, BL_EINVAL, "input[%zu].content[%zu]: part type '%.32s' is not supported (text "
                                              "only: input_text, output_text)", i, k, type ? type : "?");
        }
        if (!json_is_string(t) || (k && rt__gen_buf_add(&b, "\n", 1)) ||
            rt__gen_buf_add(&b, json_string_value(t), json_string_length(t))) {
            rt__gen_buf_free(&b);
            return json_is_string(t) ? bl_err_set(err, BL_ENOMEM, "out of memory")
                                     : bl_err_set(err, BL_EINVAL, "input[%zu].content[%zu]: 'text' must be a string",
                                                  i, k);
        }
    }
    *out = json_stringn(b.p ? b.p : "", b.n);
    rt__gen_buf_free(&b);
    return *out ? 0 : bl_err_set(err, BL_ENOMEM, "out of memory");
}

/* The chat messages of instructions and input. */
static int to_messages(const json_t *body, json_t *msgs, bl_err_t *err)
{
    const json_t *ins = json_object_get(body, "instructions"), *in = json_object_get(body, "input");
    if (ins && !json_is_null(ins)) {
        if (!json_is_string(ins))
            return bl_err_set(err, BL_EINVAL, "'instructions' must be a string");
        json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "system", "content", ins));
    }
    if (!in || json_is_null(in))
        return bl_err_set(err, BL_EINVAL, "'input' is required");
    if (json_is_string(in)) {
        json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "user", "content", in));
        return 0;
    }
    if (!json_is_array(in) || json_array_size(in) == 0)
        return bl_err_set(err, BL_EINVAL, "'input' must be a string or a non-empty array of items");
    size_t i;
    json_t *it;
    json_array_foreach(in, i, it) {
        if (!json_is_object(it))
            return bl_err_set(err, BL_EINVAL, "input[%zu] must be an object", i);
        const char *type = json_string_value(json_object_get(it, "type"));
        const json_t *role = json_object_get(it, "role");
        if ((!type || !strcmp(type, "message")) && json_is_string(role)) {
            json_t *text;
            const char *r = json_string_value(role);
            if (strcmp(r, "user") && strcmp(r, "system") && strcmp(r, "developer") && strcmp(r, "assistant"))
                return bl_err_set(err, BL_EINVAL, "input[%zu]: role '%.32s' is not user, system, developer or "
                                                  "assistant", i, r);
            int rc = item_text(json_object_get(it, "content"), i, &text, err);
            if (rc)
                return rc;
            json_array_append_new(msgs, json_pack("{s:s, s:o}", "role", r, "content", text));
        } else if (type && !strcmp(type, "function_call")) {
            const json_t *id = json_object_get(it, "call_id"), *name = json_object_get(it, "name"),
                         *args = json_object_get(it, "arguments");
            if (!json_is_string(id) || !json_is_string(name) || !json_is_string(args))
                return bl_err_set(err, BL_EINVAL, "input[%zu]: a function_call needs string call_id, name and "
                                                  "arguments", i);
            json_t *call = json_pack("{s:O, s:s, s:{s:O, s:O}}", "id", id, "type", "function", "function", "name",
                                     name, "arguments", args);
            /* calls of one turn join the assistant message before them */
            json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
            const char *lr = json_string_value(json_object_get(last, "role"));
            if (last && lr && !strcmp(lr, "assistant")) {
                json_t *tc = json_object_get(last, "tool_calls");
                if (!tc)
                    json_object_set_new(last, "tool_calls", tc = json_array());
                json_array_append_new(tc, call);
            } else {
                json_array_append_new(msgs, json_pack("{s:s, s:s, s:[o]}", "role", "assistant", "content", "",
                                                      "tool_calls", call));
            }
        } else if (type && !strcmp(type, "function_call_output")) {
            const json_t *id = json_object_get(it, "call_id"), *out = json_object_get(it, "output");
            json_t *text = NULL;
            if (!json_is_string(id))
                return bl_err_set(err, BL_EINVAL, "input[%zu]: a function_call_output needs a string call_id", i);
            int rc = item_text(out, i, &text, err);
            if (rc)
                return rc;
            json_array_append_new(msgs, json_pack("{s:s, s:O, s:o}", "role", "tool", "tool_call_id", id, "content",
                                                  text));
        } else if (type && !strcmp(type, "reasoning")) {
            continue; /* a past turn's reasoning: templates keep only what messages carry */
        } else {
            return bl_err_set(err, BL_EINVAL, "input[%zu]: item type '%.32s' is not supported (message, "
                                              "function_call, function_call_output, reasoning)", i,
                              type ? type : "?");
        }
    }
    return 0;
}

/* Responses' fields that are taken and change nothing here (stateless, no service
 * tiers), beside those translated below; any other field goes to the chat request,
 * which honours it or refuses it by name, or ignores it as chat completions do. */
static const char *const k_ignored[] = {"store", "metadata", "user", "service_tier", "prompt_cache_key",
                                        "safety_identifier", "include", "top_logprobs", "model", "truncation"};
/* Those passed to the chat request as they are. */
static const char *const k_same[] = {"temperature", "top_p", "stream", "parallel_tool_calls"};

/* The chat request of a Responses request (*out: caller decrefs), or BL_EINVAL
 * naming the field. */
static int to_chat(const json_t *body, json_t **out, bl_err_t *err)
{
    *out = NULL;
    json_t *chat = json_object(), *msgs = json_array();
    if (!chat || !msgs || json_object_set_new(chat, "messages", msgs)) {
        json_decref(chat);
        return bl_err_set(err, BL_ENOMEM, "out of memory");
    }
    int rc = 0;
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)body, key, v) {
        int known = 0;
        for (size_t i = 0; i < sizeof k_ignored / sizeof *k_ignored; i++)
            known |= !strcmp(key, k_ignored[i]);
        for (size_t i = 0; i < sizeof k_same / sizeof *k_same; i++)
            if (!strcmp(key, k_same[i])) {
                known = 1;
                json_object_set(chat, key, v);
            }
        if (known || !strcmp(key, "input") || !strcmp(key, "instructions"))
            continue;
        if (!strcmp(key, "previous_response_id") || !strcmp(key, "conversation")) {
            if (json_is_null(v))
                continue;
            rc = bl_err_set(err, BL_EINVAL, "'%s' is not supported: the server stores no responses; send the whole "
                                            "conversation in 'input'", key);
        } else if (!strcmp(key, "background")) {
            if (!json_is_true(v))
                continue;
            rc = bl_err_set(err, BL_EINVAL, "'background' is not supported: responses are answered in the request");
        } else if (!strcmp(key, "max_output_tokens")) {
            if (!json_is_null(v))
                json_object_set(chat, "max_tokens", v);
        } else if (!strcmp(key, "tools")) {
            if (!json_is_array(v)) {
                rc = bl_err_set(err, BL_EINVAL, "'tools' must be an array");
                break;
            }
            json_t *tools = json_array(), *t;
            size_t i;
            json_object_set_new(chat, "tools", tools);
            json_array_foreach(v, i, t) {
                const char *type = json_string_value(json_object_get(t, "type"));
                const json_t *name = json_object_get(t, "name");
                if (!type || strcmp(type, "function") || !json_is_string(name)) {
                    rc = bl_err_set(err, BL_EINVAL, "tools[%zu]: only function tools with a name are supported "
                                                    "(type '%.32s')", i, type ? type : "?");
                    break;
                }
                json_t *fn = json_pack("{s:O}", "name", name);
                static const char *const copy[] = {"description", "parameters", "strict"};
                for (size_t k = 0; fn && k < 3; k++)
                    if (json_object_get(t, copy[k]))
                        json_object_set(fn, copy[k], json_object_get(t, copy[k]));
                json_array_append_new(tools, json_pack("{s:s, s:o}", "type", "function", "function", fn));
            }
        } else if (!strcmp(key, "tool_choice")) {
            const char *c = json_string_value(json_object_get(v, "type"));
            if (json_is_string(v))
                json_object_set(chat, "tool_choice", v);
            else if (c && !strcmp(c, "function") && json_is_string(json_object_get(v, "name")))
                json_object_set_new(chat, "tool_choice", json_pack("{s:s, s:{s:O}}", "type", "function", "function",
                                                                   "name", json_object_get(v, "name")));
            else
                rc = bl_err_set(err, BL_EINVAL, "'tool_choice' must be \"auto\", \"none\", \"required\" or "
                                                "{\"type\": \"function\", \"name\"}");
        } else if (!strcmp(key, "reasoning")) {
            const json_t *e = json_object_get(v, "effort");
            if (json_is_null(v))
                continue;
            if (!json_is_object(v) || (e && !json_is_null(e) && !json_is_string(e)))
                rc = bl_err_set(err, BL_EINVAL, "'reasoning' must be an object with a string 'effort'");
            else if (json_is_string(e))
                json_object_set(chat, "reasoning_effort", (json_t *)e);
        } else if (!strcmp(key, "text")) {
            const json_t *f = json_object_get(v, "format");
            const char *type = json_string_value(json_object_get(f, "type"));
            if (!f || (type && !strcmp(type, "text")))
                continue;
            if (type && !strcmp(type, "json_object"))
                json_object_set_new(chat, "response_format", json_pack("{s:s}", "type", "json_object"));
            else if (type && !strcmp(type, "json_schema") && json_is_object(json_object_get(f, "schema")))
                json_object_set_new(chat, "response_format", json_pack("{s:s, s:{s:O}}", "type", "json_schema",
                                                                       "json_schema", "schema",
                                                                       json_object_get(f, "schema")));
            else
                rc = bl_err_set(err, BL_EINVAL, "'text.format' must be of type text, json_object, or json_schema "
                                                "with a 'schema'");
        } else if (!strcmp(key, "n") || !strcmp(key, "n_cmpl")) {
            rc = bl_err_set(err, BL_EINVAL, "'%s' is not a field of /v1/responses: a response has one output", key);
        } else if (!strcmp(key, "messages") || !strcmp(key, ECHO_KEY)) {
            rc = bl_err_set(err, BL_EINVAL, "'%s' is not a field of /v1/responses: give the conversation in 'input'",
                            key);
        } else { /* the chat route's own fields (top_k, seed, ignore_eos, ...) go through, as in llama-server */
            json_object_set(chat, key, v);
        }
        if (rc)
            break;
    }
    if (!rc)
        rc = to_messages(body, msgs, err);
    if (!rc && json_object_set(chat, ECHO_KEY, (json_t *)body))
        rc = bl_err_set(err, BL_ENOMEM, "out of memory");
    if (rc) {
        json_decref(chat);
        return rc;
    }
    *out = chat;
    return 0;
}

/* ---------------------------------------------------------------------------- */
/* the reply                                                                      */
/* ---------------------------------------------------------------------------- */

static const json_t *echo(const rt_gen_req_t *g, const char *key)
{
    return json_object_get(json_object_get(rt_req_json(g->r), ECHO_KEY), key);
}

static json_t *echo_or(const rt_gen_req_t *g, const char *key, json_t *dflt)
{
    const json_t *v = echo(g, key);
    if (v) {
        json_decref(dflt);
        return json_incref((json_t *)v);
    }
    return dflt;
}

/* The response object; status "in_progress" (output empty) or done. */
static json_t *response_json(const rt_gen_req_t *g, const char *status, json_t *output, json_t *usage,
                             json_t *incomplete)
{
    json_t *r = json_pack("{s:s, s:s, s:I, s:s, s:s, s:o, s:o, s:n, s:o}", "id", g->id, "object", "response",
                          "created_at", (json_int_t)g->created, "status", status, "model",
                          g->app->model_alias ? g->app->model_alias : "", "output", output ? output : json_array(),
                          "incomplete_details", incomplete ? incomplete : json_null(), "error", "usage",
                          usage ? usage : json_null());
    if (!r)
        return NULL;
    json_object_set_new(r, "instructions", echo_or(g, "instructions", json_null()));
    json_object_set_new(r, "max_output_tokens", echo_or(g, "max_output_tokens", json_null()));
    json_object_set_new(r, "parallel_tool_calls", echo_or(g, "parallel_tool_calls", json_true()));
    json_object_set_new(r, "previous_response_id", json_null());
    json_object_set_new(r, "temperature", echo_or(g, "temperature", rt__gen_json_real(g->app->defaults.sampling.temp)));
    json_object_set_new(r, "top_p", echo_or(g, "top_p", rt__gen_json_real(g->app->defaults.sampling.top_p)));
    json_object_set_new(r, "tool_choice", echo_or(g, "tool_choice", json_string("auto")));
    json_object_set_new(r, "tools", echo_or(g, "tools", json_array()));
    json_object_set_new(r, "text", echo_or(g, "text", json_pack("{s:{s:s}}", "format", "type", "text")));
    json_object_set_new(r, "reasoning", echo_or(g, "reasoning", json_pack("{s:n, s:n}", "effort", "summary")));
    json_object_set_new(r, "store", json_false());
    json_object_set_new(r, "metadata", echo_or(g, "metadata", json_object()));
    return r;
}

static json_t *usage_json(const rt_gen_req_t *g, const rt_timings_t *t)
{
    return json_pack("{s:I, s:{s:I}, s:I, s:{s:I}, s:I}", "input_tokens", (json_int_t)g->n_prompt,
                     "input_tokens_details", "cached_tokens", (json_int_t)t->n_cached, "output_tokens",
                     (json_int_t)t->n_predicted, "output_tokens_details", "reasoning_tokens", (json_int_t)0,
                     "total_tokens", (json_int_t)(g->n_prompt + t->n_predicted));
}

static json_t *reasoning_item(const char *id, const char *text, size_t n)
{
    return json_pack("{s:s, s:s, s:[], s:[{s:s, s:s%}]}", "type", "reasoning", "id", id, "summary", "content",
                     "type", "reasoning_text", "text", text, n);
}

static json_t *message_item(const char *id, const char *status, json_t *content)
{
    return json_pack("{s:s, s:s, s:s, s:s, s:o}", "type", "message", "id", id, "status", status, "role",
                     "assistant", "content", content ? content : json_array());
}

static json_t *text_part(const char *text, size_t n)
{
    return json_pack("{s:s, s:s%, s:[], s:[]}", "type", "output_text", "text", text, n, "annotations",
                     "logprobs");
}

static json_t *call_item(const rt_gen_req_t *g, size_t i, const char *status)
{
    const json_t *c = json_array_get(g->calls.calls, i);
    const json_t *fn = json_object_get(c, "function");
    char id[64];
    snprintf(id, sizeof id, "fc_%s", json_string_value(json_object_get(c, "id")));
    return json_pack("{s:s, s:s, s:O, s:O, s:O, s:s}", "type", "function_call", "id", id, "call_id",
                     json_object_get(c, "id"), "name", json_object_get(fn, "name"), "arguments",
                     json_object_get(fn, "arguments"), "status", status);
}

/* An item id of the reply: its kind's prefix and the response's id. */
static void item_id(const rt_gen_req_t *g, const char *prefix, int index, char *out, size_t cap)
{
    snprintf(out, cap, "%s_%s_%d", prefix, g->id + 5, index); /* after "resp_" */
}

static void event(rt_gen_req_t *g, const char *name, json_t *j)
{
    if (!j)
        return;
    json_object_set_new(j, "type", json_string(name));
    json_object_set_new(j, "sequence_number", json_integer(g->seq++));
    rt__gen_write_sse(g, name, j);
}

/* Streams: closes the open item (reasoning or message) with its done events. */
static void close_item(rt_gen_req_t *g)
{
    char id[96];
    if (g->block_kind == 1) {
        item_id(g, "rs", g->block_index, id, sizeof id);
        event(g, "response.reasoning_text.done",
              json_pack("{s:s, s:i, s:i, s:s%}", "item_id", id, "output_index", g->block_index, "content_index", 0,
                        "text", g->reasoning.p ? g->reasoning.p : "", g->reasoning.n));
        event(g, "response.output_item.done",
              json_pack("{s:i, s:o}", "output_index", g->block_index, "item",
                        reasoning_item(id, g->reasoning.p ? g->reasoning.p : "", g->reasoning.n)));
    } else if (g->block_kind == 2) {
        item_id(g, "msg", g->block_index, id, sizeof id);
        const char *t = g->content.p ? g->content.p : "";
        event(g, "response.output_text.done",
              json_pack("{s:s, s:i, s:i, s:s%, s:[]}", "item_id", id, "output_index", g->block_index,
                        "content_index", 0, "text", t, g->content.n, "logprobs"));
        event(g, "response.content_part.done",
              json_pack("{s:s, s:i, s:i, s:o}", "item_id", id, "output_index", g->block_index, "content_index", 0,
                        "part", text_part(t, g->content.n)));
        event(g, "response.output_item.done",
              json_pack("{s:i, s:o}", "output_index", g->block_index, "item",
                        message_item(id, "completed", json_pack("[o]", text_part(t, g->content.n)))));
    }
    g->block_kind = 0;
}

/* Streams: makes the open item one of kind (1 reasoning, 2 message), closing another. */
static void open_item(rt_gen_req_t *g, int kind)
{
    if (g->block_kind == kind)
        return;
    close_item(g);
    g->block_index++;
    g->block_kind = kind;
    char id[96];
    if (kind == 1) {
        rt__gen_buf_free(&g->reasoning);
        item_id(g, "rs", g->block_index, id, sizeof id);
        event(g, "response.output_item.added",
              json_pack("{s:i, s:o}", "output_index", g->block_index, "item", reasoning_item(id, "", 0)));
    } else {
        rt__gen_buf_free(&g->content);
        item_id(g, "msg", g->block_index, id, sizeof id);
        event(g, "response.output_item.added",
              json_pack("{s:i, s:o}", "output_index", g->block_index, "item", message_item(id, "in_progress", NULL)));
        event(g, "response.content_part.added",
              json_pack("{s:s, s:i, s:i, s:o}", "item_id", id, "output_index", g->block_index, "content_index", 0,
                        "part", text_part("", 0)));
    }
}

static void resp_start(rt_gen_req_t *g)
{
    event(g, "response.created", json_pack("{s:o}", "response", response_json(g, "in_progress", NULL, NULL, NULL)));
    event(g, "response.in_progress",
          json_pack("{s:o}", "response", response_json(g, "in_progress", NULL, NULL, NULL)));
}

/* Streams: a finished tool call as its item, with its arguments in one delta. */
static void resp_stream_calls(rt_gen_req_t *g)
{
    for (size_t kept = rt__gen_calls_kept(g); g->n_calls_sent < kept; g->n_calls_sent++) {
        close_item(g);
        g->block_index++;
        json_t *item = call_item(g, g->n_calls_sent, "in_progress");
        const char *id = json_string_value(json_object_get(item, "id"));
        const json_t *args = json_object_get(item, "arguments");
        char idc[96];
        snprintf(idc, sizeof idc, "%s", id ? id : "");
        json_t *added = json_deep_copy(item);
        json_object_set_new(added, "arguments", json_string(""));
        event(g, "response.output_item.added", json_pack("{s:i, s:o}", "output_index", g->block_index, "item", added));
        event(g, "response.function_call_arguments.delta",
              json_pack("{s:s, s:i, s:O}", "item_id", idc, "output_index", g->block_index, "delta", args));
        event(g, "response.function_call_arguments.done",
              json_pack("{s:s, s:i, s:O}", "item_id", idc, "output_index", g->block_index, "arguments", args));
        json_object_set_new(item, "status", json_string("completed"));
        event(g, "response.output_item.done", json_pack("{s:i, s:o}", "output_index", g->block_index, "item", item));
    }
}

static void resp_token(rt_gen_req_t *g, const rt_event_t *ev, const char *reason, size_t reason_len,
                       const char *content, size_t content_len)
{
    (void)ev;
    char id[96];
    if (reason_len) {
        open_item(g, 1);
        item_id(g, "rs", g->block_index, id, sizeof id);
        if (rt__gen_buf_add(&g->reasoning, reason, reason_len) == 0)
            event(g, "response.reasoning_text.delta",
                  json_pack("{s:s, s:i, s:i, s:s%}", "item_id", id, "output_index", g->block_index, "content_index",
                            0, "delta", reason, reason_len));
    }
    if (content_len) {
        open_item(g, 2);
        item_id(g, "msg", g->block_index, id, sizeof id);
        if (rt__gen_buf_add(&g->content, content, content_len) == 0)
            event(g, "response.output_text.delta",
                  json_pack("{s:s, s:i, s:i, s:s%, s:[]}", "item_id", id, "output_index", g->block_index,
                            "content_index", 0, "delta", content, content_len, "logprobs"));
    }
    resp_stream_calls(g);
}

/* The whole output of a reply that was not streamed: reasoning, message, calls. */
static json_t *output_of(const rt_gen_req_t *g)
{
    json_t *out = json_array();
    char id[96];
    int index = 0;
    if (g->reasoning.n) {
        item_id(g, "rs", index++, id, sizeof id);
        json_array_append_new(out, reasoning_item(id, g->reasoning.p, g->reasoning.n));
    }
    size_t b = 0, e = g->content.n;
    while (b < e && strchr(" \t\r\n", g->content.p[b]))
        b++;
    while (e > b && strchr(" \t\r\n", g->content.p[e - 1]))
        e--;
    if (e > b || !rt__gen_calls_kept(g)) {
        item_id(g, "msg", index++, id, sizeof id);
        const char *t = g->content.p ? g->content.p : "";
        json_array_append_new(out, message_item(id, "completed", json_pack("[o]", text_part(t, g->content.n))));
    }
    for (size_t i = 0; i < rt__gen_calls_kept(g); i++)
        json_array_append_new(out, call_item(g, i, "completed"));
    return out;
}

static void resp_done(rt_gen_req_t *g, const rt_event_t *ev)
{
    const rt_timings_t *t = &ev->timings;
    const int cut = ev->stop_type == RT_STOP_LIMIT;
    json_t *incomplete = cut ? json_pack("{s:s}", "reason", "max_output_tokens") : NULL;
    const char *status = cut ? "incomplete" : "completed";
    if (g->params.stream) {
        close_item(g);
        resp_stream_calls(g);
        /* the final object lists every item again, as they were sent */
        event(g, cut ? "response.incomplete" : "response.completed",
              json_pack("{s:o}", "response", response_json(g, status, output_of(g), usage_json(g, t), incomplete)));
        rt_req_stream_end(g->r);
        return;
    }
    json_t *j = response_json(g, status, output_of(g), usage_json(g, t), incomplete);
    if (j) {
        json_object_set_new(j, "timings", rt__gen_timings_json(t));
        rt_req_send_json(g->r, 200, j);
    } else {
        rt__gen_send_error(g->r, g->api, 500, NULL, "out of memory");
    }
}

static const rt_gen_ops_t resp_ops = {resp_start, resp_token, resp_done};

/* Replaces r's body with its chat request; 0, or -1 having answered the refusal. */
static int as_chat(rt_req_t *r)
{
    json_t *chat = NULL;
    bl_err_t err = {0};
    const int rc = to_chat(rt_req_json(r), &chat, &err);
    if (rc) {
        rt__gen_send_error(r, RT_GEN_API_OAI_CHAT, rc == BL_ENOMEM ? 500 : 400, NULL, "%s", err.msg);
        return -1;
    }
    rt_req_set_json(r, chat);
    return 0;
}

void rt__api_responses(rt_req_t *r)
{
    if (as_chat(r) == 0)
        rt__gen_route(r, RT_GEN_API_OAI_CHAT, &resp_ops, "resp_", rt__gen_chat_work, rt__gen_chat_next);
}

void rt__api_responses_input_tokens(rt_req_t *r)
{
    if (as_chat(r) == 0)
        rt__api_chat_input_tokens(r);
}
