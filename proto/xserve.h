/* The serving side of the experts rings (proto/step.h): a process that computes routed
 * experts for the stages (the hosttier in host RAM, an expert tier on a card) reads
 * each stage's EXPERTS requests on its own ring pair and answers each with the SUMS,
 * or with an ERROR naming what was wrong, never an exit. One thread serves every pair:
 * with one pair its doorbell does the waiting; with several it polls them in turn,
 * without waiting while requests came in the last BP_XSERVE_BUSY_US (a decode step
 * sends one per MoE layer), else parked on each ring for BP_XSERVE_PARK_US. */
#ifndef BP_XSERVE_H
#define BP_XSERVE_H

#include <stdatomic.h>
#include <stdint.h>

#include "child.h"
#include "err.h"
#include "ring.h"
#include "step.h"

#define BP_XSERVE_BUSY_US 5000
#define BP_XSERVE_PARK_US 1000

/* out (n, lim.n_embd) = layer's routed experts of rows (n, n_embd): row i's counts[i]
 * (id, weight) pairs packed row after row in ids and wts. 0, or a negative BL_E* with
 * err set (answered as an ERROR on that ring). */
typedef int (*bp_xserve_fn)(void *ctx, int32_t layer, const float *rows, int32_t n, const int32_t *counts,
                            const int32_t *ids, const float *wts, float *out, bl_err_t *err);

typedef struct bp_xserve {
    /* set by the caller */
    const char *who;        /* "hosttier", "tier 1": the start of an error's text */
    bp_ring_t **req, **rep; /* (n_pairs) stage i's requests (consumer), its sums (producer) */
    int n_pairs;
    bp_step_limits_t lim;   /* n_batch, n_embd, n_expert, n_expert_used at least */
    bp_xserve_fn fn;
    void *ctx;
    _Atomic int *stop;      /* set by either thread; the loop returns when it is */
    /* the loop's */
    int32_t *ids, *counts;  /* (n_batch * n_expert_used), (n_batch): a request's, copied */
    _Atomic uint64_t n_calls, n_rows, n_errors;
} bp_xserve_t;

/* The ring pairs of n_pairs stages where the router put them (proto/step.h: stage i's
 * requests at BP_STEP_FD_HOSTTIER_BASE + 2i, its sums at the next fd), attached and
 * the fds closed. BL_ENOMEM, the rings' errors (bp_xserve_free undoes a part). */
int bp_xserve_attach(bp_xserve_t *x, int n_pairs, bl_err_t *err) BL_WUR;
/* Makes the index buffers for lim. BL_ENOMEM. */
int bp_xserve_init(bp_xserve_t *x, bl_err_t *err) BL_WUR;
/* Serves until *stop, or until a ring ends (its peer closed it, or it broke: logged),
 * which sets *stop. A thread's function: arg is the bp_xserve_t. */
void *bp_xserve_main(void *arg);
/* Its counters into out (cap entries): expert_calls, expert_rows, errors; how many
 * (3, or 0 when cap is smaller). Any thread. */
int bp_xserve_stats(bp_xserve_t *x, bp_counter_t *out, int cap);
/* The rings destroyed, the buffers freed. */
void bp_xserve_free(bp_xserve_t *x);

#endif
