/* Routing heat (heat.h). Decay without touching every count per step: a selection
 * at step t is added with weight g^t (g = 2^(1/half_life)), and a heat is read as
 * the sum divided by g^now; when the weights grow past 2^500 every sum is scaled
 * down once, which leaves every ratio as it was. */
#include "heat.h"

#include <math.h>
#include <stdlib.h>

struct bl_heat {
    int64_t n_layer, n_expert;
    double g, w;        /* growth per step, the weight of a selection now */
    double *sum;        /* (n_layer * n_expert) weighted selections */
    uint64_t *count;    /* (n_layer * n_expert) plain selections */
};

int bl_heat_create(bl_heat_t **out, int64_t n_layer, int64_t n_expert, double half_life, bl_err_t *err)
{
    *out = NULL;
    if (n_layer < 1 || n_expert < 1 || n_layer > (1 << 16) || n_expert > (1 << 16) || !(half_life > 0))
        return bl_err_set(err, BL_EINVAL, "heat of %lld layers x %lld experts, half-life %g steps", (long long)n_layer,
                          (long long)n_expert, half_life);
    bl_heat_t *h = calloc(1, sizeof *h);
    const size_t n = (size_t)n_layer * (size_t)n_expert;
    if (!h || !(h->sum = calloc(n, sizeof *h->sum)) || !(h->count = calloc(n, sizeof *h->count))) {
        bl_heat_free(h);
        return bl_err_set(err, BL_ENOMEM, "out of memory for the routing heat");
    }
    h->n_layer = n_layer;
    h->n_expert = n_expert;
    h->g = half_life >= 1e9 ? 1.0 : exp2(1.0 / half_life);
    h->w = 1.0;
    *out = h;
    return 0;
}

void bl_heat_free(bl_heat_t *h)
{
    if (!h)
        return;
    free(h->sum);
    free(h->count);
    free(h);
}

void bl_heat_add(bl_heat_t *h, int64_t l, const int32_t *ids, int64_t n)
{
    if (l < 0 || l >= h->n_layer)
        return;
    double *s = h->sum + l * h->n_expert;
    uint64_t *c = h->count + l * h->n_expert;
    for (int64_t i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < h->n_expert) {
            s[ids[i]] += h->w;
            c[ids[i]]++;
        }
}

void bl_heat_step(bl_heat_t *h)
{
    h->w *= h->g;
    if (h->w > 0x1p500) {
        const size_t n = (size_t)h->n_layer * (size_t)h->n_expert;
        for (size_t i = 0; i < n; i++)
            h->sum[i] /= h->w;
        h->w = 1.0;
    }
}

double bl_heat_of(const bl_heat_t *h, int64_t l, int64_t e)
{
    if (l < 0 || l >= h->n_layer || e < 0 || e >= h->n_expert)
        return 0.0;
    return h->sum[l * h->n_expert + e] / h->w;
}

uint64_t bl_heat_count(const bl_heat_t *h, int64_t l, int64_t e)
{
    if (l < 0 || l >= h->n_layer || e < 0 || e >= h->n_expert)
        return 0;
    return h->count[l * h->n_expert + e];
}

uint64_t bl_heat_layer_count(const bl_heat_t *h, int64_t l)
{
    uint64_t t = 0;
    for (int64_t e = 0; e < h->n_expert && l >= 0 && l < h->n_layer; e++)
        t += h->count[l * h->n_expert + e];
    return t;
}

int64_t bl_heat_top(const bl_heat_t *h, int64_t l, int64_t k, int32_t *ids)
{
    if (l < 0 || l >= h->n_layer || k <= 0)
        return 0;
    if (k > h->n_expert)
        k = h->n_expert;
    const double *s = h->sum + l * h->n_expert;
    int64_t m = 0;
    /* insertion into the k best so far: n_expert is small (a few hundred) */
    for (int64_t e = 0; e < h->n_expert; e++) {
        int64_t at = m < k ? m : k;
        while (at > 0 && s[ids[at - 1]] < s[e])
            at--;
        if (at >= k)
            continue;
        for (int64_t j = (m < k ? m : k - 1); j > at; j--)
            ids[j] = ids[j - 1];
        ids[at] = (int32_t)e;
        if (m < k)
            m++;
    }
    return m;
}

int64_t bl_heat_n_layer(const bl_heat_t *h) { return h->n_layer; }
int64_t bl_heat_n_expert(const bl_heat_t *h) { return h->n_expert; }
