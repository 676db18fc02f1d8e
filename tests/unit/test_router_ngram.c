/* Tests of router/ngram.c: ngram-simple's match rules on small cases and against a
 * plain search over random sequences of a small vocabulary (many repeats), and
 * ngram-mod's table: what it records, its chains, n_min, the reset, and proposals
 * that always come from recorded tokens. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "ngram.h"
#include "test_seed.h"

static void test_ngram_simple_takes_the_newest_earlier_match(void **state)
{
    (void)state;
    /* the pending token 2 last: "1 2" was seen at 1, followed by 7 8 */
    const int32_t t[] = {99, 1, 2, 7, 8, 3, 4, 1, 2};
    int32_t out[8];
    assert_int_equal(rt_ngram_simple(t, 9, 2, 2, out, 8), 2);
    assert_int_equal(out[0], 7);
    assert_int_equal(out[1], 8);
    /* a pending token never seen after a 1: nothing */
    const int32_t u[] = {99, 1, 2, 7, 8, 3, 4, 1, 9};
    assert_int_equal(rt_ngram_simple(u, 9, 2, 2, out, 8), 0);
    /* the newest of two earlier matches */
    const int32_t v[] = {5, 1, 2, 7, 7, 1, 2, 8, 8, 6, 6, 1, 2};
    assert_int_equal(rt_ngram_simple(v, 13, 2, 2, out, 8), 2);
    assert_int_equal(out[0], 8);
    assert_int_equal(out[1], 8);
    /* cap bounds the count; size_m too */
    assert_int_equal(rt_ngram_simple(v, 13, 2, 2, out, 1), 1);
    /* one token, "2": last seen at 6, then at most size_m of what followed */
    assert_int_equal(rt_ngram_simple(v, 13, 1, 4, out, 8), 4);
    const int32_t want[] = {8, 8, 6, 6};
    assert_memory_equal(out, want, sizeof want);
    /* a match at 0 is not taken, nor one followed by fewer than size_n tokens */
    const int32_t x[] = {1, 2, 5, 5, 5, 5, 5, 5, 1, 2};
    assert_int_equal(rt_ngram_simple(x, 10, 2, 2, out, 8), 0);
    const int32_t y[] = {4, 4, 4, 4, 4, 4, 4, 4, 2, 2, 2};
    assert_int_equal(rt_ngram_simple(y, 11, 2, 4, out, 8), 0); /* "2 2" at 8: one token after it */
    const int32_t z[] = {4, 4, 4, 4, 4, 4, 1, 2, 3, 1, 2};
    assert_int_equal(rt_ngram_simple(z, 11, 2, 4, out, 8), 2); /* the tokens after, before the pending one */
    assert_int_equal(out[0], 3);
    assert_int_equal(out[1], 1);
}

/* The rules as the header states them, the plain way. */
static int simple_ref(const int32_t *t, int64_t n, int sn, int sm, int32_t *out, int cap)
{
    const int64_t cur = n - 1;
    if (cur <= (int64_t)sn + sm + 1)
        return 0;
    for (int64_t j = cur - sn - 1; j > 0; j--) {
        int eq = 1;
        for (int k = 0; k < sn; k++)
            eq &= t[j + k] == t[n - sn + k];
        if (!eq)
            continue;
        int64_t k = cur - (j + sn);
        if (k > sm)
            k = sm;
        if (k < sn)
            return 0;
        if (k > cap)
            k = cap;
        for (int64_t i = 0; i < k; i++)
            out[i] = t[j + sn + i];
        return (int)k;
    }
    return 0;
}

