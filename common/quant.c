/* The GGML type table, row sizes, fp16/bf16 conversions, the dispatchers, and the
 * scalar reference dequantizers and quantizers of the float, legacy (q4_0 ... q8_1)
 * and K-quant types, and the mxfp4 quantizer. The IQ, ternary and mxfp4
 * dequantizers are in quant_iq.c.
 * Everything here is plain C on purpose: it is the ground truth fast kernels are
 * compared with, so it must give the same bits in every build. */
#include "quant.h"

#include <math.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>

#include "blocks.h"

// --- type table ---------------------------------------------------------------------

/* Indexed by ggml type id; a NULL name marks a retired or unused id. */
static const bl_type_info_t type_table[BL_TYPE_COUNT] = {
    [BL_TYPE_F32] = {"f32", 1, 4, 1, 1},
    [BL_TYPE_F16] = {"f16", 1, 2, 1, 1},
    [BL_TYPE_Q4_0] = {"q4_0", BL_QK, sizeof(bl_block_q4_0), 1, 0},
    [BL_TYPE_Q4_1] = {"q4_1", BL_QK, sizeof(bl_block_q4_1), 1, 0},
    [BL_TYPE_Q5_0] = {"q5_0", BL_QK, sizeof(bl_block_q5_0), 1, 0},
    [BL_TYPE_Q5_1] = {"q5_1", BL_QK, sizeof(bl_block_q5_1), 1, 0},
    [BL_TYPE_Q8_0] = {"q8_0", BL_QK, sizeof(bl_block_q8_0), 1, 1},
    [BL_TYPE_Q8_1] = {"q8_1", BL_QK, sizeof(bl_block_q8_1), 1, 0},
    [BL_TYPE_Q2_K] = {"q2_K", BL_QK_K, sizeof(bl_block_q2_K), 1, 0},
    [BL_TYPE_Q3_K] = {"q3_K", BL_QK_K, sizeof(bl_block_q3_K), 1, 0},
    [BL_TYPE_Q4_K] = {"q4_K", BL_QK_K, sizeof(bl_block_q4_K), 1, 1},
    [BL_TYPE_Q5_K] = {"q5_K", BL_QK_K, sizeof(bl_block_q5_K), 1, 1},
    [BL_TYPE_Q6_K] = {"q6_K", BL_QK_K, sizeof(bl_block_q6_K), 1, 1},
    [BL_TYPE_Q8_K] = {"q8_K", BL_QK_K, sizeof(bl_block_q8_K), 1, 1},
    [BL_TYPE_IQ2_XXS] = {"iq2_xxs", BL_QK_K, sizeof(bl_block_iq2_xxs), 1, 0},
    [BL_TYPE_IQ2_XS] = {"iq2_xs", BL_QK_K, sizeof(bl_block_iq2_xs), 1, 0},
    [BL_TYPE_IQ3_XXS] = {"iq3_xxs", BL_QK_K, sizeof(bl_block_iq3_xxs), 1, 0},
    [BL_TYPE_IQ1_S] = {"iq1_s", BL_QK_K, sizeof(bl_block_iq1_s), 1, 0},
    [BL_TYPE_IQ4_NL] = {"iq4_nl", BL_QK, sizeof(bl_block_iq4_nl), 1, 0},
    [BL_TYPE_IQ3_S] = {"iq3_s", BL_QK_K, sizeof(bl_block_iq3_s), 1, 0},
    [BL_TYPE_IQ2_S] = {"iq2_s", BL_QK_K, sizeof(bl_block_iq2_s), 1, 0},
    [BL_TYPE_IQ4_XS] = {"iq4_xs", BL_QK_K, sizeof(bl_block_iq4_xs), 1, 0},
    [BL_TYPE_I8] = {"i8", 1, 1, 0, 0},
    [BL_TYPE_I16] = {"i16", 1, 2, 0, 0},
    [BL_TYPE_I32] = {"i32", 1, 4, 0, 0},
    [BL_TYPE_I64] = {"i64", 1, 8, 0, 0},
    [BL_TYPE_F64] = {"f64", 1, 8, 0, 0},
    [BL_TYPE_IQ1_M] = {"iq1_m", BL_QK_K, sizeof(bl_block_iq1_m), 1, 0},
    [BL_TYPE_BF16] = {"bf16", 1, 2, 1, 1},
    [BL_TYPE_TQ1_0] = {"tq1_0", BL_QK_K, sizeof(bl_block_tq1_0), 1, 0},
    [BL_TYPE_TQ2_0] = {"tq2_0", BL_QK_K, sizeof(bl_block_tq2_0), 1, 0},
    [BL_TYPE_MXFP4] = {"mxfp4", BL_QK, sizeof(bl_block_mxfp4), 1, 1},
};

const bl_type_info_t *bl_type_info(uint32_t type)
{
    if (type >= BL_TYPE_COUNT || !type_table[type].name)
        return NULL;
    return &type_table[type];
}

