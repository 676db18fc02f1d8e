/* Tests for kernels/cpu/kernels.c: matmul in each mode against a double-precision
 * product of the dequantized weights, bitwise equality across thread counts and
 * kernel sets where the arithmetic is integer, attention over each KV cache type
 * against a naive double reference, rms_norm, RoPE, MoE routing, and the pool.
 * Random inputs change every run; the seed is printed, BLOOMERY_TEST_SEED replays. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <pthread.h>
#include <unistd.h>
#include <time.h>

#include "blocks.h"
#include "kcpu.h"
#include "quant.h"
#include "test_seed.h"

static void rand_vec(rng_t *r, float *x, int64_t n, float amp)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = rng_f(r, -amp, amp);
}

static kcpu_ctx_t *make_ctx(int threads, int mode, int64_t cols, int64_t batch, int64_t ctx, int64_t hd)
{
    kcpu_ctx_t *c = NULL;
    bl_err_t err = {0};
    const kcpu_limits_t lim = {.max_cols = cols, .max_batch = batch, .max_ctx = ctx, .head_dim = hd};
    assert_int_equal(kcpu_ctx_create(&c, threads, mode, &lim, &err), 0);
    return c;
}

// --- matmul ----------------------------------------------------------------------------------

typedef struct wmat {
    kcpu_mat_t m;
    void *data;
    float *deq; /* (nrows, ncols) */
} wmat_t;

static void make_weights(rng_t *r, wmat_t *w, uint32_t type, int64_t ncols, int64_t nrows)
{
    bl_err_t err = {0};
    size_t rb;
    assert_int_equal(bl_row_bytes(type, ncols, &rb, &err), 0);
    w->data = malloc(rb * (size_t)nrows);
    w->deq = malloc(sizeof(float) * (size_t)(ncols * nrows));
    float *src = malloc(sizeof(float) * (size_t)ncols);
    for (int64_t i = 0; i < nrows; i++) {
        uint8_t *row = (uint8_t *)w->data + rb * (size_t)i;
        if (type == BL_TYPE_MXFP4) { /* no quantizer: random codes, exponents near 1 */
            for (size_t j = 0; j < rb; j++)
                row[j] = (uint8_t)rng_next(r);
            for (int64_t b = 0; b < ncols / BL_QK; b++)
                ((bl_block_mxfp4 *)row)[b].e = (uint8_t)(122 + rng_next(r) % 6);
        } else {
            rand_vec(r, src, ncols, 1.0f);
            assert_int_equal(bl_quantize_row_ref(type, src, row, ncols), 0);
        }
        assert_int_equal(bl_dequantize_row_ref(type, (uint8_t *)w->data + rb * (size_t)i,
                                               w->deq + i * ncols, ncols), 0);
    }
    free(src);
    assert_int_equal(kcpu_mat_init(&w->m, w->data, type, ncols, nrows, &err), 0);
}

static void free_weights(wmat_t *w)
{
    free(w->data);
    free(w->deq);
}

/* Every mode against the double-precision product, for each weight type with odd
 * row and batch counts; tolerance abs + rel * sum|w x|, loosest for one q8 term. */
static void test_matmul_modes_match_double(void **state)
{
    (void)state;
    rng_t r = rng_for(1);
    const uint32_t types[] = {BL_TYPE_F32,  BL_TYPE_F16,  BL_TYPE_Q8_0, BL_TYPE_Q4_K,
                              BL_TYPE_Q5_K, BL_TYPE_Q6_K, BL_TYPE_BF16, BL_TYPE_MXFP4};
    const int modes[] = {KCPU_PRECISE, KCPU_FAST16, KCPU_FAST8};
    const double rel[] = {1e-5, 1e-4, 2e-2};
    const int64_t K = 512, N = 37, B = 5;
    int bad = 0;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        wmat_t w;
        make_weights(&r, &w, types[ti], K, N);
        float *x = malloc(sizeof(float) * (size_t)(B * K)), *y = malloc(sizeof(float) * (size_t)(B * N));
        rand_vec(&r, x, B * K, 2.0f);
        for (size_t mi = 0; mi < 3; mi++) {
            kcpu_ctx_t *c = make_ctx(3, modes[mi], K, B, 8, 8);
            kcpu_matmul(c, &w.m, x, B, y);
            for (int64_t b = 0; b < B; b++)
                for (int64_t n = 0; n < N; n++) {
                    double e = 0.0, sc = 0.0;
                    for (int64_t k = 0; k < K; k++) {
                        e += (double)w.deq[n * K + k] * x[b * K + k];
                        sc += fabs((double)w.deq[n * K + k] * x[b * K + k]);
                    }
                    if (fabs(y[b * N + n] - e) > 1e-5 + rel[mi] * sc && bad++ < 5)
                        print_error("type %u mode %d: y[%lld][%lld] = %.7g, double %.7g\n",
                                    types[ti], modes[mi], (long long)b, (long long)n,
                                    (double)y[b * N + n], e);
                }
            kcpu_ctx_destroy(c);
        }
        free(x);
        free(y);
        free_weights(&w);
    }
    assert_int_equal(bad, 0);
}

/* Thread count never changes a bit; neither does the batch a row sits in. */
static void test_matmul_threads_and_batch_bitwise(void **state)
{
    (void)state;
    rng_t r = rng_for(2);
    const int64_t K = 256, N = 101, B = 9;
    wmat_t w;
    make_weights(&r, &w, BL_TYPE_Q4_K, K, N);
    float *x = malloc(sizeof(float) * (size_t)(B * K));
    rand_vec(&r, x, B * K, 1.0f);
    const int modes[] = {KCPU_PRECISE, KCPU_FAST16, KCPU_FAST8};
    float *yp = malloc(sizeof(float) * (size_t)(B * N));
    for (size_t mi = 0; mi < 3; mi++) {
        float *y1 = malloc(sizeof(float) * (size_t)(B * N)), *y = malloc(sizeof(float) * (size_t)(B * N));
        kcpu_ctx_t *c1 = make_ctx(1, modes[mi], K, B, 8, 8);
        kcpu_matmul(c1, &w.m, x, B, y1);
        for (int t = 2; t <= 5; t++) {
            kcpu_ctx_t *c = make_ctx(t, modes[mi], K, B, 8, 8);
            kcpu_matmul(c, &w.m, x, B, y);
            assert_memory_equal(y, y1, sizeof(float) * (size_t)(B * N));
            kcpu_ctx_destroy(c);
        }
        for (int64_t b = 0; b < B; b++) {
            kcpu_matmul(c1, &w.m, x + b * K, 1, y);
            assert_memory_equal(y, y1 + b * N, sizeof(float) * (size_t)N);
        }
        /* A matrix marked precise takes the precise path in every mode. */
        if (modes[mi] == KCPU_PRECISE)
            memcpy(yp, y1, sizeof(float) * (size_t)(B * N));
        kcpu_mat_t wp = w.m;
        wp.precise = 1;
        kcpu_matmul(c1, &wp, x, B, y);
        assert_memory_equal(y, yp, sizeof(float) * (size_t)(B * N));
        kcpu_ctx_destroy(c1);
        free(y);
        free(y1);
    }
    free(yp);
    free(x);
    free_weights(&w);
}

