/* AVX2 kernels of the 16-bit activation format (kcpu_block_q16_K), the fast path's
 * partner of K-quant weights: the quantizer, the packed dots a decode step streams
 * the weights through, the unpackers of a batch's weight tiles and the tile kernel;
 * and those of its blocks of 32 (kcpu_block_q16_0) against q8_0, q4_0 and mxfp4
 * weights (kcpu.h says how their bits are kept).
 * Products are _mm256_madd_epi16 of int16 weights (already times their group
 * scale) and int16 activations, summed exactly in int32 lanes.
 *
 * A row's bits never depend on whether it was batched: the packed dots and the tile
 * kernel form the same eight int32 lane sums per block (lane l holds elements 2l and
 * 2l+1 of every 16), then take the same float steps in the same order:
 *   acc = fma(d_w * d_x, float(lane sums), acc)   (q6_K: once per half block)
 *   acc = acc - mins * bsum                        (q4_K, q5_K: the 8 sub-blocks)
 * and a fixed horizontal sum. Bounds: q4_K/q5_K weights times scale are at most
 * 1953 and a lane adds 32 products per block, under 2^31 with |q| <= 32767; q6_K's
 * reach 4096, so its lanes are converted every 128 elements (16 products). */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "blocks.h"
#include "kcpu.h"
#include "kcpu_impl.h"
#include "quant.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define INLINE inline __attribute__((always_inline))

AVX2 static INLINE float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

AVX2 static INLINE int32_t hsum8_epi32(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

// --- quantizer --------------------------------------------------------------------------

/* The quantizers take the reference's steps in vectors: the same amax (max is exact
 * in any order), the same x * id rounded to nearest even, the same integer sums. */

/* The largest |x| of n values (a multiple of 8), and 1 / its step (32767 / amax,
 * or 0) into *id. */
AVX2 static INLINE float q16_amax(const float *x, int n, float *id)
{
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 mx = _mm256_setzero_ps();
    for (int j = 0; j < n; j += 8)
        mx = _mm256_max_ps(mx, _mm256_and_ps(_mm256_loadu_ps(x + j), absmask));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    *id = amax > 0.0f ? 32767.0f / amax : 0.0f;
    return amax;
}

/* 16 values of x times vid, clamped to +-32767 and rounded, as int16 in order. */
AVX2 static INLINE __m256i q16_round16(const float *x, __m256 vid)
{
    const __m256 hi = _mm256_set1_ps(32767.0f), lo = _mm256_set1_ps(-32767.0f);
    const __m256 v0 = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(_mm256_loadu_ps(x), vid), lo), hi);
    const __m256 v1 = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(_mm256_loadu_ps(x + 8), vid), lo), hi);
    return _mm256_permute4x64_epi64(_mm256_packs_epi32(_mm256_cvtps_epi32(v0), _mm256_cvtps_epi32(v1)), 0xd8);
}

AVX2 void kcpu_quantize_row_q16_K_avx2(const float *x, kcpu_block_q16_K *y, int64_t n)
{
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t i = 0; i < n / BL_QK_K; i++, x += BL_QK_K, y++) {
        float id;
        const float d = q16_amax(x, BL_QK_K, &id) / 32767.0f;
        const __m256 vid = _mm256_set1_ps(id);
        for (int sb = 0; sb < 8; sb++) {
            __m256i bs = _mm256_setzero_si256();
            for (int j = 32 * sb; j < 32 * sb + 32; j += 16) {
                const __m256i q = q16_round16(x + j, vid);
                _mm256_storeu_si256((__m256i *)(y->q + j), q);
                bs = _mm256_add_epi32(bs, _mm256_madd_epi16(q, ones));
            }
            y->bsum[sb] = d * (float)hsum8_epi32(bs);
        }
        y->d = d;
        memset(y->_pad, 0, sizeof y->_pad);
    }
}

// --- weight decoding shared by the packed dots and the unpackers ---------------------------

