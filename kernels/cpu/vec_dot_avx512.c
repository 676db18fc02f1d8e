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

/* q8_0 and mxfp4 (vec_dot_q8_family.h): one vpdpbusd for the four-product sums. */
#define Q8F_TARGET AVX512
#define Q8F_LANES(aw, qw, qy) _mm256_dpbusd_epi32(_mm256_setzero_si256(), aw, _mm256_sign_epi8(qy, qw))
#include "vec_dot_q8_family.h"
Q8F_ENTRY_POINTS(avx512)

#else /* not x86-64: the names exist so the table compiles; kcpu_init never picks them */

float kcpu_vec_dot_q8_0_q8_0_avx512(const void *w, const void *x, int64_t n) { return kcpu_vec_dot_q8_0_q8_0_ref(w, x, n); }
float kcpu_vec_dot2_q8_0_q8_0_avx512(const void *w, const void *x0, const void *x1, int64_t n) { return kcpu_vec_dot2_q8_0_q8_0_ref(w, x0, x1, n); }
float kcpu_vec_dot_mxfp4_q8_0_avx512(const void *w, const void *x, int64_t n) { return kcpu_vec_dot_mxfp4_q8_0_ref(w, x, n); }
float kcpu_vec_dot2_mxfp4_q8_0_avx512(const void *w, const void *x0, const void *x1, int64_t n) { return kcpu_vec_dot2_mxfp4_q8_0_ref(w, x0, x1, n); }

#endif
