/* Scalar reference dot products, one per (weight format, activation format) pair,
 * and the reference axpy of attention's V side. Every SIMD variant is tested
 * against these. Integer products are summed exactly per (sub-)block; the float
 * f32/f16 dots sum in double so that the reference is the more accurate side.
 * Also the scalar unpackers of K-quant rows for batched products, and the 16-bit
 * activation formats of the fast path (kcpu_block_q16_K, kcpu_block_q16_0): their
 * quantizers, their dots with the K-quants and with q8_0, q4_0 and mxfp4, and the
 * unpackers of the K-quants' batched tiles. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "blocks.h"
#include "kcpu.h"
#include "kcpu_impl.h"
#include "quant.h"

float kcpu_vec_dot_f32_f32_ref(const float *w, const float *x, int64_t n)
{
    double s = 0.0;
    for (int64_t i = 0; i < n; i++)
        s += (double)w[i] * (double)x[i];
    return (float)s;
}

float kcpu_vec_dot_f16_f32_ref(const uint16_t *w, const float *x, int64_t n)
{
    double s = 0.0;
    for (int64_t i = 0; i < n; i++)
        s += (double)bl_fp16_to_fp32(w[i]) * (double)x[i];
    return (float)s;
}

float kcpu_vec_dot_q8_0_q8_0_ref(const void *w, const void *x, int64_t n)
{
    const bl_block_q8_0 *a = w;
    const bl_block_q8_0 *b = x;
    float s = 0.0f;
    for (int64_t i = 0; i < n / BL_QK; i++) {
        int32_t isum = 0;
        for (int j = 0; j < BL_QK; j++)
            isum += a[i].qs[j] * b[i].qs[j];
        s += bl_fp16_to_fp32(a[i].d) * bl_fp16_to_fp32(b[i].d) * (float)isum;
    }
    return s;
}

float kcpu_vec_dot_q4_0_q8_0_ref(const void *w, const void *x, int64_t n)
{
    const bl_block_q4_0 *a = w;
    const bl_block_q8_0 *b = x;
    float s = 0.0f;
    for (int64_t i = 0; i < n / BL_QK; i++) {
        int32_t isum = 0;
        for (int j = 0; j < BL_QK / 2; j++) {
            isum += ((a[i].qs[j] & 0xf) - 8) * b[i].qs[j];
            isum += ((a[i].qs[j] >> 4) - 8) * b[i].qs[j + BL_QK / 2];
        }
        s += bl_fp16_to_fp32(a[i].d) * bl_fp16_to_fp32(b[i].d) * (float)isum;
    }
    return s;
}

/* mxfp4: each weight is a doubled E2M1 value (an integer in -12..12) times the
 * block's halved power of two, so a block's dot is one integer sum. */
float kcpu_vec_dot_mxfp4_q8_0_ref(const void *w, const void *x, int64_t n)
{
    const bl_block_mxfp4 *a = w;
    const bl_block_q8_0 *b = x;
    float s = 0.0f;
    for (int64_t i = 0; i < n / BL_QK; i++) {
        int32_t isum = 0;
        for (int j = 0; j < BL_QK / 2; j++) {
            isum += bl_e2m1_doubled[a[i].qs[j] & 0xf] * b[i].qs[j];
            isum += bl_e2m1_doubled[a[i].qs[j] >> 4] * b[i].qs[j + BL_QK / 2];
        }
        s += bl_e8m0_to_fp32_half(a[i].e) * bl_fp16_to_fp32(b[i].d) * (float)isum;
    }
    return s;
}

/* q4_K and q5_K: x = d*sc*q - dmin*m per sub-block of 32, so a block's dot is
 * d*xd*sum(sc * sum(q*y)) - dmin*xd*sum(m * sum(y)); the sums of y come from the
 * q8_K bsums (two groups of 16 per sub-block). */
