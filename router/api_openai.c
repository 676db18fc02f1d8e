/* The OpenAI routes in llama-server's shapes: POST /v1/chat/completions (and
 * /chat/completions), /v1/completions (and /completions), and
 * /v1/chat/completions/input_tokens. Request parsing and the life of a generation
 * are in api_gen.c; this file builds the prompts and the replies.
 *
 * Thread: the loop thread. */
#include "api_gen_impl.h"

#include <stdlib.h>
#include <string.h>

#include "bl_config.h"

#define SYSTEM_FINGERPRINT "bloomery-" BL_VERSION

/* ---------------------------------------------------------------------------- */
/* shared pieces                                                                  */
/* ---------------------------------------------------------------------------- */

json_t *rt__gen_usage_json(int64_t n_prompt, int64_t n_predicted, int64_t n_cached)
{
    return json_pack("{s:I, s:I, s:I, s:{s:I}}", "completion_tokens", (json_int_t)n_predicted,
                     "prompt_tokens", (json_int_t)n_prompt, "total_tokens",
                     (json_int_t)(n_prompt + n_predicted), "prompt_tokens_details",
                     "cached_tokens", (json_int_t)n_cached);
}

static const char *model_name(const rt_gen_req_t *g)
{
    return g->app->model_alias ? g->app->model_alias : "";
}

json_t *rt__gen_chat_chunk(const rt_gen_req_t *g, json_t *delta, const char *finish_reason)
{
    return json_pack("{s:[{s:o, s:i, s:o}], s:I, s:s, s:s, s:s, s:s}", "choices", "finish_reason",
                     finish_reason ? json_string(finish_reason) : json_null(), "index", g->choice, "delta",
                     delta, "created", (json_int_t)g->created, "id", g->id, "model", model_name(g),
                     "system_fingerprint", SYSTEM_FINGERPRINT, "object", "chat.completion.chunk");
}

json_t *rt__gen_legacy_logprobs(const json_t *entries, int post, int64_t *offset)
{
    const char *key = post ? "prob" : "logprob";
    const char *top_key = post ? "top_probs" : "top_logprobs";
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(),
           *offs = json_array();
    json_t *j = json_pack("{s:o, s:o, s:o, s:o, s:O}", "tokens", tokens, "token_logprobs", lps,
                          "top_logprobs", tops, "text_offset", offs, "content", entries);
    if (!j)
        return NULL;
    size_t i, k;
    json_t *e, *t;
    json_array_foreach(entries, i, e) {
        json_array_append(tokens, json_object_get(e, "token"));
        json_array_append(lps, json_object_get(e, key));
        json_array_append_new(offs, json_integer(*offset));
        *offset += (int64_t)json_array_size(json_object_get(e, "bytes"));
        json_t *top = json_object();
        json_array_foreach(json_object_get(e, top_key), k, t) {
            json_t *tok = json_object_get(t, "token");
            if (json_is_string(tok))
                json_object_set(top, json_string_value(tok), json_object_get(t, key));
        }
        json_array_append_new(tops, top);
    }
    return j;
}

/* ---------------------------------------------------------------------------- */
/* chat prompts                                                                   */
/* ---------------------------------------------------------------------------- */

/* The tokens of a chat request's prompt and how to read its reply. Answers nothing;
 * BL_EINVAL (400 text in err), BL_ENOMEM. */
