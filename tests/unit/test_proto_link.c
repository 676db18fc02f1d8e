/* Tests of proto/link.c over loopback tcp: the secret file's checks and the keys it
 * gives, messages both ways, peers without the secret (another secret; a forged
 * client key) refused, pumps between rings both ways, a peer that closes or stops
 * answering, oversize messages refused; and the one-hop cost, printed, not asserted.
 * Secrets and messages are drawn fresh each run (the seed is printed). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "link.h"
#include "ring.h"
#include "test_seed.h"

#define HB_IVL_MS 100
#define HB_TIMEOUT_MS 500
/* Generous, for loaded machines and sanitizer builds: a wait that ends early passes. */
#define MARGIN_MS 3000
#define UP_MS 5000

/* Short heartbeats, so that a silent peer is noticed within the test. */
static const bp_link_opts_t g_opts = {
    .heartbeat_ivl_ms = HB_IVL_MS, .heartbeat_timeout_ms = HB_TIMEOUT_MS, .linger_ms = 500};
/* For tests that move many MiB: ZeroMQ clears a heartbeat timeout only once a whole
 * message has arrived, and a 16 MiB message on a loaded machine may take longer
 * than HB_TIMEOUT_MS. */
static const bp_link_opts_t g_bulk_opts = {.linger_ms = 500};

static char g_dir[64];

static int setup(void **state)
{
    (void)state;
    test_seed_init("test_proto_link");
    snprintf(g_dir, sizeof g_dir, "/tmp/bl_test_link_XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static double ms_since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) * 1e3 + (double)(t.tv_nsec - t0->tv_nsec) / 1e6;
}

/* 64 random hex characters: a cluster secret of 256 bits. */
static void random_secret(rng_t *r, char out[65])
{
    static const char hex[] = "0123456789abcdef";
    for (int i = 0; i < 64; i++)
        out[i] = hex[rng_next(r) & 15];
    out[64] = '\0';
}

static void random_key(rng_t *r, uint8_t key[32])
{
    char s[65];
    random_secret(r, s);
    bl_err_t err = {0};
    assert_int_equal(bp_secret_from_bytes(s, 64, key, &err), 0);
}

static void write_file(const char *path, const void *p, size_t n, mode_t mode)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, p, n), (ssize_t)n);
    assert_int_equal(fchmod(fd, mode), 0);
    close(fd);
}

/* Bytes of message i of a stream: a pure function of (stream, i), so the receiver
 * checks without a copy of what was sent. */
static size_t msg_fill(uint64_t stream, uint64_t i, uint8_t *buf, size_t max)
{
    rng_t r = rng_for(stream * 1000003u + i);
    /* Log-uniform sizes from 0 to max: small and large messages both, at a mean
     * that keeps the test short. */
    int bits = 0;
    while (((size_t)1 << bits) < max)
        bits++;
    size_t top = (size_t)1 << (rng_next(&r) % (uint64_t)(bits + 1));
    size_t n = (size_t)(rng_next(&r) % (top + 1));
    if (n > max)
        n = max;
    size_t k = 0;
    for (; k + 8 <= n; k += 8) {
        uint64_t v = rng_next(&r);
        memcpy(buf + k, &v, 8);
    }
    uint64_t v = rng_next(&r);
    memcpy(buf + k, &v, n - k);
    return n;
}

static void fill_random(rng_t *r, uint8_t *p, size_t n)
{
    size_t k = 0;
    for (; k + 8 <= n; k += 8) {
        uint64_t v = rng_next(r);
        memcpy(p + k, &v, 8);
    }
    uint64_t v = rng_next(r);
    memcpy(p + k, &v, n - k);
}

/* A listener on a free loopback port and a client connected to it, both up. */
static void make_pair_opts(bp_link_t **lst, bp_link_t **cli, const uint8_t key[32],
                           size_t max_msg, const bp_link_opts_t *opts)
{
    bl_err_t err = {0};
    assert_int_equal(bp_link_listen(lst, "tcp://127.0.0.1:*", key, max_msg, opts, &err), 0);
    assert_int_equal(strncmp(bp_link_endpoint(*lst), "tcp://127.0.0.1:", 16), 0);
    assert_int_not_equal(strcmp(bp_link_endpoint(*lst), "tcp://127.0.0.1:*"), 0);
    assert_int_equal(bp_link_connect(cli, bp_link_endpoint(*lst), key, max_msg, opts, &err), 0);
    assert_int_equal(bp_link_wait_up(*cli, UP_MS, &err), 0);
    assert_int_equal(bp_link_wait_up(*lst, UP_MS, &err), 0);
    assert_true(bp_link_peer_up(*cli));
    assert_true(bp_link_peer_up(*lst));
}

static void make_pair(bp_link_t **lst, bp_link_t **cli, const uint8_t key[32], size_t max_msg)
{
    make_pair_opts(lst, cli, key, max_msg, &g_opts);
}

// --- the secret -----------------------------------------------------------------------

static void test_secret_file_gives_a_stable_key(void **state)
{
    (void)state;
    rng_t r = rng_for(1);
    char s[66], s2[65];
    random_secret(&r, s);
    random_secret(&r, s2);
    char path[128];
    snprintf(path, sizeof path, "%s/secret", g_dir);
    s[64] = '\n';
    write_file(path, s, 65, 0600);
    bl_err_t err = {0};
    uint8_t k1[32], k2[32], k3[32], k4[32];
    assert_int_equal(bp_secret_load(path, k1, &err), 0);
    assert_int_equal(bp_secret_load(path, k2, &err), 0);
    assert_memory_equal(k1, k2, 32);
    /* The trailing newline is not part of the secret. */
    assert_int_equal(bp_secret_from_bytes(s, 64, k3, &err), 0);
    assert_memory_equal(k1, k3, 32);
    /* A 0400 file is as good. */
    write_file(path, s, 65, 0400);
    assert_int_equal(bp_secret_load(path, k3, &err), 0);
    assert_memory_equal(k1, k3, 32);
    /* Another secret, another key. */
    assert_int_equal(bp_secret_from_bytes(s2, 64, k4, &err), 0);
    assert_memory_not_equal(k1, k4, 32);
    /* The key is SHA-256 of the content. */
    uint8_t want[32];
    unsigned wn = 0;
    assert_int_equal(EVP_Digest(s, 64, want, &wn, EVP_sha256(), NULL), 1);
    assert_memory_equal(k1, want, 32);
    unlink(path);
}

