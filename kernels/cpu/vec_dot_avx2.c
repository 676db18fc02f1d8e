/* AVX2 (+FMA, F16C) variants of the dot products and axpy in vec_dot.c. Each is
 * compiled with a target attribute so the file builds whatever the baseline -march,
 * and is only called after kcpu_init has seen the CPU run it. Tails shorter than a
 * vector finish with the scalar loop. Integer kernels use the sign trick
 * (|w| times y carrying w's sign) so that _mm256_maddubs_epi16 can multiply: this
 * needs activations in -127..127, which our q8_0/q8_K quantizers guarantee. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "blocks.h"
#include "kcpu.h"
#include "kcpu_impl.h"
#include "quant.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,fma,f16c")))

AVX2 static inline float hsum_ps(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* One half to float with F16C, instead of the portable (slower) bl_fp16_to_fp32. */
AVX2 static inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

AVX2 static inline __m256i ones16(void) { return _mm256_set1_epi16(1); }

/* Sum of the signed byte products of 32 lanes, as 8 int32. */
AVX2 static inline __m256i dot_i8(__m256i w, __m256i y)
{
    const __m256i aw = _mm256_sign_epi8(w, w);
    const __m256i sy = _mm256_sign_epi8(y, w);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sy), ones16());
}

AVX2 float kcpu_vec_dot_f32_f32_avx2(const float *w, const float *x, int64_t n)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 16), _mm256_loadu_ps(x + i + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 24), _mm256_loadu_ps(x + i + 24), a3);
    }
    for (; i + 8 <= n; i += 8)
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
    float s = hsum_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; i++)
        s += w[i] * x[i];
    return s;
}

AVX2 float kcpu_vec_dot_f16_f32_avx2(const uint16_t *w, const float *x, int64_t n)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + i)));
        const __m256 w1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + i + 8)));
        a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + i + 8), a1);
    }
    for (; i + 8 <= n; i += 8) {
        const __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + i)));
        a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + i), a0);
    }
    float s = hsum_ps(_mm256_add_ps(a0, a1));
    for (; i < n; i++)
        s += h2f(w[i]) * x[i];
    return s;
}

AVX2 void kcpu_axpy_f32_avx2(float *y, float a, const float *x, int64_t n)
{
    const __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++)
        y[i] += a * x[i];
}

AVX2 void kcpu_axpy_f16_avx2(float *y, float a, const uint16_t *x, int64_t n)
{
    const __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 xv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i)));
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, xv, _mm256_loadu_ps(y + i)));
    }
    for (; i < n; i++)
        y[i] += a * h2f(x[i]);
}

/* q8_0 and mxfp4 (vec_dot_q8_family.h): vpmaddubsw pair sums, then vpmaddwd. */
#define Q8F_TARGET AVX2
#define Q8F_LANES(aw, qw, qy) _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(qy, qw)), ones16())
#include "vec_dot_q8_family.h"
Q8F_ENTRY_POINTS(avx2)

AVX2 float kcpu_vec_dot_q4_0_q8_0_avx2(const void *w, const void *x, int64_t n)
{
    const bl_block_q4_0 *a = w;
    const bl_block_q8_0 *b = x;
    const __m256i lo4 = _mm256_set1_epi8(0xf);
    const __m256i eight = _mm256_set1_epi8(8);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / BL_QK; i++) {
        /* Low nibbles are elements 0..15, high nibbles 16..31. */
        const __m128i raw = _mm_loadu_si128((const __m128i *)a[i].qs);
        __m256i qw = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
        qw = _mm256_sub_epi8(_mm256_and_si256(qw, lo4), eight);
        const __m256i qy = _mm256_loadu_si256((const __m256i *)b[i].qs);
        const __m256 d = _mm256_set1_ps(h2f(a[i].d) * h2f(b[i].d));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_i8(qw, qy)), acc);
    }
    return hsum_ps(acc);
}

/* The 8 sub-block scales and mins of a q4_K/q5_K block without per-element
 * branches: read the 12 bytes as 3 words w0..w2 (the layout of kcpu__k_scale_min),
 * sc[0..3] = w0 & 63, sc[4..7] = low nibbles of w2 with the top 2 bits of w0 above,
 * m[0..3] = w1 & 63, m[4..7] = high nibbles of w2 with the top 2 bits of w1. Gives
 * sc16 = the 8 scales as int16 in both 128-bit halves (for in-lane broadcasts) and
 * mv = (m0, m0, m1, m1, ..., m7, m7), each min once per 16-element bsums group. */