int bl_type_gemm_via_f16(uint32_t type)
{
    return type == BL_TYPE_Q2_K || type == BL_TYPE_Q3_K || type == BL_TYPE_Q4_K || type == BL_TYPE_Q5_K ||
           type == BL_TYPE_Q6_K;
}

int bl_type_from_name(const char *name, bl_type_t *out)
{
    if (!name)
        return BL_ENOENT;
    for (uint32_t t = 0; t < BL_TYPE_COUNT; t++) {
        if (type_table[t].name && strcasecmp(type_table[t].name, name) == 0) {
            *out = (bl_type_t)t;
            return 0;
        }
    }
    return BL_ENOENT;
}

int bl_row_bytes(uint32_t type, int64_t n, size_t *out, bl_err_t *err)
{
    const bl_type_info_t *ti = bl_type_info(type);
    if (!ti)
        return bl_err_set(err, BL_EINVAL, "unknown ggml type id %u", type);
    if (n < 0)
        return bl_err_set(err, BL_ERANGE, "type %s: negative element count %lld",
                          ti->name, (long long)n);
    if (n % ti->block_elems != 0)
        return bl_err_set(err, BL_ERANGE,
                          "type %s: %lld elements is not a multiple of the block size %u",
                          ti->name, (long long)n, ti->block_elems);
    uint64_t nblocks = (uint64_t)n / ti->block_elems;
    if (nblocks > SIZE_MAX / ti->block_bytes)
        return bl_err_set(err, BL_ERANGE,
                          "type %s: a row of %lld elements (block size %u, %u bytes a block) "
                          "overflows size_t",
                          ti->name, (long long)n, ti->block_elems, ti->block_bytes);
    *out = (size_t)nblocks * ti->block_bytes;
    return 0;
}

// --- fp16, bf16, e8m0 ------------------------------------------------------------------

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float bl_fp16_to_fp32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    if (exp == 0x1f) /* Inf keeps a zero mantissa, NaN keeps its payload */
        return bits_f32(sign | 0x7f800000u | (man << 13));
    if (exp != 0)
        return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
    if (man == 0)
        return bits_f32(sign);
    /* Subnormal half: man * 2^-24 is exact in float; build it by normalizing. */
    int e = 113;
    while (!(man & 0x400)) {
        man <<= 1;
        e--;
    }
    return bits_f32(sign | ((uint32_t)e << 23) | ((man & 0x3ff) << 13));
}

/* Shifts m right by s (1..31), rounding to nearest, ties to even. */
static uint32_t shift_rne(uint32_t m, unsigned s)
{
    uint32_t q = m >> s;
    uint32_t rem = m & ((1u << s) - 1);
    uint32_t half = 1u << (s - 1);
    if (rem > half || (rem == half && (q & 1)))
        q++;
    return q;
}

uint16_t bl_fp32_to_fp16(float f)
{
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t exp = (x >> 23) & 0xff;
    uint32_t man = x & 0x7fffff;
    if (exp == 0xff) /* NaN stays NaN (made quiet so a payload of high zeros survives) */
        return sign | 0x7c00 | (man ? 0x200 | (man >> 13) : 0);
    if (exp >= 143) /* |f| >= 65536: beyond any rounding to 65504 */
        return sign | 0x7c00;
    if (exp >= 113) {
        /* Normal half. A carry out of the mantissa bumps the exponent, which is the
         * right answer, including 65520 and above becoming Inf. */
        uint32_t h = ((exp - 112) << 10) | (man >> 13);
        uint32_t rem = man & 0x1fff;
        if (rem > 0x1000 || (rem == 0x1000 && (h & 1)))
            h++;
        return sign | (uint16_t)h;
    }
    if (exp < 102) /* below 2^-25, half the smallest subnormal: rounds to zero */
        return sign;
    /* Subnormal half in units of 2^-24: (1.man) * 2^(exp-127) / 2^-24. A round up to
     * 0x400 lands exactly on the smallest normal, which is correct. */
    return sign | (uint16_t)shift_rne(man | 0x800000, 126 - exp);
}

float bl_bf16_to_fp32(uint16_t h)
{
    return bits_f32((uint32_t)h << 16);
}

uint16_t bl_fp32_to_bf16(float f)
{
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffff) > 0x7f800000) /* NaN: truncate, force quiet so it stays NaN */
        return (uint16_t)((x >> 16) | 0x40);
    /* Round to nearest even; overflow into the exponent gives Inf, as it should. */
    return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}


// --- dequantizers: float and legacy types --------------------------------------------

/* Bit-exactness note: each formula below is evaluated in float in the order the GGUF
 * reference tools use (scale products first, then the element), because fast
 * kernels and the oracle are compared with these results bit for bit. */

void bl_dequantize_row_f32_ref(const void *src, float *dst, int64_t n)
{
    memcpy(dst, src, (size_t)n * sizeof(float));
}

void bl_dequantize_row_f16_ref(const void *src, float *dst, int64_t n)
{
    const uint16_t *h = src;
    for (int64_t i = 0; i < n; i++)
        dst[i] = bl_fp16_to_fp32(h[i]);
}

