/* Tests of proto/node.c: each envelope a node or a router reads from the network is
 * refused by the field that is wrong (model file, probe, host facts and their CUDA
 * devices; the setup's own checks are fuzz_node's too), and bp_node_probe against a
 * made-up node over a loopback link: the facts it answers, its refusal passed on with
 * the endpoint, no node there, and a node of another cluster. The relay's setup: its
 * hosttier on the node's host with its fields. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bloomery.pb-c.h"
#include "link.h"
#include "msg.h"
#include "node.h"

#define VERSION "1.2.3"
#define UP_MS 5000

static const uint8_t g_key[32] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
                                  17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32};

/* --- the readers ------------------------------------------------------------------- */

static bp_node_file_t good_file(void)
{
    bp_node_file_t f = {.size = 18ull << 30};
    for (size_t i = 0; i < sizeof f.fingerprint; i++)
        f.fingerprint[i] = (uint8_t)(i * 7 + 1);
    return f;
}

static void expect_file(const bp_node_file_t *f, size_t n, int code, const char *needle)
{
    bp_node_file_t out;
    bl_err_t err = {0};
    assert_int_equal(bp_node_file_read(&out, (const uint8_t *)f, n, &err), code);
    if (code == 0) {
        assert_memory_equal(&out, f, sizeof out);
        return;
    }
    if (!strstr(err.msg, needle))
        fail_msg("'%s' does not name '%s'", err.msg, needle);
}

static void test_node_file_refused_by_field(void **state)
{
    (void)state;
    bp_node_file_t f = good_file();
    expect_file(&f, sizeof f, 0, NULL);
    expect_file(&f, sizeof f - 1, BL_EPROTO, "39 bytes, not 40");
    f.size = 0;
    expect_file(&f, sizeof f, BL_EPROTO, "size 0");
    f.size = (uint64_t)INT64_MAX + 1;
    expect_file(&f, sizeof f, BL_EPROTO, "size 9223372036854775808");
    f = good_file();
    memset(f.fingerprint, 0, sizeof f.fingerprint);
    expect_file(&f, sizeof f, BL_EPROTO, "fingerprint of zeros");
}

static bp_node_setup_t good_setup(void)
{
    bp_node_setup_t s;
    memset(&s, 0, sizeof s);
    memcpy(s.magic, BP_NODE_SETUP_MAGIC, sizeof BP_NODE_SETUP_MAGIC);
    snprintf(s.version, sizeof s.version, "%s", VERSION);
    snprintf(s.name, sizeof s.name, "worker1");
    snprintf(s.identity, sizeof s.identity, "worker1.7");
    s.n_rings = 4;
    s.verbosity = -1;
    for (int i = 0; i < 4; i++)
        s.capacity[i] = (uint64_t)1 << (20 + i);
    return s;
}

static void expect_setup(const bp_node_setup_t *s, int code, const char *needle)
{
    bp_node_setup_t out;
    bl_err_t err = {0};
    assert_int_equal(bp_node_setup_read(&out, (const uint8_t *)s, sizeof *s, VERSION, &err), code);
    if (code == 0) {
        assert_memory_equal(&out, s, sizeof out);
        return;
    }
    if (!strstr(err.msg, needle))
        fail_msg("'%s' does not name '%s'", err.msg, needle);
}

/* A hosttier on the node's host: the flag with the four rings, its threads (0..256)
 * and its name (empty, or a name); its fields without the flag are refused. */