static void test_secret_refuses_file_open_to_others(void **state)
{
    (void)state;
    char path[128], s[65];
    rng_t r = rng_for(2);
    random_secret(&r, s);
    snprintf(path, sizeof path, "%s/open", g_dir);
    write_file(path, s, 64, 0644);
    bl_err_t err = {0};
    uint8_t k[32];
    assert_int_equal(bp_secret_load(path, k, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, path));
    assert_non_null(strstr(err.msg, "0644"));
    write_file(path, s, 64, 0620);
    assert_int_equal(bp_secret_load(path, k, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "group or others"));
    unlink(path);
}

static void test_secret_refuses_short_file(void **state)
{
    (void)state;
    char path[128];
    snprintf(path, sizeof path, "%s/short", g_dir);
    write_file(path, "0123456789abcdef0123456789abcde\n", 32, 0600); /* 31 + newline */
    bl_err_t err = {0};
    uint8_t k[32];
    assert_int_equal(bp_secret_load(path, k, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, path));
    assert_non_null(strstr(err.msg, "31 bytes"));
    assert_int_equal(bp_secret_from_bytes("", 0, k, &err), BL_EINVAL);
    unlink(path);
}

static void test_secret_refuses_long_file(void **state)
{
    (void)state;
    char path[128];
    snprintf(path, sizeof path, "%s/long", g_dir);
    static char big[BP_SECRET_MAX_NBYTES + 100];
    memset(big, 'a', sizeof big);
    write_file(path, big, sizeof big, 0600);
    bl_err_t err = {0};
    uint8_t k[32];
    assert_int_equal(bp_secret_load(path, k, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, path));
    assert_non_null(strstr(err.msg, "longer"));
    /* The largest content, with its newline, passes. */
    big[BP_SECRET_MAX_NBYTES] = '\n';
    write_file(path, big, BP_SECRET_MAX_NBYTES + 1, 0600);
    assert_int_equal(bp_secret_load(path, k, &err), 0);
    assert_int_equal(bp_secret_from_bytes(big, BP_SECRET_MAX_NBYTES + 1, k, &err), 0);
    assert_int_equal(bp_secret_from_bytes(big, BP_SECRET_MAX_NBYTES + 2, k, &err), BL_EINVAL);
    unlink(path);
}

static void test_secret_refuses_directory(void **state)
{
    (void)state;
    char path[128];
    snprintf(path, sizeof path, "%s/dir", g_dir);
    assert_int_equal(mkdir(path, 0700), 0);
    bl_err_t err = {0};
    uint8_t k[32];
    assert_int_equal(bp_secret_load(path, k, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, path));
    assert_non_null(strstr(err.msg, "directory"));
    rmdir(path);
}

static void test_secret_refuses_missing_file(void **state)
{
    (void)state;
    char path[128];
    snprintf(path, sizeof path, "%s/missing", g_dir);
    bl_err_t err = {0};
    uint8_t k[32];
    assert_int_equal(bp_secret_load(path, k, &err), BL_ENOENT);
    assert_non_null(strstr(err.msg, path));
}

// --- arguments --------------------------------------------------------------------------

static void test_link_refuses_bad_arguments(void **state)
{
    (void)state;
    rng_t r = rng_for(3);
    uint8_t key[32];
    random_key(&r, key);
    bl_err_t err = {0};
    bp_link_t *l = (bp_link_t *)1;
    assert_int_equal(bp_link_listen(&l, "ipc:///tmp/x.sock", key, 1024, NULL, &err), BL_EINVAL);
    assert_null(l);
    assert_non_null(strstr(err.msg, "ipc:///tmp/x.sock"));
    assert_int_equal(bp_link_connect(&l, "tcp://127.0.0.1:1", key, 0, NULL, &err), BL_EINVAL);
    bp_link_opts_t bad = {.heartbeat_ivl_ms = -1};
    assert_int_equal(bp_link_listen(&l, "tcp://127.0.0.1:*", key, 1024, &bad, &err), BL_EINVAL);
    /* A port in use: the bind fails, naming the endpoint. */
    bp_link_t *a;
    assert_int_equal(bp_link_listen(&a, "tcp://127.0.0.1:*", key, 1024, NULL, &err), 0);
    assert_int_equal(bp_link_listen(&l, bp_link_endpoint(a), key, 1024, NULL, &err), BL_EIO);
    assert_non_null(strstr(err.msg, bp_link_endpoint(a)));
    assert_null(l);
    /* No peer yet: nothing to receive, no one to send to. */
    uint8_t buf[16];
    size_t n;
    assert_int_equal(bp_link_recv(a, buf, sizeof buf, &n, 0, &err), BL_EAGAIN);
    assert_int_equal(bp_link_recv(a, buf, sizeof buf, &n, 50, &err), BL_ETIMEDOUT);
    assert_int_equal(bp_link_send(a, buf, sizeof buf, 50, &err), BL_ETIMEDOUT);
    assert_non_null(strstr(err.msg, "no peer"));
    assert_int_equal(bp_link_send(a, buf, 1025, 50, &err), BL_ERANGE);
    assert_int_equal(bp_link_wait_up(a, 0, &err), BL_EAGAIN);
    assert_int_equal(bp_link_wait_up(a, 50, &err), BL_ETIMEDOUT);
    assert_int_equal(bp_link_pump_wait(a, 0, &err), BL_EINVAL);
    assert_int_equal(bp_link_pump(a, NULL, NULL, &err), BL_EINVAL);
    /* Rings with their ends swapped. */
    bp_ring_t *p, *c;
    assert_int_equal(bp_ring_create(&p, "swap", 8192, BP_RING_PRODUCER, &err), 0);
    assert_int_equal(bp_ring_attach_fd(&c, bp_ring_fd(p), "swap", BP_RING_CONSUMER, &err), 0);
    assert_int_equal(bp_link_pump(a, p, NULL, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "not a consumer end"));
    assert_int_equal(bp_link_pump(a, NULL, c, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "not a producer end"));
    /* Once pumping, the socket is the pumps'. */
    assert_int_equal(bp_link_pump(a, c, NULL, &err), 0);
    assert_int_equal(bp_link_send(a, buf, 1, 0, &err), BL_EINVAL);
    assert_int_equal(bp_link_recv(a, buf, sizeof buf, &n, 0, &err), BL_EINVAL);
    assert_int_equal(bp_link_pump(a, c, NULL, &err), BL_EINVAL);
    assert_int_equal(bp_link_pump_wait(a, 0, &err), BL_EAGAIN);
    bp_link_close(a);
    /* Closing the link closed the consumer end the pump held. */
    assert_int_equal(bp_ring_push(p, buf, 1, 0, &err), BL_ECLOSED);
    bp_ring_destroy(c);
    bp_ring_destroy(p);
    bp_link_close(NULL);
}

