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
 * Numerics: activations are f32. Products over f16, bf16 and f32 weights accumulate
 * in f32 and match the CPU references to within f32 rounding. Products over block
 * formats (q4_K, q5_K, q6_K, q8_0) round the activations to two q8 terms per 32
 * elements (the value, d = amax / 127, and the residual it leaves, rounded the same
 * way) and take integer dot products: they match the references on the rounded
 * activations to within f32 rounding, and differ from the exact product by the
 * rounding (about 0.001 % of |y| on random data with two terms, 0.4 % with one;
 * docs/cuda.md, tests/gpu). Output
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

/* Programmatic dependent launch: the kernels of this library launched on a stream
 * other than the legacy default stream may start while the kernel before them
 * still runs, so that their launch and their weight prefetch overlap its tail
 * (devices of compute capability 9.0 and later; elsewhere launches are ordinary).
 * The ordering of the stream is kept: each kernel waits for its predecessor's
 * results before it reads them. On by default; process-wide and read by each
 * launch, so a captured graph keeps the value it was captured with. Returns the
 * previous value. */
int kcuda_set_pdl(int on);

/* Number of CUDA devices into *n. A machine without a GPU or without a driver
 * (cudaGetDeviceCount gives cudaErrorNoDevice 100 or cudaErrorInsufficientDriver 35)
 * is not an error: *n = 0 and 0 is returned. Other failures return their code. */
int kcuda_device_count(int *n, bl_err_t *err) BL_WUR;

/* Makes device the calling thread's current device, creates its context, and fills
 * info (which may be NULL). BL_ENOTSUP when there is no such device. */
int kcuda_init(int device, kcuda_device_info_t *info, bl_err_t *err) BL_WUR;

/* cudaMalloc of nbytes rounded up to 256: the start is 256-byte aligned and the
 * bytes up to the rounded size are readable, as the matrix kernels' 16-byte loads
 * of a weight tensor's last row need. Caller frees with kcuda_free. BL_ENOMEM names
 * the size asked and what the device has free. */
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

/* A non-blocking stream, with a 1 MiB scratch buffer on the current device for the
 * kernels that hand data from one launch to the next (the tensor-core products'
 * rounded activations); caller destroys with kcuda_stream_destroy. */
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

/* q8 terms per 32-element activation block in the block-format products (every
 * kcuda_matvec* over q4_K, q5_K, q6_K, q8_0): 2 (the default) rounds the value and
 * the residual it leaves, about 16 bits per activation for twice the integer work
 * and the same weight traffic; 1 keeps one q8 term (llama.cpp's precision), for
 * comparison. Process-wide, read by each launch (a captured graph keeps the value
 * it was captured with); returns the previous value, ignores anything but 1 or 2. */
int kcuda_matvec_set_act_terms(int terms);
int kcuda_matvec_act_terms(void);

/* Products of several activation rows over q4_K and q6_K weights run on int8 tensor
 * cores (the same rounded activations, the int32 tiles scaled per sub-block in
 * f32): each activation row's result depends on its own values only, so it has the
 * same bits in any step of that many rows or more, and agrees with the streaming
 * kernel's one-row result to f32 rounding. kcuda_matvec_set_mma(m) sets the fewest
 * rows that take them (default 4; 1: every product of those types; 0: none);
 * returns the previous value, ignores values outside 0..KCUDA_MV_MAX_ROWS. Read at
 * each launch. kcuda_matvec_mma_ok: whether a product of n rows of w takes them. */
int kcuda_matvec_set_mma(int min_rows);
int kcuda_matvec_mma_ok(const kcuda_mat_t *w, int n);

/* y (n, w->nrows) = x (n, w->ncols) times w^T, for n in 1..KCUDA_MV_MAX_ROWS: every
 * weight row is read once for all n activation rows. */
int kcuda_matvec(const kcuda_mat_t *w, const float *d_x, int64_t ldx, int n, float *d_y,
                 int64_t ldy, int accumulate, void *stream, bl_err_t *err) BL_WUR;
/* The same with a bias d_bias (w->nrows; NULL for none) added to each output row
 * after the product and the accumulation: the bits of kcuda_matvec then
 * kcuda_add_bias, in one launch. */
int kcuda_matvec_bias(const kcuda_mat_t *w, const float *d_x, int64_t ldx, int n, const float *d_bias,
                      float *d_y, int64_t ldy, int accumulate, void *stream, bl_err_t *err) BL_WUR;

/* One output of kcuda_matvec_split: `rows` consecutive output rows of the matrix,
 * written at d_y (n rows, ldy floats apart), plus d_bias (rows; NULL for none) as
 * kcuda_matvec_bias adds it. */
typedef struct kcuda_out {
    float *d_y;
    int64_t ldy;
    int64_t rows;
    const float *d_bias;
} kcuda_out_t;

/* Most outputs of one kcuda_matvec_split. */
#define KCUDA_MV_MAX_OUTS 3

/* kcuda_matvec (no accumulate) of a matrix whose rows are several products
 * stacked (q, k and v stored one after another), in one launch: output i takes
 * the next outs[i].rows rows (the rows sum to w->nrows). Each output row is
 * computed as the streaming kernel computes it, so for the block formats (and any
 * matrix too large for kcuda_matvec's small-matrix path) it has the bits the same
 * rows give through kcuda_matvec on a matrix of their own. */
int kcuda_matvec_split(const kcuda_mat_t *w, const float *d_x, int64_t ldx, int n,
                       const kcuda_out_t *outs, int nouts, void *stream, bl_err_t *err) BL_WUR;

/* kcuda_matvec_split of w into outs, and w2's product into out2 (all w2->nrows rows),
 * over the same activation rows: in one launch when w and w2 are a pair of block
 * formats that quantised attention uses (q4_K or q5_K beside q6_K, q5_K or q8_0),
 * else in two. Either way the bits of the two calls. */
int kcuda_matvec_split2(const kcuda_mat_t *w, const kcuda_out_t *outs, int nouts, const kcuda_mat_t *w2,
                        const kcuda_out_t *out2, const float *d_x, int64_t ldx, int n, void *stream,
                        bl_err_t *err) BL_WUR;

