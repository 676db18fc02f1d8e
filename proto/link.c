/* Links between hosts: see link.h. This file owns the link's ZeroMQ context, the
 * key derivation from the cluster's secret, the watcher thread (socket monitor and
 * ZAP handler) and the two pump threads. */
#include "link.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "log.h"

/* CURVE sends each message as a MESSAGE command: the "\x07MESSAGE" name, an 8-byte
 * nonce, a 16-byte MAC and a flags byte around the payload, and ZeroMQ checks
 * ZMQ_MAXMSGSIZE against that frame. The slack lets a message of exactly max_msg
 * through; the few bytes above max_msg it would also let through are refused here. */
#define CURVE_FRAME_OVERHEAD 64
#define MAX_MSG_LIMIT ((size_t)1 << 40)
#define OPT_MAX_MS 3600000
/* The tx pump looks at its stop flag this often while its ring is idle: a ring's own
 * close wakes only the other side's waits, not this side's. */
#define TX_POLL_US 50000
/* While a message from the link waits for room in `into`, the io pump alternates a
 * wait of this long on the ring with a look at its sockets, so the other direction
 * keeps flowing while the local consumer is slow. */
#define IN_WAIT_US 500
/* At most one refusal line per this interval, with the count of the ones left out:
 * a peer with the wrong secret retries every ~100 ms. */
