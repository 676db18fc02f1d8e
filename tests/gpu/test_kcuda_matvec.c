/* GPU tests for kernels/cuda/matvec.cu's plain products, the dense SwiGLU pair and
 * the embedding gather: every weight format against the CPU reference (rows
 * dequantized by common/quant.c's reference, dotted in double), on fresh random
 * weights and activations, with row counts that are not a multiple of the block's
 * rows, row lengths that end in a partial group and rows whose start is not
 * 16-byte aligned (q6_K, q8_0, mxfp4). TAP output; the seed is printed.
 *
 * The block formats multiply activations rounded to two q8 terms per 32 elements
 * (the value and its residual; act_q8_round in gpu_test.h): their reference is the
 * double dot with the rounded activations, checked to f32 rounding; the distance to
 * the exact product is checked separately against the rounding noise (6 sigma).
 * A few cases run with one term (kcuda_matvec_set_act_terms), and case_terms checks
 * that the second term brings the product at least 32 times closer to the exact one.
 *
 * Products of 2..8 rows over q4_K and q6_K run on tensor cores (kcuda_matvec_set_mma):
 * the same reference; case_mma_bits checks that a row's bits do not depend on the
 * rows beside it, and some cases run with the tensor cores off and on for one row.
 *
 * BLOOMERY_MV_BENCH=1 runs only the bandwidth bench (GB/s per format, activation
 * rows and the expert shapes of a 30B-A3B-class layer); any other value runs only
 * the bench lines whose key ("matvec q4_K 32768x4096 n1", "experts_swiglu q4_K n8",
 * "experts_down q6_K n8 grouped", ...) contains it, for a profiler. */
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

