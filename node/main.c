/* bloomery-node: a pipeline stage on another host than its router (docs/deploy.md,
 * "Several hosts"). Two modes of one program:
 *
 *   bloomery-node --listen tcp://ADDR:PORT --secret FILE
 *     the host's node: serves one relay at a time; for each it makes the stage's
 *     rings, starts bloomery-worker from its own folder on them and bridges the
 *     worker's control socket to the relay.
 *
 *   bloomery-node --relay tcp://HOST:PORT --secret FILE --control EP --identity ID
 *                 --parent PID [--name N] [log flags]
 *     started by bloomery-serve in the place of a stage's worker, with that worker's
 *     rings at proto/step.h's fds and its arguments: it connects to the node, and
 *     forwards control messages both ways and the rings' messages through link pumps.
 *     With --node-hosttier the stage's routed experts in host RAM are computed on the
 *     node's host: the node starts bloomery-hosttier for the stage beside its worker
 *     on the experts rings, which then never cross the links.
 *
 * Three CURVE links (proto/link.h) per session, keys from the cluster's secret: the
 * control messages on PORT (an envelope byte, then a packed bp_msg or the setup), the
 * stage's input and output on PORT+1, the hosttier's requests and replies on PORT+2
 * (when the router runs one). Everything from the other side is untrusted: the setup
 * is checked field by field, control messages are unpacked (validated) before they are
 * sent on, and the pumps refuse a message larger than the ring it goes into.
 *
 * A session ends when any link drops, the worker exits or the relay's router goes;
 * the relay then exits (the router sees a dead child and restarts the set, which
 * starts a new relay), and the node stops its worker and listens again. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "args.h"
#include "bl_config.h"
#include "bloomery.pb-c.h"
#include "chan.h"
#include "child.h"
#include "cpuset.h"
#include "fingerprint.h"
#include "link.h"
#include "log.h"
#include "msg.h"
#include "node.h"
#include "ring.h"
#include "step.h"
#include "wmem.h"


_Static_assert(BP_NODE_FINGERPRINT_BYTES == BL_FINGERPRINT_BYTES, "the model file's fingerprint fits its field");

#define N_LINKS 3
/* How long a relay waits for the node's handshake and the node for the setup. */
#define UP_MS 10000
#define TICK_MS 10
#define GRACE_MS 3000

static volatile sig_atomic_t g_stop;

static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

/* Monotonic milliseconds (proto/child.h's clock). */
static int64_t now_ms(void) { return (int64_t)(bp_now_us() / 1000); }

/* "tcp://HOST:PORT" with PORT + add; BL_EINVAL for another form. */
static int endpoint_plus(char *out, size_t cap, const char *ep, int add, bl_err_t *err)
{
    const char *colon = strrchr(ep, ':');
    char *end = NULL;
    errno = 0;
    const long port = colon ? strtol(colon + 1, &end, 10) : 0;
    if (strncmp(ep, "tcp://", 6) != 0 || !colon || colon == ep + 5 || errno || !end || *end || port < 1 ||
        port + N_LINKS - 1 > 65535)
        return bl_err_set(err, BL_EINVAL, "endpoint '%s' is not tcp://HOST:PORT with PORT 1..%d", ep,
                          65535 - (N_LINKS - 1));
    const int n = snprintf(out, cap, "%.*s:%ld", (int)(colon - ep), ep, port + add);
    return n > 0 && (size_t)n < cap ? 0 : bl_err_set(err, BL_ERANGE, "endpoint '%s' is too long", ep);
}

/* The largest ring message a data link may carry. */
static size_t data_max_msg(void) { return bp_ring_max_msg(BP_RING_MAX_CAPACITY); }

/* Sends one envelope (tag, then n bytes) on the control link. */
static int env_send(bp_link_t *l, char tag, const void *p, size_t n, bl_err_t *err)
{
    uint8_t stack[4096], *buf = n + 1 <= sizeof stack ? stack : malloc(n + 1);
    if (!buf)
        return bl_err_set(err, BL_ENOMEM, "out of memory for a control message of %zu bytes", n);
    buf[0] = (uint8_t)tag;
    memcpy(buf + 1, p, n);
    const int rc = bp_link_send(l, buf, n + 1, 5000, err);
    if (buf != stack)
        free(buf);
    return rc;
}

/* A control message packed into a BP_NODE_ENV_MSG envelope. */
static int msg_send(bp_link_t *l, const bp_msg_t *m, bl_err_t *err)
{
    const size_t cap = bp_msg_packed_size(m);
    uint8_t *buf = cap ? malloc(cap) : NULL;
    size_t n = 0;
    if (!buf)
        return bl_err_set(err, cap ? BL_ENOMEM : BL_EINVAL, "a control message of type %d", (int)m->type);
    int rc = bp_msg_pack(m, buf, cap, &n, err);
    if (rc == 0)
        rc = env_send(l, BP_NODE_ENV_MSG, buf, n, err);
    free(buf);
    return rc;
}

/* One envelope from the control link into *env, its tag one of accept
 * (bp_node_env_read: the caller frees env->msg). 0; BL_ETIMEDOUT when none came
 * within timeout_ms; BL_EAGAIN when one came that breaks the protocol: logged as
 * refused from peer ("node", "relay") and dropped, the link goes on; or the link's
 * failure. buf holds cap bytes. */
static int env_recv(bp_link_t *l, uint8_t *buf, size_t cap, const char *accept, int timeout_ms, const char *peer,
                    bp_node_env_t *env, bl_err_t *err)
{
    size_t n = 0;
    const int rc = bp_link_recv(l, buf, cap, &n, timeout_ms, err);
    if (rc)
        return rc;
    bl_err_t why = {0};
    if (bp_node_env_read(env, buf, n, accept, BL_VERSION, &why) != 0) {
        BL_LOG(BL_LOG_WARN, "event=%s_message_refused bytes=%zu reason=\"%s\"", peer, n, why.msg);
        return BL_EAGAIN;
    }
    return 0;
}

typedef struct link_send {
    bp_link_t *l;
    bl_err_t *err;
} link_send_t;

static int link_send_msg(void *ud, const bp_msg_t *m)
{
    const link_send_t *s = ud;
    return msg_send(s->l, m, s->err);
}

/* A fatal Error of process `process` with text, as a worker reports one, on the
 * control link. */
static int send_fatal(bp_link_t *l, uint32_t process, int code, const char *text, bl_err_t *err)
{
    link_send_t s = {.l = l, .err = err};
    return bp_msg_fatal(process, code, text, link_send_msg, &s);
}

// --- the relay ------------------------------------------------------------------------

typedef struct relay {
    bp_child_t ctl;       /* the router's control socket, as the stage's worker */
    bp_link_t *l[N_LINKS];
    bp_ring_t *r[4];      /* at BP_STEP_FD_IN.., with the worker's roles */
    int n_rings;
    int rings_rc;         /* relay_rings' failure, reported once the control socket is up */
    bl_err_t rings_err;
    int node_hosttier;    /* the experts rings stay on the node's host (held here, unused) */
} relay_t;

