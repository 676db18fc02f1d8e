/* ZeroMQ channels for the control plane: one socket (PAIR, DEALER or ROUTER) over
 * ipc:// or tcp:// that sends and receives one bp_msg_t per ZeroMQ message, with a
 * timeout on every call. ROUTER (the router process) talks to many DEALERs (workers,
 * hosttier), each addressed by its routing id; PAIR is for a fixed two-party link.
 * A channel belongs to one thread (the control thread of its process); it owns its
 * own ZeroMQ context, so channels are independent. A process that holds a channel
 * (so runs ZeroMQ's threads) may fork only to exec: the child may inherit a lock one
 * of those threads held. Spawn workers before opening channels, or fork+exec.
 * Bytes from the peer are untrusted: a malformed message is an error for that call,
 * never a crash; ZeroMQ drops a peer that sends more than BP_MSG_MAX_BYTES. */
#ifndef BP_CHAN_H
#define BP_CHAN_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "msg.h"

typedef struct bp_chan bp_chan_t;

typedef enum bp_chan_kind {
    BP_CHAN_PAIR = 1,
    BP_CHAN_DEALER = 2,
    BP_CHAN_ROUTER = 3,
} bp_chan_kind_t;

/* A peer's routing id on a ROUTER socket (ZeroMQ allows 1-255 bytes). */
typedef struct bp_peer {
    uint8_t id[255];
    size_t len;
} bp_peer_t;

/* Writes "ipc://<runtime_dir>/<name>.sock" into buf. BL_EINVAL (empty parts, a '/' in
 * name), BL_ERANGE (the path exceeds the 107 bytes a unix socket path holds, or cap). */
int bp_chan_ipc_endpoint(char *buf, size_t cap, const char *runtime_dir, const char *name,
                         bl_err_t *err) BL_WUR;

/* Creates a socket of kind and binds it to endpoint ("ipc://...", "tcp://host:port",
 * "tcp://host:*" for a free port; bp_chan_endpoint then says which). Caller frees with
 * bp_chan_destroy. BL_EINVAL (kind, endpoint scheme), BL_EIO (the bind failed: address
 * in use, no such directory; err names the endpoint), BL_ENOMEM. */
int bp_chan_bind(bp_chan_t **out, bp_chan_kind_t kind, const char *endpoint,
                 bl_err_t *err) BL_WUR;

/* The same, connecting. identity (may be NULL) sets a DEALER's routing id, so the
 * ROUTER sees a stable name ("worker0") across reconnects. ZeroMQ connects in the
 * background: a connect to an endpoint nobody bound yet succeeds, and sends wait. */
int bp_chan_connect(bp_chan_t **out, bp_chan_kind_t kind, const char *endpoint,
                    const char *identity, bl_err_t *err) BL_WUR;

/* Closes the socket (waiting at most 500 ms for queued messages) and the context. */
void bp_chan_destroy(bp_chan_t *c);

/* The endpoint bound (with the real port for "tcp://host:*") or connected to. */
const char *bp_chan_endpoint(const bp_chan_t *c);

/* Packs m and sends it; on a ROUTER, to the peer `to` (required), elsewhere `to` must
 * be NULL. timeout_ms: 0 = do not wait, negative = no limit. BL_EINVAL (invalid
 * message, `to` misused), BL_ERANGE (too large), BL_ENOENT (ROUTER: no such peer),
 * BL_ETIMEDOUT (the peer is not taking messages), BL_EIO, BL_ENOMEM. */
int bp_chan_send(bp_chan_t *c, const bp_peer_t *to, const bp_msg_t *m, int timeout_ms,
                 bl_err_t *err) BL_WUR;

/* Receives one message into *out (free with bp_msg_free, also after a failure); on a
 * ROUTER, *from gets the sender (from may be NULL elsewhere). BL_ETIMEDOUT,
 * BL_EPROTO (wrong number of frames, a bad routing id), BL_EINVAL/BL_ERANGE (the
 * message does not unpack or validate; err names the field and the peer), BL_EIO.
 * After an error the channel is still usable: the bad message was consumed. */
int bp_chan_recv(bp_chan_t *c, bp_peer_t *from, bp_msg_t *out, int timeout_ms,
                 bl_err_t *err) BL_WUR;

/* A printable form of a routing id ("worker0", or hex for binary ids) for messages. */
const char *bp_peer_name(const bp_peer_t *p, char *buf, size_t cap);

/* The router's messages to a child, built here from plain values. The Plan's host
 * layers go out as one placement per expert (process host_process), its KV type as
 * a bl_type_t id (f16, f32, q8_0). Errors as bp_chan_send, BL_ENOMEM, BL_EINVAL (a
 * KV type or stage device out of range). */
int bp_chan_send_plan(bp_chan_t *c, const bp_peer_t *to, const bp_plan_t *p, int timeout_ms, bl_err_t *err) BL_WUR;
int bp_chan_send_shutdown(bp_chan_t *c, const bp_peer_t *to, const char *reason, uint32_t grace_ms, int timeout_ms,
                          bl_err_t *err) BL_WUR;
/* A Stats request: the child answers with its counters. */
int bp_chan_send_stats_request(bp_chan_t *c, const bp_peer_t *to, uint32_t process, int timeout_ms,
                               bl_err_t *err) BL_WUR;

#endif
