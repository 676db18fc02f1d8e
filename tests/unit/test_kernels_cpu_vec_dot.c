/* Tests for kernels/cpu/vec_dot.c and vec_dot_avx2.c: each scalar reference dot
 * against a double-precision dot of the dequantized operands, and each AVX2 variant
 * against its reference, on fresh random blocks every run at block counts and
 * lengths that hit every tail. The seed is printed; BLOOMERY_TEST_SEED replays it. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "blocks.h"
#include "kcpu.h"
#include "quant.h"
#include "test_seed.h"

static void rand_act(rng_t *r, float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        x[i] = rng_f(r, -1.0f, 1.0f);
        if (rng_next(r) % 61 == 0)
            x[i] *= 20.0f;
    }
}

/* Random bytes for every field, then fp16 scales set to sane values so no block
 * decodes to inf: every bit pattern of quants and sub-scales is exercised. */
static void rand_weights(rng_t *r, uint32_t type, void *dst, int64_t nblocks)
{
    const bl_type_info_t *ti = bl_type_info(type);
    uint8_t *p = dst;
    for (size_t i = 0; i < (size_t)nblocks * ti->block_bytes; i++)
        p[i] = (uint8_t)rng_next(r);
    for (int64_t b = 0; b < nblocks; b++) {
        uint8_t *blk = p + (size_t)b * ti->block_bytes;
        const uint16_t d = bl_fp32_to_fp16(rng_f(r, -0.05f, 0.05f));
        const uint16_t dm = bl_fp32_to_fp16(rng_f(r, 0.0f, 0.05f));
        switch (type) {
        case BL_TYPE_Q8_0: ((bl_block_q8_0 *)blk)->d = d; break;
        case BL_TYPE_Q4_0: ((bl_block_q4_0 *)blk)->d = d; break;
        case BL_TYPE_Q4_K: ((bl_block_q4_K *)blk)->d = d; ((bl_block_q4_K *)blk)->dmin = dm; break;
        case BL_TYPE_Q5_K: ((bl_block_q5_K *)blk)->d = d; ((bl_block_q5_K *)blk)->dmin = dm; break;
        case BL_TYPE_Q6_K: ((bl_block_q6_K *)blk)->d = d; break;
        case BL_TYPE_MXFP4: ((bl_block_mxfp4 *)blk)->e = (uint8_t)(118 + rng_next(r) % 12); break;
        default: fail();
        }
    }
}

typedef float (*dot_fn)(const void *, const void *, int64_t);
typedef float (*dot2_fn)(const void *, const void *, const void *, int64_t);

typedef struct pair {
    const char *name;
    uint32_t wtype, atype;
    dot_fn ref, avx2;
    dot2_fn ref2, avx2_2; /* the fused two-term form (K-quants); NULL where none */
} pair_t;

static const pair_t k_pairs[] = {
    {"q8_0_q8_0", BL_TYPE_Q8_0, BL_TYPE_Q8_0, kcpu_vec_dot_q8_0_q8_0_ref, kcpu_vec_dot_q8_0_q8_0_avx2, NULL, NULL},
    {"q4_0_q8_0", BL_TYPE_Q4_0, BL_TYPE_Q8_0, kcpu_vec_dot_q4_0_q8_0_ref, kcpu_vec_dot_q4_0_q8_0_avx2, NULL, NULL},
    {"mxfp4_q8_0", BL_TYPE_MXFP4, BL_TYPE_Q8_0, kcpu_vec_dot_mxfp4_q8_0_ref, kcpu_vec_dot_mxfp4_q8_0_avx2, NULL,
     NULL},
    {"q4_K_q8_K", BL_TYPE_Q4_K, BL_TYPE_Q8_K, kcpu_vec_dot_q4_K_q8_K_ref, kcpu_vec_dot_q4_K_q8_K_avx2,
     kcpu_vec_dot2_q4_K_q8_K_ref, kcpu_vec_dot2_q4_K_q8_K_avx2},
    {"q5_K_q8_K", BL_TYPE_Q5_K, BL_TYPE_Q8_K, kcpu_vec_dot_q5_K_q8_K_ref, kcpu_vec_dot_q5_K_q8_K_avx2,
     kcpu_vec_dot2_q5_K_q8_K_ref, kcpu_vec_dot2_q5_K_q8_K_avx2},
    {"q6_K_q8_K", BL_TYPE_Q6_K, BL_TYPE_Q8_K, kcpu_vec_dot_q6_K_q8_K_ref, kcpu_vec_dot_q6_K_q8_K_avx2,
     kcpu_vec_dot2_q6_K_q8_K_ref, kcpu_vec_dot2_q6_K_q8_K_avx2},
};

/* Block counts: one block, odd counts, and the largest real row (Qwen3-30B-A3B's
 * 6144-wide rows in q8_0 blocks, 2048-wide in K blocks). */
static const int64_t k_nblocks[] = {1, 2, 3, 5, 7, 8, 13, 17, 24, 192};

/* |a - b| <= abs + rel * scale, where scale is the sum of |w_i x_i| (the size a
 * rounding error can take relative to). */
static int close_enough(double a, double b, double scale, double abs_tol, double rel)
{
    return fabs(a - b) <= abs_tol + rel * scale;
}

static void check_pair(const pair_t *p, int check_avx2)
{
    rng_t r = rng_for((uint64_t)p->wtype * 131 + 7);
    const bl_type_info_t *wi = bl_type_info(p->wtype), *ai = bl_type_info(p->atype);
    int bad = 0;
    for (size_t si = 0; si < sizeof k_nblocks / sizeof k_nblocks[0]; si++) {
        const int64_t nb = k_nblocks[si], n = nb * wi->block_elems;
        for (int rep = 0; rep < 20; rep++) {
            void *w = malloc((size_t)nb * wi->block_bytes);
            void *xq = malloc((size_t)(n / ai->block_elems) * ai->block_bytes);
            float *x = malloc(sizeof(float) * (size_t)n), *wf = malloc(sizeof(float) * (size_t)n);
            float *xf = malloc(sizeof(float) * (size_t)n);
            rand_weights(&r, p->wtype, w, nb);
            rand_act(&r, x, n);
            assert_int_equal(bl_quantize_row_ref(p->atype, x, xq, n), 0);
            assert_int_equal(bl_dequantize_row_ref(p->wtype, w, wf, n), 0);
            assert_int_equal(bl_dequantize_row_ref(p->atype, xq, xf, n), 0);
            double exact = 0.0, scale = 0.0;
            for (int64_t i = 0; i < n; i++) {
                exact += (double)wf[i] * (double)xf[i];
                scale += fabs((double)wf[i] * (double)xf[i]);
            }
            const float ref = p->ref(w, xq, n);
            if (!close_enough(ref, exact, scale, 1e-6, 2e-6)) {
                if (bad++ < 5)
                    print_error("%s_ref: %lld blocks rep %d: ref %.9g exact %.9g (scale %.3g)\n",
                                p->name, (long long)nb, rep, (double)ref, exact, scale);
            }
            if (check_avx2) {
                const float v = p->avx2(w, xq, n);
                if (!close_enough(v, ref, scale, 1e-6, 2e-6)) {
                    if (bad++ < 5)
                        print_error("%s_avx2: %lld blocks rep %d: avx2 %.9g ref %.9g (scale %.3g)\n",
                                    p->name, (long long)nb, rep, (double)v, (double)ref, scale);
                }
            }
            /* The fused two-term form, on the residual an act_q8 matrix's second
             * term holds. */
            if (p->ref2) {
                void *xq2 = malloc((size_t)(n / ai->block_elems) * ai->block_bytes);
                for (int64_t i = 0; i < n; i++)
                    x[i] -= xf[i];
                assert_int_equal(bl_quantize_row_ref(p->atype, x, xq2, n), 0);
                const float r2 = p->ref2(w, xq, xq2, n);
                if (!close_enough(r2, (double)ref + (double)p->ref(w, xq2, n), scale, 1e-6, 2e-6) && bad++ < 5)
                    print_error("%s dot2_ref: %lld blocks rep %d: %.9g\n", p->name, (long long)nb, rep, (double)r2);
                if (check_avx2 && p->avx2_2) {
                    const float v2 = p->avx2_2(w, xq, xq2, n);
                    if (!close_enough(v2, r2, scale, 1e-6, 2e-6) && bad++ < 5)
                        print_error("%s dot2_avx2: %lld blocks rep %d: avx2 %.9g ref %.9g (scale %.3g)\n",
                                    p->name, (long long)nb, rep, (double)v2, (double)r2, scale);
                }
                free(xq2);
            }
            free(w);
            free(xq);
            free(x);
            free(wf);
            free(xf);
        }
    }
    assert_int_equal(bad, 0);
}