/* y (n, gate->nrows) = silu(x gate^T) * (x up^T), the dense SwiGLU FFN's first half
 * in one pass (gate and up of the same type and shape). */
int kcuda_matvec_swiglu(const kcuda_mat_t *gate, const kcuda_mat_t *up, const float *d_x,
                        int64_t ldx, int n, float *d_y, int64_t ldy, void *stream,
                        bl_err_t *err) BL_WUR;

/* How a router scores and chooses (kcpu_route_t's meaning; gating numbered as
 * bl_gating_t): softmax, sigmoid, or the softmax of the chosen logits only
 * (gpt-oss); the choice by score plus d_bias (DeepSeek-V3 and GLM-4.5's
 * exp_probs_b), among the topk_group best of n_group groups (n_group <= 32); the
 * weights normalised to sum 1 (the sum kept at least 2^-14), then scaled. d_logit_bias
 * is added to the logits first (gpt-oss's router bias). */
enum { KCUDA_GATE_SOFTMAX = 1, KCUDA_GATE_SIGMOID = 2, KCUDA_GATE_SOFTMAX_WEIGHT = 3 };
typedef struct kcuda_route {
    int gating;
    int norm;
    float scale;
    int n_group, topk_group;    /* 0 or 1: no groups */
    const float *d_bias;        /* (n_expert) or NULL */
    const float *d_logit_bias;  /* (n_expert) or NULL */
} kcuda_route_t;

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

/* The expert products' extras: the experts' gate and up biases (n_expert,
 * rows_per_expert; NULL: none), added to each slot's products before the
 * activation, and the activation of the pair (KCUDA_ACT_SWIGLU, or gpt-oss's
 * clamped KCUDA_ACT_SWIGLU_OAI). */
typedef struct kcuda_experts_ext {
    const float *gate_b, *up_b;
    int act;
} kcuda_experts_ext_t;

/* kcuda_matvec_experts_swiglu with ext (NULL: the plain SwiGLU): one launch where
 * kcuda_matvec_experts twice and kcuda_experts_act take three. */
int kcuda_matvec_experts_swiglu_ext(const kcuda_mat_t *gate, const kcuda_mat_t *up, int64_t n_expert,
                                    const int32_t *d_ids, int n, int k, const float *d_x, int64_t ldx, float *d_y,
                                    int64_t ldy, const kcuda_experts_ext_t *ext, void *stream,
                                    bl_err_t *err) BL_WUR;

/* kcuda_moe_route then kcuda_matvec_experts_swiglu in one launch: each block
 * routes its row from d_logits (n, n_expert) itself (the same arithmetic, so the
 * same ids, weights and outputs) and d_ids, d_wts (n, k) are written for the down
 * product; a decode step saves the routing kernel's launch. Past 128 experts, or
 * for a routing other than the plain softmax (kcuda_route_plain), it launches the
 * two. */
int kcuda_matvec_experts_swiglu_route(const kcuda_mat_t *gate, const kcuda_mat_t *up,
                                      int64_t n_expert, const float *d_logits, const kcuda_route_t *r,
                                      int32_t *d_ids, float *d_wts, int n, int k,
                                      const float *d_x, int64_t ldx, float *d_y, int64_t ldy,
                                      void *stream, bl_err_t *err) BL_WUR;

/* Down with the weighted sum: y (n, rows_per_expert) = sum over j < k of
 * wts[b * k + j] * (expert ids[b * k + j]'s rows times h row b * k + j), the sum
 * taken in j order. h (n * k, w->ncols) is the SwiGLU output, ldh floats apart. */
int kcuda_matvec_experts_down(const kcuda_mat_t *w, int64_t n_expert, const int32_t *d_ids,
                              const float *d_wts, int n, int k, const float *d_h, int64_t ldh,
                              float *d_y, int64_t ldy, int accumulate, void *stream,
                              bl_err_t *err) BL_WUR;
/* The same with the experts' down biases d_down_b (n_expert, rows_per_expert; NULL:
 * none), each weighted as its expert's output (kcuda_experts_bias_down's sum, in
 * the same launch). */
int kcuda_matvec_experts_down_bias(const kcuda_mat_t *w, int64_t n_expert, const int32_t *d_ids,
                                   const float *d_wts, int n, int k, const float *d_h, int64_t ldh,
                                   const float *d_down_b, float *d_y, int64_t ldy, int accumulate, void *stream,
                                   bl_err_t *err) BL_WUR;

/* kcuda_matvec_experts_down_bias with the slots grouped by expert when there are no
 * biases (d_down_b NULL) and kcuda_experts_grouped_ok says so: each chosen
 * expert's weights are read once for all the slots that chose it, the slots'
 * products go to d_scr (n * k, rows_per_expert; ldscr floats apart), then the
 * weighted sum in j order into y (a second launch). Otherwise
 * kcuda_matvec_experts_down_bias, d_scr unused.
 *
 * The gate/up products (kcuda_matvec_experts, _swiglu, _swiglu_route; without
 * biases) group the same way. Grouped when the step's slots (n * k) are at least
 * twice the experts, so that a chosen expert serves two slots or more on average;
 * kcuda_experts_grouped_ok says whether a product of w would be.
 * kcuda_matvec_set_group(pct) moves the bound: grouped when n * k * 100 >= pct *
 * n_expert (default 200; 0: whenever the tensor-core products take the rows);
 * returns the previous value, ignores a negative one. */
int kcuda_experts_grouped_ok(const kcuda_mat_t *w, int n, int k, int64_t n_expert);
int kcuda_matvec_set_group(int pct);
int kcuda_matvec_experts_down_grouped(const kcuda_mat_t *w, int64_t n_expert, const int32_t *d_ids,
                                      const float *d_wts, int n, int k, const float *d_h, int64_t ldh,
                                      const float *d_down_b, float *d_scr, int64_t ldscr, float *d_y, int64_t ldy,
                                      int accumulate, void *stream, bl_err_t *err) BL_WUR;

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

