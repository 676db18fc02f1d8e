/* bloomery-bench --kernels: the rate at which the CPU kernel sets stream routed
 * experts' weights through the products a MoE layer runs, beside the memory read
 * bandwidth of the same threads. No model file: the weights are random blocks of
 * each format (valid scales, random quants) in a buffer well past the caches, cut
 * into experts of Qwen3-30B-A3B's gate shape (768 rows of 2048 columns), and one
 * pass is what a decode step does per layer, 8 experts' gate and up in one
 * kcpu_matmul_many, walked over the whole buffer so that every byte comes from
 * memory. Rows per expert is the batch: 1 for a decode token, more where several
 * rows of a step share an expert. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_kernels.h"
#include "blocks.h"
#include "kcpu.h"
#include "quant.h"

#define EXPERT_ROWS 768
#define EXPERT_COLS 2048
#define EXPERTS_PER_PASS 8

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* xorshift64*: fast, and different on every run (seeded from the clock). */
static uint64_t rnd(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545f4914f6cdd1dull;
}

/* Random bytes, then each block's scale fields set to finite values of a trained
 * model's size, so that no product meets an infinity or a NaN. */
static void fill_blocks(uint8_t *p, size_t bytes, uint32_t type, size_t block_bytes, uint64_t *seed)
{
    for (size_t i = 0; i + 8 <= bytes; i += 8) {
        const uint64_t v = rnd(seed);
        memcpy(p + i, &v, 8);
    }
    const uint16_t d = bl_fp32_to_fp16(1.0f / 4096), dmin = bl_fp32_to_fp16(1.0f / 8192);
    for (size_t at = 0; at + block_bytes <= bytes; at += block_bytes) {
        uint8_t *b = p + at;
        switch (type) {
        case BL_TYPE_Q4_K:
            memcpy(b + offsetof(bl_block_q4_K, d), &d, 2);
            memcpy(b + offsetof(bl_block_q4_K, dmin), &dmin, 2);
            break;
        case BL_TYPE_Q5_K:
            memcpy(b + offsetof(bl_block_q5_K, d), &d, 2);
            memcpy(b + offsetof(bl_block_q5_K, dmin), &dmin, 2);
            break;
        case BL_TYPE_Q6_K:
            memcpy(b + offsetof(bl_block_q6_K, d), &d, 2);
            break;
        case BL_TYPE_Q8_0:
            memcpy(b + offsetof(bl_block_q8_0, d), &d, 2);
            break;
        case BL_TYPE_MXFP4:
            b[offsetof(bl_block_mxfp4, e)] = 116; /* 2^-12 */
            break;
        }
    }
}

typedef struct kfmt {
    const char *name;
    uint32_t type;
} kfmt_t;

