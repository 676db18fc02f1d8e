/* Tests for kernels/cpu/deltanet.c: the gated DeltaNet layer core against a double
 * reference written from docs/models.md (qwen3next / qwen35moe, steps 2-6), bitwise
 * equality however a sequence's rows are split into calls and over however many
 * threads, the q/k head mapping, and the gates' two projection layouts. Random
 * inputs change every run; the seed is printed, BLOOMERY_TEST_SEED replays. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kcpu.h"
#include "test_seed.h"

static float *fmalloc(int64_t n)
{
    float *p = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    assert_non_null(p);
    return p;
}

static double *dmalloc(int64_t n)
{
    double *p = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    assert_non_null(p);
    return p;
}

static float *fdup(const float *x, int64_t n)
{
    float *p = fmalloc(n);
    memcpy(p, x, sizeof(float) * (size_t)n);
    return p;
}

static void rand_vec(rng_t *r, float *x, int64_t n, float lo, float hi)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = rng_f(r, lo, hi);
}

static kcpu_ctx_t *make_ctx(int threads)
{
    kcpu_ctx_t *c = NULL;
    bl_err_t err = {0};
    /* The DeltaNet ops use no scratch: the smallest limits do. */
    const kcpu_limits_t lim = {.max_cols = 64, .max_batch = 8, .max_ctx = 8, .head_dim = 8};
    assert_int_equal(kcpu_ctx_create(&c, threads, KCPU_PRECISE, &lim, &err), 0);
    return c;
}

// --- a layer and a sequence's rows --------------------------------------------------------

typedef struct layer {
    kcpu_dnet_t d;
    float *conv_w;      /* (C, K) */
    float *dt_bias, *a; /* (Hv) */
    float *norm;        /* (S) */
} layer_t;

static void layer_init(rng_t *r, layer_t *L, int64_t K, int64_t S, int64_t Hk, int64_t Hv, int tiled)
{
    memset(L, 0, sizeof *L);
    L->d = (kcpu_dnet_t){.K = K, .S = S, .Hk = Hk, .Hv = Hv, .tiled = tiled, .eps = 1e-6f};
    const int64_t C = kcpu_dnet_channels(&L->d);
    L->conv_w = fmalloc(C * K);
    L->dt_bias = fmalloc(Hv);
    L->a = fmalloc(Hv);
    L->norm = fmalloc(S);
    rand_vec(r, L->conv_w, C * K, -0.6f, 0.6f);
    rand_vec(r, L->dt_bias, Hv, -1.0f, 1.0f);
    for (int64_t h = 0; h < Hv; h++) /* ssm_a holds -exp(A_log) */
        L->a[h] = -expf(rng_f(r, -2.0f, 1.0f));
    rand_vec(r, L->norm, S, 0.5f, 1.5f);
    L->d.conv_w = L->conv_w;
    L->d.dt_bias = L->dt_bias;
    L->d.a = L->a;
    L->d.norm = L->norm;
}

static void layer_free(layer_t *L)
{
    free(L->conv_w);
    free(L->dt_bias);
    free(L->a);
    free(L->norm);
}

/* One sequence's rows and the state before them (a sequence already under way, so
 * neither state is zero). */
typedef struct rows {
    int64_t n;
    float *qkv;      /* (n, C) the projections, before the convolution */
    float *z;        /* (n, Hv S) */
    float *beta, *g; /* (n, Hv) */
    float *conv;     /* (K - 1, C) */
    float *M;        /* (Hv, S, S) */
} rows_t;

static void rows_init(rng_t *r, rows_t *R, const layer_t *L, int64_t n)
{
    const kcpu_dnet_t *d = &L->d;
    const int64_t C = kcpu_dnet_channels(d), Hv = d->Hv, S = d->S;
    R->n = n;
    R->qkv = fmalloc(n * C);
    R->z = fmalloc(n * Hv * S);
    R->beta = fmalloc(n * Hv);
    R->g = fmalloc(n * Hv);
    R->conv = fmalloc((d->K - 1) * C);
    R->M = fmalloc(Hv * S * S);
    rand_vec(r, R->qkv, n * C, -2.0f, 2.0f);
    rand_vec(r, R->z, n * Hv * S, -3.0f, 3.0f);
    rand_vec(r, R->beta, n * Hv, 0.02f, 0.98f);
    rand_vec(r, R->g, n * Hv, -2.0f, -0.01f);
    rand_vec(r, R->conv, (d->K - 1) * C, -2.0f, 2.0f);
    rand_vec(r, R->M, Hv * S * S, -0.5f, 0.5f);
}

