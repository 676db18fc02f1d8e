/* Normalisation, rotation and elementwise kernels: RMSNorm (a block per long row, a
 * warp per short row such as one head), NEOX RoPE, per-head RMSNorm fused with RoPE,
 * SwiGLU and the residual add. All are memory-bound and read each element once. */
#include <math.h>

#include "kcuda_impl.cuh"

#define NORM_WARPS 4
/* Rows up to this long get a warp each; longer ones a block. */
#define NORM_WARP_MAX 512

/* grid (n): one block of KC_NORM_BLOCK threads per row (kc_rms_norm_row). */
__global__ void __launch_bounds__(KC_NORM_BLOCK)
rms_norm_block_kernel(float *y, const float *x, const float *g, int64_t d, int64_t ld, float eps)
{
    kc_wait_prior();
    kc_allow_next();
    __shared__ float part[KC_NORM_BLOCK / 32];
    kc_rms_norm_row(y + blockIdx.x * ld, x + blockIdx.x * ld, g, d, eps, part);
}

/* grid (ceil(n / NORM_WARPS)): one warp per row. */
__global__ void __launch_bounds__(NORM_WARPS * 32)
rms_norm_warp_kernel(float *y, const float *x, const float *g, int64_t n, int64_t d, int64_t ld,
                     float eps)
{
    kc_wait_prior();
    kc_allow_next();
    const int64_t row = (int64_t)blockIdx.x * NORM_WARPS + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= n)
        return;
    const float *xr = x + row * ld;
    float *yr = y + row * ld;
    float ss = 0.0f;
    for (int64_t i = lane; i < d; i += 32)
        ss += xr[i] * xr[i];
    ss = kc_warp_sum(ss);
    const float s = rsqrtf(ss / (float)d + eps);
    for (int64_t i = lane; i < d; i += 32)
        yr[i] = xr[i] * s * g[i];
}

int kcuda_rms_norm(float *d_y, const float *d_x, const float *d_g, int64_t n, int64_t d, int64_t ld,
                   float eps, void *stream, bl_err_t *err)
{
    if (!d_y || !d_x || !d_g || n < 1 || d < 1 || ld < d || n > INT32_MAX)
        return bl_err_set(err, BL_EINVAL, "rms_norm: %lld rows of %lld, ld %lld", (long long)n,
                          (long long)d, (long long)ld);
    cudaStream_t st = (cudaStream_t)stream;
    if (d <= NORM_WARP_MAX)
        KC_LAUNCH(err, rms_norm_warp_kernel, (unsigned)kc_cdiv(n, NORM_WARPS), NORM_WARPS * 32, 0, st, d_y, d_x, d_g, n, d, ld, eps);
    else
        KC_LAUNCH(err, rms_norm_block_kernel, (unsigned)n, KC_NORM_BLOCK, 0, st, d_y, d_x, d_g, d, ld, eps);
    return 0;
}

/* grid (ceil(n * n_head * half / 256)): one thread per rotated pair. */
__global__ void rope_neox_kernel(float *x, const int32_t *pos, int64_t n, int64_t n_head, int64_t hd,
                                 float base)
{
    kc_wait_prior();
    kc_allow_next();
    const int64_t half = hd / 2;
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= n * n_head * half)
        return;
    const int64_t i = idx % half, bh = idx / half, b = bh / n_head;
    float c, s;
    kc_rope_cs(pos[b], i, hd, base, &c, &s);
    float *v = x + bh * hd;
    const float x0 = v[i], x1 = v[i + half];
    v[i] = x0 * c - x1 * s;
    v[i + half] = x0 * s + x1 * c;
}

int kcuda_rope_neox(float *d_x, const int32_t *d_pos, int64_t n, int64_t n_head, int64_t head_dim,
                    float base, void *stream, bl_err_t *err)
{
    if (!d_x || !d_pos || n < 1 || n_head < 1 || head_dim < 2 || head_dim % 2 != 0)
        return bl_err_set(err, BL_EINVAL, "rope_neox: %lld rows, %lld heads of %lld", (long long)n,
                          (long long)n_head, (long long)head_dim);
    const int64_t total = n * n_head * (head_dim / 2);
    KC_LAUNCH(err, rope_neox_kernel, (unsigned)kc_cdiv(total, 256), 256, 0, (cudaStream_t)stream, d_x, d_pos, n, n_head, head_dim, base);
    return 0;
}

/* grid (ceil(n * n_head / NORM_WARPS)): one warp per (row, head). Each lane owns the
 * pairs (i, i + half) it rotates, so the in-place update needs no barrier. */