static void test_vec_dot_quant_pairs(void **state)
{
    (void)state;
    const int avx2 = kcpu_have_avx2();
    if (!avx2)
        printf("# this CPU lacks AVX2/FMA/F16C: only the references are checked\n");
    for (size_t i = 0; i < sizeof k_pairs / sizeof k_pairs[0]; i++)
        check_pair(&k_pairs[i], avx2);
}

/* Unpacked K-quant rows (the batched matmul's tiles): the AVX2 unpackers write the
 * scalar ones' bytes; the unpacked dots, one and two activation rows, one and two
 * terms, give exactly the bits of the packed AVX2 dots (a row's result must not
 * depend on whether it was batched) and so stay within the references' tolerance;
 * the AVX-512 two-row dots give the AVX2 ones' bits where the CPU has them. */
static void test_vec_dot_unpacked_k_quants(void **state)
{
    (void)state;
    if (!kcpu_have_avx2())
        skip();
    typedef void (*unpack_fn)(const void *, kcpu_kunpacked_t *, int64_t);
    typedef float (*dotu_fn)(const kcpu_kunpacked_t *, const void *, const void *, int64_t);
    typedef void (*dotu2_fn)(const kcpu_kunpacked_t *, const void *, const void *, size_t, int,
                             int64_t, float *);
    const struct {
        uint32_t type;
        unpack_fn ref, avx2;
        dotu_fn dotu;
        dotu2_fn dotu2, dotu2_512;
        dot_fn dot, dot_ref;
        dot2_fn dot2;
    } k[] = {
        {BL_TYPE_Q4_K, kcpu_unpack_q4_K, kcpu_unpack_q4_K_avx2, kcpu_vec_dotu_q4_K_q8_K_avx2,
         kcpu_vec_dotu2_q4_K_q8_K_avx2, kcpu_vec_dotu2_q4_K_q8_K_avx512, kcpu_vec_dot_q4_K_q8_K_avx2,
         kcpu_vec_dot_q4_K_q8_K_ref, kcpu_vec_dot2_q4_K_q8_K_avx2},
        {BL_TYPE_Q5_K, kcpu_unpack_q5_K, kcpu_unpack_q5_K_avx2, kcpu_vec_dotu_q5_K_q8_K_avx2,
         kcpu_vec_dotu2_q5_K_q8_K_avx2, kcpu_vec_dotu2_q5_K_q8_K_avx512, kcpu_vec_dot_q5_K_q8_K_avx2,
         kcpu_vec_dot_q5_K_q8_K_ref, kcpu_vec_dot2_q5_K_q8_K_avx2},
        {BL_TYPE_Q6_K, kcpu_unpack_q6_K, kcpu_unpack_q6_K_avx2, kcpu_vec_dotu_q6_K_q8_K_avx2,
         kcpu_vec_dotu2_q6_K_q8_K_avx2, kcpu_vec_dotu2_q6_K_q8_K_avx512, kcpu_vec_dot_q6_K_q8_K_avx2,
         kcpu_vec_dot_q6_K_q8_K_ref, kcpu_vec_dot2_q6_K_q8_K_avx2},
    };
    int bad = 0;
    for (size_t ti = 0; ti < sizeof k / sizeof k[0]; ti++) {
        rng_t r = rng_for(500 + ti);
        const bl_type_info_t *wi = bl_type_info(k[ti].type);
        for (size_t si = 0; si < sizeof k_nblocks / sizeof k_nblocks[0]; si++) {
            const int64_t nb = k_nblocks[si], n = nb * BL_QK_K;
            const size_t arb = (size_t)nb * sizeof(bl_block_q8_K);
            for (int rep = 0; rep < 8; rep++) {
                void *w = malloc((size_t)nb * wi->block_bytes);
                kcpu_kunpacked_t *ur = malloc(sizeof *ur * (size_t)nb), *ua = malloc(sizeof *ua * (size_t)nb);
                uint8_t *xq = malloc(4 * arb); /* rows a and b, two terms each */
                float *x = malloc(sizeof(float) * (size_t)n), *xf = malloc(sizeof(float) * (size_t)n);
                rand_weights(&r, k[ti].type, w, nb);
                for (int row = 0; row < 2; row++) {
                    rand_act(&r, x, n);
                    bl_quantize_row_q8_K_ref(x, xq + (2 * row) * arb, n);
                    bl_dequantize_row_q8_K_ref(xq + (2 * row) * arb, xf, n);
                    for (int64_t i = 0; i < n; i++)
                        x[i] -= xf[i];
                    bl_quantize_row_q8_K_ref(x, xq + (2 * row + 1) * arb, n);
                }
                k[ti].ref(w, ur, n);
                k[ti].avx2(w, ua, n);
                if (memcmp(ur, ua, sizeof *ur * (size_t)nb) != 0 && bad++ < 5)
                    print_error("type %u: %lld blocks rep %d: AVX2 unpack differs from scalar\n",
                                k[ti].type, (long long)nb, rep);
                for (int row = 0; row < 2; row++) {
                    const uint8_t *x0 = xq + (2 * row) * arb, *x1 = x0 + arb;
                    const float one = k[ti].dotu(ur, x0, NULL, n), two = k[ti].dotu(ur, x0, x1, n);
                    const float p1 = k[ti].dot(w, x0, n), p2 = k[ti].dot2(w, x0, x1, n);
                    if ((memcmp(&one, &p1, sizeof one) != 0 || memcmp(&two, &p2, sizeof two) != 0) &&
                        bad++ < 5)
                        print_error("type %u: %lld blocks rep %d row %d: dotu %.9g %.9g, packed %.9g %.9g\n",
                                    k[ti].type, (long long)nb, rep, row, (double)one, (double)two,
                                    (double)p1, (double)p2);
                    const float ref = k[ti].dot_ref(w, x0, n);
                    /* The kernels round per block in another order than the reference,
                     * so the tolerance scales with the blocks' own magnitudes: |ref|
                     * alone is far smaller when blocks cancel, which long rows of
                     * random signs often do. */
                    double mag = 1.0;
                    for (int64_t i = 0; i < nb; i++)
                        mag += fabs((double)k[ti].dot_ref((const uint8_t *)w + (size_t)i * wi->block_bytes,
                                                          (const bl_block_q8_K *)x0 + i, BL_QK_K));
                    if (!close_enough(one, ref, mag, 1e-5, 1e-4) && bad++ < 5)
                        print_error("type %u: %lld blocks rep %d: dotu %.9g ref %.9g\n", k[ti].type,
                                    (long long)nb, rep, (double)one, (double)ref);
                }
                for (int terms = 1; terms <= 2; terms++) {
                    float o[2];
                    k[ti].dotu2(ur, xq, xq + 2 * arb, arb, terms, n, o);
                    for (int row = 0; row < 2; row++) {
                        const uint8_t *x0 = xq + (2 * row) * arb;
                        const float e = k[ti].dotu(ur, x0, terms == 2 ? x0 + arb : NULL, n);
                        if (memcmp(&o[row], &e, sizeof e) != 0 && bad++ < 5)
                            print_error("type %u: %lld blocks rep %d: dotu2 row %d terms %d %.9g, dotu %.9g\n",
                                        k[ti].type, (long long)nb, rep, row, terms, (double)o[row], (double)e);
                    }
                    if (!kcpu_have_avx512())
                        continue;
                    float o5[2];
                    k[ti].dotu2_512(ur, xq, xq + 2 * arb, arb, terms, n, o5);
                    if (memcmp(o5, o, sizeof o) != 0 && bad++ < 5)
                        print_error("type %u: %lld blocks rep %d terms %d: avx512 dotu2 %.9g %.9g, avx2 %.9g %.9g\n",
                                    k[ti].type, (long long)nb, rep, terms, (double)o5[0], (double)o5[1],
                                    (double)o[0], (double)o[1]);
                }
                free(w);
                free(ur);
                free(ua);
                free(xq);
                free(x);
                free(xf);
            }
        }
    }
    assert_int_equal(bad, 0);
}

/* The extreme activation -128 (llama.cpp-style q8_K can produce it) is handled by
 * the K-quant kernels, which need no sign trick. */
