/* deepseek2's multi-head latent attention on the card, in the absorbed form (the
 * CPU's cpu_mla, step for step): consecutive-pair RoPE, each head's product with its
 * own rows of a per-head weight (attn_k_b, attn_v_b, dequantized to f16 by
 * kcuda_dequant_f16 first), and attention of every query head over the one latent
 * cache row per position, whose first kv_lora dims are also the value.
 *
 * These are the plain forms: a block per (row, head) reads the whole cache, so a
 * layer reads it n_head times; correct at every length, and the place to speed up
 * (a block per row for a group of heads reads it once per group). */
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

#define MLA_THREADS 256
#define MLA_TILE 512 /* positions scored per pass: the online softmax's tile */
#define MLA_MAX_D 1024

/* grid (n_head, n): the block of (row b, head h). q = (q_lat[b, h] (r dims), q_pe[b,
 * h] (n_rot dims)) times scale into shared memory; over tiles of positions: the
 * scores (a warp per position, the dot over D in lane order), the tile's maximum,
 * the running sums rescaled, p * the latent value (thread per dimension pair).
 * Positions 0 .. len-1 with len the row's position + 1 (rows: the table's; else
 * pos0 + b + 1 over cache kc). out[b, h] (r dims) normalised. */
static __global__ void __launch_bounds__(MLA_THREADS)
mla_attention_kernel(const uint8_t *kc, size_t rb, const kcuda_kv_row_t *rows, int64_t layer, int64_t pos0,
                     const float *ql, int64_t ql_row, int64_t ql_head, const float *qp, int64_t qp_row,
                     int64_t qp_head, int r, int n_rot, float scale, float *out, int64_t o_row, int64_t o_head)
{
    kc_wait_prior();
    kc_allow_next();
    __shared__ float qs[MLA_MAX_D];
    __shared__ float sc[MLA_TILE];
    __shared__ float red[MLA_THREADS / 32];
    const int h = blockIdx.x, b = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int D = r + n_rot;
    int64_t len = pos0 + b + 1;
    if (rows) {
        const kcuda_kv_row_t rw = rows[b];
        kc = (const uint8_t *)(uintptr_t)(rw.k + (uint64_t)layer * rw.layer_bytes);
        len = (int64_t)rw.pos + 1;
    }
    for (int d = tid; d < D; d += MLA_THREADS)
        qs[d] = (d < r ? ql[b * ql_row + h * ql_head + d] : qp[b * qp_row + h * qp_head + d - r]) * scale;
    __syncthreads();
    float m = -INFINITY, l = 0.0f;
    float acc[MLA_MAX_D / MLA_THREADS];
#pragma unroll
    for (int i = 0; i < MLA_MAX_D / MLA_THREADS; i++)
        acc[i] = 0.0f;
    for (int64_t t0 = 0; t0 < len; t0 += MLA_TILE) {
        const int cnt = len - t0 < MLA_TILE ? (int)(len - t0) : MLA_TILE;
        for (int t = warp; t < cnt; t += MLA_THREADS / 32) {
            const __half *row = (const __half *)(kc + (size_t)(t0 + t) * rb);
            float s = 0.0f;
            for (int d = lane; d < D; d += 32)
                s += qs[d] * __half2float(row[d]);
            s = kc_warp_sum(s);
            if (lane == 0)
                sc[t] = s;
        }
        __syncthreads();
        float tm = -INFINITY;
        for (int t = tid; t < cnt; t += MLA_THREADS)
            tm = fmaxf(tm, sc[t]);
        tm = kc_warp_max(tm);
        if (lane == 0)
            red[warp] = tm;
        __syncthreads();
        tm = red[0];
        for (int w = 1; w < MLA_THREADS / 32; w++)
            tm = fmaxf(tm, red[w]);
        const float nm = fmaxf(m, tm), cf = expf(m - nm); /* m = -inf the first time: cf 0 */
        __syncthreads(); /* red is read by all before it is reused */
        float ts = 0.0f;
        for (int t = tid; t < cnt; t += MLA_THREADS) {
            const float p = expf(sc[t] - nm);
            sc[t] = p;
            ts += p;
        }
        ts = kc_warp_sum(ts);
        if (lane == 0)
            red[warp] = ts;
        __syncthreads();
        ts = 0.0f;
        for (int w = 0; w < MLA_THREADS / 32; w++)
            ts += red[w];
        l = l * cf + ts;
        m = nm;
#pragma unroll
        for (int i = 0; i < MLA_MAX_D / MLA_THREADS; i++) {
            const int d = tid + i * MLA_THREADS;
            if (d >= r)
                break;
            float a = acc[i] * cf;
            for (int t = 0; t < cnt; t++)
                a += sc[t] * __half2float(((const __half *)(kc + (size_t)(t0 + t) * rb))[d]);
            acc[i] = a;
        }
        __syncthreads(); /* sc and red are rewritten by the next tile */
    }
    const float inv = 1.0f / l;
#pragma unroll
    for (int i = 0; i < MLA_MAX_D / MLA_THREADS; i++) {
        const int d = tid + i * MLA_THREADS;
        if (d >= r)
            break;
        out[b * o_row + h * o_head + d] = acc[i] * inv;
    }
}

int kcuda_mla_attention(const void *d_cache, const kcuda_kv_row_t *d_rows, int64_t layer, size_t row_bytes,
                        int64_t pos0, const float *d_ql, int64_t ql_row, int64_t ql_head, const float *d_qp,
                        int64_t qp_row, int64_t qp_head, int64_t n, int64_t n_head, int64_t kv_lora, int64_t n_rot,
                        float scale, float *d_out, int64_t o_row, int64_t o_head, void *stream, bl_err_t *err)
{
    if ((!d_cache && !d_rows) || !d_ql || !d_qp || !d_out || n < 1 || n > 65535 || n_head < 1 || n_head > 65535 ||
        kv_lora < 1 || n_rot < 0 || kv_lora + n_rot > MLA_MAX_D || pos0 < 0 || layer < 0 ||
        row_bytes < (size_t)(kv_lora + n_rot) * 2)
        return bl_err_set(err, BL_EINVAL,
                          "mla_attention: %lld rows, %lld heads, %lld + %lld dims (at most %d), cache rows of %zu "
                          "bytes", (long long)n, (long long)n_head, (long long)kv_lora, (long long)n_rot, MLA_MAX_D,
                          row_bytes);
    const dim3 grid((unsigned)n_head, (unsigned)n);
    KC_LAUNCH(err, mla_attention_kernel, grid, MLA_THREADS, 0, (cudaStream_t)stream, (const uint8_t *)d_cache,
              row_bytes, d_rows, layer, pos0, d_ql, ql_row, ql_head, d_qp, qp_row, qp_head, (int)kv_lora, (int)n_rot,
              scale, d_out, o_row, o_head);
    return 0;
}
