/* Activations passed card to card between two pipeline stages on cards of one host.
 * The sender's stage leaves its output rows in one of a few card buffers it exported
 * (CUDA IPC), the HIDDEN message on the ring between the stages names that buffer
 * (step.h, hdr.card) instead of carrying the floats, and the receiver copies them
 * into its own card. This file owns the protocol: which buffer a message uses, when
 * a buffer may be written again, and the order of a receiver's copy and its release
 * of the message. The copies are the owner's, through bp_cardlink_ops_t: the worker's
 * CUDA backend, or plain shared memory in the tests.
 *
 * Back-pressure without a message back: the receiver releases the ring message that
 * names buffer k only once its copy out of k has finished (ops.settle), and the
 * sender writes k again only once the ring's consumer count shows that release
 * (bp_ring_wait_consumed). With BP_CARD_BUFS buffers the sender writes step N + 1
 * while the receiver still reads step N, and waits at step N + 2 for N's release.
 *
 * How the buffers are set up (the handles relayed over the control plane, the
 * fallback to the host ring) is in docs/transport.md, "Card to card".
 *
 * Thread: a link belongs to the step thread of its side, as the ring handle it uses. */
#ifndef BP_CARDLINK_H
#define BP_CARDLINK_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "ring.h"
#include "step.h"

/* Buffers a link may have (what a peer's offer is checked against), and what a
 * worker exports: one being read while the next is written. */
#define BP_CARD_MAX_BUFS 4
#define BP_CARD_BUFS 2
/* The opaque handle of one exported buffer or event (cudaIpcMemHandle_t and
 * cudaIpcEventHandle_t are both 64 bytes). */
#define BP_CARD_HANDLE_BYTES 64

/* What the owner of the cards does for a link; ctx is bp_cardlink_create's. Each
 * returns 0 or a negative BL_E* code with err set. */
typedef struct bp_cardlink_ops {
    /* sender: the rows of the message being sent (nbytes, from the stage that just
     * ran) into buffer k, ordered before any reader's wait on k (the card: a copy on
     * the stage's stream, then k's event recorded after it) */
    int (*put)(void *ctx, int k, size_t nbytes, bl_err_t *err);
    /* receiver: nbytes of buffer k into the stage's input, ordered after the
     * sender's put of k and before the stage reads its input (the card: a wait on k's
     * event and the copy, queued on the stage's stream) */
    int (*get)(void *ctx, int k, size_t nbytes, bl_err_t *err);
    /* receiver: returns once every get so far has finished reading its buffer */
    int (*settle)(void *ctx, bl_err_t *err);
} bp_cardlink_ops_t;

typedef struct bp_cardlink bp_cardlink_t;

/* A link's end on ring r (the stages' ring: the producer end for the sender, the
 * consumer end for the receiver; borrowed, it outlives the link), with n_bufs
 * (1..BP_CARD_MAX_BUFS) buffers of buf_bytes each and the owner's ops (copied) and
 * ctx. Caller frees with bp_cardlink_destroy. BL_EINVAL (n_bufs, a missing op for the
 * side), BL_ENOMEM. */
int bp_cardlink_create(bp_cardlink_t **out, bp_ring_t *r, int n_bufs, size_t buf_bytes,
                       const bp_cardlink_ops_t *ops, void *ctx, bl_err_t *err) BL_WUR;
void bp_cardlink_destroy(bp_cardlink_t *l); /* NULL is a no-op */

/* --- sender (the producer end of the ring) --------------------------------------- */

/* Reserves a HIDDEN message with header h (its card is set here; the message has no
 * rows section, o->rows is NULL) in the ring, first waiting up to timeout_us until
 * the buffer it takes has come back: the message that last named it was released.
 * A later reserve, or any other reserve on the ring, drops the buffer unused.
 * BL_ETIMEDOUT (the receiver is behind: call again), BL_EINVAL (not HIDDEN, more rows
 * than a buffer holds), bp_ring_wait_consumed's and bp_step_reserve's errors. */
int bp_cardlink_reserve(bp_cardlink_t *l, const bp_step_hdr_t *h, bp_step_out_t *o, int64_t timeout_us,
                        bl_err_t *err) BL_WUR;

/* Puts the stage's rows into the reserved buffer (ops.put) and commits the message;
 * the buffer is lent until the receiver releases it. On an error nothing was
 * committed and the buffer stays free. BL_EINVAL (no reservation), ops.put's and
 * bp_ring_commit's errors. */
int bp_cardlink_commit(bp_cardlink_t *l, const bp_step_out_t *o, bl_err_t *err) BL_WUR;

/* --- receiver (the consumer end) --------------------------------------------------- */

/* The rows of a parsed HIDDEN message whose hdr.card names a buffer (bp_step_parse
 * checked the index against lim.card_bufs) into the stage's input (ops.get).
 * BL_EINVAL (no card buffer named, an index past the link's), BL_EPROTO (more rows than
 * a buffer holds), ops.get's errors. */
int bp_cardlink_get(bp_cardlink_t *l, const bp_step_in_t *in, bl_err_t *err) BL_WUR;

/* Releases the ring message in hand (bp_ring_release), after waiting for every get
 * to finish reading (ops.settle) where one was made since the last release. A failed
 * settle keeps the message: the sender must not write a buffer a copy may still read;
 * the link is then broken (the caller stops). ops.settle's errors. */
int bp_cardlink_release(bp_cardlink_t *l, bl_err_t *err) BL_WUR;

#endif