void bl_dequantize_row_bf16_ref(const void *src, float *dst, int64_t n)
{
    const uint16_t *h = src;
    for (int64_t i = 0; i < n; i++)
        dst[i] = bl_bf16_to_fp32(h[i]);
}

void bl_dequantize_row_q4_0_ref(const void *src, float *dst, int64_t n)
{
    const bl_block_q4_0 *b = src;
    for (int64_t i = 0; i < n / BL_QK; i++, b++, dst += BL_QK) {
        const float d = bl_fp16_to_fp32(b->d);
        for (int j = 0; j < BL_QK / 2; j++) {
            dst[j] = (float)((b->qs[j] & 0xf) - 8) * d;
            dst[j + BL_QK / 2] = (float)((b->qs[j] >> 4) - 8) * d;
        }
    }
}

void bl_dequantize_row_q4_1_ref(const void *src, float *dst, int64_t n)
{
    const bl_block_q4_1 *b = src;
    for (int64_t i = 0; i < n / BL_QK; i++, b++, dst += BL_QK) {
        const float d = bl_fp16_to_fp32(b->d);
        const float m = bl_fp16_to_fp32(b->m);
        for (int j = 0; j < BL_QK / 2; j++) {
            dst[j] = (float)(b->qs[j] & 0xf) * d + m;
            dst[j + BL_QK / 2] = (float)(b->qs[j] >> 4) * d + m;
        }
    }
}

/* The fifth bit of element j of a q5 block: bit j of the little-endian qh word. */
static int q5_high(const uint8_t qh[4], int j)
{
    return (qh[j >> 3] >> (j & 7)) & 1;
}

void bl_dequantize_row_q5_0_ref(const void *src, float *dst, int64_t n)
{
    const bl_block_q5_0 *b = src;
    for (int64_t i = 0; i < n / BL_QK; i++, b++, dst += BL_QK) {
        const float d = bl_fp16_to_fp32(b->d);
        for (int j = 0; j < BL_QK / 2; j++) {
            int q0 = (b->qs[j] & 0xf) | q5_high(b->qh, j) << 4;
            int q1 = (b->qs[j] >> 4) | q5_high(b->qh, j + 16) << 4;
            dst[j] = (float)(q0 - 16) * d;
            dst[j + BL_QK / 2] = (float)(q1 - 16) * d;
        }
    }
}

void bl_dequantize_row_q5_1_ref(const void *src, float *dst, int64_t n)
{
    const bl_block_q5_1 *b = src;
    for (int64_t i = 0; i < n / BL_QK; i++, b++, dst += BL_QK) {
        const float d = bl_fp16_to_fp32(b->d);
        const float m = bl_fp16_to_fp32(b->m);
        for (int j = 0; j < BL_QK / 2; j++) {
            int q0 = (b->qs[j] & 0xf) | q5_high(b->qh, j) << 4;
            int q1 = (b->qs[j] >> 4) | q5_high(b->qh, j + 16) << 4;
            dst[j] = (float)q0 * d + m;
            dst[j + BL_QK / 2] = (float)q1 * d + m;
        }
    }
}

void bl_dequantize_row_q8_0_ref(const void *src, float *dst, int64_t n)
{
    const bl_block_q8_0 *b = src;
    for (int64_t i = 0; i < n / BL_QK; i++, b++, dst += BL_QK) {
        const float d = bl_fp16_to_fp32(b->d);
        for (int j = 0; j < BL_QK; j++)
            dst[j] = (float)b->qs[j] * d;
    }
}

void bl_dequantize_row_q8_1_ref(const void *src, float *dst, int64_t n)
{
    const bl_block_q8_1 *b = src;
    for (int64_t i = 0; i < n / BL_QK; i++, b++, dst += BL_QK) {
        const float d = bl_fp16_to_fp32(b->d);
        for (int j = 0; j < BL_QK; j++)
            dst[j] = (float)b->qs[j] * d;
    }
}

// --- dequantizers: K-quants ------------------------------------------------------------

/* Scale and min j (0..7) of a q4_K/q5_K block, 6 bits each in 12 bytes: for j < 4
 * the low 6 bits of bytes j (scale) and j+4 (min); for j >= 4 the nibbles of byte
 * j+4 give the low 4 bits and the top 2 bits of bytes j-4 (scale) and j (min) the
 * high 2 bits. */
static void k_scale_min(const uint8_t s[BL_K_SCALE_BYTES], int j, int *sc, int *m)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xf) | (s[j - 4] >> 6) << 4;
        *m = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
    }
}

/* Scale j (0..15) of a q3_K block, 6 bits: the low nibble from byte j (j < 8) or
 * the high nibble of byte j-8, and 2 high bits from byte 8 + j%4 at bit 2*(j/4). */