/* Attached before anything else opens a descriptor: fds 5 and 6 are the hosttier's
 * rings when the router runs one, else closed, until something takes them. */
static relay_t g_relay;

static const bp_ring_role_t k_worker_role[4] = {BP_RING_CONSUMER, BP_RING_PRODUCER, BP_RING_PRODUCER,
                                                 BP_RING_CONSUMER};

static int relay_rings(relay_t *r, bl_err_t *err)
{
    static const char *const what[4] = {"stage-in", "stage-out", "experts-out", "experts-in"};
    /* the router hands every stage the hosttier's rings when it runs one */
    r->n_rings = fcntl(BP_STEP_FD_EXPERTS_OUT, F_GETFD) >= 0 && fcntl(BP_STEP_FD_EXPERTS_IN, F_GETFD) >= 0 ? 4 : 2;
    for (int i = 0; i < r->n_rings; i++) {
        int rc = bp_ring_attach_fd(&r->r[i], BP_STEP_FD_IN + i, what[i], k_worker_role[i], err);
        close(BP_STEP_FD_IN + i);
        if (rc)
            return rc;
    }
    return 0;
}

/* Before a Plan: the router's model file, which the node checks its own against.
 * BL_ECLOSED when the link failed; another code when this host's file cannot be
 * fingerprinted (err says why; the Plan is not sent). */
static int send_model_file(relay_t *r, const bp_msg_t *plan, bl_err_t *err)
{
    bp_plan_t p;
    if (bp_plan_read(plan, &p, err) != 0)
        return 0; /* the worker refuses it with its own words */
    bp_node_file_t f;
    memset(&f, 0, sizeof f);
    int rc = bl_model_fingerprint(p.model_path, f.fingerprint, &f.size, err);
    if (rc) {
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err->msg);
        return bl_err_set(err, rc, "the router's model file cannot be fingerprinted: %s", why);
    }
    return env_send(r->l[0], BP_NODE_ENV_FILE, &f, sizeof f, err) == 0 ? 0 : BL_ECLOSED;
}

/* Control messages both ways until a side goes. Returns the exit status. */
static int relay_bridge(relay_t *r)
{
    bl_err_t err = {0};
    uint8_t *buf = malloc(BP_MSG_MAX_BYTES + 1);
    if (!buf)
        return 1;
    int status = 1, shutting = 0;
    for (;;) {
        if (bp_child_parent_gone(&r->ctl)) {
            status = 0;
            break;
        }
        bp_msg_t m = {0};
        int rc = bp_chan_recv(r->ctl.chan, NULL, &m, TICK_MS, &err);
        if (rc == 0) {
            shutting |= m.type == BP_MSG_SHUTDOWN;
            if (m.type == BP_MSG_PLAN && (rc = send_model_file(r, &m, &err)) != 0) {
                bp_msg_free(&m);
                if (rc != BL_ECLOSED)
                    goto refused;
                goto lost;
            }
            rc = msg_send(r->l[0], &m, &err);
            bp_msg_free(&m);
            if (rc)
                goto lost;
        } else {
            bp_msg_free(&m);
            if (rc != BL_ETIMEDOUT)
                BL_LOG(BL_LOG_WARN, "event=control_recv_failed reason=\"%s\"", err.msg);
        }
        bp_node_env_t env;
        rc = env_recv(r->l[0], buf, BP_MSG_MAX_BYTES + 1, "M", TICK_MS, "node", &env, &err);
        if (rc == BL_ETIMEDOUT) {
            for (int i = 1; i < N_LINKS; i++)
                if (r->l[i] && bp_link_pump_wait(r->l[i], 0, &err) != BL_EAGAIN)
                    goto lost;
            continue;
        }
        if (rc == BL_EAGAIN)
            continue;
        if (rc)
            goto lost;
        int32_t code;
        int fatal;
        const char *text;
        bp_msg_error_info(&env.msg, &code, &fatal, &text);
        if ((rc = bp_chan_send(r->ctl.chan, NULL, &env.msg, 2000, &err)) != 0)
            BL_LOG(BL_LOG_WARN, "event=control_send_failed reason=\"%s\"", err.msg);
        bp_msg_free(&env.msg);
        if (fatal) /* the node's last words: the stage is gone */
            break;
    }
    free(buf);
    return status;
refused:
    free(buf);
    bp_child_fatal(&r->ctl, &err);
    return 1;
lost:
    /* the node's last words (its worker's exit) may still be on the way when a data
     * link closed first */
    for (int64_t until = now_ms() + 300; !shutting && now_ms() < until;) {
        bp_node_env_t env;
        bl_err_t e2 = {0};
        const int rc = env_recv(r->l[0], buf, BP_MSG_MAX_BYTES + 1, "M", TICK_MS, "node", &env, &e2);
        if (rc == BL_ETIMEDOUT)
            continue;
        if (rc)
            break;
        const int last = env.msg.type == BP_MSG_ERROR;
        if (bp_chan_send(r->ctl.chan, NULL, &env.msg, 2000, &e2) != 0)
            BL_LOG(BL_LOG_WARN, "event=control_send_failed reason=\"%s\"", e2.msg);
        bp_msg_free(&env.msg);
        if (last) {
            free(buf);
            return 1;
        }
    }
    free(buf);
    if (shutting) /* the node ended the session the router asked to end */
        return 0;
    {
        bl_err_t e2 = {0};
        bl_err_set(&e2, BL_ECLOSED, "the node at %s is gone: %s", bp_link_endpoint(r->l[0]),
                   err.msg[0] ? err.msg : "its link closed");
        BL_LOG(BL_LOG_WARN, "event=node_lost endpoint=%s reason=\"%s\"", bp_link_endpoint(r->l[0]), e2.msg);
        bp_child_fatal(&r->ctl, &e2);
    }
    return 1;
}

/* ht_threads < 0: no hosttier on the node's host; else its threads (0: the plan's)
 * and ht_name its name (NULL: none). */
