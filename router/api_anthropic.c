/* The Anthropic Messages API: POST /v1/messages (streamed as message_start,
 * content_block_start/delta/stop, message_delta, message_stop) and
 * /v1/messages/count_tokens, with errors in Anthropic's shape. A reply's <think>
 * span becomes a "thinking" block before the text block, as llama-server does.
 *
 * Thread: the loop thread. */
#include "api_gen_impl.h"

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

/* One Anthropic message as an OpenAI-style one: text blocks become text parts,
 * thinking blocks the reasoning_content. */
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
    if (!o || json_array_append_new(out_arr, o))
        return bl_err_set(err, BL_ENOMEM, "out of memory");
    if (json_is_string(content))
        return json_object_set(o, "content", content) ? bl_err_set(err, BL_ENOMEM, "out of memory")
                                                      : 0;
    if (!json_is_array(content))
        return bl_err_set(err, BL_EINVAL,
                          "messages[%zu]: 'content' must be a string or an array of blocks", i);
    json_t *parts = json_array();
    if (!parts || json_object_set_new(o, "content", parts))
        return bl_err_set(err, BL_ENOMEM, "out of memory");
    size_t j;
    json_t *b;
    json_array_foreach(content, j, b) {
        json_t *type = json_is_object(b) ? json_object_get(b, "type") : NULL;
        if (!json_is_string(type))
            return bl_err_set(err, BL_EINVAL,
                              "messages[%zu].content[%zu] must be a block with a string 'type'", i,
                              j);
        const char *t = json_string_value(type);
        if (!strcmp(t, "text")) {
            json_t *text = json_object_get(b, "text");
            if (!json_is_string(text))
                return bl_err_set(err, BL_EINVAL,
                                  "messages[%zu].content[%zu]: a text block needs a string 'text'",
                                  i, j);
            if (json_array_append_new(parts, json_pack("{s:s, s:O}", "type", "text", "text", text)))
                return bl_err_set(err, BL_ENOMEM, "out of memory");
        } else if (!strcmp(t, "thinking") && !strcmp(r, "assistant")) {
            json_t *th = json_object_get(b, "thinking");
            if (json_is_string(th) && json_object_set(o, "reasoning_content", th))
                return bl_err_set(err, BL_ENOMEM, "out of memory");
        } else if (!strcmp(t, "redacted_thinking") && !strcmp(r, "assistant")) {
            continue; /* opaque to this server */
        } else if (!strcmp(t, "image") || !strcmp(t, "document")) {
            return bl_err_set(err, BL_EINVAL,
                              "messages[%zu].content[%zu]: %s input is not supported", i, j, t);
        } else if (!strcmp(t, "tool_use") || !strcmp(t, "tool_result")) {
            return bl_err_set(err, BL_EINVAL,
                              "messages[%zu].content[%zu]: %s blocks are not supported (no tool "
                              "use)", i, j, t);
        } else {
            return bl_err_set(err, BL_EINVAL,
                              "messages[%zu].content[%zu]: unsupported block type \"%.64s\"", i, j,
                              t);
        }
    }
    return 0;
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

/* Tools, tool_choice and thinking; *kwargs the template arguments (or NULL). */
static int anthropic_options(const json_t *body, json_t **kwargs, bl_err_t *err)
{
    *kwargs = NULL;
    json_t *v = json_object_get(body, "tools");
    if (v && !json_is_null(v)) {
        if (!json_is_array(v))
            return bl_err_set(err, BL_EINVAL, "'tools' must be an array");
        if (json_array_size(v) > 0)
            return bl_err_set(err, BL_EINVAL, "'tools' is not supported: tool calls are not parsed");
    }
    v = json_object_get(body, "tool_choice");
    if (v && !json_is_null(v)) {
        json_t *t = json_is_object(v) ? json_object_get(v, "type") : NULL;
        if (!json_is_string(t) ||
            (strcmp(json_string_value(t), "auto") && strcmp(json_string_value(t), "none")))
            return bl_err_set(err, BL_EINVAL,
                              "'tool_choice' is not supported (only {\"type\": \"auto\"} or "
                              "{\"type\": \"none\"} without tools)");
    }
    v = json_object_get(body, "thinking");
    if (v && !json_is_null(v)) {
        json_t *t = json_is_object(v) ? json_object_get(v, "type") : NULL;
        if (!json_is_string(t))
            return bl_err_set(err, BL_EINVAL, "'thinking' must be an object with a 'type'");
        const char *ts = json_string_value(t);
        int on;
        if (!strcmp(ts, "enabled") || !strcmp(ts, "adaptive"))
            on = 1;
        else if (!strcmp(ts, "disabled"))
            on = 0;
        else
            return bl_err_set(err, BL_EINVAL,
                              "'thinking.type' \"%.64s\" is not supported (enabled or disabled)",
                              ts);
        *kwargs = json_pack("{s:b}", "enable_thinking", on);
        if (!*kwargs)
            return bl_err_set(err, BL_ENOMEM, "out of memory");
    }
    return 0;
}

