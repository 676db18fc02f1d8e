/* GPU tests for kernels/cuda/matvec.cu's plain products, the dense SwiGLU pair and
 * the embedding gather: every weight format against the CPU reference (rows
 * dequantized by common/quant.c's reference, dotted in double), on fresh random
 * weights and activations, with row counts that are not a multiple of the block's
 * rows, row lengths that end in a partial group and rows whose start is not
 * 16-byte aligned (q6_K, q8_0). TAP output; the seed is printed. */
#include "gpu_test.h"

#include <time.h>

#include "quant.h"

typedef struct wmat {
    uint32_t type;
    int64_t ncols, nrows;
    size_t row_bytes;
    void *d;     /* on the card */
    float *deq;  /* (nrows, ncols) reference values */
} wmat_t;

static void make_mat(rng_t *r, wmat_t *w, uint32_t type, int64_t ncols, int64_t nrows)
{
    bl_err_t err = {0};
    w->type = type;
    w->ncols = ncols;
    w->nrows = nrows;
    if (bl_row_bytes(type, ncols, &w->row_bytes, &err) < 0)
        bail("bl_row_bytes", &err);
    uint8_t *q = xmalloc(w->row_bytes * (size_t)nrows);
    w->deq = xmalloc(sizeof(float) * (size_t)(ncols * nrows));
    float *src = xmalloc(sizeof(float) * (size_t)ncols);
    for (int64_t i = 0; i < nrows; i++) {
        rand_fill(r, src, ncols, 1.0f);
        if (bl_quantize_row_ref(type, src, q + w->row_bytes * (size_t)i, ncols) != 0 ||
            bl_dequantize_row_ref(type, q + w->row_bytes * (size_t)i, w->deq + i * ncols, ncols) != 0)
            bail("reference quantizer", NULL);
    }
    w->d = d_upload(q, w->row_bytes * (size_t)nrows);
    free(src);
    free(q);
}

static void free_mat(wmat_t *w)
{
    kcuda_free(w->d);
    free(w->deq);
}

static kcuda_mat_t kmat(const wmat_t *w)
{
    kcuda_mat_t m;
    bl_err_t err = {0};
    if (kcuda_mat_init(&m, w->d, w->type, w->ncols, w->nrows, &err) < 0)
        bail("kcuda_mat_init", &err);
    return m;
}

static double ref_dot(const float *w, const float *x, int64_t n)
{
    double s = 0.0;
    for (int64_t i = 0; i < n; i++)
        s += (double)w[i] * (double)x[i];
    return s;
}

static double silu_mul(double g, double u) { return g / (1.0 + exp(-g)) * u; }

static int64_t round4(int64_t n) { return (n + 3) & ~(int64_t)3; }

/* f32 sums of ncols products: the error grows with the row length. */
static double mv_atol(int64_t ncols) { return 1e-4 + 2e-6 * (double)ncols; }

/* One plain product: n activation rows (ldx padded to 4 and past ncols), output
 * ldy > nrows; with accumulate, y starts from random values. With pair, the SwiGLU
 * pair of w and a second matrix of the same shape. */
