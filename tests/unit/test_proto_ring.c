/* Tests of proto/ring.c: round trips with random sizes across the wrap, full and empty
 * edges, the size limit, two processes exchanging 100k messages through the doorbell,
 * park and wake, timeouts, the closed flag, a producer waiting for the consumer's
 * releases, and corrupt shared bytes refused with BL_EPROTO. Also prints (never asserts) the one-way wake latency and throughput. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ring.h"
#include "ring_impl.h"
#include "rng.h"

static uint64_t g_seed;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The bytes of message i: a function of i and the position, so order and content
 * are both checked. */
static void fill(uint8_t *p, size_t n, uint64_t i)
{
    for (size_t k = 0; k < n; k++)
        p[k] = (uint8_t)(i * 131u + k * 7u + (k >> 8));
}

static int check(const uint8_t *p, size_t n, uint64_t i)
{
    for (size_t k = 0; k < n; k++)
        if (p[k] != (uint8_t)(i * 131u + k * 7u + (k >> 8)))
            return 0;
    return 1;
}

/* A producer and a consumer handle on one memfd ring in this process. */
static void make_pair(size_t cap, bp_ring_t **prod, bp_ring_t **cons)
{
    bl_err_t err = {0};
    assert_int_equal(bp_ring_create(prod, "t", cap, BP_RING_PRODUCER, &err), 0);
    assert_int_equal(bp_ring_attach_fd(cons, bp_ring_fd(*prod), "t", BP_RING_CONSUMER, &err), 0);
}

static void test_ring_round_trip_random_sizes_with_wrap(void **state)
{
    (void)state;
    bp_ring_t *p, *c;
    make_pair(4096, &p, &c);
    bl_rng_t rng;
    bl_rng_seed(&rng, g_seed);
    size_t max = bp_ring_max_msg(4096);
    uint8_t buf[4096];
    bl_err_t err = {0};
    uint64_t sent = 0, got = 0;
    /* Push a random number of random-size messages, then pop a random number: the
     * fill level wanders over the whole ring, so every wrap offset is hit. */
    for (int round = 0; round < 20000; round++) {
        int n = (int)(bl_rng_next(&rng) % 5);
        for (int k = 0; k < n; k++) {
            uint64_t r = bl_rng_next(&rng);
            size_t len = (r & 3) == 0 ? (size_t)(r >> 8) % (max + 1) : (size_t)(r >> 8) % 200;
            fill(buf, len, sent);
            int rc = bp_ring_push(p, buf, len, 0, &err);
            if (rc == BL_EAGAIN)
                break;
            assert_int_equal(rc, 0);
            sent++;
        }
        int m = (int)(bl_rng_next(&rng) % 6);
        for (int k = 0; k < m && got < sent; k++) {
            size_t len;
            assert_int_equal(bp_ring_pop(c, buf, sizeof buf, &len, 0, &err), 0);
            assert_true(check(buf, len, got));
            got++;
        }
    }
    size_t len;
    while (got < sent) {
        assert_int_equal(bp_ring_pop(c, buf, sizeof buf, &len, 0, &err), 0);
        assert_true(check(buf, len, got));
        got++;
    }
    assert_int_equal(bp_ring_pop(c, buf, sizeof buf, &len, 0, &err), BL_EAGAIN);
    bp_ring_destroy(c);
    bp_ring_destroy(p);
}

