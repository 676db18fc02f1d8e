/* deepseek2's multi-head latent attention on the card, in the absorbed form (the
 * CPU's cpu_mla, step for step): consecutive-pair RoPE, each head's product with its
 * own rows of a per-head weight (attn_k_b, attn_v_b, dequantized to f16 by
 * kcuda_dequant_f16 first), and attention of every query head over the one latent
 * cache row per position, whose first kv_lora dims are also the value.
 *
 * The attention reads each cache row once per group of heads (a block per row,
 * group and split of the positions), the splits' partial sums combined after: 16
 * heads on tensor cores (mla_mma_kernel) where kv_lora is 64, 128, 256 or 512 and
 * n_rot at most 64, else 8 heads in f32 (mla_attention_kernel). */
#include <math.h>

#include "kcuda_impl.cuh"

/* grid-stride over (row, head, pair): pairs (2i, 2i + 1) of the first n_rot dims of
 * head h of row b, at x + b * rs + h * hs, rotated by kc_rope_cs_ext. */
static __global__ void rope_norm_kernel(float *x, const int32_t *pos, int64_t n, int64_t n_head, int64_t rs,
                                        int64_t hs, kcuda_rope_t r)
{
    kc_wait_prior();
    kc_allow_next();
    const int64_t half = r.n_rot / 2, total = n * n_head * half;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = idx % half, bh = idx / half, b = bh / n_head, h = bh % n_head;
        float c, s;
        kc_rope_cs_ext(pos[b], i, r, &c, &s);
        float *v = x + b * rs + h * hs + 2 * i;
        const float x0 = v[0], x1 = v[1];
        v[0] = x0 * c - x1 * s;
        v[1] = x0 * s + x1 * c;
    }
}

int kcuda_rope_norm(float *d_x, const int32_t *d_pos, int64_t n, int64_t n_head, int64_t row_stride,
                    int64_t head_stride, const kcuda_rope_t *rope, void *stream, bl_err_t *err)
{
    if (!d_x || !d_pos || !rope || n < 1 || n_head < 1 || rope->n_rot < 2 || rope->n_rot % 2 != 0 || row_stride < 1)
        return bl_err_set(err, BL_EINVAL, "rope_norm: %lld rows of %lld heads, %d rotated", (long long)n,
                          (long long)n_head, rope ? rope->n_rot : 0);
    const int64_t total = n * n_head * (rope->n_rot / 2);
    const int64_t blocks = kc_cdiv(total, 256) > 4096 ? 4096 : kc_cdiv(total, 256);
    KC_LAUNCH(err, rope_norm_kernel, (unsigned)blocks, 256, 0, (cudaStream_t)stream, d_x, d_pos, n, n_head,
              row_stride, head_stride, *rope);
    return 0;
}

#define HM_WARPS 4

/* grid (ceil(R / HM_WARPS), n_head, n): a warp per output r of head h, row b; the
 * dot over C in a fixed lane order, then the shuffle sum. */
static __global__ void __launch_bounds__(HM_WARPS * 32)
matvec_heads_kernel(const __half *w, int64_t R, int64_t C, const float *x, int64_t xr, int64_t xh, float *y,
                    int64_t yr, int64_t yh)
{
    kc_wait_prior();
    kc_allow_next();
    const int64_t r = (int64_t)blockIdx.x * HM_WARPS + (threadIdx.x >> 5);
    const int64_t h = blockIdx.y, b = blockIdx.z;
    const int lane = threadIdx.x & 31;
    if (r >= R)
        return;
    const __half *wr = w + (h * R + r) * C;
    const float *xv = x + b * xr + h * xh;
    float a = 0.0f;
    for (int64_t c = lane; c < C; c += 32)
        a += __half2float(wr[c]) * xv[c];
    a = kc_warp_sum(a);
    if (lane == 0)
        y[b * yr + h * yh + r] = a;
}

int kcuda_matvec_heads(const void *d_w16, int64_t n_head, int64_t R, int64_t C, const float *d_x, int64_t x_row,
                       int64_t x_head, int64_t n, float *d_y, int64_t y_row, int64_t y_head, void *stream,
                       bl_err_t *err)
{
    if (!d_w16 || !d_x || !d_y || n_head < 1 || n_head > 65535 || R < 1 || C < 1 || n < 1 || n > 65535)
        return bl_err_set(err, BL_EINVAL, "matvec_heads: %lld heads of %lld x %lld, %lld rows", (long long)n_head,
                          (long long)R, (long long)C, (long long)n);
    const dim3 grid((unsigned)kc_cdiv(R, HM_WARPS), (unsigned)n_head, (unsigned)n);
    KC_LAUNCH(err, matvec_heads_kernel, grid, HM_WARPS * 32, 0, (cudaStream_t)stream, (const __half *)d_w16, R, C,
              d_x, x_row, x_head, d_y, y_row, y_head);
    return 0;
}

