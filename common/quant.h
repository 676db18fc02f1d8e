/* GGML tensor element types: their ids as stored in GGUF, their block geometry,
 * and one scalar reference dequantizer (and, for the types bloomery writes, one
 * reference quantizer) per type. Every SIMD and CUDA kernel is tested against
 * these. The block structs themselves are in blocks.h. */
#ifndef BL_QUANT_H
#define BL_QUANT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "err.h"

/* Ids as GGUF stores them (ggml_type). Gaps are ids that were retired upstream;
 * a GGUF naming one of them, or any id not listed, is refused. */
typedef enum bl_type {
    BL_TYPE_F32 = 0,
    BL_TYPE_F16 = 1,
    BL_TYPE_Q4_0 = 2,
    BL_TYPE_Q4_1 = 3,
    BL_TYPE_Q5_0 = 6,
    BL_TYPE_Q5_1 = 7,
    BL_TYPE_Q8_0 = 8,
    BL_TYPE_Q8_1 = 9,
    BL_TYPE_Q2_K = 10,
    BL_TYPE_Q3_K = 11,
    BL_TYPE_Q4_K = 12,
    BL_TYPE_Q5_K = 13,
    BL_TYPE_Q6_K = 14,
    BL_TYPE_Q8_K = 15,
    BL_TYPE_IQ2_XXS = 16,
    BL_TYPE_IQ2_XS = 17,
    BL_TYPE_IQ3_XXS = 18,
    BL_TYPE_IQ1_S = 19,
    BL_TYPE_IQ4_NL = 20,
    BL_TYPE_IQ3_S = 21,
    BL_TYPE_IQ2_S = 22,
    BL_TYPE_IQ4_XS = 23,
    BL_TYPE_I8 = 24,
    BL_TYPE_I16 = 25,
    BL_TYPE_I32 = 26,
    BL_TYPE_I64 = 27,
    BL_TYPE_F64 = 28,
    BL_TYPE_IQ1_M = 29,
    BL_TYPE_BF16 = 30,
    BL_TYPE_TQ1_0 = 34,
    BL_TYPE_TQ2_0 = 35,
    BL_TYPE_MXFP4 = 39,
    BL_TYPE_COUNT = 40, /* one past the largest id; not a type */
} bl_type_t;

typedef struct bl_type_info {
    const char *name;      /* lower case, as in GGUF tools: "q4_K", "iq2_xxs", "f32" */
    uint32_t block_elems;  /* elements per block (1 for plain scalar types) */
    uint32_t block_bytes;  /* bytes per block */
    int has_dequant;       /* bl_dequantize_row_ref handles it */
    int has_quant;         /* bl_quantize_row_ref handles it */
} bl_type_info_t;

/* The type's description, or NULL for an id that is not a known type. */
const bl_type_info_t *bl_type_info(uint32_t type);

/* Whether a card's grouped expert product (a prompt's experts) reads weights of this
 * type through an f16 copy made first rather than dequantizing them inside its tiles:
 * the K-quants, whose per-sub-block scales each tile would decode again. The CUDA
 * backend decides by it and the plan counts the copy's scratch by it. */
int bl_type_gemm_via_f16(uint32_t type);

/* Looks a type up by name, case-insensitively ("q4_k" and "Q4_K" both work).
 * Returns 0 and sets *out, or BL_ENOENT. */
int bl_type_from_name(const char *name, bl_type_t *out) BL_WUR;

/* Bytes of a row of n elements: BL_ERANGE if n is not a multiple of the block size
 * or the size overflows, BL_EINVAL for an unknown type. */
int bl_row_bytes(uint32_t type, int64_t n, size_t *out, bl_err_t *err) BL_WUR;

/* Reference dequantizer: n elements (a multiple of the block size) from src into dst.
 * The caller has checked type and n with bl_row_bytes. Returns BL_ENOTSUP for a
 * type without a dequantizer. */
int bl_dequantize_row_ref(bl_type_t type, const void *src, float *dst, int64_t n) BL_WUR;

/* Reference quantizer: n floats (a multiple of the block size) into dst blocks.
 * Deterministic (same input, same bytes). Handles at least f32, f16, bf16, q8_0,
 * q4_K, q5_K, q6_K, q8_K and mxfp4; BL_ENOTSUP otherwise. */
int bl_quantize_row_ref(bl_type_t type, const float *src, void *dst, int64_t n) BL_WUR;

/* IEEE half and bfloat16 conversions (round to nearest even; NaN stays NaN). */
float bl_fp16_to_fp32(uint16_t h);
uint16_t bl_fp32_to_fp16(float f);
float bl_bf16_to_fp32(uint16_t h);
uint16_t bl_fp32_to_bf16(float f);