static void test_ring_full_and_empty_edges(void **state)
{
    (void)state;
    bp_ring_t *p, *c;
    make_pair(4096, &p, &c);
    bl_err_t err = {0};
    uint8_t buf[64] = {0};
    size_t len;
    /* Empty: nothing to pop, no waiting. */
    assert_int_equal(bp_ring_pop(c, buf, sizeof buf, &len, 0, &err), BL_EAGAIN);
    /* 48-byte payloads make 64-byte records: exactly 64 fill the ring. */
    for (int i = 0; i < 64; i++) {
        fill(buf, 48, (uint64_t)i);
        assert_int_equal(bp_ring_push(p, buf, 48, 0, &err), 0);
    }
    assert_int_equal(bp_ring_push(p, buf, 0, 0, &err), BL_EAGAIN);
    assert_non_null(strstr(err.msg, "full"));
    /* One out makes room for exactly one more. */
    assert_int_equal(bp_ring_pop(c, buf, sizeof buf, &len, 0, &err), 0);
    assert_int_equal(len, 48);
    assert_true(check(buf, 48, 0));
    assert_int_equal(bp_ring_push(p, buf, 48, 0, &err), 0);
    assert_int_equal(bp_ring_push(p, buf, 0, 0, &err), BL_EAGAIN);
    /* A buffer too small leaves the message in place. */
    assert_int_equal(bp_ring_pop(c, buf, 10, &len, 0, &err), BL_ERANGE);
    assert_int_equal(len, 48);
    assert_int_equal(bp_ring_pop(c, buf, sizeof buf, &len, 0, &err), 0);
    assert_true(check(buf, 48, 1));
    /* Zero-length messages round-trip. */
    bp_ring_destroy(c);
    bp_ring_destroy(p);
    make_pair(4096, &p, &c);
    assert_int_equal(bp_ring_push(p, NULL, 0, 0, &err), 0);
    assert_int_equal(bp_ring_pop(c, buf, sizeof buf, &len, 0, &err), 0);
    assert_int_equal(len, 0);
    bp_ring_destroy(c);
    bp_ring_destroy(p);
}

static void test_ring_rejects_message_larger_than_limit(void **state)
{
    (void)state;
    bp_ring_t *p, *c;
    make_pair(8192, &p, &c);
    bl_err_t err = {0};
    void *dst;
    size_t max = bp_ring_max_msg(8192);
    assert_int_equal(bp_ring_reserve(p, max + 1, &dst, 0, &err), BL_ERANGE);
    assert_non_null(strstr(err.msg, "exceeds the limit"));
    assert_null(dst);
    /* The largest message passes at every offset, the padding included. */
    static uint8_t big[8192];
    size_t len;
    for (int i = 0; i < 7; i++) {
        assert_int_equal(bp_ring_push(p, big, 100 * (size_t)i, 0, &err), 0);
        assert_int_equal(bp_ring_pop(c, big, sizeof big, &len, 0, &err), 0);
        fill(big, max, (uint64_t)i);
        assert_int_equal(bp_ring_push(p, big, max, 0, &err), 0);
        memset(big, 0, sizeof big);
        assert_int_equal(bp_ring_pop(c, big, sizeof big, &len, 0, &err), 0);
        assert_int_equal(len, max);
        assert_true(check(big, max, (uint64_t)i));
    }
    bp_ring_destroy(c);
    bp_ring_destroy(p);
}

static void test_ring_rejects_bad_capacity_and_role(void **state)
{
    (void)state;
    bp_ring_t *r;
    bl_err_t err = {0};
    assert_int_equal(bp_ring_create(&r, "odd", 5000, BP_RING_PRODUCER, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "odd"));
    assert_int_equal(bp_ring_create(&r, "tiny", 1024, BP_RING_PRODUCER, &err), BL_EINVAL);
    assert_int_equal(bp_ring_create(&r, "role", 4096, (bp_ring_role_t)7, &err), BL_EINVAL);
    assert_null(r);
}

static void test_ring_zero_copy_reserve_commit_peek_release(void **state)
{
    (void)state;
    bp_ring_t *p, *c;
    make_pair(4096, &p, &c);
    bl_err_t err = {0};
    void *dst;
    assert_int_equal(bp_ring_reserve(p, 100, &dst, 0, &err), 0);
    assert_int_equal((uintptr_t)dst % BP_RING_ALIGN, 0);
    memcpy(dst, "hello", 5);
    assert_int_equal(bp_ring_commit(p, 200, &err), BL_EINVAL);
    assert_int_equal(bp_ring_commit(p, 5, &err), 0);
    assert_int_equal(bp_ring_commit(p, 5, &err), BL_EINVAL);
    const void *src;
    size_t len;
    assert_int_equal(bp_ring_peek(c, &src, &len, 0, &err), 0);
    assert_int_equal(len, 5);
    assert_memory_equal(src, "hello", 5);
    const void *again;
    assert_int_equal(bp_ring_peek(c, &again, &len, 0, &err), 0);
    assert_ptr_equal(again, src);
    bp_ring_release(c);
    assert_int_equal(bp_ring_peek(c, &src, &len, 0, &err), BL_EAGAIN);
    /* Wrong side. */
    assert_int_equal(bp_ring_peek(p, &src, &len, 0, &err), BL_EINVAL);
    assert_int_equal(bp_ring_reserve(c, 1, &dst, 0, &err), BL_EINVAL);
    bp_ring_destroy(c);
    bp_ring_destroy(p);
}