/* kcpu_matmul_many gives each product the bits kcpu_matmul gives it: products that
 * read rows of a shared input by index (as experts read a step's rows), products of
 * several weight types in one pass, and batches of every parity (the batched
 * kernels take activation rows in pairs) in every mode; also when the products'
 * rows overflow the context's batch scratch and run in several passes. */
static void test_matmul_many_matches_matmul(void **state)
{
    (void)state;
    rng_t r = rng_for(7);
    enum { NT = 6, B = 7 };
    const int64_t K = 512;
    const uint32_t types[] = {BL_TYPE_Q4_K, BL_TYPE_Q5_K, BL_TYPE_Q6_K, BL_TYPE_Q8_0, BL_TYPE_F16, BL_TYPE_MXFP4};
    const int64_t nrows[] = {33, 17, 40, 9, 5, 11};
    wmat_t w[NT];
    for (int i = 0; i < NT; i++)
        make_weights(&r, &w[i], types[i], K, nrows[i]);
    float *x = malloc(sizeof(float) * (size_t)(B * K)), *xg = malloc(sizeof(float) * (size_t)(B * K));
    rand_vec(&r, x, B * K, 1.0f);
    const int32_t rows[NT][B] = {{6, 0, 3, 4, 1, 2, 5}, {2, 2, 5}, {1, 3, 5, 6}, {0}, {4, 6}, {5, 1, 2}};
    const int64_t cnt[NT] = {7, 3, 4, 1, 2, 3};
    const int modes[] = {KCPU_PRECISE, KCPU_FAST16, KCPU_FAST8};
    for (size_t mi = 0; mi < 3; mi++)
        /* A batch scratch of B rows holds one quantized input, not the q8_0 and q8_K
         * copies together: the group runs in two passes there. */
        for (int64_t cap = B; cap <= 4 * B; cap += 3 * B) {
            kcpu_ctx_t *c = make_ctx(2, modes[mi], K, cap, 8, 8);
            kcpu_mm_job_t jobs[NT];
            float *y[NT], *e = malloc(sizeof(float) * (size_t)(B * 64));
            for (int i = 0; i < NT; i++) {
                y[i] = malloc(sizeof(float) * (size_t)(cnt[i] * nrows[i]));
                jobs[i] = (kcpu_mm_job_t){.w = &w[i].m, .x = x, .nx = B, .rows = rows[i], .n = cnt[i], .y = y[i]};
            }
            kcpu_matmul_many(c, jobs, NT);
            for (int i = 0; i < NT; i++) {
                for (int64_t b = 0; b < cnt[i]; b++)
                    memcpy(xg + b * K, x + rows[i][b] * K, sizeof(float) * (size_t)K);
                kcpu_matmul(c, &w[i].m, xg, cnt[i], e);
                assert_memory_equal(e, y[i], sizeof(float) * (size_t)(cnt[i] * nrows[i]));
                for (int64_t b = 0; b < cnt[i]; b++) {
                    kcpu_matmul(c, &w[i].m, xg + b * K, 1, e);
                    assert_memory_equal(e, y[i] + b * nrows[i], sizeof(float) * (size_t)nrows[i]);
                }
            }
            /* Without row indices: every row of x, in order. */
            const kcpu_mm_job_t plain = {.w = &w[0].m, .x = x, .n = B, .y = y[0]};
            kcpu_matmul_many(c, &plain, 1);
            kcpu_matmul(c, &w[0].m, x, B, e);
            assert_memory_equal(e, y[0], sizeof(float) * (size_t)(B * nrows[0]));
            for (int i = 0; i < NT; i++)
                free(y[i]);
            free(e);
            kcpu_ctx_destroy(c);
        }
    for (int i = 0; i < NT; i++)
        free_weights(&w[i]);
    free(x);
    free(xg);
}

/* matmul follows kcpu_select, and the two kernel sets agree closely: their integer
 * sums are exact in both, only the order of the float scaling differs. */
static void test_matmul_ref_and_avx2_agree(void **state)
{
    (void)state;
    if (!kcpu_have_avx2())
        skip();
    rng_t r = rng_for(3);
    const int64_t K = 768, N = 19, B = 3;
    const uint32_t types[] = {BL_TYPE_Q8_0, BL_TYPE_Q6_K, BL_TYPE_F16};
    for (size_t ti = 0; ti < 3; ti++) {
        wmat_t w;
        make_weights(&r, &w, types[ti], K, N);
        float *x = malloc(sizeof(float) * (size_t)(B * K));
        float *ya = malloc(sizeof(float) * (size_t)(B * N)), *yr = malloc(sizeof(float) * (size_t)(B * N));
        rand_vec(&r, x, B * K, 1.0f);
        kcpu_ctx_t *c = make_ctx(2, KCPU_FAST16, K, B, 8, 8);
        assert_int_equal(kcpu_select("ref"), 0);
        kcpu_matmul(c, &w.m, x, B, yr);
        assert_int_equal(kcpu_select("avx2"), 0);
        kcpu_matmul(c, &w.m, x, B, ya);
        for (int64_t i = 0; i < B * N; i++)
            assert_true(fabs(ya[i] - yr[i]) <= 1e-4 + 1e-5 * fabs(yr[i]));
        kcpu_ctx_destroy(c);
        free(x);
        free(ya);
        free(yr);
        free_weights(&w);
    }
}

/* The avx512 set gives the avx2 set's bits for K-quant products of 1..9 rows: one
 * row (the packed dots), a few (its multi-row dot against avx2's unpacked tile)
 * and more (both sets' tile). */
static void test_matmul_avx512_equals_avx2(void **state)
{
    (void)state;
    if (!kcpu_have_avx512()) {
        print_message("no AVX-512 F/BW/VL/VNNI on this CPU: the avx512 set is not tested here\n");
        skip();
    }
    rng_t r = rng_for(9);
    const int64_t K = 768, N = 37, B = 9;
    const uint32_t types[] = {BL_TYPE_Q4_K, BL_TYPE_Q5_K, BL_TYPE_Q6_K};
    for (size_t ti = 0; ti < 3; ti++) {
        wmat_t w;
        make_weights(&r, &w, types[ti], K, N);
        float *x = malloc(sizeof(float) * (size_t)(B * K));
        float *y2 = malloc(sizeof(float) * (size_t)(B * N)), *y5 = malloc(sizeof(float) * (size_t)(B * N));
        rand_vec(&r, x, B * K, 1.0f);
        kcpu_ctx_t *c = make_ctx(3, KCPU_FAST16, K, B, 8, 8);
        for (int64_t n = 1; n <= B; n++) {
            assert_int_equal(kcpu_select("avx2"), 0);
            kcpu_matmul(c, &w.m, x, n, y2);
            assert_int_equal(kcpu_select("avx512"), 0);
            kcpu_matmul(c, &w.m, x, n, y5);
            assert_memory_equal(y2, y5, sizeof(float) * (size_t)(n * N));
        }
        assert_int_equal(kcpu_select(kcpu_init()), 0);
        kcpu_ctx_destroy(c);
        free(x);
        free(y2);
        free(y5);
        free_weights(&w);
    }
}

