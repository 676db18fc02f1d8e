/* GPU tests for the prompt path (kernels/cuda/gemm.cu, prefill.cu): dequantization
 * to f16 against the reference dequantizers rounded to f16; the dense GEMM (cuBLAS)
 * against the f16-rounded weights and activations dotted in double, whole and in
 * pieces, stored and accumulated; the expert grouping (sort, gather, grouped GEMM,
 * SwiGLU, weighted combine) against a per-slot reference, an out-of-range id
 * included; prefill flash attention against kcpu_attention. Fresh random inputs,
 * odd sizes. TAP output; the seed is printed. */
#include "gpu_test.h"

#include "kcpu.h"
#include "quant.h"

static const uint32_t k_types[] = {BL_TYPE_Q4_K, BL_TYPE_Q5_K, BL_TYPE_Q6_K, BL_TYPE_Q8_0,
                                   BL_TYPE_MXFP4, BL_TYPE_F16, BL_TYPE_BF16, BL_TYPE_F32};

static float f16r(float x) { return bl_fp16_to_fp32(bl_fp32_to_fp16(x)); }

typedef struct wmat {
    kcuda_mat_t m;
    float *deq; /* (rows, ncols) the reference dequantization */
} wmat_t;

/* Random rows quantized by the reference; for mxfp4 every other row is random
 * bytes instead (rand_mxfp4_row). */
static void make_w(rng_t *r, wmat_t *w, uint32_t type, int64_t ncols, int64_t rows)
{
    bl_err_t err = {0};
    size_t rb;
    if (bl_row_bytes(type, ncols, &rb, &err) < 0)
        bail("bl_row_bytes", &err);
    uint8_t *q = xmalloc(rb * (size_t)rows);
    w->deq = xmalloc(sizeof(float) * (size_t)(rows * ncols));
    float *src = xmalloc(sizeof(float) * (size_t)ncols);
    for (int64_t i = 0; i < rows; i++) {
        uint8_t *qr = q + rb * (size_t)i;
        rand_fill(r, src, ncols, 1.0f);
        if (type == BL_TYPE_MXFP4 && i % 2 == 1)
            rand_mxfp4_row(r, qr, ncols);
        else if (bl_quantize_row_ref(type, src, qr, ncols) != 0)
            bail("reference quantizer", NULL);
        if (bl_dequantize_row_ref(type, qr, w->deq + i * ncols, ncols) != 0)
            bail("reference dequantizer", NULL);
    }
    if (kcuda_mat_init(&w->m, d_upload(q, rb * (size_t)rows), type, ncols, rows, &err) < 0)
        bail("kcuda_mat_init", &err);
    free(q);
    free(src);
}

static void free_w(wmat_t *w)
{
    kcuda_free((void *)w->m.data);
    free(w->deq);
}

static float *fetch_f16(const void *d, int64_t n)
{
    bl_err_t err = {0};
    uint16_t *h = xmalloc(2 * (size_t)n);
    float *f = xmalloc(sizeof(float) * (size_t)n);
    if (d_fetch(h, d, 2 * (size_t)n, &err) < 0)
        bail("fetch", &err);
    for (int64_t i = 0; i < n; i++)
        f[i] = bl_fp16_to_fp32(h[i]);
    free(h);
    return f;
}

static void case_dequant(rng_t *r, uint32_t type, int64_t ncols, int64_t rows)
{
    bl_err_t err = {0};
    wmat_t w;
    make_w(r, &w, type, ncols, rows);
    const int64_t r0 = rows > 3 ? 2 : 0, nr = rows - r0;
    void *d = d_poison(2 * (size_t)(nr * ncols));
    int ok = kcuda_dequant_f16(&w.m, r0, nr, d, NULL, &err) == 0;
    if (ok) {
        float *got = fetch_f16(d, nr * ncols);
        double *ref = xmalloc(sizeof(double) * (size_t)(nr * ncols));
        for (int64_t i = 0; i < nr * ncols; i++)
            ref[i] = f16r(w.deq[r0 * ncols + i]);
        ok = check_close(got, ncols, ref, nr, ncols, 0.0, 0.0); /* the same f16 bits */
        free(got);
        free(ref);
    } else {
        printf("#   %s\n", err.msg);
    }
    tap_ok(ok, "dequant f16 %s: rows %lld..%lld of %lld x %lld", bl_type_info(type)->name, (long long)r0,
           (long long)rows, (long long)rows, (long long)ncols);
    kcuda_free(d);
    free_w(&w);
}

