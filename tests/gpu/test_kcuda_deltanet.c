/* GPU tests for kernels/cuda/deltanet.cu: the gated DeltaNet of qwen3next and
 * qwen35moe and the elementwise pieces of their gated attention and gated shared
 * expert, on fresh random inputs.
 *  - kcuda_dnet_gates against kcpu_dnet_gates: beta and alpha in one row grouped by
 *    k head (ba) or in two rows (apart, or inside one projection's rows), several
 *    row strides, v heads per k head 1, 2 and 4, alpha past softplus's x > 20 branch
 *    and into its far negative tail; the floats of the rows that hold neither are
 *    NaN, so a read of the wrong float shows.
 *  - kcuda_deltanet against kcpu_deltanet run once per sequence: S 16, 32, 64 and
 *    128, K 2, 4 and 16 (the most), k/v heads 1/1, 2/4, 4/8 and 16/32, both head
 *    mappings; several sequences of different lengths in one call (decode batches
 *    of one row each, and mixes such as 1, 7 and 33 rows); sequences that start
 *    (position 0: their state holds garbage, NaN and infinities included, which must
 *    be ignored) beside sequences that go on from a random state; the layer's floats
 *    state_off into each sequence's buffer, the floats before and after them checked
 *    bit for bit; the buffers one allocation for all (in the reverse order of the
 *    sequences) or one each. Compared: out, the convolved and normed qkv of every
 *    row, and each sequence's final state (window and M).
 *  - five decode steps chained (gates, then the layer, each step), the state carried
 *    on the card and on the host.
 *  - the shapes refused (kcuda_dnet_supported, kcuda_deltanet's code and sentence).
 *  - kcuda_split_heads, kcuda_mul_sigmoid and kcuda_add_gated against scalar
 *    references written here (worker/backend_cpu.c's).
 * TAP output; the seed is printed. */
#include "gpu_test.h"

#include "kcpu.h"

/* Tolerances of kcuda_deltanet against kcpu_deltanet. The card sums in float where
 * the reference sums the norms in double, and orders and contracts (fma) the
 * products its own way: each value differs by rounding only.
 *  - The window (the last K - 1 inputs) is a copy: exact.
 *  - qkv after the convolution, the silu and the L2 norms: 1e-5 abs + 1e-5 rel (a
 *    few ulp of expf and of a norm's sum; q's elements are ~1/S, v's ~1).
 *  - M: 1e-5 abs + 1e-4 rel. Entries of ~0.1 to ~1 take a few ulp a row (and v's
 *    ulp through d) for up to 33 rows: ~1e-7 expected.
 *  - out: 2e-4 abs + 2e-4 rel. rmsnorm(o) divides o by sqrt(mean(o^2) + eps), which
 *    scales o's absolute rounding (~1e-9: sums of S terms |M| |q| of ~1e-3) by up to
 *    1 / sqrt(eps) = 1000 where o is small (a q nearly orthogonal to the state's
 *    keys), times |norm silu(z)| < 6: 1e-5 at worst, ~1e-6 typically. A wrong
 *    kernel (the other head mapping, a state not carried, a starting state read,
 *    another sequence's rows in the window) moves out by ~0.1 to ~1, out's own
 *    scale, so the margin is wide both ways.
 * eps is the models' 1e-6: a smaller one would let that amplification grow. */
#define DN_EPS 1e-6f
#define DN_QKV_ATOL 1e-5
#define DN_QKV_RTOL 1e-5
#define DN_M_ATOL 1e-5
#define DN_M_RTOL 1e-4
#define DN_OUT_ATOL 2e-4
#define DN_OUT_RTOL 2e-4

/* Floats after each sequence's layer state that are not the layer's. */
#define DN_TAIL 29

static double *to_double(const float *x, int64_t rows, int64_t cols, int64_t ld)
{
    double *d = xmalloc(sizeof(double) * (size_t)(rows * cols));
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++)
            d[i * cols + j] = x[i * ld + j];
    return d;
}

static void h2d(void *d_dst, const void *src, size_t nbytes)
{
    bl_err_t err = {0};
    if (kcuda_upload(d_dst, src, nbytes, NULL, &err) < 0 || kcuda_sync(NULL, &err) < 0)
        bail("upload", &err);
}

static float sigmoid_ref(float x) { return 1.0f / (1.0f + expf(-x)); }

/* "1+7+33", or "4 x 1" when all are alike. */
static void rows_str(char *buf, size_t cap, const int *rows, int64_t nseg)
{
    int same = 1;
    for (int64_t j = 1; j < nseg; j++)
        same &= rows[j] == rows[0];
    if (same && nseg > 1) {
        snprintf(buf, cap, "%lld x %d", (long long)nseg, rows[0]);
        return;
    }
    size_t at = 0;
    buf[0] = 0;
    for (int64_t j = 0; j < nseg && at < cap; j++) {
        const int w = snprintf(buf + at, cap - at, "%s%d", j ? "+" : "", rows[j]);
        if (w < 0)
            break;
        at += (size_t)w;
    }
}

// --- a layer and its states ----------------------------------------------------------

/* A layer's parameters on the host (c) and on the card (g), with the sizes: ch the
 * convolution's channels, V = Hv S, SF one sequence's state in floats. */
typedef struct dn_layer {
    kcpu_dnet_t c;
    kcuda_dnet_t g;
    float *conv_w, *dt_bias, *a, *norm;
    float *d_conv_w, *d_dt_bias, *d_a, *d_norm;
    int64_t ch, V, SF;
} dn_layer_t;