#define MLA_G 8            /* query heads per block, a warp each */
#define MLA_T 16           /* cache rows per tile, read once for the block's heads */
#define MLA_MAX_D 1024
#define MLA_MIN_CHUNK 64   /* positions a split takes at the least */
#define MLA_MAX_SPLITS 64

/* Row b's cache (the rows table's entry for layer, else kc with row b at position
 * pos0 + b) and split s of nsplit of its positions 0 .. len - 1 (len the row's
 * position + 1): at most nsplit chunks of at least min_chunk positions, whole tiles
 * of `tile`; [p0, p1), empty (p0 >= p1) for the splits past the row's end. */
static __device__ __forceinline__ const uint8_t *mla_row(const uint8_t *kc, const kcuda_kv_row_t *rows,
                                                         int64_t layer, int64_t pos0, int64_t b, int s, int nsplit,
                                                         int tile, int min_chunk, int64_t *p0, int64_t *p1)
{
    int64_t len = pos0 + b + 1;
    if (rows) {
        const kcuda_kv_row_t rw = rows[b];
        kc = (const uint8_t *)(uintptr_t)(rw.k + (uint64_t)layer * rw.layer_bytes);
        len = (int64_t)rw.pos + 1;
    }
    int64_t active = (len + min_chunk - 1) / min_chunk;
    active = active < nsplit ? active : nsplit;
    const int64_t per = (len + active - 1) / active, chunk = (per + tile - 1) / tile * tile;
    *p0 = (int64_t)s * chunk;
    *p1 = *p0 + chunk < len ? *p0 + chunk : len;
    return kc;
}

/* grid (ceil(n_head / MLA_G), nsplit, n): the block of row b, heads g * MLA_G .., and
 * split s of the row's positions 0 .. len-1 (len the row's position + 1: the rows
 * table's, else pos0 + b + 1), cut into at most nsplit chunks of at least
 * MLA_MIN_CHUNK, whole tiles. Each warp holds its head's query (q_lat, then q_pe,
 * times scale) in registers, lane l the dim pairs 2l, 2l + 1, then 64 on (P pairs:
 * D <= 64 P); tile by tile the block copies MLA_T cache rows into shared memory (the
 * next tile's 16-byte pieces load into registers while this one is scored: rows
 * 16-byte aligned and D a multiple of 8, else half by half), and each warp scores
 * them (the dot in lane order, then the shuffle sum), keeps the online softmax and
 * the sum of p * the rows' first r dims. nsplit 1: out[b, h] normalised; else the
 * split's (m, l, unnormalised sum) into part for mla_combine_kernel. D even. */