/* Random rows quantized by the reference; for mxfp4 every other row is random
 * bytes instead (rand_mxfp4_row). */
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
        uint8_t *qr = q + w->row_bytes * (size_t)i;
        rand_fill(r, src, ncols, 1.0f);
        if (type == BL_TYPE_MXFP4 && i % 2 == 1)
            rand_mxfp4_row(r, qr, ncols);
        else if (bl_quantize_row_ref(type, src, qr, ncols) != 0)
            bail("reference quantizer", NULL);
        if (bl_dequantize_row_ref(type, qr, w->deq + i * ncols, ncols) != 0)
            bail("reference dequantizer", NULL);
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
    /* ref: what the card computes (rounded activations for the block formats);
     * ex and sig: the exact product and the rounding noise's standard deviation. */
    const int rounded = act_rounded(type);
    float *xh = xmalloc(sizeof(float) * (size_t)ncols), *d2 = xmalloc(sizeof(float) * (size_t)ncols);
    double *ex = xmalloc(sizeof(double) * (size_t)(nrows * n)), *sig = xmalloc(sizeof(double) * (size_t)(nrows * n));
    for (int b = 0; b < n; b++) {
        const float *xb = x + b * ldx;
        if (rounded)
            act_q8_round(xb, xh, d2, ncols);
        for (int64_t i = 0; i < nrows; i++) {
            const float *wr = w.deq + i * ncols;
            double g = ref_dot(wr, rounded ? xh : xb, ncols), ge = ref_dot(wr, xb, ncols);
            double var = 0.0;
            for (int64_t j = 0; rounded && j < ncols; j++)
                var += (double)wr[j] * wr[j] * d2[j] / 12.0;
            double v = g, ve = ge;
            if (pair) {
                const float *ur = u.deq + i * ncols;
                const double uu = ref_dot(ur, rounded ? xh : xb, ncols), ue = ref_dot(ur, xb, ncols);
                v = silu_mul(g, uu);
                ve = silu_mul(ge, ue);
                var = 0.0; /* not propagated through silu: the pair's distance is not checked */
            }
            const double base = accumulate ? (double)y0[b * ldy + i] : 0.0;
            ref[b * nrows + i] = v + base;
            ex[b * nrows + i] = ve + base;
            sig[b * nrows + i] = sqrt(var);
        }
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
    if (ok && rounded && !pair) {
        /* the activation rounding's effect: within 6 sigma of its noise, everywhere */
        double worst = 0.0;
        for (int b = 0; b < n; b++)
            for (int64_t i = 0; i < nrows; i++) {
                const double e = fabs((double)y[b * ldy + i] - ex[b * nrows + i]);
                const double t = mv_atol(ncols) + 6.0 * sig[b * nrows + i];
                if (e / t > worst)
                    worst = e / t;
            }
        if (worst > 1.0) {
            printf("#   distance to the exact product %.2f times the 6-sigma rounding bound\n", worst);
            ok = 0;
        }
    }
    tap_ok(ok, "matvec%s %s: %lld x %lld, %d row%s%s%s", pair ? "_swiglu" : "", bl_type_info(type)->name,
           (long long)nrows, (long long)ncols, n, n == 1 ? "" : "s", accumulate ? ", accumulate" : "",
           rounded && kcuda_matvec_act_terms() == 1 ? ", one q8 term" : "");
    kcuda_free(dx);
    kcuda_free(dy);
    free(x);
    free(y0);
    free(y);
    free(ref);
    free(xh);
    free(d2);
    free(ex);
    free(sig);
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

/* The same product with one and with two q8 terms against the exact W x: the
 * root-mean-square distance of two terms must be under 1/32 of one term's (the
 * second term's scale is at most 1/254 of the first's; f32 sums add a little). */
static void case_terms(rng_t *r, uint32_t type, int64_t ncols, int64_t nrows, int n)
{
    bl_err_t err = {0};
    wmat_t w;
    make_mat(r, &w, type, ncols, nrows);
    const int64_t ldx = round4(ncols), ldy = nrows;
    float *x = xmalloc(sizeof(float) * (size_t)(ldx * n)), *y = xmalloc(sizeof(float) * (size_t)(ldy * n));
    double *ex = xmalloc(sizeof(double) * (size_t)(nrows * n));
    rand_fill(r, x, ldx * n, 1.0f);
    for (int b = 0; b < n; b++)
        for (int64_t i = 0; i < nrows; i++)
            ex[b * nrows + i] = ref_dot(w.deq + i * ncols, x + b * ldx, ncols);
    float *dx = d_upload(x, sizeof(float) * (size_t)(ldx * n));
    float *dy = d_poison(sizeof(float) * (size_t)(ldy * n));
    const kcuda_mat_t mw = kmat(&w);
    double rms[2] = {0.0, 0.0};
    int ok = 1;
    for (int t = 1; t <= 2 && ok; t++) {
        const int old = kcuda_matvec_set_act_terms(t);
        ok = kcuda_matvec(&mw, dx, ldx, n, dy, ldy, 0, NULL, &err) == 0 &&
             d_fetch(y, dy, sizeof(float) * (size_t)(ldy * n), &err) == 0;
        kcuda_matvec_set_act_terms(old);
        if (!ok)
            printf("#   %s\n", err.msg);
        for (int64_t i = 0; ok && i < nrows * n; i++) {
            const double e = (double)y[i] - ex[i];
            rms[t - 1] += e * e;
        }
        rms[t - 1] = sqrt(rms[t - 1] / (double)(nrows * n));
    }
    if (ok) {
        printf("#   rms distance to W x: one term %.3g, two terms %.3g (%.0fx closer)\n", rms[0], rms[1],
               rms[1] > 0.0 ? rms[0] / rms[1] : 0.0);
        ok = rms[1] * 32.0 < rms[0];
    }
    tap_ok(ok, "two q8 terms are closer to the exact product than one: %s %lld x %lld, %d row%s",
           bl_type_info(type)->name, (long long)nrows, (long long)ncols, n, n == 1 ? "" : "s");
    kcuda_free(dx);
    kcuda_free(dy);
    free(x);
    free(y);
    free(ex);
    free_mat(&w);
}

/* The tensor-core products (kcuda_matvec_set_mma): an activation row's result does
 * not depend on the rows beside it, so rows taken 8 at a time, 2 and 3 at a time,
 * and (every product on tensor cores) one at a time give the same bits; with the
 * streaming kernel for every row count the results agree to f32 rounding. */
static void case_mma_bits(rng_t *r, uint32_t type, int64_t ncols, int64_t nrows)
{
    bl_err_t err = {0};
    wmat_t w;
    make_mat(r, &w, type, ncols, nrows);
    const int n = KCUDA_MV_MAX_ROWS;
    const int64_t ldx = round4(ncols), ldy = nrows;
    float *x = xmalloc(sizeof(float) * (size_t)(ldx * n));
    rand_fill(r, x, ldx * n, 1.0f);
    float *all = xmalloc(sizeof(float) * (size_t)(ldy * n)), *part = xmalloc(sizeof(float) * (size_t)(ldy * n));
    float *str = xmalloc(sizeof(float) * (size_t)(ldy * n));
    float *dx = d_upload(x, sizeof(float) * (size_t)(ldx * n));
    float *dy = d_poison(sizeof(float) * (size_t)(ldy * n));
    const kcuda_mat_t mw = kmat(&w);
    const int old = kcuda_matvec_set_mma(1);
    int ok = kcuda_matvec_mma_ok(&mw, n) && kcuda_matvec_mma_ok(&mw, 1) &&
             kcuda_matvec(&mw, dx, ldx, n, dy, ldy, 0, NULL, &err) == 0 &&
             d_fetch(all, dy, sizeof(float) * (size_t)(ldy * n), &err) == 0;
    /* rows 0..1, 2..4, then 5, 6, 7 one at a time */
    static const int at[] = {0, 2, 5, 6, 7, 8};
    for (int i = 0; ok && i + 1 < (int)(sizeof at / sizeof at[0]); i++)
        ok = kcuda_matvec(&mw, dx + at[i] * ldx, ldx, at[i + 1] - at[i], dy + at[i] * ldy, ldy, 0, NULL, &err) == 0;
    ok = ok && d_fetch(part, dy, sizeof(float) * (size_t)(ldy * n), &err) == 0;
    const int same = ok && memcmp(all, part, sizeof(float) * (size_t)(ldy * n)) == 0;
    kcuda_matvec_set_mma(0);
    ok = ok && !kcuda_matvec_mma_ok(&mw, n) && kcuda_matvec(&mw, dx, ldx, n, dy, ldy, 0, NULL, &err) == 0 &&
         d_fetch(str, dy, sizeof(float) * (size_t)(ldy * n), &err) == 0;
    kcuda_matvec_set_mma(old);
    if (!ok && err.msg[0])
        printf("#   %s\n", err.msg);
    double worst = 0.0;
    for (int64_t i = 0; ok && i < ldy * n; i++) {
        const double d = fabs((double)all[i] - (double)str[i]) / (mv_atol(ncols) + 1e-4 * fabs((double)str[i]));
        worst = d > worst ? d : worst;
    }
    if (ok)
        printf("#   tensor cores vs the streaming kernel: %.3g of the f32 gate\n", worst);
    tap_ok(ok && same && worst <= 1.0,
           "tensor-core %s %lld x %lld: rows in steps of 8, 2, 3 and 1 have the same bits; the streaming kernel "
           "agrees to f32 rounding", bl_type_info(type)->name, (long long)nrows, (long long)ncols);
    kcuda_free(dx);
    kcuda_free(dy);
    free(x);
    free(all);
    free(part);
    free(str);
    free_mat(&w);
}

/* kcuda_matvec_split: one matrix of ra + rb + rc rows (row counts that keep each
 * part 16-byte aligned, so the parts are matrices of their own too) into three
 * outputs with their own ldy, the first and the last with a bias, against the
 * reference and, bit for bit, against kcuda_matvec on each part with the bias added
 * after it. */
static void case_split(rng_t *r, uint32_t type, int64_t ncols, int64_t ra, int64_t rb, int64_t rc, int n)
{
    bl_err_t err = {0};
    wmat_t w;
    const int64_t nrows = ra + rb + rc, rows[3] = {ra, rb, rc}, ldys[3] = {ra + 1, rb + 5, rc};
    make_mat(r, &w, type, ncols, nrows);
    const int64_t ldx = round4(ncols);
    float *x = xmalloc(sizeof(float) * (size_t)(ldx * n));
    rand_fill(r, x, ldx * n, 1.0f);
    float *dx = d_upload(x, sizeof(float) * (size_t)(ldx * n));
    float *xh = xmalloc(sizeof(float) * (size_t)ncols);
    int ok = 1, same = 1;
    float *dys[3], *dsep[3], *got[3], *sep[3], *bias[3] = {NULL, NULL, NULL}, *dbias[3] = {NULL, NULL, NULL};
    kcuda_out_t outs[3];
    for (int p = 0; p < 3; p++) {
        const size_t nb = sizeof(float) * (size_t)(ldys[p] * n);
        dys[p] = d_poison(nb);
        dsep[p] = d_poison(nb);
        got[p] = xmalloc(nb);
        sep[p] = xmalloc(nb);
        if (p != 1) {
            bias[p] = xmalloc(sizeof(float) * (size_t)rows[p]);
            rand_fill(r, bias[p], rows[p], 1.0f);
            dbias[p] = d_upload(bias[p], sizeof(float) * (size_t)rows[p]);
        }
        outs[p] = (kcuda_out_t){.d_y = dys[p], .ldy = ldys[p], .rows = rows[p], .d_bias = dbias[p]};
    }
    const kcuda_mat_t mw = kmat(&w);
    ok = kcuda_matvec_split(&mw, dx, ldx, n, outs, 3, NULL, &err) == 0;
    int64_t r0 = 0;
    for (int p = 0; ok && p < 3; p++) {
        kcuda_mat_t part;
        const size_t nb = sizeof(float) * (size_t)(ldys[p] * n);
        ok = kcuda_mat_init(&part, (const uint8_t *)w.d + (size_t)r0 * w.row_bytes, type, ncols, rows[p], &err) == 0 &&
             kcuda_matvec(&part, dx, ldx, n, dsep[p], ldys[p], 0, NULL, &err) == 0 &&
             d_fetch(got[p], dys[p], nb, &err) == 0 && d_fetch(sep[p], dsep[p], nb, &err) == 0;
        if (!ok)
            break;
        double *ref = xmalloc(sizeof(double) * (size_t)(rows[p] * n));
        for (int b = 0; b < n; b++) {
            const float *xb = x + b * ldx;
            if (act_rounded(type))
                act_q8_round(xb, xh, NULL, ncols);
            for (int64_t i = 0; i < rows[p]; i++) {
                ref[b * rows[p] + i] = ref_dot(w.deq + (r0 + i) * ncols, act_rounded(type) ? xh : xb, ncols) +
                                       (bias[p] ? bias[p][i] : 0.0);
                if (bias[p])
                    sep[p][b * ldys[p] + i] += bias[p][i];
            }
            same &= memcmp(got[p] + b * ldys[p], sep[p] + b * ldys[p], sizeof(float) * (size_t)rows[p]) == 0;
        }
        ok = check_close(got[p], ldys[p], ref, n, rows[p], mv_atol(ncols), 1e-4);
        free(ref);
        r0 += rows[p];
    }
    if (!ok && err.msg[0])
        printf("#   %s\n", err.msg);
    if (ok && !same)
        printf("#   the split outputs differ from separate products\n");
    tap_ok(ok && same, "matvec_split %s: %lld + %lld + %lld rows x %lld, %d row%s, two biased: the bits of "
           "separate products and adds", bl_type_info(type)->name, (long long)ra, (long long)rb, (long long)rc,
           (long long)ncols, n, n == 1 ? "" : "s");
    for (int p = 0; p < 3; p++) {
        kcuda_free(dys[p]);
        kcuda_free(dsep[p]);
        kcuda_free(dbias[p]);
        free(got[p]);
        free(sep[p]);
        free(bias[p]);
    }
    kcuda_free(dx);
    free(x);
    free(xh);
    free_mat(&w);
}

/* kcuda_matvec_split2: q and k stacked (type t1, two outputs) and v (type t2) over
 * the same rows, each with a bias, on a stream of its own, against
 * kcuda_matvec_split and kcuda_matvec_bias one after the other: the same bits (one
 * launch for the pairs the kernel knows, two otherwise). */
static void case_split2(rng_t *r, uint32_t t1, uint32_t t2, int64_t ncols, int64_t rq, int64_t rk, int64_t rv, int n)
{
    bl_err_t err = {0};
    wmat_t w, v;
    make_mat(r, &w, t1, ncols, rq + rk);
    make_mat(r, &v, t2, ncols, rv);
    const int64_t ldx = round4(ncols);
    float *x = xmalloc(sizeof(float) * (size_t)(ldx * n));
    rand_fill(r, x, ldx * n, 1.0f);
    float *dx = d_upload(x, sizeof(float) * (size_t)(ldx * n));
    const int64_t ld[3] = {rq + 3, rk, rv + 1}, rows[3] = {rq, rk, rv};
    float *d1[3], *d2[3], *db[3];
    for (int p = 0; p < 3; p++) {
        d1[p] = d_poison(sizeof(float) * (size_t)(ld[p] * n));
        d2[p] = d_poison(sizeof(float) * (size_t)(ld[p] * n));
        float *b = xmalloc(sizeof(float) * (size_t)rows[p]);
        rand_fill(r, b, rows[p], 1.0f);
        db[p] = d_upload(b, sizeof(float) * (size_t)rows[p]);
        free(b);
    }
    void *st = NULL;
    if (kcuda_stream_create(&st, &err) < 0)
        bail("kcuda_stream_create", &err);
    const kcuda_mat_t mw = kmat(&w), mv = kmat(&v);
    const kcuda_out_t o1[3] = {{d1[0], ld[0], rq, db[0]}, {d1[1], ld[1], rk, db[1]}, {d1[2], ld[2], rv, db[2]}};
    const kcuda_out_t o2[2] = {{d2[0], ld[0], rq, db[0]}, {d2[1], ld[1], rk, db[1]}};
    int ok = kcuda_matvec_split2(&mw, o1, 2, &mv, &o1[2], dx, ldx, n, st, &err) == 0 &&
             kcuda_sync(st, &err) == 0 && kcuda_matvec_split(&mw, dx, ldx, n, o2, 2, NULL, &err) == 0 &&
             kcuda_matvec_bias(&mv, dx, ldx, n, db[2], d2[2], ld[2], 0, NULL, &err) == 0;
    int same = ok;
    for (int p = 0; ok && p < 3; p++) {
        const size_t nb = sizeof(float) * (size_t)(ld[p] * n);
        float *a = xmalloc(nb), *b = xmalloc(nb);
        ok = d_fetch(a, d1[p], nb, &err) == 0 && d_fetch(b, d2[p], nb, &err) == 0;
        for (int i = 0; ok && i < n; i++)
            same &= memcmp(a + i * ld[p], b + i * ld[p], sizeof(float) * (size_t)rows[p]) == 0;
        free(a);
        free(b);
    }
    if (!ok)
        printf("#   %s\n", err.msg);
    else if (!same)
        printf("#   the outputs differ from the separate products\n");
    tap_ok(ok && same, "matvec_split2 %s (%lld + %lld) beside %s (%lld) x %lld, %d row%s: the bits of separate products",
           bl_type_info(t1)->name, (long long)rq, (long long)rk, bl_type_info(t2)->name, (long long)rv,
           (long long)ncols, n, n == 1 ? "" : "s");
    for (int p = 0; p < 3; p++) {
        kcuda_free(d1[p]);
        kcuda_free(d2[p]);
        kcuda_free(db[p]);
    }
    kcuda_stream_destroy(st);
    kcuda_free(dx);
    free(x);
    free_mat(&w);
    free_mat(&v);
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

// --- bench ---------------------------------------------------------------------------
/* Not a test: the achieved weight bandwidth of the products over matrices larger
 * than L2 (random bytes with finite halves: the values do not matter for time),
 * printed as TAP comments for docs/cuda.md. Wall time of back-to-back launches
 * divided by their count, so a launch's gap is included. */

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static void *rand_weights(size_t nbytes)
{
    uint8_t *h = xmalloc(nbytes);
    rng_t r = rng_for(99);
    for (size_t i = 0; i + 8 <= nbytes; i += 8) {
        const uint64_t v = rng_next(&r) & 0x3bff3bff3bff3bffull; /* finite halves */
        memcpy(h + i, &v, 8);
    }
    void *d = d_upload(h, nbytes);
    free(h);
    return d;
}

static float *rand_acts(int64_t n)
{
    rng_t r = rng_for(98);
    float *h = xmalloc(sizeof(float) * (size_t)n);
    rand_fill(&r, h, n, 1.0f);
    float *d = d_upload(h, sizeof(float) * (size_t)n);
    free(h);
    return d;
}

static const char *g_bench_only; /* NULL: every bench line */

static int bench_wanted(const char *key)
{
    return g_bench_only == NULL || strstr(key, g_bench_only) != NULL;
}

static void bench_line(const char *what, const char *fmt, const char *shape, int n, double nbytes,
                       double us, int rc, const bl_err_t *err)
{
    if (rc == 0)
        printf("# bench | %-13s | %-5s | %-18s | %d | %7.1f MB | %8.1f us | %5.0f GB/s\n", what, fmt, shape,
               n, nbytes / 1e6, us, nbytes / us / 1e3);
    else
        printf("# bench | %s %s failed: %s\n", what, fmt, err->msg);
}

static void bench_matvec(uint32_t type, int64_t ncols, int64_t nrows, int n)
{
    bl_err_t err = {0};
    size_t rb;
    if (bl_row_bytes(type, ncols, &rb, &err) < 0)
        bail("bl_row_bytes", &err);
    const size_t nbytes = rb * (size_t)nrows;
    char key[96];
    snprintf(key, sizeof key, "matvec %s %lldx%lld n%d", bl_type_info(type)->name, (long long)nrows,
             (long long)ncols, n);
    if (!bench_wanted(key))
        return;
    void *dw = rand_weights(nbytes);
    float *dx = rand_acts(ncols * n), *dy = d_alloc(sizeof(float) * (size_t)(nrows * n));
    kcuda_mat_t m;
    if (kcuda_mat_init(&m, dw, type, ncols, nrows, &err) < 0)
        bail("bench set-up", &err);
    const int reps = 40;
    int rc = 0;
    for (int i = 0; i < 3; i++)
        rc |= kcuda_matvec(&m, dx, ncols, n, dy, nrows, 0, NULL, &err);
    rc |= kcuda_sync(NULL, &err);
    const double t0 = now_us();
    for (int i = 0; i < reps && rc == 0; i++)
        rc |= kcuda_matvec(&m, dx, ncols, n, dy, nrows, 0, NULL, &err);
    rc |= kcuda_sync(NULL, &err);
    char shape[64];
    snprintf(shape, sizeof shape, "%lld x %lld", (long long)nrows, (long long)ncols);
    bench_line("matvec", bl_type_info(type)->name, shape, n, (double)nbytes, (now_us() - t0) / reps, rc, &err);
    kcuda_free(dw);
    kcuda_free(dx);
    kcuda_free(dy);
}

/* One MoE layer's expert products for n tokens, E n_embd, F the expert width, top k
 * of ne: gate/up with SwiGLU, then down with the weighted sum; grouped: by expert on
 * tensor cores (kcuda_matvec_set_group(0)) instead of one slot a block. Launches
 * cycle over NL layers' experts and pseudo-random choices (k distinct a row), so no
 * launch finds its weights in L2 from the one before; GB/s counts the bytes of the
 * distinct experts a launch reads. */
#define BENCH_SETS 16
static void bench_experts(uint32_t tu, uint32_t td, int64_t ne, int64_t E, int64_t F, int k, int n, int grouped)
{
    bl_err_t err = {0};
    char key[96];
    snprintf(key, sizeof key, "experts %s %s n%d%s", bl_type_info(tu)->name, bl_type_info(td)->name, n,
             grouped ? " grouped" : "");
    if (!bench_wanted(key))
        return;
    size_t rbu, rbd;
    if (bl_row_bytes(tu, E, &rbu, &err) < 0 || bl_row_bytes(td, F, &rbd, &err) < 0)
        bail("bl_row_bytes", &err);
    const int nl = n == 1 ? 1 : 4; /* one token's 8 experts of 128 already cycle 16 disjoint sets */
    void *dg = rand_weights(rbu * (size_t)(nl * ne * F)), *du = rand_weights(rbu * (size_t)(nl * ne * F));
    void *dd = rand_weights(rbd * (size_t)(nl * ne * E));
    const int ns = n * k;
    int32_t *ids = xmalloc(sizeof(int32_t) * (size_t)(BENCH_SETS * ns));
    float *wts = xmalloc(sizeof(float) * (size_t)(BENCH_SETS * ns));
    double distinct = 0.0;
    uint32_t h = 0x9e3779b9u;
    for (int s = 0; s < BENCH_SETS; s++) {
        uint8_t seen[1024] = {0};
        for (int i = 0; i < ns; i++) {
            int32_t e;
            if (n == 1) {
                e = (int32_t)(((s * k + i) * 37) % ne); /* 37 is odd: disjoint sets for ne a power of 2 */
            } else {
                int again;
                do { /* distinct within the row */
                    h ^= h << 13;
                    h ^= h >> 17;
                    h ^= h << 5;
                    e = (int32_t)(h % (uint32_t)ne);
                    again = 0;
                    for (int j = i - i % k; j < i; j++)
                        again |= ids[s * ns + j] == e;
                } while (again);
            }
            ids[s * ns + i] = e;
            wts[s * ns + i] = 1.0f / (float)k;
            if (e < 1024 && !seen[e]) {
                seen[e] = 1;
                distinct += 1.0;
            }
        }
    }
    distinct /= BENCH_SETS;
    int32_t *dids = d_upload(ids, sizeof(int32_t) * (size_t)(BENCH_SETS * ns));
    float *dwts = d_upload(wts, sizeof(float) * (size_t)(BENCH_SETS * ns));
    float *dx = rand_acts(E * n), *dh = rand_acts(F * ns);
    float *dsw = d_alloc(sizeof(float) * (size_t)(F * ns)), *dy = d_alloc(sizeof(float) * (size_t)(E * n));
    float *dscr = d_alloc(sizeof(float) * (size_t)(E * ns));
    kcuda_mat_t mg[4], mu[4], md[4];
    for (int l = 0; l < nl; l++)
        if (kcuda_mat_init(&mg[l], (uint8_t *)dg + rbu * (size_t)(l * ne * F), tu, E, ne * F, &err) < 0 ||
            kcuda_mat_init(&mu[l], (uint8_t *)du + rbu * (size_t)(l * ne * F), tu, E, ne * F, &err) < 0 ||
            kcuda_mat_init(&md[l], (uint8_t *)dd + rbd * (size_t)(l * ne * E), td, F, ne * E, &err) < 0)
            bail("bench set-up", &err);
    void *st = NULL;
    if (kcuda_stream_create(&st, &err) < 0)
        bail("bench stream", &err);
    const int old_group = kcuda_matvec_set_group(grouped ? 0 : 1 << 30);
    const int reps = 200;
    int rc = 0;
    for (int pass = 0; pass < 2; pass++) {
        double t0 = 0.0;
        for (int i = -4; i < reps && rc == 0; i++) { /* 4 warm-up launches */
            if (i == 0) {
                rc |= kcuda_sync(st, &err);
                t0 = now_us();
            }
            const int l = (i + 4) % nl, s = (i + 4) % BENCH_SETS;
            const int32_t *si = dids + s * ns;
            const float *sw = dwts + s * ns;
            rc |= pass == 0 ? kcuda_matvec_experts_swiglu(&mg[l], &mu[l], ne, si, n, k, dx, E, dsw, F, st, &err)
                            : kcuda_matvec_experts_down_grouped(&md[l], ne, si, sw, n, k, dh, F, NULL, dscr, E, dy, E,
                                                                0, st, &err);
        }
        rc |= kcuda_sync(st, &err);
        const double us = (now_us() - t0) / reps;
        char shape[64];
        if (pass == 0) {
            snprintf(shape, sizeof shape, "%dx2 x %lld x %lld%s", k, (long long)F, (long long)E, grouped ? " g" : "");
            bench_line("experts_swiglu", bl_type_info(tu)->name, shape, n, 2.0 * distinct * (double)(rbu * (size_t)F),
                       us, rc, &err);
        } else {
            snprintf(shape, sizeof shape, "%d x %lld x %lld%s", k, (long long)E, (long long)F, grouped ? " g" : "");
            bench_line("experts_down", bl_type_info(td)->name, shape, n, distinct * (double)(rbd * (size_t)E), us, rc,
                       &err);
        }
    }
    kcuda_matvec_set_group(old_group);
    kcuda_stream_destroy(st);
    kcuda_free(dg); kcuda_free(du); kcuda_free(dd); kcuda_free(dids); kcuda_free(dwts);
    kcuda_free(dx); kcuda_free(dh); kcuda_free(dsw); kcuda_free(dy); kcuda_free(dscr);
    free(ids);
    free(wts);
}

static void bench_all(void)
{
    printf("# bench | what          | fmt   | rows x cols        | n |      MB    |       us    |  GB/s\n");
    const uint32_t bt[] = {BL_TYPE_Q4_K, BL_TYPE_Q5_K, BL_TYPE_Q6_K, BL_TYPE_Q8_0, BL_TYPE_F16};
    const int ns[] = {1, 2, 4, 8};
    for (int t = 0; t < 5; t++)
        for (int i = 0; i < 4; i++)
            bench_matvec(bt[t], 4096, 32768, ns[i]);
    bench_matvec(BL_TYPE_Q6_K, 768, 131072, 1); /* expert down rows: 630 bytes, unaligned */
    bench_matvec(BL_TYPE_Q4_K, 2048, 65536, 1);
    /* 30B-A3B-class decode shapes: attention q (4096 x 2048), the head (151936 x 2048) */
    bench_matvec(BL_TYPE_Q4_K, 2048, 4096, 1);
    bench_matvec(BL_TYPE_Q6_K, 2048, 151936, 1);
    bench_experts(BL_TYPE_Q4_K, BL_TYPE_Q6_K, 128, 2048, 768, 8, 1, 0);
    /* several tokens' experts (a decode step of n slots): one slot a block, grouped */
    const int en[] = {4, 8, 16, 32};
    for (int i = 0; i < 4; i++)
        for (int g = 0; g < 2; g++)
            bench_experts(BL_TYPE_Q4_K, BL_TYPE_Q6_K, 128, 2048, 768, 8, en[i], g);
    /* mxfp4: a plain product, and a gpt-oss-20b-class layer's experts (E = F = 2880,
     * top 4 of 32) */
    for (int i = 0; i < 4; i++)
        bench_matvec(BL_TYPE_MXFP4, 4096, 32768, ns[i]);
    bench_experts(BL_TYPE_MXFP4, BL_TYPE_MXFP4, 32, 2880, 2880, 4, 1, 0);
    /* what the second activation term costs: the same lines with one term */
    const int old = kcuda_matvec_set_act_terms(1);
    printf("# bench | one q8 activation term from here\n");
    bench_matvec(BL_TYPE_Q4_K, 4096, 32768, 1);
    bench_matvec(BL_TYPE_Q6_K, 4096, 32768, 8);
    bench_matvec(BL_TYPE_Q4_K, 2048, 4096, 1);
    bench_experts(BL_TYPE_Q4_K, BL_TYPE_Q6_K, 128, 2048, 768, 8, 1, 0);
    bench_experts(BL_TYPE_Q4_K, BL_TYPE_Q6_K, 128, 2048, 768, 8, 8, 0);
    kcuda_matvec_set_act_terms(old);
}

/* kcuda_matvec_bias with accumulate onto random y: the bits of kcuda_matvec's
 * accumulation, then the bias added (in that order, as a product onto the residual
 * and the projection's bias after it), and without accumulate the product plus the
 * bias; whichever kernel the type and row count take. */
static void case_bias(rng_t *r, uint32_t type, int64_t ncols, int64_t nrows, int n)
{
    bl_err_t err = {0};
    wmat_t w;
    make_mat(r, &w, type, ncols, nrows);
    const kcuda_mat_t mw = kmat(&w);
    const int64_t ldx = round4(ncols), ldy = nrows + 3;
    const size_t ny = sizeof(float) * (size_t)(ldy * n);
    float *x = xmalloc(sizeof(float) * (size_t)(ldx * n)), *y0 = xmalloc(ny), *bias = xmalloc(sizeof(float) * (size_t)nrows);
    rand_fill(r, x, ldx * n, 1.0f);
    rand_fill(r, y0, ldy * n, 4.0f);
    rand_fill(r, bias, nrows, 1.0f);
    float *dx = d_upload(x, sizeof(float) * (size_t)(ldx * n)), *db = d_upload(bias, sizeof(float) * (size_t)nrows);
    float *dp = d_upload(y0, ny), *dq = d_upload(y0, ny), *dz = d_poison(ny), *dw = d_poison(ny);
    float *p = xmalloc(ny), *q = xmalloc(ny), *z = xmalloc(ny), *wz = xmalloc(ny);
    int ok = kcuda_matvec(&mw, dx, ldx, n, dp, ldy, 1, NULL, &err) == 0 &&
             kcuda_matvec_bias(&mw, dx, ldx, n, db, dq, ldy, 1, NULL, &err) == 0 &&
             kcuda_matvec(&mw, dx, ldx, n, dz, ldy, 0, NULL, &err) == 0 &&
             kcuda_matvec_bias(&mw, dx, ldx, n, db, dw, ldy, 0, NULL, &err) == 0 &&
             d_fetch(p, dp, ny, &err) == 0 && d_fetch(q, dq, ny, &err) == 0 && d_fetch(z, dz, ny, &err) == 0 &&
             d_fetch(wz, dw, ny, &err) == 0;
    int same = ok;
    for (int b = 0; ok && b < n; b++)
        for (int64_t i = 0; i < nrows; i++) {
            const float acc = p[b * ldy + i] + bias[i], plain = z[b * ldy + i] + bias[i];
            if (memcmp(&acc, &q[b * ldy + i], sizeof acc) || memcmp(&plain, &wz[b * ldy + i], sizeof plain)) {
                if (same)
                    printf("#   row %d output %lld: %.9g / %.9g, want %.9g / %.9g\n", b, (long long)i,
                           q[b * ldy + i], wz[b * ldy + i], acc, plain);
                same = 0;
            }
        }
    if (!ok)
        printf("#   %s\n", err.msg);
    tap_ok(ok && same, "matvec_bias %s: %lld x %lld, %d row%s, with and without accumulate: the product's bits plus "
           "the bias", bl_type_info(type)->name, (long long)nrows, (long long)ncols, n, n == 1 ? "" : "s");
    kcuda_free(dx), kcuda_free(db), kcuda_free(dp), kcuda_free(dq), kcuda_free(dz), kcuda_free(dw);
    free(x), free(y0), free(bias), free(p), free(q), free(z), free(wz);
    free_mat(&w);
}

int main(void)
{
    gpu_test_init("test_kcuda_matvec");
    const char *bo = getenv("BLOOMERY_MV_BENCH");
    if (bo && *bo && strcmp(bo, "0") != 0) {
        g_bench_only = strcmp(bo, "1") == 0 ? NULL : bo;
        bench_all();
        return tap_done();
    }
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
    /* mxfp4: 1 block, 3 blocks (51-byte rows: unaligned starts), 97 blocks (a group of
     * 96 and 1), gpt-oss's 2880 (90 blocks: one group, a partial third pass), the pair. */
    case_matvec(&r, BL_TYPE_MXFP4, 32, 3, 1, 0, 0);
    case_matvec(&r, BL_TYPE_MXFP4, 96, 41, 4, 0, 0);
    case_matvec(&r, BL_TYPE_MXFP4, 3104, 66, 1, 1, 0);
    case_matvec(&r, BL_TYPE_MXFP4, 2880, 9, KCUDA_MV_MAX_ROWS, 0, 0);
    case_matvec(&r, BL_TYPE_MXFP4, 1056, 13, 3, 0, 1);
    case_matvec(&r, BL_TYPE_MXFP4, 2880, 35, 2, 0, 1);
    /* f16, bf16, f32: odd lengths (rows of any alignment), a group plus a tail. */
    const uint32_t fl[] = {BL_TYPE_F16, BL_TYPE_BF16, BL_TYPE_F32};
    for (int t = 0; t < 3; t++) {
        case_matvec(&r, fl[t], 1, 7, 1, 0, 0);
        case_matvec(&r, fl[t], 37, 29, 3, 0, 0);
        case_matvec(&r, fl[t], 1030, 45, 2, 1, 0);
        case_matvec(&r, fl[t], 2048, 128, KCUDA_MV_MAX_ROWS, 0, 0);
        case_matvec(&r, fl[t], 515, 19, 1, 0, 1);
    }
    /* Many rows per warp (the launcher gives a warp several rows when there are more
     * than the card holds at once), a partial last block, odd block counts. */
    case_matvec(&r, BL_TYPE_Q4_K, 512, 9001, 1, 0, 0);
    case_matvec(&r, BL_TYPE_Q5_K, 256, 7003, 3, 1, 0);
    case_matvec(&r, BL_TYPE_Q6_K, 768, 6007, 2, 0, 0);
    case_matvec(&r, BL_TYPE_Q8_0, 96, 12001, 1, 0, 0);
    case_matvec(&r, BL_TYPE_MXFP4, 160, 10007, 2, 0, 0);
    case_matvec(&r, BL_TYPE_F16, 99, 8001, 1, 0, 0);
    case_matvec(&r, BL_TYPE_Q4_K, 256, 5001, 1, 0, 1);
    /* Long rows: rounded activations past 48 KB of shared memory (8 rows of 12288),
     * and past what one block holds (8 rows of 25600: the launcher splits the rows). */
    case_matvec(&r, BL_TYPE_Q4_K, 12288, 67, KCUDA_MV_MAX_ROWS, 0, 0);
    case_matvec(&r, BL_TYPE_Q8_0, 25600, 19, KCUDA_MV_MAX_ROWS, 1, 0);
    case_matvec(&r, BL_TYPE_Q6_K, 25600, 11, 5, 0, 0);
    case_matvec(&r, BL_TYPE_MXFP4, 25600, 13, KCUDA_MV_MAX_ROWS, 0, 0);
    /* The largest decode shapes of a 30B-A3B-class model: q (4096 x 2048), o (2048 x
     * 4096), the router (128 x 2048, f32). */
    if (!g_small) {
        case_matvec(&r, BL_TYPE_Q4_K, 2048, 4096, 1, 0, 0);
        case_matvec(&r, BL_TYPE_Q6_K, 4096, 2048, 1, 1, 0);
        case_matvec(&r, BL_TYPE_Q8_0, 2048, 4096, 2, 0, 0);
        case_matvec(&r, BL_TYPE_F32, 2048, 128, 1, 0, 0);
        case_matvec(&r, BL_TYPE_MXFP4, 2880, 4096, 1, 0, 0); /* gpt-oss's q shape (64 heads of 64) */
    }

    /* One q8 term (the kernels' option), its reference rounded the same way. */
    {
        const int old = kcuda_matvec_set_act_terms(1);
        case_matvec(&r, BL_TYPE_Q4_K, 2304, 130, 3, 1, 0);
        case_matvec(&r, BL_TYPE_Q5_K, 768, 37, 1, 0, 1);
        case_matvec(&r, BL_TYPE_Q6_K, 768, 37, KCUDA_MV_MAX_ROWS, 0, 0);
        case_matvec(&r, BL_TYPE_Q8_0, 1056, 66, 2, 0, 0);
        case_matvec(&r, BL_TYPE_MXFP4, 2880, 66, 3, 1, 0);
        case_matvec(&r, BL_TYPE_MXFP4, 1056, 21, 1, 0, 1);
        kcuda_matvec_set_act_terms(old);
    }
    /* q, k and v in one launch; the small f32/f16/bf16 path (few rows, ncols a
     * multiple of 4) with 1..8 rows and accumulate */
    case_split(&r, BL_TYPE_Q4_K, 512, 64, 16, 32, 1);
    case_split(&r, BL_TYPE_Q6_K, 768, 48, 16, 16, 3);
    case_split(&r, BL_TYPE_Q8_0, 96, 16, 32, 48, KCUDA_MV_MAX_ROWS);
    case_split(&r, BL_TYPE_MXFP4, 96, 16, 32, 48, 3);
    case_split(&r, BL_TYPE_Q5_K, 2048, 4096 / 8, 512 / 8, 512 / 8, 2);
    case_split2(&r, BL_TYPE_Q4_K, BL_TYPE_Q6_K, 2048, 4096, 512, 512, 1); /* Qwen3-30B-A3B's attention */
    case_split2(&r, BL_TYPE_Q4_K, BL_TYPE_Q6_K, 512, 128, 64, 77, 3);
    case_split2(&r, BL_TYPE_Q5_K, BL_TYPE_Q8_0, 1024, 256, 96, 131, KCUDA_MV_MAX_ROWS);
    case_split2(&r, BL_TYPE_Q4_K, BL_TYPE_Q5_K, 256, 32, 32, 40, 2);
    case_split2(&r, BL_TYPE_Q8_0, BL_TYPE_Q4_K, 256, 64, 32, 16, 1); /* not a known pair: two launches */
    case_split2(&r, BL_TYPE_MXFP4, BL_TYPE_MXFP4, 2880, 64, 16, 16, 2); /* two launches too */
    /* a bias after the product: the streaming kernel (q8_0, mxfp4: gpt-oss's o
     * projection), the tensor cores (q4_K, q6_K at 4-8 rows), the small f32/f16 path */
    case_bias(&r, BL_TYPE_Q8_0, 4096, 2880, 1);
    case_bias(&r, BL_TYPE_MXFP4, 2880, 67, 3);
    case_bias(&r, BL_TYPE_Q4_K, 1024, 100, KCUDA_MV_MAX_ROWS);
    case_bias(&r, BL_TYPE_Q6_K, 768, 37, 4);
    case_bias(&r, BL_TYPE_F32, 516, 61, 3);
    case_bias(&r, BL_TYPE_F16, 1024, 130, 1);
    case_matvec(&r, BL_TYPE_F32, 2048, 128, 1, 0, 0);
    case_matvec(&r, BL_TYPE_F32, 516, 61, 3, 1, 0);
    case_matvec(&r, BL_TYPE_F16, 1024, 130, KCUDA_MV_MAX_ROWS, 1, 0);
    case_matvec(&r, BL_TYPE_BF16, 4, 3, 2, 0, 0);
    /* the tensor-core products: the same bits whatever the step's row count; the
     * streaming kernel's several-row form (other types, and these with the tensor
     * cores off) */
    case_mma_bits(&r, BL_TYPE_Q4_K, 2048, 531);
    case_mma_bits(&r, BL_TYPE_Q6_K, 768, 77);
    case_mma_bits(&r, BL_TYPE_Q4_K, 256, 17);
    {
        const int old = kcuda_matvec_set_mma(0);
        case_matvec(&r, BL_TYPE_Q4_K, 2304, 130, KCUDA_MV_MAX_ROWS, 1, 0);
        case_matvec(&r, BL_TYPE_Q6_K, 768, 37, 3, 0, 0);
        case_matvec(&r, BL_TYPE_Q4_K, 768, 21, 2, 0, 1);
        case_split2(&r, BL_TYPE_Q4_K, BL_TYPE_Q6_K, 512, 128, 64, 77, 3);
        kcuda_matvec_set_mma(1); /* every product of these types on tensor cores, one row too */
        case_matvec(&r, BL_TYPE_Q4_K, 1024, 45, 1, 1, 0);
        case_matvec(&r, BL_TYPE_Q6_K, 4096, 33, 1, 0, 0);
        case_matvec(&r, BL_TYPE_Q4_K, 512, 19, 1, 0, 1);
        kcuda_matvec_set_mma(old);
    }
    case_matvec(&r, BL_TYPE_Q6_K, 1280, 99, 7, 1, 0); /* 5 super-blocks: two warps a tile */
    case_matvec(&r, BL_TYPE_Q6_K, 2048, 40, 4, 0, 1); /* q6_K's SwiGLU pair */
    case_terms(&r, BL_TYPE_Q4_K, 2048, 512, 1);
    case_terms(&r, BL_TYPE_Q5_K, 4096, 256, 2);
    case_terms(&r, BL_TYPE_Q6_K, 768, 512, KCUDA_MV_MAX_ROWS);
    case_terms(&r, BL_TYPE_Q8_0, 1056, 300, 3);
    case_terms(&r, BL_TYPE_MXFP4, 2880, 300, 2);
    const uint32_t all[] = {BL_TYPE_Q4_K, BL_TYPE_Q5_K, BL_TYPE_Q6_K, BL_TYPE_Q8_0, BL_TYPE_MXFP4,
                            BL_TYPE_F16, BL_TYPE_BF16, BL_TYPE_F32};
    for (size_t t = 0; t < sizeof all / sizeof all[0]; t++) {
        const int64_t cols = bl_type_info(all[t])->block_elems == 1 ? 77 : 512;
        case_get_rows(&r, all[t], cols, 50, 6);
    }
    if (!g_small)
        bench_all();
    return tap_done();
}
