/* The CPU backend: the ops a model's forward pass calls (matmul over GGML weight
 * formats, rms_norm, rope, causal attention over a KV cache, softmax/top-k routing,
 * SwiGLU), a thread pool that splits them, and the dot-product kernels beneath them
 * (one scalar _ref per weight/activation format pair, SIMD variants beside it).
 *
 * Numeric modes, fixed when a context is created:
 *   precise: activations stay f32; a weight row is dequantized exactly with the
 *            reference dequantizer and dotted in f32 (the _ref dot sums in double).
 *   fast:    activations are quantized to the weight's partner format and dotted
 *            in integers; a weight format without an integer kernel takes the
 *            precise path. By default (KCPU_FAST16) K-quant weights meet 16-bit
 *            activations (kcpu_block_q16_K, _mm256_madd_epi16 against int16 weights
 *            times their scales), and q8_0, q4_0 and mxfp4 weights 16-bit activations
 *            in blocks of 32 (kcpu_block_q16_0); a K-quant matrix marked act_q8 (the
 *            output head) keeps two q8_K rows, the value and the residual it
 *            leaves. KCPU_FAST8 keeps one q8 term, as llama.cpp does; its
 *            error is llama.cpp's (mean |dlogit| ~0.06 on the tiny oracle model
 *            against ~0.0009 for 16 bits). f32 and f16 weights are dotted in f32.
 * Results never depend on the thread count: every output element is computed by
 * one thread with the same code in the same order. Nor on the batch: a batch of
 * K-quant products unpacks each weight row once per tile (kcpu_kunpacked16_t,
 * kcpu_kunpacked_t) and its kernels form the packed kernels' integer lane sums and
 * repeat their float steps, so a row gets the same bits alone, in a prompt, or in
 * kcpu_matmul_many. */
#ifndef KCPU_H
#define KCPU_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

// --- kernel variants ---------------------------------------------------------------

/* Picks the kernel set once from CPUID: avx512 where the CPU (and its OS) runs it,
 * else avx2, else ref; later calls are free. BLOOMERY_CPU_KERNELS=ref|avx2|avx512 in
 * the environment forces a set (one the CPU lacks falls back to the default).
 * Thread-safe. Returns the chosen set's name. The avx512 set is the avx2 set with
 * the 16-bit activation dots, the multi-row dots and the batch tile in AVX-512
 * VNNI, giving the same bits. */
const char *kcpu_init(void);

/* Forces a kernel set by name ("ref", "avx2", "avx512"); BL_ENOTSUP if the CPU
 * lacks it, BL_EINVAL for an unknown name. For tests and benchmarks; not
 * thread-safe against running kernels. */
int kcpu_select(const char *name) BL_WUR;

/* Name of the kernel set in use ("ref", "avx2" or "avx512"). */
const char *kcpu_variant_name(void);

/* Whether this CPU can run the avx2 set (AVX2, FMA, F16C). */
int kcpu_have_avx2(void);

/* Whether this CPU (and its OS, which must save the 512-bit state) can run the
 * avx512 set: the avx2 set's needs and AVX-512 F, BW, VL and VNNI. */
int kcpu_have_avx512(void);

// --- dot products --------------------------------------------------------------------
/* kcpu_vec_dot_<weight fmt>_<act fmt>_<variant>: the dot of n elements (a multiple
 * of the weight's block size) of a weight row w and an activation row x, both in
 * their block formats (common/blocks.h). */

float kcpu_vec_dot_f32_f32_ref(const float *w, const float *x, int64_t n);
float kcpu_vec_dot_f16_f32_ref(const uint16_t *w, const float *x, int64_t n);
float kcpu_vec_dot_q8_0_q8_0_ref(const void *w, const void *x, int64_t n);
float kcpu_vec_dot_q4_0_q8_0_ref(const void *w, const void *x, int64_t n);
float kcpu_vec_dot_mxfp4_q8_0_ref(const void *w, const void *x, int64_t n);
float kcpu_vec_dot_q4_K_q8_K_ref(const void *w, const void *x, int64_t n);
float kcpu_vec_dot_q5_K_q8_K_ref(const void *w, const void *x, int64_t n);
float kcpu_vec_dot_q6_K_q8_K_ref(const void *w, const void *x, int64_t n);

float kcpu_vec_dot_f32_f32_avx2(const float *w, const float *x, int64_t n);
float kcpu_vec_dot_f16_f32_avx2(const uint16_t *w, const float *x, int64_t n);
float kcpu_vec_dot_q8_0_q8_0_avx2(const void *w, const void *x, int64_t n);
float kcpu_vec_dot_q4_0_q8_0_avx2(const void *w, const void *x, int64_t n);
float kcpu_vec_dot_mxfp4_q8_0_avx2(const void *w, const void *x, int64_t n);
float kcpu_vec_dot_q4_K_q8_K_avx2(const void *w, const void *x, int64_t n);
float kcpu_vec_dot_q5_K_q8_K_avx2(const void *w, const void *x, int64_t n);
float kcpu_vec_dot_q6_K_q8_K_avx2(const void *w, const void *x, int64_t n);