_Static_assert(offsetof(bl_block_q4_K, dmin) == offsetof(bl_block_q4_K, d) + 2, "q4_K dmin follows d");
_Static_assert(offsetof(bl_block_q5_K, dmin) == offsetof(bl_block_q5_K, d) + 2, "q5_K dmin follows d");

/* Sub-block sb (32 elements) of a q4_K/q5_K block as two int16 vectors of q * sc:
 * nib holds the 32 nibbles, hbit (q5_K) the fifth bits at bit 4, or zero. */
AVX2 static INLINE void q45_sub(__m256i nib, __m256i hbit, int sc, __m256i *w0, __m256i *w1)
{
    const __m256i q = _mm256_or_si256(nib, hbit);
    const __m256i s = _mm256_set1_epi16((int16_t)sc);
    *w0 = _mm256_mullo_epi16(_mm256_cvtepu8_epi16(_mm256_castsi256_si128(q)), s);
    *w1 = _mm256_mullo_epi16(_mm256_cvtepu8_epi16(_mm256_extracti128_si256(q, 1)), s);
}

/* The 32 elements of chunk k (0..3) of half h of a q6_K block as unsigned 0..63. */
AVX2 static INLINE __m256i q6_chunk(const bl_block_q6_K *a, int h, int k)
{
    const __m256i lo4 = _mm256_set1_epi8(0xf), three = _mm256_set1_epi8(3);
    const __m256i l = _mm256_loadu_si256((const __m256i *)(a->ql + 64 * h + 32 * (k & 1)));
    const __m256i hb = _mm256_loadu_si256((const __m256i *)(a->qh + 32 * h));
    const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(l, 4 * (k >> 1)), lo4);
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(hb, 2 * k), three);
    return _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
}

/* Chunk k of half h of a q6_K block as two int16 vectors of sc * (q - 32). */
AVX2 static INLINE void q6_sub(const bl_block_q6_K *a, int h, int k, __m256i *w0, __m256i *w1)
{
    const __m256i q = _mm256_sub_epi8(q6_chunk(a, h, k), _mm256_set1_epi8(32));
    const int g = 8 * h + 2 * k;
    *w0 = _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(q)),
                             _mm256_set1_epi16(a->scales[g]));
    *w1 = _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1)),
                             _mm256_set1_epi16(a->scales[g + 1]));
}

AVX2 static INLINE __m256i madd_at(__m256i w, const int16_t *x)
{
    return _mm256_madd_epi16(w, _mm256_loadu_si256((const __m256i *)x));
}

/* The dword *p in every dword lane (a scale stored as (sc, sc) words reaches every
 * word lane): a load, where _mm256_set1_epi32 from an array the compiler has just
 * written becomes register shuffles on the port the bit extraction needs. */
AVX2 static INLINE __m256i bcast_dword_mem(const int32_t *p)
{
    __m256i v;
    __asm__("vpbroadcastd %1, %0" : "=x"(v) : "m"(*p));
    return v;
}

/* Pins v to a register here and keeps later memory reads below this point. In the
 * packed dots GCC 12 otherwise hoists the next chunks' loads and products above the
 * running sums and spills them: one per chunk of 64 weights is what keeps the q4_K
 * dot free of spills (the values are the same; only the order of issue moves). */
AVX2 static INLINE void issue_after(__m256i *v)
{
    __asm__ volatile("" : "+x"(*v) : : "memory");
}

// --- packed dots (one activation row) -------------------------------------------------------

/* The packed q4_K/q5_K dot. Each sub-block's 32 products are summed unscaled
 * (two madds) and the sum multiplied by its scale in int32 (vpmulld): the same
 * integers as scaling every weight first (exact, and within the bound above), at
 * one multiply per 32 weights instead of two. */