AVX2 static inline void k_scales(const uint8_t *q, __m256i *sc16, __m256i *mv)
{
    uint32_t w0, w1, w2;
    memcpy(&w0, q, 4);
    memcpy(&w1, q + 4, 4);
    memcpy(&w2, q + 8, 4);
    const uint32_t s_lo = w0 & 0x3f3f3f3fu;
    const uint32_t s_hi = (w2 & 0x0f0f0f0fu) | (((w0 >> 6) & 0x03030303u) << 4);
    const uint32_t m_lo = w1 & 0x3f3f3f3fu;
    const uint32_t m_hi = ((w2 >> 4) & 0x0f0f0f0fu) | (((w1 >> 6) & 0x03030303u) << 4);
    const __m128i sc8 = _mm_cvtsi64_si128((long long)((uint64_t)s_hi << 32 | s_lo));
    const __m128i m8 = _mm_cvtsi64_si128((long long)((uint64_t)m_hi << 32 | m_lo));
    *sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sc8));
    *mv = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
}

/* q4_K/q5_K share this: the unsigned 4/5-bit values times y with maddubs (at most
 * 31*127*2 per pair, no saturation), weighted by the sub-block scale with madd; nx
 * (1 or 2) activation rows share the unpacking of each weight block. The mins term
 * (dmin * min * sum(y) per sub-block pair) is subtracted from the same vector
 * accumulator, block by block, in the order dotu_q45_K repeats exactly. */
AVX2 static inline float dot_q45_K(const bl_block_q4_K *a4, const bl_block_q5_K *a5,
                                   const bl_block_q8_K *const *bx, int nx, int64_t nb)
{
    const __m256i lo4 = _mm256_set1_epi8(0xf);
    const __m256i one = _mm256_set1_epi8(1);
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *scales = a4 ? a4[i].scales : a5[i].scales;
        const uint8_t *qs = a4 ? a4[i].qs : a5[i].qs;
        const float dw = h2f(a4 ? a4[i].d : a5[i].d);
        const float dmin = h2f(a4 ? a4[i].dmin : a5[i].dmin);
        __m256i sc16, mv;
        k_scales(scales, &sc16, &mv);
        const __m256i hbits = a5 ? _mm256_loadu_si256((const __m256i *)a5[i].qh)
                                 : _mm256_setzero_si256();
        __m256i sumi[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
        for (int j = 0; j < 4; j++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
            __m256i ql = _mm256_and_si256(q, lo4);
            __m256i qh = _mm256_and_si256(_mm256_srli_epi16(q, 4), lo4);
            if (a5) {
                /* Fifth bit of sub-block s is bit s of qh[l]; s = 2j (low) and 2j+1. */
                const __m256i b0 = _mm256_and_si256(_mm256_srl_epi16(hbits, _mm_cvtsi32_si128(2 * j)), one);
                const __m256i b1 = _mm256_and_si256(_mm256_srl_epi16(hbits, _mm_cvtsi32_si128(2 * j + 1)), one);
                ql = _mm256_or_si256(ql, _mm256_slli_epi16(b0, 4));
                qh = _mm256_or_si256(qh, _mm256_slli_epi16(b1, 4));
            }
            const __m256i s0 = _mm256_shuffle_epi8(sc16, _mm256_set1_epi16((int16_t)(0x0100 + 0x0202 * 2 * j)));
            const __m256i s1 = _mm256_shuffle_epi8(sc16, _mm256_set1_epi16((int16_t)(0x0100 + 0x0202 * (2 * j + 1))));
            for (int t = 0; t < nx; t++) {
                const __m256i y0 = _mm256_loadu_si256((const __m256i *)(bx[t][i].qs + 64 * j));
                const __m256i y1 = _mm256_loadu_si256((const __m256i *)(bx[t][i].qs + 64 * j + 32));
                const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(ql, y0), s0);
                const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(qh, y1), s1);
                sumi[t] = _mm256_add_epi32(sumi[t], _mm256_add_epi32(p0, p1));
            }
        }
        for (int t = 0; t < nx; t++) {
            const __m256i msum = _mm256_madd_epi16(mv, _mm256_loadu_si256((const __m256i *)bx[t][i].bsums));
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * bx[t][i].d), _mm256_cvtepi32_ps(sumi[t]),
                                     acc[t]);
            acc[t] = _mm256_fnmadd_ps(_mm256_set1_ps(dmin * bx[t][i].d), _mm256_cvtepi32_ps(msum),
                                      acc[t]);
        }
    }
    return nx == 1 ? hsum_ps(acc[0]) : hsum_ps(acc[0]) + hsum_ps(acc[1]);
}

AVX2 float kcpu_vec_dot_q4_K_q8_K_avx2(const void *w, const void *x, int64_t n)
{
    const bl_block_q8_K *bx[1] = {x};
    return dot_q45_K(w, NULL, bx, 1, n / BL_QK_K);
}