static int relay_main(const char *node, const uint8_t key[32], const char *control, const char *identity,
                      pid_t parent, const char *name, int32_t verbosity, uint32_t flags, int ht_threads,
                      const char *ht_name)
{
    relay_t r = g_relay;
    bl_err_t err = {0};
    r.node_hosttier = ht_threads >= 0;
    if (r.rings_rc == 0 && r.node_hosttier && r.n_rings != 4)
        r.rings_rc = bl_err_set(&r.rings_err, BL_EINVAL, "--node-hosttier: the router gave the stage no experts "
                                "rings");
    int rc = r.rings_rc ? r.rings_rc : bp_child_start(&r.ctl, control, identity, parent, name, &err);
    if (rc) {
        BL_LOG(BL_LOG_ERROR, "event=start_failed reason=\"%s\"", r.rings_rc ? r.rings_err.msg : err.msg);
        bp_child_stop(&r.ctl);
        return 1;
    }
    bp_node_setup_t s;
    memset(&s, 0, sizeof s);
    memcpy(s.magic, BP_NODE_SETUP_MAGIC, sizeof BP_NODE_SETUP_MAGIC);
    snprintf(s.version, sizeof s.version, "%s", BL_VERSION);
    snprintf(s.name, sizeof s.name, "%s", name);
    snprintf(s.identity, sizeof s.identity, "%s", identity);
    s.verbosity = verbosity;
    s.flags = flags;
    s.n_rings = (uint32_t)r.n_rings;
    for (int i = 0; i < r.n_rings; i++)
        s.capacity[i] = bp_ring_capacity(r.r[i]);
    if (r.node_hosttier) {
        s.flags |= BP_NODE_HOSTTIER;
        s.hosttier_threads = (uint32_t)ht_threads;
        if (ht_name)
            snprintf(s.hosttier_name, sizeof s.hosttier_name, "%s", ht_name);
    }
    /* the experts rings take the third link unless they stay on the node's host */
    const int n_links = r.n_rings == 4 && !r.node_hosttier ? 3 : 2;
    char ep[300];
    for (int i = 0; rc == 0 && i < n_links; i++)
        if ((rc = endpoint_plus(ep, sizeof ep, node, i, &err)) == 0)
            rc = bp_link_connect(&r.l[i], ep, key, i == 0 ? BP_MSG_MAX_BYTES + 1 : data_max_msg(), NULL, &err);
    for (int i = 0; rc == 0 && i < N_LINKS && r.l[i]; i++)
        if ((rc = bp_link_wait_up(r.l[i], UP_MS, &err)) != 0) {
            char why[sizeof err.msg];
            snprintf(why, sizeof why, "%s", err.msg);
            rc = bl_err_set(&err, rc, "the node at %s: %s", bp_link_endpoint(r.l[i]), why);
        }
    if (rc == 0)
        rc = env_send(r.l[0], BP_NODE_ENV_SETUP, &s, sizeof s, &err);
    /* the stage's input goes out and its output comes in on link 1; the hosttier's
     * requests come in and its replies go out on link 2 */
    if (rc == 0)
        rc = bp_link_pump(r.l[1], r.r[0], r.r[1], &err);
    if (rc == 0 && n_links == 3)
        rc = bp_link_pump(r.l[2], r.r[3], r.r[2], &err);
    int status = 1;
    if (rc) {
        BL_LOG(BL_LOG_ERROR, "event=start_failed reason=\"%s\"", err.msg);
        bp_child_fatal(&r.ctl, &err);
    } else {
        BL_LOG(BL_LOG_INFO, "event=relay_up node=%s rings=%d%s", node, r.n_rings,
               r.node_hosttier ? " hosttier=node" : "");
        status = relay_bridge(&r);
    }
    for (int i = 0; i < N_LINKS; i++)
        bp_link_close(r.l[i]);
    for (int i = 0; i < 4; i++)
        bp_ring_destroy(r.r[i]);
    bp_child_stop(&r.ctl);
    return status;
}

// --- the node -------------------------------------------------------------------------

#define HT_MAX_COUNTERS 16

typedef struct session {
    bp_link_t *l[N_LINKS];
    bp_ring_t *r[4];      /* the node's ends: producer of in, consumer of out, ... */
    bp_chan_t *chan;      /* the worker's control socket */
    char dir[64];         /* its folder */
    bp_peer_t worker;
    pid_t pid;
    bp_node_setup_t s;
    bp_node_file_t router_file; /* the router's model file, as the relay told it */
    int told_file;        /* router_file holds what the relay told since its last Plan */
    uint32_t process;     /* the stage's process id from the Plan */
    int stage;            /* its place among the Plan's stages; -1: none, or no Plan read */
    int n_links;          /* links in use: control, the stage's rings, the experts rings
                           * unless they stay here */
    /* the stage's hosttier on this host (BP_NODE_HOSTTIER), started with the Plan */
    pid_t ht_pid;
    bp_peer_t ht;
    int ht_hello, ht_ready;
    bp_msg_t ht_plan;     /* the Plan, until its Hello says it listens */
    int ht_has_plan;
    bp_msg_t held_ready;  /* the worker's Ready, passed on once the hosttier's came */
    int has_held_ready;
    /* its counters as its last Stats said them, named hosttier_<name>: they go with
     * the worker's Stats (the stage's in the router's /metrics) */
    struct {
        char name[48];
        uint64_t value;
    } ht_count[HT_MAX_COUNTERS];
    int n_ht_count;
} session_t;

/* After the node's last words (a fatal Error): the relay passes them on and exits;
 * closing first could drop them with the connection. */
static void await_relay(session_t *ss)
{
    for (int64_t until = now_ms() + 1000; bp_link_peer_up(ss->l[0]) && now_ms() < until;)
        usleep(10000);
}


/* This host's name as the probe's answer and the messages carry it: the bytes a name
 * may hold, others as '-'; `none` when the host has no name. */
static void host_name(char *out, size_t cap, const char *none)
{
    char name[256] = "";
    (void)gethostname(name, sizeof name - 1); /* on failure the name stays empty */
    size_t n = 0;
    for (; name[n] && n + 1 < cap; n++) {
        const char c = name[n];
        out[n] = c == '_' || c == '-' || c == '.' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
                         (c >= 'A' && c <= 'Z')
                     ? c
                     : '-';
    }
    out[n] = 0;
    if (n == 0)
        snprintf(out, cap, "%s", none);
}

/* This host's CUDA devices into h, as the workers started here would see them (the
 * worker's own listing: the router's plan reads its host's the same way). */
static int host_devices(bp_node_host_t *h, const char *worker_bin, bl_err_t *err)
{
    bl_device_t devs[BP_NODE_MAX_DEVICES];
    int n = 0;
    bl_err_t why = {0};
    if (bp_list_devices(worker_bin, devs, BP_NODE_MAX_DEVICES, &n, &why) != 0)
        return bl_err_set(err, why.code, "%s cannot list its CUDA devices: %s", h->hostname, why.msg);
    h->n_devices = (uint32_t)n;
    for (int i = 0; i < n; i++) {
        bp_node_device_t *d = &h->device[i];
        d->index = devs[i].index;
        snprintf(d->name, sizeof d->name, "%s", devs[i].name); /* printable, not empty: bp_list_devices' */
        d->total_bytes = devs[i].total_bytes < BP_NODE_MAX_MEM ? devs[i].total_bytes : BP_NODE_MAX_MEM;
        d->free_bytes = devs[i].free_bytes < d->total_bytes ? devs[i].free_bytes : d->total_bytes;
        d->read_mbps = devs[i].read_mbps < BP_NODE_MAX_MBPS ? devs[i].read_mbps : BP_NODE_MAX_MBPS;
    }
    return 0;
}