float kcpu_vec_dot_q4_K_q8_K_ref(const void *w, const void *x, int64_t n)
{
    const bl_block_q4_K *a = w;
    const bl_block_q8_K *b = x;
    float s = 0.0f;
    for (int64_t i = 0; i < n / BL_QK_K; i++) {
        int32_t sumi = 0, summ = 0;
        for (int sb = 0; sb < 8; sb++) {
            int sc, m;
            kcpu__k_scale_min(a[i].scales, sb, &sc, &m);
            const uint8_t *q = a[i].qs + 32 * (sb / 2);
            const int shift = 4 * (sb & 1);
            int32_t isum = 0;
            for (int l = 0; l < 32; l++)
                isum += ((q[l] >> shift) & 0xf) * b[i].qs[32 * sb + l];
            sumi += sc * isum;
            summ += m * (b[i].bsums[2 * sb] + b[i].bsums[2 * sb + 1]);
        }
        s += b[i].d * (bl_fp16_to_fp32(a[i].d) * (float)sumi -
                       bl_fp16_to_fp32(a[i].dmin) * (float)summ);
    }
    return s;
}

float kcpu_vec_dot_q5_K_q8_K_ref(const void *w, const void *x, int64_t n)
{
    const bl_block_q5_K *a = w;
    const bl_block_q8_K *b = x;
    float s = 0.0f;
    for (int64_t i = 0; i < n / BL_QK_K; i++) {
        int32_t sumi = 0, summ = 0;
        for (int sb = 0; sb < 8; sb++) {
            int sc, m;
            kcpu__k_scale_min(a[i].scales, sb, &sc, &m);
            const uint8_t *q = a[i].qs + 32 * (sb / 2);
            const int shift = 4 * (sb & 1);
            int32_t isum = 0;
            for (int l = 0; l < 32; l++) {
                const int v = ((q[l] >> shift) & 0xf) | ((a[i].qh[l] >> sb) & 1) << 4;
                isum += v * b[i].qs[32 * sb + l];
            }
            sumi += sc * isum;
            summ += m * (b[i].bsums[2 * sb] + b[i].bsums[2 * sb + 1]);
        }
        s += b[i].d * (bl_fp16_to_fp32(a[i].d) * (float)sumi -
                       bl_fp16_to_fp32(a[i].dmin) * (float)summ);
    }
    return s;
}

/* q6_K: x = d*sc*(q - 32) per group of 16; element layout as in
 * bl_dequantize_row_q6_K_ref. */
float kcpu_vec_dot_q6_K_q8_K_ref(const void *w, const void *x, int64_t n)
{
    const bl_block_q6_K *a = w;
    const bl_block_q8_K *b = x;
    float s = 0.0f;
    for (int64_t i = 0; i < n / BL_QK_K; i++) {
        int32_t sumi = 0;
        for (int g = 0; g < BL_QK_K / 16; g++) {
            int32_t isum = 0;
            for (int e = 16 * g; e < 16 * g + 16; e++) {
                const int h = e / 128, k = (e / 32) % 4, l = e % 32;
                const int lo = (a[i].ql[64 * h + 32 * (k & 1) + l] >> (4 * (k >> 1))) & 0xf;
                const int hi = (a[i].qh[32 * h + l] >> (2 * k)) & 3;
                isum += ((lo | hi << 4) - 32) * b[i].qs[e];
            }
            sumi += a[i].scales[g] * isum;
        }
        s += bl_fp16_to_fp32(a[i].d) * b[i].d * (float)sumi;
    }
    return s;
}

/* Two activation rows against one weight row: by definition each row's dot, which
 * the SIMD variants match bit for bit with their own one-row dot. */
void kcpu_vec_dotp_q8_0_q8_0_ref(const void *w, const void *xa, const void *xb, int64_t n, float out[2])
{
    out[0] = kcpu_vec_dot_q8_0_q8_0_ref(w, xa, n);
    out[1] = kcpu_vec_dot_q8_0_q8_0_ref(w, xb, n);
}

void kcpu_vec_dotp_mxfp4_q8_0_ref(const void *w, const void *xa, const void *xb, int64_t n, float out[2])
{
    out[0] = kcpu_vec_dot_mxfp4_q8_0_ref(w, xa, n);
    out[1] = kcpu_vec_dot_mxfp4_q8_0_ref(w, xb, n);
}

/* An activation row's two q8_K terms (a value and its residual) against one weight
 * row: by definition the sum of the two dots, which the fused SIMD variants match. */