AVX2 float kcpu_vec_dot_q5_K_q8_K_avx2(const void *w, const void *x, int64_t n)
{
    const bl_block_q8_K *bx[1] = {x};
    return dot_q45_K(NULL, w, bx, 1, n / BL_QK_K);
}

AVX2 float kcpu_vec_dot2_q4_K_q8_K_avx2(const void *w, const void *x0, const void *x1, int64_t n)
{
    const bl_block_q8_K *bx[2] = {x0, x1};
    return dot_q45_K(w, NULL, bx, 2, n / BL_QK_K);
}

AVX2 float kcpu_vec_dot2_q5_K_q8_K_avx2(const void *w, const void *x0, const void *x1, int64_t n)
{
    const bl_block_q8_K *bx[2] = {x0, x1};
    return dot_q45_K(NULL, w, bx, 2, n / BL_QK_K);
}

/* q6_K: the unsigned 6-bit q (0..63) times y with maddubs (at most 63*127*2 per
 * pair), and the -32 offset applied once per block through the bsums. A block's
 * integer sum stays below 2^31: 256 * 63 * 128 * 128. nx (1 or 2) activation rows
 * share the unpacking. */
AVX2 static inline float dot_q6_K(const bl_block_q6_K *a, const bl_block_q8_K *const *bx, int nx,
                                  int64_t nb)
{
    const __m256i lo4 = _mm256_set1_epi8(0xf);
    const __m256i three = _mm256_set1_epi8(3);
    const __m256i m0c = _mm256_set1_epi8(0x0c);
    const __m256i m30 = _mm256_set1_epi8(0x30);
    const __m256i mc0 = _mm256_set1_epi8((char)0xc0);
    /* scmask[k]: int16 lane 2k in the low half, lane 2k + 1 in the high half. */
    __m256i scmask[4];
    for (int k = 0; k < 4; k++)
        scmask[k] = _mm256_set_m128i(_mm_set1_epi16((int16_t)(0x0100 + 0x0202 * (2 * k + 1))),
                                     _mm_set1_epi16((int16_t)(0x0100 + 0x0202 * 2 * k)));
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t i = 0; i < nb; i++) {
        const float dw = h2f(a[i].d);
        /* 32 * sum(sc_g * bsum_g), subtracted in integers before the float scale. */
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)a[i].scales));
        /* Scales 0..7 and 8..15 in both halves, so an in-lane byte shuffle can spread
         * group g over the low 8 lanes and g + 1 over the high 8. */
        const __m256i sc_lo = _mm256_permute2x128_si256(sc16, sc16, 0x00);
        const __m256i sc_hi = _mm256_permute2x128_si256(sc16, sc16, 0x11);
        __m256i sumi[2];
        for (int t = 0; t < nx; t++) {
            const __m256i off = _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)bx[t][i].bsums));
            sumi[t] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(off, 5));
        }
        for (int h = 0; h < 2; h++) {
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)(a[i].ql + 64 * h));
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(a[i].ql + 64 * h + 32));
            const __m256i hb = _mm256_loadu_si256((const __m256i *)(a[i].qh + 32 * h));
            /* The two high bits of each 32-element chunk go to bits 4-5: masked in
             * place first, so each takes at most one shift (bits masked off cannot
             * cross into the neighbouring byte of a 16-bit shift). */
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(l0, lo4),
                                   _mm256_slli_epi16(_mm256_and_si256(hb, three), 4));
            q[1] = _mm256_or_si256(_mm256_and_si256(l1, lo4),
                                   _mm256_slli_epi16(_mm256_and_si256(hb, m0c), 2));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), lo4),
                                   _mm256_and_si256(hb, m30));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), lo4),
                                   _mm256_srli_epi16(_mm256_and_si256(hb, mc0), 2));
            for (int k = 0; k < 4; k++) {
                /* Elements 128h + 32k .. +31: groups 8h + 2k (low 16) and +1 (high 16). */
                const __m256i scv = _mm256_shuffle_epi8(h ? sc_hi : sc_lo, scmask[k]);
                for (int t = 0; t < nx; t++) {
                    const __m256i y = _mm256_loadu_si256((const __m256i *)(bx[t][i].qs + 128 * h + 32 * k));
                    sumi[t] = _mm256_add_epi32(sumi[t],
                                               _mm256_madd_epi16(_mm256_maddubs_epi16(q[k], y), scv));
                }
            }
        }
        for (int t = 0; t < nx; t++)
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * bx[t][i].d), _mm256_cvtepi32_ps(sumi[t]),
                                     acc[t]);
    }
    return nx == 1 ? hsum_ps(acc[0]) : hsum_ps(acc[0]) + hsum_ps(acc[1]);
}

AVX2 float kcpu_vec_dot_q6_K_q8_K_avx2(const void *w, const void *x, int64_t n)
{
    const bl_block_q8_K *bx[1] = {x};
    return dot_q6_K(w, bx, 1, n / BL_QK_K);
}