static void test_ring_timeout_when_peer_silent(void **state)
{
    (void)state;
    bp_ring_t *p, *c;
    make_pair(4096, &p, &c);
    bl_err_t err = {0};
    uint8_t buf[2048] = {0};
    size_t len;
    uint64_t t0 = now_ns();
    assert_int_equal(bp_ring_pop(c, buf, sizeof buf, &len, 20000, &err), BL_ETIMEDOUT);
    uint64_t dt = now_ns() - t0;
    assert_true(dt >= 20000000ull);
    assert_non_null(strstr(err.msg, "producer stalled"));
    /* And the producer side, with a full ring. */
    assert_int_equal(bp_ring_push(p, buf, bp_ring_max_msg(4096), 0, &err), 0);
    assert_int_equal(bp_ring_push(p, buf, bp_ring_max_msg(4096), 0, &err), 0);
    assert_int_equal(bp_ring_push(p, buf, bp_ring_max_msg(4096), 0, &err), BL_EAGAIN);
    assert_int_equal(bp_ring_push(p, buf, bp_ring_max_msg(4096), 20000, &err), BL_ETIMEDOUT);
    assert_non_null(strstr(err.msg, "consumer stalled"));
    bp_ring_destroy(c);
    bp_ring_destroy(p);
}

static void test_ring_closed_flag(void **state)
{
    (void)state;
    bp_ring_t *p, *c;
    make_pair(4096, &p, &c);
    bl_err_t err = {0};
    uint8_t buf[64];
    size_t len;
    assert_int_equal(bp_ring_push(p, "a", 1, 0, &err), 0);
    assert_int_equal(bp_ring_push(p, "b", 1, 0, &err), 0);
    bp_ring_close(p);
    assert_true(bp_ring_peer_closed(c));
    /* What was sent before the close is still delivered, then BL_ECLOSED. */
    assert_int_equal(bp_ring_pop(c, buf, sizeof buf, &len, 1000, &err), 0);
    assert_int_equal(buf[0], 'a');
    assert_int_equal(bp_ring_pop(c, buf, sizeof buf, &len, 1000, &err), 0);
    assert_int_equal(buf[0], 'b');
    assert_int_equal(bp_ring_pop(c, buf, sizeof buf, &len, 1000000, &err), BL_ECLOSED);
    bp_ring_destroy(c);
    bp_ring_destroy(p);
    /* A closed consumer stops the producer at once. */
    make_pair(4096, &p, &c);
    bp_ring_close(c);
    assert_int_equal(bp_ring_push(p, "a", 1, 1000000, &err), BL_ECLOSED);
    assert_non_null(strstr(err.msg, "consumer closed"));
    bp_ring_destroy(c);
    bp_ring_destroy(p);
}

/* A second, independent mapping of the segment: the test plays a hostile peer. */
static ring_shared_t *evil_map(bp_ring_t *r)
{
    void *m = mmap(NULL, BP_RING_HDR_NBYTES + bp_ring_capacity(r), PROT_READ | PROT_WRITE,
                   MAP_SHARED, bp_ring_fd(r), 0);
    assert_true(m != MAP_FAILED);
    return m;
}

static void evil_unmap(bp_ring_t *r, ring_shared_t *sh)
{
    munmap(sh, BP_RING_HDR_NBYTES + bp_ring_capacity(r));
}

