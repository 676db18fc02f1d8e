/* The CUDA backend's kernels for decode (one to a few activation rows per step):
 * matrix-vector products over GGML weight formats as stored, RMSNorm, NEOX RoPE,
 * flash-decoding attention over an f16 KV cache, MoE routing, SwiGLU, residual adds
 * and the embedding gather; plus device set-up and memory helpers.
 *
 * A plain C header: no CUDA type appears here. A stream is passed as `void *` (a
 * cudaStream_t; NULL is the default stream). Every launcher checks its arguments
 * (BL_EINVAL / BL_ENOTSUP with a sentence in err), enqueues its kernels on the stream
 * and returns at once; a launch failure is recorded through KCUDA_CHECK. Pointers
 * named d_* or documented "on the card" are device memory. Nothing here allocates
 * except kcuda_alloc, so a decode step's launches can be captured in a CUDA graph.
 *
 * Numerics: activations are f32; weights are dequantized in registers to f32 and
 * accumulated in f32 with FMA. Results match the CPU references in kernels/cpu and
 * common/quant.c to within f32 rounding (tests/gpu states the tolerances). Output
 * rows never depend on the launch shape's timing: every reduction has a fixed order
 * (no atomics), so two runs give the same bits. docs/cuda.md describes each kernel. */
#ifndef KCUDA_H
#define KCUDA_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