AVX2 float kcpu_vec_dot2_q6_K_q8_K_avx2(const void *w, const void *x0, const void *x1, int64_t n)
{
    const bl_block_q8_K *bx[2] = {x0, x1};
    return dot_q6_K(w, bx, 2, n / BL_QK_K);
}

/* The unpacked twins of dot_q45_K and dot_q6_K: the integer sums are the same
 * (exact, whatever their order) and the float steps are the same operations in the
 * same order, so the result has the same bits as the packed kernel's. The unpacked
 * row saves the nibble and scale decoding, which a batch pays once per tile. */
AVX2 static inline float dotu_q45_K(const kcpu_kunpacked_t *u, const bl_block_q8_K *const *bx,
                                    int nx, int64_t nb)
{
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t i = 0; i < nb; i++, u++) {
        __m256i sumi[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
        for (int c = 0; c < 8; c++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(u->q + 32 * c));
            const __m256i s = _mm256_loadu_si256((const __m256i *)u->scv[c]);
            for (int t = 0; t < nx; t++) {
                const __m256i y = _mm256_loadu_si256((const __m256i *)(bx[t][i].qs + 32 * c));
                sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(_mm256_maddubs_epi16(q, y), s));
            }
        }
        const __m256i mv = _mm256_loadu_si256((const __m256i *)u->corr);
        for (int t = 0; t < nx; t++) {
            const __m256i msum = _mm256_madd_epi16(mv, _mm256_loadu_si256((const __m256i *)bx[t][i].bsums));
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(u->d * bx[t][i].d), _mm256_cvtepi32_ps(sumi[t]),
                                     acc[t]);
            acc[t] = _mm256_fnmadd_ps(_mm256_set1_ps(u->dmin * bx[t][i].d), _mm256_cvtepi32_ps(msum),
                                      acc[t]);
        }
    }
    return nx == 1 ? hsum_ps(acc[0]) : hsum_ps(acc[0]) + hsum_ps(acc[1]);
}

AVX2 static inline float dotu_q6_K(const kcpu_kunpacked_t *u, const bl_block_q8_K *const *bx,
                                   int nx, int64_t nb)
{
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t i = 0; i < nb; i++, u++) {
        const __m256i sc16 = _mm256_loadu_si256((const __m256i *)u->corr);
        __m256i sumi[2];
        for (int t = 0; t < nx; t++) {
            const __m256i off = _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)bx[t][i].bsums));
            sumi[t] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(off, 5));
        }
        for (int c = 0; c < 8; c++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(u->q + 32 * c));
            const __m256i s = _mm256_loadu_si256((const __m256i *)u->scv[c]);
            for (int t = 0; t < nx; t++) {
                const __m256i y = _mm256_loadu_si256((const __m256i *)(bx[t][i].qs + 32 * c));
                sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(_mm256_maddubs_epi16(q, y), s));
            }
        }
        for (int t = 0; t < nx; t++)
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(u->d * bx[t][i].d), _mm256_cvtepi32_ps(sumi[t]),
                                     acc[t]);
    }
    return nx == 1 ? hsum_ps(acc[0]) : hsum_ps(acc[0]) + hsum_ps(acc[1]);
}

/* The unpackers of vec_dot.c with the nibble and bit shuffling in vectors: a batch
 * of few rows (an expert's share of a prompt) pays the unpacking almost per row. */
AVX2 static inline void unpack_q45_K_avx2(const bl_block_q4_K *a4, const bl_block_q5_K *a5,
                                          kcpu_kunpacked_t *u, int64_t nb)
{
    const __m256i lo4 = _mm256_set1_epi8(0xf);
    const __m256i one = _mm256_set1_epi8(1);
    for (int64_t i = 0; i < nb; i++, u++) {
        const uint8_t *qs = a4 ? a4[i].qs : a5[i].qs;
        const uint8_t *scales = a4 ? a4[i].scales : a5[i].scales;
        const __m256i hbits = a5 ? _mm256_loadu_si256((const __m256i *)a5[i].qh)
                                 : _mm256_setzero_si256();
        for (int j = 0; j < 4; j++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
            __m256i ql = _mm256_and_si256(q, lo4);
            __m256i qh = _mm256_and_si256(_mm256_srli_epi16(q, 4), lo4);
            if (a5) {
                const __m256i b0 = _mm256_and_si256(_mm256_srl_epi16(hbits, _mm_cvtsi32_si128(2 * j)), one);
                const __m256i b1 = _mm256_and_si256(_mm256_srl_epi16(hbits, _mm_cvtsi32_si128(2 * j + 1)), one);
                ql = _mm256_or_si256(ql, _mm256_slli_epi16(b0, 4));
                qh = _mm256_or_si256(qh, _mm256_slli_epi16(b1, 4));
            }
            _mm256_storeu_si256((__m256i *)(u->q + 64 * j), ql);
            _mm256_storeu_si256((__m256i *)(u->q + 64 * j + 32), qh);
        }
        for (int c = 0; c < 8; c++) {
            int sc, m;
            kcpu__k_scale_min(scales, c, &sc, &m);
            _mm256_storeu_si256((__m256i *)u->scv[c], _mm256_set1_epi16((int16_t)sc));
            u->corr[2 * c] = u->corr[2 * c + 1] = (int16_t)m;
        }
        u->d = h2f(a4 ? a4[i].d : a5[i].d);
        u->dmin = h2f(a4 ? a4[i].dmin : a5[i].dmin);
    }
}

