/* Tests of common/wmem.c: the load's copies on several threads give the bytes of
 * one memcpy per job, whatever the thread count and however the shares fall across
 * the jobs; the huge-page allocation refuses what it cannot give. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "test_seed.h"
#include "wmem.h"

static void test_copy_many_every_share(void **state)
{
    (void)state;
    rng_t r = rng_for(1);
    /* 70 MiB over jobs of odd sizes: past the bound where the threads start */
    const size_t sizes[] = {1, 4097, (size_t)33 << 20, 0, 12345, (size_t)37 << 20, 3};
    enum { NJ = sizeof sizes / sizeof sizes[0] };
    uint8_t *src[NJ], *dst[NJ];
    bl_wmem_job_t jobs[NJ];
    for (int i = 0; i < NJ; i++) {
        src[i] = malloc(sizes[i] + 1);
        dst[i] = malloc(sizes[i] + 1);
        assert_non_null(src[i]);
        assert_non_null(dst[i]);
        for (size_t j = 0; j < sizes[i]; j++)
            src[i][j] = (uint8_t)rng_next(&r);
        jobs[i] = (bl_wmem_job_t){dst[i], src[i], sizes[i]};
    }
    const int threads[] = {0, 1, 2, 3, 7, 64, 1000};
    for (size_t t = 0; t < sizeof threads / sizeof threads[0]; t++) {
        for (int i = 0; i < NJ; i++)
            memset(dst[i], 0xa5, sizes[i] + 1);
        bl_wmem_copy_many(jobs, NJ, threads[t]);
        for (int i = 0; i < NJ; i++) {
            assert_memory_equal(dst[i], src[i], sizes[i]);
            assert_int_equal(dst[i][sizes[i]], 0xa5); /* nothing past the job */
        }
    }
    bl_wmem_copy_many(NULL, 0, 4); /* nothing to copy */
    for (int i = 0; i < NJ; i++) {
        free(src[i]);
        free(dst[i]);
    }
}

/* The progress of a copy: first 0 of the total, then never back, never past the
 * total, always on the caller's thread, last the total; the bytes as without it. */
typedef struct seen {
    pthread_t caller;
    uint64_t total, last;
    int calls, off_thread, backwards;
} seen_t;

static void on_progress(void *ud, uint64_t done, uint64_t total)
{
    seen_t *s = ud;
    if (!pthread_equal(pthread_self(), s->caller))
        s->off_thread++;
    if (s->calls == 0)
        assert_int_equal(done, 0);
    if (done < s->last || done > total)
        s->backwards++;
    s->last = done;
    s->total = total;
    s->calls++;
}

static void test_copy_progress(void **state)
{
    (void)state;
    rng_t r = rng_for(2);
    const size_t sizes[] = {(size_t)40 << 20, 7, (size_t)41 << 20, 65536};
    enum { NJ = sizeof sizes / sizeof sizes[0] };
    uint8_t *src[NJ], *dst[NJ];
    bl_wmem_job_t jobs[NJ];
    uint64_t total = 0;
    for (int i = 0; i < NJ; i++) {
        src[i] = malloc(sizes[i]);
        dst[i] = malloc(sizes[i]);
        assert_non_null(src[i]);
        assert_non_null(dst[i]);
        for (size_t j = 0; j < sizes[i]; j++)
            src[i][j] = (uint8_t)rng_next(&r);
        jobs[i] = (bl_wmem_job_t){dst[i], src[i], sizes[i]};
        total += sizes[i];
    }
    const int threads[] = {1, 3};
    for (size_t t = 0; t < sizeof threads / sizeof threads[0]; t++) {
        seen_t s = {.caller = pthread_self()};
        for (int i = 0; i < NJ; i++)
            memset(dst[i], 0, sizes[i]);
        bl_wmem_copy_many_progress(jobs, NJ, threads[t], on_progress, &s);
        for (int i = 0; i < NJ; i++)
            assert_memory_equal(dst[i], src[i], sizes[i]);
        assert_true(s.calls >= 2);
        assert_int_equal(s.off_thread, 0);
        assert_int_equal(s.backwards, 0);
        assert_int_equal(s.last, total);
        assert_int_equal(s.total, total);
    }
    seen_t none = {.caller = pthread_self()};
    bl_wmem_copy_many_progress(NULL, 0, 2, on_progress, &none); /* nothing: 0 of 0, twice */
    assert_int_equal(none.last, 0);
    assert_int_equal(none.backwards, 0);
    for (int i = 0; i < NJ; i++) {
        free(src[i]);
        free(dst[i]);
    }
}

