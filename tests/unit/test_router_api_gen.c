/* Tests of router/api_gen.c, api_openai.c, api_anthropic.c and api_responses.c: request fields to
 * rt_task_params_t, the refusals, prompt forms, chat and Anthropic messages, the
 * <think> splitter fed piece by piece, the JSON and SSE pieces of replies, and whole
 * replies driven by scripted engine events. The HTTP layer and the engine are
 * replaced by the stand-ins below, so only these files are exercised. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api_gen.c"
#include "api_openai.c"
#include "api_anthropic.c"
#include "api_responses.c"
#include "api_tools.c"
#include "toolcall.c"

#include "chat.h"
#include "gguf.h"

/* ---------------------------------------------------------------------------- */
/* stand-ins for the HTTP layer and the engine                                    */
/* ---------------------------------------------------------------------------- */

struct rt_req {
    rt_app_t *app;
    json_t *body;
    int status;          /* of the reply or of the stream */
    json_t *reply;       /* a JSON reply */
    rt_gen_buf_t stream; /* what was streamed */
    int ended;
    rt_req_gone_fn gone;
    void *gone_ud;
};

static rt_event_fn g_cb;
static void *g_cb_ud;
static int g_submits, g_cancels;
static rt_task_params_t g_submitted;
static int g_submit_rc;

void rt_task_params_default(rt_task_params_t *p)
{
    memset(p, 0, sizeof *p);
    rt_sampler_params_default(&p->sampling);
    p->n_predict = -1;
    p->cache_prompt = 1;
    p->slot_id = -1;
    p->spec_n_max = p->spec_n_min = -1;
    p->spec_p_min = -1.0f;
}

/* The request's own draft limits as they came (the engine's clamps are its test's). */
rt_spec_limits_t rt_engine_spec_limits(const rt_engine_t *e, const rt_task_params_t *p)
{
    (void)e;
    return (rt_spec_limits_t){.n_max = p->spec_n_max, .n_min = p->spec_n_min, .p_min = p->spec_p_min};
}

int rt_engine_submit(rt_engine_t *e, const int32_t *prompt, size_t n, const rt_task_params_t *p,
                     rt_event_fn cb, void *ud, rt_task_t **task, bl_err_t *err)
{
    (void)e;
    (void)prompt;
    if (g_submit_rc)
        return bl_err_set(err, g_submit_rc, "prompt of %zu tokens does not fit", n);
    g_submits++;
    g_submitted = *p;
    g_cb = cb;
    g_cb_ud = ud;
    *task = (rt_task_t *)&g_cb;
    return 0;
}

void rt_engine_cancel(rt_engine_t *e, rt_task_t *task)
{
    (void)e;
    (void)task;
    g_cancels++;
}

/* no cluster here: the model always serves */
int rt_app_down(const rt_app_t *app, char *why, size_t cap)
{
    (void)app;
    (void)why;
    (void)cap;
    return 0;
}

int rt_http_route(rt_http_t *h, const char *method, const char *path, rt_route_fn fn,
                  unsigned flags)
{
    (void)h, (void)method, (void)path, (void)fn, (void)flags;
    return 0;
}

/* http.c is not linked here: a stand-in with the Anthropic types these tests meet */
json_t *rt_http_error_json(int status, const char *type, const char *msg, int anthropic)
{
    assert_true(anthropic);
    (void)type;
    return json_pack("{s:s,s:{s:s,s:s}}", "type", "error", "error", "type",
                     status == 400 ? "invalid_request_error" : "api_error", "message", msg);
}

void *rt_req_app(const rt_req_t *r) { return r->app; }
json_t *rt_req_json(const rt_req_t *r) { return r->body; }
void rt_req_set_json(rt_req_t *r, json_t *j)
{
    json_decref(r->body);
    r->body = j;
}

void rt_req_send_json(rt_req_t *r, int status, json_t *j)
{
    assert_null(r->reply);
    r->status = status;
    r->reply = j;
}

void rt_req_send_error(rt_req_t *r, int status, const char *type, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    rt_req_send_json(r, status,
                     json_pack("{s:{s:i, s:s, s:s}}", "error", "code", status, "message", msg,
                               "type", type ? type : "invalid_request_error"));
}

void rt_req_stream_start(rt_req_t *r, int status, const char *content_type, rt_req_gone_fn gone,
                         void *ud)
{
    assert_string_equal(content_type, "text/event-stream");
    r->status = status;
    r->gone = gone;
    r->gone_ud = ud;
}

void rt_req_stream_write(rt_req_t *r, const char *data, size_t len)
{
    assert_false(r->ended);
    assert_int_equal(rt__gen_buf_add(&r->stream, data, len), 0);
}

void rt_req_stream_end(rt_req_t *r) { r->ended = 1; }

void rt_req_on_gone(rt_req_t *r, rt_req_gone_fn gone, void *ud)
{
    r->gone = gone;
    r->gone_ud = ud;
}

/* ---------------------------------------------------------------------------- */
/* helpers                                                                        */
/* ---------------------------------------------------------------------------- */

static json_t *J(const char *text)
{
    json_error_t e;
    json_t *j = json_loads(text, 0, &e);
    if (!j)
        fail_msg("bad test JSON: %s: %s", e.text, text);
    return j;
}

static rt_gen_limits_t plain_limits(void)
{
    rt_gen_limits_t l = {NULL, 1000, 4096, 2, -1};
    return l;
}

/* Parses body for api; returns the code and leaves the message in err. */
static int parse(const char *body, rt_gen_api_t api, rt_gen_params_t *p, bl_err_t *err)
{
    rt_gen_limits_t l = plain_limits();
    json_t *j = J(body);
    int rc = rt__gen_parse_params(j, api, &l, p, err);
    json_decref(j);
    return rc;
}

static void expect_refused(const char *body, rt_gen_api_t api, const char *needle)
{
    rt_gen_params_t p;
    bl_err_t err = {0};
    json_t *j = J(body);
    rt_gen_limits_t l = plain_limits();
    int rc = rt__gen_parse_params(j, api, &l, &p, &err);
    json_decref(j);
    if (rc != BL_EINVAL || !strstr(err.msg, needle))
        fail_msg("%s: rc %d, message \"%s\" (wanted one naming %s)", body, rc, err.msg, needle);
}

static const char *shared_dir(char *buf, size_t cap)
{
    const char *env = getenv("BLOOMERY_SHARED");
    snprintf(buf, cap, "%s", env && *env ? env : BL_SOURCE_ROOT "/../shared");
    return buf;
}

/* The Qwen3 tokenizer and chat template of the tiny model, or NULL when absent. */
static bl_gguf_t *open_model(rt_tokenizer_t **tok, rt_template_t **tpl)
{
    char dir[1024], path[1200];
    shared_dir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/models/qwen3moe-tiny-q4k.gguf", dir);
    if (access(path, R_OK) != 0)
        return NULL;
    bl_gguf_t *g = NULL;
    bl_err_t err = {0};
    assert_int_equal(bl_gguf_open(&g, path, &err), 0);
    int rc = rt_tokenizer_from_gguf(tok, g, &err);
    if (rc)
        fail_msg("tokenizer: %s", err.msg);
    if (tpl && (rc = rt_chat_template_load(tpl, g, NULL, &err)))
        fail_msg("template: %s", err.msg);
    return g;
}

/* A template that walks a call's argument items (GLM-4.5's form) gets them as
 * objects; one that prints them (Qwen3's) keeps the text; text that is not an
 * object stays text. */
