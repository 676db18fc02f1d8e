/* AVX-512 (F, BW, VL, VNNI) packed dots of K-quant weights against the 16-bit
 * activation format (kcpu_block_q16_K): the products a decode step streams every
 * routed expert through. They give the AVX2 dots' bits (vec_dot_q16_avx2.c), so a
 * row's result still does not depend on whether it was batched (the batch tile is
 * the AVX2 one in either kernel set):
 *   - a 512-bit register holds one whole 32-element sub-block (q4_K/q5_K) or two
 *     16-element groups (q6_K) as words, each word already times its scale (the
 *     AVX2 bounds hold: |q * sc| <= 1953 for q4_K/q5_K, 2016 for q6_K), and
 *     vpdpwssd adds the pairs' products into 16 int32 lanes, exactly;
 *   - lane l and lane l + 8 hold elements 2l, 2l + 1 of the first and of the second
 *     16 of every 32, so adding the upper half onto the lower gives the AVX2 dot's
 *     eight lane sums, integer for integer, before the same float steps in the same
 *     order (per block for q4_K/q5_K, per half block for q6_K) and the same
 *     horizontal sum.
 * About a third of the AVX2 dots' instructions per weight: a decode step's expert
 * products go from issue-bound towards the memory's rate. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "blocks.h"
#include "kcpu.h"
#include "kcpu_impl.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define INLINE inline __attribute__((always_inline))

AVX512 static INLINE float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The eight lane sums of the AVX2 dots from sixteen (see the top of the file). */
AVX512 static INLINE __m256i fold16(__m512i v)
{
    return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

AVX512 static INLINE __m512i load_x(const int16_t *x) { return _mm512_loadu_si512((const void *)x); }

/* Sub-blocks 2j and 2j + 1 of a q4_K/q5_K block as two registers of 32 words, each
 * word times its sub-block's scale: the 32 bytes qs + 32j widened (low nibbles are
 * sub-block 2j, high ones 2j + 1), with q5_K's fifth bits (qh: its 32 bytes as
 * words, bit j of byte e for element e of sub-block j; zero for q4_K) or-ed in. */
AVX512 static INLINE void q45_words(const uint8_t *qs, __m512i qh, int a5, int j, const uint8_t *sc, __m512i *w0,
                                    __m512i *w1)
{
    const __m512i lo4 = _mm512_set1_epi16(0xf), one = _mm512_set1_epi16(1);
    const __m512i r = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(qs + 32 * j)));
    __m512i q0 = _mm512_and_si512(r, lo4), q1 = _mm512_srli_epi16(r, 4);
    if (a5) {
        q0 = _mm512_or_si512(q0, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh, 2 * j), one), 4));
        q1 = _mm512_or_si512(q1, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh, 2 * j + 1), one), 4));
    }
    *w0 = _mm512_mullo_epi16(q0, _mm512_set1_epi16(sc[2 * j]));
    *w1 = _mm512_mullo_epi16(q1, _mm512_set1_epi16(sc[2 * j + 1]));
}

/* q5_K's fifth bits as words for q45_words; zero for q4_K. */
AVX512 static INLINE __m512i q5_high(const bl_block_q5_K *a5)
{
    return a5 ? _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)a5->qh)) : _mm512_setzero_si512();
}

/* A q4_K/q5_K block's d and dmin as floats (lanes 0 and 1 of dm), and its eight
 * mins times dmin. */
AVX512 static INLINE __m256 q45_mins(const uint16_t *d, const uint8_t m[8], __m128 *dm)
{
    uint32_t d2;
    memcpy(&d2, d, 4);
    *dm = _mm_cvtph_ps(_mm_cvtsi32_si128((int)d2));
    uint64_t m8;
    memcpy(&m8, m, 8);
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)m8))),
                         _mm256_broadcastss_ps(_mm_movehdup_ps(*dm)));
}

/* The four 32-element chunks of half h of a q6_K block as registers of words
 * (0..63 - 32) times the scales of their two 16-element groups (the lower and upper
 * halves of each register); sc: the block's 16 scales as words 0-15. */