static int chat_prompt(rt_app_t *app, const json_t *body, rt_tokens_t *toks, int *reasoning,
                       int *tools, const char **force, int *think_open, int *think_off,
                       size_t *n_min, bl_err_t *err)
{
    json_t *msgs = NULL, *kwargs = NULL;
    rt_gen_buf_t prefill = {0};
    char *text = NULL;
    size_t len = 0;
    int add_gen = 1, rc;
    *think_open = 0;
    if (!json_is_object(body))
        return bl_err_set(err, BL_EINVAL, "the request body must be a JSON object");
    json_t *agp = json_object_get(body, "add_generation_prompt");
    if (agp && !json_is_null(agp)) {
        if (!json_is_boolean(agp))
            return bl_err_set(err, BL_EINVAL, "'add_generation_prompt' must be a boolean");
        add_gen = json_is_true(agp);
    }
    /* continue_final_message: a last assistant message continued (true) or answered
     * (false); absent: --prefill-assistant's setting */
    int cont = !app->no_prefill_assistant;
    json_t *cfm = json_object_get(body, "continue_final_message");
    if (cfm && !json_is_null(cfm)) {
        if (!json_is_boolean(cfm))
            return bl_err_set(err, BL_EINVAL, "'continue_final_message' must be a boolean");
        cont = json_is_true(cfm);
        const json_t *m = json_object_get(body, "messages");
        const char *role = json_string_value(json_object_get(json_array_get(m, json_array_size(m) - 1), "role"));
        if (cont && (!role || strcmp(role, "assistant")))
            return bl_err_set(err, BL_EINVAL, "'continue_final_message': the last message is not the assistant's");
        if (cont && agp && json_is_true(agp))
            return bl_err_set(err, BL_EINVAL, "'continue_final_message' and 'add_generation_prompt' both true "
                                              "contradict each other");
    }
    if ((rc = rt__gen_chat_options(app, body, &kwargs, reasoning, tools, force, err)) ||
        (rc = rt__gen_chat_messages(json_object_get(body, "messages"), &msgs, cont ? &prefill : NULL, err)) ||
        (rc = rt__gen_chat_cannot_fit(app, msgs, &prefill, n_min, err)) ||
        (rc = rt__gen_render_chat(app, msgs, kwargs, add_gen, &prefill, &text, &len, think_open,
                                  err)))
        goto done;
    if (think_off)
        *think_off = rt__gen_thinking_off(app, kwargs, text, len);
    if (prefill.p)
        *reasoning = 0; /* as llama-server: a continued reply is not parsed */
    rc = rt__gen_tokenize_prompt(app, text, len, RT_TOKENIZE_ADD_SPECIAL | RT_TOKENIZE_PARSE_SPECIAL,
                                 toks, n_min, err);
done:
    if (rc && rc != BL_ENOMEM && rc != BL_ERANGE)
        rc = BL_EINVAL; /* every template failure is the request's */
    free(text);
    rt__gen_buf_free(&prefill);
    json_decref(msgs);
    json_decref(kwargs);
    return rc;
}

/* ---------------------------------------------------------------------------- */
/* /v1/chat/completions                                                           */
/* ---------------------------------------------------------------------------- */

static void chat_start(rt_gen_req_t *g)
{
    /* OpenAI's first chunk names the role */
    rt__gen_write_sse(g, NULL,
                      rt__gen_chat_chunk(g, json_pack("{s:s, s:n}", "role", "assistant",
                                                      "content"),
                                         NULL));
}

/* A call as a streamed delta's tool_calls entry: OpenAI's with its index. */
static json_t *call_delta(const rt_gen_req_t *g, size_t i)
{
    json_t *c = json_deep_copy(json_array_get(g->calls.calls, i));
    if (c && json_object_set_new(c, "index", json_integer((json_int_t)i))) {
        json_decref(c);
        c = NULL;
    }
    return c ? json_pack("{s:[o]}", "tool_calls", c) : NULL;
}

/* Moves the stream past the calls before upto that are whole: the one whose pieces
 * went out is done, the others go out whole. */
static void calls_catch_up(rt_gen_req_t *g, size_t upto)
{
    if (g->call_streaming && upto > g->n_calls_sent &&
        json_array_size(g->calls.calls) > g->n_calls_sent) {
        g->call_streaming = 0;
        g->n_calls_sent++;
    }
    for (size_t kept = rt__gen_calls_kept(g);
         !g->call_streaming && g->n_calls_sent < upto && g->n_calls_sent < kept; g->n_calls_sent++)
        rt__gen_write_sse(g, NULL, rt__gen_chat_chunk(g, call_delta(g, g->n_calls_sent), NULL));
}

/* Tool calls in OpenAI's delta form: a call's id and name as soon as they are known,
 * then its arguments as they are generated; a call that opened and closed within
 * one piece goes out whole in one delta. g->call_streaming: the header of call
 * g->n_calls_sent went out. */