/* The answer to a router's probe (read and of this version): this host's CPUs,
 * memory and CUDA devices; the session ends once the router has them. */
static int answer_probe(session_t *ss, const char *worker_bin, uint32_t flags, bl_err_t *err)
{
    int rc;
    bp_node_host_t h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, BP_NODE_HOST_MAGIC, sizeof BP_NODE_HOST_MAGIC);
    host_name(h.hostname, sizeof h.hostname, "unknown");
    if ((rc = host_devices(&h, worker_bin, err)) != 0)
        return rc;
    const int cpus = bl_cpu_count(); /* the workers started here inherit this affinity */
    h.n_cpus = (uint32_t)(cpus < (int)BP_NODE_MAX_CPUS ? cpus : (int)BP_NODE_MAX_CPUS);
    h.mem_total = bl_mem_total();
    h.mem_available = bl_mem_available();
    h.mem_total = h.mem_total < BP_NODE_MAX_MEM ? h.mem_total : BP_NODE_MAX_MEM;
    if (h.mem_available > BP_NODE_MAX_MEM || (h.mem_total && h.mem_available > h.mem_total))
        h.mem_available = h.mem_total ? h.mem_total : BP_NODE_MAX_MEM;
    /* the rates the router's split weighs this host's CPU stages by, when it has a
     * split to weigh (a hostfile whose lines' layers= fix it asks for none) */
    if (flags & BP_NODE_PROBE_RATES) {
        h.read_mbps_one = bl_mem_read_mbps(1);
        h.read_mbps_all = bl_mem_read_mbps(cpus);
    }
    h.read_mbps_one = h.read_mbps_one < BP_NODE_MAX_MBPS ? h.read_mbps_one : BP_NODE_MAX_MBPS;
    h.read_mbps_all = h.read_mbps_all < BP_NODE_MAX_MBPS ? h.read_mbps_all : BP_NODE_MAX_MBPS;
    /* the data links first: once the router sees this session end, none of it listens
     * where a relay started next connects */
    for (int i = N_LINKS - 1; i > 0; i--) {
        bp_link_close(ss->l[i]);
        ss->l[i] = NULL;
    }
    if ((rc = env_send(ss->l[0], BP_NODE_ENV_HOST, &h, sizeof h, err)) != 0)
        return rc;
    BL_LOG(BL_LOG_INFO, "event=probe_answered host=%s cpus=%u mem_available=%llu mem_total=%llu read_mbps_one=%u "
           "read_mbps_all=%u devices=%u", h.hostname, h.n_cpus, (unsigned long long)h.mem_available,
           (unsigned long long)h.mem_total, h.read_mbps_one, h.read_mbps_all, h.n_devices);
    /* the router's word that it has the answer (or its going): closing before could
     * drop the answer with the connection */
    uint8_t done[8];
    bp_node_env_t env;
    bl_err_t e2 = {0};
    for (int64_t until = now_ms() + UP_MS; !g_stop && bp_link_peer_up(ss->l[0]) && now_ms() < until;) {
        rc = env_recv(ss->l[0], done, sizeof done, "D", TICK_MS, "router", &env, &e2);
        if (rc != BL_ETIMEDOUT && rc != BL_EAGAIN) /* the word, or a link that failed */
            break;
    }
    return 0;
}

/* The relay's log settings as a child's arguments, at argv[a]: the new count (at
 * most 5 more). lv holds the -lv value. */
static int log_args(const session_t *ss, char **argv, int a, char *lv, size_t cap)
{
    if (ss->s.flags & BP_NODE_VERBOSE)
        argv[a++] = (char *)"--verbose";
    if (ss->s.flags & BP_NODE_QUIET)
        argv[a++] = (char *)"--log-disable";
    if (ss->s.flags & BP_NODE_COLORS)
        argv[a++] = (char *)"--log-colors";
    if (ss->s.verbosity >= 0) {
        snprintf(lv, cap, "%d", (int)ss->s.verbosity);
        argv[a++] = (char *)"-lv";
        argv[a++] = lv;
    }
    return a;
}

/* The worker started on the session's rings, its control socket in s->dir. */
static int spawn_worker(session_t *ss, const char *worker_bin, bl_err_t *err)
{
    char ep[160];
    int rc = bp_chan_ipc_endpoint(ep, sizeof ep, ss->dir, "node", err);
    if (rc == 0)
        rc = bp_chan_bind(&ss->chan, BP_CHAN_ROUTER, ep, err);
    if (rc)
        return rc;
    int fds[4], n = (int)ss->s.n_rings;
    for (int i = 0; i < n; i++)
        fds[i] = bp_ring_fd(ss->r[i]);
    char parent[24], lv[16];
    snprintf(parent, sizeof parent, "%d", (int)getpid());
    char *argv[16];
    int a = 0;
    argv[a++] = (char *)worker_bin;
    argv[a++] = (char *)"--control";
    argv[a++] = ep;
    argv[a++] = (char *)"--identity";
    argv[a++] = ss->s.identity;
    argv[a++] = (char *)"--parent";
    argv[a++] = parent;
    argv[a++] = (char *)"--name";
    argv[a++] = ss->s.name;
    a = log_args(ss, argv, a, lv, sizeof lv);
    argv[a] = NULL;
    if ((rc = bp_spawn(&ss->pid, argv, fds, n, 1, ss->s.name, err)) != 0)
        return rc;
    snprintf((char *)ss->worker.id, sizeof ss->worker.id, "%s", ss->s.identity);
    ss->worker.len = strlen(ss->s.identity);
    BL_LOG(BL_LOG_INFO, "event=child_started process=%s pid=%d", ss->s.name, (int)ss->pid);
    return 0;
}

/* The stage's hosttier on this host, for stage `stage` of the Plan: its control
 * socket the worker's, the experts rings' other ends at its first fds. */
static int spawn_hosttier(session_t *ss, const char *ht_bin, int stage, bl_err_t *err)
{
    char ep[160], parent[24], threads[16], st[16], lv[16];
    int rc = bp_chan_ipc_endpoint(ep, sizeof ep, ss->dir, "node", err);
    if (rc)
        return rc;
    if (access(ht_bin, X_OK) != 0)
        return bl_err_set(err, BL_ENOENT, "no bloomery-hosttier beside bloomery-node (%s)", ht_bin);
    const int fds[2] = {bp_ring_fd(ss->r[2]), bp_ring_fd(ss->r[3])};
    snprintf(parent, sizeof parent, "%d", (int)getpid());
    snprintf(threads, sizeof threads, "%u", ss->s.hosttier_threads);
    snprintf(st, sizeof st, "%d", stage);
    char *argv[20];
    int a = 0;
    argv[a++] = (char *)ht_bin;
    argv[a++] = (char *)"--control";
    argv[a++] = ep;
    argv[a++] = (char *)"--identity";
    argv[a++] = (char *)"hosttier";
    argv[a++] = (char *)"--parent";
    argv[a++] = parent;
    argv[a++] = (char *)"--stage";
    argv[a++] = st;
    if (ss->s.hosttier_threads > 0) {
        argv[a++] = (char *)"--threads";
        argv[a++] = threads;
    }
    if (ss->s.hosttier_name[0]) {
        argv[a++] = (char *)"--name";
        argv[a++] = ss->s.hosttier_name;
    }
    a = log_args(ss, argv, a, lv, sizeof lv);
    argv[a] = NULL;
    if ((rc = bp_spawn(&ss->ht_pid, argv, fds, 2, 1, "hosttier", err)) != 0)
        return rc;
    snprintf((char *)ss->ht.id, sizeof ss->ht.id, "hosttier");
    ss->ht.len = strlen("hosttier");
    BL_LOG(BL_LOG_INFO, "event=child_started process=hosttier stage=%d pid=%d", stage, (int)ss->ht_pid);
    return 0;
}

