/* The prompt path's matrix products: weights dequantized to f16 (whole matrices in
 * row pieces, or the routed experts' slices), activations converted to f16 once per
 * product, tensor-core GEMMs with f32 accumulation and output: cuBLAS for dense
 * products, a grouped mma.sync kernel for the experts (rows sorted by expert on the
 * card, one launch per expert matrix and layer). Also the expert grouping itself
 * (counting sort, gather, weighted combine). docs/cuda.md, "Prompts". */
#include <cublas_v2.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "kcuda_impl.cuh"

// --- dequantization to f16 ---------------------------------------------------------

/* K-quant 6-bit scale and min j of a q4_K/q5_K super-block (as quant.c). */
static __device__ __forceinline__ void kq_scale_min(const uint8_t *s, int j, int *sc, int *m)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xf) | (s[j - 4] >> 6) << 4;
        *m = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
    }
}

static __device__ __forceinline__ float ld_half(const uint8_t *p)
{
    return kc_half((uint16_t)(p[0] | p[1] << 8));
}

/* Elements k0 .. k0+7 (k0 a multiple of 8) of one row, in f32, exactly as the
 * reference dequantizers compute them. */
static __device__ __forceinline__ void deq8(const uint8_t *row, uint32_t type, int64_t k0, float v[8])
{
    switch (type) {
    case BL_TYPE_F32: {
        const float4 *p = (const float4 *)(row + 4 * k0);
        const float4 a = p[0], b = p[1];
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
        break;
    }
    case BL_TYPE_F16: {
        const uint16_t *p = (const uint16_t *)(row + 2 * k0);
        for (int i = 0; i < 8; i++)
            v[i] = kc_half(p[i]);
        break;
    }
    case BL_TYPE_BF16: {
        const uint16_t *p = (const uint16_t *)(row + 2 * k0);
        for (int i = 0; i < 8; i++)
            v[i] = kc_bf16(p[i]);
        break;
    }
    case BL_TYPE_Q8_0: {
        const uint8_t *b = row + 34 * (k0 / 32);
        const float d = ld_half(b);
        const int8_t *q = (const int8_t *)(b + 2 + k0 % 32);
        for (int i = 0; i < 8; i++)
            v[i] = (float)q[i] * d;
        break;
    }
    case BL_TYPE_MXFP4: {
        /* byte j of the codes: element j (low nibble) and j + 16 (high) */
        const uint8_t *b = row + 17 * (k0 / 32);
        const float d = kc_mx_scale(b[0]);
        const int l = (int)(k0 % 32), shift = l < 16 ? 0 : 4;
        const uint8_t *qs = b + 1 + (l & 15);
        for (int i = 0; i < 8; i++)
            v[i] = (float)kc_mx_val((qs[i] >> shift) & 0xf) * d;
        break;
    }
    case BL_TYPE_Q4_K:
    case BL_TYPE_Q5_K: {
        const int q5 = type == BL_TYPE_Q5_K;
        const uint8_t *b = row + (q5 ? 176 : 144) * (k0 / 256);
        const int e = (int)(k0 % 256), s = e / 32, l = e % 32;
        int sc, m;
        kq_scale_min(b + 4, s, &sc, &m);
        const float dl = ld_half(b) * (float)sc, ml = ld_half(b + 2) * (float)m;
        const uint8_t *qh = b + 16, *qs = b + (q5 ? 48 : 16) + 32 * (s / 2) + l;
        const int shift = 4 * (s & 1);
        for (int i = 0; i < 8; i++) {
            int q = (qs[i] >> shift) & 0xf;
            if (q5)
                q |= ((qh[l + i] >> s) & 1) << 4;
            v[i] = __fsub_rn(__fmul_rn(dl, (float)q), ml);
        }
        break;
    }
    case BL_TYPE_Q6_K: {
        const uint8_t *b = row + 210 * (k0 / 256);
        const int e = (int)(k0 % 256), h = e / 128, k = (e / 32) % 4, l = e % 32;
        const float dl = ld_half(b + 208) * (float)((const int8_t *)(b + 192))[e / 16];
        const uint8_t *ql = b + 64 * h + 32 * (k & 1) + l, *qh = b + 128 + 32 * h + l;
        for (int i = 0; i < 8; i++) {
            const int lo = (ql[i] >> (4 * (k >> 1))) & 0xf, hi = (qh[i] >> (2 * k)) & 3;
            v[i] = dl * (float)((lo | hi << 4) - 32);
        }
        break;
    }
    default:
        for (int i = 0; i < 8; i++)
            v[i] = 0.0f;
    }
}