#define REFUSAL_LOG_IVL_NS (10ull * 1000000000ull)
#define MON_EVENTS                                                                                 \
    (ZMQ_EVENT_CONNECTED | ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED |                           \
     ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |                        \
     ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
/* The monitor and the tx pump's channel are inproc endpoints of the link's own
 * context, so the names need not be unique across links. */
#define MON_ENDPOINT "inproc://bp-link-monitor"
#define TX_ENDPOINT "inproc://bp-link-tx"
/* RFC 27: the endpoint ZeroMQ sends authentication requests to, in the context of
 * the socket doing the handshake. */
#define ZAP_ENDPOINT "inproc://zeromq.zap.01"

static const char SERVER_LABEL[] = "bloomery link server";
static const char CLIENT_LABEL[] = "bloomery link client";

struct bp_link {
    /* Set at creation, read-only afterwards. */
    void *ctx;
    bool listener;
    size_t max_msg;
    bp_link_opts_t opts;
    int handshake_ms; /* ZMQ_HANDSHAKE_IVL */
    char endpoint[256];
    uint8_t client_pub[32]; /* listener: the one client key the ZAP handler accepts */
    /* An eventfd that becomes readable, for good, once the link is dead: the peer's
     * connection dropped, the listener refused our key, the pumps stopped, or
     * bp_link_close began. Every wait polls it beside its socket. */
    int dead_fd;

    /* The data socket: the owner thread's until bp_link_pump, then the io pump's
     * (which closes it when the pumps stop). */
    void *sock;
    zmq_msg_t held; /* a message bp_link_recv could not fit, kept for the next call */
    bool have_held;

    /* The watcher thread owns mon (monitor events of sock) and zap (listener only). */
    void *mon;
    void *zap;
    pthread_t watcher;
    bool watcher_started;

    /* The pumps: tx reads out_of and hands each message to io over tx_out -> tx_in;
     * io owns sock and writes into `into`. The ring handles are theirs while they run;
     * other threads only call bp_ring_close on them, which touches nothing but the
     * shared segment's atomics. */
    bool pumping;
    bp_ring_t *out_of;
    bp_ring_t *into;
    void *tx_in;
    void *tx_out;
    pthread_t io_thread;
    pthread_t tx_thread;
    bool io_started;
    bool tx_started;
    /* Set by the io pump as it stops and by bp_link_close; the tx pump checks it
     * between messages (relaxed is enough: it only ends a loop, and the thread join
     * orders everything else). */
    atomic_bool stop;

    /* Link state, written by the watcher and the pumps, read by any thread: under mu;
     * cv is broadcast on every change. */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned n_conn;   /* TCP connections made or accepted */
    unsigned n_up;     /* handshakes that succeeded */
    unsigned n_failed; /* handshakes that failed, whatever the reason */
    unsigned n_down;   /* connections that ended, failed handshakes included */
    int last_fail_event;
    uint32_t last_fail_value;
    bool gone;    /* the handshaken connection dropped */
    bool refused; /* connecting side: the listener refused our key */
    bool closing;
    bool pump_done;
    bl_err_t pump_err;
    uint64_t refusal_logged_ns;
    unsigned refusals_unlogged;
    /* Watcher only: when the ZAP handler last accepted a key whose handshake has not
     * yet been seen to succeed. */
    uint64_t zap_accepted_ns;
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int64_t now_ms(void) { return (int64_t)(now_ns() / 1000000u); }

static const char *code_name(int code)
{
    switch (code) {
    case BL_ECLOSED: return "ECLOSED";
    case BL_EPROTO: return "EPROTO";
    case BL_ERANGE: return "ERANGE";
    case BL_EPERM: return "EPERM";
    case BL_EINVAL: return "EINVAL";
    case BL_ENOMEM: return "ENOMEM";
    case BL_EIO: return "EIO";
    }
    return "E?";
}

static int zmq_fail(bl_err_t *err, const bp_link_t *l, const char *what)
{
    int e = zmq_errno();
    return bl_err_set(err, e == ENOMEM ? BL_ENOMEM : BL_EIO, "link %s: %s: %s",
                      l ? l->endpoint : "?", what, zmq_strerror(e));
}

// --- the cluster's secret and the keys ------------------------------------------------

static int sha256_parts(const void *a, size_t na, const void *b, size_t nb, uint8_t out[32])
{
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    if (!c)
        return BL_ENOMEM;
    unsigned len = 0;
    int ok = EVP_DigestInit_ex(c, EVP_sha256(), NULL) == 1 &&
             EVP_DigestUpdate(c, a, na) == 1 && (nb == 0 || EVP_DigestUpdate(c, b, nb) == 1) &&
             EVP_DigestFinal_ex(c, out, &len) == 1 && len == 32;
    EVP_MD_CTX_free(c);
    return ok ? 0 : BL_EIO;
}

/* Strips the trailing newlines, checks the length and hashes. what and path name the
 * source in messages ("secret file", the path; or "secret", NULL). */
static int hash_secret(const char *what, const char *path, const uint8_t *p, size_t n,
                       uint8_t key[32], bl_err_t *err)
{
    const char *sep = path ? " " : "";
    if (!path)
        path = "";
    while (n > 0 && (p[n - 1] == '\n' || p[n - 1] == '\r'))
        n--;
    if (n < BP_SECRET_MIN_NBYTES)
        return bl_err_set(err, BL_EINVAL, "%s%s%s: %zu bytes of content, fewer than the %d a "
                          "cluster secret needs (64 hex characters give 256 bits)", what, sep,
                          path, n, BP_SECRET_MIN_NBYTES);
    if (n > BP_SECRET_MAX_NBYTES)
        return bl_err_set(err, BL_EINVAL, "%s%s%s: %zu bytes of content, more than %d", what,
                          sep, path, n, BP_SECRET_MAX_NBYTES);
    int rc = sha256_parts(p, n, NULL, 0, key);
    if (rc)
        return bl_err_set(err, rc, "%s%s%s: SHA-256 failed", what, sep, path);
    return 0;
}

int bp_secret_from_bytes(const void *p, size_t n, uint8_t key[32], bl_err_t *err)
{
    if (!p && n)
        return bl_err_set(err, BL_EINVAL, "secret: NULL bytes");
    return hash_secret("secret", NULL, p, n, key, err);
}

int bp_secret_load(const char *path, uint8_t key[32], bl_err_t *err)
{
    /* O_NONBLOCK: a FIFO put in the secret's place must not hang the open; it is then
     * refused as not a regular file. The checks are on the opened file (fstat), so a
     * file swapped between a check and the read cannot slip through. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0)
        return bl_err_set(err, errno == ENOENT ? BL_ENOENT : BL_EIO,
                          "secret file %s: cannot open: %s", path, strerror(errno));
    int rc;
    uint8_t buf[BP_SECRET_MAX_NBYTES + 3];
    size_t got = 0;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        rc = bl_err_set(err, BL_EIO, "secret file %s: fstat: %s", path, strerror(errno));
        goto out;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = bl_err_set(err, BL_EINVAL, "secret file %s: %s, not a regular file", path,
                        S_ISDIR(st.st_mode) ? "a directory" : "a special file");
        goto out;
    }
    if (st.st_mode & 077) {
        rc = bl_err_set(err, BL_EINVAL, "secret file %s: mode %04o opens it to group or others; "
                        "it must be 0600 or 0400 (chmod 600 %s)", path,
                        (unsigned)(st.st_mode & 07777), path);
        goto out;
    }
    /* One byte past the largest content plus a CRLF tells "too long" apart. */
    while (got < sizeof buf) {
        ssize_t r = read(fd, buf + got, sizeof buf - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            rc = bl_err_set(err, BL_EIO, "secret file %s: read: %s", path, strerror(errno));
            goto out;
        }
        if (r == 0)
            break;
        got += (size_t)r;
    }
    if (got == sizeof buf) {
        rc = bl_err_set(err, BL_EINVAL, "secret file %s: longer than %d bytes", path,
                        BP_SECRET_MAX_NBYTES);
        goto out;
    }
    rc = hash_secret("secret file", path, buf, got, key, err);
out:
    OPENSSL_cleanse(buf, sizeof buf);
    close(fd);
    return rc;
}

/* The link's keys: each side's CURVE secret key is SHA-256(label || key), so both
 * ends (and only holders of the secret) know both key pairs. The public keys come
 * from libzmq, which takes the secret in Z85. */
typedef struct link_keys {
    uint8_t server_sec[32];
    uint8_t client_sec[32];
    char server_pub[41]; /* Z85 */
    char client_pub[41];
} link_keys_t;

static int derive_keys(const uint8_t key[32], link_keys_t *k, bl_err_t *err)
{
    char z85[41];
    int rc = sha256_parts(SERVER_LABEL, strlen(SERVER_LABEL), key, 32, k->server_sec);
    if (!rc)
        rc = sha256_parts(CLIENT_LABEL, strlen(CLIENT_LABEL), key, 32, k->client_sec);
    if (rc)
        return bl_err_set(err, rc, "link: SHA-256 failed deriving the keys");
    if (!zmq_z85_encode(z85, k->server_sec, 32) || zmq_curve_public(k->server_pub, z85) != 0 ||
        !zmq_z85_encode(z85, k->client_sec, 32) || zmq_curve_public(k->client_pub, z85) != 0)
        rc = bl_err_set(err, BL_EIO, "link: deriving the CURVE public keys failed: %s",
                        zmq_strerror(zmq_errno()));
    OPENSSL_cleanse(z85, sizeof z85);
    return rc;
}

// --- state shared with the watcher and the pumps --------------------------------------

/* Makes dead_fd readable; called with mu held or by the only thread left. */
static void mark_dead(bp_link_t *l)
{
    uint64_t one = 1;
    /* Cannot fail short of a counter at UINT64_MAX - 1, and it is only ever 1 or 2. */
    (void)!write(l->dead_fd, &one, sizeof one);
}

/* Why calls on this link can no longer wait for the peer, or 0. mu held. */
static int dead_reason(const bp_link_t *l, bl_err_t *err)
{
    if (l->closing || l->pump_done)
        return bl_err_set(err, BL_ECLOSED, "link %s: closed", l->endpoint);
    if (l->gone)
        return bl_err_set(err, BL_ECLOSED, "link %s: the peer's connection dropped", l->endpoint);
    if (l->refused)
        return bl_err_set(err, BL_EPERM, "link %s: the listener refused this side's key: the "
                          "peer does not hold the cluster's secret (or holds another)", l->endpoint);
    return 0;
}

static int link_dead(bp_link_t *l, bl_err_t *err)
{
    pthread_mutex_lock(&l->mu);
    int rc = dead_reason(l, err);
    pthread_mutex_unlock(&l->mu);
    return rc;
}

// --- the watcher: monitor events and ZAP ----------------------------------------------

/* One refusal line at most every REFUSAL_LOG_IVL_NS. mu held. */
static void log_refusal(bp_link_t *l, const char *peer, const char *reason)
{
    uint64_t t = now_ns();
    if (l->refusal_logged_ns != 0 && t - l->refusal_logged_ns < REFUSAL_LOG_IVL_NS) {
        l->refusals_unlogged++;
        return;
    }
    BL_LOG(BL_LOG_WARN, "event=link_refused endpoint=%s peer=%s code=EPERM reason=\"%s\" "
           "refused_since_last_line=%u", l->endpoint, peer, reason, l->refusals_unlogged);
    l->refusal_logged_ns = t;
    l->refusals_unlogged = 0;
}

static const char *fail_name(int event)
{
    switch (event) {
    case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH: return "authentication refused";
    case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL: return "protocol or cryptographic error";
    case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL: return "connection closed during the handshake";
    }
    return "none";
}

/* Each connection ZeroMQ makes ends in exactly one of HANDSHAKE_SUCCEEDED or
 * HANDSHAKE_FAILED_*, and a connection that ends sends DISCONNECTED after that (the
 * same engine sends both, in order). So while more connections ended than failed, a
 * handshaken one has ended: that is the peer leaving, whatever else connected and
 * failed meanwhile (a prober, a peer with the wrong secret). The events carry no
 * connection id that would tell them apart directly. */
static void on_event(bp_link_t *l, uint16_t event, uint32_t value)
{
    pthread_mutex_lock(&l->mu);
    switch (event) {
    case ZMQ_EVENT_CONNECTED:
    case ZMQ_EVENT_ACCEPTED:
        l->n_conn++;
        break;
    case ZMQ_EVENT_HANDSHAKE_SUCCEEDED:
        l->n_up++;
        if (l->n_up == 1)
            BL_LOG(BL_LOG_INFO, "event=link_up endpoint=%s side=%s", l->endpoint,
                   l->listener ? "listen" : "connect");
        break;
    case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
    case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
    case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
        l->n_failed++;
        l->last_fail_event = event;
        l->last_fail_value = value;
        if (l->listener) {
            /* ZAP refusals are logged by the handler, which knows the address. */
            if (event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL &&
                value == ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC)
                log_refusal(l, "?", "the CURVE handshake failed (the greeting does not decrypt): "
                            "the peer does not hold the cluster's secret");
            else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL)
                log_refusal(l, "?", "the ZMTP handshake failed: not a bloomery link");
        } else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH && l->n_up == 0 && !l->refused) {
            l->refused = true;
            BL_LOG(BL_LOG_ERROR, "event=link_refused_by_peer endpoint=%s code=EPERM status=%u "
                   "reason=\"the listener refused this side's key: the peer does not hold the "
                   "cluster's secret (or holds another)\"", l->endpoint, value);
            mark_dead(l);
        }
        break;
    case ZMQ_EVENT_DISCONNECTED:
        l->n_down++;
        if (!l->gone && l->n_down > l->n_failed) {
            l->gone = true;
            BL_LOG(BL_LOG_WARN, "event=link_down endpoint=%s reason=\"the peer's connection "
                   "dropped (closed, died, missed its heartbeats, or sent more than max_msg)\"",
                   l->endpoint);
            mark_dead(l);
        }
        break;
    }
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

/* Reads one monitor event: a 6-byte frame (event, value) and the endpoint frame.
 * -1 when the context is shutting down. */
static int read_event(bp_link_t *l)
{
    zmq_msg_t f;
    zmq_msg_init(&f);
    if (zmq_msg_recv(&f, l->mon, 0) < 0) {
        zmq_msg_close(&f);
        return zmq_errno() == ETERM ? -1 : 0;
    }
    uint16_t event = 0;
    uint32_t value = 0;
    bool ok = zmq_msg_size(&f) == 6;
    if (ok) {
        memcpy(&event, zmq_msg_data(&f), 2);
        memcpy(&value, (const uint8_t *)zmq_msg_data(&f) + 2, 4);
    }
    int more = zmq_msg_more(&f);
    zmq_msg_close(&f);
    while (more) {
        zmq_msg_init(&f);
        if (zmq_msg_recv(&f, l->mon, 0) < 0) {
            zmq_msg_close(&f);
            return zmq_errno() == ETERM ? -1 : 0;
        }
        more = zmq_msg_more(&f);
        zmq_msg_close(&f);
    }
    if (ok)
        on_event(l, event, value);
    return 0;
}

#define ZAP_MAX_FRAMES 8

/* Answers one ZAP request (RFC 27): frames version "1.0", request id, domain,
 * address, routing id, mechanism, then the CURVE client key (32 bytes). Only the
 * client key derived from the cluster's secret is accepted, and only until the link
 * has its peer: knowing the server's public key is not enough to join, and a second
 * holder of the secret cannot take over the link. -1 when the context is shutting
 * down. */
static int answer_zap(bp_link_t *l)
{
    zmq_msg_t f[ZAP_MAX_FRAMES];
    int n = 0, more = 1, rc = 0;
    while (more) {
        zmq_msg_t tmp;
        zmq_msg_init(&tmp);
        if (zmq_msg_recv(&tmp, l->zap, 0) < 0) {
            zmq_msg_close(&tmp);
            rc = zmq_errno() == ETERM ? -1 : 0;
            goto out;
        }
        more = zmq_msg_more(&tmp);
        if (n < ZAP_MAX_FRAMES)
            f[n++] = tmp;
        else
            zmq_msg_close(&tmp);
    }
    const char *status = "400";
    const char *text = "the peer does not hold the cluster's secret";
    char addr[64] = "?";
    if (n >= 4)
        bl_log_escape(addr, sizeof addr, zmq_msg_data(&f[3]), zmq_msg_size(&f[3]));
    if (n != 7 || zmq_msg_size(&f[0]) != 3 || memcmp(zmq_msg_data(&f[0]), "1.0", 3) != 0) {
        status = "500";
        text = "malformed ZAP request";
    } else if (zmq_msg_size(&f[5]) != 5 || memcmp(zmq_msg_data(&f[5]), "CURVE", 5) != 0) {
        text = "not a CURVE handshake";
    } else if (zmq_msg_size(&f[6]) == 32 &&
               CRYPTO_memcmp(zmq_msg_data(&f[6]), l->client_pub, 32) == 0) {
        pthread_mutex_lock(&l->mu);
        bool taken = l->n_up > 0;
        pthread_mutex_unlock(&l->mu);
        /* An accepted handshake completes a moment after this answer; until it does
         * (or plainly failed, a handshake timeout later) a second holder of the
         * secret would slip in beside it. */
        uint64_t t = now_ns();
        bool pending = l->zap_accepted_ns != 0 &&
                       t - l->zap_accepted_ns < (uint64_t)l->handshake_ms * 1000000u;
        if (!taken && !pending) {
            status = "200";
            text = "OK";
            l->zap_accepted_ns = t;
        } else {
            text = "the link already has (or had) its peer: a link carries one connection";
        }
    }
    if (status[0] != '2') {
        pthread_mutex_lock(&l->mu);
        log_refusal(l, addr, text);
        pthread_mutex_unlock(&l->mu);
    }
    /* A REP socket must answer every request, or the next recv fails. */
    const void *rid = n >= 2 ? zmq_msg_data(&f[1]) : "";
    size_t rid_n = n >= 2 ? zmq_msg_size(&f[1]) : 0;
    if (zmq_send(l->zap, "1.0", 3, ZMQ_SNDMORE) < 0 ||
        zmq_send(l->zap, rid, rid_n, ZMQ_SNDMORE) < 0 ||
        zmq_send(l->zap, status, 3, ZMQ_SNDMORE) < 0 ||
        zmq_send(l->zap, text, strlen(text), ZMQ_SNDMORE) < 0 ||
        zmq_send(l->zap, status[0] == '2' ? "bloomery" : "", status[0] == '2' ? 8 : 0,
                 ZMQ_SNDMORE) < 0 ||
        zmq_send(l->zap, "", 0, 0) < 0)
        rc = zmq_errno() == ETERM ? -1 : 0;
out:
    for (int i = 0; i < n; i++)
        zmq_msg_close(&f[i]);
    return rc;
}

/* Runs until bp_link_close shuts the context down. */
static void *watch_main(void *arg)
{
    bp_link_t *l = arg;
    for (;;) {
        zmq_pollitem_t it[2] = {{l->mon, 0, ZMQ_POLLIN, 0}, {l->zap, 0, ZMQ_POLLIN, 0}};
        int n = zmq_poll(it, l->zap ? 2 : 1, -1);
        if (n < 0) {
            if (zmq_errno() == EINTR)
                continue;
            if (zmq_errno() != ETERM)
                BL_LOG(BL_LOG_ERROR, "event=link_watcher_failed endpoint=%s reason=\"%s\"",
                       l->endpoint, zmq_strerror(zmq_errno()));
            break;
        }
        if ((it[0].revents & ZMQ_POLLIN) && read_event(l) < 0)
            break;
        if (l->zap && (it[1].revents & ZMQ_POLLIN) && answer_zap(l) < 0)
            break;
    }
    zmq_close(l->mon);
    l->mon = NULL;
    if (l->zap) {
        zmq_close(l->zap);
        l->zap = NULL;
    }
    return NULL;
}

// --- create and close -----------------------------------------------------------------

static int set_int(bp_link_t *l, int opt, int v, const char *name, bl_err_t *err)
{
    if (zmq_setsockopt(l->sock, opt, &v, sizeof v) != 0)
        return zmq_fail(err, l, name);
    return 0;
}

static int check_args(const char *endpoint, size_t max_msg, const bp_link_opts_t *opts,
                      bp_link_opts_t *o, bl_err_t *err)
{
    if (!endpoint || strncmp(endpoint, "tcp://", 6) != 0 || endpoint[6] == '\0')
        return bl_err_set(err, BL_EINVAL, "link %s: the endpoint must be tcp://ADDR:PORT",
                          endpoint ? endpoint : "(null)");
    if (strlen(endpoint) >= 256)
        return bl_err_set(err, BL_EINVAL, "link %.64s...: endpoint longer than 255 bytes",
                          endpoint);
    if (max_msg == 0 || max_msg > MAX_MSG_LIMIT)
        return bl_err_set(err, BL_EINVAL, "link %s: max_msg %zu is outside 1..%zu", endpoint,
                          max_msg, MAX_MSG_LIMIT);
    *o = opts ? *opts : (bp_link_opts_t){0};
    if (o->heartbeat_ivl_ms < 0 || o->heartbeat_ivl_ms > OPT_MAX_MS ||
        o->heartbeat_timeout_ms < 0 || o->heartbeat_timeout_ms > OPT_MAX_MS ||
        o->hwm_msgs < 0 || o->linger_ms < 0 || o->linger_ms > OPT_MAX_MS)
        return bl_err_set(err, BL_EINVAL, "link %s: options out of range (heartbeat %d/%d ms, "
                          "hwm %d, linger %d ms)", endpoint, o->heartbeat_ivl_ms,
                          o->heartbeat_timeout_ms, o->hwm_msgs, o->linger_ms);
    if (!o->heartbeat_ivl_ms)
        o->heartbeat_ivl_ms = BP_LINK_DEFAULT_HEARTBEAT_IVL_MS;
    if (!o->heartbeat_timeout_ms)
        o->heartbeat_timeout_ms = BP_LINK_DEFAULT_HEARTBEAT_TIMEOUT_MS;
    if (!o->hwm_msgs)
        o->hwm_msgs = BP_LINK_DEFAULT_HWM_MSGS;
    if (!o->linger_ms)
        o->linger_ms = BP_LINK_DEFAULT_LINGER_MS;
    return 0;
}

static int link_open(bp_link_t **out, bool listener, const char *endpoint,
                     const uint8_t key[32], size_t max_msg, const bp_link_opts_t *opts,
                     bl_err_t *err)
{
    *out = NULL;
    bp_link_opts_t o;
    int rc = check_args(endpoint, max_msg, opts, &o, err);
    if (rc)
        return rc;
    if (!zmq_has("curve"))
        return bl_err_set(err, BL_ENOTSUP, "link %s: this libzmq was built without CURVE",
                          endpoint);
    bp_link_t *l = calloc(1, sizeof *l);
    if (!l)
        return bl_err_set(err, BL_ENOMEM, "link %s: out of memory", endpoint);
    link_keys_t k;
    memset(&k, 0, sizeof k);
    l->listener = listener;
    l->max_msg = max_msg;
    l->opts = o;
    l->dead_fd = -1;
    snprintf(l->endpoint, sizeof l->endpoint, "%s", endpoint);
    pthread_mutex_init(&l->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&l->cv, &ca);
    pthread_condattr_destroy(&ca);
    atomic_init(&l->stop, false);
    l->dead_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (l->dead_fd < 0) {
        rc = bl_err_set(err, BL_EIO, "link %s: eventfd: %s", endpoint, strerror(errno));
        goto fail;
    }
    if ((rc = derive_keys(key, &k, err)) != 0)
        goto fail;
    l->ctx = zmq_ctx_new();
    if (!l->ctx) {
        rc = zmq_fail(err, l, "zmq_ctx_new");
        goto fail;
    }
    if (listener) {
        /* The handler is bound before the data socket binds, so no handshake can run
         * without it (ZeroMQ skips authentication where no handler exists). */
        if (!zmq_z85_decode(l->client_pub, k.client_pub)) {
            rc = bl_err_set(err, BL_EIO, "link %s: decoding the client key failed", endpoint);
            goto fail;
        }
        l->zap = zmq_socket(l->ctx, ZMQ_REP);
        if (!l->zap || zmq_bind(l->zap, ZAP_ENDPOINT) != 0) {
            rc = zmq_fail(err, l, "binding the ZAP handler");
            goto fail;
        }
    }
    l->sock = zmq_socket(l->ctx, ZMQ_PAIR);
    if (!l->sock) {
        rc = zmq_fail(err, l, "zmq_socket");
        goto fail;
    }
    int64_t maxmsg = (int64_t)(max_msg + CURVE_FRAME_OVERHEAD);
    l->handshake_ms = o.heartbeat_timeout_ms > 1000 ? o.heartbeat_timeout_ms : 1000;
    if (zmq_setsockopt(l->sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg) != 0) {
        rc = zmq_fail(err, l, "ZMQ_MAXMSGSIZE");
        goto fail;
    }
    if ((rc = set_int(l, ZMQ_SNDHWM, o.hwm_msgs, "ZMQ_SNDHWM", err)) ||
        /* No receive limit: while a full receive queue stops ZeroMQ reading the
         * connection, it cannot see the peer's heartbeats either, and drops a live
         * peer after heartbeat_timeout_ms (and libzmq 4.3 can then abort on the
         * reconnect: libzmq issue #3937). So a slow local consumer backs up into
         * this queue instead of the network; what bounds it is the sender's
         * protocol (a pipeline's steps in flight). */
        (rc = set_int(l, ZMQ_RCVHWM, 0, "ZMQ_RCVHWM", err)) ||
        (rc = set_int(l, ZMQ_LINGER, o.linger_ms, "ZMQ_LINGER", err)) ||
        (rc = set_int(l, ZMQ_HEARTBEAT_IVL, o.heartbeat_ivl_ms, "ZMQ_HEARTBEAT_IVL", err)) ||
        (rc = set_int(l, ZMQ_HEARTBEAT_TIMEOUT, o.heartbeat_timeout_ms, "ZMQ_HEARTBEAT_TIMEOUT",
                      err)) ||
        (rc = set_int(l, ZMQ_HANDSHAKE_IVL, l->handshake_ms, "ZMQ_HANDSHAKE_IVL", err)))
        goto fail;
    /* IPv6 only where asked for ("tcp://[::1]:PORT"): with it on, an IPv4 bind reports
     * itself as "tcp://[::ffff:ADDR]:PORT", which peers would have to understand. */
    if (endpoint[6] == '[' && (rc = set_int(l, ZMQ_IPV6, 1, "ZMQ_IPV6", err)))
        goto fail;
    if (listener) {
        if ((rc = set_int(l, ZMQ_CURVE_SERVER, 1, "ZMQ_CURVE_SERVER", err)))
            goto fail;
        if (zmq_setsockopt(l->sock, ZMQ_CURVE_SECRETKEY, k.server_sec, 32) != 0) {
            rc = zmq_fail(err, l, "ZMQ_CURVE_SECRETKEY");
            goto fail;
        }
    } else {
        /* IMMEDIATE: no queue before the handshake, so a send with no peer waits and
         * times out instead of piling up for a listener that may never answer. */
        if ((rc = set_int(l, ZMQ_IMMEDIATE, 1, "ZMQ_IMMEDIATE", err)))
            goto fail;
        if (zmq_setsockopt(l->sock, ZMQ_CURVE_SERVERKEY, k.server_pub, 40) != 0 ||
            zmq_setsockopt(l->sock, ZMQ_CURVE_PUBLICKEY, k.client_pub, 40) != 0 ||
            zmq_setsockopt(l->sock, ZMQ_CURVE_SECRETKEY, k.client_sec, 32) != 0) {
            rc = zmq_fail(err, l, "setting the CURVE keys");
            goto fail;
        }
    }
    /* The monitor's peer connects before any connection exists: events sent while no
     * one is connected are dropped. */
    if (zmq_socket_monitor(l->sock, MON_ENDPOINT, MON_EVENTS) != 0) {
        rc = zmq_fail(err, l, "zmq_socket_monitor");
        goto fail;
    }
    l->mon = zmq_socket(l->ctx, ZMQ_PAIR);
    if (!l->mon || zmq_connect(l->mon, MON_ENDPOINT) != 0) {
        rc = zmq_fail(err, l, "connecting the monitor");
        goto fail;
    }
    if (listener) {
        if (zmq_bind(l->sock, endpoint) != 0) {
            rc = zmq_fail(err, l, "bind");
            goto fail;
        }
        /* "tcp://ADDR:*" bound a free port: keep what was bound, for the peer. */
        char last[sizeof l->endpoint];
        size_t n = sizeof last;
        if (zmq_getsockopt(l->sock, ZMQ_LAST_ENDPOINT, last, &n) == 0 && n > 1 && n <= sizeof last)
            memcpy(l->endpoint, last, n);
    } else if (zmq_connect(l->sock, endpoint) != 0) {
        rc = zmq_fail(err, l, "connect");
        goto fail;
    }
    /* Started last, once the endpoint it logs is final. Events and ZAP requests that
     * come first wait in its sockets. */
    if (pthread_create(&l->watcher, NULL, watch_main, l) != 0) {
        rc = bl_err_set(err, BL_EIO, "link %s: cannot start the watcher thread", endpoint);
        goto fail;
    }
    l->watcher_started = true;
    OPENSSL_cleanse(&k, sizeof k);
    *out = l;
    return 0;
fail:
    OPENSSL_cleanse(&k, sizeof k);
    bp_link_close(l);
    return rc;
}

int bp_link_listen(bp_link_t **out, const char *endpoint, const uint8_t key[32], size_t max_msg,
                   const bp_link_opts_t *opts, bl_err_t *err)
{
    return link_open(out, true, endpoint, key, max_msg, opts, err);
}

int bp_link_connect(bp_link_t **out, const char *endpoint, const uint8_t key[32], size_t max_msg,
                    const bp_link_opts_t *opts, bl_err_t *err)
{
    return link_open(out, false, endpoint, key, max_msg, opts, err);
}

const char *bp_link_endpoint(const bp_link_t *l) { return l->endpoint; }

/* How long the socket may keep flushing: only while a peer is there to take it. */
static int close_linger(bp_link_t *l)
{
    pthread_mutex_lock(&l->mu);
    bool live = l->n_up > 0 && !l->gone;
    pthread_mutex_unlock(&l->mu);
    return live ? l->opts.linger_ms : 0;
}

void bp_link_close(bp_link_t *l)
{
    if (!l)
        return;
    pthread_mutex_lock(&l->mu);
    l->closing = true;
    if (l->dead_fd >= 0)
        mark_dead(l);
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    atomic_store_explicit(&l->stop, true, memory_order_relaxed);
    /* Closing the rings tells their local ends at once, and wakes an io pump waiting
     * for room in `into`. */
    if (l->pumping) {
        bp_ring_close(l->out_of);
        bp_ring_close(l->into);
    }
    if (l->tx_started)
        pthread_join(l->tx_thread, NULL);
    if (l->io_started)
        pthread_join(l->io_thread, NULL);
    if (l->tx_out)
        zmq_close(l->tx_out);
    if (l->tx_in)
        zmq_close(l->tx_in);
    if (l->have_held)
        zmq_msg_close(&l->held);
    if (l->sock) {
        int linger = close_linger(l);
        zmq_setsockopt(l->sock, ZMQ_LINGER, &linger, sizeof linger);
        zmq_close(l->sock);
    }
    if (l->ctx) {
        /* Shutting the context down ends the watcher's poll with ETERM; it closes its
         * sockets, and only then can zmq_ctx_term finish. */
        zmq_ctx_shutdown(l->ctx);
        if (l->watcher_started)
            pthread_join(l->watcher, NULL);
        if (l->mon)
            zmq_close(l->mon);
        if (l->zap)
            zmq_close(l->zap);
        zmq_ctx_term(l->ctx);
    }
    if (l->dead_fd >= 0)
        close(l->dead_fd);
    pthread_cond_destroy(&l->cv);
    pthread_mutex_destroy(&l->mu);
    free(l);
}

// --- waiting, sending, receiving ------------------------------------------------------

int bp_link_peer_up(bp_link_t *l)
{
    pthread_mutex_lock(&l->mu);
    int up = l->n_up > 0 && !l->gone && !l->closing && !l->pump_done;
    pthread_mutex_unlock(&l->mu);
    return up;
}

static void deadline_ts(struct timespec *ts, int64_t deadline_ms)
{
    ts->tv_sec = (time_t)(deadline_ms / 1000);
    ts->tv_nsec = (long)(deadline_ms % 1000) * 1000000L;
}

/* Waits on the link's condition (under mu) until signalled or the deadline (ms on
 * now_ms's clock; negative: no deadline). */
static void wait_until(bp_link_t *l, int64_t deadline)
{
    if (deadline < 0) {
        pthread_cond_wait(&l->cv, &l->mu);
        return;
    }
    struct timespec ts;
    deadline_ts(&ts, deadline);
    pthread_cond_timedwait(&l->cv, &l->mu, &ts);
}

int bp_link_wait_up(bp_link_t *l, int timeout_ms, bl_err_t *err)
{
    int64_t deadline = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
    int rc;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        if (l->closing || l->gone || l->pump_done) {
            rc = dead_reason(l, err);
            break;
        }
        if (l->n_up > 0) {
            rc = 0;
            break;
        }
        if (l->refused) {
            rc = dead_reason(l, err);
            break;
        }
        if (timeout_ms == 0) {
            rc = bl_err_set(err, BL_EAGAIN, "link %s: no handshake yet", l->endpoint);
            break;
        }
        if (deadline >= 0 && now_ms() >= deadline) {
            if (l->n_failed > 0)
                rc = bl_err_set(err, BL_ETIMEDOUT, "link %s: no handshake after %d ms: %u "
                                "connection(s) failed it (last: %s); %s", l->endpoint,
                                timeout_ms, l->n_failed, fail_name(l->last_fail_event),
                                l->listener ? "peers without the cluster's secret were refused"
                                            : "the listener may hold another cluster's secret "
                                              "(it then cannot decrypt this side's greeting "
                                              "and drops the connection without a reason)");
            else if (l->n_conn > 0)
                rc = bl_err_set(err, BL_ETIMEDOUT, "link %s: no handshake after %d ms (%u "
                                "connection(s) still in it)", l->endpoint, timeout_ms, l->n_conn);
            else
                rc = bl_err_set(err, BL_ETIMEDOUT, "link %s: no %s after %d ms", l->endpoint,
                                l->listener ? "peer connected" : "connection to the listener",
                                timeout_ms);
            break;
        }
        wait_until(l, deadline);
    }
    pthread_mutex_unlock(&l->mu);
    return rc;
}