static void stream_calls(rt_gen_req_t *g)
{
    rt_gen_tools_t *tc = &g->calls;
    for (size_t i = 0; i < tc->n_ev; i++) {
        const rt_gen_call_ev_t *e = &tc->ev[i];
        calls_catch_up(g, e->idx);
        if (e->idx != g->n_calls_sent || (g->params.one_call && e->idx > 0))
            continue; /* a call the reply does not keep */
        if (e->kind == RT_CALL_OPEN && !g->call_streaming) {
            g->call_streaming = 1;
            rt__gen_write_sse(g, NULL, rt__gen_chat_chunk(g, json_pack("{s:[{s:I, s:s, s:s, s:{s:O, s:s}}]}", "tool_calls",
                                                                       "index", (json_int_t)e->idx, "id", e->id,
                                                                       "type", "function", "function", "name",
                                                                       e->name, "arguments", ""), NULL));
        } else if (e->kind == RT_CALL_ARGS && g->call_streaming && e->args.n) {
            rt__gen_write_sse(g, NULL, rt__gen_chat_chunk(g, json_pack("{s:[{s:I, s:{s:o}}]}", "tool_calls", "index",
                                                                       (json_int_t)e->idx, "function", "arguments",
                                                                       rt__gen_json_piece(e->args.p, e->args.n)),
                                                          NULL));
        } else if (e->kind == RT_CALL_DROP) {
            g->call_streaming = 0; /* it was not a call after all */
        }
    }
    calls_catch_up(g, (size_t)-1);
}

static void chat_token(rt_gen_req_t *g, const rt_event_t *ev, const char *reason,
                       size_t reason_len, const char *content, size_t content_len)
{
    json_t *chunks[2];
    int n = 0;
    if (reason_len)
        chunks[n++] = rt__gen_chat_chunk(
            g, json_pack("{s:s%}", "reasoning_content", reason, reason_len), NULL);
    if (content_len)
        chunks[n++] = rt__gen_chat_chunk(g, json_pack("{s:s%}", "content", content, content_len),
                                         NULL);
    int probs = ev->kind == RT_EV_TOKEN && g->params.want_probs;
    if (n == 0 && (probs || g->params.timings_per_token) && ev->kind == RT_EV_TOKEN)
        chunks[n++] = rt__gen_chat_chunk(g, json_object(), NULL); /* text held back */
    if (n > 0) {
        json_t *last = chunks[n - 1];
        if (last && probs) {
            json_t *choice = json_array_get(json_object_get(last, "choices"), 0);
            json_t *entry = rt__gen_prob_entry(g->app->tok, ev, g->params.post_sampling_probs);
            json_object_set_new(choice, "logprobs", json_pack("{s:[o]}", "content", entry));
        }
        if (last && g->params.timings_per_token)
            json_object_set_new(last, "timings", rt__gen_timings_json(&ev->timings));
    }
    for (int i = 0; i < n; i++)
        rt__gen_write_sse(g, NULL, chunks[i]);
    stream_calls(g);
}

/* A finished choice's object into g->choices (n > 1); returns the list, taken by the
 * caller when it is the last choice (NULL when memory ran out). */
static json_t *add_choice(rt_gen_req_t *g, json_t *choice)
{
    if (!g->choices && !(g->choices = json_array())) {
        json_decref(choice);
        return NULL;
    }
    if (!choice || json_array_append_new(g->choices, choice))
        return NULL;
    if (g->more)
        return g->choices;
    json_t *all = g->choices;
    g->choices = NULL;
    return all;
}

