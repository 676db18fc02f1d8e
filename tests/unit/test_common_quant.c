/* Tests for common/quant.c and common/quant_iq.c: every reference dequantizer
 * against the oracle (../shared/oracle/quants), quantize->dequantize round trips
 * on fresh random input, quantizer determinism, the type table, bl_row_bytes, and
 * the fp16/bf16 conversions.
 *
 * The random inputs change every run; the seed is printed, and BLOOMERY_TEST_SEED
 * replays it. */
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
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "blocks.h"
#include "quant.h"
#include "test_seed.h"

#ifndef BL_SOURCE_ROOT
#define BL_SOURCE_ROOT "."
#endif


// --- helpers ---------------------------------------------------------------------------

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Uniform in (0, 1). */
static double rng_unit(rng_t *r)
{
    return ((double)(rng_next(r) >> 11) + 0.5) / 9007199254740992.0;
}

static float rng_gauss(rng_t *r)
{
    double u = rng_unit(r), v = rng_unit(r);
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    assert_non_null(p);
    return p;
}

/* Reads a whole file; NULL if it cannot be opened. */
static uint8_t *read_file(const char *path, size_t *n_out)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    assert_true(n >= 0);
    assert_int_equal(fseek(f, 0, SEEK_SET), 0);
    uint8_t *buf = xmalloc((size_t)n);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *n_out = (size_t)n;
    return buf;
}

/* The oracle's quants folder (BLOOMERY_SHARED, else ../shared beside the source
 * tree), or NULL when it is absent; oracle_path holds the path tried either way. */
static char oracle_path[4096];

static const char *oracle_dir(void)
{
    const char *shared = getenv("BLOOMERY_SHARED");
    snprintf(oracle_path, sizeof oracle_path, "%s/oracle/quants",
             shared && *shared ? shared : BL_SOURCE_ROOT "/../shared");
    struct stat st;
    if (stat(oracle_path, &st) != 0 || !S_ISDIR(st.st_mode))
        return NULL;
    return oracle_path;
}

// --- oracle: every dequantizer bit-exact ---------------------------------------------

/* Dequantizes oracle/quants/<file>.blocks and compares with <file>.f32 bit for bit.
 * All 23 types are exact: the reference formulas are reproduced in the same float
 * order, so no value needs a tolerance (fp16 scales are decoded exactly). */
static void check_oracle(const char *file, bl_type_t type)
{
    const char *dir = oracle_dir();
    if (!dir) {
        print_message("# %s not found: ../shared is absent (set BLOOMERY_SHARED); skipping\n",
                      oracle_path);
        skip();
    }
    char path[4200];
    size_t nblk = 0, nf32 = 0;
    snprintf(path, sizeof path, "%s/%s.blocks", dir, file);
    uint8_t *blocks = read_file(path, &nblk);
    if (!blocks)
        fail_msg("cannot read %s", path);
    snprintf(path, sizeof path, "%s/%s.f32", dir, file);
    uint8_t *want = read_file(path, &nf32);
    if (!want)
        fail_msg("cannot read %s", path);

    const bl_type_info_t *ti = bl_type_info(type);
    assert_non_null(ti);
    assert_int_equal(nf32 % 4, 0);
    const int64_t n = (int64_t)(nf32 / 4);
    size_t row = 0;
    bl_err_t err = {0};
    assert_int_equal(bl_row_bytes(type, n, &row, &err), 0);
    assert_int_equal(row, nblk);

    float *got = xmalloc(nf32);
    assert_int_equal(bl_dequantize_row_ref(type, blocks, got, n), 0);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t w;
        memcpy(&w, want + 4 * i, 4);
        if (f32_bits(got[i]) != w) {
            if (bad < 8)
                print_message("# %s: element %lld (block %lld): got %.9g (0x%08x), want %.9g (0x%08x)\n",
                              ti->name, (long long)i, (long long)(i / ti->block_elems),
                              (double)got[i], f32_bits(got[i]), (double)bits_f32(w), w);
            bad++;
        }
    }
    if (bad)
        print_message("# %s: %lld of %lld elements differ\n", ti->name, (long long)bad, (long long)n);
    free(got);
    free(want);
    free(blocks);
    assert_int_equal(bad, 0);
}