int bench_kernels(const int64_t *threads, int n_threads, const int64_t *rows, int n_rows, int64_t reps,
                  size_t buf_bytes, double (*read_bw)(int), int md)
{
    static const kfmt_t fmts[] = {
        {"q4_K", BL_TYPE_Q4_K}, {"q5_K", BL_TYPE_Q5_K}, {"q6_K", BL_TYPE_Q6_K}, {"q8_0", BL_TYPE_Q8_0}, {"mxfp4", BL_TYPE_MXFP4}};
    static const char *sets[] = {"avx2", "avx512"};
    const int n_fmts = (int)(sizeof fmts / sizeof fmts[0]);
    int64_t max_rows = 1;
    for (int i = 0; i < n_rows; i++)
        max_rows = rows[i] > max_rows ? rows[i] : max_rows;
    uint64_t seed = (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull | 1;
    fprintf(stderr, "bloomery-bench: kernels: seed %llu, %zu MiB of weights per format\n",
            (unsigned long long)seed, buf_bytes >> 20);
    uint8_t *buf = aligned_alloc(4096, (buf_bytes + 4095) / 4096 * 4096);
    float *x = malloc(sizeof(float) * (size_t)(max_rows * EXPERT_COLS));
    float *y = malloc(sizeof(float) * (size_t)(max_rows * EXPERT_ROWS * 2 * EXPERTS_PER_PASS));
    int32_t *idx = malloc(sizeof(int32_t) * (size_t)max_rows);
    if (!buf || !x || !y || !idx) {
        fprintf(stderr, "bloomery-bench: out of memory for the kernel benchmark\n");
        free(buf), free(x), free(y), free(idx);
        return 1;
    }
    for (int64_t i = 0; i < max_rows * EXPERT_COLS; i++)
        x[i] = (float)((double)(rnd(&seed) >> 11) / 9007199254740992.0 * 2 - 1);
    for (int64_t i = 0; i < max_rows; i++)
        idx[i] = (int32_t)i;
    if (md) {
        printf("| set | format | threads | rows/expert | GB/s | read GB/s | share |\n");
        printf("| --- | --- | ---: | ---: | ---: | ---: | ---: |\n");
    }
    int rc = 0;
    for (int ti = 0; ti < n_threads && !rc; ti++) {
        const int nt = (int)threads[ti];
        const double bw = read_bw ? read_bw(nt) : 0;
        kcpu_ctx_t *c = NULL;
        bl_err_t err = {0};
        const kcpu_limits_t lim = {.max_cols = EXPERT_COLS, .max_batch = max_rows * 2, .max_ctx = 1, .head_dim = 128};
        if (kcpu_ctx_create(&c, nt, KCPU_FAST16, &lim, &err) != 0) {
            fprintf(stderr, "bloomery-bench: %s\n", err.msg);
            rc = 1;
            break;
        }
        for (int fi = 0; fi < n_fmts && !rc; fi++) {
            const bl_type_info_t *tinfo = bl_type_info(fmts[fi].type);
            kcpu_mat_t all;
            size_t rb = 0;
            if (bl_row_bytes(fmts[fi].type, EXPERT_COLS, &rb, &err) != 0) {
                fprintf(stderr, "bloomery-bench: kernels: %s\n", err.msg);
                rc = 1;
                break;
            }
            const int64_t row_bytes = (int64_t)rb;
            /* matrices of EXPERT_ROWS rows: an expert's gate and up are two */
            const int64_t n_mat = (int64_t)(buf_bytes / (size_t)(row_bytes * EXPERT_ROWS));
            if (n_mat < 2 * EXPERTS_PER_PASS ||
                kcpu_mat_init(&all, buf, fmts[fi].type, EXPERT_COLS, n_mat * EXPERT_ROWS, &err) != 0) {
                fprintf(stderr, "bloomery-bench: kernels: %s: buffer of %zu bytes too small\n", fmts[fi].name,
                        buf_bytes);
                rc = 1;
                break;
            }
            fill_blocks(buf, (size_t)(n_mat * EXPERT_ROWS * row_bytes), fmts[fi].type, tinfo->block_bytes, &seed);
            const int64_t passes = n_mat / (2 * EXPERTS_PER_PASS);
            for (size_t si = 0; si < sizeof sets / sizeof sets[0]; si++) {
                if (kcpu_select(sets[si]) != 0) {
                    fprintf(stderr, "bloomery-bench: kernels: this CPU has no %s set: skipped\n", sets[si]);
                    continue;
                }
                for (int ri = 0; ri < n_rows; ri++) {
                    const int64_t n = rows[ri];
                    kcpu_mat_t gate[EXPERTS_PER_PASS], up[EXPERTS_PER_PASS];
                    kcpu_mm_job_t jobs[2 * EXPERTS_PER_PASS];
                    double best = 0;
                    for (int64_t rep = 0; rep <= reps; rep++) { /* the first pass warms up, untimed */
                        const double t0 = now_s();
                        for (int64_t p = 0; p < passes; p++) {
                            for (int e = 0; e < EXPERTS_PER_PASS; e++) {
                                const int64_t r0 = (p * EXPERTS_PER_PASS + e) * 2 * EXPERT_ROWS;
                                gate[e] = kcpu_mat_rows(&all, r0, EXPERT_ROWS);
                                up[e] = kcpu_mat_rows(&all, r0 + EXPERT_ROWS, EXPERT_ROWS);
                                jobs[2 * e] = (kcpu_mm_job_t){.w = &gate[e], .x = x, .nx = n, .rows = idx, .n = n,
                                                              .y = y + (size_t)(2 * e) * (size_t)(n * EXPERT_ROWS)};
                                jobs[2 * e + 1] = (kcpu_mm_job_t){.w = &up[e], .x = x, .nx = n, .rows = idx, .n = n,
                                                                  .y = y + (size_t)(2 * e + 1) * (size_t)(n * EXPERT_ROWS)};
                            }
                            kcpu_matmul_many(c, jobs, 2 * EXPERTS_PER_PASS);
                        }
                        const double dt = now_s() - t0;
                        const double rate = (double)(passes * 2 * EXPERTS_PER_PASS * EXPERT_ROWS * row_bytes) / dt;
                        if (rep > 0 && rate > best)
                            best = rate;
                    }
                    if (md)
                        printf("| %s | %s | %d | %lld | %.1f | %.1f | %.0f%% |\n", sets[si], fmts[fi].name, nt,
                               (long long)n, best / 1e9, bw / 1e9, bw > 0 ? 100.0 * best / bw : 0.0);
                    else
                        printf("{\"kernels\":\"%s\",\"format\":\"%s\",\"threads\":%d,\"rows\":%lld,"
                               "\"bytes_per_s\":%.0f,\"read_bandwidth\":%.0f}\n",
                               sets[si], fmts[fi].name, nt, (long long)n, best, bw);
                    fflush(stdout);
                }
            }
        }
        kcpu_ctx_destroy(c);
    }
    if (kcpu_select(kcpu_init()) != 0) /* the default set: always the CPU's */
        rc = 1;
    free(buf), free(x), free(y), free(idx);
    return rc;
}
