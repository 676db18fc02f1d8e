/* A small pool of threads for the engine thread's per-row work of a step (sampling
 * each slot's logits row): rt_spool_run calls fn(ctx, i) for every i in 0..n-1, on
 * the calling thread and the helpers, and returns when all are done. The rows are
 * independent (each has its own sampler), so the results do not depend on which
 * thread took which. */
#ifndef BLOOMERY_ROUTER_SPOOL_H
#define BLOOMERY_ROUTER_SPOOL_H

#include "err.h"

typedef struct rt_spool rt_spool_t;
typedef void (*rt_spool_fn)(void *ctx, int i);

/* Starts n_helpers threads (0..64; 0 makes a pool that runs everything on the
 * caller). Caller frees with rt_spool_destroy. */
int rt_spool_create(rt_spool_t **out, int n_helpers, bl_err_t *err) BL_WUR;
void rt_spool_destroy(rt_spool_t *p); /* NULL is a no-op; joins the helpers */
int rt_spool_helpers(const rt_spool_t *p);

/* One caller at a time. With n below 2, or no helpers, fn runs on the caller only. */
void rt_spool_run(rt_spool_t *p, int n, rt_spool_fn fn, void *ctx);

/* The helpers the engine starts for n_slots slots on a host of n_cpus: none for one
 * slot or a host of 2 CPUs or fewer (the worker's threads need them), else one per
 * extra slot up to n_cpus / 2 - 1 and 7. */
int rt_spool_default_helpers(int n_slots, int n_cpus);

#endif
