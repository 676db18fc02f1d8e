/* AVX-512 VNNI (on 256-bit registers, AVX512VL) dots of the weight formats that meet
 * q8_0 activations: q8_0 and mxfp4, one activation row or its two q8 terms. They
 * give the AVX2 dots' bits (vec_dot_avx2.c): vpdpbusd adds each group of four
 * consecutive u8 x s8 products into an int32 lane, which is exactly what the AVX2
 * dots form with vpmaddubsw and vpmaddwd (|w| <= 127 against activations in
 * -127..127 never saturates the pair sums there), and the float steps are the
 * same, in the same order. One instruction a product group instead of two. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

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

/* q8_0 and mxfp4 (vec_dot_q8_family.h): one vpdpbusd for the four-product sums,
 * two blocks in each 512-bit register. */
#define Q8F_TARGET AVX512
#define Q8F_LANES(aw, qw, qy) _mm256_dpbusd_epi32(_mm256_setzero_si256(), aw, _mm256_sign_epi8(qy, qw))
#define Q8F_OWN_DOT
#include "vec_dot_q8_family.h"

/* Blocks i and i + 1's 64 signed weights, their scales into dw[0..1]. */
AVX512 static inline __m512i q8f_weights2(const bl_block_q8_0 *a8, const bl_block_mxfp4 *a4, int64_t i, float *dw)
{
    if (a8) {
        dw[0] = _cvtsh_ss(a8[i].d);
        dw[1] = _cvtsh_ss(a8[i + 1].d);
        return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a8[i].qs)),
                                  _mm256_loadu_si256((const __m256i *)a8[i + 1].qs), 1);
    }
    dw[0] = bl_e8m0_to_fp32_half(a4[i].e);
    dw[1] = bl_e8m0_to_fp32_half(a4[i + 1].e);
    const __m256i raw = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)a4[i].qs)),
        _mm_loadu_si128((const __m128i *)a4[i + 1].qs), 1);
    /* [raw_i, raw_i+1, raw_i >> 4, raw_i+1 >> 4] in 128-bit lanes, then lanes 0, 2, 1, 3 */
    __m512i n = _mm512_inserti64x4(_mm512_castsi256_si512(raw), _mm256_srli_epi16(raw, 4), 1);
    n = _mm512_and_si512(_mm512_shuffle_i64x2(n, n, _MM_SHUFFLE(3, 1, 2, 0)), _mm512_set1_epi8(0xf));
    return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)bl_e2m1_doubled)), n);
}

AVX512 static inline void dot_q8_family(const bl_block_q8_0 *a8, const bl_block_mxfp4 *a4,
                                        const bl_block_q8_0 *const *bx, int nx, int64_t nb, float *out)
{
    /* blocks 4j, 4j+1 in the halves of wa[t], 4j+2, 4j+3 in those of wb[t] */
    __m512 wa[2], wb[2];
    for (int t = 0; t < 2; t++)
        wa[t] = wb[t] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 4 <= nb; i += 4) {
        for (int h = 0; h < 2; h++) {
            float dw[2];
            const __m512i qw = q8f_weights2(a8, a4, i + 2 * h, dw);
            const __m512i aw = _mm512_abs_epi8(qw);
            const __mmask64 neg = _mm512_movepi8_mask(qw);
            for (int t = 0; t < nx; t++) {
                const bl_block_q8_0 *y = bx[t] + i + 2 * h;
                const __m512i qy = _mm512_inserti64x4(
                    _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)y[0].qs)),
                    _mm256_loadu_si256((const __m256i *)y[1].qs), 1);
                const __m512i sy = _mm512_mask_sub_epi8(qy, neg, _mm512_setzero_si512(), qy);
                const __m512 d = _mm512_mask_blend_ps((__mmask16)0xff00, _mm512_set1_ps(dw[0] * _cvtsh_ss(y[0].d)),
                                                      _mm512_set1_ps(dw[1] * _cvtsh_ss(y[1].d)));
                const __m512 p = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), aw, sy));
                if (h == 0)
                    wa[t] = _mm512_fmadd_ps(d, p, wa[t]);
                else
                    wb[t] = _mm512_fmadd_ps(d, p, wb[t]);
            }
        }
    }
    __m256 acc[2][4];
    for (int t = 0; t < 2; t++) {
        acc[t][0] = _mm512_castps512_ps256(wa[t]);
        acc[t][1] = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(wa[t]), 1));
        acc[t][2] = _mm512_castps512_ps256(wb[t]);
        acc[t][3] = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(wb[t]), 1));
    }
    for (; i < nb; i++) /* the last blocks, one at a time into their accumulators */
        q8f_block(a8, a4, bx, nx, i, (int)(i & 3), acc);
    q8f_finish(acc, nx, out);
}