// --- messages -------------------------------------------------------------------------

static void exchange(bp_link_t *from, bp_link_t *to, const uint8_t *msg, size_t n, uint8_t *buf,
                     size_t cap)
{
    bl_err_t err = {0};
    size_t got = 0;
    assert_int_equal(bp_link_send(from, msg, n, UP_MS, &err), 0);
    int rc = bp_link_recv(to, buf, cap, &got, UP_MS, &err);
    if (rc)
        printf("# recv: %s\n", err.msg);
    assert_int_equal(rc, 0);
    assert_int_equal(got, n);
    assert_memory_equal(buf, msg, n);
}

static void test_link_send_recv_both_ways(void **state)
{
    (void)state;
    rng_t r = rng_for(4);
    uint8_t key[32];
    random_key(&r, key);
    const size_t max = (size_t)16 << 20;
    const size_t sizes[3] = {1, (size_t)1 << 20, max};
    uint8_t *msg[3], *buf = malloc(max);
    for (int i = 0; i < 3; i++) {
        msg[i] = malloc(sizes[i]);
        fill_random(&r, msg[i], sizes[i]);
    }
    bp_link_t *lst, *cli;
    make_pair_opts(&lst, &cli, key, max, &g_bulk_opts);
    bl_err_t err = {0};
    for (int i = 0; i < 3; i++) {
        exchange(cli, lst, msg[i], sizes[i], buf, max);
        exchange(lst, cli, msg[i], sizes[i], buf, max);
    }
    /* Several in flight arrive in order. */
    for (int i = 0; i < 3; i++)
        assert_int_equal(bp_link_send(cli, msg[i], sizes[i], UP_MS, &err), 0);
    for (int i = 0; i < 3; i++) {
        size_t n;
        assert_int_equal(bp_link_recv(lst, buf, max, &n, UP_MS, &err), 0);
        assert_int_equal(n, sizes[i]);
        assert_memory_equal(buf, msg[i], n);
    }
    /* A buffer too small keeps the message for the next call. */
    assert_int_equal(bp_link_send(lst, msg[1], sizes[1], UP_MS, &err), 0);
    size_t n;
    assert_int_equal(bp_link_recv(cli, buf, 100, &n, UP_MS, &err), BL_ERANGE);
    assert_int_equal(n, sizes[1]);
    assert_int_equal(bp_link_recv(cli, buf, max, &n, 0, &err), 0);
    assert_int_equal(n, sizes[1]);
    assert_memory_equal(buf, msg[1], n);
    /* Past max_msg is refused before it leaves. */
    assert_int_equal(bp_link_send(cli, buf, max + 1, 0, &err), BL_ERANGE);
    bp_link_close(cli);
    bp_link_close(lst);
    for (int i = 0; i < 3; i++)
        free(msg[i]);
    free(buf);
}

static void test_link_delivers_what_was_sent_before_close(void **state)
{
    (void)state;
    rng_t r = rng_for(5);
    uint8_t key[32];
    random_key(&r, key);
    bp_link_t *lst, *cli;
    make_pair(&lst, &cli, key, 65536);
    bl_err_t err = {0};
    static uint8_t buf[65536];
    for (uint64_t i = 0; i < 50; i++) {
        size_t n = msg_fill(5, i, buf, sizeof buf);
        assert_int_equal(bp_link_send(cli, buf, n, UP_MS, &err), 0);
    }
    /* Closing waits (linger) for the queue to reach the peer; the peer then gets all
     * of it, and only then BL_ECLOSED. */
    bp_link_close(cli);
    static uint8_t want[65536];
    for (uint64_t i = 0; i < 50; i++) {
        size_t n, wn = msg_fill(5, i, want, sizeof want);
        assert_int_equal(bp_link_recv(lst, buf, sizeof buf, &n, UP_MS, &err), 0);
        assert_int_equal(n, wn);
        assert_memory_equal(buf, want, n);
    }
    size_t n;
    assert_int_equal(bp_link_recv(lst, buf, sizeof buf, &n, UP_MS, &err), BL_ECLOSED);
    assert_false(bp_link_peer_up(lst));
    assert_int_equal(bp_link_send(lst, buf, 1, UP_MS, &err), BL_ECLOSED);
    assert_int_equal(bp_link_wait_up(lst, 0, &err), BL_ECLOSED);
    bp_link_close(lst);
}

// --- peers without the secret -----------------------------------------------------------