static int q3_scale(const uint8_t s[12], int j)
{
    int lo = j < 8 ? s[j] & 0xf : s[j - 8] >> 4;
    int hi = (s[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
    return lo | hi << 4;
}

void bl_dequantize_row_q2_K_ref(const void *src, float *dst, int64_t n)
{
    const bl_block_q2_K *b = src;
    for (int64_t i = 0; i < n / BL_QK_K; i++, b++) {
        const float d = bl_fp16_to_fp32(b->d);
        const float dmin = bl_fp16_to_fp32(b->dmin);
        /* Element 128*h + 32*k + l sits in qs[32*h + l] at bit 2*k; sub-block of 16
         * = element / 16. */
        for (int e = 0; e < BL_QK_K; e++) {
            int h = e / 128, k = (e / 32) % 4, l = e % 32;
            int sc = b->scales[e / 16];
            const float dl = d * (float)(sc & 0xf);
            const float ml = dmin * (float)(sc >> 4);
            int q = (b->qs[32 * h + l] >> (2 * k)) & 3;
            *dst++ = dl * (float)q - ml;
        }
    }
}

void bl_dequantize_row_q3_K_ref(const void *src, float *dst, int64_t n)
{
    const bl_block_q3_K *b = src;
    for (int64_t i = 0; i < n / BL_QK_K; i++, b++) {
        const float d = bl_fp16_to_fp32(b->d);
        /* Same 2-bit placement as q2_K; the third bit of element 128*h + 32*k + l is
         * bit 4*h + k of hmask[l], and a clear bit subtracts 4. */
        for (int e = 0; e < BL_QK_K; e++) {
            int h = e / 128, k = (e / 32) % 4, l = e % 32;
            const float dl = d * (float)(q3_scale(b->scales, e / 16) - 32);
            int q = (b->qs[32 * h + l] >> (2 * k)) & 3;
            if (!((b->hmask[l] >> (4 * h + k)) & 1))
                q -= 4;
            *dst++ = dl * (float)q;
        }
    }
}

void bl_dequantize_row_q4_K_ref(const void *src, float *dst, int64_t n)
{
    const bl_block_q4_K *b = src;
    for (int64_t i = 0; i < n / BL_QK_K; i++, b++) {
        const float d = bl_fp16_to_fp32(b->d);
        const float dmin = bl_fp16_to_fp32(b->dmin);
        /* Sub-block 2c takes the low nibbles of qs[32c .. 32c+31], 2c+1 the high. */
        for (int s = 0; s < 8; s++) {
            int sc, m;
            k_scale_min(b->scales, s, &sc, &m);
            const float dl = d * (float)sc;
            const float ml = dmin * (float)m;
            const uint8_t *q = b->qs + 32 * (s / 2);
            int shift = 4 * (s & 1);
            for (int l = 0; l < 32; l++)
                *dst++ = dl * (float)((q[l] >> shift) & 0xf) - ml;
        }
    }
}

void bl_dequantize_row_q5_K_ref(const void *src, float *dst, int64_t n)
{
    const bl_block_q5_K *b = src;
    for (int64_t i = 0; i < n / BL_QK_K; i++, b++) {
        const float d = bl_fp16_to_fp32(b->d);
        const float dmin = bl_fp16_to_fp32(b->dmin);
        /* As q4_K, plus the fifth bit of sub-block s, element l: bit s of qh[l]. */
        for (int s = 0; s < 8; s++) {
            int sc, m;
            k_scale_min(b->scales, s, &sc, &m);
            const float dl = d * (float)sc;
            const float ml = dmin * (float)m;
            const uint8_t *q = b->qs + 32 * (s / 2);
            int shift = 4 * (s & 1);
            for (int l = 0; l < 32; l++) {
                int v = ((q[l] >> shift) & 0xf) | ((b->qh[l] >> s) & 1) << 4;
                *dst++ = dl * (float)v - ml;
            }
        }
    }
}

void bl_dequantize_row_q6_K_ref(const void *src, float *dst, int64_t n)
{
    const bl_block_q6_K *b = src;
    for (int64_t i = 0; i < n / BL_QK_K; i++, b++) {
        const float d = bl_fp16_to_fp32(b->d);
        /* Element 128*h + 32*k + l: low nibble of ql[64*h + 32*(k&1) + l] (high nibble
         * for k >= 2), high 2 bits at bit 2*k of qh[32*h + l]. */
        for (int e = 0; e < BL_QK_K; e++) {
            int h = e / 128, k = (e / 32) % 4, l = e % 32;
            int lo = (b->ql[64 * h + 32 * (k & 1) + l] >> (4 * (k >> 1))) & 0xf;
            int hi = (b->qh[32 * h + l] >> (2 * k)) & 3;
            const float dl = d * (float)b->scales[e / 16];
            *dst++ = dl * (float)((lo | hi << 4) - 32);
        }
    }
}

void bl_dequantize_row_q8_K_ref(const void *src, float *dst, int64_t n)
{
    const bl_block_q8_K *b = src;
    for (int64_t i = 0; i < n / BL_QK_K; i++, b++)
        for (int j = 0; j < BL_QK_K; j++)
            *dst++ = b->d * (float)b->qs[j];
}

// --- quantizers ------------------------------------------------------------------------

/* Nearest integer to v (ties to even, the default rounding mode), clamped to
 * [lo, hi]; NaN gives lo. Clamping before the conversion keeps it defined. */
static int round_clamp(float v, int lo, int hi)
{
    if (!(v >= (float)lo))
        return lo;
    if (v >= (float)hi)
        return hi;
    return (int)lrintf(v);
}

void bl_quantize_row_f32_ref(const float *src, void *dst, int64_t n)
{
    memcpy(dst, src, (size_t)n * sizeof(float));
}

void bl_quantize_row_f16_ref(const float *src, void *dst, int64_t n)
{
    uint16_t *h = dst;
    for (int64_t i = 0; i < n; i++)
        h[i] = bl_fp32_to_fp16(src[i]);
}

void bl_quantize_row_bf16_ref(const float *src, void *dst, int64_t n)
{
    uint16_t *h = dst;
    for (int64_t i = 0; i < n; i++)
        h[i] = bl_fp32_to_bf16(src[i]);
}

static float abs_max(const float *x, int n)
{
    float amax = 0.0f;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > amax)
            amax = fabsf(x[i]);
    return amax;
}

void bl_quantize_row_q8_0_ref(const float *src, void *dst, int64_t n)
{
    bl_block_q8_0 *b = dst;
    for (int64_t i = 0; i < n / BL_QK; i++, b++, src += BL_QK) {
        b->d = bl_fp32_to_fp16(abs_max(src, BL_QK) / 127.0f);
        /* Divide by the scale as stored, not the exact one, so the rounding of the
         * half is not added to every element's error. */
        const float d = bl_fp16_to_fp32(b->d);
        const float id = d > 0.0f ? 1.0f / d : 0.0f;
        for (int j = 0; j < BL_QK; j++)
            b->qs[j] = (int8_t)round_clamp(src[j] * id, -128, 127);
    }
}

void bl_quantize_row_q8_K_ref(const float *src, void *dst, int64_t n)
{
    bl_block_q8_K *b = dst;
    for (int64_t i = 0; i < n / BL_QK_K; i++, b++, src += BL_QK_K) {
        const float amax = abs_max(src, BL_QK_K);
        memset(b, 0, sizeof *b);
        if (!(amax > 0.0f)) /* all zero (or NaN): d = 0 decodes to zeros */
            continue;
        const float id = 127.0f / amax;
        b->d = amax / 127.0f;
        for (int j = 0; j < BL_QK_K; j++) {
            b->qs[j] = (int8_t)round_clamp(src[j] * id, -127, 127);
            b->bsums[j / 16] = (int16_t)(b->bsums[j / 16] + b->qs[j]);
        }
    }
}

/* Affine fit of a sub-block for q4_K/q5_K: x ~ s * q - m with q in 0..nmax, s >= 0
 * and m >= 0 (the format stores the offset as a subtracted min, so the represented
 * minimum is never above zero). Several candidate grids are tried (the range
 * [min(x, 0), max(x)] mapped onto nmax + t levels for t in -1 .. +1 in tenths); for
 * each, the least-squares s and m for those q's are solved in closed form, and the
 * pair with the smallest squared error wins. */
static void fit_scale_min(const float *x, int n, int nmax, float *s_out, float *m_out)
{
    float lo = x[0], hi = x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < lo)
            lo = x[i];
        if (x[i] > hi)
            hi = x[i];
    }
    if (lo > 0.0f)
        lo = 0.0f;
    if (!(hi > lo)) { /* constant block: q = 0, x = -m */
        *s_out = 0.0f;
        *m_out = -lo;
        return;
    }
    float best_s = (hi - lo) / (float)nmax, best_m = -lo;
    float best_err = INFINITY;
    for (int t = -10; t <= 10; t++) {
        const float is = ((float)nmax + 0.1f * (float)t) / (hi - lo);
        float sl = 0, sll = 0, sx = 0, slx = 0;
        uint8_t q[32];
        for (int i = 0; i < n; i++) {
            q[i] = (uint8_t)round_clamp(is * (x[i] - lo), 0, nmax);
            sl += (float)q[i];
            sll += (float)q[i] * (float)q[i];
            sx += x[i];
            slx += (float)q[i] * x[i];
        }
        const float det = (float)n * sll - sl * sl;
        if (!(det > 0.0f))
            continue;
        float s = ((float)n * slx - sl * sx) / det;
        float off = (sll * sx - sl * slx) / det;
        if (off > 0.0f) { /* the offset may not be positive: refit s with it at zero */
            off = 0.0f;
            s = slx / sll;
        }
        if (s < 0.0f)
            continue;
        float err = 0.0f;
        for (int i = 0; i < n; i++) {
            const float r = s * (float)q[i] + off - x[i];
            err += r * r;
        }
        if (err < best_err) {
            best_err = err;
            best_s = s;
            best_m = -off;
        }
    }
    *s_out = best_s;
    *m_out = best_m;
}