// --- attention ---------------------------------------------------------------------------------

/* Naive double attention over the f32 values the cache type would round to. */
/* Causal attention in double; window > 0: a row sees its last window positions;
 * sinks (nh) or NULL: one more score per head, with no value. */
static void attention_ref_ext(const float *q, const float *k, const float *v, double *out, int64_t n, int64_t pos0,
                              int64_t nh, int64_t nkv, int64_t hd, double scale, int64_t window, const float *sinks)
{
    double *sc = malloc(sizeof(double) * (size_t)(pos0 + n));
    for (int64_t b = 0; b < n; b++)
        for (int64_t h = 0; h < nh; h++) {
            const int64_t g = h / (nh / nkv), len = pos0 + b + 1;
            const int64_t lo = window > 0 && len > window ? len - window : 0;
            double mx = sinks ? sinks[h] : -INFINITY, sum = 0.0;
            for (int64_t s = lo; s < len; s++) {
                double d = 0.0;
                for (int64_t i = 0; i < hd; i++)
                    d += (double)q[(b * nh + h) * hd + i] * k[(s * nkv + g) * hd + i];
                sc[s] = d * scale;
                mx = sc[s] > mx ? sc[s] : mx;
            }
            for (int64_t s = lo; s < len; s++) {
                sc[s] = exp(sc[s] - mx);
                sum += sc[s];
            }
            if (sinks)
                sum += exp(sinks[h] - mx);
            for (int64_t i = 0; i < hd; i++) {
                double o = 0.0;
                for (int64_t s = lo; s < len; s++)
                    o += sc[s] * v[(s * nkv + g) * hd + i];
                out[(b * nh + h) * hd + i] = o / sum;
            }
        }
    free(sc);
}

static void attention_ref(const float *q, const float *k, const float *v, double *out, int64_t n,
                          int64_t pos0, int64_t nh, int64_t nkv, int64_t hd, double scale)
{
    attention_ref_ext(q, k, v, out, n, pos0, nh, nkv, hd, scale, 0, NULL);
}

/* gpt-oss's attention: a sliding window and sinks, each cache type, one and three
 * threads, and a decode row (the split form) equal to its row of the batch. */
static void test_attention_window_sinks(void **state)
{
    (void)state;
    rng_t r = rng_for(31);
    const int64_t nh = 4, nkv = 2, hd = 64, pos0 = 150 + (int64_t)(rng_next(&r) % 100), n = 6, T = pos0 + n;
    const int64_t row = nkv * hd, windows[2] = {5, 100};
    const uint32_t types[] = {BL_TYPE_F32, BL_TYPE_F16, BL_TYPE_Q8_0};
    float *kf = malloc(sizeof(float) * (size_t)(T * row)), *vf = malloc(sizeof(float) * (size_t)(T * row));
    float *q = malloc(sizeof(float) * (size_t)(n * nh * hd)), *out = malloc(sizeof(float) * (size_t)(n * nh * hd));
    float *one = malloc(sizeof(float) * (size_t)(nh * hd)), sinks[4];
    double *ref = malloc(sizeof(double) * (size_t)(n * nh * hd));
    rand_vec(&r, kf, T * row, 1.0f);
    rand_vec(&r, vf, T * row, 1.0f);
    rand_vec(&r, q, n * nh * hd, 1.0f);
    rand_vec(&r, sinks, nh, 3.0f);
    for (size_t ti = 0; ti < 3; ti++)
        for (int wi = 0; wi < 2; wi++) {
            size_t rb;
            bl_err_t err = {0};
            assert_int_equal(bl_row_bytes(types[ti], row, &rb, &err), 0);
            kcpu_kv_view_t kv = {.k = malloc(rb * (size_t)T), .v = malloc(rb * (size_t)T), .type = types[ti],
                                 .row_bytes = rb};
            kcpu_kv_store(&kv, 0, kf, 0, T, row);
            kcpu_kv_store(&kv, 1, vf, 0, T, row);
            float *kr = malloc(sizeof(float) * (size_t)(T * row)), *vr = malloc(sizeof(float) * (size_t)(T * row));
            for (int64_t s = 0; s < T; s++) {
                assert_int_equal(bl_dequantize_row_ref(types[ti], (uint8_t *)kv.k + rb * (size_t)s, kr + s * row, row), 0);
                assert_int_equal(bl_dequantize_row_ref(types[ti], (uint8_t *)kv.v + rb * (size_t)s, vr + s * row, row), 0);
            }
            const double scale = 1.0 / sqrt((double)hd);
            attention_ref_ext(q, kr, vr, ref, n, pos0, nh, nkv, hd, scale, windows[wi], sinks);
            for (int threads = 1; threads <= 3; threads += 2) {
                kcpu_ctx_t *c = make_ctx(threads, KCPU_PRECISE, 64, n, T, hd);
                kcpu_attention_ext(c, &kv, q, out, n, pos0, nh, nkv, hd, (float)scale, windows[wi], sinks);
                int bad = 0;
                for (int64_t i = 0; i < n * nh * hd; i++)
                    if (fabs(out[i] - ref[i]) > 1e-5 + 1e-5 * fabs(ref[i]) && bad++ < 5)
                        print_error("kv type %u window %lld: out[%lld] = %.7g, ref %.7g\n", types[ti],
                                    (long long)windows[wi], (long long)i, (double)out[i], ref[i]);
                assert_int_equal(bad, 0);
                /* a decode row on many threads (the split form for f16) gives its bits */
                kcpu_ctx_t *c8 = make_ctx(8, KCPU_PRECISE, 64, n, T, hd);
                for (int64_t b = 0; b < n; b++) {
                    kcpu_attention_ext(c8, &kv, q + b * nh * hd, one, 1, pos0 + b, nh, nkv, hd, (float)scale,
                                       windows[wi], sinks);
                    assert_memory_equal(one, out + b * nh * hd, sizeof(float) * (size_t)(nh * hd));
                }
                kcpu_ctx_destroy(c8);
                kcpu_ctx_destroy(c);
            }
            free(kr), free(vr), free(kv.k), free(kv.v);
        }
    free(kf), free(vf), free(q), free(out), free(one), free(ref);
}