/* Random weights of the models' kind: taps of +-0.7, dt_bias +-1, a = -exp(A_log)
 * in -0.5..-0.02 (so g stays above about -1.5 for alpha of +-2: decays the state
 * survives), norm gains 0.2..1.8. */
static void dn_layer_make(rng_t *r, dn_layer_t *L, int S, int K, int Hk, int Hv, int tiled, int ba)
{
    memset(L, 0, sizeof *L);
    L->ch = (int64_t)S * (2 * Hk + Hv);
    L->V = (int64_t)Hv * S;
    L->SF = (int64_t)(K - 1) * L->ch + (int64_t)Hv * S * S;
    L->conv_w = xmalloc(sizeof(float) * (size_t)(L->ch * K));
    L->dt_bias = xmalloc(sizeof(float) * (size_t)Hv);
    L->a = xmalloc(sizeof(float) * (size_t)Hv);
    L->norm = xmalloc(sizeof(float) * (size_t)S);
    rand_fill(r, L->conv_w, L->ch * K, 0.7f);
    for (int h = 0; h < Hv; h++) {
        L->dt_bias[h] = rng_f(r, -1.0f, 1.0f);
        L->a[h] = -rng_f(r, 0.02f, 0.5f);
    }
    for (int j = 0; j < S; j++)
        L->norm[j] = rng_f(r, 0.2f, 1.8f);
    L->c = (kcpu_dnet_t){.conv_w = L->conv_w, .dt_bias = L->dt_bias, .a = L->a, .norm = L->norm, .K = K, .S = S,
                         .Hk = Hk, .Hv = Hv, .tiled = tiled, .ba = ba, .eps = DN_EPS};
    L->d_conv_w = d_upload(L->conv_w, sizeof(float) * (size_t)(L->ch * K));
    L->d_dt_bias = d_upload(L->dt_bias, sizeof(float) * (size_t)Hv);
    L->d_a = d_upload(L->a, sizeof(float) * (size_t)Hv);
    L->d_norm = d_upload(L->norm, sizeof(float) * (size_t)S);
    L->g = (kcuda_dnet_t){.d_conv_w = L->d_conv_w, .d_dt_bias = L->d_dt_bias, .d_a = L->d_a, .d_norm = L->d_norm,
                          .K = K, .S = S, .Hk = Hk, .Hv = Hv, .tiled = tiled, .ba = ba, .eps = DN_EPS};
}

static void dn_layer_free(dn_layer_t *L)
{
    kcuda_free(L->d_conv_w); kcuda_free(L->d_dt_bias); kcuda_free(L->d_a); kcuda_free(L->d_norm);
    free(L->conv_w); free(L->dt_bias); free(L->a); free(L->norm);
}

/* What a cache's memory may hold where a sequence starts: large values, NaN and
 * infinities. */
static void dn_garbage(rng_t *r, float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        const uint64_t u = rng_next(r) % 16;
        x[i] = u == 0 ? NAN : u == 1 ? INFINITY : u == 2 ? -INFINITY : rng_f(r, -1e4f, 1e4f);
    }
}

/* The states of a step's sequences on the card. Sequence j's buffer (stride floats)
 * holds off floats that are not the layer's, the layer's SF floats (the window
 * (K - 1, ch), then Hv matrices S x S) and DN_TAIL more that are not the layer's.
 * One allocation for all (sequence j in slot nseg - 1 - j) or one each (sep). img
 * is each buffer's content as uploaded, sequence j's at j * stride. */
typedef struct dn_states {
    int64_t nseg, off, stride;
    float *img;
    float **base;
    void *one;
} dn_states_t;

/* start[j]: sequence j starts (its layer state garbage), else a prior state: a
 * window of inputs like the rows' (+-2) and M of +-0.2. */
static void dn_states_make(rng_t *r, const dn_layer_t *L, dn_states_t *st, int64_t nseg, int64_t off, int sep,
                           const int *start)
{
    const int64_t nc = (L->c.K - 1) * L->ch;
    st->nseg = nseg;
    st->off = off;
    st->stride = off + L->SF + DN_TAIL;
    st->img = xmalloc(sizeof(float) * (size_t)(nseg * st->stride));
    st->base = xmalloc(sizeof(float *) * (size_t)nseg);
    st->one = sep ? NULL : d_alloc(sizeof(float) * (size_t)(nseg * st->stride));
    for (int64_t j = 0; j < nseg; j++) {
        float *im = st->img + j * st->stride, *s = im + off;
        rand_fill(r, im, off, 1.0f);
        rand_fill(r, s + L->SF, DN_TAIL, 1.0f);
        if (start[j]) {
            dn_garbage(r, s, L->SF);
        } else {
            rand_fill(r, s, nc, 2.0f);
            rand_fill(r, s + nc, L->SF - nc, 0.2f);
        }
        st->base[j] = sep ? d_alloc(sizeof(float) * (size_t)st->stride)
                          : (float *)st->one + (nseg - 1 - j) * st->stride;
        h2d(st->base[j], im, sizeof(float) * (size_t)st->stride);
    }
}

static void dn_states_free(dn_states_t *st)
{
    if (st->one)
        kcuda_free(st->one);
    else
        for (int64_t j = 0; j < st->nseg; j++)
            kcuda_free(st->base[j]);
    free(st->img);
    free(st->base);
}

/* A copy of the uploaded images, for the reference to update. */
static float *dn_states_copy(const dn_states_t *st)
{
    float *w = xmalloc(sizeof(float) * (size_t)(st->nseg * st->stride));
    memcpy(w, st->img, sizeof(float) * (size_t)(st->nseg * st->stride));
    return w;
}

