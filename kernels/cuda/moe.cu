/* MoE routing on the card: the router's scores, top-k (by groups, with a bias),
 * the weights (kcuda_route_t). One warp per row; each lane holds n_expert / 32
 * logits in registers, so k rounds of a warp-wide argmax pick the experts without
 * touching memory again. */
#include <math.h>

#include "kcuda_impl.cuh"

#define ROUTE_WARPS 4

/* grid (ceil(n / ROUTE_WARPS)): a warp per row (kc_moe_route_row), PL logits per
 * lane (the fewest that hold n_expert: the k argmax rounds walk them all). */
template <int PL, bool GEN>
__global__ void __launch_bounds__(ROUTE_WARPS * 32)
moe_route_kernel(const float *logits, int64_t n, int n_expert, int k, kcuda_route_t r, int32_t *ids, float *w)
{
    kc_wait_prior();
    kc_allow_next();
    const int64_t row = (int64_t)blockIdx.x * ROUTE_WARPS + (threadIdx.x >> 5);
    if (row >= n)
        return;
    kc_moe_route_row<PL, GEN>(logits + row * n_expert, n_expert, k, r, ids + row * k, w + row * k, threadIdx.x & 31);
}

static __global__ void moe_remap_kernel(const int32_t *ids, int64_t n, const int32_t *table, int64_t n_expert,
                                        int32_t *out)
{
    kc_wait_prior(); /* ids come from the routing kernel before it */
    kc_allow_next();
    const int64_t s = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= n)
        return;
    const int32_t e = ids[s];
    out[s] = e >= 0 && e < n_expert ? table[e] : -1;
}

int kcuda_moe_remap(const int32_t *d_ids, int64_t n, const int32_t *d_table, int64_t n_expert, int32_t *d_out,
                    void *stream, bl_err_t *err)
{
    if (!d_ids || !d_table || !d_out || n < 1 || n > INT32_MAX || n_expert < 1)
        return bl_err_set(err, BL_EINVAL, "moe_remap: %lld slots of %lld experts", (long long)n, (long long)n_expert);
    KC_LAUNCH(err, moe_remap_kernel, (unsigned)kc_cdiv(n, 128), 128, 0, (cudaStream_t)stream, d_ids, n, d_table,
              n_expert, d_out);
    return 0;
}

int kcuda_route_plain(const kcuda_route_t *r)
{
    return r->gating == KCUDA_GATE_SOFTMAX && !r->d_bias && !r->d_logit_bias && r->scale == 1.0f &&
           !(r->n_group > 1 && r->topk_group > 0 && r->topk_group < r->n_group);
}

template <int PL>
static int route_launch(const float *d_logits, int64_t n, int64_t n_expert, int k, const kcuda_route_t *r,
                        int32_t *d_ids, float *d_w, cudaStream_t st, bl_err_t *err)
{
    const unsigned blocks = (unsigned)kc_cdiv(n, ROUTE_WARPS);
    if (kcuda_route_plain(r))
        KC_LAUNCH(err, (moe_route_kernel<PL, false>), blocks, ROUTE_WARPS * 32, 0, st, d_logits, n, (int)n_expert, k,
                  *r, d_ids, d_w);
    else
        KC_LAUNCH(err, (moe_route_kernel<PL, true>), blocks, ROUTE_WARPS * 32, 0, st, d_logits, n, (int)n_expert, k,
                  *r, d_ids, d_w);
    return 0;
}

int kcuda_moe_route(const float *d_logits, int64_t n, int64_t n_expert, int k, const kcuda_route_t *r,
                    int32_t *d_ids, float *d_w, void *stream, bl_err_t *err)
{
    if (!d_logits || !d_ids || !d_w || !r || n < 1 || n > INT32_MAX)
        return bl_err_set(err, BL_EINVAL, "moe_route: %lld rows", (long long)n);
    if (n_expert < 1 || n_expert > KCUDA_MOE_MAX_EXPERT || k < 1 || k > KCUDA_MOE_MAX_K || k > n_expert)
        return bl_err_set(err, BL_ENOTSUP, "moe_route: %d of %lld experts (at most %d of %d)", k,
                          (long long)n_expert, KCUDA_MOE_MAX_K, KCUDA_MOE_MAX_EXPERT);
    if (r->gating < KCUDA_GATE_SOFTMAX || r->gating > KCUDA_GATE_SOFTMAX_WEIGHT ||
        (r->n_group > 1 && r->topk_group > 0 && r->topk_group < r->n_group &&
         (r->n_group > 32 || n_expert % r->n_group != 0 || (int64_t)k > n_expert / r->n_group * r->topk_group)))
        return bl_err_set(err, BL_ENOTSUP, "moe_route: gating %d, %d of %d groups over %lld experts, %d chosen",
                          r->gating, r->topk_group, r->n_group, (long long)n_expert, k);
    cudaStream_t st = (cudaStream_t)stream;
    if (n_expert <= 128)
        return route_launch<4>(d_logits, n, n_expert, k, r, d_ids, d_w, st, err);
    if (n_expert <= 256)
        return route_launch<8>(d_logits, n, n_expert, k, r, d_ids, d_w, st, err);
    return route_launch<KCUDA_MOE_MAX_EXPERT / 32>(d_logits, n, n_expert, k, r, d_ids, d_w, st, err);
}