/* A thread per 8 elements: out (nrows, ncols) f16 = rows row0.. of w. */
static __global__ void dequant_f16_kernel(const uint8_t *w, uint32_t type, size_t row_bytes, int64_t ncols,
                                          int64_t row0, int64_t nrows, __half *out, const int32_t *counts,
                                          int64_t rows_per_group)
{
    const int64_t per_row = ncols / 8;
    const int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= nrows * per_row)
        return;
    const int64_t r = g / per_row, k0 = (g % per_row) * 8;
    if (counts && counts[(row0 + r) / rows_per_group] == 0)
        return;
    float v[8];
    deq8(w + (size_t)(row0 + r) * row_bytes, type, k0, v);
    __align__(16) __half h[8];
    for (int i = 0; i < 8; i++)
        h[i] = __float2half_rn(v[i]);
    *(uint4 *)(out + r * ncols + k0) = *(const uint4 *)h;
}

static int dequant_f16(const kcuda_mat_t *w, int64_t row0, int64_t nrows, void *d_out, const int32_t *d_counts,
                       int64_t rows_per_group, void *stream, bl_err_t *err)
{
    if (!kcuda_type_supported(w->type) || w->ncols % 8 != 0)
        return bl_err_set(err, BL_ENOTSUP, "dequant to f16: type %u with %lld columns (a multiple of 8)", w->type,
                          (long long)w->ncols);
    if (row0 < 0 || nrows < 0 || row0 + nrows > w->nrows || (uintptr_t)d_out % 16 != 0 ||
        (d_counts && (rows_per_group < 1 || w->nrows % rows_per_group != 0)))
        return bl_err_set(err, BL_EINVAL, "dequant to f16: rows %lld..%lld of %lld (groups of %lld), output %p",
                          (long long)row0, (long long)(row0 + nrows), (long long)w->nrows,
                          (long long)rows_per_group, d_out);
    const int64_t total = nrows * (w->ncols / 8);
    if (total == 0)
        return 0;
    dequant_f16_kernel<<<(unsigned)kc_cdiv(total, 256), 256, 0, (cudaStream_t)stream>>>(
        (const uint8_t *)w->data, w->type, w->row_bytes, w->ncols, row0, nrows, (__half *)d_out, d_counts,
        rows_per_group);
    KCUDA_CHECK_LAUNCH(err);
    return 0;
}

int kcuda_dequant_f16(const kcuda_mat_t *w, int64_t row0, int64_t nrows, void *d_out, void *stream, bl_err_t *err)
{
    return dequant_f16(w, row0, nrows, d_out, NULL, 1, stream, err);
}

int kcuda_dequant_f16_groups(const kcuda_mat_t *w, int64_t rows_per_group, const int32_t *d_counts, void *d_out,
                             void *stream, bl_err_t *err)
{
    return dequant_f16(w, 0, w->nrows, d_out, d_counts, rows_per_group, stream, err);
}

// --- activations to f16 ------------------------------------------------------------

/* A thread per 4 elements; with perm, output row p reads x row perm[p] / k. */
static __global__ void to_f16_kernel(const float *x, int64_t ldx, int64_t n, int64_t ncols, __half *y, int64_t ldy,
                                     const int32_t *perm, int k)
{
    const int64_t per_row = ncols / 4;
    const int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= n * per_row)
        return;
    const int64_t r = g / per_row, c = (g % per_row) * 4;
    const int64_t src = perm ? perm[r] / k : r;
    const float4 v = *(const float4 *)(x + src * ldx + c);
    __half2 *o = (__half2 *)(y + r * ldy + c);
    o[0] = __floats2half2_rn(v.x, v.y);
    o[1] = __floats2half2_rn(v.z, v.w);
}

static int to_f16(const float *d_x, int64_t ldx, int64_t n, int64_t ncols, void *d_y, int64_t ldy,
                  const int32_t *d_perm, int k, void *stream, bl_err_t *err)
{
    if (ncols % 4 || ldx % 4 || ldy % 4 || ldx < ncols || ldy < ncols || (uintptr_t)d_x % 16 ||
        (uintptr_t)d_y % 8)
        return bl_err_set(err, BL_EINVAL, "to f16: %lld columns, ldx %lld, ldy %lld (multiples of 4)",
                          (long long)ncols, (long long)ldx, (long long)ldy);
    const int64_t total = n * (ncols / 4);
    if (total == 0)
        return 0;
    to_f16_kernel<<<(unsigned)kc_cdiv(total, 256), 256, 0, (cudaStream_t)stream>>>(d_x, ldx, n, ncols,
                                                                                   (__half *)d_y, ldy, d_perm, k);
    KCUDA_CHECK_LAUNCH(err);
    return 0;
}

int kcuda_to_f16(const float *d_x, int64_t ldx, int64_t n, int64_t ncols, void *d_y, int64_t ldy, void *stream,
                 bl_err_t *err)
{
    return to_f16(d_x, ldx, n, ncols, d_y, ldy, NULL, 1, stream, err);
}