#define ORACLE_TEST(file, type) \
    static void test_quant_oracle_##file(void **state) \
    { \
        (void)state; \
        check_oracle(#file, type); \
    }

ORACLE_TEST(q4_0, BL_TYPE_Q4_0)
ORACLE_TEST(q4_1, BL_TYPE_Q4_1)
ORACLE_TEST(q5_0, BL_TYPE_Q5_0)
ORACLE_TEST(q5_1, BL_TYPE_Q5_1)
ORACLE_TEST(q8_0, BL_TYPE_Q8_0)
ORACLE_TEST(q2_k, BL_TYPE_Q2_K)
ORACLE_TEST(q3_k, BL_TYPE_Q3_K)
ORACLE_TEST(q4_k, BL_TYPE_Q4_K)
ORACLE_TEST(q5_k, BL_TYPE_Q5_K)
ORACLE_TEST(q6_k, BL_TYPE_Q6_K)
ORACLE_TEST(iq2_xxs, BL_TYPE_IQ2_XXS)
ORACLE_TEST(iq2_xs, BL_TYPE_IQ2_XS)
ORACLE_TEST(iq3_xxs, BL_TYPE_IQ3_XXS)
ORACLE_TEST(iq1_s, BL_TYPE_IQ1_S)
ORACLE_TEST(iq4_nl, BL_TYPE_IQ4_NL)
ORACLE_TEST(iq3_s, BL_TYPE_IQ3_S)
ORACLE_TEST(iq2_s, BL_TYPE_IQ2_S)
ORACLE_TEST(iq4_xs, BL_TYPE_IQ4_XS)
ORACLE_TEST(iq1_m, BL_TYPE_IQ1_M)
ORACLE_TEST(bf16, BL_TYPE_BF16)
ORACLE_TEST(tq1_0, BL_TYPE_TQ1_0)
ORACLE_TEST(tq2_0, BL_TYPE_TQ2_0)
ORACLE_TEST(mxfp4, BL_TYPE_MXFP4)

// --- round trips -----------------------------------------------------------------------

/* Bounds on the mean, over 16 fresh Gaussian rows, of
 * RMS(dequant(quant(x)) - x) / RMS(x). The comment after each gives the mean
 * measured over 60 seeds and the largest of those 60 means; the bounds sit about
 * 10 % above the largest, so a regression in a scale search shows while run-to-run
 * noise does not. For comparison, llama.cpp's reference quantizers give 0.0713
 * (q4_K), 0.0361 (q5_K), 0.0177 (q6_K) and 0.0053 (q8_0) on Gaussian rows. */
#define RT_BOUND_F32 0.0     /* exact */
#define RT_BOUND_F16 2.4e-4  /* 2.07e-4, max 2.13e-4 */
#define RT_BOUND_BF16 1.9e-3 /* 1.65e-3, max 1.70e-3 */
#define RT_BOUND_Q8_0 6.5e-3 /* 5.3e-3, max 5.8e-3 */
#define RT_BOUND_Q8_K 8.2e-3 /* 6.9e-3, max 7.4e-3 */
#define RT_BOUND_Q6_K 2.0e-2 /* 1.73e-2, max 1.78e-2 */
#define RT_BOUND_Q5_K 4.1e-2 /* 3.57e-2, max 3.66e-2 */
#define RT_BOUND_Q4_K 8.0e-2 /* 7.12e-2, max 7.29e-2 */
#define RT_BOUND_MXFP4 1.35e-1 /* 1.15e-1, max 1.23e-1 */

/* Quantizes and dequantizes nblocks blocks of Gaussian values times a random scale
 * (10^-3 .. 10^3) and returns the relative RMS error. */
static double round_trip_error(bl_type_t type, int64_t nblocks, uint64_t stream)
{
    const bl_type_info_t *ti = bl_type_info(type);
    const int64_t n = nblocks * ti->block_elems;
    rng_t r = rng_for(stream);
    const float scale = (float)pow(10.0, 6.0 * rng_unit(&r) - 3.0);
    float *x = xmalloc((size_t)n * sizeof *x);
    float *y = xmalloc((size_t)n * sizeof *y);
    for (int64_t i = 0; i < n; i++)
        x[i] = rng_gauss(&r) * scale;
    size_t nbytes = 0;
    bl_err_t err = {0};
    assert_int_equal(bl_row_bytes(type, n, &nbytes, &err), 0);
    void *q = xmalloc(nbytes);
    assert_int_equal(bl_quantize_row_ref(type, x, q, n), 0);
    assert_int_equal(bl_dequantize_row_ref(type, q, y, n), 0);
    double se = 0.0, sx = 0.0;
    int64_t shown = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(y[i]) && shown++ < 4)
            print_message("# %s: element %lld: input %.9g decodes to %.9g\n", ti->name, (long long)i,
                          (double)x[i], (double)y[i]);
        se += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
        sx += (double)x[i] * x[i];
    }
    free(q);
    free(y);
    free(x);
    assert_int_equal(shown, 0);
    return sqrt(se / sx);
}

static void check_round_trip(bl_type_t type, double bound)
{
    const bl_type_info_t *ti = bl_type_info(type);
    /* One block, then several. A scalar type's "block" is one element, too few for an
     * RMS, so it gets a row of 256 and one of 4099 instead. */
    const int64_t sizes[2] = {ti->block_elems == 1 ? 256 : 1, ti->block_elems == 1 ? 4099 : 7};
    enum { REPS = 16 };
    for (int s = 0; s < 2; s++) {
        /* The bound applies to the mean over REPS fresh rows: a single block's error
         * swings with its largest element, the mean does not. */
        double worst = 0.0, sum = 0.0;
        for (int rep = 0; rep < REPS; rep++) {
            double e = round_trip_error(type, sizes[s], 1000u * type + 100u * s + rep);
            sum += e;
            if (e > worst)
                worst = e;
        }
        const double mean = sum / REPS;
        print_message("# %s: rows of %lld elements x %d: relative RMS error mean %.3g, "
                      "worst %.3g (bound on mean %.3g)\n",
                      ti->name, (long long)(sizes[s] * ti->block_elems), REPS, mean, worst, bound);
        if (mean > bound)
            fail_msg("%s: mean relative RMS error %.4g above the bound %.4g", ti->name, mean, bound);
    }
}

#define ROUND_TRIP_TEST(fmt, type, bound) \
    static void test_quant_round_trip_##fmt(void **state) \
    { \
        (void)state; \
        check_round_trip(type, bound); \
    }

ROUND_TRIP_TEST(f32, BL_TYPE_F32, RT_BOUND_F32)
ROUND_TRIP_TEST(f16, BL_TYPE_F16, RT_BOUND_F16)
ROUND_TRIP_TEST(bf16, BL_TYPE_BF16, RT_BOUND_BF16)
ROUND_TRIP_TEST(q8_0, BL_TYPE_Q8_0, RT_BOUND_Q8_0)
ROUND_TRIP_TEST(q8_K, BL_TYPE_Q8_K, RT_BOUND_Q8_K)
ROUND_TRIP_TEST(q6_K, BL_TYPE_Q6_K, RT_BOUND_Q6_K)
ROUND_TRIP_TEST(q5_K, BL_TYPE_Q5_K, RT_BOUND_Q5_K)
ROUND_TRIP_TEST(q4_K, BL_TYPE_Q4_K, RT_BOUND_Q4_K)
ROUND_TRIP_TEST(mxfp4, BL_TYPE_MXFP4, RT_BOUND_MXFP4)

static const bl_type_t quantizable[] = {
    BL_TYPE_F32, BL_TYPE_F16, BL_TYPE_BF16, BL_TYPE_Q8_0,
    BL_TYPE_Q8_K, BL_TYPE_Q6_K, BL_TYPE_Q5_K, BL_TYPE_Q4_K, BL_TYPE_MXFP4,
};
#define N_QUANTIZABLE (sizeof quantizable / sizeof quantizable[0])