AVX512 static INLINE void q6_words(const bl_block_q6_K *a, int h, __m512i sc, __m512i wq[4])
{
    const __m512i lo4 = _mm512_set1_epi16(0xf), m30 = _mm512_set1_epi16(0x30), off = _mm512_set1_epi16(32);
    /* word e of chunk k's scale register: group 2k for e < 16, 2k + 1 above */
    const __m512i hi1 = _mm512_maskz_mov_epi16(0xffff0000u, _mm512_set1_epi16(1));
    const __m512i l0 = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(a->ql + 64 * h)));
    const __m512i l1 = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(a->ql + 64 * h + 32)));
    const __m512i hb = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(a->qh + 32 * h)));
    const __m512i q[4] = {
        _mm512_or_si512(_mm512_and_si512(l0, lo4), _mm512_and_si512(_mm512_slli_epi16(hb, 4), m30)),
        _mm512_or_si512(_mm512_and_si512(l1, lo4), _mm512_and_si512(_mm512_slli_epi16(hb, 2), m30)),
        _mm512_or_si512(_mm512_srli_epi16(l0, 4), _mm512_and_si512(hb, m30)),
        _mm512_or_si512(_mm512_srli_epi16(l1, 4), _mm512_and_si512(_mm512_srli_epi16(hb, 2), m30)),
    };
    for (int k = 0; k < 4; k++) {
        const __m512i idx = _mm512_add_epi16(_mm512_set1_epi16((short)(8 * h + 2 * k)), hi1);
        wq[k] = _mm512_mullo_epi16(_mm512_sub_epi16(q[k], off), _mm512_permutexvar_epi16(idx, sc));
    }
}

/* A q6_K block's 16 group scales as words 0-15 of a register. */
AVX512 static INLINE __m512i q6_scales(const bl_block_q6_K *a)
{
    return _mm512_zextsi256_si512(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)a->scales)));
}

/* The q4_K/q5_K dot: per pair of sub-blocks, 32 bytes widened to words (the low
 * nibbles are sub-block 2j, the high ones 2j + 1), q5_K's fifth bits or-ed in, each
 * word times its sub-block's scale, and one vpdpwssd per sub-block. */
AVX512 static INLINE float dot_q45_K(const bl_block_q4_K *a4, const bl_block_q5_K *a5,
                                     const kcpu_block_q16_K *b, int64_t nb)
{
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        uint8_t sc[8], m[8];
        kcpu__k_scales8(a4 ? a4[i].scales : a5[i].scales, sc, m);
        const __m512i qh = q5_high(a5 ? &a5[i] : NULL);
        const uint8_t *qs = a4 ? a4[i].qs : a5[i].qs;
        __m512i isum = _mm512_setzero_si512();
        for (int j = 0; j < 4; j++) {
            __m512i w0, w1;
            q45_words(qs, qh, a5 != NULL, j, sc, &w0, &w1);
            isum = _mm512_dpwssd_epi32(isum, w0, load_x(b[i].q + 64 * j));
            isum = _mm512_dpwssd_epi32(isum, w1, load_x(b[i].q + 64 * j + 32));
        }
        __m128 dm;
        const __m256 mins = q45_mins(a4 ? &a4[i].d : &a5[i].d, m, &dm);
        acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(_mm_mul_ss(dm, _mm_load_ss(&b[i].d))),
                              _mm256_cvtepi32_ps(fold16(isum)), acc);
        acc = _mm256_fnmadd_ps(mins, _mm256_loadu_ps(b[i].bsum), acc);
    }
    return hsum8(acc);
}

AVX512 float kcpu_vec_dot_q4_K_q16_K_avx512(const void *w, const void *x, int64_t n)
{
    return dot_q45_K(w, NULL, x, n / BL_QK_K);
}

AVX512 float kcpu_vec_dot_q5_K_q16_K_avx512(const void *w, const void *x, int64_t n)
{
    return dot_q45_K(NULL, w, x, n / BL_QK_K);
}

/* The q6_K dot: per half block, four chunks of 32 elements, each a register of
 * words 0..63 minus 32 times the scales of its two 16-element groups (the lower
 * and upper halves of the register), one vpdpwssd each. */
AVX512 float kcpu_vec_dot_q6_K_q16_K_avx512(const void *w, const void *x, int64_t n)
{
    const bl_block_q6_K *a = w;
    const kcpu_block_q16_K *b = x;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / BL_QK_K; i++) {
        const __m256 dd = _mm256_set1_ps(_cvtsh_ss(a[i].d) * b[i].d);
        const __m512i sc = q6_scales(&a[i]);
        for (int h = 0; h < 2; h++) {
            __m512i wq[4];
            q6_words(&a[i], h, sc, wq);
            __m512i isum = _mm512_setzero_si512();
            for (int k = 0; k < 4; k++)
                isum = _mm512_dpwssd_epi32(isum, wq[k], load_x(b[i].q + 128 * h + 32 * k));
            acc = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(fold16(isum)), acc);
        }
    }
    return hsum8(acc);
}

// --- one weight row against several activation rows -----------------------------------------

/* The q4_K/q5_K dot of one weight row against nx activation rows: each block's
 * weights decoded once into eight registers of 32 scaled words (as dot_q45_K
 * forms them), then each row's lane sums and float steps exactly as dot_q45_K
 * takes them, so out[c] has the bits of the one-row dot of row c. nx is a
 * constant where this is inlined: the rows' sums and accumulators stay in
 * registers. */
