/* AVX-512 VNNI (on 256-bit registers, AVX512VL) dots of the weight formats that meet
 * q8_0 activations: q8_0 and mxfp4, one activation row or its two q8 terms. They
 * give the AVX2 dots' bits (vec_dot_avx2.c): vpdpbusd adds each group of four
 * consecutive u8 x s8 products into an int32 lane, which is exactly what the AVX2
 * dots form with vpmaddubsw and vpmaddwd (|w| <= 127 against activations in
 * -127..127 never saturates the pair sums there), and the float steps are the
 * same, in the same order. One instruction a product group instead of two. */
#include <stddef.h>
#include <stdint.h>

#include "blocks.h"
#include "kcpu.h"
#include "quant.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

AVX512 static inline float hsum_ps(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The int32 lane sums of w (s8) times y (s8): |w| as u8 against y with w's sign. */
AVX512 static inline __m256i dot_i8(__m256i aw, __m256i w, __m256i y)
{
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), aw, _mm256_sign_epi8(y, w));
}

/* nx (1 or 2) activation rows against q8_0 weights (a8) or mxfp4 weights (a4). */
AVX512 static inline float dot_q8_family(const bl_block_q8_0 *a8, const bl_block_mxfp4 *a4,
                                         const bl_block_q8_0 *const *bx, int nx, int64_t nb)
{
    const __m256i lo4 = _mm256_set1_epi8(0xf);
    const __m256i tab = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)bl_e2m1_doubled));
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t i = 0; i < nb; i++) {
        __m256i qw;
        float dw;
        if (a8) {
            qw = _mm256_loadu_si256((const __m256i *)a8[i].qs);
            dw = _cvtsh_ss(a8[i].d);
        } else {
            const __m128i raw = _mm_loadu_si128((const __m128i *)a4[i].qs);
            qw = _mm256_shuffle_epi8(tab, _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), lo4));
            dw = bl_e8m0_to_fp32_half(a4[i].e);
        }
        const __m256i aw = _mm256_sign_epi8(qw, qw);
        for (int t = 0; t < nx; t++) {
            const __m256i qy = _mm256_loadu_si256((const __m256i *)bx[t][i].qs);
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * _cvtsh_ss(bx[t][i].d)),
                                     _mm256_cvtepi32_ps(dot_i8(aw, qw, qy)), acc[t]);
        }
    }
    return nx == 1 ? hsum_ps(acc[0]) : hsum_ps(acc[0]) + hsum_ps(acc[1]);
}

AVX512 float kcpu_vec_dot_q8_0_q8_0_avx512(const void *w, const void *x, int64_t n)
{
    const bl_block_q8_0 *bx[1] = {x};
    return dot_q8_family(w, NULL, bx, 1, n / BL_QK);
}

AVX512 float kcpu_vec_dot2_q8_0_q8_0_avx512(const void *w, const void *x0, const void *x1, int64_t n)
{
    const bl_block_q8_0 *bx[2] = {x0, x1};
    return dot_q8_family(w, NULL, bx, 2, n / BL_QK);
}

AVX512 float kcpu_vec_dot_mxfp4_q8_0_avx512(const void *w, const void *x, int64_t n)
{
    const bl_block_q8_0 *bx[1] = {x};
    return dot_q8_family(NULL, w, bx, 1, n / BL_QK);
}

AVX512 float kcpu_vec_dot2_mxfp4_q8_0_avx512(const void *w, const void *x0, const void *x1, int64_t n)
{
    const bl_block_q8_0 *bx[2] = {x0, x1};
    return dot_q8_family(NULL, w, bx, 2, n / BL_QK);
}

#else /* not x86-64: the names exist so the table compiles; kcpu_init never picks them */

float kcpu_vec_dot_q8_0_q8_0_avx512(const void *w, const void *x, int64_t n) { return kcpu_vec_dot_q8_0_q8_0_ref(w, x, n); }
float kcpu_vec_dot2_q8_0_q8_0_avx512(const void *w, const void *x0, const void *x1, int64_t n) { return kcpu_vec_dot2_q8_0_q8_0_ref(w, x0, x1, n); }
float kcpu_vec_dot_mxfp4_q8_0_avx512(const void *w, const void *x, int64_t n) { return kcpu_vec_dot_mxfp4_q8_0_ref(w, x, n); }
float kcpu_vec_dot2_mxfp4_q8_0_avx512(const void *w, const void *x0, const void *x1, int64_t n) { return kcpu_vec_dot2_mxfp4_q8_0_ref(w, x0, x1, n); }

#endif
