/* Tests of common/resid.c (residency's policy) against fake router traces: on a
 * Zipf-skewed trace a budget of 4 of 16 slots ends up holding the law's hottest
 * experts and serves far more selections than a static choice of four; experts of
 * equal heat do not trade places every step; a hot set that moves is followed; the
 * budgets of a whole layer, of nothing and of one slot; a planned move takes the
 * leaving expert off the table at once and seats the arriving one only when
 * committed (or frees the slot when aborted); bad sizes are refused. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "heat.h"
#include "resid.h"
#include "test_seed.h"
#include "test_trace.h"

enum { NE = 16, K = 2, NL = 3 };

/* p[order[i]] = Zipf weight of rank i, over a random ranking. */
static void zipf(rng_t *r, double s, int *order, double *p)
{
    trace_shuffle(r, order, NE);
    trace_zipf(s, order, NE, p);
}

/* A step of the trace on every layer: the selections are counted as served by a slot
 * or not, then the heat steps, then a plan is made and committed at once (as the card
 * does when its copies finish between steps). Returns the moves made. */
static int64_t run(bl_resid_t *res, bl_heat_t *h, rng_t *r, double p[NL][NE], int steps, int64_t cap,
                   uint64_t *hits, uint64_t *sel)
{
    int64_t moves = 0;
    bl_resid_move_t mv[NL * NE];
    for (int s = 0; s < steps; s++) {
        for (int l = 0; l < NL; l++) {
            int32_t ids[K];
            trace_draw(r, p[l], NE, K, ids);
            for (int j = 0; j < K; j++) {
                *hits += bl_resid_slot(res, l, ids[j]) >= 0;
                (*sel)++;
            }
            bl_heat_add(h, l, ids, K);
        }
        bl_heat_step(h);
        const int64_t n = bl_resid_plan(res, h, cap, mv);
        for (int64_t i = 0; i < n; i++) {
            assert_true(mv[i].layer >= 0 && mv[i].layer < NL);
            assert_true(mv[i].slot >= 0 && mv[i].slot < bl_resid_slots(res, mv[i].layer));
            assert_true(mv[i].in != mv[i].out);
            assert_int_equal(bl_resid_slot(res, mv[i].layer, mv[i].in), -1);
        }
        bl_resid_commit(res);
        moves += n;
    }
    return moves;
}

/* Every layer's table: each slot held by at most one expert, none twice. */
static void check_tables(const bl_resid_t *res)
{
    for (int l = 0; l < NL; l++) {
        int seen[NE] = {0};
        const int32_t *t = bl_resid_table(res, l);
        for (int e = 0; e < NE; e++)
            if (t[e] >= 0) {
                assert_true(t[e] < bl_resid_slots(res, l));
                assert_int_equal(seen[t[e]], 0);
                seen[t[e]] = 1;
            }
    }
}

static void test_resid_seats_the_hottest_of_a_zipf_trace(void **state)
{
    (void)state;
    rng_t r = rng_for(1);
    double p[NL][NE];
    int order[NL][NE];
    for (int l = 0; l < NL; l++)
        zipf(&r, 1.2, order[l], p[l]);
    const int32_t slots[NL] = {4, 4, 4};
    bl_resid_t *res;
    bl_heat_t *h;
    bl_err_t err = {0};
    assert_int_equal(bl_resid_create(&res, NL, NE, slots, &err), 0);
    assert_int_equal(bl_heat_create(&h, NL, NE, 256, &err), 0);
    uint64_t hits = 0, sel = 0;
    run(res, h, &r, p, 2000, 8, &hits, &sel); /* warm up */
    check_tables(res);
    hits = sel = 0;
    const int64_t moves = run(res, h, &r, p, 8000, 8, &hits, &sel);
    check_tables(res);
    /* the law's three hottest of each layer are far apart: they hold slots */
    for (int l = 0; l < NL; l++)
        for (int i = 0; i < 3; i++)
            assert_true(bl_resid_slot(res, l, order[l][i]) >= 0);
    /* a static choice of four experts serves 4/16 of the selections on average; the
     * hottest four of this law about 60 % (two distinct draws flatten it) */
    const double rate = (double)hits / (double)sel;
    assert_true(rate > 0.5);
    assert_true(rate > 1.5 * 0.25);
    /* settled: the 4th and 5th hottest may trade now and then, not every step */
    assert_true(moves < 8000 / 20);
    bl_resid_free(res);
    bl_heat_free(h);
}

