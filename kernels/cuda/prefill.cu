/* Flash attention for prompt rows: causal GQA over the f16 KV cache with tensor
 * cores (mma.sync m16n8k16, f16 inputs, f32 scores and accumulators), the rows'
 * own K and V stored in the cache first. docs/cuda.md, "Prompts". */
#include "kcuda_impl.cuh"

#define PF_BQ 64  /* query rows per block: 4 warps of 16 */
#define PF_BKV 64 /* cache positions per step */

static __device__ __forceinline__ unsigned pack_half2(float a, float b)
{
    const __half2 h = __floats2half2_rn(a, b);
    return *(const unsigned *)&h;
}

/* A warp's output fragments times ca (its rows a) and cb (rows b): the online
 * softmax's rescale when the running maximum moves. */
template <int D>
static __device__ __forceinline__ void rescale(float (*o)[4], float ca, float cb)
{
#pragma unroll
    for (int j = 0; j < D / 8; j++) {
        o[j][0] *= ca;
        o[j][1] *= ca;
        o[j][2] *= cb;
        o[j][3] *= cb;
    }
}

/* grid (ceil(n / 64), n_head); block x takes the row tile counted from the end, so
 * the tiles with the longest causal span start first. Query row i of the block's
 * tile is at position pos0 + r0 + i; it attends to positions 0 .. pos0 + r0 + i.
 * Shared: the Q tile and two stages of K and V tiles, 64 x D halves each, rows
 * D + 8 halves apart (ldmatrix without bank conflicts); the next K/V tile is copied
 * (cp.async) while the current one is multiplied. Scores are kept in the log2
 * domain (q pre-scaled by scale * log2 e). */