/* kcuda_dequant_f16_groups: the groups (experts) of `rows` rows whose count is not 0
 * get the same f16 bits as kcuda_dequant_f16; the others are left as they were (the
 * poison). Counts from a random draw, some 0, on the card. */
static void case_dequant_groups(rng_t *r, uint32_t type, int64_t ncols, int64_t rows, int64_t groups)
{
    bl_err_t err = {0};
    wmat_t w;
    make_w(r, &w, type, ncols, rows * groups);
    const int64_t n = rows * groups * ncols;
    int32_t *counts = xmalloc(sizeof(int32_t) * (size_t)groups);
    for (int64_t g = 0; g < groups; g++)
        counts[g] = (int32_t)(rng_next(r) % 3); /* a third of them 0 */
    int32_t *dc = d_upload(counts, sizeof(int32_t) * (size_t)groups);
    void *d = d_poison(2 * (size_t)n);
    float *poison = fetch_f16(d, n);
    int ok = kcuda_dequant_f16_groups(&w.m, rows, dc, d, NULL, &err) == 0;
    if (ok) {
        float *got = fetch_f16(d, n);
        for (int64_t i = 0; ok && i < n; i++) {
            const float want = counts[i / (rows * ncols)] ? (float)f16r(w.deq[i]) : poison[i];
            ok = memcmp(&got[i], &want, sizeof want) == 0 || (got[i] != got[i] && want != want);
        }
        free(got);
    } else {
        printf("#   %s\n", err.msg);
    }
    tap_ok(ok, "dequant f16 %s by groups: %lld experts of %lld x %lld, the unchosen left alone",
           bl_type_info(type)->name, (long long)groups, (long long)rows, (long long)ncols);
    ok = kcuda_dequant_f16_groups(&w.m, rows + 1, dc, d, NULL, &err) == BL_EINVAL;
    tap_ok(ok, "dequant f16 by groups: groups that do not divide the rows are refused (%s)", err.msg);
    free(poison);
    free(counts);
    kcuda_free(dc);
    kcuda_free(d);
    free_w(&w);
}

/* y (n, rows) = x w^T through kcuda_gemm; scratch of `scr_rows` rows forces pieces. */
static void case_gemm(rng_t *r, void *blas, uint32_t type, int64_t ncols, int64_t rows, int64_t n, int acc,
                      int64_t scr_rows)
{
    bl_err_t err = {0};
    wmat_t w;
    make_w(r, &w, type, ncols, rows);
    const int64_t ldx = ncols + 8, ldy = rows + 3;
    float *x = xmalloc(sizeof(float) * (size_t)(n * ldx)), *y0 = xmalloc(sizeof(float) * (size_t)(n * ldy));
    rand_fill(r, x, n * ldx, 1.0f);
    rand_fill(r, y0, n * ldy, 1.0f);
    double *ref = xmalloc(sizeof(double) * (size_t)(n * rows));
    const int exact = type == BL_TYPE_F32;
    for (int64_t b = 0; b < n; b++)
        for (int64_t o = 0; o < rows; o++) {
            double s = acc ? y0[b * ldy + o] : 0.0;
            for (int64_t k = 0; k < ncols; k++) {
                const float xv = exact ? x[b * ldx + k] : f16r(x[b * ldx + k]);
                const float wv = exact ? w.deq[o * ncols + k] : f16r(w.deq[o * ncols + k]);
                s += (double)xv * (double)wv;
            }
            ref[b * rows + o] = s;
        }
    float *dx = d_upload(x, sizeof(float) * (size_t)(n * ldx));
    float *dy = d_upload(y0, sizeof(float) * (size_t)(n * ldy));
    void *dx16 = d_poison(2 * (size_t)(n * ldx));
    const size_t scr = 2 * (size_t)(scr_rows * ncols);
    void *ds = d_poison(scr);
    float *y = xmalloc(sizeof(float) * (size_t)(n * ldy));
    int ok = kcuda_to_f16(dx, ldx, n, ncols, dx16, ldx, NULL, &err) == 0 &&
             kcuda_gemm(blas, &w.m, dx16, ldx, dx, ldx, n, dy, ldy, acc, ds, scr, NULL, &err) == 0 &&
             d_fetch(y, dy, sizeof(float) * (size_t)(n * ldy), &err) == 0;
    if (ok)
        ok = check_close(y, ldy, ref, n, rows, 1e-3, 1e-4);
    else
        printf("#   %s\n", err.msg);
    tap_ok(ok, "gemm %s: %lld rows x %lld outputs x %lld%s, scratch %lld rows", bl_type_info(type)->name,
           (long long)n, (long long)rows, (long long)ncols, acc ? ", accumulate" : "", (long long)scr_rows);
    kcuda_free(dx);
    kcuda_free(dy);
    kcuda_free(dx16);
    kcuda_free(ds);
    free(x);
    free(y0);
    free(y);
    free(ref);
    free_w(&w);
}