AVX2 void kcpu_unpack_q4_K_avx2(const void *w, kcpu_kunpacked_t *u, int64_t n)
{
    unpack_q45_K_avx2(w, NULL, u, n / BL_QK_K);
}

AVX2 void kcpu_unpack_q5_K_avx2(const void *w, kcpu_kunpacked_t *u, int64_t n)
{
    unpack_q45_K_avx2(NULL, w, u, n / BL_QK_K);
}

AVX2 void kcpu_unpack_q6_K_avx2(const void *w, kcpu_kunpacked_t *u, int64_t n)
{
    const bl_block_q6_K *a = w;
    const __m256i lo4 = _mm256_set1_epi8(0xf);
    const __m256i three = _mm256_set1_epi8(3);
    for (int64_t i = 0; i < n / BL_QK_K; i++, u++) {
        for (int h = 0; h < 2; h++) {
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)(a[i].ql + 64 * h));
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(a[i].ql + 64 * h + 32));
            const __m256i hb = _mm256_loadu_si256((const __m256i *)(a[i].qh + 32 * h));
            uint8_t *q = u->q + 128 * h;
            _mm256_storeu_si256((__m256i *)q,
                                _mm256_or_si256(_mm256_and_si256(l0, lo4),
                                                _mm256_slli_epi16(_mm256_and_si256(hb, three), 4)));
            _mm256_storeu_si256((__m256i *)(q + 32),
                                _mm256_or_si256(_mm256_and_si256(l1, lo4),
                                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), three), 4)));
            _mm256_storeu_si256((__m256i *)(q + 64),
                                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), lo4),
                                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), three), 4)));
            _mm256_storeu_si256((__m256i *)(q + 96),
                                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), lo4),
                                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), three), 4)));
        }
        for (int c = 0; c < 8; c++)
            _mm256_storeu_si256((__m256i *)u->scv[c],
                                _mm256_set_m128i(_mm_set1_epi16(a[i].scales[2 * c + 1]),
                                                 _mm_set1_epi16(a[i].scales[2 * c])));
        _mm256_storeu_si256((__m256i *)u->corr,
                            _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)a[i].scales)));
        u->d = h2f(a[i].d);
        u->dmin = 0.0f;
    }
}

/* dotu_q45_K / dotu_q6_K for two activation rows at once (vec_dot_dotu2.h): each
 * 32-element chunk one vpmaddubsw/vpmaddwd pair a stream. */
AVX2 static inline void dotu2_sums(const kcpu_kunpacked_t *u, const bl_block_q8_K *const *bx, int nx,
                                   int64_t i, __m256i sumi[4])
{
    for (int st = 0; st < 4; st++)
        sumi[st] = _mm256_setzero_si256();
    for (int c = 0; c < 8; c++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(u->q + 32 * c));
        const __m256i s = _mm256_loadu_si256((const __m256i *)u->scv[c]);
        for (int r = 0; r < 2; r++)
            for (int t = 0; t < nx; t++) {
                const int st = 2 * r + t;
                const __m256i y = _mm256_loadu_si256((const __m256i *)(bx[st][i].qs + 32 * c));
                sumi[st] = _mm256_add_epi32(sumi[st], _mm256_madd_epi16(_mm256_maddubs_epi16(q, y), s));
            }
    }
}

#define DOTU2_TARGET AVX2
#include "vec_dot_dotu2.h"
DOTU2_ENTRY_POINTS(avx2)

AVX2 float kcpu_vec_dotu_q4_K_q8_K_avx2(const kcpu_kunpacked_t *u, const void *x0, const void *x1,
                                        int64_t n)
{
    const bl_block_q8_K *bx[2] = {x0, x1};
    return x1 ? dotu_q45_K(u, bx, 2, n / BL_QK_K) : dotu_q45_K(u, bx, 1, n / BL_QK_K);
}