static void test_quant_quantizers_are_deterministic(void **state)
{
    (void)state;
    for (size_t t = 0; t < N_QUANTIZABLE; t++) {
        const bl_type_info_t *ti = bl_type_info(quantizable[t]);
        const int64_t n = 5 * (int64_t)ti->block_elems;
        rng_t r = rng_for(77 + t);
        float *x = xmalloc((size_t)n * sizeof *x);
        for (int64_t i = 0; i < n; i++)
            x[i] = rng_gauss(&r);
        size_t nbytes = 0;
        bl_err_t err = {0};
        assert_int_equal(bl_row_bytes(quantizable[t], n, &nbytes, &err), 0);
        uint8_t *a = xmalloc(nbytes), *b = xmalloc(nbytes);
        /* Different garbage in the two outputs: every byte must be written. */
        memset(a, 0x00, nbytes);
        memset(b, 0xff, nbytes);
        assert_int_equal(bl_quantize_row_ref(quantizable[t], x, a, n), 0);
        assert_int_equal(bl_quantize_row_ref(quantizable[t], x, b, n), 0);
        for (size_t i = 0; i < nbytes; i++)
            if (a[i] != b[i])
                fail_msg("%s: byte %zu differs between two runs: 0x%02x vs 0x%02x", ti->name, i,
                         a[i], b[i]);
        free(a);
        free(b);
        free(x);
    }
}

static void test_quant_zero_input_gives_zero(void **state)
{
    (void)state;
    for (size_t t = 0; t < N_QUANTIZABLE; t++) {
        const bl_type_info_t *ti = bl_type_info(quantizable[t]);
        const int64_t n = 2 * (int64_t)ti->block_elems;
        float *x = calloc((size_t)n, sizeof *x), *y = xmalloc((size_t)n * sizeof *y);
        assert_non_null(x);
        uint8_t q[2 * sizeof(bl_block_q8_K)];
        assert_int_equal(bl_quantize_row_ref(quantizable[t], x, q, n), 0);
        assert_int_equal(bl_dequantize_row_ref(quantizable[t], q, y, n), 0);
        for (int64_t i = 0; i < n; i++)
            if (y[i] != 0.0f)
                fail_msg("%s: element %lld of an all-zero row decodes to %g", ti->name,
                         (long long)i, (double)y[i]);
        free(x);
        free(y);
    }
}

/* NaN, Inf and extreme magnitudes are not meaningful weights, but a quantizer fed
 * them must stay defined (no out-of-range float to int conversion; the sanitizer
 * build checks) and keep finite, representable rows finite. */
static void test_quant_quantizers_survive_extreme_input(void **state)
{
    (void)state;
    static const float specials[] = {NAN, INFINITY, -INFINITY, 1e30f, -1e30f, 1e-30f, 0.0f};
    for (size_t t = 0; t < N_QUANTIZABLE; t++) {
        const bl_type_info_t *ti = bl_type_info(quantizable[t]);
        const int64_t n = 2 * (int64_t)(ti->block_elems < 32 ? 32 : ti->block_elems);
        float *x = xmalloc((size_t)n * sizeof *x), *y = xmalloc((size_t)n * sizeof *y);
        uint8_t *q = xmalloc((size_t)n * 4 + sizeof(bl_block_q8_K));
        for (size_t k = 0; k < sizeof specials / sizeof specials[0]; k++) {
            rng_t r = rng_for(300 + k);
            for (int64_t i = 0; i < n; i++)
                x[i] = rng_gauss(&r);
            x[n / 3] = specials[k];
            assert_int_equal(bl_quantize_row_ref(quantizable[t], x, q, n), 0);
            assert_int_equal(bl_dequantize_row_ref(quantizable[t], q, y, n), 0);
        }
        /* Tiny but normal floats: every type keeps them finite. */
        for (int64_t i = 0; i < n; i++)
            x[i] = 1e-20f * (float)((i % 7) - 3);
        assert_int_equal(bl_quantize_row_ref(quantizable[t], x, q, n), 0);
        assert_int_equal(bl_dequantize_row_ref(quantizable[t], q, y, n), 0);
        for (int64_t i = 0; i < n; i++)
            if (!isfinite(y[i]))
                fail_msg("%s: element %lld of a tiny row decodes to %g", ti->name, (long long)i,
                         (double)y[i]);
        free(q);
        free(y);
        free(x);
    }
}

static void test_quant_q8_K_bsums_are_group_sums(void **state)
{
    (void)state;
    rng_t r = rng_for(91);
    float x[3 * BL_QK_K];
    for (int i = 0; i < 3 * BL_QK_K; i++)
        x[i] = rng_gauss(&r);
    bl_block_q8_K b[3];
    assert_int_equal(bl_quantize_row_ref(BL_TYPE_Q8_K, x, b, 3 * BL_QK_K), 0);
    for (int k = 0; k < 3; k++)
        for (int g = 0; g < BL_QK_K / 16; g++) {
            int sum = 0;
            for (int j = 0; j < 16; j++)
                sum += b[k].qs[16 * g + j];
            assert_int_equal(b[k].bsums[g], sum);
        }
}

static void test_quant_dispatch_rejects_unsupported(void **state)
{
    (void)state;
    float x[BL_QK_K] = {0}, y[BL_QK_K];
    uint8_t q[sizeof(bl_block_q8_K)] = {0};
    assert_int_equal(bl_quantize_row_ref(BL_TYPE_Q4_0, x, q, BL_QK), BL_ENOTSUP);
    assert_int_equal(bl_quantize_row_ref(BL_TYPE_IQ2_XXS, x, q, BL_QK_K), BL_ENOTSUP);
    assert_int_equal(bl_dequantize_row_ref(BL_TYPE_I32, q, y, 4), BL_ENOTSUP);
    assert_int_equal(bl_dequantize_row_ref((bl_type_t)4, q, y, 32), BL_EINVAL);
    assert_int_equal(bl_dequantize_row_ref(BL_TYPE_Q4_K, q, y, 100), BL_ERANGE);
    assert_int_equal(bl_quantize_row_ref(BL_TYPE_Q8_0, x, q, 33), BL_ERANGE);
}

// --- mxfp4 quantizer ------------------------------------------------------------------

/* A block's values as bl_dequantize_row_mxfp4_ref gives them, computed here from the
 * format's definition: E2M1 magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 by code (bit 3 the
 * sign), times 2^(e - 127). */
static double mxfp4_value(uint8_t e, int code)
{
    static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    return (code & 8 ? -1.0 : 1.0) * mag[code & 7] * ldexp(1.0, e - 127);
}

static int mxfp4_code(const bl_block_mxfp4 *b, int j)
{
    return j < BL_QK / 2 ? b->qs[j] & 0xf : b->qs[j - BL_QK / 2] >> 4;
}

