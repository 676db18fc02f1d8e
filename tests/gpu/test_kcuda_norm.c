/* GPU tests for kernels/cuda/norm.cu: RMSNorm (warp-per-row and block-per-row
 * paths, strided rows, in place), NEOX RoPE, the fused per-head RMSNorm + RoPE,
 * SwiGLU and the residual add, each against kernels/cpu's reference on fresh
 * random inputs. TAP output; the seed is printed. */
#include "gpu_test.h"

#include "kcpu.h"

static double *to_double(const float *x, int64_t rows, int64_t cols, int64_t ld)
{
    double *d = xmalloc(sizeof(double) * (size_t)(rows * cols));
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++)
            d[i * cols + j] = x[i * ld + j];
    return d;
}

static void case_rms_norm(rng_t *r, int64_t n, int64_t d, int64_t ld, int in_place)
{
    bl_err_t err = {0};
    float *x = xmalloc(sizeof(float) * (size_t)(n * ld)), *g = xmalloc(sizeof(float) * (size_t)d);
    float *want = xmalloc(sizeof(float) * (size_t)(n * ld)), *got = xmalloc(sizeof(float) * (size_t)(n * ld));
    rand_fill(r, x, n * ld, 3.0f);
    rand_fill(r, g, d, 2.0f);
    kcpu_rms_norm(NULL, want, x, g, n, d, ld, 1e-6f);
    float *dx = d_upload(x, sizeof(float) * (size_t)(n * ld));
    float *dg = d_upload(g, sizeof(float) * (size_t)d);
    float *dy = in_place ? dx : d_poison(sizeof(float) * (size_t)(n * ld));
    int ok = kcuda_rms_norm(dy, dx, dg, n, d, ld, 1e-6f, NULL, &err) == 0 &&
             d_fetch(got, dy, sizeof(float) * (size_t)(n * ld), &err) == 0;
    if (!ok)
        printf("#   %s\n", err.msg);
    else {
        double *ref = to_double(want, n, d, ld);
        ok = check_close(got, ld, ref, n, d, 1e-6, 2e-6);
        free(ref);
    }
    tap_ok(ok, "rms_norm: %lld rows of %lld, ld %lld%s", (long long)n, (long long)d, (long long)ld,
           in_place ? ", in place" : "");
    kcuda_free(dx);
    kcuda_free(dg);
    if (!in_place)
        kcuda_free(dy);
    free(x); free(g); free(want); free(got);
}

/* RoPE alone (fused = 0), per-head RMSNorm then RoPE in one kernel (fused = 1), or
 * that kernel without gains (fused = 2: no norm), over the first n_rot dims of each
 * head (0: all of them; GLM-4.5 rotates half). */
