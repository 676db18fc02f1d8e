/* Tests of proto/chan.c: ipc endpoints, PAIR and ROUTER/DEALER exchanges between two
 * processes (fork), timeouts on a silent peer, a send to an unknown peer, and raw
 * garbage from a peer refused with the peer named. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "bloomery.pb-c.h"
#include "chan.h"

static char g_dir[64];

static int setup(void **state)
{
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/bl_test_chan_XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void endpoint(char *buf, size_t cap, const char *name)
{
    bl_err_t err = {0};
    assert_int_equal(bp_chan_ipc_endpoint(buf, cap, g_dir, name, &err), 0);
}

static bp_msg_t ready_msg(Bloomery__Ready *r, uint32_t process)
{
    bloomery__ready__init(r);
    r->process = process;
    return (bp_msg_t){.type = BP_MSG_READY, .u.ready = r};
}

static void test_chan_ipc_endpoint_limits(void **state)
{
    (void)state;
    char buf[256];
    bl_err_t err = {0};
    assert_int_equal(bp_chan_ipc_endpoint(buf, sizeof buf, "/run/bl", "worker0", &err), 0);
    assert_string_equal(buf, "ipc:///run/bl/worker0.sock");
    assert_int_equal(bp_chan_ipc_endpoint(buf, sizeof buf, "/run/bl", "a/b", &err), BL_EINVAL);
    assert_int_equal(bp_chan_ipc_endpoint(buf, sizeof buf, "", "x", &err), BL_EINVAL);
    char longdir[120];
    memset(longdir, 'd', sizeof longdir - 1);
    longdir[0] = '/';
    longdir[sizeof longdir - 1] = '\0';
    assert_int_equal(bp_chan_ipc_endpoint(buf, sizeof buf, longdir, "x", &err), BL_ERANGE);
    assert_non_null(strstr(err.msg, "107"));
    assert_int_equal(bp_chan_ipc_endpoint(buf, 10, "/run", "x", &err), BL_ERANGE);
}

static void test_chan_bad_kind_and_scheme(void **state)
{
    (void)state;
    bp_chan_t *c;
    bl_err_t err = {0};
    assert_int_equal(bp_chan_bind(&c, (bp_chan_kind_t)9, "ipc:///tmp/x", &err), BL_EINVAL);
    assert_int_equal(bp_chan_bind(&c, BP_CHAN_PAIR, "udp://1.2.3.4:5", &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "udp://"));
    assert_int_equal(bp_chan_bind(&c, BP_CHAN_PAIR, "ipc:///nonexistent/dir/x.sock", &err), BL_EIO);
    assert_non_null(strstr(err.msg, "/nonexistent/dir/x.sock"));
    assert_null(c);
}

/* Child: a DEALER named worker<i> says Hello, waits for a Plan, answers Ready. */
static int dealer_child(const char *ep, int i)
{
    bl_err_t err = {0};
    bp_chan_t *c;
    char id[16];
    snprintf(id, sizeof id, "worker%d", i);
    if (bp_chan_connect(&c, BP_CHAN_DEALER, ep, id, &err))
        return 10;
    Bloomery__Hello h = BLOOMERY__HELLO__INIT;
    Bloomery__Device d = BLOOMERY__DEVICE__INIT;
    Bloomery__Device *ds[1] = {&d};
    d.kind = BLOOMERY__DEVICE_KIND__DEVICE_KIND_CPU;
    d.name = "cpu";
    d.cores = 16;
    d.index = -1;
    h.kind = BLOOMERY__PROCESS_KIND__PROCESS_KIND_WORKER;
    h.pid = (uint32_t)getpid();
    h.version = "0.1.0";
    h.protocol = BP_PROTOCOL_VERSION;
    h.n_devices = 1;
    h.devices = ds;
    if (bp_chan_send(c, NULL, &(bp_msg_t){.type = BP_MSG_HELLO, .u.hello = &h}, 5000, &err))
        return 11;
    bp_msg_t in;
    if (bp_chan_recv(c, NULL, &in, 5000, &err) || in.type != BP_MSG_PLAN ||
        in.u.plan->you != (uint32_t)i) {
        fprintf(stderr, "dealer %d: %s\n", i, err.msg);
        return 12;
    }
    bp_msg_free(&in);
    Bloomery__Ready r;
    bp_msg_t m = ready_msg(&r, (uint32_t)i);
    if (bp_chan_send(c, NULL, &m, 5000, &err))
        return 13;
    /* Wait for Shutdown so our Ready is not lost to an early close. */
    if (bp_chan_recv(c, NULL, &in, 5000, &err) || in.type != BP_MSG_SHUTDOWN)
        return 14;
    bp_msg_free(&in);
    bp_chan_destroy(c);
    return 0;
}