AVX512 static INLINE void dotn_q45_K(const bl_block_q4_K *a4, const bl_block_q5_K *a5,
                                     const kcpu_block_q16_K *const *x, const int nx, int64_t nb, float *out)
{
    __m256 acc[KCPU_DOTN_MAX];
    for (int c = 0; c < nx; c++)
        acc[c] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        uint8_t sc[8], m[8];
        kcpu__k_scales8(a4 ? a4[i].scales : a5[i].scales, sc, m);
        const __m512i qh = q5_high(a5 ? &a5[i] : NULL);
        const uint8_t *qs = a4 ? a4[i].qs : a5[i].qs;
        __m512i wq[8];
        for (int j = 0; j < 4; j++)
            q45_words(qs, qh, a5 != NULL, j, sc, &wq[2 * j], &wq[2 * j + 1]);
        __m128 dm;
        const __m256 mins = q45_mins(a4 ? &a4[i].d : &a5[i].d, m, &dm);
        for (int c = 0; c < nx; c++) {
            const int16_t *xq = x[c][i].q;
            __m512i isum = _mm512_setzero_si512();
            for (int j = 0; j < 8; j++)
                isum = _mm512_dpwssd_epi32(isum, wq[j], load_x(xq + 32 * j));
            acc[c] = _mm256_fmadd_ps(_mm256_broadcastss_ps(_mm_mul_ss(dm, _mm_load_ss(&x[c][i].d))),
                                     _mm256_cvtepi32_ps(fold16(isum)), acc[c]);
            acc[c] = _mm256_fnmadd_ps(mins, _mm256_loadu_ps(x[c][i].bsum), acc[c]);
        }
    }
    for (int c = 0; c < nx; c++)
        out[c] = hsum8(acc[c]);
}

/* The q6_K dot of one weight row against nx activation rows: per half block the
 * four chunks' scaled words decoded once (as kcpu_vec_dot_q6_K_q16_K_avx512), then
 * each row's sums and float steps as there. */
AVX512 static INLINE void dotn_q6_K(const bl_block_q6_K *a, const kcpu_block_q16_K *const *x, const int nx,
                                    int64_t nb, float *out)
{
    __m256 acc[KCPU_DOTN_MAX];
    for (int c = 0; c < nx; c++)
        acc[c] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const float dw = _cvtsh_ss(a[i].d);
        const __m512i sc = q6_scales(&a[i]);
        for (int h = 0; h < 2; h++) {
            __m512i wq[4];
            q6_words(&a[i], h, sc, wq);
            for (int c = 0; c < nx; c++) {
                const int16_t *xq = x[c][i].q + 128 * h;
                __m512i isum = _mm512_setzero_si512();
                for (int k = 0; k < 4; k++)
                    isum = _mm512_dpwssd_epi32(isum, wq[k], load_x(xq + 32 * k));
                acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(dw * x[c][i].d), _mm256_cvtepi32_ps(fold16(isum)), acc[c]);
            }
        }
    }
    for (int c = 0; c < nx; c++)
        out[c] = hsum8(acc[c]);
}

/* nx as a constant for each inlined copy. */
#define DOTN_CASES(call)                                                                                     \
    switch (nx) {                                                                                            \
    case 1: call(1); break;                                                                                  \
    case 2: call(2); break;                                                                                  \
    case 3: call(3); break;                                                                                  \
    case 4: call(4); break;                                                                                  \
    case 5: call(5); break;                                                                                  \
    case 6: call(6); break;                                                                                  \
    case 7: call(7); break;                                                                                  \
    default: call(8); break;                                                                                 \
    }

AVX512 void kcpu_vec_dotn_q4_K_q16_K_avx512(const void *w, const kcpu_block_q16_K *const *x, int nx, int64_t n,
                                            float *out)
{
#define CALL(k) dotn_q45_K(w, NULL, x, k, n / BL_QK_K, out)
    DOTN_CASES(CALL)
#undef CALL
}

AVX512 void kcpu_vec_dotn_q5_K_q16_K_avx512(const void *w, const kcpu_block_q16_K *const *x, int nx, int64_t n,
                                            float *out)
{
#define CALL(k) dotn_q45_K(NULL, w, x, k, n / BL_QK_K, out)
    DOTN_CASES(CALL)
#undef CALL
}

AVX512 void kcpu_vec_dotn_q6_K_q16_K_avx512(const void *w, const kcpu_block_q16_K *const *x, int nx, int64_t n,
                                            float *out)
{
#define CALL(k) dotn_q6_K(w, x, k, n / BL_QK_K, out)
    DOTN_CASES(CALL)
#undef CALL
}

// --- the batched tile ---------------------------------------------------------------------