static void test_link_refuses_peer_with_another_secret(void **state)
{
    (void)state;
    rng_t r = rng_for(6);
    uint8_t key[32], other[32];
    random_key(&r, key);
    random_key(&r, other);
    bl_err_t err = {0};
    bp_link_t *lst, *bad;
    assert_int_equal(bp_link_listen(&lst, "tcp://127.0.0.1:*", key, 4096, &g_opts, &err), 0);
    assert_int_equal(bp_link_connect(&bad, bp_link_endpoint(lst), other, 4096, &g_opts, &err), 0);
    /* The listener cannot decrypt a greeting made with other keys and drops the
     * connection; ZeroMQ tells the connecting side nothing more than that, so it
     * times out, and says why it may have. */
    int rc = bp_link_wait_up(bad, 400, &err);
    printf("# another secret, connecting side: %s\n", err.msg);
    assert_int_equal(rc, BL_ETIMEDOUT);
    assert_non_null(strstr(err.msg, "another cluster's secret"));
    assert_false(bp_link_peer_up(bad));
    assert_false(bp_link_peer_up(lst));
    uint8_t buf[64] = "not for you";
    size_t n;
    assert_int_equal(bp_link_send(bad, buf, 12, 100, &err), BL_ETIMEDOUT);
    assert_int_equal(bp_link_recv(lst, buf, sizeof buf, &n, 100, &err), BL_ETIMEDOUT);
    assert_int_equal(bp_link_recv(bad, buf, sizeof buf, &n, 0, &err), BL_EAGAIN);
    assert_int_equal(bp_link_wait_up(lst, 0, &err), BL_EAGAIN);
    bp_link_close(bad);
    /* The listener is still there for a peer with the secret. */
    bp_link_t *good;
    assert_int_equal(bp_link_connect(&good, bp_link_endpoint(lst), key, 4096, &g_opts, &err), 0);
    assert_int_equal(bp_link_wait_up(good, UP_MS, &err), 0);
    assert_int_equal(bp_link_wait_up(lst, UP_MS, &err), 0);
    exchange(good, lst, (const uint8_t *)"hello", 5, buf, sizeof buf);
    exchange(lst, good, (const uint8_t *)"back", 4, buf, sizeof buf);
    bp_link_close(good);
    bp_link_close(lst);
}

/* The listener's public key as link.c derives it: the public key of
 * SHA-256("bloomery link server" || key). */
static void server_public_z85(const uint8_t key[32], char out[41])
{
    static const char label[] = "bloomery link server";
    uint8_t in[sizeof label - 1 + 32], sec[32];
    memcpy(in, label, sizeof label - 1);
    memcpy(in + sizeof label - 1, key, 32);
    unsigned n = 0;
    assert_int_equal(EVP_Digest(in, sizeof in, sec, &n, EVP_sha256(), NULL), 1);
    char z85[41];
    assert_non_null(zmq_z85_encode(z85, sec, 32));
    assert_int_equal(zmq_curve_public(out, z85), 0);
}

static void test_link_zap_refuses_forged_client_key(void **state)
{
    (void)state;
    rng_t r = rng_for(7);
    uint8_t key[32];
    random_key(&r, key);
    bl_err_t err = {0};
    bp_link_t *lst;
    assert_int_equal(bp_link_listen(&lst, "tcp://127.0.0.1:*", key, 4096, &g_opts, &err), 0);
    /* A client that knows the server's public key (it is public) but not the secret:
     * its own key pair passes the CURVE handshake, so only the ZAP check stops it. */
    char spub[41], cpub[41], csec[41];
    server_public_z85(key, spub);
    assert_int_equal(zmq_curve_keypair(cpub, csec), 0);
    void *ctx = zmq_ctx_new();
    void *s = zmq_socket(ctx, ZMQ_PAIR);
    int zero = 0;
    assert_int_equal(zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero), 0);
    assert_int_equal(zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, spub, 40), 0);
    assert_int_equal(zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, cpub, 40), 0);
    assert_int_equal(zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, csec, 40), 0);
    assert_int_equal(zmq_socket_monitor(s, "inproc://forged", ZMQ_EVENT_ALL), 0);
    void *mon = zmq_socket(ctx, ZMQ_PAIR);
    assert_int_equal(zmq_connect(mon, "inproc://forged"), 0);
    assert_int_equal(zmq_connect(s, bp_link_endpoint(lst)), 0);
    assert_int_equal(zmq_send(s, "intruder", 8, ZMQ_DONTWAIT), 8);
    uint32_t auth_status = 0;
    bool succeeded = false;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (auth_status == 0 && ms_since(&t0) < UP_MS) {
        zmq_pollitem_t it = {mon, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 100) <= 0)
            continue;
        uint8_t ev[6];
        char ep[256];
        assert_int_equal(zmq_recv(mon, ev, sizeof ev, 0), 6);
        assert_true(zmq_recv(mon, ep, sizeof ep, 0) >= 0);
        uint16_t e;
        uint32_t v;
        memcpy(&e, ev, 2);
        memcpy(&v, ev + 2, 4);
        if (e == ZMQ_EVENT_HANDSHAKE_SUCCEEDED)
            succeeded = true;
        if (e == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
            auth_status = v;
    }
    assert_false(succeeded);
    assert_int_equal(auth_status, 400);
    uint8_t buf[64];
    size_t n;
    assert_int_equal(bp_link_recv(lst, buf, sizeof buf, &n, 100, &err), BL_ETIMEDOUT);
    assert_int_equal(bp_link_wait_up(lst, 0, &err), BL_EAGAIN);
    zmq_close(mon);
    zmq_close(s);
    zmq_ctx_term(ctx);
    /* A peer with the secret still gets in. */
    bp_link_t *good;
    assert_int_equal(bp_link_connect(&good, bp_link_endpoint(lst), key, 4096, &g_opts, &err), 0);
    assert_int_equal(bp_link_wait_up(good, UP_MS, &err), 0);
    exchange(good, lst, (const uint8_t *)"hello", 5, buf, sizeof buf);
    bp_link_close(good);
    bp_link_close(lst);
}

static void test_link_listener_takes_one_peer(void **state)
{
    (void)state;
    rng_t r = rng_for(8);
    uint8_t key[32];
    random_key(&r, key);
    bp_link_t *lst, *cli, *second;
    make_pair(&lst, &cli, key, 4096);
    bl_err_t err = {0};
    /* A second holder of the secret is refused by the listener (ZAP), and the
     * connecting side learns it. */
    assert_int_equal(bp_link_connect(&second, bp_link_endpoint(lst), key, 4096, &g_opts, &err), 0);
    assert_int_equal(bp_link_wait_up(second, UP_MS, &err), BL_EPERM);
    uint8_t buf[16];
    assert_int_equal(bp_link_send(second, buf, 1, 100, &err), BL_EPERM);
    bp_link_close(second);
    assert_true(bp_link_peer_up(lst));
    exchange(cli, lst, (const uint8_t *)"still", 5, buf, sizeof buf);
    bp_link_close(cli);
    bp_link_close(lst);
}