AVX2 float kcpu_vec_dotu_q5_K_q8_K_avx2(const kcpu_kunpacked_t *u, const void *x0, const void *x1,
                                        int64_t n)
{
    return kcpu_vec_dotu_q4_K_q8_K_avx2(u, x0, x1, n);
}

AVX2 float kcpu_vec_dotu_q6_K_q8_K_avx2(const kcpu_kunpacked_t *u, const void *x0, const void *x1,
                                        int64_t n)
{
    const bl_block_q8_K *bx[2] = {x0, x1};
    return x1 ? dotu_q6_K(u, bx, 2, n / BL_QK_K) : dotu_q6_K(u, bx, 1, n / BL_QK_K);
}

// --- attention over an f16 cache, a KV head's query heads together ------------------------

/* NG query heads against each K row: the row is converted once, and each head's
 * 8-lane sum is reduced at the end of the row. */
AVX2 static inline __attribute__((always_inline)) void att_qk(const float *q, const uint16_t *k,
                                                              int64_t k_stride, int64_t len,
                                                              int64_t hd, float scale, float *sc,
                                                              int64_t ld, const int NG)
{
    for (int64_t s = 0; s < len; s++) {
        const uint16_t *kr = k + s * k_stride;
        __m256 acc[8];
        for (int g = 0; g < NG; g++)
            acc[g] = _mm256_setzero_ps();
        for (int64_t d = 0; d < hd; d += 8) {
            const __m256 kv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kr + d)));
            for (int g = 0; g < NG; g++)
                acc[g] = _mm256_fmadd_ps(kv, _mm256_loadu_ps(q + g * hd + d), acc[g]);
        }
        for (int g = 0; g < NG; g++)
            sc[g * ld + s] = hsum_ps(acc[g]) * scale;
    }
}

AVX2 void kcpu_att_qk_f16_avx2(const float *q, int ng, const uint16_t *k, int64_t k_stride, int64_t len,
                               int64_t hd, float scale, float *sc, int64_t ld)
{
    switch (ng) {
    case 8: att_qk(q, k, k_stride, len, hd, scale, sc, ld, 8); break;
    case 4: att_qk(q, k, k_stride, len, hd, scale, sc, ld, 4); break;
    default:
        for (int g = 0; g < ng; g++)
            att_qk(q + g * hd, k, k_stride, len, hd, scale, sc + g * ld, ld, 1);
    }
}

/* NG heads' outputs, 8 columns at a time, accumulated in registers over every row
 * (the V row chunk converted once for all heads). */
AVX2 static inline __attribute__((always_inline)) void att_pv(const float *p, int64_t ld,
                                                              const uint16_t *v, int64_t v_stride,
                                                              int64_t len, int64_t hd, float *out,
                                                              const int NG)
{
    for (int64_t d = 0; d < hd; d += 8) {
        __m256 acc[8];
        for (int g = 0; g < NG; g++)
            acc[g] = _mm256_setzero_ps();
        for (int64_t s = 0; s < len; s++) {
            const __m256 vv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(v + s * v_stride + d)));
            for (int g = 0; g < NG; g++)
                acc[g] = _mm256_fmadd_ps(_mm256_broadcast_ss(p + g * ld + s), vv, acc[g]);
        }
        for (int g = 0; g < NG; g++)
            _mm256_storeu_ps(out + g * hd + d, acc[g]);
    }
}

AVX2 void kcpu_att_pv_f16_avx2(const float *p, int ng, int64_t ld, const uint16_t *v, int64_t v_stride,
                               int64_t len, int64_t hd, float *out)
{
    switch (ng) {
    case 8: att_pv(p, ld, v, v_stride, len, hd, out, 8); break;
    case 4: att_pv(p, ld, v, v_stride, len, hd, out, 4); break;
    default:
        for (int g = 0; g < ng; g++)
            att_pv(p + g * ld, ld, v, v_stride, len, hd, out + g * hd, 1);
    }
}

/* exp(v) for v <= 0: v = n ln 2 + r with n = round(v / ln 2) and |r| <= ln 2 / 2 (ln 2
 * split in two constants so that n ln 2 is exact enough), e^r = 1 + r + r^2 p(r)
 * with p the degree-5 minimax polynomial of (e^r - 1 - r) / r^2, and 2^n put into
 * the exponent bits. v below -87.3 (and -inf) gives 0: a softmax numerator that
 * small is lost beside the maximum's 1 in any case. */
AVX2 static inline __m256 exp_neg(__m256 v)
{
    const __m256 lo = _mm256_set1_ps(-87.3f);
    const __m256 under = _mm256_cmp_ps(v, lo, _CMP_LT_OQ);
    v = _mm256_max_ps(v, lo);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(v, _mm256_set1_ps(1.44269504089f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), v);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    const __m256 e = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    const __m256i pow2 = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(under, _mm256_mul_ps(e, _mm256_castsi256_ps(pow2)));
}

