/* bloomery-cli: runs a model on a prompt from the command line and streams the
 * continuation to stdout; with --dump-logits it writes every prompt position's
 * log-sum-exp and top logits (and the generated tokens' top logits) in the oracle
 * format, so that any two runs, or a run and an oracle, compare with one script. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "args.h"
#include "chat.h"
#include "file.h"
#include "cpuset.h"
#include "gguf.h"
#include "hub.h"
#include "json_schema.h"
#include "sampler.h"
#include "tokenizer.h"
#include "kcpu.h"
#include "wk.h"

#define PROMPT_FILE_MAX (256u << 20)
#define MAX_LOGIT_BIAS 4096

typedef struct cli {
    const char *model, *prompt, *prompt_file, *dump_logits, *template_file, *system;
    const char *grammar, *grammar_file, *json_schema, *json_schema_file; /* one of them */
    bl_hub_opts_t hub; /* -hf: the model from the hub instead of -m */
    const char *cache_type_k, *cache_type_v;
    int64_t n_predict, n_threads, n_ctx, n_batch, dump_top, poll, routing_stats;
    bl_place_flags_t place; /* -ngl, -dev, --cpu-moe, ...: the plan's flags, as the server's */
    bl_cpu_flags_t cpu;     /* -C, -Cr, --cpu-strict, as the server's */
    int flash_attn; /* -fa: BL_FLASH_* */
    int chat, precise, no_parse_special, ignore_eos, jinja, show_special, mtp;
    rt_sampler_params_t sp;
    int64_t seed, top_k, repeat_last_n; /* widened: the flag parser stores int64_t */
    rt_logit_bias_t bias[MAX_LOGIT_BIAS];
    size_t n_bias;
} cli_t;

/* --experts-vram auto reaches the model as it is */
_Static_assert(BL_EXPERTS_VRAM_AUTO == WK_EXPERTS_VRAM_AUTO, "one value for auto");

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* -l TOKEN(+|-)BIAS, repeatable (rt_logit_bias_parse). */
static int parse_logit_bias(void *ud, const char *v, bl_err_t *err)
{
    cli_t *c = ud;
    if (c->n_bias == MAX_LOGIT_BIAS)
        return bl_err_set(err, BL_ERANGE, "more than %d biases", MAX_LOGIT_BIAS);
    const int rc = rt_logit_bias_parse(v, &c->bias[c->n_bias], err);
    if (rc == 0)
        c->n_bias++;
    return rc;
}

static int kv_type_from_name(const char *name, uint32_t *out)
{
    if (!strcmp(name, "f16"))
        *out = WK_KV_F16;
    else if (!strcmp(name, "f32"))
        *out = WK_KV_F32;
    else if (!strcmp(name, "q8_0"))
        *out = WK_KV_Q8_0;
    else
        return BL_EINVAL;
    return 0;
}

// --- logits dump ------------------------------------------------------------------------

/* The top n ids of a row (best first, ties to the lower id) and the row's lse. */
static double row_top(const float *row, int64_t n_vocab, int64_t n, int32_t *ids, float *vals)
{
    int64_t k = 0;
    double max = -INFINITY;
    for (int64_t i = 0; i < n_vocab; i++)
        if (row[i] > max)
            max = row[i];
    double sum = 0;
    for (int64_t i = 0; i < n_vocab; i++) {
        float v = row[i];
        sum += exp((double)v - max);
        if (k < n || v > vals[k - 1]) {
            int64_t j = k < n ? k++ : n - 1;
            for (; j > 0 && v > vals[j - 1]; j--) {
                vals[j] = vals[j - 1];
                ids[j] = ids[j - 1];
            }
            vals[j] = v;
            ids[j] = (int32_t)i;
        }
    }
    return max + log(sum);
}

static json_t *row_json(const float *row, int64_t n_vocab, int64_t top)
{
    int32_t ids[256];
    float vals[256];
    if (top > 256)
        top = 256;
    if (top > n_vocab)
        top = n_vocab;
    double lse = row_top(row, n_vocab, top, ids, vals);
    json_t *o = json_object(), *ji = json_array(), *jl = json_array();
    for (int64_t i = 0; i < top; i++) {
        json_array_append_new(ji, json_integer(ids[i]));
        json_array_append_new(jl, json_real(vals[i]));
    }
    json_object_set_new(o, "lse", json_real(lse));
    json_object_set_new(o, "ids", ji);
    json_object_set_new(o, "logits", jl);
    return o;
}

