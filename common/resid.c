/* Residency's policy (resid.h). Per layer, the unseated experts by heat (hottest
 * first) are paired with the slots by their holder's heat (free slots first, then the
 * coldest holder): each pair that passes the hysteresis is a candidate, and its gain
 * (the newcomer's heat less the holder's) falls along a layer's pairs, so taking the
 * largest gains over all layers takes a prefix of each layer's pairs. */
#include "resid.h"

#include <stdlib.h>
#include <string.h>

/* An expert or a slot with the heat it is sorted by. */
typedef struct keyed {
    double key;
    int32_t id;
} keyed_t;

struct bl_resid {
    int64_t n_layer, n_expert;
    int32_t *n_slots;  /* (n_layer) */
    int64_t *slot0;    /* (n_layer) each layer's first slot in holder */
    int32_t *table;    /* (n_layer * n_expert) slot of each expert, or -1 */
    int32_t *holder;   /* (all slots) the expert a slot holds or receives, or -1 */
    bl_resid_move_t *pending;
    int64_t n_pending, cap_pending;
    /* plan's scratch: (n_expert) each */
    keyed_t *ex, *sl;
    struct cand {
        double gain;
        bl_resid_move_t m;
    } *cand;           /* (n_expert per layer, over all layers) */
    int64_t cap_cand;
};

int bl_resid_create(bl_resid_t **out, int64_t n_layer, int64_t n_expert, const int32_t *slots, bl_err_t *err)
{
    *out = NULL;
    if (n_layer < 1 || n_expert < 1 || n_layer > (1 << 16) || n_expert > (1 << 16))
        return bl_err_set(err, BL_EINVAL, "residency of %lld layers x %lld experts", (long long)n_layer,
                          (long long)n_expert);
    int64_t total = 0;
    for (int64_t l = 0; l < n_layer; l++) {
        if (slots[l] < 0 || slots[l] > n_expert)
            return bl_err_set(err, BL_EINVAL, "residency: layer %lld has %d slots, not 0..%lld", (long long)l,
                              slots[l], (long long)n_expert);
        total += slots[l];
    }
    bl_resid_t *r = calloc(1, sizeof *r);
    const size_t nt = (size_t)n_layer * (size_t)n_expert;
    if (!r || !(r->n_slots = malloc((size_t)n_layer * sizeof *r->n_slots)) ||
        !(r->slot0 = malloc((size_t)n_layer * sizeof *r->slot0)) || !(r->table = malloc(nt * sizeof *r->table)) ||
        !(r->holder = malloc((size_t)(total ? total : 1) * sizeof *r->holder)) ||
        !(r->ex = malloc((size_t)n_expert * sizeof *r->ex)) || !(r->sl = malloc((size_t)n_expert * sizeof *r->sl))) {
        bl_resid_free(r);
        return bl_err_set(err, BL_ENOMEM, "out of memory for residency");
    }
    r->n_layer = n_layer;
    r->n_expert = n_expert;
    memcpy(r->n_slots, slots, (size_t)n_layer * sizeof *slots);
    for (int64_t l = 0, s = 0; l < n_layer; s += slots[l], l++)
        r->slot0[l] = s;
    for (size_t i = 0; i < nt; i++)
        r->table[i] = -1;
    for (int64_t i = 0; i < total; i++)
        r->holder[i] = -1;
    *out = r;
    return 0;
}

void bl_resid_free(bl_resid_t *r)
{
    if (!r)
        return;
    free(r->n_slots);
    free(r->slot0);
    free(r->table);
    free(r->holder);
    free(r->pending);
    free(r->ex);
    free(r->sl);
    free(r->cand);
    free(r);
}

int64_t bl_resid_slots(const bl_resid_t *r, int64_t l) { return l >= 0 && l < r->n_layer ? r->n_slots[l] : 0; }

int32_t bl_resid_slot(const bl_resid_t *r, int64_t l, int64_t e)
{
    if (l < 0 || l >= r->n_layer || e < 0 || e >= r->n_expert)
        return -1;
    return r->table[l * r->n_expert + e];
}

const int32_t *bl_resid_table(const bl_resid_t *r, int64_t l)
{
    return l >= 0 && l < r->n_layer ? r->table + l * r->n_expert : NULL;
}

