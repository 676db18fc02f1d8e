/* ZeroMQ control channels: see chan.h. The only file that calls libzmq. */
#include "chan.h"

#include "bloomery.pb-c.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

struct bp_chan {
    void *ctx;
    void *sock;
    bp_chan_kind_t kind;
    char endpoint[256];
};

#define LINGER_MS 500
/* ZMTP heartbeats, so a tcp peer that vanished (host down, cable out) is dropped in
 * seconds instead of when the kernel gives up on the connection. */
#define HEARTBEAT_IVL_MS 1000
#define HEARTBEAT_TIMEOUT_MS 3000
/* sun_path holds 108 bytes with the terminating NUL. */
#define IPC_PATH_MAX 107

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

const char *bp_peer_name(const bp_peer_t *p, char *buf, size_t cap)
{
    bool printable = p->len > 0;
    for (size_t i = 0; i < p->len; i++)
        if (p->id[i] < 0x21 || p->id[i] > 0x7e)
            printable = false;
    size_t o = 0;
    buf[0] = '\0';
    if (printable) {
        snprintf(buf, cap, "%.*s", (int)p->len, (const char *)p->id);
        return buf;
    }
    for (size_t i = 0; i < p->len && o + 3 < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%02x", p->id[i]);
    if (o == 0)
        snprintf(buf, cap, "(empty)");
    return buf;
}

int bp_chan_ipc_endpoint(char *buf, size_t cap, const char *runtime_dir, const char *name,
                         bl_err_t *err)
{
    if (runtime_dir == NULL || runtime_dir[0] == '\0' || name == NULL || name[0] == '\0' ||
        strchr(name, '/'))
        return bl_err_set(err, BL_EINVAL, "ipc endpoint: runtime dir '%s' and name '%s' must "
                          "be non-empty, the name without '/'", runtime_dir ? runtime_dir : "",
                          name ? name : "");
    int n = snprintf(buf, cap, "ipc://%s/%s.sock", runtime_dir, name);
    if (n < 0 || (size_t)n >= cap || (size_t)n - strlen("ipc://") > IPC_PATH_MAX)
        return bl_err_set(err, BL_ERANGE, "ipc endpoint: %s/%s.sock is longer than the %d "
                          "bytes of a unix socket path (or the buffer of %zu)", runtime_dir,
                          name, IPC_PATH_MAX, cap);
    return 0;
}

static int zmq_fail(bl_err_t *err, const bp_chan_t *c, const char *what)
{
    int e = zmq_errno();
    return bl_err_set(err, e == ENOMEM ? BL_ENOMEM : BL_EIO, "channel %s: %s: %s",
                      c ? c->endpoint : "?", what, zmq_strerror(e));
}

static int set_int(bp_chan_t *c, int opt, int v, const char *name, bl_err_t *err)
{
    if (zmq_setsockopt(c->sock, opt, &v, sizeof v) != 0)
        return zmq_fail(err, c, name);
    return 0;
}

/* Creates the context and socket with the options every channel uses. */
static int open_chan(bp_chan_t **out, bp_chan_kind_t kind, const char *endpoint, bl_err_t *err)
{
    int rc;
    *out = NULL;
    int type = kind == BP_CHAN_PAIR ? ZMQ_PAIR : kind == BP_CHAN_DEALER ? ZMQ_DEALER
             : kind == BP_CHAN_ROUTER ? ZMQ_ROUTER : -1;
    if (type < 0)
        return bl_err_set(err, BL_EINVAL, "channel %s: kind %d is not PAIR, DEALER or ROUTER",
                          endpoint, (int)kind);
    if (strncmp(endpoint, "ipc://", 6) != 0 && strncmp(endpoint, "tcp://", 6) != 0)
        return bl_err_set(err, BL_EINVAL, "channel %s: endpoint is neither ipc:// nor tcp://",
                          endpoint);
    bp_chan_t *c = calloc(1, sizeof *c);
    if (!c)
        return bl_err_set(err, BL_ENOMEM, "channel %s: out of memory", endpoint);
    c->kind = kind;
    if (snprintf(c->endpoint, sizeof c->endpoint, "%s", endpoint) >= (int)sizeof c->endpoint) {
        rc = bl_err_set(err, BL_ERANGE, "channel %.64s...: endpoint longer than %zu bytes",
                        endpoint, sizeof c->endpoint - 1);
        goto fail;
    }
    c->ctx = zmq_ctx_new();
    if (!c->ctx) {
        rc = zmq_fail(err, c, "zmq_ctx_new");
        goto fail;
    }
    c->sock = zmq_socket(c->ctx, type);
    if (!c->sock) {
        rc = zmq_fail(err, c, "zmq_socket");
        goto fail;
    }
    int64_t maxmsg = (int64_t)BP_MSG_MAX_BYTES;
    if (zmq_setsockopt(c->sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg) != 0) {
        rc = zmq_fail(err, c, "ZMQ_MAXMSGSIZE");
        goto fail;
    }
    if ((rc = set_int(c, ZMQ_LINGER, LINGER_MS, "ZMQ_LINGER", err)) ||
        (rc = set_int(c, ZMQ_HEARTBEAT_IVL, HEARTBEAT_IVL_MS, "ZMQ_HEARTBEAT_IVL", err)) ||
        (rc = set_int(c, ZMQ_HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS, "ZMQ_HEARTBEAT_TIMEOUT", err)))
        goto fail;
    /* A ROUTER silently drops a message to an unknown peer unless told otherwise; we
     * want EHOSTUNREACH, so a send to a dead worker is an error, not a lost message. */
    if (kind == BP_CHAN_ROUTER && (rc = set_int(c, ZMQ_ROUTER_MANDATORY, 1, "ZMQ_ROUTER_MANDATORY", err)))
        goto fail;
    *out = c;
    return 0;
fail:
    bp_chan_destroy(c);
    return rc;
}

int bp_chan_bind(bp_chan_t **out, bp_chan_kind_t kind, const char *endpoint, bl_err_t *err)
{
    int rc = open_chan(out, kind, endpoint, err);
    if (rc)
        return rc;
    bp_chan_t *c = *out;
    if (zmq_bind(c->sock, endpoint) != 0) {
        rc = zmq_fail(err, c, "bind");
        goto fail;
    }
    /* "tcp://host:*" binds a free port: keep the endpoint that was actually bound, so
     * the caller can hand it to the peer. */
    char last[sizeof c->endpoint];
    size_t n = sizeof last;
    if (zmq_getsockopt(c->sock, ZMQ_LAST_ENDPOINT, last, &n) == 0 && n > 1 && n <= sizeof last)
        memcpy(c->endpoint, last, n);
    return 0;
fail:
    bp_chan_destroy(c);
    *out = NULL;
    return rc;
}

int bp_chan_connect(bp_chan_t **out, bp_chan_kind_t kind, const char *endpoint,
                    const char *identity, bl_err_t *err)
{
    int rc = open_chan(out, kind, endpoint, err);
    if (rc)
        return rc;
    bp_chan_t *c = *out;
    if (identity) {
        size_t n = strlen(identity);
        if (kind != BP_CHAN_DEALER || n == 0 || n > 255 || identity[0] == '\0') {
            rc = bl_err_set(err, BL_EINVAL, "channel %s: identity '%.64s' needs a DEALER and "
                            "1-255 bytes", endpoint, identity);
            goto fail;
        }
        if (zmq_setsockopt(c->sock, ZMQ_ROUTING_ID, identity, n) != 0) {
            rc = zmq_fail(err, c, "ZMQ_ROUTING_ID");
            goto fail;
        }
    }
    if (zmq_connect(c->sock, endpoint) != 0) {
        rc = zmq_fail(err, c, "connect");
        goto fail;
    }
    return 0;
fail:
    bp_chan_destroy(c);
    *out = NULL;
    return rc;
}

void bp_chan_destroy(bp_chan_t *c)
{
    if (!c)
        return;
    if (c->sock)
        zmq_close(c->sock);
    if (c->ctx)
        zmq_ctx_term(c->ctx);
    free(c);
}

const char *bp_chan_endpoint(const bp_chan_t *c) { return c->endpoint; }

/* Waits until the socket is readable/writable (events) or the deadline passes;
 * retries on EINTR with what is left. 0, BL_ETIMEDOUT or BL_EIO. */
static int wait_for(bp_chan_t *c, short events, int timeout_ms, const char *what, bl_err_t *err)
{
    int64_t deadline = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
    for (;;) {
        long left = -1;
        if (deadline >= 0) {
            int64_t l = deadline - now_ms();
            left = l < 0 ? 0 : (long)l;
        }
        zmq_pollitem_t it = {.socket = c->sock, .events = events};
        int n = zmq_poll(&it, 1, left);
        if (n > 0 && (it.revents & events))
            return 0;
        if (n < 0 && zmq_errno() != EINTR)
            return zmq_fail(err, c, "zmq_poll");
        if (n == 0 && deadline >= 0 && now_ms() >= deadline)
            return bl_err_set(err, BL_ETIMEDOUT, "channel %s: %s timed out after %d ms",
                              c->endpoint, what, timeout_ms);
    }
}

int bp_chan_send(bp_chan_t *c, const bp_peer_t *to, const bp_msg_t *m, int timeout_ms,
                 bl_err_t *err)
{
    int rc;
    char name[600];
    zmq_msg_t zm;
    bool have_msg = false;
    if ((c->kind == BP_CHAN_ROUTER) != (to != NULL))
        return bl_err_set(err, BL_EINVAL, "channel %s: a ROUTER send needs a peer, others none",
                          c->endpoint);
    if (to && (to->len == 0 || to->len > sizeof to->id))
        return bl_err_set(err, BL_EINVAL, "channel %s: peer id of %zu bytes", c->endpoint,
                          to->len);
    /* Validate before sizing: the size of an invalid message is meaningless. */
    if ((rc = bp_msg_validate(m, err)) != 0)
        return rc;
    size_t n = bp_msg_packed_size(m);
    if (n > BP_MSG_MAX_BYTES)
        return bl_err_set(err, BL_ERANGE, "channel %s: %s of %zu bytes exceeds %zu",
                          c->endpoint, bp_msg_type_name((int)m->type), n, BP_MSG_MAX_BYTES);
    if (zmq_msg_init_size(&zm, n) != 0)
        return zmq_fail(err, c, "zmq_msg_init_size");
    have_msg = true;
    size_t written;
    if ((rc = bp_msg_pack(m, zmq_msg_data(&zm), n, &written, err)) != 0)
        goto fail;
    if ((rc = wait_for(c, ZMQ_POLLOUT, timeout_ms, "send", err)) != 0)
        goto fail;
    if (to && zmq_send(c->sock, to->id, to->len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) {
        if (zmq_errno() == EHOSTUNREACH)
            rc = bl_err_set(err, BL_ENOENT, "channel %s: no peer %s", c->endpoint,
                            bp_peer_name(to, name, sizeof name));
        else
            rc = zmq_fail(err, c, "send routing id");
        goto fail;
    }
    if (zmq_msg_send(&zm, c->sock, ZMQ_DONTWAIT) < 0) {
        rc = zmq_errno() == EAGAIN
                 ? bl_err_set(err, BL_ETIMEDOUT, "channel %s: send would block", c->endpoint)
                 : zmq_fail(err, c, "send");
        goto fail;
    }
    return 0; /* zmq_msg_send took the message */
fail:
    if (have_msg)
        zmq_msg_close(&zm);
    return rc;
}

/* Reads and drops the rest of a multipart message a peer sent. */
static void drain(bp_chan_t *c)
{
    int more = 1;
    size_t sz = sizeof more;
    while (zmq_getsockopt(c->sock, ZMQ_RCVMORE, &more, &sz) == 0 && more) {
        zmq_msg_t zm;
        zmq_msg_init(&zm);
        int r = zmq_msg_recv(&zm, c->sock, ZMQ_DONTWAIT);
        zmq_msg_close(&zm);
        if (r < 0)
            break;
    }
}

int bp_chan_recv(bp_chan_t *c, bp_peer_t *from, bp_msg_t *out, int timeout_ms, bl_err_t *err)
{
    int rc;
    char name[600] = "the peer";
    zmq_msg_t zm;
    memset(out, 0, sizeof *out);
    if (from)
        from->len = 0;
    if (c->kind == BP_CHAN_ROUTER && from == NULL)
        return bl_err_set(err, BL_EINVAL, "channel %s: a ROUTER recv needs a peer to fill",
                          c->endpoint);
    if ((rc = wait_for(c, ZMQ_POLLIN, timeout_ms, "recv", err)) != 0)
        return rc;
    zmq_msg_init(&zm);
    if (c->kind == BP_CHAN_ROUTER) {
        if (zmq_msg_recv(&zm, c->sock, ZMQ_DONTWAIT) < 0) {
            rc = zmq_fail(err, c, "recv routing id");
            goto fail;
        }
        size_t idn = zmq_msg_size(&zm);
        int more = zmq_msg_more(&zm);
        if (idn == 0 || idn > sizeof from->id || !more) {
            rc = bl_err_set(err, BL_EPROTO, "channel %s: routing id of %zu bytes%s",
                            c->endpoint, idn, more ? "" : " and no message");
            goto fail;
        }
        memcpy(from->id, zmq_msg_data(&zm), idn);
        from->len = idn;
        bp_peer_name(from, name, sizeof name);
        zmq_msg_close(&zm);
        zmq_msg_init(&zm);
    }
    if (zmq_msg_recv(&zm, c->sock, ZMQ_DONTWAIT) < 0) {
        rc = zmq_fail(err, c, "recv");
        goto fail;
    }
    if (zmq_msg_more(&zm)) {
        rc = bl_err_set(err, BL_EPROTO, "channel %s: %s sent a multipart message", c->endpoint,
                        name);
        goto fail;
    }
    if ((rc = bp_msg_unpack(out, zmq_msg_data(&zm), zmq_msg_size(&zm), err)) != 0) {
        /* Name the peer in front of the field the unpacker named. */
        if (err) {
            bl_err_t inner = *err;
            bl_err_set(err, rc, "channel %s: from %s: %s", c->endpoint, name, inner.msg);
        }
        goto fail;
    }
    zmq_msg_close(&zm);
    return 0;
fail:
    drain(c);
    zmq_msg_close(&zm);
    return rc;
}

// --- the router's messages ------------------------------------------------------------

int bp_chan_send_plan(bp_chan_t *c, const bp_peer_t *to, const bp_plan_t *p, int timeout_ms, bl_err_t *err)
{
    if (p->n_stages < 1 || p->n_stages > BP_PLAN_MAX_STAGES || p->n_layers > BP_PLAN_MAX_LAYERS)
        return bl_err_set(err, BL_EINVAL, "plan: %d stages, %u layers", p->n_stages, p->n_layers);
    Bloomery__Stage st[BP_PLAN_MAX_STAGES], *stp[BP_PLAN_MAX_STAGES];
    for (int s = 0; s < p->n_stages; s++) {
        if (p->stages[s].device < -1 || p->stages[s].device > 255)
            return bl_err_set(err, BL_EINVAL, "plan: stage %d's device %d", s, p->stages[s].device);
        if (p->stages[s].threads > BP_PLAN_MAX_THREADS || p->stages[s].threads_batch > BP_PLAN_MAX_THREADS)
            return bl_err_set(err, BL_EINVAL, "plan: stage %d's threads %u, %u for prompts (at most %u)", s,
                              p->stages[s].threads, p->stages[s].threads_batch, BP_PLAN_MAX_THREADS);
        bloomery__stage__init(&st[s]);
        st[s].process = p->stages[s].process;
        st[s].layer_begin = p->stages[s].layer_begin;
        st[s].layer_end = p->stages[s].layer_end;
        st[s].gpu = p->stages[s].device >= 0 ? (uint32_t)p->stages[s].device + 1 : 0;
        st[s].card_next = p->stages[s].card_next != 0;
        st[s].threads = p->stages[s].threads;
        st[s].threads_batch = p->stages[s].threads_batch;
        stp[s] = &st[s];
    }
    const int kv = bp_kv_type_proto(p->kv_type);
    if (kv < 0)
        return bl_err_set(err, BL_EINVAL, "plan: KV type %u is not f16, f32 or q8_0", p->kv_type);
    if (p->n_tiers < 0 || p->n_tiers > BP_PLAN_MAX_TIERS)
        return bl_err_set(err, BL_EINVAL, "plan: %d expert tiers (at most %d)", p->n_tiers, BP_PLAN_MAX_TIERS);
    Bloomery__ExpertTier tr[BP_PLAN_MAX_TIERS], *trp[BP_PLAN_MAX_TIERS];
    for (int k = 0; k < p->n_tiers; k++) {
        if (p->tiers[k].device < -1 || p->tiers[k].device > 255)
            return bl_err_set(err, BL_EINVAL, "plan: tier %d's device %d", k, p->tiers[k].device);
        bloomery__expert_tier__init(&tr[k]);
        tr[k].process = p->tiers[k].process;
        tr[k].gpu = p->tiers[k].device >= 0 ? (uint32_t)p->tiers[k].device + 1 : 0;
        trp[k] = &tr[k];
    }
    /* every expert of a host or tier layer */
    size_t n_pl = 0;
    for (uint32_t l = 0; l < p->n_layers; l++) {
        if (p->tier[l] > p->n_tiers)
            return bl_err_set(err, BL_EINVAL, "plan: layer %u's tier %u of %d", l, p->tier[l], p->n_tiers);
        n_pl += p->host[l] || p->tier[l] ? p->n_expert : 0;
    }
    Bloomery__ExpertPlacement *pl = n_pl ? calloc(n_pl, sizeof *pl) : NULL;
    Bloomery__ExpertPlacement **plp = n_pl ? calloc(n_pl, sizeof *plp) : NULL;
    if (n_pl && (!pl || !plp)) {
        free(pl);
        free(plp);
        return bl_err_set(err, BL_ENOMEM, "out of memory for the plan's placements");
    }
    size_t k = 0;
    for (uint32_t l = 0; l < p->n_layers; l++)
        for (uint32_t e = 0; (p->host[l] || p->tier[l]) && e < p->n_expert; e++, k++) {
            bloomery__expert_placement__init(&pl[k]);
            pl[k].layer = l;
            pl[k].expert = e;
            pl[k].process = p->tier[l] ? p->tiers[p->tier[l] - 1].process : p->host_process;
            plp[k] = &pl[k];
        }
    Bloomery__Plan m;
    bloomery__plan__init(&m);
    m.model_path = (char *)p->model_path;
    m.n_layers = p->n_layers;
    m.n_expert = p->n_expert;
    m.stages = stp;
    m.n_stages = (size_t)p->n_stages;
    m.placements = plp;
    m.n_placements = n_pl;
    m.tiers = p->n_tiers ? trp : NULL;
    m.n_tiers = (size_t)p->n_tiers;
    m.kv_type = (Bloomery__KvType)kv;
    m.n_ctx = p->n_ctx;
    m.n_slots = p->n_slots;
    m.threads = p->threads;
    m.threads_batch = p->threads_batch;
    m.n_batch = p->n_batch;
    m.experts_remote = n_pl > 0; /* a hosttier or a tier runs */
    m.flash_attn = p->flash_attn;
    m.no_mmap = p->no_mmap != 0;
    m.mlock = p->mlock != 0;
    m.no_op_offload = p->no_op_offload != 0;
    m.poll = p->poll;
    m.cpu_strict = p->cpu_strict != 0;
    m.experts_vram = p->experts_vram;
    m.no_residency = p->no_residency != 0;
    m.experts_ram = p->experts_ram;
    m.kv_pool = p->kv_pool;
    m.slot_dir = (char *)(p->slot_dir ? p->slot_dir : "");
    m.cache_dir = (char *)(p->cache_dir ? p->cache_dir : "");
    m.mtp = p->mtp != 0;
    m.you = p->you;
    const bp_msg_t msg = {.type = BP_MSG_PLAN, .u.plan = &m};
    const int rc = bp_chan_send(c, to, &msg, timeout_ms, err);
    free(pl);
    free(plp);
    return rc;
}

int bp_chan_send_shutdown(bp_chan_t *c, const bp_peer_t *to, const char *reason, uint32_t grace_ms, int timeout_ms,
                          bl_err_t *err)
{
    Bloomery__Shutdown s;
    bloomery__shutdown__init(&s);
    s.reason = (char *)reason;
    s.grace_ms = grace_ms;
    const bp_msg_t m = {.type = BP_MSG_SHUTDOWN, .u.shutdown = &s};
    return bp_chan_send(c, to, &m, timeout_ms, err);
}

int bp_chan_send_stats_request(bp_chan_t *c, const bp_peer_t *to, uint32_t process, int timeout_ms, bl_err_t *err)
{
    Bloomery__Stats s;
    bloomery__stats__init(&s);
    s.process = process;
    const bp_msg_t m = {.type = BP_MSG_STATS, .u.stats = &s};
    return bp_chan_send(c, to, &m, timeout_ms, err);
}