/* Waits until sock has events or the link is dead. 0 (sock ready), 1 (dead: the
 * caller asks link_dead why), BL_ETIMEDOUT, BL_EIO. */
static int wait_sock(bp_link_t *l, short events, int64_t deadline, bl_err_t *err)
{
    for (;;) {
        long left = -1;
        if (deadline >= 0) {
            int64_t d = deadline - now_ms();
            if (d <= 0)
                return BL_ETIMEDOUT;
            left = (long)d;
        }
        zmq_pollitem_t it[2] = {{l->sock, 0, events, 0}, {NULL, l->dead_fd, ZMQ_POLLIN, 0}};
        int n = zmq_poll(it, 2, left);
        if (n < 0 && zmq_errno() == EINTR)
            continue;
        if (n < 0)
            return zmq_fail(err, l, "zmq_poll");
        if (it[1].revents & ZMQ_POLLIN)
            return 1;
        if (it[0].revents & events)
            return 0;
    }
}

static int owner_only(bp_link_t *l, const char *what, bl_err_t *err)
{
    if (l->pumping)
        return bl_err_set(err, BL_EINVAL, "link %s: %s after bp_link_pump: the pumps own the "
                          "socket", l->endpoint, what);
    return 0;
}

int bp_link_send(bp_link_t *l, const void *p, size_t n, int timeout_ms, bl_err_t *err)
{
    int rc = owner_only(l, "send", err);
    if (rc)
        return rc;
    if (n > l->max_msg)
        return bl_err_set(err, BL_ERANGE, "link %s: message of %zu bytes exceeds max_msg %zu",
                          l->endpoint, n, l->max_msg);
    if ((rc = link_dead(l, err)) != 0)
        return rc;
    int64_t deadline = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
    for (;;) {
        if (zmq_send(l->sock, p, n, ZMQ_DONTWAIT) >= 0)
            return 0;
        if (zmq_errno() != EAGAIN && zmq_errno() != EINTR)
            return zmq_fail(err, l, "send");
        if (timeout_ms == 0)
            return bl_err_set(err, BL_EAGAIN, "link %s: send would wait", l->endpoint);
        rc = wait_sock(l, ZMQ_POLLOUT, deadline, err);
        if (rc == 1)
            return link_dead(l, err);
        if (rc == BL_ETIMEDOUT)
            return bl_err_set(err, rc, "link %s: send timed out after %d ms (%s)", l->endpoint,
                              timeout_ms, bp_link_peer_up(l) ? "the peer is not taking messages"
                                                             : "no peer yet");
        if (rc)
            return rc;
    }
}