static void test_chat_object_args(void **state)
{
    (void)state;
    rt_tokenizer_t *tok = NULL;
    rt_template_t *q3 = NULL, *walk = NULL;
    bl_gguf_t *g = open_model(&tok, &q3);
    if (!g)
        skip();
    static const char src[] =
        "{%- for m in messages %}{%- for c in m.tool_calls or [] %}{{ c.function.name }}"
        "{%- if c.function.arguments is string %}?{%- else %}"
        "{%- for k, v in c.function.arguments.items() %}<{{ k }}={{ v }}>{%- endfor %}{%- endif %}"
        "{%- endfor %}{%- endfor %}";
    bl_err_t err = {0};
    assert_int_equal(rt_template_compile(src, sizeof src - 1, &walk, &err), 0);
    assert_int_equal(rt_chat_object_args(walk, tok), 1);
    assert_int_equal(rt_chat_object_args(q3, tok), 0);
    json_t *msgs = json_loads("[{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":["
                              "{\"type\":\"function\",\"function\":{\"name\":\"a\",\"arguments\":\"{\\\"x\\\":1}\"}},"
                              "{\"type\":\"function\",\"function\":{\"name\":\"b\",\"arguments\":\"[1]\"}}]}]",
                              0, NULL);
    assert_non_null(msgs);
    json_t *conv = rt_chat_args_as_objects(msgs);
    assert_non_null(conv);
    json_t *calls = json_object_get(json_array_get(conv, 0), "tool_calls");
    json_t *a0 = json_object_get(json_object_get(json_array_get(calls, 0), "function"), "arguments");
    json_t *a1 = json_object_get(json_object_get(json_array_get(calls, 1), "function"), "arguments");
    assert_true(json_is_object(a0) && json_integer_value(json_object_get(a0, "x")) == 1);
    assert_true(json_is_string(a1));
    /* the caller's messages are not changed */
    calls = json_object_get(json_array_get(msgs, 0), "tool_calls");
    assert_true(json_is_string(json_object_get(json_object_get(json_array_get(calls, 0), "function"), "arguments")));
    char *text = NULL;
    size_t len = 0;
    if (rt_chat_render(walk, tok, conv, 0, NULL, &text, &len, &err) != 0)
        fail_msg("render: %s", err.msg);
    assert_string_equal(text, "a<x=1>b?");
    free(text);
    json_decref(conv);
    json_decref(msgs);
    rt_template_destroy(walk);
    rt_template_destroy(q3);
    rt_tokenizer_destroy(tok);
    bl_gguf_close(g);
}

/* ---------------------------------------------------------------------------- */
/* request fields                                                                 */
/* ---------------------------------------------------------------------------- */

static void test_params_defaults_are_llama_servers(void **state)
{
    (void)state;
    rt_gen_params_t p;
    bl_err_t err = {0};
    assert_int_equal(parse("{}", RT_GEN_API_NATIVE, &p, &err), 0);
    assert_int_equal(p.task.n_predict, -1);
    assert_float_equal(p.task.sampling.temp, 0.8f, 0);
    assert_int_equal(p.task.sampling.top_k, 40);
    assert_int_equal(p.task.n_stop, 0);
    assert_int_equal(p.task.cache_prompt, 1);
    assert_int_equal(p.task.slot_id, -1);
    assert_int_equal(p.stream, 0);
    assert_int_equal(p.want_probs, 0);
    rt__gen_params_fini(&p);
}

static void test_params_sampling_fields(void **state)
{
    (void)state;
    rt_gen_params_t p;
    bl_err_t err = {0};
    int rc = parse("{\"temperature\":0.5,\"top_k\":7,\"top_p\":0.9,\"min_p\":0.1,\"typical_p\":0.7,"
                   "\"repeat_penalty\":1.1,\"repeat_last_n\":-1,\"presence_penalty\":0.3,"
                   "\"frequency_penalty\":0.4,\"seed\":42,\"min_keep\":2,\"ignore_eos\":true,"
                   "\"cache_prompt\":false,\"id_slot\":1,\"t_max_predict_ms\":500,"
                   "\"return_tokens\":true,\"stream\":true,"
                   "\"stream_options\":{\"include_usage\":true}}",
                   RT_GEN_API_OAI_CHAT, &p, &err);
    if (rc)
        fail_msg("%s", err.msg);
    const rt_sampler_params_t *s = &p.task.sampling;
    assert_float_equal(s->temp, 0.5f, 0);
    assert_int_equal(s->top_k, 7);
    assert_float_equal(s->top_p, 0.9f, 0);
    assert_float_equal(s->min_p, 0.1f, 0);
    assert_float_equal(s->typical_p, 0.7f, 0);
    assert_float_equal(s->repeat_penalty, 1.1f, 0);
    assert_int_equal(s->penalty_last_n, -1);
    assert_float_equal(s->presence_penalty, 0.3f, 0);
    assert_float_equal(s->frequency_penalty, 0.4f, 0);
    assert_int_equal(s->seed, 42);
    assert_int_equal(s->min_keep, 2);
    assert_int_equal(p.task.ignore_eos, 1);
    assert_int_equal(p.task.cache_prompt, 0);
    assert_int_equal(p.task.slot_id, 1);
    assert_int_equal(p.task.t_max_predict_ms, 500);
    assert_int_equal(p.return_tokens, 1);
    assert_int_equal(p.stream, 1);
    assert_int_equal(p.include_usage, 1);
    rt__gen_params_fini(&p);

    assert_int_equal(parse("{\"seed\":-1}", RT_GEN_API_NATIVE, &p, &err), 0);
    assert_int_equal(p.task.sampling.seed, RT_SEED_RANDOM);
    rt__gen_params_fini(&p);
    /* null reads as absent */
    assert_int_equal(parse("{\"temperature\":null,\"stop\":null}", RT_GEN_API_NATIVE, &p, &err), 0);
    assert_float_equal(p.task.sampling.temp, 0.8f, 0);
    rt__gen_params_fini(&p);
}

/* llama-server's per-request draft limits: read, defaulting to the server's (-1), and
 * refused by name when out of range. */
static void test_params_speculative_limits(void **state)
{
    (void)state;
    rt_gen_params_t p;
    bl_err_t err = {0};
    assert_int_equal(parse("{}", RT_GEN_API_NATIVE, &p, &err), 0);
    assert_int_equal(p.task.spec_n_max, -1);
    assert_int_equal(p.task.spec_n_min, -1);
    assert_true(p.task.spec_p_min < 0.0f);
    rt__gen_params_fini(&p);
    assert_int_equal(parse("{\"speculative.n_max\":2,\"speculative.n_min\":1,\"speculative.p_min\":0.5}",
                           RT_GEN_API_OAI_CHAT, &p, &err), 0);
    assert_int_equal(p.task.spec_n_max, 2);
    assert_int_equal(p.task.spec_n_min, 1);
    assert_float_equal(p.task.spec_p_min, 0.5f, 0);
    rt__gen_params_fini(&p);
    expect_refused("{\"speculative.n_max\":-1}", RT_GEN_API_NATIVE, "speculative.n_max");
    expect_refused("{\"speculative.n_min\":\"two\"}", RT_GEN_API_NATIVE, "speculative.n_min");
    expect_refused("{\"speculative.p_min\":1.5}", RT_GEN_API_OAI_CMPL, "speculative.p_min");
}

static void test_params_token_limits(void **state)
{
    (void)state;
    rt_gen_params_t p;
    bl_err_t err = {0};
    assert_int_equal(parse("{\"max_tokens\":5}", RT_GEN_API_OAI_CHAT, &p, &err), 0);
    assert_int_equal(p.task.n_predict, 5);
    rt__gen_params_fini(&p);
    assert_int_equal(parse("{\"max_tokens\":5,\"max_completion_tokens\":6}", RT_GEN_API_OAI_CHAT,
                           &p, &err), 0);
    assert_int_equal(p.task.n_predict, 6);
    rt__gen_params_fini(&p);
    assert_int_equal(parse("{\"max_tokens\":5,\"n_predict\":7}", RT_GEN_API_NATIVE, &p, &err), 0);
    assert_int_equal(p.task.n_predict, 7);
    rt__gen_params_fini(&p);
    assert_int_equal(parse("{\"n_predict\":-1}", RT_GEN_API_NATIVE, &p, &err), 0);
    assert_int_equal(p.task.n_predict, -1);
    rt__gen_params_fini(&p);
    /* huge: the context caps it */
    assert_int_equal(parse("{\"max_tokens\":100000000000}", RT_GEN_API_OAI_CHAT, &p, &err), 0);
    assert_int_equal(p.task.n_predict, 4096);
    rt__gen_params_fini(&p);
    expect_refused("{\"max_tokens\":-1}", RT_GEN_API_OAI_CHAT, "max_tokens");
    expect_refused("{\"max_completion_tokens\":-5}", RT_GEN_API_OAI_CHAT, "max_completion_tokens");
    expect_refused("{\"n_predict\":-2}", RT_GEN_API_NATIVE, "n_predict");
    expect_refused("{\"max_tokens\":\"ten\"}", RT_GEN_API_OAI_CHAT, "max_tokens");
    expect_refused("{\"max_tokens\":1.5}", RT_GEN_API_OAI_CHAT, "max_tokens");
    /* the server's -n is the default */
    rt_gen_limits_t l = plain_limits();
    l.n_predict_default = 33;
    json_t *j = J("{}");
    assert_int_equal(rt__gen_parse_params(j, RT_GEN_API_NATIVE, &l, &p, &err), 0);
    assert_int_equal(p.task.n_predict, 33);
    rt__gen_params_fini(&p);
    json_decref(j);
}

static void test_params_wrong_types_name_the_field(void **state)
{
    (void)state;
    expect_refused("[]", RT_GEN_API_NATIVE, "object");
    expect_refused("{\"temperature\":\"hot\"}", RT_GEN_API_NATIVE, "temperature");
    expect_refused("{\"top_k\":\"7\"}", RT_GEN_API_NATIVE, "top_k");
    expect_refused("{\"stream\":1}", RT_GEN_API_NATIVE, "stream");
    expect_refused("{\"stream_options\":[]}", RT_GEN_API_OAI_CHAT, "stream_options");
    expect_refused("{\"seed\":5000000000}", RT_GEN_API_NATIVE, "seed");
    expect_refused("{\"repeat_last_n\":-2}", RT_GEN_API_NATIVE, "repeat_last_n");
    expect_refused("{\"id_slot\":2}", RT_GEN_API_NATIVE, "id_slot");
    expect_refused("{\"cache_prompt\":\"yes\"}", RT_GEN_API_NATIVE, "cache_prompt");
    expect_refused("{\"top_p\":1.5}", RT_GEN_API_NATIVE, "top_p");
}

static void test_params_stop(void **state)
{
    (void)state;
    rt_gen_params_t p;
    bl_err_t err = {0};
    json_t *j = J("{\"stop\":\"END\"}");
    rt_gen_limits_t l = plain_limits();
    assert_int_equal(rt__gen_parse_params(j, RT_GEN_API_OAI_CHAT, &l, &p, &err), 0);
    assert_int_equal(p.task.n_stop, 1);
    assert_string_equal(p.task.stop[0], "END");
    rt__gen_params_fini(&p);
    json_decref(j);
    j = J("{\"stop\":[\"a\",\"\",\"b\"]}");
    assert_int_equal(rt__gen_parse_params(j, RT_GEN_API_NATIVE, &l, &p, &err), 0);
    assert_int_equal(p.task.n_stop, 2);
    assert_string_equal(p.task.stop[1], "b");
    rt__gen_params_fini(&p);
    json_decref(j);
    expect_refused("{\"stop\":[1]}", RT_GEN_API_NATIVE, "stop");
    expect_refused("{\"stop\":{}}", RT_GEN_API_NATIVE, "stop");
    expect_refused("{\"stop\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\",\"10\",\"11\","
                   "\"12\",\"13\",\"14\",\"15\",\"16\",\"17\"]}",
                   RT_GEN_API_NATIVE, "stop");
    expect_refused("{\"max_tokens\":4,\"stop_sequences\":\"x\"}", RT_GEN_API_ANTHROPIC,
                   "stop_sequences");
}

static void test_params_logit_bias(void **state)
{
    (void)state;
    rt_gen_params_t p;
    bl_err_t err = {0};
    assert_int_equal(parse("{\"logit_bias\":{\"5\":1.5,\"9\":false,\"7\":true}}",
                           RT_GEN_API_OAI_CHAT, &p, &err), 0);
    assert_int_equal(p.task.sampling.n_logit_bias, 2);
    assert_int_equal(p.task.sampling.logit_bias[0].token, 5);
    assert_float_equal(p.task.sampling.logit_bias[0].bias, 1.5f, 0);
    assert_int_equal(p.task.sampling.logit_bias[1].token, 9);
    assert_true(isinf(p.task.sampling.logit_bias[1].bias) && p.task.sampling.logit_bias[1].bias < 0);
    rt__gen_params_fini(&p);
    assert_int_equal(parse("{\"logit_bias\":[[3,-2],[4,false]]}", RT_GEN_API_NATIVE, &p, &err), 0);
    assert_int_equal(p.task.sampling.n_logit_bias, 2);
    assert_int_equal(p.task.sampling.logit_bias[0].token, 3);
    rt__gen_params_fini(&p);
    expect_refused("{\"logit_bias\":{\"1000\":1}}", RT_GEN_API_OAI_CHAT, "logit_bias");
    expect_refused("{\"logit_bias\":{\"5\":\"x\"}}", RT_GEN_API_OAI_CHAT, "logit_bias");
    expect_refused("{\"logit_bias\":[[3]]}", RT_GEN_API_NATIVE, "logit_bias");
    expect_refused("{\"logit_bias\":7}", RT_GEN_API_NATIVE, "logit_bias");
    /* text keys need the tokenizer: refused by name without one */
    expect_refused("{\"logit_bias\":{\"hello\":1}}", RT_GEN_API_OAI_CHAT, "logit_bias");

    rt_tokenizer_t *tok = NULL;
    bl_gguf_t *g = open_model(&tok, NULL);
    if (!g) {
        print_message("skipped the text keys: the qwen3moe-tiny model is absent\n");
        return;
    }
    rt_gen_limits_t l = {tok, rt_tokenizer_n_vocab(tok), 4096, 1, -1};
    json_t *j = J("{\"logit_bias\":{\"Hello world\":-3}}");
    assert_int_equal(rt__gen_parse_params(j, RT_GEN_API_OAI_CHAT, &l, &p, &err), 0);
    rt_tokens_t t = {0};
    assert_int_equal(rt_tokenize(tok, "Hello world", 11, 0, &t, &err), 0);
    assert_int_equal(p.task.sampling.n_logit_bias, t.n);
    for (size_t i = 0; i < t.n; i++)
        assert_int_equal(p.task.sampling.logit_bias[i].token, t.ids[i]);
    rt_tokens_free(&t);
    rt__gen_params_fini(&p);
    json_decref(j);
    rt_tokenizer_destroy(tok);
    bl_gguf_close(g);
}

static void test_params_refusals(void **state)
{
    (void)state;
    expect_refused("{\"n\":2}", RT_GEN_API_NATIVE, "'n'");
    expect_refused("{\"n\":65}", RT_GEN_API_OAI_CHAT, "'n'");
    expect_refused("{\"n\":2,\"n_cmpl\":3}", RT_GEN_API_OAI_CMPL, "differ");
    expect_refused("{\"mirostat\":2}", RT_GEN_API_NATIVE, "mirostat");
    expect_refused("{\"grammar\":\"root ::= x\"}", RT_GEN_API_NATIVE, "'x' is used but not defined");
    expect_refused("{\"grammar\":[]}", RT_GEN_API_NATIVE, "'grammar' must be a string");
    expect_refused("{\"json_schema\":{\"not\":{}}}", RT_GEN_API_NATIVE, "'json_schema': ");
    expect_refused("{\"response_format\":{\"type\":\"xml\"}}", RT_GEN_API_OAI_CHAT,
                   "response_format");
    expect_refused("{\"response_format\":{\"type\":\"json_schema\"}}", RT_GEN_API_OAI_CHAT,
                   "json_schema.schema");
    expect_refused("{\"grammar\":\"root ::= \\\"a\\\"\",\"json_schema\":{}}", RT_GEN_API_NATIVE,
                   "not both");
    {
        /* accepted: the grammar as given, or made from the schema (owned, freed by fini) */
        rt_gen_params_t p;
        bl_err_t err = {0};
        rt_gen_limits_t l = plain_limits();
        json_t *body = J("{\"grammar\":\"root ::= \\\"a\\\"\"}"); /* the grammar is borrowed */
        assert_int_equal(rt__gen_parse_params(body, RT_GEN_API_NATIVE, &l, &p, &err), 0);
        assert_string_equal(p.task.sampling.grammar, "root ::= \"a\"");
        rt__gen_params_fini(&p);
        json_decref(body);
        assert_int_equal(parse("{\"response_format\":{\"type\":\"json_object\"}}",
                               RT_GEN_API_OAI_CHAT, &p, &err), 0);
        assert_non_null(p.grammar);
        assert_ptr_equal(p.task.sampling.grammar, p.grammar);
        assert_non_null(strstr(p.grammar, "root ::="));
        rt__gen_params_fini(&p);
        assert_null(p.task.sampling.grammar);
    }
    expect_refused("{\"samplers\":[\"warp\"]}", RT_GEN_API_NATIVE, "warp");
    expect_refused("{\"samplers\":\"kq\"}", RT_GEN_API_NATIVE, "samplers");
    expect_refused("{\"samplers\":5}", RT_GEN_API_NATIVE, "samplers");
    expect_refused("{\"samplers\":[1]}", RT_GEN_API_NATIVE, "samplers");
    {
        /* names and letters give the chain in order; an empty list none */
        rt_gen_params_t q;
        bl_err_t e = {0};
        assert_int_equal(parse("{\"samplers\":[\"top_k\",\"top-p\",\"infill\"]}",
                               RT_GEN_API_NATIVE, &q, &e), 0);
        assert_int_equal(q.task.sampling.n_stages, 3);
        assert_int_equal(q.task.sampling.stages[0], RT_STAGE_TOP_K);
        assert_int_equal(q.task.sampling.stages[1], RT_STAGE_TOP_P);
        assert_int_equal(q.task.sampling.stages[2], RT_STAGE_INFILL);
        rt__gen_params_fini(&q);
        assert_int_equal(parse("{\"samplers\":\"ekt\"}", RT_GEN_API_OAI_CHAT, &q, &e), 0);
        assert_int_equal(q.task.sampling.n_stages, 3);
        assert_int_equal(q.task.sampling.stages[2], RT_STAGE_TEMPERATURE);
        rt__gen_params_fini(&q);
        assert_int_equal(parse("{\"samplers\":[]}", RT_GEN_API_NATIVE, &q, &e), 0);
        assert_int_equal(q.task.sampling.n_stages, 0);
        rt__gen_params_fini(&q);
        assert_int_equal(parse("{}", RT_GEN_API_NATIVE, &q, &e), 0);
        assert_int_equal(q.task.sampling.n_stages, 6); /* the default chain */
        rt__gen_params_fini(&q);
    }
    expect_refused("{\"dry_multiplier\":0.8}", RT_GEN_API_NATIVE, "dry_multiplier");
    expect_refused("{\"xtc_probability\":0.5}", RT_GEN_API_NATIVE, "xtc_probability");
    expect_refused("{\"lora\":[{\"id\":0,\"scale\":1}]}", RT_GEN_API_NATIVE, "lora");
    expect_refused("{\"echo\":true}", RT_GEN_API_OAI_CMPL, "echo");
    expect_refused("{\"best_of\":3}", RT_GEN_API_OAI_CMPL, "best_of");
    expect_refused("{\"suffix\":5}", RT_GEN_API_OAI_CMPL, "suffix"); /* a string is FIM */
    /* the values that mean "off" are accepted */
    rt_gen_params_t p;
    bl_err_t err = {0};
    assert_int_equal(parse("{\"n\":1,\"mirostat\":0,\"grammar\":\"\",\"dry_multiplier\":0,"
                           "\"response_format\":{\"type\":\"text\"},\"lora\":[],\"echo\":false,"
                           "\"best_of\":1}",
                           RT_GEN_API_OAI_CMPL, &p, &err), 0);
    rt__gen_params_fini(&p);
}

static void test_params_probabilities(void **state)
{
    (void)state;
    rt_gen_params_t p;
    bl_err_t err = {0};
    assert_int_equal(parse("{\"logprobs\":true}", RT_GEN_API_OAI_CHAT, &p, &err), 0);
    assert_int_equal(p.want_probs, 1);
    assert_int_equal(p.task.n_probs, RT_MAX_N_PROBS);
    rt__gen_params_fini(&p);
    assert_int_equal(parse("{\"logprobs\":true,\"top_logprobs\":3}", RT_GEN_API_OAI_CHAT, &p, &err),
                     0);
    assert_int_equal(p.task.n_probs, 3);
    rt__gen_params_fini(&p);
    expect_refused("{\"top_logprobs\":3}", RT_GEN_API_OAI_CHAT, "top_logprobs");
    expect_refused("{\"logprobs\":true,\"top_logprobs\":21}", RT_GEN_API_OAI_CHAT, "top_logprobs");
    assert_int_equal(parse("{\"logprobs\":2}", RT_GEN_API_OAI_CMPL, &p, &err), 0);
    assert_int_equal(p.want_probs, 1);
    assert_int_equal(p.task.n_probs, 2);
    rt__gen_params_fini(&p);
    assert_int_equal(parse("{\"n_probs\":5,\"post_sampling_probs\":true}", RT_GEN_API_NATIVE, &p,
                           &err), 0);
    assert_int_equal(p.want_probs, 1);
    assert_int_equal(p.task.n_probs, 5);
    assert_int_equal(p.post_sampling_probs, 1);
    rt__gen_params_fini(&p);
    expect_refused("{\"n_probs\":-1}", RT_GEN_API_NATIVE, "n_probs");
}

static void test_params_anthropic(void **state)
{
    (void)state;
    rt_gen_params_t p;
    bl_err_t err = {0};
    expect_refused("{}", RT_GEN_API_ANTHROPIC, "max_tokens");
    expect_refused("{\"max_tokens\":0}", RT_GEN_API_ANTHROPIC, "max_tokens");
    assert_int_equal(parse("{\"max_tokens\":9,\"stop_sequences\":[\"Z\"],\"temperature\":0.2,"
                           "\"top_k\":3}",
                           RT_GEN_API_ANTHROPIC, &p, &err), 0);
    assert_int_equal(p.task.n_predict, 9);
    assert_int_equal(p.task.n_stop, 1);
    assert_int_equal(p.task.sampling.top_k, 3);
    rt__gen_params_fini(&p);
}

/* ---------------------------------------------------------------------------- */
/* prompts and messages                                                           */
/* ---------------------------------------------------------------------------- */

static int prompt_rc(const char *text, rt_tokenizer_t *tok, int64_t n_vocab, rt_tokens_t *t,
                     bl_err_t *err)
{
    json_t *j = J(text);
    int rc = rt__gen_prompt_tokens(json_object_get(j, "prompt"), tok, n_vocab, t, err);
    json_decref(j);
    return rc;
}

static void test_prompt_forms(void **state)
{
    (void)state;
    rt_tokens_t t = {0};
    bl_err_t err = {0};
    assert_int_equal(prompt_rc("{\"prompt\":[1,2,3]}", NULL, 10, &t, &err), 0);
    assert_int_equal(t.n, 3);
    assert_int_equal(t.ids[2], 3);
    rt_tokens_free(&t);
    memset(&t, 0, sizeof t);
    assert_int_equal(prompt_rc("{\"prompt\":[[4,5]]}", NULL, 10, &t, &err), 0);
    assert_int_equal(t.n, 2);
    rt_tokens_free(&t);
    memset(&t, 0, sizeof t);
    assert_int_equal(prompt_rc("{\"prompt\":{\"prompt_string\":[6]}}", NULL, 10, &t, &err), 0);
    assert_int_equal(t.n, 1);
    rt_tokens_free(&t);
    memset(&t, 0, sizeof t);
    assert_int_equal(prompt_rc("{\"prompt\":[1,10]}", NULL, 10, &t, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "prompt"));
    rt_tokens_free(&t);
    memset(&t, 0, sizeof t);
    assert_int_equal(prompt_rc("{\"prompt\":[[1],[2]]}", NULL, 10, &t, &err), BL_EINVAL);
    assert_int_equal(prompt_rc("{}", NULL, 10, &t, &err), BL_EINVAL);
    assert_int_equal(prompt_rc("{\"prompt\":3}", NULL, 10, &t, &err), BL_EINVAL);
    assert_int_equal(prompt_rc("{\"prompt\":[1,{}]}", NULL, 10, &t, &err), BL_EINVAL);
    assert_int_equal(prompt_rc("{\"prompt\":{\"prompt_string\":\"x\",\"multimodal_data\":[\"A\"]}}",
                               NULL, 10, &t, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "multimodal"));
    rt_tokens_free(&t);

    rt_tokenizer_t *tok = NULL;
    bl_gguf_t *g = open_model(&tok, NULL);
    if (!g) {
        print_message("skipped the text prompts: the qwen3moe-tiny model is absent\n");
        return;
    }
    int64_t nv = rt_tokenizer_n_vocab(tok);
    rt_tokens_t a = {0}, b = {0};
    assert_int_equal(prompt_rc("{\"prompt\":\"<|im_start|>Hi\"}", tok, nv, &a, &err), 0);
    assert_int_equal(a.ids[0], rt_tokenizer_find(tok, "<|im_start|>", 12)); /* parsed special */
    /* a mixed array: strings and ids in order */
    assert_int_equal(prompt_rc("{\"prompt\":[\"<|im_start|>Hi\", 11, \"Hi\"]}", tok, nv, &b, &err),
                     0);
    assert_true(b.n > a.n + 1);
    assert_memory_equal(b.ids, a.ids, a.n * sizeof *a.ids);
    assert_int_equal(b.ids[a.n], 11);
    rt_tokens_free(&a);
    rt_tokens_free(&b);
    /* a single-element array of strings is one prompt; several are refused */
    memset(&a, 0, sizeof a);
    assert_int_equal(prompt_rc("{\"prompt\":[\"Hi\"]}", tok, nv, &a, &err), 0);
    assert_true(a.n > 0);
    rt_tokens_free(&a);
    memset(&a, 0, sizeof a);
    assert_int_equal(prompt_rc("{\"prompt\":[\"Hi\",\"Yo\"]}", tok, nv, &a, &err), BL_EINVAL);
    rt_tokens_free(&a);
    rt_tokenizer_destroy(tok);
    bl_gguf_close(g);
}

static int messages_rc(const char *text, json_t **out, rt_gen_buf_t *prefill, bl_err_t *err)
{
    json_t *j = J(text);
    int rc = rt__gen_chat_messages(json_object_get(j, "messages"), out, prefill, err);
    json_decref(j);
    return rc;
}

static void test_chat_messages(void **state)
{
    (void)state;
    json_t *m = NULL;
    rt_gen_buf_t pre = {0};
    bl_err_t err = {0};
    assert_int_equal(messages_rc("{\"messages\":[{\"role\":\"developer\",\"content\":\"S\"},"
                                 "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
                                 "{\"type\":\"text\",\"text\":\"b\"}]}]}",
                                 &m, &pre, &err), 0);
    assert_null(pre.p);
    assert_int_equal(json_array_size(m), 2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(m, 0), "role")), "system");
    assert_string_equal(json_string_value(json_object_get(json_array_get(m, 1), "content")), "a\nb");
    json_decref(m);

    /* a last assistant message is a prefill */
    assert_int_equal(messages_rc("{\"messages\":[{\"role\":\"user\",\"content\":\"Q\"},"
                                 "{\"role\":\"assistant\",\"content\":\"The answer is\"}]}",
                                 &m, &pre, &err), 0);
    assert_int_equal(json_array_size(m), 1);
    assert_string_equal(pre.p, "The answer is");
    rt__gen_buf_free(&pre);
    json_decref(m);

    /* an empty last assistant message is an empty prefill, not the message before it
     * (the buffer the contents share must not show a stale text) */
    static const char *const empty_last[] = {"\"content\":\"\"", "\"content\":null",
                                             "\"content\":[]", "\"content\":\"\",\"tool_calls\":[]",
                                             "\"tool_calls\":[]"};
    for (size_t i = 0; i < sizeof empty_last / sizeof *empty_last; i++) {
        char body[256];
        snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"hello\"},"
                 "{\"role\":\"assistant\",%s}]}", empty_last[i]);
        assert_int_equal(messages_rc(body, &m, &pre, &err), 0);
        assert_int_equal(json_array_size(m), 1);
        if (!pre.p || pre.n)
            fail_msg("%s: prefill \"%s\"", empty_last[i], pre.p ? pre.p : "(none)");
        rt__gen_buf_free(&pre);
        json_decref(m);
    }

    static const struct {
        const char *body, *needle;
    } bad[] = {
        {"{}", "messages"},
        {"{\"messages\":\"hi\"}", "messages"},
        {"{\"messages\":[]}", "empty"},
        {"{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", "wizard"},
        {"{\"messages\":[{\"role\":\"user\"}]}", "content"},
        {"{\"messages\":[{\"content\":\"x\"}]}", "role"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":7}]}", "content"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{}}]}]}",
         "image"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_audio\"}]}]}", "audio"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}", "text"},
        {"{\"messages\":[{\"role\":\"assistant\",\"content\":\"a\",\"tool_calls\":[{}]},"
         "{\"role\":\"user\",\"content\":\"b\"}]}",
         "tool_calls"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"Q\"},{\"role\":\"assistant\","
         "\"content\":\"a\"},{\"role\":\"assistant\",\"content\":\"b\"}]}",
         "assistant messages"},
        {"{\"messages\":[1]}", "messages[0]"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int rc = messages_rc(bad[i].body, &m, &pre, &err);
        if (rc != BL_EINVAL || !strstr(err.msg, bad[i].needle))
            fail_msg("%s: rc %d \"%s\"", bad[i].body, rc, err.msg);
        assert_null(m);
        assert_null(pre.p);
    }
}