static void test_node_setup_hosttier_fields(void **state)
{
    (void)state;
    bp_node_setup_t s = good_setup();
    expect_setup(&s, 0, NULL);
    s.flags = BP_NODE_HOSTTIER;
    expect_setup(&s, 0, NULL);
    s.hosttier_threads = 256;
    snprintf(s.hosttier_name, sizeof s.hosttier_name, "far-ht.1");
    expect_setup(&s, 0, NULL);
    s.hosttier_threads = 257;
    expect_setup(&s, BL_EPROTO, "gives the hosttier 257 threads");
    s.hosttier_threads = 8;
    snprintf(s.hosttier_name, sizeof s.hosttier_name, "far ht");
    expect_setup(&s, BL_EPROTO, "names the hosttier outside");
    memset(s.hosttier_name, 'a', sizeof s.hosttier_name); /* not ended inside its field */
    expect_setup(&s, BL_EPROTO, "names the hosttier outside");
    memset(s.hosttier_name, 0, sizeof s.hosttier_name);
    s.n_rings = 2;
    s.capacity[2] = s.capacity[3] = 0;
    expect_setup(&s, BL_EPROTO, "a hosttier without the experts rings");
    s = good_setup();
    s.hosttier_threads = 4;
    expect_setup(&s, BL_EPROTO, "hosttier settings without a hosttier");
    s = good_setup();
    s.hosttier_name[0] = 'h';
    expect_setup(&s, BL_EPROTO, "hosttier settings without a hosttier");
    s = good_setup();
    s.flags = 16;
    expect_setup(&s, BL_EPROTO, "flags out of range");
    s = good_setup();
    memcpy(s.magic, "BLNODE1", 8); /* the setup before the hosttier's fields */
    expect_setup(&s, BL_EPROTO, "does not begin with BLNODE2");
}

static bp_node_probe_t good_probe(const char *version)
{
    bp_node_probe_t q;
    memset(&q, 0, sizeof q);
    memcpy(q.magic, BP_NODE_PROBE_MAGIC, sizeof BP_NODE_PROBE_MAGIC);
    snprintf(q.version, sizeof q.version, "%s", version);
    return q;
}

static void test_node_probe_refused_by_field(void **state)
{
    (void)state;
    bp_node_probe_t q = good_probe(VERSION), out;
    bl_err_t err = {0};
    assert_int_equal(bp_node_probe_read(&out, (const uint8_t *)&q, sizeof q, VERSION, &err), 0);
    assert_int_equal(bp_node_probe_read(&out, (const uint8_t *)&q, 12, VERSION, &err), BL_EPROTO);
    assert_non_null(strstr(err.msg, "12 bytes"));
    q.magic[0] = 'X';
    assert_int_equal(bp_node_probe_read(&out, (const uint8_t *)&q, sizeof q, VERSION, &err), BL_EPROTO);
    assert_non_null(strstr(err.msg, BP_NODE_PROBE_MAGIC));
    q = good_probe(VERSION);
    memset(q.version, 'a', sizeof q.version);
    assert_int_equal(bp_node_probe_read(&out, (const uint8_t *)&q, sizeof q, VERSION, &err), BL_EPROTO);
    assert_non_null(strstr(err.msg, "version without its end"));
    q = good_probe(VERSION);
    q.flags = BP_NODE_PROBE_RATES;
    assert_int_equal(bp_node_probe_read(&out, (const uint8_t *)&q, sizeof q, VERSION, &err), 0);
    assert_int_equal(out.flags, BP_NODE_PROBE_RATES);
    q.flags = 2;
    assert_int_equal(bp_node_probe_read(&out, (const uint8_t *)&q, sizeof q, VERSION, &err), BL_EPROTO);
    assert_non_null(strstr(err.msg, "flags 0x2"));
    q = good_probe(VERSION);
    q.pad = 1;
    assert_int_equal(bp_node_probe_read(&out, (const uint8_t *)&q, sizeof q, VERSION, &err), BL_EPROTO);
    assert_non_null(strstr(err.msg, "padding 1"));
    q = good_probe("9.9.9");
    assert_int_equal(bp_node_probe_read(&out, (const uint8_t *)&q, sizeof q, VERSION, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "the router is bloomery 9.9.9, this node " VERSION));
}

static bp_node_host_t good_host(void)
{
    bp_node_host_t h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, BP_NODE_HOST_MAGIC, sizeof BP_NODE_HOST_MAGIC);
    snprintf(h.hostname, sizeof h.hostname, "gpu-b.lan");
    h.n_cpus = 16;
    h.mem_available = 60ull << 30;
    h.mem_total = 64ull << 30;
    h.read_mbps_one = 11000;
    h.read_mbps_all = 180000;
    h.n_devices = 2;
    h.device[0] = (bp_node_device_t){.index = 0, .total_bytes = 128ull << 30, .free_bytes = 120ull << 30};
    snprintf(h.device[0].name, sizeof h.device[0].name, "NVIDIA GB10");
    h.device[1] = (bp_node_device_t){.index = 3, .total_bytes = 80ull << 30, .free_bytes = 0}; /* free not known */
    snprintf(h.device[1].name, sizeof h.device[1].name, "NVIDIA H100 80GB HBM3");
    return h;
}

