/* Links between hosts: one ZeroMQ PAIR socket over tcp:// that carries the per-step
 * messages a ring carries on one host, encrypted and authenticated with CURVE. Both
 * ends derive their keys from the cluster's one shared secret file, so a process
 * without the secret can neither join a link nor read its traffic. One side listens
 * (the CURVE server, which also answers ZeroMQ's authentication requests and accepts
 * only the client key derived from the secret), the other connects.
 *
 * A link carries one connection: once the peer's connection drops after the
 * handshake (it closed, died, or missed its heartbeats), every later call is
 * BL_ECLOSED, and the caller builds a new link (messages in flight may be lost, so a
 * stream cannot resume across connections).
 *
 * Threads. A link's ZeroMQ socket is not thread-safe. Until bp_link_pump, one thread
 * at a time (the owner: the creator, or a thread it handed the link to through a
 * synchronising step such as pthread_create or a mutex) calls bp_link_send,
 * bp_link_recv, bp_link_pump and bp_link_close. bp_link_pump hands the socket to the
 * link's pump threads for good: bp_link_send and bp_link_recv are then refused
 * (BL_EINVAL). bp_link_endpoint, bp_link_peer_up, bp_link_wait_up and
 * bp_link_pump_wait may be called from any thread, but none may overlap
 * bp_link_close. A process that holds a link runs ZeroMQ's threads and may fork only
 * to exec (see chan.h). */
#ifndef BP_LINK_H
#define BP_LINK_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "ring.h"

typedef struct bp_link bp_link_t;

/* The secret file's content after its trailing newlines are stripped: at least 32
 * bytes (64 hex characters give 256 bits), at most 4096. */
#define BP_SECRET_MIN_NBYTES 32
#define BP_SECRET_MAX_NBYTES 4096

/* ZMTP heartbeats: a PING every ivl, and a connection that hears nothing for timeout
 * after a PING is dropped. ZeroMQ counts only whole messages as hearing something, so
 * the timeout must exceed the time the largest message takes on the wire. */
#define BP_LINK_DEFAULT_HEARTBEAT_IVL_MS 1000
#define BP_LINK_DEFAULT_HEARTBEAT_TIMEOUT_MS 5000
/* Messages queued for sending before a send waits (the network is slower than the
 * producer). The receiving side's queue has no limit: a full one would stop ZeroMQ
 * reading the connection, heartbeats included, and a slow local consumer would then
 * look like a dead peer. So a link does not push back on a sender whose peer reads
 * slowly; the sender's protocol bounds what is in flight (a pipeline's steps in
 * flight do). */
#define BP_LINK_DEFAULT_HWM_MSGS 64
/* How long closing a link waits for queued messages to reach a live peer. */
#define BP_LINK_DEFAULT_LINGER_MS 1000

/* Settings of a link; zero fields take the defaults above. */
typedef struct bp_link_opts {
    int heartbeat_ivl_ms;
    int heartbeat_timeout_ms;
    int hwm_msgs;
    int linger_ms;
} bp_link_opts_t;

/* Reads the cluster's secret file and hashes its content (trailing newlines stripped)
 * with SHA-256 into key. Refused with BL_EINVAL naming the path and why: readable,
 * writable or executable by group or others (mode & 077), not a regular file, content
 * shorter than BP_SECRET_MIN_NBYTES or longer than BP_SECRET_MAX_NBYTES; BL_ENOENT (no
 * such file), BL_EIO (open or read failed), BL_ENOMEM. A symlink is followed and the
 * file it names is checked. */
int bp_secret_load(const char *path, uint8_t key[32], bl_err_t *err) BL_WUR;

/* The same for bytes in memory (tests, a secret from elsewhere): the same stripping,
 * length limits and hash, so a file and its bytes give the same key. */
int bp_secret_from_bytes(const void *p, size_t n, uint8_t key[32], bl_err_t *err) BL_WUR;

/* Creates a link that listens on endpoint ("tcp://ADDR:PORT", or "tcp://ADDR:*" for a
 * free port; bp_link_endpoint then names it; an IPv6 ADDR goes in brackets,
 * "tcp://[::1]:*") for one peer holding the secret behind
 * key. max_msg is the largest message either way, in bytes (1 to 2^40); a peer that
 * sends more is dropped. opts may be NULL. The peer may connect any time after this
 * returns. Caller frees with bp_link_close. BL_EINVAL (endpoint not tcp://, max_msg,
 * opts out of range), BL_ENOTSUP (this libzmq has no CURVE), BL_EIO (the bind failed:
 * err names the endpoint), BL_ENOMEM. */
int bp_link_listen(bp_link_t **out, const char *endpoint, const uint8_t key[32], size_t max_msg,
                   const bp_link_opts_t *opts, bl_err_t *err) BL_WUR;

