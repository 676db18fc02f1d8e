/* Routing heat: how often each (layer, routed expert) is chosen, with counts that
 * decay by half every half_life steps, so the hottest experts are the ones routing
 * favours lately. The one count the engine's placement decisions read: the CPU
 * worker counts its own routing, and the tiers that hold experts read the same
 * counts (residency, the NVMe pager). Not thread-safe: one owner adds and reads. */
#ifndef BL_HEAT_H
#define BL_HEAT_H

#include <stdint.h>

#include "err.h"

typedef struct bl_heat bl_heat_t;

/* half_life > 0 steps (1e9 or more: no decay). BL_EINVAL for bad sizes. */
int bl_heat_create(bl_heat_t **out, int64_t n_layer, int64_t n_expert, double half_life, bl_err_t *err) BL_WUR;
void bl_heat_free(bl_heat_t *h); /* NULL is a no-op */

/* Layer l's selections: n ids (out-of-range layers and ids are not counted). */
void bl_heat_add(bl_heat_t *h, int64_t l, const int32_t *ids, int64_t n);
/* One step passed: every count so far weighs 2^(-1/half_life) as much. */
void bl_heat_step(bl_heat_t *h);

/* Layer l, expert e: the decayed heat (selections, each weighed by its age), and the
 * plain number of selections since creation. 0 out of range. */
double bl_heat_of(const bl_heat_t *h, int64_t l, int64_t e);
uint64_t bl_heat_count(const bl_heat_t *h, int64_t l, int64_t e);
uint64_t bl_heat_layer_count(const bl_heat_t *h, int64_t l); /* the layer's selections */

/* The k hottest experts of layer l by decayed heat (ties: the lower id), into ids;
 * returns how many were written (min(k, n_expert)). */
int64_t bl_heat_top(const bl_heat_t *h, int64_t l, int64_t k, int32_t *ids);

int64_t bl_heat_n_layer(const bl_heat_t *h);
int64_t bl_heat_n_expert(const bl_heat_t *h);

#endif
