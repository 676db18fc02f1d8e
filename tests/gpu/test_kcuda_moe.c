/* GPU tests for the MoE kernels: routing (kernels/cuda/moe.cu against
 * kcpu_moe_route: the same ids, weights within f32 rounding) and the expert
 * products of kernels/cuda/matvec.cu (gate/up, gate/up with SwiGLU, down with the
 * weighted sum) against the dequantized experts dotted in double, including an
 * out-of-range id, which must contribute nothing. The block formats multiply
 * activations rounded to 8 bits per 32 (act_q8_round): their references use the
 * rounded rows (test_kcuda_matvec checks the distance to the exact product). TAP
 * output; the seed is printed. */
#include "gpu_test.h"

#include "kcpu.h"
#include "quant.h"

/* One routing form: the card's against kcpu_moe_route's (scores in double there):
 * the same ids, weights within f32 rounding. gating KCPU_GATE_*; bias: a selection
 * bias (exp_probs_b); lbias: a router bias added to the logits (the reference adds
 * it before routing, as the CPU model does); groups n_group/topk_group. */
typedef struct route_form {
    int gating, norm, n_group, topk_group, bias, lbias;
    float scale;
} route_form_t;

static void case_route_form(rng_t *r, int64_t n, int64_t n_expert, int k, route_form_t f)
{
    bl_err_t err = {0};
    float *lg = xmalloc(sizeof(float) * (size_t)(n * n_expert)), *lg2 = xmalloc(sizeof(float) * (size_t)(n * n_expert));
    float *pb = xmalloc(sizeof(float) * (size_t)n_expert), *lb = xmalloc(sizeof(float) * (size_t)n_expert);
    rand_fill(r, lg, n * n_expert, 4.0f);
    rand_fill(r, pb, n_expert, 0.5f);
    rand_fill(r, lb, n_expert, 1.0f);
    for (int64_t i = 0; i < n * n_expert; i++)
        lg2[i] = f.lbias ? lg[i] + lb[i % n_expert] : lg[i];
    int32_t *ids_ref = xmalloc(sizeof(int32_t) * (size_t)(n * k)), *ids = xmalloc(sizeof(int32_t) * (size_t)(n * k));
    float *w_ref = xmalloc(sizeof(float) * (size_t)(n * k)), *w = xmalloc(sizeof(float) * (size_t)(n * k));
    const kcpu_route_t rt = {.n_expert = n_expert, .k = k, .n_group = f.n_group, .topk_group = f.topk_group,
                             .gating = f.gating, .norm = f.norm, .scale = f.scale, .bias = f.bias ? pb : NULL};
    kcpu_moe_route(NULL, lg2, n, &rt, ids_ref, w_ref);
    float *dl = d_upload(lg, sizeof(float) * (size_t)(n * n_expert));
    float *dpb = d_upload(pb, sizeof(float) * (size_t)n_expert), *dlb = d_upload(lb, sizeof(float) * (size_t)n_expert);
    int32_t *di = d_poison(sizeof(int32_t) * (size_t)(n * k));
    float *dw = d_poison(sizeof(float) * (size_t)(n * k));
    const kcuda_route_t cr = {.gating = f.gating, .norm = f.norm, .scale = f.scale, .n_group = f.n_group,
                              .topk_group = f.topk_group, .d_bias = f.bias ? dpb : NULL,
                              .d_logit_bias = f.lbias ? dlb : NULL};
    int ok = kcuda_moe_route(dl, n, n_expert, k, &cr, di, dw, NULL, &err) == 0 &&
             d_fetch(ids, di, sizeof(int32_t) * (size_t)(n * k), &err) == 0 &&
             d_fetch(w, dw, sizeof(float) * (size_t)(n * k), &err) == 0;
    if (!ok) {
        printf("#   %s\n", err.msg);
    } else {
        int shown = 0;
        for (int64_t i = 0; i < n * k; i++)
            if (ids[i] != ids_ref[i]) {
                if (shown++ < 5)
                    printf("#   ids[%lld][%lld]: got %d, want %d\n", (long long)(i / k), (long long)(i % k),
                           ids[i], ids_ref[i]);
                ok = 0;
            }
        double *ref = xmalloc(sizeof(double) * (size_t)(n * k));
        for (int64_t i = 0; i < n * k; i++)
            ref[i] = w_ref[i];
        ok &= check_close(w, k, ref, n, k, 1e-7, 2e-5);
        free(ref);
    }
    static const char *const gname[] = {"?", "softmax", "sigmoid", "softmax of the chosen"};
    tap_ok(ok, "moe_route: %lld rows, top %d of %lld, %s%s%s%s, groups %d/%d, scale %g", (long long)n, k,
           (long long)n_expert, gname[f.gating & 3], f.norm ? ", renormalised" : "", f.bias ? ", choice bias" : "",
           f.lbias ? ", router bias" : "", f.topk_group, f.n_group, (double)f.scale);
    kcuda_free(dl);
    kcuda_free(dpb);
    kcuda_free(dlb);
    kcuda_free(di);
    kcuda_free(dw);
    free(lg);
    free(lg2);
    free(pb);
    free(lb);
    free(ids_ref);
    free(ids);
    free(w_ref);
    free(w);
}

static void case_route(rng_t *r, int64_t n, int64_t n_expert, int k, int norm)
{
    case_route_form(r, n, n_expert, k, (route_form_t){.gating = KCPU_GATE_SOFTMAX, .norm = norm, .scale = 1.0f});
}

/* gpt-oss's expert biases and clamped SwiGLU between the expert products
 * (kcuda_experts_act, in place and into f16 through a permutation) and the down
 * biases weighted into the rows (kcuda_experts_bias_down, with a mask), against the
 * CPU's kcpu_swiglu_oai / kcpu_swiglu on the biased products. Ids include -1 and
 * n_expert (no bias). */