/* The same, connecting to a listening link. ZeroMQ connects in the background and
 * retries until it reaches the listener: this returns before the handshake; see
 * bp_link_wait_up. */
int bp_link_connect(bp_link_t **out, const char *endpoint, const uint8_t key[32], size_t max_msg,
                    const bp_link_opts_t *opts, bl_err_t *err) BL_WUR;

/* Stops and joins the pump threads (closing both rings given to bp_link_pump, so
 * their local ends see BL_ECLOSED), closes the socket (waiting up to linger_ms for
 * queued messages while the peer is up) and frees the link. NULL is a no-op. */
void bp_link_close(bp_link_t *l);

/* The endpoint bound (with the real port) or connected to. */
const char *bp_link_endpoint(const bp_link_t *l);

/* 1 while the handshake has succeeded and the peer's connection is up, else 0. */
int bp_link_peer_up(bp_link_t *l);

/* Waits until the handshake with the peer succeeded. 0, BL_ECLOSED (the peer came and
 * went, or the link is closing), BL_EPERM (connecting side: the listener refused this
 * side's key, so this side does not hold the listener's secret), BL_ETIMEDOUT (no
 * handshake yet; where connections reached the listener but the handshake failed,
 * err says so: a listener that holds another secret cannot even decrypt this side's
 * greeting, and ZeroMQ then gives the connecting side no reason), BL_EAGAIN
 * (timeout_ms 0). timeout_ms < 0 waits without limit. */
int bp_link_wait_up(bp_link_t *l, int timeout_ms, bl_err_t *err) BL_WUR;

/* Sends one message of n bytes (a copy is queued; the call returns before the peer
 * has it). timeout_ms: 0 = do not wait (BL_EAGAIN), negative = no limit. BL_ERANGE (n
 * above max_msg), BL_ETIMEDOUT (no peer yet, or the peer is not taking messages),
 * BL_ECLOSED (the link or the peer is gone), BL_EPERM (see bp_link_wait_up), BL_EINVAL
 * (the pumps own the link), BL_EIO. Owner thread only. */
int bp_link_send(bp_link_t *l, const void *p, size_t n, int timeout_ms, bl_err_t *err) BL_WUR;

/* Receives one message into buf (cap bytes) and sets *n to its size. Messages that
 * arrived before the peer left are still delivered, then BL_ECLOSED. BL_ERANGE: the
 * message is larger than cap; *n says its size and it stays for the next call.
 * BL_EPROTO: the peer sent a message of several frames or above max_msg; it is
 * dropped and the link goes on. Otherwise as bp_link_send. Owner thread only. */
int bp_link_recv(bp_link_t *l, void *buf, size_t cap, size_t *n, int timeout_ms,
                 bl_err_t *err) BL_WUR;

/* Starts the pumps, which then own the socket and both ring handles until
 * bp_link_close: one thread takes each message of out_of (the consumer end of a ring,
 * or NULL) and sends it on the link, the other receives each link message and pushes
 * it into `into` (the producer end of a ring, or NULL), bytes and order unchanged.
 * They stop when out_of's producer closed and everything before was sent (the link is
 * then closed after its queue is flushed, so the peer's pump ends its ring in turn),
 * when `into`'s consumer closed, when the peer's connection drops (what arrived
 * before is still pushed), or on a message that breaks the protocol: one from the
 * link larger than bp_ring_max_msg of `into`, a multipart one, any message when
 * `into` is NULL, or one from out_of larger than max_msg (logged with BL_LOG, and
 * the peer is dropped). Stopping closes both rings, so the local producer of out_of
 * and the local consumer of `into` see BL_ECLOSED promptly, and records the reason
 * (bp_link_pump_wait). The caller keeps the ring handles (destroys them after
 * bp_link_close) and must not use them meanwhile. BL_EINVAL (both NULL, wrong roles,
 * pumps already started), BL_ENOMEM, BL_EIO (thread or socket creation). Owner
 * thread only. */
int bp_link_pump(bp_link_t *l, bp_ring_t *out_of, bp_ring_t *into, bl_err_t *err) BL_WUR;

/* Waits until the pumps stopped and returns why: BL_ECLOSED for an orderly end (a
 * ring's other end closed, the peer left, or bp_link_close), or the error that stopped
 * them (BL_EPROTO, BL_ERANGE, BL_EPERM, BL_EIO), with err's sentence. BL_ETIMEDOUT
 * while they run (BL_EAGAIN for timeout_ms 0), BL_EINVAL if no pump was started. */
int bp_link_pump_wait(bp_link_t *l, int timeout_ms, bl_err_t *err) BL_WUR;

#endif