/* Every block of representable values comes back bit-exact, bytes and all, at every
 * exponent whose values are finite floats (0..252; subnormal floats included): the
 * codes are random but -0 (8), and one value has magnitude 4 or 6 so that the block's
 * largest magnitude picks that exponent again. */
static void test_quant_mxfp4_representable_round_trip_exact(void **state)
{
    (void)state;
    rng_t r = rng_for(4001);
    for (int e = 0; e <= 252; e++) {
        for (int rep = 0; rep < 4; rep++) {
            bl_block_mxfp4 in, out;
            int code[BL_QK];
            for (int j = 0; j < BL_QK; j++) {
                do
                    code[j] = (int)(rng_next(&r) % 16);
                while (code[j] == 8);
            }
            const int top = (int)(rng_next(&r) % BL_QK);
            code[top] = (int)(6 + rng_next(&r) % 2) | (int)(rng_next(&r) % 2) * 8;
            in.e = (uint8_t)e;
            for (int j = 0; j < BL_QK / 2; j++)
                in.qs[j] = (uint8_t)(code[j] | code[j + BL_QK / 2] << 4);
            float x[BL_QK], y[BL_QK];
            bl_dequantize_row_mxfp4_ref(&in, x, BL_QK);
            for (int j = 0; j < BL_QK; j++)
                if ((double)x[j] != mxfp4_value((uint8_t)e, code[j]))
                    fail_msg("e %d code %d decodes to %.9g, want %.9g", e, code[j], (double)x[j],
                             mxfp4_value((uint8_t)e, code[j]));
            memset(&out, 0xa5, sizeof out);
            assert_int_equal(bl_quantize_row_ref(BL_TYPE_MXFP4, x, &out, BL_QK), 0);
            if (memcmp(&in, &out, sizeof in) != 0)
                fail_msg("e %d: block does not round-trip (exponent %d back)", e, out.e);
            bl_dequantize_row_mxfp4_ref(&out, y, BL_QK);
            assert_memory_equal(x, y, sizeof x);
        }
    }
}

/* Random rows at magnitudes from 2^-120 to 2^120: the exponent is floor(log2 amax)
 * + 125 (computed here with frexp), every value's code is a nearest one (brute
 * force over the 16 codes), and so, with s = 2^(k - 2) the scale, a value with
 * |x| <= 6 s is off by at most s (half the widest step, 4 s to 6 s) and a saturated
 * one by |x| - 6 s < 2 s. */
static void test_quant_mxfp4_nearest_code_and_error_bound(void **state)
{
    (void)state;
    rng_t r = rng_for(4002);
    enum { NB = 64 };
    float x[NB * BL_QK], y[NB * BL_QK];
    bl_block_mxfp4 q[NB];
    for (int rep = 0; rep < 200; rep++) {
        const double scale = ldexp(1.0, (int)(rng_next(&r) % 241) - 120);
        for (int i = 0; i < NB * BL_QK; i++)
            x[i] = (float)(rng_gauss(&r) * scale);
        assert_int_equal(bl_quantize_row_ref(BL_TYPE_MXFP4, x, q, NB * BL_QK), 0);
        assert_int_equal(bl_dequantize_row_ref(BL_TYPE_MXFP4, q, y, NB * BL_QK), 0);
        for (int b = 0; b < NB; b++) {
            const float *xb = x + b * BL_QK, *yb = y + b * BL_QK;
            double amax = 0.0;
            for (int j = 0; j < BL_QK; j++)
                amax = fmax(amax, fabs((double)xb[j]));
            int k;
            (void)frexp(amax, &k); /* amax = f 2^k, f in [0.5, 1): floor(log2) = k - 1 */
            const int want_e = k - 1 + 125;
            if (q[b].e != want_e)
                fail_msg("amax %.9g: exponent %d, want %d", amax, q[b].e, want_e);
            const double s = ldexp(1.0, k - 1 - 2);
            for (int j = 0; j < BL_QK; j++) {
                const double err = fabs((double)yb[j] - xb[j]);
                double best = INFINITY;
                for (int c = 0; c < 16; c++)
                    best = fmin(best, fabs(mxfp4_value(q[b].e, c) - xb[j]));
                if (err != best)
                    fail_msg("%.9g (amax %.9g) -> %.9g (code %d): error %.3g, nearest %.3g",
                             (double)xb[j], amax, (double)yb[j], mxfp4_code(&q[b], j), err, best);
                const double bound = fabs((double)xb[j]) <= 6 * s ? s : fabs((double)xb[j]) - 6 * s;
                if (err > bound)
                    fail_msg("%.9g -> %.9g: error %.3g above %.3g", (double)xb[j], (double)yb[j],
                             err, bound);
            }
        }
    }
}

/* Ties go to the smaller magnitude, as llama.cpp's search keeps the first best;
 * values within half the smallest step of 0 become +0 (code 0, never 8). */
static void test_quant_mxfp4_ties_and_signs(void **state)
{
    (void)state;
    /* e = 128: the scale is 2, doubled codes are in units of 1 */
    static const float x[BL_QK] = {12, 5, 0.5f, 1.5f, 2.5f, 3.5f, 7, 10, -5, -0.5f, -0.0f, 0,
                                   -12, 11, 100, -100, 0.25f, -0.75f};
    static const int want[BL_QK] = {7, 4, 0, 1, 2, 3, 5, 6, 12, 0, 0, 0, 15, 7, 7, 15, 0, 9};
    bl_block_mxfp4 q;
    assert_int_equal(bl_quantize_row_ref(BL_TYPE_MXFP4, x, &q, BL_QK), 0);
    assert_int_equal(q.e, 6 + 125); /* amax 100 = 1.56 * 2^6 */
    /* with the block's largest at 12 = 1.5 * 2^3 the exponent is 128 */
    float x2[BL_QK];
    memcpy(x2, x, sizeof x2);
    x2[14] = 12;
    x2[15] = -12;
    assert_int_equal(bl_quantize_row_ref(BL_TYPE_MXFP4, x2, &q, BL_QK), 0);
    assert_int_equal(q.e, 128);
    for (int j = 0; j < BL_QK; j++)
        if (mxfp4_code(&q, j) != want[j])
            fail_msg("%g: code %d, want %d", (double)x2[j], mxfp4_code(&q, j), want[j]);
}