static void expect_corrupt_frame(void (*mutate)(ring_shared_t *sh, uint8_t *data),
                                 const char *field)
{
    bp_ring_t *p, *c;
    make_pair(4096, &p, &c);
    bl_err_t err = {0};
    assert_int_equal(bp_ring_push(p, "0123456789", 10, 0, &err), 0);
    ring_shared_t *sh = evil_map(p);
    mutate(sh, (uint8_t *)sh + BP_RING_HDR_NBYTES);
    const void *src;
    size_t len;
    assert_int_equal(bp_ring_peek(c, &src, &len, 0, &err), BL_EPROTO);
    assert_non_null(strstr(err.msg, field));
    /* The handle stays broken. */
    assert_int_equal(bp_ring_peek(c, &src, &len, 0, &err), BL_EPROTO);
    evil_unmap(p, sh);
    bp_ring_destroy(c);
    bp_ring_destroy(p);
}

static void mut_len_huge(ring_shared_t *sh, uint8_t *d) { (void)sh; ((ring_frame_t *)d)->len = 0xfffffff0u; }
static void mut_len_past_head(ring_shared_t *sh, uint8_t *d) { (void)sh; ((ring_frame_t *)d)->len = 100; }
static void mut_flags(ring_shared_t *sh, uint8_t *d) { (void)sh; ((ring_frame_t *)d)->flags = 77; }
static void mut_seq(ring_shared_t *sh, uint8_t *d) { (void)sh; ((ring_frame_t *)d)->seq = 5; }
static void mut_bad_pad(ring_shared_t *sh, uint8_t *d) { (void)sh; ((ring_frame_t *)d)->flags = RING_FRAME_PAD; }
static void mut_head_far(ring_shared_t *sh, uint8_t *d)
{
    (void)d;
    atomic_store(&sh->head, (uint64_t)1 << 40);
}
static void mut_head_unaligned(ring_shared_t *sh, uint8_t *d)
{
    (void)d;
    atomic_store(&sh->head, 33);
}

static void test_ring_corrupt_header_is_eproto(void **state)
{
    (void)state;
    expect_corrupt_frame(mut_len_huge, "length");
    expect_corrupt_frame(mut_len_past_head, "length past head");
    expect_corrupt_frame(mut_flags, "flags");
    expect_corrupt_frame(mut_seq, "sequence");
    expect_corrupt_frame(mut_bad_pad, "pad length");
}

static void test_ring_corrupt_head_index_is_eproto(void **state)
{
    (void)state;
    bp_ring_t *p, *c;
    make_pair(4096, &p, &c);
    bl_err_t err = {0};
    ring_shared_t *sh = evil_map(p);
    mut_head_far(sh, NULL);
    const void *src;
    size_t len;
    assert_int_equal(bp_ring_peek(c, &src, &len, 0, &err), BL_EPROTO);
    assert_non_null(strstr(err.msg, "producer head"));
    evil_unmap(p, sh);
    bp_ring_destroy(c);
    bp_ring_destroy(p);

    make_pair(4096, &p, &c);
    sh = evil_map(p);
    mut_head_unaligned(sh, NULL);
    assert_int_equal(bp_ring_peek(c, &src, &len, 0, &err), BL_EPROTO);
    evil_unmap(p, sh);
    bp_ring_destroy(c);
    bp_ring_destroy(p);
}

static void test_ring_corrupt_tail_index_is_eproto(void **state)
{
    (void)state;
    bp_ring_t *p, *c;
    make_pair(4096, &p, &c);
    bl_err_t err = {0};
    uint8_t buf[2000] = {0};
    assert_int_equal(bp_ring_push(p, buf, 1500, 0, &err), 0);
    assert_int_equal(bp_ring_push(p, buf, 1500, 0, &err), 0);
    ring_shared_t *sh = evil_map(p);
    /* A tail ahead of head would claim room that is not free. */
    atomic_store(&sh->tail, (uint64_t)1 << 20);
    assert_int_equal(bp_ring_push(p, buf, 1500, 0, &err), BL_EPROTO);
    assert_non_null(strstr(err.msg, "consumer tail"));
    evil_unmap(p, sh);
    bp_ring_destroy(c);
    bp_ring_destroy(p);
}

/* bp_ring_wait_consumed: done at once for what was released, a wait for the rest, a
 * release by another process wakes it, a closed consumer ends it, and a count past
 * what was produced, or one going back, breaks the handle. */