/* kcpu_vec_dotp_*: one weight row against two activation rows xa and xb (one q8_0
 * term each, KCPU_FAST8): out[0] and out[1] are what the same set's dot of each
 * gives, bit for bit; the SIMD variants decode each weight block once for both
 * (a batch's rows in pairs). */
void kcpu_vec_dotp_q8_0_q8_0_ref(const void *w, const void *xa, const void *xb, int64_t n, float out[2]);
void kcpu_vec_dotp_mxfp4_q8_0_ref(const void *w, const void *xa, const void *xb, int64_t n, float out[2]);
void kcpu_vec_dotp_q8_0_q8_0_avx2(const void *w, const void *xa, const void *xb, int64_t n, float out[2]);
void kcpu_vec_dotp_mxfp4_q8_0_avx2(const void *w, const void *xa, const void *xb, int64_t n, float out[2]);
void kcpu_vec_dotp_q8_0_q8_0_avx512(const void *w, const void *xa, const void *xb, int64_t n, float out[2]);
void kcpu_vec_dotp_mxfp4_q8_0_avx512(const void *w, const void *xa, const void *xb, int64_t n, float out[2]);
/* The same bits as the avx2 q8_0 and mxfp4 dots, where kcpu_have_avx512(). */
float kcpu_vec_dot_q8_0_q8_0_avx512(const void *w, const void *x, int64_t n);
float kcpu_vec_dot_mxfp4_q8_0_avx512(const void *w, const void *x, int64_t n);
/* kcpu_vec_dot2_*: dot(w, x0) + dot(w, x1), one K-quant weight row against an
 * activation row's two q8_K terms (a matrix marked act_q8 in KCPU_FAST16); the SIMD
 * variants unpack each weight block once for both. */
float kcpu_vec_dot2_q4_K_q8_K_ref(const void *w, const void *x0, const void *x1, int64_t n);
float kcpu_vec_dot2_q5_K_q8_K_ref(const void *w, const void *x0, const void *x1, int64_t n);
float kcpu_vec_dot2_q6_K_q8_K_ref(const void *w, const void *x0, const void *x1, int64_t n);
float kcpu_vec_dot2_q4_K_q8_K_avx2(const void *w, const void *x0, const void *x1, int64_t n);
float kcpu_vec_dot2_q5_K_q8_K_avx2(const void *w, const void *x0, const void *x1, int64_t n);
float kcpu_vec_dot2_q6_K_q8_K_avx2(const void *w, const void *x0, const void *x1, int64_t n);

/* A K-quant weight block unpacked once so that many activation rows can be dotted
 * with it (a batched matmul decodes each weight block once per tile of rows, not
 * once per row): q holds the 256 unsigned quants in element order, scv the scale
 * of each 16-bit lane of a 32-element chunk's pair products, corr what the q8_K
 * bsums meet (q4_K/q5_K: the min of each pair of 16-element groups' sub-block;
 * q6_K: the 16 group scales, for the -32 offset). */
typedef struct kcpu_kunpacked {
    uint8_t q[256];
    int16_t scv[8][16];
    int16_t corr[16];
    float d;
    float dmin; /* q4_K/q5_K; 0 for q6_K */
} kcpu_kunpacked_t;

/* Unpacks the n / 256 blocks of one weight row into u (n / 256 entries); the AVX2
 * variants write the same bytes. */
void kcpu_unpack_q4_K(const void *w, kcpu_kunpacked_t *u, int64_t n);
void kcpu_unpack_q5_K(const void *w, kcpu_kunpacked_t *u, int64_t n);
void kcpu_unpack_q6_K(const void *w, kcpu_kunpacked_t *u, int64_t n);
void kcpu_unpack_q4_K_avx2(const void *w, kcpu_kunpacked_t *u, int64_t n);
void kcpu_unpack_q5_K_avx2(const void *w, kcpu_kunpacked_t *u, int64_t n);
void kcpu_unpack_q6_K_avx2(const void *w, kcpu_kunpacked_t *u, int64_t n);

/* kcpu_vec_dotu_*: the dot of an unpacked weight row with one activation row (x1
 * NULL) or with its two q8 terms; the same bits as kcpu_vec_dot_* / kcpu_vec_dot2_*
 * of the same variant on the packed row, so a row's result never depends on
 * whether it was computed in a batch. */
float kcpu_vec_dotu_q4_K_q8_K_avx2(const kcpu_kunpacked_t *u, const void *x0, const void *x1,
                                   int64_t n);
float kcpu_vec_dotu_q5_K_q8_K_avx2(const kcpu_kunpacked_t *u, const void *x0, const void *x1,
                                   int64_t n);
float kcpu_vec_dotu_q6_K_q8_K_avx2(const kcpu_kunpacked_t *u, const void *x0, const void *x1,
                                   int64_t n);

/* kcpu_vec_dotu2_*: two activation rows xa and xb (each terms q8 rows, term_bytes
 * apart) against one unpacked weight row: out[0], out[1] with the same bits as two
 * kcpu_vec_dotu_* calls, the weights loaded once for both. */
void kcpu_vec_dotu2_q4_K_q8_K_avx2(const kcpu_kunpacked_t *u, const void *xa, const void *xb,
                                   size_t term_bytes, int terms, int64_t n, float out[2]);