static void expect_host(const bp_node_host_t *h, int code, const char *needle)
{
    bp_node_host_t out;
    bl_err_t err = {0};
    assert_int_equal(bp_node_host_read(&out, (const uint8_t *)h, sizeof *h, &err), code);
    if (code == 0)
        assert_memory_equal(&out, h, sizeof out);
    else if (!strstr(err.msg, needle))
        fail_msg("'%s' does not name '%s'", err.msg, needle);
}

static void test_node_host_facts_refused_by_field(void **state)
{
    (void)state;
    bp_node_host_t h = good_host();
    expect_host(&h, 0, NULL);
    h.mem_total = 0; /* not known: any available amount within the limit */
    expect_host(&h, 0, NULL);
    h = good_host();
    h.magic[3] = 0;
    expect_host(&h, BL_EPROTO, BP_NODE_HOST_MAGIC);
    h = good_host();
    h.hostname[3] = ' ';
    expect_host(&h, BL_EPROTO, "host name");
    h = good_host();
    memset(h.hostname, 'a', sizeof h.hostname); /* no end */
    expect_host(&h, BL_EPROTO, "host name");
    h = good_host();
    h.hostname[0] = 0;
    expect_host(&h, BL_EPROTO, "host name");
    h = good_host();
    h.n_cpus = 0;
    expect_host(&h, BL_EPROTO, "0 CPUs");
    h.n_cpus = BP_NODE_MAX_CPUS + 1;
    expect_host(&h, BL_EPROTO, "CPUs");
    h = good_host();
    h.mem_available = h.mem_total + 1;
    expect_host(&h, BL_EPROTO, "memory available");
    h = good_host();
    h.mem_total = BP_NODE_MAX_MEM + 1;
    expect_host(&h, BL_EPROTO, "memory available");
    bp_node_host_t out;
    bl_err_t err = {0};
    h = good_host();
    assert_int_equal(bp_node_host_read(&out, (const uint8_t *)&h, sizeof h + 1, &err), BL_EPROTO);
    assert_non_null(strstr(err.msg, "1513 bytes, not 1512"));
    assert_int_equal(bp_node_host_read(&out, (const uint8_t *)&h, 1504, &err), BL_EPROTO); /* a node of before */
    assert_non_null(strstr(err.msg, "1504 bytes, not 1512"));
    h = good_host();
    h.read_mbps_all = BP_NODE_MAX_MBPS + 1;
    expect_host(&h, BL_EPROTO, "reads its memory at");
    h = good_host();
    h.read_mbps_one = 0; /* not known: taken */
    h.read_mbps_all = 0;
    expect_host(&h, 0, NULL);
}