static void test_attention_each_cache_type(void **state)
{
    (void)state;
    rng_t r = rng_for(4);
    const int64_t nh = 6, nkv = 2, hd = 64, pos0 = 13, n = 7, T = pos0 + n;
    const int64_t row = nkv * hd;
    const uint32_t types[] = {BL_TYPE_F32, BL_TYPE_F16, BL_TYPE_Q8_0};
    float *kf = malloc(sizeof(float) * (size_t)(T * row)), *vf = malloc(sizeof(float) * (size_t)(T * row));
    float *q = malloc(sizeof(float) * (size_t)(n * nh * hd)), *out = malloc(sizeof(float) * (size_t)(n * nh * hd));
    double *ref = malloc(sizeof(double) * (size_t)(n * nh * hd));
    rand_vec(&r, kf, T * row, 1.0f);
    rand_vec(&r, vf, T * row, 1.0f);
    rand_vec(&r, q, n * nh * hd, 1.0f);
    for (size_t ti = 0; ti < 3; ti++) {
        size_t rb;
        bl_err_t err = {0};
        assert_int_equal(bl_row_bytes(types[ti], row, &rb, &err), 0);
        kcpu_kv_view_t kv = {.k = malloc(rb * (size_t)T), .v = malloc(rb * (size_t)T),
                             .type = types[ti], .row_bytes = rb};
        /* Two stores (the past, then this batch) as a model makes them. */
        kcpu_kv_store(&kv, 0, kf, 0, pos0, row);
        kcpu_kv_store(&kv, 1, vf, 0, pos0, row);
        kcpu_kv_store(&kv, 0, kf + pos0 * row, pos0, n, row);
        kcpu_kv_store(&kv, 1, vf + pos0 * row, pos0, n, row);
        /* The reference reads back what the cache holds. */
        float *kr = malloc(sizeof(float) * (size_t)(T * row)), *vr = malloc(sizeof(float) * (size_t)(T * row));
        for (int64_t s = 0; s < T; s++) {
            assert_int_equal(bl_dequantize_row_ref(types[ti], (uint8_t *)kv.k + rb * (size_t)s, kr + s * row, row), 0);
            assert_int_equal(bl_dequantize_row_ref(types[ti], (uint8_t *)kv.v + rb * (size_t)s, vr + s * row, row), 0);
        }
        attention_ref(q, kr, vr, ref, n, pos0, nh, nkv, hd, 1.0 / sqrt((double)hd));
        for (int threads = 1; threads <= 3; threads += 2) {
            kcpu_ctx_t *c = make_ctx(threads, KCPU_PRECISE, 64, n, T, hd);
            kcpu_attention(c, &kv, q, out, n, pos0, nh, nkv, hd, (float)(1.0 / sqrt((double)hd)));
            int bad = 0;
            for (int64_t i = 0; i < n * nh * hd; i++)
                if (fabs(out[i] - ref[i]) > 1e-5 + 1e-5 * fabs(ref[i]) && bad++ < 5)
                    print_error("kv type %u: out[%lld] = %.7g, ref %.7g\n", types[ti], (long long)i,
                                (double)out[i], ref[i]);
            assert_int_equal(bad, 0);
            kcpu_ctx_destroy(c);
        }
        free(kr);
        free(vr);
        free(kv.k);
        free(kv.v);
    }
    free(kf); free(vf); free(q); free(out); free(ref);
}

/* An f16 cache of rows longer than a chunk of the kernels' chunked attention: a
 * batch on one thread (each row's chunks in order) and each row alone on 8 threads
 * (a decode row's chunks split over the threads, merged after) give the same bits,
 * within the double reference's distance. */
static void test_attention_split_equals_batch(void **state)
{
    (void)state;
    rng_t r = rng_for(14);
    const int64_t nh = 8, nkv = 2, hd = 64, pos0 = 300 + (int64_t)(rng_next(&r) % 200), n = 5, T = pos0 + n;
    const int64_t row = nkv * hd;
    float *kf = malloc(sizeof(float) * (size_t)(T * row)), *vf = malloc(sizeof(float) * (size_t)(T * row));
    float *q = malloc(sizeof(float) * (size_t)(n * nh * hd));
    float *batch = malloc(sizeof(float) * (size_t)(n * nh * hd)), *one = malloc(sizeof(float) * (size_t)(nh * hd));
    double *ref = malloc(sizeof(double) * (size_t)(n * nh * hd));
    rand_vec(&r, kf, T * row, 2.0f);
    rand_vec(&r, vf, T * row, 1.0f);
    rand_vec(&r, q, n * nh * hd, 1.0f);
    size_t rb;
    bl_err_t err = {0};
    assert_int_equal(bl_row_bytes(BL_TYPE_F16, row, &rb, &err), 0);
    kcpu_kv_view_t kv = {.k = malloc(rb * (size_t)T), .v = malloc(rb * (size_t)T), .type = BL_TYPE_F16, .row_bytes = rb};
    kcpu_kv_store(&kv, 0, kf, 0, T, row);
    kcpu_kv_store(&kv, 1, vf, 0, T, row);
    float *kr = malloc(sizeof(float) * (size_t)(T * row)), *vr = malloc(sizeof(float) * (size_t)(T * row));
    for (int64_t s = 0; s < T; s++) {
        assert_int_equal(bl_dequantize_row_ref(BL_TYPE_F16, (uint8_t *)kv.k + rb * (size_t)s, kr + s * row, row), 0);
        assert_int_equal(bl_dequantize_row_ref(BL_TYPE_F16, (uint8_t *)kv.v + rb * (size_t)s, vr + s * row, row), 0);
    }
    const float scale = (float)(1.0 / sqrt((double)hd));
    attention_ref(q, kr, vr, ref, n, pos0, nh, nkv, hd, scale);
    kcpu_ctx_t *c1 = make_ctx(1, KCPU_FAST16, 64, n, T, hd), *c8 = make_ctx(8, KCPU_FAST16, 64, n, T, hd);
    kcpu_attention(c1, &kv, q, batch, n, pos0, nh, nkv, hd, scale);
    int bad = 0;
    for (int64_t i = 0; i < n * nh * hd; i++)
        if (fabs(batch[i] - ref[i]) > 1e-5 + 1e-5 * fabs(ref[i]) && bad++ < 5)
            print_error("batch: out[%lld] = %.7g, ref %.7g\n", (long long)i, (double)batch[i], ref[i]);
    assert_int_equal(bad, 0);
    for (int64_t b = 0; b < n; b++) {
        kcpu_attention(c8, &kv, q + b * nh * hd, one, 1, pos0 + b, nh, nkv, hd, scale);
        assert_memory_equal(one, batch + b * nh * hd, sizeof(float) * (size_t)(nh * hd));
    }
    kcpu_ctx_destroy(c1);
    kcpu_ctx_destroy(c8);
    free(kr), free(vr), free(kv.k), free(kv.v);
    free(kf), free(vf), free(q), free(batch), free(one), free(ref);
}

// --- small ops ---------------------------------------------------------------------------------