static void test_chan_router_dealer_across_processes(void **state)
{
    (void)state;
    char ep[256];
    endpoint(ep, sizeof ep, "router");
    bl_err_t err = {0};
    bp_chan_t *r;
    /* Fork before this process has a ZeroMQ context: a child of a process whose
     * ZeroMQ threads run may inherit a lock one of them held. The dealers' connects
     * retry until the bind below. */
    pid_t pids[2];
    for (int i = 0; i < 2; i++) {
        pids[i] = fork();
        assert_true(pids[i] >= 0);
        if (pids[i] == 0)
            _exit(dealer_child(ep, i));
    }
    assert_int_equal(bp_chan_bind(&r, BP_CHAN_ROUTER, ep, &err), 0);
    /* Two Hellos, answered with a Plan naming the receiver; then two Readys. */
    int ready = 0;
    bp_peer_t peers[2];
    for (int k = 0; k < 4; k++) {
        bp_peer_t from;
        bp_msg_t in;
        int rc = bp_chan_recv(r, &from, &in, 5000, &err);
        if (rc)
            fail_msg("recv: %s", err.msg);
        char nm[600];
        bp_peer_name(&from, nm, sizeof nm);
        assert_int_equal(strncmp(nm, "worker", 6), 0);
        int i = nm[6] - '0';
        if (in.type == BP_MSG_HELLO) {
            assert_int_equal(in.u.hello->n_devices, 1);
            peers[i] = from;
            bp_msg_t plan_m;
            Bloomery__Plan p = BLOOMERY__PLAN__INIT;
            Bloomery__Stage s = BLOOMERY__STAGE__INIT;
            Bloomery__Stage *ss[1] = {&s};
            s.layer_end = 1;
            p.model_path = "m.gguf";
            p.n_layers = 1;
            p.n_stages = 1;
            p.stages = ss;
            p.kv_type = BLOOMERY__KV_TYPE__KV_TYPE_F16;
            p.n_ctx = 128;
            p.n_slots = 1;
            p.you = (uint32_t)i;
            plan_m = (bp_msg_t){.type = BP_MSG_PLAN, .u.plan = &p};
            assert_int_equal(bp_chan_send(r, &from, &plan_m, 5000, &err), 0);
        } else {
            assert_int_equal(in.type, BP_MSG_READY);
            assert_int_equal(in.u.ready->process, (uint32_t)i);
            ready++;
        }
        bp_msg_free(&in);
    }
    assert_int_equal(ready, 2);
    Bloomery__Shutdown sd = BLOOMERY__SHUTDOWN__INIT;
    for (int i = 0; i < 2; i++)
        assert_int_equal(bp_chan_send(r, &peers[i],
                                      &(bp_msg_t){.type = BP_MSG_SHUTDOWN, .u.shutdown = &sd},
                                      5000, &err), 0);
    for (int i = 0; i < 2; i++) {
        int status;
        assert_int_equal(waitpid(pids[i], &status, 0), pids[i]);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
    }
    /* Unknown peer: an error naming it, not a silent drop. */
    bp_peer_t ghost = {.len = 5};
    memcpy(ghost.id, "ghost", 5);
    assert_int_equal(bp_chan_send(r, &ghost, &(bp_msg_t){.type = BP_MSG_SHUTDOWN, .u.shutdown = &sd},
                                  100, &err), BL_ENOENT);
    assert_non_null(strstr(err.msg, "ghost"));
    /* A ROUTER send without a peer is a caller error. */
    assert_int_equal(bp_chan_send(r, NULL, &(bp_msg_t){.type = BP_MSG_SHUTDOWN, .u.shutdown = &sd},
                                  100, &err), BL_EINVAL);
    bp_chan_destroy(r);
}