template <int P>
static __global__ void __launch_bounds__(MLA_G * 32)
mla_attention_kernel(const uint8_t *kc, size_t rb, const kcuda_kv_row_t *rows, int64_t layer, int64_t pos0,
                     const float *ql, int64_t ql_row, int64_t ql_head, const float *qp, int64_t qp_row,
                     int64_t qp_head, int n_head, int r, int n_rot, float scale, float *out, int64_t o_row,
                     int64_t o_head, float *part)
{
    kc_wait_prior();
    kc_allow_next();
    __shared__ __align__(16) __half tile[MLA_T][MLA_MAX_D];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, tid = threadIdx.x;
    const int h = blockIdx.x * MLA_G + warp, s = blockIdx.y, nsplit = gridDim.y;
    const int64_t b = blockIdx.z;
    const int D = r + n_rot;
    const int live = h < n_head; /* a warp past the heads still loads its share of the tiles */
    int64_t p0, p1;
    kc = mla_row(kc, rows, layer, pos0, b, s, nsplit, MLA_T, MLA_MIN_CHUNK, &p0, &p1);
    const int vec = ((uintptr_t)kc % 16 == 0) && rb % 16 == 0 && D % 8 == 0;
    const int pieces = D / 8; /* 16-byte pieces a row */
    float2 q[P], acc[P];
#pragma unroll
    for (int i = 0; i < P; i++) {
        const int d = 2 * lane + 64 * i;
        q[i] = make_float2(0.0f, 0.0f);
        acc[i] = make_float2(0.0f, 0.0f);
        if (live && d < D) {
            const float *src = d < r ? ql + b * ql_row + h * ql_head + d : qp + b * qp_row + h * qp_head + d - r;
            q[i] = make_float2(src[0] * scale, src[1] * scale);
        }
    }
    /* the first tile's pieces: NP 16-byte pieces a thread (a tile of D <= 64 P holds
     * MLA_T * 8 P of them over MLA_G * 32 threads) */
    constexpr int NP = (P + 1) / 2;
    static_assert(MLA_T * 8 * P <= NP * MLA_G * 32, "a tile's pieces over the threads");
    uint4 nxt[NP];
    int cnt_n = p1 - p0 < MLA_T ? (int)(p1 - p0) : MLA_T;
#pragma unroll
    for (int k = 0; k < NP; k++) {
        const int e = tid + k * MLA_G * 32, t = e / pieces, c = e - t * pieces;
        if (vec && p0 < p1 && t < cnt_n)
            nxt[k] = __ldg((const uint4 *)(kc + (size_t)(p0 + t) * rb) + c);
    }
    float m = -INFINITY, l = 0.0f;
    for (int64_t t0 = p0; t0 < p1; t0 += MLA_T) {
        const int cnt = cnt_n;
        if (vec) {
#pragma unroll
            for (int k = 0; k < NP; k++) {
                const int e = tid + k * MLA_G * 32, t = e / pieces, c = e - t * pieces;
                if (t < cnt)
                    *(uint4 *)&tile[t][8 * c] = nxt[k];
            }
        } else {
            for (int e = tid; e < cnt * D; e += MLA_G * 32) {
                const int t = e / D, d = e - t * D;
                tile[t][d] = ((const __half *)(kc + (size_t)(t0 + t) * rb))[d];
            }
        }
        __syncthreads();
        /* the next tile's pieces in flight while this one is scored */
        const int64_t t1 = t0 + MLA_T;
        cnt_n = p1 - t1 < MLA_T ? (int)(p1 - t1) : MLA_T;
#pragma unroll
        for (int k = 0; k < NP; k++) {
            const int e = tid + k * MLA_G * 32, t = e / pieces, c = e - t * pieces;
            if (vec && t1 < p1 && t < cnt_n)
                nxt[k] = __ldg((const uint4 *)(kc + (size_t)(t1 + t) * rb) + c);
        }
        if (live) {
            float sc[MLA_T];
            float tm = -INFINITY;
#pragma unroll
            for (int t = 0; t < MLA_T; t++) {
                float v = 0.0f;
#pragma unroll
                for (int i = 0; i < P; i++) {
                    const int d = 2 * lane + 64 * i;
                    if (d < D) {
                        const float2 k2 = __half22float2(*(const __half2 *)&tile[t][d]);
                        v += q[i].x * k2.x + q[i].y * k2.y;
                    }
                }
                v = kc_warp_sum(v);
                sc[t] = t < cnt ? v : -INFINITY;
                tm = fmaxf(tm, sc[t]);
            }
            const float nm = fmaxf(m, tm), cf = expf(m - nm); /* m = -inf the first time: cf 0 */
            float ts = 0.0f;
#pragma unroll
            for (int t = 0; t < MLA_T; t++) {
                sc[t] = t < cnt ? expf(sc[t] - nm) : 0.0f;
                ts += sc[t];
            }
            l = l * cf + ts;
            m = nm;
#pragma unroll
            for (int i = 0; i < P; i++) {
                const int d = 2 * lane + 64 * i;
                if (d >= r)
                    break;
                float2 a = make_float2(acc[i].x * cf, acc[i].y * cf);
#pragma unroll
                for (int t = 0; t < MLA_T; t++)
                    if (t < cnt) { /* the rows past cnt hold what the last tile left, or nothing */
                        const float2 v2 = __half22float2(*(const __half2 *)&tile[t][d]);
                        a.x += sc[t] * v2.x;
                        a.y += sc[t] * v2.y;
                    }
                acc[i] = a;
            }
        }
        __syncthreads(); /* the tile is rewritten by the next pass */
    }
    if (!live)
        return;
    if (nsplit == 1) {
        const float inv = 1.0f / l;
#pragma unroll
        for (int i = 0; i < P; i++) {
            const int d = 2 * lane + 64 * i;
            if (d >= r)
                break;
            out[b * o_row + h * o_head + d] = acc[i].x * inv;
            out[b * o_row + h * o_head + d + 1] = acc[i].y * inv;
        }
        return;
    }
    /* (m, l, the sums) of split s of (b, h); an empty split: m = -inf, l = 0 */
    float *pp = part + (((size_t)b * n_head + h) * nsplit + s) * (size_t)(r + 2);
    if (lane == 0) {
        pp[0] = m;
        pp[1] = l;
    }
#pragma unroll
    for (int i = 0; i < P; i++) {
        const int d = 2 * lane + 64 * i;
        if (d >= r)
            break;
        pp[2 + d] = acc[i].x;
        pp[3 + d] = acc[i].y;
    }
}

/* grid (n_head, n): the splits of (b, h): out = sum_s w_s acc_s, w_s = e^(m_s - M) /
 * sum_s e^(m_s - M) l_s, M the largest m_s (split 0 always has positions; an empty
 * split has l = 0 and weight 0). The first warp makes the weights (nsplit <=
 * MLA_MAX_SPLITS = 64: two a lane), then each thread sums its dims over the splits. */