Q8F_ENTRY_POINTS(avx512)

/* The unpacked K-quant dots for two activation rows (vec_dot_dotu2.h): two 32-element
 * chunks a 512-bit vpmaddubsw/vpmaddwd pair, their int32 lanes folded onto the AVX2
 * kernel's eight (each lane then sums the same products, exactly), so the AVX2
 * kernels' bits. */
AVX512 static inline void dotu2_sums(const kcpu_kunpacked_t *u, const bl_block_q8_K *const *bx, int nx,
                                     int64_t i, __m256i sumi[4])
{
    __m512i wide[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),
                       _mm512_setzero_si512()};
    for (int c = 0; c < 8; c += 2) {
        const __m512i q = _mm512_loadu_si512(u->q + 32 * c);
        const __m512i sc = _mm512_loadu_si512(u->scv[c]);
        for (int r = 0; r < 2; r++)
            for (int t = 0; t < nx; t++) {
                const int st = 2 * r + t;
                const __m512i y = _mm512_loadu_si512(bx[st][i].qs + 32 * c);
                wide[st] = _mm512_add_epi32(wide[st], _mm512_madd_epi16(_mm512_maddubs_epi16(q, y), sc));
            }
    }
    for (int st = 0; st < 4; st++)
        sumi[st] = _mm256_add_epi32(_mm512_castsi512_si256(wide[st]), _mm512_extracti64x4_epi64(wide[st], 1));
}

#define DOTU2_TARGET AVX512
#include "vec_dot_dotu2.h"
DOTU2_ENTRY_POINTS(avx512)

#else /* not x86-64: the names exist so the table compiles; kcpu_init never picks them */

float kcpu_vec_dot_q8_0_q8_0_avx512(const void *w, const void *x, int64_t n) { return kcpu_vec_dot_q8_0_q8_0_ref(w, x, n); }
float kcpu_vec_dot_mxfp4_q8_0_avx512(const void *w, const void *x, int64_t n) { return kcpu_vec_dot_mxfp4_q8_0_ref(w, x, n); }
void kcpu_vec_dotp_q8_0_q8_0_avx512(const void *w, const void *xa, const void *xb, int64_t n, float out[2]) { kcpu_vec_dotp_q8_0_q8_0_ref(w, xa, xb, n, out); }
void kcpu_vec_dotp_mxfp4_q8_0_avx512(const void *w, const void *xa, const void *xb, int64_t n, float out[2]) { kcpu_vec_dotp_mxfp4_q8_0_ref(w, xa, xb, n, out); }
/* No unpacked reference kernel exists; kcpu_init never selects these off x86-64. */
void kcpu_vec_dotu2_q4_K_q8_K_avx512(const kcpu_kunpacked_t *u, const void *xa, const void *xb, size_t tb, int terms, int64_t n, float out[2]) { (void)u; (void)xa; (void)xb; (void)tb; (void)terms; (void)n; (void)out; abort(); }
void kcpu_vec_dotu2_q5_K_q8_K_avx512(const kcpu_kunpacked_t *u, const void *xa, const void *xb, size_t tb, int terms, int64_t n, float out[2]) { (void)u; (void)xa; (void)xb; (void)tb; (void)terms; (void)n; (void)out; abort(); }
void kcpu_vec_dotu2_q6_K_q8_K_avx512(const kcpu_kunpacked_t *u, const void *xa, const void *xb, size_t tb, int terms, int64_t n, float out[2]) { (void)u; (void)xa; (void)xb; (void)tb; (void)terms; (void)n; (void)out; abort(); }

#endif