/* kcpu_deltanet once per sequence on the images img (a starting sequence's layer
 * state zeroed first, as the worker's CPU backend does): qkv (n, ch) in place, out
 * (n, V). */
static void dn_reference(const dn_layer_t *L, const dn_states_t *st, float *img, const kcuda_dn_seg_t *segs,
                         float *qkv, const float *z, const float *beta, const float *g, float *out)
{
    const int64_t nc = (L->c.K - 1) * L->ch, Hv = L->c.Hv;
    for (int64_t j = 0; j < st->nseg; j++) {
        float *s = img + j * st->stride + st->off;
        if (segs[j].pos == 0)
            memset(s, 0, sizeof(float) * (size_t)L->SF);
        const int64_t r0 = segs[j].row0;
        kcpu_deltanet(NULL, &L->c, qkv + r0 * L->ch, z + r0 * L->V, beta + r0 * Hv, g + r0 * Hv, s, s + nc,
                      out + r0 * L->V, segs[j].n);
    }
}

/* Each sequence's buffer from the card against the reference's image want: the
 * floats around the layer's bit for bit, the window exactly, M within tolerance. */
static int dn_check_states(const dn_layer_t *L, const dn_states_t *st, const float *want)
{
    bl_err_t err = {0};
    const int64_t nc = (L->c.K - 1) * L->ch, S = L->c.S;
    float *got = xmalloc(sizeof(float) * (size_t)st->stride);
    int ok = 1;
    for (int64_t j = 0; j < st->nseg; j++) {
        const float *w = want + j * st->stride;
        if (d_fetch(got, st->base[j], sizeof(float) * (size_t)st->stride, &err) < 0) {
            printf("#   %s\n", err.msg);
            ok = 0;
            break;
        }
        if (memcmp(got, w, sizeof(float) * (size_t)st->off) != 0 ||
            memcmp(got + st->off + L->SF, w + st->off + L->SF, sizeof(float) * DN_TAIL) != 0) {
            printf("#   sequence %lld: floats outside the layer's state changed\n", (long long)j);
            ok = 0;
        }
        double *ref = to_double(w + st->off, L->c.K - 1, L->ch, L->ch);
        if (!check_close(got + st->off, L->ch, ref, L->c.K - 1, L->ch, 0.0, 0.0)) {
            printf("#   (sequence %lld's window, (K - 1, channels))\n", (long long)j);
            ok = 0;
        }
        free(ref);
        ref = to_double(w + st->off + nc, L->c.Hv * S, S, S);
        if (!check_close(got + st->off + nc, S, ref, L->c.Hv * S, S, DN_M_ATOL, DN_M_RTOL)) {
            printf("#   (sequence %lld's M, (Hv S, S): row h S + i is head h's key dim i)\n", (long long)j);
            ok = 0;
        }
        free(ref);
    }
    free(got);
    return ok;
}

// --- cases ---------------------------------------------------------------------------

/* beta and g from the rows' projections: ba, b (n rows b_ld apart) with both values
 * grouped by k head; else b and al, in their own rows (al_ld apart) or, shared,
 * inside b's rows at Hv (al_ld = b_ld), as one projection's output. Every fourth
 * alpha is 22..30 (x = alpha + dt_bias > 20: softplus's linear branch), the rest
 * +-30 (down to e^-31 in the log1p branch); b is +-8. The floats that hold neither
 * are NaN. */
static void case_gates(rng_t *r, int64_t n, int Hk, int Hv, int ba, int64_t b_ld, int64_t al_ld, int shared)
{
    bl_err_t err = {0};
    dn_layer_t L;
    dn_layer_make(r, &L, 16, 2, Hk, Hv, 0, ba);
    const int sep_al = !ba && !shared;
    if (shared)
        al_ld = b_ld;
    const int64_t rh = Hv / Hk, nb = n * b_ld, nal = sep_al ? n * al_ld : 1;
    float *b = xmalloc(sizeof(float) * (size_t)nb), *al = xmalloc(sizeof(float) * (size_t)nal);
    for (int64_t i = 0; i < nb; i++)
        b[i] = NAN;
    for (int64_t i = 0; i < nal; i++)
        al[i] = NAN;
    int64_t n_lin = 0;
    for (int64_t t = 0; t < n; t++)
        for (int64_t h = 0; h < Hv; h++) {
            const float bv = rng_f(r, -8.0f, 8.0f);
            const float av = (t * Hv + h) % 4 == 0 ? rng_f(r, 22.0f, 30.0f) : rng_f(r, -30.0f, 30.0f);
            n_lin += av + L.dt_bias[h] > 20.0f;
            if (ba) {
                const int64_t kh = h / rh, i = h % rh;
                b[t * b_ld + 2 * rh * kh + i] = bv;
                b[t * b_ld + 2 * rh * kh + rh + i] = av;
            } else if (shared) {
                b[t * b_ld + h] = bv;
                b[t * b_ld + Hv + h] = av;
            } else {
                b[t * b_ld + h] = bv;
                al[t * al_ld + h] = av;
            }
        }
    float *beta = xmalloc(sizeof(float) * (size_t)(n * Hv)), *g = xmalloc(sizeof(float) * (size_t)(n * Hv));
    float *got_b = xmalloc(sizeof(float) * (size_t)(n * Hv)), *got_g = xmalloc(sizeof(float) * (size_t)(n * Hv));
    kcpu_dnet_gates(&L.c, b, b_ld, ba ? NULL : shared ? b + Hv : al, al_ld, n, beta, g);
    float *db = d_upload(b, sizeof(float) * (size_t)nb);
    float *dal = sep_al ? d_upload(al, sizeof(float) * (size_t)nal) : NULL;
    float *dbeta = d_poison(sizeof(float) * (size_t)(n * Hv)), *dg = d_poison(sizeof(float) * (size_t)(n * Hv));
    const float *d_al = ba ? NULL : shared ? db + Hv : dal;
    int ok = kcuda_dnet_gates(&L.g, db, b_ld, d_al, ba ? 0 : al_ld, n, dbeta, dg, NULL, &err) == 0 &&
             d_fetch(got_b, dbeta, sizeof(float) * (size_t)(n * Hv), &err) == 0 &&
             d_fetch(got_g, dg, sizeof(float) * (size_t)(n * Hv), &err) == 0;
    if (!ok) {
        printf("#   %s\n", err.msg);
    } else {
        double *ref = to_double(beta, n, Hv, Hv);
        if (!check_close(got_b, Hv, ref, n, Hv, 1e-5, 1e-5)) {
            printf("#   (beta)\n");
            ok = 0;
        }
        free(ref);
        ref = to_double(g, n, Hv, Hv);
        if (!check_close(got_g, Hv, ref, n, Hv, 1e-5, 1e-5)) {
            printf("#   (g)\n");
            ok = 0;
        }
        free(ref);
    }
    if (ba)
        tap_ok(ok, "dnet_gates: %lld rows, %d k / %d v heads, beta and alpha in one row (ld %lld), %lld of x > 20",
               (long long)n, Hk, Hv, (long long)b_ld, (long long)n_lin);
    else
        tap_ok(ok, "dnet_gates: %lld rows, %d k / %d v heads, b (ld %lld) and alpha %s (ld %lld), %lld of x > 20",
               (long long)n, Hk, Hv, (long long)b_ld, shared ? "inside b's rows" : "apart", (long long)al_ld,
               (long long)n_lin);
    kcuda_free(db); kcuda_free(dal); kcuda_free(dbeta); kcuda_free(dg);
    free(b); free(al); free(beta); free(g); free(got_b); free(got_g);
    dn_layer_free(&L);
}