static __global__ void __launch_bounds__(256)
mla_combine_kernel(const float *part, int nsplit, int n_head, int r, float *out, int64_t o_row, int64_t o_head)
{
    kc_wait_prior();
    kc_allow_next();
    __shared__ float w[MLA_MAX_SPLITS];
    const int h = blockIdx.x, tid = threadIdx.x;
    const int64_t b = blockIdx.y;
    const size_t ps = (size_t)(r + 2);
    const float *pp = part + ((size_t)b * n_head + h) * nsplit * ps;
    if (tid < 32) {
        float m[2], l[2];
#pragma unroll
        for (int k = 0; k < 2; k++) {
            const int sp = tid + 32 * k;
            m[k] = sp < nsplit ? pp[sp * ps] : -INFINITY;
            l[k] = sp < nsplit ? pp[sp * ps + 1] : 0.0f;
        }
        const float M = kc_warp_max(fmaxf(m[0], m[1]));
        float e[2];
#pragma unroll
        for (int k = 0; k < 2; k++)
            e[k] = l[k] > 0.0f ? expf(m[k] - M) : 0.0f;
        const float inv = 1.0f / kc_warp_sum(e[0] * l[0] + e[1] * l[1]);
#pragma unroll
        for (int k = 0; k < 2; k++)
            if (tid + 32 * k < nsplit)
                w[tid + 32 * k] = e[k] * inv;
    }
    __syncthreads();
    for (int d = tid; d < r; d += blockDim.x) {
        const float *q = pp + 2 + d;
        float a = 0.0f;
#pragma unroll 16
        for (int sp = 0; sp < nsplit; sp++)
            if (w[sp] > 0.0f) /* an empty split's sums were never written */
                a += w[sp] * q[sp * ps];
        out[b * o_row + h * o_head + d] = a;
    }
}

/* The tensor-core form (mla_mma_kernel): MT tiles of MLA_MMA_H query heads a block
 * (the 16 rows of mma m16n8k16), MLA_MMA_T cache rows a tile, 4 warps a head tile. */
#define MLA_MMA_H 16
#define MLA_MMA_T 32
#define MLA_MMA_WARPS 4
#define MLA_MMA_LS 40 /* the partial scores' and probabilities' row length, padded */
#define MLA_MMA_MIN_CHUNK 128 /* positions a split takes at the least */
#define MLA_MMA_WAVES 2       /* blocks an SM the splits aim at */

/* Its dynamic shared memory for D = kv_lora + n_rot dims and mt head tiles: two
 * tiles of rows of D + 8 halves (padded so the fragments' 4-byte reads and
 * ldmatrix's rows fall on distinct banks), the warps' partial scores, the
 * probabilities in f16, and per head the rescale, m and l. */
static size_t mla_mma_smem(int64_t D, int mt)
{
    return sizeof(__half) * 2 * MLA_MMA_T * (size_t)(D + 8) +
           (size_t)mt * (sizeof(float) * MLA_MMA_WARPS * MLA_MMA_H * MLA_MMA_LS +
                         sizeof(__half) * MLA_MMA_H * MLA_MMA_LS + sizeof(float) * 4 * MLA_MMA_H);
}

/* Rows t0 .. of a tile (n of them; the rest of MLA_MMA_T zero-filled) into dst by
 * 16-byte asynchronous copies of nth threads: D / 8 pieces a row, rows ld halves
 * apart. */
static __device__ __forceinline__ void mla_mma_load(__half *dst, const uint8_t *kc, size_t rb, int64_t t0, int n,
                                                    int D, int ld, int tid, int nth)
{
    const int pc = D >> 3;
    for (int i = tid; i < MLA_MMA_T * pc; i += nth) {
        const int t = i / pc, c = i - t * pc;
        const bool in = t < n;
        kc_cp_async16(dst + t * ld + 8 * c, kc + (size_t)(t0 + (in ? t : 0)) * rb + 16 * (size_t)c, in ? 16 : 0);
    }
}

/* grid (ceil(n_head / (16 MT)), nsplit, n): row b, heads 16 MT g .., split s
 * (mla_row with tiles of MLA_MMA_T), the same results as mla_attention_kernel
 * with f16 queries (times scale) and probabilities. MT head tiles of 16 share each
 * tile of cache rows (MT 2 halves what a prompt reads from L2), 4 warps each: warp
 * w works on head tile mt = w / 4 as its quarter wq = w % 4. NT = kv_lora / 32
 * (even), KQ the 16-dim steps a warp scores (ceil(D / 64), D = kv_lora + n_rot a
 * multiple of 16). Scores: S (16 heads, 32 positions) = Q K^T, warp w over its
 * quarter of the D dims (its query fragments held in registers: rows gq, gq + 8
 * the heads), all four 8-position tiles; the head tile's four partial sums meet in
 * shared memory. Softmax: warp w the block's heads 4 w .. 4 w + 3, lane t position
 * t, the probabilities rounded to f16 and l summed from the rounded values. P x V:
 * warp w dims 8 NT wq .. + 8 NT (NT tiles of 8), O (16, 8) += P (16, 16
 * positions) V (16, 8), V the tile's first kv_lora dims read transposed by
 * ldmatrix. The next tile's rows load while this one is used; rows past the split
 * are zeros. Rows 16-byte aligned. */
