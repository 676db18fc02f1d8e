/* bloomery-bench: prompt and decode speed in llama-bench's interface and table
 * (-m, -p, -n, -r, -t; one row per test with t/s as mean ± standard deviation),
 * followed by the decode roofline: the bytes a decode token reads over the memory
 * read bandwidth this machine shows with the same threads, or, on a CUDA device
 * (-ngl, -dev), over the card's device-to-device copy bandwidth. --profile adds a
 * per-op time breakdown of a decode step: on the card from CUDA events per launch,
 * on the CPU from the clock around each op, with the weight bytes each op read and
 * the rate that makes. --kernels needs no model: it measures the CPU kernel sets
 * streaming random routed experts' weights (bench_kernels.c). --disk measures the
 * model file's reads as the disk pager makes them (bench_disk.c). --attention needs
 * no model either: it times the decode step's attention alone on the card at each
 * depth, as a decode graph runs it over every layer (bench_attention.c).
 *
 * A pp test evaluates N random tokens in batches of -b rows; a tg test decodes N
 * tokens one at a time. Both start from an empty cache, or with -d D from D random
 * tokens evaluated (untimed) before each run, as llama-bench's depth ("tg128 @
 * d4096"). With -np P a tg test decodes P sequences together, each with its own
 * cache and one row of every step (as P slots of the server), and its rate is all
 * of their tokens per second ("tg128 x8"). Each test runs once untimed, then -r
 * times timed. */
#ifdef __AVX2__
#include <immintrin.h>
#endif
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "args.h"
#include "bench_attention.h"
#include "bench_disk.h"
#include "bench_kernels.h"
#include "cpuset.h"
#include "gguf.h"
#include "quant.h"
#include "kcpu.h"
#include "store.h"
#include "wk.h"

#define MAX_LIST 16
/* most sequences a -np test decodes together */
#define BENCH_MAX_PAR 256

typedef struct list {
    int64_t v[MAX_LIST];
    int n;
} list_t;

typedef struct bench {
    const char *model, *output;
    list_t pp, tg, threads, depth, krows, par;
    int64_t reps, n_batch, poll;
    int precise, no_roofline, profile, kernels, disk, mtp, attention;
    const char *att_heads;                /* --att-heads Q,KV */
    int64_t att_head_dim, att_layers, ctx; /* --att-head-dim, --att-layers, -c */
    int flash_attn; /* BL_FLASH_*: -fa */
    bl_place_flags_t place; /* -ngl, -dev, --cpu-moe, ...: the plan's flags, as the server's */
    bl_cpu_flags_t cpu;     /* -C, -Cr, --cpu-strict, as the server's */
} bench_t;

/* --experts-vram auto reaches the model as it is */
_Static_assert(BL_EXPERTS_VRAM_AUTO == WK_EXPERTS_VRAM_AUTO, "one value for auto");

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* "512", "512,4096", "0" (none) */
/* A comma-separated list of counts; zeros are dropped (a test of length 0 is no
 * test) unless keep_zero (a depth of 0 is an empty cache). */
static int parse_counts(list_t *l, const char *v, int keep_zero, bl_err_t *err)
{
    l->n = 0;
    char buf[256];
    if (strlen(v) >= sizeof buf)
        return bl_err_set(err, BL_EINVAL, "list too long");
    strcpy(buf, v);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int64_t x;
        if (bl_parse_i64(tok, &x) || x < 0 || x > (1 << 20))
            return bl_err_set(err, BL_EINVAL, "'%.32s' is not a count in 0..1048576", tok);
        if (l->n == MAX_LIST)
            return bl_err_set(err, BL_EINVAL, "more than %d values", MAX_LIST);
        if (x > 0 || keep_zero)
            l->v[l->n++] = x;
    }
    if (keep_zero && l->n == 0)
        return bl_err_set(err, BL_EINVAL, "no value");
    return 0;
}

static int parse_list(void *ud, const char *v, bl_err_t *err) { return parse_counts(ud, v, 0, err); }

static int parse_depths(void *ud, const char *v, bl_err_t *err) { return parse_counts(ud, v, 1, err); }

/* -np: counts of 1 or more */
static int parse_par(void *ud, const char *v, bl_err_t *err)
{
    list_t *l = ud;
    int rc = parse_counts(l, v, 1, err);
    for (int i = 0; rc == 0 && i < l->n; i++)
        if (l->v[i] < 1)
            rc = bl_err_set(err, BL_EINVAL, "0 is not a count of sequences (1 or more)");
    return rc;
}

// --- memory bandwidth -------------------------------------------------------------------

typedef struct bw_job {
    const uint8_t *p;
    size_t n;
    uint64_t sink;
} bw_job_t;

static void *bw_read(void *arg)
{
    bw_job_t *j = arg;
    uint64_t acc = 0;
#ifdef __AVX2__
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 128 <= j->n; i += 128) {
        a0 = _mm256_xor_si256(a0, _mm256_load_si256((const __m256i *)(j->p + i)));
        a1 = _mm256_xor_si256(a1, _mm256_load_si256((const __m256i *)(j->p + i + 32)));
        a2 = _mm256_xor_si256(a2, _mm256_load_si256((const __m256i *)(j->p + i + 64)));
        a3 = _mm256_xor_si256(a3, _mm256_load_si256((const __m256i *)(j->p + i + 96)));
    }
    a0 = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
    acc = (uint64_t)_mm256_extract_epi64(a0, 0) ^ (uint64_t)_mm256_extract_epi64(a0, 3);