static void case_rope_yarn(rng_t *r, int64_t n, int64_t n_head, int64_t hd, int64_t n_rot, int32_t max_pos,
                           int fused, const kcpu_rope_t *yarn)
{
    bl_err_t err = {0};
    const int64_t len = n * n_head * hd;
    const float base = 1000000.0f, eps = 1e-6f;
    float *x = xmalloc(sizeof(float) * (size_t)len), *want = xmalloc(sizeof(float) * (size_t)len);
    float *got = xmalloc(sizeof(float) * (size_t)len), *g = xmalloc(sizeof(float) * (size_t)hd);
    float *cs = xmalloc(sizeof(float) * (size_t)(n * hd));
    int32_t *pos = xmalloc(sizeof(int32_t) * (size_t)n);
    rand_fill(r, x, len, 2.0f);
    rand_fill(r, g, hd, 2.0f);
    for (int64_t b = 0; b < n; b++)
        pos[b] = (int32_t)(rng_next(r) % (uint64_t)(max_pos + 1));
    pos[0] = max_pos;
    const int64_t nr = n_rot ? n_rot : hd;
    if (fused == 1)
        kcpu_rms_norm(NULL, want, x, g, n * n_head, hd, hd, eps);
    else
        memcpy(want, x, sizeof(float) * (size_t)len);
    const kcpu_rope_t rp = yarn ? *yarn : kcpu_rope_plain(nr, base);
    kcpu_rope_table(cs, pos, n, &rp);
    kcpu_rope_neox(want, cs, n, n_head, hd, nr);
    float *dx = d_upload(x, sizeof(float) * (size_t)len);
    float *dg = d_upload(g, sizeof(float) * (size_t)hd);
    int32_t *dp = d_upload(pos, sizeof(int32_t) * (size_t)n);
    const kcuda_rope_t crp = {(int)rp.n_rot, rp.base, rp.freq_scale, rp.ext_factor, rp.corr_lo, rp.corr_hi,
                              rp.mscale};
    const int rc = fused ? kcuda_rms_norm_rope(dx, fused == 1 ? dg : NULL, dp, n, n_head, hd, &crp, eps, NULL, &err)
                         : kcuda_rope_neox(dx, dp, n, n_head, hd, base, NULL, &err);
    int ok = rc == 0 && d_fetch(got, dx, sizeof(float) * (size_t)len, &err) == 0;
    if (!ok)
        printf("#   %s\n", err.msg);
    else {
        double *ref = to_double(want, 1, len, len);
        ok = check_close(got, len, ref, 1, len, 2e-6, 2e-6);
        free(ref);
    }
    tap_ok(ok, "%s: %lld rows, %lld heads of %lld, %lld rotated, positions up to %d%s",
           fused == 1 ? "rms_norm_rope" : fused ? "rms_norm_rope without gains" : "rope_neox", (long long)n,
           (long long)n_head, (long long)hd, (long long)nr, max_pos, yarn ? ", YaRN" : "");
    kcuda_free(dx); kcuda_free(dg); kcuda_free(dp);
    free(x); free(want); free(got); free(g); free(cs); free(pos);
}

static void case_rope_part(rng_t *r, int64_t n, int64_t n_head, int64_t hd, int64_t n_rot, int32_t max_pos,
                           int fused)
{
    case_rope_yarn(r, n, n_head, hd, n_rot, max_pos, fused, NULL);
}

static void case_rope(rng_t *r, int64_t n, int64_t n_head, int64_t hd, int32_t max_pos, int fused)
{
    case_rope_part(r, n, n_head, hd, 0, max_pos, fused);
}

static void case_swiglu_add(rng_t *r, int64_t n)
{
    bl_err_t err = {0};
    float *g = xmalloc(sizeof(float) * (size_t)n), *u = xmalloc(sizeof(float) * (size_t)n);
    float *want = xmalloc(sizeof(float) * (size_t)n), *got = xmalloc(sizeof(float) * (size_t)n);
    rand_fill(r, g, n, 8.0f);
    rand_fill(r, u, n, 2.0f);
    kcpu_swiglu(NULL, want, g, u, n);
    float *dg = d_upload(g, sizeof(float) * (size_t)n), *du = d_upload(u, sizeof(float) * (size_t)n);
    float *dy = d_poison(sizeof(float) * (size_t)n);
    int ok = kcuda_swiglu(dy, dg, du, n, NULL, &err) == 0 && d_fetch(got, dy, sizeof(float) * (size_t)n, &err) == 0;
    if (!ok)
        printf("#   %s\n", err.msg);
    else {
        double *ref = to_double(want, 1, n, n);
        ok = check_close(got, n, ref, 1, n, 1e-6, 1e-6);
        free(ref);
    }
    tap_ok(ok, "swiglu: %lld elements", (long long)n);

    /* y += x in place on the card: y = g, x = u. */
    for (int64_t i = 0; i < n; i++)
        want[i] = g[i] + u[i];
    ok = kcuda_add(dg, du, n, NULL, &err) == 0 && d_fetch(got, dg, sizeof(float) * (size_t)n, &err) == 0;
    if (!ok)
        printf("#   %s\n", err.msg);
    else {
        double *ref = to_double(want, 1, n, n);
        ok = check_close(got, n, ref, 1, n, 0.0, 0.0); /* one rounding, the same on both sides */
        free(ref);
    }
    tap_ok(ok, "add: %lld elements", (long long)n);

    /* y (rows, d) += bias (d): y = g as n / 7 rows of 7, the bias u's first 7 */
    const int64_t rows = n / 7;
    if (rows > 0) {
        ok = d_fetch(want, dg, sizeof(float) * (size_t)n, &err) == 0;
        for (int64_t i = 0; i < rows * 7; i++)
            want[i] += u[i % 7];
        ok = ok && kcuda_add_bias(dg, du, rows, 7, NULL, &err) == 0 &&
             d_fetch(got, dg, sizeof(float) * (size_t)n, &err) == 0;
        if (!ok)
            printf("#   %s\n", err.msg);
        else {
            double *ref = to_double(want, 1, n, n);
            ok = check_close(got, n, ref, 1, n, 0.0, 0.0);
            free(ref);
        }
        tap_ok(ok, "add_bias: %lld rows of 7", (long long)rows);
    }
    kcuda_free(dg); kcuda_free(du); kcuda_free(dy);
    free(g); free(u); free(want); free(got);
}