// --- dense products through cuBLAS -------------------------------------------------
/* cuBLAS is opened at run time (dlopen), not linked: a binary built with CUDA must
 * start where no CUDA library is installed (the CPU worker), and only the prompt
 * path on a card needs cuBLAS. The functions used, by their exported names (the
 * _v2 ones that cublas_v2.h maps the plain names to). */
typedef struct blas_api {
    decltype(&cublasCreate_v2) create;
    decltype(&cublasDestroy_v2) destroy;
    decltype(&cublasSetStream_v2) set_stream;
    decltype(&cublasSetMathMode) set_math_mode;
    cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void *,
                              const void *, cudaDataType, int, const void *, cudaDataType, int, const void *,
                              void *, cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
    cublasStatus_t (*gemm_batched)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                   const void *, const void *, cudaDataType, int, long long, const void *,
                                   cudaDataType, int, long long, const void *, void *, cudaDataType, int, long long,
                                   int, cublasComputeType_t, cublasGemmAlgo_t);
    decltype(&cublasSgemm_v2) sgemm;
    decltype(&cublasGetStatusString) status_string;
} blas_api_t;

static blas_api_t g_blas;
static char g_blas_why[160]; /* why it could not be opened; empty when it was */
static pthread_once_t g_blas_once = PTHREAD_ONCE_INIT;

static void blas_open(void)
{
    char name[32];
    snprintf(name, sizeof name, "libcublas.so.%d", CUBLAS_VER_MAJOR);
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(g_blas_why, sizeof g_blas_why, "%s", e ? e : name);
        return;
    }
    struct {
        void **slot;
        const char *sym;
    } syms[] = {{(void **)&g_blas.create, "cublasCreate_v2"},
                {(void **)&g_blas.destroy, "cublasDestroy_v2"},
                {(void **)&g_blas.set_stream, "cublasSetStream_v2"},
                {(void **)&g_blas.set_math_mode, "cublasSetMathMode"},
                {(void **)&g_blas.gemm_ex, "cublasGemmEx"},
                {(void **)&g_blas.gemm_batched, "cublasGemmStridedBatchedEx"},
                {(void **)&g_blas.sgemm, "cublasSgemm_v2"},
                {(void **)&g_blas.status_string, "cublasGetStatusString"}};
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        *syms[i].slot = dlsym(h, syms[i].sym);
        if (!*syms[i].slot) {
            snprintf(g_blas_why, sizeof g_blas_why, "%s has no %s", name, syms[i].sym);
            memset(&g_blas, 0, sizeof g_blas);
            dlclose(h);
            return;
        }
    }
}

static int blas_check(cublasStatus_t s, const char *call, int line, bl_err_t *err)
{
    if (s == CUBLAS_STATUS_SUCCESS)
        return 0;
    const int rc = s == CUBLAS_STATUS_ALLOC_FAILED ? BL_ENOMEM
                   : s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_ARCH_MISMATCH ? BL_ENOTSUP
                   : s == CUBLAS_STATUS_INVALID_VALUE                                       ? BL_EINVAL
                                                                                            : BL_EIO;
    return bl_err_set(err, rc, "%s failed at %s:%d: %s (status %d)", call, __FILE__, line,
                      g_blas.status_string ? g_blas.status_string(s) : "?", (int)s);
}
#define BLAS_CHECK(call, err)                                               \
    do {                                                                    \
        int blas_rc_ = blas_check((call), #call, __LINE__, (err));          \
        if (blas_rc_ < 0)                                                   \
            return blas_rc_;                                                \
    } while (0)

int kcuda_blas_create(void **out, void *stream, bl_err_t *err)
{
    *out = NULL;
    pthread_once(&g_blas_once, blas_open);
    if (!g_blas.create)
        return bl_err_set(err, BL_ENOTSUP, "cuBLAS could not be opened (%s): prompts on the card need it",
                          g_blas_why);
    cublasHandle_t h = NULL;
    BLAS_CHECK(g_blas.create(&h), err);
    int rc = blas_check(g_blas.set_stream(h, (cudaStream_t)stream), "cublasSetStream", __LINE__, err);
    if (rc == 0) /* no TF32: the f32 products (the router) stay f32 */
        rc = blas_check(g_blas.set_math_mode(h, CUBLAS_DEFAULT_MATH), "cublasSetMathMode", __LINE__, err);
    if (rc < 0) {
        g_blas.destroy(h);
        return rc;
    }
    *out = h;
    return 0;
}

void kcuda_blas_destroy(void *blas)
{
    if (blas && g_blas.destroy) /* a handle exists only when cuBLAS was opened */
        g_blas.destroy((cublasHandle_t)blas);
}

size_t kcuda_gemm_scratch_bytes(const kcuda_mat_t *w)
{
    if (w->type == BL_TYPE_F32 || w->type == BL_TYPE_F16)
        return 0;
    return (size_t)w->nrows * (size_t)w->ncols * 2;
}

/* y (n, m) [+]= A (m, k) rows times x16 (n, k) rows: column-major for cuBLAS,
 * C (m x n) = A^T (k x m, lda) ^T · B (k x n, ldb). */
static int gemm_f16(cublasHandle_t h, const void *a, int64_t lda, const void *x16, int64_t ldx, int64_t m,
                    int64_t n, int64_t k, float *y, int64_t ldy, int acc, bl_err_t *err)
{
    const float alpha = 1.0f, beta = acc ? 1.0f : 0.0f;
    BLAS_CHECK(g_blas.gemm_ex(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)m, (int)n, (int)k, &alpha, a, CUDA_R_16F, (int)lda,
                            x16, CUDA_R_16F, (int)ldx, &beta, y, CUDA_R_32F, (int)ldy, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT),
               err);
    return 0;
}