AVX2 void kcpu_exp_sub_avx2(float *x, int64_t n, float m)
{
    const __m256 vm = _mm256_set1_ps(m);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, exp_neg(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm)));
    if (i < n) { /* the tail through a padded vector, the same arithmetic */
        float t[8] = {0};
        for (int64_t j = i; j < n; j++)
            t[j - i] = x[j] - m;
        _mm256_storeu_ps(t, exp_neg(_mm256_loadu_ps(t)));
        for (int64_t j = i; j < n; j++)
            x[j] = t[j - i];
    }
}

/* One pass keeps each lane's largest value and its first index (a strict > never
 * takes a NaN or a later equal value); the lanes' best, the smallest index among
 * equal ones, then the tail. A second pass sums the exponentials, eight values a
 * lane between flushes into double. Rows with no finite maximum, or too short or
 * long for 32-bit lane indices, take the reference. */
AVX2 int64_t kcpu_row_top1_avx2(const float *x, int64_t n, float *p)
{
    if (n < 8 || n > INT32_MAX)
        return kcpu_row_top1_ref(x, n, p);
    const int64_t n8 = n & ~(int64_t)7;
    __m256 bv = _mm256_set1_ps(-INFINITY);
    __m256i bi = _mm256_setzero_si256(), at = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i step = _mm256_set1_epi32(8);
    for (int64_t i = 0; i < n8; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m256 gt = _mm256_cmp_ps(v, bv, _CMP_GT_OQ);
        bv = _mm256_blendv_ps(bv, v, gt);
        bi = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(bi), _mm256_castsi256_ps(at), gt));
        at = _mm256_add_epi32(at, step);
    }
    float lv[8];
    int32_t li[8];
    _mm256_storeu_ps(lv, bv);
    _mm256_storeu_si256((__m256i *)li, bi);
    float m = lv[0];
    int64_t best = li[0];
    for (int l = 1; l < 8; l++)
        if (lv[l] > m || (lv[l] == m && li[l] < best)) {
            m = lv[l];
            best = li[l];
        }
    for (int64_t i = n8; i < n; i++)
        if (x[i] > m) {
            m = x[i];
            best = i;
        }
    if (!isfinite(m))
        return kcpu_row_top1_ref(x, n, p);
    if (!p)
        return best;
    /* x - m <= 0 for every value but NaN, whose exp_neg is about 1e-38: nothing */
    const __m256 vm = _mm256_set1_ps(m);
    double sum = 0.0;
    for (int64_t i = 0; i < n8;) {
        __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
        const int64_t end = i + 2048 < n8 ? i + 2048 : n8;
        for (; i + 16 <= end; i += 16) {
            s0 = _mm256_add_ps(s0, exp_neg(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm)));
            s1 = _mm256_add_ps(s1, exp_neg(_mm256_sub_ps(_mm256_loadu_ps(x + i + 8), vm)));
        }
        for (; i < end; i += 8)
            s0 = _mm256_add_ps(s0, exp_neg(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm)));
        float t[8];
        _mm256_storeu_ps(t, _mm256_add_ps(s0, s1));
        for (int l = 0; l < 8; l++)
            sum += t[l];
    }
    for (int64_t i = n8; i < n; i++)
        if (!isnan(x[i]))
            sum += exp((double)x[i] - (double)m);
    *p = (float)(1.0 / sum);
    return best;
}

#else /* not x86-64: the names exist so the table compiles; kcpu_init never picks them */