static void test_ngram_simple_matches_a_plain_search(void **state)
{
    (void)state;
    rng_t r = rng_for(1);
    int32_t t[400], a[64], b[64];
    for (int it = 0; it < 4000; it++) {
        const int n = 1 + (int)(rng_next(&r) % 400), vocab = 2 + (int)(rng_next(&r) % 6);
        for (int i = 0; i < n; i++)
            t[i] = (int32_t)(rng_next(&r) % (uint64_t)vocab);
        const int sn = 1 + (int)(rng_next(&r) % 8), sm = 1 + (int)(rng_next(&r) % 64);
        const int cap = 1 + (int)(rng_next(&r) % 64);
        const int ka = rt_ngram_simple(t, n, sn, sm, a, cap), kb = simple_ref(t, n, sn, sm, b, cap);
        assert_int_equal(ka, kb);
        assert_memory_equal(a, b, (size_t)ka * sizeof *a);
    }
}

static void test_ngram_simple_refuses_bad_sizes(void **state)
{
    (void)state;
    const int32_t t[] = {99, 1, 2, 7, 8, 3, 4, 1, 2};
    int32_t out[8];
    assert_int_equal(rt_ngram_simple(t, 9, 0, 2, out, 8), 0);
    assert_int_equal(rt_ngram_simple(t, 9, 2, 0, out, 8), 0);
    assert_int_equal(rt_ngram_simple(t, 9, 2, 2, out, 0), 0);
    assert_int_equal(rt_ngram_simple(NULL, 9, 2, 2, out, 8), 0);
    assert_int_equal(rt_ngram_simple(t, 9, 2, 2, out, 8), 2);
    /* the newest match decides, also when too few tokens follow it: "1 2" at 6 has
     * one token after it before the pending 2, and the one at 4 is not looked at */
    const int32_t r[] = {1, 2, 1, 2, 1, 2, 1, 2, 1, 2};
    assert_int_equal(rt_ngram_simple(r, 10, 2, 2, out, 8), 0);
}

static void test_ngram_map_k_remembers_what_each_key_had_taken(void **state)
{
    (void)state;
    rt_ngram_map_t m = {0};
    /* prompt of 12: "1 2" then 7 8 9 5 at 1; the reply from 12 on repeats "1 2" */
    int32_t t[32] = {99, 1, 2, 7, 8, 9, 5, 6, 6, 6, 6, 6, 3, 3, 1, 2};
    int32_t out[8];
    rt_ngram_map_begin(&m, 2, 3, 12);
    assert_int_equal(rt_ngram_map_draft(&m, t, 16, out, 8), 3); /* size_m at first */
    const int32_t want[] = {7, 8, 9};
    assert_memory_equal(out, want, sizeof want);
    assert_int_equal(m.n_keys, 1);
    rt_ngram_map_accept(&m, 1); /* the model took one: next time this key proposes one */
    assert_int_equal(rt_ngram_map_draft(&m, t, 16, out, 8), 1);
    assert_int_equal(out[0], 7);
    rt_ngram_map_accept(&m, 0); /* none: the key proposes nothing again */
    assert_int_equal(rt_ngram_map_draft(&m, t, 16, out, 8), 0);
    /* another key is another count; cap bounds a proposal */
    const int32_t u[] = {99, 1, 2, 7, 8, 9, 5, 6, 6, 6, 6, 6, 3, 3, 8, 9};
    assert_int_equal(rt_ngram_map_draft(&m, u, 16, out, 2), 2);
    assert_int_equal(out[0], 5);
    assert_int_equal(m.n_keys, 2);
    rt_ngram_map_accept(&m, 2);
    /* a new task whose prompt holds all the slot saw (a chat going on) keeps every
     * key and what it learned */
    rt_ngram_map_begin(&m, 2, 3, 16);
    assert_int_equal(m.n_keys, 2);
    assert_int_equal(rt_ngram_map_draft(&m, t, 16, out, 8), 0); /* still none: it took none */
    assert_int_equal(rt_ngram_map_draft(&m, u, 16, out, 8), 2); /* still two */
    /* a prompt shorter than what the slot saw (the last reply cut): the keys found
     * before the last prompt's end stay, the ones of its reply go */
    int32_t v[32] = {99, 1, 2, 7, 8, 9, 5, 6, 6, 6, 6, 6, 3, 3, 1, 2, 4, 4, 4, 4, 3, 3, 4, 4};
    assert_int_equal(rt_ngram_map_draft(&m, v, 24, out, 8), 3); /* "4 4" at 17, in the reply */
    assert_int_equal(m.n_keys, 3);
    rt_ngram_map_begin(&m, 2, 3, 20);
    assert_int_equal(m.n_keys, 2); /* the ones at 1 and 4 */
    assert_int_equal(rt_ngram_map_draft(&m, t, 16, out, 8), 0);
    /* shorter than the last prompt too: only the keys before its own last N + M tokens */
    rt_ngram_map_begin(&m, 2, 3, 8);
    assert_int_equal(m.n_keys, 1); /* at 1, not at 4 */
    /* keys of another N mean nothing */
    rt_ngram_map_begin(&m, 3, 3, 16);
    assert_int_equal(m.n_keys, 0);
    rt_ngram_map_begin(&m, 2, 3, 12);
    assert_int_equal(m.n_keys, 0);
    assert_int_equal(rt_ngram_map_draft(&m, t, 16, out, 8), 3);
    /* too short a sequence: no proposal (fewer than 2 N + M before the pending token) */
    assert_int_equal(rt_ngram_map_draft(&m, t, 7, out, 8), 0);
    rt_ngram_map_free(&m);
    rt_ngram_map_free(&m); /* twice is harmless */
}