/* A RoPE (kcpu_rope_t's meaning): n_rot dims rotated by pos * base^(-2i/n_rot) for
 * pair i, with YaRN when freq_scale != 1 or ext_factor != 0 (the angle interpolated
 * by freq_scale, mixed back over the pairs below corr_hi by ext_factor; cos and
 * sin times mscale). Angles in double, as kcpu_rope_table. d_cs, when not NULL, is
 * the step's table of these cosines and sines (kcuda_rope_table over the same d_pos
 * and RoPE): the kernels that rotate q and k per head (kcuda_rms_norm_rope,
 * kcuda_qkv_rows, kcuda_attention_rows_qkv) read row b's pairs there instead of
 * taking them in double per head, with the same bits. */
typedef struct kcuda_rope {
    int n_rot;
    float base, freq_scale, ext_factor, corr_lo, corr_hi, mscale;
    const float *d_cs; /* (n, n_rot / 2, 2): cos, sin of row b's pair i; or NULL */
} kcuda_rope_t;

/* A plain RoPE over n_rot dims. */
static inline kcuda_rope_t kcuda_rope_plain(int n_rot, float base)
{
    const kcuda_rope_t r = {n_rot, base, 1.0f, 0.0f, 0.0f, 0.0f, 1.0f, NULL};
    return r;
}

/* The cosines and sines of rope at positions d_pos (n rows) into d_cs (n, n_rot / 2,
 * 2 floats): the values the per-head kernels take (kc_rope_cs_ext), made once for
 * every layer of a step that shares the RoPE. rope->d_cs is ignored. */
int kcuda_rope_table(const int32_t *d_pos, int64_t n, const kcuda_rope_t *rope, float *d_cs, void *stream,
                     bl_err_t *err) BL_WUR;

/* Per-head RMSNorm (none when d_g is NULL) then NEOX RoPE over the first rope->n_rot
 * dims of each head (the rest kept), in place, in one pass over x (n, n_head,
 * head_dim): the q (or k) normalisation of Qwen3 and its rotation fused; GLM-4.5's
 * partial rotation without norms; gpt-oss's YaRN. */
int kcuda_rms_norm_rope(float *d_x, const float *d_g, const int32_t *d_pos, int64_t n,
                        int64_t n_head, int64_t head_dim, const kcuda_rope_t *rope, float eps,
                        void *stream, bl_err_t *err) BL_WUR;

/* y[i] = silu(g[i]) * u[i] for n elements; y may be g. */
int kcuda_swiglu(float *d_y, const float *d_g, const float *d_u, int64_t n, void *stream,
                 bl_err_t *err) BL_WUR;

/* y[i] += x[i] for n elements (the residual add). */
int kcuda_add(float *d_y, const float *d_x, int64_t n, void *stream, bl_err_t *err) BL_WUR;

/* y (n, d) += bias (d) on every row. */
int kcuda_add_bias(float *d_y, const float *d_bias, int64_t n, int64_t d, void *stream, bl_err_t *err) BL_WUR;

/* a and g (n, n_head * hd) = the first and the second hd values of each head's 2 hd
 * in x (n, n_head * 2 hd): a gated attention's queries and gate. */
int kcuda_split_heads(const float *d_x, int64_t n, int64_t n_head, int64_t hd, float *d_a, float *d_g,
                      void *stream, bl_err_t *err) BL_WUR;

/* y[i] *= sigmoid(g[i]) for n elements. */
int kcuda_mul_sigmoid(float *d_y, const float *d_g, int64_t n, void *stream, bl_err_t *err) BL_WUR;

/* x (n, d) += sigmoid(w . xn[r]) * y[r] on each row r: a shared expert's output y
 * behind its own gate w (d), the dot in float over the row (a block's sum). */
int kcuda_add_gated(float *d_x, const float *d_y, const float *d_w, const float *d_xn, int64_t n, int64_t d,
                    void *stream, bl_err_t *err) BL_WUR;

// --- gated DeltaNet (qwen3next, qwen35moe) -------------------------------------------

/* A gated DeltaNet layer's parameters on the card (kcpu_dnet_t's meaning): the
 * convolution's weights (channels, K), dt_bias and a (Hv), the output norm (S). */
typedef struct kcuda_dnet {
    const float *d_conv_w, *d_dt_bias, *d_a, *d_norm;
    int K, S, Hk, Hv;
    int tiled; /* v head h reads q/k head h % Hk, else h / (Hv / Hk) */
    int ba;    /* beta and alpha in one row grouped by k head */
    float eps;
} kcuda_dnet_t;

/* The shapes the kernels take: S (a head's key and value dims) one of 16, 32, 64,
 * 128; K taps up to KCUDA_DNET_MAX_K. */
#define KCUDA_DNET_MAX_K 16
int kcuda_dnet_supported(int S, int K);

/* One sequence's rows of a step: rows row0..row0 + n, the first at position pos (0:
 * the sequence starts, its state is taken as zero), its recurrent state at state
 * (the card's address of the cache's floats: per DeltaNet layer the convolution's
 * last K - 1 inputs (K - 1, channels), then Hv states of S x S, M[h][i][j] key dim
 * i, value dim j: kcpu_deltanet's layout). A table of them sits on the card, filled
 * before the step's launches (a decode graph reads it at replay). */
typedef struct kcuda_dn_seg {
    uint64_t state;
    int32_t row0, n, pos, _pad;
} kcuda_dn_seg_t;

/* beta (n, Hv) = sigmoid(b), g (n, Hv) = softplus(alpha + dt_bias) * a, as
 * kcpu_dnet_gates: b (n rows b_ld apart) holds both when d->ba, else b and al (al_ld
 * apart) one each. */
int kcuda_dnet_gates(const kcuda_dnet_t *d, const float *d_b, int64_t b_ld, const float *d_al, int64_t al_ld,
                     int64_t n, float *d_beta, float *d_g, void *stream, bl_err_t *err) BL_WUR;

/* kcpu_deltanet for nseg sequences of a step's n rows (d_segs on the card, their
 * rows together n): qkv (n, channels) convolved, silu'd and normed in place, each
 * sequence's state (state_off floats into its state: the layer's) read and updated,
 * out (n, Hv * S) = rmsnorm(o, norm) * silu(z) of each head's output. A launch per
 * stage: the convolution over channels, the norms over rows, the delta rule a block
 * per (head, sequence) with its S x S state in registers, the gated norm. */
