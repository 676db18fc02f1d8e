/* bloomery-ringbench: the shm ring between two processes (fork), measured.
 *   throughput  producer writes payloads of a size (touching every byte), consumer
 *               reads them (touching every byte): messages/s and GB/s per size.
 *   latency     ping-pong over two rings, one-way = half the round trip, with a
 *               spinning peer and with a parked peer (the futex wake).
 * Usage: bloomery-ringbench [-c capacity_bytes] [-s spin_us] [-n round_trips]
 * Prints its results; asserts nothing about time. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ring.h"

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *x, const void *y)
{
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return a < b ? -1 : a > b;
}

static int die(const char *what, const bl_err_t *err)
{
    fprintf(stderr, "bloomery-ringbench: %s: %s\n", what, err->msg);
    return 1;
}

/* Where the consumer's sums go, so the compiler keeps the reads. */
static volatile uint64_t g_sink;

/* Child side of the throughput run: read n messages, sum their bytes. */
static int consume(int fd, uint32_t spin_us, uint64_t n)
{
    bl_err_t err = {0};
    bp_ring_t *c;
    if (bp_ring_attach_fd(&c, fd, "bench", BP_RING_CONSUMER, &err))
        return die("attach", &err);
    bp_ring_set_spin_us(c, spin_us);
    for (uint64_t i = 0; i < n; i++) {
        const void *p;
        size_t len;
        if (bp_ring_peek(c, &p, &len, 10000000, &err))
            return die("peek", &err);
        const uint64_t *w = p;
        uint64_t s = 0;
        for (size_t k = 0; k < len / 8; k++)
            s += w[k];
        g_sink += s;
        bp_ring_release(c);
    }
    bp_ring_destroy(c);
    return 0;
}

static int throughput(size_t capacity, uint32_t spin_us, size_t msg_nbytes)
{
    bl_err_t err = {0};
    bp_ring_t *p;
    uint64_t n = (uint64_t)(2e9 / (double)(msg_nbytes + 64)); /* ~2 GB per size */
    if (n > 2000000)
        n = 2000000;
    if (bp_ring_create(&p, "bench", capacity, BP_RING_PRODUCER, &err))
        return die("create", &err);
    bp_ring_set_spin_us(p, spin_us);
    pid_t pid = fork();
    if (pid == 0)
        _exit(consume(bp_ring_fd(p), spin_us, n));
    uint64_t t0 = now_ns();
    for (uint64_t i = 0; i < n; i++) {
        void *dst;
        if (bp_ring_reserve(p, msg_nbytes, &dst, 10000000, &err))
            return die("reserve", &err);
        memset(dst, (int)(i & 0xff), msg_nbytes);
        if (bp_ring_commit(p, msg_nbytes, &err))
            return die("commit", &err);
    }
    int status;
    waitpid(pid, &status, 0);
    double dt = (double)(now_ns() - t0) / 1e9;
    bp_ring_stats_t st;
    bp_ring_get_stats(p, &st);
    printf("throughput  %8zu B msgs: %9.3f Mmsg/s %7.2f GB/s  (%" PRIu64 " msgs, producer "
           "parks %" PRIu64 ", wakes %" PRIu64 ")%s\n",
           msg_nbytes, (double)n / dt / 1e6, (double)n * (double)msg_nbytes / dt / 1e9, n,
           st.parks, st.wakes, WIFEXITED(status) && WEXITSTATUS(status) == 0 ? "" : " CHILD FAILED");
    bp_ring_destroy(p);
    return 0;
}

static int latency(uint32_t spin_us, int iters)
{
    bl_err_t err = {0};
    bp_ring_t *ping, *pong;
    if (bp_ring_create(&ping, "ping", 4096, BP_RING_PRODUCER, &err) ||
        bp_ring_create(&pong, "pong", 4096, BP_RING_CONSUMER, &err))
        return die("create", &err);
    bp_ring_set_spin_us(ping, spin_us);
    bp_ring_set_spin_us(pong, spin_us);
    pid_t pid = fork();
    if (pid == 0) {
        bp_ring_t *a, *b;
        if (bp_ring_attach_fd(&a, bp_ring_fd(ping), "ping", BP_RING_CONSUMER, &err) ||
            bp_ring_attach_fd(&b, bp_ring_fd(pong), "pong", BP_RING_PRODUCER, &err))
            _exit(die("attach", &err));
        bp_ring_set_spin_us(a, spin_us);
        bp_ring_set_spin_us(b, spin_us);
        for (;;) {
            uint64_t v;
            size_t len;
            int rc = bp_ring_pop(a, &v, sizeof v, &len, 10000000, &err);
            if (rc == BL_ECLOSED)
                _exit(0);
            if (rc || bp_ring_push(b, &v, sizeof v, 10000000, &err))
                _exit(die("echo", &err));
        }
    }
    uint64_t *lat = calloc((size_t)iters, sizeof *lat);
    if (!lat)
        return 1;
    for (int i = 0; i < iters; i++) {
        uint64_t v = (uint64_t)i, w;
        size_t len;
        uint64_t t0 = now_ns();
        if (bp_ring_push(ping, &v, sizeof v, 10000000, &err) ||
            bp_ring_pop(pong, &w, sizeof w, &len, 10000000, &err))
            return die("ping", &err);
        lat[i] = now_ns() - t0;
        if (spin_us == 0)
            usleep(100); /* the peer parks before the next ping */
    }
    bp_ring_close(ping);
    waitpid(pid, NULL, 0);
    qsort(lat, (size_t)iters, sizeof *lat, cmp_u64);
    printf("latency one-way, %s: p50 %.2f us  p90 %.2f us  p99 %.2f us  (%d round trips)\n",
           spin_us ? "spinning peer" : "parked peer (futex wake)", (double)lat[iters / 2] / 2e3,
           (double)lat[iters * 9 / 10] / 2e3, (double)lat[iters * 99 / 100] / 2e3, iters);
    free(lat);
    bp_ring_destroy(pong);
    bp_ring_destroy(ping);
    return 0;
}

int main(int argc, char **argv)
{
    size_t capacity = (size_t)16 << 20;
    uint32_t spin_us = 50;
    int iters = 20000;
    int opt;
    while ((opt = getopt(argc, argv, "c:s:n:")) != -1) {
        if (opt == 'c')
            capacity = (size_t)strtoull(optarg, NULL, 0);
        else if (opt == 's')
            spin_us = (uint32_t)strtoul(optarg, NULL, 0);
        else if (opt == 'n')
            iters = atoi(optarg);
        else {
            fprintf(stderr, "usage: bloomery-ringbench [-c capacity] [-s spin_us] [-n iters]\n");
            return 2;
        }
    }
    if (iters < 100)
        iters = 100;
    printf("ring capacity %zu bytes, spin %u us, %ld cpus\n", capacity, spin_us,
           sysconf(_SC_NPROCESSORS_ONLN));
    static const size_t sizes[] = {64, 1024, 16384, 262144, 1 << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (sizes[i] <= bp_ring_max_msg(capacity) && throughput(capacity, spin_us, sizes[i]))
            return 1;
    if (latency(spin_us ? spin_us : 50, iters) || latency(0, iters / 4))
        return 1;
    return 0;
}