/* Over random text: proposals are the tokens after an earlier occurrence of the key,
 * never more than size_m or cap, and a key's count follows what was taken. */
static void test_ngram_map_k_proposes_what_followed_a_match(void **state)
{
    (void)state;
    rng_t r = rng_for(3);
    int32_t t[500], out[64];
    for (int it = 0; it < 400; it++) {
        const int n = 1 + (int)(rng_next(&r) % 500), vocab = 2 + (int)(rng_next(&r) % 5);
        for (int i = 0; i < n; i++)
            t[i] = (int32_t)(rng_next(&r) % (uint64_t)vocab);
        const int sn = 1 + (int)(rng_next(&r) % 4), sm = 1 + (int)(rng_next(&r) % 16);
        rt_ngram_map_t m = {0};
        rt_ngram_map_begin(&m, sn, sm, (int64_t)(rng_next(&r) % (uint64_t)n));
        for (int64_t upto = 1; upto <= n; upto += 1 + (int64_t)(rng_next(&r) % 20)) {
            const int cap = 1 + (int)(rng_next(&r) % 16);
            const int k = rt_ngram_map_draft(&m, t, upto, out, cap);
            assert_true(k >= 0 && k <= sm && k <= cap);
            if (k > 0) { /* some earlier occurrence of the key is followed by out */
                int found = 0;
                for (int64_t j = 1; j + sn + k < upto && !found; j++)
                    found = memcmp(t + j, t + upto - sn, (size_t)sn * sizeof *t) == 0 &&
                            memcmp(t + j + sn, out, (size_t)k * sizeof *t) == 0;
                assert_true(found);
            }
            rt_ngram_map_accept(&m, (int)(rng_next(&r) % (uint64_t)(k + 1)));
        }
        assert_true(m.n_keys <= RT_NGRAM_MAP_KEYS);
        rt_ngram_map_free(&m);
    }
}