/* Checks each stage of the expert pipeline on the inputs it really got, so that an
 * f16 rounding of h that lands on the other side of a tie (g and u differ from the
 * double reference in their last f32 bits) is not blamed on the down product:
 * g and u (sorted rows) against f16-rounded operands dotted in double, within
 * 2e-5 of the sum of |terms|; h against silu(g)u from the kernel's own g and u,
 * within one f16 step; y against x0 plus the weighted down products of the
 * kernel's h, in double. */
static int check_expert_stages(const wmat_t *gate, const wmat_t *up, const wmat_t *down, const float *x,
                               const float *x0, const int32_t *ids, const float *wts, const int32_t *inv,
                               const float *d_g, const float *d_u, const void *d_h, const float *y, int64_t ne,
                               int64_t E, int64_t F, int64_t n, int k)
{
    bl_err_t err = {0};
    const int64_t S = n * k, ns = S - 1; /* the last slot's id is out of range */
    float *g = xmalloc(sizeof(float) * (size_t)(ns * F)), *u = xmalloc(sizeof(float) * (size_t)(ns * F));
    if (d_fetch(g, d_g, sizeof(float) * (size_t)(ns * F), &err) < 0 ||
        d_fetch(u, d_u, sizeof(float) * (size_t)(ns * F), &err) < 0)
        bail("fetch g, u", &err);
    float *h = fetch_f16(d_h, ns * F);
    double *ref = xmalloc(sizeof(double) * (size_t)(n * E)), max_sab = 0;
    int64_t bad_gu = 0, bad_h = 0;
    for (int64_t b = 0; b < n; b++) {
        for (int64_t c = 0; c < E; c++)
            ref[b * E + c] = x0[b * E + c];
        for (int j = 0; j < k; j++) {
            const int e = ids[b * k + j];
            const int64_t p = inv[b * k + j];
            if (e < 0 || e >= ne || p < 0)
                continue;
            for (int64_t o = 0; o < F; o++) {
                double gr = 0, ur = 0, ga = 0, ua = 0;
                for (int64_t c = 0; c < E; c++) {
                    const double xv = f16r(x[b * E + c]);
                    const double gt = xv * f16r(gate->deq[(e * F + o) * E + c]);
                    const double ut = xv * f16r(up->deq[(e * F + o) * E + c]);
                    gr += gt, ur += ut, ga += fabs(gt), ua += fabs(ut);
                }
                const double gk = g[p * F + o], uk = u[p * F + o];
                if (!(fabs(gk - gr) <= 2e-5 * ga + 1e-6) || !(fabs(uk - ur) <= 2e-5 * ua + 1e-6)) {
                    if (bad_gu++ < 5)
                        printf("#   slot %lld out %lld: g %.9g want %.9g, u %.9g want %.9g\n", (long long)(b * k + j),
                               (long long)o, gk, gr, uk, ur);
                }
                const double hr = gk / (1.0 + exp(-gk)) * uk, hk = h[p * F + o];
                if (!(fabs(hk - hr) <= fabs(hr) / 1024.0 + 1e-7)) {
                    if (bad_h++ < 5)
                        printf("#   slot %lld out %lld: h %.9g want %.9g\n", (long long)(b * k + j), (long long)o, hk,
                               hr);
                }
            }
            for (int64_t c = 0; c < E; c++) {
                double d = 0, sab = 0;
                for (int64_t o = 0; o < F; o++) {
                    const double t = (double)h[p * F + o] * f16r(down->deq[(e * E + c) * F + o]);
                    d += t;
                    sab += fabs(t);
                }
                ref[b * E + c] += wts[b * k + j] * d;
                max_sab = sab * fabs((double)wts[b * k + j]) > max_sab ? sab * fabs((double)wts[b * k + j]) : max_sab;
            }
        }
    }
    if (bad_gu || bad_h)
        printf("#   %lld g/u and %lld h elements off\n", (long long)bad_gu, (long long)bad_h);
    /* the f32 sums of F terms: their rounding grows with the terms' sizes, not the
     * result's (large mxfp4 values cancel to small outputs). The tensor cores add
     * the products with fewer bits than an f32 add keeps: at gpt-oss's F of 2880 an
     * H100 came 3.9e-7 of the terms' absolute sum away (seed 1796619655312), where
     * the down product's bits equal the f16-copy path's (grouped_same_as_f16) */
    const int ok = !bad_gu && !bad_h && check_close(y, E, ref, n, E, 2e-3 + 8e-7 * max_sab, 2e-3);
    free(g), free(u), free(h), free(ref);
    return ok;
}