/* A Plan whose model file here is not the router's is answered with an Error naming
 * both, and not passed on. Returns 1 when refused. */
static int plan_refused(session_t *ss, const bp_msg_t *m)
{
    bp_plan_t p;
    bl_err_t err = {0};
    ss->stage = -1;
    if (bp_plan_read(m, &p, &err) != 0)
        return 0; /* the worker refuses it with its own words */
    ss->process = p.you;
    for (int i = 0; i < p.n_stages; i++)
        if (p.stages[i].process == p.you)
            ss->stage = i;
    char host[64], text[1400];
    host_name(host, sizeof host, "this host");
    const int told = ss->told_file;
    ss->told_file = 0; /* each Plan comes after its own */
    uint8_t fp[BL_FINGERPRINT_BYTES];
    uint64_t size = 0;
    const int rc = told ? bl_model_fingerprint(p.model_path, fp, &size, &err) : 0;
    if (!told) {
        snprintf(text, sizeof text, "%s on %s: the relay sent a Plan without the router's model file first",
                 ss->s.name, host);
    } else if (rc == BL_ENOENT) {
        snprintf(text, sizeof text, "%s on %s: no model file here: %s", ss->s.name, host, err.msg);
    } else if (rc) {
        snprintf(text, sizeof text, "%s on %s: %s here is not the router's model: %s", ss->s.name, host,
                 p.model_path, err.msg);
    } else if (size != ss->router_file.size ||
               memcmp(fp, ss->router_file.fingerprint, sizeof fp) != 0) {
        char here[16], there[16];
        bl_fingerprint_hex(fp, 12, here);
        bl_fingerprint_hex(ss->router_file.fingerprint, 12, there);
        snprintf(text, sizeof text, "%s on %s: %s differs from the router's (another file or version of the "
                 "model): here %llu bytes, fingerprint %s; at the router %llu bytes, fingerprint %s", ss->s.name,
                 host, p.model_path, (unsigned long long)size, here,
                 (unsigned long long)ss->router_file.size, there);
    } else {
        return 0;
    }
    BL_LOG(BL_LOG_ERROR, "event=plan_refused reason=\"%s\"", text);
    if (send_fatal(ss->l[0], p.you, BL_EINVAL, text, &err) != 0)
        BL_LOG(BL_LOG_WARN, "event=control_send_failed reason=\"%s\"", err.msg);
    return 1;
}

static void describe(int status, char *buf, size_t cap)
{
    if (WIFSIGNALED(status))
        snprintf(buf, cap, "killed by signal %d", WTERMSIG(status));
    else
        snprintf(buf, cap, "exited with status %d", WEXITSTATUS(status));
}

/* The worker has exited with status: its last words first, which may still be on
 * their way through its control socket and say why better than its exit does (a
 * fatal Error: "device: ..."), then, when it failed, its exit as the node's own. */
static void worker_exited(session_t *ss, int status, bl_err_t *err)
{
    bp_peer_t from;
    bp_msg_t last = {0};
    while (bp_chan_recv(ss->chan, &from, &last, 50, err) == 0) {
        const int sent = msg_send(ss->l[0], &last, err);
        bp_msg_free(&last);
        if (sent != 0)
            break;
    }
    bp_msg_free(&last);
    char how[64], host[64], text[256];
    describe(status, how, sizeof how);
    host_name(host, sizeof host, "this host");
    ss->pid = 0;
    snprintf(text, sizeof text, "%s on %s %s", ss->s.name, host, how);
    BL_LOG(BL_LOG_WARN, "event=child_exited process=%s %s", ss->s.name, how);
    if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
        if (send_fatal(ss->l[0], ss->process, BL_ECLOSED, text, err) == 0)
            await_relay(ss);
    }
}

/* Whether a message came from the stage's hosttier (once started, also after it exited). */
static int from_hosttier_peer(const session_t *ss, const bp_peer_t *from)
{
    return ss->ht.len > 0 && from->len == ss->ht.len && memcmp(from->id, ss->ht.id, from->len) == 0;
}

/* A message of the stage's hosttier on this host: its Hello lets the Plan go to it,
 * its Ready lets the worker's Ready go on, a fatal Error ends the session as the
 * stage's (its progress and counters stay here). Returns 1 when the session ends. */
static int from_hosttier(session_t *ss, const bp_msg_t *m, bl_err_t *err)
{
    if (m->type == BP_MSG_HELLO) {
        ss->ht_hello = 1;
        if (ss->ht_has_plan) {
            if (bp_chan_send(ss->chan, &ss->ht, &ss->ht_plan, 2000, err) != 0)
                BL_LOG(BL_LOG_WARN, "event=control_send_failed process=hosttier reason=\"%s\"", err->msg);
            bp_msg_free(&ss->ht_plan);
            ss->ht_has_plan = 0;
        }
    } else if (m->type == BP_MSG_READY) {
        ss->ht_ready = 1;
        BL_LOG(BL_LOG_INFO, "event=hosttier_ready stage=%s", ss->s.name);
        if (ss->has_held_ready) {
            if (msg_send(ss->l[0], &ss->held_ready, err) != 0)
                BL_LOG(BL_LOG_WARN, "event=control_send_failed reason=\"%s\"", err->msg);
            bp_msg_free(&ss->held_ready);
            ss->has_held_ready = 0;
        }
    } else if (m->type == BP_MSG_STATS) {
        bp_msg_counter_t c[HT_MAX_COUNTERS];
        uint64_t up = 0;
        const int n = bp_msg_stats_read(m, &up, c, HT_MAX_COUNTERS);
        int k = 0;
        for (int i = 0; i < n; i++) {
            const int w = snprintf(ss->ht_count[k].name, sizeof ss->ht_count[k].name, "hosttier_%s", c[i].name);
            if (w > 0 && (size_t)w < sizeof ss->ht_count[k].name)
                ss->ht_count[k++].value = c[i].value;
        }
        ss->n_ht_count = k;
    } else if (m->type == BP_MSG_ERROR) {
        int32_t code;
        int fatal;
        const char *text;
        bp_msg_error_info(m, &code, &fatal, &text);
        BL_LOG(fatal ? BL_LOG_ERROR : BL_LOG_WARN, "event=hosttier_error reason=\"%s\"", text ? text : "");
        if (!fatal)
            return 0;
        char host[64], why[1200];
        host_name(host, sizeof host, "this host");
        snprintf(why, sizeof why, "%s's hosttier on %s: %s", ss->s.name, host, text ? text : "failed");
        if (send_fatal(ss->l[0], ss->process, code ? code : BL_EIO, why, err) == 0)
            await_relay(ss);
        return 1;
    }
    return 0;
}