void kcpu_vec_dotu2_q5_K_q8_K_avx2(const kcpu_kunpacked_t *u, const void *xa, const void *xb,
                                   size_t term_bytes, int terms, int64_t n, float out[2]);
void kcpu_vec_dotu2_q6_K_q8_K_avx2(const kcpu_kunpacked_t *u, const void *xa, const void *xb,
                                   size_t term_bytes, int terms, int64_t n, float out[2]);
/* The same bits as the avx2 dotu2 kernels, where kcpu_have_avx512(). */
void kcpu_vec_dotu2_q4_K_q8_K_avx512(const kcpu_kunpacked_t *u, const void *xa, const void *xb,
                                     size_t term_bytes, int terms, int64_t n, float out[2]);
void kcpu_vec_dotu2_q5_K_q8_K_avx512(const kcpu_kunpacked_t *u, const void *xa, const void *xb,
                                     size_t term_bytes, int terms, int64_t n, float out[2]);
void kcpu_vec_dotu2_q6_K_q8_K_avx512(const kcpu_kunpacked_t *u, const void *xa, const void *xb,
                                     size_t term_bytes, int terms, int64_t n, float out[2]);

/* The fast path's activation block for K-quant weights: 256 values as x = d * q
 * with |q| <= 32767 (16 bits: the precision of two q8 terms at one term's integer
 * multiplies, through _mm256_madd_epi16), and bsum[j] = d * the sum of q over
 * sub-block j of 32 (what the q4_K/q5_K mins meet). 576 bytes, a multiple of 64. */
typedef struct kcpu_block_q16_K {
    int16_t q[256];
    float bsum[8];
    float d;
    float _pad[7];
} kcpu_block_q16_K;

/* Quantizes n values (a multiple of 256) of x into n / 256 blocks; the AVX2 variant
 * writes the same bytes. */
void kcpu_quantize_row_q16_K_ref(const float *x, kcpu_block_q16_K *y, int64_t n);
void kcpu_quantize_row_q16_K_avx2(const float *x, kcpu_block_q16_K *y, int64_t n);

float kcpu_vec_dot_q4_K_q16_K_ref(const void *w, const void *x, int64_t n);
float kcpu_vec_dot_q5_K_q16_K_ref(const void *w, const void *x, int64_t n);
float kcpu_vec_dot_q6_K_q16_K_ref(const void *w, const void *x, int64_t n);
float kcpu_vec_dot_q4_K_q16_K_avx2(const void *w, const void *x, int64_t n);
float kcpu_vec_dot_q5_K_q16_K_avx2(const void *w, const void *x, int64_t n);
float kcpu_vec_dot_q6_K_q16_K_avx2(const void *w, const void *x, int64_t n);
/* The same bits as the avx2 dots, where kcpu_have_avx512(). */
float kcpu_vec_dot_q4_K_q16_K_avx512(const void *w, const void *x, int64_t n);
float kcpu_vec_dot_q5_K_q16_K_avx512(const void *w, const void *x, int64_t n);
float kcpu_vec_dot_q6_K_q16_K_avx512(const void *w, const void *x, int64_t n);

/* kcpu_vec_dotn_*_q16_K: one weight row against nx (1..KCPU_DOTN_MAX) activation
 * rows x[0..nx): out[c] with the bits of the packed dot of the same set on row c
 * (which are the avx2 dot's), each weight block decoded once for all the rows. For
 * a few rows per expert: the weights stream from memory once, at about the cost
 * of one row's decode. */
#define KCPU_DOTN_MAX 8
void kcpu_vec_dotn_q4_K_q16_K_avx512(const void *w, const kcpu_block_q16_K *const *x, int nx, int64_t n,
                                     float *out);
void kcpu_vec_dotn_q5_K_q16_K_avx512(const void *w, const kcpu_block_q16_K *const *x, int nx, int64_t n,
                                     float *out);
void kcpu_vec_dotn_q6_K_q16_K_avx512(const void *w, const kcpu_block_q16_K *const *x, int nx, int64_t n,
                                     float *out);

/* The fast path's activation block for q8_0, q4_0 and mxfp4 weights
 * (KCPU_FAST16): 32 values as x = d * q with |q| <= 32767, one scale a block as
 * the weights have one. 16 bits at one term's integer multiplies
 * (_mm256_madd_epi16 against the weights widened to int16), where a q8_0 value and
 * its q8_0 residual took two. 68 bytes, the room of those two q8_0 blocks. */
typedef struct kcpu_block_q16_0 {
    float d;
    int16_t q[32];
} kcpu_block_q16_0;

/* Quantizes n values (a multiple of 32) of x into n / 32 blocks; the AVX2 variant
 * writes the same bytes. */
void kcpu_quantize_row_q16_0_ref(const float *x, kcpu_block_q16_0 *y, int64_t n);
void kcpu_quantize_row_q16_0_avx2(const float *x, kcpu_block_q16_0 *y, int64_t n);

/* The reference dots: each block's integer products summed exactly, the blocks in
 * double. */
float kcpu_vec_dot_q8_0_q16_0_ref(const void *w, const void *x, int64_t n);
float kcpu_vec_dot_q4_0_q16_0_ref(const void *w, const void *x, int64_t n);
float kcpu_vec_dot_mxfp4_q16_0_ref(const void *w, const void *x, int64_t n);