/* Whether the grouped GEMM's output y (n_sorted rows, ldy apart), computed from w as
 * stored, has the bits of the same product over w dequantized to f16 first. */
static int grouped_same_as_f16(const wmat_t *w, int64_t ne, int64_t rows_per, const void *xs16,
                               const int32_t *offs, const int32_t *tile0, int64_t n_sorted, const float *y,
                               int64_t ldy, void *wscr, bl_err_t *err)
{
    kcuda_mat_t m16;
    float *y16 = d_poison(sizeof(float) * (size_t)(n_sorted * ldy));
    float *a = xmalloc(sizeof(float) * (size_t)(n_sorted * ldy)), *b = xmalloc(sizeof(float) * (size_t)(n_sorted * ldy));
    int ok = kcuda_dequant_f16(&w->m, 0, w->m.nrows, wscr, NULL, err) == 0 &&
             kcuda_mat_init(&m16, wscr, BL_TYPE_F16, w->m.ncols, w->m.nrows, err) == 0 &&
             kcuda_gemm_grouped(&m16, ne, rows_per, xs16, offs, tile0, n_sorted, y16, ldy, NULL, err) == 0 &&
             d_fetch(a, y, sizeof(float) * (size_t)(n_sorted * ldy), err) == 0 &&
             d_fetch(b, y16, sizeof(float) * (size_t)(n_sorted * ldy), err) == 0;
    if (ok && memcmp(a, b, sizeof(float) * (size_t)(n_sorted * ldy)) != 0) {
        for (int64_t i = 0; i < n_sorted * ldy; i++)
            if (memcmp(&a[i], &b[i], sizeof(float)) != 0) {
                printf("#   %s weights as stored: element %lld is %.9g, over their f16 copy %.9g\n",
                       bl_type_info(w->m.type)->name, (long long)i, a[i], b[i]);
                break;
            }
        ok = 0;
    } else if (!ok) {
        printf("#   %s\n", err->msg);
    }
    kcuda_free(y16);
    free(a), free(b);
    return ok;
}

