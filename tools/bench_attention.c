/* bloomery-bench --attention: the decode step's attention on the card, alone. No model
 * file: each row of a step gets its own cache of `layers` layers (K and V planes of
 * depth + 1 positions, f16), the launches a decode graph makes for attention
 * (the step's RoPE table, then kcuda_attention_rows_qkv per layer: the q/k RoPE, the
 * cache store at the row's position and the attention over the grid the worker
 * uses, wk_cuda_att_grid) are captured for every layer in one graph, and the graph
 * is replayed. Each layer reads its own cache, so a short context does not stay in
 * the card's L2 as it would when one layer's call were repeated. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_attention.h"
#include "bl_config.h"
#include "rng.h"
#include "wk.h"

#if BL_HAVE_CUDA
#include "kcuda.h"

/* The buffers of one (rows, depth) case. */
typedef struct att_case {
    void *cache[64];   /* a row's layers: (K plane, V plane) each */
    void *rows, *pos, *q, *k, *v, *out, *scratch, *cs, *stream, *exec, *e0, *e1;
} att_case_t;

static void case_free(att_case_t *c, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        kcuda_free(c->cache[i]);
    kcuda_free(c->rows);
    kcuda_free(c->pos);
    kcuda_free(c->q);
    kcuda_free(c->k);
    kcuda_free(c->v);
    kcuda_free(c->out);
    kcuda_free(c->scratch);
    kcuda_free(c->cs);
    kcuda_graph_destroy(c->exec);
    kcuda_event_destroy(c->e0);
    kcuda_event_destroy(c->e1);
    if (c->stream)
        kcuda_stream_destroy(c->stream);
}

/* Bytes of one row's cache: layers of a K and a V plane of depth + 1 positions. */
static size_t row_cache_bytes(const bench_att_t *b, int64_t depth)
{
    return 2 * (size_t)b->layers * (size_t)(depth + 1) * (size_t)(b->n_kv_head * b->head_dim) * 2;
}

/* Random floats in [-1, 1) from rng uploaded as n floats on stream (the host copy is
 * taken before the call returns). */
static int upload_random(void **d, int64_t n, void *stream, bl_rng_t *rng, bl_err_t *err)
{
    float *h = malloc(sizeof(float) * (size_t)n);
    if (!h)
        return bl_err_set(err, BL_ENOMEM, "out of memory for %lld floats", (long long)n);
    for (int64_t i = 0; i < n; i++)
        h[i] = (float)(2.0 * bl_rng_uniform(rng) - 1.0);
    int rc = kcuda_alloc(d, sizeof(float) * (size_t)n, err);
    if (rc == 0)
        rc = kcuda_upload(*d, h, sizeof(float) * (size_t)n, stream, err);
    free(h);
    return rc;
}