/* kcpu_vec_dotn_*_q16_0: one weight row w against nx (1..KCPU_DOTN_MAX) activation
 * rows x[0..nx), out[c] = dot(w, x[c]). The _ref variants are the reference dot of
 * each row. In the AVX2 variants each weight block is widened to int16 once for up
 * to four rows, and a row's bits do not depend on nx or on the rows beside it:
 * block i adds fma(d_w * d_x, float(eight int32 lane sums), acc[i % 2]) and the
 * row's dot is the fixed horizontal sum of acc[0] + acc[1]. A lane adds four
 * products (elements 2l, 2l + 1, 16 + 2l, 17 + 2l) of at most 128 * 32767 each, under
 * 2^24, so its float is exact. The avx512 set runs these (the same bits). */
void kcpu_vec_dotn_q8_0_q16_0_ref(const void *w, const kcpu_block_q16_0 *const *x, int nx, int64_t n,
                                  float *out);
void kcpu_vec_dotn_q4_0_q16_0_ref(const void *w, const kcpu_block_q16_0 *const *x, int nx, int64_t n,
                                  float *out);
void kcpu_vec_dotn_mxfp4_q16_0_ref(const void *w, const kcpu_block_q16_0 *const *x, int nx, int64_t n,
                                   float *out);
void kcpu_vec_dotn_q8_0_q16_0_avx2(const void *w, const kcpu_block_q16_0 *const *x, int nx, int64_t n,
                                   float *out);
void kcpu_vec_dotn_q4_0_q16_0_avx2(const void *w, const kcpu_block_q16_0 *const *x, int nx, int64_t n,
                                   float *out);
void kcpu_vec_dotn_mxfp4_q16_0_avx2(const void *w, const kcpu_block_q16_0 *const *x, int nx, int64_t n,
                                    float *out);

/* A K-quant weight block unpacked for q16_K activations: w holds each weight's
 * integer times its group scale (sc * q for q4_K/q5_K, at most 1953; sc * (q - 32)
 * for q6_K, at most 4096 in magnitude) in element order, mins the float
 * dmin * m of each sub-block of 32 (0 for q6_K). 576 bytes. */
typedef struct kcpu_kunpacked16 {
    int16_t w[256];
    float mins[8];
    float d;
    float _pad[7];
} kcpu_kunpacked16_t;

/* Unpack the n / 256 blocks of one weight row into u; the AVX2 variants write the
 * same bytes. */
void kcpu_unpack16_q4_K(const void *w, kcpu_kunpacked16_t *u, int64_t n);
void kcpu_unpack16_q5_K(const void *w, kcpu_kunpacked16_t *u, int64_t n);
void kcpu_unpack16_q6_K(const void *w, kcpu_kunpacked16_t *u, int64_t n);
void kcpu_unpack16_q4_K_avx2(const void *w, kcpu_kunpacked16_t *u, int64_t n);
void kcpu_unpack16_q5_K_avx2(const void *w, kcpu_kunpacked16_t *u, int64_t n);
void kcpu_unpack16_q6_K_avx2(const void *w, kcpu_kunpacked16_t *u, int64_t n);

/* The batched product's register tile: nr (1 or 2) unpacked weight rows (u[0], and
 * u[1] when nr is 2; nb blocks each) against nc (1..4) activation rows x[0..nc),
 * out[r * 4 + c] = dot(weight row r, activation row c). q6 is 1 for q6_K rows. Each
 * output has the bits of the packed kcpu_vec_dot_*_q16_K_avx2 of the same rows. */
void kcpu_gemm_u16_q16_K_avx2(const kcpu_kunpacked16_t *const u[2], int nr,
                              const kcpu_block_q16_K *const x[4], int nc, int64_t nb, int q6,
                              float out[8]);
/* The same tile in AVX-512 VNNI, with the same bits, where kcpu_have_avx512(). */
void kcpu_gemm_u16_q16_K_avx512(const kcpu_kunpacked16_t *const u[2], int nr,
                                const kcpu_block_q16_K *const x[4], int nc, int64_t nb, int q6,
                                float out[8]);

/* x[i] = exp(x[i] - m) for n values (a softmax's numerators, every x[i] - m <= 0
 * or -inf). The reference is libm's expf; the AVX2 variant a range reduction by
 * ln 2 and a degree-5 polynomial (relative error under 2e-7 against expf, 0 for
 * arguments below -87.3). */
void kcpu_exp_sub_ref(float *x, int64_t n, float m);
void kcpu_exp_sub_avx2(float *x, int64_t n, float m);

/* A logits row's most likely entry: the first index of the largest value (NaN values
 * ignored; 0 when all are NaN, -1 when n < 1) and, where p is not NULL, its softmax
 * probability 1 / sum_i exp(x[i] - max) over the values that are not NaN (0 when the
 * largest is not finite). The reference sums in double with libm's exp; the AVX2
 * variant gives the same index and p within a relative 1e-5 (its exp as exp_sub's,
 * the sums flushed into double every 2,048 values). */
int64_t kcpu_row_top1(const float *x, int64_t n, float *p);
int64_t kcpu_row_top1_ref(const float *x, int64_t n, float *p);
int64_t kcpu_row_top1_avx2(const float *x, int64_t n, float *p);

