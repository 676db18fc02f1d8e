/* llama-server's routes that describe the server rather than generate: /health,
 * /v1/models and /models, /props, /slots, /metrics (Prometheus text with
 * llama-server's metric names), /tokenize and /detokenize. Shapes follow
 * llama-server's answers so that its clients and dashboards work unchanged.
 *
 * Thread: the loop thread (the engine's snapshots are thread-safe). */
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "api.h"
#include "api_gen_impl.h"
#include "bl_config.h"
#include "file.h"
#include "log.h"

#define MAX_SLOTS_REPORTED 1024

static rt_app_t *app_of(rt_req_t *r)
{
    return (rt_app_t *)rt_req_app(r);
}

/* llama-server answers everything but /health and the model list with 503 while
 * the model loads. Returns 1 when it answered. */
static int refuse_while_loading(rt_req_t *r)
{
    if (!app_of(r)->loading)
        return 0;
    rt_req_send_error(r, 503, "unavailable_error", "Loading model");
    return 1;
}

/* A string of the GGUF metadata, NUL-terminated into buf ("" when absent). */
static const char *gguf_str(const bl_gguf_t *g, const char *key, char *buf, size_t cap)
{
    bl_gguf_str_t s;
    buf[0] = 0;
    if (g && bl_gguf_get_str(g, key, &s, NULL) == 0)
        snprintf(buf, cap, "%.*s", (int)(s.len > cap ? cap : s.len), s.ptr);
    return buf;
}

static int64_t model_n_embd(const rt_app_t *app)
{
    int64_t v = 0;
    if (!app->gguf || bl_gguf_get_arch_i64(app->gguf, "embedding_length", &v, NULL) != 0)
        v = app->cluster ? rt_cluster_n_embd(app->cluster) : 0;
    return v;
}

/* llama.cpp's vocab type: 1 SentencePiece, 2 byte-level BPE. */
static int model_vocab_type(const rt_app_t *app)
{
    char model[32];
    gguf_str(app->gguf, "tokenizer.ggml.model", model, sizeof model);
    if (!strcmp(model, "llama"))
        return 1;
    if (!strcmp(model, "gpt2"))
        return 2;
    return 0;
}

/* A token's text for /props (bos_token, eos_token): the piece with control tokens
 * spelled out, as llama-server renders them. */
static json_t *token_text(const rt_app_t *app, int32_t id)
{
    if (id < 0 || !app->tok)
        return json_string("");
    rt_str_t p = rt_tokenizer_piece(app->tok, id);
    /* a piece that is only part of a UTF-8 sequence cannot be a JSON string */
    json_t *s = p.ptr ? json_stringn(p.ptr, p.len) : NULL;
    return s ? s : json_string("");
}

/* llama-server's slot_params JSON, with this server's defaults and limits. Samplers
 * it does not have (dry, xtc, mirostat, top_n_sigma) show their "off" values. */
static json_t *params_json(const rt_app_t *app)
{
    const rt_task_params_t p = app->defaults;
    const rt_sampler_params_t *s = &p.sampling;
    json_t *samplers = rt_api_samplers_json(s);
    int64_t n_predict = app->n_predict_default >= 0 ? app->n_predict_default : p.n_predict;
    json_t *j = json_pack(
        "{s:I,s:I,s:f,s:f,s:f,s:i,s:f,s:f,s:f,s:f,s:f,s:f,s:i,s:f,s:f,s:f,s:f,s:f,s:i,s:i,"
        "s:[],s:i,s:f,s:f,s:[],s:I,s:i,s:i,s:b,s:b,s:[],s:i,s:i,s:s,"
        "s:o,s:b,s:b}",
        "n_predict", (json_int_t)n_predict,
        "seed", (json_int_t)s->seed,
        "temperature", (double)s->temp,
        "dynatemp_range", 0.0,
        "dynatemp_exponent", 1.0,
        "top_k", (int)s->top_k,
        "top_p", (double)s->top_p,
        "min_p", (double)s->min_p,
        "top_n_sigma", -1.0,
        "xtc_probability", 0.0,
        "xtc_threshold", 0.1,
        "typical_p", (double)s->typical_p,
        "repeat_last_n", (int)s->penalty_last_n,
        "repeat_penalty", (double)s->repeat_penalty,
        "presence_penalty", (double)s->presence_penalty,
        "frequency_penalty", (double)s->frequency_penalty,
        "dry_multiplier", 0.0,
        "dry_base", 1.75,
        "dry_allowed_length", 2,
        "dry_penalty_last_n", -1,
        "dry_sequence_breakers",
        "mirostat", 0,
        "mirostat_tau", 5.0,
        "mirostat_eta", 0.1,
        "stop",
        "max_tokens", (json_int_t)n_predict,
        "n_keep", 0,
        "n_discard", 0,
        "ignore_eos", p.ignore_eos,
        "stream", 0,
        "logit_bias",
        "n_probs", p.n_probs,
        "min_keep", (int)s->min_keep,
        "grammar", "",
        "samplers", samplers ? samplers : json_array(),
        "timings_per_token", 0,
        "post_sampling_probs", 0);
    if (j && app->engine)
        rt_api_spec_limits_json(j, rt_engine_spec_limits(app->engine, &p));
    return j;
}