static void test_resid_equal_heats_do_not_thrash(void **state)
{
    (void)state;
    rng_t r = rng_for(2);
    double p[NL][NE];
    for (int l = 0; l < NL; l++)
        for (int e = 0; e < NE; e++)
            p[l][e] = 1.0 / NE;
    const int32_t slots[NL] = {8, 8, 8};
    bl_resid_t *res;
    bl_heat_t *h;
    bl_err_t err = {0};
    assert_int_equal(bl_resid_create(&res, NL, NE, slots, &err), 0);
    assert_int_equal(bl_heat_create(&h, NL, NE, 256, &err), 0);
    uint64_t hits = 0, sel = 0;
    run(res, h, &r, p, 2000, 64, &hits, &sel);
    hits = sel = 0;
    const int64_t moves = run(res, h, &r, p, 4000, 64, &hits, &sel);
    /* a uniform law: half the slots serve about half the selections, and the
     * hysteresis keeps noise from moving experts more than rarely */
    const double rate = (double)hits / (double)sel;
    assert_true(rate > 0.40 && rate < 0.60);
    assert_true(moves < 4000 / 10);
    bl_resid_free(res);
    bl_heat_free(h);
}

static void test_resid_follows_a_moving_hot_set(void **state)
{
    (void)state;
    rng_t r = rng_for(3);
    double p[NL][NE];
    for (int l = 0; l < NL; l++)
        for (int e = 0; e < NE; e++)
            p[l][e] = e < 4 ? 0.2 : 0.2 / 12.0;
    const int32_t slots[NL] = {4, 4, 4};
    bl_resid_t *res;
    bl_heat_t *h;
    bl_err_t err = {0};
    assert_int_equal(bl_resid_create(&res, NL, NE, slots, &err), 0);
    assert_int_equal(bl_heat_create(&h, NL, NE, 64, &err), 0);
    uint64_t hits = 0, sel = 0;
    run(res, h, &r, p, 3000, 4, &hits, &sel);
    for (int l = 0; l < NL; l++)
        for (int e = 0; e < 4; e++)
            assert_true(bl_resid_slot(res, l, e) >= 0);
    for (int l = 0; l < NL; l++)
        for (int e = 0; e < NE; e++)
            p[l][e] = e >= 12 ? 0.2 : 0.2 / 12.0;
    run(res, h, &r, p, 600, 4, &hits, &sel); /* about ten half-lives */
    for (int l = 0; l < NL; l++)
        for (int e = 12; e < NE; e++)
            assert_true(bl_resid_slot(res, l, e) >= 0);
    check_tables(res);
    bl_resid_free(res);
    bl_heat_free(h);
}

static void test_resid_budgets(void **state)
{
    (void)state;
    rng_t r = rng_for(4);
    double p[NL][NE];
    int order[NL][NE];
    for (int l = 0; l < NL; l++)
        zipf(&r, 1.0, order[l], p[l]);
    /* layer 0 whole, layer 1 none, layer 2 one slot */
    const int32_t slots[NL] = {NE, 0, 1};
    bl_resid_t *res;
    bl_heat_t *h;
    bl_err_t err = {0};
    assert_int_equal(bl_resid_create(&res, NL, NE, slots, &err), 0);
    assert_int_equal(bl_heat_create(&h, NL, NE, 256, &err), 0);
    uint64_t hits = 0, sel = 0;
    run(res, h, &r, p, 3000, 1000, &hits, &sel);
    check_tables(res);
    for (int e = 0; e < NE; e++) {
        if (bl_heat_count(h, 0, e) > 0) /* every expert ever chosen holds a slot */
            assert_true(bl_resid_slot(res, 0, e) >= 0);
        assert_int_equal(bl_resid_slot(res, 1, e), -1);
    }
    assert_true(bl_resid_slot(res, 2, order[2][0]) >= 0);
    int seated = 0;
    for (int e = 0; e < NE; e++)
        seated += bl_resid_slot(res, 2, e) >= 0;
    assert_int_equal(seated, 1);
    assert_int_equal(bl_resid_slots(res, 1), 0);
    assert_int_equal(bl_resid_slots(res, 9), 0);
    assert_null(bl_resid_table(res, NL));
    assert_int_equal(bl_resid_slot(res, 0, NE), -1);
    bl_resid_free(res);
    bl_heat_free(h);
}