static void chat_done(rt_gen_req_t *g, const rt_event_t *ev)
{
    const rt_timings_t *t = &ev->timings;
    /* as llama-server: a reply the token limit cut off is "length" even when calls
     * were parsed from it */
    const char *finish = rt__gen_finish_reason(ev->stop_type);
    if (!strcmp(finish, "stop") && rt__gen_calls_kept(g))
        finish = "tool_calls";
    if (g->params.stream) {
        json_t *last = rt__gen_chat_chunk(g, json_object(), finish);
        if (g->more) { /* another choice follows: this one's end only */
            rt__gen_write_sse(g, NULL, last);
            return;
        }
        if (g->params.include_usage) {
            rt__gen_write_sse(g, NULL, last);
            /* OpenAI: usage comes in a last chunk with no choices */
            last = json_pack("{s:[], s:I, s:s, s:s, s:s, s:s, s:o}", "choices", "created",
                             (json_int_t)g->created, "id", g->id, "model", model_name(g),
                             "system_fingerprint", SYSTEM_FINGERPRINT, "object",
                             "chat.completion.chunk", "usage",
                             rt__gen_usage_json(g->n_prompt, g->n_predicted_sum + t->n_predicted, t->n_cached));
        }
        if (last)
            json_object_set_new(last, "timings", rt__gen_timings_json(t));
        rt__gen_write_sse(g, NULL, last);
        rt__gen_write(g, "data: [DONE]\n\n", 14);
        rt_req_stream_end(g->r);
        return;
    }
    json_t *msg = json_pack("{s:s, s:s%}", "role", "assistant", "content",
                            g->content.p ? g->content.p : "", g->content.n);
    if (msg && rt__gen_calls_kept(g)) { /* OpenAI: content null when there is only a call */
        json_t *calls = json_array();
        for (size_t i = 0; calls && i < rt__gen_calls_kept(g); i++)
            json_array_append(calls, json_array_get(g->calls.calls, i));
        size_t b = 0, e = g->content.n;
        while (b < e && strchr(" \t\r\n", g->content.p[b]))
            b++;
        while (e > b && strchr(" \t\r\n", g->content.p[e - 1]))
            e--;
        json_object_set_new(msg, "content", e > b ? json_stringn(g->content.p + b, e - b)
                                                  : json_null());
        json_object_set_new(msg, "tool_calls", calls ? calls : json_array());
    }
    if (msg && g->reasoning.n)
        json_object_set_new(msg, "reasoning_content",
                            json_stringn(g->reasoning.p, g->reasoning.n));
    json_t *choice = json_pack("{s:s, s:i, s:o}", "finish_reason", finish, "index", g->choice, "message",
                               msg);
    if (choice && g->params.want_probs && g->probs)
        json_object_set_new(choice, "logprobs", json_pack("{s:O}", "content", g->probs));
    json_t *choices = add_choice(g, choice);
    if (g->more)
        return;
    json_t *j = json_pack("{s:o, s:I, s:s, s:s, s:s, s:o, s:s, s:o}", "choices", choices,
                          "created", (json_int_t)g->created, "model", model_name(g),
                          "system_fingerprint", SYSTEM_FINGERPRINT, "object", "chat.completion",
                          "usage", rt__gen_usage_json(g->n_prompt, g->n_predicted_sum + t->n_predicted, t->n_cached),
                          "id", g->id, "timings", rt__gen_timings_json(t));
    if (j && g->app->verbose_replies) /* llama-server's debugging extra under -v */
        json_object_set_new(j, "__verbose", rt__gen_native_final(g, ev));
    if (j)
        rt_req_send_json(g->r, 200, j);
    else
        rt__gen_send_error(g->r, g->api, 500, NULL, "out of memory");
}

static const rt_gen_ops_t chat_ops = {chat_start, chat_token, chat_done};

void rt__gen_chat_work(rt_gen_req_t *g, rt_app_t *app)
{
    rt_gen_prep_t *p = &g->prep;
    p->rc = chat_prompt(app, rt_req_json(g->r), &p->toks, &p->reasoning, &p->tools, &p->force,
                        &g->think_open, &p->think_off, &p->n_min, &p->err);
}

