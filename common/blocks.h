/* GGML block formats: one struct per quantized type, laid out byte for byte as
 * GGUF stores it, with its size pinned to the GGUF block size. Halves (fp16 scales)
 * are kept as raw uint16_t; convert them with bl_fp16_to_fp32 (quant.h).
 * Multi-byte fields are little-endian, as on every host bloomery runs on. */
#ifndef BL_BLOCKS_H
#define BL_BLOCKS_H

#include <stdint.h>

/* Elements per block: 32 for the legacy and iq4_nl/mxfp4 types, 256 ("super-block")
 * for the K, IQ and ternary types. */
#define BL_QK 32
#define BL_QK_K 256
/* K-quant 6-bit packed scales: 8 scales and 8 mins in 12 bytes. */
#define BL_K_SCALE_BYTES 12

// --- legacy 32-element blocks ------------------------------------------------------

/* x = d * (q - 8), q in 0..15; low nibbles hold elements 0..15, high 16..31. */
typedef struct bl_block_q4_0 {
    uint16_t d;
    uint8_t qs[BL_QK / 2];
} bl_block_q4_0;
_Static_assert(sizeof(bl_block_q4_0) == 18, "q4_0 block is 18 bytes");

/* x = d * q + m, q in 0..15. */
typedef struct bl_block_q4_1 {
    uint16_t d;
    uint16_t m;
    uint8_t qs[BL_QK / 2];
} bl_block_q4_1;
_Static_assert(sizeof(bl_block_q4_1) == 20, "q4_1 block is 20 bytes");

/* x = d * (q - 16), q in 0..31: nibble from qs, fifth bit j of qh for element j. */
typedef struct bl_block_q5_0 {
    uint16_t d;
    uint8_t qh[4];
    uint8_t qs[BL_QK / 2];
} bl_block_q5_0;
_Static_assert(sizeof(bl_block_q5_0) == 22, "q5_0 block is 22 bytes");

/* x = d * q + m, q in 0..31. */
typedef struct bl_block_q5_1 {
    uint16_t d;
    uint16_t m;
    uint8_t qh[4];
    uint8_t qs[BL_QK / 2];
} bl_block_q5_1;
_Static_assert(sizeof(bl_block_q5_1) == 24, "q5_1 block is 24 bytes");

/* x = d * q. */
typedef struct bl_block_q8_0 {
    uint16_t d;
    int8_t qs[BL_QK];
} bl_block_q8_0;
_Static_assert(sizeof(bl_block_q8_0) == 34, "q8_0 block is 34 bytes");

/* Activation format: as q8_0, plus s = d * sum(q). */
typedef struct bl_block_q8_1 {
    uint16_t d;
    uint16_t s;
    int8_t qs[BL_QK];
} bl_block_q8_1;
_Static_assert(sizeof(bl_block_q8_1) == 36, "q8_1 block is 36 bytes");

// --- K-quants (256-element super-blocks) ---------------------------------------------

/* 16 sub-blocks of 16: x = d * sc * q - dmin * m, q in 0..3; scales[i] = sc | m << 4. */
typedef struct bl_block_q2_K {
    uint8_t scales[BL_QK_K / 16];
    uint8_t qs[BL_QK_K / 4];
    uint16_t d;
    uint16_t dmin;
} bl_block_q2_K;
_Static_assert(sizeof(bl_block_q2_K) == 84, "q2_K block is 84 bytes");

/* 16 sub-blocks of 16: x = d * (sc - 32) * (q - (high bit ? 0 : 4)), q in 0..3, with
 * 6-bit scales packed in 12 bytes. */
typedef struct bl_block_q3_K {
    uint8_t hmask[BL_QK_K / 8];
    uint8_t qs[BL_QK_K / 4];
    uint8_t scales[12];
    uint16_t d;
} bl_block_q3_K;
_Static_assert(sizeof(bl_block_q3_K) == 110, "q3_K block is 110 bytes");

/* 8 sub-blocks of 32: x = d * sc * q - dmin * m, q in 0..15, sc and m 6-bit. */
typedef struct bl_block_q4_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[BL_K_SCALE_BYTES];
    uint8_t qs[BL_QK_K / 2];
} bl_block_q4_K;
_Static_assert(sizeof(bl_block_q4_K) == 144, "q4_K block is 144 bytes");

/* As q4_K with a fifth bit per element in qh: q in 0..31. */
typedef struct bl_block_q5_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[BL_K_SCALE_BYTES];
    uint8_t qh[BL_QK_K / 8];
    uint8_t qs[BL_QK_K / 2];
} bl_block_q5_K;
_Static_assert(sizeof(bl_block_q5_K) == 176, "q5_K block is 176 bytes");

/* 16 sub-blocks of 16: x = d * sc * (q - 32), q in 0..63 (4 low bits in ql, 2 high
 * in qh), sc a signed 8-bit scale. */
typedef struct bl_block_q6_K {
    uint8_t ql[BL_QK_K / 2];
    uint8_t qh[BL_QK_K / 4];
    int8_t scales[BL_QK_K / 16];
    uint16_t d;
} bl_block_q6_K;
_Static_assert(sizeof(bl_block_q6_K) == 210, "q6_K block is 210 bytes");

/* Activation format for K-quant products: float scale, x = d * q, and the sum of
 * each group of 16 q's. */
typedef struct bl_block_q8_K {
    float d;
    int8_t qs[BL_QK_K];
    int16_t bsums[BL_QK_K / 16];
} bl_block_q8_K;
_Static_assert(sizeof(bl_block_q8_K) == 292, "q8_K block is 292 bytes");