/* All-zero blocks (either sign) are exponent 0 and code 0 throughout. */
static void test_quant_mxfp4_zero_block_bytes(void **state)
{
    (void)state;
    float x[2 * BL_QK];
    for (int j = 0; j < 2 * BL_QK; j++)
        x[j] = j % 2 ? -0.0f : 0.0f;
    bl_block_mxfp4 q[2];
    memset(q, 0xff, sizeof q);
    assert_int_equal(bl_quantize_row_ref(BL_TYPE_MXFP4, x, q, 2 * BL_QK), 0);
    const uint8_t zero[2 * sizeof(bl_block_mxfp4)] = {0};
    assert_memory_equal(q, zero, sizeof q);
}

/* The ends of the exponent range: amax below 2^-125 clamps to e = 0 (2^-127 still
 * exact, 2^-140 rounds to 0, subnormals too); FLT_MAX takes e = 252 and saturates to
 * 1.5 * 2^127, the largest finite magnitude; 2^127 itself is exact. */
static void test_quant_mxfp4_extreme_exponents(void **state)
{
    (void)state;
    float x[BL_QK] = {0}, y[BL_QK];
    bl_block_mxfp4 q;
    x[0] = ldexpf(1.0f, -127);
    x[1] = -ldexpf(1.0f, -128);
    x[2] = ldexpf(1.0f, -140);
    x[3] = bits_f32(1); /* the smallest subnormal */
    assert_int_equal(bl_quantize_row_ref(BL_TYPE_MXFP4, x, &q, BL_QK), 0);
    bl_dequantize_row_mxfp4_ref(&q, y, BL_QK);
    assert_int_equal(q.e, 0);
    assert_true(y[0] == ldexpf(1.0f, -127) && y[1] == -ldexpf(1.0f, -128));
    assert_true(y[2] == 0.0f && y[3] == 0.0f);

    memset(x, 0, sizeof x);
    x[0] = FLT_MAX;
    x[1] = -ldexpf(1.0f, 127);
    x[2] = 1.0f;
    assert_int_equal(bl_quantize_row_ref(BL_TYPE_MXFP4, x, &q, BL_QK), 0);
    bl_dequantize_row_mxfp4_ref(&q, y, BL_QK);
    assert_int_equal(q.e, 252);
    assert_true(y[0] == ldexpf(1.5f, 127));
    assert_true(y[1] == -ldexpf(1.0f, 127));
    assert_true(y[2] == 0.0f);
    for (int j = 0; j < BL_QK; j++)
        assert_true(isfinite(y[j]));
}

/* NaN quantizes to 0 and leaves the exponent to the other values; Inf counts as
 * FLT_MAX: its block takes e = 252 and it decodes to +-1.5 * 2^127 (finite). */
static void test_quant_mxfp4_nan_and_inf(void **state)
{
    (void)state;
    rng_t r = rng_for(4003);
    float x[BL_QK], z[BL_QK], y[BL_QK], w[BL_QK];
    for (int j = 0; j < BL_QK; j++)
        x[j] = rng_gauss(&r);
    memcpy(z, x, sizeof z);
    x[5] = NAN;
    x[20] = -NAN;
    z[5] = z[20] = 0.0f;
    bl_block_mxfp4 q, qz;
    assert_int_equal(bl_quantize_row_ref(BL_TYPE_MXFP4, x, &q, BL_QK), 0);
    assert_int_equal(bl_quantize_row_ref(BL_TYPE_MXFP4, z, &qz, BL_QK), 0);
    assert_memory_equal(&q, &qz, sizeof q); /* NaN is 0 */
    bl_dequantize_row_mxfp4_ref(&q, y, BL_QK);
    bl_dequantize_row_mxfp4_ref(&qz, w, BL_QK);
    assert_true(y[5] == 0.0f && y[20] == 0.0f);
    assert_memory_equal(y, w, sizeof y);

    for (int sign = 0; sign < 2; sign++) {
        x[5] = 0.5f;
        x[20] = sign ? -INFINITY : INFINITY;
        assert_int_equal(bl_quantize_row_ref(BL_TYPE_MXFP4, x, &q, BL_QK), 0);
        bl_dequantize_row_mxfp4_ref(&q, y, BL_QK);
        assert_int_equal(q.e, 252);
        assert_true(y[20] == (sign ? -1.0f : 1.0f) * ldexpf(1.5f, 127));
        for (int j = 0; j < BL_QK; j++)
            assert_true(isfinite(y[j]));
    }
}

// --- type table and row sizes ------------------------------------------------------------

static const uint32_t all_types[] = {
    BL_TYPE_F32, BL_TYPE_F16, BL_TYPE_Q4_0, BL_TYPE_Q4_1, BL_TYPE_Q5_0, BL_TYPE_Q5_1,
    BL_TYPE_Q8_0, BL_TYPE_Q8_1, BL_TYPE_Q2_K, BL_TYPE_Q3_K, BL_TYPE_Q4_K, BL_TYPE_Q5_K,
    BL_TYPE_Q6_K, BL_TYPE_Q8_K, BL_TYPE_IQ2_XXS, BL_TYPE_IQ2_XS, BL_TYPE_IQ3_XXS,
    BL_TYPE_IQ1_S, BL_TYPE_IQ4_NL, BL_TYPE_IQ3_S, BL_TYPE_IQ2_S, BL_TYPE_IQ4_XS, BL_TYPE_I8,
    BL_TYPE_I16, BL_TYPE_I32, BL_TYPE_I64, BL_TYPE_F64, BL_TYPE_IQ1_M, BL_TYPE_BF16,
    BL_TYPE_TQ1_0, BL_TYPE_TQ2_0, BL_TYPE_MXFP4,
};
#define N_TYPES (sizeof all_types / sizeof all_types[0])

static void test_quant_type_table_covers_enum(void **state)
{
    (void)state;
    int known[BL_TYPE_COUNT] = {0};
    for (size_t i = 0; i < N_TYPES; i++) {
        const bl_type_info_t *ti = bl_type_info(all_types[i]);
        if (!ti)
            fail_msg("type id %u has no table entry", all_types[i]);
        assert_true(ti->block_elems > 0 && ti->block_bytes > 0);
        known[all_types[i]] = 1;
    }
    for (uint32_t t = 0; t < BL_TYPE_COUNT + 100; t++)
        if (t >= BL_TYPE_COUNT || !known[t])
            assert_null(bl_type_info(t));
    assert_null(bl_type_info(UINT32_MAX));
}

