/* What kernels/cpu's own files share: the kernel-set table the ops dispatch through,
 * K-quant scale unpacking, and an invariant check. Not part of the public API. */
#ifndef KCPU_IMPL_H
#define KCPU_IMPL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kcpu.h"

/* Our own invariants (sizes the caller promised to keep within the context's
 * limits); input from files is validated long before it reaches a kernel. */
#define KCPU_ASSERT(cond)                                                            \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "kcpu: %s:%d: invariant failed: %s\n", __FILE__, __LINE__, \
                    #cond);                                                          \
            abort();                                                                 \
        }                                                                            \
    } while (0)

typedef float (*kcpu_dot_fn)(const void *w, const void *x, int64_t n);
typedef float (*kcpu_dot2_fn)(const void *w, const void *x0, const void *x1, int64_t n);
typedef void (*kcpu_dotp_fn)(const void *w, const void *xa, const void *xb, int64_t n, float out[2]);
typedef float (*kcpu_dot_f32_fn)(const float *w, const float *x, int64_t n);
typedef float (*kcpu_dot_f16_fn)(const uint16_t *w, const float *x, int64_t n);
typedef void (*kcpu_axpy_f32_fn)(float *y, float a, const float *x, int64_t n);
typedef void (*kcpu_axpy_f16_fn)(float *y, float a, const uint16_t *x, int64_t n);
typedef void (*kcpu_unpack_fn)(const void *w, kcpu_kunpacked_t *u, int64_t n);
typedef float (*kcpu_dotu_fn)(const kcpu_kunpacked_t *u, const void *x0, const void *x1, int64_t n);
typedef void (*kcpu_dotu2_fn)(const kcpu_kunpacked_t *u, const void *xa, const void *xb,
                              size_t term_bytes, int terms, int64_t n, float out[2]);
typedef void (*kcpu_quant16_fn)(const float *x, kcpu_block_q16_K *y, int64_t n);
typedef void (*kcpu_unpack16_fn)(const void *w, kcpu_kunpacked16_t *u, int64_t n);
typedef void (*kcpu_dotn16_fn)(const void *w, const kcpu_block_q16_K *const *x, int nx, int64_t n, float *out);
typedef void (*kcpu_quant16_0_fn)(const float *x, kcpu_block_q16_0 *y, int64_t n);
typedef void (*kcpu_dotn16_0_fn)(const void *w, const kcpu_block_q16_0 *const *x, int nx, int64_t n, float *out);
typedef void (*kcpu_gemm16_fn)(const kcpu_kunpacked16_t *const u[2], int nr,
                               const kcpu_block_q16_K *const x[4], int nc, int64_t nb, int q6,
                               float out[8]);