static void test_ring_wait_consumed(void **state)
{
    (void)state;
    bp_ring_t *p, *c;
    make_pair(4096, &p, &c);
    bl_err_t err = {0};
    assert_int_equal(bp_ring_produced(p), 0);
    assert_int_equal(bp_ring_produced(c), 0);
    assert_int_equal(bp_ring_wait_consumed(p, 0, 0, &err), 0);
    assert_int_equal(bp_ring_wait_consumed(p, 1, 0, &err), BL_EINVAL); /* never produced */
    assert_int_equal(bp_ring_wait_consumed(c, 0, 0, &err), BL_EINVAL); /* the consumer's end */
    for (int i = 0; i < 3; i++)
        assert_int_equal(bp_ring_push(p, "abc", 3, 0, &err), 0);
    assert_int_equal(bp_ring_produced(p), 3);
    assert_int_equal(bp_ring_wait_consumed(p, 1, 0, &err), BL_EAGAIN);
    assert_int_equal(bp_ring_wait_consumed(p, 1, 2000, &err), BL_ETIMEDOUT);
    const void *src;
    size_t len;
    assert_int_equal(bp_ring_peek(c, &src, &len, 0, &err), 0);
    assert_int_equal(bp_ring_wait_consumed(p, 1, 0, &err), BL_EAGAIN); /* peeked is not released */
    bp_ring_release(c);
    assert_int_equal(bp_ring_wait_consumed(p, 1, 0, &err), 0);
    assert_int_equal(bp_ring_wait_consumed(p, 2, 0, &err), BL_EAGAIN);
    /* another process releases the second message while this one is parked */
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        usleep(20000);
        bl_err_t e = {0};
        if (bp_ring_peek(c, &src, &len, 1000000, &e) != 0)
            _exit(1);
        bp_ring_release(c);
        _exit(0);
    }
    bp_ring_set_spin_us(p, 0);
    assert_int_equal(bp_ring_wait_consumed(p, 2, 5000000, &err), 0);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    /* the consumer closes: a wait for the third ends */
    bp_ring_close(c);
    assert_int_equal(bp_ring_wait_consumed(p, 3, 1000, &err), BL_ECLOSED);
    bp_ring_destroy(c);
    bp_ring_destroy(p);

    /* a hostile consumer's counts */
    make_pair(4096, &p, &c);
    assert_int_equal(bp_ring_push(p, "abc", 3, 0, &err), 0);
    ring_shared_t *sh = evil_map(p);
    atomic_store(&sh->consumed, 7); /* more than was ever produced */
    assert_int_equal(bp_ring_wait_consumed(p, 1, 0, &err), BL_EPROTO);
    assert_non_null(strstr(err.msg, "consumer count"));
    assert_int_equal(bp_ring_wait_consumed(p, 0, 0, &err), BL_EPROTO); /* broken for good */
    evil_unmap(p, sh);
    bp_ring_destroy(c);
    bp_ring_destroy(p);
    make_pair(4096, &p, &c);
    assert_int_equal(bp_ring_push(p, "abc", 3, 0, &err), 0);
    assert_int_equal(bp_ring_peek(c, &src, &len, 0, &err), 0);
    bp_ring_release(c);
    assert_int_equal(bp_ring_wait_consumed(p, 1, 0, &err), 0);
    sh = evil_map(p);
    atomic_store(&sh->consumed, 0); /* going back */
    assert_int_equal(bp_ring_wait_consumed(p, 1, 0, &err), BL_EPROTO);
    evil_unmap(p, sh);
    bp_ring_destroy(c);
    bp_ring_destroy(p);
}

static void test_ring_attach_rejects_bad_segment(void **state)
{
    (void)state;
    bp_ring_t *p, *c;
    bl_err_t err = {0};
    assert_int_equal(bp_ring_create(&p, "m", 4096, BP_RING_PRODUCER, &err), 0);
    ring_shared_t *sh = evil_map(p);
    sh->magic = 1;
    assert_int_equal(bp_ring_attach_fd(&c, bp_ring_fd(p), "m", BP_RING_CONSUMER, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "magic"));
    sh->magic = BP_RING_MAGIC;
    sh->capacity = 1u << 30;
    assert_int_equal(bp_ring_attach_fd(&c, bp_ring_fd(p), "m", BP_RING_CONSUMER, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "capacity"));
    assert_null(c);
    evil_unmap(p, sh);
    bp_ring_destroy(p);
    /* Not sealed: a plain memfd. */
    int fd = memfd_create("plain", 0);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, 8192), 0);
    assert_int_equal(bp_ring_attach_fd(&c, fd, "plain", BP_RING_CONSUMER, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "sealed"));
    close(fd);
}