static void test_vec_dot_k_quants_take_minus_128(void **state)
{
    (void)state;
    rng_t r = rng_for(99);
    const uint32_t types[] = {BL_TYPE_Q4_K, BL_TYPE_Q5_K, BL_TYPE_Q6_K};
    const dot_fn refs[] = {kcpu_vec_dot_q4_K_q8_K_ref, kcpu_vec_dot_q5_K_q8_K_ref, kcpu_vec_dot_q6_K_q8_K_ref};
    const dot_fn avx[] = {kcpu_vec_dot_q4_K_q8_K_avx2, kcpu_vec_dot_q5_K_q8_K_avx2, kcpu_vec_dot_q6_K_q8_K_avx2};
    for (int t = 0; t < 3; t++) {
        uint8_t w[3 * 210];
        bl_block_q8_K x[3];
        rand_weights(&r, types[t], w, 3);
        memset(x, 0, sizeof x);
        for (int b = 0; b < 3; b++) {
            x[b].d = 0.01f;
            for (int j = 0; j < BL_QK_K; j++) {
                x[b].qs[j] = (int8_t)(j % 3 == 0 ? -128 : (int)(rng_next(&r) % 255) - 127);
                x[b].bsums[j / 16] = (int16_t)(x[b].bsums[j / 16] + x[b].qs[j]);
            }
        }
        float wf[3 * BL_QK_K];
        assert_int_equal(bl_dequantize_row_ref(types[t], w, wf, 3 * BL_QK_K), 0);
        double exact = 0.0, scale = 0.0;
        for (int i = 0; i < 3 * BL_QK_K; i++) {
            exact += (double)wf[i] * 0.01 * x[i / BL_QK_K].qs[i % BL_QK_K];
            scale += fabs((double)wf[i] * 0.01 * x[i / BL_QK_K].qs[i % BL_QK_K]);
        }
        const float ref = refs[t](w, x, 3 * BL_QK_K);
        assert_true(close_enough(ref, exact, scale, 1e-6, 2e-6));
        if (kcpu_have_avx2())
            assert_true(close_enough(avx[t](w, x, 3 * BL_QK_K), ref, scale, 1e-6, 2e-6));
    }
}

static const int64_t k_lens[] = {1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 100, 128, 255, 256, 257, 1000};

static void test_vec_dot_f32_f16(void **state)
{
    (void)state;
    rng_t r = rng_for(3);
    int bad = 0;
    for (size_t li = 0; li < sizeof k_lens / sizeof k_lens[0]; li++) {
        const int64_t n = k_lens[li];
        float *w = malloc(sizeof(float) * (size_t)n), *x = malloc(sizeof(float) * (size_t)n);
        uint16_t *h = malloc(sizeof(uint16_t) * (size_t)n);
        rand_act(&r, w, n);
        rand_act(&r, x, n);
        bl_quantize_row_f16_ref(w, h, n);
        double e32 = 0.0, e16 = 0.0, scale = 0.0;
        for (int64_t i = 0; i < n; i++) {
            e32 += (double)w[i] * x[i];
            e16 += (double)bl_fp16_to_fp32(h[i]) * x[i];
            scale += fabs((double)w[i] * x[i]);
        }
        const float r32 = kcpu_vec_dot_f32_f32_ref(w, x, n), r16 = kcpu_vec_dot_f16_f32_ref(h, x, n);
        if (!close_enough(r32, e32, scale, 1e-7, 1e-7) || !close_enough(r16, e16, scale, 1e-7, 1e-7))
            if (bad++ < 5)
                print_error("ref n=%lld: f32 %.9g vs %.9g, f16 %.9g vs %.9g\n", (long long)n,
                            (double)r32, e32, (double)r16, e16);
        if (kcpu_have_avx2()) {
            const float a32 = kcpu_vec_dot_f32_f32_avx2(w, x, n), a16 = kcpu_vec_dot_f16_f32_avx2(h, x, n);
            if (!close_enough(a32, r32, scale, 1e-6, 1e-6) || !close_enough(a16, r16, scale, 1e-6, 1e-6))
                if (bad++ < 5)
                    print_error("avx2 n=%lld: f32 %.9g vs ref %.9g, f16 %.9g vs ref %.9g\n",
                                (long long)n, (double)a32, (double)r32, (double)a16, (double)r16);
        }
        free(w);
        free(x);
        free(h);
    }
    assert_int_equal(bad, 0);
}

static void test_axpy(void **state)
{
    (void)state;
    if (!kcpu_have_avx2())
        skip();
    rng_t r = rng_for(4);
    int bad = 0;
    for (size_t li = 0; li < sizeof k_lens / sizeof k_lens[0]; li++) {
        const int64_t n = k_lens[li];
        float *x = malloc(sizeof(float) * (size_t)n), *y0 = malloc(sizeof(float) * (size_t)n);
        float *y1 = malloc(sizeof(float) * (size_t)n), *y2 = malloc(sizeof(float) * (size_t)n);
        float *y3 = malloc(sizeof(float) * (size_t)n);
        uint16_t *h = malloc(sizeof(uint16_t) * (size_t)n);
        rand_act(&r, x, n);
        rand_act(&r, y0, n);
        bl_quantize_row_f16_ref(x, h, n);
        memcpy(y1, y0, sizeof(float) * (size_t)n);
        memcpy(y2, y0, sizeof(float) * (size_t)n);
        memcpy(y3, y0, sizeof(float) * (size_t)n);
        const float a = rng_f(&r, -2.0f, 2.0f);
        kcpu_axpy_f32_ref(y0, a, x, n);
        kcpu_axpy_f32_avx2(y1, a, x, n);
        kcpu_axpy_f16_ref(y2, a, h, n);
        kcpu_axpy_f16_avx2(y3, a, h, n);
        for (int64_t i = 0; i < n; i++)
            if (!close_enough(y1[i], y0[i], fabs(y0[i]), 1e-6, 1e-6) ||
                !close_enough(y3[i], y2[i], fabs(y2[i]), 1e-6, 1e-6))
                if (bad++ < 5)
                    print_error("axpy n=%lld i=%lld: f32 %.9g vs %.9g, f16 %.9g vs %.9g\n",
                                (long long)n, (long long)i, (double)y1[i], (double)y0[i],
                                (double)y3[i], (double)y2[i]);
        free(x); free(y0); free(y1); free(y2); free(y3); free(h);
    }
    assert_int_equal(bad, 0);
}

// --- 16-bit activations (q16_K) ---------------------------------------------------------

/* The AVX2 quantizer writes the reference's bytes; every value is within half a step
 * of its input (and the roundings of d and 1/d) and the sub-block sums are the
 * integers' sums times d. */
static void test_quantize_q16_K(void **state)
{
    (void)state;
    rng_t r = rng_for(600);
    int bad = 0;
    for (size_t si = 0; si < sizeof k_nblocks / sizeof k_nblocks[0]; si++) {
        const int64_t nb = k_nblocks[si], n = nb * BL_QK_K;
        float *x = malloc(sizeof(float) * (size_t)n);
        kcpu_block_q16_K *a = malloc(sizeof *a * (size_t)nb), *b = malloc(sizeof *b * (size_t)nb);
        rand_act(&r, x, n);
        if (si == 0)
            for (int j = 0; j < BL_QK_K; j++)
                x[j] = 0.0f; /* an all-zero block: d 0, q 0 */
        kcpu_quantize_row_q16_K_ref(x, a, n);
        for (int64_t i = 0; i < nb; i++)
            for (int j = 0; j < BL_QK_K; j++) {
                const double e = fabs((double)a[i].d * a[i].q[j] - x[i * BL_QK_K + j]);
                if ((e > 0.51 * a[i].d || a[i].q[j] < -32767) && bad++ < 5)
                    print_error("q16_K %lld blocks: x %.9g -> %d * %.9g\n", (long long)nb,
                                (double)x[i * BL_QK_K + j], a[i].q[j], (double)a[i].d);
            }
        for (int64_t i = 0; i < nb; i++)
            for (int sb = 0; sb < 8; sb++) {
                int32_t sum = 0;
                for (int l = 0; l < 32; l++)
                    sum += a[i].q[32 * sb + l];
                if (a[i].bsum[sb] != a[i].d * (float)sum && bad++ < 5)
                    print_error("q16_K bsum %lld/%d: %.9g\n", (long long)i, sb, (double)a[i].bsum[sb]);
            }
        if (kcpu_have_avx2()) {
            kcpu_quantize_row_q16_K_avx2(x, b, n);
            if (memcmp(a, b, sizeof *a * (size_t)nb) != 0 && bad++ < 5)
                print_error("q16_K %lld blocks: AVX2 bytes differ from the reference\n", (long long)nb);
        }
        free(x);
        free(a);
        free(b);
    }
    assert_int_equal(bad, 0);
}