float kcpu_vec_dot2_q4_K_q8_K_ref(const void *w, const void *x0, const void *x1, int64_t n)
{
    return kcpu_vec_dot_q4_K_q8_K_ref(w, x0, n) + kcpu_vec_dot_q4_K_q8_K_ref(w, x1, n);
}

float kcpu_vec_dot2_q5_K_q8_K_ref(const void *w, const void *x0, const void *x1, int64_t n)
{
    return kcpu_vec_dot_q5_K_q8_K_ref(w, x0, n) + kcpu_vec_dot_q5_K_q8_K_ref(w, x1, n);
}

float kcpu_vec_dot2_q6_K_q8_K_ref(const void *w, const void *x0, const void *x1, int64_t n)
{
    return kcpu_vec_dot_q6_K_q8_K_ref(w, x0, n) + kcpu_vec_dot_q6_K_q8_K_ref(w, x1, n);
}

void kcpu_axpy_f32_ref(float *y, float a, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] += a * x[i];
}

void kcpu_axpy_f16_ref(float *y, float a, const uint16_t *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] += a * bl_fp16_to_fp32(x[i]);
}

void kcpu_att_qk_f16_ref(const float *q, int ng, const uint16_t *k, int64_t k_stride, int64_t len,
                         int64_t hd, float scale, float *sc, int64_t ld)
{
    for (int64_t s = 0; s < len; s++)
        for (int g = 0; g < ng; g++)
            sc[g * ld + s] = kcpu_vec_dot_f16_f32_ref(k + s * k_stride, q + g * hd, hd) * scale;
}

void kcpu_att_pv_f16_ref(const float *p, int ng, int64_t ld, const uint16_t *v, int64_t v_stride,
                         int64_t len, int64_t hd, float *out)
{
    for (int g = 0; g < ng; g++) {
        for (int64_t i = 0; i < hd; i++)
            out[g * hd + i] = 0.0f;
        for (int64_t s = 0; s < len; s++)
            kcpu_axpy_f16_ref(out + g * hd, p[g * ld + s], v + s * v_stride, hd);
    }
}

// --- unpacked K-quant rows (batched matmul) ----------------------------------------------

/* q4_K and q5_K: element 64j + l (l < 32) is the low nibble of qs[32j + l], element
 * 64j + 32 + l its high nibble; q5_K's fifth bit of chunk c is bit c of qh[l]. */
static void unpack_q45_K(const bl_block_q4_K *a4, const bl_block_q5_K *a5, kcpu_kunpacked_t *u,
                         int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, u++) {
        const uint8_t *qs = a4 ? a4[i].qs : a5[i].qs;
        const uint8_t *scales = a4 ? a4[i].scales : a5[i].scales;
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++) {
                u->q[64 * j + l] = qs[32 * j + l] & 0xf;
                u->q[64 * j + 32 + l] = qs[32 * j + l] >> 4;
            }
        if (a5)
            for (int c = 0; c < 8; c++)
                for (int l = 0; l < 32; l++)
                    u->q[32 * c + l] |= (uint8_t)(((a5[i].qh[l] >> c) & 1) << 4);
        for (int c = 0; c < 8; c++) {
            int sc, m;
            kcpu__k_scale_min(scales, c, &sc, &m);
            for (int k = 0; k < 16; k++)
                u->scv[c][k] = (int16_t)sc;
            u->corr[2 * c] = u->corr[2 * c + 1] = (int16_t)m;
        }
        u->d = bl_fp16_to_fp32(a4 ? a4[i].d : a5[i].d);
        u->dmin = bl_fp16_to_fp32(a4 ? a4[i].dmin : a5[i].dmin);
    }
}

void kcpu_unpack_q4_K(const void *w, kcpu_kunpacked_t *u, int64_t n)
{
    unpack_q45_K(w, NULL, u, n / BL_QK_K);
}

void kcpu_unpack_q5_K(const void *w, kcpu_kunpacked_t *u, int64_t n)
{
    unpack_q45_K(NULL, w, u, n / BL_QK_K);
}

/* q6_K in the layout of bl_dequantize_row_q6_K_ref, without the -32 (kept unsigned
 * for maddubs; the offset is applied through the bsums). Chunk c's 16 lanes take the
 * scales of groups 2c (lanes 0..7) and 2c + 1. */