/* Attention over an f16 cache for ng (1..8) query heads sharing one KV head, each
 * cache row read and converted once for all of them. qk: sc[g * ld + s] = scale *
 * dot(q row g, K row s) for s < len, q (ng, hd), K rows k_stride elements apart.
 * pv: out row g (ng, hd) = sum over s < len of p[g * ld + s] * V row s, in order of s.
 * The AVX2 variants need hd a multiple of 8. */
void kcpu_att_qk_f16_ref(const float *q, int ng, const uint16_t *k, int64_t k_stride, int64_t len,
                         int64_t hd, float scale, float *sc, int64_t ld);
void kcpu_att_pv_f16_ref(const float *p, int ng, int64_t ld, const uint16_t *v, int64_t v_stride,
                         int64_t len, int64_t hd, float *out);
void kcpu_att_qk_f16_avx2(const float *q, int ng, const uint16_t *k, int64_t k_stride, int64_t len,
                          int64_t hd, float scale, float *sc, int64_t ld);
void kcpu_att_pv_f16_avx2(const float *p, int ng, int64_t ld, const uint16_t *v, int64_t v_stride,
                          int64_t len, int64_t hd, float *out);

/* y[i] += a * x[i] for n elements; the V side of attention. */
void kcpu_axpy_f32_ref(float *y, float a, const float *x, int64_t n);
void kcpu_axpy_f16_ref(float *y, float a, const uint16_t *x, int64_t n);
void kcpu_axpy_f32_avx2(float *y, float a, const float *x, int64_t n);
void kcpu_axpy_f16_avx2(float *y, float a, const uint16_t *x, int64_t n);

/* The activation format the fast path pairs with weight type t (a bl_type_t):
 * BL_TYPE_Q8_K, BL_TYPE_Q8_0, or -1 when t has no integer kernel (precise path). */
int kcpu_act_type(uint32_t t);

// --- thread pool ---------------------------------------------------------------------

typedef struct kcpu_pool kcpu_pool_t;

/* A task body: called once on each of nth threads with ith = 0..nth-1. */
typedef void (*kcpu_task_fn)(void *ctx, int ith, int nth);

/* Starts n_threads - 1 helper threads (the caller is thread 0). n_threads 1..256.
 * Caller frees with kcpu_pool_destroy. */
int kcpu_pool_create(kcpu_pool_t **out, int n_threads, bl_err_t *err) BL_WUR;
void kcpu_pool_destroy(kcpu_pool_t *p); /* NULL is a no-op; joins the helpers */
int kcpu_pool_n_threads(const kcpu_pool_t *p); /* threads a run splits over */
/* Threads the next runs use: n clamped to 1..the pool's size (the others sleep
 * through them); returns the previous count. Called by the pool's one caller
 * between runs. Work is split by row, never inside a sum, so results do not
 * depend on it. */
int kcpu_pool_set_active(kcpu_pool_t *p, int n);
/* How the pool's idle threads wait, as llama.cpp's --poll: after a short pause spin
 * they yield for level * 4 us (level 0..100, clamped; KCPU_POLL_DEFAULT 50, 200 us)
 * before they sleep. Called by the pool's one caller between runs. */
#define KCPU_POLL_DEFAULT 50
void kcpu_pool_set_poll(kcpu_pool_t *p, int level);
/* --cpu-strict: thread i of the pool (0: the calling thread, which must be the pool's
 * one caller) pinned to the i-th CPU of the caller's affinity set, wrapping around
 * when the pool has more threads than the set CPUs. BL_EIO when the system refuses. */
int kcpu_pool_pin_strict(kcpu_pool_t *p, bl_err_t *err) BL_WUR;
/* Runs fn on every thread and returns when all are done. One caller at a time. */
void kcpu_pool_run(kcpu_pool_t *p, kcpu_task_fn fn, void *ctx);

// --- matrices and the op context -----------------------------------------------------

/* A weight matrix in the mapping: nrows rows of ncols elements of type, each row
 * row_bytes long, rows contiguous. Borrowed; never copied. */
typedef struct kcpu_mat {
    const void *data;
    uint32_t type;    /* bl_type_t */
    int64_t ncols;    /* elements per row (the reduction length) */
    int64_t nrows;    /* output features */
    size_t row_bytes;
    int precise;      /* 1: always the precise path, even in a fast context */
    int act_q8;       /* 1: K-quant rows meet two q8_K terms, not q16_K, in a
                       * KCPU_FAST16 context (for a matrix only decode streams, like
                       * the output head: its q8 kernels read faster) */
} kcpu_mat_t;

/* Fills m for a tensor of type with rows of ncols; BL_ERANGE/BL_EINVAL as bl_row_bytes. */
int kcpu_mat_init(kcpu_mat_t *m, const void *data, uint32_t type, int64_t ncols, int64_t nrows,
                  bl_err_t *err) BL_WUR;
/* Rows [r0, r0 + n) of m as a matrix (an expert of a 3D stack is a slice). */
kcpu_mat_t kcpu_mat_rows(const kcpu_mat_t *m, int64_t r0, int64_t n);

/* Limits a context's scratch is sized for. */
typedef struct kcpu_limits {
    int64_t max_cols;  /* longest row any matmul reduces over */
    int64_t max_batch; /* most activation rows in one call */
    int64_t max_ctx;   /* longest KV sequence attention reads */
    int64_t head_dim;  /* attention head size */
} kcpu_limits_t;