/* The prompt MoE FFN's expert part for n rows choosing k of ne experts: sort,
 * gather, gate/up grouped GEMMs, SwiGLU, down, combine onto random x. The last
 * slot names an expert past the end (it must contribute nothing). */
static void case_experts(rng_t *r, uint32_t type_up, uint32_t type_down, int64_t ne, int64_t E, int64_t F, int64_t n,
                         int k)
{
    bl_err_t err = {0};
    wmat_t gate, up, down;
    make_w(r, &gate, type_up, E, ne * F);
    make_w(r, &up, type_up, E, ne * F);
    make_w(r, &down, type_down, F, ne * E);
    const int64_t S = n * k;
    float *x = xmalloc(sizeof(float) * (size_t)(n * E)), *x0 = xmalloc(sizeof(float) * (size_t)(n * E));
    rand_fill(r, x, n * E, 1.0f);
    rand_fill(r, x0, n * E, 1.0f);
    int32_t *ids = xmalloc(sizeof(int32_t) * (size_t)S);
    float *wts = xmalloc(sizeof(float) * (size_t)S);
    for (int64_t s = 0; s < S; s++) {
        ids[s] = (int32_t)(rng_next(r) % (uint64_t)(ne > 3 ? ne / 2 + 1 : ne)); /* some experts unused */
        wts[s] = rng_f(r, 0.0f, 1.0f);
    }
    ids[S - 1] = (int32_t)ne;
    float *dx = d_upload(x, sizeof(float) * (size_t)(n * E)), *dy = d_upload(x0, sizeof(float) * (size_t)(n * E));
    int32_t *dids = d_upload(ids, sizeof(int32_t) * (size_t)S);
    float *dw = d_upload(wts, sizeof(float) * (size_t)S);
    int32_t *srt = d_poison(4 * (size_t)(3 * ne + 2 + 2 * S));
    int32_t *counts = srt, *offs = counts + ne, *tile0 = offs + ne + 1, *perm = tile0 + ne + 1, *inv = perm + S;
    const int64_t wide = E > F ? E : F;
    void *xs16 = d_poison(2 * (size_t)(S * wide)), *wscr = d_poison(2 * (size_t)(ne * F * E));
    float *g = d_poison(sizeof(float) * (size_t)(S * F)), *u = d_poison(sizeof(float) * (size_t)(S * F));
    float *dd = d_poison(sizeof(float) * (size_t)(S * E));
    float *y = xmalloc(sizeof(float) * (size_t)(n * E));
    int32_t *hperm = xmalloc(sizeof(int32_t) * (size_t)S), *hinv = xmalloc(sizeof(int32_t) * (size_t)S);
    int32_t *hoff = xmalloc(sizeof(int32_t) * (size_t)(2 * ne + 2)); /* offsets, then tile0 */
    int ok = kcuda_moe_sort(dids, S, ne, counts, offs, tile0, perm, inv, NULL, &err) == 0 &&
             kcuda_moe_gather_f16(dx, E, perm, S - 1, k, E, xs16, E, NULL, &err) == 0 &&
             kcuda_gemm_grouped(&gate.m, ne, F, xs16, offs, tile0, S - 1, g, F, NULL, &err) == 0 &&
             kcuda_gemm_grouped(&up.m, ne, F, xs16, offs, tile0, S - 1, u, F, NULL, &err) == 0 &&
             grouped_same_as_f16(&gate, ne, F, xs16, offs, tile0, S - 1, g, F, wscr, &err) &&
             kcuda_swiglu_f16(g, u, (S - 1) * F, xs16, NULL, &err) == 0 &&
             kcuda_gemm_grouped(&down.m, ne, E, xs16, offs, tile0, S - 1, dd, E, NULL, &err) == 0 &&
             grouped_same_as_f16(&down, ne, E, xs16, offs, tile0, S - 1, dd, E, wscr, &err) &&
             kcuda_moe_combine(dd, E, inv, dw, n, k, E, dy, E, 1, NULL, &err) == 0 &&
             d_fetch(y, dy, sizeof(float) * (size_t)(n * E), &err) == 0 &&
             d_fetch(hperm, perm, sizeof(int32_t) * (size_t)S, &err) == 0 &&
             d_fetch(hinv, inv, sizeof(int32_t) * (size_t)S, &err) == 0 &&
             d_fetch(hoff, offs, sizeof(int32_t) * (size_t)(2 * ne + 2), &err) == 0;
    if (ok) {
        /* the starts and tile starts of each expert, against a count here */
        int32_t o = 0, t = 0;
        for (int64_t e = 0; e <= ne && ok; e++) {
            if (hoff[e] != o || hoff[ne + 1 + e] != t) {
                printf("#   expert %lld starts at %d, tile %d; want %d, %d\n", (long long)e, hoff[e],
                       hoff[ne + 1 + e], o, t);
                ok = 0;
            }
            int32_t c = 0;
            for (int64_t s = 0; e < ne && s < S; s++)
                c += ids[s] == e;
            o += c;
            t += (c + KCUDA_GG_ROWS - 1) / KCUDA_GG_ROWS;
        }
    }
    if (ok) {
        /* the permutation: stable by expert, inv its inverse, the bad id dropped */
        int sorted = hinv[S - 1] == -1;
        for (int64_t p = 0; p < S - 1; p++)
            sorted &= hperm[p] >= 0 && hperm[p] < S - 1 && hinv[hperm[p]] == p;
        for (int64_t p = 0; sorted && p + 1 < S - 1; p++)
            sorted &= ids[hperm[p]] < ids[hperm[p + 1]] ||
                      (ids[hperm[p]] == ids[hperm[p + 1]] && hperm[p] < hperm[p + 1]);
        if (!sorted)
            printf("#   the permutation is not a stable sort by expert\n");
        ok = sorted && check_expert_stages(&gate, &up, &down, x, x0, ids, wts, hinv, g, u, xs16, y, ne, E, F, n, k);
    } else {
        printf("#   %s\n", err.msg);
    }
    tap_ok(ok, "experts %s/%s: %lld rows, top %d of %lld, E %lld, F %lld (sorted, tiles of %d or by rows if 0, combined)",
           bl_type_info(type_up)->name, bl_type_info(type_down)->name, (long long)n, k, (long long)ne, (long long)E,
           (long long)F, kcuda_gemm_set_grouped_rows(-1) /* reads the setting */);
    void *bufs[] = {dx, dy, dids, dw, srt, xs16, wscr, g, u, dd};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        kcuda_free(bufs[i]);
    free(x), free(x0), free(ids), free(wts), free(y), free(hperm), free(hinv), free(hoff);
    free_w(&gate), free_w(&up), free_w(&down);
}

