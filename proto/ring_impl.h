/* The layout of a ring's shared segment, shared by ring.c and its tests (which write
 * corrupt headers into a second mapping). Nothing outside proto/ includes this. */
#ifndef BP_RING_IMPL_H
#define BP_RING_IMPL_H

#include <stdatomic.h>
#include <stdint.h>

/* Cross-process atomics must be lock-free, or they would take a lock that lives in
 * one process only. */
_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "64-bit atomics must be lock-free");
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "32-bit atomics must be lock-free");

#define BP_RING_MAGIC 0x474e495250424c42ull /* "BLBPRING" little-endian */
#define BP_RING_VERSION 1u
/* The control block takes one page; data starts page-aligned after it. */
#define BP_RING_HDR_NBYTES 4096u
/* Fields written by different sides sit 128 bytes apart, not 64: x86's adjacent-line
 * prefetcher pulls lines in pairs, which would make two 64-byte lines false-share. */
#define BP_RING_LINE 128

/* A doorbell: the futex word seq, bumped by the ringer only when waiters (a flag:
 * there is one waiter per bell) says the other side is parked or about to park. */
typedef struct ring_bell {
    _Atomic uint32_t seq;
    _Atomic uint32_t waiters;
} ring_bell_t;

typedef struct ring_shared {
    /* Written once by the creator before the fd is handed out; only read after. */
    uint64_t magic;
    uint32_t version;
    uint32_t hdr_nbytes;
    uint64_t capacity;
    char name[64];
    /* Producer-written: bytes ever published (head) and messages ever published. */
    _Alignas(BP_RING_LINE) _Atomic uint64_t head;
    _Atomic uint64_t produced;
    /* Consumer-written: bytes ever freed (tail) and messages ever consumed. */
    _Alignas(BP_RING_LINE) _Atomic uint64_t tail;
    _Atomic uint64_t consumed;
    /* Producer rings data_bell, consumer waits on it; the reverse for space_bell. */
    _Alignas(BP_RING_LINE) ring_bell_t data_bell;
    _Alignas(BP_RING_LINE) ring_bell_t space_bell;
    /* Bit per role (BP_RING_PRODUCER, BP_RING_CONSUMER) set when that side closed. */
    _Alignas(BP_RING_LINE) _Atomic uint32_t closed;
} ring_shared_t;

_Static_assert(sizeof(ring_shared_t) <= BP_RING_HDR_NBYTES, "ring header overflows its page");

/* The frame before each payload. len is the payload size; a pad frame (flags
 * FRAME_PAD) fills the ring to its end so the next message starts at offset 0. seq
 * numbers messages from 0 so the consumer notices a lost or replayed frame. */
typedef struct ring_frame {
    uint32_t len;
    uint32_t flags;
    uint64_t seq;
} ring_frame_t;

#define RING_FRAME_MSG 0u
#define RING_FRAME_PAD 0x50414450u /* "PADP" */

#endif