/* Owns the pool and all scratch the ops need; nothing is allocated per call. One
 * owning thread calls the ops. */
typedef struct kcpu_ctx kcpu_ctx_t;

/* Numeric modes (see the top of this file). */
enum {
    KCPU_FAST16 = 0,  /* fast path, 16-bit activations (K-quants) or a q8 value plus a q8 residual */
    KCPU_PRECISE = 1, /* f32 activations, exactly dequantized weights */
    KCPU_FAST8 = 2,   /* fast path, one q8 term per activation row (llama.cpp's scheme) */
};

/* mode: a KCPU_* mode. Caller frees with kcpu_ctx_destroy. */
int kcpu_ctx_create(kcpu_ctx_t **out, int n_threads, int mode, const kcpu_limits_t *lim,
                    bl_err_t *err) BL_WUR;
void kcpu_ctx_destroy(kcpu_ctx_t *c);
int kcpu_ctx_mode(const kcpu_ctx_t *c);
int kcpu_ctx_n_threads(const kcpu_ctx_t *c);
/* kcpu_pool_set_active on the context's pool (a ctx made for n_threads can run its
 * ops over fewer: the worker's --threads for decode, --threads-batch for prompts). */
int kcpu_ctx_set_threads(kcpu_ctx_t *c, int n);
/* kcpu_pool_set_poll on the context's pool. */
void kcpu_ctx_set_poll(kcpu_ctx_t *c, int level);
/* kcpu_pool_pin_strict on the context's pool. */
int kcpu_ctx_pin_strict(kcpu_ctx_t *c, bl_err_t *err) BL_WUR;

// --- ops -----------------------------------------------------------------------------
/* Activations are row-major f32: a (n, d) argument holds n rows of d floats, rows
 * ld floats apart where an ld is given. Callers keep every size within the limits
 * the context was created with (KCPU_ASSERT aborts otherwise: these are our own
 * invariants, never file or request input). */

/* y (n, w->nrows) = x (n, w->ncols) times w transposed: y[b][r] = dot(w row r, x row b). */
void kcpu_matmul(kcpu_ctx_t *c, const kcpu_mat_t *w, const float *x, int64_t n, float *y);

/* One product of a kcpu_matmul_many call: y (n, w->nrows) = the activation rows
 * times w^T, where output row b reads x row rows[b] of x (nx, w->ncols), or x row b
 * when rows is NULL (nx is then unused). Products with the same x and nx share one
 * quantization of it, so experts can read their rows of a step's input in place. */
typedef struct kcpu_mm_job {
    const kcpu_mat_t *w;
    const float *x;
    int64_t nx;
    const int32_t *rows;
    int64_t n;
    float *y;
} kcpu_mm_job_t;

#define KCPU_MM_MAX_JOBS 512

/* Runs njobs (<= KCPU_MM_MAX_JOBS) independent products as kcpu_matmul would, each
 * output with the same bits, but in one pass over the threads: for many small
 * products (a decode step's experts) the wake-ups would cost more than the work.
 * Each job's nx (or n) is within the context's max_batch; jobs whose quantized rows
 * together exceed it run in several passes. Outputs must not overlap any input. */
void kcpu_matmul_many(kcpu_ctx_t *c, const kcpu_mm_job_t *jobs, int njobs);

/* Runs fn(arg, lo, hi) over [0, n) split in contiguous ranges over c's threads, or
 * in one call on this thread when c is NULL or n is under min_par. For work whose
 * every item is computed alike wherever the split falls (elementwise ops, rows). */
void kcpu_parallel_for(kcpu_ctx_t *c, int64_t n, int64_t min_par, void (*fn)(void *arg, int64_t lo, int64_t hi),
                       void *arg);

/* y (n, d) = x / sqrt(mean(x^2) + eps) * g, row by row, in place allowed. Rows are
 * ld floats apart in both x and y. Many rows are split over c's threads (c may be
 * NULL: this thread); a row's bits never depend on it. */
void kcpu_rms_norm(kcpu_ctx_t *c, float *y, const float *x, const float *g, int64_t n, int64_t d, int64_t ld,
                   float eps);

/* A RoPE: n_rot dims rotated by pos * base^(-2i/n_rot) for pair i, with YaRN's
 * context extension when freq_scale < 1 (llama.cpp's rope_yarn: the angles
 * interpolated by freq_scale, mixed back towards the original ones over the pairs
 * below corr_hi by ext_factor, and cos, sin multiplied by mscale). */
typedef struct kcpu_rope {
    int64_t n_rot;
    float base;
    float freq_scale;     /* 1: no interpolation */
    float ext_factor;     /* 0: no mixing */
    float corr_lo, corr_hi; /* the pairs the mix ramps over */
    float mscale;         /* 1: plain rotation */
} kcpu_rope_t;

/* A plain RoPE over n_rot dims. */
static inline kcpu_rope_t kcpu_rope_plain(int64_t n_rot, float base)
{
    return (kcpu_rope_t){.n_rot = n_rot, .base = base, .freq_scale = 1.0f, .mscale = 1.0f};
}