static void test_node_host_devices_refused_by_field(void **state)
{
    (void)state;
    bp_node_host_t h = good_host();
    h.n_devices = 0; /* a host without a card: the entries all zeros */
    memset(h.device, 0, sizeof h.device);
    expect_host(&h, 0, NULL);
    h = good_host();
    h.n_devices = BP_NODE_MAX_DEVICES;
    for (int i = 0; i < BP_NODE_MAX_DEVICES; i++) { /* as many as a plan takes */
        h.device[i] = (bp_node_device_t){.index = 255 - i, .total_bytes = BP_NODE_MAX_MEM,
                                         .free_bytes = BP_NODE_MAX_MEM};
        snprintf(h.device[i].name, sizeof h.device[i].name, "card %d ~!", i);
    }
    expect_host(&h, 0, NULL);
    h.n_devices = BP_NODE_MAX_DEVICES + 1;
    expect_host(&h, BL_EPROTO, "17 CUDA devices (at most 16)");
    h = good_host();
    h.device[1].index = -1;
    expect_host(&h, BL_EPROTO, "device 1 has CUDA ordinal -1 (0..255)");
    h.device[1].index = 256;
    expect_host(&h, BL_EPROTO, "device 1 has CUDA ordinal 256");
    h.device[1].index = 0;
    expect_host(&h, BL_EPROTO, "devices 0 and 1 are both CUDA0");
    h = good_host();
    h.device[0].name[0] = 0;
    expect_host(&h, BL_EPROTO, "device 0 (CUDA0) has a name that is empty");
    h = good_host();
    memset(h.device[0].name, 'a', sizeof h.device[0].name); /* no end */
    expect_host(&h, BL_EPROTO, "not ended");
    h = good_host();
    h.device[0].name[40] = 'x'; /* a byte after the end */
    expect_host(&h, BL_EPROTO, "not followed by zeros");
    h = good_host();
    h.device[1].name[2] = '\n';
    expect_host(&h, BL_EPROTO, "device 1 (CUDA3) has a name with byte 0x0a");
    h.device[1].name[2] = (char)0xc3;
    expect_host(&h, BL_EPROTO, "byte 0xc3");
    h = good_host();
    h.device[0].free_bytes = h.device[0].total_bytes + 1;
    expect_host(&h, BL_EPROTO, "device 0 (CUDA0) has 137438953473 bytes free of 137438953472");
    h = good_host();
    h.device[0].total_bytes = h.device[0].free_bytes = BP_NODE_MAX_MEM + 1;
    expect_host(&h, BL_EPROTO, "bytes free of");
    h = good_host();
    h.device[1].read_mbps = BP_NODE_MAX_MBPS + 1;
    expect_host(&h, BL_EPROTO, "device 1 (CUDA3) reads its memory at");
    h = good_host();
    h.device[2].index = 5; /* an entry past the count */
    expect_host(&h, BL_EPROTO, "bytes past its 2 devices");
    h = good_host();
    h.device[BP_NODE_MAX_DEVICES - 1].name[63] = 1;
    expect_host(&h, BL_EPROTO, "bytes past its 2 devices");
}

/* --- bp_node_probe against a made-up node --------------------------------------------- */

enum { ANSWER_FACTS, ANSWER_ERROR, ANSWER_GARBAGE };

typedef struct fake_node {
    bp_link_t *l;
    int answer;
    int up_ms;       /* how long it waits for the router */
    int got_probe, got_done;
    uint32_t probe_flags; /* the probe's flags as read */
} fake_node_t;

/* A node's side of one probe: the question, the answer, the router's word, the end. */
static void *fake_node_main(void *arg)
{
    fake_node_t *fn = arg;
    bl_err_t err = {0};
    uint8_t buf[1 + sizeof(bp_node_host_t)];
    size_t n = 0;
    if (bp_link_wait_up(fn->l, fn->up_ms, &err) != 0 || bp_link_recv(fn->l, buf, sizeof buf, &n, UP_MS, &err) != 0)
        return NULL;
    bp_node_probe_t q;
    fn->got_probe = n == 1 + sizeof q && buf[0] == BP_NODE_ENV_PROBE &&
                    bp_node_probe_read(&q, buf + 1, n - 1, VERSION, &err) == 0;
    fn->probe_flags = fn->got_probe ? q.flags : 0;
    if (fn->answer == ANSWER_FACTS) {
        const bp_node_host_t h = good_host();
        buf[0] = BP_NODE_ENV_HOST;
        memcpy(buf + 1, &h, sizeof h);
        n = 1 + sizeof h;
    } else if (fn->answer == ANSWER_ERROR) {
        Bloomery__Error er = BLOOMERY__ERROR__INIT;
        er.code = BL_EINVAL;
        er.message = "node: the router is bloomery 9.9.9, this node 1.2.3";
        er.fatal = 1;
        const bp_msg_t m = {.type = BP_MSG_ERROR, .u.error = &er};
        buf[0] = BP_NODE_ENV_MSG;
        if (bp_msg_pack(&m, buf + 1, sizeof buf - 1, &n, &err) != 0) /* the test's own message: fits */
            return NULL;
        n += 1;
    } else {
        memcpy(buf, "Zzzz", 4);
        n = 4;
    }
    if (bp_link_send(fn->l, buf, n, UP_MS, &err) != 0)
        return NULL;
    if (bp_link_recv(fn->l, buf, sizeof buf, &n, UP_MS, &err) == 0)
        fn->got_done = n == 1 && buf[0] == BP_NODE_ENV_DONE;
    bp_link_close(fn->l); /* the session ends: the probe waits for this */
    fn->l = NULL;
    return NULL;
}