void rt__gen_chat_next(rt_gen_req_t *g)
{
    rt_gen_prep_t *p = &g->prep;
    int rc = p->rc;
    int think = g->think_open ? 2 : p->think_off ? 0 : 1;
    if (!rc && p->force) /* tool_choice required or named: the grammar writes the call */
        rc = p->rc = rt__gen_force_tools(&g->params, json_object_get(rt_req_json(g->r), "tools"),
                                         *p->force ? p->force : NULL, g->params.one_call, think,
                                         &p->err);
    else if (!rc && g->params.grammar && think) {
        /* a schema's JSON comes after the model's thought, which it may still write */
        char *wrapped = NULL;
        bl_err_t e2 = {0};
        if ((rc = p->rc = rt__gen_grammar_wrap(g->params.grammar, think, g->params.fmt, "%W %R",
                                               &wrapped, &e2))) {
            bl_err_set(&p->err, rc, "'%s': %s",
                       g->params.grammar_from ? g->params.grammar_from : "response_format", e2.msg);
        } else {
            free(g->params.grammar);
            g->params.grammar = wrapped;
            g->params.task.sampling.grammar = wrapped;
            g->params.task.sampling.grammar_len = strlen(wrapped);
        }
    }
    if (rc) {
        rt__gen_send_prep_error(g);
        rt__gen_req_free(g);
        return;
    }
    /* a constraint gets room after the thought; --reasoning-budget bounds it */
    if (think && (g->params.task.sampling.grammar || g->app->reasoning_budget > 0))
        rt__gen_bound_thought(g, p->toks.n, g->app->reasoning_budget);
    g->params.reasoning = p->reasoning;
    g->params.tools = p->tools;
    rt__gen_submit(g, p->toks.ids, p->toks.n);
}

void rt__api_chat(rt_req_t *r)
{
    rt__gen_route(r, RT_GEN_API_OAI_CHAT, &chat_ops, "chatcmpl-", rt__gen_chat_work, rt__gen_chat_next);
}

/* POST /v1/chat/completions/input_tokens: how many tokens the chat request's prompt
 * takes, in llama-server's shape. */
static void input_tokens_work(rt_gen_req_t *g, rt_app_t *app)
{
    rt_gen_prep_t *p = &g->prep;
    int think_open;
    p->rc = chat_prompt(app, rt_req_json(g->r), &p->toks, &p->reasoning, &p->tools, NULL,
                        &think_open, NULL, NULL, &p->err);
}

static void input_tokens_next(rt_gen_req_t *g)
{
    if (g->prep.rc) {
        rt__gen_send_prep_error(g);
    } else {
        json_t *j = json_pack("{s:s, s:I}", "object", "response.input_tokens", "input_tokens",
                              (json_int_t)g->prep.toks.n);
        if (j)
            rt_req_send_json(g->r, 200, j);
        else
            rt_req_send_error(g->r, 500, NULL, "out of memory");
    }
    rt__gen_req_free(g);
}

void rt__api_chat_input_tokens(rt_req_t *r)
{
    rt_gen_req_t *g = rt__gen_req_new(r, rt_req_app(r), RT_GEN_API_OAI_CHAT, NULL, "");
    if (!g) {
        rt_req_send_error(r, 500, NULL, "out of memory");
        return;
    }
    rt__gen_prepare(g, input_tokens_work, input_tokens_next);
}

/* ---------------------------------------------------------------------------- */
/* /v1/completions                                                                */
/* ---------------------------------------------------------------------------- */

static json_t *cmpl_choice(const rt_gen_req_t *g, const char *text, size_t len, json_t *logprobs,
                           const char *finish)
{
    return json_pack("{s:s%, s:i, s:o, s:o}", "text", text, len, "index", g->choice, "logprobs",
                     logprobs ? logprobs : json_null(), "finish_reason", finish ? json_string(finish) : json_null());
}

static json_t *cmpl_wrap(const rt_gen_req_t *g, json_t *choices)
{
    return json_pack("{s:o, s:I, s:s, s:s, s:s, s:s}", "choices", choices ? choices : json_array(), "created",
                     (json_int_t)g->created, "model", model_name(g), "system_fingerprint", SYSTEM_FINGERPRINT,
                     "object", "text_completion", "id", g->id);
}

static json_t *cmpl_object(const rt_gen_req_t *g, const char *text, size_t len, json_t *logprobs,
                           const char *finish)
{
    return cmpl_wrap(g, json_pack("[o]", cmpl_choice(g, text, len, logprobs, finish)));
}