/* The rotation table for positions pos[0..n): cs (n, n_rot/2, 2) = cos, sin of each
 * pair's angle (times mscale), computed in double. */
void kcpu_rope_table(float *cs, const int32_t *pos, int64_t n, const kcpu_rope_t *r);
/* Rotates x (n, n_head, head_dim) in place with the table, the NEOX way: pairs
 * (i, i + n_rot/2) for i < n_rot/2; dims n_rot.. of each head stay as they are. */
void kcpu_rope_neox(float *x, const float *cs, int64_t n, int64_t n_head, int64_t head_dim, int64_t n_rot);
/* Rotates n_rot dims of each head in place the NORM way (llama.cpp's, DeepSeek's):
 * consecutive pairs (2i, 2i + 1). Row b's head h starts at x + b * row_stride + h *
 * head_stride. */
void kcpu_rope_norm(float *x, const float *cs, int64_t n, int64_t n_head, int64_t row_stride,
                    int64_t head_stride, int64_t n_rot);

/* y (n, d) = silu(g) * u, elementwise; y may alias g. Long vectors are split over
 * c's threads (c may be NULL: this thread), with the same bits. */
void kcpu_swiglu(kcpu_ctx_t *c, float *y, const float *g, const float *u, int64_t n);
/* y = the KCPU_ACT_SWIGLU_OAI activation of g and u (gpt-oss's), elementwise; y may
 * alias g. */
void kcpu_swiglu_oai(kcpu_ctx_t *c, float *y, const float *g, const float *u, int64_t n);

/* A gated DeltaNet layer's parameters (docs/models.md): the convolution's weights
 * (channels, K), the time-step bias and decay rates (Hv; ssm_a holds -exp(A_log)),
 * the output norm (S); K <= 64 taps, S <= 4096. */
typedef struct kcpu_dnet {
    const float *conv_w, *dt_bias, *a, *norm;
    int64_t K, S, Hk, Hv;
    int tiled; /* v head h reads q/k head h % Hk (qwen35moe), else h / (Hv / Hk) */
    int ba;    /* beta and alpha in one row grouped by k head (qwen3next's ssm_ba) */
    float eps;
} kcpu_dnet_t;

/* q, k (Hk heads of S) and v (Hv heads of S): the convolution's channels. */
static inline int64_t kcpu_dnet_channels(const kcpu_dnet_t *d) { return d->S * (2 * d->Hk + d->Hv); }

/* beta (n, Hv) = sigmoid(b) and g (n, Hv) = softplus(alpha + dt_bias) * a from the
 * rows' projections: b (n rows b_ld apart) holds both when d->ba, else b and al
 * (al_ld apart) one each. */
void kcpu_dnet_gates(const kcpu_dnet_t *d, const float *b, int64_t b_ld, const float *al, int64_t al_ld,
                     int64_t n, float *beta, float *g);

/* n rows of one sequence through the layer, after its state: qkv (n, channels) the
 * projections, convolved and normed in place; conv (K - 1, channels) the last
 * inputs before the rows, M (Hv, S, S) the states (M[h][i][j]: key dim i, value dim
 * j), both updated to after the rows; z (n, Hv * S) the output gate; out (n, Hv * S)
 * rmsnorm(o, norm) * silu(z) of each head's output o. */
void kcpu_deltanet(kcpu_ctx_t *c, const kcpu_dnet_t *d, float *qkv, const float *z, const float *beta,
                   const float *g, float *conv, float *M, float *out, int64_t n);

/* One layer's KV cache: rows of n_kv_head * head_dim elements of type (f32, f16 or
 * q8_0), row_bytes apart, one per position. */
typedef struct kcpu_kv_view {
    void *k;
    void *v;
    uint32_t type;
    size_t row_bytes;
} kcpu_kv_view_t;

/* Stores n rows of f32 (n, n_kv_head * head_dim) at positions pos0.. of k or v. */
void kcpu_kv_store(const kcpu_kv_view_t *kv, int is_v, const float *src, int64_t pos0, int64_t n,
                   int64_t row_elems);

/* Causal GQA attention: for row b (at position pos0 + b) and head h, out = softmax(
 * scale * q . K[0..pos0+b]) V over the cache, with query head h reading KV head
 * h / (n_head / n_kv_head). q (n, n_head, head_dim), out (n, n_head, head_dim). */
void kcpu_attention(kcpu_ctx_t *c, const kcpu_kv_view_t *kv, const float *q, float *out,
                    int64_t n, int64_t pos0, int64_t n_head, int64_t n_kv_head,
                    int64_t head_dim, float scale);
/* kcpu_attention with a sliding window (a row at position p sees p - window + 1 ..
 * p; window 0: all) and attention sinks (sinks (n_head): one more score per head,
 * unscaled, with no value, in each row's softmax; NULL: none), as gpt-oss's
 * layers attend. */
void kcpu_attention_ext(kcpu_ctx_t *c, const kcpu_kv_view_t *kv, const float *q, float *out, int64_t n,
                        int64_t pos0, int64_t n_head, int64_t n_kv_head, int64_t head_dim, float scale,
                        int64_t window, const float *sinks);

/* Most experts a router chooses among (BL_ARCH_MAX_EXPERTS). */
#define KCPU_ROUTE_MAX_EXPERT 4096

