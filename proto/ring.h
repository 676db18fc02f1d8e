/* A single-producer single-consumer ring of variable-size messages in a shared-memory
 * segment, with a spin-then-park doorbell in each direction. This is the per-step
 * data path between router, workers and hosttier on one host (DESIGN.md, "A step").
 *
 * One process creates the segment (a memfd, or a POSIX shm name) and passes the fd or
 * the name to the other, which attaches. Each handle is either the producer or the
 * consumer; one thread per handle (the step thread). Everything the peer wrote into
 * the segment is untrusted: a corrupt header or index is BL_EPROTO, never a read or a
 * write outside the mapping. Nothing on the push/pop path allocates or logs; the only
 * system call is the futex, and only when a waiter has parked. */
#ifndef BP_RING_H
#define BP_RING_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

typedef struct bp_ring bp_ring_t;

typedef enum bp_ring_role {
    BP_RING_PRODUCER = 1,
    BP_RING_CONSUMER = 2,
} bp_ring_role_t;

/* Payloads start 16-byte aligned inside the mapping. */
#define BP_RING_ALIGN 16
/* Size of the frame header before each payload. */
#define BP_RING_FRAME_NBYTES 16
/* Ring capacities are powers of two in this range (data bytes, header page apart). */
#define BP_RING_MIN_CAPACITY ((size_t)4096)
#define BP_RING_MAX_CAPACITY ((size_t)1 << 32)
/* How long a waiter spins on the shared word before it parks on the futex. */
#define BP_RING_DEFAULT_SPIN_US 30

/* The largest payload a ring of this capacity takes: capacity/2 minus the frame
 * header. Half, so that a message plus the padding to the end of the ring always
 * fits once the consumer has caught up (a message never splits across the end). */
size_t bp_ring_max_msg(size_t capacity);

/* Creates a ring of capacity data bytes (a power of two, BP_RING_MIN_CAPACITY to
 * BP_RING_MAX_CAPACITY) in a new sealed memfd; name labels the ring in errors and in
 * /proc. The caller passes bp_ring_fd(*out) to the peer (fork, SCM_RIGHTS) and the
 * peer calls bp_ring_attach_fd. Caller frees with bp_ring_destroy. BL_EINVAL (bad
 * capacity or role), BL_EIO (memfd, ftruncate, mmap), BL_ENOMEM. */
int bp_ring_create(bp_ring_t **out, const char *name, size_t capacity,
                   bp_ring_role_t role, bl_err_t *err) BL_WUR;

/* The same in a POSIX shared-memory object shm_name ("/bloomery-..."), created
 * exclusively; the peer calls bp_ring_attach_shm with the name. The name stays until
 * bp_ring_unlink_shm (a memfd needs no unlink, and is sealed against resizing, so
 * prefer it when the fd can be passed). */
int bp_ring_create_shm(bp_ring_t **out, const char *shm_name, size_t capacity,
                       bp_ring_role_t role, bl_err_t *err) BL_WUR;

/* Attaches to a ring another process created. The fd is duplicated (the caller keeps
 * its own). The header is validated against the segment size, and the capacity is
 * copied into the handle, so a peer that rewrites the header later cannot widen what
 * this side reads. BL_EINVAL (not a ring, bad version or capacity, the size does not
 * match, the memfd is not sealed against shrinking), BL_EIO, BL_ENOENT (no such shm
 * name), BL_ENOMEM. */
int bp_ring_attach_fd(bp_ring_t **out, int fd, const char *name, bp_ring_role_t role,
                      bl_err_t *err) BL_WUR;
int bp_ring_attach_shm(bp_ring_t **out, const char *shm_name, bp_ring_role_t role,
                       bl_err_t *err) BL_WUR;

/* Removes a shm name (the mappings stay valid). BL_ENOENT, BL_EIO. */
int bp_ring_unlink_shm(const char *shm_name, bl_err_t *err) BL_WUR;

/* Marks this side closed and wakes the peer, then unmaps and closes. NULL is a no-op. */
void bp_ring_destroy(bp_ring_t *r);

/* The segment's fd (owned by the handle; dup it to keep it past bp_ring_destroy). */
int bp_ring_fd(const bp_ring_t *r);
size_t bp_ring_capacity(const bp_ring_t *r);
/* The ring's whole mapping (control page, then data), page-aligned: for a producer
 * that pins it so that a device writes its messages directly. */
void bp_ring_mapping(const bp_ring_t *r, void **p, size_t *nbytes);
const char *bp_ring_name(const bp_ring_t *r);