static void test_resid_pending_moves(void **state)
{
    (void)state;
    const int32_t slots[1] = {1};
    bl_resid_t *res;
    bl_heat_t *h;
    bl_err_t err = {0};
    assert_int_equal(bl_resid_create(&res, 1, NE, slots, &err), 0);
    assert_int_equal(bl_heat_create(&h, 1, NE, 1e9, &err), 0);
    bl_resid_move_t mv[4];
    assert_int_equal(bl_resid_plan(res, h, 4, mv), 0); /* nothing chosen yet: nothing to seat */
    const int32_t five[1] = {5}, nine[1] = {9};
    bl_heat_add(h, 0, five, 1);
    assert_int_equal(bl_resid_plan(res, h, 4, mv), 1);
    assert_int_equal(mv[0].in, 5);
    assert_int_equal(mv[0].out, -1);
    assert_int_equal(mv[0].slot, 0);
    assert_int_equal(bl_resid_slot(res, 0, 5), -1); /* not until its bytes are in */
    assert_int_equal(bl_resid_plan(res, h, 4, mv), 0); /* one plan at a time */
    bl_resid_commit(res);
    assert_int_equal(bl_resid_slot(res, 0, 5), 0);
    for (int i = 0; i < 3; i++)
        bl_heat_add(h, 0, nine, 1);
    /* 3 > 1.25 * 1 + 1: nine displaces five, which leaves the table at once */
    assert_int_equal(bl_resid_plan(res, h, 4, mv), 1);
    assert_int_equal(mv[0].in, 9);
    assert_int_equal(mv[0].out, 5);
    assert_int_equal(bl_resid_slot(res, 0, 5), -1);
    assert_int_equal(bl_resid_slot(res, 0, 9), -1);
    bl_resid_abort(res); /* the copy failed: the slot is free */
    assert_int_equal(bl_resid_slot(res, 0, 9), -1);
    assert_int_equal(bl_resid_plan(res, h, 4, mv), 1);
    assert_int_equal(mv[0].in, 9);
    assert_int_equal(mv[0].out, -1);
    bl_resid_commit(res);
    assert_int_equal(bl_resid_slot(res, 0, 9), 0);
    /* 1 heat is not enough to take nine's place back */
    bl_heat_add(h, 0, five, 1);
    assert_int_equal(bl_resid_plan(res, h, 4, mv), 0);
    bl_resid_free(res);
    bl_heat_free(h);
}

static void test_resid_bad_sizes(void **state)
{
    (void)state;
    bl_resid_t *res;
    bl_err_t err = {0};
    const int32_t ok[2] = {1, 2}, neg[2] = {1, -1}, big[2] = {NE + 1, 0};
    assert_int_equal(bl_resid_create(&res, 0, NE, ok, &err), BL_EINVAL);
    assert_int_equal(bl_resid_create(&res, 2, 0, ok, &err), BL_EINVAL);
    assert_int_equal(bl_resid_create(&res, 2, NE, neg, &err), BL_EINVAL);
    assert_int_equal(bl_resid_create(&res, 2, NE, big, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "layer 0"));
    assert_int_equal(bl_resid_create(&res, 2, NE, ok, &err), 0);
    bl_heat_t *h;
    assert_int_equal(bl_heat_create(&h, 3, NE, 8, &err), 0);
    bl_resid_move_t mv[4];
    const int32_t one[1] = {1};
    bl_heat_add(h, 0, one, 1);
    assert_int_equal(bl_resid_plan(res, h, 4, mv), 0); /* a heat of another shape */
    assert_int_equal(bl_resid_plan(res, h, 0, mv), 0);
    bl_resid_free(res);
    bl_resid_free(NULL);
    bl_heat_free(h);
}

int main(void)
{
    test_seed_init("test_common_resid");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resid_seats_the_hottest_of_a_zipf_trace),
        cmocka_unit_test(test_resid_equal_heats_do_not_thrash),
        cmocka_unit_test(test_resid_follows_a_moving_hot_set),
        cmocka_unit_test(test_resid_budgets),
        cmocka_unit_test(test_resid_pending_moves),
        cmocka_unit_test(test_resid_bad_sizes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