/* After a step of a model that runs its NextN layer: the proposal from the step's last
 * logit row into *in and *tok (-1 when it made none), and, with rows and ins (a dump),
 * the layer's logits and the token it read appended to them. */
static void mtp_take(const wk_model_t *m, int64_t top, json_t *rows, json_t *ins, int32_t *in, int32_t *tok)
{
    const wk_mtp_row_t *r;
    const float *lg;
    const int64_t n = wk_model_mtp(m, &r, &lg);
    *in = *tok = -1;
    if (n < 1 || r[n - 1].in < 0)
        return;
    *in = r[n - 1].in;
    *tok = r[n - 1].tok;
    if (!rows)
        return;
    int64_t at = 0; /* its logits follow those of the earlier rows that proposed */
    for (int64_t k = 0; k < n - 1; k++)
        at += r[k].in >= 0;
    json_array_append_new(rows, row_json(lg + at * wk_model_config(m)->n_vocab, wk_model_config(m)->n_vocab, top));
    json_array_append_new(ins, json_integer(*in));
}

// --- main -------------------------------------------------------------------------------

/* The GBNF of --grammar, --grammar-file, -j or -jf (at most one), or NULL; *out:
 * caller frees. */
static int load_grammar(const cli_t *c, char **out, bl_err_t *err)
{
    *out = NULL;
    int given = !!c->grammar + !!c->grammar_file + !!c->json_schema + !!c->json_schema_file;
    if (given > 1)
        return bl_err_set(err, BL_EINVAL,
                          "give one of --grammar, --grammar-file, --json-schema, --json-schema-file");
    char *text = NULL;
    size_t len;
    int rc;
    if (c->grammar || c->json_schema)
        text = strdup(c->grammar ? c->grammar : c->json_schema);
    else if (c->grammar_file || c->json_schema_file) {
        if ((rc = bl_read_file(c->grammar_file ? c->grammar_file : c->json_schema_file, 1 << 20,
                               &text, &len, err)))
            return rc;
    } else {
        return 0;
    }
    if (!text)
        return bl_err_set(err, BL_ENOMEM, "out of memory");
    if (c->grammar || c->grammar_file) {
        *out = text;
        return 0;
    }
    json_error_t je;
    json_t *schema = json_loads(text, JSON_DECODE_ANY, &je);
    free(text);
    if (!schema)
        return bl_err_set(err, BL_EINVAL, "--json-schema: not JSON (line %d: %s)", je.line, je.text);
    bl_err_t e2 = {0};
    rc = rt_json_schema_to_gbnf(schema, out, &e2);
    json_decref(schema);
    return rc ? bl_err_set(err, rc, "--json-schema: %s", e2.msg) : 0;
}

/* --routing-stats K: per layer, the selections, the share of them its K most chosen
 * experts took, and those experts (most chosen first); then the mean share. */