AVX2 static INLINE float dot_q45_K(const bl_block_q4_K *a4, const bl_block_q5_K *a5,
                                   const kcpu_block_q16_K *b, int64_t nb)
{
    const __m256i lo4 = _mm256_set1_epi8(0xf), one = _mm256_set1_epi8(1);
    const __m256i lo4w = _mm256_set1_epi16(0xf);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *qs = a4 ? a4[i].qs : a5[i].qs;
        uint8_t sc[8], m[8];
        kcpu__k_scales8(a4 ? a4[i].scales : a5[i].scales, sc, m);
        const __m256i qh = a5 ? _mm256_loadu_si256((const __m256i *)a5[i].qh) : _mm256_setzero_si256();
        uint64_t sc8;
        memcpy(&sc8, sc, 8);
        /* The 8 scales as dwords, each broadcast from memory below. */
        int32_t scd[8];
        _mm256_storeu_si256((__m256i *)scd, _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc8)));
        __m256i isum = _mm256_setzero_si256();
        if (!a5)
            /* q4_K: the bytes widened to words straight from memory (one vpmovzxbw
             * with a load, no extract), then each word masked for its low nibble or
             * shifted for its high one: the same weights in the same lanes. */
            for (int j = 0; j < 4; j++) {
                const __m128i *p = (const __m128i *)(qs + 32 * j);
                const __m256i r0 = _mm256_cvtepu8_epi16(_mm_loadu_si128(p));
                const __m256i r1 = _mm256_cvtepu8_epi16(_mm_loadu_si128(p + 1));
                const int16_t *x = b[i].q + 64 * j;
                const __m256i s0 = _mm256_add_epi32(madd_at(_mm256_and_si256(r0, lo4w), x),
                                                    madd_at(_mm256_and_si256(r1, lo4w), x + 16));
                const __m256i s1 = _mm256_add_epi32(madd_at(_mm256_srli_epi16(r0, 4), x + 32),
                                                    madd_at(_mm256_srli_epi16(r1, 4), x + 48));
                isum = _mm256_add_epi32(isum, _mm256_mullo_epi32(s0, bcast_dword_mem(&scd[2 * j])));
                isum = _mm256_add_epi32(isum, _mm256_mullo_epi32(s1, bcast_dword_mem(&scd[2 * j + 1])));
                issue_after(&isum);
            }
        else
            for (int j = 0; j < 4; j++) {
                const __m256i raw = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
                __m256i n0 = _mm256_and_si256(raw, lo4);
                __m256i n1 = _mm256_and_si256(_mm256_srli_epi16(raw, 4), lo4);
                n0 = _mm256_or_si256(n0, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * j), one), 4));
                n1 = _mm256_or_si256(n1, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * j + 1), one), 4));
                const int16_t *x = b[i].q + 64 * j;
                const __m256i s0 = _mm256_add_epi32(madd_at(_mm256_cvtepu8_epi16(_mm256_castsi256_si128(n0)), x),
                                                    madd_at(_mm256_cvtepu8_epi16(_mm256_extracti128_si256(n0, 1)), x + 16));
                const __m256i s1 = _mm256_add_epi32(madd_at(_mm256_cvtepu8_epi16(_mm256_castsi256_si128(n1)), x + 32),
                                                    madd_at(_mm256_cvtepu8_epi16(_mm256_extracti128_si256(n1, 1)), x + 48));
                isum = _mm256_add_epi32(isum, _mm256_mullo_epi32(s0, bcast_dword_mem(&scd[2 * j])));
                isum = _mm256_add_epi32(isum, _mm256_mullo_epi32(s1, bcast_dword_mem(&scd[2 * j + 1])));
                issue_after(&isum);
            }
        /* d and dmin (adjacent halves) converted together: lanes 0 and 1. */
        uint32_t d2;
        memcpy(&d2, a4 ? &a4[i].d : &a5[i].d, 4);
        const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128((int)d2));
        acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(_mm_mul_ss(dm, _mm_load_ss(&b[i].d))),
                              _mm256_cvtepi32_ps(isum), acc);
        uint64_t m8;
        memcpy(&m8, m, 8);
        const __m256 mins = _mm256_mul_ps(
            _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)m8))),
            _mm256_broadcastss_ps(_mm_movehdup_ps(dm)));
        acc = _mm256_fnmadd_ps(mins, _mm256_loadu_ps(b[i].bsum), acc);
    }
    return hsum8(acc);
}