static void rows_free(rows_t *R)
{
    free(R->qkv);
    free(R->z);
    free(R->beta);
    free(R->g);
    free(R->conv);
    free(R->M);
}

/* What a run leaves: the convolved and normed rows, the states after them, the output. */
typedef struct result {
    float *qkv;  /* (n, C) */
    float *conv; /* (K - 1, C) */
    float *M;    /* (Hv, S, S) */
    float *out;  /* (n, Hv S) */
} result_t;

static void result_free(result_t *res)
{
    free(res->qkv);
    free(res->conv);
    free(res->M);
    free(res->out);
}

/* The rows through kcpu_deltanet in calls of at most chunk rows, the state carried
 * from call to call; chunk 0 makes one call of all of them (n may be 0). */
static result_t run(kcpu_ctx_t *c, const layer_t *L, const rows_t *R, int64_t chunk)
{
    const kcpu_dnet_t *d = &L->d;
    const int64_t C = kcpu_dnet_channels(d), HS = d->Hv * d->S, n = R->n;
    result_t res = {
        .qkv = fdup(R->qkv, n * C),
        .conv = fdup(R->conv, (d->K - 1) * C),
        .M = fdup(R->M, d->Hv * d->S * d->S),
        .out = fmalloc(n * HS),
    };
    if (chunk <= 0) {
        kcpu_deltanet(c, d, res.qkv, R->z, R->beta, R->g, res.conv, res.M, res.out, n);
        return res;
    }
    for (int64_t t = 0; t < n; t += chunk) {
        const int64_t m = n - t < chunk ? n - t : chunk;
        kcpu_deltanet(c, d, res.qkv + t * C, R->z + t * HS, R->beta + t * d->Hv, R->g + t * d->Hv, res.conv,
                      res.M, res.out + t * HS, m);
    }
    return res;
}

// --- the double reference (docs/models.md, qwen3next steps 3-6) -----------------------------

static double silu_d(double x) { return x / (1.0 + exp(-x)); }

/* qkv (n, C) convolved, silu'd and normed; conv (K - 1, C) and M (Hv, S, S) the
 * states after the rows; out (n, Hv S). */
static void ref_deltanet(const layer_t *L, const rows_t *R, double *qkv, double *conv, double *M, double *out)
{
    const kcpu_dnet_t *d = &L->d;
    const int64_t K = d->K, S = d->S, Hk = d->Hk, Hv = d->Hv, C = kcpu_dnet_channels(d), n = R->n;
    const int64_t r = Hv / Hk;

    /* Position p in [-(K - 1), n): the state's rows, then the new ones. */
#define X(p, c) ((p) < 0 ? (double)R->conv[((p) + K - 1) * C + (c)] : (double)R->qkv[(p) * C + (c)])
    for (int64_t t = 0; t < n; t++)
        for (int64_t c = 0; c < C; c++) {
            double u = 0.0;
            for (int64_t j = 0; j < K; j++)
                u += (double)L->conv_w[c * K + j] * X(t - K + 1 + j, c);
            qkv[t * C + c] = silu_d(u);
        }
    for (int64_t j = 0; j < K - 1; j++)
        for (int64_t c = 0; c < C; c++)
            conv[j * C + c] = X(n - K + 1 + j, c);
#undef X

    for (int64_t t = 0; t < n; t++)
        for (int64_t h = 0; h < 2 * Hk; h++) {
            double *x = qkv + t * C + h * S, ss = 0.0;
            for (int64_t i = 0; i < S; i++)
                ss += x[i] * x[i];
            const double nrm = sqrt(ss) > (double)d->eps ? sqrt(ss) : (double)d->eps;
            const double s = (h < Hk ? 1.0 / sqrt((double)S) : 1.0) / nrm;
            for (int64_t i = 0; i < S; i++)
                x[i] *= s;
        }

    for (int64_t i = 0; i < Hv * S * S; i++)
        M[i] = R->M[i];
    double *o = dmalloc(S), *dd = dmalloc(S);
    for (int64_t h = 0; h < Hv; h++) {
        const int64_t kh = d->tiled ? h % Hk : h / r;
        double *Mh = M + h * S * S;
        for (int64_t t = 0; t < n; t++) {
            const double *q = qkv + t * C + kh * S;
            const double *k = qkv + t * C + (Hk + kh) * S;
            const double *v = qkv + t * C + 2 * Hk * S + h * S;
            const double decay = exp((double)R->g[t * Hv + h]), beta = R->beta[t * Hv + h];
            for (int64_t i = 0; i < S * S; i++)
                Mh[i] *= decay;
            for (int64_t j = 0; j < S; j++) {
                double mk = 0.0;
                for (int64_t i = 0; i < S; i++)
                    mk += Mh[i * S + j] * k[i];
                dd[j] = beta * (v[j] - mk);
            }
            for (int64_t i = 0; i < S; i++)
                for (int64_t j = 0; j < S; j++)
                    Mh[i * S + j] += k[i] * dd[j];
            double ss = 0.0;
            for (int64_t j = 0; j < S; j++) {
                o[j] = 0.0;
                for (int64_t i = 0; i < S; i++)
                    o[j] += Mh[i * S + j] * q[i];
                ss += o[j] * o[j];
            }
            const double rms = sqrt(ss / (double)S + (double)d->eps);
            for (int64_t j = 0; j < S; j++)
                out[t * Hv * S + h * S + j] =
                    o[j] / rms * (double)L->norm[j] * silu_d((double)R->z[t * Hv * S + h * S + j]);
        }
    }
    free(o);
    free(dd);
}