static void test_ngram_mod_chains_what_followed(void **state)
{
    (void)state;
    rt_ngram_mod_t *m = rt_ngram_mod_new(2, 1000);
    assert_non_null(m);
    assert_int_equal(rt_ngram_mod_entries(m), 1024);
    assert_int_equal(rt_ngram_mod_size_n(m), 2);
    const int32_t t[] = {1, 2, 3, 4, 5, 6, 1, 2};
    int32_t out[16];
    assert_int_equal(rt_ngram_mod_draft(m, t, 8, 0, 8, out, 16), 0); /* nothing recorded */
    /* the n-grams with a token after them: (1 2)->3 ... (5 6)->1, (6 1)->2 */
    assert_int_equal(rt_ngram_mod_add(m, t, 8, 0), 6);
    assert_int_equal(rt_ngram_mod_used(m), 6);
    /* the last two, 1 2, give 3, then 2 3 gives 4, ... until 6 1 2 3 ... loops */
    assert_int_equal(rt_ngram_mod_draft(m, t, 8, 0, 4, out, 16), 4);
    const int32_t want[] = {3, 4, 5, 6};
    assert_memory_equal(out, want, sizeof want);
    assert_int_equal(rt_ngram_mod_draft(m, t, 8, 0, 16, out, 5), 5); /* cap */
    /* a chain shorter than n_min is none: 9 after (2 8) is unknown */
    const int32_t u[] = {1, 2, 8};
    assert_int_equal(rt_ngram_mod_draft(m, u, 3, 1, 8, out, 16), 0);
    /* adding again from the mark adds nothing; a later token overwrites */
    assert_int_equal(rt_ngram_mod_add(m, t, 8, 6), 6);
    const int32_t w[] = {1, 2, 9};
    assert_int_equal(rt_ngram_mod_add(m, w, 3, 0), 1);
    assert_int_equal(rt_ngram_mod_used(m), 6);
    assert_int_equal(rt_ngram_mod_draft(m, t, 8, 0, 1, out, 16), 1);
    assert_int_equal(out[0], 9);
    rt_ngram_mod_reset(m);
    assert_int_equal(rt_ngram_mod_used(m), 0);
    assert_int_equal(rt_ngram_mod_draft(m, t, 8, 0, 8, out, 16), 0);
    rt_ngram_mod_free(m);
    assert_null(rt_ngram_mod_new(0, 1024));
    assert_null(rt_ngram_mod_new(RT_NGRAM_MAX_N + 1, 1024));
    rt_ngram_mod_free(NULL);
}

/* Over random text and a small table (many collisions): every proposal is a token
 * that was recorded, counts stay within n_max and cap, and none is below n_min. */
static void test_ngram_mod_proposes_recorded_tokens(void **state)
{
    (void)state;
    rng_t r = rng_for(2);
    int32_t t[600], out[64];
    for (int it = 0; it < 300; it++) {
        const int sn = 1 + (int)(rng_next(&r) % 6), vocab = 2 + (int)(rng_next(&r) % 40);
        rt_ngram_mod_t *m = rt_ngram_mod_new(sn, 1024);
        assert_non_null(m);
        const int n = 1 + (int)(rng_next(&r) % 600);
        for (int i = 0; i < n; i++)
            t[i] = 1000 + (int32_t)(rng_next(&r) % (uint64_t)vocab);
        int64_t mark = 0;
        for (int64_t upto = 1; upto <= n; upto += 1 + (int64_t)(rng_next(&r) % 50)) {
            mark = rt_ngram_mod_add(m, t, upto, mark);
            assert_true(mark <= upto);
            const int n_max = 1 + (int)(rng_next(&r) % 64), n_min = (int)(rng_next(&r) % 8);
            const int cap = 1 + (int)(rng_next(&r) % 64);
            const int k = rt_ngram_mod_draft(m, t, upto, n_min, n_max, out, cap);
            assert_true(k == 0 || (k >= n_min && k <= n_max && k <= cap));
            for (int i = 0; i < k; i++)
                assert_true(out[i] >= 1000 && out[i] < 1000 + vocab);
        }
        assert_true(rt_ngram_mod_used(m) <= rt_ngram_mod_entries(m));
        rt_ngram_mod_free(m);
    }
}

int main(void)
{
    test_seed_init("test_router_ngram");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ngram_simple_takes_the_newest_earlier_match),
        cmocka_unit_test(test_ngram_simple_matches_a_plain_search),
        cmocka_unit_test(test_ngram_simple_refuses_bad_sizes),
        cmocka_unit_test(test_ngram_map_k_remembers_what_each_key_had_taken),
        cmocka_unit_test(test_ngram_map_k_proposes_what_followed_a_match),
        cmocka_unit_test(test_ngram_mod_chains_what_followed),
        cmocka_unit_test(test_ngram_mod_proposes_recorded_tokens),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
