/* Deterministic pseudo-random numbers: splitmix64 to expand a seed, xoshiro256** for
 * the stream. The same seed gives the same stream on every machine and build; used
 * wherever bloomery draws (sampling, synthetic weights, tests). Not for secrets. */
#ifndef BL_RNG_H
#define BL_RNG_H

#include <stdint.h>

typedef struct bl_rng {
    uint64_t s[4];
} bl_rng_t;

/* One step of splitmix64 over the counter *x. */
static inline uint64_t bl_splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The state is four splitmix64 outputs from the seed, so nearby seeds give unrelated
 * streams and the state is never all zero. */
static inline void bl_rng_seed(bl_rng_t *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++)
        r->s[i] = bl_splitmix64(&seed);
}

static inline uint64_t bl__rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static inline uint64_t bl_rng_next(bl_rng_t *r)
{
    uint64_t *s = r->s;
    uint64_t out = bl__rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = bl__rotl(s[3], 45);
    return out;
}

/* Uniform in [0, 1), 53 random bits. */
static inline double bl_rng_uniform(bl_rng_t *r) { return (double)(bl_rng_next(r) >> 11) * 0x1.0p-53; }

#endif