int kcuda_deltanet(const kcuda_dnet_t *d, const kcuda_dn_seg_t *d_segs, int64_t nseg, int64_t state_off,
                   float *d_qkv, const float *d_z, const float *d_beta, const float *d_g, float *d_out, int64_t n,
                   void *stream, bl_err_t *err) BL_WUR;

/* The delta rule's columns a block: 0 a whole head's, the row's loads in turn; 16
 * (the default), 32, 64 or 128: at most that many (a head's columns over several
 * blocks, the same arithmetic and bits), the next row's loads ahead. For tests and
 * measurements (BLOOMERY_CUDA_DN_COLS); returns the old setting, other values (-1)
 * leave it. Not thread-safe: set before the launches. */
int kcuda_deltanet_set_cols(int cols);

// --- MoE routing ---------------------------------------------------------------------

/* Most experts and choices kcuda_moe_route handles. */
#define KCUDA_MOE_MAX_EXPERT 512
#define KCUDA_MOE_MAX_K 32

/* Whether r is the plain softmax (optionally normalised) the fused expert kernel
 * routes in place. */
int kcuda_route_plain(const kcuda_route_t *r);

/* For n rows of router logits (n, n_expert): the scores, the k best choices (ties to
 * the lower id), their weights, as r says. ids (n, k) in the order chosen, w (n, k).
 * As kcpu_moe_route, in f32. */
int kcuda_moe_route(const float *d_logits, int64_t n, int64_t n_expert, int k, const kcuda_route_t *r,
                    int32_t *d_ids, float *d_w, void *stream, bl_err_t *err) BL_WUR;

/* The experts' activation between gate/up and down (kcpu's KCPU_ACT_*): silu(g) * u,
 * or gpt-oss's clamped form. */
enum { KCUDA_ACT_SWIGLU = 0, KCUDA_ACT_SWIGLU_OAI = 1 };

/* For slots rows of gate and up products g, u (slots, F), ld floats apart: g + the
 * slot's expert's gate bias, u + its up bias (NULL: none), then the activation,
 * into g, or into h16 (slots, F) in f16 when d_h16 is not NULL (the prompt path's
 * gathered rows). Slot s's expert is d_ids[d_perm[s]] (d_perm NULL: d_ids[s]); an
 * id outside 0..n_expert-1 adds no bias. */
int kcuda_experts_act(float *d_g, const float *d_u, int64_t ld, const int32_t *d_ids, const int32_t *d_perm,
                      const float *d_gate_b, const float *d_up_b, int64_t slots, int64_t F, int64_t n_expert, int act,
                      void *d_h16, void *stream, bl_err_t *err) BL_WUR;

/* x (n, E) += sum over j < k of wts[r k + j] * down_b[ids[r k + j]] (the experts'
 * down biases, weighted as their outputs), skipping ids out of range and the
 * choices whose d_mask entry is negative (residency's slot ids: the host computes
 * those, biases included). */
int kcuda_experts_bias_down(float *d_x, int64_t ldx, const int32_t *d_ids, const int32_t *d_mask, const float *d_wts,
                            const float *d_down_b, int64_t n, int k, int64_t E, int64_t n_expert, void *stream,
                            bl_err_t *err) BL_WUR;

/* Residency's slot ids: out[s] = d_table[ids[s]] (the slot expert ids[s] is served
 * from on the card, or -1) for n (row, choice) slots; an id outside 0..n_expert-1
 * gives -1. The expert kernels read a -1 as an expert that adds nothing. */
int kcuda_moe_remap(const int32_t *d_ids, int64_t n, const int32_t *d_table, int64_t n_expert,
                    int32_t *d_out, void *stream, bl_err_t *err) BL_WUR;

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

/* Most positions of one chunk of the flash-decoding split pass. A grid over L
 * positions uses chunks of 16 (L <= 4096), 32 (<= 8192), 64 (<= 16384) or
 * KCUDA_ATT_CHUNK positions: ceil(L / chunk) chunks per (row, KV head), a block
 * for each up to KCUDA_ATT_SPLITS of them, so that one row's few KV heads still
 * fill the card; past that each block takes several consecutive chunks. */
#define KCUDA_ATT_CHUNK 128
/* Most split blocks per (row, KV head) by default: past 128 chunks each block takes
 * several (kcuda_attention_set_splits). */
#define KCUDA_ATT_SPLITS 128
/* Longest grid kcuda_attention_rows takes in one pass by default (a block per row
 * and query head over the whole context, no split and no combine launch), and the
 * most kcuda_attention_set_short allows. */
#define KCUDA_ATT_SHORT 512
#define KCUDA_ATT_SHORT_MAX 2048
/* Most query heads per KV head (GQA group) the attention kernel takes. */
#define KCUDA_ATT_MAX_GROUP 16

/* Bytes of scratch kcuda_attention needs for n rows, n_head heads, head_dim, and a
 * context of at most max_len positions (pos0 + n); enough for any shorter context
 * too. */
size_t kcuda_attention_scratch_bytes(int64_t n, int64_t n_head, int64_t head_dim,
                                     int64_t max_len);

/* What attention may add to the causal softmax (gpt-oss; NULL or zeros: nothing): a
 * row at position p sees only positions p - window + 1 .. p (window 0: all), and
 * head h's softmax has one more score, d_sinks[h], with no value (d_sinks NULL:
 * none). */
typedef struct kcuda_att_ext {
    int window;
    const float *d_sinks; /* (n_head) on the card */
} kcuda_att_ext_t;

/* Causal GQA attention over the cache for n rows at positions pos0 .. pos0+n-1:
 * out (n, n_head, head_dim) = softmax(scale * q . K[0 .. pos0+b]) V, query head h
 * reading KV head h / (n_head / n_kv_head). q (n, n_head, head_dim) f32. The cache
 * must already hold the rows' own K and V (kcuda_kv_store first). head_dim is 32,
 * 64, 128 or 256; n_head / n_kv_head at most KCUDA_ATT_MAX_GROUP. d_scratch holds
 * kcuda_attention_scratch_bytes(n, n_head, head_dim, pos0 + n) bytes. */