/* How long waits spin before parking, in microseconds (0: park at once). */
void bp_ring_set_spin_us(bp_ring_t *r, uint32_t spin_us);

/* Tells the peer this side is gone: a consumer then drains what is left and gets
 * BL_ECLOSED; a producer gets BL_ECLOSED from its next reserve. Wakes a parked peer.
 * Idempotent. */
void bp_ring_close(bp_ring_t *r);

/* Whether the peer has closed its side. */
int bp_ring_peer_closed(const bp_ring_t *r);

/* --- producer ------------------------------------------------------------------
 * Timeouts are in microseconds: 0 = do not wait (BL_EAGAIN if there is no room or no
 * message now), negative = wait without limit (only where a dead peer is noticed some
 * other way). Past the timeout: BL_ETIMEDOUT, naming the ring. */

/* Reserves room for a payload of nbytes and points *out at it (16-byte aligned,
 * contiguous, inside the mapping). The message is invisible to the consumer until
 * bp_ring_commit. A second reserve before commit replaces the first. BL_ERANGE (nbytes
 * past bp_ring_max_msg), BL_ETIMEDOUT, BL_EAGAIN, BL_ECLOSED (the consumer closed),
 * BL_EPROTO (the consumer's index is corrupt; the handle stays broken), BL_EINVAL
 * (not the producer). */
int bp_ring_reserve(bp_ring_t *r, size_t nbytes, void **out, int64_t timeout_us,
                    bl_err_t *err) BL_WUR;

/* Publishes the reserved message with its final size nbytes (at most the reserved
 * size) and rings the consumer's doorbell if it is parked. BL_EINVAL (no reservation,
 * nbytes larger than reserved). */
int bp_ring_commit(bp_ring_t *r, size_t nbytes, bl_err_t *err) BL_WUR;

/* reserve + memcpy + commit. */
int bp_ring_push(bp_ring_t *r, const void *data, size_t nbytes, int64_t timeout_us,
                 bl_err_t *err) BL_WUR;

/* Messages this producer has committed, counted from the ring's creation: the n-th
 * message committed (from 1) is released once the consumer's count reaches n. */
uint64_t bp_ring_produced(const bp_ring_t *r);

/* Waits until the consumer has released at least n messages (n at most
 * bp_ring_produced): a producer that lent the consumer something beside a message
 * (a card buffer the message names, proto/cardlink.h) learns that it came back. The
 * consumer's release is a release store, so what it did before releasing happens
 * before this returns. BL_ETIMEDOUT, BL_EAGAIN (timeout 0), BL_ECLOSED (the consumer
 * closed), BL_EINVAL (not the producer, n past what was produced), BL_EPROTO (the
 * consumer's count is past what was produced or went back; the handle stays broken). */
int bp_ring_wait_consumed(bp_ring_t *r, uint64_t n, int64_t timeout_us, bl_err_t *err) BL_WUR;

/* --- consumer ------------------------------------------------------------------ */

/* Points *data at the next message and *nbytes at its size, without copying; the
 * bytes stay valid (and unchanged by an honest producer) until bp_ring_release. A
 * second peek before release returns the same message. BL_ETIMEDOUT, BL_EAGAIN,
 * BL_ECLOSED (the producer closed and every message was read), BL_EPROTO (corrupt
 * frame header or producer index; the message names the offset and the field),
 * BL_EINVAL (not the consumer). */
int bp_ring_peek(bp_ring_t *r, const void **data, size_t *nbytes, int64_t timeout_us,
                 bl_err_t *err) BL_WUR;

/* Frees the peeked message's room and rings the producer's doorbell if it is parked.
 * No-op without a peeked message. */
void bp_ring_release(bp_ring_t *r);

/* peek + memcpy into buf (cap bytes) + release. BL_ERANGE if the message is larger
 * than cap (it stays in the ring, *nbytes says its size). */
int bp_ring_pop(bp_ring_t *r, void *buf, size_t cap, size_t *nbytes, int64_t timeout_us,
                bl_err_t *err) BL_WUR;

/* Counters of this handle (not shared): messages, waits that had to park, futex
 * wakes issued. Read by the owning thread or after it stopped. */
typedef struct bp_ring_stats {
    uint64_t msgs;
    uint64_t parks;
    uint64_t wakes;
} bp_ring_stats_t;

void bp_ring_get_stats(const bp_ring_t *r, bp_ring_stats_t *out);

#endif