/* How a MoE router scores its experts (bl_gating_t's numbering). */
enum { KCPU_GATE_SOFTMAX = 1, KCPU_GATE_SIGMOID = 2, KCPU_GATE_SOFTMAX_WEIGHT = 3 };

typedef struct kcpu_route {
    int64_t n_expert, k;
    int64_t n_group;    /* DeepSeek-V3's grouped choice: groups of n_expert / n_group */
    int64_t topk_group; /* experts, the k chosen from the topk_group best (0 or 1: off) */
    int gating;         /* KCPU_GATE_*: the scores p of the logits (SOFTMAX_WEIGHT: the
                         * logits, and the k chosen weighted by their softmax) */
    int norm;           /* the k weights divided by their sum (at least 2^-14) */
    float scale;        /* then multiplied by this */
    const float *bias;  /* (n_expert) added to p for the choice only, or NULL */
} kcpu_route_t;

/* MoE routing for n rows of router logits (n, n_expert): scores p (softmax or
 * sigmoid, in double), the k largest p + bias (ties to the lower id; with groups,
 * among the topk_group groups whose two largest p + bias sum highest), their p as
 * weights, normed and scaled as r says. ids (n, k) in the order chosen, w (n, k).
 * Many rows are split over c's threads (c may be NULL: this thread); a row's result
 * never depends on it. */
void kcpu_moe_route(kcpu_ctx_t *c, const float *logits, int64_t n, const kcpu_route_t *r, int32_t *ids, float *w);

// --- routed experts ----------------------------------------------------------------

/* One MoE layer's routed experts, stacked: expert x is rows x*n_ff.. of gate and up
 * (n_expert * n_ff, n_embd) and rows x*n_embd.. of down (n_expert * n_embd, n_ff). */
/* An expert's activation of its gate g and up u: silu(g) * u, or gpt-oss's clamped
 * form min(g, 7) * sigmoid(1.702 * min(g, 7)) * (clamp(u, -7, 7) + 1). */
enum { KCPU_ACT_SWIGLU = 0, KCPU_ACT_SWIGLU_OAI = 1 };

typedef struct kcpu_experts {
    kcpu_mat_t gate, up, down;
    int64_t n_expert, n_ff, n_embd;
    int act;                      /* KCPU_ACT_* */
    const float *gate_b, *up_b;   /* (n_expert, n_ff) biases added to gate and up, or NULL */
    const float *down_b;          /* (n_expert, n_embd) added to down, or NULL */
    /* NULL: the stacks above hold every expert. Else (3 * n_expert): expert x's gate,
     * up and down rows at slices[3x], [3x + 1], [3x + 2] (a pager's slots), with the
     * stacks' types and row sizes; only the experts a call uses are read. */
    const void *const *slices;
} kcpu_experts_t;

/* Scratch of kcpu_experts for up to max_rows rows of up to max_k pairs each. */
typedef struct kcpu_experts_scratch kcpu_experts_scratch_t;
int kcpu_experts_scratch_create(kcpu_experts_scratch_t **out, int64_t max_rows, int64_t max_k, int64_t n_embd,
                                int64_t n_ff, bl_err_t *err) BL_WUR;
void kcpu_experts_scratch_destroy(kcpu_experts_scratch_t *s); /* NULL is a no-op */

/* out (n, n_embd) = for each row r of xn (n, n_embd) the sum over its counts[r]
 * (expert, weight) pairs, packed row after row in ids and wts (counts NULL: k each),
 * of weight * down(silu(gate x) * up x). Rows are grouped by expert so that each
 * expert's weights are read once; all experts' gate and up products go to the threads
 * in one pass, then every down, reading their rows of xn in place; a layer with more
 * experts than a job list holds runs expert by expert with the same products. Each
 * row's sum runs in expert-id order, so a row gets the same bits whatever else is in
 * the call. n <= max_rows, counts <= max_k, ids below n_expert (the caller checks). */
void kcpu_experts(kcpu_ctx_t *c, kcpu_experts_scratch_t *s, const kcpu_experts_t *e, const float *xn, int64_t n,
                  const int32_t *counts, int64_t k, const int32_t *ids, const float *wts, float *out);

/* kcpu_experts for the pairs whose expert is in [x_lo, x_hi) only; with accumulate
 * their sums are added onto out instead of replacing it. A row's sum runs in
 * expert-id order and starts from what out holds, so calls over ascending ranges
 * that cover every expert give kcpu_experts' bits exactly (a pager computes a layer
 * in passes over the experts its slots hold at once). */
void kcpu_experts_range(kcpu_ctx_t *c, kcpu_experts_scratch_t *s, const kcpu_experts_t *e, const float *xn,
                        int64_t n, const int32_t *counts, int64_t k, const int32_t *ids, const float *wts,
                        float *out, int64_t x_lo, int64_t x_hi, int accumulate);

/* The checks a caller of kcpu_experts makes on pairs from elsewhere: each row's count
 * (counts NULL: k each) in 1..k, every id below n_expert. BL_EINVAL naming the row. */
int kcpu_experts_check(int64_t n_expert, int64_t k, int64_t n, const int32_t *counts, const int32_t *ids,
                       bl_err_t *err) BL_WUR;

#endif