static void test_rms_norm_and_rope(void **state)
{
    (void)state;
    rng_t r = rng_for(5);
    const int64_t n = 3, d = 40, ld = 48;
    float x[3 * 48], y[3 * 48], g[40];
    rand_vec(&r, x, n * ld, 3.0f);
    rand_vec(&r, g, d, 1.5f);
    kcpu_rms_norm(NULL, y, x, g, n, d, ld, 1e-6f);
    for (int64_t b = 0; b < n; b++) {
        double ss = 0.0;
        for (int64_t i = 0; i < d; i++)
            ss += (double)x[b * ld + i] * x[b * ld + i];
        const double s = 1.0 / sqrt(ss / d + 1e-6);
        for (int64_t i = 0; i < d; i++)
            assert_true(fabs(y[b * ld + i] - x[b * ld + i] * s * g[i]) < 1e-5);
    }
    /* RoPE: pairs (i, i + hd/2) rotated by pos * base^(-2i/hd). */
    const int64_t hd = 16, nh = 2;
    const int32_t pos[2] = {0, 1527};
    float cs[2 * 16], v[2 * 2 * 16], v0[2 * 2 * 16];
    rand_vec(&r, v, 2 * nh * hd, 1.0f);
    memcpy(v0, v, sizeof v);
    const kcpu_rope_t rp = kcpu_rope_plain(hd, 1e6f);
    kcpu_rope_table(cs, pos, 2, &rp);
    kcpu_rope_neox(v, cs, 2, nh, hd, hd);
    for (int64_t b = 0; b < 2; b++)
        for (int64_t h = 0; h < nh; h++)
            for (int64_t i = 0; i < hd / 2; i++) {
                const double th = pos[b] * pow(1e6, -2.0 * i / hd);
                const float *a = v0 + (b * nh + h) * hd, *o = v + (b * nh + h) * hd;
                assert_true(fabs(o[i] - (a[i] * cos(th) - a[i + hd / 2] * sin(th))) < 1e-5);
                assert_true(fabs(o[i + hd / 2] - (a[i] * sin(th) + a[i + hd / 2] * cos(th))) < 1e-5);
            }
}

/* kcpu_experts_range over ascending ranges that cover every expert, each pass
 * adding onto the last, gives kcpu_experts' bits; so does a table of per-expert
 * slices (copies of the stacks' rows, as a pager's slots hold them). */
static void test_experts_range_and_slices_bitwise(void **state)
{
    (void)state;
    rng_t r = rng_for(11);
    const int64_t E = 256, F = 96, NE = 12, K = 3, n = 9;
    wmat_t g, u, d;
    make_weights(&r, &g, BL_TYPE_Q4_K, E, F * NE);
    make_weights(&r, &u, BL_TYPE_Q4_K, E, F * NE);
    make_weights(&r, &d, BL_TYPE_Q8_0, F, E * NE);
    kcpu_experts_t e = {.gate = g.m, .up = u.m, .down = d.m, .n_expert = NE, .n_ff = F, .n_embd = E};
    float *xn = malloc(sizeof(float) * (size_t)(n * E)), *want = malloc(sizeof(float) * (size_t)(n * E)),
          *got = malloc(sizeof(float) * (size_t)(n * E)), wts[9 * 3];
    int32_t ids[9 * 3], counts[9];
    rand_vec(&r, xn, n * E, 1.0f);
    int64_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        counts[i] = (int32_t)(1 + rng_next(&r) % K);
        for (int32_t j = 0; j < counts[i]; j++, at++) {
            int32_t x;
            int dup;
            do { /* distinct experts in a row */
                x = (int32_t)(rng_next(&r) % NE);
                dup = 0;
                for (int64_t q = at - j; q < at; q++)
                    dup |= ids[q] == x;
            } while (dup);
            ids[at] = x;
            wts[at] = rng_f(&r, 0.0f, 1.0f);
        }
    }
    kcpu_ctx_t *c = make_ctx(2, KCPU_FAST16, E, n, 1, 64);
    kcpu_experts_scratch_t *xs = NULL;
    bl_err_t err = {0};
    assert_int_equal(kcpu_experts_scratch_create(&xs, n, K, E, F, &err), 0);
    kcpu_experts(c, xs, &e, xn, n, counts, K, ids, wts, want);
    for (int trial = 0; trial < 4; trial++) {
        for (int64_t lo = 0; lo < NE;) {
            const int64_t hi = lo + 1 + (int64_t)(rng_next(&r) % 4);
            kcpu_experts_range(c, xs, &e, xn, n, counts, K, ids, wts, got, lo, hi, lo > 0);
            lo = hi;
        }
        assert_memory_equal(got, want, sizeof(float) * (size_t)(n * E));
    }
    /* the same rows copied to slices of their own */
    const void *sl[3 * 12];
    void *own[3 * 12];
    const kcpu_mat_t *st[3] = {&g.m, &u.m, &d.m};
    for (int64_t x = 0; x < NE; x++)
        for (int i = 0; i < 3; i++) {
            const int64_t rows = i < 2 ? F : E;
            const size_t nb = st[i]->row_bytes * (size_t)rows;
            own[3 * x + i] = malloc(nb);
            memcpy(own[3 * x + i], (const uint8_t *)st[i]->data + nb * (size_t)x, nb);
            sl[3 * x + i] = own[3 * x + i];
        }
    kcpu_experts_t es = e;
    es.slices = sl;
    memset(got, 0, sizeof(float) * (size_t)(n * E));
    kcpu_experts(c, xs, &es, xn, n, counts, K, ids, wts, got);
    assert_memory_equal(got, want, sizeof(float) * (size_t)(n * E));
    for (int i = 0; i < 3 * 12; i++)
        free(own[i]);
    kcpu_experts_scratch_destroy(xs);
    kcpu_ctx_destroy(c);
    free(xn);
    free(want);
    free(got);
    free_weights(&g);
    free_weights(&u);
    free_weights(&d);
}