// --- IQ types: lattice codebooks --------------------------------------------------

/* 8 groups of 32; per group two uint32: four 8-bit grid indices, then four 7-bit
 * sign indices and a 4-bit scale in the top bits. */
typedef struct bl_block_iq2_xxs {
    uint16_t d;
    uint16_t qs[BL_QK_K / 8];
} bl_block_iq2_xxs;
_Static_assert(sizeof(bl_block_iq2_xxs) == 66, "iq2_xxs block is 66 bytes");

/* Per 8 elements a uint16: 9-bit grid index, 7-bit sign index; 4-bit scales per 16. */
typedef struct bl_block_iq2_xs {
    uint16_t d;
    uint16_t qs[BL_QK_K / 8];
    uint8_t scales[BL_QK_K / 32];
} bl_block_iq2_xs;
_Static_assert(sizeof(bl_block_iq2_xs) == 74, "iq2_xs block is 74 bytes");

/* qs: 32 low bytes of 10-bit grid indices, then 32 bytes of explicit signs;
 * qh: the index high bits; 4-bit scales per 16. */
typedef struct bl_block_iq2_s {
    uint16_t d;
    uint8_t qs[BL_QK_K / 4];
    uint8_t qh[BL_QK_K / 32];
    uint8_t scales[BL_QK_K / 32];
} bl_block_iq2_s;
_Static_assert(sizeof(bl_block_iq2_s) == 82, "iq2_s block is 82 bytes");

/* qs: 64 8-bit grid indices (4 elements each), then per group of 32 a uint32 of four
 * 7-bit sign indices and a 4-bit scale. */
typedef struct bl_block_iq3_xxs {
    uint16_t d;
    uint8_t qs[3 * BL_QK_K / 8];
} bl_block_iq3_xxs;
_Static_assert(sizeof(bl_block_iq3_xxs) == 98, "iq3_xxs block is 98 bytes");

/* 9-bit grid indices (low bytes in qs, high bits in qh), explicit signs, 4-bit scales
 * per 32. */
typedef struct bl_block_iq3_s {
    uint16_t d;
    uint8_t qs[BL_QK_K / 4];
    uint8_t qh[BL_QK_K / 32];
    uint8_t signs[BL_QK_K / 8];
    uint8_t scales[BL_QK_K / 64];
} bl_block_iq3_s;
_Static_assert(sizeof(bl_block_iq3_s) == 110, "iq3_s block is 110 bytes");

/* 11-bit indices into a ternary grid (low bytes in qs, 3 high bits per index in qh,
 * which also holds a 3-bit scale and a delta sign per group of 32). */
typedef struct bl_block_iq1_s {
    uint16_t d;
    uint8_t qs[BL_QK_K / 8];
    uint16_t qh[BL_QK_K / 32];
} bl_block_iq1_s;
_Static_assert(sizeof(bl_block_iq1_s) == 50, "iq1_s block is 50 bytes");

/* As iq1_s, but 3-bit scales per 16 elements and the fp16 super-block scale spread
 * over the top nibbles of the four uint16 in scales. */
typedef struct bl_block_iq1_m {
    uint8_t qs[BL_QK_K / 8];
    uint8_t qh[BL_QK_K / 16];
    uint8_t scales[BL_QK_K / 32];
} bl_block_iq1_m;
_Static_assert(sizeof(bl_block_iq1_m) == 56, "iq1_m block is 56 bytes");

/* x = d * table[q], q a 4-bit index into a fixed non-linear table. */
typedef struct bl_block_iq4_nl {
    uint16_t d;
    uint8_t qs[BL_QK / 2];
} bl_block_iq4_nl;
_Static_assert(sizeof(bl_block_iq4_nl) == 18, "iq4_nl block is 18 bytes");

/* iq4_nl over 256 elements with a 6-bit scale per 32 (4 low bits in scales_l,
 * 2 high in scales_h). */
typedef struct bl_block_iq4_xs {
    uint16_t d;
    uint16_t scales_h;
    uint8_t scales_l[BL_QK_K / 64];
    uint8_t qs[BL_QK_K / 2];
} bl_block_iq4_xs;
_Static_assert(sizeof(bl_block_iq4_xs) == 136, "iq4_xs block is 136 bytes");

// --- ternary and microscaling -------------------------------------------------------

/* Ternary digits, 5 per byte in qs (base 3, stored as a fixed-point fraction) and
 * 4 per byte in qh: x = d * (t - 1), t in 0..2. */
typedef struct bl_block_tq1_0 {
    uint8_t qs[(BL_QK_K - 4 * BL_QK_K / 64) / 5];
    uint8_t qh[BL_QK_K / 64];
    uint16_t d;
} bl_block_tq1_0;
_Static_assert(sizeof(bl_block_tq1_0) == 54, "tq1_0 block is 54 bytes");

/* 2 bits per element: x = d * (q - 1), q in 0..2. */
typedef struct bl_block_tq2_0 {
    uint8_t qs[BL_QK_K / 4];
    uint16_t d;
} bl_block_tq2_0;
_Static_assert(sizeof(bl_block_tq2_0) == 66, "tq2_0 block is 66 bytes");

/* OCP MX FP4: an E8M0 shared exponent and 32 E2M1 values. */
typedef struct bl_block_mxfp4 {
    uint8_t e;
    uint8_t qs[BL_QK / 2];
} bl_block_mxfp4;
_Static_assert(sizeof(bl_block_mxfp4) == 17, "mxfp4 block is 17 bytes");

#endif