typedef void (*unpack16_fn)(const void *, kcpu_kunpacked16_t *, int64_t);

static const struct q16_pair {
    uint32_t type;
    dot_fn ref, avx2, avx512;
    unpack16_fn unpack_ref, unpack_avx2;
} k_q16[] = {
    {BL_TYPE_Q4_K, kcpu_vec_dot_q4_K_q16_K_ref, kcpu_vec_dot_q4_K_q16_K_avx2, kcpu_vec_dot_q4_K_q16_K_avx512,
     kcpu_unpack16_q4_K, kcpu_unpack16_q4_K_avx2},
    {BL_TYPE_Q5_K, kcpu_vec_dot_q5_K_q16_K_ref, kcpu_vec_dot_q5_K_q16_K_avx2, kcpu_vec_dot_q5_K_q16_K_avx512,
     kcpu_unpack16_q5_K, kcpu_unpack16_q5_K_avx2},
    {BL_TYPE_Q6_K, kcpu_vec_dot_q6_K_q16_K_ref, kcpu_vec_dot_q6_K_q16_K_avx2, kcpu_vec_dot_q6_K_q16_K_avx512,
     kcpu_unpack16_q6_K, kcpu_unpack16_q6_K_avx2},
};

/* Each AVX-512 dot against the AVX2 dot, bit for bit (the batch tile is AVX2's in
 * both sets, so a row's bits must not change with the set either; the AVX2 dot is
 * held to the reference above), on fresh random weights and activations of every
 * size. */
static void test_vec_dot_q16_K_avx512(void **state)
{
    (void)state;
    if (!kcpu_have_avx512()) {
        print_message("no AVX-512 F/BW/VL/VNNI on this CPU: the avx512 dots are not tested here\n");
        skip();
    }
    int bad = 0;
    for (size_t ti = 0; ti < sizeof k_q16 / sizeof k_q16[0]; ti++) {
        const struct q16_pair *p = &k_q16[ti];
        rng_t r = rng_for(640 + ti);
        const bl_type_info_t *wi = bl_type_info(p->type);
        for (size_t si = 0; si < sizeof k_nblocks / sizeof k_nblocks[0]; si++) {
            const int64_t nb = k_nblocks[si], n = nb * BL_QK_K;
            uint8_t *w = malloc((size_t)nb * wi->block_bytes);
            kcpu_block_q16_K *xq = malloc(sizeof *xq * (size_t)nb);
            float *x = malloc(sizeof(float) * (size_t)n);
            for (int rep = 0; rep < 8; rep++) {
                rand_weights(&r, p->type, w, nb);
                rand_act(&r, x, n);
                kcpu_quantize_row_q16_K_avx2(x, xq, n);
                const float a = p->avx2(w, xq, n), e = p->avx512(w, xq, n);
                if (memcmp(&a, &e, sizeof a) != 0 && bad++ < 5)
                    print_error("type %u: %lld blocks: avx512 %.9g, avx2 %.9g\n", p->type, (long long)nb,
                                (double)e, (double)a);
            }
            free(w);
            free(xq);
            free(x);
        }
    }
    assert_int_equal(bad, 0);
}

/* The AVX-512 q8_0 and mxfp4 dots, one row and two terms, against the AVX2 ones bit
 * for bit, on fresh random weights and activations of every size. */
static void test_vec_dot_q8_0_family_avx512(void **state)
{
    (void)state;
    if (!kcpu_have_avx512()) {
        print_message("no AVX-512 F/BW/VL/VNNI on this CPU: the avx512 q8_0 and mxfp4 dots are not tested here\n");
        skip();
    }
    const struct {
        uint32_t type;
        dot_fn avx2, avx512;
    } k[] = {
        {BL_TYPE_Q8_0, kcpu_vec_dot_q8_0_q8_0_avx2, kcpu_vec_dot_q8_0_q8_0_avx512},
        {BL_TYPE_MXFP4, kcpu_vec_dot_mxfp4_q8_0_avx2, kcpu_vec_dot_mxfp4_q8_0_avx512},
    };
    int bad = 0;
    for (size_t ti = 0; ti < sizeof k / sizeof k[0]; ti++) {
        rng_t r = rng_for(680 + ti);
        const bl_type_info_t *wi = bl_type_info(k[ti].type), *ai = bl_type_info(BL_TYPE_Q8_0);
        for (size_t si = 0; si < sizeof k_nblocks / sizeof k_nblocks[0]; si++) {
            const int64_t nb = k_nblocks[si], n = nb * BL_QK;
            uint8_t *w = malloc((size_t)nb * wi->block_bytes);
            uint8_t *xq = malloc((size_t)nb * ai->block_bytes);
            float *x = malloc(sizeof(float) * (size_t)n);
            for (int rep = 0; rep < 8; rep++) {
                rand_weights(&r, k[ti].type, w, nb);
                rand_act(&r, x, n);
                assert_int_equal(bl_quantize_row_ref(BL_TYPE_Q8_0, x, xq, n), 0);
                const float a = k[ti].avx2(w, xq, n), e = k[ti].avx512(w, xq, n);
                if (memcmp(&a, &e, sizeof a) != 0 && bad++ < 5)
                    print_error("type %u: %lld blocks: avx512 %.9g, avx2 %.9g\n", k[ti].type, (long long)nb,
                                (double)e, (double)a);
            }
            free(w);
            free(xq);
            free(x);
        }
    }
    assert_int_equal(bad, 0);
}

/* The pair dots of q8_0 and mxfp4 (a batch's rows two at a time, one q8_0 term
 * each) against each set's own one-row dot, bit for bit, on fresh random weights and
 * activations of every size: a row's output does not depend on the row beside it. */
typedef void (*dotp_fn)(const void *, const void *, const void *, int64_t, float[2]);
static void test_vec_dotp_q8_0_family(void **state)
{
    (void)state;
    const struct {
        const char *set;
        uint32_t type;
        dot_fn dot;
        dotp_fn dotp;
        int avail;
    } k[] = {
        {"ref", BL_TYPE_Q8_0, kcpu_vec_dot_q8_0_q8_0_ref, kcpu_vec_dotp_q8_0_q8_0_ref, 1},
        {"ref", BL_TYPE_MXFP4, kcpu_vec_dot_mxfp4_q8_0_ref, kcpu_vec_dotp_mxfp4_q8_0_ref, 1},
        {"avx2", BL_TYPE_Q8_0, kcpu_vec_dot_q8_0_q8_0_avx2, kcpu_vec_dotp_q8_0_q8_0_avx2, kcpu_have_avx2()},
        {"avx2", BL_TYPE_MXFP4, kcpu_vec_dot_mxfp4_q8_0_avx2, kcpu_vec_dotp_mxfp4_q8_0_avx2, kcpu_have_avx2()},
        {"avx512", BL_TYPE_Q8_0, kcpu_vec_dot_q8_0_q8_0_avx512, kcpu_vec_dotp_q8_0_q8_0_avx512, kcpu_have_avx512()},
        {"avx512", BL_TYPE_MXFP4, kcpu_vec_dot_mxfp4_q8_0_avx512, kcpu_vec_dotp_mxfp4_q8_0_avx512,
         kcpu_have_avx512()},
    };
    int bad = 0, tested = 0;
    for (size_t ki = 0; ki < sizeof k / sizeof k[0]; ki++) {
        if (!k[ki].avail) {
            print_message("no %s on this CPU: its pair dots are not tested here\n", k[ki].set);
            continue;
        }
        tested++;
        rng_t r = rng_for(720 + ki);
        const bl_type_info_t *wi = bl_type_info(k[ki].type), *ai = bl_type_info(BL_TYPE_Q8_0);
        for (size_t si = 0; si < sizeof k_nblocks / sizeof k_nblocks[0]; si++) {
            const int64_t nb = k_nblocks[si], n = nb * BL_QK;
            const size_t tb = (size_t)nb * ai->block_bytes; /* one q8 row */
            uint8_t *w = malloc((size_t)nb * wi->block_bytes), *xq = malloc(2 * tb);
            float *x = malloc(sizeof(float) * (size_t)n);
            for (int rep = 0; rep < 4; rep++) {
                rand_weights(&r, k[ki].type, w, nb);
                for (int t = 0; t < 2; t++) { /* rows a and b */
                    rand_act(&r, x, n);
                    assert_int_equal(bl_quantize_row_ref(BL_TYPE_Q8_0, x, xq + (size_t)t * tb, n), 0);
                }
                const uint8_t *xa = xq, *xb = xq + tb;
                float o[2];
                k[ki].dotp(w, xa, xb, n, o);
                const float want[2] = {k[ki].dot(w, xa, n), k[ki].dot(w, xb, n)};
                if (memcmp(o, want, sizeof o) != 0 && bad++ < 5)
                    print_error("%s type %u: %lld blocks: pair %.9g %.9g, alone %.9g %.9g\n", k[ki].set, k[ki].type,
                                (long long)nb, (double)o[0], (double)o[1], (double)want[0], (double)want[1]);
            }
            free(w);
            free(xq);
            free(x);
        }
    }
    assert_true(tested >= 2);
    assert_int_equal(bad, 0);
}