static void test_ring_shm_name_create_attach(void **state)
{
    (void)state;
    char name[64];
    snprintf(name, sizeof name, "/bloomery-test-ring-%d", (int)getpid());
    bp_ring_t *p, *c;
    bl_err_t err = {0};
    assert_int_equal(bp_ring_create_shm(&p, name, 8192, BP_RING_PRODUCER, &err), 0);
    assert_int_equal(bp_ring_create_shm(&c, name, 8192, BP_RING_CONSUMER, &err), BL_EIO);
    assert_int_equal(bp_ring_attach_shm(&c, name, BP_RING_CONSUMER, &err), 0);
    assert_int_equal(bp_ring_unlink_shm(name, &err), 0);
    assert_int_equal(bp_ring_push(p, "xyz", 3, 0, &err), 0);
    uint8_t buf[8];
    size_t len;
    assert_int_equal(bp_ring_pop(c, buf, sizeof buf, &len, 0, &err), 0);
    assert_memory_equal(buf, "xyz", 3);
    bp_ring_destroy(c);
    bp_ring_destroy(p);
    assert_int_equal(bp_ring_attach_shm(&c, name, BP_RING_CONSUMER, &err), BL_ENOENT);
}

/* A consumer process that dies without closing (SIGKILL): the producer fills the ring
 * and then gets BL_ETIMEDOUT, not a hang. */
static void test_ring_dead_peer_is_a_timeout(void **state)
{
    (void)state;
    bp_ring_t *p;
    bl_err_t err = {0};
    assert_int_equal(bp_ring_create(&p, "dead", 4096, BP_RING_PRODUCER, &err), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        bp_ring_t *c;
        if (bp_ring_attach_fd(&c, bp_ring_fd(p), "dead", BP_RING_CONSUMER, &err))
            _exit(1);
        uint8_t b[64];
        size_t len;
        if (bp_ring_pop(c, b, sizeof b, &len, 5000000, &err))
            _exit(2);
        pause(); /* killed here, never closing */
        _exit(3);
    }
    assert_int_equal(bp_ring_push(p, "x", 1, 0, &err), 0);
    /* Wait until the child took it (the shared tail moves), then kill it. */
    ring_shared_t *sh = evil_map(p);
    while (atomic_load(&sh->tail) == 0)
        usleep(1000);
    evil_unmap(p, sh);
    kill(pid, SIGKILL);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status));
    uint8_t buf[1024] = {0};
    int rc = 0;
    for (int i = 0; i < 10 && rc == 0; i++)
        rc = bp_ring_push(p, buf, sizeof buf, 50000, &err);
    assert_int_equal(rc, BL_ETIMEDOUT);
    assert_non_null(strstr(err.msg, "dead"));
    bp_ring_destroy(p);
}

/* A second reserve before commit replaces the first, also when the first wrote a pad. */
static void test_ring_replaced_reservation(void **state)
{
    (void)state;
    bp_ring_t *p, *c;
    make_pair(4096, &p, &c);
    bl_err_t err = {0};
    uint8_t buf[2048] = {0};
    size_t len;
    /* Move head to 3072 and drain, so a 1500-byte reserve needs a pad at the end. */
    assert_int_equal(bp_ring_push(p, buf, 2032, 0, &err), 0);
    assert_int_equal(bp_ring_push(p, buf, 1008, 0, &err), 0);
    assert_int_equal(bp_ring_pop(c, buf, sizeof buf, &len, 0, &err), 0);
    assert_int_equal(bp_ring_pop(c, buf, sizeof buf, &len, 0, &err), 0);
    void *dst;
    assert_int_equal(bp_ring_reserve(p, 1500, &dst, 0, &err), 0);
    assert_ptr_equal(dst, (uint8_t *)dst - ((uintptr_t)dst & 4095) + BP_RING_FRAME_NBYTES);
    /* Replaced by a small one that fits before the end: no pad any more. */
    assert_int_equal(bp_ring_reserve(p, 8, &dst, 0, &err), 0);
    memcpy(dst, "replaced", 8);
    assert_int_equal(bp_ring_commit(p, 8, &err), 0);
    assert_int_equal(bp_ring_pop(c, buf, sizeof buf, &len, 0, &err), 0);
    assert_int_equal(len, 8);
    assert_memory_equal(buf, "replaced", 8);
    bp_ring_destroy(c);
    bp_ring_destroy(p);
}