/* Packs 6-bit scale and min j (0..7) the way k_scale_min unpacks them. */
static void k_pack_scale_min(uint8_t s[BL_K_SCALE_BYTES], int j, int sc, int m)
{
    if (j < 4) {
        s[j] = (uint8_t)((s[j] & 0xc0) | sc);
        s[j + 4] = (uint8_t)((s[j + 4] & 0xc0) | m);
    } else {
        s[j + 4] = (uint8_t)((sc & 0xf) | (m & 0xf) << 4);
        s[j - 4] = (uint8_t)((s[j - 4] & 0x3f) | (sc >> 4) << 6);
        s[j] = (uint8_t)((s[j] & 0x3f) | (m >> 4) << 6);
    }
}

/* The shared part of the q4_K and q5_K quantizers: fits the 8 sub-blocks of 32,
 * quantizes their scales and mins to 6 bits under fp16 super-block factors, and
 * writes q (0..nmax) for each of the 256 elements against the scales as stored. */
static void quantize_k_affine(const float *x, int nmax, uint16_t *d_out, uint16_t *dmin_out,
                              uint8_t scales[BL_K_SCALE_BYTES], uint8_t q[BL_QK_K])
{
    float s[8], m[8], smax = 0.0f, mmax = 0.0f;
    for (int j = 0; j < 8; j++) {
        fit_scale_min(x + 32 * j, 32, nmax, &s[j], &m[j]);
        if (s[j] > smax)
            smax = s[j];
        if (m[j] > mmax)
            mmax = m[j];
    }
    *d_out = bl_fp32_to_fp16(smax / 63.0f);
    *dmin_out = bl_fp32_to_fp16(mmax / 63.0f);
    const float d = bl_fp16_to_fp32(*d_out);
    const float dmin = bl_fp16_to_fp32(*dmin_out);
    memset(scales, 0, BL_K_SCALE_BYTES);
    for (int j = 0; j < 8; j++) {
        int sc = d > 0.0f ? round_clamp(s[j] / d, 0, 63) : 0;
        int mi = dmin > 0.0f ? round_clamp(m[j] / dmin, 0, 63) : 0;
        k_pack_scale_min(scales, j, sc, mi);
        /* Requantize against the scale and min the decoder will actually use. */
        const float dl = d * (float)sc;
        const float ml = dmin * (float)mi;
        for (int l = 0; l < 32; l++)
            q[32 * j + l] =
                (uint8_t)(dl > 0.0f ? round_clamp((x[32 * j + l] + ml) / dl, 0, nmax) : 0);
    }
}