/* The router's plan as plain values through a channel: bp_chan_send_plan on one side,
 * bp_plan_read on the other give the same stages (a stage's own threads too), host
 * layers, KV type, poll level, CPU pinning and residency. */
static void test_chan_plan_as_plain_values(void **state)
{
    (void)state;
    char ep[256];
    endpoint(ep, sizeof ep, "plan");
    bl_err_t err = {0};
    pid_t pid = fork(); /* before any ZeroMQ context, as above */
    assert_true(pid >= 0);
    if (pid == 0) {
        bp_chan_t *b;
        bp_msg_t in;
        static bp_plan_t p;
        if (bp_chan_connect(&b, BP_CHAN_PAIR, ep, NULL, &err) || bp_chan_recv(b, NULL, &in, 5000, &err) ||
            bp_plan_read(&in, &p, &err))
            _exit(1);
        const int ok = p.n_stages == 2 && p.stages[1].device == 3 && p.stages[0].device == -1 &&
                       p.stages[0].threads == 0 && p.stages[1].threads == 6 && p.stages[1].threads_batch == 6 &&
                       p.stages[1].layer_begin == 5 && p.n_layers == 9 && p.n_expert == 4 && p.host[0] == 0 &&
                       p.host[6] == 1 && p.host[8] == 1 && p.host[7] == 0 && p.kv_type == 0 &&
                       !strcmp(p.model_path, "/m.gguf") && p.you == 1 && p.host_process == 2 && p.poll == 37 &&
                       p.cpu_strict == 1 && p.experts_vram == ((int64_t)3 << 30) && p.no_residency == 1;
        bp_msg_free(&in);
        bp_chan_destroy(b);
        _exit(ok ? 0 : 2);
    }
    bp_chan_t *a;
    assert_int_equal(bp_chan_bind(&a, BP_CHAN_PAIR, ep, &err), 0);
    static bp_plan_t p;
    memset(&p, 0, sizeof p);
    p.model_path = "/m.gguf";
    p.n_layers = 9;
    p.n_expert = 4;
    p.n_stages = 2;
    p.stages[0] = (bp_plan_stage_t){.process = 0, .layer_begin = 0, .layer_end = 5, .device = -1};
    p.stages[1] = (bp_plan_stage_t){.process = 1, .layer_begin = 5, .layer_end = 9, .device = 3, .threads = 6,
                                    .threads_batch = 6};
    p.host[6] = p.host[8] = 1;
    p.host_process = 2;
    p.kv_type = 0; /* f32 */
    p.n_ctx = 128;
    p.n_slots = 1;
    p.threads = 1;
    p.poll = 37;
    p.cpu_strict = 1;
    p.experts_vram = (int64_t)3 << 30;
    p.no_residency = 1;
    p.you = 1;
    assert_int_equal(bp_chan_send_plan(a, NULL, &p, 5000, &err), 0);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_int_equal(WEXITSTATUS(status), 0);
    p.kv_type = 2; /* q4_1: no KV type */
    assert_int_equal(bp_chan_send_plan(a, NULL, &p, 0, &err), BL_EINVAL);
    p.kv_type = 1;
    p.experts_vram = -2; /* below automatic */
    assert_int_equal(bp_chan_send_plan(a, NULL, &p, 0, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "experts_vram"));
    p.experts_vram = -1;
    p.kv_type = 1;
    p.stages[1].device = 300;
    assert_int_equal(bp_chan_send_plan(a, NULL, &p, 0, &err), BL_EINVAL);
    p.stages[1].device = 3;
    p.stages[1].threads = 257;
    assert_int_equal(bp_chan_send_plan(a, NULL, &p, 0, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "threads"));
    bp_chan_destroy(a);
}