/* Reads and drops the rest of a multipart message. */
static void drain_parts(void *sock, zmq_msg_t *m)
{
    while (zmq_msg_more(m)) {
        zmq_msg_close(m);
        zmq_msg_init(m);
        if (zmq_msg_recv(m, sock, ZMQ_DONTWAIT) < 0)
            break;
    }
}

int bp_link_recv(bp_link_t *l, void *buf, size_t cap, size_t *n, int timeout_ms, bl_err_t *err)
{
    *n = 0;
    int rc = owner_only(l, "recv", err);
    if (rc)
        return rc;
    int64_t deadline = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
    while (!l->have_held) {
        zmq_msg_init(&l->held);
        if (zmq_msg_recv(&l->held, l->sock, ZMQ_DONTWAIT) >= 0) {
            l->have_held = true;
            break;
        }
        zmq_msg_close(&l->held);
        if (zmq_errno() != EAGAIN && zmq_errno() != EINTR)
            return zmq_fail(err, l, "recv");
        /* Only once nothing is left: what the peer sent before it left still counts. */
        if ((rc = link_dead(l, err)) != 0)
            return rc;
        if (timeout_ms == 0)
            return bl_err_set(err, BL_EAGAIN, "link %s: no message now", l->endpoint);
        rc = wait_sock(l, ZMQ_POLLIN, deadline, err);
        if (rc == BL_ETIMEDOUT)
            return bl_err_set(err, rc, "link %s: no message after %d ms (%s)", l->endpoint,
                              timeout_ms, bp_link_peer_up(l) ? "the peer is up" : "no peer yet");
        if (rc < 0)
            return rc;
    }
    size_t size = zmq_msg_size(&l->held);
    if (zmq_msg_more(&l->held) || size > l->max_msg) {
        bool multi = zmq_msg_more(&l->held);
        drain_parts(l->sock, &l->held);
        zmq_msg_close(&l->held);
        l->have_held = false;
        return multi ? bl_err_set(err, BL_EPROTO, "link %s: the peer sent a multipart message",
                                  l->endpoint)
                     : bl_err_set(err, BL_EPROTO, "link %s: the peer sent %zu bytes, above "
                                  "max_msg %zu", l->endpoint, size, l->max_msg);
    }
    *n = size;
    if (size > cap)
        return bl_err_set(err, BL_ERANGE, "link %s: message of %zu bytes, buffer of %zu",
                          l->endpoint, size, cap);
    if (size)
        memcpy(buf, zmq_msg_data(&l->held), size);
    zmq_msg_close(&l->held);
    l->have_held = false;
    return 0;
}