/* --- /health ----------------------------------------------------------------------- */

int rt_app_down(const rt_app_t *app, char *why, size_t cap)
{
    return app->cluster && rt_cluster_down(app->cluster, why, cap);
}

static void route_health(rt_req_t *r)
{
    if (refuse_while_loading(r))
        return;
    char down[1024];
    if (rt_app_down(app_of(r), down, sizeof down)) {
        rt_req_send_error(r, 503, "unavailable_error", "%s", down);
        return;
    }
    rt_req_send_json(r, 200, json_pack("{s:s}", "status", "ok"));
}

/* --- /v1/models, /models ------------------------------------------------------------- */

static void route_models(rt_req_t *r)
{
    rt_app_t *app = app_of(r);
    const char *alias = app->model_alias ? app->model_alias : "";
    json_t *meta = json_pack("{s:i,s:I,s:I,s:I,s:I,s:I}", "vocab_type", model_vocab_type(app),
                             "n_vocab", (json_int_t)app->n_vocab, "n_ctx_train",
                             (json_int_t)app->n_ctx_train, "n_embd", (json_int_t)model_n_embd(app),
                             "n_params", (json_int_t)app->n_params, "size",
                             (json_int_t)app->model_bytes);
    json_t *aliases = json_array(), *tags = json_array();
    for (size_t i = 0; aliases && i < app->n_aliases; i++)
        json_array_append_new(aliases, json_string(app->aliases[i]));
    if (aliases && !app->n_aliases)
        json_array_append_new(aliases, json_string(alias));
    for (size_t i = 0; tags && i < app->n_tags; i++)
        json_array_append_new(tags, json_string(app->tags[i]));
    json_t *data = json_pack("[{s:s,s:o,s:o,s:s,s:I,s:s,s:o}]", "id", alias, "aliases", aliases, "tags", tags,
                             "object", "model", "created", (json_int_t)app->started, "owned_by", "llamacpp",
                             "meta", meta);
    /* the Ollama-style list llama-server gives beside the OpenAI one */
    json_t *models = json_pack(
        "[{s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:[s],s:[s],s:s,s:{s:s,s:s,s:s,s:[s],s:s,s:s}}]", "name",
        alias, "model", alias, "modified_at", "", "size", "", "digest", "", "type", "model",
        "description", "", "tags", "", "capabilities", "completion", "parameters", "", "details",
        "parent_model", "", "format", "gguf", "family", "", "families", "", "parameter_size", "",
        "quantization_level", "");
    json_t *j = json_pack("{s:o,s:s,s:o}", "models", models, "object", "list", "data", data);
    rt_req_send_json(r, 200, j);
}

/* --- /props ------------------------------------------------------------------------ */

static void route_props(rt_req_t *r)
{
    if (refuse_while_loading(r))
        return;
    rt_app_t *app = app_of(r);
    json_t *dgs = json_pack("{s:i,s:i,s:I,s:b,s:b,s:o,s:s}", "id", 0, "id_task", -1, "n_ctx",
                            (json_int_t)app->n_ctx_slot, "speculative", app->speculative, "is_processing", 0,
                            "params", params_json(app), "prompt", "");
    json_t *j = json_pack(
        "{s:o,s:i,s:s,s:s,s:{s:b,s:b},s:b,s:b,s:b,s:b,s:s,s:o,s:o,s:s}",
        "default_generation_settings", dgs,
        "total_slots", app->n_slots,
        "model_alias", app->model_alias ? app->model_alias : "",
        "model_path", app->model_path ? app->model_path : "",
        "modalities", "vision", 0, "audio", 0,
        "endpoint_slots", !app->no_slots,
        "endpoint_props", 0,
        "endpoint_metrics", 1,
        "webui", !app->no_webui,
        "chat_template", app->tpl_source ? app->tpl_source : "",
        "bos_token", token_text(app, app->tok ? rt_tokenizer_bos(app->tok) : -1),
        "eos_token", token_text(app, app->tok ? rt_tokenizer_eos(app->tok) : -1),
        "build_info", "bloomery-" BL_VERSION);
    if (app->placement)
        json_object_set(j, "placement", app->placement);
    /* llama-server's --sleep-idle-seconds: true while the model is unloaded */
    json_object_set_new(j, "is_sleeping",
                        json_boolean(app->cluster && rt_cluster_state(app->cluster) == RT_CLUSTER_SLEEPING));
    rt_req_send_json(r, 200, j);
}

/* --- /slots ------------------------------------------------------------------------ */