/* One step of nseg sequences (rows[j] rows each, in order; start[j]: sequence j at
 * position 0 with garbage in its state, else at a position > 0 with a random
 * state), the layer state off floats into each sequence's buffer (sep: a buffer
 * each). beta uniform in [0, 1), g in (-2, 0], qkv +-2, z +-3. */
static void case_deltanet(rng_t *r, int S, int K, int Hk, int Hv, int tiled, int64_t nseg, const int *rows,
                          const int *start, int64_t off, int sep)
{
    bl_err_t err = {0};
    dn_layer_t L;
    dn_layer_make(r, &L, S, K, Hk, Hv, tiled, 0);
    dn_states_t st;
    dn_states_make(r, &L, &st, nseg, off, sep, start);
    kcuda_dn_seg_t *segs = xmalloc(sizeof(kcuda_dn_seg_t) * (size_t)nseg);
    int64_t n = 0;
    int n_start = 0;
    for (int64_t j = 0; j < nseg; j++) {
        segs[j] = (kcuda_dn_seg_t){.state = (uint64_t)(uintptr_t)st.base[j], .row0 = (int32_t)n, .n = rows[j],
                                   .pos = start[j] ? 0 : (int32_t)(1 + rng_next(r) % 5000)};
        n += rows[j];
        n_start += start[j] != 0;
    }
    const int64_t ch = L.ch, V = L.V;
    float *qkv = xmalloc(sizeof(float) * (size_t)(n * ch)), *z = xmalloc(sizeof(float) * (size_t)(n * V));
    float *beta = xmalloc(sizeof(float) * (size_t)(n * Hv)), *g = xmalloc(sizeof(float) * (size_t)(n * Hv));
    float *out = xmalloc(sizeof(float) * (size_t)(n * V)), *got_out = xmalloc(sizeof(float) * (size_t)(n * V));
    float *got_qkv = xmalloc(sizeof(float) * (size_t)(n * ch));
    rand_fill(r, qkv, n * ch, 2.0f);
    rand_fill(r, z, n * V, 3.0f);
    for (int64_t i = 0; i < n * Hv; i++) {
        beta[i] = rng_f(r, 0.0f, 1.0f);
        g[i] = -rng_f(r, 0.0f, 2.0f);
    }
    float *dq = d_upload(qkv, sizeof(float) * (size_t)(n * ch)), *dz = d_upload(z, sizeof(float) * (size_t)(n * V));
    float *dbeta = d_upload(beta, sizeof(float) * (size_t)(n * Hv));
    float *dg = d_upload(g, sizeof(float) * (size_t)(n * Hv));
    float *dout = d_poison(sizeof(float) * (size_t)(n * V));
    kcuda_dn_seg_t *dsegs = d_upload(segs, sizeof(kcuda_dn_seg_t) * (size_t)nseg);

    float *want = dn_states_copy(&st);
    dn_reference(&L, &st, want, segs, qkv, z, beta, g, out); /* qkv becomes the reference's */

    int ok = kcuda_dnet_supported(S, K) == 1;
    if (!ok)
        printf("#   kcuda_dnet_supported(%d, %d) is not 1\n", S, K);
    ok = ok && kcuda_deltanet(&L.g, dsegs, nseg, off, dq, dz, dbeta, dg, dout, n, NULL, &err) == 0 &&
         d_fetch(got_out, dout, sizeof(float) * (size_t)(n * V), &err) == 0 &&
         d_fetch(got_qkv, dq, sizeof(float) * (size_t)(n * ch), &err) == 0;
    if (!ok) {
        printf("#   %s\n", err.msg);
    } else {
        double *ref = to_double(out, n, V, V);
        if (!check_close(got_out, V, ref, n, V, DN_OUT_ATOL, DN_OUT_RTOL)) {
            printf("#   (out, (n, Hv S))\n");
            ok = 0;
        }
        free(ref);
        ref = to_double(qkv, n, ch, ch);
        if (!check_close(got_qkv, ch, ref, n, ch, DN_QKV_ATOL, DN_QKV_RTOL)) {
            printf("#   (qkv, (n, channels): q at 0, k at Hk S, v at 2 Hk S)\n");
            ok = 0;
        }
        free(ref);
        ok &= dn_check_states(&L, &st, want);
    }
    char rs[128];
    rows_str(rs, sizeof rs, rows, nseg);
    tap_ok(ok, "deltanet: S %d, K %d, %d k / %d v heads%s, rows %s (%d starting), state_off %lld, %s, %d columns a "
           "block (0: a head's)", S, K, Hk, Hv, tiled ? " tiled" : "", rs, n_start, (long long)off,
           sep ? "a buffer each" : "one buffer", kcuda_deltanet_set_cols(-1));
    kcuda_free(dq); kcuda_free(dz); kcuda_free(dbeta); kcuda_free(dg); kcuda_free(dout); kcuda_free(dsegs);
    free(qkv); free(z); free(beta); free(g); free(out); free(got_out); free(got_qkv); free(want); free(segs);
    dn_states_free(&st);
    dn_layer_free(&L);
}