// --- comparisons ---------------------------------------------------------------------------

/* Mismatches of got against ref beyond rel * (1 + max |ref|); the first few printed. */
static int check_close(const char *what, const float *got, const double *ref, int64_t n, double rel)
{
    double mx = 0.0;
    for (int64_t i = 0; i < n; i++)
        mx = fabs(ref[i]) > mx ? fabs(ref[i]) : mx;
    const double tol = rel * (1.0 + mx);
    int bad = 0;
    for (int64_t i = 0; i < n; i++)
        if (!(fabs((double)got[i] - ref[i]) <= tol) && bad++ < 5)
            print_error("%s[%lld] = %.9g, double %.9g (tol %.3g)\n", what, (long long)i, (double)got[i], ref[i],
                        tol);
    return bad;
}

/* Elements whose bits differ; the first few printed. */
static int check_bits(const char *what, const float *a, const float *b, int64_t n)
{
    int bad = 0;
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0 && bad++ < 5)
            print_error("%s[%lld]: %.9g vs %.9g\n", what, (long long)i, (double)a[i], (double)b[i]);
    return bad;
}

static int check_result_bits(const char *what, const layer_t *L, const rows_t *R, const result_t *x,
                             const result_t *y)
{
    const kcpu_dnet_t *d = &L->d;
    const int64_t C = kcpu_dnet_channels(d);
    char name[96];
    int bad = 0;
    snprintf(name, sizeof name, "%s qkv", what);
    bad += check_bits(name, x->qkv, y->qkv, R->n * C);
    snprintf(name, sizeof name, "%s out", what);
    bad += check_bits(name, x->out, y->out, R->n * d->Hv * d->S);
    snprintf(name, sizeof name, "%s conv", what);
    bad += check_bits(name, x->conv, y->conv, (d->K - 1) * C);
    snprintf(name, sizeof name, "%s M", what);
    bad += check_bits(name, x->M, y->M, d->Hv * d->S * d->S);
    return bad;
}

// --- kcpu_deltanet -----------------------------------------------------------------------------

typedef struct shape {
    int64_t K, S, Hk, Hv;
    int tiled;
} shape_t;

/* Both convolution widths, each state size, r = 2 repeated and tiled, and Hk = Hv. */
static const shape_t shapes[] = {
    {4, 8, 2, 4, 0},  {4, 16, 2, 4, 1}, {4, 32, 2, 4, 0}, {2, 8, 2, 4, 1},
    {2, 32, 2, 4, 1}, {2, 16, 2, 4, 0}, {4, 16, 2, 2, 0}, {2, 32, 3, 3, 1},
};

/* Each shape at 1, 5 and 37 rows from non-zero states, over three threads: the
 * output, the rows left in qkv and both states against the double reference. Float
 * rounding in o reaches the output through its RMSNorm, hence 1e-4 of the largest. */