/* The prompt tokens of an Anthropic request. BL_EINVAL (400 text), BL_ENOMEM. */
static int anthropic_prompt(rt_app_t *app, const json_t *body, rt_tokens_t *toks, int *think_open,
                            int *prefilled, bl_err_t *err)
{
    json_t *amsgs = NULL, *msgs = NULL, *kwargs = NULL;
    char *prefill = NULL, *text = NULL;
    size_t len = 0;
    int rc;
    *think_open = 0;
    if ((rc = rt__gen_anthropic_messages(body, &amsgs, err)) ||
        (rc = anthropic_options(body, &kwargs, err)) ||
        (rc = rt__gen_chat_messages(amsgs, &msgs, &prefill, err)) ||
        (rc = rt__gen_render_chat(app, msgs, kwargs, 1, prefill, &text, &len, think_open, err)))
        goto done;
    *prefilled = prefill != NULL;
    bl_err_t terr;
    rc = rt_tokenize(app->tok, text, len, RT_TOKENIZE_ADD_SPECIAL | RT_TOKENIZE_PARSE_SPECIAL,
                     toks, &terr);
    if (rc)
        bl_err_set(err, rc, "tokenizing the prompt: %s", terr.msg);
done:
    if (rc && rc != BL_ENOMEM)
        rc = BL_EINVAL;
    free(text);
    free(prefill);
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

static void msg_token(rt_gen_req_t *g, const rt_event_t *ev, const char *reason,
                      size_t reason_len, const char *content, size_t content_len)
{
    (void)ev;
    if (reason_len)
        block_text(g, BLOCK_THINKING, reason, reason_len);
    if (content_len)
        block_text(g, BLOCK_TEXT, content, content_len);
}

static void msg_done(rt_gen_req_t *g, const rt_event_t *ev)
{
    const char *stop_reason = rt__gen_anthropic_stop_reason(ev->stop_type);
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
    if (content && (g->content.n || !g->reasoning.n))
        json_array_append_new(content, json_pack("{s:s, s:s%}", "type", "text", "text",
                                                 g->content.p ? g->content.p : "", g->content.n));
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

void rt__api_messages(rt_req_t *r)
{
    rt_gen_limits_t lim;
    rt_gen_req_t *g = rt__gen_begin(r, RT_GEN_API_ANTHROPIC, &msg_ops, "msg_", &lim);
    if (!g)
        return;
    rt_app_t *app = rt_req_app(r);
    const json_t *body = rt_req_json(r);
    bl_err_t err = {0};
    rt_tokens_t toks = {0};
    int prefilled = 0;
    int rc = rt__gen_parse_params(body, RT_GEN_API_ANTHROPIC, &lim, &g->params, &err);
    if (!rc)
        rc = anthropic_prompt(app, body, &toks, &g->think_open, &prefilled, &err);
    if (rc) {
        rt__gen_send_error(r, RT_GEN_API_ANTHROPIC, rc == BL_ENOMEM ? 500 : 400, NULL, "%s",
                           err.msg);
        rt_tokens_free(&toks);
        rt__gen_req_free(g);
        return;
    }
    g->params.reasoning = !prefilled && app->reasoning;
    rt__gen_submit(g, toks.ids, toks.n);
    rt_tokens_free(&toks);
}

void rt__api_messages_count_tokens(rt_req_t *r)
{
    rt_app_t *app = rt_req_app(r);
    const json_t *body = rt_req_json(r);
    bl_err_t err = {0};
    rt_tokens_t toks = {0};
    int think_open, prefilled;
    int rc = anthropic_prompt(app, body, &toks, &think_open, &prefilled, &err);
    if (rc) {
        rt__gen_send_error(r, RT_GEN_API_ANTHROPIC, rc == BL_ENOMEM ? 500 : 400, NULL, "%s",
                           err.msg);
    } else {
        json_t *j = json_pack("{s:I}", "input_tokens", (json_int_t)toks.n);
        if (j)
            rt_req_send_json(r, 200, j);
        else
            rt__gen_send_error(r, RT_GEN_API_ANTHROPIC, 500, NULL, "out of memory");
    }
    rt_tokens_free(&toks);
}