// --- pumps ----------------------------------------------------------------------------

#define PUMP_MSGS 1000
#define PUMP_MAX ((size_t)1 << 20)
#define PUMP_RING ((size_t)4 << 20)

typedef struct ring_pair {
    bp_ring_t *p, *c;
} ring_pair_t;

static ring_pair_t make_ring(const char *name, size_t capacity)
{
    ring_pair_t rp;
    bl_err_t err = {0};
    assert_int_equal(bp_ring_create(&rp.p, name, capacity, BP_RING_PRODUCER, &err), 0);
    assert_int_equal(bp_ring_attach_fd(&rp.c, bp_ring_fd(rp.p), name, BP_RING_CONSUMER, &err), 0);
    return rp;
}

static void free_ring(ring_pair_t rp)
{
    bp_ring_destroy(rp.c);
    bp_ring_destroy(rp.p);
}

typedef struct stream_job {
    bp_ring_t *r;
    uint64_t stream;
    int count;
    int done;    /* messages pushed or checked */
    int bad;     /* consumer: first message that differed, or -1 */
    int end_rc;  /* consumer: the call after the last message */
    char msg[512];
} stream_job_t;

static void *produce(void *arg)
{
    stream_job_t *j = arg;
    uint8_t *buf = malloc(PUMP_MAX);
    bl_err_t err = {0};
    for (; j->done < j->count; j->done++) {
        void *dst;
        size_t n = msg_fill(j->stream, (uint64_t)j->done, buf, PUMP_MAX);
        int rc = bp_ring_reserve(j->r, n, &dst, 10000000, &err);
        if (rc) {
            snprintf(j->msg, sizeof j->msg, "%s", err.msg);
            break;
        }
        memcpy(dst, buf, n);
        if (bp_ring_commit(j->r, n, &err))
            break;
    }
    free(buf);
    return NULL;
}

static void *consume(void *arg)
{
    stream_job_t *j = arg;
    uint8_t *want = malloc(PUMP_MAX);
    bl_err_t err = {0};
    j->bad = -1;
    for (; j->done < j->count; j->done++) {
        const void *p;
        size_t n;
        int rc = bp_ring_peek(j->r, &p, &n, 10000000, &err);
        if (rc) {
            snprintf(j->msg, sizeof j->msg, "%s", err.msg);
            break;
        }
        size_t wn = msg_fill(j->stream, (uint64_t)j->done, want, PUMP_MAX);
        if (n != wn || memcmp(p, want, n) != 0) {
            j->bad = j->done;
            break;
        }
        bp_ring_release(j->r);
    }
    /* After the last message: the producer side ends only when the test says so. */
    free(want);
    return NULL;
}

static void test_link_pumps_both_ways(void **state)
{
    (void)state;
    rng_t r = rng_for(9);
    uint8_t key[32];
    random_key(&r, key);
    bp_link_t *lst, *cli;
    make_pair_opts(&lst, &cli, key, PUMP_MAX, &g_bulk_opts);
    /* a: test -> lst pump -> link -> cli pump -> b: test. c: test -> cli -> lst -> d. */
    ring_pair_t a = make_ring("a", PUMP_RING), b = make_ring("b", PUMP_RING);
    ring_pair_t c = make_ring("c", PUMP_RING), d = make_ring("d", PUMP_RING);
    bl_err_t err = {0};
    assert_int_equal(bp_link_pump(lst, a.c, d.p, &err), 0);
    assert_int_equal(bp_link_pump(cli, c.c, b.p, &err), 0);
    uint64_t sa = g_seed ^ 0xa, sc = g_seed ^ 0xc;
    stream_job_t pa = {.r = a.p, .stream = sa, .count = PUMP_MSGS};
    stream_job_t pc = {.r = c.p, .stream = sc, .count = PUMP_MSGS};
    stream_job_t cb = {.r = b.c, .stream = sa, .count = PUMP_MSGS};
    stream_job_t cd = {.r = d.c, .stream = sc, .count = PUMP_MSGS};
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pthread_t th[4];
    pthread_create(&th[0], NULL, produce, &pa);
    pthread_create(&th[1], NULL, produce, &pc);
    pthread_create(&th[2], NULL, consume, &cb);
    pthread_create(&th[3], NULL, consume, &cd);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    printf("# pumps: %d messages each way (0 B - 1 MiB, log-uniform) in %.0f ms\n", PUMP_MSGS,
           ms_since(&t0));
    if (cb.done != PUMP_MSGS || cd.done != PUMP_MSGS)
        printf("# b: %d (%s), d: %d (%s), bad %d/%d\n", cb.done, cb.msg, cd.done, cd.msg, cb.bad,
               cd.bad);
    assert_int_equal(pa.done, PUMP_MSGS);
    assert_int_equal(pc.done, PUMP_MSGS);
    assert_int_equal(cb.bad, -1);
    assert_int_equal(cd.bad, -1);
    assert_int_equal(cb.done, PUMP_MSGS);
    assert_int_equal(cd.done, PUMP_MSGS);
    /* An orderly end: a's producer closes; lst's pump sends what is left, closes the
     * link, and closes d; cli's pump sees the peer leave and closes b and c. */
    bp_ring_close(a.p);
    const void *p;
    size_t n;
    assert_int_equal(bp_ring_peek(b.c, &p, &n, (int64_t)MARGIN_MS * 1000, &err), BL_ECLOSED);
    assert_int_equal(bp_ring_peek(d.c, &p, &n, (int64_t)MARGIN_MS * 1000, &err), BL_ECLOSED);
    assert_int_equal(bp_link_pump_wait(lst, MARGIN_MS, &err), BL_ECLOSED);
    assert_non_null(strstr(err.msg, "producer closed"));
    assert_int_equal(bp_link_pump_wait(cli, MARGIN_MS, &err), BL_ECLOSED);
    assert_non_null(strstr(err.msg, "connection dropped"));
    /* A stopped pump has closed both its rings. */
    assert_int_equal(bp_ring_push(c.p, "x", 1, 0, &err), BL_ECLOSED);
    bp_link_close(cli);
    bp_link_close(lst);
    free_ring(a);
    free_ring(b);
    free_ring(c);
    free_ring(d);
}