static void test_chat_options(void **state)
{
    (void)state;
    rt_app_t app = {0};
    rt_app_defaults(&app);
    json_t *kw;
    int reasoning;
    bl_err_t err = {0};
    json_t *j = J("{\"tool_choice\":\"auto\",\"tools\":[],\"chat_template_kwargs\":"
                  "{\"enable_thinking\":false}}");
    assert_int_equal(rt__gen_chat_options(&app, j, &kw, &reasoning, NULL, NULL, &err), 0);
    assert_int_equal(reasoning, 1);
    assert_true(json_is_false(json_object_get(kw, "enable_thinking")));
    json_decref(kw);
    json_decref(j);
    static const struct {
        const char *body, *needle;
    } bad[] = {
        {"{\"tools\":[{\"type\":\"function\"}]}", "tools"},
        {"{\"tool_choice\":\"required\"}", "tool_choice"},
        {"{\"functions\":[]}", "functions"},
        {"{\"chat_template_kwargs\":{\"enable_thinking\":\"no\"}}", "enable_thinking"},
        {"{\"chat_template_kwargs\":[]}", "chat_template_kwargs"},
        {"{\"reasoning_format\":\"magic\"}", "reasoning_format"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        j = J(bad[i].body);
        int rc = rt__gen_chat_options(&app, j, &kw, &reasoning, NULL, NULL, &err);
        json_decref(j);
        if (rc != BL_EINVAL || !strstr(err.msg, bad[i].needle))
            fail_msg("%s: rc %d \"%s\"", bad[i].body, rc, err.msg);
        assert_null(kw);
    }
    j = J("{\"reasoning_format\":\"none\"}");
    assert_int_equal(rt__gen_chat_options(&app, j, &kw, &reasoning, NULL, NULL, &err), 0);
    assert_int_equal(reasoning, 0);
    json_decref(j);
    /* the server's --reasoning-format none is the default a request may override */
    app.reasoning = 0;
    j = J("{}");
    assert_int_equal(rt__gen_chat_options(&app, j, &kw, &reasoning, NULL, NULL, &err), 0);
    assert_int_equal(reasoning, 0);
    json_decref(j);
    j = J("{\"reasoning_format\":\"auto\"}");
    assert_int_equal(rt__gen_chat_options(&app, j, &kw, &reasoning, NULL, NULL, &err), 0);
    assert_int_equal(reasoning, 1);
    json_decref(j);
}

static void test_anthropic_messages(void **state)
{
    (void)state;
    json_t *m;
    bl_err_t err = {0};
    json_t *j = J("{\"system\":[{\"type\":\"text\",\"text\":\"Be \"},{\"type\":\"text\",\"text\":"
                  "\"brief.\"}],\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\","
                  "\"text\":\"Hi\"}]}]}");
    assert_int_equal(rt__gen_anthropic_messages(j, &m, &err), 0);
    assert_int_equal(json_array_size(m), 2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(m, 0), "content")),
                        "Be brief.");
    json_decref(m);
    json_decref(j);
    static const struct {
        const char *body, *needle;
    } bad[] = {
        {"{\"messages\":[]}", "empty"},
        {"{\"system\":3,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", "system"},
        {"{\"messages\":[{\"role\":\"system\",\"content\":\"x\"}]}", "system"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\",\"source\":{}}]}]}",
         "image"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\"}]}]}",
         "tool_result"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        j = J(bad[i].body);
        int rc = rt__gen_anthropic_messages(j, &m, &err);
        json_decref(j);
        if (rc != BL_EINVAL || !strstr(err.msg, bad[i].needle))
            fail_msg("%s: rc %d \"%s\"", bad[i].body, rc, err.msg);
    }
}

