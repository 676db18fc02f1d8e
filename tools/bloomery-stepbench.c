/* bloomery-stepbench: the cost of the process split per decode step at batch 1. The
 * same decode steps run in this process (wk_model_eval) and through the engine's
 * processes (rt_cluster_step: router -> workers (+ hosttier) -> logits over the
 * rings), alternating step by step; the table gives the median and p99 step time of
 * each and of the paired difference (cluster step minus the in-process step before it).
 * The logits of every step are hashed on both paths and must agree bit for bit. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "args.h"
#include "cluster.h"
#include "wk.h"

#define N_PROMPT 8
#define N_WARMUP 3

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median and p99 of n samples (sorted in place). */
static void quantiles(double *v, int n, double *med, double *p99)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    *med = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    int i = (int)((double)(n - 1) * 0.99 + 0.5);
    *p99 = v[i];
}

static uint64_t hash(const float *x, int64_t n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a over the bytes */
    const unsigned char *p = (const unsigned char *)x;
    for (int64_t i = 0; i < n * (int64_t)sizeof(float); i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static int32_t token_at(int64_t i, int64_t n_vocab)
{
    return (int32_t)((i * 7919 + 13) % n_vocab);
}

/* Both paths side by side: the model in this process with its cache, and the
 * cluster with one slot. Steps alternate between them, so that a busy machine slows
 * both alike. */
typedef struct bench {
    wk_model_t *m;
    wk_kv_t *kv;
    float *logits;
    rt_cluster_t *c;
    int64_t n_vocab;
    char rundir[64];
} bench_t;

static int bench_open(bench_t *b, const char *model, const char *bin_dir, int threads,
                      int workers, int n, int hosttier, bl_err_t *err)
{
    wk_model_opts_t mo;
    wk_model_opts_default(&mo);
    mo.n_threads = threads;
    mo.n_batch = 64;
    mo.n_ctx_max = N_PROMPT + n;
    int rc = wk_model_load(&b->m, model, &mo, err);
    if (rc == 0)
        rc = wk_kv_create(&b->kv, b->m, N_PROMPT + n, WK_KV_F16, err);
    if (rc)
        return rc;
    b->n_vocab = wk_model_config(b->m)->n_vocab;
    if (!(b->logits = malloc((size_t)b->n_vocab * sizeof(float))))
        return bl_err_set(err, BL_ENOMEM, "out of memory");
    snprintf(b->rundir, sizeof b->rundir, "/tmp/bloomery-stepbench-%d", (int)getpid());
    static rt_cluster_opts_t o;
    o = (rt_cluster_opts_t){.model_path = model, .bin_dir = bin_dir, .runtime_dir = b->rundir,
                            .n_workers = workers, .n_threads = threads, .n_threads_batch = threads,
                            .n_threads_hosttier = threads, .poll = 50 /* llama.cpp's default */, .n_slots = 1,
                            .n_ctx_slot = N_PROMPT + n, .n_batch = 64, .kv_type = WK_KV_F16,
                            .experts_vram = BL_EXPERTS_VRAM_AUTO};
    memset(o.host_layers, hosttier ? 1 : 0, sizeof o.host_layers); /* every layer's experts there, or none */
    if ((rc = rt_cluster_create(&b->c, &o, err)) != 0)
        return rc;
    if (rt_cluster_wait(b->c, -1) != RT_CLUSTER_READY) {
        char why[512];
        return bl_err_set(err, BL_EIO, "cluster: %s", rt_cluster_error(b->c, why, sizeof why));
    }
    return 0;
}

static void bench_close(bench_t *b)
{
    rt_cluster_destroy(b->c);
    rmdir(b->rundir);
    free(b->logits);
    wk_kv_free(b->kv);
    wk_model_free(b->m);
}

/* A prompt, then n decode steps on each path, alternating; lat[k][i] and sums[k][i]
 * for path k (0: in process, 1: cluster). */
static int bench_run(bench_t *b, int n, double *lat[2], uint64_t *sums[2], bl_err_t *err)
{
    int32_t prompt[N_PROMPT];
    for (int i = 0; i < N_PROMPT; i++)
        prompt[i] = token_at(i, b->n_vocab);
    const float *lg;
    rt_step_seq_t s = {.slot = 0, .n = N_PROMPT, .pos = 0, .n_out = 1, .tokens = prompt};
    int rc = wk_model_eval(b->m, b->kv, prompt, N_PROMPT, 0, 1, b->logits, err);
    if (rc == 0)
        rc = rt_cluster_step(b->c, &s, 1, &lg, err);
    for (int i = 0; rc == 0 && i < n; i++) {
        int32_t t = token_at(N_PROMPT + i, b->n_vocab);
        double t0 = now_us();
        rc = wk_model_eval(b->m, b->kv, &t, 1, N_PROMPT + i, 1, b->logits, err);
        double t1 = now_us();
        if (rc)
            break;
        sums[0][i] = hash(b->logits, b->n_vocab);
        s = (rt_step_seq_t){.slot = 0, .n = 1, .pos = N_PROMPT + i, .n_out = 1, .tokens = &t};
        double t2 = now_us();
        rc = rt_cluster_step(b->c, &s, 1, &lg, err);
        double t3 = now_us();
        if (rc)
            break;
        sums[1][i] = hash(lg, b->n_vocab);
        lat[0][i] = t1 - t0;
        lat[1][i] = t3 - t2;
    }
    return rc;
}

/* The folder of this program: where `make` puts bloomery-worker and -hosttier too. */
static void own_dir(char *buf, size_t cap)
{
    ssize_t n = readlink("/proc/self/exe", buf, cap - 1);
    buf[n > 0 ? n : 0] = '\0';
    char *slash = strrchr(buf, '/');
    if (slash)
        *slash = '\0';
    else
        snprintf(buf, cap, ".");
}

int main(int argc, char **argv)
{
    const char *model = NULL, *bin_dir = NULL;
    int64_t threads = 1, n = 100, workers = 1;
    int help = 0, hosttier = 0;
    bl_arg_t args[] = {
        {"-m,--model", NULL, BL_ARG_STR, &model, .metavar = "FILE", .help = "model file (GGUF)"},
        {"-t,--threads", NULL, BL_ARG_I64, &threads, 1, 256, .metavar = "N", .help = "threads per process (default 1)"},
        {"-n,--n-steps", NULL, BL_ARG_I64, &n, N_WARMUP + 1, 100000, .metavar = "N", .help = "decode steps per path (default 100)"},
        {"--workers", NULL, BL_ARG_I64, &workers, 1, 64, .metavar = "N", .help = "pipeline stages (default 1)"},
        {"--bin-dir", NULL, BL_ARG_STR, &bin_dir, .metavar = "DIR", .help = "folder of bloomery-worker and -hosttier (default: this program's)"},
        {"--hosttier", NULL, BL_ARG_FLAG, &hosttier, .help = "every layer's routed experts in the hosttier (default: in the worker, as -ngl 0 places them)"},
    };
    int n_args = (int)(sizeof args / sizeof args[0]);
    bl_err_t err = {0};
    if (bl_args_parse(args, n_args, argc, argv, NULL, &help, &err)) {
        fprintf(stderr, "bloomery-stepbench: %s\n", err.msg);
        return 2;
    }
    if (help || !model) {
        bl_args_usage(help ? stdout : stderr, "bloomery-stepbench", "-m FILE [options]", args,
                      n_args);
        return help ? 0 : 2;
    }
    char self[PATH_MAX];
    own_dir(self, sizeof self);
    if (!bin_dir)
        bin_dir = self;

    double *lat[2] = {calloc((size_t)n, sizeof(double)), calloc((size_t)n, sizeof(double))};
    uint64_t *sums[2] = {calloc((size_t)n, sizeof(uint64_t)), calloc((size_t)n, sizeof(uint64_t))};
    if (!lat[0] || !lat[1] || !sums[0] || !sums[1]) {
        fprintf(stderr, "bloomery-stepbench: out of memory\n");
        return 1;
    }
    bench_t b = {0};
    int rc = bench_open(&b, model, bin_dir, (int)threads, (int)workers, (int)n, hosttier, &err);
    if (rc == 0)
        rc = bench_run(&b, (int)n, lat, sums, &err);
    bench_close(&b);
    if (rc) {
        fprintf(stderr, "bloomery-stepbench: %s\n", err.msg);
        return 1;
    }
    int same = memcmp(sums[0], sums[1], (size_t)n * sizeof(uint64_t)) == 0;
    double med[3], p99[3];
    int timed = (int)n - N_WARMUP;
    double *diff = calloc((size_t)n, sizeof(double));
    if (!diff)
        return 1;
    for (int i = 0; i < (int)n; i++)
        diff[i] = lat[1][i] - lat[0][i];
    for (int k = 0; k < 2; k++)
        quantiles(lat[k] + N_WARMUP, timed, &med[k], &p99[k]);
    quantiles(diff + N_WARMUP, timed, &med[2], &p99[2]);
    free(diff);

    printf("model: %s\nthreads: %lld, workers: %lld, decode steps timed: %d (after %d untimed)\n\n",
           model, (long long)threads, (long long)workers, timed, N_WARMUP);
    printf("| path                          | median us | p99 us |\n");
    printf("| ----------------------------- | --------: | -----: |\n");
    printf("| in process (wk_model_eval)    | %9.1f | %6.1f |\n", med[0], p99[0]);
    printf("| through the rings (processes) | %9.1f | %6.1f |\n", med[1], p99[1]);
    printf("| difference (paired steps)     | %9.1f | %6.1f |\n", med[2], p99[2]);
    printf("\nsplit cost: %.1f %% of the in-process median (paired); logits bit-identical: %s\n",
           100.0 * med[2] / med[0], same ? "yes" : "NO");
    for (int k = 0; k < 2; k++) {
        free(lat[k]);
        free(sums[k]);
    }
    return same ? 0 : 1;
}