static void test_chan_pair_round_trip_and_timeout(void **state)
{
    (void)state;
    char ep[256];
    endpoint(ep, sizeof ep, "pair");
    bl_err_t err = {0};
    bp_chan_t *a;
    pid_t pid = fork(); /* before any ZeroMQ context, as above */
    assert_true(pid >= 0);
    if (pid == 0) {
        bp_chan_t *b;
        bp_msg_t in;
        if (bp_chan_connect(&b, BP_CHAN_PAIR, ep, NULL, &err) ||
            bp_chan_recv(b, NULL, &in, 5000, &err) || in.type != BP_MSG_READY)
            _exit(1);
        /* Echo it back, then stay silent until told to go. */
        if (bp_chan_send(b, NULL, &in, 5000, &err))
            _exit(2);
        bp_msg_free(&in);
        if (bp_chan_recv(b, NULL, &in, 5000, &err) || in.type != BP_MSG_SHUTDOWN)
            _exit(3);
        bp_msg_free(&in);
        bp_chan_destroy(b);
        _exit(0);
    }
    assert_int_equal(bp_chan_bind(&a, BP_CHAN_PAIR, ep, &err), 0);
    Bloomery__Ready r;
    bp_msg_t m = ready_msg(&r, 77), in;
    assert_int_equal(bp_chan_send(a, NULL, &m, 5000, &err), 0);
    assert_int_equal(bp_chan_recv(a, NULL, &in, 5000, &err), 0);
    assert_int_equal(in.u.ready->process, 77);
    bp_msg_free(&in);
    /* The peer is silent now: a bounded wait, then BL_ETIMEDOUT naming the endpoint. */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(bp_chan_recv(a, NULL, &in, 50, &err), BL_ETIMEDOUT);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
    assert_true(ms >= 45);
    assert_non_null(strstr(err.msg, ep));
    assert_int_equal(bp_chan_recv(a, NULL, &in, 0, &err), BL_ETIMEDOUT);
    Bloomery__Shutdown sd = BLOOMERY__SHUTDOWN__INIT;
    assert_int_equal(bp_chan_send(a, NULL, &(bp_msg_t){.type = BP_MSG_SHUTDOWN, .u.shutdown = &sd},
                                  5000, &err), 0);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_int_equal(WEXITSTATUS(status), 0);
    bp_chan_destroy(a);
}

/* A peer that speaks raw ZeroMQ: garbage, an unknown type byte, a multipart message.
 * Each is an error for that recv only; a valid message afterwards still arrives. */
static void test_chan_garbage_from_peer_is_refused(void **state)
{
    (void)state;
    char ep[256];
    endpoint(ep, sizeof ep, "garbage");
    bl_err_t err = {0};
    bp_chan_t *r;
    assert_int_equal(bp_chan_bind(&r, BP_CHAN_ROUTER, ep, &err), 0);
    void *ctx = zmq_ctx_new();
    void *d = zmq_socket(ctx, ZMQ_DEALER);
    assert_int_equal(zmq_setsockopt(d, ZMQ_ROUTING_ID, "evil", 4), 0);
    assert_int_equal(zmq_connect(d, ep), 0);
    const uint8_t garbage[] = {BP_MSG_PLAN, 0xff, 0xff, 0xff, 0xff, 0xff, 0x0f, 0x12};
    assert_int_equal(zmq_send(d, garbage, sizeof garbage, 0), (int)sizeof garbage);
    const uint8_t unknown[] = {99, 1, 2};
    assert_int_equal(zmq_send(d, unknown, sizeof unknown, 0), (int)sizeof unknown);
    assert_int_equal(zmq_send(d, "\x04", 1, ZMQ_SNDMORE), 1);
    assert_int_equal(zmq_send(d, "\x04", 1, 0), 1);
    assert_int_equal(zmq_send(d, "\x04", 1, 0), 1); /* a valid, empty Ready */

    bp_peer_t from;
    bp_msg_t in;
    assert_int_equal(bp_chan_recv(r, &from, &in, 5000, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "from evil"));
    assert_non_null(strstr(err.msg, "does not decode"));
    assert_int_equal(bp_chan_recv(r, &from, &in, 5000, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "unknown type byte 99"));
    assert_int_equal(bp_chan_recv(r, &from, &in, 5000, &err), BL_EPROTO);
    assert_non_null(strstr(err.msg, "multipart"));
    assert_int_equal(bp_chan_recv(r, &from, &in, 5000, &err), 0);
    assert_int_equal(in.type, BP_MSG_READY);
    bp_msg_free(&in);
    int linger = 0;
    zmq_setsockopt(d, ZMQ_LINGER, &linger, sizeof linger);
    zmq_close(d);
    zmq_ctx_term(ctx);
    bp_chan_destroy(r);
}