static void route_slots(rt_req_t *r)
{
    rt_app_t *app = app_of(r);
    if (app->no_slots) { /* llama-server's answer without --slots */
        rt_req_send_error(r, 501, NULL, "This server does not support slots endpoint. Start it "
                                        "without --no-slots");
        return;
    }
    if (refuse_while_loading(r))
        return;
    int cap = app->n_slots > 0 && app->n_slots < MAX_SLOTS_REPORTED ? app->n_slots
                                                                    : MAX_SLOTS_REPORTED;
    rt_slot_info_t *slots = calloc((size_t)cap, sizeof *slots);
    if (!slots) {
        rt_req_send_error(r, 500, NULL, "out of memory");
        return;
    }
    int n = app->engine ? rt_engine_slots(app->engine, slots, cap) : 0;
    if (n > cap)
        n = cap;
    size_t ql;
    const char *q = rt_req_query(r, "fail_on_no_slot", &ql);
    if (q && ql) { /* llama-server: 503 when every slot is busy */
        int idle = 0;
        for (int i = 0; i < n; i++)
            idle += !slots[i].busy;
        if (!idle) {
            free(slots);
            rt_req_send_error(r, 503, NULL, "no slot available");
            return;
        }
    }
    json_t *arr = json_array();
    for (int i = 0; arr && i < n; i++) {
        const rt_slot_info_t *s = &slots[i];
        json_t *o = json_pack(
            "{s:i,s:I,s:I,s:b,s:b,s:o,s:s,s:{s:b,s:b,s:I,s:I,s:s}}", "id", s->id, "id_task",
            s->busy ? (json_int_t)s->task_id : (json_int_t)-1, "n_ctx", (json_int_t)s->n_ctx,
            "speculative", app->speculative, "is_processing", s->busy, "params", params_json(app), "prompt", "",
            "next_token", "has_next_token", s->busy, "has_new_line", 0, "n_remain",
            (json_int_t)-1, "n_decoded", (json_int_t)s->n_decoded, "stopping_word", "");
        if (!o || json_array_append_new(arr, o) != 0) {
            json_decref(arr);
            arr = NULL;
        }
    }
    free(slots);
    rt_req_send_json(r, 200, arr);
}

/* --- /metrics ---------------------------------------------------------------------- */

typedef struct textbuf {
    char *p;
    size_t len, cap;
    int oom;
} textbuf_t;

static void tb_printf(textbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void tb_printf(textbuf_t *b, const char *fmt, ...)
{
    if (b->oom)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if (b->p && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->len + (size_t)n + 1)
            cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
}

/* One sample with its HELP and TYPE lines; prefix "llamacpp" for llama-server's
 * names, "bloomery" for this server's own. */
static void metric_of(textbuf_t *b, const char *prefix, const char *name, const char *type,
                      const char *help, double v)
{
    tb_printf(b, "# HELP %s:%s %s\n# TYPE %s:%s %s\n%s:%s %.15g\n", prefix, name, help, prefix, name, type,
              prefix, name, v);
}

static void metric(textbuf_t *b, const char *name, const char *type, const char *help, double v)
{
    metric_of(b, "llamacpp", name, type, help, v);
}

/* A child's counter named <base>_l<digits> is layer <digits> of <base>: the length of
 * <base>, or 0 for a counter without a layer. */
static size_t layer_split(const char *name)
{
    const char *u = strrchr(name, '_');
    if (!u || u == name || u[1] != 'l' || !u[2])
        return 0;
    for (const char *d = u + 2; *d; d++)
        if (*d < '0' || *d > '9')
            return 0;
    return (size_t)(u - name);
}

static int is_base(const char *name, size_t k, const char *base)
{
    return k == strlen(base) && memcmp(name, base, k) == 0;
}

/* Per-layer families beyond this many distinct bases are left out (workers send two). */
#define MAX_LAYER_FAMILIES 16

/* The help of a per-layer family, by base. */
static const char *layer_help(const char *base)
{
    if (!strcmp(base, "expert_selections"))
        return "Routed expert selections counted in a host-RAM layer of a card's stage since load.";
    if (!strcmp(base, "expert_card_hits"))
        return "Of those selections, the ones a resident card slot served.";
    return "A child process's counter, per layer.";
}

/* The children's own counters: a plain one as bloomery:child_<name>{process="worker0"};
 * the layers of <base>_l<digits> as one metric bloomery:child_<base>{process,layer},
 * every child's samples together under one HELP and TYPE (Prometheus wants a metric's
 * samples in one group); and per layer with selections the share of them a card slot
 * served, bloomery:expert_card_hit_ratio{process,layer}. Names are [a-z0-9_], checked
 * by the cluster. */
static void child_metrics(textbuf_t *b, const rt_child_stats_t *kids, int n)
{
    char bases[MAX_LAYER_FAMILIES][sizeof kids[0].c[0].name];
    int n_bases = 0;
    for (int i = 0; i < n; i++) {
        tb_printf(b, "bloomery:child_uptime_seconds{process=\"%s\"} %.3f\n", kids[i].process,
                  (double)kids[i].uptime_us / 1e6);
        for (int j = 0; j < kids[i].n; j++) {
            const char *name = kids[i].c[j].name;
            const size_t k = layer_split(name);
            if (!k) {
                tb_printf(b, "bloomery:child_%s{process=\"%s\"} %llu\n", name, kids[i].process,
                          (unsigned long long)kids[i].c[j].value);
                continue;
            }
            int f = 0;
            while (f < n_bases && !is_base(name, k, bases[f]))
                f++;
            if (f == n_bases && n_bases < MAX_LAYER_FAMILIES)
                snprintf(bases[n_bases++], sizeof bases[0], "%.*s", (int)k, name);
        }
    }
    for (int f = 0; f < n_bases; f++) {
        tb_printf(b, "# HELP bloomery:child_%s %s\n# TYPE bloomery:child_%s counter\n", bases[f],
                  layer_help(bases[f]), bases[f]);
        for (int i = 0; i < n; i++)
            for (int j = 0; j < kids[i].n; j++) {
                const char *name = kids[i].c[j].name;
                const size_t k = layer_split(name);
                if (k && is_base(name, k, bases[f]))
                    tb_printf(b, "bloomery:child_%s{process=\"%s\",layer=\"%s\"} %llu\n", bases[f],
                              kids[i].process, name + k + 2, (unsigned long long)kids[i].c[j].value);
            }
    }
    int headed = 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < kids[i].n; j++) {
            const char *sel = kids[i].c[j].name;
            const size_t k = layer_split(sel);
            if (!k || !is_base(sel, k, "expert_selections") || kids[i].c[j].value == 0)
                continue;
            /* its hits: the next counter as workers send them, else wherever it is */
            const char *layer = sel + k + 2;
            int h = -1;
            for (int t = 0; t < kids[i].n && h < 0; t++) {
                const int at = (j + 1 + t) % kids[i].n;
                const char *hit = kids[i].c[at].name;
                const size_t kh = layer_split(hit);
                if (kh && is_base(hit, kh, "expert_card_hits") && !strcmp(hit + kh + 2, layer))
                    h = at;
            }
            if (h < 0)
                continue;
            if (!headed) {
                tb_printf(b, "# HELP bloomery:expert_card_hit_ratio Share of a host-RAM layer's routed expert "
                             "selections that a resident card slot served.\n"
                             "# TYPE bloomery:expert_card_hit_ratio gauge\n");
                headed = 1;
            }
            tb_printf(b, "bloomery:expert_card_hit_ratio{process=\"%s\",layer=\"%s\"} %.6g\n", kids[i].process,
                      layer, (double)kids[i].c[h].value / (double)kids[i].c[j].value);
        }
}