static void case_prefill(rng_t *r, int64_t n, int64_t pos0, int64_t n_head, int64_t n_kv, int64_t hd)
{
    bl_err_t err = {0};
    const int64_t len = pos0 + n, kvw = n_kv * hd, nq = n_head * hd;
    const size_t rb = (size_t)kvw * 2;
    const float scale = (float)(1.0 / sqrt((double)hd));
    float *kf = xmalloc(sizeof(float) * (size_t)(len * kvw)), *vf = xmalloc(sizeof(float) * (size_t)(len * kvw));
    rand_fill(r, kf, len * kvw, 1.0f);
    rand_fill(r, vf, len * kvw, 1.0f);
    uint8_t *kc = xmalloc(rb * (size_t)len), *vc = xmalloc(rb * (size_t)len);
    const kcpu_kv_view_t hv = {.k = kc, .v = vc, .type = BL_TYPE_F16, .row_bytes = rb};
    kcpu_kv_store(&hv, 0, kf, 0, len, kvw);
    kcpu_kv_store(&hv, 1, vf, 0, len, kvw);
    float *q = xmalloc(sizeof(float) * (size_t)(n * nq));
    rand_fill(r, q, n * nq, 2.0f);
    kcpu_ctx_t *c = NULL;
    const kcpu_limits_t lim = {.max_cols = hd, .max_batch = n, .max_ctx = len, .head_dim = hd};
    if (kcpu_ctx_create(&c, 1, KCPU_PRECISE, &lim, &err) < 0)
        bail("kcpu_ctx_create", &err);
    float *want = xmalloc(sizeof(float) * (size_t)(n * nq));
    kcpu_attention(c, &hv, q, want, n, pos0, n_head, n_kv, hd, scale);
    kcpu_ctx_destroy(c);
    /* a cache longer than the context, poisoned past it: nothing there may be read */
    const int64_t cap = len + 77;
    uint8_t *dk = d_poison(rb * (size_t)cap), *dv = d_poison(rb * (size_t)cap);
    float *dq = d_upload(q, sizeof(float) * (size_t)(n * nq));
    float *dout = d_poison(sizeof(float) * (size_t)(n * nq));
    float *got = xmalloc(sizeof(float) * (size_t)(n * nq));
    const kcuda_kv_view_t view = {.k = dk, .v = dv, .row_bytes = rb};
    int ok = kcuda_upload(dk, kc, rb * (size_t)len, NULL, &err) == 0 &&
             kcuda_upload(dv, vc, rb * (size_t)len, NULL, &err) == 0 &&
             kcuda_attention_prefill(&view, dq, dout, n, pos0, n_head, n_kv, hd, scale, NULL, &err) == 0 &&
             d_fetch(got, dout, sizeof(float) * (size_t)(n * nq), &err) == 0;
    if (ok) {
        double *ref = xmalloc(sizeof(double) * (size_t)(n * nq));
        for (int64_t i = 0; i < n * nq; i++)
            ref[i] = want[i];
        /* q and the probabilities are rounded to f16 (relative 2^-11 each): the
         * output, a weighted mean of values in [-1, 1], moves by a few 1e-3 at most */
        ok = check_close(got, nq, ref, n, nq, 4e-3, 4e-3);
        free(ref);
    } else {
        printf("#   %s\n", err.msg);
    }
    tap_ok(ok, "prefill attention: %lld rows at %lld, %lld heads over %lld KV heads x %lld", (long long)n,
           (long long)pos0, (long long)n_head, (long long)n_kv, (long long)hd);
    kcuda_free(dk), kcuda_free(dv), kcuda_free(dq), kcuda_free(dout);
    free(kf), free(vf), free(kc), free(vc), free(q), free(want), free(got);
}