void bl_quantize_row_q4_K_ref(const float *src, void *dst, int64_t n)
{
    bl_block_q4_K *b = dst;
    uint8_t q[BL_QK_K];
    for (int64_t i = 0; i < n / BL_QK_K; i++, b++, src += BL_QK_K) {
        quantize_k_affine(src, 15, &b->d, &b->dmin, b->scales, q);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++)
                b->qs[32 * c + l] = (uint8_t)(q[64 * c + l] | q[64 * c + 32 + l] << 4);
    }
}

void bl_quantize_row_q5_K_ref(const float *src, void *dst, int64_t n)
{
    bl_block_q5_K *b = dst;
    uint8_t q[BL_QK_K];
    for (int64_t i = 0; i < n / BL_QK_K; i++, b++, src += BL_QK_K) {
        quantize_k_affine(src, 31, &b->d, &b->dmin, b->scales, q);
        memset(b->qh, 0, sizeof b->qh);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++)
                b->qs[32 * c + l] =
                    (uint8_t)((q[64 * c + l] & 0xf) | (q[64 * c + 32 + l] & 0xf) << 4);
        for (int s = 0; s < 8; s++)
            for (int l = 0; l < 32; l++)
                b->qh[l] |= (uint8_t)((q[32 * s + l] >> 4) << s);
    }
}

/* Symmetric fit of a q6_K sub-block of 16: x ~ s * q, q in -32..31. Candidate grids
 * map the largest magnitude onto 32 + t/10 levels (t in -9..9, with the sign chosen
 * so that it lands on the side that has 32 levels); each grid's least-squares s is
 * solved and the smallest squared error wins. */
static float fit_scale_sym(const float *x, int n)
{
    float amax = 0.0f, vmax = 0.0f;
    for (int i = 0; i < n; i++) {
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            vmax = x[i];
        }
    }
    if (!(amax > 0.0f))
        return 0.0f;
    float best_s = vmax / -32.0f, best_err = INFINITY;
    for (int t = -9; t <= 9; t++) {
        const float is = -(32.0f + 0.1f * (float)t) / vmax;
        float sqq = 0.0f, sqx = 0.0f;
        int q[16];
        for (int i = 0; i < n; i++) {
            q[i] = round_clamp(is * x[i], -32, 31);
            sqq += (float)(q[i] * q[i]);
            sqx += (float)q[i] * x[i];
        }
        if (!(sqq > 0.0f))
            continue;
        const float s = sqx / sqq;
        float err = 0.0f;
        for (int i = 0; i < n; i++) {
            const float r = s * (float)q[i] - x[i];
            err += r * r;
        }
        if (err < best_err) {
            best_err = err;
            best_s = s;
        }
    }
    return best_s;
}