/* The workers and the hosttier. */
#define MAX_CHILDREN (RT_CLUSTER_MAX_STAGES + 1)

/* The engine's processes: starts, deaths, and each child's own counters
 * (child_metrics). */
static void cluster_metrics(textbuf_t *b, rt_cluster_t *cluster)
{
    rt_cluster_stats_t cs;
    rt_cluster_get_stats(cluster, &cs);
    tb_printf(b, "# HELP bloomery:process_starts_total Times the worker and hosttier processes were started.\n"
                 "# TYPE bloomery:process_starts_total counter\nbloomery:process_starts_total %llu\n",
              (unsigned long long)cs.starts);
    tb_printf(b, "# HELP bloomery:child_deaths_total Worker or hosttier processes that died.\n"
                 "# TYPE bloomery:child_deaths_total counter\nbloomery:child_deaths_total %llu\n",
              (unsigned long long)cs.child_deaths);
    rt_child_stats_t *kids = malloc(sizeof *kids * MAX_CHILDREN); /* 10 KiB each: too much for the stack */
    if (!kids) {
        b->oom = 1;
        return;
    }
    const int n = rt_cluster_child_stats(cluster, kids, MAX_CHILDREN);
    child_metrics(b, kids, n);
    free(kids);
}

static void route_metrics(rt_req_t *r)
{
    if (refuse_while_loading(r))
        return;
    rt_app_t *app = app_of(r);
    rt_engine_stats_t st;
    memset(&st, 0, sizeof st);
    if (app->engine)
        rt_engine_get_stats(app->engine, &st);
    double busy_per_decode =
        st.n_decode_total ? (double)st.n_busy_slots_total / (double)st.n_decode_total : 0.0;
    double prompt_tps =
        st.prompt_seconds_total > 0 ? (double)st.prompt_tokens_total / st.prompt_seconds_total : 0.0;
    double predicted_tps = st.tokens_predicted_seconds_total > 0
                               ? (double)st.tokens_predicted_total / st.tokens_predicted_seconds_total
                               : 0.0;
    textbuf_t b = {0};
    metric(&b, "prompt_tokens_total", "counter", "Number of prompt tokens processed.",
           (double)st.prompt_tokens_total);
    metric(&b, "prompt_seconds_total", "counter", "Prompt process time",
           st.prompt_seconds_total);
    metric(&b, "tokens_predicted_total", "counter", "Number of generation tokens processed.",
           (double)st.tokens_predicted_total);
    metric(&b, "tokens_predicted_seconds_total", "counter", "Predict process time",
           st.tokens_predicted_seconds_total);
    metric(&b, "n_decode_total", "counter", "Total number of llama_decode() calls",
           (double)st.n_decode_total);
    metric(&b, "n_busy_slots_per_decode", "counter",
           "Average number of busy slots per llama_decode() call", busy_per_decode);
    metric(&b, "prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s.",
           prompt_tps);
    metric(&b, "predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s.",
           predicted_tps);
    metric(&b, "requests_processing", "gauge", "Number of requests processing.",
           (double)st.requests_processing);
    metric(&b, "requests_deferred", "gauge", "Number of requests deferred.",
           (double)st.requests_deferred);
    metric(&b, "n_tokens_max", "counter", "Largest observed n_tokens.", (double)st.n_tokens_max);
    /* this server's own: the prompt cache in host RAM (-cram) */
    metric_of(&b, "bloomery", "prompt_cache_saves_total", "counter", "Slot cache states saved to host RAM.",
           (double)st.prompt_cache_saves_total);
    metric_of(&b, "bloomery", "prompt_cache_hits_total", "counter", "Prompts started from a saved state.",
           (double)st.prompt_cache_hits_total);
    metric_of(&b, "bloomery", "prompt_cache_tokens_total", "counter", "Positions restored from saved states.",
           (double)st.prompt_cache_tokens_total);
    metric_of(&b, "bloomery", "prompt_cache_evictions_total", "counter", "Saved states dropped for the budget.",
           (double)st.prompt_cache_evictions_total);
    metric_of(&b, "bloomery", "checkpoints_total", "counter",
              "Checkpoints of a recurrent model's slots saved (-ctxcp).", (double)st.checkpoints_total);
    metric_of(&b, "bloomery", "checkpoint_restores_total", "counter",
              "Prompts that started from a slot's checkpoint.", (double)st.checkpoint_restores_total);
    metric_of(&b, "bloomery", "kv_evictions_total", "counter",
              "Idle slots' caches emptied for room in the shared KV cache (-kvu).",
              (double)st.kv_evictions_total);
    metric_of(&b, "bloomery", "prompt_cache_disk_saves_total", "counter",
              "Prompt cache entries written to the --cache-disk folder.", (double)st.disk_saves_total);
    metric_of(&b, "bloomery", "prompt_cache_disk_hits_total", "counter",
              "Prompts that started from an entry on disk.", (double)st.disk_hits_total);
    metric_of(&b, "bloomery", "prompt_cache_disk_tokens_total", "counter",
              "Prompt tokens read from entries on disk.", (double)st.disk_tokens_total);
    metric_of(&b, "bloomery", "prompt_cache_disk_evictions_total", "counter",
              "Entries on disk removed for the --cache-disk-size budget or superseded.",
              (double)st.disk_evictions_total);
    metric_of(&b, "bloomery", "prompt_cache_disk_refused_total", "counter",
              "Entries on disk found damaged, cut short, missing a part or of no use, removed.",
              (double)st.disk_refused_total);
    metric_of(&b, "bloomery", "prompt_cache_disk_entries", "gauge", "Entries on disk.",
              (double)st.disk_entries);
    metric_of(&b, "bloomery", "prompt_cache_disk_bytes", "gauge", "Bytes of the entries on disk.",
              (double)st.disk_bytes);
    metric_of(&b, "bloomery", "draft_steps_total", "counter",
              "Steps that verified proposals (a draft model, the NextN layer or n-grams).", (double)st.draft_steps_total);
    metric_of(&b, "bloomery", "draft_tokens_total", "counter",
              "Tokens proposed for verification.", (double)st.drafted_total);
    metric_of(&b, "bloomery", "draft_accepted_total", "counter",
              "Proposed tokens the model took.", (double)st.accepted_total);
    metric_of(&b, "bloomery", "kv_preemptions_total", "counter",
              "Tasks whose cache gave way in the full shared KV cache, recomputed later (-kvu).",
              (double)st.kv_preemptions_total);
    metric_of(&b, "bloomery", "step_wait_seconds_total", "counter",
              "Time the engine waited for its steps' answers from the model processes.",
              st.step_wait_seconds_total);
    metric_of(&b, "bloomery", "step_output_seconds_total", "counter",
              "Time the engine took the answers: sampling, text and events.", st.step_output_seconds_total);
    metric_of(&b, "bloomery", "prompt_cache_entries", "gauge", "Saved states held.", (double)st.prompt_cache_entries);
    metric_of(&b, "bloomery", "prompt_cache_bytes", "gauge", "Host bytes the saved states take.",
           (double)st.prompt_cache_bytes);
    if (app->cluster)
        cluster_metrics(&b, app->cluster);
    if (b.oom) {
        free(b.p);
        rt_req_send_error(r, 500, NULL, "out of memory");
        return;
    }
    rt_req_send_text(r, 200, "text/plain; version=0.0.4", b.p, b.len);
    free(b.p);
}

