/* The run seed and random streams of unit tests that draw their inputs: the seed
 * changes every run, is printed, and BLOOMERY_TEST_SEED=N replays it. Each test
 * takes its own stream from the seed and a constant, so tests do not depend on
 * their order. Include once, from the test's .c file. */
#ifndef BL_TEST_SEED_H
#define BL_TEST_SEED_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "rng.h"

static uint64_t g_seed;

/* Sets g_seed from BLOOMERY_TEST_SEED or the clock, and prints it as a TAP comment. */
static inline void test_seed_init(const char *prog)
{
    const char *s = getenv("BLOOMERY_TEST_SEED");
    g_seed = s && *s ? strtoull(s, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    printf("# %s: seed %llu (BLOOMERY_TEST_SEED=%llu replays it)\n", prog,
           (unsigned long long)g_seed, (unsigned long long)g_seed);
}

typedef struct rng {
    uint64_t s;
} rng_t;

static inline uint64_t rng_next(rng_t *r) { return bl_splitmix64(&r->s); }

/* Uniform in [lo, hi). */
static inline float rng_f(rng_t *r, float lo, float hi)
{
    return lo + (hi - lo) * (float)((double)(rng_next(r) >> 11) * 0x1.0p-53);
}

/* The stream of one test. */
static inline rng_t rng_for(uint64_t stream)
{
    rng_t r = {g_seed ^ (stream * 0xd1342543de82ef95ull)};
    (void)rng_next(&r); /* discard: decorrelates nearby streams */
    return r;
}

#endif