#ifdef __cplusplus
extern "C" {
#endif

// --- errors --------------------------------------------------------------------------

/* Records a failed CUDA runtime call (code is its cudaError_t) in err as
 * "CALL failed at FILE:LINE: <cudaGetErrorString> (code N)" and returns the BL_E*
 * code it maps to (allocation: BL_ENOMEM; no device or driver: BL_ENOTSUP; an
 * invalid argument: BL_EINVAL; anything else: BL_EIO). Returns 0 for code 0. */
int kcuda__check(int code, const char *call, const char *file, int line, bl_err_t *err);

/* KCUDA_CHECK(cudaCall(...), err): on failure, records the call, file:line and the
 * CUDA error string in err and returns the BL_E* code from the enclosing function
 * (which must return int). Never exits. */
#define KCUDA_CHECK(call, err)                                                        \
    do {                                                                              \
        int kcuda_rc_ = kcuda__check((int)(call), #call, __FILE__, __LINE__, (err));  \
        if (kcuda_rc_ < 0)                                                            \
            return kcuda_rc_;                                                         \
    } while (0)

// --- device and memory -------------------------------------------------------------

typedef struct kcuda_device_info {
    int id;
    char name[256];
    int cc_major, cc_minor;  /* compute capability, e.g. 9.0 */
    int sm_count;
    size_t total_bytes;      /* global memory */
    size_t free_bytes;       /* free when kcuda_init ran */
    int bus_bits;            /* memory bus width */
    int mem_clock_khz;       /* 0 where the runtime does not say */
    double peak_gbs;         /* 2 * clock * bus / 8, or 0 when the clock is unknown */
} kcuda_device_info_t;

/* Number of CUDA devices into *n. A machine without a GPU or without a driver
 * (cudaGetDeviceCount gives cudaErrorNoDevice 100 or cudaErrorInsufficientDriver 35)
 * is not an error: *n = 0 and 0 is returned. Other failures return their code. */
int kcuda_device_count(int *n, bl_err_t *err) BL_WUR;

/* Makes device the calling thread's current device, creates its context, and fills
 * info (which may be NULL). BL_ENOTSUP when there is no such device. */
int kcuda_init(int device, kcuda_device_info_t *info, bl_err_t *err) BL_WUR;

/* cudaMalloc of nbytes rounded up to 256: the start is 256-byte aligned and the
 * bytes up to the rounded size are readable, as the matrix kernels' 16-byte loads
 * of a weight tensor's last row need. Caller frees with kcuda_free. */
int kcuda_alloc(void **d_out, size_t nbytes, bl_err_t *err) BL_WUR;
void kcuda_free(void *d_p); /* NULL is a no-op */

/* Stream-ordered copies and fill (cudaMemcpyAsync / cudaMemsetAsync). Host memory
 * that is not pinned makes the copy synchronous with the host. */
int kcuda_upload(void *d_dst, const void *src, size_t nbytes, void *stream, bl_err_t *err) BL_WUR;
int kcuda_download(void *dst, const void *d_src, size_t nbytes, void *stream, bl_err_t *err) BL_WUR;
int kcuda_memset(void *d_dst, int byte, size_t nbytes, void *stream, bl_err_t *err) BL_WUR;

/* Waits for stream (NULL: the default stream) and reports the first error of the
 * kernels that ran on it. */
int kcuda_sync(void *stream, bl_err_t *err) BL_WUR;

/* A non-blocking stream; caller destroys with kcuda_stream_destroy. */
int kcuda_stream_create(void **out, bl_err_t *err) BL_WUR;
void kcuda_stream_destroy(void *stream);

// --- weight matrices -----------------------------------------------------------------

/* A weight matrix on the card: nrows rows of ncols elements of type, row_bytes
 * apart, rows contiguous. data must be 16-byte aligned and readable up to the next
 * multiple of 16 past its last byte (kcuda_alloc guarantees both; so does any
 * 256-aligned offset into a kcuda_alloc'd arena whose end is padded). Borrowed. */
typedef struct kcuda_mat {
    const void *data;
    uint32_t type;  /* bl_type_t: f32, f16, bf16, q8_0, q4_K, q5_K or q6_K */
    int64_t ncols;  /* elements per row (the reduction length) */
    int64_t nrows;  /* output features (all experts' rows for a 3-D expert tensor) */
    size_t row_bytes;
} kcuda_mat_t;

/* Fills m; BL_ENOTSUP for a type the kernels do not read, BL_ERANGE when ncols is
 * not whole blocks, BL_EINVAL for a misaligned data pointer. */
int kcuda_mat_init(kcuda_mat_t *m, const void *d_data, uint32_t type, int64_t ncols,
                   int64_t nrows, bl_err_t *err) BL_WUR;

/* Whether the matrix kernels read type (a bl_type_t). */
int kcuda_type_supported(uint32_t type);

// --- matrix-vector products ----------------------------------------------------------
/* Activation rows x are f32 on the card, 16-byte aligned, ldx floats apart (ldx a
 * multiple of 4, at least ncols); outputs y are f32, ldy floats apart. With
 * accumulate set, results are added to y (a fused residual add) instead of stored. */

/* Most activation rows one kcuda_matvec reads with each weight load. */
#define KCUDA_MV_MAX_ROWS 8

/* y (n, w->nrows) = x (n, w->ncols) times w^T, for n in 1..KCUDA_MV_MAX_ROWS: every
 * weight row is read once for all n activation rows. */
int kcuda_matvec(const kcuda_mat_t *w, const float *d_x, int64_t ldx, int n, float *d_y,
                 int64_t ldy, int accumulate, void *stream, bl_err_t *err) BL_WUR;

/* y (n, gate->nrows) = silu(x gate^T) * (x up^T), the dense SwiGLU FFN's first half
 * in one pass (gate and up of the same type and shape). */
int kcuda_matvec_swiglu(const kcuda_mat_t *gate, const kcuda_mat_t *up, const float *d_x,
                        int64_t ldx, int n, float *d_y, int64_t ldy, void *stream,
                        bl_err_t *err) BL_WUR;

/* The routed experts of a 3-D expert tensor, in one launch. w holds n_expert
 * experts of rows_per_expert rows each (w->nrows = n_expert * rows_per_expert);
 * d_ids (n, k) on the card holds the experts each of n activation rows selected
 * (kcuda_moe_route writes it); a slot is one (row, choice) pair, s = row * k + j.
 * An id outside 0..n_expert-1 contributes zeros (never a read out of bounds). */

/* Gate/up: y (n * k, rows_per_expert): slot s's row = expert ids[s]'s rows times
 * x row s / k. */
int kcuda_matvec_experts(const kcuda_mat_t *w, int64_t n_expert, const int32_t *d_ids, int n,
                         int k, const float *d_x, int64_t ldx, float *d_y, int64_t ldy,
                         void *stream, bl_err_t *err) BL_WUR;

/* Gate and up together with SwiGLU: y (n * k, rows_per_expert) = silu(gate_s x) *
 * (up_s x); gate and up of the same type and shape. */
int kcuda_matvec_experts_swiglu(const kcuda_mat_t *gate, const kcuda_mat_t *up,
                                int64_t n_expert, const int32_t *d_ids, int n, int k,
                                const float *d_x, int64_t ldx, float *d_y, int64_t ldy,
                                void *stream, bl_err_t *err) BL_WUR;

/* Down with the weighted sum: y (n, rows_per_expert) = sum over j < k of
 * wts[b * k + j] * (expert ids[b * k + j]'s rows times h row b * k + j), the sum
 * taken in j order. h (n * k, w->ncols) is the SwiGLU output, ldh floats apart. */
int kcuda_matvec_experts_down(const kcuda_mat_t *w, int64_t n_expert, const int32_t *d_ids,
                              const float *d_wts, int n, int k, const float *d_h, int64_t ldh,
                              float *d_y, int64_t ldy, int accumulate, void *stream,
                              bl_err_t *err) BL_WUR;

/* Embedding gather: y (n, table->ncols) = the rows d_ids[0..n) of table,
 * dequantized. An id outside 0..table->nrows-1 gives a row of zeros. */
int kcuda_get_rows(const kcuda_mat_t *table, const int32_t *d_ids, int64_t n, float *d_y,
                   int64_t ldy, void *stream, bl_err_t *err) BL_WUR;

// --- normalisation, position, elementwise --------------------------------------------

/* y (n, d) = x / sqrt(mean(x^2) + eps) * g, row by row; rows ld floats apart in
 * both x and y; y may be x. Per-head norms (q/k) pass n = rows * heads, d = ld =
 * head_dim. */
int kcuda_rms_norm(float *d_y, const float *d_x, const float *d_g, int64_t n, int64_t d,
                   int64_t ld, float eps, void *stream, bl_err_t *err) BL_WUR;

/* NEOX RoPE in place on x (n, n_head, head_dim): pairs (i, i + head_dim/2) of row b
 * rotate by pos[b] * base^(-2i/head_dim) (angles in double, as kcpu_rope_table).
 * d_pos (n) on the card, so a captured graph reads the step's positions. */
int kcuda_rope_neox(float *d_x, const int32_t *d_pos, int64_t n, int64_t n_head,
                    int64_t head_dim, float base, void *stream, bl_err_t *err) BL_WUR;

/* Per-head RMSNorm then NEOX RoPE, in place, in one pass over x (n, n_head,
 * head_dim): the q (or k) normalisation of Qwen3 and its rotation fused. */
int kcuda_rms_norm_rope(float *d_x, const float *d_g, const int32_t *d_pos, int64_t n,
                        int64_t n_head, int64_t head_dim, float eps, float base,
                        void *stream, bl_err_t *err) BL_WUR;

/* y[i] = silu(g[i]) * u[i] for n elements; y may be g. */
int kcuda_swiglu(float *d_y, const float *d_g, const float *d_u, int64_t n, void *stream,
                 bl_err_t *err) BL_WUR;

/* y[i] += x[i] for n elements (the residual add). */
int kcuda_add(float *d_y, const float *d_x, int64_t n, void *stream, bl_err_t *err) BL_WUR;

// --- MoE routing ---------------------------------------------------------------------

/* Most experts and choices kcuda_moe_route handles. */
#define KCUDA_MOE_MAX_EXPERT 512
#define KCUDA_MOE_MAX_K 32

/* For n rows of router logits (n, n_expert): softmax, the k largest logits (ties to
 * the lower id), their probabilities renormalised to sum 1 when norm. ids (n, k) in
 * descending order, w (n, k). As kcpu_moe_route, with the softmax in f32. */
int kcuda_moe_route(const float *d_logits, int64_t n, int64_t n_expert, int k, int norm,
                    int32_t *d_ids, float *d_w, void *stream, bl_err_t *err) BL_WUR;

// --- KV cache and attention ----------------------------------------------------------

/* One layer's f16 KV cache on the card: position t of K at k + t * row_bytes, a row
 * holding n_kv_head * head_dim halves (row_bytes a multiple of 16, k and v 16-byte
 * aligned). */
typedef struct kcuda_kv_view {
    void *k;
    void *v;
    size_t row_bytes;
} kcuda_kv_view_t;

/* Stores rows k and v (n, row_elems) f32, ld floats apart, as f16 (round to
 * nearest even) at positions pos0 .. pos0 + n - 1. */
int kcuda_kv_store(const kcuda_kv_view_t *kv, const float *d_k, const float *d_v, int64_t ld,
                   int64_t pos0, int64_t n, int64_t row_elems, void *stream,
                   bl_err_t *err) BL_WUR;

/* Positions one flash-decoding block covers; a context of L positions is split
 * into ceil(L / KCUDA_ATT_CHUNK) blocks per (row, KV head). */
#define KCUDA_ATT_CHUNK 128
/* Most query heads per KV head (GQA group) the attention kernel takes. */
#define KCUDA_ATT_MAX_GROUP 16

/* Bytes of scratch kcuda_attention needs for n rows, n_head heads, head_dim, and a
 * context of at most max_len positions (pos0 + n). */
size_t kcuda_attention_scratch_bytes(int64_t n, int64_t n_head, int64_t head_dim,
                                     int64_t max_len);

/* Causal GQA attention over the cache for n rows at positions pos0 .. pos0+n-1:
 * out (n, n_head, head_dim) = softmax(scale * q . K[0 .. pos0+b]) V, query head h
 * reading KV head h / (n_head / n_kv_head). q (n, n_head, head_dim) f32. The cache
 * must already hold the rows' own K and V (kcuda_kv_store first). head_dim is 32,
 * 64, 128 or 256; n_head / n_kv_head at most KCUDA_ATT_MAX_GROUP. d_scratch holds
 * kcuda_attention_scratch_bytes(n, n_head, head_dim, pos0 + n) bytes. */
int kcuda_attention(const kcuda_kv_view_t *kv, const float *d_q, float *d_out, int64_t n,
                    int64_t pos0, int64_t n_head, int64_t n_kv_head, int64_t head_dim,
                    float scale, void *d_scratch, size_t scratch_bytes, void *stream,
                    bl_err_t *err) BL_WUR;

#ifdef __cplusplus
}
#endif

#endif
