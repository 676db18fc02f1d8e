/* Tests of common/heat.c against fake router traces: a Zipf-skewed trace ranks its
 * experts in the law's order and gives its top share; a trace whose hot set moves
 * is followed within a few half-lives, and not without decay; long runs stay finite;
 * bad sizes and ids are refused or ignored. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>

#include "heat.h"
#include "test_seed.h"
#include "test_trace.h"

enum { NE = 16, K = 2 };

static void test_heat_ranks_a_zipf_trace(void **state)
{
    (void)state;
    rng_t r = rng_for(3);
    int order[NE]; /* a shuffled rank -> expert map */
    trace_shuffle(&r, order, NE);
    double p[NE];
    trace_zipf(1.2, order, NE, p);
    bl_heat_t *h;
    bl_err_t err = {0};
    assert_int_equal(bl_heat_create(&h, 2, NE, 1e9, &err), 0);
    const int steps = 40000;
    for (int s = 0; s < steps; s++) {
        int32_t ids[K];
        trace_draw(&r, p, NE, K, ids);
        bl_heat_add(h, 1, ids, K);
        bl_heat_step(h);
    }
    assert_int_equal(bl_heat_layer_count(h, 1), (uint64_t)steps * K);
    assert_int_equal(bl_heat_layer_count(h, 0), 0);
    int32_t top[NE];
    assert_int_equal(bl_heat_top(h, 1, NE, top), NE);
    /* the three hottest are far apart in the law: their order is the law's */
    for (int i = 0; i < 3; i++)
        assert_int_equal(top[i], order[i]);
    uint64_t top4 = 0;
    for (int i = 0; i < 4; i++)
        top4 += bl_heat_count(h, 1, top[i]);
    const double share = (double)top4 / (double)(steps * K);
    assert_true(share > 0.50 && share < 0.75); /* two distinct draws per token flatten the law */
    for (int i = 1; i < NE; i++)
        assert_true(bl_heat_of(h, 1, top[i - 1]) >= bl_heat_of(h, 1, top[i]));
    bl_heat_free(h);
}

static void run_hot(bl_heat_t *h, rng_t *r, int first, int steps)
{
    double p[NE];
    for (int e = 0; e < NE; e++)
        p[e] = e >= first && e < first + 4 ? 0.2 : 0.2 / 12.0;
    for (int s = 0; s < steps; s++) {
        int32_t ids[K];
        trace_draw(r, p, NE, K, ids);
        bl_heat_add(h, 0, ids, K);
        bl_heat_step(h);
    }
}

static int top4_is(const bl_heat_t *h, int first)
{
    int32_t top[4];
    if (bl_heat_top(h, 0, 4, top) != 4)
        return 0;
    for (int i = 0; i < 4; i++)
        if (top[i] < first || top[i] >= first + 4)
            return 0;
    return 1;
}

static void test_heat_follows_a_moving_hot_set(void **state)
{
    (void)state;
    rng_t r = rng_for(4);
    bl_heat_t *h, *flat;
    bl_err_t err = {0};
    assert_int_equal(bl_heat_create(&h, 1, NE, 64, &err), 0);
    assert_int_equal(bl_heat_create(&flat, 1, NE, 1e9, &err), 0);
    rng_t r2 = r;
    run_hot(h, &r, 0, 4000);
    run_hot(flat, &r2, 0, 4000);
    assert_true(top4_is(h, 0));
    run_hot(h, &r, 12, 400); /* about six half-lives */
    run_hot(flat, &r2, 12, 400);
    assert_true(top4_is(h, 12));
    assert_true(top4_is(flat, 0)); /* without decay the old set's counts still win */
    bl_heat_free(h);
    bl_heat_free(flat);
}

static void test_heat_long_runs_and_bad_input(void **state)
{
    (void)state;
    bl_heat_t *h;
    bl_err_t err = {0};
    assert_int_equal(bl_heat_create(&h, 0, NE, 8, &err), BL_EINVAL);
    assert_int_equal(bl_heat_create(&h, 1, 0, 8, &err), BL_EINVAL);
    assert_int_equal(bl_heat_create(&h, 1, NE, 0, &err), BL_EINVAL);
    assert_int_equal(bl_heat_create(&h, 1, NE, NAN, &err), BL_EINVAL);
    assert_int_equal(bl_heat_create(&h, 3, NE, 1, &err), 0);
    const int32_t ids[4] = {5, -1, NE, 7};
    for (int s = 0; s < 3000; s++) { /* half-life 1: the weights pass 2^500 several times */
        bl_heat_add(h, 2, ids, 4);
        bl_heat_add(h, 3, ids, 4);  /* no such layer */
        bl_heat_add(h, -1, ids, 4); /* nor this */
        bl_heat_step(h);
    }
    assert_int_equal(bl_heat_count(h, 2, 5), 3000);
    assert_int_equal(bl_heat_count(h, 2, 7), 3000);
    assert_int_equal(bl_heat_layer_count(h, 2), 6000); /* -1 and NE not counted */
    assert_int_equal(bl_heat_count(h, 2, NE), 0);
    const double v = bl_heat_of(h, 2, 5);
    assert_true(isfinite(v) && v > 0.99 && v < 1.01); /* 1/2 + 1/4 + ...: each step halves them */
    assert_true(bl_heat_of(h, 2, 6) == 0.0);
    int32_t top[2];
    assert_int_equal(bl_heat_top(h, 2, 2, top), 2);
    assert_int_equal(top[0], 5); /* a tie: the lower id first */
    assert_int_equal(top[1], 7);
    assert_int_equal(bl_heat_top(h, 9, 2, top), 0);
    assert_int_equal(bl_heat_n_layer(h), 3);
    assert_int_equal(bl_heat_n_expert(h), NE);
    bl_heat_free(h);
    bl_heat_free(NULL);
}

int main(void)
{
    test_seed_init("test_common_heat");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_heat_ranks_a_zipf_trace),
        cmocka_unit_test(test_heat_follows_a_moving_hot_set),
        cmocka_unit_test(test_heat_long_runs_and_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