int kcuda_gemm(void *blas, const kcuda_mat_t *w, const void *d_x16, int64_t ldx16, const float *d_x32,
               int64_t ldx32, int64_t n, float *d_y, int64_t ldy, int accumulate, void *d_wscratch,
               size_t wscratch_bytes, void *stream, bl_err_t *err)
{
    cublasHandle_t h = (cublasHandle_t)blas;
    const int64_t K = w->ncols;
    if (!h || n < 0 || n > INT32_MAX || K > INT32_MAX || ldy < w->nrows || ldy > INT32_MAX)
        return bl_err_set(err, BL_EINVAL, "gemm: %lld rows of %lld, ldy %lld for %lld outputs", (long long)n,
                          (long long)K, (long long)ldy, (long long)w->nrows);
    if (n == 0)
        return 0;
    BLAS_CHECK(g_blas.set_stream(h, (cudaStream_t)stream), err);
    if (w->type == BL_TYPE_F32) { /* exact f32 product on the f32 rows (the router) */
        if (!d_x32 || ldx32 < K)
            return bl_err_set(err, BL_EINVAL, "gemm: f32 weights need the f32 activations");
        const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
        BLAS_CHECK(g_blas.sgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)w->nrows, (int)n, (int)K, &alpha,
                               (const float *)w->data, (int)K, d_x32, (int)ldx32, &beta, d_y, (int)ldy),
                   err);
        return 0;
    }
    if (!d_x16 || ldx16 < K || (uintptr_t)d_x16 % 16)
        return bl_err_set(err, BL_EINVAL, "gemm: f16 activations missing or ldx16 %lld < %lld", (long long)ldx16,
                          (long long)K);
    if (w->type == BL_TYPE_F16)
        return gemm_f16(h, w->data, K, d_x16, ldx16, w->nrows, n, K, d_y, ldy, accumulate, err);
    /* Dequantize in pieces of whole rows that fit the scratch. */
    int64_t piece = (int64_t)(wscratch_bytes / (2 * (size_t)K)) / 64 * 64;
    if (piece < 64 && piece < w->nrows)
        return bl_err_set(err, BL_ERANGE, "gemm: %zu bytes of weight scratch for rows of %lld", wscratch_bytes,
                          (long long)K);
    for (int64_t r = 0; r < w->nrows; r += piece) {
        const int64_t m = w->nrows - r < piece ? w->nrows - r : piece;
        int rc = kcuda_dequant_f16(w, r, m, d_wscratch, stream, err);
        if (rc < 0 || (rc = gemm_f16(h, d_wscratch, K, d_x16, ldx16, m, n, K, d_y + r, ldy, accumulate, err)) < 0)
            return rc;
    }
    return 0;
}

int kcuda_gemm_heads(void *blas, const void *d_w16, int64_t n_head, int64_t R, int64_t C, const void *d_x16,
                     int64_t ldx, int64_t x_head, int64_t n, float *d_y, int64_t ldy, int64_t y_head, void *stream,
                     bl_err_t *err)
{
    cublasHandle_t h = (cublasHandle_t)blas;
    if (!h || !d_w16 || !d_x16 || !d_y || n_head < 1 || n_head > INT32_MAX || R < 1 || R > INT32_MAX || C < 1 ||
        C > INT32_MAX || n < 0 || n > INT32_MAX || ldx < C || ldx > INT32_MAX || ldy < R || ldy > INT32_MAX ||
        x_head < 0 || y_head < 0)
        return bl_err_set(err, BL_EINVAL, "gemm_heads: %lld heads of %lld x %lld, %lld rows, ldx %lld, ldy %lld",
                          (long long)n_head, (long long)R, (long long)C, (long long)n, (long long)ldx,
                          (long long)ldy);
    if (n == 0)
        return 0;
    BLAS_CHECK(g_blas.set_stream(h, (cudaStream_t)stream), err);
    /* column-major per head: Y_h (R x n, ldy) = W_h^T (C x R, lda C)^T X_h (C x n, ldx) */
    const float alpha = 1.0f, beta = 0.0f;
    BLAS_CHECK(g_blas.gemm_batched(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)R, (int)n, (int)C, &alpha, d_w16, CUDA_R_16F,
                                   (int)C, (long long)(R * C), d_x16, CUDA_R_16F, (int)ldx, (long long)x_head, &beta,
                                   d_y, CUDA_R_32F, (int)ldy, (long long)y_head, (int)n_head, CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT),
               err);
    return 0;
}