/* The worker's Stats on the link, with the hosttier's counters of its last Stats
 * after the worker's own (as many as fit BP_CHILD_MAX_COUNTERS). */
static int send_stats(session_t *ss, const bp_msg_t *m, bl_err_t *err)
{
    if (!m->u.stats || ss->n_ht_count == 0)
        return msg_send(ss->l[0], m, err);
    Bloomery__Stats st = *m->u.stats;
    Bloomery__Counter extra[HT_MAX_COUNTERS], *all[BP_CHILD_MAX_COUNTERS];
    const size_t room = BP_CHILD_MAX_COUNTERS - (size_t)ss->n_ht_count;
    size_t n = st.n_counters < room ? st.n_counters : room;
    for (size_t i = 0; i < n; i++)
        all[i] = st.counters[i];
    for (int j = 0; j < ss->n_ht_count; j++) {
        bloomery__counter__init(&extra[j]);
        extra[j].name = ss->ht_count[j].name;
        extra[j].value = ss->ht_count[j].value;
        all[n++] = &extra[j];
    }
    st.counters = all;
    st.n_counters = n;
    bp_msg_t both = *m;
    both.u.stats = &st;
    return msg_send(ss->l[0], &both, err);
}

/* The stage's hosttier has exited with status: its last words first (a fatal Error
 * says why better than its exit), then its exit as the stage's failure, unless the
 * session is ending anyway (the router's Shutdown, or the worker gone with it).
 * Returns 1: the session ends. */
static int hosttier_exited(session_t *ss, int status, int shutting, bl_err_t *err)
{
    char how[64];
    describe(status, how, sizeof how);
    BL_LOG(BL_LOG_WARN, "event=child_exited process=hosttier %s", how);
    ss->ht_pid = 0;
    bp_peer_t from;
    bp_msg_t m = {0};
    while (bp_chan_recv(ss->chan, &from, &m, 50, err) == 0) {
        const int end = from_hosttier_peer(ss, &from) ? from_hosttier(ss, &m, err) : msg_send(ss->l[0], &m, err) != 0;
        bp_msg_free(&m);
        if (end)
            return 1;
    }
    bp_msg_free(&m);
    if (shutting)
        return 1;
    int ws;
    for (int64_t until = now_ms() + 500; now_ms() < until; usleep(10000))
        if (waitpid(ss->pid, &ws, WNOHANG) == ss->pid) { /* the worker went first: its words */
            worker_exited(ss, ws, err);
            return 1;
        }
    char host[64], text[256];
    host_name(host, sizeof host, "this host");
    snprintf(text, sizeof text, "%s's hosttier on %s %s", ss->s.name, host, how);
    if (send_fatal(ss->l[0], ss->process, BL_ECLOSED, text, err) == 0)
        await_relay(ss);
    return 1;
}

/* With a hosttier here, the Plan (read by plan_refused, which found this worker's
 * stage) starts it for that stage; the Plan goes to it once it says Hello (the
 * caller keeps m: 1 when m was taken). A Plan without this worker's stage is the
 * worker's to refuse. A failure to start it ends the session as the stage's (-1). */
static int plan_to_hosttier(session_t *ss, bp_msg_t *m, const char *ht_bin)
{
    if (!(ss->s.flags & BP_NODE_HOSTTIER) || m->type != BP_MSG_PLAN || ss->ht_pid != 0 || ss->ht_has_plan ||
        ss->stage < 0)
        return 0;
    bl_err_t err = {0};
    const int rc = spawn_hosttier(ss, ht_bin, ss->stage, &err);
    if (rc) {
        char text[sizeof err.msg + 64];
        snprintf(text, sizeof text, "%s: %s", ss->s.name, err.msg);
        BL_LOG(BL_LOG_ERROR, "event=session_failed reason=\"%s\"", text);
        if (send_fatal(ss->l[0], ss->process, rc, text, &err) == 0)
            await_relay(ss);
        return -1;
    }
    ss->ht_plan = *m; /* kept until its Hello */
    ss->ht_has_plan = 1;
    return 1;
}

/* Bridges the worker's control socket (and the hosttier's, when this host runs the
 * stage's) and the link until a side goes. */