static void test_deltanet_matches_double(void **state)
{
    (void)state;
    rng_t r = rng_for(1);
    const int64_t ns[] = {1, 5, 37};
    kcpu_ctx_t *c = make_ctx(3);
    int bad = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
            const shape_t *sh = &shapes[si];
            layer_t L;
            rows_t R;
            layer_init(&r, &L, sh->K, sh->S, sh->Hk, sh->Hv, sh->tiled);
            rows_init(&r, &R, &L, ns[ni]);
            const int64_t C = kcpu_dnet_channels(&L.d), n = R.n, HS = sh->Hv * sh->S;
            double *qkv = dmalloc(n * C), *conv = dmalloc((sh->K - 1) * C), *M = dmalloc(sh->Hv * sh->S * sh->S),
                   *out = dmalloc(n * HS);
            ref_deltanet(&L, &R, qkv, conv, M, out);
            result_t res = run(c, &L, &R, 0);
            char what[96];
            int b = 0;
            snprintf(what, sizeof what, "K%lld S%lld Hk%lld Hv%lld tiled%d n%lld out", (long long)sh->K,
                     (long long)sh->S, (long long)sh->Hk, (long long)sh->Hv, sh->tiled, (long long)n);
            b += check_close(what, res.out, out, n * HS, 1e-4);
            b += check_close("  qkv", res.qkv, qkv, n * C, 1e-5);
            b += check_close("  M", res.M, M, sh->Hv * sh->S * sh->S, 1e-4);
            /* The window holds inputs as they came: exact. */
            b += check_close("  conv", res.conv, conv, (sh->K - 1) * C, 0.0);
            if (b)
                print_error("  (in %s)\n", what);
            bad += b;
            free(qkv);
            free(conv);
            free(M);
            free(out);
            result_free(&res);
            rows_free(&R);
            layer_free(&L);
        }
    kcpu_ctx_destroy(c);
    assert_int_equal(bad, 0);
}

/* A sequence's rows in one call, one row a call, and calls of 3 (the last short):
 * the state carried between calls is the whole story, so every bit agrees. K = 4
 * makes single rows shorter than the window. */
static void test_deltanet_split_rows_bitwise(void **state)
{
    (void)state;
    rng_t r = rng_for(2);
    const shape_t sh[] = {{4, 32, 2, 4, 0}, {2, 16, 2, 4, 1}, {4, 8, 3, 3, 0}};
    kcpu_ctx_t *c = make_ctx(3);
    int bad = 0;
    for (size_t si = 0; si < sizeof sh / sizeof sh[0]; si++) {
        layer_t L;
        rows_t R;
        layer_init(&r, &L, sh[si].K, sh[si].S, sh[si].Hk, sh[si].Hv, sh[si].tiled);
        rows_init(&r, &R, &L, 37);
        result_t all = run(c, &L, &R, 0), one = run(c, &L, &R, 1), three = run(c, &L, &R, 3);
        bad += check_result_bits("1 call vs 1 row a call", &L, &R, &all, &one);
        bad += check_result_bits("1 call vs 3 rows a call", &L, &R, &all, &three);
        result_free(&all);
        result_free(&one);
        result_free(&three);
        rows_free(&R);
        layer_free(&L);
    }
    kcpu_ctx_destroy(c);
    assert_int_equal(bad, 0);
}

/* One thread, three threads and no context give the same bits. The shapes reach
 * every split: at least 256 channels (the convolution's threshold), 8 rows (the
 * norms') and 2 v heads (the recurrence's). */
static void test_deltanet_threads_bitwise(void **state)
{
    (void)state;
    rng_t r = rng_for(3);
    const shape_t sh[] = {{4, 32, 2, 8, 0}, {2, 16, 4, 8, 1}, {4, 32, 2, 4, 1}};
    kcpu_ctx_t *c1 = make_ctx(1), *c3 = make_ctx(3);
    int bad = 0;
    for (size_t si = 0; si < sizeof sh / sizeof sh[0]; si++) {
        layer_t L;
        rows_t R;
        layer_init(&r, &L, sh[si].K, sh[si].S, sh[si].Hk, sh[si].Hv, sh[si].tiled);
        assert_true(kcpu_dnet_channels(&L.d) >= 256);
        rows_init(&r, &R, &L, 37);
        result_t x1 = run(c1, &L, &R, 0), x3 = run(c3, &L, &R, 0), x0 = run(NULL, &L, &R, 0);
        bad += check_result_bits("1 thread vs 3", &L, &R, &x1, &x3);
        bad += check_result_bits("1 thread vs no ctx", &L, &R, &x1, &x0);
        result_free(&x1);
        result_free(&x3);
        result_free(&x0);
        rows_free(&R);
        layer_free(&L);
    }
    kcpu_ctx_destroy(c1);
    kcpu_ctx_destroy(c3);
    assert_int_equal(bad, 0);
}