/* --- /tokenize, /detokenize -------------------------------------------------------- */

/* Reads an optional boolean member; answers r and returns -1 on a wrong type. */
static int opt_bool(rt_req_t *r, const json_t *body, const char *name, int *out)
{
    json_t *v = json_object_get(body, name);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_boolean(v)) {
        rt_req_send_error(r, 400, NULL, "'%s' must be a boolean", name);
        return -1;
    }
    *out = json_is_true(v);
    return 0;
}

/* A piece as llama-server reports it: the text when it is valid UTF-8 on its own,
 * else the list of its bytes. */
static json_t *piece_json(const rt_tokenizer_t *tok, int32_t id)
{
    rt_str_t p = rt_tokenizer_piece(tok, id);
    json_t *s = json_stringn(p.ptr ? p.ptr : "", p.len);
    if (s)
        return s;
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < p.len; i++)
        json_array_append_new(arr, json_integer((unsigned char)p.ptr[i]));
    return arr;
}

static void tokenize_work(rt_gen_req_t *g, rt_app_t *app)
{
    rt_gen_prep_t *p = &g->prep;
    json_t *content = json_object_get(rt_req_json(g->r), "content");
    bl_err_t err = {0};
    if (json_is_string(content) &&
        (p->rc = rt_tokenize(app->tok, json_string_value(content), json_string_length(content),
                             p->tok_flags, &p->toks, &err)))
        bl_err_set(&p->err, p->rc, "tokenize: %s", err.msg);
}