int kcuda_attention(const kcuda_kv_view_t *kv, const float *d_q, float *d_out, int64_t n,
                    int64_t pos0, int64_t n_head, int64_t n_kv_head, int64_t head_dim,
                    float scale, const kcuda_att_ext_t *ext, void *d_scratch, size_t scratch_bytes,
                    void *stream, bl_err_t *err) BL_WUR;

/* --- per-row caches (graph-friendly attention) ---------------------------------------
 * A captured decode step must not bake a sequence's cache address, position or
 * length into its launches: each row reads them from this table on the card, which
 * the step fills with one copy before the graph is replayed. */

/* One row's cache and position. Layer i's K plane starts at k + i * layer_bytes,
 * its V plane v_bytes after the K plane; position t of a plane is t * row_bytes
 * further (row_bytes as in kcuda_kv_view_t, passed to the launchers). */
typedef struct kcuda_kv_row {
    uint64_t k;           /* device address of layer 0's K plane (16-byte aligned) */
    uint64_t layer_bytes; /* from one layer's K plane to the next */
    uint64_t v_bytes;     /* from a layer's K plane to its V plane */
    int32_t pos;          /* the row's position: it writes there and attends to 0..pos */
    int32_t _pad;
} kcuda_kv_row_t;

/* kcuda_kv_store for n rows (n, row_elems) of k and v, row b stored at position
 * d_rows[b].pos of its own cache, layer `layer` of it. */
int kcuda_kv_store_rows(const kcuda_kv_row_t *d_rows, int64_t layer, size_t row_bytes,
                        const float *d_k, const float *d_v, int64_t ld, int64_t n,
                        int64_t row_elems, void *stream, bl_err_t *err) BL_WUR;

/* The decode step's work between the q/k/v products and attention, in one launch:
 * for n rows of q (n, n_head * head_dim), k and v (n, n_kv_head * head_dim), the
 * per-head RMSNorm (gains q_norm, k_norm; both NULL: none) and NEOX RoPE (rope) at
 * d_pos[b] of q and k in place (kcuda_rms_norm_rope's bits), then k and v stored to the rows' caches as
 * kcuda_kv_store_rows stores them. */
int kcuda_qkv_rows(const kcuda_kv_row_t *d_rows, int64_t layer, size_t row_bytes, float *d_q, float *d_k,
                   const float *d_v, const float *d_q_norm, const float *d_k_norm, const int32_t *d_pos,
                   int64_t n, int64_t n_head, int64_t n_kv_head, int64_t head_dim, const kcuda_rope_t *rope,
                   float eps, void *stream, bl_err_t *err) BL_WUR;

/* kcuda_attention for n rows, each over its own cache (d_rows[b], layer `layer`)
 * at positions 0..d_rows[b].pos. max_len bounds every row's pos + 1 and sizes the
 * grid and the chunk (chunks past a row's length return at once); scratch holds
 * kcuda_attention_scratch_bytes(n, n_head, head_dim, max_len) bytes. Up to
 * KCUDA_ATT_SHORT positions (kcuda_attention_set_short) a block per (row, head)
 * takes the whole context in one launch (scratch unused), so its bits follow the row's length alone; past it, the
 * same arithmetic as kcuda_attention: a row gives the same bits through either when
 * max_len equals pos0 + n there (the chunk follows the grid's length), and the same
 * bits in any step over the same max_len, whatever the other rows. */
/* Sets the longest grid (max_len) kcuda_attention_rows takes in one pass, 0 to
 * KCUDA_ATT_SHORT_MAX (0: never); returns the previous value. Process-wide and read
 * at each launch, so a captured graph keeps what it was captured with; for
 * measuring where the one-pass kernel stops paying (BLOOMERY_CUDA_ATT_SHORT). */
int kcuda_attention_set_short(int max_len);
/* Sets the shortest chunk of the split pass, 16 to KCUDA_ATT_CHUNK (a multiple of
 * 16; the schedule above still sets longer ones); returns the previous value.
 * Process-wide and read at each launch, as kcuda_attention_set_short; for measuring
 * the schedule (BLOOMERY_CUDA_ATT_CHUNK). */
int kcuda_attention_set_chunk(int min_chunk);
/* Sets the most split blocks per (row, KV head) of the split pass (KCUDA_ATT_SPLITS by
 * default; 0: no limit, one chunk a block; at most 4096): past it each block takes several consecutive
 * chunks, the next chunk's rows loading under the current one's arithmetic, with a
 * running softmax over its chunks. Returns the previous value. Process-wide and
 * read at each launch, as kcuda_attention_set_short (BLOOMERY_CUDA_ATT_SPLITS). */
int kcuda_attention_set_splits(int max_splits);

int kcuda_attention_rows(const kcuda_kv_row_t *d_rows, int64_t layer, size_t row_bytes,
                         const float *d_q, float *d_out, int64_t n, int64_t max_len,
                         int64_t n_head, int64_t n_kv_head, int64_t head_dim, float scale,
                         const kcuda_att_ext_t *ext,
                         void *d_scratch, size_t scratch_bytes, void *stream,
                         bl_err_t *err) BL_WUR;

/* kcuda_qkv_rows then kcuda_attention_rows (the same arguments), in one launch when
 * max_len is within the one-pass bound (kcuda_attention_set_short): each block
 * normalises and rotates its own q head and its KV head's k, and the group's first
 * block stores k and v at the row's position. The same cache bytes and output bits
 * as the two calls; d_q and d_k are normalised in place only by the two-call path
 * (nothing after attention reads them). Within the bound the rows must be of
 * distinct sequences (a row's context is read while the others' positions are
 * stored). */
int kcuda_attention_rows_qkv(const kcuda_kv_row_t *d_rows, int64_t layer, size_t row_bytes, float *d_q,
                             float *d_k, const float *d_v, const float *d_q_norm, const float *d_k_norm,
                             const int32_t *d_pos, float *d_out, int64_t n, int64_t max_len, int64_t n_head,
                             int64_t n_kv_head, int64_t head_dim, const kcuda_rope_t *rope, float eps,
                             float scale, const kcuda_att_ext_t *ext,
                             void *d_scratch, size_t scratch_bytes, void *stream, bl_err_t *err) BL_WUR;

