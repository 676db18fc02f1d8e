/* What every tests/gpu program shares: TAP output, the seed (tests/unit/test_seed.h:
 * BLOOMERY_TEST_SEED replays a run), the no-GPU skip, device buffers, and the
 * comparison against a CPU reference (tolerance abs + rel * |ref|, the first
 * mismatches printed with index and both values). Include once, from the test's .c.
 *
 * BLOOMERY_GPU_TEST_SMALL=1 leaves out the largest shapes (the sanitizer runs use
 * it: memcheck and racecheck slow kernels down a hundredfold). */
#ifndef BL_GPU_TEST_H
#define BL_GPU_TEST_H

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kcuda.h"
#include "quant.h"
#include "test_seed.h"

static int g_tap_n, g_tap_fail;
static int g_small;

static void tap_ok(int ok, const char *fmt, ...) BL_PRINTF(2, 3);
static void tap_ok(int ok, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("%s %d - ", ok ? "ok" : "not ok", ++g_tap_n);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
    if (!ok)
        g_tap_fail++;
}

/* Ends the program: the TAP plan, and exit status 1 when a test failed. */
static int tap_done(void)
{
    printf("1..%d\n", g_tap_n);
    printf("# %d passed, %d failed (seed %llu)\n", g_tap_n - g_tap_fail, g_tap_fail,
           (unsigned long long)g_seed);
    return g_tap_fail ? 1 : 0;
}

static void bail(const char *what, const bl_err_t *err)
{
    printf("Bail out! %s: %s\n", what, err ? err->msg : "");
    exit(1);
}

/* Seeds, then skips the whole program (exit 0) when there is no CUDA device. */
static void gpu_test_init(const char *prog)
{
    test_seed_init(prog);
    const char *sm = getenv("BLOOMERY_GPU_TEST_SMALL");
    g_small = sm && *sm && strcmp(sm, "0") != 0;
    bl_err_t err = {0};
    int n = 0;
    if (kcuda_device_count(&n, &err) < 0)
        bail("cudaGetDeviceCount", &err);
    if (n == 0) {
        fprintf(stderr, "skip: no CUDA device\n");
        printf("1..0 # SKIP no CUDA device\n");
        exit(0);
    }
    kcuda_device_info_t info;
    if (kcuda_init(0, &info, &err) < 0)
        bail("kcuda_init", &err);
    printf("# device 0: %s, sm_%d%d, %d SMs, %.1f GiB%s\n", info.name, info.cc_major, info.cc_minor,
           info.sm_count, (double)info.total_bytes / (1 << 30), g_small ? ", small shapes only" : "");
}

static void *d_alloc(size_t nbytes)
{
    bl_err_t err = {0};
    void *p = NULL;
    if (kcuda_alloc(&p, nbytes, &err) < 0)
        bail("kcuda_alloc", &err);
    return p;
}

static void *d_upload(const void *src, size_t nbytes)
{
    bl_err_t err = {0};
    void *p = d_alloc(nbytes);
    if (kcuda_upload(p, src, nbytes, NULL, &err) < 0 || kcuda_sync(NULL, &err) < 0)
        bail("upload", &err);
    return p;
}

/* A device buffer of nbytes filled with NaN bit patterns (0xff bytes), so that an
 * element a kernel forgot to write shows up as a mismatch. */
static void *d_poison(size_t nbytes)
{
    bl_err_t err = {0};
    void *p = d_alloc(nbytes);
    if (kcuda_memset(p, 0xff, nbytes, NULL, &err) < 0)
        bail("memset", &err);
    return p;
}

/* Waits for the kernels and copies nbytes back; a kernel fault fails here. */
static int d_fetch(void *dst, const void *d_src, size_t nbytes, bl_err_t *err)
{
    int rc = kcuda_sync(NULL, err);
    if (rc < 0)
        return rc;
    rc = kcuda_download(dst, d_src, nbytes, NULL, err);
    if (rc < 0)
        return rc;
    return kcuda_sync(NULL, err);
}