// --- expert grouping -----------------------------------------------------------------

#define SORT_THREADS 1024
#define GG_BM KCUDA_GG_ROWS /* sorted rows per grouped-GEMM tile */
#define GG_BN 64 /* outputs per tile */
#define GG_BK 32
#define GG_LDS (GG_BK + 8) /* halves per shared row: 80 bytes, conflict-free ldmatrix */

/* One block: warp w counts, then places, the slots of experts w, w + the warp
 * count, ...; a ballot over 32 slots at a time keeps each expert's slots in slot
 * order (stable). */
static __global__ void moe_sort_kernel(const int32_t *ids, int64_t n_slots, int n_expert, int32_t *counts,
                                       int32_t *offsets, int32_t *tile0, int32_t *perm, int32_t *inv)
{
    __shared__ int32_t s_cnt[KCUDA_MOE_MAX_EXPERT], s_off[KCUDA_MOE_MAX_EXPERT];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
    for (int64_t s = threadIdx.x; s < n_slots; s += blockDim.x) {
        const int e = ids[s];
        if (e < 0 || e >= n_expert)
            inv[s] = -1;
    }
    for (int e = warp; e < n_expert; e += nw) {
        int c = 0;
        for (int64_t s0 = 0; s0 < n_slots; s0 += 32) {
            const int64_t s = s0 + lane;
            c += __popc(__ballot_sync(KCUDA_FULL_MASK, s < n_slots && ids[s] == e));
        }
        if (lane == 0) {
            counts[e] = c;
            s_cnt[e] = c;
        }
    }
    __syncthreads();
    /* The starts: lane l sums a run of experts, a warp scan of the runs, then each
     * lane writes its run's starts (shared memory only: no global round trips). */
    if (warp == 0) {
        const int per = (n_expert + 31) / 32, e0 = lane * per, e1 = min(n_expert, e0 + per);
        int c = 0, t = 0;
        for (int e = e0; e < e1; e++) {
            c += s_cnt[e];
            t += (s_cnt[e] + GG_BM - 1) / GG_BM;
        }
        int ci = c, ti = t;
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
            const int cu = __shfl_up_sync(KCUDA_FULL_MASK, ci, d), tu = __shfl_up_sync(KCUDA_FULL_MASK, ti, d);
            if (lane >= d) {
                ci += cu;
                ti += tu;
            }
        }
        int o = ci - c, tt = ti - t;
        for (int e = e0; e < e1; e++) {
            s_off[e] = o;
            offsets[e] = o;
            tile0[e] = tt;
            o += s_cnt[e];
            tt += (s_cnt[e] + GG_BM - 1) / GG_BM;
        }
        if (lane == 31) {
            offsets[n_expert] = ci;
            tile0[n_expert] = ti;
        }
    }
    __syncthreads();
    for (int e = warp; e < n_expert; e += nw) {
        int at = s_off[e];
        for (int64_t s0 = 0; s0 < n_slots; s0 += 32) {
            const int64_t s = s0 + lane;
            const int hit = s < n_slots && ids[s] == e;
            const unsigned b = __ballot_sync(KCUDA_FULL_MASK, hit);
            if (hit) {
                const int p = at + __popc(b & ((1u << lane) - 1));
                perm[p] = (int32_t)s;
                inv[s] = p;
            }
            at += __popc(b);
        }
    }
}

int kcuda_moe_sort(const int32_t *d_ids, int64_t n_slots, int64_t n_expert, int32_t *d_counts, int32_t *d_offsets,
                   int32_t *d_tile0, int32_t *d_perm, int32_t *d_inv, void *stream, bl_err_t *err)
{
    if (n_slots < 0 || n_slots > INT32_MAX / 2 || n_expert < 1 || n_expert > KCUDA_MOE_MAX_EXPERT)
        return bl_err_set(err, BL_EINVAL, "moe sort: %lld slots over %lld experts (1..%d)", (long long)n_slots,
                          (long long)n_expert, KCUDA_MOE_MAX_EXPERT);
    moe_sort_kernel<<<1, SORT_THREADS, 0, (cudaStream_t)stream>>>(d_ids, n_slots, (int)n_expert, d_counts,
                                                                  d_offsets, d_tile0, d_perm, d_inv);
    KCUDA_CHECK_LAUNCH(err);
    return 0;
}