static int probe_fake(int answer, const uint8_t *router_key, bp_node_host_t *out, bl_err_t *err, fake_node_t *fn)
{
    memset(fn, 0, sizeof *fn);
    fn->answer = answer;
    fn->up_ms = router_key == g_key ? UP_MS : 1500;
    bl_err_t e = {0};
    assert_int_equal(bp_link_listen(&fn->l, "tcp://127.0.0.1:*", g_key, 1 << 20, NULL, &e), 0);
    char ep[128];
    snprintf(ep, sizeof ep, "%s", bp_link_endpoint(fn->l));
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, fake_node_main, fn), 0);
    const int rc = bp_node_probe(ep, router_key, VERSION, BP_NODE_PROBE_RATES, answer == ANSWER_FACTS ? UP_MS : 1500,
                                 out, err);
    pthread_join(th, NULL);
    bp_link_close(fn->l);
    if (rc)
        assert_non_null(strstr(err->msg, ep));
    return rc;
}

static void test_node_probe_returns_the_facts_and_waits_for_the_end(void **state)
{
    (void)state;
    fake_node_t fn;
    bp_node_host_t h;
    bl_err_t err = {0};
    assert_int_equal(probe_fake(ANSWER_FACTS, g_key, &h, &err, &fn), 0);
    const bp_node_host_t want = good_host();
    assert_memory_equal(&h, &want, sizeof h);
    assert_true(fn.got_probe);
    assert_int_equal(fn.probe_flags, BP_NODE_PROBE_RATES);
    assert_true(fn.got_done);
}

static void test_node_probe_passes_the_nodes_refusal_on(void **state)
{
    (void)state;
    fake_node_t fn;
    bp_node_host_t h;
    bl_err_t err = {0};
    assert_int_equal(probe_fake(ANSWER_ERROR, g_key, &h, &err, &fn), BL_EINVAL);
    assert_non_null(strstr(err.msg, "the router is bloomery 9.9.9"));
    assert_int_equal(probe_fake(ANSWER_GARBAGE, g_key, &h, &err, &fn), BL_EPROTO);
    assert_non_null(strstr(err.msg, "answered a probe"));
}

static void test_node_probe_without_a_node_or_with_another_secret(void **state)
{
    (void)state;
    bp_node_host_t h;
    bl_err_t err = {0};
    /* nothing listens: a port just taken and given back */
    bp_link_t *l = NULL;
    assert_int_equal(bp_link_listen(&l, "tcp://127.0.0.1:*", g_key, 1024, NULL, &err), 0);
    char ep[128];
    snprintf(ep, sizeof ep, "%s", bp_link_endpoint(l));
    bp_link_close(l);
    assert_int_equal(bp_node_probe(ep, g_key, VERSION, 0, 300, &h, &err), BL_ETIMEDOUT);
    assert_non_null(strstr(err.msg, ep));
    /* a node of another cluster never answers the handshake */
    uint8_t other[32];
    memcpy(other, g_key, sizeof other);
    other[0] ^= 1;
    fake_node_t fn;
    const int rc = probe_fake(ANSWER_FACTS, other, &h, &err, &fn);
    assert_true(rc == BL_ETIMEDOUT || rc == BL_EPERM);
    assert_false(fn.got_probe);
    const bp_node_host_t zero = {0};
    assert_memory_equal(&h, &zero, sizeof h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_node_file_refused_by_field),
        cmocka_unit_test(test_node_setup_hosttier_fields),
        cmocka_unit_test(test_node_probe_refused_by_field),
        cmocka_unit_test(test_node_host_facts_refused_by_field),
        cmocka_unit_test(test_node_host_devices_refused_by_field),
        cmocka_unit_test(test_node_probe_returns_the_facts_and_waits_for_the_end),
        cmocka_unit_test(test_node_probe_passes_the_nodes_refusal_on),
        cmocka_unit_test(test_node_probe_without_a_node_or_with_another_secret),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