AVX2 float kcpu_vec_dot_q4_K_q16_K_avx2(const void *w, const void *x, int64_t n)
{
    return dot_q45_K(w, NULL, x, n / BL_QK_K);
}

AVX2 float kcpu_vec_dot_q5_K_q16_K_avx2(const void *w, const void *x, int64_t n)
{
    return dot_q45_K(NULL, w, x, n / BL_QK_K);
}

/* The packed q6_K dot, decoding as q6_sub does but with the loads shared per half;
 * the 16 group scales are widened once per block and stored as (sc, sc) dwords that
 * each product broadcasts from memory (a decode step streams the experts' ffn_down
 * and attn_v through here). */
AVX2 float kcpu_vec_dot_q6_K_q16_K_avx2(const void *w, const void *x, int64_t n)
{
    const bl_block_q6_K *a = w;
    const kcpu_block_q16_K *b = x;
    const __m256i lo4w = _mm256_set1_epi16(0xf), m30w = _mm256_set1_epi16(0x30), offw = _mm256_set1_epi16(32);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / BL_QK_K; i++) {
        const __m256 dd = _mm256_set1_ps(_cvtsh_ss(a[i].d) * b[i].d);
        /* Words of scales 0-3, 8-11 | 4-7, 12-15, so the unpacks give group order. */
        const __m256i sc16 = _mm256_permute4x64_epi64(
            _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)a[i].scales)), 0xd8);
        int32_t scd[16];
        _mm256_storeu_si256((__m256i *)scd, _mm256_unpacklo_epi16(sc16, sc16));
        _mm256_storeu_si256((__m256i *)(scd + 8), _mm256_unpackhi_epi16(sc16, sc16));
        for (int h = 0; h < 2; h++) {
            __m256i isum = _mm256_setzero_si256();
            for (int e = 0; e < 2; e++) {
                /* Elements 16e..16e+15 of each 32-element chunk, as words straight
                 * from memory (one vpmovzxbw with a load each). */
                const __m256i l0 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(a[i].ql + 64 * h + 16 * e)));
                const __m256i l1 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(a[i].ql + 64 * h + 32 + 16 * e)));
                const __m256i hb = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(a[i].qh + 32 * h + 16 * e)));
                const __m256i q[4] = {
                    _mm256_or_si256(_mm256_and_si256(l0, lo4w), _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30w)),
                    _mm256_or_si256(_mm256_and_si256(l1, lo4w), _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30w)),
                    _mm256_or_si256(_mm256_srli_epi16(l0, 4), _mm256_and_si256(hb, m30w)),
                    _mm256_or_si256(_mm256_srli_epi16(l1, 4), _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30w)),
                };
                for (int k = 0; k < 4; k++) {
                    const __m256i w0 = _mm256_mullo_epi16(_mm256_sub_epi16(q[k], offw),
                                                          bcast_dword_mem(&scd[8 * h + 2 * k + e]));
                    isum = _mm256_add_epi32(isum, madd_at(w0, b[i].q + 128 * h + 32 * k + 16 * e));
                }
                issue_after(&isum);
            }
            acc = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(isum), acc);
        }
    }
    return hsum8(acc);
}

// --- unpackers ------------------------------------------------------------------------------