static void node_bridge(session_t *ss, const char *ht_bin)
{
    bl_err_t err = {0};
    uint8_t *buf = malloc(BP_MSG_MAX_BYTES + 1);
    if (!buf)
        return;
    int shutting = 0;
    while (!g_stop) {
        int status;
        if (waitpid(ss->pid, &status, WNOHANG) == ss->pid) {
            worker_exited(ss, status, &err);
            break;
        }
        if (ss->ht_pid > 0 && waitpid(ss->ht_pid, &status, WNOHANG) == ss->ht_pid &&
            hosttier_exited(ss, status, shutting, &err))
            break;
        bp_peer_t from;
        bp_msg_t m = {0};
        int rc = bp_chan_recv(ss->chan, &from, &m, TICK_MS, &err);
        if (rc == 0 && from_hosttier_peer(ss, &from)) {
            const int end = from_hosttier(ss, &m, &err);
            bp_msg_free(&m);
            if (end)
                break;
            continue;
        }
        if (rc == 0 && m.type == BP_MSG_READY && (ss->s.flags & BP_NODE_HOSTTIER) && !ss->ht_ready &&
            !ss->has_held_ready) { /* the stage is ready when its hosttier is too */
            ss->held_ready = m;
            ss->has_held_ready = 1;
            continue;
        }
        if (rc == 0)
            rc = m.type == BP_MSG_STATS ? send_stats(ss, &m, &err) : msg_send(ss->l[0], &m, &err);
        else if (rc == BL_ETIMEDOUT)
            rc = 0;
        bp_msg_free(&m);
        if (rc && rc != BL_EINVAL && rc != BL_EPROTO && rc != BL_ERANGE)
            break;
        bp_node_env_t env;
        rc = env_recv(ss->l[0], buf, BP_MSG_MAX_BYTES + 1, "FM", TICK_MS, "relay", &env, &err);
        if (rc == BL_ETIMEDOUT) {
            int lost = 0;
            for (int i = 1; i < ss->n_links; i++)
                lost |= bp_link_pump_wait(ss->l[i], 0, &err) != BL_EAGAIN;
            /* a worker that exits closes its rings, which stops the pumps: its exit,
             * not the link, is then what ended the session, and it says why */
            for (int64_t until = now_ms() + 500; lost && now_ms() < until; usleep(10000))
                if (waitpid(ss->pid, &status, WNOHANG) == ss->pid) {
                    worker_exited(ss, status, &err);
                    break;
                }
            if (lost)
                break;
            continue;
        }
        if (rc == BL_EAGAIN) {
            if (buf[0] == BP_NODE_ENV_FILE) /* a model file refused: the Plan after it is refused as untold */
                ss->told_file = 0;
            continue;
        }
        if (rc)
            break;
        if (env.tag == BP_NODE_ENV_FILE) {
            ss->router_file = env.u.file;
            ss->told_file = 1;
            continue;
        }
        if (env.msg.type == BP_MSG_PLAN && plan_refused(ss, &env.msg)) {
            bp_msg_free(&env.msg); /* the session ends: the relay passes the Error on and exits */
            await_relay(ss);
            break;
        }
        if (bp_chan_send(ss->chan, &ss->worker, &env.msg, 2000, &err) != 0)
            BL_LOG(BL_LOG_WARN, "event=control_send_failed reason=\"%s\"", err.msg);
        if (env.msg.type == BP_MSG_STATS && ss->ht_pid > 0 && ss->ht_hello &&
            bp_chan_send(ss->chan, &ss->ht, &env.msg, 2000, &err) != 0) /* its counters for the next answer */
            BL_LOG(BL_LOG_DEBUG, "event=control_send_failed process=hosttier reason=\"%s\"", err.msg);
        if (env.msg.type == BP_MSG_SHUTDOWN) {
            shutting = 1;
            if (ss->ht_pid > 0 && ss->ht_hello && bp_chan_send(ss->chan, &ss->ht, &env.msg, 2000, &err) != 0)
                BL_LOG(BL_LOG_WARN, "event=control_send_failed process=hosttier reason=\"%s\"", err.msg);
        }
        const int taken = plan_to_hosttier(ss, &env.msg, ht_bin);
        if (taken <= 0)
            bp_msg_free(&env.msg);
        if (taken < 0)
            break;
    }
    free(buf);
}

/* A child still running: asked, then made to stop. */
static void stop_child(pid_t pid)
{
    if (pid <= 0)
        return;
    kill(pid, SIGTERM);
    const int64_t until = now_ms() + GRACE_MS;
    int status;
    while (waitpid(pid, &status, WNOHANG) == 0 && now_ms() < until)
        usleep(10000);
    if (waitpid(pid, &status, WNOHANG) == 0) {
        kill(pid, SIGKILL);
        (void)waitpid(pid, &status, 0);
    }
}

static void session_end(session_t *ss)
{
    stop_child(ss->pid);
    stop_child(ss->ht_pid);
    if (ss->ht_has_plan)
        bp_msg_free(&ss->ht_plan);
    if (ss->has_held_ready)
        bp_msg_free(&ss->held_ready);
    bp_chan_destroy(ss->chan);
    for (int i = 0; i < N_LINKS; i++)
        bp_link_close(ss->l[i]);
    for (int i = 0; i < 4; i++)
        bp_ring_destroy(ss->r[i]);
    if (ss->dir[0]) {
        char sock[128];
        snprintf(sock, sizeof sock, "%s/node.sock", ss->dir);
        unlink(sock);
        rmdir(ss->dir);
    }
    memset(ss, 0, sizeof *ss);
}

/* One relay's session: the links, the setup, the rings, the worker (and the stage's
 * hosttier, when the setup asks for one here), the bridge. */
static int node_session(const char *listen, const uint8_t key[32], const char *worker_bin, const char *ht_bin)
{
    static session_t ss;
    memset(&ss, 0, sizeof ss);
    bl_err_t err = {0};
    char ep[300];
    int rc = 0;
    for (int i = 0; rc == 0 && i < N_LINKS; i++)
        if ((rc = endpoint_plus(ep, sizeof ep, listen, i, &err)) == 0)
            rc = bp_link_listen(&ss.l[i], ep, key, i == 0 ? BP_MSG_MAX_BYTES + 1 : data_max_msg(), NULL, &err);
    if (rc) {
        BL_LOG(BL_LOG_ERROR, "event=listen_failed endpoint=%s reason=\"%s\"", listen, err.msg);
        session_end(&ss);
        return rc;
    }
    BL_LOG(BL_LOG_INFO, "event=node_listening endpoint=%s", listen);
    while (!g_stop && (rc = bp_link_wait_up(ss.l[0], 200, &err)) == BL_ETIMEDOUT)
        ;
    if (g_stop || rc) {
        session_end(&ss);
        return 0;
    }
    /* a relay's setup, or the router's probe for this host's facts */
    uint8_t buf[1 + sizeof(bp_node_setup_t)];
    size_t n = 0;
    bp_node_env_t env;
    rc = bp_link_recv(ss.l[0], buf, sizeof buf, &n, UP_MS, &err);
    if (rc == 0)
        rc = bp_node_env_read(&env, buf, n, "SP", BL_VERSION, &err);
    if (rc == 0 && env.tag == BP_NODE_ENV_PROBE && (rc = answer_probe(&ss, worker_bin, env.u.probe.flags, &err)) == 0) {
        session_end(&ss);
        return 0;
    }
    if (rc == 0 && env.tag == BP_NODE_ENV_SETUP)
        ss.s = env.u.setup;
    /* the node's ends: producer of the stage's input, consumer of its output, consumer
     * of the hosttier requests, producer of the replies */
    static const bp_ring_role_t role[4] = {BP_RING_PRODUCER, BP_RING_CONSUMER, BP_RING_CONSUMER,
                                           BP_RING_PRODUCER};
    for (uint32_t i = 0; rc == 0 && i < ss.s.n_rings; i++) {
        char name[48];
        snprintf(name, sizeof name, "bloomery-node%u", i);
        rc = bp_ring_create(&ss.r[i], name, (size_t)ss.s.capacity[i], role[i], &err);
    }
    /* the experts rings over the third link, unless they stay here with a hosttier */
    ss.n_links = ss.s.n_rings == 4 && !(ss.s.flags & BP_NODE_HOSTTIER) ? 3 : 2;
    for (int i = 1; rc == 0 && i < ss.n_links; i++)
        rc = bp_link_wait_up(ss.l[i], UP_MS, &err);
    if (rc == 0)
        rc = bp_link_pump(ss.l[1], ss.r[1], ss.r[0], &err);
    if (rc == 0 && ss.n_links == 3)
        rc = bp_link_pump(ss.l[2], ss.r[2], ss.r[3], &err);
    const char *tmp = getenv("TMPDIR");
    snprintf(ss.dir, sizeof ss.dir, "%s/bloomery-node.XXXXXX", tmp && *tmp && strlen(tmp) < 40 ? tmp : "/tmp");
    if (rc == 0 && !mkdtemp(ss.dir)) {
        rc = bl_err_set(&err, BL_EIO, "mkdtemp %s: %s", ss.dir, strerror(errno));
        ss.dir[0] = 0;
    } else if (rc) {
        ss.dir[0] = 0;
    }
    if (rc == 0)
        rc = spawn_worker(&ss, worker_bin, &err);
    if (rc) {
        BL_LOG(BL_LOG_WARN, "event=session_failed reason=\"%s\"", err.msg);
        char text[sizeof err.msg + 64];
        snprintf(text, sizeof text, "%s: %s", ss.s.name[0] ? ss.s.name : "node", err.msg);
        if (send_fatal(ss.l[0], 0, rc, text, &err) == 0)
            await_relay(&ss);
    } else {
        BL_LOG(BL_LOG_INFO, "event=session_started worker=%s rings=%u%s", ss.s.name, ss.s.n_rings,
               ss.s.flags & BP_NODE_HOSTTIER ? " hosttier=here" : "");
        node_bridge(&ss, ht_bin);
    }
    session_end(&ss);
    BL_LOG(BL_LOG_INFO, "event=session_ended");
    return 0;
}

