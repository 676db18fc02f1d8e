/* MoE routing on the card: softmax over the router logits, top-k, renormalisation.
 * One warp per row; each lane holds n_expert / 32 logits in registers, so k rounds
 * of a warp-wide argmax pick the experts without touching memory again. */
#include <math.h>

#include "kcuda_impl.cuh"

#define ROUTE_WARPS 4
#define ROUTE_PER_LANE (KCUDA_MOE_MAX_EXPERT / 32)

/* grid (ceil(n / ROUTE_WARPS)). Lane l holds experts l, l + 32, ... */
__global__ void __launch_bounds__(ROUTE_WARPS * 32)
moe_route_kernel(const float *logits, int64_t n, int n_expert, int k, int norm, int32_t *ids, float *w)
{
    const int64_t row = (int64_t)blockIdx.x * ROUTE_WARPS + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= n)
        return;
    const float *l = logits + row * n_expert;
    float v[ROUTE_PER_LANE];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < ROUTE_PER_LANE; i++) {
        const int e = lane + 32 * i;
        v[i] = e < n_expert ? l[e] : -INFINITY;
        mx = fmaxf(mx, v[i]);
    }
    mx = kc_warp_max(mx);
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < ROUTE_PER_LANE; i++)
        if (lane + 32 * i < n_expert)
            sum += expf(v[i] - mx);
    sum = kc_warp_sum(sum);

    uint32_t taken = 0; /* bit i: expert lane + 32 i already chosen */
    float wsum = 0.0f, mine = 0.0f; /* lane j < k keeps choice j's probability */
    int32_t mine_id = 0;
    for (int j = 0; j < k; j++) {
        /* This lane's best untaken logit; ascending ids, so a strict > keeps the
         * lower id on ties, as the CPU reference does. */
        float bv = -INFINITY;
        int be = INT32_MAX;
#pragma unroll
        for (int i = 0; i < ROUTE_PER_LANE; i++) {
            const int e = lane + 32 * i;
            if (e < n_expert && !(taken >> i & 1u) && (be == INT32_MAX || v[i] > bv)) {
                bv = v[i];
                be = e;
            }
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            const float ov = __shfl_xor_sync(KCUDA_FULL_MASK, bv, off);
            const int oe = __shfl_xor_sync(KCUDA_FULL_MASK, be, off);
            if (oe != INT32_MAX && (be == INT32_MAX || ov > bv || (ov == bv && oe < be))) {
                bv = ov;
                be = oe;
            }
        }
        if (be != INT32_MAX && (be & 31) == lane)
            taken |= 1u << (be >> 5);
        const float p = expf(bv - mx) / sum;
        wsum += p;
        if (lane == j) {
            mine = p;
            mine_id = be;
        }
    }
    if (lane < k) {
        ids[row * k + lane] = mine_id;
        w[row * k + lane] = norm ? mine / wsum : mine;
    }
}

int kcuda_moe_route(const float *d_logits, int64_t n, int64_t n_expert, int k, int norm, int32_t *d_ids,
                    float *d_w, void *stream, bl_err_t *err)
{
    if (!d_logits || !d_ids || !d_w || n < 1 || n > INT32_MAX)
        return bl_err_set(err, BL_EINVAL, "moe_route: %lld rows", (long long)n);
    if (n_expert < 1 || n_expert > KCUDA_MOE_MAX_EXPERT || k < 1 || k > KCUDA_MOE_MAX_K || k > n_expert)
        return bl_err_set(err, BL_ENOTSUP, "moe_route: %d of %lld experts (at most %d of %d)", k,
                          (long long)n_expert, KCUDA_MOE_MAX_K, KCUDA_MOE_MAX_EXPERT);
    moe_route_kernel<<<(unsigned)kc_cdiv(n, ROUTE_WARPS), ROUTE_WARPS * 32, 0, (cudaStream_t)stream>>>(
        d_logits, n, (int)n_expert, k, norm, d_ids, d_w);
    KCUDA_CHECK_LAUNCH(err);
    return 0;
}