/* One kernel set; chosen once by kcpu_init. */
typedef struct kcpu_kernels {
    const char *name;
    kcpu_dot_f32_fn dot_f32_f32;
    kcpu_dot_f16_fn dot_f16_f32;
    kcpu_dot_fn dot_q8_0_q8_0;
    kcpu_dot_fn dot_q4_0_q8_0;
    kcpu_dot_fn dot_mxfp4_q8_0;
    kcpu_dot_fn dot_q4_K_q8_K;
    kcpu_dot_fn dot_q5_K_q8_K;
    kcpu_dot_fn dot_q6_K_q8_K;
    kcpu_dot2_fn dot2_q4_K_q8_K;
    kcpu_dot2_fn dot2_q5_K_q8_K;
    kcpu_dot2_fn dot2_q6_K_q8_K;
    kcpu_dotp_fn dotp_q8_0_q8_0; /* a batch's rows in pairs (q8_0 activations) */
    kcpu_dotp_fn dotp_mxfp4_q8_0;
    kcpu_axpy_f32_fn axpy_f32;
    kcpu_axpy_f16_fn axpy_f16;
    /* Unpacked-row dots for batched matmuls; NULL where a set has none (the batch
     * then runs the packed dots row by row). */
    kcpu_unpack_fn unpack_q4_K;
    kcpu_unpack_fn unpack_q5_K;
    kcpu_unpack_fn unpack_q6_K;
    kcpu_dotu_fn dotu_q4_K_q8_K;
    kcpu_dotu_fn dotu_q5_K_q8_K;
    kcpu_dotu_fn dotu_q6_K_q8_K;
    kcpu_dotu2_fn dotu2_q4_K_q8_K;
    kcpu_dotu2_fn dotu2_q5_K_q8_K;
    kcpu_dotu2_fn dotu2_q6_K_q8_K;
    /* 16-bit activations (the default fast path for K-quants). gemm16 NULL: a batch
     * runs the packed dots row by row. */
    kcpu_quant16_fn quantize_q16_K;
    kcpu_dot_fn dot_q4_K_q16_K;
    kcpu_dot_fn dot_q5_K_q16_K;
    kcpu_dot_fn dot_q6_K_q16_K;
    kcpu_unpack16_fn unpack16_q4_K;
    kcpu_unpack16_fn unpack16_q5_K;
    kcpu_unpack16_fn unpack16_q6_K;
    kcpu_gemm16_fn gemm16;
    /* One weight row against up to KCPU_DOTN_MAX activation rows, or NULL: a
     * batch of a few rows then takes the unpacked tile. */
    kcpu_dotn16_fn dotn_q4_K_q16_K;
    kcpu_dotn16_fn dotn_q5_K_q16_K;
    kcpu_dotn16_fn dotn_q6_K_q16_K;
    /* 16-bit activations in blocks of 32 (q8_0, q4_0, mxfp4 weights): any rows */
    kcpu_quant16_0_fn quantize_q16_0;
    kcpu_dotn16_0_fn dotn_q8_0_q16_0;
    kcpu_dotn16_0_fn dotn_q4_0_q16_0;
    kcpu_dotn16_0_fn dotn_mxfp4_q16_0;
    /* Attention over an f16 cache, a KV head's query heads at once (hd % 8 == 0 for
     * the AVX2 set; other head sizes take the references). */
    void (*exp_sub)(float *x, int64_t n, float m);
    int64_t (*top1)(const float *x, int64_t n, float *p);
    void (*att_qk_f16)(const float *q, int ng, const uint16_t *k, int64_t k_stride, int64_t len,
                       int64_t hd, float scale, float *sc, int64_t ld);
    void (*att_pv_f16)(const float *p, int ng, int64_t ld, const uint16_t *v, int64_t v_stride,
                       int64_t len, int64_t hd, float *out);
} kcpu_kernels_t;

/* The set in use; valid after kcpu_init. */
extern const kcpu_kernels_t *kcpu__k;

/* All 8 six-bit scales and mins of a q4_K/q5_K block (kcpu__k_scale_min's layout)
 * from its 12 bytes read as three words: the SIMD dots' form. */
static inline void kcpu__k_scales8(const uint8_t *s12, uint8_t sc[8], uint8_t m[8])
{
    uint32_t w[3];
    memcpy(w, s12, 12);
    const uint32_t s_lo = w[0] & 0x3f3f3f3f, m_lo = w[1] & 0x3f3f3f3f;
    const uint32_t s_hi = (w[2] & 0x0f0f0f0f) | ((w[0] >> 6) & 0x03030303) << 4;
    const uint32_t m_hi = ((w[2] >> 4) & 0x0f0f0f0f) | ((w[1] >> 6) & 0x03030303) << 4;
    memcpy(sc, &s_lo, 4);
    memcpy(sc + 4, &s_hi, 4);
    memcpy(m, &m_lo, 4);
    memcpy(m + 4, &m_hi, 4);
}

/* The 6-bit scale and min of sub-block j (0..7) from a q4_K/q5_K 12-byte array:
 * j < 4 in the low 6 bits of bytes j and j+4; j >= 4 split over a nibble of byte
 * j+4 and the top 2 bits of bytes j-4 (scale) and j (min). */
static inline void kcpu__k_scale_min(const uint8_t *q, int j, int *sc, int *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

#endif