int kcuda_moe_gather_f16(const float *d_x, int64_t ldx, const int32_t *d_perm, int64_t n_sorted, int k,
                         int64_t ncols, void *d_y, int64_t ldy, void *stream, bl_err_t *err)
{
    if (k < 1)
        return bl_err_set(err, BL_EINVAL, "moe gather: k %d", k);
    return to_f16(d_x, ldx, n_sorted, ncols, d_y, ldy, d_perm, k, stream, err);
}

/* h16 = silu(g) * u, elementwise, in f16. */
static __global__ void swiglu_f16_kernel(const float *g, const float *u, int64_t n, __half *h)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        h[i] = __float2half_rn(kc_silu_mul(g[i], u[i]));
}

int kcuda_swiglu_f16(const float *d_g, const float *d_u, int64_t n, void *d_h, void *stream, bl_err_t *err)
{
    if (n <= 0)
        return n == 0 ? 0 : bl_err_set(err, BL_EINVAL, "swiglu f16: n %lld", (long long)n);
    swiglu_f16_kernel<<<(unsigned)kc_cdiv(n, 256), 256, 0, (cudaStream_t)stream>>>(d_g, d_u, n, (__half *)d_h);
    KCUDA_CHECK_LAUNCH(err);
    return 0;
}

/* x row b [+]= sum over j of wts[b k + j] * d row inv[b k + j], j in order. */
static __global__ void moe_combine_kernel(const float *d, int64_t ldd, const int32_t *inv, const float *wts,
                                          int64_t n, int k, int64_t ncols, float *x, int64_t ldx, int acc)
{
    const int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= n * ncols)
        return;
    const int64_t b = g / ncols, c = g % ncols;
    float s = 0.0f;
    for (int j = 0; j < k; j++) {
        const int p = inv[b * k + j];
        if (p >= 0)
            s += wts[b * k + j] * d[(int64_t)p * ldd + c];
    }
    x[b * ldx + c] = acc ? x[b * ldx + c] + s : s;
}

int kcuda_moe_combine(const float *d_d, int64_t ldd, const int32_t *d_inv, const float *d_wts, int64_t n, int k,
                      int64_t ncols, float *d_x, int64_t ldx, int accumulate, void *stream, bl_err_t *err)
{
    if (n < 0 || k < 1 || ldd < ncols || ldx < ncols)
        return bl_err_set(err, BL_EINVAL, "moe combine: n %lld, k %d, %lld columns", (long long)n, k,
                          (long long)ncols);
    if (n * ncols == 0)
        return 0;
    moe_combine_kernel<<<(unsigned)kc_cdiv(n * ncols, 256), 256, 0, (cudaStream_t)stream>>>(
        d_d, ldd, d_inv, d_wts, n, k, ncols, d_x, ldx, accumulate);
    KCUDA_CHECK_LAUNCH(err);
    return 0;
}

// --- grouped GEMM over experts (mma.sync) --------------------------------------------

/* Block: 4 warps, a BM x 64 tile of one expert's output (sorted rows x outputs),
 * BM 64, 32 or 16 (kcuda_gemm_set_grouped_rows: a tile's rows past its expert's
 * are products thrown away); warp (wm, wn) owns 16 MI x 8 NJ (64: 32 x 32;
 * 32: 32 x 16; 16: 16 x 16). grid (ceil(rows_per_expert / 64), tile count bound x
 * 64 / BM); block y / (64 / BM) finds its expert from tile0 (the sort's tiles of 64
 * rows), y % (64 / BM) its part of that tile (none past the expert's rows: it
 * returns). K in steps of 32, two stages: the rows' f16
 * tile by cp.async; the weights' tile by cp.async when they are f16, otherwise
 * dequantized by the threads (deq8, the reference's arithmetic, rounded to f16: the
 * same halves kcuda_dequant_f16 writes), the next step's into registers before the
 * current step's products and stored after them, so that the weights are read once,
 * as stored, and their load latency hides behind the tensor cores. */