// --- pumps ----------------------------------------------------------------------------

/* tx -> io: a data message is one frame; the end of out_of is two frames, the second
 * a bl_err_t with the reason (our own threads: trusted). */

/* Sends m (or, with m NULL, the end frames carrying why) to the io pump, waiting for
 * room. 0, or -1 when the pumps are stopping (m is then still the caller's). */
static int tx_hand_over(bp_link_t *l, zmq_msg_t *m, const bl_err_t *why)
{
    for (;;) {
        int r = m ? zmq_msg_send(m, l->tx_out, ZMQ_DONTWAIT)
                  : zmq_send(l->tx_out, "", 0, ZMQ_DONTWAIT | ZMQ_SNDMORE);
        if (r >= 0)
            break;
        if (zmq_errno() != EAGAIN && zmq_errno() != EINTR)
            return -1;
        zmq_pollitem_t it[2] = {{l->tx_out, 0, ZMQ_POLLOUT, 0}, {NULL, l->dead_fd, ZMQ_POLLIN, 0}};
        if (zmq_poll(it, 2, -1) < 0 && zmq_errno() != EINTR)
            return -1;
        if (it[1].revents & ZMQ_POLLIN)
            return -1;
    }
    /* An inproc message of several frames arrives whole: the second frame cannot
     * block once the first went. */
    if (!m && zmq_send(l->tx_out, why, sizeof *why, 0) < 0)
        return -1;
    return 0;
}