/* ---------------------------------------------------------------------------- */
/* <think> splitting                                                              */
/* ---------------------------------------------------------------------------- */

/* Feeds text in pieces of step bytes (0: one piece) and checks both parts. */
static void split_check(const char *text, int open, size_t step, const char *want_reason,
                        const char *want_content)
{
    rt_gen_think_t t;
    rt_gen_buf_t r = {0}, c = {0};
    rt__gen_think_init(&t, open, RT_CHATFMT_HERMES);
    size_t n = strlen(text);
    if (step == 0)
        step = n ? n : 1;
    for (size_t i = 0; i < n; i += step)
        assert_int_equal(rt__gen_think_feed(&t, text + i, n - i < step ? n - i : step, &r, &c), 0);
    assert_int_equal(rt__gen_think_finish(&t, &r, &c), 0);
    const char *gr = r.p ? r.p : "", *gc = c.p ? c.p : "";
    if (strcmp(gr, want_reason) || strcmp(gc, want_content))
        fail_msg("\"%s\" (open %d, step %zu): reasoning \"%s\" content \"%s\"", text, open, step,
                 gr, gc);
    rt__gen_buf_free(&r);
    rt__gen_buf_free(&c);
    rt__gen_think_fini(&t);
}

static void test_think_split_every_piece_size(void **state)
{
    (void)state;
    for (size_t step = 0; step <= 9; step++) {
        split_check("<think>\nPlan: add.\n</think>\n\nThe sum is 4.", 0, step, "Plan: add.",
                    "The sum is 4.");
        split_check("Plan: add.\n</think>\n\nThe sum is 4.", 1, step, "Plan: add.",
                    "The sum is 4.");
        split_check("  <think>a</think>b", 0, step, "a", "b");
        split_check("No thinking here.", 0, step, "", "No thinking here.");
        split_check("Say <think> later </think> x", 0, step, "",
                    "Say <think> later </think> x");
        split_check("<think>\n\n</think>\n\nDirect.", 0, step, "", "Direct.");
        split_check("<think>unclosed thought  ", 0, step, "unclosed thought", "");
        split_check("<thin", 0, step, "", "<thin");
        split_check("a < b </thinking> c </think>d", 1, step, "a < b </thinking> c", "d");
        split_check("", 0, step, "", "");
    }
}

static void test_think_streams_before_the_end(void **state)
{
    (void)state;
    rt_gen_think_t t;
    rt_gen_buf_t r = {0}, c = {0};
    rt__gen_think_init(&t, 0, RT_CHATFMT_HERMES);
    assert_int_equal(rt__gen_think_feed(&t, "<think>one two", 14, &r, &c), 0);
    assert_string_equal(r.p, "one two"); /* released before </think> arrives */
    assert_int_equal(rt__gen_think_feed(&t, " </th", 5, &r, &c), 0);
    assert_string_equal(r.p, "one two"); /* a possible tag and a space are held */
    assert_int_equal(rt__gen_think_feed(&t, "ink>Done", 8, &r, &c), 0);
    assert_string_equal(c.p, "Done");
    rt__gen_buf_free(&r);
    rt__gen_buf_free(&c);
    rt__gen_think_fini(&t);
}

/* ---------------------------------------------------------------------------- */
/* tool calls                                                                     */
/* ---------------------------------------------------------------------------- */

/* Feeds s in pieces of step bytes (0: whole) and checks the text and the calls
 * (names and arguments joined as "name(args);"). */
