/* The body of the unpacked K-quant dots for two activation rows (q4_K, q5_K and q6_K
 * weights unpacked once, kcpu_kunpacked_t, against q8_K rows xa and xb of one or two
 * terms each): the weights are loaded once for both rows. Each row's sums are the
 * same operations in the same order as the one-row kernel's, so the same bits.
 *
 * Included by vec_dot_avx2.c and vec_dot_avx512.c, each of which defines first
 * DOTU2_TARGET (its target attribute), hsum_ps and
 *   dotu2_sums(u, bx, nx, i, sumi): for block i, stream s = 2 * row + term (s < 4,
 *   terms < nx), sumi[s] = the eight int32 lanes of the scaled quant products, lane j
 *   summing bytes 4j..4j+3 of every 32-element chunk (exact integers: the one step in
 *   which the sets differ),
 * then DOTU2_ENTRY_POINTS(suffix) defines kcpu_vec_dotu2_{q4,q5,q6}_K_q8_K_<suffix>.
 * Not a public header. */
#ifndef VEC_DOT_DOTU2_H
#define VEC_DOT_DOTU2_H

/* Streams s = 2 * row + term: bx[s] is row s / 2's term s % 2 (rows of nx == 1 use
 * streams 0 and 2). q6: q6_K's -32 offset through the group scales (corr) and the
 * rows' bsums; else q4_K/q5_K's mins (dmin, corr). */
DOTU2_TARGET static inline void dotu2_K(const kcpu_kunpacked_t *u, const bl_block_q8_K *const *bx, int nx,
                                        int64_t nb, int q6, float *out)
{
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    for (int64_t i = 0; i < nb; i++, u++) {
        const __m256i cv = _mm256_loadu_si256((const __m256i *)u->corr);
        __m256i sumi[4];
        dotu2_sums(u, bx, nx, i, sumi);
        for (int r = 0; r < 2; r++)
            for (int t = 0; t < nx; t++) {
                const int st = 2 * r + t;
                const __m256i bs = _mm256_loadu_si256((const __m256i *)bx[st][i].bsums);
                if (q6)
                    sumi[st] = _mm256_sub_epi32(sumi[st], _mm256_slli_epi32(_mm256_madd_epi16(cv, bs), 5));
                acc[st] = _mm256_fmadd_ps(_mm256_set1_ps(u->d * bx[st][i].d), _mm256_cvtepi32_ps(sumi[st]),
                                          acc[st]);
                if (!q6)
                    acc[st] = _mm256_fnmadd_ps(_mm256_set1_ps(u->dmin * bx[st][i].d),
                                               _mm256_cvtepi32_ps(_mm256_madd_epi16(cv, bs)), acc[st]);
            }
    }
    for (int r = 0; r < 2; r++)
        out[r] = nx == 1 ? hsum_ps(acc[2 * r]) : hsum_ps(acc[2 * r]) + hsum_ps(acc[2 * r + 1]);
}

#define DOTU2_ENTRY(suffix, type, q6)                                                                         \
    DOTU2_TARGET void kcpu_vec_dotu2_##type##_q8_K_##suffix(const kcpu_kunpacked_t *u, const void *xa,        \
                                                             const void *xb, size_t term_bytes, int terms,    \
                                                             int64_t n, float out[2])                         \
    {                                                                                                         \
        const bl_block_q8_K *bx[4] = {xa, (const bl_block_q8_K *)((const uint8_t *)xa + term_bytes), xb,      \
                                      (const bl_block_q8_K *)((const uint8_t *)xb + term_bytes)};             \
        if (terms == 2)                                                                                       \
            dotu2_K(u, bx, 2, n / BL_QK_K, q6, out);                                                          \
        else                                                                                                  \
            dotu2_K(u, bx, 1, n / BL_QK_K, q6, out);                                                          \
    }

#define DOTU2_ENTRY_POINTS(suffix) \
    DOTU2_ENTRY(suffix, q4_K, 0)   \
    DOTU2_ENTRY(suffix, q5_K, 0)   \
    DOTU2_ENTRY(suffix, q6_K, 1)

#endif