void kcpu_unpack_q6_K(const void *w, kcpu_kunpacked_t *u, int64_t n)
{
    const bl_block_q6_K *b = w;
    for (int64_t i = 0; i < n / BL_QK_K; i++, b++, u++) {
        for (int e = 0; e < BL_QK_K; e++) {
            const int h = e / 128, k = (e / 32) % 4, l = e % 32;
            const int lo = (b->ql[64 * h + 32 * (k & 1) + l] >> (4 * (k >> 1))) & 0xf;
            const int hi = (b->qh[32 * h + l] >> (2 * k)) & 3;
            u->q[e] = (uint8_t)(lo | hi << 4);
        }
        for (int c = 0; c < 8; c++)
            for (int k = 0; k < 16; k++)
                u->scv[c][k] = b->scales[2 * c + k / 8];
        for (int g = 0; g < 16; g++)
            u->corr[g] = b->scales[g];
        u->d = bl_fp16_to_fp32(b->d);
        u->dmin = 0.0f;
    }
}

// --- 16-bit activations (q16_K) ----------------------------------------------------------

/* One block of n values as x = d * q with d = amax / 32767 (returned): the largest
 * value maps to +-32767 and every q stays in int16 (the clamp only guards the last
 * rounding of x * id). q16_K's blocks and q16_0's alike. */
static float quantize_q16_block(const float *x, int n, int16_t *q)
{
    float amax = 0.0f;
    for (int j = 0; j < n; j++) {
        const float a = fabsf(x[j]);
        amax = a > amax ? a : amax;
    }
    const float id = amax > 0.0f ? 32767.0f / amax : 0.0f;
    for (int j = 0; j < n; j++) {
        float v = x[j] * id;
        v = v < -32767.0f ? -32767.0f : v > 32767.0f ? 32767.0f : v;
        q[j] = (int16_t)lrintf(v);
    }
    return amax / 32767.0f;
}

void kcpu_quantize_row_q16_K_ref(const float *x, kcpu_block_q16_K *y, int64_t n)
{
    for (int64_t i = 0; i < n / BL_QK_K; i++, x += BL_QK_K, y++) {
        y->d = quantize_q16_block(x, BL_QK_K, y->q);
        for (int sb = 0; sb < 8; sb++) {
            int32_t sum = 0;
            for (int l = 0; l < 32; l++)
                sum += y->q[32 * sb + l];
            y->bsum[sb] = y->d * (float)sum;
        }
        memset(y->_pad, 0, sizeof y->_pad);
    }
}

/* The q16_K dots sum each block's integer products exactly (int64) and the blocks
 * in double: the reference is the accurate side of every comparison. */
static float dot_q45_K_q16_K(const bl_block_q4_K *a4, const bl_block_q5_K *a5,
                             const kcpu_block_q16_K *b, int64_t nb)
{
    double s = 0.0;
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *qs = a4 ? a4[i].qs : a5[i].qs;
        const uint8_t *scales = a4 ? a4[i].scales : a5[i].scales;
        int64_t sumi = 0;
        double summ = 0.0;
        for (int sb = 0; sb < 8; sb++) {
            int sc, m;
            kcpu__k_scale_min(scales, sb, &sc, &m);
            const uint8_t *q = qs + 32 * (sb / 2);
            const int shift = 4 * (sb & 1);
            int64_t isum = 0;
            for (int l = 0; l < 32; l++) {
                int v = (q[l] >> shift) & 0xf;
                if (a5)
                    v |= ((a5[i].qh[l] >> sb) & 1) << 4;
                isum += (int64_t)v * b[i].q[32 * sb + l];
            }
            sumi += sc * isum;
            summ += m * (double)b[i].bsum[sb];
        }
        const float d = bl_fp16_to_fp32(a4 ? a4[i].d : a5[i].d);
        const float dmin = bl_fp16_to_fp32(a4 ? a4[i].dmin : a5[i].dmin);
        s += (double)b[i].d * (double)d * (double)sumi - (double)dmin * summ;
    }
    return (float)s;
}

float kcpu_vec_dot_q4_K_q16_K_ref(const void *w, const void *x, int64_t n)
{
    return dot_q45_K_q16_K(w, NULL, x, n / BL_QK_K);
}