static void tools_check(const char *s, size_t step, const char *want_text, const char *want_calls)
{
    rt_gen_tools_t t;
    rt__gen_tools_init(&t, RT_CHATFMT_HERMES, NULL);
    rt_gen_buf_t text = {0}, calls = {0};
    size_t n = strlen(s);
    for (size_t i = 0; i < n || (i == 0 && n == 0);) {
        size_t k = step == 0 ? n : (n - i < step ? n - i : step);
        assert_int_equal(rt__gen_tools_feed(&t, s + i, k, 0, &text), 0);
        i += k;
        if (k == 0)
            break;
    }
    assert_int_equal(rt__gen_tools_feed(&t, "", 0, 1, &text), 0);
    size_t j;
    json_t *c;
    json_array_foreach(t.calls, j, c) {
        json_t *fn = json_object_get(c, "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        const char *args = json_string_value(json_object_get(fn, "arguments"));
        assert_int_equal(strncmp(json_string_value(json_object_get(c, "id")), "call_", 5), 0);
        assert_string_equal(json_string_value(json_object_get(c, "type")), "function");
        assert_int_equal(rt__gen_buf_add(&calls, name, strlen(name)), 0);
        assert_int_equal(rt__gen_buf_add(&calls, "(", 1), 0);
        assert_int_equal(rt__gen_buf_add(&calls, args, strlen(args)), 0);
        assert_int_equal(rt__gen_buf_add(&calls, ");", 2), 0);
    }
    if (strcmp(text.p ? text.p : "", want_text) || strcmp(calls.p ? calls.p : "", want_calls))
        fail_msg("step %zu, '%s': text '%s' calls '%s'", step, s, text.p ? text.p : "",
                 calls.p ? calls.p : "");
    rt__gen_buf_free(&text);
    rt__gen_buf_free(&calls);
    rt__gen_tools_fini(&t);
}

static void test_tool_calls_split_every_piece_size(void **state)
{
    (void)state;
    for (size_t step = 0; step <= 13; step++) {
        tools_check("Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                    "{\"city\": \"Paris\", \"days\": 2}}\n</tool_call>",
                    step, "Let me look.\n", "get_weather({\"city\":\"Paris\",\"days\":2});");
        tools_check("<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call>\n<tool_call>"
                    "{\"name\":\"b\",\"arguments\":\"{\\\"x\\\":1}\"}</tool_call>",
                    step, "\n", "a({});b({\"x\":1});");
        /* not a call: the span stays text, tags and all */
        tools_check("x <tool_call>not json</tool_call> y", step,
                    "x <tool_call>not json</tool_call> y", "");
        tools_check("<tool_call>{\"arguments\":{}}</tool_call>", step,
                    "<tool_call>{\"arguments\":{}}</tool_call>", "");
        /* the text ends inside a call whose JSON is whole: taken */
        tools_check("<tool_call>\n{\"name\": \"f\"}\n", step, "", "f({});");
        tools_check("<tool_call>{\"name\": \"f\", \"argu", step, "<tool_call>{\"name\": \"f\", \"argu",
                    "");
        tools_check("a <tool_ca", step, "a <tool_ca", "");
        tools_check("<tool_call>", step, "<tool_call>", "");
        tools_check("plain", step, "plain", "");
        tools_check("", step, "", "");
    }
}

static void test_tool_calls_hold_only_what_may_be_a_tag(void **state)
{
    (void)state;
    rt_gen_tools_t t;
    rt__gen_tools_init(&t, RT_CHATFMT_HERMES, NULL);
    rt_gen_buf_t text = {0};
    assert_int_equal(rt__gen_tools_feed(&t, "one <tool", 9, 0, &text), 0);
    assert_string_equal(text.p, "one "); /* "<tool" may grow into the tag */
    assert_int_equal(rt__gen_tools_feed(&t, "box> two", 8, 0, &text), 0);
    assert_string_equal(text.p, "one <toolbox> two");
    rt__gen_buf_free(&text);
    rt__gen_tools_fini(&t);
}

static void test_tools_in_requests(void **state)
{
    (void)state;
    rt_app_t app = {0};
    rt_app_defaults(&app);
    json_t *kw;
    int reasoning, tools;
    bl_err_t err = {0};
    json_t *j = J("{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":"
                  "\"d\",\"parameters\":{\"type\":\"object\"}}}],\"parallel_tool_calls\":false}");
    assert_int_equal(rt__gen_chat_options(&app, j, &kw, &reasoning, &tools, NULL, &err), 0);
    assert_int_equal(tools, 1);
    assert_true(json_equal(json_object_get(kw, "tools"), json_object_get(j, "tools")));
    json_decref(kw);
    json_object_set_new(j, "tool_choice", json_string("none"));
    assert_int_equal(rt__gen_chat_options(&app, j, &kw, &reasoning, &tools, NULL, &err), 0);
    assert_int_equal(tools, 0); /* none: the template gets no tools, nothing is parsed */
    assert_null(json_object_get(kw, "tools"));
    json_decref(kw);
    json_decref(j);
    static const struct {
        const char *body, *needle;
    } bad[] = {
        {"{\"tools\":{}}", "tools"},
        {"{\"tools\":[{\"type\":\"retrieval\"}]}", "tools[0]"},
        {"{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"\"}}]}", "tools[0].function"},
        {"{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":1}}]}",
         "parameters"},
        {"{\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}}}", "tool_choice"},
        {"{\"parallel_tool_calls\":\"yes\"}", "parallel_tool_calls"},
        {"{\"tool_choice\":\"required\"}", "'tools' is empty"},
        {"{\"tool_choice\":\"always\"}", "tool_choice"},
        {"{\"tool_choice\":{\"type\":\"function\"},\"tools\":[{\"type\":\"function\","
         "\"function\":{\"name\":\"f\"}}]}", "tool_choice"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        j = J(bad[i].body);
        int rc = rt__gen_chat_options(&app, j, &kw, &reasoning, &tools, NULL, &err);
        json_decref(j);
        if (rc != BL_EINVAL || !strstr(err.msg, bad[i].needle))
            fail_msg("%s: rc %d \"%s\"", bad[i].body, rc, err.msg);
        assert_null(kw);
    }

    /* an assistant turn with calls, and the tool's answer, reach the template */
    json_t *msgs;
    rt_gen_buf_t prefill = {0};
    j = J("[{\"role\":\"user\",\"content\":\"Weather?\"},{\"role\":\"assistant\",\"content\":null,"
          "\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"w\","
          "\"arguments\":{\"city\":\"Oslo\"}}}]},{\"role\":\"tool\",\"tool_call_id\":\"call_1\","
          "\"content\":\"-3C\"}]");
    assert_int_equal(rt__gen_chat_messages(j, &msgs, &prefill, &err), 0);
    assert_null(prefill.p);
    json_t *tc = json_array_get(json_object_get(json_array_get(msgs, 1), "tool_calls"), 0);
    assert_string_equal(json_string_value(json_object_get(tc, "id")), "call_1");
    assert_string_equal(json_string_value(json_object_get(json_object_get(tc, "function"),
                                                          "arguments")), "{\"city\":\"Oslo\"}");
    assert_string_equal(json_string_value(json_object_get(json_array_get(msgs, 2),
                                                          "tool_call_id")), "call_1");
    json_decref(msgs);
    json_decref(j);
    j = J("[{\"role\":\"user\",\"content\":\"x\",\"tool_calls\":[]}]");
    assert_int_equal(rt__gen_chat_messages(j, &msgs, &prefill, &err), BL_EINVAL);
    json_decref(j);
    j = J("[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"tool_calls\":"
          "[{\"function\":{\"arguments\":\"{}\"}}]}]");
    assert_int_equal(rt__gen_chat_messages(j, &msgs, &prefill, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "messages[1].tool_calls[0]"));
    json_decref(j);
}

/* ---------------------------------------------------------------------------- */
/* reply pieces                                                                   */
/* ---------------------------------------------------------------------------- */

static void test_json_piece_utf8(void **state)
{
    (void)state;
    json_t *j = rt__gen_json_piece("ab\xC3", 3); /* a character cut at the end */
    assert_string_equal(json_string_value(j), "ab");
    json_decref(j);
    j = rt__gen_json_piece("a\xFF" "b", 3);
    assert_string_equal(json_string_value(j), "a\xEF\xBF\xBD" "b");
    json_decref(j);
    j = rt__gen_json_piece("\xC3\xA9", 2);
    assert_string_equal(json_string_value(j), "\xC3\xA9");
    json_decref(j);
    j = rt__gen_json_real(-INFINITY);
    assert_true(json_real_value(j) == -FLT_MAX);
    json_decref(j);
}

static void test_sse_format(void **state)
{
    (void)state;
    size_t len;
    char *s = rt__gen_sse(NULL, json_pack("{s:i}", "a", 1), &len);
    assert_string_equal(s, "data: {\"a\":1}\n\n");
    assert_int_equal(len, strlen(s));
    free(s);
    s = rt__gen_sse("message_stop", json_pack("{s:s}", "type", "message_stop"), &len);
    assert_string_equal(s, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
    free(s);
}

static void test_timings_and_usage(void **state)
{
    (void)state;
    rt_timings_t t = {.n_prompt = 10, .n_cached = 4, .n_predicted = 5, .prompt_ms = 12.0,
                      .predicted_ms = 50.0};
    json_t *j = rt__gen_timings_json(&t);
    assert_int_equal(json_integer_value(json_object_get(j, "cache_n")), 4);
    assert_int_equal(json_integer_value(json_object_get(j, "prompt_n")), 6);
    assert_float_equal(json_real_value(json_object_get(j, "prompt_per_token_ms")), 2.0, 1e-9);
    assert_float_equal(json_real_value(json_object_get(j, "prompt_per_second")), 500.0, 1e-9);
    assert_float_equal(json_real_value(json_object_get(j, "predicted_per_token_ms")), 10.0, 1e-9);
    assert_float_equal(json_real_value(json_object_get(j, "predicted_per_second")), 100.0, 1e-9);
    json_decref(j);
    rt_timings_t z = {0};
    j = rt__gen_timings_json(&z); /* no division by zero */
    assert_float_equal(json_real_value(json_object_get(j, "prompt_per_second")), 0.0, 0);
    json_decref(j);
    j = rt__gen_usage_json(10, 5, 4);
    assert_int_equal(json_integer_value(json_object_get(j, "total_tokens")), 15);
    json_decref(j);
}

static void test_legacy_logprobs(void **state)
{
    (void)state;
    json_t *e = J("[{\"id\":1,\"token\":\"He\",\"bytes\":[72,101],\"logprob\":-0.5,"
                  "\"top_logprobs\":[{\"id\":1,\"token\":\"He\",\"bytes\":[72,101],"
                  "\"logprob\":-0.5}]},{\"id\":2,\"token\":\"y\",\"bytes\":[121],"
                  "\"logprob\":-1.0,\"top_logprobs\":[]}]");
    int64_t off = 0;
    json_t *j = rt__gen_legacy_logprobs(e, 0, &off);
    assert_int_equal(off, 3);
    assert_string_equal(json_string_value(json_array_get(json_object_get(j, "tokens"), 1)), "y");
    assert_int_equal(json_integer_value(json_array_get(json_object_get(j, "text_offset"), 1)), 2);
    assert_float_equal(json_real_value(json_object_get(
                           json_array_get(json_object_get(j, "top_logprobs"), 0), "He")),
                       -0.5, 0);
    assert_int_equal(json_array_size(json_object_get(j, "content")), 2);
    json_decref(j);
    json_decref(e);
}

/* ---------------------------------------------------------------------------- */
/* whole replies from scripted events                                             */
/* ---------------------------------------------------------------------------- */

typedef struct fixture {
    bl_gguf_t *g;
    rt_tokenizer_t *tok;
    rt_template_t *tpl;
    rt_app_t app;
} fixture_t;

static int setup_model(void **state)
{
    fixture_t *f = calloc(1, sizeof *f);
    f->g = open_model(&f->tok, &f->tpl);
    rt_app_defaults(&f->app);
    f->app.tok = f->tok;
    f->app.tpl = f->tpl;
    f->app.model_alias = "tiny";
    f->app.n_vocab = f->tok ? rt_tokenizer_n_vocab(f->tok) : 0;
    f->app.n_ctx_slot = 256;
    f->app.n_slots = 1;
    f->app.n_predict_default = -1;
    *state = f;
    return 0;
}

static int teardown_model(void **state)
{
    fixture_t *f = *state;
    if (f->tok)
        rt_tokenizer_destroy(f->tok);
    if (f->tpl)
        rt_template_destroy(f->tpl);
    if (f->g)
        bl_gguf_close(f->g);
    free(f);
    return 0;
}

static void token_event(int32_t id, const char *text, int64_t n)
{
    rt_event_t ev = {0};
    ev.kind = RT_EV_TOKEN;
    ev.token = id;
    ev.text = text;
    ev.len = strlen(text);
    ev.sampled.id = id;
    ev.sampled.prob = 0.5f;
    ev.sampled.logprob = -0.25f;
    ev.timings.n_predicted = n;
    g_cb(g_cb_ud, &ev);
}

static void done_event(rt_stop_type_t st, const char *word, int64_t n_prompt, int64_t n)
{
    rt_event_t ev = {0};
    ev.kind = RT_EV_DONE;
    ev.stop_type = st;
    ev.stopping_word = word;
    ev.tail = "";
    ev.timings.n_prompt = n_prompt;
    ev.timings.n_predicted = n;
    ev.timings.prompt_ms = 10;
    ev.timings.predicted_ms = 20;
    g_cb(g_cb_ud, &ev);
}

/* The data objects of an SSE stream, in order (the [DONE] marker as a string). */
static json_t *sse_objects(const char *s)
{
    json_t *a = json_array();
    const char *p = s;
    while ((p = strstr(p, "data: "))) {
        p += 6;
        const char *e = strstr(p, "\n\n");
        assert_non_null(e);
        if (!strncmp(p, "[DONE]", 6)) {
            json_array_append_new(a, json_string("[DONE]"));
        } else {
            json_error_t err;
            json_t *j = json_loadb(p, (size_t)(e - p), 0, &err);
            if (!j)
                fail_msg("bad SSE data: %.*s", (int)(e - p), p);
            json_array_append_new(a, j);
        }
        p = e + 2;
    }
    return a;
}

static void test_chat_stream_reply(void **state)
{
    fixture_t *f = *state;
    if (!f->tok) {
        print_message("skipped: the qwen3moe-tiny model is absent\n");
        skip();
    }
    rt_req_t r = {.app = &f->app};
    r.body = J("{\"messages\":[{\"role\":\"user\",\"content\":\"2+2?\"}],\"stream\":true,"
               "\"stream_options\":{\"include_usage\":true},\"logprobs\":true,\"top_logprobs\":0}");
    g_submits = 0;
    rt__api_chat(&r);
    assert_int_equal(g_submits, 1);
    assert_int_equal(r.status, 200);
    token_event(1, "<think>", 1);
    token_event(2, "add", 2);
    token_event(3, "</think>\n\n", 3);
    token_event(4, "4", 4);
    done_event(RT_STOP_EOS, NULL, 12, 4);
    assert_true(r.ended);
    json_t *a = sse_objects(r.stream.p);
    size_t n = json_array_size(a);
    assert_true(n >= 6);
    /* the role first, then reasoning, then content, then the finish, usage, [DONE] */
    json_t *d0 = json_object_get(json_array_get(json_object_get(json_array_get(a, 0), "choices"), 0),
                                 "delta");
    assert_string_equal(json_string_value(json_object_get(d0, "role")), "assistant");
    assert_string_equal(json_string_value(json_object_get(json_array_get(a, 0), "object")),
                        "chat.completion.chunk");
    rt_gen_buf_t reason = {0}, content = {0};
    const char *finish = NULL;
    int logprob_entries = 0;
    for (size_t i = 0; i + 1 < n; i++) {
        json_t *c = json_array_get(json_object_get(json_array_get(a, i), "choices"), 0);
        json_t *d = json_object_get(c, "delta");
        json_t *rc = json_object_get(d, "reasoning_content"), *cc = json_object_get(d, "content");
        if (json_is_string(rc))
            assert_int_equal(rt__gen_buf_add(&reason, json_string_value(rc),
                                             json_string_length(rc)), 0);
        if (json_is_string(cc))
            assert_int_equal(rt__gen_buf_add(&content, json_string_value(cc),
                                             json_string_length(cc)), 0);
        if (json_is_string(json_object_get(c, "finish_reason")))
            finish = json_string_value(json_object_get(c, "finish_reason"));
        logprob_entries += (int)json_array_size(
            json_object_get(json_object_get(c, "logprobs"), "content"));
    }
    assert_string_equal(reason.p, "add");
    assert_string_equal(content.p, "4");
    assert_string_equal(finish, "stop");
    assert_int_equal(logprob_entries, 4);
    json_t *usage_chunk = json_array_get(a, n - 2);
    assert_int_equal(json_array_size(json_object_get(usage_chunk, "choices")), 0);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(usage_chunk, "usage"),
                                                        "completion_tokens")), 4);
    assert_non_null(json_object_get(usage_chunk, "timings"));
    assert_string_equal(json_string_value(json_array_get(a, n - 1)), "[DONE]");
    rt__gen_buf_free(&reason);
    rt__gen_buf_free(&content);
    rt__gen_buf_free(&r.stream);
    json_decref(a);
    json_decref(r.body);
}