static void print_routing(const bl_heat_t *h, int64_t k)
{
    if (!h) {
        fprintf(stderr, "bloomery-cli: routing: no counts (a dense model, or its layers on a card)\n");
        return;
    }
    const int64_t ne = bl_heat_n_expert(h);
    if (k > ne)
        k = ne;
    int32_t *top = malloc(sizeof *top * (size_t)ne);
    uint64_t *cnt = malloc(sizeof *cnt * (size_t)ne);
    if (!top || !cnt) {
        free(top);
        free(cnt);
        fprintf(stderr, "bloomery-cli: routing: out of memory\n");
        return;
    }
    double sum_share = 0;
    int64_t layers = 0;
    for (int64_t l = 0; l < bl_heat_n_layer(h); l++) {
        const uint64_t total = bl_heat_layer_count(h, l);
        if (total == 0)
            continue;
        /* most chosen by plain count: a selection sort of the k first */
        for (int64_t e = 0; e < ne; e++) {
            top[e] = (int32_t)e;
            cnt[e] = bl_heat_count(h, l, e);
        }
        uint64_t in_top = 0;
        for (int64_t i = 0; i < k; i++) {
            int64_t best = i;
            for (int64_t j = i + 1; j < ne; j++)
                if (cnt[top[j]] > cnt[top[best]])
                    best = j;
            const int32_t t = top[i];
            top[i] = top[best];
            top[best] = t;
            in_top += cnt[top[i]];
        }
        const double share = (double)in_top / (double)total;
        fprintf(stderr, "bloomery-cli: routing: layer %lld: %llu selections, %.1f %% to experts", (long long)l,
                (unsigned long long)total, 100.0 * share);
        for (int64_t i = 0; i < k; i++)
            fprintf(stderr, " %d", top[i]);
        fputc('\n', stderr);
        sum_share += share;
        layers++;
    }
    if (layers)
        fprintf(stderr, "bloomery-cli: routing: %lld layers, mean %.1f %% of the selections to each layer's %lld most "
                "chosen of %lld experts\n", (long long)layers, 100.0 * sum_share / (double)layers, (long long)k,
                (long long)ne);
    free(top);
    free(cnt);
}