/* Hottest first, ties to the lower id, so a plan does not depend on the sort. */
static int by_key_desc(const void *a, const void *b)
{
    const keyed_t *x = a, *y = b;
    if (x->key != y->key)
        return x->key > y->key ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int by_key_asc(const void *a, const void *b)
{
    const keyed_t *x = a, *y = b;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int by_gain_desc(const void *a, const void *b)
{
    const struct cand *x = a, *y = b;
    if (x->gain != y->gain)
        return x->gain > y->gain ? -1 : 1;
    if (x->m.layer != y->m.layer)
        return x->m.layer < y->m.layer ? -1 : 1;
    return x->m.slot < y->m.slot ? -1 : x->m.slot > y->m.slot;
}

/* Layer l's candidate moves into r->cand from n; returns the new count. */
static int64_t layer_cands(bl_resid_t *r, const bl_heat_t *h, int64_t l, int64_t n)
{
    const int64_t NE = r->n_expert, S = r->n_slots[l];
    const int32_t *tab = r->table + l * NE;
    const int32_t *hold = r->holder + r->slot0[l];
    keyed_t *ex = r->ex, *sl = r->sl;
    int64_t nu = 0;
    for (int64_t e = 0; e < NE; e++)
        if (tab[e] < 0)
            ex[nu++] = (keyed_t){bl_heat_of(h, l, e), (int32_t)e};
    for (int64_t s = 0; s < S; s++) /* a free slot sorts before any holder */
        sl[s] = (keyed_t){hold[s] < 0 ? -1.0 : bl_heat_of(h, l, hold[s]), (int32_t)s};
    qsort(ex, (size_t)nu, sizeof *ex, by_key_desc);
    qsort(sl, (size_t)S, sizeof *sl, by_key_asc);
    for (int64_t i = 0; i < nu && i < S; i++) {
        const double hin = ex[i].key, hs = sl[i].key;
        const int32_t out = hold[sl[i].id];
        if (out < 0 ? !(hin > 0) : !(hin > BL_RESID_RATIO * hs + BL_RESID_MIN_GAIN))
            break; /* the hottest left cannot take the coldest slot left: nor can a colder one */
        r->cand[n].gain = hin - (out < 0 ? 0.0 : hs);
        r->cand[n].m = (bl_resid_move_t){.layer = (int32_t)l, .slot = sl[i].id, .in = ex[i].id, .out = out};
        n++;
    }
    return n;
}

int64_t bl_resid_plan(bl_resid_t *r, const bl_heat_t *h, int64_t cap, bl_resid_move_t *moves)
{
    if (r->n_pending > 0 || cap < 1 || bl_heat_n_layer(h) != r->n_layer || bl_heat_n_expert(h) != r->n_expert)
        return 0;
    int64_t need = 0;
    for (int64_t l = 0; l < r->n_layer; l++)
        need += r->n_slots[l];
    if (need > r->cap_cand) {
        struct cand *c = realloc(r->cand, (size_t)need * sizeof *c);
        if (!c)
            return 0; /* no plan this time; the table stays as it is */
        r->cand = c;
        r->cap_cand = need;
    }
    int64_t n = 0;
    for (int64_t l = 0; l < r->n_layer; l++)
        if (r->n_slots[l] > 0)
            n = layer_cands(r, h, l, n);
    qsort(r->cand, (size_t)n, sizeof *r->cand, by_gain_desc);
    if (n > cap)
        n = cap;
    if (n > r->cap_pending) {
        bl_resid_move_t *p = realloc(r->pending, (size_t)n * sizeof *p);
        if (!p)
            return 0;
        r->pending = p;
        r->cap_pending = n;
    }
    for (int64_t i = 0; i < n; i++) {
        const bl_resid_move_t *m = &r->cand[i].m;
        if (m->out >= 0)
            r->table[(int64_t)m->layer * r->n_expert + m->out] = -1;
        r->holder[r->slot0[m->layer] + m->slot] = m->in;
        moves[i] = r->pending[i] = *m;
    }
    r->n_pending = n;
    return n;
}

void bl_resid_commit(bl_resid_t *r)
{
    for (int64_t i = 0; i < r->n_pending; i++) {
        const bl_resid_move_t *m = &r->pending[i];
        r->table[(int64_t)m->layer * r->n_expert + m->in] = m->slot;
    }
    r->n_pending = 0;
}

void bl_resid_abort(bl_resid_t *r)
{
    for (int64_t i = 0; i < r->n_pending; i++) {
        const bl_resid_move_t *m = &r->pending[i];
        r->holder[r->slot0[m->layer] + m->slot] = -1;
    }
    r->n_pending = 0;
}