#else
    for (size_t i = 0; i + 8 <= j->n; i += 8) {
        uint64_t v;
        memcpy(&v, j->p + i, 8);
        acc ^= v;
    }
#endif
    j->sink = acc;
    return NULL;
}

/* Best of three reads of a 1 GiB buffer split over n threads, in bytes per second. */
static double measure_read_bandwidth(int n_threads)
{
    const size_t size = (size_t)1 << 30;
    uint8_t *buf = aligned_alloc(4096, size);
    if (!buf)
        return 0;
    memset(buf, 1, size);
    double best = 0;
    bw_job_t jobs[256];
    pthread_t th[256];
    for (int rep = 0; rep < 3; rep++) {
        size_t per = size / (size_t)n_threads / 128 * 128;
        double t0 = now_s();
        int started[256] = {0};
        for (int i = 0; i < n_threads; i++)
            jobs[i] = (bw_job_t){buf + (size_t)i * per, per, 0};
        for (int i = 1; i < n_threads; i++)
            started[i] = pthread_create(&th[i], NULL, bw_read, &jobs[i]) == 0;
        for (int i = 0; i < n_threads; i++)
            if (!started[i]) /* the calling thread reads its own part and any left over */
                bw_read(&jobs[i]);
        for (int i = 1; i < n_threads; i++)
            if (started[i])
                pthread_join(th[i], NULL);
        double dt = now_s() - t0;
        if (per * (size_t)n_threads / dt > best)
            best = per * (size_t)n_threads / dt;
    }
    free(buf);
    return best;
}

// --- the model's bytes ---------------------------------------------------------------------

typedef struct model_bytes {
    double total;       /* every tensor */
    double params;      /* elements */
    double per_token;   /* weights a decode token reads */
    double kv_per_pos;  /* KV cache bytes read per cached position per token (f16) */
} model_bytes_t;

static model_bytes_t count_bytes(const bl_gguf_t *g, const wk_config_t *cfg)
{
    model_bytes_t b = {0};
    for (uint64_t i = 0; i < bl_gguf_n_tensors(g); i++) {
        const bl_gguf_tensor_t *t = bl_gguf_tensor_at(g, i);
        double n = (double)t->nbytes;
        b.total += n;
        b.params += (double)t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
        if (!strcmp(t->name, "token_embd.weight"))
            b.per_token += cfg->tied_output ? n : n / (double)t->ne[1];
        else if (strstr(t->name, "_exps.") && cfg->n_expert > 0)
            b.per_token += n * (double)cfg->n_expert_used / (double)cfg->n_expert;
        else
            b.per_token += n;
    }
    b.kv_per_pos = 2.0 * 2.0 * (double)cfg->n_layer * cfg->n_head_kv * cfg->head_dim;
    return b;
}

/* The file type as llama-bench names it, from general.file_type; a file without one
 * is named by the type holding most of its bytes ("Q4_K mostly"). */
static void ftype_name(const bl_gguf_t *g, char *buf, size_t size)
{
    static const struct { uint32_t id; const char *name; } names[] = {
        {0, "all F32"}, {1, "F16"}, {2, "Q4_0"}, {3, "Q4_1"}, {7, "Q8_0"}, {8, "Q5_0"},
        {9, "Q5_1"}, {10, "Q2_K - Medium"}, {11, "Q3_K - Small"}, {12, "Q3_K - Medium"},
        {13, "Q3_K - Large"}, {14, "Q4_K - Small"}, {15, "Q4_K - Medium"}, {16, "Q5_K - Small"},
        {17, "Q5_K - Medium"}, {18, "Q6_K"}, {32, "BF16"},
    };
    uint32_t ft;
    bl_err_t err;
    if (bl_gguf_find_kv(g, "general.file_type") &&
        bl_gguf_get_u32(g, "general.file_type", &ft, &err) == 0)
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
            if (names[i].id == ft) {
                snprintf(buf, size, "%s", names[i].name);
                return;
            }
    double bytes[BL_TYPE_COUNT] = {0};
    for (uint64_t i = 0; i < bl_gguf_n_tensors(g); i++) {
        const bl_gguf_tensor_t *t = bl_gguf_tensor_at(g, i);
        if (t->type < BL_TYPE_COUNT)
            bytes[t->type] += (double)t->nbytes;
    }
    uint32_t best = 0;
    for (uint32_t i = 1; i < BL_TYPE_COUNT; i++)
        if (bytes[i] > bytes[best])
            best = i;
    const bl_type_info_t *ti = bl_type_info(best);
    snprintf(buf, size, "%s mostly", ti ? ti->name : "?");
    for (char *p = buf; *p && *p != ' '; p++)
        if (*p >= 'a' && *p <= 'z')
            *p = (char)(*p - 'a' + 'A');
}