/* Each AVX-512 multi-row dot against the one-row dot, bit for bit, at every row
 * count 1..KCPU_DOTN_MAX, on fresh random weights and activations of every size. */
static void test_vec_dotn_q16_K_avx512(void **state)
{
    (void)state;
    if (!kcpu_have_avx512()) {
        print_message("no AVX-512 F/BW/VL/VNNI on this CPU: the avx512 multi-row dots are not tested here\n");
        skip();
    }
    typedef void (*dotn_fn)(const void *, const kcpu_block_q16_K *const *, int, int64_t, float *);
    const dotn_fn dotn[] = {kcpu_vec_dotn_q4_K_q16_K_avx512, kcpu_vec_dotn_q5_K_q16_K_avx512,
                            kcpu_vec_dotn_q6_K_q16_K_avx512};
    int bad = 0;
    for (size_t ti = 0; ti < sizeof k_q16 / sizeof k_q16[0]; ti++) {
        const struct q16_pair *p = &k_q16[ti];
        rng_t r = rng_for(660 + ti);
        const bl_type_info_t *wi = bl_type_info(p->type);
        for (size_t si = 0; si < sizeof k_nblocks / sizeof k_nblocks[0]; si++) {
            const int64_t nb = k_nblocks[si], n = nb * BL_QK_K;
            uint8_t *w = malloc((size_t)nb * wi->block_bytes);
            kcpu_block_q16_K *xq = malloc(sizeof *xq * (size_t)(nb * KCPU_DOTN_MAX));
            float *x = malloc(sizeof(float) * (size_t)n);
            rand_weights(&r, p->type, w, nb);
            const kcpu_block_q16_K *rows[KCPU_DOTN_MAX];
            for (int c = 0; c < KCPU_DOTN_MAX; c++) {
                rand_act(&r, x, n);
                kcpu_quantize_row_q16_K_avx2(x, xq + c * nb, n);
                /* rows in no particular order, as an expert's routed rows are */
                rows[c] = xq + ((c * 3) % KCPU_DOTN_MAX) * nb;
            }
            for (int nx = 1; nx <= KCPU_DOTN_MAX; nx++) {
                float o[KCPU_DOTN_MAX];
                dotn[ti](w, rows, nx, n, o);
                for (int c = 0; c < nx; c++) {
                    const float e = p->avx512(w, rows[c], n);
                    if (memcmp(&o[c], &e, sizeof e) != 0 && bad++ < 5)
                        print_error("type %u: %lld blocks, %d rows: row %d %.9g, one-row dot %.9g\n", p->type,
                                    (long long)nb, nx, c, (double)o[c], (double)e);
                }
            }
            free(w);
            free(xq);
            free(x);
        }
    }
    assert_int_equal(bad, 0);
}

/* Each reference against the double dot of the dequantized operands; each packed
 * AVX2 dot against its reference; the unpackers' AVX2 bytes against the scalar
 * ones; and the batched tile, at every shape (1-2 weight rows by 1-4 activation
 * rows), against the packed AVX2 dot bit for bit, and its AVX-512 form (where the
 * CPU has it) against the AVX2 tile. */
static void test_vec_dot_q16_K(void **state)
{
    (void)state;
    const int avx2 = kcpu_have_avx2();
    int bad = 0;
    for (size_t ti = 0; ti < sizeof k_q16 / sizeof k_q16[0]; ti++) {
        const struct q16_pair *p = &k_q16[ti];
        rng_t r = rng_for(610 + ti);
        const bl_type_info_t *wi = bl_type_info(p->type);
        for (size_t si = 0; si < sizeof k_nblocks / sizeof k_nblocks[0]; si++) {
            const int64_t nb = k_nblocks[si], n = nb * BL_QK_K;
            for (int rep = 0; rep < 6; rep++) {
                uint8_t *w = malloc(2 * (size_t)nb * wi->block_bytes);
                kcpu_block_q16_K *xq = malloc(sizeof *xq * 4 * (size_t)nb);
                kcpu_kunpacked16_t *ur = malloc(sizeof *ur * 2 * (size_t)nb), *ua = malloc(sizeof *ua * 2 * (size_t)nb);
                float *x = malloc(sizeof(float) * (size_t)n), *wf = malloc(sizeof(float) * (size_t)n);
                rand_weights(&r, p->type, w, 2 * nb);
                for (int c = 0; c < 4; c++) {
                    rand_act(&r, x, n);
                    kcpu_quantize_row_q16_K_ref(x, xq + c * nb, n);
                }
                assert_int_equal(bl_dequantize_row_ref(p->type, w, wf, n), 0);
                double exact = 0.0, scale = 0.0;
                for (int64_t i = 0; i < n; i++) {
                    const double xv = (double)xq[i / BL_QK_K].d * xq[i / BL_QK_K].q[i % BL_QK_K];
                    exact += (double)wf[i] * xv;
                    scale += fabs((double)wf[i] * xv);
                }
                const float ref = p->ref(w, xq, n);
                if (!close_enough(ref, exact, scale, 1e-6, 2e-6) && bad++ < 5)
                    print_error("type %u q16_K ref: %lld blocks: %.9g exact %.9g\n", p->type,
                                (long long)nb, (double)ref, exact);
                if (avx2) {
                    const float v = p->avx2(w, xq, n);
                    if (!close_enough(v, ref, scale, 1e-6, 2e-6) && bad++ < 5)
                        print_error("type %u q16_K avx2: %lld blocks: %.9g ref %.9g\n", p->type,
                                    (long long)nb, (double)v, (double)ref);

                    p->unpack_ref(w, ur, 2 * n);
                    p->unpack_avx2(w, ua, 2 * n);
                    if (memcmp(ur, ua, sizeof *ur * 2 * (size_t)nb) != 0 && bad++ < 5)
                        print_error("type %u: %lld blocks: AVX2 unpack16 differs\n", p->type, (long long)nb);
                    const kcpu_kunpacked16_t *u2[2] = {ur, ur + nb};
                    const kcpu_block_q16_K *x4[4] = {xq, xq + nb, xq + 2 * nb, xq + 3 * nb};
                    for (int nr = 1; nr <= 2; nr++)
                        for (int nc = 1; nc <= 4; nc++) {
                            float o[8];
                            kcpu_gemm_u16_q16_K_avx2(u2, nr, x4, nc, nb, p->type == BL_TYPE_Q6_K, o);
                            for (int rr = 0; rr < nr; rr++)
                                for (int c = 0; c < nc; c++) {
                                    const float e = p->avx2(w + (size_t)rr * nb * wi->block_bytes, x4[c], n);
                                    if (memcmp(&e, &o[4 * rr + c], sizeof e) != 0 && bad++ < 5)
                                        print_error("type %u: %lld blocks tile %dx%d (%d,%d): %.9g packed %.9g\n",
                                                    p->type, (long long)nb, nr, nc, rr, c,
                                                    (double)o[4 * rr + c], (double)e);
                                }
                            if (!kcpu_have_avx512())
                                continue;
                            float o5[8];
                            kcpu_gemm_u16_q16_K_avx512(u2, nr, x4, nc, nb, p->type == BL_TYPE_Q6_K, o5);
                            for (int rr = 0; rr < nr; rr++)
                                for (int c = 0; c < nc; c++)
                                    if (memcmp(&o5[4 * rr + c], &o[4 * rr + c], sizeof o[0]) != 0 && bad++ < 5)
                                        print_error("type %u: %lld blocks avx512 tile %dx%d (%d,%d): %.9g avx2 %.9g\n",
                                                    p->type, (long long)nb, nr, nc, rr, c, (double)o5[4 * rr + c],
                                                    (double)o[4 * rr + c]);
                        }
                }
                free(w); free(xq); free(ur); free(ua); free(x); free(wf);
            }
        }
    }
    assert_int_equal(bad, 0);
}

