/* Fake router traces for the tests of the routing heat and of residency: a token's
 * k distinct experts drawn from a law over ne experts, and Zipf laws over a shuffled
 * ranking. Include after test_seed.h. */
#ifndef BL_TEST_TRACE_H
#define BL_TEST_TRACE_H

#include <math.h>
#include <stdint.h>

/* k distinct experts drawn from weights p (ne of them, sum 1) into ids. */
static inline void trace_draw(rng_t *r, const double *p, int ne, int k, int32_t *ids)
{
    for (int j = 0; j < k; j++) {
        for (;;) {
            const double u = (double)(rng_next(r) >> 11) * 0x1.0p-53;
            double acc = 0;
            int e = 0;
            for (; e < ne - 1; e++) {
                acc += p[e];
                if (u < acc)
                    break;
            }
            int dup = 0;
            for (int i = 0; i < j; i++)
                dup |= ids[i] == e;
            if (!dup) {
                ids[j] = e;
                break;
            }
        }
    }
}

/* order[0..ne) a random ranking (rank -> expert). */
static inline void trace_shuffle(rng_t *r, int *order, int ne)
{
    for (int i = 0; i < ne; i++)
        order[i] = i;
    for (int i = ne - 1; i > 0; i--) {
        const int j = (int)(rng_next(r) % (uint64_t)(i + 1)), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
}

/* p[order[i]] = the Zipf weight of rank i, exponent s. */
static inline void trace_zipf(double s, const int *order, int ne, double *p)
{
    double z = 0;
    for (int i = 0; i < ne; i++)
        z += pow(i + 1, -s);
    for (int i = 0; i < ne; i++)
        p[order[i]] = pow(i + 1, -s) / z;
}

#endif