/* steps decode steps back to back, a row per sequence each: fresh projections,
 * beta and g through kcuda_dnet_gates / kcpu_dnet_gates (the layer's form: ba with
 * a padded row, else b and alpha apart), then the layer; the states stay on the
 * card (and in the host's images) from step to step, the table rewritten each step
 * with the positions moved on. Sequence 0 starts at the first step (garbage), the
 * others go on from random states. Every step's out and the final states compared. */
static void case_chain(rng_t *r, int S, int K, int Hk, int Hv, int tiled, int ba, int64_t nseq, int steps)
{
    bl_err_t err = {0};
    dn_layer_t L;
    dn_layer_make(r, &L, S, K, Hk, Hv, tiled, ba);
    int *start = xmalloc(sizeof(int) * (size_t)nseq);
    int32_t *pos0 = xmalloc(sizeof(int32_t) * (size_t)nseq);
    for (int64_t j = 0; j < nseq; j++) {
        start[j] = j == 0;
        pos0[j] = start[j] ? 0 : (int32_t)(1 + rng_next(r) % 5000);
    }
    const int64_t off = L.SF + 16; /* as the second DeltaNet layer of a cache */
    dn_states_t st;
    dn_states_make(r, &L, &st, nseq, off, 0, start);
    float *want = dn_states_copy(&st);
    const int64_t n = nseq, ch = L.ch, V = L.V, b_ld = ba ? 2 * Hv + 3 : Hv + 1, al_ld = Hv + 2;
    kcuda_dn_seg_t *segs = xmalloc(sizeof(kcuda_dn_seg_t) * (size_t)n);
    float *qkv = xmalloc(sizeof(float) * (size_t)(n * ch)), *z = xmalloc(sizeof(float) * (size_t)(n * V));
    float *bb = xmalloc(sizeof(float) * (size_t)(n * b_ld)), *al = xmalloc(sizeof(float) * (size_t)(n * al_ld));
    float *beta = xmalloc(sizeof(float) * (size_t)(n * Hv)), *g = xmalloc(sizeof(float) * (size_t)(n * Hv));
    float *out = xmalloc(sizeof(float) * (size_t)(n * V)), *got = xmalloc(sizeof(float) * (size_t)(n * V));
    float *dq = d_alloc(sizeof(float) * (size_t)(n * ch)), *dz = d_alloc(sizeof(float) * (size_t)(n * V));
    float *dbb = d_alloc(sizeof(float) * (size_t)(n * b_ld)), *dal = d_alloc(sizeof(float) * (size_t)(n * al_ld));
    float *dbeta = d_alloc(sizeof(float) * (size_t)(n * Hv)), *dg = d_alloc(sizeof(float) * (size_t)(n * Hv));
    float *dout = d_alloc(sizeof(float) * (size_t)(n * V));
    kcuda_dn_seg_t *dsegs = d_alloc(sizeof(kcuda_dn_seg_t) * (size_t)n);
    int ok = 1;
    for (int t = 0; t < steps && ok; t++) {
        rand_fill(r, qkv, n * ch, 2.0f);
        rand_fill(r, z, n * V, 3.0f);
        rand_fill(r, bb, n * b_ld, 2.0f);
        rand_fill(r, al, n * al_ld, 2.0f);
        for (int64_t j = 0; j < n; j++)
            segs[j] = (kcuda_dn_seg_t){.state = (uint64_t)(uintptr_t)st.base[j], .row0 = (int32_t)j, .n = 1,
                                       .pos = pos0[j] + t};
        h2d(dsegs, segs, sizeof(kcuda_dn_seg_t) * (size_t)n);
        h2d(dq, qkv, sizeof(float) * (size_t)(n * ch));
        h2d(dz, z, sizeof(float) * (size_t)(n * V));
        h2d(dbb, bb, sizeof(float) * (size_t)(n * b_ld));
        h2d(dal, al, sizeof(float) * (size_t)(n * al_ld));
        if (kcuda_memset(dout, 0xff, sizeof(float) * (size_t)(n * V), NULL, &err) < 0)
            bail("memset", &err);
        kcpu_dnet_gates(&L.c, bb, b_ld, ba ? NULL : al, al_ld, n, beta, g);
        dn_reference(&L, &st, want, segs, qkv, z, beta, g, out);
        ok = kcuda_dnet_gates(&L.g, dbb, b_ld, ba ? NULL : dal, ba ? 0 : al_ld, n, dbeta, dg, NULL, &err) == 0 &&
             kcuda_deltanet(&L.g, dsegs, n, off, dq, dz, dbeta, dg, dout, n, NULL, &err) == 0 &&
             d_fetch(got, dout, sizeof(float) * (size_t)(n * V), &err) == 0;
        if (!ok) {
            printf("#   step %d: %s\n", t, err.msg);
            break;
        }
        double *ref = to_double(out, n, V, V);
        if (!check_close(got, V, ref, n, V, DN_OUT_ATOL, DN_OUT_RTOL)) {
            printf("#   (out of step %d)\n", t);
            ok = 0;
        }
        free(ref);
    }
    if (ok)
        ok = dn_check_states(&L, &st, want);
    tap_ok(ok, "deltanet: %d decode steps of %lld sequences chained (S %d, K %d, %d k / %d v heads%s, %s), "
               "the state carried",
           steps, (long long)nseq, S, K, Hk, Hv, tiled ? " tiled" : "", ba ? "ba" : "b and alpha apart");
    kcuda_free(dq); kcuda_free(dz); kcuda_free(dbb); kcuda_free(dal); kcuda_free(dbeta); kcuda_free(dg);
    kcuda_free(dout); kcuda_free(dsegs);
    free(start); free(pos0); free(want); free(segs); free(qkv); free(z); free(bb); free(al); free(beta); free(g);
    free(out); free(got);
    dn_states_free(&st);
    dn_layer_free(&L);
}