/* A local consumer that stops reading for longer than the heartbeat timeout holds the
 * messages back, but the link stays up: ZeroMQ must go on reading the connection
 * (heartbeats included) while the ring is full. */
static void test_link_slow_consumer_keeps_link(void **state)
{
    (void)state;
    rng_t r = rng_for(15);
    uint8_t key[32];
    random_key(&r, key);
    bp_link_t *lst, *cli;
    make_pair(&lst, &cli, key, 16384);
    ring_pair_t in = make_ring("slow", 65536);
    bl_err_t err = {0};
    assert_int_equal(bp_link_pump(lst, NULL, in.p, &err), 0);
    enum { N = 400 };
    static uint8_t buf[16384];
    for (uint64_t i = 0; i < N; i++) {
        size_t n = msg_fill(15, i, buf, sizeof buf);
        assert_int_equal(bp_link_send(cli, buf, n, UP_MS, &err), 0);
    }
    usleep((HB_IVL_MS + HB_TIMEOUT_MS) * 2 * 1000);
    assert_int_equal(bp_link_pump_wait(lst, 0, &err), BL_EAGAIN);
    assert_true(bp_link_peer_up(cli));
    static uint8_t want[16384];
    for (uint64_t i = 0; i < N; i++) {
        size_t n, wn = msg_fill(15, i, want, sizeof want);
        int rc = bp_ring_pop(in.c, buf, sizeof buf, &n, (int64_t)UP_MS * 1000, &err);
        if (rc)
            printf("# message %llu: %s\n", (unsigned long long)i, err.msg);
        assert_int_equal(rc, 0);
        assert_int_equal(n, wn);
        assert_memory_equal(buf, want, n);
    }
    assert_true(bp_link_peer_up(cli));
    assert_int_equal(bp_link_pump_wait(lst, 0, &err), BL_EAGAIN);
    bp_link_close(cli);
    bp_link_close(lst);
    free_ring(in);
}

static void test_link_peer_close_closes_ring(void **state)
{
    (void)state;
    rng_t r = rng_for(10);
    uint8_t key[32];
    random_key(&r, key);
    bp_link_t *lst, *cli;
    make_pair(&lst, &cli, key, 4096);
    ring_pair_t in = make_ring("in", 65536), out = make_ring("out", 65536);
    bl_err_t err = {0};
    assert_int_equal(bp_link_pump(lst, out.c, in.p, &err), 0);
    assert_int_equal(bp_link_send(cli, "ping", 4, UP_MS, &err), 0);
    uint8_t buf[16];
    size_t n;
    assert_int_equal(bp_ring_pop(in.c, buf, sizeof buf, &n, (int64_t)UP_MS * 1000, &err), 0);
    assert_int_equal(n, 4);
    assert_memory_equal(buf, "ping", 4);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    bp_link_close(cli);
    const void *p;
    int rc = bp_ring_peek(in.c, &p, &n, (int64_t)(HB_TIMEOUT_MS + MARGIN_MS) * 1000, &err);
    printf("# peer closed: the local consumer saw BL_ECLOSED after %.1f ms\n", ms_since(&t0));
    assert_int_equal(rc, BL_ECLOSED);
    assert_int_equal(bp_link_pump_wait(lst, MARGIN_MS, &err), BL_ECLOSED);
    /* The local producer of the other ring learns too. */
    assert_int_equal(bp_ring_push(out.p, "x", 1, 0, &err), BL_ECLOSED);
    bp_link_close(lst);
    free_ring(in);
    free_ring(out);
}

/* The peer's process stops (SIGSTOP) with its connection open: only the heartbeat
 * can tell. The child listens, so that the parent has no ZeroMQ threads when it
 * forks. */
static void test_link_silent_peer_times_out(void **state)
{
    (void)state;
    rng_t r = rng_for(11);
    uint8_t key[32];
    random_key(&r, key);
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        bl_err_t err = {0};
        bp_link_t *l;
        if (bp_link_listen(&l, "tcp://127.0.0.1:*", key, 4096, &g_opts, &err) != 0)
            _exit(2);
        char ep[256];
        snprintf(ep, sizeof ep, "%s", bp_link_endpoint(l));
        if (write(fds[1], ep, sizeof ep) != (ssize_t)sizeof ep)
            _exit(3);
        for (;;)
            pause();
    }
    close(fds[1]);
    char ep[256];
    assert_int_equal(read(fds[0], ep, sizeof ep), (ssize_t)sizeof ep);
    close(fds[0]);
    bp_link_t *cli;
    bl_err_t err = {0};
    assert_int_equal(bp_link_connect(&cli, ep, key, 4096, &g_opts, &err), 0);
    assert_int_equal(bp_link_wait_up(cli, UP_MS, &err), 0);
    ring_pair_t in = make_ring("in", 65536);
    assert_int_equal(bp_link_pump(cli, NULL, in.p, &err), 0);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(kill(pid, SIGSTOP), 0);
    const void *p;
    size_t n;
    int rc = bp_ring_peek(in.c, &p, &n, (int64_t)(HB_IVL_MS + HB_TIMEOUT_MS + MARGIN_MS) * 1000,
                          &err);
    printf("# stopped peer: the local consumer saw BL_ECLOSED after %.1f ms (heartbeat %d ms, "
           "timeout %d ms)\n", ms_since(&t0), HB_IVL_MS, HB_TIMEOUT_MS);
    assert_int_equal(rc, BL_ECLOSED);
    assert_int_equal(bp_link_pump_wait(cli, MARGIN_MS, &err), BL_ECLOSED);
    kill(pid, SIGKILL);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    bp_link_close(cli);
    free_ring(in);
}

// --- oversize -------------------------------------------------------------------------