/* Hk = 2, Hv = 4: v heads 0 and 3 read q/k heads 0 and 1 either way, heads 1 and 2
 * swap them between repeated (h / 2) and tiled (h % 2). The same inputs must give
 * equal bits on the first pair and different outputs on the second. */
static void test_deltanet_head_mapping_tiled(void **state)
{
    (void)state;
    rng_t r = rng_for(4);
    layer_t L;
    rows_t R;
    layer_init(&r, &L, 4, 16, 2, 4, 0);
    rows_init(&r, &R, &L, 5);
    const int64_t S = L.d.S, HS = L.d.Hv * S;
    result_t rep = run(NULL, &L, &R, 0);
    L.d.tiled = 1;
    result_t til = run(NULL, &L, &R, 0);
    int same[4] = {1, 1, 1, 1};
    for (int64_t t = 0; t < R.n; t++)
        for (int64_t h = 0; h < 4; h++)
            if (memcmp(rep.out + t * HS + h * S, til.out + t * HS + h * S, sizeof(float) * (size_t)S) != 0)
                same[h] = 0;
    assert_true(same[0]);
    assert_true(same[3]);
    assert_false(same[1]);
    assert_false(same[2]);
    result_free(&rep);
    result_free(&til);
    rows_free(&R);
    layer_free(&L);
}

/* No rows: both states stay as they were, with and without threads. */
static void test_deltanet_zero_rows_keeps_state(void **state)
{
    (void)state;
    rng_t r = rng_for(5);
    layer_t L;
    rows_t R;
    layer_init(&r, &L, 4, 32, 2, 4, 1);
    rows_init(&r, &R, &L, 0);
    const int64_t C = kcpu_dnet_channels(&L.d), nM = L.d.Hv * L.d.S * L.d.S;
    kcpu_ctx_t *c = make_ctx(3);
    result_t x0 = run(NULL, &L, &R, 0), x3 = run(c, &L, &R, 0);
    int bad = 0;
    bad += check_bits("no ctx conv", x0.conv, R.conv, (L.d.K - 1) * C);
    bad += check_bits("no ctx M", x0.M, R.M, nM);
    bad += check_bits("3 threads conv", x3.conv, R.conv, (L.d.K - 1) * C);
    bad += check_bits("3 threads M", x3.M, R.M, nM);
    result_free(&x0);
    result_free(&x3);
    kcpu_ctx_destroy(c);
    rows_free(&R);
    layer_free(&L);
    assert_int_equal(bad, 0);
}

// --- kcpu_dnet_gates ----------------------------------------------------------------------

/* For r = 1, 2, 3: separate b and alpha rows (padded strides), and the fused row
 * built from them by k head, [b(r) a(r)], give the same bits; both match
 * sigmoid(b) and softplus(alpha + dt_bias) * a in double, and beta lies in (0, 1). */