static void case_refusals(void *blas)
{
    bl_err_t err = {0};
    const kcuda_mat_t k48 = {.data = (void *)16, .type = BL_TYPE_F16, .ncols = 48, .nrows = 256, .row_bytes = 96};
    tap_ok(kcuda_gemm_grouped(&k48, 4, 64, (void *)16, NULL, NULL, 1, (float *)16, 64, NULL, &err) == BL_EINVAL,
           "grouped gemm refuses k not a multiple of 32 (%s)", err.msg);
    const kcuda_mat_t k64 = {.data = (void *)16, .type = BL_TYPE_F16, .ncols = 64, .nrows = 250, .row_bytes = 128};
    tap_ok(kcuda_gemm_grouped(&k64, 4, 64, (void *)16, NULL, NULL, 1, (float *)16, 64, NULL, &err) == BL_EINVAL,
           "grouped gemm refuses a matrix of other than n_expert x rows_per_expert rows (%s)", err.msg);
    const kcuda_kv_view_t v = {.k = (void *)256, .v = (void *)256, .row_bytes = 512};
    tap_ok(kcuda_attention_prefill(&v, (float *)256, (float *)256, 4, 0, 4, 2, 256, 1.0f, NULL, &err) == BL_ENOTSUP,
           "prefill attention refuses head_dim 256 (%s)", err.msg);
    tap_ok(kcuda_moe_sort((int32_t *)16, 8, KCUDA_MOE_MAX_EXPERT + 1, NULL, NULL, NULL, NULL, NULL, NULL, &err) ==
               BL_EINVAL,
           "moe sort refuses %d experts (%s)", KCUDA_MOE_MAX_EXPERT + 1, err.msg);
    (void)blas;
}

