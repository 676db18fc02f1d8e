/* Tests of router/spool.c: every row of every run is called exactly once, on a
 * pool of 0 to 7 helpers, over many short runs back to back (a helper that wakes
 * late must not take a row of the next run with the last run's function), runs of
 * 0 and 1 rows, and the engine's default helper count. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdatomic.h>
#include <string.h>

#include "spool.h"

#define MAX_ROWS 64

typedef struct run {
    int tag;                 /* which run the function belongs to */
    atomic_int calls[MAX_ROWS];
    atomic_int wrong;        /* calls that saw another run's tag */
    const int *current;      /* the tag of the run in progress */
} run_t;

static void row_fn(void *ctx, int i)
{
    run_t *r = ctx;
    if (i < 0 || i >= MAX_ROWS || *r->current != r->tag)
        atomic_fetch_add(&r->wrong, 1);
    else
        atomic_fetch_add(&r->calls[i], 1);
}

static void test_spool_each_row_once(void **state)
{
    (void)state;
    const int helpers[] = {0, 1, 3, 7};
    for (size_t h = 0; h < sizeof helpers / sizeof helpers[0]; h++) {
        rt_spool_t *p = NULL;
        bl_err_t err = {0};
        assert_int_equal(rt_spool_create(&p, helpers[h], &err), 0);
        assert_int_equal(rt_spool_helpers(p), helpers[h]);
        static run_t runs[2];
        int current = 0;
        for (int k = 0; k < 3000; k++) {
            run_t *r = &runs[k & 1];
            memset(r, 0, sizeof *r);
            r->tag = k;
            r->current = &current;
            current = k;
            const int n = k % (MAX_ROWS + 1); /* 0 .. 64 rows */
            rt_spool_run(p, n, row_fn, r);
            current = -1; /* a call after the run returned would see it */
            assert_int_equal(atomic_load(&r->wrong), 0);
            for (int i = 0; i < MAX_ROWS; i++)
                assert_int_equal(atomic_load(&r->calls[i]), i < n ? 1 : 0);
        }
        rt_spool_destroy(p);
    }
}

static void test_spool_refuses_bad_counts(void **state)
{
    (void)state;
    rt_spool_t *p = (rt_spool_t *)1;
    bl_err_t err = {0};
    assert_int_equal(rt_spool_create(&p, -1, &err), BL_EINVAL);
    assert_null(p);
    assert_int_equal(rt_spool_create(&p, 65, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "helper"));
    rt_spool_destroy(NULL);
}

static void test_spool_default_helpers(void **state)
{
    (void)state;
    assert_int_equal(rt_spool_default_helpers(1, 64), 0);  /* one slot */
    assert_int_equal(rt_spool_default_helpers(8, 2), 0);   /* the CI machine */
    assert_int_equal(rt_spool_default_helpers(8, 4), 1);
    assert_int_equal(rt_spool_default_helpers(8, 16), 7);
    assert_int_equal(rt_spool_default_helpers(4, 16), 3);
    assert_int_equal(rt_spool_default_helpers(32, 128), 7);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spool_each_row_once),
        cmocka_unit_test(test_spool_refuses_bad_counts),
        cmocka_unit_test(test_spool_default_helpers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