/* ------------------------------------------------------------- two processes */

#define XPROC_MSGS 100000

/* Child: consume XPROC_MSGS messages, check order and content; exit code says how. */
static int xproc_consumer(int fd, uint32_t spin_us)
{
    bl_err_t err = {0};
    bp_ring_t *c;
    if (bp_ring_attach_fd(&c, fd, "xproc", BP_RING_CONSUMER, &err) != 0)
        return 10;
    bp_ring_set_spin_us(c, spin_us);
    for (uint64_t i = 0; i < XPROC_MSGS; i++) {
        const void *src;
        size_t len;
        if (bp_ring_peek(c, &src, &len, 5000000, &err) != 0) {
            fprintf(stderr, "consumer: %s\n", err.msg);
            return 11;
        }
        uint64_t idx;
        if (len < sizeof idx)
            return 12;
        memcpy(&idx, src, sizeof idx);
        if (idx != i || !check((const uint8_t *)src + 8, len - 8, i))
            return 13;
        bp_ring_release(c);
    }
    const void *src;
    size_t len;
    int rc = bp_ring_peek(c, &src, &len, 5000000, &err);
    bp_ring_destroy(c);
    return rc == BL_ECLOSED ? 0 : 14;
}

static void run_xproc(uint32_t spin_us, int producer_sleeps)
{
    bp_ring_t *p;
    bl_err_t err = {0};
    assert_int_equal(bp_ring_create(&p, "xproc", 1 << 16, BP_RING_PRODUCER, &err), 0);
    bp_ring_set_spin_us(p, spin_us);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(xproc_consumer(bp_ring_fd(p), spin_us));
    bl_rng_t rng;
    bl_rng_seed(&rng, g_seed ^ 0x55);
    uint8_t buf[3000];
    uint64_t t0 = now_ns();
    for (uint64_t i = 0; i < XPROC_MSGS; i++) {
        size_t len = 8 + (size_t)(bl_rng_next(&rng) % 2900);
        memcpy(buf, &i, 8);
        fill(buf + 8, len - 8, i);
        int rc = bp_ring_push(p, buf, len, 5000000, &err);
        if (rc)
            fail_msg("push %" PRIu64 ": %s", i, err.msg);
        /* Every 1000th message, let the consumer run dry and park. */
        if (producer_sleeps && i % 1000 == 999)
            usleep(200);
    }
    uint64_t dt = now_ns() - t0;
    bp_ring_close(p);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    bp_ring_stats_t st;
    bp_ring_get_stats(p, &st);
    printf("# xproc spin_us=%u sleeps=%d: %d msgs in %.1f ms (%.2f Mmsg/s), producer "
           "parks=%" PRIu64 " wakes=%" PRIu64 "\n",
           spin_us, producer_sleeps, XPROC_MSGS, dt / 1e6, XPROC_MSGS / (dt / 1e3), st.parks,
           st.wakes);
    if (producer_sleeps)
        assert_true(st.wakes > 0); /* the consumer parked and was woken */
    bp_ring_destroy(p);
}

static void test_ring_cross_process_100k_spinning(void **state)
{
    (void)state;
    run_xproc(50, 0);
}

static void test_ring_cross_process_100k_parking(void **state)
{
    (void)state;
    /* No spinning: every empty ring parks, so the futex path carries the traffic. */
    run_xproc(0, 1);
}

static int cmp_u64(const void *x, const void *y)
{
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return a < b ? -1 : a > b;
}