/* The int32 lane bounds: the largest weights times scale (q5_K 31 * 63, q6_K -32 *
 * -128) against activations of +-32767 everywhere sum without overflow. */
static void test_vec_dot_q16_K_extremes(void **state)
{
    (void)state;
    enum { NB = 3 };
    kcpu_block_q16_K x[NB];
    float xf[NB * BL_QK_K];
    for (int i = 0; i < NB * BL_QK_K; i++)
        xf[i] = i < BL_QK_K ? 1.0f : i < 2 * BL_QK_K ? -1.0f : (i % 2 ? 1.0f : -1.0f);
    kcpu_quantize_row_q16_K_ref(xf, x, NB * BL_QK_K);
    assert_int_equal(x[0].q[0], 32767);
    bl_block_q5_K w5[NB];
    bl_block_q6_K w6[NB];
    memset(w5, 0xff, sizeof w5); /* q 31, scales and mins 63 */
    memset(w6, 0, sizeof w6);    /* q 0: q - 32 = -32 */
    for (int b = 0; b < NB; b++) {
        w5[b].d = bl_fp32_to_fp16(0.01f);
        w5[b].dmin = 0;
        memset(w6[b].scales, 0x80, sizeof w6[b].scales); /* -128 */
        w6[b].d = bl_fp32_to_fp16(0.01f);
    }
    const struct { const void *w; uint32_t type; dot_fn ref, avx2, avx512; } k[] = {
        {w5, BL_TYPE_Q5_K, kcpu_vec_dot_q5_K_q16_K_ref, kcpu_vec_dot_q5_K_q16_K_avx2, kcpu_vec_dot_q5_K_q16_K_avx512},
        {w6, BL_TYPE_Q6_K, kcpu_vec_dot_q6_K_q16_K_ref, kcpu_vec_dot_q6_K_q16_K_avx2, kcpu_vec_dot_q6_K_q16_K_avx512},
    };
    for (int t = 0; t < 2; t++) {
        float wf[NB * BL_QK_K];
        assert_int_equal(bl_dequantize_row_ref(k[t].type, k[t].w, wf, NB * BL_QK_K), 0);
        double exact = 0.0, scale = 0.0;
        for (int i = 0; i < NB * BL_QK_K; i++) {
            const double xv = (double)x[i / BL_QK_K].d * x[i / BL_QK_K].q[i % BL_QK_K];
            exact += wf[i] * xv;
            scale += fabs(wf[i] * xv);
        }
        const float ref = k[t].ref(k[t].w, x, NB * BL_QK_K);
        assert_true(close_enough(ref, exact, scale, 1e-6, 2e-6));
        if (kcpu_have_avx2()) {
            const float v = k[t].avx2(k[t].w, x, NB * BL_QK_K);
            assert_true(close_enough(v, ref, scale, 1e-6, 2e-6));
            if (kcpu_have_avx512()) { /* the same integers at the bounds, so the same bits */
                const float e = k[t].avx512(k[t].w, x, NB * BL_QK_K);
                assert_memory_equal(&e, &v, sizeof e);
            }
            kcpu_kunpacked16_t u[NB];
            if (k[t].type == BL_TYPE_Q5_K)
                kcpu_unpack16_q5_K_avx2(k[t].w, u, NB * BL_QK_K);
            else
                kcpu_unpack16_q6_K_avx2(k[t].w, u, NB * BL_QK_K);
            const kcpu_kunpacked16_t *u2[2] = {u, u};
            const kcpu_block_q16_K *x4[4] = {x, x, x, x};
            float o[8];
            kcpu_gemm_u16_q16_K_avx2(u2, 1, x4, 1, NB, k[t].type == BL_TYPE_Q6_K, o);
            assert_true(close_enough(o[0], ref, scale, 1e-6, 2e-6));
        }
    }
}

/* Attention over an f16 cache, a KV head's query heads at once: the AVX2 kernels
 * against the references for group sizes with and without a fixed-size path. */
static void test_attention_f16_group(void **state)
{
    (void)state;
    if (!kcpu_have_avx2())
        skip();
    rng_t r = rng_for(620);
    const int ngs[] = {1, 3, 4, 8};
    const int64_t hds[] = {8, 64, 128};
    const int64_t lens[] = {1, 2, 7, 33};
    int bad = 0;
    for (size_t hi = 0; hi < 3; hi++)
        for (size_t gi = 0; gi < 4; gi++)
            for (size_t li = 0; li < 4; li++) {
                const int64_t hd = hds[hi], len = lens[li], stride = 3 * hd, ld = 40;
                const int ng = ngs[gi];
                float *q = malloc(sizeof(float) * (size_t)(ng * hd)), *tmp = malloc(sizeof(float) * (size_t)(len * stride));
                uint16_t *kv = malloc(sizeof(uint16_t) * (size_t)(len * stride));
                float *s0 = calloc((size_t)(ng * ld), sizeof(float)), *s1 = calloc((size_t)(ng * ld), sizeof(float));
                float *o0 = malloc(sizeof(float) * (size_t)(ng * hd)), *o1 = malloc(sizeof(float) * (size_t)(ng * hd));
                rand_act(&r, q, ng * hd);
                rand_act(&r, tmp, len * stride);
                bl_quantize_row_f16_ref(tmp, kv, len * stride);
                kcpu_att_qk_f16_ref(q, ng, kv + hd, stride, len, hd, 0.125f, s0, ld);
                kcpu_att_qk_f16_avx2(q, ng, kv + hd, stride, len, hd, 0.125f, s1, ld);
                for (int64_t i = 0; i < ng * ld; i++)
                    if (!close_enough(s1[i], s0[i], 1.0 + fabs(s0[i]), 1e-6, 1e-5) && bad++ < 5)
                        print_error("att qk hd %lld ng %d len %lld: [%lld] %.9g ref %.9g\n", (long long)hd,
                                    ng, (long long)len, (long long)i, (double)s1[i], (double)s0[i]);
                kcpu_att_pv_f16_ref(s0, ng, ld, kv + 2 * hd, stride, len, hd, o0);
                kcpu_att_pv_f16_avx2(s0, ng, ld, kv + 2 * hd, stride, len, hd, o1);
                for (int64_t i = 0; i < ng * hd; i++)
                    if (!close_enough(o1[i], o0[i], 1.0 + fabs(o0[i]), 1e-6, 1e-5) && bad++ < 5)
                        print_error("att pv hd %lld ng %d len %lld: [%lld] %.9g ref %.9g\n", (long long)hd,
                                    ng, (long long)len, (long long)i, (double)o1[i], (double)o0[i]);
                free(q); free(tmp); free(kv); free(s0); free(s1); free(o0); free(o1);
            }
    assert_int_equal(bad, 0);
}

/* The AVX2 softmax exponential against libm's expf, relative to it, on fresh random
 * arguments over the whole range a softmax gives (0 down to past the underflow) and
 * every tail length; -inf and arguments below -87.3 give 0. */