static void case_experts_act(rng_t *r, int64_t slots, int64_t F, int64_t ne, int act)
{
    bl_err_t err = {0};
    const int64_t ld = F + 3, k = 4, n = slots / k, E = 40;
    float *g = xmalloc(sizeof(float) * (size_t)(slots * ld)), *u = xmalloc(sizeof(float) * (size_t)(slots * ld));
    float *gb = xmalloc(sizeof(float) * (size_t)(ne * F)), *ub = xmalloc(sizeof(float) * (size_t)(ne * F));
    float *db = xmalloc(sizeof(float) * (size_t)(ne * E)), *w = xmalloc(sizeof(float) * (size_t)slots);
    int32_t *ids = xmalloc(sizeof(int32_t) * (size_t)slots), *perm = xmalloc(sizeof(int32_t) * (size_t)slots);
    int32_t *mask = xmalloc(sizeof(int32_t) * (size_t)slots);
    rand_fill(r, g, slots * ld, 9.0f);
    rand_fill(r, u, slots * ld, 9.0f);
    rand_fill(r, gb, ne * F, 2.0f);
    rand_fill(r, ub, ne * F, 2.0f);
    rand_fill(r, db, ne * E, 2.0f);
    rand_fill(r, w, slots, 1.0f);
    for (int64_t s = 0; s < slots; s++) {
        ids[s] = (int32_t)(rng_next(r) % (uint64_t)(ne + 2)) - 1; /* -1 .. ne */
        perm[s] = (int32_t)(slots - 1 - s);
        mask[s] = rng_next(r) % 4 == 0 ? -1 : 0;
    }
    /* references: in place (slot s's own id) and permuted (slot s takes id perm[s]) */
    float *gv = xmalloc(sizeof(float) * (size_t)(slots * F)), *uv = xmalloc(sizeof(float) * (size_t)(slots * F));
    float *want = xmalloc(sizeof(float) * (size_t)(slots * F)), *wantp = xmalloc(sizeof(float) * (size_t)(slots * F));
    for (int pass = 0; pass < 2; pass++) {
        for (int64_t s = 0; s < slots; s++) {
            const int32_t e = ids[pass ? perm[s] : s];
            for (int64_t f = 0; f < F; f++) {
                const int ok = e >= 0 && e < ne;
                gv[s * F + f] = g[s * ld + f] + (ok ? gb[e * F + f] : 0.0f);
                uv[s * F + f] = u[s * ld + f] + (ok ? ub[e * F + f] : 0.0f);
            }
        }
        if (act == KCPU_ACT_SWIGLU_OAI)
            kcpu_swiglu_oai(NULL, pass ? wantp : want, gv, uv, slots * F);
        else
            kcpu_swiglu(NULL, pass ? wantp : want, gv, uv, slots * F);
    }
    float *dg = d_upload(g, sizeof(float) * (size_t)(slots * ld)), *du = d_upload(u, sizeof(float) * (size_t)(slots * ld));
    float *dgb = d_upload(gb, sizeof(float) * (size_t)(ne * F)), *dub = d_upload(ub, sizeof(float) * (size_t)(ne * F));
    int32_t *di = d_upload(ids, sizeof(int32_t) * (size_t)slots), *dp = d_upload(perm, sizeof(int32_t) * (size_t)slots);
    uint16_t *h16 = xmalloc(sizeof(uint16_t) * (size_t)(slots * F));
    void *dh = d_poison(sizeof(uint16_t) * (size_t)(slots * F));
    float *got = xmalloc(sizeof(float) * (size_t)(slots * ld));
    int ok = kcuda_experts_act(dg, du, ld, di, dp, dgb, dub, slots, F, ne, act, dh, NULL, &err) == 0 &&
             kcuda_experts_act(dg, du, ld, di, NULL, dgb, dub, slots, F, ne, act, NULL, NULL, &err) == 0 &&
             d_fetch(got, dg, sizeof(float) * (size_t)(slots * ld), &err) == 0 &&
             d_fetch(h16, dh, sizeof(uint16_t) * (size_t)(slots * F), &err) == 0;
    if (!ok) {
        printf("#   %s\n", err.msg);
    } else {
        double *ref = xmalloc(sizeof(double) * (size_t)(slots * F));
        float *g2 = xmalloc(sizeof(float) * (size_t)(slots * F));
        for (int64_t s = 0; s < slots; s++)
            for (int64_t f = 0; f < F; f++) {
                ref[s * F + f] = want[s * F + f];
                g2[s * F + f] = got[s * ld + f];
            }
        ok = check_close(g2, F, ref, slots, F, 1e-6, 2e-6);
        for (int64_t i = 0; i < slots * F; i++) {
            ref[i] = wantp[i];
            g2[i] = bl_fp16_to_fp32(h16[i]);
        }
        ok &= check_close(g2, F, ref, slots, F, 1e-6, 1e-3); /* f16's rounding */
        free(ref);
        free(g2);
    }
    tap_ok(ok, "experts_act %s: %lld slots of %lld, biases of %lld experts, in place and permuted into f16",
           act == KCPU_ACT_SWIGLU_OAI ? "clamped swiglu" : "swiglu", (long long)slots, (long long)F, (long long)ne);

    /* down biases: x (n, E) += sum_j w * down_b[id] where the mask allows */
    float *x = xmalloc(sizeof(float) * (size_t)(n * E)), *xw = xmalloc(sizeof(float) * (size_t)(n * E));
    rand_fill(r, x, n * E, 1.0f);
    for (int64_t b = 0; b < n; b++)
        for (int64_t d = 0; d < E; d++) {
            float a = 0.0f;
            for (int64_t j = 0; j < k; j++) {
                const int32_t e = ids[b * k + j];
                if (e >= 0 && e < ne && mask[b * k + j] >= 0)
                    a += w[b * k + j] * db[e * E + d];
            }
            xw[b * E + d] = x[b * E + d] + a;
        }
    float *dx = d_upload(x, sizeof(float) * (size_t)(n * E)), *ddb = d_upload(db, sizeof(float) * (size_t)(ne * E));
    float *dw = d_upload(w, sizeof(float) * (size_t)slots);
    int32_t *dm = d_upload(mask, sizeof(int32_t) * (size_t)slots);
    ok = kcuda_experts_bias_down(dx, E, di, dm, dw, ddb, n, (int)k, E, ne, NULL, &err) == 0 &&
         d_fetch(x, dx, sizeof(float) * (size_t)(n * E), &err) == 0;
    if (!ok) {
        printf("#   %s\n", err.msg);
    } else {
        double *ref = xmalloc(sizeof(double) * (size_t)(n * E));
        for (int64_t i = 0; i < n * E; i++)
            ref[i] = xw[i];
        ok = check_close(x, E, ref, n, E, 1e-6, 1e-5); /* the same sums in order (the card may fuse a multiply-add) */
        free(ref);
    }
    tap_ok(ok, "experts_bias_down: %lld rows, top %lld, a mask", (long long)n, (long long)k);
    kcuda_free(dg); kcuda_free(du); kcuda_free(dgb); kcuda_free(dub); kcuda_free(di); kcuda_free(dp); kcuda_free(dh);
    kcuda_free(dx); kcuda_free(ddb); kcuda_free(dw); kcuda_free(dm);
    free(g); free(u); free(gb); free(ub); free(db); free(w); free(ids); free(perm); free(mask); free(gv); free(uv);
    free(want); free(wantp); free(h16); free(got); free(x); free(xw);
}

