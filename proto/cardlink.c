/* The card-to-card protocol between two stages: see cardlink.h. */
#include "cardlink.h"

#include <stdlib.h>
#include <string.h>

struct bp_cardlink {
    bp_ring_t *r;
    bp_cardlink_ops_t ops;
    void *ctx;
    int n_bufs;
    size_t buf_bytes;
    /* sender: the ring's message count at which each buffer is back (the count
     * after committing the message that named it; 0: never lent), the buffer the
     * next message takes, the one reserved (-1: none) and its message's row bytes */
    uint64_t back_at[BP_CARD_MAX_BUFS];
    int next, held;
    size_t held_bytes;
    /* receiver: a get was made since the last release, and a settle failed */
    int pending, broken;
};

int bp_cardlink_create(bp_cardlink_t **out, bp_ring_t *r, int n_bufs, size_t buf_bytes,
                       const bp_cardlink_ops_t *ops, void *ctx, bl_err_t *err)
{
    *out = NULL;
    if (n_bufs < 1 || n_bufs > BP_CARD_MAX_BUFS || buf_bytes == 0)
        return bl_err_set(err, BL_EINVAL, "card link on ring %s: %d buffers of %zu bytes (1..%d buffers)",
                          bp_ring_name(r), n_bufs, buf_bytes, BP_CARD_MAX_BUFS);
    if (!ops || !(ops->put || (ops->get && ops->settle)))
        return bl_err_set(err, BL_EINVAL, "card link on ring %s: no copy for either side", bp_ring_name(r));
    bp_cardlink_t *l = calloc(1, sizeof *l);
    if (!l)
        return bl_err_set(err, BL_ENOMEM, "card link on ring %s: out of memory", bp_ring_name(r));
    l->r = r;
    l->ops = *ops;
    l->ctx = ctx;
    l->n_bufs = n_bufs;
    l->buf_bytes = buf_bytes;
    l->held = -1;
    *out = l;
    return 0;
}

void bp_cardlink_destroy(bp_cardlink_t *l)
{
    free(l);
}

/* The rows' bytes of a HIDDEN header, or SIZE_MAX past a buffer's. */
static size_t rows_bytes(const bp_cardlink_t *l, const bp_step_hdr_t *h)
{
    if (h->n_rows < 0 || h->width < 0)
        return SIZE_MAX;
    const uint64_t n = (uint64_t)h->n_rows * (uint64_t)h->width * sizeof(float); /* both < 2^31 */
    return n <= l->buf_bytes ? (size_t)n : SIZE_MAX;
}

/* ------------------------------------------------------------------ sender */

int bp_cardlink_reserve(bp_cardlink_t *l, const bp_step_hdr_t *h, bp_step_out_t *o, int64_t timeout_us,
                        bl_err_t *err)
{
    l->held = -1;
    if (!l->ops.put)
        return bl_err_set(err, BL_EINVAL, "card link on ring %s: reserve on the receiving side", bp_ring_name(l->r));
    if (h->kind != BP_STEP_HIDDEN)
        return bl_err_set(err, BL_EINVAL, "card link on ring %s: a %s message carries no card rows",
                          bp_ring_name(l->r), bp_step_kind_name(h->kind));
    const size_t n = rows_bytes(l, h);
    if (n == SIZE_MAX)
        return bl_err_set(err, BL_EINVAL, "card link on ring %s: %d rows of %d floats exceed a buffer of %zu bytes",
                          bp_ring_name(l->r), h->n_rows, h->width, l->buf_bytes);
    const int k = l->next;
    int rc = bp_ring_wait_consumed(l->r, l->back_at[k], timeout_us, err);
    if (rc)
        return rc;
    bp_step_hdr_t hc = *h;
    hc.card = (uint32_t)k + 1;
    if ((rc = bp_step_reserve(l->r, &hc, o, timeout_us, err)) != 0)
        return rc;
    l->held = k;
    l->held_bytes = n;
    return 0;
}

int bp_cardlink_commit(bp_cardlink_t *l, const bp_step_out_t *o, bl_err_t *err)
{
    const int k = l->held;
    if (k < 0)
        return bl_err_set(err, BL_EINVAL, "card link on ring %s: commit without a reservation", bp_ring_name(l->r));
    l->held = -1;
    int rc = l->ops.put(l->ctx, k, l->held_bytes, err);
    if (rc == 0)
        rc = bp_ring_commit(l->r, o->nbytes, err);
    if (rc)
        return rc;
    l->back_at[k] = bp_ring_produced(l->r);
    l->next = (k + 1) % l->n_bufs;
    return 0;
}

/* ------------------------------------------------------------------ receiver */

int bp_cardlink_get(bp_cardlink_t *l, const bp_step_in_t *in, bl_err_t *err)
{
    const bp_step_hdr_t *h = &in->hdr;
    if (!l->ops.get)
        return bl_err_set(err, BL_EINVAL, "card link on ring %s: get on the sending side", bp_ring_name(l->r));
    if (h->kind != BP_STEP_HIDDEN || h->card < 1 || h->card > (uint32_t)l->n_bufs)
        return bl_err_set(err, BL_EINVAL, "card link on ring %s: a %s message naming card buffer %u of %d",
                          bp_ring_name(l->r), bp_step_kind_name(h->kind), h->card, l->n_bufs);
    const size_t n = rows_bytes(l, h);
    if (n == SIZE_MAX)
        return bl_err_set(err, BL_EPROTO, "card link on ring %s: %d rows of %d floats exceed a buffer of %zu bytes",
                          bp_ring_name(l->r), h->n_rows, h->width, l->buf_bytes);
    l->pending = 1; /* set first: a get that fails half way may still have queued a read */
    return l->ops.get(l->ctx, (int)h->card - 1, n, err);
}

int bp_cardlink_release(bp_cardlink_t *l, bl_err_t *err)
{
    if (l->broken)
        return bl_err_set(err, BL_EIO, "card link on ring %s: an earlier copy out of a card buffer was not "
                          "seen to finish", bp_ring_name(l->r));
    if (l->pending) {
        int rc = l->ops.settle(l->ctx, err);
        if (rc) {
            l->broken = 1;
            return rc;
        }
        l->pending = 0;
    }
    bp_ring_release(l->r);
    return 0;
}