static const char *thr_note(int64_t threads)
{
    static char buf[48];
    snprintf(buf, sizeof buf, " with %lld threads", (long long)threads);
    return buf;
}

// --- tests ---------------------------------------------------------------------------------

static void kv_free_all(wk_kv_t **kv, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        wk_kv_free(kv[i]);
        kv[i] = NULL;
    }
}

typedef struct result {
    char test[48];
    int64_t threads;
    double mean, sd;   /* tok/s: all sequences' tokens */
    int64_t n, depth, par;
} result_t;

/* pp: n tokens at positions d.. in batches of n_batch, logits of the last; tg: n
 * tokens one at a time. tokens holds d + n. */
static int eval_span(wk_model_t *m, wk_kv_t *kv, const int32_t *tokens, int64_t d, int64_t n, int is_pp,
                     int want_logits, int64_t n_batch, float *logits, bl_err_t *err)
{
    const int64_t step = is_pp ? n_batch : 1;
    for (int64_t at = 0; at < n; at += step) {
        const int64_t k = n - at < step ? n - at : step;
        int rc = wk_model_eval(m, kv, tokens + d + at, k, d + at, want_logits && (!is_pp || at + k == n) ? 1 : 0,
                               logits, err);
        if (rc)
            return rc;
    }
    return 0;
}

/* One decode step of P sequences at position pos: sequence s's tokens at tokens + s *
 * stride (its token pos there), its logits in row s. */
static int step_rows(wk_model_t *m, wk_kv_t **kv, int64_t P, const int32_t *tokens, int64_t stride, int64_t pos,
                     float *logits, bl_err_t *err)
{
    wk_seq_t seqs[BENCH_MAX_PAR];
    for (int64_t s = 0; s < P; s++)
        seqs[s] = (wk_seq_t){.kv = kv[s], .tokens = tokens + s * stride + pos, .n = 1, .pos = pos, .n_out = 1};
    return wk_model_eval_multi(m, seqs, P, logits, err);
}

/* P sequences' decode: each cache filled with depth random tokens (untimed), then
 * n steps of one row from every sequence through wk_model_eval_multi. logits holds
 * P rows; tokens P * (depth + n). */
static int eval_par(wk_model_t *m, wk_kv_t **kv, int64_t P, const int32_t *tokens, int64_t depth, int64_t n,
                    int64_t n_batch, float *logits, double *secs, bl_err_t *err)
{
    for (int64_t s = 0; s < P; s++) {
        int rc = eval_span(m, kv[s], tokens + s * (depth + n), 0, depth, 1, 0, n_batch, logits, err);
        if (rc)
            return rc;
    }
    const double t0 = now_s();
    for (int64_t i = 0; i < n; i++) {
        int rc = step_rows(m, kv, P, tokens, depth + n, depth + i, logits, err);
        if (rc)
            return rc;
    }
    *secs = now_s() - t0;
    return 0;
}

/* One test: pp or tg of n tokens at depth, with P sequences for tg (kv holds P
 * caches; with P = 1 the single-sequence path, as llama-bench's). */
static int run_test(wk_model_t *m, wk_kv_t **kv, int64_t P, int is_pp, int64_t n, int64_t depth, int64_t n_batch,
                    int64_t reps, float *logits, int32_t *tokens, result_t *r, bl_err_t *err)
{
    const wk_config_t *cfg = wk_model_config(m);
    double sum = 0, sum2 = 0;
    for (int64_t rep = -1; rep < reps; rep++) { /* rep -1: the untimed warm-up */
        for (int64_t i = 0; i < P * (depth + n); i++)
            tokens[i] = (int32_t)(rand() % cfg->n_vocab);
        double secs = 0;
        int rc;
        if (P > 1) {
            rc = eval_par(m, kv, P, tokens, depth, n, n_batch, logits, &secs, err);
        } else {
            rc = eval_span(m, kv[0], tokens, 0, depth, 1, 0, n_batch, logits, err); /* the depth, untimed */
            const double t0 = now_s();
            if (rc == 0)
                rc = eval_span(m, kv[0], tokens, depth, n, is_pp, 1, n_batch, logits, err);
            secs = now_s() - t0;
        }
        if (rc)
            return rc;
        double ts = (double)(P * n) / secs;
        if (rep >= 0) {
            sum += ts;
            sum2 += ts * ts;
        }
    }
    r->mean = sum / (double)reps;
    r->sd = reps > 1 ? sqrt(fmax(0.0, (sum2 - sum * sum / (double)reps) / (double)(reps - 1))) : 0;
    r->n = n;
    r->depth = depth;
    r->par = P;
    int at = snprintf(r->test, sizeof r->test, "%s%lld", is_pp ? "pp" : "tg", (long long)n);
    if (depth > 0)
        at += snprintf(r->test + at, sizeof r->test - (size_t)at, " @ d%lld", (long long)depth);
    if (P > 1)
        snprintf(r->test + at, sizeof r->test - (size_t)at, " x%lld", (long long)P);
    return 0;
}

