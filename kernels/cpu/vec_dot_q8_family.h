/* The body of the dots whose weights are 32 signed bytes a block with one scale:
 * q8_0 (a8) and mxfp4 (a4: its 32 codes looked up with vpshufb on the doubled E2M1
 * table, low nibbles elements 0..15, high ones 16..31), against nx (1 or 2) q8_0
 * activation rows sharing one pass over the weights: with two rows (a value and its
 * residual) the weights are decoded and |w| formed once per block.
 *
 * Included by vec_dot_avx2.c and vec_dot_avx512.c, each of which defines first
 * Q8F_TARGET (its target attribute), Q8F_LANES(aw, qw, qy) (the eight int32 sums of
 * four consecutive products of |w| and y with w's sign: the one step in which the
 * two sets differ, with the same integers) and hsum_ps. Not a public header. */
#ifndef VEC_DOT_Q8_FAMILY_H
#define VEC_DOT_Q8_FAMILY_H

Q8F_TARGET static inline float dot_q8_family(const bl_block_q8_0 *a8, const bl_block_mxfp4 *a4,
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
                                     _mm256_cvtepi32_ps(Q8F_LANES(aw, qw, qy)), acc[t]);
        }
    }
    return nx == 1 ? hsum_ps(acc[0]) : hsum_ps(acc[0]) + hsum_ps(acc[1]);
}

/* The four entry points of a set, named with suffix (avx2, avx512). */
#define Q8F_ENTRY_POINTS(suffix)                                                                              \
    Q8F_TARGET float kcpu_vec_dot_q8_0_q8_0_##suffix(const void *w, const void *x, int64_t n)                 \
    {                                                                                                         \
        const bl_block_q8_0 *bx[1] = {x};                                                                     \
        return dot_q8_family(w, NULL, bx, 1, n / BL_QK);                                                      \
    }                                                                                                         \
    Q8F_TARGET float kcpu_vec_dot2_q8_0_q8_0_##suffix(const void *w, const void *x0, const void *x1, int64_t n) \
    {                                                                                                         \
        const bl_block_q8_0 *bx[2] = {x0, x1};                                                                \
        return dot_q8_family(w, NULL, bx, 2, n / BL_QK);                                                      \
    }                                                                                                         \
    Q8F_TARGET float kcpu_vec_dot_mxfp4_q8_0_##suffix(const void *w, const void *x, int64_t n)                \
    {                                                                                                         \
        const bl_block_q8_0 *bx[1] = {x};                                                                     \
        return dot_q8_family(NULL, w, bx, 1, n / BL_QK);                                                      \
    }                                                                                                         \
    Q8F_TARGET float kcpu_vec_dot2_mxfp4_q8_0_##suffix(const void *w, const void *x0, const void *x1,         \
                                                      int64_t n)                                              \
    {                                                                                                         \
        const bl_block_q8_0 *bx[2] = {x0, x1};                                                                \
        return dot_q8_family(NULL, w, bx, 2, n / BL_QK);                                                      \
    }

#endif