int main(void)
{
    gpu_test_init("test_kcuda_norm");
    rng_t r = rng_for(3);

    case_rms_norm(&r, 1, 2048, 2048, 0);  /* block path */
    case_rms_norm(&r, 3, 4103, 4108, 0);  /* odd length, strided */
    case_rms_norm(&r, 2, 6144, 6148, 1);  /* float4 rows past what the registers hold, in place */
    case_rms_norm(&r, 2, 513, 520, 1);    /* just past the warp path, in place */
    case_rms_norm(&r, 5, 37, 40, 0);      /* warp path, odd */
    case_rms_norm(&r, 4 * 32, 128, 128, 1); /* per-head: 4 rows x 32 heads */
    case_rms_norm(&r, 1, 1, 4, 0);

    case_rope(&r, 1, 32, 128, 0, 0);
    case_rope(&r, 3, 5, 128, 40000, 0);
    case_rope(&r, 2, 7, 64, 131071, 0);
    case_rope(&r, 4, 3, 2, 9, 0);
    case_rope(&r, 1, 32, 128, 1234, 1);
    case_rope(&r, 3, 4, 128, 40000, 1);
    case_rope(&r, 2, 9, 80, 777, 1);      /* half not a multiple of 32 */
    case_rope(&r, 2, 3, 256, 65535, 1);
    case_rope_part(&r, 3, 12, 128, 64, 5000, 2);  /* GLM-4.5: half rotated, no norms */
    case_rope_part(&r, 2, 4, 128, 64, 300, 1);    /* gains and half rotated */
    case_rope_part(&r, 2, 5, 96, 32, 70000, 2);
    {
        /* gpt-oss's YaRN (factor 32, a ramp over pairs 8..17) with a scaled
         * rotation (mscale), and a scaling without it */
        const kcpu_rope_t y1 = {.n_rot = 64, .base = 150000.0f, .freq_scale = 1.0f / 32.0f, .ext_factor = 1.0f,
                                .corr_lo = 8.09f, .corr_hi = 17.4f, .mscale = 1.3466f};
        const kcpu_rope_t y2 = {.n_rot = 64, .base = 10000.0f, .freq_scale = 0.025f, .ext_factor = 1.0f,
                                .corr_lo = 10.0f, .corr_hi = 23.0f, .mscale = 1.0f};
        case_rope_yarn(&r, 3, 8, 64, 64, 100000, 2, &y1);
        case_rope_yarn(&r, 2, 4, 128, 64, 3000, 1, &y2);
    }

    case_swiglu_add(&r, 1);
    case_swiglu_add(&r, 6144 + 7);
    if (!g_small)
        case_swiglu_add(&r, 1 << 22);
    return tap_done();
}