static void case_matvec(rng_t *r, uint32_t type, int64_t ncols, int64_t nrows, int n, int accumulate,
                        int pair)
{
    bl_err_t err = {0};
    wmat_t w, u;
    make_mat(r, &w, type, ncols, nrows);
    if (pair)
        make_mat(r, &u, type, ncols, nrows);
    const int64_t ldx = round4(ncols) + 4, ldy = nrows + 3;
    float *x = xmalloc(sizeof(float) * (size_t)(ldx * n));
    float *y0 = xmalloc(sizeof(float) * (size_t)(ldy * n));
    float *y = xmalloc(sizeof(float) * (size_t)(ldy * n));
    double *ref = xmalloc(sizeof(double) * (size_t)(nrows * n));
    rand_fill(r, x, ldx * n, 1.0f);
    rand_fill(r, y0, ldy * n, 1.0f);
    for (int b = 0; b < n; b++)
        for (int64_t i = 0; i < nrows; i++) {
            const double g = ref_dot(w.deq + i * ncols, x + b * ldx, ncols);
            double v = g;
            if (pair)
                v = silu_mul(g, ref_dot(u.deq + i * ncols, x + b * ldx, ncols));
            ref[b * nrows + i] = v + (accumulate ? (double)y0[b * ldy + i] : 0.0);
        }
    float *dx = d_upload(x, sizeof(float) * (size_t)(ldx * n));
    float *dy = accumulate ? d_upload(y0, sizeof(float) * (size_t)(ldy * n))
                           : d_poison(sizeof(float) * (size_t)(ldy * n));
    const kcuda_mat_t mw = kmat(&w);
    int rc;
    if (pair) {
        const kcuda_mat_t mu = kmat(&u);
        rc = kcuda_matvec_swiglu(&mw, &mu, dx, ldx, n, dy, ldy, NULL, &err);
    } else {
        rc = kcuda_matvec(&mw, dx, ldx, n, dy, ldy, accumulate, NULL, &err);
    }
    int ok = rc == 0 && d_fetch(y, dy, sizeof(float) * (size_t)(ldy * n), &err) == 0;
    if (!ok)
        printf("#   %s\n", err.msg);
    else
        ok = check_close(y, ldy, ref, n, nrows, mv_atol(ncols) * (pair ? 2 : 1), 1e-4);
    tap_ok(ok, "matvec%s %s: %lld x %lld, %d row%s%s", pair ? "_swiglu" : "", bl_type_info(type)->name,
           (long long)nrows, (long long)ncols, n, n == 1 ? "" : "s", accumulate ? ", accumulate" : "");
    kcuda_free(dx);
    kcuda_free(dy);
    free(x);
    free(y0);
    free(y);
    free(ref);
    free_mat(&w);
    if (pair)
        free_mat(&u);
}