/* Residency's slot ids straight after the routing that writes the ids, on a stream
 * (where launches overlap through programmatic dependent launch): each choice's slot
 * from a random table with about half the experts seated, -1 for the rest and for
 * ids out of range. */
static void case_remap(rng_t *r, int64_t n, int64_t n_expert, int k)
{
    bl_err_t err = {0};
    void *st = NULL;
    if (kcuda_stream_create(&st, &err) < 0)
        bail("stream", &err);
    float *lg = xmalloc(sizeof(float) * (size_t)(n * n_expert));
    rand_fill(r, lg, n * n_expert, 4.0f);
    int32_t *ids = xmalloc(sizeof(int32_t) * (size_t)(n * k)), *tab = xmalloc(sizeof(int32_t) * (size_t)n_expert);
    int32_t *got = xmalloc(sizeof(int32_t) * (size_t)(n * k));
    float *w = xmalloc(sizeof(float) * (size_t)(n * k));
    const kcpu_route_t rt = {.n_expert = n_expert, .k = k, .gating = KCPU_GATE_SOFTMAX, .norm = 1, .scale = 1.0f};
    kcpu_moe_route(NULL, lg, n, &rt, ids, w);
    for (int64_t e = 0, slot = 0; e < n_expert; e++)
        tab[e] = rng_next(r) & 1 ? (int32_t)slot++ : -1;
    float *dl = d_upload(lg, sizeof(float) * (size_t)(n * n_expert));
    int32_t *dt = d_upload(tab, sizeof(int32_t) * (size_t)n_expert);
    int32_t *di = d_poison(sizeof(int32_t) * (size_t)(n * k)), *ds = d_poison(sizeof(int32_t) * (size_t)(n * k));
    float *dw = d_poison(sizeof(float) * (size_t)(n * k));
    const kcuda_route_t cr = {.gating = KCUDA_GATE_SOFTMAX, .norm = 1, .scale = 1.0f};
    int ok = kcuda_moe_route(dl, n, n_expert, k, &cr, di, dw, st, &err) == 0 &&
             kcuda_moe_remap(di, n * k, dt, n_expert, ds, st, &err) == 0 && kcuda_sync(st, &err) == 0 &&
             d_fetch(got, ds, sizeof(int32_t) * (size_t)(n * k), &err) == 0;
    if (!ok)
        printf("#   %s\n", err.msg);
    int shown = 0;
    for (int64_t i = 0; ok && i < n * k; i++)
        if (got[i] != tab[ids[i]]) {
            if (shown++ < 5)
                printf("#   slot of choice %lld (expert %d): got %d, want %d\n", (long long)i, ids[i], got[i],
                       tab[ids[i]]);
            ok = 0;
        }
    /* out-of-range ids give -1 */
    const int32_t bad[3] = {-1, (int32_t)n_expert, 1 << 30};
    int32_t *db = d_upload(bad, sizeof bad), bout[3] = {0, 0, 0};
    ok &= kcuda_moe_remap(db, 3, dt, n_expert, ds, NULL, &err) == 0 && d_fetch(bout, ds, sizeof bout, &err) == 0 &&
          bout[0] == -1 && bout[1] == -1 && bout[2] == -1;
    ok &= kcuda_moe_remap(db, 0, dt, n_expert, ds, NULL, &err) == BL_EINVAL;
    tap_ok(ok, "moe_remap after moe_route on a stream: %lld rows, top %d of %lld, the table's slots", (long long)n,
           k, (long long)n_expert);
    kcuda_free(dl);
    kcuda_free(dt);
    kcuda_free(di);
    kcuda_free(ds);
    kcuda_free(dw);
    kcuda_free(db);
    kcuda_stream_destroy(st);
    free(lg);
    free(ids);
    free(tab);
    free(got);
    free(w);
}

typedef struct emat {
    uint32_t type;
    int64_t ncols, rows; /* rows = n_expert * rows per expert */
    void *d;
    float *deq;
} emat_t;