static void test_moe_route(void **state)
{
    (void)state;
    /* Row 0: distinct logits; row 1: a tie between experts 1 and 3 goes to 1. */
    const float l[2 * 5] = {0.5f, 2.0f, -1.0f, 1.0f, 0.0f, 0.0f, 3.0f, 1.0f, 3.0f, -2.0f};
    int32_t ids[2 * 2];
    float w[2 * 2];
    kcpu_route_t rt = {.n_expert = 5, .k = 2, .gating = KCPU_GATE_SOFTMAX, .norm = 1, .scale = 1.0f};
    kcpu_moe_route(NULL, l, 2, &rt, ids, w);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 3);
    const double e1 = exp(2.0), e3 = exp(1.0);
    assert_true(fabs(w[0] - e1 / (e1 + e3)) < 1e-6 && fabs(w[1] - e3 / (e1 + e3)) < 1e-6);
    assert_int_equal(ids[2], 1);
    assert_int_equal(ids[3], 3);
    assert_true(fabs(w[2] - 0.5) < 1e-6 && fabs(w[3] - 0.5) < 1e-6);
    /* Without renormalisation the weights are the softmax probabilities. */
    rt.norm = 0;
    kcpu_moe_route(NULL, l, 1, &rt, ids, w);
    double z = 0.0;
    for (int i = 0; i < 5; i++)
        z += exp((double)l[i]);
    assert_true(fabs(w[0] - e1 / z) < 1e-6);
    /* Many rows split over a pool: each row as on one thread. */
    enum { R = 301, E = 128, K = 8 };
    rng_t r = rng_for(15);
    float *lg = malloc(sizeof(float) * R * E), *w1 = malloc(sizeof(float) * R * K), *w3 = malloc(sizeof(float) * R * K);
    int32_t *i1 = malloc(sizeof(int32_t) * R * K), *i3 = malloc(sizeof(int32_t) * R * K);
    rand_vec(&r, lg, R * E, 4.0f);
    kcpu_ctx_t *c = make_ctx(3, KCPU_FAST16, 64, 8, 8, 8);
    float bias[E];
    rand_vec(&r, bias, E, 0.05f);
    const kcpu_route_t many[2] = {{.n_expert = E, .k = K, .gating = KCPU_GATE_SOFTMAX, .norm = 1, .scale = 1.0f},
                                  {.n_expert = E, .k = K, .gating = KCPU_GATE_SIGMOID, .norm = 1, .scale = 2.5f,
                                   .bias = bias}};
    for (int f = 0; f < 2; f++) {
        kcpu_moe_route(NULL, lg, R, &many[f], i1, w1);
        kcpu_moe_route(c, lg, R, &many[f], i3, w3);
        assert_memory_equal(i1, i3, sizeof(int32_t) * R * K);
        assert_memory_equal(w1, w3, sizeof(float) * R * K);
    }
    kcpu_ctx_destroy(c);
    free(lg), free(w1), free(w3), free(i1), free(i3);
}

/* Sigmoid scores (glm4moe, DeepSeek-V3): the bias moves the choice, not the
 * weights; the weights are normed (the sum kept at least 2^-14) and scaled. */
static void test_moe_route_sigmoid(void **state)
{
    (void)state;
    const float l[5] = {0.5f, 2.0f, -1.0f, 1.0f, 0.0f};
    const float bias[5] = {0.0f, 0.0f, 0.9f, 0.0f, 0.0f};
    int32_t ids[2];
    float w[2];
    kcpu_route_t rt = {.n_expert = 5, .k = 2, .gating = KCPU_GATE_SIGMOID, .norm = 0, .scale = 1.0f};
    kcpu_moe_route(NULL, l, 1, &rt, ids, w);
    const double s1 = 1.0 / (1.0 + exp(-2.0)), s2 = 1.0 / (1.0 + exp(1.0)), s3 = 1.0 / (1.0 + exp(-1.0));
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 3);
    assert_true(fabs(w[0] - s1) < 1e-6 && fabs(w[1] - s3) < 1e-6);
    /* sigmoid(-1) + 0.9 = 1.169 passes sigmoid(2) = 0.881: expert 2 first, its
     * weight unbiased */
    rt.bias = bias;
    kcpu_moe_route(NULL, l, 1, &rt, ids, w);
    assert_int_equal(ids[0], 2);
    assert_int_equal(ids[1], 1);
    assert_true(fabs(w[0] - s2) < 1e-6 && fabs(w[1] - s1) < 1e-6);
    rt.norm = 1;
    rt.scale = 2.5f;
    kcpu_moe_route(NULL, l, 1, &rt, ids, w);
    assert_true(fabs(w[0] - 2.5 * s2 / (s1 + s2)) < 1e-5 && fabs(w[1] - 2.5 * s1 / (s1 + s2)) < 1e-5);
    /* scores that all but vanish: the sum is held at 2^-14 */
    const float tiny[5] = {-40.0f, -41.0f, -42.0f, -43.0f, -44.0f};
    rt.bias = NULL;
    rt.scale = 1.0f;
    kcpu_moe_route(NULL, tiny, 1, &rt, ids, w);
    assert_true(fabs(w[0] - (1.0 / (1.0 + exp(40.0))) / 0x1p-14) < 1e-12);
}

/* RoPE over part of each head (glm4moe's n_rot = head_dim / 2): the rotated pairs
 * are (i, i + n_rot/2) with angles of n_rot; the dims past n_rot are untouched. */
static void test_rope_partial(void **state)
{
    (void)state;
    rng_t r = rng_for(23);
    const int64_t hd = 16, nr = 8, nh = 3;
    const int32_t pos[2] = {3, 911};
    float cs[2 * 8], v[2 * 3 * 16], v0[2 * 3 * 16];
    rand_vec(&r, v, 2 * nh * hd, 1.0f);
    memcpy(v0, v, sizeof v);
    const kcpu_rope_t rp = kcpu_rope_plain(nr, 1e4f);
    kcpu_rope_table(cs, pos, 2, &rp);
    kcpu_rope_neox(v, cs, 2, nh, hd, nr);
    for (int64_t b = 0; b < 2; b++)
        for (int64_t h = 0; h < nh; h++) {
            const float *a = v0 + (b * nh + h) * hd, *o = v + (b * nh + h) * hd;
            for (int64_t i = 0; i < nr / 2; i++) {
                const double th = pos[b] * pow(1e4, -2.0 * i / nr);
                assert_true(fabs(o[i] - (a[i] * cos(th) - a[i + nr / 2] * sin(th))) < 1e-5);
                assert_true(fabs(o[i + nr / 2] - (a[i] * sin(th) + a[i + nr / 2] * cos(th))) < 1e-5);
            }
            assert_memory_equal(o + nr, a + nr, sizeof(float) * (size_t)(hd - nr));
        }
}

/* The NORM RoPE (consecutive pairs) at strided heads, with YaRN's angle mix and
 * magnitude as llama.cpp's rope_yarn computes them (written out here in double). */
static void test_rope_norm_yarn(void **state)
{
    (void)state;
    rng_t r = rng_for(29);
    const int64_t nr = 16, nh = 3, hs = 24, ld = 80, off = 8; /* heads of 24 dims, rotated 8..23 */
    const int32_t pos[2] = {5, 3000};
    const kcpu_rope_t y = {.n_rot = nr, .base = 1e4f, .freq_scale = 1.0f / 40.0f, .ext_factor = 1.0f,
                           .corr_lo = 2.0f, .corr_hi = 6.0f, .mscale = 1.25f};
    float cs[2 * 16], v[2 * 80], v0[2 * 80];
    rand_vec(&r, v, 2 * ld, 1.0f);
    memcpy(v0, v, sizeof v);
    kcpu_rope_table(cs, pos, 2, &y);
    kcpu_rope_norm(v + off, cs, 2, nh, ld, hs, nr);
    for (int64_t b = 0; b < 2; b++)
        for (int64_t h = 0; h < nh; h++) {
            const float *a = v0 + b * ld + h * hs + off, *o = v + b * ld + h * hs + off;
            for (int64_t i = 0; i < nr / 2; i++) {
                const double te = pos[b] * pow(1e4, -2.0 * i / nr), ti = te / 40.0;
                double ramp = (i - 2.0) / 4.0;
                ramp = 1.0 - (ramp < 0 ? 0 : ramp > 1 ? 1 : ramp);
                const double th = ti * (1 - ramp) + te * ramp, c = cos(th) * 1.25, s = sin(th) * 1.25;
                assert_true(fabs(o[2 * i] - (a[2 * i] * c - a[2 * i + 1] * s)) < 1e-4);
                assert_true(fabs(o[2 * i + 1] - (a[2 * i] * s + a[2 * i + 1] * c)) < 1e-4);
            }
            /* the head's first off dims are not rotated */
            assert_memory_equal(v + b * ld + h * hs, v0 + b * ld + h * hs, sizeof(float) * (size_t)off);
        }
}