/* kcpu_gemm_u16_q16_K_avx2's tile with 32 words a register: each 32 elements cost
 * NR + NC loads and NR * NC vpdpwssd (the AVX2 tile: twice the loads, and a madd
 * and an add for every 16), then fold16 gives its eight lane sums and the same
 * float steps follow at the same points (a whole block for q4_K/q5_K, each half
 * for q6_K), so every output keeps the packed dot's bits. */
AVX512 static INLINE void gemm_tile(const kcpu_kunpacked16_t *const u[2], const int NR,
                                    const kcpu_block_q16_K *const x[4], const int NC, int64_t nb, const int q6,
                                    float out[8])
{
    __m256 acc[2][4];
    for (int r = 0; r < NR; r++)
        for (int c = 0; c < NC; c++)
            acc[r][c] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        __m512i is[2][4];
        for (int r = 0; r < NR; r++)
            for (int c = 0; c < NC; c++)
                is[r][c] = _mm512_setzero_si512();
        for (int h = 0; h < 2; h++) {
            for (int k = 0; k < 4; k++) {
                const int o = 128 * h + 32 * k;
                __m512i w[2];
                for (int r = 0; r < NR; r++)
                    w[r] = load_x(u[r][i].w + o);
                for (int c = 0; c < NC; c++) {
                    const __m512i xv = load_x(x[c][i].q + o);
                    for (int r = 0; r < NR; r++)
                        is[r][c] = _mm512_dpwssd_epi32(is[r][c], w[r], xv);
                }
            }
            if (q6 || h == 1)
                for (int r = 0; r < NR; r++)
                    for (int c = 0; c < NC; c++) {
                        acc[r][c] = _mm256_fmadd_ps(_mm256_set1_ps(u[r][i].d * x[c][i].d),
                                                    _mm256_cvtepi32_ps(fold16(is[r][c])), acc[r][c]);
                        is[r][c] = _mm512_setzero_si512();
                    }
        }
        if (!q6)
            for (int r = 0; r < NR; r++)
                for (int c = 0; c < NC; c++)
                    acc[r][c] = _mm256_fnmadd_ps(_mm256_loadu_ps(u[r][i].mins), _mm256_loadu_ps(x[c][i].bsum),
                                                 acc[r][c]);
    }
    for (int r = 0; r < NR; r++)
        for (int c = 0; c < NC; c++)
            out[4 * r + c] = hsum8(acc[r][c]);
}

#define GEMM_CASE(nr, nc)                                                                                    \
    case 4 * (nr) + (nc):                                                                                    \
        if (q6)                                                                                              \
            gemm_tile(u, nr, x, nc, nb, 1, out);                                                             \
        else                                                                                                 \
            gemm_tile(u, nr, x, nc, nb, 0, out);                                                             \
        break;

AVX512 void kcpu_gemm_u16_q16_K_avx512(const kcpu_kunpacked16_t *const u[2], int nr,
                                       const kcpu_block_q16_K *const x[4], int nc, int64_t nb, int q6, float out[8])
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

#else

float kcpu_vec_dot_q4_K_q16_K_avx512(const void *w, const void *x, int64_t n) { return kcpu_vec_dot_q4_K_q16_K_ref(w, x, n); }
float kcpu_vec_dot_q5_K_q16_K_avx512(const void *w, const void *x, int64_t n) { return kcpu_vec_dot_q5_K_q16_K_ref(w, x, n); }
float kcpu_vec_dot_q6_K_q16_K_avx512(const void *w, const void *x, int64_t n) { return kcpu_vec_dot_q6_K_q16_K_ref(w, x, n); }
void kcpu_gemm_u16_q16_K_avx512(const kcpu_kunpacked16_t *const u[2], int nr, const kcpu_block_q16_K *const x[4], int nc, int64_t nb, int q6, float out[8]) { (void)u; (void)nr; (void)x; (void)nc; (void)nb; (void)q6; (void)out; abort(); }
void kcpu_vec_dotn_q4_K_q16_K_avx512(const void *w, const kcpu_block_q16_K *const *x, int nx, int64_t n, float *out)
{
    for (int c = 0; c < nx; c++)
        out[c] = kcpu_vec_dot_q4_K_q16_K_ref(w, x[c], n);
}
void kcpu_vec_dotn_q5_K_q16_K_avx512(const void *w, const kcpu_block_q16_K *const *x, int nx, int64_t n, float *out)
{
    for (int c = 0; c < nx; c++)
        out[c] = kcpu_vec_dot_q5_K_q16_K_ref(w, x[c], n);
}
void kcpu_vec_dotn_q6_K_q16_K_avx512(const void *w, const kcpu_block_q16_K *const *x, int nx, int64_t n, float *out)
{
    for (int c = 0; c < nx; c++)
        out[c] = kcpu_vec_dot_q6_K_q16_K_ref(w, x[c], n);
}

#endif