template <uint32_t T, int BM>
static __global__ void __launch_bounds__(128) gemm_grouped_kernel(const uint8_t *w, size_t row_bytes,
                                                                  int64_t rows_per_expert, int64_t K,
                                                                  const __half *x, const int32_t *offsets,
                                                                  const int32_t *tile0, int n_expert, float *y,
                                                                  int64_t ldy)
{
    constexpr int MI = BM == 16 ? 1 : 2, NJ = BM == 64 ? 4 : 2, WN = GG_BN / (8 * NJ), SUB = GG_BM / BM;
    static_assert(BM == 64 || BM == 32 || BM == 16, "tile rows");
    static_assert((BM / (16 * MI)) * WN == 4, "four warps cover the tile");
    __shared__ __align__(16) __half sa[2][BM * GG_LDS];
    __shared__ __align__(16) __half sb[2][GG_BN * GG_LDS];
    const int t = blockIdx.y / SUB;
    if (t >= tile0[n_expert])
        return;
    int lo = 0, hi = n_expert; /* the expert e with tile0[e] <= t < tile0[e + 1] */
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (tile0[mid] <= t)
            lo = mid;
        else
            hi = mid;
    }
    const int e = lo;
    const int64_t m0 = offsets[e] + (int64_t)(t - tile0[e]) * GG_BM + (int64_t)(blockIdx.y % SUB) * BM;
    const int64_t m_end = offsets[e + 1];
    if (SUB > 1 && m0 >= m_end) /* a part past the expert's rows (a whole tile always has some) */
        return;
    const int64_t n0 = (int64_t)blockIdx.x * GG_BN;
    const uint8_t *wb = w + (size_t)e * (size_t)rows_per_expert * row_bytes;

    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, wm = warp / WN, wn = warp % WN;
    float acc[MI][NJ][4];
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int j = 0; j < NJ; j++)
#pragma unroll
            for (int q = 0; q < 4; q++)
                acc[i][j][q] = 0.0f;

    /* A stage: BM rows x 4 16-byte chunks of A and 64 x 4 of f16 B, 2 of each a thread
     * at most. */
    auto load = [&](int stage, int64_t k0) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int c = tid + 128 * i, r = c / 4, kc = (c % 4) * 8;
            if (BM == 64 || c < BM * 4) {
                const int64_t ra = m0 + r;
                const int oka = ra < m_end;
                kc_cp_async16(&sa[stage][r * GG_LDS + kc], x + (oka ? ra : m0) * K + k0 + kc, oka ? 16 : 0);
            }
            if (T == BL_TYPE_F16) {
                const int64_t rb = n0 + r;
                const int okb = rb < rows_per_expert;
                kc_cp_async16(&sb[stage][r * GG_LDS + kc], wb + (okb ? rb : 0) * row_bytes + 2 * (k0 + kc),
                              okb ? 16 : 0);
            }
        }
        kc_cp_async_commit();
    };
    /* Quantized B: thread t dequantizes row t / 2 of the tile, elements kc and kc + 16
     * (kc = 8 (t % 2)): for MXFP4 the same 8 code bytes, low and high nibbles. */
    const int br = tid / 2, bk = 8 * (tid % 2);
    const int bok = n0 + br < rows_per_expert;
    const uint8_t *brow = wb + (size_t)(bok ? n0 + br : 0) * row_bytes;
    uint4 bq[2];
    auto fetch_b = [&](int64_t k0) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            float v[8];
            deq8(brow, T, k0 + bk + 16 * i, v);
            __align__(16) __half h[8];
#pragma unroll
            for (int q = 0; q < 8; q++)
                h[q] = __float2half_rn(bok ? v[q] : 0.0f);
            bq[i] = *(const uint4 *)h;
        }
    };
    auto store_b = [&](int stage) {
#pragma unroll
        for (int i = 0; i < 2; i++)
            *(uint4 *)&sb[stage][br * GG_LDS + bk + 16 * i] = bq[i];
    };

    const int64_t nk = K / GG_BK;
    load(0, 0);
    if (T != BL_TYPE_F16) {
        fetch_b(0);
        store_b(0);
    }
    for (int64_t kt = 0; kt < nk; kt++) {
        const int st = (int)(kt & 1);
        if (kt + 1 < nk) {
            load(st ^ 1, (kt + 1) * GG_BK);
            if (T != BL_TYPE_F16)
                fetch_b((kt + 1) * GG_BK);
            kc_cp_async_wait<1>();
        } else {
            kc_cp_async_wait<0>();
        }
        __syncthreads();
#pragma unroll
        for (int ks = 0; ks < GG_BK; ks += 16) {
            unsigned a[MI][4], b[NJ / 2][4];
#pragma unroll
            for (int i = 0; i < MI; i++)
                kc_ldsm_x4(a[i], &sa[st][(wm * 16 * MI + i * 16 + lane % 16) * GG_LDS + ks + (lane / 16) * 8]);
#pragma unroll
            for (int j = 0; j < NJ / 2; j++)
                kc_ldsm_x4(b[j], &sb[st][(wn * 8 * NJ + j * 16 + (lane & 7) + ((lane >> 4) << 3)) * GG_LDS + ks +
                                       ((lane >> 3) & 1) * 8]);
#pragma unroll
            for (int i = 0; i < MI; i++)
#pragma unroll
                for (int j = 0; j < NJ; j++)
                    kc_mma16816(acc[i][j], a[i], b[j / 2][(j % 2) * 2], b[j / 2][(j % 2) * 2 + 1]);
        }
        /* the other stage was last read before the previous barrier */
        if (T != BL_TYPE_F16 && kt + 1 < nk)
            store_b(st ^ 1);
        __syncthreads(); /* the stage is refilled next iteration */
    }