/* One-way wake latency: ping-pong over two rings, half the round trip. */
static void pingpong(uint32_t spin_us, int iters)
{
    bp_ring_t *a_p, *b_c;
    bl_err_t err = {0};
    assert_int_equal(bp_ring_create(&a_p, "ping", 4096, BP_RING_PRODUCER, &err), 0);
    assert_int_equal(bp_ring_create(&b_c, "pong", 4096, BP_RING_CONSUMER, &err), 0);
    bp_ring_set_spin_us(a_p, spin_us);
    bp_ring_set_spin_us(b_c, spin_us);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        bp_ring_t *a_c, *b_p;
        if (bp_ring_attach_fd(&a_c, bp_ring_fd(a_p), "ping", BP_RING_CONSUMER, &err) ||
            bp_ring_attach_fd(&b_p, bp_ring_fd(b_c), "pong", BP_RING_PRODUCER, &err))
            _exit(20);
        bp_ring_set_spin_us(a_c, spin_us);
        for (;;) {
            uint64_t v;
            size_t len;
            int rc = bp_ring_pop(a_c, &v, sizeof v, &len, 5000000, &err);
            if (rc == BL_ECLOSED)
                break;
            if (rc || bp_ring_push(b_p, &v, sizeof v, 5000000, &err))
                _exit(21);
        }
        bp_ring_destroy(b_p);
        bp_ring_destroy(a_c);
        _exit(0);
    }
    static uint64_t lat[20000];
    for (int i = 0; i < iters; i++) {
        uint64_t v = (uint64_t)i, w;
        size_t len;
        uint64_t t0 = now_ns();
        assert_int_equal(bp_ring_push(a_p, &v, sizeof v, 5000000, &err), 0);
        assert_int_equal(bp_ring_pop(b_c, &w, sizeof w, &len, 5000000, &err), 0);
        lat[i] = now_ns() - t0;
        assert_int_equal(w, v);
        if (spin_us == 0)
            usleep(50); /* let the peer park before the next ping */
    }
    bp_ring_close(a_p);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_int_equal(WEXITSTATUS(status), 0);
    qsort(lat, (size_t)iters, sizeof lat[0], cmp_u64);
    printf("# one-way latency spin_us=%u: p50 %.2f us, p99 %.2f us, max %.2f us (%d round "
           "trips / 2)\n",
           spin_us, lat[iters / 2] / 2e3, lat[iters * 99 / 100] / 2e3, lat[iters - 1] / 2e3,
           iters);
    bp_ring_destroy(b_c);
    bp_ring_destroy(a_p);
}

static void test_ring_measure_wake_latency(void **state)
{
    (void)state;
    pingpong(50, 20000); /* spinning peer */
    pingpong(0, 5000);   /* parked peer: the futex wake */
}

int main(void)
{
    const char *s = getenv("BLOOMERY_TEST_SEED");
    g_seed = s ? strtoull(s, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    printf("# seed %" PRIu64 " (BLOOMERY_TEST_SEED replays it)\n", g_seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ring_round_trip_random_sizes_with_wrap),
        cmocka_unit_test(test_ring_full_and_empty_edges),
        cmocka_unit_test(test_ring_rejects_message_larger_than_limit),
        cmocka_unit_test(test_ring_rejects_bad_capacity_and_role),
        cmocka_unit_test(test_ring_zero_copy_reserve_commit_peek_release),
        cmocka_unit_test(test_ring_timeout_when_peer_silent),
        cmocka_unit_test(test_ring_closed_flag),
        cmocka_unit_test(test_ring_corrupt_header_is_eproto),
        cmocka_unit_test(test_ring_corrupt_head_index_is_eproto),
        cmocka_unit_test(test_ring_corrupt_tail_index_is_eproto),
        cmocka_unit_test(test_ring_wait_consumed),
        cmocka_unit_test(test_ring_attach_rejects_bad_segment),
        cmocka_unit_test(test_ring_shm_name_create_attach),
        cmocka_unit_test(test_ring_dead_peer_is_a_timeout),
        cmocka_unit_test(test_ring_replaced_reservation),
        cmocka_unit_test(test_ring_cross_process_100k_spinning),
        cmocka_unit_test(test_ring_cross_process_100k_parking),
        cmocka_unit_test(test_ring_measure_wake_latency),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
