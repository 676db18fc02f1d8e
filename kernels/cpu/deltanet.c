/* The gated DeltaNet of qwen3next / qwen35moe (docs/models.md) over one sequence's
 * rows: the causal depthwise convolution with its window carried in the state, the
 * silu, the per-head L2 norms, the gated delta rule on each v head's S x S state and
 * the gated RMSNorm of its output. The rows of a sequence are sequential in the
 * recurrence, its heads are not: the convolution goes over channels, the recurrence
 * over heads, each split over the pool, and no split changes a bit. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kcpu.h"

typedef struct dn_args {
    const kcpu_dnet_t *d;
    float *qkv, *conv, *M, *out;
    const float *z, *beta, *g;
    int64_t n;
} dn_args_t;

static float silu(float x) { return x / (1.0f + expf(-x)); }

/* Channels [lo, hi): each row's window (the state's K - 1 rows, then the row),
 * weighted, silu'd in place; the state keeps the last K - 1 inputs. */
static void dn_conv(void *p, int64_t lo, int64_t hi)
{
    const dn_args_t *a = p;
    const kcpu_dnet_t *d = a->d;
    const int64_t K = d->K, ch = kcpu_dnet_channels(d);
    for (int64_t c = lo; c < hi; c++) {
        const float *w = d->conv_w + c * K;
        float win[64];
        for (int64_t j = 0; j < K - 1; j++)
            win[j] = a->conv[j * ch + c];
        for (int64_t t = 0; t < a->n; t++) {
            float *x = &a->qkv[t * ch + c];
            win[K - 1] = *x;
            float u = 0.0f;
            for (int64_t j = 0; j < K; j++)
                u += w[j] * win[j];
            for (int64_t j = 0; j < K - 1; j++)
                win[j] = win[j + 1];
            *x = silu(u);
        }
        for (int64_t j = 0; j < K - 1; j++)
            a->conv[j * ch + c] = win[j];
    }
}

/* x (len) / max(|x|, eps), the sum of squares in double. */
static void l2_norm(float *x, int64_t len, float eps, float scale)
{
    double ss = 0.0;
    for (int64_t i = 0; i < len; i++)
        ss += (double)x[i] * (double)x[i];
    const float nrm = sqrtf((float)ss);
    const float s = scale / (nrm > eps ? nrm : eps);
    for (int64_t i = 0; i < len; i++)
        x[i] *= s;
}

/* Rows [lo, hi): q and k heads L2-normed, q scaled by 1/sqrt(S). */
static void dn_norm(void *p, int64_t lo, int64_t hi)
{
    const dn_args_t *a = p;
    const kcpu_dnet_t *d = a->d;
    const int64_t S = d->S, ch = kcpu_dnet_channels(d);
    const float qs = 1.0f / sqrtf((float)S);
    for (int64_t t = lo; t < hi; t++)
        for (int64_t h = 0; h < 2 * d->Hk; h++)
            l2_norm(a->qkv + t * ch + h * S, S, d->eps, h < d->Hk ? qs : 1.0f);
}

/* V heads [lo, hi): the delta rule over the rows, then the gated norm. */
static void dn_heads(void *p, int64_t lo, int64_t hi)
{
    const dn_args_t *a = p;
    const kcpu_dnet_t *d = a->d;
    const int64_t S = d->S, Hk = d->Hk, Hv = d->Hv, r = Hv / Hk, ch = kcpu_dnet_channels(d);
    float o[4096], dd[4096];
    for (int64_t h = lo; h < hi; h++) {
        const int64_t kh = d->tiled ? h % Hk : h / r;
        float *M = a->M + h * S * S;
        for (int64_t t = 0; t < a->n; t++) {
            const float *q = a->qkv + t * ch + kh * S;
            const float *k = a->qkv + t * ch + (Hk + kh) * S;
            const float *v = a->qkv + t * ch + 2 * Hk * S + h * S;
            const float decay = expf(a->g[t * Hv + h]), beta = a->beta[t * Hv + h];
            for (int64_t j = 0; j < S; j++)
                dd[j] = 0.0f;
            for (int64_t i = 0; i < S; i++) {
                float *mi = M + i * S;
                const float ki = k[i];
                for (int64_t j = 0; j < S; j++) {
                    mi[j] *= decay;
                    dd[j] += mi[j] * ki;
                }
            }
            for (int64_t j = 0; j < S; j++) {
                dd[j] = beta * (v[j] - dd[j]);
                o[j] = 0.0f;
            }
            for (int64_t i = 0; i < S; i++) {
                float *mi = M + i * S;
                const float ki = k[i], qi = q[i];
                for (int64_t j = 0; j < S; j++) {
                    mi[j] += ki * dd[j];
                    o[j] += mi[j] * qi;
                }
            }
            /* rmsnorm(o, norm) * silu(z) */
            double ss = 0.0;
            for (int64_t j = 0; j < S; j++)
                ss += (double)o[j] * (double)o[j];
            const float s = (float)(1.0 / sqrt(ss / (double)S + (double)d->eps));
            const float *z = a->z + t * Hv * S + h * S;
            float *y = a->out + t * Hv * S + h * S;
            for (int64_t j = 0; j < S; j++)
                y[j] = o[j] * s * d->norm[j] * silu(z[j]);
        }
    }
}

void kcpu_deltanet(kcpu_ctx_t *c, const kcpu_dnet_t *d, float *qkv, const float *z, const float *beta,
                   const float *g, float *conv, float *M, float *out, int64_t n)
{
    dn_args_t a = {.d = d, .qkv = qkv, .conv = conv, .M = M, .out = out, .z = z, .beta = beta, .g = g, .n = n};
    const int64_t ch = kcpu_dnet_channels(d);
    kcpu_parallel_for(c, ch, 256, dn_conv, &a);
    kcpu_parallel_for(c, n, 8, dn_norm, &a);
    kcpu_parallel_for(c, d->Hv, 2, dn_heads, &a);
}

void kcpu_dnet_gates(const kcpu_dnet_t *d, const float *b, int64_t b_ld, const float *al, int64_t al_ld,
                     int64_t n, float *beta, float *g)
{
    const int64_t Hv = d->Hv, r = Hv / d->Hk;
    for (int64_t t = 0; t < n; t++)
        for (int64_t h = 0; h < Hv; h++) {
            float bv, av;
            if (d->ba) { /* one row of 2 Hv, grouped by k head: [b(r) a(r)] each */
                const int64_t kh = h / r, i = h % r;
                bv = b[t * b_ld + 2 * r * kh + i];
                av = b[t * b_ld + 2 * r * kh + r + i];
            } else {
                bv = b[t * b_ld + h];
                av = al[t * al_ld + h];
            }
            const float x = av + d->dt_bias[h];
            const float sp = x > 20.0f ? x : log1pf(expf(x));
            beta[t * Hv + h] = 1.0f / (1.0f + expf(-bv));
            g[t * Hv + h] = sp * d->a[h];
        }
}