/* One (rows, depth) case: the time a layer, in microseconds. */
static int run_case(const bench_att_t *b, int64_t n, int64_t depth, int64_t max_len, bl_rng_t *rng,
                    double *us, bl_err_t *err)
{
    att_case_t c;
    memset(&c, 0, sizeof c);
    const size_t rb = (size_t)(b->n_kv_head * b->head_dim) * 2, plane = rb * (size_t)(depth + 1);
    /* every copy on the case's own stream, so the graph replayed there sees them */
    int rc = kcuda_stream_create(&c.stream, err);
    kcuda_kv_row_t rows[64];
    int32_t pos[64];
    for (int64_t i = 0; i < n && rc == 0; i++) {
        if ((rc = kcuda_alloc(&c.cache[i], row_cache_bytes(b, depth), err)) == 0)
            rc = kcuda_memset(c.cache[i], 0x11, row_cache_bytes(b, depth), c.stream, err);
        rows[i] = (kcuda_kv_row_t){.k = (uint64_t)(uintptr_t)c.cache[i], .layer_bytes = 2 * plane,
                                   .v_bytes = plane, .pos = (int32_t)depth};
        pos[i] = (int32_t)depth;
    }
    const size_t sb = kcuda_attention_scratch_bytes(n, b->n_head, b->head_dim, max_len);
    if (rc == 0 && (rc = kcuda_alloc(&c.rows, sizeof rows[0] * (size_t)n, err)) == 0)
        rc = kcuda_upload(c.rows, rows, sizeof rows[0] * (size_t)n, c.stream, err);
    if (rc == 0 && (rc = kcuda_alloc(&c.pos, sizeof pos[0] * (size_t)n, err)) == 0)
        rc = kcuda_upload(c.pos, pos, sizeof pos[0] * (size_t)n, c.stream, err);
    if (rc == 0)
        rc = upload_random(&c.q, n * b->n_head * b->head_dim, c.stream, rng, err);
    if (rc == 0)
        rc = upload_random(&c.k, n * b->n_kv_head * b->head_dim, c.stream, rng, err);
    if (rc == 0)
        rc = upload_random(&c.v, n * b->n_kv_head * b->head_dim, c.stream, rng, err);
    if (rc == 0)
        rc = kcuda_alloc(&c.out, sizeof(float) * (size_t)(n * b->n_head * b->head_dim), err);
    if (rc == 0)
        rc = kcuda_alloc(&c.scratch, sb > 0 ? sb : 16, err);
    if (rc == 0)
        rc = kcuda_alloc(&c.cs, sizeof(float) * (size_t)(n * b->head_dim), err);
    if (rc == 0 && (rc = kcuda_event_create(&c.e0, err)) == 0)
        rc = kcuda_event_create(&c.e1, err);
    if (rc == 0)
        rc = kcuda_graph_begin(c.stream, err);
    if (rc == 0) {
        /* the step's RoPE table once, as the worker's decode step makes it */
        kcuda_rope_t rope = kcuda_rope_plain((int)b->head_dim, 1e6f);
        rc = kcuda_rope_table(c.pos, n, &rope, c.cs, c.stream, err);
        rope.d_cs = c.cs;
        const float scale = (float)(1.0 / sqrt((double)b->head_dim));
        for (int64_t l = 0; l < b->layers && rc == 0; l++)
            rc = kcuda_attention_rows_qkv(c.rows, l, rb, c.q, c.k, c.v, NULL, NULL, c.pos, c.out, n, max_len,
                                          b->n_head, b->n_kv_head, b->head_dim, &rope, 1e-6f, scale, NULL,
                                          c.scratch, sb, c.stream, err);
        bl_err_t e2 = {0};
        const int rc2 = kcuda_graph_end(c.stream, &c.exec, rc < 0 ? &e2 : err);
        rc = rc < 0 ? rc : rc2;
    }
    /* two replays to warm up, then the timed ones */
    for (int i = 0; i < 2 && rc == 0; i++)
        rc = kcuda_graph_launch(c.exec, c.stream, err);
    if (rc == 0)
        rc = kcuda_event_record(c.e0, c.stream, err);
    for (int64_t i = 0; i < b->reps && rc == 0; i++)
        rc = kcuda_graph_launch(c.exec, c.stream, err);
    float ms = 0;
    if (rc == 0 && (rc = kcuda_event_record(c.e1, c.stream, err)) == 0 && (rc = kcuda_event_sync(c.e1, err)) == 0)
        rc = kcuda_event_elapsed_ms(&ms, c.e0, c.e1, err);
    *us = 1e3 * (double)ms / (double)(b->reps * b->layers);
    if (c.stream) { /* nothing of the case may be in flight when its buffers go */
        bl_err_t e2 = {0};
        const int rs = kcuda_sync(c.stream, rc == 0 ? err : &e2);
        rc = rc == 0 ? rs : rc;
    }
    case_free(&c, n);
    return rc;
}