__global__ void __launch_bounds__(NORM_WARPS * 32)
rms_norm_rope_kernel(float *x, const float *g, const int32_t *pos, int64_t n, int64_t n_head,
                     int64_t hd, kcuda_rope_t r, float eps)
{
    kc_wait_prior();
    kc_allow_next();
    const int64_t bh = (int64_t)blockIdx.x * NORM_WARPS + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (bh >= n * n_head)
        return;
    kc_head_norm_rope(x + bh * hd, x + bh * hd, g, bh / n_head, pos[bh / n_head], hd, r, eps, lane, NULL);
}

/* grid (ceil(n * n_rot / 2 / 256)): a thread per (row, pair). */
__global__ void rope_table_kernel(const int32_t *pos, int64_t n, kcuda_rope_t r, float2 *cs)
{
    kc_wait_prior();
    kc_allow_next();
    const int64_t half = r.n_rot / 2, idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= n * half)
        return;
    float c, s;
    kc_rope_cs_ext(pos[idx / half], idx % half, r, &c, &s);
    cs[idx] = make_float2(c, s);
}

int kcuda_rope_table(const int32_t *d_pos, int64_t n, const kcuda_rope_t *rope, float *d_cs, void *stream,
                     bl_err_t *err)
{
    if (!d_pos || !d_cs || !rope || n < 1 || rope->n_rot < 2 || rope->n_rot % 2 != 0 ||
        (uintptr_t)d_cs % 8 != 0)
        return bl_err_set(err, BL_EINVAL, "rope_table: %lld rows, %d rotated, or a NULL or misaligned buffer",
                          (long long)n, rope ? rope->n_rot : 0);
    kcuda_rope_t r = *rope;
    r.d_cs = NULL;
    KC_LAUNCH(err, rope_table_kernel, (unsigned)kc_cdiv(n * (r.n_rot / 2), 256), 256, 0, (cudaStream_t)stream,
              d_pos, n, r, (float2 *)d_cs);
    return 0;
}

int kcuda_rms_norm_rope(float *d_x, const float *d_g, const int32_t *d_pos, int64_t n, int64_t n_head,
                        int64_t head_dim, const kcuda_rope_t *rope, float eps, void *stream, bl_err_t *err)
{
    if (!d_x || !d_pos || !rope || n < 1 || n_head < 1 || head_dim < 2 || rope->n_rot < 2 || rope->n_rot > head_dim ||
        rope->n_rot % 2 != 0)
        return bl_err_set(err, BL_EINVAL, "rms_norm_rope: %lld rows, %lld heads of %lld, %d rotated", (long long)n,
                          (long long)n_head, (long long)head_dim, rope ? rope->n_rot : 0);
    KC_LAUNCH(err, rms_norm_rope_kernel, (unsigned)kc_cdiv(n * n_head, NORM_WARPS), NORM_WARPS * 32, 0,
                           (cudaStream_t)stream, d_x, d_g, d_pos, n, n_head, head_dim, *rope, eps);
    return 0;
}

__global__ void swiglu_kernel(float *y, const float *g, const float *u, int64_t n)
{
    kc_wait_prior();
    kc_allow_next();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] = kc_silu_mul(g[i], u[i]);
}

__global__ void add_kernel(float *y, const float *x, int64_t n)
{
    kc_wait_prior();
    kc_allow_next();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] += x[i];
}

static unsigned elem_blocks(int64_t n)
{
    const int64_t b = kc_cdiv(n, 256);
    return (unsigned)(b > 4096 ? 4096 : b);
}

int kcuda_swiglu(float *d_y, const float *d_g, const float *d_u, int64_t n, void *stream, bl_err_t *err)
{
    if (!d_y || !d_g || !d_u || n < 1)
        return bl_err_set(err, BL_EINVAL, "swiglu: %lld elements", (long long)n);
    KC_LAUNCH(err, swiglu_kernel, elem_blocks(n), 256, 0, (cudaStream_t)stream, d_y, d_g, d_u, n);
    return 0;
}

int kcuda_add(float *d_y, const float *d_x, int64_t n, void *stream, bl_err_t *err)
{
    if (!d_y || !d_x || n < 1)
        return bl_err_set(err, BL_EINVAL, "add: %lld elements", (long long)n);
    KC_LAUNCH(err, add_kernel, elem_blocks(n), 256, 0, (cudaStream_t)stream, d_y, d_x, n);
    return 0;
}

__global__ void add_bias_kernel(float *y, const float *bias, int64_t n, int64_t d)
{
    kc_wait_prior();
    kc_allow_next();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n * d;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] += bias[i % d];
}

int kcuda_add_bias(float *d_y, const float *d_bias, int64_t n, int64_t d, void *stream, bl_err_t *err)
{
    if (!d_y || !d_bias || n < 1 || d < 1)
        return bl_err_set(err, BL_EINVAL, "add_bias: %lld rows of %lld", (long long)n, (long long)d);
    KC_LAUNCH(err, add_bias_kernel, elem_blocks(n * d), 256, 0, (cudaStream_t)stream, d_y, d_bias, n, d);
    return 0;
}