float kcpu_vec_dot_q5_K_q16_K_ref(const void *w, const void *x, int64_t n)
{
    return dot_q45_K_q16_K(NULL, w, x, n / BL_QK_K);
}

float kcpu_vec_dot_q6_K_q16_K_ref(const void *w, const void *x, int64_t n)
{
    const bl_block_q6_K *a = w;
    const kcpu_block_q16_K *b = x;
    double s = 0.0;
    for (int64_t i = 0; i < n / BL_QK_K; i++) {
        int64_t sumi = 0;
        for (int g = 0; g < BL_QK_K / 16; g++) {
            int64_t isum = 0;
            for (int e = 16 * g; e < 16 * g + 16; e++) {
                const int h = e / 128, k = (e / 32) % 4, l = e % 32;
                const int lo = (a[i].ql[64 * h + 32 * (k & 1) + l] >> (4 * (k >> 1))) & 0xf;
                const int hi = (a[i].qh[32 * h + l] >> (2 * k)) & 3;
                isum += (int64_t)((lo | hi << 4) - 32) * b[i].q[e];
            }
            sumi += a[i].scales[g] * isum;
        }
        s += (double)bl_fp16_to_fp32(a[i].d) * (double)b[i].d * (double)sumi;
    }
    return (float)s;
}

// --- 16-bit activations in blocks of 32 (q16_0) ------------------------------------------

/* As q16_K, a block of 32 at a time. */
void kcpu_quantize_row_q16_0_ref(const float *x, kcpu_block_q16_0 *y, int64_t n)
{
    for (int64_t i = 0; i < n / BL_QK; i++, x += BL_QK, y++)
        y->d = quantize_q16_block(x, BL_QK, y->q);
}

/* Weight block i of a q8_0, q4_0 or mxfp4 row (the one of a8, a4, am given) as 32
 * integers in element order, and its scale. */
static float q16_0_weights(const bl_block_q8_0 *a8, const bl_block_q4_0 *a4, const bl_block_mxfp4 *am,
                           int64_t i, int w[BL_QK])
{
    if (a8) {
        for (int j = 0; j < BL_QK; j++)
            w[j] = a8[i].qs[j];
        return bl_fp16_to_fp32(a8[i].d);
    }
    const uint8_t *qs = a4 ? a4[i].qs : am[i].qs;
    for (int j = 0; j < BL_QK / 2; j++) {
        const int lo = qs[j] & 0xf, hi = qs[j] >> 4;
        w[j] = a4 ? lo - 8 : bl_e2m1_doubled[lo];
        w[j + BL_QK / 2] = a4 ? hi - 8 : bl_e2m1_doubled[hi];
    }
    return a4 ? bl_fp16_to_fp32(a4[i].d) : bl_e8m0_to_fp32_half(am[i].e);
}

static float dot_q16_0_ref(const bl_block_q8_0 *a8, const bl_block_q4_0 *a4, const bl_block_mxfp4 *am,
                           const kcpu_block_q16_0 *b, int64_t nb)
{
    double s = 0.0;
    for (int64_t i = 0; i < nb; i++) {
        int w[BL_QK];
        const float dw = q16_0_weights(a8, a4, am, i, w);
        int64_t isum = 0;
        for (int j = 0; j < BL_QK; j++)
            isum += (int64_t)w[j] * b[i].q[j];
        s += (double)dw * (double)b[i].d * (double)isum;
    }
    return (float)s;
}

float kcpu_vec_dot_q8_0_q16_0_ref(const void *w, const void *x, int64_t n)
{
    return dot_q16_0_ref(w, NULL, NULL, x, n / BL_QK);
}

float kcpu_vec_dot_q4_0_q16_0_ref(const void *w, const void *x, int64_t n)
{
    return dot_q16_0_ref(NULL, w, NULL, x, n / BL_QK);
}

float kcpu_vec_dot_mxfp4_q16_0_ref(const void *w, const void *x, int64_t n)
{
    return dot_q16_0_ref(NULL, NULL, w, x, n / BL_QK);
}