static void make_emat(rng_t *r, emat_t *w, uint32_t type, int64_t ncols, int64_t rows)
{
    bl_err_t err = {0};
    size_t rb;
    if (bl_row_bytes(type, ncols, &rb, &err) < 0)
        bail("bl_row_bytes", &err);
    w->type = type;
    w->ncols = ncols;
    w->rows = rows;
    uint8_t *q = xmalloc(rb * (size_t)rows);
    w->deq = xmalloc(sizeof(float) * (size_t)(rows * ncols));
    float *src = xmalloc(sizeof(float) * (size_t)ncols);
    for (int64_t i = 0; i < rows; i++) {
        rand_fill(r, src, ncols, 1.0f);
        if (bl_quantize_row_ref(type, src, q + rb * (size_t)i, ncols) != 0 ||
            bl_dequantize_row_ref(type, q + rb * (size_t)i, w->deq + i * ncols, ncols) != 0)
            bail("reference quantizer", NULL);
    }
    w->d = d_upload(q, rb * (size_t)rows);
    free(q);
    free(src);
}

static kcuda_mat_t ekmat(const emat_t *w)
{
    kcuda_mat_t m;
    bl_err_t err = {0};
    if (kcuda_mat_init(&m, w->d, w->type, w->ncols, w->rows, &err) < 0)
        bail("kcuda_mat_init", &err);
    return m;
}

static double dot_d(const float *a, const float *b, int64_t n)
{
    double s = 0.0;
    for (int64_t i = 0; i < n; i++)
        s += (double)a[i] * (double)b[i];
    return s;
}

/* An MoE FFN's expert products for n rows choosing k of ne experts, E = n_embd,
 * F = the expert's FFN width: gate/up alone, gate/up with SwiGLU, then down with
 * the weighted sum (accumulating onto random values). Slot (n-1, k-1) names an
 * expert past the end. */
static void case_experts(rng_t *r, uint32_t type_up, uint32_t type_down, int64_t ne, int64_t E,
                         int64_t F, int n, int k)
{
    bl_err_t err = {0};
    emat_t gate, up, down;
    make_emat(r, &gate, type_up, E, ne * F);
    make_emat(r, &up, type_up, E, ne * F);
    make_emat(r, &down, type_down, F, ne * E);
    const int S = n * k;
    const int64_t ldx = E + 4, ldh = F + 8, ldy = E + 4;
    float *x = xmalloc(sizeof(float) * (size_t)(n * ldx));
    rand_fill(r, x, n * ldx, 1.0f);
    int32_t *ids = xmalloc(sizeof(int32_t) * (size_t)S);
    float *wts = xmalloc(sizeof(float) * (size_t)S);
    for (int b = 0; b < n; b++)
        for (int j = 0; j < k; j++) {
            /* distinct experts per row, as routing gives */
            int32_t e;
            int dup;
            do {
                e = (int32_t)(rng_next(r) % (uint64_t)ne);
                dup = 0;
                for (int i = 0; i < j; i++)
                    dup |= ids[b * k + i] == e;
            } while (dup && k <= ne);
            ids[b * k + j] = e;
            wts[b * k + j] = rng_f(r, 0.0f, 1.0f);
        }
    ids[S - 1] = (int32_t)ne; /* out of range */

    /* references: the block formats multiply activations rounded as act_q8_round
     * (gpu_test.h) rounds them, so their references use the rounded rows */
    float *xr_all = xmalloc(sizeof(float) * (size_t)(n * ldx));
    memcpy(xr_all, x, sizeof(float) * (size_t)(n * ldx));
    if (act_rounded(type_up))
        for (int b = 0; b < n; b++)
            act_q8_round(x + b * ldx, xr_all + b * ldx, NULL, E);
    double *rg = xmalloc(sizeof(double) * (size_t)(S * F)), *rsw = xmalloc(sizeof(double) * (size_t)(S * F));
    float *hf = xmalloc(sizeof(float) * (size_t)(S * ldh)); /* the SwiGLU rows down reads */
    rand_fill(r, hf, S * ldh, 1.0f);
    for (int s = 0; s < S; s++)
        for (int64_t i = 0; i < F; i++) {
            if (ids[s] >= ne) {
                rg[s * F + i] = rsw[s * F + i] = 0.0;
                continue;
            }
            const float *xr = xr_all + (s / k) * ldx;
            const double g = dot_d(gate.deq + (ids[s] * F + i) * E, xr, E);
            const double u = dot_d(up.deq + (ids[s] * F + i) * E, xr, E);
            rg[s * F + i] = g;
            rsw[s * F + i] = g / (1.0 + exp(-g)) * u;
        }
    float *hr = xmalloc(sizeof(float) * (size_t)(S * ldh));
    memcpy(hr, hf, sizeof(float) * (size_t)(S * ldh));
    if (act_rounded(type_down))
        for (int s = 0; s < S; s++)
            act_q8_round(hf + s * ldh, hr + s * ldh, NULL, F);
    float *y0 = xmalloc(sizeof(float) * (size_t)(n * ldy));
    rand_fill(r, y0, n * ldy, 1.0f);
    double *rd = xmalloc(sizeof(double) * (size_t)(n * E));
    for (int b = 0; b < n; b++)
        for (int64_t i = 0; i < E; i++) {
            double a = y0[b * ldy + i];
            for (int j = 0; j < k; j++) {
                const int s = b * k + j;
                if (ids[s] < ne)
                    a += (double)wts[s] * dot_d(down.deq + (ids[s] * E + i) * F, hr + s * ldh, F);
            }
            rd[b * E + i] = a;
        }

    float *dx = d_upload(x, sizeof(float) * (size_t)(n * ldx));
    int32_t *dids = d_upload(ids, sizeof(int32_t) * (size_t)S);
    float *dwts = d_upload(wts, sizeof(float) * (size_t)S);
    float *dh = d_upload(hf, sizeof(float) * (size_t)(S * ldh));
    float *dg = d_poison(sizeof(float) * (size_t)(S * ldh));
    float *dsw = d_poison(sizeof(float) * (size_t)(S * ldh));
    float *dy = d_upload(y0, sizeof(float) * (size_t)(n * ldy));
    float *hg = xmalloc(sizeof(float) * (size_t)(S * ldh)), *y = xmalloc(sizeof(float) * (size_t)(n * ldy));
    const kcuda_mat_t mg = ekmat(&gate), mu = ekmat(&up), md = ekmat(&down);
    const char *tu = bl_type_info(type_up)->name, *td = bl_type_info(type_down)->name;
    const double atol_up = 1e-4 + 2e-6 * (double)E, atol_down = 1e-4 + 2e-6 * (double)F * k;

    int ok = kcuda_matvec_experts(&mg, ne, dids, n, k, dx, ldx, dg, ldh, NULL, &err) == 0 &&
             d_fetch(hg, dg, sizeof(float) * (size_t)(S * ldh), &err) == 0;
    if (!ok)
        printf("#   %s\n", err.msg);
    else
        ok = check_close(hg, ldh, rg, S, F, atol_up, 1e-4);
    tap_ok(ok, "matvec_experts %s: %d rows x top %d of %lld experts, %lld x %lld", tu, n, k, (long long)ne,
           (long long)F, (long long)E);

    ok = kcuda_matvec_experts_swiglu(&mg, &mu, ne, dids, n, k, dx, ldx, dsw, ldh, NULL, &err) == 0 &&
         d_fetch(hg, dsw, sizeof(float) * (size_t)(S * ldh), &err) == 0;
    if (!ok)
        printf("#   %s\n", err.msg);
    else
        ok = check_close(hg, ldh, rsw, S, F, 2 * atol_up, 1e-4);
    tap_ok(ok, "matvec_experts_swiglu %s: %d rows x top %d of %lld experts, %lld x %lld", tu, n, k,
           (long long)ne, (long long)F, (long long)E);

    ok = kcuda_matvec_experts_down(&md, ne, dids, dwts, n, k, dh, ldh, dy, ldy, 1, NULL, &err) == 0 &&
         d_fetch(y, dy, sizeof(float) * (size_t)(n * ldy), &err) == 0;
    if (!ok)
        printf("#   %s\n", err.msg);
    else
        ok = check_close(y, ldy, rd, n, E, atol_down, 1e-4);
    tap_ok(ok, "matvec_experts_down %s: %d rows x top %d of %lld experts, %lld x %lld, weighted, accumulate",
           td, n, k, (long long)ne, (long long)E, (long long)F);

    /* the grouped form (tensor cores from 2 rows of q4_K or q6_K; otherwise the
     * call above), onto the same random start */
    float *dscr = d_poison(sizeof(float) * (size_t)(S * ldy));
    ok = kcuda_upload(dy, y0, sizeof(float) * (size_t)(n * ldy), NULL, &err) == 0 &&
         kcuda_matvec_experts_down_grouped(&md, ne, dids, dwts, n, k, dh, ldh, NULL, dscr, ldy, dy, ldy, 1, NULL,
                                           &err) ==
             0 &&
         d_fetch(y, dy, sizeof(float) * (size_t)(n * ldy), &err) == 0;
    if (!ok)
        printf("#   %s\n", err.msg);
    else
        ok = check_close(y, ldy, rd, n, E, atol_down, 1e-4);
    tap_ok(ok, "matvec_experts_down_grouped %s: %d rows x top %d of %lld experts (%s), weighted, accumulate", td, n,
           k, (long long)ne, kcuda_experts_grouped_ok(&md, n, k, ne) ? "grouped, tensor cores" : "the streaming kernel");
    kcuda_free(dscr);

    kcuda_free(dx); kcuda_free(dids); kcuda_free(dwts); kcuda_free(dh);
    kcuda_free(dg); kcuda_free(dsw); kcuda_free(dy);
    kcuda_free(gate.d); kcuda_free(up.d); kcuda_free(down.d);
    free(gate.deq); free(up.deq); free(down.deq);
    free(x); free(ids); free(wts); free(rg); free(rsw); free(hf); free(y0); free(rd); free(hg); free(y);
    free(xr_all); free(hr);
}

