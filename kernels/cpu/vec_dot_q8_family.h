/* The body of the dots whose weights are 32 signed bytes a block with one scale:
 * q8_0 (a8) and mxfp4 (a4: its 32 codes looked up with vpshufb on the doubled E2M1
 * table, low nibbles elements 0..15, high ones 16..31), against nx (1 or 2) q8_0
 * activation rows sharing one pass over the weights (KCPU_FAST8's one q8_0 term a
 * row; the pair dot of a batch): each weight block is decoded and |w| formed once
 * for both.
 *
 * Block i of a row adds into accumulator i % 4 of its activation row (four chains of
 * fused multiply-adds, not one: a chain waits the latency of each), and the row's
 * dot is (a0 + a2) + (a1 + a3) summed across the lanes. A wider set (AVX-512) that
 * keeps blocks 4j, 4j+1 in one 16-lane register and 4j+2, 4j+3 in another forms the
 * same sums in the same order, so every set gives the same bits, and a row's dot is
 * the same whatever rows share its pass.
 *
 * Included by vec_dot_avx2.c and vec_dot_avx512.c, each of which defines first
 * Q8F_TARGET (its target attribute), Q8F_LANES(aw, qw, qy) (the eight int32 sums of
 * four consecutive products of |w| and y with w's sign: the one step in which the
 * two sets differ, with the same integers) and hsum_ps; a set with its own
 * dot_q8_family defines Q8F_OWN_DOT. Not a public header. */
#ifndef VEC_DOT_Q8_FAMILY_H
#define VEC_DOT_Q8_FAMILY_H

/* Block i's 32 signed weights, and its scale into *dw. */
Q8F_TARGET static inline __m256i q8f_weights(const bl_block_q8_0 *a8, const bl_block_mxfp4 *a4, int64_t i,
                                             float *dw)
{
    if (a8) {
        *dw = _cvtsh_ss(a8[i].d);
        return _mm256_loadu_si256((const __m256i *)a8[i].qs);
    }
    const __m256i lo4 = _mm256_set1_epi8(0xf);
    const __m256i tab = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)bl_e2m1_doubled));
    const __m128i raw = _mm_loadu_si128((const __m128i *)a4[i].qs);
    *dw = bl_e8m0_to_fp32_half(a4[i].e);
    return _mm256_shuffle_epi8(tab, _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), lo4));
}

/* Block i into accumulator acc[t][j] (j = i % 4) of each activation row t. */
Q8F_TARGET static inline void q8f_block(const bl_block_q8_0 *a8, const bl_block_mxfp4 *a4,
                                        const bl_block_q8_0 *const *bx, int nx, int64_t i, int j, __m256 acc[2][4])
{
    float dw;
    const __m256i qw = q8f_weights(a8, a4, i, &dw);
    const __m256i aw = _mm256_sign_epi8(qw, qw);
    for (int t = 0; t < nx; t++) {
        const __m256i qy = _mm256_loadu_si256((const __m256i *)bx[t][i].qs);
        acc[t][j] = _mm256_fmadd_ps(_mm256_set1_ps(dw * _cvtsh_ss(bx[t][i].d)),
                                    _mm256_cvtepi32_ps(Q8F_LANES(aw, qw, qy)), acc[t][j]);
    }
}

/* out[t]: activation row t's dot from its four accumulators. */
Q8F_TARGET static inline void q8f_finish(__m256 acc[2][4], int nx, float *out)
{
    for (int t = 0; t < nx; t++)
        out[t] = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[t][0], acc[t][2]), _mm256_add_ps(acc[t][1], acc[t][3])));
}

#ifndef Q8F_OWN_DOT
Q8F_TARGET static inline void dot_q8_family(const bl_block_q8_0 *a8, const bl_block_mxfp4 *a4,
                                            const bl_block_q8_0 *const *bx, int nx, int64_t nb, float *out)
{
    __m256 acc[2][4];
    for (int t = 0; t < 2; t++)
        for (int j = 0; j < 4; j++)
            acc[t][j] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 4 <= nb; i += 4) /* unrolled: the accumulators stay in registers */
        for (int j = 0; j < 4; j++)
            q8f_block(a8, a4, bx, nx, i + j, j, acc);
    for (; i < nb; i++)
        q8f_block(a8, a4, bx, nx, i, (int)(i & 3), acc);
    q8f_finish(acc, nx, out);
}
#endif

/* The entry points of a set, named with suffix (avx2, avx512). */
#define Q8F_ENTRY_POINTS(suffix)                                                                              \
    Q8F_TARGET float kcpu_vec_dot_q8_0_q8_0_##suffix(const void *w, const void *x, int64_t n)                 \
    {                                                                                                         \
        const bl_block_q8_0 *bx[1] = {x};                                                                     \
        float o;                                                                                              \
        dot_q8_family(w, NULL, bx, 1, n / BL_QK, &o);                                                         \
        return o;                                                                                             \
    }                                                                                                         \
    Q8F_TARGET float kcpu_vec_dot_mxfp4_q8_0_##suffix(const void *w, const void *x, int64_t n)                \
    {                                                                                                         \
        const bl_block_q8_0 *bx[1] = {x};                                                                     \
        float o;                                                                                              \
        dot_q8_family(NULL, w, bx, 1, n / BL_QK, &o);                                                         \
        return o;                                                                                             \
    }                                                                                                         \
    Q8F_TARGET void kcpu_vec_dotp_q8_0_q8_0_##suffix(const void *w, const void *xa, const void *xb, int64_t n, \
                                                    float out[2])                                             \
    {                                                                                                         \
        const bl_block_q8_0 *bx[2] = {xa, xb};                                                                \
        dot_q8_family(w, NULL, bx, 2, n / BL_QK, out);                                                        \
    }                                                                                                         \
    Q8F_TARGET void kcpu_vec_dotp_mxfp4_q8_0_##suffix(const void *w, const void *xa, const void *xb,         \
                                                     int64_t n, float out[2])                                 \
    {                                                                                                         \
        const bl_block_q8_0 *bx[2] = {xa, xb};                                                                \
        dot_q8_family(NULL, w, bx, 2, n / BL_QK, out);                                                        \
    }

#endif