static void test_dnet_gates_fused_equals_separate(void **state)
{
    (void)state;
    rng_t r = rng_for(6);
    const int64_t hk_hv[][2] = {{4, 4}, {2, 4}, {2, 6}, {1, 3}};
    const int64_t n = 7;
    int bad = 0;
    for (size_t ci = 0; ci < sizeof hk_hv / sizeof hk_hv[0]; ci++) {
        const int64_t Hk = hk_hv[ci][0], Hv = hk_hv[ci][1], rr = Hv / Hk;
        layer_t L;
        layer_init(&r, &L, 4, 8, Hk, Hv, 0);
        const int64_t b_ld = Hv + 3, al_ld = Hv + 5, ba_ld = 2 * Hv + 1;
        float *b = fmalloc(n * b_ld), *al = fmalloc(n * al_ld), *ba = fmalloc(n * ba_ld);
        rand_vec(&r, b, n * b_ld, -8.0f, 8.0f);
        rand_vec(&r, al, n * al_ld, -6.0f, 6.0f);
        for (int64_t t = 0; t < n; t++)
            for (int64_t h = 0; h < Hv; h++) {
                const int64_t kh = h / rr, i = h % rr;
                ba[t * ba_ld + 2 * rr * kh + i] = b[t * b_ld + h];
                ba[t * ba_ld + 2 * rr * kh + rr + i] = al[t * al_ld + h];
            }
        float *beta_s = fmalloc(n * Hv), *g_s = fmalloc(n * Hv), *beta_f = fmalloc(n * Hv), *g_f = fmalloc(n * Hv);
        kcpu_dnet_gates(&L.d, b, b_ld, al, al_ld, n, beta_s, g_s);
        L.d.ba = 1;
        kcpu_dnet_gates(&L.d, ba, ba_ld, NULL, 0, n, beta_f, g_f);
        bad += check_bits("beta fused vs separate", beta_f, beta_s, n * Hv);
        bad += check_bits("g fused vs separate", g_f, g_s, n * Hv);
        double *beta_d = dmalloc(n * Hv), *g_d = dmalloc(n * Hv);
        for (int64_t t = 0; t < n; t++)
            for (int64_t h = 0; h < Hv; h++) {
                const double x = (double)al[t * al_ld + h] + (double)L.dt_bias[h];
                beta_d[t * Hv + h] = 1.0 / (1.0 + exp(-(double)b[t * b_ld + h]));
                g_d[t * Hv + h] = (x > 20.0 ? x : log1p(exp(x))) * (double)L.a[h];
                if (!(beta_s[t * Hv + h] > 0.0f && beta_s[t * Hv + h] < 1.0f) && bad++ < 5)
                    print_error("beta[%lld][%lld] = %.9g outside (0, 1)\n", (long long)t, (long long)h,
                                (double)beta_s[t * Hv + h]);
            }
        bad += check_close("beta", beta_s, beta_d, n * Hv, 1e-6);
        bad += check_close("g", g_s, g_d, n * Hv, 1e-6);
        free(b);
        free(al);
        free(ba);
        free(beta_s);
        free(g_s);
        free(beta_f);
        free(g_f);
        free(beta_d);
        free(g_d);
        layer_free(&L);
    }
    assert_int_equal(bad, 0);
}

/* Above 20 softplus is the identity, so g is exactly (alpha + dt_bias) * a in float,
 * in both layouts. */
static void test_dnet_gates_softplus_linear_above_20(void **state)
{
    (void)state;
    rng_t r = rng_for(7);
    const int64_t Hk = 2, Hv = 4, rr = 2, n = 5;
    layer_t L;
    layer_init(&r, &L, 4, 8, Hk, Hv, 0);
    float b[5 * 4], al[5 * 4], ba[5 * 8], beta[5 * 4], g[5 * 4], beta_f[5 * 4], g_f[5 * 4];
    rand_vec(&r, b, n * Hv, -4.0f, 4.0f);
    rand_vec(&r, al, n * Hv, 21.5f, 60.0f);
    for (int64_t t = 0; t < n; t++)
        for (int64_t h = 0; h < Hv; h++) {
            ba[t * 2 * Hv + 2 * rr * (h / rr) + h % rr] = b[t * Hv + h];
            ba[t * 2 * Hv + 2 * rr * (h / rr) + rr + h % rr] = al[t * Hv + h];
        }
    kcpu_dnet_gates(&L.d, b, Hv, al, Hv, n, beta, g);
    L.d.ba = 1;
    kcpu_dnet_gates(&L.d, ba, 2 * Hv, NULL, 0, n, beta_f, g_f);
    int bad = 0;
    for (int64_t t = 0; t < n; t++)
        for (int64_t h = 0; h < Hv; h++) {
            const float x = al[t * Hv + h] + L.dt_bias[h];
            const float want = x * L.a[h];
            if ((g[t * Hv + h] != want || g_f[t * Hv + h] != want) && bad++ < 5)
                print_error("g[%lld][%lld] = %.9g / %.9g (fused), want %.9g\n", (long long)t, (long long)h,
                            (double)g[t * Hv + h], (double)g_f[t * Hv + h], (double)want);
        }
    layer_free(&L);
    assert_int_equal(bad, 0);
}

int main(void)
{
    test_seed_init("test_kernels_cpu_deltanet");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deltanet_matches_double),
        cmocka_unit_test(test_deltanet_split_rows_bitwise),
        cmocka_unit_test(test_deltanet_threads_bitwise),
        cmocka_unit_test(test_deltanet_head_mapping_tiled),
        cmocka_unit_test(test_deltanet_zero_rows_keeps_state),
        cmocka_unit_test(test_dnet_gates_fused_equals_separate),
        cmocka_unit_test(test_dnet_gates_softplus_linear_above_20),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