static void test_exp_sub(void **state)
{
    (void)state;
    if (!kcpu_have_avx2())
        skip();
    rng_t r = rng_for(700);
    enum { N = 4099 };
    float *x = malloc(sizeof(float) * N), *a = malloc(sizeof(float) * N), *b = malloc(sizeof(float) * N);
    double worst = 0.0;
    int bad = 0;
    for (int rep = 0; rep < 40; rep++) {
        const float m = rng_f(&r, -20.0f, 20.0f);
        const int64_t n = 1 + (int64_t)(rng_next(&r) % N);
        for (int64_t i = 0; i < n; i++)
            x[i] = m - (rep % 4 == 0 ? rng_f(&r, 0.0f, 1.0f) : rng_f(&r, 0.0f, 95.0f));
        x[0] = m;
        if (n > 2)
            x[n - 1] = -INFINITY;
        memcpy(a, x, sizeof(float) * (size_t)n);
        memcpy(b, x, sizeof(float) * (size_t)n);
        kcpu_exp_sub_ref(a, n, m);
        kcpu_exp_sub_avx2(b, n, m);
        for (int64_t i = 0; i < n; i++) {
            /* the argument is the kernel's: x - m rounded to float (an exact difference
             * a hair below -87.3 may round to -87.3f itself, which is not below it) */
            const float v = x[i] - m;
            const double arg = (double)v;
            if (v < -87.3f) {
                if (b[i] != 0.0f && bad++ < 5)
                    print_error("exp(%.9g) = %.9g, want 0 below -87.3\n", arg, (double)b[i]);
                continue;
            }
            const double rel = fabs((double)b[i] - (double)a[i]) / (double)a[i];
            worst = rel > worst ? rel : worst;
            if (rel > 3e-7 && bad++ < 5)
                print_error("exp(%.9g): avx2 %.9g, expf %.9g (rel %.3g)\n", arg, (double)b[i], (double)a[i], rel);
        }
    }
    print_message("worst relative error %.3g\n", worst);
    free(x);
    free(a);
    free(b);
    assert_int_equal(bad, 0);
}

/* A logits row's most likely entry, AVX2 against the double reference on fresh
 * random rows of every tail length up to a real vocabulary's 151,936: the same
 * index, p within a relative 1e-5; ties (the first wins), NaN values (ignored),
 * -inf, a row of one value, and rows with no finite maximum. */
static void test_row_top1(void **state)
{
    (void)state;
    rng_t r = rng_for(701);
    enum { N = 151936 };
    float *x = malloc(sizeof(float) * N);
    assert_non_null(x);
    float p = -1.0f;
    assert_int_equal(kcpu_row_top1_ref(x, 0, &p), -1);
    assert_true(p == 0.0f);
    double worst = 0.0;
    for (int rep = 0; rep < 60; rep++) {
        const int64_t n = rep < 20 ? 1 + (int64_t)(rng_next(&r) % 70) : rep < 55 ? 1 + (int64_t)(rng_next(&r) % N) : N;
        const float spread = rep % 3 == 0 ? 0.5f : rep % 3 == 1 ? 8.0f : 40.0f;
        for (int64_t i = 0; i < n; i++)
            x[i] = rng_f(&r, -spread, spread);
        if (rep % 5 == 1 && n > 3) /* a tie: the earlier one wins */
            x[n - 1] = x[n / 2] = spread + 1.0f;
        if (rep % 5 == 2 && n > 3) { /* NaN, including where it would be the largest */
            x[0] = NAN;
            x[n - 2] = NAN;
            x[rng_next(&r) % (uint64_t)n] = -INFINITY;
        }
        if (rep % 7 == 3) /* one clear winner at the tail */
            x[n - 1] = spread * 4.0f;
        float pr = 0.0f, pv = 0.0f;
        const int64_t ir = kcpu_row_top1_ref(x, n, &pr);
        /* the reference's own definition, checked by a plain scan */
        int64_t want = -1;
        for (int64_t i = 0; i < n; i++)
            if (!isnan(x[i]) && (want < 0 || x[i] > x[want]))
                want = i;
        assert_int_equal(ir, want < 0 ? 0 : want);
        assert_true(pr > 0.0f && pr <= 1.0f);
        assert_int_equal(kcpu_row_top1_ref(x, n, NULL), ir);
        if (!kcpu_have_avx2())
            continue;
        const int64_t iv = kcpu_row_top1_avx2(x, n, &pv);
        assert_int_equal(kcpu_row_top1_avx2(x, n, NULL), iv);
        if (iv != ir)
            fail_msg("n %lld rep %d: avx2 index %lld, reference %lld", (long long)n, rep, (long long)iv, (long long)ir);
        const double rel = fabs((double)pv - (double)pr) / (double)pr;
        worst = rel > worst ? rel : worst;
        if (rel > 1e-5)
            fail_msg("n %lld rep %d: avx2 p %.9g, reference %.9g (rel %.3g)", (long long)n, rep, (double)pv, (double)pr, rel);
    }
    print_message("worst relative error of p %.3g\n", worst);
    /* no finite maximum: p 0, the first index of the largest (-inf, +inf) or 0 (all NaN) */
    for (int kind = 0; kind < 3; kind++) {
        const int64_t n = 37;
        for (int64_t i = 0; i < n; i++)
            x[i] = kind == 0 ? -INFINITY : kind == 1 ? NAN : rng_f(&r, -1.0f, 1.0f);
        if (kind == 2)
            x[9] = x[20] = INFINITY;
        if (kind == 1)
            x[5] = NAN;
        const int64_t want = kind == 2 ? 9 : 0;
        for (int v = 0; v < 2; v++) {
            if (v == 1 && !kcpu_have_avx2())
                break;
            p = -1.0f;
            assert_int_equal(v ? kcpu_row_top1_avx2(x, n, &p) : kcpu_row_top1_ref(x, n, &p), want);
            assert_true(p == 0.0f);
        }
    }
    /* one value repeated: the first index, p = 1 / n */
    for (int64_t i = 0; i < 1000; i++)
        x[i] = 3.25f;
    assert_int_equal(kcpu_row_top1(x, 1000, &p), 0);
    assert_true(fabs(p - 1e-3) < 1e-8);
    free(x);
}

static void test_kernel_set_selection(void **state)
{
    (void)state;
    const char *name = kcpu_init();
    const char *force = getenv("BLOOMERY_CPU_KERNELS");
    if (force && !strcmp(force, "ref"))
        assert_string_equal(name, "ref");
    else if (force && !strcmp(force, "avx2") && kcpu_have_avx2())
        assert_string_equal(name, "avx2");
    else /* the widest the CPU runs */
        assert_string_equal(name, kcpu_have_avx512() ? "avx512" : kcpu_have_avx2() ? "avx2" : "ref");
    assert_true(!kcpu_have_avx512() || kcpu_have_avx2());
    assert_int_equal(kcpu_select("avx512"), kcpu_have_avx512() ? 0 : BL_ENOTSUP);
    if (kcpu_have_avx512())
        assert_string_equal(kcpu_variant_name(), "avx512");
    assert_int_equal(kcpu_select("ref"), 0);
    assert_string_equal(kcpu_variant_name(), "ref");
    assert_int_equal(kcpu_select("avx9"), BL_EINVAL);
    assert_int_equal(kcpu_select("avx2"), kcpu_have_avx2() ? 0 : BL_ENOTSUP);
    assert_int_equal(kcpu_act_type(BL_TYPE_Q4_K), BL_TYPE_Q8_K);
    assert_int_equal(kcpu_act_type(BL_TYPE_Q4_0), BL_TYPE_Q8_0);
    assert_int_equal(kcpu_act_type(BL_TYPE_IQ2_XXS), -1);
}

// --- 16-bit activations in blocks of 32 (q16_0) --------------------------------------------

/* The AVX2 quantizer writes the reference's bytes, and every value is within half a
 * step of its input. */
static void test_quantize_q16_0(void **state)
{
    (void)state;
    rng_t r = rng_for(700);
    int bad = 0;
    for (size_t si = 0; si < sizeof k_nblocks / sizeof k_nblocks[0]; si++) {
        const int64_t nb = k_nblocks[si], n = nb * BL_QK;
        float *x = malloc(sizeof(float) * (size_t)n);
        kcpu_block_q16_0 *a = malloc(sizeof *a * (size_t)nb), *b = malloc(sizeof *b * (size_t)nb);
        rand_act(&r, x, n);
        if (si == 0)
            for (int j = 0; j < BL_QK; j++)
                x[j] = 0.0f; /* an all-zero block: d 0, q 0 */
        kcpu_quantize_row_q16_0_ref(x, a, n);
        for (int64_t i = 0; i < nb; i++) {
            int top = 0;
            for (int j = 0; j < BL_QK; j++) {
                const double e = fabs((double)a[i].d * a[i].q[j] - x[i * BL_QK + j]);
                top |= a[i].q[j] == 32767 || a[i].q[j] == -32767;
                if ((e > 0.51 * a[i].d || a[i].q[j] < -32767) && bad++ < 5)
                    print_error("q16_0 %lld blocks: x %.9g -> %d * %.9g\n", (long long)nb,
                                (double)x[i * BL_QK + j], a[i].q[j], (double)a[i].d);
            }
            if (!top && a[i].d != 0.0f && bad++ < 5) /* the largest value takes the whole range */
                print_error("q16_0 block %lld: no value at +-32767\n", (long long)i);
        }
        if (kcpu_have_avx2()) {
            kcpu_quantize_row_q16_0_avx2(x, b, n);
            if (memcmp(a, b, sizeof *a * (size_t)nb) != 0 && bad++ < 5)
                print_error("q16_0 %lld blocks: AVX2 bytes differ from the reference\n", (long long)nb);
        }
        free(x);
        free(a);
        free(b);
    }
    assert_int_equal(bad, 0);
}