static void *tx_main(void *arg)
{
    bp_link_t *l = arg;
    bl_err_t why = {0};
    for (;;) {
        if (atomic_load_explicit(&l->stop, memory_order_relaxed))
            return NULL;
        const void *p;
        size_t n;
        int rc = bp_ring_peek(l->out_of, &p, &n, TX_POLL_US, &why);
        if (rc == BL_ETIMEDOUT)
            continue;
        if (rc)
            break; /* BL_ECLOSED once the producer closed and all was read */
        if (n > l->max_msg) {
            bl_err_set(&why, BL_ERANGE, "link %s: a message of %zu bytes from ring %s exceeds "
                       "the link's max_msg %zu", l->endpoint, n, bp_ring_name(l->out_of),
                       l->max_msg);
            break;
        }
        zmq_msg_t m;
        if (zmq_msg_init_size(&m, n) != 0) {
            zmq_fail(&why, l, "zmq_msg_init_size");
            break;
        }
        if (n)
            memcpy(zmq_msg_data(&m), p, n);
        bp_ring_release(l->out_of);
        if (tx_hand_over(l, &m, NULL) != 0) {
            zmq_msg_close(&m);
            return NULL;
        }
    }
    (void)tx_hand_over(l, NULL, &why); /* fails only when the pumps already stop */
    return NULL;
}