static void tokenize_next(rt_gen_req_t *g)
{
    rt_app_t *app = g->app;
    if (g->prep.rc) {
        rt__gen_send_prep_error(g);
        rt__gen_req_free(g);
        return;
    }
    const rt_tokens_t *toks = &g->prep.toks;
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < toks->n; i++) {
        json_t *e = g->prep.with_pieces
                        ? json_pack("{s:i,s:o}", "id", (int)toks->ids[i], "piece",
                                    piece_json(app->tok, toks->ids[i]))
                        : json_integer(toks->ids[i]);
        if (!e || json_array_append_new(arr, e) != 0) {
            json_decref(arr);
            arr = NULL;
        }
    }
    rt_req_send_json(g->r, 200, arr ? json_pack("{s:o}", "tokens", arr) : NULL);
    rt__gen_req_free(g);
}

static void route_tokenize(rt_req_t *r)
{
    if (refuse_while_loading(r))
        return;
    json_t *body = rt_req_json(r);
    json_t *content = json_object_get(body, "content");
    int add_special = 0, parse_special = 1, with_pieces = 0;
    if (opt_bool(r, body, "add_special", &add_special) || opt_bool(r, body, "parse_special", &parse_special) ||
        opt_bool(r, body, "with_pieces", &with_pieces))
        return;
    if (content && !json_is_null(content) && !json_is_string(content)) {
        rt_req_send_error(r, 400, NULL, "'content' must be a string");
        return;
    }
    rt_gen_req_t *g = rt__gen_req_new(r, app_of(r), RT_GEN_API_NATIVE, NULL, "");
    if (!g) {
        rt_req_send_error(r, 500, NULL, "out of memory");
        return;
    }
    g->prep.tok_flags = (add_special ? RT_TOKENIZE_ADD_SPECIAL : 0) |
                        (parse_special ? RT_TOKENIZE_PARSE_SPECIAL : 0);
    g->prep.with_pieces = with_pieces;
    /* megabytes of text tokenize off the loop, as prompts do */
    rt__gen_prepare(g, tokenize_work, tokenize_next);
}

static void route_detokenize(rt_req_t *r)
{
    if (refuse_while_loading(r))
        return;
    rt_app_t *app = app_of(r);
    json_t *body = rt_req_json(r);
    json_t *tokens = json_object_get(body, "tokens");
    if (!tokens || json_is_null(tokens)) {
        rt_req_send_json(r, 200, json_pack("{s:s}", "content", ""));
        return;
    }
    if (!json_is_array(tokens)) {
        rt_req_send_error(r, 400, NULL, "'tokens' must be an array of token ids");
        return;
    }
    size_t n = json_array_size(tokens);
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    if (!ids) {
        rt_req_send_error(r, 500, NULL, "out of memory");
        return;
    }
    uint32_t n_vocab = rt_tokenizer_n_vocab(app->tok);
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(tokens, i);
        if (!json_is_integer(v)) {
            free(ids);
            rt_req_send_error(r, 400, NULL, "'tokens[%zu]' must be an integer token id", i);
            return;
        }
        json_int_t id = json_integer_value(v);
        if (id < 0 || id >= (json_int_t)n_vocab) {
            free(ids);
            rt_req_send_error(r, 400, NULL,
                              "'tokens[%zu]': token id %" JSON_INTEGER_FORMAT
                              " is out of range (vocabulary of %u tokens)",
                              i, id, n_vocab);
            return;
        }
        ids[i] = (int32_t)id;
    }
    char *text = NULL;
    size_t len = 0;
    bl_err_t err = {0};
    int rc = rt_detokenize(app->tok, ids, n, RT_DETOK_SPECIAL, &text, &len, &err);
    free(ids);
    if (rc != 0) {
        rt_req_send_error(r, rc == BL_ENOMEM ? 500 : 400, NULL, "detokenize: %s", err.msg);
        return;
    }
    json_t *s = json_stringn(text, len);
    free(text);
    rt_req_send_json(r, 200, s ? json_pack("{s:o}", "content", s) : NULL);
}

/* --- /lora-adapters ----------------------------------------------------------------- */

/* No adapters are loaded (there is no --lora): the list is empty, and setting the
 * scale of any adapter is refused by its id, as llama-server refuses an unknown id. */
static void route_lora_list(rt_req_t *r)
{
    json_t *a = json_array();
    if (a)
        rt_req_send_json(r, 200, a);
    else
        rt_req_send_error(r, 500, NULL, "out of memory");
}