/* Prints n ops of a profile over steps steps, largest first. */
static void print_profile(wk_prof_op_t *ops, int n, int64_t steps, const char *what, int cpu, double wall_us)
{
    for (int i = 0; i < n; i++) /* largest first */
        for (int j = i + 1; j < n; j++)
            if (ops[j].us > ops[i].us) {
                wk_prof_op_t t = ops[i];
                ops[i] = ops[j];
                ops[j] = t;
            }
    double total = 0, bytes = 0;
    for (int i = 0; i < n; i++) {
        total += ops[i].us;
        bytes += ops[i].bytes;
    }
    if (cpu) {
        printf("\n%s (the clock around each op):\n\n", what);
        printf("| op | calls/step | us/step | share | weight MB/step | GB/s |\n| --- | ---: | ---: | ---: | ---: | ---: |\n");
    } else {
        printf("\n%s (a graph with an event node after each launch):\n\n", what);
        printf("| op | launches/step | us/step | share |\n| --- | ---: | ---: | ---: |\n");
    }
    for (int i = 0; i < n; i++) {
        printf("| %s | %.0f | %.1f | %.1f%% |", ops[i].op, (double)ops[i].calls / (double)steps,
               ops[i].us / (double)steps, 100.0 * ops[i].us / total);
        if (cpu && ops[i].bytes > 0)
            printf(" %.1f | %.1f |", ops[i].bytes / (double)steps / 1e6, ops[i].bytes / (ops[i].us * 1e3));
        else if (cpu)
            printf(" | |");
        printf("\n");
    }
    if (cpu)
        printf("| all | | %.1f | | %.1f | %.1f |\n\n(wall %.1f us per profiled step)\n", total / (double)steps,
               bytes / (double)steps / 1e6, total > 0 ? bytes / (total * 1e3) : 0.0, wall_us);
    else
        printf("| all | | %.1f | |\n\n(wall %.1f us per profiled step, capture included)\n", total / (double)steps,
               wall_us);
}

/* The per-op breakdown of a decode step: 32 steps after a prompt of ctx tokens, printed
 * per step, largest first; with P sequences (the largest -np) each step has a row
 * of each, after a prompt each. On a card each step is captured with an event node
 * after every launch and replayed (timestamps from the card, no host gaps); on the
 * CPU each op is timed on the clock, and the weights it read give its rate. The
 * prompt (ctx rows) is broken down first, on a card by events between its launches. */
static int profile_decode(wk_model_t *m, wk_kv_t **kv, int64_t P, int64_t ctx, float *logits, int cpu,
                          bl_err_t *err)
{
    const wk_config_t *cfg = wk_model_config(m);
    const int64_t steps = 32, per = ctx + steps;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)(P * per));
    if (!tok)
        return bl_err_set(err, BL_ENOMEM, "out of memory");
    for (int64_t i = 0; i < P * per; i++)
        tok[i] = (int32_t)(rand() % cfg->n_vocab);
    wk_prof_op_t ops[64];
    (void)wk_model_profile(m, ops, 64, 1); /* drop anything before */
    wk_model_set_profile(m, 1);
    double t0 = now_s();
    int rc = 0;
    for (int64_t s = 0; rc == 0 && s < P; s++)
        rc = wk_model_eval(m, kv[s], tok + s * per, ctx, 0, 1, logits, err);
    if (rc == 0) {
        const double wall_us = (now_s() - t0) * 1e6 / (double)P;
        const int n = wk_model_profile(m, ops, 64, 1);
        char what[96];
        snprintf(what, sizeof what, "prompt step breakdown (%lld rows in steps of -b)", (long long)ctx);
        print_profile(ops, n > 64 ? 64 : n, P, what, cpu, wall_us);
    }
    (void)wk_model_profile(m, ops, 64, 1);
    wk_model_set_profile(m, 1);
    t0 = now_s();
    for (int64_t i = 0; rc == 0 && i < steps; i++)
        rc = step_rows(m, kv, P, tok, per, ctx + i, logits, err);
    const double wall_us = (now_s() - t0) * 1e6 / (double)steps;
    wk_model_set_profile(m, 0);
    free(tok);
    if (rc)
        return rc;
    const int n = wk_model_profile(m, ops, 64, 1);
    char what[96];
    snprintf(what, sizeof what, "decode step breakdown (context %lld, %lld steps of %lld row%s)", (long long)ctx,
             (long long)steps, (long long)P, P == 1 ? "" : "s");
    print_profile(ops, n > 64 ? 64 : n, steps, what, cpu, wall_us);
    return 0;
}

/* What the disk pager did during one test (the stats before and after it): its hit
 * rate and its read rate while reading, and for a decode test the bytes a token read
 * (the untimed warm-up run included). */
static void pager_line(const char *test, const ht_store_pager_stats_t *a, const ht_store_pager_stats_t *b,
                       int64_t tokens)
{
    const uint64_t hits = b->hits - a->hits, reads = b->misses - a->misses, bytes = b->bytes_read - a->bytes_read;
    const double s = (double)(b->read_ns - a->read_ns) / 1e9;
    fprintf(stderr, "bloomery-bench: pager: %s (%s, %lld slots): %llu hits, %llu reads, hit rate %.1f%%, "
            "%.1f MB read at %.0f MB/s",
            test, b->backend, (long long)b->slots, (unsigned long long)hits, (unsigned long long)reads,
            hits + reads ? 100.0 * (double)hits / (double)(hits + reads) : 0.0, (double)bytes / 1e6,
            s > 0 ? (double)bytes / 1e6 / s : 0.0);
    if (tokens > 0)
        fprintf(stderr, ", %.1f MB a token", (double)bytes / 1e6 / (double)tokens);
    if (b->ahead)
        fprintf(stderr, ", read ahead %llu (%llu used)", (unsigned long long)(b->ahead_reads - a->ahead_reads),
                (unsigned long long)(b->ahead_used - a->ahead_used));
    fputc('\n', stderr);
}