template <int NT, int KQ, int MT>
static __global__ void __launch_bounds__(MT * MLA_MMA_WARPS * 32, 2 / MT)
mla_mma_kernel(const uint8_t *kc, size_t rb, const kcuda_kv_row_t *rows, int64_t layer, int64_t pos0,
               const float *ql, int64_t ql_row, int64_t ql_head, const float *qp, int64_t qp_row, int64_t qp_head,
               int n_head, int r, int n_rot, float scale, float *out, int64_t o_row, int64_t o_head, float *part)
{
    kc_wait_prior();
    kc_allow_next();
    extern __shared__ float4 mla_smem4[];
    const int D = r + n_rot, ld = D + 8;
    __half *tiles = (__half *)mla_smem4;                                           /* 2 x (T, ld) */
    constexpr int NTH = MT * MLA_MMA_WARPS * 32, HB = MT * MLA_MMA_H; /* threads, heads */
    float *red = (float *)(tiles + 2 * MLA_MMA_T * ld);                 /* (4 MT warps, 16, LS) */
    __half *ps = (__half *)(red + MT * MLA_MMA_WARPS * MLA_MMA_H * MLA_MMA_LS); /* (16 MT, LS) */
    float *hs = (float *)(ps + HB * MLA_MMA_LS);                        /* (16 MT, 4) */
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;
    const int mt = warp / MLA_MMA_WARPS, wq = warp % MLA_MMA_WARPS;
    const int hb0 = blockIdx.x * HB, h0 = hb0 + MLA_MMA_H * mt, s = blockIdx.y, nsplit = gridDim.y;
    const int64_t b = blockIdx.z;
    int64_t p0, p1;
    kc = mla_row(kc, rows, layer, pos0, b, s, nsplit, MLA_MMA_T, MLA_MMA_MIN_CHUNK, &p0, &p1);
    if (p0 >= p1) { /* an empty split (never the only one): m = -inf, l = 0 */
        if (tid < HB && hb0 + tid < n_head) {
            float *pp = part + (((size_t)b * n_head + hb0 + tid) * nsplit + s) * (size_t)(r + 2);
            pp[0] = -INFINITY;
            pp[1] = 0.0f;
        }
        return;
    }
    mla_mma_load(tiles, kc, rb, p0, p1 - p0 < MLA_MMA_T ? (int)(p1 - p0) : MLA_MMA_T, D, ld, tid, NTH);
    kc_cp_async_commit();

    /* the A fragments of this warp's 16-dim steps k0w .. k0w + per - 1: a[0] head
     * gq dims 2 tq, + 1 of the step, a[1] head gq + 8, a[2] and a[3] the same 8 dims
     * on; heads past n_head zero */
    const int nk = D >> 4, per = (nk + 3) >> 2, k0w = wq * per;
    unsigned qa[KQ][4];
#pragma unroll
    for (int i = 0; i < KQ; i++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int j = gq + 8 * (e & 1), d = 16 * (k0w + i) + 2 * tq + 8 * (e >> 1);
            float x0 = 0.0f, x1 = 0.0f;
            if (i < per && k0w + i < nk && h0 + j < n_head) {
                const float *src = d < r ? ql + b * ql_row + (int64_t)(h0 + j) * ql_head + d
                                         : qp + b * qp_row + (int64_t)(h0 + j) * qp_head + d - r;
                x0 = src[0] * scale;
                x1 = src[1] * scale;
            }
            const __half2 h2 = __floats2half2_rn(x0, x1);
            qa[i][e] = *(const unsigned *)&h2;
        }
    }
    float o[NT][4];
#pragma unroll
    for (int i = 0; i < NT; i++)
        o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float m4[4], l4[4]; /* heads 4 warp + jj: running maximum and sum (the same in every lane) */