static void test_link_drops_peer_past_max_msg(void **state)
{
    (void)state;
    rng_t r = rng_for(12);
    uint8_t key[32];
    random_key(&r, key);
    bl_err_t err = {0};
    bp_link_t *lst, *cli;
    /* The listener takes 1 KiB; the client believes 64 KiB. */
    assert_int_equal(bp_link_listen(&lst, "tcp://127.0.0.1:*", key, 1024, &g_opts, &err), 0);
    assert_int_equal(bp_link_connect(&cli, bp_link_endpoint(lst), key, 65536, &g_opts, &err), 0);
    assert_int_equal(bp_link_wait_up(cli, UP_MS, &err), 0);
    static uint8_t buf[65536];
    fill_random(&r, buf, sizeof buf);
    exchange(cli, lst, buf, 1024, buf + 4096, 4096);
    assert_int_equal(bp_link_send(cli, buf, 4096, UP_MS, &err), 0);
    size_t n;
    /* ZeroMQ drops the connection: nothing arrives, the link is over. */
    assert_int_equal(bp_link_recv(lst, buf, sizeof buf, &n, UP_MS, &err), BL_ECLOSED);
    /* The sender learns it as its connection closes. */
    assert_int_equal(bp_link_recv(cli, buf, sizeof buf, &n, UP_MS, &err), BL_ECLOSED);
    assert_false(bp_link_peer_up(cli));
    bp_link_close(cli);
    bp_link_close(lst);
}

static void test_link_pump_refuses_message_past_ring_limit(void **state)
{
    (void)state;
    rng_t r = rng_for(13);
    uint8_t key[32];
    random_key(&r, key);
    bp_link_t *lst, *cli;
    make_pair(&lst, &cli, key, 65536);
    /* The link takes 64 KiB, the ring 32 KiB - 16. */
    ring_pair_t in = make_ring("small", 65536), out = make_ring("out", 65536);
    bl_err_t err = {0};
    assert_int_equal(bp_link_pump(lst, out.c, in.p, &err), 0);
    static uint8_t buf[65536];
    fill_random(&r, buf, sizeof buf);
    size_t lim = bp_ring_max_msg(65536);
    assert_int_equal(bp_link_send(cli, buf, lim, UP_MS, &err), 0);
    assert_int_equal(bp_link_send(cli, buf, lim + 1, UP_MS, &err), 0);
    static uint8_t got[65536];
    size_t n;
    assert_int_equal(bp_ring_pop(in.c, got, sizeof got, &n, (int64_t)UP_MS * 1000, &err), 0);
    assert_int_equal(n, lim);
    assert_memory_equal(got, buf, lim);
    assert_int_equal(bp_ring_pop(in.c, got, sizeof got, &n, (int64_t)UP_MS * 1000, &err),
                     BL_ECLOSED);
    assert_int_equal(bp_link_pump_wait(lst, MARGIN_MS, &err), BL_EPROTO);
    assert_non_null(strstr(err.msg, "above the limit"));
    /* The peer was dropped. */
    assert_int_equal(bp_link_recv(cli, got, sizeof got, &n, UP_MS, &err), BL_ECLOSED);
    bp_link_close(cli);
    bp_link_close(lst);
    free_ring(in);
    free_ring(out);
}

// --- measured, not asserted -----------------------------------------------------------

typedef struct echo_job {
    bp_link_t *l;
    int count;
    size_t max;
} echo_job_t;

static void *echo(void *arg)
{
    echo_job_t *j = arg;
    uint8_t *buf = malloc(j->max);
    bl_err_t err = {0};
    for (int i = 0; i < j->count; i++) {
        size_t n;
        if (bp_link_recv(j->l, buf, j->max, &n, UP_MS, &err) ||
            bp_link_send(j->l, buf, n, UP_MS, &err))
            break;
    }
    free(buf);
    return NULL;
}

typedef struct sink_job {
    bp_link_t *l;
    int count, got;
    size_t max;
} sink_job_t;