// --- deepseek2's latent attention (mla.cu) ------------------------------------------

/* Consecutive-pair RoPE (llama.cpp's NORM form, DeepSeek's) in place: pairs (2i,
 * 2i + 1) of the first rope->n_rot dims of head h of row b, which starts at
 * x + b * row_stride + h * head_stride, at position d_pos[b] (kc_rope_cs_ext's
 * angles, YaRN included). */
int kcuda_rope_norm(float *d_x, const int32_t *d_pos, int64_t n, int64_t n_head, int64_t row_stride,
                    int64_t head_stride, const kcuda_rope_t *rope, void *stream, bl_err_t *err) BL_WUR;

/* Per-head products: y[b, h, 0..R) = W_h x[b, h, 0..C) for n rows and n_head heads,
 * W_h rows h R .. h R + R - 1 of d_w16 (n_head R, C) f16 (kcuda_dequant_f16 of the
 * file's tensor); x head h of row b at d_x + b * x_row + h * x_head, y at d_y + b *
 * y_row + h * y_head. f32 sums in a fixed order. */
int kcuda_matvec_heads(const void *d_w16, int64_t n_head, int64_t R, int64_t C, const float *d_x, int64_t x_row,
                       int64_t x_head, int64_t n, float *d_y, int64_t y_row, int64_t y_head, void *stream,
                       bl_err_t *err) BL_WUR;

/* Latent attention: for n rows and n_head query heads, the query (q_lat[b, h] of
 * kv_lora dims, then q_pe[b, h] of n_rot) times scale against every cached row (f16,
 * kv_lora + n_rot dims, row_bytes apart) at positions 0 .. the row's own, the
 * softmax, and out[b, h] (kv_lora dims) = the probabilities times the rows' first
 * kv_lora dims. The cache: d_rows (the decode step's table, layer `layer`, each
 * row's position) or, when d_rows is NULL, d_cache with row b at position pos0 + b.
 * The rows' own latent rows must be stored first. kv_lora and n_rot even, their sum
 * at most 1024. Where kcuda_mla_mma says so (DeepSeek-V2/V3's and Kimi-K2's 512 +
 * 64), the tensor-core form runs: 16 heads a cache read, 32 where a prompt's rows
 * fill the card alone (kcuda_mla_set_heads),
 * the queries (times scale) and the probabilities rounded to f16, f32 sums; the rows
 * must then be 16-byte aligned (d_cache is checked; a rows table's are the
 * caller's). Else the f32 form:
 * each cache row read once per 8 heads. A row's positions split over several blocks
 * (then combined) as far as d_scratch (scratch_bytes; NULL: no split) holds their
 * partial sums, which kcuda_mla_scratch_bytes(n, ...) bytes always do. */
int kcuda_mla_mma(int64_t kv_lora, int64_t n_rot, size_t row_bytes);
size_t kcuda_mla_scratch_bytes(int64_t n, int64_t n_head, int64_t kv_lora);
/* The tensor-core form's heads a block: 16, 32, or 0 (the default) to choose by the
 * launch as above; for tests and measurements (BLOOMERY_CUDA_MLA_HEADS). Returns the
 * old setting; other values (-1) leave it. Not thread-safe: set before the launches. */
int kcuda_mla_set_heads(int heads);
int kcuda_mla_attention(const void *d_cache, const kcuda_kv_row_t *d_rows, int64_t layer, size_t row_bytes,
                        int64_t pos0, const float *d_ql, int64_t ql_row, int64_t ql_head, const float *d_qp,
                        int64_t qp_row, int64_t qp_head, int64_t n, int64_t n_head, int64_t kv_lora, int64_t n_rot,
                        float scale, float *d_out, int64_t o_row, int64_t o_head, void *d_scratch,
                        size_t scratch_bytes, void *stream, bl_err_t *err) BL_WUR;

// --- prompts: tensor-core products, expert grouping, prefill attention (gemm.cu, prefill.cu)
/* The path of steps with many rows per sequence. Weights are dequantized to f16
 * (exactly, then rounded to nearest f16), activations rounded to f16 once per
 * product, products accumulated in f32 on tensor cores and written as f32. So a
 * prompt row's arithmetic differs from a decode row's (8-bit activations): both
 * are within the oracle gates; docs/cuda.md, "Prompts". */

/* out (nrows, w->ncols) f16 = rows row0 .. row0+nrows-1 of w, dequantized as the
 * references do, rounded to f16. w->ncols a multiple of 8; out 16-byte aligned. */
int kcuda_dequant_f16(const kcuda_mat_t *w, int64_t row0, int64_t nrows, void *d_out, void *stream,
                      bl_err_t *err) BL_WUR;

/* The same for a tensor of n_group groups of rows_per_group rows (a layer's experts),
 * all its rows, skipping (leaving as they were) the groups whose d_counts entry is 0:
 * the experts no row of a prompt chose. */
int kcuda_dequant_f16_groups(const kcuda_mat_t *w, int64_t rows_per_group, const int32_t *d_counts, void *d_out,
                             void *stream, bl_err_t *err) BL_WUR;

/* y (n, ncols) f16, ldy halves apart = x (n, ncols) f32 rounded to nearest. ncols,
 * ldx, ldy multiples of 4. */
int kcuda_to_f16(const float *d_x, int64_t ldx, int64_t n, int64_t ncols, void *d_y,
                 int64_t ldy, void *stream, bl_err_t *err) BL_WUR;

/* A cuBLAS handle bound to stream (void * to a cublasHandle_t); destroy with
 * kcuda_blas_destroy. Default math mode: f32 products do not use TF32. */
int kcuda_blas_create(void **out, void *stream, bl_err_t *err) BL_WUR;
void kcuda_blas_destroy(void *blas); /* NULL is a no-op */

/* Weight scratch kcuda_gemm needs to take w in one piece (0 for f32 and f16
 * weights, which are read as stored); less scratch means more pieces. */
size_t kcuda_gemm_scratch_bytes(const kcuda_mat_t *w);