template <int D>
static __global__ void __launch_bounds__(128) prefill_kernel(const uint8_t *kc, const uint8_t *vc, size_t row_bytes,
                                                             const float *q, float *out, int64_t n, int64_t pos0,
                                                             int n_head, int group, float qscale, int window,
                                                             const float *sinks)
{
    constexpr int LDS = D + 8, TILE = PF_BKV * LDS;
    extern __shared__ __align__(16) __half smem[];
    __half *sq = smem, *sk0 = smem + PF_BQ * LDS, *sv0 = sk0 + 2 * TILE;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int h = blockIdx.y, kvh = h / group;
    const int64_t r0 = (int64_t)(gridDim.x - 1 - blockIdx.x) * PF_BQ;
    const int64_t rows = n - r0 < PF_BQ ? n - r0 : PF_BQ;
    const int64_t qstride = (int64_t)n_head * D;
    const int64_t end = pos0 + r0 + rows; /* positions 0 .. end-1 are read */

    /* K/V tile t0 into stage st; positions at or past end are zero-filled. */
    auto load = [&](int st, int64_t t0) {
        for (int c = tid; c < PF_BKV * D / 8; c += 128) {
            const int r = c / (D / 8), d = (c % (D / 8)) * 8;
            const int64_t p = t0 + r;
            const int ok = p < end;
            const size_t off = (size_t)(ok ? p : 0) * row_bytes + ((size_t)kvh * D + d) * 2;
            kc_cp_async16(sk0 + st * TILE + r * LDS + d, kc + off, ok ? 16 : 0);
            kc_cp_async16(sv0 + st * TILE + r * LDS + d, vc + off, ok ? 16 : 0);
        }
        kc_cp_async_commit();
    };
    /* with a window, the tiles before the block's first visible position are skipped */
    const int64_t first = window > 0 && pos0 + r0 + 1 > window ? pos0 + r0 + 1 - window : 0;
    const int64_t tbeg = first / PF_BKV * PF_BKV;
    load(0, tbeg);

    /* Q tile, scaled, in f16; rows past n are zeros. */
    for (int c = tid; c < PF_BQ * D / 4; c += 128) {
        const int r = c / (D / 4), d = (c % (D / 4)) * 4;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (r < rows)
            v = *(const float4 *)(q + (r0 + r) * qstride + (int64_t)h * D + d);
        __half2 *o = (__half2 *)(sq + r * LDS + d);
        o[0] = __floats2half2_rn(v.x * qscale, v.y * qscale);
        o[1] = __floats2half2_rn(v.z * qscale, v.w * qscale);
    }

    const int64_t pa = pos0 + r0 + warp * 16 + lane / 4, pb = pa + 8;
    float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.f, l_b = 0.f;
    float o[D / 8][4];
#pragma unroll
    for (int j = 0; j < D / 8; j++)
        o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;

    int st = 0;
    for (int64_t t0 = tbeg; t0 < end; t0 += PF_BKV, st ^= 1) {
        /* Tile t0 has landed for every thread, and every warp is done with the
         * previous tile (and Q is written), so its stage can be refilled. */
        kc_cp_async_wait<0>();
        __syncthreads();
        if (t0 + PF_BKV < end)
            load(st ^ 1, t0 + PF_BKV);
        const __half *sk = sk0 + st * TILE, *sv = sv0 + st * TILE;
        /* The warp's 16 rows end at pb (pa for the first 8); skip tiles past them. */
        const int64_t wlast = pos0 + r0 + warp * 16 + 15;
        if (t0 > wlast)
            continue;

        /* S (16 x 64) = Q K^T */
        float s[PF_BKV / 8][4];
#pragma unroll
        for (int j = 0; j < PF_BKV / 8; j++)
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
        for (int ks = 0; ks < D; ks += 16) {
            unsigned a[4];
            kc_ldsm_x4(a, sq + (warp * 16 + lane % 16) * LDS + ks + (lane / 16) * 8);
#pragma unroll
            for (int j = 0; j < PF_BKV / 16; j++) {
                unsigned b[4];
                kc_ldsm_x4(b, sk + (j * 16 + (lane & 7) + ((lane >> 4) << 3)) * LDS + ks + ((lane >> 3) & 1) * 8);
                kc_mma16816(s[2 * j], a, b[0], b[1]);
                kc_mma16816(s[2 * j + 1], a, b[2], b[3]);
            }
        }
        /* Causal mask, online softmax (each row's max and sum over its quad). */
        float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
        for (int j = 0; j < PF_BKV / 8; j++) {
            const int64_t key = t0 + j * 8 + 2 * (lane % 4);
            if (key > pa) s[j][0] = -INFINITY;
            if (key + 1 > pa) s[j][1] = -INFINITY;
            if (key > pb) s[j][2] = -INFINITY;
            if (key + 1 > pb) s[j][3] = -INFINITY;
            if (window > 0) { /* row p sees p - window + 1 .. p */
                if (key + window <= pa) s[j][0] = -INFINITY;
                if (key + 1 + window <= pa) s[j][1] = -INFINITY;
                if (key + window <= pb) s[j][2] = -INFINITY;
                if (key + 1 + window <= pb) s[j][3] = -INFINITY;
            }
            mx_a = fmaxf(mx_a, fmaxf(s[j][0], s[j][1]));
            mx_b = fmaxf(mx_b, fmaxf(s[j][2], s[j][3]));
        }
#pragma unroll
        for (int off = 1; off <= 2; off <<= 1) {
            mx_a = fmaxf(mx_a, __shfl_xor_sync(KCUDA_FULL_MASK, mx_a, off));
            mx_b = fmaxf(mx_b, __shfl_xor_sync(KCUDA_FULL_MASK, mx_b, off));
        }
        const float na = fmaxf(m_a, mx_a), nb = fmaxf(m_b, mx_b);
        const float ua = na == -INFINITY ? 0.f : na, ub = nb == -INFINITY ? 0.f : nb;
        const float ca = exp2f(m_a - ua), cb = exp2f(m_b - ub);
        m_a = na;
        m_b = nb;
        l_a *= ca;
        l_b *= cb;
        rescale<D>(o, ca, cb);
        unsigned p[PF_BKV / 16][4];
#pragma unroll
        for (int j = 0; j < PF_BKV / 8; j++) {
            const float e0 = exp2f(s[j][0] - ua), e1 = exp2f(s[j][1] - ua);
            const float e2 = exp2f(s[j][2] - ub), e3 = exp2f(s[j][3] - ub);
            l_a += e0 + e1;
            l_b += e2 + e3;
            /* The C layout of n-tiles 2kk, 2kk + 1 is the A layout of k-step kk. */
            p[j / 2][(j % 2) * 2] = pack_half2(e0, e1);
            p[j / 2][(j % 2) * 2 + 1] = pack_half2(e2, e3);
        }
        /* O (16 x D) += P (16 x 64) V (64 x D) */
#pragma unroll
        for (int kk = 0; kk < PF_BKV / 16; kk++) {
#pragma unroll
            for (int dt = 0; dt < D / 16; dt++) {
                unsigned b[4];
                kc_ldsm_x4_t(b, sv + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LDS + dt * 16 + (lane >> 4) * 8);
                kc_mma16816(o[2 * dt], p[kk], b[0], b[1]);
                kc_mma16816(o[2 * dt + 1], p[kk], b[2], b[3]);
            }
        }
    }

#pragma unroll
    for (int off = 1; off <= 2; off <<= 1) {
        l_a += __shfl_xor_sync(KCUDA_FULL_MASK, l_a, off);
        l_b += __shfl_xor_sync(KCUDA_FULL_MASK, l_b, off);
    }
    if (sinks) { /* one more score per head with no value, in the log2 domain */
        const float sk = sinks[h] * 1.4426950408889634f;
        const float na = fmaxf(m_a, sk), nb = fmaxf(m_b, sk);
        const float ca = exp2f(m_a - na), cb = exp2f(m_b - nb);
        l_a = l_a * ca + exp2f(sk - na);
        l_b = l_b * cb + exp2f(sk - nb);
        rescale<D>(o, ca, cb);
    }
    const float ia = l_a > 0.f ? 1.f / l_a : 0.f, ib = l_b > 0.f ? 1.f / l_b : 0.f;
    const int64_t ra = warp * 16 + lane / 4, rb = ra + 8;
#pragma unroll
    for (int j = 0; j < D / 8; j++) {
        const int d = j * 8 + 2 * (lane % 4);
        if (ra < rows)
            *(float2 *)(out + (r0 + ra) * qstride + (int64_t)h * D + d) = make_float2(o[j][0] * ia, o[j][1] * ia);
        if (rb < rows)
            *(float2 *)(out + (r0 + rb) * qstride + (int64_t)h * D + d) = make_float2(o[j][2] * ib, o[j][3] * ib);
    }
}