static void test_alloc_refusals(void **state)
{
    (void)state;
    size_t len = 1;
    assert_null(bl_wmem_alloc(0, 0, &len));
    assert_int_equal(len, 0);
    assert_null(bl_wmem_alloc(UINT64_MAX, 1, &len)); /* past what a size can hold */
    assert_null(bl_wmem_alloc((uint64_t)1 << 62, 0, &len)); /* past half the RAM, not forced */
    void *p = bl_wmem_alloc(3 << 20, 0, &len);
    assert_non_null(p);
    assert_int_equal(len, (size_t)4 << 20); /* whole huge pages */
    memset(p, 1, len);
    assert_int_equal(munmap(p, len), 0);
}

/* The copy leaves max(2 GiB, RAM / 10) of the available memory: a 60 GiB file in
 * tmpfs on a 125 GiB machine leaves about 62 GiB available, too little for its copy. */
static void test_margin(void **state)
{
    (void)state;
    const uint64_t G = (uint64_t)1 << 30;
    assert_int_equal(bl_wmem_leaves_margin(57 * G, 62 * G, 125 * G), 0);
    assert_int_equal(bl_wmem_leaves_margin(40 * G, 62 * G, 125 * G), 1);  /* 22 GiB left, 12.5 needed */
    assert_int_equal(bl_wmem_leaves_margin(50 * G, 62 * G, 125 * G), 0);  /* 12 GiB left */
    assert_int_equal(bl_wmem_leaves_margin(3 * G, 6 * G, 8 * G), 1);      /* 3 GiB left, 2 needed */
    assert_int_equal(bl_wmem_leaves_margin(5 * G, 6 * G, 8 * G), 0);      /* 1 GiB left */
    assert_int_equal(bl_wmem_leaves_margin(7 * G, 6 * G, 8 * G), 0);      /* more than there is */
    assert_int_equal(bl_wmem_leaves_margin(7 * G, 0, 0), 1);              /* unknown: the old rule */
    size_t len = 1;
    const uint64_t avail = bl_mem_available();
    if (avail > 2 * G) { /* the available memory itself, unforced: refused */
        assert_null(bl_wmem_alloc(avail - G, 0, &len));
        assert_int_equal(len, 0);
    }
}

/* The room for a copy that may take a part: the whole when it leaves the margin,
 * else what does in whole huge pages, never past half the RAM, nothing when even the
 * margin is not there. */
static void test_room(void **state)
{
    (void)state;
    const uint64_t G = (uint64_t)1 << 30, H = (uint64_t)2 << 20;
    assert_int_equal(bl_wmem_room(40 * G, 62 * G, 125 * G), 40 * G);        /* fits: all of it */
    assert_int_equal(bl_wmem_room(57 * G, 62 * G, 125 * G), 62 * G - 125 * G / 10); /* to the margin */
    assert_int_equal(bl_wmem_room(57 * G, 62 * G, 125 * G) % H, 0);
    assert_true(bl_wmem_room(57 * G, 62 * G, 125 * G) + 125 * G / 10 <= 62 * G);
    assert_int_equal(bl_wmem_room(100 * G, 120 * G, 125 * G), 125 * G / 2 / H * H); /* half the RAM */
    assert_int_equal(bl_wmem_room(5 * G, 2 * G, 8 * G), 0);                 /* under the margin */
    assert_int_equal(bl_wmem_room(3 * G, 0, 8 * G), 3 * G);                 /* unknown: all of it */
    assert_int_equal(bl_wmem_room(3 * G + 5, 0, 0), 3 * G + 5);
    assert_int_equal(bl_wmem_room(0, 62 * G, 125 * G), 0);
}

/* The read rate is measured, not made up: some MB/s with one thread and with two,
 * below what any memory reads (10 TB/s); a thread count out of range is clamped. */
static void test_read_rate(void **state)
{
    (void)state;
    const uint32_t one = bl_mem_read_mbps(1), two = bl_mem_read_mbps(2), many = bl_mem_read_mbps(1000);
    print_message("read rate: %u MB/s with one thread, %u with two, %u with 64\n", one, two, many);
    assert_true(one > 0 && one < 10000000);
    assert_true(two > 0 && two < 10000000);
    assert_true(many > 0 && many < 10000000);
    assert_true(bl_mem_read_mbps(0) > 0);
}

int main(void)
{
    test_seed_init("test_common_wmem");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_copy_many_every_share),
        cmocka_unit_test(test_copy_progress),
        cmocka_unit_test(test_alloc_refusals),
        cmocka_unit_test(test_margin),
        cmocka_unit_test(test_room),
        cmocka_unit_test(test_read_rate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