AVX2 static INLINE void unpack16_q45_K(const bl_block_q4_K *a4, const bl_block_q5_K *a5,
                                       kcpu_kunpacked16_t *u, int64_t nb)
{
    const __m256i lo4 = _mm256_set1_epi8(0xf), one = _mm256_set1_epi8(1);
    for (int64_t i = 0; i < nb; i++, u++) {
        const uint8_t *qs = a4 ? a4[i].qs : a5[i].qs;
        uint8_t sc[8], m[8];
        kcpu__k_scales8(a4 ? a4[i].scales : a5[i].scales, sc, m);
        const __m256i qh = a5 ? _mm256_loadu_si256((const __m256i *)a5[i].qh) : _mm256_setzero_si256();
        for (int j = 0; j < 4; j++) {
            const __m256i raw = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
            const __m256i n0 = _mm256_and_si256(raw, lo4);
            const __m256i n1 = _mm256_and_si256(_mm256_srli_epi16(raw, 4), lo4);
            __m256i h0 = _mm256_setzero_si256(), h1 = _mm256_setzero_si256();
            if (a5) {
                h0 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * j), one), 4);
                h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * j + 1), one), 4);
            }
            __m256i w[4];
            q45_sub(n0, h0, sc[2 * j], &w[0], &w[1]);
            q45_sub(n1, h1, sc[2 * j + 1], &w[2], &w[3]);
            for (int t = 0; t < 4; t++)
                _mm256_storeu_si256((__m256i *)(u->w + 64 * j + 16 * t), w[t]);
        }
        const float dmin = _cvtsh_ss(a4 ? a4[i].dmin : a5[i].dmin);
        for (int sb = 0; sb < 8; sb++)
            u->mins[sb] = dmin * (float)m[sb];
        u->d = _cvtsh_ss(a4 ? a4[i].d : a5[i].d);
        memset(u->_pad, 0, sizeof u->_pad);
    }
}

AVX2 void kcpu_unpack16_q4_K_avx2(const void *w, kcpu_kunpacked16_t *u, int64_t n)
{
    unpack16_q45_K(w, NULL, u, n / BL_QK_K);
}

AVX2 void kcpu_unpack16_q5_K_avx2(const void *w, kcpu_kunpacked16_t *u, int64_t n)
{
    unpack16_q45_K(NULL, w, u, n / BL_QK_K);
}

AVX2 void kcpu_unpack16_q6_K_avx2(const void *w, kcpu_kunpacked16_t *u, int64_t n)
{
    const bl_block_q6_K *a = w;
    for (int64_t i = 0; i < n / BL_QK_K; i++, u++) {
        for (int h = 0; h < 2; h++)
            for (int k = 0; k < 4; k++) {
                __m256i w0, w1;
                q6_sub(&a[i], h, k, &w0, &w1);
                _mm256_storeu_si256((__m256i *)(u->w + 128 * h + 32 * k), w0);
                _mm256_storeu_si256((__m256i *)(u->w + 128 * h + 32 * k + 16), w1);
            }
        memset(u->mins, 0, sizeof u->mins);
        u->d = _cvtsh_ss(a[i].d);
        memset(u->_pad, 0, sizeof u->_pad);
    }
}

// --- the batched tile -------------------------------------------------------------------------

/* *acc += madd(a, b), written so that the sum lands in acc's own register: from
 * the intrinsics GCC 12 adds into a fresh register and copies it back, one extra
 * instruction per madd (the tile loop ran about 10% slower that way on the 2-core
 * EPYC, single thread, data in L1). */
AVX2 static INLINE void madd_acc(__m256i *acc, __m256i a, __m256i b)
{
    __m256i t;
    __asm__("vpmaddwd %2, %3, %1\n\tvpaddd %1, %0, %0" : "+x"(*acc), "=&x"(t) : "x"(a), "x"(b));
}

/* NR weight rows times NC activation rows, both compile-time constants: each 16
 * elements cost NR + NC loads and NR * NC madds. */