static void test_chat_reply_not_streamed(void **state)
{
    fixture_t *f = *state;
    if (!f->tok) {
        print_message("skipped: the qwen3moe-tiny model is absent\n");
        skip();
    }
    rt_req_t r = {.app = &f->app};
    r.body = J("{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":3,"
               "\"stop\":[\"!\"]}");
    rt__api_chat(&r);
    assert_int_equal(g_submitted.n_predict, 3);
    assert_int_equal(g_submitted.n_stop, 1);
    token_event(1, "<think>x</think>", 1);
    token_event(2, "Hello", 2);
    done_event(RT_STOP_WORD, "!", 9, 2);
    assert_int_equal(r.status, 200);
    json_t *c = json_array_get(json_object_get(r.reply, "choices"), 0);
    json_t *msg = json_object_get(c, "message");
    assert_string_equal(json_string_value(json_object_get(msg, "content")), "Hello");
    assert_string_equal(json_string_value(json_object_get(msg, "reasoning_content")), "x");
    assert_string_equal(json_string_value(json_object_get(c, "finish_reason")), "stop");
    assert_string_equal(json_string_value(json_object_get(r.reply, "object")), "chat.completion");
    assert_string_equal(json_string_value(json_object_get(r.reply, "model")), "tiny");
    assert_int_equal(strncmp(json_string_value(json_object_get(r.reply, "id")), "chatcmpl-", 9), 0);
    json_t *u = json_object_get(r.reply, "usage");
    assert_int_equal(json_integer_value(json_object_get(u, "prompt_tokens")),
                     json_integer_value(json_object_get(u, "total_tokens")) - 2);
    assert_non_null(json_object_get(json_object_get(r.reply, "timings"), "predicted_per_second"));
    json_decref(r.reply);
    json_decref(r.body);
}

static const char *const TOOLS_BODY =
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}}]";

static void test_chat_tool_call_reply(void **state)
{
    fixture_t *f = *state;
    if (!f->tok) {
        print_message("skipped: the qwen3moe-tiny model is absent\n");
        skip();
    }
    char body[1024];
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"Paris?\"}],%s}",
             TOOLS_BODY);
    rt_req_t r = {.app = &f->app};
    r.body = J(body);
    rt__api_chat(&r);
    token_event(1, "<think>need weather</think>\n\n", 1);
    token_event(2, "<tool_call>\n{\"name\": \"get_weather\", ", 2);
    token_event(3, "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", 3);
    done_event(RT_STOP_EOS, NULL, 40, 3);
    assert_int_equal(r.status, 200);
    json_t *c = json_array_get(json_object_get(r.reply, "choices"), 0);
    json_t *msg = json_object_get(c, "message");
    assert_string_equal(json_string_value(json_object_get(c, "finish_reason")), "tool_calls");
    assert_true(json_is_null(json_object_get(msg, "content")));
    assert_string_equal(json_string_value(json_object_get(msg, "reasoning_content")),
                        "need weather");
    json_t *call = json_array_get(json_object_get(msg, "tool_calls"), 0);
    json_t *fn = json_object_get(call, "function");
    assert_string_equal(json_string_value(json_object_get(fn, "name")), "get_weather");
    assert_string_equal(json_string_value(json_object_get(fn, "arguments")), "{\"city\":\"Paris\"}");
    json_decref(r.reply);
    json_decref(r.body);

    /* streamed: the text, then the call in one delta with its index, then the finish */
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"Paris?\"}],"
             "\"stream\":true,%s}", TOOLS_BODY);
    rt_req_t s = {.app = &f->app};
    s.body = J(body);
    rt__api_chat(&s);
    token_event(1, "Checking.", 1);
    token_event(2, "<tool_", 2);
    token_event(3, "call>{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}</tool_call>", 3);
    done_event(RT_STOP_EOS, NULL, 40, 3);
    json_t *a = sse_objects(s.stream.p);
    rt_gen_buf_t content = {0};
    int n_calls = 0;
    const char *finish = NULL;
    for (size_t i = 0; i < json_array_size(a); i++) {
        json_t *ch = json_array_get(json_object_get(json_array_get(a, i), "choices"), 0);
        json_t *d = json_object_get(ch, "delta");
        json_t *cc = json_object_get(d, "content");
        if (json_is_string(cc))
            assert_int_equal(rt__gen_buf_add(&content, json_string_value(cc),
                                             json_string_length(cc)), 0);
        json_t *tcs = json_object_get(d, "tool_calls");
        if (tcs) {
            json_t *t0 = json_array_get(tcs, 0);
            assert_int_equal(json_integer_value(json_object_get(t0, "index")), n_calls);
            assert_string_equal(json_string_value(json_object_get(
                                    json_object_get(t0, "function"), "name")), "get_weather");
            n_calls++;
        }
        if (json_is_string(json_object_get(ch, "finish_reason")))
            finish = json_string_value(json_object_get(ch, "finish_reason"));
    }
    assert_string_equal(content.p, "Checking.");
    assert_int_equal(n_calls, 1);
    assert_string_equal(finish, "tool_calls");
    rt__gen_buf_free(&content);
    rt__gen_buf_free(&s.stream);
    json_decref(a);
    json_decref(s.body);
}

/* /v1/responses: input items and instructions as chat messages, function tools, the
 * reply as a response object with its reasoning, message and function_call items,
 * and streamed as Responses' named events in order; what it cannot honour is a 400
 * naming the field. */
static void test_responses_api(void **state)
{
    fixture_t *f = *state;
    if (!f->tok) {
        print_message("skipped: the qwen3moe-tiny model is absent\n");
        skip();
    }
    static const char *const TOOLS = "\"tools\":[{\"type\":\"function\",\"name\":\"get_weather\",\"parameters\":"
                                     "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}]";
    char body[2048];
    snprintf(body, sizeof body, "{\"instructions\":\"Be brief.\",\"max_output_tokens\":50,\"input\":["
             "{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"Paris?\"}]},"
             "{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"get_weather\",\"arguments\":\"{}\"},"
             "{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":\"-3C\"},"
             "{\"role\":\"user\",\"content\":\"And now?\"}],%s}", TOOLS);
    rt_req_t r = {.app = &f->app};
    r.body = J(body);
    rt__api_responses(&r);
    /* the chat request it became */
    json_t *msgs = json_object_get(r.body, "messages");
    assert_int_equal(json_array_size(msgs), 5);
    assert_string_equal(json_string_value(json_object_get(json_array_get(msgs, 0), "role")), "system");
    assert_string_equal(json_string_value(json_object_get(json_array_get(msgs, 2), "role")), "assistant");
    assert_string_equal(json_string_value(json_object_get(json_array_get(msgs, 3), "tool_call_id")), "c1");
    assert_int_equal(json_integer_value(json_object_get(r.body, "max_tokens")), 50);
    token_event(1, "<think>need weather</think>\n\n", 1);
    token_event(2, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", 2);
    done_event(RT_STOP_EOS, NULL, 40, 2);
    assert_int_equal(r.status, 200);
    assert_string_equal(json_string_value(json_object_get(r.reply, "object")), "response");
    assert_string_equal(json_string_value(json_object_get(r.reply, "status")), "completed");
    assert_int_equal(strncmp(json_string_value(json_object_get(r.reply, "id")), "resp_", 5), 0);
    json_t *out = json_object_get(r.reply, "output");
    assert_int_equal(json_array_size(out), 2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(out, 0), "type")), "reasoning");
    json_t *fc = json_array_get(out, 1);
    assert_string_equal(json_string_value(json_object_get(fc, "type")), "function_call");
    assert_string_equal(json_string_value(json_object_get(fc, "name")), "get_weather");
    assert_string_equal(json_string_value(json_object_get(fc, "arguments")), "{\"city\":\"Paris\"}");
    assert_non_null(json_string_value(json_object_get(fc, "call_id")));
    json_t *u = json_object_get(r.reply, "usage");
    assert_int_equal(json_integer_value(json_object_get(u, "output_tokens")), 2);
    assert_string_equal(json_string_value(json_object_get(r.reply, "instructions")), "Be brief.");
    json_decref(r.reply);
    json_decref(r.body);

    /* streamed: text, then the call */
    snprintf(body, sizeof body, "{\"input\":\"Paris?\",\"stream\":true,%s}", TOOLS);
    rt_req_t s = {.app = &f->app};
    s.body = J(body);
    rt__api_responses(&s);
    token_event(1, "Checking.", 1);
    token_event(2, "<tool_call>{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}</tool_call>", 2);
    done_event(RT_STOP_EOS, NULL, 40, 2);
    static const char *const want[] = {
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done", "response.completed"};
    const char *p = s.stream.p;
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        p = strstr(p, "event: ");
        assert_non_null(p);
        p += 7;
        if (strncmp(p, want[i], strlen(want[i])) || p[strlen(want[i])] != '\n')
            fail_msg("event %zu: wanted %s in %s", i, want[i], s.stream.p);
    }
    assert_null(strstr(p, "event: "));
    assert_non_null(strstr(s.stream.p, "\"sequence_number\":12"));
    assert_non_null(strstr(s.stream.p, "\"delta\":\"Checking.\""));
    rt__gen_buf_free(&s.stream);
    json_decref(s.body);

    static const char *const bad[][2] = {
        {"{\"input\":\"x\",\"previous_response_id\":\"resp_1\"}", "previous_response_id"},
        {"{\"input\":\"x\",\"tools\":[{\"type\":\"web_search\"}]}", "function tools"},
        {"{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\",\"image_url\":\"u\"}]}]}",
         "input_image"},
        {"{\"input\":\"x\",\"background\":true}", "background"},
        {"{\"input\":\"x\",\"messages\":[]}", "'messages' is not a field"},
        {"{\"input\":\"x\",\"n\":2}", "'n' is not a field"},
        {"{\"instructions\":\"x\"}", "'input' is required"},
        {"{\"input\":[{\"type\":\"computer_call\"}]}", "computer_call"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        rt_req_t b = {.app = &f->app};
        b.body = J(bad[i][0]);
        rt__api_responses(&b);
        assert_int_equal(b.status, 400);
        const char *msg = json_string_value(json_object_get(json_object_get(b.reply, "error"), "message"));
        if (!msg || !strstr(msg, bad[i][1]))
            fail_msg("%s: %s", bad[i][0], msg ? msg : "(no message)");
        json_decref(b.reply);
        json_decref(b.body);
    }
}