typedef struct io_state {
    zmq_msg_t out; /* from tx, waiting for room in the socket */
    bool have_out;
    zmq_msg_t in; /* from the link, waiting for room in `into` */
    bool have_in;
    bool tx_open;
    bool tx_ended; /* tx sent its end; stop once `out` went */
    bl_err_t why;
} io_state_t;

/* Checks a message from the link and pushes it into `into` within timeout_us.
 * 0 (it went), BL_EAGAIN/BL_ETIMEDOUT (no room yet: it stays in s->in), or the
 * error that stops the pumps, in s->why. */
static int deliver(bp_link_t *l, io_state_t *s, int64_t timeout_us)
{
    size_t n = zmq_msg_size(&s->in);
    if (zmq_msg_more(&s->in))
        return bl_err_set(&s->why, BL_EPROTO, "link %s: the peer sent a multipart message",
                          l->endpoint);
    if (!l->into)
        return bl_err_set(&s->why, BL_EPROTO, "link %s: the peer sent a message (%zu bytes) "
                          "on a link that carries none its way", l->endpoint, n);
    size_t lim = bp_ring_max_msg(bp_ring_capacity(l->into));
    if (n > lim || n > l->max_msg)
        return bl_err_set(&s->why, BL_EPROTO, "link %s: the peer sent %zu bytes, above the "
                          "limit of %zu (ring %s, max_msg %zu)", l->endpoint, n,
                          lim < l->max_msg ? lim : l->max_msg, bp_ring_name(l->into), l->max_msg);
    void *dst;
    bl_err_t e;
    int rc = bp_ring_reserve(l->into, n, &dst, timeout_us, &e);
    if (rc == BL_EAGAIN || rc == BL_ETIMEDOUT)
        return rc;
    if (rc) {
        s->why = e;
        return rc;
    }
    if (n)
        memcpy(dst, zmq_msg_data(&s->in), n);
    if ((rc = bp_ring_commit(l->into, n, &e)) != 0) {
        s->why = e;
        return rc;
    }
    zmq_msg_close(&s->in);
    s->have_in = false;
    return 0;
}

/* Pushes s->in, waiting as long as it takes unless bp_link_close stops the pumps. */
static int deliver_all_the_way(bp_link_t *l, io_state_t *s)
{
    for (;;) {
        int rc = deliver(l, s, TX_POLL_US);
        if (rc != BL_EAGAIN && rc != BL_ETIMEDOUT)
            return rc;
        if (atomic_load_explicit(&l->stop, memory_order_relaxed))
            return bl_err_set(&s->why, BL_ECLOSED, "link %s: closed", l->endpoint);
    }
}

/* The peer's connection dropped: push what it sent before, then stop. */
static int drain_inbound(bp_link_t *l, io_state_t *s)
{
    for (;;) {
        if (!s->have_in) {
            zmq_msg_init(&s->in);
            if (zmq_msg_recv(&s->in, l->sock, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&s->in);
                return bl_err_set(&s->why, BL_ECLOSED, "link %s: the peer's connection "
                                  "dropped", l->endpoint);
            }
            s->have_in = true;
        }
        int rc = deliver_all_the_way(l, s);
        if (rc)
            return rc;
    }
}