/* DeepSeek-V3's grouped choice: a group scores the sum of its two best, only the
 * topk_group best groups' experts can be chosen. */
static void test_moe_route_groups(void **state)
{
    (void)state;
    /* 8 experts in 4 groups of 2; the two largest logits (experts 0 and 7) sit in
     * groups 0 and 3, but groups 1 and 2 have the best pairs */
    const float l[8] = {3.0f, -3.0f, 1.5f, 1.5f, 1.4f, 1.4f, -3.0f, 2.9f};
    int32_t ids[2];
    float w[2];
    kcpu_route_t rt = {.n_expert = 8, .k = 2, .n_group = 4, .topk_group = 2, .gating = KCPU_GATE_SIGMOID,
                       .norm = 1, .scale = 1.0f};
    kcpu_moe_route(NULL, l, 1, &rt, ids, w);
    assert_int_equal(ids[0], 2); /* a tie (2 and 3): the lower id first */
    assert_int_equal(ids[1], 3);
    rt.topk_group = 4; /* every group: the plain top 2 */
    kcpu_moe_route(NULL, l, 1, &rt, ids, w);
    assert_int_equal(ids[0], 0);
    assert_int_equal(ids[1], 7);
    rt.topk_group = 3; /* groups 1, 2 and then 0 (3.0 - 3.0 = 0 vs 2.9 - 3.0) */
    kcpu_moe_route(NULL, l, 1, &rt, ids, w);
    assert_int_equal(ids[0], 0);
    assert_int_equal(ids[1], 2);
}

/* gpt-oss's experts: biases on gate, up and down, the clamped SwiGLU, against the
 * expert computed in double from the dequantized weights (precise mode); both the
 * grouped pass (few experts) and the expert-by-expert one. And its routing: the top
 * k by logit, weighted by the softmax of those k. */
static void test_experts_biases_oai(void **state)
{
    (void)state;
    rng_t r = rng_for(37);
    const int64_t E = 64, F = 32, K = 2, n = 5;
    for (int big = 0; big < 2; big++) {
        const int64_t NE = big ? 300 : 6; /* past GROUP_MAX: the expert-by-expert pass */
        wmat_t g, u, d;
        make_weights(&r, &g, BL_TYPE_Q8_0, E, F * NE);
        make_weights(&r, &u, BL_TYPE_Q8_0, E, F * NE);
        make_weights(&r, &d, BL_TYPE_Q8_0, F, E * NE);
        float *gb = malloc(sizeof(float) * (size_t)(NE * F)), *ub = malloc(sizeof(float) * (size_t)(NE * F));
        float *db = malloc(sizeof(float) * (size_t)(NE * E)), *xn = malloc(sizeof(float) * (size_t)(n * E));
        float *out = malloc(sizeof(float) * (size_t)(n * E)), wts[5 * 2];
        int32_t ids[5 * 2];
        rand_vec(&r, gb, NE * F, 3.0f);
        rand_vec(&r, ub, NE * F, 3.0f);
        rand_vec(&r, db, NE * E, 0.5f);
        rand_vec(&r, xn, n * E, 3.0f); /* large enough that the clamps at 7 bite */
        for (int64_t i = 0; i < n * K; i++) {
            ids[i] = (int32_t)((i * 7 + big) % NE);
            wts[i] = 0.25f + 0.5f * (float)(i % 2);
        }
        const kcpu_experts_t e = {.gate = g.m, .up = u.m, .down = d.m, .n_expert = NE, .n_ff = F, .n_embd = E,
                                  .act = KCPU_ACT_SWIGLU_OAI, .gate_b = gb, .up_b = ub, .down_b = db};
        kcpu_ctx_t *c = make_ctx(2, KCPU_PRECISE, 64, n, 16, 64);
        kcpu_experts_scratch_t *xs;
        bl_err_t err = {0};
        assert_int_equal(kcpu_experts_scratch_create(&xs, n, K, E, F, &err), 0);
        kcpu_experts(c, xs, &e, xn, n, NULL, K, ids, wts, out);
        int clamped = 0;
        for (int64_t b = 0; b < n; b++)
            for (int64_t j = 0; j < E; j++) {
                double want = 0.0;
                for (int64_t kk = 0; kk < K; kk++) {
                    const int64_t x = ids[b * K + kk];
                    double y = db[x * E + j];
                    for (int64_t f = 0; f < F; f++) {
                        double gv = gb[x * F + f], uv = ub[x * F + f];
                        for (int64_t i = 0; i < E; i++) {
                            gv += (double)g.deq[(x * F + f) * E + i] * xn[b * E + i];
                            uv += (double)u.deq[(x * F + f) * E + i] * xn[b * E + i];
                        }
                        clamped += gv > 7.0 || uv > 7.0 || uv < -7.0;
                        gv = gv < 7.0 ? gv : 7.0;
                        uv = uv < -7.0 ? -7.0 : uv > 7.0 ? 7.0 : uv;
                        y += (double)d.deq[(x * E + j) * F + f] * (gv / (1.0 + exp(-1.702 * gv)) * (uv + 1.0));
                    }
                    want += wts[b * K + kk] * y;
                }
                assert_true(fabs(out[b * E + j] - want) < 1e-3 + 1e-3 * fabs(want));
            }
        assert_true(clamped > 0);
        kcpu_experts_scratch_destroy(xs);
        kcpu_ctx_destroy(c);
        free_weights(&g), free_weights(&u), free_weights(&d);
        free(gb), free(ub), free(db), free(xn), free(out);
    }
    const float l[5] = {0.5f, 2.0f, -1.0f, 1.0f, 0.0f};
    int32_t ids[2];
    float w[2];
    const kcpu_route_t rt = {.n_expert = 5, .k = 2, .gating = KCPU_GATE_SOFTMAX_WEIGHT, .scale = 1.0f};
    kcpu_moe_route(NULL, l, 1, &rt, ids, w);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 3);
    const double z = exp(2.0) + exp(1.0);
    assert_true(fabs(w[0] - exp(2.0) / z) < 1e-6 && fabs(w[1] - exp(1.0) / z) < 1e-6);
}

static void count_task(void *ctx, int ith, int nth)
{
    int *hits = ctx;
    hits[ith] += nth;
}