int main(void)
{
    gpu_test_init("test_kcuda_gemm");
    rng_t r = rng_for(1);
    bl_err_t err = {0};
    void *blas = NULL;
    if (kcuda_blas_create(&blas, NULL, &err) < 0)
        bail("kcuda_blas_create", &err);
    for (size_t t = 0; t < sizeof k_types / sizeof k_types[0]; t++) {
        case_dequant(&r, k_types[t], 256, 1);
        case_dequant(&r, k_types[t], 768, 37);
    }
    for (size_t t = 0; t < sizeof k_types / sizeof k_types[0]; t++) {
        case_gemm(&r, blas, k_types[t], 256, 77, 1, 0, 77);
        case_gemm(&r, blas, k_types[t], 768, 301, 37, 1, 128); /* 3 pieces */
        if (!g_small)
            case_gemm(&r, blas, k_types[t], 2304, 1001, 130, 0, 1001);
    }
    case_dequant_groups(&r, BL_TYPE_Q4_K, 256, 24, 9);
    case_dequant_groups(&r, BL_TYPE_Q6_K, 512, 8, 16);
    /* mxfp4 at gpt-oss's row length (2880: 90 blocks of 17 bytes, unaligned rows) */
    case_dequant(&r, BL_TYPE_MXFP4, 2880, 7);
    case_gemm(&r, blas, BL_TYPE_MXFP4, 2880, 201, 19, 1, 64); /* 4 pieces */
    /* each tile size (0: by the rows an expert has): an expert's rows in one tile or several */
    const int tile_default = kcuda_gemm_set_grouped_rows(-1);
    static const int tile_rows[] = {64, 32, 16, 0};
    for (size_t i = 0; i < sizeof tile_rows / sizeof tile_rows[0]; i++) {
        (void)kcuda_gemm_set_grouped_rows(tile_rows[i]);
        case_experts(&r, BL_TYPE_Q4_K, BL_TYPE_Q6_K, 8, 256, 256, 37, 3);
        case_experts(&r, BL_TYPE_Q8_0, BL_TYPE_Q8_0, 5, 96, 160, 70, 2);
        case_experts(&r, BL_TYPE_F16, BL_TYPE_Q5_K, 16, 512, 256, 9, 8);
        case_experts(&r, BL_TYPE_MXFP4, BL_TYPE_MXFP4, 6, 96, 160, 40, 4);
        /* every other type the weights' tiles dequantize, and experts of 2-3 row tiles */
        case_experts(&r, BL_TYPE_BF16, BL_TYPE_F32, 3, 64, 96, 150, 2);
        case_experts(&r, BL_TYPE_Q5_K, BL_TYPE_Q4_K, 2, 256, 512, 90, 2);
    }
    (void)kcuda_gemm_set_grouped_rows(tile_default);
    if (!g_small) {
        case_experts(&r, BL_TYPE_Q4_K, BL_TYPE_Q6_K, 128, 512, 256, 200, 8);
        /* gpt-oss's expert shapes (E = F = 2880, top 4), 5 experts */
        case_experts(&r, BL_TYPE_MXFP4, BL_TYPE_MXFP4, 5, 2880, 2880, 7, 4);
    }
    const int64_t cases[][5] = {{1, 0, 4, 4, 64},    {37, 0, 8, 2, 128},  {64, 0, 32, 4, 128},
                                {130, 5, 8, 1, 64},  {65, 300, 16, 2, 128}, {200, 1013, 32, 4, 128},
                                {3, 4093, 12, 4, 64}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (!g_small || cases[i][0] + cases[i][1] < 400)
            case_prefill(&r, cases[i][0], cases[i][1], cases[i][2], cases[i][3], cases[i][4]);
    case_refusals(blas);
    kcuda_blas_destroy(blas);
    return tap_done();
}