/* Shapes the kernels do not take: kcuda_dnet_supported says so, and kcuda_deltanet
 * refuses them (BL_EINVAL or BL_ENOTSUP, a sentence in err) before any launch (the
 * buffers are large enough anyway, so a launch would not fault). */
static void case_refusals(void)
{
    bl_err_t err = {0};
    int ok = kcuda_dnet_supported(24, 4) == 0 && kcuda_dnet_supported(128, 4) == 1 &&
             kcuda_dnet_supported(16, 2) == 1 && kcuda_dnet_supported(32, KCUDA_DNET_MAX_K) == 1 &&
             kcuda_dnet_supported(64, KCUDA_DNET_MAX_K + 1) == 0 && kcuda_dnet_supported(256, 4) == 0 &&
             kcuda_dnet_supported(8, 4) == 0;
    tap_ok(ok, "dnet_supported: S of 16, 32, 64 or 128 with up to %d taps only", KCUDA_DNET_MAX_K);

    const size_t nbytes = (size_t)1 << 20;
    float *d = d_poison(nbytes);
    const kcuda_dn_seg_t seg = {.state = (uint64_t)(uintptr_t)d, .row0 = 0, .n = 1, .pos = 0};
    kcuda_dn_seg_t *dsegs = d_upload(&seg, sizeof seg);
    static const int shapes[][2] = {{24, 4}, {64, KCUDA_DNET_MAX_K + 1}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const kcuda_dnet_t dn = {.d_conv_w = d, .d_dt_bias = d, .d_a = d, .d_norm = d, .K = shapes[i][1],
                                 .S = shapes[i][0], .Hk = 1, .Hv = 1, .tiled = 0, .ba = 0, .eps = DN_EPS};
        err = (bl_err_t){0};
        const int rc = kcuda_deltanet(&dn, dsegs, 1, 0, d, d, d, d, d + 4096, 1, NULL, &err);
        bl_err_t serr = {0};
        const int synced = kcuda_sync(NULL, &serr) == 0;
        ok = (rc == BL_EINVAL || rc == BL_ENOTSUP) && err.msg[0] != 0 && synced;
        if (!synced)
            printf("#   %s\n", serr.msg);
        printf("#   code %d: %s\n", rc, err.msg);
        tap_ok(ok, "deltanet refuses S %d with %d taps", shapes[i][0], shapes[i][1]);
    }
    kcuda_free(dsegs);
    kcuda_free(d);
}

/* a and g (n, n_head hd) from x (n, n_head 2 hd): copies, so exact. */
static void case_split_heads(rng_t *r, int64_t n, int64_t n_head, int64_t hd)
{
    bl_err_t err = {0};
    const int64_t nx = n * n_head * 2 * hd, na = n * n_head * hd;
    float *x = xmalloc(sizeof(float) * (size_t)nx), *a = xmalloc(sizeof(float) * (size_t)na);
    float *g = xmalloc(sizeof(float) * (size_t)na), *got_a = xmalloc(sizeof(float) * (size_t)na);
    float *got_g = xmalloc(sizeof(float) * (size_t)na);
    rand_fill(r, x, nx, 3.0f);
    for (int64_t rh = 0; rh < n * n_head; rh++) /* worker/backend_cpu.c's cpu_split_heads */
        for (int64_t e = 0; e < hd; e++) {
            a[rh * hd + e] = x[rh * 2 * hd + e];
            g[rh * hd + e] = x[rh * 2 * hd + hd + e];
        }
    float *dx = d_upload(x, sizeof(float) * (size_t)nx);
    float *da = d_poison(sizeof(float) * (size_t)na), *dg = d_poison(sizeof(float) * (size_t)na);
    int ok = kcuda_split_heads(dx, n, n_head, hd, da, dg, NULL, &err) == 0 &&
             d_fetch(got_a, da, sizeof(float) * (size_t)na, &err) == 0 &&
             d_fetch(got_g, dg, sizeof(float) * (size_t)na, &err) == 0;
    if (!ok) {
        printf("#   %s\n", err.msg);
    } else {
        double *ref = to_double(a, 1, na, na);
        ok = check_close(got_a, na, ref, 1, na, 0.0, 0.0);
        free(ref);
        ref = to_double(g, 1, na, na);
        ok &= check_close(got_g, na, ref, 1, na, 0.0, 0.0);
        free(ref);
    }
    tap_ok(ok, "split_heads: %lld rows, %lld heads of 2 x %lld", (long long)n, (long long)n_head, (long long)hd);
    kcuda_free(dx); kcuda_free(da); kcuda_free(dg);
    free(x); free(a); free(g); free(got_a); free(got_g);
}