static void route_lora_set(rt_req_t *r)
{
    const json_t *body = rt_req_json(r);
    if (!json_is_array(body)) {
        rt_req_send_error(r, 400, NULL, "the request body must be an array of {\"id\", \"scale\"}");
        return;
    }
    if (json_array_size(body) > 0) {
        const json_t *id = json_is_object(json_array_get(body, 0))
                               ? json_object_get(json_array_get(body, 0), "id") : NULL;
        rt_req_send_error(r, 400, NULL, "invalid adapter id %lld: no LoRA adapters are loaded",
                          json_is_integer(id) ? (long long)json_integer_value(id) : -1LL);
        return;
    }
    rt_req_send_json(r, 200, json_pack("{s:b}", "success", 1));
}

/* A slot action on its way through the engine. */
typedef struct slot_req {
    rt_req_t *r;
    rt_app_t *app;
    rt_task_t *task;
    int action, slot;
    char name[256];
} slot_req_t;

static void slot_req_gone(void *ud)
{
    slot_req_t *q = ud;
    rt_engine_cancel(q->app->engine, q->task);
    free(q);
}

static void slot_req_event(void *ud, const rt_event_t *ev)
{
    slot_req_t *q = ud;
    if (ev->kind == RT_EV_ERROR) {
        rt_req_send_error(q->r, ev->status, NULL, "%s", ev->message ? ev->message : "failed");
    } else if (ev->kind == RT_EV_DONE) {
        json_t *j = q->action == RT_SLOT_ERASE
                        ? json_pack("{s:i, s:I}", "id_slot", q->slot, "n_erased",
                                    (json_int_t)ev->io_tokens)
                    : q->action == RT_SLOT_SAVE
                        ? json_pack("{s:i, s:s, s:I, s:I, s:{s:f}}", "id_slot", q->slot, "filename",
                                    q->name, "n_saved", (json_int_t)ev->io_tokens, "n_written",
                                    (json_int_t)ev->io_bytes, "timings", "save_ms", ev->io_ms)
                        : json_pack("{s:i, s:s, s:I, s:I, s:{s:f}}", "id_slot", q->slot, "filename",
                                    q->name, "n_restored", (json_int_t)ev->io_tokens, "n_read",
                                    (json_int_t)ev->io_bytes, "timings", "restore_ms", ev->io_ms);
        rt_req_send_json(q->r, 200, j);
    } else {
        return; /* no other event comes for a slot action */
    }
    free(q);
}

/* POST /slots/ID?action=save|restore|erase, as llama-server: 501 without
 * --slot-save-path; save and restore take {"filename"}, a plain name in that folder;
 * the action waits for the slot to be idle. */
static void route_slot_action(rt_req_t *r)
{
    rt_app_t *app = rt_req_app(r);
    if (!app->slot_dir) {
        rt_req_send_error(r, 501, "not_supported_error", "This server does not support slots "
                          "action. Start it with `--slot-save-path`");
        return;
    }
    const char *id = rt_req_path(r) + strlen("/slots/");
    char *end = NULL;
    long slot = strtol(id, &end, 10);
    if (!*id || *end || id[0] == '-' || id[0] == '+' || slot >= rt_engine_n_slots(app->engine)) {
        rt_req_send_error(r, 400, NULL, "Invalid slot ID: %.32s", id);
        return;
    }
    size_t alen = 0;
    const char *a = rt_req_query(r, "action", &alen);
    int action = !a ? 0
                 : alen == 4 && !memcmp(a, "save", 4)    ? RT_SLOT_SAVE
                 : alen == 7 && !memcmp(a, "restore", 7) ? RT_SLOT_RESTORE
                 : alen == 5 && !memcmp(a, "erase", 5)   ? RT_SLOT_ERASE
                                                         : 0;
    if (!action) {
        rt_req_send_error(r, 400, NULL, "Invalid action");
        return;
    }
    const json_t *body = rt_req_json(r);
    const json_t *fn = json_is_object(body) ? json_object_get(body, "filename") : NULL;
    if (action != RT_SLOT_ERASE && !json_is_string(fn)) {
        rt_req_send_error(r, 400, NULL, "'filename' is required: a file name in the "
                                        "--slot-save-path folder");
        return;
    }
    slot_req_t *q = calloc(1, sizeof *q);
    if (!q) {
        rt_req_send_error(r, 500, NULL, "out of memory");
        return;
    }
    *q = (slot_req_t){.r = r, .app = app, .action = action, .slot = (int)slot};
    bl_err_t err = {0};
    if (fn) {
        if (json_string_length(fn) >= sizeof q->name) {
            free(q);
            rt_req_send_error(r, 400, NULL, "Invalid filename: 1 to 255 bytes");
            return;
        }
        snprintf(q->name, sizeof q->name, "%s", json_string_value(fn));
    }
    int rc = rt_engine_slot_io(app->engine, (int)slot, action, action == RT_SLOT_ERASE ? NULL : q->name,
                               slot_req_event, q, &q->task, &err);
    if (rc) {
        free(q);
        rt_req_send_error(r, rc == BL_ECLOSED ? 503 : rc == BL_ENOMEM ? 500 : 400, NULL, "%s", err.msg);
        return;
    }
    rt_req_on_gone(r, slot_req_gone, q);
}