/* y (n, w->nrows) [+]= x (n, w->ncols) w^T. f32 weights: cublasSgemm on the f32
 * activations d_x32 (ldx32 floats apart), exact to f32 rounding. Other types: the
 * f16 activations d_x16 (ldx16 halves apart, 16-byte aligned) times w (f16 as
 * stored, else dequantized into d_wscratch in pieces of whole rows), cublasGemmEx
 * with f32 accumulation. accumulate adds onto y (the residual). */
int kcuda_gemm(void *blas, const kcuda_mat_t *w, const void *d_x16, int64_t ldx16,
               const float *d_x32, int64_t ldx32, int64_t n, float *d_y, int64_t ldy,
               int accumulate, void *d_wscratch, size_t wscratch_bytes, void *stream,
               bl_err_t *err) BL_WUR;

/* Per-head products of n rows on tensor cores, one cuBLAS strided-batched launch:
 * y[b, h, 0..R) = W_h x[b, h, 0..C) for heads h < n_head, W_h rows h R .. h R + R - 1
 * of d_w16 (n_head R, C) f16 (kcuda_dequant_f16 of the file's tensor); x f16, head h
 * of row b at d_x16 + b * ldx + h * x_head (halves); y f32 at d_y + b * ldy + h *
 * y_head. f32 sums. */
int kcuda_gemm_heads(void *blas, const void *d_w16, int64_t n_head, int64_t R, int64_t C, const void *d_x16,
                     int64_t ldx, int64_t x_head, int64_t n, float *d_y, int64_t ldy, int64_t y_head, void *stream,
                     bl_err_t *err) BL_WUR;

/* Expert grouping of n_slots (row, choice) slots, d_ids (n_slots) as
 * kcuda_moe_route writes them: d_counts (n_expert) slots per expert, d_offsets
 * (n_expert + 1) where each expert's slots start in sorted order, d_tile0
 * (n_expert + 1) the same in tiles of KCUDA_GG_ROWS rows, d_perm (n_slots) the slot
 * at each sorted position (each expert's slots in slot order), d_inv (n_slots) the
 * sorted position of each slot (-1 for an id out of range, which takes no place).
 * One block on the card: no host round trip. */
#define KCUDA_GG_ROWS 64
int kcuda_moe_sort(const int32_t *d_ids, int64_t n_slots, int64_t n_expert, int32_t *d_counts,
                   int32_t *d_offsets, int32_t *d_tile0, int32_t *d_perm, int32_t *d_inv,
                   void *stream, bl_err_t *err) BL_WUR;

/* y (n_sorted, ncols) f16 = x row d_perm[p] / k for each sorted position p: the
 * activation rows in expert order, rounded once. */
int kcuda_moe_gather_f16(const float *d_x, int64_t ldx, const int32_t *d_perm, int64_t n_sorted,
                         int k, int64_t ncols, void *d_y, int64_t ldy, void *stream,
                         bl_err_t *err) BL_WUR;

/* y (n_sorted, rows_per_expert) f32, ldy apart: sorted row p (of expert e, from the
 * offsets) times expert e's rows of w (n_expert * rows_per_expert rows of w->ncols,
 * any type kcuda_type_supported takes, read as stored: the weights' tiles are
 * dequantized inside the launch to the halves kcuda_dequant_f16 writes). One launch
 * for all experts (tiles of 64 rows of one expert, or 16 or 32 as
 * kcuda_gemm_set_grouped_rows says, x 64 outputs, mma.sync, f32 accumulation in a
 * fixed order: a row's result does not depend on the other rows or the tile size,
 * and is the same bits for weights given quantized or as their f16 dequantization).
 * w->ncols a multiple of 32, w->data 16-byte aligned; d_offsets, d_tile0 from
 * kcuda_moe_sort. */
int kcuda_gemm_grouped(const kcuda_mat_t *w, int64_t n_expert, int64_t rows_per_expert,
                       const void *d_x16, const int32_t *d_offsets, const int32_t *d_tile0,
                       int64_t n_sorted, float *d_y, int64_t ldy, void *stream,
                       bl_err_t *err) BL_WUR;

/* Sets the grouped GEMM's tile rows (16, 32 or 64; 0: by the rows an expert has on
 * average, n_sorted / n_expert, at most 16 -> 16, at most 32 -> 32, else 64), for
 * tests and measurements (BLOOMERY_CUDA_GG_ROWS); returns the old setting. Other
 * values leave it as it was. Not thread-safe: set before the launches. */
int kcuda_gemm_set_grouped_rows(int rows);

/* h (n) f16 = silu(g) * u. */
int kcuda_swiglu_f16(const float *d_g, const float *d_u, int64_t n, void *d_h, void *stream,
                     bl_err_t *err) BL_WUR;

/* x row b [+]= sum over j < k, in j order, of wts[b k + j] * d row d_inv[b k + j]
 * (skipped when -1): the experts' down outputs, weighted, back in row order. */
int kcuda_moe_combine(const float *d_d, int64_t ldd, const int32_t *d_inv, const float *d_wts,
                      int64_t n, int k, int64_t ncols, float *d_x, int64_t ldx, int accumulate,
                      void *stream, bl_err_t *err) BL_WUR;

/* Causal GQA flash attention for n prompt rows at positions pos0 .. pos0+n-1 over
 * the f16 cache (which holds their K and V already: kcuda_kv_store first), as
 * kcuda_attention, on tensor cores: q rounded to f16 after scaling, scores and
 * sums in f32, probabilities rounded to f16 for the P.V product. head_dim 64 or
 * 128 (BL_ENOTSUP otherwise: use kcuda_attention). No scratch. */
int kcuda_attention_prefill(const kcuda_kv_view_t *kv, const float *d_q, float *d_out, int64_t n,
                            int64_t pos0, int64_t n_head, int64_t n_kv_head, int64_t head_dim,
                            float scale, void *stream, bl_err_t *err) BL_WUR;
/* The same with a window and sinks (ext may be NULL). */
int kcuda_attention_prefill_ext(const kcuda_kv_view_t *kv, const float *d_q, float *d_out, int64_t n,
                                int64_t pos0, int64_t n_head, int64_t n_kv_head, int64_t head_dim,
                                float scale, const kcuda_att_ext_t *ext, void *stream,
                                bl_err_t *err) BL_WUR;