/* Stops the pumps: records why, closes both rings and the socket. */
static void io_finish(bp_link_t *l, io_state_t *s, int code, int linger)
{
    if (code != BL_ECLOSED)
        BL_LOG(BL_LOG_ERROR, "event=link_pump_stopped endpoint=%s code=%s reason=\"%s\"",
               l->endpoint, code_name(code), s->why.msg);
    else
        BL_LOG(BL_LOG_INFO, "event=link_pump_stopped endpoint=%s reason=\"%s\"", l->endpoint,
               s->why.msg);
    atomic_store_explicit(&l->stop, true, memory_order_relaxed);
    bp_ring_close(l->into);
    bp_ring_close(l->out_of);
    if (s->have_out)
        zmq_msg_close(&s->out);
    if (s->have_in)
        zmq_msg_close(&s->in);
    /* The peer learns of the end when the connection closes, after the queue is
     * flushed (linger); a peer that broke the protocol is dropped at once. */
    zmq_setsockopt(l->sock, ZMQ_LINGER, &linger, sizeof linger);
    zmq_close(l->sock);
    l->sock = NULL;
    /* Last, so that whoever bp_link_pump_wait wakes finds both rings closed. */
    pthread_mutex_lock(&l->mu);
    l->pump_done = true;
    l->pump_err = s->why;
    l->pump_err.code = code;
    mark_dead(l);
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

static void *io_main(void *arg)
{
    bp_link_t *l = arg;
    io_state_t s = {.tx_open = l->tx_in != NULL};
    int code, linger = l->opts.linger_ms;
    for (;;) {
        zmq_pollitem_t it[3] = {
            {l->sock, 0, (short)((s.have_in ? 0 : ZMQ_POLLIN) | (s.have_out ? ZMQ_POLLOUT : 0)), 0},
            {NULL, l->dead_fd, ZMQ_POLLIN, 0},
            {l->tx_in, 0, (short)(s.tx_open && !s.have_out ? ZMQ_POLLIN : 0), 0},
        };
        int n = zmq_poll(it, l->tx_in ? 3 : 2, s.have_in ? 0 : -1);
        if (n < 0 && zmq_errno() == EINTR)
            continue;
        if (n < 0) {
            code = zmq_fail(&s.why, l, "zmq_poll");
            break;
        }
        if (it[1].revents & ZMQ_POLLIN) {
            pthread_mutex_lock(&l->mu);
            code = dead_reason(l, &s.why);
            bool gone = l->gone && !l->closing;
            pthread_mutex_unlock(&l->mu);
            if (code == 0) /* cannot happen: dead_fd is only set with a reason */
                code = bl_err_set(&s.why, BL_ECLOSED, "link %s: closed", l->endpoint);
            if (gone) {
                code = drain_inbound(l, &s);
                linger = 0;
            } else if (code == BL_ECLOSED) {
                linger = close_linger(l);
            }
            break;
        }
        if (s.have_out && (it[0].revents & ZMQ_POLLOUT)) {
            if (zmq_msg_send(&s.out, l->sock, ZMQ_DONTWAIT) >= 0)
                s.have_out = false;
            else if (zmq_errno() != EAGAIN) {
                code = zmq_fail(&s.why, l, "send");
                break;
            }
        }
        if (it[2].revents & ZMQ_POLLIN) {
            zmq_msg_init(&s.out);
            if (zmq_msg_recv(&s.out, l->tx_in, ZMQ_DONTWAIT) >= 0) {
                if (zmq_msg_more(&s.out)) {
                    /* The end of out_of: the reason follows. */
                    zmq_msg_close(&s.out);
                    zmq_msg_init(&s.out);
                    if (zmq_msg_recv(&s.out, l->tx_in, ZMQ_DONTWAIT) >= 0 &&
                        zmq_msg_size(&s.out) == sizeof s.why)
                        memcpy(&s.why, zmq_msg_data(&s.out), sizeof s.why);
                    else
                        bl_err_set(&s.why, BL_EIO, "link %s: the tx pump ended", l->endpoint);
                    zmq_msg_close(&s.out);
                    s.tx_open = false;
                    s.tx_ended = true;
                } else if (zmq_msg_send(&s.out, l->sock, ZMQ_DONTWAIT) < 0) {
                    if (zmq_errno() != EAGAIN) {
                        zmq_msg_close(&s.out);
                        code = zmq_fail(&s.why, l, "send");
                        break;
                    }
                    s.have_out = true;
                }
            } else {
                zmq_msg_close(&s.out);
            }
        }
        if (s.tx_ended && !s.have_out) {
            code = s.why.code ? s.why.code : BL_ECLOSED;
            break;
        }
        if (!s.have_in && (it[0].revents & ZMQ_POLLIN)) {
            /* A batch at a time, so a busy inbound side does not starve the other. */
            code = 0;
            for (int k = 0; k < 64 && !s.have_in; k++) {
                zmq_msg_init(&s.in);
                if (zmq_msg_recv(&s.in, l->sock, ZMQ_DONTWAIT) < 0) {
                    zmq_msg_close(&s.in);
                    break;
                }
                s.have_in = true;
                code = deliver(l, &s, 0);
                if (code == BL_EAGAIN)
                    code = 0;
                if (code)
                    break;
            }
            if (code) {
                if (code != BL_ECLOSED)
                    linger = 0;
                break;
            }
        }
        if (s.have_in) {
            code = deliver(l, &s, IN_WAIT_US);
            if (code == BL_EAGAIN || code == BL_ETIMEDOUT)
                code = 0;
            if (code) {
                if (code != BL_ECLOSED)
                    linger = 0;
                break;
            }
        }
    }
    io_finish(l, &s, code, linger);
    return NULL;
}

int bp_link_pump(bp_link_t *l, bp_ring_t *out_of, bp_ring_t *into, bl_err_t *err)
{
    if (l->pumping)
        return bl_err_set(err, BL_EINVAL, "link %s: the pumps already run", l->endpoint);
    if (!out_of && !into)
        return bl_err_set(err, BL_EINVAL, "link %s: a pump needs a ring", l->endpoint);
    /* ring.h has no role getter; a call with no wait tells a wrong role (BL_EINVAL)
     * without taking or publishing anything (peek holds the message for the next peek,
     * and the next reserve replaces this one). */
    bl_err_t e;
    const void *p;
    size_t n;
    void *dst;
    if (out_of && bp_ring_peek(out_of, &p, &n, 0, &e) == BL_EINVAL)
        return bl_err_set(err, BL_EINVAL, "link %s: ring %s is not a consumer end", l->endpoint,
                          bp_ring_name(out_of));
    if (into && bp_ring_reserve(into, 0, &dst, 0, &e) == BL_EINVAL)
        return bl_err_set(err, BL_EINVAL, "link %s: ring %s is not a producer end", l->endpoint,
                          bp_ring_name(into));
    if (l->have_held) {
        /* A message recv kept for a bigger buffer would be lost to the pump. */
        return bl_err_set(err, BL_EINVAL, "link %s: a received message of %zu bytes is still "
                          "held; receive it first", l->endpoint, zmq_msg_size(&l->held));
    }
    int rc;
    if (out_of) {
        l->tx_in = zmq_socket(l->ctx, ZMQ_PAIR);
        l->tx_out = zmq_socket(l->ctx, ZMQ_PAIR);
        int hwm = 8, zero = 0;
        if (!l->tx_in || !l->tx_out ||
            zmq_setsockopt(l->tx_in, ZMQ_RCVHWM, &hwm, sizeof hwm) != 0 ||
            zmq_setsockopt(l->tx_out, ZMQ_SNDHWM, &hwm, sizeof hwm) != 0 ||
            zmq_setsockopt(l->tx_in, ZMQ_LINGER, &zero, sizeof zero) != 0 ||
            zmq_setsockopt(l->tx_out, ZMQ_LINGER, &zero, sizeof zero) != 0 ||
            zmq_bind(l->tx_in, TX_ENDPOINT) != 0 || zmq_connect(l->tx_out, TX_ENDPOINT) != 0) {
            rc = zmq_fail(err, l, "creating the pump's channel");
            goto fail;
        }
    }
    l->out_of = out_of;
    l->into = into;
    pthread_mutex_lock(&l->mu); /* pumping is read by bp_link_pump_wait in any thread */
    l->pumping = true;
    pthread_mutex_unlock(&l->mu);
    /* Thread creation publishes the sockets and rings to the new threads. */
    if (pthread_create(&l->io_thread, NULL, io_main, l) != 0) {
        rc = bl_err_set(err, BL_EIO, "link %s: cannot start the io pump", l->endpoint);
        goto fail;
    }
    l->io_started = true;
    if (out_of) {
        if (pthread_create(&l->tx_thread, NULL, tx_main, l) != 0) {
            /* The io pump is running and owns the socket: stop it the normal way. */
            atomic_store_explicit(&l->stop, true, memory_order_relaxed);
            pthread_mutex_lock(&l->mu);
            l->closing = true;
            mark_dead(l);
            pthread_mutex_unlock(&l->mu);
            return bl_err_set(err, BL_EIO, "link %s: cannot start the tx pump", l->endpoint);
        }
        l->tx_started = true;
    }
    return 0;
fail:
    if (l->tx_in)
        zmq_close(l->tx_in);
    if (l->tx_out)
        zmq_close(l->tx_out);
    l->tx_in = l->tx_out = NULL;
    l->out_of = l->into = NULL;
    pthread_mutex_lock(&l->mu);
    l->pumping = false;
    pthread_mutex_unlock(&l->mu);
    return rc;
}

int bp_link_pump_wait(bp_link_t *l, int timeout_ms, bl_err_t *err)
{
    int64_t deadline = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
    int rc;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        if (!l->pumping) {
            rc = bl_err_set(err, BL_EINVAL, "link %s: no pump was started", l->endpoint);
            break;
        }
        if (l->pump_done) {
            if (err)
                *err = l->pump_err;
            rc = l->pump_err.code;
            break;
        }
        if (timeout_ms == 0) {
            rc = bl_err_set(err, BL_EAGAIN, "link %s: the pumps run", l->endpoint);
            break;
        }
        if (deadline >= 0 && now_ms() >= deadline) {
            rc = bl_err_set(err, BL_ETIMEDOUT, "link %s: the pumps still run after %d ms",
                            l->endpoint, timeout_ms);
            break;
        }
        wait_until(l, deadline);
    }
    pthread_mutex_unlock(&l->mu);
    return rc;
}