static void test_quant_type_from_name_round_trips(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_TYPES; i++) {
        const bl_type_info_t *ti = bl_type_info(all_types[i]);
        bl_type_t t = BL_TYPE_COUNT;
        assert_int_equal(bl_type_from_name(ti->name, &t), 0);
        assert_int_equal(t, all_types[i]);
        /* Case does not matter. */
        char upper[32];
        size_t k = 0;
        for (; ti->name[k] && k + 1 < sizeof upper; k++)
            upper[k] = (char)(ti->name[k] >= 'a' && ti->name[k] <= 'z' ? ti->name[k] - 32 : ti->name[k]);
        upper[k] = 0;
        t = BL_TYPE_COUNT;
        assert_int_equal(bl_type_from_name(upper, &t), 0);
        assert_int_equal(t, all_types[i]);
    }
}

static void test_quant_type_from_name_rejects_unknown(void **state)
{
    (void)state;
    bl_type_t t = BL_TYPE_COUNT;
    assert_int_equal(bl_type_from_name("q4_2", &t), BL_ENOENT);
    assert_int_equal(bl_type_from_name("", &t), BL_ENOENT);
    assert_int_equal(bl_type_from_name("q4_k_m", &t), BL_ENOENT);
    assert_int_equal(bl_type_from_name(NULL, &t), BL_ENOENT);
    assert_int_equal(t, BL_TYPE_COUNT);
}

static void test_quant_type_sizes_match_oracle_index(void **state)
{
    (void)state;
    /* Block geometry as the oracle's index.json records it (ggml id, elems, bytes). */
    static const uint32_t want[][3] = {
        {2, 32, 18}, {3, 32, 20}, {6, 32, 22}, {7, 32, 24}, {8, 32, 34},
        {10, 256, 84}, {11, 256, 110}, {12, 256, 144}, {13, 256, 176}, {14, 256, 210},
        {16, 256, 66}, {17, 256, 74}, {18, 256, 98}, {19, 256, 50}, {20, 32, 18},
        {21, 256, 110}, {22, 256, 82}, {23, 256, 136}, {29, 256, 56}, {30, 1, 2},
        {34, 256, 54}, {35, 256, 66}, {39, 32, 17}, {9, 32, 36}, {15, 256, 292},
        {0, 1, 4}, {1, 1, 2}, {24, 1, 1}, {25, 1, 2}, {26, 1, 4}, {27, 1, 8}, {28, 1, 8},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const bl_type_info_t *ti = bl_type_info(want[i][0]);
        assert_non_null(ti);
        assert_int_equal(ti->block_elems, want[i][1]);
        assert_int_equal(ti->block_bytes, want[i][2]);
    }
}

static void test_quant_row_bytes_accepts_whole_blocks(void **state)
{
    (void)state;
    size_t n = 0;
    bl_err_t err = {0};
    assert_int_equal(bl_row_bytes(BL_TYPE_Q4_K, 512, &n, &err), 0);
    assert_int_equal(n, 288);
    assert_int_equal(bl_row_bytes(BL_TYPE_F32, 3, &n, &err), 0);
    assert_int_equal(n, 12);
    assert_int_equal(bl_row_bytes(BL_TYPE_MXFP4, 64, &n, &err), 0);
    assert_int_equal(n, 34);
    assert_int_equal(bl_row_bytes(BL_TYPE_Q8_0, 0, &n, &err), 0);
    assert_int_equal(n, 0);
}

static void test_quant_row_bytes_rejects_partial_block(void **state)
{
    (void)state;
    size_t n = 12345;
    bl_err_t err = {0};
    assert_int_equal(bl_row_bytes(BL_TYPE_Q4_K, 300, &n, &err), BL_ERANGE);
    assert_int_equal(err.code, BL_ERANGE);
    assert_non_null(strstr(err.msg, "q4_K"));
    assert_non_null(strstr(err.msg, "300"));
    assert_non_null(strstr(err.msg, "256"));
    assert_int_equal(n, 12345);
    assert_int_equal(bl_row_bytes(BL_TYPE_Q8_0, 33, &n, &err), BL_ERANGE);
    assert_int_equal(bl_row_bytes(BL_TYPE_Q8_0, -32, &n, &err), BL_ERANGE);
}

static void test_quant_row_bytes_rejects_overflow(void **state)
{
    (void)state;
    size_t n = 0;
    bl_err_t err = {0};
    /* With a 64-bit size_t only types of 4 or more bytes an element can overflow
     * from an int64_t count. */
    assert_int_equal(bl_row_bytes(BL_TYPE_F32, INT64_MAX, &n, &err), BL_ERANGE);
    assert_int_equal(err.code, BL_ERANGE);
    assert_non_null(strstr(err.msg, "f32"));
    assert_non_null(strstr(err.msg, "9223372036854775807"));
    assert_non_null(strstr(err.msg, "overflow"));
    assert_int_equal(bl_row_bytes(BL_TYPE_F64, INT64_MAX / 2, &n, &err), BL_ERANGE);
    assert_int_equal(bl_row_bytes(BL_TYPE_I64, (int64_t)1 << 61, &n, &err), BL_ERANGE);
    /* Just below the limit still works: 2^61 - 1 doubles are 2^64 - 8 bytes. */
    assert_int_equal(bl_row_bytes(BL_TYPE_F64, ((int64_t)1 << 61) - 1, &n, &err), 0);
    assert_int_equal(n, SIZE_MAX - 7);
}

static void test_quant_row_bytes_rejects_unknown_type(void **state)
{
    (void)state;
    static const uint32_t ids[] = {4, 5, 31, 32, 33, 36, 37, 38, 40, 99, UINT32_MAX};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        size_t n = 0;
        bl_err_t err = {0};
        assert_int_equal(bl_row_bytes(ids[i], 256, &n, &err), BL_EINVAL);
        assert_int_equal(err.code, BL_EINVAL);
        char id[16];
        snprintf(id, sizeof id, "%u", ids[i]);
        assert_non_null(strstr(err.msg, id));
    }
}

// --- fp16 and bf16 -------------------------------------------------------------------------

static void test_quant_fp16_round_trips_every_half(void **state)
{
    (void)state;
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        const float f = bl_fp16_to_fp32((uint16_t)h);
        const uint16_t back = bl_fp32_to_fp16(f);
        const int is_nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
        if (is_nan ? !(isnan(f) && (back & 0x7c00) == 0x7c00 && (back & 0x3ff))
                   : back != h) {
            if (bad++ < 5)
                print_message("# half 0x%04x -> %.9g -> 0x%04x\n", h, (double)f, back);
        }
    }
    assert_int_equal(bad, 0);
}