AVX2 static INLINE void gemm_tile(const kcpu_kunpacked16_t *const u[2], const int NR,
                                  const kcpu_block_q16_K *const x[4], const int NC, int64_t nb,
                                  const int q6, float out[8])
{
    __m256 acc[2][4];
    for (int r = 0; r < NR; r++)
        for (int c = 0; c < NC; c++)
            acc[r][c] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        __m256i is[2][4];
        for (int r = 0; r < NR; r++)
            for (int c = 0; c < NC; c++)
                is[r][c] = _mm256_setzero_si256();
        /* Not unrolled: unrolled, the compiler interleaves the chunks and spills
         * the accumulators. */
#pragma GCC unroll 1
        for (int h = 0; h < 2; h++) {
#pragma GCC unroll 1
            for (int k = 0; k < 8; k++) {
                const int o = 128 * h + 16 * k;
                __m256i w[2];
                for (int r = 0; r < NR; r++)
                    w[r] = _mm256_loadu_si256((const __m256i *)(u[r][i].w + o));
                for (int c = 0; c < NC; c++) {
                    const __m256i xv = _mm256_loadu_si256((const __m256i *)(x[c][i].q + o));
                    for (int r = 0; r < NR; r++)
                        madd_acc(&is[r][c], w[r], xv);
                }
            }
            if (q6 || h == 1)
                for (int r = 0; r < NR; r++)
                    for (int c = 0; c < NC; c++) {
                        acc[r][c] = _mm256_fmadd_ps(_mm256_set1_ps(u[r][i].d * x[c][i].d),
                                                    _mm256_cvtepi32_ps(is[r][c]), acc[r][c]);
                        is[r][c] = _mm256_setzero_si256();
                    }
        }
        if (!q6)
            for (int r = 0; r < NR; r++)
                for (int c = 0; c < NC; c++)
                    acc[r][c] = _mm256_fnmadd_ps(_mm256_loadu_ps(u[r][i].mins),
                                                 _mm256_loadu_ps(x[c][i].bsum), acc[r][c]);
    }
    for (int r = 0; r < NR; r++)
        for (int c = 0; c < NC; c++)
            out[4 * r + c] = hsum8(acc[r][c]);
}

#define GEMM_CASE(nr, nc)                                           \
    case 4 * (nr) + (nc):                                           \
        if (q6)                                                     \
            gemm_tile(u, nr, x, nc, nb, 1, out);                    \
        else                                                        \
            gemm_tile(u, nr, x, nc, nb, 0, out);                    \
        break;

AVX2 void kcpu_gemm_u16_q16_K_avx2(const kcpu_kunpacked16_t *const u[2], int nr,
                                   const kcpu_block_q16_K *const x[4], int nc, int64_t nb, int q6,
                                   float out[8])
{
    switch (4 * nr + nc) {
        GEMM_CASE(1, 1)
        GEMM_CASE(1, 2)
        GEMM_CASE(1, 3)
        GEMM_CASE(1, 4)
        GEMM_CASE(2, 1)
        GEMM_CASE(2, 2)
        GEMM_CASE(2, 3)
        GEMM_CASE(2, 4)
    default: KCPU_ASSERT(0 && "tile shape");
    }
}

// --- q16_0: blocks of 32 against q8_0, q4_0 and mxfp4 weights --------------------------------

/* As the q16_K quantizer, a block of 32 at a time. */
AVX2 void kcpu_quantize_row_q16_0_avx2(const float *x, kcpu_block_q16_0 *y, int64_t n)
{
    for (int64_t i = 0; i < n / BL_QK; i++, x += BL_QK, y++) {
        float id;
        y->d = q16_amax(x, BL_QK, &id) / 32767.0f;
        const __m256 vid = _mm256_set1_ps(id);
        _mm256_storeu_si256((__m256i *)y->q, q16_round16(x, vid));
        _mm256_storeu_si256((__m256i *)(y->q + 16), q16_round16(x + 16, vid));
    }
}

/* Weight block i of a q8_0, q4_0 or mxfp4 row (whichever of a8, a4, am is given)
 * as int16: elements 0..15 in *w0, 16..31 in *w1; its scale in every lane of *dw
 * (mxfp4's broadcast from the exponent table: a load, where the scalar conversion
 * and its broadcast from a register took the shuffle port twice a block). */