#pragma unroll
    for (int jj = 0; jj < 4; jj++) {
        m4[jj] = -INFINITY;
        l4[jj] = 0.0f;
    }
    const int mi = lane >> 3, rr = lane & 7; /* the ldmatrix row this lane addresses */
    int buf = 0;
    for (int64_t t0 = p0; t0 < p1; t0 += MLA_MMA_T, buf ^= 1) {
        const int cnt = p1 - t0 < MLA_MMA_T ? (int)(p1 - t0) : MLA_MMA_T;
        const int64_t t1 = t0 + MLA_MMA_T;
        if (t1 < p1)
            mla_mma_load(tiles + (buf ^ 1) * MLA_MMA_T * ld, kc, rb, t1,
                         p1 - t1 < MLA_MMA_T ? (int)(p1 - t1) : MLA_MMA_T, D, ld, tid, NTH);
        kc_cp_async_commit();
        kc_cp_async_wait<1>(); /* this tile's rows (the next one's may be in flight) */
        __syncthreads();
        const __half *kt = tiles + buf * MLA_MMA_T * ld;

        /* partial scores over this warp's dims: c[nt] positions 8 nt + 2 tq, + 1 of
         * heads gq ([0], [1]) and gq + 8 ([2], [3]) */
        float c[4][4];
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
            c[nt][0] = c[nt][1] = c[nt][2] = c[nt][3] = 0.0f;
#pragma unroll
        for (int i = 0; i < KQ; i++) {
            if (i < per && k0w + i < nk) {
                const int d = 16 * (k0w + i) + 2 * tq;
#pragma unroll
                for (int nt = 0; nt < 4; nt++) {
                    const __half *kr = kt + (8 * nt + gq) * ld + d;
                    kc_mma16816(c[nt], qa[i], *(const unsigned *)kr, *(const unsigned *)(kr + 8));
                }
            }
        }
#pragma unroll
        for (int nt = 0; nt < 4; nt++) {
            float *rw = red + (warp * MLA_MMA_H + gq) * MLA_MMA_LS + 8 * nt + 2 * tq;
            *(float2 *)rw = make_float2(c[nt][0], c[nt][1]);
            *(float2 *)(rw + 8 * MLA_MMA_LS) = make_float2(c[nt][2], c[nt][3]);
        }
        __syncthreads();

        /* the online softmax of the block's heads 4 warp .. (m = -inf the first
         * time: the rescale is 0, and the tile has a position, so the new m is
         * finite); head j's partial sums are those of its head tile's warps */
#pragma unroll
        for (int jj = 0; jj < 4; jj++) {
            const int j = 4 * warp + jj;
            float sv = -INFINITY;
            if (lane < cnt) {
                sv = 0.0f;
#pragma unroll
                for (int w = 0; w < MLA_MMA_WARPS; w++)
                    sv += red[((MLA_MMA_WARPS * mt + w) * MLA_MMA_H + j - MLA_MMA_H * mt) * MLA_MMA_LS + lane];
            }
            const float nm = fmaxf(m4[jj], kc_warp_max(sv)), a = expf(m4[jj] - nm);
            const __half ph = __float2half_rn(lane < cnt ? expf(sv - nm) : 0.0f);
            ps[j * MLA_MMA_LS + lane] = ph;
            l4[jj] = l4[jj] * a + kc_warp_sum(__half2float(ph));
            m4[jj] = nm;
            if (lane == 0)
                hs[4 * j] = a;
        }
        __syncthreads();

        /* O += P V over the tile's two steps of 16 positions */
        const int hj = MLA_MMA_H * mt + gq; /* this lane's heads hj, hj + 8 of the block */
        const float a0 = hs[4 * hj], a8 = hs[4 * (hj + 8)];
#pragma unroll
        for (int i = 0; i < NT; i++) {
            o[i][0] *= a0;
            o[i][1] *= a0;
            o[i][2] *= a8;
            o[i][3] *= a8;
        }
#pragma unroll
        for (int kk = 0; kk < MLA_MMA_T / 16; kk++) {
            const __half *pr = ps + hj * MLA_MMA_LS + 16 * kk + 2 * tq;
            const unsigned pa[4] = {*(const unsigned *)pr, *(const unsigned *)(pr + 8 * MLA_MMA_LS),
                                    *(const unsigned *)(pr + 8), *(const unsigned *)(pr + 8 * MLA_MMA_LS + 8)};
            const __half *vr = kt + (16 * kk + (mi & 1) * 8 + rr) * ld + 8 * (NT * wq + (mi >> 1));
#pragma unroll
            for (int h2 = 0; h2 < NT / 2; h2++) {
                unsigned bv[4];
                kc_ldsm_x4_t(bv, vr + 16 * h2);
                kc_mma16816(o[2 * h2], pa, bv[0], bv[1]);
                kc_mma16816(o[2 * h2 + 1], pa, bv[2], bv[3]);
            }
        }
        __syncthreads(); /* the tile, the scores and the probabilities are free */
    }
    if (lane == 0)
#pragma unroll
        for (int jj = 0; jj < 4; jj++) {
            hs[4 * (4 * warp + jj) + 1] = m4[jj];
            hs[4 * (4 * warp + jj) + 2] = l4[jj];
        }
    __syncthreads();
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
        const int j = gq + 8 * hh;
        if (h0 + j >= n_head)
            continue;
        const float inv = nsplit == 1 ? 1.0f / hs[4 * (MLA_MMA_H * mt + j) + 2] : 1.0f;
        float *dst = nsplit == 1 ? out + b * o_row + (int64_t)(h0 + j) * o_head
                                 : part + (((size_t)b * n_head + h0 + j) * nsplit + s) * (size_t)(r + 2) + 2;