static void test_quant_fp16_decodes_known_values(void **state)
{
    (void)state;
    assert_true(bl_fp16_to_fp32(0x3c00) == 1.0f);
    assert_true(bl_fp16_to_fp32(0xc000) == -2.0f);
    assert_true(bl_fp16_to_fp32(0x7bff) == 65504.0f);
    assert_true(bl_fp16_to_fp32(0x0001) == ldexpf(1.0f, -24));
    assert_true(bl_fp16_to_fp32(0x03ff) == ldexpf(1023.0f, -24));
    assert_true(bl_fp16_to_fp32(0x0400) == ldexpf(1.0f, -14));
    assert_true(isinf(bl_fp16_to_fp32(0x7c00)) && bl_fp16_to_fp32(0x7c00) > 0);
    assert_true(isinf(bl_fp16_to_fp32(0xfc00)) && bl_fp16_to_fp32(0xfc00) < 0);
    assert_true(isnan(bl_fp16_to_fp32(0x7e00)));
    assert_int_equal(f32_bits(bl_fp16_to_fp32(0x8000)), 0x80000000u);
}

/* Every midpoint between two adjacent finite halves of the same sign rounds to the
 * one with an even mantissa; a hair either side rounds to the nearer one. */
static void test_quant_fp16_rounds_ties_to_even(void **state)
{
    (void)state;
    int bad = 0;
    for (uint32_t h = 0; h < 0x7bff; h++) {
        for (int neg = 0; neg < 2; neg++) {
            const uint16_t lo = (uint16_t)(h | (neg ? 0x8000 : 0)), hi = (uint16_t)(lo + 1);
            const float a = bl_fp16_to_fp32(lo), b = bl_fp16_to_fp32(hi);
            const float mid = (a + b) * 0.5f; /* exact: halves have 11-bit mantissas */
            const uint16_t even = (lo & 1) ? hi : lo;
            const uint16_t got = bl_fp32_to_fp16(mid);
            const uint16_t below = bl_fp32_to_fp16(nextafterf(mid, a));
            const uint16_t above = bl_fp32_to_fp16(nextafterf(mid, b));
            if (got != even || below != lo || above != hi) {
                if (bad++ < 5)
                    print_message("# between 0x%04x and 0x%04x: mid -> 0x%04x (want 0x%04x), "
                                  "below -> 0x%04x, above -> 0x%04x\n",
                                  lo, hi, got, even, below, above);
            }
        }
    }
    assert_int_equal(bad, 0);
}

static void test_quant_fp16_rounds_edges(void **state)
{
    (void)state;
    /* Past the largest half: 65520 is the midpoint to the next power of two, and
     * ties to even (Inf); just below it rounds back to 65504. */
    assert_int_equal(bl_fp32_to_fp16(65520.0f), 0x7c00);
    assert_int_equal(bl_fp32_to_fp16(nextafterf(65520.0f, 0.0f)), 0x7bff);
    assert_int_equal(bl_fp32_to_fp16(-1e10f), 0xfc00);
    assert_int_equal(bl_fp32_to_fp16(INFINITY), 0x7c00);
    assert_int_equal(bl_fp32_to_fp16(-INFINITY), 0xfc00);
    /* Half the smallest subnormal ties to zero; anything above rounds up to it. */
    assert_int_equal(bl_fp32_to_fp16(ldexpf(1.0f, -25)), 0x0000);
    assert_int_equal(bl_fp32_to_fp16(nextafterf(ldexpf(1.0f, -25), 1.0f)), 0x0001);
    assert_int_equal(bl_fp32_to_fp16(-ldexpf(1.0f, -26)), 0x8000);
    assert_int_equal(bl_fp32_to_fp16(1e-30f), 0x0000);
    /* 1.5 * 2^-24 ties to the even subnormal 2 * 2^-24. */
    assert_int_equal(bl_fp32_to_fp16(ldexpf(3.0f, -25)), 0x0002);
    /* The largest subnormal rounds up into the smallest normal. */
    assert_int_equal(bl_fp32_to_fp16(ldexpf(2047.0f, -25)), 0x0400);
    const uint16_t nan = bl_fp32_to_fp16(NAN);
    assert_true((nan & 0x7c00) == 0x7c00 && (nan & 0x3ff));
    /* A NaN whose payload sits only in the low float bits stays NaN. */
    const uint16_t nan_low = bl_fp32_to_fp16(bits_f32(0x7f800001u));
    assert_true((nan_low & 0x7c00) == 0x7c00 && (nan_low & 0x3ff));
}

#if defined(__FLT16_MAX__)
/* Where the compiler has _Float16, its conversion (IEEE round to nearest even) is an
 * independent check on random floats of every magnitude. */
static void test_quant_fp16_matches_compiler(void **state)
{
    (void)state;
    rng_t r = rng_for(5);
    int bad = 0;
    for (int i = 0; i < 2000000; i++) {
        /* Exponents around the half range, random mantissas and signs. */
        const uint32_t e = 90 + (uint32_t)(rng_next(&r) % 70);
        const uint32_t u = (uint32_t)(rng_next(&r) & 0x807fffffu) | e << 23;
        const float f = bits_f32(u);
        volatile _Float16 c = (_Float16)f;
        uint16_t want;
        memcpy(&want, (const void *)&c, 2);
        const uint16_t got = bl_fp32_to_fp16(f);
        if (got != want && bad++ < 5)
            print_message("# %.9g (0x%08x): got 0x%04x, compiler 0x%04x\n", (double)f, u, got, want);
    }
    assert_int_equal(bad, 0);
}
#endif

static void test_quant_bf16_round_trips_every_value(void **state)
{
    (void)state;
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        const float f = bl_bf16_to_fp32((uint16_t)h);
        const uint16_t back = bl_fp32_to_bf16(f);
        const int is_nan = (h & 0x7f80) == 0x7f80 && (h & 0x7f);
        if (is_nan ? !(isnan(f) && isnan(bl_bf16_to_fp32(back))) : back != h)
            if (bad++ < 5)
                print_message("# bf16 0x%04x -> %.9g -> 0x%04x\n", h, (double)f, back);
    }
    assert_int_equal(bad, 0);
}