typedef void (*dotn0_fn)(const void *, const kcpu_block_q16_0 *const *, int, int64_t, float *);

static const struct q16_0_pair {
    uint32_t type;
    dot_fn ref;
    dotn0_fn dotn_ref, dotn_avx2;
} k_q16_0[] = {
    {BL_TYPE_Q8_0, kcpu_vec_dot_q8_0_q16_0_ref, kcpu_vec_dotn_q8_0_q16_0_ref, kcpu_vec_dotn_q8_0_q16_0_avx2},
    {BL_TYPE_Q4_0, kcpu_vec_dot_q4_0_q16_0_ref, kcpu_vec_dotn_q4_0_q16_0_ref, kcpu_vec_dotn_q4_0_q16_0_avx2},
    {BL_TYPE_MXFP4, kcpu_vec_dot_mxfp4_q16_0_ref, kcpu_vec_dotn_mxfp4_q16_0_ref, kcpu_vec_dotn_mxfp4_q16_0_avx2},
};

/* Each reference against the double dot of the dequantized operands; the AVX2
 * multi-row dot against the reference (within float rounding) and, at every row
 * count 1..KCPU_DOTN_MAX with the rows in any order, against its own one-row form
 * bit for bit; the ref multi-row dot is the reference's. */
static void test_vec_dot_q16_0(void **state)
{
    (void)state;
    const int avx2 = kcpu_have_avx2();
    int bad = 0;
    for (size_t ti = 0; ti < sizeof k_q16_0 / sizeof k_q16_0[0]; ti++) {
        const struct q16_0_pair *p = &k_q16_0[ti];
        rng_t r = rng_for(710 + ti);
        const bl_type_info_t *wi = bl_type_info(p->type);
        for (size_t si = 0; si < sizeof k_nblocks / sizeof k_nblocks[0]; si++) {
            const int64_t nb = k_nblocks[si], n = nb * BL_QK;
            uint8_t *w = malloc((size_t)nb * wi->block_bytes);
            float *wf = malloc(sizeof(float) * (size_t)n), *x = malloc(sizeof(float) * (size_t)n);
            kcpu_block_q16_0 *xq = malloc(sizeof *xq * (size_t)(nb * KCPU_DOTN_MAX));
            rand_weights(&r, p->type, w, nb);
            assert_int_equal(bl_dequantize_row_ref(p->type, w, wf, n), 0);
            const kcpu_block_q16_0 *rows[KCPU_DOTN_MAX];
            float ref[KCPU_DOTN_MAX];
            for (int c = 0; c < KCPU_DOTN_MAX; c++) {
                rand_act(&r, x, n);
                kcpu_block_q16_0 *q = xq + c * nb;
                kcpu_quantize_row_q16_0_ref(x, q, n);
                double exact = 0.0, scale = 0.0;
                for (int64_t i = 0; i < n; i++) {
                    const double v = (double)wf[i] * ((double)q[i / BL_QK].d * q[i / BL_QK].q[i % BL_QK]);
                    exact += v;
                    scale += fabs(v);
                }
                ref[c] = p->ref(w, q, n);
                if (!close_enough(ref[c], exact, scale, 1e-6, 1e-6) && bad++ < 5)
                    print_error("type %u q16_0 ref: %lld blocks: %.9g exact %.9g\n", p->type, (long long)nb,
                                (double)ref[c], exact);
            }
            /* rows in no particular order, as an expert's routed rows are */
            for (int c = 0; c < KCPU_DOTN_MAX; c++)
                rows[c] = xq + ((c * 3) % KCPU_DOTN_MAX) * nb;
            for (int nx = 1; nx <= KCPU_DOTN_MAX; nx++) {
                float o[KCPU_DOTN_MAX];
                p->dotn_ref(w, rows, nx, n, o);
                for (int c = 0; c < nx; c++)
                    if (o[c] != ref[(c * 3) % KCPU_DOTN_MAX] && bad++ < 5)
                        print_error("type %u q16_0 ref rows: %d rows, row %d\n", p->type, nx, c);
                if (!avx2)
                    continue;
                p->dotn_avx2(w, rows, nx, n, o);
                for (int c = 0; c < nx; c++) {
                    float one;
                    p->dotn_avx2(w, &rows[c], 1, n, &one);
                    const float rc = ref[(c * 3) % KCPU_DOTN_MAX];
                    double scale = 0.0;
                    for (int64_t i = 0; i < n; i++)
                        scale += fabs((double)wf[i] * ((double)rows[c][i / BL_QK].d * rows[c][i / BL_QK].q[i % BL_QK]));
                    if (memcmp(&o[c], &one, sizeof one) != 0 && bad++ < 5)
                        print_error("type %u q16_0 avx2: %lld blocks, %d rows: row %d %.9g, one row %.9g\n", p->type,
                                    (long long)nb, nx, c, (double)o[c], (double)one);
                    if (!close_enough(o[c], rc, scale, 1e-6, 2e-6) && bad++ < 5)
                        print_error("type %u q16_0 avx2: %lld blocks: %.9g ref %.9g\n", p->type, (long long)nb,
                                    (double)o[c], (double)rc);
                }
            }
            free(w);
            free(wf);
            free(x);
            free(xq);
        }
    }
    if (!avx2)
        print_message("no AVX2/FMA/F16C on this CPU: the AVX2 q16_0 dots are not tested here\n");
    assert_int_equal(bad, 0);
}

/* The largest products: q8_0 weights of -128 and 127 (a file may hold -128) against
 * activations of +-32767 put a lane's four products at 2^24 - 512, whose float is
 * still exact; the AVX2 dot must equal the exact sum times the scales. */
static void test_vec_dot_q16_0_extremes(void **state)
{
    (void)state;
    if (!kcpu_have_avx2())
        skip();
    enum { NB = 8 };
    bl_block_q8_0 w[NB];
    kcpu_block_q16_0 x[NB];
    for (int i = 0; i < NB; i++) {
        w[i].d = bl_fp32_to_fp16(1.0f);
        x[i].d = 1.0f;
        for (int j = 0; j < BL_QK; j++) {
            w[i].qs[j] = (int8_t)(i % 2 ? 127 : -128);
            x[i].q[j] = (int16_t)(i % 4 < 2 ? -32767 : 32767);
        }
    }
    const kcpu_block_q16_0 *rows[1] = {x};
    double exact = 0.0;
    for (int i = 0; i < NB; i++)
        exact += (double)BL_QK * w[i].qs[0] * x[i].q[0];
    float o;
    kcpu_vec_dotn_q8_0_q16_0_avx2(w, rows, 1, NB * BL_QK, &o);
    assert_true((double)o == exact);
    assert_true((double)kcpu_vec_dot_q8_0_q16_0_ref(w, x, NB * BL_QK) == exact);
}

int main(void)
{
    test_seed_init("test_kernels_cpu_vec_dot");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vec_dot_quant_pairs),
        cmocka_unit_test(test_vec_dot_k_quants_take_minus_128),
        cmocka_unit_test(test_vec_dot_unpacked_k_quants),
        cmocka_unit_test(test_vec_dot_f32_f16),
        cmocka_unit_test(test_axpy),
        cmocka_unit_test(test_quantize_q16_K),
        cmocka_unit_test(test_vec_dot_q16_K),
        cmocka_unit_test(test_vec_dot_q16_K_extremes),
        cmocka_unit_test(test_vec_dot_q16_K_avx512),
        cmocka_unit_test(test_vec_dotn_q16_K_avx512),
        cmocka_unit_test(test_vec_dot_q8_0_family_avx512),
        cmocka_unit_test(test_vec_dotp_q8_0_family),
        cmocka_unit_test(test_quantize_q16_0),
        cmocka_unit_test(test_vec_dot_q16_0),
        cmocka_unit_test(test_vec_dot_q16_0_extremes),
        cmocka_unit_test(test_attention_f16_group),
        cmocka_unit_test(test_exp_sub),
        cmocka_unit_test(test_row_top1),
        cmocka_unit_test(test_kernel_set_selection),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