int main(int argc, char **argv)
{
    static bench_t b;
    b.pp = (list_t){{512}, 1};
    b.tg = (list_t){{128}, 1};
    b.depth = (list_t){{0}, 1};
    b.threads = (list_t){{0}, 1}; /* not given: one per physical core, after -C */
    b.reps = 5;
    b.n_batch = 512;
    b.poll = KCPU_POLL_DEFAULT;
    b.output = "md";
    b.krows = (list_t){{1, 4, 8}, 3};
    b.par = (list_t){{1}, 1};
    b.att_heads = "32,4";
    b.att_head_dim = 128;
    b.att_layers = 48;
    bl_arg_t args[56] = {
        {"-m,--model", NULL, BL_ARG_STR, &b.model, .metavar = "FILE", .help = "model file (GGUF)"},
        {"-p,--n-prompt", NULL, BL_ARG_FN, NULL, .fn = parse_list, .ud = &b.pp, .metavar = "N[,N...]", .help = "prompt lengths to test (default 512; 0: none)"},
        {"-n,--n-gen", NULL, BL_ARG_FN, NULL, .fn = parse_list, .ud = &b.tg, .metavar = "N[,N...]", .help = "decode lengths to test (default 128; 0: none)"},
        {"-np,--parallel", NULL, BL_ARG_FN, NULL, .fn = parse_par, .ud = &b.par, .metavar = "N[,N...]", .help = "sequences a tg test decodes together, each with its own cache and a row of every step, as the server's slots (default 1); the rate counts all of them (\"tg128 x8\"); --profile breaks down a step of the largest"},
        {"-d,--n-depth", NULL, BL_ARG_FN, NULL, .fn = parse_depths, .ud = &b.depth, .metavar = "N[,N...]", .help = "cached positions each test starts from (default 0), filled untimed before every run"},
        {"-t,--threads", NULL, BL_ARG_FN, NULL, .fn = parse_list, .ud = &b.threads, .metavar = "N[,N...]", .help = "thread counts (default: one per physical core of the CPUs it may use)"},
        {"-r,--repetitions", NULL, BL_ARG_I64, &b.reps, 1, 1000, .metavar = "N", .help = "timed runs per test (default 5)"},
        {"-b,--batch-size", NULL, BL_ARG_I64, &b.n_batch, 1, 1 << 16, .metavar = "N", .help = "prompt rows per forward pass (default 512)"},
        {"--poll", NULL, BL_ARG_I64, &b.poll, 0, 100, .metavar = "0..100", .help = "how the CPU pools' idle threads wait: they yield for 4 us per level before they sleep (default 50, as llama.cpp's)"},
        {"-o,--output", NULL, BL_ARG_STR, &b.output, .metavar = "md|jsonl", .help = "table format (default md)"},
        {"--precise", NULL, BL_ARG_FLAG, &b.precise, .help = "f32 activations (the checking mode)"},
        {"--mtp", NULL, BL_ARG_FLAG, &b.mtp, .help = "run the model's NextN layer after every step, as --spec-type draft-mtp does (glm4moe, qwen35moe; the CPU): the rates include its pass, the backend column says +NextN"},
        {"--no-roofline", NULL, BL_ARG_FLAG, &b.no_roofline, .help = "skip the bandwidth measurement"},
        {"-fa,--flash-attn", NULL, BL_ARG_FN, NULL, .fn = bl_arg_flash_attn, .ud = &b.flash_attn, .metavar = "on|off|auto|1|0", .help = "on a GPU: prompt attention as one flash kernel (on), as score/softmax/value pieces (off), flash where the head size has it (auto, default); the CPU computes the same either way"},
        {"--kernels", NULL, BL_ARG_FLAG, &b.kernels, .help = "no model: the rate each CPU kernel set streams routed experts' weights (q4_K, q5_K, q6_K, q8_0, mxfp4; 1 GiB each) beside the read bandwidth"},
        {"--kernel-rows", NULL, BL_ARG_FN, NULL, .fn = parse_list, .ud = &b.krows, .metavar = "N[,N...]", .help = "with --kernels: rows per expert to test (default 1,4,8)"},
        {"--disk", NULL, BL_ARG_FLAG, &b.disk, .help = "the model file's read rates through the disk pager's reader instead of a model run: sequential 1 MiB reads and random whole routed experts at depths 1, 4 and 16 (O_DIRECT where the file system takes it)"},
        {"--profile", NULL, BL_ARG_FLAG, &b.profile, .help = "time each op of the prompt of the deepest -d (512 without one) and of 32 decode steps after it and print their breakdowns (on the CPU with the weight bytes and rate of each op)"},
        {"--attention", NULL, BL_ARG_FLAG, &b.attention, .help = "no model: the decode step's attention alone on the card (-mg), at each -d depth and -np rows, over --att-layers caches of --att-heads and --att-head-dim, -r replays of the layers' graph; the knobs BLOOMERY_CUDA_ATT_* apply"},
        {"--att-heads", NULL, BL_ARG_STR, &b.att_heads, .metavar = "Q,KV", .help = "with --attention: query heads and KV heads (default 32,4: Qwen3-30B-A3B's)"},
        {"--att-head-dim", NULL, BL_ARG_I64, &b.att_head_dim, 32, 256, .metavar = "N", .help = "with --attention: head size, 32, 64, 128 or 256 (default 128)"},
        {"--att-layers", NULL, BL_ARG_I64, &b.att_layers, 1, 1024, .metavar = "N", .help = "with --attention: layers a step takes, each over its own cache (default 48)"},
        {"-c,--ctx-size", NULL, BL_ARG_I64, &b.ctx, 1, INT32_MAX, .metavar = "N", .help = "with --attention: the context the worker would hold, which caps the attention grid (default: the largest depth + 1)"},
    };
    int n_args = 0;
    while (args[n_args].names)
        n_args++;
    if (bl_plan_args(args, &n_args, (int)(sizeof args / sizeof args[0]), &b.place) != 0 ||
        bl_cpu_args(args, &n_args, (int)(sizeof args / sizeof args[0]), &b.cpu) != 0)
        abort(); /* the table is sized for them */
    bl_err_t err = {0};
    int help = 0;
    if (bl_args_parse(args, n_args, argc, argv, NULL, &help, &err)) {
        fprintf(stderr, "bloomery-bench: %s (see --help)\n", err.msg);
        return 2;
    }
    if (help) {
        if (help == BL_ARGS_VERSION)
            return 0;
        bl_args_usage(stdout, "bloomery-bench", "-m FILE [options]", args, n_args);
        return 0;
    }
    if (!b.model && !b.kernels && !b.attention) {
        fprintf(stderr, "bloomery-bench: -m FILE is required (see --help)\n");
        return 2;
    }
    if (bl_cpu_flags_apply(&b.cpu, &err) != 0) {
        fprintf(stderr, "bloomery-bench: %s\n", err.msg);
        return 1;
    }
    if (b.threads.n == 1 && b.threads.v[0] == 0)
        b.threads.v[0] = bl_cpu_default_threads();
    int md = !strcmp(b.output, "md");
    if (!md && strcmp(b.output, "jsonl")) {
        fprintf(stderr, "bloomery-bench: -o: '%s' is not md or jsonl\n", b.output);
        return 2;
    }
    for (int i = 0; i < b.threads.n; i++)
        if (b.threads.v[i] > 256) {
            fprintf(stderr, "bloomery-bench: -t: %lld threads is more than 256\n",
                    (long long)b.threads.v[i]);
            return 2;
        }

    if (b.disk)
        return bench_disk(b.model, b.reps, md);
    if (b.attention) {
        long long q = 0, kv = 0;
        char tail = 0;
        if (sscanf(b.att_heads, "%lld,%lld%c", &q, &kv, &tail) != 2 || q < 1 || kv < 1 || q > 1024 || q % kv != 0) {
            fprintf(stderr, "bloomery-bench: --att-heads: '%s' is not Q,KV with KV dividing Q (1..1024)\n",
                    b.att_heads);
            return 2;
        }
        if (b.att_head_dim != 32 && b.att_head_dim != 64 && b.att_head_dim != 128 && b.att_head_dim != 256) {
            fprintf(stderr, "bloomery-bench: --att-head-dim: %lld (32, 64, 128 or 256)\n", (long long)b.att_head_dim);
            return 2;
        }
        for (int i = 0; i < b.par.n; i++)
            if (b.par.v[i] > 64) {
                fprintf(stderr, "bloomery-bench: -np: %lld rows is more than --attention takes (64)\n",
                        (long long)b.par.v[i]);
                return 2;
            }
        const bench_att_t a = {.depths = b.depth.v, .n_depths = b.depth.n, .rows = b.par.v, .n_rows = b.par.n,
                               .n_head = q, .n_kv_head = kv, .head_dim = b.att_head_dim, .ctx = b.ctx,
                               .layers = b.att_layers, .reps = b.reps, .device = (int)b.place.main_gpu,
                               .roofline = !b.no_roofline, .md = md};
        return bench_attention(&a);
    }
    if (b.kernels) {
        for (int i = 0; i < b.krows.n; i++)
            if (b.krows.v[i] > 64) {
                fprintf(stderr, "bloomery-bench: --kernel-rows: %lld is more than 64\n", (long long)b.krows.v[i]);
                return 2;
            }
        return bench_kernels(b.threads.v, b.threads.n, b.krows.v, b.krows.n, b.reps, (size_t)1 << 30,
                             b.no_roofline ? NULL : measure_read_bandwidth, md);
    }

    int64_t max_n = 1;
    for (int i = 0; i < b.pp.n; i++)
        max_n = b.pp.v[i] > max_n ? b.pp.v[i] : max_n;
    for (int i = 0; i < b.tg.n; i++)
        max_n = b.tg.v[i] > max_n ? b.tg.v[i] : max_n;
    int64_t max_d = 0;
    for (int i = 0; i < b.depth.n; i++)
        max_d = b.depth.v[i] > max_d ? b.depth.v[i] : max_d;
    int64_t max_p = 1;
    for (int i = 0; i < b.par.n; i++) {
        if (b.par.v[i] > BENCH_MAX_PAR || b.par.v[i] > b.n_batch) {
            fprintf(stderr, "bloomery-bench: -np: %lld sequences is more than %lld (at most %d, and at most -b)\n",
                    (long long)b.par.v[i], (long long)(b.n_batch < BENCH_MAX_PAR ? b.n_batch : BENCH_MAX_PAR),
                    BENCH_MAX_PAR);
            return 2;
        }
        max_p = b.par.v[i] > max_p ? b.par.v[i] : max_p;
    }

    /* Where the layers go: the server's plan from the same flags, for one stage. */
    bl_place_opts_t po = {.n_ctx_total = max_p * (max_d + max_n + (b.profile ? 544 : 0)), .kv_elem_bytes = 2.0,
                          .n_batch = b.n_batch};
    static wk_place_t place; /* the plan's device and host-expert layers */
    {
        char text[4096];
        if (bl_plan_opts(&po, &b.place, &err) ||
            wk_place_one(b.model, &po, &place, text, sizeof text, &err)) {
            fprintf(stderr, "bloomery-bench: %s\n", err.msg);
            return 1;
        }
        for (char *line = text, *nl; (nl = strchr(line, '\n')); line = nl + 1)
            fprintf(stderr, "bloomery-bench: plan: %.*s\n", (int)(nl - line), line);
    }

    srand(1);
    int rc = 1;
    int32_t *tokens = malloc((size_t)(max_p * (max_d + max_n)) * sizeof *tokens);
    wk_kv_t **kv = calloc((size_t)max_p, sizeof *kv);
    float *logits = NULL;
    double tg_best = 0;
    int64_t tg_best_n = 0, tg_best_threads = 0, tg_best_depth = 0;
    char tg_best_test[sizeof ((result_t *)0)->test] = "";
    model_bytes_t mb = {0};
    double dev_bw = 0;
    char dev_name[256] = "";
    char ftype[32] = "?";
    char arch[16] = "?";
    if (!tokens || !kv)
        goto oom;
    if (md) {
        printf("| model | size | params | backend | threads | test | t/s |\n");
        printf("| --- | ---: | ---: | --- | ---: | ---: | ---: |\n");
        fflush(stdout);
    }
    for (int ti = 0; ti < b.threads.n; ti++) {
        wk_model_opts_t mo;
        wk_model_opts_default(&mo);
        mo.precise = b.precise;
        mo.mtp = b.mtp;
        mo.n_threads = (int)b.threads.v[ti];
        mo.n_batch = b.n_batch;
        mo.poll = (int)b.poll;
        mo.cpu_strict = (int)b.cpu.strict;
        mo.experts_vram = b.place.experts_vram;
        mo.residency = !b.place.no_residency;
        mo.n_ctx_max = max_d + max_n + (b.profile ? 544 : 0);
        mo.flash_attn = b.flash_attn;
        wk_placed_t pl;
        bl_progress_t bar; /* on a terminal */
        bl_progress_begin(&bar, BL_PROGRESS_BAR, "loading", "", 0, 0);
        mo.progress = bl_progress_phases;
        mo.progress_ud = &bar;
        const int lrc = wk_load_placed(&pl, b.model, &mo, &place, &err);
        bl_progress_end(&bar, lrc == 0);
        int kv_rc = lrc;
        for (int64_t s = 0; kv_rc == 0 && s < max_p; s++)
            kv_rc = wk_kv_create(&kv[s], pl.m, mo.n_ctx_max, WK_KV_F16, &err);
        if (kv_rc) {
            kv_free_all(kv, max_p);
            wk_placed_free(&pl);
            fprintf(stderr, "bloomery-bench: %s\n", err.msg);
            goto done;
        }
        wk_model_t *m = pl.m;
        const wk_config_t *cfg = wk_model_config(m);
        mb = count_bytes(wk_model_gguf(m), cfg);
        ftype_name(wk_model_gguf(m), ftype, sizeof ftype);
        snprintf(arch, sizeof arch, "%s", cfg->arch);
        free(logits);
        logits = malloc((size_t)(max_p * cfg->n_vocab) * sizeof *logits);
        if (!logits) {
            kv_free_all(kv, max_p);
            wk_placed_free(&pl);
            goto oom;
        }
        for (int pass = 0; pass < 2; pass++) {
            const list_t *l = pass == 0 ? &b.pp : &b.tg;
            const int np = pass == 0 ? 1 : b.par.n; /* prompts: one sequence */
            for (int i = 0; i < l->n * b.depth.n * np; i++) {
                result_t res, *r = &res;
                const int64_t P = pass == 0 ? 1 : b.par.v[i % np], n = l->v[i / np / b.depth.n],
                              depth = b.depth.v[i / np % b.depth.n];
                r->threads = b.threads.v[ti];
                ht_store_pager_stats_t ps0 = {0}, ps1 = {0};
                if (pl.ex)
                    ht_store_pager_stats(pl.ex, &ps0);
                if (run_test(m, kv, P, pass == 0, n, depth, b.n_batch, b.reps, logits, tokens, r, &err)) {
                    fprintf(stderr, "bloomery-bench: %s\n", err.msg);
                    kv_free_all(kv, max_p);
                    wk_placed_free(&pl);
                    goto done;
                }
                if (pl.ex)
                    ht_store_pager_stats(pl.ex, &ps1);
                if (ps1.paged)
                    pager_line(r->test, &ps0, &ps1, pass == 1 && r->depth == 0 ? r->n * (b.reps + 1) : 0);
                if (pass == 1 && P == 1 && r->mean > tg_best) { /* the roofline is one sequence's */
                    tg_best = r->mean;
                    tg_best_n = r->n;
                    tg_best_threads = r->threads;
                    tg_best_depth = r->depth;
                    memcpy(tg_best_test, r->test, sizeof tg_best_test);
                }
                char backend[48], tier[16] = "";
                if (pl.tier)
                    snprintf(tier, sizeof tier, "+CUDA%d", place.tier_device);
                snprintf(backend, sizeof backend, "%s%s%s%s", place.device >= 0 ? "CUDA" : "CPU", tier,
                         pl.ex ? "+host" : "", b.mtp ? "+NextN" : "");
                if (md)
                    printf("| %s %.2fB %s | %.2f GiB | %.2f B | %s (%s) | %lld | %s | %.2f ± %.2f |\n",
                           arch, mb.params / 1e9, ftype, mb.total / (1 << 30), mb.params / 1e9, backend,
                           wk_model_kernels(m), (long long)r->threads, r->test, r->mean, r->sd);
                else
                    printf("{\"model\":\"%s\",\"arch\":\"%s\",\"size\":%.0f,\"params\":%.0f,\"backend\":\"%s\",\"kernels\":\"%s\",\"threads\":%lld,\"test\":\"%s\",\"n\":%lld,\"n_depth\":%lld,\"n_parallel\":%lld,\"reps\":%lld,\"avg_ts\":%.3f,\"stddev_ts\":%.3f}\n",
                           b.model, arch, mb.total, mb.params, backend, wk_model_kernels(m),
                           (long long)r->threads, r->test, (long long)r->n, (long long)r->depth, (long long)r->par,
                           (long long)b.reps, r->mean, r->sd);
                fflush(stdout);
            }
        }
        if (place.device >= 0 && !b.no_roofline &&
            wk_model_device_bandwidth(m, (size_t)1 << 30, &dev_bw, &err) != 0)
            fprintf(stderr, "bloomery-bench: device bandwidth: %s\n", err.msg);
        snprintf(dev_name, sizeof dev_name, "%s", wk_model_kernels(m));
        /* at the deepest -d (where attention's share is the question), else 512 */
        if (b.profile && profile_decode(m, kv, max_p, max_d > 0 ? max_d : 512, logits, place.device < 0, &err) != 0)
            fprintf(stderr, "bloomery-bench: profile: %s\n", err.msg);
        kv_free_all(kv, max_p);
        wk_placed_free(&pl);
    }

    if (!b.no_roofline && tg_best > 0) {
        double bw = place.device >= 0 ? dev_bw : measure_read_bandwidth((int)tg_best_threads);
        /* a tg run of n tokens at depth d reads on average d + n/2 cached positions per token */
        double kv_bytes = mb.kv_per_pos * ((double)tg_best_depth + (double)tg_best_n / 2.0);
        double per_token = mb.per_token + kv_bytes;
        double limit = bw / per_token;
        if (md)
            printf("\ndecode roofline: a token reads %.1f MB (weights %.1f MB, KV cache %.2f MB at %s); "
                   "%s %.1f GB/s%s: at most %.1f tok/s; "
                   "%s reached %.2f tok/s = %.0f%% of it (%.0f GB/s achieved)\n",
                   per_token / 1e6, mb.per_token / 1e6, kv_bytes / 1e6, tg_best_test,
                   place.device >= 0 ? dev_name : "memory read bandwidth", bw / 1e9,
                   place.device >= 0 ? " device-to-device copy (read + write)" : thr_note(tg_best_threads),
                   limit, tg_best_test, tg_best, 100.0 * tg_best / limit,
                   tg_best * per_token / 1e9);
        else
            printf("{\"roofline\":{\"bytes_per_token\":%.0f,\"weights_per_token\":%.0f,\"read_bandwidth\":%.0f,\"threads\":%lld,\"max_ts\":%.3f,\"tg_ts\":%.3f,\"fraction\":%.4f}}\n",
                   per_token, mb.per_token, bw, (long long)tg_best_threads, limit, tg_best,
                   tg_best / limit);
    }
    rc = 0;
    goto done;
oom:
    fprintf(stderr, "bloomery-bench: out of memory\n");
done:
    free(tokens);
    free(kv);
    free(logits);
    return rc;
}