/* The fused extras against the launches they replace: gate/up with the experts'
 * biases and the activation in one launch (kcuda_matvec_experts_swiglu_ext) against
 * kcuda_matvec_experts twice and kcuda_experts_act, and down with its biases
 * (kcuda_matvec_experts_down_bias) against kcuda_matvec_experts_down and
 * kcuda_experts_bias_down, on n rows of k choices (ids include -1 and n_expert). */
static void case_experts_ext(rng_t *r, uint32_t type, int64_t ne, int64_t E, int64_t F, int n, int k, int act)
{
    bl_err_t err = {0};
    emat_t gate, up, down;
    make_emat(r, &gate, type, E, ne * F);
    make_emat(r, &up, type, E, ne * F);
    make_emat(r, &down, type, F, ne * E);
    const int S = n * k;
    const int64_t ldx = E + 4, ldh = F + 8, ldy = E + 2;
    float *x = xmalloc(sizeof(float) * (size_t)(n * ldx)), *wts = xmalloc(sizeof(float) * (size_t)S);
    float *gb = xmalloc(sizeof(float) * (size_t)(ne * F)), *ub = xmalloc(sizeof(float) * (size_t)(ne * F));
    float *db = xmalloc(sizeof(float) * (size_t)(ne * E)), *y0 = xmalloc(sizeof(float) * (size_t)(n * ldy));
    int32_t *ids = xmalloc(sizeof(int32_t) * (size_t)S);
    rand_fill(r, x, n * ldx, 1.0f);
    rand_fill(r, wts, S, 1.0f);
    rand_fill(r, gb, ne * F, 2.0f);
    rand_fill(r, ub, ne * F, 2.0f);
    rand_fill(r, db, ne * E, 2.0f);
    rand_fill(r, y0, n * ldy, 1.0f);
    for (int s = 0; s < S; s++)
        ids[s] = (int32_t)(rng_next(r) % (uint64_t)(ne + 2)) - 1; /* -1 .. ne */
    float *dx = d_upload(x, sizeof(float) * (size_t)(n * ldx)), *dw = d_upload(wts, sizeof(float) * (size_t)S);
    float *dgb = d_upload(gb, sizeof(float) * (size_t)(ne * F)), *dub = d_upload(ub, sizeof(float) * (size_t)(ne * F));
    float *ddb = d_upload(db, sizeof(float) * (size_t)(ne * E));
    int32_t *di = d_upload(ids, sizeof(int32_t) * (size_t)S);
    float *dg = d_poison(sizeof(float) * (size_t)(S * ldh)), *du = d_poison(sizeof(float) * (size_t)(S * ldh));
    float *dh = d_poison(sizeof(float) * (size_t)(S * ldh));
    float *dy[2] = {d_upload(y0, sizeof(float) * (size_t)(n * ldy)), d_upload(y0, sizeof(float) * (size_t)(n * ldy))};
    const kcuda_mat_t mg = ekmat(&gate), mu = ekmat(&up), md = ekmat(&down);
    const kcuda_experts_ext_t ext = {.gate_b = dgb, .up_b = dub, .act = act};
    /* the separate launches, then the fused ones into dh and dy[1]; the streaming
     * kernel for both (the tensor-core products take no biases, and their bits
     * differ from the streaming kernel's) */
    const int mma = kcuda_matvec_set_mma(0);
    int ok = kcuda_matvec_experts(&mg, ne, di, n, k, dx, ldx, dg, ldh, NULL, &err) == 0 &&
             kcuda_matvec_experts(&mu, ne, di, n, k, dx, ldx, du, ldh, NULL, &err) == 0 &&
             kcuda_experts_act(dg, du, ldh, di, NULL, dgb, dub, S, F, ne, act, NULL, NULL, &err) == 0 &&
             kcuda_matvec_experts_down(&md, ne, di, dw, n, k, dg, ldh, dy[0], ldy, 1, NULL, &err) == 0 &&
             kcuda_experts_bias_down(dy[0], ldy, di, NULL, dw, ddb, n, k, E, ne, NULL, &err) == 0 &&
             kcuda_matvec_experts_swiglu_ext(&mg, &mu, ne, di, n, k, dx, ldx, dh, ldh, &ext, NULL, &err) == 0 &&
             kcuda_matvec_experts_down_bias(&md, ne, di, dw, n, k, dh, ldh, ddb, dy[1], ldy, 1, NULL, &err) == 0;
    kcuda_matvec_set_mma(mma);
    float *h0 = xmalloc(sizeof(float) * (size_t)(S * ldh)), *h1 = xmalloc(sizeof(float) * (size_t)(S * ldh));
    float *y[2] = {xmalloc(sizeof(float) * (size_t)(n * ldy)), xmalloc(sizeof(float) * (size_t)(n * ldy))};
    ok = ok && d_fetch(h0, dg, sizeof(float) * (size_t)(S * ldh), &err) == 0 &&
         d_fetch(h1, dh, sizeof(float) * (size_t)(S * ldh), &err) == 0 &&
         d_fetch(y[0], dy[0], sizeof(float) * (size_t)(n * ldy), &err) == 0 &&
         d_fetch(y[1], dy[1], sizeof(float) * (size_t)(n * ldy), &err) == 0;
    int ok_h = 0, ok_y = 0;
    if (!ok) {
        printf("#   %s\n", err.msg);
    } else {
        double *ref = xmalloc(sizeof(double) * (size_t)(S * F > n * E ? S * F : n * E));
        for (int s = 0; s < S; s++)
            for (int64_t f = 0; f < F; f++)
                ref[s * F + f] = h0[s * ldh + f];
        ok_h = check_close(h1, ldh, ref, S, F, 1e-5, 1e-5);
        for (int b = 0; b < n; b++)
            for (int64_t d = 0; d < E; d++)
                ref[b * E + d] = y[0][b * ldy + d];
        ok_y = check_close(y[1], ldy, ref, n, E, 1e-4, 1e-5);
        free(ref);
    }
    const char *tn = bl_type_info(type)->name, *an = act == KCUDA_ACT_SWIGLU_OAI ? "clamped swiglu" : "swiglu";
    tap_ok(ok && ok_h, "matvec_experts_swiglu_ext %s, biases, %s: %d rows x top %d of %lld experts, %lld x %lld = "
           "the three launches", tn, an, n, k, (long long)ne, (long long)F, (long long)E);
    tap_ok(ok && ok_y, "matvec_experts_down_bias %s: %d rows x top %d of %lld experts, %lld x %lld = down, then "
           "experts_bias_down", tn, n, k, (long long)ne, (long long)E, (long long)F);
    kcuda_free(dx); kcuda_free(dw); kcuda_free(dgb); kcuda_free(dub); kcuda_free(ddb); kcuda_free(di);
    kcuda_free(dg); kcuda_free(du); kcuda_free(dh); kcuda_free(dy[0]); kcuda_free(dy[1]);
    kcuda_free(gate.d); kcuda_free(up.d); kcuda_free(down.d);
    free(gate.deq); free(up.deq); free(down.deq);
    free(x); free(wts); free(gb); free(ub); free(db); free(y0); free(ids); free(h0); free(h1); free(y[0]); free(y[1]);
}