float kcpu_vec_dot_f32_f32_avx2(const float *w, const float *x, int64_t n) { return kcpu_vec_dot_f32_f32_ref(w, x, n); }
float kcpu_vec_dot_f16_f32_avx2(const uint16_t *w, const float *x, int64_t n) { return kcpu_vec_dot_f16_f32_ref(w, x, n); }
float kcpu_vec_dot_q8_0_q8_0_avx2(const void *w, const void *x, int64_t n) { return kcpu_vec_dot_q8_0_q8_0_ref(w, x, n); }
float kcpu_vec_dot_q4_0_q8_0_avx2(const void *w, const void *x, int64_t n) { return kcpu_vec_dot_q4_0_q8_0_ref(w, x, n); }
float kcpu_vec_dot_q4_K_q8_K_avx2(const void *w, const void *x, int64_t n) { return kcpu_vec_dot_q4_K_q8_K_ref(w, x, n); }
float kcpu_vec_dot_q5_K_q8_K_avx2(const void *w, const void *x, int64_t n) { return kcpu_vec_dot_q5_K_q8_K_ref(w, x, n); }
float kcpu_vec_dot_q6_K_q8_K_avx2(const void *w, const void *x, int64_t n) { return kcpu_vec_dot_q6_K_q8_K_ref(w, x, n); }
float kcpu_vec_dot_mxfp4_q8_0_avx2(const void *w, const void *x, int64_t n) { return kcpu_vec_dot_mxfp4_q8_0_ref(w, x, n); }
void kcpu_vec_dotp_q8_0_q8_0_avx2(const void *w, const void *xa, const void *xb, int64_t n, float out[2]) { kcpu_vec_dotp_q8_0_q8_0_ref(w, xa, xb, n, out); }
void kcpu_vec_dotp_mxfp4_q8_0_avx2(const void *w, const void *xa, const void *xb, int64_t n, float out[2]) { kcpu_vec_dotp_mxfp4_q8_0_ref(w, xa, xb, n, out); }
float kcpu_vec_dot2_q4_K_q8_K_avx2(const void *w, const void *x0, const void *x1, int64_t n) { return kcpu_vec_dot2_q4_K_q8_K_ref(w, x0, x1, n); }
float kcpu_vec_dot2_q5_K_q8_K_avx2(const void *w, const void *x0, const void *x1, int64_t n) { return kcpu_vec_dot2_q5_K_q8_K_ref(w, x0, x1, n); }
float kcpu_vec_dot2_q6_K_q8_K_avx2(const void *w, const void *x0, const void *x1, int64_t n) { return kcpu_vec_dot2_q6_K_q8_K_ref(w, x0, x1, n); }
void kcpu_unpack_q4_K_avx2(const void *w, kcpu_kunpacked_t *u, int64_t n) { kcpu_unpack_q4_K(w, u, n); }
void kcpu_unpack_q5_K_avx2(const void *w, kcpu_kunpacked_t *u, int64_t n) { kcpu_unpack_q5_K(w, u, n); }
void kcpu_unpack_q6_K_avx2(const void *w, kcpu_kunpacked_t *u, int64_t n) { kcpu_unpack_q6_K(w, u, n); }
void kcpu_vec_dotu2_q4_K_q8_K_avx2(const kcpu_kunpacked_t *u, const void *xa, const void *xb, size_t term_bytes, int terms, int64_t n, float out[2]) { (void)u; (void)xa; (void)xb; (void)term_bytes; (void)terms; (void)n; (void)out; abort(); }
void kcpu_vec_dotu2_q5_K_q8_K_avx2(const kcpu_kunpacked_t *u, const void *xa, const void *xb, size_t term_bytes, int terms, int64_t n, float out[2]) { (void)u; (void)xa; (void)xb; (void)term_bytes; (void)terms; (void)n; (void)out; abort(); }
void kcpu_vec_dotu2_q6_K_q8_K_avx2(const kcpu_kunpacked_t *u, const void *xa, const void *xb, size_t term_bytes, int terms, int64_t n, float out[2]) { (void)u; (void)xa; (void)xb; (void)term_bytes; (void)terms; (void)n; (void)out; abort(); }
/* No unpacked reference kernel exists; kcpu_init never selects these off x86-64. */
float kcpu_vec_dotu_q4_K_q8_K_avx2(const kcpu_kunpacked_t *u, const void *x0, const void *x1, int64_t n) { (void)u; (void)x0; (void)x1; (void)n; abort(); }
float kcpu_vec_dotu_q5_K_q8_K_avx2(const kcpu_kunpacked_t *u, const void *x0, const void *x1, int64_t n) { (void)u; (void)x0; (void)x1; (void)n; abort(); }
float kcpu_vec_dotu_q6_K_q8_K_avx2(const kcpu_kunpacked_t *u, const void *x0, const void *x1, int64_t n) { (void)u; (void)x0; (void)x1; (void)n; abort(); }
void kcpu_axpy_f32_avx2(float *y, float a, const float *x, int64_t n) { kcpu_axpy_f32_ref(y, a, x, n); }
void kcpu_att_qk_f16_avx2(const float *q, int ng, const uint16_t *k, int64_t k_stride, int64_t len, int64_t hd, float scale, float *sc, int64_t ld) { kcpu_att_qk_f16_ref(q, ng, k, k_stride, len, hd, scale, sc, ld); }
void kcpu_att_pv_f16_avx2(const float *p, int ng, int64_t ld, const uint16_t *v, int64_t v_stride, int64_t len, int64_t hd, float *out) { kcpu_att_pv_f16_ref(p, ng, ld, v, v_stride, len, hd, out); }
void kcpu_axpy_f16_avx2(float *y, float a, const uint16_t *x, int64_t n) { kcpu_axpy_f16_ref(y, a, x, n); }
void kcpu_exp_sub_avx2(float *x, int64_t n, float m) { kcpu_exp_sub_ref(x, n, m); }
int64_t kcpu_row_top1_avx2(const float *x, int64_t n, float *p) { return kcpu_row_top1_ref(x, n, p); }

#endif