static void cmpl_token(rt_gen_req_t *g, const rt_event_t *ev, const char *reason,
                       size_t reason_len, const char *content, size_t content_len)
{
    (void)reason;
    (void)reason_len;
    json_t *lp = NULL;
    if (ev->kind == RT_EV_TOKEN && g->params.want_probs) {
        json_t *entries = json_array();
        json_array_append_new(entries, rt__gen_prob_entry(g->app->tok, ev,
                                                          g->params.post_sampling_probs));
        lp = rt__gen_legacy_logprobs(entries, g->params.post_sampling_probs, &g->text_offset);
        json_decref(entries);
    }
    if (!content_len && !lp && !g->params.timings_per_token)
        return;
    json_t *j = cmpl_object(g, content, content_len, lp, NULL);
    if (j && g->params.timings_per_token)
        json_object_set_new(j, "timings", rt__gen_timings_json(&ev->timings));
    rt__gen_write_sse(g, NULL, j);
}

static void cmpl_done(rt_gen_req_t *g, const rt_event_t *ev)
{
    const rt_timings_t *t = &ev->timings;
    const char *finish = rt__gen_finish_reason(ev->stop_type);
    json_t *j;
    if (g->params.stream) {
        j = cmpl_object(g, "", 0, NULL, finish);
        if (g->more) { /* another choice follows: this one's end only */
            rt__gen_write_sse(g, NULL, j);
            return;
        }
    } else {
        json_t *lp = NULL;
        if (g->params.want_probs && g->probs) {
            g->text_offset = 0;
            lp = rt__gen_legacy_logprobs(g->probs, g->params.post_sampling_probs,
                                         &g->text_offset);
        }
        json_t *choices = add_choice(g, cmpl_choice(g, g->content.p ? g->content.p : "", g->content.n, lp, finish));
        if (g->more)
            return;
        j = cmpl_wrap(g, choices);
    }
    if (j) {
        json_object_set_new(j, "usage",
                            rt__gen_usage_json(g->n_prompt, g->n_predicted_sum + t->n_predicted, t->n_cached));
        json_object_set_new(j, "timings", rt__gen_timings_json(t));
        if (g->app->verbose_replies) /* llama-server's debugging extra under -v */
            json_object_set_new(j, "__verbose", rt__gen_native_final(g, ev));
    }
    if (g->params.stream) {
        rt__gen_write_sse(g, NULL, j);
        rt__gen_write(g, "data: [DONE]\n\n", 14);
        rt_req_stream_end(g->r);
    } else if (j) {
        rt_req_send_json(g->r, 200, j);
    } else {
        rt__gen_send_error(g->r, g->api, 500, NULL, "out of memory");
    }
}

static const rt_gen_ops_t cmpl_ops = {NULL, cmpl_token, cmpl_done};

static void cmpl_work(rt_gen_req_t *g, rt_app_t *app)
{
    rt_gen_prep_t *p = &g->prep;
    const json_t *body = rt_req_json(g->r);
    /* A non-empty suffix asks for the text between prompt and suffix: FIM. */
    const json_t *sfx = json_object_get(body, "suffix");
    if (json_is_string(sfx) && json_string_length(sfx) > 0) {
        p->rc = rt__gen_fim_tokens(app, body, RT_GEN_API_OAI_CMPL, g->params.task.n_predict,
                                   &p->toks, &p->err);
        if (p->rc == BL_ENOTSUP) /* a field this model cannot honour */
            p->rc = BL_EINVAL;
    } else {
        rt__gen_prep_prompt(p, app, json_object_get(body, "prompt"));
    }
}

static void cmpl_next(rt_gen_req_t *g)
{
    if (g->prep.rc) {
        rt__gen_send_prep_error(g);
        rt__gen_req_free(g);
        return;
    }
    rt__gen_submit(g, g->prep.toks.ids, g->prep.toks.n);
}

void rt__api_oai_completions(rt_req_t *r)
{
    rt__gen_route(r, RT_GEN_API_OAI_CMPL, &cmpl_ops, "cmpl-", cmpl_work, cmpl_next);
}