#pragma unroll
        for (int i = 0; i < NT; i++) {
            const int d = 8 * (NT * wq + i) + 2 * tq;
            dst[d] = o[i][2 * hh] * inv;
            dst[d + 1] = o[i][2 * hh + 1] * inv;
        }
    }
    if (nsplit > 1 && tid < HB && hb0 + tid < n_head) {
        float *pp = part + (((size_t)b * n_head + hb0 + tid) * nsplit + s) * (size_t)(r + 2);
        pp[0] = hs[4 * tid + 1];
        pp[1] = hs[4 * tid + 2];
    }
}

/* The splits a launch of n rows, n_head heads (heads_a_block a block) and kv_lora
 * dims takes on a device of sms SMs: enough blocks for `waves` an SM, within the
 * scratch and MLA_MAX_SPLITS, and within what max_len (0: not known, the rows
 * table's) fills with min_chunk positions a split. */
static int mla_splits(int64_t n, int64_t n_head, int64_t heads_a_block, int64_t waves, int64_t min_chunk,
                      int64_t kv_lora, int64_t max_len, size_t scratch_bytes, int sms)
{
    const int64_t blocks = kc_cdiv(n_head, heads_a_block) * n;
    int64_t k = kc_cdiv(waves * sms, blocks);
    const int64_t fit = (int64_t)(scratch_bytes / (sizeof(float) * (size_t)(n * n_head * (kv_lora + 2))));
    k = k < fit ? k : fit;
    k = k < MLA_MAX_SPLITS ? k : MLA_MAX_SPLITS;
    if (max_len > 0 && kc_cdiv(max_len, min_chunk) < k)
        k = kc_cdiv(max_len, min_chunk);
    return k < 1 ? 1 : (int)k;
}

size_t kcuda_mla_scratch_bytes(int64_t n, int64_t n_head, int64_t kv_lora)
{
    if (n < 1 || n_head < 1 || kv_lora < 1)
        return 0;
    return sizeof(float) * (size_t)n * (size_t)n_head * (size_t)(kv_lora + 2) * MLA_MAX_SPLITS;
}

/* The tensor-core form's NT (kv_lora / 32) when it takes this shape on a device
 * whose blocks may opt in to optin bytes of shared memory, else 0. Its launches
 * raise the limit to what the widest rows of that kv_lora take (64 rotated dims:
 * mla_mma_go), so that is what the card must allow. */
static int mla_mma_nt(int64_t kv_lora, int64_t n_rot, size_t row_bytes, int optin)
{
    if ((kv_lora != 64 && kv_lora != 128 && kv_lora != 256 && kv_lora != 512) || n_rot < 0 || n_rot > 64 ||
        (kv_lora + n_rot) % 16 != 0 || row_bytes % 16 != 0)
        return 0;
    return mla_mma_smem(kv_lora + 64, 1) <= (size_t)optin ? (int)(kv_lora / 32) : 0;
}

int kcuda_mla_mma(int64_t kv_lora, int64_t n_rot, size_t row_bytes)
{
    int dev = 0, sms = 0, optin = 0;
    bl_err_t err;
    if (kc_device_limits(&dev, &sms, &optin, &err) < 0) {
        (void)cudaGetLastError();
        return 0;
    }
    return mla_mma_nt(kv_lora, n_rot, row_bytes, optin) > 0;
}

/* Launches mla_mma_kernel<NT, NT / 2 + 1, MT> (its 16-dim steps a warp: n_rot <=
 * 64), its shared-memory limit raised once per device (dev, the current one) to
 * the largest D it takes. */
template <int NT, int MT>
static int mla_mma_go(int dev, dim3 grid, cudaStream_t st, const uint8_t *kc, size_t rb, const kcuda_kv_row_t *rows,
                      int64_t layer, int64_t pos0, const float *ql, int64_t ql_row, int64_t ql_head, const float *qp,
                      int64_t qp_row, int64_t qp_head, int n_head, int r, int n_rot, float scale, float *out,
                      int64_t o_row, int64_t o_head, float *part, bl_err_t *err)
{
    static int done[KC_MAX_DEVICES];
    int rc = kc_smem_prepare(mla_mma_kernel<NT, NT / 2 + 1, MT>, done, dev, (int)mla_mma_smem(32 * NT + 64, MT), err);
    if (rc < 0)
        return rc;
    KC_LAUNCH(err, mla_mma_kernel<NT, NT / 2 + 1, MT>, grid, MT * MLA_MMA_WARPS * 32, mla_mma_smem(r + n_rot, MT), st,
              kc, rb, rows, layer, pos0, ql, ql_row, ql_head, qp, qp_row, qp_head, n_head, r, n_rot, scale, out, o_row,
              o_head, part);
    return 0;
}

/* The tensor-core form's heads a block: 16, 32, or 0 (the default) to choose by
 * the launch (kcuda_mla_set_heads; docs/cuda.md has the measurement). */
static int g_mla_heads;

int kcuda_mla_set_heads(int heads)
{
    const int old = g_mla_heads;
    if (heads == 0 || heads == 16 || heads == 32)
        g_mla_heads = heads;
    return old;
}