void bl_quantize_row_q6_K_ref(const float *src, void *dst, int64_t n)
{
    bl_block_q6_K *b = dst;
    for (int64_t i = 0; i < n / BL_QK_K; i++, b++, src += BL_QK_K) {
        float s[16], smax = 0.0f;
        for (int j = 0; j < 16; j++) {
            s[j] = fit_scale_sym(src + 16 * j, 16);
            if (fabsf(s[j]) > smax)
                smax = fabsf(s[j]);
        }
        b->d = bl_fp32_to_fp16(smax / 127.0f);
        const float d = bl_fp16_to_fp32(b->d);
        uint8_t q[BL_QK_K];
        for (int j = 0; j < 16; j++) {
            int sc = d > 0.0f ? round_clamp(s[j] / d, -128, 127) : 0;
            b->scales[j] = (int8_t)sc;
            const float dl = d * (float)sc;
            for (int l = 0; l < 16; l++) {
                int v = dl != 0.0f ? round_clamp(src[16 * j + l] / dl, -32, 31) : 0;
                q[16 * j + l] = (uint8_t)(v + 32);
            }
        }
        /* Inverse of the layout in bl_dequantize_row_q6_K_ref. */
        memset(b->ql, 0, sizeof b->ql);
        memset(b->qh, 0, sizeof b->qh);
        for (int e = 0; e < BL_QK_K; e++) {
            int h = e / 128, k = (e / 32) % 4, l = e % 32;
            b->ql[64 * h + 32 * (k & 1) + l] |= (uint8_t)((q[e] & 0xf) << (4 * (k >> 1)));
            b->qh[32 * h + l] |= (uint8_t)((q[e] >> 4) << (2 * k));
        }
    }
}

/* mxfp4 (32 values: an E8M0 exponent byte e, then 16 bytes of 4-bit E2M1 codes,
 * value j in the low nibble of byte j and value j + 16 in the high one; value =
 * E2M1(code) * 2^(e - 127), which bl_dequantize_row_mxfp4_ref computes as the
 * doubled code times bl_e8m0_to_fp32_half(e) = 2^(e - 128)).
 * The exponent follows the OCP MX rule llama.cpp's reference quantizer uses: with
 * the block's largest magnitude amax = m 2^k (1 <= m < 2), the scale is 2^(k - 2),
 * which puts amax in [4, 8) scale units, E2M1's top binade; magnitudes in [6, 8)
 * units saturate to 6. Stored: e = k + 125, read off amax's float exponent bits
 * (exact, where floor(log2f(amax)) can round 2^k - ulp up to k), clamped to 0 for
 * amax below 2^-125 (such blocks are coarser: their steps stay 2^-128). Each value
 * gets its nearest code; a tie goes to the smaller magnitude (llama.cpp's search
 * keeps the first best), and a value within half the smallest step of zero to code
 * 0 (+0), never 8 (-0).
 * Not numbers: a NaN quantizes to 0 and does not enter amax; an Inf counts as
 * FLT_MAX, so its block gets e = 252 and it decodes to +-6 * 2^125 (+-1.5 * 2^127,
 * the largest finite magnitude mxfp4 holds), while its finite neighbours, far below
 * that scale, mostly become 0. Deterministic; no float-to-int conversion can go out
 * of range. */
void bl_quantize_row_mxfp4_ref(const float *src, void *dst, int64_t n)
{
    /* Midpoints between consecutive doubled E2M1 magnitudes 0 1 2 3 4 6 8 12. */
    static const double mid[7] = {0.5, 1.5, 2.5, 3.5, 5.0, 7.0, 10.0};
    bl_block_mxfp4 *b = dst;
    for (int64_t i = 0; i < n / BL_QK; i++, b++, src += BL_QK) {
        const float amax = abs_max(src, BL_QK); /* NaN never compares above; Inf does */
        int be = (int)((f32_bits(amax) >> 23) & 0xff); /* k + 127; 0 for 0 and subnormals */
        if (be > 254)
            be = 254; /* Inf: as FLT_MAX */
        const int e = be < 2 ? 0 : be - 2;
        b->e = (uint8_t)e;
        /* |x| in units of the halved scale, exact: a power of two within double range */
        const double inv = ldexp(1.0, 128 - e);
        uint8_t c[BL_QK];
        for (int j = 0; j < BL_QK; j++) {
            const double v = fabs((double)src[j]) * inv; /* NaN stays NaN: code 0 */
            int q = 0;
            while (q < 7 && v > mid[q])
                q++;
            c[j] = (uint8_t)(q && src[j] < 0.0f ? q | 8 : q);
        }
        for (int j = 0; j < BL_QK / 2; j++)
            b->qs[j] = (uint8_t)(c[j] | c[j + BL_QK / 2] << 4);
    }
}

