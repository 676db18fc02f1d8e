/* deepseek2's multi-head latent attention on the card, in the absorbed form (the
 * CPU's cpu_mla, step for step): consecutive-pair RoPE, each head's product with its
 * own rows of a per-head weight (attn_k_b, attn_v_b, dequantized to f16 by
 * kcuda_dequant_f16 first), and attention of every query head over the one latent
 * cache row per position, whose first kv_lora dims are also the value.
 *
 * The attention reads each cache row once per MLA_G heads (a block per row, group
 * of heads and split of the positions), the splits' partial sums combined after. */
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
    int64_t len = pos0 + b + 1;
    if (rows) {
        const kcuda_kv_row_t rw = rows[b];
        kc = (const uint8_t *)(uintptr_t)(rw.k + (uint64_t)layer * rw.layer_bytes);
        len = (int64_t)rw.pos + 1;
    }
    /* this split's positions */
    int64_t active = (len + MLA_MIN_CHUNK - 1) / MLA_MIN_CHUNK;
    active = active < nsplit ? active : nsplit;
    const int64_t per = (len + active - 1) / active, chunk = (per + MLA_T - 1) / MLA_T * MLA_T;
    const int64_t p0 = (int64_t)s * chunk, p1 = p0 + chunk < len ? p0 + chunk : len;
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

/* grid (n_head, n): the splits of (b, h) in order: out = sum_s e^(m_s - M) acc_s /
 * sum_s e^(m_s - M) l_s, M the largest m_s (split 0 always has positions). */
static __global__ void __launch_bounds__(256)
mla_combine_kernel(const float *part, int nsplit, int n_head, int r, float *out, int64_t o_row, int64_t o_head)
{
    kc_wait_prior();
    kc_allow_next();
    const int h = blockIdx.x;
    const int64_t b = blockIdx.y;
    const float *pp = part + ((size_t)b * n_head + h) * nsplit * (size_t)(r + 2);
    float M = -INFINITY;
    for (int s = 0; s < nsplit; s++)
        M = fmaxf(M, pp[(size_t)s * (r + 2)]);
    float L = 0.0f;
    for (int s = 0; s < nsplit; s++) {
        const float *q = pp + (size_t)s * (r + 2);
        if (q[1] > 0.0f)
            L += expf(q[0] - M) * q[1];
    }
    const float inv = 1.0f / L;
    for (int d = threadIdx.x; d < r; d += blockDim.x) {
        float a = 0.0f;
        for (int s = 0; s < nsplit; s++) {
            const float *q = pp + (size_t)s * (r + 2);
            if (q[1] > 0.0f)
                a += expf(q[0] - M) * q[2 + d];
        }
        out[b * o_row + h * o_head + d] = a * inv;
    }
}

/* The splits a launch of n rows, n_head heads and kv_lora dims takes: enough blocks
 * for four waves of the device's SMs, within the scratch and MLA_MAX_SPLITS, and
 * within what max_len (0: not known, the rows table's) fills with MLA_MIN_CHUNK. */
static int mla_splits(int64_t n, int64_t n_head, int64_t kv_lora, int64_t max_len, size_t scratch_bytes,
                      int *out, bl_err_t *err)
{
    int dev = 0, sms = 0;
    KCUDA_CHECK(cudaGetDevice(&dev), err);
    KCUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), err);
    const int64_t blocks = kc_cdiv(n_head, MLA_G) * n;
    int64_t k = kc_cdiv(4 * (int64_t)sms, blocks);
    const int64_t fit = (int64_t)(scratch_bytes / (sizeof(float) * (size_t)(n * n_head * (kv_lora + 2))));
    k = k < fit ? k : fit;
    k = k < MLA_MAX_SPLITS ? k : MLA_MAX_SPLITS;
    if (max_len > 0 && kc_cdiv(max_len, MLA_MIN_CHUNK) < k)
        k = kc_cdiv(max_len, MLA_MIN_CHUNK);
    *out = k < 1 ? 1 : (int)k;
    return 0;
}

size_t kcuda_mla_scratch_bytes(int64_t n, int64_t n_head, int64_t kv_lora)
{
    if (n < 1 || n_head < 1 || kv_lora < 1)
        return 0;
    return sizeof(float) * (size_t)n * (size_t)n_head * (size_t)(kv_lora + 2) * MLA_MAX_SPLITS;
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
    int nsplit = 1;
    int rc = mla_splits(n, n_head, kv_lora, d_rows ? 0 : pos0 + n, d_scratch ? scratch_bytes : 0, &nsplit, err);
    if (rc < 0)
        return rc;
    cudaStream_t st = (cudaStream_t)stream;
    const dim3 grid((unsigned)kc_cdiv(n_head, MLA_G), (unsigned)nsplit, (unsigned)n);
    const int64_t D = kv_lora + n_rot;
#define MLA_GO(PL)                                                                                           \
    KC_LAUNCH(err, mla_attention_kernel<PL>, grid, MLA_G * 32, 0, st, (const uint8_t *)d_cache, row_bytes, d_rows, \
              layer, pos0, d_ql, ql_row, ql_head, d_qp, qp_row, qp_head, (int)n_head, (int)kv_lora, (int)n_rot,     \
              scale, d_out, o_row, o_head, (float *)d_scratch)
    if (D <= 2 * 64) /* small test shapes */
        MLA_GO(2);
    else if (D <= 9 * 64) /* DeepSeek-V2/V3, Kimi-K2: 512 + 64 */
        MLA_GO(9);
    else
        MLA_GO(MLA_MAX_D / 64);
#undef MLA_GO
    if (nsplit > 1)
        KC_LAUNCH(err, mla_combine_kernel, dim3((unsigned)n_head, (unsigned)n), 256, 0, st, (const float *)d_scratch,
                  nsplit, (int)n_head, (int)kv_lora, d_out, o_row, o_head);
    return 0;
}