int bench_attention(const bench_att_t *b)
{
    bl_err_t err = {0};
    kcuda_device_info_t info;
    if (kcuda_init(b->device, &info, &err) < 0) {
        fprintf(stderr, "bloomery-bench: --attention: CUDA%d: %s\n", b->device, err.msg);
        return 1;
    }
    wk_cuda_knobs_from_env();
    int64_t max_d = 0, max_n = 1;
    for (int i = 0; i < b->n_depths; i++)
        max_d = b->depths[i] > max_d ? b->depths[i] : max_d;
    for (int i = 0; i < b->n_rows; i++)
        max_n = b->rows[i] > max_n ? b->rows[i] : max_n;
    const int64_t ctx = b->ctx > 0 ? b->ctx : max_d + 1;
    if (max_d + 1 > ctx) {
        fprintf(stderr, "bloomery-bench: --attention: depth %lld is past the context of %lld positions (-c)\n",
                (long long)max_d, (long long)ctx);
        return 1;
    }
    const double need = (double)max_n * (double)row_cache_bytes(b, max_d);
    if (need > 0.9 * (double)info.free_bytes) {
        fprintf(stderr, "bloomery-bench: --attention: the caches of %lld rows at depth %lld over %lld layers take "
                "%.1f GiB, more than 90%% of the %.1f GiB free on %s\n", (long long)max_n, (long long)max_d,
                (long long)b->layers, need / (double)(1u << 30), (double)info.free_bytes / (double)(1u << 30),
                info.name);
        return 1;
    }
    double copy = 0;
    if (b->roofline && wk_cuda_copy_rate(b->device, (size_t)1 << 30, &copy, &err) != 0) {
        fprintf(stderr, "bloomery-bench: --attention: the copy rate: %s\n", err.msg);
        return 1;
    }
    if (b->md) {
        printf("| device | heads | head_dim | rows | depth | grid | us a layer | cache read GB/s |%s\n",
               b->roofline ? " of the copy rate |" : "");
        printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |%s\n", b->roofline ? " ---: |" : "");
    }
    bl_rng_t rng;
    bl_rng_seed(&rng, (uint64_t)time(NULL)); /* new q, k and v every run */
    for (int ri = 0; ri < b->n_rows; ri++)
        for (int di = 0; di < b->n_depths; di++) {
            const int64_t n = b->rows[ri], d = b->depths[di];
            const int64_t max_len = wk_cuda_att_grid(d + 1, ctx);
            double us = 0;
            if (run_case(b, n, d, max_len, &rng, &us, &err) != 0) {
                fprintf(stderr, "bloomery-bench: --attention: %lld rows at depth %lld: %s\n", (long long)n,
                        (long long)d, err.msg);
                return 1;
            }
            /* a layer's K and V of every row, read once */
            const double gbs = (double)n * (double)row_cache_bytes(b, d) / (double)b->layers / (us * 1e-6) / 1e9;
            if (b->md) {
                printf("| %s | %lld/%lld | %lld | %lld | %lld | %lld | %.2f | %.0f |", info.name,
                       (long long)b->n_head, (long long)b->n_kv_head, (long long)b->head_dim, (long long)n,
                       (long long)d, (long long)max_len, us, gbs);
                if (b->roofline)
                    printf(" %.2f |", gbs * 1e9 / copy);
                printf("\n");
            } else {
                printf("{\"attention\":\"%s\",\"n_head\":%lld,\"n_kv_head\":%lld,\"head_dim\":%lld,\"rows\":%lld,"
                       "\"depth\":%lld,\"grid\":%lld,\"layers\":%lld,\"us_layer\":%.3f,\"cache_gbs\":%.1f,"
                       "\"copy_gbs\":%.1f}\n", info.name, (long long)b->n_head, (long long)b->n_kv_head,
                       (long long)b->head_dim, (long long)n, (long long)d, (long long)max_len,
                       (long long)b->layers, us, gbs, copy / 1e9);
            }
            fflush(stdout);
        }
    return 0;
}

#else /* no CUDA in this build */

int bench_attention(const bench_att_t *b)
{
    (void)b;
    fprintf(stderr, "bloomery-bench: --attention: this build has no CUDA (meson setup -Dgpu=enabled)\n");
    return 1;
}

#endif