// --- pinned memory, events, graphs, devices (runtime.cu) -----------------------------

/* Page-locked host memory (cudaHostAlloc), so that async copies overlap the host.
 * Caller frees with kcuda_host_free. */
int kcuda_host_alloc(void **out, size_t nbytes, bl_err_t *err) BL_WUR;
void kcuda_host_free(void *p); /* NULL is a no-op */

/* Makes device current for the calling thread (a step thread other than the one
 * that loaded must call it before its first launch). */
int kcuda_set_device(int device, bl_err_t *err) BL_WUR;

/* Fills info for device from its properties without creating a context (so listing
 * the devices costs no memory on them); free_bytes stays 0. */
int kcuda_device_query(int device, kcuda_device_info_t *info, bl_err_t *err) BL_WUR;

/* The current device's free memory now. */
int kcuda_mem_free(size_t *free_bytes, bl_err_t *err) BL_WUR;

/* Device-to-device copy on stream. */
int kcuda_copy(void *d_dst, const void *d_src, size_t nbytes, void *stream, bl_err_t *err) BL_WUR;

/* Timing events (cudaEvent_t as void *). Recorded while stream is being captured,
 * an event becomes a node of the graph that takes its timestamp at each replay. */
int kcuda_event_create(void **out, bl_err_t *err) BL_WUR;
/* An event whose kcuda_event_sync sleeps until it is reached instead of spinning a
 * core (for a host thread that waits while the host's cores compute); no timing. */
int kcuda_event_create_blocking(void **out, bl_err_t *err) BL_WUR;
void kcuda_event_destroy(void *ev);
int kcuda_event_record(void *ev, void *stream, bl_err_t *err) BL_WUR;
int kcuda_event_sync(void *ev, bl_err_t *err) BL_WUR;
int kcuda_event_elapsed_ms(float *ms, void *start, void *end, bl_err_t *err) BL_WUR;
/* The work enqueued on waiter from now on waits for what was enqueued on signaler so
 * far (ev is recorded on signaler for it; an ordering edge, also inside a capture). */
int kcuda_stream_after(void *waiter, void *signaler, void *ev, bl_err_t *err) BL_WUR;

/* Graph capture of what is enqueued on stream (a non-default stream) between
 * kcuda_graph_begin and kcuda_graph_end; the second ends the capture and
 * instantiates it into *exec (caller destroys with kcuda_graph_destroy). A launcher
 * that fails in between leaves the capture open: kcuda_graph_end then ends it and
 * returns the failure. kcuda_graph_launch replays exec on stream. */
/* Enqueues fn(ctx) on stream: it runs on a thread of the CUDA runtime once the work
 * before it is done, and the work after it waits until it returns (a host node when
 * the stream is being captured). fn may block; it must not call CUDA. */
int kcuda_host_call(void *stream, void (*fn)(void *ctx), void *ctx, bl_err_t *err) BL_WUR;

/* Pins nbytes of host memory at p (page-aligned) for the card to read directly,
 * read-only (a file's mapping may be registered); undone by kcuda_host_unregister. */
int kcuda_host_register(const void *p, size_t nbytes, bl_err_t *err) BL_WUR;
void kcuda_host_unregister(const void *p); /* NULL is a no-op */
/* Pins nbytes of host memory at p (page-aligned) for copies from the card to write
 * directly (a shared-memory mapping may be pinned); undone by kcuda_host_unregister. */
int kcuda_host_pin(void *p, size_t nbytes, bl_err_t *err) BL_WUR;

int kcuda_graph_begin(void *stream, bl_err_t *err) BL_WUR;
int kcuda_graph_end(void *stream, void **exec, bl_err_t *err) BL_WUR;
int kcuda_graph_launch(void *exec, void *stream, bl_err_t *err) BL_WUR;
void kcuda_graph_destroy(void *exec); /* NULL is a no-op */

/* The work enqueued on stream from now on waits for ev's last record, also an event
 * of another process (kcuda_ipc_event_open). */
int kcuda_stream_wait(void *stream, void *ev, bl_err_t *err) BL_WUR;

// --- memory and events shared with another process (CUDA IPC; runtime.cu) -------------

/* The opaque form of an exported allocation or event (cudaIpcMemHandle_t,
 * cudaIpcEventHandle_t). */
#define KCUDA_IPC_HANDLE_BYTES 64

/* Whether device reaches peer's memory directly (cudaDeviceCanAccessPeer; a device
 * reaches its own). */
int kcuda_can_access_peer(int device, int peer, int *can, bl_err_t *err) BL_WUR;
/* The handle of d_p, the start of a kcuda_alloc allocation, for another process of
 * this host to open; the memory stays this process's (kcuda_free it after the peer
 * is done). */
int kcuda_ipc_mem_export(const void *d_p, uint8_t handle[KCUDA_IPC_HANDLE_BYTES], bl_err_t *err) BL_WUR;
/* Maps another process's exported allocation into the current device's context
 * (peer access enabled as needed); *d_out reads and writes it. Undo with
 * kcuda_ipc_mem_close. A handle of this process, or a device out of reach, fails. */
int kcuda_ipc_mem_open(void **d_out, const uint8_t handle[KCUDA_IPC_HANDLE_BYTES], bl_err_t *err) BL_WUR;
void kcuda_ipc_mem_close(void *d_p); /* NULL is a no-op */
/* An event another process may wait on (interprocess, no timing); destroy with
 * kcuda_event_destroy. Record it with kcuda_event_record outside a capture. */
int kcuda_ipc_event_create(void **out, bl_err_t *err) BL_WUR;
int kcuda_ipc_event_export(void *ev, uint8_t handle[KCUDA_IPC_HANDLE_BYTES], bl_err_t *err) BL_WUR;
/* Another process's exported event, to wait on with kcuda_stream_wait; destroy with
 * kcuda_event_destroy, before the exporter destroys it. */
int kcuda_ipc_event_open(void **out, const uint8_t handle[KCUDA_IPC_HANDLE_BYTES], bl_err_t *err) BL_WUR;

#ifdef __cplusplus
}
#endif

#endif