/* y *= sigmoid(g), y +-3, g +-8: expf's few ulp, 1e-6 abs + 2e-6 rel. */
static void case_mul_sigmoid(rng_t *r, int64_t n)
{
    bl_err_t err = {0};
    float *y = xmalloc(sizeof(float) * (size_t)n), *g = xmalloc(sizeof(float) * (size_t)n);
    float *want = xmalloc(sizeof(float) * (size_t)n), *got = xmalloc(sizeof(float) * (size_t)n);
    rand_fill(r, y, n, 3.0f);
    rand_fill(r, g, n, 8.0f);
    for (int64_t i = 0; i < n; i++)
        want[i] = y[i] * sigmoid_ref(g[i]);
    float *dy = d_upload(y, sizeof(float) * (size_t)n), *dg = d_upload(g, sizeof(float) * (size_t)n);
    int ok = kcuda_mul_sigmoid(dy, dg, n, NULL, &err) == 0 && d_fetch(got, dy, sizeof(float) * (size_t)n, &err) == 0;
    if (!ok) {
        printf("#   %s\n", err.msg);
    } else {
        double *ref = to_double(want, 1, n, n);
        ok = check_close(got, n, ref, 1, n, 1e-6, 2e-6);
        free(ref);
    }
    tap_ok(ok, "mul_sigmoid: %lld elements", (long long)n);
    kcuda_free(dy); kcuda_free(dg);
    free(y); free(g); free(want); free(got);
}

/* x (n, d) += sigmoid(w . xn[r]) y[r]: the reference's dot in double (as
 * worker/backend_cpu.c's cpu_ffn), the card's in float. w +-0.05 against xn +-2
 * keeps the dot within a few units, where the gate is not saturated; the dot's
 * float rounding (~1e-6) moves x by under 1e-6: 1e-5 abs + 1e-5 rel. */
static void case_add_gated(rng_t *r, int64_t n, int64_t d)
{
    bl_err_t err = {0};
    float *x = xmalloc(sizeof(float) * (size_t)(n * d)), *y = xmalloc(sizeof(float) * (size_t)(n * d));
    float *xn = xmalloc(sizeof(float) * (size_t)(n * d)), *w = xmalloc(sizeof(float) * (size_t)d);
    float *want = xmalloc(sizeof(float) * (size_t)(n * d)), *got = xmalloc(sizeof(float) * (size_t)(n * d));
    rand_fill(r, x, n * d, 2.0f);
    rand_fill(r, y, n * d, 2.0f);
    rand_fill(r, xn, n * d, 2.0f);
    rand_fill(r, w, d, 0.05f);
    for (int64_t row = 0; row < n; row++) {
        double dot = 0.0;
        for (int64_t i = 0; i < d; i++)
            dot += (double)w[i] * (double)xn[row * d + i];
        const float s = sigmoid_ref((float)dot);
        for (int64_t i = 0; i < d; i++)
            want[row * d + i] = x[row * d + i] + s * y[row * d + i];
    }
    float *dx = d_upload(x, sizeof(float) * (size_t)(n * d)), *dy = d_upload(y, sizeof(float) * (size_t)(n * d));
    float *dxn = d_upload(xn, sizeof(float) * (size_t)(n * d)), *dw = d_upload(w, sizeof(float) * (size_t)d);
    int ok = kcuda_add_gated(dx, dy, dw, dxn, n, d, NULL, &err) == 0 &&
             d_fetch(got, dx, sizeof(float) * (size_t)(n * d), &err) == 0;
    if (!ok) {
        printf("#   %s\n", err.msg);
    } else {
        double *ref = to_double(want, n, d, d);
        ok = check_close(got, d, ref, n, d, 1e-5, 1e-5);
        free(ref);
    }
    tap_ok(ok, "add_gated: %lld rows of %lld", (long long)n, (long long)d);
    kcuda_free(dx); kcuda_free(dy); kcuda_free(dxn); kcuda_free(dw);
    free(x); free(y); free(xn); free(w); free(want); free(got);
}

#define SEGS(...) (int64_t)(sizeof((const int[]){__VA_ARGS__}) / sizeof(int)), (const int[]){__VA_ARGS__}

