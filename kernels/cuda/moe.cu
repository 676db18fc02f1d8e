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