/* A streamed call whose arguments come in pieces: its id and name as soon as the
 * arguments begin, then the arguments as they come (a character split between
 * pieces held until whole), OpenAI's delta form, and no whole call after them. */
static void test_chat_tool_call_arguments_stream(void **state)
{
    fixture_t *f = *state;
    if (!f->tok) {
        print_message("skipped: the qwen3moe-tiny model is absent\n");
        skip();
    }
    char body[1024];
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"Paris?\"}],"
             "\"stream\":true,%s}", TOOLS_BODY);
    rt_req_t s = {.app = &f->app};
    s.body = J(body);
    rt__api_chat(&s);
    token_event(1, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"ci", 1);
    token_event(2, "ty\": \"Montr\xc3", 2);
    token_event(3, "\xa9" "al\"}}\n</tool_call>", 3);
    done_event(RT_STOP_EOS, NULL, 40, 3);
    json_t *a = sse_objects(s.stream.p);
    rt_gen_buf_t args = {0};
    int headers = 0, pieces = 0;
    const char *id = NULL, *finish = NULL;
    for (size_t i = 0; i < json_array_size(a); i++) {
        json_t *ch = json_array_get(json_object_get(json_array_get(a, i), "choices"), 0);
        json_t *t0 = json_array_get(json_object_get(json_object_get(ch, "delta"), "tool_calls"), 0);
        if (json_is_string(json_object_get(ch, "finish_reason")))
            finish = json_string_value(json_object_get(ch, "finish_reason"));
        if (!t0)
            continue;
        assert_int_equal(json_integer_value(json_object_get(t0, "index")), 0);
        json_t *fn = json_object_get(t0, "function");
        if (json_object_get(t0, "id")) {
            headers++;
            id = json_string_value(json_object_get(t0, "id"));
            assert_string_equal(json_string_value(json_object_get(fn, "name")), "get_weather");
            assert_string_equal(json_string_value(json_object_get(fn, "arguments")), "");
        } else {
            pieces++;
            const char *p = json_string_value(json_object_get(fn, "arguments"));
            assert_non_null(p);
            assert_int_equal(rt__gen_buf_add(&args, p, strlen(p)), 0);
        }
    }
    assert_int_equal(headers, 1);
    assert_true(pieces >= 2);
    assert_int_equal(strncmp(id, "call_", 5), 0);
    assert_string_equal(args.p, "{\"city\": \"Montr\xc3\xa9" "al\"}");
    assert_string_equal(finish, "tool_calls");
    rt__gen_buf_free(&args);
    rt__gen_buf_free(&s.stream);
    json_decref(a);
    json_decref(s.body);
}

static void test_chat_errors_before_and_after_start(void **state)
{
    fixture_t *f = *state;
    if (!f->tok) {
        print_message("skipped: the qwen3moe-tiny model is absent\n");
        skip();
    }
    /* a prompt the engine finds too long: llama-server's exceed_context_size_error */
    rt_req_t r = {.app = &f->app};
    r.body = J("{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}");
    g_submit_rc = BL_ERANGE;
    rt__api_chat(&r);
    g_submit_rc = 0;
    assert_int_equal(r.status, 400);
    json_t *e = json_object_get(r.reply, "error");
    assert_string_equal(json_string_value(json_object_get(e, "type")), "exceed_context_size_error");
    assert_int_equal(json_integer_value(json_object_get(e, "n_ctx")), 256);
    json_decref(r.reply);
    json_decref(r.body);

    /* loading: 503 */
    rt_req_t r2 = {.app = &f->app};
    r2.body = J("{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}");
    f->app.loading = 1;
    rt__api_chat(&r2);
    f->app.loading = 0;
    assert_int_equal(r2.status, 503);
    assert_string_equal(json_string_value(json_object_get(json_object_get(r2.reply, "error"),
                                                          "message")), "Loading model");
    json_decref(r2.reply);
    json_decref(r2.body);

    /* a worker dies mid-stream: an SSE error object, then the end */
    rt_req_t r3 = {.app = &f->app};
    r3.body = J("{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"stream\":true}");
    rt__api_chat(&r3);
    token_event(1, "Hel", 1);
    rt_event_t ev = {.kind = RT_EV_ERROR, .status = 500, .message = "worker0 died"};
    g_cb(g_cb_ud, &ev);
    assert_true(r3.ended);
    json_t *a = sse_objects(r3.stream.p);
    json_t *last = json_array_get(a, json_array_size(a) - 1);
    assert_string_equal(json_string_value(json_object_get(json_object_get(last, "error"),
                                                          "message")), "worker0 died");
    assert_null(strstr(r3.stream.p, "[DONE]"));
    json_decref(a);
    rt__gen_buf_free(&r3.stream);
    json_decref(r3.body);

    /* the client leaves: the task is cancelled */
    rt_req_t r4 = {.app = &f->app};
    r4.body = J("{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"stream\":true}");
    rt__api_chat(&r4);
    g_cancels = 0;
    r4.gone(r4.gone_ud);
    assert_int_equal(g_cancels, 1);
    rt__gen_buf_free(&r4.stream);
    json_decref(r4.body);
}

static void test_anthropic_tool_use(void **state)
{
    fixture_t *f = *state;
    if (!f->tok) {
        print_message("skipped: the qwen3moe-tiny model is absent\n");
        skip();
    }
    /* a history with a call and its result becomes assistant tool_calls and a tool
     * message; the tools reach the template */
    json_t *msgs;
    bl_err_t err = {0};
    json_t *j = J("{\"messages\":[{\"role\":\"user\",\"content\":\"Weather?\"},"
                  "{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"Looking.\"},"
                  "{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"w\",\"input\":{\"city\":"
                  "\"Oslo\"}}]},{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\","
                  "\"tool_use_id\":\"toolu_1\",\"content\":[{\"type\":\"text\",\"text\":\"-3C\"}]}]}]}");
    assert_int_equal(rt__gen_anthropic_messages(j, &msgs, &err), 0);
    assert_int_equal(json_array_size(msgs), 3); /* the results-only user turn is the result */
    json_t *call = json_array_get(json_object_get(json_array_get(msgs, 1), "tool_calls"), 0);
    assert_string_equal(json_string_value(json_object_get(call, "id")), "toolu_1");
    json_t *tool = json_array_get(msgs, 2);
    assert_string_equal(json_string_value(json_object_get(tool, "role")), "tool");
    assert_string_equal(json_string_value(json_object_get(tool, "tool_call_id")), "toolu_1");
    assert_string_equal(json_string_value(json_object_get(tool, "content")), "-3C");
    json_decref(msgs);
    json_decref(j);
    json_t *kw;
    int tools, one;
    j = J("{\"tools\":[{\"name\":\"w\",\"description\":\"weather\",\"input_schema\":{\"type\":"
          "\"object\"}}],\"tool_choice\":{\"type\":\"auto\",\"disable_parallel_tool_use\":true},"
          "\"thinking\":{\"type\":\"disabled\"}}");
    assert_int_equal(anthropic_options(&f->app, j, &kw, &tools, &one, NULL, &err), 0);
    assert_int_equal(tools, 1);
    assert_int_equal(one, 1);
    json_t *fn = json_object_get(json_array_get(json_object_get(kw, "tools"), 0), "function");
    assert_string_equal(json_string_value(json_object_get(fn, "name")), "w");
    assert_non_null(json_object_get(fn, "parameters"));
    assert_true(json_is_false(json_object_get(kw, "enable_thinking")));
    json_decref(kw);
    json_decref(j);
    static const char *const bad[] = {
        "{\"tools\":[{\"type\":\"web_search_20250305\",\"name\":\"web_search\"}]}",
        "{\"tools\":[{\"name\":\"w\"}]}",
        "{\"tool_choice\":{\"type\":\"any\"}}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        j = J(bad[i]);
        assert_int_equal(anthropic_options(&f->app, j, &kw, &tools, &one, NULL, &err), BL_EINVAL);
        assert_null(kw);
        json_decref(j);
    }

    /* the reply's call as a tool_use block, not streamed and streamed */
    rt_req_t r = {.app = &f->app};
    r.body = J("{\"max_tokens\":32,\"messages\":[{\"role\":\"user\",\"content\":\"Oslo?\"}],"
               "\"tools\":[{\"name\":\"w\",\"input_schema\":{\"type\":\"object\"}}]}");
    rt__api_messages(&r);
    token_event(1, "\n<tool_call>\n{\"name\": \"w\", \"arguments\": {\"city\": \"Oslo\"}}\n"
                   "</tool_call>", 1);
    done_event(RT_STOP_EOS, NULL, 30, 1);
    assert_string_equal(json_string_value(json_object_get(r.reply, "stop_reason")), "tool_use");
    json_t *content = json_object_get(r.reply, "content");
    assert_int_equal(json_array_size(content), 1);
    json_t *tu = json_array_get(content, 0);
    assert_string_equal(json_string_value(json_object_get(tu, "type")), "tool_use");
    assert_int_equal(strncmp(json_string_value(json_object_get(tu, "id")), "toolu_", 6), 0);
    assert_string_equal(json_string_value(json_object_get(tu, "name")), "w");
    assert_string_equal(json_string_value(json_object_get(json_object_get(tu, "input"), "city")),
                        "Oslo");
    json_decref(r.reply);
    json_decref(r.body);

    rt_req_t s = {.app = &f->app};
    s.body = J("{\"max_tokens\":32,\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":"
               "\"Oslo?\"}],\"tools\":[{\"name\":\"w\",\"input_schema\":{\"type\":\"object\"}}]}");
    rt__api_messages(&s);
    token_event(1, "Checking. <tool_call>{\"name\": \"w\", \"arguments\": {\"city\": \"Oslo\"}}", 1);
    token_event(2, "</tool_call>", 2);
    done_event(RT_STOP_EOS, NULL, 30, 2);
    static const char *const want[] = {
        "message_start",       "content_block_start", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_stop",  "message_delta",
        "message_stop"};
    const char *p = s.stream.p;
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        p = strstr(p, "event: ");
        assert_non_null(p);
        p += 7;
        if (strncmp(p, want[i], strlen(want[i])) || p[strlen(want[i])] != '\n')
            fail_msg("event %zu: wanted %s in %s", i, want[i], s.stream.p);
    }
    assert_non_null(strstr(s.stream.p, "\"type\":\"tool_use\""));
    assert_non_null(strstr(s.stream.p, "\"partial_json\":\"{\\\"city\\\":\\\"Oslo\\\"}\""));
    assert_non_null(strstr(s.stream.p, "\"stop_reason\":\"tool_use\""));
    rt__gen_buf_free(&s.stream);
    json_decref(s.body);
}