/* Program `prog` beside this one. */
static int beside_path(char *out, size_t cap, const char *argv0, const char *prog)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        snprintf(self, sizeof self, "%s", argv0);
        n = (ssize_t)strlen(self);
    }
    self[n] = 0;
    char *slash = strrchr(self, '/');
    const int w = slash ? snprintf(out, cap, "%.*s/%s", (int)(slash - self), self, prog) : snprintf(out, cap, "%s", prog);
    return w > 0 && (size_t)w < cap && access(out, X_OK) == 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
    const char *listen = NULL, *relay = NULL, *secret = NULL, *control = NULL, *identity = NULL;
    const char *name = "worker", *ht_name = NULL;
    int64_t parent = 0, verbosity = -1, ht_threads = 0;
    int node_hosttier = 0;
    int verbose = 0, quiet = 0, colors = 0, help = 0;
    bl_arg_t args[] = {
        {"--listen", NULL, BL_ARG_STR, &listen, .metavar = "tcp://ADDR:PORT",
         .help = "serve relays: the control link on PORT, the data links on PORT+1 and PORT+2"},
        {"--relay", NULL, BL_ARG_STR, &relay, .metavar = "tcp://HOST:PORT",
         .help = "be a stage's relay to the node there (started by bloomery-serve)"},
        {"--secret", NULL, BL_ARG_STR, &secret, .metavar = "FILE",
         .help = "the cluster's secret (mode 0600, at least 32 bytes); the links' keys come from it"},
        {"--control", NULL, BL_ARG_STR, &control, .metavar = "ENDPOINT", .help = "relay: the router's control socket"},
        {"--identity", NULL, BL_ARG_STR, &identity, .metavar = "ID", .help = "relay: the stage's routing id"},
        {"--parent", NULL, BL_ARG_I64, &parent, 1, INT32_MAX, .metavar = "PID", .help = "relay: the router's pid"},
        {"--name", NULL, BL_ARG_STR, &name, .metavar = "NAME", .help = "relay: the stage in logs and errors"},
        {"--node-hosttier", NULL, BL_ARG_FLAG, &node_hosttier,
         .help = "relay: the node starts a hosttier on its host for the stage's routed experts in host RAM"},
        {"--hosttier-threads", NULL, BL_ARG_I64, &ht_threads, 0, BP_NODE_MAX_HOSTTIER_THREADS, .metavar = "N",
         .help = "relay: that hosttier's threads (default 0: the plan's)"},
        {"--hosttier-name", NULL, BL_ARG_STR, &ht_name, .metavar = "NAME", .help = "relay: that hosttier in logs"},
        {"-v,--verbose", NULL, BL_ARG_FLAG, &verbose, .help = "log at DEBUG (a relay's worker too)"},
        {"--log-disable", NULL, BL_ARG_FLAG, &quiet, .help = "write no log lines"},
        {"-lv,--verbosity", NULL, BL_ARG_I64, &verbosity, 0, 100, .metavar = "N",
         .help = "llama.cpp's log threshold: 1 error, 2 warning, 3 info, 4 debug"},
        {"--log-colors", NULL, BL_ARG_FLAG, &colors, .help = "colour the level names"},
    };
    const int n_args = (int)(sizeof args / sizeof args[0]);
    bl_err_t err = {0};
    if (bl_args_parse(args, n_args, argc, argv, NULL, &help, &err)) {
        fprintf(stderr, "bloomery-node: %s\n", err.msg);
        return 2;
    }
    if (relay && !help) /* before any descriptor is opened (g_relay) */
        g_relay.rings_rc = relay_rings(&g_relay, &g_relay.rings_err);
    if (help || !secret || !listen == !relay || (relay && (!control || !identity || !parent))) {
        bl_args_usage(help ? stdout : stderr, "bloomery-node",
                      "--listen tcp://ADDR:PORT --secret FILE | --relay tcp://HOST:PORT --secret FILE --control EP "
                      "--identity ID --parent PID",
                      args, n_args);
        return help ? 0 : 2;
    }
    bl_log_init(relay ? name : "node", quiet           ? BL_LOG_OFF
                                       : verbosity >= 0 ? bl_log_level_of_verbosity(verbosity)
                                       : verbose        ? BL_LOG_DEBUG
                                                        : BL_LOG_INFO);
    bl_log_set_colors(colors);
    uint8_t key[32];
    char ep[300];
    if (bp_secret_load(secret, key, &err) != 0 || endpoint_plus(ep, sizeof ep, relay ? relay : listen, 0, &err)) {
        BL_LOG(BL_LOG_ERROR, "event=start_failed reason=\"%s\"", err.msg);
        return 1;
    }
    if (relay) {
        const uint32_t flags = (verbose ? BP_NODE_VERBOSE : 0) | (quiet ? BP_NODE_QUIET : 0) | (colors ? BP_NODE_COLORS : 0);
        return relay_main(relay, key, control, identity, (pid_t)parent, name, (int32_t)verbosity, flags,
                          node_hosttier ? (int)ht_threads : -1, ht_name);
    }
    char worker_bin[PATH_MAX], ht_bin[PATH_MAX];
    if (beside_path(worker_bin, sizeof worker_bin, argv[0], "bloomery-worker") != 0) {
        BL_LOG(BL_LOG_ERROR, "event=start_failed reason=\"no bloomery-worker beside this program\"");
        return 1;
    }
    /* a session that asks for a hosttier here fails by name when there is none */
    (void)beside_path(ht_bin, sizeof ht_bin, argv[0], "bloomery-hosttier");
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    while (!g_stop)
        if (node_session(listen, key, worker_bin, ht_bin) != 0)
            return 1;
    BL_LOG(BL_LOG_INFO, "event=node_stopped");
    return 0;
}