/* The routed gate/up (kcuda_matvec_experts_swiglu_route) against kcuda_moe_route
 * then kcuda_matvec_experts_swiglu, both checked above: the same ids, weights and
 * outputs, bit for bit, for n rows of random logits. Past 128 experts it takes the
 * two-launch path; the comparison is the same. */
static void case_routed(rng_t *r, uint32_t type, int64_t ne, int64_t E, int64_t F, int n, int k, int norm)
{
    bl_err_t err = {0};
    emat_t gate, up;
    make_emat(r, &gate, type, E, ne * F);
    make_emat(r, &up, type, E, ne * F);
    const int S = n * k;
    const int64_t ldx = E + 4, ldh = F + 8;
    float *x = xmalloc(sizeof(float) * (size_t)(n * ldx)), *lg = xmalloc(sizeof(float) * (size_t)(n * ne));
    rand_fill(r, x, n * ldx, 1.0f);
    rand_fill(r, lg, n * ne, 4.0f);
    float *dx = d_upload(x, sizeof(float) * (size_t)(n * ldx)), *dl = d_upload(lg, sizeof(float) * (size_t)(n * ne));
    int32_t *di[2] = {d_poison(sizeof(int32_t) * (size_t)S), d_poison(sizeof(int32_t) * (size_t)S)};
    float *dw[2] = {d_poison(sizeof(float) * (size_t)S), d_poison(sizeof(float) * (size_t)S)};
    float *dy[2] = {d_poison(sizeof(float) * (size_t)(S * ldh)), d_poison(sizeof(float) * (size_t)(S * ldh))};
    const kcuda_mat_t mg = ekmat(&gate), mu = ekmat(&up);
    const kcuda_route_t cr = {.gating = KCUDA_GATE_SOFTMAX, .norm = norm, .scale = 1.0f};
    int ok = kcuda_moe_route(dl, n, ne, k, &cr, di[0], dw[0], NULL, &err) == 0 &&
             kcuda_matvec_experts_swiglu(&mg, &mu, ne, di[0], n, k, dx, ldx, dy[0], ldh, NULL, &err) == 0 &&
             kcuda_matvec_experts_swiglu_route(&mg, &mu, ne, dl, &cr, di[1], dw[1], n, k, dx, ldx, dy[1], ldh,
                                               NULL, &err) == 0;
    if (!ok)
        printf("#   %s\n", err.msg);
    const size_t isz = sizeof(int32_t) * (size_t)S, wsz = sizeof(float) * (size_t)S;
    const size_t ysz = sizeof(float) * (size_t)((S - 1) * ldh + F);
    int32_t *ids[2] = {xmalloc(isz), xmalloc(isz)};
    float *w[2] = {xmalloc(wsz), xmalloc(wsz)}, *y[2] = {xmalloc(ysz), xmalloc(ysz)};
    for (int i = 0; ok && i < 2; i++)
        ok = d_fetch(ids[i], di[i], isz, &err) == 0 && d_fetch(w[i], dw[i], wsz, &err) == 0 &&
             d_fetch(y[i], dy[i], ysz, &err) == 0;
    if (ok) {
        int same_y = 1;
        for (int s2 = 0; s2 < S; s2++)
            same_y &= memcmp(y[0] + s2 * ldh, y[1] + s2 * ldh, sizeof(float) * (size_t)F) == 0;
        const int same_ids = memcmp(ids[0], ids[1], isz) == 0, same_w = memcmp(w[0], w[1], wsz) == 0;
        if (!same_ids || !same_w || !same_y)
            printf("#   ids %s, weights %s, outputs %s\n", same_ids ? "same" : "DIFFER", same_w ? "same" : "DIFFER",
                   same_y ? "same" : "DIFFER");
        ok = same_ids && same_w && same_y;
    }
    tap_ok(ok, "matvec_experts_swiglu_route %s: %d rows x top %d of %lld experts%s, %lld x %lld: the bits of "
           "moe_route then matvec_experts_swiglu", bl_type_info(type)->name, n, k, (long long)ne,
           norm ? " (renormalised)" : "", (long long)F, (long long)E);
    for (int i = 0; i < 2; i++) {
        kcuda_free(di[i]); kcuda_free(dw[i]); kcuda_free(dy[i]);
        free(ids[i]); free(w[i]); free(y[i]);
    }
    kcuda_free(dx); kcuda_free(dl); kcuda_free(gate.d); kcuda_free(up.d);
    free(gate.deq); free(up.deq); free(x); free(lg);
}