static int run(cli_t *c)
{
    bl_err_t err = {0};
    int rc = 1;
    wk_placed_t pl = {0};
    wk_model_t *m = NULL;
    wk_kv_t *kv = NULL;
    rt_tokenizer_t *tok = NULL;
    rt_template_t *tpl = NULL;
    rt_sampler_t *smp = NULL;
    rt_detok_t *dt = NULL;
    rt_tokens_t prompt = {0};
    char *text = NULL, *file_text = NULL, *grammar = NULL;
    float *logits = NULL;
    json_t *dump = NULL, *positions = NULL, *greedy = NULL, *mtp_rows = NULL, *mtp_in = NULL;

    /* the precise mode checks the arithmetic, so its cache keeps f32 unless told */
    uint32_t kv_type = c->precise ? WK_KV_F32 : WK_KV_F16;
    if (c->cache_type_k && kv_type_from_name(c->cache_type_k, &kv_type)) {
        fprintf(stderr, "bloomery-cli: --cache-type-k: '%s' is not f16, f32 or q8_0\n",
                c->cache_type_k);
        return 2;
    }
    uint32_t kv_type_v = kv_type;
    if (c->cache_type_v && kv_type_from_name(c->cache_type_v, &kv_type_v)) {
        fprintf(stderr, "bloomery-cli: --cache-type-v: '%s' is not f16, f32 or q8_0\n",
                c->cache_type_v);
        return 2;
    }
    if (kv_type_v != kv_type) {
        fprintf(stderr, "bloomery-cli: different K and V cache types are not supported\n");
        return 2;
    }

    wk_model_opts_t mo;
    wk_model_opts_default(&mo);
    mo.precise = c->precise;
    mo.mtp = c->mtp;
    mo.n_threads = (int)c->n_threads;
    mo.poll = (int)c->poll;
    mo.cpu_strict = (int)c->cpu.strict;
    mo.experts_vram = c->place.experts_vram;
    mo.residency = !c->place.no_residency;
    mo.n_batch = c->n_batch;
    mo.n_ctx_max = c->n_ctx;
    /* where the layers go: the server's plan from the same flags, for one stage */
    bl_place_opts_t po = {.n_ctx_total = c->n_ctx, .kv_elem_bytes = 2.0, .n_batch = c->n_batch};
    char plan_text[4096];
    static wk_place_t place;
    if (bl_plan_opts(&po, &c->place, &err) ||
        wk_place_one(c->model, &po, &place, plan_text, sizeof plan_text, &err))
        goto fail;
    for (char *line = plan_text, *nl; (nl = strchr(line, '\n')); line = nl + 1)
        fprintf(stderr, "bloomery-cli: plan: %.*s\n", (int)(nl - line), line);
    mo.flash_attn = c->flash_attn;
    mo.device = place.device;
    if (mo.device >= 0 && !c->cache_type_k) /* the card keeps f16 caches only */
        kv_type = WK_KV_F16;
    double t0 = now_s();
    bl_progress_t bar; /* on a terminal */
    bl_progress_begin(&bar, BL_PROGRESS_BAR, "loading", "", 0, 0);
    mo.progress = bl_progress_phases;
    mo.progress_ud = &bar;
    const int lrc = wk_load_placed(&pl, c->model, &mo, &place, &err);
    bl_progress_end(&bar, lrc == 0);
    if (lrc)
        goto fail;
    m = pl.m;
    const wk_config_t *cfg = wk_model_config(m);
    if (rt_tokenizer_from_gguf(&tok, wk_model_gguf(m), &err))
        goto fail;
    if ((int64_t)rt_tokenizer_n_vocab(tok) > cfg->n_vocab) {
        bl_err_set(&err, BL_EINVAL, "%s: the vocabulary has %u tokens, the output head %lld",
                   c->model, rt_tokenizer_n_vocab(tok), (long long)cfg->n_vocab);
        goto fail;
    }
    fprintf(stderr, "bloomery-cli: loaded %s (%s, %lld layers) in %.2f s; kernels %s, %lld threads\n",
            c->model, cfg->arch, (long long)cfg->n_layer, now_s() - t0, wk_model_kernels(m),
            (long long)c->n_threads);

    /* the prompt text */
    const char *ptext = c->prompt;
    size_t plen = ptext ? strlen(ptext) : 0;
    if (c->prompt_file) {
        if (bl_read_file(c->prompt_file, PROMPT_FILE_MAX, &file_text, &plen, &err))
            goto fail;
        ptext = file_text;
    }
    if (!ptext) {
        ptext = "";
        plen = 0;
    }
    if (c->chat) {
        if (rt_chat_template_load(&tpl, wk_model_gguf(m), c->template_file, &err))
            goto fail;
        json_t *msgs = json_array();
        if (c->system)
            json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content", c->system));
        json_array_append_new(msgs, json_pack("{s:s,s:s%}", "role", "user", "content", ptext, plen));
        size_t tlen;
        int rrc = rt_chat_render(tpl, tok, msgs, 1, NULL, &text, &tlen, &err);
        json_decref(msgs);
        if (rrc)
            goto fail;
        ptext = text;
        plen = tlen;
    }
    unsigned tflags = RT_TOKENIZE_ADD_SPECIAL | (c->no_parse_special ? 0 : RT_TOKENIZE_PARSE_SPECIAL);
    if (rt_tokenize(tok, ptext, plen, tflags, &prompt, &err))
        goto fail;
    if (prompt.n == 0) {
        bl_err_set(&err, BL_EINVAL, "the prompt is empty (give -p TEXT or -f FILE)");
        goto fail;
    }
    int64_t n_ctx = c->n_ctx;
    if ((int64_t)prompt.n > n_ctx) {
        bl_err_set(&err, BL_ERANGE, "the prompt has %zu tokens, more than the context (-c %lld)",
                   prompt.n, (long long)n_ctx);
        goto fail;
    }
    if (wk_kv_create(&kv, m, n_ctx, kv_type, &err))
        goto fail;

    rt_sampler_params_t sp = c->sp;
    sp.seed = c->seed < 0 ? RT_SEED_RANDOM : (uint32_t)c->seed;
    sp.logit_bias = c->bias;
    sp.n_logit_bias = c->n_bias;
    if (load_grammar(c, &grammar, &err))
        goto fail;
    sp.grammar = grammar;
    sp.grammar_len = grammar ? strlen(grammar) : 0;
    if (rt_sampler_create(&smp, &sp, (int32_t)cfg->n_vocab, (int32_t)n_ctx, tok, &err))
        goto fail;
    if (rt_detok_create(&dt, tok, c->show_special ? RT_DETOK_SPECIAL : 0, &err))
        goto fail;

    const int64_t n_vocab = cfg->n_vocab;
    int64_t chunk = c->n_batch;
    logits = malloc((size_t)chunk * (size_t)n_vocab * sizeof *logits);
    if (!logits) {
        bl_err_set(&err, BL_ENOMEM, "out of memory for %lld rows of logits", (long long)chunk);
        goto fail;
    }
    if (c->dump_logits) {
        dump = json_object();
        positions = json_array();
        greedy = json_array();
        json_t *ids = json_array();
        for (size_t i = 0; i < prompt.n; i++)
            json_array_append_new(ids, json_integer(prompt.ids[i]));
        json_object_set_new(dump, "model", json_string(c->model));
        json_object_set_new(dump, "n_vocab", json_integer(n_vocab));
        json_object_set_new(dump, "prompt_ids", ids);
    }

    /* --mtp: the NextN layer's proposal after the last step (c_*), the one before and
     * the token generated after it (q_*), and how often the proposals came true */
    int32_t c_in = -1, c_tok = -1, q_in = -1, q_tok = -1, q_gen = -1;
    int64_t n_proposed = 0, n_hit = 0;
    if (c->mtp && dump) {
        mtp_rows = json_array();
        mtp_in = json_array();
    }

    /* the prompt, in chunks of n_batch rows */
    double tp0 = now_s();
    const float *last = NULL;
    for (size_t at = 0; at < prompt.n; at += (size_t)chunk) {
        int64_t n = (int64_t)(prompt.n - at) < chunk ? (int64_t)(prompt.n - at) : chunk;
        int64_t n_out = c->dump_logits ? n : (at + (size_t)n == prompt.n ? 1 : 0);
        if (wk_model_eval(m, kv, prompt.ids + at, n, (int64_t)at, n_out, logits, &err))
            goto fail;
        for (int64_t r = 0; c->dump_logits && r < n; r++)
            json_array_append_new(positions, row_json(logits + r * n_vocab, n_vocab, c->dump_top));
        if (n_out)
            last = logits + (n_out - 1) * n_vocab;
    }
    if (c->mtp && c->dump_logits) {
        /* every row had logits, so the NextN layer read the rows as a verify step's
         * (it stops at the first row whose next token is not its most likely one):
         * the prompt again, logits for its last row only, as a server's prompt */
        wk_kv_clear(kv);
        for (size_t at = 0; at < prompt.n; at += (size_t)chunk) {
            int64_t n = (int64_t)(prompt.n - at) < chunk ? (int64_t)(prompt.n - at) : chunk;
            int64_t n_out = at + (size_t)n == prompt.n ? 1 : 0;
            if (wk_model_eval(m, kv, prompt.ids + at, n, (int64_t)at, n_out, logits, &err))
                goto fail;
            if (n_out)
                last = logits;
        }
    }
    mtp_take(m, c->dump_top, mtp_rows, mtp_in, &c_in, &c_tok);
    double tp = now_s() - tp0;
    for (size_t i = 0; i < prompt.n; i++)
        rt_sampler_accept(smp, prompt.ids[i]);

    /* generation */
    int64_t n_gen = 0;
    double tg0 = now_s();
    int64_t budget = c->n_predict < 0 ? n_ctx - (int64_t)prompt.n : c->n_predict;
    if (budget > n_ctx - (int64_t)prompt.n)
        budget = n_ctx - (int64_t)prompt.n;
    for (int64_t pos = (int64_t)prompt.n; n_gen < budget; pos++) {
        int32_t t = rt_sampler_sample(smp, last);
        if (greedy) {
            json_t *g = json_object();
            json_object_set_new(g, "id", json_integer(t));
            json_object_set_new(g, "top", row_json(last, n_vocab, c->dump_top));
            json_array_append_new(greedy, g);
        }
        rt_sampler_accept_generated(smp, t);
        if (q_in >= 0 && q_gen == q_in) { /* the proposal before: the token it read came */
            n_proposed++;
            n_hit += t == q_tok;
        }
        q_in = c_in, q_tok = c_tok, q_gen = t;
        c_in = c_tok = -1;
        n_gen++;
        if (!c->ignore_eos && rt_tokenizer_is_eog(tok, t))
            break;
        const char *piece;
        size_t plen2;
        if (rt_detok_push(dt, t, &piece, &plen2, &err))
            goto fail;
        fwrite(piece, 1, plen2, stdout);
        fflush(stdout);
        if (n_gen == budget)
            break;
        if (wk_model_eval(m, kv, &t, 1, pos, 1, logits, &err))
            goto fail;
        last = logits;
        mtp_take(m, c->dump_top, mtp_rows, mtp_in, &c_in, &c_tok);
    }
    const char *tail;
    size_t tail_len;
    rt_detok_flush(dt, &tail, &tail_len);
    fwrite(tail, 1, tail_len, stdout);
    if (n_gen)
        fputc('\n', stdout);
    fflush(stdout);
    double tg = now_s() - tg0;
    fprintf(stderr, "bloomery-cli: prompt %zu tokens in %.3f s (%.2f tok/s); generated %lld tokens in %.3f s (%.2f tok/s); seed %u\n",
            prompt.n, tp, prompt.n / (tp > 0 ? tp : 1e-9), (long long)n_gen, tg,
            n_gen / (tg > 0 ? tg : 1e-9), rt_sampler_seed(smp));

    if (c->mtp)
        fprintf(stderr, "bloomery-cli: NextN proposals: %lld of %lld were the token generated after the next "
                "(%.1f %%)\n", (long long)n_hit, (long long)n_proposed,
                n_proposed ? 100.0 * (double)n_hit / (double)n_proposed : 0.0);
    if (c->routing_stats)
        print_routing(wk_model_heat(m), c->routing_stats);
    if (dump) {
        json_object_set_new(dump, "positions", positions);
        positions = NULL;
        if (c->n_predict != 0) {
            json_object_set_new(dump, "greedy", greedy);
            greedy = NULL;
        }
        if (mtp_rows) {
            json_object_set_new(dump, "mtp", mtp_rows);
            json_object_set_new(dump, "mtp_in", mtp_in);
            mtp_rows = mtp_in = NULL;
        }
        if (json_dump_file(dump, c->dump_logits, JSON_COMPACT | JSON_REAL_PRECISION(9))) {
            bl_err_set(&err, BL_EIO, "%s: cannot write", c->dump_logits);
            goto fail;
        }
    }
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "bloomery-cli: %s\n", err.msg[0] ? err.msg : "failed");
    rc = 1;