template <int D>
static int prefill_launch(const kcuda_kv_view_t *kv, const float *d_q, float *d_out, int64_t n, int64_t pos0,
                          int64_t n_head, int64_t group, float qscale, int window, const float *sinks, void *stream,
                          bl_err_t *err)
{
    const size_t smem = (size_t)(PF_BQ + 4 * PF_BKV) * (D + 8) * sizeof(__half);
    KCUDA_CHECK(cudaFuncSetAttribute(prefill_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                err);
    const dim3 grid((unsigned)kc_cdiv(n, PF_BQ), (unsigned)n_head);
    prefill_kernel<D><<<grid, 128, smem, (cudaStream_t)stream>>>((const uint8_t *)kv->k, (const uint8_t *)kv->v,
                                                                 kv->row_bytes, d_q, d_out, n, pos0, (int)n_head,
                                                                 (int)group, qscale, window, sinks);
    KCUDA_CHECK_LAUNCH(err);
    return 0;
}

int kcuda_attention_prefill(const kcuda_kv_view_t *kv, const float *d_q, float *d_out, int64_t n, int64_t pos0,
                            int64_t n_head, int64_t n_kv_head, int64_t head_dim, float scale, void *stream,
                            bl_err_t *err)
{
    return kcuda_attention_prefill_ext(kv, d_q, d_out, n, pos0, n_head, n_kv_head, head_dim, scale, NULL, stream, err);
}

int kcuda_attention_prefill_ext(const kcuda_kv_view_t *kv, const float *d_q, float *d_out, int64_t n, int64_t pos0,
                                int64_t n_head, int64_t n_kv_head, int64_t head_dim, float scale,
                                const kcuda_att_ext_t *ext, void *stream, bl_err_t *err)
{
    const int window = ext && ext->window > 0 ? ext->window : 0;
    const float *sinks = ext ? ext->d_sinks : NULL;
    if (head_dim != 64 && head_dim != 128)
        return bl_err_set(err, BL_ENOTSUP, "prefill attention: head_dim %lld (64 or 128)", (long long)head_dim);
    if (n < 0 || pos0 < 0 || n_kv_head < 1 || n_head % n_kv_head != 0 || n_head > 65535 ||
        kv->row_bytes % 16 != 0 || kv->row_bytes < (size_t)(n_kv_head * head_dim * 2) ||
        (uintptr_t)kv->k % 16 || (uintptr_t)kv->v % 16 || (uintptr_t)d_q % 16 || (uintptr_t)d_out % 8)
        return bl_err_set(err, BL_EINVAL, "prefill attention: %lld rows at %lld, %lld heads over %lld, row_bytes %zu",
                          (long long)n, (long long)pos0, (long long)n_head, (long long)n_kv_head, kv->row_bytes);
    if (n == 0)
        return 0;
    const float qscale = scale * 1.4426950408889634f; /* exp(x) = exp2(x log2 e) */
    const int64_t group = n_head / n_kv_head;
    return head_dim == 64
               ? prefill_launch<64>(kv, d_q, d_out, n, pos0, n_head, group, qscale, window, sinks, stream, err)
               : prefill_launch<128>(kv, d_q, d_out, n, pos0, n_head, group, qscale, window, sinks, stream, err);
}