static void *sink(void *arg)
{
    sink_job_t *j = arg;
    uint8_t *buf = malloc(j->max);
    bl_err_t err = {0};
    size_t n;
    while (j->got < j->count && bp_link_recv(j->l, buf, j->max, &n, UP_MS, &err) == 0 &&
           n == j->max)
        j->got++;
    free(buf);
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Sanitizer builds measure nothing useful: fewer rounds, to keep the suite short. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define MEASURE_SCALE 10
#else
#define MEASURE_SCALE 1
#endif

static void print_rtt(const char *what, double *us, int count)
{
    qsort(us, (size_t)count, sizeof us[0], cmp_double);
    printf("# measured: round trip of %s over loopback: median %.1f us, p90 %.1f us, p99 %.1f us "
           "(%d round trips)\n", what, us[count / 2], us[count * 9 / 10], us[count * 99 / 100],
           count);
}

/* Round trips with bp_link_send/recv: the caller sends and waits for the echo. */
static void measure_rtt(bp_link_t *cli, bp_link_t *lst, size_t size, int count, const char *what)
{
    enum { WARM = 50 };
    double *us = malloc(sizeof *us * (size_t)count);
    uint8_t *buf = calloc(1, size), *back = malloc(size);
    bl_err_t err = {0};
    echo_job_t j = {.l = lst, .count = count + WARM, .max = size};
    pthread_t th;
    pthread_create(&th, NULL, echo, &j); /* the echo thread owns lst until it returns */
    for (int i = 0; i < count + WARM; i++) {
        struct timespec t0;
        size_t n;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        assert_int_equal(bp_link_send(cli, buf, size, UP_MS, &err), 0);
        assert_int_equal(bp_link_recv(cli, back, size, &n, UP_MS, &err), 0);
        if (i >= WARM)
            us[i - WARM] = ms_since(&t0) * 1e3;
        assert_int_equal(n, size);
    }
    pthread_join(th, NULL);
    print_rtt(what, us, count);
    free(us);
    free(buf);
    free(back);
}

typedef struct ring_echo_job {
    bp_ring_t *in, *out;
    int count;
} ring_echo_job_t;

static void *ring_echo(void *arg)
{
    ring_echo_job_t *j = arg;
    bl_err_t err = {0};
    for (int i = 0; i < j->count; i++) {
        const void *p;
        size_t n;
        if (bp_ring_peek(j->in, &p, &n, (int64_t)UP_MS * 1000, &err) ||
            bp_ring_push(j->out, p, n, (int64_t)UP_MS * 1000, &err))
            break;
        bp_ring_release(j->in);
    }
    return NULL;
}

static void *push_big(void *arg)
{
    stream_job_t *j = arg;
    uint8_t *buf = calloc(1, (size_t)1 << 20);
    bl_err_t err = {0};
    for (; j->done < j->count; j->done++)
        if (bp_ring_push(j->r, buf, (size_t)1 << 20, (int64_t)UP_MS * 1000, &err))
            break;
    free(buf);
    return NULL;
}

static void test_link_measure_loopback(void **state)
{
    (void)state;
    rng_t r = rng_for(14);
    uint8_t key[32];
    random_key(&r, key);
    const size_t big = (size_t)1 << 20, small = 16384;
    const int rtts = 1000 / MEASURE_SCALE, big_msgs = 256 / MEASURE_SCALE;
    bp_link_t *lst, *cli;
    make_pair_opts(&lst, &cli, key, big, &g_bulk_opts);
    bl_err_t err = {0};
    measure_rtt(cli, lst, 64, rtts, "64 B (send/recv)");
    measure_rtt(cli, lst, small, rtts, "16 KiB (send/recv)");
    /* One way, 1 MiB messages: a thread receives (and owns lst until it returns). */
    uint8_t *buf = malloc(big);
    fill_random(&r, buf, big);
    sink_job_t k = {.l = lst, .count = big_msgs, .max = big};
    pthread_t th;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pthread_create(&th, NULL, sink, &k);
    for (int i = 0; i < big_msgs; i++)
        assert_int_equal(bp_link_send(cli, buf, big, UP_MS, &err), 0);
    pthread_join(th, NULL);
    double ms = ms_since(&t0);
    assert_int_equal(k.got, big_msgs);
    printf("# measured: 1 MiB messages one way over loopback (send/recv): %.0f MB/s (%d in %.0f "
           "ms)\n", (double)big_msgs * (double)big / (ms * 1e3), big_msgs, ms);
    /* The data path: ring -> pump -> link -> pump -> ring, echoed back the same way.
     * Rings park at once (spin 0): this process runs more threads than the machine
     * may have cores. */
    ring_pair_t a = make_ring("a", (size_t)4 << 20), b = make_ring("b", (size_t)4 << 20);
    ring_pair_t c = make_ring("c", (size_t)4 << 20), d = make_ring("d", (size_t)4 << 20);
    ring_pair_t all[4] = {a, b, c, d};
    for (int i = 0; i < 4; i++) {
        bp_ring_set_spin_us(all[i].p, 0);
        bp_ring_set_spin_us(all[i].c, 0);
    }
    assert_int_equal(bp_link_pump(lst, a.c, d.p, &err), 0);
    assert_int_equal(bp_link_pump(cli, c.c, b.p, &err), 0);
    enum { WARM = 50 };
    ring_echo_job_t ej = {.in = b.c, .out = c.p, .count = rtts + WARM};
    pthread_create(&th, NULL, ring_echo, &ej);
    double *us = malloc(sizeof *us * (size_t)rtts);
    for (int i = 0; i < rtts + WARM; i++) {
        size_t n;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        assert_int_equal(bp_ring_push(a.p, buf, small, (int64_t)UP_MS * 1000, &err), 0);
        assert_int_equal(bp_ring_pop(d.c, buf, big, &n, (int64_t)UP_MS * 1000, &err), 0);
        if (i >= WARM)
            us[i - WARM] = ms_since(&t0) * 1e3;
        assert_int_equal(n, small);
    }
    pthread_join(th, NULL);
    print_rtt("16 KiB (ring, pumps, link and back)", us, rtts);
    /* 1 MiB one way through the pumps. */
    clock_gettime(CLOCK_MONOTONIC, &t0);
    stream_job_t pa = {.r = a.p, .count = big_msgs};
    pthread_create(&th, NULL, push_big, &pa);
    for (int i = 0; i < big_msgs; i++) {
        size_t n;
        assert_int_equal(bp_ring_pop(b.c, buf, big, &n, (int64_t)UP_MS * 1000, &err) ||
                             n != big, 0);
    }
    pthread_join(th, NULL);
    ms = ms_since(&t0);
    printf("# measured: 1 MiB messages one way through ring, pumps, link, ring: %.0f MB/s (%d in "
           "%.0f ms)\n", (double)big_msgs * (double)big / (ms * 1e3), big_msgs, ms);
    free(us);
    bp_link_close(cli);
    bp_link_close(lst);
    for (int i = 0; i < 4; i++)
        free_ring(all[i]);
    free(buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_secret_file_gives_a_stable_key),
        cmocka_unit_test(test_secret_refuses_file_open_to_others),
        cmocka_unit_test(test_secret_refuses_short_file),
        cmocka_unit_test(test_secret_refuses_long_file),
        cmocka_unit_test(test_secret_refuses_directory),
        cmocka_unit_test(test_secret_refuses_missing_file),
        /* Forks while no link (and no ZeroMQ thread) exists in this process. */
        cmocka_unit_test(test_link_silent_peer_times_out),
        cmocka_unit_test(test_link_refuses_bad_arguments),
        cmocka_unit_test(test_link_send_recv_both_ways),
        cmocka_unit_test(test_link_delivers_what_was_sent_before_close),
        cmocka_unit_test(test_link_refuses_peer_with_another_secret),
        cmocka_unit_test(test_link_zap_refuses_forged_client_key),
        cmocka_unit_test(test_link_listener_takes_one_peer),
        cmocka_unit_test(test_link_pumps_both_ways),
        cmocka_unit_test(test_link_slow_consumer_keeps_link),
        cmocka_unit_test(test_link_peer_close_closes_ring),
        cmocka_unit_test(test_link_drops_peer_past_max_msg),
        cmocka_unit_test(test_link_pump_refuses_message_past_ring_limit),
        cmocka_unit_test(test_link_measure_loopback),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