done:
    json_decref(dump);
    json_decref(positions);
    json_decref(greedy);
    json_decref(mtp_rows);
    json_decref(mtp_in);
    free(logits);
    free(text);
    free(file_text);
    rt_tokens_free(&prompt);
    rt_detok_destroy(dt);
    rt_sampler_destroy(smp);
    rt_template_destroy(tpl);
    rt_tokenizer_destroy(tok);
    free(grammar);
    wk_kv_free(kv);
    wk_placed_free(&pl);
    return rc;
}

int main(int argc, char **argv)
{
    static cli_t c;
    rt_sampler_params_default(&c.sp);
    c.n_threads = 0; /* not given: one per physical core, after -C */
    c.n_predict = -1;
    c.n_ctx = 4096;
    c.n_batch = 512;
    c.poll = KCPU_POLL_DEFAULT;
    c.dump_top = 32;
    c.seed = -1;
    c.top_k = c.sp.top_k;
    c.repeat_last_n = c.sp.penalty_last_n;

    bl_arg_t args[80] = {
        {"-m,--model", "LLAMA_ARG_MODEL", BL_ARG_STR, &c.model, .metavar = "FILE", .help = "model file (GGUF; the first part of a split model)"},
        BL_HUB_ARGS(&c.hub),
        {"-p,--prompt", NULL, BL_ARG_STR, &c.prompt, .metavar = "TEXT", .help = "prompt text (special tokens are parsed)"},
        {"-f,--file", NULL, BL_ARG_STR, &c.prompt_file, .metavar = "FILE", .help = "read the prompt from FILE ('-': stdin)"},
        {"-n,--n-predict,--predict", "LLAMA_ARG_N_PREDICT", BL_ARG_I64, &c.n_predict, -1, INT32_MAX, .metavar = "N", .help = "tokens to generate (-1: until end of text or a full context; 0: evaluate the prompt only)"},
        {"-t,--threads", "LLAMA_ARG_THREADS", BL_ARG_I64, &c.n_threads, 1, 256, .metavar = "N", .help = "threads (default: one per physical core of the CPUs it may use)"},
        {"--poll", NULL, BL_ARG_I64, &c.poll, 0, 100, .metavar = "0..100", .help = "how the CPU pools' idle threads wait: they yield for 4 us per level before they sleep (default 50, as llama.cpp's)"},
        {"-c,--ctx-size", "LLAMA_ARG_CTX_SIZE", BL_ARG_I64, &c.n_ctx, 1, 1 << 24, .metavar = "N", .help = "context size in tokens (default 4096)"},
        {"-b,--batch-size", "LLAMA_ARG_BATCH", BL_ARG_I64, &c.n_batch, 1, 1 << 16, .metavar = "N", .help = "prompt rows per forward pass (default 512)"},
        {"-cnv,--conversation,--chat", NULL, BL_ARG_FLAG, &c.chat, .help = "wrap the prompt as a user message in the chat template"},
        {"-sys,--system-prompt", NULL, BL_ARG_STR, &c.system, .metavar = "TEXT", .help = "system message (with --chat)"},
        {"--grammar", NULL, BL_ARG_STR, &c.grammar, .metavar = "GBNF", .help = "constrain the text to this GBNF grammar"},
        {"--grammar-file", NULL, BL_ARG_STR, &c.grammar_file, .metavar = "FILE", .help = "the GBNF grammar from FILE"},
        {"-j,--json-schema", NULL, BL_ARG_STR, &c.json_schema, .metavar = "SCHEMA", .help = "constrain the text to JSON this schema accepts"},
        {"-jf,--json-schema-file", NULL, BL_ARG_STR, &c.json_schema_file, .metavar = "FILE", .help = "the JSON schema from FILE"},
        {"--chat-template-file", "LLAMA_ARG_CHAT_TEMPLATE_FILE", BL_ARG_STR, &c.template_file, .metavar = "FILE", .help = "Jinja chat template instead of the model's"},
        {"--jinja", "LLAMA_ARG_JINJA", BL_ARG_FLAG, &c.jinja, .help = "accepted: templates are always Jinja"},
        {"--temp,--temperature", NULL, BL_ARG_F32, &c.sp.temp, .fmin = 0, .fmax = 100, .metavar = "T", .help = "temperature (default 0.8; 0: greedy)"},
        {"--top-k", NULL, BL_ARG_I64, &c.top_k, 0, INT32_MAX, .metavar = "N", .help = "top-k (default 40; 0: off)"},
        {"--top-p", NULL, BL_ARG_F32, &c.sp.top_p, .fmin = 0, .fmax = 1, .metavar = "P", .help = "top-p (default 0.95; 1: off)"},
        {"--min-p", NULL, BL_ARG_F32, &c.sp.min_p, .fmin = 0, .fmax = 1, .metavar = "P", .help = "min-p (default 0.05; 0: off)"},
        {"--typical,--typical-p", NULL, BL_ARG_F32, &c.sp.typical_p, .fmin = 0, .fmax = 1, .metavar = "P", .help = "locally typical sampling (default 1: off)"},
        {"--repeat-penalty", NULL, BL_ARG_F32, &c.sp.repeat_penalty, .fmin = 1e-6f, .fmax = 100, .metavar = "X", .help = "repetition penalty (default 1: off)"},
        {"--repeat-last-n", NULL, BL_ARG_I64, &c.repeat_last_n, -1, INT32_MAX, .metavar = "N", .help = "penalty window (default 64; 0: off; -1: the context)"},
        {"--presence-penalty", NULL, BL_ARG_F32, &c.sp.presence_penalty, .fmin = -100, .fmax = 100, .metavar = "X", .help = "presence penalty (default 0)"},
        {"--frequency-penalty", NULL, BL_ARG_F32, &c.sp.frequency_penalty, .fmin = -100, .fmax = 100, .metavar = "X", .help = "frequency penalty (default 0)"},
        {"-s,--seed", NULL, BL_ARG_I64, &c.seed, -1, UINT32_MAX - 1, .metavar = "N", .help = "sampling seed (default -1: random)"},
        {"-l,--logit-bias", NULL, BL_ARG_FN, NULL, .fn = parse_logit_bias, .ud = &c, .metavar = "ID(+|-)BIAS", .help = "add BIAS to token ID's logit (repeatable; -inf bans it)"},
        {"--ignore-eos", NULL, BL_ARG_FLAG, &c.ignore_eos, .help = "go on past end-of-text tokens"},
        {"--special", NULL, BL_ARG_FLAG, &c.show_special, .help = "print control tokens as text"},
        {"--no-parse-special", NULL, BL_ARG_FLAG, &c.no_parse_special, .help = "tokenize special-token text as plain text"},
        {"-ctk,--cache-type-k", "LLAMA_ARG_CACHE_TYPE_K", BL_ARG_STR, &c.cache_type_k, .metavar = "TYPE", .help = "KV cache type: f16 (default; f32 with --precise), f32, q8_0"},
        {"-ctv,--cache-type-v", "LLAMA_ARG_CACHE_TYPE_V", BL_ARG_STR, &c.cache_type_v, .metavar = "TYPE", .help = "must equal the K type"},
        {"-fa,--flash-attn", "LLAMA_ARG_FLASH_ATTN", BL_ARG_FN, NULL, .fn = bl_arg_flash_attn, .ud = &c.flash_attn, .metavar = "on|off|auto", .help = "on a GPU: prompt attention as one flash kernel (on), as score/softmax/value pieces (off), flash where the head size has it (auto, default)"},
        {"--precise", NULL, BL_ARG_FLAG, &c.precise, .help = "f32 activations and KV cache, no activation quantization (for checking)"},
        {"--mtp", NULL, BL_ARG_FLAG, &c.mtp, .help = "run the model's NextN (multi-token prediction) layer after each step: how often its proposal was the token generated after the next is printed at the end; with --dump-logits, its logits after each generated token go to the dump's \"mtp\" list"},
        {"--dump-logits", NULL, BL_ARG_STR, &c.dump_logits, .metavar = "FILE", .help = "write lse and top logits of every position as JSON"},
        {"--dump-top", NULL, BL_ARG_I64, &c.dump_top, 1, 256, .metavar = "N", .help = "ids per position in --dump-logits (default 32)"},
        {"--routing-stats", NULL, BL_ARG_I64, &c.routing_stats, 1, 1 << 16, .metavar = "K", .help = "after the run, print per layer the share of the routing that went to its K most chosen experts, and which they are (a MoE model on the CPU)"},
    };
    int n_args = 0;
    while (args[n_args].names)
        n_args++;
    if (bl_plan_args(args, &n_args, (int)(sizeof args / sizeof args[0]), &c.place) != 0 ||
        bl_cpu_args(args, &n_args, (int)(sizeof args / sizeof args[0]), &c.cpu) != 0)
        abort(); /* the table is sized for them */
    bl_err_t err = {0};
    int help = 0;
    if (bl_args_parse(args, n_args, argc, argv, NULL, &help, &err)) {
        fprintf(stderr, "bloomery-cli: %s (see --help)\n", err.msg);
        return 2;
    }
    if (help) {
        if (help == BL_ARGS_VERSION)
            return 0;
        bl_args_usage(stdout, "bloomery-cli", "-m FILE [-p TEXT | -f FILE] [options]", args, n_args);
        return 0;
    }
    c.sp.top_k = (int32_t)c.top_k;
    c.sp.penalty_last_n = (int32_t)c.repeat_last_n;
    if (!c.model && !c.hub.spec && !c.hub.url) {
        fprintf(stderr, "bloomery-cli: -m FILE or -hf REPO is required (see --help)\n");
        return 2;
    }
    if (bl_cpu_flags_apply(&c.cpu, &err) != 0) {
        fprintf(stderr, "bloomery-cli: %s\n", err.msg);
        return 1;
    }
    if (c.n_threads <= 0)
        c.n_threads = bl_cpu_default_threads();
    if (c.prompt && c.prompt_file) {
        fprintf(stderr, "bloomery-cli: give -p or -f, not both\n");
        return 2;
    }
    if (c.system && !c.chat) {
        fprintf(stderr, "bloomery-cli: --system-prompt needs --chat\n");
        return 2;
    }
    char *model = NULL;
    if (bl_hub_model_path(&c.hub, c.model, &model, &err)) {
        fprintf(stderr, "bloomery-cli: %s\n", err.msg);
        return c.hub.spec && c.model ? 2 : 1;
    }
    c.model = model;
    int rc = run(&c);
    free(model);
    return rc;
}