/* tcp with a free port: the bound endpoint goes to the child over a pipe (the child
 * is forked before this process has a ZeroMQ context). */
static void test_chan_tcp_free_port_round_trip(void **state)
{
    (void)state;
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fds[1]);
        char ep[256] = {0};
        ssize_t n = read(fds[0], ep, sizeof ep - 1);
        if (n <= 0)
            _exit(1);
        bl_err_t err = {0};
        bp_chan_t *d;
        bp_msg_t in;
        if (bp_chan_connect(&d, BP_CHAN_DEALER, ep, "tcpworker", &err) ||
            bp_chan_recv(d, NULL, &in, 5000, &err) || in.type != BP_MSG_READY)
            _exit(2);
        if (bp_chan_send(d, NULL, &in, 5000, &err))
            _exit(3);
        bp_msg_free(&in);
        bp_chan_destroy(d);
        _exit(0);
    }
    close(fds[0]);
    bl_err_t err = {0};
    bp_chan_t *r;
    assert_int_equal(bp_chan_bind(&r, BP_CHAN_ROUTER, "tcp://127.0.0.1:*", &err), 0);
    const char *ep = bp_chan_endpoint(r);
    assert_int_equal(strncmp(ep, "tcp://127.0.0.1:", 16), 0);
    assert_true(strchr(ep, '*') == NULL);
    assert_int_equal(write(fds[1], ep, strlen(ep)), (ssize_t)strlen(ep));
    close(fds[1]);
    /* The dealer connects in the background; a ROUTER cannot send before the peer
     * is known, so poll with short sends until it is (BL_ENOENT meanwhile). */
    bp_peer_t to = {.len = 9};
    memcpy(to.id, "tcpworker", 9);
    Bloomery__Ready rd;
    bp_msg_t m = ready_msg(&rd, 5);
    int rc = BL_ENOENT;
    for (int i = 0; i < 500 && rc == BL_ENOENT; i++) {
        rc = bp_chan_send(r, &to, &m, 100, &err);
        if (rc == BL_ENOENT)
            usleep(10000);
    }
    assert_int_equal(rc, 0);
    bp_peer_t from;
    bp_msg_t in;
    assert_int_equal(bp_chan_recv(r, &from, &in, 5000, &err), 0);
    assert_int_equal(in.type, BP_MSG_READY);
    assert_int_equal(in.u.ready->process, 5);
    assert_int_equal(from.len, 9);
    assert_memory_equal(from.id, "tcpworker", 9);
    bp_msg_free(&in);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_int_equal(WEXITSTATUS(status), 0);
    bp_chan_destroy(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chan_ipc_endpoint_limits),
        cmocka_unit_test(test_chan_bad_kind_and_scheme),
        cmocka_unit_test(test_chan_router_dealer_across_processes),
        cmocka_unit_test(test_chan_pair_round_trip_and_timeout),
        cmocka_unit_test(test_chan_plan_as_plain_values),
        cmocka_unit_test(test_chan_garbage_from_peer_is_refused),
        cmocka_unit_test(test_chan_tcp_free_port_round_trip),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