void kcpu_vec_dotn_q8_0_q16_0_ref(const void *w, const kcpu_block_q16_0 *const *x, int nx, int64_t n, float *out)
{
    for (int c = 0; c < nx; c++)
        out[c] = kcpu_vec_dot_q8_0_q16_0_ref(w, x[c], n);
}

void kcpu_vec_dotn_q4_0_q16_0_ref(const void *w, const kcpu_block_q16_0 *const *x, int nx, int64_t n, float *out)
{
    for (int c = 0; c < nx; c++)
        out[c] = kcpu_vec_dot_q4_0_q16_0_ref(w, x[c], n);
}

void kcpu_vec_dotn_mxfp4_q16_0_ref(const void *w, const kcpu_block_q16_0 *const *x, int nx, int64_t n,
                                   float *out)
{
    for (int c = 0; c < nx; c++)
        out[c] = kcpu_vec_dot_mxfp4_q16_0_ref(w, x[c], n);
}

static void unpack16_q45_K(const bl_block_q4_K *a4, const bl_block_q5_K *a5, kcpu_kunpacked16_t *u,
                           int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, u++) {
        const uint8_t *qs = a4 ? a4[i].qs : a5[i].qs;
        const uint8_t *scales = a4 ? a4[i].scales : a5[i].scales;
        const float dmin = bl_fp16_to_fp32(a4 ? a4[i].dmin : a5[i].dmin);
        for (int sb = 0; sb < 8; sb++) {
            int sc, m;
            kcpu__k_scale_min(scales, sb, &sc, &m);
            const uint8_t *q = qs + 32 * (sb / 2);
            const int shift = 4 * (sb & 1);
            for (int l = 0; l < 32; l++) {
                int v = (q[l] >> shift) & 0xf;
                if (a5)
                    v |= ((a5[i].qh[l] >> sb) & 1) << 4;
                u->w[32 * sb + l] = (int16_t)(sc * v);
            }
            u->mins[sb] = dmin * (float)m;
        }
        u->d = bl_fp16_to_fp32(a4 ? a4[i].d : a5[i].d);
        memset(u->_pad, 0, sizeof u->_pad);
    }
}

void kcpu_unpack16_q4_K(const void *w, kcpu_kunpacked16_t *u, int64_t n)
{
    unpack16_q45_K(w, NULL, u, n / BL_QK_K);
}

void kcpu_unpack16_q5_K(const void *w, kcpu_kunpacked16_t *u, int64_t n)
{
    unpack16_q45_K(NULL, w, u, n / BL_QK_K);
}

void kcpu_unpack16_q6_K(const void *w, kcpu_kunpacked16_t *u, int64_t n)
{
    const bl_block_q6_K *b = w;
    for (int64_t i = 0; i < n / BL_QK_K; i++, b++, u++) {
        for (int e = 0; e < BL_QK_K; e++) {
            const int h = e / 128, k = (e / 32) % 4, l = e % 32;
            const int lo = (b->ql[64 * h + 32 * (k & 1) + l] >> (4 * (k >> 1))) & 0xf;
            const int hi = (b->qh[32 * h + l] >> (2 * k)) & 3;
            u->w[e] = (int16_t)(b->scales[e / 16] * ((lo | hi << 4) - 32));
        }
        for (int sb = 0; sb < 8; sb++)
            u->mins[sb] = 0.0f;
        u->d = bl_fp16_to_fp32(b->d);
        memset(u->_pad, 0, sizeof u->_pad);
    }
}

void kcpu_exp_sub_ref(float *x, int64_t n, float m)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = expf(x[i] - m);
}

int64_t kcpu_row_top1_ref(const float *x, int64_t n, float *p)
{
    int64_t best = -1;
    for (int64_t i = 0; i < n; i++)
        if (!isnan(x[i]) && (best < 0 || x[i] > x[best]))
            best = i;
    if (best < 0) { /* empty, or every value NaN */
        if (p)
            *p = 0.0f;
        return n > 0 ? 0 : -1;
    }
    if (p) {
        const double m = x[best];
        double sum = 0.0;
        for (int64_t i = 0; isfinite(m) && i < n; i++)
            if (!isnan(x[i]))
                sum += exp((double)x[i] - m);
        *p = isfinite(m) ? (float)(1.0 / sum) : 0.0f;
    }
    return best;
}