AVX2 static INLINE void q16_0_weights(const bl_block_q8_0 *a8, const bl_block_q4_0 *a4, const bl_block_mxfp4 *am,
                                      int64_t i, __m256i *w0, __m256i *w1, __m256 *dw)
{
    if (a8) {
        *w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)a8[i].qs));
        *w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(a8[i].qs + 16)));
        *dw = _mm256_set1_ps(_cvtsh_ss(a8[i].d));
        return;
    }
    const __m128i m4 = _mm_set1_epi8(0xf);
    const __m128i raw = _mm_loadu_si128((const __m128i *)(a4 ? a4[i].qs : am[i].qs));
    __m128i l = _mm_and_si128(raw, m4), h = _mm_and_si128(_mm_srli_epi16(raw, 4), m4);
    if (a4) {
        l = _mm_sub_epi8(l, _mm_set1_epi8(8));
        h = _mm_sub_epi8(h, _mm_set1_epi8(8));
        *dw = _mm256_set1_ps(_cvtsh_ss(a4[i].d));
    } else {
        const __m128i tab = _mm_loadu_si128((const __m128i *)bl_e2m1_doubled);
        l = _mm_shuffle_epi8(tab, l);
        h = _mm_shuffle_epi8(tab, h);
        *dw = _mm256_broadcast_ss(&bl_e8m0_half[am[i].e].f);
    }
    *w0 = _mm256_cvtepi8_epi16(l);
    *w1 = _mm256_cvtepi8_epi16(h);
}

/* Block i into accumulator acc[c][j] of each of the NX rows. */
#define Q16_0_BLOCK(NX, i, j)                                                                                    \
    do {                                                                                                         \
        __m256i w0, w1;                                                                                          \
        __m256 vdw;                                                                                              \
        q16_0_weights(a8, a4, am, (i), &w0, &w1, &vdw);                                                          \
        for (int c = 0; c < (NX); c++) {                                                                         \
            const kcpu_block_q16_0 *b = x[c] + (i);                                                              \
            const __m256i p = _mm256_add_epi32(_mm256_madd_epi16(w0, _mm256_loadu_si256((const __m256i *)b->q)), \
                                               _mm256_madd_epi16(w1, _mm256_loadu_si256((const __m256i *)(b->q + 16)))); \
            acc[c][j] = _mm256_fmadd_ps(_mm256_mul_ps(vdw, _mm256_broadcast_ss(&b->d)), _mm256_cvtepi32_ps(p),  \
                                        acc[c][j]);                                                              \
        }                                                                                                        \
    } while (0)

/* NX (1..4) rows in one pass over the weight row: even blocks into acc[c][0], odd
 * ones into acc[c][1] (two chains of fused multiply-adds a row). */
AVX2 static INLINE void q16_0_pass(const bl_block_q8_0 *a8, const bl_block_q4_0 *a4, const bl_block_mxfp4 *am,
                                   const kcpu_block_q16_0 *const *x, const int NX, int64_t nb, float *out)
{
    __m256 acc[4][2];
    for (int c = 0; c < NX; c++)
        acc[c][0] = acc[c][1] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        Q16_0_BLOCK(NX, i, 0);
        Q16_0_BLOCK(NX, i + 1, 1);
    }
    if (i < nb)
        Q16_0_BLOCK(NX, i, 0);
    for (int c = 0; c < NX; c++)
        out[c] = hsum8(_mm256_add_ps(acc[c][0], acc[c][1]));
}

AVX2 static INLINE void dotn_q16_0(const bl_block_q8_0 *a8, const bl_block_q4_0 *a4, const bl_block_mxfp4 *am,
                                   const kcpu_block_q16_0 *const *x, int nx, int64_t n, float *out)
{
    KCPU_ASSERT(nx >= 1 && nx <= KCPU_DOTN_MAX);
    for (int c0 = 0; c0 < nx; c0 += 4) {
        switch (nx - c0 < 4 ? nx - c0 : 4) {
        case 1: q16_0_pass(a8, a4, am, x + c0, 1, n / BL_QK, out + c0); break;
        case 2: q16_0_pass(a8, a4, am, x + c0, 2, n / BL_QK, out + c0); break;
        case 3: q16_0_pass(a8, a4, am, x + c0, 3, n / BL_QK, out + c0); break;
        default: q16_0_pass(a8, a4, am, x + c0, 4, n / BL_QK, out + c0); break;
        }
    }
}