#define STATIC_MAX_BYTES ((size_t)64 << 20) /* the largest file --path serves */

/* The type of a file by its name's ending. */
static const char *mime_of(const char *path)
{
    static const char *const types[][2] = {
        {".html", "text/html; charset=utf-8"}, {".htm", "text/html; charset=utf-8"},
        {".js", "text/javascript; charset=utf-8"}, {".mjs", "text/javascript; charset=utf-8"},
        {".css", "text/css; charset=utf-8"}, {".json", "application/json"}, {".svg", "image/svg+xml"},
        {".png", "image/png"}, {".jpg", "image/jpeg"}, {".jpeg", "image/jpeg"}, {".gif", "image/gif"},
        {".webp", "image/webp"}, {".ico", "image/x-icon"}, {".txt", "text/plain; charset=utf-8"},
        {".wasm", "application/wasm"}, {".woff2", "font/woff2"}, {".map", "application/json"}};
    const char *dot = strrchr(path, '.');
    for (size_t i = 0; dot && i < sizeof types / sizeof *types; i++)
        if (!strcasecmp(dot, types[i][0]))
            return types[i][1];
    return "application/octet-stream";
}

/* --path: the file under the folder that the request's path names ("/" is
 * index.html), public as the built-in page is; never a file outside the folder
 * (no "..", and a link that leads out is refused), a folder, or one over 64 MiB. */
static void route_static(rt_req_t *r)
{
    const rt_app_t *app = rt_req_app(r);
    const char *p = rt_req_path(r);
    if (!strcmp(p, "/"))
        p = "/index.html";
    char full[PATH_MAX], real[PATH_MAX];
    const size_t root = strlen(app->static_dir);
    if (strstr(p, "/..") || strchr(p, '\\') || (size_t)snprintf(full, sizeof full, "%s%s", app->static_dir, p) >=
        sizeof full || !realpath(full, real) || strncmp(real, app->static_dir, root) || real[root] != '/') {
        rt_req_send_error(r, 404, NULL, "File Not Found");
        return;
    }
    char *data = NULL;
    size_t len = 0;
    bl_err_t err = {0};
    struct stat st;
    if (stat(real, &st) != 0 || !S_ISREG(st.st_mode) || bl_read_file(real, STATIC_MAX_BYTES, &data, &len, &err)) {
        rt_req_send_error(r, 404, NULL, "File Not Found");
        return;
    }
    rt_req_send_text(r, 200, mime_of(real), data, len);
    free(data);
}

/* GET / and /index.html: a chat page over /v1/chat/completions, public as
 * llama-server's web UI is (it asks for the API key itself); with --path, the
 * folder's files instead. */
static void route_webui(rt_req_t *r)
{
    const rt_app_t *app = rt_req_app(r);
    if (app->no_webui) {
        rt_req_send_error(r, 404, NULL, "File Not Found");
        return;
    }
    if (app->static_dir) {
        route_static(r);
        return;
    }
    rt_req_send_text(r, 200, "text/html; charset=utf-8", rt_webui_html, rt_webui_html_len);
}

/* A GET no route knows: a file of --path's folder, else 404. */
static void route_fallback(rt_req_t *r)
{
    const rt_app_t *app = rt_req_app(r);
    if (app->static_dir && !app->no_webui)
        route_static(r);
    else
        rt_req_send_error(r, 404, NULL, "File Not Found");
}

void rt_api_info_register(rt_http_t *h)
{
    static const struct {
        const char *method, *path;
        rt_route_fn fn;
        unsigned flags;
    } routes[] = {
        {"GET", "/", route_webui, RT_ROUTE_PUBLIC},
        {"GET", "/index.html", route_webui, RT_ROUTE_PUBLIC},
        {"GET", "/health", route_health, RT_ROUTE_PUBLIC},
        {"GET", "/v1/health", route_health, RT_ROUTE_PUBLIC},
        {"GET", "/v1/models", route_models, RT_ROUTE_PUBLIC},
        {"GET", "/models", route_models, RT_ROUTE_PUBLIC},
        {"GET", "/props", route_props, 0},
        {"GET", "/slots", route_slots, 0},
        {"POST", "/slots/", route_slot_action, RT_ROUTE_PREFIX | RT_ROUTE_OPTIONAL_BODY},
        {"GET", "/metrics", route_metrics, 0},
        {"POST", "/tokenize", route_tokenize, 0},
        {"POST", "/detokenize", route_detokenize, 0},
        {"GET", "/lora-adapters", route_lora_list, 0},
        {"POST", "/lora-adapters", route_lora_set, RT_ROUTE_ANY_JSON},
    };
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
        if (rt_http_route(h, routes[i].method, routes[i].path, routes[i].fn, routes[i].flags) != 0)
            BL_LOG(BL_LOG_ERROR, "event=route_failed path=%s", routes[i].path);
    rt_http_set_fallback(h, route_fallback);
}