/* Per-type scalar references, for kernels that test themselves against one format.
 * src points at n / block_elems blocks of that type (blocks.h); n is a multiple of
 * the block size (unchecked here: the dispatchers above check it). */
void bl_dequantize_row_f32_ref(const void *src, float *dst, int64_t n);
void bl_dequantize_row_f16_ref(const void *src, float *dst, int64_t n);
void bl_dequantize_row_bf16_ref(const void *src, float *dst, int64_t n);
void bl_dequantize_row_q4_0_ref(const void *src, float *dst, int64_t n);
void bl_dequantize_row_q4_1_ref(const void *src, float *dst, int64_t n);
void bl_dequantize_row_q5_0_ref(const void *src, float *dst, int64_t n);
void bl_dequantize_row_q5_1_ref(const void *src, float *dst, int64_t n);
void bl_dequantize_row_q8_0_ref(const void *src, float *dst, int64_t n);
void bl_dequantize_row_q8_1_ref(const void *src, float *dst, int64_t n);
void bl_dequantize_row_q2_K_ref(const void *src, float *dst, int64_t n);
void bl_dequantize_row_q3_K_ref(const void *src, float *dst, int64_t n);
void bl_dequantize_row_q4_K_ref(const void *src, float *dst, int64_t n);
void bl_dequantize_row_q5_K_ref(const void *src, float *dst, int64_t n);
void bl_dequantize_row_q6_K_ref(const void *src, float *dst, int64_t n);
void bl_dequantize_row_q8_K_ref(const void *src, float *dst, int64_t n);
void bl_dequantize_row_iq2_xxs_ref(const void *src, float *dst, int64_t n);
void bl_dequantize_row_iq2_xs_ref(const void *src, float *dst, int64_t n);
void bl_dequantize_row_iq2_s_ref(const void *src, float *dst, int64_t n);
void bl_dequantize_row_iq3_xxs_ref(const void *src, float *dst, int64_t n);
void bl_dequantize_row_iq3_s_ref(const void *src, float *dst, int64_t n);
void bl_dequantize_row_iq1_s_ref(const void *src, float *dst, int64_t n);
void bl_dequantize_row_iq1_m_ref(const void *src, float *dst, int64_t n);
void bl_dequantize_row_iq4_nl_ref(const void *src, float *dst, int64_t n);
void bl_dequantize_row_iq4_xs_ref(const void *src, float *dst, int64_t n);
void bl_dequantize_row_tq1_0_ref(const void *src, float *dst, int64_t n);
void bl_dequantize_row_tq2_0_ref(const void *src, float *dst, int64_t n);
void bl_dequantize_row_mxfp4_ref(const void *src, float *dst, int64_t n);

void bl_quantize_row_f32_ref(const float *src, void *dst, int64_t n);
void bl_quantize_row_f16_ref(const float *src, void *dst, int64_t n);
void bl_quantize_row_bf16_ref(const float *src, void *dst, int64_t n);
void bl_quantize_row_q8_0_ref(const float *src, void *dst, int64_t n);
void bl_quantize_row_q4_K_ref(const float *src, void *dst, int64_t n);
void bl_quantize_row_q5_K_ref(const float *src, void *dst, int64_t n);
void bl_quantize_row_q6_K_ref(const float *src, void *dst, int64_t n);
void bl_quantize_row_q8_K_ref(const float *src, void *dst, int64_t n);
/* E8M0 exponent from the block's largest magnitude (OCP MX / llama.cpp rule), each
 * value rounded to its nearest E2M1 code; NaN gives 0, Inf saturates (quant.c). */
void bl_quantize_row_mxfp4_ref(const float *src, void *dst, int64_t n);

/* A float by its bits, for tables written as bit patterns. */
typedef union bl_f32_bits {
    uint32_t u;
    float f;
} bl_f32_bits_t;

/* The value of an MX E8M0 exponent byte halved, 2^(e - 128), as mxfp4 stores its
 * E2M1 table doubled (0xff, NaN in MX, gives 2^127 here as it does in GGUF tools),
 * by e (quant_iq.c; e = 0 and 1 are float subnormals). A table, not the shifts: the
 * CPU's mxfp4 products take it once per 32 weights, and a vector broadcast from
 * memory costs a load where the shifts and a move from a general register took a
 * shuffle port the weights' unpacking needs. */
extern const bl_f32_bits_t bl_e8m0_half[256];

static inline float bl_e8m0_to_fp32_half(uint8_t e) { return bl_e8m0_half[e].f; }

/* E2M1 (mxfp4) values doubled, so that they are integers, by their 4-bit code (sign
 * in bit 3); a block's value is this times bl_e8m0_to_fp32_half of its exponent. */
extern const int8_t bl_e2m1_doubled[16];

#endif