/* Embedding gather of n ids (one out of range: a row of zeros). */
static void case_get_rows(rng_t *r, uint32_t type, int64_t ncols, int64_t nrows, int64_t n)
{
    bl_err_t err = {0};
    wmat_t w;
    make_mat(r, &w, type, ncols, nrows);
    int32_t *ids = xmalloc(sizeof(int32_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        ids[i] = (int32_t)(rng_next(r) % (uint64_t)nrows);
    ids[n - 1] = (int32_t)nrows; /* out of range */
    const int64_t ldy = ncols + 5;
    double *ref = xmalloc(sizeof(double) * (size_t)(n * ncols));
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < ncols; j++)
            ref[i * ncols + j] = ids[i] < nrows ? w.deq[ids[i] * ncols + j] : 0.0;
    int32_t *dids = d_upload(ids, sizeof(int32_t) * (size_t)n);
    float *dy = d_poison(sizeof(float) * (size_t)(n * ldy));
    float *y = xmalloc(sizeof(float) * (size_t)(n * ldy));
    const kcuda_mat_t mw = kmat(&w);
    int ok = kcuda_get_rows(&mw, dids, n, dy, ldy, NULL, &err) == 0 &&
             d_fetch(y, dy, sizeof(float) * (size_t)(n * ldy), &err) == 0;
    if (!ok)
        printf("#   %s\n", err.msg);
    else
        ok = check_close(y, ldy, ref, n, ncols, 1e-7, 1e-6); /* FMA contraction only */
    tap_ok(ok, "get_rows %s: %lld of %lld rows of %lld", bl_type_info(type)->name, (long long)n,
           (long long)nrows, (long long)ncols);
    kcuda_free(dids);
    kcuda_free(dy);
    free(ids);
    free(ref);
    free(y);
    free_mat(&w);
}

/* Arguments the launchers must refuse, without launching anything. */
static void case_refusals(void)
{
    bl_err_t err = {0};
    kcuda_mat_t m;
    void *d = d_alloc(4096);
    int ok = kcuda_mat_init(&m, d, BL_TYPE_Q4_0, 256, 4, &err) == BL_ENOTSUP;
    ok &= kcuda_mat_init(&m, d, BL_TYPE_Q4_K, 100, 4, &err) == BL_ERANGE;
    ok &= kcuda_mat_init(&m, (char *)d + 8, BL_TYPE_F32, 64, 4, &err) == BL_EINVAL;
    ok &= kcuda_mat_init(&m, d, BL_TYPE_F32, 64, 4, &err) == 0;
    ok &= kcuda_matvec(&m, (float *)d + 1, 64, 1, (float *)d, 4, 0, NULL, &err) == BL_EINVAL;
    ok &= kcuda_matvec(&m, (float *)d, 64, KCUDA_MV_MAX_ROWS + 1, (float *)d, 4, 0, NULL, &err) == BL_EINVAL;
    ok &= kcuda_matvec(&m, (float *)d, 62, 1, (float *)d, 4, 0, NULL, &err) == BL_EINVAL;
    if (!ok)
        printf("#   last message: %s\n", err.msg);
    tap_ok(ok, "launchers refuse bad arguments with a code");
    kcuda_free(d);
}

/* Not a test: the achieved weight bandwidth of one-row products over a matrix
 * larger than L2 (random bytes: the values do not matter for time), printed as a
 * TAP comment for docs/cuda.md. Wall time of back-to-back launches. */
static void bench_matvec(uint32_t type, int64_t ncols, int64_t nrows)
{
    bl_err_t err = {0};
    size_t rb;
    if (bl_row_bytes(type, ncols, &rb, &err) < 0)
        bail("bl_row_bytes", &err);
    const size_t nbytes = rb * (size_t)nrows;
    uint8_t *h = xmalloc(nbytes);
    rng_t r = rng_for(99);
    for (size_t i = 0; i + 8 <= nbytes; i += 8) {
        const uint64_t v = rng_next(&r) & 0x3bff3bff3bff3bffull; /* finite halves */
        memcpy(h + i, &v, 8);
    }
    void *dw = d_upload(h, nbytes);
    float *dx = d_alloc(sizeof(float) * (size_t)ncols), *dy = d_alloc(sizeof(float) * (size_t)nrows);
    kcuda_mat_t m;
    if (kcuda_mat_init(&m, dw, type, ncols, nrows, &err) < 0 || kcuda_memset(dx, 0, sizeof(float) * (size_t)ncols, NULL, &err) < 0)
        bail("bench set-up", &err);
    const int reps = 50;
    struct timespec t0, t1;
    int rc = 0;
    for (int i = 0; i < 3; i++)
        rc |= kcuda_matvec(&m, dx, ncols, 1, dy, nrows, 0, NULL, &err);
    rc |= kcuda_sync(NULL, &err);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < reps; i++)
        rc |= kcuda_matvec(&m, dx, ncols, 1, dy, nrows, 0, NULL, &err);
    rc |= kcuda_sync(NULL, &err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const double us = ((double)(t1.tv_sec - t0.tv_sec) * 1e6 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e3) / reps;
    if (rc == 0)
        printf("# bandwidth: matvec %s %lld x %lld (%.1f MB), 1 row: %.1f us, %.0f GB/s\n",
               bl_type_info(type)->name, (long long)nrows, (long long)ncols, (double)nbytes / 1e6, us,
               (double)nbytes / us / 1e3);
    else
        printf("# bandwidth: matvec %s failed: %s\n", bl_type_info(type)->name, err.msg);
    kcuda_free(dw);
    kcuda_free(dx);
    kcuda_free(dy);
    free(h);
}

int main(void)
{
    gpu_test_init("test_kcuda_matvec");
    rng_t r = rng_for(1);
    case_refusals();

    /* K-quants: 1 block, 3 blocks (q6_K rows of 630 bytes: unaligned starts), 9 blocks
     * (a full group of 8 and a tail of 1), and 4096. */
    const uint32_t kq[] = {BL_TYPE_Q4_K, BL_TYPE_Q5_K, BL_TYPE_Q6_K};
    for (int t = 0; t < 3; t++) {
        case_matvec(&r, kq[t], 256, 5, 1, 0, 0);
        case_matvec(&r, kq[t], 768, 37, 3, 0, 0);
        case_matvec(&r, kq[t], 2304, 130, KCUDA_MV_MAX_ROWS, 1, 0);
        case_matvec(&r, kq[t], 4096, 67, 2, 0, 0);
        case_matvec(&r, kq[t], 768, 21, 2, 0, 1);
    }
    /* q8_0: 1 block, 3 blocks (102-byte rows), 33 blocks (a group of 32 and 1), 64. */
    case_matvec(&r, BL_TYPE_Q8_0, 32, 3, 1, 0, 0);
    case_matvec(&r, BL_TYPE_Q8_0, 96, 41, 4, 0, 0);
    case_matvec(&r, BL_TYPE_Q8_0, 1056, 66, 1, 1, 0);
    case_matvec(&r, BL_TYPE_Q8_0, 2048, 9, KCUDA_MV_MAX_ROWS, 0, 0);
    case_matvec(&r, BL_TYPE_Q8_0, 1056, 13, 3, 0, 1);
    /* f16, bf16, f32: odd lengths (rows of any alignment), a group plus a tail. */
    const uint32_t fl[] = {BL_TYPE_F16, BL_TYPE_BF16, BL_TYPE_F32};
    for (int t = 0; t < 3; t++) {
        case_matvec(&r, fl[t], 1, 7, 1, 0, 0);
        case_matvec(&r, fl[t], 37, 29, 3, 0, 0);
        case_matvec(&r, fl[t], 1030, 45, 2, 1, 0);
        case_matvec(&r, fl[t], 2048, 128, KCUDA_MV_MAX_ROWS, 0, 0);
        case_matvec(&r, fl[t], 515, 19, 1, 0, 1);
    }
    /* The largest decode shapes of a 30B-A3B-class model: q (4096 x 2048), o (2048 x
     * 4096), the router (128 x 2048, f32). */
    if (!g_small) {
        case_matvec(&r, BL_TYPE_Q4_K, 2048, 4096, 1, 0, 0);
        case_matvec(&r, BL_TYPE_Q6_K, 4096, 2048, 1, 1, 0);
        case_matvec(&r, BL_TYPE_Q8_0, 2048, 4096, 2, 0, 0);
        case_matvec(&r, BL_TYPE_F32, 2048, 128, 1, 0, 0);
    }

    const uint32_t all[] = {BL_TYPE_Q4_K, BL_TYPE_Q5_K, BL_TYPE_Q6_K, BL_TYPE_Q8_0,
                            BL_TYPE_F16, BL_TYPE_BF16, BL_TYPE_F32};
    for (int t = 0; t < 7; t++) {
        const int64_t cols = bl_type_info(all[t])->block_elems == 1 ? 77 : 512;
        case_get_rows(&r, all[t], cols, 50, 6);
    }
    if (!g_small) {
        const uint32_t bt[] = {BL_TYPE_Q4_K, BL_TYPE_Q5_K, BL_TYPE_Q6_K, BL_TYPE_Q8_0, BL_TYPE_F16};
        for (int t = 0; t < 5; t++)
            bench_matvec(bt[t], 4096, 32768);
        bench_matvec(BL_TYPE_Q6_K, 768, 131072); /* expert down rows: 630 bytes, unaligned */
        bench_matvec(BL_TYPE_Q4_K, 2048, 65536);
    }
    return tap_done();
}