int main(void)
{
    gpu_test_init("test_kcuda_moe");
    rng_t r = rng_for(2);

    case_route(&r, 1, 8, 2, 1);
    case_route(&r, 5, 128, 8, 1);
    case_route(&r, 9, 100, 8, 0);    /* not a multiple of 32 */
    case_route(&r, 3, 512, 32, 1);   /* the limits */
    case_route(&r, 7, 60, 1, 1);
    case_route(&r, 4, 32, 32, 1);    /* k = n_expert */
    /* GLM-4.5: sigmoid, choice bias, normalised, scaled */
    case_route_form(&r, 9, 128, 8, (route_form_t){.gating = KCPU_GATE_SIGMOID, .norm = 1, .bias = 1, .scale = 2.5f});
    case_route_form(&r, 5, 160, 8, (route_form_t){.gating = KCPU_GATE_SIGMOID, .norm = 1, .bias = 1, .scale = 1.0f});
    /* DeepSeek-V3: 256 experts in 8 groups, the best 4 groups; V2: softmax groups */
    case_route_form(&r, 7, 256, 8, (route_form_t){.gating = KCPU_GATE_SIGMOID, .norm = 1, .bias = 1, .n_group = 8,
                                                  .topk_group = 4, .scale = 2.5f});
    case_route_form(&r, 6, 160, 6, (route_form_t){.gating = KCPU_GATE_SOFTMAX, .n_group = 8, .topk_group = 3,
                                                  .scale = 16.0f});
    case_route_form(&r, 3, 64, 4, (route_form_t){.gating = KCPU_GATE_SIGMOID, .norm = 0, .n_group = 4,
                                                 .topk_group = 2, .scale = 1.0f});
    /* gpt-oss: router bias, the softmax of the chosen logits */
    case_route_form(&r, 8, 32, 4, (route_form_t){.gating = KCPU_GATE_SOFTMAX_WEIGHT, .lbias = 1, .scale = 1.0f});
    case_route_form(&r, 4, 128, 4, (route_form_t){.gating = KCPU_GATE_SOFTMAX_WEIGHT, .lbias = 1, .scale = 1.0f});
    /* softmax with a choice bias and a scale (the general path, softmax scores) */
    case_route_form(&r, 5, 100, 6, (route_form_t){.gating = KCPU_GATE_SOFTMAX, .norm = 1, .bias = 1, .scale = 0.5f});
    {
        bl_err_t err = {0};
        void *d = d_alloc(4096);
        const kcuda_route_t cr = {.gating = KCUDA_GATE_SOFTMAX, .norm = 1, .scale = 1.0f};
        const kcuda_route_t g40 = {.gating = KCUDA_GATE_SIGMOID, .norm = 1, .scale = 1.0f, .n_group = 40,
                                   .topk_group = 2};
        const kcuda_route_t bad = {.gating = 7, .norm = 1, .scale = 1.0f};
        int ok = kcuda_moe_route(d, 1, 40, KCUDA_MOE_MAX_K + 1, &cr, d, d, NULL, &err) == BL_ENOTSUP &&
                 kcuda_moe_route(d, 1, KCUDA_MOE_MAX_EXPERT + 1, 8, &cr, d, d, NULL, &err) == BL_ENOTSUP &&
                 kcuda_moe_route(d, 1, 4, 5, &cr, d, d, NULL, &err) == BL_ENOTSUP &&
                 kcuda_moe_route(d, 1, 80, 4, &g40, d, d, NULL, &err) == BL_ENOTSUP &&
                 kcuda_moe_route(d, 1, 80, 4, &bad, d, d, NULL, &err) == BL_ENOTSUP &&
                 kcuda_moe_route(d, 1, 80, 4, NULL, d, d, NULL, &err) == BL_EINVAL;
        tap_ok(ok, "moe_route refuses k, n_expert, groups or a gating past its limits");
        kcuda_free(d);
    }

    case_experts_act(&r, 64, 72, 8, KCPU_ACT_SWIGLU_OAI);
    case_experts_act(&r, 32, 2880, 32, KCPU_ACT_SWIGLU_OAI); /* gpt-oss-20b's width */
    case_experts_act(&r, 16, 33, 5, KCPU_ACT_SWIGLU);
    case_remap(&r, 1, 128, 8);
    case_remap(&r, 64, 128, 8);
    case_remap(&r, 512, 60, 4);

    /* Small experts first (odd counts, q6_K rows of 630 bytes for down), then the
     * shapes of a 30B-A3B-class layer (E 2048, F 768, top 8), with 9 experts rather
     * than 128 to keep the reference quick. */
    case_experts(&r, BL_TYPE_Q4_K, BL_TYPE_Q6_K, 6, 256, 768, 1, 3);
    case_experts(&r, BL_TYPE_Q5_K, BL_TYPE_Q8_0, 5, 512, 96, 3, 2);
    case_experts(&r, BL_TYPE_Q8_0, BL_TYPE_Q4_K, 4, 64, 256, 2, 4);
    case_experts(&r, BL_TYPE_F16, BL_TYPE_BF16, 3, 40, 24, 2, 2);
    case_experts(&r, BL_TYPE_Q6_K, BL_TYPE_Q5_K, 7, 768, 512, 1, 7);
    /* mxfp4 (gpt-oss's experts): a small odd shape, and 2880-column rows both ways */
    case_experts(&r, BL_TYPE_MXFP4, BL_TYPE_MXFP4, 5, 96, 160, 3, 2);
    if (!g_small)
        case_experts(&r, BL_TYPE_MXFP4, BL_TYPE_MXFP4, 6, 2880, 2880, 2, 4);
    if (!g_small)
        case_experts(&r, BL_TYPE_Q4_K, BL_TYPE_Q6_K, 9, 2048, 768, 1, 8);
    /* several rows (the experts grouped on tensor cores): the 30B-A3B shape with 8
     * rows choosing 8 of 9 (up to 8 slots an expert), a small shape, and more
     * choices than experts (an expert chosen by more than 8 slots: its leaders take
     * 8 each) */
    case_experts(&r, BL_TYPE_Q4_K, BL_TYPE_Q6_K, 9, 2048, 768, KCUDA_MV_MAX_ROWS, 8);
    case_experts(&r, BL_TYPE_Q4_K, BL_TYPE_Q6_K, 5, 256, 768, 4, 3);
    case_experts(&r, BL_TYPE_Q6_K, BL_TYPE_Q4_K, 3, 512, 256, 6, 5);

    /* the biases and the activation inside the expert launches: gpt-oss's form at a
     * small odd shape and at its 2880 width, the plain SwiGLU, and q6_K's paired
     * down rows (4 blocks or fewer) */
    case_experts_ext(&r, BL_TYPE_MXFP4, 5, 96, 160, 3, 2, KCUDA_ACT_SWIGLU_OAI);
    if (!g_small)
        case_experts_ext(&r, BL_TYPE_MXFP4, 8, 2880, 2880, 2, 4, KCUDA_ACT_SWIGLU_OAI);
    case_experts_ext(&r, BL_TYPE_Q8_0, 6, 64, 96, 2, 3, KCUDA_ACT_SWIGLU);
    case_experts_ext(&r, BL_TYPE_Q6_K, 7, 256, 768, 2, 5, KCUDA_ACT_SWIGLU_OAI);

    /* routing inside the gate/up launch: 30B-A3B's 128 experts (top 8), fewer than
     * a warp, one choice, no renormalisation, and past 128 (two launches) */
    case_routed(&r, BL_TYPE_Q4_K, 128, 256, 64, 3, 8, 1);
    case_routed(&r, BL_TYPE_Q8_0, 9, 64, 40, 2, 4, 1);
    case_routed(&r, BL_TYPE_Q6_K, 60, 256, 32, 4, 1, 0);
    case_routed(&r, BL_TYPE_F16, 200, 32, 16, 2, 6, 1);
    case_routed(&r, BL_TYPE_MXFP4, 32, 2880, 64, 2, 4, 1);
    return tap_done();
}