// --- dispatch ----------------------------------------------------------------------------

typedef void (*dequant_fn)(const void *, float *, int64_t);
typedef void (*quant_fn)(const float *, void *, int64_t);

static dequant_fn dequant_for(bl_type_t type)
{
    switch (type) {
    case BL_TYPE_F32: return bl_dequantize_row_f32_ref;
    case BL_TYPE_F16: return bl_dequantize_row_f16_ref;
    case BL_TYPE_BF16: return bl_dequantize_row_bf16_ref;
    case BL_TYPE_Q4_0: return bl_dequantize_row_q4_0_ref;
    case BL_TYPE_Q4_1: return bl_dequantize_row_q4_1_ref;
    case BL_TYPE_Q5_0: return bl_dequantize_row_q5_0_ref;
    case BL_TYPE_Q5_1: return bl_dequantize_row_q5_1_ref;
    case BL_TYPE_Q8_0: return bl_dequantize_row_q8_0_ref;
    case BL_TYPE_Q8_1: return bl_dequantize_row_q8_1_ref;
    case BL_TYPE_Q2_K: return bl_dequantize_row_q2_K_ref;
    case BL_TYPE_Q3_K: return bl_dequantize_row_q3_K_ref;
    case BL_TYPE_Q4_K: return bl_dequantize_row_q4_K_ref;
    case BL_TYPE_Q5_K: return bl_dequantize_row_q5_K_ref;
    case BL_TYPE_Q6_K: return bl_dequantize_row_q6_K_ref;
    case BL_TYPE_Q8_K: return bl_dequantize_row_q8_K_ref;
    case BL_TYPE_IQ2_XXS: return bl_dequantize_row_iq2_xxs_ref;
    case BL_TYPE_IQ2_XS: return bl_dequantize_row_iq2_xs_ref;
    case BL_TYPE_IQ2_S: return bl_dequantize_row_iq2_s_ref;
    case BL_TYPE_IQ3_XXS: return bl_dequantize_row_iq3_xxs_ref;
    case BL_TYPE_IQ3_S: return bl_dequantize_row_iq3_s_ref;
    case BL_TYPE_IQ1_S: return bl_dequantize_row_iq1_s_ref;
    case BL_TYPE_IQ1_M: return bl_dequantize_row_iq1_m_ref;
    case BL_TYPE_IQ4_NL: return bl_dequantize_row_iq4_nl_ref;
    case BL_TYPE_IQ4_XS: return bl_dequantize_row_iq4_xs_ref;
    case BL_TYPE_TQ1_0: return bl_dequantize_row_tq1_0_ref;
    case BL_TYPE_TQ2_0: return bl_dequantize_row_tq2_0_ref;
    case BL_TYPE_MXFP4: return bl_dequantize_row_mxfp4_ref;
    default: return NULL;
    }
}

static quant_fn quant_for(bl_type_t type)
{
    switch (type) {
    case BL_TYPE_F32: return bl_quantize_row_f32_ref;
    case BL_TYPE_F16: return bl_quantize_row_f16_ref;
    case BL_TYPE_BF16: return bl_quantize_row_bf16_ref;
    case BL_TYPE_Q8_0: return bl_quantize_row_q8_0_ref;
    case BL_TYPE_Q4_K: return bl_quantize_row_q4_K_ref;
    case BL_TYPE_Q5_K: return bl_quantize_row_q5_K_ref;
    case BL_TYPE_Q6_K: return bl_quantize_row_q6_K_ref;
    case BL_TYPE_Q8_K: return bl_quantize_row_q8_K_ref;
    case BL_TYPE_MXFP4: return bl_quantize_row_mxfp4_ref;
    default: return NULL;
    }
}

/* Common argument checks: BL_EINVAL for an unknown id, BL_ERANGE for a count that
 * is negative or not a whole number of blocks. */
static int check_row(bl_type_t type, int64_t n)
{
    const bl_type_info_t *ti = bl_type_info((uint32_t)type);
    if (!ti)
        return BL_EINVAL;
    if (n < 0 || n % ti->block_elems != 0)
        return BL_ERANGE;
    return 0;
}

int bl_dequantize_row_ref(bl_type_t type, const void *src, float *dst, int64_t n)
{
    int rc = check_row(type, n);
    if (rc)
        return rc;
    dequant_fn fn = dequant_for(type);
    if (!fn)
        return BL_ENOTSUP;
    fn(src, dst, n);
    return 0;
}

int bl_quantize_row_ref(bl_type_t type, const float *src, void *dst, int64_t n)
{
    int rc = check_row(type, n);
    if (rc)
        return rc;
    quant_fn fn = quant_for(type);
    if (!fn)
        return BL_ENOTSUP;
    fn(src, dst, n);
    return 0;
}