/* Each thread's CPU set after --cpu-strict: one CPU, the ith of the caller's. */
static void record_cpu(void *ctx, int ith, int nth)
{
    (void)nth;
    int *cpu = ctx;
    cpu_set_t s;
    CPU_ZERO(&s);
    if (pthread_getaffinity_np(pthread_self(), sizeof s, &s) != 0 || CPU_COUNT(&s) != 1) {
        cpu[ith] = -1;
        return;
    }
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &s))
            cpu[ith] = c;
}

static void test_pool_pin_strict(void **state)
{
    (void)state;
    cpu_set_t saved;
    CPU_ZERO(&saved);
    assert_int_equal(pthread_getaffinity_np(pthread_self(), sizeof saved, &saved), 0);
    int cpus[CPU_SETSIZE], nc = 0;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &saved))
            cpus[nc++] = c;
    kcpu_pool_t *p = NULL;
    bl_err_t err = {0};
    enum { N = 5 }; /* more threads than a 2-CPU machine has: they wrap around */
    assert_int_equal(kcpu_pool_create(&p, N, &err), 0);
    assert_int_equal(kcpu_pool_pin_strict(p, &err), 0);
    int got[N];
    for (int i = 0; i < N; i++)
        got[i] = -2;
    kcpu_pool_run(p, record_cpu, got);
    for (int i = 0; i < N; i++)
        assert_int_equal(got[i], cpus[i % nc]);
    kcpu_pool_destroy(p);
    /* the caller was pinned too: give it its CPUs back for the other tests */
    assert_int_equal(pthread_setaffinity_np(pthread_self(), sizeof saved, &saved), 0);
}

static void test_pool_runs_every_thread(void **state)
{
    (void)state;
    kcpu_pool_t *p = NULL;
    bl_err_t err = {0};
    assert_int_equal(kcpu_pool_create(&p, 0, &err), BL_ERANGE);
    assert_int_equal(kcpu_pool_create(&p, 4, &err), 0);
    int hits[4] = {0};
    for (int i = 0; i < 1000; i++)
        kcpu_pool_run(p, count_task, hits);
    for (int i = 0; i < 4; i++)
        assert_int_equal(hits[i], 4000);
    /* Fewer active threads: only they run, each told the smaller count; back to all. */
    assert_int_equal(kcpu_pool_set_active(p, 2), 4);
    assert_int_equal(kcpu_pool_n_threads(p), 2);
    for (int i = 0; i < 1000; i++)
        kcpu_pool_run(p, count_task, hits);
    assert_int_equal(hits[0], 6000);
    assert_int_equal(hits[1], 6000);
    assert_int_equal(hits[2], 4000);
    assert_int_equal(hits[3], 4000);
    assert_int_equal(kcpu_pool_set_active(p, 99), 2); /* clamped to the pool */
    assert_int_equal(kcpu_pool_n_threads(p), 4);
    kcpu_pool_run(p, count_task, hits);
    assert_int_equal(hits[3], 4004);
    assert_int_equal(kcpu_pool_set_active(p, 0), 4);
    assert_int_equal(kcpu_pool_n_threads(p), 1);
    kcpu_pool_run(p, count_task, hits);
    assert_int_equal(hits[0], 6005);
    /* Every poll level (out-of-range ones clamped) runs every thread, with gaps
     * between runs shorter and longer than the wait, so helpers are found yielding,
     * pausing and asleep. */
    assert_int_equal(kcpu_pool_set_active(p, 4), 1);
    const int levels[] = {0, 1, 50, 100, -5, 500};
    for (size_t li = 0; li < sizeof levels / sizeof levels[0]; li++) {
        kcpu_pool_set_poll(p, levels[li]);
        for (int i = 0; i < 20; i++) {
            kcpu_pool_run(p, count_task, hits);
            if (i % 4 == 3)
                usleep(i % 8 == 7 ? 1000 : 100);
        }
    }
    assert_int_equal(hits[0], 6005 + 480); /* 120 runs of 4 threads */
    assert_int_equal(hits[3], 4004 + 480);
    kcpu_pool_destroy(p);
    kcpu_ctx_t *c = NULL;
    const kcpu_limits_t bad = {.max_cols = 0, .max_batch = 1, .max_ctx = 1, .head_dim = 1};
    assert_int_equal(kcpu_ctx_create(&c, 1, KCPU_PRECISE, &bad, &err), BL_ERANGE);
    const kcpu_limits_t ok = {.max_cols = 8, .max_batch = 1, .max_ctx = 1, .head_dim = 1};
    assert_int_equal(kcpu_ctx_create(&c, 1, 7, &ok, &err), BL_EINVAL);
}

/* Scratch that cannot be had is refused with BL_ENOMEM, nothing leaked. (Not under
 * AddressSanitizer, which aborts on an allocation this large by default.) */
static void test_ctx_create_out_of_memory(void **state)
{
    (void)state;
#if defined(__SANITIZE_ADDRESS__)
    skip();
#else
    /* With overcommit_memory=1 the kernel grants any size; then there is no failure
     * to see. */
    FILE *f = fopen("/proc/sys/vm/overcommit_memory", "r");
    int mode = 0;
    if (f) {
        if (fscanf(f, "%d", &mode) != 1)
            mode = 0;
        fclose(f);
    }
    if (mode == 1)
        skip();
    kcpu_ctx_t *c = (kcpu_ctx_t *)1;
    bl_err_t err = {0};
    const kcpu_limits_t huge = {.max_cols = 1 << 24, .max_batch = 1 << 20, .max_ctx = 8, .head_dim = 8};
    assert_int_equal(kcpu_ctx_create(&c, 2, KCPU_FAST16, &huge, &err), BL_ENOMEM);
    assert_null(c);
    assert_non_null(strstr(err.msg, "scratch"));
#endif
}

int main(void)
{
    test_seed_init("test_kernels_cpu_kernels");
    printf("# kernels %s\n", kcpu_init());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul_modes_match_double),
        cmocka_unit_test(test_experts_range_and_slices_bitwise),
        cmocka_unit_test(test_matmul_threads_and_batch_bitwise),
        cmocka_unit_test(test_matmul_many_matches_matmul),
        cmocka_unit_test(test_matmul_ref_and_avx2_agree),
        cmocka_unit_test(test_matmul_avx512_equals_avx2),
        cmocka_unit_test(test_attention_each_cache_type),
        cmocka_unit_test(test_attention_split_equals_batch),
        cmocka_unit_test(test_rms_norm_and_rope),
        cmocka_unit_test(test_moe_route),
        cmocka_unit_test(test_moe_route_sigmoid),
        cmocka_unit_test(test_rope_partial),
        cmocka_unit_test(test_rope_norm_yarn),
        cmocka_unit_test(test_moe_route_groups),
        cmocka_unit_test(test_attention_window_sinks),
        cmocka_unit_test(test_experts_biases_oai),
        cmocka_unit_test(test_pool_runs_every_thread),
        cmocka_unit_test(test_pool_pin_strict),
        cmocka_unit_test(test_ctx_create_out_of_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