int main(void)
{
    gpu_test_init("test_kcuda_deltanet");
    rng_t r = rng_for(12);

    /* qwen3next's ssm_ba (16 k heads, 32 v heads), ratios 1 and 4, padded rows */
    case_gates(&r, 5, 16, 32, 1, 64, 0, 0);
    case_gates(&r, 3, 2, 8, 1, 2 * 8 + 5, 0, 0);
    case_gates(&r, 1, 4, 4, 1, 8, 0, 0);
    case_gates(&r, 64, 16, 32, 1, 64, 0, 0);
    /* qwen35moe's ssm_beta and ssm_alpha: apart, or inside one projection's rows */
    case_gates(&r, 4, 4, 8, 0, 8, 8, 0);
    case_gates(&r, 7, 2, 8, 0, 11, 13, 0);
    case_gates(&r, 1, 16, 16, 0, 16, 23, 0);
    case_gates(&r, 6, 16, 32, 0, 2 * 32 + 4, 0, 1);
    case_gates(&r, 2, 1, 2, 0, 4, 0, 1);

    /* case_deltanet(r, S, K, Hk, Hv, tiled, SEGS(rows...), start[], state_off, sep) */
    case_deltanet(&r, 16, 4, 2, 4, 0, SEGS(1, 1, 1, 1), (const int[]){0, 1, 0, 1}, 0, 1);
    case_deltanet(&r, 16, 2, 1, 1, 0, SEGS(1, 7, 33), (const int[]){1, 0, 0}, 13, 0);
    case_deltanet(&r, 16, 4, 4, 8, 1, SEGS(1, 1, 1, 1, 1, 1, 1, 1, 1), (const int[]){1, 0, 0, 1, 0, 0, 0, 1, 0},
                  40, 0);
    case_deltanet(&r, 32, 4, 2, 4, 1, SEGS(7, 1, 33), (const int[]){0, 1, 0}, 100, 1);
    case_deltanet(&r, 32, 16, 4, 8, 0, SEGS(1, 7, 33), (const int[]){0, 0, 1}, 0, 0);
    case_deltanet(&r, 32, 2, 2, 4, 0, SEGS(2, 1), (const int[]){1, 1}, 3, 1);
    case_deltanet(&r, 64, 4, 4, 8, 1, SEGS(1, 1, 1), (const int[]){1, 0, 0}, 777, 0);
    case_deltanet(&r, 64, 2, 1, 1, 0, SEGS(33, 7), (const int[]){0, 1}, 0, 1);
    case_deltanet(&r, 64, 16, 2, 4, 0, SEGS(20, 1, 3), (const int[]){1, 0, 0}, 5, 1);
    case_deltanet(&r, 64, 4, 2, 4, 0, SEGS(1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1),
                  (const int[]){0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0}, 64, 0);
    if (g_small) {
        case_deltanet(&r, 128, 4, 2, 4, 0, SEGS(1, 3), (const int[]){0, 1}, 64, 0);
        case_deltanet(&r, 128, 4, 2, 4, 1, SEGS(2, 1), (const int[]){1, 0}, 0, 1);
        case_deltanet(&r, 128, 16, 1, 1, 0, SEGS(1, 2), (const int[]){0, 1}, 7, 1);
    } else {
        case_deltanet(&r, 128, 4, 2, 4, 0, SEGS(1, 7, 33), (const int[]){0, 1, 0}, 64, 0);
        case_deltanet(&r, 128, 4, 2, 4, 1, SEGS(33, 1, 7), (const int[]){1, 0, 0}, 0, 1);
        case_deltanet(&r, 128, 16, 1, 1, 0, SEGS(1, 7, 20), (const int[]){0, 1, 0}, 7, 1);
        /* Qwen3-Next-80B's layer (16 k heads, 32 v heads, K 4): a decode batch, the
         * layer the third of a cache's; then qwen35moe's mapping on a prompt mix */
        const int64_t sf = 3 * 8192 + 32 * 128 * 128;
        case_deltanet(&r, 128, 4, 16, 32, 0, SEGS(1, 1, 1, 1), (const int[]){0, 0, 1, 0}, 2 * sf, 0);
        case_deltanet(&r, 128, 4, 16, 32, 1, SEGS(1, 7, 33), (const int[]){1, 0, 0}, sf, 1);
    }

    /* the delta rule's columns over several blocks with the next row's loads ahead
     * (kcuda_deltanet_set_cols), and with a whole head's (128) */
    static const int cols[] = {16, 32, 64, 128};
    const int cols_default = kcuda_deltanet_set_cols(-1);
    for (size_t i = 0; i < sizeof cols / sizeof cols[0]; i++) {
        (void)kcuda_deltanet_set_cols(cols[i]);
        case_deltanet(&r, 16, 2, 1, 1, 0, SEGS(1, 7, 33), (const int[]){1, 0, 0}, 13, 0);
        case_deltanet(&r, 32, 4, 2, 4, 1, SEGS(7, 1, 33), (const int[]){0, 1, 0}, 100, 1);
        case_deltanet(&r, 64, 2, 1, 1, 0, SEGS(33, 7), (const int[]){0, 1}, 0, 1);
        case_deltanet(&r, 128, 4, 2, 4, 1, SEGS(33, 1, 7), (const int[]){1, 0, 0}, 0, 1);
        case_chain(&r, 128, 4, 2, 4, 0, 1, 2, 5);
    }
    (void)kcuda_deltanet_set_cols(cols_default);

    case_chain(&r, 16, 4, 2, 4, 0, 1, 3, 5);
    case_chain(&r, 64, 4, 4, 8, 1, 0, 2, 5);
    if (g_small)
        case_chain(&r, 128, 4, 2, 4, 0, 1, 2, 5);
    else
        case_chain(&r, 128, 4, 16, 32, 0, 1, 4, 5);

    case_refusals();

    case_split_heads(&r, 1, 16, 256); /* qwen3next's gated attention: 16 heads of 256 */
    case_split_heads(&r, 7, 5, 64);
    case_split_heads(&r, 3, 2, 37);
    case_mul_sigmoid(&r, 1);
    case_mul_sigmoid(&r, 16 * 256 * 7 + 5);
    if (!g_small)
        case_mul_sigmoid(&r, 1 << 20);
    case_add_gated(&r, 1, 2048);
    case_add_gated(&r, 64, 2048);
    case_add_gated(&r, 7, 64);
    case_add_gated(&r, 64, 64);
    return tap_done();
}