static void test_quant_bf16_rounds_ties_to_even(void **state)
{
    (void)state;
    /* 1 + 2^-8 is the midpoint of 1 (0x3f80) and 1 + 2^-7 (0x3f81): even wins. */
    assert_int_equal(bl_fp32_to_bf16(bits_f32(0x3f808000u)), 0x3f80);
    assert_int_equal(bl_fp32_to_bf16(bits_f32(0x3f818000u)), 0x3f82);
    assert_int_equal(bl_fp32_to_bf16(bits_f32(0x3f808001u)), 0x3f81);
    assert_int_equal(bl_fp32_to_bf16(bits_f32(0x3f807fffu)), 0x3f80);
    /* Rounding past the largest finite bf16 gives Inf. */
    assert_int_equal(bl_fp32_to_bf16(bits_f32(0x7f7fffffu)), 0x7f80);
    assert_true(isnan(bl_bf16_to_fp32(bl_fp32_to_bf16(bits_f32(0x7f800001u)))));
    assert_true(isnan(bl_bf16_to_fp32(bl_fp32_to_bf16(bits_f32(0xffc00000u)))));
}

static void test_quant_e8m0_scales(void **state)
{
    (void)state;
    assert_true(bl_e8m0_to_fp32_half(127) == 0.5f);
    assert_true(bl_e8m0_to_fp32_half(128) == 1.0f);
    assert_true(bl_e8m0_to_fp32_half(0) == ldexpf(1.0f, -128));
    assert_true(bl_e8m0_to_fp32_half(1) == ldexpf(1.0f, -127));
    assert_true(bl_e8m0_to_fp32_half(2) == ldexpf(1.0f, -126));
    assert_true(bl_e8m0_to_fp32_half(255) == ldexpf(1.0f, 127));
    for (int e = 0; e < 256; e++) /* every entry of the table */
        assert_true(bl_e8m0_to_fp32_half((uint8_t)e) == ldexpf(1.0f, e - 128));
}

// --- main ------------------------------------------------------------------------------

int main(void)
{
    test_seed_init("test_common_quant");

    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quant_oracle_q4_0),
        cmocka_unit_test(test_quant_oracle_q4_1),
        cmocka_unit_test(test_quant_oracle_q5_0),
        cmocka_unit_test(test_quant_oracle_q5_1),
        cmocka_unit_test(test_quant_oracle_q8_0),
        cmocka_unit_test(test_quant_oracle_q2_k),
        cmocka_unit_test(test_quant_oracle_q3_k),
        cmocka_unit_test(test_quant_oracle_q4_k),
        cmocka_unit_test(test_quant_oracle_q5_k),
        cmocka_unit_test(test_quant_oracle_q6_k),
        cmocka_unit_test(test_quant_oracle_iq2_xxs),
        cmocka_unit_test(test_quant_oracle_iq2_xs),
        cmocka_unit_test(test_quant_oracle_iq3_xxs),
        cmocka_unit_test(test_quant_oracle_iq1_s),
        cmocka_unit_test(test_quant_oracle_iq4_nl),
        cmocka_unit_test(test_quant_oracle_iq3_s),
        cmocka_unit_test(test_quant_oracle_iq2_s),
        cmocka_unit_test(test_quant_oracle_iq4_xs),
        cmocka_unit_test(test_quant_oracle_iq1_m),
        cmocka_unit_test(test_quant_oracle_bf16),
        cmocka_unit_test(test_quant_oracle_tq1_0),
        cmocka_unit_test(test_quant_oracle_tq2_0),
        cmocka_unit_test(test_quant_oracle_mxfp4),
        cmocka_unit_test(test_quant_round_trip_f32),
        cmocka_unit_test(test_quant_round_trip_f16),
        cmocka_unit_test(test_quant_round_trip_bf16),
        cmocka_unit_test(test_quant_round_trip_q8_0),
        cmocka_unit_test(test_quant_round_trip_q8_K),
        cmocka_unit_test(test_quant_round_trip_q6_K),
        cmocka_unit_test(test_quant_round_trip_q5_K),
        cmocka_unit_test(test_quant_round_trip_q4_K),
        cmocka_unit_test(test_quant_round_trip_mxfp4),
        cmocka_unit_test(test_quant_quantizers_are_deterministic),
        cmocka_unit_test(test_quant_zero_input_gives_zero),
        cmocka_unit_test(test_quant_quantizers_survive_extreme_input),
        cmocka_unit_test(test_quant_q8_K_bsums_are_group_sums),
        cmocka_unit_test(test_quant_dispatch_rejects_unsupported),
        cmocka_unit_test(test_quant_mxfp4_representable_round_trip_exact),
        cmocka_unit_test(test_quant_mxfp4_nearest_code_and_error_bound),
        cmocka_unit_test(test_quant_mxfp4_ties_and_signs),
        cmocka_unit_test(test_quant_mxfp4_zero_block_bytes),
        cmocka_unit_test(test_quant_mxfp4_extreme_exponents),
        cmocka_unit_test(test_quant_mxfp4_nan_and_inf),
        cmocka_unit_test(test_quant_type_table_covers_enum),
        cmocka_unit_test(test_quant_type_from_name_round_trips),
        cmocka_unit_test(test_quant_type_from_name_rejects_unknown),
        cmocka_unit_test(test_quant_type_sizes_match_oracle_index),
        cmocka_unit_test(test_quant_row_bytes_accepts_whole_blocks),
        cmocka_unit_test(test_quant_row_bytes_rejects_partial_block),
        cmocka_unit_test(test_quant_row_bytes_rejects_overflow),
        cmocka_unit_test(test_quant_row_bytes_rejects_unknown_type),
        cmocka_unit_test(test_quant_fp16_round_trips_every_half),
        cmocka_unit_test(test_quant_fp16_decodes_known_values),
        cmocka_unit_test(test_quant_fp16_rounds_ties_to_even),
        cmocka_unit_test(test_quant_fp16_rounds_edges),
#if defined(__FLT16_MAX__)
        cmocka_unit_test(test_quant_fp16_matches_compiler),
#endif
        cmocka_unit_test(test_quant_bf16_round_trips_every_value),
        cmocka_unit_test(test_quant_bf16_rounds_ties_to_even),
        cmocka_unit_test(test_quant_e8m0_scales),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