static void rand_fill(rng_t *r, float *x, int64_t n, float amp)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = rng_f(r, -amp, amp);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        printf("Bail out! out of host memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

/* The activation rounding of the CUDA products over quantized weights (q4_K, q5_K,
 * q6_K, q8_0; docs/cuda.md), with `terms` q8 terms per 32 elements: d = amax / 127,
 * q = roundf(x / d) computed as x * (1 / d); with two terms the residual r = x - d *
 * q (f32 product, then f32 difference, as the kernel) is rounded the same way (d',
 * q'). xh = d * q + d' * q' in f32, the values the card multiplies (to f32 rounding:
 * the card scales each term's exact integer sum instead). n a multiple of 32. When
 * d2 is not NULL it receives each element's last scale squared (the rounding noise
 * of element j is uniform in +-d/2 of the last term: variance d^2 / 12). */
static inline void act_q8_round_terms(const float *x, float *xh, float *d2, int64_t n, int terms)
{
    for (int64_t b = 0; b < n; b += 32) {
        float r[32], acc[32];
        float d = 0.0f;
        for (int j = 0; j < 32; j++) {
            r[j] = x[b + j];
            acc[j] = 0.0f;
        }
        for (int t = 0; t < terms; t++) {
            float amax = 0.0f;
            for (int j = 0; j < 32; j++)
                amax = fmaxf(amax, fabsf(r[j]));
            d = amax / 127.0f;
            const float id = d > 0.0f ? 1.0f / d : 0.0f;
            for (int j = 0; j < 32; j++) {
                const float q = roundf(r[j] * id);
                const float dq = d * q;
                acc[j] = t == 0 ? dq : acc[j] + dq;
                r[j] = r[j] - dq;
            }
        }
        for (int j = 0; j < 32; j++) {
            xh[b + j] = acc[j];
            if (d2)
                d2[b + j] = d * d;
        }
    }
}

/* The rounding the kernels use now (kcuda_matvec_act_terms: two terms unless a
 * test chose one). */
static inline void act_q8_round(const float *x, float *xh, float *d2, int64_t n)
{
    act_q8_round_terms(x, xh, d2, n, kcuda_matvec_act_terms());
}

/* Whether the CUDA products round activations for this weight type (the block
 * formats do; f16, bf16 and f32 multiply the f32 activations as given). */
/* An mxfp4 row of random bytes: every code (-0 too, which the quantizer never
 * writes) and exponents 119..126 (halved scales 2^-9 .. 2^-2: values up to 3, f16
 * normals all). */
static inline void rand_mxfp4_row(rng_t *r, uint8_t *q, int64_t ncols)
{
    for (int64_t b = 0; b < ncols / 32; b++) {
        uint8_t *blk = q + 17 * b;
        blk[0] = (uint8_t)(119 + rng_next(r) % 8);
        for (int j = 1; j < 17; j++)
            blk[j] = (uint8_t)rng_next(r);
    }
}

static inline int act_rounded(uint32_t type)
{
    return type == BL_TYPE_Q4_K || type == BL_TYPE_Q5_K || type == BL_TYPE_Q6_K ||
           type == BL_TYPE_Q8_0 || type == BL_TYPE_MXFP4;
}

/* Compares got (rows, cols; got row i at got + i * ldg) with ref (rows, cols,
 * dense): |got - ref| <= atol + rtol * |ref|, NaN never passes. Prints up to five
 * mismatches and the largest error; returns 1 when all pass. */
static int check_close(const float *got, int64_t ldg, const double *ref, int64_t rows, int64_t cols,
                       double atol, double rtol)
{
    int64_t bad = 0;
    double worst = 0.0;
    int64_t worst_i = 0;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) {
            const double g = got[i * ldg + j], w = ref[i * cols + j];
            const double e = fabs(g - w), tol = atol + rtol * fabs(w);
            if (!(e <= tol)) {
                if (bad < 5)
                    printf("#   mismatch at [%lld][%lld]: got %.9g, want %.9g (|diff| %.3g > tol %.3g)\n",
                           (long long)i, (long long)j, g, w, e, tol);
                bad++;
            }
            if (!(e <= worst)) {
                worst = e;
                worst_i = i * cols + j;
            }
        }
    if (bad)
        printf("#   %lld of %lld elements outside abs %.2g + rel %.2g; largest |diff| %.3g at flat index %lld\n",
               (long long)bad, (long long)(rows * cols), atol, rtol, worst, (long long)worst_i);
    return bad == 0;
}

#endif