static void test_anthropic_stream_reply(void **state)
{
    fixture_t *f = *state;
    if (!f->tok) {
        print_message("skipped: the qwen3moe-tiny model is absent\n");
        skip();
    }
    rt_req_t r = {.app = &f->app};
    r.body = J("{\"model\":\"x\",\"max_tokens\":8,\"stream\":true,\"system\":\"Be brief.\","
               "\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}");
    rt__api_messages(&r);
    token_event(1, "<think>hm</think>", 1);
    token_event(2, "Hello", 2);
    done_event(RT_STOP_LIMIT, NULL, 9, 2);
    assert_true(r.ended);
    /* event names in order */
    static const char *const want[] = {
        "message_start",      "content_block_start", "content_block_delta", "content_block_delta",
        "content_block_stop", "content_block_start", "content_block_delta", "content_block_stop",
        "message_delta",      "message_stop"};
    const char *p = r.stream.p;
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        p = strstr(p, "event: ");
        assert_non_null(p);
        p += 7;
        if (strncmp(p, want[i], strlen(want[i])) || p[strlen(want[i])] != '\n')
            fail_msg("event %zu: wanted %s in %s", i, want[i], r.stream.p);
    }
    assert_non_null(strstr(r.stream.p, "\"thinking_delta\""));
    assert_non_null(strstr(r.stream.p, "\"stop_reason\":\"max_tokens\""));
    rt__gen_buf_free(&r.stream);
    json_decref(r.body);

    /* not streamed, and an error in Anthropic's shape */
    rt_req_t r2 = {.app = &f->app};
    r2.body = J("{\"max_tokens\":8,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],"
                "\"stop_sequences\":[\"!\"]}");
    rt__api_messages(&r2);
    token_event(1, "Hi there", 1);
    done_event(RT_STOP_WORD, "!", 9, 1);
    assert_string_equal(json_string_value(json_object_get(r2.reply, "type")), "message");
    assert_string_equal(json_string_value(json_object_get(r2.reply, "stop_reason")),
                        "stop_sequence");
    assert_string_equal(json_string_value(json_object_get(r2.reply, "stop_sequence")), "!");
    json_t *b0 = json_array_get(json_object_get(r2.reply, "content"), 0);
    assert_string_equal(json_string_value(json_object_get(b0, "text")), "Hi there");
    assert_int_equal(strncmp(json_string_value(json_object_get(r2.reply, "id")), "msg_", 4), 0);
    json_decref(r2.reply);
    json_decref(r2.body);

    rt_req_t r3 = {.app = &f->app};
    r3.body = J("{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}");
    rt__api_messages(&r3);
    assert_int_equal(r3.status, 400);
    assert_string_equal(json_string_value(json_object_get(r3.reply, "type")), "error");
    assert_string_equal(json_string_value(json_object_get(json_object_get(r3.reply, "error"),
                                                          "type")), "invalid_request_error");
    json_decref(r3.reply);
    json_decref(r3.body);
}

static void test_native_completion_reply(void **state)
{
    fixture_t *f = *state;
    if (!f->tok) {
        print_message("skipped: the qwen3moe-tiny model is absent\n");
        skip();
    }
    rt_req_t r = {.app = &f->app};
    r.body = J("{\"prompt\":[1,2,3],\"n_predict\":2,\"n_probs\":1,\"return_tokens\":true}");
    route_completion(&r);
    token_event(7, "A", 1);
    token_event(8, "B", 2);
    done_event(RT_STOP_LIMIT, NULL, 3, 2);
    assert_string_equal(json_string_value(json_object_get(r.reply, "content")), "AB");
    assert_string_equal(json_string_value(json_object_get(r.reply, "stop_type")), "limit");
    assert_int_equal(json_array_size(json_object_get(r.reply, "tokens")), 2);
    assert_int_equal(json_array_size(json_object_get(r.reply, "completion_probabilities")), 2);
    assert_int_equal(json_integer_value(json_object_get(r.reply, "tokens_evaluated")), 3);
    assert_true(json_is_false(json_object_get(r.reply, "truncated")));
    assert_non_null(json_object_get(json_object_get(r.reply, "generation_settings"), "n_predict"));
    json_decref(r.reply);
    json_decref(r.body);
}

/* Whether the reply text fits the grammar p holds. */
static int fits(const rt_gen_params_t *p, const char *text)
{
    rt_grammar_t *g = NULL;
    rt_grammar_match_t *m = NULL;
    bl_err_t err = {0};
    if (rt_grammar_parse(&g, p->task.sampling.grammar, p->task.sampling.grammar_len, &err))
        fail_msg("the forced grammar does not compile: %s\n%s", err.msg, p->task.sampling.grammar);
    assert_int_equal(rt_grammar_match_create(&m, g, &err), 0);
    int ok = rt_grammar_match_feed(m, text, strlen(text)) == 0 && rt_grammar_match_done(m);
    rt_grammar_match_destroy(m);
    rt_grammar_destroy(g);
    return ok;
}

static void test_grammar_wrap_puts_a_thought_first(void **state)
{
    (void)state;
    rt_gen_params_t p;
    bl_err_t err = {0};
    memset(&p, 0, sizeof p);
    const char *inner = "root ::= \"{\" item* \"}\"\nitem ::= [a-z]\n";
    assert_int_equal(rt__gen_grammar_wrap(inner, 1, RT_CHATFMT_HERMES, "%W %R", &p.grammar, &err), 0);
    p.task.sampling.grammar = p.grammar;
    p.task.sampling.grammar_len = strlen(p.grammar);
    assert_true(fits(&p, "{ab}"));
    assert_true(fits(&p, "<think>\nhmm {no}</think>\n\n{ab}"));
    assert_false(fits(&p, "sure: {ab}"));
    assert_false(fits(&p, "<think>x</think>"));
    /* the thought ends at its first end tag: what follows is held to the grammar */
    assert_false(fits(&p, "<think>\n\n</think>\n\nThe only thing</think>{ab}"));
    assert_false(fits(&p, "<think>a</think> b {ab}"));
    assert_true(fits(&p, "<think>a <b </thin </</think>{ab}"));
    assert_true(fits(&p, "<think><<</think>{a}"));
    rt__gen_params_fini(&p);
    memset(&p, 0, sizeof p);
    assert_int_equal(rt__gen_grammar_wrap(inner, 2, RT_CHATFMT_HERMES, "%R", &p.grammar, &err), 0);
    p.task.sampling.grammar = p.grammar;
    p.task.sampling.grammar_len = strlen(p.grammar);
    assert_true(fits(&p, "</think>{}"));
    assert_false(fits(&p, "{}"));
    assert_false(fits(&p, "</think>x</think>{}"));
    rt__gen_params_fini(&p);
    /* a grammar that refers to its own root (a schema's $ref "#") keeps its meaning;
     * a "root" inside a literal, a class or a comment is not a reference */
    memset(&p, 0, sizeof p);
    assert_int_equal(rt__gen_grammar_wrap("root ::= \"[\" root? \"]\" | \"root\" # root\n", 1, RT_CHATFMT_HERMES, "%R",
                                          &p.grammar, &err), 0);
    p.task.sampling.grammar = p.grammar;
    p.task.sampling.grammar_len = strlen(p.grammar);
    assert_true(fits(&p, "<think>x</think>[[]]"));
    assert_true(fits(&p, "[[root]]"));
    assert_false(fits(&p, "[[]"));
    assert_false(fits(&p, "<think>x</think>[[]]<think>"));
    rt__gen_params_fini(&p);
}

static void test_tool_choice_required_forces_calls(void **state)
{
    (void)state;
    json_t *tools = J("[{\"type\":\"function\",\"function\":{\"name\":\"weather\",\"parameters\":"
                      "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},"
                      "\"required\":[\"city\"]}}},{\"type\":\"function\",\"function\":{\"name\":\"time\"}}]");
    rt_gen_params_t p;
    bl_err_t err = {0};
    memset(&p, 0, sizeof p);
    assert_int_equal(rt__gen_force_tools(&p, tools, NULL, 0, 1, &err), 0);
    static const char call_w[] = "<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
    static const char call_t[] = "<tool_call>{\"name\":\"time\",\"arguments\":{}}</tool_call>";
    assert_true(fits(&p, call_w));
    assert_true(fits(&p, call_t));
    char two[512];
    snprintf(two, sizeof two, "<think>\nWhich one? </think>\n\n%s\n%s", call_w, call_t);
    assert_true(fits(&p, two));
    assert_false(fits(&p, "Sure, the weather is fine."));
    assert_false(fits(&p, "<tool_call>{\"name\":\"weather\",\"arguments\":{}}</tool_call>")); /* city */
    assert_false(fits(&p, "<tool_call>{\"name\":\"rain\",\"arguments\":{}}</tool_call>"));
    rt__gen_params_fini(&p);

    /* one call of the named function; a prompt that opened the thought ends it first */
    memset(&p, 0, sizeof p);
    assert_int_equal(rt__gen_force_tools(&p, tools, "time", 1, 2, &err), 0);
    assert_true(fits(&p, "ok</think><tool_call>{\"name\":\"time\",\"arguments\":{}}</tool_call>"));
    assert_false(fits(&p, call_t)); /* the thought must end */
    assert_false(fits(&p, "</think>"));
    char twice[256];
    snprintf(twice, sizeof twice, "</think>%s%s", call_t, call_t);
    assert_false(fits(&p, twice));
    assert_false(fits(&p, "</think><tool_call>{\"name\":\"weather\",\"arguments\":{\"city\":\"x\"}}</tool_call>"));
    rt__gen_params_fini(&p);

    /* refusals: an unknown name, a grammar already asked for, a schema refused */
    memset(&p, 0, sizeof p);
    assert_int_equal(rt__gen_force_tools(&p, tools, "rain", 0, 0, &err), BL_EINVAL);
    /* thinking off: no thought at all */
    assert_int_equal(rt__gen_force_tools(&p, tools, NULL, 0, 0, &err), 0);
    assert_true(fits(&p, call_t));
    assert_false(fits(&p, "<think></think>\n<tool_call>{\"name\":\"time\",\"arguments\":{}}</tool_call>"));
    rt__gen_params_fini(&p);
    memset(&p, 0, sizeof p);
    assert_non_null(strstr(err.msg, "rain"));
    p.task.sampling.grammar = "root ::= \"a\"";
    assert_int_equal(rt__gen_force_tools(&p, tools, NULL, 0, 0, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "together"));
    memset(&p, 0, sizeof p);
    json_t *bad = J("[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":"
                    "{\"type\":\"string\",\"pattern\":\"(?=x)\"}}}]");
    assert_int_equal(rt__gen_force_tools(&p, bad, NULL, 0, 0, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "pattern"));
    json_decref(bad);
    json_decref(tools);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chat_object_args),
        cmocka_unit_test(test_params_defaults_are_llama_servers),
        cmocka_unit_test(test_params_sampling_fields),
        cmocka_unit_test(test_params_token_limits),
        cmocka_unit_test(test_params_speculative_limits),
        cmocka_unit_test(test_params_wrong_types_name_the_field),
        cmocka_unit_test(test_params_stop),
        cmocka_unit_test(test_params_logit_bias),
        cmocka_unit_test(test_params_refusals),
        cmocka_unit_test(test_params_probabilities),
        cmocka_unit_test(test_params_anthropic),
        cmocka_unit_test(test_prompt_forms),
        cmocka_unit_test(test_chat_messages),
        cmocka_unit_test(test_chat_options),
        cmocka_unit_test(test_anthropic_messages),
        cmocka_unit_test(test_think_split_every_piece_size),
        cmocka_unit_test(test_think_streams_before_the_end),
        cmocka_unit_test(test_tool_calls_split_every_piece_size),
        cmocka_unit_test(test_tool_calls_hold_only_what_may_be_a_tag),
        cmocka_unit_test(test_tools_in_requests),
        cmocka_unit_test(test_json_piece_utf8),
        cmocka_unit_test(test_sse_format),
        cmocka_unit_test(test_timings_and_usage),
        cmocka_unit_test(test_legacy_logprobs),
        cmocka_unit_test(test_grammar_wrap_puts_a_thought_first),
        cmocka_unit_test(test_tool_choice_required_forces_calls),
        cmocka_unit_test_setup_teardown(test_chat_stream_reply, setup_model, teardown_model),
        cmocka_unit_test_setup_teardown(test_chat_reply_not_streamed, setup_model, teardown_model),
        cmocka_unit_test_setup_teardown(test_chat_tool_call_reply, setup_model, teardown_model),
        cmocka_unit_test_setup_teardown(test_chat_errors_before_and_after_start, setup_model,
                                        teardown_model),
        cmocka_unit_test_setup_teardown(test_anthropic_stream_reply, setup_model, teardown_model),
        cmocka_unit_test_setup_teardown(test_anthropic_tool_use, setup_model, teardown_model),
        cmocka_unit_test_setup_teardown(test_responses_api, setup_model, teardown_model),
        cmocka_unit_test_setup_teardown(test_chat_tool_call_arguments_stream, setup_model, teardown_model),
        cmocka_unit_test_setup_teardown(test_native_completion_reply, setup_model, teardown_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
