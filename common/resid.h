/* Residency: which routed experts of each layer hold one of the layer's card slots,
 * decided from the routing heat (heat.h). The policy only: the card's backend owns
 * the slots' memory, copies the bytes and tells the policy when a copy is done.
 *
 * A move seats a hot expert that is not on the card in a free slot, or in the slot of
 * a resident expert that has cooled: the newcomer's heat must pass the resident's by
 * BL_RESID_RATIO and by BL_RESID_MIN_GAIN selections, so that two experts of nearly
 * the same heat do not trade places every step. A planned move takes the leaving
 * expert off the table at once (its slot is about to be overwritten) and seats the
 * arriving one only at bl_resid_commit, once its bytes are in the slot; in between,
 * both are served from the host. Not thread-safe: one owner plans and reads. */
#ifndef BL_RESID_H
#define BL_RESID_H

#include <stdint.h>

#include "err.h"
#include "heat.h"

#define BL_RESID_RATIO 1.25
#define BL_RESID_MIN_GAIN 1.0

typedef struct bl_resid bl_resid_t;

/* One move: expert in of layer takes slot; out is the expert that held it (-1: the
 * slot was free). */
typedef struct bl_resid_move {
    int32_t layer, slot, in, out;
} bl_resid_move_t;

/* slots (n_layer): each layer's slot count, 0..n_expert (0: the layer has none).
 * BL_EINVAL for bad sizes, BL_ENOMEM. */
int bl_resid_create(bl_resid_t **out, int64_t n_layer, int64_t n_expert, const int32_t *slots,
                    bl_err_t *err) BL_WUR;
void bl_resid_free(bl_resid_t *r); /* NULL is a no-op */

int64_t bl_resid_slots(const bl_resid_t *r, int64_t l); /* layer l's slot count (0 out of range) */
/* The slot expert e of layer l is served from, or -1 (not seated, or still moving in). */
int32_t bl_resid_slot(const bl_resid_t *r, int64_t l, int64_t e);
/* Layer l's table: n_expert entries, each bl_resid_slot's answer (NULL out of range). */
const int32_t *bl_resid_table(const bl_resid_t *r, int64_t l);

/* Plans at most cap moves (into moves), the largest heat gains first over all layers,
 * and unseats the experts they displace. Returns how many; 0 while an earlier plan is
 * not committed. */
int64_t bl_resid_plan(bl_resid_t *r, const bl_heat_t *h, int64_t cap, bl_resid_move_t *moves);
/* The planned moves' bytes are in their slots: seats the arriving experts. */
void bl_resid_commit(bl_resid_t *r);
/* Forgets a planned move that was not carried out: its slot stays free. */
void bl_resid_abort(bl_resid_t *r);

#endif