AVX2 void kcpu_vec_dotn_q8_0_q16_0_avx2(const void *w, const kcpu_block_q16_0 *const *x, int nx, int64_t n,
                                        float *out)
{
    dotn_q16_0(w, NULL, NULL, x, nx, n, out);
}

AVX2 void kcpu_vec_dotn_q4_0_q16_0_avx2(const void *w, const kcpu_block_q16_0 *const *x, int nx, int64_t n,
                                        float *out)
{
    dotn_q16_0(NULL, w, NULL, x, nx, n, out);
}

AVX2 void kcpu_vec_dotn_mxfp4_q16_0_avx2(const void *w, const kcpu_block_q16_0 *const *x, int nx, int64_t n,
                                         float *out)
{
    dotn_q16_0(NULL, NULL, w, x, nx, n, out);
}

#else /* not x86-64: the names exist so the table compiles; kcpu_init never picks them */

void kcpu_quantize_row_q16_K_avx2(const float *x, kcpu_block_q16_K *y, int64_t n) { kcpu_quantize_row_q16_K_ref(x, y, n); }
float kcpu_vec_dot_q4_K_q16_K_avx2(const void *w, const void *x, int64_t n) { return kcpu_vec_dot_q4_K_q16_K_ref(w, x, n); }
float kcpu_vec_dot_q5_K_q16_K_avx2(const void *w, const void *x, int64_t n) { return kcpu_vec_dot_q5_K_q16_K_ref(w, x, n); }
float kcpu_vec_dot_q6_K_q16_K_avx2(const void *w, const void *x, int64_t n) { return kcpu_vec_dot_q6_K_q16_K_ref(w, x, n); }
void kcpu_unpack16_q4_K_avx2(const void *w, kcpu_kunpacked16_t *u, int64_t n) { kcpu_unpack16_q4_K(w, u, n); }
void kcpu_unpack16_q5_K_avx2(const void *w, kcpu_kunpacked16_t *u, int64_t n) { kcpu_unpack16_q5_K(w, u, n); }
void kcpu_unpack16_q6_K_avx2(const void *w, kcpu_kunpacked16_t *u, int64_t n) { kcpu_unpack16_q6_K(w, u, n); }
void kcpu_gemm_u16_q16_K_avx2(const kcpu_kunpacked16_t *const u[2], int nr, const kcpu_block_q16_K *const x[4], int nc, int64_t nb, int q6, float out[8]) { (void)u; (void)nr; (void)x; (void)nc; (void)nb; (void)q6; (void)out; abort(); }

void kcpu_quantize_row_q16_0_avx2(const float *x, kcpu_block_q16_0 *y, int64_t n) { kcpu_quantize_row_q16_0_ref(x, y, n); }
void kcpu_vec_dotn_q8_0_q16_0_avx2(const void *w, const kcpu_block_q16_0 *const *x, int nx, int64_t n, float *out) { kcpu_vec_dotn_q8_0_q16_0_ref(w, x, nx, n, out); }
void kcpu_vec_dotn_q4_0_q16_0_avx2(const void *w, const kcpu_block_q16_0 *const *x, int nx, int64_t n, float *out) { kcpu_vec_dotn_q4_0_q16_0_ref(w, x, nx, n, out); }
void kcpu_vec_dotn_mxfp4_q16_0_avx2(const void *w, const kcpu_block_q16_0 *const *x, int nx, int64_t n, float *out) { kcpu_vec_dotn_mxfp4_q16_0_ref(w, x, nx, n, out); }

#endif