#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int j = 0; j < NJ; j++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int64_t r = m0 + wm * 16 * MI + i * 16 + lane / 4 + 8 * h;
                const int64_t c = n0 + wn * 8 * NJ + j * 8 + 2 * (lane % 4);
                if (r >= m_end)
                    continue;
                if (c < rows_per_expert)
                    y[r * ldy + c] = acc[i][j][2 * h];
                if (c + 1 < rows_per_expert)
                    y[r * ldy + c + 1] = acc[i][j][2 * h + 1];
            }
}

/* The grouped GEMM's tile rows: 16, 32 or 64 as kcuda_gemm_set_grouped_rows says, or
 * with 0 by the rows an expert has on average (n_sorted / n_expert: at most 16 -> 16,
 * at most 32 -> 32, else 64). A 512-row prompt of gpt-oss-120b gives its experts 16
 * rows each on average, where a 64-row tile's products are mostly thrown away. */
static int g_gg_rows = 64;

int kcuda_gemm_set_grouped_rows(int rows)
{
    const int old = g_gg_rows;
    if (rows == 0 || rows == 16 || rows == 32 || rows == 64)
        g_gg_rows = rows;
    return old;
}

static int gg_tile_rows(int64_t n_sorted, int64_t n_expert)
{
    if (g_gg_rows != 0)
        return g_gg_rows;
    const int64_t avg = (n_sorted + n_expert - 1) / n_expert;
    return avg <= 16 ? 16 : avg <= 32 ? 32 : 64;
}

int kcuda_gemm_grouped(const kcuda_mat_t *w, int64_t n_expert, int64_t rows_per_expert, const void *d_x16,
                       const int32_t *d_offsets, const int32_t *d_tile0, int64_t n_sorted, float *d_y, int64_t ldy,
                       void *stream, bl_err_t *err)
{
    const int64_t k = w->ncols;
    if (k % GG_BK != 0 || k <= 0 || rows_per_expert < 1 || n_expert < 1 || n_expert > KCUDA_MOE_MAX_EXPERT ||
        w->nrows != n_expert * rows_per_expert || ldy < rows_per_expert || (uintptr_t)w->data % 16 ||
        (uintptr_t)d_x16 % 16)
        return bl_err_set(err, BL_EINVAL, "grouped gemm: k %lld (a multiple of %d), %lld rows per expert, %lld "
                          "experts, %lld rows, ldy %lld", (long long)k, GG_BK, (long long)rows_per_expert,
                          (long long)n_expert, (long long)w->nrows, (long long)ldy);
    if (n_sorted == 0)
        return 0;
    /* Tiles: each expert's rows in pieces of GG_BM, at most n_sorted / GG_BM + n_expert;
     * each in 64 / bm blocks of bm rows */
    const int64_t tiles = n_sorted / GG_BM + n_expert;
    const int bm = gg_tile_rows(n_sorted, n_expert);
    if (tiles * (GG_BM / bm) > 65535)
        return bl_err_set(err, BL_ERANGE, "grouped gemm: %lld rows", (long long)n_sorted);
    const dim3 grid((unsigned)kc_cdiv(rows_per_expert, GG_BN), (unsigned)(tiles * (GG_BM / bm)));
    const uint8_t *wd = (const uint8_t *)w->data;
    const __half *x16 = (const __half *)d_x16;
    cudaStream_t s = (cudaStream_t)stream;
#define GG_GO(TY, BMV)                                                                                          \
    gemm_grouped_kernel<TY, BMV><<<grid, 128, 0, s>>>(wd, w->row_bytes, rows_per_expert, k, x16, d_offsets, d_tile0, \
                                                      (int)n_expert, d_y, ldy)
#define GG_CASE(TY)                                                                                            \
    case TY:                                                                                                   \
        if (bm == 16)                                                                                          \
            GG_GO(TY, 16);                                                                                     \
        else if (bm == 32)                                                                                     \
            GG_GO(TY, 32);                                                                                     \
        else                                                                                                   \
            GG_GO(TY, 64);                                                                                     \
        break;
    switch (w->type) {
        GG_CASE(BL_TYPE_F32)
        GG_CASE(BL_TYPE_F16)
        GG_CASE(BL_TYPE_BF16)
        GG_CASE(BL_TYPE_Q8_0)
        GG_CASE(BL_TYPE_MXFP4)
        GG_CASE(BL_TYPE_Q4_K)
        GG_CASE(BL_TYPE_Q5_K)
        GG_CASE(BL_TYPE_Q6_K)
    default:
        return bl_err_set(err, BL_ENOTSUP, "grouped gemm: weights of type %u", w->type);
    }
#undef GG_CASE
#undef GG_GO
    KCUDA_CHECK_LAUNCH(err);
    return 0;
}