int kcuda_mla_attention(const void *d_cache, const kcuda_kv_row_t *d_rows, int64_t layer, size_t row_bytes,
                        int64_t pos0, const float *d_ql, int64_t ql_row, int64_t ql_head, const float *d_qp,
                        int64_t qp_row, int64_t qp_head, int64_t n, int64_t n_head, int64_t kv_lora, int64_t n_rot,
                        float scale, float *d_out, int64_t o_row, int64_t o_head, void *d_scratch,
                        size_t scratch_bytes, void *stream, bl_err_t *err)
{
    if ((!d_cache && !d_rows) || !d_ql || !d_qp || !d_out || n < 1 || n > 65535 || n_head < 1 || n_head > 65535 ||
        kv_lora < 1 || kv_lora % 2 != 0 || n_rot < 0 || n_rot % 2 != 0 || kv_lora + n_rot > MLA_MAX_D || pos0 < 0 ||
        layer < 0 ||
        row_bytes < (size_t)(kv_lora + n_rot) * 2)
        return bl_err_set(err, BL_EINVAL,
                          "mla_attention: %lld rows, %lld heads, %lld + %lld dims (even, at most %d), cache rows of "
                          "%zu bytes", (long long)n, (long long)n_head, (long long)kv_lora, (long long)n_rot, MLA_MAX_D,
                          row_bytes);
    int dev = 0, sms = 0, optin = 0;
    int rc = kc_device_limits(&dev, &sms, &optin, err);
    if (rc < 0)
        return rc;
    const int nt = d_cache && (uintptr_t)d_cache % 16 != 0 ? 0 : mla_mma_nt(kv_lora, n_rot, row_bytes, optin);
    /* two head tiles a block where the rows alone fill the device (a prompt: each
     * tile of cache rows read from L2 once for 32 heads), else one (decode: the
     * splits fill it, and blocks of 4 warps fit two an SM) */
    int mt = 1;
    if (nt && n_head > MLA_MMA_H) {
        mt = g_mla_heads ? g_mla_heads / MLA_MMA_H : kc_cdiv(n_head, 2 * MLA_MMA_H) * n >= sms ? 2 : 1;
        if (mla_mma_smem(kv_lora + 64, mt) > (size_t)optin) /* as mla_mma_nt */
            mt = 1;
    }
    const int64_t hb = nt ? mt * MLA_MMA_H : MLA_G;
    const int nsplit = mla_splits(n, n_head, hb, nt ? MLA_MMA_WAVES / mt : 4, nt ? MLA_MMA_MIN_CHUNK : MLA_MIN_CHUNK,
                                  kv_lora, d_rows ? 0 : pos0 + n, d_scratch ? scratch_bytes : 0, sms);
    cudaStream_t st = (cudaStream_t)stream;
    const dim3 grid((unsigned)kc_cdiv(n_head, hb), (unsigned)nsplit, (unsigned)n);
    const int64_t D = kv_lora + n_rot;
    if (nt) {
#define MLA_MMA(NTV)                                                                                              \
    (mt == 2 ? MLA_MMA_MT(NTV, 2) : MLA_MMA_MT(NTV, 1))
#define MLA_MMA_MT(NTV, MTV)                                                                                   \
    mla_mma_go<NTV, MTV>(dev, grid, st, (const uint8_t *)d_cache, row_bytes, d_rows, layer, pos0, d_ql, ql_row,   \
                         ql_head, d_qp, qp_row, qp_head, (int)n_head, (int)kv_lora, (int)n_rot, scale, d_out, o_row, \
                         o_head, (float *)d_scratch, err)
        rc = nt == 2 ? MLA_MMA(2) : nt == 4 ? MLA_MMA(4) : nt == 8 ? MLA_MMA(8) : MLA_MMA(16);
#undef MLA_MMA_MT
#undef MLA_MMA
        if (rc < 0)
            return rc;
    } else {
#define MLA_GO(PL)                                                                                           \
    KC_LAUNCH(err, mla_attention_kernel<PL>, grid, MLA_G * 32, 0, st, (const uint8_t *)d_cache, row_bytes, d_rows, \
              layer, pos0, d_ql, ql_row, ql_head, d_qp, qp_row, qp_head, (int)n_head, (int)kv_lora, (int)n_rot,     \
              scale, d_out, o_row, o_head, (float *)d_scratch)
        if (D <= 2 * 64) /* small test shapes */
            MLA_GO(2);
        else if (D <= 9 * 64) /* 480 + 64 and the like */
            MLA_GO(9);
        else
            MLA_GO(MLA_MAX_D / 64);
#undef MLA_GO
    }
    if (nsplit > 1)
        KC_LAUNCH(err, mla_combine_kernel, dim3((unsigned)n_head, (unsigned)n), 256, 0, st, (const float *)d_scratch,
                  nsplit, (int)n_head, (int)kv_lora, d_out, o_row, o_head);
    return 0;
}