/* grid-stride over slots * F: slot s's expert id = ids[perm ? perm[s] : s]. */
static __global__ void experts_act_kernel(float *g, const float *u, int64_t ld, const int32_t *ids, const int32_t *perm,
                                          const float *gb, const float *ub, int64_t slots, int64_t F, int64_t n_expert,
                                          int act, __half *h16)
{
    kc_wait_prior();
    kc_allow_next();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < slots * F;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t s = i / F, f = i % F;
        const int32_t e = ids[perm ? perm[s] : s];
        const bool ok = e >= 0 && e < n_expert;
        float gv = g[s * ld + f], uv = u[s * ld + f];
        if (ok && gb)
            gv += gb[(int64_t)e * F + f];
        if (ok && ub)
            uv += ub[(int64_t)e * F + f];
        const float y = act == KCUDA_ACT_SWIGLU_OAI ? kc_act_oai(gv, uv) : kc_silu_mul(gv, uv);
        if (h16)
            h16[s * F + f] = __float2half_rn(y);
        else
            g[s * ld + f] = y;
    }
}

int kcuda_experts_act(float *d_g, const float *d_u, int64_t ld, const int32_t *d_ids, const int32_t *d_perm,
                      const float *d_gate_b, const float *d_up_b, int64_t slots, int64_t F, int64_t n_expert, int act,
                      void *d_h16, void *stream, bl_err_t *err)
{
    if (!d_g || !d_u || !d_ids || slots < 1 || F < 1 || ld < F || n_expert < 1 ||
        (act != KCUDA_ACT_SWIGLU && act != KCUDA_ACT_SWIGLU_OAI))
        return bl_err_set(err, BL_EINVAL, "experts_act: %lld slots of %lld (ld %lld), activation %d",
                          (long long)slots, (long long)F, (long long)ld, act);
    const int64_t total = slots * F;
    const int64_t blocks = kc_cdiv(total, 256) > 4096 ? 4096 : kc_cdiv(total, 256);
    KC_LAUNCH(err, experts_act_kernel, (unsigned)blocks, 256, 0, (cudaStream_t)stream, d_g, d_u, ld, d_ids, d_perm,
              d_gate_b, d_up_b, slots, F, n_expert, act, (__half *)d_h16);
    return 0;
}

/* grid (n): row r's block adds sum_j w[r, j] down_b[ids[r, j]] in j order. */
static __global__ void experts_bias_down_kernel(float *x, int64_t ldx, const int32_t *ids, const int32_t *mask,
                                                const float *w, const float *db, int k, int64_t E, int64_t n_expert)
{
    kc_wait_prior();
    kc_allow_next();
    const int64_t r = blockIdx.x;
    for (int64_t d = threadIdx.x; d < E; d += blockDim.x) {
        float a = 0.0f;
        for (int j = 0; j < k; j++) {
            const int32_t e = ids[r * k + j];
            if (e < 0 || e >= n_expert || (mask && mask[r * k + j] < 0))
                continue;
            a += w[r * k + j] * db[(int64_t)e * E + d];
        }
        x[r * ldx + d] += a;
    }
}

int kcuda_experts_bias_down(float *d_x, int64_t ldx, const int32_t *d_ids, const int32_t *d_mask, const float *d_wts,
                            const float *d_down_b, int64_t n, int k, int64_t E, int64_t n_expert, void *stream,
                            bl_err_t *err)
{
    if (!d_x || !d_ids || !d_wts || !d_down_b || n < 1 || n > INT32_MAX || k < 1 || E < 1 || ldx < E || n_expert < 1)
        return bl_err_set(err, BL_EINVAL, "experts_bias_down: %lld rows of %lld, top %d", (long long)n, (long long)E, k);
    KC_LAUNCH(err, experts_bias_down_kernel, (unsigned)n, 256, 0, (cudaStream_t)stream, d_x, ldx, d_ids, d_mask, d_wts,
              d_down_b, k, E, n_expert);
    return 0;
}
